#include "agent/sweep.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <limits.h>

/* The folders of the PMF tree ckptd writes into; the trainer's own folders
 * are never swept (its files are not ours to remove). */
static const char *const folders[] = {
    "", "data", "data/checkpoints", "data/initialisation", "data/deploy", ".ckptd",
};

size_t ck_tree_sweep(const char *model_dir)
{
    size_t removed = 0;
    char path[PATH_MAX];
    for (size_t i = 0; i < sizeof folders / sizeof folders[0]; i++) {
        if (ck_path_join(path, sizeof path, model_dir, folders[i]) < 0 ||
            ck_sweep_temporaries(path, &removed) < 0)
            ck_warn("sweep.failed", "%s", ck_error_msg());
    }
    if (removed)
        ck_info("sweep.removed", "dir='%s' temporaries=%zu: left by a run that was killed",
                model_dir, removed);
    return removed;
}
