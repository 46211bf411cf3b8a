/* The wrapped training command (`ckptd watch DIR -- COMMAND...`): started in
 * its own process group with default signal handling, signals forwarded to
 * the group, SIGKILL after the grace period, reaped with its exit code. */
#ifndef CK_CHILD_H
#define CK_CHILD_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Longest line of the command's output logged as one record; a longer one
 * is logged in pieces of this size. */
#define CK_CHILD_LINE_MAX 16384

struct ck_child {
    pid_t pid;    /* 0: none, or reaped */
    bool started; /* it was started (and may have ended since) */
    int code;     /* its exit code once reaped (128+N for signal N) */
    /* capture: the read ends of its stdout and stderr (-1: not captured, or
     * at their end) and what was read of a line not ended yet */
    int out[2];
    char *partial[2];
    size_t npartial[2];
};

/* Starts argv (NULL-terminated, looked up in PATH). With capture, its stdout
 * and stderr are pipes the caller reads with ck_child_read (structured logs:
 * each line a command.output record); else it shares ours. Its environment
 * is ours with CKPTD_DIR (dir made absolute) and CKPTD_CONFIG (config made
 * absolute; removed when config is NULL: no config file is in use). */
int ck_child_spawn(struct ck_child *c, char *const *argv, bool capture, const char *dir,
                   const char *config);
/* Reads what stream (0 stdout, 1 stderr) has without blocking and logs each
 * complete line as command.output (line, stream). At the end of the stream
 * the last partial line is logged and the fd closed (out[stream] = -1):
 * returns false then. */
bool ck_child_read(struct ck_child *c, int stream);
/* Reads both streams to their end (after the command exited: its children may
 * still hold them, so this stops after timeout seconds). */
void ck_child_drain(struct ck_child *c, double timeout);
/* Forwards sig to its process group (logged). */
void ck_child_signal(struct ck_child *c, int sig);
/* It did not exit within grace seconds of the signal: SIGKILL (logged). */
void ck_child_kill(struct ck_child *c, double grace);
/* true when it has exited (its captured output read to the end, then the
 * code set and logged); does not wait for the exit itself. */
bool ck_child_reap(struct ck_child *c);
/* SIGTERM to the group and wait, when it still runs (the watcher failed). */
void ck_child_end(struct ck_child *c);

#endif
