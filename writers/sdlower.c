#include "writers/sdlower.h"

#include "common/error.h"
#include "model/shape.h"

#include <inttypes.h>
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

/* A constant the lowering adds (an int64 array in the written graph, not a
 * stored weight): name, shape and values copied into the lowered model. */
static int add_const_i64(struct low *l, const char *name, int rank, const int64_t *dims,
                         const int64_t *v, size_t n)
{
    struct ck_tensor t;
    void *mem;
    int err;
    memset(&t, 0, sizeof t);
    if ((err = ck_tensor_set_alloc(l->out->m->weights, n * sizeof *v, &mem)) < 0)
        return err;
    if (n)
        memcpy(mem, v, n * sizeof *v);
    t.name = (char *)name;
    t.dtype = CK_DT_I64;
    t.rank = rank;
    memcpy(t.dims, dims, (size_t)rank * sizeof *dims);
    t.nbytes = n * sizeof *v;
    t.data = mem;
    t.role = "constant";
    return ck_tensor_set_add(l->out->m->weights, &t, NULL);
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
    if (!shape_is_known(out))
        return shape_unknown(l, n, "(DL4J's Where takes operands of one shape)", n->outputs[0],
                             out);
    for (int k = 0; k < 3; k++)
        if (!shape_is_known(s[k] = value_shape(l, n->inputs[k])))
            return shape_unknown(l, n, "(DL4J's Where takes operands of one shape)", n->inputs[k],
                                 s[k]);
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
    default:
        return emit_copy(l, n);
    }
}

/* A graph that computes shapes at run time (a dynamic export's shape
 * values, docs/model.md) is refused by name: the SameDiff archives ckptd
 * writes hold static shapes (docs/samediff.md). */
static int refuse_dynamic(const struct ck_model *src, const char *label)
{
    for (size_t i = 0; i < src->nnodes; i++) {
        const struct ck_model_node *n = &src->nodes[i];
        bool computed = n->ninputs > 1 && (n->op == CK_OP_RESHAPE || n->op == CK_OP_EXPAND ||
                                           n->op == CK_OP_TILE || n->op == CK_OP_SLICE ||
                                           n->op == CK_OP_TRILU || n->op == CK_OP_RESIZE);
        /* not cast: it casts activations too (a cast of a shape value
         * comes after the shape or size it casts, refused first) */
        if (computed || n->op == CK_OP_SHAPE || n->op == CK_OP_SIZE || n->op == CK_OP_RANGE ||
            n->op == CK_OP_CONSTANT_OF_SHAPE)
            return ck_error(CK_EFORMAT,
                            "'%s': node '%s' (%s): the graph computes shapes at run time (a "
                            "dynamic export): SameDiff archives are written with static shapes "
                            "only; pack it as .mldef, or export with fixed sizes (docs/samediff.md)",
                            label, n->name, ck_op_name(n->op));
    }
    return 0;
}

int ck_sdlower_build(const struct ck_model *src, const char *label, struct ck_sdlower *out)
{
    struct low l = {.src = src, .label = label, .out = out};
    struct ck_tensor_set *none = ck_tensor_set_new("samediff", NULL);
    int err;
    memset(out, 0, sizeof *out);
    if (!none)
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = refuse_dynamic(src, label)) < 0) {
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
