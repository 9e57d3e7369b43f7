/* The inference engine: a transformer forward pass over memory-mapped GGUF weights, executed in C
 * on a persistent thread pool, over a paged KV cache shared by many sequences. Implemented in
 * engine.c (forward pass), attention.c, kv.c (KV storage), pool.c (threads). */

typedef struct {
    int type;               /* ggml type id; data == NULL means "absent" */
    const void *data;       /* rows of row_bytes, row-major (a view into the mmap) */
    int64_t ne0;            /* row length (values) */
    int64_t ne1;            /* number of rows */
    size_t row_bytes;
} el_tensor;

typedef struct {
    el_tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, bo;
    el_tensor attn_q_norm, attn_k_norm, attn_post_norm;
    el_tensor ffn_norm, w_gate, w_up, w_down, ffn_post_norm;
    /* routed experts (el_model_desc.n_expert > 0; then w_gate / w_up / w_down are absent): the
     * router [n_expert rows], each expert's matrices stacked (expert e's rows are e * rows-per-expert
     * onwards: gate / up n_ff_exp rows of n_embd, down n_embd rows of n_ff_exp); the shared expert
     * (n_ff_shexp rows) and its gate, one F32 row of n_embd (shexp_gate) */
    el_tensor w_gate_inp, w_gate_exps, w_up_exps, w_down_exps;
    el_tensor w_gate_inp_shexp, w_gate_shexp, w_up_shexp, w_down_shexp;
    /* a gated DeltaNet layer (recurrent; delta_net.c) in place of attention: ssm_in (attn_qkv: q, k,
     * v before the conv), ssm_gate (attn_gate: z), ssm_conv1d (F32, conv_dim rows of dn_conv taps),
     * ssm_dt, ssm_a (F32, one per v head), ssm_beta / ssm_alpha (dn_v_heads rows), ssm_norm (F32,
     * dn_state), ssm_out */
    el_tensor ssm_in, ssm_gate, ssm_conv1d, ssm_dt, ssm_a, ssm_beta, ssm_alpha, ssm_norm, ssm_out;
    int recurrent;
    int is_swa;             /* sliding-window layer */
    int use_rope;           /* 0: q and k of this layer are not rotated */
    float rope_base;        /* theta base for this layer */
    float rope_scale;       /* position scale (1/linear factor) */
    /* this layer's sizes where they are its own (0: the model's; gemma4's window and global layers
     * differ): q/k/v head sizes, key/value heads, FFN width, rotated dims */
    int head_dim_k, head_dim_v, n_head_kv, n_ff, n_rot;
    int rope_freqs;         /* 1: el_model_desc.rope_freqs applies on this layer */
    int kv_share;           /* 0: a KV cache of its own; s > 0: no K/V, attends to layer s - 1's cache */
    el_tensor out_scale;    /* one F32: the layer's output times it (gemma4); absent: none */
    /* per-layer input embedding (el_model_desc.n_embd_per_layer > 0): x += post_norm(proj(
     * gelu(inp_gate . x) * e_l)) after the FFN's residual */
    el_tensor ple_gate, ple_proj, ple_post_norm;
} el_layer;

enum { EL_ACT_SILU = 0, EL_ACT_GELU_TANH = 1 };
enum { EL_ROPE_NORM = 0, EL_ROPE_NEOX = 2 };

typedef struct {
    int n_layer, n_embd, n_head, n_head_kv, head_dim_k, head_dim_v, n_ff, n_vocab;
    int n_rot;              /* rotated dims per head (<= head_dim_k) */
    int rope_type;          /* EL_ROPE_NORM (adjacent pairs) or EL_ROPE_NEOX (halves) */
    int act;                /* EL_ACT_* for the gated FFN */
    int n_swa;              /* sliding window (keys with pos > p - n_swa are seen); 0 = none */
    float norm_eps;
    float attn_scale;       /* multiplies q·k */
    float q_scale;          /* multiplies q after RoPE, before attention rounds it to f16; 1 = none */
    float embd_scale;       /* multiplies the token embedding (gemma: sqrt(n_embd)); 1 = none */
    float attn_softcap;     /* 0 = none */
    float final_softcap;    /* 0 = none */
    float residual_scale;   /* multiplies attention and FFN outputs before each residual add */
    float logit_scale;      /* multiplies the logits (before the final soft-cap) */
    float attn_temp_scale;  /* q at position p times 1 + s * log(floor(p / attn_temp_floor) + 1); 0 = none */
    int attn_temp_floor;
    int qk_norm_all;        /* attn_q_norm / attn_k_norm normalise all heads at once (else each head) */
    int rot_k, rot_v;       /* Walsh-Hadamard chunks of stored keys / values (kv_cache.kv_rotation); 0 = none */
    /* mixture of experts (moe.c; n_expert 0 = dense FFN): per token, softmax over the router's
     * logits, the n_expert_used most probable experts, their weights divided by their sum when
     * moe_norm_w, times moe_w_scale; n_ff_shexp > 0: a shared expert on every token, its output
     * times sigmoid(w_gate_inp_shexp . x) when shexp_gate */
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp, moe_norm_w, shexp_gate;
    float moe_w_scale;
    /* YaRN (ext_factor != 0) */
    float yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    int n_ctx_orig;
    int v_norm;             /* v RMS-normed per head, without a weight (gemma4) */
    /* per-layer input embeddings (gemma4; gemma4.c): n_embd_per_layer values per layer and token,
     * e = (rms_norm(ple_model_proj . x0 / sqrt(n_embd)) * ple_proj_norm + ple_embd[token] *
     * sqrt(n_embd_per_layer)) / sqrt(2), x0 the scaled token embedding; 0 = none */
    int n_embd_per_layer;
    el_tensor ple_embd, ple_model_proj, ple_proj_norm;
    /* attention output gate: wq gives each head's q then its gate (2 * head_dim_k rows per head);
     * the attention output times sigmoid(gate) before wo (qwen35) */
    int attn_out_gate;
    /* gated DeltaNet layers (el_layer.recurrent; delta_net.c): conv taps, head size, q/k heads,
     * v heads (v head h reads q / k head h % dn_k_heads) */
    int dn_conv, dn_state, dn_k_heads, dn_v_heads;
    el_tensor tok_embd, output_norm, output, output_bias, rope_freqs;
    const el_layer *layers; /* n_layer entries; copied by el_engine_new */
} el_model_desc;

/* ---- the engine: one per loaded model (weights, thread pool, KV storage) ---------------------
 *
 * KV storage is a pool of blocks of EL_KV_BLOCK slots per layer group (group 0: global layers,
 * group 1: sliding-window layers). Which blocks a sequence holds is the caller's business (the
 * block manager in src/edgellm/kv_cache.py): every batch passes each of its sequences' block
 * tables. A sequence's slot i lives in block tables[g][seq][i / EL_KV_BLOCK] at i % EL_KV_BLOCK. */
#define EL_KV_BLOCK 16
/* Attention over quantized values sums p.v in chunks of EL_PV_CHUNK blocks (tiles), chunk c
 * holding tiles [c * EL_PV_CHUNK, (c + 1) * EL_PV_CHUNK) of a sequence: each chunk from zero, the
 * chunks' sums then added in order, so the keys of one sequence can be split across threads at
 * chunk boundaries with the same bits (csrc/attention.c; numba_engine's twin reads this) */
#define EL_PV_CHUNK 64

typedef struct el_engine el_engine;

/* n_ctx: the most slots one sequence may hold; n_batch: the most tokens of one decode call;
 * type_k, type_v: the KV cache types (ggml ids: 1 f16, 8 q8_0, 2 q4_0; quantized ones need head
 * sizes that are multiples of 32). Returns NULL when memory cannot be allocated or the
 * description is inconsistent (el_last_error() says why). The KV pool starts empty
 * (el_kv_reserve). */
el_engine *el_engine_new(const el_model_desc *desc, int n_ctx, int n_batch, int n_threads, int type_k, int type_v);
void el_engine_free(el_engine *e);
const char *el_last_error(void);
/* n_threads, adaptive: while other programs keep the cores busy a step may use fewer of them
 * (never a different result). el_engine_thread_stats: the threads the next step uses, steps run,
 * and how many of them used fewer than n_threads. */
int el_engine_set_threads(el_engine *e, int n_threads, int adaptive);
void el_engine_thread_stats(const el_engine *e, int *active, long long *runs, long long *reduced_runs);
int el_engine_isa(const el_engine *e);  /* the kernels an engine runs are fixed when it is made */
int el_engine_has_swa(const el_engine *e);  /* whether group 1 has layers */

/* Grow group g's pool to at least n_blocks blocks (it never shrinks; pages are touched only when
 * a block is first written, so reserved but unused blocks cost address space, not memory).
 * Returns the pool's size, or -1 when out of memory. */
int el_kv_reserve(el_engine *e, int group, int n_blocks);
int el_kv_blocks(const el_engine *e, int group);
/* Blocks [0, n_written) of group g hold data (the block manager hands out low ids first): move
 * the memory of the slabs they fill into 2 MB pages where the kernel allows (Linux 6.1+,
 * MADV_COLLAPSE; a slab's memory is resident already, so this costs no memory). Returns the
 * bytes moved by this call (0 where unsupported), -2 for a bad group. */
long long el_kv_settle(el_engine *e, int group, int n_written);
/* Copy block src to dst in every layer of group g (keys, values, positions): copy-on-write. */
int el_kv_copy_block(el_engine *e, int group, int src, int dst);
/* Zero block blk's keys and values in every layer of group g: a block handed to a new sequence
 * must hold no value of a sequence before it in the slots it has not written yet, as p.v
 * multiplies every slot of a tile (masked ones by 0, and 0 * inf or NaN is NaN). 0, or -2. */
int el_kv_clear_block(el_engine *e, int group, int blk);
/* One sequence's context shift: slots [n_keep + n_discard, n_slots) move to [n_keep, n_slots -
 * n_discard), their positions drop by n_discard and their keys are rotated back by as much.
 * tables: [2][max_blocks]; every destination block must exist (and be the sequence's own); in
 * the sliding-window group, sources in absent blocks are skipped. 0, or -2 bad arguments. */
int el_kv_shift(el_engine *e, const int32_t *tables, int max_blocks, int n_slots, int n_keep, int n_discard);
/* Positions held by slots [0, n) of a sequence in group g (-1 where the block is absent). */
int el_kv_positions(const el_engine *e, int group, const int32_t *table, int n, int32_t *out);
/* A block of group g as portable bytes, el_kv_block_bytes of them (saved sessions; kv.c gives
 * the layout, which the numba engine shares): read copies block blk out, write copies it in.
 * 0, or -2 for a bad group or block. */
size_t el_kv_block_bytes(const el_engine *e, int group);
int el_kv_read_block(el_engine *e, int group, int blk, uint8_t *out);
int el_kv_write_block(el_engine *e, int group, int blk, const uint8_t *in);

typedef struct {
    int n_tokens;
    const int32_t *token;    /* [n_tokens] */
    const int32_t *pos;      /* [n_tokens] positions (RoPE; a key is seen by queries at >= its position) */
    const int32_t *seq;      /* [n_tokens] index of the row's sequence in this batch: non-decreasing,
                                each of 0 .. n_seqs-1 present (a sequence's rows are contiguous) */
    const int8_t *logits;    /* [n_tokens] rows whose logits are wanted; NULL: the last row only */
    int n_seqs;
    const int32_t *seq_len;  /* [n_seqs] slots each sequence holds before this step; its rows are
                                written to slots seq_len, seq_len + 1, ... */
    const int32_t *tables;   /* [2][n_seqs][max_blocks] block ids per group, -1 = none */
    int max_blocks;
    int llama_order;         /* 1: llama.cpp's batch-size-dependent orders (one sequence only) */
    const int32_t *rs_slot;  /* [n_seqs] each sequence's recurrent state slot (el_rs_*), for models
                                with DeltaNet layers; a sequence's rows continue its state */
} el_batch;

/* Recurrent state (models with DeltaNet layers): per sequence, in a slot the caller assigns (the
 * block manager in src/edgellm/kv_cache.py), each recurrent layer's conv state (the last
 * dn_conv - 1 inputs) and delta-rule state (dn_v_heads matrices of dn_state^2), float32 as
 * llama.cpp keeps them. reserve grows the slots to at least n (-1: out of memory; returns the
 * count); clear zeroes slot s (a new or emptied sequence); copy copies src to dst (a fork).
 * 0, or -2 for a bad slot. */
int el_rs_reserve(el_engine *e, int n_slots);
int el_rs_clear(el_engine *e, int slot);
int el_rs_copy(el_engine *e, int src, int dst);

/* Evaluate a batch (n_tokens <= n_batch). logits: float [rows wanted][n_vocab], in row order.
 * Without llama_order every row's arithmetic is the same whatever else the batch holds (batch
 * invariance); with it, a step of one token and the tail rows of a batch take the kernels
 * llama.cpp switches to there, as the single-stream API reproduces llama.cpp's numbers.
 * Returns 0, or -2 for a bad batch (el_last_error() says what). */
int el_engine_decode(el_engine *e, const el_batch *b, float *logits);
/* With logits NULL, el_engine_decode leaves the output projection for later: el_engine_logits
 * then makes logits rows [row0, row0 + n_rows) of that step into out [n_rows][n_vocab], any
 * number of times until the next decode, so a step of many sequences need not hold all their
 * rows at once. A row's numbers are those el_engine_decode would give; a llama_order step makes
 * its rows in one call. Returns 0, or -2 (el_last_error() says why). */
int el_engine_logits(el_engine *e, int row0, int n_rows, float *out);

/* Which layer groups the last step's attention split across threads (bit g: group g; bit 2 + g:
 * and some job's p.v over quantized values by keys, not value dimensions), for tests and
 * benchmarks: a split changes no result (attention.c says why). */
int el_engine_attention_split(const el_engine *e);
/* Runs of rows the last step's attention took: its jobs are runs x kv heads (engine.c's plan_runs),
 * for tests. The grouping changes no result. */
int el_engine_attention_runs(const el_engine *e);
/* The most runs of their query heads the last step's whole attention jobs were cut into (1: none
 * cut; attention.c's job_parts: fewer jobs than threads), for tests. Changes no result. */
int el_engine_attention_parts(const el_engine *e);
/* Rows of a batch-order step's FFN evaluated at a time (default 256; 0: the whole step at once),
 * which bounds its gate and up activations' memory. Changes no result (tests compare the two). */
void el_engine_set_ffn_chunk(el_engine *e, int rows);
/* The step scratch: the buffers of a step that nothing reads after it, el_engine_scratch_bytes of
 * them. el_engine_set_scratch makes the engine use the caller's memory p (n >= those bytes, at a
 * multiple of 64) from the next step on, or its own again (p NULL): so the caller can keep a
 * step's logits there (el_engine_decode's logits and el_engine_logits' out may point into it; the
 * next decode overwrites them), one block of memory for both. Returns 0, or -2 when p does not do. */
size_t el_engine_scratch_bytes(const el_engine *e);
int el_engine_set_scratch(el_engine *e, void *p, size_t n);

/* Debugging: fn(name, layer, data, rows, cols, ld) sees each named intermediate of a forward
 * pass (names as llama.cpp's graph uses them); NULL turns it off. Not thread-safe to change
 * while a decode runs. */
typedef void (*el_trace_fn)(const char *name, int layer, const float *data, int rows, int cols, int ld);
void el_set_trace(el_trace_fn fn);
/* Kernel dispatch: 0 generic, 1 avx2, 2 avx512, 3 neon. el_set_isa chooses what contexts made
 * from now on run (a request the CPU cannot run falls back; the return value says what). */
int el_cpu_isa_best(void);
int el_set_isa(int isa);
int el_get_isa(void);
/* Optional CPU features the chosen kernels use: bit 0 (1) = NEON's int8 dot product (sdot). */
int el_isa_features(void);
/* Matrix-vector products through the dispatch, for tests: y[m, n] = W[n] . x[m] */
int el_matmul(const el_tensor *w, const float *x, int m, float *y, int n_threads);
/* the same in the batch-invariant steps' order (llama_order 0) or in llama_order steps' (1, as el_matmul) */
int el_matmul_order(const el_tensor *w, const float *x, int m, float *y, int n_threads, int llama_order);
/* Float weights (F32, F16) in llama.cpp's orders (float_llama.c), as llama_order steps take them:
 * out[c * ldo + r] = row r of w (nr rows, ldw bytes apart, n values) . activation row c of a (nc rows
 * of the weight's type, lda bytes apart), in tinyBLAS's order (tinyblas) or ggml_vec_dot_f32 / _f16's */
void el_float_llama_gemm(int type, int tinyblas, int n, const uint8_t *w, size_t ldw, int nr, const uint8_t *a,
                         size_t lda, int nc, float *out, size_t ldo);

/* Best GB/s of a plain multi-threaded read loop over nbytes at data, over reps runs. */
double el_read_bandwidth(const void *data, size_t nbytes, int n_threads, int reps);
