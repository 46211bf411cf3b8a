/* An ONNX graph (as onnx.c read it into a ck_graph with text attributes)
 * into the canonical model. One table maps ONNX op names; each row's
 * function reads the node's attributes (ONNX defaults, opset 13) into
 * ck_op_params. The shape arithmetic exporters emit around Reshape and
 * Slice (Shape -> Gather -> Add/Div/Mul -> Unsqueeze -> Concat) is folded
 * into constants here, from shapes propagated through the graph: graph
 * inputs declare theirs, weights have theirs, and every mapped op's output
 * shape follows from its inputs. A Shape of a value whose shape is not
 * static (a dynamic batch or sequence length) becomes a shape node, and the
 * arithmetic on it nodes the engine evaluates on integers when it plans a
 * run (docs/model.md "Shape values"); what is known here (the static dims)
 * still folds. Folded constants that a mapped node takes as data become
 * float32 weights. */
#include "readers/onnx.h"
#include "readers/reader.h"

#include "common/error.h"
#include "model/dims.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define RANK_MAX 8    /* shapes tracked up to this rank (others unknown) */
#define FOLD_MAX 4096 /* constants folded and read up to this many elements */

struct val {
    const char *name; /* borrowed from the graph or the set */
    int rank;         /* -1: unknown */
    int64_t dims[RANK_MAX];
    bool is_const, is_int, is_weight, folded_weight;
    bool is_mask; /* a bool value: 0 or 1 (a comparison's output, a bool input) */
    bool is_f64;  /* a float64 value (held as float32 by the engine) */
    bool is_half; /* a float16 or bfloat16 value */
    /* a shape value (docs/model.md): integers computed from shapes that are
     * known only when a run's input shapes are (a dynamic batch); c holds
     * the elements known here (NaN for the others) when it is not NULL */
    bool is_shape;
    bool int_input; /* a graph input of an integer type: its values are bound by a run */
    bool is_input;  /* a graph input */
    double *c; /* owned: the constant's values (is_const) */
    size_t cn;
};

struct cx {
    struct ck_model *m;
    const struct ck_graph *g;
    const char *path;
    struct val *v; /* open addressing by name */
    size_t cap, n;
    int64_t opset;
    unsigned tmp; /* counter for values this mapping adds */
};

/* ---- the value table ---- */

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}

static struct val *find(struct cx *c, const char *name)
{
    if (!c->cap)
        return NULL;
    for (size_t h = (size_t)hash(name) & (c->cap - 1); c->v[h].name; h = (h + 1) & (c->cap - 1))
        if (!strcmp(c->v[h].name, name))
            return &c->v[h];
    return NULL;
}

static int grow(struct cx *c)
{
    size_t cap = c->cap ? c->cap * 2 : 256;
    struct val *v = calloc(cap, sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < c->cap; i++) {
        if (!c->v[i].name)
            continue;
        size_t h = (size_t)hash(c->v[i].name) & (cap - 1);
        while (v[h].name)
            h = (h + 1) & (cap - 1);
        v[h] = c->v[i];
    }
    free(c->v);
    c->v = v;
    c->cap = cap;
    return 0;
}

/* The value named name, created (shape unknown) when new. */
static int get(struct cx *c, const char *name, struct val **out)
{
    int err = 0;
    if ((*out = find(c, name)))
        return 0;
    if (2 * (c->n + 1) > c->cap && (err = grow(c)) < 0)
        return err;
    size_t h = (size_t)hash(name) & (c->cap - 1);
    while (c->v[h].name)
        h = (h + 1) & (c->cap - 1);
    c->v[h].name = name;
    c->v[h].rank = -1;
    c->n++;
    *out = &c->v[h];
    return 0;
}

static void set_shape(struct val *v, int rank, const int64_t *dims)
{
    v->rank = rank > RANK_MAX ? -1 : rank;
    for (int i = 0; i < rank && i < RANK_MAX; i++)
        v->dims[i] = dims[i];
}

static bool is_int_dtype(enum ck_dtype t)
{
    return t == CK_DT_I8 || t == CK_DT_I16 || t == CK_DT_I32 || t == CK_DT_I64 || t == CK_DT_U8 ||
           t == CK_DT_U16 || t == CK_DT_U32 || t == CK_DT_U64 || t == CK_DT_BOOL;
}

static int add_weights(struct cx *c)
{
    const struct ck_tensor_set *s = c->m->weights;
    struct val *v = NULL;
    int err = 0;
    for (size_t i = 0; i < s->ntensors; i++) {
        const struct ck_tensor *t = &s->tensors[i];
        uint64_t n = 0;
        if ((err = get(c, t->name, &v)) < 0)
            return err;
        v->is_weight = true;
        set_shape(v, t->rank, t->dims);
        v->is_int = is_int_dtype(t->dtype);
        v->is_f64 = t->dtype == CK_DT_F64;
        v->is_half = t->dtype == CK_DT_F16 || t->dtype == CK_DT_BF16;
        if (t->dtype == CK_DT_STRING || !t->data || ck_tensor_numel(t, &n) < 0 || n > FOLD_MAX)
            continue;
        if (!(v->c = malloc((n ? n : 1) * sizeof *v->c)))
            return ck_error(CK_ENOMEM, "out of memory");
        for (uint64_t k = 0; k < n; k++)
            v->c[k] = ck_tensor_get_f64(t, k);
        v->cn = (size_t)n;
        v->is_const = true;
    }
    return 0;
}

/* ---- attributes (text, as onnx.c wrote them) ---- */

static const char *attr(const struct ck_graph_node *n, const char *key)
{
    for (size_t i = 0; i < n->nattrs; i++)
        if (!strcmp(n->attrs[i].key, key))
            return n->attrs[i].value;
    return NULL;
}

static int bad_attr(struct cx *c, const struct ck_graph_node *n, const char *key)
{
    return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): attribute '%s' has an unexpected value",
                    c->path, n->name, n->op, key);
}

static int attr_int(struct cx *c, const struct ck_graph_node *n, const char *key, int64_t def,
                    int64_t *out)
{
    const char *a = attr(n, key);
    char *end = NULL;
    *out = def;
    if (!a)
        return 0;
    *out = strtoll(a, &end, 10);
    return *a && !*end ? 0 : bad_attr(c, n, key);
}

static int attr_float(struct cx *c, const struct ck_graph_node *n, const char *key, float def,
                      float *out)
{
    const char *a = attr(n, key);
    char *end = NULL;
    *out = def;
    if (!a)
        return 0;
    *out = strtof(a, &end);
    return *a && !*end ? 0 : bad_attr(c, n, key);
}

/* "[1, 2, 3]" -> v[0..*count); *count = SIZE_MAX when the attribute is absent. */
static int attr_ints(struct cx *c, const struct ck_graph_node *n, const char *key, int64_t *v,
                     size_t max, size_t *count)
{
    const char *a = attr(n, key);
    char *end = NULL;
    *count = SIZE_MAX;
    if (!a)
        return 0;
    if (*a++ != '[')
        return bad_attr(c, n, key);
    *count = 0;
    while (*a == ' ')
        a++;
    while (*a && *a != ']') {
        if (*count == max)
            return bad_attr(c, n, key);
        v[(*count)++] = strtoll(a, &end, 10);
        if (end == a)
            return bad_attr(c, n, key);
        a = end;
        while (*a == ',' || *a == ' ')
            a++;
    }
    return *a == ']' ? 0 : bad_attr(c, n, key);
}

/* ---- inputs ---- */

/* A shape value whose elements are not all known here. */
static bool computed(const struct val *v)
{
    return v && v->is_shape && !v->is_const;
}

/* A parameter the engine takes when it plans a run: a shape value or an
 * integer graph input (a Reshape's shape, a Trilu's k given as an input). */
static bool computed_param(const struct val *v)
{
    return computed(v) || (v && v->int_input);
}

static bool has_input(const struct ck_graph_node *n, size_t i)
{
    return i < n->ninputs && n->inputs[i][0];
}

static int input(struct cx *c, const struct ck_graph_node *n, size_t i, struct val **out)
{
    if (!has_input(n, i))
        return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): input %zu is missing", c->path, n->name,
                        n->op, i);
    if (!(*out = find(c, n->inputs[i])))
        return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): input '%s' is defined nowhere before",
                        c->path, n->name, n->op, n->inputs[i]);
    return 0;
}

/* Input i as a list of integers (a constant: Reshape's shape, Slice's starts...). */
static int const_ints(struct cx *c, const struct ck_graph_node *n, size_t i, int64_t *v, size_t max,
                      size_t *count)
{
    struct val *x = NULL;
    int err = 0;
    if ((err = input(c, n, i, &x)) < 0)
        return err;
    if (computed(x))
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (%s): input '%s' must be a constant: it is computed from "
                        "shapes, known only at run time",
                        c->path, n->name, n->op, x->name);
    if (!x->is_const || x->cn > max)
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (%s): input '%s' is not a constant that can be folded%s",
                        c->path, n->name, n->op, x->name,
                        x->is_const ? "" : " (it depends on tensor values, not only on shapes)");
    for (size_t k = 0; k < x->cn; k++)
        if (!ck_dim_from_double(x->c[k], &v[k]))
            return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): input '%s' holds a value that is not an integer",
                            c->path, n->name, n->op, x->name);
    *count = x->cn;
    return 0;
}

static int const_scalar(struct cx *c, const struct ck_graph_node *n, size_t i, float *out)
{
    struct val *x = NULL;
    int err = 0;
    if ((err = input(c, n, i, &x)) < 0)
        return err;
    if (!x->is_const || x->cn != 1)
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (%s): input '%s' is not a constant scalar",
                        c->path, n->name, n->op, x->name);
    *out = (float)x->c[0];
    return 0;
}

/* A folded constant a mapped node takes as data: a float32 weight. */
static int materialise(struct cx *c, struct val *v)
{
    struct ck_tensor t;
    float *data = NULL;
    int err = 0;
    if (v->is_weight || v->folded_weight)
        return 0;
    for (size_t k = 0; v->is_int && k < v->cn; k++)
        if (fabs(v->c[k]) > 16777216.0) /* 2^24: float32 holds every integer up to it */
            return ck_error(CK_EUNSUPPORTED,
                            "'%s': value '%s' holds the integer %.0f, which float32 cannot hold "
                            "exactly (ckptd computes in float32: integers up to 2^24 only)",
                            c->path, v->name, v->c[k]);
    /* an integer stays one (int64): the engine's integer kernels know it by its dtype */
    bool i64 = v->is_int && !v->is_mask;
    size_t es = i64 ? 8 : 4;
    if ((err = ck_tensor_set_alloc(c->m->weights, (v->cn ? v->cn : 1) * es, (void **)&data)) < 0)
        return err;
    for (size_t k = 0; k < v->cn; k++) {
        if (i64) {
            int64_t q = (int64_t)v->c[k];
            memcpy((unsigned char *)data + 8 * k, &q, 8);
        } else {
            data[k] = (float)v->c[k];
        }
    }
    memset(&t, 0, sizeof t);
    t.name = (char *)v->name;
    t.dtype = i64 ? CK_DT_I64 : CK_DT_F32;
    t.rank = v->rank < 0 ? 1 : v->rank;
    for (int d = 0; d < t.rank; d++)
        t.dims[d] = v->rank < 0 ? (int64_t)v->cn : v->dims[d];
    t.nbytes = v->cn * es;
    t.data = (const unsigned char *)data;
    t.role = "constant";
    v->folded_weight = true;
    return ck_tensor_set_add(c->m->weights, &t, NULL);
}

static int64_t norm_axis(int64_t a, int rank)
{
    return a < 0 && rank >= 0 ? a + rank : a;
}

/* ---- shapes ---- */

static int broadcast(const struct val *a, const struct val *b, struct val *o)
{
    if (a->rank < 0 || b->rank < 0)
        return 0;
    int r = a->rank > b->rank ? a->rank : b->rank;
    int64_t d[RANK_MAX];
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a->rank), ib = i - (r - b->rank);
        int64_t x = ia >= 0 ? a->dims[ia] : 1, y = ib >= 0 ? b->dims[ib] : 1;
        if (x < 0 || y < 0) { /* unknown until run time: the other one unless it is 1 */
            d[i] = x < 0 ? (y == 1 ? -1 : y) : (x == 1 ? -1 : x);
            continue;
        }
        if (x != y && x != 1 && y != 1)
            return -1;
        d[i] = x == 1 ? y : x;
    }
    set_shape(o, r, d);
    return 0;
}

/* An output extent of a convolution or pool; -1 when it is not positive
 * or the arithmetic on the file's values overflows. */
static int64_t conv_dim(int64_t in, int64_t k, int64_t s, int64_t d, int64_t pb, int64_t pe,
                        bool ceil)
{
    int64_t span = 0, reach = 0;
    if (s <= 0 || k < 1 || d < 1 || !ck_dim_mul(d, k - 1, &reach) || !ck_dim_add(in, pb, &span) ||
        !ck_dim_add(span, pe, &span) || !ck_dim_add(span, -reach - 1, &span) || span < 0 ||
        (ceil && !ck_dim_add(span, s - 1, &span)))
        return -1;
    return span / s + 1;
}

/* A shape value's elements as dims: what is known here, -1 (unknown) for
 * the rest; false when its length is not known or over RANK_MAX. */
static bool partial_dims(const struct val *v, int64_t *d, bool *known, size_t *count)
{
    if (!v->c || v->cn > RANK_MAX)
        return false;
    for (size_t i = 0; i < v->cn; i++) {
        known[i] = ck_dim_from_double(v->c[i], &d[i]);
        if (!known[i])
            d[i] = -1;
    }
    *count = v->cn;
    return true;
}

/* Output shapes of the ops whose shape, repeats or bounds are shape values
 * (known at run time): what can be known here. 1 when n is one of them. */
static int infer_computed(struct cx *c, const struct ck_graph_node *n, const struct val *x,
                          struct val **out)
{
    const char *op = n->op;
    struct val *w = NULL;
    int64_t d[RANK_MAX], k[RANK_MAX];
    bool kn[RANK_MAX];
    size_t nk = 0;
    int r = x->rank;
    if (!strcmp(op, "ConstantOfShape") && computed_param(x)) {
        if (partial_dims(x, k, kn, &nk))
            set_shape(out[0], (int)nk, k);
        return 1;
    }
    if (!strcmp(op, "Range")) {
        for (size_t i = 0; i < 3 && i < n->ninputs; i++)
            if (computed(find(c, n->inputs[i]))) {
                int64_t len = -1;
                set_shape(out[0], 1, &len);
                return 1;
            }
        return 0;
    }
    if (!strcmp(op, "Slice")) {
        bool any = false;
        for (size_t i = 1; i < n->ninputs; i++)
            any = any || computed_param(has_input(n, i) ? find(c, n->inputs[i]) : NULL);
        if (!any)
            return 0;
        memcpy(d, x->dims, sizeof d);
        struct val *ax = has_input(n, 3) ? find(c, n->inputs[3]) : NULL;
        struct val *st = find(c, n->inputs[1]);
        for (int i = 0; i < r; i++) { /* the axes sliced, when they are constants */
            bool sliced = !ax && st && st->is_shape && st->c ? (size_t)i < st->cn : !ax;
            for (size_t j = 0; ax && ax->is_const && j < ax->cn; j++)
                sliced = sliced || norm_axis((int64_t)ax->c[j], r) == i;
            if (sliced || (ax && !ax->is_const))
                d[i] = -1;
        }
        set_shape(out[0], r, d);
        return 1;
    }
    bool reshape = !strcmp(op, "Reshape"), tile = !strcmp(op, "Tile");
    if (!reshape && !tile && strcmp(op, "Expand"))
        return 0;
    if (!has_input(n, 1) || !computed_param(w = find(c, n->inputs[1])))
        return 0;
    if (!partial_dims(w, k, kn, &nk)) {
        if (w->rank == 1 && w->dims[0] >= 0 && w->dims[0] <= RANK_MAX && reshape) {
            nk = (size_t)w->dims[0];
            for (size_t i = 0; i < nk; i++)
                d[i] = -1;
            set_shape(out[0], (int)nk, d);
        }
        return 1;
    }
    if (tile) {
        if (nk != (size_t)r)
            return 1;
        for (int i = 0; i < r; i++)
            if (!kn[i] || x->dims[i] < 0 || !ck_dim_mul(x->dims[i], k[i], &d[i]))
                d[i] = -1;
        set_shape(out[0], r, d);
        return 1;
    }
    if (!reshape) { /* Expand: numpy broadcasting with what is known */
        struct val t;
        t.rank = (int)nk;
        memcpy(t.dims, k, sizeof k);
        if (broadcast(x, &t, out[0]) < 0)
            return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): shapes do not broadcast", c->path,
                            n->name, op);
        return 1;
    }
    int64_t total = 0, known = 1;
    int infer_at = -1;
    bool total_known = ck_dims_prod(x->dims, 0, r, &total), all = true;
    for (size_t i = 0; i < nk; i++) {
        d[i] = kn[i] && k[i] == 0 && (int)i < r ? x->dims[i] : k[i];
        if (kn[i] && k[i] == -1 && infer_at < 0)
            infer_at = (int)i;
        else if (d[i] < 0)
            all = false, d[i] = -1;
        else if (!ck_dim_mul(known, d[i], &known))
            return 1;
    }
    if (infer_at >= 0)
        d[infer_at] = all && total_known && known ? total / known : -1;
    set_shape(out[0], (int)nk, d);
    return 1;
}

/* Output shapes of mapped ops from their inputs' shapes; unknown stays -1. */
static int infer(struct cx *c, const struct ck_graph_node *n, struct val **out)
{
    struct val *x = NULL, *w = NULL;
    int64_t d[RANK_MAX], k[RANK_MAX];
    size_t nk = 0;
    int err = 0;
    const char *op = n->op;
    if (!n->noutputs) /* nothing to give a shape (ONNX lets some ops have none) */
        return 0;
    if (n->ninputs && has_input(n, 0) && (err = input(c, n, 0, &x)) < 0)
        return err;
    if (!x || x->rank < 0)
        return 0;
    memcpy(d, x->dims, sizeof d);
    int r = x->rank;
    if ((err = infer_computed(c, n, x, out)) != 0)
        return err < 0 ? err : 0;
    if (!strcmp(op, "Max") || !strcmp(op, "Min") || !strcmp(op, "Sum") || !strcmp(op, "Mean")) {
        struct val acc = *x;
        for (size_t i = 1; i < n->ninputs; i++) {
            if ((err = input(c, n, i, &w)) < 0)
                return err;
            if (broadcast(&acc, w, &acc) < 0)
                return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): shapes do not broadcast",
                                c->path, n->name, op);
        }
        set_shape(out[0], acc.rank, acc.dims);
        return 0;
    }
    if (!strcmp(op, "Add") || !strcmp(op, "Sub") || !strcmp(op, "Mul") || !strcmp(op, "Div") ||
        !strcmp(op, "Pow") || !strcmp(op, "Equal") || !strcmp(op, "PRelu") || !strcmp(op, "Mod") ||
        !strcmp(op, "Less") || !strcmp(op, "Greater") || !strcmp(op, "LessOrEqual") ||
        !strcmp(op, "GreaterOrEqual") || !strcmp(op, "And") || !strcmp(op, "Or") ||
        !strcmp(op, "Xor")) {
        if ((err = input(c, n, 1, &w)) < 0)
            return err;
        if (broadcast(x, w, out[0]) < 0)
            return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): shapes do not broadcast", c->path,
                            n->name, op);
        return 0;
    }
    if (!strcmp(op, "Where")) {
        struct val *v2 = NULL, t;
        if ((err = input(c, n, 1, &w)) < 0 || (err = input(c, n, 2, &v2)) < 0)
            return err;
        t.rank = -1;
        if (broadcast(w, v2, &t) < 0 || broadcast(x, &t, out[0]) < 0)
            return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): shapes do not broadcast", c->path,
                            n->name, op);
        return 0;
    }
    if (!strcmp(op, "Expand") || !strcmp(op, "Tile")) {
        struct val t;
        bool tile = op[0] == 'T';
        if ((err = input(c, n, 1, &w)) < 0 || !w->is_const || w->cn > RANK_MAX ||
            (tile && w->cn != (size_t)r))
            return err;
        t.rank = (int)w->cn;
        for (size_t i = 0; i < w->cn; i++)
            if (!ck_dim_from_double(w->c[i], &t.dims[i]) || t.dims[i] < 0 ||
                (tile && !ck_dim_mul(t.dims[i], d[i], &t.dims[i])))
                return 0; /* the mapping refuses it */
        if (tile)
            set_shape(out[0], t.rank, t.dims);
        else if (broadcast(x, &t, out[0]) < 0)
            return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): shapes do not broadcast", c->path,
                            n->name, op);
        return 0;
    }
    if (!strcmp(op, "ArgMax") || !strcmp(op, "ArgMin")) {
        int64_t axis = 0, keep = 1;
        if ((err = attr_int(c, n, "axis", 0, &axis)) < 0 ||
            (err = attr_int(c, n, "keepdims", 1, &keep)) < 0)
            return err;
        axis = norm_axis(axis, r);
        if (axis < 0 || axis >= r)
            return 0;
        d[axis] = 1;
        for (int i = (int)axis; !keep && i + 1 < r; i++)
            d[i] = d[i + 1];
        set_shape(out[0], keep ? r : r - 1, d);
        return 0;
    }
    if (!strcmp(op, "Resize")) {
        struct val *sc = NULL, *sz = NULL;
        if ((has_input(n, 2) && (err = input(c, n, 2, &sc)) < 0) ||
            (has_input(n, 3) && (err = input(c, n, 3, &sz)) < 0))
            return err;
        if (sc && sc->is_const && sc->cn == (size_t)r) {
            for (int i = 0; i < r; i++) {
                double e = (double)d[i] * (double)(float)sc->c[i];
                if (!(e >= 0 && e < 0x1p40))
                    return 0;
                d[i] = (int64_t)e;
            }
        } else if (sz && sz->is_const && sz->cn == (size_t)r) {
            for (int i = 0; i < r; i++)
                if (!ck_dim_from_double(sz->c[i], &d[i]) || d[i] < 0)
                    return 0;
        } else {
            return 0;
        }
        set_shape(out[0], r, d);
        return 0;
    }
    if (!strcmp(op, "GatherElements")) {
        if ((err = input(c, n, 1, &w)) < 0)
            return err;
        set_shape(out[0], w->rank, w->dims);
        return 0;
    }
    if (!strcmp(op, "MatMul")) {
        if ((err = input(c, n, 1, &w)) < 0 || w->rank < 2 || r < 2)
            return err;
        struct val a = *x, b = *w;
        a.rank -= 2;
        b.rank -= 2;
        if (broadcast(&a, &b, out[0]) < 0 || out[0]->rank < 0 || out[0]->rank + 2 > RANK_MAX)
            return 0;
        out[0]->dims[out[0]->rank] = x->dims[r - 2];
        out[0]->dims[out[0]->rank + 1] = w->dims[w->rank - 1];
        out[0]->rank += 2;
        return 0;
    }
    if (!strcmp(op, "Gemm")) {
        int64_t ta = 0, tb = 0;
        if ((err = input(c, n, 1, &w)) < 0 || (err = attr_int(c, n, "transA", 0, &ta)) < 0 ||
            (err = attr_int(c, n, "transB", 0, &tb)) < 0 || w->rank != 2 || r != 2)
            return err;
        d[0] = x->dims[ta ? 1 : 0];
        d[1] = w->dims[tb ? 0 : 1];
        set_shape(out[0], 2, d);
        return 0;
    }
    if (!strcmp(op, "Conv") || !strcmp(op, "MaxPool") || !strcmp(op, "AveragePool")) {
        int64_t ks[2], st[2] = {1, 1}, dl[2] = {1, 1}, pd[4] = {0, 0, 0, 0}, ceil = 0;
        size_t a = 0;
        if (r != 4)
            return 0;
        if (op[0] == 'C') {
            if ((err = input(c, n, 1, &w)) < 0 || w->rank != 4)
                return err;
            ks[0] = w->dims[2], ks[1] = w->dims[3];
            d[1] = w->dims[0];
        } else if ((err = attr_ints(c, n, "kernel_shape", ks, 2, &a)) < 0 || a != 2) {
            return err;
        }
        if ((err = attr_ints(c, n, "strides", st, 2, &a)) < 0 ||
            (err = attr_ints(c, n, "dilations", dl, 2, &a)) < 0 ||
            (err = attr_ints(c, n, "pads", pd, 4, &a)) < 0 ||
            (err = attr_int(c, n, "ceil_mode", 0, &ceil)) < 0)
            return err;
        const char *ap = attr(n, "auto_pad");
        if (ap && !strncmp(ap, "SAME_", 5)) {
            for (int i = 0; i < 2; i++)
                d[2 + i] = st[i] >= 1 && st[i] <= (INT64_C(1) << 40) && x->dims[2 + i] >= 1 &&
                                   x->dims[2 + i] < (INT64_C(1) << 40)
                               ? (x->dims[2 + i] + st[i] - 1) / st[i]
                               : -1;
            if (d[2] > 0 && d[3] > 0)
                set_shape(out[0], 4, d);
            return 0;
        }
        d[2] = conv_dim(x->dims[2], ks[0], st[0], dl[0], pd[0], pd[2], ceil);
        d[3] = conv_dim(x->dims[3], ks[1], st[1], dl[1], pd[1], pd[3], ceil);
        if (d[2] > 0 && d[3] > 0)
            set_shape(out[0], 4, d);
        return 0;
    }
    if (!strcmp(op, "RNN") || !strcmp(op, "GRU") || !strcmp(op, "LSTM")) {
        int64_t h = 0, layout = 0, t, b, nd;
        const char *dir = attr(n, "direction");
        if ((err = attr_int(c, n, "hidden_size", 0, &h)) < 0 ||
            (err = attr_int(c, n, "layout", 0, &layout)) < 0 || r != 3 || h < 1)
            return err;
        nd = dir && !strcmp(dir, "bidirectional") ? 2 : 1;
        t = d[layout ? 1 : 0], b = d[layout ? 0 : 1];
        int64_t y0[4] = {t, nd, b, h}, y1[4] = {b, t, nd, h}, s0[3] = {nd, b, h}, s1[3] = {b, nd, h};
        set_shape(out[0], 4, layout ? y1 : y0);
        for (size_t i = 1; i < n->noutputs && i < 3; i++)
            set_shape(out[i], 3, layout ? s1 : s0);
        return 0;
    }
    if (!strcmp(op, "DepthToSpace") || !strcmp(op, "SpaceToDepth")) {
        int64_t b = 0;
        if ((err = attr_int(c, n, "blocksize", 0, &b)) < 0)
            return err;
        if (r != 4 || b < 1 || b > 4096 || d[1] < 1 || d[2] < 1 || d[3] < 1 ||
            d[1] > (INT64_C(1) << 32) || d[2] > (INT64_C(1) << 32) || d[3] > (INT64_C(1) << 32))
            return 0;
        bool up = op[0] == 'D';
        if (up ? d[1] % (b * b) : d[2] % b || d[3] % b)
            return 0;
        d[1] = up ? d[1] / (b * b) : d[1] * b * b;
        d[2] = up ? d[2] * b : d[2] / b;
        d[3] = up ? d[3] * b : d[3] / b;
        set_shape(out[0], 4, d);
        return 0;
    }
    if (!strcmp(op, "GlobalAveragePool") || !strcmp(op, "GlobalMaxPool")) {
        for (int i = 2; i < r; i++)
            d[i] = 1;
        set_shape(out[0], r, d);
        return 0;
    }
    if (!strcmp(op, "Flatten")) {
        int64_t axis, a = 1, b = 1;
        if ((err = attr_int(c, n, "axis", 1, &axis)) < 0)
            return err;
        axis = norm_axis(axis, r);
        if (axis < 0 || axis > r || !ck_dims_prod(x->dims, 0, (int)axis, &a) ||
            !ck_dims_prod(x->dims, (int)axis, r, &b))
            return 0;
        d[0] = a, d[1] = b;
        set_shape(out[0], 2, d);
        return 0;
    }
    if (!strcmp(op, "Transpose")) {
        if ((err = attr_ints(c, n, "perm", k, RANK_MAX, &nk)) < 0)
            return err;
        for (int i = 0; i < r; i++)
            d[i] = x->dims[nk == SIZE_MAX ? r - 1 - i : (k[i] >= 0 && k[i] < r ? k[i] : 0)];
        set_shape(out[0], r, d);
        return 0;
    }
    if (!strcmp(op, "Reshape")) {
        int64_t total = 1, known = 1;
        int infer_at = -1;
        if ((err = const_ints(c, n, 1, k, RANK_MAX, &nk)) < 0)
            return err;
        bool total_known = ck_dims_prod(x->dims, 0, r, &total);
        for (size_t i = 0; i < nk; i++) {
            d[i] = k[i] == 0 && (int)i < r ? x->dims[i] : k[i];
            if (d[i] == -1 && infer_at < 0)
                infer_at = (int)i;
            else if (d[i] < 0 || !ck_dim_mul(known, d[i], &known))
                return 0; /* not a shape this can follow: the engine's check refuses it */
        }
        if (infer_at >= 0)
            d[infer_at] = total_known && known ? total / known : -1;
        set_shape(out[0], (int)nk, d);
        return 0;
    }
    if (!strcmp(op, "Concat")) {
        int64_t axis = 0;
        if ((err = attr_int(c, n, "axis", 0, &axis)) < 0)
            return err;
        axis = norm_axis(axis, r);
        if (axis < 0 || axis >= r)
            return 0;
        d[axis] = 0;
        for (size_t i = 0; i < n->ninputs; i++) {
            if ((err = input(c, n, i, &w)) < 0)
                return err;
            if (w->rank != r)
                return 0;
            if (d[axis] >= 0 && (w->dims[axis] < 0 || !ck_dim_add(d[axis], w->dims[axis], &d[axis])))
                d[axis] = -1; /* known at run time */
        }
        set_shape(out[0], r, d);
        return 0;
    }
    if (!strcmp(op, "Unsqueeze") || !strcmp(op, "Squeeze")) {
        bool un = op[0] == 'U';
        if (has_input(n, 1)) {
            if ((err = const_ints(c, n, 1, k, RANK_MAX, &nk)) < 0)
                return err;
        } else if ((err = attr_ints(c, n, "axes", k, RANK_MAX, &nk)) < 0) {
            return err;
        }
        if (nk == SIZE_MAX)
            nk = 0;
        int orank = un ? r + (int)nk : r;
        bool mark[RANK_MAX + 8] = {false};
        for (size_t i = 0; i < nk; i++) {
            int64_t a = norm_axis(k[i], orank);
            if (a < 0 || a >= RANK_MAX)
                return 0;
            mark[a] = true;
        }
        int o = 0;
        if (un) {
            if (orank > RANK_MAX)
                return 0;
            for (int i = 0, j = 0; i < orank; i++)
                d[o++] = mark[i] ? 1 : x->dims[j++];
        } else {
            for (int i = 0; i < r; i++)
                if (!(nk ? mark[i] : x->dims[i] == 1))
                    d[o++] = x->dims[i];
        }
        set_shape(out[0], o, d);
        return 0;
    }
    if (!strcmp(op, "Gather")) {
        int64_t axis = 0;
        if ((err = input(c, n, 1, &w)) < 0 || (err = attr_int(c, n, "axis", 0, &axis)) < 0)
            return err;
        axis = norm_axis(axis, r);
        if (w->rank < 0 || axis < 0 || axis >= r || r - 1 + w->rank > RANK_MAX)
            return 0;
        int o = 0;
        for (int i = 0; i < r; i++)
            if (i == axis)
                for (int j = 0; j < w->rank; j++)
                    k[o++] = w->dims[j];
            else
                k[o++] = x->dims[i];
        set_shape(out[0], o, k);
        return 0;
    }
    if (!strncmp(op, "Reduce", 6)) {
        int64_t keep = 0;
        if ((err = attr_int(c, n, "keepdims", 1, &keep)) < 0)
            return err;
        if (has_input(n, 1)) {
            if ((err = const_ints(c, n, 1, k, RANK_MAX, &nk)) < 0)
                return err;
        } else if ((err = attr_ints(c, n, "axes", k, RANK_MAX, &nk)) < 0) {
            return err;
        }
        bool mark[RANK_MAX] = {false};
        for (size_t i = 0; nk != SIZE_MAX && i < nk; i++) {
            int64_t a = norm_axis(k[i], r);
            if (a < 0 || a >= r)
                return 0;
            mark[a] = true;
        }
        int o = 0;
        for (int i = 0; i < r; i++)
            if (nk == SIZE_MAX || nk == 0 || mark[i]) {
                if (keep)
                    d[o++] = 1;
            } else {
                d[o++] = x->dims[i];
            }
        set_shape(out[0], o, d);
        return 0;
    }
    if (!strcmp(op, "Slice")) {
        int64_t st[RANK_MAX], en[RANK_MAX], ax[RANK_MAX], sp[RANK_MAX];
        size_t ns, ne, na = SIZE_MAX, np = SIZE_MAX;
        if ((err = const_ints(c, n, 1, st, RANK_MAX, &ns)) < 0 ||
            (err = const_ints(c, n, 2, en, RANK_MAX, &ne)) < 0 ||
            (has_input(n, 3) && (err = const_ints(c, n, 3, ax, RANK_MAX, &na)) < 0) ||
            (has_input(n, 4) && (err = const_ints(c, n, 4, sp, RANK_MAX, &np)) < 0))
            return err;
        for (size_t i = 0; i < ns && i < ne; i++) {
            int64_t a = na == SIZE_MAX ? (int64_t)i : norm_axis(ax[i], r),
                    step = np == SIZE_MAX ? 1 : sp[i];
            if (a < 0 || a >= r || step != 1)
                return 0;
            int64_t dim = x->dims[a], b = st[i] < 0 ? st[i] + dim : st[i],
                    e = en[i] < 0 ? en[i] + dim : en[i];
            b = b < 0 ? 0 : b > dim ? dim : b;
            e = e < 0 ? 0 : e > dim ? dim : e;
            d[a] = e > b ? e - b : 0;
        }
        set_shape(out[0], r, d);
        return 0;
    }
    if (!strcmp(op, "Split")) {
        int64_t sz[CK_MODEL_MAX_INTS]; /* one size per output, as the model keeps them */
        int64_t axis = 0;
        if ((err = attr_int(c, n, "axis", 0, &axis)) < 0)
            return err;
        axis = norm_axis(axis, r);
        if (axis < 0 || axis >= r)
            return 0;
        if (has_input(n, 1)) {
            if ((err = const_ints(c, n, 1, sz, CK_MODEL_MAX_INTS, &nk)) < 0)
                return err;
        } else if ((err = attr_ints(c, n, "split", sz, CK_MODEL_MAX_INTS, &nk)) < 0) {
            return err;
        }
        for (size_t i = 0; i < n->noutputs; i++) {
            d[axis] = nk == SIZE_MAX ? x->dims[axis] / (int64_t)n->noutputs : i < nk ? sz[i] : 0;
            set_shape(out[i], r, d);
        }
        return 0;
    }
    /* element-wise and normalisations: the shape of the first input */
    static const char *const same[] = {"Relu",
                                       "LeakyRelu",
                                       "Sigmoid",
                                       "Tanh",
                                       "Erf",
                                       "Sqrt",
                                       "Exp",
                                       "Log",
                                       "Neg",
                                       "Identity",
                                       "Dropout",
                                       "Softmax",
                                       "LogSoftmax",
                                       "Clip",
                                       "BatchNormalization",
                                       "LayerNormalization",
                                       "Cast",
                                       "Pad",
                                       "Abs", "Ceil", "Floor", "Round", "Sign", "Reciprocal",
                                       "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh",
                                       "Cosh", "Asinh", "Acosh", "Atanh", "Softplus",
                                       "Softsign", "Mish", "HardSwish", "Elu", "Celu", "Selu",
                                       "HardSigmoid", "ThresholdedRelu", "Hardmax",
                                       "InstanceNormalization", "CastLike", "Shrink",
                                       "MeanVarianceNormalization", "LRN", "Not", "Trilu",
                                       "CumSum"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if (!strcmp(op, same[i]) && strcmp(op, "Pad"))
            set_shape(out[0], r, d);
    return 0;
}

/* ---- constant folding ---- */

static int set_const(struct val *o, size_t n, bool is_int)
{
    free(o->c);
    o->c = malloc((n ? n : 1) * sizeof *o->c);
    if (!o->c)
        return ck_error(CK_ENOMEM, "out of memory");
    o->cn = n;
    o->is_const = true;
    o->is_int = is_int;
    return 0;
}

static double binop(const char *op, double a, double b, bool is_int)
{
    if (isnan(a) || isnan(b)) /* an element of a shape value not known here */
        return NAN;
    if (!strcmp(op, "Less") || !strcmp(op, "LessOrEqual"))
        return op[4] ? a <= b : a < b;
    if (!strcmp(op, "Greater") || !strcmp(op, "GreaterOrEqual"))
        return op[7] ? a >= b : a > b;
    switch (op[0]) {
    case 'A':
        return a + b;
    case 'S':
        return a - b;
    case 'M':
        return a * b;
    case 'D':
        return is_int ? (b != 0 ? trunc(a / b) : 0) : a / b;
    case 'P':
        return pow(a, b);
    default: /* Equal */
        return a == b;
    }
}

/* Elements of v; -1 when unknown or too many to count. */
static int64_t numel(const struct val *v)
{
    int64_t n = 0;
    return ck_dims_prod(v->dims, 0, v->rank, &n) ? n : -1;
}

/* Expand of a constant to a constant shape (torch's zero initial states of
 * an RNN): numpy broadcasting of a to the shape. 0 when it is too big to
 * fold or does not broadcast (the node is then refused as unmapped). */
static int fold_expand(struct cx *c, const struct ck_graph_node *n, const struct val *a,
                       const struct val *b, struct val *o)
{
    int64_t d[RANK_MAX], want[RANK_MAX], total = 1;
    int r = a->rank > (int)b->cn ? a->rank : (int)b->cn, err = 0;
    (void)n;
    for (size_t i = 0; i < b->cn; i++)
        if (!ck_dim_from_double(b->c[i], &want[i]) || want[i] < 0)
            return 0;
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a->rank), ib = i - (r - (int)b->cn);
        int64_t x = ia >= 0 ? a->dims[ia] : 1, y = ib >= 0 ? want[ib] : 1;
        if (x != y && x != 1 && y != 1)
            return 0;
        d[i] = x == 1 ? y : x;
        if (d[i] < 0 || d[i] > FOLD_MAX || (total *= d[i]) > FOLD_MAX)
            return 0;
    }
    if ((size_t)numel(a) != a->cn || (err = set_const(o, (size_t)total, a->is_int)) < 0)
        return err;
    for (int64_t k = 0; k < total; k++) {
        int64_t rest = k, src = 0, mul = 1;
        for (int i = r - 1; i >= 0; i--) {
            int64_t idx = rest % d[i];
            rest /= d[i];
            int ia = i - (r - a->rank);
            if (ia >= 0) {
                src += (a->dims[ia] == 1 ? 0 : idx) * mul;
                mul *= a->dims[ia];
            }
        }
        o->c[k] = a->c[src];
    }
    set_shape(o, r, d);
    return 1;
}

/* Range(start, limit, delta) of constant scalars: start + i delta for i <
 * max(ceil((limit - start) / delta), 0), as ONNX. Integer ranges are exact
 * (a value past 2^24 is refused when a node takes it as data: materialise). */
static int fold_range(struct cx *c, const struct ck_graph_node *n, struct val **in, struct val *o)
{
    if (!in[0] || !in[1] || !in[2] || in[0]->cn != 1 || in[1]->cn != 1 || in[2]->cn != 1)
        return ck_error(CK_EFORMAT, "'%s': node '%s' (Range): start, limit and delta must be scalars",
                        c->path, n->name);
    double st = in[0]->c[0], lim = in[1]->c[0], dl = in[2]->c[0];
    bool is_int = in[0]->is_int && in[1]->is_int && in[2]->is_int;
    double count = dl != 0 ? ceil((lim - st) / dl) : NAN;
    if (!(count == count) || count > FOLD_MAX)
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (Range): %s elements: ckptd folds a Range of constants "
                        "of up to %d elements",
                        c->path, n->name, count == count ? "too many" : "a zero delta or no finite count of",
                        FOLD_MAX);
    int64_t len = count > 0 ? (int64_t)count : 0, err = 0;
    if ((err = set_const(o, (size_t)len, is_int)) < 0)
        return (int)err;
    for (int64_t i = 0; i < len; i++) /* float ranges as ONNX: in the inputs' type */
        o->c[i] = is_int ? st + (double)i * dl : (double)(float)(st + (double)i * dl);
    set_shape(o, 1, &len);
    return 1;
}

/* A Constant given by value_int, value_ints, value_float or value_floats
 * (ONNX's function bodies write them): its values, as text "5" or "[1, 2]". */
static int fold_constant_attr(struct cx *c, const struct ck_graph_node *n, struct val *o)
{
    static const char *const keys[] = {"value_int", "value_ints", "value_float", "value_floats"};
    const char *t = NULL;
    size_t k = 0, count = 0;
    int err = 0;
    for (; k < 4 && !t; k++)
        t = attr(n, keys[k]);
    if (!t)
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s': a Constant without a tensor or numeric value is not "
                        "supported",
                        c->path, n->name);
    bool list = k == 2 || k == 4, is_int = k <= 2;
    for (const char *p = t; *p; p++)
        count += *p == ',';
    count = list ? (strchr(t, ']') && t[1] != ']' ? count + 1 : 0) : 1;
    if (count > FOLD_MAX || (err = set_const(o, count, is_int)) < 0)
        return err < 0 ? err : bad_attr(c, n, keys[k - 1]);
    const char *p = t + (list ? 1 : 0);
    for (size_t i = 0; i < count; i++) {
        char *end = NULL;
        while (*p == ' ' || *p == ',')
            p++;
        o->c[i] = is_int ? (double)strtoll(p, &end, 10) : (double)strtof(p, &end);
        if (end == p)
            return bad_attr(c, n, keys[k - 1]);
        p = end;
    }
    int64_t len = (int64_t)count;
    set_shape(o, list ? 1 : 0, &len);
    return 1;
}

/* 1 when n's outputs were computed here (no node emitted), 0 when n must be
 * mapped. Elements of shape values not known here are NaN and stay NaN. */
static int fold_consts(struct cx *c, const struct ck_graph_node *n, struct val **out)
{
    struct val *in[3] = {NULL, NULL, NULL};
    const char *op = n->op;
    int err = 0;
    if (!strcmp(op, "Constant"))
        return out[0]->is_weight ? 1 : fold_constant_attr(c, n, out[0]);
    if (!strcmp(op, "Shape")) {
        if ((err = input(c, n, 0, &in[0])) < 0)
            return err;
        if (in[0]->rank < 0)
            return ck_error(CK_EUNSUPPORTED,
                            "'%s': node '%s' (Shape): the rank of '%s' is not known",
                            c->path, n->name, in[0]->name);
        /* opset 15's start and end: a slice of the shape, clamped as numpy's */
        int64_t r = in[0]->rank, st = 0, en = r;
        if ((err = attr_int(c, n, "start", 0, &st)) < 0 || (err = attr_int(c, n, "end", r, &en)) < 0)
            return err;
        st = st < 0 ? st + r : st;
        en = en < 0 ? en + r : en;
        st = st < 0 ? 0 : st > r ? r : st;
        en = en < st ? st : en > r ? r : en;
        if ((err = set_const(out[0], (size_t)(en - st), true)) < 0)
            return err;
        bool known = true;
        for (int64_t i = st; i < en; i++) {
            out[0]->c[i - st] = in[0]->dims[i] >= 0 ? (double)in[0]->dims[i] : NAN;
            known = known && in[0]->dims[i] >= 0;
        }
        int64_t d = en - st;
        set_shape(out[0], 1, &d);
        if (known)
            return 1;
        out[0]->is_const = false; /* a shape node: the engine computes it per run */
        out[0]->is_shape = true;
        return 0;
    }
    if (!strcmp(op, "Size")) {
        int64_t total = 0;
        if ((err = input(c, n, 0, &in[0])) < 0)
            return err;
        if ((err = set_const(out[0], 1, true)) < 0)
            return err;
        set_shape(out[0], 0, NULL);
        if (in[0]->rank >= 0 && (total = numel(in[0])) >= 0) {
            out[0]->c[0] = (double)total;
            return 1;
        }
        out[0]->c[0] = NAN;
        out[0]->is_const = false; /* a size node: the engine computes it per run */
        out[0]->is_shape = true;
        return 0;
    }
    static const char *const foldable[] = {
        "Identity", "Cast", "Reshape", "Unsqueeze", "Squeeze", "Gather", "Concat",         "Add",
        "Sub",      "Mul",  "Div",     "Equal",     "Slice",   "Neg",    "ConstantOfShape",
        "Expand",   "Where", "Less",   "Greater",   "LessOrEqual", "GreaterOrEqual", "Not",
        "Range"};
    bool ok = false;
    for (size_t i = 0; i < sizeof foldable / sizeof foldable[0]; i++)
        ok = ok || !strcmp(op, foldable[i]);
    if (!ok || n->noutputs != 1)
        return 0;
    for (size_t i = 0; i < n->ninputs; i++) {
        struct val *x = NULL;
        if (!has_input(n, i))
            continue;
        if ((err = input(c, n, i, &x)) < 0)
            return err;
        if (!x->is_const && !(x->is_shape && x->c))
            return 0;
        for (size_t k = 0; !x->is_const && !strcmp(op, "Range") && k < x->cn; k++)
            if (isnan(x->c[k]))
                return 0; /* a range of a length known at run time: a node */
        if (i < 3)
            in[i] = x;
    }
    struct val *o = out[0], *a = in[0], *b = in[1];
    if (!a)
        return 0;
    if (!strcmp(op, "ConstantOfShape")) {
        const char *t = attr(n, "value");
        double v = 0;
        struct val *tv = t && !strncmp(t, "tensor ", 7) ? find(c, t + 7) : NULL;
        if (t && (!tv || !tv->is_const || tv->cn != 1))
            return 0;
        int64_t total = 1, d[RANK_MAX];
        if (a->cn > RANK_MAX)
            return 0;
        for (size_t i = 0; i < a->cn; i++) {
            if (!(a->c[i] >= 0 && a->c[i] <= FOLD_MAX))
                return 0;
            d[i] = (int64_t)a->c[i];
            total *= d[i];
            if (total > FOLD_MAX)
                return 0;
        }
        if (tv)
            v = tv->c[0];
        if ((err = set_const(o, (size_t)total, tv ? tv->is_int : false)) < 0)
            return err;
        for (int64_t i = 0; i < total; i++)
            o->c[i] = v;
        set_shape(o, (int)a->cn, d);
        return 1;
    }
    if (!strcmp(op, "Expand") && b && a->rank >= 0 && b->cn <= RANK_MAX)
        return fold_expand(c, n, a, b, o);
    if (!strcmp(op, "Range"))
        return fold_range(c, n, in, o);
    if (o->rank < 0 || numel(o) < 0 || numel(o) > FOLD_MAX)
        return 0;
    size_t total = (size_t)numel(o);
    if (!strcmp(op, "Identity") || !strcmp(op, "Reshape") || !strcmp(op, "Unsqueeze") ||
        !strcmp(op, "Squeeze") || !strcmp(op, "Cast") || !strcmp(op, "Neg")) {
        int64_t to = 1;
        if (!strcmp(op, "Cast") && (err = attr_int(c, n, "to", 1, &to)) < 0)
            return err;
        bool is_int = !strcmp(op, "Cast") ? is_int_dtype(ck_onnx_dtype((uint64_t)to)) : a->is_int;
        if (total != a->cn || (err = set_const(o, total, is_int)) < 0)
            return err < 0 ? err : 0;
        for (size_t i = 0; i < total; i++)
            o->c[i] = op[0] == 'N' ? -a->c[i] : is_int ? trunc(a->c[i]) : a->c[i];
        return 1;
    }
    bool cmp = !strcmp(op, "Equal") || !strcmp(op, "Less") || !strcmp(op, "Greater") ||
               !strcmp(op, "LessOrEqual") || !strcmp(op, "GreaterOrEqual");
    if (b && (cmp || !strcmp(op, "Add") || !strcmp(op, "Sub") || !strcmp(op, "Mul") ||
              !strcmp(op, "Div"))) {
        if (!((a->cn == total || a->cn == 1) && (b->cn == total || b->cn == 1)))
            return 0;
        bool is_int = a->is_int && b->is_int;
        if ((err = set_const(o, total, cmp || is_int)) < 0)
            return err;
        o->is_mask = cmp;
        for (size_t i = 0; i < total; i++)
            o->c[i] = binop(op, a->c[a->cn == 1 ? 0 : i], b->c[b->cn == 1 ? 0 : i], is_int);
        return 1;
    }
    if (!strcmp(op, "Not")) {
        if (total != a->cn || (err = set_const(o, total, true)) < 0)
            return err < 0 ? err : 0;
        o->is_mask = true;
        for (size_t i = 0; i < total; i++)
            o->c[i] = isnan(a->c[i]) ? NAN : a->c[i] == 0;
        return 1;
    }
    if (!strcmp(op, "Where") && b && in[2]) {
        const struct val *e = in[2];
        if (!((a->cn == total || a->cn == 1) && (b->cn == total || b->cn == 1) &&
              (e->cn == total || e->cn == 1)))
            return 0;
        if ((err = set_const(o, total, b->is_int && e->is_int)) < 0)
            return err;
        for (size_t i = 0; i < total; i++) {
            double cond = a->c[a->cn == 1 ? 0 : i];
            o->c[i] = isnan(cond) ? NAN : cond != 0 ? b->c[b->cn == 1 ? 0 : i]
                                                     : e->c[e->cn == 1 ? 0 : i];
        }
        return 1;
    }
    if (!strcmp(op, "Gather") && b && a->rank <= 1) {
        int64_t axis = 0;
        if ((err = attr_int(c, n, "axis", 0, &axis)) < 0)
            return err;
        if (total != b->cn || (err = set_const(o, total, a->is_int)) < 0)
            return err < 0 ? err : 0;
        for (size_t i = 0; i < total; i++) {
            int64_t k = 0;
            if (isnan(b->c[i])) {
                o->c[i] = NAN;
                continue;
            }
            if (!ck_dim_from_double(b->c[i], &k) || k < -(int64_t)a->cn)
                return ck_error(CK_EFORMAT, "'%s': node '%s' (Gather): index out of range", c->path,
                                n->name);
            if (k < 0)
                k += (int64_t)a->cn;
            if (k < 0 || k >= (int64_t)a->cn)
                return ck_error(CK_EFORMAT, "'%s': node '%s' (Gather): index out of range", c->path,
                                n->name);
            o->c[i] = a->c[k];
        }
        return 1;
    }
    if (!strcmp(op, "Concat") && o->rank == 1) {
        if ((err = set_const(o, total, a->is_int)) < 0)
            return err;
        size_t at = 0;
        for (size_t i = 0; i < n->ninputs; i++) {
            struct val *x = NULL;
            if ((err = input(c, n, i, &x)) < 0)
                return err;
            for (size_t k = 0; k < x->cn && at < total; k++)
                o->c[at++] = x->c[k];
        }
        return at == total ? 1 : 0;
    }
    if (!strcmp(op, "Slice") && a->rank == 1 && o->rank == 1 && b && in[2]) {
        int64_t s = 0, dim = (int64_t)a->cn;
        if (!ck_dim_from_double(b->c[0], &s))
            return 0;
        if (s < 0)
            s += dim;
        if (s < 0)
            s = 0;
        if ((err = set_const(o, total, a->is_int)) < 0)
            return err;
        for (size_t i = 0; i < total; i++)
            o->c[i] = a->c[(size_t)s + i < a->cn ? (size_t)s + i : 0];
        return 1;
    }
    return 0;
}

/* Whether n's output is a shape value: integers computed from shapes only
 * (its inputs shape values or integer constants, one at least a shape
 * value) by an op the engine evaluates on integers. */
static bool shape_arith(struct cx *c, const struct ck_graph_node *n)
{
    static const char *const ops[] = {
        "Identity", "Cast",  "Reshape", "Unsqueeze", "Squeeze", "Gather", "Concat",
        "Add",      "Sub",   "Mul",     "Div",       "Equal",   "Slice",  "Neg",
        "Expand",   "Where", "Less",    "Greater",   "LessOrEqual", "GreaterOrEqual",
        "Not",      "Range", "ConstantOfShape", "Abs", "Max", "Min", "Flatten"};
    bool ok = false, any = false;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0] && !ok; i++)
        ok = !strcmp(n->op, ops[i]);
    for (size_t i = 0; ok && i < n->ninputs; i++) {
        struct val *x = has_input(n, i) ? find(c, n->inputs[i]) : NULL;
        if (!x)
            continue;
        any = any || computed(x);
        /* Where's condition is a mask; its values are the integers */
        ok = computed(x) || (x->is_const && (x->is_int || (!strcmp(n->op, "Where") && !i)));
    }
    if (!ok || !any)
        return false;
    if (!strcmp(n->op, "Cast")) { /* to an integer type (or bool of a mask) stays one */
        const char *to = attr(n, "to");
        enum ck_dtype t = to ? ck_onnx_dtype((uint64_t)strtoull(to, NULL, 10)) : CK_DT_F32;
        return is_int_dtype(t);
    }
    if (!strcmp(n->op, "ConstantOfShape")) {
        const char *t = attr(n, "value");
        struct val *tv = t && !strncmp(t, "tensor ", 7) ? find(c, t + 7) : NULL;
        return tv && tv->is_int;
    }
    return true;
}

/* fold_consts, where shape values (NaN for what is not known here) give a
 * node unless every element came out known. */
static int fold(struct cx *c, const struct ck_graph_node *n, struct val **out)
{
    int r = fold_consts(c, n, out);
    bool any = false;
    for (size_t i = 0; i < n->ninputs; i++)
        any = any || computed(has_input(n, i) ? find(c, n->inputs[i]) : NULL);
    if (r < 0 || !any || n->noutputs != 1 || !out[0])
        return r;
    struct val *o = out[0];
    bool arith = shape_arith(c, n);
    if (o->is_const) {
        bool complete = true;
        for (size_t k = 0; k < o->cn && complete; k++)
            complete = !isnan(o->c[k]);
        if (complete)
            return 1; /* every element known: a constant */
    }
    if (!arith) { /* data computed from a shape value (a cast to float): a node */
        if (r == 1) {
            free(o->c);
            o->c = NULL;
            o->cn = 0;
            o->is_const = false;
        }
        return 0;
    }
    if (!o->is_const) {
        free(o->c); /* its elements are not known here */
        o->c = NULL;
        o->cn = 0;
    }
    o->is_const = false;
    o->is_shape = true;
    o->is_int = true;
    o->is_mask = !strcmp(n->op, "Equal") || !strcmp(n->op, "Less") || !strcmp(n->op, "Greater") ||
                 !strcmp(n->op, "LessOrEqual") || !strcmp(n->op, "GreaterOrEqual") ||
                 !strcmp(n->op, "Not") ||
                 (!strcmp(n->op, "Cast") && find(c, n->inputs[0])->is_mask);
    return 0;
}

/* ---- the mapping: one row per ONNX op ---- */

static int emit(struct cx *c, const char *name, enum ck_op op, const char *const *in, size_t nin,
                const char *const *out, size_t nout, struct ck_model_node **mn);
static const char *tmp_name(struct cx *c, const struct ck_graph_node *n, const char *what);

struct row;
typedef int (*map_fn)(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                      struct ck_model_node *mn);

/* One ONNX op. Its input and output counts are checked against the row
 * (ck_graph_node_check_arity) before anything reads a node's inputs, so a
 * mapping may read inputs[0..in_lo) and outputs[0..out_lo) unchecked. */
struct row {
    const char *onnx;
    enum ck_op op; /* CK_OP_INVALID: folded into a constant, never emitted */
    int ndata;     /* leading inputs that are data (-1: all); the rest are folded params */
    map_fn map;    /* NULL: no parameters */
    int64_t axis;  /* the ONNX default axis for map_axis */
    struct ck_arity arity;
};

static int map_axis(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                    struct ck_model_node *mn)
{
    return attr_int(c, n, "axis", row->axis, &mn->p.axis);
}

static int map_alpha(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                     struct ck_model_node *mn)
{
    (void)row;
    return attr_float(c, n, "alpha", 0.01f, &mn->p.alpha);
}

/* Elu, Celu, Selu, HardSigmoid, ThresholdedRelu: alpha (and Selu's gamma,
 * HardSigmoid's beta) with ONNX's defaults. */
static int map_act(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                   struct ck_model_node *mn)
{
    int err = 0;
    float alpha = 1.0f, beta = 0.0f;
    const char *bkey = NULL;
    switch (row->op) {
    case CK_OP_SELU:
        alpha = 1.67326319217681884765625f, beta = 1.05070102214813232421875f, bkey = "gamma";
        break;
    case CK_OP_HARD_SIGMOID:
        alpha = 0.2f, beta = 0.5f, bkey = "beta";
        break;
    case CK_OP_LRN: { /* alpha 1e-4, beta 0.75, bias 1, size (required) */
        int64_t size = 0;
        if ((err = attr_float(c, n, "alpha", 1e-4f, &mn->p.alpha)) < 0 ||
            (err = attr_float(c, n, "beta", 0.75f, &mn->p.beta)) < 0 ||
            (err = attr_float(c, n, "bias", 1.0f, &mn->p.scalar)) < 0 ||
            (err = attr_int(c, n, "size", 0, &size)) < 0)
            return err;
        if (size < 1 || size > (1 << 20))
            return bad_attr(c, n, "size");
        mn->p.has_scalar = true; /* the bias is a parameter (written as `Scalar`) */
        return ck_model_node_set_ints(mn, &size, 1);
    }
    case CK_OP_SHRINK: /* lambd and bias */
        if ((err = attr_float(c, n, "lambd", 0.5f, &mn->p.alpha)) < 0)
            return err;
        return attr_float(c, n, "bias", 0.0f, &mn->p.beta);
    default:
        break;
    }
    if ((err = attr_float(c, n, "alpha", alpha, &mn->p.alpha)) < 0 ||
        (bkey && (err = attr_float(c, n, bkey, beta, &mn->p.beta)) < 0))
        return err;
    if (row->op == CK_OP_CELU && mn->p.alpha == 0)
        return bad_attr(c, n, "alpha");
    return 0;
}

static int map_eps(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                   struct ck_model_node *mn)
{
    (void)row;
    return attr_float(c, n, "epsilon", 1e-5f, &mn->p.eps);
}

static int map_softmax(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                       struct ck_model_node *mn)
{
    struct val *x = NULL;
    int err = 0;
    (void)row;
    if ((err = attr_int(c, n, "axis", c->opset >= 13 ? -1 : 1, &mn->p.axis)) < 0 ||
        (err = input(c, n, 0, &x)) < 0)
        return err;
    /* before opset 13 the input was flattened to 2-D at axis: the same only
     * when axis is the last one */
    if (c->opset < 13 && (x->rank < 0 || norm_axis(mn->p.axis, x->rank) != x->rank - 1))
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (%s): opset %" PRId64 " softmax over "
                        "flattened axes is not supported",
                        c->path, n->name, n->op, c->opset);
    return 0;
}

/* auto_pad SAME_UPPER / SAME_LOWER: the output extent is ceil(in / stride),
 * and the padding that needs, (out - 1) stride + (k - 1) dilation + 1 - in,
 * is split in two with the odd cell at the end (UPPER) or the start (LOWER).
 * It needs the input's height and width. */
static int same_pads(struct cx *c, const struct ck_graph_node *n, bool lower,
                     struct ck_op_params *p)
{
    struct val *x = NULL;
    int err = 0;
    if ((err = input(c, n, 0, &x)) < 0)
        return err;
    if (x->rank != 4 || x->dims[2] < 1 || x->dims[3] < 1)
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (%s): auto_pad SAME needs the input's height and width",
                        c->path, n->name, n->op);
    for (int i = 0; i < 2; i++) {
        int64_t in = x->dims[2 + i], s = p->stride[i], out = 0, total = 0;
        if (s < 1 || p->kernel[i] < 1 || p->dilation[i] < 1 || in > (INT64_C(1) << 40) ||
            p->kernel[i] > (INT64_C(1) << 20) || p->dilation[i] > (INT64_C(1) << 20) ||
            s > (INT64_C(1) << 20))
            return bad_attr(c, n, "strides");
        out = (in + s - 1) / s;
        total = (out - 1) * s + (p->kernel[i] - 1) * p->dilation[i] + 1 - in;
        total = total < 0 ? 0 : total;
        p->pad[i] = lower ? total - total / 2 : total / 2; /* top, left */
        p->pad[i + 2] = total - p->pad[i];                 /* bottom, right */
    }
    return 0;
}

static int map_pool(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                    struct ck_model_node *mn)
{
    int64_t v[4], ceil = 0, cip = 0;
    size_t k = 0;
    int err = 0;
    const char *pad = attr(n, "auto_pad");
    bool same = pad && (!strcmp(pad, "SAME_UPPER") || !strcmp(pad, "SAME_LOWER"));
    if (pad && strcmp(pad, "NOTSET") && strcmp(pad, "VALID") && !same)
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (%s): auto_pad '%s' is not supported", c->path,
                        n->name, n->op, pad);
    if (row->op != CK_OP_CONV2D) {
        int64_t ks[RANK_MAX];
        if ((err = attr_ints(c, n, "kernel_shape", ks, RANK_MAX, &k)) < 0)
            return err;
        v[0] = ks[0], v[1] = k > 1 ? ks[1] : 0;
        if (k != 2)
            return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (%s): only 2-D pooling is supported",
                            c->path, n->name, n->op);
        mn->p.kernel[0] = v[0], mn->p.kernel[1] = v[1];
    }
    if ((err = attr_ints(c, n, "strides", v, 2, &k)) < 0)
        return err;
    if (k == 2)
        mn->p.stride[0] = v[0], mn->p.stride[1] = v[1];
    if ((err = attr_ints(c, n, "dilations", v, 2, &k)) < 0)
        return err;
    if (k == 2)
        mn->p.dilation[0] = v[0], mn->p.dilation[1] = v[1];
    if (row->op != CK_OP_CONV2D && (mn->p.dilation[0] != 1 || mn->p.dilation[1] != 1))
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (%s): dilated pooling is not supported",
                        c->path, n->name, n->op);
    if ((err = attr_ints(c, n, "pads", v, 4, &k)) < 0)
        return err;
    if (k == 4)
        memcpy(mn->p.pad, v, sizeof mn->p.pad);
    if ((err = attr_int(c, n, "ceil_mode", 0, &ceil)) < 0 ||
        (err = attr_int(c, n, "count_include_pad", 0, &cip)) < 0 ||
        (err = attr_int(c, n, "group", 1, &mn->p.groups)) < 0)
        return err;
    mn->p.ceil_mode = ceil;
    mn->p.count_include_pad = cip;
    if (row->op == CK_OP_CONV2D) {
        struct val *w = NULL;
        if ((err = input(c, n, 1, &w)) < 0)
            return err;
        if (w->rank != 4)
            return ck_error(CK_EUNSUPPORTED,
                            "'%s': node '%s' (Conv): only 2-D convolutions are "
                            "supported",
                            c->path, n->name);
        mn->p.kernel[0] = w->dims[2], mn->p.kernel[1] = w->dims[3];
    }
    return same ? same_pads(c, n, !strcmp(pad, "SAME_LOWER"), &mn->p) : 0;
}

/* ConvTranspose (2-D): strides, dilations, group, pads, output_padding;
 * output_shape (or auto_pad SAME_*, output = input * stride) sets the pads:
 * total = stride (in - 1) + output_padding + dilation (k - 1) + 1 - out,
 * split with the odd cell at the start, or at the end for SAME_UPPER
 * (floor division: a negative total extends the output at its end). */
static int map_convt(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                     struct ck_model_node *mn)
{
    int64_t v[RANK_MAX], outpad[2] = {0, 0}, os_[RANK_MAX], oshape[2] = {0, 0};
    size_t k = 0, nos = SIZE_MAX;
    struct val *x = NULL, *w = NULL;
    int err = 0;
    const char *ap = attr(n, "auto_pad");
    (void)row;
    if ((err = input(c, n, 0, &x)) < 0 || (err = input(c, n, 1, &w)) < 0)
        return err;
    if (w->rank != 4 || (x->rank >= 0 && x->rank != 4))
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (ConvTranspose): only 2-D transposed convolutions are "
                        "supported",
                        c->path, n->name);
    if (ap && strcmp(ap, "NOTSET") && strcmp(ap, "VALID") && strcmp(ap, "SAME_UPPER") &&
        strcmp(ap, "SAME_LOWER"))
        return bad_attr(c, n, "auto_pad");
    struct {
        const char *key;
        int64_t *to;
    } pairs[] = {{"strides", mn->p.stride}, {"dilations", mn->p.dilation},
                 {"output_padding", outpad}};
    for (size_t i = 0; i < 3; i++) {
        if ((err = attr_ints(c, n, pairs[i].key, v, RANK_MAX, &k)) < 0)
            return err;
        if (k != SIZE_MAX && k != 2)
            return bad_attr(c, n, pairs[i].key);
        if (k == 2)
            pairs[i].to[0] = v[0], pairs[i].to[1] = v[1];
    }
    if ((err = attr_ints(c, n, "pads", v, RANK_MAX, &k)) < 0 ||
        (err = attr_ints(c, n, "output_shape", os_, RANK_MAX, &nos)) < 0 ||
        (err = attr_int(c, n, "group", 1, &mn->p.groups)) < 0)
        return err;
    if (nos != SIZE_MAX && nos >= 2) { /* [H, W], or the whole [N, C, H, W] */
        oshape[0] = os_[nos - 2], oshape[1] = os_[nos - 1];
        nos = 2;
    }
    if (k == 4)
        memcpy(mn->p.pad, v, sizeof mn->p.pad);
    else if (k != SIZE_MAX)
        return bad_attr(c, n, "pads");
    bool same = ap && !strncmp(ap, "SAME_", 5);
    if (nos != SIZE_MAX || same) {
        if (x->rank != 4 || x->dims[2] < 1 || x->dims[3] < 1 || (nos != SIZE_MAX && nos != 2))
            return ck_error(CK_EUNSUPPORTED,
                            "'%s': node '%s' (ConvTranspose): output_shape and auto_pad need the "
                            "input's height and width",
                            c->path, n->name);
        for (int i = 0; i < 2; i++) {
            int64_t s = mn->p.stride[i], d = mn->p.dilation[i], kk = w->dims[2 + i], lim = 1 << 30;
            int64_t in = x->dims[2 + i], out = nos != SIZE_MAX ? oshape[i] : in * s;
            if (s < 1 || d < 1 || s > lim || d > lim || kk > lim || in > lim || out < 1 ||
                out > lim || outpad[i] < 0 || outpad[i] > lim)
                return bad_attr(c, n, "output_shape");
            int64_t total = s * (in - 1) + outpad[i] + d * (kk - 1) + 1 - out;
            int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2); /* floor */
            bool upper = ap && !strcmp(ap, "SAME_UPPER");
            mn->p.pad[i] = upper ? half : total - half;
            mn->p.pad[i + 2] = total - mn->p.pad[i];
        }
    }
    return ck_model_node_set_ints(mn, outpad, 2);
}

static int set_ints_from_input(struct cx *c, const struct ck_graph_node *n, size_t i,
                               const char *attr_name, struct ck_model_node *mn)
{
    int64_t v[CK_MODEL_MAX_INTS];
    size_t k = 0;
    int err = 0;
    if (has_input(n, i))
        err = const_ints(c, n, i, v, CK_MODEL_MAX_INTS, &k);
    else
        err = attr_ints(c, n, attr_name, v, CK_MODEL_MAX_INTS, &k);
    if (err < 0)
        return err;
    return k == SIZE_MAX ? 0 : ck_model_node_set_ints(mn, v, k);
}

static int map_reshape(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                       struct ck_model_node *mn)
{
    int64_t az = 0;
    int err = 0;
    (void)row;
    if ((err = attr_int(c, n, "allowzero", 0, &az)) < 0)
        return err;
    if (az)
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (Reshape): allowzero is not supported",
                        c->path, n->name);
    if (computed_param(find(c, n->inputs[1]))) /* the engine gives it per run */
        return ck_model_node_add_input(mn, n->inputs[1]);
    return set_ints_from_input(c, n, 1, "shape", mn);
}

static int map_transpose(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                         struct ck_model_node *mn)
{
    int64_t v[CK_MODEL_MAX_INTS];
    size_t k = 0;
    struct val *x = NULL;
    int err = 0;
    (void)row;
    if ((err = attr_ints(c, n, "perm", v, CK_MODEL_MAX_INTS, &k)) < 0 ||
        (err = input(c, n, 0, &x)) < 0)
        return err;
    if (k == SIZE_MAX) { /* default: reverse the axes */
        if (x->rank < 0)
            return ck_error(CK_EFORMAT, "'%s': node '%s' (Transpose): no perm and no static rank",
                            c->path, n->name);
        for (int i = 0; i < x->rank; i++)
            v[i] = x->rank - 1 - i;
        k = (size_t)x->rank;
    }
    return ck_model_node_set_ints(mn, v, k);
}

static int map_axes(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                    struct ck_model_node *mn)
{
    int err = 0;
    if ((err = set_ints_from_input(c, n, 1, "axes", mn)) < 0)
        return err;
    struct val *x, *o = find(c, n->outputs[0]);
    if ((err = input(c, n, 0, &x)) < 0)
        return err;
    /* negative axes count from the end of the input (squeeze, reduce) or of
     * the output (unsqueeze); written as positive ones when the rank is known */
    int rank = row->op == CK_OP_UNSQUEEZE ? (o ? o->rank : -1) : x->rank;
    for (size_t i = 0; i < mn->p.nints; i++)
        mn->p.ints[i] = norm_axis(mn->p.ints[i], rank);
    if (ck_op_is_reduce(row->op)) {
        int64_t keep = 0, noop = 0;
        if ((err = attr_int(c, n, "keepdims", 1, &keep)) < 0 ||
            (err = attr_int(c, n, "noop_with_empty_axes", 0, &noop)) < 0)
            return err;
        mn->p.keepdims = keep;
        /* with noop_with_empty_axes, no axes means the identity, not all axes */
        if (noop && mn->p.nints == 0)
            return ck_error(CK_EUNSUPPORTED,
                            "'%s': node '%s' (%s): noop_with_empty_axes with no axes is not "
                            "supported",
                            c->path, n->name, n->op);
    }
    return 0;
}

static int map_split(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                     struct ck_model_node *mn)
{
    int err = 0;
    if ((err = map_axis(c, n, row, mn)) < 0)
        return err;
    return set_ints_from_input(c, n, 1, "split", mn);
}

/* Slice(x, starts, ends[, axes[, steps]]) -> [start, end, step] for every
 * axis from 0 to the last one sliced (whole axes in between). */
static int map_slice(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                     struct ck_model_node *mn)
{
    int64_t st[RANK_MAX], en[RANK_MAX], ax[RANK_MAX], sp[RANK_MAX], out[3 * RANK_MAX];
    size_t ns, ne, na = SIZE_MAX, np = SIZE_MAX;
    struct val *x = NULL;
    int err, last = -1;
    (void)row;
    bool any = false;
    for (size_t i = 1; i < n->ninputs; i++)
        any = any || computed_param(has_input(n, i) ? find(c, n->inputs[i]) : NULL);
    if (any) { /* bounds from shapes: (x, starts, ends[, axes[, steps]]) for the engine */
        if (n->ninputs > 4 && has_input(n, 4) && !has_input(n, 3))
            return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (Slice): steps without axes",
                            c->path, n->name);
        for (size_t i = 1; i < n->ninputs && has_input(n, i); i++) {
            struct val *v = find(c, n->inputs[i]);
            if (v && v->is_const && !v->is_weight && (err = materialise(c, v)) < 0)
                return err;
            if (v && !v->is_const && !computed_param(v) && !v->is_weight)
                return ck_error(CK_EUNSUPPORTED,
                                "'%s': node '%s' (Slice): input '%s' depends on tensor values, "
                                "not only on shapes",
                                c->path, n->name, v->name);
            if ((err = ck_model_node_add_input(mn, n->inputs[i])) < 0)
                return err;
        }
        return 0;
    }
    if ((err = input(c, n, 0, &x)) < 0 || (err = const_ints(c, n, 1, st, RANK_MAX, &ns)) < 0 ||
        (err = const_ints(c, n, 2, en, RANK_MAX, &ne)) < 0 ||
        (has_input(n, 3) && (err = const_ints(c, n, 3, ax, RANK_MAX, &na)) < 0) ||
        (has_input(n, 4) && (err = const_ints(c, n, 4, sp, RANK_MAX, &np)) < 0))
        return err;
    if (ns != ne || (na != SIZE_MAX && na != ns) || (np != SIZE_MAX && np != ns))
        return ck_error(CK_EFORMAT,
                        "'%s': node '%s' (Slice): starts, ends, axes and steps "
                        "differ in length",
                        c->path, n->name);
    for (int i = 0; i < RANK_MAX; i++)
        out[3 * i] = 0, out[3 * i + 1] = INT64_MAX, out[3 * i + 2] = 1;
    for (size_t i = 0; i < ns; i++) {
        int64_t a = na == SIZE_MAX ? (int64_t)i : norm_axis(ax[i], x->rank);
        if (a < 0 || a >= RANK_MAX)
            return ck_error(CK_EFORMAT, "'%s': node '%s' (Slice): axis %" PRId64 " out of range",
                            c->path, n->name, a);
        out[3 * a] = st[i];
        out[3 * a + 1] = en[i];
        out[3 * a + 2] = np == SIZE_MAX ? 1 : sp[i];
        if (x->rank > a && x->dims[a] >= 0 && out[3 * a + 2] > 0) { /* clamp like ONNX */
            int64_t dim = x->dims[a];
            for (int k = 0; k < 2; k++) {
                int64_t *p = &out[3 * a + k];
                if (*p < 0)
                    *p += dim;
                *p = *p < 0 ? 0 : *p > dim ? dim : *p;
            }
        }
        if (a > last)
            last = (int)a;
    }
    return ck_model_node_set_ints(mn, out, (size_t)(3 * (last + 1)));
}

/* LayerNormalization's optional outputs Mean and InvStdDev (the statistics
 * over dims[axis:], kept as size-1 axes): reduce_mean(x); and
 * 1 / sqrt(reduce_mean((x - mean)^2) + epsilon), as nodes of the vocabulary. */
static int layernorm_stats(struct cx *c, const struct ck_graph_node *n, int64_t axis, float eps)
{
    bool want_mean = n->noutputs > 1 && n->outputs[1][0];
    bool want_inv = n->noutputs > 2 && n->outputs[2][0];
    struct ck_model_node *mn = NULL;
    struct val *x = NULL;
    int64_t axes[RANK_MAX];
    int err = 0;
    if (!want_mean && !want_inv)
        return 0;
    if ((err = input(c, n, 0, &x)) < 0)
        return err;
    axis = norm_axis(axis, x->rank);
    if (x->rank < 0 || axis < 0 || axis >= x->rank)
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (LayerNormalization): Mean and InvStdDev need the input's "
                        "rank",
                        c->path, n->name);
    for (int64_t a = axis; a < x->rank; a++)
        axes[a - axis] = a;
    size_t na = (size_t)(x->rank - axis);
    const char *xin = n->inputs[0];
    const char *mean = want_mean ? n->outputs[1] : tmp_name(c, n, "mean");
    const char *d = tmp_name(c, n, "centred"), *sq = tmp_name(c, n, "square");
    const char *var = tmp_name(c, n, "var"), *ve = tmp_name(c, n, "var_eps");
    const char *sd = tmp_name(c, n, "std");
    if (!mean || !d || !sq || !var || !ve || !sd)
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = emit(c, n->name, CK_OP_REDUCE_MEAN, &xin, 1, &mean, 1, &mn)) < 0 ||
        (err = ck_model_node_set_ints(mn, axes, na)) < 0)
        return err;
    mn->p.keepdims = true;
    if (!want_inv)
        return 0;
    const char *xm[2] = {xin, mean}, *dd[2] = {d, d}, *inv = n->outputs[2];
    if ((err = emit(c, n->name, CK_OP_SUB, xm, 2, &d, 1, &mn)) < 0 ||
        (err = emit(c, n->name, CK_OP_MUL, dd, 2, &sq, 1, &mn)) < 0 ||
        (err = emit(c, n->name, CK_OP_REDUCE_MEAN, &sq, 1, &var, 1, &mn)) < 0 ||
        (err = ck_model_node_set_ints(mn, axes, na)) < 0)
        return err;
    mn->p.keepdims = true;
    if ((err = emit(c, n->name, CK_OP_ADD, &var, 1, &ve, 1, &mn)) < 0)
        return err;
    mn->p.has_scalar = true;
    mn->p.scalar = eps;
    if ((err = emit(c, n->name, CK_OP_SQRT, &ve, 1, &sd, 1, &mn)) < 0)
        return err;
    return emit(c, n->name, CK_OP_RECIPROCAL, &sd, 1, &inv, 1, &mn);
}

static int map_norm(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                    struct ck_model_node *mn)
{
    int64_t tm = 0;
    int err = 0;
    if ((err = attr_float(c, n, "epsilon", 1e-5f, &mn->p.eps)) < 0 ||
        (err = attr_int(c, n, "training_mode", 0, &tm)) < 0)
        return err;
    if (tm)
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (%s): training_mode is not supported", c->path,
                        n->name, n->op);
    if (row->op != CK_OP_LAYERNORM)
        return 0;
    if ((err = map_axis(c, n, row, mn)) < 0)
        return err;
    return layernorm_stats(c, n, mn->p.axis, mn->p.eps);
}

/* Clip(x[, min[, max]]): constant bounds are the clip node's parameters; a
 * bound that is a computed or graph-input scalar becomes max(x, min) and
 * min(., max) nodes (NaN stays NaN either way). */
static int map_clip(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                    struct ck_model_node *mn)
{
    float lo = -INFINITY, hi = INFINITY;
    struct val *b[3] = {NULL, NULL, NULL};
    int err = 0;
    (void)row;
    if ((err = attr_float(c, n, "min", -INFINITY, &lo)) < 0 ||
        (err = attr_float(c, n, "max", INFINITY, &hi)) < 0)
        return err;
    for (size_t i = 1; i < 3; i++)
        if (has_input(n, i) && (err = input(c, n, i, &b[i])) < 0)
            return err;
    bool dyn_lo = b[1] && !b[1]->is_const, dyn_hi = b[2] && !b[2]->is_const;
    if (b[1] && !dyn_lo && (err = const_scalar(c, n, 1, &lo)) < 0)
        return err;
    if (b[2] && !dyn_hi && (err = const_scalar(c, n, 2, &hi)) < 0)
        return err;
    const char *cur = n->inputs[0], *y = n->outputs[0];
    bool fixed = !dyn_lo || !dyn_hi; /* a clip node for the constant bound(s) */
    if (fixed) {
        const char *o = dyn_lo || dyn_hi ? tmp_name(c, n, "clip") : y;
        if (!o || (err = emit(c, n->name, CK_OP_CLIP, &cur, 1, &o, 1, &mn)) < 0)
            return err ? err : ck_error(CK_ENOMEM, "out of memory");
        mn->p.min = dyn_lo ? -INFINITY : lo;
        mn->p.max = dyn_hi ? INFINITY : hi;
        cur = o;
    }
    if (dyn_lo) {
        const char *o = dyn_hi ? tmp_name(c, n, "lower") : y, *ab[2] = {cur, n->inputs[1]};
        if (!o || (err = emit(c, n->name, CK_OP_MAX, ab, 2, &o, 1, &mn)) < 0)
            return err ? err : ck_error(CK_ENOMEM, "out of memory");
        cur = o;
    }
    if (dyn_hi) {
        const char *ab[2] = {cur, n->inputs[2]};
        if ((err = emit(c, n->name, CK_OP_MIN, ab, 2, &y, 1, &mn)) < 0)
            return err;
    }
    return 0;
}

/* ONNX pads [b0, b1, ..., e0, e1, ...] -> [b0, e0, b1, e1, ...] */
static int map_pad(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                   struct ck_model_node *mn)
{
    int64_t v[CK_MODEL_MAX_INTS], w[CK_MODEL_MAX_INTS];
    size_t k = 0;
    int err = 0;
    const char *mode = attr(n, "mode");
    (void)row;
    if (mode && strcmp(mode, "constant"))
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (Pad): mode '%s' is not supported", c->path,
                        n->name, mode);
    if (has_input(n, 1))
        err = const_ints(c, n, 1, v, CK_MODEL_MAX_INTS, &k);
    else
        err = attr_ints(c, n, "pads", v, CK_MODEL_MAX_INTS, &k);
    if (err < 0)
        return err;
    if (k == SIZE_MAX || k % 2)
        return ck_error(CK_EFORMAT, "'%s': node '%s' (Pad): no pads", c->path, n->name);
    for (size_t i = 0; i < k / 2; i++)
        w[2 * i] = v[i], w[2 * i + 1] = v[k / 2 + i];
    if (has_input(n, 2) && (err = const_scalar(c, n, 2, &mn->p.scalar)) < 0)
        return err;
    mn->p.has_scalar = true;
    return ck_model_node_set_ints(mn, w, k);
}

/* Dropout is the identity at inference only: a training_mode input that is
 * not a constant false would drop values at random, which ckptd does not
 * compute (refused rather than answered as the identity). */
static int map_dropout(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                       struct ck_model_node *mn)
{
    float training = 0;
    int err = 0;
    (void)row;
    (void)mn;
    if (has_input(n, 2) && (err = const_scalar(c, n, 2, &training)) < 0)
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (Dropout): training_mode is not a constant: dropout in "
                        "training mode is not supported",
                        c->path, n->name);
    if (training != 0)
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (Dropout): training_mode is true: dropout in training "
                        "mode is not supported",
                        c->path, n->name);
    return 0;
}

/* Cast and CastLike to the dtype of ONNX's code to: `cast` (docs/model.md),
 * or nothing for a cast to float32 and a bool to bool. Refused by name: a
 * type that is not a number or bool; bfloat16 (onnx's reference truncated
 * before 1.14 and rounds to nearest even since: ckptd does not pick one);
 * float64 to float16 (the engine holds float64 as float32, and rounding
 * twice can differ from rounding once). */
static int cast_to(struct cx *c, const struct ck_graph_node *n, int64_t to,
                   struct ck_model_node *mn)
{
    struct val *x = find(c, n->inputs[0]);
    enum ck_dtype dt = ck_op_cast_dtype(to);
    /* a bool to bool: 0 and 1 stay; a float32 to float32: nothing to do */
    if ((to == 9 && x && x->is_mask) ||
        (to == 1 && x && !x->is_int && !x->is_mask && !x->is_f64 && !x->is_half))
        return 0;
    if (dt == CK_DT_INVALID || dt == CK_DT_BF16)
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (%s): a cast to %s is not supported%s", c->path, n->name,
                        n->op, to >= 0 ? ck_dtype_name(ck_onnx_dtype((uint64_t)to)) : "?",
                        dt == CK_DT_BF16 ? " (onnx's reference truncates to bfloat16 before 1.14, "
                                           "rounds to nearest even from 1.14: ckptd does not "
                                           "pick one)"
                                         : "");
    if (x && x->is_f64 && dt == CK_DT_F16)
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (%s): a cast of float64 to float16 is not supported (the "
                        "engine holds float64 as float32: rounding twice can differ from once)",
                        c->path, n->name, n->op);
    mn->op = CK_OP_CAST;
    return ck_model_node_set_ints(mn, &to, 1);
}

static int map_cast(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                    struct ck_model_node *mn)
{
    int64_t to = 0;
    int err = 0;
    (void)row;
    if ((err = attr_int(c, n, "to", 1, &to)) < 0)
        return err;
    struct val *x = find(c, n->inputs[0]);
    if (computed(x) && to != 9 && is_int_dtype(ck_onnx_dtype((uint64_t)to)))
        return 0; /* a shape value stays one: exact in int64 */
    if (computed(x) && to == 1) { /* a shape value as float32 data */
        mn->op = CK_OP_CAST;
        return ck_model_node_set_ints(mn, &to, 1);
    }
    return cast_to(c, n, to, mn);
}

static int map_binary(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                      struct ck_model_node *mn);
static int map_gemm(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                    struct ck_model_node *mn);
static int map_variadic(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                        struct ck_model_node *mn);
static int map_space_depth(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                           struct ck_model_node *mn);
static int map_recurrent(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                         struct ck_model_node *mn);
static int map_grid(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                    struct ck_model_node *mn);
static int map_mod(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                   struct ck_model_node *mn);
static int map_castlike(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                        struct ck_model_node *mn);
static int map_mvn(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                   struct ck_model_node *mn);
static int map_select(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                      struct ck_model_node *mn);
static int map_resize(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                      struct ck_model_node *mn);
static int map_einsum(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                      struct ck_model_node *mn);
static int map_topk(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                    struct ck_model_node *mn);
static const char *graph_attr(const struct ck_graph *g, const char *prefix, const char *name);

/* Shape's start and end; ConstantOfShape's value; Range's inputs, which must
 * come from shapes (the engine computes them before the run). */
static int map_shapeop(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                       struct ck_model_node *mn)
{
    int err = 0;
    if (row->op == CK_OP_SHAPE) {
        int64_t se[2] = {0, INT64_MAX};
        if (!attr(n, "start") && !attr(n, "end"))
            return 0;
        if ((err = attr_int(c, n, "start", 0, &se[0])) < 0 ||
            (err = attr_int(c, n, "end", INT64_MAX, &se[1])) < 0)
            return err;
        return ck_model_node_set_ints(mn, se, 2);
    }
    for (size_t i = 0; i < n->ninputs; i++) {
        struct val *x = has_input(n, i) ? find(c, n->inputs[i]) : NULL;
        if (x && !x->is_const && !computed_param(x))
            return ck_error(CK_EUNSUPPORTED,
                            "'%s': node '%s' (%s): input '%s' depends on tensor values, not only "
                            "on shapes: ckptd computes %s from shapes, before a run",
                            c->path, n->name, n->op, x->name, n->op);
    }
    if (row->op == CK_OP_RANGE)
        return 0;
    const char *t = attr(n, "value");
    struct val *tv = t && !strncmp(t, "tensor ", 7) ? find(c, t + 7) : NULL;
    if (t && (!tv || !tv->is_const || tv->cn != 1))
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (ConstantOfShape): the value is not one number",
                        c->path, n->name);
    int64_t is_int = tv && tv->is_int;
    mn->p.scalar = tv ? (float)tv->c[0] : 0.0f;
    mn->p.has_scalar = true; /* the value is a parameter (written as `Scalar`) */
    if (is_int && (fabs(tv->c[0]) > 16777216.0))
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (ConstantOfShape): the integer %.0f is past 2^24",
                        c->path, n->name, tv->c[0]);
    return ck_model_node_set_ints(mn, &is_int, 1);
}

/* clang-format off */
static const struct row rows[] = {
    {"Gemm",               CK_OP_DENSE,          0, map_gemm,      0, {2, 3, 1, 1}},
    {"MatMul",             CK_OP_MATMUL,         2, NULL,          0, {2, 2, 1, 1}},
    {"Conv",               CK_OP_CONV2D,         3, map_pool,      0, {2, 3, 1, 1}},
    {"MaxPool",            CK_OP_MAXPOOL,        1, map_pool,      0, {1, 1, 1, 2}},
    {"AveragePool",        CK_OP_AVGPOOL,        1, map_pool,      0, {1, 1, 1, 1}},
    {"GlobalAveragePool",  CK_OP_GLOBAL_AVGPOOL, 1, NULL,          0, {1, 1, 1, 1}},
    {"GlobalMaxPool",      CK_OP_GLOBAL_MAXPOOL, 1, NULL,          0, {1, 1, 1, 1}},
    {"Relu",               CK_OP_RELU,           1, NULL,          0, {1, 1, 1, 1}},
    {"LeakyRelu",          CK_OP_LEAKY_RELU,     1, map_alpha,     0, {1, 1, 1, 1}},
    {"Sigmoid",            CK_OP_SIGMOID,        1, NULL,          0, {1, 1, 1, 1}},
    {"Tanh",               CK_OP_TANH,           1, NULL,          0, {1, 1, 1, 1}},
    {"Erf",                CK_OP_ERF,            1, NULL,          0, {1, 1, 1, 1}},
    {"Sqrt",               CK_OP_SQRT,           1, NULL,          0, {1, 1, 1, 1}},
    {"Exp",                CK_OP_EXP,            1, NULL,          0, {1, 1, 1, 1}},
    {"Log",                CK_OP_LOG,            1, NULL,          0, {1, 1, 1, 1}},
    {"Neg",                CK_OP_NEG,            1, NULL,          0, {1, 1, 1, 1}},
    {"Softmax",            CK_OP_SOFTMAX,        1, map_softmax,   0, {1, 1, 1, 1}},
    {"LogSoftmax",         CK_OP_LOG_SOFTMAX,    1, map_softmax,   0, {1, 1, 1, 1}},
    {"Add",                CK_OP_ADD,            0, map_binary,    0, {2, 2, 1, 1}},
    {"Sub",                CK_OP_SUB,            0, map_binary,    0, {2, 2, 1, 1}},
    {"Mul",                CK_OP_MUL,            0, map_binary,    0, {2, 2, 1, 1}},
    {"Div",                CK_OP_DIV,            0, map_binary,    0, {2, 2, 1, 1}},
    {"Pow",                CK_OP_POW,            0, map_binary,    0, {2, 2, 1, 1}},
    {"Reshape",            CK_OP_RESHAPE,        1, map_reshape,   0, {2, 2, 1, 1}},
    {"Flatten",            CK_OP_FLATTEN,        1, map_axis,      1, {1, 1, 1, 1}},
    {"Transpose",          CK_OP_TRANSPOSE,      1, map_transpose, 0, {1, 1, 1, 1}},
    {"Concat",             CK_OP_CONCAT,        -1, map_axis,      0, {1, 0, 1, 1}},
    {"Split",              CK_OP_SPLIT,          1, map_split,     0, {1, 2, 1, 0}},
    {"Slice",              CK_OP_SLICE,          1, map_slice,     0, {3, 5, 1, 1}},
    {"Squeeze",            CK_OP_SQUEEZE,        1, map_axes,      0, {1, 2, 1, 1}},
    {"Unsqueeze",          CK_OP_UNSQUEEZE,      1, map_axes,      0, {1, 2, 1, 1}},
    {"BatchNormalization", CK_OP_BATCHNORM,      5, map_norm,      1, {5, 5, 1, 3}},
    {"LayerNormalization", CK_OP_LAYERNORM,      3, map_norm,     -1, {2, 3, 1, 3}},
    {"Gather",             CK_OP_GATHER,         2, map_axis,      0, {2, 2, 1, 1}},
    {"Identity",           CK_OP_IDENTITY,       1, NULL,          0, {1, 1, 1, 1}},
    {"Dropout",            CK_OP_IDENTITY,       1, map_dropout,   0, {1, 3, 1, 2}},
    {"Cast",               CK_OP_IDENTITY,       1, map_cast,      0, {1, 1, 1, 1}},
    {"ReduceMean",         CK_OP_REDUCE_MEAN,    1, map_axes,      0, {1, 2, 1, 1}},
    {"ReduceSum",          CK_OP_REDUCE_SUM,     1, map_axes,      0, {1, 2, 1, 1}},
    {"Clip",               CK_OP_CLIP,           0, map_clip,      0, {1, 3, 1, 1}},
    {"Pad",                CK_OP_PAD,            1, map_pad,       0, {1, 3, 1, 1}},
    {"ReduceMax",          CK_OP_REDUCE_MAX,         1, map_axes,     0, {1, 2, 1, 1}},
    {"ReduceMin",          CK_OP_REDUCE_MIN,         1, map_axes,     0, {1, 2, 1, 1}},
    {"ReduceProd",         CK_OP_REDUCE_PROD,        1, map_axes,     0, {1, 2, 1, 1}},
    {"ReduceSumSquare",    CK_OP_REDUCE_SUM_SQUARE,  1, map_axes,     0, {1, 2, 1, 1}},
    {"ReduceLogSum",       CK_OP_REDUCE_LOG_SUM,     1, map_axes,     0, {1, 2, 1, 1}},
    {"ReduceLogSumExp",    CK_OP_REDUCE_LOG_SUM_EXP,  1, map_axes,     0, {1, 2, 1, 1}},
    {"ReduceL1",           CK_OP_REDUCE_L1,          1, map_axes,     0, {1, 2, 1, 1}},
    {"ReduceL2",           CK_OP_REDUCE_L2,          1, map_axes,     0, {1, 2, 1, 1}},
    {"Abs",                CK_OP_ABS,                1, NULL,         0, {1, 1, 1, 1}},
    {"Ceil",               CK_OP_CEIL,               1, NULL,         0, {1, 1, 1, 1}},
    {"Floor",              CK_OP_FLOOR,              1, NULL,         0, {1, 1, 1, 1}},
    {"Round",              CK_OP_ROUND,              1, NULL,         0, {1, 1, 1, 1}},
    {"Sign",               CK_OP_SIGN,               1, NULL,         0, {1, 1, 1, 1}},
    {"Reciprocal",         CK_OP_RECIPROCAL,         1, NULL,         0, {1, 1, 1, 1}},
    {"Sin",                CK_OP_SIN,                1, NULL,         0, {1, 1, 1, 1}},
    {"Cos",                CK_OP_COS,                1, NULL,         0, {1, 1, 1, 1}},
    {"Tan",                CK_OP_TAN,                1, NULL,         0, {1, 1, 1, 1}},
    {"Asin",               CK_OP_ASIN,               1, NULL,         0, {1, 1, 1, 1}},
    {"Acos",               CK_OP_ACOS,               1, NULL,         0, {1, 1, 1, 1}},
    {"Atan",               CK_OP_ATAN,               1, NULL,         0, {1, 1, 1, 1}},
    {"Sinh",               CK_OP_SINH,               1, NULL,         0, {1, 1, 1, 1}},
    {"Cosh",               CK_OP_COSH,               1, NULL,         0, {1, 1, 1, 1}},
    {"Asinh",              CK_OP_ASINH,              1, NULL,         0, {1, 1, 1, 1}},
    {"Acosh",              CK_OP_ACOSH,              1, NULL,         0, {1, 1, 1, 1}},
    {"Atanh",              CK_OP_ATANH,              1, NULL,         0, {1, 1, 1, 1}},
    {"Softplus",           CK_OP_SOFTPLUS,           1, NULL,         0, {1, 1, 1, 1}},
    {"Softsign",           CK_OP_SOFTSIGN,           1, NULL,         0, {1, 1, 1, 1}},
    {"Mish",               CK_OP_MISH,               1, NULL,         0, {1, 1, 1, 1}},
    {"HardSwish",          CK_OP_HARD_SWISH,         1, NULL,         0, {1, 1, 1, 1}},
    {"Elu",                CK_OP_ELU,                1, map_act,      0, {1, 1, 1, 1}},
    {"Celu",               CK_OP_CELU,               1, map_act,      0, {1, 1, 1, 1}},
    {"Selu",               CK_OP_SELU,               1, map_act,      0, {1, 1, 1, 1}},
    {"HardSigmoid",        CK_OP_HARD_SIGMOID,       1, map_act,      0, {1, 1, 1, 1}},
    {"ThresholdedRelu",    CK_OP_THRESHOLDED_RELU,   1, map_act,      0, {1, 1, 1, 1}},
    {"PRelu",              CK_OP_PRELU,              2, NULL,         0, {2, 2, 1, 1}},
    {"Max",                CK_OP_MAX,                0, map_variadic, 0, {1, 0, 1, 1}},
    {"Min",                CK_OP_MIN,                0, map_variadic, 0, {1, 0, 1, 1}},
    {"Sum",                CK_OP_ADD,                0, map_variadic, 0, {1, 0, 1, 1}},
    {"Mean",               CK_OP_REDUCE_MEAN,        0, map_variadic, 0, {1, 0, 1, 1}},
    {"Hardmax",            CK_OP_HARDMAX,            1, map_softmax,  0, {1, 1, 1, 1}},
    {"InstanceNormalization", CK_OP_INSTANCENORM,       3, map_eps,      0, {3, 3, 1, 1}},
    {"ConvTranspose",      CK_OP_CONV_TRANSPOSE2D,   3, map_convt,    0, {2, 3, 1, 1}},
    {"RNN",                CK_OP_RNN,                0, map_recurrent, 0, {3, 6, 0, 2}},
    {"GRU",                CK_OP_GRU,                0, map_recurrent, 0, {3, 6, 0, 2}},
    {"LSTM",               CK_OP_LSTM,               0, map_recurrent, 0, {3, 8, 0, 3}},
    {"Det",                CK_OP_DET,                1, NULL,         0, {1, 1, 1, 1}},
    {"LRN",                CK_OP_LRN,                1, map_act,      0, {1, 1, 1, 1}},
    {"Shrink",             CK_OP_SHRINK,             1, map_act,      0, {1, 1, 1, 1}},
    {"Mod",                CK_OP_FMOD,               2, map_mod,      0, {2, 2, 1, 1}},
    {"CastLike",           CK_OP_IDENTITY,           1, map_castlike, 0, {2, 2, 1, 1}},
    {"MeanVarianceNormalization", CK_OP_REDUCE_MEAN, 0, map_mvn,      0, {1, 1, 1, 1}},
    {"GridSample",         CK_OP_GRID_SAMPLE,        2, map_grid,     0, {2, 2, 1, 1}},
    {"DepthToSpace",       CK_OP_RESHAPE,            0, map_space_depth, 0, {1, 1, 1, 1}},
    {"SpaceToDepth",       CK_OP_RESHAPE,            0, map_space_depth, 0, {1, 1, 1, 1}},
    /* masks and selection: a bool is float32 0 or 1 */
    {"Where",              CK_OP_WHERE,              3, NULL,         0, {3, 3, 1, 1}},
    {"Equal",              CK_OP_EQUAL,              2, NULL,         0, {2, 2, 1, 1}},
    {"Less",               CK_OP_LESS,               2, NULL,         0, {2, 2, 1, 1}},
    {"Greater",            CK_OP_GREATER,            2, NULL,         0, {2, 2, 1, 1}},
    {"LessOrEqual",        CK_OP_LESS_EQUAL,         2, NULL,         0, {2, 2, 1, 1}},
    {"GreaterOrEqual",     CK_OP_GREATER_EQUAL,      2, NULL,         0, {2, 2, 1, 1}},
    {"Not",                CK_OP_NOT,                1, NULL,         0, {1, 1, 1, 1}},
    {"And",                CK_OP_AND,                2, NULL,         0, {2, 2, 1, 1}},
    {"Or",                 CK_OP_OR,                 2, NULL,         0, {2, 2, 1, 1}},
    {"Xor",                CK_OP_XOR,                2, NULL,         0, {2, 2, 1, 1}},
    {"Expand",             CK_OP_EXPAND,             1, map_select,   0, {2, 2, 1, 1}},
    {"Tile",               CK_OP_TILE,               1, map_select,   0, {2, 2, 1, 1}},
    {"Trilu",              CK_OP_TRILU,              1, map_select,   0, {1, 2, 1, 1}},
    {"CumSum",             CK_OP_CUMSUM,             1, map_select,   0, {2, 2, 1, 1}},
    {"ArgMax",             CK_OP_ARGMAX,             1, map_select,   0, {1, 1, 1, 1}},
    {"ArgMin",             CK_OP_ARGMIN,             1, map_select,   0, {1, 1, 1, 1}},
    {"GatherElements",     CK_OP_GATHER_ELEMENTS,    2, map_axis,     0, {2, 2, 1, 1}},
    {"Resize",             CK_OP_RESIZE,             1, map_resize,   0, {1, 4, 1, 1}},
    {"Einsum",             CK_OP_MATMUL,             0, map_einsum,   0, {1, 0, 1, 1}},
    {"TopK",               CK_OP_TOPK,               1, map_topk,     0, {1, 2, 2, 2}},
    /* folded only: the shape arithmetic around Reshape and Slice */
    {"Constant",           CK_OP_INVALID,        0, NULL,          0, {0, 0, 1, 1}},
    /* shape values: folded when the shapes are static, else computed by the
     * engine from the run's input shapes (docs/model.md "Shape values") */
    {"Shape",              CK_OP_SHAPE,          1, map_shapeop,   0, {1, 1, 1, 1}},
    {"Size",               CK_OP_SIZE,           1, NULL,          0, {1, 1, 1, 1}},
    {"ConstantOfShape",    CK_OP_CONSTANT_OF_SHAPE, 1, map_shapeop, 0, {1, 1, 1, 1}},
    {"Range",              CK_OP_RANGE,          3, map_shapeop,   0, {3, 3, 1, 1}},
};
/* clang-format on */

/* A node of the model: data inputs (folded constants become weights), outputs. */
static int emit(struct cx *c, const char *name, enum ck_op op, const char *const *in, size_t nin,
                const char *const *out, size_t nout, struct ck_model_node **mn)
{
    int err = 0;
    if ((err = ck_model_add_node(c->m, name, op, mn)) < 0)
        return err;
    for (size_t i = 0; i < nin; i++) {
        struct val *v = find(c, in[i]);
        if (v && v->is_const && !v->is_weight && (err = materialise(c, v)) < 0)
            return err;
        /* materialise may have grown the node array: find the node again */
        *mn = &c->m->nodes[c->m->nnodes - 1];
        if ((err = ck_model_node_add_input(*mn, in[i])) < 0)
            return err;
    }
    for (size_t i = 0; i < nout; i++)
        if ((err = ck_model_node_add_output(*mn, out[i])) < 0)
            return err;
    return 0;
}

/* A name for a value this mapping adds: "NODE/what" (unique by a counter). */
static const char *tmp_name(struct cx *c, const struct ck_graph_node *n, const char *what)
{
    char buf[4200];
    snprintf(buf, sizeof buf, "%s/%s_%u", n->name, what, c->tmp++);
    return ck_tensor_set_strdup(c->m->weights, buf, strlen(buf));
}

static int map_binary(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                      struct ck_model_node *mn)
{
    struct val *a = NULL, *b = NULL;
    int err = 0;
    (void)mn;
    if ((err = input(c, n, 0, &a)) < 0 || (err = input(c, n, 1, &b)) < 0)
        return err;
    bool commut = row->op == CK_OP_ADD || row->op == CK_OP_MUL;
    bool bs = b->is_const && b->cn == 1, as = a->is_const && a->cn == 1 && !bs;
    const char *ins[2] = {n->inputs[0], n->inputs[1]};
    if (bs || (as && row->op != CK_OP_POW)) {
        struct val *s = bs ? b : a;
        const char *x = bs ? ins[0] : ins[1];
        if ((err = emit(c, n->name, row->op, &x, 1, (const char *const *)n->outputs, 1, &mn)) < 0)
            return err;
        mn->p.has_scalar = true;
        mn->p.scalar = (float)s->c[0];
        mn->p.scalar_first = as && !commut;
        return 0;
    }
    return emit(c, n->name, row->op, ins, 2, (const char *const *)n->outputs, 1, &mn);
}

/* Gemm: y = alpha * A' B' + beta * C, A' = transA ? A^T : A, B' likewise. */
static int map_gemm(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                    struct ck_model_node *mn)
{
    int64_t ta = 0, tb = 0;
    float alpha = 0, beta = 0;
    struct val *cv = NULL;
    int err = 0;
    (void)row;
    if ((err = attr_int(c, n, "transA", 0, &ta)) < 0 ||
        (err = attr_int(c, n, "transB", 0, &tb)) < 0 ||
        (err = attr_float(c, n, "alpha", 1, &alpha)) < 0 ||
        (err = attr_float(c, n, "beta", 1, &beta)) < 0 ||
        (has_input(n, 2) && (err = input(c, n, 2, &cv)) < 0))
        return err;
    const char *a = n->inputs[0], *y = n->outputs[0];
    if (ta) {
        const char *t = tmp_name(c, n, "transA");
        int64_t perm[2] = {1, 0};
        if (!t || (err = emit(c, n->name, CK_OP_TRANSPOSE, &a, 1, &t, 1, &mn)) < 0 ||
            (err = ck_model_node_set_ints(mn, perm, 2)) < 0)
            return err ? err : ck_error(CK_ENOMEM, "out of memory");
        a = t;
    }
    struct val *bv = NULL;
    int64_t nout = -1;
    if ((err = input(c, n, 1, &bv)) < 0)
        return err;
    if (bv->rank == 2)
        nout = bv->dims[tb ? 0 : 1];
    bool bias_in_dense =
        cv && alpha == 1 && beta == 1 && cv->rank == 1 && nout >= 0 && cv->dims[0] == nout;
    bool more = (cv && !bias_in_dense) || alpha != 1;
    const char *d = more ? tmp_name(c, n, "dense") : y;
    const char *in[3] = {a, n->inputs[1], bias_in_dense ? n->inputs[2] : NULL};
    if (!d || (err = emit(c, n->name, CK_OP_DENSE, in, bias_in_dense ? 3 : 2, &d, 1, &mn)) < 0)
        return err ? err : ck_error(CK_ENOMEM, "out of memory");
    mn->p.trans_w = tb;
    if (alpha != 1) {
        const char *s = cv && !bias_in_dense ? tmp_name(c, n, "alpha") : y;
        if (!s || (err = emit(c, n->name, CK_OP_MUL, &d, 1, &s, 1, &mn)) < 0)
            return err ? err : ck_error(CK_ENOMEM, "out of memory");
        mn->p.has_scalar = true;
        mn->p.scalar = alpha;
        d = s;
    }
    if (cv && !bias_in_dense) {
        const char *cc = n->inputs[2];
        if (beta != 1) {
            const char *s = tmp_name(c, n, "beta");
            if (!s || (err = emit(c, n->name, CK_OP_MUL, &cc, 1, &s, 1, &mn)) < 0)
                return err ? err : ck_error(CK_ENOMEM, "out of memory");
            mn->p.has_scalar = true;
            mn->p.scalar = beta;
            cc = s;
        }
        const char *ab[2] = {d, cc};
        if ((err = emit(c, n->name, CK_OP_ADD, ab, 2, &y, 1, &mn)) < 0)
            return err;
    }
    return 0;
}

/* Max, Min, Sum, Mean of n inputs (numpy broadcasting): a chain of binary
 * nodes, left to right as numpy's reduce; Mean divides the sum by n. One
 * input is the identity. */
static int map_variadic(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                        struct ck_model_node *mn)
{
    enum ck_op op = row->op == CK_OP_REDUCE_MEAN ? CK_OP_ADD : row->op;
    bool mean = row->op == CK_OP_REDUCE_MEAN;
    const char *acc = n->inputs[0], *y = n->outputs[0];
    int err = 0;
    if (n->ninputs == 1)
        return emit(c, n->name, CK_OP_IDENTITY, &acc, 1, &y, 1, &mn);
    for (size_t i = 1; i < n->ninputs; i++) {
        bool last = i + 1 == n->ninputs && !mean;
        const char *o = last ? y : tmp_name(c, n, "acc");
        const char *ab[2] = {acc, n->inputs[i]};
        if (!o || (err = emit(c, n->name, op, ab, 2, &o, 1, &mn)) < 0)
            return err ? err : ck_error(CK_ENOMEM, "out of memory");
        acc = o;
    }
    if (mean) {
        if ((err = emit(c, n->name, CK_OP_DIV, &acc, 1, &y, 1, &mn)) < 0)
            return err;
        mn->p.has_scalar = true;
        mn->p.scalar = (float)n->ninputs;
    }
    return 0;
}

/* DepthToSpace and SpaceToDepth as reshape, transpose, reshape (ONNX's own
 * definition of them), on x [N, C, H, W] with static C, H and W:
 * DepthToSpace DCR: [N, b, b, C/b^2, H, W] -> perm (0, 3, 4, 1, 5, 2);
 * DepthToSpace CRD: [N, C/b^2, b, b, H, W] -> perm (0, 1, 4, 2, 5, 3);
 * both then [N, C/b^2, H b, W b]. SpaceToDepth: [N, C, H/b, b, W/b, b] ->
 * perm (0, 3, 5, 1, 2, 4) -> [N, C b^2, H/b, W/b]. */
static int map_space_depth(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                           struct ck_model_node *mn)
{
    struct val *x = NULL;
    int64_t b = 0, s1[6], perm[6], s2[4];
    int err = 0;
    bool to_space = !strcmp(n->op, "DepthToSpace");
    const char *mode = attr(n, "mode");
    (void)row;
    if ((err = input(c, n, 0, &x)) < 0 || (err = attr_int(c, n, "blocksize", 0, &b)) < 0)
        return err;
    if (mode && strcmp(mode, "DCR") && strcmp(mode, "CRD"))
        return bad_attr(c, n, "mode");
    bool crd = mode && !strcmp(mode, "CRD");
    if (b < 1 || b > 4096)
        return bad_attr(c, n, "blocksize");
    if (x->rank != 4 || x->dims[1] < 1 || x->dims[2] < 1 || x->dims[3] < 1 ||
        x->dims[1] > (INT64_C(1) << 32) || x->dims[2] > (INT64_C(1) << 32) ||
        x->dims[3] > (INT64_C(1) << 32))
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (%s): needs a 4-D input with static channels, height "
                        "and width",
                        c->path, n->name, n->op);
    int64_t C = x->dims[1], H = x->dims[2], W = x->dims[3];
    if (to_space ? C % (b * b) : H % b || W % b)
        return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): blocksize %" PRId64 " does not divide "
                        "the input",
                        c->path, n->name, n->op, b);
    if (to_space) {
        int64_t a[6] = {0, b, b, C / (b * b), H, W}, a2[6] = {0, C / (b * b), b, b, H, W};
        int64_t p1[6] = {0, 3, 4, 1, 5, 2}, p2[6] = {0, 1, 4, 2, 5, 3};
        memcpy(s1, crd ? a2 : a, sizeof s1);
        memcpy(perm, crd ? p2 : p1, sizeof perm);
        int64_t o[4] = {0, C / (b * b), H * b, W * b};
        memcpy(s2, o, sizeof s2);
    } else {
        int64_t a[6] = {0, C, H / b, b, W / b, b}, p1[6] = {0, 3, 5, 1, 2, 4};
        int64_t o[4] = {0, C * b * b, H / b, W / b};
        memcpy(s1, a, sizeof s1);
        memcpy(perm, p1, sizeof perm);
        memcpy(s2, o, sizeof s2);
    }
    const char *in = n->inputs[0], *r1 = tmp_name(c, n, "blocks"), *t = tmp_name(c, n, "moved");
    const char *y = n->outputs[0];
    if (!r1 || !t)
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = emit(c, n->name, CK_OP_RESHAPE, &in, 1, &r1, 1, &mn)) < 0 ||
        (err = ck_model_node_set_ints(mn, s1, 6)) < 0 ||
        (err = emit(c, n->name, CK_OP_TRANSPOSE, &r1, 1, &t, 1, &mn)) < 0 ||
        (err = ck_model_node_set_ints(mn, perm, 6)) < 0 ||
        (err = emit(c, n->name, CK_OP_RESHAPE, &t, 1, &y, 1, &mn)) < 0)
        return err;
    return ck_model_node_set_ints(mn, s2, 4);
}

/* RNN, GRU, LSTM: ONNX's defaults only (the activations, no clip, no
 * input_forget, no sequence_lens); anything else refused by name. The
 * optional inputs present become a mask (docs/model.md). */
static int map_recurrent(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                         struct ck_model_node *mn)
{
    int64_t hidden = 0, layout = 0, lbr = 0, ifg = 0, mask = 0, dir = 0;
    const char *d = attr(n, "direction"), *in[7], *out[3];
    size_t nin = 3, nout = row->op == CK_OP_LSTM ? 3 : 2;
    int err = 0;
    static const char *const unsupported[] = {"activation_alpha", "activation_beta", "clip"};
    /* activations written out as ONNX's defaults (torch does) are the defaults */
    static const char *const defaults[] = {"Tanh", "Sigmoid", "Tanh", "Sigmoid", "Tanh", "Tanh"};
    const char *acts = attr(n, "activations");
    size_t first = row->op == CK_OP_RNN ? 0 : row->op == CK_OP_GRU ? 1 : 3;
    size_t per = row->op == CK_OP_RNN ? 1 : row->op == CK_OP_GRU ? 2 : 3;
    for (size_t k = 0; acts && *acts;) {
        const char *want = defaults[first + k % per];
        size_t len = strlen(want);
        while (*acts == '[' || *acts == ' ' || *acts == ',')
            acts++;
        if (!*acts || *acts == ']')
            break;
        if (strncasecmp(acts, want, len) || (acts[len] && !strchr(", ]", acts[len])))
            return ck_error(CK_EUNSUPPORTED,
                            "'%s': node '%s' (%s): activations other than ONNX's defaults are not "
                            "supported",
                            c->path, n->name, n->op);
        acts += len;
        k++;
    }
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (attr(n, unsupported[i]))
            return ck_error(CK_EUNSUPPORTED,
                            "'%s': node '%s' (%s): attribute '%s' is not supported (only ONNX's "
                            "default activations, no clip)",
                            c->path, n->name, n->op, unsupported[i]);
    if ((err = attr_int(c, n, "hidden_size", 0, &hidden)) < 0 ||
        (err = attr_int(c, n, "layout", 0, &layout)) < 0 ||
        (err = attr_int(c, n, "linear_before_reset", 0, &lbr)) < 0 ||
        (err = attr_int(c, n, "input_forget", 0, &ifg)) < 0)
        return err;
    if (ifg)
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (%s): input_forget is not supported",
                        c->path, n->name, n->op);
    if (has_input(n, 4))
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (%s): sequence_lens (an integer input) is not supported",
                        c->path, n->name, n->op);
    if (hidden < 1 || hidden > (1 << 24))
        return bad_attr(c, n, "hidden_size");
    if (layout != 0 && layout != 1)
        return bad_attr(c, n, "layout");
    if (d && !strcmp(d, "reverse"))
        dir = 1;
    else if (d && !strcmp(d, "bidirectional"))
        dir = 2;
    else if (d && strcmp(d, "forward"))
        return bad_attr(c, n, "direction");
    in[0] = n->inputs[0], in[1] = n->inputs[1], in[2] = n->inputs[2];
    /* ONNX inputs 3 B, 5 initial_h, 6 initial_c, 7 P -> mask bits 1, 2, 4, 8 */
    static const int onnx_at[4] = {3, 5, 6, 7};
    for (int b = 0; b < 4; b++)
        if (has_input(n, (size_t)onnx_at[b])) {
            mask |= 1 << b;
            in[nin++] = n->inputs[onnx_at[b]];
        }
    for (size_t i = 0; i < nout; i++) {
        out[i] = i < n->noutputs && n->outputs[i][0] ? n->outputs[i] : tmp_name(c, n, "state");
        if (!out[i])
            return ck_error(CK_ENOMEM, "out of memory");
    }
    int64_t ints[5] = {dir, hidden, mask, layout, lbr};
    if ((err = emit(c, n->name, row->op, in, nin, out, nout, &mn)) < 0)
        return err;
    return ck_model_node_set_ints(mn, ints, 5);
}

/* GridSample (opset 16): mode bilinear, nearest, bicubic; padding_mode
 * zeros, border, reflection; align_corners. */
static int map_grid(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                    struct ck_model_node *mn)
{
    static const char *const modes[] = {"bilinear", "nearest", "bicubic"};
    static const char *const pads[] = {"zeros", "border", "reflection"};
    const char *m = attr(n, "mode"), *pm = attr(n, "padding_mode");
    int64_t v[3] = {0, 0, 0};
    int err = 0;
    (void)row;
    for (int64_t i = 0; m && i < 3; i++)
        if (!strcmp(m, modes[i]))
            v[0] = i + 10;
    for (int64_t i = 0; pm && i < 3; i++)
        if (!strcmp(pm, pads[i]))
            v[1] = i + 10;
    if ((m && v[0] < 10) || (pm && v[1] < 10))
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (GridSample): mode '%s' or padding_mode "
                        "'%s' is not supported",
                        c->path, n->name, m ? m : "bilinear", pm ? pm : "zeros");
    v[0] = m ? v[0] - 10 : 0;
    v[1] = pm ? v[1] - 10 : 0;
    if ((err = attr_int(c, n, "align_corners", 0, &v[2])) < 0)
        return err;
    return ck_model_node_set_ints(mn, v, 3);
}

/* Mod: fmod=1 is C's fmod (the sign of the dividend); fmod=0 (the sign of
 * the divisor) is for integers only (p.ints = [0]: ck_infer_k_int). */
static int map_mod(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                   struct ck_model_node *mn)
{
    int64_t f = 0;
    int err = 0;
    struct val *a = NULL;
    (void)row;
    if ((err = attr_int(c, n, "fmod", 0, &f)) < 0 || (err = input(c, n, 0, &a)) < 0)
        return err;
    f = f != 0;
    if (!f && !a->is_int)
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (Mod): fmod=0 (integer modulo) on a "
                        "value that is not an integer",
                        c->path, n->name);
    return ck_model_node_set_ints(mn, &f, 1);
}

/* CastLike(x, like): a cast to like's type (a weight's or a graph input's;
 * a computed like's type is not tracked: refused). */
static int map_castlike(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                        struct ck_model_node *mn)
{
    const char *t = has_input(n, 1) ? graph_attr(c->g, "dtype.", n->inputs[1]) : NULL;
    const struct ck_tensor *w = has_input(n, 1) ? ck_tensor_set_find(c->m->weights, n->inputs[1])
                                                : NULL;
    enum ck_dtype dt = w ? w->dtype : t ? ck_dtype_from_name(t) : CK_DT_INVALID;
    (void)row;
    for (int64_t code = 1; dt != CK_DT_INVALID && code <= 16; code++)
        if (ck_op_cast_dtype(code) == dt)
            return cast_to(c, n, code, mn);
    return ck_error(CK_EUNSUPPORTED,
                    "'%s': node '%s' (CastLike): a cast to %s is not supported", c->path, n->name,
                    dt == CK_DT_INVALID ? "a type ckptd does not know here" : ck_dtype_name(dt));
}

/* MeanVarianceNormalization: (x - mean) / (sqrt(mean((x - mean)^2)) + 1e-9)
 * over axes (default 0, 2, 3), ONNX's function body as nodes. */
static int map_mvn(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                   struct ck_model_node *mn)
{
    int64_t axes[RANK_MAX] = {0, 2, 3};
    size_t na = 3, k = 0;
    int err = 0;
    (void)row;
    if ((err = attr_ints(c, n, "axes", axes, RANK_MAX, &k)) < 0)
        return err;
    if (k != SIZE_MAX)
        na = k;
    const char *x = n->inputs[0], *y = n->outputs[0], *mean = tmp_name(c, n, "mean");
    const char *d = tmp_name(c, n, "centred"), *sq = tmp_name(c, n, "square");
    const char *var = tmp_name(c, n, "var"), *sd = tmp_name(c, n, "std");
    const char *sde = tmp_name(c, n, "std_eps");
    if (!mean || !d || !sq || !var || !sd || !sde)
        return ck_error(CK_ENOMEM, "out of memory");
    const char *xm[2] = {x, mean}, *dd[2] = {d, d}, *ds[2] = {d, sde};
    if ((err = emit(c, n->name, CK_OP_REDUCE_MEAN, &x, 1, &mean, 1, &mn)) < 0 ||
        (err = ck_model_node_set_ints(mn, axes, na)) < 0)
        return err;
    mn->p.keepdims = true;
    if ((err = emit(c, n->name, CK_OP_SUB, xm, 2, &d, 1, &mn)) < 0 ||
        (err = emit(c, n->name, CK_OP_MUL, dd, 2, &sq, 1, &mn)) < 0 ||
        (err = emit(c, n->name, CK_OP_REDUCE_MEAN, &sq, 1, &var, 1, &mn)) < 0 ||
        (err = ck_model_node_set_ints(mn, axes, na)) < 0)
        return err;
    mn->p.keepdims = true;
    if ((err = emit(c, n->name, CK_OP_SQRT, &var, 1, &sd, 1, &mn)) < 0 ||
        (err = emit(c, n->name, CK_OP_ADD, &sd, 1, &sde, 1, &mn)) < 0)
        return err;
    mn->p.has_scalar = true;
    mn->p.scalar = 1e-9f;
    return emit(c, n->name, CK_OP_DIV, ds, 2, &y, 1, &mn);
}

/* Expand (the shape), Tile (the repeats), Trilu (upper, k) and CumSum
 * (the axis, exclusive, reverse): the second input must be a constant. */
static int map_select(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                      struct ck_model_node *mn)
{
    int64_t v[RANK_MAX], at[3] = {1, 0, 0};
    size_t k = 0;
    int err = 0;
    if (row->op == CK_OP_EXPAND || row->op == CK_OP_TILE) {
        struct val *x = NULL;
        if (computed_param(find(c, n->inputs[1]))) /* the engine gives it per run */
            return ck_model_node_add_input(mn, n->inputs[1]);
        if ((err = const_ints(c, n, 1, v, RANK_MAX, &k)) < 0 || (err = input(c, n, 0, &x)) < 0)
            return err;
        if (row->op == CK_OP_TILE && x->rank >= 0 && k != (size_t)x->rank)
            return ck_error(CK_EFORMAT, "'%s': node '%s' (Tile): %zu repeats for rank %d",
                            c->path, n->name, k, x->rank);
        return ck_model_node_set_ints(mn, v, k);
    }
    if (row->op == CK_OP_ARGMAX || row->op == CK_OP_ARGMIN) {
        int64_t keep = 1, last = 0;
        if ((err = attr_int(c, n, "axis", 0, &mn->p.axis)) < 0 ||
            (err = attr_int(c, n, "keepdims", 1, &keep)) < 0 ||
            (err = attr_int(c, n, "select_last_index", 0, &last)) < 0)
            return err;
        mn->p.keepdims = keep != 0;
        last = last != 0;
        return ck_model_node_set_ints(mn, &last, 1);
    }
    if (row->op == CK_OP_TRILU) {
        if ((err = attr_int(c, n, "upper", 1, &at[0])) < 0)
            return err;
        at[1] = 0;
        if (has_input(n, 1) && computed_param(find(c, n->inputs[1]))) { /* k per run */
            at[0] = at[0] != 0;
            if ((err = ck_model_node_set_ints(mn, at, 2)) < 0)
                return err;
            return ck_model_node_add_input(mn, n->inputs[1]);
        }
        if (has_input(n, 1) && ((err = const_ints(c, n, 1, v, 1, &k)) < 0 || k != 1))
            return err < 0 ? err : ck_error(CK_EFORMAT, "'%s': node '%s' (Trilu): k is not a scalar",
                                            c->path, n->name);
        if (has_input(n, 1))
            at[1] = v[0];
        at[0] = at[0] != 0;
        return ck_model_node_set_ints(mn, at, 2);
    }
    /* CumSum */
    if ((err = const_ints(c, n, 1, v, 1, &k)) < 0)
        return err;
    if (k != 1)
        return ck_error(CK_EFORMAT, "'%s': node '%s' (CumSum): the axis is not a scalar", c->path,
                        n->name);
    at[0] = v[0];
    if ((err = attr_int(c, n, "exclusive", 0, &at[1])) < 0 ||
        (err = attr_int(c, n, "reverse", 0, &at[2])) < 0)
        return err;
    at[1] = at[1] != 0, at[2] = at[2] != 0;
    return ck_model_node_set_ints(mn, at, 3);
}

/* TopK: k from the input K (opset 10 on) or the attribute k (before), a
 * constant here; axis, largest, sorted. sorted=0 leaves the order to the
 * runtime: ckptd gives the sorted order then too. */
static int map_topk(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                    struct ck_model_node *mn)
{
    int64_t v[3] = {0, 1, 1};
    size_t k = 1;
    struct val *x = NULL;
    int err = 0;
    (void)row;
    if (has_input(n, 1) ? (err = const_ints(c, n, 1, v, 1, &k)) < 0
                        : (err = attr_int(c, n, "k", -1, &v[0])) < 0)
        return err;
    if (k != 1 || v[0] < 0)
        return ck_error(CK_EFORMAT, "'%s': node '%s' (TopK): k is not one whole number from 0",
                        c->path, n->name);
    if ((err = attr_int(c, n, "axis", -1, &mn->p.axis)) < 0 ||
        (err = attr_int(c, n, "largest", 1, &v[1])) < 0 ||
        (err = attr_int(c, n, "sorted", 1, &v[2])) < 0 || (err = input(c, n, 0, &x)) < 0)
        return err;
    int64_t a = x->rank >= 0 ? norm_axis(mn->p.axis, x->rank) : 0;
    if (x->rank >= 0 && (a < 0 || a >= x->rank))
        return ck_error(CK_EFORMAT, "'%s': node '%s' (TopK): axis %" PRId64 " out of range for "
                        "rank %d", c->path, n->name, mn->p.axis, x->rank);
    if (x->rank >= 0 && x->dims[a] >= 0 && v[0] > x->dims[a])
        return ck_error(CK_EFORMAT, "'%s': node '%s' (TopK): k %" PRId64 " is larger than the "
                        "axis (%" PRId64 " elements)", c->path, n->name, v[0], x->dims[a]);
    v[1] = v[1] != 0, v[2] = v[2] != 0;
    return ck_model_node_set_ints(mn, v, 3);
}

/* Resize (opset 11 on): X, roi, scales, sizes; one of scales and sizes a
 * constant. Modes nearest, linear, cubic; coordinate modes half_pixel,
 * pytorch_half_pixel, align_corners, asymmetric; the rest refused by name. */
static int map_resize(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                      struct ck_model_node *mn)
{
    static const char *const modes[] = {"nearest", "linear", "cubic"};
    static const char *const coords[] = {"half_pixel", "pytorch_half_pixel", "align_corners",
                                         "asymmetric"};
    static const char *const nears[] = {"round_prefer_floor", "round_prefer_ceil", "floor",
                                        "ceil"};
    const char *const *tables[] = {modes, coords, nears};
    const char *keys[] = {"mode", "coordinate_transformation_mode", "nearest_mode"};
    const char *defs[] = {"nearest", "half_pixel", "round_prefer_floor"};
    int64_t v[4 + 2 * RANK_MAX], excl = 0, anti = 0;
    size_t counts[] = {3, 4, 4};
    struct val *x = NULL, *sc = NULL, *sz = NULL;
    int err = 0;
    (void)row;
    if (c->opset < 11)
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (Resize): Resize before opset 11 is not "
                        "supported", c->path, n->name);
    for (int i = 0; i < 3; i++) {
        const char *a = attr(n, keys[i]);
        a = a ? a : defs[i];
        size_t k = 0;
        while (k < counts[i] && strcmp(a, tables[i][k]))
            k++;
        if (k == counts[i])
            return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (Resize): %s '%s' is not supported",
                            c->path, n->name, keys[i], a);
        v[i] = (int64_t)k;
    }
    if (attr(n, "axes") || (attr(n, "keep_aspect_ratio_policy") &&
                            strcmp(attr(n, "keep_aspect_ratio_policy"), "stretch")))
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (Resize): axes and "
                        "keep_aspect_ratio_policy are not supported", c->path, n->name);
    if ((err = attr_int(c, n, "exclude_outside", 0, &excl)) < 0 ||
        (err = attr_int(c, n, "antialias", 0, &anti)) < 0 ||
        (err = attr_float(c, n, "cubic_coeff_a", -0.75f, &mn->p.alpha)) < 0)
        return err;
    if (anti)
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (Resize): antialias is not supported",
                        c->path, n->name);
    v[3] = excl != 0;
    if ((err = input(c, n, 0, &x)) < 0 ||
        (has_input(n, 2) && (err = input(c, n, 2, &sc)) < 0) ||
        (has_input(n, 3) && (err = input(c, n, 3, &sz)) < 0))
        return err;
    if (sc && sc->is_const && sc->cn == 0)
        sc = NULL; /* an empty scales: the sizes count */
    bool late_sc = sc && !sc->is_const && (sc->is_input || computed(sc)) && !sc->is_int;
    bool late_sz = !sc && sz && computed_param(sz);
    if ((late_sc || late_sz) && x->rank >= 0 && x->rank <= RANK_MAX) {
        /* given per run: -1 marks what the input gives (docs/model.md) */
        for (int i = 0; i < x->rank; i++)
            v[4 + 2 * i] = late_sz ? -1 : 0, v[5 + 2 * i] = late_sc ? -1 : 0;
        if ((err = ck_model_node_set_ints(mn, v, 4 + 2 * (size_t)x->rank)) < 0)
            return err;
        return ck_model_node_add_input(mn, late_sc ? sc->name : sz->name);
    }
    struct val *use = sc ? sc : sz;
    if (!use || !use->is_const || (sc && sz && sz->is_const && sz->cn))
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (Resize): needs one of scales and sizes, "
                        "as a constant", c->path, n->name);
    if (use->cn > RANK_MAX || (x->rank >= 0 && use->cn != (size_t)x->rank))
        return ck_error(CK_EFORMAT, "'%s': node '%s' (Resize): %zu %s for an input of rank %d",
                        c->path, n->name, use->cn, sc ? "scales" : "sizes", x->rank);
    for (size_t i = 0; i < use->cn; i++) {
        if (sc) {
            float s = (float)sc->c[i];
            uint32_t b = 0;
            if (!(s > 0 && s <= 1e6f))
                return ck_error(CK_EFORMAT, "'%s': node '%s' (Resize): scale %g is out of range",
                                c->path, n->name, (double)s);
            memcpy(&b, &s, 4);
            v[4 + 2 * i] = 0, v[5 + 2 * i] = (int64_t)b;
        } else {
            if (!ck_dim_from_double(sz->c[i], &v[4 + 2 * i]) || v[4 + 2 * i] < 0)
                return ck_error(CK_EFORMAT, "'%s': node '%s' (Resize): size %g is not a size",
                                c->path, n->name, sz->c[i]);
            v[5 + 2 * i] = 0;
        }
    }
    return ck_model_node_set_ints(mn, v, 4 + 2 * use->cn);
}

/* ---- Einsum: one or two operands, lowered to reduce_sum, transpose,
 * reshape and matmul (static shapes; no ellipsis, no repeated label in one
 * operand: a diagonal) ---- */

struct es_op {
    const char *name; /* the current value */
    char lab[RANK_MAX + 1];
    int64_t dim[RANK_MAX];
    int rank;
};

static int es_refuse(struct cx *c, const struct ck_graph_node *n, const char *why)
{
    return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (Einsum): %s", c->path, n->name, why);
}

/* One node on v: its output becomes v's value. */
static int es_node(struct cx *c, const struct ck_graph_node *n, enum ck_op op, struct es_op *v,
                   const int64_t *ints, size_t nints, const char *to)
{
    struct ck_model_node *mn = NULL;
    const char *out = to ? to : tmp_name(c, n, ck_op_name(op));
    int err = 0;
    if (!out)
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = emit(c, n->name, op, &v->name, 1, &out, 1, &mn)) < 0 ||
        (err = ck_model_node_set_ints(mn, ints, nints)) < 0)
        return err;
    v->name = out;
    return 0;
}

/* Sums the labels of v that keep is not holding; then orders v by order. */
static int es_sum_out(struct cx *c, const struct ck_graph_node *n, struct es_op *v,
                      const char *keep)
{
    int64_t axes[RANK_MAX];
    size_t na = 0;
    int r = 0;
    for (int i = 0; i < v->rank; i++)
        if (!strchr(keep, v->lab[i]))
            axes[na++] = i;
        else
            v->lab[r] = v->lab[i], v->dim[r++] = v->dim[i];
    if (!na)
        return 0;
    v->rank = r;
    v->lab[r] = 0;
    int err = es_node(c, n, CK_OP_REDUCE_SUM, v, axes, na, NULL);
    if (err < 0)
        return err;
    c->m->nodes[c->m->nnodes - 1].p.keepdims = false;
    return 0;
}

static int es_order(struct cx *c, const struct ck_graph_node *n, struct es_op *v,
                    const char *order, const char *to)
{
    int64_t perm[RANK_MAX], d[RANK_MAX];
    bool moved = false;
    for (int i = 0; i < v->rank; i++) {
        perm[i] = strchr(v->lab, order[i]) - v->lab;
        d[i] = v->dim[perm[i]];
        moved = moved || perm[i] != i;
    }
    struct val *y = NULL;
    int err = 0;
    if (to && ((err = get(c, to, &y)) < 0))
        return err;
    if (y) /* the Einsum's output: its shape for the nodes after it */
        set_shape(y, v->rank, d);
    if (!moved)
        return to ? es_node(c, n, CK_OP_IDENTITY, v, NULL, 0, to) : 0;
    memcpy(v->lab, order, (size_t)v->rank);
    memcpy(v->dim, d, sizeof(int64_t) * (size_t)v->rank);
    return es_node(c, n, CK_OP_TRANSPOSE, v, perm, (size_t)v->rank, to);
}

static int64_t es_prod(const struct es_op *v, int from, int to)
{
    int64_t p = 1;
    for (int i = from; i < to; i++)
        p *= v->dim[i]; /* each dim checked under 2^40 with the total */
    return p;
}

static int map_einsum(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                      struct ck_model_node *mn)
{
    const char *eq = attr(n, "equation");
    char buf[64], term[3][RANK_MAX + 1];
    size_t bl = 0;
    int nterm = 1, k = 0, err = 0;
    (void)row;
    (void)mn;
    if (!eq)
        return bad_attr(c, n, "equation");
    for (const char *p = eq; *p; p++)
        if (*p != ' ') {
            if (bl + 1 >= sizeof buf)
                return bad_attr(c, n, "equation");
            buf[bl++] = *p;
        }
    buf[bl] = 0;
    if (strchr(buf, '.'))
        return es_refuse(c, n, "an ellipsis ('...') is not supported");
    char *arrow = strstr(buf, "->");
    if (arrow)
        *arrow = 0;
    memset(term, 0, sizeof term);
    for (char *p = buf; *p; p++) {
        if (*p == ',') {
            if (++nterm > 2)
                return es_refuse(c, n, "more than two operands are not supported");
            k = 0;
            continue;
        }
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')) || k >= RANK_MAX)
            return bad_attr(c, n, "equation");
        if (strchr(term[nterm - 1], *p))
            return es_refuse(c, n, "a label repeated in one operand (a diagonal) is not supported");
        term[nterm - 1][k++] = *p;
    }
    if ((size_t)nterm != n->ninputs)
        return bad_attr(c, n, "equation");
    /* the output's labels: given, or those that occur once, sorted */
    char out[RANK_MAX + 1] = {0};
    k = 0;
    if (arrow) {
        for (char *p = arrow + 2; *p; p++) {
            if (k >= RANK_MAX || strchr(out, *p) || !((*p >= 'a' && *p <= 'z') ||
                                                      (*p >= 'A' && *p <= 'Z')) ||
                !(strchr(term[0], *p) || strchr(term[1], *p)))
                return bad_attr(c, n, "equation");
            out[k++] = *p;
        }
    } else {
        for (int ch = 'A'; ch <= 'z'; ch++)
            if (ch < 'a' && ch > 'Z')
                continue;
            else if ((strchr(term[0], ch) != NULL) + (strchr(term[1], ch) != NULL) == 1 &&
                     k < RANK_MAX)
                out[k++] = (char)ch;
    }
    struct es_op v[2];
    for (int t = 0; t < nterm; t++) {
        struct val *x = NULL;
        if ((err = input(c, n, (size_t)t, &x)) < 0)
            return err;
        if (x->rank != (int)strlen(term[t]))
            return x->rank < 0 ? es_refuse(c, n, "needs static input shapes")
                               : bad_attr(c, n, "equation");
        v[t].name = n->inputs[t];
        v[t].rank = x->rank;
        memcpy(v[t].lab, term[t], sizeof v[t].lab);
        for (int i = 0; i < x->rank; i++) {
            if (x->dims[i] < 1 || x->dims[i] > (INT64_C(1) << 40))
                return es_refuse(c, n, "needs static input shapes, every dimension at least 1");
            v[t].dim[i] = x->dims[i];
        }
    }
    int64_t total = 0;
    if (!ck_dims_prod(v[0].dim, 0, v[0].rank, &total) ||
        (nterm == 2 && !ck_dims_prod(v[1].dim, 0, v[1].rank, &total)))
        return es_refuse(c, n, "an operand is too large");
    const char *y = n->outputs[0];
    if (nterm == 1) {
        if ((err = es_sum_out(c, n, &v[0], out)) < 0)
            return err;
        return es_order(c, n, &v[0], out, y);
    }
    /* labels kept by each operand: those of the output or of the other one */
    for (int t = 0; t < 2; t++) {
        char keep[2 * RANK_MAX + 1];
        snprintf(keep, sizeof keep, "%s%s", out, term[1 - t]);
        if ((err = es_sum_out(c, n, &v[t], keep)) < 0)
            return err;
    }
    char bat[RANK_MAX + 1] = {0}, lef[RANK_MAX + 1] = {0}, rig[RANK_MAX + 1] = {0},
         con[RANK_MAX + 1] = {0}, ord[2][3 * RANK_MAX + 1], fin[3 * RANK_MAX + 1];
    int nb = 0, nl = 0, nr = 0, nc = 0;
    for (int i = 0; i < v[0].rank; i++) {
        char l = v[0].lab[i];
        const char *in1 = strchr(v[1].lab, l);
        if (in1 && v[1].dim[in1 - v[1].lab] != v[0].dim[i])
            return ck_error(CK_EFORMAT, "'%s': node '%s' (Einsum): label '%c' has sizes %lld and "
                            "%lld", c->path, n->name, l, (long long)v[0].dim[i],
                            (long long)v[1].dim[in1 - v[1].lab]);
        if (in1 && strchr(out, l))
            bat[nb++] = l;
        else if (in1)
            con[nc++] = l;
        else
            lef[nl++] = l;
    }
    for (int i = 0; i < v[1].rank; i++)
        if (!strchr(v[0].lab, v[1].lab[i]))
            rig[nr++] = v[1].lab[i];
    snprintf(ord[0], sizeof ord[0], "%s%s%s", bat, lef, con);
    snprintf(ord[1], sizeof ord[1], "%s%s%s", bat, con, rig);
    if ((err = es_order(c, n, &v[0], ord[0], NULL)) < 0 ||
        (err = es_order(c, n, &v[1], ord[1], NULL)) < 0)
        return err;
    int64_t B = es_prod(&v[0], 0, nb), L = es_prod(&v[0], nb, nb + nl),
            K = es_prod(&v[0], nb + nl, v[0].rank), R = es_prod(&v[1], nb + nc, v[1].rank);
    int64_t sa[3] = {B, L, K}, sb[3] = {B, K, R};
    if ((err = es_node(c, n, CK_OP_RESHAPE, &v[0], sa, 3, NULL)) < 0 ||
        (err = es_node(c, n, CK_OP_RESHAPE, &v[1], sb, 3, NULL)) < 0)
        return err;
    const char *ab[2] = {v[0].name, v[1].name}, *prod = tmp_name(c, n, "matmul");
    struct ck_model_node *m2 = NULL;
    if (!prod)
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = emit(c, n->name, CK_OP_MATMUL, ab, 2, &prod, 1, &m2)) < 0)
        return err;
    /* [B, L, R] back to the batch, left and right labels, then the output's order */
    struct es_op r = {.name = prod, .rank = 0};
    int64_t shape[RANK_MAX];
    snprintf(fin, sizeof fin, "%s%s%s", bat, lef, rig);
    for (int i = 0; fin[i]; i++) {
        const char *p0 = strchr(v[0].lab, fin[i]);
        r.dim[r.rank] = p0 ? v[0].dim[p0 - v[0].lab] : v[1].dim[strchr(v[1].lab, fin[i]) -
                                                                 v[1].lab];
        shape[r.rank] = r.dim[r.rank];
        r.lab[r.rank++] = fin[i];
    }
    if ((err = es_node(c, n, CK_OP_RESHAPE, &r, shape, (size_t)r.rank, NULL)) < 0)
        return err;
    return es_order(c, n, &r, out, y);
}

static const struct row *find_row(const char *op)
{
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (!strcmp(rows[i].onnx, op))
            return &rows[i];
    return NULL;
}

/* Ops that move values without computing on them: exact on the integers
 * float32 holds (up to 2^24), so integer tensors may pass through them. */
static bool moves_only(enum ck_op op)
{
    switch (op) {
    case CK_OP_IDENTITY:
    case CK_OP_RESHAPE:
    case CK_OP_FLATTEN:
    case CK_OP_TRANSPOSE:
    case CK_OP_CONCAT:
    case CK_OP_SPLIT:
    case CK_OP_SLICE:
    case CK_OP_SQUEEZE:
    case CK_OP_UNSQUEEZE:
    case CK_OP_PAD:
    case CK_OP_GATHER:
    case CK_OP_EXPAND:
    case CK_OP_TILE:
    case CK_OP_TRILU:
    case CK_OP_GATHER_ELEMENTS:
        return true;
    default:
        return false;
    }
}

/* The ops the engine computes exactly on integers: its integer kernels
 * (infer/kernels_int.c: division truncates, Mod's two forms, the type's
 * width wraps) and the ops exact on whole float32 numbers (clip to whole
 * bounds, sign, relu, max pooling; the comparisons give masks). */
static bool int_ok(enum ck_op op)
{
    switch (op) {
    case CK_OP_ADD: case CK_OP_SUB: case CK_OP_MUL: case CK_OP_DIV: case CK_OP_FMOD:
    case CK_OP_NEG: case CK_OP_ABS: case CK_OP_MAX: case CK_OP_MIN: case CK_OP_REDUCE_SUM:
    case CK_OP_REDUCE_MAX: case CK_OP_REDUCE_MIN: case CK_OP_REDUCE_PROD: case CK_OP_CLIP:
    case CK_OP_SIGN: case CK_OP_RELU: case CK_OP_EQUAL: case CK_OP_LESS: case CK_OP_GREATER:
    case CK_OP_LESS_EQUAL: case CK_OP_GREATER_EQUAL: case CK_OP_POW: case CK_OP_MAXPOOL:
    case CK_OP_GLOBAL_MAXPOOL:
        return true;
    default:
        return false;
    }
}

/* The engine holds integers as whole float32 numbers: any other op on an
 * integer tensor (ONNX's Div of two uint8 tensors truncates: 7/2 is 3, not
 * 3.5; a Pow, a mean) would be a wrong answer, so it is refused by name.
 * Which values are integers follows from the graph's inputs and weights
 * through the ops that only move values, the integer ops (int_ok) and Cast. */
static int check_integers(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                          struct val **out)
{
    bool is_int = false, is_mask = false;
    bool masks = row->op >= CK_OP_WHERE && row->op <= CK_OP_XOR; /* bool is their type */
    /* shape values: integers the engine computes exactly (fold set their flags);
     * the shape of any tensor, a constant or a range of a shape value */
    if ((n->noutputs == 1 && out[0] && out[0]->is_shape) || row->op == CK_OP_SHAPE ||
        row->op == CK_OP_SIZE || row->op == CK_OP_CONSTANT_OF_SHAPE || row->op == CK_OP_RANGE)
        return 0;
    bool is_cast = !strcmp(n->op, "Cast") || !strcmp(n->op, "CastLike");
    bool f64 = false, half = false;
    for (size_t i = 0; i < n->ninputs; i++) {
        struct val *x = has_input(n, i) ? find(c, n->inputs[i]) : NULL;
        f64 = f64 || (x && x->is_f64);
        half = half || (x && x->is_half);
    }
    if (is_cast) { /* what the cast gives: map_cast and map_castlike set the node */
        int64_t to = 1;
        const char *t = has_input(n, 1) ? graph_attr(c->g, "dtype.", n->inputs[1]) : NULL;
        const struct ck_tensor *w = has_input(n, 1) ? ck_tensor_set_find(c->m->weights, n->inputs[1])
                                                    : NULL;
        enum ck_dtype dt = CK_DT_INVALID;
        if (!strcmp(n->op, "Cast"))
            dt = attr_int(c, n, "to", 1, &to) < 0 ? CK_DT_INVALID : ck_op_cast_dtype(to);
        else
            dt = w ? w->dtype : t ? ck_dtype_from_name(t) : CK_DT_INVALID;
        struct val *x = has_input(n, 0) ? find(c, n->inputs[0]) : NULL;
        is_int = is_int_dtype(dt);
        is_mask = dt == CK_DT_BOOL || (dt == CK_DT_INVALID && x && x->is_mask);
        f64 = dt == CK_DT_F64;
        half = dt == CK_DT_F16 || dt == CK_DT_BF16;
    } else if (moves_only(row->op)) {
        struct val *x = has_input(n, 0) ? find(c, n->inputs[0]) : NULL;
        is_int = x && x->is_int;
        is_mask = is_int && x->is_mask;
    } else if (row->op == CK_OP_WHERE) { /* moves a or b: an integer stays one */
        for (size_t i = 1; i < 3; i++) {
            struct val *x = has_input(n, i) ? find(c, n->inputs[i]) : NULL;
            is_int = is_int || (x && x->is_int);
        }
    } else {
        is_int = is_mask = masks; /* a comparison's or a logical op's bool */
        is_int = is_int || row->op == CK_OP_ARGMAX || row->op == CK_OP_ARGMIN; /* indices */
        if (row->op == CK_OP_TOPK && n->noutputs == 2 && out[1] && !out[1]->is_const)
            out[1]->is_int = true; /* its indices; the values are x's type */
        /* TopK's K and a reduction's axes are parameters (constants), not data */
        /* Pow's type is its base's: an integer exponent of a float is data of a float op */
        size_t ndata = row->op == CK_OP_TOPK || row->op == CK_OP_POW ||
                               row->op == CK_OP_CUMSUM || ck_op_is_reduce(row->op)
                           ? 1
                       : row->ndata > 0 ? (size_t)row->ndata
                                        : n->ninputs; /* not parameters */
        for (size_t i = 0; i < ndata && i < n->ninputs; i++) {
            struct val *x = has_input(n, i) ? find(c, n->inputs[i]) : NULL;
            if (x && x->is_int && !x->is_mask && int_ok(row->op))
                is_int = true; /* an integer op's result, or a comparison's mask */
            else if (x && x->is_int && !x->is_const && !(masks && x->is_mask))
                return ck_error(CK_EUNSUPPORTED,
                                "'%s': node '%s' (%s): input '%s' is an integer tensor, and "
                                "ckptd computes in float32: integer arithmetic is not supported",
                                c->path, n->name, n->op, x->name);
        }
    }
    if (is_int || is_mask) /* an integer or a bool is neither float64 nor a half */
        f64 = half = false;
    for (size_t i = 0; i < n->noutputs; i++)
        if (out[i] && !out[i]->is_const && !(row->op == CK_OP_TOPK && i == 1)) {
            out[i]->is_int = is_int;
            out[i]->is_mask = is_mask;
            out[i]->is_f64 = f64;
            out[i]->is_half = half;
        }
    return 0;
}

static int map_outputs(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                       struct val **out);
/* 1-D MaxPool / AveragePool on [N, C, L]: unsqueeze to [N, C, 1, L], the
 * 2-D pool with a [1, k] window, squeeze the axis back. */
static int map_pool1d(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                      int64_t kernel)
{
    int64_t v[RANK_MAX], ceil = 0, cip = 0, axis = 2;
    size_t k = 0;
    struct val *x = NULL;
    struct ck_model_node *mn = NULL;
    int err = 0;
    const char *pad = attr(n, "auto_pad");
    if (pad && strcmp(pad, "NOTSET") && strcmp(pad, "VALID"))
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (%s): auto_pad '%s' is not supported",
                        c->path, n->name, n->op, pad);
    if ((err = input(c, n, 0, &x)) < 0)
        return err;
    if (x->rank != 3)
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (%s): 1-D pooling needs [N, C, L]",
                        c->path, n->name, n->op);
    struct ck_op_params p;
    ck_op_params_init(&p);
    p.kernel[0] = 1, p.kernel[1] = kernel;
    if ((err = attr_ints(c, n, "strides", v, RANK_MAX, &k)) < 0)
        return err;
    if (k == 1)
        p.stride[1] = v[0];
    else if (k != SIZE_MAX)
        return bad_attr(c, n, "strides");
    if ((err = attr_ints(c, n, "dilations", v, RANK_MAX, &k)) < 0)
        return err;
    if (k != SIZE_MAX && (k != 1 || v[0] != 1))
        return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (%s): dilated pooling is not supported",
                        c->path, n->name, n->op);
    if ((err = attr_ints(c, n, "pads", v, RANK_MAX, &k)) < 0)
        return err;
    if (k == 2)
        p.pad[1] = v[0], p.pad[3] = v[1];
    else if (k != SIZE_MAX)
        return bad_attr(c, n, "pads");
    if ((err = attr_int(c, n, "ceil_mode", 0, &ceil)) < 0 ||
        (err = attr_int(c, n, "count_include_pad", 0, &cip)) < 0)
        return err;
    p.ceil_mode = ceil;
    p.count_include_pad = cip;
    const char *in = n->inputs[0], *u = tmp_name(c, n, "as_2d"), *q = tmp_name(c, n, "pooled");
    const char *y = n->outputs[0];
    if (!u || !q)
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = emit(c, n->name, CK_OP_UNSQUEEZE, &in, 1, &u, 1, &mn)) < 0 ||
        (err = ck_model_node_set_ints(mn, &axis, 1)) < 0 ||
        (err = emit(c, n->name, row->op, &u, 1, &q, 1, &mn)) < 0)
        return err;
    int64_t *keep = mn->p.ints;
    size_t nkeep = mn->p.nints;
    mn->p = p;
    mn->p.ints = keep, mn->p.nints = nkeep;
    if ((err = emit(c, n->name, CK_OP_SQUEEZE, &q, 1, &y, 1, &mn)) < 0)
        return err;
    return ck_model_node_set_ints(mn, &axis, 1);
}

static int map_node(struct cx *c, const struct ck_graph_node *n)
{
    const struct row *row = find_row(n->op);
    int err = 0;
    if (!row) /* ck_onnx_to_model named every unmapped op before this */
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s': ONNX op '%s' has no mapping in ckptd's "
                        "operation vocabulary",
                        c->path, n->name, n->op);
    if ((err = ck_graph_node_check_arity(n, &row->arity, c->path)) < 0)
        return err;
    /* outputs ONNX allows and the mapping does not compute (MaxPool's
     * Indices, Dropout's mask, BatchNormalization's running statistics) */
    for (size_t i = 1; !ck_op_is_multi_output(row->op) && row->op != CK_OP_LAYERNORM &&
                       i < n->noutputs;
         i++)
        if (n->outputs[i][0])
            return ck_error(CK_EUNSUPPORTED, "'%s': node '%s' (%s): output %zu ('%s') is not supported",
                            c->path, n->name, n->op, i, n->outputs[i]);
    /* as many outputs as the node has (a split into dozens), at least RANK_MAX */
    struct val **out = calloc(n->noutputs > RANK_MAX ? n->noutputs : RANK_MAX, sizeof *out);
    if (!out)
        return ck_error(CK_ENOMEM, "out of memory");
    err = map_outputs(c, n, row, out);
    free(out);
    return err;
}

static int map_outputs(struct cx *c, const struct ck_graph_node *n, const struct row *row,
                       struct val **out)
{
    struct ck_model_node *mn = NULL;
    int err = 0;
    for (size_t i = 0; i < n->noutputs; i++)
        if ((err = get(c, n->outputs[i], &out[i])) < 0)
            return err;
    if ((err = infer(c, n, out)) < 0 || (err = fold(c, n, out)) != 0)
        return err < 0 ? err : 0;
    if (row->op == CK_OP_INVALID)
        return ck_error(CK_EUNSUPPORTED,
                        "'%s': node '%s' (%s): its inputs are not constants, and ckptd computes "
                        "%s only when folding shapes",
                        c->path, n->name, n->op, n->op);
    if ((err = check_integers(c, n, row, out)) < 0)
        return err;
    if (row->op == CK_OP_MAXPOOL || row->op == CK_OP_AVGPOOL) {
        int64_t ks[RANK_MAX];
        size_t nk = 0;
        if ((err = attr_ints(c, n, "kernel_shape", ks, RANK_MAX, &nk)) < 0)
            return err;
        if (nk == 1)
            return map_pool1d(c, n, row, ks[0]);
    }
    if (row->ndata == 0) /* the row emits its own nodes */
        return row->map(c, n, row, NULL);
    size_t nin = row->ndata < 0 ? n->ninputs : (size_t)row->ndata;
    const char **in = calloc(nin ? nin : 1, sizeof *in);
    size_t k = 0;
    if (!in)
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < nin && i < n->ninputs; i++)
        if (has_input(n, i))
            in[k++] = n->inputs[i];
    size_t nout = row->op == CK_OP_SPLIT || row->op == CK_OP_TOPK ? n->noutputs : 1;
    err = emit(c, n->name, row->op, in, k, (const char *const *)n->outputs, nout, &mn);
    free(in);
    if (err < 0)
        return err;
    return row->map ? row->map(c, n, row, mn) : 0;
}

/* Before anything is mapped: every op of the graph that has no row, named
 * together (an LSTM is reported as the LSTM, not as the first helper node
 * the exporter put before it). */
static int check_ops(struct cx *c)
{
    char names[1024];
    size_t used = 0, missing = 0;
    names[0] = 0;
    for (size_t i = 0; i < c->g->nnodes; i++) {
        const char *op = c->g->nodes[i].op;
        bool seen = false;
        if (find_row(op))
            continue;
        for (size_t j = 0; j < i && !seen; j++)
            seen = !strcmp(c->g->nodes[j].op, op);
        if (seen)
            continue;
        missing++;
        if (used < sizeof names - 1)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s'%s' (node '%s')",
                                     missing > 1 ? ", " : "", op, c->g->nodes[i].name);
    }
    if (!missing)
        return 0;
    if (used >= sizeof names - 1)
        snprintf(names + sizeof names - 5, 5, "...");
    return ck_error(CK_EUNSUPPORTED,
                    "'%s': %zu ONNX op%s without a mapping in ckptd's operation vocabulary: %s",
                    c->path, missing, missing > 1 ? "s" : "", names);
}

/* "2,5,8" -> dims */
static int parse_shape(const char *s, int64_t *dims, int *rank)
{
    char *end = NULL;
    *rank = 0;
    while (s && *s) {
        if (*rank == CK_TENSOR_MAX_RANK)
            return -1;
        dims[(*rank)++] = strtoll(s, &end, 10);
        s = *end == ',' ? end + 1 : end;
        if (end == s && *s)
            return -1;
    }
    return 0;
}

static const char *graph_attr(const struct ck_graph *g, const char *prefix, const char *name)
{
    size_t pl = strlen(prefix);
    for (size_t i = 0; i < g->nattrs; i++)
        if (!strncmp(g->attrs[i].key, prefix, pl) && !strcmp(g->attrs[i].key + pl, name))
            return g->attrs[i].value;
    return NULL;
}

static int add_io(struct cx *c, bool output, const char *name)
{
    int64_t dims[CK_TENSOR_MAX_RANK];
    int rank = 0;
    struct val *v = find(c, name);
    const char *shape = graph_attr(c->g, "shape.", name), *dt = graph_attr(c->g, "dtype.", name);
    enum ck_dtype dtype = dt ? ck_dtype_from_name(dt) : CK_DT_F32;
    if (output && v && v->rank >= 0) {
        rank = v->rank;
        memcpy(dims, v->dims, sizeof(int64_t) * (size_t)rank);
    } else if (!shape || parse_shape(shape, dims, &rank) < 0) {
        if (!output)
            return ck_error(CK_EFORMAT, "'%s': graph input '%s' declares no shape", c->path, name);
    }
    if (!output) {
        struct val *in = NULL;
        int err = get(c, name, &in);
        if (err < 0)
            return err;
        set_shape(in, rank, dims);
        in->is_int = is_int_dtype(dtype);
        in->is_mask = dtype == CK_DT_BOOL;
        in->is_f64 = dtype == CK_DT_F64;
        in->is_half = dtype == CK_DT_F16 || dtype == CK_DT_BF16;
        in->is_input = true;
        in->int_input = in->is_int && !in->is_mask;
        for (int i = 0; i < rank && i < RANK_MAX; i++)
            if (dims[i] < 0)
                in->dims[i] = -1;
    }
    return ck_model_add_io(c->m, output, name, dtype == CK_DT_INVALID ? CK_DT_F32 : dtype, rank,
                           dims);
}

/* A graph output that folded into a constant (a Shape or Size of static
 * shapes): its values as a float32 weight "NAME/value" and an identity node
 * that gives the output, so the engine produces it like any other. */
static int const_output(struct cx *c, const char *name)
{
    struct val *v = find(c, name), *w = NULL;
    struct ck_model_node *mn = NULL;
    char buf[4200];
    int err = 0;
    if (!v || !v->is_const || v->is_weight || v->folded_weight)
        return 0;
    snprintf(buf, sizeof buf, "%s/value", name);
    const char *wn = ck_tensor_set_strdup(c->m->weights, buf, strlen(buf));
    if (!wn || (err = get(c, wn, &w)) < 0)
        return err ? err : ck_error(CK_ENOMEM, "out of memory");
    if ((err = set_const(w, v->cn, v->is_int)) < 0)
        return err;
    memcpy(w->c, v->c, v->cn * sizeof *v->c);
    set_shape(w, v->rank < 0 ? 1 : v->rank, v->dims);
    if (v->rank < 0)
        w->dims[0] = (int64_t)v->cn;
    v->is_const = false; /* now the identity's output */
    return emit(c, name, CK_OP_IDENTITY, &wn, 1, &name, 1, &mn);
}

int ck_onnx_to_model(struct ck_tensor_set *s, struct ck_model **out)
{
    struct cx c;
    int err = 0;
    *out = NULL;
    memset(&c, 0, sizeof c);
    c.path = s->path;
    c.g = s->graph;
    if (!c.g) {
        err = ck_error(CK_EFORMAT, "'%s': no graph", s->path);
        ck_tensor_set_free(s);
        return err;
    }
    c.opset = 13;
    for (size_t i = 0; i < s->nmeta; i++)
        if (!strcmp(s->meta[i].key, "opset.ai.onnx"))
            c.opset = strtoll(s->meta[i].value, NULL, 10);
    if ((err = ck_model_new(s, "onnx", &c.m)) < 0)
        return err;
    if (c.g->name && !(c.m->name = strdup(c.g->name))) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    if ((err = add_weights(&c)) < 0)
        goto out;
    for (size_t i = 0; i < c.g->ninputs; i++)
        if ((err = add_io(&c, false, c.g->inputs[i])) < 0)
            goto out;
    if ((err = check_ops(&c)) < 0)
        goto out;
    for (size_t i = 0; i < c.g->nnodes; i++)
        if ((err = map_node(&c, &c.g->nodes[i])) < 0)
            goto out;
    for (size_t i = 0; i < c.g->noutputs; i++)
        if ((err = const_output(&c, c.g->outputs[i])) < 0 ||
            (err = add_io(&c, true, c.g->outputs[i])) < 0)
            goto out;
    if (!c.m->ninputs) {
        err = ck_error(CK_EUNSUPPORTED,
                       "'%s': the graph has no input: ckptd verifies a model on inputs", c.path);
        goto out;
    }
    if ((err = ck_model_check(c.m)) < 0) {
        ck_error_wrap(err, "'%s'", c.path);
        goto out;
    }
    *out = c.m;
    c.m = NULL;
out:
    for (size_t i = 0; i < c.cap; i++)
        free(c.v[i].c);
    free(c.v);
    ck_model_free(c.m);
    return err;
}

/* ---- an ONNX file as the graph of a weight-only checkpoint ---- */

/* The checkpoint's tensor for initializer t: the same name, or the one
 * tensor whose name ends in ".NAME" (a state dict saved inside a training
 * checkpoint: "model.fc1.weight" for "fc1.weight"). */
static int match(struct ck_tensor_set *w, const struct ck_tensor *t, const char *onnx_path,
                 const struct ck_tensor **out)
{
    size_t nl = strlen(t->name);
    *out = ck_tensor_set_find(w, t->name);
    for (size_t i = 0; !*out && i < w->ntensors; i++) {
        const char *n = w->tensors[i].name;
        size_t l = strlen(n);
        if (l > nl && n[l - nl - 1] == '.' && !strcmp(n + l - nl, t->name)) {
            if (*out)
                return ck_error(CK_EFORMAT,
                                "'%s': initializer '%s' of '%s' matches both '%s' "
                                "and '%s'",
                                w->path, t->name, onnx_path, (*out)->name, n);
            *out = &w->tensors[i];
        }
    }
    if (!*out)
        return ck_error(CK_EFORMAT, "'%s': initializer '%s' of '%s' is not in the checkpoint",
                        w->path, t->name, onnx_path);
    const struct ck_tensor *m = *out;
    bool same = m->rank == t->rank;
    for (int d = 0; same && d < t->rank; d++)
        same = m->dims[d] == t->dims[d];
    if (!same)
        return ck_error(CK_EFORMAT,
                        "'%s': tensor '%s' does not have the shape of initializer "
                        "'%s' of '%s'",
                        w->path, m->name, t->name, onnx_path);
    return 0;
}

int ck_onnx_graph_for(struct ck_tensor_set *w, const char *onnx_path, struct ck_model **out)
{
    struct ck_tensor_set *g = NULL;
    int err = 0;
    *out = NULL;
    if ((err = ck_reader_onnx.open(onnx_path, &g)) < 0)
        goto fail;
    for (size_t i = 0; i < g->ntensors; i++) {
        struct ck_tensor t = g->tensors[i];
        const struct ck_tensor *m = NULL;
        if (t.role && !strcmp(t.role, "constant")) {
            /* the exporter's constants travel with the graph: copied */
            void *data;
            if (ck_tensor_set_find(w, t.name)) {
                err = ck_error(CK_EFORMAT, "'%s': tensor '%s' has the name of a constant of '%s'",
                               w->path, t.name, onnx_path);
                goto fail;
            }
            if (t.dtype == CK_DT_STRING || !t.data)
                continue;
            if ((err = ck_tensor_set_alloc(w, t.nbytes ? t.nbytes : 1, &data)) < 0)
                goto fail;
            memcpy(data, t.data, t.nbytes);
            t.data = data;
            t.raw = NULL;
            if ((err = ck_tensor_set_add(w, &t, NULL)) < 0)
                goto fail;
            continue;
        }
        if ((err = match(w, &t, onnx_path, &m)) < 0)
            goto fail;
        if (strcmp(m->name, t.name)) { /* matched by suffix: also known by the graph's name */
            struct ck_tensor alias = *m;
            alias.name = t.name;
            if ((err = ck_tensor_set_add(w, &alias, NULL)) < 0)
                goto fail;
        }
    }
    ck_graph_free(w->graph);
    w->graph = g->graph;
    g->graph = NULL;
    for (size_t i = 0; i < g->nmeta; i++)
        if (!strncmp(g->meta[i].key, "opset.", 6) &&
            (err = ck_tensor_set_add_meta(w, g->meta[i].key, g->meta[i].value)) < 0)
            goto fail;
    ck_tensor_set_free(g);
    return ck_onnx_to_model(w, out);
fail:
    ck_tensor_set_free(g);
    ck_tensor_set_free(w);
    return err;
}
