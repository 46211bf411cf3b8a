/* The engine's entry points: load (check, convert weights), run (bind the
 * inputs, plan, run each node's kernel, copy the outputs out). */
#include "infer/engine.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int ck_infer_array_init(struct ck_infer_array *a, const char *name, int rank, const int64_t *dims)
{
    memset(a, 0, sizeof *a);
    if (rank < 0 || rank > CK_INFER_MAX_RANK)
        return ck_error(CK_ESIZE, "rank %d over %d", rank, CK_INFER_MAX_RANK);
    a->rank = rank;
    memcpy(a->dims, dims, sizeof(int64_t) * (size_t)rank);
    struct ck_ishape s = {rank, {0}};
    memcpy(s.d, dims, sizeof(int64_t) * (size_t)rank);
    int64_t n = ck_ishape_numel(&s);
    if (n < 0)
        return ck_error(CK_ESIZE, "array '%s': too many elements", name ? name : "");
    a->data = calloc((size_t)(n ? n : 1), sizeof(float));
    a->name = name ? strdup(name) : NULL;
    if (!a->data || (name && !a->name)) {
        ck_infer_array_release(a);
        return ck_error(CK_ENOMEM, "out of memory for an array of %lld values", (long long)n);
    }
    return 0;
}

int ck_infer_default_input(const struct ck_model_io *io, size_t k, uint64_t max_values,
                           struct ck_infer_array *out)
{
    memset(out, 0, sizeof *out);
    if (io->rank > CK_INFER_MAX_RANK)
        return ck_error(CK_EFORMAT, "input '%s': rank %d", io->name, io->rank);
    struct ck_ishape s = {io->rank, {0}};
    for (int d = 0; d < io->rank; d++)
        s.d[d] = io->dims[d] < 0 ? 1 : io->dims[d];
    int64_t n = ck_ishape_numel(&s);
    if (max_values && (n < 0 || (uint64_t)n > max_values))
        return ck_error(CK_ESIZE, "input '%s': more than %llu values", io->name,
                        (unsigned long long)max_values);
    int err = ck_infer_array_init(out, io->name, io->rank, s.d);
    if (err < 0)
        return err;
    for (int64_t i = 0; i < n; i++)
        out->data[i] = (float)sin(0.5 * (double)i + (double)k);
    return 0;
}

uint64_t ck_infer_array_numel(const struct ck_infer_array *a)
{
    uint64_t n = 1;
    for (int i = 0; i < a->rank; i++)
        n *= (uint64_t)a->dims[i];
    return n;
}

void ck_infer_array_release(struct ck_infer_array *a)
{
    free(a->data);
    free(a->name);
    a->data = NULL;
    a->name = NULL;
}

void ck_infer_arrays_free(struct ck_infer_array *a, size_t n)
{
    if (!a)
        return;
    for (size_t i = 0; i < n; i++)
        ck_infer_array_release(&a[i]);
    free(a);
}

static int check_io(const struct ck_model_io *io, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (io[i].rank > CK_INFER_MAX_RANK)
            return ck_error(CK_EFORMAT, "%s '%s': rank %d, the engine runs at most %d", what,
                            io[i].name, io[i].rank, CK_INFER_MAX_RANK);
    return 0;
}

int ck_infer_check(const struct ck_model *m)
{
    int err = ck_model_check(m);
    if (err == 0)
        err = check_io(m->inputs, m->ninputs, "input");
    if (err == 0)
        err = check_io(m->outputs, m->noutputs, "output");
    return err < 0 ? err : ck_infer_check_nodes(m);
}

static int bind_inputs(struct ck_infer *e, const struct ck_infer_array *in, size_t nin);

int ck_infer_check_shapes(const struct ck_model *m)
{
    struct ck_infer *e = NULL;
    int err = ck_infer_new(m, NULL, &e);
    if (err < 0)
        return err;
    struct ck_infer_array *in = calloc(m->ninputs + 1, sizeof *in);
    if (!in) {
        ck_infer_free(e);
        return ck_error(CK_ENOMEM, "out of memory for the input shapes");
    }
    for (size_t i = 0; i < m->ninputs; i++) { /* ranks checked by ck_infer_check */
        in[i].rank = m->inputs[i].rank;
        for (int d = 0; d < in[i].rank; d++)
            in[i].dims[d] = m->inputs[i].dims[d] < 0 ? 1 : m->inputs[i].dims[d];
    }
    if ((err = bind_inputs(e, in, m->ninputs)) == 0 && (err = ck_infer_plan_shapes(e)) < 0)
        err = ck_error_wrap(err, "with every input at its declared shape (-1 as 1)");
    free(in); /* names and data not owned: shapes only */
    ck_infer_free(e);
    return err;
}

int ck_infer_check_float32(const struct ck_model *m)
{
    struct ck_infer e = {.m = m, .dtypes_only = true};
    int err = ck_infer_values_build(&e);
    /* shape values (docs/model.md): integers computed from shapes, which the
     * plan evaluates exactly in int64 whatever the archive holds; a node is
     * one when it is a shape op or all its inputs are weights or shape
     * values, one of them a shape value */
    bool *shapeval = err == 0 ? calloc(e.nvalues ? e.nvalues : 1, sizeof *shapeval) : NULL;
    if (err == 0 && !shapeval)
        err = ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; err == 0 && i < m->nnodes; i++) {
        const struct ck_model_node *n = &m->nodes[i];
        const struct ck_enode *en = &e.nodes[i];
        if (!n->noutputs)
            continue;
        bool sv = n->op == CK_OP_SHAPE || n->op == CK_OP_SIZE || n->op == CK_OP_RANGE ||
                  n->op == CK_OP_CONSTANT_OF_SHAPE, from = false, rest = true;
        for (size_t k = 0; !sv && k < en->nin; k++) {
            from = from || shapeval[en->in[k]];
            rest = rest && (shapeval[en->in[k]] || e.values[en->in[k]].kind == CK_VALUE_WEIGHT);
        }
        if (sv || (from && rest)) {
            for (size_t k = 0; k < n->noutputs; k++)
                shapeval[en->out[k]] = true;
            continue;
        }
        enum ck_dtype in[16], out = e.values[en->out[0]].dtype;
        size_t nin = en->nin < 16 ? en->nin : 16;
        for (size_t k = 0; k < nin; k++)
            in[k] = e.values[en->in[k]].dtype;
        const char *why = NULL;
        if (out == CK_DT_F16 || out == CK_DT_BF16)
            why = "rounds to a 16-bit float";
        else if (n->op == CK_OP_CAST && out != CK_DT_F32 && out != CK_DT_F64)
            why = "casts to an integer or bool";
        else if (ck_infer_int_node(n, in, nin, out))
            why = "computes on integers";
        if (why)
            err = ck_error(CK_EUNSUPPORTED,
                           "node '%s' (%s) %s (%s), and the archive formats hold float32 "
                           "values without their dtypes: it would compute in float32",
                           n->name, ck_op_name(n->op), why, ck_dtype_name(out));
    }
    free(shapeval);
    ck_infer_values_free(&e);
    return err;
}

int ck_infer_check_nodes(const struct ck_model *m)
{
    int err = 0;
    for (size_t i = 0; i < m->nnodes && err == 0; i++) {
        const struct ck_model_node *n = &m->nodes[i];
        if (!ck_infer_op_is_supported(n->op))
            err = ck_error(CK_EUNSUPPORTED, "node '%s': op '%s' is not one the inference engine runs",
                           n->name, ck_op_name(n->op));
    }
    return err;
}

int ck_infer_new(const struct ck_model *m, const struct ck_infer_options *o, struct ck_infer **out)
{
    int err;
    *out = NULL;
    if ((err = ck_infer_check(m)) < 0)
        return err;
    struct ck_infer *e = calloc(1, sizeof *e);
    if (!e)
        return ck_error(CK_ENOMEM, "out of memory for the engine");
    e->m = m;
    if (o)
        e->o = *o;
    if ((err = ck_infer_values_build(e)) < 0 || (err = ck_infer_fuse(e)) < 0 ||
        (err = ck_infer_prepack(e)) < 0 || (err = ck_pool_new(e->o.threads, &e->pool)) < 0) {
        ck_infer_free(e);
        return err;
    }
    if (e->pool)
        ck_debug("infer.threads", "count=%d", ck_pool_threads(e->pool));
    *out = e;
    return 0;
}

void ck_infer_free(struct ck_infer *e)
{
    if (!e)
        return;
    ck_pool_free(e->pool);
    ck_infer_plan_release(e);
    ck_infer_values_free(e);
    free(e->node_seconds);
    free(e);
}

static int bind_inputs(struct ck_infer *e, const struct ck_infer_array *in, size_t nin)
{
    const struct ck_model *m = e->m;
    if (nin != m->ninputs)
        return ck_error(CK_EFORMAT, "the model takes %zu inputs, %zu given", m->ninputs, nin);
    for (size_t i = 0; i < nin; i++) {
        const struct ck_model_io *io = &m->inputs[i];
        bool ok = io->rank == in[i].rank;
        for (int d = 0; ok && d < io->rank; d++)
            ok = io->dims[d] < 0 || io->dims[d] == in[i].dims[d];
        if (!ok) {
            struct ck_ishape want = {io->rank < CK_INFER_MAX_RANK ? io->rank : CK_INFER_MAX_RANK,
                                     {0}};
            struct ck_ishape got = {in[i].rank, {0}};
            memcpy(want.d, io->dims, sizeof(int64_t) * (size_t)want.rank);
            memcpy(got.d, in[i].dims, sizeof(int64_t) * (size_t)got.rank);
            char sw[160], sg[160];
            return ck_error(CK_EFORMAT, "input '%s': shape %s does not match the model's %s%s",
                            io->name, ck_ishape_text(&got, sg, sizeof sg),
                            ck_ishape_text(&want, sw, sizeof sw),
                            io->rank && io->dims[0] < 0 ? " (-1: any size)" : "");
        }
        struct ck_value *v = &e->values[ck_infer_value_find(e, io->name)];
        /* a graph input shadowed by a node output keeps its own index: find the first */
        for (size_t k = 0; k < e->nvalues; k++)
            if (e->values[k].kind == CK_VALUE_INPUT && strcmp(e->values[k].name, io->name) == 0) {
                v = &e->values[k];
                break;
            }
        v->shape.rank = in[i].rank;
        memcpy(v->shape.d, in[i].dims, sizeof(int64_t) * (size_t)in[i].rank);
        v->data = in[i].data;
    }
    return 0;
}

/* The pointers and shapes of one node's inputs and outputs, sized once per
 * run for the node with the most (a DenseNet concat has dozens). */
struct node_io {
    const float **inp;
    float **outp;
    struct ck_ishape *ins, *outs;
    enum ck_dtype *indt, *outdt;
};

static int node_io_new(const struct ck_model *m, struct node_io *io)
{
    size_t most = 3; /* a folded batch norm's bias */
    for (size_t i = 0; i < m->nnodes; i++) {
        if (m->nodes[i].ninputs > most)
            most = m->nodes[i].ninputs;
        if (m->nodes[i].noutputs > most)
            most = m->nodes[i].noutputs;
    }
    io->inp = calloc(most, sizeof *io->inp);
    io->outp = calloc(most, sizeof *io->outp);
    io->ins = calloc(most, sizeof *io->ins);
    io->outs = calloc(most, sizeof *io->outs);
    io->indt = calloc(2 * most, sizeof *io->indt);
    io->outdt = io->indt ? io->indt + most : NULL;
    if (!io->inp || !io->outp || !io->ins || !io->outs || !io->indt)
        return ck_error(CK_ENOMEM, "out of memory for nodes of %zu inputs or outputs", most);
    return 0;
}

static void node_io_release(struct node_io *io)
{
    free(io->inp);
    free(io->outp);
    free(io->ins);
    free(io->outs);
    free(io->indt);
}

static int run_node(struct ck_infer *e, size_t i, float *scratch, struct node_io *io)
{
    const struct ck_model_node *n = ck_infer_node_of(e, i);
    size_t nin = ck_infer_node_nin(e, i);
    for (size_t k = 0; k < nin; k++) {
        io->inp[k] = e->values[e->nodes[i].in[k]].data;
        io->ins[k] = e->values[e->nodes[i].in[k]].shape;
        io->indt[k] = e->values[e->nodes[i].in[k]].dtype;
    }
    for (size_t k = 0; k < n->noutputs; k++) {
        io->outp[k] = e->values[e->nodes[i].out[k]].data;
        io->outs[k] = e->values[e->nodes[i].out[k]].shape;
        io->outdt[k] = e->values[e->nodes[i].out[k]].dtype;
    }
    const struct ck_enode *en = &e->nodes[i];
    struct ck_kcall k = {n,       io->inp, io->ins,    nin,        io->outp,   io->outs,
                         e->o.naive_gemm, scratch, en->act, en->act_min, en->act_max,
                         io->indt, io->outdt, e->pool, en->wpack};
    int err = ck_infer_kernel(&k);
    /* a float16 (bfloat16) value holds what float16 arithmetic gives: the
     * float32 result rounded once to the dtype */
    for (size_t o = 0; err == 0 && o < n->noutputs; o++)
        ck_infer_round_to(io->outdt[o], io->outp[o], ck_ishape_numel(&io->outs[o]));
    return err;
}

static int copy_outputs(struct ck_infer *e, struct ck_infer_array **outputs, size_t *noutputs)
{
    const struct ck_model *m = e->m;
    struct ck_infer_array *a = calloc(m->noutputs, sizeof *a);
    int err;
    if (!a)
        return ck_error(CK_ENOMEM, "out of memory for the outputs");
    for (size_t i = 0; i < m->noutputs; i++) {
        const struct ck_value *v = &e->values[ck_infer_value_find(e, m->outputs[i].name)];
        if ((err = ck_infer_array_init(&a[i], m->outputs[i].name, v->shape.rank, v->shape.d)) < 0) {
            ck_infer_arrays_free(a, m->noutputs);
            return err;
        }
        memcpy(a[i].data, v->data, sizeof(float) * (size_t)ck_ishape_numel(&v->shape));
    }
    *outputs = a;
    *noutputs = m->noutputs;
    return 0;
}

int ck_infer_run(struct ck_infer *e, const struct ck_infer_array *inputs, size_t ninputs,
                 struct ck_infer_array **outputs, size_t *noutputs)
{
    int err;
    struct node_io io = {0};
    *outputs = NULL;
    *noutputs = 0;
    if ((err = bind_inputs(e, inputs, ninputs)) < 0 || (err = ck_infer_plan(e)) < 0 ||
        (err = node_io_new(e->m, &io)) < 0)
        goto out;
    free(e->node_seconds);
    e->node_seconds = calloc(e->m->nnodes + 1, sizeof(double));
    if (!e->node_seconds) {
        err = ck_error(CK_ENOMEM, "out of memory for the node timings");
        goto out;
    }
    for (size_t i = 0; i < e->m->nnodes; i++) {
        if (e->nodes[i].skip || e->nodes[i].planned)
            continue;
        double t0 = ck_mono_s();
        if ((err = run_node(e, i, e->scratch.data, &io)) < 0)
            goto out;
        e->node_seconds[i] = ck_mono_s() - t0;
    }
    err = copy_outputs(e, outputs, noutputs);
out:
    node_io_release(&io);
    if (err < 0) /* the buffers stay for the next run only after a good one */
        ck_infer_plan_release(e);
    return err;
}

uint64_t ck_infer_peak_activation_bytes(const struct ck_infer *e)
{
    return e->peak_bytes;
}

uint64_t ck_infer_weight_bytes(const struct ck_infer *e)
{
    return e->weight_bytes;
}

const double *ck_infer_node_seconds(const struct ck_infer *e)
{
    return e->node_seconds;
}

size_t ck_infer_fused_nodes(const struct ck_infer *e)
{
    return e->fused;
}
