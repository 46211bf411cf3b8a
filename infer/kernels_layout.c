/* Kernels that move values without arithmetic: reshape and its kin (a
 * copy: the planner gives every value its own buffer), transpose, concat,
 * split, slice, gather and constant padding. */
#include "infer/internal.h"
#include "common/error.h"

#include <math.h>
#include <string.h>


static void strides_of(const struct ck_ishape *s, int64_t *st)
{
    int64_t acc = 1;
    for (int i = s->rank - 1; i >= 0; i--) {
        st[i] = acc;
        acc *= s->d[i];
    }
}

/* y[i...] = x[base + sum(i_d * step_d)] over the output's shape. */
static void gather_strided(const float *x, int64_t base, const int64_t *step,
                           const struct ck_ishape *o, float *y)
{
    int64_t n = ck_ishape_numel(o), idx[CK_INFER_MAX_RANK] = {0}, off = base;
    for (int64_t i = 0; i < n; i++) {
        y[i] = x[off];
        for (int d = o->rank - 1; d >= 0; d--) {
            off += step[d];
            if (++idx[d] < o->d[d])
                break;
            off -= step[d] * o->d[d];
            idx[d] = 0;
        }
    }
}

static void transpose(const struct ck_kcall *k)
{
    const struct ck_ishape *x = &k->ins[0];
    int64_t st[CK_INFER_MAX_RANK], step[CK_INFER_MAX_RANK];
    strides_of(x, st);
    for (int i = 0; i < x->rank; i++) {
        int a = k->n->p.nints ? ck_infer_norm_axis(k->n->p.ints[i], x->rank) : x->rank - 1 - i;
        step[i] = st[a];
    }
    gather_strided(k->in[0], 0, step, &k->outs[0], k->out[0]);
}

static void slice(const struct ck_kcall *k)
{
    const struct ck_ishape *x = &k->ins[0];
    int64_t st[CK_INFER_MAX_RANK], step[CK_INFER_MAX_RANK], base = 0;
    strides_of(x, st);
    for (int a = 0; a < x->rank; a++) {
        int64_t first = 0, count, s = 1;
        if ((size_t)a < k->n->p.nints / 3) {
            const int64_t *t = &k->n->p.ints[3 * a];
            ck_infer_slice_axis(x->d[a], t[0], t[1], t[2], &first, &count);
            s = ck_infer_slice_step(x->d[a], t[2]);
        }
        base += first * st[a];
        step[a] = s * st[a];
    }
    gather_strided(k->in[0], base, step, &k->outs[0], k->out[0]);
}

/* concat and split: copy blocks of [outer, len*inner] along axis. */
static void concat(const struct ck_kcall *k, bool split)
{
    const struct ck_ishape *whole = split ? &k->ins[0] : &k->outs[0];
    int axis = ck_infer_norm_axis(ck_op_axis(&k->n->p, 0), whole->rank);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis; i++)
        outer *= whole->d[i];
    for (int i = axis + 1; i < whole->rank; i++)
        inner *= whole->d[i];
    int64_t wrow = whole->d[axis] * inner, at = 0;
    size_t parts = split ? k->n->noutputs : k->nin;
    for (size_t p = 0; p < parts; p++) {
        int64_t prow = (split ? k->outs[p].d[axis] : k->ins[p].d[axis]) * inner;
        for (int64_t o = 0; o < outer; o++) {
            if (split)
                memcpy(k->out[p] + o * prow, k->in[0] + o * wrow + at, sizeof(float) * (size_t)prow);
            else
                memcpy(k->out[0] + o * wrow + at, k->in[p] + o * prow, sizeof(float) * (size_t)prow);
        }
        at += prow;
    }
}

static int gather(const struct ck_kcall *k)
{
    const struct ck_ishape *t = &k->ins[0];
    int axis = ck_infer_norm_axis(ck_op_axis(&k->n->p, 0), t->rank);
    int64_t outer = 1, inner = 1, nidx = ck_ishape_numel(&k->ins[1]);
    for (int i = 0; i < axis; i++)
        outer *= t->d[i];
    for (int i = axis + 1; i < t->rank; i++)
        inner *= t->d[i];
    int64_t len = t->d[axis];
    for (int64_t j = 0; j < nidx; j++) {
        float f = k->in[1][j];
        if (!(f == floorf(f)) || f < (float)-len || f >= (float)len)
            return ck_error(CK_EFORMAT, "node '%s' (gather): index %g at %lld is outside [%lld, %lld)",
                            k->n->name, (double)f, (long long)j, (long long)-len, (long long)len);
    }
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < nidx; j++) {
            int64_t ix = (int64_t)k->in[1][j];
            if (ix < 0)
                ix += len;
            memcpy(k->out[0] + (o * nidx + j) * inner, k->in[0] + (o * len + ix) * inner,
                   sizeof(float) * (size_t)inner);
        }
    return 0;
}

static void pad(const struct ck_kcall *k)
{
    const struct ck_ishape *x = &k->ins[0], *o = &k->outs[0];
    int64_t n = ck_ishape_numel(o), on = ck_ishape_numel(x);
    for (int64_t i = 0; i < n; i++)
        k->out[0][i] = k->n->p.scalar;
    int64_t ost[CK_INFER_MAX_RANK], idx[CK_INFER_MAX_RANK] = {0};
    strides_of(o, ost);
    for (int64_t i = 0; i < on; i++) {
        int64_t off = 0;
        for (int d = 0; d < x->rank; d++)
            off += (idx[d] + ((size_t)d < k->n->p.nints / 2 ? k->n->p.ints[2 * d] : 0)) * ost[d];
        k->out[0][off] = k->in[0][i];
        for (int d = x->rank - 1; d >= 0; d--) {
            if (++idx[d] < x->d[d])
                break;
            idx[d] = 0;
        }
    }
}

int ck_infer_k_layout(const struct ck_kcall *k)
{
    switch (k->n->op) {
    case CK_OP_RESHAPE: case CK_OP_FLATTEN: case CK_OP_SQUEEZE: case CK_OP_UNSQUEEZE:
        if (k->out[0] != k->in[0])
            memcpy(k->out[0], k->in[0], sizeof(float) * (size_t)ck_ishape_numel(&k->outs[0]));
        return 0;
    case CK_OP_TRANSPOSE: transpose(k); return 0;
    case CK_OP_SLICE: slice(k); return 0;
    case CK_OP_CONCAT: concat(k, false); return 0;
    case CK_OP_SPLIT: concat(k, true); return 0;
    case CK_OP_GATHER: return gather(k);
    case CK_OP_PAD: pad(k); return 0;
    default:
        return ck_error(CK_EFORMAT, "node '%s': op '%s' is not a layout op", k->n->name,
                        ck_op_name(k->n->op));
    }
}
