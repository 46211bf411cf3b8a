/* The engine in a child process: a model that loops, exhausts memory or
 * crashes the engine costs the child, never the caller (the sidecar, or
 * `ckptd verify`). The child gets RLIMIT_CPU (the timeout, rounded up),
 * RLIMIT_AS (max_memory; not under AddressSanitizer, whose shadow memory
 * needs terabytes of address space), stdin and stdout on /dev/null, stderr
 * (for its log lines) and the write end of one pipe; every other descriptor
 * is closed. Results come back through the pipe and are checked as hostile
 * input. A wall-clock limit (three times the timeout, plus a second) covers a
 * child that blocks without using CPU. */
#ifndef CK_SANDBOX_H
#define CK_SANDBOX_H

#include "infer/infer.h"

#include <sys/resource.h>

#include <stddef.h>
#include <stdint.h>

enum ck_sandbox_status {
    CK_SANDBOX_OK = 0,
    CK_SANDBOX_FAILED,  /* the engine reported an error (message kept) */
    CK_SANDBOX_TIMEOUT, /* over its CPU time or wall-clock limit */
    CK_SANDBOX_MEMORY,  /* over its address-space limit */
    CK_SANDBOX_CRASHED, /* killed by a signal, or died without an answer */
};

/* "ok", "failed", "timeout", "memory", "crashed". */
const char *ck_sandbox_status_name(enum ck_sandbox_status s);

struct ck_sandbox_limits {
    uint64_t max_memory; /* bytes of address space; 0: no limit */
    double timeout;      /* seconds of CPU time; 0: no limit */
    const char *who;     /* what runs there, for messages ("the reader"); NULL: "the engine" */
};

/* The child's work: writes its answer to fd, returns 0 or an error code
 * (its message goes back to the parent). */
typedef int (*ck_sandbox_fn)(void *arg, int fd);

/* Runs fn(arg, fd) in a child under lim. On CK_SANDBOX_OK, *answer (malloc'd,
 * owned by the caller) holds what the child wrote and *len its length (at
 * most max_answer); ru (may be NULL) the child's resource usage. Otherwise returns a negative code whose message names
 * the reason and the child's own message when it sent one. */
int ck_sandbox_call(ck_sandbox_fn fn, void *arg, const struct ck_sandbox_limits *lim,
                    uint64_t max_answer, unsigned char **answer, uint64_t *len,
                    enum ck_sandbox_status *status, struct rusage *ru);

/* fn(arg, fd) in a child with no resource limits, whose answer must be
 * exactly size bytes, copied into out. who names what runs there; a crash's
 * message is prefixed with 'path' (the file it was reading). For work that
 * parses a hostile file on behalf of the sidecar: a crash costs the child. */
int ck_sandbox_call_fixed(ck_sandbox_fn fn, void *arg, const char *who, const char *path,
                          void *out, size_t size);

/* What a sandboxed run measured. */
struct ck_infer_stats {
    unsigned runs;                   /* how many times the model ran */
    double median_s, min_s;          /* wall-clock seconds per run */
    double median_cpu_s;             /* CPU seconds of the engine's threads per run: what a
                                        run costs, also on a machine shared with other jobs */
    uint64_t peak_activation_bytes;  /* the memory plan's activations */
    uint64_t weight_bytes;           /* weights converted to float32 (not used in place) */
    uint64_t child_max_rss;          /* bytes: the child's peak resident memory */
};

/* ck_infer_new + ck_infer_run in the sandbox, repeat times (at least once;
 * for timing, the outputs are the last run's). *outputs as ck_infer_run's;
 * stats (may be NULL) says how long a run took and what memory it used. */
int ck_infer_run_sandboxed(const struct ck_model *m, const struct ck_infer_options *o,
                           const struct ck_sandbox_limits *lim,
                           const struct ck_infer_array *inputs, size_t ninputs, unsigned repeat,
                           struct ck_infer_array **outputs, size_t *noutputs,
                           enum ck_sandbox_status *status, struct ck_infer_stats *stats);

#endif
