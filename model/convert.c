#include "model/convert.h"
#include "common/error.h"

#include <math.h>
#include <string.h>

enum ck_convert_kind ck_convert_kind_f32(enum ck_dtype t)
{
    switch (t) {
    case CK_DT_F32:
        return CK_CONVERT_SAME;
    case CK_DT_BOOL:
    case CK_DT_I8:
    case CK_DT_U8:
    case CK_DT_I16:
    case CK_DT_U16:
    case CK_DT_F16:
    case CK_DT_BF16:
    case CK_DT_F8_E4M3:
    case CK_DT_F8_E5M2:
        return CK_CONVERT_EXACT;
    case CK_DT_QI8:
    case CK_DT_QU8:
    case CK_DT_QI16:
    case CK_DT_QU16:
    case CK_DT_QI32:
        return CK_CONVERT_RAW;
    case CK_DT_I32:
    case CK_DT_U32:
    case CK_DT_I64:
    case CK_DT_U64:
    case CK_DT_F64:
    case CK_DT_C64:
    case CK_DT_C128:
        return CK_CONVERT_ROUNDS;
    default:
        return CK_CONVERT_NONE;
    }
}

bool ck_convert_lossy(const struct ck_convert_report *r)
{
    return r && (r->inexact || r->imag_dropped);
}

/* ---- element decoding ---- */

static inline uint64_t ld(const unsigned char *p, size_t n, bool be)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)p[be ? i : n - 1 - i] << (8 * (n - 1 - i));
    return v;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline double bits_f64(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* IEEE half by bits, without branches on the value's class so the loop
 * vectorises: the exponent and mantissa move into place and one multiply by
 * 2^112 rebiases the exponent (exact, and right for subnormals too); an
 * all-ones exponent (inf, NaN) is then forced back to all ones. Checked
 * against the definition for all 65536 halves (model.convert_f32_to_16_bits). */
static inline float half(uint16_t h)
{
    uint32_t o = (uint32_t)(h & 0x7fffu) << 13, u;
    float f = bits_f32(o) * 0x1p112f;
    memcpy(&u, &f, 4);
    if ((o & 0x0f800000u) == 0x0f800000u)
        u |= 0x7f800000u;
    return bits_f32(u | (uint32_t)(h & 0x8000u) << 16);
}

/* float8 e4m3fn: bias 7, no infinities, S.1111.111 is NaN. */
static double f8e4m3(uint8_t b)
{
    int e = (b >> 3) & 0xf, m = b & 7;
    if (e == 15 && m == 7)
        return NAN;
    double v = e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
    return (b & 0x80) ? -v : v;
}

/* float8 e5m2: IEEE-like, bias 15, with infinities and NaNs. */
static double f8e5m2(uint8_t b)
{
    int e = (b >> 2) & 0x1f, m = b & 3;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = e ? ldexp(4 + m, e - 17) : ldexp(m, -16);
    return (b & 0x80) ? -v : v;
}

/* One element of every dtype but the 64-bit integers, exactly, as a double;
 * *im gets a complex's imaginary part (0 otherwise). */
static double decode(const unsigned char *p, enum ck_dtype dt, bool be, double *im)
{
    *im = 0;
    switch (dt) {
    case CK_DT_BOOL:
        return p[0] ? 1.0 : 0.0;
    case CK_DT_I8:
    case CK_DT_QI8:
        return (int8_t)p[0];
    case CK_DT_U8:
    case CK_DT_QU8:
        return p[0];
    case CK_DT_I16:
    case CK_DT_QI16:
        return (int16_t)ld(p, 2, be);
    case CK_DT_U16:
    case CK_DT_QU16:
        return (double)ld(p, 2, be);
    case CK_DT_I32:
    case CK_DT_QI32:
        return (int32_t)ld(p, 4, be);
    case CK_DT_U32:
        return (double)ld(p, 4, be);
    case CK_DT_F16:
        return half((uint16_t)ld(p, 2, be));
    case CK_DT_BF16:
        return bits_f32((uint32_t)ld(p, 2, be) << 16);
    case CK_DT_F32:
        return bits_f32((uint32_t)ld(p, 4, be));
    case CK_DT_C64:
        *im = bits_f32((uint32_t)ld(p + 4, 4, be));
        return bits_f32((uint32_t)ld(p, 4, be));
    case CK_DT_F64:
        return bits_f64(ld(p, 8, be));
    case CK_DT_C128:
        *im = bits_f64(ld(p + 8, 8, be));
        return bits_f64(ld(p, 8, be));
    case CK_DT_F8_E4M3:
        return f8e4m3(p[0]);
    case CK_DT_F8_E5M2:
        return f8e5m2(p[0]);
    default:
        return NAN;
    }
}

/* The nearest float to an int64 (one rounding, not two through double), and
 * whether it is exact. 2^63 is the one float an int64 can round up to that
 * does not convert back. */
static float i64_f32(int64_t v, bool *exact)
{
    float f = (float)v;
    *exact = f < 0x1p63f && (int64_t)f == v;
    return f;
}

static float u64_f32(uint64_t v, bool *exact)
{
    float f = (float)v;
    *exact = f < 0x1p64f && (uint64_t)f == v;
    return f;
}

/* ---- checks and element order ---- */

static int check(const struct ck_tensor *t, uint64_t first, uint64_t count, size_t *es)
{
    uint64_t n;
    const char *name = t->name ? t->name : "";
    *es = ck_dtype_size(t->dtype);
    if (!*es || t->dtype == CK_DT_STRING || ck_convert_kind_f32(t->dtype) == CK_CONVERT_NONE)
        return ck_error(CK_EFORMAT, "tensor '%s': dtype %s is not numeric", name,
                        ck_dtype_name(t->dtype));
    if (!t->data)
        return ck_error(CK_ENOENT, "tensor '%s': no data", name);
    if (ck_tensor_numel(t, &n) < 0)
        return ck_error(CK_EFORMAT, "tensor '%s': bad shape", name);
    if (n > t->nbytes / *es)
        return ck_error(CK_EFORMAT, "tensor '%s': %llu bytes of data for %llu elements of %s", name,
                        (unsigned long long)t->nbytes, (unsigned long long)n,
                        ck_dtype_name(t->dtype));
    if (first > n || count > n - first)
        return ck_error(CK_ESIZE, "tensor '%s': elements %llu..%llu past the end (%llu)", name,
                        (unsigned long long)first, (unsigned long long)(first + count),
                        (unsigned long long)n);
    return 0;
}

static bool contiguous(const struct ck_tensor *t)
{
    return !t->fortran_order || t->rank <= 1;
}

/* Walks the storage offsets of C-order elements first, first+1, ... of a
 * Fortran-order tensor, one addition per step (an odometer). */
struct walk {
    int rank;
    uint64_t idx[CK_TENSOR_MAX_RANK];
    uint64_t dim[CK_TENSOR_MAX_RANK];
    uint64_t stride[CK_TENSOR_MAX_RANK];
    uint64_t off;
};

static void walk_init(struct walk *w, const struct ck_tensor *t, uint64_t first)
{
    uint64_t s = 1, rest = first;
    w->rank = t->rank;
    w->off = 0;
    for (int d = 0; d < t->rank; d++) {
        w->dim[d] = (uint64_t)t->dims[d];
        w->stride[d] = s;
        s *= w->dim[d];
    }
    for (int d = t->rank - 1; d >= 0; d--) {
        w->idx[d] = w->dim[d] ? rest % w->dim[d] : 0;
        rest = w->dim[d] ? rest / w->dim[d] : 0;
        w->off += w->idx[d] * w->stride[d];
    }
}

static void walk_next(struct walk *w)
{
    for (int d = w->rank - 1; d >= 0; d--) {
        w->off += w->stride[d];
        if (++w->idx[d] < w->dim[d])
            return;
        w->off -= w->stride[d] * w->dim[d];
        w->idx[d] = 0;
    }
}

static void count_f32(const float *v, uint64_t n, struct ck_convert_report *rep)
{
    uint64_t bad = 0;
    for (uint64_t i = 0; i < n; i++)
        bad += !isfinite(v[i]);
    rep->nonfinite += bad;
}

/* ---- float32 ---- */

/* The contiguous dtypes that have a loop of their own; false: not handled. */
/* The loops of the fast paths: restrict (dst never overlaps the mapped
 * data) and the byte order outside the loop, so the compiler vectorises. */
static void f32_swapped(float *restrict d, const unsigned char *restrict p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        d[i] = bits_f32((uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
                        (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3]);
}

static void f16_loop(float *restrict d, const unsigned char *restrict p, uint64_t n, bool be)
{
    if (be)
        for (uint64_t i = 0; i < n; i++)
            d[i] = half((uint16_t)(p[2 * i] << 8 | p[2 * i + 1]));
    else
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2); /* a little-endian host (x86-64, arm64, the targets) */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
            h = (uint16_t)(h << 8 | h >> 8);
#endif
            d[i] = half(h);
        }
}

static void bf16_loop(float *restrict d, const unsigned char *restrict p, uint64_t n, bool be)
{
    if (be)
        for (uint64_t i = 0; i < n; i++)
            d[i] = bits_f32((uint32_t)p[2 * i] << 24 | (uint32_t)p[2 * i + 1] << 16);
    else
        for (uint64_t i = 0; i < n; i++)
            d[i] = bits_f32((uint32_t)p[2 * i + 1] << 24 | (uint32_t)p[2 * i] << 16);
}

static uint64_t f64_loop(float *restrict d, const unsigned char *restrict p, uint64_t n, bool be)
{
    uint64_t inexact = 0;
    for (uint64_t i = 0; i < n; i++) {
        double v = bits_f64(ld(p + 8 * i, 8, be));
        float f = (float)v;
        inexact += (double)f != v && !isnan(v);
        d[i] = f;
    }
    return inexact;
}

/* 8- and 16-bit integers: every value is exact in float32. */
static bool small_int_loop(float *restrict d, const unsigned char *restrict p, uint64_t n,
                           enum ck_dtype dt, bool be)
{
    int hi = be ? 0 : 1, lo = 1 - hi;
    switch (dt) {
    case CK_DT_I8:
        for (uint64_t i = 0; i < n; i++)
            d[i] = (float)(int8_t)p[i];
        return true;
    case CK_DT_U8:
        for (uint64_t i = 0; i < n; i++)
            d[i] = (float)p[i];
        return true;
    case CK_DT_I16:
        for (uint64_t i = 0; i < n; i++)
            d[i] = (float)(int16_t)(uint16_t)(p[2 * i + hi] << 8 | p[2 * i + lo]);
        return true;
    case CK_DT_U16:
        for (uint64_t i = 0; i < n; i++)
            d[i] = (float)(uint16_t)(p[2 * i + hi] << 8 | p[2 * i + lo]);
        return true;
    default:
        return false;
    }
}

/* The contiguous dtypes that have a loop of their own; false: not handled. */
static bool fast_f32(const struct ck_tensor *t, const unsigned char *p, uint64_t n, float *dst,
                     struct ck_convert_report *rep)
{
    bool be = t->big_endian;
    switch (t->dtype) {
    case CK_DT_F32:
        if (!be)
            memcpy(dst, p, n * 4);
        else
            f32_swapped(dst, p, n);
        break;
    case CK_DT_F16:
        f16_loop(dst, p, n, be);
        break;
    case CK_DT_BF16:
        bf16_loop(dst, p, n, be);
        break;
    case CK_DT_F64: {
        uint64_t inexact = f64_loop(dst, p, n, be);
        if (rep)
            rep->inexact += inexact;
        break;
    }
    default:
        if (!small_int_loop(dst, p, n, t->dtype, be))
            return false;
        return true; /* always finite and exact */
    }
    if (rep)
        count_f32(dst, n, rep);
    return true;
}

static float one_f32(const unsigned char *p, enum ck_dtype dt, bool be,
                     struct ck_convert_report *rep)
{
    bool exact = true;
    double im = 0;
    float f;
    if (dt == CK_DT_I64) {
        f = i64_f32((int64_t)ld(p, 8, be), &exact);
    } else if (dt == CK_DT_U64) {
        f = u64_f32(ld(p, 8, be), &exact);
    } else {
        double d = decode(p, dt, be, &im);
        f = (float)d;
        exact = (double)f == d || isnan(d);
    }
    if (rep) {
        rep->inexact += !exact;
        rep->imag_dropped += im != 0;
        rep->nonfinite += !isfinite(f);
    }
    return f;
}

int ck_tensor_read_f32(const struct ck_tensor *t, uint64_t first, uint64_t count, float *dst,
                       struct ck_convert_report *rep)
{
    size_t es;
    int err;
    if ((err = check(t, first, count, &es)) < 0)
        return err;
    if (rep)
        rep->converted += count;
    if (contiguous(t)) {
        const unsigned char *p = t->data + first * es;
        if (fast_f32(t, p, count, dst, rep))
            return 0;
        for (uint64_t i = 0; i < count; i++, p += es)
            dst[i] = one_f32(p, t->dtype, t->big_endian, rep);
        return 0;
    }
    struct walk w;
    walk_init(&w, t, first);
    for (uint64_t i = 0; i < count; i++, walk_next(&w))
        dst[i] = one_f32(t->data + w.off * es, t->dtype, t->big_endian, rep);
    return 0;
}

/* ---- float64 ---- */

static double one_f64(const unsigned char *p, enum ck_dtype dt, bool be,
                      struct ck_convert_report *rep)
{
    double im = 0, d;
    bool exact = true;
    if (dt == CK_DT_I64) {
        int64_t v = (int64_t)ld(p, 8, be);
        d = (double)v;
        exact = d < 0x1p63 && (int64_t)d == v;
    } else if (dt == CK_DT_U64) {
        uint64_t v = ld(p, 8, be);
        d = (double)v;
        exact = d < 0x1p64 && (uint64_t)d == v;
    } else {
        d = decode(p, dt, be, &im);
    }
    if (rep) {
        rep->inexact += !exact;
        rep->imag_dropped += im != 0;
        rep->nonfinite += !isfinite(d);
    }
    return d;
}

int ck_tensor_read_f64(const struct ck_tensor *t, uint64_t first, uint64_t count, double *dst,
                       struct ck_convert_report *rep)
{
    size_t es;
    int err;
    if ((err = check(t, first, count, &es)) < 0)
        return err;
    if (rep)
        rep->converted += count;
    if (contiguous(t)) {
        const unsigned char *p = t->data + first * es;
        if (t->dtype == CK_DT_F64 && !t->big_endian) {
            memcpy(dst, p, count * 8);
            if (rep)
                for (uint64_t i = 0; i < count; i++)
                    rep->nonfinite += !isfinite(dst[i]);
            return 0;
        }
        for (uint64_t i = 0; i < count; i++, p += es)
            dst[i] = one_f64(p, t->dtype, t->big_endian, rep);
        return 0;
    }
    struct walk w;
    walk_init(&w, t, first);
    for (uint64_t i = 0; i < count; i++, walk_next(&w))
        dst[i] = one_f64(t->data + w.off * es, t->dtype, t->big_endian, rep);
    return 0;
}

/* ---- streaming ---- */

int ck_tensor_stream_f32(const struct ck_tensor_set *s, const struct ck_tensor *t, float *buf,
                         size_t bufcount, ck_convert_sink fn, void *ctx,
                         struct ck_convert_report *rep)
{
    uint64_t n;
    size_t es;
    int err;
    if (!bufcount)
        return ck_error(CK_EUSAGE, "tensor '%s': empty conversion buffer", t->name);
    if ((err = check(t, 0, 0, &es)) < 0)
        return err;
    if (ck_tensor_numel(t, &n) < 0)
        return ck_error(CK_EFORMAT, "tensor '%s': bad shape", t->name);
    for (uint64_t first = 0; first < n;) {
        size_t k = n - first < bufcount ? (size_t)(n - first) : bufcount;
        if ((err = ck_tensor_read_f32(t, first, k, buf, rep)) < 0 || (err = fn(ctx, buf, k)) < 0)
            return err;
        /* A Fortran-order read touches the whole tensor: its pages go at the end. */
        if (s && contiguous(t))
            ck_tensor_set_drop_pages(s, t->data + first * es, (uint64_t)k * es);
        first += k;
    }
    if (s && !contiguous(t))
        ck_tensor_set_drop_pages(s, t->data, n * es);
    return 0;
}

/* ---- float32 to 16-bit floats ---- */

uint16_t ck_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: keep it quiet and keep the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* 65520 and up round to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: a half subnormal; scaling by 2^24 is exact */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint16_t)lrintf(a * 0x1p24f));
    }
    uint32_t h = ((ax >> 23) - 112) << 10 | ((ax >> 13) & 0x3ffu), rest = ax & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
        h++; /* a carry into the exponent is the right result */
    return (uint16_t)(sign | h);
}

uint16_t ck_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
