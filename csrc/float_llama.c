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
 * FMA is an add; F32 products need fmaf. Portable C (halves converted to floats by the ISA's
 * converter, exact for every half): every ISA path gives these bits. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "engine_internal.h"

/* n values of a row from value i as floats (F16: the ISA's converter, exact for every half) */
static inline __attribute__((always_inline)) const float *floats(int type, const uint8_t *p, int i, int n, float *buf) {
    if (type == EL_F32) return (const float *)p + i;
    el_vops.f16_to_f32(n, (const el_half *)p + i, buf);
    return buf;
}

/* acc + x * y rounded once */
static inline __attribute__((always_inline)) float madd(int type, float x, float y, float acc) {
    return type == EL_F32 ? fmaf(x, y, acc) : acc + x * y;  /* f16 x f16 is exact in float */
}

/* an F16 dot product's values past the last multiple of 64, added to r in double (as ggml) */
static inline float f16_tail(float r, int k, const float *x, const float *y) {
    double s = (double)r;
    for (int i = 0; i < k; i++) s += (double)(x[i] * y[i]);
    return (float)s;
}

/* The two orders over rows as stored (F32, or F16 converted 64 values at a time: where no buffer
 * for whole rows could be had). type: the weight's, which decides the rounding. */
static inline __attribute__((always_inline)) float dot_vec(const int type, int n, const uint8_t *px,
                                                           const uint8_t *py) {
    float acc[4][16] = {{0}}, bx[64], by[64];
    const int np = n & ~63;
    for (int i = 0; i < np; i += 64) {
        const float *x = floats(type, px, i, 64, bx), *y = floats(type, py, i, 64, by);
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 16; l++) acc[j][l] = madd(type, x[16 * j + l], y[16 * j + l], acc[j][l]);
    }
    for (int l = 0; l < 16; l++) {
        acc[0][l] = acc[0][l] + acc[2][l];
        acc[1][l] = acc[1][l] + acc[3][l];
    }
    for (int l = 0; l < 16; l++) acc[0][l] = acc[0][l] + acc[1][l];
    const float r = el_sum16(acc[0]);
    if (np == n) return r;
    const float *x = floats(type, px, np, n - np, bx), *y = floats(type, py, np, n - np, by);
    if (type == EL_F16) return f16_tail(r, n - np, x, y);
    float s = r;
    for (int i = 0; i < n - np; i++) s = fmaf(x[i], y[i], s);
    return s;
}

static inline __attribute__((always_inline)) float dot_tinyblas(const int type, int n, const uint8_t *px,
                                                                const uint8_t *py) {
    float acc[16] = {0}, bx[64], by[64];
    for (int i = 0; i < n; i += 64) {  /* n is a multiple of 16 */
        const int k = EL_MIN(64, n - i);
        const float *x = floats(type, px, i, k, bx), *y = floats(type, py, i, k, by);
        for (int u = 0; u < k; u += 16)
            for (int l = 0; l < 16; l++) acc[l] = madd(type, x[u + l], y[u + l], acc[l]);
    }
    return el_sum16(acc);
}

int el_float_llama_type(int type) { return type == EL_F32 || type == EL_F16; }

int el_float_llama_tinyblas(int64_t rows, int n, int cols) {
    return cols >= 2 && rows % 4 == 0 && n % 16 == 0;
}

/* F16 rows as floats: the same lanes as 16-float vectors held in registers (GCC / clang vector
 * types: each lane's multiply and add as the scalar code's; products of halves are exact) */
typedef float v16 __attribute__((vector_size(64)));

/* (macros, not functions: a 64-byte vector passed or returned by value has another ABI with and
 * without AVX-512, which compilers warn about in the clones) */
#define LOAD16(p) ({ v16 v_; memcpy(&v_, (p), sizeof v_); v_; })
#define SUM16(v) ({ float t_[16]; const v16 s_ = (v); memcpy(t_, &s_, sizeof t_); el_sum16(t_); })

/* dot_vec's order, F16 values as floats */
static inline __attribute__((always_inline)) float dot_vec_f16(int n, const float *x, const float *y) {
    v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    const int np = n & ~63;
    for (int i = 0; i < np; i += 64) {
        a0 = a0 + LOAD16(x + i) * LOAD16(y + i);
        a1 = a1 + LOAD16(x + i + 16) * LOAD16(y + i + 16);
        a2 = a2 + LOAD16(x + i + 32) * LOAD16(y + i + 32);
        a3 = a3 + LOAD16(x + i + 48) * LOAD16(y + i + 48);
    }
    const float r = SUM16((a0 + a2) + (a1 + a3));
    return np == n ? r : f16_tail(r, n - np, x + np, y + np);
}

#define TB_RMAX 4 /* weight rows per tinyBLAS tile at most (the AVX-512 copy: 16 accumulators in 32 registers) */

/* tinyBLAS's order for RM rows (x: ldx floats apart) x four columns at once, F16 values as floats:
 * each weight vector loaded once for four columns, each activation vector once for RM rows */
static inline __attribute__((always_inline)) void dot_tinyblas_tile_f16(int n, const float *x, size_t ldx, const int RM,
                                                                      const float *y, size_t ldy, float *out,
                                                                      size_t ldo) {
    v16 acc[TB_RMAX][4];
    for (int r = 0; r < RM; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = (v16){0};
    for (int i = 0; i < n; i += 16) {
        v16 w[TB_RMAX];
        for (int r = 0; r < RM; r++) w[r] = LOAD16(x + r * ldx + i);
        for (int c = 0; c < 4; c++) {
            const v16 a = LOAD16(y + c * ldy + i);
            for (int r = 0; r < RM; r++) acc[r][c] = acc[r][c] + w[r] * a;
        }
    }
    for (int r = 0; r < RM; r++)
        for (int c = 0; c < 4; c++) out[c * ldo + r] = SUM16(acc[r][c]);
}

static inline __attribute__((always_inline)) float dot_tinyblas_f16(int n, const float *x, const float *y) {
    v16 a = {0};
    for (int i = 0; i < n; i += 16) a = a + LOAD16(x + i) * LOAD16(y + i);
    return SUM16(a);
}

/* This thread's buffer for F16 rows as floats (TB_RMAX weight rows and up to COLS activation rows),
 * kept between calls and freed when the thread ends; NULL when it cannot grow (then rows are
 * converted 64 values at a time). */
#define COLS 64
typedef struct {
    size_t cap;
    float v[];
} row_buf;
static pthread_key_t buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;
static int buf_key_ok;

static void make_key(void) { buf_key_ok = pthread_key_create(&buf_key, free) == 0; }

static float *row_buffer(size_t n) {
    pthread_once(&buf_once, make_key);
    if (!buf_key_ok) return NULL;
    row_buf *b = pthread_getspecific(buf_key);
    if (!b || b->cap < n) {
        row_buf *nb = realloc(b, sizeof(row_buf) + n * sizeof(float));
        if (!nb) return NULL;
        nb->cap = n;
        if (pthread_setspecific(buf_key, nb) != 0) {
            free(nb);
            return NULL;
        }
        b = nb;
    }
    return b->v;
}

/* weight rows prefetched ahead into L2: one row at a time is a stream the hardware's prefetchers
 * follow too late from DRAM (SmolLM2 F16, one token: see the commit) */
#define PF_ROWS 4

/* the loops with the type and the order constant, so each is compiled on its own; RM: weight
 * rows per tinyBLAS tile (as many as the ISA's registers hold) */
static inline __attribute__((always_inline)) void gemm(const int type, const int tinyblas, const int RM, int n,
                                                       const uint8_t *w, size_t ldw, int nr, const uint8_t *a,
                                                       size_t lda, int nc, float *out, size_t ldo) {
    float *xs = type == EL_F16 ? row_buffer((size_t)n * (EL_MIN(nc, COLS) + TB_RMAX)) : NULL;
    float *ys = xs ? xs + (size_t)TB_RMAX * n : NULL;
    for (int c0 = 0; c0 < nc; c0 += COLS) {
        const int c1 = EL_MIN(nc, c0 + COLS);
        for (int c = c0; ys && c < c1; c++)
            el_vops.f16_to_f32(n, (const el_half *)(a + (size_t)c * lda), ys + (size_t)(c - c0) * n);
        for (int r = 0; r < nr;) {
            /* a tile of RM rows where tinyBLAS takes four columns at a time, else one row */
            const int R = xs && tinyblas && c1 - c0 >= 4 && nr - r >= RM ? RM : 1;
            const uint8_t *x = w + (size_t)r * ldw;
            if (r + PF_ROWS < nr) el_prefetch_l2(x + PF_ROWS * ldw, (size_t)EL_MIN(R, nr - r - PF_ROWS) * ldw);
            for (int k = 0; xs && k < R; k++) el_vops.f16_to_f32(n, (const el_half *)(x + k * ldw), xs + (size_t)k * n);
            int c = c0;
            if (xs && tinyblas)
                for (; c + 4 <= c1; c += 4) {
                    const float *y = ys + (size_t)(c - c0) * n;
                    float *o = out + (size_t)c * ldo + r;
                    if (R == RM) dot_tinyblas_tile_f16(n, xs, (size_t)n, RM, y, (size_t)n, o, ldo);
                    else dot_tinyblas_tile_f16(n, xs, (size_t)n, 1, y, (size_t)n, o, ldo);
                }
            for (int k = 0; k < R; k++) {
                const uint8_t *xk = x + k * ldw;
                for (int cc = c; xs && cc < c1; cc++)
                    out[(size_t)cc * ldo + r + k] = tinyblas ? dot_tinyblas_f16(n, xs + (size_t)k * n, ys + (size_t)(cc - c0) * n)
                                                             : dot_vec_f16(n, xs + (size_t)k * n, ys + (size_t)(cc - c0) * n);
                for (int cc = c; !xs && cc < c1; cc++) {
                    const uint8_t *y = a + (size_t)cc * lda;
                    out[(size_t)cc * ldo + r + k] = tinyblas ? dot_tinyblas(type, n, xk, y) : dot_vec(type, n, xk, y);
                }
            }
            r += R;
        }
    }
}

static inline __attribute__((always_inline)) void gemm_types(int type, int tinyblas, const int RM, int n, const uint8_t *w,
                                                             size_t ldw, int nr, const uint8_t *a, size_t lda, int nc,
                                                             float *out, size_t ldo) {
    if (type == EL_F16) {
        if (tinyblas) gemm(EL_F16, 1, RM, n, w, ldw, nr, a, lda, nc, out, ldo);
        else gemm(EL_F16, 0, RM, n, w, ldw, nr, a, lda, nc, out, ldo);
    } else {
        if (tinyblas) gemm(EL_F32, 1, RM, n, w, ldw, nr, a, lda, nc, out, ldo);
        else gemm(EL_F32, 0, RM, n, w, ldw, nr, a, lda, nc, out, ldo);
    }
}

/* On x86-64 the same source compiled for AVX-512 and AVX2 as well, picked by the CPU at run time:
 * the same operations in the same order, on wider vectors. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define EL_FLOAT_ISA_COPIES 1
#define GEMM_COPY(name, isa, RM)                                                                               \
    __attribute__((target(isa))) static void name(int type, int tinyblas, int n, const uint8_t *w, size_t ldw, \
                                                  int nr, const uint8_t *a, size_t lda, int nc, float *out,   \
                                                  size_t ldo) {                                                \
        gemm_types(type, tinyblas, RM, n, w, ldw, nr, a, lda, nc, out, ldo);                                  \
    }
GEMM_COPY(gemm_avx512, "avx512f", 4)
GEMM_COPY(gemm_avx2, "avx2", 1)

#include <immintrin.h>

/* ggml_vec_dot_f16's order (dot_vec_f16) for F16 rows against one activation row y (as floats),
 * without copying the rows: each row's halves converted in registers (vcvtph2ps, exact) and taken
 * by FMAs (a product of halves is exact: the twin's add). A row's (a0 + a2) + (a1 + a3) goes to a
 * buffer of 16-lane rows, which el_vops.sum16_rows reduces in el_sum16's order. n: a multiple of
 * 64. The rows stream from DRAM: the row VEC_PF_ROWS ahead is prefetched into L2 as each is read
 * (without it a SmolLM2 F16 step took ~1.4x as long; 4 rows side by side sharing the activation
 * loads measured no faster than one). row_dot: one row's lanes, per ISA */
#define VEC_ROWS 16   /* rows whose lane sums are reduced together */
#define VEC_PF_ROWS 8
typedef void (*vec_row_fn)(int n, const el_half *x, const float *y, const char *pf, float *lanes);

__attribute__((target("avx512f"))) static void vec_row_avx512(int n, const el_half *x, const float *y, const char *pf,
                                                              float *lanes) {
    __m512 a[4];
    for (int j = 0; j < 4; j++) a[j] = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 64) {
        if (pf) el_prefetch_l2(pf + 2 * (size_t)i, 128);  /* values i .. i + 63 of the row ahead */
        for (int j = 0; j < 4; j++)
            a[j] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i + 16 * j))),
                                   _mm512_loadu_ps(y + i + 16 * j), a[j]);
    }
    _mm512_storeu_ps(lanes, _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3])));
}

/* the same 16-lane accumulators as two 8-lane halves each */
__attribute__((target("avx2,fma,f16c"))) static void vec_row_avx2(int n, const el_half *x, const float *y, const char *pf,
                                                                  float *lanes) {
    __m256 a[4][2];
    for (int j = 0; j < 4; j++) a[j][0] = a[j][1] = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 64) {
        if (pf) el_prefetch_l2(pf + 2 * (size_t)i, 128);  /* values i .. i + 63 of the row ahead */
        for (int j = 0; j < 4; j++)
            for (int h = 0; h < 2; h++) {
                const int o = i + 16 * j + 8 * h;
                a[j][h] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + o))), _mm256_loadu_ps(y + o),
                                          a[j][h]);
            }
    }
    for (int h = 0; h < 2; h++)
        _mm256_storeu_ps(lanes + 8 * h, _mm256_add_ps(_mm256_add_ps(a[0][h], a[2][h]), _mm256_add_ps(a[1][h], a[3][h])));
}

/* nr F16 rows against one activation row as floats: out[r] */
static void vec_f16(vec_row_fn row_dot, int n, const uint8_t *w, size_t ldw, int nr, const float *y, float *out) {
    float lanes[VEC_ROWS * 16];
    for (int r0 = 0; r0 < nr; r0 += VEC_ROWS) {
        const int nb = EL_MIN(VEC_ROWS, nr - r0);
        for (int r = 0; r < nb; r++) {
            const el_half *x = (const el_half *)(w + (size_t)(r0 + r) * ldw);
            row_dot(n, x, y, r0 + r + VEC_PF_ROWS < nr ? (const char *)x + VEC_PF_ROWS * ldw : NULL, lanes + 16 * r);
        }
        el_vops.sum16_rows(nb, lanes, out + r0);
    }
}

/* tinyBLAS's order (dot_tinyblas_f16 / dot_tinyblas) for a tile of R rows x C activation rows (as
 * floats, ldy apart): one 16-lane accumulator per output; each 16 values of a row loaded once for
 * the C columns (F16: converted in registers, the FMA's product exact: the twin's add; F32: the
 * twin's fmaf); the lanes to lanes[16 (c R + r)]. Per ISA: tiles of up to TB_R x TB_C (AVX-512:
 * 4 x 6 accumulators, 4 weight vectors and an activation in 32 registers; AVX2, two halves an
 * accumulator in 16: 1 x 6) */
#define TB_C 6
#define TB_R512 4
typedef void (*tb_tile_fn)(int type, int R, int C, int n, const uint8_t *w, size_t ldw, const float *y, size_t ldy,
                           float *lanes);

static inline __attribute__((always_inline, target("avx512f"))) void tb_tile_avx512_rc(
    const int type, const int R, const int C, int n, const uint8_t *w, size_t ldw, const float *y, size_t ldy,
    float *lanes) {
    __m512 acc[TB_R512][TB_C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __m512 wv[TB_R512];
        for (int r = 0; r < R; r++)
            wv[r] = type == EL_F16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const el_half *)(w + r * ldw) + i)))
                                   : _mm512_loadu_ps((const float *)(w + r * ldw) + i);
        for (int c = 0; c < C; c++) {
            const __m512 a = _mm512_loadu_ps(y + c * ldy + i);
            for (int r = 0; r < R; r++) acc[r][c] = _mm512_fmadd_ps(wv[r], a, acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) _mm512_storeu_ps(lanes + 16 * (c * R + r), acc[r][c]);
}

static inline __attribute__((always_inline, target("avx2,fma,f16c"))) void tb_tile_avx2_c(
    const int type, const int C, int n, const uint8_t *w, const float *y, size_t ldy, float *lanes) {
    __m256 acc[TB_C][2];
    for (int c = 0; c < C; c++) acc[c][0] = acc[c][1] = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __m256 w0, w1;
        if (type == EL_F16) {
            const el_half *x = (const el_half *)w + i;
            w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x));
            w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + 8)));
        } else {
            w0 = _mm256_loadu_ps((const float *)w + i);
            w1 = _mm256_loadu_ps((const float *)w + i + 8);
        }
        for (int c = 0; c < C; c++) {
            acc[c][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(y + c * ldy + i), acc[c][0]);
            acc[c][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(y + c * ldy + i + 8), acc[c][1]);
        }
    }
    for (int c = 0; c < C; c++) {
        _mm256_storeu_ps(lanes + 16 * c, acc[c][0]);
        _mm256_storeu_ps(lanes + 16 * c + 8, acc[c][1]);
    }
}

/* the tiles with their type and shape made constants: R TB_R512 or 1, C 1 .. TB_C */
#define TB_COLS(CALL, T)        \
    switch (C) {                \
    case 1: CALL(T, 1); break;  \
    case 2: CALL(T, 2); break;  \
    case 3: CALL(T, 3); break;  \
    case 4: CALL(T, 4); break;  \
    case 5: CALL(T, 5); break;  \
    default: CALL(T, TB_C);     \
    }
__attribute__((target("avx512f"))) static void tb_tile_avx512(int type, int R, int C, int n, const uint8_t *w, size_t ldw,
                                                              const float *y, size_t ldy, float *lanes) {
#define TB4(T, CC) tb_tile_avx512_rc(T, TB_R512, CC, n, w, ldw, y, ldy, lanes)
#define TB1(T, CC) tb_tile_avx512_rc(T, 1, CC, n, w, ldw, y, ldy, lanes)
    if (type == EL_F16 && R == TB_R512) {
        TB_COLS(TB4, EL_F16)
    } else if (type == EL_F16) {
        TB_COLS(TB1, EL_F16)
    } else if (R == TB_R512) {
        TB_COLS(TB4, EL_F32)
    } else {
        TB_COLS(TB1, EL_F32)
    }
#undef TB4
#undef TB1
}
__attribute__((target("avx2,fma,f16c"))) static void tb_tile_avx2(int type, int R, int C, int n, const uint8_t *w,
                                                                  size_t ldw, const float *y, size_t ldy, float *lanes) {
    (void)R, (void)ldw;  /* (one row a tile) */
#define TBA(T, CC) tb_tile_avx2_c(T, CC, n, w, y, ldy, lanes)
    if (type == EL_F16) {
        TB_COLS(TBA, EL_F16)
    } else {
        TB_COLS(TBA, EL_F32)
    }
#undef TBA
}
#undef TB_COLS

/* nr rows against nc activation rows of the weight's type (lda bytes apart) in tinyBLAS's order
 * (n a multiple of 16): F16 columns converted to floats COLS at a time (into ys, EL_MIN(nc, COLS) * n
 * floats), F32 ones read as stored; tiles of RT rows (the rest one by one) against groups of TB_C
 * columns, each tile's lanes reduced by el_vops.sum16_rows */
static void tb_float(tb_tile_fn tile, int type, const int RT, int n, const uint8_t *w, size_t ldw, int nr,
                     const uint8_t *a, size_t lda, int nc, float *ys, float *out, size_t ldo) {
    float lanes[TB_R512 * TB_C * 16], sums[TB_R512 * TB_C];
    for (int c0 = 0; c0 < nc; c0 += COLS) {
        const int c1 = EL_MIN(nc, c0 + COLS);
        const float *yc = type == EL_F16 ? ys : (const float *)(a + (size_t)c0 * lda);
        const size_t ldy = type == EL_F16 ? (size_t)n : lda / sizeof(float);
        for (int c = c0; type == EL_F16 && c < c1; c++)
            el_vops.f16_to_f32(n, (const el_half *)(a + (size_t)c * lda), ys + (size_t)(c - c0) * n);
        for (int r = 0; r < nr;) {
            const int R = nr - r >= RT ? RT : 1;
            const uint8_t *x = w + (size_t)r * ldw;
            if (r + PF_ROWS < nr) el_prefetch_l2(x + PF_ROWS * ldw, (size_t)EL_MIN(R, nr - r - PF_ROWS) * ldw);
            for (int c = c0; c < c1; c += TB_C) {
                const int C = EL_MIN(TB_C, c1 - c);
                tile(type, R, C, n, x, ldw, yc + (size_t)(c - c0) * ldy, ldy, lanes);
                el_vops.sum16_rows(R * C, lanes, sums);
                for (int j = 0; j < C; j++)
                    for (int k = 0; k < R; k++) out[(size_t)(c + j) * ldo + r + k] = sums[j * R + k];
            }
            r += R;
        }
    }
}
#endif

void el_float_llama_gemm(int type, int tinyblas, int n, const uint8_t *w, size_t ldw, int nr, const uint8_t *a,
                         size_t lda, int nc, float *out, size_t ldo) {
#ifdef EL_FLOAT_ISA_COPIES
    /* F16 and F32 through the selected ISA's own kernels (F16 rows converted in registers), which
     * el_set_isa can turn off: the portable loops below are their twin */
    const int isa = el_float_llama_type(type) ? el_get_isa() : EL_ISA_GENERIC;
    if (isa == EL_ISA_AVX512 || isa == EL_ISA_AVX2) {
        float *ys = type == EL_F16 && !tinyblas && nc == 1 && n % 64 == 0 ? row_buffer((size_t)n) : NULL;
        if (ys) {  /* a decode step's F16 matmul (F32 rows need no conversion: the loops below) */
            el_vops.f16_to_f32(n, (const el_half *)a, ys);
            vec_f16(isa == EL_ISA_AVX512 ? vec_row_avx512 : vec_row_avx2, n, w, ldw, nr, ys, out);
            return;
        }
        ys = tinyblas && type == EL_F16 ? row_buffer((size_t)n * EL_MIN(nc, COLS)) : NULL;
        if (tinyblas && (ys || type == EL_F32)) {  /* a prompt's matmul */
            if (isa == EL_ISA_AVX512) tb_float(tb_tile_avx512, type, TB_R512, n, w, ldw, nr, a, lda, nc, ys, out, ldo);
            else tb_float(tb_tile_avx2, type, 1, n, w, ldw, nr, a, lda, nc, ys, out, ldo);
            return;
        }
    }
    if (__builtin_cpu_supports("avx512f")) {
        gemm_avx512(type, tinyblas, n, w, ldw, nr, a, lda, nc, out, ldo);
        return;
    }
    if (__builtin_cpu_supports("avx2")) {
        gemm_avx2(type, tinyblas, n, w, ldw, nr, a, lda, nc, out, ldo);
        return;
    }
#endif
    gemm_types(type, tinyblas, 1, n, w, ldw, nr, a, lda, nc, out, ldo);
}
