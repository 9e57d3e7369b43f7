/* Internal interfaces shared by the engine's C files (not exported through cffi). */
#ifndef EDGELLM_INTERNAL_H
#define EDGELLM_INTERNAL_H

#include "common.h"
#include "api/engine.h"
#include "api/quants_legacy.h"
#include "api/quants_k.h"
#include "api/quants_iq.h"

/* ggml type ids used here */
enum {
    EL_F32 = 0, EL_F16 = 1, EL_Q4_0 = 2, EL_Q4_1 = 3, EL_Q5_0 = 6, EL_Q5_1 = 7, EL_Q8_0 = 8,
    EL_Q8_1 = 9, EL_Q2_K = 10, EL_Q3_K = 11, EL_Q4_K = 12, EL_Q5_K = 13, EL_Q6_K = 14,
    EL_Q8_K = 15, EL_IQ4_NL = 20, EL_IQ4_XS = 23, EL_BF16 = 30, EL_NTYPES = 40
};

enum { EL_ISA_GENERIC = 0, EL_ISA_AVX2 = 1, EL_ISA_AVX512 = 2, EL_ISA_NEON = 3 };

typedef void (*el_from_float_fn)(const float *x, void *y, int64_t k);
typedef void (*el_to_float_fn)(const void *x, float *y, int64_t k);
typedef void (*el_vec_dot_fn)(int n, float *s, const void *x, const void *y);
/* Tile of dot products: out[c*ldo + r] = W_row(r) . A_row(c) for r < nr, c < nc, rows of n
 * values; W rows ldw bytes apart (weight type), A rows lda bytes apart (its vec_dot_type). */
typedef void (*el_gemm_fn)(int n, const void *w, size_t ldw, int nr,
                           const void *a, size_t lda, int nc, float *out, size_t ldo);

typedef struct {
    int blck;                 /* values per block */
    int size;                 /* bytes per block */
    int vec_dot_type;         /* activation type the dot product takes */
    el_from_float_fn from_float;  /* quantize a row into this type (activations) */
    el_to_float_fn to_float;
    el_vec_dot_fn vec_dot;    /* weight row (this type) . activation row (vec_dot_type) */
    el_gemm_fn gemm;          /* many rows x many activation rows; NULL = loop over vec_dot */
    /* llama.cpp sums some K-quants in another order when a batch is small (see
     * el_small_rows); NULL where it does not. Same contract as vec_dot / gemm. */
    el_vec_dot_fn vec_dot_small;
    el_gemm_fn gemm_small;
    /* the batch-invariant steps' order where it is not vec_dot's (the legacy types: one float
     * update per block, quants_generic.c); NULL where vec_dot / gemm serve both. Same contract. */
    el_vec_dot_fn vec_dot_batch;
    el_gemm_fn gemm_batch;
} el_type_traits;

/* How many of a batch's m activation rows (from the end) llama.cpp computes with its
 * small-batch kernels for weights of this type: repacked Q4_K takes rows in fours through its
 * gemm and the rest through its gemv; Q3_K, Q5_K, Q6_K and IQ4_XS go through the tiled gemm
 * from 8 rows on (ggml-cpu/tiled) and through vec_dot below that. */
static inline int el_small_rows(int type, int m) {
    if (type == EL_Q4_K) return m % 4;
    if (type == EL_Q3_K || type == EL_Q5_K || type == EL_Q6_K || type == EL_IQ4_XS) return m < 8 ? m : 0;
    return 0;
}

/* Per-ISA registration: each overrides the entries it accelerates (dispatch.c calls them). */
void el_register_generic(el_type_traits *t);
#if defined(__x86_64__)
void el_register_avx2(el_type_traits *t);    /* x86_avx2.c   (AVX2 + FMA + F16C) */
void el_register_avx512(el_type_traits *t);  /* x86_avx512.c (AVX-512 F/BW/VL, VNNI when present) */
#endif
#if defined(__aarch64__)
int el_register_neon(el_type_traits *t);     /* arm_neon.c (dotprod when present: returns 1) */
#endif

/* float vector helpers of attention and the FFN activation, dispatched like the quant kernels.
 * Their arithmetic is llama.cpp's on its AVX-512 builds (the reference outputs we are held to):
 * tinyBLAS's f16 gemm for q.k and p.v (16 lanes, lane i summing elements i, i+16, ... with one
 * rounding per step, then the lanes reduced as GCC's _mm512_reduce_add_ps does: el_sum16), and
 * ggml_v_expf / ggml_v_silu for the softmax and SiLU. Every ISA gives the portable code's bits. */
typedef struct {
    void (*f32_to_f16)(int n, const float *x, el_half *y);
    void (*f16_to_f32)(int n, const el_half *x, float *y);
    /* scores of nq queries (f16-valued floats) against 16 keys stored f16 [hk][16]:
     * out[j*16 + l] = el_sum16 over lanes i of sum_{d = i mod 16, in order} q[j*ldq + d] * kt[d*16 + l] */
    void (*qk_tile)(int hk, const float *q, int nq, int ldq, const el_half *kt, float *out);
    /* scores of nq queries against 16 keys in ggml_vec_dot_f16's order (llama.cpp's single-token
     * path), out[j*16 + l]: four 16-lane accumulators over 64-dim chunks (dim d in accumulator
     * (d % 64) / 16, lane d % 16), combined (a0 + a2) + (a1 + a3), then el_sum16; dims past the
     * last multiple of 64 added in double. next: the tile the caller scores after this one, or NULL;
     * its hk * 32 bytes are prefetched into L2 while this one is scored (el_prefetch_l2; the AVX-512
     * kernel spreads the prefetches over its loop) */
    void (*qk_tile_one)(int hk, const float *q, int nq, int ldq, const el_half *kt, float *out, const el_half *next);
    /* scores of nq queries against a tile of 16 keys quantized as q8_0 (qk_q4_0: q4_0) in the
     * key-tile layout below, hk = 32 nb dims; queries as rows of nb q8_0 blocks (ldq bytes apart)
     * and the sums of each block's 32 quants, qsum[j*nb + b] (kernels that offset the keys to
     * unsigned bytes subtract offset * qsum). out[j*16 + l]: per block b in order, the exact
     * integer dot product of the two blocks' quants (q4_0: nibble - 8), times dk * dq (rounded),
     * added with one fma to one float accumulator (from 0). next: as qk_tile_one's (a key tile of
     * el_kq_tile_bytes) */
    void (*qk_q8_0)(int hk, const uint8_t *q, size_t ldq, const int32_t *qsum, int nq, const uint8_t *kt, float *out,
                    const uint8_t *next);
    void (*qk_q4_0)(int hk, const uint8_t *q, size_t ldq, const int32_t *qsum, int nq, const uint8_t *kt, float *out,
                    const uint8_t *next);
    /* p.v of nh query rows over nt value tiles (tile t: nd value rows of 16 slots, f16, vt[t] +
     * d*16; a NULL tile has all-zero weights): acc[r*lda + s*nd*16 + d*16 + l] +=
     * w[r*ldw + t*16 + l] * vt[t][d*16 + l], tiles in order, with lane set s = (t0 + t) % 4 when
     * sets == 4 (llama.cpp's single-token p.v keeps four), else 0. A (row, tile) whose 16 weights
     * are all zero is skipped. Weights are f16 values, so every product is exact. next: the nn tiles
     * (as vt: the same nd dims, NULL entries skipped) the caller sums next, or NULL; a hint (no
     * effect on the results): the AVX-512 kernel prefetches them into L2 a few lines a tile while it
     * sums these, others ignore it */
    void (*pv_tiles)(int nd, int nt, const el_half *const *vt, int nh, const float *w, int ldw, float *acc,
                     int lda, int sets, int t0, const el_half *const *next, int nn);
    /* p.v of nh query rows over nt value tiles of a quantized cache, q8_0 (pv_q4_0: q4_0), in the
     * value-tile layout below: tile t at vt[t], 16 slots of 32 dims. Summed in integers, per (row
     * r, tile t): with the slots' scales d[l] (finite) and weights w[l] = w[r*ldw + t*16 + l] (f16
     * values), wd[l] = w[l] * d[l] (exact), m = the largest of 2^-48 and the |wd[l]|, E = m's
     * exponent bits (its float bits & 0x7f800000, as an integer >> 23) and p = 2^(141 - E), so
     * that m p lies in [2^14, 2^15); the int16 weights W[l] = wd[l] * p (exact) rounded to nearest
     * even, saturated to [-32768, 32767]; for each dim i < 32 the exact sum S[i] = sum_l W[l] *
     * q_l[i] (q: the int8 quant, q4_0's nibble - 8; |S| < 2^27); then acc[r*lda + i] += (float)S[i]
     * * (1 / p) ((float)S rounded to nearest even, the product exact: one rounding, as an fma).
     * A call's tiles are those of one chunk (EL_PV_CHUNK, engine.h; nt <= EL_PV_CHUNK; attention
     * makes a call a chunk and adds the chunks in order): per row the sums P[i] of its tiles, in
     * order, from zero, each added as above; then acc[r*lda + i] += P[i]. A (row, tile) whose 16
     * weights are all zero is skipped, and so is a NULL tile (its weights are zero); a row that
     * skips every tile adds +0 or nothing (the same bits: acc must hold no -0.0). */
    void (*pv_q8_0)(int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda);
    void (*pv_q4_0)(int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda);
    /* out[i] = el_sum16(acc + 16 i) for i < n */
    void (*sum16_rows)(int n, const float *acc, float *out);
    /* g[i] = silu(g[i]) * u[i] with silu(x) = x / (1 + ggml_v_expf(-x)) */
    void (*silu_mul)(int64_t n, float *g, const float *u);
    /* a score tile's rows scaled, and their lane-wise maxima: for r < nh, l < 16, v = src[r*16 + l] *
     * scale, dst[r*ldd + l] = v, lmax[r*16 + l] = v > lmax[r*16 + l] ? v : lmax[r*16 + l] */
    void (*scale_max)(int nh, const float *src, float scale, float *dst, size_t ldd, float *lmax);
    /* softmax numerators: x[i] = exp(x[i] - max) (ggml_v_expf) for i < n (a multiple of 16); each 16
     * values' el_sum16 kept in sums[i / 16] unless sums is NULL; returns the sum of those el_sum16,
     * accumulated in double */
    double (*exp_sums)(int n, float *x, float max, float *sums);
    /* softmax weights: x[i] = x[i] * s rounded to f16 (round to nearest even), as a float, i < n */
    void (*f16_scale)(int n, float *x, float s);
    /* RoPE, el_rope's contract (ops.c): pair i of every head rotated by cache[2i], cache[2i + 1] (c,
     * s) as x0' = fma(x0, c, -(x1 s)), x1' = fma(x0, s, x1 c) */
    void (*rope)(float *x, int n_heads, int head_dim, int n_rot, int rope_type, const float *cache);
    /* el_rmsnorm of rows rows of n values: row r from x + r * ldx to y + r * ldy (y == x: in place) */
    void (*rmsnorm_rows)(int rows, float *y, size_t ldy, const float *x, size_t ldx, const float *w, int n, float eps);
} el_vec_ops;
extern el_vec_ops el_vops;

/* Key tiles of a quantized cache (what qk_q8_0 / qk_q4_0 read): the 16 keys of one KV block, hk =
 * 32 nb dims, stored by 32-dim block so that one 64-byte vector holds 4 quants of every key: the
 * keys' scales d as [nb][16] halves, then their quants as [nb][groups][16][4] bytes. Group g of a
 * q8_0 block (8 groups): quants 4g..4g+3; of a q4_0 block (4 groups): its qs bytes 4g..4g+3, i.e.
 * values 4g..4g+3 in the low nibbles and 16+4g..16+4g+3 in the high ones. Same bytes as 16 rows
 * of nb blocks (a slot's row goes in and out with el_kq_put / el_kq_get, dispatch.c). */
static inline int el_kq_groups(int type) { return type == EL_Q4_0 ? 4 : 8; }
void el_kq_put(int type, uint8_t *kt, int hk, int slot, const uint8_t *row);
void el_kq_get(int type, const uint8_t *kt, int hk, int slot, uint8_t *row);

/* Value tiles of a quantized cache (what pv_q8_0 / pv_q4_0 read): the 16 slots of one KV block, one
 * 32-dim group of one head (one q8_0 / q4_0 block a slot), stored so that a pair of slots' quants
 * comes in one load already interleaved for a pairwise multiply-add (x86 vpmovsxbw then vpdpwssd /
 * vpmaddwd; NEON vld2q splits them again): the slots' scales d as 16 halves (32 bytes, slot order),
 * then 8 pairs of slots (2p, 2p + 1), each pair's quant bytes interleaved, byte 2i of the pair from
 * slot 2p and 2i + 1 from slot 2p + 1: q8_0 64 bytes (i = 0..31: dim i, so 32 bytes hold dims 0..15
 * of both slots, in dim order), q4_0 32 bytes (i = 0..15: qs byte i, dim i in the low nibble and
 * 16 + i in the high one). Same bytes as 16 rows of one block (544 / 288); a slot's row goes in
 * and out with el_vq_put / el_vq_get (dispatch.c). */
static inline size_t el_vq_tile_bytes(int type) { return 16 * (type == EL_Q4_0 ? sizeof(block_q4_0) : sizeof(block_q8_0)); }
/* a value tile's first pair of slots (after the 16 scales), and the bytes of a pair */
static inline const uint8_t *el_vq_pairs(const uint8_t *vt) { return vt + 16 * sizeof(el_half); }
static inline size_t el_vq_pair_bytes(int type) { return type == EL_Q4_0 ? 2 * (QK4_0 / 2) : 2 * QK8_0; }
void el_vq_put(int type, uint8_t *vt, int slot, const uint8_t *row);
void el_vq_get(int type, const uint8_t *vt, int slot, uint8_t *row);

/* n bytes from p (NULL: none) into L2 (locality 2, prefetcht1 on x86: a burst of L1 prefetches
 * stalls on the L1's miss buffers on a Zen 4 VM). Always inlined: GCC 12 finds a function that
 * only prefetches "const" and deletes the calls to it (no prefetch was left in the kernels) */
static inline __attribute__((always_inline)) void el_prefetch_l2(const void *p, size_t n) {
    if (p)
        for (size_t o = 0; o < n; o += 64) __builtin_prefetch((const char *)p + o, 0, 2);
}

/* pv_q8_0 / pv_q4_0's kernels take tiles in passes of 64 that end where chunks end */
_Static_assert(64 % EL_PV_CHUNK == 0, "EL_PV_CHUNK must divide 64");

/* pv_q8_0 / pv_q4_0's powers of two (el_vec_ops' contract), from e = the float bits of m &
 * 0x7f800000: p = 2^(141 - E) has the float bits EL_PVQ_P_BITS - e, 1 / p the bits e -
 * EL_PVQ_INV_BITS (unsigned: 268 << 23 does not fit an int) */
#define EL_PVQ_P_BITS (268u << 23)
#define EL_PVQ_INV_BITS (14u << 23)

/* p and (in *inv) 1 / p of pv_q's contract for the largest |w d| m (at least 2^-48) */
static inline float el_pvq_powers(float m, float *inv) {
    const uint32_t e = el_fp32_to_bits(m) & 0x7f800000u;
    *inv = el_fp32_from_bits(e - EL_PVQ_INV_BITS);
    return el_fp32_from_bits(EL_PVQ_P_BITS - e);
}

/* the reduction tree of GCC's _mm512_reduce_add_ps over 16 lanes */
static inline float el_sum16(const float *l) {
    float t[8], u[4];
    for (int i = 0; i < 8; i++) t[i] = l[i + 8] + l[i];
    for (int i = 0; i < 4; i++) u[i] = t[i + 4] + t[i];
    return (u[0] + u[2]) + (u[1] + u[3]);
}

/* ggml_v_expf (a degree-5 polynomial after range reduction by ln 2) for one value */
static inline float el_expf(float x) {
    const float r = 0x1.8p23f;
    const float n = fmaf(x, 0x1.715476p+0f, r) - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                         fmaf(0x1.ffffecp-1f, b, 1.0f));
    return ldexpf(j, (int)n);
}
void el_geglu(const el_vec_ops *v, int64_t n, float *gate, const float *up);  /* gate = gelu(gate)*up (up NULL: *1) */

/* filled by el_set_isa(); entries with blck == 0 are unsupported */
extern el_type_traits el_traits[EL_NTYPES];

static inline size_t el_row_size(int type, int64_t n) {
    return (size_t)(n / el_traits[type].blck) * el_traits[type].size;
}

/* bytes of a key tile of a quantized cache (type q8_0 or q4_0): 16 rows of hk dims */
static inline size_t el_kq_tile_bytes(int type, int hk) { return 16 * el_row_size(type, hk); }

/* ---- thread pool: one persistent pool per context; fn runs on every thread ---- */
typedef struct el_pool el_pool;
typedef void (*el_task_fn)(void *arg, int ith, int nth);
el_pool *el_pool_new(int n_threads);
void el_pool_free(el_pool *pool);
int el_pool_size(const el_pool *pool);
void el_pool_run(el_pool *pool, el_task_fn fn, void *arg);  /* returns when all threads finish */
void el_pool_barrier(el_pool *pool);                        /* inside fn: wait for all threads */
/* adaptive (off for a new pool): runs may use fewer threads while the cores are busy (pool.c) */
void el_pool_set_adaptive(el_pool *pool, int on);
void el_pool_stats(const el_pool *pool, int *active, long long *runs, long long *reduced_runs);

/* ---- float ops (ops.c) ---- */
void el_rmsnorm(float *y, const float *x, const float *w, int n, float eps);  /* w may be NULL */
/* el_rmsnorm with the squares of x[0, i) already summed in order (from 0.0) into ss */
void el_rmsnorm_from(float *y, const float *x, const float *w, int n, float eps, int i, double ss);
void el_rmsnorm_rows(int rows, float *y, size_t ldy, const float *x, size_t ldx, const float *w, int n, float eps);
void el_fwht(float *x, int n, int chunk);  /* Walsh-Hadamard rotation, chunk by chunk (self-inverse) */
void el_rope(float *x, int n_heads, int head_dim, int n_rot, int rope_type,
             const float *cache);  /* cache: cos,sin pairs for n_rot/2 dims at this pos */
void el_rope_pairs(float *v, int n_rot, int rope_type, const float *cache, int i);  /* one head's pairs i.. */
void el_rope_cache(float *cache, int n_rot, float pos, float base, float scale,
                   const float *freq_factors, const el_model_desc *d);
void el_gelu_init(void);  /* builds the f16 GELU table; dispatch calls it */

/* row range [r0, r1) of thread ith out of nth for n rows, aligned to `align` rows */
static inline void el_split(int64_t n, int ith, int nth, int64_t align, int64_t *r0, int64_t *r1) {
    int64_t chunks = (n + align - 1) / align;
    int64_t per = (chunks + nth - 1) / nth;
    int64_t a = per * ith * align, b = per * (ith + 1) * align;
    *r0 = a < n ? a : n;
    *r1 = b < n ? b : n;
}

#endif
