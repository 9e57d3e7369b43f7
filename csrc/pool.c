/* Persistent thread pool with hybrid waiting: every wait (a worker for its next task, the caller
 * for the workers to finish, a thread at a barrier) spins for a short, bounded time and then
 * sleeps on a condition variable, as llama.cpp's hybrid polling does. On an idle machine the
 * phases of a forward pass meet within the spin and pay no wake-up latency; when threads do not
 * each own a core (another program, more threads than cores), a waiting thread gives its core
 * away instead of spinning while the thread it waits for is not running, so the engine slows
 * down in proportion instead of collapsing.
 *
 * Every waiter publishes that it sleeps (an atomic count) before re-checking its condition
 * under the mutex; every waker changes the condition first and then looks at the count, so a
 * wake-up is never lost (all atomics are sequentially consistent). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include "el_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define EL_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define EL_PAUSE() __asm__ __volatile__("yield")
#else
#define EL_PAUSE() ((void)0)
#endif

/* How long a wait spins before it sleeps. Barriers of one decode step are a few microseconds
 * apart, so a spin of tens of microseconds covers them; between steps the caller runs Python
 * (sampling, scheduling) for longer, so workers may spin a little more there. */
#define BARRIER_SPIN_NS 50000
#define IDLE_SPIN_NS 500000

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
    pthread_mutex_t mu;
    pthread_cond_t task_cv;   /* workers: a new task (gen) or stop */
    pthread_cond_t done_cv;   /* caller: n_done reached n - 1 */
    pthread_cond_t bar_cv;    /* barrier: the phase moved */
    atomic_int task_sleepers, done_sleepers, bar_sleepers;
    atomic_int bar_count;
    atomic_int bar_phase;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spin until *v != val or spin_ns have passed; returns whether it changed. */
static int spin_while_equal(atomic_int *v, int val, int64_t spin_ns) {
    if (atomic_load_explicit(v, memory_order_acquire) != val) return 1;
    const int64_t end = now_ns() + spin_ns;
    for (int i = 1;; i++) {
        EL_PAUSE();
        if (atomic_load_explicit(v, memory_order_acquire) != val) return 1;
        if ((i & 63) == 0 && now_ns() > end) return 0;
    }
}

/* Sleep until *v != val (after a spin found it unchanged). */
static void sleep_while_equal(el_pool *p, atomic_int *v, int val, pthread_cond_t *cv, atomic_int *sleepers) {
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(sleepers, 1);
    while (atomic_load(v) == val && !atomic_load(&p->stop)) pthread_cond_wait(cv, &p->mu);
    atomic_fetch_sub(sleepers, 1);
    pthread_mutex_unlock(&p->mu);
}

static void wake(el_pool *p, pthread_cond_t *cv, atomic_int *sleepers) {
    if (atomic_load(sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(cv);
        pthread_mutex_unlock(&p->mu);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    el_pool *p = wa->pool;
    int seen = 0;
    for (;;) {
        if (!spin_while_equal(&p->gen, seen, IDLE_SPIN_NS)) sleep_while_equal(p, &p->gen, seen, &p->task_cv, &p->task_sleepers);
        if (atomic_load(&p->stop)) break;
        seen = atomic_load(&p->gen);
        p->fn(p->arg, wa->ith, p->n);
        if (atomic_fetch_add(&p->n_done, 1) == p->n - 2) {
            /* the last worker: the caller may be asleep on n_done (it waits on the count, which
             * has a value it cannot see again until the next task) */
            wake(p, &p->done_cv, &p->done_sleepers);
        }
    }
    return NULL;
}

el_pool *el_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    el_pool *pool = calloc(1, sizeof(el_pool));
    if (!pool) return NULL;
    pool->n = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->task_cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    pthread_cond_init(&pool->bar_cv, NULL);
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
        pthread_cond_broadcast(&pool->task_cv);
        pthread_mutex_unlock(&pool->mu);
        for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    }
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->task_cv);
    pthread_cond_destroy(&pool->done_cv);
    pthread_cond_destroy(&pool->bar_cv);
    free(pool->threads);
    free(pool->args);
    free(pool);
}

int el_pool_size(const el_pool *pool) { return pool->n; }

void el_pool_run(el_pool *pool, el_task_fn fn, void *arg) {
    if (pool->n == 1) { fn(arg, 0, 1); return; }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store(&pool->n_done, 0);
    atomic_store(&pool->bar_count, 0);
    atomic_fetch_add(&pool->gen, 1);
    wake(pool, &pool->task_cv, &pool->task_sleepers);
    fn(arg, 0, pool->n);
    /* wait for n_done == n - 1: spin on its value, sleep once the spin runs out */
    for (;;) {
        const int done = atomic_load(&pool->n_done);
        if (done == pool->n - 1) break;
        if (!spin_while_equal(&pool->n_done, done, BARRIER_SPIN_NS)) {
            pthread_mutex_lock(&pool->mu);
            atomic_fetch_add(&pool->done_sleepers, 1);
            while (atomic_load(&pool->n_done) != pool->n - 1) pthread_cond_wait(&pool->done_cv, &pool->mu);
            atomic_fetch_sub(&pool->done_sleepers, 1);
            pthread_mutex_unlock(&pool->mu);
        }
    }
}

void el_pool_barrier(el_pool *pool) {
    if (pool->n == 1) return;
    const int phase = atomic_load(&pool->bar_phase);
    if (atomic_fetch_add(&pool->bar_count, 1) == pool->n - 1) {
        atomic_store(&pool->bar_count, 0);
        atomic_store(&pool->bar_phase, phase + 1);
        wake(pool, &pool->bar_cv, &pool->bar_sleepers);
        return;
    }
    if (!spin_while_equal(&pool->bar_phase, phase, BARRIER_SPIN_NS))
        sleep_while_equal(pool, &pool->bar_phase, phase, &pool->bar_cv, &pool->bar_sleepers);
}
