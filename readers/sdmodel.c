#include "readers/sdmodel.h"

#include "common/error.h"
#include "model/dl4jops.h"
#include "model/shape.h"
#include "readers/nameidx.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VALUES 256

static const char *attr(const struct ck_graph_node *n, const char *key)
{
    for (size_t i = 0; i < n->nattrs; i++)
        if (!strcmp(n->attrs[i].key, key))
            return n->attrs[i].value;
    return NULL;
}

/* One argument value as the file wrote it: integers exactly (an iArg of
 * INT64_MAX, DL4J's "to the end of the axis", must not pass through a
 * double), reals as doubles. */
struct argval {
    int64_t i;
    double d;
    bool has_int; /* i holds the value exactly (false: a NaN, an infinity, out of range) */
};

/* One number of an argument list into v: an integer token with strtoll
 * (exact, out of range refused), anything else with strtod; a real used
 * where an integer is read is kept only when finite and in int64's range
 * (a NaN or 1e300 in a hostile file is refused, not converted). */
static int parse_number(const char *s, char **end, struct argval *v)
{
    errno = 0;
    long long ll = strtoll(s, end, 10);
    if (*end != s && **end != '.' && **end != 'e' && **end != 'E' && **end != 'n' &&
        **end != 'i' && **end != 'N' && **end != 'I') {
        if (errno)
            return -1;
        v->i = ll;
        v->d = (double)ll;
        v->has_int = true;
        return 0;
    }
    errno = 0;
    v->d = strtod(s, end);
    if (*end == s || errno)
        return -1;
    v->has_int = isfinite(v->d) && v->d >= -0x1p63 && v->d < 0x1p63;
    v->i = v->has_int ? (int64_t)v->d : 0;
    return 0;
}

/* "[1,2,3]" or "[true,false]" into v (at most max); the count, or -1. */
static int parse_list(const char *s, struct argval *v, int max)
{
    int n = 0;
    if (!s || *s++ != '[')
        return -1;
    while (*s && *s != ']') {
        char *end;
        if (n == max)
            return -1;
        if (!strncmp(s, "true", 4)) {
            v[n++] = (struct argval){1, 1, true};
            s += 4;
        } else if (!strncmp(s, "false", 5)) {
            v[n++] = (struct argval){0, 0, true};
            s += 5;
        } else {
            if (parse_number(s, &end, &v[n++]) < 0)
                return -1;
            s = end;
        }
        if (*s == ',')
            s++;
    }
    return *s == ']' ? n : -1;
}

struct positional {
    struct argval v[MAX_VALUES];
    int n, next;
};

static int load_pos(const struct ck_graph_node *n, const char *key, struct positional *p,
                    const char *file)
{
    const char *s = attr(n, key);
    p->next = 0;
    p->n = s ? parse_list(s, p->v, MAX_VALUES) : 0;
    if (p->n < 0)
        return ck_error(CK_EFORMAT, "'%s': node '%s': bad %s", file, n->name, key);
    return 0;
}

/* strided_slice's masks and lists as read, turned into p.ints at the end. */
struct slice_args {
    int64_t begin_mask, end_mask;
    int64_t l[3][MAX_VALUES];
    int n[3];
    bool seen;
};

/* The number of list arguments from a on (they share the rest of the
 * positional iArgs equally: strided_slice's begins, ends, strides). */
static int lists_from(const struct ck_dl4j_arg *a)
{
    int n = 0;
    for (; a->name; a++)
        n += ck_dl4j_arg_is_list(a);
    return n;
}

/* One argument's values into v (*n of them): named, else positional, else
 * the table's default. */
static int arg_values(const struct ck_dl4j_arg *a, const struct ck_graph_node *gn,
                      struct positional *pos, struct argval *v, int *n, const char *file)
{
    char key[160];
    snprintf(key, sizeof(key), "arg.%s", a->name);
    const char *named = attr(gn, key);
    if (named) {
        if ((*n = parse_list(named, v, MAX_VALUES)) < 0)
            return ck_error(CK_EFORMAT, "'%s': node '%s': bad argument '%s'", file, gn->name,
                            a->name);
        /* the positions mirror the names: what a name gave is not read again
         * as the next argument (split_v's empty sizes after its axis) */
        pos->next += ck_dl4j_arg_is_list(a) ? *n : 1;
        if (pos->next > pos->n)
            pos->next = pos->n;
    } else if (ck_dl4j_arg_is_list(a)) {
        int rest = pos->n - pos->next, lists = lists_from(a);
        if (rest < 0)
            rest = 0;
        if (rest % lists)
            return ck_error(CK_EFORMAT,
                            "'%s': node '%s': %d integer arguments for %d lists of equal length",
                            file, gn->name, rest, lists);
        *n = rest / lists;
        memcpy(v, pos->v + pos->next, (size_t)*n * sizeof v[0]);
        pos->next += *n;
    } else if (pos->next < pos->n) {
        v[0] = pos->v[pos->next++];
        *n = 1;
    } else {
        /* a default may be infinite (clipbyvalue's bounds): its integer only
         * when it has one (fuzz_samediff: -inf converted to a long) */
        bool exact = isfinite(a->def) && a->def >= -0x1p63 && a->def < 0x1p63;
        v[0] = (struct argval){exact ? (int64_t)a->def : 0, a->def, exact};
        *n = a->field == CK_DF_CONST ? 0 : 1;
    }
    bool want_int = ck_dl4j_arg_is_list(a) || ck_dl4j_arg_is_int(a);
    for (int k = 0; want_int && k < *n; k++)
        if (!v[k].has_int)
            return ck_error(CK_EFORMAT, "'%s': node '%s': argument '%s' is not an integer", file,
                            gn->name, a->name);
    return 0;
}

static int slice_arg(const struct ck_dl4j_arg *a, const struct argval *v, int n,
                     struct slice_args *sl, const struct ck_graph_node *gn, const char *file)
{
    sl->seen = true;
    if (a->field == CK_DF_ZERO) {
        if (n >= 1 && v[0].i != 0)
            return ck_error(CK_EFORMAT,
                            "'%s': node '%s': %s %" PRId64 " is not supported (only 0)", file,
                            gn->name, a->name, v[0].i);
    } else if (a->field == CK_DF_BEGIN_MASK || a->field == CK_DF_END_MASK) {
        *(a->field == CK_DF_BEGIN_MASK ? &sl->begin_mask : &sl->end_mask) = n >= 1 ? v[0].i : 0;
    } else {
        int k = a->field == CK_DF_BEGINS ? 0 : a->field == CK_DF_ENDS ? 1 : 2;
        for (int i = 0; i < n; i++)
            sl->l[k][i] = v[i].i;
        sl->n[k] = n;
    }
    return 0;
}

static int slice_finish(struct slice_args *sl, struct ck_model_node *mn,
                        const struct ck_graph_node *gn, const char *file)
{
    int64_t t[3 * MAX_VALUES];
    int err;
    if (sl->n[0] == 0 && (sl->begin_mask || sl->end_mask)) /* the input form: masks of what? */
        return ck_error(CK_EFORMAT,
                        "'%s': node '%s': strided_slice masks without bounds in its "
                        "arguments are not supported",
                        file, gn->name);
    if (sl->n[0] != sl->n[1] || sl->n[0] != sl->n[2])
        return ck_error(CK_EFORMAT, "'%s': node '%s': %d begins, %d ends and %d strides", file,
                        gn->name, sl->n[0], sl->n[1], sl->n[2]);
    if ((err = ck_dl4j_slice_triples(sl->begin_mask, sl->end_mask, sl->l[0], sl->l[1], sl->l[2],
                                     (size_t)sl->n[0], t)) < 0)
        return ck_error_wrap(err, "'%s': node '%s'", file, gn->name);
    if (sl->n[0] > 0 && (err = ck_model_node_set_ints(mn, t, 3 * (size_t)sl->n[0])) < 0)
        return err;
    return 0;
}

/* Sets the node's parameters from named arguments, else positional ones;
 * consts[i] (when not NULL) gets the value of row->args[i] when it is a
 * fixed one (CK_DF_CONST) the file gave, else stays as the caller set it. */
static int set_args(const struct ck_dl4j_op *row, const struct ck_graph_node *gn,
                    struct ck_model_node *mn, int64_t *consts, const char *file)
{
    struct positional pi, pt, pb;
    struct argval v[MAX_VALUES];
    struct slice_args *sl = NULL;
    int err;
    if ((err = load_pos(gn, "extraInteger", &pi, file)) < 0 ||
        (err = load_pos(gn, "extraParams", &pt, file)) < 0 ||
        (err = load_pos(gn, "extraBools", &pb, file)) < 0)
        return err;
    /* single values first, in table order, then the lists (as written) */
    for (int lists = 0; lists < 2; lists++)
        for (const struct ck_dl4j_arg *a = row->args; a->name; a++) {
            struct positional *pos = a->kind == 'i' ? &pi : a->kind == 't' ? &pt : &pb;
            int n = 0;
            if (ck_dl4j_arg_is_list(a) != (lists == 1))
                continue;
            if ((err = arg_values(a, gn, pos, v, &n, file)) < 0)
                goto out;
            if (a->field >= CK_DF_BEGIN_MASK) {
                if (!sl && !(sl = calloc(1, sizeof *sl))) {
                    err = ck_error(CK_ENOMEM, "out of memory");
                    goto out;
                }
                if ((err = slice_arg(a, v, n, sl, gn, file)) < 0)
                    goto out;
            } else if (a->field == CK_DF_INTS) {
                int64_t iv[MAX_VALUES];
                for (int k = 0; k < n; k++)
                    iv[k] = v[k].i;
                if (n > 0 && (err = ck_model_node_set_ints(mn, iv, (size_t)n)) < 0)
                    goto out;
            } else if (a->field == CK_DF_CAST_TO) {
                int64_t code = n >= 1 ? ck_dl4j_onnx_of_dtype(v[0].i) : -1;
                if (code < 0) {
                    err = ck_error(CK_EFORMAT,
                                   "'%s': node '%s': cast to DataType %" PRId64 " is not supported",
                                   file, gn->name, n >= 1 ? v[0].i : -1);
                    goto out;
                }
                if ((err = ck_model_node_set_ints(mn, &code, 1)) < 0)
                    goto out;
            } else if (n >= 1 && a->field != CK_DF_CONST) {
                ck_dl4j_arg_set(a, &mn->p, v[0].i, v[0].d);
            } else if (n >= 1 && consts) {
                consts[a - row->args] = v[0].i;
            }
        }
    if (sl)
        err = slice_finish(sl, mn, gn, file);
out:
    free(sl);
    return err;
}

/* A constant input's values (paddings, shape) as ints or a scalar. */
static int const_values(const struct ck_tensor_set *s, const struct ck_nameidx *ix,
                        const char *name, int64_t *out, size_t max, size_t *n)
{
    const struct ck_nameidx_entry *e = ck_nameidx_find(ix, name);
    uint64_t numel;
    if (!e)
        return CK_ENOENT;
    const struct ck_tensor *t = &s->tensors[e->index];
    if (!t->data || ck_tensor_numel(t, &numel) < 0 || numel > max)
        return CK_ENOENT;
    for (uint64_t i = 0; i < numel; i++)
        if (ck_tensor_get_i64(t, i, &out[i]) < 0)
            return CK_ENOENT; /* not integers: taken as a data input */
    *n = (size_t)numel;
    return 0;
}

/* Whether name is a stored array of one number (pad's or fill's value: any
 * real, -inf too). */
static bool const_scalar(const struct ck_tensor_set *s, const struct ck_nameidx *ix,
                         const char *name)
{
    const struct ck_nameidx_entry *e = ck_nameidx_find(ix, name);
    uint64_t numel;
    const struct ck_tensor *t = e ? &s->tensors[e->index] : NULL;
    return t && t->data && ck_tensor_numel(t, &numel) == 0 && numel == 1 &&
           ck_dtype_size(t->dtype) > 0 && t->nbytes >= ck_dtype_size(t->dtype) &&
           t->dtype != CK_DT_BOOL && t->dtype != CK_DT_QI8 && t->dtype != CK_DT_QI16;
}

/* The node's DL4J inputs into canonical slots (constants that carry
 * parameters taken into mn's parameters instead). */
static int map_inputs(const struct ck_dl4j_op *row, const struct ck_tensor_set *s,
                      const struct ck_nameidx *ix, const struct ck_graph_node *gn,
                      struct ck_model_node *mn, const char **slots, size_t cap, size_t *nslots,
                      bool *consumed, const char *file)
{
    int err;
    for (size_t k = 0; k < gn->ninputs; k++) {
        int64_t vals[CK_MODEL_MAX_INTS];
        size_t nv;
        if ((int)k == row->ints_input &&
            const_values(s, ix, gn->inputs[k], vals, CK_MODEL_MAX_INTS, &nv) == 0) {
            if ((err = ck_model_node_set_ints(mn, vals, nv)) < 0)
                return err;
            consumed[ck_nameidx_find(ix, gn->inputs[k])->index] = true;
            continue;
        }
        if ((int)k == row->scalar_input && const_scalar(s, ix, gn->inputs[k])) {
            const struct ck_tensor *t = &s->tensors[ck_nameidx_find(ix, gn->inputs[k])->index];
            mn->p.scalar = (float)ck_tensor_get_f64(t, 0);
            consumed[ck_nameidx_find(ix, gn->inputs[k])->index] = true;
            if (row->op == CK_OP_CONSTANT_OF_SHAPE) {
                /* fill's output has its value's dtype: an integer value
                 * makes the canonical integer constant_of_shape */
                int64_t is_int = ck_dtype_is_int(t->dtype);
                if ((err = ck_model_node_set_ints(mn, &is_int, 1)) < 0)
                    return err;
            }
            continue;
        }
        size_t slot = row->inputs[0] < 0                              ? k
                      : k < CK_DL4J_MAX_INPUTS && row->inputs[k] >= 0 ? (size_t)row->inputs[k]
                                                                      : cap;
        if (slot >= cap || slots[slot])
            return ck_error(CK_EFORMAT, "'%s': node '%s': DL4J op '%s' does not take input %zu",
                            file, gn->name, gn->op, k);
        slots[slot] = gn->inputs[k];
        if (slot + 1 > *nslots)
            *nslots = slot + 1;
    }
    return 0;
}

/* strided_slice in libnd4j's input form (x, begin, end, strides: the five
 * masks the only iArgs, tensor/strided_slice.cpp), what ckptd writes for a
 * slice whose bounds are computed: the canonical slice (x, starts, ends),
 * ONNX's form with the axes from 0 and steps 1; the strides must be a
 * constant of 1s and the masks 0 (no canonical form says them). */
static int slice_inputs(const struct ck_tensor_set *s, const struct ck_nameidx *ix,
                        const struct ck_graph_node *gn, const struct ck_model_node *mn,
                        const char **slots, size_t *nslots, bool *consumed, const char *file)
{
    int64_t v[CK_MODEL_MAX_INTS];
    size_t nv = 0;
    bool ones = *nslots == 4 && const_values(s, ix, slots[3], v, CK_MODEL_MAX_INTS, &nv) == 0;
    for (size_t i = 0; ones && i < nv; i++)
        ones = v[i] == 1;
    if (!ones || mn->p.nints)
        return ck_error(CK_EFORMAT,
                        "'%s': node '%s': strided_slice with its bounds as inputs is read only as "
                        "(x, begin, end, strides of 1s) with every mask 0",
                        file, gn->name);
    consumed[ck_nameidx_find(ix, slots[3])->index] = true;
    slots[3] = NULL;
    *nslots = 3;
    return 0;
}

static int map_node(struct ck_model *m, const struct ck_tensor_set *s, const struct ck_nameidx *ix,
                    const struct ck_graph_node *gn, bool *consumed, const char *file)
{
    const struct ck_dl4j_op *row = ck_dl4j_by_name(gn->op);
    struct ck_model_node *mn;
    int err;
    if (!row)
        return ck_error(CK_EFORMAT, "'%s': node '%s': DL4J op '%s' has no canonical mapping", file,
                        gn->name, gn->op);
    if ((err = ck_model_add_node(m, gn->name, row->op, &mn)) < 0)
        return err;
    ck_dl4j_apply_variant(row, &mn->p);
    if ((err = set_args(row, gn, mn, NULL, file)) < 0)
        return err;
    /* DL4J input k goes to canonical slot row->inputs[k] (same order when unset);
     * a reordering row has fewer than CK_DL4J_MAX_INPUTS slots */
    size_t cap = gn->ninputs > CK_DL4J_MAX_INPUTS ? gn->ninputs : CK_DL4J_MAX_INPUTS;
    const char **slots = calloc(cap + 1, sizeof *slots);
    size_t nslots = 0;
    if (!slots)
        return ck_error(CK_ENOMEM, "out of memory");
    err = map_inputs(row, s, ix, gn, mn, slots, cap, &nslots, consumed, file);
    if (err == 0 && row->op == CK_OP_SLICE && nslots > 1)
        err = slice_inputs(s, ix, gn, mn, slots, &nslots, consumed, file);
    for (size_t k = 0; k < nslots && err == 0; k++) {
        if (!slots[k])
            err = ck_error(CK_EFORMAT, "'%s': node '%s': input %zu missing", file, gn->name, k);
        else
            err = ck_model_node_add_input(mn, slots[k]);
    }
    free(slots);
    if (err < 0)
        return err;
    for (size_t k = 0; k < gn->noutputs; k++)
        if ((err = ck_model_node_add_output(mn, gn->outputs[k])) < 0)
            return err;
    return 0;
}

/* What the mapping of one graph needs beyond a node: the values' producers
 * (for the shape of depthwise_conv2d's weights). */
struct rctx {
    struct ck_model *m;
    const struct ck_tensor_set *s;
    const struct ck_nameidx *ix; /* the tensors */
    const struct ck_graph *g;
    const char *file;
    size_t cur;             /* the raw node being mapped */
    size_t *canon_of;       /* raw node i's (last) canonical node; SIZE_MAX none */
    struct ck_nameidx outs; /* every raw node output (built on first use) */
    size_t *out_node;       /* outs entry i: its raw node */
    bool have_outs, tried_outs;
};

static int index_outputs(struct rctx *c)
{
    size_t n = 0, k = 0;
    c->tried_outs = true; /* once: a failure is not retried per node */
    for (size_t i = 0; i < c->g->nnodes; i++)
        n += c->g->nodes[i].noutputs;
    const char **names = malloc((n + 1) * sizeof *names);
    c->out_node = malloc((n + 1) * sizeof *c->out_node);
    if (!names || !c->out_node) {
        free(names);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < c->g->nnodes; i++)
        for (size_t j = 0; j < c->g->nodes[i].noutputs; j++) {
            c->out_node[k] = i;
            names[k++] = c->g->nodes[i].outputs[j];
        }
    int err = ck_nameidx_names(&c->outs, names, n);
    free(names); /* the index keeps the strings, which the graph owns */
    c->have_outs = err >= 0;
    return err;
}

/* The dims of a value when reading: a stored array's, or those of a
 * reshape, permute or identity of one (up to 8 deep), as mapped so far;
 * -1 when not known this way. */
static int value_dims(struct rctx *c, const char *name, int depth, struct ck_shape *out)
{
    const struct ck_nameidx_entry *e = ck_nameidx_find(c->ix, name);
    if (e && c->s->tensors[e->index].data) {
        const struct ck_tensor *t = &c->s->tensors[e->index];
        if (t->rank < 0 || t->rank > CK_TENSOR_MAX_RANK)
            return -1;
        out->rank = t->rank;
        memcpy(out->dims, t->dims, (size_t)t->rank * sizeof *t->dims);
        return 0;
    }
    if (depth == 0 || (!c->tried_outs && index_outputs(c) < 0) || !c->have_outs)
        return -1;
    const struct ck_nameidx_entry *o = ck_nameidx_find(&c->outs, name);
    size_t j = o ? c->out_node[o->index] : SIZE_MAX;
    if (j >= c->cur || c->canon_of[j] == SIZE_MAX)
        return -1;
    const struct ck_model_node *n = &c->m->nodes[c->canon_of[j]];
    struct ck_shape in;
    if (n->noutputs != 1 || strcmp(n->outputs[0], name) || n->ninputs < 1 ||
        value_dims(c, n->inputs[0], depth - 1, &in) < 0)
        return -1;
    const struct ck_op_params *p = &n->p;
    int64_t numel = 1, known = 1, infer = -1;
    for (int i = 0; i < in.rank; i++)
        if (in.dims[i] < 0 || __builtin_mul_overflow(numel, in.dims[i], &numel))
            return -1;
    switch (n->op) {
    case CK_OP_IDENTITY:
        *out = in;
        return 0;
    case CK_OP_TRANSPOSE: {
        bool seen[CK_TENSOR_MAX_RANK] = {0};
        if (p->nints != (size_t)in.rank)
            return -1;
        out->rank = in.rank;
        for (int i = 0; i < in.rank; i++) {
            int64_t a = p->ints[i] < 0 ? p->ints[i] + in.rank : p->ints[i];
            if (a < 0 || a >= in.rank || seen[a])
                return -1;
            seen[a] = true;
            out->dims[i] = in.dims[a];
        }
        return 0;
    }
    case CK_OP_RESHAPE:
        if (p->nints < 1 || p->nints > CK_TENSOR_MAX_RANK)
            return -1;
        out->rank = (int)p->nints;
        for (int i = 0; i < out->rank; i++) {
            int64_t d = p->ints[i];
            if (d == 0 && i < in.rank)
                d = in.dims[i];
            if (d == -1 && infer < 0) {
                infer = i;
                continue;
            }
            if (d < 1 || __builtin_mul_overflow(known, d, &known))
                return -1;
            out->dims[i] = d;
        }
        if (infer >= 0 && known && numel % known == 0)
            out->dims[infer] = numel / known;
        else if (infer >= 0 || known != numel)
            return -1;
        return 0;
    default:
        return -1;
    }
}

/* libnd4j depthwise_conv2d (x, W, [b]): iArgs kH, kW, sH, sW, pH, pW, dH, dW,
 * isSameMode, then dataFormat (absent: NCHW) and wFormat (absent: 0, W
 * [kH, kW, iC, mC]; 1 [mC, iC, kH, kW]; 2 [mC, kH, kW, iC]); output channel
 * c mC + m. Read as the canonical conv2d with groups iC: W permuted to
 * [iC, mC, kH, kW] and reshaped to [iC mC, 1, kH, kW]. */
static int map_depthwise(struct rctx *c, const struct ck_graph_node *gn,
                         const struct ck_dl4j_op *row)
{
    static const int64_t perms[3][4] = {{2, 3, 0, 1}, {1, 0, 2, 3}, {3, 0, 1, 2}};
    static const int at[3][4] = {{2, 3, 0, 1}, {1, 0, 2, 3}, {3, 0, 1, 2}}; /* iC, mC, kH, kW */
    int64_t consts[CK_DL4J_MAX_ARGS];
    struct ck_model_node *mn, tmp = {.name = gn->name};
    struct ck_shape w;
    char *perm = NULL, *oihw = NULL;
    int err;
    for (int i = 0; i < CK_DL4J_MAX_ARGS; i++)
        consts[i] = INT64_MIN;
    if (gn->ninputs < 2 || gn->ninputs > 3 || gn->noutputs != 1)
        return ck_error(CK_EFORMAT,
                        "'%s': node '%s': depthwise_conv2d takes x, weights [, bias] "
                        "and gives one output",
                        c->file, gn->name);
    ck_op_params_init(&tmp.p);
    err = set_args(row, gn, &tmp, consts, c->file);
    free(tmp.p.ints); /* no list arguments: none to keep */
    tmp.p.ints = NULL;
    tmp.p.nints = 0;
    if (err < 0)
        return err;
    int64_t same = 0, nhwc = 0, wf = 0;
    for (int i = 0; row->args[i].name; i++) {
        const char *a = row->args[i].name;
        int64_t v = consts[i];
        if (v == INT64_MIN)
            continue;
        *(strcmp(a, "isSameMode") == 0 ? &same : strcmp(a, "dataFormat") == 0 ? &nhwc : &wf) = v;
    }
    if (same != 0 || nhwc != 0 || wf < 0 || wf > 2)
        return ck_error(CK_EFORMAT,
                        "'%s': node '%s': depthwise_conv2d with isSameMode %" PRId64
                        ", dataFormat %" PRId64 " and wFormat %" PRId64
                        " is not supported (only 0, 0 (NCHW) and 0, 1 or 2)",
                        c->file, gn->name, same, nhwc, wf);
    const int *ix = at[wf];
    if (value_dims(c, gn->inputs[1], 8, &w) < 0 || w.rank != 4)
        return ck_error(CK_EFORMAT,
                        "'%s': node '%s': depthwise_conv2d weights '%s' are not a stored rank-4 "
                        "array (or a reshape or permute of one): their shape is not known",
                        c->file, gn->name, gn->inputs[1]);
    int64_t ic = w.dims[ix[0]], mc = w.dims[ix[1]], oc;
    if (ic < 1 || mc < 1 || __builtin_mul_overflow(ic, mc, &oc) ||
        tmp.p.kernel[0] != w.dims[ix[2]] || tmp.p.kernel[1] != w.dims[ix[3]])
        return ck_error(CK_EFORMAT,
                        "'%s': node '%s': depthwise_conv2d kernel %" PRId64 "x%" PRId64
                        " does not match its weights [%" PRId64 ", %" PRId64 ", %" PRId64
                        ", %" PRId64 "] (wFormat %" PRId64 ")",
                        c->file, gn->name, tmp.p.kernel[0], tmp.p.kernel[1], w.dims[0], w.dims[1],
                        w.dims[2], w.dims[3], wf);
    tmp.p.groups = ic;
    /* three nodes: permute, reshape, conv2d */
    int64_t shape[4] = {oc, 1, w.dims[ix[2]], w.dims[ix[3]]};
    if (asprintf(&perm, "%s/weights_iC_mC_kH_kW", gn->name) < 0 ||
        asprintf(&oihw, "%s/weights_oihw", gn->name) < 0) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    if ((err = ck_model_add_node(c->m, perm, CK_OP_TRANSPOSE, &mn)) < 0 ||
        (err = ck_model_node_set_ints(mn, perms[wf], 4)) < 0 ||
        (err = ck_model_node_add_input(mn, gn->inputs[1])) < 0 ||
        (err = ck_model_node_add_output(mn, perm)) < 0 ||
        (err = ck_model_add_node(c->m, oihw, CK_OP_RESHAPE, &mn)) < 0 ||
        (err = ck_model_node_set_ints(mn, shape, 4)) < 0 ||
        (err = ck_model_node_add_input(mn, perm)) < 0 ||
        (err = ck_model_node_add_output(mn, oihw)) < 0 ||
        (err = ck_model_add_node(c->m, gn->name, CK_OP_CONV2D, &mn)) < 0)
        goto out;
    mn->p = tmp.p;
    if ((err = ck_model_node_add_input(mn, gn->inputs[0])) < 0 ||
        (err = ck_model_node_add_input(mn, oihw)) < 0 ||
        (gn->ninputs > 2 && (err = ck_model_node_add_input(mn, gn->inputs[2])) < 0) ||
        (err = ck_model_node_add_output(mn, gn->outputs[0])) < 0)
        goto out;
out:
    free(perm);
    free(oihw);
    return err;
}

/* int8 weights stored with a "<name>/scale" constant become float32. */
static int dequantize(struct ck_tensor_set *s, const struct ck_nameidx *ix, bool *drop)
{
    char name[4096];
    int err;
    for (size_t i = 0; i < s->ntensors; i++) {
        struct ck_tensor *t = &s->tensors[i];
        uint64_t numel;
        if ((t->dtype != CK_DT_QI8 && t->dtype != CK_DT_I8) || !t->data)
            continue;
        snprintf(name, sizeof(name), "%s/scale", t->name);
        const struct ck_nameidx_entry *e = ck_nameidx_find(ix, name);
        if (!e || !s->tensors[e->index].data || ck_tensor_numel(t, &numel) < 0)
            continue;
        float scale = (float)ck_tensor_get_f64(&s->tensors[e->index], 0);
        void *mem;
        if ((err = ck_tensor_set_alloc(s, numel * 4, &mem)) < 0)
            return err;
        float *f = mem;
        for (uint64_t k = 0; k < numel; k++)
            f[k] = (float)(int8_t)t->data[k] * scale;
        t->dtype = CK_DT_F32;
        t->data = mem;
        t->nbytes = numel * 4;
        t->big_endian = false;
        drop[e->index] = true;
    }
    return 0;
}

static int build(struct ck_model *m, struct ck_tensor_set *s, const char *file)
{
    static const int64_t none[1] = {0};
    const struct ck_graph *g = s->graph;
    struct ck_nameidx ix;
    /* consumed: a constant read into a node's parameters (pad's paddings,
     * reshape's shape, a scalar): it leaves the weights unless a node also
     * reads it as data */
    bool *drop = calloc(s->ntensors + 1, 1), *consumed = calloc(s->ntensors + 1, 1);
    int err;
    if (!drop || !consumed) {
        free(drop), free(consumed);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    if ((err = ck_nameidx_tensors(&ix, s)) < 0) {
        free(drop), free(consumed);
        return err;
    }
    for (size_t i = 0; i < g->ninputs && err >= 0; i++) {
        const struct ck_nameidx_entry *e = ck_nameidx_find(&ix, g->inputs[i]);
        const struct ck_tensor *t = e ? &s->tensors[e->index] : NULL;
        err = ck_model_add_io(m, false, g->inputs[i], t ? t->dtype : CK_DT_F32, t ? t->rank : 0,
                              t ? t->dims : none);
    }
    for (size_t i = 0; i < g->noutputs && err >= 0; i++)
        err = ck_model_add_io(m, true, g->outputs[i], CK_DT_F32, 0, none);
    struct rctx c = {.m = m, .s = s, .ix = &ix, .g = g, .file = file};
    if (err >= 0 && !(c.canon_of = malloc((g->nnodes + 1) * sizeof *c.canon_of)))
        err = ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < g->nnodes && err >= 0; i++) {
        const struct ck_dl4j_op *row = ck_dl4j_by_name(g->nodes[i].op);
        c.cur = i;
        c.canon_of[i] = SIZE_MAX;
        if (row && row->variant == CK_DV_DEPTHWISE)
            err = map_depthwise(&c, &g->nodes[i], row);
        else
            err = map_node(m, s, &ix, &g->nodes[i], consumed, file);
        if (err >= 0 && m->nnodes)
            c.canon_of[i] = m->nnodes - 1;
    }
    if (err >= 0)
        err = dequantize(s, &ix, drop);
    for (size_t i = 0; i < m->nnodes && err >= 0; i++)
        for (size_t k = 0; k < m->nodes[i].ninputs; k++) {
            const struct ck_nameidx_entry *e = ck_nameidx_find(&ix, m->nodes[i].inputs[k]);
            if (e)
                consumed[e->index] = false;
        }
    for (size_t i = 0; i < m->noutputs && err >= 0; i++) {
        const struct ck_nameidx_entry *e = ck_nameidx_find(&ix, m->outputs[i].name);
        if (e)
            consumed[e->index] = false;
    }
    for (size_t i = 0; i < s->ntensors; i++)
        drop[i] = drop[i] || consumed[i];
    free(consumed);
    ck_nameidx_release(&ix);
    if (c.have_outs)
        ck_nameidx_release(&c.outs);
    free(c.out_node);
    free(c.canon_of);
    /* Weights are values with data; the rest (placeholders, declared-only) leave. */
    size_t o = 0;
    for (size_t i = 0; i < s->ntensors; i++) {
        if (s->tensors[i].data && !drop[i])
            s->tensors[o++] = s->tensors[i];
        else
            free(s->tensors[i].name);
    }
    s->ntensors = o;
    free(drop);
    return err;
}

int ck_samediff_to_model(struct ck_tensor_set *s, struct ck_model **out)
{
    struct ck_model *m = NULL;
    char file[4096];
    int err;
    *out = NULL;
    snprintf(file, sizeof(file), "%s", s->path ? s->path : "");
    if (!s->graph) {
        ck_tensor_set_free(s);
        return ck_error(CK_EFORMAT, "'%s': no graph", file);
    }
    if ((err = ck_model_new(s, "samediff", &m)) < 0)
        return err;
    if ((err = build(m, s, file)) < 0 || (err = ck_model_check(m)) < 0) {
        ck_model_free(m);
        return err;
    }
    *out = m;
    return 0;
}
