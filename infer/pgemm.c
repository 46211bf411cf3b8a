/* Products with weights packed once at load (issue 31): C = A B, A a
 * convolution's weights [m, k] (row major), B its columns [k, n] (im2col's,
 * or the input itself for a 1x1 convolution), C its output [m, n], n the
 * contiguous axis. OpenBLAS packs A again on every call (a 512 x 4608
 * weight matrix read and rewritten for a product of 49 columns in
 * ResNet-18's last layers); here A is packed when the engine loads, in
 * panels of PG_MR rows, k-major ([panel][k][PG_MR], rows past m zero).
 *
 * Blocking (the usual GEMM loops): columns in blocks of PG_NC, k in blocks
 * of PG_KC; each block of B is copied into panels of PG_NR columns
 * ([panel][k][PG_NR], columns past n zero) -- for a convolution straight
 * from its input image, so no im2col matrix is written --, then for each panel of A and of
 * B a micro-kernel keeps a PG_MR x PG_NR tile of C in registers over the
 * block's k (AVX-512: 16 accumulators of 16 floats, the B panel's two
 * vectors loaded once per k, each A value broadcast).
 *
 * Every element of C is one chain of fused multiply-adds over k in order
 * within each k block, the blocks' sums added to C in order: the same bits
 * whatever part of C a call computes (rows or columns, tile edges), so the
 * engine's threads can cut the product anywhere and give the same output.
 *
 * Dense layers (Gemm, a MatMul by a constant matrix or by its transpose)
 * have their weight on the right: there B is packed at load, in panels of
 * PG_NR columns over the whole k ([panel][k][PG_NR], columns past n zero),
 * and each call packs blocks of PG_MC rows of A (the activations) by k
 * block into panels of PG_MR, then runs the same micro-kernels: the same
 * one chain of FMAs per k block, so the same bits whatever rows or tile
 * columns a call covers.
 *
 * Only where the CPU has AVX-512F (checked at run time; the binary is built
 * for x86-64's baseline): elsewhere ck_infer_pgemm_available() is false and
 * the convolution goes through OpenBLAS as before. */
#include "infer/internal.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define PG_X86 1
#include <immintrin.h>
#endif

#define PG_KC 256
#define PG_NC 128
#define PG_MC 64 /* rows of A a dense product packs at a time (64 KiB at PG_KC) */

bool ck_infer_pgemm_available(void)
{
#ifdef PG_X86
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx512f") ? 1 : 0;
    }
    return have == 1;
#else
    return false;
#endif
}

int64_t ck_infer_pgemm_pack_floats(int64_t m, int64_t k)
{
    return (m + CK_PGEMM_MR - 1) / CK_PGEMM_MR * CK_PGEMM_MR * k;
}

void ck_infer_pgemm_pack(int64_t m, int64_t k, const float *a, int64_t lda, float *ap)
{
    int64_t panels = (m + CK_PGEMM_MR - 1) / CK_PGEMM_MR;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t r = 0; r < CK_PGEMM_MR; r++) {
                int64_t row = p * CK_PGEMM_MR + r;
                ap[(p * k + kk) * CK_PGEMM_MR + r] = row < m ? a[row * lda + kk] : 0.0f;
            }
}

int64_t ck_infer_pgemm_packb_floats(int64_t k, int64_t n)
{
    return (n + CK_PGEMM_NR - 1) / CK_PGEMM_NR * CK_PGEMM_NR * k;
}

void ck_infer_pgemm_packb_rows(int64_t k, int64_t n, const float *b, int64_t ldb, bool trans,
                               int64_t k0, int64_t k1, float *bp)
{
    int64_t panels = (n + CK_PGEMM_NR - 1) / CK_PGEMM_NR;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t kk = k0; kk < k1; kk++)
            for (int64_t c = 0; c < CK_PGEMM_NR; c++) {
                int64_t col = p * CK_PGEMM_NR + c;
                float v = 0.0f;
                if (col < n)
                    v = trans ? b[col * ldb + kk] : b[kk * ldb + col];
                bp[(p * k + kk) * CK_PGEMM_NR + c] = v;
            }
}

void ck_infer_pgemm_packb(int64_t k, int64_t n, const float *b, int64_t ldb, bool trans,
                          float *bp)
{
    ck_infer_pgemm_packb_rows(k, n, b, ldb, trans, 0, k, bp);
}

#ifdef PG_X86
#define PG_NR 32

/* One tile: rows valid rows (<= PG_MR) and cols valid columns (<= PG_NR) of
 * C at c, from kc steps of the A panel at a and the B panel at b; add: C
 * += the tile (a later k block), else C = the tile. NV vectors of 16
 * columns (1 when cols <= 16: half the work for a narrow last tile). */
#define PG_KERNEL(NAME, NV)                                                                        \
    __attribute__((target("avx512f"))) static void NAME(int64_t kc, const float *a,            \
                                                          const float *b, float *c, int64_t ldc, \
                                                          int rows, int cols, bool add)          \
    {                                                                                              \
        __m512 acc[CK_PGEMM_MR][NV];                                                               \
        _Pragma("GCC unroll 8") for (int r = 0; r < CK_PGEMM_MR; r++)                              \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps(); \
        for (int64_t p = 0; p < kc; p++) {                                                         \
            __m512 bv[NV];                                                                         \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) bv[v] =                           \
                _mm512_load_ps(b + p * PG_NR + 16 * v);                                            \
            _Pragma("GCC unroll 8") for (int r = 0; r < CK_PGEMM_MR; r++)                          \
            {                                                                                      \
                __m512 av = _mm512_set1_ps(a[p * CK_PGEMM_MR + r]);                                \
                _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) acc[r][v] =                   \
                    _mm512_fmadd_ps(av, bv[v], acc[r][v]);                                         \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)                                       \
        {                                                                                          \
            int left = cols - 16 * v;                                                              \
            __mmask16 mk = left >= 16 ? (__mmask16)0xffff                                          \
                                      : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);             \
            _Pragma("GCC unroll 8") for (int r = 0; r < CK_PGEMM_MR; r++)                          \
            {                                                                                      \
                if (r >= rows)                                                                     \
                    break;                                                                         \
                float *d = c + r * ldc + 16 * v;                                                   \
                __m512 x = acc[r][v];                                                              \
                if (add)                                                                           \
                    x = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, d), x);                            \
                _mm512_mask_storeu_ps(d, mk, x);                                                   \
            }                                                                                      \
        }                                                                                          \
    }

PG_KERNEL(kernel2, 2)
PG_KERNEL(kernel1, 1)

/* Columns [n0, n0 + nc) of rows [k0, k0 + kc) of a matrix B into panels
 * of PG_NR. */
__attribute__((target("avx512f"))) static void pack_matrix(const float *b, int64_t ldb,
                                                            int64_t k0, int64_t kc, int64_t n0,
                                                            int64_t nc, float *bp)
{
    int64_t panels = (nc + PG_NR - 1) / PG_NR;
    for (int64_t p = 0; p < kc; p++) {
        const float *src = b + (k0 + p) * ldb + n0;
        for (int64_t j = 0; j < panels; j++) {
            float *d = bp + (j * kc + p) * PG_NR;
            int64_t w = nc - j * PG_NR;
            if (w >= PG_NR) {
                _mm512_store_ps(d, _mm512_loadu_ps(src + j * PG_NR));
                _mm512_store_ps(d + 16, _mm512_loadu_ps(src + j * PG_NR + 16));
            } else {
                memset(d, 0, sizeof(float) * PG_NR);
                memcpy(d, src + j * PG_NR, sizeof(float) * (size_t)w);
            }
        }
    }
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

/* A run of block columns inside one output row and one panel. */
struct pg_seg {
    int64_t t;   /* the first column's place in the block */
    int64_t img; /* the image's offset in floats */
    int64_t oy, ox, len;
};

/* The same block of B when B is a convolution's im2col matrix, read from
 * the image itself: row kk is input channel kk / (kh kw) at kernel offset
 * (ki, kj), column n output pixel n of the images side by side. The
 * block's columns are cut once into runs inside one output row and one
 * panel (the same for every row of the block); each run is a copy from
 * one input row, the padding zeros. */
static void pack_image(const struct ck_pgemm_src *s, int64_t k0, int64_t kc, int64_t n0,
                       int64_t nc, float *bp)
{
    struct pg_seg seg[PG_NC * 2];
    int64_t nseg = 0, hw = s->oh * s->ow, khw = s->kh * s->kw;
    for (int64_t t = 0; t < nc;) {
        int64_t n = n0 + t, ox = n % s->ow;
        int64_t len = s->ow - ox, in = PG_NR - t % PG_NR;
        len = len < in ? len : in;
        len = len < nc - t ? len : nc - t;
        seg[nseg++] = (struct pg_seg){t, n / hw * s->img_stride, n % hw / s->ow, ox, len};
        t += len;
    }
    for (int64_t p = 0; p < kc; p++) {
        int64_t kk = k0 + p, ci = kk / khw, ki = kk % khw / s->kw, kj = kk % s->kw;
        int64_t offx = kj * s->dx - s->px, offy = ki * s->dy - s->py, lo, hi;
        valid_cols(s->w, s->ow, s->sx, offx, &lo, &hi);
        const float *chan = s->x + ci * s->h * s->w;
        for (int64_t g = 0; g < nseg; g++) {
            const struct pg_seg *q = &seg[g];
            float *d = bp + (q->t / PG_NR * kc + p) * PG_NR + q->t % PG_NR;
            int64_t iy = q->oy * s->sy + offy, x0 = q->ox, x1 = x0 + q->len;
            if (iy < 0 || iy >= s->h) {
                for (int64_t xx = 0; xx < q->len; xx++)
                    d[xx] = 0.0f;
                continue;
            }
            const float *row = chan + q->img + iy * s->w;
            int64_t a = x0 < lo ? lo : x0, b = x1 > hi ? hi : x1;
            if (a > b)
                a = b = x0;
            for (int64_t xx = x0; xx < a; xx++)
                d[xx - x0] = 0.0f;
            /* offx + xx * sx is inside the row for xx in [lo, hi): the
             * index is formed only then (offx may be near -2^62) */
            if (s->sx == 1)
                for (int64_t xx = a; xx < b; xx++)
                    d[xx - x0] = row[offx + xx];
            else
                for (int64_t xx = a; xx < b; xx++)
                    d[xx - x0] = row[offx + xx * s->sx];
            for (int64_t xx = b; xx < x1; xx++)
                d[xx - x0] = 0.0f;
        }
        for (int64_t t = nc; t % PG_NR; t++) /* the last panel's columns past nc */
            bp[(t / PG_NR * kc + p) * PG_NR + t % PG_NR] = 0.0f;
    }
}

void ck_infer_pgemm(const float *ap, int64_t m, int64_t k, const struct ck_pgemm_src *src,
                    float *c, int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1)
{
    _Alignas(64) float bp[PG_KC * PG_NC];
    if (m1 > m)
        m1 = m;
    if (k == 0) {
        for (int64_t i = m0; i < m1; i++)
            memset(c + i * ldc + n0, 0, sizeof(float) * (size_t)(n1 - n0));
        return;
    }
    for (int64_t jc = n0; jc < n1; jc += PG_NC) {
        int64_t nc = n1 - jc < PG_NC ? n1 - jc : PG_NC;
        for (int64_t pc = 0; pc < k; pc += PG_KC) {
            int64_t kc = k - pc < PG_KC ? k - pc : PG_KC;
            if (src->x)
                pack_image(src, pc, kc, jc, nc, bp);
            else
                pack_matrix(src->b, src->ldb, pc, kc, jc, nc, bp);
            for (int64_t i = m0; i < m1; i += CK_PGEMM_MR) {
                const float *a = ap + ((i / CK_PGEMM_MR) * k + pc) * CK_PGEMM_MR;
                int rows = m1 - i < CK_PGEMM_MR ? (int)(m1 - i) : CK_PGEMM_MR;
                for (int64_t j = 0; j < nc; j += PG_NR) {
                    int cols = nc - j < PG_NR ? (int)(nc - j) : PG_NR;
                    float *cc = c + i * ldc + jc + j;
                    const float *bb = bp + j * kc;
                    if (cols > 16)
                        kernel2(kc, a, bb, cc, ldc, rows, cols, pc > 0);
                    else
                        kernel1(kc, a, bb, cc, ldc, rows, cols, pc > 0);
                }
            }
        }
    }
}
/* Rows [i0, i0 + mc) of A (lda apart), k in [k0, k0 + kc), into panels of
 * PG_MR rows ([panel][kc][PG_MR], rows past mc zero). */
static void pack_rows(const float *a, int64_t lda, int64_t i0, int64_t mc, int64_t k0,
                      int64_t kc, float *ap)
{
    for (int64_t r0 = 0; r0 < mc; r0 += CK_PGEMM_MR) {
        float *d = ap + r0 * kc;
        int rows = mc - r0 < CK_PGEMM_MR ? (int)(mc - r0) : CK_PGEMM_MR;
        for (int r = 0; r < rows; r++) {
            const float *src = a + (i0 + r0 + r) * lda + k0;
            for (int64_t p = 0; p < kc; p++)
                d[p * CK_PGEMM_MR + r] = src[p];
        }
        for (int r = rows; r < CK_PGEMM_MR; r++)
            for (int64_t p = 0; p < kc; p++)
                d[p * CK_PGEMM_MR + r] = 0.0f;
    }
}

void ck_infer_pgemm_dense(const float *a, int64_t lda, const float *bp, int64_t k, int64_t n,
                          float *c, int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1)
{
    _Alignas(64) float ap[PG_MC * PG_KC];
    if (n1 > n)
        n1 = n;
    if (k == 0) {
        for (int64_t i = m0; i < m1; i++)
            memset(c + i * ldc + n0, 0, sizeof(float) * (size_t)(n1 - n0));
        return;
    }
    for (int64_t ic = m0; ic < m1; ic += PG_MC) {
        int64_t mc = m1 - ic < PG_MC ? m1 - ic : PG_MC;
        for (int64_t pc = 0; pc < k; pc += PG_KC) {
            int64_t kc = k - pc < PG_KC ? k - pc : PG_KC;
            pack_rows(a, lda, ic, mc, pc, kc, ap);
            for (int64_t j = n0; j < n1; j += PG_NR) {
                int cols = n1 - j < PG_NR ? (int)(n1 - j) : PG_NR;
                const float *bb = bp + (j / PG_NR * k + pc) * PG_NR;
                for (int64_t i = 0; i < mc; i += CK_PGEMM_MR) {
                    int rows = mc - i < CK_PGEMM_MR ? (int)(mc - i) : CK_PGEMM_MR;
                    float *cc = c + (ic + i) * ldc + j;
                    if (cols > 16)
                        kernel2(kc, ap + i * kc, bb, cc, ldc, rows, cols, pc > 0);
                    else
                        kernel1(kc, ap + i * kc, bb, cc, ldc, rows, cols, pc > 0);
                }
            }
        }
    }
}
#else
void ck_infer_pgemm_dense(const float *a, int64_t lda, const float *bp, int64_t k, int64_t n,
                          float *c, int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1)
{
    (void)a, (void)lda, (void)bp, (void)k, (void)n, (void)c, (void)ldc, (void)m0, (void)m1,
        (void)n0, (void)n1;
}
void ck_infer_pgemm(const float *ap, int64_t m, int64_t k, const struct ck_pgemm_src *src,
                    float *c, int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1)
{
    (void)ap, (void)m, (void)k, (void)src, (void)c, (void)ldc, (void)m0, (void)m1, (void)n0,
        (void)n1;
}
#endif
