/* Persistent thread pool with hybrid waiting: every wait (a worker for its next task, the caller
 * for the workers to finish, a thread at a barrier) spins for a short, bounded time and then
 * sleeps on a condition variable, as llama.cpp's hybrid polling does. On an idle machine the
 * phases of a forward pass meet within the spin and pay no wake-up latency; when threads do not
 * each own a core (another program, more threads than cores), a waiting thread gives its core
 * away instead of spinning while the thread it waits for is not running, so the engine slows
 * down in proportion instead of collapsing.
 *
 * The pool also adapts how many of its threads take part in a run. A thread that is not running
 * when its peers reach a barrier makes them wait: when another program holds one of the cores,
 * two threads run at less than the speed of one. After every run the caller looks at the longest
 * time one of the threads spent waiting; when that is a large share of the run and the kernel
 * often took a core from the threads during it (involuntary context switches: another program
 * wanted it), twice in a row, the next runs use one thread fewer, and from time to time a run
 * tries one more again (the interval doubles while the cores stay busy). Waiting alone is not
 * enough: on a virtual machine the host stops a virtual CPU now and then, which makes a peer wait
 * just as long, but no thread of ours is switched out and fewer threads do not help (on a 2-vCPU
 * VM, deciding on waiting alone cut Gemma-3 decode from ~50 to 31-46 tok/s). Where the kernel
 * does not count a thread's switches (macOS), waiting alone decides. Which threads compute what
 * never changes a result (tasks split rows, never a sum), so this is a schedule only;
 * el_pool_set_adaptive(pool, 0) turns it off.
 *
 * Every waiter publishes that it sleeps (an atomic count) before re-checking its condition
 * under the mutex; every waker changes the condition first and then looks at the count, so a
 * wake-up is never lost. Both sides put a full fence between their store and their load: C11
 * promises that a sequentially consistent store and a later sequentially consistent load stay in
 * order, and x86 and arm64 hardware keep that promise, but qemu-user 7.2 running arm64 code on an
 * x86 host does not (it turns arm64's store-release / load-acquire pair into a plain store and
 * load, which x86 may reorder: a two-thread store-then-load test saw both loads miss both stores
 * in 4,150 of 200,000 rounds, 0 with the fence). There a waker could miss a sleeper that had just
 * missed its store, and the Raspberry Pi check hung with every thread asleep. */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* RUSAGE_THREAD */
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
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

/* A run's number and its thread count travel in one word, so a worker never pairs one run's
 * count with another run's task. */
#define NTH_BITS 10
#define NTH_MASK ((1u << NTH_BITS) - 1)
#define RUN_MASK ((1u << (31 - NTH_BITS)) - 1)

/* Adapting the thread count: runs shorter than ADAPT_MIN_RUN_NS say nothing (a wake-up alone is
 * tens of microseconds); a run is contended when some thread waited more than ADAPT_WAIT_PCT % of
 * it (an idle machine stays under 10 %: the threads' shares of a step differ by a row tile). */
#define ADAPT_MIN_RUN_NS 200000
#define ADAPT_WAIT_PCT 35
#define ADAPT_STREAK 2
/* ... and its threads were switched out at least once per ADAPT_SWITCH_NS of it. Measured on a
 * 2-vCPU VM, 2 threads, Gemma-3 decode steps of 17-50 ms: beside a busy loop 0.8-1.3 switches per
 * ms; alone 0-6 per step (under 0.3 per ms) even when the host's pauses made a thread wait 50-70 %
 * of a step. */
#define ADAPT_SWITCH_NS 2000000
#define PROBE_FIRST_NS 200000000LL
#define PROBE_MAX_NS 3200000000LL

/* time this thread spent waiting in the current run (at barriers; the caller also for the end) */
static _Thread_local int64_t tl_wait_ns;

/* Involuntary context switches of the calling thread so far; -1 where they are not counted. */
static long preemptions(void) {
#ifdef RUSAGE_THREAD
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) == 0) return ru.ru_nivcsw;
#endif
    return -1;
}

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
    int nth;               /* threads taking part in the current run */
    atomic_int ticket;     /* (run number << NTH_BITS) | nth, written for every run */
    atomic_int n_done;     /* workers finished with the current task */
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t task_cv;   /* workers: a new ticket or stop */
    pthread_cond_t done_cv;   /* caller: n_done reached n - 1 */
    pthread_cond_t bar_cv;    /* barrier: the phase moved */
    atomic_int task_sleepers, done_sleepers, bar_sleepers;
    atomic_int bar_count;
    atomic_int bar_phase;
    int64_t *wait_ns;      /* per thread, the current run */
    long *preempted;       /* per thread, involuntary switches in the current run (-1: unknown) */
    int adaptive, active, streak;
    int64_t probe_at, probe_gap;
    long long runs, reduced_runs;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}


/* The pool that started the latest run in this process. Two engines in one process (a target
 * and its draft model) take turns on the same cores: a worker idle-spinning for its own pool's
 * next run while the other pool's run needs the core only slows that run down (on a 2-core VM a
 * draft model's one-row step took 3.90 ms right after a target step against 3.06 ms after one of
 * its own), so an idle worker stops spinning as soon as another pool starts a run. */
static atomic_uintptr_t last_pool;

/* Spin until *v != val or spin_ns have passed, or (owner not NULL) another pool than owner starts
 * a run; returns whether *v changed. */
static int spin_while_equal(atomic_int *v, int val, int64_t spin_ns, const el_pool *owner) {
    if (atomic_load_explicit(v, memory_order_acquire) != val) return 1;
    const int64_t end = now_ns() + spin_ns;
    for (int i = 1;; i++) {
        EL_PAUSE();
        if (atomic_load_explicit(v, memory_order_acquire) != val) return 1;
        if ((i & 63) == 0 &&
            (now_ns() > end || (owner && atomic_load_explicit(&last_pool, memory_order_relaxed) != (uintptr_t)owner)))
            return 0;
    }
}

/* Sleep until *v != val (after a spin found it unchanged). */
static void sleep_while_equal(el_pool *p, atomic_int *v, int val, pthread_cond_t *cv, atomic_int *sleepers) {
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(sleepers, 1);
    atomic_thread_fence(memory_order_seq_cst);  /* the count is out before the condition is read */
    while (atomic_load(v) == val && !atomic_load(&p->stop)) pthread_cond_wait(cv, &p->mu);
    atomic_fetch_sub(sleepers, 1);
    pthread_mutex_unlock(&p->mu);
}

/* After the condition changed: wake whoever sleeps on it. */
static void wake(el_pool *p, pthread_cond_t *cv, atomic_int *sleepers) {
    atomic_thread_fence(memory_order_seq_cst);  /* the condition is out before the count is read */
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
    int spin = 1;  /* a worker left out of a run sleeps at once: its core is wanted elsewhere */
    for (;;) {
        if (!spin || !spin_while_equal(&p->ticket, seen, IDLE_SPIN_NS, p))
            sleep_while_equal(p, &p->ticket, seen, &p->task_cv, &p->task_sleepers);
        if (atomic_load(&p->stop)) break;
        seen = atomic_load(&p->ticket);
        const int nth = seen & (int)NTH_MASK;
        spin = wa->ith < nth;
        if (!spin) continue;
        tl_wait_ns = 0;
        const long sw = p->adaptive ? preemptions() : -1;
        p->fn(p->arg, wa->ith, nth);
        p->wait_ns[wa->ith] = tl_wait_ns;
        p->preempted[wa->ith] = sw < 0 ? -1 : preemptions() - sw;
        if (atomic_fetch_add(&p->n_done, 1) == nth - 2) {
            /* the last worker: the caller may be asleep on n_done (it waits on the count, which
             * has a value it cannot see again until the next task) */
            wake(p, &p->done_cv, &p->done_sleepers);
        }
    }
    return NULL;
}

el_pool *el_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > (int)NTH_MASK) n_threads = (int)NTH_MASK;
    el_pool *pool = calloc(1, sizeof(el_pool));
    if (!pool) return NULL;
    pool->n = pool->active = n_threads;
    pool->probe_gap = PROBE_FIRST_NS;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->task_cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    pthread_cond_init(&pool->bar_cv, NULL);
    if (n_threads > 1) {
        pool->threads = calloc((size_t)n_threads, sizeof(pthread_t));
        pool->args = calloc((size_t)n_threads, sizeof(worker_arg));
        pool->wait_ns = calloc((size_t)n_threads, sizeof(int64_t));
        pool->preempted = calloc((size_t)n_threads, sizeof(long));
        if (!pool->threads || !pool->args || !pool->wait_ns || !pool->preempted) {
            el_pool_free(pool);
            return NULL;
        }
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
    free(pool->wait_ns);
    free(pool->preempted);
    free(pool);
}

int el_pool_size(const el_pool *pool) { return pool->n; }

void el_pool_set_adaptive(el_pool *pool, int on) {
    pool->adaptive = on != 0;
    pool->active = pool->n;
    pool->streak = 0;
    pool->probe_gap = PROBE_FIRST_NS;
}

void el_pool_stats(const el_pool *pool, int *active, long long *runs, long long *reduced_runs) {
    *active = pool->adaptive ? pool->active : pool->n;
    *runs = pool->runs;
    *reduced_runs = pool->reduced_runs;
}

/* After a run of nth threads that took t1 - t0: use fewer threads after contended runs, more
 * after a probe that was not. */
static void adapt(el_pool *p, int nth, int probe, int64_t t0, int64_t t1) {
    if (nth == 1 || t1 - t0 < ADAPT_MIN_RUN_NS) return;  /* no peer to wait for, or too short */
    int64_t w = 0;
    long sw = 0;
    for (int i = 0; i < nth; i++) {
        w = EL_MAX(w, p->wait_ns[i]);
        sw = p->preempted[i] < 0 || sw < 0 ? -1 : sw + p->preempted[i];
    }
    const int contended =
        w * 100 > (t1 - t0) * ADAPT_WAIT_PCT && (sw < 0 || (int64_t)sw * ADAPT_SWITCH_NS >= t1 - t0);
    if (probe) {
        if (contended) p->probe_gap = EL_MIN(2 * p->probe_gap, PROBE_MAX_NS);
        else { p->active = nth; p->probe_gap = PROBE_FIRST_NS; p->streak = 0; }
        p->probe_at = t1 + p->probe_gap;
        return;
    }
    p->streak = contended ? p->streak + 1 : 0;
    if (p->streak >= ADAPT_STREAK) {
        p->active = nth - 1;
        p->streak = 0;
        p->probe_gap = PROBE_FIRST_NS;
        p->probe_at = t1 + p->probe_gap;
    }
}

void el_pool_run(el_pool *pool, el_task_fn fn, void *arg) {
    pool->runs++;
    if (atomic_load_explicit(&last_pool, memory_order_relaxed) != (uintptr_t)pool)
        atomic_store_explicit(&last_pool, (uintptr_t)pool, memory_order_relaxed);
    if (pool->n == 1) { pool->nth = 1; fn(arg, 0, 1); return; }
    const int64_t t0 = now_ns();
    int nth = pool->adaptive ? pool->active : pool->n;
    const int probe = nth < pool->n && t0 >= pool->probe_at;
    nth += probe;
    if (nth < pool->n) pool->reduced_runs++;
    if (nth == 1) { pool->nth = 1; fn(arg, 0, 1); return; }  /* the workers sleep on */
    pool->fn = fn;
    pool->arg = arg;
    pool->nth = nth;
    atomic_store(&pool->n_done, 0);
    atomic_store(&pool->bar_count, 0);
    /* the run number wraps within 21 bits, so the word stays a non-negative int */
    const unsigned run = (((unsigned)atomic_load(&pool->ticket) >> NTH_BITS) + 1) & RUN_MASK;
    atomic_store(&pool->ticket, (int)(run << NTH_BITS | (unsigned)nth));
    wake(pool, &pool->task_cv, &pool->task_sleepers);
    tl_wait_ns = 0;
    const long sw = pool->adaptive ? preemptions() : -1;
    fn(arg, 0, nth);
    /* wait for n_done == nth - 1: spin on its value, sleep once the spin runs out */
    const int64_t tw = now_ns();
    for (;;) {
        const int done = atomic_load(&pool->n_done);
        if (done == nth - 1) break;
        if (!spin_while_equal(&pool->n_done, done, BARRIER_SPIN_NS, NULL)) {
            pthread_mutex_lock(&pool->mu);
            atomic_fetch_add(&pool->done_sleepers, 1);
            atomic_thread_fence(memory_order_seq_cst);
            while (atomic_load(&pool->n_done) != nth - 1) pthread_cond_wait(&pool->done_cv, &pool->mu);
            atomic_fetch_sub(&pool->done_sleepers, 1);
            pthread_mutex_unlock(&pool->mu);
        }
    }
    const int64_t t1 = now_ns();
    pool->wait_ns[0] = tl_wait_ns + (t1 - tw);
    pool->preempted[0] = sw < 0 ? -1 : preemptions() - sw;
    if (pool->adaptive) adapt(pool, nth, probe, t0, t1);
}

void el_pool_barrier(el_pool *pool) {
    if (pool->nth <= 1) return;
    const int phase = atomic_load(&pool->bar_phase);
    if (atomic_fetch_add(&pool->bar_count, 1) == pool->nth - 1) {
        atomic_store(&pool->bar_count, 0);
        atomic_store(&pool->bar_phase, phase + 1);
        wake(pool, &pool->bar_cv, &pool->bar_sleepers);
        return;
    }
    const int64_t t = now_ns();
    if (!spin_while_equal(&pool->bar_phase, phase, BARRIER_SPIN_NS, NULL))
        sleep_while_equal(pool, &pool->bar_phase, phase, &pool->bar_cv, &pool->bar_sleepers);
    tl_wait_ns += now_ns() - t;
}
