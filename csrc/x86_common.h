/* Plain-C helpers shared by the x86 kernel files (x86_avx2.c, x86_avx512.c): K-quant scale
 * unpacking, the value-tile prefetches and the weight prefetch cursor. No intrinsics, so any
 * target may include it. */
#ifndef EDGELLM_X86_COMMON_H
#define EDGELLM_X86_COMMON_H

#include "el_internal.h"

/* 8 scales and 8 mins of a Q4_K / Q5_K super-block (6 bits each in 12 bytes, ggml's
 * get_scale_min_k4): j < 4: sc = q[j] & 63, m = q[j+4] & 63; j >= 4: sc = (q[j+4] & 15) |
 * (q[j-4] >> 6) << 4, m = (q[j+4] >> 4) | (q[j] >> 6) << 4. Done four bytes at a time; sc and m
 * get the bytes as little-endian words (callers build vectors from them: no store-to-load
 * round trip). */
static inline void k4_scales_mins(const uint8_t *q, uint32_t sc[2], uint32_t m[2]) {
    uint32_t w[3];
    memcpy(w, q, 12);
    const uint32_t lo6 = 0x3f3f3f3fu, lo4 = 0x0f0f0f0fu, lo2 = 0x03030303u;
    sc[0] = w[0] & lo6;
    m[0] = w[1] & lo6;
    sc[1] = (w[2] & lo4) | (((w[0] >> 6) & lo2) << 4);
    m[1] = ((w[2] >> 4) & lo4) | (((w[1] >> 6) & lo2) << 4);
}

/* the 8 group scales of an IQ4_XS super-block at blk, minus 32 (iquants_generic.c iq4_xs_scale): low
 * 4 bits in scales_l (two per byte, even groups low), top 2 at bit 2g of scales_h */
static inline void iq4_xs_scales(const uint8_t *blk, int sc[8]) {
    uint16_t sh;
    uint32_t sl;
    memcpy(&sh, blk + offsetof(block_iq4_xs, scales_h), 2);
    memcpy(&sl, blk + offsetof(block_iq4_xs, scales_l), 4);
    for (int g = 0; g < 8; g++) sc[g] = (int)(((sl >> (4 * g)) & 0xF) | (((unsigned)sh >> (2 * g)) & 3) << 4) - 32;
}

/* 16 scales of a Q3_K super-block, still +32 (kquants_generic.c q3_K_scale): low nibbles in
 * bytes 0..7 (scales 0..7 low halves, 8..15 high halves), top two bits of scale j at bit
 * 2*(j/4) of byte 8 + j%4. Four little-endian words of four scales. */
static inline void q3_K_scales_biased(const uint8_t *s, uint32_t v[4]) {
    uint32_t w[3];
    memcpy(w, s, 12);
    const uint32_t lo4 = 0x0f0f0f0fu, lo2 = 0x03030303u;
    v[0] = (w[0] & lo4) | ((w[2] & lo2) << 4);
    v[1] = (w[1] & lo4) | (((w[2] >> 2) & lo2) << 4);
    v[2] = ((w[0] >> 4) & lo4) | (((w[2] >> 4) & lo2) << 4);
    v[3] = ((w[1] >> 4) & lo4) | (((w[2] >> 6) & lo2) << 4);
}

/* The prefetches of pv_q8_0 / pv_q4_0's kernels over value tiles of tb bytes (el_internal.h), vt[u]
 * the next tile taken, its scales just loaded: the rest of its lines and the scales of tile u + 1
 * into L1 (prefetcht0), tile u + 2 into L2 (tiles past nt or NULL: none). A tile's sum begins with
 * its scales alone, so from DRAM its pair loads came late: SmolLM2's shape on AVX-512
 * (bench_attention_kernels 30 500 3 3 32 2 3 8 64 4, medians of 7 - 11 runs alternating with the
 * row layout, whose 16 scale loads touched every line of the next tile): none 124 / 84 ns a tile;
 * u's lines into L2 91 / 87; u's into L1 82 / 83; u's and u + 1's scales into L1 and u + 2 into
 * L2 78 / 86 (u + 4: 80 / 84). Always inlined (see el_prefetch_l2) */
static inline __attribute__((always_inline)) void pv_q_prefetch(const uint8_t *const *vt, int u, int nt, size_t tb) {
    for (size_t o = 64; o < tb; o += 64) __builtin_prefetch(vt[u] + o, 0, 3);
    __builtin_prefetch(vt[u] + tb - 1, 0, 3);  /* (a tile need not start on a line) */
    if (u + 1 < nt && vt[u + 1]) __builtin_prefetch(vt[u + 1], 0, 3);  /* (scales: 32 bytes, a line's half) */
    if (u + 2 < nt && vt[u + 2]) {
        el_prefetch_l2(vt[u + 2], tb);
        __builtin_prefetch(vt[u + 2] + tb - 1, 0, 2);
    }
}

/* Decode streams the weight rows from DRAM (through 4 KB pages of the mapped file), and the
 * hardware prefetchers follow several interleaved row streams poorly. A tile of R rows reads its
 * rows side by side, then gemm moves on to the next R rows; the cursor points at what the tile
 * (or the next ones) will read PF_DIST bytes of total progress from now, i.e. PF_DIST / R bytes
 * further along every row, continuing into the following tiles' rows. 8 KB measured best on a
 * Zen 5 (1 KB reached half the bandwidth). Into L2 (prefetcht1): on a Zen 4 VM prefetching into L1
 * stalled on its miss buffers and halved a one-token decode step beside a busy core. */
#define PF_DIST 8192

typedef struct {
    const uint8_t *row;  /* row 0 of the tile being prefetched */
    size_t off;          /* offset in its rows */
    size_t row_len;      /* bytes of row data */
    size_t tile_stride;  /* R * ldw: the next tile */
} pf_cursor;

static inline pf_cursor pf_start(const uint8_t *w, size_t ldw, int R, size_t row_len) {
    const size_t ahead = PF_DIST / (size_t)R;
    pf_cursor p = {w, ahead, row_len, (size_t)R * ldw};
    if (row_len) {
        p.row += ahead / row_len * p.tile_stride;
        p.off = ahead % row_len;
    }
    return p;
}

/* prefetch `bytes` more of every row, then advance */
static inline void pf_step(pf_cursor *p, int R, size_t ldw, size_t bytes) {
    for (int r = 0; r < R; r++)
        for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p->row + (size_t)r * ldw + p->off + o, 0, 2);
    p->off += bytes;
    while (p->off >= p->row_len && p->row_len) {
        p->off -= p->row_len;
        p->row += p->tile_stride;
    }
}

/* the bytes of the span ahead a row tile prefetches per block: whole lines, the span in nb steps
 * (a step of its own per block, span * b / nb, took two 64-bit divisions a block: Q4_1 K 576,
 * 1536 rows, 4 columns 42 -> 37 us a call without them) */
static inline size_t lrt_pf_bytes(size_t span, int nb) { return (span + (size_t)nb * 64 - 1) / ((size_t)nb * 64) * 64; }

/* one-column legacy matvec tiles (AVX-512 and AVX2's lone_tile): rows a tile, and tiles ahead
 * whose rows are prefetched */
#define L1_R 8
#define L1_PF 4

/* ------------------------------------------------------------------------------------------ */
/* tiling: gemm splits its rows x columns into tiles of RT x CT (then 1 x CT for leftover rows);
 * the leftover columns (fewer than CT) form one more group, RT x C and 1 x C, or RT1 x 1 and 1 x 1
 * when a single column is left, so a batch of 2 or 3 rows reads and unpacks each weight block once,
 * not once per row. The tile kernels do the same work per (row, column) whatever the tile size. */

typedef void (*tile_fn)(int n, const uint8_t *w, size_t ldw, int R, const uint8_t *a, size_t lda,
                        int C, float *out, size_t ldo);

/* The body of a tile function: a specialised copy of CALL(X, R, C) for each shape gemm_tiles asks
 * for (R in RT or 1, C in 1..CT; RT1 or 1 rows for a single column). X is passed through (the
 * kernel's type, or a parenthesised list opened with EL_UNPAREN); CT is at most 4. */
#define EL_UNPAREN(...) __VA_ARGS__
#define TILE_SHAPES(CALL, X, RT, CT, RT1, R, C)                               \
    do {                                                                      \
        if ((C) == (CT)) {                                                    \
            if ((R) == (RT)) CALL(X, RT, CT); else CALL(X, 1, CT);            \
        } else if ((CT) > 3 && (C) == 3) {                                    \
            if ((R) == (RT)) CALL(X, RT, 3); else CALL(X, 1, 3);              \
        } else if ((CT) > 2 && (C) == 2) {                                    \
            if ((R) == (RT)) CALL(X, RT, 2); else CALL(X, 1, 2);              \
        } else {                                                              \
            if ((R) == (RT1)) CALL(X, RT1, 1); else CALL(X, 1, 1);            \
        }                                                                     \
    } while (0)

static inline __attribute__((always_inline)) void gemm_tiles(tile_fn tile, const int RT, const int CT,
                                                             const int RT1, int n, const void *w, size_t ldw,
                                                             int nr, const void *a, size_t lda, int nc,
                                                             float *out, size_t ldo) {
    const uint8_t *W = w, *A = a;
    for (int c = 0; c < nc; c += CT) {
        const int C = EL_MIN(CT, nc - c), R = C == 1 ? RT1 : RT;
        int r = 0;
        for (; r + R <= nr; r += R) tile(n, W + r * ldw, ldw, R, A + c * lda, lda, C, out + c * ldo + r, ldo);
        for (; r < nr; r++) tile(n, W + r * ldw, ldw, 1, A + c * lda, lda, C, out + c * ldo + r, ldo);
    }
}

/* bytes per block of a legacy type (Q8_0 otherwise) and of a K-quant (Q6_K otherwise) */
static inline int legacy_block_bytes(int type) {
    switch (type) {
    case EL_Q4_0: return sizeof(block_q4_0);
    case EL_Q4_1: return sizeof(block_q4_1);
    case EL_Q5_0: return sizeof(block_q5_0);
    case EL_Q5_1: return sizeof(block_q5_1);
    default: return sizeof(block_q8_0);
    }
}

static inline int kquant_block_bytes(int type) {
    switch (type) {
    case EL_Q2_K: return sizeof(block_q2_K);
    case EL_Q3_K: return sizeof(block_q3_K);
    case EL_Q4_K: return sizeof(block_q4_K);
    case EL_Q5_K: return sizeof(block_q5_K);
    case EL_IQ4_XS: return sizeof(block_iq4_xs);
    default: return sizeof(block_q6_K);
    }
}

#endif
