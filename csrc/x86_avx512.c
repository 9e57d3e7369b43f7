/* AVX-512 kernels (F, BW, VL, DQ with VNNI), per-function targets as in x86_avx2.c. They take
 * over the quantized types when the CPU also has AVX512_VNNI and AVX512DQ; otherwise (and for
 * the float types and activation quantizers) the AVX2 kernels stay registered.
 *
 * Determinism, as in x86_avx2_dots.h: each kernel is a tile of R weight rows x C activation rows
 * doing, per (row, column), the same lane-wise operations whatever R and C are, so gemm and
 * vec_dot (the 1x1 tile) return the same bits.
 *
 * Lane layout: a zmm register holds 64 values, two legacy blocks or a quarter of a K-quant
 * super-block, in value order; vpdpbusd int32 lane i sums the products of values 4i..4i+3.
 * Block layouts: common.h (ggml's ggml-common.h). */
#if defined(__x86_64__)
#include <cpuid.h>
#include "x86_common.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#endif
#include <immintrin.h>

/* stands in for the missing second block of a pair when a row has an odd number of blocks:
 * zero quants and zero scales contribute zero */
static const uint8_t zero_block[64] __attribute__((aligned(64))) = {0};

static inline uint16_t load_u16(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* 16 float lanes: 8 x half(p0), then 8 x half(p1) */
static inline __m512 pair_halves(const uint8_t *p0, const uint8_t *p1) {
    const __m128i h0 = _mm_set1_epi16((short)load_u16(p0)), h1 = _mm_set1_epi16((short)load_u16(p1));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1));
}

/* 32 bytes at p0, then 32 at p1 */
static inline __m512i pair_bytes(const uint8_t *p0, const uint8_t *p1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}

/* two blocks of 16 nibble bytes -> 64 values in order: low nibbles of q0 (values 0..15 of the
 * first block), high nibbles of q0 (16..31), then the same for q1 */
static inline __m512i pair_nibbles(const uint8_t *q0, const uint8_t *q1) {
    const __m256i y = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)q0)),
                                              _mm_loadu_si128((const __m128i *)q1), 1);
    const __m512i z = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_castsi256_si512(y));
    const long long s4 = 0x0004000400040004LL;
    return _mm512_and_si512(_mm512_srlv_epi16(z, _mm512_setr_epi64(0, 0, s4, s4, 0, 0, s4, s4)), _mm512_set1_epi8(0x0F));
}

/* fifth bits of two Q5 blocks (bit j of qh = value j) added as 0x10 (the nibbles are below it) */
static inline __m512i pair_fifth_bits(__m512i q, const uint8_t *qh0, const uint8_t *qh1) {
    uint32_t h0, h1;
    memcpy(&h0, qh0, 4);
    memcpy(&h1, qh1, 4);
    return _mm512_mask_add_epi8(q, (__mmask64)h0 | (__mmask64)h1 << 32, q, _mm512_set1_epi8(0x10));
}

/* ------------------------------------------------------------------------------------------
 * Legacy types, two blocks per step. Weight values as unsigned bytes u with offset o (see
 * x86_avx2_dots.h; Q8_0 is w + 128, o = 128); per column and step the seed -o * sum(a) per
 * lane. The integer lanes of a step hold blocks b (lanes 0..7) and b+1 (8..15); per (row,
 * column) the float part is the generic twin's (quants_generic.c): 8 lanes, acc = fma(dw * da,
 * lane, acc) for block b and then b+1, hsum8 at the end. Q4_1 / Q5_1: the min part is one
 * chain summs = fma(m, s, summs) per (row, column), held in lane 4r + c of accm.
 * ------------------------------------------------------------------------------------------ */

static inline __m512i legacy_unpack_pair(int type, const uint8_t *b0, const uint8_t *b1) {
    switch (type) {
    case EL_Q4_0: return pair_nibbles(b0 + offsetof(block_q4_0, qs), b1 + offsetof(block_q4_0, qs));
    case EL_Q4_1: return pair_nibbles(b0 + offsetof(block_q4_1, qs), b1 + offsetof(block_q4_1, qs));
    case EL_Q5_0:
        return pair_fifth_bits(pair_nibbles(b0 + offsetof(block_q5_0, qs), b1 + offsetof(block_q5_0, qs)),
                               b0 + offsetof(block_q5_0, qh), b1 + offsetof(block_q5_0, qh));
    case EL_Q5_1:
        return pair_fifth_bits(pair_nibbles(b0 + offsetof(block_q5_1, qs), b1 + offsetof(block_q5_1, qs)),
                               b0 + offsetof(block_q5_1, qh), b1 + offsetof(block_q5_1, qh));
    default:  /* Q8_0 as unsigned w + 128 */
        return _mm512_xor_si512(pair_bytes(b0 + offsetof(block_q8_0, qs), b1 + offsetof(block_q8_0, qs)),
                                _mm512_set1_epi8((char)0x80));
    }
}

#define LT_RMAX 4
#define LT_CMAX 4

/* one activation column over one step (two blocks): values, scales, and the seed (types with
 * an offset) or the s halves (types with a min) */
typedef struct {
    __m512i av;
    __m512 ad;
    __m512i seed;
    uint16_t s[2];  /* y.s of blocks b, b+1 (types with a min) */
} lcol;

static inline __attribute__((always_inline)) void legacy_col(const int type, const uint8_t *a0, const uint8_t *a1,
                                                             lcol *o) {
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1;
    const int aqs = has_m ? 4 : 2;
    const int off = type == EL_Q4_0 ? 8 : type == EL_Q5_0 ? 16 : type == EL_Q8_0 ? 128 : 0;
    o->av = pair_bytes(a0 + aqs, a1 + aqs);
    o->ad = pair_halves(a0, a1);
    if (has_m) {
        o->s[0] = load_u16(a0 + 2);
        o->s[1] = load_u16(a1 + 2);
        o->seed = _mm512_setzero_si512();
    } else {
        const __m512i zero = _mm512_setzero_si512();
        o->seed = off ? _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8((char)off), o->av)) : zero;
    }
}

/* One step (blocks b, b+1; b alone with `two` = 0) of a tile. cols: NULL, or the C columns
 * prepared for this step (column c at cols[c * cstride]). */
static inline __attribute__((always_inline)) void legacy_step(
    const int type, const int R, const int C, const int two, const uint8_t *w, size_t ldw, const uint8_t *a,
    size_t lda, const lcol *cols, size_t cstride, __m256 acc[LT_RMAX][LT_CMAX]) {
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1;
    const size_t wbs = (size_t)legacy_block_bytes(type);
    const size_t abs_ = has_m ? sizeof(block_q8_1) : sizeof(block_q8_0);
    __m512i wq[LT_RMAX];
    __m512 wd[LT_RMAX];
    for (int r = 0; r < R; r++) {
        const uint8_t *b0 = w + (size_t)r * ldw, *b1 = two ? b0 + wbs : zero_block;
        wq[r] = legacy_unpack_pair(type, b0, b1);
        wd[r] = pair_halves(b0, b1);
    }
    lcol own[LT_CMAX];
    const lcol *col[LT_CMAX];
    for (int c = 0; c < C; c++) {
        if (cols) {
            col[c] = cols + (size_t)c * cstride;
        } else {
            const uint8_t *a0 = a + (size_t)c * lda;
            legacy_col(type, a0, two ? a0 + abs_ : zero_block, &own[c]);
            col[c] = &own[c];
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            const __m512 x = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(col[c]->seed, wq[r], col[c]->av));
            const __m512 dd = _mm512_mul_ps(wd[r], col[c]->ad);
            acc[r][c] = _mm256_fmadd_ps(_mm512_castps512_ps256(dd), _mm512_castps512_ps256(x), acc[r][c]);
            if (two) acc[r][c] = _mm256_fmadd_ps(_mm512_extractf32x8_ps(dd, 1), _mm512_extractf32x8_ps(x, 1), acc[r][c]);
        }
}

/* The min part of a step for Q4_1 / Q5_1: lane 4r + c of accm is fma'd with m(row r) * s(column
 * c) of block b, then of block b+1. */
static inline __attribute__((always_inline)) void legacy_min_step(
    const int type, const int R, const int C, const int two, const uint8_t *w, size_t ldw, const uint8_t *a,
    size_t lda, const lcol *cols, size_t cstride, __m512 *accm) {
    const size_t wbs = (size_t)legacy_block_bytes(type);
    for (int k = 0; k < 1 + two; k++) {
        __m256i mh = _mm256_setzero_si256(), sh = _mm256_setzero_si256();
        for (int r = 0; r < R; r++)
            mh = _mm256_mask_set1_epi16(mh, (__mmask16)(0xF << (4 * r)), (short)load_u16(w + (size_t)r * ldw + k * wbs + 2));
        for (int c = 0; c < C; c++) {
            const uint16_t sv = cols ? cols[(size_t)c * cstride].s[k] : load_u16(a + (size_t)c * lda + k * sizeof(block_q8_1) + 2);
            sh = _mm256_mask_set1_epi16(sh, (__mmask16)(0x1111 << c), (short)sv);
        }
        *accm = _mm512_fmadd_ps(_mm512_cvtph_ps(mh), _mm512_cvtph_ps(sh), *accm);
    }
}

static inline float hsum8_avx(__m256 v) {  /* legacy_hsum8 of quants_generic.c */
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
}

/* cols: NULL, or the C columns prepared (column c, step p at cols[c * steps + p]) */
static inline __attribute__((always_inline)) void legacy_tile(const int type, int n, const uint8_t *w, size_t ldw,
                                                              const int R, const uint8_t *a, size_t lda,
                                                              const lcol *cols, const int C, float *out, size_t ldo) {
    const int nb = n / 32, steps = (nb + 1) / 2;
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1;
    const size_t wbs = (size_t)legacy_block_bytes(type);
    const size_t abs_ = has_m ? sizeof(block_q8_1) : sizeof(block_q8_0);
    __m256 acc[LT_RMAX][LT_CMAX];
    __m512 accm = _mm512_setzero_ps();
    for (int c = 0; c < C; c++)
        for (int r = 0; r < R; r++) acc[r][c] = _mm256_setzero_ps();
    pf_cursor pf = pf_start(w, ldw, R, (size_t)nb * wbs);
    int b = 0;
    for (; b + 1 < nb; b += 2) {
        pf_step(&pf, R, ldw, 2 * wbs);
        legacy_step(type, R, C, 1, w + (size_t)b * wbs, ldw, a + (size_t)b * abs_, lda, cols ? cols + b / 2 : NULL,
                    (size_t)steps, acc);
    }
    if (b < nb)
        legacy_step(type, R, C, 0, w + (size_t)b * wbs, ldw, a + (size_t)b * abs_, lda, cols ? cols + b / 2 : NULL,
                    (size_t)steps, acc);
    if (has_m) {  /* second pass over the (now cached) blocks for the min part */
        for (b = 0; b + 1 < nb; b += 2)
            legacy_min_step(type, R, C, 1, w + (size_t)b * wbs, ldw, a + (size_t)b * abs_, lda,
                            cols ? cols + b / 2 : NULL, (size_t)steps, &accm);
        if (b < nb)
            legacy_min_step(type, R, C, 0, w + (size_t)b * wbs, ldw, a + (size_t)b * abs_, lda,
                            cols ? cols + b / 2 : NULL, (size_t)steps, &accm);
    }
    float m[16];
    _mm512_storeu_ps(m, accm);
    for (int c = 0; c < C; c++)
        for (int r = 0; r < R; r++) {
            float s = hsum8_avx(acc[r][c]);
            if (has_m) s += m[4 * r + c];
            out[(size_t)c * ldo + r] = s;
        }
}

/* Legacy gemm: columns in groups of CT, each group prepared once into `buf` (when given: it
 * holds CT * steps columns) and shared by all its row tiles; leftover columns one by one,
 * unprepared. Prepared or not, the same values enter the same operations. */
typedef void (*ltile_fn)(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a, size_t lda,
                         const lcol *cols, int C, float *out, size_t ldo);

static inline __attribute__((always_inline)) void legacy_gemm(const int type, ltile_fn tile, const int RT,
                                                              const int CT, const int RT1, lcol *buf, int n,
                                                              const void *w, size_t ldw, int nr, const void *a,
                                                              size_t lda, int nc, float *out, size_t ldo) {
    const uint8_t *W = w, *A = a;
    const int nb = n / 32, steps = (nb + 1) / 2;
    const size_t ab = type == EL_Q4_1 || type == EL_Q5_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    int c = 0;
    for (; c + CT <= nc; c += CT) {
        if (buf)
            for (int j = 0; j < CT; j++)
                for (int b = 0; b < nb; b += 2) {
                    const uint8_t *a0 = A + (size_t)(c + j) * lda + (size_t)b * ab;
                    legacy_col(type, a0, b + 1 < nb ? a0 + ab : zero_block, &buf[j * steps + b / 2]);
                }
        int r = 0;
        for (; r + RT <= nr; r += RT) tile(n, W + r * ldw, ldw, RT, A + c * lda, lda, buf, CT, out + c * ldo + r, ldo);
        for (; r < nr; r++) tile(n, W + r * ldw, ldw, 1, A + c * lda, lda, buf, CT, out + c * ldo + r, ldo);
    }
    for (; c < nc; c++) {
        int r = 0;
        for (; r + RT1 <= nr; r += RT1) tile(n, W + r * ldw, ldw, RT1, A + c * lda, lda, NULL, 1, out + c * ldo + r, ldo);
        for (; r < nr; r++) tile(n, W + r * ldw, ldw, 1, A + c * lda, lda, NULL, 1, out + c * ldo + r, ldo);
    }
}

#define LEGACY_PREP_BYTES 65536  /* stack for prepared columns; beyond it columns go unprepared */

#define LEGACY_KERNELS(tname, TYPE, RT, CT, RT1)                                                   \
    static void tname##_tile_avx512(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a,  \
                                    size_t lda, const lcol *cols, int C, float *out, size_t ldo) { \
        if (R == RT && C == CT) legacy_tile(TYPE, n, w, ldw, RT, a, lda, cols, CT, out, ldo);      \
        else if (R == 1 && C == CT) legacy_tile(TYPE, n, w, ldw, 1, a, lda, cols, CT, out, ldo);   \
        else if (R == RT1 && C == 1) legacy_tile(TYPE, n, w, ldw, RT1, a, lda, NULL, 1, out, ldo); \
        else legacy_tile(TYPE, n, w, ldw, 1, a, lda, NULL, 1, out, ldo);                           \
    }                                                                                              \
    static void tname##_gemm_avx512(int n, const void *w, size_t ldw, int nr, const void *a,       \
                                    size_t lda, int nc, float *out, size_t ldo) {                  \
        const size_t need = (size_t)CT * ((n / 32 + 1) / 2);                                       \
        const int prep = nc >= CT && need * sizeof(lcol) <= LEGACY_PREP_BYTES;                     \
        lcol buf[prep ? need : 1];                                                                 \
        legacy_gemm(TYPE, tname##_tile_avx512, RT, CT, RT1, prep ? buf : NULL, n, w, ldw, nr, a, lda, nc, out, ldo); \
    }                                                                                              \
    static void tname##_vec_dot_avx512(int n, float *s, const void *x, const void *y) {            \
        legacy_tile(TYPE, n, x, 0, 1, y, 0, NULL, 1, s, 0);                                        \
    }

LEGACY_KERNELS(q4_0, EL_Q4_0, 4, 4, 4)
LEGACY_KERNELS(q4_1, EL_Q4_1, 4, 4, 4)
LEGACY_KERNELS(q5_0, EL_Q5_0, 4, 4, 4)
LEGACY_KERNELS(q5_1, EL_Q5_1, 4, 4, 4)
LEGACY_KERNELS(q8_0, EL_Q8_0, 4, 4, 4)
#undef LEGACY_KERNELS

/* ------------------------------------------------------------------------------------------
 * K-quants, a quarter super-block (64 values) per step. Per (row, column) and super-block the
 * int32 lanes gather sum(q * a) times the group scales (vpmaddubsw, then vpdpwssd with the
 * int16 scale of each lane), seeded with -offset * sum_g sc_g * bsums_g for Q3_K / Q6_K. The
 * lanes are then summed into the generic twin's integers and its float steps follow
 * (kquants_generic.c): per super-block, or per quarter for Q4_K.
 * ------------------------------------------------------------------------------------------ */

/* 16 signed scales of a Q3_K super-block */
static inline __m128i q3_K_scales(const uint8_t *s) {
    uint32_t v[4];
    q3_K_scales_biased(s, v);
    return _mm_sub_epi8(_mm_setr_epi32((int)v[0], (int)v[1], (int)v[2], (int)v[3]), _mm_set1_epi8(32));
}

/* per super-block of one row: scale table (sc), int16 per bsums entry (mins: the min, or
 * -offset * scale), d and dmin as float lanes */
typedef struct {
    __m512i sc;
    __m256i mins;
    __m512 d, dmin;
} ksb;

static inline void kquant_prep(int type, const uint8_t *x, ksb *s) {
    switch (type) {
    case EL_Q2_K: {  /* scales[g] = sc | m << 4; 16 int16 scales for vpermw */
        const __m128i b = _mm_loadu_si128((const __m128i *)x);
        s->sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(b, _mm_set1_epi8(0x0F))));
        s->mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F)));
        s->d = _mm512_set1_ps(_cvtsh_ss(load_u16(x + offsetof(block_q2_K, d))));
        s->dmin = _mm512_set1_ps(_cvtsh_ss(load_u16(x + offsetof(block_q2_K, dmin))));
        break;
    }
    case EL_Q3_K: {
        const __m256i sc = _mm256_cvtepi8_epi16(q3_K_scales(x + offsetof(block_q3_K, scales)));
        s->sc = _mm512_castsi256_si512(sc);
        s->mins = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 2));  /* -4 * sc */
        s->d = _mm512_set1_ps(_cvtsh_ss(load_u16(x + offsetof(block_q3_K, d))));
        break;
    }
    case EL_Q6_K: {
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + offsetof(block_q6_K, scales))));
        s->sc = _mm512_castsi256_si512(sc);
        s->mins = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 5));  /* -32 * sc */
        s->d = _mm512_set1_ps(_cvtsh_ss(load_u16(x + offsetof(block_q6_K, d))));
        break;
    }
    default: {  /* Q4_K, Q5_K: 8 int16 scales in every 128-bit lane, for vpshufb */
        uint32_t sc[2], m[2];
        k4_scales_mins(x + offsetof(block_q4_K, scales), sc, m);
        s->sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_setr_epi32((int)sc[0], (int)sc[1], 0, 0)));
        const __m128i mb = _mm_setr_epi32((int)m[0], (int)m[1], 0, 0);
        s->mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mb, mb));  /* one min per pair of bsums */
        s->d = _mm512_set1_ps(_cvtsh_ss(load_u16(x + offsetof(block_q4_K, d))));
        s->dmin = _mm512_set1_ps(_cvtsh_ss(load_u16(x + offsetof(block_q4_K, dmin))));
        break;
    }
    }
}

/* int16 scale of every vpmaddubsw lane of quarter j (lane l: values 64j + 2l, 2l + 1) */
static inline __m512i kquant_quarter_scales(int type, __m512i sc, int j) {
    if (type == EL_Q4_K || type == EL_Q5_K) {  /* lanes 0..15: scale 2j, 16..31: scale 2j+1 */
        const __m128i lo = _mm_set1_epi16((short)((4 * j) | ((4 * j + 1) << 8)));
        const __m128i hi = _mm_set1_epi16((short)((4 * j + 2) | ((4 * j + 3) << 8)));
        const __m256i l2 = _mm256_set_m128i(lo, lo), h2 = _mm256_set_m128i(hi, hi);
        return _mm512_shuffle_epi8(sc, _mm512_inserti64x4(_mm512_castsi256_si512(l2), h2, 1));
    }
    /* groups of 16: lane l is group 4j + l/8 */
    const __m512i idx = _mm512_add_epi16(_mm512_set1_epi16((short)(4 * j)),
                                         _mm512_srli_epi16(_mm512_setr_epi64(0x0003000200010000LL, 0x0007000600050004LL,
                                                                             0x000b000a00090008LL, 0x000f000e000d000cLL,
                                                                             0x0013001200110010LL, 0x0017001600150014LL,
                                                                             0x001b001a00190018LL, 0x001f001e001d001cLL), 3));
    return _mm512_permutexvar_epi16(idx, sc);
}

/* 32 bytes broadcast to both halves, shifted right (16-bit lanes) by s0 in the low half and s1
 * in the high half, masked */
static inline __m512i halves_srl_mask(const uint8_t *p, int s0, int s1, int mask) {
    const __m512i z = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    const __m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16((short)s0), _mm256_set1_epi16((short)s1), 1);
    return _mm512_and_si512(_mm512_srlv_epi16(z, cnt), _mm512_set1_epi8((char)mask));
}

/* add `val` (a bit the values do not have yet) to the bytes whose bit k0 (low half) / k1 (high
 * half) of the 32 bytes at p is set */
static inline __m512i or_where_bit(__m512i q, const uint8_t *p, int k0, int k1, int val) {
    const __m512i z = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    const __m512i sel = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << k0)), _mm256_set1_epi8((char)(1 << k1)), 1);
    return _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(z, sel), q, _mm512_set1_epi8((char)val));
}

/* values 64j..64j+63 of a super-block as unsigned bytes (layouts: kquant_chunk in x86_avx2.c) */
static inline __m512i kquant_quarter(int type, const uint8_t *x, int j) {
    switch (type) {
    case EL_Q2_K: {
        const int s = 2 * (j % 2);  /* 32-value chunks 2j, 2j+1: bits 2s.. and 2s+2.. of half j/2 */
        return halves_srl_mask(x + offsetof(block_q2_K, qs) + 32 * (j / 2), 2 * s, 2 * s + 2, 3);
    }
    case EL_Q3_K: {
        const int s = 2 * (j % 2);
        const __m512i lo = halves_srl_mask(x + offsetof(block_q3_K, qs) + 32 * (j / 2), 2 * s, 2 * s + 2, 3);
        return or_where_bit(lo, x + offsetof(block_q3_K, hmask), 2 * j, 2 * j + 1, 4);
    }
    case EL_Q4_K:
        return halves_srl_mask(x + offsetof(block_q4_K, qs) + 32 * j, 0, 4, 0x0F);
    case EL_Q5_K: {
        const __m512i lo = halves_srl_mask(x + offsetof(block_q5_K, qs) + 32 * j, 0, 4, 0x0F);
        return or_where_bit(lo, x + offsetof(block_q5_K, qh), 2 * j, 2 * j + 1, 0x10);
    }
    default: {  /* Q6_K: half h = j/2; quarters 2(j%2), 2(j%2)+1 share the 64 ql bytes of h */
        const int h = j / 2, u = j % 2;
        const __m512i ql = _mm512_loadu_si512((const void *)(x + offsetof(block_q6_K, ql) + 64 * h));
        const __m512i lo = _mm512_and_si512(u ? _mm512_srli_epi16(ql, 4) : ql, _mm512_set1_epi8(0x0F));
        const __m512i hi = halves_srl_mask(x + offsetof(block_q6_K, qh) + 32 * h, 4 * u, 4 * u + 2, 3);
        return _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
    }
    }
}

static inline int _mm256_reduce_add_epi32_(__m256i v) {
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i t = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 1)));
}

#define KT_RMAX 2
#define KT_CMAX 4

/* small: the small-batch order (el_small_rows) of Q4_K / Q6_K instead of the batch one */
static inline __attribute__((always_inline)) void kquant_tile(const int type, const int small, int n, const uint8_t *w,
                                                              size_t ldw, const int R, const uint8_t *a, size_t lda,
                                                              const int C, float *out, size_t ldo) {
    const int nb = n / QK_K;
    const size_t wbs = (size_t)kquant_block_bytes(type);
    const int has_min = type == EL_Q2_K || type == EL_Q4_K || type == EL_Q5_K;
    float acc[KT_RMAX][KT_CMAX], accm[KT_RMAX][KT_CMAX];
    __m256 acc8[KT_RMAX][KT_CMAX];  /* Q6_K small */
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = accm[r][c] = 0.0f, acc8[r][c] = _mm256_setzero_ps();

    pf_cursor pf = pf_start(w, ldw, R, (size_t)nb * wbs);
    for (int i = 0; i < nb; i++) {
        pf_step(&pf, R, ldw, wbs);
        ksb sb[KT_RMAX];
        const uint8_t *xb[KT_RMAX];
        const block_q8_K *yb[KT_CMAX];
        float d[KT_RMAX], dmin[KT_RMAX];
        for (int r = 0; r < R; r++) {
            xb[r] = w + (size_t)r * ldw + (size_t)i * wbs;
            kquant_prep(type, xb[r], &sb[r]);
            d[r] = _mm512_cvtss_f32(sb[r].d);
            dmin[r] = has_min ? _mm512_cvtss_f32(sb[r].dmin) : 0.0f;
        }
        __m512i isum[KT_RMAX][KT_CMAX];
        __m256i ms[KT_RMAX][KT_CMAX];  /* min terms, int32 lane g = m_g * bsum of sub-block g */
        for (int c = 0; c < C; c++) {
            yb[c] = (const block_q8_K *)(a + (size_t)c * lda) + i;
            const __m256i bs = _mm256_loadu_si256((const __m256i *)yb[c]->bsums);
            for (int r = 0; r < R; r++) {
                ms[r][c] = _mm256_madd_epi16(sb[r].mins, bs);
                isum[r][c] = has_min ? _mm512_setzero_si512() : _mm512_zextsi256_si512(ms[r][c]);
            }
        }
        if (type == EL_Q4_K) {  /* float steps per quarter (small: per super-block) */
            int32_t m32[KT_RMAX][KT_CMAX][8], Is[KT_RMAX][KT_CMAX] = {{0}};
            for (int c = 0; c < C; c++)
                for (int r = 0; r < R; r++) _mm256_storeu_si256((__m256i *)m32[r][c], ms[r][c]);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m512i q[KT_RMAX], sc[KT_RMAX];
                for (int r = 0; r < R; r++) {
                    q[r] = kquant_quarter(type, xb[r], j);
                    sc[r] = kquant_quarter_scales(type, sb[r].sc, j);
                }
                for (int c = 0; c < C; c++) {
                    const __m512i av = _mm512_loadu_si512((const void *)(yb[c]->qs + 64 * j));
                    for (int r = 0; r < R; r++) {
                        const int I = _mm512_reduce_add_epi32(
                            _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(q[r], av), sc[r]));
                        if (small) {
                            Is[r][c] += I;
                            continue;
                        }
                        const int M = m32[r][c][2 * j] + m32[r][c][2 * j + 1];
                        acc[r][c] = fmaf((float)I, d[r] * yb[c]->d, acc[r][c]);
                        accm[r][c] = fmaf((float)M, dmin[r] * yb[c]->d, accm[r][c]);
                    }
                }
            }
            if (small)
                for (int c = 0; c < C; c++)
                    for (int r = 0; r < R; r++) {
                        acc[r][c] = fmaf((float)Is[r][c], d[r] * yb[c]->d, acc[r][c]);
                        accm[r][c] = fmaf((float)_mm256_reduce_add_epi32_(ms[r][c]), dmin[r] * yb[c]->d, accm[r][c]);
                    }
            continue;
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m512i q[KT_RMAX], sc[KT_RMAX];
            for (int r = 0; r < R; r++) {
                q[r] = kquant_quarter(type, xb[r], j);
                sc[r] = kquant_quarter_scales(type, sb[r].sc, j);
            }
            for (int c = 0; c < C; c++) {
                const __m512i av = _mm512_loadu_si512((const void *)(yb[c]->qs + 64 * j));
                for (int r = 0; r < R; r++)
                    isum[r][c] = _mm512_dpwssd_epi32(isum[r][c], _mm512_maddubs_epi16(q[r], av), sc[r]);
            }
        }
        if (type == EL_Q6_K && small) {  /* vec_dot's 8 lanes: values 4k..4k+3 of every 32 */
            for (int c = 0; c < C; c++)
                for (int r = 0; r < R; r++) {
                    const __m256i l8 = _mm256_add_epi32(_mm512_castsi512_si256(isum[r][c]), _mm512_extracti64x4_epi64(isum[r][c], 1));
                    acc8[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(yb[c]->d * d[r]), _mm256_cvtepi32_ps(l8), acc8[r][c]);
                }
            continue;
        }
        for (int c = 0; c < C; c++)
            for (int r = 0; r < R; r++) {
                float t = (float)_mm512_reduce_add_epi32(isum[r][c]) * d[r];
                if (has_min) t = fmaf(-dmin[r], (float)_mm256_reduce_add_epi32_(ms[r][c]), t);
                acc[r][c] = fmaf(t, yb[c]->d, acc[r][c]);
            }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            out[(size_t)c * ldo + r] = type == EL_Q6_K && small ? hsum8_avx(acc8[r][c]) : acc[r][c] - accm[r][c];
}

/* ------------------------------------------------------------------------------------------ */
/* tiling: gemm_tiles in x86_common.h */

#define KERNELS(tname, TYPE, SMALL, RT, CT, RT1)                                                   \
    static void tname##_tile_avx512(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a,  \
                                    size_t lda, int C, float *out, size_t ldo) {                   \
        if (R == RT && C == CT) kquant_tile(TYPE, SMALL, n, w, ldw, RT, a, lda, CT, out, ldo);     \
        else if (R == 1 && C == CT) kquant_tile(TYPE, SMALL, n, w, ldw, 1, a, lda, CT, out, ldo);  \
        else if (R == RT1 && C == 1) kquant_tile(TYPE, SMALL, n, w, ldw, RT1, a, lda, 1, out, ldo); \
        else kquant_tile(TYPE, SMALL, n, w, ldw, 1, a, lda, 1, out, ldo);                          \
    }                                                                                              \
    static void tname##_gemm_avx512(int n, const void *w, size_t ldw, int nr, const void *a,       \
                                    size_t lda, int nc, float *out, size_t ldo) {                  \
        gemm_tiles(tname##_tile_avx512, RT, CT, RT1, n, w, ldw, nr, a, lda, nc, out, ldo);         \
    }                                                                                              \
    static void tname##_vec_dot_avx512(int n, float *s, const void *x, const void *y) {            \
        kquant_tile(TYPE, SMALL, n, x, 0, 1, y, 0, 1, s, 0);                                       \
    }

KERNELS(q2_K, EL_Q2_K, 0, 2, 4, 2)
KERNELS(q3_K, EL_Q3_K, 0, 2, 4, 2)
KERNELS(q4_K, EL_Q4_K, 0, 2, 4, 2)
KERNELS(q4_K_small, EL_Q4_K, 1, 2, 4, 2)
KERNELS(q5_K, EL_Q5_K, 0, 2, 4, 2)
KERNELS(q6_K, EL_Q6_K, 0, 2, 4, 2)
KERNELS(q6_K_small, EL_Q6_K, 1, 2, 4, 2)
#undef KERNELS

/* ---- attention and activation helpers (el_vec_ops; the portable twins are in dispatch.c) ---- */

/* el_sum16: the lane tree spelled out (compilers differ in how _mm512_reduce_add_ps adds) */
static inline float sum16_avx512(__m512 v) {
    const __m256 t = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
    const __m128 u = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
    const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));  /* u0 + u2, u1 + u3 */
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_movehdup_ps(w)));
}

/* el_expf on 16 lanes */
static inline __m512 expf_avx512(__m512 x) {
    const __m512 r = _mm512_set1_ps(0x1.8p23f);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r), r);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    const __m512 res = _mm512_scalef_ps(j, n);
    const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
    if (!big) return res;
    const __mmask16 neg = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ);
    const __m512 alt = _mm512_mask_blend_ps(neg, _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(big, res, alt);
}

/* one query at a time: 16 accumulators (lane class d mod 16) of 16 keys, then el_sum16 across them */
static void qk_tile_avx512(int hk, const float *q, int nq, int ldq, const el_half *kt, float *out) {
    for (int j = 0; j < nq; j++) {
        const float *qj = q + (size_t)j * ldq;
        __m512 acc[16];
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        for (int d0 = 0; d0 < hk; d0 += 16)
            for (int i = 0; i < 16 && d0 + i < hk; i++) {
                const __m512 k = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kt + (d0 + i) * 16)));
                acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(qj[d0 + i]), k, acc[i]);  /* exact product */
            }
        for (int i = 0; i < 8; i++) acc[i] = _mm512_add_ps(acc[i + 8], acc[i]);
        for (int i = 0; i < 4; i++) acc[i] = _mm512_add_ps(acc[i + 4], acc[i]);
        _mm512_storeu_ps(out + j * 16, _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3])));
    }
}

static void pv_tile_avx512(int hv, const float *w, const el_half *vt, float *acc) {
    const __m512 wv = _mm512_loadu_ps(w);
    for (int d = 0; d < hv; d++) {
        const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vt + d * 16)));
        _mm512_storeu_ps(acc + d * 16, _mm512_fmadd_ps(wv, v, _mm512_loadu_ps(acc + d * 16)));  /* exact product */
    }
}

static void sum16_rows_avx512(int n, const float *acc, float *out) {
    for (int i = 0; i < n; i++) out[i] = sum16_avx512(_mm512_loadu_ps(acc + 16 * i));
}

static double exp_sum_avx512(int n, float *x, float max) {
    double sum = 0.0;
    const __m512 m = _mm512_set1_ps(max);
    for (int i = 0; i < n; i += 16) {
        const __m512 v = expf_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
        _mm512_storeu_ps(x + i, v);
        sum += sum16_avx512(v);
    }
    return sum;
}

static void silu_mul_avx512(int64_t n, float *g, const float *u) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 e = expf_avx512(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), _mm512_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + el_expf(0.0f - g[i])) * u[i];
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* AVX512DQ: CPUID.(EAX=7, ECX=0):EBX bit 17; AVX512_VNNI: ECX bit 11 (dispatch.c has checked
 * F, BW, VL and the OS state) */
static int have_dq_vnni(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return ((b >> 17) & 1) && ((c >> 11) & 1);
}

void el_register_avx512(el_type_traits *t) {
    if (!have_dq_vnni()) return;  /* AVX2 kernels stay registered */
    el_vops.qk_tile = qk_tile_avx512;
    el_vops.pv_tile = pv_tile_avx512;
    el_vops.sum16_rows = sum16_rows_avx512;
    el_vops.exp_sum = exp_sum_avx512;
    el_vops.silu_mul = silu_mul_avx512;
#define SET(id, name) t[id].vec_dot = name##_vec_dot_avx512, t[id].gemm = name##_gemm_avx512
    SET(EL_Q4_0, q4_0);
    SET(EL_Q4_1, q4_1);
    SET(EL_Q5_0, q5_0);
    SET(EL_Q5_1, q5_1);
    SET(EL_Q8_0, q8_0);
    SET(EL_Q2_K, q2_K);
    SET(EL_Q3_K, q3_K);
    SET(EL_Q4_K, q4_K);
    SET(EL_Q5_K, q5_K);
    SET(EL_Q6_K, q6_K);
#undef SET
    t[EL_Q4_K].vec_dot_small = q4_K_small_vec_dot_avx512, t[EL_Q4_K].gemm_small = q4_K_small_gemm_avx512;
    t[EL_Q6_K].vec_dot_small = q6_K_small_vec_dot_avx512, t[EL_Q6_K].gemm_small = q6_K_small_gemm_avx512;
}
#endif
