/* The engine's value table: every name a node reads or writes (weights,
 * graph inputs, node outputs) gets an index, through a hash of the names
 * (models of thousands of nodes resolve in linear time). Weights are
 * converted to float32 here, once (model/convert.h: fast paths for f16, bf16,
 * f64), and only those some node reads. */
#include "infer/engine.h"
#include "common/error.h"
#include "common/log.h"
#include "model/convert.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int map_grow(struct ck_infer *e)
{
    size_t cap = e->map_cap ? e->map_cap * 2 : 64;
    int *slots = malloc(sizeof(int) * cap);
    if (!slots)
        return ck_error(CK_ENOMEM, "out of memory for the value table");
    for (size_t i = 0; i < cap; i++)
        slots[i] = -1;
    for (size_t i = 0; i < e->map_cap; i++) {
        if (e->map[i] < 0)
            continue;
        size_t s = hash_name(e->values[e->map[i]].name) & (cap - 1);
        while (slots[s] >= 0)
            s = (s + 1) & (cap - 1);
        slots[s] = e->map[i];
    }
    free(e->map);
    e->map = slots;
    e->map_cap = cap;
    return 0;
}

int ck_infer_value_find(const struct ck_infer *e, const char *name)
{
    if (!e->map_cap)
        return -1;
    size_t s = hash_name(name) & (e->map_cap - 1);
    for (; e->map[s] >= 0; s = (s + 1) & (e->map_cap - 1))
        if (strcmp(e->values[e->map[s]].name, name) == 0)
            return e->map[s];
    return -1;
}

/* A new value named name (borrowed from the model); a later definition of
 * the same name shadows the earlier one, as the node order says. */
int ck_infer_value_add(struct ck_infer *e, const char *name, enum ck_value_kind kind)
{
    int err;
    if (e->nvalues == e->values_cap) {
        size_t cap = e->values_cap ? e->values_cap * 2 : 64;
        struct ck_value *v = realloc(e->values, sizeof *v * cap);
        if (!v)
            return ck_error(CK_ENOMEM, "out of memory for the value table");
        e->values = v;
        e->values_cap = cap;
    }
    if ((e->nvalues + 1) * 2 > e->map_cap && (err = map_grow(e)) < 0)
        return err;
    int idx = (int)e->nvalues++;
    e->values[idx] = (struct ck_value){.name = name, .kind = kind, .buf = -1};
    size_t s = hash_name(name) & (e->map_cap - 1);
    for (; e->map[s] >= 0; s = (s + 1) & (e->map_cap - 1))
        if (strcmp(e->values[e->map[s]].name, name) == 0)
            break;
    e->map[s] = idx;
    return idx;
}

static bool numeric(enum ck_dtype t)
{
    return t != CK_DT_STRING && t != CK_DT_INVALID && t != CK_DT_C64 && t != CK_DT_C128 &&
           ck_dtype_size(t) > 0;
}

/* float32 of t: in place when it already is (little-endian, C order,
 * aligned), otherwise a converted copy, the source's whole pages of a
 * mapped file dropped as it is made (ck_tensor_set_drop_pages). */
static int convert(struct ck_infer *e, const struct ck_tensor *t, struct ck_value *v)
{
    uint64_t n;
    if (t->rank > CK_INFER_MAX_RANK)
        return ck_error(CK_EFORMAT, "weight '%s': rank %d, the engine runs up to %d", t->name,
                        t->rank, CK_INFER_MAX_RANK);
    if (!numeric(t->dtype))
        return ck_error(CK_EFORMAT, "weight '%s': dtype %s is not a real number", t->name,
                        ck_dtype_name(t->dtype));
    if (ck_tensor_numel(t, &n) < 0 || n > (uint64_t)CK_INFER_NUMEL_MAX)
        return ck_error(CK_EFORMAT, "weight '%s': too many elements", t->name);
    if (!t->data || t->nbytes < n * ck_dtype_size(t->dtype))
        return ck_error(CK_EFORMAT, "weight '%s': data is missing or shorter than its shape",
                        t->name);
    v->shape.rank = t->rank;
    memcpy(v->shape.d, t->dims, sizeof(int64_t) * (size_t)t->rank);
    v->dtype = t->dtype;
    if (e->dtypes_only)
        return 0;
    if (t->dtype == CK_DT_F32 && !t->big_endian && !t->fortran_order &&
        ((uintptr_t)t->data & 3) == 0) {
        v->data = (float *)(uintptr_t)t->data;
    } else {
        float *d = malloc(sizeof(float) * (n ? n : 1));
        if (!d)
            return ck_error(CK_ENOMEM, "weight '%s': out of memory converting %llu values",
                            t->name, (unsigned long long)n);
        /* In chunks, each one's source pages of a mapped file dropped once
         * converted (the engine reads only the copy from then on): an
         * unaligned float32 initializer of an ONNX file is held once, not
         * twice, also at the peak. C order reads the source in order; other
         * layouts only drop less. */
        const uint64_t chunk = UINT64_C(1) << 20, esize = ck_dtype_size(t->dtype);
        for (uint64_t at = 0; at < n; at += chunk) {
            uint64_t k = n - at < chunk ? n - at : chunk;
            int err = ck_tensor_read_f32(t, at, k, d + at, NULL);
            if (err < 0) {
                free(d);
                return err;
            }
            if (!t->fortran_order)
                ck_tensor_set_drop_pages(e->m->weights, t->data + at * esize, k * esize);
        }
        v->data = d;
        v->owned = true;
        e->weight_bytes += n * sizeof(float);
    }
    uint64_t bad = 0;
    for (uint64_t i = 0; i < n; i++)
        bad += !isfinite(v->data[i]);
    if (bad)
        ck_warn("infer.weight_not_finite", "weight='%s' count=%llu", t->name,
                (unsigned long long)bad);
    return 0;
}

/* Weights first, then graph inputs, then node outputs in order; each node
 * input resolved to the latest definition of its name. */
int ck_infer_values_build(struct ck_infer *e)
{
    const struct ck_model *m = e->m;
    int err;
    for (size_t i = 0; i < m->ninputs; i++)
        if ((err = ck_infer_value_add(e, m->inputs[i].name, CK_VALUE_INPUT)) < 0)
            return err;
    e->nodes = calloc(m->nnodes ? m->nnodes : 1, sizeof *e->nodes);
    if (!e->nodes)
        return ck_error(CK_ENOMEM, "out of memory for the node table");
    for (size_t i = 0; i < m->nnodes; i++) {
        const struct ck_model_node *n = &m->nodes[i];
        struct ck_enode *en = &e->nodes[i];
        en->in = calloc(n->ninputs + n->noutputs + 1, sizeof(int));
        if (!en->in)
            return ck_error(CK_ENOMEM, "out of memory for the node table");
        en->out = en->in + n->ninputs;
        en->nin = n->ninputs;
        for (size_t k = 0; k < n->ninputs; k++) {
            int v = ck_infer_value_find(e, n->inputs[k]);
            if (v < 0) {
                const struct ck_tensor *t = ck_model_weight(m, n->inputs[k]);
                if (!t)
                    return ck_error(CK_EFORMAT, "node '%s' (%s): input '%s' is not defined",
                                    n->name, ck_op_name(n->op), n->inputs[k]);
                if ((v = ck_infer_value_add(e, n->inputs[k], CK_VALUE_WEIGHT)) < 0)
                    return v;
                if ((err = convert(e, t, &e->values[v])) < 0)
                    return err;
            }
            en->in[k] = v;
        }
        for (size_t k = 0; k < n->noutputs; k++) {
            int v = ck_infer_value_add(e, n->outputs[k], CK_VALUE_NODE);
            if (v < 0)
                return v;
            en->out[k] = v;
        }
    }
    for (size_t i = 0; i < m->noutputs; i++) {
        int v = ck_infer_value_find(e, m->outputs[i].name);
        if (v < 0) {
            const struct ck_tensor *t = ck_model_weight(m, m->outputs[i].name);
            if (!t)
                return ck_error(CK_EFORMAT, "graph output '%s' is produced by no node",
                                m->outputs[i].name);
            if ((v = ck_infer_value_add(e, m->outputs[i].name, CK_VALUE_WEIGHT)) < 0 ||
                (err = convert(e, t, &e->values[v])) < 0)
                return v < 0 ? v : err;
        }
        e->values[v].graph_output = true;
    }
    for (size_t i = 0; i < m->ninputs; i++) {
        struct ck_value *v = &e->values[ck_infer_value_find(e, m->inputs[i].name)];
        for (size_t k = 0; k < e->nvalues; k++) /* a shadowed input: its own entry */
            if (e->values[k].kind == CK_VALUE_INPUT && !strcmp(e->values[k].name, m->inputs[i].name)) {
                v = &e->values[k];
                break;
            }
        v->dtype = m->inputs[i].dtype == CK_DT_INVALID ? CK_DT_F32 : m->inputs[i].dtype;
    }
    ck_infer_dtypes(e);
    return 0;
}

static bool is_bool_op(enum ck_op op)
{
    return op >= CK_OP_EQUAL && op <= CK_OP_XOR;
}

void ck_infer_dtypes(struct ck_infer *e)
{
    for (size_t i = 0; i < e->m->nnodes; i++) {
        const struct ck_model_node *n = &e->m->nodes[i];
        const struct ck_enode *en = &e->nodes[i];
        /* the computing input's: the first that is not a weight (weights
         * were converted; a float16 scale does not make a float32 product
         * float16), else the first; where's a or b; a gather's table (its
         * indices, often the graph's input, are not what it gives) */
        size_t from = n->op == CK_OP_WHERE && en->nin > 1 ? 1 : 0, pick = from;
        /* a computed shape or bound (int64) is not the data: an expand of a
         * float32 weight by a shape value gives float32 */
        bool first_only = n->op == CK_OP_GATHER || n->op == CK_OP_GATHER_ELEMENTS ||
                     ck_infer_params_as_inputs(n);
        for (size_t k = en->nin; !first_only && k-- > from;)
            if (e->values[en->in[k]].kind != CK_VALUE_WEIGHT)
                pick = k;
        enum ck_dtype first = en->nin ? e->values[en->in[pick]].dtype : CK_DT_F32;
        for (size_t k = 0; k < n->noutputs; k++) {
            enum ck_dtype t = first;
            if (n->op == CK_OP_CAST)
                t = n->p.nints == 1 ? ck_op_cast_dtype(n->p.ints[0]) : CK_DT_INVALID;
            else if (is_bool_op(n->op))
                t = CK_DT_BOOL;
            else if (n->op == CK_OP_ARGMAX || n->op == CK_OP_ARGMIN || (n->op == CK_OP_TOPK && k == 1) ||
                     n->op == CK_OP_SHAPE || n->op == CK_OP_SIZE)
                t = CK_DT_I64;
            else if (n->op == CK_OP_CONSTANT_OF_SHAPE) /* p.ints = [integer] */
                t = n->p.nints >= 1 && n->p.ints[0] == 1 ? CK_DT_I64 : CK_DT_F32;
            e->values[en->out[k]].dtype = t == CK_DT_INVALID ? CK_DT_F32 : t;
        }
    }
}

void ck_infer_values_free(struct ck_infer *e)
{
    for (size_t i = 0; i < e->nvalues; i++)
        if (e->values[i].owned)
            free(e->values[i].data);
    if (e->nodes)
        for (size_t i = 0; i < e->m->nnodes; i++) {
            free(e->nodes[i].in);
            free(e->nodes[i].wpack);
        }
    free(e->nodes);
    free(e->values);
    free(e->map);
}
