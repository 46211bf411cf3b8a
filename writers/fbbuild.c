#include "writers/fbbuild.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>

#define FBB_LIMIT ((uint32_t)INT32_MAX) /* uoffsets are 32-bit: stay below 2 GiB */

void ck_fbb_init(struct ck_fbb *b)
{
    memset(b, 0, sizeof(*b));
    b->len = 4;
    if (!(b->p = calloc(1, 4096)))
        b->err = ck_error(CK_ENOMEM, "flatbuffers: out of memory");
    else
        b->cap = 4096;
}

void ck_fbb_release(struct ck_fbb *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* Reserves n more bytes (zeroed) after padding to align; returns their position or 0. */
static uint32_t grow(struct ck_fbb *b, uint64_t n, uint32_t align, uint32_t bias)
{
    if (b->err)
        return 0;
    uint64_t at = b->len;
    while ((at + bias) % align)
        at++;
    if (at + n > FBB_LIMIT) {
        b->err = ck_error(CK_ESIZE, "flatbuffers: buffer would pass 2 GiB");
        return 0;
    }
    if (at + n > b->cap) {
        uint64_t cap = b->cap;
        while (cap < at + n)
            cap *= 2;
        if (cap > FBB_LIMIT)
            cap = FBB_LIMIT;
        unsigned char *np = realloc(b->p, (size_t)cap);
        if (!np) {
            b->err = ck_error(CK_ENOMEM, "flatbuffers: out of memory");
            return 0;
        }
        memset(np + b->cap, 0, (size_t)(cap - b->cap));
        b->p = np;
        b->cap = (uint32_t)cap;
    }
    b->len = (uint32_t)(at + n);
    return (uint32_t)at;
}

static void put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

void ck_fbb_table(struct ck_fbb *b, struct ck_fbb_table *t, const uint8_t *sizes, int nslots)
{
    memset(t, 0, sizeof(*t));
    if (nslots > CK_FBB_MAX_SLOTS) {
        if (!b->err)
            b->err = ck_error(CK_ESIZE, "flatbuffers: table of %d slots", nslots);
        return;
    }
    /* Inline layout: the soffset, then 8-, 4-, 2- then 1-byte fields. */
    uint32_t inl = 4, has8 = 0, last = 0;
    for (int sz = 8; sz >= 1; sz /= 2)
        for (int i = 0; i < nslots; i++)
            if (sizes[i] == sz) {
                t->field[i] = inl; /* relative for now */
                t->size[i] = (uint8_t)sz;
                inl += (uint32_t)sz;
                has8 |= sz == 8;
            }
    for (int i = 0; i < nslots; i++)
        if (sizes[i])
            last = (uint32_t)i + 1;
    inl = (inl + 3) & ~3u;
    uint32_t vtlen = 4 + 2 * last;
    uint32_t vt = grow(b, vtlen, 2, 0);
    /* The table right after: at 4 mod 8 when it holds 8-byte fields. */
    uint32_t pos = grow(b, inl, has8 ? 8 : 4, has8 ? 4 : 0);
    if (b->err)
        return;
    put16(b->p + vt, (uint16_t)vtlen);
    put16(b->p + vt + 2, (uint16_t)inl);
    for (uint32_t i = 0; i < last; i++)
        put16(b->p + vt + 4 + 2 * i, (uint16_t)t->field[i]);
    put32(b->p + pos, (uint32_t)(int32_t)(pos - vt)); /* soffset: table - vtable */
    t->pos = pos;
    for (int i = 0; i < nslots; i++)
        if (t->size[i])
            t->field[i] += pos;
}

static unsigned char *field(struct ck_fbb *b, const struct ck_fbb_table *t, int slot, int size)
{
    if (b->err || slot < 0 || slot >= CK_FBB_MAX_SLOTS)
        return NULL;
    if (t->size[slot] != size) {
        b->err = ck_error(CK_ERR, "flatbuffers: slot %d set with a %d-byte value", slot, size);
        return NULL;
    }
    return b->p + t->field[slot];
}

void ck_fbb_set_u8(struct ck_fbb *b, const struct ck_fbb_table *t, int slot, uint8_t v)
{
    unsigned char *p = field(b, t, slot, 1);
    if (p)
        *p = v;
}

void ck_fbb_set_i32(struct ck_fbb *b, const struct ck_fbb_table *t, int slot, int32_t v)
{
    unsigned char *p = field(b, t, slot, 4);
    if (p)
        put32(p, (uint32_t)v);
}

void ck_fbb_set_i64(struct ck_fbb *b, const struct ck_fbb_table *t, int slot, int64_t v)
{
    unsigned char *p = field(b, t, slot, 8);
    if (p)
        put64(p, (uint64_t)v);
}

static void point(struct ck_fbb *b, uint32_t at, uint32_t target)
{
    if (b->err)
        return;
    if (target <= at || target >= b->len) {
        b->err =
            ck_error(CK_ERR, "flatbuffers: offset at %u to %u does not point forward", at, target);
        return;
    }
    put32(b->p + at, target - at);
}

void ck_fbb_set_off(struct ck_fbb *b, const struct ck_fbb_table *t, int slot, uint32_t target)
{
    if (field(b, t, slot, 4))
        point(b, t->field[slot], target);
}

uint32_t ck_fbb_vec(struct ck_fbb *b, uint32_t n, uint32_t elem, const void *data,
                    uint32_t *data_at)
{
    uint32_t align = elem > 4 ? elem : 4;
    /* The length word sits right before element 0, which is aligned to elem. */
    uint32_t v = grow(b, 4 + (uint64_t)n * elem, align, 4);
    if (data_at)
        *data_at = v + 4;
    if (b->err)
        return 0;
    put32(b->p + v, n);
    if (data && n)
        memcpy(b->p + v + 4, data, (size_t)n * elem);
    return v;
}

uint32_t ck_fbb_vec_i64(struct ck_fbb *b, const int64_t *v, uint32_t n)
{
    uint32_t at, vec = ck_fbb_vec(b, n, 8, NULL, &at);
    for (uint32_t i = 0; i < n && !b->err; i++)
        put64(b->p + at + 8 * i, (uint64_t)v[i]);
    return vec;
}

uint32_t ck_fbb_vec_i32(struct ck_fbb *b, const int32_t *v, uint32_t n)
{
    uint32_t at, vec = ck_fbb_vec(b, n, 4, NULL, &at);
    for (uint32_t i = 0; i < n && !b->err; i++)
        put32(b->p + at + 4 * i, (uint32_t)v[i]);
    return vec;
}

uint32_t ck_fbb_vec_f64(struct ck_fbb *b, const double *v, uint32_t n)
{
    uint32_t at, vec = ck_fbb_vec(b, n, 8, NULL, &at);
    for (uint32_t i = 0; i < n && !b->err; i++) {
        uint64_t u;
        memcpy(&u, &v[i], 8);
        put64(b->p + at + 8 * i, u);
    }
    return vec;
}

uint32_t ck_fbb_vec_bool(struct ck_fbb *b, const uint8_t *v, uint32_t n)
{
    uint32_t at, vec = ck_fbb_vec(b, n, 1, NULL, &at);
    for (uint32_t i = 0; i < n && !b->err; i++)
        b->p[at + i] = v[i] ? 1 : 0;
    return vec;
}

uint32_t ck_fbb_vec_offsets(struct ck_fbb *b, uint32_t n)
{
    return ck_fbb_vec(b, n, 4, NULL, NULL);
}

void ck_fbb_vec_set_off(struct ck_fbb *b, uint32_t vec, uint32_t i, uint32_t target)
{
    if (b->err)
        return;
    const unsigned char *q = b->p + vec;
    uint32_t n = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    if (i >= n) {
        b->err = ck_error(CK_ERR, "flatbuffers: element %u of a vector of %u", i, n);
        return;
    }
    point(b, vec + 4 + 4 * i, target);
}

uint32_t ck_fbb_string(struct ck_fbb *b, const char *s, size_t len)
{
    if (len > FBB_LIMIT) {
        if (!b->err)
            b->err = ck_error(CK_ESIZE, "flatbuffers: string of %zu bytes", len);
        return 0;
    }
    uint32_t v = grow(b, 4 + (uint64_t)len + 1, 4, 0);
    if (b->err)
        return 0;
    put32(b->p + v, (uint32_t)len);
    memcpy(b->p + v + 4, s, len);
    b->p[v + 4 + len] = 0;
    return v;
}

uint32_t ck_fbb_cstring(struct ck_fbb *b, const char *s)
{
    return ck_fbb_string(b, s, strlen(s));
}

uint32_t ck_fbb_vec_strings(struct ck_fbb *b, char *const *s, uint32_t n)
{
    uint32_t vec = ck_fbb_vec_offsets(b, n);
    for (uint32_t i = 0; i < n && !b->err; i++)
        ck_fbb_vec_set_off(b, vec, i, ck_fbb_cstring(b, s[i]));
    return vec;
}

unsigned char *ck_fbb_at(struct ck_fbb *b, uint32_t pos)
{
    return b->p + pos;
}

int ck_fbb_finish(struct ck_fbb *b, uint32_t root)
{
    if (!b->err)
        point(b, 0, root);
    return b->err;
}
