/* Float weights (F32, F16, BF16) against activations of the same type on x86: one order, one
 * tile, included by x86_avx2.c (16 vector registers) and x86_avx512.c (32: larger tiles), each
 * compiled for its target. Before the include, the file defines FT_R x FT_C (the tile of a gemm
 * of several columns: FT_R * FT_C float and as many double accumulators fit its registers) and
 * FT_R1 (rows per tile against a single column).
 *
 * The order, per (weight row, activation column): 8 float lanes, lane l summing the products of
 * values l, l + 8, ... by FMA; after every 64 values the lanes go into 4 double lanes (lane j
 * adds float lane j, then lane j + 4) and restart from zero (the reference sums in double, so
 * rounding error stays far below the float error of one long sum); a partial last group of 8
 * goes through zero-padded copies; at the end (d0 + d2) + (d1 + d3), rounded to float. The same
 * operations whatever the tile, column count or ISA: batch-invariant, and every variant's bits.
 *
 * gemm converts up to FT_COLS activation columns to floats once per call (exact; zero-padded to
 * a multiple of 8) into a buffer of the calling thread, then runs every tile of FT_R rows
 * against each group of at most FT_C of them (the rows stay in L1 meanwhile). A single column
 * (a decode step, streaming the rows from DRAM: ~10% faster so), vec_dot and a call that gets no
 * buffer read the activations as stored. (On a Zen 4 the 256-bit tile beat one holding two rows
 * per 512-bit register, whose flushes cost a permute: see the commit.) */

#include <stdlib.h>

#ifndef FT_COLS
#define FT_COLS 32 /* activation columns converted per pass */
#endif

/* 8 values at p as floats (exact) */
static inline __m256 ft_load8(const int type, const uint8_t *p) {
    switch (type) {
    case EL_F32: return _mm256_loadu_ps((const float *)p);
    case EL_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    default: return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    }
}

/* the double lanes plus float lanes 0..3, then 4..7 */
static inline __m256d ft_flush(__m256d accd, __m256 accf) {
    accd = _mm256_add_pd(accd, _mm256_cvtps_pd(_mm256_castps256_ps128(accf)));
    return _mm256_add_pd(accd, _mm256_cvtps_pd(_mm256_extractf128_ps(accf, 1)));
}

/* R weight rows at w (ldw bytes apart) against C activation columns at a (lda bytes apart): as
 * stored (raw) or as floats from ft_convert; out[c * ldo + r]. pf: prefetch the rows ahead (the
 * first column group of a row tile; never when ldw is 0, vec_dot). */
static inline __attribute__((always_inline)) void ft_tile(const int type, int n, const uint8_t *w, size_t ldw,
                                                          const int R, const uint8_t *a, size_t lda, const int raw,
                                                          const int C, float *out, size_t ldo, int pf_on) {
    const size_t es = type == EL_F32 ? 4 : 2; /* bytes per weight value */
    const size_t ea = raw ? es : 4;           /* bytes per activation value */
    __m256 accf[FT_R > FT_R1 ? FT_R : FT_R1][FT_C];
    __m256d accd[FT_R > FT_R1 ? FT_R : FT_R1][FT_C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) accf[r][c] = _mm256_setzero_ps(), accd[r][c] = _mm256_setzero_pd();
    const int n8 = n & ~7;
    pf_on = pf_on && ldw;
    pf_cursor pf = pf_start(w, ldw, R, (size_t)n * es); /* (x86_common.h: decode streams the rows) */
    for (int i = 0; i < n8; i += 8) {
        if (pf_on && (i * es & 63) == 0) pf_step(&pf, R, ldw, 64);
        __m256 wv[FT_R > FT_R1 ? FT_R : FT_R1];
        for (int r = 0; r < R; r++) wv[r] = ft_load8(type, w + r * ldw + i * es);
        for (int c = 0; c < C; c++) {
            const uint8_t *ac = a + c * lda + i * ea;
            const __m256 av = raw ? ft_load8(type, ac) : _mm256_loadu_ps((const float *)ac);
            for (int r = 0; r < R; r++) accf[r][c] = _mm256_fmadd_ps(wv[r], av, accf[r][c]);
        }
        if ((i & 63) == 56)
            for (int r = 0; r < R; r++)
                for (int c = 0; c < C; c++) {
                    accd[r][c] = ft_flush(accd[r][c], accf[r][c]);
                    accf[r][c] = _mm256_setzero_ps();
                }
    }
    if (n8 < n) { /* the last 1..7 values: zero-padded copies (converted activations are padded) */
        uint8_t buf[32];
        __m256 wv[FT_R > FT_R1 ? FT_R : FT_R1];
        for (int r = 0; r < R; r++) {
            memset(buf, 0, sizeof buf);
            memcpy(buf, w + r * ldw + n8 * es, (size_t)(n - n8) * es);
            wv[r] = ft_load8(type, buf);
        }
        for (int c = 0; c < C; c++) {
            __m256 av;
            if (raw) {
                memset(buf, 0, sizeof buf);
                memcpy(buf, a + c * lda + n8 * es, (size_t)(n - n8) * es);
                av = ft_load8(type, buf);
            } else {
                av = _mm256_loadu_ps((const float *)(a + c * lda) + n8);
            }
            for (int r = 0; r < R; r++) accf[r][c] = _mm256_fmadd_ps(wv[r], av, accf[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            const __m256d d = ft_flush(accd[r][c], accf[r][c]);
            __m128d s = _mm_add_pd(_mm256_castpd256_pd128(d), _mm256_extractf128_pd(d, 1));
            s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
            out[(size_t)c * ldo + r] = (float)_mm_cvtsd_f64(s);
        }
}

/* a row of n activations as floats, zero-padded to a multiple of 8 (exact) */
static void ft_convert(const int type, int n, const uint8_t *a, float *af) {
    const size_t es = type == EL_F32 ? 4 : 2;
    for (int i = 0; i < n; i += 8) {
        uint8_t buf[32] = {0};
        const uint8_t *p = a + (size_t)i * es;
        if (n - i < 8) {
            memcpy(buf, p, (size_t)(n - i) * es);
            p = buf;
        }
        _mm256_storeu_ps(af + i, ft_load8(type, p));
    }
}

/* the calling thread's buffer of converted activation columns (grown as needed, kept) */
static _Thread_local float *ft_buf;
static _Thread_local size_t ft_cap;

static float *ft_columns(size_t floats) {
    if (floats > ft_cap) {
        float *p = malloc(floats * sizeof(float));
        if (!p) return NULL;
        free(ft_buf);
        ft_buf = p;
        ft_cap = floats;
    }
    return ft_buf;
}

/* a tile of R rows (a constant) against C <= FT_C columns (made a constant here) */
#define FT_TILE_C(T, RR, RAW)                                                                                \
    do {                                                                                                     \
        const uint8_t *wr_ = W + (size_t)r * ldw, *ac_ = act + (size_t)c * ldact;                          \
        float *o_ = out + (size_t)(c0 + c) * ldo + r;                                                        \
        if (C == 1) ft_tile(T, n, wr_, ldw, RR, ac_, ldact, RAW, 1, o_, ldo, c == 0);                        \
        else if (C == 2 || FT_C < 3) ft_tile(T, n, wr_, ldw, RR, ac_, ldact, RAW, EL_MIN(2, FT_C), o_, ldo, c == 0); \
        else if (C == 3 || FT_C < 4) ft_tile(T, n, wr_, ldw, RR, ac_, ldact, RAW, EL_MIN(3, FT_C), o_, ldo, c == 0); \
        else ft_tile(T, n, wr_, ldw, RR, ac_, ldact, RAW, EL_MIN(4, FT_C), o_, ldo, c == 0);                \
    } while (0)

/* columns [c0, c0 + ncc) at act (ldact bytes apart; raw: as stored, else floats): every tile of
 * RT rows (then single rows) against each of the column groups (balanced sizes, at most FT_C) */
static inline __attribute__((always_inline)) void ft_pass(const int type, int n, const uint8_t *W, size_t ldw,
                                                          int nr, const uint8_t *act, size_t ldact, const int raw,
                                                          int c0, int ncc, float *out, size_t ldo) {
    const int groups = (ncc + FT_C - 1) / FT_C;
    const int RT = ncc == 1 ? FT_R1 : FT_R;
    for (int r = 0; r < nr;) {
        const int R = nr - r >= RT ? RT : 1;
        for (int g = 0, c = 0; g < groups; g++) {
            const int C = (ncc - c + groups - g - 1) / (groups - g);
            if (R == 1) FT_TILE_C(type, 1, raw);
            else if (RT == FT_R1) FT_TILE_C(type, FT_R1, raw);
            else FT_TILE_C(type, FT_R, raw);
            c += C;
        }
        r += R;
    }
}

static inline __attribute__((always_inline)) void ft_gemm(const int type, int n, const void *w, size_t ldw, int nr,
                                                          const void *a, size_t lda, int nc, float *out, size_t ldo) {
    const uint8_t *A = a;
    if (nc == 1) { /* a decode step: the column as stored, half the bytes beside the streamed rows */
        ft_pass(type, n, w, ldw, nr, A, lda, 1, 0, 1, out, ldo);
        return;
    }
    const size_t n8 = ((size_t)n + 7) & ~(size_t)7;
    float *af = ft_columns((size_t)EL_MIN(nc, FT_COLS) * n8);
    for (int c0 = 0; c0 < nc; c0 += FT_COLS) {
        const int ncc = EL_MIN(FT_COLS, nc - c0);
        if (!af) {
            ft_pass(type, n, w, ldw, nr, A + (size_t)c0 * lda, lda, 1, c0, ncc, out, ldo);
            continue;
        }
        for (int j = 0; j < ncc; j++) ft_convert(type, n, A + (size_t)(c0 + j) * lda, af + (size_t)j * n8);
        ft_pass(type, n, w, ldw, nr, (const uint8_t *)af, n8 * sizeof(float), 0, c0, ncc, out, ldo);
    }
}

#define FT_KERNELS(tname, TYPE)                                                                     \
    static void tname##_float_gemm(int n, const void *w, size_t ldw, int nr, const void *a, size_t lda, \
                                   int nc, float *out, size_t ldo) {                                \
        ft_gemm(TYPE, n, w, ldw, nr, a, lda, nc, out, ldo);                                         \
    }                                                                                               \
    static void tname##_float_vec_dot(int n, float *s, const void *x, const void *y) {              \
        ft_tile(TYPE, n, x, 0, 1, y, 0, 1, 1, s, 0, 0);                                             \
    }

FT_KERNELS(f32, EL_F32)
FT_KERNELS(f16, EL_F16)
FT_KERNELS(bf16, EL_BF16)
#undef FT_KERNELS
#undef FT_TILE_C

static void ft_register(el_type_traits *t) {
    t[EL_F32].vec_dot = f32_float_vec_dot, t[EL_F32].gemm = f32_float_gemm;
    t[EL_F16].vec_dot = f16_float_vec_dot, t[EL_F16].gemm = f16_float_gemm;
    t[EL_BF16].vec_dot = bf16_float_vec_dot, t[EL_BF16].gemm = bf16_float_gemm;
}
