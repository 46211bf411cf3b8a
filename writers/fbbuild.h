/* A FlatBuffers builder (Debian ships no FlatBuffers library for C).
 *
 * Objects are laid out front to back: a parent is written before its
 * children, so every uoffset points forward as the format requires, and the
 * caller fills a table's fields after creating it. A table's vtable sits
 * right before it; fields are packed largest first and every scalar is
 * aligned to its size from the start of the buffer (tables start at 4 mod 8
 * when they hold 8-byte fields, vector data is aligned to its element size),
 * so readers that load fields with aligned accesses work. Everything is
 * little-endian. Slot i sits at vtable offset 4 + 2i.
 *
 * Errors are sticky: after a failed allocation or a size past 2 GiB every
 * call is a no-op returning 0 and ck_fbb_finish returns the error, so
 * callers check once. Positions returned are byte offsets in the buffer. */
#ifndef CK_FBBUILD_H
#define CK_FBBUILD_H

#include <stddef.h>
#include <stdint.h>

#define CK_FBB_MAX_SLOTS 32

struct ck_fbb {
    unsigned char *p; /* owned; ck_fbb_detach hands it over */
    uint32_t len, cap;
    int err;
};

/* A table being filled: where each present slot's field lives. */
struct ck_fbb_table {
    uint32_t pos;
    uint32_t field[CK_FBB_MAX_SLOTS]; /* absolute position, 0 = absent */
    uint8_t size[CK_FBB_MAX_SLOTS];
};

/* Starts a buffer (the root uoffset comes first). */
void ck_fbb_init(struct ck_fbb *b);
void ck_fbb_release(struct ck_fbb *b);

/* A table of nslots slots; sizes[i] is the byte size of slot i's field
 * (1, 2, 4 or 8; 4 for an offset to a table, vector or string), 0 when
 * absent. Fields are zero until set. */
void ck_fbb_table(struct ck_fbb *b, struct ck_fbb_table *t, const uint8_t *sizes, int nslots);
void ck_fbb_set_u8(struct ck_fbb *b, const struct ck_fbb_table *t, int slot, uint8_t v);
void ck_fbb_set_i32(struct ck_fbb *b, const struct ck_fbb_table *t, int slot, int32_t v);
void ck_fbb_set_i64(struct ck_fbb *b, const struct ck_fbb_table *t, int slot, int64_t v);
/* Points an offset slot at target (written after the table). */
void ck_fbb_set_off(struct ck_fbb *b, const struct ck_fbb_table *t, int slot, uint32_t target);

/* A vector of n elements of elem bytes (1, 2, 4, 8), copied from data when
 * not NULL (raw bytes: the caller's order), zeros otherwise; returns the
 * position of its length word. *data_at, when not NULL, gets the position of
 * element 0 (to fill in place). */
uint32_t ck_fbb_vec(struct ck_fbb *b, uint32_t n, uint32_t elem, const void *data,
                    uint32_t *data_at);
uint32_t ck_fbb_vec_i64(struct ck_fbb *b, const int64_t *v, uint32_t n);
uint32_t ck_fbb_vec_i32(struct ck_fbb *b, const int32_t *v, uint32_t n);
uint32_t ck_fbb_vec_f64(struct ck_fbb *b, const double *v, uint32_t n);
uint32_t ck_fbb_vec_bool(struct ck_fbb *b, const uint8_t *v, uint32_t n);
/* A vector of n offsets, to be filled with ck_fbb_vec_set_off. */
uint32_t ck_fbb_vec_offsets(struct ck_fbb *b, uint32_t n);
void ck_fbb_vec_set_off(struct ck_fbb *b, uint32_t vec, uint32_t i, uint32_t target);
/* A string (len bytes then a NUL). */
uint32_t ck_fbb_string(struct ck_fbb *b, const char *s, size_t len);
uint32_t ck_fbb_cstring(struct ck_fbb *b, const char *s);
/* A vector of strings. */
uint32_t ck_fbb_vec_strings(struct ck_fbb *b, char *const *s, uint32_t n);

/* The address of position pos (valid until the next call that writes). */
unsigned char *ck_fbb_at(struct ck_fbb *b, uint32_t pos);

/* Sets the root uoffset to table; returns b->err (0 or a ck_error code). */
int ck_fbb_finish(struct ck_fbb *b, uint32_t root);

#endif
