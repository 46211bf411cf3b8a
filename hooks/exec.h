/* Exec hooks: a local command run for an event, with the event's fields as
 * CKPTD_* environment variables and its JSON on stdin.
 *
 * The command is started with posix_spawnp (no shell: argv as given) in its
 * own process group, with the default signal mask and dispositions. Its
 * stdout and stderr go into the log, one line per log entry, bounded. At the
 * timeout the group gets SIGTERM, and SIGKILL a grace period later. Nothing
 * here blocks: the daemon's event loop polls the fds ck_exec_poll_fds gives
 * and calls ck_exec_step when one is ready or the deadline passes; scan
 * mode uses the blocking ck_exec_wait. */
#ifndef CK_EXEC_H
#define CK_EXEC_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bounds on what a hook can make us hold or log. */
#define CK_EXEC_OUTPUT_MAX (64 * 1024) /* bytes of output logged per run; the rest is dropped */
#define CK_EXEC_LINE_MAX 1024          /* a longer line is logged in pieces */
#define CK_EXEC_GRACE_S 5.0            /* SIGTERM to SIGKILL */

struct ck_exec;

struct ck_exec_result {
    bool exited; /* exited normally with exit_code */
    int exit_code;
    int signal;     /* the signal that ended it, when !exited */
    bool timed_out; /* we ended it at the timeout */
    double seconds;
};

/* Starts argv (argv[0] searched on PATH) with envp (NULL-terminated
 * "K=V" strings, the whole environment) and stdin_data on stdin. name is
 * what the log calls it ("exec[0] checkpoint.registered"). On success *out
 * owns the running command: step it until it finishes, then free it. */
int ck_exec_start(const char *name, char *const *argv, char *const *envp, const char *stdin_data,
                  size_t stdin_len, double timeout, struct ck_exec **out);

/* The fds to poll (POLLIN/POLLOUT set in events), at most 3; returns how many. */
int ck_exec_poll_fds(const struct ck_exec *x, struct pollfd *out, int max);
/* Monotonic milliseconds (CLOCK_MONOTONIC) by which ck_exec_step must be
 * called even if no fd is ready (the timeout, the kill, or a wait poll). */
int64_t ck_exec_deadline_ms(const struct ck_exec *x);
/* Moves the command on without blocking: feeds stdin, logs output, applies
 * the timeout, reaps. Returns true once it has finished. */
bool ck_exec_step(struct ck_exec *x);
const char *ck_exec_name(const struct ck_exec *x);
bool ck_exec_is_done(const struct ck_exec *x);
/* Valid once done. */
const struct ck_exec_result *ck_exec_result(const struct ck_exec *x);
/* Blocks until done (bounded by the timeout plus the grace period). */
void ck_exec_wait(struct ck_exec *x);
/* Frees; a command still running has its group killed (SIGKILL) and reaped. */
void ck_exec_free(struct ck_exec *x);

#endif
