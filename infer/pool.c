/* The engine's thread pool (pool.h): one job at a time, published under a
 * mutex with a generation number; each worker takes its own part by index,
 * so no part is computed twice or left out whatever the scheduling. */
#include "infer/pool.h"
#include "infer/infer.h"
#include "common/error.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#define POOL_MAX_THREADS CK_INFER_MAX_THREADS

struct ck_pool {
    int threads;
    pthread_t tid[POOL_MAX_THREADS];
    int started;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    uint64_t gen;   /* the job's number; a worker runs each number once */
    int pending;    /* parts of the job not finished yet */
    bool stop;
    /* the job */
    ck_pool_fn fn;
    void *arg;
    int64_t n, grain;
    int parts;
};

struct worker {
    struct ck_pool *p;
    int index;
};

static void part(const struct ck_pool *p, int t, int64_t *lo, int64_t *hi)
{
    int64_t units = (p->n + p->grain - 1) / p->grain;
    *lo = units * t / p->parts * p->grain;
    *hi = t + 1 == p->parts ? p->n : units * (t + 1) / p->parts * p->grain;
    if (*hi > p->n)
        *hi = p->n;
    if (*lo > *hi)
        *lo = *hi;
}

static void *worker_main(void *arg)
{
    struct worker w = *(struct worker *)arg;
    struct ck_pool *p = w.p;
    uint64_t seen = 0;
    free(arg);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen)
            pthread_cond_wait(&p->work, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        if (w.index >= p->parts)
            continue;
        pthread_mutex_unlock(&p->mu);
        int64_t lo, hi;
        part(p, w.index, &lo, &hi);
        if (lo < hi)
            p->fn(p->arg, lo, hi);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int ck_pool_new(int threads, struct ck_pool **out)
{
    *out = NULL;
    if (threads <= 1)
        return 0;
    if (threads > POOL_MAX_THREADS)
        return ck_error(CK_ESIZE, "%d threads: at most %d", threads, POOL_MAX_THREADS);
    struct ck_pool *p = calloc(1, sizeof *p);
    if (!p)
        return ck_error(CK_ENOMEM, "out of memory for the thread pool");
    p->threads = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int t = 1; t < threads; t++) {
        struct worker *w = malloc(sizeof *w);
        int rc = w ? 0 : -1;
        if (w) {
            *w = (struct worker){p, t};
            if ((rc = pthread_create(&p->tid[p->started], NULL, worker_main, w)) != 0)
                free(w);
        }
        if (rc != 0) {
            ck_pool_free(p);
            return ck_error(CK_EIO, "cannot start thread %d of %d of the engine", t + 1, threads);
        }
        p->started++;
    }
    *out = p;
    return 0;
}

void ck_pool_free(struct ck_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int t = 0; t < p->started; t++)
        pthread_join(p->tid[t], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int ck_pool_threads(const struct ck_pool *p)
{
    return p ? p->threads : 1;
}

void ck_pool_for(struct ck_pool *p, int64_t n, int64_t grain, ck_pool_fn fn, void *arg)
{
    if (grain < 1)
        grain = 1;
    int64_t units = (n + grain - 1) / grain;
    int parts = p ? (units < p->threads ? (int)units : p->threads) : 1;
    if (parts <= 1) {
        if (n > 0)
            fn(arg, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->grain = grain;
    p->parts = parts;
    p->pending = parts - 1;
    p->gen++;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    int64_t lo, hi;
    part(p, 0, &lo, &hi);
    if (lo < hi)
        fn(arg, lo, hi);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
