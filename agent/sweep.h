/* Leftovers of a killed run: every file ckptd writes goes through a
 * temporary (common/fsutil.h ck_atomic_*), and kill -9 between creating and
 * renaming it leaves one behind. A start that holds the folder's lock (scan,
 * watch) removes them from the folders ckptd writes, and logs how many. */
#ifndef CK_SWEEP_H
#define CK_SWEEP_H

#include <stddef.h>

/* Sweeps the model tree at model_dir; returns how many were removed. Failures
 * are logged (a leftover costs disk, not correctness) and never stop a start. */
size_t ck_tree_sweep(const char *model_dir);

#endif
