/* Checks the x86 kernels this CPU may not run (AVX-VNNI: x86_avx2.c's VNNI half; AVX-512 VNNI:
 * x86_avx512.c) against the generic twins, on SIMDe's portable intrinsics (see immintrin.h here
 * and build.py). Linked with the whole library, built with EL_X86_EMULATED; run by
 * tests/test_x86_emulated.py.
 *
 * For both levels and every quantized weight type: vec_dot (and vec_dot_small / vec_dot_batch
 * where a type has one) bit-identical to the generic twin on quantized weights and on random block bytes (finite
 * scales), against activations from the activation quantizers; every gemm tile bit-identical to
 * the level's vec_dot; the activation quantizers the level registers write the generic bytes;
 * vops.pv_tiles, vops.qk_q8_0 / qk_q4_0 and vops.pv_q8_0 / pv_q4_0 write the generic twin's bits.
 * Prints one line per level and "RESULT OK" / "RESULT FAIL"; exits 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include "el_internal.h"
#include "c_checks.h"

#define NR 19   /* weight rows: more than one 16-row tile, not a multiple of 4 or 8 */
#define NC 11   /* activation rows */
#define LDO (NR + 3)

static void random_row(float *x, int n) {
    const float scale = below(4) == 0 ? 30.0f : (below(3) == 0 ? 1e-3f : 1.0f);
    for (int i = 0; i < n; i++) x[i] = (uniform() + uniform() + uniform() - 1.5f) * scale * (below(64) ? 1.0f : 8.0f);
}

static int failures, checks;
static void fail(const char *what) {
    if (failures++ < 20) printf("FAIL %s\n", what);
}

/* byte offsets of a block's half-float scales (common.h layouts), -1 = none */
typedef struct { int id; const char *name; int half[2]; } type_case;
static const type_case TYPES[] = {
    {EL_Q4_0, "q4_0", {0, -1}},   {EL_Q4_1, "q4_1", {0, 2}},   {EL_Q5_0, "q5_0", {0, -1}},
    {EL_Q5_1, "q5_1", {0, 2}},    {EL_Q8_0, "q8_0", {0, -1}},  {EL_Q2_K, "q2_K", {80, 82}},
    {EL_Q3_K, "q3_K", {108, -1}}, {EL_Q4_K, "q4_K", {0, 2}},   {EL_Q5_K, "q5_K", {0, 2}},
    {EL_Q6_K, "q6_K", {208, -1}}, {EL_IQ4_NL, "iq4_nl", {0, -1}}, {EL_IQ4_XS, "iq4_xs", {0, -1}},
};

static el_type_traits gen[EL_NTYPES];

/* kind: 0 the main kernels, 1 the small-batch ones, 2 the batch-order ones */
static const char *const KIND[] = {"", " small", " batch"};
static void test_type(const el_type_traits *lvl, const char *level, const type_case *tc, int n, int raw, int kind) {
    const int type = tc->id, vdt = gen[type].vec_dot_type;
    const el_vec_dot_fn gdot = kind == 1 ? gen[type].vec_dot_small : kind == 2 ? gen[type].vec_dot_batch : gen[type].vec_dot;
    const el_vec_dot_fn ldot = kind == 1 ? lvl[type].vec_dot_small : kind == 2 ? lvl[type].vec_dot_batch : lvl[type].vec_dot;
    const el_gemm_fn lgemm = kind == 1 ? lvl[type].gemm_small : kind == 2 ? lvl[type].gemm_batch : lvl[type].gemm;
    const size_t ldw = el_row_size(type, n) + 2 * (size_t)gen[type].size, lda = el_row_size(vdt, n);
    uint8_t *W = calloc(NR, ldw), *A = calloc(NC, lda);
    float *x = malloc(sizeof(float) * (size_t)n), ref[NC][NR], vd[NC][NR], out[NC * LDO];
    char msg[160];
    for (int r = 0; r < NR; r++) {
        random_row(x, n);
        gen[type].from_float(x, W + r * ldw, n);
        if (!raw) continue;
        for (size_t i = 0; i < el_row_size(type, n); i++) W[r * ldw + i] = (uint8_t)next_u64();
        for (int b = 0; b < n / gen[type].blck; b++)
            for (int f = 0; f < 2; f++)
                if (tc->half[f] >= 0) {
                    const float v = (1.0f + uniform()) * ldexpf(1.0f, -10 + below(11));
                    const el_half h = el_float_to_half(below(2) ? -v : v);
                    memcpy(W + r * ldw + (size_t)b * gen[type].size + tc->half[f], &h, 2);
                }
    }
    for (int c = 0; c < NC; c++) {
        random_row(x, n);
        lvl[vdt].from_float(x, A + c * lda, n);
    }
    for (int c = 0; c < NC; c++)
        for (int r = 0; r < NR; r++) {
            gdot(n, &ref[c][r], W + r * ldw, A + c * lda);
            ldot(n, &vd[c][r], W + r * ldw, A + c * lda);
            checks++;
            if (!same_bits(vd[c][r], ref[c][r])) {
                snprintf(msg, sizeof msg, "%s %s%s n=%d%s vec_dot[r%d c%d] = %.9g, generic %.9g", level, tc->name,
                         KIND[kind], n, raw ? " raw" : "", r, c, vd[c][r], ref[c][r]);
                fail(msg);
            }
        }
    for (int t = 0; t < 12; t++) {
        int nr = t ? 1 + below(NR) : NR, nc = t ? 1 + below(NC) : NC;
        const int r0 = below(NR - nr + 1), c0 = below(NC - nc + 1);
        for (int i = 0; i < NC * LDO; i++) out[i] = NAN;
        lgemm(n, W + r0 * ldw, ldw, nr, A + c0 * lda, lda, nc, out, LDO);
        for (int c = 0; c < nc; c++)
            for (int r = 0; r < nr; r++) {
                checks++;
                if (!same_bits(out[c * LDO + r], vd[c0 + c][r0 + r])) {
                    snprintf(msg, sizeof msg, "%s %s%s n=%d gemm tile (r0 %d nr %d c0 %d nc %d) [%d,%d] differs from vec_dot",
                             level, tc->name, KIND[kind], n, r0, nr, c0, nc, r, c);
                    fail(msg);
                }
            }
    }
    free(W);
    free(A);
    free(x);
}

static void test_act_quantizers(const el_type_traits *lvl, const char *level) {
    const int acts[] = {EL_Q8_0, EL_Q8_1, EL_Q8_K};
    enum { N = 1024 };
    float x[N];
    uint8_t a[N * 2], b[N * 2];
    for (int k = 0; k < 3; k++)
        for (int rep = 0; rep < 8; rep++) {
            random_row(x, N);
            if (rep == 0) memset(x, 0, sizeof(float) * 256);  /* all-zero blocks */
            const size_t rs = el_row_size(acts[k], N);
            gen[acts[k]].from_float(x, a, N);
            lvl[acts[k]].from_float(x, b, N);
            checks++;
            if (memcmp(a, b, rs) != 0) {
                char msg[80];
                snprintf(msg, sizeof msg, "%s activation quantizer of type %d differs from the generic one", level, acts[k]);
                fail(msg);
            }
        }
}

/* vops.pv_tiles (p.v over f16 value tiles) bit-identical to the generic twin, one lane set and
 * llama.cpp's four: random tile counts, rows (the four-set kernel takes rows by threes), dims and
 * first tile index, absent tiles, and (row, tile) pairs whose weights are all zero (skipped). */
static void test_pv_tiles(const el_vec_ops *lv, const el_vec_ops *gv, const char *level) {
    enum { MT = 40, MR = 8, MD = 64 };
    static el_half vals[MT][MD * 16];
    static float w[MR * MT * 16], acc0[MR * (4 * MD * 16 + 16)], acc1[MR * (4 * MD * 16 + 16)];
    for (int it = 0; it < 300; it++) {
        const int nd = 8 * (1 + below(MD / 8)), nt = 1 + below(MT), nh = 1 + below(MR), t0 = below(7);
        const int sets = below(2) ? 4 : 1, lda = sets * nd * 16 + 16 * below(2);
        const el_half *vt[MT];
        for (int t = 0; t < nt; t++) {
            float x[MD * 16];
            random_row(x, nd * 16);
            for (int i = 0; i < nd * 16; i++) vals[t][i] = el_float_to_half(x[i]);
            vt[t] = below(9) ? vals[t] : NULL;
        }
        for (int r = 0; r < nh; r++)
            for (int t = 0; t < nt; t++) {
                const int zero = !vt[t] || below(6) == 0;
                for (int l = 0; l < 16; l++)
                    w[(r * nt + t) * 16 + l] = zero || below(5) == 0 ? 0.0f : el_half_to_float(el_float_to_half(uniform()));
            }
        random_row(acc0, nh * lda);
        memcpy(acc1, acc0, sizeof(float) * (size_t)(nh * lda));
        gv->pv_tiles(nd, nt, vt, nh, w, nt * 16, acc0, lda, sets, t0, vt, nt);
        lv->pv_tiles(nd, nt, vt, nh, w, nt * 16, acc1, lda, sets, t0, vt, nt);  /* next: these tiles again, a valid hint */
        checks++;
        for (int i = 0; i < nh * lda; i++)
            if (!same_bits(acc0[i], acc1[i])) {
                char msg[120];
                snprintf(msg, sizeof msg, "%s pv_tiles nd=%d nt=%d rows=%d sets=%d t0=%d [%d]", level, nd, nt, nh, sets, t0, i);
                fail(msg);
                break;
            }
    }
}

/* vops.pv_q8_0 / pv_q4_0 (p.v over quantized value tiles, summed in integers) bit-identical to the
 * generic twin: random tile and row counts, first tile's index in its sequence (chunks cut
 * anywhere, a call a chunk), chunk sums into the same sums or each into its own, absent tiles,
 * (row, tile) pairs whose weights are all zero (skipped); quant bytes random (q8_0 -128
 * included) under scales of both signs over many magnitudes (f16 subnormals and zeros too), and
 * weights from 1 down to f16 subnormals */
static void test_pv_q(const el_vec_ops *lv, const el_vec_ops *gv, const char *level) {
    enum { MT = 80, MR = 9, MC = MT / EL_PV_CHUNK + 2 };  /* (chunks of all 64 tiles too) */
    static uint8_t tiles[MT][16 * 34];
    static float w[MR * MT * 16], acc0[MC * MR * 48], acc1[MC * MR * 48];
    for (int it = 0; it < 300; it++) {
        const int q4 = it & 1, nt = 1 + below(MT), nh = 1 + below(MR);
        const size_t tb = q4 ? 16 * 18 : 16 * 34;  /* bytes of a value tile */
        const int lda = 32 + 16 * below(2), t0 = below(200), ldc = below(2) ? 0 : nh * lda;
        const int na = (ldc ? (t0 + nt - 1) / EL_PV_CHUNK - t0 / EL_PV_CHUNK + 1 : 1) * nh * lda;
        const uint8_t *vt[MT];
        for (int t = 0; t < nt; t++) {
            for (size_t i = 0; i < tb; i++) tiles[t][i] = (uint8_t)next_u64();
            for (int l = 0; l < 16; l++) {  /* the slots' scales: the tile's first 16 halves */
                const int kind = below(16);
                const float v = (uniform() + 0.01f) * (kind == 0 ? 1e-6f : kind == 1 ? 3e4f : 0.01f) * (below(2) ? 1.0f : -1.0f);
                el_half h = kind == 2 ? 0 : kind == 3 ? (el_half)(1 + below(0x3ff)) : el_float_to_half(v);
                memcpy(tiles[t] + 2 * l, &h, 2);
            }
            vt[t] = below(9) ? tiles[t] : NULL;
        }
        for (int r = 0; r < nh; r++)
            for (int t = 0; t < nt; t++) {
                const int zero = !vt[t] || below(6) == 0;
                for (int l = 0; l < 16; l++) {
                    const float u = uniform();
                    w[(r * nt + t) * 16 + l] = zero || below(5) == 0 ? 0.0f : el_half_to_float(el_float_to_half(below(3) ? u : u * u * u * u));
                }
            }
        random_row(acc0, na);
        memcpy(acc1, acc0, sizeof(float) * (size_t)na);
        pv_q_chunks(q4 ? gv->pv_q4_0 : gv->pv_q8_0, nt, vt, nh, w, nt * 16, acc0, lda, t0, ldc);
        pv_q_chunks(q4 ? lv->pv_q4_0 : lv->pv_q8_0, nt, vt, nh, w, nt * 16, acc1, lda, t0, ldc);
        checks++;
        for (int i = 0; i < na; i++)
            if (!same_bits(acc0[i], acc1[i])) {
                char msg[160];
                snprintf(msg, sizeof msg, "%s pv_%s nt=%d t0=%d ldc=%d rows=%d [%d] = %.9g, generic %.9g", level,
                         q4 ? "q4_0" : "q8_0", nt, t0, ldc, nh, i, acc1[i], acc0[i]);
                fail(msg);
                break;
            }
    }
}

/* vops.qk_q8_0 / qk_q4_0 (scores against quantized key tiles) bit-identical to the generic twin:
 * random head sizes and query counts, key tiles of random bytes (quants -128 included; finite
 * scales), queries from the activation quantizer */
static void test_qk_q(const el_vec_ops *lv, const el_vec_ops *gv, const char *level) {
    enum { MB = 8, MQ = 11 };
    static uint8_t kt[16 * MB * 34], q[MQ * (MB * 34 + 5)];
    static int32_t qsum[MQ * MB];
    static float x[MB * 32], out0[MQ * 16], out1[MQ * 16];
    for (int it = 0; it < 200; it++) {
        const int q4 = it & 1, nb = 1 + below(MB), hk = 32 * nb, nq = 1 + below(MQ);
        const size_t ldq = (size_t)nb * 34 + (size_t)below(6);
        for (size_t i = 0; i < sizeof kt; i++) kt[i] = (uint8_t)next_u64();
        for (int i = 0; i < 16 * nb; i++) {  /* finite scales */
            const el_half h = el_float_to_half((uniform() - 0.5f) * (below(8) ? 0.1f : 1e-4f));
            memcpy(kt + 2 * i, &h, 2);
        }
        for (int j = 0; j < nq; j++) {
            random_row(x, hk);
            el_traits[EL_Q8_0].from_float(x, q + j * ldq, hk);
            for (int b = 0; b < nb; b++) {
                const block_q8_0 *qb = (const block_q8_0 *)(q + j * ldq) + b;
                qsum[j * nb + b] = 0;
                for (int i = 0; i < 32; i++) qsum[j * nb + b] += qb->qs[i];
            }
        }
        if (q4) {
            gv->qk_q4_0(hk, q, ldq, qsum, nq, kt, out0, NULL);
            lv->qk_q4_0(hk, q, ldq, qsum, nq, kt, out1, kt);
        } else {
            gv->qk_q8_0(hk, q, ldq, qsum, nq, kt, out0, NULL);
            lv->qk_q8_0(hk, q, ldq, qsum, nq, kt, out1, kt);
        }
        checks++;
        for (int i = 0; i < nq * 16; i++)
            if (!same_bits(out0[i], out1[i])) {
                char msg[120];
                snprintf(msg, sizeof msg, "%s qk_%s hk=%d nq=%d [%d] = %.9g, generic %.9g", level, q4 ? "q4_0" : "q8_0", hk,
                         nq, i, out1[i], out0[i]);
                fail(msg);
                break;
            }
    }
}

int main(void) {
    el_set_isa(EL_ISA_GENERIC);  /* el_row_size reads el_traits */
    el_register_generic(gen);
    const el_vec_ops gv = el_vops;  /* the portable float helpers */
    for (int level = 0; level < 2; level++) {
        const char *name = level ? "avx512" : "avxvnni";
        const int f0 = failures, c0 = checks;
        el_type_traits lvl[EL_NTYPES];
        memset(lvl, 0, sizeof lvl);
        el_register_generic(lvl);
        el_register_avx2(lvl);  /* EL_X86_EMULATED: with AVX-VNNI */
        if (level) el_register_avx512(lvl);
        for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
            const type_case *tc = &TYPES[i];
            if (lvl[tc->id].vec_dot == gen[tc->id].vec_dot || !lvl[tc->id].gemm ||
                (gen[tc->id].vec_dot_batch && (lvl[tc->id].vec_dot_batch == gen[tc->id].vec_dot_batch || !lvl[tc->id].gemm_batch))) {
                char msg[80];
                snprintf(msg, sizeof msg, "%s: %s has no kernel registered", name, tc->name);
                checks++;
                fail(msg);
                continue;
            }
            const int blck = gen[tc->id].blck;
            const int q32[] = {32, 96, 608}, k256[] = {256, 768};
            for (int s = 0; s < (blck == 32 ? 3 : 2); s++)
                for (int raw = 0; raw <= 1; raw++)
                    for (int kind = 0; kind < 3; kind++)
                        if (!kind || (kind == 1 ? gen[tc->id].vec_dot_small : gen[tc->id].vec_dot_batch))
                            test_type(lvl, name, tc, blck == 32 ? q32[s] : k256[s], raw, kind);
        }
        test_act_quantizers(lvl, name);
        test_pv_tiles(&el_vops, &gv, name);  /* el_register_avx2 filled el_vops */
        test_qk_q(&el_vops, &gv, name);
        test_pv_q(&el_vops, &gv, name);
        printf("level %s: %d checks, %d failures\n", name, checks - c0, failures - f0);
    }
    printf("RESULT %s (%d checks, %d failures)\n", failures ? "FAIL" : "OK", checks, failures);
    return failures ? 1 : 0;
}
