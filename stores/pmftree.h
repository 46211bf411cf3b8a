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

#define CK_PMFTREE_INIT_README "data/initialisation/README.md"

/* When root is a PMF tree (root/metadata.yaml) whose initialisation is null
 * and whose data/initialisation/ is empty or missing, writes
 * CK_PMFTREE_INIT_README there (atomically, mode 0644). *wrote says whether
 * it did. Nothing is touched otherwise. Errors name the file. */
int ck_pmftree_mark_empty_init(const char *root, bool *wrote);

#endif
