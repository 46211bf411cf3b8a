/* The checkpoint-name rule: which file and folder names are checkpoints,
 * which are temporary, and the markers that complete a folder checkpoint.
 * Scan's walk (agent/discover.h) and the watcher's path filter
 * (agent/pathfilter.h) both decide through these functions, so that they
 * cannot disagree about a name.
 *
 * A pattern is matched against a file or folder name ('*' any text, '?' one
 * character, {epoch} and {step} a number each); a pattern containing '/'
 * is matched against the path relative to DIR; a final '/' means a folder. */
#ifndef CK_RULES_H
#define CK_RULES_H

#include "common/strlist.h"

#include <stdbool.h>
#include <stdint.h>

/* The checkpoints: part of the config (struct ck_config.ckpt). */
struct ck_ckpt_rules {
    struct ck_strlist patterns;       /* name patterns with {epoch} / {step} */
    struct ck_strlist ignore;         /* temporary names, never registered (globs) */
    struct ck_strlist folder_markers; /* a folder checkpoint is complete once one exists */
    /* A node of several other than rank 0 (agent/nodes.h): a folder is
     * complete once its files settle with no writer, marker or not; the
     * step's markers (DCP's .metadata, HF's trainer_state.json, DeepSpeed's
     * latest) are written by rank 0 only and come with its part. */
    bool markers_optional;
};

struct ck_name_captures {
    bool has_epoch, has_step;
    int64_t epoch, step;
    const char *pattern;     /* the pattern read (borrowed from the rules) */
    /* Another pattern read the name otherwise (a capture both have, with
     * another value; or only an epoch against only a step): the reading not
     * taken, for the log line that says which was chosen. */
    bool ambiguous;
    bool alt_has_epoch, alt_has_step;
    int64_t alt_epoch, alt_step;
    const char *alt_pattern; /* borrowed */
};

/* Whether name (a file, or with folder a folder; rel its path relative to
 * DIR) matches one of the patterns of its kind. c (may be NULL) gets the
 * reading of the pattern that captures the most ({epoch} and {step} over
 * one of them; the first such pattern in the list), and says whether
 * another pattern reads the name in a way that contradicts it. Does not
 * look at ignore. */
bool ck_rules_match(const struct ck_ckpt_rules *r, const char *name, const char *rel, bool folder,
                    struct ck_name_captures *c);
/* Whether name (one path component) is a temporary name. */
bool ck_rules_ignored(const struct ck_ckpt_rules *r, const char *name);
/* Whether some component of rel is a temporary name. */
bool ck_rules_any_ignored(const struct ck_ckpt_rules *r, const char *rel);
/* Whether name is one of the folder markers. */
bool ck_rules_is_marker(const struct ck_ckpt_rules *r, const char *name);

/* Matches name against one pattern. Captures are written when the pattern
 * has them (has_* says so). */
bool ck_pattern_match(const char *pattern, const char *name, bool *has_epoch, int64_t *epoch,
                      bool *has_step, int64_t *step);
/* A glob without captures, for ignore lists. */
bool ck_glob_match(const char *glob, const char *name);
/* Checks a pattern list at config time: each must capture {epoch} or {step},
 * or be a plain .ckpt file name without '*', '?' or '/' (like Lightning's
 * last.ckpt: its epoch then comes from the file itself, agent/counters.h). */
int ck_patterns_check(const struct ck_strlist *patterns);

#endif
