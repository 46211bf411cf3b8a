/* A small FlatBuffers reader for hostile input: no generated code, every
 * offset checked against the buffer before it is followed.
 *
 * A table is read through its vtable: field (slot) i sits at vtable byte
 * offset 4 + 2i; a slot past the vtable's end, or holding 0, is absent and
 * reads as its default. Getters return 1 when the field is present, 0 when
 * it is absent (the output then holds the default or an empty value) and
 * CK_EFORMAT when an offset, a length or an alignment-free read would leave
 * the buffer. Errors carry no file name: callers wrap them with one
 * (ck_error_wrap). Nothing here allocates; every pointer returned points
 * into the caller's buffer and lives as long as it does. */
#ifndef CK_FLATBUF_H
#define CK_FLATBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The whole buffer; FlatBuffers offsets are 32-bit, so len is at most 2 GiB. */
struct ck_fb {
    const unsigned char *p; /* borrowed */
    uint32_t len;
};

struct ck_fb_table {
    const struct ck_fb *fb; /* borrowed */
    uint32_t pos;           /* start of the table in fb */
    uint32_t vt;            /* start of its vtable */
    uint16_t vtlen;         /* vtable size in bytes (>= 4, even) */
    uint16_t tlen;          /* inline table size in bytes */
};

struct ck_fb_vec {
    const struct ck_fb *fb; /* borrowed */
    uint32_t pos;           /* first element */
    uint32_t n;             /* number of elements */
    uint32_t elem;          /* element size in bytes (4 for offsets to tables and strings) */
};

/* Checks len and sets up fb over p (borrowed). CK_ESIZE over 2 GiB. */
int ck_fb_init(struct ck_fb *fb, const void *p, size_t len);
/* The root table (the uoffset at byte 0). */
int ck_fb_root(const struct ck_fb *fb, struct ck_fb_table *out);
/* Whether the root table looks sane (for content probes); never sets an error. */
bool ck_fb_looks_valid(const void *p, size_t len);

/* Scalars: out gets the field's value or def. */
int ck_fb_u8(const struct ck_fb_table *t, int slot, uint8_t def, uint8_t *out);
int ck_fb_i8(const struct ck_fb_table *t, int slot, int8_t def, int8_t *out);
int ck_fb_i32(const struct ck_fb_table *t, int slot, int32_t def, int32_t *out);
int ck_fb_i64(const struct ck_fb_table *t, int slot, int64_t def, int64_t *out);
/* A nested table. */
int ck_fb_table(const struct ck_fb_table *t, int slot, struct ck_fb_table *out);
/* A string: *s points at *len bytes (not necessarily NUL-terminated). */
int ck_fb_string(const struct ck_fb_table *t, int slot, const char **s, uint32_t *len);
/* A vector whose elements are elem bytes each (scalars) or 4 (offsets). */
int ck_fb_vector(const struct ck_fb_table *t, int slot, uint32_t elem, struct ck_fb_vec *out);

/* Elements of a vector; i < v->n is the caller's business (checked again). */
int ck_fb_vec_table(const struct ck_fb_vec *v, uint32_t i, struct ck_fb_table *out);
int ck_fb_vec_string(const struct ck_fb_vec *v, uint32_t i, const char **s, uint32_t *len);
int32_t ck_fb_vec_i32(const struct ck_fb_vec *v, uint32_t i);
int64_t ck_fb_vec_i64(const struct ck_fb_vec *v, uint32_t i);
double ck_fb_vec_f64(const struct ck_fb_vec *v, uint32_t i);
uint8_t ck_fb_vec_u8(const struct ck_fb_vec *v, uint32_t i);

#endif
