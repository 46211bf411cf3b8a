/* Recorded test sets of a SameDiff archive's tag (readers/sdtests.h). */
#include "readers/sdtests.h"

#include "common/fsutil.h"
#include "common/error.h"
#include "common/zipjournal.h"
#include "readers/zipin.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define TAGS_MAX (1u << 20)             /* tags.txt, as the model reader */
#define SETTXT_MAX (1u << 20)           /* set.txt */
#define ARRAY_MAX ((uint64_t)INT32_MAX) /* FlatBuffers cannot address more */

bool ck_sdtests_is_archive(const char *spec)
{
    char file[4096];
    const char *tag;
    struct ck_zipin zi;
    uint64_t idx;
    bool yes = false;
    ck_path_split_part(spec, file, sizeof file, &tag);
    if (ck_zipin_open(&zi, file) == 0) {
        yes = ck_zipin_find(&zi, "tags.txt", &idx) == 0;
        ck_zipin_close(&zi);
    }
    ck_error_clear(); /* not an archive is an answer, not an error */
    return yes;
}

static int read_member(struct ck_sdtests *t, const struct ck_zipin *zi, const char *name,
                       uint64_t max, const unsigned char **d, uint64_t *len)
{
    uint64_t idx;
    int err;
    if ((err = ck_zipin_find(zi, name, &idx)) < 0 ||
        (err = ck_zipin_read(zi, t->s, idx, max, d, len)) < 0)
        return err;
    return 0;
}

/* Every tag tags.txt lists, oldest first (borrowed from the set memory,
 * not terminated: ptr and length), and the index of want (or the last). */
struct tagref {
    const char *p;
    size_t n;
};

static int list_tags(struct ck_sdtests *t, const struct ck_zipin *zi, const char *want,
                     struct tagref **tags, size_t *ntags, size_t *at)
{
    const unsigned char *d;
    uint64_t len;
    int err = read_member(t, zi, "tags.txt", TAGS_MAX, &d, &len);
    if (err < 0)
        return err;
    const char *p = (const char *)d, *end = p + len;
    bool found = false;
    *tags = NULL;
    *ntags = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl ? nl : end) - p);
        if (n && p[n - 1] == '\r')
            n--;
        if (n) {
            if (memchr(p, 0, n) || memchr(p, '/', n) || n > 255)
                return ck_error(CK_EFORMAT, "'%s': tags.txt: not a valid tag", t->path);
            struct tagref *v = realloc(*tags, (*ntags + 1) * sizeof *v);
            if (!v)
                return ck_error(CK_ENOMEM, "out of memory");
            *tags = v;
            v[*ntags] = (struct tagref){p, n};
            if (want && !found && strlen(want) == n && !strncasecmp(want, p, n)) {
                found = true;
                *at = *ntags;
            }
            (*ntags)++;
        }
        p = nl ? nl + 1 : end;
    }
    if (want && !found)
        return ck_error(CK_ENOENT, "'%s': no tag '%s'", t->path, want);
    if (!*ntags)
        return ck_error(CK_EFORMAT, "'%s': tags.txt lists no tag", t->path);
    if (!want)
        *at = *ntags - 1;
    return 0;
}

static bool set_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > CK_SDTESTS_NAME_MAX || s[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* "<digits>.fb" (at most 4 digits, no leading zero but "0"): its number. */
static bool file_number(const char *s, size_t *k)
{
    size_t n = strspn(s, "0123456789");
    if (n == 0 || n > 4 || (n > 1 && s[0] == '0') || strcmp(s + n, ".fb") != 0)
        return false;
    *k = (size_t)strtoul(s, NULL, 10);
    return true;
}

static struct ck_sdtest *set_named(struct ck_sdtests *t, const char *name, size_t n)
{
    for (size_t i = 0; i < t->n; i++)
        if (strlen(t->sets[i].name) == n && !strncmp(t->sets[i].name, name, n))
            return &t->sets[i];
    return NULL;
}

static int add_array(struct ck_sdtest_array **v, size_t *n, size_t k, const char *value,
                     size_t vlen)
{
    if (k >= CK_SDTESTS_MAX_ARRAYS)
        return -1;
    if (k >= *n) {
        struct ck_sdtest_array *nv = realloc(*v, (k + 1) * sizeof *nv);
        if (!nv)
            return -2;
        memset(nv + *n, 0, (k + 1 - *n) * sizeof *nv);
        *v = nv;
        *n = k + 1;
    }
    if ((*v)[k].value)
        return -1; /* twice */
    if (!((*v)[k].value = strndup(value, vlen)))
        return -2;
    return 0;
}

/* set.txt of one set: the version line, then tolerance/input/output lines. */
static int parse_settxt(struct ck_sdtests *t, struct ck_sdtest *set, const char *member,
                        const unsigned char *d, uint64_t len)
{
    const char *p = (const char *)d, *end = p + len;
    unsigned lineno = 0;
    if (memchr(d, 0, len))
        return ck_error(CK_EFORMAT, "'%s': '%s' holds a NUL byte", t->path, member);
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl ? nl : end) - p);
        char line[1024];
        lineno++;
        if (n && p[n - 1] == '\r')
            n--;
        if (n >= sizeof line)
            return ck_error(CK_EFORMAT, "'%s': '%s' line %u is too long", t->path, member, lineno);
        memcpy(line, p, n);
        line[n] = 0;
        p = nl ? nl + 1 : end;
        if (lineno == 1) {
            if (strcmp(line, "ckptd-test 1") != 0)
                return ck_error(CK_EFORMAT, "'%s': '%s' does not start with 'ckptd-test 1'",
                                t->path, member);
            continue;
        }
        if (!n)
            continue;
        char *e;
        if (!strncmp(line, "tolerance ", 10)) {
            errno = 0;
            double v = strtod(line + 10, &e);
            if (errno || e == line + 10 || *e || !(v >= 0) || isinf(v))
                return ck_error(CK_EFORMAT, "'%s': '%s' line %u: bad tolerance", t->path, member,
                                lineno);
            set->tolerance = v;
            continue;
        }
        bool in = !strncmp(line, "input ", 6), out = !strncmp(line, "output ", 7);
        const char *num = line + (in ? 6 : 7);
        size_t digits = strspn(num, "0123456789");
        if ((!in && !out) || digits == 0 || digits > 4 || num[digits] != ' ' || !num[digits + 1])
            return ck_error(CK_EFORMAT,
                            "'%s': '%s' line %u: expected 'tolerance X', 'input K NAME' or "
                            "'output K NAME'",
                            t->path, member, lineno);
        size_t k = (size_t)strtoul(num, NULL, 10);
        const char *value = num + digits + 1;
        int r = in ? add_array(&set->in, &set->nin, k, value, strlen(value))
                   : add_array(&set->out, &set->nout, k, value, strlen(value));
        if (r == -2)
            return ck_error(CK_ENOMEM, "out of memory");
        if (r < 0)
            return ck_error(CK_EFORMAT, "'%s': '%s' line %u: %s %zu given twice or out of range",
                            t->path, member, lineno, in ? "input" : "output", k);
    }
    if (lineno == 0)
        return ck_error(CK_EFORMAT, "'%s': '%s' is empty", t->path, member);
    return 0;
}

/* Reads set.txt of every set (creating the sets in archive order). */
static int read_sets(struct ck_sdtests *t, const struct ck_zipin *zi, const char *prefix)
{
    size_t plen = strlen(prefix);
    for (uint64_t i = 0; i < zi->nentries; i++) {
        const char *name = ck_zipin_name(zi, i);
        if (!name || strncmp(name, prefix, plen))
            continue;
        const char *rest = name + plen, *slash = strchr(rest, '/');
        if (!slash || strcmp(slash + 1, "set.txt"))
            continue;
        size_t n = (size_t)(slash - rest);
        if (!set_name_ok(rest, n))
            return ck_error(CK_EFORMAT, "'%s': member '%s': not a valid test set name", t->path,
                            name);
        if (set_named(t, rest, n))
            return ck_error(CK_EFORMAT, "'%s': member '%s' appears twice", t->path, name);
        struct ck_sdtest *v = realloc(t->sets, (t->n + 1) * sizeof *v);
        if (!v)
            return ck_error(CK_ENOMEM, "out of memory");
        t->sets = v;
        struct ck_sdtest *set = &t->sets[t->n++];
        memset(set, 0, sizeof *set);
        set->tolerance = -1;
        if (!(set->name = strndup(rest, n)))
            return ck_error(CK_ENOMEM, "out of memory");
        const unsigned char *d;
        uint64_t len;
        int err;
        if ((err = ck_zipin_read(zi, t->s, i, SETTXT_MAX, &d, &len)) < 0 ||
            (err = parse_settxt(t, set, name, d, len)) < 0)
            return err;
        for (size_t k = 0; k < set->nin + set->nout; k++) {
            struct ck_sdtest_array *a = k < set->nin ? &set->in[k] : &set->out[k - set->nin];
            if (!a->value)
                return ck_error(CK_EFORMAT, "'%s': '%s' gives no %s %zu", t->path, name,
                                k < set->nin ? "input" : "output", k < set->nin ? k : k - set->nin);
        }
        if (!set->nin || !set->nout)
            return ck_error(CK_EFORMAT, "'%s': '%s' lists no %s", t->path, name,
                            set->nin ? "output" : "input");
    }
    return 0;
}

/* Every other member under <tag>/tests/ is a listed array file. */
static int read_arrays(struct ck_sdtests *t, const struct ck_zipin *zi, const char *prefix)
{
    size_t plen = strlen(prefix);
    for (uint64_t i = 0; i < zi->nentries; i++) {
        const char *name = ck_zipin_name(zi, i);
        if (!name || strncmp(name, prefix, plen))
            continue;
        const char *rest = name + plen, *slash = strchr(rest, '/');
        struct ck_sdtest *set = slash ? set_named(t, rest, (size_t)(slash - rest)) : NULL;
        if (set && !strcmp(slash + 1, "set.txt"))
            continue;
        const char *file = slash ? slash + 1 : "";
        bool in = !strncmp(file, "inputs/", 7), out = !strncmp(file, "outputs/", 8);
        size_t k;
        if (!set || (!in && !out) || !file_number(file + (in ? 7 : 8), &k))
            return ck_error(CK_EFORMAT,
                            "'%s': member '%s' is not part of a recorded test set "
                            "(<tag>/tests/<set>/set.txt, inputs/K.fb, outputs/K.fb)",
                            t->path, name);
        struct ck_sdtest_array *a = NULL;
        if (in && k < set->nin)
            a = &set->in[k];
        else if (out && k < set->nout)
            a = &set->out[k];
        if (!a)
            return ck_error(CK_EFORMAT, "'%s': member '%s': set.txt lists no %s %zu", t->path, name,
                            in ? "input" : "output", k);
        if (a->member)
            return ck_error(CK_EFORMAT, "'%s': member '%s' appears twice", t->path, name);
        if (!(a->member = strdup(name)))
            return ck_error(CK_ENOMEM, "out of memory");
        const unsigned char *d;
        uint64_t len;
        char label[4600];
        int err;
        snprintf(label, sizeof label, "%s: %s", t->path, name);
        if ((err = ck_zipin_read(zi, t->s, i, ARRAY_MAX, &d, &len)) < 0 ||
            (err = ck_samediff_flatarray(t->s, label, a->value, d, len, &a->t)) < 0)
            return err;
        if (a->t.dtype == CK_DT_STRING || !ck_dtype_size(a->t.dtype) || a->t.rank < 1)
            return ck_error(CK_EFORMAT, "'%s': not an array of numbers with a batch dimension",
                            label);
    }
    for (size_t s = 0; s < t->n; s++) {
        struct ck_sdtest *set = &t->sets[s];
        for (size_t k = 0; k < set->nin + set->nout; k++) {
            bool in = k < set->nin;
            struct ck_sdtest_array *a = in ? &set->in[k] : &set->out[k - set->nin];
            if (!a->member)
                return ck_error(CK_EFORMAT, "'%s': '%s%s/%s/%zu.fb' is missing", t->path, prefix,
                                set->name, in ? "inputs" : "outputs", in ? k : k - set->nin);
        }
    }
    return 0;
}

static int load_locked(struct ck_sdtests *t, const char *want, bool or_earlier)
{
    struct ck_zipin zi;
    struct tagref *tags = NULL;
    size_t ntags = 0, at = 0;
    char prefix[4200];
    int err = ck_zipin_open(&zi, t->path);
    if (err < 0)
        return err;
    if ((err = list_tags(t, &zi, want, &tags, &ntags, &at)) < 0)
        goto out;
    for (size_t i = at + 1; i-- > 0 && err >= 0;) {
        free(t->tag);
        if (!(t->tag = strndup(tags[i].p, tags[i].n))) {
            err = ck_error(CK_ENOMEM, "out of memory");
            break;
        }
        snprintf(prefix, sizeof prefix, "%s/tests/", t->tag);
        if ((err = read_sets(t, &zi, prefix)) < 0 || (err = read_arrays(t, &zi, prefix)) < 0)
            break;
        if (t->n || !or_earlier)
            break;
    }
    if (err >= 0 && !t->n) { /* none: the tag asked for */
        free(t->tag);
        if (!(t->tag = strndup(tags[at].p, tags[at].n)))
            err = ck_error(CK_ENOMEM, "out of memory");
    }
out:
    free(tags);
    ck_zipin_close(&zi);
    return err;
}

static int load(const char *spec, bool or_earlier, struct ck_sdtests *out)
{
    char file[4096];
    const char *want;
    int err, fd;
    memset(out, 0, sizeof *out);
    ck_path_split_part(spec, file, sizeof file, &want);
    if (!(out->path = strdup(file)) || !(out->s = ck_tensor_set_new("samediff", file))) {
        ck_sdtests_release(out);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    if ((err = ck_zipjournal_recover_path(file)) < 0)
        goto out;
    if ((fd = open(file, O_RDONLY | O_CLOEXEC)) < 0) {
        err = ck_error_os(CK_EIO, "cannot open '%s'", file);
        goto out;
    }
    while (flock(fd, LOCK_SH) < 0 && errno == EINTR)
        ;
    err = load_locked(out, want, or_earlier);
    close(fd);
out:
    if (err < 0)
        ck_sdtests_release(out);
    return err;
}

int ck_sdtests_load(const char *spec, struct ck_sdtests *out)
{
    return load(spec, false, out);
}

int ck_sdtests_load_latest(const char *spec, struct ck_sdtests *out)
{
    return load(spec, true, out);
}

void ck_sdtests_release(struct ck_sdtests *t)
{
    for (size_t i = 0; t->sets && i < t->n; i++) {
        struct ck_sdtest *set = &t->sets[i];
        for (size_t k = 0; k < set->nin; k++)
            free(set->in[k].value), free(set->in[k].member);
        for (size_t k = 0; k < set->nout; k++)
            free(set->out[k].value), free(set->out[k].member);
        free(set->in);
        free(set->out);
        free(set->name);
    }
    free(t->sets);
    free(t->path);
    free(t->tag);
    ck_tensor_set_free(t->s);
    memset(t, 0, sizeof *t);
}
