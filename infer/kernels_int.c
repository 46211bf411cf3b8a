/* Casts and integer arithmetic. The engine stores every value as float32
 * and tags it with its dtype (ck_value.dtype): an integer is a whole number
 * under 2^24 in magnitude, which float32 holds exactly. The kernels here
 * take the operands as int64, compute as ONNX says (integer division
 * truncates, Mod's two forms, the dtype's width wraps as numpy's does), and
 * refuse a result float32 could not hold exactly, naming the node: never a
 * rounded integer. */
#include "infer/internal.h"
#include "common/error.h"
#include "model/convert.h"

#include <math.h>
#include <string.h>

#define INT_LIMIT (INT64_C(1) << 24) /* float32 holds every integer below it */

static int bits_of(enum ck_dtype t)
{
    switch (t) {
    case CK_DT_I8: case CK_DT_U8: return 8;
    case CK_DT_I16: case CK_DT_U16: return 16;
    case CK_DT_I32: case CK_DT_U32: return 32;
    default: return 64;
    }
}

static bool is_signed(enum ck_dtype t)
{
    return t == CK_DT_I8 || t == CK_DT_I16 || t == CK_DT_I32 || t == CK_DT_I64;
}

/* v in t's width, two's complement (numpy's astype and its arithmetic). */
static int64_t wrap(enum ck_dtype t, int64_t v)
{
    int b = bits_of(t);
    if (b == 64)
        return v;
    uint64_t m = (UINT64_C(1) << b) - 1, u = (uint64_t)v & m;
    if (is_signed(t) && (u >> (b - 1)))
        return (int64_t)(u | ~m);
    return (int64_t)u;
}

/* Whether v fits t: for a 64-bit unsigned type, no negative. */
static bool fits(enum ck_dtype t, int64_t v)
{
    int b = bits_of(t);
    if (!is_signed(t))
        return v >= 0 && (b == 64 || v <= (int64_t)((UINT64_C(1) << b) - 1));
    return b == 64 || (v >= -(INT64_C(1) << (b - 1)) && v < (INT64_C(1) << (b - 1)));
}

static int too_big(const struct ck_kcall *k, int64_t v)
{
    return ck_error(CK_EFORMAT, "node '%s' (%s): the integer %lld is not under 2^24 in magnitude "
                    "(float32, the engine's storage, holds integers exactly below it only)",
                    k->n->name, ck_op_name(k->n->op), (long long)v);
}

/* Stores v (of t) as float32: wrapped to t's width, then under 2^24. */
static int put(const struct ck_kcall *k, enum ck_dtype t, float *y, int64_t v)
{
    v = wrap(t, v);
    if (v <= -INT_LIMIT || v >= INT_LIMIT)
        return too_big(k, v);
    *y = (float)v;
    return 0;
}

/* An operand: a whole number under 2^24 (what the engine stores). */
static int get(const struct ck_kcall *k, float f, int64_t *v)
{
    if (!(f > -(float)INT_LIMIT && f < (float)INT_LIMIT) || f != truncf(f))
        return ck_error(CK_EFORMAT, "node '%s' (%s): operand %g is not an integer under 2^24",
                        k->n->name, ck_op_name(k->n->op), (double)f);
    *v = (int64_t)f;
    return 0;
}

void ck_infer_round_to(enum ck_dtype t, float *v, int64_t n)
{
    if (t == CK_DT_F16)
        for (int64_t i = 0; i < n; i++)
            v[i] = ck_f16_to_f32(ck_f32_to_f16(v[i]));
    else if (t == CK_DT_BF16)
        for (int64_t i = 0; i < n; i++)
            v[i] = ck_bf16_to_f32(ck_f32_to_bf16(v[i]));
}

static bool is_float(enum ck_dtype t)
{
    return t == CK_DT_F16 || t == CK_DT_BF16 || t == CK_DT_F32 || t == CK_DT_F64;
}

/* x to the output's dtype: floats are copied (infer.c rounds float16 and
 * bfloat16 after the node); to bool, 1 where x is not 0 (NaN too); to an
 * integer from a float, toward zero, NaN, infinities and values outside the
 * type an error; between integers, wrapped to the width (numpy's astype). */
int ck_infer_k_cast(const struct ck_kcall *k)
{
    enum ck_dtype from = k->indt ? k->indt[0] : CK_DT_F32, to = k->outdt ? k->outdt[0] : CK_DT_F32;
    const float *x = k->in[0];
    float *y = k->out[0];
    int64_t n = ck_ishape_numel(&k->outs[0]);
    int err;
    if (is_float(to)) {
        if (y != x)
            memcpy(y, x, sizeof(float) * (size_t)n);
        return 0;
    }
    if (to == CK_DT_BOOL) {
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] != 0 ? 1.0f : 0.0f; /* NaN != 0 */
        return 0;
    }
    if (!ck_dtype_is_int(to))
        return ck_error(CK_EFORMAT, "node '%s' (cast): no cast to %s", k->n->name,
                        ck_dtype_name(to));
    for (int64_t i = 0; i < n; i++) {
        int64_t v = 0;
        if (is_float(from)) {
            if (!isfinite(x[i]))
                return ck_error(CK_EFORMAT, "node '%s' (cast): %g has no value in %s", k->n->name,
                                (double)x[i], ck_dtype_name(to));
            double t = trunc((double)x[i]);
            if (!(fabs(t) < 0x1p62) || !fits(to, (int64_t)t))
                return ck_error(CK_EFORMAT, "node '%s' (cast): %g is outside %s", k->n->name,
                                (double)x[i], ck_dtype_name(to));
            v = (int64_t)t;
        } else if ((err = get(k, x[i], &v)) < 0) {
            return err;
        }
        if ((err = put(k, to, &y[i], v)) < 0)
            return err;
    }
    return 0;
}

bool ck_infer_int_node(const struct ck_model_node *n, const enum ck_dtype *indt, size_t nin,
                       enum ck_dtype out)
{
    switch (n->op) {
    case CK_OP_ADD: case CK_OP_SUB: case CK_OP_MUL: case CK_OP_DIV: case CK_OP_FMOD:
    case CK_OP_NEG: case CK_OP_ABS: case CK_OP_MAX: case CK_OP_MIN: case CK_OP_REDUCE_SUM:
    case CK_OP_REDUCE_MAX: case CK_OP_REDUCE_MIN: case CK_OP_REDUCE_PROD:
        break;
    case CK_OP_POW: /* an integer base; the exponent integer or float */
        return ck_dtype_is_int(out) && nin >= 1 && ck_dtype_is_int(indt[0]);
    default:
        return false;
    }
    if (!ck_dtype_is_int(out) || nin == 0)
        return false;
    for (size_t i = 0; i < nin; i++)
        if (!ck_dtype_is_int(indt[i]) && indt[i] != CK_DT_BOOL)
            return false;
    return true;
}

static int binop(const struct ck_kcall *k, enum ck_dtype t, int64_t a, int64_t b, int64_t *r)
{
    bool c_fmod = !k->n->p.nints || k->n->p.ints[0] != 0;
    switch (k->n->op) {
    case CK_OP_ADD: *r = a + b; return 0;
    case CK_OP_SUB: *r = a - b; return 0;
    case CK_OP_MUL: *r = a * b; return 0; /* |a|, |b| < 2^24: no overflow */
    case CK_OP_MAX: *r = a > b ? a : b; return 0;
    case CK_OP_MIN: *r = a < b ? a : b; return 0;
    case CK_OP_DIV: case CK_OP_FMOD:
        if (b == 0)
            return ck_error(CK_EFORMAT, "node '%s' (%s): integer division by zero", k->n->name,
                            ck_op_name(k->n->op));
        if (k->n->op == CK_OP_DIV) {
            *r = a / b; /* C truncates toward zero */
        } else {
            *r = a % b; /* C's: the sign of a (fmod=1) */
            if (!c_fmod && *r != 0 && ((*r < 0) != (b < 0)))
                *r += b; /* ONNX's Mod fmod=0: the sign of the divisor */
        }
        return 0;
    default:
        (void)t;
        return ck_error(CK_EFORMAT, "node '%s': op '%s' has no integer kernel", k->n->name,
                        ck_op_name(k->n->op));
    }
}

static void strides(const struct ck_ishape *s, const struct ck_ishape *o, int64_t *st)
{
    int64_t acc = 1;
    for (int d = o->rank - 1; d >= 0; d--) {
        int sd = s->rank - o->rank + d;
        st[d] = sd >= 0 && s->d[sd] != 1 ? acc : 0;
        if (sd >= 0)
            acc *= s->d[sd];
    }
}

/* An integer to the power e: rounded to the nearest integer when e is a
 * whole number from 0 (pow's result is within an ulp of the exact one,
 * which is under 2^24 when it is stored), else toward zero (ONNX's
 * reference casts the float power to the integer type). */
static int int_pow(const struct ck_kcall *k, int64_t a, double e, int64_t *r)
{
    double p = pow((double)a, e);
    if (!isfinite(p) || fabs(p) >= 0x1p62)
        return ck_error(CK_EFORMAT, "node '%s' (pow): %lld to the power %g has no integer value "
                        "under 2^24", k->n->name, (long long)a, e);
    *r = e >= 0 && e == trunc(e) ? (int64_t)llround(p) : (int64_t)trunc(p);
    return 0;
}

/* a op b with numpy broadcasting, or a op the node's scalar. */
static int binary(const struct ck_kcall *k, enum ck_dtype t)
{
    const struct ck_ishape *o = &k->outs[0];
    const struct ck_op_params *p = &k->n->p;
    int64_t n = ck_ishape_numel(o), sa[CK_INFER_MAX_RANK], sb[CK_INFER_MAX_RANK];
    int64_t idx[CK_INFER_MAX_RANK] = {0}, ia = 0, ib = 0, s = 0;
    int err;
    bool scalar = p->has_scalar || k->nin < 2, is_pow = k->n->op == CK_OP_POW;
    if (scalar && !is_pow && (err = get(k, p->scalar, &s)) < 0)
        return err;
    strides(&k->ins[0], o, sa);
    if (!scalar)
        strides(&k->ins[1], o, sb);
    for (int64_t i = 0; i < n; i++) {
        int64_t a = 0, b = 0, r = 0;
        if (is_pow) { /* the exponent as it is: an integer or a float */
            double e = scalar ? (double)p->scalar : (double)k->in[1][ib];
            if ((err = get(k, k->in[0][ia], &a)) < 0 || (err = int_pow(k, a, e, &r)) < 0 ||
                (err = put(k, t, &k->out[0][i], r)) < 0)
                return err;
            goto next;
        }
        if ((err = get(k, k->in[0][ia], &a)) < 0 ||
            (!scalar && (err = get(k, k->in[1][ib], &b)) < 0))
            return err;
        if (scalar) {
            b = p->scalar_first ? a : s;
            a = p->scalar_first ? s : a;
        }
        if ((err = binop(k, t, a, b, &r)) < 0 || (err = put(k, t, &k->out[0][i], r)) < 0)
            return err;
    next:
        for (int d = o->rank - 1; d >= 0; d--) {
            ia += sa[d];
            if (!scalar)
                ib += sb[d];
            if (++idx[d] < o->d[d])
                break;
            ia -= sa[d] * o->d[d];
            if (!scalar)
                ib -= sb[d] * o->d[d];
            idx[d] = 0;
        }
    }
    return 0;
}

/* reduce_sum, _prod, _max, _min over the axes, in int64 (scratch), each
 * result wrapped to the dtype; max and min of nothing are an error. */
static int reduce(const struct ck_kcall *k, enum ck_dtype t)
{
    const struct ck_ishape *x = &k->ins[0];
    enum ck_op op = k->n->op;
    bool axes[CK_INFER_MAX_RANK];
    int err = ck_infer_reduce_axes(k->n, x->rank, axes);
    if (err < 0)
        return err;
    int64_t onum = ck_ishape_numel(&k->outs[0]), total = ck_ishape_numel(x);
    int64_t *acc = (int64_t *)(void *)k->scratch, idx[CK_INFER_MAX_RANK] = {0};
    int64_t ost[CK_INFER_MAX_RANK], m = 1;
    if (onum && total / onum == 0 && (op == CK_OP_REDUCE_MAX || op == CK_OP_REDUCE_MIN))
        return ck_error(CK_EFORMAT, "node '%s' (%s): the largest or smallest of no integers",
                        k->n->name, ck_op_name(op));
    for (int d = x->rank - 1; d >= 0; d--) {
        ost[d] = axes[d] ? 0 : m;
        if (!axes[d])
            m *= x->d[d];
    }
    for (int64_t o = 0; o < onum; o++)
        acc[o] = op == CK_OP_REDUCE_PROD ? 1 : op == CK_OP_REDUCE_MAX ? INT64_MIN
                 : op == CK_OP_REDUCE_MIN ? INT64_MAX : 0;
    for (int64_t i = 0; i < total; i++) {
        int64_t o = 0, v = 0;
        for (int d = 0; d < x->rank; d++)
            o += idx[d] * ost[d];
        if ((err = get(k, k->in[0][i], &v)) < 0)
            return err;
        if (op == CK_OP_REDUCE_SUM)
            acc[o] = wrap(t, (int64_t)((uint64_t)acc[o] + (uint64_t)v)); /* numpy wraps */
        else if (op == CK_OP_REDUCE_PROD)
            acc[o] = wrap(t, (int64_t)((uint64_t)acc[o] * (uint64_t)v));
        else if (op == CK_OP_REDUCE_MAX ? v > acc[o] : v < acc[o])
            acc[o] = v;
        for (int d = x->rank - 1; d >= 0; d--) {
            if (++idx[d] < x->d[d])
                break;
            idx[d] = 0;
        }
    }
    for (int64_t o = 0; o < onum; o++)
        if ((err = put(k, t, &k->out[0][o], acc[o])) < 0)
            return err;
    return 0;
}

int ck_infer_k_int(const struct ck_kcall *k)
{
    enum ck_dtype t = k->outdt[0];
    int64_t n = ck_ishape_numel(&k->outs[0]);
    int err;
    switch (k->n->op) {
    case CK_OP_NEG: case CK_OP_ABS:
        for (int64_t i = 0; i < n; i++) {
            int64_t v = 0;
            if ((err = get(k, k->in[0][i], &v)) < 0 ||
                (err = put(k, t, &k->out[0][i], k->n->op == CK_OP_NEG || v < 0 ? -v : v)) < 0)
                return err;
        }
        return 0;
    case CK_OP_REDUCE_SUM: case CK_OP_REDUCE_PROD: case CK_OP_REDUCE_MAX: case CK_OP_REDUCE_MIN:
        return reduce(k, t);
    default:
        return binary(k, t);
    }
}
