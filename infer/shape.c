/* Shape inference: each node's output shapes from its input shapes, by the
 * semantics of enum ck_op (model/model.h). Run once per distinct input
 * shape, before any buffer is allocated, so that a graph whose shapes do not
 * chain fails naming the node before anything is computed. */
#include "infer/internal.h"
#include "model/dims.h"
#include "common/error.h"

#include <stdio.h>
#include <string.h>

int64_t ck_ishape_numel(const struct ck_ishape *s)
{
    int64_t n = 0, nz = 1;
    /* the non-zero dims too must multiply within the limit: a [0, 2^62, 2^62]
     * has no element, but a flatten of it would overflow */
    if (!ck_dims_prod(s->d, 0, s->rank, &n))
        return -1;
    for (int i = 0; i < s->rank; i++)
        if (s->d[i] && (nz *= s->d[i]) > CK_INFER_NUMEL_MAX) /* fits: ck_dims_prod checked */
            return -1;
    return n;
}

const char *ck_ishape_text(const struct ck_ishape *s, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < s->rank && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, i ? ", %lld" : "%lld", (long long)s->d[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
    return buf;
}

int ck_infer_norm_axis(int64_t a, int rank)
{
    if (a < 0)
        a += rank;
    return a < 0 || a >= rank ? -1 : (int)a;
}

#define BAD(...) ck_error(CK_EFORMAT, __VA_ARGS__)

static int same(const struct ck_ishape *in, struct ck_ishape *out)
{
    *out = *in;
    return 0;
}

/* numpy broadcasting of two shapes. */
static int broadcast(const struct ck_model_node *n, const struct ck_ishape *a,
                     const struct ck_ishape *b, struct ck_ishape *out)
{
    int r = a->rank > b->rank ? a->rank : b->rank;
    out->rank = r;
    for (int i = 0; i < r; i++) {
        int64_t da = i < r - a->rank ? 1 : a->d[i - (r - a->rank)];
        int64_t db = i < r - b->rank ? 1 : b->d[i - (r - b->rank)];
        if (da != db && da != 1 && db != 1) {
            char sa[128], sb[128];
            return BAD("node '%s' (%s): shapes %s and %s do not broadcast", n->name,
                       ck_op_name(n->op), ck_ishape_text(a, sa, sizeof sa),
                       ck_ishape_text(b, sb, sizeof sb));
        }
        out->d[i] = da == 1 ? db : da;
    }
    return 0;
}

static int dense(const struct ck_model_node *n, const struct ck_ishape *in, size_t nin,
                 struct ck_ishape *out)
{
    const struct ck_ishape *x = &in[0], *w = &in[1];
    int axis = ck_infer_norm_axis(ck_op_axis(&n->p, 1), x->rank);
    char sx[128], sw[128];
    if (axis < 0)
        return BAD("node '%s' (dense): axis out of range for input %s", n->name,
                   ck_ishape_text(x, sx, sizeof sx));
    int64_t k = 1;
    if (!ck_dims_prod(x->d, axis, x->rank, &k))
        return BAD("node '%s' (dense): input %s has too many features", n->name,
                   ck_ishape_text(x, sx, sizeof sx));
    if (w->rank < 2 || (n->p.trans_w && w->rank != 2))
        return BAD("node '%s' (dense): weight of shape %s is not a matrix", n->name,
                   ck_ishape_text(w, sw, sizeof sw));
    int64_t wk = n->p.trans_w ? w->d[1] : w->d[0], wn = 1;
    if (wk != k)
        return BAD("node '%s' (dense): input %s has %lld features but weight %s%s takes %lld",
                   n->name, ck_ishape_text(x, sx, sizeof sx), (long long)k,
                   ck_ishape_text(w, sw, sizeof sw), n->p.trans_w ? " ([out, in])" : " ([in, out])",
                   (long long)wk);
    out->rank = 0;
    for (int i = 0; i < axis; i++)
        out->d[out->rank++] = x->d[i];
    if (n->p.trans_w) {
        wn = w->d[0];
        out->d[out->rank++] = wn;
    } else {
        for (int i = 1; i < w->rank; i++) {
            if (out->rank >= CK_INFER_MAX_RANK)
                return BAD("node '%s' (dense): output rank over %d", n->name, CK_INFER_MAX_RANK);
            if (!ck_dim_mul(wn, w->d[i], &wn))
                return BAD("node '%s' (dense): weight %s is too large", n->name,
                           ck_ishape_text(w, sw, sizeof sw));
            out->d[out->rank++] = w->d[i];
        }
    }
    if (nin > 2 && ck_ishape_numel(&in[2]) != wn)
        return BAD("node '%s' (dense): bias %s does not have the %lld outputs of weight %s",
                   n->name, ck_ishape_text(&in[2], sx, sizeof sx), (long long)wn,
                   ck_ishape_text(w, sw, sizeof sw));
    return 0;
}

/* Output size of one spatial axis of a window op; -1 when it does not fit. */
static int64_t window_out(int64_t size, int64_t k, int64_t s, int64_t d, int64_t p0, int64_t p1,
                          bool ceil_mode)
{
    int64_t span = 0, room = 0;
    if (k < 1 || s < 1 || d < 1 || p0 < 0 || p1 < 0 || !ck_dim_mul(d, k - 1, &span) ||
        !ck_dim_add(span, 1, &span) || !ck_dim_add(size, p0, &room) ||
        !ck_dim_add(room, p1, &room) || (room -= span) < 0 ||
        (ceil_mode && !ck_dim_add(room, s - 1, &room)))
        return -1;
    int64_t o = room / s + 1;
    /* torch: the last window must start inside the input or its left padding */
    if (ceil_mode && (o - 1) * s >= size + p0)
        o--;
    return o;
}

/* conv_transpose2d: x [N, C, H, W], W [C, O/groups, kh, kw][, b [O]] ->
 * [N, O, s (H - 1) + output_padding + d (kh - 1) + 1 - pt - pb, likewise]. */
static int conv_transpose(const struct ck_model_node *n, const struct ck_ishape *in, size_t nin,
                          struct ck_ishape *out)
{
    const struct ck_ishape *x = &in[0], *w = &in[1];
    const struct ck_op_params *p = &n->p;
    const int64_t lim = INT64_C(1) << 30; /* every sum below stays under 2^62 */
    if (nin < 2 || x->rank != 4 || w->rank != 4 || w->d[0] != x->d[1] || p->groups < 1 ||
        p->groups > lim || x->d[1] % p->groups || w->d[1] > lim)
        return BAD("node '%s' (conv_transpose2d): input and weight do not fit", n->name);
    if (nin > 2 && ck_ishape_numel(&in[2]) != w->d[1] * p->groups)
        return BAD("node '%s' (conv_transpose2d): bias does not have the outputs' channels",
                   n->name);
    out->rank = 4;
    out->d[0] = x->d[0];
    out->d[1] = w->d[1] * p->groups;
    for (int i = 0; i < 2; i++) {
        int64_t s = p->stride[i], d = p->dilation[i], k = w->d[2 + i], h = x->d[2 + i];
        int64_t op = p->nints == 2 ? p->ints[i] : 0;
        if (s < 1 || d < 1 || s > lim || d > lim || k > lim || h > lim || op < 0 || op > lim ||
            p->pad[i] < -lim || p->pad[i] > lim || p->pad[i + 2] < -lim || p->pad[i + 2] > lim)
            return BAD("node '%s' (conv_transpose2d): stride, dilation or padding out of range",
                       n->name);
        out->d[2 + i] = s * (h - 1) + op + d * (k - 1) + 1 - p->pad[i] - p->pad[i + 2];
        if (h < 1 || out->d[2 + i] < 1)
            return BAD("node '%s' (conv_transpose2d): empty output", n->name);
    }
    return 0;
}

/* rnn, gru, lstm (kernels_rnn.c): every input's shape checked against X's
 * and W's, so the kernel reads in bounds. */
static int recurrent(const struct ck_model_node *n, const struct ck_ishape *in, size_t nin,
                     struct ck_ishape *out)
{
    const struct ck_op_params *p = &n->p;
    int64_t g = n->op == CK_OP_RNN ? 1 : n->op == CK_OP_GRU ? 3 : 4;
    if (p->nints != 5 || nin < 3 || in[0].rank != 3 || n->noutputs > 3 ||
        (n->noutputs > 2 && n->op != CK_OP_LSTM))
        return BAD("node '%s' (%s): needs X, W and R and its parameters", n->name,
                   ck_op_name(n->op));
    int64_t d = p->ints[0] == 2 ? 2 : 1, h = p->ints[1], mask = p->ints[2];
    bool l1 = p->ints[3] != 0;
    int64_t t = in[0].d[l1 ? 1 : 0], b = in[0].d[l1 ? 0 : 1], i = in[0].d[2];
    /* h in range before any product of it is taken (fuzz_graph: 3 * h overflowed) */
    if (h < 1 || h > (INT64_C(1) << 24) || p->ints[0] < 0 || p->ints[0] > 2 || mask < 0 ||
        mask > 15 || ((mask & 12) && n->op != CK_OP_LSTM))
        return BAD("node '%s' (%s): parameters out of range", n->name, ck_op_name(n->op));
    struct ck_ishape want[7] = {{3, {d, g * h, i}}, {3, {d, g * h, h}}, {2, {d, 2 * g * h}},
                                {3, {d, b, h}},     {3, {d, b, h}},     {2, {d, 3 * h}}};
    size_t k = 1;
    for (int j = 0; j < 6; j++) {
        if (j >= 2 && !(mask & (1 << (j - 2))))
            continue;
        if (k >= nin || ck_ishape_numel(&want[j]) < 0 ||
            ck_ishape_numel(&in[k]) != ck_ishape_numel(&want[j]))
            return BAD("node '%s' (%s): input %zu does not have the shape the op needs", n->name,
                       ck_op_name(n->op), k);
        k++;
    }
    if (k != nin)
        return BAD("node '%s' (%s): %zu inputs, its parameters name %zu", n->name,
                   ck_op_name(n->op), nin, k);
    out[0] = (struct ck_ishape){4, {0}};
    int64_t y0[4] = {t, d, b, h}, y1[4] = {b, t, d, h};
    memcpy(out[0].d, l1 ? y1 : y0, sizeof y0);
    for (size_t o = 1; o < n->noutputs; o++) {
        int64_t s0[3] = {d, b, h}, s1[3] = {b, d, h};
        out[o] = (struct ck_ishape){3, {0}};
        memcpy(out[o].d, l1 ? s1 : s0, sizeof s0);
    }
    return 0;
}

static int conv2d(const struct ck_model_node *n, const struct ck_ishape *in, size_t nin,
                  struct ck_ishape *out)
{
    const struct ck_ishape *x = &in[0], *w = &in[1];
    const struct ck_op_params *p = &n->p;
    char sx[128], sw[128];
    if (x->rank != 4 || w->rank != 4)
        return BAD("node '%s' (conv2d): input %s and weight %s must be 4-d (NCHW, OIHW)", n->name,
                   ck_ishape_text(x, sx, sizeof sx), ck_ishape_text(w, sw, sizeof sw));
    int64_t cin = -1;
    if (p->groups < 1 || x->d[1] % p->groups || w->d[0] % p->groups ||
        !ck_dim_mul(w->d[1], p->groups, &cin) || cin != x->d[1])
        return BAD("node '%s' (conv2d): input %s has %lld channels, weight %s with %lld groups "
                   "takes %lld",
                   n->name, ck_ishape_text(x, sx, sizeof sx), (long long)x->d[1],
                   ck_ishape_text(w, sw, sizeof sw), (long long)p->groups, (long long)cin);
    int64_t oh = window_out(x->d[2], w->d[2], p->stride[0], p->dilation[0], p->pad[0], p->pad[2],
                            false);
    int64_t ow = window_out(x->d[3], w->d[3], p->stride[1], p->dilation[1], p->pad[1], p->pad[3],
                            false);
    if (oh < 1 || ow < 1)
        return BAD("node '%s' (conv2d): kernel of %s does not fit input %s with its padding",
                   n->name, ck_ishape_text(w, sw, sizeof sw), ck_ishape_text(x, sx, sizeof sx));
    if (nin > 2 && ck_ishape_numel(&in[2]) != w->d[0])
        return BAD("node '%s' (conv2d): bias %s does not have the %lld output channels", n->name,
                   ck_ishape_text(&in[2], sx, sizeof sx), (long long)w->d[0]);
    *out = (struct ck_ishape){4, {x->d[0], w->d[0], oh, ow}};
    return 0;
}

static int pool(const struct ck_model_node *n, const struct ck_ishape *x, struct ck_ishape *out)
{
    const struct ck_op_params *p = &n->p;
    char sx[128];
    if (x->rank < 3)
        return BAD("node '%s' (%s): input %s has no two spatial axes", n->name, ck_op_name(n->op),
                   ck_ishape_text(x, sx, sizeof sx));
    *out = *x;
    if (n->op == CK_OP_GLOBAL_AVGPOOL || n->op == CK_OP_GLOBAL_MAXPOOL) {
        for (int i = 2; i < x->rank; i++)
            out->d[i] = 1;
        return 0;
    }
    int r = x->rank;
    int64_t oh = window_out(x->d[r - 2], p->kernel[0], p->stride[0], 1, p->pad[0], p->pad[2],
                            p->ceil_mode);
    int64_t ow = window_out(x->d[r - 1], p->kernel[1], p->stride[1], 1, p->pad[1], p->pad[3],
                            p->ceil_mode);
    if (oh < 1 || ow < 1)
        return BAD("node '%s' (%s): kernel %lldx%lld does not fit input %s", n->name,
                   ck_op_name(n->op), (long long)p->kernel[0], (long long)p->kernel[1],
                   ck_ishape_text(x, sx, sizeof sx));
    out->d[r - 2] = oh;
    out->d[r - 1] = ow;
    return 0;
}

static int matmul(const struct ck_model_node *n, const struct ck_ishape *a0,
                  const struct ck_ishape *b0, struct ck_ishape *out)
{
    struct ck_ishape a = *a0, b = *b0, ba, bb, bo;
    char sa[128], sb[128];
    if (a.rank < 1 || b.rank < 1)
        return BAD("node '%s' (matmul): a scalar operand", n->name);
    bool a1 = a.rank == 1, b1 = b.rank == 1;
    if (a1)
        a = (struct ck_ishape){2, {1, a0->d[0]}};
    if (b1)
        b = (struct ck_ishape){2, {b0->d[0], 1}};
    if (a.d[a.rank - 1] != b.d[b.rank - 2])
        return BAD("node '%s' (matmul): %s times %s: inner sizes differ", n->name,
                   ck_ishape_text(a0, sa, sizeof sa), ck_ishape_text(b0, sb, sizeof sb));
    ba = (struct ck_ishape){a.rank - 2, {0}};
    bb = (struct ck_ishape){b.rank - 2, {0}};
    memcpy(ba.d, a.d, sizeof(int64_t) * (size_t)ba.rank);
    memcpy(bb.d, b.d, sizeof(int64_t) * (size_t)bb.rank);
    int err = broadcast(n, &ba, &bb, &bo);
    if (err < 0)
        return err;
    *out = bo;
    if (out->rank + 2 > CK_INFER_MAX_RANK)
        return BAD("node '%s' (matmul): rank over %d", n->name, CK_INFER_MAX_RANK);
    if (!a1)
        out->d[out->rank++] = a.d[a.rank - 2];
    if (!b1)
        out->d[out->rank++] = b.d[b.rank - 1];
    return 0;
}

static int reshape(const struct ck_model_node *n, const struct ck_ishape *x,
                   struct ck_ishape *out)
{
    int64_t total = ck_ishape_numel(x), known = 1;
    int infer = -1;
    char sx[128];
    if (n->p.nints > CK_INFER_MAX_RANK)
        return BAD("node '%s' (reshape): rank over %d", n->name, CK_INFER_MAX_RANK);
    out->rank = (int)n->p.nints;
    for (int i = 0; i < out->rank; i++) {
        int64_t v = n->p.ints[i];
        if (v == 0 && i < x->rank)
            v = x->d[i];
        if (v == -1 && infer < 0) {
            infer = i;
            continue;
        }
        if (v < 0)
            return BAD("node '%s' (reshape): dimension %lld at %d", n->name, (long long)v, i);
        out->d[i] = v;
        if (v && known > CK_INFER_NUMEL_MAX / v)
            return BAD("node '%s' (reshape): shape too large", n->name);
        known *= v;
    }
    if (infer >= 0) {
        if (known == 0 || total % known)
            return BAD("node '%s' (reshape): input %s does not divide into the new shape",
                       n->name, ck_ishape_text(x, sx, sizeof sx));
        out->d[infer] = total / known;
        known = total;
    }
    if (known != total) {
        char so[128];
        return BAD("node '%s' (reshape): input %s has %lld elements, new shape %s has %lld",
                   n->name, ck_ishape_text(x, sx, sizeof sx), (long long)total,
                   ck_ishape_text(out, so, sizeof so), (long long)known);
    }
    return 0;
}

static int squeeze(const struct ck_model_node *n, const struct ck_ishape *x, struct ck_ishape *out)
{
    bool drop[CK_INFER_MAX_RANK] = {0};
    for (size_t i = 0; i < n->p.nints; i++) {
        int a = ck_infer_norm_axis(n->p.ints[i], x->rank);
        if (a < 0 || x->d[a] != 1)
            return BAD("node '%s' (squeeze): axis %lld is not of size 1", n->name,
                       (long long)n->p.ints[i]);
        drop[a] = true;
    }
    out->rank = 0;
    for (int i = 0; i < x->rank; i++)
        if (!(n->p.nints ? drop[i] : x->d[i] == 1))
            out->d[out->rank++] = x->d[i];
    return 0;
}

static int unsqueeze(const struct ck_model_node *n, const struct ck_ishape *x,
                     struct ck_ishape *out)
{
    int r = x->rank + (int)n->p.nints;
    bool add[CK_INFER_MAX_RANK] = {0};
    if (r > CK_INFER_MAX_RANK)
        return BAD("node '%s' (unsqueeze): rank over %d", n->name, CK_INFER_MAX_RANK);
    for (size_t i = 0; i < n->p.nints; i++) {
        int a = ck_infer_norm_axis(n->p.ints[i], r);
        if (a < 0 || add[a])
            return BAD("node '%s' (unsqueeze): axis %lld out of range or repeated", n->name,
                       (long long)n->p.ints[i]);
        add[a] = true;
    }
    out->rank = r;
    for (int i = 0, j = 0; i < r; i++)
        out->d[i] = add[i] ? 1 : x->d[j++];
    return 0;
}

static int concat(const struct ck_model_node *n, const struct ck_ishape *in, size_t nin,
                  struct ck_ishape *out)
{
    int axis = ck_infer_norm_axis(ck_op_axis(&n->p, 0), in[0].rank);
    if (axis < 0)
        return BAD("node '%s' (concat): axis out of range", n->name);
    *out = in[0];
    for (size_t i = 1; i < nin; i++) {
        bool ok = in[i].rank == in[0].rank;
        for (int d = 0; ok && d < in[0].rank; d++)
            ok = d == axis || in[i].d[d] == in[0].d[d];
        if (!ok) {
            char s0[128], si[128];
            return BAD("node '%s' (concat): input %zu %s does not match input 0 %s off axis %d",
                       n->name, i, ck_ishape_text(&in[i], si, sizeof si),
                       ck_ishape_text(&in[0], s0, sizeof s0), axis);
        }
        out->d[axis] += in[i].d[axis];
    }
    return 0;
}

static int split(const struct ck_model_node *n, const struct ck_ishape *x, struct ck_ishape *out)
{
    int axis = ck_infer_norm_axis(ck_op_axis(&n->p, 0), x->rank);
    if (axis < 0 || n->noutputs == 0)
        return BAD("node '%s' (split): axis out of range or no outputs", n->name);
    if (n->p.nints && n->p.nints != n->noutputs)
        return BAD("node '%s' (split): %zu sizes for %zu outputs", n->name, n->p.nints,
                   n->noutputs);
    int64_t sum = 0;
    for (size_t i = 0; i < n->noutputs; i++) {
        out[i] = *x;
        out[i].d[axis] = n->p.nints ? n->p.ints[i] : x->d[axis] / (int64_t)n->noutputs;
        if (out[i].d[axis] < 0)
            return BAD("node '%s' (split): negative size", n->name);
        sum += out[i].d[axis];
    }
    if (sum != x->d[axis])
        return BAD("node '%s' (split): parts add up to %lld, axis %d has %lld", n->name,
                   (long long)sum, axis, (long long)x->d[axis]);
    return 0;
}

/* numpy's slice.indices(): start, count for one axis. */
int64_t ck_infer_slice_step(int64_t size, int64_t step)
{
    /* a step past the axis takes one element, as a step of size + 1 does:
     * clamped so that no arithmetic on a file's step (INT64_MIN included)
     * overflows */
    if (step > size)
        return size + 1;
    if (step < -size - 1)
        return -size - 1;
    return step;
}

void ck_infer_slice_axis(int64_t size, int64_t start, int64_t end, int64_t step, int64_t *first,
                         int64_t *count)
{
    step = ck_infer_slice_step(size, step);
    int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? size : size - 1;
    if (start < 0)
        start = start + size < lo ? lo : start + size;
    else if (start > hi)
        start = hi;
    if (end < 0)
        end = end + size < lo ? lo : end + size;
    else if (end > hi)
        end = hi;
    int64_t c = step > 0 ? (end - start + step - 1) / step : (start - end - step - 1) / (-step);
    *first = start;
    *count = c > 0 ? c : 0;
}

static int slice(const struct ck_model_node *n, const struct ck_ishape *x, struct ck_ishape *out)
{
    if (n->p.nints % 3 || n->p.nints / 3 > (size_t)x->rank)
        return BAD("node '%s' (slice): %zu integers are not (start, end, step) per axis",
                   n->name, n->p.nints);
    *out = *x;
    for (size_t a = 0; a < n->p.nints / 3; a++) {
        const int64_t *t = &n->p.ints[3 * a];
        int64_t first;
        if (t[2] == 0)
            return BAD("node '%s' (slice): step 0 on axis %zu", n->name, a);
        ck_infer_slice_axis(x->d[a], t[0], t[1], t[2], &first, &out->d[a]);
    }
    return 0;
}

static int gather(const struct ck_model_node *n, const struct ck_ishape *t,
                  const struct ck_ishape *idx, struct ck_ishape *out)
{
    int axis = ck_infer_norm_axis(ck_op_axis(&n->p, 0), t->rank);
    if (axis < 0 || t->rank - 1 + idx->rank > CK_INFER_MAX_RANK)
        return BAD("node '%s' (gather): axis out of range or rank too large", n->name);
    out->rank = 0;
    for (int i = 0; i < axis; i++)
        out->d[out->rank++] = t->d[i];
    for (int i = 0; i < idx->rank; i++)
        out->d[out->rank++] = idx->d[i];
    for (int i = axis + 1; i < t->rank; i++)
        out->d[out->rank++] = t->d[i];
    return 0;
}

/* Which axes a reduce op reduces (all when none are listed). */
int ck_infer_reduce_axes(const struct ck_model_node *n, int rank, bool *axes)
{
    for (int i = 0; i < rank; i++)
        axes[i] = n->p.nints == 0;
    for (size_t i = 0; i < n->p.nints; i++) {
        int a = ck_infer_norm_axis(n->p.ints[i], rank);
        if (a < 0)
            return BAD("node '%s' (%s): axis %lld out of range", n->name, ck_op_name(n->op),
                       (long long)n->p.ints[i]);
        axes[a] = true;
    }
    return 0;
}

static int reduce(const struct ck_model_node *n, const struct ck_ishape *x, struct ck_ishape *out)
{
    bool axes[CK_INFER_MAX_RANK];
    int err = ck_infer_reduce_axes(n, x->rank, axes);
    if (err < 0)
        return err;
    out->rank = 0;
    for (int i = 0; i < x->rank; i++)
        if (!axes[i] || n->p.keepdims)
            out->d[out->rank++] = axes[i] ? 1 : x->d[i];
    return 0;
}

static int transpose(const struct ck_model_node *n, const struct ck_ishape *x,
                     struct ck_ishape *out)
{
    bool seen[CK_INFER_MAX_RANK] = {0};
    if (n->p.nints && n->p.nints != (size_t)x->rank)
        return BAD("node '%s' (transpose): permutation of %zu axes for a rank %d input", n->name,
                   n->p.nints, x->rank);
    out->rank = x->rank;
    for (int i = 0; i < x->rank; i++) {
        int a = n->p.nints ? ck_infer_norm_axis(n->p.ints[i], x->rank) : x->rank - 1 - i;
        if (a < 0 || seen[a])
            return BAD("node '%s' (transpose): not a permutation", n->name);
        seen[a] = true;
        out->d[i] = x->d[a];
    }
    return 0;
}

static int pad(const struct ck_model_node *n, const struct ck_ishape *x, struct ck_ishape *out)
{
    if (n->p.nints % 2 || n->p.nints / 2 > (size_t)x->rank)
        return BAD("node '%s' (pad): %zu integers are not (before, after) per axis", n->name,
                   n->p.nints);
    *out = *x;
    for (size_t a = 0; a < n->p.nints / 2; a++) {
        int64_t before = n->p.ints[2 * a], after = n->p.ints[2 * a + 1];
        if (before < 0 || after < 0)
            return BAD("node '%s' (pad): negative padding on axis %zu", n->name, a);
        /* each term bounded before the sum (fuzz_graph: a padding of
         * INT64_MAX overflowed) */
        if (before > CK_INFER_NUMEL_MAX || after > CK_INFER_NUMEL_MAX ||
            out->d[a] + before + after > CK_INFER_NUMEL_MAX)
            return BAD("node '%s' (pad): padding on axis %zu makes it too large", n->name, a);
        out->d[a] += before + after;
    }
    return 0;
}

static int flatten(const struct ck_model_node *n, const struct ck_ishape *x, struct ck_ishape *out)
{
    int64_t a = ck_op_axis(&n->p, 1);
    if (a < 0)
        a += x->rank;
    if (a < 0 || a > x->rank)
        return BAD("node '%s' (flatten): axis out of range", n->name);
    int64_t lo = 1, hi = 1;
    if (!ck_dims_prod(x->d, 0, (int)a, &lo) || !ck_dims_prod(x->d, (int)a, x->rank, &hi))
        return BAD("node '%s' (flatten): input too large", n->name);
    *out = (struct ck_ishape){2, {lo, hi}};
    return 0;
}

static int norm_checks(const struct ck_model_node *n, const struct ck_ishape *in, size_t nin)
{
    const struct ck_ishape *x = &in[0];
    if (n->op == CK_OP_BATCHNORM) {
        int axis = ck_infer_norm_axis(ck_op_axis(&n->p, 1), x->rank);
        if (axis < 0)
            return BAD("node '%s' (batchnorm): axis out of range", n->name);
        for (size_t i = 1; i < nin; i++)
            if (ck_ishape_numel(&in[i]) != x->d[axis])
                return BAD("node '%s' (batchnorm): parameter %zu has %lld values for %lld "
                           "channels",
                           n->name, i, (long long)ck_ishape_numel(&in[i]), (long long)x->d[axis]);
    } else if (n->op == CK_OP_LAYERNORM) {
        int axis = ck_infer_norm_axis(ck_op_axis(&n->p, -1), x->rank);
        if (axis < 0)
            return BAD("node '%s' (layernorm): axis out of range", n->name);
        int64_t inner = 1;
        if (!ck_dims_prod(x->d, axis, x->rank, &inner))
            return BAD("node '%s' (layernorm): input too large", n->name);
        for (size_t i = 1; i < nin; i++)
            if (ck_ishape_numel(&in[i]) != inner)
                return BAD("node '%s' (layernorm): parameter %zu has %lld values for %lld "
                           "normalised",
                           n->name, i, (long long)ck_ishape_numel(&in[i]), (long long)inner);
    } else if (ck_infer_norm_axis(ck_op_axis(&n->p, -1), x->rank) < 0) {
        return BAD("node '%s' (%s): axis out of range", n->name, ck_op_name(n->op));
    }
    return 0;
}

/* where, the comparisons and logical ops, expand, tile, trilu, cumsum
 * (docs/model.md). Sizes come from files: every product checked. */
static int select_shapes(const struct ck_model_node *n, const struct ck_ishape *in, size_t nin,
                         struct ck_ishape *out)
{
    const struct ck_ishape *x = &in[0];
    const char *op = ck_op_name(n->op);
    struct ck_ishape t;
    int err;
    switch (n->op) {
    case CK_OP_NOT:
        return same(x, out);
    case CK_OP_WHERE:
        if (nin < 3)
            return BAD("node '%s' (where): needs a condition and two values", n->name);
        if ((err = broadcast(n, &in[1], &in[2], &t)) < 0)
            return err;
        return broadcast(n, x, &t, out);
    case CK_OP_EXPAND:
        if (n->p.nints > CK_INFER_MAX_RANK)
            return BAD("node '%s' (expand): a shape of rank %zu (at most %d)", n->name, n->p.nints,
                       CK_INFER_MAX_RANK);
        t.rank = (int)n->p.nints;
        for (size_t i = 0; i < n->p.nints; i++) {
            if (n->p.ints[i] < 0 || n->p.ints[i] > CK_INFER_NUMEL_MAX)
                return BAD("node '%s' (expand): dimension %lld of the shape is out of range",
                           n->name, (long long)n->p.ints[i]);
            t.d[i] = n->p.ints[i];
        }
        return broadcast(n, x, &t, out);
    case CK_OP_TILE:
        if (n->p.nints != (size_t)x->rank)
            return BAD("node '%s' (tile): %zu repeats for rank %d", n->name, n->p.nints, x->rank);
        *out = *x;
        for (int i = 0; i < x->rank; i++)
            if (n->p.ints[i] < 0 || !ck_dim_mul(x->d[i], n->p.ints[i], &out->d[i]) ||
                out->d[i] > CK_INFER_NUMEL_MAX)
                return BAD("node '%s' (tile): repeat %lld of axis %d is out of range", n->name,
                           (long long)n->p.ints[i], i);
        return 0;
    case CK_OP_TRILU:
        if (x->rank < 2 || n->p.nints != 2)
            return BAD("node '%s' (trilu): needs x [..., N, M], upper and k", n->name);
        return same(x, out);
    case CK_OP_CUMSUM:
        if (n->p.nints != 3 || ck_infer_norm_axis(n->p.ints[0], x->rank) < 0)
            return BAD("node '%s' (cumsum): needs an axis in range, exclusive and reverse",
                       n->name);
        return same(x, out);
    case CK_OP_ARGMAX: case CK_OP_ARGMIN: {
        /* an index is exact in float32 up to 2^24 */
        int a = ck_infer_norm_axis(ck_op_axis(&n->p, 0), x->rank);
        if (a < 0 || x->d[a] < 1 || x->d[a] > (INT64_C(1) << 24))
            return BAD("node '%s' (%s): needs an axis in range with 1 to 2^24 elements (float32 "
                       "holds the indices exactly up to 2^24)",
                       n->name, op);
        *out = *x;
        if (n->p.keepdims) {
            out->d[a] = 1;
        } else {
            for (int i = a; i + 1 < x->rank; i++)
                out->d[i] = x->d[i + 1];
            out->rank--;
        }
        return 0;
    }
    case CK_OP_RESIZE:
        if (n->p.nints != 4 + 2 * (size_t)x->rank || n->p.ints[0] < 0 || n->p.ints[0] > 2 ||
            n->p.ints[1] < 0 || n->p.ints[1] > 3 || n->p.ints[2] < 0 || n->p.ints[2] > 3)
            return BAD("node '%s' (resize): needs a mode, a coordinate mode, a nearest mode, "
                       "exclude_outside and (size, scale) per axis of its rank %d",
                       n->name, x->rank);
        *out = *x;
        for (int a = 0; a < x->rank; a++) {
            double s = 0;
            if (!ck_infer_resize_axis(n, a, x->d[a], &out->d[a], &s) ||
                (x->d[a] == 0 && out->d[a] > 0))
                return BAD("node '%s' (resize): axis %d: size or scale out of range for an "
                           "input of %lld",
                           n->name, a, (long long)x->d[a]);
        }
        return 0;
    case CK_OP_GATHER_ELEMENTS: {
        int a = ck_infer_norm_axis(ck_op_axis(&n->p, 0), x->rank);
        if (nin < 2 || a < 0 || in[1].rank != x->rank || x->d[a] >= (INT64_C(1) << 24))
            return BAD("node '%s' (gather_elements): needs indices of the data's rank and an axis "
                       "in range under 2^24 elements (float32 holds the indices exactly)",
                       n->name);
        for (int i = 0; i < x->rank; i++)
            if (i != a && in[1].d[i] > x->d[i])
                return BAD("node '%s' (gather_elements): indices extend past the data on axis %d",
                           n->name, i);
        return same(&in[1], out);
    }
    default: /* the comparisons and and, or, xor */
        if (nin < 2 || n->p.has_scalar)
            return BAD("node '%s' (%s): takes two operands", n->name, op);
        return broadcast(n, x, &in[1], out);
    }
}

int ck_infer_node_shapes(const struct ck_model_node *n, const struct ck_ishape *in, size_t nin,
                         struct ck_ishape *out)
{
    if (nin == 0)
        return BAD("node '%s' (%s): no inputs", n->name, ck_op_name(n->op));
    if (n->noutputs != 1 && !ck_op_is_multi_output(n->op))
        return BAD("node '%s' (%s): %zu outputs, the op has one", n->name, ck_op_name(n->op),
                   n->noutputs);
    int err;
    switch (n->op) {
    case CK_OP_IDENTITY: case CK_OP_RELU: case CK_OP_LEAKY_RELU: case CK_OP_SIGMOID:
    case CK_OP_TANH: case CK_OP_GELU: case CK_OP_SQRT: case CK_OP_EXP: case CK_OP_LOG:
    case CK_OP_NEG: case CK_OP_ERF: case CK_OP_CLIP:
        return same(&in[0], out);
    case CK_OP_DET:
        if (in[0].rank < 2 || in[0].d[in[0].rank - 1] != in[0].d[in[0].rank - 2] ||
            in[0].d[in[0].rank - 1] > 4096)
            return BAD("node '%s' (det): needs square matrices (at most 4096 x 4096)", n->name);
        *out = in[0];
        out->rank -= 2;
        return 0;
    case CK_OP_LRN:
        if (in[0].rank < 2 || n->p.nints != 1 || n->p.ints[0] < 1 || n->p.ints[0] > (1 << 20))
            return BAD("node '%s' (lrn): needs x [N, C, ...] and a size up to 2^20", n->name);
        return same(&in[0], out);
    case CK_OP_HARDMAX:
        if (ck_infer_norm_axis(ck_op_axis(&n->p, -1), in[0].rank) < 0)
            return BAD("node '%s' (hardmax): axis out of range", n->name);
        return same(&in[0], out);
    case CK_OP_INSTANCENORM:
        if (nin < 3 || in[0].rank < 3 || ck_ishape_numel(&in[1]) != in[0].d[1] ||
            ck_ishape_numel(&in[2]) != in[0].d[1])
            return BAD("node '%s' (instancenorm): needs x [N, C, ...] and C scales and biases",
                       n->name);
        return same(&in[0], out);
    case CK_OP_CONV_TRANSPOSE2D:
        return conv_transpose(n, in, nin, out);
    case CK_OP_GRID_SAMPLE:
        if (nin < 2 || in[0].rank != 4 || in[1].rank != 4 || in[1].d[3] != 2 ||
            in[1].d[0] != in[0].d[0] || n->p.nints != 3 || n->p.ints[0] < 0 || n->p.ints[0] > 2 ||
            n->p.ints[1] < 0 || n->p.ints[1] > 2)
            return BAD("node '%s' (grid_sample): needs x [N, C, H, W], grid [N, Ho, Wo, 2] and "
                       "its 3 parameters",
                       n->name);
        *out = in[0];
        out->d[2] = in[1].d[1];
        out->d[3] = in[1].d[2];
        return 0;
    case CK_OP_RNN: case CK_OP_GRU: case CK_OP_LSTM:
        return recurrent(n, in, nin, out);
    case CK_OP_MAX: case CK_OP_MIN: case CK_OP_PRELU: case CK_OP_FMOD:
        /* no scalar form: the binary kernel would take its scalar path and
         * read in[0] as if it had the broadcast output's size (fuzz_graph) */
        if (n->p.has_scalar)
            return BAD("node '%s' (%s): takes two operands, not a scalar", n->name,
                       ck_op_name(n->op));
        return nin < 2 ? BAD("node '%s' (%s): one operand", n->name, ck_op_name(n->op))
                       : broadcast(n, &in[0], &in[1], out);
    case CK_OP_SOFTMAX: case CK_OP_LOG_SOFTMAX: case CK_OP_BATCHNORM: case CK_OP_LAYERNORM:
        if ((err = norm_checks(n, in, nin)) < 0)
            return err;
        return same(&in[0], out);
    case CK_OP_DENSE:
        return nin < 2 ? BAD("node '%s' (dense): no weight", n->name) : dense(n, in, nin, out);
    case CK_OP_CONV2D:
        return nin < 2 ? BAD("node '%s' (conv2d): no weight", n->name) : conv2d(n, in, nin, out);
    case CK_OP_MAXPOOL: case CK_OP_AVGPOOL: case CK_OP_GLOBAL_AVGPOOL: case CK_OP_GLOBAL_MAXPOOL:
        return pool(n, &in[0], out);
    case CK_OP_ADD: case CK_OP_SUB: case CK_OP_MUL: case CK_OP_DIV: case CK_OP_POW:
        if (n->p.has_scalar || nin == 1)
            return n->p.has_scalar ? same(&in[0], out)
                                   : BAD("node '%s' (%s): one operand and no scalar", n->name,
                                         ck_op_name(n->op));
        return broadcast(n, &in[0], &in[1], out);
    case CK_OP_MATMUL:
        return nin < 2 ? BAD("node '%s' (matmul): one operand", n->name)
                       : matmul(n, &in[0], &in[1], out);
    case CK_OP_TRANSPOSE: return transpose(n, &in[0], out);
    case CK_OP_RESHAPE: return reshape(n, &in[0], out);
    case CK_OP_FLATTEN: return flatten(n, &in[0], out);
    case CK_OP_SQUEEZE: return squeeze(n, &in[0], out);
    case CK_OP_UNSQUEEZE: return unsqueeze(n, &in[0], out);
    case CK_OP_CONCAT: return concat(n, in, nin, out);
    case CK_OP_SPLIT: return split(n, &in[0], out);
    case CK_OP_SLICE: return slice(n, &in[0], out);
    case CK_OP_GATHER:
        return nin < 2 ? BAD("node '%s' (gather): no indices", n->name)
                       : gather(n, &in[0], &in[1], out);
    case CK_OP_PAD: return pad(n, &in[0], out);
    case CK_OP_CAST:
        if (n->p.nints != 1 || ck_op_cast_dtype(n->p.ints[0]) == CK_DT_INVALID)
            return BAD("node '%s' (cast): needs one dtype (ONNX's code of a number type or bool)",
                       n->name);
        return same(&in[0], out);
    case CK_OP_TOPK: {
        /* an index is exact in float32 up to 2^24; k comes from the plan
         * (p.ints[0]), never larger than the axis */
        int a = ck_infer_norm_axis(ck_op_axis(&n->p, -1), in[0].rank);
        if (n->noutputs != 2 || n->p.nints != 3 || a < 0 || in[0].d[a] > (INT64_C(1) << 24))
            return BAD("node '%s' (topk): needs two outputs, k, largest, sorted and an axis in "
                       "range of at most 2^24 elements (float32 holds the indices exactly)",
                       n->name);
        if (n->p.ints[0] < 0 || n->p.ints[0] > in[0].d[a])
            return BAD("node '%s' (topk): k %lld is not in [0, %lld] (the axis' size)", n->name,
                       (long long)n->p.ints[0], (long long)in[0].d[a]);
        out[0] = out[1] = in[0];
        out[0].d[a] = out[1].d[a] = n->p.ints[0];
        return 0;
    }
    case CK_OP_SHAPE: case CK_OP_SIZE: case CK_OP_CONSTANT_OF_SHAPE: case CK_OP_RANGE:
        return BAD("node '%s' (%s): computed from shapes by the plan, not from these inputs",
                   n->name, ck_op_name(n->op));
    default:
        if (n->op >= CK_OP_WHERE && n->op <= CK_OP_RESIZE)
            return select_shapes(n, in, nin, out);
        if (ck_op_is_reduce(n->op))
            return reduce(n, &in[0], out);
        if (ck_op_is_unary(n->op))
            return same(&in[0], out);
        return BAD("node '%s': op '%s' is not supported by the inference engine", n->name,
                   ck_op_name(n->op));
    }
}
