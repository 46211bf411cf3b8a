/* What a remote copy of a PMF tree needs beyond its files. The PMF structure
 * requires data/initialisation/ even when the model was trained from scratch
 * (initialisation: null), where it is empty; object stores have no folders
 * and `aws s3 cp --recursive`, rclone and most sync tools skip a folder
 * marker, so a downloaded copy would fail validation. PMF allows plain files
 * there (FORMAT-FACTS.md 1.3), so the tree gets a short README.md saying why
 * the folder is empty -- in the local tree too, so that the remote copy stays
 * identical to it on every store kind. */
#ifndef CK_STORE_PMFTREE_H
#define CK_STORE_PMFTREE_H

#include <stdbool.h>
#include <stddef.h>

#define CK_PMFTREE_INIT_README "data/initialisation/README.md"

/* When root is a PMF tree (root/metadata.yaml) whose initialisation is null
 * and whose data/initialisation/ is empty or missing, writes
 * CK_PMFTREE_INIT_README there (atomically, mode 0644). *wrote says whether
 * it did. Nothing is touched otherwise. Errors name the file. */
int ck_pmftree_mark_empty_init(const char *root, bool *wrote);

/* A tree whose checkpoints are not all on the local disk any more (retention,
 * agent/retention.h) has two metadata.yaml: root/metadata.yaml lists the
 * checkpoints the local tree holds (so that it stays a valid PMF tree), and
 * the stores get CK_PMFTREE_REMOTE_META, which lists every checkpoint they
 * hold. The agent keeps that file; this module only picks it. */
#define CK_PMFTREE_REMOTE_META ".ckptd/remote-metadata.yaml"

/* The file to send as root's metadata.yaml: root/CK_PMFTREE_REMOTE_META when
 * it exists, else root/metadata.yaml. */
void ck_pmftree_meta_source(const char *root, char *out, size_t outsz);
/* When path is a tree's metadata source (either form), its root into root. */
bool ck_pmftree_root_of_meta(const char *path, char *root, size_t rootsz);

/* The checkpoints a metadata.yaml lists, as (path, reference) sorted by path:
 * which checkpoint an uploaded file belongs to, for the log and the events. */
struct ck_pmftree_ckpt {
    char *path; /* relative to the tree: a file, or a folder checkpoint */
    char *ref;
};
struct ck_pmftree_ckpts {
    struct ck_pmftree_ckpt *v;
    size_t n;
};
/* Reads meta (a metadata.yaml); a file that cannot be read or parsed gives an
 * empty list (the names are for the log: an upload never fails for them). */
void ck_pmftree_checkpoints(const char *meta, struct ck_pmftree_ckpts *out);
/* The reference of the checkpoint rel (a path relative to the tree) is, or is
 * inside of; NULL for a file of no checkpoint. */
const char *ck_pmftree_checkpoint_of(const struct ck_pmftree_ckpts *c, const char *rel);
void ck_pmftree_checkpoints_release(struct ck_pmftree_ckpts *c);

#endif
