/* The forward pass of a decoder-only transformer (llama / gemma3 family) over GGUF weights, for a
 * batch of tokens from any number of sequences.
 *
 * One el_engine_decode call evaluates a batch: every pool thread runs `forward_task`, which walks
 * the layers; phases are split by rows (or attention work items) across threads and separated by
 * barriers. Activations are quantized once per matmul input into the weight's vec_dot type. Every
 * row is computed with the same kernels whatever the batch holds (the batch-order vec_dot / gemm
 * of each type, which give the same bits for a row in any tile), so a sequence's numbers do not
 * depend on its company; llama_order batches instead take llama.cpp's small-batch kernels for the tail rows,
 * as the single-stream API does to give llama.cpp's numbers. Keys and values go to the paged KV
 * storage of kv.c through the batch's block tables; attention.c reads them back.
 */
#include <stdlib.h>
#include <stdio.h>
#include <stdatomic.h>
#include "engine_internal.h"

#define ALIGN 64
#define ROW_ALIGN 16  /* thread row ranges start at multiples of this */
#define ROW_TILE 256  /* weight rows per gemm call in prefill (decode: a thread's whole range) */
#define TOK_TILE 32   /* activation rows per gemm call */
/* rows of a batch-order step's FFN evaluated at a time (el_gated_ffn): a 512-token step's gate
 * and up activations would take n_batch x n_ff floats each (8 MB for Gemma-3 270m); a chunk's
 * take half of that. 256: 64 and 128 made a 512-token step of SmolLM2 12% and 7% slower, 256 no
 * slower (scripts/bench_engine.py ffn-chunk) */
#define FFN_CHUNK 256

static _Thread_local char last_error[256];

/* Debugging: when set, thread 0 reports each named intermediate ([rows][cols], row stride ld)
 * after the barrier that completes it, while the other threads wait. Names follow llama.cpp's
 * graph (attn_norm, Qcur, ...). */
static el_trace_fn trace_fn;
void el_set_trace(el_trace_fn fn) { trace_fn = fn; }
#define TRACE(name, l, p, rows, cols, ld)                        \
    do {                                                         \
        if (trace_fn) {                                          \
            if (ith == 0) trace_fn(name, l, p, rows, cols, ld);  \
            el_pool_barrier(c->pool);                            \
        }                                                        \
    } while (0)
const char *el_last_error(void) { return last_error; }
void el_trace(el_engine *c, const char *name, int l, const float *p, int rows, int cols, int ld, int ith) {
    TRACE(name, l, p, rows, cols, ld);
}
#define FAIL(...) do { snprintf(last_error, sizeof last_error, __VA_ARGS__); goto fail; } while (0)
#define BAD(...) do { snprintf(last_error, sizeof last_error, __VA_ARGS__); return -2; } while (0)

static void *amalloc(size_t n) {
    void *p = NULL;
    if (n == 0) n = ALIGN;
    if (posix_memalign(&p, ALIGN, (n + ALIGN - 1) / ALIGN * ALIGN) != 0) return NULL;
    return p;
}

/* the step scratch's buffers from base on (el_engine_set_scratch), in the order of scr_bytes */
static void place_scratch(el_engine *c, uint8_t *base) {
    float **bufs[N_SCRATCH] = {&c->xn, &c->q, &c->kc, &c->vc, &c->gate, &c->up, &c->rope};
    for (int i = 0; i < N_SCRATCH; i++) {
        *bufs[i] = (float *)base;
        base += c->scr_bytes[i];
    }
}

static int tensor_ok(const el_engine *c, const el_tensor *t, int64_t ne0, int64_t ne1) {
    if (!t->data) return 0;
    if (t->type < 0 || t->type >= EL_NTYPES || c->traits[t->type].blck == 0) return 0;
    if (c->traits[t->type].vec_dot == NULL) return 0;
    if (t->ne0 != ne0 || (ne1 >= 0 && t->ne1 != ne1)) return 0;
    return t->ne0 % c->traits[t->type].blck == 0 && t->row_bytes == el_row_size(t->type, t->ne0);
}

int el_weight_ok(const el_engine *c, const el_tensor *t, int64_t ne0, int64_t ne1) { return tensor_ok(c, t, ne0, ne1); }

static int norm_ok(const el_tensor *t, int64_t n) {
    return !t->data || (t->type == EL_F32 && t->ne0 == n && t->ne1 == 1);
}

el_engine *el_engine_new(const el_model_desc *desc, int n_ctx, int n_batch, int n_threads, int type_k, int type_v) {
    el_engine *c = calloc(1, sizeof(el_engine));
    if (!c) { snprintf(last_error, sizeof last_error, "out of memory"); return NULL; }
    c->isa = el_get_isa();
    memcpy(c->traits, el_traits, sizeof(c->traits));
    c->vops = el_vops;
    c->d = *desc;
    const el_model_desc *d = &c->d;
    if (d->n_layer <= 0 || d->n_embd <= 0 || d->n_head <= 0 || d->n_head_kv <= 0 ||
        d->n_head % d->n_head_kv || d->head_dim_k <= 0 || d->head_dim_v <= 0 || (d->n_ff <= 0 && !d->n_expert) ||
        d->n_vocab <= 0 || d->n_rot < 0 || d->n_rot > d->head_dim_k || d->n_rot % 2)
        FAIL("inconsistent hyperparameters");
    if (n_ctx <= 0 || n_batch <= 0) FAIL("n_ctx and n_batch must be positive");
    if (n_batch > n_ctx) n_batch = n_ctx;
    c->ffn_chunk = FFN_CHUNK;
    c->n_ctx = n_ctx;
    c->n_batch = n_batch;
    c->layers = malloc(sizeof(el_layer) * (size_t)d->n_layer);
    if (!c->layers) FAIL("out of memory");
    memcpy(c->layers, desc->layers, sizeof(el_layer) * (size_t)d->n_layer);
    c->d.layers = c->layers;
    /* each layer's own sizes (0: the model's); the widest of them size the scratch */
    int max_qd = 0, max_kd = 0, max_vd = 0, max_od = 0, max_ff = 0, max_rot = 0;
    for (int l = 0; l < d->n_layer; l++) {
        el_layer *L = &c->layers[l];
        if (!L->head_dim_k) L->head_dim_k = d->head_dim_k;
        if (!L->head_dim_v) L->head_dim_v = d->head_dim_v;
        if (!L->n_head_kv) L->n_head_kv = d->n_head_kv;
        if (!L->n_ff) L->n_ff = d->n_ff;
        if (L->n_rot < 0) L->n_rot = d->n_rot;
        if (L->head_dim_k <= 0 || L->head_dim_v <= 0 || L->n_head_kv <= 0 || d->n_head % L->n_head_kv ||
            L->n_rot < 0 || L->n_rot > L->head_dim_k || L->n_rot % 2 || (L->n_ff <= 0 && !d->n_expert))
            FAIL("blk.%d: inconsistent sizes", l);
        if (L->kv_share) {
            const el_layer *S = &c->layers[L->kv_share - 1];
            if (L->kv_share - 1 >= l || S->kv_share || S->is_swa != L->is_swa || S->head_dim_k != L->head_dim_k ||
                S->head_dim_v != L->head_dim_v || S->n_head_kv != L->n_head_kv)
                FAIL("blk.%d: cannot attend to the KV cache of layer %d", l, L->kv_share - 1);
        }
        max_qd = EL_MAX(max_qd, d->n_head * L->head_dim_k);
        max_kd = EL_MAX(max_kd, L->n_head_kv * L->head_dim_k);
        max_vd = EL_MAX(max_vd, L->n_head_kv * L->head_dim_v);
        max_od = EL_MAX(max_od, d->n_head * L->head_dim_v);
        max_ff = EL_MAX(max_ff, L->n_ff);
        max_rot = EL_MAX(max_rot, L->n_rot);
    }
    if (!tensor_ok(c, &d->tok_embd, d->n_embd, d->n_vocab) || !c->traits[d->tok_embd.type].to_float)
        FAIL("token_embd: bad shape or type");
    if (!tensor_ok(c, &d->output, d->n_embd, d->n_vocab)) FAIL("output: bad shape or unsupported type");
    if (!norm_ok(&d->output_norm, d->n_embd)) FAIL("output_norm: bad shape");
    if (!norm_ok(&d->output_bias, d->n_vocab)) FAIL("output.bias: bad shape");
    if (d->attn_temp_scale != 0.0f && d->attn_temp_floor <= 0) FAIL("attention temperature without a floor");
    int any_swa = 0;
    for (int l = 0; l < d->n_layer; l++) {
        const el_layer *L = &c->layers[l];
        const int qd = d->n_head * L->head_dim_k, kd = L->n_head_kv * L->head_dim_k;
        const int vd = L->n_head_kv * L->head_dim_v, od = d->n_head * L->head_dim_v;
        any_swa |= L->is_swa;
        if (L->recurrent) {  /* delta_net.c checks its tensors */
            if (!norm_ok(&L->attn_norm, d->n_embd) || !norm_ok(&L->ffn_norm, d->n_embd))
                FAIL("blk.%d: a norm weight has a bad shape", l);
            if (!tensor_ok(c, &L->w_gate, d->n_embd, L->n_ff) || !tensor_ok(c, &L->w_up, d->n_embd, L->n_ff) ||
                !tensor_ok(c, &L->w_down, L->n_ff, d->n_embd) || d->n_expert)
                FAIL("blk.%d: the FFN has a bad shape or unsupported type", l);
            continue;
        }
        if (L->rope_freqs && d->rope_freqs.data && (d->rope_freqs.type != EL_F32 || d->rope_freqs.ne0 != L->n_rot / 2))
            FAIL("rope_freqs: bad shape");
        const int qw = d->attn_out_gate ? 2 * qd : qd;  /* wq's rows: q, or q and the output gate */
        if (!tensor_ok(c, &L->wq, d->n_embd, qw)) FAIL("blk.%d.attn_q: bad shape or unsupported type", l);
        /* a layer on another's cache needs no k or v; without attn_v the values are the keys */
        if (!L->kv_share && !tensor_ok(c, &L->wk, d->n_embd, kd))
            FAIL("blk.%d.attn_k: bad shape or unsupported type", l);
        if (!L->kv_share && (L->wv.data || L->head_dim_v != L->head_dim_k) && !tensor_ok(c, &L->wv, d->n_embd, vd))
            FAIL("blk.%d.attn_v: bad shape or unsupported type", l);
        if (!tensor_ok(c, &L->wo, od, d->n_embd)) FAIL("blk.%d.attn_output: bad shape or unsupported type", l);
        if (!d->n_expert && !tensor_ok(c, &L->w_gate, d->n_embd, L->n_ff))
            FAIL("blk.%d.ffn_gate: bad shape or unsupported type", l);
        if (!d->n_expert && !tensor_ok(c, &L->w_up, d->n_embd, L->n_ff))
            FAIL("blk.%d.ffn_up: bad shape or unsupported type", l);
        if (!d->n_expert && !tensor_ok(c, &L->w_down, L->n_ff, d->n_embd))
            FAIL("blk.%d.ffn_down: bad shape or unsupported type", l);
        if (!norm_ok(&L->out_scale, 1)) FAIL("blk.%d.layer_output_scale: bad shape", l);
        if (!norm_ok(&L->attn_norm, d->n_embd) || !norm_ok(&L->ffn_norm, d->n_embd) ||
            !norm_ok(&L->attn_post_norm, d->n_embd) || !norm_ok(&L->ffn_post_norm, d->n_embd) ||
            !norm_ok(&L->attn_q_norm, d->qk_norm_all ? qd : L->head_dim_k) ||
            !norm_ok(&L->attn_k_norm, d->qk_norm_all ? kd : L->head_dim_k))
            FAIL("blk.%d: a norm weight has a bad shape", l);
        if (!norm_ok(&L->bq, qw) || !norm_ok(&L->bk, kd) || !norm_ok(&L->bv, vd) || !norm_ok(&L->bo, d->n_embd))
            FAIL("blk.%d: a bias has a bad shape", l);
    }
    if (any_swa && d->n_swa <= 0) FAIL("sliding-window layers without a window size");
    c->few_ok = !d->n_expert && !d->n_embd_per_layer;
    for (int l = 0; l < d->n_layer; l++) c->few_ok &= !c->layers[l].recurrent && !c->layers[l].out_scale.data;
    if (el_kv_init(c, type_k, type_v) != 0)
        FAIL("KV cache types %d / %d: f16, q8_0 or q4_0, quantized ones for head sizes that are multiples of 32 "
             "(these are %d / %d)", type_k, type_v, d->head_dim_k, d->head_dim_v);
    if (el_ple_init(c, last_error, sizeof last_error) != 0) goto fail;

    for (int g = 0; g < 2; g++) {
        c->kv[g].k = calloc((size_t)d->n_layer, sizeof(uint8_t **));
        c->kv[g].v = calloc((size_t)d->n_layer, sizeof(uint8_t **));
        if (!c->kv[g].k || !c->kv[g].v) FAIL("out of memory");
    }

    if (d->n_expert && el_moe_init(c, last_error, sizeof last_error) != 0) goto fail;
    if (el_dn_init(c, last_error, sizeof last_error) != 0) goto fail;
    const int n_ff = EL_MAX(max_ff, d->n_expert ? d->n_ff_shexp : 0);  /* gate / up: the dense or shared FFN */
    int max_k = EL_MAX(EL_MAX(d->n_embd, max_od), EL_MAX(n_ff, d->n_embd_per_layer));
    max_k = EL_MAX(max_k, d->dn_state * d->dn_v_heads);  /* ssm_out's input: a DeltaNet layer's d_inner */
    c->max_k = max_k;
    const size_t B = (size_t)n_batch;
    c->x = amalloc(4 * B * d->n_embd);
    c->tmp = amalloc(4 * B * d->n_embd);
    c->actq = amalloc(B * (size_t)max_k * 4 + 1024);  /* every act type takes <= 4 bytes/value */
    /* the buffers nothing reads after a step, in one block (el_engine_set_scratch): xn, q, kc, vc,
     * gate, up, rope */
    const size_t scr[N_SCRATCH] = {4 * B * EL_MAX(d->n_embd, max_od), 4 * B * max_qd, 4 * B * max_kd,
                                   4 * B * EL_MAX(max_vd, max_kd), 4 * B * n_ff, 4 * B * n_ff,
                                   4 * B * (max_rot ? max_rot : 2)};
    for (int i = 0; i < N_SCRATCH; i++) c->scratch_bytes += c->scr_bytes[i] = (scr[i] + ALIGN - 1) / ALIGN * ALIGN;
    c->own_scratch = amalloc(c->scratch_bytes);
    if (c->own_scratch) place_scratch(c, c->own_scratch);
    step_plan *pl = &c->plan;
    pl->row_slot = amalloc(4 * B);
    pl->seq_row0 = amalloc(4 * B);
    pl->seq_rows = amalloc(4 * B);
    pl->out_row = amalloc(4 * B);
    pl->qb_seq = amalloc(4 * B);
    pl->qb_row0 = amalloc(4 * B);
    pl->qb_rows = amalloc(4 * B);
    if (!c->x || !c->tmp || !c->actq || !c->own_scratch || !pl->row_slot || !pl->seq_row0 || !pl->seq_rows ||
        !pl->out_row || !pl->qb_seq || !pl->qb_row0 || !pl->qb_rows)
        FAIL("out of memory for scratch buffers (n_batch %d)", n_batch);
    if (el_engine_set_threads(c, n_threads, 1) != 0) FAIL("cannot start %d threads", n_threads);
    return c;
fail:
    el_engine_free(c);
    return NULL;
}

int el_engine_isa(const el_engine *c) { return c->isa; }

void el_engine_set_ffn_chunk(el_engine *c, int rows) { c->ffn_chunk = rows > 0 ? rows : 0; }

size_t el_engine_scratch_bytes(const el_engine *c) { return c->scratch_bytes; }

int el_engine_set_scratch(el_engine *c, void *p, size_t n) {
    if (p && (n < c->scratch_bytes || (uintptr_t)p % ALIGN))
        BAD("step scratch: %zu bytes at a multiple of %d needed, got %zu at %p", c->scratch_bytes, ALIGN, n, p);
    place_scratch(c, p ? p : c->own_scratch);
    return 0;
}

int el_engine_has_swa(const el_engine *c) {
    for (int l = 0; l < c->d.n_layer; l++)
        if (c->layers[l].is_swa) return 1;
    return 0;
}

int el_engine_set_threads(el_engine *c, int n_threads, int adaptive) {
    if (n_threads < 1) n_threads = 1;
    if (!c->pool || el_pool_size(c->pool) != n_threads) {
        el_pool_free(c->pool);
        free(c->tmp_k);
        free(c->xp);
        c->pool = el_pool_new(n_threads);
        c->n_threads = n_threads;
        int hmax = 0;
        for (int l = 0; l < c->d.n_layer; l++)
            hmax = EL_MAX(hmax, EL_MAX(c->layers[l].head_dim_k, c->layers[l].head_dim_v));
        c->tmp_k = amalloc(sizeof(el_half) * (size_t)n_threads * hmax);
        c->xp = amalloc(sizeof(float) * (size_t)n_threads * 2 * EL_MAX(1, n_threads - 1) * c->d.n_embd);
        if (!c->pool || !c->tmp_k || !c->xp || el_attention_init(c) != 0) return -1;
    }
    el_pool_set_adaptive(c->pool, adaptive);
    return 0;
}

void el_engine_thread_stats(const el_engine *c, int *active, long long *runs, long long *reduced_runs) {
    el_pool_stats(c->pool, active, runs, reduced_runs);
}

void el_engine_free(el_engine *c) {
    if (!c) return;
    el_pool_free(c->pool);
    if (c->layers) el_kv_free_all(c);
    free(c->x); free(c->tmp); free(c->actq); free(c->own_scratch); free(c->tmp_k); free(c->xp);
    el_attention_free(c);
    el_moe_free(c);
    el_ple_free(c);
    el_dn_free(c);
    free(c->kl); free(c->vl);
    step_plan *pl = &c->plan;
    free(pl->row_slot); free(pl->seq_row0); free(pl->seq_rows); free(pl->out_row);
    free(pl->qb_seq); free(pl->qb_row0); free(pl->qb_rows);
    free(c->layers);
    free(c);
}

/* ------------------------------------------------------------------------------------------ */
/* matmul inside a pool task: y[m, :] = W . x[m, :] for m < M                                   */

/* every barrier of a forward pass goes through here, so act_state knows actq is free again */
static void sync(el_engine *c, act_state *st) {
    el_pool_barrier(c->pool);
    st->in_use = 0;
}

/* values [*v0, *v1) of a row of k: this thread's share of the row's blocks of type t, for a step of
 * fewer rows than threads (each row's blocks shared out) */
static void block_share(const el_type_traits *t, int k, int ith, int nth, int64_t *v0, int64_t *v1) {
    int64_t b0, b1;
    el_split(k / t->blck, ith, nth, EL_MAX(1, 64 / t->blck), &b0, &b1);
    *v0 = b0 * t->blck;
    *v1 = b1 * t->blck;
}

/* this thread's share of the row x (k values) quantized into q (every block is quantized on its own) */
static void quantize_share(const el_type_traits *t, const float *x, uint8_t *q, int k, int ith, int nth) {
    int64_t v0, v1;
    block_share(t, k, ith, nth, &v0, &v1);
    if (v1 > v0) t->from_float(x + v0, q + (size_t)(v0 / t->blck) * t->size, v1 - v0);
}

/* Contents of x must not change between matmuls that share its quantized copy, unless the
 * pointer changes too: callers quantize a buffer, use it, and only then overwrite it. */
static void quantize_acts(el_engine *c, act_state *st, int vdt, const float *x, int m, int k, int ldx,
                          int ith, int nth) {
    if (st->src == x && st->type == vdt && st->m == m && st->k == k) return;
    if (st->in_use) sync(c, st);
    const el_type_traits *t = &c->traits[vdt];
    const size_t rs = el_row_size(vdt, k);
    if (m >= nth)
        for (int r = ith; r < m; r += nth) t->from_float(x + (size_t)r * ldx, c->actq + (size_t)r * rs, k);
    else  /* fewer rows than threads: each row's blocks shared (every block is quantized on its own) */
        for (int r = 0; r < m; r++) quantize_share(t, x + (size_t)r * ldx, c->actq + (size_t)r * rs, k, ith, nth);
    st->src = x; st->type = vdt; st->m = m; st->k = k;
    sync(c, st);
}

static void gemm_with(el_gemm_fn gemm, el_vec_dot_fn vec_dot, int n, const uint8_t *w, size_t ldw, int nr,
                      const uint8_t *a, size_t lda, int nc, float *out, size_t ldo) {
    if (gemm) { gemm(n, w, ldw, nr, a, lda, nc, out, ldo); return; }
    for (int ci = 0; ci < nc; ci++)
        for (int r = 0; r < nr; r++)
            vec_dot(n, out + (size_t)ci * ldo + r, w + (size_t)r * ldw, a + (size_t)ci * lda);
}

/* activation rows [c0, c0 + nc) of a batch of m; with `small` (a llama_order step), the last
 * el_small_rows(m) go through the small-batch kernels, as llama.cpp does; without it, the type's
 * batch-order kernels where it has them */
static void gemm_loop(const el_type_traits *tt, int type, int m, int small, int c0, int n, const uint8_t *w,
                      size_t ldw, int nr, const uint8_t *a, size_t lda, int nc, float *out, size_t ldo) {
    if (!small && tt->vec_dot_batch) {
        gemm_with(tt->gemm_batch, tt->vec_dot_batch, n, w, ldw, nr, a, lda, nc, out, ldo);
        return;
    }
    const int split = small && tt->vec_dot_small ? m - el_small_rows(type, m) : m;
    const int nmain = EL_MAX(0, EL_MIN(nc, split - c0));
    if (nmain) gemm_with(tt->gemm, tt->vec_dot, n, w, ldw, nr, a, lda, nmain, out, ldo);
    if (nmain < nc)
        gemm_with(tt->gemm_small, tt->vec_dot_small, n, w, ldw, nr, a + (size_t)nmain * lda, lda, nc - nmain,
                  out + (size_t)nmain * ldo, ldo);
}

void el_matmul_acts(const el_engine *c, const el_tensor *w, int64_t row0, int64_t nrows, const uint8_t *a,
                    size_t lda, int m, float *y, size_t ldy, int cols, int ith, int nth) {
    const el_type_traits *tt = &c->traits[w->type];
    int64_t r0, r1;
    el_split(nrows, ith, nth, ROW_ALIGN, &r0, &r1);
    const uint8_t *wd = (const uint8_t *)w->data + (size_t)row0 * w->row_bytes;
    if (c->plan.llama_order && el_float_llama_type(w->type)) {  /* float_llama.c */
        if (r1 > r0)
            el_float_llama_gemm(w->type, el_float_llama_tinyblas(nrows, (int)w->ne0, cols), (int)w->ne0,
                                wd + (size_t)r0 * w->row_bytes, w->row_bytes, (int)(r1 - r0), a, lda, m, y + r0, ldy);
        return;
    }
    const int64_t rt = m == 1 ? EL_MAX(1, r1 - r0) : ROW_TILE;
    for (int64_t rb = r0; rb < r1; rb += rt) {
        const int nr = (int)EL_MIN(rt, r1 - rb);
        for (int mb = 0; mb < m; mb += TOK_TILE)
            gemm_loop(tt, w->type, m, c->plan.llama_order, mb, (int)w->ne0, wd + (size_t)rb * w->row_bytes,
                      w->row_bytes, nr, a + (size_t)mb * lda, lda, EL_MIN(TOK_TILE, m - mb), y + (size_t)mb * ldy + rb,
                      ldy);
    }
}

/* no barrier at the end: callers batch independent matmuls (q, k, v) and then barrier once */
static void matmul(el_engine *c, act_state *st, const el_tensor *w, const float *x, int m, int ldx,
                   float *y, int ldy, int ith, int nth) {
    const el_type_traits *tt = &c->traits[w->type];
    const int k = (int)w->ne0, vdt = tt->vec_dot_type;
    quantize_acts(c, st, vdt, x, m, k, ldx, ith, nth);
    st->in_use = 1;
    el_matmul_acts(c, w, 0, w->ne1, c->actq, el_row_size(vdt, k), m, y, (size_t)ldy, st->cols ? st->cols : m, ith,
                   nth);
}

void el_task_matmul(el_engine *c, act_state *st, const el_tensor *w, const float *x, int m, int ldx,
                    float *y, int ldy, int ith, int nth) {
    matmul(c, st, w, x, m, ldx, y, ldy, ith, nth);
}

void el_task_sync(el_engine *c, act_state *st) { sync(c, st); }


/* ------------------------------------------------------------------------------------------ */

/* Before attention, per token: the layer's queries, keys and values made ready head by head.
 * Every operation here is a head's own (biases, per-head norms, RoPE, scales, the Walsh-Hadamard
 * chunks, which divide a head), so the heads can be shared among threads: a step with fewer rows
 * than threads gives each thread a share of units (below), a larger one whole rows. */

/* row m's keys of kv heads [h0, h1): bias, norm, RoPE, rotation, stored in the row's slot (where
 * the layer has no wv, the values are these keys: copied first, as they are; head_dim_v is then
 * head_dim_k, checked at load) */
static void key_heads(el_engine *c, const el_layer *L, int l, int m, int h0, int h1, el_half *h16) {
    const el_model_desc *d = &c->d;
    const int hk = L->head_dim_k, kd = L->n_head_kv * hk, i0 = h0 * hk, i1 = h1 * hk;
    float *k = c->kc + (size_t)m * kd;
    if (!L->wv.data) memcpy(c->vc + (size_t)m * kd + i0, k + i0, sizeof(float) * (size_t)(i1 - i0));
    if (L->bk.data) for (int i = i0; i < i1; i++) k[i] += ((const float *)L->bk.data)[i];
    const int kn = d->qk_norm_all ? kd : hk;  /* one norm per kn values */
    if (L->attn_k_norm.data)
        for (int i = i0; i < i1; i += kn) el_rmsnorm(k + i, k + i, L->attn_k_norm.data, kn, d->norm_eps);
    if (L->n_rot && L->use_rope)
        c->vops.rope(k + i0, h1 - h0, hk, L->n_rot, d->rope_type, c->rope + (size_t)m * L->n_rot);
    if (d->rot_k) el_fwht(k + i0, i1 - i0, d->rot_k);
    const step_plan *pl = &c->plan;
    const int slot = pl->row_slot[m];
    const int blk = seq_table(pl->b, layer_group(c, l), pl->b->seq[m])[slot / KT];
    for (int h = h0; h < h1; h++) el_kv_store(c, l, blk, slot % KT, 0, h, k + (size_t)h * hk, h16);
}

/* row m's values of kv heads [h0, h1): bias, norm, rotation, stored in the row's slot */
static void value_heads(el_engine *c, const el_layer *L, int l, int m, int h0, int h1, el_half *h16) {
    const el_model_desc *d = &c->d;
    const int hv = L->head_dim_v, i0 = h0 * hv, i1 = h1 * hv;
    float *v = c->vc + (size_t)m * L->n_head_kv * hv;
    if (L->bv.data) for (int i = i0; i < i1; i++) v[i] += ((const float *)L->bv.data)[i];
    if (d->v_norm) for (int i = i0; i < i1; i += hv) el_rmsnorm(v + i, v + i, NULL, hv, d->norm_eps);
    if (d->rot_v) el_fwht(v + i0, i1 - i0, d->rot_v);
    const step_plan *pl = &c->plan;
    const int slot = pl->row_slot[m];
    const int blk = seq_table(pl->b, layer_group(c, l), pl->b->seq[m])[slot / KT];
    for (int h = h0; h < h1; h++) el_kv_store(c, l, blk, slot % KT, 1, h, v + (size_t)h * hv, h16);
}

/* row m's queries of heads [h0, h1): bias (or the output gate's split), norm, RoPE, scales,
 * rotation */
static void query_heads(el_engine *c, const el_layer *L, int m, int h0, int h1) {
    const el_model_desc *d = &c->d;
    const int hk = L->head_dim_k, qd = d->n_head * hk, i0 = h0 * hk, i1 = h1 * hk;
    float *q = c->q + (size_t)m * qd;
    if (d->attn_out_gate)  /* q (its bias added) into c->q, the gate kept */
        for (int h = h0; h < h1; h++) el_gate_split(c, L, m, h);
    else if (L->bq.data) for (int i = i0; i < i1; i++) q[i] += ((const float *)L->bq.data)[i];
    const int qn = d->qk_norm_all ? qd : hk;  /* one norm per qn values */
    if (L->attn_q_norm.data)
        for (int i = i0; i < i1; i += qn) el_rmsnorm(q + i, q + i, L->attn_q_norm.data, qn, d->norm_eps);
    if (L->n_rot && L->use_rope)
        c->vops.rope(q + i0, h1 - h0, hk, L->n_rot, d->rope_type, c->rope + (size_t)L->n_rot * m);
    if (d->q_scale != 1.0f) for (int i = i0; i < i1; i++) q[i] *= d->q_scale;
    if (d->attn_temp_scale != 0.0f) {
        /* in double, as llama.cpp's input */
        const float t = (float)(log(floorf((float)c->plan.b->pos[m] / (float)d->attn_temp_floor) + 1.0) *
                                d->attn_temp_scale + 1.0);
        for (int i = i0; i < i1; i++) q[i] *= t;
    }
    if (d->rot_k) el_fwht(q + i0, i1 - i0, d->rot_k);
}

/* The units of that work, in this order: the keys of each kv head (of them all where one norm
 * spans every head, qk_norm_all; with their values where the values are the keys), the values of
 * each kv head, the query heads (all in one unit with qk_norm_all). A layer that reads another's
 * cache has query units only. */
static int head_units(const el_engine *c, const el_layer *L, int *nk, int *nv) {
    const int own_kv = !L->kv_share, all = c->d.qk_norm_all;
    *nk = own_kv ? (all ? 1 : L->n_head_kv) : 0;
    *nv = own_kv && L->wv.data ? L->n_head_kv : 0;
    return *nk + *nv + (all ? 1 : c->d.n_head);
}

static void head_unit(el_engine *c, const el_layer *L, int l, int m, int u, int nk, int nv, el_half *h16) {
    const int all = c->d.qk_norm_all;
    if (u < nk) {
        const int h0 = all ? 0 : u, h1 = all ? L->n_head_kv : u + 1;
        key_heads(c, L, l, m, h0, h1, h16);
        if (!L->wv.data) value_heads(c, L, l, m, h0, h1, h16);
    } else if (u < nk + nv) {
        value_heads(c, L, l, m, u - nk, u - nk + 1, h16);
    } else {
        u -= nk + nv;
        query_heads(c, L, m, all ? 0 : u, all ? c->d.n_head : u + 1);
    }
}

/* a block's input: RMS-normed with w, or as it is where the block has no norm (olmo2) */
static void pre_norm(float *y, const float *x, const float *w, int n, float eps) {
    if (w) el_rmsnorm(y, x, w, n, eps);
    else memcpy(y, x, sizeof(float) * (size_t)n);
}

/* this thread's rows of the step (m = ith, ith + nth, ...) of c->x, pre_norm'ed into y (rows of n_embd) */
static void norm_rows(el_engine *c, float *y, const float *w, int n, int ith, int nth) {
    const int E = c->d.n_embd, rows = ith < n ? (n - ith + nth - 1) / nth : 0;
    const size_t ld = (size_t)nth * E;
    if (w) c->vops.rmsnorm_rows(rows, y + (size_t)ith * E, ld, c->x + (size_t)ith * E, ld, w, E, c->d.norm_eps);
    else
        for (int m = ith; m < n; m += nth) pre_norm(y + (size_t)m * E, c->x + (size_t)m * E, w, E, c->d.norm_eps);
}

static void residual_add(float *x, const float *t, int n, float scale) {
    if (scale == 1.0f) for (int i = 0; i < n; i++) x[i] += t[i];
    else for (int i = 0; i < n; i++) x[i] += t[i] * scale;
}

/* Steps of fewer rows than threads (one-token decode steps), on models of attention and dense FFN
 * layers (few_ok): every thread keeps its own copy of the step's rows of the residual stream
 * (c->xp; each does the same operations on the same numbers, so the copies are equal) and writes
 * its share of it to c->x. A block's input norm then waits for no barrier and no single thread:
 * each thread norms the rows itself, writes its share of them (to c->xn, which no thread reads
 * then) and quantizes that share for the block's matmuls. Where the residual add, the norm and
 * the quantization took a barrier each, they take one; the FFN's activation and the quantization
 * of its output go by the same share of blocks, with none between them. Same operations on the
 * same values: the same bits. */
static float *few_x(const el_engine *c, int ith, int m) {
    return c->xp + ((size_t)(2 * ith) * EL_MAX(1, c->n_threads - 1) + m) * c->d.n_embd;
}
static float *few_buf(const el_engine *c, int ith, int m) {  /* a normed row, or a block's output */
    return c->xp + ((size_t)(2 * ith + 1) * EL_MAX(1, c->n_threads - 1) + m) * c->d.n_embd;
}

/* this thread's share of the row v (n values, its own copy) written to the shared row dst */
static void few_publish(const float *v, float *dst, int n, int ith, int nth) {
    int64_t i0, i1;
    el_split(n, ith, nth, 16, &i0, &i1);
    if (i1 > i0) memcpy(dst + i0, v + i0, sizeof(float) * (size_t)(i1 - i0));
}

/* the input of weight w's matmul: each row m of the residual stream with out[m] >= 0 (out NULL: every
 * row, to row m) normed with nw (pre_norm; rms: el_rmsnorm, also without a weight), its share
 * written to row out[m] of dst and quantized into actq. The caller then syncs. */
static void few_norm_quant(el_engine *c, act_state *st, const el_tensor *w, const float *nw, int rms,
                           const int32_t *out, int n, float *dst, int ith, int nth) {
    const int E = c->d.n_embd, vdt = c->traits[w->type].vec_dot_type;
    const el_type_traits *t = &c->traits[vdt];
    const size_t rs = el_row_size(vdt, E);
    if (st->in_use) sync(c, st);
    int rows = 0;
    for (int m = 0; m < n; m++) {
        const int j = out ? out[m] : m;
        if (j < 0) continue;
        float *y = few_buf(c, ith, m);
        if (rms) el_rmsnorm(y, few_x(c, ith, m), nw, E, c->d.norm_eps);
        else pre_norm(y, few_x(c, ith, m), nw, E, c->d.norm_eps);
        few_publish(y, dst + (size_t)j * E, E, ith, nth);
        quantize_share(t, y, c->actq + (size_t)j * rs, E, ith, nth);
        rows = EL_MAX(rows, j + 1);
    }
    st->src = dst; st->type = vdt; st->m = rows; st->k = E;
}

/* a block's output row t onto its residual row xr: bias (or NULL), post-norm, residual add; t is
 * changed */
static void block_residual(const el_engine *c, float *t, float *xr, const el_tensor *bias, const el_tensor *post_norm) {
    const el_model_desc *d = &c->d;
    const int E = d->n_embd;
    if (bias && bias->data) for (int i = 0; i < E; i++) t[i] += ((const float *)bias->data)[i];
    if (post_norm->data) el_rmsnorm(t, t, post_norm->data, E, d->norm_eps);
    residual_add(xr, t, E, d->residual_scale);
}

/* a block's output rows (c->tmp) onto this thread's residual stream (block_residual on a copy);
 * its share written to c->x */
static void few_residual(el_engine *c, const el_tensor *bias, const el_tensor *post_norm, int n, int ith, int nth) {
    const int E = c->d.n_embd;
    for (int m = 0; m < n; m++) {
        float *t = few_buf(c, ith, m), *xr = few_x(c, ith, m);
        memcpy(t, c->tmp + (size_t)m * E, sizeof(float) * (size_t)E);
        block_residual(c, t, xr, bias, post_norm);
        few_publish(xr, c->x + (size_t)m * E, E, ith, nth);
    }
}

/* A batch-order step's rows go through in chunks of c->ffn_chunk, using the first rows of c->gate
 * and c->up: a row's numbers do not depend on the rows beside it in a batch-order matmul, nor in
 * the activation, so chunks give the whole step's bits. llama_order steps go whole (llama.cpp's
 * small-batch kernels depend on a matmul's row count), and so do traced ones (their intermediates
 * are reported for every row). `out` may be c->tmp: a chunk's output rows are its input rows,
 * quantized before they are overwritten. */
static void activation(el_engine *c, int act, int64_t n, float *gate, const float *up) {
    if (act == EL_ACT_GELU_TANH) el_geglu(&c->vops, n, gate, up);
    else c->vops.silu_mul(n, gate, up);
}

/* el_gated_ffn of the rows `in` (E apart); few: a few-rows step (its input already quantized for
 * w_gate), whose activation and w_down's quantization go by blocks */
static void gated_ffn(el_engine *c, act_state *st, int l, const el_tensor *w_gate, const el_tensor *w_up,
                      const el_tensor *w_down, int n_ff, int act, const float *in, float *out, int few, int ith,
                      int nth) {
    const int n = c->plan.n, E = c->d.n_embd;
    const int chunk = c->plan.llama_order || trace_fn || !c->ffn_chunk ? n : c->ffn_chunk;
    for (int r0 = 0; r0 < n; r0 += chunk) {
        const int m = EL_MIN(chunk, n - r0);
        matmul(c, st, w_gate, in + (size_t)r0 * E, m, E, c->gate, n_ff, ith, nth);
        matmul(c, st, w_up, in + (size_t)r0 * E, m, E, c->up, n_ff, ith, nth);
        sync(c, st);
        TRACE("ffn_gate", l, c->gate, m, n_ff, n_ff);
        TRACE("ffn_up", l, c->up, m, n_ff, n_ff);
        if (few) {  /* this thread's blocks of each row: activation, then quantized for w_down */
            const int vdt = c->traits[w_down->type].vec_dot_type;
            const el_type_traits *t = &c->traits[vdt];
            const size_t rs = el_row_size(vdt, n_ff);
            int64_t v0, v1;
            block_share(t, n_ff, ith, nth, &v0, &v1);
            for (int r = 0; r < m && v1 > v0; r++) {
                float *g = c->gate + (size_t)r * n_ff;
                activation(c, act, v1 - v0, g + v0, c->up + (size_t)r * n_ff + v0);
                quantize_share(t, g, c->actq + (size_t)r * rs, n_ff, ith, nth);
            }
            st->src = c->gate; st->type = vdt; st->m = m; st->k = n_ff;
        } else {
            int64_t r0e, r1e;
            el_split((int64_t)m * n_ff, ith, nth, 64, &r0e, &r1e);
            activation(c, act, r1e - r0e, c->gate + r0e, c->up + r0e);
        }
        sync(c, st);
        TRACE("ffn_act", l, c->gate, m, n_ff, n_ff);
        matmul(c, st, w_down, c->gate, m, n_ff, out + (size_t)r0 * E, E, ith, nth);
        sync(c, st);
    }
}

void el_gated_ffn(el_engine *c, act_state *st, int l, const el_tensor *w_gate, const el_tensor *w_up,
                  const el_tensor *w_down, int n_ff, int act, float *out, int ith, int nth) {
    gated_ffn(c, st, l, w_gate, w_up, w_down, n_ff, act, c->tmp, out, 0, ith, nth);
}

static void output_rows(el_engine *c, act_state *st, int j0, int nj, float *out, int few, int ith, int nth);

static void forward_task(void *arg, int ith, int nth) {
    el_engine *c = arg;
    const step_plan *pl = &c->plan;
    const el_batch *b = pl->b;
    const el_model_desc *d = &c->d;
    const int n = pl->n;
    const int E = d->n_embd;
    act_state st = {0};
    const int few = n < nth && c->few_ok && !trace_fn;  /* the few-rows path (few_x) */

    /* token embeddings (few: every row on every thread, into its own copy) */
    for (int m = few ? 0 : ith; m < n; m += few ? 1 : nth) {
        const el_tensor *te = &d->tok_embd;
        float *xr = few ? few_x(c, ith, m) : c->x + (size_t)m * E;
        c->traits[te->type].to_float((const uint8_t *)te->data + (size_t)b->token[m] * te->row_bytes, xr, E);
        if (d->embd_scale != 1.0f) for (int i = 0; i < E; i++) xr[i] *= d->embd_scale;
        if (few) few_publish(xr, c->x + (size_t)m * E, E, ith, nth);
    }
    if (!few) sync(c, &st);
    if (d->n_embd_per_layer) el_ple_inputs(c, &st, ith, nth);

    float rope_base = -1, rope_scale = -1;
    int rope_n = -1;
    const float *rope_ff = NULL;
    for (int l = 0; l < d->n_layer; l++) {
        const el_layer *L = &c->layers[l];
        const int hk = L->head_dim_k, hv = L->head_dim_v, n_rot = L->n_rot, own_kv = !L->kv_share;
        const int qd = d->n_head * hk, kd = L->n_head_kv * hk, vd = L->n_head_kv * hv, od = d->n_head * hv;
        const float *ff = L->rope_freqs ? d->rope_freqs.data : NULL;
        /* attention block; its input in (few: normed and quantized for wq by every thread) */
        float *in = few ? c->xn : c->tmp;
        if (few) few_norm_quant(c, &st, &L->wq, L->attn_norm.data, 0, NULL, n, in, ith, nth);
        else
            norm_rows(c, in, L->attn_norm.data, n, ith, nth);
        if (n_rot && (L->rope_base != rope_base || L->rope_scale != rope_scale || n_rot != rope_n || ff != rope_ff)) {
            rope_base = L->rope_base; rope_scale = L->rope_scale; rope_n = n_rot; rope_ff = ff;
            /* rows dealt from the last thread, so a one-row step's pre-norm and cos/sin go to two */
            for (int m = nth - 1 - ith; m < n; m += nth)
                el_rope_cache(c->rope + (size_t)m * n_rot, n_rot, (float)b->pos[m], rope_base, rope_scale, ff, d);
        }
        sync(c, &st);
        TRACE("attn_norm", l, c->tmp, n, E, E);
        if (L->recurrent) {  /* a gated DeltaNet layer in place of attention (delta_net.c) */
            el_delta_net(c, &st, l, ith, nth);
            goto ffn;
        }
        if (d->attn_out_gate) matmul(c, &st, &L->wq, in, n, E, el_gate_q(c), 2 * qd, ith, nth);
        else matmul(c, &st, &L->wq, in, n, E, c->q, qd, ith, nth);
        if (own_kv) matmul(c, &st, &L->wk, in, n, E, c->kc, kd, ith, nth);
        if (own_kv && L->wv.data) matmul(c, &st, &L->wv, in, n, E, c->vc, vd, ith, nth);
        sync(c, &st);
        st.src = NULL;  /* attention writes c->xn, the few-rows path's input: no longer in actq */
        TRACE("q_mm", l, c->q, n, qd, qd);
        TRACE("k_mm", l, c->kc, n, kd, kd);
        TRACE("v_mm", l, c->vc, n, vd, vd);
        /* per token: biases, q/k norms, rope, store k and v, by rows or (fewer rows than threads)
         * by units of heads */
        {
            el_half *h16 = c->tmp_k + (size_t)ith * EL_MAX(hk, hv);
            int nk, nv;
            const int nu = head_units(c, L, &nk, &nv);
            if (n >= nth)
                for (int m = ith; m < n; m += nth)
                    for (int u = 0; u < nu; u++) head_unit(c, L, l, m, u, nk, nv, h16);
            else
                for (int j = ith; j < n * nu; j += nth) head_unit(c, L, l, j / nu, j % nu, nk, nv, h16);
        }
        sync(c, &st);
        TRACE("Qcur", l, c->q, n, qd, qd);
        TRACE("Kcur", l, c->kc, n, kd, kd);
        el_attention(c, l, ith, nth);
        sync(c, &st);
        if (d->rot_v) {  /* the values were stored rotated: rotate their mix back (by chunks where
                            the rows are fewer than the threads: each chunk is its own) */
            if (n >= nth)
                for (int m = ith; m < n; m += nth) el_fwht(c->xn + (size_t)m * od, od, d->rot_v);
            else
                for (int m = 0; m < n; m++) {
                    int64_t c0, c1;
                    el_split(od / d->rot_v, ith, nth, 1, &c0, &c1);
                    el_fwht(c->xn + (size_t)m * od + c0 * d->rot_v, (int)(c1 - c0) * d->rot_v, d->rot_v);
                }
            sync(c, &st);
        }
        if (d->attn_out_gate) {
            el_gate_apply(c, ith, nth);
            sync(c, &st);
        }
        TRACE("kqv_out", l, c->xn, n, od, od);
        matmul(c, &st, &L->wo, c->xn, n, od, c->tmp, E, ith, nth);
        sync(c, &st);
        TRACE("attn_out", l, c->tmp, n, E, E);
    ffn:
        if (few) {  /* the FFN's input into c->xn, quantized for w_gate */
            few_residual(c, &L->bo, &L->attn_post_norm, n, ith, nth);
            few_norm_quant(c, &st, &L->w_gate, L->ffn_norm.data, 0, NULL, n, c->xn, ith, nth);
        } else {
            for (int m = ith; m < n; m += nth)
                block_residual(c, c->tmp + (size_t)m * E, c->x + (size_t)m * E, &L->bo, &L->attn_post_norm);
            norm_rows(c, c->tmp, L->ffn_norm.data, n, ith, nth);
        }
        sync(c, &st);
        TRACE("ffn_inp", l, c->x, n, E, E);
        TRACE("ffn_norm", l, c->tmp, n, E, E);
        /* feed-forward block: c->tmp <- its output. llama.cpp's last layer keeps only the rows
         * that want logits before it, so its matmuls see that many columns (their order) */
        if (b->llama_order && l == d->n_layer - 1 && pl->n_out) st.cols = pl->n_out;
        if (d->n_expert) el_moe_ffn(c, &st, l, ith, nth);
        else gated_ffn(c, &st, l, &L->w_gate, &L->w_up, &L->w_down, L->n_ff, d->act, few ? c->xn : c->tmp, c->tmp, few,
                       ith, nth);
        st.cols = 0;
        TRACE("ffn_out", l, c->tmp, n, E, E);
        if (few) {  /* onto this thread's copy: the next norm needs no barrier */
            few_residual(c, NULL, &L->ffn_post_norm, n, ith, nth);
            continue;
        }
        for (int m = ith; m < n; m += nth)
            block_residual(c, c->tmp + (size_t)m * E, c->x + (size_t)m * E, NULL, &L->ffn_post_norm);
        sync(c, &st);
        if (d->n_embd_per_layer || L->out_scale.data) el_layer_end(c, &st, l, ith, nth);
        TRACE("l_out", l, c->x, n, E, E);
    }
    if (pl->n_out && pl->logits) output_rows(c, &st, 0, pl->n_out, pl->logits, few, ith, nth);
}

/* Logits rows [j0, j0 + nj) of the step (the rows that want logits, in order): final norm of
 * their hidden states in c->x, then the output projection into out [nj, n_vocab]. Every row's
 * numbers are the same whichever rows are made together, but on llama_order steps (which make
 * them all at once). */
static void output_rows(el_engine *c, act_state *st, int j0, int nj, float *out, int few, int ith, int nth) {
    const step_plan *pl = &c->plan;
    const el_model_desc *d = &c->d;
    const int n = pl->n, E = d->n_embd;
    float *in = few ? c->xn : c->tmp;  /* few: the rows of this thread's copy (all of them: j0 = 0) */
    if (few) few_norm_quant(c, st, &d->output, d->output_norm.data, 1, pl->out_row, n, in, ith, nth);
    else
        for (int m = ith; m < n; m += nth) {
            const int j = pl->out_row[m];
            if (j >= j0 && j < j0 + nj)
                el_rmsnorm(in + (size_t)(j - j0) * E, c->x + (size_t)m * E, d->output_norm.data, E, d->norm_eps);
        }
    sync(c, st);
    TRACE("result_norm", -1, in, nj, E, E);
    matmul(c, st, &d->output, in, nj, E, out, d->n_vocab, ith, nth);
    sync(c, st);
    if (d->output_bias.data || d->logit_scale != 1.0f || d->final_softcap > 0) {
        int64_t r0, r1;
        el_split((int64_t)nj * d->n_vocab, ith, nth, 64, &r0, &r1);
        const float cap = d->final_softcap, uncap = cap > 0 ? 1.0f / cap : 0.0f, *ob = d->output_bias.data;
        for (int64_t i = r0; i < r1; i++) {
            float z = out[i];
            if (ob) z += ob[i % d->n_vocab];
            z *= d->logit_scale;
            /* as llama.cpp's graph: scaled by the float 1 / cap, tanh, scaled by cap */
            out[i] = cap > 0 ? tanhf(z * uncap) * cap : z;
        }
    }
}

static void logits_task(void *arg, int ith, int nth) {
    el_engine *c = arg;
    act_state st = {0};
    output_rows(c, &st, c->plan.lg_row0, c->plan.lg_rows, c->plan.lg_out, 0, ith, nth);
}

/* Rows [*r0, *r1) of run k of a sequence of `rows` rows cut into `runs`: runs of QB rows and the
 * rest last when that is the fewest runs, else runs of sizes as even as can be (plan_runs) */
static void run_rows(int rows, int runs, int k, int *r0, int *r1) {
    if (runs == (rows + QB - 1) / QB) {
        *r0 = k * QB;
        *r1 = EL_MIN(rows, *r0 + QB);
    } else {
        *r0 = rows * k / runs;
        *r1 = rows * (k + 1) / runs;
    }
}

/* The most time any of nth threads spends on the attention jobs of runs[] (runs of rows per sequence)
 * when each takes the next job as it comes free (attention.c's counter, jobs run by run and kv head
 * in turn): a job of a run of r rows of a sequence of n slots costs (r + 1) n - its rows' scores and
 * p.v, and reading the keys and values once. */
static double runs_makespan(const el_batch *b, const step_plan *pl, const int *runs, int n_kv, int nth) {
    double t[nth], most = 0;
    for (int i = 0; i < nth; i++) t[i] = 0;
    for (int s = 0; s < b->n_seqs; s++)
        for (int k = 0; k < runs[s]; k++) {
            int r0, r1;
            run_rows(pl->seq_rows[s], runs[s], k, &r0, &r1);
            const double cost = (double)(r1 - r0 + 1) * (b->seq_len[s] + pl->seq_rows[s]);
            for (int h = 0; h < n_kv; h++) {
                int i = 0;
                for (int j = 1; j < nth; j++) i = t[j] < t[i] ? j : i;
                t[i] += cost;
                most = EL_MAX(most, t[i]);
            }
        }
    return most;
}

/* Attention's jobs (attention.c): each sequence's rows in runs of at most QB rows, times the kv
 * heads. A step too large to split its keys across the threads (n n_kv > nth QB) but of few jobs
 * cuts a sequence into more runs (of even sizes) where that evens out the threads' shares by a
 * tenth or more: 8 rows of SmolLM2 (3 kv heads) on 2 threads as two runs of 4, six jobs rather than
 * three. Otherwise the runs stay QB rows and the rest, the cheaper per row (more queries per key
 * and value read and converted: 9 rows as 5 + 4 measured slower than 8 + 1). The grouping changes
 * no bit: a row's scores and p.v do not depend on the rows it is run with. */
static void plan_runs(el_engine *c, const el_batch *b) {
    step_plan *pl = &c->plan;
    const int nth = c->n_threads;
    int n_kv = 1, runs[b->n_seqs], jobs = 0;
    for (int l = 0; l < c->d.n_layer; l++) n_kv = EL_MAX(n_kv, c->layers[l].n_head_kv);
    for (int s = 0; s < b->n_seqs; s++) jobs += runs[s] = (pl->seq_rows[s] + QB - 1) / QB;
    jobs *= n_kv;
    if (nth > 1 && pl->n * n_kv > nth * QB && jobs < 8 * nth) {
        double t = runs_makespan(b, pl, runs, n_kv, nth);
        for (int it = 0; it < 16; it++) {  /* one more run for the sequence of the largest runs, while it pays */
            int w = -1;
            for (int s = 0; s < b->n_seqs; s++)
                if (pl->seq_rows[s] >= 2 * (runs[s] + 1) &&
                    (w < 0 || pl->seq_rows[s] * runs[w] > pl->seq_rows[w] * runs[s])) w = s;
            if (w < 0) break;
            runs[w]++;
            const double u = runs_makespan(b, pl, runs, n_kv, nth);
            if (u > 0.9 * t) {
                runs[w]--;
                break;
            }
            t = u;
        }
    }
    pl->n_qb = 0;
    for (int s = 0; s < b->n_seqs; s++)
        for (int k = 0; k < runs[s]; k++) {
            int r0, r1;
            run_rows(pl->seq_rows[s], runs[s], k, &r0, &r1);
            pl->qb_seq[pl->n_qb] = s;
            pl->qb_row0[pl->n_qb] = pl->seq_row0[s] + r0;
            pl->qb_rows[pl->n_qb] = r1 - r0;
            pl->n_qb++;
        }
}

int el_engine_attention_runs(const el_engine *e) { return e->plan.n_qb; }

/* Check a batch and derive the step plan (rows per sequence, slots, work items, logits rows). */
static int plan_step(el_engine *c, const el_batch *b, float *logits) {
    step_plan *pl = &c->plan;
    const el_model_desc *d = &c->d;
    const int n = b->n_tokens, has_swa = el_engine_has_swa(c);
    if (n <= 0 || n > c->n_batch) BAD("a batch holds 1 to %d tokens, not %d", c->n_batch, n);
    if (!b->token || !b->pos || !b->seq || !b->seq_len || !b->tables) BAD("a batch array is missing");
    if (b->n_seqs <= 0 || b->n_seqs > n) BAD("n_seqs %d does not fit %d tokens", b->n_seqs, n);
    if (b->max_blocks <= 0 || b->max_blocks > (c->n_ctx + KT - 1) / KT + 1) BAD("max_blocks %d", b->max_blocks);
    if (b->llama_order && b->n_seqs != 1) BAD("llama_order batches hold one sequence");
    pl->pending = 0;
    pl->b = b;
    pl->n = n;
    pl->llama_order = b->llama_order;
    pl->logits = logits;
    for (int s = 0; s < b->n_seqs; s++) pl->seq_rows[s] = 0;
    int prev = -1;
    for (int m = 0; m < n; m++) {
        const int s = b->seq[m];
        if (b->token[m] < 0 || b->token[m] >= d->n_vocab) BAD("token id %d is outside [0, %d)", b->token[m], d->n_vocab);
        if (s < prev || s >= b->n_seqs || (s > prev && s != prev + 1)) BAD("row %d: sequence %d out of order", m, s);
        if (b->pos[m] < 0) BAD("row %d: negative position", m);
        if (s != prev) { pl->seq_row0[s] = m; prev = s; }
        pl->row_slot[m] = b->seq_len[s] + pl->seq_rows[s]++;
    }
    if (prev != b->n_seqs - 1) BAD("only %d of %d sequences have rows", prev + 1, b->n_seqs);
    for (int s = 0; s < b->n_seqs; s++) {
        const int len = b->seq_len[s], end = len + pl->seq_rows[s];
        if (len < 0 || end > c->n_ctx) BAD("sequence %d: %d slots exceed the context of %d", s, end, c->n_ctx);
        if ((end + KT - 1) / KT > b->max_blocks) BAD("sequence %d: block table too short", s);
        for (int g = 0; g < 2; g++) {
            if (g == G_SWA && !has_swa) continue;
            const int32_t *t = seq_table(b, g, s);
            /* global layers read every slot; sliding-window ones the window before the first row */
            const int from = g == G_GLOBAL ? 0 : EL_MAX(0, len - d->n_swa);
            for (int i = from / KT; i < (end + KT - 1) / KT; i++)
                if (t[i] < 0 || t[i] >= c->kv[g].n_blocks) BAD("sequence %d: block %d of group %d is %d", s, i, g, t[i]);
        }
    }
    plan_runs(c, b);
    if (el_dn_check_batch(c, b, last_error, sizeof last_error) != 0) return -2;
    pl->n_out = 0;
    for (int m = 0; m < n; m++)
        pl->out_row[m] = (b->logits ? b->logits[m] != 0 : m == n - 1) ? pl->n_out++ : -1;
    return 0;
}

int el_engine_decode(el_engine *c, const el_batch *b, float *logits) {
    const int rc = plan_step(c, b, logits);
    if (rc) return rc;
    /* the positions the new slots hold (read by attention's masks) */
    for (int m = 0; m < b->n_tokens; m++) {
        const int slot = c->plan.row_slot[m];
        for (int g = 0; g < 2; g++) {
            if (g == G_SWA && !el_engine_has_swa(c)) continue;
            kv_pos(c, g, seq_table(b, g, b->seq[m])[slot / KT])[slot % KT] = b->pos[m];
        }
    }
    if (el_attention_plan(c) != 0) {
        c->plan.b = NULL;
        BAD("out of memory for the attention plan");
    }
    el_pool_run(c->pool, forward_task, c);
    c->plan.b = NULL;
    c->plan.pending = !logits && c->plan.n_out > 0;
    return 0;
}

int el_engine_logits(el_engine *c, int row0, int n_rows, float *out) {
    step_plan *pl = &c->plan;
    if (!pl->pending) BAD("no step's logits are waiting (decode with logits NULL first)");
    if (!out || row0 < 0 || n_rows <= 0 || row0 + n_rows > pl->n_out)
        BAD("logits rows [%d, %d) are not within the step's %d", row0, row0 + n_rows, pl->n_out);
    if (pl->llama_order && (row0 || n_rows != pl->n_out)) BAD("a llama_order step makes its logits rows all at once");
    pl->lg_row0 = row0;
    pl->lg_rows = n_rows;
    pl->lg_out = out;
    el_pool_run(c->pool, logits_task, c);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */

typedef struct {
    const el_tensor *w;
    const float *x;
    int m;
    float *y;
    uint8_t *actq;
    el_pool *pool;
    int llama_order;
} mm_args;

static void mm_task(void *arg, int ith, int nth) {
    mm_args *a = arg;
    const el_tensor *w = a->w;
    const el_type_traits *tt = &el_traits[w->type];
    const int k = (int)w->ne0, vdt = tt->vec_dot_type;
    const size_t rs = el_row_size(vdt, k);
    for (int r = ith; r < a->m; r += nth) el_traits[vdt].from_float(a->x + (size_t)r * k, a->actq + r * rs, k);
    el_pool_barrier(a->pool);
    int64_t r0, r1;
    el_split(w->ne1, ith, nth, ROW_ALIGN, &r0, &r1);
    for (int64_t rb = r0; rb < r1; rb += ROW_TILE) {
        const int nr = (int)EL_MIN(ROW_TILE, r1 - rb);
        for (int mb = 0; mb < a->m; mb += TOK_TILE)
            gemm_loop(tt, w->type, a->m, a->llama_order, mb, k, (const uint8_t *)w->data + (size_t)rb * w->row_bytes, w->row_bytes, nr,
                      a->actq + (size_t)mb * rs, rs, EL_MIN(TOK_TILE, a->m - mb), a->y + (size_t)mb * w->ne1 + rb,
                      (size_t)w->ne1);
    }
}

int el_matmul(const el_tensor *w, const float *x, int m, float *y, int n_threads) {
    return el_matmul_order(w, x, m, y, n_threads, 1);
}

int el_matmul_order(const el_tensor *w, const float *x, int m, float *y, int n_threads, int llama_order) {
    el_get_isa();
    if (w->type < 0 || w->type >= EL_NTYPES || !el_traits[w->type].vec_dot) return -2;
    if (w->ne0 % el_traits[w->type].blck) return -2;
    mm_args a = {w, x, m, y, amalloc((size_t)m * w->ne0 * 4 + 1024), el_pool_new(n_threads), llama_order};
    if (!a.actq || !a.pool) { free(a.actq); el_pool_free(a.pool); return -3; }
    el_pool_run(a.pool, mm_task, &a);
    free(a.actq);
    el_pool_free(a.pool);
    return 0;
}
