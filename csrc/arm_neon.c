/* AArch64 NEON kernels at two levels chosen at run time: plain ARMv8.0 NEON (e.g. Cortex-A72)
 * and the same kernels with the int8 dot product `sdot` (FEAT_DotProd, ARMv8.2+: Cortex-A76,
 * Apple M1). Every file of the library is built with the same flags and no -march, and GCC 12
 * will not inline vdotq_s32 under a target pragma or attribute, so `sdot` is emitted with inline
 * assembly; it only runs inside kernels registered when the CPU reports the feature.
 *
 * Numerics. Quantized types: integer sums are exact (int32) and the float steps are the
 * generic twins' (quants_generic.c, kquants_generic.c, iquants_generic.c): same operations, same operands, same
 * order, vfmaq where the twins call fmaf. Legacy types (and Q6_K's small-batch kernel): per
 * (row, activation) pair the twins' 8 lanes as two float32x4 (lane i: values 4i..4i+3, one
 * fma per block), reduced at the end in el_hsum8's order, plus the scalar min chain of
 * Q4_1 / Q5_1. Other K-quants: the per-super-block fma chain (Q4_K: per quarter super-block),
 * weight rows in vector lanes. Results are the twins' bits at both levels, and gemm's are
 * vec_dot's whatever the tile.
 * F32 / F16: float products accumulated in double, 8 lanes (value i goes to lane i % 8), lanes
 * summed pairwise at the end, the last n % 8 products added in order; gemm and vec_dot share
 * this code, so they agree bit for bit (the generic twin sums in one sequential double).
 *
 * gemm tiles: legacy types 4 weight rows (a remainder row alone) by 2 activation rows with the
 * accumulators in registers; for more activation rows, 16 blocks of 4 rows are decoded ahead
 * and shared by the tiles. K-quants: 4 weight rows by up to 8 activation rows, each block
 * decoded once. IQ4_NL / IQ4_XS: arm_neon_iq4.h, tiled as the K-quants. */
#if defined(__aarch64__)

/* every float multiply and add rounded on its own, as the twins: GCC writes vmulq_f32 as `a * b`,
 * which it could otherwise fuse with a following add */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <arm_neon.h>
#include "el_internal.h"

#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)  /* Linux arch/arm64 uapi hwcap.h */
#endif
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif

/* field positions the kernels read through one pointer for several block types */
_Static_assert(offsetof(block_q4_0, d) == 0 && offsetof(block_q4_1, d) == 0 && offsetof(block_q5_0, d) == 0 &&
               offsetof(block_q5_1, d) == 0 && offsetof(block_q8_0, d) == 0 && offsetof(block_q8_1, d) == 0,
               "legacy blocks start with d");
_Static_assert(offsetof(block_q4_1, m) == 2 && offsetof(block_q5_1, m) == 2, "m follows d");
_Static_assert(offsetof(block_q5_K, dmin) == offsetof(block_q4_K, dmin) &&
               offsetof(block_q5_K, scales) == offsetof(block_q4_K, scales), "Q5_K begins as Q4_K");

#define EL_INLINE static inline __attribute__((always_inline))
#define MAX_NC 8  /* activation rows one tile call keeps accumulators for */

/* 1 when the CPU executes sdot (FEAT_DotProd) */
int el_neon_has_dotprod(void) {
#if defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
    int v = 0;
    size_t len = sizeof v;
    return sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &len, NULL, 0) == 0 && v != 0;
#else
    return 0;
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* shared pieces                                                                              */

/* hardware half -> float (exact for every non-NaN half) */
EL_INLINE float h2f(const el_half *p) {
    __fp16 h;
    memcpy(&h, p, sizeof h);
    return (float)h;
}

EL_INLINE int32x4_t sdot(int32x4_t acc, int8x16_t a, int8x16_t b) {
    __asm__(".arch armv8.2-a+dotprod\n\tsdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
}

/* acc plus the 16 products a[i]*b[i] spread over its 4 lanes. Which lane gets which product
 * differs between the levels; callers only use the sum over all lanes, which is exact. */
EL_INLINE int32x4_t dot_s8(int32x4_t acc, int8x16_t a, int8x16_t b, const int dp) {
    if (dp) return sdot(acc, a, b);
    /* int8*int8 fits int16; pairs are added only once widened to int32 */
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}

/* lane i = a[4i]*b[4i] + ... + a[4i+3]*b[4i+3] (exact). `narrow`: |a| <= 63, so a sum of two
 * products fits int16 (else a may be -128 and pairs are added in int32). */
EL_INLINE int32x4_t dot4_s8(int8x16_t a, int8x16_t b, const int dp, const int narrow) {
    if (dp) return sdot(vdupq_n_s32(0), a, b);
    const int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b)), p1 = vmull_high_s8(a, b);
    if (narrow) return vpaddlq_s16(vpaddq_s16(p0, p1));
    return vpaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1));
}

/* acc + x * d[lane] with one rounding; the lane a constant once inlined */
EL_INLINE float32x4_t fma_lane(float32x4_t acc, float32x4_t x, float32x4_t d, const int lane) {
    switch (lane) {
    case 0: return vfmaq_laneq_f32(acc, x, d, 0);
    case 1: return vfmaq_laneq_f32(acc, x, d, 1);
    case 2: return vfmaq_laneq_f32(acc, x, d, 2);
    default: return vfmaq_laneq_f32(acc, x, d, 3);
    }
}

/* Lane r = total of p[r] (R == 4); every lane = total of p[0] (R == 1). */
EL_INLINE int32x4_t row_sums(const int32x4_t *p, const int R) {
    if (R == 1) return vdupq_n_s32(vaddvq_s32(p[0]));
    return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
}

/* Lane r = half *p[r] as float (R == 4); every lane = *p[0] (R == 1). */
EL_INLINE float32x4_t row_halves(const el_half *const *p, const int R) {
    if (R == 1) return vdupq_n_f32(h2f(p[0]));
    uint16x4_t h = vdup_n_u16(0);
    h = vld1_lane_u16(p[0], h, 0);
    h = vld1_lane_u16(p[1], h, 1);
    h = vld1_lane_u16(p[2], h, 2);
    h = vld1_lane_u16(p[3], h, 3);
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* out[c*ldo + r] = lane r of acc[c], r < R */
EL_INLINE void store_tile(const float32x4_t *acc, const int R, const int nc, float *out, size_t ldo) {
    for (int c = 0; c < nc; c++) {
        if (R == 4) vst1q_f32(out + (size_t)c * ldo, acc[c]);
        else out[(size_t)c * ldo] = vgetq_lane_f32(acc[c], 0);
    }
}

/* 16 bits -> 16 bytes, byte j = 0x10 if bit j is set (the fifth bit of Q5 values) */
EL_INLINE uint8x16_t fifth_bits(uint32_t bits16) {
    static const uint8_t lane_bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t sel = vcombine_u8(vdup_n_u8((uint8_t)bits16), vdup_n_u8((uint8_t)(bits16 >> 8)));
    return vandq_u8(vtstq_u8(sel, vld1q_u8(lane_bit)), vdupq_n_u8(0x10));
}

/* ------------------------------------------------------------------------------------------ */
/* legacy types: 32-value blocks against Q8_0 / Q8_1 (layouts in common.h)                     */

EL_INLINE size_t q32_size(const int T) {
    return T == EL_Q4_0 ? sizeof(block_q4_0) : T == EL_Q4_1 ? sizeof(block_q4_1)
         : T == EL_Q5_0 ? sizeof(block_q5_0) : T == EL_Q5_1 ? sizeof(block_q5_1) : sizeof(block_q8_0);
}

/* block -> values 0..15 in *lo, 16..31 in *hi, as the int8 the twin multiplies */
EL_INLINE void q32_decode(const int T, const void *blk, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    switch (T) {
    case EL_Q4_0: {  /* (nibble - 8) */
        const uint8x16_t v = vld1q_u8(((const block_q4_0 *)blk)->qs);
        *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, m4)), vdupq_n_s8(8));
        *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
        break;
    }
    case EL_Q4_1: {  /* nibble; the min is applied in float */
        const uint8x16_t v = vld1q_u8(((const block_q4_1 *)blk)->qs);
        *lo = vreinterpretq_s8_u8(vandq_u8(v, m4));
        *hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
        break;
    }
    case EL_Q5_0:
    case EL_Q5_1: {  /* nibble | fifth bit (bit j of qh for value j) [- 16 for Q5_0] */
        const uint8_t *qs = T == EL_Q5_0 ? ((const block_q5_0 *)blk)->qs : ((const block_q5_1 *)blk)->qs;
        const uint8_t *qhp = T == EL_Q5_0 ? ((const block_q5_0 *)blk)->qh : ((const block_q5_1 *)blk)->qh;
        uint32_t qh;
        memcpy(&qh, qhp, 4);
        const uint8x16_t v = vld1q_u8(qs);
        *lo = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, m4), fifth_bits(qh & 0xFFFF)));
        *hi = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), fifth_bits(qh >> 16)));
        if (T == EL_Q5_0) {
            *lo = vsubq_s8(*lo, vdupq_n_s8(16));
            *hi = vsubq_s8(*hi, vdupq_n_s8(16));
        }
        break;
    }
    default: {  /* EL_Q8_0 */
        const int8_t *qs = ((const block_q8_0 *)blk)->qs;
        *lo = vld1q_s8(qs);
        *hi = vld1q_s8(qs + 16);
        break;
    }
    }
}

/* the twins' el_hsum8 of lanes 0-3 in a, 4-7 in b: ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)) */
EL_INLINE float hsum8(float32x4_t a, float32x4_t b) {
    const float32x4_t s = vaddq_f32(a, b);
    return vpadds_f32(vadd_f32(vget_low_f32(s), vget_high_f32(s)));
}

#define QC 2       /* activation rows per legacy tile */
#define QSTRIP 16  /* legacy blocks of 4 rows decoded ahead when several tiles share them */

/* 4 weight rows' blocks decoded: block b row r values 0-15 in q[b][r][0], 16-31 in q[b][r][1];
 * lane r of d[b] (m[b]) is row r's scale (min) */
typedef struct {
    int8x16_t q[QSTRIP][4][2];
    float32x4_t d[QSTRIP], m[QSTRIP];
} q32_strip;

/* The twins' legacy accumulators of up to 4 weight rows x QC activation rows: pair (r, c) keeps
 * its 8 float lanes in l[c][r][0..1] and its min chain (Q4_1 / Q5_1) in lane r of sm[c]. */
typedef struct {
    float32x4_t l[QC][4][2], sm[QC];
} q32_acc;

/* blocks b0 .. b0+nb-1 of R weight rows (from S if given, else decoded from rows ldw bytes
 * apart at w) . C activation rows (C <= QC), added to *st */
EL_INLINE void tile_q32(const int T, const q32_strip *S, const uint8_t *w, size_t ldw, int b0, int nb,
                        const int R, const uint8_t *a, size_t lda, const int C, q32_acc *st, const int dp) {
    const size_t bsz = q32_size(T);
    const int q81 = T == EL_Q4_1 || T == EL_Q5_1;  /* activations are Q8_1, weights carry a min */
    const int narrow = T != EL_Q8_0;                /* weights in -16..31 */
    const size_t asz = q81 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    q32_acc t = *st;
    for (int b = b0; b < b0 + nb; b++) {
        int8x16_t lo[4], hi[4];
        float32x4_t dx, mx = vdupq_n_f32(0.0f);
        if (S) {
            dx = S->d[b - b0];
            if (q81) mx = S->m[b - b0];
        } else {
            const el_half *dptr[4], *mp[4];
            for (int r = 0; r < R; r++) {
                const uint8_t *blk = w + (size_t)r * ldw + (size_t)b * bsz;
                q32_decode(T, blk, &lo[r], &hi[r]);
                dptr[r] = (const el_half *)blk;  /* d is every block's first field */
                mp[r] = (const el_half *)blk + 1;  /* m follows d in q4_1 / q5_1 */
            }
            dx = row_halves(dptr, R);
            if (q81) mx = row_halves(mp, R);
        }
        for (int c = 0; c < C; c++) {
            const uint8_t *ablk = a + (size_t)c * lda + (size_t)b * asz;
            const int8_t *yq = q81 ? ((const block_q8_1 *)ablk)->qs : ((const block_q8_0 *)ablk)->qs;
            const int8x16_t y0 = vld1q_s8(yq), y1 = vld1q_s8(yq + 16);
            const float32x4_t d = vmulq_n_f32(dx, h2f((const el_half *)ablk));  /* lane r: dx * dy */
            for (int r = 0; r < R; r++) {
                const int8x16_t q0 = S ? S->q[b - b0][r][0] : lo[r], q1 = S ? S->q[b - b0][r][1] : hi[r];
                t.l[c][r][0] = fma_lane(t.l[c][r][0], vcvtq_f32_s32(dot4_s8(q0, y0, dp, narrow)), d, r);
                t.l[c][r][1] = fma_lane(t.l[c][r][1], vcvtq_f32_s32(dot4_s8(q1, y1, dp, narrow)), d, r);
            }
            if (q81) t.sm[c] = vfmaq_n_f32(t.sm[c], mx, h2f(&((const block_q8_1 *)ablk)->s));  /* + m * y.s */
        }
    }
    *st = t;
}

EL_INLINE void q32_acc_zero(q32_acc *st) {
    for (int c = 0; c < QC; c++) {
        st->sm[c] = vdupq_n_f32(0.0f);
        for (int r = 0; r < 4; r++) st->l[c][r][0] = st->l[c][r][1] = vdupq_n_f32(0.0f);
    }
}

/* out[c*ldo + r] = el_hsum8(lanes) [+ min chain] */
EL_INLINE void q32_finish(const int T, const q32_acc *st, const int R, const int C, float *out, size_t ldo) {
    for (int c = 0; c < C; c++) {
        float m[4];
        vst1q_f32(m, st->sm[c]);
        for (int r = 0; r < R; r++) {
            const float v = hsum8(st->l[c][r][0], st->l[c][r][1]);
            out[(size_t)c * ldo + r] = (T == EL_Q4_1 || T == EL_Q5_1) ? v + m[r] : v;
        }
    }
}

/* one tile of R rows x C activation rows, decoding as it goes */
EL_INLINE void tile_q32_direct(const int T, int nb, const uint8_t *w, size_t ldw, const int R, const uint8_t *a,
                               size_t lda, const int C, float *out, size_t ldo, const int dp) {
    q32_acc st;
    q32_acc_zero(&st);
    tile_q32(T, NULL, w, ldw, 0, nb, R, a, lda, C, &st, dp);
    q32_finish(T, &st, R, C, out, ldo);
}

/* 4 weight rows x m activation rows (m <= MAX_NC): QSTRIP blocks of the rows decoded at a time
 * and used by every tile */
EL_INLINE void strip_q32(const int T, int nb, const uint8_t *w, size_t ldw, const uint8_t *a, size_t lda, int m,
                         float *out, size_t ldo, const int dp) {
    const size_t bsz = q32_size(T);
    q32_strip S;
    q32_acc st[(MAX_NC + QC - 1) / QC];
    for (int k = 0; k < (m + QC - 1) / QC; k++) q32_acc_zero(&st[k]);
    for (int b0 = 0; b0 < nb; b0 += QSTRIP) {
        const int len = EL_MIN(QSTRIP, nb - b0);
        for (int b = 0; b < len; b++) {
            const el_half *dptr[4], *mp[4];
            for (int r = 0; r < 4; r++) {
                const uint8_t *blk = w + (size_t)r * ldw + (size_t)(b0 + b) * bsz;
                q32_decode(T, blk, &S.q[b][r][0], &S.q[b][r][1]);
                dptr[r] = (const el_half *)blk;
                mp[r] = (const el_half *)blk + 1;
            }
            S.d[b] = row_halves(dptr, 4);
            S.m[b] = (T == EL_Q4_1 || T == EL_Q5_1) ? row_halves(mp, 4) : vdupq_n_f32(0.0f);
        }
        int c = 0;
        for (; c + QC <= m; c += QC) tile_q32(T, &S, NULL, 0, b0, len, 4, a + (size_t)c * lda, lda, QC, &st[c / QC], dp);
        if (c < m) tile_q32(T, &S, NULL, 0, b0, len, 4, a + (size_t)c * lda, lda, 1, &st[c / QC], dp);
    }
    int c = 0;
    for (; c + QC <= m; c += QC) q32_finish(T, &st[c / QC], 4, QC, out + (size_t)c * ldo, ldo);
    if (c < m) q32_finish(T, &st[c / QC], 4, 1, out + (size_t)c * ldo, ldo);
}

/* ------------------------------------------------------------------------------------------ */
/* K-quants: 256-value super-blocks against Q8_K                                               */

/* One super-block decoded: its 256 values in order as int8, a scale per group of G values
 * (G = 32 for Q4_K/Q5_K, else 16), and the mins (per group; Q2_K, Q4_K, Q5_K). */
typedef struct {
    int8_t q[QK_K] __attribute__((aligned(16)));
    int32_t sc[16];
    int16_t mn[16];
    const el_half *d, *dmin;
} kblock;

EL_INLINE size_t k_size(const int T) {
    return T == EL_Q2_K ? sizeof(block_q2_K) : T == EL_Q3_K ? sizeof(block_q3_K)
         : T == EL_Q4_K ? sizeof(block_q4_K) : T == EL_Q5_K ? sizeof(block_q5_K) : sizeof(block_q6_K);
}

/* 6-bit (scale, min) pairs of Q4_K / Q5_K from their 12 bytes, as ggml's get_scale_min_k4,
 * four at a time in 32-bit words: pairs 0-3 are the low 6 bits of bytes 0-3 / 4-7; pairs 4-7
 * take their low 4 bits from bytes 8-11 and their top 2 bits from the top of bytes 0-3 / 4-7. */
EL_INLINE void k4_scales(const uint8_t *s, kblock *k) {
    uint32_t u[3];
    memcpy(u, s, 12);
    const uint32_t w[4] = {
        u[0] & 0x3f3f3f3fu,                                               /* scales 0-3 */
        (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4),        /* scales 4-7 */
        u[1] & 0x3f3f3f3fu,                                               /* mins 0-3 */
        ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4), /* mins 4-7 */
    };
    uint8_t b[16];
    memcpy(b, w, 16);
    for (int j = 0; j < 8; j++) {
        k->sc[j] = b[j];
        k->mn[j] = b[8 + j];
    }
}

/* 16 6-bit scales of Q3_K (minus 32), as the twin's q3_K_scale, in 32-bit words: low nibbles
 * from bytes 0-7 (scales 0-7 low halves, 8-15 high halves), 2 top bits from bytes 8-11. */
EL_INLINE void q3_scales(const uint8_t *s, kblock *k) {
    uint32_t u[3];
    memcpy(u, s, 12);
    const uint32_t w[4] = {
        (u[0] & 0x0f0f0f0fu) | ((u[2] & 0x03030303u) << 4),
        (u[1] & 0x0f0f0f0fu) | (((u[2] >> 2) & 0x03030303u) << 4),
        ((u[0] >> 4) & 0x0f0f0f0fu) | (((u[2] >> 4) & 0x03030303u) << 4),
        ((u[1] >> 4) & 0x0f0f0f0fu) | (((u[2] >> 6) & 0x03030303u) << 4),
    };
    uint8_t b[16];
    memcpy(b, w, 16);
    for (int j = 0; j < 16; j++) k->sc[j] = (int32_t)b[j] - 32;
}

EL_INLINE void k_decode(const int T, const void *blk, kblock *k) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(3);
    switch (T) {
    case EL_Q2_K: {
        /* byte l of 32-byte chunk h holds values 128h + 32s + l at bits 2s */
        const block_q2_K *x = blk;
        for (int h = 0; h < 2; h++) {
            const uint8x16_t v0 = vld1q_u8(x->qs + 32 * h), v1 = vld1q_u8(x->qs + 32 * h + 16);
            int8_t *q = k->q + 128 * h;
            vst1q_u8((uint8_t *)q, vandq_u8(v0, m2));
            vst1q_u8((uint8_t *)q + 16, vandq_u8(v1, m2));
            vst1q_u8((uint8_t *)q + 32, vandq_u8(vshrq_n_u8(v0, 2), m2));
            vst1q_u8((uint8_t *)q + 48, vandq_u8(vshrq_n_u8(v1, 2), m2));
            vst1q_u8((uint8_t *)q + 64, vandq_u8(vshrq_n_u8(v0, 4), m2));
            vst1q_u8((uint8_t *)q + 80, vandq_u8(vshrq_n_u8(v1, 4), m2));
            vst1q_u8((uint8_t *)q + 96, vshrq_n_u8(v0, 6));
            vst1q_u8((uint8_t *)q + 112, vshrq_n_u8(v1, 6));
        }
        for (int g = 0; g < 16; g++) {  /* scales[g] = scale | min << 4 */
            k->sc[g] = x->scales[g] & 0xF;
            k->mn[g] = x->scales[g] >> 4;
        }
        k->d = &x->d;
        k->dmin = &x->dmin;
        break;
    }
    case EL_Q3_K: {
        /* low 2 bits as Q2_K; value v's high bit is bit v/32 of hmask[v%32], clear means -4 */
        const block_q3_K *x = blk;
        const uint8x16_t hm0 = vld1q_u8(x->hmask), hm1 = vld1q_u8(x->hmask + 16), four = vdupq_n_u8(4);
        for (int h = 0; h < 2; h++) {
            const uint8x16_t v0 = vld1q_u8(x->qs + 32 * h), v1 = vld1q_u8(x->qs + 32 * h + 16);
            for (int s = 0; s < 4; s++) {
                const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << (4 * h + s)));
                const int8x16_t shift = vdupq_n_s8((int8_t)(-2 * s));
                const uint8x16_t l0 = vandq_u8(vshlq_u8(v0, shift), m2), l1 = vandq_u8(vshlq_u8(v1, shift), m2);
                const uint8x16_t h0 = vandq_u8(vtstq_u8(hm0, bit), four), h1 = vandq_u8(vtstq_u8(hm1, bit), four);
                int8_t *q = k->q + 128 * h + 32 * s;
                vst1q_s8(q, vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(l0, h0)), vreinterpretq_s8_u8(four)));
                vst1q_s8(q + 16, vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(l1, h1)), vreinterpretq_s8_u8(four)));
            }
        }
        q3_scales(x->scales, k);
        k->d = &x->d;
        k->dmin = NULL;
        break;
    }
    case EL_Q4_K:
    case EL_Q5_K: {
        /* 32-byte chunk j: values 64j + l in the low nibbles, 64j + 32 + l in the high ones;
         * Q5_K: value v's fifth bit is bit v/32 of qh[v%32]. Both blocks begin d, dmin, scales. */
        const block_q4_K *x4 = blk;
        const uint8_t *qs = T == EL_Q4_K ? x4->qs : ((const block_q5_K *)blk)->qs;
        for (int j = 0; j < 4; j++) {
            const uint8x16_t v0 = vld1q_u8(qs + 32 * j), v1 = vld1q_u8(qs + 32 * j + 16);
            uint8x16_t q0 = vandq_u8(v0, m4), q1 = vandq_u8(v1, m4);
            uint8x16_t q2 = vshrq_n_u8(v0, 4), q3 = vshrq_n_u8(v1, 4);
            if (T == EL_Q5_K) {
                const block_q5_K *x = blk;
                const uint8x16_t qh0 = vld1q_u8(x->qh), qh1 = vld1q_u8(x->qh + 16), b5 = vdupq_n_u8(0x10);
                const uint8x16_t blo = vdupq_n_u8((uint8_t)(1u << (2 * j))), bhi = vdupq_n_u8((uint8_t)(2u << (2 * j)));
                q0 = vorrq_u8(q0, vandq_u8(vtstq_u8(qh0, blo), b5));
                q1 = vorrq_u8(q1, vandq_u8(vtstq_u8(qh1, blo), b5));
                q2 = vorrq_u8(q2, vandq_u8(vtstq_u8(qh0, bhi), b5));
                q3 = vorrq_u8(q3, vandq_u8(vtstq_u8(qh1, bhi), b5));
            }
            uint8_t *q = (uint8_t *)k->q + 64 * j;
            vst1q_u8(q, q0);
            vst1q_u8(q + 16, q1);
            vst1q_u8(q + 32, q2);
            vst1q_u8(q + 48, q3);
        }
        k4_scales(x4->scales, k);
        k->d = &x4->d;
        k->dmin = &x4->dmin;
        break;
    }
    default: {  /* EL_Q6_K */
        /* per 128 values (half h): ql[l] holds v[l] | v[l+64] << 4, ql[l+32] v[l+32] | v[l+96] << 4,
         * qh[l] the top 2 bits of v[l], v[l+32], v[l+64], v[l+96]; values are stored + 32 */
        const block_q6_K *x = blk;
        const int8x16_t m32 = vdupq_n_s8(32);
        for (int h = 0; h < 2; h++) {
            for (int half = 0; half < 2; half++) {
                const int o = 16 * half;
                const uint8x16_t la = vld1q_u8(x->ql + 64 * h + o), lb = vld1q_u8(x->ql + 64 * h + 32 + o);
                const uint8x16_t hv = vld1q_u8(x->qh + 32 * h + o);
                const uint8x16_t v0 = vorrq_u8(vandq_u8(la, m4), vshlq_n_u8(vandq_u8(hv, m2), 4));
                const uint8x16_t v1 = vorrq_u8(vandq_u8(lb, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hv, 2), m2), 4));
                const uint8x16_t v2 = vorrq_u8(vshrq_n_u8(la, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hv, 4), m2), 4));
                const uint8x16_t v3 = vorrq_u8(vshrq_n_u8(lb, 4), vshlq_n_u8(vshrq_n_u8(hv, 6), 4));
                int8_t *q = k->q + 128 * h + o;
                vst1q_s8(q, vsubq_s8(vreinterpretq_s8_u8(v0), m32));
                vst1q_s8(q + 32, vsubq_s8(vreinterpretq_s8_u8(v1), m32));
                vst1q_s8(q + 64, vsubq_s8(vreinterpretq_s8_u8(v2), m32));
                vst1q_s8(q + 96, vsubq_s8(vreinterpretq_s8_u8(v3), m32));
            }
        }
        for (int g = 0; g < 16; g++) k->sc[g] = x->scales[g];
        k->d = &x->d;
        k->dmin = NULL;
        break;
    }
    }
}

/* sum over groups of min * (sum of the activations in the group), in int32 lanes */
EL_INLINE int32x4_t k_min_dot(const int T, const kblock *k, const int16_t *bsums) {
    const int16x8_t b0 = vld1q_s16(bsums), b1 = vld1q_s16(bsums + 8);
    if (T == EL_Q2_K) {  /* one min per 16 values, one bsum each */
        const int16x8_t m0 = vld1q_s16(k->mn), m1 = vld1q_s16(k->mn + 8);
        int32x4_t s = vmull_s16(vget_low_s16(b0), vget_low_s16(m0));
        s = vmlal_high_s16(s, b0, m0);
        s = vmlal_s16(s, vget_low_s16(b1), vget_low_s16(m1));
        return vmlal_high_s16(s, b1, m1);
    }
    /* one min per 32 values: pairs of bsums, added in int32 */
    const int32x4_t p0 = vpaddlq_s16(b0), p1 = vpaddlq_s16(b1);
    const int32x4_t m0 = vmovl_s16(vld1_s16(k->mn)), m1 = vmovl_s16(vld1_s16(k->mn + 4));
    return vmlaq_s32(vmulq_s32(p0, m0), p1, m1);
}

/* Q4_K's integers of one quarter super-block (32-value groups 2q, 2q+1), lane r for row r:
 * I = sc * dot over each group, M = m * (sum of the group's activations) over each group */
EL_INLINE void q4k_quarter(const kblock *kb, const int R, const block_q8_K *y, const int32x4_t *mc,
                           const int32x4_t bp, const int q, int32x4_t *I, int32x4_t *M, const int dp) {
    const int g = 2 * q;
    const int8x16_t a0 = vld1q_s8(y->qs + 32 * g), a1 = vld1q_s8(y->qs + 32 * g + 16);
    const int8x16_t a2 = vld1q_s8(y->qs + 32 * g + 32), a3 = vld1q_s8(y->qs + 32 * g + 48);
    int32x4_t p[4];
    for (int r = 0; r < R; r++) {
        const int8_t *qv = kb[r].q + 32 * g;
        const int32x4_t p0 = dot_s8(dot_s8(vdupq_n_s32(0), vld1q_s8(qv), a0, dp), vld1q_s8(qv + 16), a1, dp);
        const int32x4_t p1 = dot_s8(dot_s8(vdupq_n_s32(0), vld1q_s8(qv + 32), a2, dp), vld1q_s8(qv + 48), a3, dp);
        p[r] = vmlaq_n_s32(vmulq_n_s32(p0, kb[r].sc[g]), p1, kb[r].sc[g + 1]);
    }
    *I = row_sums(p, R);
    switch (q) {  /* bp: activation sums of 32-value groups 0-3 (q < 2) or 4-7 */
    case 0: *M = vmlaq_laneq_s32(vmulq_laneq_s32(mc[0], bp, 0), mc[1], bp, 1); break;
    case 1: *M = vmlaq_laneq_s32(vmulq_laneq_s32(mc[2], bp, 2), mc[3], bp, 3); break;
    case 2: *M = vmlaq_laneq_s32(vmulq_laneq_s32(mc[4], bp, 0), mc[5], bp, 1); break;
    default: *M = vmlaq_laneq_s32(vmulq_laneq_s32(mc[6], bp, 2), mc[7], bp, 3); break;
    }
}

/* small: Q4_K's small-batch order (vec_dot_q4_K_q8_K_small_generic) */
EL_INLINE void tile_k(const int T, const int small, int nb, const uint8_t *w, size_t ldw, const int R,
                      const uint8_t *a, size_t lda, const int nc, float *out, size_t ldo, const int dp) {
    const int G = (T == EL_Q4_K || T == EL_Q5_K) ? 32 : 16;  /* values per scale */
    const int has_min = T == EL_Q2_K || T == EL_Q4_K || T == EL_Q5_K;
    const int quarters = T == EL_Q4_K && !small;
    const size_t bsz = k_size(T);
    float32x4_t acc[MAX_NC], accm[MAX_NC];
    kblock kb[4];
    for (int c = 0; c < nc; c++) acc[c] = accm[c] = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        const el_half *d[4], *dm[4];
        for (int r = 0; r < R; r++) {
            k_decode(T, w + (size_t)r * ldw + (size_t)b * bsz, &kb[r]);
            d[r] = kb[r].d;
            dm[r] = kb[r].dmin;
        }
        const float32x4_t dx = row_halves(d, R);
        const float32x4_t dmx = has_min ? row_halves(dm, R) : vdupq_n_f32(0.0f);
        if (quarters) {
            /* the twin: per quarter, acc = fma(I, d * d_act, acc), accm = fma(M, dmin * d_act, accm) */
            int32x4_t mc[8];  /* lane r: min h of row r */
            for (int h = 0; h < 8; h++) {
                int32_t m[4];
                for (int r = 0; r < 4; r++) m[r] = kb[r < R ? r : 0].mn[h];
                mc[h] = vld1q_s32(m);
            }
            for (int c = 0; c < nc; c++) {
                const block_q8_K *y = (const block_q8_K *)(a + (size_t)c * lda) + b;
                const float32x4_t dd = vmulq_n_f32(dx, y->d), dmm = vmulq_n_f32(dmx, y->d);
                const int32x4_t bp0 = vpaddlq_s16(vld1q_s16(y->bsums)), bp1 = vpaddlq_s16(vld1q_s16(y->bsums + 8));
                for (int q = 0; q < 4; q++) {
                    int32x4_t I, M;
                    q4k_quarter(kb, R, y, mc, q < 2 ? bp0 : bp1, q, &I, &M, dp);
                    acc[c] = vfmaq_f32(acc[c], vcvtq_f32_s32(I), dd);
                    accm[c] = vfmaq_f32(accm[c], vcvtq_f32_s32(M), dmm);
                }
            }
            continue;
        }
        for (int c = 0; c < nc; c++) {
            const block_q8_K *y = (const block_q8_K *)(a + (size_t)c * lda) + b;
            int32x4_t isum[4], msum[4];
            for (int r = 0; r < R; r++) isum[r] = vdupq_n_s32(0);
            for (int g = 0; g < QK_K / G; g++) {
                const int8x16_t a0 = vld1q_s8(y->qs + G * g);
                const int8x16_t a1 = G == 32 ? vld1q_s8(y->qs + G * g + 16) : a0;
                for (int r = 0; r < R; r++) {
                    int32x4_t p = dot_s8(vdupq_n_s32(0), vld1q_s8(kb[r].q + G * g), a0, dp);
                    if (G == 32) p = dot_s8(p, vld1q_s8(kb[r].q + G * g + 16), a1, dp);
                    isum[r] = vmlaq_n_s32(isum[r], p, kb[r].sc[g]);
                }
            }
            const float32x4_t isf = vcvtq_f32_s32(row_sums(isum, R));
            if (has_min)
                for (int r = 0; r < R; r++) msum[r] = k_min_dot(T, &kb[r], y->bsums);
            if (T == EL_Q4_K) {  /* small: acc = fma(isum, d * d_act, acc), accm = fma(summs, dmin * d_act, accm) */
                acc[c] = vfmaq_f32(acc[c], isf, vmulq_n_f32(dx, y->d));
                accm[c] = vfmaq_f32(accm[c], vcvtq_f32_s32(row_sums(msum, R)), vmulq_n_f32(dmx, y->d));
                continue;
            }
            /* the twins: t = isum * d [then fma(-dmin, summs, t)]; acc = fma(t, d_act, acc) */
            float32x4_t t = vmulq_f32(isf, dx);
            if (has_min) t = vfmsq_f32(t, dmx, vcvtq_f32_s32(row_sums(msum, R)));
            acc[c] = vfmaq_n_f32(acc[c], t, y->d);
        }
    }
    if (T == EL_Q4_K)
        for (int c = 0; c < nc; c++) acc[c] = vsubq_f32(acc[c], accm[c]);
    store_tile(acc, R, nc, out, ldo);
}

/* Q6_K's small-batch order (vec_dot_q6_K_q8_K_small_generic): 8 integer lanes per super-block,
 * lane k over values 4k..4k+3 of every 32: sum of scale * (q + 32) * q8, minus
 * 32 * (sc[2k] * bsum[2k] + sc[2k+1] * bsum[2k+1]); then as the legacy types' 8 float lanes.
 * R weight rows by nc activation rows, each decoded block used for all of them. */
EL_INLINE void tile_q6s(int nb, const uint8_t *w, size_t ldw, const int R, const uint8_t *a, size_t lda,
                        const int nc, float *out, size_t ldo, const int dp) {
    float32x4_t acc[MAX_NC][4][2];
    kblock kb[4];
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < R; r++) acc[c][r][0] = acc[c][r][1] = vdupq_n_f32(0.0f);
    const int8x16_t m32 = vdupq_n_s8(32);
    for (int b = 0; b < nb; b++) {
        const el_half *dptr[4];
        int16x8_t sc0[4], sc1[4];
        for (int r = 0; r < R; r++) {
            const block_q6_K *x = (const block_q6_K *)(w + (size_t)r * ldw) + b;
            k_decode(EL_Q6_K, x, &kb[r]);
            for (int i = 0; i < QK_K; i += 16) vst1q_s8(kb[r].q + i, vaddq_s8(vld1q_s8(kb[r].q + i), m32));
            dptr[r] = &x->d;
            const int8x16_t sc = vld1q_s8(x->scales);
            sc0[r] = vmovl_s8(vget_low_s8(sc));
            sc1[r] = vmovl_high_s8(sc);
        }
        const float32x4_t dx = row_halves(dptr, R);
        for (int c = 0; c < nc; c++) {
            const block_q8_K *y = (const block_q8_K *)(a + (size_t)c * lda) + b;
            const int16x8_t b0 = vld1q_s16(y->bsums), b1 = vld1q_s16(y->bsums + 8);
            const float32x4_t d = vmulq_n_f32(dx, y->d);  /* lane r: d_act * d */
            for (int r = 0; r < R; r++) {
                /* 32 * (sc . bsum) over the pairs of 16-groups 2k, 2k+1 */
                const int32x4_t m_lo = vpaddq_s32(vmull_s16(vget_low_s16(sc0[r]), vget_low_s16(b0)),
                                                  vmull_high_s16(sc0[r], b0));
                const int32x4_t m_hi = vpaddq_s32(vmull_s16(vget_low_s16(sc1[r]), vget_low_s16(b1)),
                                                  vmull_high_s16(sc1[r], b1));
                int32x4_t lo = vmulq_n_s32(m_lo, -32), hi = vmulq_n_s32(m_hi, -32);
                for (int j = 0; j < 8; j++) {  /* 32-value chunk j: 16-groups 2j, 2j+1; kb q is q + 32 */
                    const int8_t *qv = kb[r].q + 32 * j;
                    lo = vmlaq_n_s32(lo, dot4_s8(vld1q_s8(qv), vld1q_s8(y->qs + 32 * j), dp, 1), kb[r].sc[2 * j]);
                    hi = vmlaq_n_s32(hi, dot4_s8(vld1q_s8(qv + 16), vld1q_s8(y->qs + 32 * j + 16), dp, 1),
                                     kb[r].sc[2 * j + 1]);
                }
                acc[c][r][0] = fma_lane(acc[c][r][0], vcvtq_f32_s32(lo), d, r);
                acc[c][r][1] = fma_lane(acc[c][r][1], vcvtq_f32_s32(hi), d, r);
            }
        }
    }
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < R; r++) out[(size_t)c * ldo + r] = hsum8(acc[c][r][0], acc[c][r][1]);
}

/* legacy types: 4 rows x QC activation rows at a time (a remainder row alone); when a group of
 * 4 rows meets more than QC activation rows, through strip_q32 */
EL_INLINE void gemm_q32(const int T, const int small, int n, const uint8_t *w, size_t ldw, int nr, const uint8_t *a,
                        size_t lda, int nc, float *out, size_t ldo, const int dp) {
    (void)small;
    const int nb = n / QK8_0;
    for (int c0 = 0; c0 < nc; c0 += MAX_NC) {
        const int m = EL_MIN(MAX_NC, nc - c0);
        const uint8_t *A = a + (size_t)c0 * lda;
        float *O = out + (size_t)c0 * ldo;
        int r = 0;
        for (; r + 4 <= nr; r += 4) {
            const uint8_t *W = w + (size_t)r * ldw;
            if (m > QC) strip_q32(T, nb, W, ldw, A, lda, m, O + r, ldo, dp);
            else if (m == QC) tile_q32_direct(T, nb, W, ldw, 4, A, lda, QC, O + r, ldo, dp);
            else tile_q32_direct(T, nb, W, ldw, 4, A, lda, 1, O + r, ldo, dp);
        }
        for (; r < nr; r++) {
            const uint8_t *W = w + (size_t)r * ldw;
            int c = 0;
            for (; c + QC <= m; c += QC) tile_q32_direct(T, nb, W, ldw, 1, A + (size_t)c * lda, lda, QC, O + (size_t)c * ldo + r, ldo, dp);
            if (c < m) tile_q32_direct(T, nb, W, ldw, 1, A + (size_t)c * lda, lda, 1, O + (size_t)c * ldo + r, ldo, dp);
        }
    }
}

/* K-quants, 4 rows at a time (a remainder row alone) by up to MAX_NC activation rows; the
 * one-activation-row case (decode) gets its own copy with the count known */
EL_INLINE void tile_kq(const int T, const int small, int nb, const uint8_t *w, size_t ldw, const int R,
                       const uint8_t *a, size_t lda, const int nc, float *out, size_t ldo, const int dp) {
    if (T == EL_Q6_K && small) tile_q6s(nb, w, ldw, R, a, lda, nc, out, ldo, dp);
    else tile_k(T, small, nb, w, ldw, R, a, lda, nc, out, ldo, dp);
}

EL_INLINE void gemm_kq(const int T, const int small, int n, const uint8_t *w, size_t ldw, int nr, const uint8_t *a,
                       size_t lda, int nc, float *out, size_t ldo, const int dp) {
    const int nb = n / QK_K;
    for (int c0 = 0; c0 < nc; c0 += MAX_NC) {
        const int m = EL_MIN(MAX_NC, nc - c0);
        const uint8_t *A = a + (size_t)c0 * lda;
        float *O = out + (size_t)c0 * ldo;
        int r = 0;
        if (m == 1)
            for (; r + 4 <= nr; r += 4) tile_kq(T, small, nb, w + (size_t)r * ldw, ldw, 4, A, lda, 1, O + r, ldo, dp);
        else
            for (; r + 4 <= nr; r += 4) tile_kq(T, small, nb, w + (size_t)r * ldw, ldw, 4, A, lda, m, O + r, ldo, dp);
        for (; r < nr; r++) tile_kq(T, small, nb, w + (size_t)r * ldw, ldw, 1, A, lda, m, O + r, ldo, dp);
    }
}

#include "arm_neon_iq4.h"
/* clang checks inline assembly against the target features of the function it ends up in (it
 * ignores sdot()'s .arch directive), so under clang the dotprod level's entry points carry the
 * feature. GCC takes the directive; its build is left as it was checked. */
#if defined(__clang__)
#define LEVEL_ATTR_1 __attribute__((target("dotprod")))
#else
#define LEVEL_ATTR_1
#endif
#define LEVEL_ATTR_0
#define LEVEL_ATTR(DP) LEVEL_ATTR_##DP

#define DEFINE_QGEMM(NAME, DRIVER, T, SMALL, DP)                                                   \
    LEVEL_ATTR(DP) static void gemm_##NAME(int n, const void *w, size_t ldw, int nr, const void *a, \
                                           size_t lda, int nc, float *out, size_t ldo) {           \
        DRIVER(T, SMALL, n, w, ldw, nr, a, lda, nc, out, ldo, DP);                                 \
    }                                                                                              \
    LEVEL_ATTR(DP) static void vec_dot_##NAME(int n, float *s, const void *x, const void *y) {    \
        gemm_##NAME(n, x, 0, 1, y, 0, 1, s, 1);                                                    \
    }

#define DEFINE_LEVEL(SUF, DP)                               \
    DEFINE_QGEMM(q4_0##SUF, gemm_q32, EL_Q4_0, 0, DP)       \
    DEFINE_QGEMM(q4_1##SUF, gemm_q32, EL_Q4_1, 0, DP)       \
    DEFINE_QGEMM(q5_0##SUF, gemm_q32, EL_Q5_0, 0, DP)       \
    DEFINE_QGEMM(q5_1##SUF, gemm_q32, EL_Q5_1, 0, DP)       \
    DEFINE_QGEMM(q8_0##SUF, gemm_q32, EL_Q8_0, 0, DP)       \
    DEFINE_QGEMM(q2_K##SUF, gemm_kq, EL_Q2_K, 0, DP)        \
    DEFINE_QGEMM(q3_K##SUF, gemm_kq, EL_Q3_K, 0, DP)        \
    DEFINE_QGEMM(q4_K##SUF, gemm_kq, EL_Q4_K, 0, DP)        \
    DEFINE_QGEMM(q5_K##SUF, gemm_kq, EL_Q5_K, 0, DP)        \
    DEFINE_QGEMM(q6_K##SUF, gemm_kq, EL_Q6_K, 0, DP)        \
    DEFINE_QGEMM(q4_K_small##SUF, gemm_kq, EL_Q4_K, 1, DP)  \
    DEFINE_QGEMM(q6_K_small##SUF, gemm_kq, EL_Q6_K, 1, DP)  \
    DEFINE_QGEMM(iq4_nl##SUF, gemm_iq4, EL_IQ4_NL, 0, DP)   \
    DEFINE_QGEMM(iq4_xs##SUF, gemm_iq4, EL_IQ4_XS, 0, DP)

DEFINE_LEVEL(_neon, 0)
DEFINE_LEVEL(_dotprod, 1)

/* ------------------------------------------------------------------------------------------ */
/* F32 / F16 rows                                                                             */

#define FSEG 256  /* F16 values converted to float at a time (a multiple of 8) */

/* acc lane (i % 8) += (double)(w[i] * a[i]) for i < n, n a multiple of 8 */
EL_INLINE void fdot_acc(float64x2_t *acc, const float *w, const float *a, int n) {
    for (int i = 0; i < n; i += 8) {
        const float32x4_t p0 = vmulq_f32(vld1q_f32(w + i), vld1q_f32(a + i));
        const float32x4_t p1 = vmulq_f32(vld1q_f32(w + i + 4), vld1q_f32(a + i + 4));
        acc[0] = vaddq_f64(acc[0], vcvt_f64_f32(vget_low_f32(p0)));
        acc[1] = vaddq_f64(acc[1], vcvt_high_f64_f32(p0));
        acc[2] = vaddq_f64(acc[2], vcvt_f64_f32(vget_low_f32(p1)));
        acc[3] = vaddq_f64(acc[3], vcvt_high_f64_f32(p1));
    }
}

/* the 8 lanes summed pairwise, then the tail products in order */
EL_INLINE float fdot_finish(const float64x2_t *acc, const float *w, const float *a, int tail) {
    const float64x2_t v = vaddq_f64(vaddq_f64(acc[0], acc[1]), vaddq_f64(acc[2], acc[3]));
    double s = vgetq_lane_f64(v, 0) + vgetq_lane_f64(v, 1);
    for (int i = 0; i < tail; i++) s += (double)(w[i] * a[i]);
    return (float)s;
}

EL_INLINE void halves_to_floats(const el_half *x, float *y, int n) {  /* n a multiple of 8 */
    for (int i = 0; i < n; i += 8) {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(x + i));
        vst1q_f32(y + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(y + i + 4, vcvt_high_f32_f16(h));
    }
}

static void gemm_f32(int n, const void *w, size_t ldw, int nr, const void *a, size_t lda, int nc,
                     float *out, size_t ldo) {
    const int n8 = n & ~7;
    for (int r = 0; r < nr; r++) {
        const float *wr = (const float *)((const uint8_t *)w + (size_t)r * ldw);
        for (int c = 0; c < nc; c++) {
            const float *ac = (const float *)((const uint8_t *)a + (size_t)c * lda);
            float64x2_t acc[4] = {vdupq_n_f64(0.0), vdupq_n_f64(0.0), vdupq_n_f64(0.0), vdupq_n_f64(0.0)};
            fdot_acc(acc, wr, ac, n8);
            out[(size_t)c * ldo + r] = fdot_finish(acc, wr + n8, ac + n8, n - n8);
        }
    }
}

/* Up to 8 x 8 (row, activation) pairs per pass; each FSEG-value segment of a row is converted
 * to float once and used for all of the pass's pairs. */
static void gemm_f16(int n, const void *w, size_t ldw, int nr, const void *a, size_t lda, int nc,
                     float *out, size_t ldo) {
    const int n8 = n & ~7, tail = n - n8;
    float wf[FSEG] __attribute__((aligned(16)));
    float af[MAX_NC][FSEG] __attribute__((aligned(16)));
    float64x2_t acc[8][MAX_NC][4];
    for (int r0 = 0; r0 < nr; r0 += 8) {
        const int nrr = EL_MIN(8, nr - r0);
        for (int c0 = 0; c0 < nc; c0 += MAX_NC) {
            const int ncc = EL_MIN(MAX_NC, nc - c0);
#define WROW(r) ((const el_half *)((const uint8_t *)w + (size_t)(r0 + (r)) * ldw))
#define AROW(c) ((const el_half *)((const uint8_t *)a + (size_t)(c0 + (c)) * lda))
            for (int r = 0; r < nrr; r++)
                for (int c = 0; c < ncc; c++)
                    for (int l = 0; l < 4; l++) acc[r][c][l] = vdupq_n_f64(0.0);
            for (int s = 0; s < n8; s += FSEG) {
                const int len = EL_MIN(FSEG, n8 - s);
                for (int c = 0; c < ncc; c++) halves_to_floats(AROW(c) + s, af[c], len);
                for (int r = 0; r < nrr; r++) {
                    halves_to_floats(WROW(r) + s, wf, len);
                    for (int c = 0; c < ncc; c++) fdot_acc(acc[r][c], wf, af[c], len);
                }
            }
            for (int r = 0; r < nrr; r++) {
                float wt[8];
                for (int i = 0; i < tail; i++) wt[i] = h2f(WROW(r) + n8 + i);
                for (int c = 0; c < ncc; c++) {
                    float at[8];
                    for (int i = 0; i < tail; i++) at[i] = h2f(AROW(c) + n8 + i);
                    out[(size_t)(c0 + c) * ldo + r0 + r] = fdot_finish(acc[r][c], wt, at, tail);
                }
            }
#undef WROW
#undef AROW
        }
    }
}

static void vec_dot_f32(int n, float *s, const void *x, const void *y) { gemm_f32(n, x, 0, 1, y, 0, 1, s, 1); }
static void vec_dot_f16(int n, float *s, const void *x, const void *y) { gemm_f16(n, x, 0, 1, y, 0, 1, s, 1); }

/* ------------------------------------------------------------------------------------------ */
/* float helpers of attention (el_vops). Conversions give el_half_to_float / el_float_to_half's
 * exact bits, NaNs included (the hardware would keep NaN payloads; the portable code does not). */

EL_INLINE float32x4_t h4_to_f32(uint16x4_t h) {
    const float32x4_t f = vcvt_f32_f16(vreinterpret_f16_u16(h));
    const uint32x4_t u = vmovl_u16(h);
    const uint32x4_t nan = vandq_u32(vceqq_u32(vandq_u32(u, vdupq_n_u32(0x7c00)), vdupq_n_u32(0x7c00)),
                                     vtstq_u32(u, vdupq_n_u32(0x3ff)));
    const uint32x4_t bits = vorrq_u32(vorrq_u32(vshlq_n_u32(vandq_u32(u, vdupq_n_u32(0x8000)), 16),
                                                vdupq_n_u32(0x7f800000)),
                                      vshlq_n_u32(vandq_u32(u, vdupq_n_u32(0x3ff)), 13));
    return vbslq_f32(nan, vreinterpretq_f32_u32(bits), f);
}

EL_INLINE uint16x4_t f32_to_h4(float32x4_t x) {
    const uint16x4_t h = vreinterpret_u16_f16(vcvt_f16_f32(x));  /* round to nearest even */
    const uint16x4_t num = vmovn_u32(vceqq_f32(x, x));
    const uint16x4_t qnan = vorr_u16(vand_u16(vshrn_n_u32(vreinterpretq_u32_f32(x), 16), vdup_n_u16(0x8000)),
                                     vdup_n_u16(0x7e00));
    return vbsl_u16(num, h, qnan);
}

static void f16_to_f32_neon(int n, const el_half *x, float *y) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, h4_to_f32(vld1_u16(x + i)));
    for (; i < n; i++) y[i] = el_half_to_float(x[i]);
}

static void f32_to_f16_neon(int n, const float *x, el_half *y) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, f32_to_h4(vld1q_f32(x + i)));
    for (; i < n; i++) y[i] = el_float_to_half(x[i]);
}

/* Attention and FFN helpers: the portable code's arithmetic (dispatch.c), lane for lane, so
 * the same bits for finite inputs (keys and values are converted by the hardware, which only
 * differs from el_half_to_float in NaN payloads). */

EL_INLINE float32x4_t h8_lo(const el_half *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

/* el_sum16 of 16 vectors, lane by lane: t_i = v[i+8] + v[i], u_i = t[i+4] + t[i], (u0+u2) + (u1+u3) */
EL_INLINE float32x4_t sum16_lanes(const float32x4_t *v) {
    float32x4_t t[8], u[4];
    for (int i = 0; i < 8; i++) t[i] = vaddq_f32(v[i + 8], v[i]);
    for (int i = 0; i < 4; i++) u[i] = vaddq_f32(t[i + 4], t[i]);
    return vaddq_f32(vaddq_f32(u[0], u[2]), vaddq_f32(u[1], u[3]));
}

/* el_sum16 of 16 consecutive floats */
EL_INLINE float sum16(const float *l) {
    const float32x4_t t0 = vaddq_f32(vld1q_f32(l + 8), vld1q_f32(l)), t1 = vaddq_f32(vld1q_f32(l + 12), vld1q_f32(l + 4));
    const float32x4_t u = vaddq_f32(t1, t0);
    return vpadds_f32(vadd_f32(vget_low_f32(u), vget_high_f32(u)));
}

/* lane class i (d = i mod 16) of every key summed in registers, d in order, then el_sum16 over
 * the classes with the keys in vector lanes */
static void qk_tile_neon(int hk, const float *q, int nq, int ldq, const el_half *kt, float *out) {
    for (int j = 0; j < nq; j++) {
        const float *qj = q + (size_t)j * ldq;
        float32x4_t cls[4][16];  /* [keys 4k..4k+3][class] */
        for (int i = 0; i < 16; i++) {
            float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
            for (int d = i; d < hk; d += 16) {
                const el_half *k = kt + (size_t)d * 16;
                const float qd = qj[d];
                a0 = vaddq_f32(a0, vmulq_n_f32(h8_lo(k), qd));
                a1 = vaddq_f32(a1, vmulq_n_f32(h8_lo(k + 4), qd));
                a2 = vaddq_f32(a2, vmulq_n_f32(h8_lo(k + 8), qd));
                a3 = vaddq_f32(a3, vmulq_n_f32(h8_lo(k + 12), qd));
            }
            cls[0][i] = a0;
            cls[1][i] = a1;
            cls[2][i] = a2;
            cls[3][i] = a3;
        }
        for (int k = 0; k < 4; k++) vst1q_f32(out + j * 16 + 4 * k, sum16_lanes(cls[k]));
    }
}

/* whether any of 16 weights is nonzero (NaN counts, -0 does not, as the twin's != 0) */
EL_INLINE int any16_neon(const float *w) {
    uint32x4_t z = vceqq_f32(vld1q_f32(w), vdupq_n_f32(0.0f));
    for (int i = 4; i < 16; i += 4) z = vandq_u32(z, vceqq_f32(vld1q_f32(w + i), vdupq_n_f32(0.0f)));
    return vminvq_u32(z) == 0;
}

static void pv_tiles_neon(int nd, int nt, const el_half *const *vt, int nh, const float *w, int ldw, float *acc,
                          int lda, int sets, int t0) {
    for (int r = 0; r < nh; r++)
        for (int t = 0; t < nt; t++) {
            const float *wt = w + (size_t)r * ldw + t * 16;
            if (!any16_neon(wt)) continue;
            const float32x4_t w0 = vld1q_f32(wt), w1 = vld1q_f32(wt + 4), w2 = vld1q_f32(wt + 8), w3 = vld1q_f32(wt + 12);
            float *a = acc + (size_t)r * lda + (sets == 4 ? (size_t)((t0 + t) & 3) * nd * 16 : 0);
            for (int d = 0; d < nd; d++) {
                const el_half *v = vt[t] + (size_t)d * 16;
                float *o = a + (size_t)d * 16;
                vst1q_f32(o, vaddq_f32(vld1q_f32(o), vmulq_f32(w0, h8_lo(v))));
                vst1q_f32(o + 4, vaddq_f32(vld1q_f32(o + 4), vmulq_f32(w1, h8_lo(v + 4))));
                vst1q_f32(o + 8, vaddq_f32(vld1q_f32(o + 8), vmulq_f32(w2, h8_lo(v + 8))));
                vst1q_f32(o + 12, vaddq_f32(vld1q_f32(o + 12), vmulq_f32(w3, h8_lo(v + 12))));
            }
        }
}

/* the 32 values d * q (exact) of a q8_0 / q4_0 block */
EL_INLINE void q8_0_values_neon(const block_q8_0 *x, float *v) {
    const float d = el_half_to_float(x->d);
    for (int i = 0; i < 32; i += 16) {
        const int8x16_t q = vld1q_s8(x->qs + i);
        const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
        vst1q_f32(v + i, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
        vst1q_f32(v + i + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), d));
        vst1q_f32(v + i + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
        vst1q_f32(v + i + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), d));
    }
}
EL_INLINE void q4_0_values_neon(const block_q4_0 *x, float *v) {
    const float d = el_half_to_float(x->d);
    const uint8x16_t b = vld1q_u8(x->qs);
    const int8x16_t k8 = vdupq_n_s8(8);
    const int8x16_t part[2] = {vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(15))), k8),
                               vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b, 4)), k8)};
    for (int p = 0; p < 2; p++) {
        const int16x8_t lo = vmovl_s8(vget_low_s8(part[p])), hi = vmovl_s8(vget_high_s8(part[p]));
        vst1q_f32(v + 16 * p, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
        vst1q_f32(v + 16 * p + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), d));
        vst1q_f32(v + 16 * p + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
        vst1q_f32(v + 16 * p + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), d));
    }
}

/* per row and slot, the row's blocks dequantized and w * x added with one fma */
static void pv_q_neon(int q4, int b0, int nd, int nt, const uint8_t *const *vt, size_t row_bytes, int nh,
                      const float *w, int ldw, float *acc, int lda) {
    float x[32];
    for (int r = 0; r < nh; r++)
        for (int t = 0; t < nt; t++) {
            const float *wt = w + (size_t)r * ldw + t * 16;
            if (!vt[t] || !any16_neon(wt)) continue;
            for (int l = 0; l < 16; l++) {
                const uint8_t *row = vt[t] + (size_t)l * row_bytes;
                for (int b = 0; b < nd / 32; b++) {
                    if (q4) q4_0_values_neon((const block_q4_0 *)row + b0 + b, x);
                    else q8_0_values_neon((const block_q8_0 *)row + b0 + b, x);
                    float *a = acc + (size_t)r * lda + b * 32;
                    for (int i = 0; i < 32; i += 4)
                        vst1q_f32(a + i, vfmaq_n_f32(vld1q_f32(a + i), vld1q_f32(x + i), wt[l]));
                }
            }
        }
}

static void pv_q8_0_neon(int b0, int nd, int nt, const uint8_t *const *vt, size_t row_bytes, int nh,
                         const float *w, int ldw, float *acc, int lda) {
    pv_q_neon(0, b0, nd, nt, vt, row_bytes, nh, w, ldw, acc, lda);
}
static void pv_q4_0_neon(int b0, int nd, int nt, const uint8_t *const *vt, size_t row_bytes, int nh,
                         const float *w, int ldw, float *acc, int lda) {
    pv_q_neon(1, b0, nd, nt, vt, row_bytes, nh, w, ldw, acc, lda);
}

/* Scores against a quantized key tile (vops.qk_q8_0 / qk_q4_0; layout in el_internal.h): per 32-dim
 * block, 4 keys at a time (16 bytes: 4 quants of each) dotted with 4 of the query's quants repeated
 * (sdot, or widening multiplies whose pairs fit int16: |k| <= 128, |q| <= 127), so the int32 lanes
 * are the blocks' exact dot products (q4_0: nibble - 8); then one fma per key of dk * dq, blocks in
 * order, as the twin. One query at a time (the tile is read again from L1). */
EL_INLINE int32x4_t dot4x4(int32x4_t acc, int8x16_t k, int8x16_t q, const int dp) {
    if (dp) return sdot(acc, k, q);
    return vpadalq_s16(acc, vpaddq_s16(vmull_s8(vget_low_s8(k), vget_low_s8(q)), vmull_high_s8(k, q)));
}

/* 4-byte group `lane` of q, repeated 4 times */
EL_INLINE int8x16_t group4(int8x16_t q, const int lane) {
    const int32x4_t v = vreinterpretq_s32_s8(q);
    switch (lane) {
    case 0: return vreinterpretq_s8_s32(vdupq_laneq_s32(v, 0));
    case 1: return vreinterpretq_s8_s32(vdupq_laneq_s32(v, 1));
    case 2: return vreinterpretq_s8_s32(vdupq_laneq_s32(v, 2));
    default: return vreinterpretq_s8_s32(vdupq_laneq_s32(v, 3));
    }
}

EL_INLINE void qk_q_neon(const int q4, int hk, const uint8_t *q, size_t ldq, int nq, const uint8_t *kt, float *out,
                         const int dp) {
    const int nb = hk / 32, ng = q4 ? 4 : 8;
    const uint8_t *qs = kt + (size_t)nb * 32;
    for (int j = 0; j < nq; j++) {
        float32x4_t acc[4];
        for (int k4 = 0; k4 < 4; k4++) acc[k4] = vdupq_n_f32(0.0f);
        for (int b = 0; b < nb; b++) {
            const block_q8_0 *qb = (const block_q8_0 *)(q + (size_t)j * ldq) + b;
            const int8x16_t q0 = vld1q_s8(qb->qs), q1 = vld1q_s8(qb->qs + 16);
            int32x4_t s[4];
            for (int k4 = 0; k4 < 4; k4++) s[k4] = vdupq_n_s32(0);
            for (int g = 0; g < ng; g++) {
                /* q8_0: quants 4g..4g+3; q4_0: 4g.. (low nibbles) and 16 + 4g.. (high ones) */
                const int8x16_t pa = q4 || g < 4 ? group4(q0, g & 3) : group4(q1, g & 3);
                const int8x16_t pb = group4(q1, g & 3);
                for (int k4 = 0; k4 < 4; k4++) {
                    const uint8x16_t v = vld1q_u8(qs + (((size_t)b * ng + g) * 16 + 4 * k4) * 4);
                    if (q4) {
                        const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))), vdupq_n_s8(8));
                        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
                        s[k4] = dot4x4(dot4x4(s[k4], lo, pa, dp), hi, pb, dp);
                    } else {
                        s[k4] = dot4x4(s[k4], vreinterpretq_s8_u8(v), pa, dp);
                    }
                }
            }
            const float32x4_t dq = vdupq_n_f32(h2f(&qb->d));
            for (int k4 = 0; k4 < 4; k4++) {
                const uint16x4_t h = vld1_u16((const uint16_t *)(kt + ((size_t)b * 16 + 4 * k4) * sizeof(el_half)));
                const float32x4_t dk = vcvt_f32_f16(vreinterpret_f16_u16(h));
                acc[k4] = vfmaq_f32(acc[k4], vmulq_f32(dk, dq), vcvtq_f32_s32(s[k4]));
            }
        }
        for (int k4 = 0; k4 < 4; k4++) vst1q_f32(out + (size_t)j * 16 + 4 * k4, acc[k4]);
    }
}

#define DEFINE_QK(SUF, DP)                                                                                     \
    LEVEL_ATTR(DP) static void qk_q8_0##SUF(int hk, const uint8_t *q, size_t ldq, const int32_t *qsum, int nq, \
                                            const uint8_t *kt, float *out) {                                  \
        (void)qsum;                                                                                            \
        qk_q_neon(0, hk, q, ldq, nq, kt, out, DP);                                                             \
    }                                                                                                          \
    LEVEL_ATTR(DP) static void qk_q4_0##SUF(int hk, const uint8_t *q, size_t ldq, const int32_t *qsum, int nq, \
                                            const uint8_t *kt, float *out) {                                  \
        (void)qsum;                                                                                            \
        qk_q_neon(1, hk, q, ldq, nq, kt, out, DP);                                                             \
    }
DEFINE_QK(_neon, 0)
DEFINE_QK(_dotprod, 1)
#undef DEFINE_QK

static void sum16_rows_neon(int n, const float *acc, float *out) {
    for (int i = 0; i < n; i++) out[i] = sum16(acc + 16 * i);
}

/* el_expf on 4 lanes: the same fmas; ldexpf(j, n) as two exact-operand products, j * 2^(n - e)
 * (exact: |n| <= 192, e = n >> 1) then * 2^e, rounded once as ldexpf rounds */
EL_INLINE float32x4_t expf4(float32x4_t x) {
    const float32x4_t r = vdupq_n_f32(0x1.8p23f);
    const float32x4_t n = vsubq_f32(vfmaq_f32(r, x, vdupq_n_f32(0x1.715476p+0f)), r);
    const float32x4_t b = vfmsq_f32(vfmsq_f32(x, n, vdupq_n_f32(0x1.62e4p-1f)), n, vdupq_n_f32(0x1.7f7d1cp-20f));
    const float32x4_t u = vmulq_f32(b, b);
    const float32x4_t p = vfmaq_f32(vdupq_n_f32(0x1.573e2ep-5f), vdupq_n_f32(0x1.0e4020p-7f), b);
    const float32x4_t q = vfmaq_f32(vdupq_n_f32(0x1.fffdb6p-2f), vdupq_n_f32(0x1.555e66p-3f), b);
    const float32x4_t j = vfmaq_f32(vfmaq_f32(vdupq_n_f32(1.0f), vdupq_n_f32(0x1.ffffecp-1f), b), vfmaq_f32(q, p, u), u);
    const int32x4_t ni = vcvtq_s32_f32(n), e = vshrq_n_s32(ni, 1);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vsubq_s32(ni, e), vdupq_n_s32(127)), 23));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(e, vdupq_n_s32(127)), 23));
    const float32x4_t v = vmulq_f32(vmulq_f32(j, s1), s2);
    /* |n| > 192: 0 or infinity */
    const uint32x4_t big = vcagtq_f32(n, vdupq_n_f32(192.0f));
    const float32x4_t edge = vbslq_f32(vclezq_f32(n), vdupq_n_f32(0.0f), vdupq_n_f32(INFINITY));
    return vbslq_f32(big, edge, v);
}

static double exp_sum_neon(int n, float *x, float max) {
    const float32x4_t m = vdupq_n_f32(max);
    double sum = 0.0;
    for (int i = 0; i < n; i += 16) {
        for (int k = 0; k < 16; k += 4) vst1q_f32(x + i + k, expf4(vsubq_f32(vld1q_f32(x + i + k), m)));
        sum += sum16(x + i);
    }
    return sum;
}

static void silu_mul_neon(int64_t n, float *g, const float *u) {
    const float32x4_t one = vdupq_n_f32(1.0f), zero = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(g + i);
        const float32x4_t s = vdivq_f32(x, vaddq_f32(one, expf4(vsubq_f32(zero, x))));
        vst1q_f32(g + i, vmulq_f32(s, vld1q_f32(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + el_expf(0.0f - g[i])) * u[i];
}

/* ------------------------------------------------------------------------------------------ */

/* Registers the NEON kernels, with sdot when `dotprod` (only if the CPU has it). BF16 stays generic. */
void el_register_neon_level(el_type_traits *t, int dotprod) {
#define SET(id, fn) (t[id].vec_dot = vec_dot_##fn, t[id].gemm = gemm_##fn)
    SET(EL_F32, f32);
    SET(EL_F16, f16);
    if (dotprod) {
        SET(EL_Q4_0, q4_0_dotprod); SET(EL_Q4_1, q4_1_dotprod); SET(EL_Q5_0, q5_0_dotprod);
        SET(EL_Q5_1, q5_1_dotprod); SET(EL_Q8_0, q8_0_dotprod);
        SET(EL_Q2_K, q2_K_dotprod); SET(EL_Q3_K, q3_K_dotprod); SET(EL_Q4_K, q4_K_dotprod);
        SET(EL_Q5_K, q5_K_dotprod); SET(EL_Q6_K, q6_K_dotprod);
        SET(EL_IQ4_NL, iq4_nl_dotprod); SET(EL_IQ4_XS, iq4_xs_dotprod);
    } else {
        SET(EL_Q4_0, q4_0_neon); SET(EL_Q4_1, q4_1_neon); SET(EL_Q5_0, q5_0_neon);
        SET(EL_Q5_1, q5_1_neon); SET(EL_Q8_0, q8_0_neon);
        SET(EL_Q2_K, q2_K_neon); SET(EL_Q3_K, q3_K_neon); SET(EL_Q4_K, q4_K_neon);
        SET(EL_Q5_K, q5_K_neon); SET(EL_Q6_K, q6_K_neon);
        SET(EL_IQ4_NL, iq4_nl_neon); SET(EL_IQ4_XS, iq4_xs_neon);
    }
#undef SET
#define SET_SMALL(id, fn) (t[id].vec_dot_small = vec_dot_##fn, t[id].gemm_small = gemm_##fn)
    if (dotprod) {
        SET_SMALL(EL_Q4_K, q4_K_small_dotprod); SET_SMALL(EL_Q6_K, q6_K_small_dotprod);
    } else {
        SET_SMALL(EL_Q4_K, q4_K_small_neon); SET_SMALL(EL_Q6_K, q6_K_small_neon);
    }
#undef SET_SMALL
    el_vops.f32_to_f16 = f32_to_f16_neon;
    el_vops.f16_to_f32 = f16_to_f32_neon;
    el_vops.qk_tile = qk_tile_neon;
    el_vops.qk_q8_0 = dotprod ? qk_q8_0_dotprod : qk_q8_0_neon;
    el_vops.qk_q4_0 = dotprod ? qk_q4_0_dotprod : qk_q4_0_neon;
    el_vops.pv_tiles = pv_tiles_neon;
    el_vops.pv_q8_0 = pv_q8_0_neon;
    el_vops.pv_q4_0 = pv_q4_0_neon;
    el_vops.sum16_rows = sum16_rows_neon;
    el_vops.exp_sum = exp_sum_neon;
    el_vops.silu_mul = silu_mul_neon;
}

int el_register_neon(el_type_traits *t) {
    const int dotprod = el_neon_has_dotprod();
    el_register_neon_level(t, dotprod);
    return dotprod;
}

#endif /* __aarch64__ */
