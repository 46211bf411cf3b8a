/* The uploader: what scan, watch and `ckptd upload` call. Enqueue what
 * changed (data files first, metadata.yaml last), then run the queue until
 * it is empty, the deadline passes or a stop is asked.
 *
 *   ck_uploader_enqueue_tree(db, stores, n, root, changed, nchanged, &queued);
 *   ck_uploader_run(db, &opts, spool_dir, &ctl, &run_opts, &report);
 */
#ifndef CK_STORE_UPLOADER_H
#define CK_STORE_UPLOADER_H

#include "stores/queue.h"
#include "stores/store.h"

#include <sqlite3.h>
#include <stdbool.h>
#include <stddef.h>

/* Queues one local file for every store as key (phase 1 = send last). */
int ck_uploader_enqueue_file(sqlite3 *db, const struct ck_store_spec *store, const char *path,
                             const char *key, int phase, bool *added);
/* The same for a data file (phase 0) that is, or is about to be, the
 * checkpoint ckpt's file in the tree: its upload events name ckpt. */
int ck_uploader_enqueue_checkpoint(sqlite3 *db, const struct ck_store_spec *store,
                                   const char *path, const char *key, const char *ckpt,
                                   bool *added);

/* Queues a PMF tree (or part of it) for every store: the files named in
 * changed (paths relative to root; NULL: every file under root), then
 * root/metadata.yaml last when it exists. A store with bundle: true gets one
 * job for NAME.tar.zst (NAME: root's folder name) instead; with compress:
 * true, data files are queued as KEY.zst (metadata.yaml stays plain).
 * *queued counts the jobs added. With changed NULL, a root that is a PMF
 * tree (metadata.yaml and data/) is queued as ck_uploader_enqueue_pmf does:
 * the tree only, not the trainer's files beside it. */
int ck_uploader_enqueue_tree(sqlite3 *db, const struct ck_store_spec *stores, size_t nstores,
                             const char *root, const char *const *changed, size_t nchanged,
                             int *queued);

/* Queues the PMF tree at root: every file under data/ (registered
 * checkpoints are complete files there), the training configuration named by
 * metadata.yaml, then metadata.yaml last. Files of the training folder that
 * are not part of the tree are left out. data/deploy/ (the deployment
 * archives, held ones excluded: those are in DIR/.ckptd/held/) goes with the
 * tree when with_deploy: a user's `ckptd upload DIR`; the pipeline passes
 * false and queues each archive itself once it passed verification. */
int ck_uploader_enqueue_pmf(sqlite3 *db, const struct ck_store_spec *stores, size_t nstores,
                            const char *root, bool with_deploy, int *queued);

/* How one job ended, for ck_uploader_run_opts.on_job. Borrowed for the call. */
struct ck_upload_outcome {
    bool ok;                /* sent and checked; false: failed for good */
    const char *store_url;  /* the store, credentials removed */
    const char *key;        /* the remote name */
    const char *src;        /* the local file (the PMF root for a bundle) */
    uint64_t bytes;
    double seconds;
    const char *sha256;     /* of what was sent ("" when unknown) */
    const char *error;      /* why it failed, or NULL */
    const char *check;      /* sent: which check the store made (ck_xfer.check), else NULL */
};

/* Where a transfer stands, for ck_uploader_run_opts.on_progress. */
struct ck_upload_progress {
    const char *key;    /* the remote name */
    uint64_t sent, total;
    double rate;        /* bytes per second since the transfer started */
    int percent;        /* 0 to 100 */
    bool final;         /* the transfer ended: the last call for it */
};

struct ck_uploader_run_opts {
    /* Called from a progress thread every 200 ms while a job sends, and once
     * with final set when it ends (the command line draws a bar with it).
     * NULL: an upload.progress log line every 5 s instead. */
    void (*on_progress)(void *arg, const struct ck_upload_progress *p);
    void *on_progress_arg;
    bool wait_retries; /* wait for jobs whose retry time has not come yet (until the deadline) */
    int job_attempts;  /* a job fails for good after this many failed runs (default 3) */
    /* Called after each job that ended (done, or failed for good), on the
     * transfer thread that ran it (upload.transfers run at once), one call at
     * a time and while no transfer uses the database: the agent turns it into
     * an upload.* event, recorded through the same connection. */
    void (*on_job)(void *arg, const struct ck_upload_outcome *o);
    void *on_job_arg;
};

struct ck_upload_report {
    int done;     /* jobs finished by this run */
    int failed;   /* jobs that failed for good in this run */
    int left;     /* jobs still pending (stopped, or waiting for a retry) */
    int blocked;  /* metadata jobs held back by a failed data job */
    bool stopped; /* a stop or the deadline ended the run */
};

/* Runs the queue. The caller holds the lock that makes this process the
 * only runner (running jobs of a dead process are taken back first).
 * spool_dir holds compressed files and bundles being sent. Returns 0 when
 * the run itself worked (see the report for failed jobs), an error when the
 * queue could not be used (the database). */
int ck_uploader_run(sqlite3 *db, const struct ck_upload_opts *opts, const char *spool_dir,
                    struct ck_upload_ctl *ctl, const struct ck_uploader_run_opts *ro,
                    struct ck_upload_report *rep);

/* The queue folder for `ckptd upload` without a DIR: $XDG_STATE_HOME/ckptd
 * or ~/.local/state/ckptd. */
int ck_uploader_default_state(char *out, size_t outsz);
/* Takes the lock that makes this process the queue's only runner in
 * state_dir (created 0700): CK_ELOCKED naming the holder's pid. Close *fd to
 * release it. */
int ck_uploader_lock(const char *state_dir, int *fd);

#endif
