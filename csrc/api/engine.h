/* The inference engine: a transformer forward pass over memory-mapped GGUF weights, executed in C
 * on a persistent thread pool, with its own KV cache. Implemented in engine.c (+ kv.c, pool.c). */

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
    int is_swa;             /* sliding-window layer */
    float rope_base;        /* theta base for this layer */
    float rope_scale;       /* position scale (1/linear factor) */
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
    /* YaRN (ext_factor != 0) */
    float yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    int n_ctx_orig;
    el_tensor tok_embd, output_norm, output, rope_freqs;
    const el_layer *layers; /* n_layer entries; copied by el_ctx_new */
} el_model_desc;

typedef struct el_ctx el_ctx;

/* Returns NULL when memory cannot be allocated or the description is inconsistent
 * (el_last_error() says why). n_batch bounds the tokens evaluated per step. */
el_ctx *el_ctx_new(const el_model_desc *desc, int n_ctx, int n_batch, int n_threads);
void el_ctx_free(el_ctx *ctx);
const char *el_last_error(void);
int el_ctx_set_threads(el_ctx *ctx, int n_threads);
int el_ctx_isa(const el_ctx *ctx);  /* the kernels a context runs are fixed when it is made */

/* Evaluate n tokens at positions pos0 .. pos0+n-1 (pos0 == el_kv_next_pos). logits: float
 * [n, n_vocab] when all_logits, else [n_vocab] for the last token; NULL for none.
 * Returns 0, or -1 when the context is full (caller shifts or fails), -2 bad arguments. */
int el_decode(el_ctx *ctx, const int32_t *tokens, int n, float *logits, int all_logits);

/* Hidden state after the final norm is not exposed; these manage the KV cache. */
void el_kv_clear(el_ctx *ctx);
int el_kv_next_pos(const el_ctx *ctx);     /* tokens held = next position */
int el_kv_capacity(const el_ctx *ctx);     /* n_ctx */
/* Drop n_discard tokens after the first n_keep and slide the rest down (RoPE re-applied). */
int el_kv_shift(el_ctx *ctx, int n_keep, int n_discard);
/* Forget positions >= p. Returns 0, or -1 when a sliding-window layer no longer holds the
 * history needed to continue from p (the caller must clear and re-evaluate). */
int el_kv_truncate(el_ctx *ctx, int p);

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

/* Best GB/s of a plain multi-threaded read loop over nbytes at data, over reps runs. */
double el_read_bandwidth(const void *data, size_t nbytes, int n_threads, int reps);
