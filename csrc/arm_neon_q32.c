/* AArch64 NEON kernels of the legacy types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (32-value blocks
 * against Q8_0 / Q8_1), at both levels (plain NEON and sdot; arm_neon_common.h).
 *
 * Numerics: integer sums are exact (int32) and the float steps are the generic twins'
 * (quants_generic.c). The llama order (vec_dot / gemm): per (row, activation) pair the twins'
 * 8 lanes as two float32x4 (lane i: values 4i..4i+3, one fma per block), reduced at the end in
 * el_hsum8's order, plus the scalar min chain of Q4_1 / Q5_1. The batch order (vec_dot_batch /
 * gemm_batch): tile_q32_batch below. Results are the twins' bits at both levels, and gemm's are
 * vec_dot's whatever the tile.
 *
 * gemm tiles: 4 weight rows (a remainder row alone) by 2 activation rows with the accumulators
 * in registers; for more activation rows, 16 blocks of 4 rows are decoded ahead and shared by
 * the tiles. */
#if defined(__aarch64__)

#include "arm_neon_common.h"

/* field positions the kernels read through one pointer for several block types */
_Static_assert(offsetof(block_q4_0, d) == 0 && offsetof(block_q4_1, d) == 0 && offsetof(block_q5_0, d) == 0 &&
               offsetof(block_q5_1, d) == 0 && offsetof(block_q8_0, d) == 0 && offsetof(block_q8_1, d) == 0,
               "legacy blocks start with d");
_Static_assert(offsetof(block_q4_1, m) == 2 && offsetof(block_q5_1, m) == 2, "m follows d");

/* 16 bits -> 16 bytes, byte j = 0x10 if bit j is set (the fifth bit of Q5 values) */
EL_INLINE uint8x16_t fifth_bits(uint32_t bits16) {
    static const uint8_t lane_bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t sel = vcombine_u8(vdup_n_u8((uint8_t)bits16), vdup_n_u8((uint8_t)(bits16 >> 8)));
    return vandq_u8(vtstq_u8(sel, vld1q_u8(lane_bit)), vdupq_n_u8(0x10));
}

/* ------------------------------------------------------------------------------------------ */
/* legacy types: 32-value blocks against Q8_0 / Q8_1 (layouts in common.h)                     */

EL_INLINE size_t q32_size(const int T) {
    return T == EL_Q4_0 ? sizeof(block_q4_0) : T == EL_Q4_1 ? sizeof(block_q4_1)
         : T == EL_Q5_0 ? sizeof(block_q5_0) : T == EL_Q5_1 ? sizeof(block_q5_1) : sizeof(block_q8_0);
}

/* block -> values 0..15 in *lo, 16..31 in *hi, as the int8 the twin multiplies */
EL_INLINE void q32_decode(const int T, const void *blk, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    switch (T) {
    case EL_Q4_0: {  /* (nibble - 8) */
        const uint8x16_t v = vld1q_u8(((const block_q4_0 *)blk)->qs);
        *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, m4)), vdupq_n_s8(8));
        *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
        break;
    }
    case EL_Q4_1: {  /* nibble; the min is applied in float */
        const uint8x16_t v = vld1q_u8(((const block_q4_1 *)blk)->qs);
        *lo = vreinterpretq_s8_u8(vandq_u8(v, m4));
        *hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
        break;
    }
    case EL_Q5_0:
    case EL_Q5_1: {  /* nibble | fifth bit (bit j of qh for value j) [- 16 for Q5_0] */
        const uint8_t *qs = T == EL_Q5_0 ? ((const block_q5_0 *)blk)->qs : ((const block_q5_1 *)blk)->qs;
        const uint8_t *qhp = T == EL_Q5_0 ? ((const block_q5_0 *)blk)->qh : ((const block_q5_1 *)blk)->qh;
        uint32_t qh;
        memcpy(&qh, qhp, 4);
        const uint8x16_t v = vld1q_u8(qs);
        *lo = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, m4), fifth_bits(qh & 0xFFFF)));
        *hi = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), fifth_bits(qh >> 16)));
        if (T == EL_Q5_0) {
            *lo = vsubq_s8(*lo, vdupq_n_s8(16));
            *hi = vsubq_s8(*hi, vdupq_n_s8(16));
        }
        break;
    }
    default: {  /* EL_Q8_0 */
        const int8_t *qs = ((const block_q8_0 *)blk)->qs;
        *lo = vld1q_s8(qs);
        *hi = vld1q_s8(qs + 16);
        break;
    }
    }
}

#define QC 2       /* activation rows per legacy tile */
#define QSTRIP 16  /* legacy blocks of 4 rows decoded ahead when several tiles share them */

/* 4 weight rows' blocks decoded: block b row r values 0-15 in q[b][r][0], 16-31 in q[b][r][1];
 * lane r of d[b] (m[b]) is row r's scale (min) */
typedef struct {
    int8x16_t q[QSTRIP][4][2];
    float32x4_t d[QSTRIP], m[QSTRIP];
} q32_strip;

/* The twins' legacy accumulators of up to 4 weight rows x QC activation rows: pair (r, c) keeps
 * its 8 float lanes in l[c][r][0..1] and its min chain (Q4_1 / Q5_1) in lane r of sm[c]. */
typedef struct {
    float32x4_t l[QC][4][2], sm[QC];
} q32_acc;

/* blocks b0 .. b0+nb-1 of R weight rows (from S if given, else decoded from rows ldw bytes
 * apart at w) . C activation rows (C <= QC), added to *st */
EL_INLINE void tile_q32(const int T, const q32_strip *S, const uint8_t *w, size_t ldw, int b0, int nb,
                        const int R, const uint8_t *a, size_t lda, const int C, q32_acc *st, const int dp) {
    const size_t bsz = q32_size(T);
    const int q81 = T == EL_Q4_1 || T == EL_Q5_1;  /* activations are Q8_1, weights carry a min */
    const int narrow = T != EL_Q8_0;                /* weights in -16..31 */
    const size_t asz = q81 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    q32_acc t = *st;
    for (int b = b0; b < b0 + nb; b++) {
        int8x16_t lo[4], hi[4];
        float32x4_t dx, mx = vdupq_n_f32(0.0f);
        if (S) {
            dx = S->d[b - b0];
            if (q81) mx = S->m[b - b0];
        } else {
            const el_half *dptr[4], *mp[4];
            for (int r = 0; r < R; r++) {
                const uint8_t *blk = w + (size_t)r * ldw + (size_t)b * bsz;
                q32_decode(T, blk, &lo[r], &hi[r]);
                dptr[r] = (const el_half *)blk;  /* d is every block's first field */
                mp[r] = (const el_half *)blk + 1;  /* m follows d in q4_1 / q5_1 */
            }
            dx = row_halves(dptr, R);
            if (q81) mx = row_halves(mp, R);
        }
        for (int c = 0; c < C; c++) {
            const uint8_t *ablk = a + (size_t)c * lda + (size_t)b * asz;
            const int8_t *yq = q81 ? ((const block_q8_1 *)ablk)->qs : ((const block_q8_0 *)ablk)->qs;
            const int8x16_t y0 = vld1q_s8(yq), y1 = vld1q_s8(yq + 16);
            const float32x4_t d = vmulq_n_f32(dx, h2f((const el_half *)ablk));  /* lane r: dx * dy */
            for (int r = 0; r < R; r++) {
                const int8x16_t q0 = S ? S->q[b - b0][r][0] : lo[r], q1 = S ? S->q[b - b0][r][1] : hi[r];
                t.l[c][r][0] = fma_lane(t.l[c][r][0], vcvtq_f32_s32(dot4_s8(q0, y0, dp, narrow)), d, r);
                t.l[c][r][1] = fma_lane(t.l[c][r][1], vcvtq_f32_s32(dot4_s8(q1, y1, dp, narrow)), d, r);
            }
            if (q81) t.sm[c] = vfmaq_n_f32(t.sm[c], mx, h2f(&((const block_q8_1 *)ablk)->s));  /* + m * y.s */
        }
    }
    *st = t;
}

EL_INLINE void q32_acc_zero(q32_acc *st) {
    for (int c = 0; c < QC; c++) {
        st->sm[c] = vdupq_n_f32(0.0f);
        for (int r = 0; r < 4; r++) st->l[c][r][0] = st->l[c][r][1] = vdupq_n_f32(0.0f);
    }
}

/* out[c*ldo + r] = el_hsum8(lanes) [+ min chain] */
EL_INLINE void q32_finish(const int T, const q32_acc *st, const int R, const int C, float *out, size_t ldo) {
    for (int c = 0; c < C; c++) {
        float m[4];
        vst1q_f32(m, st->sm[c]);
        for (int r = 0; r < R; r++) {
            const float v = hsum8(st->l[c][r][0], st->l[c][r][1]);
            out[(size_t)c * ldo + r] = (T == EL_Q4_1 || T == EL_Q5_1) ? v + m[r] : v;
        }
    }
}

/* one tile of R rows x C activation rows, decoding as it goes */
EL_INLINE void tile_q32_direct(const int T, int nb, const uint8_t *w, size_t ldw, const int R, const uint8_t *a,
                               size_t lda, const int C, float *out, size_t ldo, const int dp) {
    q32_acc st;
    q32_acc_zero(&st);
    tile_q32(T, NULL, w, ldw, 0, nb, R, a, lda, C, &st, dp);
    q32_finish(T, &st, R, C, out, ldo);
}

/* 4 weight rows x m activation rows (m <= MAX_NC): QSTRIP blocks of the rows decoded at a time
 * and used by every tile */
EL_INLINE void strip_q32(const int T, int nb, const uint8_t *w, size_t ldw, const uint8_t *a, size_t lda, int m,
                         float *out, size_t ldo, const int dp) {
    const size_t bsz = q32_size(T);
    q32_strip S;
    q32_acc st[(MAX_NC + QC - 1) / QC];
    for (int k = 0; k < (m + QC - 1) / QC; k++) q32_acc_zero(&st[k]);
    for (int b0 = 0; b0 < nb; b0 += QSTRIP) {
        const int len = EL_MIN(QSTRIP, nb - b0);
        for (int b = 0; b < len; b++) {
            const el_half *dptr[4], *mp[4];
            for (int r = 0; r < 4; r++) {
                const uint8_t *blk = w + (size_t)r * ldw + (size_t)(b0 + b) * bsz;
                q32_decode(T, blk, &S.q[b][r][0], &S.q[b][r][1]);
                dptr[r] = (const el_half *)blk;
                mp[r] = (const el_half *)blk + 1;
            }
            S.d[b] = row_halves(dptr, 4);
            S.m[b] = (T == EL_Q4_1 || T == EL_Q5_1) ? row_halves(mp, 4) : vdupq_n_f32(0.0f);
        }
        int c = 0;
        for (; c + QC <= m; c += QC) tile_q32(T, &S, NULL, 0, b0, len, 4, a + (size_t)c * lda, lda, QC, &st[c / QC], dp);
        if (c < m) tile_q32(T, &S, NULL, 0, b0, len, 4, a + (size_t)c * lda, lda, 1, &st[c / QC], dp);
    }
    int c = 0;
    for (; c + QC <= m; c += QC) q32_finish(T, &st[c / QC], 4, QC, out + (size_t)c * ldo, ldo);
    if (c < m) q32_finish(T, &st[c / QC], 4, 1, out + (size_t)c * ldo, ldo);
}

/* legacy types: 4 rows x QC activation rows at a time (a remainder row alone); when a group of
 * 4 rows meets more than QC activation rows, through strip_q32 */
EL_INLINE void gemm_q32(const int T, const int small, int n, const uint8_t *w, size_t ldw, int nr, const uint8_t *a,
                        size_t lda, int nc, float *out, size_t ldo, const int dp) {
    (void)small;
    const int nb = n / QK8_0;
    for (int c0 = 0; c0 < nc; c0 += MAX_NC) {
        const int m = EL_MIN(MAX_NC, nc - c0);
        const uint8_t *A = a + (size_t)c0 * lda;
        float *O = out + (size_t)c0 * ldo;
        int r = 0;
        for (; r + 4 <= nr; r += 4) {
            const uint8_t *W = w + (size_t)r * ldw;
            if (m > QC) strip_q32(T, nb, W, ldw, A, lda, m, O + r, ldo, dp);
            else if (m == QC) tile_q32_direct(T, nb, W, ldw, 4, A, lda, QC, O + r, ldo, dp);
            else tile_q32_direct(T, nb, W, ldw, 4, A, lda, 1, O + r, ldo, dp);
        }
        for (; r < nr; r++) {
            const uint8_t *W = w + (size_t)r * ldw;
            int c = 0;
            for (; c + QC <= m; c += QC) tile_q32_direct(T, nb, W, ldw, 1, A + (size_t)c * lda, lda, QC, O + (size_t)c * ldo + r, ldo, dp);
            if (c < m) tile_q32_direct(T, nb, W, ldw, 1, A + (size_t)c * lda, lda, 1, O + (size_t)c * ldo + r, ldo, dp);
        }
    }
}

DEFINE_QGEMM_LEVELS(q4_1, gemm_q32, EL_Q4_1, 0)
DEFINE_QGEMM_LEVELS(q5_0, gemm_q32, EL_Q5_0, 0)
DEFINE_QGEMM_LEVELS(q5_1, gemm_q32, EL_Q5_1, 0)
DEFINE_QGEMM_LEVELS(q8_0, gemm_q32, EL_Q8_0, 0)

/* ------------------------------------------------------------------------------------------
 * The batch order (quants_generic.c): per (row, column, block) the exact integer sum of the
 * block's 32 products, then one fma with dx * dy. Tiles of 4 weight rows x C <= QB activation
 * rows: each block of the 4 rows decoded once, each column's 4 row sums reduced pairwise into the
 * lanes of one vector (lane r: row r), one fma for the 4 rows.
 * ------------------------------------------------------------------------------------------ */
#define QB 4  /* activation rows per batch-order tile */

EL_INLINE void tile_q32_batch(const int T, int nb, const uint8_t *w, size_t ldw, const int R, const uint8_t *a,
                              size_t lda, const int C, float *out, size_t ldo, const int dp) {
    const size_t bsz = q32_size(T);
    const int q81 = T == EL_Q4_1 || T == EL_Q5_1;
    const size_t asz = q81 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    float32x4_t acc[QB], accm[QB];
    for (int c = 0; c < C; c++) acc[c] = accm[c] = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        int8x16_t lo[4], hi[4];
        const el_half *dptr[4], *mp[4];
        for (int r = 0; r < 4; r++) {
            const uint8_t *blk = w + (size_t)(r < R ? r : 0) * ldw + (size_t)b * bsz;  /* rows past R: ignored */
            q32_decode(T, blk, &lo[r], &hi[r]);
            dptr[r] = (const el_half *)blk;
            mp[r] = (const el_half *)blk + 1;
        }
        const float32x4_t dx = row_halves(dptr, 4), mx = q81 ? row_halves(mp, 4) : vdupq_n_f32(0.0f);
        for (int c = 0; c < C; c++) {
            const uint8_t *ablk = a + (size_t)c * lda + (size_t)b * asz;
            const int8_t *yq = q81 ? ((const block_q8_1 *)ablk)->qs : ((const block_q8_0 *)ablk)->qs;
            const int8x16_t y0 = vld1q_s8(yq), y1 = vld1q_s8(yq + 16);
            int32x4_t v[4];
            for (int r = 0; r < 4; r++) v[r] = dot_s8(dot_s8(vdupq_n_s32(0), lo[r], y0, dp), hi[r], y1, dp);
            const int32x4_t isum = vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]));  /* lane r: row r */
            acc[c] = vfmaq_f32(acc[c], vcvtq_f32_s32(isum), vmulq_n_f32(dx, h2f((const el_half *)ablk)));
            if (q81) accm[c] = vfmaq_n_f32(accm[c], mx, h2f(&((const block_q8_1 *)ablk)->s));
        }
    }
    for (int c = 0; c < C; c++) {
        float o[4];
        vst1q_f32(o, q81 ? vaddq_f32(acc[c], accm[c]) : acc[c]);
        for (int r = 0; r < R; r++) out[(size_t)c * ldo + r] = o[r];
    }
}

EL_INLINE void gemm_q32_batch(const int T, const int small, int n, const uint8_t *w, size_t ldw, int nr,
                              const uint8_t *a, size_t lda, int nc, float *out, size_t ldo, const int dp) {
    (void)small;
    for (int r = 0; r < nr; r += 4)
        for (int c = 0; c < nc; c += QB) {
            const int R = EL_MIN(4, nr - r), C = EL_MIN(QB, nc - c);
            const uint8_t *W = w + (size_t)r * ldw, *A = a + (size_t)c * lda;
            float *O = out + (size_t)c * ldo + r;
            if (R == 4 && C == QB) tile_q32_batch(T, n / QK8_0, W, ldw, 4, A, lda, QB, O, ldo, dp);
            else tile_q32_batch(T, n / QK8_0, W, ldw, R, A, lda, C, O, ldo, dp);
        }
}

DEFINE_QGEMM_LEVELS(q4_0_batch, gemm_q32_batch, EL_Q4_0, 0)
DEFINE_QGEMM_LEVELS(q4_1_batch, gemm_q32_batch, EL_Q4_1, 0)
DEFINE_QGEMM_LEVELS(q5_0_batch, gemm_q32_batch, EL_Q5_0, 0)
DEFINE_QGEMM_LEVELS(q5_1_batch, gemm_q32_batch, EL_Q5_1, 0)
DEFINE_QGEMM_LEVELS(q8_0_batch, gemm_q32_batch, EL_Q8_0, 0)
#define NEON_SET_BATCH(t, id, NAME, dp)                                             \
    ((t)[id].vec_dot_batch = (dp) ? vec_dot_##NAME##_dotprod : vec_dot_##NAME##_neon, \
     (t)[id].gemm_batch = (dp) ? gemm_##NAME##_dotprod : gemm_##NAME##_neon)

void el_neon_register_q32(el_type_traits *t, int dp) {
    NEON_SET(t, EL_Q4_0, q4_0_batch, dp);  /* Q4_0: one order (quants_generic.c) */
    NEON_SET(t, EL_Q4_1, q4_1, dp);
    NEON_SET(t, EL_Q5_0, q5_0, dp);
    NEON_SET(t, EL_Q5_1, q5_1, dp);
    NEON_SET(t, EL_Q8_0, q8_0, dp);
    NEON_SET_BATCH(t, EL_Q4_1, q4_1_batch, dp);
    NEON_SET_BATCH(t, EL_Q5_0, q5_0_batch, dp);
    NEON_SET_BATCH(t, EL_Q5_1, q5_1_batch, dp);
    NEON_SET_BATCH(t, EL_Q8_0, q8_0_batch, dp);
}

#endif /* __aarch64__ */
