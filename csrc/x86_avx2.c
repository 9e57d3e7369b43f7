/* AVX2 + FMA + F16C kernels, compiled with per-function targets so one build runs on any
 * x86-64 CPU; dispatch.c registers them only when the CPU has the features.
 *
 * Contents: float helpers for attention (el_vops), activation quantizers writing the same bytes
 * as the reference (quantize_row_q8_0/q8_1/q8_K), float-weight kernels (F32, F16, BF16) and,
 * in x86_avx2_dots.h and x86_avx2_iq4.h (each included twice: plain AVX2 and AVX-VNNI), the
 * quantized kernels. Every weight type gets a vec_dot and a gemm (Q4_K and Q6_K also the
 * small-batch pair); gemm returns bit-identical results to vec_dot, and the quantized ones the
 * generic twins' bits (see x86_avx2_dots.h). Block layouts: common.h (ggml's ggml-common.h). */
#if defined(__x86_64__)
#include <cpuid.h>
#include <stdlib.h>
#include "x86_common.h"

/* EL_X86_EMULATED: tests/x86_emu builds this file on SIMDe's portable intrinsics, without the
 * target pragmas and with every CPU feature assumed, to check it on CPUs that lack them */
#if defined(EL_X86_EMULATED)
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#include <immintrin.h>

/* ------------------------------------------------------------------------------------------ */
/* small helpers                                                                               */

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

static inline float load_half(const void *p) {
    el_half h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);  /* exact, as el_half_to_float */
}

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* the half at p, as 8 float lanes */
static inline __m256 bcast_half(const void *p) {
    int16_t h;
    memcpy(&h, p, sizeof h);
    return _mm256_cvtph_ps(_mm_set1_epi16(h));
}

static inline __m256i loadu256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16 bytes of nibbles -> 32 bytes: low nibbles (values 0..15), then high nibbles (16..31) */
static inline __m256i nibbles32(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

/* 32 bits (bit j for value j) -> 32 bytes, 0x10 where the bit is set (Q5_0 / Q5_1 fifth bits) */
static inline __m256i bits32_to_0x10(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* ------------------------------------------------------------------------------------------ */
/* legacy types: block sizes and unpacking to unsigned bytes in value order                    */

/* the 32 values of a block: 0..15 (Q4), 0..31 (Q5), or the signed bytes of Q8_0 */
static inline __m256i legacy_unpack(int type, const uint8_t *blk) {
    switch (type) {
    case EL_Q4_0: return nibbles32(blk + offsetof(block_q4_0, qs));
    case EL_Q4_1: return nibbles32(blk + offsetof(block_q4_1, qs));
    case EL_Q5_0:
        return _mm256_or_si256(nibbles32(blk + offsetof(block_q5_0, qs)), bits32_to_0x10(blk + offsetof(block_q5_0, qh)));
    case EL_Q5_1:
        return _mm256_or_si256(nibbles32(blk + offsetof(block_q5_1, qs)), bits32_to_0x10(blk + offsetof(block_q5_1, qh)));
    default: return loadu256(blk + offsetof(block_q8_0, qs));
    }
}

/* legacy_unpack for the one-column tiles (x86_avx2_dots.h lone_tile): a Q4 / Q5 block's 16
 * nibble bytes broadcast by the load and the upper half shifted by 4 in 64-bit lanes (AVX2 has no
 * variable 16-bit shift; the mask drops the bits moved across bytes), no lane insert. One column,
 * Q4_1 from DRAM: 17.1 -> 18.6 GB/s; in legacy_gemm's panels nibbles32 stayed faster (Q4_1 K 576,
 * 1536 rows, 16 columns: 87.5 against 83.9 GFLOP/s) */
static inline __m256i legacy_unpack_bcast(int type, const uint8_t *blk) {
    if (type == EL_Q8_0) return legacy_unpack(type, blk);
    const size_t qo = type == EL_Q4_0 ? offsetof(block_q4_0, qs) : type == EL_Q4_1 ? offsetof(block_q4_1, qs)
                    : type == EL_Q5_0 ? offsetof(block_q5_0, qs) : offsetof(block_q5_1, qs);
    const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + qo)));
    const __m256i v = _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
    if (type == EL_Q4_0 || type == EL_Q4_1) return v;
    return _mm256_or_si256(v, bits32_to_0x10(blk + (type == EL_Q5_0 ? offsetof(block_q5_0, qh) : offsetof(block_q5_1, qh))));
}

/* ------------------------------------------------------------------------------------------ */
/* K-quants: per-super-block scales and 32-value chunks as unsigned bytes                      */

/* 16 signed scales of a Q3_K super-block */
static inline __m128i q3_K_scales(const uint8_t *s) {
    uint32_t v[4];
    q3_K_scales_biased(s, v);
    return _mm_sub_epi8(_mm_setr_epi32((int)v[0], (int)v[1], (int)v[2], (int)v[3]), _mm_set1_epi8(32));
}

/* scale tables for groups of 16: s0 holds scales 0..7 as int16 in both 128-bit lanes, s1 8..15 */
static inline void group16_tables(__m256i sc16, __m256i *s0, __m256i *s1) {
    *s0 = _mm256_permute2x128_si256(sc16, sc16, 0x00);
    *s1 = _mm256_permute2x128_si256(sc16, sc16, 0x11);
}

static inline void kquant_prep(int type, const uint8_t *x, __m256i *s0, __m256i *s1, __m256i *mins) {
    switch (type) {
    case EL_Q2_K: {  /* scales[g] = sc | m << 4 */
        const __m128i b = _mm_loadu_si128((const __m128i *)x);
        group16_tables(_mm256_cvtepu8_epi16(_mm_and_si128(b, _mm_set1_epi8(0x0F))), s0, s1);
        *mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F)));
        break;
    }
    case EL_Q3_K: {
        const __m256i sc = _mm256_cvtepi8_epi16(q3_K_scales(x + offsetof(block_q3_K, scales)));
        group16_tables(sc, s0, s1);
        *mins = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 2));  /* -4 * sc */
        break;
    }
    case EL_Q6_K: {
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + offsetof(block_q6_K, scales))));
        group16_tables(sc, s0, s1);
        *mins = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 5));  /* -32 * sc */
        break;
    }
    default: {  /* Q4_K, Q5_K: scales at the same offset */
        uint32_t sc[2], m[2];
        k4_scales_mins(x + offsetof(block_q4_K, scales), sc, m);
        const __m128i s = _mm_cvtepu8_epi16(_mm_setr_epi32((int)sc[0], (int)sc[1], 0, 0));
        *s0 = *s1 = _mm256_set_m128i(s, s);
        const __m128i mb = _mm_setr_epi32((int)m[0], (int)m[1], 0, 0);
        *mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mb, mb));  /* one min per pair of bsums */
        break;
    }
    }
}

/* int16 scale of every lane of chunk k (values 32k..32k+31); vpmaddubsw lane j covers values
 * 32k+2j, 32k+2j+1, so lanes 0..7 are group 2k and lanes 8..15 group 2k+1 */
static inline __m256i kquant_chunk_scales(int type, __m256i s0, __m256i s1, int k) {
    if (type == EL_Q4_K || type == EL_Q5_K) {  /* one scale per 32 values */
        const short sel = (short)((2 * k) | ((2 * k + 1) << 8));
        return _mm256_shuffle_epi8(s0, _mm256_set1_epi16(sel));
    }
    const int e = (2 * k) & 7;
    const __m128i lo = _mm_set1_epi16((short)((2 * e) | ((2 * e + 1) << 8)));
    const __m128i hi = _mm_set1_epi16((short)((2 * e + 2) | ((2 * e + 3) << 8)));
    return _mm256_shuffle_epi8(k < 4 ? s0 : s1, _mm256_set_m128i(hi, lo));
}

/* byte-wise (v >> s) & mask, for shifts that are not compile-time constants */
static inline __m256i srl_mask(__m256i v, int s, int mask) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(s)), _mm256_set1_epi8((char)mask));
}

/* values 32k..32k+31 of a super-block as unsigned bytes (before any offset) */
static inline __m256i kquant_chunk(int type, const uint8_t *x, int k) {
    switch (type) {
    case EL_Q2_K:  /* byte l of 32-byte half j holds values 128j + l + 32s at bits 2s */
        return srl_mask(loadu256(x + offsetof(block_q2_K, qs) + 32 * (k / 4)), 2 * (k % 4), 3);
    case EL_Q3_K: {  /* 2 low bits as Q2_K, high bit k of hmask[l] */
        const __m256i lo = srl_mask(loadu256(x + offsetof(block_q3_K, qs) + 32 * (k / 4)), 2 * (k % 4), 3);
        const __m256i hb = srl_mask(loadu256(x + offsetof(block_q3_K, hmask)), k, 1);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2));
    }
    case EL_Q4_K:  /* 32 bytes per 64 values: low nibbles first, then high nibbles */
        return srl_mask(loadu256(x + offsetof(block_q4_K, qs) + 32 * (k / 2)), 4 * (k % 2), 0x0F);
    case EL_Q5_K: {  /* Q4_K nibbles plus bit k of qh[l] */
        const __m256i lo = srl_mask(loadu256(x + offsetof(block_q5_K, qs) + 32 * (k / 2)), 4 * (k % 2), 0x0F);
        const __m256i hb = srl_mask(loadu256(x + offsetof(block_q5_K, qh)), k, 1);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
    }
    default: {  /* Q6_K: per 128 values h, quarter q: nibble q/2 of ql[64h + 32(q%2) + l], bits
                 * 2q..2q+1 of qh[32h + l] on top */
        const int h = k / 4, q = k % 4;
        const __m256i lo = srl_mask(loadu256(x + offsetof(block_q6_K, ql) + 64 * h + 32 * (q % 2)), 4 * (q / 2), 0x0F);
        const __m256i hi = srl_mask(loadu256(x + offsetof(block_q6_K, qh) + 32 * h), 2 * q, 3);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
    }
}

/* the halves (f16) at offset `off` of the super-blocks x0, x1 as float lanes [x0, x1, x0, x1]
 * (lane p = r + 2c of a K-quant tile: row r, column c) */
static inline __m128 halves_rows(const uint8_t *x0, const uint8_t *x1, size_t off) {
    uint16_t h0, h1;
    memcpy(&h0, x0 + off, 2);
    memcpy(&h1, x1 + off, 2);
    return _mm_cvtph_ps(_mm_set1_epi32((int)((uint32_t)h0 | (uint32_t)h1 << 16)));
}

/* the same for two halves per super-block: [x0, x1, x0, x1] at off0, then at off1 */
static inline __m256 halves_rows2(const uint8_t *x0, const uint8_t *x1, size_t off0, size_t off1) {
    uint16_t a0, a1, b0, b1;
    memcpy(&a0, x0 + off0, 2);
    memcpy(&a1, x1 + off0, 2);
    memcpy(&b0, x0 + off1, 2);
    memcpy(&b1, x1 + off1, 2);
    const int wa = (int)((uint32_t)a0 | (uint32_t)a1 << 16), wb = (int)((uint32_t)b0 | (uint32_t)b1 << 16);
    return _mm256_cvtph_ps(_mm_setr_epi32(wa, wa, wb, wb));
}

/* horizontal integer sums of four vectors at once: lanes 0..3 sum the low 128-bit halves of a,
 * b, c, d, lanes 4..7 their high halves */
static inline __m256i hsum_halves4(__m256i a, __m256i b, __m256i c, __m256i d) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
}

/* lanes 0..3: e's low plus high half (the totals of hsum_halves4), lanes 4..7: f's */
static inline __m256i fold_halves(__m256i e, __m256i f) {
    return _mm256_add_epi32(_mm256_permute2x128_si256(e, f, 0x20), _mm256_permute2x128_si256(e, f, 0x31));
}

/* ------------------------------------------------------------------------------------------ */
/* tiling: gemm_tiles in x86_common.h */

#define LT_RMAX 4  /* largest tile the legacy kernels instantiate */
#define LT_CMAX 4
#define KT_RMAX 2
#define KT_CMAX 2

/* ------------------------------------------------------------------------------------------ */
/* float weights (F32, F16, BF16): x86_float.h, tiles of 3 rows x 2 columns (4 rows against a
 * single column: a decode step's FMA chains hide their latency) in 16 registers              */
#define FT_R 3
#define FT_C 2
#define FT_R1 4
#include "x86_float.h"

/* ------------------------------------------------------------------------------------------ */
/* activation quantizers: the same bytes as the generic quantize_row_q8_0 / q8_1 (x * 127/max,
 * ties to even: the default rounding of cvtps2dq) and quantize_row_q8_K_ref                   */

/* four vectors of 8 int32 in [-128, 127] -> 32 int8 in order */
static inline __m256i pack_i8(__m256i q0, __m256i q1, __m256i q2, __m256i q3) {
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline float hmax256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* 8 blocks at a time: each block's max into lane j of one vector (a blend), so that d = max / 127,
 * 127 / max (0 where max is 0) and the halves of d (vcvtps2ph, nearest even: el_float_to_half's
 * rounding) take one vector operation for the 8 in place of two scalar divisions and a software
 * conversion each, which a block's quants waited for (perf, 16-row steps on this path: 5.4% of
 * the step in the one-block-at-a-time quantizer); q = nearest-even(x * 127 / max) (cvtps2dq,
 * the default MXCSR); Q8_1 (s): s = half(sum(q) * d) */
static inline __attribute__((always_inline)) void quantize_q8_avx2(const int s, const float *x, void *vy, int64_t k) {
    const size_t bs = s ? sizeof(block_q8_1) : sizeof(block_q8_0), qo = s ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    uint8_t *y = vy;
    const int64_t nb = k / 32;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        const int n = (int)EL_MIN(8, nb - b0);
        __m256 a = _mm256_setzero_ps();
        for (int j = 0; j < n; j++) {
            const float *xb = x + (b0 + j) * 32;
            __m256 m = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * i)));
            m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
            m = _mm256_max_ps(m, _mm256_permute_ps(m, 0x4E));
            m = _mm256_max_ps(m, _mm256_permute_ps(m, 0xB1));  /* the block's max in every lane */
            a = _mm256_blendv_ps(a, m, _mm256_castsi256_ps(_mm256_cmpeq_epi32(lanes, _mm256_set1_epi32(j))));
        }
        const __m256 d = _mm256_div_ps(a, _mm256_set1_ps(127.0f));
        const __m256 nz = _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_NEQ_UQ);
        float id[8], df[8];
        uint16_t dh[8];
        _mm256_storeu_ps(id, _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(127.0f), a), nz));
        _mm256_storeu_ps(df, d);
        _mm_storeu_si128((__m128i *)dh, _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
        for (int j = 0; j < n; j++) {
            const float *xb = x + (b0 + j) * 32;
            uint8_t *yb = y + (size_t)(b0 + j) * bs;
            const __m256 v = _mm256_set1_ps(id[j]);
            __m256i q[4];
            for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * i), v));
            _mm256_storeu_si256((__m256i *)(yb + qo), pack_i8(q[0], q[1], q[2], q[3]));
            memcpy(yb, &dh[j], 2);
            if (s) {
                const int sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
                const el_half h = el_float_to_half((float)sum * df[j]);
                memcpy(yb + offsetof(block_q8_1, s), &h, 2);
            }
        }
    }
}
static void quantize_row_q8_0_avx2(const float *x, void *vy, int64_t k) { quantize_q8_avx2(0, x, vy, k); }
static void quantize_row_q8_1_avx2(const float *x, void *vy, int64_t k) { quantize_q8_avx2(1, x, vy, k); }

/* Q8_K: iscale = -127 / (value of largest magnitude, first one on ties), q = min(127,
 * nearest-even(iscale * x)), bsums = sums of 16, d = 1 / iscale */
static void quantize_row_q8_K_avx2(const float *x, void *vy, int64_t k) {
    block_q8_K *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        __m256 amaxv = _mm256_setzero_ps();
        /* max(|x|, acc) keeps acc where |x| is NaN, as the reference's `ax > amax` does */
        for (int j = 0; j < QK_K; j += 8) amaxv = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), amaxv);
        const float amax = hmax256(amaxv);
        if (amax == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        int first = 0;
        for (int j = 0; j < QK_K; j += 8) {
            const int m = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (m) {
                first = j + __builtin_ctz((unsigned)m);
                break;
            }
        }
        const float iscale = -127.f / x[first];
        const __m256 isv = _mm256_set1_ps(iscale);
        const __m256i top = _mm256_set1_epi32(127);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            for (int u = 0; u < 4; u++)
                q[u] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * u), isv)), top);
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), pack_i8(q[0], q[1], q[2], q[3]));
            y[i].bsums[j / 16] = (int16_t)hsum_i32(_mm256_add_epi32(q[0], q[1]));
            y[i].bsums[j / 16 + 1] = (int16_t)hsum_i32(_mm256_add_epi32(q[2], q[3]));
        }
        y[i].d = 1 / iscale;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* float helpers for attention                                                                  */

static void f32_to_f16_avx2(int n, const float *x, el_half *y) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = el_float_to_half(x[i]);
}

static void f16_to_f32_avx2(int n, const el_half *x, float *y) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = el_half_to_float(x[i]);
}

/* el_sum16 of 16 lanes held as lo (lanes 0..7) and hi (8..15): the lane tree spelled out */
static inline float sum16_avx2(__m256 lo, __m256 hi) {
    const __m256 t = _mm256_add_ps(hi, lo);                                          /* t[i] = l[i+8] + l[i] */
    const __m128 u = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));  /* t[i+4] + t[i] */
    const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));                             /* u0 + u2, u1 + u3 */
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_movehdup_ps(w)));
}

/* el_expf on 8 lanes: the same fmas; ldexpf(j, n) as j * 2^(n - e) (exact: |n| <= 192, e = n >> 1,
 * so both powers and the first product are normal) then * 2^e, rounded once as ldexpf rounds
 * (subnormal and overflowing results included) */
static inline __m256 expf_avx2(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r), r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
    const __m256i ni = _mm256_cvtps_epi32(n), e = _mm256_srai_epi32(ni, 1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, e), bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, bias), 23));
    const __m256 v = _mm256_mul_ps(_mm256_mul_ps(j, s1), s2);
    /* |n| > 192: 0 (n <= 0) or infinity */
    const __m256 an = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(an, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 edge = _mm256_and_ps(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_GT_OQ), _mm256_set1_ps(INFINITY));
    return _mm256_blendv_ps(v, edge, big);
}

/* keys 8h..8h+7 of key-tile row d: from the floats kf when given, else converted from kt */
static inline __attribute__((always_inline)) __m256 key8(const el_half *kt, const float *kf, int d, int h) {
    if (kf) return _mm256_loadu_ps(kf + d * 16 + 8 * h);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kt + d * 16 + 8 * h)));
}

/* one query's 16 scores in the qk_tile order: lane classes i, i + 4, i + 8, i + 12 (keys in two
 * ymm each) summed in registers, d in order, giving u_i of el_sum16's tree directly; the classes
 * are taken i = 0, 2, 1, 3 so that (u0 + u2) + (u1 + u3) needs only two partial sums live */
static inline __attribute__((always_inline)) void qk_query_avx2(int hk, const float *q, const el_half *kt, const float *kf,
                                                                float *out) {
    const int h16 = hk & ~15;
    __m256 p[2][2];  /* [u0 + u2, u1 + u3][keys 0..7, 8..15] */
    for (int g = 0; g < 4; g++) {
        const int i = (g & 1) * 2 + (g >> 1);  /* 0, 2, 1, 3 */
        __m256 a[4][2];
        for (int c = 0; c < 4; c++) a[c][0] = a[c][1] = _mm256_setzero_ps();
        for (int d0 = 0; d0 < h16; d0 += 16)
            for (int c = 0; c < 4; c++) {
                const int d = d0 + i + 4 * c;
                const __m256 qv = _mm256_broadcast_ss(q + d);
                a[c][0] = _mm256_fmadd_ps(qv, key8(kt, kf, d, 0), a[c][0]);  /* exact products */
                a[c][1] = _mm256_fmadd_ps(qv, key8(kt, kf, d, 1), a[c][1]);
            }
        for (int c = 0; c < 4; c++) {
            const int d = h16 + i + 4 * c;
            if (d >= hk) break;
            const __m256 qv = _mm256_broadcast_ss(q + d);
            a[c][0] = _mm256_fmadd_ps(qv, key8(kt, kf, d, 0), a[c][0]);
            a[c][1] = _mm256_fmadd_ps(qv, key8(kt, kf, d, 1), a[c][1]);
        }
        for (int h = 0; h < 2; h++) {  /* u_i = t[i+4] + t[i], t[i] = l[i+8] + l[i] */
            const __m256 ui = _mm256_add_ps(_mm256_add_ps(a[3][h], a[1][h]), _mm256_add_ps(a[2][h], a[0][h]));
            p[g >> 1][h] = g & 1 ? _mm256_add_ps(p[g >> 1][h], ui) : ui;
        }
    }
    _mm256_storeu_ps(out, _mm256_add_ps(p[0][0], p[1][0]));
    _mm256_storeu_ps(out + 8, _mm256_add_ps(p[0][1], p[1][1]));
}

static void qk_tile_avx2(int hk, const float *q, int nq, int ldq, const el_half *kt, float *out) {
    if (nq > 1 && hk <= 256) {  /* keys converted once for all the queries */
        float kf[256 * 16];
        f16_to_f32_avx2(hk * 16, kt, kf);
        for (int j = 0; j < nq; j++) qk_query_avx2(hk, q + (size_t)j * ldq, kt, kf, out + j * 16);
        return;
    }
    for (int j = 0; j < nq; j++) qk_query_avx2(hk, q + (size_t)j * ldq, kt, NULL, out + j * 16);
}

/* ggml_vec_dot_f16's order: per lane class i, its four chunk accumulators (two ymm each) summed
 * in registers, combined (a0 + a2) + (a1 + a3), then el_sum16's tree across the classes (as in
 * qk_query_avx2); dims past the last multiple of 64 added in double */
static inline __attribute__((always_inline)) void qk_one_query_avx2(int hk, const float *q, const el_half *kt,
                                                                    const float *kf, float *out) {
    const int h64 = hk / 64 * 64;
    __m256 p[2][2];
    for (int g = 0; g < 4; g++) {
        const int i = (g & 1) * 2 + (g >> 1);
        __m256 l[4][2];  /* classes i, i + 4, i + 8, i + 12 */
        for (int c = 0; c < 4; c++) {
            __m256 a[4][2];
            for (int k = 0; k < 4; k++) a[k][0] = a[k][1] = _mm256_setzero_ps();
            for (int d0 = 0; d0 < h64; d0 += 64)
                for (int k = 0; k < 4; k++) {
                    const int d = d0 + 16 * k + i + 4 * c;
                    const __m256 qv = _mm256_broadcast_ss(q + d);
                    a[k][0] = _mm256_fmadd_ps(qv, key8(kt, kf, d, 0), a[k][0]);
                    a[k][1] = _mm256_fmadd_ps(qv, key8(kt, kf, d, 1), a[k][1]);
                }
            for (int h = 0; h < 2; h++) l[c][h] = _mm256_add_ps(_mm256_add_ps(a[0][h], a[2][h]), _mm256_add_ps(a[1][h], a[3][h]));
        }
        for (int h = 0; h < 2; h++) {
            const __m256 ui = _mm256_add_ps(_mm256_add_ps(l[3][h], l[1][h]), _mm256_add_ps(l[2][h], l[0][h]));
            p[g >> 1][h] = g & 1 ? _mm256_add_ps(p[g >> 1][h], ui) : ui;
        }
    }
    const __m256 r0 = _mm256_add_ps(p[0][0], p[1][0]), r1 = _mm256_add_ps(p[0][1], p[1][1]);
    if (h64 == hk) {
        _mm256_storeu_ps(out, r0);
        _mm256_storeu_ps(out + 8, r1);
        return;
    }
    __m256d s[4] = {_mm256_cvtps_pd(_mm256_castps256_ps128(r0)), _mm256_cvtps_pd(_mm256_extractf128_ps(r0, 1)),
                    _mm256_cvtps_pd(_mm256_castps256_ps128(r1)), _mm256_cvtps_pd(_mm256_extractf128_ps(r1, 1))};
    for (int d = h64; d < hk; d++) {
        const __m256 qv = _mm256_broadcast_ss(q + d);
        for (int h = 0; h < 2; h++) {
            const __m256 pr = _mm256_mul_ps(qv, key8(kt, kf, d, h));  /* float product, as the twin */
            s[2 * h] = _mm256_add_pd(s[2 * h], _mm256_cvtps_pd(_mm256_castps256_ps128(pr)));
            s[2 * h + 1] = _mm256_add_pd(s[2 * h + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(pr, 1)));
        }
    }
    for (int k = 0; k < 4; k++) _mm_storeu_ps(out + 4 * k, _mm256_cvtpd_ps(s[k]));
}

/* qk_tile_one for hk a multiple of 64, up to 4 queries: per lane class m and half h (keys 8h..8h+7),
 * L_m = (A0 + A2) + (A1 + A3) with A_k the in-order fma chain over the dims d0 + 16k + m, kept in
 * Lm; then el_sum16's tree over the classes, vectorized across the keys. At hk = 64 each A_k is one
 * product (exact: f16 times f16), so A0 + A2 is one fma onto A2 = fma(q, k, +0) - the twin's
 * 0 + p, sign of zero included - and each key vector, converted once, serves every query. */
static inline __attribute__((always_inline)) void qk_one_64_avx2(const float *q, int nq, int ldq, const el_half *kt,
                                                                 float Lm[4][16][16]) {
    const __m256 z = _mm256_setzero_ps();
    for (int m = 0; m < 16; m++)
        for (int h = 0; h < 2; h++) {
            __m256 k[4];
            for (int c = 0; c < 4; c++)
                k[c] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kt + (m + 16 * c) * 16 + 8 * h)));
            for (int r = 0; r < nq; r++) {
                const float *qr = q + (size_t)r * ldq;
                const __m256 a02 = _mm256_fmadd_ps(_mm256_broadcast_ss(qr + m), k[0],
                                                   _mm256_fmadd_ps(_mm256_broadcast_ss(qr + m + 32), k[2], z));
                const __m256 a13 = _mm256_fmadd_ps(_mm256_broadcast_ss(qr + m + 16), k[1],
                                                   _mm256_fmadd_ps(_mm256_broadcast_ss(qr + m + 48), k[3], z));
                _mm256_storeu_ps(Lm[r][m] + 8 * h, _mm256_add_ps(a02, a13));
            }
        }
}

/* the chains A_k of one query (both key halves at once: 8 chains in flight) or two (a half at a
 * time), each key vector converted once for both (hk > 64) */
static inline __attribute__((always_inline)) void qk_one_chain_avx2(int hk, const float *q, int nq, int ldq,
                                                                    const el_half *kt, float Lm[][16][16]) {
    const int nh = nq == 1 ? 2 : 1;  /* halves per pass */
    for (int m = 0; m < 16; m++)
        for (int h0 = 0; h0 < 2; h0 += nh) {
            __m256 a[2][4];  /* [query or half][c] */
            for (int r = 0; r < 2; r++)
                for (int c = 0; c < 4; c++) a[r][c] = _mm256_setzero_ps();
            for (int d0 = 0; d0 < hk; d0 += 64)
                for (int c = 0; c < 4; c++) {
                    const int d = d0 + 16 * c + m;
                    for (int h = 0; h < nh; h++) {
                        const __m256 k = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kt + d * 16 + 8 * (h0 + h))));
                        for (int r = 0; r < nq; r++)
                            a[r + h][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + (size_t)r * ldq + d), k, a[r + h][c]);
                    }
                }
            for (int i = 0; i < 2 && i < nq * nh; i++)  /* (query r = i, or half h0 + i) */
                _mm256_storeu_ps(Lm[nq == 1 ? 0 : i][m] + 8 * (h0 + (nq == 1 ? i : 0)),
                                 _mm256_add_ps(_mm256_add_ps(a[i][0], a[i][2]), _mm256_add_ps(a[i][1], a[i][3])));
        }
}

static void qk_one_q4_avx2(int hk, const float *q, int nq, int ldq, const el_half *kt, float *out) {
    float Lm[4][16][16];
    if (hk == 64) {
        switch (nq) {  /* (the query count a compile-time constant: the loops unrolled) */
        case 1: qk_one_64_avx2(q, 1, ldq, kt, Lm); break;
        case 2: qk_one_64_avx2(q, 2, ldq, kt, Lm); break;
        case 3: qk_one_64_avx2(q, 3, ldq, kt, Lm); break;
        default: qk_one_64_avx2(q, 4, ldq, kt, Lm); break;
        }
    } else {
        int r = 0;
        for (; r + 2 <= nq; r += 2) qk_one_chain_avx2(hk, q + (size_t)r * ldq, 2, ldq, kt, Lm + r);
        if (r < nq) qk_one_chain_avx2(hk, q + (size_t)r * ldq, 1, ldq, kt, Lm + r);
    }
    for (int r = 0; r < nq; r++)
        for (int h = 0; h < 2; h++) {  /* t_i = L[i+8] + L[i]; u_i = t[i+4] + t[i]; (u0 + u2) + (u1 + u3) */
            __m256 t[8], u[4];
            for (int i = 0; i < 8; i++) t[i] = _mm256_add_ps(_mm256_loadu_ps(Lm[r][i + 8] + 8 * h), _mm256_loadu_ps(Lm[r][i] + 8 * h));
            for (int i = 0; i < 4; i++) u[i] = _mm256_add_ps(t[i + 4], t[i]);
            _mm256_storeu_ps(out + r * 16 + 8 * h, _mm256_add_ps(_mm256_add_ps(u[0], u[2]), _mm256_add_ps(u[1], u[3])));
        }
}

static void qk_tile_one_avx2(int hk, const float *q, int nq, int ldq, const el_half *kt, float *out,
                             const el_half *next) {
    el_prefetch_l2(next, (size_t)hk * 32);
    if (hk % 64 == 0) {
        for (int j = 0; j < nq; j += 4)
            qk_one_q4_avx2(hk, q + (size_t)j * ldq, EL_MIN(4, nq - j), ldq, kt, out + j * 16);
        return;
    }
    if (nq > 1 && hk <= 256) {  /* keys converted once for all the queries */
        float kf[256 * 16];
        f16_to_f32_avx2(hk * 16, kt, kf);
        for (int j = 0; j < nq; j++) qk_one_query_avx2(hk, q + (size_t)j * ldq, kt, kf, out + j * 16);
        return;
    }
    for (int j = 0; j < nq; j++) qk_one_query_avx2(hk, q + (size_t)j * ldq, kt, NULL, out + j * 16);
}

/* whether any of 16 weights is nonzero (NaN counts, -0 does not, as the twin's != 0) */
static inline int any16_avx2(const float *w) {
    const __m256 z = _mm256_setzero_ps();
    return _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(_mm256_loadu_ps(w), z, _CMP_NEQ_UQ),
                                           _mm256_cmp_ps(_mm256_loadu_ps(w + 8), z, _CMP_NEQ_UQ))) != 0;
}

/* dims d .. d + nu - 1, keys 8h .. 8h + 7 of pv_set_rows_avx2: the rows' nr x nu accumulators
 * (8 or 9: as many chains of fma in flight) stay in registers over the list; wl: the list's
 * weights, [k][nr][16] */
static inline __attribute__((always_inline)) void pv_set_dims_avx2(int d, int nu, int h, const el_half *const *vp,
                                                                   const float *wl, int n, int nr, float *acc, int lda) {
    __m256 a[3][8];
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < nu; i++) a[r][i] = _mm256_loadu_ps(acc + (size_t)r * lda + (d + i) * 16 + 8 * h);
    const size_t off = (size_t)d * 16 + 8 * h;
    for (int k = 0; k < n; k++) {
        const el_half *v = vp[k] + off;
        const float *wk = wl + (size_t)k * nr * 16 + 8 * h;
        __m256 x[8];
        for (int i = 0; i < nu; i++) x[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + 16 * i)));
        for (int r = 0; r < nr; r++) {
            const __m256 wt = _mm256_loadu_ps(wk + r * 16);
            for (int i = 0; i < nu; i++) a[r][i] = _mm256_fmadd_ps(wt, x[i], a[r][i]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < nu; i++) _mm256_storeu_ps(acc + (size_t)r * lda + (d + i) * 16 + 8 * h, a[r][i]);
}

/* p.v with four lane sets, for up to 3 rows that all take every tile of list ts (at most 64 tiles
 * of one set, in order), a few dims and half of the lanes at a time (8 / 4 / 3 dims for 1 / 2 / 3
 * rows: at most 13 registers, none spilled); each value vector is converted once for
 * all the rows (fma: the products are exact) */
static inline __attribute__((always_inline)) void pv_set_rows_avx2(int nd, const el_half *const *vt, int nr,
                                                                   const float *w, int ldw, float *acc, int lda,
                                                                   const int *ts, int n) {
    const el_half *vp[64];
    float wl[64 * 3 * 16];
    for (int k = 0; k < n; k++) {
        vp[k] = vt[ts[k]];
        for (int r = 0; r < nr; r++) memcpy(wl + ((size_t)k * nr + r) * 16, w + (size_t)r * ldw + ts[k] * 16, 64);
    }
    const int nu = nr == 1 ? 8 : nr == 2 ? 4 : 3;
    int d = 0;
    for (; d + nu <= nd; d += nu)
        for (int h = 0; h < 2; h++) pv_set_dims_avx2(d, nu, h, vp, wl, n, nr, acc, lda);
    for (; d < nd; d++)
        for (int h = 0; h < 2; h++) pv_set_dims_avx2(d, 1, h, vp, wl, n, nr, acc, lda);
}

/* pv_tiles with four lane sets (nd even): per set, its tiles every row of a group of 3 takes go
 * through pv_set_rows_avx2 together; when the rows of a group do not all take the same tiles (a
 * row whose weights of a tile are all zero skips it), each row on its own */
static void pv_tiles4_avx2(int nd, int nt, const el_half *const *vt, int nh, const float *w, int ldw, float *acc,
                           int lda, int t0) {
    int ts[64], tr[64];
    for (int r0 = 0; r0 < nh; r0 += 3) {  /* (groups of 4 measured slower; 2 + 2 no faster than 3 + 1) */
        const int nr = EL_MIN(3, nh - r0);
        const float *wg = w + (size_t)r0 * ldw;
        for (int s = 0; s < 4; s++) {
            for (int c = 0; c < nt; c += 64) {  /* lists of at most 64 tiles */
                const int ce = EL_MIN(nt, c + 64);
                int n = 0, same = 1;
                for (int t = c + ((s - t0 - c) & 3); t < ce; t += 4) {
                    int need = 0;
                    for (int r = 0; r < nr; r++) need |= any16_avx2(wg + (size_t)r * ldw + t * 16) << r;
                    if (need) ts[n++] = t;
                    same &= !need || need == (1 << nr) - 1;
                }
                float *ag = acc + (size_t)r0 * lda + (size_t)s * nd * 16;
                if (same) {
                    if (nr == 3) pv_set_rows_avx2(nd, vt, 3, wg, ldw, ag, lda, ts, n);
                    else if (nr == 2) pv_set_rows_avx2(nd, vt, 2, wg, ldw, ag, lda, ts, n);
                    else pv_set_rows_avx2(nd, vt, 1, wg, ldw, ag, lda, ts, n);
                    continue;
                }
                for (int r = 0; r < nr; r++) {
                    int m = 0;
                    for (int k = 0; k < n; k++)
                        if (any16_avx2(wg + (size_t)r * ldw + ts[k] * 16)) tr[m++] = ts[k];
                    pv_set_rows_avx2(nd, vt, 1, wg + (size_t)r * ldw, ldw, ag + (size_t)r * lda, lda, tr, m);
                }
            }
        }
    }
}

/* The values of up to 8 tiles x 32 dims are converted once for every row; then per row, lane
 * set and 4 dims the accumulators stay in registers over the tiles (fma: the products are exact) */
static void pv_tiles_avx2(int nd, int nt, const el_half *const *vt, int nh, const float *w, int ldw, float *acc,
                          int lda, int sets, int t0, const el_half *const *next, int nn) {
    (void)next, (void)nn;
    if (sets == 4 && nd % 2 == 0) {
        pv_tiles4_avx2(nd, nt, vt, nh, w, ldw, acc, lda, t0);
        return;
    }
    float vf[8][32][16];
    for (int tb = 0; tb < nt; tb += 8) {
        const int ntb = EL_MIN(8, nt - tb);
        for (int d0 = 0; d0 < nd; d0 += 32) {
            const int ndb = EL_MIN(32, nd - d0);
            int conv = 0;  /* tiles converted so far (lazily: only when some row needs them) */
            for (int r = 0; r < nh; r++) {
                const float *wr = w + (size_t)r * ldw + tb * 16;
                int mask = 0;
                for (int t = 0; t < ntb; t++) mask |= any16_avx2(wr + t * 16) << t;
                if (!mask) continue;
                for (; conv < ntb; conv++)
                    if (vt[tb + conv])
                        f16_to_f32_avx2(ndb * 16, vt[tb + conv] + (size_t)d0 * 16, vf[conv][0]);
                for (int s = 0; s < sets; s++) {
                    int ms = mask;  /* the tiles of lane set s */
                    if (sets == 4)
                        for (int t = 0; t < ntb; t++)
                            if (((t0 + tb + t) & 3) != s) ms &= ~(1 << t);
                    if (!ms) continue;
                    float *a = acc + (size_t)r * lda + (size_t)s * nd * 16 + (size_t)d0 * 16;
                    int dd = 0;
                    for (; dd + 4 <= ndb; dd += 4) {
                        __m256 x[8];
                        for (int i = 0; i < 8; i++) x[i] = _mm256_loadu_ps(a + dd * 16 + 8 * i);
                        for (int t = 0; t < ntb; t++) {
                            if (!(ms >> t & 1)) continue;
                            const __m256 w0 = _mm256_loadu_ps(wr + t * 16), w1 = _mm256_loadu_ps(wr + t * 16 + 8);
                            for (int i = 0; i < 4; i++) {
                                x[2 * i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(vf[t][dd + i]), x[2 * i]);
                                x[2 * i + 1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(vf[t][dd + i] + 8), x[2 * i + 1]);
                            }
                        }
                        for (int i = 0; i < 8; i++) _mm256_storeu_ps(a + dd * 16 + 8 * i, x[i]);
                    }
                    for (; dd < ndb; dd++) {
                        __m256 x0 = _mm256_loadu_ps(a + dd * 16), x1 = _mm256_loadu_ps(a + dd * 16 + 8);
                        for (int t = 0; t < ntb; t++) {
                            if (!(ms >> t & 1)) continue;
                            x0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + t * 16), _mm256_loadu_ps(vf[t][dd]), x0);
                            x1 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + t * 16 + 8), _mm256_loadu_ps(vf[t][dd] + 8), x1);
                        }
                        _mm256_storeu_ps(a + dd * 16, x0);
                        _mm256_storeu_ps(a + dd * 16 + 8, x1);
                    }
                }
            }
        }
    }
}

/* The integer weights of nr rows for the 16 slots of value tile vt (tile t of the weights),
 * el_internal.h's contract (x86_avx512.c's pv_q_wq_avx512): wd = w * d (exact), m = the largest of
 * 2^-48 and |wd|, p = 2^(141 - E) from m's exponent bits E; wq[r] = wd p rounded to nearest even
 * (vcvtps2dq, default MXCSR), saturated to int16 (vpackssdw, its lane order undone), sc[r] = 1 / p */
static inline __attribute__((always_inline)) void pv_q_wq_avx2(const uint8_t *vt, int nr, const float *w, int ldw, int t,
                                                               int16_t (*wq)[16], float *sc) {
    const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)vt));  /* the tile's scales */
    const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vt + 16)));
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int r = 0; r < nr; r++) {
        const float *wr = w + (size_t)r * ldw + t * 16;
        const __m256 wd0 = _mm256_mul_ps(_mm256_loadu_ps(wr), d0), wd1 = _mm256_mul_ps(_mm256_loadu_ps(wr + 8), d1);
        __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, wd0), _mm256_andnot_ps(sign, wd1));
        m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
        m = _mm256_max_ps(m, _mm256_permute_ps(m, 0x4E));
        m = _mm256_max_ps(_mm256_max_ps(m, _mm256_permute_ps(m, 0xB1)), _mm256_set1_ps(0x1p-48f));
        const __m256i e = _mm256_and_si256(_mm256_castps_si256(m), _mm256_set1_epi32(0x7f800000));
        const __m256 pw = _mm256_castsi256_ps(_mm256_sub_epi32(_mm256_set1_epi32((int)EL_PVQ_P_BITS), e));
        sc[r] = _mm256_cvtss_f32(_mm256_castsi256_ps(_mm256_sub_epi32(e, _mm256_set1_epi32((int)EL_PVQ_INV_BITS))));
        const __m256i q = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(wd0, pw)), _mm256_cvtps_epi32(_mm256_mul_ps(wd1, pw)));
        _mm256_storeu_si256((__m256i *)wq[r], _mm256_permute4x64_epi64(q, 0xD8));  /* slots 0..3, 8..11 | 4..7, 12..15 -> in order */
    }
}

/* a pair of slots of a value tile (its quant bytes at p, interleaved: el_internal.h) as int16
 * pairs: x[k]'s int32 lane i holds (q_2p, q_2p+1) of dim 8k + i */
static inline __attribute__((always_inline)) void pv_q_pair_avx2(int q4, const uint8_t *p, __m256i x[4]) {
    if (q4) {  /* byte pair j holds dims j (low nibbles) and 16 + j (high) of both slots */
        const __m128i lo = _mm_loadu_si128((const __m128i *)p), hi = _mm_loadu_si128((const __m128i *)(p + 16));
        const __m128i m4 = _mm_set1_epi8(15), k8 = _mm_set1_epi8(8);
        x[0] = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_and_si128(lo, m4), k8));
        x[1] = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_and_si128(hi, m4), k8));
        x[2] = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(lo, 4), m4), k8));
        x[3] = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(hi, 4), m4), k8));
    } else {
        for (int k = 0; k < 4; k++) x[k] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16 * k)));
    }
}

/* nr <= 3 rows over the value tiles [0, nt) of a chunk (nt <= 64), row r skipping the tiles marked
 * in skip[r] (as the twin's skip): per tile, a pair of slots at a time, vpmaddwd's pairwise products
 * of the pair's quants and integer weights (pv_q_wq_avx2, made while the tile before is summed)
 * added to int32 sums (exact), the quants widened once for all the rows; after the tile's 16 slots
 * the sums converted to float and added to the rows' chunk sums (in registers, added to acc at the
 * end) times 1 / p with one fma (the product exact), as x86_avx512.c's pv_q_block_avx512 */
static inline __attribute__((always_inline)) void pv_q_block_avx2(int q4, int nt, const uint8_t *const *vt, int nr,
                                                                  const float *w, int ldw, float *acc, int lda,
                                                                  const uint64_t *skip) {
    const int type = q4 ? EL_Q4_0 : EL_Q8_0;
    const size_t pb = el_vq_pair_bytes(type), tb = el_vq_tile_bytes(type);  /* bytes of a pair of slots, of a tile */
    int16_t wq[2][3][16] __attribute__((aligned(32)));
    float sc[2][3];
    __m256 s[3][4];
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < 4; i++) s[r][i] = _mm256_setzero_ps();
    uint64_t none = ~(uint64_t)0;  /* the tiles no row takes */
    for (int r = 0; r < nr; r++) none &= skip[r];
    int t = 0, cur = 0;
    while (t < nt && none >> t & 1) t++;
    if (t == nt) return;  /* (no row takes a tile) */
    pv_q_wq_avx2(vt[t], nr, w, ldw, t, wq[0], sc[0]);
    while (t < nt) {
        int u = t + 1;  /* the next tile taken */
        while (u < nt && none >> u & 1) u++;
        if (u < nt) {
            pv_q_wq_avx2(vt[u], nr, w, ldw, u, wq[cur ^ 1], sc[cur ^ 1]);
            pv_q_prefetch(vt, u, nt, tb);
        }
        __m256i is[3][4];
        for (int r = 0; r < nr; r++)
            for (int i = 0; i < 4; i++) is[r][i] = _mm256_setzero_si256();
        const uint8_t *pair = el_vq_pairs(vt[t]);
        for (int l = 0; l < 16; l += 2, pair += pb) {
            __m256i x[4];
            pv_q_pair_avx2(q4, pair, x);
            for (int r = 0; r < nr; r++) {
                const __m256i wp = _mm256_set1_epi32((int32_t)load_u32(&wq[cur][r][l]));
                for (int i = 0; i < 4; i++) is[r][i] = _mm256_add_epi32(is[r][i], _mm256_madd_epi16(x[i], wp));
            }
        }
        for (int r = 0; r < nr; r++) {
            if (skip[r] >> t & 1) continue;
            const __m256 f = _mm256_set1_ps(sc[cur][r]);
            for (int i = 0; i < 4; i++) s[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[r][i]), f, s[r][i]);
        }
        t = u;
        cur ^= 1;
    }
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < 4; i++) {
            float *p = acc + (size_t)r * lda + 8 * i;
            _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), s[r][i]));
        }
}

/* pv_q8_0 / pv_q4_0: rows in groups of up to 3 over the tiles any of them takes (absent tiles and
 * a row's all-zero weights skipped, as the twin does). Rows that take different tiles stay
 * together, so the quants are widened once for the group */
static void pv_q_avx2(int q4, int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda) {
    uint64_t skip[3];  /* per row, the tiles it skips */
    for (int r0 = 0; r0 < nh; r0 += 3) {
        const int nr = EL_MIN(3, nh - r0);
        for (int r = 0; r < nr; r++) {
            skip[r] = 0;
            for (int t = 0; t < nt; t++)
                skip[r] |= (uint64_t)!(vt[t] && any16_avx2(w + (size_t)(r0 + r) * ldw + t * 16)) << t;
        }
        float *ab = acc + (size_t)r0 * lda;
        const float *wg = w + (size_t)r0 * ldw;
        switch (nr) {  /* (the row count a compile-time constant: accumulators in registers) */
        case 3: pv_q_block_avx2(q4, nt, vt, 3, wg, ldw, ab, lda, skip); break;
        case 2: pv_q_block_avx2(q4, nt, vt, 2, wg, ldw, ab, lda, skip); break;
        default: pv_q_block_avx2(q4, nt, vt, 1, wg, ldw, ab, lda, skip); break;
        }
    }
}

static void pv_q8_0_avx2(int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda) {
    pv_q_avx2(0, nt, vt, nh, w, ldw, acc, lda);
}
static void pv_q4_0_avx2(int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda) {
    pv_q_avx2(1, nt, vt, nh, w, ldw, acc, lda);
}

static void sum16_rows_avx2(int n, const float *acc, float *out) {
    for (int i = 0; i < n; i++) out[i] = sum16_avx2(_mm256_loadu_ps(acc + 16 * i), _mm256_loadu_ps(acc + 16 * i + 8));
}

/* exp_sums: the exponentials, each 16's el_sum16 kept in sums (unless NULL) and summed in double */
static double exp_sums_avx2(int n, float *x, float max, float *sums) {
    double sum = 0.0;
    const __m256 m = _mm256_set1_ps(max);
    for (int i = 0; i < n; i += 16) {
        const __m256 v0 = expf_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
        const __m256 v1 = expf_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), m));
        _mm256_storeu_ps(x + i, v0);
        _mm256_storeu_ps(x + i + 8, v1);
        const float s = sum16_avx2(v0, v1);
        if (sums) sums[i / 16] = s;
        sum += s;
    }
    return sum;
}

static void scale_max_avx2(int nh, const float *src, float scale, float *dst, size_t ldd, float *lmax) {
    const __m256 s = _mm256_set1_ps(scale);
    for (int r = 0; r < nh; r++)
        for (int h = 0; h < 16; h += 8) {
            const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(src + r * 16 + h), s);
            _mm256_storeu_ps(dst + (size_t)r * ldd + h, v);
            _mm256_storeu_ps(lmax + r * 16 + h, _mm256_max_ps(v, _mm256_loadu_ps(lmax + r * 16 + h)));  /* v > m ? v : m */
        }
}


static void f16_scale_avx2(int n, float *x, float s) {
    const __m256 sv = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv), _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; i++) x[i] = el_half_to_float(el_float_to_half(x[i] * s));
}

/* el_rope: NORM pairs (2i, 2i + 1) lie next to their (c, s) in the cache, so 4 pairs a vector:
 * fmaddsub(x0 x0, c s, x1 x1 * s c) gives x0 c - x1 s in the even lanes, x0 s + x1 c in the odd (each
 * product of the third operand rounded first, as the twin's); NEOX pairs (i, i + n_rot / 2): 8 of
 * each half a vector, the cache's c and s split apart; the pairs left the twin's el_rope_pairs */
static void rope_avx2(float *x, int n_heads, int head_dim, int n_rot, int rope_type, const float *cache) {
    const int half = n_rot / 2, neox = rope_type == EL_ROPE_NEOX;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        int i = 0;
        if (neox) {
            for (; i + 8 <= half; i += 8) {
                const __m256 a = _mm256_loadu_ps(cache + 2 * i), b = _mm256_loadu_ps(cache + 2 * i + 8);
                const __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
                const __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
                const __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + i + half);
                _mm256_storeu_ps(v + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
                _mm256_storeu_ps(v + i + half, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
            }
        } else {
            for (; i + 4 <= half; i += 4) {
                const __m256 cs = _mm256_loadu_ps(cache + 2 * i), xv = _mm256_loadu_ps(v + 2 * i);
                const __m256 sc = _mm256_permute_ps(cs, 0xB1);  /* (s, c) */
                _mm256_storeu_ps(v + 2 * i, _mm256_fmaddsub_ps(_mm256_moveldup_ps(xv), cs,
                                                               _mm256_mul_ps(_mm256_movehdup_ps(xv), sc)));
            }
        }
        el_rope_pairs(v, n_rot, rope_type, cache, i);  /* (pairs that do not fill a vector: the twin) */
    }
}

/* el_rmsnorm_rows, 4 rows at once (rmsnorm_rows_avx512's scheme with 4 double lanes): the rows'
 * values taken 4 at a time and transposed, one vector of (double)(x * x) added per position */
static void rmsnorm_rows_avx2(int rows, float *y, size_t ldy, const float *x, size_t ldx, const float *w, int n,
                              float eps) {
    int r0 = 0;
    for (; rows - r0 >= 2; r0 += 4) {
        const int nr = EL_MIN(4, rows - r0);
        const float *xr[4];
        for (int j = 0; j < 4; j++) xr[j] = x + (size_t)(r0 + EL_MIN(j, nr - 1)) * ldx;  /* (a repeated last row) */
        __m256d acc = _mm256_setzero_pd();
        int i = 0;
        for (; i + 4 <= n; i += 4) {
            __m128 t0 = _mm_loadu_ps(xr[0] + i), t1 = _mm_loadu_ps(xr[1] + i), t2 = _mm_loadu_ps(xr[2] + i),
                   t3 = _mm_loadu_ps(xr[3] + i);
            _MM_TRANSPOSE4_PS(t0, t1, t2, t3);  /* t_k lane j: value i + k of row j */
            acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm_mul_ps(t0, t0)));
            acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm_mul_ps(t1, t1)));
            acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm_mul_ps(t2, t2)));
            acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm_mul_ps(t3, t3)));
        }
        double ss[4];
        _mm256_storeu_pd(ss, acc);
        for (int j = 0; j < nr; j++) el_rmsnorm_from(y + (size_t)(r0 + j) * ldy, xr[j], w, n, eps, i, ss[j]);
    }
    for (; r0 < rows; r0++) el_rmsnorm(y + (size_t)r0 * ldy, x + (size_t)r0 * ldx, w, n, eps);
}

static void silu_mul_avx2(int64_t n, float *g, const float *u) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = expf_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + el_expf(0.0f - g[i])) * u[i];
}

/* ------------------------------------------------------------------------------------------ */
/* the quantized kernels, twice                                                                 */

#define EL_VNNI 0
#define KFN(name) name##_avx2
#include "x86_avx2_dots.h"
#include "x86_avx2_iq4.h"
#undef KFN
#undef EL_VNNI

#if defined(EL_X86_EMULATED)
#elif defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif
#define EL_VNNI 1
#define KFN(name) name##_avxvnni
#include "x86_avx2_dots.h"
#include "x86_avx2_iq4.h"
#undef KFN
#undef EL_VNNI

#if defined(EL_X86_EMULATED)
#elif defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* AVX-VNNI: CPUID.(EAX=7, ECX=1):EAX bit 4. EDGELLM_X86_VNNI=0 turns it off (to test the
 * plain AVX2 path on a VNNI machine). */
static int use_avx_vnni(void) {
    const char *env = getenv("EDGELLM_X86_VNNI");
    if (env && env[0] == '0') return 0;
#if defined(EL_X86_EMULATED)
    return 1;
#else
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 4) & 1;
#endif
}

void el_register_avx2(el_type_traits *t) {
    t[EL_Q8_0].from_float = quantize_row_q8_0_avx2;
    t[EL_Q8_1].from_float = quantize_row_q8_1_avx2;
    t[EL_Q8_K].from_float = quantize_row_q8_K_avx2;
    ft_register(t);
    if (use_avx_vnni()) register_avxvnni(t), register_iq4_avxvnni(t);
    else register_avx2(t), register_iq4_avx2(t);
    el_vops.f32_to_f16 = f32_to_f16_avx2;
    el_vops.f16_to_f32 = f16_to_f32_avx2;
    el_vops.qk_tile = qk_tile_avx2;
    el_vops.qk_tile_one = qk_tile_one_avx2;
    el_vops.pv_tiles = pv_tiles_avx2;
    el_vops.pv_q8_0 = pv_q8_0_avx2;
    el_vops.pv_q4_0 = pv_q4_0_avx2;
    el_vops.sum16_rows = sum16_rows_avx2;
    el_vops.silu_mul = silu_mul_avx2;
    el_vops.scale_max = scale_max_avx2;
    el_vops.exp_sums = exp_sums_avx2;
    el_vops.f16_scale = f16_scale_avx2;
    el_vops.rope = rope_avx2;
    el_vops.rmsnorm_rows = rmsnorm_rows_avx2;
}
#endif
