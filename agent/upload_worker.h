/* Uploads for the watcher. Each round of the upload queue runs in a helper
 * process (agent/sender.h), so the watcher never waits on the network and
 * never keeps libcurl in memory. How each job ended comes back through the
 * helper's pipe and reaches on_outcome on the loop's thread, where it becomes
 * an upload.* event. */
#ifndef CK_UPLOAD_WORKER_H
#define CK_UPLOAD_WORKER_H

#include "agent/config.h"
#include "agent/loop.h"
#include "agent/nodecommit.h"
#include "agent/nodes.h"
#include "agent/state.h"
#include "stores/uploader.h"

#include <stdbool.h>

struct ck_upload_worker;

typedef void (*ck_upload_outcome_fn)(void *arg, const struct ck_upload_outcome *o);

/* What the worker tells the watcher, on the loop's thread. */
struct ck_upload_worker_calls {
    ck_upload_outcome_fn on_outcome; /* a job ended */
    ck_node_commit_fn on_commit;     /* a node of several committed a step */
    void *arg;
};

/* For cfg's upload.stores (cfg must outlive the worker). dir is the PMF
 * root, st the watcher's state (its connection is closed around each fork).
 * nodes: a node of several (count > 1) sends its part of each step and
 * commits complete steps (agent/nodecommit.h) in place of the tree, and
 * looks again for the parts its steps wait for (1 s to 60 s apart); NULL or
 * a single node: the tree. Nothing runs until the first kick. */
int ck_upload_worker_start(struct ck_upload_worker **out, const struct ck_config *cfg,
                           const char *dir, struct ck_state *st, struct ck_loop *loop,
                           const struct ck_nodes *nodes, const struct ck_upload_worker_calls *calls);
/* The tree changed: queue what is new (metadata.yaml last) and send it. */
void ck_upload_worker_kick(struct ck_upload_worker *w);
/* Nothing left to do now: no round running or wanted (failures waiting for
 * their retry time do not count). */
bool ck_upload_worker_is_idle(const struct ck_upload_worker *w);
/* Outside the loop: drives the rounds, waiting at most timeout_ms. */
void ck_upload_worker_pump(struct ck_upload_worker *w, int timeout_ms);
/* No more rounds: in-flight transfers get grace seconds (then the helper is
 * killed); what is not sent stays queued for the next start. */
void ck_upload_worker_stop(struct ck_upload_worker *w, double grace);
/* Stops (if not yet) and frees. NULL is fine. */
void ck_upload_worker_free(struct ck_upload_worker *w);

#endif
