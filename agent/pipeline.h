/* The pipeline: what a pass hands on, in order.
 *
 *   pass     ck_scan_run: register what is complete (agent/scan.h)
 *   events   checkpoint.registered, training.* (agent/notify.h), metrics
 *   pack     each newly registered checkpoint -> archives to upload (ck_pack_stages)
 *   verify   gates each archive before it is queued (ck_verify_stages)
 *   upload   queue the PMF tree and the archives, then send (agent/upload_round.h):
 *            here in the foreground (scan, status), or by a kick to the
 *            watcher's helper process (agent/upload_worker.h)
 *   retention  after a foreground upload: frees the local disk of what every
 *            store holds a checked copy of (agent/retention.h); the watcher runs
 *            it after its helper's uploads (agent/retention_worker.h)
 *
 * `ckptd scan`, the watcher and `ckptd status --finished/--failed` with no
 * watcher all go through ck_pipeline_pass, so a stage added here reaches every
 * way a checkpoint is registered. The stage tables are in agent/stages.c. */
#ifndef CK_PIPELINE_H
#define CK_PIPELINE_H

#include "agent/config.h"
#include "agent/retention.h"
#include "agent/scan.h"
#include "agent/state.h"
#include "hooks/hooks.h"
#include "stores/uploader.h"

#include <stdbool.h>
#include <stddef.h>

struct ck_upload_worker;
struct ck_nodes;

struct ck_pipeline {
    const struct ck_config *cfg; /* borrowed */
    const char *dir;             /* the model root */
    struct ck_state *st;         /* open, DIR's lock held */
    struct ck_hooks *hooks;      /* NULL: events feed the metrics only */
    /* The upload stage: NULL runs it here until the queue is empty; else the
     * watcher's helper gets a kick when metadata.yaml changed. */
    struct ck_upload_worker *uploads;
    /* A node of several (agent/nodes.h, count > 1) in the foreground: the
     * upload stage sends this node's part of each step and commits complete
     * steps in the store (agent/nodecommit.h) instead of the tree; NULL or a
     * single node: the tree, as before. */
    const struct ck_nodes *nodes;
    /* With a helper: the tree is queued here, in this pass, not by the
     * helper's next round. A watcher's final pass sets it: a hand-over may
     * end before the helper lists the tree again, and what is left behind
     * must be in the queue (counted, and sent by the next start), not only
     * on disk. */
    bool queue_tree_now;
    /* The events stage could not store an event (already logged): the
     * caller must not exit 0, so that a restart announces it (notify.c
     * announces at start what an earlier run left unannounced). */
    int events_err;
    /* Set by a foreground upload stage: it ran, its error, its report. */
    bool uploaded;
    int upload_err;
    struct ck_upload_report upload;
    /* A node of several: steps not committed for a conflict or a missing
     * object, and store operations that failed (each logged) */
    size_t nodes_refused, nodes_failed;
    /* What the pack and verify stages could not do (each logged where it
     * happened): checkpoints a format could not be packed for, archives or
     * tags that failed verification (held back or uploaded marked). A
     * one-shot command exits 1 when any is set (ck_pipeline_failed). */
    size_t pack_failed, verify_failed;
    /* The retention stage (agent/retention.h), after a foreground upload
     * stage: its error (logged) and what it did. */
    int retention_err;
    struct ck_retention_result retention;
};

/* An archive a pack stage made: a local file and the key it is uploaded as. */
struct ck_archive {
    char *path; /* owned */
    char *key;  /* owned: the remote name, relative to each store's prefix */
};

struct ck_archives {
    struct ck_archive *v;
    size_t n, cap;
};

int ck_archives_add(struct ck_archives *a, const char *path, const char *key);
void ck_archives_release(struct ck_archives *a);

/* A pack stage: turns one newly registered checkpoint (ref as registered in
 * DIR/metadata.yaml; its files are under DIR/data/checkpoints/) into
 * archives, appended to out. An error is logged (pipeline.pack_failed) and
 * the next stage still runs; the checkpoint stays registered. */
struct ck_pack_stage {
    const char *name;
    int (*pack)(struct ck_pipeline *p, const char *ref, struct ck_archives *out);
};

/* A verify stage: 0 lets the archive on to the upload; an error holds it
 * back (logged as pipeline.verify_failed, naming the archive and the stage). */
struct ck_verify_stage {
    const char *name;
    int (*verify)(struct ck_pipeline *p, const struct ck_archive *a);
};

/* In agent/stages.c; the last row has name == NULL. */
extern const struct ck_pack_stage ck_pack_stages[];
extern const struct ck_verify_stage ck_verify_stages[];

/* One pass and every stage after it. Returns the pass's error (res is
 * filled as ck_scan_run fills it); the stages after it log their own
 * problems, and the foreground upload stage leaves its outcome in p. */
int ck_pipeline_pass(struct ck_pipeline *p, const struct ck_scan_opts *so,
                     struct ck_scan_result *res);
/* What failed in the pack and verify stages and the hooks (deliveries given
 * up), as one error naming each (CK_ERR; each logged where it happened), or
 * 0. A one-shot command exits 1 on it, after doing all it could, as it does
 * when the upload stage did not finish (p->upload). */
int ck_pipeline_failed(const struct ck_pipeline *p);
/* One upload job ended (foreground, or reported by the watcher's helper):
 * its upload.* event. */
void ck_pipeline_upload_event(struct ck_pipeline *p, const struct ck_upload_outcome *o);
/* For a one-shot command, before it exits: the exec hooks to their end,
 * then due webhooks within CK_NOTIFY_FINISH_BUDGET_S. */
void ck_pipeline_finish(struct ck_pipeline *p);

#endif
