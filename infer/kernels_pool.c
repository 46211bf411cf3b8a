/* Pooling over the last two axes (NCHW): max, average (padding counted or
 * not, as count_include_pad says; a window running past the padded input in
 * ceil mode counts only what it covers, as torch does), and their global
 * forms. */
#include "infer/internal.h"

#include <float.h>
#include <math.h>

static void pool_plane(const struct ck_op_params *p, bool max, const float *x, int64_t h,
                       int64_t w, float *y, int64_t oh, int64_t ow)
{
    for (int64_t i = 0; i < oh; i++)
        for (int64_t j = 0; j < ow; j++) {
            int64_t y0 = i * p->stride[0] - p->pad[0], x0 = j * p->stride[1] - p->pad[1];
            int64_t y1 = y0 + p->kernel[0], x1 = x0 + p->kernel[1];
            /* the window clipped to the padded input, for the divisor */
            int64_t py1 = y1 < h + p->pad[2] ? y1 : h + p->pad[2];
            int64_t px1 = x1 < w + p->pad[3] ? x1 : w + p->pad[3];
            int64_t padded = (py1 - y0) * (px1 - x0);
            int64_t ya = y0 < 0 ? 0 : y0, xa = x0 < 0 ? 0 : x0;
            int64_t yb = y1 < h ? y1 : h, xb = x1 < w ? x1 : w;
            float acc = max ? -INFINITY : 0.0f;
            for (int64_t yy = ya; yy < yb; yy++)
                for (int64_t xx = xa; xx < xb; xx++) {
                    float v = x[yy * w + xx];
                    if (max)
                        acc = v > acc || isnan(v) ? v : acc;
                    else
                        acc += v;
                }
            if (!max) {
                int64_t count = p->count_include_pad ? padded : (yb - ya) * (xb - xa);
                acc = count > 0 ? acc / (float)count : 0.0f;
            }
            y[i * ow + j] = acc;
        }
}

int ck_infer_k_pool(const struct ck_kcall *k)
{
    const struct ck_ishape *x = &k->ins[0], *o = &k->outs[0];
    int r = x->rank;
    int64_t h = x->d[r - 2], w = x->d[r - 1], planes = 1;
    for (int i = 0; i < r - 2; i++)
        planes *= x->d[i];
    enum ck_op op = k->n->op;
    if (op == CK_OP_GLOBAL_AVGPOOL || op == CK_OP_GLOBAL_MAXPOOL) {
        int64_t inner = ck_ishape_numel(x) / (planes ? planes : 1);
        for (int64_t pl = 0; pl < planes; pl++) {
            const float *xp = k->in[0] + pl * inner;
            double sum = 0;
            float mx = -INFINITY;
            for (int64_t i = 0; i < inner; i++) {
                sum += xp[i];
                mx = xp[i] > mx || isnan(xp[i]) ? xp[i] : mx;
            }
            k->out[0][pl] = op == CK_OP_GLOBAL_MAXPOOL ? mx : (float)(sum / (double)inner);
        }
        return 0;
    }
    int64_t oh = o->d[r - 2], ow = o->d[r - 1];
    for (int64_t pl = 0; pl < planes; pl++)
        pool_plane(&k->n->p, op == CK_OP_MAXPOOL, k->in[0] + pl * h * w, h, w,
                   k->out[0] + pl * oh * ow, oh, ow);
    return 0;
}
