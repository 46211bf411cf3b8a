/* NNabla: .nnp archives (a zip of nnp_version.txt, network.nntxt and
 * parameter.protobuf or parameter.h5), or one of those files alone.
 * Facts: specs/FORMAT-FACTS.md section 4.
 *
 * What becomes what:
 * - every parameter (parameter.protobuf, parameter.h5, or "parameter" entries
 *   of a text file) is a float32 tensor with role "parameter", in file order
 *   (the index attribute's order for HDF5); need_grad becomes the meta entry
 *   "need_grad:<name>";
 * - the network that the first executor names (else the first network) is
 *   the graph: its functions are the nodes (op = function type), their
 *   *_param fields node attributes as text (a Shape as "[a,b]", a repeated
 *   field as "[a,b]", nested messages as "outer.inner"); batch_size a graph
 *   attribute; the executor's data and output variables the graph inputs and
 *   outputs;
 * - network variables without data are tensors with data NULL (role
 *   "buffer", or "parameter" when the file declares one without its values),
 *   with the declared dims (-1 for the batch dimension);
 * - a parameter whose declared shape differs from its data's shape, a data
 *   count that is not the product of the shape, a function naming a variable
 *   the network does not declare: each is an error naming the file and
 *   tensor;
 * - solver states ("*_optimizer.h5.optimizer", see "solver states" below)
 *   are tensors "<parameter>/updater/<state>" with role "updater". */
#include "readers/reader.h"

#include "common/buf.h"
#include "common/error.h"
#include "readers/h5param.h"
#include "readers/nameidx.h"
#include "readers/nnp_model.h"
#include "readers/nntxt.h"
#include "readers/pbwire.h"
#include "readers/zipin.h"
#include "common/text.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PB_PARAMETER = 200 };
enum { PAR_NAME = 1, PAR_SHAPE = 20, PAR_DATA = 100, PAR_NEED_GRAD = 101 };
enum { SHAPE_DIM = 1 };

#define NNP_MAX_VERSION 64
#define NNP_MAX_ATTRS 1024

static bool is_text_name(const char *n)
{
    return ck_text_ends_with_icase(n, ".nntxt") || ck_text_ends_with_icase(n, ".prototxt");
}

static int add_need_grad(struct ck_tensor_set *s, const char *name, bool v)
{
    struct ck_buf k = CK_BUF_INIT;
    int err = ck_buf_printf(&k, "need_grad:%s", name);
    if (err >= 0)
        err = ck_tensor_set_add_meta(s, ck_buf_str(&k), v ? "true" : "false");
    ck_buf_release(&k);
    return err;
}

static int shape_text(const struct ck_tensor *t, char *out, size_t outsz)
{
    size_t n = (size_t)snprintf(out, outsz, "[");
    for (int i = 0; i < t->rank && n < outsz; i++)
        n += (size_t)snprintf(out + n, outsz - n, "%s%" PRId64, i ? "," : "", t->dims[i]);
    if (n < outsz)
        snprintf(out + n, outsz - n, "]");
    return 0;
}

/* Checks the data count against the shape and adds a parameter tensor. */
static int add_param(struct ck_tensor_set *s, const char *label, struct ck_tensor *t,
                     uint64_t count, int need_grad)
{
    uint64_t numel;
    char sh[256];
    int err;
    shape_text(t, sh, sizeof(sh));
    if (ck_tensor_numel(t, &numel) < 0)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': bad shape %s", label, t->name, sh);
    if (numel != count)
        return ck_error(CK_EFORMAT,
                        "'%s': tensor '%s': %" PRIu64 " values for shape %s of %" PRIu64
                        " elements",
                        label, t->name, count, sh, numel);
    t->dtype = CK_DT_F32;
    t->role = "parameter";
    t->nbytes = count * 4;
    if ((err = ck_tensor_set_add(s, t, NULL)) < 0)
        return err;
    return need_grad >= 0 ? add_need_grad(s, t->name, need_grad) : 0;
}

/* Every tensor name once (checked once per source: a scan per tensor would
 * make a file of a million tiny parameters take hours). */
static int check_unique(const struct ck_tensor_set *s, const char *label)
{
    struct ck_nameidx ix;
    int err = ck_nameidx_tensors(&ix, s);
    if (err < 0)
        return err;
    const char *dup = ck_nameidx_duplicate(&ix);
    if (dup)
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s' appears twice", label, dup);
    ck_nameidx_release(&ix);
    return err;
}

/* ---- parameter.protobuf ---- */

static int pb_shape(const char *label, const struct ck_pb_field *f, struct ck_tensor *t)
{
    struct ck_pb r;
    struct ck_pb_field d;
    int rc;
    size_t n = 0;
    uint64_t dims[CK_TENSOR_MAX_RANK];
    ck_pb_init_field(&r, f);
    while ((rc = ck_pb_next(&r, &d)) > 0) {
        if (d.num != SHAPE_DIM)
            continue;
        if ((rc = ck_pb_varints(&d, dims, CK_TENSOR_MAX_RANK, &n)) < 0)
            return ck_error_wrap(rc, "'%s': tensor '%s': shape", label, t->name);
    }
    if (rc < 0)
        return ck_error_wrap(rc, "'%s': tensor '%s': shape", label, t->name);
    t->rank = (int)n;
    for (size_t i = 0; i < n; i++) {
        t->dims[i] = (int64_t)dims[i];
        if (t->dims[i] < 0)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': dimension %zu is %" PRId64, label,
                            t->name, i, t->dims[i]);
    }
    return 0;
}

static int pb_param_data(struct ck_tensor_set *s, struct ck_pool *pool, const char *label,
                         const struct ck_pb_field *pf, struct ck_tensor *tp,
                         const struct ck_pb_field *shapef, bool has_shape,
                         const struct ck_pb_field *dataf, size_t ndata, size_t total,
                         int need_grad);

static int pb_param(struct ck_tensor_set *s, struct ck_pool *pool, const char *label, size_t index,
                    const struct ck_pb_field *pf)
{
    struct ck_pb r;
    struct ck_pb_field f, shape = {0}, data = {0};
    struct ck_tensor t;
    size_t total = 0, ndata = 0, c;
    int need_grad = -1, rc;
    const unsigned char *name = NULL;
    size_t namelen = 0;
    bool has_shape = false;
    memset(&t, 0, sizeof(t));
    ck_pb_init_field(&r, pf);
    while ((rc = ck_pb_next(&r, &f)) > 0) {
        if (f.num == PAR_NAME && f.wire == CK_PB_LEN) {
            name = f.data;
            namelen = f.len;
        } else if (f.num == PAR_SHAPE && f.wire == CK_PB_LEN) {
            shape = f;
            has_shape = true;
        } else if (f.num == PAR_DATA) {
            if ((rc = ck_pb_fixed32s_count(&f, &c)) < 0)
                break;
            total += c;
            if (ndata++ == 0)
                data = f;
        } else if (f.num == PAR_NEED_GRAD && f.wire == CK_PB_VARINT) {
            need_grad = f.v != 0;
        }
    }
    if (rc < 0)
        return ck_error_wrap(rc, "'%s': parameter %zu", label, index);
    if (!name || !namelen || memchr(name, 0, namelen))
        return ck_error(CK_EFORMAT, "'%s': parameter %zu has no name or one with a NUL byte", label,
                        index);
    if (!(t.name = strndup((const char *)name, namelen)))
        return ck_error(CK_ENOMEM, "'%s': out of memory", label);
    rc = pb_param_data(s, pool, label, pf, &t, &shape, has_shape, &data, ndata, total, need_grad);
    free(t.name);
    return rc;
}

static int pb_param_data(struct ck_tensor_set *s, struct ck_pool *pool, const char *label,
                         const struct ck_pb_field *pf, struct ck_tensor *tp,
                         const struct ck_pb_field *shapef, bool has_shape,
                         const struct ck_pb_field *dataf, size_t ndata, size_t total, int need_grad)
{
    struct ck_tensor t = *tp;
    struct ck_pb r;
    struct ck_pb_field f, data = *dataf, shape = *shapef;
    size_t c;
    int rc;
    if (has_shape && (rc = pb_shape(label, &shape, &t)) < 0)
        return rc;
    if (ndata == 1 && data.wire == CK_PB_LEN) {
        const unsigned char *p;
        if ((rc = ck_pb_packed_fixed32_view(&data, &p, &c)) < 0)
            return ck_error_wrap(rc, "'%s': tensor '%s'", label, t.name);
        t.data = p; /* little-endian floats, as the file holds them */
    } else if (ndata) {
        /* Values spread over several fields: gather them. total is bounded by the input. */
        uint64_t numel;
        if (ck_tensor_numel(&t, &numel) < 0 || numel != total)
            return add_param(s, label, &t, total, need_grad); /* reports the mismatch */
        void *mem;
        size_t n = 0;
        if ((rc = ck_pool_alloc(pool, (uint64_t)total * 4, &mem)) < 0)
            return rc;
        uint32_t *u = mem;
        ck_pb_init_field(&r, pf);
        while ((rc = ck_pb_next(&r, &f)) > 0)
            if (f.num == PAR_DATA && (rc = ck_pb_fixed32s(&f, u, total, &n)) < 0)
                break;
        if (rc < 0)
            return ck_error_wrap(rc, "'%s': tensor '%s'", label, t.name);
        unsigned char *b = mem;
        for (size_t i = 0; i < n; i++) {
            uint32_t v = u[i];
            b[4 * i] = (unsigned char)v;
            b[4 * i + 1] = (unsigned char)(v >> 8);
            b[4 * i + 2] = (unsigned char)(v >> 16);
            b[4 * i + 3] = (unsigned char)(v >> 24);
        }
        t.data = b;
    } else {
        t.data = (const unsigned char *)"";
    }
    return add_param(s, label, &t, total, need_grad);
}

static int pb_params(struct ck_tensor_set *s, const char *label, const unsigned char *p,
                     uint64_t len)
{
    struct ck_pb r;
    struct ck_pb_field f;
    struct ck_pool pool;
    size_t index = 0;
    int rc;
    ck_pool_init(&pool, s);
    ck_pb_init(&r, p, (size_t)len);
    while ((rc = ck_pb_next(&r, &f)) > 0) {
        if (f.num != PB_PARAMETER)
            continue;
        if (f.wire != CK_PB_LEN)
            return ck_error(CK_EFORMAT, "'%s': parameter %zu is not a message", label, index);
        if ((rc = pb_param(s, &pool, label, index++, &f)) < 0)
            return rc;
    }
    if (rc < 0)
        return ck_error_wrap(rc, "'%s'", label);
    return check_unique(s, label);
}

/* ---- network.nntxt ---- */

static int txt_shape(const char *label, const struct ck_nntxt *shape, struct ck_tensor *t,
                     bool allow_unknown)
{
    t->rank = 0;
    for (const struct ck_nntxt *d = ck_nntxt_get(shape, "dim"); d; d = ck_nntxt_next(d)) {
        int64_t v;
        int err;
        if ((err = ck_nntxt_int(d, label, &v)) < 0)
            return err;
        if (t->rank == CK_TENSOR_MAX_RANK)
            return ck_error(CK_EFORMAT, "'%s' line %u: rank over %d", label, d->line,
                            CK_TENSOR_MAX_RANK);
        if (v < (allow_unknown ? -1 : 0))
            return ck_error(CK_EFORMAT, "'%s' line %u: dimension %" PRId64, label, d->line, v);
        t->dims[t->rank++] = v;
    }
    return 0;
}

static int req_str(const struct ck_nntxt *msg, const char *field, const char *label,
                   const char **out)
{
    const struct ck_nntxt *n = ck_nntxt_get(msg, field);
    if (!n)
        return ck_error(CK_EFORMAT, "'%s' line %u: '%s' has no '%s'", label, msg->line, msg->name,
                        field);
    int err = ck_nntxt_str(n, label, out);
    if (err >= 0 && !**out)
        return ck_error(CK_EFORMAT, "'%s' line %u: '%s' is empty", label, n->line, field);
    return err;
}

/* Parameters written in the text format itself. */
static int txt_params(struct ck_tensor_set *s, const char *label, const struct ck_nntxt *root)
{
    struct ck_pool pool;
    int err;
    ck_pool_init(&pool, s);
    for (const struct ck_nntxt *p = ck_nntxt_get(root, "parameter"); p; p = ck_nntxt_next(p)) {
        struct ck_tensor t;
        const char *name;
        const struct ck_nntxt *sh = ck_nntxt_get(p, "shape"), *ng = ck_nntxt_get(p, "need_grad");
        bool need = false;
        memset(&t, 0, sizeof(t));
        if ((err = req_str(p, "variable_name", label, &name)) < 0)
            return err;
        t.name = (char *)name;
        if (sh && (err = txt_shape(label, sh, &t, false)) < 0)
            return err;
        if (ng && (err = ck_nntxt_bool(ng, label, &need)) < 0)
            return err;
        size_t count = ck_nntxt_count(p, "data");
        void *mem;
        if ((err = ck_pool_alloc(&pool, (uint64_t)count * 4, &mem)) < 0)
            return err;
        unsigned char *b = mem;
        size_t i = 0;
        for (const struct ck_nntxt *d = ck_nntxt_get(p, "data"); d; d = ck_nntxt_next(d), i++) {
            double v;
            if ((err = ck_nntxt_double(d, label, &v)) < 0)
                return err;
            float f = (float)v;
            uint32_t u;
            memcpy(&u, &f, 4);
            for (int k = 0; k < 4; k++)
                b[4 * i + k] = (unsigned char)(u >> (8 * k));
        }
        t.data = b;
        if ((err = add_param(s, label, &t, count, ng ? need : -1)) < 0)
            return err;
    }
    return check_unique(s, label);
}

static bool is_shape_msg(const struct ck_nntxt *m)
{
    for (const struct ck_nntxt *c = m->child; c; c = c->next)
        if (strcmp(c->name, "dim") || c->kind == CK_NNTXT_MSG)
            return false;
    return true;
}

static int scalar_text(struct ck_buf *b, const struct ck_nntxt *v)
{
    if (v->kind == CK_NNTXT_MSG && is_shape_msg(v)) {
        int err = ck_buf_putc(b, '[');
        for (const struct ck_nntxt *d = v->child; d && err >= 0; d = d->next)
            err = ck_buf_printf(b, "%s%s", d == v->child ? "" : ",", d->value);
        return err < 0 ? err : ck_buf_putc(b, ']');
    }
    return ck_buf_append(b, v->value, strlen(v->value));
}

struct kid {
    const struct ck_nntxt *n;
    size_t idx;
};

struct group {
    size_t first, start, count;
};

static int kid_cmp(const void *x, const void *y)
{
    const struct kid *a = x, *b = y;
    int c = strcmp(a->n->name, b->n->name);
    return c ? c : a->idx < b->idx ? -1 : a->idx > b->idx;
}

static int group_cmp(const void *x, const void *y)
{
    const struct group *a = x, *b = y;
    return a->first < b->first ? -1 : a->first > b->first;
}

/* One field (all its repeats, kids[0..count)) as one attribute, or its
 * nested messages flattened under "key." / "key[i].". */
static int flatten_field(struct ck_graph_node *n, const struct kid *kids, size_t count,
                         const char *key, const char *label, size_t *budget);

/* The fields of a *_param message as node attributes, in the order of their
 * first appearance. budget: how many more fields this function may have. */
static int flatten(struct ck_graph_node *n, const struct ck_nntxt *msg, const char *prefix,
                   const char *label, size_t *budget)
{
    size_t k = 0, ng = 0;
    int err = 0;
    for (const struct ck_nntxt *c = msg->child; c; c = c->next)
        k++;
    if (k > *budget)
        return ck_error(CK_EFORMAT, "'%s' line %u: function '%s' has over %d parameter fields",
                        label, msg->line, n->name, NNP_MAX_ATTRS);
    *budget -= k;
    if (!k)
        return 0;
    struct kid *kids = calloc(k, sizeof(*kids));
    struct group *groups = calloc(k, sizeof(*groups));
    struct ck_buf key = CK_BUF_INIT;
    if (!kids || !groups) {
        err = ck_error(CK_ENOMEM, "'%s': out of memory", label);
        goto out;
    }
    k = 0;
    for (const struct ck_nntxt *c = msg->child; c; c = c->next, k++)
        kids[k] = (struct kid){c, k};
    qsort(kids, k, sizeof(*kids), kid_cmp);
    for (size_t i = 0; i < k; i++) {
        if (i && !strcmp(kids[i].n->name, kids[i - 1].n->name))
            groups[ng - 1].count++;
        else
            groups[ng++] = (struct group){kids[i].idx, i, 1};
    }
    qsort(groups, ng, sizeof(*groups), group_cmp);
    for (size_t g = 0; g < ng && err >= 0; g++) {
        ck_buf_reset(&key);
        if ((err = ck_buf_printf(&key, "%s%s", prefix, kids[groups[g].start].n->name)) >= 0)
            err = flatten_field(n, kids + groups[g].start, groups[g].count, ck_buf_str(&key), label,
                                budget);
    }
out:
    ck_buf_release(&key);
    free(kids);
    free(groups);
    return err;
}

static int flatten_field(struct ck_graph_node *n, const struct kid *kids, size_t count,
                         const char *key, const char *label, size_t *budget)
{
    struct ck_buf val = CK_BUF_INIT;
    int err = 0;
    size_t simple = 0;
    for (size_t i = 0; i < count; i++)
        simple += kids[i].n->kind != CK_NNTXT_MSG || is_shape_msg(kids[i].n);
    if (simple && simple != count)
        return ck_error(CK_EFORMAT, "'%s' line %u: field '%s' mixes values and messages", label,
                        kids[0].n->line, key);
    if (simple) {
        if (count > 1)
            err = ck_buf_putc(&val, '[');
        for (size_t i = 0; i < count && err >= 0; i++) {
            if (i)
                err = ck_buf_putc(&val, ',');
            if (err >= 0)
                err = scalar_text(&val, kids[i].n);
        }
        if (err >= 0 && count > 1)
            err = ck_buf_putc(&val, ']');
        if (err >= 0)
            err = ck_graph_node_add_attr(n, key, ck_buf_str(&val));
    } else {
        for (size_t i = 0; i < count && err >= 0; i++) {
            ck_buf_reset(&val);
            err = count > 1 ? ck_buf_printf(&val, "%s[%zu].", key, i)
                            : ck_buf_printf(&val, "%s.", key);
            if (err >= 0)
                err = flatten(n, kids[i].n, ck_buf_str(&val), label, budget);
        }
    }
    ck_buf_release(&val);
    return err;
}

static int need_variable(const struct ck_nameidx *vars, const char *label,
                         const struct ck_nntxt *at, const char *what, const char *name)
{
    if (ck_nameidx_find(vars, name))
        return 0;
    return ck_error(CK_EFORMAT, "'%s' line %u: %s '%s' is not a variable of the network", label,
                    at->line, what, name);
}

static int txt_variables(struct ck_tensor_set *s, const char *label, const struct ck_nntxt *net)
{
    struct ck_nameidx params;
    int err;
    if ((err = ck_nameidx_tensors(&params, s)) < 0)
        return err;
    for (const struct ck_nntxt *v = ck_nntxt_get(net, "variable"); v && err >= 0;
         v = ck_nntxt_next(v)) {
        struct ck_tensor t;
        const char *name, *type = "Buffer";
        const struct ck_nntxt *sh = ck_nntxt_get(v, "shape"), *ty = ck_nntxt_get(v, "type");
        memset(&t, 0, sizeof(t));
        if ((err = req_str(v, "name", label, &name)) < 0 ||
            (ty && (err = ck_nntxt_str(ty, label, &type)) < 0))
            break;
        t.name = (char *)name;
        if (sh && (err = txt_shape(label, sh, &t, true)) < 0)
            break;
        const struct ck_nameidx_entry *e = ck_nameidx_find(&params, name);
        bool param = !strcmp(type, "Parameter");
        if (e && !param) {
            err = ck_error(CK_EFORMAT,
                           "'%s' line %u: variable '%s' is a Buffer but the "
                           "parameters hold it",
                           label, v->line, name);
            break;
        }
        if (e) {
            const struct ck_tensor *have = &s->tensors[e->index];
            bool same = have->rank == t.rank;
            for (int i = 0; same && i < t.rank; i++)
                same = have->dims[i] == t.dims[i];
            if (!same) {
                char a[256], b[256];
                shape_text(have, a, sizeof(a));
                shape_text(&t, b, sizeof(b));
                err = ck_error(CK_EFORMAT,
                               "'%s' line %u: tensor '%s': shape %s differs from "
                               "%s in the parameters",
                               label, v->line, name, b, a);
            }
            continue;
        }
        t.dtype = CK_DT_F32;
        t.role = param ? "parameter" : "buffer";
        err = ck_tensor_set_add(s, &t, NULL);
    }
    ck_nameidx_release(&params);
    if (err < 0)
        return err;
    /* A variable declared twice (or twice with its parameter) */
    struct ck_nameidx all;
    if ((err = ck_nameidx_tensors(&all, s)) < 0)
        return err;
    const char *dup = ck_nameidx_duplicate(&all);
    if (dup)
        err = ck_error(CK_EFORMAT, "'%s': variable '%s' is declared twice", label, dup);
    ck_nameidx_release(&all);
    return err;
}

static int txt_function(const struct ck_nameidx *vars, const char *label, struct ck_graph *g,
                        const struct ck_nntxt *f)
{
    const char *name, *type, *io;
    struct ck_graph_node *n;
    int err;
    if ((err = req_str(f, "name", label, &name)) < 0 ||
        (err = req_str(f, "type", label, &type)) < 0 ||
        (err = ck_graph_add_node(g, name, type, &n)) < 0)
        return err;
    for (const struct ck_nntxt *i = ck_nntxt_get(f, "input"); i; i = ck_nntxt_next(i))
        if ((err = ck_nntxt_str(i, label, &io)) < 0 ||
            (err = need_variable(vars, label, i, "input", io)) < 0 ||
            (err = ck_graph_node_add_input(n, io)) < 0)
            return err;
    for (const struct ck_nntxt *o = ck_nntxt_get(f, "output"); o; o = ck_nntxt_next(o))
        if ((err = ck_nntxt_str(o, label, &io)) < 0 ||
            (err = need_variable(vars, label, o, "output", io)) < 0 ||
            (err = ck_graph_node_add_output(n, io)) < 0)
            return err;
    size_t budget = NNP_MAX_ATTRS;
    for (const struct ck_nntxt *c = f->child; c; c = c->next)
        if (c->kind == CK_NNTXT_MSG && ck_text_ends_with_icase(c->name, "_param") &&
            (err = flatten(n, c, "", label, &budget)) < 0)
            return err;
    return 0;
}

static int executor_io(const struct ck_tensor_set *s, const struct ck_nameidx *vars,
                       const char *label, struct ck_graph *g, const struct ck_nntxt *ex,
                       bool have_params)
{
    static const struct {
        const char *field;
        int kind; /* 0 input, 1 output, 2 parameter */
    } lists[] = {{"data_variable", 0}, {"output_variable", 1}, {"parameter_variable", 2}};
    int err;
    for (size_t k = 0; k < sizeof(lists) / sizeof(lists[0]); k++)
        for (const struct ck_nntxt *v = ck_nntxt_get(ex, lists[k].field); v; v = ck_nntxt_next(v)) {
            const char *name;
            if ((err = req_str(v, "variable_name", label, &name)) < 0 ||
                (err = need_variable(vars, label, v, lists[k].field, name)) < 0)
                return err;
            if (lists[k].kind < 2) {
                if ((err = ck_graph_add_io(g, lists[k].kind == 1, name)) < 0)
                    return err;
                continue;
            }
            const struct ck_tensor *t = &s->tensors[ck_nameidx_find(vars, name)->index];
            if (have_params && !t->data)
                return ck_error(CK_EFORMAT, "'%s' line %u: the parameters hold no tensor '%s'",
                                label, v->line, name);
        }
    return 0;
}

/* The loss variables of the optimizers that train network `name` (proto
 * Optimizer: network_name, loss_variable { variable_name }): the graph
 * attribute "loss_variables" ("a,b"), as the SameDiff reader names them. */
static int optimizer_losses(const char *label, const struct ck_nntxt *root, const char *name,
                            const struct ck_nameidx *vars, struct ck_graph *g)
{
    struct ck_buf lv = CK_BUF_INIT;
    int err = 0;
    ck_buf_init(&lv, CK_NNTXT_MAX_TEXT);
    for (const struct ck_nntxt *o = ck_nntxt_get(root, "optimizer"); o && err >= 0;
         o = ck_nntxt_next(o)) {
        const char *net;
        if ((err = req_str(o, "network_name", label, &net)) < 0 || strcmp(net, name))
            continue;
        for (const struct ck_nntxt *l = ck_nntxt_get(o, "loss_variable"); l && err >= 0;
             l = ck_nntxt_next(l)) {
            const char *v;
            if ((err = req_str(l, "variable_name", label, &v)) < 0 ||
                (err = need_variable(vars, label, l, "loss_variable", v)) < 0)
                break;
            if (strchr(v, ','))
                continue; /* the attribute cannot hold it */
            err = ck_buf_printf(&lv, "%s%s", lv.len ? "," : "", v);
        }
    }
    if (err >= 0 && lv.len)
        err = ck_graph_add_attr(g, "loss_variables", ck_buf_str(&lv));
    ck_buf_release(&lv);
    return err;
}

static int txt_network(struct ck_tensor_set *s, const char *label, const struct ck_nntxt *root,
                       bool have_params)
{
    const struct ck_nntxt *ex = ck_nntxt_get(root, "executor"), *net = NULL;
    const char *want = NULL, *name;
    struct ck_graph *g = NULL;
    struct ck_nameidx vars = {NULL, 0};
    int err;
    if (ex) {
        const char *exname;
        if ((err = req_str(ex, "name", label, &exname)) < 0 ||
            (err = req_str(ex, "network_name", label, &want)) < 0 ||
            (err = ck_tensor_set_add_meta(s, "executor", exname)) < 0)
            return err;
    }
    for (net = ck_nntxt_get(root, "network"); net; net = ck_nntxt_next(net)) {
        if ((err = req_str(net, "name", label, &name)) < 0)
            return err;
        if (!want || !strcmp(want, name))
            break;
    }
    if (!net) {
        if (want)
            return ck_error(CK_EFORMAT, "'%s': executor names network '%s', which is not there",
                            label, want);
        return 0;
    }
    if ((err = ck_tensor_set_add_meta(s, "network", name)) < 0 ||
        (err = txt_variables(s, label, net)) < 0)
        return err;
    if (!(g = ck_graph_new()))
        return ck_error(CK_ENOMEM, "'%s': out of memory", label);
    if (!(g->name = strdup(name))) {
        err = ck_error(CK_ENOMEM, "'%s': out of memory", label);
        goto out;
    }
    const struct ck_nntxt *bs = ck_nntxt_get(net, "batch_size");
    if (bs) {
        int64_t v;
        char num[32];
        if ((err = ck_nntxt_int(bs, label, &v)) < 0)
            goto out;
        snprintf(num, sizeof(num), "%" PRId64, v);
        if ((err = ck_graph_add_attr(g, "batch_size", num)) < 0)
            goto out;
    }
    if ((err = ck_nameidx_tensors(&vars, s)) < 0)
        goto out;
    for (const struct ck_nntxt *f = ck_nntxt_get(net, "function"); f; f = ck_nntxt_next(f))
        if ((err = txt_function(&vars, label, g, f)) < 0)
            goto out;
    if (ex && (err = executor_io(s, &vars, label, g, ex, have_params)) < 0)
        goto out;
    if ((err = optimizer_losses(label, root, name, &vars, g)) < 0)
        goto out;
    s->graph = g;
    g = NULL;
out:
    ck_nameidx_release(&vars);
    ck_graph_free(g);
    return err;
}

/* Parses text: its parameters first, then the network (checked against the
 * parameters already in s; have_params: a parameter file was read, so every
 * parameter the executor names must have its values). */
static int read_text(struct ck_tensor_set *s, const char *label, const unsigned char *p,
                     uint64_t len, bool have_params)
{
    struct ck_nntxt *root = NULL;
    int err;
    if (memchr(p, 0, len))
        return ck_error(CK_EFORMAT, "'%s': text holds a NUL byte", label);
    if ((err = ck_nntxt_parse((const char *)p, (size_t)len, label, &root)) < 0)
        return err;
    if ((err = txt_params(s, label, root)) < 0)
        goto out;
    err = txt_network(s, label, root, have_params || ck_nntxt_get(root, "parameter"));
out:
    ck_nntxt_free(root);
    return err;
}

/* ---- solver states ----
 *
 * nnabla/utils/save.py (include_solver_state, solver_state_format ".h5")
 * stores each optimizer's solver.save_states() as the member
 * "<optimizer>_<solver type>_optimizer.h5.optimizer"; nnabla's loader
 * (get_file_handle.py, _load_solve_state_from_h5) reads it as datasets
 * "<parameter>/<state>" (Adam: m, v; Momentum: m; ...) and "<parameter>/t",
 * the step count, an integer scalar. Each becomes the tensor
 * "<parameter>/updater/<state>" with role "updater" (model/optstate.h ties
 * it to its parameter, or counts it as unmapped). The protobuf form
 * ("*_optimizer.protobuf.optimizer") is not read: its member is named in the
 * meta entry "solver_state_unread". */

#define NNP_STATE_H5 "_optimizer.h5.optimizer"
#define NNP_STATE_PB "_optimizer.protobuf.optimizer"

static bool is_state_name(const char *n)
{
    return ck_text_ends_with_icase(n, NNP_STATE_H5) || ck_text_ends_with_icase(n, NNP_STATE_PB);
}

static int solver_states(struct ck_tensor_set *s, const char *label, const void *image, size_t len)
{
    struct ck_tensor_set *st = ck_tensor_set_new("nnp", label);
    int err;
    if (!st)
        return ck_error(CK_ENOMEM, "'%s': out of memory", label);
    if ((err = ck_h5param_read_flags(st, label, NULL, image, len, CK_H5PARAM_INTEGERS)) < 0)
        goto out;
    for (size_t i = 0; i < st->ntensors && err >= 0; i++) {
        struct ck_tensor t = st->tensors[i];
        const char *slash = strrchr(t.name, '/');
        struct ck_buf name;
        void *data = NULL;
        ck_buf_init(&name, 3 * 65536);
        if (slash && slash != t.name && slash[1])
            err = ck_buf_printf(&name, "%.*s/updater/%s", (int)(slash - t.name), t.name, slash + 1);
        else /* not "<parameter>/<state>": kept, and counted as unmapped */
            err = ck_buf_puts(&name, t.name);
        if (err >= 0 && ck_tensor_set_find(s, ck_buf_str(&name)))
            err = ck_error(CK_EFORMAT, "'%s': solver state '%s' appears twice", label,
                           ck_buf_str(&name));
        if (err >= 0 && (err = ck_tensor_set_alloc(s, t.nbytes, &data)) >= 0) {
            if (t.nbytes)
                memcpy(data, t.data, t.nbytes);
            t.data = data;
            t.role = "updater";
            if (!(t.name = ck_tensor_set_strdup(s, ck_buf_str(&name), name.len)))
                err = ck_error(CK_ENOMEM, "'%s': out of memory", label);
            else
                err = ck_tensor_set_add(s, &t, NULL);
        }
        ck_buf_release(&name);
    }
out:
    ck_tensor_set_free(st);
    return err;
}

/* ---- the archive ---- */

static int nnp_zip(struct ck_tensor_set *s, const char *path)
{
    struct ck_zipin zi;
    int64_t text = -1, param = -1, version = -1;
    char label[4200];
    const unsigned char *d = NULL, *td = NULL;
    uint64_t len = 0, tlen = 0;
    int err;
    if ((err = ck_zipin_open(&zi, path)) < 0)
        return err;
    for (uint64_t i = 0; i < zi.nentries; i++) {
        const char *n = ck_zipin_name(&zi, i);
        int64_t *slot = NULL;
        if (!n || strchr(n, '/'))
            continue;
        if (is_state_name(n))
            continue; /* read after the parameters */
        if (!strcmp(n, "nnp_version.txt"))
            slot = &version;
        else if (is_text_name(n))
            slot = &text;
        else if (ck_text_ends_with_icase(n, ".protobuf") || ck_text_ends_with_icase(n, ".h5"))
            slot = &param;
        if (!slot)
            continue;
        if (*slot >= 0) {
            err = ck_error(CK_EFORMAT, "'%s': both '%s' and '%s' hold the %s", path,
                           ck_zipin_name(&zi, (uint64_t)*slot), n,
                           slot == &param  ? "parameters"
                           : slot == &text ? "network"
                                           : "version");
            goto out;
        }
        *slot = (int64_t)i;
    }
    if (text < 0 && param < 0) {
        err = ck_error(CK_EFORMAT, "'%s': holds neither a network nor parameters", path);
        goto out;
    }
    if (version >= 0) {
        if ((err = ck_zipin_read(&zi, s, (uint64_t)version, NNP_MAX_VERSION, &d, &len)) < 0)
            goto out;
        char *v = ck_tensor_set_strdup(s, (const char *)d, (size_t)len);
        if (!v) {
            err = ck_error(CK_ENOMEM, "'%s': out of memory", path);
            goto out;
        }
        v[strcspn(v, "\r\n")] = 0;
        if ((err = ck_tensor_set_add_meta(s, "nnp_version", v)) < 0)
            goto out;
    }
    if (param >= 0) {
        const char *pn = ck_zipin_name(&zi, (uint64_t)param);
        snprintf(label, sizeof(label), "%s: %s", path, pn);
        if ((err = ck_tensor_set_add_meta(s, "parameter_file", pn)) < 0 ||
            (err = ck_zipin_read(&zi, s, (uint64_t)param, CK_TENSOR_ALLOC_MAX, &d, &len)) < 0)
            goto out;
        if (ck_text_ends_with_icase(pn, ".h5"))
            err = ck_h5param_read(s, label, NULL, d, (size_t)len);
        else
            err = pb_params(s, label, d, len);
        if (err < 0)
            goto out;
    }
    if (text >= 0) {
        snprintf(label, sizeof(label), "%s: %s", path, ck_zipin_name(&zi, (uint64_t)text));
        if ((err = ck_zipin_read(&zi, s, (uint64_t)text, CK_NNTXT_MAX_TEXT, &td, &tlen)) < 0 ||
            (err = read_text(s, label, td, tlen, param >= 0)) < 0)
            goto out;
    }
    for (uint64_t i = 0; i < zi.nentries; i++) {
        const char *n = ck_zipin_name(&zi, i);
        if (!n || strchr(n, '/') || !is_state_name(n))
            continue;
        if (ck_text_ends_with_icase(n, NNP_STATE_PB)) {
            if ((err = ck_tensor_set_add_meta(s, "solver_state_unread", n)) < 0)
                goto out;
            continue;
        }
        snprintf(label, sizeof(label), "%s: %s", path, n);
        if ((err = ck_tensor_set_add_meta(s, "solver_state_file", n)) < 0 ||
            (err = ck_zipin_read(&zi, s, i, CK_TENSOR_ALLOC_MAX, &d, &len)) < 0 ||
            (err = solver_states(s, label, d, (size_t)len)) < 0)
            goto out;
    }
out:
    ck_zipin_close(&zi);
    return err;
}

static int nnp_probe(const char *path, const unsigned char *head, size_t headlen)
{
    if (ck_zipin_is_zip(head, headlen)) {
        struct ck_zipin zi;
        int score = CK_PROBE_NO;
        uint64_t idx;
        if (ck_zipin_open(&zi, path) == 0) {
            if (ck_zipin_find(&zi, "tags.txt", &idx) < 0) {
                for (uint64_t i = 0; i < zi.nentries && !score; i++) {
                    const char *n = ck_zipin_name(&zi, i);
                    if (n && !strchr(n, '/') &&
                        (!strcmp(n, "nnp_version.txt") || is_text_name(n) ||
                         ck_text_ends_with_icase(n, ".protobuf") || ck_text_ends_with_icase(n, ".h5")))
                        score = CK_PROBE_CONTENT;
                }
            }
            ck_zipin_close(&zi);
        } else if (ck_text_ends_with_icase(path, ".nnp")) {
            score = CK_PROBE_NAME; /* a broken or hostile .nnp: let open() say why */
        }
        ck_error_clear();
        return score;
    }
    if (ck_h5param_is_hdf5(head, headlen))
        return CK_PROBE_CONTENT;
    if (ck_text_ends_with_icase(path, ".protobuf")) {
        const unsigned char *p = head;
        uint64_t tag;
        if (ck_pb_read_varint(&p, head + headlen, &tag) == 0 &&
            (tag == (PB_PARAMETER << 3 | 2) || tag == (100 << 3 | 2) || tag == (1 << 3 | 2)))
            return CK_PROBE_CONTENT;
        ck_error_clear();
        return CK_PROBE_NAME;
    }
    if (is_text_name(path)) {
        size_t i = 0;
        while (i < headlen &&
               (head[i] == ' ' || head[i] == '\n' || head[i] == '\t' || head[i] == '\r'))
            i++;
        if (i < headlen && (head[i] == '#' || (head[i] >= 'a' && head[i] <= 'z')))
            return CK_PROBE_CONTENT;
        return CK_PROBE_NAME;
    }
    return CK_PROBE_NO;
}

static int nnp_open(const char *path, struct ck_tensor_set **out)
{
    struct ck_tensor_set *s = ck_tensor_set_new("nnp", path);
    const unsigned char *p;
    uint64_t len;
    int err;
    if (!s)
        return ck_error(CK_ENOMEM, "'%s': out of memory", path);
    if ((err = ck_tensor_set_map_file(s, path, &p, &len)) < 0)
        goto out;
    if (ck_zipin_is_zip(p, len))
        err = nnp_zip(s, path);
    else if (ck_h5param_is_hdf5(p, len))
        err = ck_h5param_read(s, path, path, NULL, 0);
    else if (ck_text_ends_with_icase(path, ".protobuf"))
        err = pb_params(s, path, p, len);
    else if (is_text_name(path))
        err = read_text(s, path, p, len, false);
    else
        err = ck_error(CK_EFORMAT, "'%s': not an NNabla file (.nnp, .h5, .protobuf, .nntxt)", path);
out:
    if (err < 0) {
        ck_tensor_set_free(s);
        return err;
    }
    *out = s;
    return 0;
}

const struct ck_reader_ops ck_reader_nnp = {
    .name = "nnp",
    .description = "NNabla .nnp archive (network.nntxt + parameter.protobuf or .h5)",
    .probe = nnp_probe,
    .open = nnp_open,
    .verify = ck_zipin_verify_archive, /* a zip: every member (every tag) */
    .to_model = ck_nnp_to_model,
};
