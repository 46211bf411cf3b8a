/* Finding checkpoints in a training directory by the checkpoint-name rule
 * (agent/rules.h: patterns, temporary names, folder markers).
 * A TensorFlow bundle (PREFIX.index + PREFIX.data-NNNNN-of-MMMMM) is one
 * checkpoint named PREFIX, complete when the index and every shard exist.
 * A folder checkpoint is complete when its marker exists (written last by
 * the framework), DeepSpeed's 'latest' file names it or a later global_stepN,
 * or Megatron-LM's tracker (CK_MEGATRON_TRACKER beside it) names its
 * iteration or a later one. */
#ifndef CK_DISCOVER_H
#define CK_DISCOVER_H

#include "agent/rules.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CK_MEGATRON_TRACKER "latest_checkpointed_iteration.txt"

enum ck_cand_kind { CK_CAND_FILE, CK_CAND_TFSET, CK_CAND_DIR };

struct ck_candidate {
    enum ck_cand_kind kind;
    char *ref;            /* owned: the reference (file, prefix or folder name) */
    char *rel;            /* owned: path relative to DIR (the file, the prefix, the folder) */
    bool has_epoch, has_step;
    int64_t epoch, step;
    struct ck_name_captures names; /* the name's reading, with another one when ambiguous */
    char **files;         /* owned: member files relative to DIR (a file: itself) */
    size_t nfiles;
    bool complete;        /* every part is there (TF shards, folder marker) */
    double newest_mtime;  /* of its files, UNIX seconds */
    bool in_tree;         /* found under data/checkpoints/ */
    /* What the walk saw of its files, order-free: a sum of a hash of each
     * file's (name inside the checkpoint, device, inode, size, mtime), the
     * facts the hash cache trusts. Our hard links in data/checkpoints have
     * the same as their sources; a file rewritten, replaced, added or
     * removed changes it. A registered checkpoint whose fingerprint is the
     * one recorded needs no look at its files (agent/scan.c). */
    uint64_t fingerprint;
};

struct ck_problem {
    char *path;           /* owned, relative to DIR, made printable */
    char *msg;            /* owned */
};

struct ck_discovery {
    struct ck_candidate *cands;
    size_t ncands, cap;
    struct ck_problem *problems; /* files that match but cannot be taken: errors for exit 1 */
    size_t nproblems, pcap;
};

/* Walks dir (not following symlinks, skipping .ckptd and data/initialisation). */
int ck_discover(const char *dir, const struct ck_ckpt_rules *rules, struct ck_discovery *out);
void ck_discovery_release(struct ck_discovery *d);
/* The same, in the named folders only (relative to dir, "" for dir itself),
 * not in the folders below them (a folder checkpoint in them is listed
 * whole). For the watcher's targeted passes; a missing folder is skipped.
 * Folder checkpoints whose reference known() (may be NULL) says is
 * registered are left out: a targeted pass does not re-check them, and
 * listing every file of 10,000 registered folders beside a new one would
 * make each new checkpoint cost the whole run. */
int ck_discover_dirs(const char *dir, const struct ck_ckpt_rules *rules, char *const *subdirs,
                     size_t n, bool (*known)(void *arg, const char *ref), void *known_arg,
                     struct ck_discovery *out);

#endif
