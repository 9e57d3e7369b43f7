/* Float weights (F32, F16, BF16) on AVX-512, included by x86_avx512.c: the AVX2 tile's order
 * (x86_avx2.c, float_tile), bit for bit, with less work per product.
 *
 * The order: per (weight row, activation column), 8 float lanes, lane l summing the products of
 * values l, l + 8, ... by FMA; after every 64 values the lanes go into 4 double lanes (lane j
 * adds float lane j, then lane j + 4) and restart from zero; a partial last group of 8 goes
 * through zero-padded copies; at the end (d0 + d2) + (d1 + d3), rounded to float.
 *
 * Here a zmm register holds two weight rows' 8 lanes (row r in lanes 0..7, row r + 1 in 8..15)
 * against an activation column's 8 values broadcast to both halves, so one FMA does two rows'
 * lane steps, each lane exactly the AVX2 lane's; the double lanes of the two rows share a zmm
 * too (a permute puts float lanes 0..3 of both rows in the low half, 4..7 in the high half).
 * The activation columns are converted to float once per call (4 at a time, zero-padded to a
 * multiple of 8; the conversion is exact), not at every load of every tile, and the tiles are
 * up to 4 rows x 4 columns. So the arithmetic of every (row, column) is the same whatever the
 * tile, column count or call: batch-invariant, and the AVX2 kernels' bits (vec_dot stays
 * theirs). */

#include <stdlib.h>

#define FZ_PMAX 2 /* row pairs per tile */
#define FZ_CMAX 4 /* columns per tile (and per converted group) */

/* 8 values of row p0 in lanes 0..7 and 8 of row p1 in lanes 8..15, as floats */
static inline __attribute__((always_inline)) __m512 fz_rows(const int type, const uint8_t *p0, const uint8_t *p1) {
    switch (type) {
    case EL_F32:
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps((const float *)p0)),
                                  _mm256_loadu_ps((const float *)p1), 1);
    case EL_F16:
        return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                                       _mm_loadu_si128((const __m128i *)p1), 1));
    default: {
        const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                                  _mm_loadu_si128((const __m128i *)p1), 1);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    }
}

/* the double lanes of two rows [r: 0..3 | r + 1: 0..3] plus their float lanes 0..3, then 4..7 */
static inline __m512d fz_flush(__m512d accd, __m512 accf) {
    const __m512 p = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15), accf);
    accd = _mm512_add_pd(accd, _mm512_cvtps_pd(_mm512_castps512_ps256(p)));
    return _mm512_add_pd(accd, _mm512_cvtps_pd(_mm512_extractf32x8_ps(p, 1)));
}

/* Rows w[0 .. rows) (rows <= 2P; a missing last row of a pair repeats the one before, computed
 * and not stored) against C columns of float activations af (ldaf floats apart, zero-padded to
 * a multiple of 8): out[c * ldo + r]. */
static inline __attribute__((always_inline)) void fz_tile(const int type, int n, const uint8_t *w, size_t ldw,
                                                          int rows, const int P, const float *af, size_t ldaf,
                                                          const int C, float *out, size_t ldo) {
    const size_t es = type == EL_F32 ? 4 : 2; /* bytes per weight value */
    const uint8_t *w0[FZ_PMAX], *w1[FZ_PMAX];
    for (int p = 0; p < P; p++) {
        w0[p] = w + (size_t)(2 * p) * ldw;
        w1[p] = 2 * p + 1 < rows ? w0[p] + ldw : w0[p];
    }
    __m512 accf[FZ_PMAX][FZ_CMAX];
    __m512d accd[FZ_PMAX][FZ_CMAX];
    for (int p = 0; p < P; p++)
        for (int c = 0; c < C; c++) accf[p][c] = _mm512_setzero_ps(), accd[p][c] = _mm512_setzero_pd();
    const int n8 = n & ~7;
    pf_cursor pf = pf_start(w, ldw, 2 * P, (size_t)n * es); /* (x86_common.h: decode streams the rows) */
    for (int i = 0; i < n8; i += 8) {
        if ((i * es & 63) == 0) pf_step(&pf, 2 * P, ldw, 64);
        __m512 wv[FZ_PMAX];
        for (int p = 0; p < P; p++) wv[p] = fz_rows(type, w0[p] + i * es, w1[p] + i * es);
        for (int c = 0; c < C; c++) {
            const __m512 av = _mm512_broadcast_f32x8(_mm256_loadu_ps(af + c * ldaf + i));
            for (int p = 0; p < P; p++) accf[p][c] = _mm512_fmadd_ps(wv[p], av, accf[p][c]);
        }
        if ((i & 63) == 56)
            for (int p = 0; p < P; p++)
                for (int c = 0; c < C; c++) {
                    accd[p][c] = fz_flush(accd[p][c], accf[p][c]);
                    accf[p][c] = _mm512_setzero_ps();
                }
    }
    if (n8 < n) { /* the last 1..7 values: zero-padded weight copies (the activations are padded) */
        uint8_t b0[32], b1[32];
        __m512 wv[FZ_PMAX];
        for (int p = 0; p < P; p++) {
            memset(b0, 0, sizeof b0);
            memset(b1, 0, sizeof b1);
            memcpy(b0, w0[p] + n8 * es, (size_t)(n - n8) * es);
            memcpy(b1, w1[p] + n8 * es, (size_t)(n - n8) * es);
            wv[p] = fz_rows(type, b0, b1);
        }
        for (int c = 0; c < C; c++) {
            const __m512 av = _mm512_broadcast_f32x8(_mm256_loadu_ps(af + c * ldaf + n8));
            for (int p = 0; p < P; p++) accf[p][c] = _mm512_fmadd_ps(wv[p], av, accf[p][c]);
        }
    }
    for (int p = 0; p < P; p++)
        for (int c = 0; c < C; c++) {
            double d[8];
            _mm512_storeu_pd(d, fz_flush(accd[p][c], accf[p][c]));
            out[(size_t)c * ldo + 2 * p] = (float)((d[0] + d[2]) + (d[1] + d[3]));
            if (2 * p + 1 < rows) out[(size_t)c * ldo + 2 * p + 1] = (float)((d[4] + d[6]) + (d[5] + d[7]));
        }
}

/* A row of n activations of the weights' type as floats, zero-padded to a multiple of 8 (exact) */
static void fz_convert(const int type, int n, const uint8_t *a, float *af) {
    const int n8 = n & ~7;
    int i = 0;
    for (; i < n8; i += 8) {
        if (type == EL_F32) _mm256_storeu_ps(af + i, _mm256_loadu_ps((const float *)a + i));
        else if (type == EL_F16) _mm256_storeu_ps(af + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + 2 * i))));
        else _mm256_storeu_ps(af + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                 _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(a + 2 * i))), 16)));
    }
    if (i < n) {
        float tail[8] = {0};
        const size_t es = type == EL_F32 ? 4 : 2;
        uint8_t buf[32] = {0};
        memcpy(buf, a + (size_t)i * es, (size_t)(n - i) * es);
        fz_convert(type, 8, buf, tail);
        memcpy(af + i, tail, sizeof tail);
    }
}

/* the calling thread's buffer of converted activation columns (grown as needed, kept) */
static _Thread_local float *fz_buf;
static _Thread_local size_t fz_cap;

static float *fz_columns(size_t floats) {
    if (floats > fz_cap) {
        float *p = malloc(floats * sizeof(float));
        if (!p) return NULL;
        free(fz_buf);
        fz_buf = p;
        fz_cap = floats;
    }
    return fz_buf;
}

#define FZ_TILE(T, PP, CC) fz_tile(T, n, W + (size_t)r * ldw, ldw, rows, PP, af, n8, CC, out + (size_t)c * ldo + r, ldo)
#define FZ_SHAPES(T, P, C)                                                                         \
    do {                                                                                           \
        if ((P) == 2) {                                                                            \
            if ((C) == 4) FZ_TILE(T, 2, 4); else if ((C) == 3) FZ_TILE(T, 2, 3);                   \
            else if ((C) == 2) FZ_TILE(T, 2, 2); else FZ_TILE(T, 2, 1);                            \
        } else {                                                                                   \
            if ((C) == 4) FZ_TILE(T, 1, 4); else if ((C) == 3) FZ_TILE(T, 1, 3);                   \
            else if ((C) == 2) FZ_TILE(T, 1, 2); else FZ_TILE(T, 1, 1);                            \
        }                                                                                          \
    } while (0)

/* gemm: columns 4 at a time converted to floats, then every 4-row tile of them. Where no buffer
 * can be had, the AVX2 kernel (the same bits) does the call. */
static inline __attribute__((always_inline)) int fz_gemm(const int type, int n, const void *w, size_t ldw, int nr,
                                                         const void *a, size_t lda, int nc, float *out, size_t ldo) {
    const size_t n8 = ((size_t)n + 7) & ~(size_t)7;
    float *af = fz_columns(FZ_CMAX * n8);
    if (!af) return 0;
    const uint8_t *W = w, *A = a;
    for (int c = 0; c < nc; c += FZ_CMAX) {
        const int C = EL_MIN(FZ_CMAX, nc - c);
        for (int j = 0; j < C; j++) fz_convert(type, n, A + (size_t)(c + j) * lda, af + (size_t)j * n8);
        for (int r = 0; r < nr; r += 2 * FZ_PMAX) {
            const int rows = EL_MIN(2 * FZ_PMAX, nr - r), P = (rows + 1) / 2;
            FZ_SHAPES(type, P, C);
        }
    }
    return 1;
}

/* the kernels registered before these (AVX2's: the same bits), for a call that gets no buffer */
static el_gemm_fn fz_prev[3];

#define FZ_KERNELS(tname, TYPE, SLOT)                                                              \
    static void tname##_gemm_avx512(int n, const void *w, size_t ldw, int nr, const void *a,       \
                                    size_t lda, int nc, float *out, size_t ldo) {                  \
        if (!fz_gemm(TYPE, n, w, ldw, nr, a, lda, nc, out, ldo))                                   \
            fz_prev[SLOT](n, w, ldw, nr, a, lda, nc, out, ldo);                                    \
    }

FZ_KERNELS(f32, EL_F32, 0)
FZ_KERNELS(f16, EL_F16, 1)
FZ_KERNELS(bf16, EL_BF16, 2)
#undef FZ_KERNELS
#undef FZ_SHAPES
#undef FZ_TILE

static void fz_register(el_type_traits *t) {
    fz_prev[0] = t[EL_F32].gemm, fz_prev[1] = t[EL_F16].gemm, fz_prev[2] = t[EL_BF16].gemm;
    t[EL_F32].gemm = f32_gemm_avx512, t[EL_F16].gemm = f16_gemm_avx512, t[EL_BF16].gemm = bf16_gemm_avx512;
}
