/* A small protobuf wire-format decoder for hostile input: no schema, no
 * allocation, every length checked against the bytes that are left.
 *
 *   struct ck_pb r; struct ck_pb_field f; int rc;
 *   ck_pb_init(&r, data, len);
 *   while ((rc = ck_pb_next(&r, &f)) > 0)
 *       switch (f.num) { case 1: ... f.v ...; case 2: ... f.data, f.len ... }
 *   if (rc < 0) ...   (CK_EFORMAT; wrap the message with the file name)
 *
 * Fields point into the caller's buffer (borrowed). Groups (wire types 3
 * and 4, deprecated since proto2) are rejected. */
#ifndef CK_PBWIRE_H
#define CK_PBWIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ck_pb_wire { CK_PB_VARINT = 0, CK_PB_FIXED64 = 1, CK_PB_LEN = 2, CK_PB_FIXED32 = 5 };

struct ck_pb {
    const unsigned char *p;   /* next byte */
    const unsigned char *end; /* one past the last byte */
};

struct ck_pb_field {
    uint32_t num; /* field number, >= 1 */
    enum ck_pb_wire wire;
    uint64_t v;                /* VARINT, FIXED64, FIXED32: the value (little-endian decoded) */
    const unsigned char *data; /* LEN: the payload, borrowed */
    size_t len;                /* LEN: payload length */
};

void ck_pb_init(struct ck_pb *r, const void *data, size_t len);
/* A reader over a LEN field's payload (a nested message or packed values). */
void ck_pb_init_field(struct ck_pb *r, const struct ck_pb_field *f);
/* 1 and *f filled when a field was read, 0 at the end, CK_EFORMAT on bad input. */
int ck_pb_next(struct ck_pb *r, struct ck_pb_field *f);
bool ck_pb_at_end(const struct ck_pb *r);

/* One varint (at most 10 bytes, the 10th at most 1) from *p, advancing *p. */
int ck_pb_read_varint(const unsigned char **p, const unsigned char *end, uint64_t *out);
static inline int64_t ck_pb_zigzag64(uint64_t v)
{
    return (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
}
static inline int32_t ck_pb_zigzag32(uint64_t v)
{
    return (int32_t)((uint32_t)(v >> 1) ^ -(uint32_t)(v & 1));
}
/* Field value reinterpreted: int32/int64 fields are varints of the two's complement. */
static inline float ck_pb_float(const struct ck_pb_field *f)
{
    uint32_t u = (uint32_t)f->v;
    float x;
    __builtin_memcpy(&x, &u, 4);
    return x;
}
static inline double ck_pb_double(const struct ck_pb_field *f)
{
    double x;
    __builtin_memcpy(&x, &f->v, 8);
    return x;
}

/* Repeated scalar fields arrive either one value per field or packed in one
 * LEN field; these accept both. They append to out[*n..max) and advance *n;
 * more values than room is CK_ESIZE. Count first with the _count variants to
 * size the array (a count is at most len, so it is bounded by the input). */
int ck_pb_varints_count(const struct ck_pb_field *f, size_t *count);
int ck_pb_varints(const struct ck_pb_field *f, uint64_t *out, size_t max, size_t *n);
int ck_pb_fixed32s_count(const struct ck_pb_field *f, size_t *count);
int ck_pb_fixed32s(const struct ck_pb_field *f, uint32_t *out, size_t max, size_t *n);
int ck_pb_fixed64s_count(const struct ck_pb_field *f, size_t *count);
int ck_pb_fixed64s(const struct ck_pb_field *f, uint64_t *out, size_t max, size_t *n);
/* A packed fixed32 field (floats) as a view of its raw little-endian bytes:
 * *p borrowed, *count values; CK_EFORMAT when the length is not a multiple of 4. */
int ck_pb_packed_fixed32_view(const struct ck_pb_field *f, const unsigned char **p, size_t *count);

#endif
