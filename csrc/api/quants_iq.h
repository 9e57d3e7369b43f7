/* Reference twins for the non-linear 4-bit types IQ4_NL (32-value blocks) and IQ4_XS (256-value
 * super-blocks). Implemented in iquants_generic.c; layouts in common.h (ggml-common.h).
 * quantize_row_*_ref writes the bytes of ggml_quantize_chunk without an importance matrix (what
 * llama-quantize writes); the dot products take Q8_0 (IQ4_NL) and Q8_K (IQ4_XS) activations. */

void quantize_row_iq4_nl_ref(const float *x, void *y, int64_t k);
void quantize_row_iq4_xs_ref(const float *x, void *y, int64_t k);

void dequantize_row_iq4_nl(const void *x, float *y, int64_t k);
void dequantize_row_iq4_xs(const void *x, float *y, int64_t k);

void vec_dot_iq4_nl_q8_0_generic(int n, float *s, const void *x, const void *y);
void vec_dot_iq4_xs_q8_K_generic(int n, float *s, const void *x, const void *y);
/* below 8 activation rows (el_small_rows): ggml_vec_dot_iq4_xs_q8_K's order */
void vec_dot_iq4_xs_q8_K_small_generic(int n, float *s, const void *x, const void *y);
