/* Retention for the watcher (agent/retention.h). A pass is split in two: the
 * network half (the stores' copies checked: HEADs and read-backs) runs in a
 * helper process (agent/sender.h), so that the watcher never waits on a store
 * and never keeps libcurl; each checkpoint that checks out comes back through
 * the helper's pipe, and the local half (the record, metadata.yaml, the
 * files, checkpoint.deleted) runs on the loop's thread, where every other
 * write of metadata.yaml happens (ck_retention_apply applies the rules again
 * to the tree as it is then). */
#ifndef CK_RETENTION_WORKER_H
#define CK_RETENTION_WORKER_H

#include "agent/config.h"
#include "agent/loop.h"
#include "agent/retention.h"
#include "agent/state.h"

#include <stddef.h>

struct ck_retention_worker;

struct ck_retention_worker_cb {
    /* On the loop's thread: a checkpoint whose copies checked out. */
    void (*on_checked)(void *arg, const struct ck_retention_checked *c);
    /* On the loop's thread: a round ended; held checkpoints were kept (a
     * store failing, a copy missing), requeued copies were queued again. */
    void (*on_round)(void *arg, size_t held, size_t requeued);
    void *arg;
};

/* For cfg's retention keys (cfg must outlive the worker). dir is the PMF
 * root, st the watcher's state (its connection is closed around each fork).
 * Nothing runs until the first kick. */
int ck_retention_worker_start(struct ck_retention_worker **out, const struct ck_config *cfg,
                              const char *dir, struct ck_state *st, struct ck_loop *loop,
                              const struct ck_retention_worker_cb *cb);
/* A round is wanted (after an upload of metadata.yaml, or the interval). */
void ck_retention_worker_kick(struct ck_retention_worker *w);
/* Stops a running round (what it checked and did not report is checked
 * again next time: nothing is deleted by the helper) and frees. NULL is fine. */
void ck_retention_worker_free(struct ck_retention_worker *w);

#endif
