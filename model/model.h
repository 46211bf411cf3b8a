/* The model every deployment stage consumes: a checkpoint's tensors plus its
 * network as a graph in one canonical operation vocabulary. The mldef and
 * SameDiff writers and the inference engine (infer/) read only this; each
 * source format maps its own op names into it in one table (readers/), and
 * weight-only checkpoints get their graph from a layer list (model/layers.h).
 * docs/model.md is the reference for every op, its inputs and parameters.
 *
 * Layout conventions (the engine and the writers rely on them):
 * - activations are float32, C order; images are NCHW;
 * - a value is named by a string: a weight (a tensor of model->weights), a
 *   graph input, or the output of an earlier node. Nodes are kept in an
 *   order where every input is defined before use (ck_model_check).
 *
 * Ownership: a ck_model owns its weights set, its nodes, their names and
 * parameter arrays, and its input/output descriptions. */
#ifndef CK_MODEL_H
#define CK_MODEL_H

#include "model/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The canonical vocabulary. Inputs are listed as (x, W, b): optional inputs
 * may be absent (ninputs smaller). See docs/model.md for the exact semantics. */
enum ck_op {
    CK_OP_INVALID = 0,
    CK_OP_IDENTITY,    /* (x); dropout at inference maps here */
    CK_OP_DENSE,       /* (x, W[, b]); x flattened to [prod(dims[0:axis]), rest]; W is
                          [in, out] (NNabla Affine, Keras) or, with p.trans_w, [out, in]
                          (torch Linear, ONNX Gemm transB=1); y = x W + b; the output
                          keeps dims[0:axis] and appends W's out dims (p.axis default 1) */
    CK_OP_CONV2D,      /* (x NCHW, W[out, in/groups, kh, kw][, b[out]]); p.stride,
                          p.pad (top, left, bottom, right), p.dilation, p.groups */
    CK_OP_MAXPOOL,     /* (x NCHW); p.kernel, p.stride, p.pad, p.ceil_mode */
    CK_OP_AVGPOOL,     /* (x NCHW); as maxpool, p.count_include_pad */
    CK_OP_GLOBAL_AVGPOOL, /* (x NCHW) -> [N, C, 1, 1] */
    CK_OP_GLOBAL_MAXPOOL, /* (x NCHW) -> [N, C, 1, 1] */
    CK_OP_RELU,
    CK_OP_LEAKY_RELU,  /* p.alpha: the slope below zero */
    CK_OP_SIGMOID,
    CK_OP_TANH,
    CK_OP_GELU,        /* erf form; p.approx_tanh for the tanh approximation */
    CK_OP_SOFTMAX,     /* p.axis (negative counts from the end; default -1) */
    CK_OP_LOG_SOFTMAX, /* p.axis (default -1) */
    CK_OP_ADD,         /* (a, b) numpy broadcasting, or (a) with p.has_scalar: a op p.scalar */
    CK_OP_SUB,         /* with p.scalar_first: p.scalar - a */
    CK_OP_MUL,
    CK_OP_DIV,         /* with p.scalar_first: p.scalar / a */
    CK_OP_POW,         /* (a, b) or (a) with p.scalar as the exponent */
    CK_OP_MATMUL,      /* (a, b) numpy matmul semantics: batched, batch dims broadcast */
    CK_OP_TRANSPOSE,   /* (x); p.ints = the permutation */
    CK_OP_RESHAPE,     /* (x); p.ints = the new shape: 0 copies the input dim, -1 infers one */
    CK_OP_FLATTEN,     /* (x); [prod(dims[0:axis]), prod(dims[axis:])], p.axis default 1 */
    CK_OP_SQUEEZE,     /* (x); p.ints = the axes (all size-1 axes when empty) */
    CK_OP_UNSQUEEZE,   /* (x); p.ints = the axes of the output */
    CK_OP_CONCAT,      /* (x0, x1, ...); p.axis (default 0) */
    CK_OP_SPLIT,       /* (x) -> noutputs; p.axis, p.ints = sizes (equal parts when empty) */
    CK_OP_SLICE,       /* (x); p.ints = [start0, end0, step0, start1, ...] per axis from 0;
                          ends clamp like numpy */
    CK_OP_BATCHNORM,   /* (x, gamma, beta, mean, var); p.eps; channels on p.axis (default 1) */
    CK_OP_LAYERNORM,   /* (x[, gamma[, beta]]); normalised over dims[p.axis:] (default -1); p.eps */
    CK_OP_GATHER,      /* (table, indices); p.axis (default 0); indices as float values */
    CK_OP_REDUCE_MEAN, /* (x); p.ints = axes (all when empty); p.keepdims */
    CK_OP_REDUCE_SUM,  /* (x); as reduce_mean */
    CK_OP_SQRT,
    CK_OP_EXP,
    CK_OP_LOG,
    CK_OP_NEG,
    CK_OP_ERF,
    CK_OP_CLIP,        /* (x); p.min, p.max (relu6 maps here) */
    CK_OP_PAD,         /* (x); p.ints = [before0, after0, before1, after1, ...]; constant p.scalar */
    /* reductions: (x); p.ints = axes (all when empty); p.keepdims (as reduce_mean) */
    CK_OP_REDUCE_MAX,
    CK_OP_REDUCE_MIN,
    CK_OP_REDUCE_PROD,
    CK_OP_REDUCE_SUM_SQUARE, /* sum of x^2 */
    CK_OP_REDUCE_LOG_SUM,    /* log(sum x) */
    CK_OP_REDUCE_LOG_SUM_EXP, /* log(sum exp x), computed as max + log(sum exp(x - max)) */
    CK_OP_REDUCE_L1,         /* sum |x| */
    CK_OP_REDUCE_L2,         /* sqrt(sum x^2) */
    /* element-wise unary math: (x) */
    CK_OP_ABS,
    CK_OP_CEIL,
    CK_OP_FLOOR,
    CK_OP_ROUND,       /* half to even, as numpy and ONNX */
    CK_OP_SIGN,
    CK_OP_RECIPROCAL,
    CK_OP_SIN,
    CK_OP_COS,
    CK_OP_TAN,
    CK_OP_ASIN,
    CK_OP_ACOS,
    CK_OP_ATAN,
    CK_OP_SINH,
    CK_OP_COSH,
    CK_OP_ASINH,
    CK_OP_ACOSH,
    CK_OP_ATANH,
    CK_OP_SOFTPLUS,    /* log(1 + exp x) */
    CK_OP_SOFTSIGN,    /* x / (1 + |x|) */
    CK_OP_MISH,        /* x tanh(softplus x) */
    CK_OP_HARD_SWISH,  /* x max(0, min(1, x / 6 + 1/2)) */
    CK_OP_ELU,         /* p.alpha: x if x > 0 else alpha (e^x - 1) */
    CK_OP_CELU,        /* p.alpha: max(0, x) + min(0, alpha (e^(x/alpha) - 1)) */
    CK_OP_SELU,        /* p.alpha, p.beta (gamma): beta (x if x > 0 else alpha (e^x - 1)) */
    CK_OP_HARD_SIGMOID, /* p.alpha, p.beta: max(0, min(1, alpha x + beta)) */
    CK_OP_THRESHOLDED_RELU, /* p.alpha: x if x > alpha else 0 */
    CK_OP_SHRINK,      /* p.alpha (lambd), p.beta (bias): x + beta if x < -alpha, x - beta if
                          x > alpha, else 0 */
    /* element-wise binary, numpy broadcasting: (a, b) */
    CK_OP_MAX,         /* max(a, b); NaN if either is NaN */
    CK_OP_MIN,
    CK_OP_PRELU,       /* (x, slope): x if x >= 0 else slope x */
    CK_OP_FMOD,        /* C's fmod(a, b): the remainder with the sign of a */
    CK_OP_HARDMAX,     /* (x); p.axis (default -1): 1 at the first largest along the axis, else 0 */
    CK_OP_INSTANCENORM, /* (x, scale, bias); x [N, C, ...] normalised over dims[2:] per (n, c); p.eps */
    CK_OP_CONV_TRANSPOSE2D, /* (x NCHW, W[C, O/groups, kh, kw][, b[O]]); p.stride, p.pad,
                               p.dilation, p.groups; p.ints = output padding [h, w] */
    /* ONNX's recurrent layers, one op each (docs/model.md): (X, W, R, then the
     * optional inputs present: B, initial_h, initial_c, P) -> (Y, Y_h[, Y_c]);
     * p.ints = [direction, hidden, present mask, layout, linear_before_reset] */
    CK_OP_RNN,
    CK_OP_GRU,
    CK_OP_LSTM,
    CK_OP_GRID_SAMPLE, /* (x NCHW, grid [N, Ho, Wo, 2]) -> [N, C, Ho, Wo]; p.ints = [mode, padding,
                          align_corners] (docs/model.md) */
    CK_OP_LRN,         /* (x [N, C, ...]); p.alpha, p.beta, p.scalar (bias), p.ints = [size]:
                          x / (bias + alpha / size * sum of x^2 over nearby channels)^beta */
    CK_OP_DET,         /* (x [..., M, M]) -> [...]: determinants */
    /* masks and selection (a mask is float32 1 or 0); numpy broadcasting */
    CK_OP_WHERE,       /* (cond, a, b): a where cond != 0, else b */
    CK_OP_EQUAL,       /* (a, b) -> 1 where a == b, else 0 (NaN compares false) */
    CK_OP_LESS,
    CK_OP_GREATER,
    CK_OP_LESS_EQUAL,
    CK_OP_GREATER_EQUAL,
    CK_OP_NOT,         /* (x) -> 1 where x == 0, else 0 */
    CK_OP_AND,         /* (a, b) on a != 0 and b != 0 -> 1 or 0 */
    CK_OP_OR,
    CK_OP_XOR,
    CK_OP_EXPAND,      /* (x); p.ints = a shape: x broadcast with it (ONNX Expand) */
    CK_OP_TILE,        /* (x); p.ints = repeats per axis */
    CK_OP_TRILU,       /* (x [..., N, M]); p.ints = [upper, k]: keeps j - i >= k (upper) or
                          j - i <= k (lower), zeros elsewhere */
    CK_OP_CUMSUM,      /* (x); p.ints = [axis, exclusive, reverse]: running sums */
    CK_OP_ARGMAX,      /* (x); p.axis (default 0), p.keepdims, p.ints = [select_last]: the
                          index of the largest along the axis (the first NaN wins), as a float */
    CK_OP_ARGMIN,
    CK_OP_GATHER_ELEMENTS, /* (data, indices of data's rank); p.axis (default 0): y[i] = data[i
                              with the axis' index replaced by indices[i]] */
    CK_OP_RESIZE,      /* (x); p.alpha (cubic's A), p.ints = [mode, coordinates, nearest mode,
                          exclude_outside, then per axis: size, scale's float32 bits (0: the
                          size over the input's)] (docs/model.md, ONNX Resize) */
    CK_OP_TOPK,        /* (x) -> (values, indices); p.axis (default -1), p.ints = [k, largest,
                          sorted]: the k largest (smallest) along the axis, ties to the lower
                          index, indices as float32 whole numbers (docs/model.md) */
    CK_OP_CAST,        /* (x); p.ints = [ONNX's TensorProto code of the dtype to cast to]
                          (ck_op_cast_dtype): rounding and range rules in docs/model.md */
    /* shape values (docs/model.md "Shape values"): integers the engine computes
     * once the run's input shapes are known, before any kernel runs */
    CK_OP_SHAPE,       /* (x) -> [rank] the dims of x; p.ints = [start, end] (optional, numpy
                          slice of the dims) */
    CK_OP_SIZE,        /* (x) -> [] the element count of x */
    CK_OP_CONSTANT_OF_SHAPE, /* (shape) -> that shape filled with p.scalar; p.ints = [integer] */
    CK_OP_RANGE,       /* (start, limit, delta) integers -> start + i delta */
    CK_OP_COUNT
};

/* The dtype of ONNX's TensorProto code (cast's parameter: 1 float32, 10
 * float16, 16 bfloat16, 11 float64, 3/5/6/7 int8/16/32/64, 2/4/12/13
 * uint8/16/32/64, 9 bool); CK_DT_INVALID for any other code. */
enum ck_dtype ck_op_cast_dtype(int64_t code);
/* The integer dtypes (bool is not one). */
bool ck_dtype_is_int(enum ck_dtype t);

/* "dense", "conv2d", ... as docs/model.md and layer lists spell them. */
const char *ck_op_name(enum ck_op op);
/* CK_OP_INVALID for an unknown name. */
enum ck_op ck_op_from_name(const char *name);

#define CK_MODEL_MAX_INTS 64
/* The most elements one value of a model may have (2^40 floats = 4 TiB:
 * beyond any real model, small enough that no size computation overflows);
 * the engine (CK_INFER_NUMEL_MAX) and the mldef validator use the same. */
#define CK_MODEL_NUMEL_MAX (INT64_C(1) << 40)

/* Every op's parameters in one struct: each op reads the fields its line in
 * the enum names and ignores the rest. ck_op_params_init sets the defaults. */
struct ck_op_params {
    int64_t kernel[2];   /* kh, kw */
    int64_t stride[2];   /* default 1, 1 */
    int64_t dilation[2]; /* default 1, 1 */
    int64_t pad[4];      /* top, left, bottom, right */
    int64_t groups;      /* default 1 */
    int64_t axis;        /* default per op (see the enum); CK_AXIS_DEFAULT when unset */
    bool trans_w;        /* dense: W is [out, in] */
    bool ceil_mode;
    bool count_include_pad;
    bool keepdims;
    bool approx_tanh;
    bool has_scalar;     /* add/sub/mul/div/pow/pad: the second operand is p.scalar */
    bool scalar_first;
    float scalar;
    float alpha;         /* leaky relu, default 0.01; elu, celu, selu, hard_sigmoid, thresholded_relu */
    float beta;          /* selu's gamma, hard_sigmoid's beta (default 0) */
    float eps;           /* batchnorm, layernorm: default 1e-5 */
    float min, max;      /* clip: default -inf, +inf */
    int64_t *ints;       /* owned: shape, perm, axes, sizes, slice triples, pads */
    size_t nints;
};

#define CK_AXIS_DEFAULT INT64_MIN

void ck_op_params_init(struct ck_op_params *p);
/* The axis to use: p->axis, or def when it was left unset. */
int64_t ck_op_axis(const struct ck_op_params *p, int64_t def);

struct ck_model_node {
    char *name;                      /* owned: the source's node name (for errors) */
    enum ck_op op;
    char **inputs;  size_t ninputs;  /* owned value names */
    char **outputs; size_t noutputs; /* owned value names */
    struct ck_op_params p;
};

/* A graph input or output. dims[0] == -1 stands for "any batch size". */
struct ck_model_io {
    char *name; /* owned */
    enum ck_dtype dtype;
    int rank;
    int64_t dims[CK_TENSOR_MAX_RANK];
};

struct ck_model {
    char *name;                        /* owned or NULL */
    const char *source;                /* static: "nnp", "samediff", "onnx", "layers", ... */
    struct ck_tensor_set *weights;     /* owned */
    struct ck_model_node *nodes; size_t nnodes, nodes_cap;
    struct ck_model_io *inputs;  size_t ninputs;
    struct ck_model_io *outputs; size_t noutputs;
};

/* A new empty model that takes ownership of weights (freed with the model,
 * also when this fails). */
int ck_model_new(struct ck_tensor_set *weights, const char *source, struct ck_model **out);
void ck_model_free(struct ck_model *m);
/* Appends a node (name copied, params defaulted); *out valid until the next add. */
int ck_model_add_node(struct ck_model *m, const char *name, enum ck_op op,
                      struct ck_model_node **out);
int ck_model_node_add_input(struct ck_model_node *n, const char *value);
int ck_model_node_add_output(struct ck_model_node *n, const char *value);
int ck_model_node_set_ints(struct ck_model_node *n, const int64_t *v, size_t count);
/* Declares a graph input or output (dims copied; rank <= CK_TENSOR_MAX_RANK). */
int ck_model_add_io(struct ck_model *m, bool output, const char *name, enum ck_dtype dtype,
                    int rank, const int64_t *dims);
/* The weight named value, or NULL when value is not a weight. */
const struct ck_tensor *ck_model_weight(const struct ck_model *m, const char *value);
/* Values of one sample of io: the product of its dims past the first (the
 * batch); 1 for rank 0 and 1; 0 when one of them is unknown (-1) or the
 * product overflows. */
uint64_t ck_model_io_per_sample(const struct ck_model_io *io);

/* The number of inputs op takes with these parameters: [*lo, *hi]; *hi == 0
 * means any number. (For checkers of other forms of the graph: mldef.) */
void ck_op_arity(enum ck_op op, const struct ck_op_params *p, size_t *lo, size_t *hi);
/* The reductions (reduce_mean ... reduce_l2): p.ints axes, p.keepdims. */
bool ck_op_is_reduce(enum ck_op op);
/* The one-input element-wise ops: the output has the input's shape. */
bool ck_op_is_unary(enum ck_op op);
/* Ops with more than one output: split, rnn, gru, lstm, topk. */
bool ck_op_is_multi_output(enum ck_op op);

/* Structural checks: every node input is a weight, a graph input or an
 * earlier node's output; every graph output is produced; the op's input
 * count fits. CK_EFORMAT naming the node (and its index) otherwise. */
int ck_model_check(const struct ck_model *m);

#endif
