#include "agent/pathfilter.h"
#include "agent/discover.h"
#include "common/fsutil.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

static bool pattern_hits(const struct ck_pathfilter *f, const char *name, const char *rel,
                         bool folder)
{
    return ck_rules_match(f->rules, name, rel, folder, NULL);
}

bool ck_pathfilter_relevant(const struct ck_pathfilter *f, const char *rel)
{
    const char *name = ck_basename(rel);
    if (!strcmp(rel, "metadata.yaml") || !strcmp(rel, "data/build_parameters.yaml") ||
        !strncmp(rel, ".ckptd/", 7) || !strncmp(rel, "data/initialisation/", 20))
        return false;
    if (!strncmp(rel, "data/checkpoints/", 17) && strlen(name) > 8 &&
        !strcmp(name + strlen(name) - 8, ".md5sums"))
        return false;
    if ((f->finished_marker && !strcmp(rel, f->finished_marker)) ||
        (f->failed_marker && !strcmp(rel, f->failed_marker)))
        return true;
    if (ck_rules_any_ignored(f->rules, rel))
        return false;
    if (!strcmp(name, "latest") || !strcmp(name, CK_MEGATRON_TRACKER) ||
        pattern_hits(f, name, rel, false))
        return true;
    /* a TF bundle part: PREFIX.index, PREFIX.data-NNNNN-of-MMMMM */
    char prefix[PATH_MAX];
    const char *cut = strstr(name, ".data-");
    size_t n = strlen(name);
    if (!cut && n > 6 && !strcmp(name + n - 6, ".index"))
        cut = name + n - 6;
    if (cut) {
        size_t dir_len = (size_t)(name - rel);
        snprintf(prefix, sizeof prefix, "%.*s", (int)(dir_len + (size_t)(cut - name)), rel);
        if (pattern_hits(f, ck_basename(prefix), prefix, false))
            return true;
    }
    /* inside a folder checkpoint: some folder above it matches */
    for (const char *p = strchr(rel, '/'); p; p = strchr(p + 1, '/')) {
        snprintf(prefix, sizeof prefix, "%.*s", (int)(p - rel), rel);
        if (pattern_hits(f, ck_basename(prefix), prefix, true))
            return true;
    }
    return false;
}

bool ck_pathfilter_is_folder_checkpoint(const struct ck_pathfilter *f, const char *rel)
{
    return !ck_rules_any_ignored(f->rules, rel) && pattern_hits(f, ck_basename(rel), rel, true);
}

void ck_pathfilter_scope(const struct ck_pathfilter *f, const char *rel, char *out, size_t outsz)
{
    char prefix[PATH_MAX];
    for (const char *p = strchr(rel, '/'); p; p = strchr(p + 1, '/')) {
        snprintf(prefix, sizeof prefix, "%.*s", (int)(p - rel), rel);
        if (pattern_hits(f, ck_basename(prefix), prefix, true)) {
            snprintf(out, outsz, "%s", prefix);
            return;
        }
    }
    ck_dirname(out, outsz, rel);
    if (!strcmp(out, "."))
        out[0] = '\0';
}
