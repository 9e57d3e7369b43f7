/* Reference twins of the float and legacy (32-value block) row functions: quantize, dequantize,
 * dot product. Plain portable C11, no intrinsics: every SIMD kernel is tested against these.
 *
 * Algorithms and rounding follow ggml's quantize_row_*_ref / dequantize_row_* (ggml-quants.c)
 * and its scalar ggml_vec_dot_*_generic (ggml-cpu/quants.c, ggml-cpu/vec.cpp), so the
 * quantizers write the same bytes as ggml and the dots evaluate the same float expressions. */

/* Byte-exactness needs every float operation rounded on its own: forbid fusing a*b+c into an
 * FMA (GCC contracts by default in gnu modes wherever the target has FMA, e.g. aarch64). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <float.h>
#include <math.h>
#include "common.h"
#include "api/quants_legacy.h"

/* ---------------------------------------------------------------- block statistics */

/* The value of largest magnitude, sign kept; the first one wins a tie (ggml's Q4_0 / Q5_0 scale). */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static float absmax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = EL_MAX(amax, fabsf(x[j]));
    return amax;
}

static void min_max(const float *x, int n, float *min, float *max) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *min = lo;
    *max = hi;
}

/* 32 5-bit values -> 16 bytes of low nibbles (value j and j+16 share byte j) and a 32-bit mask
 * of fifth bits (bit j for value j), as in ggml's block_q5_0 / block_q5_1. */
static void pack_5bit(const uint8_t q[32], uint8_t qs[16], uint8_t qh_bytes[4]) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
        qh |= (uint32_t)((q[j] >> 4) & 1u) << j;
        qh |= (uint32_t)((q[j + 16] >> 4) & 1u) << (j + 16);
    }
    memcpy(qh_bytes, &qh, 4); /* little-endian, as GGUF stores it (and every target we build for) */
}

/* inverse of pack_5bit: q[j] in 0..31 */
static void unpack_5bit(const uint8_t qs[16], const uint8_t qh_bytes[4], int q[32]) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0x0F) | (int)(((qh >> j) & 1u) << 4);
        q[j + 16] = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
    }
}

/* ---------------------------------------------------------------- F16 / BF16 */

void quantize_row_f16_ref(const float *x, void *vy, int64_t k) {
    el_half *y = vy;
    for (int64_t i = 0; i < k; i++) y[i] = el_float_to_half(x[i]);
}

void dequantize_row_f16(const void *vx, float *y, int64_t k) {
    const el_half *x = vx;
    for (int64_t i = 0; i < k; i++) y[i] = el_half_to_float(x[i]);
}

void quantize_row_bf16_ref(const float *x, void *vy, int64_t k) {
    el_bf16 *y = vy;
    for (int64_t i = 0; i < k; i++) y[i] = el_float_to_bf16(x[i]);
}

void dequantize_row_bf16(const void *vx, float *y, int64_t k) {
    const el_bf16 *x = vx;
    for (int64_t i = 0; i < k; i++) y[i] = el_bf16_to_float(x[i]);
}

/* ---------------------------------------------------------------- quantizers */

/* Q4_0: d = (value of largest magnitude) / -8, q = min(15, trunc(x/d + 8.5)), value = (q - 8) * d */
void quantize_row_q4_0_ref(const float *x, void *vy, int64_t k) {
    block_q4_0 *y = vy;
    const int64_t nb = k / QK4_0;
    for (int64_t i = 0; i < nb; i++, x += QK4_0) {
        const float d = signed_absmax(x, QK4_0) / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = el_float_to_half(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int q0 = EL_MIN(15, (int)(x[j] * id + 8.5f));
            const int q1 = EL_MIN(15, (int)(x[j + QK4_0 / 2] * id + 8.5f));
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* Q4_1: d = (max - min) / 15, m = min, q = min(15, trunc((x - min)/d + 0.5)), value = q*d + m */
void quantize_row_q4_1_ref(const float *x, void *vy, int64_t k) {
    block_q4_1 *y = vy;
    const int64_t nb = k / QK4_1;
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        float min, max;
        min_max(x, QK4_1, &min, &max);
        const float d = (max - min) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = el_float_to_half(d);
        y[i].m = el_float_to_half(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int q0 = EL_MIN(15, (int)((x[j] - min) * id + 0.5f));
            const int q1 = EL_MIN(15, (int)((x[j + QK4_1 / 2] - min) * id + 0.5f));
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* Q5_0: as Q4_0 with 5 bits: d = (value of largest magnitude) / -16, offset 16 */
void quantize_row_q5_0_ref(const float *x, void *vy, int64_t k) {
    block_q5_0 *y = vy;
    const int64_t nb = k / QK5_0;
    for (int64_t i = 0; i < nb; i++, x += QK5_0) {
        const float d = signed_absmax(x, QK5_0) / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = el_float_to_half(d);
        uint8_t q[QK5_0];
        for (int j = 0; j < QK5_0; j++) q[j] = (uint8_t)EL_MIN(31, (int)(x[j] * id + 16.5f));
        pack_5bit(q, y[i].qs, y[i].qh);
    }
}

/* Q5_1: as Q4_1 with 5 bits: d = (max - min) / 31 */
void quantize_row_q5_1_ref(const float *x, void *vy, int64_t k) {
    block_q5_1 *y = vy;
    const int64_t nb = k / QK5_1;
    for (int64_t i = 0; i < nb; i++, x += QK5_1) {
        float min, max;
        min_max(x, QK5_1, &min, &max);
        const float d = (max - min) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = el_float_to_half(d);
        y[i].m = el_float_to_half(min);
        uint8_t q[QK5_1];
        /* (x - min) * id <= 31 up to rounding, so trunc(. + 0.5) stays <= 31 (ggml does not clamp) */
        for (int j = 0; j < QK5_1; j++) q[j] = (uint8_t)EL_MIN(31, (int)((x[j] - min) * id + 0.5f));
        pack_5bit(q, y[i].qs, y[i].qh);
    }
}

/* Q8_0: d = max|x| / 127, q = roundf(x/d) (halves away from zero, as C's roundf) */
void quantize_row_q8_0_ref(const float *x, void *vy, int64_t k) {
    block_q8_0 *y = vy;
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        const float d = absmax(x, QK8_0) / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = el_float_to_half(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* Q8_1: Q8_0 plus s = d * sum(q), rounded to half from the float product */
void quantize_row_q8_1_ref(const float *x, void *vy, int64_t k) {
    block_q8_1 *y = vy;
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++, x += QK8_1) {
        const float d = absmax(x, QK8_1) / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = el_float_to_half(d);
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = el_float_to_half((float)sum * d);
    }
}

/* Activation quantizers (the rows a matmul's weights are dotted with). Same blocks as the
 * reference quantizers, with the arithmetic of ggml's x86 activation path: scale by 127/max
 * (not 1/d) and round half to even. Weights keep the _ref functions above. */
void quantize_row_q8_0(const float *x, void *vy, int64_t k) {
    block_q8_0 *y = vy;
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        const float amax = absmax(x, QK8_0);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = el_float_to_half(amax / 127);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)el_nearest_int(x[j] * id);
    }
}

void quantize_row_q8_1(const float *x, void *vy, int64_t k) {
    block_q8_1 *y = vy;
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++, x += QK8_1) {
        const float amax = absmax(x, QK8_1), d = amax / 127;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = el_float_to_half(d);
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            y[i].qs[j] = (int8_t)el_nearest_int(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = el_float_to_half((float)sum * d);
    }
}

/* ---------------------------------------------------------------- dequantizers */

void dequantize_row_q4_0(const void *vx, float *y, int64_t k) {
    const block_q4_0 *x = vx;
    const int64_t nb = k / QK4_0;
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        const float d = el_half_to_float(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = (float)((x[i].qs[j] & 0x0F) - 8) * d;
            y[j + QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void dequantize_row_q4_1(const void *vx, float *y, int64_t k) {
    const block_q4_1 *x = vx;
    const int64_t nb = k / QK4_1;
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        const float d = el_half_to_float(x[i].d);
        const float m = el_half_to_float(x[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (float)(x[i].qs[j] & 0x0F) * d + m;
            y[j + QK4_1 / 2] = (float)(x[i].qs[j] >> 4) * d + m;
        }
    }
}

void dequantize_row_q5_0(const void *vx, float *y, int64_t k) {
    const block_q5_0 *x = vx;
    const int64_t nb = k / QK5_0;
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        const float d = el_half_to_float(x[i].d);
        int q[QK5_0];
        unpack_5bit(x[i].qs, x[i].qh, q);
        for (int j = 0; j < QK5_0; j++) y[j] = (float)(q[j] - 16) * d;
    }
}

void dequantize_row_q5_1(const void *vx, float *y, int64_t k) {
    const block_q5_1 *x = vx;
    const int64_t nb = k / QK5_1;
    for (int64_t i = 0; i < nb; i++, y += QK5_1) {
        const float d = el_half_to_float(x[i].d);
        const float m = el_half_to_float(x[i].m);
        int q[QK5_1];
        unpack_5bit(x[i].qs, x[i].qh, q);
        for (int j = 0; j < QK5_1; j++) y[j] = (float)q[j] * d + m;
    }
}

void dequantize_row_q8_0(const void *vx, float *y, int64_t k) {
    const block_q8_0 *x = vx;
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        const float d = el_half_to_float(x[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

/* ---------------------------------------------------------------- dot products */

/* Float types: products in float, summed in double (ggml's scalar ggml_vec_dot_f32/f16/bf16). */
void vec_dot_f32_f32_generic(int n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * y[i]);
    *s = (float)sum;
}

void vec_dot_f16_f16_generic(int n, float *s, const void *vx, const void *vy) {
    const el_half *x = vx, *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(el_half_to_float(x[i]) * el_half_to_float(y[i]));
    *s = (float)sum;
}

void vec_dot_bf16_bf16_generic(int n, float *s, const void *vx, const void *vy) {
    const el_bf16 *x = vx, *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(el_bf16_to_float(x[i]) * el_bf16_to_float(y[i]));
    *s = (float)sum;
}

/* Quantized types: integer dot per block, scaled and summed in float.
 *
 * The legacy types but Q4_0 have two orders:
 * - the llama order (vec_dot_*_generic; llama_order steps, i.e. the single-stream API): the one
 *   llama.cpp's x86 builds use (its AVX2 vec_dot_*_q8_* and tinyBLAS's Q8_0-activation gemm),
 *   which the reference outputs we are held to come from. Per block, 8 float lanes: lane i takes
 *   the exact integer sum of the products of values 4i..4i+3 and adds it times d = dx * dy with
 *   one fma; lanes are summed at the end by el_hsum8 (common.h). Types with a min add
 *   sum(m * y.s) through a separate scalar chain of fmas, added last.
 * - the batch order (vec_dot_*_batch_generic; the batched engine's batch-invariant steps): per
 *   block the exact integer sum isum of its 32 products, then ONE float update
 *   acc = fmaf((float)isum, dx * dy, acc), block after block from 0 (as ggml's scalar
 *   ggml_vec_dot_q8_0_q8_0_generic, with the fma spelled out). (float)isum and dx * dy (two
 *   halves) are exact, so the fma is the only rounding: any SIMD layout of the integer sums gives
 *   these bits, which is what lets the SIMD kernels put 16 columns in the lanes of one register.
 *   Types with a min: summs = fmaf(m, y.s, summs) block after block, and the result acc + summs.
 * Q4_0 has only the second: llama.cpp's x86 builds (AVX2 and up) repack Q4_0 matrices (8 rows
 * interleaved, ggml-cpu/repack.cpp) and their gemv and gemm keep one accumulator per (row,
 * column) updated by fma(isum, dw * da, acc) per block; logits of a Q4_0 SmolLM2 measured
 * bit-equal to llama.cpp's this way and up to 2.05 apart with the 8 lanes (the exceptions, as for
 * IQ4_NL and Q4_K: a matrix of rows not a multiple of 8, and token_embd used as the output, which
 * llama.cpp does not repack).
 * Every SIMD path reproduces these bits. */
static inline void legacy_lanes(float acc[8], float d, const int q[32], const int8_t *y) {
    for (int i = 0; i < 8; i++) {
        const int v = q[4 * i] * y[4 * i] + q[4 * i + 1] * y[4 * i + 1] + q[4 * i + 2] * y[4 * i + 2] + q[4 * i + 3] * y[4 * i + 3];
        acc[i] = fmaf(d, (float)v, acc[i]);
    }
}

static inline void unpack_4bit(const uint8_t qs[16], int offset, int q[32]) {
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0x0F) - offset;
        q[j + 16] = (qs[j] >> 4) - offset;
    }
}

/* dot(q*dx + mx, qy*dy) over a block = dx*dy*sum(q*qy) + mx * (dy*sum(qy)), the last factor being y.s */
void vec_dot_q4_1_q8_1_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    float acc[8] = {0}, summs = 0.0f;
    for (int i = 0; i < n / QK8_1; i++) {
        int q[32];
        unpack_4bit(x[i].qs, 0, q);
        legacy_lanes(acc, el_half_to_float(x[i].d) * el_half_to_float(y[i].d), q, y[i].qs);
        summs = fmaf(el_half_to_float(x[i].m), el_half_to_float(y[i].s), summs);
    }
    *s = el_hsum8(acc) + summs;
}

void vec_dot_q5_0_q8_0_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    float acc[8] = {0};
    for (int i = 0; i < n / QK8_0; i++) {
        int q[QK5_0];
        unpack_5bit(x[i].qs, x[i].qh, q);
        for (int j = 0; j < QK5_0; j++) q[j] -= 16;
        legacy_lanes(acc, el_half_to_float(x[i].d) * el_half_to_float(y[i].d), q, y[i].qs);
    }
    *s = el_hsum8(acc);
}

void vec_dot_q5_1_q8_1_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    float acc[8] = {0}, summs = 0.0f;
    for (int i = 0; i < n / QK8_1; i++) {
        int q[QK5_1];
        unpack_5bit(x[i].qs, x[i].qh, q);
        legacy_lanes(acc, el_half_to_float(x[i].d) * el_half_to_float(y[i].d), q, y[i].qs);
        summs = fmaf(el_half_to_float(x[i].m), el_half_to_float(y[i].s), summs);
    }
    *s = el_hsum8(acc) + summs;
}

void vec_dot_q8_0_q8_0_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    float acc[8] = {0};
    for (int i = 0; i < n / QK8_0; i++) {
        int q[32];
        for (int j = 0; j < 32; j++) q[j] = x[i].qs[j];
        legacy_lanes(acc, el_half_to_float(x[i].d) * el_half_to_float(y[i].d), q, y[i].qs);
    }
    *s = el_hsum8(acc);
}


/* ---------------------------------------------------------------- the batch order */

static inline int dot32(const int q[32], const int8_t *y) {
    int s = 0;
    for (int j = 0; j < 32; j++) s += q[j] * y[j];
    return s;
}

/* (Q4_0 has one order, this one: above) */
void vec_dot_q4_0_q8_0_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    float acc = 0.0f;
    for (int i = 0; i < n / QK8_0; i++) {
        int q[32];
        unpack_4bit(x[i].qs, 8, q);
        acc = fmaf((float)dot32(q, y[i].qs), el_half_to_float(x[i].d) * el_half_to_float(y[i].d), acc);
    }
    *s = acc;
}

void vec_dot_q4_1_q8_1_batch_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    float acc = 0.0f, summs = 0.0f;
    for (int i = 0; i < n / QK8_1; i++) {
        int q[32];
        unpack_4bit(x[i].qs, 0, q);
        acc = fmaf((float)dot32(q, y[i].qs), el_half_to_float(x[i].d) * el_half_to_float(y[i].d), acc);
        summs = fmaf(el_half_to_float(x[i].m), el_half_to_float(y[i].s), summs);
    }
    *s = acc + summs;
}

void vec_dot_q5_0_q8_0_batch_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    float acc = 0.0f;
    for (int i = 0; i < n / QK8_0; i++) {
        int q[QK5_0];
        unpack_5bit(x[i].qs, x[i].qh, q);
        for (int j = 0; j < QK5_0; j++) q[j] -= 16;
        acc = fmaf((float)dot32(q, y[i].qs), el_half_to_float(x[i].d) * el_half_to_float(y[i].d), acc);
    }
    *s = acc;
}

void vec_dot_q5_1_q8_1_batch_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    float acc = 0.0f, summs = 0.0f;
    for (int i = 0; i < n / QK8_1; i++) {
        int q[QK5_1];
        unpack_5bit(x[i].qs, x[i].qh, q);
        acc = fmaf((float)dot32(q, y[i].qs), el_half_to_float(x[i].d) * el_half_to_float(y[i].d), acc);
        summs = fmaf(el_half_to_float(x[i].m), el_half_to_float(y[i].s), summs);
    }
    *s = acc + summs;
}

void vec_dot_q8_0_q8_0_batch_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    float acc = 0.0f;
    for (int i = 0; i < n / QK8_0; i++) {
        int q[32];
        for (int j = 0; j < 32; j++) q[j] = x[i].qs[j];
        acc = fmaf((float)dot32(q, y[i].qs), el_half_to_float(x[i].d) * el_half_to_float(y[i].d), acc);
    }
    *s = acc;
}
