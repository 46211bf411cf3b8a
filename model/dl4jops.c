#include "model/dl4jops.h"

#include "common/error.h"
#include "common/utf8.h"

#include <math.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

#define NOIN                                                                                       \
    {                                                                                              \
        -1                                                                                         \
    }
#define SAME_ORDER                                                                                 \
    {                                                                                              \
        -1                                                                                         \
    }
/* conv2d / pooling iArgs, in DL4J's order (Conv2DConfig / Pooling2DConfig). */
#define K_S_P_D                                                                                    \
    {"kH", 'i', CK_DF_KH, 1}, {"kW", 'i', CK_DF_KW, 1}, {"sH", 'i', CK_DF_SH, 1},                  \
        {"sW", 'i', CK_DF_SW, 1}, {"pH", 'i', CK_DF_PH, 0}, {"pW", 'i', CK_DF_PW, 0},              \
        {"dH", 'i', CK_DF_DH, 1}, {"dW", 'i', CK_DF_DW, 1},                                        \
    {                                                                                              \
        "isSameMode", 'i', CK_DF_CONST, 0                                                          \
    }

/* clang-format off */
const struct ck_dl4j_op ck_dl4j_ops[] = {
    {CK_OP_IDENTITY, "identity", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_DENSE, "xw_plus_b", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {{"transposeW", 'b', CK_DF_TRANS_W, 0}, {"axis", 'i', CK_DF_AXIS, 1}}},
    {CK_OP_CONV2D, "conv2d", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {K_S_P_D, {"dataFormat", 'i', CK_DF_CONST, 0}, {"wFormat", 'i', CK_DF_CONST, 1}}},
    /* libnd4j depthwise_conv2d (nn/convo/depthwiseConv2d.cpp): iArgs kH, kW,
     * sH, sW, pH, pW, dH, dW, isSameMode, dataFormat (0 NCHW), wFormat (1:
     * weights [mC, iC, kH, kW]); output channel c mC + m (the helper's
     * [bS, iC, mC, oH, oW] view). kH, kW are written: 0 would make the op
     * take them from the weights' first two dims. */
    {CK_OP_CONV2D, "depthwise_conv2d", CK_DV_DEPTHWISE, false, SAME_ORDER, -1, -1,
     {K_S_P_D, {"dataFormat", 'i', CK_DF_CONST, 0}, {"wFormat", 'i', CK_DF_CONST, 1}}},
    {CK_OP_MAXPOOL, "maxpool2d", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {K_S_P_D, {"extraParam0", 'i', CK_DF_CONST, 0}, {"isNHWC", 'i', CK_DF_CONST, 0}}},
    {CK_OP_AVGPOOL, "avgpool2d", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {K_S_P_D, {"extraParam0", 'i', CK_DF_COUNT_PAD, 0}, {"isNHWC", 'i', CK_DF_CONST, 0}}},
    {CK_OP_GLOBAL_AVGPOOL, "global_avg_pool", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_GLOBAL_MAXPOOL, "global_max_pool", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_RELU, "relu", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {{"cutoff", 't', CK_DF_CONST, 0}}},
    {CK_OP_LEAKY_RELU, "leakyrelu", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {{"alpha", 't', CK_DF_ALPHA, 0.01}}},
    {CK_OP_SIGMOID, "sigmoid", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_TANH, "tanh", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_GELU, "precise_gelu", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_GELU, "gelu", CK_DV_APPROX, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_SOFTMAX, "softmax", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {{"dimension", 'i', CK_DF_AXIS, -1}}},
    {CK_OP_LOG_SOFTMAX, "log_softmax", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {{"dimension", 'i', CK_DF_AXIS, -1}}},
    {CK_OP_ADD, "add", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_ADD, "add_scalar", CK_DV_SCALAR, false, SAME_ORDER, -1, -1,
     {{"scalar", 't', CK_DF_SCALAR, 0}}},
    {CK_OP_SUB, "subtract", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_SUB, "sub_scalar", CK_DV_SCALAR, false, SAME_ORDER, -1, -1,
     {{"scalar", 't', CK_DF_SCALAR, 0}}},
    {CK_OP_SUB, "rsub_scalar", CK_DV_RSCALAR, false, SAME_ORDER, -1, -1,
     {{"scalar", 't', CK_DF_SCALAR, 0}}},
    {CK_OP_MUL, "multiply", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_MUL, "mul_scalar", CK_DV_SCALAR, false, SAME_ORDER, -1, -1,
     {{"scalar", 't', CK_DF_SCALAR, 0}}},
    {CK_OP_DIV, "divide", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_DIV, "div_scalar", CK_DV_SCALAR, false, SAME_ORDER, -1, -1,
     {{"scalar", 't', CK_DF_SCALAR, 0}}},
    {CK_OP_DIV, "rdiv_scalar", CK_DV_RSCALAR, false, SAME_ORDER, -1, -1,
     {{"scalar", 't', CK_DF_SCALAR, 0}}},
    {CK_OP_POW, "Pow", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_POW, "pow", CK_DV_SCALAR, false, SAME_ORDER, -1, -1,
     {{"pow", 't', CK_DF_SCALAR, 1}}},
    {CK_OP_MATMUL, "matmul", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {{"transX", 'i', CK_DF_CONST, 0},
      {"transY", 'i', CK_DF_CONST, 0},
      {"transZ", 'i', CK_DF_CONST, 0}}},
    {CK_OP_MATMUL, "mmul", CK_DV_PLAIN, true, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_TRANSPOSE, "permute", CK_DV_PLAIN, false, SAME_ORDER, 1, -1,
     {{"permuteDims", 'i', CK_DF_INTS, 0}}},
    {CK_OP_RESHAPE, "reshape", CK_DV_PLAIN, false, SAME_ORDER, 1, -1,
     {{"shape", 'i', CK_DF_INTS, 0}}},
    {CK_OP_FLATTEN, "flatten_2d", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {{"dimension", 'i', CK_DF_AXIS, 1}}},
    {CK_OP_SQUEEZE, "squeeze", CK_DV_PLAIN, false, SAME_ORDER, 1, -1,
     {{"axis", 'i', CK_DF_INTS, 0}}},
    {CK_OP_UNSQUEEZE, "expand_dims", CK_DV_PLAIN, false, SAME_ORDER, 1, -1,
     {{"axis", 'i', CK_DF_INTS, 0}}},
    {CK_OP_CONCAT, "concat", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {{"concatDimension", 'i', CK_DF_AXIS, 0}}},
    {CK_OP_SPLIT, "split_v", CK_DV_PLAIN, false, SAME_ORDER, 1, -1,
     {{"dimensions", 'i', CK_DF_AXIS, 0}, {"sizes", 'i', CK_DF_INTS, 0}}},
    /* libnd4j strided_slice: iArgs begin_mask, ellipsis_mask, end_mask,
     * new_axis_mask, shrink_axis_mask, then every begin, every end, every
     * stride (StridedSlice.java's addArguments and property names). */
    {CK_OP_SLICE, "strided_slice", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {{"beginMask", 'i', CK_DF_BEGIN_MASK, 0},
      {"ellipsisMask", 'i', CK_DF_ZERO, 0},
      {"endMask", 'i', CK_DF_END_MASK, 0},
      {"newAxisMask", 'i', CK_DF_ZERO, 0},
      {"shrinkAxisMask", 'i', CK_DF_ZERO, 0},
      {"begin", 'i', CK_DF_BEGINS, 0},
      {"end", 'i', CK_DF_ENDS, 0},
      {"strides", 'i', CK_DF_STRIDES, 0}}},
    /* DL4J's batchnorm takes (input, mean, variance, gamma, beta). */
    {CK_OP_BATCHNORM, "batchnorm", CK_DV_PLAIN, false, {0, 3, 4, 1, 2, -1}, -1, -1,
     {{"epsilon", 't', CK_DF_EPS, 1e-5},
      {"applyGamma", 'i', CK_DF_CONST, 1},
      {"applyBeta", 'i', CK_DF_CONST, 1},
      {"axis", 'i', CK_DF_AXIS, 1}}},
    {CK_OP_LAYERNORM, "layer_norm", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {{"epsilon", 't', CK_DF_EPS, 1e-5}, {"axis", 'i', CK_DF_AXIS, -1}}},
    {CK_OP_GATHER, "gather", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {{"dimensions", 'i', CK_DF_AXIS, 0}}},
    {CK_OP_REDUCE_MEAN, "reduce_mean", CK_DV_PLAIN, false, SAME_ORDER, 1, -1,
     {{"keepDims", 'b', CK_DF_KEEPDIMS, 0}, {"dimensions", 'i', CK_DF_INTS, 0}}},
    {CK_OP_REDUCE_SUM, "reduce_sum", CK_DV_PLAIN, false, SAME_ORDER, 1, -1,
     {{"keepDims", 'b', CK_DF_KEEPDIMS, 0}, {"dimensions", 'i', CK_DF_INTS, 0}}},
    {CK_OP_SQRT, "sqrt", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_EXP, "exp", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_LOG, "log", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_NEG, "neg", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_ERF, "erf", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_CLIP, "clipbyvalue", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {{"clipValueMin", 't', CK_DF_MIN, -INFINITY}, {"clipValueMax", 't', CK_DF_MAX, INFINITY}}},
    /* libnd4j pad (transforms/pad.cpp): (input, paddings [rank, 2] int32 or
     * int64[, value]), INT_ARG(0) the mode (0 constant), the value from
     * input 2 when given, else T_ARG(0). The writer gives the paddings as
     * input 1 (writers/sdlower.c); "paddings" as iArgs after the mode is
     * what ckptd wrote before, still read. */
    {CK_OP_PAD, "pad", CK_DV_PLAIN, false, SAME_ORDER, 1, 2,
     {{"mode", 'i', CK_DF_CONST, 0},
      {"padValue", 't', CK_DF_SCALAR, 0},
      {"paddings", 'i', CK_DF_INTS, 0}}},
    /* libnd4j tile (transforms/tile.cpp): the repeats as iArgs when there are
     * rank of them, else from input 1; nd4j's Tile keeps them in "jaxis". */
    {CK_OP_TILE, "tile", CK_DV_PLAIN, false, SAME_ORDER, 1, -1,
     {{"jaxis", 'i', CK_DF_INTS, 0}}},
    /* libnd4j Where (boolean/where.cpp), three inputs: x and y of one shape,
     * the condition of theirs; element e is y's where cond.e<bool>(e) is
     * false, else x's (numpy's where without broadcasting: the writer
     * broadcasts first, writers/sdlower.c). */
    {CK_OP_WHERE, "Where", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    /* Shape values (docs/model.md, docs/samediff.md "Shape values"): the
     * integers a dynamic export computes from its inputs' shapes, written
     * as libnd4j's own ops on int64 arrays (graph.fb declares them INT64).
     * shape_of (shape/shape.cpp, synonym "shape"): x's dims as an int64
     * vector; size (shape/size.cpp): x's length as a scalar. */
    {CK_OP_SHAPE, "shape_of", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_SHAPE, "shape", CK_DV_PLAIN, true, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_SIZE, "size", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    /* range (parity_ops/range.cpp): inputs start, limit, delta; with
     * integer inputs the output has input 0's dtype */
    {CK_OP_RANGE, "range", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    /* fill (parity_ops/fill.cpp): input 0 the shape, the value from input 1
     * when given (assigned: its dtype), else T_ARG(0); the writer gives
     * both (writers/sdlower.c) */
    {CK_OP_CONSTANT_OF_SHAPE, "fill", CK_DV_PLAIN, false, SAME_ORDER, -1, 1,
     {{"value", 't', CK_DF_SCALAR, 0}}},
    /* broadcast_to (shape/broadcast_to.cpp): (x, shape), each dim of x equal
     * to the shape's or 1; the writer gives it a shape that agrees (the
     * larger of x's dims and the canonical expand's, writers/sdlower.c) */
    {CK_OP_EXPAND, "broadcast_to", CK_DV_PLAIN, false, SAME_ORDER, 1, -1, {{0}}},
    /* cast (datatypes/cast.cpp): INT_ARG(0) the target DataType, graph.fb's
     * DType codes (5 FLOAT, 10 INT64, 1 BOOL, ...); the canonical cast's
     * ONNX code is translated both ways (CK_DF_CAST_TO) */
    {CK_OP_CAST, "cast", CK_DV_PLAIN, false, SAME_ORDER, -1, -1,
     {{"dtype", 'i', CK_DF_CAST_TO, 5}}},
    /* maximum, minimum (broadcastable/maximum.cpp, minimum.cpp) */
    {CK_OP_MAX, "maximum", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_MIN, "minimum", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    /* the comparisons (broadcastable/equals.cpp, less.cpp, greater.cpp,
     * less_equal.cpp, greater_equal.cpp): written only on shape values
     * (writers/sdlower.c refuses a comparison of tensor values) */
    {CK_OP_EQUAL, "equals", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_LESS, "less", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_GREATER, "greater", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_LESS_EQUAL, "less_equal", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_GREATER_EQUAL, "greater_equal", CK_DV_PLAIN, false, SAME_ORDER, -1, -1, {{0}}},
    {CK_OP_INVALID, NULL, CK_DV_PLAIN, false, NOIN, -1, -1, {{0}}},
};
/* clang-format on */

const struct ck_dl4j_op *ck_dl4j_by_name(const char *name)
{
    /* DL4J's names are case-sensitive where two ops differ only by case
     * (the pairwise "Pow" and the scalar "pow"): the exact spelling wins,
     * and only a name no row spells exactly is matched ignoring case. */
    for (const struct ck_dl4j_op *r = ck_dl4j_ops; name && r->name; r++)
        if (!strcmp(r->name, name))
            return r;
    for (const struct ck_dl4j_op *r = ck_dl4j_ops; name && r->name; r++)
        if (!strcasecmp(r->name, name))
            return r;
    return NULL;
}

static enum ck_dl4j_variant variant_of(const struct ck_op_params *p)
{
    if (p->has_scalar)
        return p->scalar_first ? CK_DV_RSCALAR : CK_DV_SCALAR;
    return p->approx_tanh ? CK_DV_APPROX : CK_DV_PLAIN;
}

/* Whether DL4J can say what p says for this op (symmetric pads, no groups, ...). */
static int expressible(const struct ck_model_node *n, const struct ck_dl4j_op *r)
{
    const struct ck_op_params *p = &n->p;
    const char *why = NULL;
    if (r->op == CK_OP_CONV2D || r->op == CK_OP_MAXPOOL || r->op == CK_OP_AVGPOOL) {
        if (p->pad[0] != p->pad[2] || p->pad[1] != p->pad[3])
            why = "asymmetric padding";
        else if (r->op == CK_OP_CONV2D && p->groups != 1)
            why = "grouped convolution";
        else if (p->ceil_mode)
            why = "ceil mode";
    }
    if (r->op == CK_OP_SHAPE && p->nints)
        why = "a start or end"; /* writers/sdlower.c slices shape_of's output */
    if (r->op == CK_OP_CAST && (p->nints != 1 || ck_dl4j_dtype_of_onnx(p->ints[0]) < 0))
        why = "a target type libnd4j has no DataType for";
    if (why)
        return ck_error(CK_EFORMAT, "node '%s': op '%s' with %s has no DL4J equivalent", n->name,
                        ck_op_name(n->op), why);
    return 0;
}

int ck_dl4j_for_node(const struct ck_model_node *n, const struct ck_dl4j_op **out)
{
    enum ck_dl4j_variant v = variant_of(&n->p);
    const struct ck_dl4j_op *plain = NULL, *exact = NULL;
    bool has_variants = false, any = false;
    for (const struct ck_dl4j_op *r = ck_dl4j_ops; r->name; r++) {
        if (r->op != n->op || r->read_only || r->variant == CK_DV_DEPTHWISE)
            continue;
        any = true;
        has_variants |= r->variant != CK_DV_PLAIN;
        if (r->variant == v && !exact)
            exact = r;
        if (r->variant == CK_DV_PLAIN && !plain)
            plain = r;
    }
    /* Flags that select no row of an op without variants are its own
     * parameters (pad's constant), not a different DL4J op. */
    *out = exact ? exact : has_variants ? NULL : plain;
    if (!*out)
        return ck_error(CK_EFORMAT, "node '%s': op '%s'%s has no DL4J equivalent", n->name,
                        ck_op_name(n->op), v == CK_DV_PLAIN || !any ? "" : " in this form");
    return expressible(n, *out);
}

/* ONNX and torch say "to the end of the axis" with any value past it
 * (INT64_MAX, INT64_MIN with a negative step); DL4J's kernel keeps begins
 * and ends in an int, so such a value is written as the axis' mask bit and
 * every other value clamped into int32 (no real axis is longer). */
#define SLICE_OPEN INT64_C(2147483647)

static bool slice_open(int64_t v, int64_t step, bool is_end)
{
    /* an end past the axis in the step's direction, or a start before it */
    bool forward = step > 0;
    if (is_end)
        return forward ? v >= SLICE_OPEN : v <= -SLICE_OPEN;
    return forward ? v <= -SLICE_OPEN : v >= SLICE_OPEN;
}

static int64_t slice_mask(const struct ck_op_params *p, bool is_end)
{
    int64_t mask = 0;
    for (size_t a = 0; a < p->nints / 3 && a < 62; a++)
        if (slice_open(p->ints[3 * a + (is_end ? 1 : 0)], p->ints[3 * a + 2], is_end))
            mask |= INT64_C(1) << a;
    return mask;
}

bool ck_dl4j_arg_is_list(const struct ck_dl4j_arg *a)
{
    return a->field == CK_DF_INTS || a->field == CK_DF_BEGINS || a->field == CK_DF_ENDS ||
           a->field == CK_DF_STRIDES;
}

int ck_dl4j_arg_list(const struct ck_dl4j_arg *a, const struct ck_op_params *p, int64_t *out,
                     size_t max, size_t *n)
{
    *n = 0;
    if (a->field == CK_DF_INTS) {
        if (p->nints > max)
            return ck_error(CK_EFORMAT, "%zu values for argument '%s'", p->nints, a->name);
        for (size_t i = 0; i < p->nints; i++)
            out[i] = p->ints[i];
        *n = p->nints;
        return 0;
    }
    int k = a->field == CK_DF_BEGINS ? 0 : a->field == CK_DF_ENDS ? 1 : 2;
    size_t axes = p->nints / 3;
    if (axes > max)
        return ck_error(CK_EFORMAT, "%zu values for argument '%s'", axes, a->name);
    for (size_t i = 0; i < axes; i++) {
        int64_t v = p->ints[3 * i + (size_t)k];
        if (k < 2 && slice_open(v, p->ints[3 * i + 2], k == 1))
            v = 0; /* the mask bit says it */
        out[i] = v > SLICE_OPEN ? SLICE_OPEN : v < -SLICE_OPEN ? -SLICE_OPEN : v;
    }
    *n = axes;
    return 0;
}

int ck_dl4j_slice_triples(int64_t begin_mask, int64_t end_mask, const int64_t *begins,
                          const int64_t *ends, const int64_t *strides, size_t n, int64_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int64_t s = strides[i];
        if (s == 0)
            return ck_error(CK_EFORMAT, "strided_slice: stride 0 on axis %zu", i);
        bool bm = i < 63 && (begin_mask >> i) & 1, em = i < 63 && (end_mask >> i) & 1;
        out[3 * i] = bm ? (s > 0 ? 0 : INT64_MAX) : begins[i];
        out[3 * i + 1] = em ? (s > 0 ? INT64_MAX : INT64_MIN) : ends[i];
        out[3 * i + 2] = s;
    }
    return 0;
}

double ck_dl4j_arg_get(const struct ck_dl4j_arg *a, const struct ck_op_params *p)
{
    switch (a->field) {
    case CK_DF_KH:
        return (double)p->kernel[0];
    case CK_DF_KW:
        return (double)p->kernel[1];
    case CK_DF_SH:
        return (double)p->stride[0];
    case CK_DF_SW:
        return (double)p->stride[1];
    case CK_DF_PH:
        return (double)p->pad[0];
    case CK_DF_PW:
        return (double)p->pad[1];
    case CK_DF_DH:
        return (double)p->dilation[0];
    case CK_DF_DW:
        return (double)p->dilation[1];
    case CK_DF_AXIS:
        return p->axis == CK_AXIS_DEFAULT ? a->def : (double)p->axis;
    case CK_DF_TRANS_W:
        return p->trans_w;
    case CK_DF_COUNT_PAD:
        return p->count_include_pad;
    case CK_DF_KEEPDIMS:
        return p->keepdims;
    case CK_DF_SCALAR:
        return p->scalar;
    case CK_DF_ALPHA:
        return p->alpha;
    case CK_DF_EPS:
        return p->eps;
    case CK_DF_MIN:
        return p->min;
    case CK_DF_MAX:
        return p->max;
    case CK_DF_CAST_TO:
        return p->nints == 1 ? (double)ck_dl4j_dtype_of_onnx(p->ints[0]) : a->def;
    case CK_DF_BEGIN_MASK:
        return (double)slice_mask(p, false);
    case CK_DF_END_MASK:
        return (double)slice_mask(p, true);
    case CK_DF_CONST:
    case CK_DF_INTS:
    default:
        return a->def;
    }
}

bool ck_dl4j_arg_is_int(const struct ck_dl4j_arg *a)
{
    switch (a->field) {
    case CK_DF_KH:
    case CK_DF_KW:
    case CK_DF_SH:
    case CK_DF_SW:
    case CK_DF_PH:
    case CK_DF_PW:
    case CK_DF_DH:
    case CK_DF_DW:
    case CK_DF_AXIS:
    case CK_DF_INTS:
    case CK_DF_BEGIN_MASK:
    case CK_DF_END_MASK:
    case CK_DF_ZERO:
    case CK_DF_BEGINS:
    case CK_DF_ENDS:
    case CK_DF_STRIDES:
    case CK_DF_CAST_TO:
        return true;
    default:
        return false;
    }
}

void ck_dl4j_arg_set(const struct ck_dl4j_arg *a, struct ck_op_params *p, int64_t i, double v)
{
    switch (a->field) {
    case CK_DF_KH:
        p->kernel[0] = i;
        break;
    case CK_DF_KW:
        p->kernel[1] = i;
        break;
    case CK_DF_SH:
        p->stride[0] = i;
        break;
    case CK_DF_SW:
        p->stride[1] = i;
        break;
    case CK_DF_PH:
        p->pad[0] = p->pad[2] = i;
        break;
    case CK_DF_PW:
        p->pad[1] = p->pad[3] = i;
        break;
    case CK_DF_DH:
        p->dilation[0] = i;
        break;
    case CK_DF_DW:
        p->dilation[1] = i;
        break;
    case CK_DF_AXIS:
        p->axis = i;
        break;
    case CK_DF_TRANS_W:
        p->trans_w = v != 0;
        break;
    case CK_DF_COUNT_PAD:
        p->count_include_pad = v != 0;
        break;
    case CK_DF_KEEPDIMS:
        p->keepdims = v != 0;
        break;
    case CK_DF_SCALAR:
        p->scalar = (float)v;
        break;
    case CK_DF_ALPHA:
        p->alpha = (float)v;
        break;
    case CK_DF_EPS:
        p->eps = (float)v;
        break;
    case CK_DF_MIN:
        p->min = (float)v;
        break;
    case CK_DF_MAX:
        p->max = (float)v;
        break;
    case CK_DF_CONST:
    case CK_DF_INTS:
    default:
        break;
    }
}

/* ONNX's TensorProto codes and libnd4j's DataType (graph.fb's DType, the
 * codes writers/sdarray.c writes arrays with) of each type both know. */
static const struct {
    int8_t onnx, dl4j;
} cast_codes[] = {
    {1, 5},   /* float32: FLOAT */
    {10, 3},  /* float16: HALF */
    {16, 17}, /* bfloat16: BFLOAT16 */
    {11, 6},  /* float64: DOUBLE */
    {3, 7},   /* int8 */
    {5, 8},   /* int16 */
    {6, 9},   /* int32 */
    {7, 10},  /* int64: INT64 (nd4j's LONG) */
    {2, 11},  /* uint8 */
    {4, 12},  /* uint16 */
    {12, 13}, /* uint32 */
    {13, 14}, /* uint64 */
    {9, 1},   /* bool: BOOL */
};

int64_t ck_dl4j_dtype_of_onnx(int64_t onnx)
{
    for (size_t i = 0; i < sizeof cast_codes / sizeof cast_codes[0]; i++)
        if (cast_codes[i].onnx == onnx)
            return cast_codes[i].dl4j;
    return -1;
}

int64_t ck_dl4j_onnx_of_dtype(int64_t dl4j)
{
    for (size_t i = 0; i < sizeof cast_codes / sizeof cast_codes[0]; i++)
        if (cast_codes[i].dl4j == dl4j)
            return cast_codes[i].onnx;
    return -1;
}

void ck_dl4j_apply_variant(const struct ck_dl4j_op *row, struct ck_op_params *p)
{
    p->has_scalar = row->variant == CK_DV_SCALAR || row->variant == CK_DV_RSCALAR ||
                    row->op == CK_OP_PAD || row->op == CK_OP_CONSTANT_OF_SHAPE;
    p->scalar_first = row->variant == CK_DV_RSCALAR;
    p->approx_tanh = row->variant == CK_DV_APPROX;
}

int ck_dl4j_input(const struct ck_dl4j_op *row, int k, int ncanonical)
{
    if (k < 0 || k >= CK_DL4J_MAX_INPUTS)
        return -1;
    if (row->inputs[0] < 0)
        return k < ncanonical ? k : -1;
    for (int i = 0; i <= k; i++)
        if (row->inputs[i] < 0)
            return -1;
    return row->inputs[k] < ncanonical ? row->inputs[k] : -1;
}

static bool tag_char_bad(unsigned char c)
{
    return c <= 0x20 || c == 0x7f || strchr("/\\:*?\"<>|", c) != NULL;
}

bool ck_sd_tag_is_valid(const char *tag)
{
    size_t n = tag ? strlen(tag) : 0;
    if (n == 0 || n > CK_SD_TAG_MAX || !ck_utf8_is_valid(tag, n))
        return false;
    if (!strcmp(tag, ".") || !strcmp(tag, "..") || !strcasecmp(tag, "tags.txt"))
        return false;
    if (tag[0] == ' ' || tag[0] == '.' || tag[n - 1] == ' ' || tag[n - 1] == '.')
        return false;
    for (size_t i = 0; i < n; i++)
        if (tag_char_bad((unsigned char)tag[i]))
            return false;
    return true;
}

bool ck_sd_tag_from(const char *text, char *out, size_t outsz)
{
    size_t o = 0, n = text ? strlen(text) : 0;
    if (outsz < 2)
        return false;
    for (size_t i = 0; i < n && o + 4 < outsz && o < CK_SD_TAG_MAX - 3;) {
        size_t cl = ck_utf8_char_len(text + i, n - i);
        if (cl == 0 || (cl == 1 && tag_char_bad((unsigned char)text[i]))) {
            out[o++] = '_';
            i += cl ? cl : 1;
        } else {
            memcpy(out + o, text + i, cl);
            o += cl;
            i += cl;
        }
    }
    out[o] = 0;
    /* Trim leading and trailing spaces and dots. */
    size_t a = 0;
    while (out[a] == ' ' || out[a] == '.')
        a++;
    memmove(out, out + a, o - a + 1);
    o -= a;
    while (o && (out[o - 1] == ' ' || out[o - 1] == '.'))
        out[--o] = 0;
    return ck_sd_tag_is_valid(out);
}
