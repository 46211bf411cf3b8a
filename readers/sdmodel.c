#include "readers/sdmodel.h"

#include "common/error.h"
#include "model/dl4jops.h"
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
        /* the table's defaults are small and finite */
        v[0] = (struct argval){(int64_t)a->def, a->def, true};
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

/* Sets the node's parameters from named arguments, else positional ones. */
static int set_args(const struct ck_dl4j_op *row, const struct ck_graph_node *gn,
                    struct ck_model_node *mn, const char *file)
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
            } else if (n >= 1 && a->field != CK_DF_CONST) {
                ck_dl4j_arg_set(a, &mn->p, v[0].i, v[0].d);
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

/* The node's DL4J inputs into canonical slots (constants that carry
 * parameters taken into mn's parameters instead). */
static int map_inputs(const struct ck_dl4j_op *row, const struct ck_tensor_set *s,
                      const struct ck_nameidx *ix, const struct ck_graph_node *gn,
                      struct ck_model_node *mn, const char **slots, size_t cap, size_t *nslots,
                      const char *file)
{
    int err;
    for (size_t k = 0; k < gn->ninputs; k++) {
        int64_t vals[CK_MODEL_MAX_INTS];
        size_t nv;
        if ((int)k == row->ints_input &&
            const_values(s, ix, gn->inputs[k], vals, CK_MODEL_MAX_INTS, &nv) == 0) {
            if ((err = ck_model_node_set_ints(mn, vals, nv)) < 0)
                return err;
            continue;
        }
        if ((int)k == row->scalar_input && const_values(s, ix, gn->inputs[k], vals, 1, &nv) == 0) {
            const struct ck_tensor *t = &s->tensors[ck_nameidx_find(ix, gn->inputs[k])->index];
            mn->p.scalar = (float)ck_tensor_get_f64(t, 0);
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

static int map_node(struct ck_model *m, const struct ck_tensor_set *s, const struct ck_nameidx *ix,
                    const struct ck_graph_node *gn, const char *file)
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
    if ((err = set_args(row, gn, mn, file)) < 0)
        return err;
    /* DL4J input k goes to canonical slot row->inputs[k] (same order when unset);
     * a reordering row has fewer than CK_DL4J_MAX_INPUTS slots */
    size_t cap = gn->ninputs > CK_DL4J_MAX_INPUTS ? gn->ninputs : CK_DL4J_MAX_INPUTS;
    const char **slots = calloc(cap + 1, sizeof *slots);
    size_t nslots = 0;
    if (!slots)
        return ck_error(CK_ENOMEM, "out of memory");
    err = map_inputs(row, s, ix, gn, mn, slots, cap, &nslots, file);
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
    bool *drop = calloc(s->ntensors + 1, 1);
    int err;
    if (!drop)
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = ck_nameidx_tensors(&ix, s)) < 0) {
        free(drop);
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
    for (size_t i = 0; i < g->nnodes && err >= 0; i++)
        err = map_node(m, s, &ix, &g->nodes[i], file);
    if (err >= 0)
        err = dequantize(s, &ix, drop);
    ck_nameidx_release(&ix);
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
