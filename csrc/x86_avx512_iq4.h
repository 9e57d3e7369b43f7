/* IQ4_NL and IQ4_XS kernels of x86_avx512.c (included once, under its AVX-512 VNNI target).
 * As everywhere in that file, each kernel is a tile of R weight rows x C activation rows doing
 * the same lane-wise operations for one (row, column) whatever R and C, so gemm and vec_dot agree
 * bit for bit, and with the generic twins (iquants_generic.c) for activations in [-127, 127]
 * (what every activation quantizer writes).
 *
 * A zmm holds 64 table values (two 32-value groups in value order), looked up by one vpshufb on
 * el_iq4nl_values per 128-bit lane (iq4_pair, x86_avx512.c). */

/* ------------------------------------------------------------------------------------------
 * IQ4_NL against Q8_0 in llama.cpp's repacked order (acc = fma(exact block sum, dw * da, acc) per
 * (row, column)): rows p and p + 4 of a tile share a register (lanes 0..7, 8..15), their values
 * as w + 128 for vpdpbusd against the activation block broadcast to both halves, seeded with
 * -128 * (sums of 4 activations). The four registers' lanes are then reduced to one integer per
 * row, row r in float lane r.
 * ------------------------------------------------------------------------------------------ */

#define NL_RMAX 8
#define NL_CMAX 4

/* lane r (r < 4) and lane r + 4: the totals of the low and high 8 lanes of x[r] */
static inline __m256i nl_row_totals(const __m512i x[4]) {
    const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(x[0], x[1]), _mm512_unpackhi_epi32(x[0], x[1]));
    const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(x[2], x[3]), _mm512_unpackhi_epi32(x[2], x[3]));
    /* 128-bit chunk k, lane j: the sum of chunk k of x[j] */
    const __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
    const __m512i v = _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(3, 1, 2, 0));  /* chunks 0, 2, 1, 3 */
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

static inline __attribute__((always_inline)) void iq4_nl_kernel(int n, const uint8_t *w, size_t ldw, const int R,
                                                                const uint8_t *a, size_t lda, const int C, float *out,
                                                                size_t ldo) {
    const size_t nb = (size_t)n / QK4_NL, wbs = sizeof(block_iq4_nl), abs_ = sizeof(block_q8_0);
    const int P = R < 4 ? R : 4;
    __m256 acc[NL_CMAX];
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    pf_cursor pf = pf_start(w, ldw, R, nb * wbs);
    for (size_t b = 0; b < nb; b++) {
        if (b % 2 == 0) pf_step(&pf, R, ldw, 2 * wbs);
        const uint8_t *wb = w + b * wbs;
        __m512i wq[4];
        uint16_t h[8] = {0};
        for (int p = 0; p < 4; p++) {
            if (p >= P) {
                wq[p] = _mm512_setzero_si512();
                continue;
            }
            const uint8_t *b0 = wb + (size_t)p * ldw, *b1 = p + 4 < R ? b0 + 4 * ldw : zero_block;
            wq[p] = _mm512_xor_si512(iq4_pair(b0 + offsetof(block_iq4_nl, qs), b1 + offsetof(block_iq4_nl, qs)),
                                     _mm512_set1_epi8((char)0x80));
            h[p] = load_u16(b0);
            if (p + 4 < R) h[p + 4] = load_u16(b1);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));  /* lane r: row r */
        for (int c = 0; c < C; c++) {
            const uint8_t *ab = a + (size_t)c * lda + b * abs_;
            const __m256i a256 = _mm256_loadu_si256((const __m256i *)(ab + offsetof(block_q8_0, qs)));
            const __m256i z = _mm256_setzero_si256();
            const __m512i seed = _mm512_broadcast_i64x4(_mm256_sub_epi32(z, _mm256_dpbusd_epi32(z, _mm256_set1_epi8((char)0x80), a256)));
            const __m512i av = _mm512_broadcast_i64x4(a256);
            __m512i x[4];
            for (int p = 0; p < 4; p++) x[p] = p < P ? _mm512_dpbusd_epi32(seed, wq[p], av) : _mm512_setzero_si512();
            const __m256 da = _mm256_set1_ps(_cvtsh_ss(load_u16(ab)));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(nl_row_totals(x)), _mm256_mul_ps(dw, da), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) {
        float res[8];
        _mm256_storeu_ps(res, acc[c]);
        for (int r = 0; r < R; r++) out[(size_t)c * ldo + r] = res[r];
    }
}

/* ------------------------------------------------------------------------------------------
 * IQ4_XS against Q8_K. small (below 8 activation rows): ggml_vec_dot_iq4_xs_q8_K's order, per (row,
 * column) and super-block the 8 integer lanes of the generic twin (lane i: scale * products of
 * values 4i..4i+3 of each group), then lane = fma(d * d_act, int lane, lane), el_hsum8 at the end;
 * else llama.cpp's tiled gemm's: the lanes' total, acc = fma(isum * d, d_act, acc). Per 64 values: vpmaddubsw of
 * |w| against a negated where w < 0, then vpdpwssd with the two groups' scales (one per 256-bit
 * half); the halves are added after the last quarter.
 * ------------------------------------------------------------------------------------------ */

#define XS_RMAX 2
#define XS_CMAX 4

static inline __attribute__((always_inline)) void iq4_xs_kernel(const int small, int n, const uint8_t *w, size_t ldw,
                                                                const int R, const uint8_t *a, size_t lda, const int C,
                                                                float *out, size_t ldo) {
    const int nb = n / QK_K;
    const size_t wbs = sizeof(block_iq4_xs);
    __m256 acc[XS_RMAX][XS_CMAX];
    __m256 acc1 = _mm256_setzero_ps();  /* !small: lane 4r + c */
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    pf_cursor pf = pf_start(w, ldw, R, (size_t)nb * wbs);
    for (int i = 0; i < nb; i++) {
        pf_step(&pf, R, ldw, wbs);
        const uint8_t *xb[XS_RMAX];
        const block_q8_K *yb[XS_CMAX];
        short ls[XS_RMAX][8];
        __m512i isum[XS_RMAX][XS_CMAX];
        for (int r = 0; r < R; r++) {
            xb[r] = w + (size_t)r * ldw + (size_t)i * wbs;
            int s[8];
            iq4_xs_scales(xb[r], s);
            for (int g = 0; g < 8; g++) ls[r][g] = (short)s[g];
            for (int c = 0; c < C; c++) isum[r][c] = _mm512_setzero_si512();
        }
        for (int c = 0; c < C; c++) yb[c] = (const block_q8_K *)(a + (size_t)c * lda) + i;
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            __m512i wa[XS_RMAX], sc[XS_RMAX];
            __mmask64 neg[XS_RMAX];
            for (int r = 0; r < R; r++) {
                const uint8_t *qs = xb[r] + offsetof(block_iq4_xs, qs) + 32 * q;
                const __m512i v = iq4_pair(qs, qs + 16);
                wa[r] = _mm512_abs_epi8(v);
                neg[r] = _mm512_movepi8_mask(v);
                sc[r] = _mm512_inserti64x4(_mm512_set1_epi16(ls[r][2 * q]), _mm256_set1_epi16(ls[r][2 * q + 1]), 1);
            }
            for (int c = 0; c < C; c++) {
                const __m512i av = _mm512_loadu_si512((const void *)(yb[c]->qs + 64 * q));
                for (int r = 0; r < R; r++) {
                    const __m512i as = _mm512_mask_sub_epi8(av, neg[r], _mm512_setzero_si512(), av);
                    isum[r][c] = _mm512_dpwssd_epi32(isum[r][c], _mm512_maddubs_epi16(wa[r], as), sc[r]);
                }
            }
        }
        if (!small) {  /* every pair's total (exact integers: any order), then one float step for all */
            __m512i v[8];
            float dp[8] = {0}, ap[8] = {0};
            for (int p = 0; p < 8; p++) {
                const int r = p / 4, c = p % 4;
                v[p] = r < R && c < C ? isum[r][c] : _mm512_setzero_si512();
                if (r < R && c < C) dp[p] = _cvtsh_ss(load_u16(xb[r] + offsetof(block_iq4_xs, d))), ap[p] = yb[c]->d;
            }
            acc1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(hsum8x16(v)), _mm256_loadu_ps(dp)), _mm256_loadu_ps(ap), acc1);
            continue;
        }
        for (int r = 0; r < R; r++) {
            const float d = _cvtsh_ss(load_u16(xb[r] + offsetof(block_iq4_xs, d)));
            for (int c = 0; c < C; c++) {
                const __m512i v = isum[r][c];
                const __m256i l8 = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
                acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(d * yb[c]->d), _mm256_cvtepi32_ps(l8), acc[r][c]);
            }
        }
    }
    float res[8];
    _mm256_storeu_ps(res, acc1);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) out[(size_t)c * ldo + r] = small ? hsum8_avx(acc[r][c]) : res[4 * r + c];
}
static inline __attribute__((always_inline)) void iq4_xs_main_kernel(int n, const uint8_t *w, size_t ldw, const int R,
                                                                     const uint8_t *a, size_t lda, const int C,
                                                                     float *out, size_t ldo) {
    iq4_xs_kernel(0, n, w, ldw, R, a, lda, C, out, ldo);
}
static inline __attribute__((always_inline)) void iq4_xs_small_kernel(int n, const uint8_t *w, size_t ldw, const int R,
                                                                      const uint8_t *a, size_t lda, const int C,
                                                                      float *out, size_t ldo) {
    iq4_xs_kernel(1, n, w, ldw, R, a, lda, C, out, ldo);
}

#define IQ4_TILE(K, RR, CC) K(n, w, ldw, RR, a, lda, CC, out, ldo)
#define IQ4_KERNELS(tname, KERNEL, RT, CT, RT1)                                                    \
    static void tname##_tile_avx512(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a,  \
                                    size_t lda, int C, float *out, size_t ldo) {                   \
        TILE_SHAPES(IQ4_TILE, KERNEL, RT, CT, RT1, R, C);                                          \
    }                                                                                              \
    static void tname##_gemm_avx512(int n, const void *w, size_t ldw, int nr, const void *a,       \
                                    size_t lda, int nc, float *out, size_t ldo) {                  \
        gemm_tiles(tname##_tile_avx512, RT, CT, RT1, n, w, ldw, nr, a, lda, nc, out, ldo);         \
    }                                                                                              \
    static void tname##_vec_dot_avx512(int n, float *s, const void *x, const void *y) {            \
        KERNEL(n, x, 0, 1, y, 0, 1, s, 0);                                                         \
    }

IQ4_KERNELS(iq4_nl, iq4_nl_kernel, 8, 4, 8)
IQ4_KERNELS(iq4_xs, iq4_xs_main_kernel, 2, 4, 2)
/* batches of KCL_MIN_TILES columns and more: x86_avx512.c's column-lane tile (kcl_tile), its tiles for the rest */
KCL_GEMM(iq4_xs, EL_IQ4_XS, iq4_xs_gemm_avx512, KCL_MIN_TILES)
IQ4_KERNELS(iq4_xs_small, iq4_xs_small_kernel, 2, 4, 2)
#undef IQ4_KERNELS
#undef IQ4_TILE
