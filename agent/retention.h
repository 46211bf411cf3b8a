/* Retention: the stage after upload that frees the training node's disk.
 * A checkpoint leaves the local disk only when the retention keys
 * (retention.* in the config) let it go AND every configured store holds a
 * copy that was checked now (size, and the MD5 the store reports or the bytes
 * read back), or retention.without_store says no store is wanted. The latest
 * checkpoint never goes, nor one the trainer still writes.
 *
 * Both trees stay valid PMF trees: DIR/metadata.yaml lists what the local
 * tree holds; the stores get DIR/.ckptd/remote-metadata.yaml (stores/pmftree.h),
 * which lists every checkpoint they hold. The state database records each
 * deletion before its first byte goes (deleting) and after its last
 * (deleted): a pass killed in between is finished by the next one. The
 * checkpoint.deleted event (hooks NULL: none) is stored in the transaction
 * that records the deletion done. */
#ifndef CK_RETENTION_H
#define CK_RETENTION_H

#include "agent/config.h"
#include "agent/state.h"
#include "hooks/hooks.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ck_retention_result {
    size_t deleted;      /* checkpoints deleted by this pass (interrupted ones finished included) */
    size_t held;         /* checkpoints retention would delete but kept: see the warnings */
    size_t would_delete; /* dry run: what would be deleted if every copy checks out */
    uint64_t freed;      /* bytes of the files deleted */
    size_t requeued;     /* copies found missing and queued to be sent again */
    size_t pruned;        /* retention.store: checkpoints deleted from every store */
    size_t prune_waiting; /* pruning, waiting for the stores' metadata.yaml to drop them */
    size_t would_prune;   /* dry run */
};

/* A checkpoint whose copies checked out in every store (the watcher's
 * helper, ck_retention_check), for ck_retention_apply. Strings borrowed;
 * stores is a newline-terminated list of the stores' redacted URLs. Its
 * files are those of the MD5 (its manifest's, for a set or a folder). */
struct ck_retention_checked {
    const char *ref, *md5, *stores;
};
typedef void (*ck_retention_checked_fn)(void *arg, const struct ck_retention_checked *c);

/* One retention pass over dir (its lock held, st open). dry_run lists what
 * would be deleted (retention.would_delete lines) and touches nothing, not
 * even the stores. Problems with single checkpoints are logged and counted
 * as held; an error means the pass could not be done (metadata.yaml, the
 * state database). */
int ck_retention_run(struct ck_state *st, const char *dir, const struct ck_config *cfg,
                     struct ck_hooks *hooks, bool dry_run, struct ck_retention_result *res);

/* The watcher's split of a pass (agent/retention_worker.h): the network half
 * runs in a helper process. ck_retention_check plans as ck_retention_run does
 * and checks every store's copies, but deletes nothing and finishes no
 * interrupted deletion: each checkpoint that may go is handed to on_checked
 * (res->would_delete counts them; with min_free, what they would free is
 * assumed freed). */
int ck_retention_check(struct ck_state *st, const char *dir, const struct ck_config *cfg,
                       ck_retention_checked_fn on_checked, void *arg,
                       struct ck_retention_result *res);
/* The local half, in the watcher (the one process that writes metadata.yaml):
 * deletes c's checkpoint as ck_retention_run would, once the rules are
 * applied again to metadata.yaml as it is now: nothing when it is no longer
 * listed, its MD5 changed, it became the latest or a kept best, the rules
 * keep it (and min_free is met), or a process writes it. */
int ck_retention_apply(struct ck_state *st, const char *dir, const struct ck_config *cfg,
                       struct ck_hooks *hooks, const struct ck_retention_checked *c,
                       struct ck_retention_result *res);

/* Finishes the deletions an interrupted pass recorded (before a scan, so
 * that what is left of them is not registered again). */
int ck_retention_resume(struct ck_state *st, const char *dir, const struct ck_config *cfg,
                        struct ck_hooks *hooks, struct ck_retention_result *res);

/* Writes DIR/.ckptd/remote-metadata.yaml: DIR/metadata.yaml plus the
 * checkpoints whose bytes are only in the stores (the retention records of
 * db), when there are such; removes it when there are none. Unchanged text
 * is not written again. */
int ck_retention_remote_meta(sqlite3 *db, const char *dir);

/* `ckptd fetch`: the files of a checkpoint retention deleted, from the first
 * configured store that held a checked copy, into dest (a file checkpoint:
 * dest/NAME; a folder: dest/REF/... and its manifest dest/REF.md5sums), each
 * checked against the MD5 metadata.yaml recorded (a folder's files: against
 * its manifest). Nothing is left at dest when no store gives it back whole.
 * The local tree is not touched. *nfiles counts the files written. */
int ck_retention_fetch(struct ck_state *st, const char *dir, const struct ck_config *cfg,
                       const char *ref, const char *dest, size_t *nfiles);

/* Where keep_best reads a checkpoint's value of metric (exposed for the
 * fuzz target, fuzz_metrics): a metrics.jsonl or CSV at path (the value at
 * step when has_step, else at epoch), a Lightning name ("val_loss=0.12"), a
 * trainer_state.json's log_history. false when there is none; hostile input
 * is skipped line by line. */
bool ck_retention_metric_in_file(const char *path, const char *metric, bool has_step, int64_t step,
                                 int64_t epoch, double *out);
bool ck_retention_metric_in_name(const char *name, const char *metric, double *out);
bool ck_retention_metric_in_trainer_state(const char *path, const char *metric, double *out);

/* Bytes free for this user on dir's filesystem (statvfs: f_bavail). */
int ck_retention_free_bytes(const char *dir, uint64_t *out);

#endif
