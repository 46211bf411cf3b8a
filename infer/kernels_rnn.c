/* The recurrent ops of ONNX: rnn, gru and lstm, one layer, forward, reverse
 * or both directions, with ONNX's default activations (tanh for rnn; sigmoid
 * and tanh for gru and lstm), gate orders and bias layout:
 *   W [D, G H, I], R [D, G H, H], B [D, 2 G H] (input biases, then the
 *   recurrent ones), initial_h / initial_c [D, batch, H], P [D, 3 H] (lstm
 *   peepholes i, o, f); gates: rnn (i), gru (z, r, h), lstm (i, o, f, c).
 * p.ints = [direction (0 forward, 1 reverse, 2 both), H, the optional inputs
 * present (1 B, 2 initial_h, 4 initial_c, 8 P), layout (0: X [T, batch, I],
 * Y [T, D, batch, H]; 1: batch first), gru's linear_before_reset].
 * Outputs: Y, Y_h (, Y_c). Sums are kept in double. */
#include "infer/internal.h"
#include "common/error.h"

#include <math.h>
#include <string.h>

struct rnn {
    int kind; /* 1 rnn, 3 gru, 4 lstm: the gate count */
    int64_t T, N, I, H, D;
    bool layout1, lbr;
    const float *x, *w, *r, *b, *h0, *c0, *p;
    float *y, *yh, *yc;
};

static double sigm(double v)
{
    return 1.0 / (1.0 + exp(-v));
}

/* dot of a row of m (len values) with v */
static double dot(const float *m, const float *v, int64_t len)
{
    double s = 0;
    for (int64_t i = 0; i < len; i++)
        s += (double)m[i] * v[i];
    return s;
}

static const float *x_at(const struct rnn *s, int64_t t, int64_t b)
{
    return s->x + (s->layout1 ? b * s->T + t : t * s->N + b) * s->I;
}

static float *y_at(const struct rnn *s, int64_t t, int64_t d, int64_t b)
{
    return s->y + (s->layout1 ? ((b * s->T + t) * s->D + d) : ((t * s->D + d) * s->N + b)) * s->H;
}

static int64_t last_at(const struct rnn *s, int64_t d, int64_t b)
{
    return (s->layout1 ? b * s->D + d : d * s->N + b) * s->H;
}

/* One step of direction d for batch row b: h (and c) updated in place. g
 * holds 4 H doubles of scratch. */
static void step(const struct rnn *s, int64_t d, const float *xt, float *h, float *c, double *g,
                 float *hn)
{
    int64_t H = s->H, G = s->kind, I = s->I;
    const float *W = s->w + d * G * H * I, *R = s->r + d * G * H * H;
    const float *Wb = s->b ? s->b + d * 2 * G * H : NULL, *Rb = Wb ? Wb + G * H : NULL;
    for (int64_t k = 0; k < G * H; k++) {
        g[k] = dot(W + k * I, xt, I) + (Wb ? Wb[k] : 0.0);
        /* gru's h gate takes the recurrent part after the reset gate */
        if (!(G == 3 && k >= 2 * H))
            g[k] += dot(R + k * H, h, H) + (Rb ? Rb[k] : 0.0);
    }
    if (G == 1) {
        for (int64_t j = 0; j < H; j++)
            hn[j] = (float)tanh(g[j]);
    } else if (G == 3) {
        for (int64_t j = 0; j < H; j++) {
            double z = sigm(g[j]), rr = sigm(g[H + j]), rec = 0;
            const float *Rh = R + (2 * H + j) * H;
            if (s->lbr) {
                rec = rr * (dot(Rh, h, H) + (Rb ? Rb[2 * H + j] : 0.0));
            } else {
                for (int64_t k = 0; k < H; k++)
                    rec += (double)Rh[k] * sigm(g[H + k]) * h[k];
                rec += Rb ? Rb[2 * H + j] : 0.0;
            }
            double hh = tanh(g[2 * H + j] + rec);
            hn[j] = (float)((1 - z) * hh + z * h[j]);
        }
    } else {
        const float *P = s->p ? s->p + d * 3 * H : NULL;
        for (int64_t j = 0; j < H; j++) {
            double ci = c[j];
            double i = sigm(g[j] + (P ? P[j] * ci : 0.0));
            double f = sigm(g[2 * H + j] + (P ? P[2 * H + j] * ci : 0.0));
            double cc = tanh(g[3 * H + j]);
            double cn = f * ci + i * cc;
            double o = sigm(g[H + j] + (P ? P[H + j] * cn : 0.0));
            c[j] = (float)cn;
            hn[j] = (float)(o * tanh(cn));
        }
    }
    memcpy(h, hn, sizeof(float) * (size_t)H);
}

int ck_infer_k_rnn(const struct ck_kcall *k)
{
    const struct ck_op_params *p = &k->n->p;
    const struct ck_ishape *xs = &k->ins[0];
    struct rnn s;
    memset(&s, 0, sizeof s);
    s.kind = k->n->op == CK_OP_RNN ? 1 : k->n->op == CK_OP_GRU ? 3 : 4;
    int64_t dir = p->ints[0], mask = p->ints[2];
    s.layout1 = p->ints[3] != 0;
    s.lbr = p->ints[4] != 0;
    s.H = p->ints[1];
    s.D = dir == 2 ? 2 : 1;
    s.T = xs->d[s.layout1 ? 1 : 0];
    s.N = xs->d[s.layout1 ? 0 : 1];
    s.I = xs->d[2];
    s.x = k->in[0], s.w = k->in[1], s.r = k->in[2];
    size_t at = 3;
    s.b = mask & 1 ? k->in[at++] : NULL;
    s.h0 = mask & 2 ? k->in[at++] : NULL;
    s.c0 = mask & 4 ? k->in[at++] : NULL;
    s.p = mask & 8 ? k->in[at++] : NULL;
    s.y = k->out[0];
    s.yh = k->n->noutputs > 1 ? k->out[1] : NULL;
    s.yc = k->n->noutputs > 2 ? k->out[2] : NULL;
    float *h = k->scratch, *c = h + s.H, *hn = c + s.H;
    double *g = (double *)(hn + s.H + (s.H & 1)); /* 8-byte aligned: s.H * 3 + pad floats */
    for (int64_t d = 0; d < s.D; d++) {
        bool rev = dir == 1 || d == 1;
        for (int64_t b = 0; b < s.N; b++) {
            for (int64_t j = 0; j < s.H; j++) {
                int64_t o = (d * s.N + b) * s.H + j; /* initial states are [D, batch, H] */
                h[j] = s.h0 ? s.h0[o] : 0.0f;
                c[j] = s.c0 ? s.c0[o] : 0.0f;
            }
            for (int64_t i = 0; i < s.T; i++) {
                int64_t t = rev ? s.T - 1 - i : i;
                step(&s, d, x_at(&s, t, b), h, c, g, hn);
                memcpy(y_at(&s, t, d, b), h, sizeof(float) * (size_t)s.H);
            }
            if (s.yh)
                memcpy(s.yh + last_at(&s, d, b), h, sizeof(float) * (size_t)s.H);
            if (s.yc)
                memcpy(s.yc + last_at(&s, d, b), c, sizeof(float) * (size_t)s.H);
        }
    }
    return 0;
}
