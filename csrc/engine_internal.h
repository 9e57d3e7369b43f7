/* The engine's state, shared by engine.c (forward pass), attention.c and kv.c (KV storage). */
#ifndef EDGELLM_ENGINE_INTERNAL_H
#define EDGELLM_ENGINE_INTERNAL_H

#include "el_internal.h"

#define KT EL_KV_BLOCK  /* slots per KV block = keys per attention tile */
#define QB 8            /* queries per attention work item */
#define SLAB_BLOCKS 64  /* KV blocks per allocation (a group's pool grows a slab at a time) */
#define N_SCRATCH 7     /* buffers in the step scratch (struct el_engine) */

enum { G_NONE = -1, G_GLOBAL = 0, G_SWA = 1 };  /* G_NONE: a recurrent layer keeps no KV */

/* KV storage of one layer group: slabs of SLAB_BLOCKS blocks. A head's keys of one block (a
 * "part") are in the cache type: f16 as [head_dim_k][KT] halves (one attention tile: the KT slots
 * a score tile needs are contiguous per dimension), a quantized type (q8_0, q4_0) as a key tile
 * (el_internal.h: per 32-dim block, 4 quants of every slot side by side, what vops.qk_q8_0 /
 * qk_q4_0 read). Values are cut into groups of v.dims dimensions, each stored as a [v.dims][KT]
 * f16 tile or KT rows of v.dims values in the quantized type (a q8_0 / q4_0 block per row). Per layer and slab, the keys are [n_head_kv][SLAB_BLOCKS] parts and the values
 * [n_head_kv][groups][SLAB_BLOCKS] parts: a head's keys of consecutive blocks, and each group of
 * its values, are one stream of memory, as attention reads them (a thread's share of a decode
 * step: a run of a head's key tiles, then a share of its value dimensions over all its tiles).
 * Per block, the position each slot holds. */
/* how a head's keys (values) of one block are stored: groups of dims, each a part of the size of
 * KT rows of `row` bytes (f16: a [dims][KT] tile; quantized keys: a key tile) */
typedef struct {
    int type, dims, groups;
    size_t row, part;
} kv_layout;

/* Slab memory (kv.c): a reservation ("extent") holds `cap` slabs back to back, each slab every
 * layer's keys and values of its SLAB_BLOCKS blocks and their positions. Slabs become usable as
 * the pool grows; those whose blocks were all written are offered to 2 MB pages (el_kv_settle). */
#define KV_EXTENTS 24
typedef struct {
    uint8_t *base;        /* 2 MB aligned */
    int first, cap;       /* slabs first .. first + cap - 1 */
    int made, settled;    /* slabs usable, and (from first) offered to huge pages */
} kv_extent;

typedef struct {
    int n_blocks;
    int n_slabs, cap_slabs;
    uint8_t ***k, ***v;   /* [n_layer][slab] (only this group's layers are set) */
    int32_t **pos;        /* [slab] -> [SLAB_BLOCKS][KT] */
    size_t slab;          /* bytes of a slab */
    kv_extent ext[KV_EXTENTS];
    int n_ext;
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
    int llama_order;      /* the batch's llama_order (kept after the step, for its logits) */
    float *logits;        /* NULL: the step's logits rows wait for el_engine_logits */
    int pending;          /* the last step's logits rows can still be made (its rows are in x) */
    int lg_row0, lg_rows; /* el_engine_logits: the logits rows to make, into lg_out */
    float *lg_out;
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
    kv_layout *kl, *vl;             /* per layer: cache types (EL_F16, EL_Q8_0, EL_Q4_0) and layouts of
                                       the keys (one group of head_dim_k dims) and values (groups of
                                       vl.dims) */
    int max_k;           /* widest matmul input */
    int ffn_chunk;       /* rows of a batch-order step's FFN at a time (0: whole steps; el_gated_ffn) */
    /* scratch, n_batch rows each; x, tmp and actq hold what a step's logits are made from
     * (el_engine_logits), the others are the step scratch, free after a step: one block, the
     * engine's own or the caller's (el_engine_set_scratch), scr_bytes[i] for each in this order */
    float *x;      /* [n_batch, n_embd] residual stream */
    float *tmp;    /* [n_batch, n_embd] */
    uint8_t *actq; /* quantized activations, n_batch rows of up to max_k values */
    float *xn;     /* [n_batch, max(n_embd, q_dim)] normed input / attention output */
    float *q;      /* [n_batch, n_head * head_dim_k] */
    float *kc;     /* [n_batch, n_head_kv * head_dim_k] */
    float *vc;     /* [n_batch, n_head_kv * head_dim_v] */
    float *gate;   /* [n_batch, n_ff]; batch-order steps use the first ffn_chunk rows */
    float *up;     /* [n_batch, n_ff]; likewise */
    float *rope;   /* [n_batch, max n_rot] cos/sin per token for the current rope parameters */
    size_t scr_bytes[N_SCRATCH], scratch_bytes;
    uint8_t *own_scratch;
    struct att_state *att; /* attention's scratch and per-step plan (attention.c) */
    struct moe_state *moe; /* the expert FFN's scratch (moe.c); NULL for dense models */
    struct ple_state *ple; /* per-layer embeddings' scratch (gemma4.c); NULL without them */
    struct dn_state *dn;   /* DeltaNet layers' recurrent states and scratch, the attention output
                              gate's scratch (delta_net.c); NULL for models with neither */
    el_half *tmp_k; /* per thread: one key or value row in f16 */
    int few_ok;     /* the model takes the few-rows path (engine.c, forward_task) */
    float *xp;      /* per thread, that path's rows: [n_threads][2][n_threads - 1][n_embd] (its copy of the
                       residual stream, then a normed row) */
    step_plan plan;
};

static inline int layer_group(const el_engine *e, int l) {
    return e->layers[l].recurrent ? G_NONE : e->layers[l].is_swa ? G_SWA : G_GLOBAL;
}
/* the layer whose KV cache layer l reads (gemma4's last layers read an earlier one's) */
static inline int kv_owner(const el_engine *e, int l) { return e->layers[l].kv_share ? e->layers[l].kv_share - 1 : l; }

/* the block tables of sequence s in group g, for this step */
static inline const int32_t *seq_table(const el_batch *b, int g, int s) {
    return b->tables + ((size_t)g * b->n_seqs + s) * b->max_blocks;
}

/* head h's keys (values: value group c) in block blk of layer l: an f16 tile, a quantized key
 * tile, or a quantized value tile (el_internal.h) */
static inline uint8_t *kv_kb(const el_engine *e, int l, int blk, int h) {
    l = kv_owner(e, l);
    const kv_store *st = &e->kv[layer_group(e, l)];
    return st->k[l][blk / SLAB_BLOCKS] + ((size_t)h * SLAB_BLOCKS + blk % SLAB_BLOCKS) * e->kl[l].part;
}
static inline uint8_t *kv_vb(const el_engine *e, int l, int blk, int h, int c) {
    l = kv_owner(e, l);
    const kv_store *st = &e->kv[layer_group(e, l)];
    return st->v[l][blk / SLAB_BLOCKS] + (((size_t)h * e->vl[l].groups + c) * SLAB_BLOCKS + blk % SLAB_BLOCKS) *
           e->vl[l].part;
}
static inline el_half *kv_k(const el_engine *e, int l, int blk, int h) { return (el_half *)kv_kb(e, l, blk, h); }
static inline el_half *kv_v(const el_engine *e, int l, int blk, int h, int c) { return (el_half *)kv_vb(e, l, blk, h, c); }
static inline int32_t *kv_pos(const el_engine *e, int g, int blk) {
    return e->kv[g].pos[blk / SLAB_BLOCKS] + (size_t)(blk % SLAB_BLOCKS) * KT;
}
/* attention.c: c->xn <- softmax(q k) v. init (re)allocates for the engine's thread count;
 * plan runs before each step's threads start (-1: out of memory). */
int el_attention_init(el_engine *e);
void el_attention_free(el_engine *e);
int el_attention_plan(el_engine *e);
void el_attention(el_engine *e, int l, int ith, int nth);
/* What actq (the quantized activations of the last matmul input) holds, per thread: a matmul
 * whose input is the same buffer, type and shape reuses it. */
typedef struct {
    const float *src;  /* what actq holds (this thread's view; identical on every thread) */
    int type, m, k;
    int in_use;        /* actq may be read by another thread since the last barrier */
    int cols;          /* llama_order: the columns llama.cpp's matmuls see (0: the step's rows) */
} act_state;

/* engine.c, for the FFN variants in their own files, inside a forward pass (every thread calls
 * them alike): el_task_matmul is the forward pass's matmul, y[m, :] = W . x[m, :] (no barrier at
 * the end); el_task_sync its barrier; el_matmul_acts this thread's share of rows [row0, row0 +
 * nrows) of W times m activation rows already quantized in W's vec_dot type (lda bytes apart):
 * y[j * ldy + r - row0] for row r, activation row j, in the order the step's matmuls use (on
 * llama_order steps, llama.cpp's for a matmul of `cols` columns; 0: its ggml_mul_mat_id's, the
 * experts'). */
void el_task_matmul(el_engine *c, act_state *st, const el_tensor *w, const float *x, int m, int ldx,
                    float *y, int ldy, int ith, int nth);
void el_task_sync(el_engine *c, act_state *st);
/* a weight the engine's kernels multiply by: a supported type, ne0 values per row (whole blocks), ne1 rows */
int el_weight_ok(const el_engine *c, const el_tensor *t, int64_t ne0, int64_t ne1);
/* the gated FFN of c->tmp's rows: out <- w_down . (act(w_gate . x) * (w_up . x)), with c->gate and
 * c->up as scratch (act: EL_ACT_*), batch-order steps in chunks of c->ffn_chunk rows; ends with a
 * barrier */
void el_gated_ffn(el_engine *c, act_state *st, int l, const el_tensor *w_gate, const el_tensor *w_up,
                  const el_tensor *w_down, int n_ff, int act, float *out, int ith, int nth);
void el_matmul_acts(const el_engine *c, const el_tensor *w, int64_t row0, int64_t nrows, const uint8_t *a,
                    size_t lda, int m, float *y, size_t ldy, int cols, int ith, int nth);
/* float_llama.c: float weights in llama.cpp's orders, for llama_order steps. The type is one it
 * covers (F32, F16); tinyblas: whether llama.cpp takes tinyBLAS for a weight of `rows` rows of n
 * values times `cols` activation rows (0: ggml_mul_mat_id, which never does); the gemm
 * (el_float_llama_gemm, api/engine.h) has el_gemm_fn's contract. */
int el_float_llama_type(int type);
int el_float_llama_tinyblas(int64_t rows, int n, int cols);
/* moe.c: the routed-expert FFN. init checks the expert tensors and allocates the scratch (0, or
 * -1 with a message in err); el_moe_ffn replaces c->tmp's n rows (the normed FFN input) by the
 * FFN's output, as the dense FFN does. */
int el_moe_init(el_engine *e, char *err, size_t err_size);
void el_moe_free(el_engine *e);
void el_moe_ffn(el_engine *e, act_state *st, int l, int ith, int nth);
/* gemma4.c: per-layer input embeddings and output scales. init checks the tensors and allocates
 * the scratch (0, or -1 with a message in err); inputs computes every layer's inputs of the
 * step's rows after the token embeddings (ends with a barrier); layer_end applies layer l's
 * per-layer embedding and output scale to the residual stream after its FFN (ends with a barrier) */
int el_ple_init(el_engine *e, char *err, size_t err_size);
void el_ple_free(el_engine *e);
void el_ple_inputs(el_engine *e, act_state *st, int ith, int nth);
void el_layer_end(el_engine *e, act_state *st, int l, int ith, int nth);
/* delta_net.c: init checks the DeltaNet tensors and allocates the scratch (0, or -1 with a
 * message in err); el_delta_net replaces c->tmp's n rows (the normed layer input) by the layer's
 * output (after ssm_out), as attention's wo leaves it; ends with a barrier. The attention output
 * gate: el_gate_q gives the buffer wq's rows go to (2 * q_dim per row); el_gate_split moves head h of
 * row m's q (with bq added) into c->q and keeps its gate; el_gate_apply multiplies c->xn by sigmoid(gate). */
int el_dn_init(el_engine *e, char *err, size_t err_size);
void el_dn_free(el_engine *e);
int el_dn_check_batch(el_engine *e, const el_batch *b, char *err, size_t err_size);
void el_delta_net(el_engine *e, act_state *st, int l, int ith, int nth);
float *el_gate_q(el_engine *e);
void el_gate_split(el_engine *e, const el_layer *L, int m, int h);
void el_gate_apply(el_engine *e, int ith, int nth);
/* TRACE for the other files of the forward pass (el_set_trace; every thread calls it alike) */
void el_trace(el_engine *c, const char *name, int l, const float *p, int rows, int cols, int ld, int ith);
/* kv.c */
int el_kv_init(el_engine *e, int type_k, int type_v);  /* the cache types; -1 unsupported */
void el_kv_free_all(el_engine *e);
/* store head h's keys (v = 0: head_dim_k floats) or values (v = 1: head_dim_v floats) x in slot
 * `lane` of block blk of layer l; buf: head_dim halves of scratch (max of k and v) */
void el_kv_store(el_engine *e, int l, int blk, int lane, int v, int h, const float *x, el_half *buf);

#endif
