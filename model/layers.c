#include "model/layers.h"
#include "model/dims.h"
#include "common/strset.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "model/convert.h"
#include "model/shape.h"
#include "model/weightsel.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYERS 100000
#define MAX_REFS 64

/* Names a layer list may use for an op beside the canonical ones, and what
 * they preset. */
static const struct alias {
    const char *name;
    enum ck_op op;
} aliases[] = {
    {"linear", CK_OP_DENSE},         {"affine", CK_OP_DENSE},
    {"conv", CK_OP_CONV2D},          {"max_pool", CK_OP_MAXPOOL},
    {"avg_pool", CK_OP_AVGPOOL},     {"global_avg_pool", CK_OP_GLOBAL_AVGPOOL},
    {"dropout", CK_OP_IDENTITY},     {"relu6", CK_OP_CLIP},
    {"batch_norm", CK_OP_BATCHNORM}, {"layer_norm", CK_OP_LAYERNORM},
    {"embedding", CK_OP_GATHER},
};

struct lctx {
    struct ck_yaml_doc *d;
    const char *label;
    bool dry; /* no weights (ck_layers_check): tensor names taken as given, no shapes */
    struct ck_model *m;
    const char *input; /* the graph input's value name (borrowed from the model) */
    char **values;     /* per layer: the name of its (first) output */
    char **names;      /* per layer: its name: key, or NULL */
    struct ck_strset nameset; /* the names given, to their layer (one look-up per reference) */
    size_t n;          /* layers so far */
    size_t count;      /* entries of values and names */
    /* where names not in the file as written are looked up (model/weightsel.h) */
    const struct ck_layers_opts *o;
    bool sel_done;
    struct ck_weightsel sel;
    /* the layer being read, for messages */
    size_t index;
    int line;
    const char *opname;
};

static int lfail(const struct lctx *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int lfail(const struct lctx *c, int code, const char *fmt, ...)
{
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ck_error(code, "'%s' line %d: layer %zu (%s): %s", c->label, c->line, c->index,
                    c->opname, msg);
}

static yaml_node_t *map_get(struct ck_yaml_doc *d, yaml_node_t *map, const char *key)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = ck_yaml_node(d, p->key);
        if (k && k->type == YAML_SCALAR_NODE && !strcmp((const char *)k->data.scalar.value, key))
            return ck_yaml_node(d, p->value);
    }
    return NULL;
}

/* ---- scalars ---- */

static int get_str(const struct lctx *c, yaml_node_t *v, const char *key, const char **out)
{
    struct ck_yaml_value y;
    ck_yaml_resolve(v, &y);
    if (y.type != CK_Y_STR || !y.len || memchr(y.s, 0, y.len))
        return lfail(c, CK_EFORMAT, "'%s' must be a name", key);
    *out = y.s;
    return 0;
}

static int get_int(const struct lctx *c, yaml_node_t *v, const char *key, int64_t *out)
{
    struct ck_yaml_value y;
    *out = 0;
    ck_yaml_resolve(v, &y);
    if (y.type != CK_Y_INT)
        return lfail(c, CK_EFORMAT, "'%s' must be an integer", key);
    *out = y.i;
    return 0;
}

static int get_bool(const struct lctx *c, yaml_node_t *v, const char *key, bool *out)
{
    struct ck_yaml_value y;
    ck_yaml_resolve(v, &y);
    if (y.type != CK_Y_BOOL)
        return lfail(c, CK_EFORMAT, "'%s' must be true or false", key);
    *out = y.b;
    return 0;
}

/* A number; YAML 1.1 types "1e-5" as a string, so strings that are whole
 * numbers count too. */
static int get_float(const struct lctx *c, yaml_node_t *v, const char *key, float *out)
{
    struct ck_yaml_value y;
    ck_yaml_resolve(v, &y);
    if (y.type == CK_Y_INT) {
        *out = (float)y.i;
        return 0;
    }
    if (y.type == CK_Y_FLOAT) {
        *out = (float)y.f;
        return 0;
    }
    if (y.type == CK_Y_STR && y.len && y.len < 64) {
        char tmp[64], *end;
        memcpy(tmp, y.s, y.len);
        tmp[y.len] = 0;
        errno = 0;
        double d = strtod(tmp, &end);
        if (!*end && end != tmp && errno == 0) {
            *out = (float)d;
            return 0;
        }
    }
    return lfail(c, CK_EFORMAT, "'%s' must be a number", key);
}

/* An integer or a list of at most max integers. */
static int get_ints(const struct lctx *c, yaml_node_t *v, const char *key, size_t max, int64_t *out,
                    size_t *n)
{
    *n = 0;
    if (v->type == YAML_SCALAR_NODE) {
        *n = 1;
        return get_int(c, v, key, out);
    }
    if (v->type != YAML_SEQUENCE_NODE)
        return lfail(c, CK_EFORMAT, "'%s' must be an integer or a list of integers", key);
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++) {
        yaml_node_t *e = ck_yaml_node(c->d, *it);
        if (*n >= max)
            return lfail(c, CK_EFORMAT, "'%s' has more than %zu values", key, max);
        if (!e || e->type != YAML_SCALAR_NODE)
            return lfail(c, CK_EFORMAT, "'%s' must be a list of integers", key);
        int err = get_int(c, e, key, &out[(*n)++]);
        if (err < 0)
            return err;
    }
    return 0;
}

/* kernel, stride, dilation: one value for both, or [h, w]. */
static int get_pair(const struct lctx *c, yaml_node_t *v, const char *key, int64_t *out)
{
    int64_t a[2];
    size_t n;
    int err = get_ints(c, v, key, 2, a, &n);
    if (err < 0)
        return err;
    if (n == 0)
        return lfail(c, CK_EFORMAT, "'%s' is empty", key);
    out[0] = a[0];
    out[1] = n == 2 ? a[1] : a[0];
    if (out[0] < 1 || out[1] < 1)
        return lfail(c, CK_EFORMAT, "'%s' must be at least 1", key);
    return 0;
}

/* padding: p (all sides), [h, w] (top = bottom = h, left = right = w) or
 * [top, left, bottom, right]. */
static int get_padding(const struct lctx *c, yaml_node_t *v, int64_t *pad)
{
    int64_t a[4];
    size_t n;
    int err = get_ints(c, v, "padding", 4, a, &n);
    if (err < 0)
        return err;
    if (n == 1)
        pad[0] = pad[1] = pad[2] = pad[3] = a[0];
    else if (n == 2)
        pad[0] = pad[2] = a[0], pad[1] = pad[3] = a[1];
    else if (n == 4)
        memcpy(pad, a, sizeof a);
    else
        return lfail(c, CK_EFORMAT, "'padding' takes 1, 2 or 4 values (top, left, bottom, right)");
    for (int i = 0; i < 4; i++)
        if (pad[i] < 0)
            return lfail(c, CK_EFORMAT, "'padding' must not be negative");
    return 0;
}

/* ---- which keys go with which op ---- */

static bool one_of(enum ck_op op, const enum ck_op *set, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (set[i] == op)
            return true;
    return false;
}
#define IN(op, ...)                                                                                \
    one_of((op), (const enum ck_op[]){__VA_ARGS__},                                                \
           sizeof((const enum ck_op[]){__VA_ARGS__}) / sizeof(enum ck_op))

static bool is_arith(enum ck_op op)
{
    return IN(op, CK_OP_ADD, CK_OP_SUB, CK_OP_MUL, CK_OP_DIV, CK_OP_POW);
}

static bool is_pool(enum ck_op op)
{
    return op == CK_OP_MAXPOOL || op == CK_OP_AVGPOOL;
}

static bool key_applies(const char *k, enum ck_op op)
{
    if (!strcmp(k, "op") || !strcmp(k, "name") || !strcmp(k, "from") || !strcmp(k, "inputs"))
        return true;
    if (!strcmp(k, "weight"))
        return IN(op, CK_OP_DENSE, CK_OP_CONV2D, CK_OP_BATCHNORM, CK_OP_LAYERNORM, CK_OP_GATHER,
                  CK_OP_MATMUL) ||
               is_arith(op);
    if (!strcmp(k, "bias"))
        return IN(op, CK_OP_DENSE, CK_OP_CONV2D, CK_OP_BATCHNORM, CK_OP_LAYERNORM);
    if (!strcmp(k, "mean") || !strcmp(k, "var"))
        return op == CK_OP_BATCHNORM;
    if (!strcmp(k, "layout"))
        return op == CK_OP_DENSE;
    if (!strcmp(k, "stride") || !strcmp(k, "padding"))
        return op == CK_OP_CONV2D || is_pool(op);
    if (!strcmp(k, "dilation") || !strcmp(k, "groups"))
        return op == CK_OP_CONV2D;
    if (!strcmp(k, "kernel") || !strcmp(k, "ceil_mode"))
        return is_pool(op);
    if (!strcmp(k, "count_include_pad"))
        return op == CK_OP_AVGPOOL;
    if (!strcmp(k, "axis"))
        return IN(op, CK_OP_DENSE, CK_OP_SOFTMAX, CK_OP_LOG_SOFTMAX, CK_OP_FLATTEN, CK_OP_CONCAT,
                  CK_OP_SPLIT, CK_OP_BATCHNORM, CK_OP_LAYERNORM, CK_OP_GATHER);
    if (!strcmp(k, "eps"))
        return op == CK_OP_BATCHNORM || op == CK_OP_LAYERNORM;
    if (!strcmp(k, "alpha") || !strcmp(k, "negative_slope"))
        return op == CK_OP_LEAKY_RELU;
    if (!strcmp(k, "approximate"))
        return op == CK_OP_GELU;
    if (!strcmp(k, "min") || !strcmp(k, "max"))
        return op == CK_OP_CLIP;
    if (!strcmp(k, "scalar"))
        return is_arith(op);
    if (!strcmp(k, "scalar_first"))
        return op == CK_OP_SUB || op == CK_OP_DIV;
    if (!strcmp(k, "shape"))
        return op == CK_OP_RESHAPE;
    if (!strcmp(k, "perm"))
        return op == CK_OP_TRANSPOSE;
    if (!strcmp(k, "axes"))
        return IN(op, CK_OP_SQUEEZE, CK_OP_UNSQUEEZE) || ck_op_is_reduce(op);
    if (!strcmp(k, "keepdims"))
        return ck_op_is_reduce(op);
    if (!strcmp(k, "sizes") || !strcmp(k, "outputs"))
        return op == CK_OP_SPLIT;
    if (!strcmp(k, "slices"))
        return op == CK_OP_SLICE;
    if (!strcmp(k, "pads") || !strcmp(k, "value"))
        return op == CK_OP_PAD;
    return false;
}

static bool key_known(const char *k)
{
    for (int op = 1; op < CK_OP_COUNT; op++)
        if (key_applies(k, (enum ck_op)op))
            return true;
    return false;
}

/* ---- one layer's parameters ---- */

static int set_ints(const struct lctx *c, struct ck_model_node *n, yaml_node_t *v, const char *key)
{
    int64_t a[CK_MODEL_MAX_INTS];
    size_t k;
    int err = get_ints(c, v, key, CK_MODEL_MAX_INTS, a, &k);
    return err < 0 ? err : ck_model_node_set_ints(n, a, k);
}

/* slices: [[start, end, step], ...] per axis from 0 (step optional, 1). */
static int set_slices(const struct lctx *c, struct ck_model_node *n, yaml_node_t *v)
{
    int64_t a[CK_MODEL_MAX_INTS];
    size_t k = 0;
    if (v->type != YAML_SEQUENCE_NODE)
        return lfail(c, CK_EFORMAT, "'slices' must be a list of [start, end, step]");
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++) {
        yaml_node_t *e = ck_yaml_node(c->d, *it);
        int64_t t[3] = {0, 0, 1};
        size_t m;
        int err;
        if (k + 3 > CK_MODEL_MAX_INTS)
            return lfail(c, CK_EFORMAT, "'slices' has too many axes");
        if (!e || e->type != YAML_SEQUENCE_NODE || (err = get_ints(c, e, "slices", 3, t, &m)) < 0 ||
            m < 2)
            return lfail(c, CK_EFORMAT, "'slices' must be a list of [start, end, step]");
        if (m == 2)
            t[2] = 1;
        memcpy(a + k, t, sizeof t);
        k += 3;
    }
    return ck_model_node_set_ints(n, a, k);
}

/* The keys that are parameters (not inputs). */
static int param(struct lctx *c, struct ck_model_node *n, const char *k, yaml_node_t *v,
                 bool *stride_set)
{
    struct ck_op_params *p = &n->p;
    const char *s = NULL;
    int err = 0;
    if (!strcmp(k, "layout")) {
        if ((err = get_str(c, v, k, &s)) < 0)
            return err;
        if (!strcmp(s, "out_in"))
            p->trans_w = true;
        else if (!strcmp(s, "in_out"))
            p->trans_w = false;
        else
            return lfail(c, CK_EFORMAT,
                         "'layout' is out_in (torch, [out, in]) or in_out "
                         "([in, out]), not '%s'",
                         s);
    } else if (!strcmp(k, "stride")) {
        *stride_set = true;
        err = get_pair(c, v, k, p->stride);
    } else if (!strcmp(k, "dilation")) {
        err = get_pair(c, v, k, p->dilation);
    } else if (!strcmp(k, "kernel")) {
        err = get_pair(c, v, k, p->kernel);
    } else if (!strcmp(k, "padding")) {
        err = get_padding(c, v, p->pad);
    } else if (!strcmp(k, "groups")) {
        if ((err = get_int(c, v, k, &p->groups)) >= 0 && p->groups < 1)
            err = lfail(c, CK_EFORMAT, "'groups' must be at least 1");
    } else if (!strcmp(k, "axis")) {
        err = get_int(c, v, k, &p->axis);
    } else if (!strcmp(k, "ceil_mode")) {
        err = get_bool(c, v, k, &p->ceil_mode);
    } else if (!strcmp(k, "count_include_pad")) {
        err = get_bool(c, v, k, &p->count_include_pad);
    } else if (!strcmp(k, "keepdims")) {
        err = get_bool(c, v, k, &p->keepdims);
    } else if (!strcmp(k, "scalar_first")) {
        err = get_bool(c, v, k, &p->scalar_first);
    } else if (!strcmp(k, "eps")) {
        err = get_float(c, v, k, &p->eps);
    } else if (!strcmp(k, "alpha") || !strcmp(k, "negative_slope")) {
        err = get_float(c, v, k, &p->alpha);
    } else if (!strcmp(k, "min")) {
        err = get_float(c, v, k, &p->min);
    } else if (!strcmp(k, "max")) {
        err = get_float(c, v, k, &p->max);
    } else if (!strcmp(k, "scalar") || !strcmp(k, "value")) {
        p->has_scalar = !strcmp(k, "scalar");
        err = get_float(c, v, k, &p->scalar);
    } else if (!strcmp(k, "approximate")) {
        if ((err = get_str(c, v, k, &s)) < 0)
            return err;
        if (strcmp(s, "tanh") && strcmp(s, "none"))
            return lfail(c, CK_EFORMAT, "'approximate' is tanh or none, not '%s'", s);
        p->approx_tanh = !strcmp(s, "tanh");
    } else if (!strcmp(k, "shape") || !strcmp(k, "perm") || !strcmp(k, "axes") ||
               !strcmp(k, "sizes") || !strcmp(k, "pads")) {
        err = set_ints(c, n, v, k);
    } else if (!strcmp(k, "slices")) {
        err = set_slices(c, n, v);
    }
    return err;
}

/* ---- inputs ---- */

static int layer_of_name(const struct lctx *c, const char *s)
{
    size_t i;
    return ck_strset_get(&c->nameset, s, &i) && i < c->n ? (int)i : -1;
}

/* One entry of from/inputs: -k is k layers back (-1 the previous; before
 * layer 0 the graph input), k >= 0 layer k's output, a string a layer's
 * name, the input's name or a weight. */
static int ref(struct lctx *c, struct ck_model_node *n, yaml_node_t *e)
{
    struct ck_yaml_value y;
    if (!e || e->type != YAML_SCALAR_NODE)
        return lfail(c, CK_EFORMAT, "'from' must list layer offsets (-1), indices or names");
    ck_yaml_resolve(e, &y);
    if (y.type == CK_Y_INT) {
        int64_t at = y.i < 0 ? (int64_t)c->index + y.i : y.i;
        if (at == -1)
            return ck_model_node_add_input(n, c->input);
        if (at < 0 || at >= (int64_t)c->index)
            return lfail(c, CK_EFORMAT, "'from' %" PRId64 " is not an earlier layer", y.i);
        return ck_model_node_add_input(n, c->values[at]);
    }
    if (y.type != CK_Y_STR)
        return lfail(c, CK_EFORMAT, "'from' must list layer offsets (-1), indices or names");
    int at = layer_of_name(c, y.s);
    if (at >= 0)
        return ck_model_node_add_input(n, c->values[at]);
    if (!strcmp(y.s, c->input) || ck_model_weight(c->m, y.s))
        return ck_model_node_add_input(n, y.s);
    return lfail(c, CK_EFORMAT, "'%s' is neither an earlier layer's name, the input nor a tensor",
                 y.s);
}

static int refs(struct lctx *c, struct ck_model_node *n, yaml_node_t *from)
{
    if (!from)
        return c->index ? ck_model_node_add_input(n, c->values[c->index - 1])
                        : ck_model_node_add_input(n, c->input);
    if (from->type == YAML_SCALAR_NODE)
        return ref(c, n, from);
    if (from->type != YAML_SEQUENCE_NODE)
        return lfail(c, CK_EFORMAT, "'from' must list layer offsets (-1), indices or names");
    size_t k = 0;
    for (yaml_node_item_t *it = from->data.sequence.items.start; it < from->data.sequence.items.top;
         it++, k++) {
        int err;
        if (k >= MAX_REFS)
            return lfail(c, CK_EFORMAT, "'from' lists over %d values", MAX_REFS);
        if ((err = ref(c, n, ck_yaml_node(c->d, *it))) < 0)
            return err;
    }
    if (!k)
        return lfail(c, CK_EFORMAT, "'from' is empty");
    return 0;
}

/* Finds (once) where the model's tensors sit in a training checkpoint. */
static int select_weights(struct lctx *c)
{
    if (c->sel_done)
        return 0;
    const char *key = c->o && c->o->weights_key ? c->o->weights_key : "pack.weights";
    int err = ck_weightsel_find(c->m->weights, c->o ? c->o->weights : NULL, key, &c->sel);
    if (err < 0)
        return lfail(c, err, "%s", ck_error_msg());
    c->sel_done = true;
    if (c->sel.prefix[0])
        ck_info("weights.chosen", "file='%s' container='%s' prefix='%s' tensors=%zu%s",
                c->m->weights->path ? c->m->weights->path : "", c->sel.container, c->sel.prefix,
                c->sel.ntensors, c->o && c->o->weights ? " (chosen)" : "");
    return 0;
}

/* A tensor key: must name a tensor of the checkpoint. */
static int tensor(struct lctx *c, struct ck_model_node *n, yaml_node_t *layer, const char *key,
                  bool required)
{
    yaml_node_t *v = map_get(c->d, layer, key);
    const char *s = NULL;
    int err;
    if (!v) {
        if (required)
            return lfail(c, CK_EFORMAT, "needs '%s' (a tensor name)", key);
        return 0;
    }
    if ((err = get_str(c, v, key, &s)) < 0)
        return err;
    if (c->dry)
        return ck_model_node_add_input(n, s);
    char full[CK_WEIGHTSEL_PREFIX_MAX + 1024];
    const struct ck_tensor *t = NULL;
    const char *file =
        c->m->weights && c->m->weights->path ? c->m->weights->path : "the checkpoint";
    bool chosen = c->o && c->o->weights;
    if (!chosen)
        t = ck_model_weight(c->m, s);
    if (!t && c->m->weights) {
        if ((err = select_weights(c)) < 0)
            return err;
        if (c->sel.prefix[0] &&
            snprintf(full, sizeof full, "%s%s", c->sel.prefix, s) < (int)sizeof full &&
            (t = ck_model_weight(c->m, full)))
            s = full;
    }
    if (!t && chosen)
        t = ck_model_weight(c->m, s);
    if (!t) {
        char near[1024] = "";
        if (c->m->weights)
            ck_weightsel_closest(c->m->weights, c->sel_done ? c->sel.prefix : NULL, s, 3, near,
                                 sizeof near);
        return lfail(c, CK_EFORMAT, "%s '%s' is not a tensor of '%s'%s%s%s", key, s, file,
                     near[0] ? " (closest: " : "", near, near[0] ? ")" : "");
    }
    if (!t->data)
        return lfail(c, CK_EFORMAT, "%s '%s' has no data in '%s'", key, s, file);
    if (ck_convert_kind_f32(t->dtype) == CK_CONVERT_NONE)
        return lfail(c, CK_EFORMAT, "%s '%s' holds %s, not numbers", key, s,
                     ck_dtype_name(t->dtype));
    return ck_model_node_add_input(n, s);
}

static int tensors(struct lctx *c, struct ck_model_node *n, yaml_node_t *layer)
{
    int err = 0;
    switch (n->op) {
    case CK_OP_DENSE:
    case CK_OP_CONV2D:
        if ((err = tensor(c, n, layer, "weight", true)) >= 0)
            err = tensor(c, n, layer, "bias", false);
        break;
    case CK_OP_BATCHNORM:
        if ((err = tensor(c, n, layer, "weight", true)) < 0 ||
            (err = tensor(c, n, layer, "bias", true)) < 0 ||
            (err = tensor(c, n, layer, "mean", true)) < 0)
            break;
        err = tensor(c, n, layer, "var", true);
        break;
    case CK_OP_LAYERNORM:
        if (map_get(c->d, layer, "bias") && !map_get(c->d, layer, "weight"))
            return lfail(c, CK_EFORMAT, "'bias' needs 'weight'");
        if ((err = tensor(c, n, layer, "weight", false)) >= 0)
            err = tensor(c, n, layer, "bias", false);
        break;
    case CK_OP_GATHER: {
        /* the table first, then the indices the previous layers give */
        char *idx = n->ninputs ? n->inputs[0] : NULL;
        if (n->ninputs != 1)
            return lfail(c, CK_EFORMAT, "takes one input (the indices)");
        n->inputs[0] = NULL;
        n->ninputs = 0;
        err = tensor(c, n, layer, "weight", true);
        if (err >= 0)
            err = ck_model_node_add_input(n, idx);
        free(idx);
        break;
    }
    default:
        if (map_get(c->d, layer, "weight"))
            err = tensor(c, n, layer, "weight", false);
        break;
    }
    return err;
}

/* ---- the list ---- */

static int lookup_op(const char *s, enum ck_op *op)
{
    *op = ck_op_from_name(s);
    for (size_t i = 0; *op == CK_OP_INVALID && i < sizeof aliases / sizeof *aliases; i++)
        if (!strcmp(aliases[i].name, s))
            *op = aliases[i].op;
    return *op == CK_OP_INVALID ? -1 : 0;
}

static int layer(struct lctx *c, yaml_node_t *l, bool last, const char *outname)
{
    yaml_node_t *opv, *namev, *from, *inputs;
    const char *opname = NULL, *name = NULL;
    enum ck_op op;
    struct ck_model_node *n;
    bool stride_set = false;
    char nodename[64], value[64];
    int err;
    c->line = l ? ck_yaml_line(l) : 0;
    c->opname = "?";
    if (!l || l->type != YAML_MAPPING_NODE)
        return lfail(c, CK_EFORMAT, "a layer is a mapping like {op: relu}");
    if (!(opv = map_get(c->d, l, "op")))
        return lfail(c, CK_EFORMAT, "has no 'op'");
    if ((err = get_str(c, opv, "op", &opname)) < 0)
        return err;
    c->opname = opname;
    if (lookup_op(opname, &op) < 0)
        return lfail(c, CK_EFORMAT, "unknown op '%s' (docs/model.md lists them)", opname);
    if ((namev = map_get(c->d, l, "name")) && (err = get_str(c, namev, "name", &name)) < 0)
        return err;
    if (name && (layer_of_name(c, name) >= 0 || !strcmp(name, c->input)))
        return lfail(c, CK_EFORMAT, "name '%s' is already used", name);
    snprintf(nodename, sizeof nodename, "layer %zu", c->index);
    if ((err = ck_model_add_node(c->m, name ? name : nodename, op, &n)) < 0)
        return err;
    if (!strcmp(opname, "relu6"))
        n->p.min = 0, n->p.max = 6;
    if (op == CK_OP_DENSE)
        n->p.trans_w = true; /* torch's [out, in] unless layout: in_out */
    if (op == CK_OP_AVGPOOL)
        n->p.count_include_pad = true; /* torch's AvgPool2d default */
    for (yaml_node_pair_t *p = l->data.mapping.pairs.start; p < l->data.mapping.pairs.top; p++) {
        yaml_node_t *k = ck_yaml_node(c->d, p->key), *v = ck_yaml_node(c->d, p->value);
        const char *key =
            k && k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "";
        if (!key_known(key))
            return lfail(c, CK_EFORMAT, "unknown key '%s'", key);
        if (!key_applies(key, op))
            return lfail(c, CK_EFORMAT, "'%s' does not apply to %s", key, ck_op_name(op));
        if ((err = param(c, n, key, v, &stride_set)) < 0)
            return err;
    }
    if (is_pool(op)) {
        if (!n->p.kernel[0])
            return lfail(c, CK_EFORMAT, "needs 'kernel'");
        if (!stride_set) /* torch's default: the stride is the kernel */
            n->p.stride[0] = n->p.kernel[0], n->p.stride[1] = n->p.kernel[1];
    }
    from = map_get(c->d, l, "from");
    inputs = map_get(c->d, l, "inputs");
    if (from && inputs)
        return lfail(c, CK_EFORMAT, "give 'from' or 'inputs', not both");
    if ((err = refs(c, n, from ? from : inputs)) < 0 || (err = tensors(c, n, l)) < 0)
        return err;
    if (is_arith(op) && !n->p.has_scalar && n->ninputs == 1)
        return lfail(c, CK_EFORMAT,
                     "needs a second operand ('from' with two values, 'weight' or "
                     "'scalar')");
    if (is_arith(op) && n->p.has_scalar && n->ninputs != 1)
        return lfail(c, CK_EFORMAT, "takes one input with 'scalar'");
    /* the value name: the layer's name, the list's output name for the last
     * layer, else layerN */
    snprintf(value, sizeof value, "layer%zu", c->index);
    const char *v = name ? name : last ? outname : value;
    size_t nout = 1;
    yaml_node_t *outs = map_get(c->d, l, "outputs");
    if (outs) {
        int64_t k;
        if ((err = get_int(c, outs, "outputs", &k)) < 0)
            return err;
        if (k < 1 || k > 64)
            return lfail(c, CK_EFORMAT, "'outputs' must be 1 to 64");
        nout = (size_t)k;
    } else if (op == CK_OP_SPLIT && n->p.nints) {
        nout = n->p.nints;
    } else if (op == CK_OP_SPLIT) {
        return lfail(c, CK_EFORMAT, "needs 'sizes' or 'outputs'");
    }
    for (size_t k = 0; k < nout; k++) {
        char buf[300];
        if (nout == 1)
            snprintf(buf, sizeof buf, "%s", v);
        else
            snprintf(buf, sizeof buf, "%s.%zu", v, k);
        if ((err = ck_model_node_add_output(n, buf)) < 0)
            return err;
    }
    if (!(c->values[c->index] = strdup(n->outputs[0])) ||
        (name && !(c->names[c->index] = strdup(name))))
        return ck_error(CK_ENOMEM, "out of memory");
    if (name && (err = ck_strset_put(&c->nameset, c->names[c->index], c->index, NULL)) < 0)
        return err;
    c->n = c->index + 1;
    return 0;
}

/* input: {name: x, shape: [...], dtype: float32} */
static int read_input(struct lctx *c, yaml_node_t *in, const char **name, int *rank, int64_t *dims,
                      bool *have)
{
    yaml_node_t *nv, *sv;
    size_t n;
    int err;
    c->line = ck_yaml_line(in);
    c->opname = "input";
    *have = false;
    if (in->type != YAML_MAPPING_NODE)
        return ck_error(CK_EFORMAT, "'%s' line %d: 'input' must be {name: x, shape: [...]}",
                        c->label, c->line);
    for (yaml_node_pair_t *p = in->data.mapping.pairs.start; p < in->data.mapping.pairs.top; p++) {
        yaml_node_t *k = ck_yaml_node(c->d, p->key);
        const char *key =
            k && k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "";
        if (strcmp(key, "name") && strcmp(key, "shape") && strcmp(key, "dtype"))
            return ck_error(CK_EFORMAT, "'%s' line %d: input: unknown key '%s'", c->label, c->line,
                            key);
    }
    if ((nv = map_get(c->d, in, "name")) && (err = get_str(c, nv, "name", name)) < 0)
        return err;
    if ((nv = map_get(c->d, in, "dtype"))) {
        const char *dt = NULL;
        if ((err = get_str(c, nv, "dtype", &dt)) < 0)
            return err;
        if (strcmp(dt, "float32"))
            return ck_error(CK_EFORMAT, "'%s' line %d: input: dtype '%s' (only float32 inputs)",
                            c->label, c->line, dt);
    }
    if ((sv = map_get(c->d, in, "shape"))) {
        if (sv->type != YAML_SEQUENCE_NODE)
            return ck_error(CK_EFORMAT, "'%s' line %d: input: 'shape' must be a list", c->label,
                            c->line);
        if ((err = get_ints(c, sv, "shape", CK_TENSOR_MAX_RANK, dims, &n)) < 0)
            return err;
        for (size_t i = 0; i < n; i++)
            if (dims[i] < -1 || dims[i] == 0)
                return ck_error(CK_EFORMAT,
                                "'%s' line %d: input: dimension %" PRId64 " (use -1 for any)",
                                c->label, c->line, dims[i]);
        *rank = (int)n;
        *have = true;
    }
    return 0;
}

/* With no input shape: [-1, in] for a first dense layer, [-1, C, -1, -1]
 * for a first conv2d. */
static int guess_input(struct lctx *c, int *rank, int64_t *dims)
{
    const struct ck_model_node *n = c->m->nnodes ? &c->m->nodes[0] : NULL;
    const struct ck_tensor *w = n && n->ninputs > 1 ? ck_model_weight(c->m, n->inputs[1]) : NULL;
    if (w && n->op == CK_OP_DENSE && w->rank == 2) {
        *rank = 2;
        dims[0] = -1;
        dims[1] = n->p.trans_w ? w->dims[1] : w->dims[0];
        return 0;
    }
    if (w && n->op == CK_OP_CONV2D && w->rank == 4) {
        *rank = 4;
        dims[0] = dims[2] = dims[3] = -1;
        if (!ck_dim_mul(w->dims[1], n->p.groups, &dims[1]) || dims[1] < 1)
            return ck_error(CK_EFORMAT,
                            "'%s': conv2d weight '%s' and groups %lld give no input channel count",
                            c->label, w->name, (long long)n->p.groups);
        return 0;
    }
    return ck_error(CK_EFORMAT,
                    "'%s': the input's shape is unknown: add 'input: {name: x, shape: [...]}' "
                    "(only a first dense or conv2d layer tells it)",
                    c->label);
}

static int build(struct lctx *c, yaml_node_t *root)
{
    yaml_node_t *list = root, *in = NULL, *outv = NULL;
    const char *inname = "input", *outname = "output";
    int64_t dims[CK_TENSOR_MAX_RANK];
    int rank = 0, err;
    bool have = false;
    if (!root)
        return ck_error(CK_EFORMAT, "'%s': the layer list is empty", c->label);
    if (root->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
             p++) {
            yaml_node_t *k = ck_yaml_node(c->d, p->key);
            const char *key =
                k && k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "";
            if (strcmp(key, "input") && strcmp(key, "output") && strcmp(key, "layers"))
                return ck_error(CK_EFORMAT,
                                "'%s' line %d: unknown key '%s' (input, output, layers)", c->label,
                                ck_yaml_line(root), key);
        }
        list = map_get(c->d, root, "layers");
        in = map_get(c->d, root, "input");
        outv = map_get(c->d, root, "output");
        if (!list)
            return ck_error(CK_EFORMAT, "'%s': no 'layers' list", c->label);
    }
    if (list->type != YAML_SEQUENCE_NODE)
        return ck_error(CK_EFORMAT, "'%s' line %d: the layers must be a list", c->label,
                        ck_yaml_line(list));
    size_t count = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
    if (!count)
        return ck_error(CK_EFORMAT, "'%s': the layer list is empty", c->label);
    if (count > MAX_LAYERS)
        return ck_error(CK_EFORMAT, "'%s': %zu layers (at most %d)", c->label, count, MAX_LAYERS);
    if (in && (err = read_input(c, in, &inname, &rank, dims, &have)) < 0)
        return err;
    if (outv) {
        c->line = ck_yaml_line(outv);
        c->opname = "output";
        if ((err = get_str(c, outv, "output", &outname)) < 0)
            return err;
    }
    c->input = inname;
    c->count = count;
    if (!(c->values = calloc(count, sizeof *c->values)) ||
        !(c->names = calloc(count, sizeof *c->names)))
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < count; i++) {
        c->index = i;
        yaml_node_t *l = ck_yaml_node(c->d, list->data.sequence.items.start[i]);
        if ((err = layer(c, l, i + 1 == count, outname)) < 0)
            return err;
    }
    if (c->dry) /* what the weights decide waits for them */
        return 0;
    if (!have && (err = guess_input(c, &rank, dims)) < 0)
        return err;
    if ((err = ck_model_add_io(c->m, false, inname, CK_DT_F32, rank, dims)) < 0 ||
        (err = ck_model_add_io(c->m, true, c->values[count - 1], CK_DT_F32, 0, NULL)) < 0)
        return err;
    struct ck_model_shapes sh;
    if ((err = ck_model_infer_shapes(c->m, &sh)) < 0)
        return ck_error_wrap(err, "'%s'", c->label);
    const struct ck_shape *os = ck_model_shape_of(&sh, c->m->outputs[0].name);
    c->m->outputs[0].rank = os->rank;
    memcpy(c->m->outputs[0].dims, os->dims, (size_t)os->rank * sizeof *os->dims);
    ck_model_shapes_release(&sh);
    return 0;
}

static int build_model(struct ck_tensor_set *weights, struct ck_yaml_doc *d, yaml_node_t *node,
                       const char *label, bool dry, const struct ck_layers_opts *o,
                       struct ck_model **out)
{
    struct lctx c = {.d = d, .label = label ? label : "layer list", .dry = dry, .o = o};
    int err;
    *out = NULL;
    if ((err = ck_model_new(weights, "layers", &c.m)) < 0)
        return err;
    err = build(&c, node);
    for (size_t i = 0; i < c.count; i++) {
        free(c.values ? c.values[i] : NULL);
        free(c.names ? c.names[i] : NULL);
    }
    free(c.values);
    ck_strset_release(&c.nameset);
    free(c.names);
    if (err < 0) {
        ck_model_free(c.m);
        return err;
    }
    *out = c.m;
    return 0;
}

int ck_layers_build(struct ck_tensor_set *weights, struct ck_yaml_doc *d, yaml_node_t *node,
                    const char *label, struct ck_model **out)
{
    return build_model(weights, d, node, label, false, NULL, out);
}

int ck_layers_build_opts(struct ck_tensor_set *weights, struct ck_yaml_doc *d, yaml_node_t *node,
                         const char *label, const struct ck_layers_opts *o, struct ck_model **out)
{
    return build_model(weights, d, node, label, false, o, out);
}

int ck_layers_check(const char *label, const char *text, size_t len, struct ck_model **out)
{
    struct ck_yaml_doc d;
    int err;
    *out = NULL;
    if ((err = ck_yaml_load(&d, label, text, len)) < 0)
        return err;
    err = build_model(NULL, &d, ck_yaml_root(&d), label, true, NULL, out);
    ck_yaml_release(&d);
    return err;
}

int ck_layers_parse(struct ck_tensor_set *weights, const char *label, const char *text, size_t len,
                    struct ck_model **out)
{
    return ck_layers_parse_opts(weights, label, text, len, NULL, out);
}

int ck_layers_parse_opts(struct ck_tensor_set *weights, const char *label, const char *text,
                         size_t len, const struct ck_layers_opts *o, struct ck_model **out)
{
    struct ck_yaml_doc d;
    int err;
    *out = NULL;
    if ((err = ck_yaml_load(&d, label, text, len)) < 0) {
        ck_tensor_set_free(weights);
        return err;
    }
    err = ck_layers_build_opts(weights, &d, ck_yaml_root(&d), label, o, out);
    ck_yaml_release(&d);
    return err;
}

int ck_layers_load(struct ck_tensor_set *weights, const char *path, struct ck_model **out)
{
    return ck_layers_load_opts(weights, path, NULL, out);
}

int ck_layers_load_opts(struct ck_tensor_set *weights, const char *path,
                        const struct ck_layers_opts *o, struct ck_model **out)
{
    struct ck_buf b;
    int err;
    *out = NULL;
    ck_buf_init(&b, CK_LAYERS_MAX_FILE);
    if ((err = ck_read_file(path, CK_LAYERS_MAX_FILE, &b)) < 0) {
        ck_tensor_set_free(weights);
        ck_buf_release(&b);
        return err;
    }
    err = ck_layers_parse_opts(weights, path, ck_buf_str(&b), b.len, o, out);
    ck_buf_release(&b);
    return err;
}
