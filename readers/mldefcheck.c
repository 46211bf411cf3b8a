/* The rules of docs/mldef.md, each checked on its own so that one report
 * lists every violation; see mldefcheck.h. */
#include "readers/mldefcheck.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/sign.h"
#include "model/mldef.h"
#include "readers/jsonin.h"
#include "readers/mldefsrc.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VIOLATIONS 1000
#define MAX_CSV (UINT64_C(1) << 30)

struct df {
    const char *name, *path;
    bool ok;
    bool csv;
    int es;              /* bytes per point as stored: 4, 8; csv: 8 after parsing */
    uint64_t npoints;
    const unsigned char *data; /* when loading */
};

struct ctx {
    struct ck_mldef_report *r;
    struct ck_mldef_src src;
    struct ck_tensor_set *set; /* scratch memory; the weights when loading */
    const struct ck_jin *root;
    struct df *dfs;
    size_t ndfs;
    const char **values; /* defined value names */
    size_t nvalues, capvalues;
    const char **files; /* every file the manifest names (for the count and SIGNATURE) */
    size_t nfiles, capfiles;
    bool load;
    struct ck_model *m;
    struct ck_jin_doc *doc; /* owned: the manifest's tree */
};

static void vio(struct ctx *c, const char *rule, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void vio(struct ctx *c, const char *rule, const char *where, const char *fmt, ...)
{
    struct ck_mldef_report *r = c->r;
    if (r->n >= MAX_VIOLATIONS) {
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

static bool push(const char ***v, size_t *n, size_t *cap, const char *s)
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

static bool has(const char *const *v, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i], s) == 0)
            return true;
    return false;
}

/* ---- typed access to JSON members ---- */

static const char *str(struct ctx *c, const struct ck_jin *obj, const char *key, bool required,
                       const char *where)
{
    const struct ck_jin *v = ck_jin_get(obj, key);
    if (!v) {
        if (required)
            vio(c, "manifest.key", where, "'%s' is missing", key);
        return NULL;
    }
    if (v->type != CK_JIN_STRING) {
        vio(c, "manifest.key", where, "'%s' is not a string", key);
        return NULL;
    }
    return v->str;
}

static bool uint_of(struct ctx *c, const struct ck_jin *obj, const char *key, uint64_t *out,
                    const char *where)
{
    const struct ck_jin *v = ck_jin_get(obj, key);
    if (!v)
        return false;
    if (!ck_jin_uint(v, out)) {
        vio(c, "manifest.key", where, "'%s' is not a non-negative integer", key);
        return false;
    }
    return true;
}

static bool int_of(const struct ck_jin *v, int64_t *out)
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

static bool num_of(const struct ck_jin *v, double *out)
{
    if (!v || v->type != CK_JIN_NUMBER)
        return false;
    *out = strtod(v->str, NULL);
    return true;
}

/* A "Shape" array: rank and dims; element count (0 when a dim is negative). */
static bool shape_of(struct ctx *c, const struct ck_jin *obj, const char *where, int *rank,
                     int64_t *dims, bool allow_any)
{
    const struct ck_jin *v = ck_jin_get(obj, "Shape");
    if (!v)
        return false;
    if (v->type != CK_JIN_ARRAY || v->n > CK_TENSOR_MAX_RANK) {
        vio(c, "manifest.key", where, "'Shape' is not an array of at most %d integers",
            CK_TENSOR_MAX_RANK);
        return false;
    }
    int k = 0;
    for (const struct ck_jin *d = v->first; d; d = d->next, k++)
        if (!int_of(d, &dims[k]) || dims[k] < (allow_any ? -1 : 0) ||
            dims[k] > (INT64_C(1) << 40)) {
            vio(c, "manifest.key", where, "'Shape'[%d] is not a dimension", k);
            return false;
        }
    *rank = k;
    return true;
}

static uint64_t numel(int rank, const int64_t *dims, bool skip_batch, bool *overflow)
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

static bool has_word(const char *list, const char *word)
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

static bool file_ok(struct ctx *c, const char *path, const char *where)
{
    char why[160];
    const char *rule = ck_mldef_path_rule(path, why, sizeof why);
    if (rule) {
        vio(c, rule, where, "'%s': %s", path, why);
        return false;
    }
    uint64_t size;
    if (!ck_mldef_src_size(&c->src, path, &size)) {
        vio(c, "datafile.missing", where, "'%s' is not in the %s", path,
            c->src.is_zip ? "archive" : "manifest's folder");
        return false;
    }
    if (!c->src.is_zip && !has(c->files, c->nfiles, path))
        push(&c->files, &c->nfiles, &c->capfiles, path);
    return true;
}

/* Counts (and, with out, stores) the values of a csv file. */
static int csv_parse(struct ctx *c, const char *path, const unsigned char *p, uint64_t len,
                     double *out, uint64_t *count)
{
    uint64_t n = 0, line = 1;
    const char *s = (const char *)p, *end = s + len;
    if (len >= 3 && p[0] == 0xef && p[1] == 0xbb && p[2] == 0xbf) {
        vio(c, "datafile.csv", path, "starts with a byte order mark");
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
            vio(c, "datafile.csv", path, "line %llu: '%s' is not a number", (unsigned long long)line,
                tmp);
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
                vio(c, "datafile.csv", path, "line %llu: empty value", (unsigned long long)line);
                return -1;
            }
        }
    }
    *count = n;
    return 0;
}

static const char *ext(const char *path)
{
    const char *d = strrchr(path, '.');
    return d ? d : "";
}

static void data_files(struct ctx *c)
{
    const struct ck_jin *a = ck_jin_get(c->root, "DataFiles");
    if (!a)
        return vio(c, "manifest.key", "DataFiles", "missing");
    if (a->type != CK_JIN_ARRAY)
        return vio(c, "manifest.key", "DataFiles", "not an array");
    c->dfs = calloc(a->n ? a->n : 1, sizeof *c->dfs);
    if (!c->dfs)
        return;
    char where[64];
    for (const struct ck_jin *f = a->first; f; f = f->next) {
        snprintf(where, sizeof where, "DataFiles[%zu]", c->ndfs);
        struct df *d = &c->dfs[c->ndfs++];
        if (f->type != CK_JIN_OBJECT) {
            vio(c, "manifest.key", where, "not an object");
            continue;
        }
        d->name = str(c, f, "Name", true, where);
        d->path = str(c, f, "Path", true, where);
        for (size_t k = 0; d->name && k + 1 < c->ndfs; k++)
            if (c->dfs[k].name && strcmp(c->dfs[k].name, d->name) == 0)
                vio(c, "datafile.name", where, "data file name '%s' used twice", d->name);
        for (size_t k = 0; d->path && k + 1 < c->ndfs; k++)
            if (c->dfs[k].path && strcmp(c->dfs[k].path, d->path) == 0)
                vio(c, "files.duplicate", where, "'%s' declared twice", d->path);
        if (!d->name || !d->path || !file_ok(c, d->path, where))
            continue;
        const char *e = ext(d->path);
        d->csv = strcmp(e, ".csv") == 0;
        d->es = strcmp(e, ".float32") == 0 ? 4 : (strcmp(e, ".float64") == 0 || d->csv) ? 8 : 0;
        if (!d->es) {
            vio(c, "datafile.extension", where, "'%s': not .float32, .float64 or .csv", d->path);
            continue;
        }
        uint64_t sb;
        const char *sf = str(c, f, "StorageFormat", false, where);
        if (uint_of(c, f, "StorageBytes", &sb, where) && sb != (uint64_t)d->es)
            vio(c, "datafile.storage", where, "StorageBytes %llu for '%s' (%d expected)",
                (unsigned long long)sb, d->path, d->es);
        if (sf && strcmp(sf, "float") != 0)
            vio(c, "datafile.storage", where, "StorageFormat '%s': only 'float' is supported", sf);
        uint64_t size;
        ck_mldef_src_size(&c->src, d->path, &size);
        if (d->csv) {
            const unsigned char *p;
            uint64_t len;
            if (ck_mldef_src_read(&c->src, d->path, MAX_CSV, c->set, &p, &len) < 0) {
                vio(c, "datafile.csv", d->path, "%s", ck_error_msg());
                continue;
            }
            if (csv_parse(c, d->path, p, len, NULL, &d->npoints) < 0)
                continue;
            if (c->load) {
                void *buf;
                uint64_t n2;
                if (ck_tensor_set_alloc(c->set, d->npoints * 8 + 1, &buf) < 0) {
                    vio(c, "datafile.csv", d->path, "%s", ck_error_msg());
                    continue;
                }
                csv_parse(c, d->path, p, len, buf, &n2);
                d->data = buf;
            }
        } else {
            if (size % (uint64_t)d->es) {
                vio(c, "datafile.size", d->path, "%llu bytes is not a whole number of %d-byte "
                    "floats", (unsigned long long)size, d->es);
                continue;
            }
            d->npoints = size / (uint64_t)d->es;
            if (c->load) {
                uint64_t len;
                if (ck_mldef_src_read(&c->src, d->path, CK_TENSOR_ALLOC_MAX, c->set, &d->data,
                                      &len) < 0) {
                    vio(c, "datafile.size", d->path, "%s", ck_error_msg());
                    continue;
                }
            }
        }
        d->ok = true;
    }
}

static struct df *find_df(struct ctx *c, const char *name)
{
    for (size_t i = 0; i < c->ndfs; i++)
        if (c->dfs[i].name && strcmp(c->dfs[i].name, name) == 0)
            return &c->dfs[i];
    return NULL;
}

/* ---- layers ---- */

static bool defined(struct ctx *c, const char *v)
{
    return has(c->values, c->nvalues, v);
}

static void define(struct ctx *c, const char *v, const char *rule, const char *where)
{
    if (defined(c, v)) {
        vio(c, rule, where, "value '%s' is already defined", v);
        return;
    }
    push(&c->values, &c->nvalues, &c->capvalues, v);
}

static bool int_array(const struct ck_jin *v, int64_t *out, size_t max, size_t *n)
{
    if (v->type != CK_JIN_ARRAY || v->n > max)
        return false;
    size_t k = 0;
    for (const struct ck_jin *e = v->first; e; e = e->next)
        if (!int_of(e, &out[k++]))
            return false;
    *n = k;
    return true;
}

static void params(struct ctx *c, const struct ck_jin *obj, const char *where,
                   struct ck_model_node *node)
{
    const struct ck_jin *ps = ck_jin_get(obj, "Params");
    if (!ps)
        return;
    if (ps->type != CK_JIN_OBJECT)
        return vio(c, "layer.params", where, "'Params' is not an object");
    struct ck_op_params dummy;
    ck_op_params_init(&dummy);
    struct ck_op_params *p = node ? &node->p : &dummy;
    for (const struct ck_jin *v = ps->first; v; v = v->next) {
        const struct ck_mldef_param *d = ck_mldef_params;
        while (d->key && strcmp(d->key, v->key) != 0)
            d++;
        if (!d->key) {
            vio(c, "layer.params", where, "unknown parameter '%s'", v->key);
            continue;
        }
        char *a = (char *)p + d->offset;
        int64_t ints[CK_MODEL_MAX_INTS];
        size_t n = 0;
        double x;
        bool ok = true;
        switch (d->kind) {
        case CK_MLDEF_P_INT2:
        case CK_MLDEF_P_INT4: {
            size_t want = d->kind == CK_MLDEF_P_INT2 ? 2 : 4;
            ok = int_array(v, ints, want, &n) && n == want;
            if (ok)
                memcpy(a, ints, want * sizeof *ints);
            break;
        }
        case CK_MLDEF_P_INT:
        case CK_MLDEF_P_AXIS:
            ok = int_of(v, &ints[0]) && ints[0] > -(INT64_C(1) << 40) && ints[0] < (INT64_C(1) << 40);
            if (ok)
                memcpy(a, ints, sizeof(int64_t));
            break;
        case CK_MLDEF_P_BOOL:
            ok = v->type == CK_JIN_BOOL;
            if (ok)
                *(bool *)a = v->b;
            break;
        case CK_MLDEF_P_FLOAT:
        case CK_MLDEF_P_SCALAR:
        case CK_MLDEF_P_BOUND:
            ok = num_of(v, &x) && isfinite(x);
            if (ok)
                *(float *)a = (float)x;
            if (ok && d->kind == CK_MLDEF_P_SCALAR)
                p->has_scalar = true;
            break;
        case CK_MLDEF_P_INTS:
            ok = int_array(v, ints, CK_MODEL_MAX_INTS, &n);
            if (ok && node && ck_model_node_set_ints(node, ints, n) < 0)
                ok = false;
            break;
        }
        if (!ok)
            vio(c, "layer.params", where, "parameter '%s' has the wrong type or size", v->key);
    }
    if (!node)
        free(dummy.ints);
}

struct inlayer {
    const char *name;
    uint64_t count;
    int rank;
    int64_t dims[CK_TENSOR_MAX_RANK];
};

struct walk {
    struct inlayer *in;
    size_t nin;
    const char **last_outputs;
    size_t nlast;
    const char **layer_names;
    size_t nlayer_names, caplayer_names;
};

static int add_weight(struct ctx *c, const struct df *d, const char *name, int rank,
                      const int64_t *dims, uint64_t start, uint64_t n)
{
    struct ck_tensor t = {0};
    t.name = (char *)name;
    t.dtype = d->es == 8 ? CK_DT_F64 : CK_DT_F32;
    t.rank = rank;
    memcpy(t.dims, dims, (size_t)rank * sizeof *dims);
    t.nbytes = n * (uint64_t)d->es;
    t.data = d->data + start * (uint64_t)d->es;
    t.role = "parameter";
    return ck_tensor_set_add(c->set, &t, NULL);
}

static void layer_weights(struct ctx *c, const struct ck_jin *l, const char *where,
                          const char **names, size_t *nnames)
{
    const struct ck_jin *ws = ck_jin_get(l, "Weights");
    const char *ds = str(c, l, "DataSource", false, where);
    uint64_t start = 0, count = 0;
    bool has_start = uint_of(c, l, "StartIndex", &start, where);
    bool has_count = uint_of(c, l, "Count", &count, where);
    struct df *d = NULL;
    if (ds && *ds) {
        if (!(d = find_df(c, ds)))
            vio(c, "datafile.declared", where, "DataSource '%s' is not a declared data file", ds);
        if (!has_start || !has_count)
            vio(c, "manifest.key", where, "a layer with a DataSource needs StartIndex and Count");
    }
    if (!ws)
        return;
    if (ws->type != CK_JIN_ARRAY || ws->n > 64)
        return vio(c, "layer.weights", where, "'Weights' is not an array of at most 64 weights");
    if (!ds || !*ds)
        return vio(c, "layer.weights", where, "weights without a DataSource");
    uint64_t sum = 0;
    bool good = true;
    size_t k = 0;
    for (const struct ck_jin *w = ws->first; w; w = w->next, k++) {
        char wh[96];
        snprintf(wh, sizeof wh, "%s.Weights[%zu]", where, k);
        const char *wn = w->type == CK_JIN_OBJECT ? str(c, w, "Name", true, wh) : NULL;
        int rank = 0;
        int64_t dims[CK_TENSOR_MAX_RANK];
        bool overflow;
        if (!wn || !shape_of(c, w, wh, &rank, dims, false)) {
            if (wn)
                vio(c, "layer.weights", wh, "weight '%s' has no Shape", wn);
            good = false;
            continue;
        }
        uint64_t n = numel(rank, dims, false, &overflow);
        if (overflow || sum + n < sum) {
            vio(c, "layer.weights", wh, "weight '%s' is too large", wn);
            good = false;
            continue;
        }
        if (good && c->load && d && d->ok && add_weight(c, d, wn, rank, dims, start + sum, n) < 0)
            vio(c, "layer.weights", wh, "%s", ck_error_msg());
        sum += n;
        define(c, wn, "layer.weights", wh);
        names[(*nnames)++] = wn;
    }
    if (good && has_count && sum != count)
        vio(c, "layer.weights", where, "the weights hold %llu values but Count is %llu",
            (unsigned long long)sum, (unsigned long long)count);
    if (d && d->ok && has_start && has_count &&
        (start > d->npoints || count > d->npoints - start))
        vio(c, "layer.range", where, "StartIndex %llu + Count %llu is past the end of '%s' "
            "(%llu data points)", (unsigned long long)start, (unsigned long long)count, d->path,
            (unsigned long long)d->npoints);
}

static void input_layer(struct ctx *c, struct walk *w, const struct ck_jin *l, const char *name,
                        const char *where)
{
    if (ck_jin_get(l, "DataSource") || ck_jin_get(l, "StartIndex") || ck_jin_get(l, "Weights"))
        vio(c, "layer.input", where, "an input layer has no DataSource, StartIndex or Weights");
    struct inlayer *x = &w->in[w->nin++];
    x->name = name;
    if (!uint_of(c, l, "Count", &x->count, where))
        vio(c, "layer.input", where, "an input layer needs Count");
    shape_of(c, l, where, &x->rank, x->dims, true);
    define(c, name, "layer.outputs", where);
    if (c->load && ck_model_add_io(c->m, false, name, CK_DT_F32, x->rank, x->dims) < 0)
        vio(c, "layer.input", where, "%s", ck_error_msg());
}

static void one_layer(struct ctx *c, struct walk *w, const struct ck_jin *l, size_t i)
{
    char where[64];
    snprintf(where, sizeof where, "Layers[%zu]", i);
    if (l->type != CK_JIN_OBJECT)
        return vio(c, "manifest.key", where, "not an object");
    const char *name = str(c, l, "Name", true, where);
    if (!name)
        return;
    snprintf(where, sizeof where, "Layers[%zu] '%.40s'", i, name);
    if (has(w->layer_names, w->nlayer_names, name))
        vio(c, "layer.name", where, "layer name '%s' used twice", name);
    push(&w->layer_names, &w->nlayer_names, &w->caplayer_names, name);
    const char *caps = str(c, l, "Capabilities", false, where);
    const char *opname = str(c, l, "Op", false, where);
    if (!opname && has_word(caps, "input")) {
        if (i != w->nin)
            vio(c, "noderange.input", where, "input layers come first; this one follows a layer");
        return input_layer(c, w, l, name, where);
    }
    enum ck_op op = opname ? ck_op_from_name(opname) : CK_OP_INVALID;
    if (op == CK_OP_INVALID)
        vio(c, "layer.op", where, opname ? "unknown Op '%s'" : "no Op%s", opname ? opname : "");
    struct ck_model_node *node = NULL;
    if (c->load && op != CK_OP_INVALID && ck_model_add_node(c->m, name, op, &node) < 0)
        return vio(c, "layer.op", where, "%s", ck_error_msg());
    const char *wnames[64];
    size_t nw = 0;
    layer_weights(c, l, where, wnames, &nw);
    struct ck_op_params p;
    ck_op_params_init(&p);
    params(c, l, where, node);
    if (node)
        p = node->p;
    else {
        /* parse again into p for the arity check (the values were checked above) */
        struct ck_mldef_report quiet = {0};
        struct ck_mldef_report *saved = c->r;
        c->r = &quiet;
        struct ck_model_node tmp = {0};
        ck_op_params_init(&tmp.p);
        params(c, l, where, &tmp);
        p = tmp.p;
        free(tmp.p.ints);
        p.ints = NULL;
        ck_mldef_report_release(&quiet);
        c->r = saved;
    }
    /* inputs */
    const struct ck_jin *ins = ck_jin_get(l, "Inputs");
    const char *inputs[256];
    size_t nin = 0;
    if (ins) {
        if (ins->type != CK_JIN_ARRAY || ins->n > 256)
            vio(c, "layer.inputs", where, "'Inputs' is not an array of at most 256 names");
        else
            for (const struct ck_jin *e = ins->first; e; e = e->next) {
                if (e->type != CK_JIN_STRING) {
                    vio(c, "layer.inputs", where, "'Inputs' holds a non-string");
                    continue;
                }
                inputs[nin++] = e->str;
            }
    } else {
        const char *prior = str(c, l, "Prior", false, where);
        if (prior && *prior)
            inputs[nin++] = prior;
        for (size_t k = 0; k < nw; k++)
            inputs[nin++] = wnames[k];
    }
    for (size_t k = 0; k < nin; k++) {
        if (!defined(c, inputs[k]))
            vio(c, "layer.inputs", where, "input '%s' is not defined before this layer",
                inputs[k]);
        if (node && ck_model_node_add_input(node, inputs[k]) < 0)
            vio(c, "layer.inputs", where, "%s", ck_error_msg());
    }
    if (op != CK_OP_INVALID) {
        size_t lo, hi;
        ck_op_arity(op, &p, &lo, &hi);
        if (nin < lo || (hi && nin > hi))
            vio(c, "layer.inputs", where, "%s takes %zu to %zu inputs, not %zu", opname, lo,
                hi ? hi : (size_t)256, nin);
    }
    /* outputs */
    const struct ck_jin *outs = ck_jin_get(l, "Outputs");
    w->nlast = 0;
    if (outs && (outs->type != CK_JIN_ARRAY || outs->n == 0 || outs->n > 256)) {
        vio(c, "layer.outputs", where, "'Outputs' is not an array of 1 to 256 names");
        outs = NULL;
    }
    free(w->last_outputs);
    w->last_outputs = calloc(outs ? outs->n : 1, sizeof *w->last_outputs);
    if (!w->last_outputs)
        return;
    for (const struct ck_jin *e = outs ? outs->first : NULL; outs ? e != NULL : w->nlast == 0;
         e = e ? e->next : NULL) {
        const char *o = outs ? (e->type == CK_JIN_STRING ? e->str : NULL) : name;
        if (!o) {
            vio(c, "layer.outputs", where, "'Outputs' holds a non-string");
            continue;
        }
        define(c, o, "layer.outputs", where);
        w->last_outputs[w->nlast++] = o;
        if (node && ck_model_node_add_output(node, o) < 0)
            vio(c, "layer.outputs", where, "%s", ck_error_msg());
    }
}

static void layers(struct ctx *c, struct walk *w)
{
    const struct ck_jin *a = ck_jin_get(c->root, "Layers");
    if (!a)
        return vio(c, "manifest.key", "Layers", "missing");
    if (a->type != CK_JIN_ARRAY)
        return vio(c, "manifest.key", "Layers", "not an array");
    if (!(w->in = calloc(a->n ? a->n : 1, sizeof *w->in)))
        return;
    size_t i = 0;
    for (const struct ck_jin *l = a->first; l; l = l->next, i++)
        one_layer(c, w, l, i);
    c->r->nlayers = i;
    if (i == w->nin)
        vio(c, "layer.op", "Layers", "no layer besides the inputs");
}

/* ---- node ranges ---- */

static const char *const range_numbers[] = {
    "NormalizationPreOffset", "NormalizationScale", "NormalizationPostOffset", "MaximumValue",
    "MinimumValue", "MissingErrorValue", "AboveRangeErrorValue", "BelowRangeErrorValue", NULL};

static void node_ranges(struct ctx *c, struct walk *w)
{
    const struct ck_jin *a = ck_jin_get(c->root, "NodeRanges");
    if (!a)
        return vio(c, "manifest.key", "NodeRanges", "missing");
    if (a->type != CK_JIN_ARRAY)
        return vio(c, "manifest.key", "NodeRanges", "not an array");
    size_t i = 0, nin = 0, nout = 0;
    bool last_ok = false;
    const char **names = NULL;
    size_t nnames = 0, cap = 0;
    for (const struct ck_jin *r = a->first; r; r = r->next, i++) {
        char where[96];
        snprintf(where, sizeof where, "NodeRanges[%zu]", i);
        if (r->type != CK_JIN_OBJECT) {
            vio(c, "manifest.key", where, "not an object");
            continue;
        }
        const char *name = str(c, r, "Name", true, where);
        const char *type = str(c, r, "Type", true, where);
        for (const char *const *k = range_numbers; *k; k++) {
            double x;
            const struct ck_jin *v = ck_jin_get(r, *k);
            if (v && !num_of(v, &x))
                vio(c, "manifest.key", where, "'%s' is not a number", *k);
        }
        if (!name || !type)
            continue;
        if (has(names, nnames, name))
            vio(c, "noderange.name", where, "node range '%s' declared twice", name);
        push(&names, &nnames, &cap, name);
        uint64_t count = 0;
        bool has_count = uint_of(c, r, "Count", &count, where);
        int rank = 0;
        int64_t dims[CK_TENSOR_MAX_RANK];
        bool has_shape = shape_of(c, r, where, &rank, dims, true), overflow;
        if (!has_count)
            vio(c, "manifest.key", where, "'Count' is missing");
        uint64_t n = has_shape ? numel(rank, dims, true, &overflow) : 0;
        if (has_count && has_shape && n && n != count)
            vio(c, "noderange.count", where, "Count %llu but Shape holds %llu values per sample",
                (unsigned long long)count, (unsigned long long)n);
        if (strcmp(type, "input") == 0) {
            if (nin >= w->nin || strcmp(w->in[nin].name, name) != 0)
                vio(c, "noderange.input", where, "input '%s' is not input layer %zu (%s)", name,
                    nin, nin < w->nin ? w->in[nin].name : "none");
            else if (has_count && w->in[nin].count != count)
                vio(c, "noderange.input", where, "Count %llu but its input layer has %llu",
                    (unsigned long long)count, (unsigned long long)w->in[nin].count);
            nin++;
        } else if (strcmp(type, "output") == 0) {
            if (!defined(c, name))
                vio(c, "noderange.output", where, "output '%s' is produced by no layer", name);
            if (has(w->last_outputs, w->nlast, name))
                last_ok = true;
            if (c->load && ck_model_add_io(c->m, true, name, CK_DT_F32, rank, dims) < 0)
                vio(c, "noderange.output", where, "%s", ck_error_msg());
            nout++;
        } else {
            vio(c, "noderange.type", where, "Type '%s' is neither input nor output", type);
        }
    }
    if (nin != w->nin)
        vio(c, "noderange.input", "NodeRanges", "%zu input ranges for %zu input layers", nin, w->nin);
    if (nout == 0)
        vio(c, "noderange.output", "NodeRanges", "no output range");
    else if (w->nlast && !last_ok)
        vio(c, "noderange.output", "NodeRanges", "the last layer produces no output range");
    free(names);
}

/* ---- tests ---- */

static uint64_t range_count(struct ctx *c, const char *name, bool *input)
{
    const struct ck_jin *a = ck_jin_get(c->root, "NodeRanges");
    for (const struct ck_jin *r = a && a->type == CK_JIN_ARRAY ? a->first : NULL; r; r = r->next) {
        const struct ck_jin *n = ck_jin_get(r, "Name"), *t = ck_jin_get(r, "Type");
        uint64_t count = 0;
        if (n && n->type == CK_JIN_STRING && strcmp(n->str, name) == 0 && t &&
            t->type == CK_JIN_STRING) {
            *input = strcmp(t->str, "input") == 0;
            ck_jin_uint(ck_jin_get(r, "Count"), &count);
            return count ? count : 1;
        }
    }
    return 0;
}

static void test_files(struct ctx *c, const struct ck_jin *t, const char *key, const char *where,
                       uint64_t *samples, size_t *ninputs)
{
    const struct ck_jin *a = ck_jin_get(t, key);
    if (!a || a->type != CK_JIN_ARRAY)
        return vio(c, "test.inputs", where, "'%s' is not an array", key);
    size_t k = 0;
    for (const struct ck_jin *e = a->first; e; e = e->next, k++) {
        char wh[128];
        snprintf(wh, sizeof wh, "%s.%s[%zu]", where, key, k);
        const char *range = e->type == CK_JIN_OBJECT ? str(c, e, "NodeRange", true, wh) : NULL;
        const char *path = e->type == CK_JIN_OBJECT ? str(c, e, "Path", true, wh) : NULL;
        if (!range || !path)
            continue;
        bool input = false;
        uint64_t count = range_count(c, range, &input);
        if (!count || input != (strcmp(key, "Inputs") == 0)) {
            vio(c, "test.inputs", wh, "'%s' is not an %s node range", range,
                strcmp(key, "Inputs") == 0 ? "input" : "output");
            continue;
        }
        if (input)
            (*ninputs)++;
        if (strncmp(path, "tests/", 6) != 0)
            vio(c, "test.path", wh, "'%s' is not in the folder tests/", path);
        if (!file_ok(c, path, wh))
            continue;
        uint64_t size = 0, n;
        ck_mldef_src_size(&c->src, path, &size);
        if (strcmp(ext(path), ".csv") == 0) {
            const unsigned char *p;
            uint64_t len;
            if (ck_mldef_src_read(&c->src, path, MAX_CSV, c->set, &p, &len) < 0 ||
                csv_parse(c, path, p, len, NULL, &n) < 0)
                continue;
        } else if (strcmp(ext(path), ".float32") == 0) {
            n = size / 4;
            if (size % 4)
                n = 1; /* forces the error below */
        } else {
            vio(c, "test.path", wh, "'%s' is not .float32 or .csv", path);
            continue;
        }
        if (n % count || (size && !n)) {
            vio(c, "test.size", wh, "'%s' does not hold whole samples of %llu values", path,
                (unsigned long long)count);
            continue;
        }
        if (*samples == UINT64_MAX)
            *samples = n / count;
        else if (*samples != n / count)
            vio(c, "test.size", wh, "'%s' holds %llu samples, the test's other files %llu", path,
                (unsigned long long)(n / count), (unsigned long long)*samples);
    }
}

static void tests(struct ctx *c, const struct walk *w)
{
    const struct ck_jin *a = ck_jin_get(c->root, "Tests");
    if (!a)
        return;
    if (a->type != CK_JIN_ARRAY)
        return vio(c, "manifest.key", "Tests", "not an array");
    size_t i = 0;
    for (const struct ck_jin *t = a->first; t; t = t->next, i++) {
        char where[64];
        snprintf(where, sizeof where, "Tests[%zu]", i);
        if (t->type != CK_JIN_OBJECT) {
            vio(c, "manifest.key", where, "not an object");
            continue;
        }
        str(c, t, "Name", true, where);
        double tol;
        const struct ck_jin *tv = ck_jin_get(t, "Tolerance");
        if (tv && (!num_of(tv, &tol) || !(tol >= 0)))
            vio(c, "manifest.key", where, "'Tolerance' is not a non-negative number");
        uint64_t samples = UINT64_MAX;
        size_t nin = 0;
        test_files(c, t, "Inputs", where, &samples, &nin);
        test_files(c, t, "Outputs", where, &samples, &nin);
        if (nin != w->nin)
            vio(c, "test.inputs", where, "%zu inputs for %zu input node ranges", nin, w->nin);
    }
}

/* ---- SIGNATURE ---- */

struct sigline {
    char sha[65];
    char name[256];
};

static void signature(struct ctx *c, const struct ck_mldef_check_opts *o)
{
    struct ck_mldef_report *r = c->r;
    uint64_t size;
    if (!ck_mldef_src_size(&c->src, CK_MLDEF_SIGNATURE, &size)) {
        if (o && o->require_signature)
            vio(c, "signature.missing", CK_MLDEF_SIGNATURE, "the archive is not signed");
        return;
    }
    r->has_signature = true;
    size_t before = r->n;
    const unsigned char *text;
    uint64_t len;
    if (ck_mldef_src_read(&c->src, CK_MLDEF_SIGNATURE, 1 << 20, c->set, &text, &len) < 0)
        return vio(c, "signature.format", CK_MLDEF_SIGNATURE, "%s", ck_error_msg());
    /* The files a signature must cover. */
    const char **files = NULL;
    size_t nfiles = 0, cap = 0;
    if (c->src.is_zip) {
        for (size_t i = 0; i < c->src.n; i++)
            if (strcmp(c->src.names[i], CK_MLDEF_SIGNATURE) != 0)
                push(&files, &nfiles, &cap, c->src.names[i]);
    } else {
        push(&files, &nfiles, &cap, CK_MLDEF_MANIFEST);
        for (size_t i = 0; i < c->nfiles; i++)
            push(&files, &nfiles, &cap, c->files[i]);
    }
    bool *seen = calloc(nfiles + 1, 1);
    const char *s = (const char *)text, *end = s + len, *sigline = NULL;
    size_t lineno = 0;
    bool header = false;
    while (s < end && seen) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        lineno++;
        char where[64];
        snprintf(where, sizeof where, "SIGNATURE line %zu", lineno);
        if (!nl) {
            vio(c, "signature.format", where, "the last line has no line end");
            break;
        }
        size_t ll = (size_t)(nl - s);
        char line[512];
        if (ll >= sizeof line) {
            vio(c, "signature.format", where, "line too long");
            s = nl + 1;
            continue;
        }
        memcpy(line, s, ll);
        line[ll] = '\0';
        if (lineno == 1) {
            header = strcmp(line, "mldef-signature 1") == 0;
            if (!header)
                vio(c, "signature.format", where, "not 'mldef-signature 1'");
        } else if (strncmp(line, "sha256 ", 7) == 0 && ll > 7 + 64 + 1 && line[71] == ' ') {
            const char *name = line + 72;
            size_t k = 0;
            while (k < nfiles && strcmp(files[k], name) != 0)
                k++;
            if (k == nfiles) {
                vio(c, "signature.removed", name, "signed, but not in the %s (removed or "
                    "renamed)", c->src.is_zip ? "archive" : "manifest's set");
            } else if (seen[k]) {
                vio(c, "signature.format", where, "'%s' listed twice", name);
            } else {
                seen[k] = true;
                char hex[65];
                line[71] = '\0';
                if (ck_mldef_src_sha256(&c->src, name, hex) < 0)
                    vio(c, "signature.changed", name, "%s", ck_error_msg());
                else if (strcmp(hex, line + 7) != 0)
                    vio(c, "signature.changed", name, "changed since it was signed (sha256 %s, "
                        "signed %s)", hex, line + 7);
            }
        } else if (strncmp(line, "ed25519 ", 8) == 0) {
            sigline = s;
            unsigned char pub[32], sig[64];
            if (ll != 8 + 64 + 1 + 128 || line[72] != ' ' ||
                !ck_sign_unhex(line + 8, 64, pub, 32) || !ck_sign_unhex(line + 73, 128, sig, 64)) {
                vio(c, "signature.format", where, "not 'ed25519 <64 hex> <128 hex>'");
            } else {
                memcpy(r->signer, line + 8, 64);
                r->signer[64] = '\0';
                if (!ck_sign_verify(pub, text, (size_t)(sigline - (const char *)text), sig))
                    vio(c, "signature.invalid", CK_MLDEF_SIGNATURE,
                        "the Ed25519 signature does not match its lines (key %.16s...)", r->signer);
                if (o && o->trusted_pub && memcmp(o->trusted_pub, pub, 32) != 0)
                    vio(c, "signature.key", CK_MLDEF_SIGNATURE,
                        "signed by key %.16s..., not by the trusted key", r->signer);
            }
            if (nl + 1 != end)
                vio(c, "signature.format", where, "lines after the signature line");
            break;
        } else {
            vio(c, "signature.format", where, "unknown line");
        }
        s = nl + 1;
    }
    if (!sigline)
        vio(c, "signature.format", CK_MLDEF_SIGNATURE, "no ed25519 signature line");
    for (size_t k = 0; seen && k < nfiles; k++)
        if (!seen[k])
            vio(c, "signature.added", files[k], "not covered by SIGNATURE (added or renamed)");
    free(seen);
    free(files);
    r->signature_ok = r->n == before;
}

/* ---- the whole ---- */

static void archive_names(struct ctx *c)
{
    if (!c->src.is_zip)
        return;
    for (size_t i = 0; i < c->src.n; i++) {
        const char *name = c->src.names[i];
        char why[160];
        const char *rule = ck_mldef_path_rule(name, why, sizeof why);
        if (rule)
            vio(c, rule, name, "%s", why);
        for (size_t k = 0; k < i; k++)
            if (strcmp(c->src.names[k], name) == 0) {
                vio(c, "files.duplicate", name, "two entries with this name");
                break;
            }
    }
    if (c->src.n > CK_MLDEF_MAX_FILES)
        vio(c, "files.count", c->src.path, "%zu files (at most %d)", c->src.n, CK_MLDEF_MAX_FILES);
}

static void key_order(struct ctx *c)
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
    if (pos_df >= 0 && ((pos_layers >= 0 && pos_layers < pos_df) ||
                        (pos_tests >= 0 && pos_tests < pos_df)))
        vio(c, "datafile.declared", "DataFiles", "data files are declared after they are used "
            "(DataFiles must come before Layers and Tests)");
}

static void model_section(struct ctx *c)
{
    const struct ck_jin *m = ck_jin_get(c->root, "Model");
    if (!m)
        return vio(c, "model.section", "Model", "missing");
    if (m->type != CK_JIN_OBJECT)
        return vio(c, "model.section", "Model", "not an object");
    const char *name = str(c, m, "Name", true, "Model");
    static const char *const texts[] = {"Description", "Tags", "AuthorName", "AuthorEmail", "Url",
                                        "Source", NULL};
    for (const char *const *t = texts; *t; t++)
        str(c, m, *t, false, "Model");
    const char *lic = str(c, m, "LicenseFile", false, "Model");
    if (lic)
        file_ok(c, lic, "Model.LicenseFile");
    if (c->load && name && !(c->m->name = strdup(name)))
        vio(c, "model.section", "Model", "out of memory");
}

static void walk(struct ctx *c, const struct ck_mldef_check_opts *o)
{
    struct walk w = {0};
    const unsigned char *text;
    uint64_t len;
    uint64_t size;
    const char *mname = c->src.is_zip ? CK_MLDEF_MANIFEST : ck_basename(c->src.path);
    if (c->src.is_zip && !ck_mldef_src_size(&c->src, CK_MLDEF_MANIFEST, &size))
        return vio(c, "manifest.missing", c->src.path, "no manifest.json at the root");
    int err;
    if (c->src.is_zip)
        err = ck_mldef_src_read(&c->src, CK_MLDEF_MANIFEST, CK_MLDEF_MAX_MANIFEST, c->set, &text,
                                &len);
    else
        err = ck_tensor_set_map_file(c->set, c->src.path, &text, &len);
    if (err < 0)
        return vio(c, "manifest.json", mname, "%s", ck_error_msg());
    if (len >= 3 && text[0] == 0xef && text[1] == 0xbb && text[2] == 0xbf)
        vio(c, "manifest.json", mname, "starts with a byte order mark");
    if (ck_jin_parse((const char *)text, len, &c->doc, &c->root) < 0)
        return vio(c, "manifest.json", mname, "%s", ck_error_msg());
    if (c->root->type != CK_JIN_OBJECT) {
        vio(c, "manifest.json", mname, "not a JSON object");
        goto out;
    }
    const char *fmt = str(c, c->root, "Format", true, "Format");
    uint64_t ver = 0;
    if (fmt && strcmp(fmt, "mldef") != 0)
        vio(c, "manifest.format", "Format", "'%s' is not 'mldef'", fmt);
    if (!uint_of(c, c->root, "FormatVersion", &ver, "FormatVersion") ||
        ver != CK_MLDEF_FORMAT_VERSION)
        vio(c, "manifest.format", "FormatVersion", "not %d", CK_MLDEF_FORMAT_VERSION);
    key_order(c);
    model_section(c);
    data_files(c);
    layers(c, &w);
    node_ranges(c, &w);
    tests(c, &w);
    if (!c->src.is_zip) {
        size_t n = 1 + c->nfiles + ck_mldef_src_size(&c->src, CK_MLDEF_SIGNATURE, &size);
        if (n > CK_MLDEF_MAX_FILES)
            vio(c, "files.count", mname, "%zu files (at most %d)", n, CK_MLDEF_MAX_FILES);
        c->r->nfiles = n;
    }
    if (!c->load)
        signature(c, o);
out:
    free(w.in);
    free(w.last_outputs);
    free((void *)w.layer_names);
}

static void ctx_release(struct ctx *c)
{
    ck_jin_free(c->doc);
    c->doc = NULL;
    c->root = NULL;
    free(c->dfs);
    free((void *)c->values);
    free((void *)c->files);
    c->dfs = NULL;
    c->values = c->files = NULL;
    c->ndfs = c->nvalues = c->capvalues = c->nfiles = c->capfiles = 0;
}

int ck_mldef_check(const char *path, const struct ck_mldef_check_opts *o,
                   struct ck_mldef_report *r, struct ck_model **model)
{
    memset(r, 0, sizeof *r);
    if (model)
        *model = NULL;
    struct ctx c = {.r = r};
    if (ck_mldef_src_open(&c.src, path) < 0) {
        vio(&c, "zip.open", path, "%s", ck_error_msg());
        return 0;
    }
    r->is_zip = c.src.is_zip;
    r->nfiles = c.src.n;
    if (!(c.set = ck_tensor_set_new("mldef", path))) {
        ck_mldef_src_close(&c.src);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    archive_names(&c);
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
            vio(&c, "layer.inputs", path, "%s", ck_error_msg());
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
    struct ctx c = {.r = &r};
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
