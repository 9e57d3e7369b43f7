/* PLACEHOLDER: replaced by the real implementation before merge. */
#include <stdlib.h>
#include "common.h"

void quantize_row_q2_K_ref(const float *x, void *y, int64_t k) { abort(); }
void quantize_row_q3_K_ref(const float *x, void *y, int64_t k) { abort(); }
void quantize_row_q4_K_ref(const float *x, void *y, int64_t k) { abort(); }
void quantize_row_q5_K_ref(const float *x, void *y, int64_t k) { abort(); }
void quantize_row_q6_K_ref(const float *x, void *y, int64_t k) { abort(); }
void quantize_row_q8_K_ref(const float *x, void *y, int64_t k) { abort(); }
void dequantize_row_q2_K(const void *x, float *y, int64_t k) { abort(); }
void dequantize_row_q3_K(const void *x, float *y, int64_t k) { abort(); }
void dequantize_row_q4_K(const void *x, float *y, int64_t k) { abort(); }
void dequantize_row_q5_K(const void *x, float *y, int64_t k) { abort(); }
void dequantize_row_q6_K(const void *x, float *y, int64_t k) { abort(); }
void dequantize_row_q8_K(const void *x, float *y, int64_t k) { abort(); }
void vec_dot_q2_K_q8_K_generic(int n, float *s, const void *x, const void *y) { abort(); }
void vec_dot_q3_K_q8_K_generic(int n, float *s, const void *x, const void *y) { abort(); }
void vec_dot_q4_K_q8_K_generic(int n, float *s, const void *x, const void *y) { abort(); }
void vec_dot_q5_K_q8_K_generic(int n, float *s, const void *x, const void *y) { abort(); }
void vec_dot_q6_K_q8_K_generic(int n, float *s, const void *x, const void *y) { abort(); }
