#include "agent/rules.h"
#include "common/error.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

static bool match_at(const char *p, const char *s, struct ck_name_captures *c)
{
    while (*p) {
        if (*p == '*') {
            while (*p == '*')
                p++;
            if (!*p)
                return true;
            for (const char *t = s; *t; t++)
                if (match_at(p, t, c))
                    return true;
            return match_at(p, s + strlen(s), c);
        }
        if (!strncmp(p, "{epoch}", 7) || !strncmp(p, "{step}", 6)) {
            bool is_epoch = p[1] == 'e';
            const char *rest = p + (is_epoch ? 7 : 6);
            size_t n = 0;
            while (s[n] >= '0' && s[n] <= '9')
                n++;
            /* Longest number first, then shorter ones (e.g. {step}0.pt). */
            for (; n > 0; n--) {
                if (n > 18)
                    continue; /* would overflow int64 */
                if (match_at(rest, s + n, c)) {
                    int64_t v = 0;
                    for (size_t i = 0; i < n; i++)
                        v = v * 10 + (s[i] - '0');
                    if (is_epoch) {
                        c->has_epoch = true;
                        c->epoch = v;
                    } else {
                        c->has_step = true;
                        c->step = v;
                    }
                    return true;
                }
            }
            return false;
        }
        if (*p == '?') {
            if (!*s)
                return false;
            p++;
            s++;
            continue;
        }
        if (*p != *s)
            return false;
        p++;
        s++;
    }
    return *s == '\0';
}

bool ck_pattern_match(const char *pattern, const char *name, bool *has_epoch, int64_t *epoch,
                      bool *has_step, int64_t *step)
{
    struct ck_name_captures c = {0};
    if (!match_at(pattern, name, &c))
        return false;
    if (has_epoch)
        *has_epoch = c.has_epoch;
    if (epoch)
        *epoch = c.epoch;
    if (has_step)
        *has_step = c.has_step;
    if (step)
        *step = c.step;
    return true;
}

bool ck_glob_match(const char *glob, const char *name)
{
    return ck_pattern_match(glob, name, NULL, NULL, NULL, NULL);
}

int ck_patterns_check(const struct ck_strlist *patterns)
{
    for (size_t i = 0; i < patterns->n; i++) {
        const char *p = patterns->items[i];
        size_t n = strlen(p);
        bool plain_ckpt = !strpbrk(p, "*?/") && n > 5 && !strcmp(p + n - 5, ".ckpt");
        if (!strstr(p, "{epoch}") && !strstr(p, "{step}") && !plain_ckpt)
            return ck_error(CK_ECONFIG,
                            "checkpoint pattern '%s' captures neither {epoch} nor {step} (only a "
                            "plain .ckpt name may, like last.ckpt: Lightning records the epoch "
                            "in the file)",
                            p);
        const char *slash = strchr(p, '/');
        if (slash && slash[1] && strchr(slash + 1, '/') == NULL && slash == p)
            return ck_error(CK_ECONFIG, "checkpoint pattern '%s' must be relative", p);
    }
    return 0;
}

static int ncaptures(const struct ck_name_captures *c)
{
    return (int)c->has_epoch + (int)c->has_step;
}

/* Whether two readings of one name contradict each other: a capture both
 * have with different values, or one reading with only an epoch and the
 * other with only a step (the step's epoch would be derived from it). A
 * reading with fewer captures that agrees on those it has (a step-only
 * pattern over 'epoch=2-step=150.ckpt') does not: the fuller reading is
 * taken without a word. */
static bool contradicts(const struct ck_name_captures *a, const struct ck_name_captures *b)
{
    return (a->has_epoch && b->has_epoch && a->epoch != b->epoch) ||
           (a->has_step && b->has_step && a->step != b->step) ||
           (a->has_epoch != b->has_epoch && a->has_step != b->has_step && ncaptures(a) == 1 &&
            ncaptures(b) == 1);
}

#define READINGS_MAX 16

bool ck_rules_match(const struct ck_ckpt_rules *r, const char *name, const char *rel, bool folder,
                    struct ck_name_captures *c)
{
    struct ck_name_captures seen[READINGS_MAX], cur;
    size_t nseen = 0, best = 0;
    char pat[1024];
    for (size_t i = 0; i < r->patterns.n; i++) {
        const char *p = r->patterns.items[i];
        size_t n = strlen(p);
        bool is_folder = n > 0 && p[n - 1] == '/';
        if (is_folder != folder)
            continue;
        snprintf(pat, sizeof pat, "%.*s", (int)(is_folder ? n - 1 : n), p);
        const char *subject = strchr(pat, '/') ? rel : name;
        memset(&cur, 0, sizeof cur);
        if (!match_at(pat, subject, &cur))
            continue;
        if (!c)
            return true; /* the path filter asks only whether it matches */
        cur.pattern = p;
        if (nseen == READINGS_MAX) {
            /* more readings than kept: the fullest still wins */
            if (ncaptures(&cur) > ncaptures(&seen[best]))
                seen[best] = cur;
            continue;
        }
        seen[nseen] = cur;
        if (nseen == 0 || ncaptures(&cur) > ncaptures(&seen[best]))
            best = nseen;
        nseen++;
    }
    if (!nseen)
        return false;
    *c = seen[best];
    for (size_t i = 0; i < nseen && !c->ambiguous; i++) {
        if (i == best || !contradicts(&seen[best], &seen[i]))
            continue;
        c->ambiguous = true;
        c->alt_has_epoch = seen[i].has_epoch, c->alt_has_step = seen[i].has_step;
        c->alt_epoch = seen[i].epoch, c->alt_step = seen[i].step;
        c->alt_pattern = seen[i].pattern;
    }
    return true;
}

bool ck_rules_ignored(const struct ck_ckpt_rules *r, const char *name)
{
    for (size_t i = 0; i < r->ignore.n; i++)
        if (ck_glob_match(r->ignore.items[i], name))
            return true;
    return false;
}

bool ck_rules_any_ignored(const struct ck_ckpt_rules *r, const char *rel)
{
    char part[NAME_MAX + 1];
    for (const char *p = rel; *p;) {
        size_t n = strcspn(p, "/");
        snprintf(part, sizeof part, "%.*s", (int)(n < NAME_MAX ? n : NAME_MAX), p);
        if (ck_rules_ignored(r, part))
            return true;
        p += n;
        if (*p == '/')
            p++;
    }
    return false;
}

bool ck_rules_is_marker(const struct ck_ckpt_rules *r, const char *name)
{
    for (size_t i = 0; i < r->folder_markers.n; i++)
        if (!strcmp(name, r->folder_markers.items[i]))
            return true;
    return false;
}
