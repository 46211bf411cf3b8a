#include "readers/pbwire.h"
#include "common/error.h"

#include <string.h>

void ck_pb_init(struct ck_pb *r, const void *data, size_t len)
{
    r->p = data;
    r->end = r->p ? r->p + len : NULL;
}

void ck_pb_init_field(struct ck_pb *r, const struct ck_pb_field *f)
{
    ck_pb_init(r, f->data, f->wire == CK_PB_LEN ? f->len : 0);
}

bool ck_pb_at_end(const struct ck_pb *r)
{
    return r->p == r->end;
}

int ck_pb_read_varint(const unsigned char **pp, const unsigned char *end, uint64_t *out)
{
    const unsigned char *p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end)
            return ck_error(CK_EFORMAT, "protobuf: varint past the end");
        unsigned char b = *p++;
        if (i == 9 && b > 1)
            return ck_error(CK_EFORMAT, "protobuf: varint overflows 64 bits");
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 0;
        }
    }
    return ck_error(CK_EFORMAT, "protobuf: varint longer than 10 bytes");
}

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

int ck_pb_next(struct ck_pb *r, struct ck_pb_field *f)
{
    uint64_t key = 0, len = 0;
    int err;
    if (!r->p || r->p >= r->end)
        return 0;
    if ((err = ck_pb_read_varint(&r->p, r->end, &key)) < 0)
        return err;
    memset(f, 0, sizeof *f);
    if ((key >> 3) == 0 || (key >> 3) > 0x1fffffff)
        return ck_error(CK_EFORMAT, "protobuf: bad field number %llu",
                        (unsigned long long)(key >> 3));
    f->num = (uint32_t)(key >> 3);
    f->wire = (enum ck_pb_wire)(key & 7);
    size_t left = (size_t)(r->end - r->p);
    switch (key & 7) {
    case CK_PB_VARINT:
        return (err = ck_pb_read_varint(&r->p, r->end, &f->v)) < 0 ? err : 1;
    case CK_PB_FIXED64:
        if (left < 8)
            return ck_error(CK_EFORMAT, "protobuf: field %u: fixed64 past the end", f->num);
        f->v = le(r->p, 8);
        r->p += 8;
        return 1;
    case CK_PB_FIXED32:
        if (left < 4)
            return ck_error(CK_EFORMAT, "protobuf: field %u: fixed32 past the end", f->num);
        f->v = le(r->p, 4);
        r->p += 4;
        return 1;
    case CK_PB_LEN:
        if ((err = ck_pb_read_varint(&r->p, r->end, &len)) < 0)
            return err;
        if (len > (uint64_t)(r->end - r->p))
            return ck_error(CK_EFORMAT, "protobuf: field %u: length %llu past the end", f->num,
                            (unsigned long long)len);
        f->data = r->p;
        f->len = (size_t)len;
        r->p += len;
        return 1;
    default:
        return ck_error(CK_EFORMAT, "protobuf: field %u: unsupported wire type %u", f->num,
                        (unsigned)(key & 7));
    }
}

/* Walks a repeated scalar field of element wire type want: one value, or a
 * packed run. out may be NULL (counting). */
static int scalars(const struct ck_pb_field *f, enum ck_pb_wire want, uint64_t *out, size_t max,
                   size_t *n)
{
    int err;
    if (f->wire == want) {
        if (out && *n >= max)
            return ck_error(CK_ESIZE, "protobuf: field %u: more values than expected", f->num);
        if (out)
            out[*n] = f->v;
        (*n)++;
        return 0;
    }
    if (f->wire != CK_PB_LEN)
        return ck_error(CK_EFORMAT, "protobuf: field %u: wire type %d, expected %d or packed",
                        f->num, f->wire, want);
    const unsigned char *p = f->data, *end = f->data + f->len;
    size_t width = want == CK_PB_FIXED32 ? 4 : want == CK_PB_FIXED64 ? 8 : 0;
    if (width && f->len % width)
        return ck_error(CK_EFORMAT, "protobuf: field %u: packed length %zu not a multiple of %zu",
                        f->num, f->len, width);
    while (p < end) {
        uint64_t v = 0;
        if (width) {
            v = le(p, (int)width);
            p += width;
        } else if ((err = ck_pb_read_varint(&p, end, &v)) < 0) {
            return err;
        }
        if (out && *n >= max)
            return ck_error(CK_ESIZE, "protobuf: field %u: more values than expected", f->num);
        if (out)
            out[*n] = v;
        (*n)++;
    }
    return 0;
}

int ck_pb_varints_count(const struct ck_pb_field *f, size_t *count)
{
    *count = 0;
    return scalars(f, CK_PB_VARINT, NULL, 0, count);
}

int ck_pb_varints(const struct ck_pb_field *f, uint64_t *out, size_t max, size_t *n)
{
    return scalars(f, CK_PB_VARINT, out, max, n);
}

int ck_pb_fixed32s_count(const struct ck_pb_field *f, size_t *count)
{
    *count = 0;
    return scalars(f, CK_PB_FIXED32, NULL, 0, count);
}

int ck_pb_fixed32s(const struct ck_pb_field *f, uint32_t *out, size_t max, size_t *n)
{
    const unsigned char *p = NULL;
    size_t cnt = 0;
    int err;
    if (f->wire == CK_PB_FIXED32) {
        if (*n >= max)
            return ck_error(CK_ESIZE, "protobuf: field %u: more values than expected", f->num);
        out[(*n)++] = (uint32_t)f->v;
        return 0;
    }
    if ((err = ck_pb_packed_fixed32_view(f, &p, &cnt)) < 0)
        return err;
    if (*n > max || cnt > max - *n)
        return ck_error(CK_ESIZE, "protobuf: field %u: more values than expected", f->num);
    for (size_t i = 0; i < cnt; i++)
        out[*n + i] = (uint32_t)le(p + 4 * i, 4);
    *n += cnt;
    return 0;
}

int ck_pb_fixed64s_count(const struct ck_pb_field *f, size_t *count)
{
    *count = 0;
    return scalars(f, CK_PB_FIXED64, NULL, 0, count);
}

int ck_pb_fixed64s(const struct ck_pb_field *f, uint64_t *out, size_t max, size_t *n)
{
    return scalars(f, CK_PB_FIXED64, out, max, n);
}

int ck_pb_packed_fixed32_view(const struct ck_pb_field *f, const unsigned char **p, size_t *count)
{
    if (f->wire != CK_PB_LEN)
        return ck_error(CK_EFORMAT, "protobuf: field %u: not a packed field", f->num);
    if (f->len % 4)
        return ck_error(CK_EFORMAT, "protobuf: field %u: packed length %zu not a multiple of 4",
                        f->num, f->len);
    *p = f->data;
    *count = f->len / 4;
    return 0;
}
