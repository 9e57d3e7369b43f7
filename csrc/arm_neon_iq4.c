/* AArch64 NEON kernels of IQ4_NL and IQ4_XS, at both levels (plain NEON and sdot;
 * arm_neon_common.h). The float steps are the generic twins' (iquants_generic.c) on exact integer
 * sums, so the results are their bits at both levels for any block bytes, and gemm's are
 * vec_dot's whatever the tile (tiled as the K-quants). Nibbles become table values by one tbl on
 * el_iq4nl_values. */
#if defined(__aarch64__)

#include "arm_neon_common.h"

/* the 32 table values of a packed group: values 0..15 in *lo, 16..31 in *hi */
EL_INLINE void iq4_group(const int8x16_t table, const uint8_t *qs, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vqtbl1q_s8(table, vandq_u8(v, vdupq_n_u8(0x0F)));
    *hi = vqtbl1q_s8(table, vshrq_n_u8(v, 4));
}

/* IQ4_NL, llama.cpp's repacked order: R weight rows (4 or 1, in float lanes) x nc activation
 * rows; per block the exact sum of its 32 products, acc = fma(sum, dw * da, acc) */
EL_INLINE void tile_iq4_nl(int nb, const uint8_t *w, size_t ldw, const int R, const uint8_t *a, size_t lda,
                           const int nc, float *out, size_t ldo, const int dp) {
    const int8x16_t table = vld1q_s8(el_iq4nl_values);
    float32x4_t acc[MAX_NC];
    for (int c = 0; c < nc; c++) acc[c] = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        int8x16_t lo[4], hi[4];
        const el_half *d[4];
        for (int r = 0; r < R; r++) {
            const block_iq4_nl *x = (const block_iq4_nl *)(w + (size_t)r * ldw) + b;
            iq4_group(table, x->qs, &lo[r], &hi[r]);
            d[r] = &x->d;
        }
        const float32x4_t dx = row_halves(d, R);
        for (int c = 0; c < nc; c++) {
            const block_q8_0 *y = (const block_q8_0 *)(a + (size_t)c * lda) + b;
            const int8x16_t y0 = vld1q_s8(y->qs), y1 = vld1q_s8(y->qs + 16);
            int32x4_t p[4];
            for (int r = 0; r < R; r++) p[r] = dot_s8(dot_s8(vdupq_n_s32(0), lo[r], y0, dp), hi[r], y1, dp);
            acc[c] = vfmaq_f32(acc[c], vcvtq_f32_s32(row_sums(p, R)), vmulq_n_f32(dx, h2f(&y->d)));
        }
    }
    store_tile(acc, R, nc, out, ldo);
}

/* IQ4_XS. small (below 8 activation rows): ggml_vec_dot_iq4_xs_q8_K's order, per (row, activation
 * row) the twin's 8 integer lanes per super-block (lane i: scale * products of values 4i..4i+3 of
 * each group of 32; lanes 0-3 and 4-7 as two int32x4), then the 8 float lanes of fma(d * d_act,
 * lane, lane), el_hsum8 at the end; else llama.cpp's tiled gemm's: the lanes' total, acc =
 * fma(isum * d, d_act, acc). R weight rows (4 or 1) x nc activation rows, each super-block
 * decoded once. */
EL_INLINE void tile_iq4_xs(const int small, int nb, const uint8_t *w, size_t ldw, const int R, const uint8_t *a,
                           size_t lda, const int nc, float *out, size_t ldo, const int dp) {
    const int8x16_t table = vld1q_s8(el_iq4nl_values);
    float32x4_t acc[MAX_NC][4][2];
    float acc1[MAX_NC][4];
    int8_t q[4][QK_K] __attribute__((aligned(16)));
    int32_t sc[4][8];
    float dw[4];
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < R; r++) acc[c][r][0] = acc[c][r][1] = vdupq_n_f32(0.0f), acc1[c][r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const el_half *dptr[4];
        for (int r = 0; r < R; r++) {
            const block_iq4_xs *x = (const block_iq4_xs *)(w + (size_t)r * ldw) + b;
            for (int g = 0; g < 8; g++) {
                int8x16_t lo, hi;
                iq4_group(table, x->qs + 16 * g, &lo, &hi);
                vst1q_s8(q[r] + 32 * g, lo);
                vst1q_s8(q[r] + 32 * g + 16, hi);
                sc[r][g] = (((x->scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | (((x->scales_h >> (2 * g)) & 3) << 4)) - 32;
            }
            dptr[r] = &x->d;
        }
        const float32x4_t dx = row_halves(dptr, R);
        vst1q_f32(dw, dx);
        for (int c = 0; c < nc; c++) {
            const block_q8_K *y = (const block_q8_K *)(a + (size_t)c * lda) + b;
            const float32x4_t d = vmulq_n_f32(dx, y->d);  /* lane r: d * d_act */
            for (int r = 0; r < R; r++) {
                int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);
                for (int g = 0; g < 8; g++) {
                    lo = vmlaq_n_s32(lo, dot4_s8(vld1q_s8(q[r] + 32 * g), vld1q_s8(y->qs + 32 * g), dp, 0), sc[r][g]);
                    hi = vmlaq_n_s32(hi, dot4_s8(vld1q_s8(q[r] + 32 * g + 16), vld1q_s8(y->qs + 32 * g + 16), dp, 0),
                                     sc[r][g]);
                }
                if (!small) {
                    acc1[c][r] = fmaf((float)vaddvq_s32(vaddq_s32(lo, hi)) * dw[r], y->d, acc1[c][r]);
                    continue;
                }
                acc[c][r][0] = fma_lane(acc[c][r][0], vcvtq_f32_s32(lo), d, r);
                acc[c][r][1] = fma_lane(acc[c][r][1], vcvtq_f32_s32(hi), d, r);
            }
        }
    }
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < R; r++) out[(size_t)c * ldo + r] = small ? hsum8(acc[c][r][0], acc[c][r][1]) : acc1[c][r];
}

EL_INLINE void tile_iq4(const int T, const int small, int nb, const uint8_t *w, size_t ldw, const int R,
                        const uint8_t *a, size_t lda, const int nc, float *out, size_t ldo, const int dp) {
    if (T == EL_IQ4_NL) tile_iq4_nl(nb, w, ldw, R, a, lda, nc, out, ldo, dp);
    else tile_iq4_xs(small, nb, w, ldw, R, a, lda, nc, out, ldo, dp);
}

/* 4 rows at a time (a remainder row alone) by up to MAX_NC activation rows; decode (one
 * activation row) gets its own copy with the count known */
EL_INLINE void gemm_iq4(const int T, const int small, int n, const uint8_t *w, size_t ldw, int nr, const uint8_t *a,
                        size_t lda, int nc, float *out, size_t ldo, const int dp) {
    const int nb = n / (T == EL_IQ4_NL ? QK4_NL : QK_K);
    for (int c0 = 0; c0 < nc; c0 += MAX_NC) {
        const int m = EL_MIN(MAX_NC, nc - c0);
        const uint8_t *A = a + (size_t)c0 * lda;
        float *O = out + (size_t)c0 * ldo;
        int r = 0;
        if (m == 1)
            for (; r + 4 <= nr; r += 4) tile_iq4(T, small, nb, w + (size_t)r * ldw, ldw, 4, A, lda, 1, O + r, ldo, dp);
        else
            for (; r + 4 <= nr; r += 4) tile_iq4(T, small, nb, w + (size_t)r * ldw, ldw, 4, A, lda, m, O + r, ldo, dp);
        for (; r < nr; r++) tile_iq4(T, small, nb, w + (size_t)r * ldw, ldw, 1, A, lda, m, O + r, ldo, dp);
    }
}

DEFINE_QGEMM_LEVELS(iq4_nl, gemm_iq4, EL_IQ4_NL, 0)
DEFINE_QGEMM_LEVELS(iq4_xs, gemm_iq4, EL_IQ4_XS, 0)
DEFINE_QGEMM_LEVELS(iq4_xs_small, gemm_iq4, EL_IQ4_XS, 1)

void el_neon_register_iq4(el_type_traits *t, int dp) {
    NEON_SET(t, EL_IQ4_NL, iq4_nl, dp);
    NEON_SET(t, EL_IQ4_XS, iq4_xs, dp);
    NEON_SET_SMALL(t, EL_IQ4_XS, iq4_xs_small, dp);
}

#endif /* __aarch64__ */
