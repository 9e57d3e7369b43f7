/* The engine's state, shared by engine.c (forward pass), attention.c and kv.c (KV storage). */
#ifndef EDGELLM_ENGINE_INTERNAL_H
#define EDGELLM_ENGINE_INTERNAL_H

#include "el_internal.h"

#define KT EL_KV_BLOCK  /* slots per KV block = keys per attention tile */
#define QB 8            /* queries per attention work item */
#define SLAB_BLOCKS 64  /* KV blocks per allocation (a group's pool grows a slab at a time) */

enum { G_GLOBAL = 0, G_SWA = 1 };

/* KV storage of one layer group: slabs of SLAB_BLOCKS blocks. Per layer and block, keys are
 * [n_head_kv][head_dim_k][KT] halves (one attention tile per head: the KT slots a score tile
 * needs are contiguous per dimension), values [n_head_kv][head_dim_v][KT]; per block, the
 * position each slot holds. */
typedef struct {
    int n_blocks;
    int n_slabs, cap_slabs;
    el_half ***k, ***v;   /* [n_layer][slab] (only this group's layers are set) */
    int32_t **pos;        /* [slab] -> [SLAB_BLOCKS][KT] */
} kv_store;

/* What one decode step is made of, derived from the el_batch before the threads start. */
typedef struct {
    const el_batch *b;
    int n;                /* rows */
    int32_t *row_slot;    /* [n_batch] slot each row writes */
    int32_t *seq_row0;    /* [n_batch] first row of each sequence */
    int32_t *seq_rows;    /* [n_batch] rows of each sequence */
    int32_t *out_row;     /* [n_batch] logits row of each row, -1 = none */
    int n_out;
    int32_t *qb_seq, *qb_row0, *qb_rows;  /* attention work items: a sequence's run of <= QB rows */
    int n_qb;
    float *logits;
} step_plan;

struct el_engine {
    el_type_traits traits[EL_NTYPES];  /* the kernels of the ISA chosen when the engine was made */
    el_vec_ops vops;
    int isa;
    el_model_desc d;
    el_layer *layers;
    int n_ctx, n_batch, n_threads;
    el_pool *pool;
    kv_store kv[2];
    int max_k;           /* widest matmul input */
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
    float *scores; /* per thread [QB][n_ctx + KT] */
    float *qround; /* per thread: rounded queries, a score tile, one row, p.v lanes */
    el_half *tmp_k; /* per thread: one key or value row in f16 */
    step_plan plan;
};

static inline int layer_group(const el_engine *e, int l) { return e->layers[l].is_swa ? G_SWA : G_GLOBAL; }

/* the block tables of sequence s in group g, for this step */
static inline const int32_t *seq_table(const el_batch *b, int g, int s) {
    return b->tables + ((size_t)g * b->n_seqs + s) * b->max_blocks;
}

/* head h's tile of keys (values) in block blk of layer l */
static inline el_half *kv_k(const el_engine *e, int l, int blk, int h) {
    const kv_store *st = &e->kv[layer_group(e, l)];
    return st->k[l][blk / SLAB_BLOCKS] + ((size_t)(blk % SLAB_BLOCKS) * e->d.n_head_kv + h) * e->d.head_dim_k * KT;
}
static inline el_half *kv_v(const el_engine *e, int l, int blk, int h) {
    const kv_store *st = &e->kv[layer_group(e, l)];
    return st->v[l][blk / SLAB_BLOCKS] + ((size_t)(blk % SLAB_BLOCKS) * e->d.n_head_kv + h) * e->d.head_dim_v * KT;
}
static inline int32_t *kv_pos(const el_engine *e, int g, int blk) {
    return e->kv[g].pos[blk / SLAB_BLOCKS] + (size_t)(blk % SLAB_BLOCKS) * KT;
}
/* one slot's row in a [dim][KT] tile */
static inline void tile_put(el_half *t, int dim, int lane, const el_half *src) {
    for (int e = 0; e < dim; e++) t[(size_t)e * KT + lane] = src[e];
}
static inline void tile_get(const el_half *t, int dim, int lane, el_half *dst) {
    for (int e = 0; e < dim; e++) dst[e] = t[(size_t)e * KT + lane];
}

void el_attention(el_engine *e, int l, int ith, int nth);  /* attention.c: c->xn <- softmax(q k) v */
void el_kv_free_all(el_engine *e);                         /* kv.c */

#endif
