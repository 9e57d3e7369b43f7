/* Integer dot-product kernels of x86_avx2.c. That file includes this body twice: with
 * EL_VNNI 0 (AVX2: vpmaddubsw / vpmaddwd) and EL_VNNI 1 (AVX-VNNI: vpdpbusd / vpdpwssd), under
 * the matching target, naming every function through KFN(). Both variants compute the same
 * int32 lanes, so they return the same floats.
 *
 * Determinism: every kernel is a "tile" of R weight rows x C activation rows. The work done for
 * one (row, column) pair is the same sequence of lane-wise operations whatever R and C are, so
 * gemm (big tiles) and vec_dot (the 1x1 tile) give bit-identical results.
 *
 * Lane layout (8 int32 lanes per 32 values): lane i sums the products of values 4i..4i+3. */

/* acc + per lane: sum of 4 products u*s (u unsigned bytes, s signed bytes). Without VNNI the
 * byte products are first summed in pairs into int16 with saturation: callers keep every
 * |u0*s0 + u1*s1| < 2^15 (true for u <= 128 against activations in [-127, 127]). */
static inline __m256i KFN(dot_us)(__m256i acc, __m256i u, __m256i s) {
#if EL_VNNI
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* acc + per lane: p[2i]*k[2i] + p[2i+1]*k[2i+1] over int16 */
static inline __m256i KFN(dot_ww)(__m256i acc, __m256i p, __m256i k) {
#if EL_VNNI
    return _mm256_dpwssd_avx_epi32(acc, p, k);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, k));
#endif
}

/* ------------------------------------------------------------------------------------------
 * Legacy 32-value blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) against Q8_0 / Q8_1 activations.
 * Per block the weight values become 32 unsigned bytes u (Q8_0 with VNNI: w + 128) with an
 * offset o (8, 16, 128; 0 for the types with a min), so sum(w*a) = sum(u*a) - o*sum(a); the
 * per-column term -o*sum(a) seeds the accumulator (Q8_0 without VNNI: |w| against sign(w)*a, no
 * seed). The float part is the generic twins' order (quants_generic.c): each (row, column) has 8
 * float lanes, acc = fma(cvt(int lane), dw * da, acc) block after block, summed at the end by
 * hsum256 (el_hsum8's tree). Q4_1 / Q5_1 add the sum over blocks of m * s (weight min times the
 * activation's d*sum(q)) as one chain of fmas in block order. The result is hsum(main) + the
 * row's min chain.
 *
 * One activation column (lone_tile: a one-token step in llama.cpp's order, and vec_dot) is
 * x86_avx512.c's lone_tile on ymm registers, laid out for a stream of rows:
 * - L1_R = 8 rows a tile, so the column's block (values, seed, d, s) is read once for 8 rows;
 * - their headers converted at once (lone_head): each row's d and m from one 4-byte load, two
 *   blends, one vcvtph2ps of the 8 d and one of the 8 m (lane lone_lane(r) is row r); dw * da
 *   stored and read back by each row's fma as a broadcast from memory, the min part one fma for
 *   the 8 rows' chains. A block's headers are worked out while the block before is summed: their
 *   loads, inserts and conversions are a long chain that otherwise held up the block's fmas;
 * - the span of rows L1_PF tiles ahead prefetched in order, a slice per block.
 * Single thread, plain AVX2 (EDGELLM_ISA=avx2 on a Zen 4), one column, GB/s of weights against
 * legacy_tile's 4 x 1 tiles (bench_kernels --tokens 1 --mb 0, medians of alternating runs): from
 * DRAM (Q4_1 K 576 x 277778 rows, Q8_0 K 640 x 262144) Q4_1 14.7 -> 19.2, Q8_0 28.5 -> 31.5; from
 * L2 (Q4_1 1536 rows, Q8_0 1024) Q4_1 14.4 -> 18.9, Q8_0 30.2 -> 31.1; K 576 x 1536 rows, GFLOP/s:
 * Q4_0 53 -> 56, Q5_0 33 -> 40, Q5_1 33 -> 41. Compute-bound at about 3.3 cycles a block-row
 * (3.5 GHz) even from L1; in a micro-test vpmaddubsw, vpmaddwd and vfmadd did not overlap (two a
 * cycle together), and those are three of a row's six vector ops. Did not
 * pay: 4-row tiles (Q4_1 from DRAM 18.4 -> 15.9, before the headers were moved a block ahead);
 * dw * da taken out of a register (vpermps) instead of memory (Q4_1 from L1 0.92 -> 1.08 ns a
 * block-row); the headers packed in general registers before one vmovq / vpinsrq each (slower).
 * ------------------------------------------------------------------------------------------ */

/* the lane of row r (< L1_R) in a tile's header vectors */
static inline int KFN(lone_lane)(int r) { return r < 4 ? 2 * r : 2 * (r - 4) + 1; }

/* block header of R rows (ldw bytes apart) at wb against the column's block at ab: dw * da of row r
 * in lane lone_lane(r), returned; the rows' min chains in accm take their next fma (Q4_1, Q5_1) */
static inline __attribute__((always_inline)) __m256 KFN(lone_head)(const int type, const int R, const uint8_t *wb,
                                                                   size_t ldw, const uint8_t *ab, __m256 *accm) {
    uint32_t h[8];  /* row r's d (and m) */
    for (int r = 0; r < 8; r++) h[r] = r < R ? load_u32(wb + (size_t)r * ldw) : 0;
    const __m128i lo = _mm_setr_epi32((int)h[0], (int)h[1], (int)h[2], (int)h[3]);
    const __m128i hi = _mm_setr_epi32((int)h[4], (int)h[5], (int)h[6], (int)h[7]);
    if (type == EL_Q4_1 || type == EL_Q5_1)
        *accm = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_blend_epi16(_mm_srli_epi32(lo, 16), hi, 0xAA)),
                                _mm256_set1_ps(load_half(ab + 2)), *accm);
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_blend_epi16(lo, _mm_slli_epi32(hi, 16), 0xAA)), _mm256_set1_ps(load_half(ab)));
}

/* R <= L1_R weight rows (ldw bytes apart) x the one column a */
static inline __attribute__((always_inline)) void KFN(lone_tile)(const int type, int n, const uint8_t *w, size_t ldw,
                                                                 const int R, const uint8_t *a, float *out) {
    const int nb = n / 32;
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1;
    const int off = type == EL_Q4_0 ? 8 : type == EL_Q5_0 ? 16 : (type == EL_Q8_0 && EL_VNNI) ? 128 : 0;
    const size_t wbs = (size_t)legacy_block_bytes(type), abs_ = has_m ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t aq = has_m ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    __m256 acc[L1_R], accm = _mm256_setzero_ps();  /* accm: the rows' min chains, in their lanes */
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const size_t span = (size_t)R * ldw;
    const uint8_t *ahead = w + L1_PF * span;
    const size_t pf_bytes = lrt_pf_bytes(span, nb);
    size_t po = 0;
    float sc[2][8] __attribute__((aligned(32)));  /* lane lone_lane(r): dw * da of row r, blocks b and b + 1 */
    __m256 next = KFN(lone_head)(type, R, w, ldw, a, &accm);
    for (int b = 0; b < nb; b++) {
        for (const size_t pe = po + pf_bytes; po < pe; po += 64) __builtin_prefetch(ahead + po, 0, 2);
        const uint8_t *wb = w + (size_t)b * wbs, *ab = a + (size_t)b * abs_;
        const __m256i av = loadu256(ab + aq);
        __m256i seed = _mm256_setzero_si256();
        if (off) seed = _mm256_sub_epi32(seed, KFN(dot_us)(seed, _mm256_set1_epi8((char)off), av));
        _mm256_store_ps(sc[b & 1], next);
        if (b + 1 < nb) next = KFN(lone_head)(type, R, wb + wbs, ldw, ab + abs_, &accm);
        __asm__ volatile("" : "+m"(sc));  /* read back by broadcasts, not shuffled out of a register */
        for (int r = 0; r < R; r++) {
            const __m256i u = legacy_unpack_bcast(type, wb + (size_t)r * ldw);
            __m256i x;
            if (type == EL_Q8_0 && !EL_VNNI)
                x = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(av, u)),
                                      _mm256_set1_epi16(1));
            else if (type == EL_Q8_0)
                x = KFN(dot_us)(seed, _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80)), av);
            else
                x = KFN(dot_us)(seed, u, av);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(x), _mm256_broadcast_ss(sc[b & 1] + KFN(lone_lane)(r)), acc[r]);
        }
    }
    float m[8];
    _mm256_storeu_ps(m, accm);
    for (int r = 0; r < R; r++) out[r] = has_m ? hsum256(acc[r]) + m[KFN(lone_lane)(r)] : hsum256(acc[r]);
}

/* nr rows x one column: tiles of L1_R rows, then one at a time */
static inline __attribute__((always_inline)) void KFN(lone_gemm)(const int type, int n, const uint8_t *w, size_t ldw,
                                                                 int nr, const uint8_t *a, float *out) {
    int r = 0;
    for (; r + L1_R <= nr; r += L1_R) KFN(lone_tile)(type, n, w + (size_t)r * ldw, ldw, L1_R, a, out + r);
    for (; r < nr; r++) KFN(lone_tile)(type, n, w + (size_t)r * ldw, ldw, 1, a, out + r);
}

/* ------------------------------------------------------------------------------------------
 * The same legacy dot products for many columns at once (gemm with nc >= 2), the float steps of
 * every (row, column) exactly lone_tile's, so the results are its bits. What differs is what is
 * done once: a call converts the activation scales (d, and s for the types with a min) of its
 * columns to floats once; rows are taken RT at a time, and for each chunk of LG_KB blocks of
 * those rows the weights are unpacked once into a small panel (unsigned values for the types with
 * a min, else |w| and the signed w, w = value - offset, so sum(w*a) is |w| . sign(a, w) as for
 * Q8_0), with each block's scale as 8 float lanes and the mins lane r = row r; then every group
 * of CT columns runs over the panel from L1. The per-(row, column) accumulators live in registers
 * within a chunk and in a small buffer between chunks (same chain of fmas, block after block).
 * ------------------------------------------------------------------------------------------ */

#define LG_KB 16        /* blocks per panel chunk */
#define LG_COLS 32      /* columns whose scales a pass converts */
#define LG_SCALES 8192  /* floats of converted activation scales */

typedef struct {
    __m256i u[LT_RMAX][LG_KB];  /* unsigned values (Q4_1, Q5_1) or |w| */
    __m256i s[LT_RMAX][LG_KB];  /* signed w (Q4_0, Q5_0, Q8_0: no 34-byte-strided reads in the tiles) */
    __m256 d[LT_RMAX][LG_KB];   /* weight scale in every lane */
    __m256 m[LG_KB];            /* weight min of row r in lane r (Q4_1, Q5_1) */
} KFN(lg_panel);

static inline __attribute__((always_inline)) void KFN(lg_prep)(const int type, KFN(lg_panel) *P, const uint8_t *w,
                                                               size_t ldw, const int R, int b0, int nbk, pf_cursor *pf) {
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1;
    const size_t wbs = (size_t)legacy_block_bytes(type);
    const int off = type == EL_Q4_0 ? 8 : type == EL_Q5_0 ? 16 : 0;
    for (int b = 0; b < nbk; b++) {
        pf_step(pf, R, ldw, wbs);
        uint16_t h[8] = {0};
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = w + (size_t)r * ldw + (size_t)(b0 + b) * wbs;
            __m256i v = legacy_unpack(type, blk);
            if (off) v = _mm256_sub_epi8(v, _mm256_set1_epi8((char)off));
            if (!has_m) P->s[r][b] = v;
            P->u[r][b] = has_m ? v : _mm256_sign_epi8(v, v);
            P->d[r][b] = bcast_half(blk);
            if (has_m) memcpy(&h[r], blk + 2, 2);
        }
        if (has_m)
            P->m[b] = _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3],
                                                     (short)h[4], (short)h[5], (short)h[6], (short)h[7]));
    }
}

/* columns c0..c0+C of a panel chunk (blocks b0..b0+nbk of nb); acc / accm: the chains between
 * chunks; `last`: write the results */
static inline __attribute__((always_inline)) void KFN(lg_tile)(
    const int type, const KFN(lg_panel) *P, const int R, const uint8_t *a, size_t lda, const int C, const float *ad, const float *as, int nb, int b0, int nbk, int first, int last, __m256 *accb,
    __m256 *accmb, float *out, size_t ldo) {
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1;
    const size_t abs_ = has_m ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const int aqs = has_m ? 4 : 2;
    __m256 acc[LT_RMAX][LT_CMAX], accm[LT_CMAX];
    for (int c = 0; c < C; c++) {
        for (int r = 0; r < R; r++) acc[r][c] = first ? _mm256_setzero_ps() : accb[c * LT_RMAX + r];
        if (has_m) accm[c] = first ? _mm256_setzero_ps() : accmb[c];
    }
    for (int b = 0; b < nbk; b++) {
        __m256 sd[LT_CMAX];
        __m256i av[LT_CMAX];
        for (int c = 0; c < C; c++) {
            sd[c] = _mm256_broadcast_ss(ad + (size_t)c * nb + b0 + b);
            av[c] = _mm256_loadu_si256((const __m256i *)(a + (size_t)c * lda + (size_t)(b0 + b) * abs_ + aqs));
            /* the min chain, block after block as before, in the same loop: its fmas' latency
             * hides behind the dot products instead of running as a chain of its own after them */
            if (has_m) accm[c] = _mm256_fmadd_ps(P->m[b], _mm256_broadcast_ss(as + (size_t)c * nb + b0 + b), accm[c]);
        }
        for (int r = 0; r < R; r++) {
            const __m256i u = P->u[r][b];
            __m256i sw = _mm256_setzero_si256();
            if (!has_m) sw = P->s[r][b];
            for (int c = 0; c < C; c++) {
                const __m256i x = KFN(dot_us)(_mm256_setzero_si256(), u, has_m ? av[c] : _mm256_sign_epi8(av[c], sw));
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(x), _mm256_mul_ps(P->d[r][b], sd[c]), acc[r][c]);
            }
        }
    }
    if (!last) {
        for (int c = 0; c < C; c++) {
            for (int r = 0; r < R; r++) accb[c * LT_RMAX + r] = acc[r][c];
            if (has_m) accmb[c] = accm[c];
        }
        return;
    }
    for (int c = 0; c < C; c++) {
        float m[8];
        if (has_m) _mm256_storeu_ps(m, accm[c]);
        for (int r = 0; r < R; r++) {
            float s = hsum256(acc[r][c]);
            if (has_m) s += m[r];
            out[(size_t)c * ldo + r] = s;
        }
    }
}

static inline __attribute__((always_inline)) void KFN(legacy_gemm)(
    const int type, const int RT, const int CT, int n, const uint8_t *w, size_t ldw, int nr, const uint8_t *a,
    size_t lda, int nc, float *out, size_t ldo) {
    const int nb = n / 32;
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1;
    const size_t wbs = (size_t)legacy_block_bytes(type);
    const size_t abs_ = has_m ? sizeof(block_q8_1) : sizeof(block_q8_0);
    float ad[LG_SCALES], as[LG_SCALES];
    __m256 accb[LG_COLS * LT_RMAX], accmb[LG_COLS];
    KFN(lg_panel) P;
    const int cols = EL_MIN(LG_COLS, LG_SCALES / nb);
    for (int c0 = 0; c0 < nc; c0 += cols) {
        const int ncc = EL_MIN(cols, nc - c0);
        const uint8_t *A = a + (size_t)c0 * lda;
        for (int c = 0; c < ncc; c++)
            for (int b = 0; b < nb; b++) {
                const uint8_t *ab = A + (size_t)c * lda + (size_t)b * abs_;
                ad[c * nb + b] = load_half(ab);
                if (has_m) as[c * nb + b] = load_half(ab + 2);
            }
        pf_cursor pf = pf_start(w, ldw, RT, (size_t)nb * wbs);
        for (int r0 = 0; r0 < nr;) {
            const int R = nr - r0 >= RT ? RT : 1;  /* leftover rows one at a time */
            const uint8_t *W = w + (size_t)r0 * ldw;
            if (R < RT && r0 == nr - nr % RT) pf = pf_start(W, ldw, 1, (size_t)nb * wbs);
            for (int b0 = 0; b0 < nb; b0 += LG_KB) {
                const int nbk = EL_MIN(LG_KB, nb - b0), first = b0 == 0, last = b0 + nbk == nb;
                if (R == RT) KFN(lg_prep)(type, &P, W, ldw, RT, b0, nbk, &pf);
                else KFN(lg_prep)(type, &P, W, ldw, 1, b0, nbk, &pf);
                for (int c = 0; c < ncc;) {
                    float *o = out + (size_t)(c0 + c) * ldo + r0;
                    const uint8_t *Ac = A + (size_t)c * lda;
                    __m256 *ab = accb + c * LT_RMAX, *amb = accmb + c;
                    if (R == RT && c + CT <= ncc)
                        KFN(lg_tile)(type, &P, RT, Ac, lda, CT, ad + c * nb, as + c * nb, nb, b0, nbk, first,
                                     last, ab, amb, o, ldo);
                    else if (R == RT)
                        KFN(lg_tile)(type, &P, RT, Ac, lda, 1, ad + c * nb, as + c * nb, nb, b0, nbk, first,
                                     last, ab, amb, o, ldo);
                    else if (c + CT <= ncc)
                        KFN(lg_tile)(type, &P, 1, Ac, lda, CT, ad + c * nb, as + c * nb, nb, b0, nbk, first,
                                     last, ab, amb, o, ldo);
                    else
                        KFN(lg_tile)(type, &P, 1, Ac, lda, 1, ad + c * nb, as + c * nb, nb, b0, nbk, first,
                                     last, ab, amb, o, ldo);
                    c += c + CT <= ncc ? CT : 1;
                }
            }
            r0 += R;
        }
    }
}

#define LEGACY_KERNELS(tname, TYPE, GR, GC)                                                        \
    static void KFN(tname##_gemm)(int n, const void *w, size_t ldw, int nr, const void *a,         \
                                  size_t lda, int nc, float *out, size_t ldo) {                    \
        if (nc >= 2) KFN(legacy_gemm)(TYPE, GR, GC, n, w, ldw, nr, a, lda, nc, out, ldo);          \
        else if (nc == 1) KFN(lone_gemm)(TYPE, n, w, ldw, nr, a, out);                             \
    }                                                                                              \
    static void KFN(tname##_vec_dot)(int n, float *s, const void *x, const void *y) {              \
        KFN(lone_tile)(TYPE, n, x, 0, 1, y, s);                                                    \
    }

LEGACY_KERNELS(q4_1, EL_Q4_1, 4, 2)
LEGACY_KERNELS(q5_0, EL_Q5_0, 4, 2)
LEGACY_KERNELS(q5_1, EL_Q5_1, 4, 2)
LEGACY_KERNELS(q8_0, EL_Q8_0, 4, 2)
#undef LEGACY_KERNELS

/* ------------------------------------------------------------------------------------------
 * The legacy types in the batch order (quants_generic.c): per (row, column, block) the exact
 * integer sum of the block's 32 products, then one fma with dw * da. A tile of R <= 8 rows x C <= 8
 * columns: per block the rows unpacked once; per column each row's 8 int32 lanes (lone_tile's)
 * reduced by a vphaddd tree shared by the 8 rows (lane r: row r), then one cvt and one fma.
 * ------------------------------------------------------------------------------------------ */

/* lane r: the sum of the 8 lanes of v[r] */
static inline __m256i KFN(rows8_sums)(const __m256i v[8]) {
    const __m256i h0 = _mm256_hadd_epi32(v[0], v[1]), h1 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i h2 = _mm256_hadd_epi32(v[4], v[5]), h3 = _mm256_hadd_epi32(v[6], v[7]);
    /* halves of g0: rows 0..3 over lanes 0..3, then over lanes 4..7; g1: rows 4..7 */
    const __m256i g0 = _mm256_hadd_epi32(h0, h1), g1 = _mm256_hadd_epi32(h2, h3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31));
}

/* columns per batch-order tile: 8, so a verification step of 5-8 rows unpacks each block once
 * (with 4: Q4_1 76 -> 88 GFLOP/s at 5 columns, 85 -> 95 at 8; bench_kernels --isas avx2 --k 576
 * --rows 1536 --threads 1 --order batch) */
#define LB_C 8

/* a row tile's column at block ab (its d, then s for the types with a min): the 8 rows' integer
 * sums isum times their scales dw and the column's d into *acc, the min terms (mf, s) into *accm */
static inline void KFN(lb_add)(__m256i isum, __m256 dw, __m256 mf, const uint8_t *ab, int has_m, __m256 *acc,
                               __m256 *accm) {
    uint16_t h;
    memcpy(&h, ab, 2);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(_cvtsh_ss(h))), *acc);
    if (has_m) {
        memcpy(&h, ab + 2, 2);
        *accm = _mm256_fmadd_ps(mf, _mm256_set1_ps(_cvtsh_ss(h)), *accm);
    }
}

/* the C columns' sums of a row tile (accm: the min terms, types with one) to out */
static inline void KFN(lb_store)(const __m256 *acc, const __m256 *accm, int has_m, int C, int R, float *out,
                                 size_t ldo) {
    for (int c = 0; c < C; c++) {
        float o[8];
        _mm256_storeu_ps(o, has_m ? _mm256_add_ps(acc[c], accm[c]) : acc[c]);
        for (int r = 0; r < R; r++) out[(size_t)c * ldo + r] = o[r];
    }
}

/* R <= 8 rows x C <= LB_C columns: per block the rows' values unpacked once (to a small stack
 * panel), then per column 8 dot products and one reduction tree */
static inline __attribute__((always_inline)) void KFN(lbatch_tile)(const int type, int n, const uint8_t *w,
                                                                   size_t ldw, const int R, const uint8_t *a,
                                                                   size_t lda, const int C, float *out, size_t ldo) {
    const int nb = n / 32;
    const int has_m = type == EL_Q4_1 || type == EL_Q5_1;
    const size_t wbs = (size_t)legacy_block_bytes(type);
    const size_t abs_ = has_m ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const int aqs = has_m ? 4 : 2;
    const int off = type == EL_Q4_0 ? 8 : type == EL_Q5_0 ? 16 : (type == EL_Q8_0 && EL_VNNI) ? 128 : 0;
    const int signed_q8 = type == EL_Q8_0 && !EL_VNNI;  /* |w| against sign(w)*a */
    __m256 acc[LB_C], accm[LB_C];
    for (int c = 0; c < C; c++) acc[c] = accm[c] = _mm256_setzero_ps();
    pf_cursor pf = pf_start(w, ldw, R, (size_t)nb * wbs);
    for (size_t b = 0; b < (size_t)nb; b++) {
        pf_step(&pf, R, ldw, wbs);
        __m256i wq[8];
        uint16_t hd[8] = {0}, hm[8] = {0};
        for (int r = 0; r < 8; r++) {
            if (r >= R) {
                wq[r] = _mm256_setzero_si256();
                continue;
            }
            const uint8_t *blk = w + (size_t)r * ldw + b * wbs;
            wq[r] = legacy_unpack(type, blk);
            if (type == EL_Q8_0 && EL_VNNI) wq[r] = _mm256_xor_si256(wq[r], _mm256_set1_epi8((char)0x80));
            memcpy(&hd[r], blk, 2);
            if (has_m) memcpy(&hm[r], blk + 2, 2);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_setr_epi16((short)hd[0], (short)hd[1], (short)hd[2], (short)hd[3],
                                                         (short)hd[4], (short)hd[5], (short)hd[6], (short)hd[7]));
        const __m256 mf = _mm256_cvtph_ps(_mm_setr_epi16((short)hm[0], (short)hm[1], (short)hm[2], (short)hm[3],
                                                         (short)hm[4], (short)hm[5], (short)hm[6], (short)hm[7]));
        for (int c = 0; c < C; c++) {
            const uint8_t *ab = a + (size_t)c * lda + b * abs_;
            const __m256i av = _mm256_loadu_si256((const __m256i *)(ab + aqs));
            __m256i seed = _mm256_setzero_si256();
            if (off) seed = _mm256_sub_epi32(seed, KFN(dot_us)(seed, _mm256_set1_epi8((char)off), av));
            __m256i v[8];
            for (int r = 0; r < 8; r++) {
                if (r >= R) v[r] = _mm256_setzero_si256();
                else if (signed_q8)
                    v[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wq[r], wq[r]), _mm256_sign_epi8(av, wq[r])),
                                             _mm256_set1_epi16(1));
                else v[r] = KFN(dot_us)(seed, wq[r], av);
            }
            const __m256i isum = KFN(rows8_sums)(v);
            KFN(lb_add)(isum, dw, mf, ab, has_m, &acc[c], &accm[c]);
        }
    }
    KFN(lb_store)(acc, accm, has_m, C, R, out, ldo);
}

/* -offset * (the sum of a block's 32 quants at q) */
static inline int32_t KFN(lb_seed)(int off, const uint8_t *q) {
    const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), loadu256(q)), _mm256_set1_epi16(1));
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    return -off * _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1)));
}

/* lbatch_tile of the 4-bit types (Q4_0, Q4_1) for 2 <= C <= LB_C columns, its rows in the int32
 * lanes: per block the 8 rows' 16 packed bytes transposed once (lane r: 4 bytes of row r), then
 * unpacked, so that each column's 4 quants, broadcast, meet the 8 rows in one dot and the lanes
 * end with the rows' whole sums: no reduction tree per column. Without VNNI the 8 vpmaddubsw of a
 * column sum in int16 (u <= 15 against |a| <= 128: at most 8 * 3840 < 2^15) and widen once.
 * seed[c * nb + b]: -offset * the quants' sum of column c's block b (Q4_0; lb_gemm). Q5 and Q8_0
 * keep lbatch_tile: their 32 unpacked bytes take an 8 x 8 transpose, and with 16 ymm registers
 * that tile was no faster (Q8_0, plain AVX2, K 576, 1536 rows: 2 columns 46 -> 52 us a call) */
static inline __attribute__((always_inline)) void KFN(lbr_tile)(const int type, int n, const uint8_t *w,
                                                                size_t ldw, const int R, const uint8_t *a,
                                                                size_t lda, const int C, const int32_t *seed,
                                                                float *out, size_t ldo) {
    static const uint8_t zero16[16] = {0};
    const int nb = n / 32;
    const int has_m = type == EL_Q4_1, off = type == EL_Q4_0 ? 8 : 0;
    const size_t wbs = (size_t)legacy_block_bytes(type), qo = has_m ? offsetof(block_q4_1, qs) : offsetof(block_q4_0, qs);
    const size_t abs_ = has_m ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const int aqs = has_m ? 4 : 2;
    __m256 acc[LB_C], accm[LB_C];
    for (int c = 0; c < C; c++) acc[c] = accm[c] = _mm256_setzero_ps();
    pf_cursor pf = pf_start(w, ldw, R, (size_t)nb * wbs);
    for (size_t b = 0; b < (size_t)nb; b++) {
        pf_step(&pf, R, ldw, wbs);
        uint16_t hd[8] = {0}, hm[8] = {0};
        __m256i p[4], v[8];
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = w + (size_t)r * ldw + b * wbs;
            memcpy(&hd[r], blk, 2);
            if (has_m) memcpy(&hm[r], blk + 2, 2);
        }
        for (int i = 0; i < 4; i++) {  /* p[i]: the packed bytes of rows i (low lane) and i + 4 (high lane) */
            const uint8_t *lo = i < R ? w + (size_t)i * ldw + b * wbs + qo : zero16;
            const uint8_t *hi = i + 4 < R ? w + (size_t)(i + 4) * ldw + b * wbs + qo : zero16;
            p[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)lo)),
                                           _mm_loadu_si128((const __m128i *)hi), 1);
        }
        {  /* x[k] lane r: packed bytes 4k..4k+3 of row r */
            const __m256i a0 = _mm256_unpacklo_epi32(p[0], p[1]), a1 = _mm256_unpackhi_epi32(p[0], p[1]);
            const __m256i a2 = _mm256_unpacklo_epi32(p[2], p[3]), a3 = _mm256_unpackhi_epi32(p[2], p[3]);
            const __m256i x[4] = {_mm256_unpacklo_epi64(a0, a2), _mm256_unpackhi_epi64(a0, a2),
                                  _mm256_unpacklo_epi64(a1, a3), _mm256_unpackhi_epi64(a1, a3)};
            const __m256i m4 = _mm256_set1_epi8(0x0F);
            for (int k = 0; k < 4; k++)  /* v[k]: values 4k..4k+3; v[k + 4]: 16 + 4k.. */
                v[k] = _mm256_and_si256(x[k], m4), v[k + 4] = _mm256_and_si256(_mm256_srli_epi16(x[k], 4), m4);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hd));
        const __m256 mf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hm));
        for (int c = 0; c < C; c++) {
            const uint8_t *ab = a + (size_t)c * lda + b * abs_, *q = ab + aqs;
            __m256i bc[8];
            for (int k = 0; k < 8; k++) {
                uint32_t u;
                memcpy(&u, q + 4 * k, 4);
                bc[k] = _mm256_set1_epi32((int)u);
            }
            __m256i isum = off ? _mm256_set1_epi32(seed[(size_t)c * nb + b]) : _mm256_setzero_si256();
#if EL_VNNI
            __m256i s1 = _mm256_setzero_si256();
            for (int k = 0; k < 8; k += 2)
                isum = KFN(dot_us)(isum, v[k], bc[k]), s1 = KFN(dot_us)(s1, v[k + 1], bc[k + 1]);
            isum = _mm256_add_epi32(isum, s1);  /* (exact integers: any order) */
#else
            __m256i p16 = _mm256_maddubs_epi16(v[0], bc[0]);
            for (int k = 1; k < 8; k++) p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(v[k], bc[k]));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
#endif
            KFN(lb_add)(isum, dw, mf, ab, has_m, &acc[c], &accm[c]);
        }
    }
    KFN(lb_store)(acc, accm, has_m, C, R, out, ldo);
}

/* seeds for at most this many (column, block) pairs at a time (on the stack) */
#define LB_SEEDS 8192

/* batch-order gemm of the 4-bit types: 8-row tiles of up to LB_C columns; one column through
 * lbatch_tile, more through lbr_tile with their seeds worked out once per call (a chunk of columns
 * at a time) */
static inline __attribute__((always_inline)) void KFN(lb4_gemm)(const int type, int n, const uint8_t *W, size_t ldw,
                                                                int nr, const uint8_t *A, size_t lda, int nc,
                                                                float *out, size_t ldo) {
    const int nb = n / 32, off = type == EL_Q4_0 ? 8 : 0;
    const size_t abs_ = type == EL_Q4_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t aq = type == EL_Q4_1 ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    const int chunk = EL_MAX(LB_C, LB_SEEDS / nb / LB_C * LB_C);
    int32_t seed[off ? (size_t)EL_MIN(chunk, nc) * nb : 1];
    for (int c0 = 0; c0 < nc; c0 += chunk) {
        const int cn = EL_MIN(chunk, nc - c0);
        for (int c = 0; off && nc > 1 && c < cn; c++)
            for (int b = 0; b < nb; b++)
                seed[(size_t)c * nb + b] = KFN(lb_seed)(off, A + (size_t)(c0 + c) * lda + (size_t)b * abs_ + aq);
        for (int r = 0; r < nr; r += 8)
            for (int c = c0; c < c0 + cn; c += LB_C) {
                const int R = EL_MIN(8, nr - r), C = EL_MIN(LB_C, c0 + cn - c);
                const int32_t *sd = seed + (size_t)(c - c0) * nb;
                const uint8_t *w = W + r * ldw, *a = A + c * lda;
                float *o = out + c * ldo + r;
#define LBR(RR, CC) KFN(lbr_tile)(type, n, w, ldw, RR, a, lda, CC, sd, o, ldo)
                if (C == 1 && R == 8) KFN(lbatch_tile)(type, n, w, ldw, 8, a, lda, 1, o, ldo);
                else if (C == 1) KFN(lbatch_tile)(type, n, w, ldw, R, a, lda, 1, o, ldo);
                else if (R < 8) LBR(R, C);
                else switch (C) {
                    case 8: LBR(8, 8); break;
                    case 7: LBR(8, 7); break;
                    case 6: LBR(8, 6); break;
                    case 5: LBR(8, 5); break;
                    case 4: LBR(8, 4); break;
                    case 3: LBR(8, 3); break;
                    default: LBR(8, 2);
                    }
#undef LBR
            }
    }
}

#define LB_SHAPE(TYPE, RR)                                                                  \
    switch (C) {                                                                            \
    case 8: KFN(lbatch_tile)(TYPE, n, w, ldw, RR, a, lda, 8, out, ldo); break;               \
    case 7: KFN(lbatch_tile)(TYPE, n, w, ldw, RR, a, lda, 7, out, ldo); break;               \
    case 6: KFN(lbatch_tile)(TYPE, n, w, ldw, RR, a, lda, 6, out, ldo); break;               \
    case 5: KFN(lbatch_tile)(TYPE, n, w, ldw, RR, a, lda, 5, out, ldo); break;               \
    case 4: KFN(lbatch_tile)(TYPE, n, w, ldw, RR, a, lda, 4, out, ldo); break;               \
    case 3: KFN(lbatch_tile)(TYPE, n, w, ldw, RR, a, lda, 3, out, ldo); break;               \
    case 2: KFN(lbatch_tile)(TYPE, n, w, ldw, RR, a, lda, 2, out, ldo); break;               \
    default: KFN(lbatch_tile)(TYPE, n, w, ldw, RR, a, lda, 1, out, ldo);                     \
    }
#define LBATCH_KERNELS(tname, TYPE)                                                                \
    static void KFN(tname##_batch_tile)(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a, \
                                        size_t lda, int C, float *out, size_t ldo) {               \
        if (R == 8) LB_SHAPE(TYPE, 8)                                                              \
        else LB_SHAPE(TYPE, R)                                                                     \
    }                                                                                              \
    static void KFN(tname##_batch_gemm)(int n, const void *w, size_t ldw, int nr, const void *a,   \
                                        size_t lda, int nc, float *out, size_t ldo) {              \
        const uint8_t *W = w, *A = a;                                                              \
        if (TYPE == EL_Q4_0 || TYPE == EL_Q4_1) {                                                  \
            KFN(lb4_gemm)(TYPE, n, W, ldw, nr, A, lda, nc, out, ldo);                              \
            return;                                                                                \
        }                                                                                          \
        for (int r = 0; r < nr; r += 8)                                                            \
            for (int c = 0; c < nc; c += LB_C)                                                     \
                KFN(tname##_batch_tile)(n, W + r * ldw, ldw, EL_MIN(8, nr - r), A + c * lda, lda,  \
                                        EL_MIN(LB_C, nc - c), out + c * ldo + r, ldo);             \
    }                                                                                              \
    static void KFN(tname##_batch_vec_dot)(int n, float *s, const void *x, const void *y) {        \
        KFN(lbatch_tile)(TYPE, n, x, 0, 1, y, 0, 1, s, 0);                                         \
    }

LBATCH_KERNELS(q4_0, EL_Q4_0)
LBATCH_KERNELS(q4_1, EL_Q4_1)
LBATCH_KERNELS(q5_0, EL_Q5_0)
LBATCH_KERNELS(q5_1, EL_Q5_1)
LBATCH_KERNELS(q8_0, EL_Q8_0)
#undef LBATCH_KERNELS
#undef LB_SHAPE

/* ------------------------------------------------------------------------------------------
 * K-quants (256-value super-blocks) against Q8_K. Per super-block and (row, column) the
 * integer sums are exact (int32 lanes), and the float steps are the generic twins' own
 * (kquants_generic.c), so these kernels return exactly what the generic twins return. Weight
 * values are unpacked 32 at a time (one "chunk", k = 0..7) into unsigned bytes q; vpmaddubsw
 * against the activation gives int16 pair sums, which vpmaddwd / vpdpwssd multiply by the group
 * scale of their lane (int16 scale vector per chunk), so int32 lane l sums values 4l..4l+3 of
 * every chunk. Types with an offset (Q3_K: q - 4, Q6_K: q - 32) seed the sum with -offset *
 * sc_g * bsums_g (lane l: groups 2l, 2l+1); types with a min (Q2_K, Q4_K, Q5_K) keep a second
 * sum, m_g * bsums_g.
 *
 * The float part works on the pairs (row r, column c) of a tile side by side, pair p = r + 2c in
 * float lane p (lane p + 4 for a second quantity): the integer totals of up to four pairs come
 * out of one horizontal-add tree, and every float operation is lane-wise, so each pair gets the
 * same operations whatever the tile shape. Per super-block:
 *   Q3_K, Q6_K:  acc = fma(isum * d, d_act, acc)
 *   Q2_K, Q5_K:  acc = fma(fma(-dmin, summs, isum * d), d_act, acc)
 *   Q4_K:        per quarter (64 values) j: acc = fma(I_j, d * d_act, acc), accm = fma(M_j,
 *                dmin * d_act, accm) (lanes p and p + 4 of one vector); result acc - accm
 * and the small-batch orders (el_small_rows):
 *   Q4_K small:  as Q4_K with one step per super-block (I, M its totals)
 *   Q6_K small:  8 float lanes per pair, lane l = fma(d_act * d, int lane l, lane l), hsum8 at
 *                the end (the int lanes, offset seed included, are the generic twin's).
 *   Q5_K small:  the same lanes, and the mins' scalar chain summs = fma(-d_act * dmin, M, summs)
 *                added after the hsum8.
 *   Q3_K small:  the same lanes, each with its own -4 * scale * q8 terms (ggml's vec_dot), not
 *                the bsums seed.
 * ------------------------------------------------------------------------------------------ */

/* per-row state of one super-block */
typedef struct {
    __m256i s0, s1;  /* int16 scale tables the chunk shuffles pick from */
    __m256i mins;    /* int16 per bsums entry: min (Q2_K/Q4_K/Q5_K) or -offset*scale (Q3_K/Q6_K) */
} KFN(ksb);

/* v of pair p = r + 2c, zero for pairs outside the R x C tile */
static inline __attribute__((always_inline)) __m256i KFN(pair)(__m256i v[KT_RMAX][KT_CMAX], const int R,
                                                                const int C, const int p) {
    return p % 2 < R && p / 2 < C ? v[p % 2][p / 2] : _mm256_setzero_si256();
}

static inline __attribute__((always_inline)) void KFN(kquant_tile)(
    const int type, const int small, int n, const uint8_t *w, size_t ldw, const int R, const uint8_t *a,
    size_t lda, const int C, float *out, size_t ldo) {
    const int nb = n / QK_K;
    const size_t wbs = (size_t)kquant_block_bytes(type);
    const int has_min = type == EL_Q2_K || type == EL_Q4_K || type == EL_Q5_K;
    const int lanes8 = (type == EL_Q3_K || type == EL_Q5_K || type == EL_Q6_K) && small;  /* 8 float lanes per pair */
    const int q3s = type == EL_Q3_K && small;
    const int quarters = type == EL_Q4_K && !small;   /* Q4_K: a float step per quarter */
    __m128 acc = _mm_setzero_ps();                    /* lane p (not Q4_K) */
    __m256 acc2 = _mm256_setzero_ps();                /* Q4_K: acc in lane p, accm in lane p + 4 */
    __m256 acc8[KT_RMAX][KT_CMAX];
    float summs[KT_RMAX][KT_CMAX];  /* Q5_K small: the mins' chain */
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc8[r][c] = _mm256_setzero_ps(), summs[r][c] = 0.0f;

    pf_cursor pf = pf_start(w, ldw, R, (size_t)nb * wbs);
    for (int i = 0; i < nb; i++) {
        pf_step(&pf, R, ldw, wbs);
        KFN(ksb) sb[KT_RMAX];
        const uint8_t *xb[KT_RMAX];
        const block_q8_K *yb[KT_CMAX];
        for (int r = 0; r < R; r++) {
            xb[r] = w + (size_t)r * ldw + (size_t)i * wbs;
            kquant_prep(type, xb[r], &sb[r].s0, &sb[r].s1, &sb[r].mins);
        }
        for (int c = 0; c < C; c++) yb[c] = (const block_q8_K *)(a + (size_t)c * lda) + i;
        const uint8_t *x1 = R > 1 ? xb[1] : xb[0];
        const float y0 = yb[0]->d, y1 = C > 1 ? yb[1]->d : y0;
        const __m128 yd = _mm_shuffle_ps(_mm_set1_ps(y0), _mm_set1_ps(y1), 0);  /* lane p: d_act of c */

        __m256i isum[KT_RMAX][KT_CMAX], msum[KT_RMAX][KT_CMAX];
        for (int c = 0; c < C; c++) {
            const __m256i bs = _mm256_loadu_si256((const __m256i *)yb[c]->bsums);
            for (int r = 0; r < R; r++) {
                const __m256i p = _mm256_madd_epi16(sb[r].mins, bs);
                isum[r][c] = has_min || q3s ? _mm256_setzero_si256() : p;
                msum[r][c] = p;
            }
        }

        /* Q4_K: lane p + 4 of d2 is dmin * d_act; quarters: mq[0] = [M_0 | M_2], mq[1] = [M_1 | M_3]
         * over the pairs */
        __m256 d2 = _mm256_setzero_ps();
        __m256i mq[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        if (type == EL_Q4_K) {
            d2 = _mm256_mul_ps(halves_rows2(xb[0], x1, offsetof(block_q4_K, d), offsetof(block_q4_K, dmin)),
                               _mm256_set_m128(yd, yd));
            if (quarters) {
                const __m256 h01 = _mm256_castsi256_ps(
                    _mm256_hadd_epi32(KFN(pair)(msum, R, C, 0), KFN(pair)(msum, R, C, 1)));
                const __m256 h23 = _mm256_castsi256_ps(
                    _mm256_hadd_epi32(KFN(pair)(msum, R, C, 2), KFN(pair)(msum, R, C, 3)));
                mq[0] = _mm256_castps_si256(_mm256_shuffle_ps(h01, h23, _MM_SHUFFLE(2, 0, 2, 0)));
                mq[1] = _mm256_castps_si256(_mm256_shuffle_ps(h01, h23, _MM_SHUFFLE(3, 1, 3, 1)));
            }
        }

#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i q[KT_RMAX], sc[KT_RMAX];
            for (int r = 0; r < R; r++) {
                q[r] = kquant_chunk(type, xb[r], k);
                sc[r] = kquant_chunk_scales(type, sb[r].s0, sb[r].s1, k);
            }
            for (int c = 0; c < C; c++) {
                const __m256i av = _mm256_loadu_si256((const __m256i *)(yb[c]->qs + 32 * k));
                const __m256i a4 = q3s ? _mm256_maddubs_epi16(_mm256_set1_epi8(4), av) : _mm256_setzero_si256();
                for (int r = 0; r < R; r++) {
                    const __m256i p16 = _mm256_maddubs_epi16(q[r], av);  /* Q3_K small: minus 4 * q8 */
                    isum[r][c] = KFN(dot_ww)(isum[r][c], q3s ? _mm256_sub_epi16(p16, a4) : p16, sc[r]);
                }
            }
            if (quarters && (k & 1)) {  /* end of quarter j: [I_j | M_j] over the pairs */
                const int j = k / 2;
                const __m256i e = hsum_halves4(KFN(pair)(isum, R, C, 0), KFN(pair)(isum, R, C, 1),
                                               KFN(pair)(isum, R, C, 2), KFN(pair)(isum, R, C, 3));
                /* the immediate spelled out in each branch: clang wants a constant expression */
                const __m256i em = j < 2 ? _mm256_permute2x128_si256(e, mq[j & 1], 0x20)
                                         : _mm256_permute2x128_si256(e, mq[j & 1], 0x30);
                const __m256i x = _mm256_add_epi32(em, _mm256_permute2x128_si256(e, e, 0x81));
                acc2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(x), d2, acc2);
                for (int r = 0; r < R; r++)
                    for (int c = 0; c < C; c++) isum[r][c] = _mm256_setzero_si256();
            }
        }

        if (quarters) continue;
        if (lanes8) {
            for (int r = 0; r < R; r++) {
                const float d = load_half(xb[r] + (type == EL_Q6_K ? offsetof(block_q6_K, d)
                                                   : type == EL_Q3_K ? offsetof(block_q3_K, d) : offsetof(block_q5_K, d)));
                for (int c = 0; c < C; c++) {
                    acc8[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(yb[c]->d * d), _mm256_cvtepi32_ps(isum[r][c]), acc8[r][c]);
                    if (type == EL_Q5_K) {
                        const float dmin = -yb[c]->d * load_half(xb[r] + offsetof(block_q5_K, dmin));
                        summs[r][c] = fmaf(dmin, (float)hsum_i32(msum[r][c]), summs[r][c]);
                    }
                }
            }
            continue;
        }
        const __m256i e = hsum_halves4(KFN(pair)(isum, R, C, 0), KFN(pair)(isum, R, C, 1),
                                       KFN(pair)(isum, R, C, 2), KFN(pair)(isum, R, C, 3));
        if (!has_min) {  /* Q3_K, Q6_K */
            const size_t od = type == EL_Q3_K ? offsetof(block_q3_K, d) : offsetof(block_q6_K, d);
            const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(e), _mm256_extracti128_si256(e, 1));
            acc = _mm_fmadd_ps(_mm_mul_ps(_mm_cvtepi32_ps(s), halves_rows(xb[0], x1, od)), yd, acc);
            continue;
        }
        const __m256i m = hsum_halves4(KFN(pair)(msum, R, C, 0), KFN(pair)(msum, R, C, 1),
                                       KFN(pair)(msum, R, C, 2), KFN(pair)(msum, R, C, 3));
        const __m256 x = _mm256_cvtepi32_ps(fold_halves(e, m));  /* [isum | summs] */
        if (type == EL_Q4_K) {  /* small */
            acc2 = _mm256_fmadd_ps(x, d2, acc2);
            continue;
        }
        const __m256 dd = type == EL_Q2_K
                              ? halves_rows2(xb[0], x1, offsetof(block_q2_K, d), offsetof(block_q2_K, dmin))
                              : halves_rows2(xb[0], x1, offsetof(block_q5_K, d), offsetof(block_q5_K, dmin));
        const __m128 t = _mm_fnmadd_ps(_mm256_extractf128_ps(dd, 1), _mm256_extractf128_ps(x, 1),
                                       _mm_mul_ps(_mm256_castps256_ps128(x), _mm256_castps256_ps128(dd)));
        acc = _mm_fmadd_ps(t, yd, acc);
    }
    float res[4];
    if (type == EL_Q4_K) acc = _mm_sub_ps(_mm256_castps256_ps128(acc2), _mm256_extractf128_ps(acc2, 1));
    _mm_storeu_ps(res, acc);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            out[(size_t)c * ldo + r] = !lanes8 ? res[r + 2 * c]
                                       : type == EL_Q5_K ? hsum256(acc8[r][c]) + summs[r][c] : hsum256(acc8[r][c]);
}

/* ------------------------------------------------------------------------------------------
 * The same K-quant dot products for many columns at once (gemm with nc >= KG_MIN_COLS, the main
 * order: not the small-batch kernels), the float steps of every (row, column) exactly kquant_tile's, so
 * the results are its bits. Rows are taken KG_R at a time and super-block after super-block:
 * the rows' chunks are unpacked once into a panel (unsigned values and int16 scales per chunk,
 * kquant_prep's mins, the f16 scales as floats), then every tile of KG_C columns reads it from
 * L1. A tile holds its 8 pairs p = r + KG_R * c in float lanes p: the integer totals of the 8
 * pairs come out of one horizontal-add tree, and each pair gets kquant_tile's lane operations:
 *   Q3_K, Q6_K:  acc = fma(isum * d, d_act, acc)
 *   Q2_K, Q5_K:  acc = fma(fma(-dmin, summs, isum * d), d_act, acc)
 *   Q4_K:        per quarter j: accI = fma(I_j, d * d_act, accI), accM = fma(M_j, dmin * d_act,
 *                accM); result accI - accM. M_j = m_2j * bs_2j + m_2j+1 * bs_2j+1 (bs_g: the
 *                activation sum over group g, the two bsums of its 32 values), one vpmaddwd of
 *                the rows' (m_2j, m_2j+1) against the columns' (bs_2j, bs_2j+1).
 * The accumulators wait in a small buffer between super-blocks (same chains, block after block).
 * Leftover rows repeat the last row, an odd last column the one before it (computed, not stored).
 * ------------------------------------------------------------------------------------------ */

#define KG_R 4
#define KG_C 2
#define KG_MIN_COLS 8  /* fewer columns: the 2 x 2 tiles (the panel does not pay: 0.8x at 4, 1.0x at 6) */
#define KG_COLS 32     /* columns a pass takes */
#define KG_BSG 16384   /* int16 group sums (Q4_K) a pass keeps: KG_COLS columns of 8 per super-block */

typedef struct {
    __m256i q[KG_R][8];    /* chunk k of row r: unsigned values */
    __m256i sc[KG_R][8];   /* its int16 scale per lane */
    __m256i mins[KG_R];    /* kquant_prep's mins */
    __m128i mq[4];         /* Q4_K, quarter j: row r's (m_2j, m_2j+1) in 32-bit lane r */
    __m256 d, dm;          /* lane p: d (dmin) of row p % KG_R */
} KFN(kg_panel);

static inline __attribute__((always_inline)) void KFN(kg_prep)(const int type, KFN(kg_panel) *P,
                                                               const uint8_t *const *xb, pf_cursor *pf, size_t ldw) {
    const size_t wbs = (size_t)kquant_block_bytes(type);
    pf_step(pf, KG_R, ldw, wbs);
    size_t od = offsetof(block_q6_K, d), odm = 0;
    switch (type) {
    case EL_Q2_K: od = offsetof(block_q2_K, d), odm = offsetof(block_q2_K, dmin); break;
    case EL_Q3_K: od = offsetof(block_q3_K, d); break;
    case EL_Q4_K: od = offsetof(block_q4_K, d), odm = offsetof(block_q4_K, dmin); break;
    case EL_Q5_K: od = offsetof(block_q5_K, d), odm = offsetof(block_q5_K, dmin); break;
    default: break;
    }
    uint16_t hd[KG_R], hm[KG_R] = {0};
    __m128i mr[KG_R];
    for (int r = 0; r < KG_R; r++) {
        __m256i s0, s1;
        kquant_prep(type, xb[r], &s0, &s1, &P->mins[r]);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            P->q[r][k] = kquant_chunk(type, xb[r], k);
            P->sc[r][k] = kquant_chunk_scales(type, s0, s1, k);
        }
        memcpy(&hd[r], xb[r] + od, 2);
        if (odm) memcpy(&hm[r], xb[r] + odm, 2);
        if (type == EL_Q4_K) {
            uint32_t sc[2], m[2];
            k4_scales_mins(xb[r] + offsetof(block_q4_K, scales), sc, m);
            mr[r] = _mm_cvtepu8_epi16(_mm_setr_epi32((int)m[0], (int)m[1], 0, 0));  /* 32-bit lane j: (m_2j, m_2j+1) */
        }
    }
    const __m128i h = _mm_setr_epi16((short)hd[0], (short)hd[1], (short)hd[2], (short)hd[3], (short)hd[0], (short)hd[1],
                                     (short)hd[2], (short)hd[3]);
    P->d = _mm256_cvtph_ps(h);
    if (odm)
        P->dm = _mm256_cvtph_ps(_mm_setr_epi16((short)hm[0], (short)hm[1], (short)hm[2], (short)hm[3], (short)hm[0],
                                               (short)hm[1], (short)hm[2], (short)hm[3]));
    if (type == EL_Q4_K) {  /* transpose: quarter j, row r */
        const __m128i t0 = _mm_unpacklo_epi32(mr[0], mr[1]), t1 = _mm_unpacklo_epi32(mr[2], mr[3]);
        const __m128i t2 = _mm_unpackhi_epi32(mr[0], mr[1]), t3 = _mm_unpackhi_epi32(mr[2], mr[3]);
        P->mq[0] = _mm_unpacklo_epi64(t0, t1);
        P->mq[1] = _mm_unpackhi_epi64(t0, t1);
        P->mq[2] = _mm_unpacklo_epi64(t2, t3);
        P->mq[3] = _mm_unpackhi_epi64(t2, t3);
    }
}

/* lane p: the total of v[p]'s 8 int32 lanes */
static inline __m256i KFN(kg_totals)(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* 32-value group k of the panel's rows against columns y0, y1: isum[r] (column 0) and
 * isum[r + KG_R] (column 1) gain the scaled integer products */
static inline __attribute__((always_inline)) void KFN(kg_group)(const KFN(kg_panel) *P, const block_q8_K *y0,
                                                                const block_q8_K *y1, int k, __m256i isum[8]) {
    const __m256i a0 = _mm256_loadu_si256((const __m256i *)(y0->qs + 32 * k));
    const __m256i a1 = _mm256_loadu_si256((const __m256i *)(y1->qs + 32 * k));
    for (int r = 0; r < KG_R; r++) {
        const __m256i q = P->q[r][k], sc = P->sc[r][k];
        isum[r] = KFN(dot_ww)(isum[r], _mm256_maddubs_epi16(q, a0), sc);
        isum[r + KG_R] = KFN(dot_ww)(isum[r + KG_R], _mm256_maddubs_epi16(q, a1), sc);
    }
}

/* one super-block of a KG_R x KG_C tile: columns y[0], y[1] (block i); bsg: Q4_K's group sums
 * of the two columns, 8 per column; acc[0] (and acc[1], Q4_K's accM) carry the chains */
static inline __attribute__((always_inline)) void KFN(kg_tile)(const int type, const KFN(kg_panel) *P,
                                                               const block_q8_K *y0, const block_q8_K *y1,
                                                               const int16_t *bsg0, const int16_t *bsg1, __m256 *acc) {
    const int has_min = type == EL_Q2_K || type == EL_Q4_K || type == EL_Q5_K;
    const __m256 da = _mm256_set_m128(_mm_set1_ps(y1->d), _mm_set1_ps(y0->d));  /* lane p: d_act of column p / KG_R */
    __m256i isum[8];
    if (type == EL_Q4_K) {
        const __m256 dI = _mm256_mul_ps(P->d, da), dM = _mm256_mul_ps(P->dm, da);
        __m256 accI = acc[0], accM = acc[1];
        for (int j = 0; j < 4; j++) {
            for (int p = 0; p < 8; p++) isum[p] = _mm256_setzero_si256();
#pragma GCC unroll 2
            for (int k = 2 * j; k < 2 * j + 2; k++) KFN(kg_group)(P, y0, y1, k, isum);
            uint32_t b0, b1;
            memcpy(&b0, bsg0 + 2 * j, 4);
            memcpy(&b1, bsg1 + 2 * j, 4);
            const __m256i M = _mm256_madd_epi16(_mm256_set_m128i(P->mq[j], P->mq[j]),
                                                _mm256_set_m128i(_mm_set1_epi32((int)b1), _mm_set1_epi32((int)b0)));
            accI = _mm256_fmadd_ps(_mm256_cvtepi32_ps(KFN(kg_totals)(isum)), dI, accI);
            accM = _mm256_fmadd_ps(_mm256_cvtepi32_ps(M), dM, accM);
        }
        acc[0] = accI, acc[1] = accM;
        return;
    }
    const __m256i bs0 = _mm256_loadu_si256((const __m256i *)y0->bsums);
    const __m256i bs1 = _mm256_loadu_si256((const __m256i *)y1->bsums);
    __m256i summs = _mm256_setzero_si256();
    /* mins . bsums: Q2_K / Q5_K's min term (summs), Q3_K / Q6_K's offset seed of isum */
    for (int r = 0; r < KG_R; r++) {
        isum[r] = _mm256_madd_epi16(P->mins[r], bs0);
        isum[r + KG_R] = _mm256_madd_epi16(P->mins[r], bs1);
    }
    if (has_min) {
        summs = KFN(kg_totals)(isum);
        for (int p = 0; p < 8; p++) isum[p] = _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) KFN(kg_group)(P, y0, y1, k, isum);
    const __m256 x = _mm256_cvtepi32_ps(KFN(kg_totals)(isum));
    if (has_min)
        acc[0] = _mm256_fmadd_ps(_mm256_fnmadd_ps(P->dm, _mm256_cvtepi32_ps(summs), _mm256_mul_ps(x, P->d)), da, acc[0]);
    else
        acc[0] = _mm256_fmadd_ps(_mm256_mul_ps(x, P->d), da, acc[0]);
}

static inline __attribute__((always_inline)) void KFN(kquant_gemm)(const int type, int n, const uint8_t *w, size_t ldw,
                                                                   int nr, const uint8_t *a, size_t lda, int nc,
                                                                   float *out, size_t ldo) {
    const int nb = n / QK_K;
    const size_t wbs = (size_t)kquant_block_bytes(type);
    int16_t bsg[KG_BSG];
    __m256 accb[KG_COLS / KG_C][2];
    KFN(kg_panel) P;
    const int cols = EL_MIN(KG_COLS, KG_BSG / (8 * nb));
    for (int c0 = 0; c0 < nc; c0 += cols) {
        const int ncc = EL_MIN(cols, nc - c0);
        const uint8_t *A = a + (size_t)c0 * lda;
        if (type == EL_Q4_K)
            for (int c = 0; c < ncc; c++)
                for (int i = 0; i < nb; i++) {
                    const block_q8_K *y = (const block_q8_K *)(A + (size_t)c * lda) + i;
                    for (int g = 0; g < 8; g++) bsg[(c * nb + i) * 8 + g] = (int16_t)(y->bsums[2 * g] + y->bsums[2 * g + 1]);
                }
        pf_cursor pf = pf_start(w, ldw, KG_R, (size_t)nb * wbs);
        for (int r0 = 0; r0 < nr; r0 += KG_R) {
            const int R = EL_MIN(KG_R, nr - r0);
            for (int i = 0; i < nb; i++) {
                const uint8_t *xb[KG_R];
                for (int r = 0; r < KG_R; r++) xb[r] = w + (size_t)(r0 + EL_MIN(r, R - 1)) * ldw + (size_t)i * wbs;
                KFN(kg_prep)(type, &P, xb, &pf, ldw);
                for (int c = 0; c < ncc; c += KG_C) {
                    const int C = EL_MIN(KG_C, ncc - c), c1 = c + C - 1;
                    __m256 *acc = accb[c / KG_C];
                    if (i == 0) acc[0] = acc[1] = _mm256_setzero_ps();
                    KFN(kg_tile)(type, &P, (const block_q8_K *)(A + (size_t)c * lda) + i,
                                 (const block_q8_K *)(A + (size_t)c1 * lda) + i, bsg + (c * nb + i) * 8,
                                 bsg + (c1 * nb + i) * 8, acc);
                    if (i < nb - 1) continue;
                    float res[8];
                    _mm256_storeu_ps(res, type == EL_Q4_K ? _mm256_sub_ps(acc[0], acc[1]) : acc[0]);
                    for (int cc = 0; cc < C; cc++)
                        for (int r = 0; r < R; r++) out[(size_t)(c0 + c + cc) * ldo + r0 + r] = res[r + KG_R * cc];
                }
            }
        }
    }
}

#define KQ_TILE(X, RR, CC) KFN(kquant_tile)(EL_UNPAREN X, n, w, ldw, RR, a, lda, CC, out, ldo)
#define KQUANT_KERNELS(tname, TYPE, SMALL, RT, CT, RT1)                                            \
    static void KFN(tname##_tile)(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a,    \
                                  size_t lda, int C, float *out, size_t ldo) {                     \
        TILE_SHAPES(KQ_TILE, (TYPE, SMALL), RT, CT, RT1, R, C);                                    \
    }                                                                                              \
    static void KFN(tname##_gemm)(int n, const void *w, size_t ldw, int nr, const void *a,         \
                                  size_t lda, int nc, float *out, size_t ldo) {                    \
        if (nc >= KG_MIN_COLS && !SMALL && n / QK_K <= KG_BSG / 8 / KG_C)                          \
            KFN(kquant_gemm)(TYPE, n, w, ldw, nr, a, lda, nc, out, ldo);                           \
        else gemm_tiles(KFN(tname##_tile), RT, CT, RT1, n, w, ldw, nr, a, lda, nc, out, ldo);      \
    }                                                                                              \
    static void KFN(tname##_vec_dot)(int n, float *s, const void *x, const void *y) {              \
        KFN(kquant_tile)(TYPE, SMALL, n, x, 0, 1, y, 0, 1, s, 0);                                  \
    }

KQUANT_KERNELS(q2_K, EL_Q2_K, 0, 2, 2, 2)
KQUANT_KERNELS(q3_K, EL_Q3_K, 0, 2, 2, 2)
KQUANT_KERNELS(q4_K, EL_Q4_K, 0, 2, 2, 2)
KQUANT_KERNELS(q4_K_small, EL_Q4_K, 1, 2, 2, 2)
KQUANT_KERNELS(q5_K, EL_Q5_K, 0, 2, 2, 2)
KQUANT_KERNELS(q6_K, EL_Q6_K, 0, 2, 2, 2)
KQUANT_KERNELS(q3_K_small, EL_Q3_K, 1, 2, 2, 2)
KQUANT_KERNELS(q5_K_small, EL_Q5_K, 1, 2, 2, 2)
KQUANT_KERNELS(q6_K_small, EL_Q6_K, 1, 2, 2, 2)
#undef KQUANT_KERNELS
#undef KQ_TILE

/* ------------------------------------------------------------------------------------------
 * Scores against a quantized key tile (el_vops.qk_q8_0 / qk_q4_0; layout in el_internal.h), half
 * a tile (8 keys) at a time: per 32-dim block, each 32-byte vector holds 4 quants of each key and
 * is dotted with 4 of a query's quants broadcast, so the int32 lanes are the blocks' exact dot
 * products (q8_0 without VNNI: |k| against sign(k) * q; with VNNI: k + 128, and q4_0: the nibble,
 * from -offset * qsum); then one fma per key of dk * dq, in block order, as the twin. Each key
 * vector is loaded once for the N <= 4 queries.
 * ------------------------------------------------------------------------------------------ */
static inline __attribute__((always_inline)) void KFN(qk_q)(const int q4, const int N, int nb, const uint8_t *q,
                                                            size_t ldq, const int32_t *qsum, const uint8_t *kt,
                                                            float *out) {
    const int ng = q4 ? 4 : 8, off = q4 ? 8 : EL_VNNI ? 128 : 0;
    const uint8_t *qs = kt + (size_t)nb * 32;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int h = 0; h < 2; h++) {
        __m256 acc[4];
        for (int j = 0; j < N; j++) acc[j] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const uint8_t *kb = qs + (size_t)b * ng * 64 + h * 32;
            const block_q8_0 *qb[4];
            __m256i s[4];
            for (int j = 0; j < N; j++) {
                qb[j] = (const block_q8_0 *)(q + (size_t)j * ldq) + b;
                s[j] = _mm256_set1_epi32(-off * qsum[j * nb + b]);
            }
            for (int g = 0; g < ng; g++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(kb + (size_t)g * 64));
                if (q4) {
                    const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    for (int j = 0; j < N; j++) {
                        s[j] = KFN(dot_us)(s[j], lo, _mm256_set1_epi32((int)load_u32(qb[j]->qs + 4 * g)));
                        s[j] = KFN(dot_us)(s[j], hi, _mm256_set1_epi32((int)load_u32(qb[j]->qs + 16 + 4 * g)));
                    }
                } else if (EL_VNNI) {
                    const __m256i u = _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
                    for (int j = 0; j < N; j++)
                        s[j] = KFN(dot_us)(s[j], u, _mm256_set1_epi32((int)load_u32(qb[j]->qs + 4 * g)));
                } else {
                    const __m256i u = _mm256_sign_epi8(v, v);  /* |k| <= 128: pairs of products fit int16 */
                    for (int j = 0; j < N; j++)
                        s[j] = KFN(dot_us)(s[j], u, _mm256_sign_epi8(_mm256_set1_epi32((int)load_u32(qb[j]->qs + 4 * g)), v));
                }
            }
            const __m256 dk = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kt + (size_t)b * 32 + h * 16)));
            for (int j = 0; j < N; j++)
                acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dk, bcast_half(&qb[j]->d)), _mm256_cvtepi32_ps(s[j]), acc[j]);
        }
        for (int j = 0; j < N; j++) _mm256_storeu_ps(out + j * 16 + h * 8, acc[j]);
    }
}

static inline __attribute__((always_inline)) void KFN(qk_q_all)(const int q4, int hk, const uint8_t *q, size_t ldq,
                                                                const int32_t *qsum, int nq, const uint8_t *kt,
                                                                float *out) {
    const int nb = hk / 32;
    for (int j = 0; j < nq; j += 4) {
        const uint8_t *qj = q + (size_t)j * ldq;
        const int32_t *sj = qsum + (size_t)j * nb;
        switch (EL_MIN(4, nq - j)) {  /* (the query count a compile-time constant: accumulators in registers) */
        case 1: KFN(qk_q)(q4, 1, nb, qj, ldq, sj, kt, out + j * 16); break;
        case 2: KFN(qk_q)(q4, 2, nb, qj, ldq, sj, kt, out + j * 16); break;
        case 3: KFN(qk_q)(q4, 3, nb, qj, ldq, sj, kt, out + j * 16); break;
        default: KFN(qk_q)(q4, 4, nb, qj, ldq, sj, kt, out + j * 16); break;
        }
    }
}
static void KFN(qk_q8_0)(int hk, const uint8_t *q, size_t ldq, const int32_t *qsum, int nq, const uint8_t *kt,
                         float *out, const uint8_t *next) {
    el_prefetch_l2(next, el_kq_tile_bytes(EL_Q8_0, hk));
    KFN(qk_q_all)(0, hk, q, ldq, qsum, nq, kt, out);
}
static void KFN(qk_q4_0)(int hk, const uint8_t *q, size_t ldq, const int32_t *qsum, int nq, const uint8_t *kt,
                         float *out, const uint8_t *next) {
    el_prefetch_l2(next, el_kq_tile_bytes(EL_Q4_0, hk));
    KFN(qk_q_all)(1, hk, q, ldq, qsum, nq, kt, out);
}

static void KFN(register)(el_type_traits *t) {
#define SET(id, name) t[id].vec_dot = KFN(name##_vec_dot), t[id].gemm = KFN(name##_gemm)
    SET(EL_Q4_0, q4_0_batch);  /* Q4_0: one order (quants_generic.c) */
    SET(EL_Q4_1, q4_1);
    SET(EL_Q5_0, q5_0);
    SET(EL_Q5_1, q5_1);
    SET(EL_Q8_0, q8_0);
    SET(EL_Q2_K, q2_K);
    SET(EL_Q3_K, q3_K);
    SET(EL_Q4_K, q4_K);
    SET(EL_Q5_K, q5_K);
    SET(EL_Q6_K, q6_K);
#undef SET
#define SET(id, name) t[id].vec_dot_batch = KFN(name##_batch_vec_dot), t[id].gemm_batch = KFN(name##_batch_gemm)
    SET(EL_Q4_1, q4_1);
    SET(EL_Q5_0, q5_0);
    SET(EL_Q5_1, q5_1);
    SET(EL_Q8_0, q8_0);
#undef SET
    t[EL_Q4_K].vec_dot_small = KFN(q4_K_small_vec_dot), t[EL_Q4_K].gemm_small = KFN(q4_K_small_gemm);
    t[EL_Q3_K].vec_dot_small = KFN(q3_K_small_vec_dot), t[EL_Q3_K].gemm_small = KFN(q3_K_small_gemm);
    t[EL_Q5_K].vec_dot_small = KFN(q5_K_small_vec_dot), t[EL_Q5_K].gemm_small = KFN(q5_K_small_gemm);
    t[EL_Q6_K].vec_dot_small = KFN(q6_K_small_vec_dot), t[EL_Q6_K].gemm_small = KFN(q6_K_small_gemm);
    el_vops.qk_q8_0 = KFN(qk_q8_0);
    el_vops.qk_q4_0 = KFN(qk_q4_0);
}
