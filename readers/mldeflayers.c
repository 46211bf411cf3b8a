/* The layers, node ranges and test sets of a manifest (docs/mldef.md 2.3,
 * 2.4, 6), checked rule by rule; with c->load, the model is built as the
 * layers are walked. */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/sign.h"
#include "model/mldef.h"
#include "readers/mldefctx.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- layers ---- */

static bool defined(struct ck_mldefc *c, const char *v)
{
    return ck_strset_get(&c->valueset, v, NULL);
}

static void define(struct ck_mldefc *c, const char *v, const char *rule, const char *where)
{
    if (defined(c, v)) {
        ck_mldefc_vio(c, rule, where, "value '%s' is already defined", v);
        return;
    }
    if (ck_mldefc_push(&c->values, &c->nvalues, &c->capvalues, v) &&
        ck_strset_put(&c->valueset, v, c->nvalues - 1, NULL) < 0)
        ck_mldefc_vio(c, rule, where, "%s", ck_error_msg());
}

static bool int_array(const struct ck_jin *v, int64_t *out, size_t max, size_t *n)
{
    if (v->type != CK_JIN_ARRAY || v->n > max)
        return false;
    size_t k = 0;
    for (const struct ck_jin *e = v->first; e; e = e->next)
        if (!ck_mldefc_int(e, &out[k++]))
            return false;
    *n = k;
    return true;
}

static void params(struct ck_mldefc *c, const struct ck_jin *obj, const char *where,
                   struct ck_model_node *node)
{
    const struct ck_jin *ps = ck_jin_get(obj, "Params");
    if (!ps)
        return;
    if (ps->type != CK_JIN_OBJECT)
        return ck_mldefc_vio(c, "layer.params", where, "'Params' is not an object");
    struct ck_op_params dummy;
    ck_op_params_init(&dummy);
    struct ck_op_params *p = node ? &node->p : &dummy;
    for (const struct ck_jin *v = ps->first; v; v = v->next) {
        const struct ck_mldef_param *d = ck_mldef_params;
        while (d->key && strcmp(d->key, v->key) != 0)
            d++;
        if (!d->key) {
            ck_mldefc_vio(c, "layer.params", where, "unknown parameter '%s'", v->key);
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
            ok = ck_mldefc_int(v, &ints[0]) && ints[0] > -(INT64_C(1) << 40) &&
                 ints[0] < (INT64_C(1) << 40);
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
            ok = ck_mldefc_num(v, &x) && isfinite(x);
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
            ck_mldefc_vio(c, "layer.params", where, "parameter '%s' has the wrong type or size",
                          v->key);
    }
    if (!node)
        free(dummy.ints);
}

static int add_weight(struct ck_mldefc *c, const struct ck_mldefc_df *d, const char *name, int rank,
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

static void layer_weights(struct ck_mldefc *c, const struct ck_jin *l, const char *where,
                          const char **names, size_t *nnames)
{
    const struct ck_jin *ws = ck_jin_get(l, "Weights");
    const char *ds = ck_mldefc_str(c, l, "DataSource", false, where);
    uint64_t start = 0, count = 0;
    bool has_start = ck_mldefc_uint(c, l, "StartIndex", &start, where);
    bool has_count = ck_mldefc_uint(c, l, "Count", &count, where);
    struct ck_mldefc_df *d = NULL;
    if (ds && *ds) {
        if (!(d = ck_mldefc_find_df(c, ds)))
            ck_mldefc_vio(c, "datafile.declared", where,
                          "DataSource '%s' is not a declared data file", ds);
        if (!has_start || !has_count)
            ck_mldefc_vio(c, "manifest.key", where,
                          "a layer with a DataSource needs StartIndex and Count");
    }
    if (!ws)
        return;
    if (ws->type != CK_JIN_ARRAY || ws->n > 64)
        return ck_mldefc_vio(c, "layer.weights", where,
                             "'Weights' is not an array of at most 64 weights");
    if (!ds || !*ds)
        return ck_mldefc_vio(c, "layer.weights", where, "weights without a DataSource");
    uint64_t sum = 0;
    bool good = true;
    size_t k = 0;
    for (const struct ck_jin *w = ws->first; w; w = w->next, k++) {
        char wh[96];
        snprintf(wh, sizeof wh, "%s.Weights[%zu]", where, k);
        const char *wn = w->type == CK_JIN_OBJECT ? ck_mldefc_str(c, w, "Name", true, wh) : NULL;
        int rank = 0;
        int64_t dims[CK_TENSOR_MAX_RANK];
        bool overflow;
        if (!wn || !ck_mldefc_shape(c, w, wh, &rank, dims, false)) {
            if (wn)
                ck_mldefc_vio(c, "layer.weights", wh, "weight '%s' has no Shape", wn);
            good = false;
            continue;
        }
        uint64_t n = ck_mldefc_numel(rank, dims, false, &overflow);
        if (overflow || sum + n < sum) {
            ck_mldefc_vio(c, "layer.weights", wh, "weight '%s' is too large", wn);
            good = false;
            continue;
        }
        if (good && c->load && d && d->ok && add_weight(c, d, wn, rank, dims, start + sum, n) < 0)
            ck_mldefc_vio(c, "layer.weights", wh, "%s", ck_error_msg());
        sum += n;
        define(c, wn, "layer.weights", wh);
        names[(*nnames)++] = wn;
    }
    if (good && has_count && sum != count)
        ck_mldefc_vio(c, "layer.weights", where, "the weights hold %llu values but Count is %llu",
                      (unsigned long long)sum, (unsigned long long)count);
    if (d && d->ok && has_start && has_count && (start > d->npoints || count > d->npoints - start))
        ck_mldefc_vio(c, "layer.range", where,
                      "StartIndex %llu + Count %llu is past the end of '%s' "
                      "(%llu data points)",
                      (unsigned long long)start, (unsigned long long)count, d->path,
                      (unsigned long long)d->npoints);
}

static void input_layer(struct ck_mldefc *c, struct ck_mldefc_walk *w, const struct ck_jin *l,
                        const char *name, const char *where)
{
    if (ck_jin_get(l, "DataSource") || ck_jin_get(l, "StartIndex") || ck_jin_get(l, "Weights"))
        ck_mldefc_vio(c, "layer.input", where,
                      "an input layer has no DataSource, StartIndex or Weights");
    struct ck_mldefc_input *x = &w->in[w->nin++];
    x->name = name;
    if (!ck_mldefc_uint(c, l, "Count", &x->count, where))
        ck_mldefc_vio(c, "layer.input", where, "an input layer needs Count");
    ck_mldefc_shape(c, l, where, &x->rank, x->dims, true);
    define(c, name, "layer.outputs", where);
    if (c->load && ck_model_add_io(c->m, false, name, CK_DT_F32, x->rank, x->dims) < 0)
        ck_mldefc_vio(c, "layer.input", where, "%s", ck_error_msg());
}

static void one_layer(struct ck_mldefc *c, struct ck_mldefc_walk *w, const struct ck_jin *l,
                      size_t i)
{
    char where[64];
    snprintf(where, sizeof where, "Layers[%zu]", i);
    if (l->type != CK_JIN_OBJECT)
        return ck_mldefc_vio(c, "manifest.key", where, "not an object");
    const char *name = ck_mldefc_str(c, l, "Name", true, where);
    if (!name)
        return;
    snprintf(where, sizeof where, "Layers[%zu] '%.40s'", i, name);
    bool twice = false;
    if (ck_strset_put(&w->layerset, name, i, &twice) < 0)
        ck_mldefc_vio(c, "layer.name", where, "%s", ck_error_msg());
    if (twice)
        ck_mldefc_vio(c, "layer.name", where, "layer name '%s' used twice", name);
    ck_mldefc_push(&w->layer_names, &w->nlayer_names, &w->caplayer_names, name);
    const char *caps = ck_mldefc_str(c, l, "Capabilities", false, where);
    const char *opname = ck_mldefc_str(c, l, "Op", false, where);
    if (!opname && ck_mldefc_has_word(caps, "input")) {
        if (i != w->nin)
            ck_mldefc_vio(c, "noderange.input", where,
                          "input layers come first; this one follows a layer");
        return input_layer(c, w, l, name, where);
    }
    enum ck_op op = opname ? ck_op_from_name(opname) : CK_OP_INVALID;
    if (op == CK_OP_INVALID)
        ck_mldefc_vio(c, "layer.op", where, opname ? "unknown Op '%s'" : "no Op%s",
                      opname ? opname : "");
    struct ck_model_node *node = NULL;
    if (c->load && op != CK_OP_INVALID && ck_model_add_node(c->m, name, op, &node) < 0)
        return ck_mldefc_vio(c, "layer.op", where, "%s", ck_error_msg());
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
            ck_mldefc_vio(c, "layer.inputs", where,
                          "'Inputs' is not an array of at most 256 names");
        else
            for (const struct ck_jin *e = ins->first; e; e = e->next) {
                if (e->type != CK_JIN_STRING) {
                    ck_mldefc_vio(c, "layer.inputs", where, "'Inputs' holds a non-string");
                    continue;
                }
                inputs[nin++] = e->str;
            }
    } else {
        const char *prior = ck_mldefc_str(c, l, "Prior", false, where);
        if (prior && *prior)
            inputs[nin++] = prior;
        for (size_t k = 0; k < nw; k++)
            inputs[nin++] = wnames[k];
    }
    for (size_t k = 0; k < nin; k++) {
        if (!defined(c, inputs[k]))
            ck_mldefc_vio(c, "layer.inputs", where, "input '%s' is not defined before this layer",
                          inputs[k]);
        if (node && ck_model_node_add_input(node, inputs[k]) < 0)
            ck_mldefc_vio(c, "layer.inputs", where, "%s", ck_error_msg());
    }
    if (op != CK_OP_INVALID) {
        size_t lo, hi;
        ck_op_arity(op, &p, &lo, &hi);
        if (nin < lo || (hi && nin > hi))
            ck_mldefc_vio(c, "layer.inputs", where, "%s takes %zu to %zu inputs, not %zu", opname,
                          lo, hi ? hi : (size_t)256, nin);
    }
    /* outputs */
    const struct ck_jin *outs = ck_jin_get(l, "Outputs");
    w->nlast = 0;
    if (outs && (outs->type != CK_JIN_ARRAY || outs->n == 0 || outs->n > 256)) {
        ck_mldefc_vio(c, "layer.outputs", where, "'Outputs' is not an array of 1 to 256 names");
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
            ck_mldefc_vio(c, "layer.outputs", where, "'Outputs' holds a non-string");
            continue;
        }
        define(c, o, "layer.outputs", where);
        w->last_outputs[w->nlast++] = o;
        if (node && ck_model_node_add_output(node, o) < 0)
            ck_mldefc_vio(c, "layer.outputs", where, "%s", ck_error_msg());
    }
}

void ck_mldefc_layers(struct ck_mldefc *c, struct ck_mldefc_walk *w)
{
    const struct ck_jin *a = ck_jin_get(c->root, "Layers");
    if (!a)
        return ck_mldefc_vio(c, "manifest.key", "Layers", "missing");
    if (a->type != CK_JIN_ARRAY)
        return ck_mldefc_vio(c, "manifest.key", "Layers", "not an array");
    if (!(w->in = calloc(a->n ? a->n : 1, sizeof *w->in)))
        return;
    size_t i = 0;
    for (const struct ck_jin *l = a->first; l; l = l->next, i++)
        one_layer(c, w, l, i);
    c->r->nlayers = i;
    if (i == w->nin)
        ck_mldefc_vio(c, "layer.op", "Layers", "no layer besides the inputs");
}

/* ---- node ranges ---- */

static const char *const range_numbers[] = {
    "NormalizationPreOffset", "NormalizationScale",   "NormalizationPostOffset",
    "MaximumValue",           "MinimumValue",         "MissingErrorValue",
    "AboveRangeErrorValue",   "BelowRangeErrorValue", NULL};

void ck_mldefc_node_ranges(struct ck_mldefc *c, struct ck_mldefc_walk *w)
{
    const struct ck_jin *a = ck_jin_get(c->root, "NodeRanges");
    if (!a)
        return ck_mldefc_vio(c, "manifest.key", "NodeRanges", "missing");
    if (a->type != CK_JIN_ARRAY)
        return ck_mldefc_vio(c, "manifest.key", "NodeRanges", "not an array");
    size_t i = 0, nin = 0, nout = 0;
    bool last_ok = false;
    const char **names = NULL;
    size_t nnames = 0, cap = 0;
    struct ck_strset rangeset = CK_STRSET_INIT;
    for (const struct ck_jin *r = a->first; r; r = r->next, i++) {
        char where[96];
        snprintf(where, sizeof where, "NodeRanges[%zu]", i);
        if (r->type != CK_JIN_OBJECT) {
            ck_mldefc_vio(c, "manifest.key", where, "not an object");
            continue;
        }
        const char *name = ck_mldefc_str(c, r, "Name", true, where);
        const char *type = ck_mldefc_str(c, r, "Type", true, where);
        for (const char *const *k = range_numbers; *k; k++) {
            double x;
            const struct ck_jin *v = ck_jin_get(r, *k);
            if (v && !ck_mldefc_num(v, &x))
                ck_mldefc_vio(c, "manifest.key", where, "'%s' is not a number", *k);
        }
        if (!name || !type)
            continue;
        bool twice = false;
        if (ck_strset_put(&rangeset, name, nnames, &twice) < 0)
            ck_mldefc_vio(c, "noderange.name", where, "%s", ck_error_msg());
        if (twice)
            ck_mldefc_vio(c, "noderange.name", where, "node range '%s' declared twice", name);
        ck_mldefc_push(&names, &nnames, &cap, name);
        uint64_t count = 0;
        bool has_count = ck_mldefc_uint(c, r, "Count", &count, where);
        int rank = 0;
        int64_t dims[CK_TENSOR_MAX_RANK];
        bool has_shape = ck_mldefc_shape(c, r, where, &rank, dims, true), overflow;
        if (!has_count)
            ck_mldefc_vio(c, "manifest.key", where, "'Count' is missing");
        uint64_t n = has_shape ? ck_mldefc_numel(rank, dims, true, &overflow) : 0;
        if (has_count && has_shape && n && n != count)
            ck_mldefc_vio(c, "noderange.count", where,
                          "Count %llu but Shape holds %llu values per sample",
                          (unsigned long long)count, (unsigned long long)n);
        if (strcmp(type, "input") == 0) {
            if (nin >= w->nin || strcmp(w->in[nin].name, name) != 0)
                ck_mldefc_vio(c, "noderange.input", where, "input '%s' is not input layer %zu (%s)",
                              name, nin, nin < w->nin ? w->in[nin].name : "none");
            else if (has_count && w->in[nin].count != count)
                ck_mldefc_vio(c, "noderange.input", where,
                              "Count %llu but its input layer has %llu", (unsigned long long)count,
                              (unsigned long long)w->in[nin].count);
            nin++;
        } else if (strcmp(type, "output") == 0) {
            if (!defined(c, name))
                ck_mldefc_vio(c, "noderange.output", where, "output '%s' is produced by no layer",
                              name);
            if (ck_mldefc_has(w->last_outputs, w->nlast, name))
                last_ok = true;
            if (c->load && ck_model_add_io(c->m, true, name, CK_DT_F32, rank, dims) < 0)
                ck_mldefc_vio(c, "noderange.output", where, "%s", ck_error_msg());
            nout++;
        } else {
            ck_mldefc_vio(c, "noderange.type", where, "Type '%s' is neither input nor output",
                          type);
        }
    }
    if (nin != w->nin)
        ck_mldefc_vio(c, "noderange.input", "NodeRanges", "%zu input ranges for %zu input layers",
                      nin, w->nin);
    if (nout == 0)
        ck_mldefc_vio(c, "noderange.output", "NodeRanges", "no output range");
    else if (w->nlast && !last_ok)
        ck_mldefc_vio(c, "noderange.output", "NodeRanges",
                      "the last layer produces no output range");
    free(names);
    ck_strset_release(&rangeset);
}

/* ---- tests ---- */

static uint64_t range_count(struct ck_mldefc *c, const char *name, bool *input)
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

static void test_files(struct ck_mldefc *c, const struct ck_jin *t, const char *key,
                       const char *where, uint64_t *samples, size_t *ninputs)
{
    const struct ck_jin *a = ck_jin_get(t, key);
    if (!a || a->type != CK_JIN_ARRAY)
        return ck_mldefc_vio(c, "test.inputs", where, "'%s' is not an array", key);
    size_t k = 0;
    for (const struct ck_jin *e = a->first; e; e = e->next, k++) {
        char wh[128];
        snprintf(wh, sizeof wh, "%s.%s[%zu]", where, key, k);
        const char *range =
            e->type == CK_JIN_OBJECT ? ck_mldefc_str(c, e, "NodeRange", true, wh) : NULL;
        const char *path = e->type == CK_JIN_OBJECT ? ck_mldefc_str(c, e, "Path", true, wh) : NULL;
        if (!range || !path)
            continue;
        bool input = false;
        uint64_t count = range_count(c, range, &input);
        if (!count || input != (strcmp(key, "Inputs") == 0)) {
            ck_mldefc_vio(c, "test.inputs", wh, "'%s' is not an %s node range", range,
                          strcmp(key, "Inputs") == 0 ? "input" : "output");
            continue;
        }
        if (input)
            (*ninputs)++;
        if (strncmp(path, "tests/", 6) != 0)
            ck_mldefc_vio(c, "test.path", wh, "'%s' is not in the folder tests/", path);
        if (!ck_mldefc_file_ok(c, path, wh))
            continue;
        uint64_t size = 0, n;
        ck_mldef_src_size(&c->src, path, &size);
        if (strcmp(ck_mldefc_ext(path), ".csv") == 0) {
            const unsigned char *p;
            uint64_t len;
            if (ck_mldef_src_read(&c->src, path, CK_MLDEFC_MAX_CSV, c->set, &p, &len) < 0 ||
                ck_mldefc_csv(c, path, p, len, NULL, &n) < 0)
                continue;
        } else if (strcmp(ck_mldefc_ext(path), ".float32") == 0) {
            n = size / 4;
            if (size % 4)
                n = 1; /* forces the error below */
        } else {
            ck_mldefc_vio(c, "test.path", wh, "'%s' is not .float32 or .csv", path);
            continue;
        }
        if (n % count || (size && !n)) {
            ck_mldefc_vio(c, "test.size", wh, "'%s' does not hold whole samples of %llu values",
                          path, (unsigned long long)count);
            continue;
        }
        if (*samples == UINT64_MAX)
            *samples = n / count;
        else if (*samples != n / count)
            ck_mldefc_vio(c, "test.size", wh,
                          "'%s' holds %llu samples, the test's other files %llu", path,
                          (unsigned long long)(n / count), (unsigned long long)*samples);
    }
}

void ck_mldefc_tests(struct ck_mldefc *c, const struct ck_mldefc_walk *w)
{
    const struct ck_jin *a = ck_jin_get(c->root, "Tests");
    if (!a)
        return;
    if (a->type != CK_JIN_ARRAY)
        return ck_mldefc_vio(c, "manifest.key", "Tests", "not an array");
    size_t i = 0;
    for (const struct ck_jin *t = a->first; t; t = t->next, i++) {
        char where[64];
        snprintf(where, sizeof where, "Tests[%zu]", i);
        if (t->type != CK_JIN_OBJECT) {
            ck_mldefc_vio(c, "manifest.key", where, "not an object");
            continue;
        }
        ck_mldefc_str(c, t, "Name", true, where);
        double tol;
        const struct ck_jin *tv = ck_jin_get(t, "Tolerance");
        if (tv && (!ck_mldefc_num(tv, &tol) || !(tol >= 0)))
            ck_mldefc_vio(c, "manifest.key", where, "'Tolerance' is not a non-negative number");
        uint64_t samples = UINT64_MAX;
        size_t nin = 0;
        test_files(c, t, "Inputs", where, &samples, &nin);
        test_files(c, t, "Outputs", where, &samples, &nin);
        if (nin != w->nin)
            ck_mldefc_vio(c, "test.inputs", where, "%zu inputs for %zu input node ranges", nin,
                          w->nin);
    }
}
