/* Persistent thread pool: workers spin briefly for the next task, then sleep on a condition
 * variable, so an idle model costs no CPU while a decode loop pays no wake-up latency.
 * One el_pool_run per forward pass; the phases inside it are separated by spin barriers. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sched.h>
#include "el_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define EL_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define EL_PAUSE() __asm__ __volatile__("yield")
#else
#define EL_PAUSE() ((void)0)
#endif

#define SPIN_BEFORE_SLEEP (1 << 16)

typedef struct {
    el_pool *pool;
    int ith;
} worker_arg;

struct el_pool {
    int n;
    pthread_t *threads;
    worker_arg *args;
    el_task_fn fn;
    void *arg;
    atomic_int gen;        /* bumped for every task */
    atomic_int n_done;     /* workers finished with the current task */
    atomic_int stop;
    atomic_int n_sleeping;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* barrier */
    atomic_int bar_count;
    atomic_int bar_phase;
};

static void *worker_main(void *p) {
    worker_arg *wa = p;
    el_pool *pool = wa->pool;
    int seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&pool->gen, memory_order_acquire) == seen &&
               !atomic_load_explicit(&pool->stop, memory_order_acquire)) {
            if (++spins < SPIN_BEFORE_SLEEP) { EL_PAUSE(); continue; }
            pthread_mutex_lock(&pool->mu);
            atomic_fetch_add(&pool->n_sleeping, 1);
            while (atomic_load(&pool->gen) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv, &pool->mu);
            atomic_fetch_sub(&pool->n_sleeping, 1);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) break;
        seen = atomic_load_explicit(&pool->gen, memory_order_acquire);
        pool->fn(pool->arg, wa->ith, pool->n);
        atomic_fetch_add_explicit(&pool->n_done, 1, memory_order_acq_rel);
    }
    return NULL;
}

el_pool *el_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    el_pool *pool = calloc(1, sizeof(el_pool));
    if (!pool) return NULL;
    pool->n = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    if (n_threads > 1) {
        pool->threads = calloc((size_t)n_threads, sizeof(pthread_t));
        pool->args = calloc((size_t)n_threads, sizeof(worker_arg));
        if (!pool->threads || !pool->args) { el_pool_free(pool); return NULL; }
        for (int i = 1; i < n_threads; i++) {
            pool->args[i].pool = pool;
            pool->args[i].ith = i;
            if (pthread_create(&pool->threads[i], NULL, worker_main, &pool->args[i]) != 0) {
                pool->n = i;  /* join only what started */
                el_pool_free(pool);
                return NULL;
            }
        }
    }
    return pool;
}

void el_pool_free(el_pool *pool) {
    if (!pool) return;
    if (pool->threads) {
        pthread_mutex_lock(&pool->mu);
        atomic_store(&pool->stop, 1);
        pthread_cond_broadcast(&pool->cv);
        pthread_mutex_unlock(&pool->mu);
        for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    }
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    free(pool->threads);
    free(pool->args);
    free(pool);
}

int el_pool_size(const el_pool *pool) { return pool->n; }

void el_pool_run(el_pool *pool, el_task_fn fn, void *arg) {
    if (pool->n == 1) { fn(arg, 0, 1); return; }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->n_done, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->bar_count, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->gen, 1, memory_order_seq_cst);
    if (atomic_load(&pool->n_sleeping) > 0) {
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->cv);
        pthread_mutex_unlock(&pool->mu);
    }
    fn(arg, 0, pool->n);
    while (atomic_load_explicit(&pool->n_done, memory_order_acquire) != pool->n - 1) EL_PAUSE();
}

void el_pool_barrier(el_pool *pool) {
    if (pool->n == 1) return;
    int phase = atomic_load_explicit(&pool->bar_phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&pool->bar_count, 1, memory_order_acq_rel) == pool->n - 1) {
        atomic_store_explicit(&pool->bar_count, 0, memory_order_relaxed);
        atomic_store_explicit(&pool->bar_phase, phase + 1, memory_order_release);
    } else {
        int spins = 0;
        while (atomic_load_explicit(&pool->bar_phase, memory_order_acquire) == phase) {
            EL_PAUSE();
            if (++spins > (1 << 20)) { sched_yield(); spins = 0; }  /* oversubscribed machine */
        }
    }
}
