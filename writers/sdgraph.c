#include "writers/sdgraph.h"

#include "common/error.h"
#include "model/dl4jops.h"
#include "model/sdschema.h"
#include "writers/sdarray.h"
#include "writers/sdlower.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* graph.fb's FlatGraph has the fields before updaterState: optimizer state
 * goes to the tag's updater/ files */
#define GRAPH_SLOTS FG_UPDATER
enum { VT_VARIABLE = 0, VT_CONSTANT = 1, VT_ARRAY = 2, VT_PLACEHOLDER = 3 };
enum { OPTYPE_CUSTOM = 21, DT_FLOAT = 5 };

struct var {
    const char *name;
    int32_t a, b;
    enum ck_dtype dtype; /* the canonical dtype (docs/model.md "Dtypes") */
    bool weight;
};

struct gctx {
    struct ck_fbb *b;
    const struct ck_model *m;
    const struct ck_model *nm;            /* m's nodes as DL4J ops (writers/sdlower.h) */
    const struct ck_dl4j_op *const *rows; /* nm's nodes' DL4J ops */
    const char *label;
    struct var *vars; /* sorted by name after collection */
    size_t nvars, cap;
};

static int var_cmp(const void *x, const void *y)
{
    return strcmp(((const struct var *)x)->name, ((const struct var *)y)->name);
}

static int add_var(struct gctx *g, const char *name, int32_t a, int32_t b)
{
    if (g->nvars == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 64;
        struct var *n = realloc(g->vars, cap * sizeof(*n));
        if (!n)
            return ck_error(CK_ENOMEM, "out of memory");
        g->vars = n;
        g->cap = cap;
    }
    g->vars[g->nvars++] = (struct var){name, a, b, CK_DT_F32, false};
    return 0;
}

static struct var *lookup(const struct gctx *g, const char *name)
{
    struct var key = {name, 0, 0, CK_DT_F32, false};
    return g->nvars ? bsearch(&key, g->vars, g->nvars, sizeof(key), var_cmp) : NULL;
}

static uint32_t int_pair(struct ck_fbb *b, int32_t x, int32_t y)
{
    static const uint8_t sz[2] = {4, 4};
    struct ck_fbb_table t;
    ck_fbb_table(b, &t, sz, 2);
    ck_fbb_set_i32(b, &t, 0, x);
    ck_fbb_set_i32(b, &t, 1, y);
    return t.pos;
}

/* One FlatVariable; arr: an inline ndarray (or NULL), shape from dims. */
static uint32_t variable(struct gctx *g, const char *name, int32_t a, int32_t bb, int dtype,
                         int vartype, int rank, const int64_t *dims, const struct ck_tensor *arr,
                         int *err)
{
    struct ck_fbb *b = g->b;
    uint8_t sz[FV_NSLOTS] = {4, 4, 1, rank >= 0 ? 4 : 0, arr ? 4 : 0, 0, 1};
    struct ck_fbb_table t;
    ck_fbb_table(b, &t, sz, FV_NSLOTS);
    ck_fbb_set_u8(b, &t, FV_DTYPE, (uint8_t)dtype);
    ck_fbb_set_u8(b, &t, FV_VARTYPE, (uint8_t)vartype);
    ck_fbb_set_off(b, &t, FV_ID, int_pair(b, a, bb));
    ck_fbb_set_off(b, &t, FV_NAME, ck_fbb_cstring(b, name));
    if (rank >= 0)
        ck_fbb_set_off(b, &t, FV_SHAPE, ck_fbb_vec_i64(b, dims, (uint32_t)rank));
    if (arr) {
        uint32_t at;
        float unused;
        if ((*err = ck_sdarray_write(b, arr, CK_DT_INVALID, g->label, &at, &unused)) < 0)
            return 0;
        ck_fbb_set_off(b, &t, FV_NDARRAY, at);
    }
    return t.pos;
}

static int collect(struct gctx *g, const struct ck_sdgraph_weight *w, size_t nw)
{
    const struct ck_model *m = g->m, *nm = g->nm;
    int32_t next = (int32_t)nm->nnodes + 1;
    int err = 0;
    for (size_t i = 0; i < nw && err >= 0; i++)
        err = add_var(g, w[i].t->name, next++, 0);
    for (size_t i = 0; i < m->ninputs && err >= 0; i++)
        err = add_var(g, m->inputs[i].name, next++, 0);
    for (size_t i = 0; i < nm->weights->ntensors && err >= 0; i++)
        err = add_var(g, nm->weights->tensors[i].name, next++, 0);
    for (size_t i = 0; i < nm->nnodes && err >= 0; i++)
        for (size_t k = 0; k < nm->nodes[i].noutputs && err >= 0; k++)
            err = add_var(g, nm->nodes[i].outputs[k], (int32_t)i + 1, (int32_t)k);
    if (err < 0)
        return err;
    qsort(g->vars, g->nvars, sizeof(*g->vars), var_cmp);
    for (size_t i = 1; i < g->nvars; i++)
        if (!strcmp(g->vars[i - 1].name, g->vars[i].name))
            return ck_error(CK_EFORMAT, "'%s': value '%s' is defined twice", g->label,
                            g->vars[i].name);
    return 0;
}

static bool params_as_inputs(const struct ck_model_node *n)
{
    return n->ninputs > 1 &&
           (n->op == CK_OP_RESHAPE || n->op == CK_OP_EXPAND || n->op == CK_OP_TILE ||
            n->op == CK_OP_SLICE || n->op == CK_OP_TRILU || n->op == CK_OP_RESIZE);
}

/* Every node output's canonical dtype, by the rule the engine tags values
 * with (infer/values.c, ck_infer_dtypes; docs/model.md "Dtypes"): a cast's
 * target, bool for the comparisons and not/and/or/xor, int64 for shape,
 * size, argmax, argmin, an integer constant_of_shape, else the first
 * computing input's (not a weight; where's a or b; a gather's table, a
 * computed reshape's or expand's data). The lowered nodes are in order. */
static void value_dtypes(struct gctx *g, const struct ck_sdgraph_weight *w, size_t nw)
{
    const struct ck_model *m = g->m, *nm = g->nm;
    struct var *v;
    for (size_t i = 0; i < nw; i++)
        if ((v = lookup(g, w[i].t->name)))
            v->dtype = w[i].t->dtype, v->weight = true;
    for (size_t i = 0; i < nm->weights->ntensors; i++)
        if ((v = lookup(g, nm->weights->tensors[i].name)))
            v->dtype = nm->weights->tensors[i].dtype, v->weight = true;
    for (size_t i = 0; i < m->ninputs; i++)
        if ((v = lookup(g, m->inputs[i].name)))
            v->dtype = m->inputs[i].dtype == CK_DT_INVALID ? CK_DT_F32 : m->inputs[i].dtype;
    for (size_t i = 0; i < nm->nnodes; i++) {
        const struct ck_model_node *n = &nm->nodes[i];
        size_t from = n->op == CK_OP_WHERE && n->ninputs > 1 ? 1 : 0, pick = from;
        bool first_only = n->op == CK_OP_GATHER || params_as_inputs(n);
        for (size_t k = n->ninputs; !first_only && k-- > from;) {
            const struct var *x = lookup(g, n->inputs[k]);
            if (x && !x->weight)
                pick = k;
        }
        const struct var *x = pick < n->ninputs ? lookup(g, n->inputs[pick]) : NULL;
        enum ck_dtype t = x ? x->dtype : CK_DT_F32;
        if (n->op == CK_OP_CAST)
            t = n->p.nints == 1 ? ck_op_cast_dtype(n->p.ints[0]) : CK_DT_F32;
        else if (n->op >= CK_OP_EQUAL && n->op <= CK_OP_XOR)
            t = CK_DT_BOOL;
        else if (n->op == CK_OP_SHAPE || n->op == CK_OP_SIZE || n->op == CK_OP_ARGMAX ||
                 n->op == CK_OP_ARGMIN)
            t = CK_DT_I64;
        else if (n->op == CK_OP_CONSTANT_OF_SHAPE)
            t = n->p.nints >= 1 && n->p.ints[0] == 1 ? CK_DT_I64 : CK_DT_F32;
        for (size_t k = 0; k < n->noutputs; k++)
            if ((v = lookup(g, n->outputs[k])))
                v->dtype = t == CK_DT_INVALID ? CK_DT_F32 : t;
    }
}

/* The DType a computed value is declared with: integers and bools as they
 * are (a shape value is INT64, nd4j's LONG: libnd4j's shape_of gives int64
 * and reshape, gather and range read integer inputs), every float type as
 * FLOAT (the engine computes in float32; archives ckptd wrote before held
 * FLOAT throughout). */
static int declared_dtype(const struct var *v)
{
    int dt = v && (ck_dtype_is_int(v->dtype) || v->dtype == CK_DT_BOOL) ? ck_sdarray_dtype(v->dtype)
                                                                        : -1;
    return dt < 0 ? DT_FLOAT : dt;
}

static int write_variables(struct gctx *g, const struct ck_sdgraph_weight *w, size_t nw,
                           uint32_t vec, size_t nscales)
{
    const struct ck_model *m = g->m;
    struct ck_fbb *b = g->b;
    uint32_t k = 0;
    int err = 0;
    const struct ck_model *nm = g->nm;
    int32_t next_scale = (int32_t)(nm->nnodes + 1 + nw + m->ninputs + nm->weights->ntensors);
    for (size_t i = 0; i < nw; i++) {
        const struct ck_tensor *t = w[i].t;
        const struct var *v = lookup(g, t->name);
        int vt = t->role && !strcmp(t->role, "constant") ? VT_CONSTANT : VT_VARIABLE;
        ck_fbb_vec_set_off(b, vec, k++,
                           variable(g, t->name, v->a, v->b, ck_sdarray_dtype(w[i].stored), vt,
                                    t->rank, t->dims, NULL, &err));
        if (w[i].stored == CK_DT_QI8) {
            char name[4096];
            struct ck_tensor s;
            unsigned char be[4];
            uint32_t u;
            memcpy(&u, &w[i].scale, 4);
            for (int q = 0; q < 4; q++)
                be[q] = (unsigned char)(u >> (24 - 8 * q));
            memset(&s, 0, sizeof(s));
            snprintf(name, sizeof(name), "%s/scale", t->name);
            s.name = name;
            s.dtype = CK_DT_F32;
            s.nbytes = 4;
            s.data = be;
            s.big_endian = true;
            s.role = "constant";
            ck_fbb_vec_set_off(
                b, vec, k++,
                variable(g, name, next_scale++, 0, DT_FLOAT, VT_CONSTANT, 0, NULL, &s, &err));
        }
        if (err < 0)
            return err;
    }
    (void)nscales;
    for (size_t i = 0; i < m->ninputs; i++) {
        const struct ck_model_io *io = &m->inputs[i];
        const struct var *v = lookup(g, io->name);
        int dt = ck_sdarray_dtype(io->dtype);
        ck_fbb_vec_set_off(b, vec, k++,
                           variable(g, io->name, v->a, v->b, dt < 0 ? DT_FLOAT : dt, VT_PLACEHOLDER,
                                    io->rank, io->dims, NULL, &err));
    }
    /* the lowering's own constants (pad's paddings), inline as DL4J's files hold them */
    for (size_t i = 0; i < nm->weights->ntensors && err >= 0; i++) {
        const struct ck_tensor *t = &nm->weights->tensors[i];
        const struct var *v = lookup(g, t->name);
        ck_fbb_vec_set_off(b, vec, k++,
                           variable(g, t->name, v->a, v->b, ck_sdarray_dtype(t->dtype),
                                    VT_CONSTANT, t->rank, t->dims, t, &err));
    }
    if (err < 0)
        return err;
    for (size_t i = 0; i < nm->nnodes; i++)
        for (size_t o = 0; o < nm->nodes[i].noutputs; o++)
            ck_fbb_vec_set_off(b, vec, k++,
                               variable(g, nm->nodes[i].outputs[o], (int32_t)i + 1, (int32_t)o,
                                        declared_dtype(lookup(g, nm->nodes[i].outputs[o])),
                                        VT_ARRAY, -1, NULL, NULL, &err));
    return err;
}

static uint32_t property(struct ck_fbb *b, const struct ck_dl4j_arg *a,
                         const struct ck_op_params *p)
{
    int slot = ck_dl4j_arg_is_list(a) || a->kind == 'i' ? FP_L : a->kind == 't' ? FP_D : FP_B;
    uint8_t sz[FP_NSLOTS] = {4};
    sz[slot] = 4;
    struct ck_fbb_table t;
    ck_fbb_table(b, &t, sz, FP_NSLOTS);
    ck_fbb_set_off(b, &t, FP_NAME, ck_fbb_cstring(b, a->name));
    double v = ck_dl4j_arg_get(a, p);
    uint32_t vec;
    if (ck_dl4j_arg_is_list(a)) {
        int64_t l[CK_MODEL_MAX_INTS];
        size_t nl = 0;
        (void)ck_dl4j_arg_list(a, p, l, CK_MODEL_MAX_INTS, &nl); /* checked by write_node */
        vec = ck_fbb_vec_i64(b, l, (uint32_t)nl);
    } else if (slot == FP_L) {
        int64_t l = (int64_t)v;
        vec = ck_fbb_vec_i64(b, &l, 1);
    } else if (slot == FP_D) {
        vec = ck_fbb_vec_f64(b, &v, 1);
    } else {
        uint8_t x = v != 0;
        vec = ck_fbb_vec_bool(b, &x, 1);
    }
    ck_fbb_set_off(b, &t, slot, vec);
    return t.pos;
}

static int write_node(struct gctx *g, size_t idx, uint32_t *out)
{
    const struct ck_model_node *n = &g->nm->nodes[idx];
    const struct ck_dl4j_op *row = g->rows[idx];
    struct ck_fbb *b = g->b;
    int err;
    int64_t ia[CK_DL4J_MAX_ARGS * (CK_MODEL_MAX_INTS + 1)];
    double ta[CK_DL4J_MAX_ARGS];
    uint8_t ba[CK_DL4J_MAX_ARGS];
    uint32_t ni = 0, nt = 0, nb = 0, nargs = 0;
    /* p.ints given as a DL4J input (pad's paddings, writers/sdlower.c) are
     * not written as arguments too */
    bool ints_in = row->ints_input >= 0 && (size_t)row->ints_input < n->ninputs;
    const struct ck_dl4j_arg *props[CK_DL4J_MAX_ARGS];
    for (const struct ck_dl4j_arg *a = row->args; a->name; a++) {
        if (ck_dl4j_arg_is_list(a) && ints_in)
            continue;
        props[nargs++] = a;
    }
    for (const struct ck_dl4j_arg *a = row->args; a->name; a++) {
        double v = ck_dl4j_arg_get(a, &n->p);
        if (ck_dl4j_arg_is_list(a))
            continue; /* after every single value, below */
        if (a->kind == 'i')
            ia[ni++] = (int64_t)v;
        else if (a->kind == 't')
            ta[nt++] = v;
        else
            ba[nb++] = v != 0;
    }
    for (const struct ck_dl4j_arg *a = row->args; a->name; a++) {
        size_t nl;
        if (!ck_dl4j_arg_is_list(a) || ints_in)
            continue;
        if ((err = ck_dl4j_arg_list(a, &n->p, ia + ni, CK_MODEL_MAX_INTS, &nl)) < 0)
            return ck_error_wrap(err, "'%s': node '%s'", g->label, n->name);
        ni += (uint32_t)nl;
    }
    /* DL4J input k is canonical input dl4j_in[k]; as many as the node has */
    int *dl4j_in = calloc(n->ninputs + 1, sizeof *dl4j_in);
    int32_t *outs = calloc(n->noutputs + 1, sizeof *outs);
    size_t nin = 0;
    if (!dl4j_in || !outs) {
        free(dl4j_in), free(outs);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    for (size_t k = 0; k < n->ninputs; k++) {
        int c = ck_dl4j_input(row, (int)k, (int)n->ninputs);
        if (c < 0 && row->inputs[0] < 0)
            c = (int)k; /* same order: every input, also past CK_DL4J_MAX_INPUTS (concat) */
        if (c < 0)
            break;
        dl4j_in[nin++] = c;
    }
    uint8_t sz[FN_NSLOTS] = {0};
    sz[FN_ID] = 4;
    sz[FN_NAME] = 4;
    sz[FN_OPTYPE] = 1;
    sz[FN_OPNUM] = 8;
    sz[FN_PROPS] = 4;
    sz[FN_INPUTPAIRED] = 4;
    sz[FN_OUTPUT] = 4;
    sz[FN_EXTRAPARAMS] = 4;
    sz[FN_EXTRAINT] = 4;
    sz[FN_EXTRABOOLS] = 4;
    sz[FN_OUTPUTNAMES] = 4;
    sz[FN_OPNAME] = 4;
    struct ck_fbb_table t;
    ck_fbb_table(b, &t, sz, FN_NSLOTS);
    ck_fbb_set_i32(b, &t, FN_ID, (int32_t)idx + 1);
    ck_fbb_set_u8(b, &t, FN_OPTYPE, OPTYPE_CUSTOM);
    ck_fbb_set_i64(b, &t, FN_OPNUM, 0);
    ck_fbb_set_off(b, &t, FN_NAME, ck_fbb_cstring(b, n->name));
    ck_fbb_set_off(b, &t, FN_OPNAME, ck_fbb_cstring(b, row->name));
    uint32_t pv = ck_fbb_vec_offsets(b, nargs);
    ck_fbb_set_off(b, &t, FN_PROPS, pv);
    for (uint32_t i = 0; i < nargs; i++)
        ck_fbb_vec_set_off(b, pv, i, property(b, props[i], &n->p));
    uint32_t iv = ck_fbb_vec_offsets(b, (uint32_t)nin);
    ck_fbb_set_off(b, &t, FN_INPUTPAIRED, iv);
    for (size_t i = 0; i < nin; i++) {
        const struct var *v = lookup(g, n->inputs[dl4j_in[i]]);
        if (!v) {
            err = ck_error(CK_EFORMAT, "'%s': node '%s': input '%s' is not defined", g->label,
                           n->name, n->inputs[dl4j_in[i]]);
            free(dl4j_in), free(outs);
            return err;
        }
        ck_fbb_vec_set_off(b, iv, (uint32_t)i, int_pair(b, v->a, v->b));
    }
    free(dl4j_in);
    for (size_t i = 0; i < n->noutputs; i++)
        outs[i] = (int32_t)i;
    ck_fbb_set_off(b, &t, FN_OUTPUT, ck_fbb_vec_i32(b, outs, (uint32_t)n->noutputs));
    free(outs);
    ck_fbb_set_off(b, &t, FN_EXTRAPARAMS, ck_fbb_vec_f64(b, ta, nt));
    ck_fbb_set_off(b, &t, FN_EXTRAINT, ck_fbb_vec_i64(b, ia, ni));
    ck_fbb_set_off(b, &t, FN_EXTRABOOLS, ck_fbb_vec_bool(b, ba, nb));
    ck_fbb_set_off(b, &t, FN_OUTPUTNAMES, ck_fbb_vec_strings(b, n->outputs, (uint32_t)n->noutputs));
    *out = t.pos;
    return b->err;
}

/* The source's loss variables (the raw graph's attribute "loss_variables",
 * "a,b": a SameDiff file's lossVariables, an NNabla optimizer's loss
 * variables) that are variables of this graph: DL4J refuses a loss
 * variable it does not have. */
static int loss_variables(struct gctx *g, char **text, char ***out, size_t *n)
{
    const struct ck_graph *raw = g->m->weights ? g->m->weights->graph : NULL;
    const char *lv = NULL;
    *text = NULL;
    *out = NULL;
    *n = 0;
    for (size_t i = 0; raw && i < raw->nattrs; i++)
        if (!strcmp(raw->attrs[i].key, "loss_variables"))
            lv = raw->attrs[i].value;
    if (!lv || !*lv)
        return 0;
    char *copy = strdup(lv), **v = calloc(strlen(lv) / 2 + 2, sizeof *v);
    if (!copy || !v) {
        free(copy), free(v);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    char *save = NULL;
    for (char *p = strtok_r(copy, ",", &save); p; p = strtok_r(NULL, ",", &save))
        if (lookup(g, p))
            v[(*n)++] = p;
    if (!*n) {
        free(copy), free(v);
        return 0;
    }
    *text = copy; /* the names point into it */
    *out = v;
    return 0;
}

int ck_sdgraph_build(struct ck_fbb *b, const struct ck_model *m, const struct ck_sdgraph_weight *w,
                     size_t nw, const char *label)
{
    struct ck_sdlower low = {0};
    size_t nscales = 0, nvars, nloss = 0;
    char **loss = NULL, *losstext = NULL;
    int err;
    /* nodes DL4J has no single op for become several it has */
    if ((err = ck_sdlower_build(m, label, &low)) < 0)
        return err;
    struct gctx g = {b, m, low.m, low.rows, label, NULL, 0, 0};
    if ((err = collect(&g, w, nw)) < 0 || (err = loss_variables(&g, &losstext, &loss, &nloss)) < 0)
        goto out;
    value_dtypes(&g, w, nw);
    for (size_t i = 0; i < nw; i++)
        nscales += w[i].stored == CK_DT_QI8;
    nvars = g.nvars + nscales;
    const uint8_t sz[GRAPH_SLOTS] = {8, 4, 4, 4, 0, 4, nloss ? 4 : 0, 0};
    struct ck_fbb_table t;
    ck_fbb_table(b, &t, sz, GRAPH_SLOTS);
    ck_fbb_set_i64(b, &t, FG_ID, 0);
    uint32_t vv = ck_fbb_vec_offsets(b, (uint32_t)nvars);
    ck_fbb_set_off(b, &t, FG_VARIABLES, vv);
    if ((err = write_variables(&g, w, nw, vv, nscales)) < 0)
        goto out;
    uint32_t nv = ck_fbb_vec_offsets(b, (uint32_t)low.m->nnodes);
    ck_fbb_set_off(b, &t, FG_NODES, nv);
    for (size_t i = 0; i < low.m->nnodes; i++) {
        uint32_t at = 0;
        if ((err = write_node(&g, i, &at)) < 0)
            goto out;
        ck_fbb_vec_set_off(b, nv, (uint32_t)i, at);
    }
    uint32_t ov = ck_fbb_vec_offsets(b, (uint32_t)m->noutputs);
    ck_fbb_set_off(b, &t, FG_OUTPUTS, ov);
    for (size_t i = 0; i < m->noutputs; i++) {
        const struct var *v = lookup(&g, m->outputs[i].name);
        if (!v) {
            err =
                ck_error(CK_EFORMAT, "'%s': output '%s' is not defined", label, m->outputs[i].name);
            goto out;
        }
        ck_fbb_vec_set_off(b, ov, (uint32_t)i, int_pair(b, v->a, v->b));
    }
    uint32_t pv = ck_fbb_vec_offsets(b, (uint32_t)m->ninputs);
    ck_fbb_set_off(b, &t, FG_PLACEHOLDERS, pv);
    for (size_t i = 0; i < m->ninputs; i++)
        ck_fbb_vec_set_off(b, pv, (uint32_t)i, ck_fbb_cstring(b, m->inputs[i].name));
    if (nloss)
        ck_fbb_set_off(b, &t, FG_LOSS, ck_fbb_vec_strings(b, loss, (uint32_t)nloss));
    err = ck_fbb_finish(b, t.pos);
out:
    free(losstext);
    free(loss);
    free(g.vars);
    ck_sdlower_release(&low);
    return err;
}

int ck_sdgraph_training_config(struct ck_fbb *b, const char *json)
{
    static const uint8_t sz[GRAPH_SLOTS] = {8, 0, 0, 0, 0, 0, 0, 4};
    struct ck_fbb_table t;
    ck_fbb_table(b, &t, sz, GRAPH_SLOTS);
    ck_fbb_set_i64(b, &t, FG_ID, 0);
    ck_fbb_set_off(b, &t, FG_TRAINING, ck_fbb_cstring(b, json));
    return ck_fbb_finish(b, t.pos);
}
