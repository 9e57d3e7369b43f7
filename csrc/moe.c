/* The mixture-of-experts FFN: llama.cpp's build_moe_ffn with softmax gating (qwen2moe, qwen3moe,
 * granite, llama's experts) and the shared expert beside it (qwen2moe's gated one, granite's plain
 * one), for a step's rows from any number of sequences.
 *
 * Per token: the router's logits (ffn_gate_inp . x), their softmax, the n_expert_used most
 * probable experts (most probable first), their probabilities as weights - divided by their sum
 * when the architecture renormalises, times the weights scale. Then the step's (token, expert)
 * pairs are grouped by expert, so each chosen expert's weights are read once per step for all its
 * tokens (llama.cpp's mul_mat_id): its gate and up rows over the gathered, quantized input rows of
 * its tokens, SiLU(gate) * up, its down rows over those. The weighted outputs are summed in the
 * order the experts were chosen, then the shared expert's output (times its sigmoid gate) added.
 *
 * A pair's numbers depend on its token alone: its input row is quantized as it would be alone,
 * and the batch-invariant kernels give a row the same bits in any tile, so a token's FFN output is
 * the same whatever else the step holds. The expert weights are used in place: expert e's matrix is
 * rows [e * rows, (e + 1) * rows) of the stacked tensor in the mapping. Expert ids come from the
 * selection over the router's n_expert outputs, and the engine checked at creation that every
 * stacked tensor holds n_expert experts of the declared shape, so no id can reach past a tensor.
 */
#include <stdlib.h>
#include <stdio.h>
#include "engine_internal.h"

#define MAX_EXPERT 512  /* llama.cpp's LLAMA_MAX_EXPERTS */
#define ONE_THREAD_PAIRS 64  /* steps of up to this many (token, expert) pairs are routed by one thread */

struct moe_state {
    float *logits;         /* [n_batch][n_expert] router logits, then probabilities */
    float *sgate;          /* [n_batch] the shared expert's gate logit, then its sigmoid */
    int32_t *sel;          /* [n_batch][n_used] chosen experts, most probable first */
    float *wt;             /* [n_batch][n_used] their weights */
    int32_t *count, *row0; /* [n_expert] pairs of each expert; its first gathered row */
    int32_t *row_tok;      /* [n_batch * n_used] token of each gathered row (grouped by expert) */
    int32_t *pair_row;     /* [n_batch][n_used] gathered row of each pair */
    uint8_t *act_up, *act_gate, *act_down; /* gathered rows quantized for each matmul (act_gate may be act_up) */
    float *g, *u;          /* [n_batch * n_used][n_ff_exp] */
    float *o;              /* [n_batch * n_used][n_embd] each pair's expert output */
    float *shexp;          /* [n_batch][n_embd] the shared expert's output */
};

static void *amalloc64(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, (n + 63) / 64 * 64 + 64) == 0 ? p : NULL;
}

void el_moe_free(el_engine *c) {
    struct moe_state *M = c->moe;
    if (!M) return;
    free(M->logits); free(M->sgate); free(M->sel); free(M->wt); free(M->count); free(M->row0);
    free(M->row_tok); free(M->pair_row); free(M->act_up); free(M->act_down); free(M->g); free(M->u);
    free(M->o); free(M->shexp);
    if (M->act_gate != M->act_up) free(M->act_gate);
    free(M);
    c->moe = NULL;
}

static size_t act_bytes(const el_engine *c, const el_tensor *t, int64_t k) {
    return el_row_size(c->traits[t->type].vec_dot_type, k);
}

#define ERR(...) do { snprintf(err, err_size, __VA_ARGS__); goto fail; } while (0)

int el_moe_init(el_engine *c, char *err, size_t err_size) {
    const el_model_desc *d = &c->d;
    const int64_t E = d->n_embd, X = d->n_expert, K = d->n_expert_used, F = d->n_ff_exp, FS = d->n_ff_shexp;
    struct moe_state *M = NULL;
    if (X < 1 || X > MAX_EXPERT) { snprintf(err, err_size, "%lld experts (1 to %d)", (long long)X, MAX_EXPERT); return -1; }
    if (K < 1 || K > X) { snprintf(err, err_size, "%lld experts used of %lld", (long long)K, (long long)X); return -1; }
    if (F <= 0 || FS < 0) { snprintf(err, err_size, "expert widths %lld / %lld", (long long)F, (long long)FS); return -1; }
    for (int l = 0; l < d->n_layer; l++) {
        const el_layer *L = &c->layers[l];
        if (!el_weight_ok(c, &L->w_gate_inp, E, X)) ERR("blk.%d.ffn_gate_inp: bad shape or unsupported type", l);
        if (!el_weight_ok(c, &L->w_gate_exps, E, F * X)) ERR("blk.%d.ffn_gate_exps: bad shape or unsupported type", l);
        if (!el_weight_ok(c, &L->w_up_exps, E, F * X)) ERR("blk.%d.ffn_up_exps: bad shape or unsupported type", l);
        if (!el_weight_ok(c, &L->w_down_exps, F, E * X)) ERR("blk.%d.ffn_down_exps: bad shape or unsupported type", l);
        if (FS && (!el_weight_ok(c, &L->w_gate_shexp, E, FS) || !el_weight_ok(c, &L->w_up_shexp, E, FS) ||
                   !el_weight_ok(c, &L->w_down_shexp, FS, E)))
            ERR("blk.%d: a shared expert tensor has a bad shape or unsupported type", l);
        if (d->shexp_gate && (L->w_gate_inp_shexp.type != EL_F32 || !el_weight_ok(c, &L->w_gate_inp_shexp, E, 1)))
            ERR("blk.%d.ffn_gate_inp_shexp: must be F32 of %lld values", l, (long long)E);
        /* every layer's experts quantize their inputs alike (the gathered rows are shared) */
        const el_layer *L0 = &c->layers[0];
        if (c->traits[L->w_up_exps.type].vec_dot_type != c->traits[L0->w_up_exps.type].vec_dot_type ||
            c->traits[L->w_gate_exps.type].vec_dot_type != c->traits[L0->w_gate_exps.type].vec_dot_type)
            ERR("blk.%d: expert tensors of another activation type than layer 0's are not supported", l);
    }
    if (d->shexp_gate && !FS) ERR("a shared expert gate without a shared expert");
    M = c->moe = calloc(1, sizeof *M);
    if (!M) ERR("out of memory");
    const size_t B = (size_t)c->n_batch, P = B * (size_t)K;
    const el_layer *L0 = &c->layers[0];
    M->logits = amalloc64(4 * B * X);
    M->sgate = amalloc64(4 * B);
    M->sel = amalloc64(4 * P);
    M->wt = amalloc64(4 * P);
    M->count = amalloc64(4 * (size_t)X);
    M->row0 = amalloc64(4 * (size_t)X);
    M->row_tok = amalloc64(4 * P);
    M->pair_row = amalloc64(4 * P);
    M->act_up = amalloc64(P * act_bytes(c, &L0->w_up_exps, E));
    const int same = c->traits[L0->w_up_exps.type].vec_dot_type == c->traits[L0->w_gate_exps.type].vec_dot_type;
    M->act_gate = same ? M->act_up : amalloc64(P * act_bytes(c, &L0->w_gate_exps, E));
    M->act_down = amalloc64(P * act_bytes(c, &L0->w_down_exps, F));
    M->g = amalloc64(4 * P * F);
    M->u = amalloc64(4 * P * F);
    M->o = amalloc64(4 * P * E);
    M->shexp = amalloc64(4 * B * E);
    if (!M->logits || !M->sgate || !M->sel || !M->wt || !M->count || !M->row0 || !M->row_tok || !M->pair_row ||
        !M->act_up || !M->act_gate || !M->act_down || !M->g || !M->u || !M->o || !M->shexp)
        ERR("out of memory for the experts' scratch (n_batch %d)", c->n_batch);
    return 0;
fail:
    el_moe_free(c);
    return -1;
}

/* One token's routing: p (the router's n_expert logits) becomes the softmax, as ggml_soft_max on
 * llama.cpp's AVX-512 builds computes it (exp(x - max) by ggml_v_expf 16 at a time, each 16 summed
 * by _mm512_reduce_add_ps's tree into a double; the last n % 16 by expf; then times 1 / sum); sel
 * the n_used most probable experts (the lowest id on a tie), wt their weights. */
static void route(const el_model_desc *d, float *p, int32_t *sel, float *wt) {
    const int X = d->n_expert, K = d->n_expert_used;
    float mx = -INFINITY;
    for (int e = 0; e < X; e++) mx = mx > p[e] ? mx : p[e];  /* ggml_vec_max_f32 */
    double sum = 0.0;
    int e = 0;
    for (; e + 15 < X; e += 16) {
        for (int j = 0; j < 16; j++) p[e + j] = el_expf(p[e + j] - mx);
        sum += (double)el_sum16(p + e);
    }
    for (; e < X; e++) {
        p[e] = expf(p[e] - mx);
        sum += (double)p[e];
    }
    const float inv = (float)(1.0 / sum);
    for (e = 0; e < X; e++) p[e] *= inv;
    uint8_t taken[MAX_EXPERT] = {0};
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (e = 0; e < X; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = 1;  /* best is in [0, X): K <= X experts, one new each time */
        sel[k] = best;
        wt[k] = p[best];
    }
    if (d->moe_norm_w) {  /* ggml_sum_rows (a double sum), clamped below at f16's smallest normal */
        double s = 0.0;
        for (int k = 0; k < K; k++) s += (double)wt[k];
        float sf = (float)s;
        if (!(sf >= 6.103515625e-5f)) sf = 6.103515625e-5f;
        for (int k = 0; k < K; k++) wt[k] = wt[k] / sf;
    }
    if (d->moe_w_scale != 0.0f && d->moe_w_scale != 1.0f)
        for (int k = 0; k < K; k++) wt[k] *= d->moe_w_scale;
}

/* token m's routing: its expert choice, and its shared expert gate's sigmoid */
static void route_token(const el_model_desc *d, struct moe_state *M, int m) {
    const int X = d->n_expert, K = d->n_expert_used;
    route(d, M->logits + (size_t)m * X, M->sel + (size_t)m * K, M->wt + (size_t)m * K);
    if (d->shexp_gate) {  /* llama.cpp's sigmoid here: silu(x) / x, silu by expf (0 at x = 0: the limit) */
        const float x = M->sgate[m];
        M->sgate[m] = x == 0.0f ? 0.5f : x / (1.0f + expf(-x)) / x;
    }
}

/* The step's pairs grouped by expert, tokens in order within each (one thread). */
static void group(const el_model_desc *d, struct moe_state *M, int n) {
    const int X = d->n_expert, K = d->n_expert_used;
    for (int e = 0; e < X; e++) M->count[e] = 0;
    for (int i = 0; i < n * K; i++) M->count[M->sel[i]]++;
    int r = 0;
    for (int e = 0; e < X; e++) {
        M->row0[e] = r;
        r += M->count[e];
        M->count[e] = 0;
    }
    for (int m = 0; m < n; m++)
        for (int k = 0; k < K; k++) {
            const int e = M->sel[m * K + k], row = M->row0[e] + M->count[e]++;
            M->row_tok[row] = m;
            M->pair_row[m * K + k] = row;
        }
}

/* gathered rows r0, r0 + step, ... below P: their token's input quantized for the gate and up matmuls */
static void quantize_pairs(const el_engine *c, const el_layer *L, int r0, int P, int step) {
    const struct moe_state *M = c->moe;
    const el_type_traits *tr = c->traits;
    const int E = c->d.n_embd, vu = tr[L->w_up_exps.type].vec_dot_type, vg = tr[L->w_gate_exps.type].vec_dot_type;
    const size_t rs_u = el_row_size(vu, E), rs_g = el_row_size(vg, E);
    for (int r = r0; r < P; r += step) {
        const float *x = c->tmp + (size_t)M->row_tok[r] * E;
        tr[vu].from_float(x, M->act_up + (size_t)r * rs_u, E);
        if (M->act_gate != M->act_up) tr[vg].from_float(x, M->act_gate + (size_t)r * rs_g, E);
    }
}

/* this thread's share of expert e's matmul (w holds n_expert stacked matrices of `rows` rows)
 * over its gathered activation rows */
static void expert_matmul(const el_engine *c, const struct moe_state *M, const el_tensor *w, int e, int64_t rows,
                          const uint8_t *act, size_t rs, float *y, int ith, int nth) {
    if (!M->count[e]) return;
    el_matmul_acts(c, w, (int64_t)e * rows, rows, act + (size_t)M->row0[e] * rs, rs, M->count[e],
                   y + (size_t)M->row0[e] * rows, (size_t)rows, 0, ith, nth);
}

void el_moe_ffn(el_engine *c, act_state *st, int l, int ith, int nth) {
    struct moe_state *M = c->moe;
    const el_model_desc *d = &c->d;
    const el_layer *L = &c->layers[l];
    const el_type_traits *tr = c->traits;
    const int n = c->plan.n, E = d->n_embd, X = d->n_expert, K = d->n_expert_used, F = d->n_ff_exp;
    const int P = n * K;
    /* the router's logits, the shared expert's gate logit */
    el_task_matmul(c, st, &L->w_gate_inp, c->tmp, n, E, M->logits, X, ith, nth);
    if (d->shexp_gate) el_task_matmul(c, st, &L->w_gate_inp_shexp, c->tmp, n, E, M->sgate, 1, ith, nth);
    el_task_sync(c, st);
    /* each token routed, the pairs grouped by expert, their input rows quantized: a step of few
     * pairs by one thread in one phase (two barriers fewer), a larger one by all threads */
    if (P <= ONE_THREAD_PAIRS) {
        if (ith == 0) {
            for (int m = 0; m < n; m++) route_token(d, M, m);
            group(d, M, n);
            quantize_pairs(c, L, 0, P, 1);
        }
    } else {
        for (int m = ith; m < n; m += nth) route_token(d, M, m);
        el_task_sync(c, st);
        if (ith == 0) group(d, M, n);
        el_task_sync(c, st);
        quantize_pairs(c, L, ith, P, nth);
    }
    el_task_sync(c, st);
    const size_t rs_u = el_row_size(tr[L->w_up_exps.type].vec_dot_type, E);
    const size_t rs_g = el_row_size(tr[L->w_gate_exps.type].vec_dot_type, E);
    for (int e = 0; e < X; e++) {
        expert_matmul(c, M, &L->w_gate_exps, e, F, M->act_gate, rs_g, M->g, ith, nth);
        expert_matmul(c, M, &L->w_up_exps, e, F, M->act_up, rs_u, M->u, ith, nth);
    }
    el_task_sync(c, st);
    /* per pair row: SiLU(gate) * up, quantized for the down matmul */
    const int vd = tr[L->w_down_exps.type].vec_dot_type;
    const size_t rs_d = el_row_size(vd, F);
    for (int r = ith; r < P; r += nth) {
        c->vops.silu_mul(F, M->g + (size_t)r * F, M->u + (size_t)r * F);
        tr[vd].from_float(M->g + (size_t)r * F, M->act_down + (size_t)r * rs_d, F);
    }
    el_task_sync(c, st);
    for (int e = 0; e < X; e++) expert_matmul(c, M, &L->w_down_exps, e, E, M->act_down, rs_d, M->o, ith, nth);
    el_task_sync(c, st);
    if (d->n_ff_shexp)  /* reads c->tmp, ends with a barrier */
        el_gated_ffn(c, st, l, &L->w_gate_shexp, &L->w_up_shexp, &L->w_down_shexp, d->n_ff_shexp, EL_ACT_SILU,
                     M->shexp, ith, nth);
    /* per token: the weighted expert outputs summed in the order chosen (ggml_mul, then ggml_add
     * after ggml_add), then the shared expert's */
    for (int m = ith; m < n; m += nth) {
        float *t = c->tmp + (size_t)m * E;
        const int32_t *pr = M->pair_row + (size_t)m * K;
        const float *w = M->wt + (size_t)m * K;
        for (int i = 0; i < E; i++) {
            float acc = M->o[(size_t)pr[0] * E + i] * w[0];
            for (int k = 1; k < K; k++) acc = acc + M->o[(size_t)pr[k] * E + i] * w[k];
            if (d->n_ff_shexp) {
                float s = M->shexp[(size_t)m * E + i];
                if (d->shexp_gate) s = s * M->sgate[m];
                acc = acc + s;
            }
            t[i] = acc;
        }
    }
    el_task_sync(c, st);
    st->src = NULL;  /* c->tmp no longer holds what actq was quantized from */
}
