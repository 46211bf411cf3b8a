/* One table from op to kernel family, and the scratch each needs. */
#include "infer/internal.h"
#include "common/error.h"

int64_t ck_infer_scratch_floats(const struct ck_model_node *n, const struct ck_ishape *ins,
                                const struct ck_ishape *outs)
{
    switch (n->op) {
    case CK_OP_CONV2D:
        return ck_infer_conv_scratch_floats(n, ins, outs);
    case CK_OP_DET: { /* one matrix in double */
        int64_t m = ins[0].d[ins[0].rank - 1];
        return 2 * m * m;
    }
    case CK_OP_TOPK: { /* two uint32 indices per element of the axis */
        int a = ck_infer_norm_axis(ck_op_axis(&n->p, -1), ins[0].rank);
        return a < 0 ? 0 : 2 * ins[0].d[a];
    }
    case CK_OP_RNN: case CK_OP_GRU: case CK_OP_LSTM: /* h, c, new h, pad; 4 H doubles */
        return n->p.nints == 5 ? 3 * n->p.ints[1] + 1 + 8 * n->p.ints[1] : 0;
    default:
        if (ck_op_is_reduce(n->op))
            return 2 * ck_ishape_numel(&outs[0]); /* double accumulators */
        return 0;
    }
}

/* The engine's op table: the kernel family of op, or NULL when the engine
 * does not run it (ck_infer_check asks the same table before a run). */
static int (*kernel_of(enum ck_op op))(const struct ck_kcall *)
{
    switch (op) {
    case CK_OP_IDENTITY: case CK_OP_RELU: case CK_OP_LEAKY_RELU: case CK_OP_SIGMOID:
    case CK_OP_TANH: case CK_OP_GELU: case CK_OP_SQRT: case CK_OP_EXP: case CK_OP_LOG:
    case CK_OP_NEG: case CK_OP_ERF: case CK_OP_CLIP:
        return ck_infer_k_elementwise;
    case CK_OP_ADD: case CK_OP_SUB: case CK_OP_MUL: case CK_OP_DIV: case CK_OP_POW:
    case CK_OP_MAX: case CK_OP_MIN: case CK_OP_PRELU: case CK_OP_FMOD:
        return ck_infer_k_binary;
    case CK_OP_DENSE: case CK_OP_MATMUL: case CK_OP_CONV2D:
        return ck_infer_k_linear;
    case CK_OP_CONV_TRANSPOSE2D:
        return ck_infer_k_conv_transpose;
    case CK_OP_RNN: case CK_OP_GRU: case CK_OP_LSTM:
        return ck_infer_k_rnn;
    case CK_OP_GRID_SAMPLE:
        return ck_infer_k_grid_sample;
    case CK_OP_MAXPOOL: case CK_OP_AVGPOOL: case CK_OP_GLOBAL_AVGPOOL: case CK_OP_GLOBAL_MAXPOOL:
        return ck_infer_k_pool;
    case CK_OP_SOFTMAX: case CK_OP_LOG_SOFTMAX: case CK_OP_BATCHNORM: case CK_OP_LAYERNORM:
    case CK_OP_HARDMAX: case CK_OP_INSTANCENORM: case CK_OP_LRN: case CK_OP_DET:
        return ck_infer_k_norm;
    case CK_OP_TRANSPOSE: case CK_OP_RESHAPE: case CK_OP_FLATTEN: case CK_OP_SQUEEZE:
    case CK_OP_UNSQUEEZE: case CK_OP_CONCAT: case CK_OP_SPLIT: case CK_OP_SLICE:
    case CK_OP_GATHER: case CK_OP_PAD:
        return ck_infer_k_layout;
    case CK_OP_TOPK:
        return ck_infer_k_topk;
    case CK_OP_CAST:
        return ck_infer_k_cast;
    case CK_OP_SHAPE: case CK_OP_SIZE: case CK_OP_CONSTANT_OF_SHAPE: case CK_OP_RANGE:
        return ck_infer_k_shapeval; /* evaluated by the plan: an error if one runs */
    default:
        if (op >= CK_OP_WHERE && op <= CK_OP_RESIZE)
            return ck_infer_k_select;
        if (ck_op_is_reduce(op))
            return ck_infer_k_reduce;
        if (op >= CK_OP_ABS && op <= CK_OP_SHRINK)
            return ck_infer_k_math;
        return NULL;
    }
}

bool ck_infer_op_is_supported(enum ck_op op)
{
    return kernel_of(op) != NULL;
}

int ck_infer_kernel(const struct ck_kcall *k)
{
    int (*kernel)(const struct ck_kcall *) = kernel_of(k->n->op);
    if (!kernel)
        return ck_error(CK_EFORMAT, "node '%s': op '%s' is not supported by the inference engine",
                        k->n->name, ck_op_name(k->n->op));
    if (k->indt && k->outdt && ck_infer_int_node(k->n, k->indt, k->nin, k->outdt[0]))
        return ck_infer_k_int(k);
    if (k->n->op == CK_OP_FMOD && k->n->p.nints && k->n->p.ints[0] == 0)
        return ck_error(CK_EFORMAT, "node '%s' (fmod): the integer modulo (the sign of the divisor) "
                        "takes integers", k->n->name);
    return kernel(k);
}
