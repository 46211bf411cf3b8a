/* FlatBuffers reading with every offset checked; see flatbuf.h. */
#include "readers/flatbuf.h"

#include "common/error.h"

#include <string.h>

static uint16_t rd16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const unsigned char *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

int ck_fb_init(struct ck_fb *fb, const void *p, size_t len)
{
    if (len > INT32_MAX)
        return ck_error(CK_ESIZE, "flatbuffer of %zu bytes is over the 2 GiB limit", len);
    fb->p = p;
    fb->len = (uint32_t)len;
    return 0;
}

static int table_at(const struct ck_fb *fb, uint64_t pos, struct ck_fb_table *out)
{
    if (pos + 4 > fb->len)
        return ck_error(CK_EFORMAT, "table offset %llu past the end (%u bytes)",
                        (unsigned long long)pos, fb->len);
    int32_t so = (int32_t)rd32(fb->p + pos);
    int64_t vt = (int64_t)pos - so;
    if (vt < 0 || (uint64_t)vt + 4 > fb->len)
        return ck_error(CK_EFORMAT, "table at %llu: vtable offset %lld out of range",
                        (unsigned long long)pos, (long long)vt);
    uint16_t vtlen = rd16(fb->p + vt), tlen = rd16(fb->p + vt + 2);
    if (vtlen < 4 || (vtlen & 1) || (uint64_t)vt + vtlen > fb->len)
        return ck_error(CK_EFORMAT, "table at %llu: vtable size %u out of range",
                        (unsigned long long)pos, vtlen);
    if (tlen < 4 || pos + tlen > fb->len)
        return ck_error(CK_EFORMAT, "table at %llu: table size %u out of range",
                        (unsigned long long)pos, tlen);
    out->fb = fb;
    out->pos = (uint32_t)pos;
    out->vt = (uint32_t)vt;
    out->vtlen = vtlen;
    out->tlen = tlen;
    return 0;
}

int ck_fb_root(const struct ck_fb *fb, struct ck_fb_table *out)
{
    if (fb->len < 4)
        return ck_error(CK_EFORMAT, "flatbuffer of %u bytes is too short", fb->len);
    uint32_t off = rd32(fb->p);
    if (off == 0)
        return ck_error(CK_EFORMAT, "root offset is 0");
    return table_at(fb, off, out);
}

bool ck_fb_looks_valid(const void *p, size_t len)
{
    struct ck_fb fb;
    struct ck_fb_table t;
    if (len < 12 || len > INT32_MAX)
        return false;
    fb.p = p;
    fb.len = (uint32_t)len;
    uint32_t off = rd32(fb.p);
    if (off < 4 || (uint64_t)off + 4 > fb.len)
        return false;
    int32_t so = (int32_t)rd32(fb.p + off);
    int64_t vt = (int64_t)off - so;
    if (vt < 4 || (uint64_t)vt + 4 > fb.len)
        return false;
    return table_at(&fb, off, &t) == 0 || (ck_error_clear(), false);
}

/* Where slot's inline value of width bytes is: 1 and *at, 0 absent, or an error. */
static int field(const struct ck_fb_table *t, int slot, uint32_t width, uint32_t *at)
{
    uint32_t voff = 4 + 2 * (uint32_t)slot;
    if (slot < 0 || voff + 2 > t->vtlen)
        return 0;
    uint16_t fo = rd16(t->fb->p + t->vt + voff);
    if (fo == 0)
        return 0;
    if ((uint32_t)fo + width > t->tlen)
        return ck_error(CK_EFORMAT, "table at %u: field %d at %u overruns the table (%u bytes)",
                        t->pos, slot, fo, t->tlen);
    *at = t->pos + fo;
    return 1;
}

/* Follows the uoffset at a (inside the buffer) to *target. */
static int follow(const struct ck_fb *fb, uint32_t a, uint32_t need, uint32_t *target)
{
    uint32_t off = rd32(fb->p + a);
    uint64_t tg = (uint64_t)a + off;
    if (off == 0 || tg + need > fb->len)
        return ck_error(CK_EFORMAT, "offset %u at %u points past the end (%u bytes)", off, a,
                        fb->len);
    *target = (uint32_t)tg;
    return 0;
}

#define SCALAR_GETTER(fn, type, width, conv)                                                       \
    int fn(const struct ck_fb_table *t, int slot, type def, type *out)                             \
    {                                                                                              \
        uint32_t at = 0;                                                                           \
        int r = field(t, slot, width, &at);                                                        \
        *out = def;                                                                                \
        if (r == 1)                                                                                \
            *out = (type)conv(t->fb->p + at);                                                      \
        return r;                                                                                  \
    }

static uint8_t rd8(const unsigned char *p)
{
    return p[0];
}

SCALAR_GETTER(ck_fb_u8, uint8_t, 1, rd8)
SCALAR_GETTER(ck_fb_i8, int8_t, 1, rd8)
SCALAR_GETTER(ck_fb_i32, int32_t, 4, rd32)
SCALAR_GETTER(ck_fb_i64, int64_t, 8, rd64)

int ck_fb_table(const struct ck_fb_table *t, int slot, struct ck_fb_table *out)
{
    uint32_t at = 0, tg = 0;
    int r = field(t, slot, 4, &at);
    if (r <= 0)
        return r;
    if ((r = follow(t->fb, at, 4, &tg)) < 0)
        return r;
    if ((r = table_at(t->fb, tg, out)) < 0)
        return r;
    return 1;
}

static int vector_at(const struct ck_fb *fb, uint32_t at, uint32_t elem, struct ck_fb_vec *out)
{
    uint32_t tg = 0;
    int r = follow(fb, at, 4, &tg);
    if (r < 0)
        return r;
    uint32_t n = rd32(fb->p + tg);
    if ((uint64_t)n * elem > (uint64_t)fb->len - tg - 4)
        return ck_error(CK_EFORMAT, "vector at %u: %u elements of %u bytes overrun the buffer", tg,
                        n, elem);
    out->fb = fb;
    out->pos = tg + 4;
    out->n = n;
    out->elem = elem;
    return 0;
}

int ck_fb_vector(const struct ck_fb_table *t, int slot, uint32_t elem, struct ck_fb_vec *out)
{
    uint32_t at = 0;
    int r = field(t, slot, 4, &at);
    memset(out, 0, sizeof(*out));
    out->fb = t->fb;
    out->elem = elem;
    if (r <= 0)
        return r;
    if ((r = vector_at(t->fb, at, elem, out)) < 0)
        return r;
    return 1;
}

int ck_fb_string(const struct ck_fb_table *t, int slot, const char **s, uint32_t *len)
{
    struct ck_fb_vec v;
    int r = ck_fb_vector(t, slot, 1, &v);
    *s = "";
    *len = 0;
    if (r <= 0)
        return r;
    *s = (const char *)t->fb->p + v.pos;
    *len = v.n;
    return 1;
}

static int elem_check(const struct ck_fb_vec *v, uint32_t i)
{
    if (i >= v->n)
        return ck_error(CK_EFORMAT, "vector index %u out of range (%u elements)", i, v->n);
    return 0;
}

int ck_fb_vec_table(const struct ck_fb_vec *v, uint32_t i, struct ck_fb_table *out)
{
    uint32_t tg = 0;
    int r;
    if ((r = elem_check(v, i)) < 0 || (r = follow(v->fb, v->pos + 4 * i, 4, &tg)) < 0)
        return r;
    return table_at(v->fb, tg, out);
}

int ck_fb_vec_string(const struct ck_fb_vec *v, uint32_t i, const char **s, uint32_t *len)
{
    struct ck_fb_vec sv = {0};
    int r;
    if ((r = elem_check(v, i)) < 0 || (r = vector_at(v->fb, v->pos + 4 * i, 1, &sv)) < 0)
        return r;
    *s = (const char *)v->fb->p + sv.pos;
    *len = sv.n;
    return 0;
}

/* Scalar element readers: the vector bounds were checked when it was read;
 * an index out of range reads as 0. */
int32_t ck_fb_vec_i32(const struct ck_fb_vec *v, uint32_t i)
{
    return i < v->n && v->elem == 4 ? (int32_t)rd32(v->fb->p + v->pos + 4 * i) : 0;
}

int64_t ck_fb_vec_i64(const struct ck_fb_vec *v, uint32_t i)
{
    return i < v->n && v->elem == 8 ? (int64_t)rd64(v->fb->p + v->pos + 8 * (uint64_t)i) : 0;
}

double ck_fb_vec_f64(const struct ck_fb_vec *v, uint32_t i)
{
    double d = 0;
    if (i < v->n && v->elem == 8) {
        uint64_t u = rd64(v->fb->p + v->pos + 8 * (uint64_t)i);
        memcpy(&d, &u, sizeof(d));
    }
    return d;
}

uint8_t ck_fb_vec_u8(const struct ck_fb_vec *v, uint32_t i)
{
    return i < v->n && v->elem == 1 ? v->fb->p[v->pos + i] : 0;
}
