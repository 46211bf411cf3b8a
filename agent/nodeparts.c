#include "agent/nodeparts.h"
#include "common/error.h"
#include "common/utf8.h"
#include "common/yamlutil.h"
#include "writers/pmf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void files_release(struct ck_nodefile *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].path);
    free(v);
}

void ck_nodepart_release(struct ck_nodepart *p)
{
    free(p->checkpoint);
    files_release(p->files, p->nfiles);
    memset(p, 0, sizeof *p);
}

void ck_nodecommit_release(struct ck_nodecommit *c)
{
    free(c->checkpoint);
    free(c->part_md5);
    files_release(c->files, c->nfiles);
    memset(c, 0, sizeof *c);
}

bool ck_nodefile_path_is_valid(const char *path)
{
    size_t len = strlen(path);
    if (len == 0 || len > 4095 || path[0] == '/' || !ck_utf8_is_valid(path, len))
        return false;
    for (const char *p = path; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == '\\')
            return false;
    for (const char *c = path; c;) {
        const char *end = strchr(c, '/');
        size_t n = end ? (size_t)(end - c) : strlen(c);
        if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
            return false;
        c = end ? end + 1 : NULL;
    }
    return true;
}

static int cmp_file(const void *a, const void *b)
{
    return strcmp(((const struct ck_nodefile *)a)->path, ((const struct ck_nodefile *)b)->path);
}

int ck_nodepart_sort(struct ck_nodepart *p)
{
    if (p->nfiles > 1)
        qsort(p->files, p->nfiles, sizeof *p->files, cmp_file);
    for (size_t i = 1; i < p->nfiles; i++)
        if (!strcmp(p->files[i - 1].path, p->files[i].path))
            return ck_error(CK_EFORMAT, "part of '%s': '%s' is listed twice", p->checkpoint,
                            p->files[i].path);
    return 0;
}

/* ---- emitting ---- */

static void kv_str(struct ck_yaml_out *o, const char *k, const char *v)
{
    ck_yaml_str(o, k);
    ck_yaml_str(o, v);
}

static void kv_int(struct ck_yaml_out *o, const char *k, int64_t v)
{
    ck_yaml_str(o, k);
    ck_yaml_int(o, v);
}

static void emit_files(struct ck_yaml_out *o, const struct ck_nodefile *v, size_t n, bool sha)
{
    ck_yaml_str(o, "files");
    ck_yaml_seq_begin(o);
    for (size_t i = 0; i < n; i++) {
        ck_yaml_map_begin(o);
        kv_str(o, "path", v[i].path);
        kv_int(o, "size", (int64_t)v[i].size);
        kv_str(o, "md5", v[i].md5);
        if (sha)
            kv_str(o, "sha256", v[i].sha256);
        ck_yaml_map_end(o);
    }
    ck_yaml_seq_end(o);
}

/* The head both files share: format, checkpoint, step (when known), epoch. */
static void emit_head(struct ck_yaml_out *o, const char *format, const char *ckpt, bool has_step,
                      int64_t step, int64_t epoch)
{
    ck_yaml_map_begin(o);
    kv_str(o, "format", format);
    kv_str(o, "checkpoint", ckpt);
    ck_yaml_str(o, "step");
    if (has_step)
        ck_yaml_int(o, step);
    else
        ck_yaml_null(o);
    kv_int(o, "epoch", epoch);
}

int ck_nodepart_emit(const struct ck_nodepart *p, struct ck_buf *out)
{
    struct ck_yaml_out o;
    int err = ck_yaml_out_begin(&o, out);
    if (err < 0)
        return err;
    emit_head(&o, CK_NODEPART_FORMAT, p->checkpoint, p->has_step, p->step, p->epoch);
    ck_yaml_str(&o, "node");
    ck_yaml_map_begin(&o);
    kv_int(&o, "rank", p->rank);
    kv_int(&o, "count", p->count);
    ck_yaml_map_end(&o);
    kv_str(&o, "training", p->failed ? "failed" : "running");
    ck_yaml_str(&o, "settled");
    ck_yaml_float(&o, p->settled);
    emit_files(&o, p->files, p->nfiles, true);
    ck_yaml_map_end(&o);
    return ck_yaml_out_end(&o);
}

int ck_nodecommit_emit(const struct ck_nodecommit *c, struct ck_buf *out)
{
    struct ck_yaml_out o;
    int err = ck_yaml_out_begin(&o, out);
    if (err < 0)
        return err;
    emit_head(&o, CK_NODECOMMIT_FORMAT, c->checkpoint, c->has_step, c->step, c->epoch);
    kv_int(&o, "nodes", c->count);
    ck_yaml_str(&o, "settled");
    ck_yaml_float(&o, c->settled);
    ck_yaml_str(&o, "parts");
    ck_yaml_seq_begin(&o);
    for (int i = 0; i < c->count; i++) {
        ck_yaml_map_begin(&o);
        kv_int(&o, "rank", i);
        kv_str(&o, "md5", c->part_md5[i]);
        ck_yaml_map_end(&o);
    }
    ck_yaml_seq_end(&o);
    emit_files(&o, c->files, c->nfiles, false);
    ck_yaml_map_end(&o);
    return ck_yaml_out_end(&o);
}

int ck_nodecommit_md5sums(const struct ck_nodecommit *c, struct ck_buf *out)
{
    int err = 0;
    for (size_t i = 0; i < c->nfiles && err == 0; i++)
        err = ck_buf_printf(out, "%s  %s\n", c->files[i].md5, c->files[i].path);
    return err;
}

/* ---- building the record ---- */

struct tagged {
    const struct ck_nodefile *f;
    int rank;
};

static int cmp_tagged(const void *a, const void *b)
{
    const struct tagged *x = a, *y = b;
    int c = strcmp(x->f->path, y->f->path);
    return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

static int copy_file(struct ck_nodefile *dst, const struct ck_nodefile *src)
{
    *dst = *src;
    dst->sha256[0] = '\0';
    if (!(dst->path = strdup(src->path)))
        return ck_error(CK_ENOMEM, "out of memory");
    return 0;
}

int ck_nodecommit_build(struct ck_nodecommit *c, const struct ck_nodepart *parts, size_t n,
                        const char (*md5s)[33])
{
    size_t total = 0;
    int err = 0;
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < n; i++)
        total += parts[i].nfiles;
    if (n == 0 || total > CK_NODEPART_MAX_FILES)
        return ck_error(CK_ESIZE, "a step of %zu parts and %zu files", n, total);
    /* every file with the rank that lists it, sorted by path then rank */
    struct tagged *all = malloc((total ? total : 1) * sizeof *all);
    c->files = calloc(total ? total : 1, sizeof *c->files);
    c->part_md5 = calloc(n, sizeof *c->part_md5);
    c->checkpoint = strdup(parts[0].checkpoint);
    if (!all || !c->files || !c->part_md5 || !c->checkpoint) {
        free(all);
        ck_nodecommit_release(c);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(c->part_md5[i], md5s[i], 33);
        if (parts[i].settled > c->settled)
            c->settled = parts[i].settled;
        for (size_t j = 0; j < parts[i].nfiles; j++)
            all[k++] = (struct tagged){&parts[i].files[j], parts[i].rank};
    }
    qsort(all, total, sizeof *all, cmp_tagged);
    for (size_t i = 0; i < total && err == 0; i++) {
        if (i > 0 && !strcmp(all[i - 1].f->path, all[i].f->path)) {
            const struct ck_nodefile *x = all[i - 1].f, *y = all[i].f;
            if (x->size != y->size || strcmp(x->md5, y->md5))
                err = ck_error(CK_EEXIST,
                               "'%s' is listed by node %d (%llu bytes, md5 %s) and by node %d "
                               "(%llu bytes, md5 %s)",
                               x->path, all[i - 1].rank, (unsigned long long)x->size, x->md5,
                               all[i].rank, (unsigned long long)y->size, y->md5);
            continue;
        }
        if ((err = copy_file(&c->files[c->nfiles], all[i].f)) == 0)
            c->nfiles++;
    }
    free(all);
    if (err < 0) {
        ck_nodecommit_release(c);
        return err;
    }
    c->has_step = parts[0].has_step;
    c->step = parts[0].step;
    c->epoch = parts[0].epoch;
    c->count = (int)n;
    return 0;
}

/* ---- parsing (hostile input: both files come back from a shared store) ---- */

struct pctx {
    struct ck_yaml_doc *doc;
    const char *name;
};

#define fail(c, n, ...) ck_yaml_error_at((c)->name, (n), __VA_ARGS__)

/* Fills vals[i] with the value of names[i]; every key known, none twice,
 * each required one there (optional: a bit per name). */
static int keys(struct pctx *c, yaml_node_t *map, const char *where, const char *const *names,
                size_t n, yaml_node_t **vals)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return fail(c, map, "'%s' must be a mapping", where);
    for (size_t i = 0; i < n; i++)
        vals[i] = NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = ck_yaml_node(c->doc, p->key);
        struct ck_yaml_value kv;
        ck_yaml_resolve(k, &kv);
        size_t i = n;
        if (kv.type == CK_Y_STR)
            for (i = 0; i < n; i++)
                if (strlen(names[i]) == kv.len && !memcmp(names[i], kv.s, kv.len))
                    break;
        if (i == n)
            return fail(c, k, "unexpected key in '%s'", where);
        if (vals[i])
            return fail(c, k, "duplicate key '%s' in '%s'", names[i], where);
        vals[i] = ck_yaml_node(c->doc, p->value);
    }
    for (size_t i = 0; i < n; i++)
        if (!vals[i])
            return fail(c, map, "'%s' is missing the key '%s'", where, names[i]);
    return 0;
}

static int get_int(struct pctx *c, yaml_node_t *n, const char *what, int64_t lo, int64_t hi,
                   int64_t *out)
{
    struct ck_yaml_value v;
    ck_yaml_resolve(n, &v);
    if (v.type != CK_Y_INT || v.i < lo || v.i > hi)
        return fail(c, n, "'%s' must be a whole number from %lld to %lld", what, (long long)lo,
                    (long long)hi);
    *out = v.i;
    return 0;
}

static int get_str(struct pctx *c, yaml_node_t *n, const char *what, size_t max, char **out)
{
    struct ck_yaml_value v;
    ck_yaml_resolve(n, &v);
    if (v.type != CK_Y_STR || v.len == 0 || v.len > max || memchr(v.s, '\0', v.len))
        return fail(c, n, "'%s' must be a non-empty string of at most %zu bytes", what, max);
    if (!(*out = strndup(v.s, v.len)))
        return ck_error(CK_ENOMEM, "out of memory");
    return 0;
}

static int get_hex(struct pctx *c, yaml_node_t *n, const char *what, size_t len, char *out)
{
    struct ck_yaml_value v;
    ck_yaml_resolve(n, &v);
    bool ok = v.type == CK_Y_STR && v.len == len;
    for (size_t i = 0; ok && i < len; i++)
        ok = (v.s[i] >= '0' && v.s[i] <= '9') || (v.s[i] >= 'a' && v.s[i] <= 'f');
    if (!ok)
        return fail(c, n, "'%s' must be %zu lower-case hex digits", what, len);
    memcpy(out, v.s, len);
    out[len] = '\0';
    return 0;
}

static int get_seconds(struct pctx *c, yaml_node_t *n, const char *what, double *out)
{
    struct ck_yaml_value v;
    ck_yaml_resolve(n, &v);
    if (v.type == CK_Y_INT && v.i >= 0)
        *out = (double)v.i;
    else if (v.type == CK_Y_FLOAT && isfinite(v.f) && v.f >= 0 && v.f < 1e12)
        *out = v.f;
    else
        return fail(c, n, "'%s' must be a time in seconds", what);
    return 0;
}

static int get_format(struct pctx *c, yaml_node_t *n, const char *want)
{
    struct ck_yaml_value v;
    ck_yaml_resolve(n, &v);
    if (v.type != CK_Y_STR || v.len != strlen(want) || memcmp(v.s, want, v.len))
        return fail(c, n, "'format' must be '%s'", want);
    return 0;
}

static int get_step(struct pctx *c, yaml_node_t *n, bool *has, int64_t *step)
{
    struct ck_yaml_value v;
    ck_yaml_resolve(n, &v);
    *has = v.type != CK_Y_NULL;
    return *has ? get_int(c, n, "step", 0, INT64_MAX, step) : 0;
}

static int get_files(struct pctx *c, yaml_node_t *seq, bool sha, struct ck_nodefile **out,
                     size_t *nout)
{
    static const char *const fk[] = {"path", "size", "md5", "sha256"};
    *out = NULL;
    *nout = 0;
    if (seq->type != YAML_SEQUENCE_NODE)
        return fail(c, seq, "'files' must be a list");
    size_t n = (size_t)(seq->data.sequence.items.top - seq->data.sequence.items.start);
    if (n > CK_NODEPART_MAX_FILES)
        return fail(c, seq, "'files' lists %zu files (at most %d)", n, CK_NODEPART_MAX_FILES);
    struct ck_nodefile *v = calloc(n ? n : 1, sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    *out = v;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = ck_yaml_node(c->doc, seq->data.sequence.items.start[i]), *f[4];
        int64_t size = 0;
        int err;
        if ((err = keys(c, item, "files[]", fk, sha ? 4 : 3, f)) < 0 ||
            (err = get_str(c, f[0], "path", 4095, &v[i].path)) < 0)
            return err;
        (*nout)++;
        if (!ck_nodefile_path_is_valid(v[i].path))
            return fail(c, f[0], "'path' '%s' is not a relative path the tree can hold",
                        v[i].path);
        if ((err = get_int(c, f[1], "size", 0, INT64_MAX, &size)) < 0 ||
            (err = get_hex(c, f[2], "md5", 32, v[i].md5)) < 0 ||
            (sha && (err = get_hex(c, f[3], "sha256", 64, v[i].sha256)) < 0))
            return err;
        v[i].size = (uint64_t)size;
        if (i > 0 && strcmp(v[i - 1].path, v[i].path) >= 0)
            return fail(c, f[0], "'files' must be sorted by path, each once ('%s' after '%s')",
                        v[i].path, v[i - 1].path);
    }
    return 0;
}

static int load(struct ck_yaml_doc *doc, struct pctx *c, const char *name, const char *data,
                size_t len)
{
    c->doc = doc;
    c->name = name;
    if (len > CK_NODEPART_MAX)
        return ck_error(CK_ESIZE, "'%s': %zu bytes (at most %u)", name, len, CK_NODEPART_MAX);
    return ck_yaml_load(doc, name, data, len);
}

int ck_nodepart_parse(struct ck_nodepart *p, const char *name, const char *data, size_t len)
{
    static const char *const tk[] = {"format", "checkpoint", "step",    "epoch",
                                     "node",   "training",   "settled", "files"};
    static const char *const nk[] = {"rank", "count"};
    struct ck_yaml_doc doc = {0};
    struct pctx c;
    yaml_node_t *t[8], *nd[2];
    int64_t rank, count;
    memset(p, 0, sizeof *p);
    int err = load(&doc, &c, name, data, len);
    if (err == 0)
        err = keys(&c, ck_yaml_root(&doc), "the part", tk, 8, t);
    if (err == 0 && (err = get_format(&c, t[0], CK_NODEPART_FORMAT)) == 0 &&
        (err = get_str(&c, t[1], "checkpoint", 1024, &p->checkpoint)) == 0 &&
        (err = get_step(&c, t[2], &p->has_step, &p->step)) == 0 &&
        (err = get_int(&c, t[3], "epoch", 0, INT64_MAX, &p->epoch)) == 0 &&
        (err = keys(&c, t[4], "node", nk, 2, nd)) == 0 &&
        (err = get_int(&c, nd[1], "node.count", 1, 65536, &count)) == 0 &&
        (err = get_int(&c, nd[0], "node.rank", 0, count - 1, &rank)) == 0) {
        struct ck_yaml_value v;
        ck_yaml_resolve(t[5], &v);
        p->rank = (int)rank;
        p->count = (int)count;
        if (v.type == CK_Y_STR && v.len == 6 && !memcmp(v.s, "failed", 6))
            p->failed = true;
        else if (!(v.type == CK_Y_STR && v.len == 7 && !memcmp(v.s, "running", 7)))
            err = fail(&c, t[5], "'training' must be 'running' or 'failed'");
    }
    if (err == 0 && (err = get_seconds(&c, t[6], "settled", &p->settled)) == 0)
        err = get_files(&c, t[7], true, &p->files, &p->nfiles);
    ck_yaml_release(&doc);
    if (err < 0)
        ck_nodepart_release(p);
    return err;
}

int ck_nodecommit_parse(struct ck_nodecommit *r, const char *name, const char *data, size_t len)
{
    static const char *const tk[] = {"format", "checkpoint", "step",  "epoch",
                                     "nodes",  "settled",    "parts", "files"};
    static const char *const pk[] = {"rank", "md5"};
    struct ck_yaml_doc doc = {0};
    struct pctx c;
    yaml_node_t *t[8];
    int64_t count = 0;
    memset(r, 0, sizeof *r);
    int err = load(&doc, &c, name, data, len);
    if (err == 0)
        err = keys(&c, ck_yaml_root(&doc), "the record", tk, 8, t);
    if (err == 0 && (err = get_format(&c, t[0], CK_NODECOMMIT_FORMAT)) == 0 &&
        (err = get_str(&c, t[1], "checkpoint", 1024, &r->checkpoint)) == 0 &&
        (err = get_step(&c, t[2], &r->has_step, &r->step)) == 0 &&
        (err = get_int(&c, t[3], "epoch", 0, INT64_MAX, &r->epoch)) == 0 &&
        (err = get_int(&c, t[4], "nodes", 1, 65536, &count)) == 0 &&
        (err = get_seconds(&c, t[5], "settled", &r->settled)) == 0) {
        yaml_node_t *seq = t[6];
        r->count = (int)count;
        if (seq->type != YAML_SEQUENCE_NODE ||
            seq->data.sequence.items.top - seq->data.sequence.items.start != count)
            err = fail(&c, seq, "'parts' must list the %lld parts", (long long)count);
        else if (!(r->part_md5 = calloc((size_t)count, sizeof *r->part_md5)))
            err = ck_error(CK_ENOMEM, "out of memory");
        for (int64_t i = 0; err == 0 && i < count; i++) {
            yaml_node_t *pv[2];
            int64_t rank;
            if ((err = keys(&c, ck_yaml_node(&doc, seq->data.sequence.items.start[i]), "parts[]",
                            pk, 2, pv)) == 0 &&
                (err = get_int(&c, pv[0], "parts[].rank", i, i, &rank)) == 0)
                err = get_hex(&c, pv[1], "parts[].md5", 32, r->part_md5[i]);
        }
    }
    if (err == 0)
        err = get_files(&c, t[7], false, &r->files, &r->nfiles);
    ck_yaml_release(&doc);
    if (err < 0)
        ck_nodecommit_release(r);
    return err;
}
