/* IQ4_NL and IQ4_XS kernels of x86_avx2.c, which includes this body twice like x86_avx2_dots.h:
 * EL_VNNI 0 (AVX2) and EL_VNNI 1 (AVX-VNNI), every function named through KFN(). Both variants
 * compute the same int32 lanes. Each kernel is a tile of R weight rows x C activation rows doing
 * the same lane-wise operations for one (row, column) whatever R and C, so gemm and vec_dot (the
 * 1x1 tile) agree bit for bit, and with the generic twins (iquants_generic.c).
 *
 * Values: the nibbles of a 32-value group (16 bytes: value j low nibble of byte j, value j+16
 * high nibble) become their table values by one vpshufb on el_iq4nl_values. A 32-value dot
 * gives 8 int32 lanes, lane i the products of values 4i..4i+3: without VNNI vpmaddubsw of |w|
 * against a carrying w's sign (|w| <= 127, so pairs fit int16 for activations in [-127, 127]),
 * then vpmaddwd; with VNNI (IQ4_NL) vpdpbusd of w + 128 against a, seeded with -128 * (sums of 4
 * activations). */

/* the 32 table values of a packed group, as signed bytes in value order */
static inline __m256i KFN(iq4_group)(const uint8_t *qs) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)el_iq4nl_values));
    return _mm256_shuffle_epi8(table, nibbles32(qs));
}

/* ------------------------------------------------------------------------------------------
 * IQ4_NL against Q8_0, llama.cpp's repacked order: per (row, column) one float chain over the
 * blocks, acc = fma(exact sum of the block's 32 products, dw * da, acc). The rows of a tile sit in
 * the float lanes: per block and column the rows' 8-lane integer vectors are reduced to one
 * total per row (hsum_halves4 / fold_halves), lane r for row r.
 * ------------------------------------------------------------------------------------------ */

#define NL_RMAX 8
#define NL_CMAX 4

/* lane r: the half-float d of block b of row r (r < R), 0 beyond */
static inline __m256 KFN(nl_row_d)(const uint8_t *w, size_t ldw, const int R, size_t b) {
    uint16_t h[8] = {0};
    for (int r = 0; r < R; r++) memcpy(&h[r], w + (size_t)r * ldw + b * sizeof(block_iq4_nl), 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

static inline __attribute__((always_inline)) void KFN(iq4_nl_kernel)(int n, const uint8_t *w, size_t ldw, const int R,
                                                                   const uint8_t *a, size_t lda, const int C,
                                                                   float *out, size_t ldo) {
    const size_t nb = (size_t)n / QK4_NL, wbs = sizeof(block_iq4_nl), abs_ = sizeof(block_q8_0);
    __m256 acc[NL_CMAX];
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    pf_cursor pf = pf_start(w, ldw, R, nb * wbs);
    for (size_t b = 0; b < nb; b++) {
        pf_step(&pf, R, ldw, wbs);
        __m256i wq[NL_RMAX];
        for (int r = 0; r < R; r++) {
            const __m256i v = KFN(iq4_group)(w + (size_t)r * ldw + b * wbs + offsetof(block_iq4_nl, qs));
            wq[r] = EL_VNNI ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)) : v;  /* VNNI: w + 128 */
        }
        const __m256 dw = KFN(nl_row_d)(w, ldw, R, b);
        for (int c = 0; c < C; c++) {
            const uint8_t *ab = a + (size_t)c * lda + b * abs_;
            const __m256i av = loadu256(ab + offsetof(block_q8_0, qs));
            __m256i x[NL_RMAX];
#if EL_VNNI
            const __m256i zero = _mm256_setzero_si256();
            const __m256i seed = _mm256_sub_epi32(zero, _mm256_dpbusd_avx_epi32(zero, _mm256_set1_epi8((char)0x80), av));
            for (int r = 0; r < R; r++) x[r] = _mm256_dpbusd_avx_epi32(seed, wq[r], av);
#else
            for (int r = 0; r < R; r++)
                x[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wq[r], wq[r]), _mm256_sign_epi8(av, wq[r])),
                                         _mm256_set1_epi16(1));
#endif
            for (int r = R; r < NL_RMAX; r++) x[r] = _mm256_setzero_si256();
            const __m256i e = hsum_halves4(x[0], x[1], x[2], x[3]);
            const __m256i f = R > 4 ? hsum_halves4(x[4], x[5], x[6], x[7]) : _mm256_setzero_si256();
            const __m256i tot = fold_halves(e, f);  /* lane r: the block's integer sum for row r */
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_mul_ps(dw, bcast_half(ab)), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) {
        float res[8];
        _mm256_storeu_ps(res, acc[c]);
        for (int r = 0; r < R; r++) out[(size_t)c * ldo + r] = res[r];
    }
}

/* ------------------------------------------------------------------------------------------
 * IQ4_XS against Q8_K; from 8 activation rows llama.cpp's tiled gemm's order (the lanes' total per
 * super-block, acc = fma(isum * d, d_act, acc)), below (small) ggml_vec_dot_iq4_xs_q8_K's order:
 * per (row, column) 8 float lanes; per
 * super-block the 8 int32 lanes (lane i: sum over the groups of scale * products of values
 * 4i..4i+3, the scale applied by vpmaddwd / vpdpwssd on the int16 pair sums), then
 * lane = fma(d * d_act, int lane, lane); hsum256 (el_hsum8's tree) at the end.
 * ------------------------------------------------------------------------------------------ */

#define XS_RMAX 2
#define XS_CMAX 2

/* the 8 group scales of a super-block (minus 32) as int16 broadcasts */
static inline void KFN(xs_scales)(const uint8_t *blk, __m256i sc[8]) {
    int s[8];
    iq4_xs_scales(blk, s);
    for (int g = 0; g < 8; g++) sc[g] = _mm256_set1_epi16((short)s[g]);
}

static inline __attribute__((always_inline)) void KFN(iq4_xs_kernel)(const int small, int n, const uint8_t *w,
                                                                   size_t ldw, const int R, const uint8_t *a,
                                                                   size_t lda, const int C, float *out, size_t ldo) {
    const int nb = n / QK_K;
    const size_t wbs = sizeof(block_iq4_xs);
    __m256 acc[XS_RMAX][XS_CMAX];
    __m128 acc1 = _mm_setzero_ps();  /* !small: lane r + 2c */
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    pf_cursor pf = pf_start(w, ldw, R, (size_t)nb * wbs);
    for (int i = 0; i < nb; i++) {
        pf_step(&pf, R, ldw, wbs);
        const uint8_t *xb[XS_RMAX];
        const block_q8_K *yb[XS_CMAX];
        __m256i sc[XS_RMAX][8], isum[XS_RMAX][XS_CMAX];
        for (int r = 0; r < R; r++) {
            xb[r] = w + (size_t)r * ldw + (size_t)i * wbs;
            KFN(xs_scales)(xb[r], sc[r]);
            for (int c = 0; c < C; c++) isum[r][c] = _mm256_setzero_si256();
        }
        for (int c = 0; c < C; c++) yb[c] = (const block_q8_K *)(a + (size_t)c * lda) + i;
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            __m256i wv[XS_RMAX], wa[XS_RMAX];
            for (int r = 0; r < R; r++) {
                wv[r] = KFN(iq4_group)(xb[r] + offsetof(block_iq4_xs, qs) + 16 * g);
                wa[r] = _mm256_sign_epi8(wv[r], wv[r]);
            }
            for (int c = 0; c < C; c++) {
                const __m256i av = loadu256(yb[c]->qs + 32 * g);
                for (int r = 0; r < R; r++)
                    isum[r][c] = KFN(dot_ww)(isum[r][c], _mm256_maddubs_epi16(wa[r], _mm256_sign_epi8(av, wv[r])), sc[r][g]);
            }
        }
        if (!small) {  /* every pair's total (exact integers: any order), then one float step for all */
            __m256i v[4];
            float dp[4] = {0}, ap[4] = {0};
            for (int p = 0; p < 4; p++) {
                const int r = p % 2, c = p / 2;
                v[p] = r < R && c < C ? isum[r][c] : _mm256_setzero_si256();
                if (r < R && c < C) dp[p] = load_half(xb[r] + offsetof(block_iq4_xs, d)), ap[p] = yb[c]->d;
            }
            const __m256i e = hsum_halves4(v[0], v[1], v[2], v[3]);
            const __m128i tot = _mm_add_epi32(_mm256_castsi256_si128(e), _mm256_extracti128_si256(e, 1));
            acc1 = _mm_fmadd_ps(_mm_mul_ps(_mm_cvtepi32_ps(tot), _mm_loadu_ps(dp)), _mm_loadu_ps(ap), acc1);
            continue;
        }
        for (int r = 0; r < R; r++) {
            const float d = load_half(xb[r] + offsetof(block_iq4_xs, d));
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(d * yb[c]->d), _mm256_cvtepi32_ps(isum[r][c]), acc[r][c]);
        }
    }
    float res[4];
    _mm_storeu_ps(res, acc1);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) out[(size_t)c * ldo + r] = small ? hsum256(acc[r][c]) : res[r + 2 * c];
}
static inline __attribute__((always_inline)) void KFN(iq4_xs_main_kernel)(int n, const uint8_t *w, size_t ldw,
                                                                        const int R, const uint8_t *a, size_t lda,
                                                                        const int C, float *out, size_t ldo) {
    KFN(iq4_xs_kernel)(0, n, w, ldw, R, a, lda, C, out, ldo);
}
static inline __attribute__((always_inline)) void KFN(iq4_xs_small_kernel)(int n, const uint8_t *w, size_t ldw,
                                                                         const int R, const uint8_t *a, size_t lda,
                                                                         const int C, float *out, size_t ldo) {
    KFN(iq4_xs_kernel)(1, n, w, ldw, R, a, lda, C, out, ldo);
}

#define IQ4_TILE(T, RR, CC) KFN(T)(n, w, ldw, RR, a, lda, CC, out, ldo)
#define IQ4_KERNELS(tname, TILE, RT, CT, RT1)                                                      \
    static void KFN(tname##_tile)(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a,    \
                                  size_t lda, int C, float *out, size_t ldo) {                     \
        TILE_SHAPES(IQ4_TILE, TILE, RT, CT, RT1, R, C);                                            \
    }                                                                                              \
    static void KFN(tname##_gemm)(int n, const void *w, size_t ldw, int nr, const void *a,         \
                                  size_t lda, int nc, float *out, size_t ldo) {                    \
        gemm_tiles(KFN(tname##_tile), RT, CT, RT1, n, w, ldw, nr, a, lda, nc, out, ldo);           \
    }                                                                                              \
    static void KFN(tname##_vec_dot)(int n, float *s, const void *x, const void *y) {              \
        KFN(TILE)(n, x, 0, 1, y, 0, 1, s, 0);                                                      \
    }

IQ4_KERNELS(iq4_nl, iq4_nl_kernel, 4, 4, 8)
IQ4_KERNELS(iq4_xs, iq4_xs_main_kernel, 2, 2, 2)
IQ4_KERNELS(iq4_xs_small, iq4_xs_small_kernel, 2, 2, 2)
#undef IQ4_KERNELS
#undef IQ4_TILE

static void KFN(register_iq4)(el_type_traits *t) {
    t[EL_IQ4_NL].vec_dot = KFN(iq4_nl_vec_dot), t[EL_IQ4_NL].gemm = KFN(iq4_nl_gemm);
    t[EL_IQ4_XS].vec_dot = KFN(iq4_xs_vec_dot), t[EL_IQ4_XS].gemm = KFN(iq4_xs_gemm);
    t[EL_IQ4_XS].vec_dot_small = KFN(iq4_xs_small_vec_dot), t[EL_IQ4_XS].gemm_small = KFN(iq4_xs_small_gemm);
}
