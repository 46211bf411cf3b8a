/* conv_transpose2d: the gradient of conv2d with respect to its input, as
 * ONNX's ConvTranspose defines it. Each input cell x[n, c, i, j] of group g
 * adds x W[c, m, a, e] to output cell (g Og + m, i sh - pt + a dh,
 * j sw - pl + e dw); cells that land outside the output are dropped (the
 * padding crops them), cells of the output no input reaches keep the bias
 * (an output_padding row, an output_shape larger than the full result). */
#include "infer/internal.h"
#include "common/error.h"

int ck_infer_k_conv_transpose(const struct ck_kcall *k)
{
    const struct ck_op_params *p = &k->n->p;
    const struct ck_ishape *xs = &k->ins[0], *ws = &k->ins[1], *ys = &k->outs[0];
    const float *x = k->in[0], *w = k->in[1], *b = k->nin > 2 ? k->in[2] : NULL;
    float *y = k->out[0];
    int64_t N = xs->d[0], C = xs->d[1], H = xs->d[2], W = xs->d[3];
    int64_t Og = ws->d[1], kh = ws->d[2], kw = ws->d[3], G = p->groups, Cg = C / G;
    int64_t O = ys->d[1], OH = ys->d[2], OW = ys->d[3];
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t i = 0; i < OH * OW; i++)
                y[(n * O + o) * OH * OW + i] = b ? b[o] : 0.0f;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            int64_t g = c / Cg;
            for (int64_t i = 0; i < H; i++)
                for (int64_t j = 0; j < W; j++) {
                    float xv = x[((n * C + c) * H + i) * W + j];
                    for (int64_t m = 0; m < Og; m++) {
                        const float *wk = w + (c * Og + m) * kh * kw;
                        float *yp = y + (n * O + g * Og + m) * OH * OW;
                        for (int64_t a = 0; a < kh; a++) {
                            int64_t oi = i * p->stride[0] - p->pad[0] + a * p->dilation[0];
                            if (oi < 0 || oi >= OH)
                                continue;
                            for (int64_t e = 0; e < kw; e++) {
                                int64_t oj = j * p->stride[1] - p->pad[1] + e * p->dilation[1];
                                if (oj >= 0 && oj < OW)
                                    yp[oi * OW + oj] += xv * wk[a * kw + e];
                            }
                        }
                    }
                }
        }
    return 0;
}
