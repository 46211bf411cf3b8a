/* Element-wise unary math beyond the activations of kernels_elementwise.c:
 * rounding, sign, reciprocal, the trigonometric and hyperbolic functions and
 * the parametric activations of ONNX (elu, celu, selu, hard_sigmoid,
 * thresholded_relu, shrink, softplus, softsign, mish, hard_swish). Each value is
 * computed in double and rounded once to float32, so the result is the
 * float32 nearest the exact one (numpy's float32 functions are within an ulp
 * or two of it). docs/model.md gives each formula. */
#include "infer/internal.h"
#include "common/error.h"

#include <math.h>

static double softplus(double x)
{
    return x > 30 ? x + log1p(exp(-x)) : log1p(exp(x));
}

static double sign(double x)
{
    return x > 0 ? 1.0 : x < 0 ? -1.0 : x; /* 0 and NaN stay */
}

static double one(enum ck_op op, const struct ck_op_params *p, double x)
{
    switch (op) {
    case CK_OP_ABS: return fabs(x);
    case CK_OP_CEIL: return ceil(x);
    case CK_OP_FLOOR: return floor(x);
    case CK_OP_ROUND: return nearbyint(x); /* the default mode: half to even */
    case CK_OP_SIGN: return sign(x);
    case CK_OP_RECIPROCAL: return 1.0 / x;
    case CK_OP_SIN: return sin(x);
    case CK_OP_COS: return cos(x);
    case CK_OP_TAN: return tan(x);
    case CK_OP_ASIN: return asin(x);
    case CK_OP_ACOS: return acos(x);
    case CK_OP_ATAN: return atan(x);
    case CK_OP_SINH: return sinh(x);
    case CK_OP_COSH: return cosh(x);
    case CK_OP_ASINH: return asinh(x);
    case CK_OP_ACOSH: return acosh(x);
    case CK_OP_ATANH: return atanh(x);
    case CK_OP_SOFTPLUS: return softplus(x);
    case CK_OP_SOFTSIGN: return x / (1.0 + fabs(x));
    case CK_OP_MISH: return x * tanh(softplus(x));
    case CK_OP_HARD_SWISH: return x * fmax(0.0, fmin(1.0, x / 6.0 + 0.5));
    case CK_OP_ELU: return x > 0 ? x : p->alpha * expm1(x);
    case CK_OP_CELU: return fmax(0.0, x) + fmin(0.0, p->alpha * expm1(x / p->alpha));
    case CK_OP_SELU: return p->beta * (x > 0 ? x : p->alpha * expm1(x));
    case CK_OP_HARD_SIGMOID: return fmax(0.0, fmin(1.0, p->alpha * x + p->beta));
    case CK_OP_THRESHOLDED_RELU: return x > p->alpha ? x : 0.0;
    case CK_OP_SHRINK: return x < -p->alpha ? x + p->beta : x > p->alpha ? x - p->beta : 0.0;
    default: return NAN;
    }
}

int ck_infer_k_math(const struct ck_kcall *k)
{
    enum ck_op op = k->n->op;
    const float *x = k->in[0];
    float *y = k->out[0];
    int64_t n = ck_ishape_numel(&k->outs[0]);
    if (!(op >= CK_OP_ABS && op <= CK_OP_SHRINK))
        return ck_error(CK_EFORMAT, "node '%s': op '%s' is not unary math", k->n->name,
                        ck_op_name(op));
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)one(op, &k->n->p, x[i]);
    return 0;
}
