/* grid_sample (ONNX GridSample, torch.nn.functional.grid_sample): x [N, C,
 * H, W] sampled at grid [N, Ho, Wo, 2] (x then y, normalised to [-1, 1]).
 * p.ints = [mode (0 bilinear, 1 nearest, 2 bicubic), padding (0 zeros,
 * 1 border, 2 reflection), align_corners]. A normalised coordinate g maps to
 * ((g + 1) / 2) (size - 1) with align_corners, else ((g + 1) size - 1) / 2;
 * border clamps it to [0, size - 1]; reflection folds it back over the edges
 * (the corner pixels' centres with align_corners, else their outer edges),
 * then clamps. Bilinear and nearest (half to even) read 0 outside the input;
 * bicubic (A = -0.75) applies the padding to each of its 4 x 4 taps. */
#include "infer/internal.h"
#include "common/error.h"

#include <math.h>

struct grid {
    int64_t H, W;
    int mode, pad;
    bool align;
};

static double unnormalise(double g, int64_t size, bool align)
{
    return align ? (g + 1) / 2 * (double)(size - 1) : ((g + 1) * (double)size - 1) / 2;
}

static double reflect(double v, double twice_lo, double twice_hi)
{
    if (twice_lo == twice_hi)
        return 0;
    double lo = twice_lo / 2, span = (twice_hi - twice_lo) / 2;
    v = fabs(v - lo);
    double extra = fmod(v, span);
    int64_t flips = (int64_t)floor(v / span);
    return flips % 2 == 0 ? extra + lo : span - extra + lo;
}

static double clampd(double v, int64_t size)
{
    return v < 0 ? 0 : v > (double)(size - 1) ? (double)(size - 1) : v;
}

/* the padding mode applied to an unnormalised coordinate */
static double padded(const struct grid *g, double v, int64_t size)
{
    if (g->pad == 1)
        return clampd(v, size);
    if (g->pad == 2) {
        v = g->align ? reflect(v, 0, 2.0 * (double)(size - 1))
                     : reflect(v, -1, 2.0 * (double)size - 1);
        return clampd(v, size);
    }
    return v;
}

static double at(const struct grid *g, const float *plane, int64_t y, int64_t x)
{
    return y >= 0 && y < g->H && x >= 0 && x < g->W ? plane[y * g->W + x] : 0.0;
}

static double cubic1(double x, double a)
{
    return ((a + 2) * x - (a + 3)) * x * x + 1;
}

static double cubic2(double x, double a)
{
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
}

static double bicubic(const struct grid *g, const float *plane, double x, double y)
{
    const double A = -0.75;
    double x0 = floor(x), y0 = floor(y), tx = x - x0, ty = y - y0, row[4];
    double cx[4] = {cubic2(tx + 1, A), cubic1(tx, A), cubic1(1 - tx, A), cubic2(2 - tx, A)};
    double cy[4] = {cubic2(ty + 1, A), cubic1(ty, A), cubic1(1 - ty, A), cubic2(2 - ty, A)};
    for (int i = 0; i < 4; i++) {
        row[i] = 0;
        for (int j = 0; j < 4; j++) {
            double px = padded(g, x0 - 1 + j, g->W), py = padded(g, y0 - 1 + i, g->H);
            row[i] += cx[j] * at(g, plane, (int64_t)py, (int64_t)px);
        }
    }
    return cy[0] * row[0] + cy[1] * row[1] + cy[2] * row[2] + cy[3] * row[3];
}

static double sample(const struct grid *g, const float *plane, double gx, double gy)
{
    double x = unnormalise(gx, g->W, g->align), y = unnormalise(gy, g->H, g->align);
    if (!(fabs(x) < 1e15 && fabs(y) < 1e15)) /* NaN or far outside: nothing to read */
        return 0.0;
    if (g->mode == 2)
        return bicubic(g, plane, x, y);
    x = padded(g, x, g->W);
    y = padded(g, y, g->H);
    if (g->mode == 1)
        return at(g, plane, (int64_t)nearbyint(y), (int64_t)nearbyint(x));
    double x0 = floor(x), y0 = floor(y), tx = x - x0, ty = y - y0;
    int64_t ix = (int64_t)x0, iy = (int64_t)y0;
    return at(g, plane, iy, ix) * (1 - tx) * (1 - ty) + at(g, plane, iy, ix + 1) * tx * (1 - ty) +
           at(g, plane, iy + 1, ix) * (1 - tx) * ty + at(g, plane, iy + 1, ix + 1) * tx * ty;
}

int ck_infer_k_grid_sample(const struct ck_kcall *k)
{
    const struct ck_op_params *p = &k->n->p;
    const struct ck_ishape *xs = &k->ins[0], *ys = &k->outs[0];
    struct grid g = {xs->d[2], xs->d[3], (int)p->ints[0], (int)p->ints[1], p->ints[2] != 0};
    int64_t N = xs->d[0], C = xs->d[1], HO = ys->d[2], WO = ys->d[3];
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            const float *plane = k->in[0] + (n * C + c) * g.H * g.W;
            float *y = k->out[0] + (n * C + c) * HO * WO;
            const float *gr = k->in[1] + n * HO * WO * 2;
            for (int64_t i = 0; i < HO * WO; i++)
                y[i] = (float)sample(&g, plane, gr[2 * i], gr[2 * i + 1]);
        }
    return 0;
}
