/* One pass over a training directory: whatever its PMF tree needs that has
 * not been done yet. Used by `ckptd scan` (once) and by the watcher (after
 * every settled event). Idempotent: a pass with nothing new changes no byte
 * and hashes nothing (the hash cache in the state database). */
#ifndef CK_SCAN_H
#define CK_SCAN_H

#include "agent/config.h"
#include "agent/layout.h"
#include "agent/state.h"
#include "common/buf.h"
#include "common/fsutil.h"
#include "common/strlist.h"
#include "writers/pmf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ck_candidate; /* agent/discover.h */

/* metadata.yaml as the last pass left it, kept by a long-lived caller (the
 * watcher): while the file is the one that pass wrote (same device, inode,
 * size, mtime), the next pass starts from it instead of reading and parsing
 * it again (a 10,000-checkpoint metadata.yaml is 1.3 MB of YAML per event).
 * Anyone else's write (a rename gives a new inode) makes it read again. */
struct ck_scan_memo {
    bool valid;
    struct ck_file_id id;
    struct ck_pmf_meta meta;
    struct ck_buf bytes;
    struct ck_layout_memo build_parameters; /* data/build_parameters.yaml's, the same way */
};
void ck_scan_memo_release(struct ck_scan_memo *m);

struct ck_scan_opts {
    const char *dir;              /* the model root (the training output directory) */
    const struct ck_config *cfg;
    int end_status;               /* -1, or CK_PMF_FINISHED / CK_PMF_FAILED to end the training */
    bool mark_running;            /* set status running even before a checkpoint (a wrapped command started) */
    double min_age;               /* < 0: cfg->min_age */
    /* The watcher's say on new checkpoints (NULL for scan: complete and
     * min_age old). When set, it alone decides, for every checkpoint not
     * registered yet, whether this pass takes it (min_age is not applied);
     * false leaves it waiting. */
    bool (*admit)(void *arg, const struct ck_candidate *c);
    void *admit_arg;
    /* A targeted pass (the watcher, between full passes): looks for new
     * checkpoints only in these folders (relative to dir, "" for dir; not
     * below them), re-checks only the registered file checkpoints found
     * there and unregisters nothing. NULL: everything. */
    char *const *only_dirs;
    size_t nonly_dirs;
    struct ck_scan_memo *memo;    /* NULL: metadata.yaml is read each pass */
    /* The watcher with upload.stores (none a bundle): a new file checkpoint
     * whose digests are not known yet is placed in the tree and queued for
     * every store, not hashed nor registered: its path goes to
     * res->sent_first and it stays waiting. The caller starts the upload,
     * hashes the file beside it (ck_state_hash_file) and runs a pass
     * without send_first, which registers it with those digests; the
     * upload queue's tables must exist (ck_queue_init). */
    bool send_first;
};

struct ck_scan_result {
    char **registered;            /* owned: references registered by this pass, in order */
    size_t nregistered;
    size_t updated;               /* registered checkpoints whose content changed */
    size_t removed;               /* unregistered (mirror_deletes) */
    size_t waiting;               /* seen but not complete or not settled yet */
    size_t problems;              /* could not be taken: logged as errors */
    bool metadata_written;
    struct ck_strlist sent_first; /* send_first: the tree paths queued before their hashing */
    enum ck_pmf_status old_status, new_status;
    char model_id[64];
    char model_name[256];
    /* metadata.yaml as this pass left it, when the caller keeps a memo
     * (borrowed from it until the next pass); NULL otherwise */
    const struct ck_pmf_meta *meta;
};

/* Runs one pass. The caller holds the lock and the open state. Problems with
 * single checkpoints are logged and counted, not returned; an error is
 * returned when the pass itself could not be done (metadata.yaml not PMF,
 * a write failed, a forbidden status change), and then nothing already
 * written is lost: metadata.yaml is replaced atomically or not at all. */
int ck_scan_run(struct ck_state *st, const struct ck_scan_opts *o, struct ck_scan_result *res);
void ck_scan_result_release(struct ck_scan_result *r);
/* Checks what a pass would read (DIR/metadata.yaml when present) and writes nothing. */
int ck_scan_check(const struct ck_scan_opts *o);

#endif
