/* Reference twins for float and legacy (32-value block) types. Implemented in quants_generic.c.
 * Row length k / n is a multiple of the block size. Layouts: see common.h (ggml-common.h).
 * quantize_row_*_ref writes the same bytes as ggml's quantize_row_*_ref for the same input. */

void quantize_row_f16_ref(const float *x, void *y, int64_t k);
void dequantize_row_f16(const void *x, float *y, int64_t k);
void quantize_row_bf16_ref(const float *x, void *y, int64_t k);
void dequantize_row_bf16(const void *x, float *y, int64_t k);

void quantize_row_q4_0_ref(const float *x, void *y, int64_t k);
void quantize_row_q4_1_ref(const float *x, void *y, int64_t k);
void quantize_row_q5_0_ref(const float *x, void *y, int64_t k);
void quantize_row_q5_1_ref(const float *x, void *y, int64_t k);
void quantize_row_q8_0_ref(const float *x, void *y, int64_t k);
void quantize_row_q8_1_ref(const float *x, void *y, int64_t k);
/* activation quantizers: same layout, x86-ggml arithmetic (x * 127/max, round half to even) */
void quantize_row_q8_0(const float *x, void *y, int64_t k);
void quantize_row_q8_1(const float *x, void *y, int64_t k);

void dequantize_row_q4_0(const void *x, float *y, int64_t k);
void dequantize_row_q4_1(const void *x, float *y, int64_t k);
void dequantize_row_q5_0(const void *x, float *y, int64_t k);
void dequantize_row_q5_1(const void *x, float *y, int64_t k);
void dequantize_row_q8_0(const void *x, float *y, int64_t k);

/* *s = dot(dequant(x), dequant(y)) over n values; y is the activation row in its type */
void vec_dot_f32_f32_generic(int n, float *s, const void *x, const void *y);
void vec_dot_f16_f16_generic(int n, float *s, const void *x, const void *y);
void vec_dot_bf16_bf16_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q4_0_q8_0_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q4_1_q8_1_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q5_0_q8_0_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q5_1_q8_1_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q8_0_q8_0_generic(int n, float *s, const void *x, const void *y);
/* the same in the batch order (quants_generic.c): one float update per block */
void vec_dot_q4_1_q8_1_batch_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q5_0_q8_0_batch_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q5_1_q8_1_batch_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q8_0_q8_0_batch_generic(int n, float *s, const void *x, const void *y);
