#include "model/shape.h"
#include "common/error.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the value table: names to shapes, open addressing ---- */

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}

static struct ck_shape_value *find(const struct ck_model_shapes *s, const char *name)
{
    if (!s->nslots)
        return NULL;
    for (size_t i = hash(name) & (s->nslots - 1);; i = (i + 1) & (s->nslots - 1)) {
        size_t v = s->slots[i];
        if (!v)
            return NULL;
        if (!strcmp(s->values[v - 1].name, name))
            return &s->values[v - 1];
    }
}

/* Adds a value (capacity reserved up front). */
static struct ck_shape_value *put(struct ck_model_shapes *s, const char *name, long producer)
{
    struct ck_shape_value *v = &s->values[s->nvalues++];
    memset(v, 0, sizeof *v);
    v->name = name;
    v->producer = producer;
    size_t i = hash(name) & (s->nslots - 1);
    while (s->slots[i])
        i = (i + 1) & (s->nslots - 1);
    s->slots[i] = s->nvalues;
    return v;
}

void ck_model_shapes_release(struct ck_model_shapes *s)
{
    free(s->values);
    free(s->slots);
    memset(s, 0, sizeof *s);
}

const struct ck_shape *ck_model_shape_of(const struct ck_model_shapes *s, const char *value)
{
    const struct ck_shape_value *v = find(s, value);
    return v ? &v->shape : NULL;
}

const char *ck_shape_text(const struct ck_shape *s, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < s->rank && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%" PRId64, i ? ", " : "", s->dims[i]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
    return buf;
}

/* Product of dims [from, to); -1 when one is unknown; saturates at INT64_MAX. */
static int64_t prod(const struct ck_shape *s, int from, int to)
{
    int64_t p = 1;
    for (int i = from; i < to; i++) {
        if (s->dims[i] < 0)
            return -1;
        if (s->dims[i] && p > INT64_MAX / s->dims[i])
            p = INT64_MAX;
        else
            p *= s->dims[i];
    }
    return p;
}

int64_t ck_shape_numel(const struct ck_shape *s)
{
    return prod(s, 0, s->rank);
}

/* ---- per-op rules ---- */

struct ctx {
    const struct ck_model *m;
    struct ck_model_shapes *s;
    size_t node;
    char label[400];
    const struct ck_shape_value *in[8]; /* the first inputs (ops with more read in_at) */
};

static bool is_layers(const struct ck_model *m)
{
    return m->source && !strcmp(m->source, "layers");
}

/* How errors name node i: "layer 2 (dense)" or "node 2 'Affine' (dense)". */
static void node_label(const struct ck_model *m, size_t i, char *buf, size_t len)
{
    const struct ck_model_node *n = &m->nodes[i];
    if (is_layers(m) && !strncmp(n->name, "layer ", 6))
        snprintf(buf, len, "%s (%s)", n->name, ck_op_name(n->op));
    else if (is_layers(m))
        snprintf(buf, len, "layer %zu '%s' (%s)", i, n->name, ck_op_name(n->op));
    else
        snprintf(buf, len, "node %zu '%s' (%s)", i, n->name, ck_op_name(n->op));
}

/* Who made a value: "layer 1", "input 'x'", "weight 'w'". */
static const char *origin(const struct ctx *c, const struct ck_shape_value *v, char *buf,
                          size_t len)
{
    if (v->producer == -1)
        snprintf(buf, len, "input '%s'", v->name);
    else if (v->producer == -2)
        snprintf(buf, len, "weight '%s'", v->name);
    else if (is_layers(c->m) && !strncmp(c->m->nodes[v->producer].name, "layer ", 6))
        snprintf(buf, len, "%s", c->m->nodes[v->producer].name);
    else if (is_layers(c->m))
        snprintf(buf, len, "layer %ld '%s'", v->producer, c->m->nodes[v->producer].name);
    else
        snprintf(buf, len, "node %ld '%s'", v->producer, c->m->nodes[v->producer].name);
    return buf;
}

#define TXT(sh) ck_shape_text((sh), (char[300]){0}, 300)
#define ORIGIN(v) origin(c, (v), (char[300]){0}, 300)

static int fail(const struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(const struct ctx *c, const char *fmt, ...)
{
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ck_error(CK_EFORMAT, "%s: %s", c->label, msg);
}

/* An axis in [-rank, rank) (or [-rank-1, rank] with extra = 1) made non-negative. */
static int norm_axis(const struct ctx *c, int64_t axis, int rank, int extra, int *out)
{
    int64_t a = axis < 0 ? axis + rank + extra : axis;
    *out = 0;
    if (a < 0 || a >= rank + extra)
        return fail(c, "axis %" PRId64 " is out of range for rank %d", axis, rank);
    *out = (int)a;
    return 0;
}

static bool differ(int64_t a, int64_t b)
{
    return a >= 0 && b >= 0 && a != b;
}

static int broadcast(const struct ctx *c, const struct ck_shape *a, const struct ck_shape *b,
                     struct ck_shape *o)
{
    int r = a->rank > b->rank ? a->rank : b->rank;
    o->rank = r;
    for (int i = 0; i < r; i++) {
        int ia = a->rank - r + i, ib = b->rank - r + i;
        int64_t x = ia >= 0 ? a->dims[ia] : 1, y = ib >= 0 ? b->dims[ib] : 1, d;
        if (x == y || y == 1)
            d = x;
        else if (x == 1)
            d = y;
        else if (x < 0 || y < 0)
            d = x < 0 ? y : x;
        else
            return fail(c, "shapes %s ('%s') and %s ('%s') do not broadcast", TXT(a),
                        c->in[0]->name, TXT(b), c->in[1]->name);
        o->dims[i] = d;
    }
    return 0;
}

static int dense(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape, *w = &c->in[1]->shape;
    int a;
    int err = norm_axis(c, ck_op_axis(&n->p, 1), x->rank, 1, &a);
    if (err < 0)
        return err;
    int64_t in = prod(x, a, x->rank), win, outs = 1;
    if (w->rank < 2 || (n->p.trans_w && w->rank != 2))
        return fail(c, "weight '%s' %s is not a matrix (%s)", c->in[1]->name, TXT(w),
                    n->p.trans_w ? "[out, in]" : "[in, out...]");
    win = n->p.trans_w ? w->dims[1] : w->dims[0];
    if (differ(in, win))
        return fail(
            c, "weight '%s' %s expects %" PRId64 " input features, %s gives %" PRId64 " (shape %s)",
            c->in[1]->name, TXT(w), win, ORIGIN(c->in[0]), in, TXT(x));
    o->rank = 0;
    for (int i = 0; i < a; i++)
        o->dims[o->rank++] = x->dims[i];
    if (n->p.trans_w) {
        if (a + 1 > CK_TENSOR_MAX_RANK)
            return fail(c, "output rank over %d", CK_TENSOR_MAX_RANK);
        o->dims[o->rank++] = outs = w->dims[0];
    } else {
        if (a + w->rank - 1 > CK_TENSOR_MAX_RANK)
            return fail(c, "output rank over %d", CK_TENSOR_MAX_RANK);
        for (int i = 1; i < w->rank; i++)
            o->dims[o->rank++] = w->dims[i];
        outs = prod(w, 1, w->rank);
    }
    if (n->ninputs > 2) {
        int64_t nb = ck_shape_numel(&c->in[2]->shape);
        if (differ(nb, outs))
            return fail(c, "bias '%s' %s has %" PRId64 " values, the layer has %" PRId64 " outputs",
                        c->in[2]->name, TXT(&c->in[2]->shape), nb, outs);
    }
    return 0;
}

/* Output size of a window over one spatial dimension. */
static int window(const struct ctx *c, const char *what, int64_t in, int64_t k, int64_t s,
                  int64_t d, int64_t p0, int64_t p1, bool ceil_mode, int64_t *out)
{
    if (k < 1 || s < 1 || d < 1 || p0 < 0 || p1 < 0)
        return fail(c,
                    "%s: kernel %" PRId64 ", stride %" PRId64 ", dilation %" PRId64
                    " and padding %" PRId64 "+%" PRId64 " must be positive",
                    what, k, s, d, p0, p1);
    if (k > INT32_MAX || s > INT32_MAX || d > INT32_MAX || p0 > INT32_MAX || p1 > INT32_MAX ||
        in > (INT64_C(1) << 60))
        return fail(c, "%s: kernel, stride, dilation or padding out of range", what);
    if (in < 0) {
        *out = -1;
        return 0;
    }
    int64_t eff = d * (k - 1) + 1, span = in + p0 + p1;
    if (span < eff)
        return fail(c,
                    "%s: kernel %" PRId64 " (dilated %" PRId64
                    ") is larger than the padded input %" PRId64,
                    what, k, eff, span);
    int64_t o = (span - eff) / s + 1;
    if (ceil_mode) {
        o = (span - eff + s - 1) / s + 1;
        if ((o - 1) * s >= in + p0) /* the last window must start inside the input */
            o--;
    }
    *out = o;
    return 0;
}

static int need_nchw(const struct ctx *c, const struct ck_shape *x)
{
    if (x->rank != 4)
        return fail(c, "input '%s' %s is not NCHW (rank 4)", c->in[0]->name, TXT(x));
    return 0;
}

static int conv2d(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape, *w = &c->in[1]->shape;
    const struct ck_op_params *p = &n->p;
    int err;
    if ((err = need_nchw(c, x)) < 0)
        return err;
    if (w->rank != 4)
        return fail(c, "weight '%s' %s is not [out, in/groups, kh, kw]", c->in[1]->name, TXT(w));
    if (p->groups < 1 || p->groups > INT32_MAX || w->dims[0] % p->groups)
        return fail(c, "groups %" PRId64 " does not divide the %" PRId64 " output channels of '%s'",
                    p->groups, w->dims[0], c->in[1]->name);
    int64_t cin;
    if (__builtin_mul_overflow(w->dims[1], p->groups, &cin))
        return fail(c, "groups %" PRId64 " times %" PRId64 " channels overflows", p->groups,
                    w->dims[1]);
    if (differ(x->dims[1], cin))
        return fail(
            c, "weight '%s' %s expects %" PRId64 " input channels, %s gives %" PRId64 " (shape %s)",
            c->in[1]->name, TXT(w), cin, ORIGIN(c->in[0]), x->dims[1], TXT(x));
    o->rank = 4;
    o->dims[0] = x->dims[0];
    o->dims[1] = w->dims[0];
    if ((err = window(c, "height", x->dims[2], w->dims[2], p->stride[0], p->dilation[0], p->pad[0],
                      p->pad[2], false, &o->dims[2])) < 0 ||
        (err = window(c, "width", x->dims[3], w->dims[3], p->stride[1], p->dilation[1], p->pad[1],
                      p->pad[3], false, &o->dims[3])) < 0)
        return err;
    if (n->ninputs > 2) {
        int64_t nb = ck_shape_numel(&c->in[2]->shape);
        if (differ(nb, w->dims[0]))
            return fail(
                c, "bias '%s' %s has %" PRId64 " values, the layer has %" PRId64 " output channels",
                c->in[2]->name, TXT(&c->in[2]->shape), nb, w->dims[0]);
    }
    return 0;
}

static int pool(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    const struct ck_op_params *p = &n->p;
    int err;
    if ((err = need_nchw(c, x)) < 0)
        return err;
    *o = *x;
    if ((err = window(c, "height", x->dims[2], p->kernel[0], p->stride[0], 1, p->pad[0], p->pad[2],
                      p->ceil_mode, &o->dims[2])) < 0 ||
        (err = window(c, "width", x->dims[3], p->kernel[1], p->stride[1], 1, p->pad[1], p->pad[3],
                      p->ceil_mode, &o->dims[3])) < 0)
        return err;
    return 0;
}

static int matmul(const struct ctx *c, struct ck_shape *o)
{
    struct ck_shape a = c->in[0]->shape, b = c->in[1]->shape, ba, bb, bo;
    bool va = a.rank == 1, vb = b.rank == 1;
    if (a.rank == 0 || b.rank == 0)
        return fail(c, "matmul of a scalar ('%s' %s, '%s' %s)", c->in[0]->name, TXT(&a),
                    c->in[1]->name, TXT(&b));
    if (va)
        a = (struct ck_shape){2, {1, a.dims[0]}};
    if (vb)
        b = (struct ck_shape){2, {b.dims[0], 1}};
    if (differ(a.dims[a.rank - 1], b.dims[b.rank - 2]))
        return fail(c, "inner dimensions differ: '%s' %s x '%s' %s", c->in[0]->name,
                    TXT(&c->in[0]->shape), c->in[1]->name, TXT(&c->in[1]->shape));
    ba = a, bb = b;
    ba.rank -= 2, bb.rank -= 2;
    int err = broadcast(c, &ba, &bb, &bo);
    if (err < 0)
        return err;
    *o = bo;
    if (!va)
        o->dims[o->rank++] = a.dims[a.rank - 2];
    if (!vb)
        o->dims[o->rank++] = b.dims[b.rank - 1];
    return 0;
}

static int transpose(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    bool seen[CK_TENSOR_MAX_RANK] = {0};
    o->rank = x->rank;
    if (!n->p.nints) { /* numpy's default: reverse the axes */
        for (int i = 0; i < x->rank; i++)
            o->dims[i] = x->dims[x->rank - 1 - i];
        return 0;
    }
    if (n->p.nints != (size_t)x->rank)
        return fail(c, "permutation of %zu axes for '%s' %s", n->p.nints, c->in[0]->name, TXT(x));
    for (int i = 0; i < x->rank; i++) {
        int a;
        int err = norm_axis(c, n->p.ints[i], x->rank, 0, &a);
        if (err < 0)
            return err;
        if (seen[a])
            return fail(c, "axis %d appears twice in the permutation", a);
        seen[a] = true;
        o->dims[i] = x->dims[a];
    }
    return 0;
}

static int reshape(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    int infer = -1;
    int64_t known = 1, in_known = 1;
    bool in_unknown = false;
    if (n->p.nints > CK_TENSOR_MAX_RANK)
        return fail(c, "shape of rank %zu", n->p.nints);
    o->rank = (int)n->p.nints;
    /* copied dims (0) that are unknown cancel against the same input dim */
    bool copied[CK_TENSOR_MAX_RANK] = {0};
    for (int i = 0; i < o->rank; i++) {
        int64_t d = n->p.ints[i];
        if (d == 0) {
            if (i >= x->rank)
                return fail(c, "shape %s copies dim %d of '%s' %s, which has none", TXT(o), i,
                            c->in[0]->name, TXT(x));
            d = x->dims[i];
            copied[i] = d < 0;
        } else if (d == -1) {
            if (infer >= 0)
                return fail(c, "more than one -1 in the new shape");
            infer = i;
        } else if (d < -1) {
            return fail(c, "dimension %" PRId64 " in the new shape", d);
        }
        o->dims[i] = d;
        if (i != infer && d >= 0)
            known = d && known > INT64_MAX / d ? INT64_MAX : known * d;
    }
    for (int i = 0; i < x->rank; i++) {
        if (x->dims[i] < 0) {
            if (!(i < o->rank && copied[i]))
                in_unknown = true;
            continue;
        }
        in_known =
            x->dims[i] && in_known > INT64_MAX / x->dims[i] ? INT64_MAX : in_known * x->dims[i];
    }
    if (in_unknown) {
        if (infer >= 0)
            o->dims[infer] = -1;
        return 0;
    }
    if (infer >= 0) {
        if (known == 0 || in_known % known)
            return fail(c, "cannot reshape '%s' %s (%" PRId64 " elements) to %s", c->in[0]->name,
                        TXT(x), in_known, TXT(o));
        o->dims[infer] = in_known / known;
    } else if (known != in_known) {
        return fail(c, "cannot reshape '%s' %s (%" PRId64 " elements) to %s (%" PRId64 ")",
                    c->in[0]->name, TXT(x), in_known, TXT(o), known);
    }
    return 0;
}

static int flatten(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    int a;
    int err = norm_axis(c, ck_op_axis(&n->p, 1), x->rank, 1, &a);
    if (err < 0)
        return err;
    o->rank = 2;
    o->dims[0] = prod(x, 0, a);
    o->dims[1] = prod(x, a, x->rank);
    return 0;
}

static int squeeze(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    bool drop[CK_TENSOR_MAX_RANK] = {0};
    for (size_t i = 0; i < n->p.nints; i++) {
        int a;
        int err = norm_axis(c, n->p.ints[i], x->rank, 0, &a);
        if (err < 0)
            return err;
        if (x->dims[a] > 1 || x->dims[a] == 0)
            return fail(c, "axis %d of '%s' %s is not 1", a, c->in[0]->name, TXT(x));
        drop[a] = true;
    }
    o->rank = 0;
    for (int i = 0; i < x->rank; i++)
        if (!(n->p.nints ? drop[i] : x->dims[i] == 1))
            o->dims[o->rank++] = x->dims[i];
    return 0;
}

static int unsqueeze(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    bool ins[CK_TENSOR_MAX_RANK] = {0};
    int r = x->rank + (int)n->p.nints;
    if (r > CK_TENSOR_MAX_RANK)
        return fail(c, "output rank %d over %d", r, CK_TENSOR_MAX_RANK);
    for (size_t i = 0; i < n->p.nints; i++) {
        int a;
        int err = norm_axis(c, n->p.ints[i], r, 0, &a);
        if (err < 0)
            return err;
        if (ins[a])
            return fail(c, "axis %d appears twice", a);
        ins[a] = true;
    }
    o->rank = r;
    for (int i = 0, k = 0; i < r; i++)
        o->dims[i] = ins[i] ? 1 : x->dims[k++];
    return 0;
}

static const struct ck_shape_value *in_at(const struct ctx *c, const struct ck_model_node *n,
                                          size_t k)
{
    return k < 8 ? c->in[k] : find(c->s, n->inputs[k]);
}

static int concat(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    int a;
    int err = norm_axis(c, ck_op_axis(&n->p, 0), x->rank, 0, &a);
    if (err < 0)
        return err;
    *o = *x;
    for (size_t k = 1; k < n->ninputs; k++) {
        const struct ck_shape_value *v = in_at(c, n, k);
        bool same = v->shape.rank == x->rank;
        for (int i = 0; same && i < x->rank; i++)
            same = i == a || !differ(v->shape.dims[i], x->dims[i]);
        if (!same)
            return fail(c, "'%s' %s does not match '%s' %s outside axis %d", v->name,
                        TXT(&v->shape), c->in[0]->name, TXT(x), a);
        if (o->dims[a] < 0 || v->shape.dims[a] < 0)
            o->dims[a] = -1;
        else if (__builtin_add_overflow(o->dims[a], v->shape.dims[a], &o->dims[a]))
            return fail(c, "axis %d overflows", a);
    }
    return 0;
}

static int split(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    int a;
    int err = norm_axis(c, ck_op_axis(&n->p, 0), x->rank, 0, &a);
    if (err < 0)
        return err;
    int64_t d = x->dims[a], sum = 0;
    if (n->p.nints && n->p.nints != n->noutputs)
        return fail(c, "%zu sizes for %zu outputs", n->p.nints, n->noutputs);
    if (!n->p.nints && d >= 0 && d % (int64_t)n->noutputs)
        return fail(c, "axis %d of '%s' %s does not split into %zu equal parts", a, c->in[0]->name,
                    TXT(x), n->noutputs);
    for (size_t k = 0; k < n->noutputs; k++) {
        o[k] = *x;
        o[k].dims[a] = n->p.nints ? n->p.ints[k] : d < 0 ? -1 : d / (int64_t)n->noutputs;
        if (n->p.nints && n->p.ints[k] < 0)
            return fail(c, "split size %" PRId64, n->p.ints[k]);
        if (o[k].dims[a] > 0 && __builtin_add_overflow(sum, o[k].dims[a], &sum))
            return fail(c, "split sizes overflow");
    }
    if (n->p.nints && d >= 0 && sum != d)
        return fail(c, "split sizes add up to %" PRId64 ", axis %d of '%s' %s is %" PRId64, sum, a,
                    c->in[0]->name, TXT(x), d);
    return 0;
}

static int slice(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    if (n->p.nints % 3 || n->p.nints / 3 > (size_t)x->rank)
        return fail(c, "%zu slice values for rank %d (start, end, step per axis)", n->p.nints,
                    x->rank);
    *o = *x;
    for (size_t i = 0; i < n->p.nints / 3; i++) {
        int64_t d = x->dims[i], st = n->p.ints[3 * i], en = n->p.ints[3 * i + 1],
                step = n->p.ints[3 * i + 2];
        if (step == 0)
            return fail(c, "slice step 0 on axis %zu", i);
        if (d < 0) {
            o->dims[i] = -1;
            continue;
        }
        /* numpy: negative counts from the end, then clamp */
        if (st < 0)
            st += d;
        if (en < 0)
            en += d;
        int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? d : d - 1;
        st = st < lo ? lo : st > hi ? hi : st;
        en = en < lo ? lo : en > hi ? hi : en;
        /* st and en are now within [-1, d]: their difference cannot overflow */
        int64_t diff = step > 0 ? en - st : st - en, len = 0;
        if (diff > 0)
            len = step == INT64_MIN ? 1 : (diff - 1) / (step > 0 ? step : -step) + 1;
        o->dims[i] = len;
    }
    return 0;
}

static int per_channel(const struct ctx *c, const struct ck_model_node *n, int64_t want,
                       const char *what, size_t from)
{
    static const char *const bn[] = {"x", "gamma", "beta", "mean", "var"};
    for (size_t k = from; k < n->ninputs && k < 5; k++) {
        int64_t nv = ck_shape_numel(&c->in[k]->shape);
        if (differ(nv, want))
            return fail(c, "%s '%s' %s has %" PRId64 " values, %s gives %" PRId64 " %s", bn[k],
                        c->in[k]->name, TXT(&c->in[k]->shape), nv, ORIGIN(c->in[0]), want, what);
    }
    return 0;
}

static int gather(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *t = &c->in[0]->shape, *ix = &c->in[1]->shape;
    int a;
    int err = norm_axis(c, ck_op_axis(&n->p, 0), t->rank, 0, &a);
    if (err < 0)
        return err;
    if (t->rank - 1 + ix->rank > CK_TENSOR_MAX_RANK)
        return fail(c, "output rank over %d", CK_TENSOR_MAX_RANK);
    o->rank = 0;
    for (int i = 0; i < a; i++)
        o->dims[o->rank++] = t->dims[i];
    for (int i = 0; i < ix->rank; i++)
        o->dims[o->rank++] = ix->dims[i];
    for (int i = a + 1; i < t->rank; i++)
        o->dims[o->rank++] = t->dims[i];
    return 0;
}

static int reduce(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    bool red[CK_TENSOR_MAX_RANK] = {0};
    for (size_t i = 0; i < n->p.nints; i++) {
        int a;
        int err = norm_axis(c, n->p.ints[i], x->rank, 0, &a);
        if (err < 0)
            return err;
        red[a] = true;
    }
    o->rank = 0;
    for (int i = 0; i < x->rank; i++) {
        bool r = !n->p.nints || red[i];
        if (!r)
            o->dims[o->rank++] = x->dims[i];
        else if (n->p.keepdims)
            o->dims[o->rank++] = 1;
    }
    return 0;
}

static int pad(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    if (n->p.nints % 2 || n->p.nints / 2 > (size_t)x->rank)
        return fail(c, "%zu pad values for rank %d (before, after per axis)", n->p.nints, x->rank);
    *o = *x;
    for (size_t i = 0; i < n->p.nints / 2; i++) {
        if (x->dims[i] < 0)
            continue;
        int64_t d;
        if (__builtin_add_overflow(x->dims[i], n->p.ints[2 * i], &d) ||
            __builtin_add_overflow(d, n->p.ints[2 * i + 1], &d))
            return fail(c, "padding overflows axis %zu", i);
        if (d < 0)
            return fail(c, "padding leaves axis %zu with %" PRId64 " elements", i, d);
        o->dims[i] = d;
    }
    return 0;
}

/* H' = stride (H - 1) + output_padding + dilation (kh - 1) + 1 - pad_top - pad_bottom */
static int conv_transpose(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape, *w = &c->in[1]->shape;
    int64_t g = n->p.groups;
    if (x->rank != 4 || w->rank != 4)
        return fail(c, "input %s and weight %s are not 4-D", TXT(x), TXT(w));
    if (g < 1 || (x->dims[1] >= 0 && x->dims[1] != w->dims[0]) || w->dims[1] > (INT64_C(1) << 30) ||
        g > (INT64_C(1) << 20))
        return fail(c, "weight %s does not take the %" PRId64 " input channels", TXT(w),
                    x->dims[1]);
    *o = *x;
    o->dims[1] = w->dims[1] * g;
    for (int i = 0; i < 2; i++) {
        int64_t in = x->dims[2 + i], k = w->dims[2 + i], s = n->p.stride[i], d = n->p.dilation[i];
        int64_t op = n->p.nints == 2 ? n->p.ints[i] : 0, lim = INT64_C(1) << 30;
        if (s < 1 || d < 1 || s > lim || d > lim || k > lim || op < 0 || op > lim ||
            n->p.pad[i] < -lim || n->p.pad[i] > lim || n->p.pad[i + 2] < -lim ||
            n->p.pad[i + 2] > lim || in > lim)
            return fail(c, "stride, dilation, padding or size out of range");
        if (in < 0) {
            o->dims[2 + i] = -1;
            continue;
        }
        int64_t out = s * (in - 1) + op + d * (k - 1) + 1 - n->p.pad[i] - n->p.pad[i + 2];
        if (out < 1)
            return fail(c, "output extent %" PRId64 " is not positive", out);
        o->dims[2 + i] = out;
    }
    return 0;
}

/* rnn, gru, lstm: X [T, batch, I] (layout 1: [batch, T, I]) -> Y [T, D,
 * batch, H] ([batch, T, D, H]), Y_h and Y_c [D, batch, H] ([batch, D, H]). */
static int recurrent(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape, *w = &c->in[1]->shape;
    if (n->p.nints != 5 || x->rank != 3 || w->rank != 3 || n->noutputs > 3)
        return fail(c, "needs X and W of rank 3, and its 5 parameters");
    int64_t d = n->p.ints[0] == 2 ? 2 : 1, h = n->p.ints[1];
    bool l1 = n->p.ints[3] != 0;
    int64_t t = x->dims[l1 ? 1 : 0], b = x->dims[l1 ? 0 : 1];
    if (h < 1 || w->dims[0] != d)
        return fail(c, "weight %s does not have %" PRId64 " directions", TXT(w), d);
    o[0].rank = 4;
    int64_t y0[4] = {t, d, b, h}, y1[4] = {b, t, d, h};
    memcpy(o[0].dims, l1 ? y1 : y0, sizeof y0);
    for (size_t k = 1; k < n->noutputs; k++) {
        int64_t s0[3] = {d, b, h}, s1[3] = {b, d, h};
        o[k].rank = 3;
        memcpy(o[k].dims, l1 ? s1 : s0, sizeof s0);
    }
    return 0;
}

/* numpy broadcasting of a and b into o (unknown dims as broadcast()); false
 * when they do not broadcast. The caller names the values: broadcast()'s
 * message names inputs 0 and 1, which expand does not have. */
static bool broadcasts(const struct ck_shape *a, const struct ck_shape *b, struct ck_shape *o)
{
    int r = a->rank > b->rank ? a->rank : b->rank;
    for (int i = 0; i < r; i++) {
        int ia = a->rank - r + i, ib = b->rank - r + i;
        int64_t x = ia >= 0 ? a->dims[ia] : 1, y = ib >= 0 ? b->dims[ib] : 1;
        if (x != y && x != 1 && y != 1 && x >= 0 && y >= 0)
            return false;
        o->dims[i] = x == y || y == 1 ? x : x == 1 ? y : x < 0 ? y : x;
    }
    o->rank = r;
    return true;
}

/* where, the comparisons and logical ops, expand, tile, trilu, cumsum */
static int selection(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    struct ck_shape t;
    int a, err;
    switch (n->op) {
    case CK_OP_NOT:
        *o = *x;
        return 0;
    case CK_OP_WHERE:
        if (!broadcasts(&c->in[1]->shape, &c->in[2]->shape, &t) || !broadcasts(x, &t, o))
            return fail(c, "condition '%s' %s, '%s' %s and '%s' %s do not broadcast",
                        c->in[0]->name, TXT(x), c->in[1]->name, TXT(&c->in[1]->shape),
                        c->in[2]->name, TXT(&c->in[2]->shape));
        return 0;
    case CK_OP_EXPAND:
        if (n->p.nints > CK_TENSOR_MAX_RANK)
            return fail(c, "a shape of rank %zu", n->p.nints);
        t.rank = (int)n->p.nints;
        for (size_t i = 0; i < n->p.nints; i++) {
            if (n->p.ints[i] < 0)
                return fail(c, "dimension %" PRId64 " of the shape is negative", n->p.ints[i]);
            t.dims[i] = n->p.ints[i];
        }
        if (!broadcasts(x, &t, o))
            return fail(c, "input '%s' %s does not broadcast with the shape %s", c->in[0]->name,
                        TXT(x), TXT(&t));
        return 0;
    case CK_OP_TILE:
        if (n->p.nints != (size_t)x->rank)
            return fail(c, "%zu repeats for input '%s' %s", n->p.nints, c->in[0]->name, TXT(x));
        *o = *x;
        for (int i = 0; i < x->rank; i++) {
            if (n->p.ints[i] < 0)
                return fail(c, "repeat %" PRId64 " of axis %d is negative", n->p.ints[i], i);
            if (x->dims[i] >= 0 && __builtin_mul_overflow(x->dims[i], n->p.ints[i], &o->dims[i]))
                return fail(c, "repeating axis %d overflows", i);
        }
        return 0;
    case CK_OP_TRILU:
        if (x->rank < 2 || n->p.nints != 2)
            return fail(c, "input '%s' %s is not [..., N, M], or upper and k are missing",
                        c->in[0]->name, TXT(x));
        *o = *x;
        return 0;
    case CK_OP_CUMSUM:
        if (n->p.nints != 3)
            return fail(c, "needs an axis, exclusive and reverse");
        if ((err = norm_axis(c, n->p.ints[0], x->rank, 0, &a)) < 0)
            return err;
        *o = *x;
        return 0;
    case CK_OP_ARGMAX:
    case CK_OP_ARGMIN:
        if ((err = norm_axis(c, ck_op_axis(&n->p, 0), x->rank, 0, &a)) < 0)
            return err;
        *o = *x;
        if (n->p.keepdims) {
            o->dims[a] = 1;
        } else {
            for (int i = a; i + 1 < x->rank; i++)
                o->dims[i] = x->dims[i + 1];
            o->rank--;
        }
        return 0;
    case CK_OP_RESIZE:
        if (n->p.nints != 4 + 2 * (size_t)x->rank)
            return fail(c, "%zu parameters for input '%s' %s (4, then size and scale per axis)",
                        n->p.nints, c->in[0]->name, TXT(x));
        *o = *x;
        for (int i = 0; i < x->rank; i++) {
            int64_t size = n->p.ints[4 + 2 * i], bits = n->p.ints[5 + 2 * i];
            float s;
            uint32_t b32 = (uint32_t)bits;
            memcpy(&s, &b32, 4);
            if (bits == 0) {
                o->dims[i] = size;
            } else if (bits < 0 || bits > UINT32_MAX || !(s > 0 && s <= 1e6f)) {
                return fail(c, "the scale of axis %d is not a positive float32", i);
            } else if (x->dims[i] >= 0) {
                double d = (double)x->dims[i] * (double)s;
                if (d > 0x1p40)
                    return fail(c, "axis %d grows past 2^40", i);
                o->dims[i] = (int64_t)d;
            }
        }
        return 0;
    case CK_OP_GATHER_ELEMENTS:
        if ((err = norm_axis(c, ck_op_axis(&n->p, 0), x->rank, 0, &a)) < 0)
            return err;
        if (c->in[1]->shape.rank != x->rank)
            return fail(c, "indices '%s' %s do not have the rank of '%s' %s", c->in[1]->name,
                        TXT(&c->in[1]->shape), c->in[0]->name, TXT(x));
        *o = c->in[1]->shape;
        return 0;
    default: /* the comparisons and and, or, xor */
        return broadcast(c, x, &c->in[1]->shape, o);
    }
}

/* The length of a 1-D shape value given as input k (a computed shape: its
 * values are known only when the engine plans a run), as the rank it gives. */
static int computed_rank(const struct ctx *c, size_t k, int *rank)
{
    const struct ck_shape *s = &c->in[k]->shape;
    if (s->rank != 1 || s->dims[0] < 0 || s->dims[0] > CK_TENSOR_MAX_RANK)
        return fail(c, "the computed shape '%s' %s is not a list of at most %d dimensions",
                    c->in[k]->name, TXT(s), CK_TENSOR_MAX_RANK);
    *rank = (int)s->dims[0];
    return 0;
}

/* Shape values (docs/model.md): what depends on their values is unknown (-1)
 * here; the engine computes it when it plans a run. */
static int shape_value_op(const struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    int r = 0, err;
    switch (n->op) {
    case CK_OP_SHAPE: {
        int64_t st = n->p.nints > 0 ? n->p.ints[0] : 0, en = n->p.nints > 1 ? n->p.ints[1] : x->rank;
        st = st < 0 ? st + x->rank : st, en = en < 0 ? en + x->rank : en;
        st = st < 0 ? 0 : st > x->rank ? x->rank : st, en = en < st ? st : en > x->rank ? x->rank : en;
        o->rank = 1;
        o->dims[0] = en - st;
        return 0;
    }
    case CK_OP_SIZE:
        o->rank = 0;
        return 0;
    case CK_OP_CAST:
        *o = *x;
        return 0;
    case CK_OP_RANGE:
        o->rank = 1;
        o->dims[0] = -1;
        return 0;
    case CK_OP_CONSTANT_OF_SHAPE:
    case CK_OP_RESHAPE:
        if ((err = computed_rank(c, n->op == CK_OP_RESHAPE ? 1 : 0, &r)) < 0)
            return err;
        break;
    case CK_OP_EXPAND:
        if ((err = computed_rank(c, 1, &r)) < 0)
            return err;
        r = r > x->rank ? r : x->rank;
        break;
    case CK_OP_TRILU:
        *o = *x;
        return 0;
    default: /* tile, slice, resize: the input's rank */
        r = x->rank;
        break;
    }
    o->rank = r;
    for (int i = 0; i < r; i++)
        o->dims[i] = -1;
    return 0;
}

static bool is_shape_value_op(const struct ck_model_node *n)
{
    return n->op == CK_OP_SHAPE || n->op == CK_OP_SIZE || n->op == CK_OP_CAST ||
           n->op == CK_OP_RANGE || n->op == CK_OP_CONSTANT_OF_SHAPE ||
           (n->ninputs > 1 && (n->op == CK_OP_RESHAPE || n->op == CK_OP_EXPAND ||
                               n->op == CK_OP_TILE || n->op == CK_OP_SLICE ||
                               n->op == CK_OP_TRILU || n->op == CK_OP_RESIZE));
}

static int infer(struct ctx *c, const struct ck_model_node *n, struct ck_shape *o)
{
    const struct ck_shape *x = &c->in[0]->shape;
    int a, err;
    if (!ck_op_is_multi_output(n->op) && n->noutputs != 1)
        return fail(c, "%zu outputs, expected 1", n->noutputs);
    if (is_shape_value_op(n))
        return shape_value_op(c, n, o);
    switch (n->op) {
    case CK_OP_DENSE:
        return dense(c, n, o);
    case CK_OP_CONV2D:
        return conv2d(c, n, o);
    case CK_OP_MAXPOOL:
    case CK_OP_AVGPOOL:
        return pool(c, n, o);
    case CK_OP_GLOBAL_AVGPOOL:
    case CK_OP_GLOBAL_MAXPOOL:
        if (x->rank < 3)
            return fail(c, "input '%s' %s has no spatial dimensions", c->in[0]->name, TXT(x));
        *o = *x;
        for (int i = 2; i < x->rank; i++)
            o->dims[i] = 1;
        return 0;
    case CK_OP_SOFTMAX:
    case CK_OP_LOG_SOFTMAX:
        if ((err = norm_axis(c, ck_op_axis(&n->p, -1), x->rank, 0, &a)) < 0)
            return err;
        *o = *x;
        return 0;
    case CK_OP_ADD:
    case CK_OP_SUB:
    case CK_OP_MUL:
    case CK_OP_DIV:
    case CK_OP_POW:
        if (n->p.has_scalar) {
            *o = *x;
            return 0;
        }
        return broadcast(c, x, &c->in[1]->shape, o);
    case CK_OP_MAX:
    case CK_OP_MIN:
    case CK_OP_PRELU:
    case CK_OP_FMOD:
        return broadcast(c, x, &c->in[1]->shape, o);
    case CK_OP_CONV_TRANSPOSE2D:
        return conv_transpose(c, n, o);
    case CK_OP_GRID_SAMPLE: {
        const struct ck_shape *g = &c->in[1]->shape;
        if (x->rank != 4 || g->rank != 4 || g->dims[3] != 2)
            return fail(c, "input %s and grid %s are not [N, C, H, W] and [N, Ho, Wo, 2]", TXT(x),
                        TXT(g));
        *o = *x;
        o->dims[2] = g->dims[1];
        o->dims[3] = g->dims[2];
        return 0;
    }
    case CK_OP_RNN:
    case CK_OP_GRU:
    case CK_OP_LSTM:
        return recurrent(c, n, o);
    case CK_OP_DET:
        if (x->rank < 2 || x->dims[x->rank - 1] != x->dims[x->rank - 2])
            return fail(c, "input '%s' %s is not a stack of square matrices", c->in[0]->name,
                        TXT(x));
        *o = *x;
        o->rank -= 2;
        return 0;
    case CK_OP_LRN:
        if (x->rank < 2 || n->p.nints != 1 || n->p.ints[0] < 1)
            return fail(c, "input '%s' %s has no channels, or no size", c->in[0]->name, TXT(x));
        *o = *x;
        return 0;
    case CK_OP_HARDMAX:
        if ((err = norm_axis(c, ck_op_axis(&n->p, -1), x->rank, 0, &a)) < 0)
            return err;
        *o = *x;
        return 0;
    case CK_OP_INSTANCENORM:
        if (x->rank < 3)
            return fail(c, "input '%s' %s has no spatial dimensions", c->in[0]->name, TXT(x));
        if ((err = per_channel(c, n, x->dims[1], "channels", 1)) < 0)
            return err;
        *o = *x;
        return 0;
    case CK_OP_MATMUL:
        return matmul(c, o);
    case CK_OP_TRANSPOSE:
        return transpose(c, n, o);
    case CK_OP_RESHAPE:
        return reshape(c, n, o);
    case CK_OP_FLATTEN:
        return flatten(c, n, o);
    case CK_OP_SQUEEZE:
        return squeeze(c, n, o);
    case CK_OP_UNSQUEEZE:
        return unsqueeze(c, n, o);
    case CK_OP_CONCAT:
        return concat(c, n, o);
    case CK_OP_SPLIT:
        return split(c, n, o);
    case CK_OP_SLICE:
        return slice(c, n, o);
    case CK_OP_BATCHNORM:
        if ((err = norm_axis(c, ck_op_axis(&n->p, 1), x->rank, 0, &a)) < 0 ||
            (err = per_channel(c, n, x->dims[a], "channels", 1)) < 0)
            return err;
        *o = *x;
        return 0;
    case CK_OP_LAYERNORM:
        if ((err = norm_axis(c, ck_op_axis(&n->p, -1), x->rank, 0, &a)) < 0 ||
            (err = per_channel(c, n, prod(x, a, x->rank), "normalised values", 1)) < 0)
            return err;
        *o = *x;
        return 0;
    case CK_OP_GATHER:
        return gather(c, n, o);
    case CK_OP_REDUCE_MEAN:
    case CK_OP_REDUCE_SUM:
    case CK_OP_REDUCE_MAX:
    case CK_OP_REDUCE_MIN:
    case CK_OP_REDUCE_PROD:
    case CK_OP_REDUCE_SUM_SQUARE:
    case CK_OP_REDUCE_LOG_SUM:
    case CK_OP_REDUCE_LOG_SUM_EXP:
    case CK_OP_REDUCE_L1:
    case CK_OP_REDUCE_L2:
        return reduce(c, n, o);
    case CK_OP_PAD:
        return pad(c, n, o);
    case CK_OP_TOPK: /* values and indices: the axis cut to k */
        if (n->p.nints != 3 || n->noutputs != 2 || n->p.ints[0] < 0)
            return fail(c, "needs k, largest, sorted and two outputs");
        if ((err = norm_axis(c, ck_op_axis(&n->p, -1), x->rank, 0, &a)) < 0)
            return err;
        if (x->dims[a] >= 0 && n->p.ints[0] > x->dims[a])
            return fail(c, "k %" PRId64 " is larger than axis %d of input '%s' %s", n->p.ints[0],
                        a, c->in[0]->name, TXT(x));
        o[0] = o[1] = *x;
        o[0].dims[a] = o[1].dims[a] = n->p.ints[0];
        return 0;
    default:
        if (n->op >= CK_OP_WHERE && n->op <= CK_OP_RESIZE)
            return selection(c, n, o); /* elementwise: identity, activations, sqrt, exp, log, neg, erf, clip */
        *o = *x;
        return 0;
    }
}

static int weight_shape(const struct ck_tensor *t, struct ck_shape *o)
{
    o->rank = t->rank;
    memcpy(o->dims, t->dims, (size_t)t->rank * sizeof *t->dims);
    return 0;
}

int ck_model_infer_shapes(const struct ck_model *m, struct ck_model_shapes *out)
{
    struct ctx c = {.m = m, .s = out};
    size_t cap = m->ninputs + (m->weights ? m->weights->ntensors : 0);
    int err;
    memset(out, 0, sizeof *out);
    if ((err = ck_model_check(m)) < 0)
        return err;
    for (size_t i = 0; i < m->nnodes; i++)
        cap += m->nodes[i].noutputs;
    out->nslots = 16;
    while (out->nslots < 2 * cap)
        out->nslots *= 2;
    out->values = calloc(cap ? cap : 1, sizeof *out->values);
    out->slots = calloc(out->nslots, sizeof *out->slots);
    if (!out->values || !out->slots) {
        ck_model_shapes_release(out);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; m->weights && i < m->weights->ntensors; i++) {
        const struct ck_tensor *t = &m->weights->tensors[i];
        if (!find(out, t->name))
            weight_shape(t, &put(out, t->name, -2)->shape);
    }
    for (size_t i = 0; i < m->ninputs; i++) {
        const struct ck_model_io *io = &m->inputs[i];
        if (find(out, io->name)) {
            ck_model_shapes_release(out);
            return ck_error(CK_EFORMAT, "graph input '%s' is also a weight", io->name);
        }
        struct ck_shape_value *v = put(out, io->name, -1);
        v->shape.rank = io->rank;
        memcpy(v->shape.dims, io->dims, (size_t)io->rank * sizeof *io->dims);
    }
    size_t most = 1; /* the most outputs of a node: a split's shapes, computed at once */
    for (size_t i = 0; i < m->nnodes; i++)
        most = m->nodes[i].noutputs > most ? m->nodes[i].noutputs : most;
    struct ck_shape *o = calloc(most, sizeof *o);
    if (!o) {
        err = ck_error(CK_ENOMEM, "out of memory for the shapes of %zu outputs", most);
        goto fail;
    }
    for (size_t i = 0; i < m->nnodes; i++) {
        const struct ck_model_node *n = &m->nodes[i];
        c.node = i;
        node_label(m, i, c.label, sizeof c.label);
        for (size_t k = 0; k < n->ninputs && k < 8; k++)
            c.in[k] = find(out, n->inputs[k]); /* ck_model_check: all defined */
        memset(o, 0, sizeof o[0] * (n->noutputs ? n->noutputs : 1));
        if ((err = infer(&c, n, o)) < 0) {
            free(o);
            goto fail;
        }
        for (size_t k = 0; k < n->noutputs; k++) {
            if (find(out, n->outputs[k])) {
                err = ck_error(CK_EFORMAT, "%s: output '%s' is already defined", c.label,
                               n->outputs[k]);
                free(o);
                goto fail;
            }
            put(out, n->outputs[k], (long)i)->shape = o[k];
        }
    }
    free(o);
    for (size_t i = 0; i < m->noutputs; i++) {
        const struct ck_model_io *io = &m->outputs[i];
        const struct ck_shape *s = ck_model_shape_of(out, io->name);
        bool same = s && (io->rank == 0 || s->rank == io->rank);
        for (int k = 0; same && io->rank && k < io->rank; k++)
            same = !differ(s->dims[k], io->dims[k]);
        if (!same) {
            struct ck_shape d = {.rank = io->rank};
            memcpy(d.dims, io->dims, (size_t)io->rank * sizeof *io->dims);
            err = ck_error(CK_EFORMAT, "graph output '%s' is declared %s, the graph computes %s",
                           io->name, TXT(&d), s ? TXT(s) : "nothing");
            goto fail;
        }
    }
    return 0;
fail:
    ck_model_shapes_release(out);
    return err;
}
