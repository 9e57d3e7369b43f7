/* Gated DeltaNet layers (qwen35's recurrent layers) and the attention output gate, for engine.c's
 * forward pass; the math of llama.cpp's delta-net-base graph with ggml's CPU ops (ssm_conv,
 * gated_delta_net, rms_norm, silu, sigmoid, softplus), in their orders where they have one.
 *
 * Per layer, for the normed input rows in c->tmp:
 *   qkv = ssm_in . x, z = ssm_gate . x, beta = sigmoid(ssm_beta . x), g = softplus(ssm_alpha . x +
 *   ssm_dt) * ssm_a; a causal conv of dn_conv taps per channel over the sequence's qkv (the previous
 *   dn_conv - 1 inputs from the conv state), SiLU; q and k L2-normed per head; per v head h (q / k
 *   head h % dn_k_heads) and token, S = exp(g) S; d = (v - S k) beta; S += d k^T; o = S q /
 *   sqrt(dn_state); o RMS-normed per head (ssm_norm) times SiLU(z); out = ssm_out . o.
 * S is kept transposed as ggml keeps it: row j (a v dimension) holds S[j][i] over the k dims i.
 *
 * The recurrent state of a sequence lives in a slot (el_batch.rs_slot): per recurrent layer, the
 * conv state [dn_conv - 1][conv_dim] (oldest input first) then the v heads' S [H][S][S].
 */
#include <stdlib.h>
#include <stdio.h>
#include "engine_internal.h"

/* products fused only where written as fmaf: ggml's orders (as quants_generic.c) */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define MAX_STATE 1024  /* head size (the delta rule's scratch is on the stack) */
#define MAX_CONV 64     /* conv taps */

struct dn_state {
    int n_rec;          /* recurrent layers */
    int *rec_index;     /* [n_layer] -> index among the recurrent layers, -1 for attention */
    int conv_dim, d_inner;
    size_t conv_floats, s_floats, slot_floats;  /* per layer: conv state, S; per slot: all layers */
    float **slots;
    int n_slots;
    /* scratch, n_batch rows */
    float *qkv;    /* [n][conv_dim]: the projection, then the conv's output */
    float *z;      /* [n][d_inner] */
    float *beta;   /* [n][H] */
    float *g;      /* [n][H] */
    float *o;      /* [n][d_inner] */
    float *qg;     /* [n][2 q_dim]: wq's rows (q and gate per head), for the attention output gate */
    float *gate;   /* [n][q_dim] */
};

static void *amalloc(size_t n) {
    void *p = NULL;
    if (n == 0) n = 64;
    if (posix_memalign(&p, 64, (n + 63) / 64 * 64) != 0) return NULL;
    return p;
}

static int f32_vec_ok(const el_tensor *t, int64_t n) {
    return t->data && t->type == EL_F32 && t->ne0 == n && t->ne1 == 1;
}

int el_dn_init(el_engine *c, char *err, size_t err_size) {
    const el_model_desc *d = &c->d;
    int any_rec = 0;
    for (int l = 0; l < d->n_layer; l++) any_rec |= c->layers[l].recurrent;
    if (!any_rec && !d->attn_out_gate) return 0;
    struct dn_state *dn = calloc(1, sizeof *dn);
    if (!dn) { snprintf(err, err_size, "out of memory"); return -1; }
    c->dn = dn;
    const size_t B = (size_t)c->n_batch;
    const int qd = d->n_head * d->head_dim_k;
    if (d->attn_out_gate) {
        dn->qg = amalloc(4 * B * 2 * qd);
        dn->gate = amalloc(4 * B * qd);
        if (!dn->qg || !dn->gate) { snprintf(err, err_size, "out of memory"); return -1; }
    }
    dn->rec_index = malloc(sizeof(int) * (size_t)d->n_layer);
    if (!dn->rec_index) { snprintf(err, err_size, "out of memory"); return -1; }
    for (int l = 0; l < d->n_layer; l++) dn->rec_index[l] = c->layers[l].recurrent ? dn->n_rec++ : -1;
    if (!any_rec) return 0;
    const int S = d->dn_state, HK = d->dn_k_heads, H = d->dn_v_heads, K = d->dn_conv;
    if (S <= 0 || S > MAX_STATE || HK <= 0 || H <= 0 || H % HK || K < 1 || K > MAX_CONV) {
        snprintf(err, err_size, "DeltaNet: inconsistent sizes (state %d, heads %d / %d, conv %d)", S, HK, H, K);
        return -1;
    }
    dn->d_inner = S * H;
    dn->conv_dim = 2 * S * HK + dn->d_inner;
    dn->conv_floats = (size_t)(K - 1) * dn->conv_dim;
    dn->s_floats = (size_t)H * S * S;
    dn->slot_floats = (size_t)dn->n_rec * (dn->conv_floats + dn->s_floats);
    const int E = d->n_embd, CD = dn->conv_dim, VI = dn->d_inner;
    for (int l = 0; l < d->n_layer; l++) {
        const el_layer *L = &c->layers[l];
        if (!L->recurrent) continue;
        if (!el_weight_ok(c, &L->ssm_in, E, CD) || !el_weight_ok(c, &L->ssm_gate, E, VI) ||
            !el_weight_ok(c, &L->ssm_beta, E, H) || !el_weight_ok(c, &L->ssm_alpha, E, H) ||
            !el_weight_ok(c, &L->ssm_out, VI, E)) {
            snprintf(err, err_size, "blk.%d: a DeltaNet projection has a bad shape or unsupported type", l);
            return -1;
        }
        if (!L->ssm_conv1d.data || L->ssm_conv1d.type != EL_F32 || L->ssm_conv1d.ne0 != K || L->ssm_conv1d.ne1 != CD ||
            !f32_vec_ok(&L->ssm_dt, H) || !f32_vec_ok(&L->ssm_a, H) || !f32_vec_ok(&L->ssm_norm, S)) {
            snprintf(err, err_size, "blk.%d: ssm_conv1d, ssm_dt, ssm_a or ssm_norm has a bad shape", l);
            return -1;
        }
    }
    dn->qkv = amalloc(4 * B * CD);
    dn->z = amalloc(4 * B * VI);
    dn->beta = amalloc(4 * B * H);
    dn->g = amalloc(4 * B * H);
    dn->o = amalloc(4 * B * VI);
    if (!dn->qkv || !dn->z || !dn->beta || !dn->g || !dn->o) {
        snprintf(err, err_size, "out of memory for DeltaNet scratch (n_batch %d)", c->n_batch);
        return -1;
    }
    return 0;
}

void el_dn_free(el_engine *c) {
    struct dn_state *dn = c->dn;
    if (!dn) return;
    for (int i = 0; i < dn->n_slots; i++) free(dn->slots[i]);
    free(dn->slots);
    free(dn->rec_index);
    free(dn->qkv); free(dn->z); free(dn->beta); free(dn->g); free(dn->o); free(dn->qg); free(dn->gate);
    free(dn);
    c->dn = NULL;
}

static int has_state(const el_engine *c) { return c->dn && c->dn->n_rec > 0; }

int el_rs_reserve(el_engine *c, int n_slots) {
    struct dn_state *dn = c->dn;
    if (!has_state(c)) return n_slots > 0 ? -1 : 0;
    if (n_slots <= dn->n_slots) return dn->n_slots;
    float **s = realloc(dn->slots, sizeof(float *) * (size_t)n_slots);
    if (!s) return -1;
    dn->slots = s;
    while (dn->n_slots < n_slots) {
        float *p = amalloc(4 * dn->slot_floats);
        if (!p) return -1;
        memset(p, 0, 4 * dn->slot_floats);
        dn->slots[dn->n_slots++] = p;
    }
    return dn->n_slots;
}

int el_rs_clear(el_engine *c, int slot) {
    if (!has_state(c) || slot < 0 || slot >= c->dn->n_slots) return -2;
    memset(c->dn->slots[slot], 0, 4 * c->dn->slot_floats);
    return 0;
}

int el_rs_copy(el_engine *c, int src, int dst) {
    if (!has_state(c) || src < 0 || dst < 0 || src >= c->dn->n_slots || dst >= c->dn->n_slots) return -2;
    if (src != dst) memcpy(c->dn->slots[dst], c->dn->slots[src], 4 * c->dn->slot_floats);
    return 0;
}

int el_dn_check_batch(el_engine *c, const el_batch *b, char *err, size_t err_size) {
    if (!has_state(c)) return 0;
    if (!b->rs_slot) {
        snprintf(err, err_size, "a model with recurrent layers needs each sequence's state slot");
        return -1;
    }
    for (int s = 0; s < b->n_seqs; s++) {
        if (b->rs_slot[s] < 0 || b->rs_slot[s] >= c->dn->n_slots) {
            snprintf(err, err_size, "sequence %d: recurrent state slot %d of %d", s, b->rs_slot[s], c->dn->n_slots);
            return -1;
        }
        for (int t = 0; t < s; t++)
            if (b->rs_slot[t] == b->rs_slot[s]) {
                snprintf(err, err_size, "sequences %d and %d share recurrent state slot %d", t, s, b->rs_slot[s]);
                return -1;
            }
    }
    return 0;
}

/* ggml_vec_dot_f32's order on AVX-512 builds: 64-value chunks into four 16-lane fma accumulators,
 * combined (a0 + a2) + (a1 + a3) and reduced as _mm512_reduce_add_ps; the rest added one by one,
 * each product rounded (the tiny model's heads of 16 are all rest: llama.cpp's bits, checked by
 * tests/test_arch_engines.py; the chunks of real models' heads of 128 are not checked yet) */
static float dot_f32(int n, const float *x, const float *y) {
    const int np = n & ~63;
    float sum = 0.0f;
    if (np) {
        float acc[4][16] = {{0}};
        for (int i = 0; i < np; i += 64)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 16; l++) acc[j][l] = fmaf(x[i + 16 * j + l], y[i + 16 * j + l], acc[j][l]);
        float t[16];
        for (int l = 0; l < 16; l++) t[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
        sum = el_sum16(t);
    }
    for (int i = np; i < n; i++) sum += x[i] * y[i];  /* not fused (fp-contract off above) */
    return sum;
}

static inline float silu(float x) { return x / (1.0f + el_expf(-x)); }  /* ggml_v_silu */

void el_delta_net(el_engine *c, act_state *st, int l, int ith, int nth) {
    struct dn_state *dn = c->dn;
    const el_model_desc *d = &c->d;
    const el_layer *L = &c->layers[l];
    const step_plan *pl = &c->plan;
    const el_batch *b = pl->b;
    const int n = pl->n, E = d->n_embd;
    const int S = d->dn_state, HK = d->dn_k_heads, H = d->dn_v_heads, K = d->dn_conv;
    const int CD = dn->conv_dim, VI = dn->d_inner, KD = S * HK;
    const size_t layer_off = (size_t)dn->rec_index[l] * (dn->conv_floats + dn->s_floats);

    el_task_matmul(c, st, &L->ssm_in, c->tmp, n, E, dn->qkv, CD, ith, nth);
    el_task_matmul(c, st, &L->ssm_gate, c->tmp, n, E, dn->z, VI, ith, nth);
    el_task_matmul(c, st, &L->ssm_beta, c->tmp, n, E, dn->beta, H, ith, nth);
    el_task_matmul(c, st, &L->ssm_alpha, c->tmp, n, E, dn->g, H, ith, nth);
    el_task_sync(c, st);
    el_trace(c, "linear_attn_qkv_mixed", l, dn->qkv, n, CD, CD, ith);
    el_trace(c, "z", l, dn->z, n, VI, VI, ith);
    el_trace(c, "beta", l, dn->beta, n, H, H, ith);
    el_trace(c, "alpha", l, dn->g, n, H, H, ith);

    /* the conv, channel by channel (a thread's channels over every sequence), then the new conv
     * state: the last K - 1 inputs of [state, rows] */
    {
        int64_t c0, c1;
        el_split(CD, ith, nth, 16, &c0, &c1);
        const float *w = L->ssm_conv1d.data;  /* [CD][K] */
        float keep[MAX_CONV];
        for (int s = 0; s < b->n_seqs && c0 < c1; s++) {
            float *cs = dn->slots[b->rs_slot[s]] + layer_off;  /* [K - 1][CD] */
            float *x = dn->qkv + (size_t)pl->seq_row0[s] * CD;
            const int nr = pl->seq_rows[s];
            /* input u of the channel: the state's for u < K - 1, then the rows' */
#define IN(u) ((u) < K - 1 ? cs[(size_t)(u) * CD + ch] : x[(size_t)((u) - (K - 1)) * CD + ch])
            for (int64_t ch = c0; ch < c1; ch++) {
                for (int t = 0; t < K - 1; t++) keep[t] = IN(nr + t);
                const float *wc = w + (size_t)ch * K;
                for (int t = nr - 1; t >= 0; t--) {  /* in place: row t is read only by outputs >= t */
                    float sum = 0.0f;
                    for (int k = 0; k < K; k++) sum = fmaf(IN(t + k), wc[k], sum);
                    x[(size_t)t * CD + ch] = silu(sum);
                }
                for (int t = 0; t < K - 1; t++) cs[(size_t)t * CD + ch] = keep[t];
            }
#undef IN
        }
    }
    el_task_sync(c, st);
    el_trace(c, "conv_output_silu", l, dn->qkv, n, CD, CD, ith);
    /* per row: q and k L2-normed per head (ggml_rms_norm with eps / S, times 1 / sqrt(S)), the
     * gates beta and g */
    for (int m = ith; m < n; m += nth) {
        float *r = dn->qkv + (size_t)m * CD;
        const float inv = 1.0f / sqrtf((float)S), eps = d->norm_eps / (float)S;
        for (int i = 0; i < 2 * KD; i += S) {
            el_rmsnorm(r + i, r + i, NULL, S, eps);
            for (int j = 0; j < S; j++) r[i + j] *= inv;
        }
        float *bt = dn->beta + (size_t)m * H, *g = dn->g + (size_t)m * H;
        const float *dt = L->ssm_dt.data, *a = L->ssm_a.data;
        for (int h = 0; h < H; h++) {
            bt[h] = 1.0f / (1.0f + expf(-bt[h]));
            const float x = g[h] + dt[h];
            g[h] = (x > 20.0f ? x : logf(1.0f + expf(x))) * a[h];
        }
    }
    el_task_sync(c, st);

    /* the delta rule: (sequence, v head) pairs across threads, each over its rows in order; then
     * the gated RMS norm of the head's output */
    {
        const int pairs = b->n_seqs * H;
        const float scale = 1.0f / sqrtf((float)S);
        float dl[MAX_STATE];
        for (int p = ith; p < pairs; p += nth) {
            const int s = p / H, h = p % H, hk = h % HK;
            float *M = dn->slots[b->rs_slot[s]] + layer_off + dn->conv_floats + (size_t)h * S * S;
            for (int m = pl->seq_row0[s]; m < pl->seq_row0[s] + pl->seq_rows[s]; m++) {
                const float *r = dn->qkv + (size_t)m * CD;
                const float *q = r + hk * S, *k = r + KD + hk * S, *v = r + 2 * KD + h * S;
                const float beta = dn->beta[(size_t)m * H + h], eg = expf(dn->g[(size_t)m * H + h]);
                for (int i = 0; i < S * S; i++) M[i] *= eg;
                for (int j = 0; j < S; j++) dl[j] = (v[j] - dot_f32(S, M + (size_t)j * S, k)) * beta;
                for (int j = 0; j < S; j++)
                    for (int i = 0; i < S; i++) M[(size_t)j * S + i] = fmaf(k[i], dl[j], M[(size_t)j * S + i]);
                float *o = dn->o + (size_t)m * VI + h * S;
                for (int j = 0; j < S; j++) o[j] = dot_f32(S, M + (size_t)j * S, q) * scale;
                const float *z = dn->z + (size_t)m * VI + h * S;
                el_rmsnorm(o, o, L->ssm_norm.data, S, d->norm_eps);
                for (int j = 0; j < S; j++) o[j] *= silu(z[j]);
            }
        }
    }
    el_task_sync(c, st);
    el_trace(c, "final_output", l, dn->o, n, VI, VI, ith);
    el_trace(c, "gate", l, dn->g, n, H, H, ith);
    el_trace(c, "beta_sigmoid", l, dn->beta, n, H, H, ith);
    el_task_matmul(c, st, &L->ssm_out, dn->o, n, VI, c->tmp, E, ith, nth);
    el_task_sync(c, st);
}

float *el_gate_q(el_engine *c) { return c->dn->qg; }

void el_gate_split(el_engine *c, const el_layer *L, int m, int h) {
    const int hd = c->d.head_dim_k, qd = c->d.n_head * hd;
    float *qg = c->dn->qg + (size_t)m * 2 * qd + (size_t)2 * h * hd;
    if (L->bq.data)
        for (int i = 0; i < 2 * hd; i++) qg[i] += ((const float *)L->bq.data)[(size_t)2 * h * hd + i];
    memcpy(c->q + (size_t)m * qd + (size_t)h * hd, qg, sizeof(float) * (size_t)hd);
    memcpy(c->dn->gate + (size_t)m * qd + (size_t)h * hd, qg + hd, sizeof(float) * (size_t)hd);
}

void el_gate_apply(el_engine *c, int ith, int nth) {
    const int od = c->d.n_head * c->d.head_dim_v, n = c->plan.n;
    for (int m = ith; m < n; m += nth) {
        float *x = c->xn + (size_t)m * od;
        const float *g = c->dn->gate + (size_t)m * od;
        for (int i = 0; i < od; i++) x[i] *= 1.0f / (1.0f + expf(-g[i]));  /* ggml_vec_sigmoid_f32 */
    }
}
