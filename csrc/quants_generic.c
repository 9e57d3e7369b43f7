/* PLACEHOLDER: replaced by the real implementation before merge. */
#include <stdlib.h>
#include "common.h"

void quantize_row_f16_ref(const float *x, void *y, int64_t k) { abort(); }
void dequantize_row_f16(const void *x, float *y, int64_t k) { abort(); }
void quantize_row_bf16_ref(const float *x, void *y, int64_t k) { abort(); }
void dequantize_row_bf16(const void *x, float *y, int64_t k) { abort(); }
void quantize_row_q4_0_ref(const float *x, void *y, int64_t k) { abort(); }
void quantize_row_q4_1_ref(const float *x, void *y, int64_t k) { abort(); }
void quantize_row_q5_0_ref(const float *x, void *y, int64_t k) { abort(); }
void quantize_row_q5_1_ref(const float *x, void *y, int64_t k) { abort(); }
void quantize_row_q8_0_ref(const float *x, void *y, int64_t k) { abort(); }
void quantize_row_q8_1_ref(const float *x, void *y, int64_t k) { abort(); }
void dequantize_row_q4_0(const void *x, float *y, int64_t k) { abort(); }
void dequantize_row_q4_1(const void *x, float *y, int64_t k) { abort(); }
void dequantize_row_q5_0(const void *x, float *y, int64_t k) { abort(); }
void dequantize_row_q5_1(const void *x, float *y, int64_t k) { abort(); }
void dequantize_row_q8_0(const void *x, float *y, int64_t k) { abort(); }
void vec_dot_f32_f32_generic(int n, float *s, const void *x, const void *y) { abort(); }
void vec_dot_f16_f16_generic(int n, float *s, const void *x, const void *y) { abort(); }
void vec_dot_bf16_bf16_generic(int n, float *s, const void *x, const void *y) { abort(); }
void vec_dot_q4_0_q8_0_generic(int n, float *s, const void *x, const void *y) { abort(); }
void vec_dot_q4_1_q8_1_generic(int n, float *s, const void *x, const void *y) { abort(); }
void vec_dot_q5_0_q8_0_generic(int n, float *s, const void *x, const void *y) { abort(); }
void vec_dot_q5_1_q8_1_generic(int n, float *s, const void *x, const void *y) { abort(); }
void vec_dot_q8_0_q8_0_generic(int n, float *s, const void *x, const void *y) { abort(); }
