/* The forward pass of a decoder-only transformer (llama / gemma3 family) over GGUF weights.
 *
 * One el_decode call evaluates a batch of tokens: every pool thread runs `forward_task`, which
 * walks the layers; phases are split by rows (or attention heads) across threads and separated
 * by barriers. Activations are quantized once per matmul input into the weight's vec_dot type.
 *
 * KV cache: per layer, f16 K and V in tiles of KT slots, [n_head_kv][slot / KT][head_dim][KT]. Global layers use
 * slot == position (capacity n_ctx); sliding-window layers use a ring, slot == position % cap,
 * cap = n_swa + n_batch, so a batch never overwrites a key that one of its tokens still sees.
 * Each group keeps the position held by every slot (-1 = empty); attention masks by position.
 */
#include <stdlib.h>
#include <stdio.h>
#include <stdatomic.h>
#include "el_internal.h"

#define ALIGN 64
#define ROW_ALIGN 16  /* thread row ranges start at multiples of this */
#define ROW_TILE 256  /* weight rows per gemm call in prefill (decode: a thread's whole range) */
#define TOK_TILE 32   /* activation rows per gemm call */
#define QB 8          /* queries per attention work item */
#define KT 16         /* slots per attention tile (and per K / V storage tile) */
static inline int k_cap(int cap) { return (cap + KT - 1) / KT * KT; }
/* attention scratch per thread, in floats: queries, score tile, one row, p.v lanes (x4 for decode) */
#define ATT_SCRATCH(hk, hv) ((size_t)QB * (hk) + QB * KT + (size_t)EL_MAX(hk, hv) + 4 * (size_t)(hv) * KT)

enum { G_GLOBAL = 0, G_SWA = 1 };

typedef struct {
    int cap;
    int32_t *pos;   /* [cap] position held, -1 empty */
} kv_group;

struct el_ctx {
    el_type_traits traits[EL_NTYPES];  /* the kernels of the ISA chosen when the context was made */
    el_vec_ops vops;
    int isa;
    el_model_desc d;
    el_layer *layers;
    int n_ctx, n_batch, n_threads;
    el_pool *pool;
    kv_group g[2];
    el_half **k, **v;   /* per layer [n_head_kv][cap / KT][head_dim][KT] */
    int next_pos;
    int max_k;          /* widest matmul input */
    /* scratch, n_batch rows each */
    float *x;      /* [n_batch, n_embd] residual stream */
    float *xn;     /* [n_batch, max(n_embd, q_dim)] normed input / attention output */
    float *q;      /* [n_batch, n_head * head_dim_k] */
    float *kc;     /* [n_batch, n_head_kv * head_dim_k] */
    float *vc;     /* [n_batch, n_head_kv * head_dim_v] */
    float *tmp;    /* [n_batch, n_embd] */
    float *gate;   /* [n_batch, n_ff] */
    float *up;     /* [n_batch, n_ff] */
    uint8_t *actq; /* quantized activations, n_batch rows of up to max_k values */
    float *rope;   /* [n_batch, n_rot] cos/sin per token for the current rope parameters */
    float *scores; /* [n_threads, max cap] */
    float *qround; /* per thread: rounded queries, a key tile and a score tile (attention()) */
    el_half *tmp_k; /* per thread: one key or value row in f16 */
    int32_t *tok;  /* [n_batch] */
};

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
#define FAIL(...) do { snprintf(last_error, sizeof last_error, __VA_ARGS__); goto fail; } while (0)

static void *amalloc(size_t n) {
    void *p = NULL;
    if (n == 0) n = ALIGN;
    if (posix_memalign(&p, ALIGN, (n + ALIGN - 1) / ALIGN * ALIGN) != 0) return NULL;
    return p;
}

static int tensor_ok(const el_ctx *c, const el_tensor *t, int64_t ne0, int64_t ne1) {
    if (!t->data) return 0;
    if (t->type < 0 || t->type >= EL_NTYPES || c->traits[t->type].blck == 0) return 0;
    if (c->traits[t->type].vec_dot == NULL) return 0;
    if (t->ne0 != ne0 || (ne1 >= 0 && t->ne1 != ne1)) return 0;
    return t->ne0 % c->traits[t->type].blck == 0 && t->row_bytes == el_row_size(t->type, t->ne0);
}

static int norm_ok(const el_tensor *t, int64_t n) {
    return !t->data || (t->type == EL_F32 && t->ne0 == n && t->ne1 == 1);
}

el_ctx *el_ctx_new(const el_model_desc *desc, int n_ctx, int n_batch, int n_threads) {
    el_ctx *c = calloc(1, sizeof(el_ctx));
    if (!c) { snprintf(last_error, sizeof last_error, "out of memory"); return NULL; }
    c->isa = el_get_isa();
    memcpy(c->traits, el_traits, sizeof(c->traits));
    c->vops = el_vops;
    c->d = *desc;
    const el_model_desc *d = &c->d;
    if (d->n_layer <= 0 || d->n_embd <= 0 || d->n_head <= 0 || d->n_head_kv <= 0 ||
        d->n_head % d->n_head_kv || d->head_dim_k <= 0 || d->head_dim_v <= 0 || d->n_ff <= 0 ||
        d->n_vocab <= 0 || d->n_rot < 0 || d->n_rot > d->head_dim_k || d->n_rot % 2)
        FAIL("inconsistent hyperparameters");
    if (n_ctx <= 0 || n_batch <= 0) FAIL("n_ctx and n_batch must be positive");
    if (n_batch > n_ctx) n_batch = n_ctx;
    c->n_ctx = n_ctx;
    c->n_batch = n_batch;
    c->layers = malloc(sizeof(el_layer) * (size_t)d->n_layer);
    if (!c->layers) FAIL("out of memory");
    memcpy(c->layers, desc->layers, sizeof(el_layer) * (size_t)d->n_layer);
    c->d.layers = c->layers;

    const int qd = d->n_head * d->head_dim_k, kd = d->n_head_kv * d->head_dim_k;
    const int vd = d->n_head_kv * d->head_dim_v, od = d->n_head * d->head_dim_v;
    if (!tensor_ok(c, &d->tok_embd, d->n_embd, d->n_vocab) || !c->traits[d->tok_embd.type].to_float)
        FAIL("token_embd: bad shape or type");
    if (!tensor_ok(c, &d->output, d->n_embd, d->n_vocab)) FAIL("output: bad shape or unsupported type");
    if (!norm_ok(&d->output_norm, d->n_embd)) FAIL("output_norm: bad shape");
    if (d->rope_freqs.data && (d->rope_freqs.type != EL_F32 || d->rope_freqs.ne0 != d->n_rot / 2))
        FAIL("rope_freqs: bad shape");
    int any_swa = 0;
    for (int l = 0; l < d->n_layer; l++) {
        const el_layer *L = &c->layers[l];
        any_swa |= L->is_swa;
        if (!tensor_ok(c, &L->wq, d->n_embd, qd)) FAIL("blk.%d.attn_q: bad shape or unsupported type", l);
        if (!tensor_ok(c, &L->wk, d->n_embd, kd)) FAIL("blk.%d.attn_k: bad shape or unsupported type", l);
        if (!tensor_ok(c, &L->wv, d->n_embd, vd)) FAIL("blk.%d.attn_v: bad shape or unsupported type", l);
        if (!tensor_ok(c, &L->wo, od, d->n_embd)) FAIL("blk.%d.attn_output: bad shape or unsupported type", l);
        if (!tensor_ok(c, &L->w_gate, d->n_embd, d->n_ff)) FAIL("blk.%d.ffn_gate: bad shape or unsupported type", l);
        if (!tensor_ok(c, &L->w_up, d->n_embd, d->n_ff)) FAIL("blk.%d.ffn_up: bad shape or unsupported type", l);
        if (!tensor_ok(c, &L->w_down, d->n_ff, d->n_embd)) FAIL("blk.%d.ffn_down: bad shape or unsupported type", l);
        if (!norm_ok(&L->attn_norm, d->n_embd) || !norm_ok(&L->ffn_norm, d->n_embd) ||
            !norm_ok(&L->attn_post_norm, d->n_embd) || !norm_ok(&L->ffn_post_norm, d->n_embd) ||
            !norm_ok(&L->attn_q_norm, d->head_dim_k) || !norm_ok(&L->attn_k_norm, d->head_dim_k))
            FAIL("blk.%d: a norm weight has a bad shape", l);
        if (!norm_ok(&L->bq, qd) || !norm_ok(&L->bk, kd) || !norm_ok(&L->bv, vd) || !norm_ok(&L->bo, d->n_embd))
            FAIL("blk.%d: a bias has a bad shape", l);
    }
    if (any_swa && d->n_swa <= 0) FAIL("sliding-window layers without a window size");

    c->g[G_GLOBAL].cap = n_ctx;
    c->g[G_SWA].cap = any_swa ? EL_MIN(n_ctx, d->n_swa + n_batch) : 0;
    for (int gi = 0; gi < 2; gi++) {
        if (!c->g[gi].cap) continue;
        c->g[gi].pos = malloc(sizeof(int32_t) * (size_t)c->g[gi].cap);
        if (!c->g[gi].pos) FAIL("out of memory");
    }
    c->k = calloc((size_t)d->n_layer, sizeof(el_half *));
    c->v = calloc((size_t)d->n_layer, sizeof(el_half *));
    if (!c->k || !c->v) FAIL("out of memory");
    for (int l = 0; l < d->n_layer; l++) {
        const int cap = c->g[c->layers[l].is_swa ? G_SWA : G_GLOBAL].cap;
        c->k[l] = amalloc(sizeof(el_half) * (size_t)k_cap(cap) * kd);
        c->v[l] = amalloc(sizeof(el_half) * (size_t)k_cap(cap) * vd);
        if (!c->k[l] || !c->v[l]) FAIL("out of memory for the KV cache (n_ctx %d)", n_ctx);
        memset(c->k[l], 0, sizeof(el_half) * (size_t)k_cap(cap) * kd);
        memset(c->v[l], 0, sizeof(el_half) * (size_t)k_cap(cap) * vd);
    }

    int max_k = EL_MAX(EL_MAX(d->n_embd, od), d->n_ff);
    c->max_k = max_k;
    const size_t B = (size_t)n_batch;
    c->x = amalloc(4 * B * d->n_embd);
    c->xn = amalloc(4 * B * EL_MAX(d->n_embd, od));
    c->q = amalloc(4 * B * qd);
    c->kc = amalloc(4 * B * kd);
    c->vc = amalloc(4 * B * vd);
    c->tmp = amalloc(4 * B * d->n_embd);
    c->gate = amalloc(4 * B * d->n_ff);
    c->up = amalloc(4 * B * d->n_ff);
    c->actq = amalloc(B * (size_t)max_k * 4 + 1024);  /* every act type takes <= 4 bytes/value */
    c->rope = amalloc(4 * B * (d->n_rot ? d->n_rot : 2));
    c->tok = amalloc(4 * B);
    if (!c->x || !c->xn || !c->q || !c->kc || !c->vc || !c->tmp || !c->gate || !c->up || !c->actq ||
        !c->rope || !c->tok)
        FAIL("out of memory for scratch buffers (n_batch %d)", n_batch);
    if (el_ctx_set_threads(c, n_threads) != 0) FAIL("cannot start %d threads", n_threads);
    el_kv_clear(c);
    return c;
fail:
    el_ctx_free(c);
    return NULL;
}

int el_ctx_isa(const el_ctx *c) { return c->isa; }

int el_ctx_set_threads(el_ctx *c, int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (c->pool && el_pool_size(c->pool) == n_threads) return 0;
    el_pool_free(c->pool);
    free(c->scores);
    c->pool = el_pool_new(n_threads);
    c->n_threads = n_threads;
    free(c->qround);
    c->scores = amalloc(sizeof(float) * (size_t)n_threads * QB * (EL_MAX(c->g[0].cap, c->g[1].cap) + KT));
    c->qround = amalloc(sizeof(float) * (size_t)n_threads * ATT_SCRATCH(c->d.head_dim_k, c->d.head_dim_v));
    free(c->tmp_k);
    c->tmp_k = amalloc(sizeof(el_half) * (size_t)n_threads * EL_MAX(c->d.head_dim_k, c->d.head_dim_v));
    return c->pool && c->scores && c->qround && c->tmp_k ? 0 : -1;
}

void el_ctx_free(el_ctx *c) {
    if (!c) return;
    el_pool_free(c->pool);
    if (c->k) for (int l = 0; l < c->d.n_layer; l++) free(c->k[l]);
    if (c->v) for (int l = 0; l < c->d.n_layer; l++) free(c->v[l]);
    free(c->k); free(c->v);
    free(c->g[0].pos); free(c->g[1].pos);
    free(c->x); free(c->xn); free(c->q); free(c->kc); free(c->vc); free(c->tmp);
    free(c->gate); free(c->up); free(c->actq); free(c->rope); free(c->scores); free(c->qround); free(c->tmp_k); free(c->tok);
    free(c->layers);
    free(c);
}

/* ------------------------------------------------------------------------------------------ */
/* matmul inside a pool task: y[m, :] = W . x[m, :] for m < M                                   */

typedef struct {
    const float *src;  /* what actq holds (this thread's view; identical on every thread) */
    int type, m, k;
    int in_use;        /* actq may be read by another thread since the last barrier */
} act_state;

/* every barrier of a forward pass goes through here, so act_state knows actq is free again */
static void sync(el_ctx *c, act_state *st) {
    el_pool_barrier(c->pool);
    st->in_use = 0;
}

/* Contents of x must not change between matmuls that share its quantized copy, unless the
 * pointer changes too: callers quantize a buffer, use it, and only then overwrite it. */
static void quantize_acts(el_ctx *c, act_state *st, int vdt, const float *x, int m, int k, int ldx,
                          int ith, int nth) {
    if (st->src == x && st->type == vdt && st->m == m && st->k == k) return;
    if (st->in_use) sync(c, st);
    const size_t rs = el_row_size(vdt, k);
    for (int r = ith; r < m; r += nth)
        c->traits[vdt].from_float(x + (size_t)r * ldx, c->actq + (size_t)r * rs, k);
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

/* activation rows [c0, c0 + nc) of a batch of m: the last el_small_rows(m) go through the
 * small-batch kernels, as llama.cpp does */
static void gemm_loop(const el_type_traits *tt, int type, int m, int c0, int n, const uint8_t *w, size_t ldw,
                      int nr, const uint8_t *a, size_t lda, int nc, float *out, size_t ldo) {
    const int split = tt->vec_dot_small ? m - el_small_rows(type, m) : m;
    const int nmain = EL_MAX(0, EL_MIN(nc, split - c0));
    if (nmain) gemm_with(tt->gemm, tt->vec_dot, n, w, ldw, nr, a, lda, nmain, out, ldo);
    if (nmain < nc)
        gemm_with(tt->gemm_small, tt->vec_dot_small, n, w, ldw, nr, a + (size_t)nmain * lda, lda, nc - nmain,
                  out + (size_t)nmain * ldo, ldo);
}

/* no barrier at the end: callers batch independent matmuls (q, k, v) and then barrier once */
static void matmul(el_ctx *c, act_state *st, const el_tensor *w, const float *x, int m, int ldx,
                   float *y, int ldy, int ith, int nth) {
    const el_type_traits *tt = &c->traits[w->type];
    const int k = (int)w->ne0, vdt = tt->vec_dot_type;
    quantize_acts(c, st, vdt, x, m, k, ldx, ith, nth);
    const size_t rs = el_row_size(vdt, k);
    st->in_use = 1;
    int64_t r0, r1;
    el_split(w->ne1, ith, nth, ROW_ALIGN, &r0, &r1);
    const uint8_t *wd = w->data;
    const int64_t rt = m == 1 ? EL_MAX(1, r1 - r0) : ROW_TILE;
    for (int64_t rb = r0; rb < r1; rb += rt) {
        const int nr = (int)EL_MIN(rt, r1 - rb);
        for (int mb = 0; mb < m; mb += TOK_TILE) {
            const int nc = EL_MIN(TOK_TILE, m - mb);
            gemm_loop(tt, w->type, m, mb, k, wd + (size_t)rb * w->row_bytes, w->row_bytes, nr,
                      c->actq + (size_t)mb * rs, rs, nc, y + (size_t)mb * ldy + rb, (size_t)ldy);
        }
    }
}

static void add_bias(float *y, const el_tensor *b, int m, int n, int ld, int ith, int nth) {
    if (!b->data) return;
    const float *bb = b->data;
    for (int r = ith; r < m; r += nth)
        for (int i = 0; i < n; i++) y[(size_t)r * ld + i] += bb[i];
}

/* ------------------------------------------------------------------------------------------ */

typedef struct {
    el_ctx *c;
    int n;            /* tokens in this step */
    int pos0;
    float *logits;
    int all_logits;
} fwd_args;

static int layer_group(const el_ctx *c, int l) { return c->layers[l].is_swa ? G_SWA : G_GLOBAL; }
static int slot_of(const el_ctx *c, int gi, int pos) { return gi == G_SWA ? pos % c->g[G_SWA].cap : pos; }

/* Keys and values of one (layer, kv head) are stored in tiles of KT slots, [dim][KT] each: the
 * 16 slots a score or p.v tile needs are contiguous per dimension (see attention()). */
static el_half *k_head(const el_ctx *c, int l, int h, int cap) {
    return c->k[l] + (size_t)h * k_cap(cap) * c->d.head_dim_k;
}
static el_half *v_head(const el_ctx *c, int l, int h, int cap) {
    return c->v[l] + (size_t)h * k_cap(cap) * c->d.head_dim_v;
}
static void kv_put(el_half *kh, int dim, int slot, const el_half *src) {
    el_half *t = kh + (size_t)(slot / KT) * dim * KT + slot % KT;
    for (int e = 0; e < dim; e++) t[(size_t)e * KT] = src[e];
}
static void kv_get(const el_half *kh, int dim, int slot, el_half *dst) {
    const el_half *t = kh + (size_t)(slot / KT) * dim * KT + slot % KT;
    for (int e = 0; e < dim; e++) dst[e] = t[(size_t)e * KT];
}

/* Attention, per (head, block of up to QB queries), as llama.cpp's default (non-flash) CPU path
 * computes it, the reference we are held to: q rounded to f16; scores from tinyBLAS's f16 gemm
 * order (vops.qk_tile), scaled, masked; softmax with ggml's exp, 16-value partial sums added in
 * double; probabilities rounded to f16; p.v in the same gemm order (vops.pv_tile, 16 slot lanes
 * per output, reduced at the end). Masked slots weigh exactly 0, so only the slots' positions
 * within their tiles matter, never how many tiles or queries a block holds. A step of one token
 * takes llama.cpp's vec_dot order instead (vops.qk_tile_one; p.v lanes kept apart per tile index
 * mod 4 and combined the same way), so a decode step can differ from prefill in the last bits. */
static void attention(el_ctx *c, int l, int n, int pos0, int ith, int nth) {
    const el_model_desc *d = &c->d;
    const int gi = layer_group(c, l);
    const kv_group *g = &c->g[gi];
    const int hk = d->head_dim_k, hv = d->head_dim_v, cap = g->cap;
    const int group = d->n_head / d->n_head_kv;
    const int n_slots = gi == G_GLOBAL ? pos0 + n : cap;
    const int n_pad = k_cap(n_slots);
    const int max_cap = EL_MAX(c->g[0].cap, c->g[1].cap) + KT;
    const int hmax = EL_MAX(hk, hv);
    float *sc = c->scores + (size_t)ith * QB * max_cap;   /* [QB][slots]: scores, then weights */
    float *qr = c->qround + (size_t)ith * ATT_SCRATCH(hk, hv); /* [QB][hk] queries rounded to f16 */
    float *tile = qr + (size_t)QB * hk;                     /* [QB][KT] scores of a tile */
    float *row = tile + QB * KT;                            /* one row */
    el_half *tmp = (el_half *)row;                          /* or 2*hmax halves */
    float *lanes = row + hmax;                              /* [4][hv][KT] p.v lanes of one query */
    const int one = n == 1;                                 /* llama.cpp's single-token order */
    const int od = d->n_head * hv;
    const int n_qb = (n + QB - 1) / QB;
    for (int task = ith; task < n_qb * d->n_head; task += nth) {
        const int qb = task / d->n_head, h = task % d->n_head, kvh = h / group;
        const int m0 = qb * QB, mq = EL_MIN(QB, n - m0);
        const int p_first = pos0 + m0, p_last = p_first + mq - 1;
        for (int j = 0; j < mq; j++) {
            c->vops.f32_to_f16(hk, c->q + (size_t)(m0 + j) * d->n_head * hk + (size_t)h * hk, tmp);
            c->vops.f16_to_f32(hk, tmp, qr + (size_t)j * hk);
        }
        const el_half *K = k_head(c, l, kvh, cap), *V = v_head(c, l, kvh, cap);
        float mx[QB];
        for (int j = 0; j < mq; j++) mx[j] = -INFINITY;
        for (int s0 = 0; s0 < n_pad; s0 += KT) {
            /* which (query, key) pairs are visible; skip tiles nobody sees */
            int any = 0;
            for (int t = 0; t < KT && s0 + t < n_slots; t++) {
                const int ps = g->pos[s0 + t];
                any |= ps >= 0 && ps <= p_last && !(gi == G_SWA && p_first - ps >= d->n_swa && p_last - ps >= d->n_swa);
            }
            if (!any) {
                for (int j = 0; j < mq; j++)
                    for (int t = 0; t < KT; t++) sc[(size_t)j * max_cap + s0 + t] = -INFINITY;
                continue;
            }
            if (one) c->vops.qk_tile_one(hk, qr, K + (size_t)s0 * hk, tile);
            else c->vops.qk_tile(hk, qr, mq, hk, K + (size_t)s0 * hk, tile);
            for (int j = 0; j < mq; j++) {
                const int p = p_first + j;
                for (int t = 0; t < KT; t++) {
                    const int ps = s0 + t < n_slots ? g->pos[s0 + t] : -1;
                    float v = -INFINITY;
                    if (ps >= 0 && ps <= p && !(gi == G_SWA && p - ps >= d->n_swa)) {
                        v = tile[j * KT + t] * d->attn_scale;
                        if (d->attn_softcap > 0) v = d->attn_softcap * tanhf(v / d->attn_softcap);
                        if (v > mx[j]) mx[j] = v;
                    }
                    sc[(size_t)j * max_cap + s0 + t] = v;
                }
            }
        }
        for (int j = 0; j < mq; j++) {
            float *sj = sc + (size_t)j * max_cap;
            const double sum = c->vops.exp_sum(n_pad, sj, mx[j]);
            const float inv = sum > 0 ? (float)(1.0 / sum) : 0.0f;
            for (int s = 0; s < n_pad; s++) sj[s] *= inv;
            /* weights rounded to f16 (in place, through the vector conversions) */
            for (int s0 = 0; s0 < n_pad; s0 += 2 * hmax) {
                const int ns = EL_MIN(2 * hmax, n_pad - s0);
                c->vops.f32_to_f16(ns, sj + s0, tmp);
                c->vops.f16_to_f32(ns, tmp, sj + s0);
            }
            const size_t lsz = (size_t)hv * KT;
            memset(lanes, 0, sizeof(float) * lsz * (one ? 4 : 1));
            for (int s0 = 0; s0 < n_pad; s0 += KT) {
                int any = 0;
                for (int t = 0; t < KT; t++) any |= sj[s0 + t] != 0.0f;
                if (any) c->vops.pv_tile(hv, sj + s0, V + (size_t)s0 * hv, lanes + (one ? (size_t)(s0 / KT % 4) * lsz : 0));
            }
            if (one)
                for (size_t i = 0; i < lsz; i++)
                    lanes[i] = (lanes[i] + lanes[2 * lsz + i]) + (lanes[lsz + i] + lanes[3 * lsz + i]);
            c->vops.sum16_rows(hv, lanes, c->xn + (size_t)(m0 + j) * od + (size_t)h * hv);
        }
    }
}

static void forward_task(void *arg, int ith, int nth) {
    fwd_args *a = arg;
    el_ctx *c = a->c;
    const el_model_desc *d = &c->d;
    const int n = a->n, pos0 = a->pos0;
    const int E = d->n_embd, hk = d->head_dim_k, hv = d->head_dim_v;
    const int qd = d->n_head * hk, kd = d->n_head_kv * hk, vd = d->n_head_kv * hv, od = d->n_head * hv;
    act_state st = {0};

    /* token embeddings */
    for (int m = ith; m < n; m += nth) {
        const el_tensor *te = &d->tok_embd;
        float *xr = c->x + (size_t)m * E;
        c->traits[te->type].to_float((const uint8_t *)te->data + (size_t)c->tok[m] * te->row_bytes, xr, E);
        if (d->embd_scale != 1.0f) for (int i = 0; i < E; i++) xr[i] *= d->embd_scale;
    }
    sync(c, &st);

    float rope_base = -1, rope_scale = -1;
    for (int l = 0; l < d->n_layer; l++) {
        const el_layer *L = &c->layers[l];
        const int gi = layer_group(c, l);
        /* attention block */
        for (int m = ith; m < n; m += nth)
            el_rmsnorm(c->tmp + (size_t)m * E, c->x + (size_t)m * E, L->attn_norm.data, E, d->norm_eps);
        if (d->n_rot && (L->rope_base != rope_base || L->rope_scale != rope_scale)) {
            rope_base = L->rope_base; rope_scale = L->rope_scale;
            for (int m = ith; m < n; m += nth)
                el_rope_cache(c->rope + (size_t)m * d->n_rot, d->n_rot, (float)(pos0 + m), rope_base,
                              rope_scale, d->rope_freqs.data, d);
        }
        sync(c, &st);
        TRACE("attn_norm", l, c->tmp, n, E, E);
        matmul(c, &st, &L->wq, c->tmp, n, E, c->q, qd, ith, nth);
        matmul(c, &st, &L->wk, c->tmp, n, E, c->kc, kd, ith, nth);
        matmul(c, &st, &L->wv, c->tmp, n, E, c->vc, vd, ith, nth);
        sync(c, &st);
        TRACE("q_mm", l, c->q, n, qd, qd);
        TRACE("k_mm", l, c->kc, n, kd, kd);
        TRACE("v_mm", l, c->vc, n, vd, vd);
        /* per token: biases, q/k norms, rope, store k and v */
        for (int m = ith; m < n; m += nth) {
            float *q = c->q + (size_t)m * qd, *k = c->kc + (size_t)m * kd, *v = c->vc + (size_t)m * vd;
            if (L->bq.data) for (int i = 0; i < qd; i++) q[i] += ((const float *)L->bq.data)[i];
            if (L->bk.data) for (int i = 0; i < kd; i++) k[i] += ((const float *)L->bk.data)[i];
            if (L->bv.data) for (int i = 0; i < vd; i++) v[i] += ((const float *)L->bv.data)[i];
            if (L->attn_q_norm.data)
                for (int h = 0; h < d->n_head; h++) el_rmsnorm(q + h * hk, q + h * hk, L->attn_q_norm.data, hk, d->norm_eps);
            if (L->attn_k_norm.data)
                for (int h = 0; h < d->n_head_kv; h++) el_rmsnorm(k + h * hk, k + h * hk, L->attn_k_norm.data, hk, d->norm_eps);
            if (d->n_rot) {
                const float *rc = c->rope + (size_t)m * d->n_rot;
                el_rope(q, d->n_head, hk, d->n_rot, d->rope_type, rc);
                el_rope(k, d->n_head_kv, hk, d->n_rot, d->rope_type, rc);
            }
            if (d->q_scale != 1.0f) for (int i = 0; i < qd; i++) q[i] *= d->q_scale;
            const int cap = c->g[gi].cap, slot = slot_of(c, gi, pos0 + m);
            el_half *kh16 = (el_half *)c->tmp_k + (size_t)ith * EL_MAX(hk, hv);
            for (int h = 0; h < d->n_head_kv; h++) {
                c->vops.f32_to_f16(hk, k + h * hk, kh16);
                kv_put(k_head(c, l, h, cap), hk, slot, kh16);
                c->vops.f32_to_f16(hv, v + h * hv, kh16);
                kv_put(v_head(c, l, h, cap), hv, slot, kh16);
            }
        }
        sync(c, &st);
        TRACE("Qcur", l, c->q, n, qd, qd);
        TRACE("Kcur", l, c->kc, n, kd, kd);
        attention(c, l, n, pos0, ith, nth);
        sync(c, &st);
        TRACE("kqv_out", l, c->xn, n, od, od);
        matmul(c, &st, &L->wo, c->xn, n, od, c->tmp, E, ith, nth);
        sync(c, &st);
        TRACE("attn_out", l, c->tmp, n, E, E);
        for (int m = ith; m < n; m += nth) {
            float *t = c->tmp + (size_t)m * E, *xr = c->x + (size_t)m * E;
            if (L->bo.data) for (int i = 0; i < E; i++) t[i] += ((const float *)L->bo.data)[i];
            if (L->attn_post_norm.data) el_rmsnorm(t, t, L->attn_post_norm.data, E, d->norm_eps);
            for (int i = 0; i < E; i++) xr[i] += t[i];
            el_rmsnorm(t, xr, L->ffn_norm.data, E, d->norm_eps);
        }
        sync(c, &st);
        TRACE("ffn_inp", l, c->x, n, E, E);
        TRACE("ffn_norm", l, c->tmp, n, E, E);
        /* feed-forward block: down(act(gate(x)) * up(x)) */
        matmul(c, &st, &L->w_gate, c->tmp, n, E, c->gate, d->n_ff, ith, nth);
        matmul(c, &st, &L->w_up, c->tmp, n, E, c->up, d->n_ff, ith, nth);
        sync(c, &st);
        TRACE("ffn_gate", l, c->gate, n, d->n_ff, d->n_ff);
        TRACE("ffn_up", l, c->up, n, d->n_ff, d->n_ff);
        {
            int64_t r0, r1;
            el_split((int64_t)n * d->n_ff, ith, nth, 64, &r0, &r1);
            float *gt = c->gate, *up = c->up;
            if (d->act == EL_ACT_GELU_TANH) el_geglu(&c->vops, r1 - r0, gt + r0, up + r0);
            else c->vops.silu_mul(r1 - r0, gt + r0, up + r0);
        }
        sync(c, &st);
        TRACE("ffn_act", l, c->gate, n, d->n_ff, d->n_ff);
        matmul(c, &st, &L->w_down, c->gate, n, d->n_ff, c->tmp, E, ith, nth);
        sync(c, &st);
        TRACE("ffn_out", l, c->tmp, n, E, E);
        for (int m = ith; m < n; m += nth) {
            float *t = c->tmp + (size_t)m * E, *xr = c->x + (size_t)m * E;
            if (L->ffn_post_norm.data) el_rmsnorm(t, t, L->ffn_post_norm.data, E, d->norm_eps);
            for (int i = 0; i < E; i++) xr[i] += t[i];
        }
        sync(c, &st);
        TRACE("l_out", l, c->x, n, E, E);
    }
    if (!a->logits) return;
    /* final norm and output projection, for every row or just the last */
    const int m0 = a->all_logits ? 0 : n - 1, mo = n - m0;
    for (int m = m0 + ith; m < n; m += nth)
        el_rmsnorm(c->tmp + (size_t)m * E, c->x + (size_t)m * E, d->output_norm.data, E, d->norm_eps);
    sync(c, &st);
    TRACE("result_norm", -1, c->tmp + (size_t)m0 * E, mo, E, E);
    matmul(c, &st, &d->output, c->tmp + (size_t)m0 * E, mo, E, a->logits, d->n_vocab, ith, nth);
    sync(c, &st);
    if (d->final_softcap > 0) {
        int64_t r0, r1;
        el_split((int64_t)mo * d->n_vocab, ith, nth, 64, &r0, &r1);
        const float cap = d->final_softcap;
        for (int64_t i = r0; i < r1; i++) a->logits[i] = cap * tanhf(a->logits[i] / cap);
    }
}

int el_decode(el_ctx *c, const int32_t *tokens, int n, float *logits, int all_logits) {
    if (n <= 0 || !tokens) return -2;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->d.n_vocab) return -2;
    if (c->next_pos + n > c->n_ctx) return -1;
    for (int done = 0; done < n;) {
        const int step = EL_MIN(c->n_batch, n - done);
        const int pos0 = c->next_pos;
        memcpy(c->tok, tokens + done, sizeof(int32_t) * step);
        for (int gi = 0; gi < 2; gi++)
            if (c->g[gi].cap)
                for (int m = 0; m < step; m++) c->g[gi].pos[slot_of(c, gi, pos0 + m)] = pos0 + m;
        const int last = done + step == n;
        fwd_args a = {c, step, pos0, NULL, all_logits};
        if (logits && all_logits) a.logits = logits + (size_t)done * c->d.n_vocab;
        else if (logits && last) a.logits = logits;
        el_pool_run(c->pool, forward_task, &a);
        c->next_pos += step;
        done += step;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* KV cache management                                                                          */

void el_kv_clear(el_ctx *c) {
    for (int gi = 0; gi < 2; gi++)
        for (int s = 0; s < c->g[gi].cap; s++) c->g[gi].pos[s] = -1;
    c->next_pos = 0;
}

int el_kv_next_pos(const el_ctx *c) { return c->next_pos; }
int el_kv_capacity(const el_ctx *c) { return c->n_ctx; }

int el_kv_truncate(el_ctx *c, int p) {
    if (p < 0) p = 0;
    if (p >= c->next_pos) return 0;
    for (int gi = 0; gi < 2; gi++)
        for (int s = 0; s < c->g[gi].cap; s++)
            if (c->g[gi].pos[s] >= p) c->g[gi].pos[s] = -1;
    c->next_pos = p;
    if (c->g[G_SWA].cap) {  /* the ring must still hold the window before p */
        for (int q = EL_MAX(0, p - c->d.n_swa + 1); q < p; q++)
            if (c->g[G_SWA].pos[slot_of(c, G_SWA, q)] != q) return -1;
    }
    return 0;
}

/* rotate the stored keys of one slot by `delta` positions (RoPE angles add up) */
static void rerope_slot(el_ctx *c, int l, int cap, int slot, const float *rc, float *buf) {
    const el_model_desc *d = &c->d;
    const int hk = d->head_dim_k;
    el_half *kp = (el_half *)(buf + hk);
    for (int h = 0; h < d->n_head_kv; h++) {
        el_half *kh = k_head(c, l, h, cap);
        kv_get(kh, hk, slot, kp);
        dequantize_row_f16(kp, buf, hk);
        el_rope(buf, 1, hk, d->n_rot, d->rope_type, rc);
        c->vops.f32_to_f16(hk, buf, kp);
        kv_put(kh, hk, slot, kp);
    }
}

int el_kv_shift(el_ctx *c, int n_keep, int n_discard) {
    const el_model_desc *d = &c->d;
    const int n_used = c->next_pos;
    if (n_keep < 0 || n_discard <= 0 || n_keep + n_discard > n_used) return -2;
    const int hk = d->head_dim_k, hv = d->head_dim_v;
    float *buf = malloc(sizeof(float) * (size_t)(2 * hk + 2 * d->n_rot + 2));  /* row, its f16, rope */
    el_half *kp = malloc(sizeof(el_half) * (size_t)EL_MAX(hk, hv));
    if (!buf || !kp) { free(buf); free(kp); return -3; }
    float *rc = buf + 2 * hk;
    /* a rotation by -n_discard, without YaRN magnitude scaling (that is applied once already) */
    el_model_desc dd = *d;
    dd.yarn_attn_factor = 1.0f;
    for (int l = 0; l < d->n_layer; l++) {
        const el_layer *L = &c->layers[l];
        const int gi = layer_group(c, l), cap = c->g[gi].cap;
        if (d->n_rot) {
            el_rope_cache(rc, d->n_rot, (float)(-n_discard), L->rope_base, L->rope_scale, d->rope_freqs.data, &dd);
            if (d->yarn_ext_factor != 0.0f) {  /* undo the magnitude term el_rope_cache folded in */
                const float ms = 1.0f + 0.1f * logf(1.0f / L->rope_scale);
                for (int i = 0; i < d->n_rot; i++) rc[i] /= ms;
            }
        }
        if (gi == G_GLOBAL) {
            const int n_move = n_used - n_keep - n_discard;
            for (int h = 0; h < d->n_head_kv; h++) {
                el_half *K = k_head(c, l, h, cap), *V = v_head(c, l, h, cap);
                for (int s = n_keep; s < n_keep + n_move; s++) {  /* ascending: sources lie ahead */
                    kv_get(K, hk, s + n_discard, kp);
                    kv_put(K, hk, s, kp);
                    kv_get(V, hv, s + n_discard, kp);
                    kv_put(V, hv, s, kp);
                }
            }
            if (d->n_rot) for (int s = n_keep; s < n_keep + n_move; s++) rerope_slot(c, l, cap, s, rc, buf);
        } else {
            /* permute the ring: entries past the discarded range move to slot (pos - n_discard) % cap */
            const size_t kbytes = sizeof(el_half) * (size_t)d->n_head_kv * k_cap(cap) * hk;
            const size_t vbytes = sizeof(el_half) * (size_t)d->n_head_kv * k_cap(cap) * hv;
            el_half *K2 = malloc(kbytes), *V2 = malloc(vbytes);
            if (!K2 || !V2) { free(K2); free(V2); free(buf); free(kp); return -3; }
            memcpy(K2, c->k[l], kbytes);
            memcpy(V2, c->v[l], vbytes);
            const int32_t *pos = c->g[gi].pos;
            for (int s = 0; s < cap; s++) {
                const int ps = pos[s];
                if (ps < n_keep + n_discard) continue;
                const int ns = (ps - n_discard) % cap;
                for (int h = 0; h < d->n_head_kv; h++) {
                    kv_get(K2 + (size_t)h * k_cap(cap) * hk, hk, s, kp);
                    kv_put(k_head(c, l, h, cap), hk, ns, kp);
                    kv_get(V2 + (size_t)h * k_cap(cap) * hv, hv, s, kp);
                    kv_put(v_head(c, l, h, cap), hv, ns, kp);
                }
                if (d->n_rot) rerope_slot(c, l, cap, ns, rc, buf);
            }
            free(K2); free(V2);
        }
    }
    /* positions */
    for (int s = 0; s < c->g[G_GLOBAL].cap; s++) c->g[G_GLOBAL].pos[s] = s < n_used - n_discard ? s : -1;
    if (c->g[G_SWA].cap) {
        const int cap = c->g[G_SWA].cap;
        int32_t *np = malloc(sizeof(int32_t) * (size_t)cap);
        if (!np) { free(buf); free(kp); return -3; }
        for (int s = 0; s < cap; s++) np[s] = -1;
        for (int s = 0; s < cap; s++) {
            const int ps = c->g[G_SWA].pos[s];
            if (ps < 0) continue;
            if (ps < n_keep) np[s] = ps;
            else if (ps >= n_keep + n_discard) np[(ps - n_discard) % cap] = ps - n_discard;
        }
        memcpy(c->g[G_SWA].pos, np, sizeof(int32_t) * (size_t)cap);
        free(np);
    }
    c->next_pos = n_used - n_discard;
    free(buf);
    free(kp);
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
            gemm_loop(tt, w->type, a->m, mb, k, (const uint8_t *)w->data + (size_t)rb * w->row_bytes, w->row_bytes, nr,
                      a->actq + (size_t)mb * rs, rs, EL_MIN(TOK_TILE, a->m - mb), a->y + (size_t)mb * w->ne1 + rb,
                      (size_t)w->ne1);
    }
}

int el_matmul(const el_tensor *w, const float *x, int m, float *y, int n_threads) {
    el_get_isa();
    if (w->type < 0 || w->type >= EL_NTYPES || !el_traits[w->type].vec_dot) return -2;
    if (w->ne0 % el_traits[w->type].blck) return -2;
    mm_args a = {w, x, m, y, amalloc((size_t)m * w->ne0 * 4 + 1024), el_pool_new(n_threads)};
    if (!a.actq || !a.pool) { free(a.actq); el_pool_free(a.pool); return -3; }
    el_pool_run(a.pool, mm_task, &a);
    free(a.actq);
    el_pool_free(a.pool);
    return 0;
}
