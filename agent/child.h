/* The wrapped training command (`ckptd watch DIR -- COMMAND...`): started in
 * its own process group with default signal handling, signals forwarded to
 * the group, SIGKILL after the grace period, reaped with its exit code. */
#ifndef CK_CHILD_H
#define CK_CHILD_H

#include <stdbool.h>
#include <sys/types.h>

struct ck_child {
    pid_t pid;    /* 0: none, or reaped */
    bool started; /* it was started (and may have ended since) */
    int code;     /* its exit code once reaped (128+N for signal N) */
};

/* Starts argv (NULL-terminated, looked up in PATH). */
int ck_child_spawn(struct ck_child *c, char *const *argv);
/* Forwards sig to its process group (logged). */
void ck_child_signal(struct ck_child *c, int sig);
/* It did not exit within grace seconds of the signal: SIGKILL (logged). */
void ck_child_kill(struct ck_child *c, double grace);
/* true when it has exited (code set, logged); does not wait. */
bool ck_child_reap(struct ck_child *c);
/* SIGTERM to the group and wait, when it still runs (the watcher failed). */
void ck_child_end(struct ck_child *c);

#endif
