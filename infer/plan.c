/* The memory plan of one run: every value's shape from the input shapes,
 * the node after which each value is dead, and a pool of buffers where a
 * node's outputs take the smallest free buffer that fits (or grow the largest
 * free one, or a new one). A buffer comes back to the pool after the last
 * node reading it, so a chain of layers lives in about two buffers: the peak
 * is near the weights plus the two largest live activations.
 *
 * The buffers (and the scratch) are kept from one run to the next: every
 * run plans again from its own input shapes (the shapes and the assignment
 * take microseconds; nothing assumes the shapes of the last run), and only a
 * buffer the new plan needs larger than the one held is allocated again, so
 * `--repeat` and runs at the same shapes touch no new page (allocating them
 * per run cost a sixth of efficientnet_b0's time in page faults). A run at
 * other shapes (another batch) reuses the buffers that fit and replaces the
 * others; buffers the new plan does not use are freed. */
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
    int64_t s = n->op == CK_OP_CONV2D && e->nodes[i].wpack
                    ? ck_infer_conv_packed_scratch_floats(n, in, out)
                    : ck_infer_scratch_floats(n, in, out);
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

/* The plan's buffers by index, each one's cap what this plan needs; the
 * allocations of the last plan stay with their index. */
static int assign(struct ck_infer *e)
{
    /* at most one buffer per node output */
    size_t most = 1;
    for (size_t i = 0; i < e->m->nnodes; i++)
        most += e->m->nodes[i].noutputs;
    if (most > e->bufs_cap) {
        struct ck_buffer *b = realloc(e->bufs, most * sizeof *b);
        if (!b)
            return ck_error(CK_ENOMEM, "out of memory for the plan");
        memset(b + e->bufs_cap, 0, (most - e->bufs_cap) * sizeof *b);
        e->bufs = b;
        e->bufs_cap = most;
    }
    for (size_t b = 0; b < e->bufs_cap; b++)
        e->bufs[b].cap = 0;
    e->nbufs = 0;
    bool *busy = calloc(most, sizeof(bool));
    if (!busy)
        return ck_error(CK_ENOMEM, "out of memory for the plan");
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

static void drop(struct ck_buffer *b)
{
    free(b->data);
    b->data = NULL;
    b->held = 0;
}

/* Floats held once every buffer fits its plan (kept where it does). */
static uint64_t held_after(const struct ck_infer *e)
{
    uint64_t floats = (uint64_t)(e->scratch.held >= e->scratch_floats ? e->scratch.held
                                                                       : e->scratch_floats);
    for (size_t b = 0; b < e->nbufs; b++)
        floats += (uint64_t)(e->bufs[b].held >= e->bufs[b].cap ? e->bufs[b].held : e->bufs[b].cap);
    return floats;
}

static int fit(struct ck_buffer *b, int64_t need)
{
    if (b->held >= need && b->data)
        return 0;
    drop(b);
    if (!(b->data = malloc(sizeof(float) * (size_t)(need ? need : 1))))
        return ck_error(CK_ENOMEM, "out of memory for %lld activation values", (long long)need);
    b->held = need;
    return 0;
}

int ck_infer_plan_shapes(struct ck_infer *e)
{
    int err;
    ck_infer_shapeval_release(e); /* the shape values of the run before */
    e->plan_stopped = false;
    e->scratch_floats = 0;
    for (size_t v = 0; v < e->nvalues; v++)
        if (e->values[v].kind == CK_VALUE_NODE) {
            e->values[v].data = NULL;
            e->values[v].buf = -1;
        }
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

static void release_buffers(struct ck_infer *e);

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
    uint64_t need = (uint64_t)e->scratch_floats;
    for (size_t b = 0; b < e->nbufs; b++)
        need += (uint64_t)e->bufs[b].cap;
    need *= sizeof(float);
    if (e->o.max_memory && need + e->weight_bytes > e->o.max_memory)
        return ck_error(CK_ENOMEM,
                        "the model needs %llu MiB of activations and %llu MiB of converted "
                        "weights, over the limit of %llu MiB",
                        (unsigned long long)(need >> 20),
                        (unsigned long long)(e->weight_bytes >> 20),
                        (unsigned long long)(e->o.max_memory >> 20));
    /* buffers this plan does not use are freed; those kept larger than the
     * plan needs are freed too when keeping them would pass the limit */
    for (size_t b = e->nbufs; b < e->bufs_cap; b++)
        drop(&e->bufs[b]);
    if (e->o.max_memory && held_after(e) * sizeof(float) + e->weight_bytes > e->o.max_memory) {
        release_buffers(e); /* the shape values this plan computed stay */
        if ((err = assign(e)) < 0)
            return err;
    }
    /* freed before any is allocated: a buffer replaced never adds to the peak */
    for (size_t b = 0; b < e->nbufs; b++)
        if (e->bufs[b].held < e->bufs[b].cap)
            drop(&e->bufs[b]);
    if (e->scratch.held < e->scratch_floats)
        drop(&e->scratch);
    for (size_t b = 0; b < e->nbufs; b++)
        if ((err = fit(&e->bufs[b], e->bufs[b].cap)) < 0)
            return err;
    if ((err = fit(&e->scratch, e->scratch_floats)) < 0)
        return err;
    e->peak_bytes = held_after(e) * sizeof(float);
    for (size_t v = 0; v < e->nvalues; v++)
        if (e->values[v].kind == CK_VALUE_NODE && e->values[v].buf >= 0 && !e->values[v].planned)
            e->values[v].data = e->bufs[e->values[v].buf].data;
    return 0;
}

/* The activation buffers and the scratch, not the run's shape values (the
 * plan computed them; ck_infer_shapeval_release frees them). */
static void release_buffers(struct ck_infer *e)
{
    for (size_t b = 0; b < e->bufs_cap; b++)
        drop(&e->bufs[b]);
    free(e->bufs);
    e->bufs = NULL;
    e->nbufs = e->bufs_cap = 0;
    drop(&e->scratch);
    for (size_t v = 0; v < e->nvalues; v++)
        if (e->values[v].kind == CK_VALUE_NODE && !e->values[v].planned) {
            e->values[v].data = NULL;
            e->values[v].buf = -1;
        }
}

void ck_infer_plan_release(struct ck_infer *e)
{
    ck_infer_shapeval_release(e);
    release_buffers(e);
}
