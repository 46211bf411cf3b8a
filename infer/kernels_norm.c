/* Kernels that work along an axis: softmax and log-softmax, batch
 * normalisation (inference form: running mean and variance), layer
 * normalisation, instance normalisation and hardmax. Sums are kept in double
 * so a long axis does not lose the float32 precision the checks rely on. */
#include "infer/internal.h"
#include "common/error.h"

#include <math.h>
#include <string.h>


/* x viewed as [outer, len, inner] around axis. */
static void around(const struct ck_ishape *s, int axis, int64_t *outer, int64_t *len,
                   int64_t *inner)
{
    *outer = *inner = 1;
    for (int i = 0; i < axis; i++)
        *outer *= s->d[i];
    for (int i = axis + 1; i < s->rank; i++)
        *inner *= s->d[i];
    *len = s->d[axis];
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* The softmax of one contiguous row with AVX-512: the largest value (a NaN
 * is passed over, as the scalar comparison does), e^(x - max) 16 at a time
 * by ck_infer_expf's polynomial (kernels_linear.c's expf16: within 2 ulp
 * of libm's expf, which the scalar loop calls), their sum in double in 16
 * lanes, then the scale. Attention's softmaxes (BERT's, ViT's) spent most
 * of their time in the call per value and the chain of double additions. */
__attribute__((target("avx512f"))) static void softmax_row16(const float *x, float *y,
                                                              int64_t len)
{
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 16 <= len; i += 16)
        mx = _mm512_max_ps(_mm512_loadu_ps(x + i), mx);
    if (i < len)
        mx = _mm512_mask_max_ps(mx, (__mmask16)((1u << (len - i)) - 1),
                                _mm512_maskz_loadu_ps((__mmask16)((1u << (len - i)) - 1), x + i),
                                mx);
    float m = _mm512_reduce_max_ps(mx);
    __m512 mv = _mm512_set1_ps(m);
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (i = 0; i < len; i += 16) {
        __mmask16 k = len - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (len - i)) - 1);
        __m512 e = ck_infer_expf16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv));
        e = _mm512_maskz_mov_ps(k, e);
        _mm512_mask_storeu_ps(y + i, k, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(
                                   _mm512_castps_pd(e), 1))));
    }
    __m512 inv = _mm512_set1_ps((float)(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(s0, s1))));
    for (i = 0; i < len; i += 16) {
        __mmask16 k = len - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (len - i)) - 1);
        _mm512_mask_storeu_ps(y + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, y + i), inv));
    }
}
#endif

static void softmax(const struct ck_kcall *k, bool log_form)
{
    int axis = ck_infer_norm_axis(ck_op_axis(&k->n->p, -1), k->ins[0].rank);
    int64_t outer, len, inner;
    around(&k->ins[0], axis, &outer, &len, &inner);
#if defined(__x86_64__) && defined(__GNUC__)
    if (!log_form && inner == 1 && ck_infer_pgemm_available()) {
        for (int64_t o = 0; o < outer; o++)
            softmax_row16(k->in[0] + o * len, k->out[0] + o * len, len);
        return;
    }
#endif
    for (int64_t o = 0; o < outer; o++)
        for (int64_t in = 0; in < inner; in++) {
            const float *x = k->in[0] + o * len * inner + in;
            float *y = k->out[0] + o * len * inner + in;
            float mx = -INFINITY;
            for (int64_t i = 0; i < len; i++)
                mx = x[i * inner] > mx ? x[i * inner] : mx;
            /* expf of x - max (<= 0, no overflow) is exact to float32's last bit
             * or two; the sum is kept in double */
            double sum = 0;
            for (int64_t i = 0; i < len; i++) {
                float e = expf(x[i * inner] - mx);
                sum += e;
                if (!log_form)
                    y[i * inner] = e;
            }
            if (log_form) {
                float lsum = (float)log(sum);
                for (int64_t i = 0; i < len; i++)
                    y[i * inner] = (x[i * inner] - mx) - lsum;
            } else {
                float inv = (float)(1.0 / sum);
                for (int64_t i = 0; i < len; i++)
                    y[i * inner] *= inv;
            }
        }
}

static void batchnorm(const struct ck_kcall *k)
{
    int axis = ck_infer_norm_axis(ck_op_axis(&k->n->p, 1), k->ins[0].rank);
    int64_t outer, len, inner;
    around(&k->ins[0], axis, &outer, &len, &inner);
    const float *gamma = k->nin > 1 ? k->in[1] : NULL, *beta = k->nin > 2 ? k->in[2] : NULL;
    const float *mean = k->nin > 3 ? k->in[3] : NULL, *var = k->nin > 4 ? k->in[4] : NULL;
    for (int64_t c = 0; c < len; c++) {
        double inv = 1.0 / sqrt((var ? var[c] : 1.0) + k->n->p.eps);
        float scale = (float)((gamma ? gamma[c] : 1.0) * inv);
        float shift = (float)((beta ? beta[c] : 0.0) - (mean ? mean[c] : 0.0) * scale);
        for (int64_t o = 0; o < outer; o++) {
            const float *x = k->in[0] + (o * len + c) * inner;
            float *y = k->out[0] + (o * len + c) * inner;
            for (int64_t i = 0; i < inner; i++)
                y[i] = x[i] * scale + shift;
        }
    }
}

static void layernorm(const struct ck_kcall *k)
{
    const struct ck_ishape *s = &k->ins[0];
    int axis = ck_infer_norm_axis(ck_op_axis(&k->n->p, -1), s->rank);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < s->rank; i++)
        *(i < axis ? &outer : &inner) *= s->d[i];
    const float *gamma = k->nin > 1 ? k->in[1] : NULL, *beta = k->nin > 2 ? k->in[2] : NULL;
    for (int64_t o = 0; o < outer; o++) {
        const float *x = k->in[0] + o * inner;
        float *y = k->out[0] + o * inner;
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < inner; i++)
            sum += x[i];
        double mean = sum / (double)inner;
        for (int64_t i = 0; i < inner; i++)
            sq += ((double)x[i] - mean) * ((double)x[i] - mean);
        double inv = 1.0 / sqrt(sq / (double)inner + k->n->p.eps);
        for (int64_t i = 0; i < inner; i++) {
            double v = ((double)x[i] - mean) * inv;
            y[i] = (float)(v * (gamma ? gamma[i] : 1.0) + (beta ? beta[i] : 0.0));
        }
    }
}

/* One-hot of the first largest value along the axis (ONNX Hardmax, opset 13). */
static void hardmax(const struct ck_kcall *k)
{
    int axis = ck_infer_norm_axis(ck_op_axis(&k->n->p, -1), k->ins[0].rank);
    int64_t outer, len, inner;
    around(&k->ins[0], axis, &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t in = 0; in < inner; in++) {
            const float *x = k->in[0] + o * len * inner + in;
            float *y = k->out[0] + o * len * inner + in;
            int64_t best = 0;
            for (int64_t i = 1; i < len; i++)
                if (x[i * inner] > x[best * inner])
                    best = i;
            for (int64_t i = 0; i < len; i++)
                y[i * inner] = i == best ? 1.0f : 0.0f;
        }
}

/* x [N, C, ...]: each (n, c) plane normalised with its own mean and biased
 * variance, then scale[c] and bias[c]. */
static void instancenorm(const struct ck_kcall *k)
{
    const struct ck_ishape *s = &k->ins[0];
    int64_t planes = s->d[0] * s->d[1], inner = 1;
    for (int i = 2; i < s->rank; i++)
        inner *= s->d[i];
    for (int64_t p = 0; p < planes; p++) {
        const float *x = k->in[0] + p * inner;
        float *y = k->out[0] + p * inner;
        int64_t c = p % s->d[1];
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < inner; i++)
            sum += x[i];
        double mean = inner ? sum / (double)inner : 0;
        for (int64_t i = 0; i < inner; i++)
            sq += ((double)x[i] - mean) * ((double)x[i] - mean);
        double inv = 1.0 / sqrt((inner ? sq / (double)inner : 0) + k->n->p.eps);
        for (int64_t i = 0; i < inner; i++)
            y[i] = (float)(((double)x[i] - mean) * inv * k->in[1][c] + k->in[2][c]);
    }
}

/* Local response normalisation across channels (ONNX LRN): the window of
 * channel c is [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)],
 * cut at the edges; y = x / (bias + alpha / size * sum x^2)^beta. */
static void lrn(const struct ck_kcall *k)
{
    const struct ck_ishape *s = &k->ins[0];
    const struct ck_op_params *p = &k->n->p;
    int64_t C = s->d[1], size = p->ints[0], inner = 1, lo = (size - 1) / 2, hi = size / 2;
    for (int i = 2; i < s->rank; i++)
        inner *= s->d[i];
    for (int64_t n = 0; n < s->d[0]; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < inner; i++) {
                double sq = 0;
                int64_t q0 = c - lo < 0 ? 0 : c - lo, q1 = c + hi >= C ? C - 1 : c + hi;
                for (int64_t q = q0; q <= q1; q++) {
                    double v = k->in[0][(n * C + q) * inner + i];
                    sq += v * v;
                }
                int64_t at = (n * C + c) * inner + i;
                double den = pow(p->scalar + p->alpha / (double)size * sq, p->beta);
                k->out[0][at] = (float)(k->in[0][at] / den);
            }
}

/* Determinants by LU with partial pivoting, in double (the scratch). */
static void det(const struct ck_kcall *k)
{
    const struct ck_ishape *s = &k->ins[0];
    int64_t m = s->d[s->rank - 1], count = ck_ishape_numel(&k->outs[0]);
    double *a = (double *)k->scratch;
    for (int64_t b = 0; b < count; b++) {
        double d = 1;
        for (int64_t i = 0; i < m * m; i++)
            a[i] = k->in[0][b * m * m + i];
        for (int64_t col = 0; col < m && d != 0; col++) {
            int64_t piv = col;
            for (int64_t r = col + 1; r < m; r++)
                if (fabs(a[r * m + col]) > fabs(a[piv * m + col]))
                    piv = r;
            if (a[piv * m + col] == 0) {
                d = 0;
                break;
            }
            if (piv != col) {
                for (int64_t j = 0; j < m; j++) {
                    double t = a[col * m + j];
                    a[col * m + j] = a[piv * m + j];
                    a[piv * m + j] = t;
                }
                d = -d;
            }
            d *= a[col * m + col];
            for (int64_t r = col + 1; r < m; r++) {
                double f = a[r * m + col] / a[col * m + col];
                for (int64_t j = col; j < m; j++)
                    a[r * m + j] -= f * a[col * m + j];
            }
        }
        k->out[0][b] = (float)d;
    }
}

int ck_infer_k_norm(const struct ck_kcall *k)
{
    switch (k->n->op) {
    case CK_OP_SOFTMAX: softmax(k, false); return 0;
    case CK_OP_LOG_SOFTMAX: softmax(k, true); return 0;
    case CK_OP_BATCHNORM: batchnorm(k); return 0;
    case CK_OP_LAYERNORM: layernorm(k); return 0;
    case CK_OP_HARDMAX: hardmax(k); return 0;
    case CK_OP_INSTANCENORM: instancenorm(k); return 0;
    case CK_OP_LRN: lrn(k); return 0;
    case CK_OP_DET: det(k); return 0;
    default:
        return ck_error(CK_EFORMAT, "node '%s': op '%s' is not a normalisation", k->n->name,
                        ck_op_name(k->n->op));
    }
}
