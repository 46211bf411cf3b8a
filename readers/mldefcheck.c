/* The rules of docs/mldef.md, each checked on its own so that one report
 * lists every violation; see mldefcheck.h. This file: the report, typed
 * access to the manifest, files and data files, and the walk over the
 * whole; mldeflayers.c checks layers, node ranges and tests, mldefsig.c
 * the SIGNATURE. */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/sign.h"
#include "model/mldef.h"
#include "readers/mldefctx.h"
#include "readers/zipin.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ck_mldefc_vio(struct ck_mldefc *c, const char *rule, const char *where, const char *fmt, ...)
{
    struct ck_mldef_report *r = c->r;
    if (r->n >= CK_MLDEFC_MAX_VIOLATIONS) {
        r->dropped++;
        return;
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 16;
        struct ck_mldef_violation *v = realloc(r->v, cap * sizeof *v);
        if (!v) {
            r->dropped++;
            return;
        }
        r->v = v;
        r->cap = cap;
    }
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct ck_mldef_violation *x = &r->v[r->n];
    x->rule = strdup(rule);
    x->where = strdup(where);
    x->msg = strdup(msg);
    if (!x->rule || !x->where || !x->msg) {
        free(x->rule), free(x->where), free(x->msg);
        r->dropped++;
        return;
    }
    r->n++;
}

void ck_mldef_report_release(struct ck_mldef_report *r)
{
    for (size_t i = 0; i < r->n; i++) {
        free(r->v[i].rule);
        free(r->v[i].where);
        free(r->v[i].msg);
    }
    free(r->v);
    memset(r, 0, sizeof *r);
}

bool ck_mldefc_push(const char ***v, size_t *n, size_t *cap, const char *s)
{
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        const char **a = realloc((void *)*v, nc * sizeof *a);
        if (!a)
            return false;
        *v = a;
        *cap = nc;
    }
    (*v)[(*n)++] = s;
    return true;
}

bool ck_mldefc_has(const char *const *v, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i], s) == 0)
            return true;
    return false;
}

/* ---- typed access to JSON members ---- */

const char *ck_mldefc_str(struct ck_mldefc *c, const struct ck_jin *obj, const char *key,
                          bool required, const char *where)
{
    const struct ck_jin *v = ck_jin_get(obj, key);
    if (!v) {
        if (required)
            ck_mldefc_vio(c, "manifest.key", where, "'%s' is missing", key);
        return NULL;
    }
    if (v->type != CK_JIN_STRING) {
        ck_mldefc_vio(c, "manifest.key", where, "'%s' is not a string", key);
        return NULL;
    }
    return v->str;
}

bool ck_mldefc_uint(struct ck_mldefc *c, const struct ck_jin *obj, const char *key, uint64_t *out,
                    const char *where)
{
    const struct ck_jin *v = ck_jin_get(obj, key);
    if (!v)
        return false;
    if (!ck_jin_uint(v, out)) {
        ck_mldefc_vio(c, "manifest.key", where, "'%s' is not a non-negative integer", key);
        return false;
    }
    return true;
}

bool ck_mldefc_int(const struct ck_jin *v, int64_t *out)
{
    if (!v || v->type != CK_JIN_NUMBER || strpbrk(v->str, ".eE"))
        return false;
    char *end;
    errno = 0;
    long long x = strtoll(v->str, &end, 10);
    if (errno || *end)
        return false;
    *out = x;
    return true;
}

bool ck_mldefc_num(const struct ck_jin *v, double *out)
{
    if (!v || v->type != CK_JIN_NUMBER)
        return false;
    *out = strtod(v->str, NULL);
    return true;
}

/* A "Shape" array: rank and dims; element count (0 when a dim is negative). */
bool ck_mldefc_shape(struct ck_mldefc *c, const struct ck_jin *obj, const char *where, int *rank,
                     int64_t *dims, bool allow_any)
{
    const struct ck_jin *v = ck_jin_get(obj, "Shape");
    if (!v)
        return false;
    if (v->type != CK_JIN_ARRAY || v->n > CK_TENSOR_MAX_RANK) {
        ck_mldefc_vio(c, "manifest.key", where, "'Shape' is not an array of at most %d integers",
                      CK_TENSOR_MAX_RANK);
        return false;
    }
    int k = 0;
    for (const struct ck_jin *d = v->first; d; d = d->next, k++)
        if (!ck_mldefc_int(d, &dims[k]) || dims[k] < (allow_any ? -1 : 0) ||
            dims[k] > (INT64_C(1) << 40)) {
            ck_mldefc_vio(c, "manifest.key", where, "'Shape'[%d] is not a dimension", k);
            return false;
        }
    *rank = k;
    return true;
}

uint64_t ck_mldefc_numel(int rank, const int64_t *dims, bool skip_batch, bool *overflow)
{
    uint64_t n = 1;
    *overflow = false;
    for (int d = skip_batch ? 1 : 0; d < rank; d++) {
        if (dims[d] < 0)
            return 0;
        if (dims[d] && n > UINT64_MAX / (uint64_t)dims[d]) {
            *overflow = true;
            return 0;
        }
        n *= (uint64_t)dims[d];
    }
    return n;
}

bool ck_mldefc_has_word(const char *list, const char *word)
{
    size_t wl = strlen(word);
    for (const char *p = list; p && *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t n = strcspn(p, ",");
        size_t t = n;
        while (t && p[t - 1] == ' ')
            t--;
        if (t == wl && strncmp(p, word, wl) == 0)
            return true;
        p += n;
    }
    return false;
}

/* ---- files ---- */

bool ck_mldefc_file_ok(struct ck_mldefc *c, const char *path, const char *where)
{
    char why[160];
    const char *rule = ck_mldef_path_rule(path, why, sizeof why);
    if (rule) {
        ck_mldefc_vio(c, rule, where, "'%s': %s", path, why);
        return false;
    }
    uint64_t size;
    if (!ck_mldef_src_size(&c->src, path, &size)) {
        ck_mldefc_vio(c, "datafile.missing", where, "'%s' is not in the %s", path,
                      c->src.is_zip ? "archive" : "manifest's folder");
        return false;
    }
    if (!c->src.is_zip && !ck_mldefc_has(c->files, c->nfiles, path))
        ck_mldefc_push(&c->files, &c->nfiles, &c->capfiles, path);
    return true;
}

/* Counts (and, with out, stores) the values of a csv file. */
int ck_mldefc_csv(struct ck_mldefc *c, const char *path, const unsigned char *p, uint64_t len,
                  double *out, uint64_t *count)
{
    uint64_t n = 0, line = 1;
    const char *s = (const char *)p, *end = s + len;
    if (len >= 3 && p[0] == 0xef && p[1] == 0xbb && p[2] == 0xbf) {
        ck_mldefc_vio(c, "datafile.csv", path, "starts with a byte order mark");
        return -1;
    }
    while (s < end) {
        while (s < end && (*s == ' ' || *s == '\t'))
            s++;
        if (s < end && (*s == '\n' || *s == '\r')) {
            if (*s == '\n')
                line++;
            s++;
            continue;
        }
        if (s == end)
            break;
        char tmp[64];
        size_t k = 0;
        while (s + k < end && k < sizeof tmp - 1 && !strchr(",\n\r \t", s[k]))
            k++;
        memcpy(tmp, s, k);
        tmp[k] = '\0';
        char *e;
        double v = k ? strtod(tmp, &e) : 0;
        if (!k || *e) {
            ck_mldefc_vio(c, "datafile.csv", path, "line %llu: '%s' is not a number",
                          (unsigned long long)line, tmp);
            return -1;
        }
        if (out)
            out[n] = v;
        n++;
        s += k;
        while (s < end && (*s == ' ' || *s == '\t'))
            s++;
        if (s < end && *s == ',') {
            s++;
            while (s < end && (*s == ' ' || *s == '\t'))
                s++;
            if (s == end || *s == '\n' || *s == '\r' || *s == ',') {
                ck_mldefc_vio(c, "datafile.csv", path, "line %llu: empty value",
                              (unsigned long long)line);
                return -1;
            }
        }
    }
    *count = n;
    return 0;
}

const char *ck_mldefc_ext(const char *path)
{
    const char *d = strrchr(path, '.');
    return d ? d : "";
}

static void data_files(struct ck_mldefc *c)
{
    const struct ck_jin *a = ck_jin_get(c->root, "DataFiles");
    if (!a)
        return ck_mldefc_vio(c, "manifest.key", "DataFiles", "missing");
    if (a->type != CK_JIN_ARRAY)
        return ck_mldefc_vio(c, "manifest.key", "DataFiles", "not an array");
    c->dfs = calloc(a->n ? a->n : 1, sizeof *c->dfs);
    if (!c->dfs)
        return;
    char where[64];
    for (const struct ck_jin *f = a->first; f; f = f->next) {
        snprintf(where, sizeof where, "DataFiles[%zu]", c->ndfs);
        struct ck_mldefc_df *d = &c->dfs[c->ndfs++];
        if (f->type != CK_JIN_OBJECT) {
            ck_mldefc_vio(c, "manifest.key", where, "not an object");
            continue;
        }
        d->name = ck_mldefc_str(c, f, "Name", true, where);
        d->path = ck_mldefc_str(c, f, "Path", true, where);
        for (size_t k = 0; d->name && k + 1 < c->ndfs; k++)
            if (c->dfs[k].name && strcmp(c->dfs[k].name, d->name) == 0)
                ck_mldefc_vio(c, "datafile.name", where, "data file name '%s' used twice", d->name);
        for (size_t k = 0; d->path && k + 1 < c->ndfs; k++)
            if (c->dfs[k].path && strcmp(c->dfs[k].path, d->path) == 0)
                ck_mldefc_vio(c, "files.duplicate", where, "'%s' declared twice", d->path);
        if (!d->name || !d->path || !ck_mldefc_file_ok(c, d->path, where))
            continue;
        const char *e = ck_mldefc_ext(d->path);
        d->csv = strcmp(e, ".csv") == 0;
        d->es = strcmp(e, ".float32") == 0 ? 4 : (strcmp(e, ".float64") == 0 || d->csv) ? 8 : 0;
        if (!d->es) {
            ck_mldefc_vio(c, "datafile.extension", where, "'%s': not .float32, .float64 or .csv",
                          d->path);
            continue;
        }
        uint64_t sb;
        const char *sf = ck_mldefc_str(c, f, "StorageFormat", false, where);
        if (ck_mldefc_uint(c, f, "StorageBytes", &sb, where) && sb != (uint64_t)d->es)
            ck_mldefc_vio(c, "datafile.storage", where, "StorageBytes %llu for '%s' (%d expected)",
                          (unsigned long long)sb, d->path, d->es);
        if (sf && strcmp(sf, "float") != 0)
            ck_mldefc_vio(c, "datafile.storage", where,
                          "StorageFormat '%s': only 'float' is supported", sf);
        uint64_t size;
        ck_mldef_src_size(&c->src, d->path, &size);
        if (d->csv) {
            const unsigned char *p;
            uint64_t len;
            if (ck_mldef_src_read(&c->src, d->path, CK_MLDEFC_MAX_CSV, c->set, &p, &len) < 0) {
                ck_mldefc_vio(c, "datafile.csv", d->path, "%s", ck_error_msg());
                continue;
            }
            if (ck_mldefc_csv(c, d->path, p, len, NULL, &d->npoints) < 0)
                continue;
            if (c->load) {
                void *buf;
                uint64_t n2;
                if (ck_tensor_set_alloc(c->set, d->npoints * 8 + 1, &buf) < 0) {
                    ck_mldefc_vio(c, "datafile.csv", d->path, "%s", ck_error_msg());
                    continue;
                }
                ck_mldefc_csv(c, d->path, p, len, buf, &n2);
                d->data = buf;
            }
        } else {
            if (size % (uint64_t)d->es) {
                ck_mldefc_vio(c, "datafile.size", d->path,
                              "%llu bytes is not a whole number of %d-byte "
                              "floats",
                              (unsigned long long)size, d->es);
                continue;
            }
            d->npoints = size / (uint64_t)d->es;
            if (c->load) {
                uint64_t len;
                if (ck_mldef_src_read(&c->src, d->path, CK_TENSOR_ALLOC_MAX, c->set, &d->data,
                                      &len) < 0) {
                    ck_mldefc_vio(c, "datafile.size", d->path, "%s", ck_error_msg());
                    continue;
                }
            }
        }
        d->ok = true;
    }
}

struct ck_mldefc_df *ck_mldefc_find_df(struct ck_mldefc *c, const char *name)
{
    for (size_t i = 0; i < c->ndfs; i++)
        if (c->dfs[i].name && strcmp(c->dfs[i].name, name) == 0)
            return &c->dfs[i];
    return NULL;
}

/* ---- the whole ---- */

static void archive_names(struct ck_mldefc *c)
{
    if (!c->src.is_zip)
        return;
    struct ck_strset seen = CK_STRSET_INIT; /* one look-up per entry: 70k entries took 5 s */
    for (size_t i = 0; i < c->src.n; i++) {
        const char *name = c->src.names[i];
        char why[160];
        bool twice = false;
        const char *rule = ck_mldef_path_rule(name, why, sizeof why);
        if (rule)
            ck_mldefc_vio(c, rule, name, "%s", why);
        if (ck_strset_put(&seen, name, i, &twice) < 0)
            ck_mldefc_vio(c, "files.count", c->src.path, "%s", ck_error_msg());
        if (twice)
            ck_mldefc_vio(c, "files.duplicate", name, "two entries with this name");
    }
    ck_strset_release(&seen);
    if (c->src.n > CK_MLDEF_MAX_FILES)
        ck_mldefc_vio(c, "files.count", c->src.path, "%zu files (at most %d)", c->src.n,
                      CK_MLDEF_MAX_FILES);
}

static void key_order(struct ck_mldefc *c)
{
    int pos_df = -1, pos_layers = -1, pos_tests = -1, k = 0;
    for (const struct ck_jin *v = c->root->first; v; v = v->next, k++) {
        if (strcmp(v->key, "DataFiles") == 0)
            pos_df = k;
        else if (strcmp(v->key, "Layers") == 0)
            pos_layers = k;
        else if (strcmp(v->key, "Tests") == 0)
            pos_tests = k;
    }
    if (pos_df >= 0 &&
        ((pos_layers >= 0 && pos_layers < pos_df) || (pos_tests >= 0 && pos_tests < pos_df)))
        ck_mldefc_vio(c, "datafile.declared", "DataFiles",
                      "data files are declared after they are used "
                      "(DataFiles must come before Layers and Tests)");
}

static void model_section(struct ck_mldefc *c)
{
    const struct ck_jin *m = ck_jin_get(c->root, "Model");
    if (!m)
        return ck_mldefc_vio(c, "model.section", "Model", "missing");
    if (m->type != CK_JIN_OBJECT)
        return ck_mldefc_vio(c, "model.section", "Model", "not an object");
    const char *name = ck_mldefc_str(c, m, "Name", true, "Model");
    static const char *const texts[] = {"Description", "Tags",   "AuthorName", "AuthorEmail",
                                        "Url",         "Source", NULL};
    for (const char *const *t = texts; *t; t++)
        ck_mldefc_str(c, m, *t, false, "Model");
    const char *lic = ck_mldefc_str(c, m, "LicenseFile", false, "Model");
    if (lic)
        ck_mldefc_file_ok(c, lic, "Model.LicenseFile");
    if (c->load && name && !(c->m->name = strdup(name)))
        ck_mldefc_vio(c, "model.section", "Model", "out of memory");
}

static void walk(struct ck_mldefc *c, const struct ck_mldef_check_opts *o)
{
    struct ck_mldefc_walk w = {0};
    const unsigned char *text;
    uint64_t len;
    uint64_t size;
    const char *mname = c->src.is_zip ? CK_MLDEF_MANIFEST : ck_basename(c->src.path);
    if (c->src.is_zip && !ck_mldef_src_size(&c->src, CK_MLDEF_MANIFEST, &size))
        return ck_mldefc_vio(c, "manifest.missing", c->src.path, "no manifest.json at the root");
    int err;
    if (c->src.is_zip)
        err = ck_mldef_src_read(&c->src, CK_MLDEF_MANIFEST, CK_MLDEF_MAX_MANIFEST, c->set, &text,
                                &len);
    else
        err = ck_tensor_set_map_file(c->set, c->src.path, &text, &len);
    if (err < 0)
        return ck_mldefc_vio(c, "manifest.json", mname, "%s", ck_error_msg());
    if (len > CK_MLDEF_MAX_MANIFEST)
        return ck_mldefc_vio(c, "manifest.json", mname, "%llu bytes (at most %u)",
                             (unsigned long long)len, CK_MLDEF_MAX_MANIFEST);
    if (len >= 3 && text[0] == 0xef && text[1] == 0xbb && text[2] == 0xbf)
        ck_mldefc_vio(c, "manifest.json", mname, "starts with a byte order mark");
    if (ck_jin_parse((const char *)text, len, &c->doc, &c->root) < 0)
        return ck_mldefc_vio(c, "manifest.json", mname, "%s", ck_error_msg());
    if (c->root->type != CK_JIN_OBJECT) {
        ck_mldefc_vio(c, "manifest.json", mname, "not a JSON object");
        goto out;
    }
    const char *fmt = ck_mldefc_str(c, c->root, "Format", true, "Format");
    uint64_t ver = 0;
    if (fmt && strcmp(fmt, "mldef") != 0)
        ck_mldefc_vio(c, "manifest.format", "Format", "'%s' is not 'mldef'", fmt);
    if (!ck_mldefc_uint(c, c->root, "FormatVersion", &ver, "FormatVersion") ||
        ver != CK_MLDEF_FORMAT_VERSION)
        ck_mldefc_vio(c, "manifest.format", "FormatVersion", "not %d", CK_MLDEF_FORMAT_VERSION);
    key_order(c);
    model_section(c);
    data_files(c);
    ck_mldefc_layers(c, &w);
    ck_mldefc_node_ranges(c, &w);
    ck_mldefc_tests(c, &w);
    if (!c->src.is_zip) {
        size_t n = 1 + c->nfiles + ck_mldef_src_size(&c->src, CK_MLDEF_SIGNATURE, &size);
        if (n > CK_MLDEF_MAX_FILES)
            ck_mldefc_vio(c, "files.count", mname, "%zu files (at most %d)", n, CK_MLDEF_MAX_FILES);
        c->r->nfiles = n;
    }
    if (!c->load)
        ck_mldefc_signature(c, o);
out:
    free(w.in);
    free(w.last_outputs);
    free((void *)w.layer_names);
    ck_strset_release(&w.layerset);
}

static void ctx_release(struct ck_mldefc *c)
{
    ck_jin_free(c->doc);
    c->doc = NULL;
    c->root = NULL;
    free(c->dfs);
    free((void *)c->values);
    ck_strset_release(&c->valueset);
    free((void *)c->files);
    c->dfs = NULL;
    c->values = c->files = NULL;
    c->ndfs = c->nvalues = c->capvalues = c->nfiles = c->capfiles = 0;
}

int ck_mldef_check(const char *path, const struct ck_mldef_check_opts *o, struct ck_mldef_report *r,
                   struct ck_model **model)
{
    memset(r, 0, sizeof *r);
    if (model)
        *model = NULL;
    struct ck_mldefc c = {.r = r};
    if (ck_mldef_src_open(&c.src, path) < 0) {
        ck_mldefc_vio(&c, "zip.open", path, "%s", ck_error_msg());
        return 0;
    }
    r->is_zip = c.src.is_zip;
    r->nfiles = c.src.n;
    if (!(c.set = ck_tensor_set_new("mldef", path))) {
        ck_mldef_src_close(&c.src);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    archive_names(&c);
    /* every member's CRC-32 and true size, read or not by the rules below:
     * the same check inspect --verify makes (readers/zipin.h) */
    if (c.src.is_zip && ck_zipin_check_file(path, true) < 0)
        ck_mldefc_vio(&c, "zip.member", path, "%s", ck_error_msg());
    walk(&c, o);
    ctx_release(&c);
    ck_tensor_set_free(c.set);
    c.set = NULL;
    int err = 0;
    if (model && r->n == 0 && r->dropped == 0) {
        /* Second pass: the same walk, now trusting the checked sizes and
         * building the model; any failure here is still reported. */
        c.load = true;
        struct ck_tensor_set *set = ck_tensor_set_new("mldef", path);
        if (!set || (err = ck_model_new(set, "mldef", &c.m)) < 0) {
            err = ck_error(CK_ENOMEM, "out of memory");
            goto out;
        }
        c.set = set;
        walk(&c, o);
        ctx_release(&c);
        if (r->n == 0 && (err = ck_model_check(c.m)) < 0)
            ck_mldefc_vio(&c, "layer.inputs", path, "%s", ck_error_msg());
        err = 0;
        if (r->n == 0)
            *model = c.m;
        else
            ck_model_free(c.m);
    }
out:
    ck_mldef_src_close(&c.src);
    return err;
}

int ck_mldef_manifest_files(const char *manifest, char ***names, size_t *n)
{
    struct ck_mldef_report r;
    struct ck_mldefc c = {.r = &r};
    memset(&r, 0, sizeof r);
    *names = NULL;
    *n = 0;
    int err = ck_mldef_src_open(&c.src, manifest);
    if (err < 0)
        return err;
    if (c.src.is_zip) {
        ck_mldef_src_close(&c.src);
        return ck_error(CK_EUSAGE, "'%s': not a manifest.json", manifest);
    }
    if (!(c.set = ck_tensor_set_new("mldef", manifest)))
        err = ck_error(CK_ENOMEM, "out of memory");
    else
        walk(&c, NULL);
    if (err == 0 && r.n)
        err = ck_error(CK_EFORMAT, "'%s': %s: %s", manifest, r.v[0].where, r.v[0].msg);
    if (err == 0 && !(*names = calloc(c.nfiles + 1, sizeof **names)))
        err = ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; err == 0 && i < c.nfiles; i++) {
        if (!((*names)[i] = strdup(c.files[i])))
            err = ck_error(CK_ENOMEM, "out of memory");
        *n = i + 1;
    }
    if (err < 0 && *names) {
        for (size_t i = 0; i < *n; i++)
            free((*names)[i]);
        free(*names);
        *names = NULL;
        *n = 0;
    }
    ctx_release(&c);
    ck_tensor_set_free(c.set);
    ck_mldef_src_close(&c.src);
    ck_mldef_report_release(&r);
    return err;
}
