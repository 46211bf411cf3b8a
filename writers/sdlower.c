#include "writers/sdlower.h"

#include "common/error.h"
#include "common/strset.h"
#include "model/shape.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPEN_END INT64_MAX /* a slice to the end of its axis (strided_slice's end mask) */
#define DL4J_INT_MAX INT64_C(2147483647) /* libnd4j keeps pads and slice bounds in an int */

struct low {
    const struct ck_model *src;
    const char *label;
    struct ck_sdlower *out;
    size_t caprows;
    struct ck_model_shapes shapes;
    int shapes_state; /* 0 not computed, 1 computed, -1 failed (why in shapes_why) */
    char shapes_why[512];
};

/* "<node>/<what>" (what is printf-formatted) into *out, owned by the caller. */
static int sub_name(char **out, const struct ck_model_node *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int sub_name(char **out, const struct ck_model_node *n, const char *fmt, ...)
{
    char what[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (asprintf(out, "%s/%s", n->name, what) < 0) {
        *out = NULL;
        return ck_error(CK_ENOMEM, "out of memory");
    }
    return 0;
}

/* Appends a node: params copied from p (with its ints), these inputs and
 * outputs, and its DL4J op (row, or the op's own row when NULL). */
static int emit(struct low *l, const char *name, enum ck_op op, const struct ck_op_params *p,
                const char *const *ins, size_t nin, const char *const *outs, size_t nout,
                const struct ck_dl4j_op *row)
{
    struct ck_sdlower *o = l->out;
    struct ck_model_node *mn;
    int err;
    if (o->m->nnodes == l->caprows) {
        size_t cap = l->caprows ? 2 * l->caprows : 64;
        const struct ck_dl4j_op **r = realloc(o->rows, cap * sizeof *r);
        if (!r)
            return ck_error(CK_ENOMEM, "out of memory");
        o->rows = r;
        l->caprows = cap;
    }
    if ((err = ck_model_add_node(o->m, name, op, &mn)) < 0)
        return err;
    mn->p = *p;
    mn->p.ints = NULL;
    mn->p.nints = 0;
    if (p->nints && (err = ck_model_node_set_ints(mn, p->ints, p->nints)) < 0)
        return err;
    for (size_t i = 0; i < nin; i++)
        if ((err = ck_model_node_add_input(mn, ins[i])) < 0)
            return err;
    for (size_t i = 0; i < nout; i++)
        if ((err = ck_model_node_add_output(mn, outs[i])) < 0)
            return err;
    if (!row && (err = ck_dl4j_for_node(mn, &row)) < 0)
        return ck_error_wrap(err, "'%s'", l->label);
    o->rows[o->m->nnodes - 1] = row;
    return 0;
}

static int emit_copy(struct low *l, const struct ck_model_node *n)
{
    return emit(l, n->name, n->op, &n->p, (const char *const *)n->inputs, n->ninputs,
                (const char *const *)n->outputs, n->noutputs, NULL);
}

/* One node of op on one input with params p: value name out. */
static int emit1(struct low *l, const char *name, enum ck_op op, const struct ck_op_params *p,
                 const char *in, const char *out)
{
    return emit(l, name, op, p, &in, 1, &out, 1, NULL);
}

static int refuse(const struct low *l, const struct ck_model_node *n, const char *why)
{
    return ck_error(CK_EFORMAT, "'%s': node '%s': op '%s' with %s has no DL4J equivalent", l->label,
                    n->name, ck_op_name(n->op), why);
}

/* x op scalar (a scalar variant: mul_scalar, div_scalar, add_scalar). */
static struct ck_op_params scalar_params(float v)
{
    struct ck_op_params p;
    ck_op_params_init(&p);
    p.has_scalar = true;
    p.scalar = v;
    return p;
}

/* hard_sigmoid: clip(alpha x + beta, 0, 1); hard_swish: x clip(x / 6 + 1/2, 0, 1). */
static int lower_hard(struct low *l, const struct ck_model_node *n, bool swish)
{
    char *scaled = NULL, *shifted = NULL, *gate = NULL;
    int err;
    if (n->ninputs != 1 || n->noutputs != 1)
        return ck_error(CK_EFORMAT, "'%s': node '%s': op '%s' takes one input and one output",
                        l->label, n->name, ck_op_name(n->op));
    struct ck_op_params mul = scalar_params(swish ? 6.0f : n->p.alpha);
    struct ck_op_params add = scalar_params(swish ? 0.5f : n->p.beta);
    struct ck_op_params clip;
    ck_op_params_init(&clip);
    clip.min = 0;
    clip.max = 1;
    if ((err = sub_name(&scaled, n, "scaled")) < 0 ||
        (err = sub_name(&shifted, n, "shifted")) < 0 ||
        (swish && (err = sub_name(&gate, n, "gate")) < 0))
        goto out;
    const char *x = n->inputs[0], *y = n->outputs[0];
    if ((err = emit1(l, scaled, swish ? CK_OP_DIV : CK_OP_MUL, &mul, x, scaled)) < 0 ||
        (err = emit1(l, shifted, CK_OP_ADD, &add, scaled, shifted)) < 0 ||
        (err = emit1(l, swish ? gate : n->name, CK_OP_CLIP, &clip, shifted, swish ? gate : y)) < 0)
        goto out;
    if (swish) {
        struct ck_op_params p;
        ck_op_params_init(&p);
        const char *ins[2] = {x, gate};
        err = emit(l, n->name, CK_OP_MUL, &p, ins, 2, &y, 1, NULL);
    }
out:
    free(scaled), free(shifted), free(gate);
    return err;
}

/* groups == input channels: W [iC mC, 1, kh, kw] is [iC, mC, kh, kw] in
 * memory; DL4J's wFormat 1 wants [mC, iC, kh, kw]: a reshape, and for
 * mC > 1 a permute (1, 0, 2, 3). */
static int lower_depthwise(struct low *l, const struct ck_model_node *n, const struct ck_tensor *w)
{
    int64_t g = n->p.groups, mc = w->dims[0] / g;
    char *shaped = NULL, *perm = NULL;
    int err;
    struct ck_op_params rp, pp, cp = n->p;
    ck_op_params_init(&rp);
    ck_op_params_init(&pp);
    int64_t shape[4] = {mc > 1 ? g : 1, mc > 1 ? mc : g, w->dims[2], w->dims[3]};
    static const int64_t swap[4] = {1, 0, 2, 3};
    rp.ints = shape;
    rp.nints = 4;
    pp.ints = (int64_t *)swap;
    pp.nints = 4;
    if ((err = sub_name(&shaped, n, mc > 1 ? "weights_iC_mC" : "weights_dl4j")) < 0 ||
        (mc > 1 && (err = sub_name(&perm, n, "weights_dl4j")) < 0))
        goto out;
    if ((err = emit1(l, shaped, CK_OP_RESHAPE, &rp, n->inputs[1], shaped)) < 0 ||
        (mc > 1 && (err = emit1(l, perm, CK_OP_TRANSPOSE, &pp, shaped, perm)) < 0))
        goto out;
    const char *ins[3] = {n->inputs[0], mc > 1 ? perm : shaped, n->ninputs > 2 ? n->inputs[2] : ""};
    cp.ints = NULL;
    cp.nints = 0;
    cp.kernel[0] = w->dims[2];
    cp.kernel[1] = w->dims[3];
    err = emit(l, n->name, CK_OP_CONV2D, &cp, ins, n->ninputs > 2 ? 3 : 2,
               (const char *const *)n->outputs, n->noutputs, ck_dl4j_by_name("depthwise_conv2d"));
out:
    free(shaped), free(perm);
    return err;
}

/* Other groups: per group g, x[:, g Cg:(g+1) Cg], W[g Og:(g+1) Og] and the
 * bias' part through conv2d; the groups' outputs concatenated on axis 1. */
static int lower_split_groups(struct low *l, const struct ck_model_node *n,
                              const struct ck_tensor *w)
{
    int64_t g = n->p.groups, cg = w->dims[1], og = w->dims[0] / g;
    char **names = calloc((size_t)g * 4 + 1, sizeof *names);
    int err = 0;
    if (!names)
        return ck_error(CK_ENOMEM, "out of memory for %" PRId64 " groups", g);
    struct ck_op_params conv = n->p;
    conv.ints = NULL;
    conv.nints = 0;
    conv.groups = 1;
    conv.kernel[0] = w->dims[2];
    conv.kernel[1] = w->dims[3];
    for (int64_t k = 0; k < g && err >= 0; k++) {
        char **v = names + 4 * k; /* x part, W part, b part, y part */
        int64_t xs[6] = {0, OPEN_END, 1, k * cg, (k + 1) * cg, 1};
        int64_t ws[3] = {k * og, (k + 1) * og, 1};
        struct ck_op_params px, pw;
        ck_op_params_init(&px);
        ck_op_params_init(&pw);
        px.ints = xs;
        px.nints = 6;
        pw.ints = ws;
        pw.nints = 3;
        if ((err = sub_name(&v[0], n, "x_group%" PRId64, k)) < 0 ||
            (err = sub_name(&v[1], n, "weights_group%" PRId64, k)) < 0 ||
            (n->ninputs > 2 && (err = sub_name(&v[2], n, "bias_group%" PRId64, k)) < 0) ||
            (err = sub_name(&v[3], n, "y_group%" PRId64, k)) < 0)
            break;
        if ((err = emit1(l, v[0], CK_OP_SLICE, &px, n->inputs[0], v[0])) < 0 ||
            (err = emit1(l, v[1], CK_OP_SLICE, &pw, n->inputs[1], v[1])) < 0 ||
            (n->ninputs > 2 && (err = emit1(l, v[2], CK_OP_SLICE, &pw, n->inputs[2], v[2])) < 0))
            break;
        const char *ins[3] = {v[0], v[1], v[2]};
        err = emit(l, v[3], CK_OP_CONV2D, &conv, ins, n->ninputs > 2 ? 3 : 2,
                   (const char *const *)&v[3], 1, NULL);
    }
    if (err >= 0) {
        const char **ys = malloc((size_t)g * sizeof *ys);
        struct ck_op_params cat;
        ck_op_params_init(&cat);
        cat.axis = 1;
        if (!ys)
            err = ck_error(CK_ENOMEM, "out of memory for %" PRId64 " groups", g);
        for (int64_t k = 0; ys && k < g; k++)
            ys[k] = names[4 * k + 3];
        if (ys)
            err = emit(l, n->name, CK_OP_CONCAT, &cat, ys, (size_t)g,
                       (const char *const *)n->outputs, n->noutputs, NULL);
        free(ys);
    }
    for (int64_t k = 0; k < 4 * g; k++)
        free(names[k]);
    free(names);
    return err;
}

static int lower_grouped(struct low *l, const struct ck_model_node *n)
{
    const struct ck_tensor *w = n->ninputs >= 2 ? ck_model_weight(l->src, n->inputs[1]) : NULL;
    int64_t g = n->p.groups;
    if (!w || w->rank != 4 || g < 1 || w->dims[0] % g || w->dims[1] < 1 || n->noutputs != 1)
        return refuse(l, n,
                      "groups and weights that are not a stored [O, C/groups, kh, kw] array "
                      "with O a multiple of groups");
    if (n->p.pad[0] != n->p.pad[2] || n->p.pad[1] != n->p.pad[3])
        return refuse(l, n, "groups and asymmetric padding");
    return w->dims[1] == 1 ? lower_depthwise(l, n, w) : lower_split_groups(l, n, w);
}

/* Output size of a pool over one axis: docs/model.md's rule (torch's in
 * ceil mode); -1 when the window does not fit. */
static int64_t pool_out(int64_t size, int64_t k, int64_t s, int64_t p0, int64_t p1, bool ceil_mode)
{
    int64_t span = size + p0 + p1 - k;
    if (span < 0)
        return -1;
    int64_t o = (ceil_mode ? span + s - 1 : span) / s + 1;
    if (ceil_mode && (o - 1) * s >= size + p0)
        o--;
    return o;
}

static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* The shape of value (computed once for the whole source graph); NULL when
 * it is not known, with the reason (when inference failed) in l->shapes_why. */
static const struct ck_shape *value_shape(struct low *l, const char *value)
{
    if (l->shapes_state == 0) {
        if (ck_model_infer_shapes(l->src, &l->shapes) < 0) {
            snprintf(l->shapes_why, sizeof l->shapes_why, "%s", ck_error_msg());
            l->shapes_state = -1;
        } else {
            l->shapes_state = 1;
        }
    }
    return l->shapes_state == 1 ? ck_model_shape_of(&l->shapes, value) : NULL;
}

/* CK_EFORMAT: node n is lowered from value's shape (what for), and it is
 * not known at pack time. */
static int shape_unknown(const struct low *l, const struct ck_model_node *n, const char *what,
                         const char *value, const struct ck_shape *s)
{
    char t[128] = "unknown";
    if (s)
        ck_shape_text(s, t, sizeof t);
    return ck_error(CK_EFORMAT, "'%s': node '%s': op '%s' %s is lowered for DL4J from the shape "
                    "of '%s', and it is %s%s%s",
                    l->label, n->name, ck_op_name(n->op), what, value, t,
                    l->shapes_state < 0 ? ": " : "", l->shapes_state < 0 ? l->shapes_why : "");
}

static bool shape_is_known(const struct ck_shape *s)
{
    for (int i = 0; s && i < s->rank; i++)
        if (s->dims[i] < 0)
            return false;
    return s != NULL;
}

static int shape_of(struct low *l, const struct ck_model_node *n, int64_t *h, int64_t *w)
{
    const struct ck_shape *x = value_shape(l, n->inputs[0]);
    if (!x || x->rank != 4 || x->dims[2] < 0 || x->dims[3] < 0)
        return shape_unknown(l, n, "with ceil mode or asymmetric padding", n->inputs[0], x);
    *h = x->dims[2];
    *w = x->dims[3];
    return 0;
}

static int emit_pad(struct low *l, const struct ck_model_node *n, const char *name,
                    const struct ck_op_params *p, const char *x, const char *y);

/* The pool with DL4J's symmetric padding q = p0 + m s on an axis: its
 * windows start at -q + i s, so window m + j is the canonical window j;
 * m is the fewest whole strides that leave at least the canonical count
 * of windows after the first m. Cells of DL4J's padding are skipped by its
 * max and not counted by its average (extraParam0 0): exactly the
 * canonical pools without count_include_pad. */
static int lower_pool(struct low *l, const struct ck_model_node *n)
{
    const struct ck_op_params *p = &n->p;
    char *padded = NULL, *windows = NULL;
    const char *x = n->inputs[0];
    int64_t size[2] = {0, 0}, pad[4], out[2], m[2], q[2];
    bool slice = false;
    int err;
    if (n->ninputs != 1 || n->noutputs != 1)
        return ck_error(CK_EFORMAT, "'%s': node '%s': op '%s' takes one input and one output",
                        l->label, n->name, ck_op_name(n->op));
    if ((err = shape_of(l, n, &size[0], &size[1])) < 0)
        return err;
    memcpy(pad, p->pad, sizeof pad);
    if (n->op == CK_OP_AVGPOOL && p->count_include_pad && (pad[0] | pad[1] | pad[2] | pad[3])) {
        /* the padding counted: real zeros (DL4J's pad), then no padding */
        int64_t pads[8] = {0, 0, 0, 0, pad[0], pad[2], pad[1], pad[3]};
        struct ck_op_params pp = scalar_params(0);
        pp.ints = pads;
        pp.nints = 8;
        if ((err = sub_name(&padded, n, "padded")) < 0 ||
            (err = emit_pad(l, n, padded, &pp, x, padded)) < 0)
            goto out;
        x = padded;
        size[0] += pad[0] + pad[2];
        size[1] += pad[1] + pad[3];
        memset(pad, 0, sizeof pad);
    }
    for (int a = 0; a < 2; a++) {
        int64_t k = p->kernel[a], s = p->stride[a];
        if (k < 1 || s < 1 || k > DL4J_INT_MAX || s > DL4J_INT_MAX || pad[a] < 0 ||
            pad[a + 2] < 0 || pad[a] > DL4J_INT_MAX || pad[a + 2] > DL4J_INT_MAX ||
            size[a] > (INT64_C(1) << 40) ||
            (out[a] = pool_out(size[a], k, s, pad[a], pad[a + 2], p->ceil_mode)) < 1) {
            err = refuse(l, n, "a window that does not fit its input");
            goto out;
        }
        int64_t f = floor_div(size[a] + 2 * pad[a] - k, s);
        m[a] = out[a] - 1 - f > 0 ? out[a] - 1 - f : 0;
        q[a] = pad[a] + m[a] * s;
        if (q[a] > DL4J_INT_MAX) {
            err = refuse(l, n, "a padding past DL4J's int range once lowered");
            goto out;
        }
        slice = slice || m[a] > 0 || f + 2 * m[a] + 1 != out[a];
    }
    struct ck_op_params pool = *p;
    pool.ints = NULL;
    pool.nints = 0;
    pool.ceil_mode = false;
    pool.count_include_pad = false; /* DL4J's padding is never counted (extraParam0 0) */
    pool.dilation[0] = pool.dilation[1] = 1;
    pool.pad[0] = pool.pad[2] = q[0];
    pool.pad[1] = pool.pad[3] = q[1];
    if (slice && (err = sub_name(&windows, n, "windows")) < 0)
        goto out;
    if ((err = emit1(l, slice ? windows : n->name, n->op, &pool, x,
                     slice ? windows : n->outputs[0])) < 0 ||
        !slice)
        goto out;
    int64_t cut[12] = {0,    OPEN_END,      1, 0,    OPEN_END,      1,
                       m[0], m[0] + out[0], 1, m[1], m[1] + out[1], 1};
    struct ck_op_params sp;
    ck_op_params_init(&sp);
    sp.ints = cut;
    sp.nints = 12;
    err = emit1(l, n->name, CK_OP_SLICE, &sp, windows, n->outputs[0]);
out:
    free(padded), free(windows);
    return err;
}

/* A constant the lowering adds (an array held inline in the written graph,
 * not a stored weight): name, dtype, shape and bytes copied into the
 * lowered model. */
static int add_const(struct low *l, const char *name, enum ck_dtype dtype, int rank,
                     const int64_t *dims, const void *v, size_t nbytes)
{
    struct ck_tensor t;
    void *mem;
    int err;
    memset(&t, 0, sizeof t);
    if ((err = ck_tensor_set_alloc(l->out->m->weights, nbytes, &mem)) < 0)
        return err;
    if (nbytes)
        memcpy(mem, v, nbytes);
    t.name = (char *)name;
    t.dtype = dtype;
    t.rank = rank;
    if (rank) /* a scalar: dims NULL */
        memcpy(t.dims, dims, (size_t)rank * sizeof *dims);
    t.nbytes = nbytes;
    t.data = mem;
    t.role = "constant";
    return ck_tensor_set_add(l->out->m->weights, &t, NULL);
}

static int add_const_i64(struct low *l, const char *name, int rank, const int64_t *dims,
                         const int64_t *v, size_t n)
{
    return add_const(l, name, CK_DT_I64, rank, dims, v, n * sizeof *v);
}

/* libnd4j's pad (transforms/pad.cpp) reads its paddings from input 1, an
 * integer array [rank, 2] (no iArg form): the canonical before/after pairs
 * (axes not listed padded by 0) become that constant, "<node>/paddings";
 * the mode (0, constant) and the value stay INT_ARG(0) and T_ARG(0). */
static int emit_pad(struct low *l, const struct ck_model_node *n, const char *name,
                    const struct ck_op_params *p, const char *x, const char *y)
{
    const struct ck_shape *xs = value_shape(l, x);
    char *cname = NULL;
    int64_t *pads = NULL;
    int err;
    if (!xs)
        return shape_unknown(l, n, "(its paddings an array [rank, 2])", x, xs);
    size_t npad = 2 * (size_t)xs->rank;
    if (p->nints % 2 || p->nints > npad)
        return ck_error(CK_EFORMAT, "'%s': node '%s': %zu padding values for an input of rank %d",
                        l->label, n->name, p->nints, xs->rank);
    if (!(pads = calloc(npad + 1, sizeof *pads)))
        return ck_error(CK_ENOMEM, "out of memory");
    if (p->nints) /* a pad of no values: p->ints is NULL (fuzz_graph) */
        memcpy(pads, p->ints, p->nints * sizeof *pads);
    int64_t dims[2] = {xs->rank, 2};
    struct ck_op_params q = *p;
    q.ints = NULL;
    q.nints = 0;
    if ((err = sub_name(&cname, n, "paddings")) >= 0 &&
        (err = add_const_i64(l, cname, 2, dims, pads, npad)) >= 0) {
        const char *ins[2] = {x, cname};
        err = emit(l, name, CK_OP_PAD, &q, ins, 2, &y, 1, NULL);
    }
    free(pads);
    free(cname);
    return err;
}

static int lower_pad(struct low *l, const struct ck_model_node *n)
{
    if (n->ninputs != 1 || n->noutputs != 1)
        return ck_error(CK_EFORMAT, "'%s': node '%s': op '%s' takes one input and one output",
                        l->label, n->name, ck_op_name(n->op));
    return emit_pad(l, n, n->name, &n->p, n->inputs[0], n->outputs[0]);
}

static bool same_shape(const struct ck_shape *a, const struct ck_shape *b)
{
    if (a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i])
            return false;
    return true;
}

/* Operand v (shape vs) made out's shape: a reshape to out's rank (leading
 * 1s) when it has fewer dims, then a tile by out / its dims (libnd4j's
 * tile, transforms/tile.cpp: the repeats as iArgs, one per axis). The value
 * that has out's shape into *res (owned by the caller: NULL when v is used
 * as it is). */
static int broadcast_operand(struct low *l, const struct ck_model_node *n, const char *role,
                             const char *v, const struct ck_shape *vs, const struct ck_shape *out,
                             char **res)
{
    int64_t dims[CK_TENSOR_MAX_RANK], reps[CK_TENSOR_MAX_RANK];
    int lead = out->rank - vs->rank;
    char *shaped = NULL;
    int err = 0;
    *res = NULL;
    if (same_shape(vs, out))
        return 0;
    for (int i = 0; i < out->rank; i++) {
        dims[i] = i < lead ? 1 : vs->dims[i - lead];
        if (dims[i] != 1 && dims[i] != out->dims[i])
            return ck_error(CK_EFORMAT, "'%s': node '%s': operand '%s' does not broadcast",
                            l->label, n->name, v);
        reps[i] = dims[i] == out->dims[i] ? 1 : out->dims[i];
    }
    struct ck_op_params rp, tp;
    ck_op_params_init(&rp);
    ck_op_params_init(&tp);
    rp.ints = dims;
    rp.nints = (size_t)out->rank;
    tp.ints = reps;
    tp.nints = (size_t)out->rank;
    const char *in = v;
    if (lead > 0) {
        if ((err = sub_name(&shaped, n, "%s_rank%d", role, out->rank)) < 0 ||
            (err = emit1(l, shaped, CK_OP_RESHAPE, &rp, v, shaped)) < 0)
            goto out;
        in = shaped;
    }
    if ((err = sub_name(res, n, "%s_broadcast", role)) < 0 ||
        (err = emit1(l, *res, CK_OP_TILE, &tp, in, *res)) < 0) {
        free(*res);
        *res = NULL;
    }
out:
    free(shaped);
    return err;
}

/* where(cond, a, b) with numpy broadcasting: libnd4j's Where
 * (boolean/where.cpp) takes x and y of one shape and a condition of their
 * shape (element e: y's where cond.e<bool>(e) is false, else x's; a float
 * condition is true where it is not 0, NaN too): each operand whose shape
 * is not the output's is broadcast to it first, with exact copies (tile),
 * never arithmetic (a -inf fill times 0 is NaN). */
static int lower_where_computed(struct low *l, const struct ck_model_node *n,
                                const struct ck_shape *const *s, const struct ck_shape *out);

static int lower_where(struct low *l, const struct ck_model_node *n)
{
    static const char *const roles[3] = {"cond", "a", "b"};
    char *bc[3] = {NULL, NULL, NULL};
    const struct ck_shape *s[3];
    int err = 0;
    if (n->ninputs != 3 || n->noutputs != 1)
        return ck_error(CK_EFORMAT, "'%s': node '%s': op 'where' takes three inputs and one output",
                        l->label, n->name);
    const struct ck_shape *out = value_shape(l, n->outputs[0]);
    if (!out)
        return shape_unknown(l, n, "(DL4J's Where takes operands of one shape)", n->outputs[0],
                             out);
    bool known = shape_is_known(out);
    for (int k = 0; k < 3; k++) {
        if (!(s[k] = value_shape(l, n->inputs[k])) || s[k]->rank > out->rank)
            return shape_unknown(l, n, "(DL4J's Where takes operands of one shape)", n->inputs[k],
                                 s[k]);
        known = known && shape_is_known(s[k]);
    }
    if (!known) /* a dynamic batch or sequence: the broadcast computed in the graph */
        return lower_where_computed(l, n, s, out);
    for (int k = 0; k < 3 && err >= 0; k++)
        err = broadcast_operand(l, n, roles[k], n->inputs[k], s[k], out, &bc[k]);
    if (err >= 0) {
        const char *ins[3];
        for (int k = 0; k < 3; k++)
            ins[k] = bc[k] ? bc[k] : n->inputs[k];
        err = emit(l, n->name, CK_OP_WHERE, &n->p, ins, 3, (const char *const *)n->outputs, 1,
                   NULL);
    }
    for (int k = 0; k < 3; k++)
        free(bc[k]);
    return err;
}

/* ---- rnn, gru, lstm: unrolled over the sequence known at pack time ---- */

/* The most time steps (T times the directions) unrolled into one graph:
 * each step is about 18 DL4J ops. */
#define RNN_MAX_STEPS 4096
/* The most values of one direction's state [batch, H]. */
#define RNN_MAX_STATE (INT64_C(1) << 26)
/* The largest hidden size: an absent initial state is written as zeros
 * [1, H] (broadcast over the batch by the first step's add and multiply). */
#define RNN_MAX_HIDDEN (INT64_C(1) << 22)

struct rec {
    struct low *l;
    const struct ck_model_node *n;
    char **names; /* owned: every sub-value's name, freed at the end */
    size_t nnames, cap;
    int err;
};

/* "<node>/<what>", owned by r; NULL (r->err set) on failure or after one. */
static const char *rn(struct rec *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *rn(struct rec *r, const char *fmt, ...)
{
    char what[64], *s;
    va_list ap;
    if (r->err < 0)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (r->nnames == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 256;
        char **v = realloc(r->names, cap * sizeof *v);
        if (!v) {
            r->err = ck_error(CK_ENOMEM, "out of memory");
            return NULL;
        }
        r->names = v;
        r->cap = cap;
    }
    if (asprintf(&s, "%s/%s", r->n->name, what) < 0) {
        r->err = ck_error(CK_ENOMEM, "out of memory");
        return NULL;
    }
    r->names[r->nnames++] = s;
    return s;
}

/* A node named out (its one output out too) of op on ins; out, or NULL. */
static const char *rop(struct rec *r, const char *out, enum ck_op op, const struct ck_op_params *p,
                       const char *const *ins, size_t nin)
{
    struct ck_op_params plain;
    if (r->err < 0 || !out)
        return NULL;
    for (size_t i = 0; i < nin; i++)
        if (!ins[i])
            return NULL;
    if (!p) {
        ck_op_params_init(&plain);
        p = &plain;
    }
    if ((r->err = emit(r->l, out, op, p, ins, nin, &out, 1, NULL)) < 0)
        return NULL;
    return out;
}

static const char *rop1(struct rec *r, const char *out, enum ck_op op, const char *x)
{
    return rop(r, out, op, NULL, &x, 1);
}

static const char *rop2(struct rec *r, const char *out, enum ck_op op, const char *a, const char *b)
{
    const char *ins[2] = {a, b};
    return rop(r, out, op, NULL, ins, 2);
}

/* x[..., start:end] on axis (the axes before it whole; strided_slice). */
static const char *rslice(struct rec *r, const char *out, const char *x, int axis, int64_t start,
                          int64_t end)
{
    int64_t ints[9];
    struct ck_op_params p;
    ck_op_params_init(&p);
    for (int a = 0; a < axis; a++) {
        ints[3 * a] = 0;
        ints[3 * a + 1] = OPEN_END;
        ints[3 * a + 2] = 1;
    }
    ints[3 * axis] = start;
    ints[3 * axis + 1] = end;
    ints[3 * axis + 2] = 1;
    p.ints = ints;
    p.nints = 3 * (size_t)axis + 3;
    return rop(r, out, CK_OP_SLICE, &p, &x, 1);
}

static const char *rreshape(struct rec *r, const char *out, const char *x, int rank,
                            const int64_t *dims)
{
    struct ck_op_params p;
    ck_op_params_init(&p);
    p.ints = (int64_t *)dims;
    p.nints = (size_t)rank;
    return rop(r, out, CK_OP_RESHAPE, &p, &x, 1);
}

/* x [M, K] times W^T (W [GH, K] permuted to [K, GH] once) plus b [GH]
 * when given: libnd4j's matmul (blas/matmul.cpp, iArgs transX, transY,
 * transZ all 0) and the broadcastable add. Not xw_plus_b: libnd4j's reads
 * its transposes from INT_ARG(0..2) (docs/samediff.md). */
static const char *rlinear(struct rec *r, const char *out, const char *prod, const char *x,
                           const char *wt, const char *b)
{
    const char *y = rop2(r, b ? prod : out, CK_OP_MATMUL, x, wt);
    return b ? rop2(r, out, CK_OP_ADD, y, b) : y;
}

static const char *rpermute(struct rec *r, const char *out, const char *x)
{
    static const int64_t swap[2] = {1, 0};
    struct ck_op_params p;
    ck_op_params_init(&p);
    p.ints = (int64_t *)swap;
    p.nints = 2;
    return rop(r, out, CK_OP_TRANSPOSE, &p, &x, 1);
}

static const char *rconcat(struct rec *r, const char *out, const char *const *ins, size_t nin,
                           int64_t axis)
{
    struct ck_op_params p;
    ck_op_params_init(&p);
    p.axis = axis;
    return rop(r, out, CK_OP_CONCAT, &p, ins, nin);
}

/* A float32 zeros constant of these dims (an absent initial state). */
static const char *rzeros(struct rec *r, const char *name, int rank, const int64_t *dims)
{
    struct ck_tensor t;
    void *mem;
    size_t n = 1;
    if (r->err < 0 || !name)
        return NULL;
    for (int i = 0; i < rank; i++)
        n *= (size_t)dims[i];
    memset(&t, 0, sizeof t);
    if ((r->err = ck_tensor_set_alloc(r->l->out->m->weights, n * sizeof(float), &mem)) < 0)
        return NULL;
    memset(mem, 0, n * sizeof(float));
    t.name = (char *)name;
    t.dtype = CK_DT_F32;
    t.rank = rank;
    memcpy(t.dims, dims, (size_t)rank * sizeof *dims);
    t.nbytes = n * sizeof(float);
    t.data = mem;
    t.role = "constant";
    if ((r->err = ck_tensor_set_add(r->l->out->m->weights, &t, NULL)) < 0)
        return NULL;
    return name;
}

static int rnn_refuse(const struct low *l, const struct ck_model_node *n, const char *why)
{
    return ck_error(CK_EUNSUPPORTED,
                    "'%s': node '%s': op '%s' %s: ckptd writes it for DL4J unrolled over a "
                    "sequence known at pack time (docs/samediff.md)",
                    l->label, n->name, ck_op_name(n->op), why);
}

/* Input k's shape must be exactly want (rank dims); the reason when not. */
static bool exact_shape(const struct ck_shape *s, int rank, const int64_t *want)
{
    if (!s || s->rank != rank)
        return false;
    for (int i = 0; i < rank; i++)
        if (s->dims[i] != want[i])
            return false;
    return true;
}

/* One direction d of the node over every step; its h at each step t into
 * ys[t], its last h (and c) into *hl, *cl. */
static void rnn_direction(struct rec *r, int kind, int64_t d, bool rev, const int64_t *tnih,
                          const char *xrows, const char *const *in, const char **ys,
                          const char **hl, const char **cl)
{
    int64_t T = tnih[0], N = tnih[1], I = tnih[2], H = tnih[3], G = kind, GH = G * H;
    int64_t wdims[2] = {GH, I}, rdims[2] = {GH, H}, bdims[1] = {GH}, sdims[2] = {N, H},
            zdims[2] = {1, H};
    int64_t xpdims[3] = {T, N, GH}, stepdims[2] = {N, GH}, ydims[4] = {1, 1, N, H};
    const char *w = rpermute(
        r, rn(r, "d%" PRId64 "/W_t", d),
        rreshape(r, rn(r, "d%" PRId64 "/W", d),
                 rslice(r, rn(r, "d%" PRId64 "/W_slice", d), in[1], 0, d, d + 1), 2, wdims));
    const char *rr = rpermute(
        r, rn(r, "d%" PRId64 "/R_t", d),
        rreshape(r, rn(r, "d%" PRId64 "/R", d),
                 rslice(r, rn(r, "d%" PRId64 "/R_slice", d), in[2], 0, d, d + 1), 2, rdims));
    const char *wb = NULL, *rb = NULL;
    if (in[3]) {
        const char *bd = rslice(r, rn(r, "d%" PRId64 "/B_slice", d), in[3], 0, d, d + 1);
        wb = rreshape(r, rn(r, "d%" PRId64 "/Wb", d),
                      rslice(r, rn(r, "d%" PRId64 "/Wb_slice", d), bd, 1, 0, GH), 1, bdims);
        rb = rreshape(r, rn(r, "d%" PRId64 "/Rb", d),
                      rslice(r, rn(r, "d%" PRId64 "/Rb_slice", d), bd, 1, GH, 2 * GH), 1, bdims);
    }
    /* every step's input projection at once: [T N, I] x W^T + Wb */
    const char *xp = rreshape(r, rn(r, "d%" PRId64 "/x_proj", d),
                              rlinear(r, rn(r, "d%" PRId64 "/x_proj_rows", d),
                                      rn(r, "d%" PRId64 "/x_proj_prod", d), xrows, w, wb),
                              3, xpdims);
    const char *h, *c = NULL;
    if (in[4])
        h = rreshape(r, rn(r, "d%" PRId64 "/h_init", d),
                     rslice(r, rn(r, "d%" PRId64 "/h_init_slice", d), in[4], 0, d, d + 1), 2,
                     sdims);
    else
        h = rzeros(r, rn(r, "d%" PRId64 "/h_zero", d), 2, zdims);
    if (kind == 4) {
        if (in[5])
            c = rreshape(r, rn(r, "d%" PRId64 "/c_init", d),
                         rslice(r, rn(r, "d%" PRId64 "/c_init_slice", d), in[5], 0, d, d + 1), 2,
                         sdims);
        else
            c = rzeros(r, rn(r, "d%" PRId64 "/c_zero", d), 2, zdims);
    }
    struct ck_op_params one_minus;
    ck_op_params_init(&one_minus);
    one_minus.has_scalar = one_minus.scalar_first = true;
    one_minus.scalar = 1.0f;
    for (int64_t i = 0; i < T && r->err >= 0; i++) {
        int64_t t = rev ? T - 1 - i : i;
#define S(what) rn(r, "d%" PRId64 "/t%" PRId64 "/" what, d, t)
        const char *xt = rreshape(r, S("x"), rslice(r, S("x_slice"), xp, 0, t, t + 1), 2, stepdims);
        const char *ht = rlinear(r, S("h_proj"), S("h_prod"), h, rr, rb);
        if (kind == 1) {
            h = rop1(r, S("h"), CK_OP_TANH, rop2(r, S("sum"), CK_OP_ADD, xt, ht));
        } else if (kind == 4) {
            /* ONNX's gate order: i, o, f, c */
            const char *a = rop2(r, S("sum"), CK_OP_ADD, xt, ht);
            const char *gi = rop1(r, S("i"), CK_OP_SIGMOID, rslice(r, S("i_in"), a, 1, 0, H));
            const char *go = rop1(r, S("o"), CK_OP_SIGMOID, rslice(r, S("o_in"), a, 1, H, 2 * H));
            const char *gf =
                rop1(r, S("f"), CK_OP_SIGMOID, rslice(r, S("f_in"), a, 1, 2 * H, 3 * H));
            const char *gc = rop1(r, S("g"), CK_OP_TANH, rslice(r, S("g_in"), a, 1, 3 * H, 4 * H));
            c = rop2(r, S("c"), CK_OP_ADD, rop2(r, S("f_c"), CK_OP_MUL, gf, c),
                     rop2(r, S("i_g"), CK_OP_MUL, gi, gc));
            h = rop2(r, S("h"), CK_OP_MUL, go, rop1(r, S("c_tanh"), CK_OP_TANH, c));
        } else {
            /* ONNX's gate order z, r, h; linear_before_reset: the reset gate
             * times (h R_h^T + Rb_h), as torch's GRU */
            const char *z = rop1(r, S("z"), CK_OP_SIGMOID,
                                 rop2(r, S("z_in"), CK_OP_ADD, rslice(r, S("z_x"), xt, 1, 0, H),
                                      rslice(r, S("z_h"), ht, 1, 0, H)));
            const char *g = rop1(r, S("r"), CK_OP_SIGMOID,
                                 rop2(r, S("r_in"), CK_OP_ADD, rslice(r, S("r_x"), xt, 1, H, 2 * H),
                                      rslice(r, S("r_h"), ht, 1, H, 2 * H)));
            const char *hh = rop1(
                r, S("n"), CK_OP_TANH,
                rop2(r, S("n_in"), CK_OP_ADD, rslice(r, S("n_x"), xt, 1, 2 * H, 3 * H),
                     rop2(r, S("n_h"), CK_OP_MUL, g, rslice(r, S("n_hr"), ht, 1, 2 * H, 3 * H))));
            const char *zc = rop(r, S("1_z"), CK_OP_SUB, &one_minus, &z, 1);
            h = rop2(r, S("h"), CK_OP_ADD, rop2(r, S("1_z_n"), CK_OP_MUL, zc, hh),
                     rop2(r, S("z_hprev"), CK_OP_MUL, z, h));
        }
        ys[t] = rreshape(r, S("y"), h, 4, ydims);
#undef S
    }
    int64_t ldims[3] = {1, N, H};
    *hl = rreshape(r, rn(r, "d%" PRId64 "/h_last", d), h, 3, ldims);
    if (kind == 4)
        *cl = rreshape(r, rn(r, "d%" PRId64 "/c_last", d), c, 3, ldims);
}

/* rnn, gru and lstm (ONNX's, docs/model.md) as the DL4J ops of one step,
 * unrolled: per direction the weights sliced and transposed once and every
 * step's input projection taken in one matmul, then per step the recurrent
 * projection, the gates (strided_slice, sigmoid, tanh, multiply, add) and
 * the new state; Y the steps' h concatenated, Y_h (and Y_c) the last. X's
 * [T, batch, I] must be known at pack time. */
static int lower_recurrent(struct low *l, const struct ck_model_node *n)
{
    const struct ck_op_params *p = &n->p;
    int kind = n->op == CK_OP_RNN ? 1 : n->op == CK_OP_GRU ? 3 : 4;
    struct rec r = {.l = l, .n = n};
    const char *in[7] = {NULL};
    const char **ys = NULL;
    if (p->nints != 5 || n->ninputs < 3 || n->noutputs < 1 || n->noutputs > (kind == 4 ? 3u : 2u))
        return ck_error(CK_EFORMAT, "'%s': node '%s': op '%s' needs X, W, R and its parameters",
                        l->label, n->name, ck_op_name(n->op));
    int64_t dir = p->ints[0], H = p->ints[1], mask = p->ints[2];
    if (dir < 0 || dir > 2 || H < 1 || H > (INT64_C(1) << 24) || mask < 0 || mask > 15 ||
        ((mask & 12) && kind != 4))
        return ck_error(CK_EFORMAT, "'%s': node '%s': op '%s' parameters out of range", l->label,
                        n->name, ck_op_name(n->op));
    if (p->ints[3] != 0)
        return rnn_refuse(l, n, "with layout 1 (batch first)");
    if (mask & 8)
        return rnn_refuse(l, n, "with peepholes");
    if (kind == 3 && !p->ints[4])
        return rnn_refuse(l, n, "without linear_before_reset (torch's GRU has it)");
    size_t k = 3;
    in[0] = n->inputs[0], in[1] = n->inputs[1], in[2] = n->inputs[2];
    for (int b = 0; b < 3; b++)
        if (mask & (1 << b)) {
            if (k >= n->ninputs)
                break;
            in[3 + b] = n->inputs[k++];
        }
    if (k != n->ninputs)
        return ck_error(CK_EFORMAT, "'%s': node '%s': op '%s': %zu inputs, its parameters name %zu",
                        l->label, n->name, ck_op_name(n->op), n->ninputs, k);
    for (int b = 0; b < 6; b++)
        if (in[b] && !in[b][0])
            return ck_error(CK_EFORMAT, "'%s': node '%s': op '%s': an input without a name",
                            l->label, n->name, ck_op_name(n->op));
    const struct ck_shape *xs = value_shape(l, in[0]);
    if (!shape_is_known(xs) || xs->rank != 3)
        return shape_unknown(l, n, "(unrolled over its steps)", in[0], xs);
    int64_t T = xs->dims[0], N = xs->dims[1], I = xs->dims[2], D = dir == 2 ? 2 : 1, G = kind;
    if (T < 1 || N < 1 || I < 1 || T > RNN_MAX_STEPS / D)
        return rnn_refuse(l, n, "with an empty sequence or more steps than ckptd unrolls (4096)");
    if (N > RNN_MAX_STATE / H || H > RNN_MAX_HIDDEN)
        return rnn_refuse(l, n, "with a state of more than 2^26 values (batch times hidden size) "
                                "or a hidden size past 2^22");
    int64_t want[6][3] = {{0}, {D, G * H, I}, {D, G * H, H}, {D, 2 * G * H}, {D, N, H}, {D, N, H}};
    int rank[6] = {3, 3, 3, 2, 3, 3};
    for (int b = 1; b < 6; b++) {
        if (!in[b])
            continue;
        const struct ck_shape *s = value_shape(l, in[b]);
        if (!exact_shape(s, rank[b], want[b])) {
            char t[128] = "unknown";
            if (s)
                ck_shape_text(s, t, sizeof t);
            return ck_error(CK_EFORMAT,
                            "'%s': node '%s': op '%s': input '%s' is %s, not the shape the op "
                            "needs",
                            l->label, n->name, ck_op_name(n->op), in[b], t);
        }
    }
    if (!(ys = calloc((size_t)(T * D), sizeof *ys)))
        return ck_error(CK_ENOMEM, "out of memory");
    int64_t rows[2] = {T * N, I}, tnih[4] = {T, N, I, H};
    const char *xrows = rreshape(&r, rn(&r, "x_rows"), in[0], 2, rows);
    const char *hl[2] = {NULL, NULL}, *cl[2] = {NULL, NULL};
    for (int64_t d = 0; d < D && r.err >= 0; d++)
        rnn_direction(&r, kind, d, dir == 1 || d == 1, tnih, xrows, in, ys + d * T, &hl[d], &cl[d]);
    /* Y [T, D, N, H]: per step the directions on axis 1, the steps on axis 0 */
    const char **steps = calloc((size_t)T, sizeof *steps);
    if (!steps && r.err >= 0)
        r.err = ck_error(CK_ENOMEM, "out of memory");
    for (int64_t t = 0; steps && t < T && r.err >= 0; t++) {
        const char *pair[2] = {ys[t], D == 2 ? ys[T + t] : NULL};
        steps[t] = D == 2 ? rconcat(&r, rn(&r, "t%" PRId64 "/y", t), pair, 2, 1) : ys[t];
    }
    const char *outs[3] = {n->outputs[0], n->noutputs > 1 ? n->outputs[1] : "",
                           n->noutputs > 2 ? n->outputs[2] : ""};
    if (steps && r.err >= 0 && outs[0][0])
        (void)(T > 1 ? rconcat(&r, outs[0], steps, (size_t)T, 0)
                     : rop1(&r, outs[0], CK_OP_IDENTITY, steps[0]));
    for (int o = 1; o < 3 && r.err >= 0; o++) {
        const char **last = o == 1 ? hl : cl;
        if (!outs[o][0] || (o == 2 && kind != 4))
            continue;
        (void)(D == 2 ? rconcat(&r, outs[o], last, 2, 0)
                      : rop1(&r, outs[o], CK_OP_IDENTITY, last[0]));
    }
    int err = r.err;
    free(steps);
    free(ys);
    for (size_t i = 0; i < r.nnames; i++)
        free(r.names[i]);
    free(r.names);
    return err;
}

/* expand with a constant shape (torch's zero initial states of an RNN, a
 * slice of a constant that the ONNX reader leaves as a node): the
 * broadcast said as reshape and tile from the shapes known at pack time,
 * then an identity to the node's output. */
/* ---- shapes computed in the graph (a dynamic export: docs/samediff.md) ---- */

/* A name of the lowering's own, kept until the node is lowered. */
struct names {
    char **v;
    size_t n;
    int err;
};

static const char *nm(struct names *k, const struct ck_model_node *n, const char *what, int i)
{
    char **v;
    if (k->err < 0)
        return "";
    if (!(v = realloc(k->v, (k->n + 1) * sizeof *v))) {
        k->err = ck_error(CK_ENOMEM, "out of memory");
        return "";
    }
    k->v = v;
    k->err = i >= 0 ? sub_name(&v[k->n], n, "%s%d", what, i) : sub_name(&v[k->n], n, "%s", what);
    if (k->err < 0)
        return "";
    return v[k->n++];
}

static int names_free(struct names *k)
{
    for (size_t i = 0; i < k->n; i++)
        free(k->v[i]);
    free(k->v);
    return k->err;
}

/* Emits y = op(ins) (one output) unless an earlier step failed. */
static void step(struct low *l, struct names *k, const char *y, enum ck_op op,
                 const struct ck_op_params *p, const char *const *ins, size_t nin)
{
    struct ck_op_params q;
    if (k->err < 0)
        return;
    if (!p) {
        ck_op_params_init(&q);
        p = &q;
    }
    k->err = emit(l, y, op, p, ins, nin, &y, 1, NULL);
}

/* The int64 vector [rank] of value v's dims as computed in the graph
 * (libnd4j's shape_of), led by 1s to rank out_rank (a concat with a
 * constant of 1s): numpy's alignment of shapes on the right. */
static const char *dims_lead(struct low *l, struct names *k, const struct ck_model_node *n,
                             const char *s, int rank, int out_rank, int i);

static const char *dims_of(struct low *l, struct names *k, const struct ck_model_node *n,
                           const char *v, int rank, int out_rank, int i)
{
    const char *s = nm(k, n, "dims", i);
    step(l, k, s, CK_OP_SHAPE, NULL, &v, 1);
    return dims_lead(l, k, n, s, rank, out_rank, i);
}

/* The shape vector s of rank values led by 1s to out_rank values. */
static const char *dims_lead(struct low *l, struct names *k, const struct ck_model_node *n,
                             const char *s, int rank, int out_rank, int i)
{
    if (rank >= out_rank || k->err < 0)
        return s;
    int64_t ones[CK_TENSOR_MAX_RANK], d[1] = {out_rank - rank};
    for (int j = 0; j < out_rank - rank; j++)
        ones[j] = 1;
    const char *c = nm(k, n, "lead", i), *a = nm(k, n, "dims_aligned", i);
    if (k->err >= 0)
        k->err = add_const_i64(l, c, 1, d, ones, (size_t)(out_rank - rank));
    struct ck_op_params cat;
    ck_op_params_init(&cat);
    cat.axis = 0;
    const char *ins[2] = {c, s};
    step(l, k, a, CK_OP_CONCAT, &cat, ins, 2);
    return a;
}

/* The broadcast of shape vectors a and b of one length: their larger dims
 * (libnd4j's maximum). numpy's rule where each pair is equal or has a 1;
 * a dim of 0 against 1 gives 1 here (numpy: 0), which broadcast_to then
 * refuses (docs/samediff.md). */
static const char *dims_max(struct low *l, struct names *k, const struct ck_model_node *n,
                            const char *a, const char *b, int i)
{
    const char *y = nm(k, n, "dims_broadcast", i);
    const char *ins[2] = {a, b};
    step(l, k, y, CK_OP_MAX, NULL, ins, 2);
    return y;
}

/* x broadcast to the computed shape s (libnd4j's broadcast_to: x's dims
 * must each equal s's or be 1, which s built by dims_max guarantees). */
static void broadcast_to(struct low *l, struct names *k, const char *y, const char *x,
                         const char *s)
{
    const char *ins[2] = {x, s};
    step(l, k, y, CK_OP_EXPAND, NULL, ins, 2);
}

/* ONNX Expand (x, shape) with the shape computed (or x's dims not known
 * at pack time): the result's shape is the broadcast of x's dims and the
 * shape's, so broadcast_to gets the larger of the two (a shape's 1 keeps
 * x's dim, as ONNX says; libnd4j's older broadcast_to would refuse it). */
static int lower_expand_computed(struct low *l, const struct ck_model_node *n)
{
    struct names k = {0};
    const struct ck_shape *xs = value_shape(l, n->inputs[0]), *out = value_shape(l, n->outputs[0]);
    if (!xs || !out)
        return shape_unknown(l, n, "(its rank)", xs ? n->outputs[0] : n->inputs[0], xs ? out : xs);
    const char *s = NULL;
    if (n->ninputs == 2) {
        const struct ck_shape *ss = value_shape(l, n->inputs[1]);
        if (!ss || ss->rank != 1 || ss->dims[0] < 0 || ss->dims[0] > out->rank)
            return shape_unknown(l, n, "(the length of its shape)", n->inputs[1], ss);
        /* a shape shorter than x's rank: led by 1s, as numpy aligns them */
        s = ss->dims[0] == out->rank
                ? n->inputs[1]
                : dims_lead(l, &k, n, n->inputs[1], (int)ss->dims[0], out->rank, 1);
    } else {
        /* the constant led by 1s to the result's rank, one constant: a
         * concat of constants would be no shape value */
        int64_t d[1] = {out->rank}, v[CK_TENSOR_MAX_RANK];
        int lead = out->rank - (int)n->p.nints;
        if (lead < 0)
            return shape_unknown(l, n, "(the length of its shape)", n->outputs[0], out);
        for (int i = 0; i < out->rank; i++)
            v[i] = i < lead ? 1 : n->p.ints[i - lead];
        s = nm(&k, n, "shape", -1);
        if (k.err >= 0)
            k.err = add_const_i64(l, s, 1, d, v, (size_t)out->rank);
    }
    const char *x = dims_of(l, &k, n, n->inputs[0], xs->rank, out->rank, 0);
    const char *t = dims_max(l, &k, n, x, s, 0);
    if (k.err >= 0) {
        const char *ins[2] = {n->inputs[0], t};
        struct ck_op_params p;
        ck_op_params_init(&p);
        k.err =
            emit(l, n->name, CK_OP_EXPAND, &p, ins, 2, (const char *const *)n->outputs, 1, NULL);
    }
    return names_free(&k);
}

/* where with a dim not known at pack time: each operand broadcast_to the
 * computed broadcast of the three shapes (shape_of, led by 1s, maximum),
 * then Where of three arrays of one shape. */
static int lower_where_computed(struct low *l, const struct ck_model_node *n,
                                const struct ck_shape *const *s, const struct ck_shape *out)
{
    static const char *const roles[3] = {"cond_broadcast", "a_broadcast", "b_broadcast"};
    struct names k = {0};
    const char *d[3], *b[3];
    for (int i = 0; i < 3; i++)
        d[i] = dims_of(l, &k, n, n->inputs[i], s[i]->rank, out->rank, i);
    const char *t = dims_max(l, &k, n, dims_max(l, &k, n, d[0], d[1], 0), d[2], 1);
    for (int i = 0; i < 3; i++) {
        b[i] = nm(&k, n, roles[i], -1);
        broadcast_to(l, &k, b[i], n->inputs[i], t);
    }
    if (k.err >= 0)
        k.err =
            emit(l, n->name, CK_OP_WHERE, &n->p, b, 3, (const char *const *)n->outputs, 1, NULL);
    return names_free(&k);
}

/* ONNX Slice (x, starts, ends[, axes[, steps]]) with its bounds computed:
 * libnd4j's strided_slice in its input form (tensor/strided_slice.cpp:
 * with the five masks as the only iArgs, begin, end and strides are inputs
 * 1, 2, 3, one value per axis from axis 0; axes past them are whole). Per
 * axis up to the last one sliced: a sliced axis takes its start and end
 * (a strided_slice of starts and ends), another 0 and its own dim (of
 * shape_of x), so no mask is needed; strides are 1. The axes must be
 * constants and the steps 1 (else refused by name); the lowered node has
 * the four inputs of libnd4j's form, not the canonical slice's. */
static int lower_slice_computed(struct low *l, const struct ck_model_node *n)
{
    const struct ck_shape *xs = value_shape(l, n->inputs[0]);
    const struct ck_shape *ss = n->ninputs > 1 ? value_shape(l, n->inputs[1]) : NULL;
    int64_t pos[CK_TENSOR_MAX_RANK];
    if (n->ninputs < 3)
        return ck_error(CK_EFORMAT,
                        "'%s': node '%s': op 'slice' with %zu inputs (x, starts, "
                        "ends[, axes[, steps]])",
                        l->label, n->name, n->ninputs);
    if (!xs || !ss || ss->rank != 1 || ss->dims[0] < 1 || ss->dims[0] > xs->rank ||
        n->noutputs != 1)
        return shape_unknown(l, n, "(with computed bounds: x's rank and the count of axes)",
                             xs ? n->inputs[1] : n->inputs[0], xs ? ss : xs);
    int na = (int)ss->dims[0], last = -1;
    for (int d = 0; d < CK_TENSOR_MAX_RANK; d++)
        pos[d] = -1;
    const struct ck_tensor *at = n->ninputs > 3 ? ck_model_weight(l->src, n->inputs[3]) : NULL;
    const struct ck_tensor *st = n->ninputs > 4 ? ck_model_weight(l->src, n->inputs[4]) : NULL;
    for (int j = 0; j < na; j++) {
        int64_t a = j, step = 1;
        if ((n->ninputs > 3 && (!at || ck_tensor_get_i64(at, (uint64_t)j, &a) < 0)) ||
            (n->ninputs > 4 && (!st || ck_tensor_get_i64(st, (uint64_t)j, &step) < 0)) || step != 1)
            return refuse(l, n,
                          "computed bounds and axes or steps that are not constants, "
                          "or a step other than 1");
        if (a < 0)
            a += xs->rank;
        if (a < 0 || a >= xs->rank || pos[a] >= 0)
            return ck_error(CK_EFORMAT,
                            "'%s': node '%s': slice axis %" PRId64 " out of range "
                            "or repeated",
                            l->label, n->name, a);
        pos[a] = j;
        last = a > last ? (int)a : last;
    }
    struct names k = {0};
    const char *dims = NULL, *begin = NULL, *end = NULL;
    const struct ck_tensor *bw = ck_model_weight(l->src, n->inputs[1]);
    const struct ck_tensor *ew = ck_model_weight(l->src, n->inputs[2]);
    for (int which = 0; which < 2; which++) {
        const struct ck_tensor *w = which ? ew : bw;
        const char *src = n->inputs[1 + which], *pc[CK_TENSOR_MAX_RANK];
        int64_t cv[CK_TENSOR_MAX_RANK];
        bool all_const = true;
        /* per axis a constant (a bound given as a weight, a begin of an
         * axis not sliced) or a computed value; a vector of constants only
         * is one constant (a concat of weights is no shape value) */
        for (int d = 0; d <= last; d++) {
            bool c =
                pos[d] >= 0 ? w && ck_tensor_get_i64(w, (uint64_t)pos[d], &cv[d]) == 0 : !which;
            if (pos[d] < 0 && !which)
                cv[d] = 0;
            if (!c)
                all_const = false;
        }
        const char *v = nm(&k, n, which ? "end" : "begin", -1);
        int64_t dl[1] = {last + 1};
        if (all_const) {
            if (k.err >= 0)
                k.err = add_const_i64(l, v, 1, dl, cv, (size_t)last + 1);
        } else {
            for (int d = 0; d <= last; d++) {
                struct ck_op_params sp;
                ck_op_params_init(&sp);
                int64_t at1 = pos[d] >= 0 ? pos[d] : d, one[3] = {at1, at1 + 1, 1}, d1[1] = {1};
                sp.ints = one;
                sp.nints = 3;
                pc[d] = nm(&k, n, which ? "end_axis" : "begin_axis", d);
                if (pos[d] >= 0 && !(w && ck_tensor_get_i64(w, (uint64_t)pos[d], &cv[d]) == 0)) {
                    step(l, &k, pc[d], CK_OP_SLICE, &sp, &src, 1);
                } else if (pos[d] >= 0 || !which) {
                    if (k.err >= 0)
                        k.err = add_const_i64(l, pc[d], 1, d1, &cv[d], 1);
                } else { /* the whole axis: up to its dim */
                    if (!dims) {
                        dims = nm(&k, n, "dims", -1);
                        step(l, &k, dims, CK_OP_SHAPE, NULL, (const char *const *)n->inputs, 1);
                    }
                    step(l, &k, pc[d], CK_OP_SLICE, &sp, &dims, 1);
                }
            }
            struct ck_op_params cat;
            ck_op_params_init(&cat);
            cat.axis = 0;
            step(l, &k, v, CK_OP_CONCAT, &cat, pc, (size_t)last + 1);
        }
        *(which ? &end : &begin) = v;
    }
    const char *strides = nm(&k, n, "strides", -1);
    int64_t ones[CK_TENSOR_MAX_RANK], dl[1] = {last + 1};
    for (int d = 0; d <= last; d++)
        ones[d] = 1;
    if (k.err >= 0)
        k.err = add_const_i64(l, strides, 1, dl, ones, (size_t)last + 1);
    if (k.err >= 0) {
        const char *ins[4] = {n->inputs[0], begin, end, strides};
        struct ck_op_params p;
        ck_op_params_init(&p);
        k.err = emit(l, n->name, CK_OP_SLICE, &p, ins, 4, (const char *const *)n->outputs, 1, NULL);
    }
    return names_free(&k);
}

/* shape with a start or end: shape_of, then a strided_slice of it (the
 * rank known at pack time, the bounds clamped as numpy clamps). */
static int lower_shape(struct low *l, const struct ck_model_node *n)
{
    if (!n->p.nints)
        return emit_copy(l, n);
    const struct ck_shape *xs = value_shape(l, n->inputs[0]);
    if (!xs || n->p.nints != 2 || n->noutputs != 1)
        return shape_unknown(l, n, "(with a start and end: its rank)", n->inputs[0], xs);
    int64_t r = xs->rank, b = n->p.ints[0], e = n->p.ints[1];
    b = b < 0 ? (b + r < 0 ? 0 : b + r) : (b > r ? r : b);
    e = e < 0 ? (e + r < 0 ? 0 : e + r) : (e > r ? r : e);
    if (e < b)
        e = b;
    struct names k = {0};
    const char *all = nm(&k, n, "dims", -1);
    step(l, &k, all, CK_OP_SHAPE, NULL, (const char *const *)n->inputs, 1);
    int64_t cut[3] = {b, e, 1};
    struct ck_op_params sp;
    ck_op_params_init(&sp);
    sp.ints = cut;
    sp.nints = 3;
    if (k.err >= 0)
        k.err = emit1(l, n->name, CK_OP_SLICE, &sp, all, n->outputs[0]);
    return names_free(&k);
}

/* constant_of_shape as libnd4j's fill (shape, value): the value a scalar
 * constant of the result's dtype (int64 for the integer form, else
 * float32), since fill assigns input 1 and so gives its dtype; T_ARG(0)
 * holds it too. */
static int lower_fill(struct low *l, const struct ck_model_node *n)
{
    if (n->ninputs != 1 || n->noutputs != 1)
        return emit_copy(l, n);
    bool integer = n->p.nints >= 1 && n->p.ints[0] == 1;
    /* the integer form's value an int64 (as the engine's plan wants it,
     * infer/shapeval.c): a whole number under 2^62 (fuzz_graph: -1.6e35
     * converted to a long) */
    if (integer && !(fabsf(n->p.scalar) < 0x1p62f && n->p.scalar == truncf(n->p.scalar)))
        return ck_error(CK_EFORMAT, "'%s': node '%s': op 'constant_of_shape' with the integer "
                        "value %g: not a whole number under 2^62", l->label, n->name,
                        (double)n->p.scalar);
    struct names k = {0};
    const char *v = nm(&k, n, "value", -1);
    int64_t iv = integer ? (int64_t)n->p.scalar : 0;
    float fv = n->p.scalar;
    if (k.err >= 0)
        k.err = add_const(l, v, integer ? CK_DT_I64 : CK_DT_F32, 0, NULL,
                          integer ? (const void *)&iv : (const void *)&fv,
                          integer ? sizeof iv : sizeof fv);
    const char *ins[2] = {n->inputs[0], v};
    if (k.err >= 0)
        k.err = emit(l, n->name, n->op, &n->p, ins, 2, (const char *const *)n->outputs, 1, NULL);
    return names_free(&k);
}

static int lower_expand(struct low *l, const struct ck_model_node *n)
{
    char *bc = NULL;
    int err;
    if (n->ninputs == 2 && n->noutputs == 1)
        return lower_expand_computed(l, n); /* the shape a shape value */
    if (n->ninputs != 1 || n->noutputs != 1)
        return emit_copy(l, n); /* refused by its row */
    const struct ck_shape *out = value_shape(l, n->outputs[0]), *xs = value_shape(l, n->inputs[0]);
    if (!shape_is_known(out) || !shape_is_known(xs))
        return lower_expand_computed(l, n); /* the shape known, not x's: computed too */
    if ((err = broadcast_operand(l, n, "x", n->inputs[0], xs, out, &bc)) < 0)
        return err;
    struct ck_op_params p;
    ck_op_params_init(&p);
    const char *src = bc ? bc : n->inputs[0];
    err = emit(l, n->name, CK_OP_IDENTITY, &p, &src, 1, (const char *const *)n->outputs, 1, NULL);
    free(bc);
    return err;
}

/* dense as every libnd4j computes it: x (flattened from the node's axis to
 * [rows, K] by a reshape when it is not already) times W ([in, out]; torch's
 * [out, in] permuted first), plus the bias, by matmul (blas/matmul.cpp:
 * iArgs transX, transY, transZ, all 0) and add, then reshaped to the
 * node's output. Not xw_plus_b: its iArgs mean different things across
 * libnd4j's versions (INT_ARG(0) = 1 transposes the weights in one and x in
 * a later one, whose INT_ARG(1) transposes the weights), and it takes x of
 * rank 2 only (docs/samediff.md). The leading dims of x other than the
 * first must be known at pack time when they are flattened. */
static int lower_dense(struct low *l, const struct ck_model_node *n)
{
    if (n->ninputs < 2 || n->ninputs > 3 || n->noutputs != 1)
        return ck_error(CK_EFORMAT, "'%s': node '%s': op 'dense' needs x, a weight and at most a "
                        "bias", l->label, n->name);
    const struct ck_shape *xs = value_shape(l, n->inputs[0]), *ws = value_shape(l, n->inputs[1]);
    if (!xs || !shape_is_known(ws) || ws->rank < 2 || (n->p.trans_w && ws->rank != 2))
        return shape_unknown(l, n, "(as matmul and add)", xs ? n->inputs[1] : n->inputs[0],
                             xs ? ws : xs);
    int axis = (int)ck_op_axis(&n->p, 1);
    if (axis < 0)
        axis += xs->rank;
    if (axis < 1 || axis > xs->rank || xs->rank > CK_TENSOR_MAX_RANK - 1)
        return ck_error(CK_EFORMAT, "'%s': node '%s': op 'dense' with axis %d of an input of rank "
                        "%d has no DL4J form", l->label, n->name, axis, xs->rank);
    /* K: the features, x's or, when a dim of x's is not known at pack time
     * (a reshape to a computed shape), the weight's (dense's rule makes
     * them equal; the engine checks it at run time); the leading dims: all
     * but the first known */
    int64_t k = 1, wout = 1;
    bool kx = true;
    for (int i = axis; i < xs->rank; i++)
        kx = kx && xs->dims[i] >= 0;
    for (int i = axis; kx && i < xs->rank; i++) {
        if (xs->dims[i] > DL4J_INT_MAX || k > DL4J_INT_MAX / (xs->dims[i] ? xs->dims[i] : 1))
            return shape_unknown(l, n, "(as matmul and add)", n->inputs[0], xs);
        k *= xs->dims[i];
    }
    if (!kx && (k = ws->dims[n->p.trans_w ? 1 : 0]) > DL4J_INT_MAX)
        return shape_unknown(l, n, "(as matmul and add)", n->inputs[1], ws);
    for (int i = 1; i < axis; i++)
        if (xs->dims[i] < 0)
            return shape_unknown(l, n, "(as matmul and add)", n->inputs[0], xs);
    int wr = ws->rank;
    for (int i = n->p.trans_w ? 0 : 1; i < (n->p.trans_w ? 1 : wr); i++)
        wout *= ws->dims[i];
    bool flat_in = !(axis == 1 && xs->rank == 2), flat_out = flat_in || (!n->p.trans_w && wr > 2);
    struct rec r = {.l = l, .n = n};
    const char *x = n->inputs[0], *w = n->inputs[1];
    if (flat_in) {
        int64_t d[2] = {-1, k}; /* the rows: the batch, known or not */
        x = rreshape(&r, rn(&r, "x_rows"), x, 2, d);
    }
    if (n->p.trans_w)
        w = rpermute(&r, rn(&r, "weight_in_out"), w);
    else if (wr > 2) {
        int64_t d[2] = {ws->dims[0], wout};
        w = rreshape(&r, rn(&r, "weight_in_out"), w, 2, d);
    }
    const char *b = n->ninputs > 2 ? n->inputs[2] : NULL;
    const struct ck_shape *bs = b ? value_shape(l, b) : NULL;
    if (b && flat_out && !(bs && bs->rank == 1 && bs->dims[0] == wout)) {
        int64_t d[1] = {wout};
        b = rreshape(&r, rn(&r, "bias_row"), b, 1, d);
    }
    const char *y = flat_out ? rn(&r, "rows") : n->outputs[0];
    rlinear(&r, y, rn(&r, "product"), x, w, b);
    if (flat_out) {
        int64_t d[CK_TENSOR_MAX_RANK];
        int rank = 0;
        d[rank++] = -1; /* the rows: the batch, known or not */
        for (int i = 1; i < axis; i++)
            d[rank++] = xs->dims[i];
        if (n->p.trans_w || wr == 2)
            d[rank++] = wout;
        else
            for (int i = 1; i < wr && rank < CK_TENSOR_MAX_RANK; i++)
                d[rank++] = ws->dims[i];
        rreshape(&r, n->outputs[0], y, rank, d);
    }
    int err = r.err;
    for (size_t i = 0; i < r.nnames; i++)
        free(r.names[i]);
    free(r.names);
    return err;
}

static int lower_node(struct low *l, const struct ck_model_node *n)
{
    const struct ck_op_params *p = &n->p;
    switch (n->op) {
    case CK_OP_CONV2D:
        return p->groups != 1 ? lower_grouped(l, n) : emit_copy(l, n);
    case CK_OP_MAXPOOL:
    case CK_OP_AVGPOOL:
        if (p->ceil_mode || p->pad[0] != p->pad[2] || p->pad[1] != p->pad[3])
            return lower_pool(l, n);
        return emit_copy(l, n);
    case CK_OP_HARD_SIGMOID:
        return lower_hard(l, n, false);
    case CK_OP_HARD_SWISH:
        return lower_hard(l, n, true);
    case CK_OP_PAD:
        return lower_pad(l, n);
    case CK_OP_WHERE:
        return lower_where(l, n);
    case CK_OP_RNN:
    case CK_OP_GRU:
    case CK_OP_LSTM:
        return lower_recurrent(l, n);
    case CK_OP_EXPAND:
        return lower_expand(l, n);
    case CK_OP_DENSE:
        return lower_dense(l, n);
    case CK_OP_SHAPE:
        return lower_shape(l, n);
    case CK_OP_SLICE:
        return n->ninputs > 1 ? lower_slice_computed(l, n) : emit_copy(l, n);
    case CK_OP_CONSTANT_OF_SHAPE:
        return lower_fill(l, n);
    default:
        return emit_copy(l, n);
    }
}

/* What of a dynamic export's shape arithmetic ckptd writes no DL4J form
 * of is refused by name before anything is written: a trilu whose k is an
 * input and a resize whose sizes or scales are (no libnd4j op read here
 * takes them so). The rest is written as libnd4j's shape ops
 * (docs/samediff.md). */
static int refuse_unwritable(const struct ck_model *src, const char *label)
{
    for (size_t i = 0; i < src->nnodes; i++) {
        const struct ck_model_node *n = &src->nodes[i];
        if (n->ninputs > 1 && (n->op == CK_OP_TRILU || n->op == CK_OP_RESIZE))
            return ck_error(CK_EFORMAT,
                            "'%s': node '%s' (%s): its %s computed at run time (a dynamic "
                            "export), and ckptd writes no DL4J form of that; pack it as .mldef, "
                            "or export with fixed sizes (docs/samediff.md)",
                            label, n->name, ck_op_name(n->op),
                            n->op == CK_OP_TRILU ? "k is" : "sizes or scales are");
    }
    return 0;
}

/* Whether a value holds integers (a weight of whole numbers: ONNX's int64
 * constants, or float32 ones that say integers). */
static bool whole_weight(const struct ck_model *m, const char *v)
{
    const struct ck_tensor *t = ck_model_weight(m, v);
    uint64_t numel;
    if (!t || !t->data || ck_tensor_numel(t, &numel) < 0 || numel > (UINT64_C(1) << 20))
        return false;
    for (uint64_t i = 0; i < numel; i++) {
        int64_t x;
        if (ck_tensor_get_i64(t, i, &x) < 0)
            return false;
    }
    return true;
}

static bool is_compare(enum ck_op op)
{
    return op == CK_OP_EQUAL || op == CK_OP_LESS || op == CK_OP_GREATER || op == CK_OP_LESS_EQUAL ||
           op == CK_OP_GREATER_EQUAL;
}

/* The source's shape values (docs/model.md "Shape values": the output of
 * shape, size, range, an integer constant_of_shape, or of a node whose
 * inputs are all shape values or whole-numbered weights, one of them a
 * shape value). A comparison is written (as libnd4j's comparison, whose
 * result graph.fb declares BOOL) only on shape values: on tensor values
 * the canonical result is a float32 0/1 mask that a kernel may read as
 * data, which DL4J's bool array is not. */
static int check_compares(const struct ck_model *src, const char *label)
{
    struct ck_strset sv = CK_STRSET_INIT; /* the shape values so far (names borrowed) */
    int err = 0;
    for (size_t i = 0; i < src->nnodes && err >= 0; i++) {
        const struct ck_model_node *n = &src->nodes[i];
        bool from = n->op == CK_OP_SHAPE || n->op == CK_OP_SIZE || n->op == CK_OP_RANGE ||
                    (n->op == CK_OP_CONSTANT_OF_SHAPE && n->p.nints >= 1 && n->p.ints[0] == 1);
        bool any = false, rest = true;
        for (size_t k = 0; !from && k < n->ninputs; k++)
            any = any || ck_strset_get(&sv, n->inputs[k], NULL);
        for (size_t k = 0; any && k < n->ninputs && rest; k++) /* weights read only then */
            rest = ck_strset_get(&sv, n->inputs[k], NULL) || whole_weight(src, n->inputs[k]);
        bool is_sv = from || (any && rest);
        if (is_compare(n->op) && !is_sv)
            err = ck_error(CK_EFORMAT,
                           "'%s': node '%s': op '%s' has no DL4J equivalent on tensor values (its "
                           "result a float32 0/1 mask, DL4J's a bool array): only on shapes",
                           label, n->name, ck_op_name(n->op));
        for (size_t k = 0; is_sv && k < n->noutputs && err >= 0; k++)
            err = ck_strset_put(&sv, n->outputs[k], 0, NULL);
    }
    ck_strset_release(&sv);
    return err;
}

int ck_sdlower_build(const struct ck_model *src, const char *label, struct ck_sdlower *out)
{
    struct low l = {.src = src, .label = label, .out = out};
    struct ck_tensor_set *none = ck_tensor_set_new("samediff", NULL);
    int err;
    memset(out, 0, sizeof *out);
    if (!none)
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = refuse_unwritable(src, label)) < 0 || (err = check_compares(src, label)) < 0) {
        ck_tensor_set_free(none);
        return err;
    }
    if ((err = ck_model_new(none, "samediff", &out->m)) < 0)
        return err;
    for (size_t i = 0; i < src->nnodes && err >= 0; i++)
        err = lower_node(&l, &src->nodes[i]);
    if (l.shapes_state == 1)
        ck_model_shapes_release(&l.shapes);
    if (err < 0)
        ck_sdlower_release(out);
    return err;
}

void ck_sdlower_release(struct ck_sdlower *l)
{
    ck_model_free(l->m);
    free(l->rows);
    l->m = NULL;
    l->rows = NULL;
}
