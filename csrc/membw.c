/* A plain read loop over a buffer, the yardstick for decode bandwidth (edgellm bench reports
 * the GB/s a decode step achieves next to this). */
#include <stdlib.h>
#include <time.h>
#include "el_internal.h"

typedef struct {
    const uint8_t *p;
    size_t n;
    uint64_t sums[64];
} bw_args;

static void read_task(void *arg, int ith, int nth) {
    bw_args *a = arg;
    const size_t per = (a->n / 64 / (size_t)nth) * 64;
    const uint64_t *q = (const uint64_t *)(a->p + per * (size_t)ith);
    const size_t words = (ith == nth - 1 ? a->n - per * (size_t)ith : per) / 8;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 8 <= words; i += 8) {  /* one cache line per iteration, four chains */
        s0 += q[i] ^ q[i + 4];
        s1 += q[i + 1] ^ q[i + 5];
        s2 += q[i + 2] ^ q[i + 6];
        s3 += q[i + 3] ^ q[i + 7];
    }
    for (; i < words; i++) s0 += q[i];
    a->sums[ith & 63] = s0 + s1 + s2 + s3;
}

double el_read_bandwidth(const void *data, size_t nbytes, int n_threads, int reps) {
    el_pool *pool = el_pool_new(n_threads);
    if (!pool || nbytes < 64 * (size_t)n_threads) { el_pool_free(pool); return 0.0; }
    bw_args a = {data, nbytes, {0}};
    el_pool_run(pool, read_task, &a);  /* warm: page tables, caches of what fits */
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        el_pool_run(pool, read_task, &a);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (dt > 0 && nbytes / dt / 1e9 > best) best = nbytes / dt / 1e9;
    }
    el_pool_free(pool);
    return best;
}
