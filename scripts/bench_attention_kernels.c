/* The attention kernels of a one-token decode step (vops.qk_tile_one, vops.pv_tiles with four lane
 * sets), alone on one thread, over f16 K/V tiles laid out as the engine's cache lays out one
 * layer (engine_internal.h): a head's key tiles (2 KB at hk = 64) one after another, and its
 * values in groups of 32 dims, each group's tiles (1 KB) one after another; the keys of each head
 * are scored, then p.v taken a value group at a time (as one thread of a split step does), next to
 * a plain read of the same bytes in sequence. With one layer of a few tiles the data sit in L2
 * (the kernels' compute cost); with many layers, in DRAM. Thread CPU time, best of the sweeps; ns per
 * tile of keys and of values (16 slots x n_q queries, hk = hv = hd, 64 unless given).
 *
 * With a quantized cache type (ktype 8: q8_0, 2: q4_0, for keys and values) the keys are key tiles
 * (el_internal.h, 1088 / 576 bytes at hk = 64) scored by vops.qk_q8_0 / qk_q4_0, and the same
 * bytes are also scored as 16 rows by the type's weight gemm (how attention scored quantized keys
 * before the key tiles); the values are value tiles (el_internal.h, 544 / 288 bytes a group) summed
 * by vops.pv_q8_0 / pv_q4_0;
 * the read loop reads as many bytes as the key tiles.
 *
 * Build against the objects of a development build (python csrc/build_ffi.py), then run:
 *   gcc -O2 -Icsrc -o /tmp/bak scripts/bench_attention_kernels.c \
 *       $(find build/ffi -path '*csrc/*.o') -lm -lpthread
 *   /tmp/bak [layers=32] [tiles=500] [n_kv=3] [n_q=3] [chunk=32] [isa=1] [sweeps=3] [ktype=1] [hd=64] [pf=0] [hp=0] [vpf=1]
 * (chunk: tiles per pv_tiles call, attention.c's CT; with quantized values a divisor of EL_PV_CHUNK;
 * isa: 0 generic, 1 avx2, 2 avx512; ktype: 1 f16, 8 q8_0, 2 q4_0; hd: head dim of keys and values (a multiple of 32); pf: the key tile that
 * many ahead handed to the kernel to prefetch, as attention.c's job_scores does (0: none); hp: 1 =
 * K/V on 2 MB pages; vpf: 1 = f16 p.v handed the group's next chunk of tiles to prefetch, as
 * attention.c's job_pv does, 0 = none; on a busy machine, more sweeps of a hot run give a steadier best. Gemma-3-270M's
 * global layers at d = 30000: 3 1875 1 4 32 2 3 1 256 4; in L2: 1 24 1 4 32 2 20 1 256 0.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/mman.h>
#include "el_internal.h"

#define VG 32  /* dims of a value group */

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the K, V and read buffers: malloc'd (4 KB pages), or with hp on 2 MB pages where the kernel
 * gives them (MADV_HUGEPAGE) */
static uint8_t *buffer(size_t n, int hp) {
    if (!hp) return malloc(n);
    const size_t huge = (size_t)2 << 20;
    void *p = mmap(NULL, n + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1));
    madvise(a, n, MADV_HUGEPAGE);
    return a;
}

static float rand_half(void) { return el_half_to_float(el_float_to_half((float)(rand() % 2001 - 1000) / 997.0f)); }

int main(int argc, char **argv) {
    const int nl = argc > 1 ? atoi(argv[1]) : 32, nt = argc > 2 ? atoi(argv[2]) : 500;
    const int nkv = argc > 3 ? atoi(argv[3]) : 3, nq = argc > 4 ? atoi(argv[4]) : 3;
    const int chunk = argc > 5 ? atoi(argv[5]) : 32, isa = argc > 6 ? atoi(argv[6]) : 1;
    const int sweeps = argc > 7 ? atoi(argv[7]) : 3, kty = argc > 8 ? atoi(argv[8]) : EL_F16;
    const int HD = argc > 9 ? atoi(argv[9]) : 64, pf = argc > 10 ? atoi(argv[10]) : 0;
    const int hp = argc > 11 ? atoi(argv[11]) : 0, vpf = argc > 12 ? atoi(argv[12]) : 1;
    if (nl < 1 || nt < 1 || nkv < 1 || nq < 1 || nq > 8 || chunk < 1 || chunk > 256 || sweeps < 1 ||
        (kty != EL_F16 && kty != EL_Q8_0 && kty != EL_Q4_0) || HD < VG || HD % VG || pf < 0 ||
        (kty != EL_F16 && EL_PV_CHUNK % chunk)) {  /* (a pv_q call takes tiles of one chunk) */
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    el_set_isa(isa);
    const int qk = kty != EL_F16;
    const size_t tile = (size_t)HD * 16;  /* halves of an f16 tile */
    const size_t ktile = qk ? 16 * el_row_size(kty, HD) : 2 * tile;  /* bytes of a key tile */
    const size_t khead = (size_t)nt * ktile, klayer = (size_t)nkv * khead;
    /* K, V: the kernels' inputs; R: as many bytes as K for the read (each byte read once a sweep) */
    uint8_t *K = buffer(klayer * nl, hp), *R = buffer(klayer * nl, hp);
    /* values: groups of VG dims, a group's tile f16 [VG][16] or (a quantized cache) a value tile */
    const size_t vtile = qk ? 16 * el_row_size(kty, VG) : sizeof(el_half) * VG * 16;
    const size_t vhead = (size_t)nt * vtile * (HD / VG), vlayer = (size_t)nkv * vhead;
    uint8_t *V = buffer(vlayer * nl, hp);
    float *q = malloc(sizeof(float) * nq * HD), *w = malloc(sizeof(float) * nq * 256 * 16);
    float *acc = calloc((size_t)nq * 4 * VG * 16, sizeof(float)), out[8 * 16];
    uint8_t *qq = malloc((size_t)nq * el_row_size(EL_Q8_0, HD));
    int32_t *qsum = malloc(sizeof(int32_t) * nq * (HD / 32));
    if (!K || !V || !R || !q || !w || !acc || !qq || !qsum) return 1;
    for (size_t i = 0; i < vlayer * nl; i += 2) {
        const el_half h = el_float_to_half(rand_half());
        memcpy(V + i, &h, 2);
    }
    if (qk)  /* every scale (a value tile's first 16 halves) a small half */
        for (size_t t = 0; t < vlayer * nl / vtile; t++)
            for (int l = 0; l < 16; l++) {
                const el_half h = el_float_to_half(0.01f);
                memcpy(V + t * vtile + 2 * l, &h, 2);
            }
    for (size_t i = 0; i < klayer * nl; i += 2) {
        const el_half h = el_float_to_half(rand_half());
        memcpy(K + i, &h, 2);
        memcpy(R + i, &h, 2);
    }
    if (qk)  /* every scale a small half, the quants random */
        for (size_t t = 0; t < (size_t)nl * nkv * nt; t++)
            for (int i = 0; i < 16 * HD / 32; i++) {
                const el_half h = el_float_to_half(0.01f);
                memcpy(K + t * ktile + 2 * i, &h, 2);
            }
    for (int i = 0; i < nq * HD; i++) q[i] = rand_half();
    for (int j = 0; j < nq; j++) {
        el_traits[EL_Q8_0].from_float(q + j * HD, qq + j * el_row_size(EL_Q8_0, HD), HD);
        for (int b = 0; b < HD / 32; b++) {
            const block_q8_0 *qb = (const block_q8_0 *)(qq + j * el_row_size(EL_Q8_0, HD)) + b;
            qsum[j * (HD / 32) + b] = 0;
            for (int i = 0; i < 32; i++) qsum[j * (HD / 32) + b] += qb->qs[i];
        }
    }
    for (int i = 0; i < nq * 256 * 16; i++) w[i] = rand_half() * 0.01f + 0.5f;
    /* the weight gemm of a quantized key type (the generic path has none: vec_dot rows only) */
    const int gemm = qk && el_traits[kty].gemm != NULL;
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    volatile uint64_t sink = 0;
    for (int sweep = 0; sweep <= sweeps; sweep++) {  /* sweep 0 warms up */
        double t[4] = {0, 0, 0, 0};
        for (int l = 0; l < nl; l++)
            for (int h = 0; h < nkv; h++) {
                const uint8_t *Kh = K + l * klayer + h * khead;
                const uint8_t *Vh = V + l * vlayer + h * vhead;
                double t0 = cpu_now();
                for (int b = 0; b < EL_MIN(pf, nt); b++) el_prefetch_l2(Kh + (size_t)b * ktile, ktile);
                for (int b = 0; b < nt; b++) {  /* (as attention.c's job_scores) */
                    const uint8_t *next = pf && b + pf < nt ? Kh + (size_t)(b + pf) * ktile : NULL;
                    if (kty == EL_Q8_0) el_vops.qk_q8_0(HD, qq, el_row_size(EL_Q8_0, HD), qsum, nq, Kh + (size_t)b * ktile, out, next);
                    else if (kty == EL_Q4_0) el_vops.qk_q4_0(HD, qq, el_row_size(EL_Q8_0, HD), qsum, nq, Kh + (size_t)b * ktile, out, next);
                    else el_vops.qk_tile_one(HD, q, nq, HD, (const el_half *)(Kh + (size_t)b * ktile), out, (const el_half *)next);
                }
                double t1 = cpu_now();
                for (int g = 0; g < HD / VG; g++) {
                    const uint8_t *Vg = Vh + (size_t)g * nt * vtile;  /* the group's tiles */
                    for (int b = 0; b < nt; b += chunk) {
                        const uint8_t *vt[512];  /* this call's tiles, then (from 256) the next call's */
                        const int n = EL_MIN(chunk, nt - b);
                        for (int u = 0; u < n; u++) vt[u] = Vg + (size_t)(b + u) * vtile;
                        for (int u = 0; u < EL_MIN(chunk, nt - b - chunk); u++) vt[256 + u] = Vg + (size_t)(b + chunk + u) * vtile;
                        if (kty == EL_Q8_0) el_vops.pv_q8_0(n, vt, nq, w, 256 * 16, acc, VG);
                        else if (kty == EL_Q4_0) el_vops.pv_q4_0(n, vt, nq, w, 256 * 16, acc, VG);
                        else el_vops.pv_tiles(VG, n, (const el_half *const *)vt, nq, w, 256 * 16, acc, 4 * VG * 16, 4, b,
                                              vpf && b + chunk < nt ? (const el_half *const *)vt + 256 : NULL,
                                              EL_MIN(chunk, nt - b - chunk));
                    }
                }
                double t2 = cpu_now();
                uint64_t s = 0;
                const uint64_t *p = (const uint64_t *)(R + l * klayer + h * khead);  /* as many bytes, in sequence */
                for (size_t i = 0; i < khead / 8; i += 4) s += p[i] ^ p[i + 1] ^ p[i + 2] ^ p[i + 3];
                double t3 = cpu_now();
                sink += s;
                t[0] += t1 - t0, t[1] += t2 - t1, t[2] += t3 - t2;
            }
        for (int l = 0; gemm && l < nl; l++)  /* the same bytes as rows, through the weight gemm (its own pass) */
            for (int h = 0; h < nkv; h++) {
                const uint8_t *Kh = K + l * klayer + h * khead;
                const double g0 = cpu_now();
                for (int b = 0; b < nt; b++)
                    el_traits[kty].gemm(HD, Kh + (size_t)b * ktile, el_row_size(kty, HD), 16, qq,
                                        el_row_size(EL_Q8_0, HD), nq, out, 16);
                t[3] += cpu_now() - g0;
            }
        for (int i = 0; sweep && i < 4; i++) best[i] = t[i] < best[i] ? t[i] : best[i];
    }
    const double tiles = (double)nl * nkv * nt, bytes[4] = {(double)ktile, (double)vtile * (HD / VG), (double)ktile, (double)ktile};
    const char *name[4] = {kty == EL_Q8_0 ? "qk_q8_0" : kty == EL_Q4_0 ? "qk_q4_0" : "qk_tile_one",
                           kty == EL_Q8_0 ? "pv_q8_0" : kty == EL_Q4_0 ? "pv_q4_0" : "pv_tiles (4 sets)",
                           "read, in sequence", "rows, weight gemm"};
    printf("%d layers x %d kv heads x %d tiles (%.1f MB of K), hk = hv = %d, %d queries per kv head, chunk %d, isa %d, "
           "key prefetch %d tiles\n", nl, nkv, nt, tiles * bytes[0] / 1e6, HD, nq, chunk, el_get_isa(), pf);
    for (int i = 0; i < 3 + gemm; i++)
        printf("  %-18s %8.1f ns/tile  %6.2f GB/s\n", name[i], best[i] / tiles * 1e9, tiles * bytes[i] / best[i] / 1e9);
    return (int)(sink & 0);
}
