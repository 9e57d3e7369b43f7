/* AVX-512 kernels (F, BW, VL, DQ with VNNI), per-function targets as in x86_avx2.c. They take
 * over the quantized types when the CPU also has AVX512_VNNI and AVX512DQ; otherwise (and for
 * the activation quantizers) the AVX2 kernels stay registered.
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

#if defined(EL_X86_EMULATED)  /* as in x86_avx2.c */
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#endif
#include <immintrin.h>

/* stands in for a missing row of a tile (its lanes are computed and ignored); as long as a
 * K-quant super-block (krw_tile reads a whole one) */
static const uint8_t zero_block[256] __attribute__((aligned(64))) = {0};

static inline uint16_t load_u16(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
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

/* the IQ4 table values of the packed groups at q0 (values 0..31) and q1 (32..63) */
static inline __m512i iq4_pair(const uint8_t *q0, const uint8_t *q1) {
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)el_iq4nl_values));
    return _mm512_shuffle_epi8(table, pair_nibbles(q0, q1));
}

/* fifth bits of two Q5 blocks (bit j of qh = value j) added as 0x10 (the nibbles are below it) */
static inline __m512i pair_fifth_bits(__m512i q, const uint8_t *qh0, const uint8_t *qh1) {
    uint32_t h0, h1;
    memcpy(&h0, qh0, 4);
    memcpy(&h1, qh1, 4);
    return _mm512_mask_add_epi8(q, (__mmask64)h0 | (__mmask64)h1 << 32, q, _mm512_set1_epi8(0x10));
}

/* ------------------------------------------------------------------------------------------
 * Legacy types, one block per step, two weight rows per register: lanes 0..7 take block b of
 * row r, lanes 8..15 block b of row r+1 (the activation block broadcast to both halves). Weight
 * values as unsigned bytes u with offset o (see x86_avx2_dots.h; Q8_0 is w + 128, o = 128); per
 * column and block the seed -o * sum(a) per lane. vpdpbusd int32 lane i of each half sums the
 * products of values 4i..4i+3, so each half is the generic twin's 8 lanes (quants_generic.c):
 * acc = fma(dw * da, lane, acc) block after block, hsum8 at the end. Q4_1 / Q5_1: the min part
 * is one chain summs = fma(m, s, summs) per (row, column), held in lane 4r + c of accm.
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
#define LT_CMAX 8  /* prepared columns; 4 unprepared */

/* one activation column at one block: values, the seed (types with an offset), d and s */
typedef struct {
    __m256i av, seed;
    float ad, s;
} lcol;

static inline int legacy_offset(const int type) {
    return type == EL_Q4_0 ? 8 : type == EL_Q5_0 ? 16 : type == EL_Q8_0 ? 128 : 0;
}

static inline __attribute__((always_inline)) void legacy_col(const int type, const uint8_t *a0, lcol *o) {
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1;
    const int off = legacy_offset(type);
    o->av = _mm256_loadu_si256((const __m256i *)(a0 + (has_m ? 4 : 2)));
    o->ad = _cvtsh_ss(load_u16(a0));
    o->s = has_m ? _cvtsh_ss(load_u16(a0 + 2)) : 0.0f;
    const __m256i zero = _mm256_setzero_si256();
    o->seed = off ? _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, _mm256_set1_epi8((char)off), o->av)) : zero;
}

/* A group of C <= 8 columns prepared once (legacy_gemm) for all the row tiles that share it, laid
 * out so the tile's inner loop only loads, from one cursor: per block b and column c (index
 * b * C + c) the values and the seed (types with an offset) already in both register halves, and
 * d; per block the eight columns' s side by side (types with a min; lanes past C zero). The
 * values legacy_col gives. */
typedef struct {
    __m512i *av, *seed;
    float *ad, *s;
} lprep;

static inline __attribute__((always_inline)) void legacy_prepare(const int type, const uint8_t *A, size_t lda,
                                                                 int C, int nb, const lprep *pp) {
    const size_t ab = type == EL_Q4_1 || type == EL_Q5_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    for (int c = 0; c < LT_CMAX; c++)
        for (int b = 0; b < nb; b++) {
            lcol col;
            if (c < C) legacy_col(type, A + (size_t)c * lda + (size_t)b * ab, &col);
            if (c < C) {
                const size_t i = (size_t)b * C + c;
                _mm512_storeu_si512(pp->av + i, _mm512_broadcast_i64x4(col.av));
                if (legacy_offset(type)) _mm512_storeu_si512(pp->seed + i, _mm512_broadcast_i64x4(col.seed));
                pp->ad[i] = col.ad;
            }
            if (pp->s) pp->s[LT_CMAX * b + c] = c < C ? col.s : 0.0f;
        }
}

static inline float hsum8_avx(__m256 v) {  /* el_hsum8 of common.h */
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
}

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* v with lane c (0..3) replaced by x's lane 0; the immediate spelled out per lane, as clang wants
 * a constant expression (c is one once the column loop is unrolled) */
static inline __attribute__((always_inline)) __m128 insert_lane_ps(__m128 v, __m128 x, const int c) {
    switch (c) {
    case 0: return _mm_insert_ps(v, x, 0x00);
    case 1: return _mm_insert_ps(v, x, 0x10);
    case 2: return _mm_insert_ps(v, x, 0x20);
    default: return _mm_insert_ps(v, x, 0x30);
    }
}

/* prepared: the C columns come from pp (legacy_prepare), else from a (lda apart) */
static inline __attribute__((always_inline)) void legacy_tile(const int type, int n, const uint8_t *w, size_t ldw,
                                                              const int R, const uint8_t *a, size_t lda,
                                                              const int prepared, const lprep *pp, const int C,
                                                              float *out, size_t ldo) {
    const int nb = n / 32, P = (R + 1) / 2;
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1;
    const size_t wbs = (size_t)legacy_block_bytes(type);
    const size_t abs_ = has_m ? sizeof(block_q8_1) : sizeof(block_q8_0);
    __m512 acc[LT_RMAX / 2][LT_CMAX];
    __m512 accm[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};  /* columns 0..3, 4..7 */
    for (int p = 0; p < P; p++)
        for (int c = 0; c < C; c++) acc[p][c] = _mm512_setzero_ps();
    /* header lane 2r: d of row r, lane 2r + 1: m (types with a min) */
    const __m512i dsel[2] = {_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2),
                             _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6)};
    const __m512i msel = _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7);
    pf_cursor pf = pf_start(w, ldw, R, (size_t)nb * wbs);
    for (int b = 0; b < nb; b++) {
        if (b % 2 == 0) pf_step(&pf, R, ldw, 2 * wbs);
        const uint8_t *wb = w + (size_t)b * wbs;
        uint32_t h[4] = {0, 0, 0, 0};
        for (int r = 0; r < R; r++) h[r] = load_u32(wb + (size_t)r * ldw);
        if (!has_m)
            for (int r = 0; r < R; r++) h[r] &= 0xFFFF;
        const __m512 hf = _mm512_castps256_ps512(
            _mm256_cvtph_ps(_mm_setr_epi32((int)h[0], (int)h[1], (int)h[2], (int)h[3])));
        __m512i wq[LT_RMAX / 2];
        __m512 wd[LT_RMAX / 2];
        for (int p = 0; p < P; p++) {
            const uint8_t *b0 = wb + (size_t)(2 * p) * ldw, *b1 = 2 * p + 1 < R ? b0 + ldw : zero_block;
            wq[p] = legacy_unpack_pair(type, b0, b1);
            wd[p] = _mm512_permutexvar_ps(dsel[p], hf);
        }
        __m128 sv = _mm_setzero_ps();  /* lane c: s of column c */
        for (int c = 0; c < C; c++) {
            __m512i av, seed;
            __m512 ad;
            if (prepared) {
                const size_t i = (size_t)b * C + c;
                av = _mm512_loadu_si512(pp->av + i);
                seed = legacy_offset(type) ? _mm512_loadu_si512(pp->seed + i) : _mm512_setzero_si512();
                ad = _mm512_set1_ps(pp->ad[i]);
            } else {
                lcol col;
                legacy_col(type, a + (size_t)c * lda + (size_t)b * abs_, &col);
                av = _mm512_broadcast_i64x4(col.av);
                seed = _mm512_broadcast_i64x4(col.seed);
                ad = _mm512_set1_ps(col.ad);
                if (has_m) sv = insert_lane_ps(sv, _mm_set_ss(col.s), c);
            }
            for (int p = 0; p < P; p++) {
                const __m512 x = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(seed, wq[p], av));
                acc[p][c] = _mm512_fmadd_ps(_mm512_mul_ps(wd[p], ad), x, acc[p][c]);
            }
        }
        if (has_m) {
            const __m512 hm = _mm512_permutexvar_ps(msel, hf);
            if (prepared) sv = _mm_loadu_ps(pp->s + LT_CMAX * b);
            accm[0] = _mm512_fmadd_ps(hm, _mm512_broadcast_f32x4(sv), accm[0]);
            if (C > 4) accm[1] = _mm512_fmadd_ps(hm, _mm512_broadcast_f32x4(_mm_loadu_ps(pp->s + LT_CMAX * b + 4)), accm[1]);
        }
    }
    float m[2][16];
    _mm512_storeu_ps(m[0], accm[0]);
    _mm512_storeu_ps(m[1], accm[1]);
    for (int c = 0; c < C; c++)
        for (int r = 0; r < R; r++) {
            const __m512 v = acc[r / 2][c];
            float s = hsum8_avx(r % 2 ? _mm512_extractf32x8_ps(v, 1) : _mm512_castps512_ps256(v));
            if (has_m) s += m[c / 4][4 * r + c % 4];
            out[(size_t)c * ldo + r] = s;
        }
}

/* ------------------------------------------------------------------------------------------
 * Legacy types, one activation column (a one-token step in llama.cpp's order, and vec_dot): the
 * same lanes and steps as legacy_tile (each row's block: 8 int32 lanes, acc = fma(dw * da, lane,
 * acc), hsum8 at the end, the min part one fma chain per row), laid out for a stream of rows:
 * - each row's block in a ymm of its own, no pairing shuffle (Zen 4 runs a zmm as two ymm halves
 *   anyway), unpacked with one broadcast load, a shift and a mask (Q8_0: a load and an xor);
 * - L1_R = 8 rows a tile, so the column's block (values, seed, d, s) is worked out once for 8
 *   rows, and their headers converted at once (one vcvtph2ps of d and m side by side): dw * da of
 *   row r in lane 2r, read back by the row's fma as a broadcast from memory; the min part one
 *   masked fma, row r's chain in lane 2r + 1;
 * - the span of rows L1_PF tiles ahead prefetched in order, a slice per block (as lrt_tile).
 * Single thread, weights from DRAM (a 100 MB Q4_1 K 576 / 178 MB Q8_0 K 640 matrix, one column,
 * GB/s against legacy_tile's 4 x 1 tiles): Q4_1 14.8 -> 21.3, Q8_0 20.5 -> 21.5 (the read loop: 24-25
 * on that busy machine); from L2 (0.7 MB Q4_1): 15.3 -> 21.9. 16-row tiles were faster from L2 and
 * slower from DRAM (Q4_1 15 GB/s), as were 2 and 8 tiles ahead (12.7, 15.3).
 * ------------------------------------------------------------------------------------------ */

/* a row's block as 32 unsigned bytes u = value + offset (legacy_unpack_pair, one row) */
static inline __attribute__((always_inline)) __m256i lone_unpack(const int type, const uint8_t *x) {
    if (type == EL_Q8_0)
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(x + offsetof(block_q8_0, qs))),
                                _mm256_set1_epi8((char)0x80));
    const size_t qo = type == EL_Q4_0 ? offsetof(block_q4_0, qs) : type == EL_Q4_1 ? offsetof(block_q4_1, qs)
                    : type == EL_Q5_0 ? offsetof(block_q5_0, qs) : offsetof(block_q5_1, qs);
    const __m256i z = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(x + qo)));
    const long long s4 = 0x0004000400040004LL;  /* low nibbles in the low half, high in the high */
    const __m256i q = _mm256_and_si256(_mm256_srlv_epi16(z, _mm256_setr_epi64x(0, 0, s4, s4)), _mm256_set1_epi8(0x0F));
    if (type == EL_Q4_0 || type == EL_Q4_1) return q;
    const size_t ho = type == EL_Q5_0 ? offsetof(block_q5_0, qh) : offsetof(block_q5_1, qh);
    return _mm256_mask_add_epi8(q, (__mmask32)load_u32(x + ho), q, _mm256_set1_epi8(0x10));  /* bit j: value j */
}

/* R <= L1_R weight rows (ldw bytes apart) x the one column a */
static inline __attribute__((always_inline)) void lone_tile(const int type, int n, const uint8_t *w, size_t ldw,
                                                            const int R, const uint8_t *a, float *out) {
    const int nb = n / 32;
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1, off = legacy_offset(type);
    const size_t wbs = (size_t)legacy_block_bytes(type), abs_ = has_m ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t aq = has_m ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    __m256 acc[L1_R];
    __m512 accm = _mm512_setzero_ps();
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const size_t span = (size_t)R * ldw;
    const uint8_t *ahead = w + L1_PF * span;
    const size_t pf_bytes = lrt_pf_bytes(span, nb);
    size_t po = 0;
    for (int b = 0; b < nb; b++) {
        for (const size_t pe = po + pf_bytes; po < pe; po += 64) __builtin_prefetch(ahead + po, 0, 2);
        const uint8_t *wb = w + (size_t)b * wbs, *ab = a + (size_t)b * abs_;
        const __m256i av = _mm256_loadu_si256((const __m256i *)(ab + aq));
        const __m256i seed = off ? _mm256_sub_epi32(_mm256_setzero_si256(),
                                                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)off), av))
                                 : _mm256_setzero_si256();
        uint32_t hd[L1_R];  /* row r's d (and m) */
        for (int r = 0; r < L1_R; r++) hd[r] = r < R ? load_u32(wb + (size_t)r * ldw) : 0;
        const __m512 f = _mm512_cvtph_ps(_mm256_setr_epi32((int)hd[0], (int)hd[1], (int)hd[2], (int)hd[3], (int)hd[4],
                                                           (int)hd[5], (int)hd[6], (int)hd[7]));
        float sc[2 * L1_R] __attribute__((aligned(64)));  /* lane 2r: dw * da of row r */
        _mm512_store_ps(sc, _mm512_maskz_mul_ps(0x5555, f, _mm512_set1_ps(_cvtsh_ss(load_u16(ab)))));
        if (has_m) accm = _mm512_mask3_fmadd_ps(f, _mm512_set1_ps(_cvtsh_ss(load_u16(ab + 2))), accm, 0xAAAA);
        __asm__ volatile("" : "+m"(sc));  /* read back by broadcasts, not shuffled out of registers */
        for (int r = 0; r < R; r++) {
            const __m256 x = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(seed, lone_unpack(type, wb + (size_t)r * ldw), av));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(sc[2 * r]), x, acc[r]);
        }
    }
    float m[2 * L1_R];
    _mm512_storeu_ps(m, accm);
    for (int r = 0; r < R; r++) out[r] = has_m ? hsum8_avx(acc[r]) + m[2 * r + 1] : hsum8_avx(acc[r]);
}

typedef void (*lone_fn)(int n, const uint8_t *w, size_t ldw, int nr, const uint8_t *a, float *out);

/* nr rows x one column: tiles of L1_R rows, then one at a time */
static inline __attribute__((always_inline)) void lone_gemm(const int type, int n, const uint8_t *w, size_t ldw,
                                                            int nr, const uint8_t *a, float *out) {
    int r = 0;
    for (; r + L1_R <= nr; r += L1_R) lone_tile(type, n, w + (size_t)r * ldw, ldw, L1_R, a, out + r);
    for (; r < nr; r++) lone_tile(type, n, w + (size_t)r * ldw, ldw, 1, a, out + r);
}

/* Legacy gemm: columns in groups of 8 prepared once (legacy_prepare) into `buf` and shared by all
 * the group's row tiles, then (fewer left) of 4, 3 or 2; groups of at most 4 prepared where 8 do not
 * fit the stack buffer, unprepared where 4 do not either; a single column through lone_gemm.
 * Prepared or not, the same values enter the same operations. */
typedef void (*ltile_fn)(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a, size_t lda,
                         const lprep *pp, int C, float *out, size_t ldo);

/* 64-byte units of a group of ct prepared columns: values, seeds (types with an offset), d, and s
 * (LT_CMAX lanes per block whatever ct) */
static inline size_t legacy_prep_vecs(int type, int ct, int nb) {
    const size_t cells = (size_t)ct * nb;
    return (legacy_offset(type) ? 2 : 1) * cells + ((cells + (size_t)LT_CMAX * nb) * 4 + 63) / 64;
}

static inline __attribute__((always_inline)) void legacy_gemm(const int type, ltile_fn tile, lone_fn one,
                                                              const int RT, const int ct, __m512i *buf, int n,
                                                              const void *w, size_t ldw, int nr, const void *a,
                                                              size_t lda, int nc, float *out, size_t ldo) {
    const uint8_t *W = w, *A = a;
    const int nb = n / 32, has_m = type == EL_Q4_1 || type == EL_Q5_1;
    const size_t cells = (size_t)ct * nb;
    float *fl = buf ? (float *)(buf + (legacy_offset(type) ? 2 : 1) * cells) : NULL;
    const lprep prep = {buf, legacy_offset(type) ? buf + cells : NULL, fl, has_m && fl ? fl + cells : NULL};
    for (int c = 0; c < nc;) {
        const int C = nc - c >= ct ? ct : EL_MIN(4, nc - c);
        if (C == 1) {
            one(n, W, ldw, nr, A + c * lda, out + c * ldo);
            break;
        }
        const lprep *pp = buf ? &prep : NULL;
        if (pp) legacy_prepare(type, A + c * lda, lda, C, nb, pp);
        int r = 0;
        for (; r + RT <= nr; r += RT) tile(n, W + r * ldw, ldw, RT, A + c * lda, lda, pp, C, out + c * ldo + r, ldo);
        for (; r < nr; r++) tile(n, W + r * ldw, ldw, 1, A + c * lda, lda, pp, C, out + c * ldo + r, ldo);
        c += C;
    }
}

/* stack for a prepared column group (64 + 64 + 8 bytes per column and block with an offset) */
#define LEGACY_PREP_BYTES 131072

/* the tile shapes legacy_gemm asks for: RT or 1 rows x 8, 4, 3 or 2 prepared columns, or 4, 3, 2
 * unprepared ones */
#define LEGACY_SHAPES(CALL, X, RT, R, C)                                  \
    do {                                                                  \
        switch (C) {                                                      \
        case 8: if ((R) == (RT)) CALL(X, RT, 8); else CALL(X, 1, 8); break; \
        case 4: if ((R) == (RT)) CALL(X, RT, 4); else CALL(X, 1, 4); break; \
        case 3: if ((R) == (RT)) CALL(X, RT, 3); else CALL(X, 1, 3); break; \
        default: if ((R) == (RT)) CALL(X, RT, 2); else CALL(X, 1, 2);    \
        }                                                                 \
    } while (0)
#define LG_TILE_P(T, RR, CC) legacy_tile(T, n, w, ldw, RR, a, lda, 1, pp, CC, out, ldo)
/* (unprepared groups hold at most 4 columns: the 8-column shape is never asked for unprepared) */
#define LG_TILE_U(T, RR, CC) legacy_tile(T, n, w, ldw, RR, a, lda, 0, NULL, (CC) > 4 ? 4 : (CC), out, ldo)
#define LEGACY_KERNELS(tname, TYPE, RT)                                                            \
    static void tname##_tile_avx512(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a,  \
                                    size_t lda, const lprep *pp, int C, float *out, size_t ldo) {  \
        if (pp) LEGACY_SHAPES(LG_TILE_P, TYPE, RT, R, C);                                          \
        else LEGACY_SHAPES(LG_TILE_U, TYPE, RT, R, C);                                             \
    }                                                                                              \
    static void tname##_one_avx512(int n, const uint8_t *w, size_t ldw, int nr, const uint8_t *a,  \
                                   float *out) {                                                   \
        lone_gemm(TYPE, n, w, ldw, nr, a, out);                                                    \
    }                                                                                              \
    static void tname##_gemm_avx512(int n, const void *w, size_t ldw, int nr, const void *a,       \
                                    size_t lda, int nc, float *out, size_t ldo) {                  \
        const int nb = n / 32;                                                                     \
        const int ct = legacy_prep_vecs(TYPE, 8, nb) * 64 <= LEGACY_PREP_BYTES ? 8 : 4;            \
        const int prep = nc >= 2 && legacy_prep_vecs(TYPE, ct, nb) * 64 <= LEGACY_PREP_BYTES;     \
        __m512i buf[prep ? legacy_prep_vecs(TYPE, ct, nb) : 1];                                    \
        legacy_gemm(TYPE, tname##_tile_avx512, tname##_one_avx512, RT, prep ? ct : 4, prep ? buf : NULL, n, w, \
                    ldw, nr, a, lda, nc, out, ldo);                                                \
    }                                                                                              \
    static void tname##_vec_dot_avx512(int n, float *s, const void *x, const void *y) {            \
        lone_tile(TYPE, n, x, 0, 1, y, s);                                                         \
    }

LEGACY_KERNELS(q4_1, EL_Q4_1, 4)
LEGACY_KERNELS(q5_0, EL_Q5_0, 4)
LEGACY_KERNELS(q5_1, EL_Q5_1, 4)
LEGACY_KERNELS(q8_0, EL_Q8_0, 4)
#undef LEGACY_KERNELS
#undef LG_TILE_P
#undef LG_TILE_U

/* the 4 bytes at p in every dword lane: one load (vbroadcastss from memory, no shuffle) */
static inline __m512i bcast32(const uint8_t *p) {
    return _mm512_castps_si512(_mm512_broadcastss_ps(_mm_load_ss((const float *)p)));
}

/* ------------------------------------------------------------------------------------------
 * Legacy types in the batch order (quants_generic.c: per block the exact integer sum of its 32
 * products, then one fma with dw * da per (row, column, block)). The integers may be gathered in
 * any layout, so the tiles take 16 weight rows at a time:
 * - one column (lrt_tile): four rows per register (a 128-bit lane each); each row's 4 vpdpbusd
 *   lanes reduced to one integer by a shuffle tree shared by the 16 rows (lrt_reduce), then one cvt
 *   and one fma for 16 rows.
 * - 2-16 columns (lrw_tile, prepared by lrt_prepare): the 16 rows' block transposed once, so the
 *   rows sit in the int32 lanes and each column's quants, broadcast, meet all 16 in one vpdpbusd.
 * More columns are taken in groups of at most 16, of sizes as even as can be (17 = 8 + 9). (A tile
 * with one column per int32 lane, for 17 columns or more, was removed: since lrw_tile it was slower
 * at every count measured, 17 to 512, on Zen 4.)
 * ------------------------------------------------------------------------------------------ */

/* t[i] 128-bit lane L: the 4 partial sums of row 4i + L -> lane j: the whole sum of row
 * 4 (j % 4) + j / 4 (lrt_lane gives a row's lane) */
static inline __m512i lrt_reduce(const __m512i t[4]) {
    __m512i x[2];
    for (int j = 0; j < 2; j++)  /* lane L of x[j]: rows 8j + L, 8j + 4 + L, 2 partial sums each */
        x[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * j], t[2 * j + 1]), _mm512_unpackhi_epi64(t[2 * j], t[2 * j + 1]));
    const __m512 x0 = _mm512_castsi512_ps(x[0]), x1 = _mm512_castsi512_ps(x[1]);
    return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0))),
                            _mm512_castps_si512(_mm512_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 1, 3, 1))));
}
static inline int lrt_lane(int r) { return 4 * (r % 4) + r / 4; }  /* and lane j holds row lrt_lane(j) */

/* 16 bytes at each of p[0..3], in the four 128-bit lanes */
static inline __m512i quad16(const uint8_t *const p[4], size_t off) {
    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p[0] + off)));
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p[1] + off)), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p[2] + off)), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p[3] + off)), 3);
}

/* the blocks of 4 rows as unsigned bytes u = value + offset: *lo lane L = values 0..15 of row L,
 * *hi = values 16..31 */
static inline __attribute__((always_inline)) void lrt_unpack(const int type, const uint8_t *const p[4], __m512i *lo,
                                                             __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if (type == EL_Q8_0) {
        *lo = _mm512_xor_si512(quad16(p, offsetof(block_q8_0, qs)), _mm512_set1_epi8((char)0x80));
        *hi = _mm512_xor_si512(quad16(p, offsetof(block_q8_0, qs) + 16), _mm512_set1_epi8((char)0x80));
        return;
    }
    const size_t qo = type == EL_Q4_0 ? offsetof(block_q4_0, qs) : type == EL_Q4_1 ? offsetof(block_q4_1, qs)
                    : type == EL_Q5_0 ? offsetof(block_q5_0, qs) : offsetof(block_q5_1, qs);
    const __m512i z = quad16(p, qo);
    *lo = _mm512_and_si512(z, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
    if (type == EL_Q5_0 || type == EL_Q5_1) {  /* bit j of qh: the fifth bit of value j */
        const size_t ho = type == EL_Q5_0 ? offsetof(block_q5_0, qh) : offsetof(block_q5_1, qh);
        uint64_t ml = 0, mh = 0;
        for (int r = 0; r < 4; r++) {
            const uint64_t h = load_u32(p[r] + ho);
            ml |= (h & 0xFFFF) << (16 * r);
            mh |= (h >> 16) << (16 * r);
        }
        *lo = _mm512_mask_add_epi8(*lo, (__mmask64)ml, *lo, _mm512_set1_epi8(0x10));
        *hi = _mm512_mask_add_epi8(*hi, (__mmask64)mh, *hi, _mm512_set1_epi8(0x10));
    }
}

/* R <= 16 weight rows x C <= LRT_C columns (a: lda bytes apart): per block, rows 4g..4g+3 in the
 * four 128-bit lanes of two registers (values 0..15, 16..31), each column's 16 bytes broadcast to
 * the lanes; vpdpbusd lanes then hold 4 partial sums per row, reduced by lrt_reduce for the 16
 * rows at once, then one cvt and one fma per column for the 16 rows. Up to LRT_C columns a pass
 * (the unpacked blocks serve them all): verification steps have 2-17 rows, a server's steps as many
 * as it has streams, and each group of columns past the first unpacks every block again. With 4
 * columns a pass, 5-8 took a second unpacking (bench_kernels --types Q4_1 --k 576 --rows 1536
 * --threads 1 --order batch: 5 columns 113 -> 145 GFLOP/s, 8: 133 -> 163); with 8, 9-16 did (the
 * same, 16 in place of 8, GFLOP/s: Q8_0 9 columns 182 -> 227, 12: 205 -> 260, 16: 228 -> 277;
 * Q4_1 9: 192 -> 216, 12: 219 -> 224, 16: 239 -> 236, its min terms' pass costing what the shared
 * unpacking saves at 16) */
#define LRT_C 16
/* lrw_tile keeps the min terms of more columns than this (types with a min) out of its main loop:
 * 16 sums and 16 min sums would not fit in the 32 registers beside a block's 8 unpacked vectors */
#define LRT_CM 8
/* Prefetch: the 16 rows of a tile are one contiguous span read 16 streams at a time; x86_common.h's
 * per-row cursor (16 lines 680 bytes apart per step) left this tile at 0.72x of the llama-order
 * legacy_tile over Gemma's 262144 x 640 Q8_0 logits at one column (bench_kernels --k 640 --rows
 * 262144 --tokens 1 --threads 2 --order batch: 32-36 against 44-50 GFLOP/s); the span two tiles
 * ahead prefetched in order, a slice per block, gives 42-46 against 40-52. */
/* a group of C <= LRT_C columns, per block b and column c at [b * LRT_C + c]: its d and s (types
 * with a min) as floats, and -offset * (the sum of its 32 quants) (types with an offset) — what
 * every 16-row tile of the group would otherwise work out again per column and block */
typedef struct {
    float *d, *s;
    int32_t *seed;
} lrtprep;
static inline size_t lrt_prep_words(int nb) { return (size_t)nb * LRT_C * 3; }

/* -offset * (the sum of a block's 32 quants at q) */
static inline int32_t lrt_seed(int off, const uint8_t *q) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)q);
    const __m256i s16 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s16), _mm256_extracti128_si256(s16, 1));
    return -off * _mm_cvtsi128_si32(_mm_add_epi32(_mm_hadd_epi32(s, s), _mm_shuffle_epi32(_mm_hadd_epi32(s, s), 1)));
}

static inline __attribute__((always_inline)) void lrt_prepare(const int type, const uint8_t *a, size_t lda, int C,
                                                              int nb, uint32_t *buf, lrtprep *pp) {
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1, off = legacy_offset(type);
    const size_t abs_ = has_m ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t aq = has_m ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    pp->d = (float *)buf;
    pp->s = pp->d + (size_t)nb * LRT_C;
    pp->seed = (int32_t *)(pp->s + (size_t)nb * LRT_C);
    for (int b = 0; b < nb; b++)
        for (int c = 0; c < C; c++) {
            const uint8_t *ab = a + (size_t)c * lda + (size_t)b * abs_;
            const size_t i = (size_t)b * LRT_C + c;
            pp->d[i] = _cvtsh_ss(load_u16(ab));
            pp->s[i] = has_m ? _cvtsh_ss(load_u16(ab + 2)) : 0.0f;
            pp->seed[i] = off ? lrt_seed(off, ab + aq) : 0;
        }
}

/* the block headers (d, then m for the types with a min) of the rows at wb + ix[j], lane j: 16
 * scalar loads and one vector load are faster than vpgatherdd here (single thread, K 576, 1536 rows,
 * Q4_1 2 columns: 30.5 -> 28 us a call, 8: 64.5 -> 60) */
static inline __m512i lrt_headers(const uint8_t *wb, const int ix[16]) {
    uint32_t h[16];
    for (int j = 0; j < 16; j++) h[j] = load_u32(wb + ix[j]);
    return _mm512_loadu_si512(h);
}


/* ix[j]: the offset of lane j's row (lrt_lane(j)) among R rows ldw bytes apart; 0 past R */
static inline void lrt_row_offsets(int R, size_t ldw, int ix[16]) {
    for (int j = 0; j < 16; j++) ix[j] = lrt_lane(j) < R ? lrt_lane(j) * (int)ldw : 0;
}

/* rows 4g..4g+3 of the block at wb (rows ldw bytes apart) unpacked into lo[g] / hi[g] (values
 * 0..15 / 16..31); rows past R are zero */
static inline __attribute__((always_inline)) void lrt_unpack_rows(const int type, const uint8_t *wb, size_t ldw,
                                                                  int R, __m512i lo[4], __m512i hi[4]) {
    for (int g = 0; g < 4; g++) {
        lo[g] = hi[g] = _mm512_setzero_si512();
        if (4 * g >= R) continue;
        const uint8_t *p[4];
        for (int l = 0; l < 4; l++) p[l] = 4 * g + l < R ? wb + (size_t)(4 * g + l) * ldw : zero_block;
        lrt_unpack(type, p, &lo[g], &hi[g]);
    }
}

/* the C columns' sums of a row tile (accm: the min terms, types with one) to out, row r from lane lrt_lane(r) */
static inline void lrt_store(const __m512 *acc, const __m512 *accm, int has_m, int C, int R, float *out,
                             size_t ldo) {
    for (int c = 0; c < C; c++) {
        float o[16];
        _mm512_storeu_ps(o, has_m ? _mm512_add_ps(acc[c], accm[c]) : acc[c]);
        for (int r = 0; r < R; r++) out[(size_t)c * ldo + r] = o[lrt_lane(r)];
    }
}

/* R <= 16 weight rows x one column a (a decode step's), in the layout above; the column's scales and
 * offset seed worked out as the blocks go (lrw_tile takes 2-8 prepared columns) */
static inline __attribute__((always_inline)) void lrt_tile(const int type, int n, const uint8_t *w, size_t ldw,
                                                           const int R, const uint8_t *a, float *out) {
    const int nb = n / 32;
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1, off = legacy_offset(type);
    const size_t wbs = (size_t)legacy_block_bytes(type), abs_ = has_m ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t aq = has_m ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    int ix[16];
    lrt_row_offsets(R, ldw, ix);
    __m512 acc = _mm512_setzero_ps(), accm = _mm512_setzero_ps();
    /* the R rows after the next R, one contiguous span, prefetched in order as the blocks go */
    const size_t span = (size_t)R * ldw;
    const uint8_t *ahead = w + 2 * span;
    const size_t pf_bytes = lrt_pf_bytes(span, nb);
    size_t po = 0;
    for (int b = 0; b < nb; b++) {
        for (const size_t pe = po + pf_bytes; po < pe; po += 64) __builtin_prefetch(ahead + po, 0, 2);
        const uint8_t *wb = w + (size_t)b * wbs;
        __m512i lo[4], hi[4];
        lrt_unpack_rows(type, wb, ldw, R, lo, hi);
        const __m512i hdr = lrt_headers(wb, ix);
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
        const __m512 mw = has_m ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16))) : dw;
        const uint8_t *ab = a + (size_t)b * abs_;
        const __m512i a0 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(ab + aq)));
        const __m512i a1 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(ab + aq + 16)));
        __m512i seed = _mm512_setzero_si512();
        if (off) {  /* -offset * the quants' sum, in the lanes of each row's partial sums */
            const __m512i o8 = _mm512_set1_epi8((char)off);
            seed = _mm512_sub_epi32(seed, _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(seed, o8, a0), o8, a1));
        }
        __m512i t[4];
        for (int g = 0; g < 4; g++)
            t[g] = 4 * g < R ? _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(seed, lo[g], a0), hi[g], a1) : _mm512_setzero_si512();
        const __m512i isum = lrt_reduce(t);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(_cvtsh_ss(load_u16(ab)))), acc);
        if (has_m) accm = _mm512_fmadd_ps(mw, _mm512_set1_ps(_cvtsh_ss(load_u16(ab + 2))), accm);
    }
    lrt_store(&acc, &accm, has_m, 1, R, out, 0);
}

/* q[g] 128-bit lane L: 16 bytes of row 4g + L -> t[k] dword lane lrt_lane(r): bytes 4k..4k+3 of row r
 * (a 4 x 4 dword transpose in each 128-bit lane) */
static inline void lrt_transpose(const __m512i q[4], __m512i t[4]) {
    const __m512i a = _mm512_unpacklo_epi32(q[0], q[1]), b = _mm512_unpackhi_epi32(q[0], q[1]);
    const __m512i c = _mm512_unpacklo_epi32(q[2], q[3]), d = _mm512_unpackhi_epi32(q[2], q[3]);
    t[0] = _mm512_unpacklo_epi64(a, c), t[1] = _mm512_unpackhi_epi64(a, c);
    t[2] = _mm512_unpacklo_epi64(b, d), t[3] = _mm512_unpackhi_epi64(b, d);
}

/* acc + the products of u's bytes with the 4 bytes at p (in every lane): vpdpbusd with an embedded
 * broadcast of its memory operand. GCC does not fold the broadcast itself; a separate broadcast
 * per 16 rows x 4 values left lrw_tile slower than lrt_tile (Q4_1, K 576, 1536 rows, 8 columns:
 * 82 against 79 us a call; with this 66) */
static inline __m512i dpbusd_bcast(__m512i acc, __m512i u, const uint8_t *p) {
#if defined(EL_X86_EMULATED)
    return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32((int)load_u32(p)));
#else
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const uint32_t *)p));
    return acc;
#endif
}

/* rows 4g..4g+3 of the blocks at wb (rows ldw apart), 16 bytes at off: q[g] 128-bit lane L = row
 * 4g + L; rows past R are zero */
static inline __attribute__((always_inline)) void krw_quads(const uint8_t *wb, size_t ldw, int R, size_t off,
                                                            __m512i q[4]) {
    for (int g = 0; g < 4; g++) {
        const uint8_t *p[4];
        for (int l = 0; l < 4; l++) p[l] = 4 * g + l < R ? wb + (size_t)(4 * g + l) * ldw : zero_block;
        q[g] = 4 * g < R ? quad16(p, off) : _mm512_setzero_si512();
    }
}

/* the 16 rows' block at wb as unsigned bytes u = value + offset, v[k] dword lane lrt_lane(r): values
 * 4k..4k+3 of row r. The 4-bit types transpose their 16 packed bytes, then unpack (half the shuffles
 * of transposing the unpacked values); rows past R are zero */
static inline __attribute__((always_inline)) void lrw_unpack(const int type, const uint8_t *wb, size_t ldw, int R,
                                                             __m512i v[8]) {
    __m512i lo[4], hi[4];
    if (type == EL_Q4_0 || type == EL_Q4_1) {
        const size_t qo = type == EL_Q4_0 ? offsetof(block_q4_0, qs) : offsetof(block_q4_1, qs);
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        krw_quads(wb, ldw, R, qo, lo);
        lrt_transpose(lo, hi);
        for (int k = 0; k < 4; k++) {
            v[k] = _mm512_and_si512(hi[k], m4);
            v[k + 4] = _mm512_and_si512(_mm512_srli_epi16(hi[k], 4), m4);
        }
        return;
    }
    lrt_unpack_rows(type, wb, ldw, R, lo, hi);
    lrt_transpose(lo, v), lrt_transpose(hi, v + 4);
}

/* lrt_tile for 2 <= C <= LRT_C prepared columns, its rows in the int32 lanes: per block the 16
 * rows' values transposed once (lrw_unpack), so that each column's 4 quants, broadcast, meet every
 * row in one vpdpbusd and the lanes end with the rows' whole sums: no per-column reduction
 * (lrt_reduce). Single thread, K 576, 1536 rows, us a call against lrt_tile: Q4_1 2 columns 34 ->
 * 31, 4: 50 -> 43, 8: 79 -> 65; Q8_0 2: 34 -> 33, 4: 46 -> 44, 8: 72 -> 64. Past LRT_CM columns
 * the min terms (their own sums, added at the end either way) take a pass of their own after the
 * main one, over the blocks' mins it kept, so that 16 columns share one unpacking of each block
 * instead of two of 8 */
static inline __attribute__((always_inline)) void lrw_tile(const int type, int n, const uint8_t *w, size_t ldw,
                                                           const int R, const lrtprep *pp, const uint8_t *a,
                                                           size_t lda, const int C, float *out, size_t ldo) {
    const int nb = n / 32;
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1, off = legacy_offset(type);
    const size_t wbs = (size_t)legacy_block_bytes(type), abs_ = has_m ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t aq = has_m ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    int ix[16];
    lrt_row_offsets(R, ldw, ix);
    const int sep = has_m && C > LRT_CM;  /* the min terms in a pass of their own */
    __m512 acc[LRT_C], accm[LRT_C];
    for (int c = 0; c < C; c++) acc[c] = accm[c] = _mm512_setzero_ps();
    float mws[sep ? nb : 1][16];  /* sep: the blocks' mins of the 16 rows, for the pass after the main one */
    const size_t span = (size_t)R * ldw;  /* prefetched as in lrt_tile */
    const uint8_t *ahead = w + 2 * span;
    const size_t pf_bytes = lrt_pf_bytes(span, nb);
    size_t po = 0;
    for (int b = 0; b < nb; b++) {
        for (const size_t pe = po + pf_bytes; po < pe; po += 64) __builtin_prefetch(ahead + po, 0, 2);
        const uint8_t *wb = w + (size_t)b * wbs;
        __m512i v[8];
        lrw_unpack(type, wb, ldw, R, v);
        const __m512i hdr = lrt_headers(wb, ix);
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
        const __m512 mw = has_m ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16))) : dw;
        if (sep) _mm512_storeu_ps(mws[b], mw);
        for (int c = 0; c < C; c++) {
            const uint8_t *q = a + (size_t)c * lda + (size_t)b * abs_ + aq;
            const size_t i = (size_t)b * LRT_C + c;
            __m512i s0 = off ? _mm512_set1_epi32(pp->seed[i]) : _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            for (int k = 0; k < 8; k += 2) {
                s0 = dpbusd_bcast(s0, v[k], q + 4 * k);
                s1 = dpbusd_bcast(s1, v[k + 1], q + 4 * k + 4);
            }
            const __m512i isum = _mm512_add_epi32(s0, s1);  /* (exact integers: any order) */
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(pp->d[i])), acc[c]);
            if (has_m && !sep) accm[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(pp->s[i]), accm[c]);
        }
    }
    for (int b = 0; sep && b < nb; b++) {
        const __m512 mw = _mm512_loadu_ps(mws[b]);
        for (int c = 0; c < C; c++) accm[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(pp->s[(size_t)b * LRT_C + c]), accm[c]);
    }
    lrt_store(acc, accm, has_m, C, R, out, ldo);
}

typedef void (*lrt_fn)(int n, const uint8_t *w, size_t ldw, int R, const lrtprep *pp, const uint8_t *a, size_t lda,
                       int C, float *out, size_t ldo);
typedef void (*lrtprep_fn)(const uint8_t *a, size_t lda, int C, int nb, uint32_t *buf, lrtprep *pp);
/* stack for the row tiles' column groups prepared at once (lrt_prepare); more groups than fit
 * are taken a chunk at a time */
#define LRT_PREP_BYTES 131072

/* batch-order gemm: 16 rows x up to LRT_C columns at a time (groups of sizes as even as can be:
 * a lone column would take the one-column tile, a second pass over the weights), the column
 * groups of a row tile after one another (its weights stay in L1) */
static inline __attribute__((always_inline)) void lbatch_gemm(const int type, lrt_fn rt, lrtprep_fn rp, int n,
                                                              const void *w, size_t ldw, int nr, const void *a,
                                                              size_t lda, int nc, float *out, size_t ldo) {
    const uint8_t *W = w, *A = a;
    const int nb = n / 32;
    if (nc <= 0) return;
    const size_t words = lrt_prep_words(nb);
    const int groups = (nc + LRT_C - 1) / LRT_C, chunk = EL_MAX(1, (int)(LRT_PREP_BYTES / 4 / words));
    const int one = nc == 1;  /* (a tile of one column works them out itself: as fast) */
    uint32_t buf[(size_t)EL_MIN(groups, chunk) * words];
    lrtprep pp[EL_MIN(groups, chunk)];
    for (int g0 = 0; g0 < groups; g0 += chunk) {
        const int gn = EL_MIN(chunk, groups - g0);
        int ks[gn + 1];  /* group g0 + g: columns [ks[g], ks[g + 1]) */
        for (int g = 0; g <= gn; g++) ks[g] = nc * (g0 + g) / groups;
        for (int g = 0; g < gn && !one; g++)
            rp(A + ks[g] * lda, lda, ks[g + 1] - ks[g], nb, buf + (size_t)g * words, &pp[g]);
        for (int r = 0; r < nr; r += 16)
            for (int g = 0; g < gn; g++)
                rt(n, W + r * ldw, ldw, EL_MIN(16, nr - r), one ? NULL : &pp[g], A + ks[g] * lda, lda,
                   ks[g + 1] - ks[g], out + ks[g] * ldo + r, ldo);
    }
}

#define LRT_SHAPE(TYPE, RR)                                                     \
    switch (C) {                                                                \
    case 16: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 16, out, ldo); break;         \
    case 15: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 15, out, ldo); break;         \
    case 14: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 14, out, ldo); break;         \
    case 13: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 13, out, ldo); break;         \
    case 12: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 12, out, ldo); break;         \
    case 11: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 11, out, ldo); break;         \
    case 10: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 10, out, ldo); break;         \
    case 9: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 9, out, ldo); break;           \
    case 8: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 8, out, ldo); break;           \
    case 7: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 7, out, ldo); break;           \
    case 6: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 6, out, ldo); break;           \
    case 5: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 5, out, ldo); break;           \
    case 4: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 4, out, ldo); break;           \
    case 3: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 3, out, ldo); break;           \
    case 2: lrw_tile(TYPE, n, w, ldw, RR, pp, a, lda, 2, out, ldo); break;           \
    default: lrt_tile(TYPE, n, w, ldw, RR, a, out);                                  \
    }
#define LBATCH_KERNELS(tname, TYPE)                                                                \
    static void tname##_rt_avx512(int n, const uint8_t *w, size_t ldw, int R, const lrtprep *pp,   \
                                  const uint8_t *a, size_t lda, int C, float *out, size_t ldo) {   \
        if (R == 16) LRT_SHAPE(TYPE, 16)                                                           \
        else LRT_SHAPE(TYPE, R)                                                                    \
    }                                                                                              \
    static void tname##_rp_avx512(const uint8_t *a, size_t lda, int C, int nb, uint32_t *buf,      \
                                  lrtprep *pp) {                                                   \
        lrt_prepare(TYPE, a, lda, C, nb, buf, pp);                                                 \
    }                                                                                              \
    static void tname##_batch_gemm_avx512(int n, const void *w, size_t ldw, int nr, const void *a, \
                                          size_t lda, int nc, float *out, size_t ldo) {            \
        lbatch_gemm(TYPE, tname##_rt_avx512, tname##_rp_avx512, n, w, ldw, nr, a, lda, nc, out, ldo); \
    }                                                                                              \
    static void tname##_batch_vec_dot_avx512(int n, float *s, const void *x, const void *y) {      \
        tname##_batch_gemm_avx512(n, x, 0, 1, y, 0, 1, s, 0);                                      \
    }

LBATCH_KERNELS(q4_0, EL_Q4_0)
LBATCH_KERNELS(q4_1, EL_Q4_1)
LBATCH_KERNELS(q5_0, EL_Q5_0)
LBATCH_KERNELS(q5_1, EL_Q5_1)
LBATCH_KERNELS(q8_0, EL_Q8_0)
#undef LBATCH_KERNELS
#undef LRT_SHAPE

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

#define KT_RMAX 2
#define KT_CMAX 4

/* small: the small-batch order (el_small_rows) of Q4_K / Q6_K instead of the batch one */
/* the 8 sums of 16 int32 lanes each, in order (integer adds: any order gives the same) */
static inline __m256i hsum8x16(const __m512i v[8]) {
    __m512i b[2];
    for (int h = 0; h < 2; h++) {
        const __m512i *u = v + 4 * h;
        const __m512i a01 = _mm512_add_epi32(_mm512_unpacklo_epi32(u[0], u[1]), _mm512_unpackhi_epi32(u[0], u[1]));
        const __m512i a23 = _mm512_add_epi32(_mm512_unpacklo_epi32(u[2], u[3]), _mm512_unpackhi_epi32(u[2], u[3]));
        b[h] = _mm512_add_epi32(_mm512_unpacklo_epi64(a01, a23), _mm512_unpackhi_epi64(a01, a23));
    }
    /* b[h] holds, per 128-bit chunk k, partial sums of v[4h..4h+3]; add the chunks */
    const __m512i c = _mm512_add_epi32(_mm512_shuffle_i32x4(b[0], b[1], 0x44), _mm512_shuffle_i32x4(b[0], b[1], 0xEE));
    const __m512i e = _mm512_add_epi32(_mm512_shuffle_i32x4(c, c, 0x88), _mm512_shuffle_i32x4(c, c, 0xDD));
    return _mm512_castsi512_si256(e);
}

/* 8x8 int32 transpose: out[g] lane p = in[p] lane g */
static inline void transpose8x8(const __m256i in[8], __m256i out[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++) {
            u[4 * i + 2 * k] = _mm256_unpacklo_epi64(t[4 * i + k], t[4 * i + 2 + k]);
            u[4 * i + 2 * k + 1] = _mm256_unpackhi_epi64(t[4 * i + k], t[4 * i + 2 + k]);
        }
    for (int k = 0; k < 4; k++) {
        out[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
        out[4 + k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
}

/* A tile of R <= 2 rows x C <= 4 columns; (row r, column c) is pair p = 4r + c, one lane of the
 * float accumulators, so the generic twin's scalar steps run for 8 pairs at once.
 * small: the small-batch order (el_small_rows) of Q3_K / Q4_K / Q5_K / Q6_K instead of the batch
 * one (Q3_K small: each lane's own -4 * scale * q8 terms, as ggml's vec_dot, not the bsums seed) */
static inline __attribute__((always_inline)) void kquant_tile(const int type, const int small, int n, const uint8_t *w,
                                                              size_t ldw, const int R, const uint8_t *a, size_t lda,
                                                              const int C, float *out, size_t ldo) {
    const int nb = n / QK_K;
    const size_t wbs = (size_t)kquant_block_bytes(type);
    const int has_min = type == EL_Q2_K || type == EL_Q4_K || type == EL_Q5_K;
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    const int lanes8 = small && (type == EL_Q3_K || type == EL_Q5_K || type == EL_Q6_K);
    const int q3s = small && type == EL_Q3_K;
    __m256 acc6[KT_RMAX][KT_CMAX];  /* Q5_K / Q6_K small: vec_dot's 8 lanes per pair */
    __m256 summs = _mm256_setzero_ps();  /* Q5_K small: the mins' chain, lane p */
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc6[r][c] = _mm256_setzero_ps();

    pf_cursor pf = pf_start(w, ldw, R, (size_t)nb * wbs);
    for (int i = 0; i < nb; i++) {
        pf_step(&pf, R, ldw, wbs);
        ksb sb[KT_RMAX];
        const uint8_t *xb[KT_RMAX];
        const block_q8_K *yb[KT_CMAX];
        float dp[8] = {0}, dminp[8] = {0}, dap[8] = {0};
        for (int r = 0; r < R; r++) {
            xb[r] = w + (size_t)r * ldw + (size_t)i * wbs;
            kquant_prep(type, xb[r], &sb[r]);
        }
        __m512i isum[8];
        __m256i ms[8];  /* min terms of pair p, int32 lane g = m_g * bsum of sub-block g (or the seed) */
        for (int p = 0; p < 8; p++) isum[p] = _mm512_setzero_si512(), ms[p] = _mm256_setzero_si256();
        for (int c = 0; c < C; c++) {
            yb[c] = (const block_q8_K *)(a + (size_t)c * lda) + i;
            const __m256i bs = _mm256_loadu_si256((const __m256i *)yb[c]->bsums);
            for (int r = 0; r < R; r++) {
                const int p = 4 * r + c;
                dp[p] = _mm512_cvtss_f32(sb[r].d);
                dminp[p] = has_min ? _mm512_cvtss_f32(sb[r].dmin) : 0.0f;
                dap[p] = yb[c]->d;
                ms[p] = _mm256_madd_epi16(sb[r].mins, bs);
                if (!has_min && !q3s) isum[p] = _mm512_zextsi256_si512(ms[p]);
            }
        }
        const __m256 d8 = _mm256_loadu_ps(dp), dmin8 = _mm256_loadu_ps(dminp), da8 = _mm256_loadu_ps(dap);
        __m256i mt[8];  /* mt[g] lane p = ms[p] lane g */
        if (has_min) transpose8x8(ms, mt);
        if (type == EL_Q4_K) {  /* float steps per quarter (small: per super-block) */
            const __m256 dd8 = _mm256_mul_ps(d8, da8), dm8 = _mm256_mul_ps(dmin8, da8);
            __m256i isb = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m512i q[KT_RMAX], sc[KT_RMAX], x[8];
                for (int r = 0; r < R; r++) {
                    q[r] = kquant_quarter(type, xb[r], j);
                    sc[r] = kquant_quarter_scales(type, sb[r].sc, j);
                }
                for (int p = 0; p < 8; p++) x[p] = _mm512_setzero_si512();
                for (int c = 0; c < C; c++) {
                    const __m512i av = _mm512_loadu_si512((const void *)(yb[c]->qs + 64 * j));
                    for (int r = 0; r < R; r++)
                        x[4 * r + c] = _mm512_dpwssd_epi32(x[4 * r + c], _mm512_maddubs_epi16(q[r], av), sc[r]);
                }
                const __m256i I = hsum8x16(x);
                if (small) {
                    isb = _mm256_add_epi32(isb, I);
                    continue;
                }
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), dd8, acc);
                accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(mt[2 * j], mt[2 * j + 1])), dm8, accm);
            }
            if (small) {
                const __m256i M = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(mt[0], mt[1]), _mm256_add_epi32(mt[2], mt[3])),
                                                   _mm256_add_epi32(_mm256_add_epi32(mt[4], mt[5]), _mm256_add_epi32(mt[6], mt[7])));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isb), dd8, acc);
                accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(M), dm8, accm);
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
                const __m512i a4 = q3s ? _mm512_maddubs_epi16(_mm512_set1_epi8(4), av) : _mm512_setzero_si512();
                for (int r = 0; r < R; r++) {
                    const __m512i p16 = _mm512_maddubs_epi16(q[r], av);  /* Q3_K small: minus 4 * q8 */
                    isum[4 * r + c] = _mm512_dpwssd_epi32(isum[4 * r + c], q3s ? _mm512_sub_epi16(p16, a4) : p16, sc[r]);
                }
            }
        }
        if (lanes8) {  /* vec_dot's 8 lanes: values 4k..4k+3 of every 32 */
            if (type == EL_Q5_K) {
                const __m256i M = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(mt[0], mt[1]), _mm256_add_epi32(mt[2], mt[3])),
                                                   _mm256_add_epi32(_mm256_add_epi32(mt[4], mt[5]), _mm256_add_epi32(mt[6], mt[7])));
                const __m256 dmn = _mm256_mul_ps(_mm256_xor_ps(da8, _mm256_set1_ps(-0.0f)), dmin8);  /* -d_act * dmin */
                summs = _mm256_fmadd_ps(dmn, _mm256_cvtepi32_ps(M), summs);
            }
            for (int c = 0; c < C; c++)
                for (int r = 0; r < R; r++) {
                    const __m512i v = isum[4 * r + c];
                    const __m256i l8 = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
                    acc6[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(yb[c]->d * dp[4 * r + c]), _mm256_cvtepi32_ps(l8), acc6[r][c]);
                }
            continue;
        }
        __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(hsum8x16(isum)), d8);
        if (has_min) {
            const __m256i M = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(mt[0], mt[1]), _mm256_add_epi32(mt[2], mt[3])),
                                               _mm256_add_epi32(_mm256_add_epi32(mt[4], mt[5]), _mm256_add_epi32(mt[6], mt[7])));
            t = _mm256_fnmadd_ps(dmin8, _mm256_cvtepi32_ps(M), t);
        }
        acc = _mm256_fmadd_ps(t, da8, acc);
    }
    float res[8], sm[8];
    _mm256_storeu_ps(res, _mm256_sub_ps(acc, accm));
    _mm256_storeu_ps(sm, summs);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            out[(size_t)c * ldo + r] = !lanes8 ? res[4 * r + c]
                                       : type == EL_Q5_K ? hsum8_avx(acc6[r][c]) + sm[4 * r + c] : hsum8_avx(acc6[r][c]);
}

/* ------------------------------------------------------------------------------------------
 * K-quants and IQ4_XS with many columns: one activation column per int32 lane (16 lanes), so the
 * row's 4-value groups are broadcast (one load each) to all the columns. Within a super-block
 * everything is an exact integer, so the lanes may gather it in any order: a row's values as
 * unsigned bytes (Q3_K, Q6_K, IQ4_XS: value + offset), per 4 values a vpdpbusd against the
 * columns' quants, chained over a group (16 or 32 values), times its scale (vpmulld); the
 * activations' sums (the columns' bsums, by vpdpwssd) times the mins, or times -offset * scale;
 * then the generic twin's float steps lane by lane (as many per column as its dot product's).
 * Each vector of column quants is loaded once for CL_RMAX rows: a vpdpbusd that takes a broadcast
 * and a full load is bound by the loads (Q5_K, 16 columns: one load per vpdpbusd ~165 GFLOP/s,
 * a quarter ~190, scripts/bench_kernels.py single thread, K 2048).
 * ------------------------------------------------------------------------------------------ */

#define CL_RMAX 4

/* a group of C <= 16 columns, per super-block i: a[64i + g] lane c = quants 4g..4g+3 of column c,
 * bs[8i + k] lane c = its bsums 2k, 2k+1 as an int16 pair, d[i] lane c = its d; lanes past C zero */
typedef struct {
    __m512i *a, *bs;
    __m512 *d;
} kclprep;

static inline size_t kcl_prep_vecs(int nb) { return (size_t)nb * (64 + 8 + 1); }

static void kcl_prepare(const uint8_t *A, size_t lda, int C, int nb, __m512i *buf, kclprep *pp) {
    pp->a = buf;
    pp->bs = buf + (size_t)64 * nb;
    pp->d = (__m512 *)(pp->bs + (size_t)8 * nb);
    for (int i = 0; i < nb; i++) {
        uint32_t q[64][16], bp[8][16];
        float d[16];
        for (int c = 0; c < 16; c++) {
            const block_q8_K *y = (const block_q8_K *)(A + (size_t)c * lda) + i;
            for (int g = 0; g < 64; g++) q[g][c] = c < C ? load_u32(y->qs + 4 * g) : 0;
            for (int k = 0; k < 8; k++) bp[k][c] = c < C ? load_u32(y->bsums + 2 * k) : 0;
            d[c] = c < C ? y->d : 0.0f;
        }
        for (int g = 0; g < 64; g++) _mm512_storeu_si512(pp->a + 64 * i + g, _mm512_loadu_si512(q[g]));
        for (int k = 0; k < 8; k++) _mm512_storeu_si512(pp->bs + 8 * i + k, _mm512_loadu_si512(bp[k]));
        _mm512_storeu_ps(pp->d + i, _mm512_loadu_ps(d));
    }
}

/* int16 pair (lo, hi) as an int32 */
static inline int pair16(int lo, int hi) { return (int)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16); }

/* values per scale of the types kcl_tile takes */
static inline int kcl_group(int type) { return type == EL_Q2_K || type == EL_Q3_K || type == EL_Q6_K ? 16 : 32; }

/* One row's super-block x for kcl_tile: its 256 values as unsigned bytes (wu), the scale of each
 * group (sc), per pair of bsums k the int16 pair that multiplies them (mp: the mins, or -offset *
 * the scales), d and dmin */
static inline __attribute__((always_inline)) void kcl_unpack(const int type, const uint8_t *x, uint8_t *wu,
                                                             int32_t sc[16], int32_t mp[8], float *d, float *dmin) {
    if (type == EL_IQ4_XS) {
        const uint8_t *qs = x + offsetof(block_iq4_xs, qs);
        for (int j = 0; j < 4; j++)  /* table value + 128 */
            _mm512_store_si512(wu + 64 * j, _mm512_xor_si512(iq4_pair(qs + 32 * j, qs + 32 * j + 16), _mm512_set1_epi8((char)0x80)));
        iq4_xs_scales(x, sc);
        for (int j = 0; j < 8; j++) mp[j] = pair16(-128 * sc[j], -128 * sc[j]);
        *d = _cvtsh_ss(load_u16(x + offsetof(block_iq4_xs, d)));
        *dmin = 0.0f;
        return;
    }
    for (int j = 0; j < 4; j++) _mm512_store_si512(wu + 64 * j, kquant_quarter(type, x, j));
    if (type == EL_Q4_K || type == EL_Q5_K) {
        uint32_t scw[2], mw[2];
        k4_scales_mins(x + offsetof(block_q4_K, scales), scw, mw);
        uint8_t s8[8], m8[8];
        memcpy(s8, scw, 8);
        memcpy(m8, mw, 8);
        for (int j = 0; j < 8; j++) sc[j] = s8[j], mp[j] = pair16(m8[j], m8[j]);
        *d = _cvtsh_ss(load_u16(x + offsetof(block_q4_K, d)));
        *dmin = _cvtsh_ss(load_u16(x + offsetof(block_q4_K, dmin)));
        return;
    }
    ksb sb;  /* Q2_K, Q3_K, Q6_K: 16 int16 scales, and per bsums entry the min or -offset * scale */
    kquant_prep(type, x, &sb);
    const __m256i s16 = _mm512_castsi512_si256(sb.sc);
    _mm256_storeu_si256((__m256i *)sc, _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s16)));
    _mm256_storeu_si256((__m256i *)(sc + 8), _mm256_cvtepi16_epi32(_mm256_extracti128_si256(s16, 1)));
    _mm256_storeu_si256((__m256i *)mp, sb.mins);
    *d = _mm512_cvtss_f32(sb.d);
    *dmin = type == EL_Q2_K ? _mm512_cvtss_f32(sb.dmin) : 0.0f;
}

/* R <= CL_RMAX weight rows x the C columns of pp, the batch order */
static inline __attribute__((always_inline)) void kcl_tile(const int type, int n, const uint8_t *w,
                                                           size_t ldw, const int R, const kclprep *pp, const int C,
                                                           float *out, size_t ldo) {
    const int nb = n / QK_K, G = kcl_group(type);
    const int has_min = type == EL_Q2_K || type == EL_Q4_K || type == EL_Q5_K;
    const size_t wbs = (size_t)kquant_block_bytes(type);
    __m512 acc[CL_RMAX], accm[CL_RMAX];
    for (int r = 0; r < R; r++) acc[r] = accm[r] = _mm512_setzero_ps();
    pf_cursor pf = pf_start(w, ldw, R, (size_t)nb * wbs);
    for (int i = 0; i < nb; i++) {
        pf_step(&pf, R, ldw, wbs);
        const __m512 da = _mm512_loadu_ps(pp->d + i);
        const __m512i *a = pp->a + 64 * i, *bs = pp->bs + 8 * i;
        uint8_t wu[CL_RMAX][QK_K] __attribute__((aligned(64)));
        int32_t sc[CL_RMAX][16], mp[CL_RMAX][8];  /* in memory, so that vpmulld / vpdpwssd broadcast them */
        float dw[CL_RMAX], dmw[CL_RMAX];
        for (int r = 0; r < R; r++) kcl_unpack(type, w + (size_t)r * ldw + (size_t)i * wbs, wu[r], sc[r], mp[r], &dw[r], &dmw[r]);
        __asm__ volatile("" : "+m"(wu), "+m"(sc), "+m"(mp));  /* reloaded by broadcasts, not shuffled out */
        __m512i I[CL_RMAX], M[CL_RMAX];
        for (int r = 0; r < R; r++) I[r] = M[r] = _mm512_setzero_si512();
        for (int k = 0; k < 8; k++) {  /* 32 values: one group, or two of 16 */
            __m512i t0[CL_RMAX], t1[CL_RMAX];  /* 32: values 8u..8u+3 / 8u+4..8u+7; 16: the two groups */
            for (int r = 0; r < R; r++) t0[r] = t1[r] = _mm512_setzero_si512();
            for (int u = 0; u < 4; u++) {
                const int u0 = G == 32 ? 2 * u : u, u1 = G == 32 ? 2 * u + 1 : u + 4;
                const __m512i a0 = _mm512_loadu_si512(a + 8 * k + u0), a1 = _mm512_loadu_si512(a + 8 * k + u1);
                for (int r = 0; r < R; r++) {
                    t0[r] = _mm512_dpbusd_epi32(t0[r], bcast32(wu[r] + 32 * k + 4 * u0), a0);
                    t1[r] = _mm512_dpbusd_epi32(t1[r], bcast32(wu[r] + 32 * k + 4 * u1), a1);
                }
            }
            const __m512i bsk = _mm512_loadu_si512(bs + k);
            for (int r = 0; r < R; r++) {
                if (G == 32) {
                    I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(_mm512_add_epi32(t0[r], t1[r]), _mm512_set1_epi32(sc[r][k])));
                } else {
                    I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(t0[r], _mm512_set1_epi32(sc[r][2 * k])));
                    I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(t1[r], _mm512_set1_epi32(sc[r][2 * k + 1])));
                }
                M[r] = _mm512_dpwssd_epi32(M[r], bsk, _mm512_set1_epi32(mp[r][k]));
                if (type == EL_Q4_K && k % 2) {  /* float steps per 64 values */
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r]), _mm512_mul_ps(_mm512_set1_ps(dw[r]), da), acc[r]);
                    accm[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(M[r]), _mm512_mul_ps(_mm512_set1_ps(dmw[r]), da), accm[r]);
                    I[r] = M[r] = _mm512_setzero_si512();
                }
            }
        }
        for (int r = 0; r < R; r++) {
            if (type == EL_Q4_K) continue;
            if (has_min)  /* fma(-dmin, summs, isum * d), then times d_act */
                acc[r] = _mm512_fmadd_ps(_mm512_fnmadd_ps(_mm512_set1_ps(dmw[r]), _mm512_cvtepi32_ps(M[r]),
                                                          _mm512_mul_ps(_mm512_cvtepi32_ps(I[r]), _mm512_set1_ps(dw[r]))),
                                         da, acc[r]);
            else  /* the offset is in the integer: isum * d, times d_act */
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(I[r], M[r])), _mm512_set1_ps(dw[r])),
                                         da, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        float o[16];
        _mm512_storeu_ps(o, type == EL_Q4_K ? _mm512_sub_ps(acc[r], accm[r]) : acc[r]);
        for (int c = 0; c < C; c++) out[(size_t)c * ldo + r] = o[c];
    }
}

/* ------------------------------------------------------------------------------------------
 * Q4_K, Q5_K with 1-8 columns: the rows in the int32 lanes, as lrw_tile does for the legacy
 * types. Per super-block the 16 rows' headers and scales (the first 16 bytes of the block) are
 * transposed once and their 6-bit scales and mins unpacked for the 16 rows at once; the rows'
 * values are transposed once into 64 vectors (lane: 4 values of one row), then each column's 4
 * quants, broadcast, meet all 16 rows in one vpdpbusd, a sub-block times its scale (vpmulld) and
 * the mins from the column's bsums (vpdpwssd). The float steps are the generic twin's, lane by
 * lane: per span of sub-blocks (Q4_K: 2 in the batch order, 8 in the small-batch one) or per
 * super-block (Q5_K). These counts went through kquant_tile before (2 rows x 4 columns, 8 pairs in
 * one register, summed by a shuffle tree per quarter): single thread, K 2048, 2048 rows, batch
 * order, GFLOP/s at 1 / 2 / 4 / 8 columns, two runs alternating (bench_kernels --types Q4_K,Q5_K
 * --isas avx512 --mb 0 --k 2048 --rows 2048 --tokens 1,2,4,8 --threads 1 --order batch):
 * Q4_K 23 / 41 / 67 / 66 -> 57-68 / 81-92 / 113-124 / 136-142,
 * Q5_K 23 / 44 / 76 / 78-88 -> 36-48 / 53-67 / 89-104 / 128-144.
 * ------------------------------------------------------------------------------------------ */

#define KRW_C 8

/* 16 bytes at off of the R rows' blocks, transposed: t[k] dword lane lrt_lane(r) = bytes 4k..4k+3
 * of row r */
static inline __attribute__((always_inline)) void krw_dwords(const uint8_t *wb, size_t ldw, int R, size_t off,
                                                             __m512i t[4]) {
    __m512i q[4];
    krw_quads(wb, ldw, R, off, q);
    lrt_transpose(q, t);
}

/* the 16 rows' super-block at wb as unsigned values (Q4_K: 0..15, Q5_K: 0..31): v[8j + u] dword
 * lane lrt_lane(r) = values 32j + 4u .. 32j + 4u + 3 of row r; their scales sc[j] of sub-block j,
 * the mins of sub-blocks 2q, 2q + 1 as an int16 pair mp[q] (against a column's bsum32_pairs), d and
 * dmin as floats */
static inline __attribute__((always_inline)) void krw_unpack(const int type, const uint8_t *wb, size_t ldw, int R,
                                                             __m512i v[64], __m512i sc[8], __m512i mp[4], __m512 *dw,
                                                             __m512 *dmw) {
    __m512i mn[8];
    __m512i h[4];  /* (d, dmin), scales bytes 0-3, 4-7, 8-11 (the same offsets in both types) */
    krw_dwords(wb, ldw, R, 0, h);
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0]));
    *dmw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16)));
    const __m512i m6 = _mm512_set1_epi32(63), m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3);
    for (int k = 0; k < 4; k++) {  /* get_scale_min_k4, 16 rows at once */
        sc[k] = _mm512_and_si512(_mm512_srli_epi32(h[1], 8 * k), m6);
        mn[k] = _mm512_and_si512(_mm512_srli_epi32(h[2], 8 * k), m6);
        sc[k + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(h[3], 8 * k), m4),
                                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h[1], 8 * k + 6), m2), 4));
        mn[k + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(h[3], 8 * k + 4), m4),
                                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h[2], 8 * k + 6), m2), 4));
    }
    for (int q = 0; q < 4; q++) mp[q] = _mm512_or_si512(mn[2 * q], _mm512_slli_epi32(mn[2 * q + 1], 16));
    const size_t qo = type == EL_Q4_K ? offsetof(block_q4_K, qs) : offsetof(block_q5_K, qs);
    const __m512i n4 = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 8; c++) {  /* qs bytes 16c..16c+15: dwords d = 4c + k of quarter d / 8 */
        __m512i t[4];
        krw_dwords(wb, ldw, R, qo + 16 * (size_t)c, t);
        for (int k = 0; k < 4; k++) {
            const int d = 4 * c + k, q = d / 8, u = d % 8;
            v[16 * q + u] = _mm512_and_si512(t[k], n4);  /* low nibbles: sub-block 2q */
            v[16 * q + 8 + u] = _mm512_and_si512(_mm512_srli_epi16(t[k], 4), n4);
        }
    }
    if (type == EL_Q5_K) {  /* bit j of qh[l]: the fifth bit of value 32j + l */
        __m512i hb[8];
        krw_dwords(wb, ldw, R, offsetof(block_q5_K, qh), hb);
        krw_dwords(wb, ldw, R, offsetof(block_q5_K, qh) + 16, hb + 4);
        const __m512i b4 = _mm512_set1_epi8(0x10);
        for (int j = 0; j < 8; j++)
            for (int u = 0; u < 8; u++) {
                const __m512i s = j <= 4 ? _mm512_slli_epi32(hb[u], 4 - j) : _mm512_srli_epi32(hb[u], j - 4);
                v[8 * j + u] = _mm512_ternarylogic_epi32(v[8 * j + u], s, b4, 0xF8);  /* v | (s & b4) */
            }
    }
}

/* the 16 rows' Q2_K super-block at wb, as krw_unpack: v[8j + u] dword lane lrt_lane(r) = values
 * 32j + 4u .. 32j + 4u + 3 of row r (0..3); sc[g] the scale of group g (16 values), mp[k] the
 * int16 pair (min 2k, min 2k + 1) that multiplies the bsums pair k; d and dmin as floats (read
 * from the 16 bytes that end the block, so the last row's block is not read past) */
static inline __attribute__((always_inline)) void krw_unpack_q2(const uint8_t *wb, size_t ldw, int R, __m512i v[64],
                                                                __m512i sc[16], __m512i mp[8], __m512 *dw,
                                                                __m512 *dmw) {
    __m512i t[4];
    krw_dwords(wb, ldw, R, offsetof(block_q2_K, scales), t);  /* t[k]: scales 4k .. 4k + 3 (sc | m << 4) */
    const __m512i m4 = _mm512_set1_epi32(15), mff = _mm512_set1_epi32(0xFF);
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < 4; i++) sc[4 * k + i] = _mm512_and_si512(_mm512_srli_epi32(t[k], 8 * i), m4);
        const __m512i mins = _mm512_and_si512(_mm512_srli_epi32(t[k], 4), _mm512_set1_epi32(0x0F0F0F0F));
        mp[2 * k] = _mm512_or_si512(_mm512_and_si512(mins, mff), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(mins, 8), mff), 16));
        mp[2 * k + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(mins, 16), mff), _mm512_slli_epi32(_mm512_srli_epi32(mins, 24), 16));
    }
    krw_dwords(wb, ldw, R, sizeof(block_q2_K) - 16, t);  /* t[3]: d, dmin */
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(t[3]));
    *dmw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(t[3], 16)));
    const __m512i n2 = _mm512_set1_epi8(3);
    for (int h = 0; h < 2; h++)  /* value l of 32-value chunk 4h + s: bits 2s of qs byte 32h + l */
        for (int c = 0; c < 2; c++) {
            krw_dwords(wb, ldw, R, offsetof(block_q2_K, qs) + 32 * (size_t)h + 16 * (size_t)c, t);
            for (int k = 0; k < 4; k++)
                for (int s = 0; s < 4; s++) v[8 * (4 * h + s) + 4 * c + k] = _mm512_and_si512(_mm512_srli_epi16(t[k], 2 * s), n2);
        }
}

/* acc + the pairwise int16 products of u's lanes with the pair at p (in every lane) */
static inline __m512i dpwssd_bcast(__m512i acc, __m512i u, const uint32_t *p) {
    return _mm512_dpwssd_epi32(acc, u, _mm512_set1_epi32((int)*p));
}

/* the row-lane tiles' prefetch, as lrt_tile's: the R rows after the next R (one contiguous span), a
 * share of it per super-block */
typedef struct {
    const uint8_t *ahead;
    size_t step, done;
} span_pf;
static inline span_pf span_pf_start(const uint8_t *w, size_t span, int nb) {
    return (span_pf){w + 2 * span, lrt_pf_bytes(span, nb), 0};
}
static inline void span_pf_step(span_pf *p) {
    for (const size_t pe = p->done + p->step; p->done < pe; p->done += 64) __builtin_prefetch(p->ahead + p->done, 0, 2);
}

/* a column's bsums summed per 32-value sub-block, as int16 pairs: bp[q] = sub-blocks 2q, 2q + 1 */
static inline void bsum32_pairs(const block_q8_K *y, uint32_t bp[4]) {
    const __m256i bsj = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), _mm256_set1_epi16(1));
    uint32_t bp8[8];
    _mm256_storeu_si256((__m256i *)bp8, _mm256_packs_epi32(bsj, bsj));  /* dwords 0, 1, 4, 5 */
    bp[0] = bp8[0], bp[1] = bp8[1], bp[2] = bp8[4], bp[3] = bp8[5];
}

/* R <= 16 weight rows x 1 <= C <= KRW_C columns (a: lda bytes apart) of Q4_K (span: sub-blocks
 * per float step, 2 or 8) or Q5_K, rows in the int32 lanes (lrt_lane) */
static inline __attribute__((always_inline)) void krw_tile(const int type, const int span, int n, const uint8_t *w,
                                                           size_t ldw, const int R, const uint8_t *a, size_t lda,
                                                           const int C, float *out, size_t ldo) {
    const int nb = n / QK_K;
    const size_t wbs = (size_t)kquant_block_bytes(type);
    __m512 acc[KRW_C], accm[KRW_C];
    for (int c = 0; c < C; c++) acc[c] = accm[c] = _mm512_setzero_ps();
    span_pf pf = span_pf_start(w, (size_t)R * ldw, nb);
    for (int i = 0; i < nb; i++) {
        span_pf_step(&pf);
        __m512i v[64], sc[16], mp[8];  /* mp: int16 pairs of the mins (Q2_K: of its 16 groups) */
        __m512 dw, dmw;
        if (type == EL_Q2_K) {
            krw_unpack_q2(w + (size_t)i * wbs, ldw, R, v, sc, mp, &dw, &dmw);
            for (int c = 0; c < C; c++) {
                const block_q8_K *y = (const block_q8_K *)(a + (size_t)c * lda) + i;
                const uint8_t *aq = (const uint8_t *)y->qs;
                __m512i I = _mm512_setzero_si512(), M = _mm512_setzero_si512();
                for (int j = 0; j < 8; j++) {  /* groups 2j, 2j + 1 */
                    __m512i t0 = _mm512_setzero_si512(), t1 = _mm512_setzero_si512();
                    for (int u = 0; u < 4; u++) {
                        t0 = dpbusd_bcast(t0, v[8 * j + u], aq + 32 * j + 4 * u);
                        t1 = dpbusd_bcast(t1, v[8 * j + u + 4], aq + 32 * j + 16 + 4 * u);
                    }
                    I = _mm512_add_epi32(I, _mm512_mullo_epi32(t0, sc[2 * j]));
                    I = _mm512_add_epi32(I, _mm512_mullo_epi32(t1, sc[2 * j + 1]));
                    M = dpwssd_bcast(M, mp[j], (const uint32_t *)(y->bsums + 2 * j));
                }
                acc[c] = _mm512_fmadd_ps(_mm512_fnmadd_ps(dmw, _mm512_cvtepi32_ps(M), _mm512_mul_ps(_mm512_cvtepi32_ps(I), dw)),
                                         _mm512_set1_ps(y->d), acc[c]);
            }
            continue;
        }
        krw_unpack(type, w + (size_t)i * wbs, ldw, R, v, sc, mp, &dw, &dmw);
        for (int c = 0; c < C; c++) {
            const block_q8_K *y = (const block_q8_K *)(a + (size_t)c * lda) + i;
            const uint8_t *aq = (const uint8_t *)y->qs;
            uint32_t bp[4];
            bsum32_pairs(y, bp);
            const __m512 da = _mm512_set1_ps(y->d);
            const __m512 dd = _mm512_mul_ps(dw, da), dm = _mm512_mul_ps(dmw, da);
            __m512i I = _mm512_setzero_si512(), M = _mm512_setzero_si512();
            for (int j = 0; j < 8; j++) {
                __m512i t0 = _mm512_setzero_si512(), t1 = _mm512_setzero_si512();
                for (int u = 0; u < 8; u += 2) {
                    t0 = dpbusd_bcast(t0, v[8 * j + u], aq + 32 * j + 4 * u);
                    t1 = dpbusd_bcast(t1, v[8 * j + u + 1], aq + 32 * j + 4 * u + 4);
                }
                I = _mm512_add_epi32(I, _mm512_mullo_epi32(_mm512_add_epi32(t0, t1), sc[j]));
                if (j % 2) M = dpwssd_bcast(M, mp[j / 2], &bp[j / 2]);
                if (type == EL_Q4_K && (j + 1) % span == 0) {
                    acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), dd, acc[c]);
                    accm[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(M), dm, accm[c]);
                    I = M = _mm512_setzero_si512();
                }
            }
            if (type == EL_Q5_K)
                acc[c] = _mm512_fmadd_ps(_mm512_fnmadd_ps(dmw, _mm512_cvtepi32_ps(M), _mm512_mul_ps(_mm512_cvtepi32_ps(I), dw)),
                                         da, acc[c]);
        }
    }
    for (int c = 0; c < C; c++) acc[c] = type == EL_Q4_K ? _mm512_sub_ps(acc[c], accm[c]) : acc[c];
    lrt_store(acc, accm, 0, C, R, out, ldo);
}

/* Q5_K's small-batch order (ggml's vec_dot, el_small_rows) for one column, a decode step's, 16 rows
 * in the int32 lanes (lrt_lane): per super-block vec_dot's 8 integer lanes of every row, lane k =
 * sum over the sub-blocks j of scale_j * (values 32j + 4k .. 32j + 4k + 3 times the column's): per
 * (j, k) a vpmaddubsw of the rows' 4 values with the column's 4 quants, broadcast, then vpdpwssd
 * with (scale_j, scale_j); the mins from the column's bsums as in krw_tile; then the generic twin's
 * float steps (lanes8_fma, the mins' chain, el_hsum8 and + summs) lane by lane */
static inline __attribute__((always_inline)) void krw_q5_K_small_one(int n, const uint8_t *w, size_t ldw, const int R,
                                                                     const uint8_t *a, float *out) {
    const int nb = n / QK_K;
    __m512 acc[8], summs = _mm512_setzero_ps();
    for (int k = 0; k < 8; k++) acc[k] = _mm512_setzero_ps();
    span_pf pf = span_pf_start(w, (size_t)R * ldw, nb);
    for (int i = 0; i < nb; i++) {
        span_pf_step(&pf);
        __m512i v[64], sc[8], mp[4];
        __m512 dw, dmw;
        krw_unpack(EL_Q5_K, w + (size_t)i * sizeof(block_q5_K), ldw, R, v, sc, mp, &dw, &dmw);
        const block_q8_K *y = (const block_q8_K *)a + i;
        const uint8_t *aq = (const uint8_t *)y->qs;
        __m512i L[8];
        for (int k = 0; k < 8; k++) L[k] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            const __m512i sp = _mm512_or_si512(sc[j], _mm512_slli_epi32(sc[j], 16));  /* (scale, scale) */
            for (int k = 0; k < 8; k++)
                L[k] = _mm512_dpwssd_epi32(L[k], _mm512_maddubs_epi16(v[8 * j + k], bcast32(aq + 32 * j + 4 * k)), sp);
        }
        __m512i M = _mm512_setzero_si512();  /* sum of min_j * (the column's sum over sub-block j) */
        uint32_t bp[4];
        bsum32_pairs(y, bp);
        for (int q = 0; q < 4; q++) M = dpwssd_bcast(M, mp[q], &bp[q]);
        const __m512 dd = _mm512_mul_ps(_mm512_set1_ps(y->d), dw);
        for (int k = 0; k < 8; k++) acc[k] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(L[k]), acc[k]);
        summs = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(-y->d), dmw), _mm512_cvtepi32_ps(M), summs);
    }
    const __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6])),
                                   _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7])));
    const __m512 total = _mm512_add_ps(t, summs);
    lrt_store(&total, NULL, 0, 1, R, out, 0);
}

/* the tiles of 16 rows x up to KRW_C columns, the column groups of a row tile after one another */
typedef void (*krw_fn)(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a, size_t lda, int C, float *out,
                       size_t ldo);
static inline __attribute__((always_inline)) void krw_gemm(krw_fn rt, int n, const uint8_t *W, size_t ldw, int nr,
                                                           const uint8_t *A, size_t lda, int nc, float *out,
                                                           size_t ldo) {
    for (int r = 0; r < nr; r += 16)
        for (int c = 0; c < nc; c += KRW_C)
            rt(n, W + r * ldw, ldw, EL_MIN(16, nr - r), A + c * lda, lda, EL_MIN(KRW_C, nc - c), out + c * ldo + r, ldo);
}

#define KRW_SHAPES(TYPE, SPAN)                                                                      \
    switch (C) {                                                                                    \
    case 8: krw_tile(TYPE, SPAN, n, w, ldw, R, a, lda, 8, out, ldo); break;                         \
    case 7: krw_tile(TYPE, SPAN, n, w, ldw, R, a, lda, 7, out, ldo); break;                         \
    case 6: krw_tile(TYPE, SPAN, n, w, ldw, R, a, lda, 6, out, ldo); break;                         \
    case 5: krw_tile(TYPE, SPAN, n, w, ldw, R, a, lda, 5, out, ldo); break;                         \
    case 4: krw_tile(TYPE, SPAN, n, w, ldw, R, a, lda, 4, out, ldo); break;                         \
    case 3: krw_tile(TYPE, SPAN, n, w, ldw, R, a, lda, 3, out, ldo); break;                         \
    case 2: krw_tile(TYPE, SPAN, n, w, ldw, R, a, lda, 2, out, ldo); break;                         \
    default: krw_tile(TYPE, SPAN, n, w, ldw, R, a, lda, 1, out, ldo);                               \
    }
static void q4_K_rw_avx512(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a, size_t lda, int C,
                           float *out, size_t ldo) {
    KRW_SHAPES(EL_Q4_K, 2)
}
static void q4_K_small_rw_avx512(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a, size_t lda, int C,
                                 float *out, size_t ldo) {
    KRW_SHAPES(EL_Q4_K, 8)
}
static void q5_K_rw_avx512(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a, size_t lda, int C,
                           float *out, size_t ldo) {
    KRW_SHAPES(EL_Q5_K, 1)
}
static void q2_K_rw_avx512(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a, size_t lda, int C,
                           float *out, size_t ldo) {
    KRW_SHAPES(EL_Q2_K, 1)
}
#undef KRW_SHAPES

/* stack for a column-lane group: 73 * 64 bytes per super-block */
#define KCL_PREP_BYTES 262144
/* fewer columns go to the type's other tiles: Q4_K / Q5_K's row-lane tiles (krw_tile) measured
 * faster at 9-15 columns and as fast at 16-17 (K 2048, single thread; from 24 on Q5_K is ~10%
 * faster here); the 2 x 4 tiles of the other types slower from 10 (Q6_K at 8 / 10 / 12 / 15
 * columns: tiles 143 / 124 / 144 / 139 GFLOP/s, column lanes 110 / 131 / 152 / 184; Q2_K, Q3_K and
 * IQ4_XS alike) */
#define KCL_MIN_RW 16
#define KCL_MIN_TILES 10

typedef void (*kcltile_fn)(int n, const uint8_t *w, size_t ldw, int R, const kclprep *pp, int C, float *out, size_t ldo);
typedef void (*gemm_fn)(int n, const void *w, size_t ldw, int nr, const void *a, size_t lda, int nc, float *out,
                        size_t ldo);

/* K-quant gemm: column-lane groups of up to 16 while cmin columns are left and the row fits the
 * stack buffer, the rest by the type's other tiles (rest) */
static inline __attribute__((always_inline)) void kquant_gemm(kcltile_fn cl, gemm_fn rest, const int cmin, int n, const void *w,
                                                              size_t ldw, int nr, const void *a, size_t lda, int nc,
                                                              float *out, size_t ldo) {
    const uint8_t *Wt = w, *A = a;
    const int nb = n / QK_K;
    int c = 0;
    if (nc >= cmin && kcl_prep_vecs(nb) * 64 <= KCL_PREP_BYTES) {
        __m512i buf[kcl_prep_vecs(nb)];
        while (nc - c >= cmin) {
            const int C = EL_MIN(16, nc - c);
            kclprep kp;
            kcl_prepare(A + c * lda, lda, C, nb, buf, &kp);
            int r = 0;
            for (; r + CL_RMAX <= nr; r += CL_RMAX) cl(n, Wt + r * ldw, ldw, CL_RMAX, &kp, C, out + c * ldo + r, ldo);
            for (; r < nr; r++) cl(n, Wt + r * ldw, ldw, 1, &kp, C, out + c * ldo + r, ldo);
            c += C;
        }
    }
    if (c < nc) rest(n, Wt, ldw, nr, A + c * lda, lda, nc - c, out + c * ldo, ldo);
}

/* the column-lane tile of TYPE (tname_cl_avx512), and its batch-order gemm: column-lane groups
 * from CMIN columns, then REST */
#define KCL_GEMM(tname, TYPE, REST, CMIN)                                                              \
    static void tname##_cl_avx512(int n, const uint8_t *w, size_t ldw, int R, const kclprep *pp,   \
                                  int C, float *out, size_t ldo) {                                 \
        if (R == CL_RMAX) kcl_tile(TYPE, n, w, ldw, CL_RMAX, pp, C, out, ldo);                     \
        else kcl_tile(TYPE, n, w, ldw, 1, pp, C, out, ldo);                                        \
    }                                                                                              \
    static void tname##_cl_gemm_avx512(int n, const void *w, size_t ldw, int nr, const void *a,    \
                                       size_t lda, int nc, float *out, size_t ldo) {               \
        kquant_gemm(tname##_cl_avx512, REST, CMIN, n, w, ldw, nr, a, lda, nc, out, ldo);           \
    }

/* ------------------------------------------------------------------------------------------ */
/* tiling: gemm_tiles in x86_common.h */

#define KQ_TILE(X, RR, CC) kquant_tile(EL_UNPAREN X, n, w, ldw, RR, a, lda, CC, out, ldo)
#define KERNELS(tname, TYPE, SMALL, RT, CT, RT1)                                                   \
    static void tname##_tile_avx512(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a,  \
                                    size_t lda, int C, float *out, size_t ldo) {                   \
        TILE_SHAPES(KQ_TILE, (TYPE, SMALL), RT, CT, RT1, R, C);                                    \
    }                                                                                              \
    static void tname##_gemm_avx512(int n, const void *w, size_t ldw, int nr, const void *a,       \
                                    size_t lda, int nc, float *out, size_t ldo) {                  \
        gemm_tiles(tname##_tile_avx512, RT, CT, RT1, n, w, ldw, nr, a, lda, nc, out, ldo);         \
    }                                                                                              \
    static void tname##_vec_dot_avx512(int n, float *s, const void *x, const void *y) {            \
        kquant_tile(TYPE, SMALL, n, x, 0, 1, y, 0, 1, s, 0);                                       \
    }
/* the batch-order kernels of Q4_K, Q5_K: column-lane groups first, then row-lane tiles */
#define KCL_KERNELS(tname, TYPE)                                                                   \
    static void tname##_rw_gemm_avx512(int n, const void *w, size_t ldw, int nr, const void *a,    \
                                       size_t lda, int nc, float *out, size_t ldo) {               \
        krw_gemm(tname##_rw_avx512, n, w, ldw, nr, a, lda, nc, out, ldo);                          \
    }                                                                                              \
    KCL_GEMM(tname, TYPE, tname##_rw_gemm_avx512, KCL_MIN_RW)                                      \
    static void tname##_gemm_avx512(int n, const void *w, size_t ldw, int nr, const void *a,       \
                                    size_t lda, int nc, float *out, size_t ldo) {                  \
        tname##_cl_gemm_avx512(n, w, ldw, nr, a, lda, nc, out, ldo);                               \
    }                                                                                              \
    static void tname##_vec_dot_avx512(int n, float *s, const void *x, const void *y) {            \
        kquant_tile(TYPE, 0, n, x, 0, 1, y, 0, 1, s, 0);                                           \
    }

KERNELS(q2_K, EL_Q2_K, 0, 2, 4, 2)
/* Q2_K below the column lanes: one column (a decode step) and 8 or 9 by the row-lane tiles, 2-7 by
 * the 2 x 4 tiles (K 2048, single thread, GFLOP/s at 1 / 2 / 4 / 8 columns: 2 x 4 tiles 61 / 95 /
 * 140 / 141, row lanes 75 / 86 / 125 / 161; matvec from DRAM 9.9 -> 12.1 GB/s) */
static void q2_K_rest_gemm_avx512(int n, const void *w, size_t ldw, int nr, const void *a, size_t lda, int nc,
                                  float *out, size_t ldo) {
    if (nc == 1 || nc >= 8) krw_gemm(q2_K_rw_avx512, n, w, ldw, nr, a, lda, nc, out, ldo);
    else q2_K_gemm_avx512(n, w, ldw, nr, a, lda, nc, out, ldo);
}
KCL_GEMM(q2_K, EL_Q2_K, q2_K_rest_gemm_avx512, KCL_MIN_TILES)
KERNELS(q3_K, EL_Q3_K, 0, 2, 4, 2)
KCL_GEMM(q3_K, EL_Q3_K, q3_K_gemm_avx512, KCL_MIN_TILES)
KERNELS(q3_K_small, EL_Q3_K, 1, 2, 4, 2)
KCL_KERNELS(q4_K, EL_Q4_K)
KCL_KERNELS(q5_K, EL_Q5_K)
KERNELS(q5_K_small, EL_Q5_K, 1, 2, 4, 2)
/* Q5_K's small-batch order: one column (a decode step) by the row-lane tile, more by the 2 x 4 tiles */
static void q5_K_small_rows_gemm_avx512(int n, const void *w, size_t ldw, int nr, const void *a, size_t lda, int nc,
                                        float *out, size_t ldo) {
    if (nc != 1) {
        q5_K_small_gemm_avx512(n, w, ldw, nr, a, lda, nc, out, ldo);
        return;
    }
    for (int r = 0; r < nr; r += 16) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * ldw;
        if (nr - r >= 16) krw_q5_K_small_one(n, wr, ldw, 16, a, out + r);
        else krw_q5_K_small_one(n, wr, ldw, nr - r, a, out + r);
    }
}
/* Q4_K's small-batch order: the row-lane tiles at every column count (it takes m % 4 of a batch) */
static void q4_K_small_gemm_avx512(int n, const void *w, size_t ldw, int nr, const void *a, size_t lda, int nc,
                                   float *out, size_t ldo) {
    krw_gemm(q4_K_small_rw_avx512, n, w, ldw, nr, a, lda, nc, out, ldo);
}
static void q4_K_small_vec_dot_avx512(int n, float *s, const void *x, const void *y) {
    kquant_tile(EL_Q4_K, 1, n, x, 0, 1, y, 0, 1, s, 0);
}
KERNELS(q6_K, EL_Q6_K, 0, 2, 4, 2)
KCL_GEMM(q6_K, EL_Q6_K, q6_K_gemm_avx512, KCL_MIN_TILES)
KERNELS(q6_K_small, EL_Q6_K, 1, 2, 4, 2)
#undef KERNELS
#undef KCL_KERNELS
#undef KQ_TILE

#include "x86_avx512_iq4.h"
/* float weights (F32, F16, BF16): x86_float.h, with the 32 registers AVX-512 gives 256-bit code:
 * tiles of 4 rows x 3 columns; 2 rows against a single column (a decode step streaming F16 rows
 * from a mapped file: 2 rows at a time ran ~10% faster than 4 on a Zen 4 VM; see the commit) */
#define FT_R 4
#define FT_C 3
#define FT_R1 2
#include "x86_float.h"

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

/* Lane classes i and i + 8 (dims d = i mod 16, in order; the sum the tree takes first) of N <= 4
 * queries, s[j] = a_{i+8} + a_i: each key vector converted once for the N queries */
static inline __attribute__((always_inline)) void qk_pair_avx512(const int N, int hk, int i, const float *q, int ldq,
                                                                const el_half *kt, __m512 *s) {
    __m512 a[4], b[4];
    for (int j = 0; j < N; j++) a[j] = b[j] = _mm512_setzero_ps();
    for (int d = i; d < hk; d += 16) {
        const __m512 k = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kt + d * 16)));
        for (int j = 0; j < N; j++) a[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[(size_t)j * ldq + d]), k, a[j]);  /* exact product */
        if (d + 8 < hk) {
            const __m512 k8 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kt + (d + 8) * 16)));
            for (int j = 0; j < N; j++) b[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[(size_t)j * ldq + d + 8]), k8, b[j]);
        }
    }
    for (int j = 0; j < N; j++) s[j] = _mm512_add_ps(b[j], a[j]);
}

/* Both pairs of branch i at once, lo = (i, i + 8) and hi = (i + 4, i + 12), for N <= 2 queries:
 * 4N fma chains in flight (a pair alone would leave the fmas waiting on their latency) */
static inline __attribute__((always_inline)) void qk_quad_avx512(const int N, int hk, int i, const float *q, int ldq,
                                                                const el_half *kt, __m512 *lo, __m512 *hi) {
    __m512 a[4][2];  /* [class i, i + 8, i + 4, i + 12][query] */
    for (int c = 0; c < 4; c++)
        for (int j = 0; j < N; j++) a[c][j] = _mm512_setzero_ps();
    static const int off[4] = {0, 8, 4, 12};
    for (int d0 = 0; d0 < hk; d0 += 16)
        for (int c = 0; c < 4; c++) {
            const int d = d0 + i + off[c];
            if (d >= hk) continue;
            const __m512 k = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kt + d * 16)));
            for (int j = 0; j < N; j++) a[c][j] = _mm512_fmadd_ps(_mm512_set1_ps(q[(size_t)j * ldq + d]), k, a[c][j]);
        }
    for (int j = 0; j < N; j++) {
        lo[j] = _mm512_add_ps(a[1][j], a[0][j]);
        hi[j] = _mm512_add_ps(a[3][j], a[2][j]);
    }
}

/* N <= 4 queries: per query, lane class c's accumulator (dims c, c + 16, ...) and el_sum16's tree
 * over c, taken a branch at a time: t_i = (a_{i+12} + a_{i+4}) + (a_{i+8} + a_i), out = (t_0 +
 * t_2) + (t_1 + t_3); the keys converted once for all N */
static inline __attribute__((always_inline)) void qk_tile_n_avx512(const int N, int hk, const float *q, int ldq,
                                                                  const el_half *kt, float *out) {
    __m512 h[2][4];  /* t_0 + t_2, t_1 + t_3 */
    for (int i = 0; i < 4; i++) {
        __m512 lo[4], hi[4];
        if (N <= 2) {
            qk_quad_avx512(N, hk, i, q, ldq, kt, lo, hi);
        } else {
            qk_pair_avx512(N, hk, i, q, ldq, kt, lo);
            qk_pair_avx512(N, hk, i + 4, q, ldq, kt, hi);
        }
        for (int j = 0; j < N; j++) {
            const __m512 t = _mm512_add_ps(hi[j], lo[j]);
            h[i & 1][j] = i < 2 ? t : _mm512_add_ps(h[i & 1][j], t);
        }
    }
    for (int j = 0; j < N; j++) _mm512_storeu_ps(out + j * 16, _mm512_add_ps(h[0][j], h[1][j]));
}

/* queries in ceil(nq / 4) runs of as even a size as can be (9 = 3 + 3 + 3, not 4 + 4 + 1) */
static void qk_tile_avx512(int hk, const float *q, int nq, int ldq, const el_half *kt, float *out) {
    const int runs = (nq + 3) / 4;
    for (int k = 0, j = 0; k < runs; k++) {
        const int n = (nq - j) / (runs - k);  /* the rest shared evenly (smaller runs first) */
        const float *qj = q + (size_t)j * ldq;
        switch (n) {  /* (the query count a compile-time constant) */
        case 4: qk_tile_n_avx512(4, hk, qj, ldq, kt, out + j * 16); break;
        case 3: qk_tile_n_avx512(3, hk, qj, ldq, kt, out + j * 16); break;
        case 2: qk_tile_n_avx512(2, hk, qj, ldq, kt, out + j * 16); break;
        default: qk_tile_n_avx512(1, hk, qj, ldq, kt, out + j * 16); break;
        }
        j += n;
    }
}

/* per lane class i < 16, the four chunk accumulators stay in registers; then el_sum16 across i */
static void qk_one_query_avx512(int hk, const float *q, const el_half *kt, float *out) {
    const int h64 = hk / 64 * 64;
    __m512 t[16];
    for (int i = 0; i < 16; i++) {
        __m512 a[4];
        for (int j = 0; j < 4; j++) a[j] = _mm512_setzero_ps();
        for (int d0 = 0; d0 < h64; d0 += 64)
            for (int j = 0; j < 4; j++) {
                const int d = d0 + 16 * j + i;
                a[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kt + d * 16))), a[j]);
            }
        t[i] = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
    }
    for (int i = 0; i < 8; i++) t[i] = _mm512_add_ps(t[i + 8], t[i]);
    for (int i = 0; i < 4; i++) t[i] = _mm512_add_ps(t[i + 4], t[i]);
    const __m512 r = _mm512_add_ps(_mm512_add_ps(t[0], t[2]), _mm512_add_ps(t[1], t[3]));
    if (h64 == hk) {
        _mm512_storeu_ps(out, r);
        return;
    }
    float s[16];
    _mm512_storeu_ps(s, r);
    for (int l = 0; l < 16; l++) {
        double v = s[l];
        for (int d = h64; d < hk; d++) v += (double)(q[d] * _cvtsh_ss(kt[(size_t)d * 16 + l]));
        out[l] = (float)v;
    }
}

/* keys of tile row d: the 16 keys of one dimension, one register */
static inline __m512 key16(const el_half *kt, int d) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kt + (size_t)d * 16)));
}

/* The next key tile (pf, or NULL) into L2 a slice at a time, one per pass of a qk_tile_one loop:
 * keys of a tile are read out of order (by lane class), which the hardware prefetchers follow too
 * late, and a whole tile's prefetches at once wait on the L1's miss buffers, stalling the tile's
 * own loads behind them (scripts/bench_attention_kernels.c, hk = 256, 4 queries, keys from DRAM:
 * 1080-1140 ns a tile with the tile two ahead prefetched at once, 600 ns spread over the loop). */
static inline __attribute__((always_inline)) void prefetch_slice(const void *pf, size_t slice, int i) {
    if (pf) el_prefetch_l2((const char *)pf + slice * (size_t)i, slice);
}

/* qk_tile_one at hk = 64 for nq <= 4 queries, the keys of each dimension converted once for all of
 * them: each chunk accumulator A_c of class m is one exact product, so A0 + A2 is one fma onto
 * A2 = fma(q, k, +0) (the twin's 0 + p, sign of zero included), and L_m = (A0 + A2) + (A1 + A3);
 * el_sum16's tree taken as the classes come, i = 0, 2, 1, 3 (u_i = (L_i+12 + L_i+4) + (L_i+8 + L_i)),
 * so that every partial sum stays in a register. pf: the next tile, prefetched a quarter a pass */
static inline __attribute__((always_inline)) void qk_one_64_avx512(const float *q, int nq, int ldq, const el_half *kt,
                                                                   float *out, const el_half *pf) {
    const __m512 z = _mm512_setzero_ps();
    __m512 p0[4], p1[4];  /* per query: u0 + u2, u1 + u3 */
#pragma GCC unroll 1
    for (int g = 0; g < 4; g++) {  /* (not unrolled: the key loads stay next to their use) */
        prefetch_slice(pf, 64 * 32 / 4, g);
        const int i = (g & 1) * 2 + (g >> 1);  /* 0, 2, 1, 3 */
        __m512 t0[4], t1[4];                    /* per query: t_i, t_i+4 */
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {           /* classes i, i + 8, i + 4, i + 12 */
            const int m = i + (h & 1) * 8 + (h >> 1) * 4;
            const __m512 k0 = key16(kt, m), k1 = key16(kt, m + 16), k2 = key16(kt, m + 32), k3 = key16(kt, m + 48);
            for (int r = 0; r < nq; r++) {
                const float *qr = q + (size_t)r * ldq;
                const __m512 a02 = _mm512_fmadd_ps(_mm512_set1_ps(qr[m]), k0, _mm512_fmadd_ps(_mm512_set1_ps(qr[m + 32]), k2, z));
                const __m512 a13 = _mm512_fmadd_ps(_mm512_set1_ps(qr[m + 16]), k1, _mm512_fmadd_ps(_mm512_set1_ps(qr[m + 48]), k3, z));
                const __m512 L = _mm512_add_ps(a02, a13);
                if (h == 0) t0[r] = L;
                else if (h == 1) t0[r] = _mm512_add_ps(L, t0[r]);  /* L_i+8 + L_i */
                else if (h == 2) t1[r] = L;
                else t1[r] = _mm512_add_ps(L, t1[r]);              /* L_i+12 + L_i+4 */
            }
        }
        for (int r = 0; r < nq; r++) {
            const __m512 u = _mm512_add_ps(t1[r], t0[r]);  /* t_i+4 + t_i */
            if (g == 0) p0[r] = u;
            else if (g == 1) p0[r] = _mm512_add_ps(p0[r], u);
            else if (g == 2) p1[r] = u;
            else p1[r] = _mm512_add_ps(p1[r], u);
        }
    }
    for (int r = 0; r < nq; r++) _mm512_storeu_ps(out + r * 16, _mm512_add_ps(p0[r], p1[r]));
}

/* qk_tile_one for hk a multiple of 64, nq <= 4 queries: per class m, the four in-order fma chains
 * A_c of every query (the keys of each dimension converted once for all of them), L_m = (A0 + A2) +
 * (A1 + A3) kept in Lm; then el_sum16's tree over the classes, vectorized across the keys. pf: the
 * next tile, prefetched a sixteenth a class */
static inline __attribute__((always_inline)) void qk_one_chain_avx512(int hk, const float *q, int nq, int ldq,
                                                                      const el_half *kt, float *out, const el_half *pf) {
    __m512 Lm[4][16];
    for (int m = 0; m < 16; m++) {
        prefetch_slice(pf, (size_t)hk * 2, m);
        __m512 a[4][4];  /* [query][c] */
        for (int r = 0; r < nq; r++)
            for (int c = 0; c < 4; c++) a[r][c] = _mm512_setzero_ps();
        for (int d0 = 0; d0 < hk; d0 += 64)
            for (int c = 0; c < 4; c++) {
                const int d = d0 + 16 * c + m;
                const __m512 k = key16(kt, d);
                for (int r = 0; r < nq; r++) a[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(q[(size_t)r * ldq + d]), k, a[r][c]);
            }
        for (int r = 0; r < nq; r++) Lm[r][m] = _mm512_add_ps(_mm512_add_ps(a[r][0], a[r][2]), _mm512_add_ps(a[r][1], a[r][3]));
    }
    for (int r = 0; r < nq; r++) {  /* t_i = L[i+8] + L[i]; u_i = t[i+4] + t[i]; (u0 + u2) + (u1 + u3) */
        __m512 t[8];
        for (int i = 0; i < 8; i++) t[i] = _mm512_add_ps(Lm[r][i + 8], Lm[r][i]);
        for (int i = 0; i < 4; i++) t[i] = _mm512_add_ps(t[i + 4], t[i]);
        _mm512_storeu_ps(out + r * 16, _mm512_add_ps(_mm512_add_ps(t[0], t[2]), _mm512_add_ps(t[1], t[3])));
    }
}

static void qk_tile_one_avx512(int hk, const float *q, int nq, int ldq, const el_half *kt, float *out,
                               const el_half *next) {
    if (hk == 64) {
        for (int j = 0; j < nq; j += 4) {  /* (the next tile prefetched by the first group of queries) */
            const float *qj = q + (size_t)j * ldq;
            const el_half *pf = j ? NULL : next;
            switch (EL_MIN(4, nq - j)) {  /* (the query count a compile-time constant: the loops unrolled) */
            case 1: qk_one_64_avx512(qj, 1, ldq, kt, out + j * 16, pf); break;
            case 2: qk_one_64_avx512(qj, 2, ldq, kt, out + j * 16, pf); break;
            case 3: qk_one_64_avx512(qj, 3, ldq, kt, out + j * 16, pf); break;
            default: qk_one_64_avx512(qj, 4, ldq, kt, out + j * 16, pf); break;
            }
        }
        return;
    }
    if (hk % 64 == 0) {
        for (int j = 0; j < nq; j += 4) {
            const float *qj = q + (size_t)j * ldq;
            const el_half *pf = j ? NULL : next;
            switch (EL_MIN(4, nq - j)) {
            case 1: qk_one_chain_avx512(hk, qj, 1, ldq, kt, out + j * 16, pf); break;
            case 2: qk_one_chain_avx512(hk, qj, 2, ldq, kt, out + j * 16, pf); break;
            case 3: qk_one_chain_avx512(hk, qj, 3, ldq, kt, out + j * 16, pf); break;
            default: qk_one_chain_avx512(hk, qj, 4, ldq, kt, out + j * 16, pf); break;
            }
        }
        return;
    }
    el_prefetch_l2(next, (size_t)hk * 32);
    for (int j = 0; j < nq; j++) qk_one_query_avx512(hk, q + (size_t)j * ldq, kt, out + j * 16);
}

/* Scores of N <= 4 queries against a quantized key tile (qk_q8_0 / qk_q4_0; layout in el_internal.h):
 * per 32-dim block, 8 vectors of 4 quants of each of the 16 keys as unsigned bytes (q8_0: k + 128,
 * q4_0: the nibble), each dotted by vpdpbusd with 4 of a query's quants broadcast, from -offset *
 * qsum (offset 128 or 8), so the int32 lanes are the blocks' exact dot products; then one fma per
 * key of dk * dq. The key vectors are made once for the N queries. pf: the next tile, prefetched a
 * block's share (16 rows of a block) a block */
static inline __attribute__((always_inline)) void qk_q_avx512(const int q4, const int N, int nb, const uint8_t *q,
                                                              size_t ldq, const int32_t *qsum, const uint8_t *kt,
                                                              float *out, const uint8_t *pf) {
    const uint8_t *qs = kt + (size_t)nb * 32;
    __m512 acc[4];
    for (int j = 0; j < N; j++) acc[j] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        prefetch_slice(pf, 16 * (q4 ? sizeof(block_q4_0) : sizeof(block_q8_0)), b);
        const __m512 dk = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kt + (size_t)b * 32)));
        __m512i k[8];
        if (q4) {
            const __m512i m4 = _mm512_set1_epi8(0x0F);
            for (int g = 0; g < 4; g++) {
                const __m512i v = _mm512_loadu_si512(qs + ((size_t)b * 4 + g) * 64);
                k[g] = _mm512_and_si512(v, m4);                          /* values 4g .. 4g + 3 */
                k[g + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);  /* 16 + 4g .. */
            }
        } else {
            for (int g = 0; g < 8; g++) k[g] = _mm512_xor_si512(_mm512_loadu_si512(qs + ((size_t)b * 8 + g) * 64), _mm512_set1_epi8((char)0x80));
        }
        for (int j = 0; j < N; j++) {
            const block_q8_0 *qb = (const block_q8_0 *)(q + (size_t)j * ldq) + b;
            __m512i s0 = _mm512_set1_epi32(-(q4 ? 8 : 128) * qsum[j * nb + b]), s1 = _mm512_setzero_si512();
            for (int g = 0; g < 8; g += 2) {  /* two chains */
                s0 = _mm512_dpbusd_epi32(s0, k[g], _mm512_set1_epi32((int)load_u32(qb->qs + 4 * g)));
                s1 = _mm512_dpbusd_epi32(s1, k[g + 1], _mm512_set1_epi32((int)load_u32(qb->qs + 4 * g + 4)));
            }
            const __m512 dd = _mm512_mul_ps(dk, _mm512_set1_ps(_cvtsh_ss(qb->d)));
            acc[j] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), acc[j]);
        }
    }
    for (int j = 0; j < N; j++) _mm512_storeu_ps(out + j * 16, acc[j]);
}

static inline __attribute__((always_inline)) void qk_q_all_avx512(const int q4, int hk, const uint8_t *q, size_t ldq,
                                                                  const int32_t *qsum, int nq, const uint8_t *kt,
                                                                  float *out, const uint8_t *next) {
    const int nb = hk / 32;
    for (int j = 0; j < nq; j += 4) {  /* (the next tile prefetched by the first group of queries) */
        const uint8_t *qj = q + (size_t)j * ldq, *pf = j ? NULL : next;
        const int32_t *sj = qsum + (size_t)j * nb;
        switch (EL_MIN(4, nq - j)) {  /* (the query count a compile-time constant: accumulators in registers) */
        case 1: qk_q_avx512(q4, 1, nb, qj, ldq, sj, kt, out + j * 16, pf); break;
        case 2: qk_q_avx512(q4, 2, nb, qj, ldq, sj, kt, out + j * 16, pf); break;
        case 3: qk_q_avx512(q4, 3, nb, qj, ldq, sj, kt, out + j * 16, pf); break;
        default: qk_q_avx512(q4, 4, nb, qj, ldq, sj, kt, out + j * 16, pf); break;
        }
    }
}
static void qk_q8_0_avx512(int hk, const uint8_t *q, size_t ldq, const int32_t *qsum, int nq, const uint8_t *kt,
                           float *out, const uint8_t *next) {
    qk_q_all_avx512(0, hk, q, ldq, qsum, nq, kt, out, next);
}
static void qk_q4_0_avx512(int hk, const uint8_t *q, size_t ldq, const int32_t *qsum, int nq, const uint8_t *kt,
                           float *out, const uint8_t *next) {
    qk_q_all_avx512(1, hk, q, ldq, qsum, nq, kt, out, next);
}

/* whether any of 16 weights is nonzero (NaN counts, -0 does not, as the twin's != 0) */
static inline int any16_avx512(const float *w) {
    return _mm512_cmp_ps_mask(_mm512_loadu_ps(w), _mm512_setzero_ps(), _CMP_NEQ_UQ) != 0;
}

/* The tiles pv_tiles' caller sums next, prefetched into L2 a few lines per tile summed: a tile's
 * dims are read in runs of a few dims, a lane set's tiles 4 apart, which the hardware's streams
 * do not follow (bench_attention_kernels: f16 at hd 256 from DRAM ~750 -> ~690 ns a tile), and a
 * whole chunk prefetched at once stalls (slower still). Cursor: tile j of n, byte o of its bytes. */
typedef struct {
    const el_half *const *t;
    int n, j;
    size_t o, bytes;
    int per;  /* lines a step: the next tiles' lines over the steps of this call */
} pv_prefetch;
static inline __attribute__((always_inline)) void pv_prefetch_step(pv_prefetch *p) {
    for (int i = 0; i < p->per && p->j < p->n; i++) {
        if (p->t[p->j]) __builtin_prefetch((const char *)p->t[p->j] + p->o, 0, 2);
        p->o += 64;
        if (p->o >= p->bytes) p->o = 0, p->j++;
    }
}

/* dims d .. d + nu - 1 of pv_list_avx512: the nr x nu accumulators (one register per row and dim:
 * the 16 slot lanes) stay in registers over the n tiles of the list; each value vector is converted
 * once for the nr rows (fma: the products are exact). masked: row r's fmas of tile k masked off
 * unless bit r of need[k] is set (else every row takes every tile). vd: the list's tiles from dim
 * d on. wl: the list's weights, [k][nr][16]. pf: lines of the next tiles to prefetch */
static inline __attribute__((always_inline)) void pv_dims_avx512(const int masked, int nu, const el_half *const *vd,
                                                                 const float *wl, const uint8_t *need, int n, int nr,
                                                                 float *acc, size_t lda, pv_prefetch *pf) {
    __m512 a[4][8];
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < nu; i++) a[r][i] = _mm512_loadu_ps(acc + r * lda + i * 16);
    for (int k = 0; k < n; k++, wl += nr * 16) {
        pv_prefetch_step(pf);
        const el_half *v = vd[k];
        __m512 wr[4];
        __mmask16 m[4];
        for (int r = 0; r < nr; r++) {
            wr[r] = _mm512_loadu_ps(wl + r * 16);
            if (masked) m[r] = (__mmask16)-(need[k] >> r & 1);
        }
        for (int i = 0; i < nu; i++) {
            const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 16 * i)));
            for (int r = 0; r < nr; r++)
                a[r][i] = masked ? _mm512_mask3_fmadd_ps(wr[r], x, a[r][i], m[r]) : _mm512_fmadd_ps(wr[r], x, a[r][i]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < nu; i++) _mm512_storeu_ps(acc + r * lda + i * 16, a[r][i]);
}

/* nr <= 4 rows over the tiles of list ts (n <= 64 tiles, in order; need[k]: the rows that take
 * tile k), into the lanes acc: 8 dims at a time (6 for 4 rows: at most 24 accumulators), the rest
 * one by one; the fmas masked only when some row skips a tile of the list */
static inline __attribute__((always_inline)) void pv_list_avx512(int nd, const el_half *const *vt, int nr, const float *w,
                                                                 int ldw, float *acc, int lda, const int *ts,
                                                                 const uint8_t *need, int n, pv_prefetch *pf) {
    const el_half *vd[64];  /* the tiles from the current dims on (advanced a pass at a time: the value
                               loads take immediate offsets; per-dim offsets kept live spilled to the stack) */
    float wl[64 * 4 * 16];
    int all = 1;
    for (int k = 0; k < n; k++) {
        vd[k] = vt[ts[k]];
        all &= need[k] == (1 << nr) - 1;
        for (int r = 0; r < nr; r++) memcpy(wl + ((size_t)k * nr + r) * 16, w + (size_t)r * ldw + ts[k] * 16, 64);
    }
    const int nu = nr == 4 ? 6 : 8;
    for (int d = 0; d < nd;) {
        const int u = nd - d >= nu ? nu : 1;
        float *ad = acc + (size_t)d * 16;
        if (u == nu) {
            if (all) pv_dims_avx512(0, nu, vd, wl, need, n, nr, ad, (size_t)lda, pf);
            else pv_dims_avx512(1, nu, vd, wl, need, n, nr, ad, (size_t)lda, pf);
        } else {
            pv_dims_avx512(1, 1, vd, wl, need, n, nr, ad, (size_t)lda, pf);
        }
        for (int k = 0; k < n; k++) vd[k] += u * 16;
        d += u;
    }
}

/* pv_tiles: rows in groups of up to 4 (sizes as even as can be); per lane set, the tiles of that
 * set any row of the group takes (lists of at most 64, in order) go through pv_list_avx512
 * together, a row's fmas of a tile masked off where its weights are all zero (the twin skips it).
 * Rows that take different tiles (at depth, a head whose weights of a tile all round to 0 in f16
 * while another's do not) stay together, so each value vector is converted once for the group,
 * not once a row */
static void pv_tiles_avx512(int nd, int nt, const el_half *const *vt, int nh, const float *w, int ldw, float *acc,
                            int lda, int sets, int t0, const el_half *const *next, int nn) {
    const int groups = (nh + 3) / 4, nu = nh / groups >= 4 ? 6 : 8;  /* (pv_list's dims a pass) */
    const size_t bytes = (size_t)nd * 16 * sizeof(el_half);
    const int steps = groups * nt * (nd / nu + nd % nu), lines = (int)(next ? nn * (bytes / 64) : 0);
    pv_prefetch pf = {next, next ? nn : 0, 0, 0, bytes, EL_MAX(1, (lines + steps - 1) / EL_MAX(1, steps))};
    int ts[64];
    uint8_t need[64];
    for (int k = 0, r0 = 0, nr; k < groups; k++, r0 += nr) {
        nr = (nh - r0) / (groups - k);  /* the rest shared evenly: 9 rows as 3 + 3 + 3, not 4 + 4 + 1 */
        const float *wg = w + (size_t)r0 * ldw;
        for (int s = 0; s < sets; s++) {
            const int step = sets == 4 ? 4 : 1;
            for (int c = 0; c < nt; c += 64 * step) {
                const int ce = EL_MIN(nt, c + 64 * step);
                int n = 0;
                for (int t = c + (sets == 4 ? (s - t0 - c) & 3 : 0); t < ce; t += step) {
                    int m = 0;
                    for (int r = 0; r < nr; r++) m |= any16_avx512(wg + (size_t)r * ldw + t * 16) << r;
                    if (m) {
                        need[n] = (uint8_t)m;
                        ts[n++] = t;
                    }
                }
                float *ag = acc + (size_t)r0 * lda + (size_t)s * nd * 16;
                switch (nr) {  /* (the row count a compile-time constant) */
                case 4: pv_list_avx512(nd, vt, 4, wg, ldw, ag, lda, ts, need, n, &pf); break;
                case 3: pv_list_avx512(nd, vt, 3, wg, ldw, ag, lda, ts, need, n, &pf); break;
                case 2: pv_list_avx512(nd, vt, 2, wg, ldw, ag, lda, ts, need, n, &pf); break;
                default: pv_list_avx512(nd, vt, 1, wg, ldw, ag, lda, ts, need, n, &pf); break;
                }
            }
        }
    }
}

/* The integer weights of nr rows for the 16 slots of value tile vt (tile t of the weights),
 * el_internal.h's contract: wd = w * d (exact), m = the largest of 2^-48 and |wd|, and from m's
 * exponent bits E the powers of two p = 2^(141 - E) (so m p in [2^14, 2^15)) and 1 / p; wq[r] =
 * wd p rounded to nearest even (vcvtps2dq under the default MXCSR), saturated to int16
 * (vpmovsdw), sc[r][0] = 1 / p. The four rows' maxima are taken together (their 128-bit lanes
 * folded into one register, row r's in lane r), and p and 1 / p made once for the four */
static inline __attribute__((always_inline)) void pv_q_wq_avx512(const uint8_t *vt, int nr, const float *w, int ldw,
                                                                 int t, int16_t (*wq)[16], float (*sc)[4]) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)vt));  /* the tile's 16 scales */
    __m512 wd[4], m[4];
    for (int r = 0; r < 4; r++) {
        wd[r] = r < nr ? _mm512_mul_ps(_mm512_loadu_ps(w + (size_t)r * ldw + t * 16), d) : _mm512_setzero_ps();
        m[r] = _mm512_abs_ps(wd[r]);
    }
    const __m512 m01 = _mm512_max_ps(_mm512_shuffle_f32x4(m[0], m[1], 0x44), _mm512_shuffle_f32x4(m[0], m[1], 0xEE));
    const __m512 m23 = _mm512_max_ps(_mm512_shuffle_f32x4(m[2], m[3], 0x44), _mm512_shuffle_f32x4(m[2], m[3], 0xEE));
    __m512 mx = _mm512_max_ps(_mm512_shuffle_f32x4(m01, m23, 0x88), _mm512_shuffle_f32x4(m01, m23, 0xDD));
    mx = _mm512_max_ps(mx, _mm512_permute_ps(mx, 0x4E));
    mx = _mm512_max_ps(_mm512_max_ps(mx, _mm512_permute_ps(mx, 0xB1)), _mm512_set1_ps(0x1p-48f));
    const __m512i e = _mm512_and_si512(_mm512_castps_si512(mx), _mm512_set1_epi32(0x7f800000));
    const __m512 pw = _mm512_castsi512_ps(_mm512_sub_epi32(_mm512_set1_epi32((int)EL_PVQ_P_BITS), e));
    _mm512_store_ps(sc[0], _mm512_castsi512_ps(_mm512_sub_epi32(e, _mm512_set1_epi32((int)EL_PVQ_INV_BITS))));
    for (int r = 0; r < nr; r++) {
        const __m512 pr = _mm512_permutexvar_ps(_mm512_set1_epi32(4 * r), pw);  /* row r's p in every lane (clang takes no variable shuffle immediate) */
        _mm256_store_si256((__m256i *)wq[r], _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(wd[r], pr))));
    }
}

/* a pair of slots of a value tile (its quant bytes at p, interleaved: el_internal.h) as int16
 * pairs, dims in two registers: x0's int32 lane i holds (q_2p, q_2p+1) of dim i, x1 of dim 16 + i */
static inline __attribute__((always_inline)) void pv_q_pair_avx512(int q4, const uint8_t *p, __m512i *x0, __m512i *x1) {
    if (q4) {  /* byte pair j holds dims j (low nibbles) and 16 + j (high) of both slots */
        const __m256i y = _mm256_loadu_si256((const __m256i *)p);
        const __m256i m4 = _mm256_set1_epi8(15), k8 = _mm256_set1_epi8(8);
        *x0 = _mm512_cvtepi8_epi16(_mm256_sub_epi8(_mm256_and_si256(y, m4), k8));
        *x1 = _mm512_cvtepi8_epi16(_mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(y, 4), m4), k8));
    } else {
        *x0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
        *x1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p + 32)));
    }
}

/* nr rows over the value tiles [0, nt) of a chunk (nt <= 64), row r skipping the tiles marked in
 * skip[r] (its adds masked off, as the twin's skip). Per tile, a pair of slots at a time: vpdpwssd
 * adds the products of the pair's quants and integer weights (pv_q_wq_avx512, made while the tile
 * before is summed) to int32 sums, the quants widened once for all the rows; after the tile's 16
 * slots the sums (exact) are converted to float and added to the rows' chunk sums times 1 / p with
 * one fma (the product is exact: the twin's multiply then add). The chunk sums stay in registers,
 * added to acc at the end */
static inline __attribute__((always_inline)) void pv_q_block_avx512(int q4, int nt, const uint8_t *const *vt, int nr,
                                                                    const float *w, int ldw, float *acc, int lda,
                                                                    const uint64_t *skip) {
    const int type = q4 ? EL_Q4_0 : EL_Q8_0;
    const size_t pb = el_vq_pair_bytes(type), tb = el_vq_tile_bytes(type);  /* bytes of a pair of slots, of a tile */
    int16_t wq[2][4][16] __attribute__((aligned(64)));
    float sc[2][4][4] __attribute__((aligned(64)));  /* row r's 1 / p: sc[.][r][0] */
    __m512 s[4][2];  /* dims 0..15, 16..31 */
    for (int r = 0; r < nr; r++) s[r][0] = s[r][1] = _mm512_setzero_ps();
    uint64_t none = ~(uint64_t)0;  /* the tiles no row takes */
    for (int r = 0; r < nr; r++) none &= skip[r];
    int t = 0, cur = 0;
    while (t < nt && none >> t & 1) t++;
    if (t == nt) return;  /* (no row takes a tile) */
    pv_q_wq_avx512(vt[t], nr, w, ldw, t, wq[0], sc[0]);
    while (t < nt) {
        int u = t + 1;  /* the next tile taken */
        while (u < nt && none >> u & 1) u++;
        if (u < nt) {
            pv_q_wq_avx512(vt[u], nr, w, ldw, u, wq[cur ^ 1], sc[cur ^ 1]);
            pv_q_prefetch(vt, u, nt, tb);
        }
        __m512i is[4][2];
        for (int r = 0; r < nr; r++) is[r][0] = is[r][1] = _mm512_setzero_si512();
        const uint8_t *pair = el_vq_pairs(vt[t]);
        for (int l = 0; l < 16; l += 2, pair += pb) {
            __m512i x0, x1;
            pv_q_pair_avx512(q4, pair, &x0, &x1);
            for (int r = 0; r < nr; r++) {
                int32_t wp2;
                memcpy(&wp2, &wq[cur][r][l], 4);
                const __m512i wp = _mm512_set1_epi32(wp2);
                is[r][0] = _mm512_dpwssd_epi32(is[r][0], x0, wp);
                is[r][1] = _mm512_dpwssd_epi32(is[r][1], x1, wp);
            }
        }
        for (int r = 0; r < nr; r++) {
            const __mmask16 k = skip[r] >> t & 1 ? 0 : 0xFFFF;
            const __m512 f = _mm512_set1_ps(sc[cur][r][0]);
            s[r][0] = _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(is[r][0]), f, s[r][0], k);
            s[r][1] = _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(is[r][1]), f, s[r][1], k);
        }
        t = u;
        cur ^= 1;
    }
    for (int r = 0; r < nr; r++) {
        float *ar = acc + (size_t)r * lda;
        _mm512_storeu_ps(ar, _mm512_add_ps(_mm512_loadu_ps(ar), s[r][0]));
        _mm512_storeu_ps(ar + 16, _mm512_add_ps(_mm512_loadu_ps(ar + 16), s[r][1]));
    }
}

/* pv_q8_0 / pv_q4_0: rows in groups of up to 4 over the tiles any of them takes (absent tiles and
 * a row's all-zero weights skipped, as the twin does: the row's add of the tile masked off). Rows
 * that take different tiles (at depth, a head whose weights of a tile all round to 0 in f16 while
 * another's do not) stay together, so the quants are widened once for the group, not once a row.
 * (Summed in integers: Gemma-3-270M's global-layer shape, bench_attention_kernels 1 24 1 4 32 2
 * 20 8 256 0, 1 thread: 470 -> 375 ns a tile; the floats' 128 fmas a block of 4 rows become 64
 * vpdpwssd, and the integer weights (a reduction and a conversion per row and tile) cost about a
 * third of what is left) */
static void pv_q_avx512(int q4, int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc,
                        int lda) {
    uint64_t skip[4];  /* per row, the tiles it skips */
    for (int r0 = 0; r0 < nh; r0 += 4) {
        const int nr = EL_MIN(4, nh - r0);
        for (int r = 0; r < nr; r++) {
            skip[r] = 0;
            for (int t = 0; t < nt; t++)
                skip[r] |= (uint64_t)!(vt[t] && any16_avx512(w + (size_t)(r0 + r) * ldw + t * 16)) << t;
        }
        float *ab = acc + (size_t)r0 * lda;
        const float *wg = w + (size_t)r0 * ldw;
        switch (nr) {  /* (the row count a compile-time constant: accumulators in registers) */
        case 4: pv_q_block_avx512(q4, nt, vt, 4, wg, ldw, ab, lda, skip); break;
        case 3: pv_q_block_avx512(q4, nt, vt, 3, wg, ldw, ab, lda, skip); break;
        case 2: pv_q_block_avx512(q4, nt, vt, 2, wg, ldw, ab, lda, skip); break;
        default: pv_q_block_avx512(q4, nt, vt, 1, wg, ldw, ab, lda, skip); break;
        }
    }
}

static void pv_q8_0_avx512(int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda) {
    pv_q_avx512(0, nt, vt, nh, w, ldw, acc, lda);
}
static void pv_q4_0_avx512(int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda) {
    pv_q_avx512(1, nt, vt, nh, w, ldw, acc, lda);
}

static void sum16_rows_avx512(int n, const float *acc, float *out) {
    for (int i = 0; i < n; i++) out[i] = sum16_avx512(_mm512_loadu_ps(acc + 16 * i));
}

/* exp_sums: the exponentials, each 16's el_sum16 kept in sums (unless NULL) and summed in double */
static double exp_sums_avx512(int n, float *x, float max, float *sums) {
    double sum = 0.0;
    const __m512 m = _mm512_set1_ps(max);
    for (int i = 0; i < n; i += 16) {
        const __m512 v = expf_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
        _mm512_storeu_ps(x + i, v);
        const float s = sum16_avx512(v);
        if (sums) sums[i / 16] = s;
        sum += s;
    }
    return sum;
}

static void scale_max_avx512(int nh, const float *src, float scale, float *dst, size_t ldd, float *lmax) {
    const __m512 s = _mm512_set1_ps(scale);
    for (int r = 0; r < nh; r++) {
        const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(src + r * 16), s);
        _mm512_storeu_ps(dst + (size_t)r * ldd, v);
        _mm512_storeu_ps(lmax + r * 16, _mm512_max_ps(v, _mm512_loadu_ps(lmax + r * 16)));  /* v > m ? v : m */
    }
}

/* Activation quantizers (the generic quantize_row_q8_0 / q8_1's bytes, as x86_avx2.c's): 16 blocks
 * at a time, their maxima gathered so that d = max / 127, 127 / max, the halves of d (vcvtps2ph,
 * nearest even: el_float_to_half's rounding) and q8_1's s = half(sum * d) are vector operations;
 * per block two vectors of 16 values, q = nearest-even(x * 127 / max) (cvtps2dq), narrowed by
 * vpmovsdb (|q| <= 127: no saturation). The maxima and sums go into their vectors by masked moves:
 * 16 scalar stores read back as one vector wait for the stores to retire (no store forwarding),
 * which took two thirds of this function's time. s: q8_1's */
static inline __attribute__((always_inline)) void quantize_q8_avx512(const int s, const float *x, void *vy, int64_t k) {
    const size_t bs = s ? sizeof(block_q8_1) : sizeof(block_q8_0), qo = s ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    uint8_t *y = vy;
    const int64_t nb = k / 32;
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        const int n = (int)EL_MIN(16, nb - b0);
        float id[16];
        uint16_t dh[16], sh[16];
        __m512 a = _mm512_setzero_ps();
        __m512i sum = _mm512_setzero_si512();
        for (int j = 0; j < n; j++) {
            const float *xb = x + (b0 + j) * 32;
            const float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb)), _mm512_abs_ps(_mm512_loadu_ps(xb + 16))));
            a = _mm512_mask_mov_ps(a, (__mmask16)(1u << j), _mm512_set1_ps(m));
        }
        const __m512 d = _mm512_div_ps(a, _mm512_set1_ps(127.0f));
        _mm512_storeu_ps(id, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_NEQ_UQ), _mm512_set1_ps(127.0f), a));
        _mm256_storeu_si256((__m256i *)dh, _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
        for (int j = 0; j < n; j++) {
            const float *xb = x + (b0 + j) * 32;
            uint8_t *yb = y + (size_t)(b0 + j) * bs;
            const __m512 v = _mm512_set1_ps(id[j]);
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb), v));
            const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), v));
            _mm_storeu_si128((__m128i *)(yb + qo), _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(yb + qo + 16), _mm512_cvtsepi32_epi8(q1));
            memcpy(yb, &dh[j], 2);
            if (s) sum = _mm512_mask_mov_epi32(sum, (__mmask16)(1u << j), _mm512_set1_epi32(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1))));
        }
        if (s) {
            _mm256_storeu_si256((__m256i *)sh, _mm512_cvtps_ph(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), d),
                                                               _MM_FROUND_TO_NEAREST_INT));
            for (int j = 0; j < n; j++) memcpy(y + (size_t)(b0 + j) * bs + offsetof(block_q8_1, s), &sh[j], 2);
        }
    }
}
static void quantize_row_q8_0_avx512(const float *x, void *vy, int64_t k) { quantize_q8_avx512(0, x, vy, k); }
static void quantize_row_q8_1_avx512(const float *x, void *vy, int64_t k) { quantize_q8_avx512(1, x, vy, k); }

/* el_rmsnorm_rows: the sums of squares of 8 rows at once, row j in double lane j, each the twin's
 * sequence of additions of (double)(x * x) (the float product): the rows' values taken 8 at a
 * time and transposed, so one vector of products is added per value position (a single row's sum
 * is a chain of dependent additions, one value each); the rest of each row (its last n % 8
 * values' squares, the scale, the products) by the twin's el_rmsnorm_from. A lone row left over
 * takes the twin */
static void rmsnorm_rows_avx512(int rows, float *y, size_t ldy, const float *x, size_t ldx, const float *w, int n,
                                float eps) {
    int r0 = 0;
    for (; rows - r0 >= 2; r0 += 8) {
        const int nr = EL_MIN(8, rows - r0);
        const float *xr[8];
        for (int j = 0; j < 8; j++) xr[j] = x + (size_t)(r0 + EL_MIN(j, nr - 1)) * ldx;  /* (a repeated last row) */
        __m512d acc = _mm512_setzero_pd();
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256i v[8], t[8];
            for (int j = 0; j < 8; j++) v[j] = _mm256_castps_si256(_mm256_loadu_ps(xr[j] + i));
            transpose8x8(v, t);  /* t[k] lane j: value i + k of row j */
            for (int k = 0; k < 8; k++) {
                const __m256 p = _mm256_castsi256_ps(t[k]);
                acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_mul_ps(p, p)));
            }
        }
        double ss[8];
        _mm512_storeu_pd(ss, acc);
        for (int j = 0; j < nr; j++) el_rmsnorm_from(y + (size_t)(r0 + j) * ldy, xr[j], w, n, eps, i, ss[j]);
    }
    for (; r0 < rows; r0++) el_rmsnorm(y + (size_t)r0 * ldy, x + (size_t)r0 * ldx, w, n, eps);
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

#if defined(EL_X86_EMULATED)
#elif defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* AVX512DQ: CPUID.(EAX=7, ECX=0):EBX bit 17; AVX512_VNNI: ECX bit 11 (dispatch.c has checked
 * F, BW, VL and the OS state) */
static int have_dq_vnni(void) {
#if defined(EL_X86_EMULATED)
    return 1;
#else
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return ((b >> 17) & 1) && ((c >> 11) & 1);
#endif
}

void el_register_avx512(el_type_traits *t) {
    if (!have_dq_vnni()) return;  /* AVX2 kernels stay registered */
    el_vops.qk_tile = qk_tile_avx512;
    el_vops.qk_tile_one = qk_tile_one_avx512;
    el_vops.qk_q8_0 = qk_q8_0_avx512;
    el_vops.qk_q4_0 = qk_q4_0_avx512;
    el_vops.pv_tiles = pv_tiles_avx512;
    el_vops.pv_q8_0 = pv_q8_0_avx512;
    el_vops.pv_q4_0 = pv_q4_0_avx512;
    el_vops.sum16_rows = sum16_rows_avx512;
    el_vops.silu_mul = silu_mul_avx512;
    el_vops.scale_max = scale_max_avx512;
    el_vops.exp_sums = exp_sums_avx512;
    el_vops.rmsnorm_rows = rmsnorm_rows_avx512;
    t[EL_Q8_0].from_float = quantize_row_q8_0_avx512;
    t[EL_Q8_1].from_float = quantize_row_q8_1_avx512;
#define SET(id, name) t[id].vec_dot = name##_vec_dot_avx512, t[id].gemm = name##_gemm_avx512
    SET(EL_Q4_0, q4_0_batch);  /* Q4_0: one order (quants_generic.c) */
    SET(EL_Q4_1, q4_1);
    SET(EL_Q5_0, q5_0);
    SET(EL_Q5_1, q5_1);
    SET(EL_Q8_0, q8_0);
    SET(EL_Q2_K, q2_K);
    SET(EL_Q3_K, q3_K);
    SET(EL_Q4_K, q4_K);
    SET(EL_Q5_K, q5_K);
    SET(EL_Q6_K, q6_K);
    SET(EL_IQ4_NL, iq4_nl);
    SET(EL_IQ4_XS, iq4_xs);
#undef SET
    t[EL_Q2_K].gemm = q2_K_cl_gemm_avx512;  /* (other tiles take what the column lanes leave) */
    t[EL_Q3_K].gemm = q3_K_cl_gemm_avx512;
    t[EL_Q6_K].gemm = q6_K_cl_gemm_avx512;
    t[EL_IQ4_XS].gemm = iq4_xs_cl_gemm_avx512;
    t[EL_Q4_K].vec_dot_small = q4_K_small_vec_dot_avx512, t[EL_Q4_K].gemm_small = q4_K_small_gemm_avx512;
    t[EL_Q3_K].vec_dot_small = q3_K_small_vec_dot_avx512, t[EL_Q3_K].gemm_small = q3_K_small_gemm_avx512;
    t[EL_IQ4_XS].vec_dot_small = iq4_xs_small_vec_dot_avx512, t[EL_IQ4_XS].gemm_small = iq4_xs_small_gemm_avx512;
    t[EL_Q5_K].vec_dot_small = q5_K_small_vec_dot_avx512, t[EL_Q5_K].gemm_small = q5_K_small_rows_gemm_avx512;
    t[EL_Q6_K].vec_dot_small = q6_K_small_vec_dot_avx512, t[EL_Q6_K].gemm_small = q6_K_small_gemm_avx512;
#define SET(id, name) t[id].vec_dot_batch = name##_batch_vec_dot_avx512, t[id].gemm_batch = name##_batch_gemm_avx512
    SET(EL_Q4_1, q4_1);
    SET(EL_Q5_0, q5_0);
    SET(EL_Q5_1, q5_1);
    SET(EL_Q8_0, q8_0);
#undef SET
    ft_register(t);
}
#endif
