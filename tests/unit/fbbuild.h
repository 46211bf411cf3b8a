/* A tiny FlatBuffers writer for tests: objects are laid out front to back
 * (every uoffset points forward, as the format requires), each table with
 * its vtable right before it and 8 bytes per slot. Enough to write
 * FlatGraph/FlatArray files field by field, and to corrupt them on purpose. */
#ifndef CK_TEST_FBBUILD_H
#define CK_TEST_FBBUILD_H

#include <stdint.h>
#include <string.h>

#define FBB_MAX (1u << 16)

struct fbb {
    unsigned char b[FBB_MAX];
    uint32_t len;
};

static inline void fbb_w32(struct fbb *f, uint32_t at, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        f->b[at + i] = (unsigned char)(v >> (8 * i));
}

static inline void fbb_w64(struct fbb *f, uint32_t at, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        f->b[at + i] = (unsigned char)(v >> (8 * i));
}

static inline void fbb_pad4(struct fbb *f)
{
    while (f->len % 4)
        f->b[f->len++] = 0;
}

/* Starts a buffer: 4 bytes for the root offset. */
static inline void fbb_init(struct fbb *f)
{
    memset(f, 0, sizeof(*f));
    f->len = 4;
}

static inline void fbb_root(struct fbb *f, uint32_t table)
{
    fbb_w32(f, 0, table);
}

/* A table of nslots slots; bit i of present says whether slot i is in the vtable. */
static inline uint32_t fbb_table(struct fbb *f, int nslots, uint32_t present)
{
    fbb_pad4(f);
    uint32_t vt = f->len;
    uint16_t vtlen = (uint16_t)(4 + 2 * nslots), tlen = (uint16_t)(4 + 8 * nslots);
    f->b[f->len++] = (unsigned char)vtlen;
    f->b[f->len++] = (unsigned char)(vtlen >> 8);
    f->b[f->len++] = (unsigned char)tlen;
    f->b[f->len++] = (unsigned char)(tlen >> 8);
    for (int i = 0; i < nslots; i++) {
        uint16_t fo = (present >> i) & 1 ? (uint16_t)(4 + 8 * i) : 0;
        f->b[f->len++] = (unsigned char)fo;
        f->b[f->len++] = (unsigned char)(fo >> 8);
    }
    fbb_pad4(f);
    uint32_t t = f->len;
    fbb_w32(f, t, t - vt);
    f->len += tlen;
    return t;
}

static inline uint32_t fbb_slot(uint32_t table, int slot)
{
    return table + 4 + 8 * (uint32_t)slot;
}

static inline void fbb_u8(struct fbb *f, uint32_t t, int slot, uint8_t v)
{
    f->b[fbb_slot(t, slot)] = v;
}

static inline void fbb_i32(struct fbb *f, uint32_t t, int slot, int32_t v)
{
    fbb_w32(f, fbb_slot(t, slot), (uint32_t)v);
}

static inline void fbb_i64(struct fbb *f, uint32_t t, int slot, int64_t v)
{
    fbb_w64(f, fbb_slot(t, slot), (uint64_t)v);
}

/* Points slot (or any 4-byte place at) to target. */
static inline void fbb_point(struct fbb *f, uint32_t at, uint32_t target)
{
    fbb_w32(f, at, target - at);
}

static inline void fbb_off(struct fbb *f, uint32_t t, int slot, uint32_t target)
{
    fbb_point(f, fbb_slot(t, slot), target);
}

/* A vector of n elements of elem bytes (copied from p, or zeros). */
static inline uint32_t fbb_vec(struct fbb *f, const void *p, uint32_t n, uint32_t elem)
{
    fbb_pad4(f);
    uint32_t v = f->len;
    fbb_w32(f, v, n);
    f->len += 4;
    if (p)
        memcpy(f->b + f->len, p, (size_t)n * elem);
    f->len += n * elem;
    return v;
}

static inline uint32_t fbb_vec_i64(struct fbb *f, const int64_t *p, uint32_t n)
{
    fbb_pad4(f);
    uint32_t v = fbb_vec(f, NULL, n, 8);
    for (uint32_t i = 0; i < n; i++)
        fbb_w64(f, v + 4 + 8 * i, (uint64_t)p[i]);
    return v;
}

static inline uint32_t fbb_str(struct fbb *f, const char *s)
{
    uint32_t v = fbb_vec(f, s, (uint32_t)strlen(s), 1);
    f->b[f->len++] = 0;
    return v;
}

/* Element i of a vector of offsets points to target. */
static inline void fbb_elem(struct fbb *f, uint32_t vec, uint32_t i, uint32_t target)
{
    fbb_point(f, vec + 4 + 4 * i, target);
}

#endif
