#include "writers/sdarray.h"

#include "common/error.h"
#include "model/convert.h"
#include "model/sdschema.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

static const struct {
    enum ck_dtype t;
    int dl4j;
    int64_t flags; /* ND4J ArrayOptions bits for the extras word */
} dtypes[] = {
    {CK_DT_BOOL, 1, 524288},
    {CK_DT_F16, 3, 4096},
    {CK_DT_F32, 5, 8192},
    {CK_DT_F64, 6, 16384},
    {CK_DT_I8, 7, 32768},
    {CK_DT_I16, 8, 65536},
    {CK_DT_I32, 9, 131072},
    {CK_DT_I64, 10, 262144},
    {CK_DT_U8, 11, 32768 | 8388608},
    {CK_DT_U16, 12, 65536 | 8388608},
    {CK_DT_U32, 13, 131072 | 8388608},
    {CK_DT_U64, 14, 262144 | 8388608},
    {CK_DT_QI8, 15, 32768 | 1024},
    {CK_DT_QI16, 16, 65536 | 1024},
    {CK_DT_BF16, 17, 2048},
};

static int find(enum ck_dtype t)
{
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
        if (dtypes[i].t == t)
            return (int)i;
    return -1;
}

int ck_sdarray_dtype(enum ck_dtype t)
{
    int i = find(t);
    return i < 0 ? -1 : dtypes[i].dl4j;
}

static bool is_float(enum ck_dtype t)
{
    return t == CK_DT_F32 || t == CK_DT_F64 || t == CK_DT_F16 || t == CK_DT_BF16;
}

bool ck_sdarray_converts(const struct ck_tensor *t, enum ck_dtype to)
{
    return to != CK_DT_INVALID && to != t->dtype && is_float(t->dtype) && t->data;
}

static void put_be(unsigned char *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * (n - 1 - i)));
}

/* The element bytes, big-endian; swaps or copies the stored bytes. */
static void copy_be(unsigned char *dst, const struct ck_tensor *t, size_t es)
{
    if (t->big_endian || es == 1) {
        memcpy(dst, t->data, (size_t)t->nbytes);
        return;
    }
    for (uint64_t i = 0; i < t->nbytes; i += es)
        for (size_t k = 0; k < es; k++)
            dst[i + k] = t->data[i + es - 1 - k];
}

static int convert(unsigned char *dst, const struct ck_tensor *t, enum ck_dtype to, uint64_t numel,
                   float *scale)
{
    if (to == CK_DT_QI8) {
        double mx = 0;
        for (uint64_t i = 0; i < numel; i++) {
            double v = fabs(ck_tensor_get_f64(t, i));
            if (isfinite(v) && v > mx)
                mx = v;
        }
        *scale = mx > 0 ? (float)(mx / 127.0) : 1.0f;
        for (uint64_t i = 0; i < numel; i++) {
            double q = nearbyint(ck_tensor_get_f64(t, i) / *scale);
            dst[i] = (unsigned char)(int8_t)(q > 127 ? 127 : q < -127 ? -127 : isnan(q) ? 0 : q);
        }
        return 0;
    }
    for (uint64_t i = 0; i < numel; i++) {
        float v = (float)ck_tensor_get_f64(t, i);
        put_be(dst + 2 * i, to == CK_DT_F16 ? ck_f32_to_f16(v) : ck_f32_to_bf16(v), 2);
    }
    return 0;
}

int ck_sdarray_write(struct ck_fbb *b, const struct ck_tensor *t, enum ck_dtype to,
                     const char *file, uint32_t *table, float *scale)
{
    bool conv = ck_sdarray_converts(t, to);
    enum ck_dtype dt = conv ? to : t->dtype;
    int k = find(dt);
    uint64_t numel;
    if (k < 0)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': DL4J has no %s arrays", file, t->name,
                        ck_dtype_name(dt));
    if (!t->data)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s' has no data", file, t->name);
    if (ck_tensor_numel(t, &numel) < 0 || ck_tensor_check_size(t, file) < 0)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': shape and size disagree", file, t->name);
    size_t es = ck_dtype_size(dt);
    if (numel > (UINT64_C(1) << 31) / es)
        return ck_error(CK_ESIZE, "'%s': tensor '%s' is over the 2 GiB of a FlatBuffers file", file,
                        t->name);
    /* ND4J shape info. Converted data is written in C order. */
    bool f = t->fortran_order && !conv;
    int64_t si[2 * CK_TENSOR_MAX_RANK + 4];
    int r = t->rank;
    si[0] = r;
    for (int i = 0; i < r; i++)
        si[1 + i] = t->dims[i];
    int64_t st = 1;
    for (int i = 0; i < r; i++) {
        int d = f ? i : r - 1 - i;
        si[1 + r + d] = st;
        st *= t->dims[d] ? t->dims[d] : 1;
    }
    si[1 + 2 * r] = dtypes[k].flags | (numel == 0 ? SD_FLAG_EMPTY : 0);
    si[2 + 2 * r] = 1;
    si[3 + 2 * r] = f ? SD_ORDER_F : SD_ORDER_C;
    uint8_t sizes[FA_NSLOTS] = {4, numel ? 4 : 0, 1, 1};
    struct ck_fbb_table tab;
    ck_fbb_table(b, &tab, sizes, FA_NSLOTS);
    ck_fbb_set_u8(b, &tab, FA_DTYPE, (uint8_t)dtypes[k].dl4j);
    ck_fbb_set_u8(b, &tab, FA_BYTEORDER, SD_BYTEORDER_BE);
    ck_fbb_set_off(b, &tab, FA_SHAPE, ck_fbb_vec_i64(b, si, (uint32_t)(2 * r + 4)));
    if (numel) {
        uint32_t at, v = ck_fbb_vec(b, (uint32_t)(numel * es), 1, NULL, &at);
        if (b->err)
            return b->err;
        ck_fbb_set_off(b, &tab, FA_BUFFER, v);
        if (conv)
            convert(ck_fbb_at(b, at), t, dt, numel, scale);
        else
            copy_be(ck_fbb_at(b, at), t, es);
    }
    *table = tab.pos;
    return b->err;
}

int ck_sdarray_file(struct ck_fbb *b, const struct ck_tensor *t, enum ck_dtype to, const char *file,
                    float *scale)
{
    uint32_t root;
    int err = ck_sdarray_write(b, t, to, file, &root, scale);
    return err < 0 ? err : ck_fbb_finish(b, root);
}
