/* ckptd watch: the sidecar. Keeps DIR's PMF tree current while training
 * runs: every change notice (agent/fswatch.h) goes through the settle
 * tracker (agent/settle.h), and once something settled, one idempotent
 * pass (agent/scan.h) registers what is complete. One event loop
 * (agent/loop.h) over inotify, signalfd, timerfds and whatever other modules
 * register (the ops endpoint).
 *
 * Signals: SIGTERM/SIGINT stop (forwarded to the wrapped command's process
 * group, which gets grace_period before SIGKILL); SIGHUP reloads the config
 * (parsed fully, then swapped; a bad one is logged and the old one kept) and
 * is forwarded too; SIGCHLD reaps the wrapped command.
 *
 * Requests: `ckptd status DIR --finished|--failed` reaches a running watcher
 * through the control channel (agent/control.h). */
#ifndef CK_WATCH_H
#define CK_WATCH_H

#include "agent/config.h"

#include <stdbool.h>
#include <stddef.h>

struct ck_nodes;

struct ck_watch_opts {
    const char *dir;
    const char *config_path;  /* --config, or NULL: DIR/ckptd.yaml when present */
    /* --log-format and -v/-q (negative: not given), applied over the config
     * again after a reload */
    int log_format, log_level;
    /* flags over the config (--settle, --listen, ...), applied again after a reload */
    const struct ck_config_override *overrides;
    size_t noverrides;
    char *const *command;     /* NULL-terminated argv of the training command, or NULL */
    /* which node of a multi-node training this is (agent/nodes.h), resolved
     * at the start and kept across reloads; NULL: a single node */
    const struct ck_nodes *nodes;
};

/* Flags over a freshly loaded config. */
int ck_watch_apply_flags(const struct ck_watch_opts *o, struct ck_config *cfg);
/* The watch: keys' own rules (CK_ECONFIG naming the key). */
int ck_watch_check_config(const struct ck_config *cfg);

/* Runs the watcher until SIGTERM/SIGINT, the end of the training, or the
 * wrapped command's exit. cfg is taken over (released here). Returns the
 * process exit code: the command's (128+N for signal N) when there is one.
 * *failed gets 0, or the error that stopped the watcher (its message is the
 * thread's current one, for the command layer to print). */
int ck_watch_run(const struct ck_watch_opts *o, struct ck_config *cfg, int *failed);

#endif
