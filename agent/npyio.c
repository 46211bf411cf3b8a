#include "agent/npyio.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "readers/reader.h"

#include "model/convert.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static bool real_number(enum ck_dtype t)
{
    return t != CK_DT_STRING && t != CK_DT_INVALID && t != CK_DT_C64 && t != CK_DT_C128 &&
           ck_dtype_size(t) > 0;
}

int ck_npyio_load(const char *path, struct ck_infer_array *out)
{
    struct ck_tensor_set *s = NULL;
    int err;
    memset(out, 0, sizeof *out);
    if ((err = ck_reader_open(path, "npy", &s)) < 0)
        return err;
    const struct ck_tensor *t = s->ntensors == 1 ? &s->tensors[0] : NULL;
    if (!t || !real_number(t->dtype) || !t->data) {
        err = ck_error(CK_EFORMAT, "'%s': not an array of real numbers (dtype %s)", path,
                       t ? ck_dtype_name(t->dtype) : "none");
        goto out;
    }
    if (t->rank > CK_INFER_MAX_RANK) {
        err = ck_error(CK_EFORMAT, "'%s': rank %d, at most %d", path, t->rank, CK_INFER_MAX_RANK);
        goto out;
    }
    if ((err = ck_infer_array_init(out, NULL, t->rank, t->dims)) < 0) {
        err = ck_error_wrap(err, "'%s'", path);
        goto out;
    }
    uint64_t n = ck_infer_array_numel(out);
    bool is_int = ck_dtype_is_int(t->dtype);
    for (uint64_t i = 0; i < n; i++) {
        double v = ck_tensor_get_f64(t, i);
        /* the engine holds integers as float32, exact below 2^24 only */
        if (is_int && fabs(v) >= 16777216.0) {
            ck_infer_array_release(out);
            err = ck_error(CK_EFORMAT, "'%s': element %llu is the integer %.0f, past 2^24: the "
                           "engine holds integers as float32, exact below 2^24 only", path,
                           (unsigned long long)i, v);
            goto out;
        }
        out->data[i] = (float)v;
    }
out:
    ck_tensor_set_free(s);
    return err;
}

/* numpy's descr of t and its element size; NULL when .npy has no form of
 * it (bfloat16 is written as float32, its values exact there). */
static const char *descr(enum ck_dtype t, size_t *size)
{
    static const struct { enum ck_dtype t; const char *d; size_t size; } table[] = {
        {CK_DT_F32, "<f4", 4}, {CK_DT_BF16, "<f4", 4}, {CK_DT_F16, "<f2", 2},
        {CK_DT_F64, "<f8", 8}, {CK_DT_I8, "|i1", 1},  {CK_DT_I16, "<i2", 2},
        {CK_DT_I32, "<i4", 4}, {CK_DT_I64, "<i8", 8}, {CK_DT_U8, "|u1", 1},
        {CK_DT_U16, "<u2", 2}, {CK_DT_U32, "<u4", 4}, {CK_DT_U64, "<u8", 8},
        {CK_DT_BOOL, "|b1", 1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (table[i].t == t) {
            *size = table[i].size;
            return table[i].d;
        }
    return NULL;
}

/* v as t, little-endian, into out; false when an integer type cannot hold
 * it exactly (not whole, or out of its range). */
static bool encode(enum ck_dtype t, float v, unsigned char *out)
{
    double d = v;
    if (t == CK_DT_F16) {
        uint16_t h = ck_f32_to_f16(v);
        memcpy(out, &h, 2);
        return true;
    }
    if (t == CK_DT_F64) {
        memcpy(out, &d, 8);
        return true;
    }
    if (t == CK_DT_F32 || t == CK_DT_BF16) {
        memcpy(out, &v, 4);
        return true;
    }
    if (t == CK_DT_BOOL) {
        out[0] = v != 0;
        return true;
    }
    if (d != trunc(d) || !isfinite(d))
        return false;
    bool sgn = t == CK_DT_I8 || t == CK_DT_I16 || t == CK_DT_I32 || t == CK_DT_I64;
    size_t size = 0;
    descr(t, &size);
    double lo = sgn ? -ldexp(1, (int)(8 * size) - 1) : 0, hi = ldexp(1, (int)(8 * size) - sgn);
    if (d < lo || d >= hi)
        return false;
    uint64_t u = sgn ? (uint64_t)(int64_t)d : (uint64_t)d;
    for (size_t i = 0; i < size; i++)
        out[i] = (unsigned char)(u >> (8 * i));
    return true;
}

int ck_npyio_save(const char *path, const struct ck_infer_array *a)
{
    return ck_npyio_save_as(path, a, CK_DT_F32);
}

int ck_npyio_save_as(const char *path, const struct ck_infer_array *a, enum ck_dtype dtype)
{
    struct ck_buf h;
    char dict[512];
    size_t es = 4;
    const char *d = descr(dtype, &es);
    if (!d)
        return ck_error(CK_EFORMAT, "'%s': .npy has no form of dtype %s", path,
                        ck_dtype_name(dtype));
    int used = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                        d);
    for (int i = 0; i < a->rank; i++)
        used += snprintf(dict + used, sizeof dict - (size_t)used, "%lld,%s",
                         (long long)a->dims[i], i + 1 < a->rank ? " " : "");
    used += snprintf(dict + used, sizeof dict - (size_t)used, "), }");
    /* magic (6) + version (2) + length (2) + dict, padded with spaces to 64, '\n' last */
    size_t total = 10 + (size_t)used + 1;
    size_t padded = (total + 63) / 64 * 64;
    ck_buf_init(&h, (size_t)-1);
    ck_buf_append(&h, "\x93NUMPY\x01", 8);
    uint16_t hl = (uint16_t)(padded - 10);
    unsigned char le[2] = {(unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
    ck_buf_append(&h, le, 2);
    ck_buf_append(&h, dict, (size_t)used);
    for (size_t i = total; i < padded; i++)
        ck_buf_putc(&h, ' ');
    ck_buf_putc(&h, '\n');
    uint64_t n = ck_infer_array_numel(a);
    int err = 0;
    for (uint64_t i = 0; i < n && err >= 0; i++) {
        unsigned char b[8];
        if (!encode(dtype, a->data[i], b))
            err = ck_error(CK_EFORMAT, "'%s': element %llu (%g) is not a %s", path,
                           (unsigned long long)i, (double)a->data[i], ck_dtype_name(dtype));
        else
            err = ck_buf_append(&h, b, es);
    }
    if (err >= 0)
        err = ck_write_file_atomic(path, h.data, h.len, 0644);
    ck_buf_release(&h);
    return err;
}
