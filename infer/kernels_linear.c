/* Matrix products: dense, matmul (batched, batch dims broadcast) and conv2d
 * (im2col, then one product per image and group; a 1x1 stride-1 unpadded
 * convolution needs no im2col; a depthwise one runs its own loops). The products go through OpenBLAS's
 * cblas_sgemm, single-threaded (the engine runs beside a training job), or
 * through plain loops when asked (bench/infer.sh measures the difference).
 *
 * With the engine's threads (infer/pool.h) each product is cut into blocks
 * of output rows (a convolution's output channels, a dense layer's tokens,
 * GEMM_ROWS at a time), one single-threaded cblas_sgemm per block. im2col,
 * the bias and the epilogue are cut by input and output channels, the
 * depthwise kernel by channels, a batched matmul by its products. */
#include "infer/internal.h"
#include "infer/pool.h"
#include "common/error.h"

#include <math.h>
#include <string.h>
#if defined(__SSE2__) || defined(__x86_64__)
#include <immintrin.h>
#endif

static void gemm_naive(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                       int64_t ldc)
{
    for (int64_t i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        for (int64_t j = 0; j < n; j++)
            ci[j] = beta == 0.0f ? 0.0f : ci[j] * beta;
        for (int64_t p = 0; p < k; p++) {
            float av = ta ? a[p * lda + i] : a[i * lda + p];
            if (tb)
                for (int64_t j = 0; j < n; j++)
                    ci[j] += av * b[j * ldb + p];
            else
                for (int64_t j = 0; j < n; j++)
                    ci[j] += av * b[p * ldb + j];
        }
    }
}

void ck_infer_gemm(bool naive, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                   int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m == 0 || n == 0)
        return;
    if (naive || !ck_infer_blas_available() || k == 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX ||
        lda > INT32_MAX || ldb > INT32_MAX || ldc > INT32_MAX) {
        gemm_naive(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    ck_infer_blas_sgemm(ta, tb, (int)m, (int)n, (int)k, a, (int)lda, b, (int)ldb, beta, c,
                        (int)ldc);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* ck_infer_expf's operations on 16 values at once, in the same order and
 * rounding (no fused multiply-add: each product and sum rounded as the
 * scalar code rounds it), so the results are the same bits; GCC keeps the
 * scalar loops below scalar (the NaN tests), and the SiLUs of
 * efficientnet_b0 took a third of its time there. */
__attribute__((target("avx512f"))) __m512 ck_infer_expf16(__m512 x)
{
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512 c = _mm512_mask_blend_ps(nan, x, _mm512_setzero_ps());
    c = _mm512_min_ps(c, _mm512_set1_ps(88.3762626647949f));
    c = _mm512_max_ps(c, _mm512_set1_ps(-87.3365447505531f));
    __m512 k = _mm512_mul_ps(c, _mm512_set1_ps(1.44269504088896341f));
    k = _mm512_sub_ps(_mm512_add_ps(k, _mm512_set1_ps(12582912.0f)), _mm512_set1_ps(12582912.0f));
    __m512 r = _mm512_sub_ps(c, _mm512_mul_ps(k, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(k, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r),
                      _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvttps_epi32(k), _mm512_set1_epi32(127)), 23);
    return _mm512_mask_blend_ps(nan, _mm512_mul_ps(p, _mm512_castsi512_ps(bits)), x);
}

/* ck_infer_erff of 16 values: the scalar code's operations in its order. */
__attribute__((target("avx512f"))) static __m512 erf16(__m512 x)
{
    const __m512i sign = _mm512_set1_epi32(INT32_MIN);
    __m512i xb = _mm512_castps_si512(x);
    __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, xb));
    a = _mm512_min_ps(a, _mm512_set1_ps(4.0f)); /* a < 4 ? a : 4, NaN too */
    __m512 t = _mm512_mul_ps(a, a);
    static const float pc[] = {-8.010336314e-04f, 5.188343115e-03f, -2.685382031e-02f,
                               1.128358543e-01f,  -3.761262596e-01f, 1.128379107e+00f};
    static const float rc[] = {-6.356790436e-06f, 1.501139377e-05f,  -5.373251042e-05f,
                               2.116935793e-04f,  -7.387534715e-04f, 2.466992708e-03f,
                               -7.999495603e-03f, 2.493792586e-02f,  -7.434757799e-02f,
                               2.108063698e-01f};
    __m512 p = _mm512_set1_ps(7.854361320e-05f);
    for (int i = 0; i < 6; i++)
        p = _mm512_add_ps(_mm512_mul_ps(p, t), _mm512_set1_ps(pc[i]));
    __m512 small = _mm512_mul_ps(a, p), u = _mm512_sub_ps(a, _mm512_set1_ps(2.5f));
    __m512 r = _mm512_set1_ps(1.553693778e-06f);
    for (int i = 0; i < 10; i++)
        r = _mm512_add_ps(_mm512_mul_ps(r, u), _mm512_set1_ps(rc[i]));
    __m512 negt = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(t), sign));
    __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(ck_infer_expf16(negt), r));
    __mmask16 lt1 = _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.0f), _CMP_LT_OQ);
    __m512 y = _mm512_mask_blend_ps(lt1, big, small);
    y = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(y), _mm512_and_si512(xb, sign)));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}

/* y = erf(x) or gelu(x) over the first n - n % 16 values; returns how many
 * it did. */
__attribute__((target("avx512f"))) static int64_t erf16_array(const float *x, float *y,
                                                               int64_t n, bool gelu)
{
    int64_t i = 0;
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512 c = _mm512_set1_ps((float)M_SQRT1_2);
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512 r = gelu ? _mm512_mul_ps(_mm512_mul_ps(half, v),
                                        _mm512_add_ps(one, erf16(_mm512_mul_ps(v, c))))
                        : erf16(v);
        _mm512_storeu_ps(y + i, r);
    }
    return i;
}

/* y = sigmoid(y) (silu false) or y sigmoid(y) over the first n - n % 16
 * values; returns how many it did. */
__attribute__((target("avx512f"))) static int64_t sigmoid16(float *y, int64_t n, bool silu)
{
    int64_t i = 0;
    __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(y + i);
        __m512 e = ck_infer_expf16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e));
        _mm512_storeu_ps(y + i, silu ? _mm512_mul_ps(x, s) : s);
    }
    return i;
}
#endif

void ck_infer_sigmoid_inplace(float *y, int64_t n, bool silu)
{
    int64_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (ck_infer_pgemm_available())
        i = sigmoid16(y, n, silu);
#endif
    if (silu)
        for (; i < n; i++)
            y[i] = y[i] * (1.0f / (1.0f + ck_infer_expf(-y[i])));
    else
        for (; i < n; i++)
            y[i] = 1.0f / (1.0f + ck_infer_expf(-y[i]));
}

void ck_infer_erf_array(const float *x, float *y, int64_t n, bool gelu)
{
    int64_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (ck_infer_pgemm_available())
        i = erf16_array(x, y, n, gelu);
#endif
    if (gelu)
        for (; i < n; i++)
            y[i] = 0.5f * x[i] * (1.0f + ck_infer_erff(x[i] * (float)M_SQRT1_2));
    else
        for (; i < n; i++)
            y[i] = ck_infer_erff(x[i]);
}

/* The activation folded into the node (fuse.c) over n outputs, in place:
 * the expressions of kernels_elementwise.c's kernels, so a folded
 * activation computes what the separate node did. */
static void epilogue(const struct ck_kcall *k, float *y, int64_t n)
{
    switch (k->act) {
    case CK_ACT_NONE:
        return;
    case CK_ACT_RELU:
        for (int64_t i = 0; i < n; i++)
            y[i] = y[i] < 0 ? 0.0f : y[i];
        return;
    case CK_ACT_CLIP:
        for (int64_t i = 0; i < n; i++)
            y[i] = y[i] < k->act_min ? k->act_min : y[i] > k->act_max ? k->act_max : y[i];
        return;
    case CK_ACT_SIGMOID:
        ck_infer_sigmoid_inplace(y, n, false);
        return;
    case CK_ACT_SILU:
        ck_infer_sigmoid_inplace(y, n, true);
        return;
    case CK_ACT_GELU:
        ck_infer_erf_array(y, y, n, true);
        return;
    case CK_ACT_GELU_TANH:
        for (int64_t i = 0; i < n; i++) {
            const float c = 0.7978845608028654f; /* sqrt(2/pi) */
            float x = y[i];
            y[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
        }
        return;
    }
}

static void add_bias_rows(float *y, int64_t rows, int64_t cols, const float *bias)
{
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            y[i * cols + j] += bias[j];
}

/* Rows of a product per block when threads share it. OpenBLAS computes a
 * tile of output columns and a partial tile in different orders, so a
 * product cut by columns, or by rows at a multiple of 4, 8 or 16, does not
 * give the same bits as the whole (measured on this Debian 12 OpenBLAS
 * 0.3.21, Haswell kernels: 12 output rows per tile). Cut at a multiple of
 * 24 rows (any tile of 1, 2, 3, 4, 6, 8, 12 or 24 rows) every output is
 * made by the same tile in the same order as in one call: the same bits at
 * any thread count (tests/e2e/test_infer_kernels.py Threads checks the
 * zoo's models byte for byte). */
#define GEMM_ROWS 24

struct dense_job {
    const struct ck_kcall *k;
    int64_t in, out;
};

static void dense_rows(void *arg, int64_t r0, int64_t r1)
{
    const struct dense_job *j = arg;
    const struct ck_kcall *k = j->k;
    int64_t in = j->in, out = j->out;
    float *y = k->out[0] + r0 * out;
    ck_infer_gemm(k->naive_gemm, false, k->n->p.trans_w, r1 - r0, out, in, k->in[0] + r0 * in, in,
                  k->in[1], k->n->p.trans_w ? in : out, 0.0f, y, out);
    if (k->nin > 2)
        add_bias_rows(y, r1 - r0, out, k->in[2]);
    epilogue(k, y, (r1 - r0) * out);
}

/* A dense product from its weights packed at load (pgemm.c): y [rows, out]
 * = x [rows, in] times the packed W, then the bias and the epilogue (bias
 * NULL: none; the epilogue only for dense, act none for matmul). Cut by
 * rows, or by columns (at tile edges) when the rows are fewer than the
 * columns: each output is computed the same way in either cut. */
struct pdense_job {
    const struct ck_kcall *k;
    const float *x, *bias;
    float *y;
    int64_t rows, in, out;
};

static void pdense_rows(void *arg, int64_t r0, int64_t r1)
{
    const struct pdense_job *j = arg;
    float *y = j->y + r0 * j->out;
    ck_infer_pgemm_dense(j->x, j->in, j->k->wpack, j->in, j->out, j->y, j->out, r0, r1, 0,
                         j->out);
    if (j->bias)
        add_bias_rows(y, r1 - r0, j->out, j->bias);
    epilogue(j->k, y, (r1 - r0) * j->out);
}

static void pdense_cols(void *arg, int64_t c0, int64_t c1)
{
    const struct pdense_job *j = arg;
    ck_infer_pgemm_dense(j->x, j->in, j->k->wpack, j->in, j->out, j->y, j->out, 0, j->rows, c0,
                         c1);
    for (int64_t i = 0; i < j->rows; i++) {
        float *y = j->y + i * j->out + c0;
        if (j->bias)
            for (int64_t c = 0; c < c1 - c0; c++)
                y[c] += j->bias[c0 + c];
        epilogue(j->k, y, c1 - c0);
    }
}

static void packed_dense(const struct ck_kcall *k, const float *bias, int64_t rows, int64_t in,
                         int64_t out)
{
    struct pdense_job j = {k, k->in[0], bias, k->out[0], rows, in, out};
    if (rows >= out)
        ck_pool_for(k->pool, rows, CK_PGEMM_MR, pdense_rows, &j);
    else
        ck_pool_for(k->pool, out, CK_PGEMM_NR, pdense_cols, &j);
}

static int dense(const struct ck_kcall *k)
{
    const struct ck_ishape *w = &k->ins[1];
    int64_t in = k->n->p.trans_w ? w->d[1] : w->d[0];
    int64_t out = ck_ishape_numel(w) / (in ? in : 1);
    int64_t rows = in ? ck_ishape_numel(&k->ins[0]) / in : 0;
    if (k->wpack) {
        packed_dense(k, k->nin > 2 ? k->in[2] : NULL, rows, in, out);
        return 0;
    }
    struct dense_job j = {k, in, out};
    ck_pool_for(k->pool, rows, GEMM_ROWS, dense_rows, &j);
    return 0;
}

struct matmul_job {
    const struct ck_kcall *k;
    int br;
    int64_t m, n, kk;
    const int64_t *bd, *sa, *sb;
};

static void matmul_batches(void *arg, int64_t t0, int64_t t1)
{
    const struct matmul_job *j = arg;
    const struct ck_kcall *k = j->k;
    int64_t m = j->m, n = j->n, kk = j->kk;
    for (int64_t t = t0; t < t1; t++) {
        int64_t rem = t, oa = 0, ob = 0;
        for (int i = j->br - 1; i >= 0; i--) {
            int64_t ix = rem % j->bd[i];
            rem /= j->bd[i];
            oa += ix * j->sa[i];
            ob += ix * j->sb[i];
        }
        ck_infer_gemm(k->naive_gemm, false, false, m, n, kk, k->in[0] + oa, kk, k->in[1] + ob, n,
                      0.0f, k->out[0] + t * m * n, n);
    }
}

/* One product (no batch dims) cut by rows. */
static void matmul_rows(void *arg, int64_t r0, int64_t r1)
{
    const struct matmul_job *j = arg;
    const struct ck_kcall *k = j->k;
    ck_infer_gemm(k->naive_gemm, false, false, r1 - r0, j->n, j->kk, k->in[0] + r0 * j->kk, j->kk,
                  k->in[1], j->n, 0.0f, k->out[0] + r0 * j->n, j->n);
}

/* Batched matmul: a's and b's batch dims broadcast to the output's. */
static int matmul(const struct ck_kcall *k)
{
    struct ck_ishape a = k->ins[0], b = k->ins[1];
    const struct ck_ishape *o = &k->outs[0];
    if (a.rank == 1)
        a = (struct ck_ishape){2, {1, a.d[0]}};
    if (b.rank == 1)
        b = (struct ck_ishape){2, {b.d[0], 1}};
    int64_t m = a.d[a.rank - 2], kk = a.d[a.rank - 1], n = b.d[b.rank - 1];
    int br = a.rank - 2 > b.rank - 2 ? a.rank - 2 : b.rank - 2;
    int64_t bd[CK_INFER_MAX_RANK], sa[CK_INFER_MAX_RANK], sb[CK_INFER_MAX_RANK];
    int64_t acca = m * kk, accb = kk * n, batches = 1;
    for (int i = br - 1; i >= 0; i--) {
        int ja = i - (br - (a.rank - 2)), jb = i - (br - (b.rank - 2));
        int64_t da = ja < 0 ? 1 : a.d[ja], db = jb < 0 ? 1 : b.d[jb];
        bd[i] = da == 1 ? db : da; /* numpy's rule, as the shape rule: 1 with 0 is 0 */
        sa[i] = da == 1 ? 0 : acca;
        sb[i] = db == 1 ? 0 : accb;
        acca *= da;
        accb *= db;
        batches *= bd[i];
    }
    if (k->wpack && k->ins[1].rank == 2) { /* a constant [kk, n]: one dense product */
        int64_t rows = n ? ck_ishape_numel(o) / n : 0;
        packed_dense(k, NULL, rows, kk, n);
        return 0;
    }
    struct matmul_job j = {k, br, m, n, kk, bd, sa, sb};
    if (batches > 1 || !k->pool)
        ck_pool_for(k->pool, batches, 1, matmul_batches, &j);
    else
        ck_pool_for(k->pool, m, GEMM_ROWS, matmul_rows, &j);
    return 0;
}

/* The output columns [lo, hi) whose input column xx*s + off is inside [0, w). */
static void valid_cols(int64_t w, int64_t ow, int64_t s, int64_t off, int64_t *lo, int64_t *hi)
{
    *lo = off >= 0 ? 0 : (-off + s - 1) / s;
    *hi = w - off <= 0 ? 0 : (w - off + s - 1) / s;
    if (*hi > ow)
        *hi = ow;
    if (*lo > *hi)
        *lo = *hi;
}

/* Columns of one image and group: [c*kh*kw, oh*ow], rows ld floats apart.
 * The padding columns of each kernel offset are computed once, so the inner
 * loop is a copy (a memcpy at stride 1). */
static void im2col(const float *x, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw,
                   const struct ck_op_params *p, int64_t oh, int64_t ow, float *col, int64_t ld)
{
    int64_t sx = p->stride[1];
    for (int64_t ci = 0; ci < c; ci++)
        for (int64_t ki = 0; ki < kh; ki++)
            for (int64_t kj = 0; kj < kw; kj++) {
                float *dst = col + ((ci * kh + ki) * kw + kj) * ld;
                const float *src = x + ci * h * w;
                int64_t off = kj * p->dilation[1] - p->pad[1], lo, hi;
                valid_cols(w, ow, sx, off, &lo, &hi);
                for (int64_t y = 0; y < oh; y++) {
                    int64_t iy = y * p->stride[0] - p->pad[0] + ki * p->dilation[0];
                    float *d = dst + y * ow;
                    if (iy < 0 || iy >= h) {
                        memset(d, 0, sizeof(float) * (size_t)ow);
                        continue;
                    }
                    /* indexed from the row's start: off may lie far outside it
                     * (a padding near 2^62), and a pointer there is undefined
                     * even unread (fuzz_graph); off + xx * sx is in [0, w) for
                     * xx in [lo, hi) */
                    const float *row = src + iy * w;
                    for (int64_t xx = 0; xx < lo; xx++)
                        d[xx] = 0.0f;
                    if (hi > lo && sx == 1)
                        memcpy(d + lo, row + off + lo, sizeof(float) * (size_t)(hi - lo));
                    else
                        for (int64_t xx = lo; xx < hi; xx++)
                            d[xx] = row[off + xx * sx];
                    for (int64_t xx = hi; xx < ow; xx++)
                        d[xx] = 0.0f;
                }
            }
}

static bool conv_is_pointwise(const struct ck_op_params *p, const struct ck_ishape *w)
{
    return w->d[2] == 1 && w->d[3] == 1 && p->stride[0] == 1 && p->stride[1] == 1 &&
           !p->pad[0] && !p->pad[1] && !p->pad[2] && !p->pad[3];
}

/* groups == channels, one input channel per group (the depthwise kernel) */
bool ck_infer_conv_is_depthwise(const struct ck_op_params *p, const struct ck_ishape *w)
{
    return p->groups > 1 && w->d[1] == 1 && w->d[2] <= 64 && w->d[3] <= 64; /* struct dw_row */
}

/* Images per product when groups == 1: small images are gathered so one
 * larger product replaces many small ones, within 256 KiB of columns and
 * results, so the columns im2col writes are still in L2 when OpenBLAS packs
 * them (measured on the reference models: 16 MiB chunks were up to 1.5x
 * slower on the residual block, 128 KiB chunks slower on both). */
#define CONV_CHUNK_FLOATS (INT64_C(64) << 10)

static int64_t conv_images_per_call(const struct ck_ishape *x, const struct ck_ishape *w,
                                    const struct ck_ishape *o)
{
    int64_t per = (w->d[1] * w->d[2] * w->d[3] + w->d[0]) * o->d[2] * o->d[3];
    int64_t nb = per ? CONV_CHUNK_FLOATS / per : 1;
    return nb < 1 ? 1 : nb > x->d[0] ? x->d[0] : nb;
}

static bool conv_batches(const struct ck_op_params *p, const struct ck_ishape *w)
{
    return p->groups == 1 && !conv_is_pointwise(p, w);
}

int64_t ck_infer_conv_scratch_floats(const struct ck_model_node *n, const struct ck_ishape *ins,
                                     const struct ck_ishape *outs)
{
    const struct ck_ishape *w = &ins[1];
    int64_t hw = outs[0].d[2] * outs[0].d[3], k = w->d[1] * w->d[2] * w->d[3];
    if (conv_batches(&n->p, w)) {
        int64_t nb = conv_images_per_call(&ins[0], w, &outs[0]);
        return nb == 1 ? k * hw : nb * (k + w->d[0]) * hw; /* one image: no results block */
    }
    return conv_is_pointwise(&n->p, w) || ck_infer_conv_is_depthwise(&n->p, w) ? 0 : k * hw;
}

int64_t ck_infer_conv_packed_scratch_floats(const struct ck_model_node *n,
                                            const struct ck_ishape *ins,
                                            const struct ck_ishape *outs)
{
    const struct ck_ishape *w = &ins[1];
    if (!conv_batches(&n->p, w))
        return 0;
    int64_t nb = conv_images_per_call(&ins[0], w, &outs[0]);
    return nb == 1 ? 0 : nb * w->d[0] * outs[0].d[2] * outs[0].d[3];
}

/* A product [m, kk] x [kk, ld] cut by blocks of GEMM_ROWS rows. */
struct rows_job {
    const struct ck_kcall *k;
    int64_t kk, ld;
    const float *a, *b;
    float *c;
};

static void gemm_rows(void *arg, int64_t r0, int64_t r1)
{
    const struct rows_job *j = arg;
    ck_infer_gemm(j->k->naive_gemm, false, false, r1 - r0, j->ld, j->kk, j->a + r0 * j->kk, j->kk,
                  j->b, j->ld, 0.0f, j->c + r0 * j->ld, j->ld);
}

/* The same product [m, kk] x [kk, ld] from the weights packed at load
 * (pgemm.c), cut by columns when it has more of them than rows, else by
 * rows: each output is computed the same way in either cut. */
struct pg_job {
    const float *ap;
    const struct ck_pgemm_src *src;
    int64_t m, n, kk, ldc;
    float *c;
};

static void pg_cols(void *arg, int64_t n0, int64_t n1)
{
    const struct pg_job *j = arg;
    ck_infer_pgemm(j->ap, j->m, j->kk, j->src, j->c, j->ldc, 0, j->m, n0, n1);
}

static void pg_rows(void *arg, int64_t m0, int64_t m1)
{
    const struct pg_job *j = arg;
    ck_infer_pgemm(j->ap, j->m, j->kk, j->src, j->c, j->ldc, m0, m1, 0, j->n);
}

/* C [m, n] = the weights a [m, kk] times col [kk, n], through OpenBLAS
 * (or plain loops), cut by rows. */
static void conv_product(const struct ck_kcall *k, const float *a, int64_t m, int64_t n,
                         int64_t kk, const float *col, float *c)
{
    struct rows_job gj = {k, kk, n, a, col, c};
    ck_pool_for(k->pool, m, GEMM_ROWS, gemm_rows, &gj);
}

/* C [m, n] (n apart) = packed weights ap [m, kk] times src [kk, n]. */
static void packed_product(const struct ck_kcall *k, const float *ap, int64_t m, int64_t n,
                           int64_t kk, const struct ck_pgemm_src *src, float *c)
{
    struct pg_job j = {ap, src, m, n, kk, n, c};
    if (n >= m)
        ck_pool_for(k->pool, n, CK_PGEMM_NR, pg_cols, &j);
    else
        ck_pool_for(k->pool, m, CK_PGEMM_MR, pg_rows, &j);
}

/* The im2col matrix of a convolution's input x (its group's first channel
 * of the first image; c channels, images img floats apart) for pgemm.c. */
static struct ck_pgemm_src image_src(const struct ck_kcall *k, const float *x, int64_t c,
                                     int64_t img)
{
    const struct ck_op_params *p = &k->n->p;
    const struct ck_ishape *xs = &k->ins[0], *w = &k->ins[1], *o = &k->outs[0];
    return (struct ck_pgemm_src){.x = x, .c = c, .h = xs->d[2], .w = xs->d[3], .kh = w->d[2],
                                 .kw = w->d[3], .sy = p->stride[0], .sx = p->stride[1],
                                 .py = p->pad[0], .px = p->pad[1], .dy = p->dilation[0],
                                 .dx = p->dilation[1], .oh = o->d[2], .ow = o->d[3],
                                 .img_stride = img};
}

/* The columns of cnt images (input channels cut among the threads). */
struct im2col_job {
    const struct ck_kcall *k;
    const float *x; /* the first image */
    int64_t c, h, w, kh, kw, oh, ow, ld;
    float *col;
};

static void im2col_part(void *arg, int64_t u0, int64_t u1)
{
    const struct im2col_job *j = arg;
    for (int64_t u = u0; u < u1; u++) { /* u: image * c + channel */
        int64_t i = u / j->c, ci = u % j->c;
        im2col(j->x + (i * j->c + ci) * j->h * j->w, 1, j->h, j->w, j->kh, j->kw, &j->k->n->p,
               j->oh, j->ow, j->col + ci * j->kh * j->kw * j->ld + i * j->oh * j->ow, j->ld);
    }
}

/* Each image's [o, hw] block of the product to its place, with bias and
 * epilogue, cut by output channels. */
struct scatter_job {
    const struct ck_kcall *k;
    int64_t b0, cnt, oc, hw, ld;
    const float *res;
};

static void scatter_part(void *arg, int64_t c0, int64_t c1)
{
    const struct scatter_job *j = arg;
    const struct ck_kcall *k = j->k;
    for (int64_t i = 0; i < j->cnt; i++)
        for (int64_t ch = c0; ch < c1; ch++) {
            float *dst = k->out[0] + ((j->b0 + i) * j->oc + ch) * j->hw;
            const float *src = j->res + ch * j->ld + i * j->hw;
            float bias = k->nin > 2 ? k->in[2][ch] : 0.0f;
            for (int64_t q = 0; q < j->hw; q++)
                dst[q] = src[q] + bias;
            epilogue(k, dst, j->hw);
        }
}

/* The bias and the epilogue of channels [c0, c1) of one image and group. */
struct bias_job {
    const struct ck_kcall *k;
    float *y;
    const float *bias; /* NULL: none */
    int64_t hw;
};

static void bias_part(void *arg, int64_t c0, int64_t c1)
{
    const struct bias_job *j = arg;
    for (int64_t c = c0; c < c1; c++) {
        float *row = j->y + c * j->hw;
        if (j->bias)
            for (int64_t i = 0; i < j->hw; i++)
                row[i] += j->bias[c];
        epilogue(j->k, row, j->hw);
    }
}

/* groups == 1: nb images' columns side by side [k, nb*hw], one product
 * [o, k] x [k, nb*hw], then each image's [o, hw] block to its place. */
static void conv2d_batched(const struct ck_kcall *k)
{
    const struct ck_op_params *p = &k->n->p;
    const struct ck_ishape *x = &k->ins[0], *w = &k->ins[1], *o = &k->outs[0];
    int64_t c = x->d[1], h = x->d[2], wd = x->d[3], oc = w->d[0], oh = o->d[2], ow = o->d[3];
    int64_t hw = oh * ow, kk = c * w->d[2] * w->d[3];
    int64_t nb = conv_images_per_call(x, w, o);
    (void)p;
    for (int64_t b0 = 0; b0 < x->d[0]; b0 += nb) {
        int64_t cnt = x->d[0] - b0 < nb ? x->d[0] - b0 : nb, ld = cnt * hw;
        float *col = k->scratch, *res = k->scratch + kk * ld;
        struct ck_pgemm_src src = image_src(k, k->in[0] + b0 * c * h * wd, c, c * h * wd);
        struct im2col_job ij = {k,  k->in[0] + b0 * c * h * wd, c, h, wd, w->d[2], w->d[3], oh,
                                ow, ld, col};
        if (k->wpack) /* pgemm.c reads the image itself: no columns */
            res = k->scratch;
        else
            ck_pool_for(k->pool, cnt * c, 1, im2col_part, &ij);
        if (nb == 1) { /* the product straight into the image's [o, hw] block */
            float *y = k->out[0] + b0 * oc * hw;
            if (k->wpack)
                packed_product(k, k->wpack, oc, hw, kk, &src, y);
            else
                conv_product(k, k->in[1], oc, hw, kk, col, y);
            struct bias_job bj = {k, y, k->nin > 2 ? k->in[2] : NULL, hw};
            ck_pool_for(k->pool, oc, 1, bias_part, &bj);
            continue;
        }
        if (k->wpack)
            packed_product(k, k->wpack, oc, ld, kk, &src, res);
        else
            conv_product(k, k->in[1], oc, ld, kk, col, res);
        struct scatter_job sj = {k, b0, cnt, oc, hw, ld, res};
        ck_pool_for(k->pool, oc, 1, scatter_part, &sj);
    }
}

/* groups == channels (depthwise, mult output channels per input channel):
 * no im2col, no product. Each output row is made in two parts: the columns
 * whose every tap reads inside the image, 8 at a time with the 8 sums in
 * registers over all the taps (one load and one multiply-add per tap and
 * column, one store per column; SSE2, x86-64's baseline), and the border columns, which add each
 * tap over the columns valid for it (valid_cols), so no loop tests a
 * bound. */
struct dw_row {
    const float *rows[64];  /* the input rows of the kernel's taps, NULL in the padding */
    const float *wk;        /* the channel's kh x kw weights */
    int64_t lo[64], hi[64]; /* kj's valid_cols */
    float bias;
};

/* Border columns: each tap only where its input column is inside the row. */
static void dw_border(const struct dw_row *r, const struct ck_op_params *p, int64_t kh,
                      int64_t kw, int64_t from, int64_t to, float *d)
{
    int64_t sx = p->stride[1];
    for (int64_t xx = from; xx < to; xx++) {
        float acc = 0.0f;
        for (int64_t ki = 0; ki < kh; ki++) {
            const float *row = r->rows[ki];
            if (!row)
                continue;
            for (int64_t kj = 0; kj < kw; kj++)
                /* off + xx * sx is inside the row for xx in [lo, hi): the
                 * index is formed only then (off may be near -2^62, fuzz_graph) */
                if (xx >= r->lo[kj] && xx < r->hi[kj])
                    acc += r->wk[ki * kw + kj] * row[kj * p->dilation[1] - p->pad[1] + xx * sx];
        }
        d[xx] = acc + r->bias;
    }
}

#ifdef __SSE2__
/* 8 output columns at stride 1 or 2: two 4-wide sums in registers over
 * every tap (at stride 2 the even floats of 8 loaded). */
static inline void dw_eight(const struct dw_row *r, int64_t kh, int64_t kw, int64_t sx,
                            int64_t dx, int64_t at, float *d)
{
    __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps();
    for (int64_t ki = 0; ki < kh; ki++) {
        const float *row = r->rows[ki];
        if (!row)
            continue;
        const float *wk = r->wk + ki * kw;
        for (int64_t kj = 0; kj < kw; kj++) {
            const float *q = row + at + kj * dx;
            __m128 wv = _mm_set1_ps(wk[kj]), v0, v1;
            if (sx == 1) {
                v0 = _mm_loadu_ps(q);
                v1 = _mm_loadu_ps(q + 4);
            } else {
                v0 = _mm_shuffle_ps(_mm_loadu_ps(q), _mm_loadu_ps(q + 4), _MM_SHUFFLE(2, 0, 2, 0));
                v1 = _mm_shuffle_ps(_mm_loadu_ps(q + 8), _mm_loadu_ps(q + 12),
                                    _MM_SHUFFLE(2, 0, 2, 0));
            }
            a0 = _mm_add_ps(a0, _mm_mul_ps(wv, v0));
            a1 = _mm_add_ps(a1, _mm_mul_ps(wv, v1));
        }
    }
    __m128 bv = _mm_set1_ps(r->bias);
    _mm_storeu_ps(d, _mm_add_ps(a0, bv));
    _mm_storeu_ps(d + 4, _mm_add_ps(a1, bv));
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
/* The columns [lo, hi) at stride 1 or 2, 16 at a time with AVX-512 (the
 * last ones under a mask, which loads nothing past them): the sums of
 * dw_eight and of the scalar loop, tap by tap in the same order, product
 * and sum each rounded, so the same bits. At stride 2 the even floats of
 * the 2 cnt - 1 the columns read. */
__attribute__((target("avx512f"))) static void dw_sixteen(const struct dw_row *r, int64_t kh,
                                                           int64_t kw, int64_t sx, int64_t dx,
                                                           int64_t x0, int64_t lo, int64_t hi,
                                                           float *d)
{
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4,
                                          2, 0);
    const __m512 bias = _mm512_set1_ps(r->bias);
    for (int64_t xx = lo; xx < hi; xx += 16) {
        int cnt = hi - xx < 16 ? (int)(hi - xx) : 16, span = 2 * cnt - 1;
        __mmask16 m = (__mmask16)((1u << cnt) - 1);
        __mmask16 m0 = (__mmask16)(span >= 16 ? 0xffffu : (1u << span) - 1);
        __mmask16 m1 = (__mmask16)(span <= 16 ? 0u : (1u << (span - 16)) - 1);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t ki = 0; ki < kh; ki++) {
            const float *row = r->rows[ki];
            if (!row)
                continue;
            const float *wk = r->wk + ki * kw;
            for (int64_t kj = 0; kj < kw; kj++) {
                const float *q = row + x0 + xx * sx + kj * dx;
                __m512 v;
                if (sx == 1)
                    v = _mm512_maskz_loadu_ps(m, q);
                else
                    v = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(m0, q), even,
                                               _mm512_maskz_loadu_ps(m1, q + 16));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(wk[kj]), v));
            }
        }
        _mm512_mask_storeu_ps(d + xx, m, _mm512_add_ps(acc, bias));
    }
}
#endif

/* The columns [lo, hi) are inside the image for every tap: no test at all. */
static void dw_inner(const struct dw_row *r, const struct ck_op_params *p, int64_t kh, int64_t kw,
                     int64_t lo, int64_t hi, float *d)
{
    int64_t sx = p->stride[1], dx = p->dilation[1], x0 = -p->pad[1];
    int64_t xx = lo;
#if defined(__x86_64__) && defined(__GNUC__)
    if ((sx == 1 || sx == 2) && ck_infer_pgemm_available()) {
        dw_sixteen(r, kh, kw, sx, dx, x0, lo, hi, d);
        return;
    }
#endif
#ifdef __SSE2__
    /* at stride 2 the last load reads one float past the 8th column's: only
     * while that float is a column a later output reads too (hi - 1) */
    if (sx == 1)
        for (; xx + 8 <= hi; xx += 8)
            dw_eight(r, kh, kw, 1, dx, x0 + xx, d + xx);
    else if (sx == 2)
        for (; xx + 9 <= hi; xx += 8)
            dw_eight(r, kh, kw, 2, dx, x0 + 2 * xx, d + xx);
#endif
    for (; xx < hi; xx++) {
        float acc = 0.0f;
        for (int64_t ki = 0; ki < kh; ki++) {
            const float *row = r->rows[ki];
            if (!row)
                continue;
            const float *wk = r->wk + ki * kw;
            for (int64_t kj = 0; kj < kw; kj++)
                acc += wk[kj] * row[x0 + xx * sx + kj * dx];
        }
        d[xx] = acc + r->bias;
    }
}

struct dw_job {
    const struct ck_kcall *k;
    const struct dw_row *r; /* lo and hi of every kj */
    int64_t lo, hi;         /* the columns every tap reads inside the image */
};

/* Output channels [u0, u1) of every image (u: image * channels + channel). */
static void dw_part(void *arg, int64_t u0, int64_t u1)
{
    const struct dw_job *j = arg;
    const struct ck_kcall *k = j->k;
    const struct ck_op_params *p = &k->n->p;
    const struct ck_ishape *x = &k->ins[0], *w = &k->ins[1], *o = &k->outs[0];
    int64_t c = x->d[1], h = x->d[2], wd = x->d[3], oc = o->d[1], oh = o->d[2], ow = o->d[3];
    int64_t kh = w->d[2], kw = w->d[3], mult = oc / c;
    struct dw_row r = *j->r;
    for (int64_t u = u0; u < u1; u++) {
        int64_t b = u / oc, ch = u % oc;
        const float *src = k->in[0] + (b * c + ch / mult) * h * wd;
        float *dst = k->out[0] + (b * oc + ch) * oh * ow;
        r.bias = k->nin > 2 ? k->in[2][ch] : 0.0f;
        r.wk = k->in[1] + ch * kh * kw;
        for (int64_t y = 0; y < oh; y++) {
            float *d = dst + y * ow;
            for (int64_t ki = 0; ki < kh; ki++) {
                int64_t iy = y * p->stride[0] - p->pad[0] + ki * p->dilation[0];
                r.rows[ki] = iy < 0 || iy >= h ? NULL : src + iy * wd;
            }
            dw_border(&r, p, kh, kw, 0, j->lo, d);
            dw_inner(&r, p, kh, kw, j->lo, j->hi, d);
            dw_border(&r, p, kh, kw, j->hi, ow, d);
            epilogue(k, d, ow);
        }
    }
}

static void conv2d_depthwise(const struct ck_kcall *k)
{
    const struct ck_op_params *p = &k->n->p;
    const struct ck_ishape *x = &k->ins[0], *w = &k->ins[1], *o = &k->outs[0];
    int64_t wd = x->d[3], oc = o->d[1], ow = o->d[3], kw = w->d[3], lo = 0, hi = ow;
    struct dw_row r;
    /* the output columns every tap reads inside the image: the
     * intersection of each kj's valid_cols */
    for (int64_t kj = 0; kj < kw; kj++) {
        valid_cols(wd, ow, p->stride[1], kj * p->dilation[1] - p->pad[1], &r.lo[kj], &r.hi[kj]);
        lo = r.lo[kj] > lo ? r.lo[kj] : lo;
        hi = r.hi[kj] < hi ? r.hi[kj] : hi;
    }
    if (lo > hi)
        lo = hi;
    struct dw_job j = {k, &r, lo, hi};
    ck_pool_for(k->pool, x->d[0] * oc, 1, dw_part, &j);
}

static int conv2d(const struct ck_kcall *k)
{
    const struct ck_op_params *p = &k->n->p;
    const struct ck_ishape *x = &k->ins[0], *w = &k->ins[1], *o = &k->outs[0];
    int64_t g = p->groups, cg = w->d[1], og = w->d[0] / g, kh = w->d[2], kw = w->d[3];
    int64_t h = x->d[2], wd = x->d[3], oh = o->d[2], ow = o->d[3], kk = cg * kh * kw;
    bool pointwise = conv_is_pointwise(p, w);
    if (ck_infer_conv_is_depthwise(p, w)) {
        conv2d_depthwise(k);
        return 0;
    }
    if (conv_batches(p, w)) {
        conv2d_batched(k);
        return 0;
    }
    for (int64_t b = 0; b < x->d[0]; b++)
        for (int64_t gi = 0; gi < g; gi++) {
            const float *xi = k->in[0] + (b * x->d[1] + gi * cg) * h * wd;
            float *yi = k->out[0] + (b * o->d[1] + gi * og) * oh * ow;
            if (k->wpack) { /* pgemm.c reads the image (or the 1x1 input as it is) */
                struct ck_pgemm_src src = pointwise ? (struct ck_pgemm_src){.b = xi, .ldb = oh * ow}
                                                    : image_src(k, xi, cg, 0);
                packed_product(k, k->wpack + gi * ck_infer_pgemm_pack_floats(og, kk), og,
                               oh * ow, kk, &src, yi);
            } else {
                const float *col = xi;
                if (!pointwise) {
                    struct im2col_job ij = {k, xi, cg, h, wd, kh, kw, oh, ow, oh * ow, k->scratch};
                    ck_pool_for(k->pool, cg, 1, im2col_part, &ij);
                    col = k->scratch;
                }
                conv_product(k, k->in[1] + gi * og * kk, og, oh * ow, kk, col, yi);
            }
            struct bias_job bj = {k, yi, k->nin > 2 ? k->in[2] + gi * og : NULL, oh * ow};
            ck_pool_for(k->pool, og, 1, bias_part, &bj);
        }
    return 0;
}

int ck_infer_k_linear(const struct ck_kcall *k)
{
    switch (k->n->op) {
    case CK_OP_DENSE: return dense(k);
    case CK_OP_MATMUL: return matmul(k);
    case CK_OP_CONV2D: return conv2d(k);
    default:
        return ck_error(CK_EFORMAT, "node '%s': op '%s' is not a product", k->n->name,
                        ck_op_name(k->n->op));
    }
}
