/* Zip members in, safely; see zipin.h. */
#include "readers/zipin.h"
#include "readers/sumpass.h"

#include "common/error.h"
#include "lazy/lazy.h"

#include "common/crc32.h"
#include <errno.h>

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>
#include <zlib.h>

/* Deflate cannot expand more than about 1032:1; anything claiming more lies. */
#define DEFLATE_MAX_RATIO 1032u

bool ck_zipin_is_zip(const unsigned char *head, size_t len)
{
    return len >= 4 && head[0] == 'P' && head[1] == 'K' &&
           ((head[2] == 3 && head[3] == 4) || (head[2] == 5 && head[3] == 6));
}

bool ck_zipin_name_is_safe(const char *name)
{
    if (!name || !*name || name[0] == '/' || strchr(name, '\\'))
        return false;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p < 0x20 || *p == 0x7f) /* control bytes: a terminal's escapes in every message */
            return false;
    if (((name[0] >= 'A' && name[0] <= 'Z') || (name[0] >= 'a' && name[0] <= 'z')) &&
        name[1] == ':')
        return false;
    for (const char *p = name; *p;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return false;
        p += n;
        if (*p == '/')
            p++;
    }
    return true;
}

int ck_zipin_open(struct ck_zipin *zi, const char *path)
{
    int zerr = 0, err0;
    memset(zi, 0, sizeof(*zi));
    zi->path = path;
    int loaded = ck_lazy_load(CK_LIB_ZIP);
    if (loaded < 0)
        return ck_error_wrap(loaded, "'%s'", path);
    zi->z = zip_open(path, ZIP_RDONLY | ZIP_CHECKCONS, &zerr);
    if (!zi->z) {
        zip_error_t e;
        zip_error_init_with_code(&e, zerr);
        int code = zerr == ZIP_ER_OPEN || zerr == ZIP_ER_READ ? CK_EIO : CK_EFORMAT;
        if (zerr == ZIP_ER_NOENT)
            code = CK_ENOENT;
        code = ck_error(code, "'%s': not a readable zip archive: %s", path, zip_error_strerror(&e));
        zip_error_fini(&e);
        return code;
    }
    zip_int64_t n = zip_get_num_entries(zi->z, 0);
    zi->nentries = n > 0 ? (uint64_t)n : 0;
    for (uint64_t i = 0; i < zi->nentries; i++) {
        const char *name = zip_get_name(zi->z, i, ZIP_FL_ENC_RAW);
        if (!ck_zipin_name_is_safe(name)) {
            int err = ck_error(CK_EFORMAT, "'%s': member '%s' has an unsafe name", path,
                               name ? name : "");
            ck_zipin_close(zi);
            return err;
        }
        /* the name must lead back to this member: two members of one name (a
         * reader would take one, another tool the other), or a name cut at a
         * NUL byte, are an archive that means two things */
        if (zip_name_locate(zi->z, name, ZIP_FL_ENC_RAW) != (zip_int64_t)i) {
            int err = ck_error(CK_EFORMAT,
                               "'%s': member '%s' is named twice, or its name holds a NUL byte",
                               path, name);
            ck_zipin_close(zi);
            return err;
        }
    }
    /* libzip reads what the central directory says; what the local headers
     * say (another tool's view) must agree with it, entry by entry */
    if ((err0 = ck_zipin_check_file(path, false)) < 0) {
        ck_zipin_close(zi);
        return err0;
    }
    return 0;
}

void ck_zipin_close(struct ck_zipin *zi)
{
    if (zi->z)
        zip_discard(zi->z);
    zi->z = NULL;
}

const char *ck_zipin_name(const struct ck_zipin *zi, uint64_t i)
{
    return i < zi->nentries ? zip_get_name(zi->z, i, ZIP_FL_ENC_RAW) : NULL;
}

int ck_zipin_find(const struct ck_zipin *zi, const char *name, uint64_t *index)
{
    zip_int64_t i = zip_name_locate(zi->z, name, ZIP_FL_ENC_RAW);
    if (i < 0)
        return ck_error(CK_ENOENT, "'%s': no member '%s'", zi->path, name);
    *index = (uint64_t)i;
    return 0;
}

int ck_zipin_read(const struct ck_zipin *zi, struct ck_tensor_set *s, uint64_t i, uint64_t max,
                  const unsigned char **data, uint64_t *len)
{
    zip_stat_t st;
    const char *name = ck_zipin_name(zi, i);
    int err = 0;
    zip_stat_init(&st);
    if (!name || zip_stat_index(zi->z, i, 0, &st) < 0)
        return ck_error(CK_EFORMAT, "'%s': cannot read member %llu: %s", zi->path,
                        (unsigned long long)i, zip_strerror(zi->z));
    if (!(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_COMP_SIZE))
        return ck_error(CK_EFORMAT, "'%s': member '%s' has no size", zi->path, name);
    if (st.size > max)
        return ck_error(CK_ESIZE, "'%s': member '%s' of %llu bytes is over the limit of %llu",
                        zi->path, name, (unsigned long long)st.size, (unsigned long long)max);
    if (st.comp_method == ZIP_CM_STORE && st.size != st.comp_size)
        return ck_error(CK_EFORMAT, "'%s': stored member '%s' claims %llu bytes in %llu", zi->path,
                        name, (unsigned long long)st.size, (unsigned long long)st.comp_size);
    if (st.size / DEFLATE_MAX_RATIO > st.comp_size + 1)
        return ck_error(CK_EFORMAT, "'%s': member '%s' claims %llu bytes from %llu compressed",
                        zi->path, name, (unsigned long long)st.size,
                        (unsigned long long)st.comp_size);
    void *buf = NULL;
    if ((err = ck_tensor_set_alloc(s, st.size ? st.size : 1, &buf)) < 0)
        return err;
    zip_file_t *f = zip_fopen_index(zi->z, i, 0);
    if (!f)
        return ck_error(CK_EFORMAT, "'%s': cannot open member '%s': %s", zi->path, name,
                        zip_strerror(zi->z));
    uint64_t got = 0;
    while (got < st.size) {
        zip_int64_t r = zip_fread(f, (unsigned char *)buf + got, st.size - got);
        if (r <= 0) {
            err = ck_error(CK_EFORMAT, "'%s': member '%s': %s after %llu of %llu bytes", zi->path,
                           name, r < 0 ? zip_file_strerror(f) : "data ends",
                           (unsigned long long)got, (unsigned long long)st.size);
            goto out;
        }
        got += (uint64_t)r;
    }
    /* One more read reaches the end, where libzip checks the CRC. */
    unsigned char extra;
    zip_int64_t r = zip_fread(f, &extra, 1);
    if (r != 0) {
        err = ck_error(CK_EFORMAT, "'%s': member '%s': %s", zi->path, name,
                       r < 0 ? zip_file_strerror(f) : "more data than its size");
        goto out;
    }
    *data = buf;
    *len = st.size;
out:
    zip_fclose(f);
    return err;
}

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* The end of central directory record (and its zip64 form): the number of
 * entries and where the directory is. */
static int find_directory(const char *path, const unsigned char *b, uint64_t len, uint64_t *count,
                          uint64_t *cdoff, uint64_t *cdsize)
{
    uint64_t e = len, stop = len > 22 + 65535 ? len - 22 - 65535 : 0;
    for (uint64_t i = len >= 22 ? len - 22 + 1 : 0; i-- > stop;)
        if (le(b + i, 4) == 0x06054b50) {
            e = i;
            break;
        }
    if (e == len)
        return ck_error(CK_EFORMAT, "'%s': no zip end of central directory", path);
    *count = le(b + e + 10, 2);
    *cdsize = le(b + e + 12, 4);
    *cdoff = le(b + e + 16, 4);
    if (*count == 0xffff || *cdsize == 0xffffffff || *cdoff == 0xffffffff) {
        if (e < 20 || le(b + e - 20, 4) != 0x07064b50)
            return ck_error(CK_EFORMAT, "'%s': no zip64 locator", path);
        uint64_t z = le(b + e - 20 + 8, 8);
        if (z > len || len - z < 56 || le(b + z, 4) != 0x06064b50)
            return ck_error(CK_EFORMAT, "'%s': bad zip64 end of central directory", path);
        *count = le(b + z + 32, 8);
        *cdsize = le(b + z + 40, 8);
        *cdoff = le(b + z + 48, 8);
    }
    if (*cdoff > len || *cdsize > len - *cdoff)
        return ck_error(CK_EFORMAT, "'%s': central directory past the end", path);
    return 0;
}

int ck_zipin_local_offsets(struct ck_tensor_set *s, const unsigned char *b, uint64_t len,
                           uint64_t n, uint64_t **offs)
{
    uint64_t count = 0, cdoff = 0, cdsize = 0;
    int err;
    const char *path = s->path;
    if ((err = find_directory(path, b, len, &count, &cdoff, &cdsize)) < 0)
        return err;
    if (count != n || n > cdsize / 46)
        return ck_error(CK_EFORMAT, "'%s': the central directory lists %llu members, not %llu",
                        path, (unsigned long long)count, (unsigned long long)n);
    if ((err = ck_tensor_set_alloc(s, n * sizeof **offs, (void **)offs)) < 0)
        return err;
    const unsigned char *p = b + cdoff, *end = p + cdsize;
    for (uint64_t i = 0; i < n; i++) {
        if (end - p < 46 || le(p, 4) != 0x02014b50)
            return ck_error(CK_EFORMAT, "'%s': bad central directory entry %llu", path,
                            (unsigned long long)i);
        uint64_t nl = le(p + 28, 2), el = le(p + 30, 2), cl = le(p + 32, 2);
        uint64_t csize = le(p + 20, 4), usize = le(p + 24, 4), off = le(p + 42, 4);
        if (46 + nl + el + cl > (uint64_t)(end - p))
            return ck_error(CK_EFORMAT, "'%s': central directory entry %llu past its end", path,
                            (unsigned long long)i);
        const unsigned char *x = p + 46 + nl, *xe = x + el;
        while (off == 0xffffffff && xe - x >= 4) {
            uint64_t id = le(x, 2), sz = le(x + 2, 2);
            if (sz > (uint64_t)(xe - x) - 4)
                break;
            if (id == 1) { /* zip64: usize, csize, offset, each only when its field is full */
                uint64_t at = (usize == 0xffffffff ? 8 : 0) + (csize == 0xffffffff ? 8 : 0);
                if (at + 8 <= sz)
                    off = le(x + 4 + at, 8);
                break;
            }
            x += 4 + sz;
        }
        (*offs)[i] = off;
        p += 46 + nl + el + cl;
    }
    return 0;
}

int ck_zipin_stored(struct ck_tensor_set *s, const unsigned char *b, uint64_t len, uint64_t loff,
                    const char *member, uint64_t size, const unsigned char **data)
{
    size_t ml = strlen(member);
    if (loff > len || len - loff < 30 || le(b + loff, 4) != 0x04034b50)
        return ck_error(CK_EFORMAT, "'%s': member '%s': no local header at %llu", s->path, member,
                        (unsigned long long)loff);
    uint64_t nl = le(b + loff + 26, 2), el = le(b + loff + 28, 2);
    uint64_t at = loff + 30 + nl + el;
    if (nl != ml || at > len || memcmp(b + loff + 30, member, ml))
        return ck_error(CK_EFORMAT,
                        "'%s': member '%s': local header disagrees with the "
                        "central directory",
                        s->path, member);
    if (size > len - at)
        return ck_error(CK_EFORMAT, "'%s': member '%s': %llu bytes past the end", s->path, member,
                        (unsigned long long)size);
    *data = b + at;
    return 0;
}

/* name as a message may show it: at most 200 bytes, no control byte (a
 * terminal's escapes) */
static const char *shown(const unsigned char *name, size_t n, char out[256])
{
    size_t k = n > 200 ? 200 : n;
    for (size_t j = 0; j < k; j++)
        if (name[j] < 0x20 || name[j] == 0x7f || name[j] == '\'')
            return "(a name with control bytes)";
    memcpy(out, name, k);
    strcpy(out + k, n > k ? "..." : "");
    return out;
}

/* The central directory as the file says it, checked against the local
 * headers: what every reader of ckptd trusts before it reads a member. */
static int layout_fail(const char *path, uint64_t i, const unsigned char *name, size_t nl,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int layout_fail(const char *path, uint64_t i, const unsigned char *name, size_t nl,
                       const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    char sn[256];
    if (!name)
        return ck_error(CK_EFORMAT, "'%s': central directory entry %llu: %s", path,
                        (unsigned long long)i, what);
    return ck_error(CK_EFORMAT, "'%s': member '%s': %s", path, shown(name, nl, sn), what);
}

/* One central directory record at p (at most left bytes): its fields, the
 * zip64 extra applied. */
static int cd_record(const char *path, uint64_t i, const unsigned char *p, uint64_t left,
                     struct ck_zipin_member *m, uint64_t *reclen)
{
    if (left < 46 || le(p, 4) != 0x02014b50)
        return layout_fail(path, i, NULL, 0, "bad signature or truncated");
    uint64_t nl = le(p + 28, 2), el = le(p + 30, 2), cl = le(p + 32, 2);
    if (46 + nl + el + cl > left)
        return layout_fail(path, i, NULL, 0, "runs past the directory's end");
    m->name = p + 46;
    m->namelen = nl;
    m->flags = (uint16_t)le(p + 8, 2);
    m->method = (uint16_t)le(p + 10, 2);
    m->crc = (uint32_t)le(p + 16, 4);
    m->csize = le(p + 20, 4);
    m->usize = le(p + 24, 4);
    m->local = le(p + 42, 4);
    bool zu = m->usize == 0xffffffff, zc = m->csize == 0xffffffff, zo = m->local == 0xffffffff;
    const unsigned char *x = p + 46 + nl, *xe = x + el;
    while ((zu || zc || zo) && xe - x >= 4) {
        uint64_t id = le(x, 2), sz = le(x + 2, 2), at = 4;
        if (sz > (uint64_t)(xe - x) - 4)
            break;
        if (id == 1) { /* usize, csize, offset: each only when its field is full */
            if (zu && at + 8 <= 4 + sz)
                m->usize = le(x + at, 8), at += 8, zu = false;
            if (zc && at + 8 <= 4 + sz)
                m->csize = le(x + at, 8), at += 8, zc = false;
            if (zo && at + 8 <= 4 + sz)
                m->local = le(x + at, 8), zo = false;
            break;
        }
        x += 4 + sz;
    }
    if (zu || zc || zo)
        return layout_fail(path, i, m->name, nl, "a full size or offset field without its zip64 "
                           "value");
    *reclen = 46 + nl + el + cl;
    return 0;
}

/* The member's local header at m->local: the same name, method and (without
 * a data descriptor) the same CRC and sizes; m->data set to where its bytes
 * start, which with its compressed size must end before cdoff. */
static int local_header(const char *path, uint64_t i, const unsigned char *b, uint64_t cdoff,
                        struct ck_zipin_member *m)
{
    const unsigned char *n = m->name;
    size_t nl = m->namelen;
    if (m->local > cdoff || cdoff - m->local < 30 || le(b + m->local, 4) != 0x04034b50)
        return layout_fail(path, i, n, nl, "no local header at %llu", (unsigned long long)m->local);
    const unsigned char *h = b + m->local;
    uint64_t lnl = le(h + 26, 2), lel = le(h + 28, 2);
    if (30 + lnl + lel > cdoff - m->local)
        return layout_fail(path, i, n, nl, "local header at %llu runs into the central "
                           "directory",
                           (unsigned long long)m->local);
    if (lnl != nl || memcmp(h + 30, n, nl) != 0) {
        char a[256], c[256];
        return ck_error(CK_EFORMAT,
                        "'%s': member '%s': its local header names it '%s' (the central "
                        "directory and the local header disagree)",
                        path, shown(n, nl, a), shown(h + 30, lnl, c));
    }
    if (le(h + 8, 2) != m->method)
        return layout_fail(path, i, n, nl, "local header's method %u, the directory's %u",
                           (unsigned)le(h + 8, 2), (unsigned)m->method);
    if (!(le(h + 6, 2) & 8)) {
        uint64_t lcrc = le(h + 14, 4), lc = le(h + 18, 4), lu = le(h + 22, 4);
        if (lcrc != m->crc || (lc != 0xffffffff && lc != m->csize) ||
            (lu != 0xffffffff && lu != m->usize))
            return layout_fail(path, i, n, nl, "local header's CRC or sizes differ from the "
                               "central directory's");
    }
    m->data = m->local + 30 + lnl + lel;
    if (m->csize > cdoff - m->data)
        return layout_fail(path, i, n, nl, "%llu compressed bytes from %llu run into the "
                           "central directory", (unsigned long long)m->csize,
                           (unsigned long long)m->data);
    return 0;
}

/* What one member may claim: a method ckptd reads, no encryption, a size
 * within max and within what its compressed bytes can expand to. */
static int member_claims(const char *path, uint64_t i, const struct ck_zipin_member *m,
                         uint64_t max)
{
    const unsigned char *n = m->name;
    size_t nl = m->namelen;
    if (m->flags & 1)
        return layout_fail(path, i, n, nl, "encrypted");
    if (m->method != 0 && m->method != 8)
        return layout_fail(path, i, n, nl, "compression method %u (only 0, stored, and 8, "
                           "deflated, are read)", (unsigned)m->method);
    if (m->usize > max) {
        char sn[256];
        return ck_error(CK_ESIZE, "'%s': member '%s' of %llu bytes is over the limit of %llu",
                        path, shown(n, nl, sn), (unsigned long long)m->usize,
                        (unsigned long long)max);
    }
    if (m->method == 0 && m->usize != m->csize)
        return layout_fail(path, i, n, nl, "stored, yet claims %llu bytes in %llu",
                           (unsigned long long)m->usize, (unsigned long long)m->csize);
    if (m->method == 8 && m->usize / DEFLATE_MAX_RATIO > m->csize + 1)
        return layout_fail(path, i, n, nl, "claims %llu bytes from %llu compressed",
                           (unsigned long long)m->usize, (unsigned long long)m->csize);
    return 0;
}

int ck_zipin_layout(const char *path, const unsigned char *b, uint64_t len, uint64_t max,
                    struct ck_zipin_member **out, uint64_t *count)
{
    uint64_t n = 0, cdoff = 0, cdsize = 0, reclen = 0, end = 0;
    int err;
    *out = NULL;
    *count = 0;
    if ((err = find_directory(path, b, len, &n, &cdoff, &cdsize)) < 0)
        return err;
    if (n > cdsize / 46) /* before allocating: every record takes 46 bytes at least */
        return ck_error(CK_EFORMAT, "'%s': %llu members cannot fit a central directory of %llu "
                        "bytes", path, (unsigned long long)n, (unsigned long long)cdsize);
    struct ck_zipin_member *v = calloc(n ? n : 1, sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "'%s': out of memory for %llu members", path,
                        (unsigned long long)n);
    const unsigned char *p = b + cdoff;
    for (uint64_t i = 0; i < n; i++, p += reclen) {
        struct ck_zipin_member *m = &v[i];
        if ((err = cd_record(path, i, p, cdsize - (uint64_t)(p - (b + cdoff)), m, &reclen)) < 0 ||
            (err = member_claims(path, i, m, max)) < 0)
            goto fail;
        /* in the file's order, none inside another: an entry that points back
         * (90 directory entries over one stream) is refused before its bytes
         * are read, let alone hashed */
        if (m->local < end) {
            const struct ck_zipin_member *q = &v[i - 1];
            char a[256], c[256];
            err = ck_error(CK_EFORMAT,
                           "'%s': member '%s' at %llu %s member '%s' (entries must not "
                           "overlap and must be listed in the file's order)",
                           path, shown(m->name, m->namelen, a), (unsigned long long)m->local,
                           m->local < q->local ? "comes before the earlier-listed"
                                               : "overlaps",
                           shown(q->name, q->namelen, c));
            goto fail;
        }
        if ((err = local_header(path, i, b, cdoff, m)) < 0)
            goto fail;
        end = m->data + m->csize;
    }
    *out = v;
    *count = n;
    return 0;
fail:
    free(v);
    return err;
}

/* A deflated member inflated in pieces from the mapping, never past its
 * declared size: the CRC-32 of what it inflates to, which must be exactly
 * usize bytes from exactly csize compressed bytes. */
static int inflated(const char *path, const unsigned char *b, const struct ck_zipin_member *m,
                    uint32_t *crc)
{
    unsigned char out[1 << 16];
    z_stream zs;
    char sn[256];
    const char *name = shown(m->name, m->namelen, sn);
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, -15) != Z_OK)
        return ck_error(CK_ENOMEM, "'%s': member '%s': out of memory for inflating", path, name);
    const unsigned char *in = b + m->data;
    uint64_t fed = 0, total = 0;
    int err = 0, r;
    *crc = 0;
    for (;;) {
        if (zs.avail_in == 0 && fed < m->csize) {
            uint64_t k = m->csize - fed > (1u << 30) ? (1u << 30) : m->csize - fed;
            zs.next_in = (unsigned char *)(uintptr_t)(in + fed);
            zs.avail_in = (uInt)k;
            fed += k;
        }
        zs.next_out = out;
        zs.avail_out = sizeof out;
        r = inflate(&zs, Z_NO_FLUSH);
        uint64_t got = sizeof out - zs.avail_out;
        if (got > m->usize - total) {
            err = ck_error(CK_EFORMAT, "'%s': member '%s' inflates past its declared %llu bytes",
                           path, name, (unsigned long long)m->usize);
            break;
        }
        *crc = ck_crc32_extend(*crc, out, got);
        total += got;
        if (r == Z_STREAM_END)
            break;
        if (r == Z_OK || (r == Z_BUF_ERROR && (zs.avail_in || fed < m->csize)))
            continue;
        err = ck_error(CK_EFORMAT, "'%s': member '%s': %s after %llu of %llu bytes", path, name,
                       r == Z_BUF_ERROR ? "compressed data ends" : zs.msg ? zs.msg : "bad deflate data",
                       (unsigned long long)total, (unsigned long long)m->usize);
        break;
    }
    uint64_t used = fed - zs.avail_in;
    inflateEnd(&zs);
    if (err == 0 && total != m->usize)
        err = ck_error(CK_EFORMAT, "'%s': member '%s' inflates to %llu bytes, not its declared %llu",
                       path, name, (unsigned long long)total, (unsigned long long)m->usize);
    if (err == 0 && used != m->csize)
        err = ck_error(CK_EFORMAT,
                       "'%s': member '%s': its deflate stream ends after %llu of its %llu "
                       "compressed bytes",
                       path, name, (unsigned long long)used, (unsigned long long)m->csize);
    return err;
}

int ck_zipin_check_members(const char *path, const unsigned char *b, uint64_t len, uint64_t max,
                           struct ck_sumpass *sp)
{
    struct ck_zipin_member *v = NULL;
    uint64_t n = 0;
    int err = ck_zipin_layout(path, b, len, max, &v, &n);
    for (uint64_t i = 0; err == 0 && i < n; i++) {
        const struct ck_zipin_member *m = &v[i];
        uint32_t crc = 0;
        if (m->method == 0)
            crc = sp ? ck_sumpass_region(sp, b + m->data, m->usize)
                     : ck_crc32_extend(0, b + m->data, m->usize);
        else if ((err = inflated(path, b, m, &crc)) < 0)
            break;
        if (crc != m->crc) {
            char sn[256];
            err = ck_error(CK_EFORMAT, "'%s': member '%s': zip CRC-32 %08x, stored %08x", path,
                           shown(m->name, m->namelen, sn), (unsigned)crc, (unsigned)m->crc);
        }
    }
    free(v);
    return err;
}

int ck_zipin_check_crcs(const struct ck_tensor_set *s, struct ck_tensor_crcs *crcs)
{
    struct ck_sumpass sp;
    const unsigned char *base;
    uint64_t blen;
    int err;
    if ((err = ck_tensor_set_first_mapping(s, &base, &blen)) < 0)
        return err;
    if ((err = ck_sumpass_init(&sp, s, crcs)) < 0)
        return err;
    err = ck_zipin_check_members(s->path, base, blen, CK_TENSOR_ALLOC_MAX, &sp);
    ck_sumpass_release(&sp);
    return err;
}

int ck_zipin_verify_archive(const struct ck_tensor_set *s, struct ck_tensor_crcs *crcs)
{
    const unsigned char *p;
    uint64_t len;
    if (ck_tensor_set_first_mapping(s, &p, &len) < 0 || !ck_zipin_is_zip(p, len))
        return CK_VERIFY_NONE;
    return ck_zipin_check_crcs(s, crcs);
}

int ck_zipin_map(const char *path, const unsigned char **b, uint64_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    *b = NULL;
    *len = 0;
    if (fd < 0)
        return ck_error_os(errno == ENOENT ? CK_ENOENT : CK_EIO, "cannot open '%s'", path);
    if (fstat(fd, &st) < 0) {
        close(fd);
        return ck_error_os(CK_EIO, "cannot stat '%s'", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return ck_error_os(CK_EIO, "cannot map '%s'", path);
        }
        *b = p;
        *len = (uint64_t)st.st_size;
    }
    close(fd);
    return 0;
}

void ck_zipin_unmap(const unsigned char *b, uint64_t len)
{
    if (b && len)
        munmap((void *)(uintptr_t)b, (size_t)len);
}

int ck_zipin_check_file(const char *path, bool members)
{
    const unsigned char *b;
    uint64_t len, n;
    struct ck_zipin_member *v = NULL;
    int err = ck_zipin_map(path, &b, &len);
    if (err < 0)
        return err;
    if (members)
        err = ck_zipin_check_members(path, b, len, CK_TENSOR_ALLOC_MAX, NULL);
    else
        err = ck_zipin_layout(path, b, len, UINT64_MAX, &v, &n);
    free(v);
    ck_zipin_unmap(b, len);
    return err;
}
