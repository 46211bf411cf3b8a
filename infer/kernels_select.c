/* Masks and selection: where, the comparisons and logical ops (a mask is
 * float32 0 / 1), expand, tile, trilu and cumsum (docs/model.md). Every
 * output element is located from its own index, so broadcasting follows
 * numpy for one, two or three operands without a special case. */
#include "infer/internal.h"
#include "common/error.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Strides of s aligned on the right to rank r, 0 on broadcast axes. */
static void strides_of(const struct ck_ishape *s, int r, int64_t *st)
{
    int64_t acc = 1;
    for (int i = r - 1; i >= 0; i--) {
        int j = i - (r - s->rank);
        st[i] = j < 0 || s->d[j] == 1 ? 0 : acc;
        if (j >= 0)
            acc *= s->d[j];
    }
}

/* Walks the output o in C order; off[k] is input k's element. */
struct walk {
    int r, nin;
    int64_t idx[CK_INFER_MAX_RANK], st[3][CK_INFER_MAX_RANK], off[3];
    const struct ck_ishape *o;
};

static void walk_init(struct walk *w, const struct ck_ishape *o, const struct ck_ishape *in, int nin)
{
    w->r = o->rank;
    w->nin = nin;
    w->o = o;
    for (int i = 0; i < w->r; i++)
        w->idx[i] = 0;
    for (int k = 0; k < nin; k++) {
        strides_of(&in[k], w->r, w->st[k]);
        w->off[k] = 0;
    }
}

static void walk_next(struct walk *w)
{
    for (int i = w->r - 1; i >= 0; i--) {
        for (int k = 0; k < w->nin; k++)
            w->off[k] += w->st[k][i];
        if (++w->idx[i] < w->o->d[i])
            return;
        for (int k = 0; k < w->nin; k++)
            w->off[k] -= w->st[k][i] * w->idx[i];
        w->idx[i] = 0;
    }
}

static float compare(enum ck_op op, float a, float b)
{
    switch (op) {
    case CK_OP_EQUAL: return a == b ? 1.0f : 0.0f;
    case CK_OP_LESS: return a < b ? 1.0f : 0.0f;
    case CK_OP_GREATER: return a > b ? 1.0f : 0.0f;
    case CK_OP_LESS_EQUAL: return a <= b ? 1.0f : 0.0f;
    case CK_OP_GREATER_EQUAL: return a >= b ? 1.0f : 0.0f;
    case CK_OP_AND: return a != 0 && b != 0 ? 1.0f : 0.0f;
    case CK_OP_OR: return a != 0 || b != 0 ? 1.0f : 0.0f;
    default: /* xor */ return (a != 0) != (b != 0) ? 1.0f : 0.0f;
    }
}

/* y[i] = in[0] op in[1] (two operands) or cond ? a : b (where), broadcast. */
static void broadcast_op(const struct ck_kcall *k)
{
    enum ck_op op = k->n->op;
    int64_t n = ck_ishape_numel(&k->outs[0]);
    struct walk w;
    walk_init(&w, &k->outs[0], k->ins, op == CK_OP_WHERE ? 3 : op == CK_OP_EXPAND ? 1 : 2);
    for (int64_t i = 0; i < n; i++, walk_next(&w)) {
        if (op == CK_OP_WHERE)
            k->out[0][i] = k->in[0][w.off[0]] != 0 ? k->in[1][w.off[1]] : k->in[2][w.off[2]];
        else if (op == CK_OP_EXPAND)
            k->out[0][i] = k->in[0][w.off[0]];
        else
            k->out[0][i] = compare(op, k->in[0][w.off[0]], k->in[1][w.off[1]]);
    }
}

/* y[i0, i1, ...] = x[i0 mod d0, i1 mod d1, ...] */
static void tile(const struct ck_kcall *k)
{
    const struct ck_ishape *x = &k->ins[0], *o = &k->outs[0];
    int64_t n = ck_ishape_numel(o), idx[CK_INFER_MAX_RANK] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t src = 0;
        for (int a = 0; a < o->rank; a++)
            src = src * x->d[a] + idx[a] % x->d[a];
        k->out[0][i] = k->in[0][src];
        for (int a = o->rank - 1; a >= 0; a--) {
            if (++idx[a] < o->d[a])
                break;
            idx[a] = 0;
        }
    }
}

/* x [..., N, M]: upper keeps j - i >= kk, lower keeps j - i <= kk, zeros elsewhere. */
static void trilu(const struct ck_kcall *k)
{
    const struct ck_ishape *x = &k->ins[0];
    int64_t rows = x->d[x->rank - 2], cols = x->d[x->rank - 1];
    int64_t n = ck_ishape_numel(x), kk = k->n->p.ints[1];
    bool upper = k->n->p.ints[0] != 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t c = i % cols, r = (i / cols) % rows;
        /* c - r is within (-2^40, 2^40); kk is any int64 */
        bool keep = upper ? (c - r >= kk) : (c - r <= kk);
        k->out[0][i] = keep ? k->in[0][i] : 0.0f;
    }
    (void)rows;
}

/* Running sums along an axis, in double; exclusive leaves out the element
 * itself, reverse runs from the end. */
static void cumsum(const struct ck_kcall *k)
{
    const struct ck_ishape *x = &k->ins[0];
    int axis = ck_infer_norm_axis(k->n->p.ints[0], x->rank);
    bool exclusive = k->n->p.ints[1] != 0, reverse = k->n->p.ints[2] != 0;
    int64_t outer = 1, inner = 1, len = x->d[axis];
    for (int i = 0; i < axis; i++)
        outer *= x->d[i];
    for (int i = axis + 1; i < x->rank; i++)
        inner *= x->d[i];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t in = 0; in < inner; in++) {
            double acc = 0;
            for (int64_t t = 0; t < len; t++) {
                int64_t j = reverse ? len - 1 - t : t, at = (o * len + j) * inner + in;
                double v = k->in[0][at];
                if (!exclusive)
                    acc += v;
                k->out[0][at] = (float)acc;
                if (exclusive)
                    acc += v;
            }
        }
}

/* The index of the largest (argmax) or smallest value along the axis: the
 * first one, or the last with select_last; a NaN beats any number (numpy). */
static void argext(const struct ck_kcall *k)
{
    const struct ck_ishape *x = &k->ins[0];
    int axis = ck_infer_norm_axis(ck_op_axis(&k->n->p, 0), x->rank);
    bool last = k->n->p.nints && k->n->p.ints[0] != 0, mx = k->n->op == CK_OP_ARGMAX;
    int64_t outer = 1, inner = 1, len = x->d[axis];
    for (int i = 0; i < axis; i++)
        outer *= x->d[i];
    for (int i = axis + 1; i < x->rank; i++)
        inner *= x->d[i];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t in = 0; in < inner; in++) {
            const float *p = k->in[0] + o * len * inner + in;
            int64_t best = 0;
            for (int64_t j = 1; j < len; j++) {
                float v = p[j * inner], b = p[best * inner];
                bool vn = v != v, bn = b != b;
                if (bn ? (vn && last)
                       : (vn || (mx ? v > b : v < b) || (last && v == b)))
                    best = j;
            }
            k->out[0][o * inner + in] = (float)best;
        }
}

/* y[i] = data[i with the axis' index replaced by indices[i]]; an index is a
 * whole number in [-size, size), negative counting from the end. */
static int gather_elements(const struct ck_kcall *k)
{
    const struct ck_ishape *x = &k->ins[0], *ix = &k->ins[1];
    int axis = ck_infer_norm_axis(ck_op_axis(&k->n->p, 0), x->rank);
    int64_t n = ck_ishape_numel(ix), idx[CK_INFER_MAX_RANK] = {0}, st[CK_INFER_MAX_RANK];
    int64_t acc = 1, size = x->d[axis];
    for (int i = x->rank - 1; i >= 0; i--) {
        st[i] = acc;
        acc *= x->d[i];
    }
    for (int64_t i = 0; i < n; i++) {
        float v = k->in[1][i];
        if (!(v >= -(float)size && v < (float)size) || v != (float)(int64_t)v)
            return ck_error(CK_EFORMAT, "node '%s' (gather_elements): index %g is not a whole "
                            "number in [-%lld, %lld)", k->n->name, (double)v, (long long)size,
                            (long long)size);
        int64_t j = (int64_t)v, off = 0;
        if (j < 0)
            j += size;
        for (int a = 0; a < x->rank; a++)
            off += (a == axis ? j : idx[a]) * st[a];
        k->out[0][i] = k->in[0][off];
        for (int a = ix->rank - 1; a >= 0; a--) {
            if (++idx[a] < ix->d[a])
                break;
            idx[a] = 0;
        }
    }
    return 0;
}

/* ---- resize (ONNX Resize: nearest, linear, cubic) ---- */

enum { RS_NEAREST, RS_LINEAR, RS_CUBIC };
enum { RS_HALF_PIXEL, RS_PYTORCH_HALF_PIXEL, RS_ALIGN_CORNERS, RS_ASYMMETRIC };
enum { RS_ROUND_PREFER_FLOOR, RS_ROUND_PREFER_CEIL, RS_FLOOR, RS_CEIL };

bool ck_infer_resize_axis(const struct ck_model_node *n, int a, int64_t in, int64_t *out,
                          double *scale)
{
    int64_t size = n->p.ints[4 + 2 * a], bits = n->p.ints[5 + 2 * a];
    if (bits == 0) { /* sizes: the scale is the ratio */
        if (size < 0 || size > CK_INFER_NUMEL_MAX)
            return false;
        *out = size;
        *scale = in > 0 ? (double)size / (double)in : 1.0;
        return true;
    }
    uint32_t b32 = (uint32_t)bits;
    float s;
    memcpy(&s, &b32, 4);
    if (bits < 0 || bits > UINT32_MAX || !(s > 0 && s <= 1e6f))
        return false;
    double d = (double)in * (double)s; /* in < 2^40: no overflow */
    if (d > (double)CK_INFER_NUMEL_MAX)
        return false;
    *out = (int64_t)d;
    *scale = (double)s;
    return true;
}

/* Up to 4 taps (input index, weight) of one output index along one axis,
 * as ONNX's reference: the source coordinate by the coordinate mode, its
 * neighbours clamped to the axis (edge padding), cubic's weights with
 * exclude_outside renormalised over the taps inside. */
struct taps {
    int64_t at[4];
    double w[4];
};

static double cubic_w(double t, double A)
{
    t = fabs(t);
    if (t <= 1)
        return ((A + 2) * t - (A + 3)) * t * t + 1;
    if (t < 2)
        return ((A * t - 5 * A) * t + 8 * A) * t - 4 * A;
    return 0;
}

static void resize_taps(const struct ck_model_node *n, int64_t xr, int64_t in, int64_t out,
                        double scale, struct taps *t)
{
    int mode = (int)n->p.ints[0], coord = (int)n->p.ints[1], near = (int)n->p.ints[2];
    bool exclude = n->p.ints[3] != 0;
    /* the resized length as ONNX's reference takes it: scale times the
     * input's (the output's own length when sizes were given) */
    double len = scale * (double)in, x;
    (void)out;
    switch (coord) {
    case RS_ALIGN_CORNERS:
        x = len == 1 ? 0 : (double)xr * (double)(in - 1) / (len - 1);
        break;
    case RS_ASYMMETRIC:
        x = (double)xr / scale;
        break;
    case RS_PYTORCH_HALF_PIXEL:
        x = len == 1 ? -0.5 : ((double)xr + 0.5) / scale - 0.5;
        break;
    default:
        x = ((double)xr + 0.5) / scale - 0.5;
        break;
    }
    double fl = floor(x), r = x - fl;
    int64_t base = (int64_t)fl;
    int ntaps = mode == RS_CUBIC ? 4 : mode == RS_LINEAR ? 2 : 1;
    if (mode == RS_NEAREST) {
        bool up = r == 0 ? false
                  : near == RS_ROUND_PREFER_FLOOR ? r > 0.5
                  : near == RS_ROUND_PREFER_CEIL ? r >= 0.5
                  : near == RS_CEIL;
        t->at[0] = base + (up ? 1 : 0);
        t->w[0] = 1;
    } else if (mode == RS_LINEAR) {
        t->at[0] = base, t->w[0] = 1 - r;
        t->at[1] = base + 1, t->w[1] = r;
    } else {
        double A = n->p.alpha, sum = 0;
        for (int i = 0; i < 4; i++) {
            t->at[i] = base - 1 + i;
            t->w[i] = cubic_w(r + 1 - i, A);
            if (exclude && (t->at[i] < 0 || t->at[i] >= in))
                t->w[i] = 0;
            sum += t->w[i];
        }
        for (int i = 0; exclude && sum != 0 && i < 4; i++)
            t->w[i] /= sum;
    }
    for (int i = 0; i < ntaps; i++)
        t->at[i] = t->at[i] < 0 ? 0 : t->at[i] >= in ? in - 1 : t->at[i];
    for (int i = ntaps; i < 4; i++)
        t->at[i] = 0, t->w[i] = 0;
}

/* One axis's taps map every index to itself with weight 1 (scale 1 and a
 * coordinate mode that keeps the grid): that axis's pass is a copy. */
static bool taps_identity(const struct taps *t, int64_t len, int ntaps)
{
    for (int64_t i = 0; i < len; i++) {
        if (t[i].at[0] != i || t[i].w[0] != 1)
            return false;
        for (int j = 1; j < ntaps; j++)
            if (t[i].w[j] != 0)
                return false;
    }
    return true;
}

/* Resize is a product of one-axis interpolations (nearest, linear and cubic
 * alike, exclude_outside renormalising each axis's taps), so it runs as one
 * pass per axis that changes: each output of a pass is at most 4 taps of the
 * pass before. The axes that shrink go first, so no pass holds more than the
 * larger of the input and the output. Summing every output over the product
 * of its axes' taps cost 4^rank taps per output: a 307-byte model (rank 8,
 * cubic) kept the engine busy for minutes (found by fuzz_onnx). Each pass
 * sums in double; a tap of weight 0 is not read, as before (a NaN there does
 * not reach the output). */
static int resize(const struct ck_kcall *k)
{
    const struct ck_ishape *x = &k->ins[0], *o = &k->outs[0];
    int r = x->rank, ntaps = k->n->p.ints[0] == RS_CUBIC ? 4 : k->n->p.ints[0] == RS_LINEAR ? 2 : 1;
    int64_t total = 0, start[CK_INFER_MAX_RANK];
    int64_t n = ck_ishape_numel(o), nin = ck_ishape_numel(x);
    if (n == 0)
        return 0;
    if (nin == 0)
        return ck_error(CK_EFORMAT, "node '%s' (resize): an empty input cannot be resized to %lld "
                                    "elements", k->n->name, (long long)n);
    for (int a = 0; a < r; a++) {
        start[a] = total;
        total += o->d[a];
    }
    struct taps *tab = malloc((size_t)(total ? total : 1) * sizeof *tab);
    if (!tab)
        return ck_error(CK_ENOMEM, "node '%s' (resize): out of memory for %lld taps",
                        k->n->name, (long long)total);
    /* the axes to pass over: those that shrink first, then those that grow */
    int axes[CK_INFER_MAX_RANK], npass = 0;
    for (int a = 0; a < r; a++) {
        int64_t dummy = 0;
        double scale = 1;
        ck_infer_resize_axis(k->n, a, x->d[a], &dummy, &scale);
        for (int64_t i = 0; i < o->d[a]; i++)
            resize_taps(k->n, i, x->d[a], o->d[a], scale, &tab[start[a] + i]);
    }
    for (int grow = 0; grow < 2; grow++)
        for (int a = 0; a < r; a++)
            if ((o->d[a] > x->d[a]) == (grow == 1) &&
                !(o->d[a] == x->d[a] && taps_identity(&tab[start[a]], o->d[a], ntaps)))
                axes[npass++] = a;
    if (npass == 0) { /* every axis kept as it is */
        memcpy(k->out[0], k->in[0], (size_t)n * sizeof(float));
        free(tab);
        return 0;
    }
    /* the largest tensor a pass before the last leaves */
    int64_t cur[CK_INFER_MAX_RANK], most = 0, size = nin;
    memcpy(cur, x->d, sizeof(int64_t) * (size_t)r);
    for (int p = 0; p + 1 < npass; p++) {
        int a = axes[p];
        size = size / cur[a] * o->d[a];
        cur[a] = o->d[a];
        if (size > most)
            most = size;
    }
    float *buf[2] = {NULL, NULL};
    if (most && (!(buf[0] = malloc((size_t)most * sizeof(float))) ||
                 (npass > 2 && !(buf[1] = malloc((size_t)most * sizeof(float)))))) {
        free(buf[0]);
        free(tab);
        return ck_error(CK_ENOMEM, "node '%s' (resize): out of memory for %lld intermediate values",
                        k->n->name, (long long)most);
    }
    memcpy(cur, x->d, sizeof(int64_t) * (size_t)r);
    const float *src = k->in[0];
    for (int p = 0; p < npass; p++) {
        int a = axes[p];
        float *dst = p + 1 == npass ? k->out[0] : buf[p % 2];
        int64_t outer = 1, inner = 1, lin = cur[a], lout = o->d[a];
        for (int b = 0; b < a; b++)
            outer *= cur[b];
        for (int b = a + 1; b < r; b++)
            inner *= cur[b];
        const struct taps *ta = &tab[start[a]];
        for (int64_t ob = 0; ob < outer; ob++) {
            const float *sb = src + ob * lin * inner;
            float *db = dst + ob * lout * inner;
            for (int64_t i = 0; i < lout; i++) {
                const struct taps *t = &ta[i];
                float *d = db + i * inner;
                for (int64_t q = 0; q < inner; q++) {
                    double sum = 0;
                    for (int j = 0; j < ntaps; j++)
                        if (t->w[j] != 0)
                            sum += t->w[j] * sb[t->at[j] * inner + q];
                    d[q] = (float)sum;
                }
            }
        }
        cur[a] = lout;
        src = dst;
    }
    free(buf[0]);
    free(buf[1]);
    free(tab);
    return 0;
}

int ck_infer_k_select(const struct ck_kcall *k)
{
    switch (k->n->op) {
    case CK_OP_NOT: {
        int64_t n = ck_ishape_numel(&k->outs[0]);
        for (int64_t i = 0; i < n; i++)
            k->out[0][i] = k->in[0][i] == 0 ? 1.0f : 0.0f;
        return 0;
    }
    case CK_OP_WHERE: case CK_OP_EQUAL: case CK_OP_LESS: case CK_OP_GREATER:
    case CK_OP_LESS_EQUAL: case CK_OP_GREATER_EQUAL: case CK_OP_AND: case CK_OP_OR:
    case CK_OP_XOR: case CK_OP_EXPAND:
        broadcast_op(k);
        return 0;
    case CK_OP_TILE: tile(k); return 0;
    case CK_OP_TRILU: trilu(k); return 0;
    case CK_OP_CUMSUM: cumsum(k); return 0;
    case CK_OP_ARGMAX: case CK_OP_ARGMIN: argext(k); return 0;
    case CK_OP_GATHER_ELEMENTS: return gather_elements(k);
    case CK_OP_RESIZE: return resize(k);
    default:
        return ck_error(CK_EFORMAT, "node '%s': op '%s' is not a selection", k->n->name,
                        ck_op_name(k->n->op));
    }
}
