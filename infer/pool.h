/* A small fixed pool of threads for the engine's heavy kernels (`ckptd
 * verify --threads N`, `verify.threads`): made once with the engine, N - 1
 * workers beside the calling thread, blocked on a condition variable between
 * jobs (they never spin, so an idle pool costs no CPU). A job is a range
 * [0, n) cut into the same contiguous parts for the same n and thread count,
 * each part computed exactly as one thread would: the kernels split only
 * over independent outputs (channels, rows, elements), never a sum, so the
 * results are the same bits at any thread count. Not for callers outside
 * infer/. */
#ifndef CK_INFER_POOL_H
#define CK_INFER_POOL_H

#include <stdint.h>

struct ck_pool;

/* The part [lo, hi) of a job's range. */
typedef void (*ck_pool_fn)(void *arg, int64_t lo, int64_t hi);

/* A pool of threads threads in all (the caller counted: threads - 1 are
 * started); threads <= 1 gives *out = NULL, which every call below takes as
 * "run here". CK_ENOMEM or CK_EIO when a thread cannot be started. */
int ck_pool_new(int threads, struct ck_pool **out);
/* Stops and joins the workers; NULL is fine. */
void ck_pool_free(struct ck_pool *p);
/* Threads of p (1 for NULL). */
int ck_pool_threads(const struct ck_pool *p);

/* fn over [0, n): part t of threads is [n t / T, n (t + 1) / T) rounded to
 * a multiple of grain (the last part takes the rest), the caller computing
 * part 0; returns once every part is done. With one part (NULL pool, or n
 * under two grains) fn(arg, 0, n) runs here. */
void ck_pool_for(struct ck_pool *p, int64_t n, int64_t grain, ck_pool_fn fn, void *arg);

#endif
