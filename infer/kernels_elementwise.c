/* Element-wise kernels: activations and unary math, and the binary
 * arithmetic ops with numpy broadcasting or a scalar operand. */
#include "infer/internal.h"
#include "common/error.h"

#include <math.h>
#include <string.h>

/* tanh through one expm1f: t / (t + 2) with t = e^(2|x|) - 1 is exact to a
 * few ulp over the whole range (expm1 keeps small x accurate), and half the
 * cost of glibc's tanhf, which calls expm1f and then does more. Past 9,
 * tanh rounds to +-1 in float32 (and e^(2|x|) would overflow). */
static inline float fast_tanh(float x)
{
    float a = fabsf(x);
    if (!(a < 9.0f))
        return a != a ? x : copysignf(1.0f, x);
    float t = expm1f(2.0f * a);
    return copysignf(t / (t + 2.0f), x);
}

static float gelu_erf(float x)
{
    return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
}

static float gelu_tanh(float x)
{
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

int ck_infer_k_elementwise(const struct ck_kcall *k)
{
    const struct ck_op_params *p = &k->n->p;
    const float *x = k->in[0];
    float *y = k->out[0];
    int64_t n = ck_ishape_numel(&k->outs[0]);
    switch (k->n->op) {
    case CK_OP_IDENTITY:
        if (y != x)
            memcpy(y, x, sizeof(float) * (size_t)n);
        break;
    case CK_OP_RELU:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] < 0 ? 0.0f : x[i]; /* NaN stays NaN, as in torch */
        break;
    case CK_OP_LEAKY_RELU:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] >= 0 ? x[i] : x[i] * p->alpha;
        break;
    case CK_OP_SIGMOID:
        for (int64_t i = 0; i < n; i++)
            y[i] = 1.0f / (1.0f + expf(-x[i]));
        break;
    case CK_OP_TANH:
        for (int64_t i = 0; i < n; i++)
            y[i] = fast_tanh(x[i]);
        break;
    case CK_OP_GELU:
        for (int64_t i = 0; i < n; i++)
            y[i] = p->approx_tanh ? gelu_tanh(x[i]) : gelu_erf(x[i]);
        break;
    case CK_OP_SQRT:
        for (int64_t i = 0; i < n; i++)
            y[i] = sqrtf(x[i]);
        break;
    case CK_OP_EXP:
        for (int64_t i = 0; i < n; i++)
            y[i] = expf(x[i]);
        break;
    case CK_OP_LOG:
        for (int64_t i = 0; i < n; i++)
            y[i] = logf(x[i]);
        break;
    case CK_OP_NEG:
        for (int64_t i = 0; i < n; i++)
            y[i] = -x[i];
        break;
    case CK_OP_ERF:
        for (int64_t i = 0; i < n; i++)
            y[i] = erff(x[i]);
        break;
    case CK_OP_CLIP:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] < p->min ? p->min : x[i] > p->max ? p->max : x[i];
        break;
    default:
        return ck_error(CK_EFORMAT, "node '%s': op '%s' is not element-wise", k->n->name,
                        ck_op_name(k->n->op));
    }
    return 0;
}

static inline float apply(enum ck_op op, float a, float b)
{
    switch (op) {
    case CK_OP_ADD: return a + b;
    case CK_OP_SUB: return a - b;
    case CK_OP_MUL: return a * b;
    case CK_OP_DIV: return a / b;
    case CK_OP_MAX: return a > b || a != a ? a : b; /* NaN wins, as numpy.maximum */
    case CK_OP_MIN: return a < b || a != a ? a : b;
    case CK_OP_PRELU: return a < 0 ? a * b : a;
    case CK_OP_FMOD: return fmodf(a, b);
    default: return powf(a, b);
    }
}

/* One row of the output: a and b advance by their own strides (0 when broadcast). */
static void row(enum ck_op op, const float *a, int64_t sa, const float *b, int64_t sb, float *y,
                int64_t n)
{
    if (sa == 1 && sb == 1) {
        switch (op) {
        case CK_OP_ADD: for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i]; return;
        case CK_OP_MUL: for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i]; return;
        case CK_OP_SUB: for (int64_t i = 0; i < n; i++) y[i] = a[i] - b[i]; return;
        default: break;
        }
    }
    for (int64_t i = 0; i < n; i++)
        y[i] = apply(op, a[i * sa], b[i * sb]);
}

/* Strides of a shape aligned to the output's rank r, 0 on broadcast axes. */
static void bstrides(const struct ck_ishape *s, int r, int64_t *st)
{
    int64_t acc = 1;
    for (int i = r - 1; i >= 0; i--) {
        int j = i - (r - s->rank);
        if (j < 0 || s->d[j] == 1) {
            st[i] = 0;
        } else {
            st[i] = acc;
        }
        if (j >= 0)
            acc *= s->d[j];
    }
}

int ck_infer_k_binary(const struct ck_kcall *k)
{
    const struct ck_op_params *p = &k->n->p;
    enum ck_op op = k->n->op;
    const struct ck_ishape *o = &k->outs[0];
    float *y = k->out[0];
    if (p->has_scalar) {
        int64_t n = ck_ishape_numel(o);
        const float *x = k->in[0];
        float s = p->scalar;
        for (int64_t i = 0; i < n; i++)
            y[i] = p->scalar_first ? apply(op, s, x[i]) : apply(op, x[i], s);
        return 0;
    }
    int r = o->rank;
    int64_t sa[CK_INFER_MAX_RANK], sb[CK_INFER_MAX_RANK], idx[CK_INFER_MAX_RANK] = {0};
    bstrides(&k->ins[0], r, sa);
    bstrides(&k->ins[1], r, sb);
    if (ck_ishape_numel(o) == 0)
        return 0;
    if (r == 0) {
        y[0] = apply(op, k->in[0][0], k->in[1][0]);
        return 0;
    }
    int64_t last = o->d[r - 1];
    for (;;) {
        int64_t oa = 0, ob = 0, oy = 0, mul = 1;
        for (int i = r - 2; i >= 0; i--) {
            oa += idx[i] * sa[i];
            ob += idx[i] * sb[i];
        }
        for (int i = r - 1; i >= 0; i--) {
            oy += idx[i] * mul;
            mul *= o->d[i];
        }
        row(op, k->in[0] + oa, sa[r - 1], k->in[1] + ob, sb[r - 1], y + oy, last);
        int i = r - 2;
        for (; i >= 0; i--) {
            if (++idx[i] < o->d[i])
                break;
            idx[i] = 0;
        }
        if (i < 0)
            break;
    }
    return 0;
}
