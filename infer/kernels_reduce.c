/* The reductions: mean, sum, max, min, product, sum of squares, log of the
 * sum, log-sum-exp, L1 and L2 norms, over the axes p.ints (all when empty).
 * Accumulators are double (the scratch), so a long axis keeps float32's
 * precision; log-sum-exp subtracts the maximum first so exp never overflows.
 * An empty reduction gives the identity of its operation, as numpy: 0 for
 * the sums, 1 for the product, -inf for max and the logs, +inf for min. */
#include "infer/internal.h"
#include "common/error.h"

#include <math.h>
#include <string.h>

static double start(enum ck_op op)
{
    switch (op) {
    case CK_OP_REDUCE_MAX: return -INFINITY;
    case CK_OP_REDUCE_MIN: return INFINITY;
    case CK_OP_REDUCE_PROD: return 1.0;
    default: return 0.0;
    }
}

/* acc combined with x; max/min keep a NaN once one is seen (numpy's rule). */
static inline double step(enum ck_op op, double acc, double x, double shift)
{
    switch (op) {
    case CK_OP_REDUCE_MAX: return x > acc || x != x ? x : acc;
    case CK_OP_REDUCE_MIN: return x < acc || x != x ? x : acc;
    case CK_OP_REDUCE_PROD: return acc * x;
    case CK_OP_REDUCE_SUM_SQUARE: case CK_OP_REDUCE_L2: return acc + x * x;
    case CK_OP_REDUCE_L1: return acc + fabs(x);
    case CK_OP_REDUCE_LOG_SUM_EXP: return acc + exp(x - shift);
    default: return acc + x; /* mean, sum, log_sum */
    }
}

static double finish(enum ck_op op, double acc, int64_t count, double shift)
{
    switch (op) {
    case CK_OP_REDUCE_MEAN: return acc / (double)count;
    case CK_OP_REDUCE_LOG_SUM: return log(acc);
    case CK_OP_REDUCE_L2: return sqrt(acc);
    case CK_OP_REDUCE_LOG_SUM_EXP:
        return isinf(shift) ? shift : shift + log(acc);
    default: return acc;
    }
}

/* One pass over x, in C order, folding each element into acc[its output]. */
static void pass(const struct ck_kcall *k, const bool *axes, enum ck_op op, double *acc,
                 const float *shift)
{
    const struct ck_ishape *s = &k->ins[0];
    int64_t total = ck_ishape_numel(s), idx[CK_INFER_MAX_RANK] = {0};
    /* the reduced axes the last ones (LayerNorm's mean over the features):
     * each output folds one contiguous run, in the same order as below */
    int first = s->rank;
    while (first > 0 && axes[first - 1])
        first--;
    bool trailing = true;
    for (int d = 0; d < first; d++)
        trailing &= !axes[d];
    if (trailing) {
        int64_t inner = 1;
        for (int d = first; d < s->rank; d++)
            inner *= s->d[d];
        for (int64_t o = 0; inner && o < total / inner; o++) {
            const float *x = k->in[0] + o * inner;
            double a = acc[o], sh = shift ? shift[o] : 0.0;
            if (op == CK_OP_REDUCE_MEAN || op == CK_OP_REDUCE_SUM || op == CK_OP_REDUCE_LOG_SUM)
                for (int64_t i = 0; i < inner; i++)
                    a += x[i];
            else
                for (int64_t i = 0; i < inner; i++)
                    a = step(op, a, x[i], sh);
            acc[o] = a;
        }
        return;
    }
    for (int64_t i = 0; i < total; i++) {
        int64_t o = 0;
        for (int d = 0; d < s->rank; d++)
            if (!axes[d])
                o = o * s->d[d] + idx[d];
        acc[o] = step(op, acc[o], k->in[0][i], shift ? shift[o] : 0.0);
        for (int d = s->rank - 1; d >= 0; d--) {
            if (++idx[d] < s->d[d])
                break;
            idx[d] = 0;
        }
    }
}

int ck_infer_k_reduce(const struct ck_kcall *k)
{
    enum ck_op op = k->n->op;
    bool axes[CK_INFER_MAX_RANK];
    int err = ck_infer_reduce_axes(k->n, k->ins[0].rank, axes);
    if (err < 0)
        return err;
    if (!ck_op_is_reduce(op))
        return ck_error(CK_EFORMAT, "node '%s': op '%s' is not a reduction", k->n->name,
                        ck_op_name(op));
    int64_t onum = ck_ishape_numel(&k->outs[0]), total = ck_ishape_numel(&k->ins[0]);
    int64_t count = onum ? total / onum : 0;
    double *acc = (double *)k->scratch;
    float *y = k->out[0];
    if (op == CK_OP_REDUCE_LOG_SUM_EXP) { /* the maxima first, kept in y */
        for (int64_t o = 0; o < onum; o++)
            acc[o] = -INFINITY;
        pass(k, axes, CK_OP_REDUCE_MAX, acc, NULL);
        for (int64_t o = 0; o < onum; o++)
            y[o] = (float)acc[o];
    }
    for (int64_t o = 0; o < onum; o++)
        acc[o] = start(op);
    pass(k, axes, op, acc, op == CK_OP_REDUCE_LOG_SUM_EXP ? y : NULL);
    for (int64_t o = 0; o < onum; o++)
        y[o] = (float)finish(op, acc[o], count, op == CK_OP_REDUCE_LOG_SUM_EXP ? y[o] : 0.0);
    return 0;
}
