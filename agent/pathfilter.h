/* The watcher's path filter: which change notices may change what a pass
 * does, and where a targeted pass looks. Names are judged by the same
 * checkpoint-name rule as scan's walk (agent/rules.h). */
#ifndef CK_PATHFILTER_H
#define CK_PATHFILTER_H

#include "agent/rules.h"

#include <stdbool.h>
#include <stddef.h>

struct ck_pathfilter {
    const struct ck_ckpt_rules *rules; /* borrowed */
    const char *finished_marker;       /* training.finished_marker, or NULL */
    const char *failed_marker;         /* training.failed_marker, or NULL */
};

/* Whether a change to rel (relative to DIR) may change what a pass does: a
 * checkpoint file, a part of a TF bundle, anything inside a folder
 * checkpoint, DeepSpeed's 'latest', a marker. Our own outputs are not. A
 * wrong yes costs a pass; a wrong no waits for the reconciliation pass. */
bool ck_pathfilter_relevant(const struct ck_pathfilter *f, const char *rel);
/* Whether the folder rel is a folder checkpoint by its name. */
bool ck_pathfilter_is_folder_checkpoint(const struct ck_pathfilter *f, const char *rel);
/* Where a targeted pass looks for rel's checkpoint: the folder checkpoint
 * rel is in (taken alone: a run of 10,000 folders is not listed for each
 * new one), else rel's own folder ("" the top). */
void ck_pathfilter_scope(const struct ck_pathfilter *f, const char *rel, char *out, size_t outsz);

#endif
