/* The engine's parts, shared between infer.c, shape.c, plan.c and the
 * kernel files; not for callers outside infer/. */
#ifndef CK_INFER_INTERNAL_H
#define CK_INFER_INTERNAL_H

#include "infer/infer.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct ck_ishape {
    int rank;
    int64_t d[CK_INFER_MAX_RANK];
};

/* Largest element count of one value (2^40 floats = 4 TiB: beyond any real
 * model, small enough that byte sizes never overflow). */
#define CK_INFER_NUMEL_MAX CK_MODEL_NUMEL_MAX
/* Largest shape value the plan computes as integers (8 MiB of int64): a
 * range of a million positions, a causal mask of 1024 x 1024. */
#define CK_INFER_SHAPEVAL_MAX (INT64_C(1) << 20)

/* numel of s; -1 when over CK_INFER_NUMEL_MAX. */
int64_t ck_ishape_numel(const struct ck_ishape *s);
/* "[1, 3, 28, 28]" into buf (size at least 16). */
const char *ck_ishape_text(const struct ck_ishape *s, char *buf, size_t size);

/* The output shapes of node n (n->noutputs of them) from its input shapes.
 * inconst[i], when not NULL, is input i's data when it is a weight (the
 * shape ops never need it; it is there for gather's bounds). CK_EFORMAT
 * naming the node when the shapes do not chain. */
int ck_infer_node_shapes(const struct ck_model_node *n, const struct ck_ishape *in, size_t nin,
                         struct ck_ishape *out);

/* An activation a convolution or dense layer applies to its own output
 * after the bias (the node that computed it folded in, fuse.c). */
enum ck_infer_act {
    CK_ACT_NONE,
    CK_ACT_RELU,
    CK_ACT_CLIP,      /* to [act_min, act_max] (relu6) */
    CK_ACT_SIGMOID,
    CK_ACT_SILU,      /* x sigmoid(x): a sigmoid and the product with its input */
    CK_ACT_GELU,      /* erf form */
    CK_ACT_GELU_TANH,
};

/* e^x in float32 within 2 ulp of libm's expf for x in [-87.3, 88.3]
 * (Cephes' expf: x = k ln2 + r with |r| <= ln2 / 2, a degree-5 minimax
 * polynomial of r, 2^k made in the exponent's bits), without a branch, so a
 * loop of it is vectorised where libm's expf is a call per value (a sixth of
 * efficientnet_b0's time went to its SiLUs' expf). Outside that range x is
 * clamped to it: below, e^-87.3 (1.2e-38) where libm gives a smaller or
 * zero value; above, e^88.3 (2.1e38) where libm reaches infinity past 88.7.
 * For the sigmoids that use it (1 / (1 + e^-x)) both are within 5e-39 of
 * 0 or 1. NaN gives NaN. */
static inline float ck_infer_expf(float x)
{
    float c = x != x ? 0.0f : x; /* NaN: a number until the end */
    c = c > 88.3762626647949f ? 88.3762626647949f : c;
    c = c < -87.3365447505531f ? -87.3365447505531f : c;
    float k = c * 1.44269504088896341f;
    k = (k + 12582912.0f) - 12582912.0f; /* to the nearest integer (1.5 x 2^23) */
    float r = c - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)k + 127) << 23; /* k in [-126, 127] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x != x ? x : p * scale;
}

/* erf(x) in float32 within 4 ulp of libm's erff (test_infer.c's
 * erf_within_four_ulp_of_libm sweeps every 61st float and a fine grid of
 * [-5, 5]), without a branch, so it runs 16 at a time (ck_infer_erf_array):
 * GELU's libm erff, a call per value, was a fifth of a transformer's time.
 * |x| < 1: x P(x^2), P of degree 6; up to 4: 1 - e^(-x^2) R(|x| - 2.5), R
 * of degree 10 (erfc(x) e^(x^2) is smooth there), e^ by ck_infer_expf;
 * both fitted to erf in double (weighted least squares towards the
 * minimax) and rounded to float32 by scripts/erf_fit.py. Past 4 erf is +-1 in float32 (|x| is
 * clamped there); the sign is x's; NaN gives NaN. */
static inline float ck_infer_erff(float x)
{
    float a = fabsf(x);
    a = a < 4.0f ? a : 4.0f; /* NaN: 4, and NaN again at the end */
    float t = a * a;
    float p = 7.854361320e-05f;
    p = p * t + -8.010336314e-04f;
    p = p * t + 5.188343115e-03f;
    p = p * t + -2.685382031e-02f;
    p = p * t + 1.128358543e-01f;
    p = p * t + -3.761262596e-01f;
    p = p * t + 1.128379107e+00f;
    float small = a * p, u = a - 2.5f;
    float r = 1.553693778e-06f;
    r = r * u + -6.356790436e-06f;
    r = r * u + 1.501139377e-05f;
    r = r * u + -5.373251042e-05f;
    r = r * u + 2.116935793e-04f;
    r = r * u + -7.387534715e-04f;
    r = r * u + 2.466992708e-03f;
    r = r * u + -7.999495603e-03f;
    r = r * u + 2.493792586e-02f;
    r = r * u + -7.434757799e-02f;
    r = r * u + 2.108063698e-01f;
    float big = 1.0f - ck_infer_expf(-t) * r;
    float y = copysignf(a < 1.0f ? small : big, x);
    return x != x ? x : y;
}

/* y[0, n) = erf(x) (gelu false) or GELU's 0.5 x (1 + erf(x / sqrt 2)),
 * ck_infer_erff's: 16 at a time where the CPU has AVX-512F, the same
 * operations in the same order, so the same bits as the scalar loop
 * (kernels_linear.c). y may be x. */
void ck_infer_erf_array(const float *x, float *y, int64_t n, bool gelu);

/* y[0, n) = 1 / (1 + ck_infer_expf(-y)) (silu false) or y times that, in
 * place: 16 at a time where the CPU has AVX-512F, the same operations in
 * the same order, so the same bits as the scalar loop (kernels_linear.c). */
void ck_infer_sigmoid_inplace(float *y, int64_t n, bool silu);
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* ck_infer_expf of 16 values (AVX-512F only: after ck_infer_pgemm_available). */
__attribute__((target("avx512f"))) __m512 ck_infer_expf16(__m512 x);
#endif

/* One node's kernel call. */
struct ck_kcall {
    const struct ck_model_node *n;
    const float *const *in;
    const struct ck_ishape *ins;
    size_t nin;
    float *const *out;
    const struct ck_ishape *outs;
    bool naive_gemm;
    float *scratch; /* ck_infer_scratch_floats(n, ins) floats */
    enum ck_infer_act act; /* conv2d and dense only */
    float act_min, act_max;
    const enum ck_dtype *indt, *outdt; /* each input's and output's dtype (values are float32) */
    struct ck_pool *pool; /* the engine's threads (infer/pool.h); NULL: this one only */
    const float *wpack; /* conv2d: its weights packed at load (pgemm.c), each group's
                           ck_infer_pgemm_pack_floats(og, kk) apart; dense, and matmul
                           by a constant matrix: the weight packed by
                           ck_infer_pgemm_packb; NULL: none */
};

/* Floats of scratch the node's kernel needs (conv2d's im2col). */
int64_t ck_infer_scratch_floats(const struct ck_model_node *n, const struct ck_ishape *ins,
                                const struct ck_ishape *outs);
/* groups == channels, one input channel per group: kernels_linear.c's
 * depthwise kernel, not a product. */
bool ck_infer_conv_is_depthwise(const struct ck_op_params *p, const struct ck_ishape *w);
int64_t ck_infer_conv_scratch_floats(const struct ck_model_node *n, const struct ck_ishape *ins,
                                     const struct ck_ishape *outs);
/* A convolution with packed weights (pgemm.c) writes no im2col matrix:
 * only the results of images gathered into one product. */
int64_t ck_infer_conv_packed_scratch_floats(const struct ck_model_node *n,
                                            const struct ck_ishape *ins,
                                            const struct ck_ishape *outs);
/* Runs the node; CK_EFORMAT naming node and op for an op the engine does not run. */
int ck_infer_kernel(const struct ck_kcall *k);

/* The kernel families (kernels_*.c). */
int ck_infer_k_elementwise(const struct ck_kcall *k);
int ck_infer_k_binary(const struct ck_kcall *k);
int ck_infer_k_linear(const struct ck_kcall *k); /* dense, matmul, conv2d */
int ck_infer_k_pool(const struct ck_kcall *k);
int ck_infer_k_norm(const struct ck_kcall *k);   /* softmax, batchnorm, layernorm, reduce */
int ck_infer_k_layout(const struct ck_kcall *k); /* transpose ... gather, pad */
int ck_infer_k_reduce(const struct ck_kcall *k); /* reduce_mean ... reduce_l2 */
int ck_infer_k_math(const struct ck_kcall *k);   /* abs ... shrink */
int ck_infer_k_conv_transpose(const struct ck_kcall *k);
int ck_infer_k_rnn(const struct ck_kcall *k); /* rnn, gru, lstm */
int ck_infer_k_grid_sample(const struct ck_kcall *k);
int ck_infer_k_select(const struct ck_kcall *k); /* where ... resize (kernels_select.c) */
int ck_infer_k_topk(const struct ck_kcall *k);   /* kernels_sort.c */
int ck_infer_k_cast(const struct ck_kcall *k);   /* kernels_int.c */
/* The integer arithmetic (kernels_int.c): whether it computes node n with
 * these dtypes (every input an integer or bool, the output an integer), and
 * the kernel. */
bool ck_infer_int_node(const struct ck_model_node *n, const enum ck_dtype *indt, size_t nin,
                       enum ck_dtype out);
int ck_infer_k_int(const struct ck_kcall *k);
/* v rounded to t's precision: float16 and bfloat16 to nearest even, other
 * dtypes unchanged. */
void ck_infer_round_to(enum ck_dtype t, float *v, int64_t n);
/* A node whose inputs after the first are its parameters (a reshape's shape,
 * a slice's bounds...): they say nothing of its values' dtype (shapeval.c). */
bool ck_infer_params_as_inputs(const struct ck_model_node *n);
int ck_infer_k_shapeval(const struct ck_kcall *k); /* shape ops the plan did not evaluate: an error (shapeval.c) */
/* resize: the output extent of axis a for an input extent in, and its scale;
 * false when the parameters do not describe it (kernels_select.c). */
bool ck_infer_resize_axis(const struct ck_model_node *n, int a, int64_t in, int64_t *out,
                          double *scale);

/* C = alpha op(A) op(B) + beta C, row major; BLAS (single thread) or plain loops. */
void ck_infer_gemm(bool naive, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                   int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

int ck_infer_reduce_axes(const struct ck_model_node *n, int rank, bool *axes);
/* The step a slice of an axis of size elements really takes (a file's step
 * clamped to [-size - 1, size + 1], which changes nothing it selects). */
int64_t ck_infer_slice_step(int64_t size, int64_t step);
void ck_infer_slice_axis(int64_t size, int64_t start, int64_t end, int64_t step, int64_t *first,
                         int64_t *count);

/* Products with weights packed at load (pgemm.c): whether this CPU runs
 * them (AVX-512F), the floats m x k weights take packed, their packing,
 * and C[m0:m1, n0:n1] = A[m0:m1, :] B[:, n0:n1] from the packed A (m0 a
 * multiple of CK_PGEMM_MR), C ldc apart.
 * Each element of C is computed the same way whatever range a call
 * covers. */
#define CK_PGEMM_MR 8
#define CK_PGEMM_NR 32 /* columns of a tile */
bool ck_infer_pgemm_available(void);
int64_t ck_infer_pgemm_pack_floats(int64_t m, int64_t k);
void ck_infer_pgemm_pack(int64_t m, int64_t k, const float *a, int64_t lda, float *ap);
/* B of a packed product: a matrix [k, n] (x NULL), or a convolution's
 * im2col matrix read from its input (x: the group's first channel of the
 * first image; c channels of h x w, images img_stride floats apart; the
 * columns are the output pixels of the images side by side). */
struct ck_pgemm_src {
    const float *b;
    int64_t ldb;
    const float *x;
    int64_t c, h, w, kh, kw, sy, sx, py, px, dy, dx, oh, ow, img_stride;
};
void ck_infer_pgemm(const float *ap, int64_t m, int64_t k, const struct ck_pgemm_src *src,
                    float *c, int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
/* Dense layers (a weight on the right): the floats a [k, n] weight takes
 * packed, its packing (b [k, n] ldb apart, or with trans b [n, k]: ONNX
 * Gemm's transB, torch's Linear), and C[m0:m1, n0:n1] = A[m0:m1, :] B[:,
 * n0:n1] from the packed B, A [m, k] lda apart (n0 a multiple of
 * CK_PGEMM_NR; m0 anywhere). Each element of C is computed the same way
 * whatever range a call covers. */
int64_t ck_infer_pgemm_packb_floats(int64_t k, int64_t n);
void ck_infer_pgemm_packb(int64_t k, int64_t n, const float *b, int64_t ldb, bool trans,
                          float *bp);
/* The rows [k0, k1) of the packed B only (the same floats packb writes there). */
void ck_infer_pgemm_packb_rows(int64_t k, int64_t n, const float *b, int64_t ldb, bool trans,
                               int64_t k0, int64_t k1, float *bp);
void ck_infer_pgemm_dense(const float *a, int64_t lda, const float *bp, int64_t k, int64_t n,
                          float *c, int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1);

/* OpenBLAS loaded on first use (blas.c); false when it cannot be. */
bool ck_infer_blas_available(void);
void ck_infer_blas_sgemm(bool ta, bool tb, int m, int n, int k, const float *a, int lda,
                         const float *b, int ldb, float beta, float *c, int ldc);

/* The axis a (negative counts from the end) in [0, rank), or -1. */
int ck_infer_norm_axis(int64_t a, int rank);

#endif
