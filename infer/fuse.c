/* Load-time folds of the engine's node table (the model is not changed):
 * - a BatchNormalization whose input is a convolution's output read by
 *   nothing else becomes that convolution's weights and bias,
 *     W' = W s, b' = (b - mean) s + beta, s = gamma / sqrt(var + eps)
 *   per output channel, in double, rounded once;
 * - an activation (relu, clip, sigmoid, gelu) that is the only reader of a
 *   convolution's or dense layer's output, or a sigmoid and the product of
 *   its input with it (silu) that are its only two readers, runs in that
 *   node's epilogue, after the bias (kernels_linear.c).
 * The folded nodes are then not run; the node before them writes their
 * output.
 * Then (ck_infer_prepack) the weights of each convolution, dense layer and
 * matmul by a constant matrix are packed once for the products of pgemm.c,
 * where the CPU runs them. */
#include "infer/engine.h"
#include "common/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Reads of each value by the nodes not skipped, and the last node reading it. */
struct readers {
    int *count, *first, *last;
};

static int readers_build(const struct ck_infer *e, struct readers *r)
{
    r->count = calloc(e->nvalues + 1, sizeof(int));
    r->first = calloc(e->nvalues + 1, sizeof(int));
    r->last = calloc(e->nvalues + 1, sizeof(int));
    if (!r->count || !r->first || !r->last)
        return ck_error(CK_ENOMEM, "out of memory for the node table's readers");
    for (size_t i = 0; i < e->m->nnodes; i++)
        for (size_t k = 0; !e->nodes[i].skip && k < e->nodes[i].nin; k++) {
            if (r->count[e->nodes[i].in[k]]++ == 0)
                r->first[e->nodes[i].in[k]] = (int)i;
            r->last[e->nodes[i].in[k]] = (int)i;
        }
    return 0;
}

/* The one node reading node i's only output, -1 when there is none or more
 * (or the output is a graph output). */
static int only_reader(const struct ck_infer *e, const struct readers *r, size_t i)
{
    if (e->m->nodes[i].noutputs != 1)
        return -1;
    int v = e->nodes[i].out[0];
    if (e->values[v].graph_output || r->count[v] != 1)
        return -1;
    return r->last[v];
}

static bool is_weight(const struct ck_infer *e, int v, int64_t numel)
{
    return e->values[v].kind == CK_VALUE_WEIGHT && ck_ishape_numel(&e->values[v].shape) == numel;
}

/* A weight value the engine owns, not in the name table (a folded copy). */
static int value_new(struct ck_infer *e, const char *name, const struct ck_ishape *shape,
                     int64_t numel)
{
    if (e->nvalues == e->values_cap) {
        size_t cap = e->values_cap * 2 + 1;
        struct ck_value *v = realloc(e->values, sizeof *v * cap);
        if (!v)
            return ck_error(CK_ENOMEM, "out of memory for the value table");
        e->values = v;
        e->values_cap = cap;
    }
    float *d = malloc(sizeof(float) * (size_t)(numel ? numel : 1));
    if (!d)
        return ck_error(CK_ENOMEM, "'%s': out of memory for %lld folded weights", name,
                        (long long)numel);
    e->values[e->nvalues] = (struct ck_value){.name = name, .kind = CK_VALUE_WEIGHT,
                                              .shape = *shape, .data = d, .owned = true,
                                              .buf = -1};
    e->weight_bytes += sizeof(float) * (uint64_t)numel;
    return (int)e->nvalues++;
}

/* Weight v, which no node reads any more: its converted copy freed, the
 * pages of a mapped file it was read from in place dropped (the folded
 * copy replaces it, so memory does not grow by the convolution's weights). */
static void weight_release(struct ck_infer *e, const struct readers *r, int v)
{
    struct ck_value *w = &e->values[v];
    uint64_t bytes = sizeof(float) * (uint64_t)ck_ishape_numel(&w->shape);
    if (r->count[v] != 1 || w->graph_output || !w->data)
        return;
    if (w->owned) {
        free(w->data);
        e->weight_bytes -= bytes;
    } else {
        ck_tensor_set_drop_pages(e->m->weights, w->data, bytes);
    }
    w->data = NULL;
    w->owned = false;
}

/* Node c (conv2d) and node b (its batch norm, the only reader): c gets the
 * folded weight and bias and writes b's output; b is skipped. */
static int fold_batchnorm(struct ck_infer *e, const struct readers *r, size_t c, size_t b)
{
    struct ck_enode *cn = &e->nodes[c], *bn = &e->nodes[b];
    const struct ck_model_node *bm = &e->m->nodes[b];
    const struct ck_ishape ws = e->values[cn->in[1]].shape;
    int64_t oc = ws.d[0], per = oc ? ck_ishape_numel(&ws) / oc : 0;
    int w = value_new(e, bm->name, &ws, oc * per);
    if (w < 0)
        return w;
    struct ck_ishape bs = {1, {oc}};
    int bias = value_new(e, bm->name, &bs, oc);
    if (bias < 0)
        return bias;
    /* the node's input array has room for the bias only when it had one */
    if (cn->nin < 3) {
        int *in = calloc(3 + e->m->nodes[c].noutputs, sizeof(int));
        if (!in)
            return ck_error(CK_ENOMEM, "out of memory for the node table");
        memcpy(in, cn->in, sizeof(int) * cn->nin);
        free(cn->in);
        cn->in = in;
        cn->out = in + 3;
    }
    const float *w0 = e->values[cn->in[1]].data;
    const float *b0 = cn->nin > 2 ? e->values[cn->in[2]].data : NULL;
    const float *gamma = bn->nin > 1 ? e->values[bn->in[1]].data : NULL;
    const float *beta = bn->nin > 2 ? e->values[bn->in[2]].data : NULL;
    const float *mean = bn->nin > 3 ? e->values[bn->in[3]].data : NULL;
    const float *var = bn->nin > 4 ? e->values[bn->in[4]].data : NULL;
    float *w1 = e->values[w].data, *b1 = e->values[bias].data;
    for (int64_t o = 0; o < oc; o++) {
        double s = (gamma ? gamma[o] : 1.0) / sqrt((var ? var[o] : 1.0) + bm->p.eps);
        for (int64_t j = 0; j < per; j++)
            w1[o * per + j] = (float)(w0[o * per + j] * s);
        b1[o] = (float)(((b0 ? b0[o] : 0.0) - (mean ? mean[o] : 0.0)) * s +
                        (beta ? beta[o] : 0.0));
    }
    weight_release(e, r, cn->in[1]);
    if (cn->nin > 2)
        weight_release(e, r, cn->in[2]);
    cn->in[1] = w;
    cn->in[2] = bias;
    cn->nin = 3;
    cn->out[0] = bn->out[0];
    bn->skip = true;
    e->fused++;
    return 0;
}

/* Node b is a batch norm that can be folded into conv2d node c: over the
 * channels (axis 1 of NCHW), its parameters weights of one value per output
 * channel, the convolution's weight and bias weights. */
static bool batchnorm_folds(const struct ck_infer *e, size_t c, size_t b)
{
    const struct ck_model_node *cm = &e->m->nodes[c], *bm = &e->m->nodes[b];
    const struct ck_enode *cn = &e->nodes[c], *bn = &e->nodes[b];
    if (cm->op != CK_OP_CONV2D || bm->op != CK_OP_BATCHNORM || cn->nin < 2 || cn->nin > 3 ||
        bn->nin < 1 || bn->nin > 5 || bm->noutputs != 1 || bn->in[0] != cn->out[0])
        return false;
    const struct ck_ishape *ws = &e->values[cn->in[1]].shape;
    if (!is_weight(e, cn->in[1], ck_ishape_numel(ws)) || ws->rank != 4 ||
        ck_ishape_numel(ws) < 0 || ck_infer_norm_axis(ck_op_axis(&bm->p, 1), 4) != 1)
        return false;
    for (size_t k = 1; k < bn->nin; k++)
        if (bn->in[k] == cn->out[0] || !is_weight(e, bn->in[k], ws->d[0]))
            return false;
    return cn->nin < 3 || is_weight(e, cn->in[2], ws->d[0]);
}

/* The activation of node a when it can run in a producer's epilogue (one
 * input, which is v, one output), CK_ACT_NONE otherwise. */
static enum ck_infer_act activation_of(const struct ck_infer *e, int a, int v)
{
    const struct ck_model_node *am = &e->m->nodes[a];
    const struct ck_enode *an = &e->nodes[a];
    if (an->nin != 1 || am->noutputs != 1 || an->in[0] != v)
        return CK_ACT_NONE;
    switch (am->op) {
    case CK_OP_RELU: return CK_ACT_RELU;
    case CK_OP_CLIP: return CK_ACT_CLIP;
    case CK_OP_SIGMOID: return CK_ACT_SIGMOID;
    case CK_OP_GELU: return am->p.approx_tanh ? CK_ACT_GELU_TANH : CK_ACT_GELU;
    default: return CK_ACT_NONE;
    }
}

/* v's two readers are s = sigmoid(v) and m = v * s, s read by m alone: the
 * multiplication's output is silu(v). */
static bool is_silu(const struct ck_infer *e, const struct readers *r, int v)
{
    int s = r->first[v], m = r->last[v];
    if (r->count[v] != 2 || s == m || activation_of(e, s, v) != CK_ACT_SIGMOID)
        return false;
    const struct ck_model_node *mm = &e->m->nodes[m];
    const struct ck_enode *mn = &e->nodes[m];
    int sv = e->nodes[s].out[0];
    if (mm->op != CK_OP_MUL || mm->p.has_scalar || mn->nin != 2 || mm->noutputs != 1 ||
        e->values[sv].graph_output || r->count[sv] != 1)
        return false;
    return (mn->in[0] == v && mn->in[1] == sv) || (mn->in[0] == sv && mn->in[1] == v);
}

/* Node i (conv2d or dense) takes the activation after it into its epilogue. */
static void fold_activation(struct ck_infer *e, const struct readers *r, size_t i)
{
    struct ck_enode *pn = &e->nodes[i];
    int v = pn->out[0];
    if (e->m->nodes[i].noutputs != 1 || e->values[v].graph_output)
        return;
    if (is_silu(e, r, v)) {
        int s = r->first[v], m = r->last[v];
        pn->act = CK_ACT_SILU;
        pn->out[0] = e->nodes[m].out[0];
        e->nodes[s].skip = e->nodes[m].skip = true;
        e->fused += 2;
        return;
    }
    int a = r->count[v] == 1 ? r->last[v] : -1;
    enum ck_infer_act act = a > (int)i ? activation_of(e, a, v) : CK_ACT_NONE;
    if (act == CK_ACT_NONE)
        return;
    pn->act = act;
    pn->act_min = e->m->nodes[a].p.min;
    pn->act_max = e->m->nodes[a].p.max;
    pn->out[0] = e->nodes[a].out[0];
    e->nodes[a].skip = true;
    e->fused++;
}

int ck_infer_fuse(struct ck_infer *e)
{
    struct readers r = {0};
    int err = readers_build(e, &r);
    for (size_t i = 0; err == 0 && i < e->m->nnodes; i++) {
        enum ck_op op = e->m->nodes[i].op;
        if (e->nodes[i].skip || (op != CK_OP_CONV2D && op != CK_OP_DENSE))
            continue;
        int b = only_reader(e, &r, i);
        if (op == CK_OP_CONV2D && b > (int)i && batchnorm_folds(e, i, (size_t)b) &&
            (err = fold_batchnorm(e, &r, i, (size_t)b)) < 0)
            break;
        fold_activation(e, &r, i);
    }
    free(r.count);
    free(r.first);
    free(r.last);
    return err;
}

/* Node i computes on integers (kernels_int.c): it never reads a packed weight. */
static bool integers(const struct ck_infer *e, size_t i)
{
    const struct ck_enode *en = &e->nodes[i];
    enum ck_dtype in[16];
    size_t nin = en->nin < 16 ? en->nin : 16;
    for (size_t k = 0; k < nin; k++)
        in[k] = e->values[en->in[k]].dtype;
    return ck_infer_int_node(&e->m->nodes[i], in, nin, e->values[en->out[0]].dtype);
}

/* The pages of n floats at p, a part of weight w already packed: its own
 * copy's (they read as zeros from then on) or a mapped file's. */
static void drop_part(const struct ck_infer *e, const struct ck_value *w, const float *p,
                      int64_t n)
{
    if (w->owned)
        ck_tensor_drop_range(p, sizeof(float) * (uint64_t)n);
    else
        ck_tensor_set_drop_pages(e->m->weights, p, sizeof(float) * (uint64_t)n);
}

/* Weight v goes once its node has it packed: read by that node alone. */
static bool goes_after_packing(const struct ck_infer *e, const struct readers *r, int v)
{
    return r->count[v] == 1 && !e->values[v].graph_output && e->values[v].data;
}

/* Weight wv of node i packed for pgemm.c, NULL when it is not packed
 * (*err set on failure): a convolution's (not depthwise) by output
 * channels; a dense layer's, and a matmul's constant right side, by
 * columns (trans: wv is [n, k], the matrix the node multiplies by is its
 * transpose). */
static float *pack_weight(struct ck_infer *e, size_t i, int wv, bool trans, bool drop, int *err)
{
    const struct ck_model_node *n = &e->m->nodes[i];
    const struct ck_value *w = &e->values[wv];
    *err = 0;
    if (w->kind != CK_VALUE_WEIGHT || !w->data || integers(e, i))
        return NULL;
    int64_t total, g = n->p.groups, og = 0, kk = 0, k = 0, cols = 0;
    if (n->op == CK_OP_CONV2D) {
        if (w->shape.rank != 4 || g < 1 || w->shape.d[0] % g ||
            ck_infer_conv_is_depthwise(&n->p, &w->shape))
            return NULL;
        og = w->shape.d[0] / g, kk = w->shape.d[1] * w->shape.d[2] * w->shape.d[3];
        total = ck_infer_pgemm_pack_floats(og, kk) * g;
    } else {
        /* dense: W [in, out...] or [out, in]; matmul: B [k, n] beside a
         * matrix or a batch of them (a vector B is a batched product) */
        if (w->shape.rank < 2 || (trans && w->shape.rank != 2) ||
            (n->op == CK_OP_MATMUL && (w->shape.rank != 2 || e->nodes[i].nin != 2)))
            return NULL;
        k = trans ? w->shape.d[1] : w->shape.d[0];
        cols = k ? ck_ishape_numel(&w->shape) / k : 0;
        total = ck_infer_pgemm_packb_floats(k, cols);
        /* a few columns padded to a 32-column panel: up to 32 times the
         * weight, for a product memory-bound anyway (a hostile [2^28, 1]
         * weight would take 32 GiB); such a layer stays with OpenBLAS */
        if (total > 2 * k * cols)
            return NULL;
    }
    if (total <= 0)
        return NULL;
    float *wp = aligned_alloc(64, ((size_t)total * sizeof(float) + 63) / 64 * 64);
    if (!wp) {
        *err = ck_error(CK_ENOMEM, "node '%s': out of memory for %lld packed weights", n->name,
                        (long long)total);
        return NULL;
    }
    /* in parts of about 1 MiB of the weight, each part's pages let go once
     * packed when the weight goes after (drop): one weight of 64 MiB is not
     * held twice while it is packed */
    const int64_t part = INT64_C(1) << 18; /* floats */
    if (n->op == CK_OP_CONV2D) {
        int64_t per = ck_infer_pgemm_pack_floats(og, kk);
        int64_t rows = part / (kk ? kk : 1) / CK_PGEMM_MR * CK_PGEMM_MR;
        rows = rows < CK_PGEMM_MR ? CK_PGEMM_MR : rows;
        for (int64_t gi = 0; gi < g; gi++)
            for (int64_t r0 = 0; r0 < og; r0 += rows) {
                int64_t cnt = og - r0 < rows ? og - r0 : rows;
                const float *src = w->data + (gi * og + r0) * kk;
                ck_infer_pgemm_pack(cnt, kk, src, kk, wp + gi * per + r0 * kk);
                if (drop)
                    drop_part(e, w, src, cnt * kk);
            }
    } else if (trans) { /* W [cols, k]: panels of 32 of its rows */
        int64_t rows = part / (k ? k : 1) / CK_PGEMM_NR * CK_PGEMM_NR;
        rows = rows < CK_PGEMM_NR ? CK_PGEMM_NR : rows;
        for (int64_t r0 = 0; r0 < cols; r0 += rows) {
            int64_t cnt = cols - r0 < rows ? cols - r0 : rows;
            ck_infer_pgemm_packb(k, cnt, w->data + r0 * k, k, true, wp + r0 * k);
            if (drop)
                drop_part(e, w, w->data + r0 * k, cnt * k);
        }
    } else { /* W [k, cols]: its rows [k0, k1) into every panel */
        int64_t rows = part / (cols ? cols : 1);
        rows = rows < 1 ? 1 : rows;
        for (int64_t k0 = 0; k0 < k; k0 += rows) {
            int64_t k1 = k - k0 < rows ? k : k0 + rows;
            ck_infer_pgemm_packb_rows(k, cols, w->data, cols, false, k0, k1, wp);
            if (drop)
                drop_part(e, w, w->data + k0 * cols, (k1 - k0) * cols);
        }
    }
    e->weight_bytes += sizeof(float) * (uint64_t)total;
    return wp;
}

/* The weight whose transpose matmul node i multiplies by, -1 for none:
 * torch exports a Linear on a sequence as MatMul(x, Transpose(W)) (W [out,
 * in], perm [1, 0]); *t is the transpose node, whose output this matmul
 * alone reads. */
static int transposed_weight(const struct ck_infer *e, const struct readers *r,
                             const int *producer, size_t i, size_t *t)
{
    int v = e->nodes[i].in[1], p = producer[v];
    if (p < 0 || e->values[v].graph_output || r->count[v] != 1)
        return -1;
    const struct ck_model_node *tm = &e->m->nodes[p];
    const struct ck_enode *tn = &e->nodes[p];
    if (tm->op != CK_OP_TRANSPOSE || tn->skip || tn->nin != 1 || tm->noutputs != 1 ||
        tn->in[0] == v)
        return -1;
    int w = tn->in[0];
    if (e->values[w].kind != CK_VALUE_WEIGHT || e->values[w].shape.rank != 2 ||
        !(tm->p.nints == 0 || (tm->p.nints == 2 && tm->p.ints[0] == 1 && tm->p.ints[1] == 0)))
        return -1;
    *t = (size_t)p;
    return w;
}

/* A value of shape s and dtype dt that holds no data (the packed copy is
 * what the node reads): the right side of a matmul whose transpose is no
 * longer computed. */
static int shape_only_value(struct ck_infer *e, const char *name, const struct ck_ishape *s,
                            enum ck_dtype dt)
{
    int v = value_new(e, name, s, 0);
    if (v < 0)
        return v;
    free(e->values[v].data);
    e->values[v].data = NULL;
    e->values[v].owned = false;
    e->values[v].dtype = dt;
    return v;
}

/* Node i's weight packed (its wpack set), the weight's own copy released
 * when the node was its one reader. */
static int pack_node(struct ck_infer *e, const struct readers *r, const int *producer, size_t i)
{
    const struct ck_model_node *n = &e->m->nodes[i];
    struct ck_enode *en = &e->nodes[i];
    int err = 0;
    if (en->skip || en->nin < 2 ||
        (n->op != CK_OP_CONV2D && n->op != CK_OP_DENSE && n->op != CK_OP_MATMUL))
        return 0;
    size_t t = 0;
    int tw = n->op == CK_OP_MATMUL ? transposed_weight(e, r, producer, i, &t) : -1;
    if (tw >= 0) {
        if (!(en->wpack = pack_weight(e, i, tw, true, goes_after_packing(e, r, tw), &err)))
            return err;
        /* the transpose is not run: the matmul's right side is a value of
         * its shape with no data, and W's copy goes as for any packed weight */
        struct ck_ishape s = {2, {e->values[tw].shape.d[1], e->values[tw].shape.d[0]}};
        int v = shape_only_value(e, e->values[en->in[1]].name, &s, e->values[tw].dtype);
        if (v < 0)
            return v;
        en->in[1] = v;
        e->nodes[t].skip = true;
        e->fused++;
        weight_release(e, r, tw);
        return 0;
    }
    en->wpack = pack_weight(e, i, en->in[1], n->op == CK_OP_DENSE && n->p.trans_w,
                            goes_after_packing(e, r, en->in[1]), &err);
    /* the kernel reads the packed copy only: the weight's own copy (or its
     * pages of a mapped file) is released when this node was its one
     * reader, so the packed copy replaces it rather than doubling the
     * weights' memory */
    if (en->wpack)
        weight_release(e, r, en->in[1]);
    return err;
}

int ck_infer_prepack(struct ck_infer *e)
{
    if (e->o.naive_gemm || !ck_infer_pgemm_available())
        return 0;
    struct readers r = {0};
    int err = readers_build(e, &r);
    int *producer = malloc(sizeof(int) * (e->nvalues + 1));
    if (err == 0 && !producer)
        err = ck_error(CK_ENOMEM, "out of memory for the node table's producers");
    for (size_t v = 0; err == 0 && v < e->nvalues; v++)
        producer[v] = -1;
    for (size_t i = 0; err == 0 && i < e->m->nnodes; i++)
        for (size_t k = 0; !e->nodes[i].skip && k < e->m->nodes[i].noutputs; k++)
            producer[e->nodes[i].out[k]] = (int)i;
    for (size_t i = 0; err == 0 && i < e->m->nnodes; i++)
        err = pack_node(e, &r, producer, i);
    free(producer);
    free(r.count);
    free(r.first);
    free(r.last);
    return err;
}
