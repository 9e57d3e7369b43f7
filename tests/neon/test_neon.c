/* Checks csrc/arm_neon*.c against the generic twins, at every NEON level this CPU can run
 * (plain NEON always; sdot only where the CPU reports FEAT_DotProd). Built for aarch64 and run
 * under qemu-aarch64 by tests/test_neon_qemu.py; see build.py next to this file.
 *
 *   - quantized types: vec_dot (and vec_dot_small / vec_dot_batch where a type has one) bit-identical to the generic twin (the kernels evaluate the twins'
 *     float expressions on exact integer sums), on quantized data and on random block bytes
 *     (weights and activations: every int8 including -128, any bsums, finite scales);
 *   - F32 / F16: vec_dot within 1e-5 * sum|w_i a_i| of the twin;
 *   - gemm: every element of every tile bit-identical to the same level's vec_dot, for tiles of
 *     any position and size, and nothing written outside the tile;
 *   - el_vops (conversions, attention tiles, scores against quantized key tiles, p.v over f16
 *     and quantized values, softmax exp, SiLU): the registered table bit-identical
 *     to the portable code;
 *   - dispatch: el_set_isa(-1) picks NEON and the level the CPU supports, and el_isa_features() says which;
 *   - el_matmul (the engine's threaded, tiled matmul) gives the dispatched vec_dot's bits.
 * Prints one line per level and "RESULT OK" / "RESULT FAIL"; exits 1 on any failure. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "el_internal.h"
#include "c_checks.h"

int el_neon_has_dotprod(void);                                 /* arm_neon.c */
void el_register_neon_level(el_type_traits *t, int dotprod);   /* arm_neon.c */

#define NR 19   /* weight rows: more than one 16-row tile, not a multiple of 4 */
#define NC 11   /* activation rows: more than one 8-row pass */
#define LDO (NR + 3)
#define SENTINEL 0x7fc0dead  /* a NaN no kernel writes */

/* values of mixed scale, with outliers and the odd all-zero row */
static void random_row(float *x, int n) {
    const int kind = below(8);
    const float scale = kind == 0 ? 0.0f : (kind == 1 ? 1e-3f : (kind == 2 ? 30.0f : 1.0f));
    for (int i = 0; i < n; i++) {
        float v = (uniform() + uniform() + uniform() - 1.5f) * scale;
        if (below(64) == 0) v *= 8.0f;
        x[i] = v;
    }
}

/* random finite half in +-[2^-10, 2) */
static el_half random_half(void) {
    const float v = (1.0f + uniform()) * ldexpf(1.0f, -10 + below(11));
    return el_float_to_half(below(2) ? -v : v);
}

static int failures, checks;
#define MAX_REPORTS 20
static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    if (failures++ < MAX_REPORTS) {
        va_list ap;
        va_start(ap, fmt);
        printf("FAIL ");
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
    }
}


typedef struct { int id; const char *name; int half_fields[2]; } type_case;
/* byte offsets of each block's half-float fields (d, m / dmin), -1 = none (common.h layouts) */
static const type_case TYPES[] = {
    {EL_F32, "f32", {-1, -1}},  {EL_F16, "f16", {-1, -1}},
    {EL_Q4_0, "q4_0", {0, -1}}, {EL_Q4_1, "q4_1", {0, 2}}, {EL_Q5_0, "q5_0", {0, -1}},
    {EL_Q5_1, "q5_1", {0, 2}},  {EL_Q8_0, "q8_0", {0, -1}},
    {EL_Q2_K, "q2_K", {80, 82}}, {EL_Q3_K, "q3_K", {108, -1}}, {EL_Q4_K, "q4_K", {0, 2}},
    {EL_Q5_K, "q5_K", {0, 2}},  {EL_Q6_K, "q6_K", {208, -1}},
    {EL_IQ4_NL, "iq4_nl", {0, -1}}, {EL_IQ4_XS, "iq4_xs", {0, -1}},
};

static el_type_traits gen[EL_NTYPES];

/* sum over i of |w_i * a_i| from the dequantized rows */
static double abs_products(int type, const uint8_t *w, const uint8_t *a, int n) {
    float *wf = malloc(sizeof(float) * (size_t)n), *af = malloc(sizeof(float) * (size_t)n);
    gen[type].to_float(w, wf, n);
    gen[gen[type].vec_dot_type].to_float(a, af, n);
    double s = 0;
    for (int i = 0; i < n; i++) s += fabs((double)wf[i] * (double)af[i]);
    free(wf);
    free(af);
    return s;
}

/* kind 1: the small-batch kernels (vec_dot_small / gemm_small); 2: the batch-order ones
 * (vec_dot_batch / gemm_batch); 0: the main ones */
static void test_type(const el_type_traits *lvl, const char *level, const type_case *tc, int n, int raw, int kind) {
    const el_vec_dot_fn gen_dot = kind == 1 ? gen[tc->id].vec_dot_small : kind == 2 ? gen[tc->id].vec_dot_batch : gen[tc->id].vec_dot;
    const el_vec_dot_fn lvl_dot = kind == 1 ? lvl[tc->id].vec_dot_small : kind == 2 ? lvl[tc->id].vec_dot_batch : lvl[tc->id].vec_dot;
    const el_gemm_fn lvl_gemm = kind == 1 ? lvl[tc->id].gemm_small : kind == 2 ? lvl[tc->id].gemm_batch : lvl[tc->id].gemm;
    const char *sfx = kind == 1 ? " small" : kind == 2 ? " batch" : "";
    const int type = tc->id, vdt = gen[type].vec_dot_type, is_float = type == EL_F32 || type == EL_F16;
    const size_t ldw = el_row_size(type, n) + 2 * (size_t)gen[type].size;  /* rows with a gap */
    const size_t lda = el_row_size(vdt, n) + (size_t)gen[vdt].size;
    uint8_t *W = calloc(NR, ldw), *A = calloc(NC, lda);
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int r = 0; r < NR; r++) {
        if (raw) {  /* any bytes, with finite scales */
            for (size_t i = 0; i < el_row_size(type, n); i++) W[r * ldw + i] = (uint8_t)next_u64();
            for (int b = 0; b < n / gen[type].blck; b++)
                for (int f = 0; f < 2; f++)
                    if (tc->half_fields[f] >= 0) {
                        const el_half h = random_half();
                        memcpy(W + r * ldw + (size_t)b * gen[type].size + tc->half_fields[f], &h, 2);
                    }
        } else {
            random_row(x, n);
            gen[type].from_float(x, W + r * ldw, n);
        }
    }
    for (int c = 0; c < NC; c++) {
        if (raw) {  /* any bytes (int8 -128, bsums unrelated to qs), with finite scales */
            uint8_t *row = A + c * lda;
            for (size_t i = 0; i < el_row_size(vdt, n); i++) row[i] = (uint8_t)next_u64();
            for (int b = 0; b < n / gen[vdt].blck; b++) {
                uint8_t *blk = row + (size_t)b * gen[vdt].size;
                if (vdt == EL_Q8_K) {  /* float d first (block_q8_K) */
                    const float d = (uniform() + 0.5f) * ldexpf(1.0f, -12 + below(8));
                    memcpy(blk, &d, 4);
                    continue;
                }
                const el_half d = random_half(), s = random_half();
                memcpy(blk, &d, 2);                   /* block_q8_0 / block_q8_1: d first */
                if (vdt == EL_Q8_1) memcpy(blk + 2, &s, 2);  /* then s */
            }
        } else {
            random_row(x, n);
            gen[vdt].from_float(x, A + c * lda, n);
        }
    }

    /* vec_dot against the twin */
    float ref[NC][NR], vd[NC][NR];
    for (int c = 0; c < NC; c++)
        for (int r = 0; r < NR; r++) {
            gen_dot(n, &ref[c][r], W + r * ldw, A + c * lda);
            lvl_dot(n, &vd[c][r], W + r * ldw, A + c * lda);
            checks++;
            if (is_float) {
                const double tol = 1e-5 * abs_products(type, W + r * ldw, A + c * lda, n);
                if (!(fabs((double)vd[c][r] - (double)ref[c][r]) <= tol))
                    fail("%s %s n=%d vec_dot[r%d c%d] = %.9g, generic %.9g (tolerance %.3g)", level, tc->name,
                         n, r, c, vd[c][r], ref[c][r], tol);
            } else if (!same_bits(vd[c][r], ref[c][r])) {
                fail("%s %s%s n=%d%s vec_dot[r%d c%d] = %.9g, generic %.9g (want identical bits)", level,
                     tc->name, sfx, n, raw ? " raw" : "", r, c, vd[c][r], ref[c][r]);
            }
        }

    /* gemm tiles: the whole matrix, the engine's decode / prefill shapes, random sub-tiles */
    float *out = malloc(sizeof(float) * (size_t)LDO * NC);
    for (int t = 0; t < 24; t++) {
        int r0, nr, c0, nc;
        switch (t) {
        case 0: r0 = 0, nr = NR, c0 = 0, nc = NC; break;
        case 1: r0 = 0, nr = 16, c0 = 0, nc = 1; break;
        case 2: r0 = 3, nr = 16, c0 = 2, nc = 8; break;
        default: nr = 1 + below(16), nc = 1 + below(9), r0 = below(NR - nr + 1), c0 = below(NC - nc + 1); break;
        }
        const uint32_t sbits = SENTINEL;
        float sentinel;
        memcpy(&sentinel, &sbits, 4);
        for (int i = 0; i < LDO * NC; i++) out[i] = sentinel;
        lvl_gemm(n, W + r0 * ldw, ldw, nr, A + c0 * lda, lda, nc, out, LDO);
        for (int c = 0; c < NC; c++)
            for (int r = 0; r < LDO; r++) {
                const float v = out[c * LDO + r];
                if (c < nc && r < nr) {
                    checks++;
                    if (!same_bits(v, vd[c0 + c][r0 + r]))
                        fail("%s %s%s n=%d gemm tile (r0 %d nr %d, c0 %d nc %d) [%d,%d] = %.9g, vec_dot %.9g", level,
                             tc->name, sfx, n, r0, nr, c0, nc, r, c, v, vd[c0 + c][r0 + r]);
                } else if (!same_bits(v, sentinel)) {
                    fail("%s %s%s n=%d gemm (nr %d nc %d) wrote outside its tile at [%d,%d]", level, tc->name, sfx,
                         n, nr, nc, r, c);
                }
            }
    }
    free(out);
    free(x);
    free(W);
    free(A);
}

static void test_vops(const el_vec_ops *g, const el_vec_ops *v, const char *level) {
    /* every half to float */
    static el_half all[65536];
    static float fa[65536], fb[65536];
    for (int i = 0; i < 65536; i++) all[i] = (el_half)i;
    g->f16_to_f32(65536, all, fa);
    v->f16_to_f32(65536, all, fb);
    for (int i = 0; i < 65536; i++) {
        checks++;
        if (!same_bits(fa[i], fb[i])) fail("%s f16_to_f32(0x%04x) = 0x%08x, portable 0x%08x", level, i,
                                           el_fp32_to_bits(fb[i]), el_fp32_to_bits(fa[i]));
    }
    /* floats to half: random bit patterns, values near the half range's edges, specials */
    enum { NF = 4099 };
    static float xs[NF];
    static el_half ha[NF], hb[NF];
    const float edges[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65519.996f, 65520.0f, -65520.0f,
                           0x1.0p-24f, 0x1.0p-25f, 0x1.8p-25f, 0x1.0p-14f, 0x1.ffcp-15f, 1.0f / 3.0f};
    const int ne = (int)(sizeof edges / sizeof edges[0]);
    for (int i = 0; i < NF; i++) {
        if (i < ne) xs[i] = edges[i];
        else if (i % 2) xs[i] = el_fp32_from_bits((uint32_t)next_u64());
        else xs[i] = (uniform() - 0.5f) * ldexpf(1.0f, below(48) - 30);
    }
    g->f32_to_f16(NF, xs, ha);
    v->f32_to_f16(NF, xs, hb);
    for (int i = 0; i < NF; i++) {
        checks++;
        if (ha[i] != hb[i]) fail("%s f32_to_f16(0x%08x) = 0x%04x, portable 0x%04x", level, el_fp32_to_bits(xs[i]),
                                 hb[i], ha[i]);
    }
    /* attention tiles, softmax and SiLU on attention-sized rows: the same bits as the portable code */
    const int sizes[] = {1, 3, 15, 16, 17, 64, 100, 256};
    for (int si = 0; si < 8; si++) {
        const int n = sizes[si];
        /* scores of 3 queries (f16 values, as the engine's) of n dims against 16 keys stored [n][16] */
        static float q[3 * 256], k[256 * 16], s0[3 * 16], s1[3 * 16];
        static el_half kt[256 * 16], qh[3 * 256];
        random_row(q, 3 * n);
        g->f32_to_f16(3 * n, q, qh);
        g->f16_to_f32(3 * n, qh, q);
        random_row(k, 16 * n);
        g->f32_to_f16(16 * n, k, kt);
        g->qk_tile(n, q, 3, n, kt, s0);
        v->qk_tile(n, q, 3, n, kt, s1);
        for (int i = 0; i < 3 * 16; i++) {
            checks++;
            if (!same_bits(s0[i], s1[i])) fail("%s qk_tile n=%d [%d] = %.9g, portable %.9g", level, n, i, s1[i], s0[i]);
        }
        /* nq queries in llama.cpp's single-token order */
        g->qk_tile_one(n, q, 3, n, kt, s0, NULL);
        v->qk_tile_one(n, q, 3, n, kt, s1, kt);
        for (int i = 0; i < 3 * 16; i++) {
            checks++;
            if (!same_bits(s0[i], s1[i])) fail("%s qk_tile_one n=%d [%d] = %.9g, portable %.9g", level, n, i, s1[i], s0[i]);
        }
        /* p.v: 3 rows of f16 weights over 5 value tiles [n][16] (one absent, some all-zero
         * weights), into accumulators with one lane set and with four */
        enum { PT = 5, PR = 3 };
        static el_half vtiles[PT][256 * 16];
        static float wts[PR * PT * 16], acc0[4 * PR * 256 * 16 + 16], acc1[4 * PR * 256 * 16 + 16];
        const el_half *vt[PT];
        for (int t = 0; t < PT; t++) {
            random_row(k, 16 * n);
            g->f32_to_f16(16 * n, k, vtiles[t]);
            vt[t] = t == 3 ? NULL : vtiles[t];
        }
        for (int i = 0; i < PR * PT * 16; i++) wts[i] = el_half_to_float(el_float_to_half(uniform()));
        for (int r = 0; r < PR; r++) memset(wts + r * PT * 16 + 3 * 16, 0, sizeof(float) * 16);  /* the absent tile */
        memset(wts + 1 * PT * 16, 0, sizeof(float) * 16);  /* row 1, tile 0 */
        wts[5] = 0.0f;
        for (int sets = 1; sets <= 4; sets += 3) {
            const int lda = sets * n * 16 + 3;
            random_row(acc0, PR * lda);
            memcpy(acc1, acc0, sizeof(float) * (size_t)(PR * lda));
            g->pv_tiles(n, PT, vt, PR, wts, PT * 16, acc0, lda, sets, 3, vt, PT);
            v->pv_tiles(n, PT, vt, PR, wts, PT * 16, acc1, lda, sets, 3, vt, PT);  /* next: a valid hint */
            for (int i = 0; i < PR * lda; i++) {
                checks++;
                if (!same_bits(acc0[i], acc1[i]))
                    fail("%s pv_tiles n=%d sets=%d [%d] = %.9g, portable %.9g", level, n, sets, i, acc1[i], acc0[i]);
            }
        }
        /* p.v over values quantized as q8_0 / q4_0: rows of nb + 1 blocks put into value tiles with
         * el_vq_put, a block at a time from block 1 on (a thread's share of the value groups); then
         * (stress) random quant bytes (q8_0 -128 too) under scales of both signs over many
         * magnitudes (zeros and f16 subnormals too), and weights from 1 down to f16 subnormals (the
         * integer sums' edges) */
        for (int qi = 0; qi < 4; qi++) {
            const int q4 = qi & 1, stress = qi >> 1, nb = (n + 31) / 32, nd = 32 * nb;
            const size_t bb = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0), rb = (size_t)(nb + 1) * bb;
            static uint8_t rows[PT][16 * 9 * sizeof(block_q8_0)], vtq[PT][16 * sizeof(block_q8_0)];
            static float x[9 * 32], ws[PR * PT * 16];
            for (int t = 0; t < PT; t++)
                for (int l = 0; l < 16; l++) {
                    random_row(x, 32 * (nb + 1));
                    if (q4) quantize_row_q4_0_ref(x, rows[t] + l * rb, 32 * (nb + 1));
                    else quantize_row_q8_0(x, rows[t] + l * rb, 32 * (nb + 1));
                    for (int b = 0; stress && b <= nb; b++) {
                        uint8_t *blk = rows[t] + l * rb + b * bb;
                        for (size_t i = 2; i < bb; i++) blk[i] = (uint8_t)next_u64();
                        const int kind = below(8);
                        const float d = (uniform() + 0.01f) * ldexpf(1.0f, below(40) - 24) * (below(2) ? 1.0f : -1.0f);
                        const el_half h = kind == 0 ? 0 : kind == 1 ? (el_half)(1 + below(0x3ff)) : el_float_to_half(d);
                        memcpy(blk, &h, 2);
                    }
                }
            for (int i = 0; i < PR * PT * 16; i++)
                ws[i] = stress && wts[i] != 0.0f ? el_half_to_float(el_float_to_half(ldexpf(wts[i], -below(26)))) : wts[i];
            /* tiles from EL_PV_CHUNK - 2 of a sequence: two chunks, into the same sums or (stress)
             * each into its own */
            const int t0 = EL_PV_CHUNK - 2, ldc = stress ? PR * nd : 0, na = (ldc ? 2 : 1) * PR * nd;
            random_row(acc0, na);
            memcpy(acc1, acc0, sizeof(float) * (size_t)na);
            for (int b = 0; b < nb; b++) {
                const uint8_t *vq[PT];
                for (int t = 0; t < PT; t++) {
                    for (int l = 0; l < 16; l++) el_vq_put(q4 ? EL_Q4_0 : EL_Q8_0, vtq[t], l, rows[t] + l * rb + (b + 1) * bb);
                    vq[t] = t == 3 ? NULL : vtq[t];
                }
                pv_q_chunks(q4 ? g->pv_q4_0 : g->pv_q8_0, PT, vq, PR, ws, PT * 16, acc0 + 32 * b, nd, t0, ldc);
                pv_q_chunks(q4 ? v->pv_q4_0 : v->pv_q8_0, PT, vq, PR, ws, PT * 16, acc1 + 32 * b, nd, t0, ldc);
            }
            for (int i = 0; i < na; i++) {
                checks++;
                if (!same_bits(acc0[i], acc1[i]))
                    fail("%s pv_%s%s n=%d [%d] = %.9g, portable %.9g", level, q4 ? "q4_0" : "q8_0", stress ? " stress" : "", nd,
                         i, acc1[i], acc0[i]);
            }
        }
        /* lane sums of n rows of 16 */
        static float r0[256], r1[256];
        g->sum16_rows(n, acc0, r0);
        v->sum16_rows(n, acc0, r1);
        for (int i = 0; i < n; i++) {
            checks++;
            if (!same_bits(r0[i], r1[i]))
                fail("%s sum16_rows n=%d [%d] = %.9g, portable %.9g", level, n, i, r1[i], r0[i]);
        }
        /* softmax numerators of 16 n scores, some far below the max (exp underflows to 0) */
        static float x0[256 * 16], x1[256 * 16];
        random_row(x0, 16 * n);
        float mx = -INFINITY;
        for (int i = 0; i < 16 * n; i++) {
            x0[i] *= 8.0f;
            if (below(16) == 0) x0[i] = -200.0f - 100.0f * uniform();
            mx = EL_MAX(mx, x0[i]);
        }
        memcpy(x1, x0, sizeof(float) * 16 * (size_t)n);
        const double e0 = g->exp_sums(16 * n, x0, mx, NULL), e1 = v->exp_sums(16 * n, x1, mx, NULL);
        checks++;
        if (memcmp(&e0, &e1, sizeof e0) != 0) fail("%s exp_sums n=%d (no sums) = %.17g, portable %.17g", level, 16 * n, e1, e0);
        for (int i = 0; i < 16 * n; i++) {
            checks++;
            if (!same_bits(x0[i], x1[i])) fail("%s exp_sums n=%d (no sums) x[%d] = %.9g, portable %.9g", level, 16 * n, i, x1[i], x0[i]);
        }
        /* exp_sums: the same exponentials, and each 16's el_sum16 */
        static float es0[256], es1[256];
        memcpy(x0, x1, sizeof(float) * 16 * (size_t)n);  /* the exponentials: new scores below mx */
        for (int i = 0; i < 16 * n; i++) x0[i] = mx - 30.0f * x0[i] * (float)(i & 1);
        memcpy(x1, x0, sizeof(float) * 16 * (size_t)n);
        const double t0 = g->exp_sums(16 * n, x0, mx, es0), t1 = v->exp_sums(16 * n, x1, mx, es1);
        checks++;
        if (memcmp(&t0, &t1, sizeof t0) != 0) fail("%s exp_sums n=%d = %.17g, portable %.17g", level, 16 * n, t1, t0);
        for (int i = 0; i < 16 * n; i++) {
            checks++;
            if (!same_bits(x0[i], x1[i])) fail("%s exp_sums n=%d x[%d] = %.9g, portable %.9g", level, 16 * n, i, x1[i], x0[i]);
        }
        for (int i = 0; i < n; i++) {
            checks++;
            if (!same_bits(es0[i], es1[i])) fail("%s exp_sums n=%d sums[%d] = %.9g, portable %.9g", level, 16 * n, i, es1[i], es0[i]);
        }
        /* f16_scale: softmax weights (some f16 subnormals, some rounding to 0) */
        memcpy(x1, x0, sizeof(float) * 16 * (size_t)n);
        const float inv = 1.0f / (1.0f + 3.0f * uniform());
        g->f16_scale(16 * n - si, x0, inv);
        v->f16_scale(16 * n - si, x1, inv);
        for (int i = 0; i < 16 * n; i++) {
            checks++;
            if (!same_bits(x0[i], x1[i])) fail("%s f16_scale n=%d x[%d] = %.9g, portable %.9g", level, 16 * n - si, i, x1[i], x0[i]);
        }
        /* scale_max: n rows of a score tile (some -0, +0, equal values) into rows 20 floats apart */
        static float sst[256 * 16], sd0[256 * 20], sd1[256 * 20], sm0[256 * 16], sm1[256 * 16];
        random_row(sst, 16 * n);
        random_row(sm0, 16 * n);
        for (int i = 0; i < 16 * n; i += 7) sst[i] = (i & 8) ? -0.0f : 0.0f, sm0[i] = 0.0f;
        memcpy(sm1, sm0, sizeof(float) * 16 * (size_t)n);
        memset(sd0, 0, sizeof sd0);
        memset(sd1, 0, sizeof sd1);
        g->scale_max(n, sst, 0.125f, sd0, 20, sm0);
        v->scale_max(n, sst, 0.125f, sd1, 20, sm1);
        for (int i = 0; i < 16 * n; i++) {
            checks += 2;
            if (!same_bits(sd0[i / 16 * 20 + i % 16], sd1[i / 16 * 20 + i % 16]) || !same_bits(sm0[i], sm1[i]))
                fail("%s scale_max rows=%d [%d] = %.9g / max %.9g, portable %.9g / %.9g", level, n, i,
                     sd1[i / 16 * 20 + i % 16], sm1[i], sd0[i / 16 * 20 + i % 16], sm0[i]);
        }
        /* SiLU(gate) * up, gates from tiny to beyond exp's range */
        static float g0[256 * 16], g1[256 * 16], up[256 * 16];
        const int ns = 16 * n - si;  /* any length */
        random_row(g0, ns);
        random_row(up, ns);
        for (int i = 0; i < ns; i++) g0[i] *= ldexpf(1.0f, below(16) - 4);
        memcpy(g1, g0, sizeof(float) * (size_t)ns);
        g->silu_mul(ns, g0, up);
        v->silu_mul(ns, g1, up);
        for (int i = 0; i < ns; i++) {
            checks++;
            if (!same_bits(g0[i], g1[i])) fail("%s silu_mul n=%d [%d] = %.9g, portable %.9g", level, ns, i, g1[i], g0[i]);
        }
    }
}

/* vops.qk_q8_0 / qk_q4_0 (scores against quantized key tiles): random head sizes and query
 * counts, key tiles of random bytes (every int8 including -128; finite scales), queries from the
 * activation quantizer */
static void test_qk_q(const el_vec_ops *g, const el_vec_ops *v, const char *level) {
    enum { MB = 8, MQ = 11 };
    static uint8_t kt[16 * MB * 34], q[MQ * (MB * 34 + 5)];
    static int32_t qsum[MQ * MB];
    static float x[MB * 32], out0[MQ * 16], out1[MQ * 16];
    for (int it = 0; it < 200; it++) {
        const int q4 = it & 1, nb = 1 + below(MB), hk = 32 * nb, nq = 1 + below(MQ);
        const size_t ldq = (size_t)nb * 34 + (size_t)below(6);
        for (size_t i = 0; i < sizeof kt; i++) kt[i] = (uint8_t)next_u64();
        for (int i = 0; i < 16 * nb; i++) {
            const el_half h = random_half();
            memcpy(kt + 2 * i, &h, 2);
        }
        for (int j = 0; j < nq; j++) {
            random_row(x, hk);
            gen[EL_Q8_0].from_float(x, q + j * ldq, hk);
            for (int b = 0; b < nb; b++) {
                const block_q8_0 *qb = (const block_q8_0 *)(q + j * ldq) + b;
                qsum[j * nb + b] = 0;
                for (int i = 0; i < 32; i++) qsum[j * nb + b] += qb->qs[i];
            }
        }
        (q4 ? g->qk_q4_0 : g->qk_q8_0)(hk, q, ldq, qsum, nq, kt, out0, NULL);
        (q4 ? v->qk_q4_0 : v->qk_q8_0)(hk, q, ldq, qsum, nq, kt, out1, kt);
        for (int i = 0; i < nq * 16; i++) {
            checks++;
            if (!same_bits(out0[i], out1[i]))
                fail("%s qk_%s hk=%d nq=%d [%d] = %.9g, portable %.9g", level, q4 ? "q4_0" : "q8_0", hk, nq, i, out1[i],
                     out0[i]);
        }
    }
}

/* el_matmul on 2 threads, rows spanning several 16-row tiles and tokens several 8-row passes;
 * the last el_small_rows(type, M) tokens through the small-batch kernel where there is one */
static void test_matmul(const type_case *tc, const int M) {
    enum { ROWS = 40, MAXM = 13 };
    const int type = tc->id, vdt = gen[type].vec_dot_type, n = gen[type].blck == 256 ? 512 : 96;
    const size_t ldw = el_row_size(type, n), lda = el_row_size(vdt, n);
    uint8_t *W = malloc(ROWS * ldw), *A = malloc(M * lda);
    float *x = malloc(sizeof(float) * M * (size_t)n), y[MAXM][ROWS];
    const int split = el_traits[type].vec_dot_small ? M - el_small_rows(type, M) : M;
    for (int r = 0; r < ROWS; r++) {
        random_row(x, n);
        gen[type].from_float(x, W + r * ldw, n);
    }
    for (int m = 0; m < M; m++) {
        random_row(x + (size_t)m * n, n);
        gen[vdt].from_float(x + (size_t)m * n, A + m * lda, n);
    }
    const el_tensor w = {type, W, n, ROWS, ldw};
    checks++;
    if (el_matmul(&w, x, M, &y[0][0], 2) != 0) {
        fail("el_matmul(%s, m=%d) failed", tc->name, M);
    } else {
        for (int m = 0; m < M; m++)
            for (int r = 0; r < ROWS; r++) {
                float want;
                (m < split ? el_traits[type].vec_dot : el_traits[type].vec_dot_small)(n, &want, W + r * ldw, A + m * lda);
                checks++;
                if (!same_bits(y[m][r], want))
                    fail("el_matmul(%s, m=%d) [token %d, row %d] = %.9g, vec_dot%s %.9g", tc->name, M, m, r, y[m][r],
                         m < split ? "" : "_small", want);
            }
    }
    free(W);
    free(A);
    free(x);
}

int main(void) {
    const int has_dp = el_neon_has_dotprod();
    printf("dotprod: %s\n", has_dp ? "yes" : "no");

    memset(gen, 0, sizeof gen);
    el_register_generic(gen);
    el_set_isa(EL_ISA_GENERIC);
    const el_vec_ops gen_vops = el_vops;

    /* dispatch picks NEON at the CPU's level */
    const int isa = el_set_isa(-1);
    el_type_traits expect[EL_NTYPES];
    memset(expect, 0, sizeof expect);
    el_register_generic(expect);
    el_register_neon_level(expect, has_dp);
    checks++;
    if (isa != EL_ISA_NEON) fail("el_set_isa(-1) chose ISA %d, not NEON", isa);
    checks++;
    if (el_isa_features() != (has_dp ? 1 : 0)) fail("el_isa_features() = %d with dotprod %d", el_isa_features(), has_dp);
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
        const int id = TYPES[i].id;
        checks++;
        if (el_traits[id].gemm != expect[id].gemm || el_traits[id].vec_dot != expect[id].vec_dot ||
            el_traits[id].gemm_small != expect[id].gemm_small || el_traits[id].vec_dot_small != expect[id].vec_dot_small)
            fail("dispatch: %s kernels are not the %s level's", TYPES[i].name, has_dp ? "dotprod" : "neon");
    }
    printf("dispatch: isa %d, level %s\n", isa, has_dp ? "dotprod" : "neon");
    {
        const int f0 = failures, c0 = checks;
        for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
            test_matmul(&TYPES[i], 13);
            test_matmul(&TYPES[i], 6);
            test_matmul(&TYPES[i], 1);
        }
        printf("el_matmul: %d checks, %d failures\n", checks - c0, failures - f0);
    }

    for (int dp = 0; dp <= has_dp; dp++) {
        const char *level = dp ? "dotprod" : "neon";
        const int f0 = failures, c0 = checks;
        el_type_traits lvl[EL_NTYPES];
        memset(lvl, 0, sizeof lvl);
        el_register_generic(lvl);
        el_register_neon_level(lvl, dp);
        const el_vec_ops lvl_vops = el_vops;
        for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
            const type_case *tc = &TYPES[i];
            const int blck = gen[tc->id].blck;
            if (lvl[tc->id].vec_dot == gen[tc->id].vec_dot || lvl[tc->id].gemm == NULL) {
                checks++;
                fail("%s: %s has no NEON kernel registered", level, tc->name);
                continue;
            }
            const int float_sizes[] = {1, 7, 8, 37, 264, 520, 1031};
            const int q32_sizes[] = {32, 64, 96, 288, 640, 1024};
            const int k_sizes[] = {256, 512, 768, 2048};
            const int *sizes = blck == 1 ? float_sizes : (blck == 32 ? q32_sizes : k_sizes);
            const int ns = blck == 1 ? 7 : (blck == 32 ? 6 : 4);
            const int has_small = gen[tc->id].vec_dot_small != NULL;
            if (has_small && (lvl[tc->id].vec_dot_small == gen[tc->id].vec_dot_small || lvl[tc->id].gemm_small == NULL)) {
                checks++;
                fail("%s: %s has no NEON small-batch kernel registered", level, tc->name);
            }
            const int has_batch = gen[tc->id].vec_dot_batch != NULL;
            if (has_batch && (lvl[tc->id].vec_dot_batch == gen[tc->id].vec_dot_batch || lvl[tc->id].gemm_batch == NULL)) {
                checks++;
                fail("%s: %s has no NEON batch-order kernel registered", level, tc->name);
            }
            for (int si = 0; si < ns; si++)
                for (int kind = 0; kind < 3; kind++) {
                    if (kind == 1 && !has_small) continue;
                    if (kind == 2 && !has_batch) continue;
                    test_type(lvl, level, tc, sizes[si], 0, kind);
                    if (blck > 1) test_type(lvl, level, tc, sizes[si], 1, kind);
                }
        }
        test_vops(&gen_vops, &lvl_vops, level);
        test_qk_q(&gen_vops, &lvl_vops, level);
        printf("level %s: %d checks, %d failures\n", level, checks - c0, failures - f0);
    }
    printf("RESULT %s (%d checks, %d failures)\n", failures ? "FAIL" : "OK", checks, failures);
    return failures ? 1 : 0;
}
