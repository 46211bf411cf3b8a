/* Shape values (docs/model.md "Shape values"): the integers a graph computes
 * from its inputs' shapes — ONNX's Shape -> Gather -> Unsqueeze -> Concat ->
 * Reshape around a dynamic batch or sequence length, a Range of positions, a
 * causal mask of the sequence's length — evaluated by the plan once the
 * run's input shapes are known, in int64 and exactly, before any kernel
 * runs. A node whose inputs are all shape values or whole-numbered weights
 * (and at least one a shape value) is evaluated here and not run; a reshape,
 * expand, tile or slice whose shape, repeats or bounds are inputs is
 * specialised: the plan gives the engine's node those integers as its
 * parameters. A shape value a kernel reads as data has a float32 copy.
 *
 * Inputs are hostile: every integer is checked (overflow, division by zero,
 * an index out of range), a shape value holds at most
 * CK_INFER_SHAPEVAL_MAX integers, and a parameter that depends on tensor
 * values (not only on shapes) is an error naming the node, before anything
 * is allocated for the run. */
#include "infer/engine.h"
#include "common/error.h"
#include "model/dims.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BAD(...) ck_error(CK_EFORMAT, __VA_ARGS__)

/* One operand: its shape and integers (borrowed from a shape value, or
 * owned: a weight's whole numbers). */
struct opnd {
    struct ck_ishape s;
    const int64_t *v;
    int64_t *owned;
};

const struct ck_model_node *ck_infer_node_of(const struct ck_infer *e, size_t i)
{
    return e->nodes[i].has_spec ? &e->nodes[i].spec : &e->m->nodes[i];
}

size_t ck_infer_node_nin(const struct ck_infer *e, size_t i)
{
    return e->nodes[i].has_spec ? 1 : e->nodes[i].nin;
}

/* Whether value idx has integers known to the plan: a shape value, or a
 * weight or a graph input (its values bound by the run: a Reshape's shape, a
 * Trilu's k given as an input) of whole numbers (at most
 * CK_INFER_SHAPEVAL_MAX of them). o is filled when it has; an error for no
 * memory. */
static int known(const struct ck_infer *e, int idx, struct opnd *o, bool *yes)
{
    const struct ck_value *v = &e->values[idx];
    memset(o, 0, sizeof *o);
    *yes = false;
    o->s = v->shape;
    if (v->planned) {
        o->v = v->ival;
        *yes = v->ival != NULL;
        return 0;
    }
    if (v->kind == CK_VALUE_NODE || !v->data) /* a weight, or a graph input bound by the run */
        return 0;
    int64_t n = ck_ishape_numel(&v->shape);
    if (n < 0 || n > CK_INFER_SHAPEVAL_MAX)
        return 0;
    for (int64_t k = 0; k < n; k++) {
        float f = v->data[k];
        if (!(fabsf(f) < 0x1p62f) || f != truncf(f))
            return 0;
    }
    if (!(o->owned = malloc(sizeof(int64_t) * (size_t)(n ? n : 1))))
        return ck_error(CK_ENOMEM, "out of memory for %lld integers", (long long)n);
    for (int64_t k = 0; k < n; k++)
        o->owned[k] = (int64_t)v->data[k];
    o->v = o->owned;
    *yes = true;
    return 0;
}

/* The flat index into a broadcast operand of shape in for flat index k of
 * out (numpy's rule: a 1 stretches, missing leading axes count as 1). */
static int64_t bidx(const struct ck_ishape *out, int64_t k, const struct ck_ishape *in)
{
    int64_t src = 0, mul = 1;
    for (int i = out->rank - 1; i >= 0; i--) {
        int64_t c = k % out->d[i];
        k /= out->d[i];
        int j = i - (out->rank - in->rank);
        if (j >= 0) {
            src += (in->d[j] == 1 ? 0 : c) * mul;
            mul *= in->d[j];
        }
    }
    return src;
}

static bool is_arith(enum ck_op op)
{
    return op == CK_OP_ADD || op == CK_OP_SUB || op == CK_OP_MUL || op == CK_OP_DIV ||
           op == CK_OP_MAX || op == CK_OP_MIN;
}

static bool is_compare(enum ck_op op)
{
    return op >= CK_OP_EQUAL && op <= CK_OP_XOR && op != CK_OP_NOT;
}

/* Ops the plan evaluates on integers. */
static bool evaluates(enum ck_op op)
{
    switch (op) {
    case CK_OP_IDENTITY: case CK_OP_CAST: case CK_OP_RESHAPE: case CK_OP_FLATTEN:
    case CK_OP_SQUEEZE: case CK_OP_UNSQUEEZE: case CK_OP_CONCAT: case CK_OP_GATHER:
    case CK_OP_SLICE: case CK_OP_EXPAND: case CK_OP_NEG: case CK_OP_ABS: case CK_OP_NOT:
    case CK_OP_WHERE: case CK_OP_CONSTANT_OF_SHAPE: case CK_OP_RANGE:
        return true;
    default:
        return is_arith(op) || is_compare(op);
    }
}

/* a op b on integers; false on overflow or a division by zero. */
static bool arith(enum ck_op op, int64_t a, int64_t b, int64_t *r)
{
    switch (op) {
    case CK_OP_ADD: return !__builtin_add_overflow(a, b, r);
    case CK_OP_SUB: return !__builtin_sub_overflow(a, b, r);
    case CK_OP_MUL: return !__builtin_mul_overflow(a, b, r);
    case CK_OP_DIV: /* toward zero, as C and ONNX Runtime */
        if (b == 0 || (a == INT64_MIN && b == -1))
            return false;
        *r = a / b;
        return true;
    case CK_OP_MAX: *r = a > b ? a : b; return true;
    case CK_OP_MIN: *r = a < b ? a : b; return true;
    case CK_OP_EQUAL: *r = a == b; return true;
    case CK_OP_LESS: *r = a < b; return true;
    case CK_OP_GREATER: *r = a > b; return true;
    case CK_OP_LESS_EQUAL: *r = a <= b; return true;
    case CK_OP_GREATER_EQUAL: *r = a >= b; return true;
    case CK_OP_AND: *r = a && b; return true;
    case CK_OP_OR: *r = a || b; return true;
    default: /* xor */ *r = !a != !b; return true;
    }
}

/* The 1-D integers of operand o as a node's parameters (at most max). */
static int as_params(const struct ck_model_node *n, const char *what, const struct opnd *o,
                     size_t max, int64_t *out, size_t *count)
{
    int64_t len = ck_ishape_numel(&o->s);
    if (o->s.rank > 1 || len < 0 || (size_t)len > max)
        return BAD("node '%s' (%s): its %s is not a list of at most %zu integers", n->name,
                   ck_op_name(n->op), what, max);
    memcpy(out, o->v, sizeof(int64_t) * (size_t)len);
    *count = (size_t)len;
    return 0;
}

/* Slice(x, starts, ends[, axes[, steps]]) as (start, end, step) per axis
 * from 0 to the last one sliced. */
static int slice_params(const struct ck_model_node *n, const struct ck_ishape *x,
                        const struct opnd *o, size_t nops, int64_t *t, size_t *nt)
{
    int64_t st[CK_INFER_MAX_RANK], en[CK_INFER_MAX_RANK], ax[CK_INFER_MAX_RANK],
        sp[CK_INFER_MAX_RANK];
    size_t ns = 0, ne = 0, na = 0, np = 0;
    int err, last = -1;
    if (nops < 2 || nops > 4) /* the archive's node, not ONNX's checked one: hostile */
        return BAD("node '%s' (slice): %zu inputs after the data, not starts, ends[, axes[, "
                   "steps]]", n->name, nops);
    if ((err = as_params(n, "starts", &o[0], CK_INFER_MAX_RANK, st, &ns)) < 0 ||
        (err = as_params(n, "ends", &o[1], CK_INFER_MAX_RANK, en, &ne)) < 0 ||
        (nops > 2 && (err = as_params(n, "axes", &o[2], CK_INFER_MAX_RANK, ax, &na)) < 0) ||
        (nops > 3 && (err = as_params(n, "steps", &o[3], CK_INFER_MAX_RANK, sp, &np)) < 0))
        return err;
    if (ns != ne || (nops > 2 && na != ns) || (nops > 3 && np != ns))
        return BAD("node '%s' (slice): starts, ends, axes and steps differ in length", n->name);
    bool seen[CK_INFER_MAX_RANK] = {0};
    for (int a = 0; a < CK_INFER_MAX_RANK; a++)
        t[3 * a] = 0, t[3 * a + 1] = INT64_MAX, t[3 * a + 2] = 1;
    for (size_t i = 0; i < ns; i++) {
        int a = nops > 2 ? ck_infer_norm_axis(ax[i], x->rank) : (i < (size_t)x->rank ? (int)i : -1);
        if (a < 0 || seen[a])
            return BAD("node '%s' (slice): axis %lld is out of range or repeated for rank %d",
                       n->name, (long long)(nops > 2 ? ax[i] : (int64_t)i), x->rank);
        seen[a] = true;
        t[3 * a] = st[i], t[3 * a + 1] = en[i], t[3 * a + 2] = nops > 3 ? sp[i] : 1;
        last = a > last ? a : last;
    }
    *nt = (size_t)(3 * (last + 1));
    return 0;
}

/* trilu's k and resize's sizes or scales from input 1: trilu (x, k) takes
 * ints [upper, k]; resize (x, sizes or scales) its ints with -1 for what
 * input 1 gives: a size (an integer) or a scale (a float32, given by its
 * bits). */
static int select_params(const struct ck_infer *e, size_t i, const struct opnd *o, int64_t *t,
                         size_t *nt)
{
    const struct ck_model_node *n = &e->m->nodes[i];
    const struct ck_value *pv = &e->values[e->nodes[i].in[1]];
    int64_t len = ck_ishape_numel(&o[0].s);
    if (n->op == CK_OP_TRILU) {
        if (n->p.nints != 2 || len != 1 || !o[0].v)
            return BAD("node '%s' (trilu): k is not one integer", n->name);
        t[0] = n->p.ints[0], t[1] = o[0].v[0];
        *nt = 2;
        return 0;
    }
    int rank = e->values[e->nodes[i].in[0]].shape.rank;
    if (n->p.nints != 4 + 2 * (size_t)rank || len != rank)
        return BAD("node '%s' (resize): %lld sizes or scales for an input of rank %d", n->name,
                   (long long)len, rank);
    memcpy(t, n->p.ints, sizeof(int64_t) * n->p.nints);
    for (int a = 0; a < rank; a++) {
        if (t[4 + 2 * a] == -1) {
            if (!o[0].v || o[0].v[a] < 0)
                return BAD("node '%s' (resize): size %d is not a size", n->name, a);
            t[4 + 2 * a] = o[0].v[a];
        }
        if (t[5 + 2 * a] == -1) {
            float s = pv->data ? pv->data[a] : 0;
            uint32_t bits;
            if (!(s > 0 && s <= 1e6f))
                return BAD("node '%s' (resize): scale %g of axis %d is out of range", n->name,
                           (double)s, a);
            memcpy(&bits, &s, 4);
            t[5 + 2 * a] = (int64_t)bits;
        }
    }
    *nt = 4 + 2 * (size_t)rank;
    return 0;
}

/* Node i's parameters from its inputs 1...: the specialised node. */
static int specialise(struct ck_infer *e, size_t i, const struct opnd *o, size_t nops)
{
    const struct ck_model_node *n = &e->m->nodes[i];
    struct ck_enode *en = &e->nodes[i];
    int64_t t[3 * CK_INFER_MAX_RANK];
    size_t nt = 0;
    int err;
    if (n->op == CK_OP_SLICE)
        err = slice_params(n, &e->values[en->in[0]].shape, o, nops, t, &nt);
    else if (n->op == CK_OP_TRILU || n->op == CK_OP_RESIZE)
        err = select_params(e, i, o, t, &nt);
    else
        err = as_params(n, n->op == CK_OP_TILE ? "repeats" : "shape", &o[0], CK_INFER_MAX_RANK, t,
                        &nt);
    if (err < 0)
        return err;
    en->spec = *n;
    en->spec.ninputs = 1;
    en->spec.p.nints = nt;
    if (!(en->spec.p.ints = malloc(sizeof(int64_t) * (nt ? nt : 1))))
        return ck_error(CK_ENOMEM, "out of memory");
    memcpy(en->spec.p.ints, t, sizeof(int64_t) * nt);
    en->has_spec = true;
    return 0;
}

/* Output shape and integers of an evaluated node into *s and *out (owned
 * by the caller). */
static int eval_values(const struct ck_model_node *n, const struct opnd *o, size_t nops,
                       const struct ck_ishape *os, int64_t *r)
{
    int64_t total = ck_ishape_numel(os);
    switch (n->op) {
    case CK_OP_IDENTITY: case CK_OP_CAST: case CK_OP_RESHAPE: case CK_OP_FLATTEN:
    case CK_OP_SQUEEZE: case CK_OP_UNSQUEEZE:
        memcpy(r, o[0].v, sizeof(int64_t) * (size_t)total);
        return 0;
    case CK_OP_NEG: case CK_OP_ABS: case CK_OP_NOT:
        for (int64_t k = 0; k < total; k++) {
            int64_t a = o[0].v[k];
            if (n->op != CK_OP_NOT && a == INT64_MIN)
                return BAD("node '%s' (%s): integer overflow", n->name, ck_op_name(n->op));
            r[k] = n->op == CK_OP_NOT ? !a : n->op == CK_OP_NEG ? -a : a < 0 ? -a : a;
        }
        return 0;
    case CK_OP_EXPAND:
        for (int64_t k = 0; k < total; k++)
            r[k] = o[0].v[bidx(os, k, &o[0].s)];
        return 0;
    case CK_OP_WHERE:
        for (int64_t k = 0; k < total; k++)
            r[k] = o[0].v[bidx(os, k, &o[0].s)] ? o[1].v[bidx(os, k, &o[1].s)]
                                                 : o[2].v[bidx(os, k, &o[2].s)];
        return 0;
    case CK_OP_CONCAT: {
        int a = ck_infer_norm_axis(ck_op_axis(&n->p, 0), os->rank);
        int64_t outer = 1, at = 0;
        for (int d = 0; d < a; d++)
            outer *= os->d[d];
        for (int64_t b = 0; b < outer; b++)
            for (size_t k = 0; k < nops; k++) {
                int64_t inner = 1;
                for (int d = a; d < o[k].s.rank; d++)
                    inner *= o[k].s.d[d];
                memcpy(r + at, o[k].v + b * inner, sizeof(int64_t) * (size_t)inner);
                at += inner;
            }
        return 0;
    }
    case CK_OP_GATHER: {
        int a = ck_infer_norm_axis(ck_op_axis(&n->p, 0), o[0].s.rank);
        int64_t outer = 1, inner = 1, size = o[0].s.d[a], ni = ck_ishape_numel(&o[1].s), at = 0;
        for (int d = 0; d < a; d++)
            outer *= o[0].s.d[d];
        for (int d = a + 1; d < o[0].s.rank; d++)
            inner *= o[0].s.d[d];
        for (int64_t b = 0; b < outer; b++)
            for (int64_t j = 0; j < ni; j++) {
                int64_t x = o[1].v[j];
                if (x < -size || x >= size)
                    return BAD("node '%s' (gather): index %lld out of range for %lld elements",
                               n->name, (long long)x, (long long)size);
                x += x < 0 ? size : 0;
                memcpy(r + at, o[0].v + (b * size + x) * inner, sizeof(int64_t) * (size_t)inner);
                at += inner;
            }
        return 0;
    }
    case CK_OP_SLICE: {
        int64_t first[CK_INFER_MAX_RANK], step[CK_INFER_MAX_RANK], cnt;
        const struct ck_ishape *x = &o[0].s;
        for (int d = 0; d < x->rank; d++) {
            first[d] = 0, step[d] = 1;
            if ((size_t)(3 * d) < n->p.nints) {
                step[d] = ck_infer_slice_step(x->d[d], n->p.ints[3 * d + 2]);
                ck_infer_slice_axis(x->d[d], n->p.ints[3 * d], n->p.ints[3 * d + 1],
                                    n->p.ints[3 * d + 2], &first[d], &cnt);
            }
        }
        for (int64_t k = 0; k < total; k++) {
            int64_t rest = k, src = 0, mul = 1;
            for (int d = x->rank - 1; d >= 0; d--) {
                int64_t c = rest % os->d[d];
                rest /= os->d[d];
                src += (first[d] + c * step[d]) * mul;
                mul *= x->d[d];
            }
            r[k] = o[0].v[src];
        }
        return 0;
    }
    default: /* arithmetic and comparisons, broadcast; a scalar operand */
        for (int64_t k = 0; k < total; k++) {
            int64_t a = o[0].v[bidx(os, k, &o[0].s)], b, t;
            if (n->p.has_scalar) {
                b = (int64_t)n->p.scalar;
                if (n->p.scalar_first)
                    t = a, a = b, b = t;
            } else {
                b = o[1].v[bidx(os, k, &o[1].s)];
            }
            if (!arith(n->op, a, b, &r[k]))
                return BAD("node '%s' (%s): %lld %s %lld: %s", n->name, ck_op_name(n->op),
                           (long long)a, ck_op_name(n->op), (long long)b,
                           n->op == CK_OP_DIV && b == 0 ? "division by zero" : "integer overflow");
        }
        return 0;
    }
}

/* range's length from its three scalars. */
static int range_len(const struct ck_model_node *n, const struct opnd *o, int64_t *len)
{
    for (int k = 0; k < 3; k++)
        if (ck_ishape_numel(&o[k].s) != 1)
            return BAD("node '%s' (range): start, limit and delta must be single integers",
                       n->name);
    int64_t st = o[0].v[0], lim = o[1].v[0], dl = o[2].v[0];
    if (dl == 0)
        return BAD("node '%s' (range): delta is 0", n->name);
    /* in double: no overflow, and |limit - start| / delta beyond the cap is refused anyway */
    double c = ceil(((double)lim - (double)st) / (double)dl);
    if (c > (double)CK_INFER_SHAPEVAL_MAX)
        return BAD("node '%s' (range): %.0f values, over the %lld a shape value may hold",
                   n->name, c, (long long)CK_INFER_SHAPEVAL_MAX);
    *len = c > 0 ? (int64_t)c : 0;
    return 0;
}

static int64_t clamp_dim(int64_t v, int64_t r)
{
    v = v < 0 ? v + r : v;
    return v < 0 ? 0 : v > r ? r : v;
}

/* Stores the plan's integers (or, with fvals, floats) for value idx. */
static int store(struct ck_infer *e, int idx, const struct ck_ishape *s, int64_t *ivals,
                 float *fvals)
{
    struct ck_value *v = &e->values[idx];
    int64_t n = ck_ishape_numel(s);
    if (!fvals && !(fvals = malloc(sizeof(float) * (size_t)(n ? n : 1)))) {
        free(ivals);
        return ck_error(CK_ENOMEM, "out of memory for %lld values", (long long)n);
    }
    v->inexact = false;
    for (int64_t k = 0; ivals && k < n; k++) {
        fvals[k] = (float)ivals[k];
        if (ivals[k] > (INT64_C(1) << 24) || ivals[k] < -(INT64_C(1) << 24))
            v->inexact = true;
    }
    free(v->ival);
    free(v->pdata);
    v->shape = *s;
    v->ival = ivals;
    v->pdata = fvals;
    v->data = fvals;
    v->planned = true;
    return 0;
}

static void release_opnds(struct opnd *o, size_t n)
{
    for (size_t k = 0; k < n; k++)
        free(o[k].owned);
    free(o);
}

/* The shapes of the evaluated node n (specialised) from its operands. */
static int eval_shape(const struct ck_model_node *n, const struct opnd *o, size_t nops,
                      struct ck_ishape *os)
{
    struct ck_ishape in[3];
    if (n->op == CK_OP_CONCAT) { /* any number of operands */
        *os = o[0].s;
        int a = ck_infer_norm_axis(ck_op_axis(&n->p, 0), os->rank);
        if (a < 0)
            return BAD("node '%s' (concat): axis out of range for rank %d", n->name, os->rank);
        for (size_t k = 1; k < nops; k++) {
            bool ok = o[k].s.rank == os->rank;
            for (int d = 0; ok && d < os->rank; d++)
                ok = d == a || o[k].s.d[d] == os->d[d];
            if (!ok || !ck_dim_add(os->d[a], o[k].s.d[a], &os->d[a]))
                return BAD("node '%s' (concat): input %zu does not match the others", n->name, k);
        }
        return 0;
    }
    for (size_t k = 0; k < nops && k < 3; k++)
        in[k] = o[k].s;
    return ck_infer_node_shapes(n, in, nops, os);
}

/* A cast of integers to an integer dtype or bool: bool is x != 0; an
 * integer out of the dtype's range is refused naming the node (ONNX leaves
 * it undefined). */
static int cast_range(const struct ck_model_node *n, enum ck_dtype to, int64_t *r, int64_t total)
{
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    switch (to) {
    case CK_DT_I8: lo = INT8_MIN, hi = INT8_MAX; break;
    case CK_DT_I16: lo = INT16_MIN, hi = INT16_MAX; break;
    case CK_DT_I32: lo = INT32_MIN, hi = INT32_MAX; break;
    case CK_DT_U8: lo = 0, hi = UINT8_MAX; break;
    case CK_DT_U16: lo = 0, hi = UINT16_MAX; break;
    case CK_DT_U32: lo = 0, hi = UINT32_MAX; break;
    case CK_DT_U64: lo = 0; break;
    default: break;
    }
    for (int64_t k = 0; k < total; k++) {
        if (to == CK_DT_BOOL)
            r[k] = r[k] != 0;
        else if (r[k] < lo || r[k] > hi)
            return BAD("node '%s' (cast): %lld is out of the range of %s", n->name,
                       (long long)r[k], ck_dtype_name(to));
    }
    return 0;
}

/* Evaluates node i from operands o (all known): 1 when done, 0 when its
 * output is too large to hold as integers (the kernel runs it instead). */
static int evaluate(struct ck_infer *e, size_t i, const struct opnd *o, size_t nops)
{
    const struct ck_model_node *n = ck_infer_node_of(e, i);
    struct ck_enode *en = &e->nodes[i];
    struct ck_ishape os = {0, {0}};
    int err;
    bool as_float = false;
    if (n->op == CK_OP_RANGE) {
        if ((err = range_len(n, o, &os.d[0])) < 0)
            return err;
        os.rank = 1;
    } else if (n->op == CK_OP_CONSTANT_OF_SHAPE) {
        int64_t len = ck_ishape_numel(&o[0].s), tot = 1;
        if (o[0].s.rank > 1 || len < 0 || len > CK_INFER_MAX_RANK)
            return BAD("node '%s' (constant_of_shape): its shape is not a list of at most %d "
                       "dimensions",
                       n->name, CK_INFER_MAX_RANK);
        os.rank = (int)len;
        for (int d = 0; d < os.rank; d++) {
            os.d[d] = o[0].v[d];
            if (os.d[d] < 0 || !ck_dim_mul(tot, os.d[d], &tot) || tot > CK_INFER_NUMEL_MAX)
                return BAD("node '%s' (constant_of_shape): dimension %lld at %d is negative or "
                           "the shape too large",
                           n->name, (long long)os.d[d], d);
        }
        as_float = !(n->p.nints >= 1 && n->p.ints[0] == 1);
        if (!as_float && (!(fabsf(n->p.scalar) < 0x1p62f) || n->p.scalar != truncf(n->p.scalar)))
            return BAD("node '%s' (constant_of_shape): integer value %g is not an integer",
                       n->name, (double)n->p.scalar);
    } else if ((err = eval_shape(n, o, nops, &os)) < 0) {
        return err;
    }
    /* cast (p.ints[0]: ONNX's dtype code, ck_op_cast_dtype): to an integer
     * or bool exact in int64, to a float as a float value */
    enum ck_dtype to = CK_DT_INVALID;
    if (n->op == CK_OP_CAST) {
        to = n->p.nints == 1 ? ck_op_cast_dtype(n->p.ints[0]) : CK_DT_INVALID;
        if (to == CK_DT_INVALID)
            return BAD("node '%s' (cast): needs one dtype (ONNX's code of a number type or bool)",
                       n->name);
        as_float = to != CK_DT_BOOL && !ck_dtype_is_int(to);
    }
    int64_t total = ck_ishape_numel(&os);
    if (total < 0 || total > CK_INFER_SHAPEVAL_MAX) {
        if (n->op == CK_OP_CONSTANT_OF_SHAPE && as_float && total >= 0) {
            float *f = malloc(sizeof(float) * (size_t)(total ? total : 1));
            if (!f)
                return ck_error(CK_ENOMEM, "node '%s': out of memory for %lld values", n->name,
                                (long long)total);
            for (int64_t k = 0; k < total; k++)
                f[k] = n->p.scalar;
            en->planned = true;
            return (err = store(e, en->out[0], &os, NULL, f)) < 0 ? err : 1;
        }
        if (n->op == CK_OP_DIV || n->op == CK_OP_RANGE || n->op == CK_OP_CONSTANT_OF_SHAPE)
            return BAD("node '%s' (%s): %lld integers, over the %lld a shape value may hold",
                       n->name, ck_op_name(n->op), (long long)total,
                       (long long)CK_INFER_SHAPEVAL_MAX);
        return 0; /* moves and comparisons: exact in float32 up to 2^24, the kernel runs */
    }
    int64_t *r = malloc(sizeof(int64_t) * (size_t)(total ? total : 1));
    if (!r)
        return ck_error(CK_ENOMEM, "out of memory for %lld integers", (long long)total);
    if (n->op == CK_OP_RANGE) {
        for (int64_t k = 0; k < total; k++)
            if (!ck_dim_mul(k, o[2].v[0], &r[k]) || !ck_dim_add(r[k], o[0].v[0], &r[k])) {
                free(r);
                return BAD("node '%s' (range): integer overflow", n->name);
            }
    } else if (n->op == CK_OP_CONSTANT_OF_SHAPE) {
        /* the float form's values are p.scalar (below), which need not fit
         * an int64 (fuzz_graph: -1.6e35 converted to a long); the integer
         * form's was checked above */
        for (int64_t k = 0; k < total; k++)
            r[k] = as_float ? 0 : (int64_t)n->p.scalar;
    } else if ((err = eval_values(n, o, nops, &os, r)) < 0) {
        free(r);
        return err;
    }
    if (n->op == CK_OP_CAST && !as_float && (err = cast_range(n, to, r, total)) < 0) {
        free(r);
        return err;
    }
    en->planned = true;
    if (as_float) { /* a cast to float32 or a float constant: a value like any other */
        float *f = malloc(sizeof(float) * (size_t)(total ? total : 1));
        if (!f) {
            free(r);
            return ck_error(CK_ENOMEM, "out of memory");
        }
        for (int64_t k = 0; k < total; k++)
            f[k] = n->op == CK_OP_CONSTANT_OF_SHAPE ? n->p.scalar : (float)r[k];
        free(r);
        if (n->op == CK_OP_CAST) /* float16 and bfloat16: to nearest even */
            ck_infer_round_to(to, f, total);
        return (err = store(e, en->out[0], &os, NULL, f)) < 0 ? err : 1;
    }
    return (err = store(e, en->out[0], &os, r, NULL)) < 0 ? err : 1;
}

/* shape and size: from the input's shape alone. */
static int shape_of(struct ck_infer *e, size_t i)
{
    const struct ck_model_node *n = &e->m->nodes[i];
    const struct ck_ishape *x = &e->values[e->nodes[i].in[0]].shape;
    struct ck_ishape os = {1, {0}};
    int64_t *r = malloc(sizeof(int64_t) * (CK_INFER_MAX_RANK + 1));
    if (!r)
        return ck_error(CK_ENOMEM, "out of memory");
    if (n->op == CK_OP_SIZE) {
        os.rank = 0;
        r[0] = ck_ishape_numel(x);
    } else {
        int64_t st = n->p.nints > 0 ? clamp_dim(n->p.ints[0], x->rank) : 0;
        int64_t en = n->p.nints > 1 ? clamp_dim(n->p.ints[1], x->rank) : x->rank;
        os.d[0] = en > st ? en - st : 0;
        for (int64_t k = 0; k < os.d[0]; k++)
            r[k] = x->d[st + k];
    }
    e->nodes[i].planned = true;
    return store(e, e->nodes[i].out[0], &os, r, NULL);
}

bool ck_infer_params_as_inputs(const struct ck_model_node *n)
{
    return n->ninputs > 1 && (n->op == CK_OP_RESHAPE || n->op == CK_OP_EXPAND ||
                              n->op == CK_OP_TILE || n->op == CK_OP_SLICE ||
                              n->op == CK_OP_TRILU || n->op == CK_OP_RESIZE);
}

/* Whether resize's scales (floats) are known before the run: a graph
 * input's (bound), a weight's, or computed by the plan. */
static bool at_plan(const struct ck_value *v)
{
    return v->data && (v->planned || v->kind != CK_VALUE_NODE);
}

int ck_infer_shapeval_plan(struct ck_infer *e, size_t i, bool *planned)
{
    const struct ck_model_node *n = &e->m->nodes[i];
    struct ck_enode *en = &e->nodes[i];
    size_t nin = en->nin;
    int err = 0;
    *planned = false;
    if (n->op == CK_OP_SHAPE || n->op == CK_OP_SIZE) {
        if ((err = shape_of(e, i)) < 0)
            return err;
        *planned = true;
        return 0;
    }
    bool params = ck_infer_params_as_inputs(n);
    bool always = n->op == CK_OP_RANGE || n->op == CK_OP_CONSTANT_OF_SHAPE;
    if (!params && !always && !evaluates(n->op))
        return 0;
    struct opnd *o = calloc(nin ? nin : 1, sizeof *o);
    if (!o)
        return ck_error(CK_ENOMEM, "out of memory");
    bool all = true, any = false;
    for (size_t k = 0; k < nin; k++) {
        bool yes = false;
        if ((err = known(e, en->in[k], &o[k], &yes)) < 0)
            goto out;
        const struct ck_value *iv = &e->values[en->in[k]];
        bool scales = n->op == CK_OP_RESIZE && k == 1 && at_plan(iv);
        if (!yes && !scales && (always || (params && k > 0)) && iv->kind == CK_VALUE_INPUT &&
            !iv->data) {
            err = 1; /* a check of the shapes alone: known when a run binds the input */
            goto out;
        }
        if (!yes && !scales && (always || (params && k > 0))) {
            err = BAD("node '%s' (%s): input '%s' depends on tensor values, not only on "
                      "shapes: ckptd computes %s from shapes, before the run",
                      n->name, ck_op_name(n->op), n->inputs[k],
                      params ? "a computed shape, repeats or slice bounds" : "it");
            goto out;
        }
        all = all && yes;
        any = any || (yes && e->values[en->in[k]].planned);
    }
    if (params && (err = specialise(e, i, o + 1, nin - 1)) < 0)
        goto out;
    if (params) {
        all = all && o[0].v;
        any = e->values[en->in[0]].planned && o[0].v;
        nin = 1;
    }
    if (n->p.has_scalar && (!(fabsf(n->p.scalar) < 0x1p62f) || n->p.scalar != truncf(n->p.scalar)))
        all = false; /* a float operand: float arithmetic, by the kernel */
    if (always || (all && any && evaluates(n->op))) {
        if ((err = evaluate(e, i, o, nin)) < 0)
            goto out;
        *planned = err == 1;
        err = 0;
    }
out:
    release_opnds(o, en->nin);
    return err;
}

void ck_infer_shapeval_release(struct ck_infer *e)
{
    for (size_t v = 0; v < e->nvalues; v++) {
        struct ck_value *x = &e->values[v];
        if (!x->planned)
            continue;
        free(x->ival);
        free(x->pdata);
        x->ival = NULL;
        x->pdata = NULL;
        x->data = NULL;
        x->planned = x->inexact = false;
    }
    for (size_t i = 0; e->nodes && i < e->m->nnodes; i++) {
        if (e->nodes[i].has_spec)
            free(e->nodes[i].spec.p.ints);
        e->nodes[i].has_spec = e->nodes[i].planned = false;
    }
}

/* shape, size, constant_of_shape and range: the plan evaluates them from
 * shapes; one that reaches a kernel had inputs that are not shapes. */
int ck_infer_k_shapeval(const struct ck_kcall *k)
{
    const struct ck_model_node *n = k->n;
    return BAD("node '%s' (%s): computed from shapes before the run, and its inputs are "
               "not shapes",
               n->name, ck_op_name(n->op));
}
