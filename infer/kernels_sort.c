/* TopK: the k largest (or smallest) values along an axis and their indices,
 * by a stable merge sort of each slice's indices (ties keep the lower index
 * first, as ONNX specifies). k is the plan's (p.ints[0]): the shape rules
 * checked it against the axis before any kernel runs. */
#include "infer/internal.h"
#include "common/error.h"

#include <math.h>
#include <string.h>

/* Whether a strictly precedes b: larger first (or smaller with !largest);
 * a NaN is larger than any number, so it leads the largest and trails the
 * smallest. Equal values never precede each other: the sort keeps them in
 * index order. */
static bool precedes(float a, float b, bool largest)
{
    bool an = isnan(a), bn = isnan(b);
    if (an || bn)
        return largest ? an && !bn : bn && !an;
    return largest ? a > b : a < b;
}

/* Sorts idx[0..n) by the values p[idx * stride], stably, with tmp of n. */
static void merge_sort(uint32_t *idx, uint32_t *tmp, int64_t n, const float *p, int64_t stride,
                       bool largest)
{
    uint32_t *src = idx, *dst = tmp;
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi)
                dst[o++] = precedes(p[src[j] * stride], p[src[i] * stride], largest) ? src[j++]
                                                                                     : src[i++];
            while (i < mid)
                dst[o++] = src[i++];
            while (j < hi)
                dst[o++] = src[j++];
        }
        uint32_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != idx)
        memcpy(idx, src, sizeof *idx * (size_t)n);
}

int ck_infer_k_topk(const struct ck_kcall *k)
{
    const struct ck_ishape *x = &k->ins[0];
    int axis = ck_infer_norm_axis(ck_op_axis(&k->n->p, -1), x->rank);
    if (axis < 0 || k->n->p.nints != 3)
        return ck_error(CK_EFORMAT, "node '%s' (topk): axis or parameters out of range",
                        k->n->name);
    int64_t len = x->d[axis], kk = k->n->p.ints[0], outer = 1, inner = 1;
    bool largest = k->n->p.ints[1] != 0;
    if (kk < 0 || kk > len)
        return ck_error(CK_EFORMAT, "node '%s' (topk): k %lld is not in [0, %lld]", k->n->name,
                        (long long)kk, (long long)len);
    for (int i = 0; i < axis; i++)
        outer *= x->d[i];
    for (int i = axis + 1; i < x->rank; i++)
        inner *= x->d[i];
    uint32_t *idx = (uint32_t *)(void *)k->scratch, *tmp = idx + len;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t in = 0; in < inner; in++) {
            const float *p = k->in[0] + o * len * inner + in;
            float *v = k->out[0] + o * kk * inner + in, *ix = k->out[1] + o * kk * inner + in;
            for (int64_t j = 0; j < len; j++)
                idx[j] = (uint32_t)j;
            merge_sort(idx, tmp, len, p, inner, largest);
            for (int64_t j = 0; j < kk; j++) {
                v[j * inner] = p[(int64_t)idx[j] * inner];
                ix[j * inner] = (float)idx[j];
            }
        }
    return 0;
}
