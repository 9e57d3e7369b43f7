/* Reference twins for the K-quants (256-value super-blocks). Implemented in kquants_generic.c.
 * quantize_row_*_ref writes the same bytes as ggml's quantize_row_*_ref (no importance matrix). */

void quantize_row_q2_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q3_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q4_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q5_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q6_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q8_K_ref(const float *x, void *y, int64_t k);

void dequantize_row_q2_K(const void *x, float *y, int64_t k);
void dequantize_row_q3_K(const void *x, float *y, int64_t k);
void dequantize_row_q4_K(const void *x, float *y, int64_t k);
void dequantize_row_q5_K(const void *x, float *y, int64_t k);
void dequantize_row_q6_K(const void *x, float *y, int64_t k);
void dequantize_row_q8_K(const void *x, float *y, int64_t k);

void vec_dot_q2_K_q8_K_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q3_K_q8_K_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q4_K_q8_K_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q5_K_q8_K_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q6_K_q8_K_generic(int n, float *s, const void *x, const void *y);
/* the orders llama.cpp uses for small batches (el_small_rows): Q4_K's repacked gemv, Q3_K's,
 * Q5_K's and Q6_K's vec_dot */
void vec_dot_q3_K_q8_K_small_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q4_K_q8_K_small_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q5_K_q8_K_small_generic(int n, float *s, const void *x, const void *y);
void vec_dot_q6_K_q8_K_small_generic(int n, float *s, const void *x, const void *y);
