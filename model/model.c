#include "model/model.h"
#include "model/dims.h"
#include "common/error.h"
#include "common/strset.h"

#include <math.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* One row per op, in enum order (checked by model.op_names_round_trip). */
static const char *const op_names[CK_OP_COUNT] = {
    [CK_OP_INVALID] = "invalid",
    [CK_OP_IDENTITY] = "identity",
    [CK_OP_DENSE] = "dense",
    [CK_OP_CONV2D] = "conv2d",
    [CK_OP_MAXPOOL] = "maxpool",
    [CK_OP_AVGPOOL] = "avgpool",
    [CK_OP_GLOBAL_AVGPOOL] = "global_avgpool",
    [CK_OP_GLOBAL_MAXPOOL] = "global_maxpool",
    [CK_OP_RELU] = "relu",
    [CK_OP_LEAKY_RELU] = "leaky_relu",
    [CK_OP_SIGMOID] = "sigmoid",
    [CK_OP_TANH] = "tanh",
    [CK_OP_GELU] = "gelu",
    [CK_OP_SOFTMAX] = "softmax",
    [CK_OP_LOG_SOFTMAX] = "log_softmax",
    [CK_OP_ADD] = "add",
    [CK_OP_SUB] = "sub",
    [CK_OP_MUL] = "mul",
    [CK_OP_DIV] = "div",
    [CK_OP_POW] = "pow",
    [CK_OP_MATMUL] = "matmul",
    [CK_OP_TRANSPOSE] = "transpose",
    [CK_OP_RESHAPE] = "reshape",
    [CK_OP_FLATTEN] = "flatten",
    [CK_OP_SQUEEZE] = "squeeze",
    [CK_OP_UNSQUEEZE] = "unsqueeze",
    [CK_OP_CONCAT] = "concat",
    [CK_OP_SPLIT] = "split",
    [CK_OP_SLICE] = "slice",
    [CK_OP_BATCHNORM] = "batchnorm",
    [CK_OP_LAYERNORM] = "layernorm",
    [CK_OP_GATHER] = "gather",
    [CK_OP_REDUCE_MEAN] = "reduce_mean",
    [CK_OP_REDUCE_SUM] = "reduce_sum",
    [CK_OP_SQRT] = "sqrt",
    [CK_OP_EXP] = "exp",
    [CK_OP_LOG] = "log",
    [CK_OP_NEG] = "neg",
    [CK_OP_ERF] = "erf",
    [CK_OP_CLIP] = "clip",
    [CK_OP_PAD] = "pad",
    [CK_OP_REDUCE_MAX] = "reduce_max",
    [CK_OP_REDUCE_MIN] = "reduce_min",
    [CK_OP_REDUCE_PROD] = "reduce_prod",
    [CK_OP_REDUCE_SUM_SQUARE] = "reduce_sum_square",
    [CK_OP_REDUCE_LOG_SUM] = "reduce_log_sum",
    [CK_OP_REDUCE_LOG_SUM_EXP] = "reduce_log_sum_exp",
    [CK_OP_REDUCE_L1] = "reduce_l1",
    [CK_OP_REDUCE_L2] = "reduce_l2",
    [CK_OP_ABS] = "abs",
    [CK_OP_CEIL] = "ceil",
    [CK_OP_FLOOR] = "floor",
    [CK_OP_ROUND] = "round",
    [CK_OP_SIGN] = "sign",
    [CK_OP_RECIPROCAL] = "reciprocal",
    [CK_OP_SIN] = "sin",
    [CK_OP_COS] = "cos",
    [CK_OP_TAN] = "tan",
    [CK_OP_ASIN] = "asin",
    [CK_OP_ACOS] = "acos",
    [CK_OP_ATAN] = "atan",
    [CK_OP_SINH] = "sinh",
    [CK_OP_COSH] = "cosh",
    [CK_OP_ASINH] = "asinh",
    [CK_OP_ACOSH] = "acosh",
    [CK_OP_ATANH] = "atanh",
    [CK_OP_SOFTPLUS] = "softplus",
    [CK_OP_SOFTSIGN] = "softsign",
    [CK_OP_MISH] = "mish",
    [CK_OP_HARD_SWISH] = "hard_swish",
    [CK_OP_ELU] = "elu",
    [CK_OP_CELU] = "celu",
    [CK_OP_SELU] = "selu",
    [CK_OP_HARD_SIGMOID] = "hard_sigmoid",
    [CK_OP_THRESHOLDED_RELU] = "thresholded_relu",
    [CK_OP_SHRINK] = "shrink",
    [CK_OP_MAX] = "max",
    [CK_OP_MIN] = "min",
    [CK_OP_PRELU] = "prelu",
    [CK_OP_FMOD] = "fmod",
    [CK_OP_HARDMAX] = "hardmax",
    [CK_OP_INSTANCENORM] = "instancenorm",
    [CK_OP_CONV_TRANSPOSE2D] = "conv_transpose2d",
    [CK_OP_RNN] = "rnn",
    [CK_OP_GRU] = "gru",
    [CK_OP_LSTM] = "lstm",
    [CK_OP_GRID_SAMPLE] = "grid_sample",
    [CK_OP_LRN] = "lrn",
    [CK_OP_DET] = "det",
    [CK_OP_WHERE] = "where",
    [CK_OP_EQUAL] = "equal",
    [CK_OP_LESS] = "less",
    [CK_OP_GREATER] = "greater",
    [CK_OP_LESS_EQUAL] = "less_equal",
    [CK_OP_GREATER_EQUAL] = "greater_equal",
    [CK_OP_NOT] = "not",
    [CK_OP_AND] = "and",
    [CK_OP_OR] = "or",
    [CK_OP_XOR] = "xor",
    [CK_OP_EXPAND] = "expand",
    [CK_OP_TILE] = "tile",
    [CK_OP_TRILU] = "trilu",
    [CK_OP_CUMSUM] = "cumsum",
    [CK_OP_ARGMAX] = "argmax",
    [CK_OP_ARGMIN] = "argmin",
    [CK_OP_GATHER_ELEMENTS] = "gather_elements",
    [CK_OP_RESIZE] = "resize",
    [CK_OP_TOPK] = "topk",
    [CK_OP_SHAPE] = "shape",
    [CK_OP_SIZE] = "size",
    [CK_OP_CONSTANT_OF_SHAPE] = "constant_of_shape",
    [CK_OP_RANGE] = "range",
    [CK_OP_CAST] = "cast",
};

enum ck_dtype ck_op_cast_dtype(int64_t code)
{
    static const enum ck_dtype codes[] = {
        [1] = CK_DT_F32, [2] = CK_DT_U8,  [3] = CK_DT_I8,   [4] = CK_DT_U16, [5] = CK_DT_I16,
        [6] = CK_DT_I32, [7] = CK_DT_I64, [9] = CK_DT_BOOL, [10] = CK_DT_F16, [11] = CK_DT_F64,
        [12] = CK_DT_U32, [13] = CK_DT_U64, [16] = CK_DT_BF16,
    };
    return code > 0 && code < (int64_t)(sizeof codes / sizeof codes[0]) ? codes[code]
                                                                        : CK_DT_INVALID;
}

bool ck_dtype_is_int(enum ck_dtype t)
{
    return t == CK_DT_I8 || t == CK_DT_I16 || t == CK_DT_I32 || t == CK_DT_I64 || t == CK_DT_U8 ||
           t == CK_DT_U16 || t == CK_DT_U32 || t == CK_DT_U64;
}

const char *ck_op_name(enum ck_op op)
{
    if ((int)op < 0 || op >= CK_OP_COUNT || !op_names[op])
        return "invalid";
    return op_names[op];
}

enum ck_op ck_op_from_name(const char *name)
{
    if (!name)
        return CK_OP_INVALID;
    for (int i = 1; i < CK_OP_COUNT; i++)
        if (op_names[i] && strcmp(op_names[i], name) == 0)
            return (enum ck_op)i;
    return CK_OP_INVALID;
}

void ck_op_params_init(struct ck_op_params *p)
{
    memset(p, 0, sizeof *p);
    p->stride[0] = p->stride[1] = 1;
    p->dilation[0] = p->dilation[1] = 1;
    p->groups = 1;
    p->axis = CK_AXIS_DEFAULT;
    p->alpha = 0.01f;
    p->eps = 1e-5f;
    p->min = -INFINITY;
    p->max = INFINITY;
}

int64_t ck_op_axis(const struct ck_op_params *p, int64_t def)
{
    return p->axis == CK_AXIS_DEFAULT ? def : p->axis;
}

static void strv_free(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

static int strv_push(char ***v, size_t *n, const char *s)
{
    if (*n >= 1u << 20)
        return ck_error(CK_ESIZE, "too many names on one graph node");
    char **a = realloc(*v, (*n + 1) * sizeof *a);
    if (!a)
        return ck_error(CK_ENOMEM, "out of memory");
    *v = a;
    if (!(a[*n] = strdup(s ? s : "")))
        return ck_error(CK_ENOMEM, "out of memory");
    (*n)++;
    return 0;
}

int ck_model_new(struct ck_tensor_set *weights, const char *source, struct ck_model **out)
{
    *out = NULL;
    struct ck_model *m = calloc(1, sizeof *m);
    if (!m) {
        ck_tensor_set_free(weights);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    m->weights = weights;
    m->source = source;
    *out = m;
    return 0;
}

static void node_release(struct ck_model_node *n)
{
    free(n->name);
    strv_free(n->inputs, n->ninputs);
    strv_free(n->outputs, n->noutputs);
    free(n->p.ints);
}

void ck_model_free(struct ck_model *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nnodes; i++)
        node_release(&m->nodes[i]);
    free(m->nodes);
    for (size_t i = 0; i < m->ninputs; i++)
        free(m->inputs[i].name);
    for (size_t i = 0; i < m->noutputs; i++)
        free(m->outputs[i].name);
    free(m->inputs);
    free(m->outputs);
    free(m->name);
    ck_tensor_set_free(m->weights);
    free(m);
}

int ck_model_add_node(struct ck_model *m, const char *name, enum ck_op op,
                      struct ck_model_node **out)
{
    if (m->nnodes == m->nodes_cap) {
        if (m->nodes_cap >= (1u << 24))
            return ck_error(CK_ESIZE, "too many graph nodes");
        size_t cap = m->nodes_cap ? m->nodes_cap * 2 : 16;
        struct ck_model_node *a = realloc(m->nodes, cap * sizeof *a);
        if (!a)
            return ck_error(CK_ENOMEM, "out of memory");
        m->nodes = a;
        m->nodes_cap = cap;
    }
    struct ck_model_node *n = &m->nodes[m->nnodes];
    memset(n, 0, sizeof *n);
    ck_op_params_init(&n->p);
    n->op = op;
    if (!(n->name = strdup(name ? name : "")))
        return ck_error(CK_ENOMEM, "out of memory");
    m->nnodes++;
    if (out)
        *out = n;
    return 0;
}

int ck_model_node_add_input(struct ck_model_node *n, const char *value)
{
    return strv_push(&n->inputs, &n->ninputs, value);
}

int ck_model_node_add_output(struct ck_model_node *n, const char *value)
{
    return strv_push(&n->outputs, &n->noutputs, value);
}

int ck_model_node_set_ints(struct ck_model_node *n, const int64_t *v, size_t count)
{
    if (count > CK_MODEL_MAX_INTS)
        return ck_error(CK_ESIZE, "node '%s': %zu integer parameters (at most %d)", n->name, count,
                        CK_MODEL_MAX_INTS);
    int64_t *a = NULL;
    if (count) {
        if (!(a = malloc(count * sizeof *a)))
            return ck_error(CK_ENOMEM, "out of memory");
        memcpy(a, v, count * sizeof *a);
    }
    free(n->p.ints);
    n->p.ints = a;
    n->p.nints = count;
    return 0;
}

int ck_model_add_io(struct ck_model *m, bool output, const char *name, enum ck_dtype dtype,
                    int rank, const int64_t *dims)
{
    const char *path = m->weights && m->weights->path ? m->weights->path : "";
    if (rank < 0 || rank > CK_TENSOR_MAX_RANK)
        return ck_error(CK_ESIZE, "'%s': graph %s '%s': rank %d out of range", path,
                        output ? "output" : "input", name, rank);
    /* what the engine and every archive format can hold: each dim -1 (any)
     * or at most CK_MODEL_NUMEL_MAX, and so the product of the known ones */
    int64_t known = 1;
    for (int d = 0; d < rank; d++)
        if (dims[d] < -1 || dims[d] > CK_MODEL_NUMEL_MAX ||
            (dims[d] > 0 && !ck_dim_mul(known, dims[d], &known)) || known > CK_MODEL_NUMEL_MAX)
            return ck_error(CK_EFORMAT,
                            "'%s': graph %s '%s': dimension %d (%" PRId64 ") makes a shape "
                            "larger than %" PRId64 " elements",
                            path, output ? "output" : "input", name, d, dims[d],
                            (int64_t)CK_MODEL_NUMEL_MAX);
    struct ck_model_io **v = output ? &m->outputs : &m->inputs;
    size_t *n = output ? &m->noutputs : &m->ninputs;
    if (*n >= 4096)
        return ck_error(CK_ESIZE, "too many graph inputs or outputs");
    struct ck_model_io *a = realloc(*v, (*n + 1) * sizeof *a);
    if (!a)
        return ck_error(CK_ENOMEM, "out of memory");
    *v = a;
    struct ck_model_io *io = &a[*n];
    memset(io, 0, sizeof *io);
    if (!(io->name = strdup(name)))
        return ck_error(CK_ENOMEM, "out of memory");
    io->dtype = dtype;
    io->rank = rank;
    if (rank)
        memcpy(io->dims, dims, (size_t)rank * sizeof *dims);
    (*n)++;
    return 0;
}

uint64_t ck_model_io_per_sample(const struct ck_model_io *io)
{
    uint64_t n = 1;
    for (int d = 1; d < io->rank; d++) {
        if (io->dims[d] < 0 || (io->dims[d] && n > UINT64_MAX / (uint64_t)io->dims[d]))
            return 0;
        n *= (uint64_t)io->dims[d];
    }
    return n;
}

const struct ck_tensor *ck_model_weight(const struct ck_model *m, const char *value)
{
    return m->weights ? ck_tensor_set_find(m->weights, value) : NULL;
}

/* Inputs each op takes: [min, max]; max 0 means any number. */
static void op_arity(enum ck_op op, const struct ck_op_params *p, size_t *lo, size_t *hi)
{
    *lo = 1;
    *hi = 1;
    switch (op) {
    case CK_OP_DENSE:
    case CK_OP_CONV2D:
    case CK_OP_CONV_TRANSPOSE2D:
        *lo = 2, *hi = 3;
        break;
    case CK_OP_ADD:
    case CK_OP_SUB:
    case CK_OP_MUL:
    case CK_OP_DIV:
    case CK_OP_POW:
        *lo = *hi = p->has_scalar ? 1 : 2;
        break;
    case CK_OP_MATMUL:
    case CK_OP_GATHER:
        *lo = *hi = 2;
        break;
    case CK_OP_CONCAT:
        *lo = 1, *hi = 0;
        break;
    case CK_OP_BATCHNORM:
        *lo = *hi = 5;
        break;
    case CK_OP_LAYERNORM:
        *lo = 1, *hi = 3;
        break;
    case CK_OP_MAX:
    case CK_OP_MIN:
    case CK_OP_PRELU:
    case CK_OP_FMOD:
    case CK_OP_GRID_SAMPLE:
    case CK_OP_EQUAL:
    case CK_OP_LESS:
    case CK_OP_GREATER:
    case CK_OP_LESS_EQUAL:
    case CK_OP_GREATER_EQUAL:
    case CK_OP_AND:
    case CK_OP_OR:
    case CK_OP_XOR:
    case CK_OP_GATHER_ELEMENTS:
        *lo = *hi = 2;
        break;
    case CK_OP_WHERE:
    case CK_OP_RANGE:
        *lo = *hi = 3;
        break;
    /* a computed shape, repeats or slice bounds as inputs (shape values) */
    case CK_OP_RESHAPE:
    case CK_OP_EXPAND:
    case CK_OP_TILE:
    case CK_OP_TRILU:
    case CK_OP_RESIZE:
        *lo = 1, *hi = 2;
        break;
    case CK_OP_SLICE:
        *lo = 1, *hi = 5;
        break;
    case CK_OP_INSTANCENORM:
        *lo = *hi = 3;
        break;
    case CK_OP_RNN:
    case CK_OP_GRU:
    case CK_OP_LSTM:
        *lo = 3, *hi = 7;
        break;
    default:
        break;
    }
}

/* The names defined so far are a ck_strset (names borrowed from the model),
 * so checking a graph of 100k nodes stays linear. */
static int check_nodes(const struct ck_model *m, struct ck_strset *ns);

int ck_model_check(const struct ck_model *m)
{
    struct ck_strset ns = CK_STRSET_INIT;
    int err = 0;
    if (m->ninputs == 0)
        return ck_error(CK_EFORMAT, "model has no graph input");
    if (m->noutputs == 0)
        return ck_error(CK_EFORMAT, "model has no graph output");
    for (size_t i = 0; m->weights && i < m->weights->ntensors && err == 0; i++)
        err = ck_strset_put(&ns, m->weights->tensors[i].name, 0, NULL);
    for (size_t i = 0; i < m->ninputs && err == 0; i++)
        err = ck_strset_put(&ns, m->inputs[i].name, 0, NULL);
    if (err == 0)
        err = check_nodes(m, &ns);
    ck_strset_release(&ns);
    return err;
}

static int check_nodes(const struct ck_model *m, struct ck_strset *ns)
{
    for (size_t i = 0; i < m->nnodes; i++) {
        const struct ck_model_node *n = &m->nodes[i];
        if (n->op <= CK_OP_INVALID || n->op >= CK_OP_COUNT)
            return ck_error(CK_EFORMAT, "node %zu '%s': no operation", i, n->name);
        size_t lo, hi;
        op_arity(n->op, &n->p, &lo, &hi);
        if (n->ninputs < lo || (hi && n->ninputs > hi)) {
            if (hi == lo)
                return ck_error(CK_EFORMAT, "node %zu '%s' (%s): %zu inputs, expected %zu", i,
                                n->name, ck_op_name(n->op), n->ninputs, lo);
            if (!hi)
                return ck_error(CK_EFORMAT, "node %zu '%s' (%s): %zu inputs, expected %zu or more",
                                i, n->name, ck_op_name(n->op), n->ninputs, lo);
            return ck_error(CK_EFORMAT, "node %zu '%s' (%s): %zu inputs, expected %zu to %zu", i,
                            n->name, ck_op_name(n->op), n->ninputs, lo, hi);
        }
        if (n->noutputs == 0)
            return ck_error(CK_EFORMAT, "node %zu '%s' (%s): no output", i, n->name,
                            ck_op_name(n->op));
        for (size_t k = 0; k < n->ninputs; k++)
            if (!ck_strset_get(ns, n->inputs[k], NULL))
                return ck_error(CK_EFORMAT,
                                "node %zu '%s' (%s): input '%s' is neither a weight, a graph "
                                "input nor the output of an earlier node",
                                i, n->name, ck_op_name(n->op), n->inputs[k]);
        for (size_t k = 0; k < n->noutputs; k++) {
            int err = ck_strset_put(ns, n->outputs[k], 0, NULL);
            if (err < 0)
                return err;
        }
    }
    for (size_t i = 0; i < m->noutputs; i++)
        if (!ck_strset_get(ns, m->outputs[i].name, NULL))
            return ck_error(CK_EFORMAT, "graph output '%s' is produced by no node",
                            m->outputs[i].name);
    return 0;
}

void ck_op_arity(enum ck_op op, const struct ck_op_params *p, size_t *lo, size_t *hi)
{
    op_arity(op, p, lo, hi);
}

bool ck_op_is_reduce(enum ck_op op)
{
    return op == CK_OP_REDUCE_MEAN || op == CK_OP_REDUCE_SUM ||
           (op >= CK_OP_REDUCE_MAX && op <= CK_OP_REDUCE_L2);
}

bool ck_op_is_multi_output(enum ck_op op)
{
    return op == CK_OP_SPLIT || op == CK_OP_RNN || op == CK_OP_GRU || op == CK_OP_LSTM ||
           op == CK_OP_TOPK;
}

bool ck_op_is_unary(enum ck_op op)
{
    switch (op) {
    case CK_OP_IDENTITY: case CK_OP_RELU: case CK_OP_LEAKY_RELU: case CK_OP_SIGMOID:
    case CK_OP_TANH: case CK_OP_GELU: case CK_OP_SQRT: case CK_OP_EXP: case CK_OP_LOG:
    case CK_OP_NEG: case CK_OP_ERF: case CK_OP_CLIP:
        return true;
    default:
        return op >= CK_OP_ABS && op <= CK_OP_SHRINK;
    }
}
