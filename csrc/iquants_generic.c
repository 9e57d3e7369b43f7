/* Reference twins of the non-linear 4-bit types: IQ4_NL (32-value blocks, one f16 scale) and
 * IQ4_XS (256-value super-blocks: an f16 scale and a 6-bit scale per 32 values). Every value is
 * a scale times one of the 16 numbers of el_iq4nl_values (ggml's kvalues_iq4nl).
 *
 * Quantizers: the bytes ggml_quantize_chunk writes without an importance matrix
 * (ggml-quants.c quantize_iq4_nl / quantize_iq4_xs: quantize_row_iq4_nl_impl with ntry 7), same
 * float operations in the same order. (ggml's quantize_row_iq4_nl_ref, only its CPU
 * from_float, tries no scales and is not what files hold.)
 *
 * Dot products, in the order llama.cpp's x86 build computes them:
 * - IQ4_NL against Q8_0: ggml repacks IQ4_NL matrices of 8k rows (8 rows interleaved) and its
 *   AVX2/AVX-512 gemm and gemv over them keep one float accumulator per (row, activation row):
 *   per block the exact integer sum of the 32 products, then acc = fma(sum, dw * da, acc).
 * - IQ4_XS against Q8_K: from 8 activation rows llama.cpp's tiled gemm (ggml-cpu/tiled): per
 *   super-block the exact integer isum = sum over its groups of scale * dot, then acc =
 *   fma(isum * d, d_act, acc) (k_term); below 8 rows (the small-batch order, el_small_rows)
 *   ggml_vec_dot_iq4_xs_q8_K (AVX2; no repacking): 8 integer lanes per super-block, lane i the
 *   sum over its 32-value groups of scale * (the products of values 4i..4i+3 of the group);
 *   acc[i] = fma(d * d_act, lane i, acc[i]); el_hsum8 at the end.
 * Every SIMD path reproduces these bits. */

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "common.h"
#include "api/quants_iq.h"

const int8_t el_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

#define GROUP_MAX_EPS 1e-15f /* ggml-quants.c: a group whose largest |x| is below this gets scale 0 */
#define NTRY 7               /* trial scales on each side of the first one (quantize_iq4_nl / _xs) */

/* SEGMENT[n + 127] is the i with v[i] <= n < v[i + 1] for each integer n in [-127, 112]: as the
 * table values are integers, every x in [n, n + 1) lies between the same two of them (runs of
 * 23, 21, 18, 16, 14, 13, 12, 11, 12, 12, 13, 15, 16, 20, 24: the gaps between the values) */
static const int8_t SEGMENT[240] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5,
    5, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9,
    9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11,
    11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12,
    12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13,
    14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14};

/* index of the table value nearest x, the lower one on a tie (ggml's best_index_int8; its
 * binary search ends on the same pair and makes the same comparison; a NaN gives 15 in both) */
static inline int nearest_index(float x) {
    const int8_t *v = el_iq4nl_values;
    if (x <= v[0]) return 0;
    if (!(x < v[15])) return 15;
    const int i = SEGMENT[(int)floorf(x) + 127];
    return x - v[i] < v[i + 1] - x ? i : i + 1;
}

/* x^2-weighted least-squares scale of one group of 32 values: from the scale that maps the
 * value of largest magnitude onto -127, then from 2*NTRY+1 inverse scales (-127 + t) / max,
 * each with the nearest table values, keeping the best fit. 0 for an all-but-zero group. */
static float group_scale(const float *x) {
    float w[32], amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
        w[j] = x[j] * x[j];
        const float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (amax < GROUP_MAX_EPS) return 0.0f;
    const float v0 = (float)el_iq4nl_values[0];
    float id = 1 / (-max / v0);
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; j++) {
        const float q = (float)el_iq4nl_values[nearest_index(id * x[j])];
        sumqx += w[j] * q * x[j];
        sumq2 += w[j] * q * q;
    }
    float d = sumq2 > 0 ? sumqx / sumq2 : 0.0f;
    float best = d * sumqx;
    for (int t = -NTRY; t <= NTRY; t++) {
        id = (float)(t + el_iq4nl_values[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const float q = (float)el_iq4nl_values[nearest_index(id * x[j])];
            sumqx += w[j] * q * x[j];
            sumq2 += w[j] * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* 32 values at x as the nearest table values after scaling by id, packed: value j in the low
 * nibble of qs[j], value j+16 in its high nibble */
static void pack_group(const float *x, float id, uint8_t *qs) {
    uint8_t L[32];
    for (int j = 0; j < 32; j++) L[j] = (uint8_t)nearest_index(id * x[j]);
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

void quantize_row_iq4_nl_ref(const float *x, void *vy, int64_t k) {
    block_iq4_nl *y = vy;
    for (int64_t i = 0; i < k / QK4_NL; i++, x += QK4_NL) {
        const float d = group_scale(x);
        y[i].d = el_float_to_half(d);
        pack_group(x, d != 0.0f ? 1 / d : 0.0f, y[i].qs);  /* the float scale, not its half */
    }
}

/* IQ4_XS: the groups' scales, then d = -(the scale of largest magnitude) / 32 and each group's
 * scale as round(scale / d) in [-32, 31], the values requantized against d * that */
void quantize_row_iq4_xs_ref(const float *x, void *vy, int64_t k) {
    block_iq4_xs *y = vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float scales[QK_K / 32], max_scale = 0.0f, amax_scale = 0.0f;
        for (int g = 0; g < QK_K / 32; g++) {
            scales[g] = group_scale(x + 32 * g);
            if (fabsf(scales[g]) > amax_scale) {
                amax_scale = fabsf(scales[g]);
                max_scale = scales[g];
            }
        }
        const float d = -max_scale / 32;  /* -0.0 for an all-zero super-block, as ggml */
        y[i].d = el_float_to_half(d);
        const float id = d != 0.0f ? 1 / d : 0.0f;
        uint16_t sh = 0;
        memset(y[i].scales_l, 0, sizeof y[i].scales_l);
        for (int g = 0; g < QK_K / 32; g++) {
            const int l = EL_MAX(-32, EL_MIN(31, el_nearest_int(id * scales[g])));
            const float dl = d * (float)l;
            pack_group(x + 32 * g, dl != 0.0f ? 1 / dl : 0.0f, y[i].qs + 16 * g);
            y[i].scales_l[g / 2] |= (uint8_t)(((l + 32) & 0xF) << (4 * (g % 2)));
            sh |= (uint16_t)(((l + 32) >> 4) << (2 * g));
        }
        y[i].scales_h = sh;
    }
}

/* 6-bit scale of group g (0..7) of an IQ4_XS super-block, minus 32 */
static inline int iq4_xs_scale(const block_iq4_xs *b, int g) {
    return (((b->scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | (((b->scales_h >> (2 * g)) & 3) << 4)) - 32;
}

/* the 32 table values of a packed group, in value order */
static inline void unpack_group(const uint8_t *qs, int q[32]) {
    for (int j = 0; j < 16; j++) {
        q[j] = el_iq4nl_values[qs[j] & 0xF];
        q[j + 16] = el_iq4nl_values[qs[j] >> 4];
    }
}

void dequantize_row_iq4_nl(const void *vx, float *y, int64_t k) {
    const block_iq4_nl *x = vx;
    for (int64_t i = 0; i < k / QK4_NL; i++, y += QK4_NL) {
        const float d = el_half_to_float(x[i].d);
        int q[32];
        unpack_group(x[i].qs, q);
        for (int j = 0; j < 32; j++) y[j] = d * (float)q[j];
    }
}

void dequantize_row_iq4_xs(const void *vx, float *y, int64_t k) {
    const block_iq4_xs *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = el_half_to_float(x[i].d);
        for (int g = 0; g < QK_K / 32; g++, y += 32) {
            const float dl = d * (float)iq4_xs_scale(&x[i], g);
            int q[32];
            unpack_group(x[i].qs + 16 * g, q);
            for (int j = 0; j < 32; j++) y[j] = dl * (float)q[j];
        }
    }
}

void vec_dot_iq4_nl_q8_0_generic(int n, float *s, const void *vx, const void *vy) {
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    float acc = 0.0f;
    for (int i = 0; i < n / QK4_NL; i++) {
        int q[32], sum = 0;
        unpack_group(x[i].qs, q);
        for (int j = 0; j < 32; j++) sum += q[j] * y[i].qs[j];
        acc = fmaf((float)sum, el_half_to_float(x[i].d) * el_half_to_float(y[i].d), acc);
    }
    *s = acc;
}

void vec_dot_iq4_xs_q8_K_generic(int n, float *s, const void *vx, const void *vy) {
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    float acc = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        int isum = 0;
        for (int g = 0; g < QK_K / 32; g++) {
            int q[32], dot = 0;
            unpack_group(x[i].qs + 16 * g, q);
            for (int j = 0; j < 32; j++) dot += q[j] * y[i].qs[32 * g + j];
            isum += iq4_xs_scale(&x[i], g) * dot;
        }
        acc = fmaf((float)isum * el_half_to_float(x[i].d), y[i].d, acc);
    }
    *s = acc;
}

void vec_dot_iq4_xs_q8_K_small_generic(int n, float *s, const void *vx, const void *vy) {
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    float acc[8] = {0};
    for (int i = 0; i < n / QK_K; i++) {
        int lane[8] = {0};
        for (int g = 0; g < QK_K / 32; g++) {
            int q[32];
            unpack_group(x[i].qs + 16 * g, q);
            const int sc = iq4_xs_scale(&x[i], g);
            for (int l = 0; l < 8; l++) {
                const int8_t *a = y[i].qs + 32 * g + 4 * l;
                lane[l] += sc * (q[4 * l] * a[0] + q[4 * l + 1] * a[1] + q[4 * l + 2] * a[2] + q[4 * l + 3] * a[3]);
            }
        }
        const float d = el_half_to_float(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lane[l], acc[l]);
    }
    *s = el_hsum8(acc);
}
