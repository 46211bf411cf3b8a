/* Pooling over the last two axes (NCHW): max, average (padding counted or
 * not, as count_include_pad says; a window running past the padded input in
 * ceil mode counts only what it covers, as torch does), and their global
 * forms. */
#include "infer/internal.h"
#include "infer/pool.h"

#include <float.h>
#include <math.h>

/* The maximum of a window: a select GCC turns into maxss (no branch per
 * value); a NaN anywhere makes the result NaN, as in torch. */
static float window_max(const float *x, int64_t w, int64_t ya, int64_t yb, int64_t xa, int64_t xb)
{
    float acc = -INFINITY;
    bool nan = false;
    for (int64_t yy = ya; yy < yb; yy++) {
        const float *row = x + yy * w;
        for (int64_t xx = xa; xx < xb; xx++) {
            float v = row[xx];
            acc = v > acc ? v : acc;
            nan |= v != v;
        }
    }
    return nan ? NAN : acc;
}

static float window_sum(const float *x, int64_t w, int64_t ya, int64_t yb, int64_t xa, int64_t xb)
{
    float acc = 0.0f;
    for (int64_t yy = ya; yy < yb; yy++)
        for (int64_t xx = xa; xx < xb; xx++)
            acc += x[yy * w + xx];
    return acc;
}

static inline float max2(float a, float b)
{
    return a != a ? a : b > a ? b : a; /* NaN wins */
}

/* The most common window (2x2, stride 2, no padding) without the general
 * loop's bookkeeping. */
static void pool_2x2(bool max, const float *x, int64_t w, float *y, int64_t oh, int64_t ow)
{
    for (int64_t i = 0; i < oh; i++) {
        const float *r0 = x + 2 * i * w, *r1 = r0 + w;
        float *yi = y + i * ow;
        if (max)
            for (int64_t j = 0; j < ow; j++)
                yi[j] = max2(max2(r0[2 * j], r0[2 * j + 1]), max2(r1[2 * j], r1[2 * j + 1]));
        else
            for (int64_t j = 0; j < ow; j++)
                yi[j] = (r0[2 * j] + r0[2 * j + 1] + r1[2 * j] + r1[2 * j + 1]) * 0.25f;
    }
}

static bool is_2x2(const struct ck_op_params *p, int64_t h, int64_t w, int64_t oh, int64_t ow)
{
    return p->kernel[0] == 2 && p->kernel[1] == 2 && p->stride[0] == 2 && p->stride[1] == 2 &&
           !p->pad[0] && !p->pad[1] && !p->pad[2] && !p->pad[3] && 2 * oh <= h && 2 * ow <= w;
}

static void pool_plane(const struct ck_op_params *p, bool max, const float *x, int64_t h,
                       int64_t w, float *y, int64_t oh, int64_t ow)
{
    if (is_2x2(p, h, w, oh, ow)) {
        pool_2x2(max, x, w, y, oh, ow);
        return;
    }
    for (int64_t i = 0; i < oh; i++) {
        int64_t y0 = i * p->stride[0] - p->pad[0], y1 = y0 + p->kernel[0];
        int64_t ya = y0 < 0 ? 0 : y0, yb = y1 < h ? y1 : h;
        /* the window clipped to the padded input, for the divisor */
        int64_t py = (y1 < h + p->pad[2] ? y1 : h + p->pad[2]) - y0;
        for (int64_t j = 0; j < ow; j++) {
            int64_t x0 = j * p->stride[1] - p->pad[1], x1 = x0 + p->kernel[1];
            int64_t xa = x0 < 0 ? 0 : x0, xb = x1 < w ? x1 : w;
            if (max) {
                y[i * ow + j] = window_max(x, w, ya, yb, xa, xb);
                continue;
            }
            int64_t px = (x1 < w + p->pad[3] ? x1 : w + p->pad[3]) - x0;
            /* the padded window's area in double: two kernel extents near
             * 2^62 overflow an int64 product (fuzz_graph); the window inside
             * the input is empty when it lies wholly in the padding (its
             * clipped ends then cross), else at most h * w */
            int64_t iy = yb > ya ? yb - ya : 0, ix = xb > xa ? xb - xa : 0;
            double count = p->count_include_pad ? (double)py * (double)px : (double)(iy * ix);
            float acc = window_sum(x, w, ya, yb, xa, xb);
            y[i * ow + j] = count > 0 ? (float)((double)acc / count) : 0.0f;
        }
    }
}

/* The mean of n values, summed in double over 4 independent lanes (the
 * loop is vectorised; one chain of double additions cost 4 cycles a value:
 * a sixth of efficientnet_b0's time in its squeeze-excitation pools). */
static float plane_mean(const float *x, int64_t n)
{
    double acc[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int l = 0; l < 4; l++)
            acc[l] += x[i + l];
    for (; i < n; i++)
        acc[0] += x[i];
    return (float)(((acc[0] + acc[1]) + (acc[2] + acc[3])) / (double)n);
}

static float plane_max(const float *x, int64_t n)
{
    float mx = -INFINITY;
    bool nan = false;
    for (int64_t i = 0; i < n; i++) {
        mx = x[i] > mx ? x[i] : mx;
        nan |= x[i] != x[i];
    }
    return nan ? NAN : mx;
}

/* Planes [p0, p1) of one pooling node. */
static void pool_part(void *arg, int64_t p0, int64_t p1)
{
    const struct ck_kcall *k = arg;
    const struct ck_ishape *x = &k->ins[0], *o = &k->outs[0];
    int r = x->rank;
    enum ck_op op = k->n->op;
    if (op == CK_OP_GLOBAL_AVGPOOL || op == CK_OP_GLOBAL_MAXPOOL) {
        int64_t planes = x->d[0] * x->d[1];
        int64_t inner = ck_ishape_numel(x) / (planes ? planes : 1);
        for (int64_t pl = p0; pl < p1; pl++)
            k->out[0][pl] = op == CK_OP_GLOBAL_MAXPOOL ? plane_max(k->in[0] + pl * inner, inner)
                                                       : plane_mean(k->in[0] + pl * inner, inner);
        return;
    }
    int64_t h = x->d[r - 2], w = x->d[r - 1], oh = o->d[r - 2], ow = o->d[r - 1];
    for (int64_t pl = p0; pl < p1; pl++)
        pool_plane(&k->n->p, op == CK_OP_MAXPOOL, k->in[0] + pl * h * w, h, w,
                   k->out[0] + pl * oh * ow, oh, ow);
}

int ck_infer_k_pool(const struct ck_kcall *k)
{
    const struct ck_ishape *x = &k->ins[0];
    int r = x->rank;
    int64_t planes = 1;
    for (int i = 0; i < r - 2; i++)
        planes *= x->d[i];
    if (k->n->op == CK_OP_GLOBAL_AVGPOOL || k->n->op == CK_OP_GLOBAL_MAXPOOL)
        /* one value per (N, C): every axis from 2 on is pooled, also for
         * NCDHW (the output is [N, C, 1, ...]) */
        planes = x->d[0] * x->d[1];
    /* planes are independent: cut among the engine's threads, in parts of
     * 4K input values or more */
    int64_t per = ck_ishape_numel(x) / (planes ? planes : 1);
    ck_pool_for(k->pool, planes, per >= 4096 ? 1 : 4096 / (per ? per : 1), pool_part, (void *)k);
    return 0;
}
