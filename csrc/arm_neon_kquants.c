/* AArch64 NEON kernels of the K-quants Q2_K .. Q6_K (256-value super-blocks against Q8_K), and
 * the small-batch orders of Q3_K, Q4_K, Q5_K and Q6_K, at both levels (plain NEON and sdot;
 * arm_neon_common.h).
 *
 * Numerics: integer sums are exact (int32) and the float steps are the generic twins'
 * (kquants_generic.c): the per-super-block fma chain (Q4_K: per quarter super-block), weight
 * rows in vector lanes; the small-batch kernels of Q3_K, Q5_K and Q6_K as the legacy types' 8
 * float lanes per (row, activation) pair. Results are the twins' bits at both levels, and gemm's are vec_dot's
 * whatever the tile.
 *
 * gemm tiles: 4 weight rows by up to 8 activation rows, each block decoded once. */
#if defined(__aarch64__)

#include "arm_neon_common.h"

_Static_assert(offsetof(block_q5_K, dmin) == offsetof(block_q4_K, dmin) &&
               offsetof(block_q5_K, scales) == offsetof(block_q4_K, scales), "Q5_K begins as Q4_K");

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

/* The small-batch orders of Q3_K, Q5_K and Q6_K (vec_dot_*_q8_K_small_generic: ggml's x86
 * vec_dot): 8 integer lanes per super-block, lane k over values 4k..4k+3 of every 32, of
 * scale * q * q8, then as the legacy types' 8 float lanes. Q6_K's lanes take q + 32 and are seeded
 * with -32 * (sc[2k] * bsum[2k] + sc[2k+1] * bsum[2k+1]); Q5_K adds its mins' scalar chain summs =
 * fma(-d_act * dmin, sum m * bsum, summs) at the end. R weight rows by nc activation rows, each
 * decoded block used for all of them. */
EL_INLINE void tile_k8s(const int T, int nb, const uint8_t *w, size_t ldw, const int R, const uint8_t *a,
                        size_t lda, const int nc, float *out, size_t ldo, const int dp) {
    const size_t bb = T == EL_Q3_K ? sizeof(block_q3_K) : T == EL_Q5_K ? sizeof(block_q5_K) : sizeof(block_q6_K);
    float32x4_t acc[MAX_NC][4][2];
    float summs[MAX_NC][4];
    kblock kb[4];
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < R; r++) acc[c][r][0] = acc[c][r][1] = vdupq_n_f32(0.0f), summs[c][r] = 0.0f;
    const int8x16_t m32 = vdupq_n_s8(32);
    for (int b = 0; b < nb; b++) {
        const el_half *dptr[4], *mptr[4];
        int16x8_t sc0[4], sc1[4];  /* Q6_K: the 16 scales as int16 */
        for (int r = 0; r < R; r++) {
            const uint8_t *x = w + (size_t)r * ldw + (size_t)b * bb;
            k_decode(T, x, &kb[r]);
            dptr[r] = kb[r].d, mptr[r] = T == EL_Q5_K ? kb[r].dmin : kb[r].d;
            if (T == EL_Q6_K) {
                for (int i = 0; i < QK_K; i += 16) vst1q_s8(kb[r].q + i, vaddq_s8(vld1q_s8(kb[r].q + i), m32));
                const int8x16_t sc = vld1q_s8(((const block_q6_K *)x)->scales);
                sc0[r] = vmovl_s8(vget_low_s8(sc));
                sc1[r] = vmovl_high_s8(sc);
            }
        }
        const float32x4_t dx = row_halves(dptr, R), mx = row_halves(mptr, R);
        for (int c = 0; c < nc; c++) {
            const block_q8_K *y = (const block_q8_K *)(a + (size_t)c * lda) + b;
            const float32x4_t d = vmulq_n_f32(dx, y->d);  /* lane r: d_act * d */
            float dmn[4];
            vst1q_f32(dmn, vmulq_n_f32(mx, -y->d));        /* Q5_K, lane r: -d_act * dmin */
            for (int r = 0; r < R; r++) {
                int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);
                if (T == EL_Q6_K) {  /* 32 * (sc . bsum) over the pairs of 16-groups 2k, 2k+1 */
                    const int16x8_t b0 = vld1q_s16(y->bsums), b1 = vld1q_s16(y->bsums + 8);
                    lo = vmulq_n_s32(vpaddq_s32(vmull_s16(vget_low_s16(sc0[r]), vget_low_s16(b0)), vmull_high_s16(sc0[r], b0)), -32);
                    hi = vmulq_n_s32(vpaddq_s32(vmull_s16(vget_low_s16(sc1[r]), vget_low_s16(b1)), vmull_high_s16(sc1[r], b1)), -32);
                }
                int mins = 0;
                for (int j = 0; j < 8; j++) {  /* 32-value chunk j: 16-groups 2j, 2j+1 (Q5_K: one scale) */
                    const int8_t *qv = kb[r].q + 32 * j;
                    const int32_t s0 = T == EL_Q5_K ? kb[r].sc[j] : kb[r].sc[2 * j];
                    const int32_t s1 = T == EL_Q5_K ? kb[r].sc[j] : kb[r].sc[2 * j + 1];
                    lo = vmlaq_n_s32(lo, dot4_s8(vld1q_s8(qv), vld1q_s8(y->qs + 32 * j), dp, 1), s0);
                    hi = vmlaq_n_s32(hi, dot4_s8(vld1q_s8(qv + 16), vld1q_s8(y->qs + 32 * j + 16), dp, 1), s1);
                    if (T == EL_Q5_K) mins += kb[r].mn[j] * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
                }
                acc[c][r][0] = fma_lane(acc[c][r][0], vcvtq_f32_s32(lo), d, r);
                acc[c][r][1] = fma_lane(acc[c][r][1], vcvtq_f32_s32(hi), d, r);
                if (T == EL_Q5_K) summs[c][r] = fmaf(dmn[r], (float)mins, summs[c][r]);
            }
        }
    }
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < R; r++) {
            const float h = hsum8(acc[c][r][0], acc[c][r][1]);
            out[(size_t)c * ldo + r] = T == EL_Q5_K ? h + summs[c][r] : h;
        }
}

/* K-quants, 4 rows at a time (a remainder row alone) by up to MAX_NC activation rows; the
 * one-activation-row case (decode) gets its own copy with the count known */
EL_INLINE void tile_kq(const int T, const int small, int nb, const uint8_t *w, size_t ldw, const int R,
                       const uint8_t *a, size_t lda, const int nc, float *out, size_t ldo, const int dp) {
    if (small && T != EL_Q4_K) tile_k8s(T, nb, w, ldw, R, a, lda, nc, out, ldo, dp);
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

DEFINE_QGEMM_LEVELS(q2_K, gemm_kq, EL_Q2_K, 0)
DEFINE_QGEMM_LEVELS(q3_K, gemm_kq, EL_Q3_K, 0)
DEFINE_QGEMM_LEVELS(q4_K, gemm_kq, EL_Q4_K, 0)
DEFINE_QGEMM_LEVELS(q5_K, gemm_kq, EL_Q5_K, 0)
DEFINE_QGEMM_LEVELS(q6_K, gemm_kq, EL_Q6_K, 0)
DEFINE_QGEMM_LEVELS(q4_K_small, gemm_kq, EL_Q4_K, 1)
DEFINE_QGEMM_LEVELS(q3_K_small, gemm_kq, EL_Q3_K, 1)
DEFINE_QGEMM_LEVELS(q5_K_small, gemm_kq, EL_Q5_K, 1)
DEFINE_QGEMM_LEVELS(q6_K_small, gemm_kq, EL_Q6_K, 1)

void el_neon_register_kquants(el_type_traits *t, int dp) {
    NEON_SET(t, EL_Q2_K, q2_K, dp);
    NEON_SET(t, EL_Q3_K, q3_K, dp);
    NEON_SET(t, EL_Q4_K, q4_K, dp);
    NEON_SET(t, EL_Q5_K, q5_K, dp);
    NEON_SET(t, EL_Q6_K, q6_K, dp);
    NEON_SET_SMALL(t, EL_Q4_K, q4_K_small, dp);
    NEON_SET_SMALL(t, EL_Q3_K, q3_K_small, dp);
    NEON_SET_SMALL(t, EL_Q5_K, q5_K_small, dp);
    NEON_SET_SMALL(t, EL_Q6_K, q6_K_small, dp);
}

#endif /* __aarch64__ */
