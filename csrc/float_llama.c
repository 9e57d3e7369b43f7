/* Float weights (F32, F16) times their activation rows in llama.cpp's own order on its AVX-512
 * builds (the reference outputs we are held to), for llama_order steps (the single-stream API).
 * The batch-invariant kernels sum a float dot product through double lanes; llama.cpp does not:
 *
 * - ggml_vec_dot_f32 / ggml_vec_dot_f16 (one activation row: ggml_mul_mat with one column, and
 *   ggml_mul_mat_id - the experts - at any batch size; also ggml_mul_mat where tinyBLAS declines):
 *   four 16-lane float accumulators over each 64 values (value i of a chunk in accumulator i / 16,
 *   lane i % 16), one rounding per product-sum (FMA); combined (a0 + a2) + (a1 + a3), the lanes
 *   reduced by _mm512_reduce_add_ps's tree (el_sum16); values past the last multiple of 64 added
 *   after it - in double for F16, in float (one FMA each, as GCC contracts `sumf += x[i]*y[i]`)
 *   for F32.
 * - tinyBLAS (llamafile_sgemm: ggml_mul_mat with two or more columns, when the weight has a
 *   multiple of 4 rows and of 16 values per row): one 16-lane accumulator per output, lane i
 *   taking values i, i + 16, ... by FMA, reduced by el_sum16.
 *
 * An F16 weight meets activations rounded to F16, so every product is exact in float and the
 * FMA is an add; F32 products need fmaf. Portable C only: every ISA path gives these bits. */
#include "engine_internal.h"

static inline float value(int type, const uint8_t *p, int i) {
    return type == EL_F32 ? ((const float *)p)[i] : el_half_to_float(((const el_half *)p)[i]);
}

/* acc + x * y rounded once */
static inline float madd(int type, float x, float y, float acc) {
    return type == EL_F32 ? fmaf(x, y, acc) : acc + x * y;  /* f16 x f16 is exact in float */
}

static inline __attribute__((always_inline)) float dot_vec(const int type, int n, const uint8_t *x, const uint8_t *y) {
    float acc[4][16] = {{0}};
    const int np = n & ~63;
    for (int i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 16; l++) {
                const int d = i + 16 * j + l;
                acc[j][l] = madd(type, value(type, x, d), value(type, y, d), acc[j][l]);
            }
    for (int l = 0; l < 16; l++) {
        acc[0][l] = acc[0][l] + acc[2][l];
        acc[1][l] = acc[1][l] + acc[3][l];
    }
    for (int l = 0; l < 16; l++) acc[0][l] = acc[0][l] + acc[1][l];
    const float r = el_sum16(acc[0]);
    if (type == EL_F16) {
        double s = (double)r;
        for (int i = np; i < n; i++) s += (double)(value(type, x, i) * value(type, y, i));
        return (float)s;
    }
    float s = r;
    for (int i = np; i < n; i++) s = fmaf(value(type, x, i), value(type, y, i), s);
    return s;
}

static inline __attribute__((always_inline)) float dot_tinyblas(const int type, int n, const uint8_t *x, const uint8_t *y) {
    float acc[16] = {0};
    for (int i = 0; i < n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] = madd(type, value(type, x, i + l), value(type, y, i + l), acc[l]);
    return el_sum16(acc);
}

int el_float_llama_type(int type) { return type == EL_F32 || type == EL_F16; }

int el_float_llama_tinyblas(int64_t rows, int n, int cols) {
    return cols >= 2 && rows % 4 == 0 && n % 16 == 0;
}

/* the loops with the type and the order constant, so each is compiled on its own */
static inline __attribute__((always_inline)) void gemm(const int type, const int tinyblas, int n, const uint8_t *w,
                                                       size_t ldw, int nr, const uint8_t *a, size_t lda, int nc,
                                                       float *out, size_t ldo) {
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++) {
            const uint8_t *x = w + (size_t)r * ldw, *y = a + (size_t)c * lda;
            out[(size_t)c * ldo + r] = tinyblas ? dot_tinyblas(type, n, x, y) : dot_vec(type, n, x, y);
        }
}

void el_float_llama_gemm(int type, int tinyblas, int n, const uint8_t *w, size_t ldw, int nr, const uint8_t *a,
                         size_t lda, int nc, float *out, size_t ldo) {
    if (type == EL_F16) {
        if (tinyblas) gemm(EL_F16, 1, n, w, ldw, nr, a, lda, nc, out, ldo);
        else gemm(EL_F16, 0, n, w, ldw, nr, a, lda, nc, out, ldo);
    } else {
        if (tinyblas) gemm(EL_F32, 1, n, w, ldw, nr, a, lda, nc, out, ldo);
        else gemm(EL_F32, 0, n, w, ldw, nr, a, lda, nc, out, ldo);
    }
}
