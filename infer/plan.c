/* The memory plan of one run: every value's shape from the input shapes,
 * the node after which each value is dead, and a pool of buffers where a
 * node's outputs take the smallest free buffer that fits (or grow the largest
 * free one, or a new one). A buffer comes back to the pool after the last
 * node reading it, so a chain of layers lives in about two buffers: the peak
 * is near the weights plus the two largest live activations. */
#include "infer/engine.h"
#include "common/error.h"

#include <stdlib.h>
#include <string.h>

static int node_shapes(struct ck_infer *e, size_t i)
{
    const struct ck_model_node *n = ck_infer_node_of(e, i);
    size_t nin = ck_infer_node_nin(e, i);
    struct ck_ishape ins[16], outs[16];
    struct ck_ishape *in = nin > 16 ? calloc(nin, sizeof *in) : ins;
    struct ck_ishape *out = n->noutputs > 16 ? calloc(n->noutputs, sizeof *out) : outs;
    int err = 0;
    if (!in || !out) {
        err = ck_error(CK_ENOMEM, "out of memory for the shapes of node '%s'", n->name);
        goto out;
    }
    for (size_t k = 0; k < nin; k++) {
        const struct ck_value *v = &e->values[e->nodes[i].in[k]];
        if (v->planned && v->inexact) {
            err = ck_error(CK_EFORMAT,
                           "node '%s' (%s): input '%s' holds an integer past 2^24, which "
                           "float32 cannot give the kernel exactly",
                           n->name, ck_op_name(n->op), v->name);
            goto out;
        }
        in[k] = v->shape;
    }
    if ((err = ck_infer_node_shapes(n, in, nin, out)) < 0)
        goto out;
    for (size_t k = 0; k < n->noutputs; k++) {
        if (ck_ishape_numel(&out[k]) < 0) {
            err = ck_error(CK_EFORMAT, "node '%s' (%s): output %zu has too many elements",
                           n->name, ck_op_name(n->op), k);
            goto out;
        }
        e->values[e->nodes[i].out[k]].shape = out[k];
    }
    int64_t s = ck_infer_scratch_floats(n, in, out);
    if (s > e->scratch_floats)
        e->scratch_floats = s;
out:
    if (in != ins)
        free(in);
    if (out != outs)
        free(out);
    return err;
}

static void liveness(struct ck_infer *e)
{
    for (size_t v = 0; v < e->nvalues; v++)
        e->values[v].last_use = e->values[v].graph_output ? INT32_MAX : -1;
    for (size_t i = 0; i < e->m->nnodes; i++)
        for (size_t k = 0; !e->nodes[i].skip && !e->nodes[i].planned && k < e->nodes[i].nin;
             k++) {
            struct ck_value *v = &e->values[e->nodes[i].in[k]];
            if (v->last_use != INT32_MAX)
                v->last_use = (int)i;
        }
}

/* Picks a buffer for need floats among the free ones; -1: a new one. */
static int pick(const struct ck_infer *e, const bool *busy, int64_t need)
{
    int best = -1, largest = -1;
    for (size_t b = 0; b < e->nbufs; b++) {
        if (busy[b])
            continue;
        if (e->bufs[b].cap >= need && (best < 0 || e->bufs[b].cap < e->bufs[best].cap))
            best = (int)b;
        if (largest < 0 || e->bufs[b].cap > e->bufs[largest].cap)
            largest = (int)b;
    }
    return best >= 0 ? best : largest;
}

static int assign(struct ck_infer *e)
{
    /* at most one buffer per node output */
    size_t most = 1;
    for (size_t i = 0; i < e->m->nnodes; i++)
        most += e->m->nodes[i].noutputs;
    bool *busy = calloc(most, sizeof(bool));
    e->bufs = calloc(most, sizeof *e->bufs);
    if (!busy || !e->bufs) {
        free(busy);
        return ck_error(CK_ENOMEM, "out of memory for the plan");
    }
    for (size_t i = 0; i < e->m->nnodes; i++) {
        const struct ck_model_node *n = &e->m->nodes[i];
        if (e->nodes[i].skip || e->nodes[i].planned)
            continue;
        for (size_t k = 0; k < n->noutputs; k++) {
            struct ck_value *v = &e->values[e->nodes[i].out[k]];
            int64_t need = ck_ishape_numel(&v->shape);
            int b = pick(e, busy, need ? need : 1);
            if (b < 0)
                b = (int)e->nbufs++;
            if (e->bufs[b].cap < need)
                e->bufs[b].cap = need;
            if (e->bufs[b].cap == 0)
                e->bufs[b].cap = 1;
            busy[b] = true;
            v->buf = b;
        }
        for (size_t k = 0; k < e->nodes[i].nin; k++) {
            const struct ck_value *v = &e->values[e->nodes[i].in[k]];
            if (v->kind == CK_VALUE_NODE && v->buf >= 0 && v->last_use == (int)i)
                busy[v->buf] = false;
        }
        for (size_t k = 0; k < n->noutputs; k++) {
            const struct ck_value *v = &e->values[e->nodes[i].out[k]];
            if (v->last_use < 0)
                busy[v->buf] = false;
        }
    }
    free(busy);
    return 0;
}

int ck_infer_plan_shapes(struct ck_infer *e)
{
    int err;
    ck_infer_plan_release(e);
    e->plan_stopped = false;
    for (size_t i = 0; i < e->m->nnodes; i++) {
        bool planned = false;
        if (e->nodes[i].skip)
            continue;
        if ((err = ck_infer_shapeval_plan(e, i, &planned)) != 0) {
            e->plan_stopped = err > 0; /* the rest needs the inputs' values */
            return err < 0 ? err : 0;
        }
        if (!planned && (err = node_shapes(e, i)) < 0)
            return err;
    }
    return 0;
}

int ck_infer_plan(struct ck_infer *e)
{
    int err;
    if ((err = ck_infer_plan_shapes(e)) < 0)
        return err;
    if (e->plan_stopped)
        return ck_error(CK_EFORMAT, "an integer input that gives a shape has no values");
    liveness(e);
    if ((err = assign(e)) < 0)
        return err;
    uint64_t floats = (uint64_t)e->scratch_floats;
    for (size_t b = 0; b < e->nbufs; b++)
        floats += (uint64_t)e->bufs[b].cap;
    e->peak_bytes = floats * sizeof(float);
    if (e->o.max_memory && e->peak_bytes + e->weight_bytes > e->o.max_memory)
        return ck_error(CK_ENOMEM,
                        "the model needs %llu MiB of activations and %llu MiB of converted "
                        "weights, over the limit of %llu MiB",
                        (unsigned long long)(e->peak_bytes >> 20),
                        (unsigned long long)(e->weight_bytes >> 20),
                        (unsigned long long)(e->o.max_memory >> 20));
    for (size_t b = 0; b < e->nbufs; b++)
        if (!(e->bufs[b].data = malloc(sizeof(float) * (size_t)e->bufs[b].cap)))
            return ck_error(CK_ENOMEM, "out of memory for %lld activation values",
                            (long long)e->bufs[b].cap);
    for (size_t v = 0; v < e->nvalues; v++)
        if (e->values[v].kind == CK_VALUE_NODE && e->values[v].buf >= 0 && !e->values[v].planned)
            e->values[v].data = e->bufs[e->values[v].buf].data;
    return 0;
}

void ck_infer_plan_release(struct ck_infer *e)
{
    ck_infer_shapeval_release(e);
    for (size_t b = 0; b < e->nbufs; b++)
        free(e->bufs[b].data);
    free(e->bufs);
    e->bufs = NULL;
    e->nbufs = 0;
    e->scratch_floats = 0;
    for (size_t v = 0; v < e->nvalues; v++)
        if (e->values[v].kind == CK_VALUE_NODE) {
            e->values[v].data = NULL;
            e->values[v].buf = -1;
        }
}
