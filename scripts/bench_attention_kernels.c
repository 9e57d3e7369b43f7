/* The attention kernels of a one-token decode step (vops.qk_tile_one, vops.pv_tiles with four lane
 * sets), alone on one thread, over f16 K/V tiles laid out as the engine's cache lays out one
 * layer (block b, kv head h at (b * n_kv + h) * 2 KB: a head's tiles 2 KB long, n_kv * 2 KB apart),
 * next to a plain read of the same tiles and of the same bytes in sequence. With one layer of a
 * few tiles the data sit in L2 (the kernels' compute cost); with many layers, in DRAM.
 * Thread CPU time, best of 3 sweeps; ns per tile (16 keys x n_q queries, hk = hv = 64).
 *
 * Build against the objects of a development build (python csrc/build_ffi.py), then run:
 *   gcc -O2 -Icsrc -o /tmp/bak scripts/bench_attention_kernels.c \
 *       $(find build/ffi -name '*.o' ! -name '_kernels*') -lm -lpthread
 *   /tmp/bak [layers=32] [tiles=500] [n_kv=3] [n_q=3] [chunk=32] [isa=1]
 * (chunk: tiles per pv_tiles call, attention.c's CT; isa: 0 generic, 1 avx2, 2 avx512.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "el_internal.h"

#define HD 64

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float rand_half(void) { return el_half_to_float(el_float_to_half((float)(rand() % 2001 - 1000) / 997.0f)); }

int main(int argc, char **argv) {
    const int nl = argc > 1 ? atoi(argv[1]) : 32, nt = argc > 2 ? atoi(argv[2]) : 500;
    const int nkv = argc > 3 ? atoi(argv[3]) : 3, nq = argc > 4 ? atoi(argv[4]) : 3;
    const int chunk = argc > 5 ? atoi(argv[5]) : 32, isa = argc > 6 ? atoi(argv[6]) : 1;
    if (nl < 1 || nt < 1 || nkv < 1 || nq < 1 || nq > 8 || chunk < 1 || chunk > 64) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    el_set_isa(isa);
    const size_t tile = (size_t)HD * 16, layer = (size_t)nt * nkv * tile;  /* halves */
    /* K, V: the kernels' inputs; R, S: as many bytes again for the reads (each byte read once a sweep) */
    el_half *K = malloc(sizeof(el_half) * layer * nl), *V = malloc(sizeof(el_half) * layer * nl);
    el_half *R = malloc(sizeof(el_half) * layer * nl), *S = malloc(sizeof(el_half) * layer * nl);
    float *q = malloc(sizeof(float) * nq * HD), *w = malloc(sizeof(float) * nq * 64 * 16);
    float *acc = calloc((size_t)nq * 4 * HD * 16, sizeof(float)), out[8 * 16];
    if (!K || !V || !R || !S || !q || !w || !acc) return 1;
    for (size_t i = 0; i < layer * nl; i++) K[i] = V[i] = R[i] = S[i] = el_float_to_half(rand_half());
    for (int i = 0; i < nq * HD; i++) q[i] = rand_half();
    for (int i = 0; i < nq * 64 * 16; i++) w[i] = rand_half() * 0.01f + 0.5f;
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    volatile uint64_t sink = 0;
    for (int sweep = 0; sweep < 4; sweep++) {  /* sweep 0 warms up */
        double t[4] = {0, 0, 0, 0};
        for (int l = 0; l < nl; l++)
            for (int h = 0; h < nkv; h++) {
                const el_half *Kl = K + l * layer + h * tile, *Vl = V + l * layer + h * tile;
                double t0 = cpu_now();
                for (int b = 0; b < nt; b++) el_vops.qk_tile_one(HD, q, nq, HD, Kl + (size_t)b * nkv * tile, out);
                double t1 = cpu_now();
                for (int b = 0; b < nt; b += chunk) {
                    const el_half *vt[64];
                    const int n = EL_MIN(chunk, nt - b);
                    for (int u = 0; u < n; u++) vt[u] = Vl + (size_t)(b + u) * nkv * tile;
                    el_vops.pv_tiles(HD, n, vt, nq, w, 64 * 16, acc, 4 * HD * 16, 4, b);
                }
                double t2 = cpu_now();
                uint64_t s = 0;
                for (int b = 0; b < nt; b++) {  /* the same tiles, read */
                    const uint64_t *p = (const uint64_t *)(R + l * layer + h * tile + (size_t)b * nkv * tile);
                    for (size_t i = 0; i < tile / 4; i += 4) s += p[i] ^ p[i + 1] ^ p[i + 2] ^ p[i + 3];
                }
                double t3 = cpu_now();
                const uint64_t *p = (const uint64_t *)(S + l * layer + h * (layer / nkv));  /* as many bytes, in sequence */
                for (size_t i = 0; i < (size_t)nt * tile / 4; i += 4) s += p[i] ^ p[i + 1] ^ p[i + 2] ^ p[i + 3];
                double t4 = cpu_now();
                sink += s;
                t[0] += t1 - t0, t[1] += t2 - t1, t[2] += t3 - t2, t[3] += t4 - t3;
            }
        for (int i = 0; sweep && i < 4; i++) best[i] = t[i] < best[i] ? t[i] : best[i];
    }
    const double tiles = (double)nl * nkv * nt, bytes = 2.0 * tile;
    const char *name[4] = {"qk_tile_one", "pv_tiles (4 sets)", "read, tiles", "read, in sequence"};
    printf("%d layers x %d kv heads x %d tiles (%.1f MB of K), %d queries per kv head, chunk %d, isa %d\n", nl, nkv, nt,
           tiles * bytes / 1e6, nq, chunk, el_get_isa());
    for (int i = 0; i < 4; i++)
        printf("  %-18s %8.1f ns/tile  %6.2f GB/s\n", name[i], best[i] / tiles * 1e9, tiles * bytes / best[i] / 1e9);
    return (int)(sink & 0);
}
