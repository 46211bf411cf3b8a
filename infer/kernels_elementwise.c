/* Element-wise kernels: activations and unary math, and the binary
 * arithmetic ops with numpy broadcasting or a scalar operand. With the
 * engine's threads (infer/pool.h) the elements, or the output's rows, are
 * cut into parts of at least ELEM_GRAIN: each element is computed alone, so
 * the bits do not depend on the thread count. */
#include "infer/internal.h"
#include "infer/pool.h"
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

static float gelu_tanh(float x)
{
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

/* Elements per part: below it a thread's wake-up costs more than it saves. */
#define ELEM_GRAIN (INT64_C(16) << 10)

static void unary_part(void *arg, int64_t lo, int64_t hi)
{
    const struct ck_kcall *k = arg;
    const struct ck_op_params *p = &k->n->p;
    const float *x = k->in[0] + lo;
    float *y = k->out[0] + lo;
    int64_t n = hi - lo;
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
            y[i] = 1.0f / (1.0f + ck_infer_expf(-x[i]));
        break;
    case CK_OP_TANH:
        for (int64_t i = 0; i < n; i++)
            y[i] = fast_tanh(x[i]);
        break;
    case CK_OP_GELU:
        if (!p->approx_tanh)
            ck_infer_erf_array(x, y, n, true);
        else
            for (int64_t i = 0; i < n; i++)
                y[i] = gelu_tanh(x[i]);
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
        ck_infer_erf_array(x, y, n, false);
        break;
    case CK_OP_CLIP:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] < p->min ? p->min : x[i] > p->max ? p->max : x[i];
        break;
    default:
        break;
    }
}

int ck_infer_k_elementwise(const struct ck_kcall *k)
{
    switch (k->n->op) {
    case CK_OP_IDENTITY: case CK_OP_RELU: case CK_OP_LEAKY_RELU: case CK_OP_SIGMOID:
    case CK_OP_TANH: case CK_OP_GELU: case CK_OP_SQRT: case CK_OP_EXP: case CK_OP_LOG:
    case CK_OP_NEG: case CK_OP_ERF: case CK_OP_CLIP:
        break;
    default:
        return ck_error(CK_EFORMAT, "node '%s': op '%s' is not element-wise", k->n->name,
                        ck_op_name(k->n->op));
    }
    ck_pool_for(k->pool, ck_ishape_numel(&k->outs[0]), ELEM_GRAIN, unary_part, (void *)k);
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

/* One loop per stride pattern of a row (both operands contiguous, a or b
 * one value for the whole row: a per-channel scale or bias, a scalar),
 * each with the op's expression inlined; other strides take apply. */
#define ROW_LOOPS(EXPR)                                                                            \
    do {                                                                                           \
        if (sa == 1 && sb == 1) {                                                                  \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float A = a[i], B = b[i];                                                          \
                y[i] = (EXPR);                                                                     \
            }                                                                                      \
        } else if (sa == 1 && sb == 0) {                                                           \
            const float B = b[0];                                                                  \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float A = a[i];                                                                    \
                y[i] = (EXPR);                                                                     \
            }                                                                                      \
        } else if (sa == 0 && sb == 1) {                                                           \
            const float A = a[0];                                                                  \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float B = b[i];                                                                    \
                y[i] = (EXPR);                                                                     \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float A = a[i * sa], B = b[i * sb];                                                \
                y[i] = (EXPR);                                                                     \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* One row of the output: a and b advance by their own strides (0 when broadcast). */
static void row(enum ck_op op, const float *a, int64_t sa, const float *b, int64_t sb, float *y,
                int64_t n)
{
    switch (op) {
    case CK_OP_ADD: ROW_LOOPS(A + B); return;
    case CK_OP_SUB: ROW_LOOPS(A - B); return;
    case CK_OP_MUL: ROW_LOOPS(A * B); return;
    case CK_OP_DIV: ROW_LOOPS(A / B); return;
    case CK_OP_MAX: ROW_LOOPS(A > B || A != A ? A : B); return;
    case CK_OP_MIN: ROW_LOOPS(A < B || A != A ? A : B); return;
    case CK_OP_PRELU: ROW_LOOPS(A < 0 ? A * B : A); return;
    case CK_OP_POW:
        /* x^2 (LayerNorm's variance as exporters write it): powf rounds the
         * exact square once, as the product does */
        if (sb == 0 && b[0] == 2.0f) {
            for (int64_t i = 0; i < n; i++)
                y[i] = a[i * sa] * a[i * sa];
            return;
        }
        ROW_LOOPS(apply(op, A, B));
        return;
    default: ROW_LOOPS(apply(op, A, B)); return;
    }
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

/* The output's axes with those of extent 1 dropped and neighbours merged
 * where both operands step through them as through one axis (outer stride =
 * inner stride x inner extent): [N, C, H, W] x [1, C, 1, 1] becomes N*C rows
 * of H*W with one b per row, a same-shape product one row. */
struct bin_job {
    const struct ck_kcall *k;
    int r;
    int64_t d[CK_INFER_MAX_RANK], sa[CK_INFER_MAX_RANK], sb[CK_INFER_MAX_RANK];
};

static void collapse(const struct ck_ishape *o, const int64_t *sa, const int64_t *sb,
                     struct bin_job *j)
{
    j->r = 0;
    for (int i = 0; i < o->rank; i++) {
        if (o->d[i] == 1)
            continue;
        int t = j->r - 1;
        if (t >= 0 && j->sa[t] == sa[i] * o->d[i] && j->sb[t] == sb[i] * o->d[i]) {
            j->d[t] *= o->d[i];
            j->sa[t] = sa[i];
            j->sb[t] = sb[i];
            continue;
        }
        j->d[j->r] = o->d[i];
        j->sa[j->r] = sa[i];
        j->sb[j->r] = sb[i];
        j->r++;
    }
    if (j->r == 0) {
        j->r = 1;
        j->d[0] = 1;
        j->sa[0] = j->sb[0] = 0;
    }
}

/* Rows [t0, t1) of the collapsed output (each j->d[r - 1] values). */
static void bin_rows(void *arg, int64_t t0, int64_t t1)
{
    const struct bin_job *j = arg;
    const struct ck_kcall *k = j->k;
    int r = j->r;
    int64_t last = j->d[r - 1];
    for (int64_t t = t0; t < t1; t++) {
        int64_t rem = t, oa = 0, ob = 0;
        for (int i = r - 2; i >= 0; i--) {
            int64_t ix = rem % j->d[i];
            rem /= j->d[i];
            oa += ix * j->sa[i];
            ob += ix * j->sb[i];
        }
        row(k->n->op, k->in[0] + oa, j->sa[r - 1], k->in[1] + ob, j->sb[r - 1],
            k->out[0] + t * last, last);
    }
}

static void scalar_part(void *arg, int64_t lo, int64_t hi)
{
    const struct ck_kcall *k = arg;
    const struct ck_op_params *p = &k->n->p;
    const float s = p->scalar;
    if (p->scalar_first)
        row(k->n->op, &s, 0, k->in[0] + lo, 1, k->out[0] + lo, hi - lo);
    else
        row(k->n->op, k->in[0] + lo, 1, &s, 0, k->out[0] + lo, hi - lo);
}

int ck_infer_k_binary(const struct ck_kcall *k)
{
    const struct ck_op_params *p = &k->n->p;
    const struct ck_ishape *o = &k->outs[0];
    int64_t numel = ck_ishape_numel(o);
    if (p->has_scalar) {
        ck_pool_for(k->pool, numel, ELEM_GRAIN, scalar_part, (void *)k);
        return 0;
    }
    int64_t sa[CK_INFER_MAX_RANK], sb[CK_INFER_MAX_RANK];
    bstrides(&k->ins[0], o->rank, sa);
    bstrides(&k->ins[1], o->rank, sb);
    if (numel == 0)
        return 0;
    struct bin_job j = {.k = k};
    collapse(o, sa, sb, &j);
    int64_t last = j.d[j.r - 1], rows = numel / last;
    ck_pool_for(k->pool, rows, last >= ELEM_GRAIN ? 1 : ELEM_GRAIN / last, bin_rows, &j);
    return 0;
}
