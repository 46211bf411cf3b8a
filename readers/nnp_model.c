/* NNabla functions to ckptd's operations. The one table is nnp_ops below;
 * parameter names and defaults are NNabla's (functions.yaml): what a
 * function's *_param message leaves out takes NNabla's default here. The
 * reader gives the parameters as node attributes in text ("[2,2]", "true",
 * "0.0039"), and the variables' declared shapes as data-less tensors of the
 * set; these are read here and dropped from the model's weights. */
#include "readers/nnp_model.h"
#include "readers/reader.h"

#include "common/error.h"
#include "model/shape.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct nctx {
    struct ck_tensor_set *s;
    struct ck_model *m;
    const struct ck_graph_node *gn;
    const char *path;
    int64_t batch; /* the network's batch_size, or -1 */
};

static int nfail(const struct nctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int nfail(const struct nctx *c, const char *fmt, ...)
{
    char msg[1000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): %s", c->path, c->gn->name, c->gn->op, msg);
}

/* ---- attributes ---- */

static const char *attr(const struct nctx *c, const char *key)
{
    for (size_t i = 0; i < c->gn->nattrs; i++)
        if (!strcmp(c->gn->attrs[i].key, key))
            return c->gn->attrs[i].value;
    return NULL;
}

/* "3", "[2,2]" or "[]" into out; *n = 0 when absent. */
static int attr_ints(const struct nctx *c, const char *key, int64_t *out, size_t max, size_t *n)
{
    const char *v = attr(c, key), *p;
    *n = 0;
    if (!v)
        return 0;
    p = v;
    if (*p == '[')
        p++;
    while (*p && *p != ']') {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || *n >= max)
            return nfail(c, "parameter %s = '%s' is not a list of at most %zu integers", key, v,
                         max);
        out[(*n)++] = x;
        p = end;
        if (*p == ',')
            p++;
    }
    return 0;
}

static int attr_int(const struct nctx *c, const char *key, int64_t def, int64_t *out)
{
    size_t n;
    int64_t v[1];
    int err = attr_ints(c, key, v, 1, &n);
    *out = n ? v[0] : def;
    return err;
}

static int attr_bool(const struct nctx *c, const char *key, bool def, bool *out)
{
    const char *v = attr(c, key);
    *out = def;
    if (!v)
        return 0;
    if (!strcmp(v, "true") || !strcmp(v, "1"))
        *out = true;
    else if (!strcmp(v, "false") || !strcmp(v, "0"))
        *out = false;
    else
        return nfail(c, "parameter %s = '%s' is not a boolean", key, v);
    return 0;
}

static int attr_float(const struct nctx *c, const char *key, double def, double *out)
{
    const char *v = attr(c, key);
    char *end;
    *out = def;
    if (!v)
        return 0;
    errno = 0;
    *out = strtod(v, &end);
    if (end == v || *end || errno)
        return nfail(c, "parameter %s = '%s' is not a number", key, v);
    return 0;
}

/* The declared shape of a network variable (a data-less tensor of the set),
 * or NULL. */
static const struct ck_tensor *declared(const struct nctx *c, const char *name)
{
    return ck_tensor_set_find(c->s, name);
}

/* ---- node helpers ---- */

static int node(struct nctx *c, enum ck_op op, struct ck_model_node **out)
{
    return ck_model_add_node(c->m, c->gn->name, op, out);
}

static int need_inputs(const struct nctx *c, size_t lo, size_t hi)
{
    struct ck_arity a = {(uint16_t)lo, (uint16_t)hi, 1, 1};
    return ck_graph_node_check_arity(c->gn, &a, c->path);
}

/* Inputs in the given order (indices into the NNabla inputs; -1 ends), then the output. */
static int wire(const struct nctx *c, struct ck_model_node *n, const int *order)
{
    int err;
    for (size_t i = 0; order[i] >= 0; i++)
        if ((size_t)order[i] < c->gn->ninputs &&
            (err = ck_model_node_add_input(n, c->gn->inputs[order[i]])) < 0)
            return err;
    return ck_model_node_add_output(n, c->gn->outputs[0]);
}

static const int in_order[] = {0, 1, 2, 3, 4, 5, 6, 7, -1};

/* ---- one function per shape of mapping ---- */

static int map_unary(struct nctx *c, enum ck_op op)
{
    struct ck_model_node *n;
    int err;
    if ((err = need_inputs(c, 1, 1)) < 0 || (err = node(c, op, &n)) < 0)
        return err;
    if (!strcmp(c->gn->op, "ReLU6"))
        n->p.min = 0, n->p.max = 6;
    else if (!strcmp(c->gn->op, "HardTanh"))
        n->p.min = -1, n->p.max = 1;
    else if (!strcmp(c->gn->op, "GELU"))
        n->p.approx_tanh = true; /* NNabla's GELU is the tanh form */
    else if (!strcmp(c->gn->op, "LeakyReLU")) {
        double a;
        if ((err = attr_float(c, "alpha", 0.1, &a)) < 0)
            return err;
        n->p.alpha = (float)a;
    } else if (op == CK_OP_SOFTMAX || op == CK_OP_LOG_SOFTMAX) {
        if ((err = attr_int(c, "axis", -1, &n->p.axis)) < 0)
            return err;
    }
    return wire(c, n, in_order);
}

static int map_binary(struct nctx *c, enum ck_op op)
{
    struct ck_model_node *n;
    int err;
    if ((err = need_inputs(c, 2, 2)) < 0 || (err = node(c, op, &n)) < 0)
        return err;
    return wire(c, n, in_order);
}

/* AddScalar, MulScalar, PowScalar, RSubScalar, RDivScalar: x op val. */
static int map_scalar(struct nctx *c, enum ck_op op)
{
    struct ck_model_node *n;
    double v;
    int err;
    if ((err = need_inputs(c, 1, 1)) < 0 || (err = attr_float(c, "val", 1.0, &v)) < 0 ||
        (err = node(c, op, &n)) < 0)
        return err;
    n->p.has_scalar = true;
    n->p.scalar = (float)v;
    n->p.scalar_first = !strncmp(c->gn->op, "R", 1);
    return wire(c, n, in_order);
}

/* Affine(x, W[in, out...], b[out...]; base_axis): dense with W as stored. */
static int map_affine(struct nctx *c, enum ck_op op)
{
    struct ck_model_node *n;
    int err;
    if ((err = need_inputs(c, 2, 3)) < 0 || (err = node(c, op, &n)) < 0 ||
        (err = attr_int(c, "base_axis", 1, &n->p.axis)) < 0)
        return err;
    n->p.trans_w = false;
    return wire(c, n, in_order);
}

static int no_channel_last(const struct nctx *c)
{
    bool cl;
    int err = attr_bool(c, "channel_last", false, &cl);
    if (err >= 0 && cl)
        err = nfail(c, "channel_last is not supported (ckptd computes NCHW)");
    return err;
}

/* a 2-D list parameter: [h, w] */
static int pair(const struct nctx *c, const char *key, int64_t def, int64_t *out)
{
    size_t n;
    int err = attr_ints(c, key, out, 2, &n);
    if (err < 0)
        return err;
    if (n == 0)
        out[0] = out[1] = def;
    else if (n != 2)
        return nfail(c, "parameter %s has %zu values (ckptd maps 2-D %s only)", key, n, c->gn->op);
    return 0;
}

static int map_conv(struct nctx *c, enum ck_op op)
{
    struct ck_model_node *n;
    int64_t base, pad[2];
    int err;
    if ((err = need_inputs(c, 2, 3)) < 0 || (err = no_channel_last(c)) < 0 ||
        (err = attr_int(c, "base_axis", 1, &base)) < 0)
        return err;
    if (base != 1)
        return nfail(c, "base_axis %" PRId64 " (ckptd maps 1: NCHW)", base);
    if ((err = node(c, op, &n)) < 0 || (err = pair(c, "pad", 0, pad)) < 0 ||
        (err = pair(c, "stride", 1, n->p.stride)) < 0 ||
        (err = pair(c, "dilation", 1, n->p.dilation)) < 0 ||
        (err = attr_int(c, "group", 1, &n->p.groups)) < 0)
        return err;
    n->p.pad[0] = n->p.pad[2] = pad[0];
    n->p.pad[1] = n->p.pad[3] = pad[1];
    return wire(c, n, in_order);
}

/* MaxPooling, AveragePooling. ignore_border false makes NNabla's output
 * ceil((H + 2 pad) / stride): the same windows as extra bottom/right
 * padding, computed from the input's declared shape. */
static int map_pool(struct nctx *c, enum ck_op op)
{
    struct ck_model_node *n;
    int64_t pad[2];
    bool ignore_border, including_pad;
    int err;
    if ((err = need_inputs(c, 1, 1)) < 0 || (err = no_channel_last(c)) < 0 ||
        (err = node(c, op, &n)) < 0 || (err = pair(c, "kernel", 0, n->p.kernel)) < 0 ||
        (err = pair(c, "pad", 0, pad)) < 0 ||
        (err = attr_bool(c, "ignore_border", true, &ignore_border)) < 0 ||
        (err = attr_bool(c, "including_pad", true, &including_pad)) < 0)
        return err;
    if (n->p.kernel[0] < 1)
        return nfail(c, "no kernel");
    if ((err = pair(c, "stride", 0, n->p.stride)) < 0)
        return err;
    if (n->p.stride[0] == 0) /* NNabla's default: the kernel */
        n->p.stride[0] = n->p.kernel[0], n->p.stride[1] = n->p.kernel[1];
    for (int i = 0; i < 2; i++)
        if (n->p.kernel[i] < 1 || n->p.kernel[i] > INT32_MAX || n->p.stride[i] < 1 ||
            n->p.stride[i] > INT32_MAX || pad[i] < 0 || pad[i] > INT32_MAX)
            return nfail(c, "kernel, stride or pad out of range");
    n->p.pad[0] = n->p.pad[2] = pad[0];
    n->p.pad[1] = n->p.pad[3] = pad[1];
    n->p.count_include_pad = including_pad;
    if (!ignore_border) {
        const struct ck_tensor *x = declared(c, c->gn->inputs[0]);
        if (!x || x->rank != 4 || x->dims[2] < 1 || x->dims[3] < 1 ||
            x->dims[2] > (INT64_C(1) << 40) || x->dims[3] > (INT64_C(1) << 40))
            return nfail(c, "ignore_border false needs the input's declared height and width");
        for (int i = 0; i < 2; i++) {
            int64_t span = x->dims[2 + i] + 2 * pad[i];
            int64_t out = (span + n->p.stride[i] - 1) / n->p.stride[i];
            int64_t extra = (out - 1) * n->p.stride[i] + n->p.kernel[i] - span;
            if (extra > 0) {
                if (op == CK_OP_AVGPOOL && including_pad)
                    return nfail(c, "ignore_border false with including_pad true is not "
                                    "supported");
                n->p.pad[2 + i] += extra;
            }
        }
    }
    return wire(c, n, in_order);
}

static int map_global_pool(struct nctx *c, enum ck_op op)
{
    return map_unary(c, op);
}

/* BatchNormalization(x, beta, gamma, mean, variance; axes, eps). */
static int map_batchnorm(struct nctx *c, enum ck_op op)
{
    static const int order[] = {0, 2, 1, 3, 4, -1};
    struct ck_model_node *n;
    int64_t axes[4];
    size_t na;
    double eps;
    bool batch_stat;
    int err;
    if ((err = need_inputs(c, 5, 5)) < 0 || (err = attr_ints(c, "axes", axes, 4, &na)) < 0 ||
        (err = attr_float(c, "eps", 1e-5, &eps)) < 0 ||
        (err = attr_bool(c, "batch_stat", true, &batch_stat)) < 0)
        return err;
    (void)batch_stat; /* inference uses the stored mean and variance either way */
    if (na > 1)
        return nfail(c, "normalises over %zu axes (ckptd maps one)", na);
    if ((err = node(c, op, &n)) < 0)
        return err;
    n->p.axis = na ? axes[0] : 1;
    n->p.eps = (float)eps;
    return wire(c, n, order);
}

/* Reshape(x; shape): a first dimension equal to the network's batch size,
 * on an input whose first dimension is the batch (-1 or that size), is the
 * batch whatever it is at run time (0: copy the input's). */
static int map_reshape(struct nctx *c, enum ck_op op)
{
    struct ck_model_node *n;
    int64_t shape[CK_MODEL_MAX_INTS];
    size_t ns;
    int err;
    if ((err = need_inputs(c, 1, 1)) < 0 ||
        (err = attr_ints(c, "shape", shape, CK_MODEL_MAX_INTS, &ns)) < 0)
        return err;
    const struct ck_tensor *x = declared(c, c->gn->inputs[0]);
    bool batched = x && x->rank && (x->dims[0] < 0 || (c->batch > 0 && x->dims[0] == c->batch));
    if (ns && batched && c->batch > 0 && shape[0] == c->batch)
        shape[0] = 0;
    if ((err = node(c, op, &n)) < 0 || (err = ck_model_node_set_ints(n, shape, ns)) < 0)
        return err;
    return wire(c, n, in_order);
}

static int map_concat(struct nctx *c, enum ck_op op)
{
    struct ck_model_node *n;
    int err;
    if ((err = need_inputs(c, 1, 0)) < 0 || (err = node(c, op, &n)) < 0 ||
        (err = attr_int(c, "axis", -1, &n->p.axis)) < 0)
        return err;
    for (size_t i = 0; i < c->gn->ninputs; i++)
        if ((err = ck_model_node_add_input(n, c->gn->inputs[i])) < 0)
            return err;
    return ck_model_node_add_output(n, c->gn->outputs[0]);
}

static int map_transpose(struct nctx *c, enum ck_op op)
{
    struct ck_model_node *n;
    int64_t axes[CK_MODEL_MAX_INTS];
    size_t na;
    int err;
    if ((err = need_inputs(c, 1, 1)) < 0 ||
        (err = attr_ints(c, "axes", axes, CK_MODEL_MAX_INTS, &na)) < 0 ||
        (err = node(c, op, &n)) < 0 || (err = ck_model_node_set_ints(n, axes, na)) < 0)
        return err;
    return wire(c, n, in_order);
}

/* BatchMatmul(a, b; transpose_a, transpose_b): transposes of the last two
 * axes become transpose nodes before the matmul. */
static int swap_last(struct nctx *c, const char *in, const char *suffix, char *out, size_t len)
{
    const struct ck_tensor *t = declared(c, in);
    struct ck_model_node *n;
    int64_t perm[CK_TENSOR_MAX_RANK];
    int err;
    if (!t || t->rank < 2)
        return nfail(c, "transposing '%s' needs its declared shape (rank 2 or more)", in);
    for (int i = 0; i < t->rank; i++)
        perm[i] = i;
    perm[t->rank - 2] = t->rank - 1;
    perm[t->rank - 1] = t->rank - 2;
    snprintf(out, len, "%s/%s", c->gn->outputs[0], suffix);
    if ((err = node(c, CK_OP_TRANSPOSE, &n)) < 0 ||
        (err = ck_model_node_set_ints(n, perm, (size_t)t->rank)) < 0 ||
        (err = ck_model_node_add_input(n, in)) < 0)
        return err;
    return ck_model_node_add_output(n, out);
}

static int map_matmul(struct nctx *c, enum ck_op op)
{
    struct ck_model_node *n;
    bool ta, tb;
    char a[600], b[600];
    int err;
    if ((err = need_inputs(c, 2, 2)) < 0 || (err = attr_bool(c, "transpose_a", false, &ta)) < 0 ||
        (err = attr_bool(c, "transpose_b", false, &tb)) < 0)
        return err;
    snprintf(a, sizeof a, "%s", c->gn->inputs[0]);
    snprintf(b, sizeof b, "%s", c->gn->inputs[1]);
    if ((ta && (err = swap_last(c, c->gn->inputs[0], "a_t", a, sizeof a)) < 0) ||
        (tb && (err = swap_last(c, c->gn->inputs[1], "b_t", b, sizeof b)) < 0))
        return err;
    if ((err = node(c, op, &n)) < 0 || (err = ck_model_node_add_input(n, a)) < 0 ||
        (err = ck_model_node_add_input(n, b)) < 0)
        return err;
    return ck_model_node_add_output(n, c->gn->outputs[0]);
}

/* Mean, Sum(x; axes, keep_dims) */
static int map_reduce(struct nctx *c, enum ck_op op)
{
    struct ck_model_node *n;
    int64_t axes[CK_MODEL_MAX_INTS];
    size_t na;
    int err;
    if ((err = need_inputs(c, 1, 1)) < 0 ||
        (err = attr_ints(c, "axes", axes, CK_MODEL_MAX_INTS, &na)) < 0 ||
        (err = node(c, op, &n)) < 0 ||
        (err = attr_bool(c, "keep_dims", false, &n->p.keepdims)) < 0 ||
        (err = ck_model_node_set_ints(n, axes, na)) < 0)
        return err;
    return wire(c, n, in_order);
}

/* Embed(x0 indices, w table) -> gather(table, indices) */
static int map_embed(struct nctx *c, enum ck_op op)
{
    static const int order[] = {1, 0, -1};
    struct ck_model_node *n;
    int err;
    if ((err = need_inputs(c, 2, 2)) < 0 || (err = node(c, op, &n)) < 0)
        return err;
    n->p.axis = 0;
    return wire(c, n, order);
}

/* The one table: NNabla function type -> operation and how its parameters map. */
static const struct nnp_op {
    const char *type;
    enum ck_op op;
    int (*map)(struct nctx *c, enum ck_op op);
} nnp_ops[] = {
    {"Affine", CK_OP_DENSE, map_affine},
    {"Convolution", CK_OP_CONV2D, map_conv},
    {"MaxPooling", CK_OP_MAXPOOL, map_pool},
    {"AveragePooling", CK_OP_AVGPOOL, map_pool},
    {"GlobalAveragePooling", CK_OP_GLOBAL_AVGPOOL, map_global_pool},
    {"ReLU", CK_OP_RELU, map_unary},
    {"LeakyReLU", CK_OP_LEAKY_RELU, map_unary},
    {"ReLU6", CK_OP_CLIP, map_unary},
    {"HardTanh", CK_OP_CLIP, map_unary},
    {"Sigmoid", CK_OP_SIGMOID, map_unary},
    {"Tanh", CK_OP_TANH, map_unary},
    {"GELU", CK_OP_GELU, map_unary},
    {"Softmax", CK_OP_SOFTMAX, map_unary},
    {"LogSoftmax", CK_OP_LOG_SOFTMAX, map_unary},
    {"Exp", CK_OP_EXP, map_unary},
    {"Log", CK_OP_LOG, map_unary},
    {"Identity", CK_OP_IDENTITY, map_unary},
    {"Dropout", CK_OP_IDENTITY, map_unary},
    {"Add2", CK_OP_ADD, map_binary},
    {"Sub2", CK_OP_SUB, map_binary},
    {"Mul2", CK_OP_MUL, map_binary},
    {"Div2", CK_OP_DIV, map_binary},
    {"Pow2", CK_OP_POW, map_binary},
    {"AddScalar", CK_OP_ADD, map_scalar},
    {"MulScalar", CK_OP_MUL, map_scalar},
    {"PowScalar", CK_OP_POW, map_scalar},
    {"RSubScalar", CK_OP_SUB, map_scalar},
    {"RDivScalar", CK_OP_DIV, map_scalar},
    {"Reshape", CK_OP_RESHAPE, map_reshape},
    {"BatchNormalization", CK_OP_BATCHNORM, map_batchnorm},
    {"Concatenate", CK_OP_CONCAT, map_concat},
    {"Transpose", CK_OP_TRANSPOSE, map_transpose},
    {"BatchMatmul", CK_OP_MATMUL, map_matmul},
    {"Mean", CK_OP_REDUCE_MEAN, map_reduce},
    {"Sum", CK_OP_REDUCE_SUM, map_reduce},
    {"Embed", CK_OP_GATHER, map_embed},
};

#define NNP_NOPS (sizeof nnp_ops / sizeof nnp_ops[0])

const char *const ck_nnp_mapped_types[] = {
    "Affine",      "Convolution", "MaxPooling",  "AveragePooling", "GlobalAveragePooling",
    "ReLU",        "LeakyReLU",   "ReLU6",       "HardTanh",       "Sigmoid",
    "Tanh",        "GELU",        "Softmax",     "LogSoftmax",     "Exp",
    "Log",         "Identity",    "Dropout",     "Add2",           "Sub2",
    "Mul2",        "Div2",        "Pow2",        "AddScalar",      "MulScalar",
    "PowScalar",   "RSubScalar",  "RDivScalar",  "Reshape",        "BatchNormalization",
    "Concatenate", "Transpose",   "BatchMatmul", "Mean",           "Sum",
    "Embed",       NULL,
};

/* ---- the whole network ---- */

static int add_io(struct nctx *c, bool output, const char *name)
{
    const struct ck_tensor *t = declared(c, name);
    if (!t)
        return ck_error(CK_EFORMAT, "'%s': graph %s '%s' is not a variable of the network", c->path,
                        output ? "output" : "input", name);
    int64_t dims[CK_TENSOR_MAX_RANK];
    memcpy(dims, t->dims, (size_t)t->rank * sizeof *dims);
    /* the batch dimension: -1, or the network's batch size written out */
    if (t->rank && c->batch > 0 && dims[0] == c->batch)
        dims[0] = -1;
    return ck_model_add_io(c->m, output, name, CK_DT_F32, t->rank, dims);
}

/* Drops the variables that are not parameters (they are values of the
 * graph, not weights); a parameter without values is an error. */
static int keep_parameters(struct nctx *c)
{
    struct ck_tensor_set *s = c->s;
    size_t k = 0;
    /* every check before the first change, so an error leaves s whole */
    for (size_t i = 0; i < s->ntensors; i++) {
        const struct ck_tensor *t = &s->tensors[i];
        if (!t->data && t->role && !strcmp(t->role, "parameter"))
            return ck_error(CK_EFORMAT,
                            "'%s': parameter '%s' has no values (the file holds the network only)",
                            c->path, t->name);
    }
    for (size_t i = 0; i < s->ntensors; i++) {
        struct ck_tensor *t = &s->tensors[i];
        if (!t->data)
            free(t->name);
        else
            s->tensors[k++] = *t;
    }
    s->ntensors = k;
    return 0;
}

int ck_nnp_to_model(struct ck_tensor_set *s, struct ck_model **out)
{
    struct nctx c = {.s = s, .path = s->path ? s->path : "nnp", .batch = -1};
    const struct ck_graph *g = s->graph;
    int err;
    *out = NULL;
    if (!g) {
        err = ck_error(CK_EUSAGE,
                       "'%s' holds no network (parameters only): give its graph "
                       "with --graph FILE (a layer list, docs/model.md)",
                       c.path);
        ck_tensor_set_free(s);
        return err;
    }
    if ((err = ck_model_new(s, "nnp", &c.m)) < 0)
        return err;
    if (g->name && !(c.m->name = strdup(g->name))) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < g->nattrs; i++)
        if (!strcmp(g->attrs[i].key, "batch_size"))
            c.batch = strtoll(g->attrs[i].value, NULL, 10);
    for (size_t i = 0; i < g->nnodes; i++) {
        const struct nnp_op *op = NULL;
        c.gn = &g->nodes[i];
        for (size_t k = 0; k < NNP_NOPS && !op; k++)
            if (!strcmp(nnp_ops[k].type, c.gn->op))
                op = &nnp_ops[k];
        if (!op) {
            err = ck_error(CK_EFORMAT,
                           "'%s': node '%s': NNabla function '%s' has no mapping to ckptd's "
                           "operations (docs/model.md lists the mapped ones)",
                           c.path, c.gn->name, c.gn->op);
            goto out;
        }
        if ((err = op->map(&c, op->op)) < 0)
            goto out;
    }
    if (!g->ninputs || !g->noutputs) {
        err = ck_error(CK_EFORMAT, "'%s': the executor names no data or output variable", c.path);
        goto out;
    }
    for (size_t i = 0; i < g->ninputs; i++)
        if ((err = add_io(&c, false, g->inputs[i])) < 0)
            goto out;
    for (size_t i = 0; i < g->noutputs; i++)
        if ((err = add_io(&c, true, g->outputs[i])) < 0)
            goto out;
    if ((err = keep_parameters(&c)) < 0)
        goto out;
    struct ck_model_shapes sh;
    if ((err = ck_model_infer_shapes(c.m, &sh)) < 0) {
        err = ck_error_wrap(err, "'%s'", c.path);
        goto out;
    }
    ck_model_shapes_release(&sh);
    *out = c.m;
    return 0;
out:
    ck_model_free(c.m);
    return err;
}
