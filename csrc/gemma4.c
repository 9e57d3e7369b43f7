/* Gemma 4's additions to the forward pass (engine.c calls them): per-layer input embeddings and
 * per-layer output scales, as llama.cpp's gemma4 graph computes them (src/models/gemma4.cpp).
 *
 * Per-layer inputs, once per step, for every row m and layer l (P = n_embd_per_layer values):
 *   e[m][l] = (rms_norm(ple_model_proj . x0[m] * (1 / sqrt(n_embd)))[l] * ple_proj_norm
 *              + ple_embd[token[m]][l] * sqrt(P)) * (1 / sqrt(2))
 * with x0 the scaled token embedding (the norm over each layer's P values). After layer l's FFN
 * residual: x += rms_norm(ple_proj . (gelu(ple_gate . x) * e[l])) * ple_post_norm, then
 * x *= out_scale where the layer has one. */
#include <stdlib.h>
#include <stdio.h>
#include "engine_internal.h"

struct ple_state {
    float *in;    /* [n_batch][n_layer * P] every layer's inputs of the step's rows */
    float *proj;  /* [n_batch][n_layer * P] the projection of the token embeddings */
    float *gate;  /* [n_batch][P] */
};

int el_ple_init(el_engine *e, char *err, size_t err_size) {
    const el_model_desc *d = &e->d;
    const int P = d->n_embd_per_layer, E = d->n_embd, LP = d->n_layer * P;
    if (P < 0) { snprintf(err, err_size, "n_embd_per_layer must not be negative"); return -1; }
    for (int l = 0; l < d->n_layer; l++) {
        const el_layer *L = &e->layers[l];
        if (L->out_scale.data && (L->out_scale.type != EL_F32 || L->out_scale.ne0 != 1)) {
            snprintf(err, err_size, "blk.%d.layer_output_scale: bad shape", l);
            return -1;
        }
        if (!P) continue;
        if (!el_weight_ok(e, &L->ple_gate, E, P) || !el_weight_ok(e, &L->ple_proj, P, E) ||
            !L->ple_post_norm.data || L->ple_post_norm.type != EL_F32 || L->ple_post_norm.ne0 != E) {
            snprintf(err, err_size, "blk.%d: per-layer embedding tensors of bad shape or type", l);
            return -1;
        }
    }
    if (!P) return 0;
    if (!el_weight_ok(e, &d->ple_embd, LP, d->n_vocab) || !e->traits[d->ple_embd.type].to_float ||
        !el_weight_ok(e, &d->ple_model_proj, E, LP) || !d->ple_proj_norm.data || d->ple_proj_norm.type != EL_F32 ||
        d->ple_proj_norm.ne0 != P) {
        snprintf(err, err_size, "per-layer embedding tensors of bad shape or type");
        return -1;
    }
    struct ple_state *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, err_size, "out of memory"); return -1; }
    e->ple = s;
    const size_t B = (size_t)e->n_batch;
    s->in = malloc(sizeof(float) * B * LP);
    s->proj = malloc(sizeof(float) * B * LP);
    s->gate = malloc(sizeof(float) * B * P);
    if (!s->in || !s->proj || !s->gate) { snprintf(err, err_size, "out of memory"); return -1; }
    return 0;
}

void el_ple_free(el_engine *e) {
    if (!e->ple) return;
    free(e->ple->in); free(e->ple->proj); free(e->ple->gate);
    free(e->ple);
    e->ple = NULL;
}

void el_ple_inputs(el_engine *e, act_state *st, int ith, int nth) {
    const el_model_desc *d = &e->d;
    struct ple_state *s = e->ple;
    const int n = e->plan.n, E = d->n_embd, P = d->n_embd_per_layer, LP = d->n_layer * P;
    const el_tensor *te = &d->ple_embd;
    const float emb_scale = sqrtf((float)P), proj_scale = 1.0f / sqrtf((float)E), in_scale = 1.0f / sqrtf(2.0f);
    st->src = NULL;  /* x is quantized afresh */
    el_task_matmul(e, st, &d->ple_model_proj, e->x, n, E, s->proj, LP, ith, nth);
    for (int m = ith; m < n; m += nth) {
        float *in = s->in + (size_t)m * LP;
        e->traits[te->type].to_float((const uint8_t *)te->data + (size_t)e->plan.b->token[m] * te->row_bytes, in, LP);
        for (int i = 0; i < LP; i++) in[i] *= emb_scale;
    }
    el_task_sync(e, st);
    for (int m = ith; m < n; m += nth) {
        float *pr = s->proj + (size_t)m * LP, *in = s->in + (size_t)m * LP;
        for (int i = 0; i < LP; i++) pr[i] *= proj_scale;
        for (int l = 0; l < d->n_layer; l++)
            el_rmsnorm(pr + (size_t)l * P, pr + (size_t)l * P, d->ple_proj_norm.data, P, d->norm_eps);
        for (int i = 0; i < LP; i++) in[i] = (pr[i] + in[i]) * in_scale;
    }
    el_task_sync(e, st);
}

void el_layer_end(el_engine *e, act_state *st, int l, int ith, int nth) {
    const el_model_desc *d = &e->d;
    const el_layer *L = &e->layers[l];
    const int n = e->plan.n, E = d->n_embd, P = d->n_embd_per_layer, LP = d->n_layer * P;
    if (P) {
        struct ple_state *s = e->ple;
        st->src = NULL;  /* x changed since it was last quantized */
        el_task_matmul(e, st, &L->ple_gate, e->x, n, E, s->gate, P, ith, nth);
        el_task_sync(e, st);
        for (int m = ith; m < n; m += nth) {
            float *g = s->gate + (size_t)m * P;
            el_geglu(&e->vops, P, g, NULL);  /* GELU alone */
            const float *in = s->in + (size_t)m * LP + (size_t)l * P;
            for (int i = 0; i < P; i++) g[i] *= in[i];
        }
        el_task_sync(e, st);
        el_task_matmul(e, st, &L->ple_proj, s->gate, n, P, e->tmp, E, ith, nth);
        el_task_sync(e, st);
    }
    const float *scale = L->out_scale.data;
    for (int m = ith; m < n; m += nth) {
        float *xr = e->x + (size_t)m * E, *t = e->tmp + (size_t)m * E;
        if (P) {
            el_rmsnorm(t, t, L->ple_post_norm.data, E, d->norm_eps);
            for (int i = 0; i < E; i++) xr[i] += t[i];
        }
        if (scale) for (int i = 0; i < E; i++) xr[i] *= scale[0];
    }
    el_task_sync(e, st);
}
