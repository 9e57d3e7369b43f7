/* AArch64 NEON versions of el_vops, the vector helpers of attention and the FFN (el_internal.h):
 * half <-> float conversions, q.k against f16 and quantized (q8_0 / q4_0) key tiles, p.v over f16
 * and quantized value tiles, the softmax's exp and sum, SiLU. Each gives the portable code's bits
 * (dispatch.c, lane for lane); the quantized-key scores have a plain NEON and an sdot level
 * (arm_neon_common.h). */
#if defined(__aarch64__)

#include "arm_neon_common.h"

/* Conversions give el_half_to_float / el_float_to_half's exact bits, NaNs included (the hardware
 * would keep NaN payloads; the portable code does not). */

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
                          int lda, int sets, int t0, const el_half *const *next, int nn) {
    (void)next, (void)nn;
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

/* a pair of slots of a value tile (its quant bytes at p, interleaved: el_internal.h) as int16 (q4_0:
 * nibble - 8), de-interleaved by vld2q: x[s][k] holds dims 8k .. 8k + 7 of slot 2p + s */
EL_INLINE void pv_q_pair_neon(int q4, const uint8_t *p, int16x8_t x[2][4]) {
    int8x16_t part[2][2];  /* [slot][dims 0..15, 16..31] */
    if (q4) {
        const uint8x16x2_t b = vld2q_u8(p);  /* each slot's 16 qs bytes */
        const int8x16_t k8 = vdupq_n_s8(8);
        for (int s = 0; s < 2; s++) {
            part[s][0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b.val[s], vdupq_n_u8(15))), k8);  /* dims 0..15 */
            part[s][1] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b.val[s], 4)), k8);            /* dims 16..31 */
        }
    } else {
        for (int h = 0; h < 2; h++) {
            const int8x16x2_t b = vld2q_s8((const int8_t *)p + 32 * h);
            part[0][h] = b.val[0];
            part[1][h] = b.val[1];
        }
    }
    for (int s = 0; s < 2; s++)
        for (int h = 0; h < 2; h++) {
            x[s][2 * h] = vmovl_s8(vget_low_s8(part[s][h]));
            x[s][2 * h + 1] = vmovl_high_s8(part[s][h]);
        }
}

/* The integer weights of nr rows for the 16 slots of value tile vt (tile t of the weights),
 * el_internal.h's contract (as dispatch.c's pv_q_weights): wd = w * d (exact), m = the largest of
 * 2^-48 and |wd|, p = 2^(141 - E) from m's exponent bits E; wq[r] = wd p rounded to nearest even
 * (fcvtns), saturated to int16 (sqxtn), sc[r] = 1 / p */
EL_INLINE void pv_q_wq_neon(const uint8_t *vt, int nr, const float *w, int ldw, int t, int16_t (*wq)[16], float *sc) {
    float32x4_t d[4];
    for (int i = 0; i < 4; i++) d[i] = h4_to_f32(vld1_u16((const uint16_t *)vt + 4 * i));  /* the tile's scales */
    for (int r = 0; r < nr; r++) {
        float32x4_t wd[4];
        for (int i = 0; i < 4; i++) wd[i] = vmulq_f32(vld1q_f32(w + (size_t)r * ldw + t * 16 + 4 * i), d[i]);
        const float32x4_t m4 = vmaxq_f32(vmaxq_f32(vabsq_f32(wd[0]), vabsq_f32(wd[1])), vmaxq_f32(vabsq_f32(wd[2]), vabsq_f32(wd[3])));
        const float m = vmaxvq_f32(vmaxq_f32(m4, vdupq_n_f32(0x1p-48f)));
        const float pw = el_pvq_powers(m, &sc[r]);
        for (int i = 0; i < 2; i++)
            vst1q_s16(wq[r] + 8 * i, vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(wd[2 * i], pw))),
                                                  vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(wd[2 * i + 1], pw)))));
    }
}

/* nr <= 3 rows over the value tiles [0, nt) of a chunk (nt <= 64), row r skipping the tiles marked
 * in skip[r] (as the twin's skip): per tile, each slot's quants (widened to int16 once for all the
 * rows) times the row's integer weight added to int32 sums with widening multiply-adds (smlal:
 * exact), then the sums converted to float and added to the rows' chunk sums (in registers, added
 * to acc at the end) times 1 / p with one fma (the product exact), as x86_avx512.c's
 * pv_q_block_avx512 */
EL_INLINE void pv_q_block_neon(int q4, int nt, const uint8_t *const *vt, int nr, const float *w, int ldw, float *acc,
                               int lda, const uint64_t *skip) {
    const size_t pb = el_vq_pair_bytes(q4 ? EL_Q4_0 : EL_Q8_0);
    int16_t wq[3][16];
    float sc[3];
    float32x4_t s[3][8];
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < 8; i++) s[r][i] = vdupq_n_f32(0.0f);
    uint64_t none = ~(uint64_t)0;  /* the tiles no row takes */
    for (int r = 0; r < nr; r++) none &= skip[r];
    int took = 0;
    for (int t = 0; t < nt; t++) {
        if (none >> t & 1) continue;
        took = 1;
        pv_q_wq_neon(vt[t], nr, w, ldw, t, wq, sc);
        int32x4_t is[3][8];
        for (int r = 0; r < nr; r++)
            for (int i = 0; i < 8; i++) is[r][i] = vdupq_n_s32(0);
        const uint8_t *pair = el_vq_pairs(vt[t]);
        for (int l = 0; l < 16; l += 2, pair += pb) {
            int16x8_t x[2][4];
            pv_q_pair_neon(q4, pair, x);
            for (int r = 0; r < nr; r++)
                for (int sl = 0; sl < 2; sl++) {
                    const int16_t wl = wq[r][l + sl];
                    for (int k = 0; k < 4; k++) {
                        is[r][2 * k] = vmlal_n_s16(is[r][2 * k], vget_low_s16(x[sl][k]), wl);
                        is[r][2 * k + 1] = vmlal_high_n_s16(is[r][2 * k + 1], x[sl][k], wl);
                    }
                }
        }
        for (int r = 0; r < nr; r++) {
            if (skip[r] >> t & 1) continue;
            for (int i = 0; i < 8; i++) s[r][i] = vfmaq_n_f32(s[r][i], vcvtq_f32_s32(is[r][i]), sc[r]);
        }
    }
    for (int r = 0; r < nr && took; r++)
        for (int i = 0; i < 8; i++) {
            float *p = acc + (size_t)r * lda + 4 * i;
            vst1q_f32(p, vaddq_f32(vld1q_f32(p), s[r][i]));
        }
}

/* pv_q8_0 / pv_q4_0: rows in groups of up to 3 over the tiles any of them takes (absent tiles and
 * a row's all-zero weights skipped, as the twin does), so the quants are widened once for the group */
static void pv_q_neon(int q4, int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda) {
    uint64_t skip[3];  /* per row, the tiles it skips */
    for (int r0 = 0; r0 < nh; r0 += 3) {
        const int nr = EL_MIN(3, nh - r0);
        for (int r = 0; r < nr; r++) {
            skip[r] = 0;
            for (int t = 0; t < nt; t++)
                skip[r] |= (uint64_t)!(vt[t] && any16_neon(w + (size_t)(r0 + r) * ldw + t * 16)) << t;
        }
        float *ab = acc + (size_t)r0 * lda;
        const float *wg = w + (size_t)r0 * ldw;
        switch (nr) {  /* (the row count a compile-time constant: accumulators in registers) */
        case 3: pv_q_block_neon(q4, nt, vt, 3, wg, ldw, ab, lda, skip); break;
        case 2: pv_q_block_neon(q4, nt, vt, 2, wg, ldw, ab, lda, skip); break;
        default: pv_q_block_neon(q4, nt, vt, 1, wg, ldw, ab, lda, skip); break;
        }
    }
}

static void pv_q8_0_neon(int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda) {
    pv_q_neon(0, nt, vt, nh, w, ldw, acc, lda);
}
static void pv_q4_0_neon(int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda) {
    pv_q_neon(1, nt, vt, nh, w, ldw, acc, lda);
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
                                            const uint8_t *kt, float *out, const uint8_t *next) {             \
        (void)qsum;                                                                                            \
        el_prefetch_l2(next, el_kq_tile_bytes(EL_Q8_0, hk));                                                   \
        qk_q_neon(0, hk, q, ldq, nq, kt, out, DP);                                                             \
    }                                                                                                          \
    LEVEL_ATTR(DP) static void qk_q4_0##SUF(int hk, const uint8_t *q, size_t ldq, const int32_t *qsum, int nq, \
                                            const uint8_t *kt, float *out, const uint8_t *next) {             \
        (void)qsum;                                                                                            \
        el_prefetch_l2(next, el_kq_tile_bytes(EL_Q4_0, hk));                                                   \
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

/* exp_sums: the exponentials, each 16's el_sum16 kept in sums (unless NULL) and summed in double */
static double exp_sums_neon(int n, float *x, float max, float *sums) {
    const float32x4_t m = vdupq_n_f32(max);
    double sum = 0.0;
    for (int i = 0; i < n; i += 16) {
        for (int k = 0; k < 16; k += 4) vst1q_f32(x + i + k, expf4(vsubq_f32(vld1q_f32(x + i + k), m)));
        const float s = sum16(x + i);
        if (sums) sums[i / 16] = s;
        sum += s;
    }
    return sum;
}

static void scale_max_neon(int nh, const float *src, float scale, float *dst, size_t ldd, float *lmax) {
    for (int r = 0; r < nh; r++)
        for (int k = 0; k < 16; k += 4) {
            const float32x4_t v = vmulq_n_f32(vld1q_f32(src + r * 16 + k), scale), m = vld1q_f32(lmax + r * 16 + k);
            vst1q_f32(dst + (size_t)r * ldd + k, v);
            vst1q_f32(lmax + r * 16 + k, vbslq_f32(vcgtq_f32(v, m), v, m));  /* v > m ? v : m */
        }
}

static void f16_scale_neon(int n, float *x, float s) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(x + i, h4_to_f32(f32_to_h4(vmulq_n_f32(vld1q_f32(x + i), s))));
    for (; i < n; i++) x[i] = el_half_to_float(el_float_to_half(x[i] * s));
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

void el_neon_register_vops(int dp) {
    el_vops.f32_to_f16 = f32_to_f16_neon;
    el_vops.f16_to_f32 = f16_to_f32_neon;
    el_vops.qk_tile = qk_tile_neon;
    el_vops.qk_q8_0 = dp ? qk_q8_0_dotprod : qk_q8_0_neon;
    el_vops.qk_q4_0 = dp ? qk_q4_0_dotprod : qk_q4_0_neon;
    el_vops.pv_tiles = pv_tiles_neon;
    el_vops.pv_q8_0 = pv_q8_0_neon;
    el_vops.pv_q4_0 = pv_q4_0_neon;
    el_vops.sum16_rows = sum16_rows_neon;
    el_vops.silu_mul = silu_mul_neon;
    el_vops.scale_max = scale_max_neon;
    el_vops.exp_sums = exp_sums_neon;
    el_vops.f16_scale = f16_scale_neon;
}

#endif /* __aarch64__ */
