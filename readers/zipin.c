/* Zip members in, safely; see zipin.h. */
#include "readers/zipin.h"
#include "readers/sumpass.h"

#include "common/error.h"
#include "lazy/lazy.h"

#include <string.h>
#include <zip.h>

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
    int zerr = 0;
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

/* One deflated (or otherwise compressed) member read to its end in small
 * pieces: libzip compares the CRC-32 when the last byte has been read. */
static int check_compressed(const struct ck_zipin *zi, uint64_t i, const char *name)
{
    unsigned char buf[1 << 16];
    zip_file_t *f = zip_fopen_index(zi->z, i, 0);
    int err = 0;
    if (!f)
        return ck_error(CK_EFORMAT, "'%s': cannot open member '%s': %s", zi->path, name,
                        zip_strerror(zi->z));
    for (;;) {
        zip_int64_t r = zip_fread(f, buf, sizeof buf);
        if (r == 0)
            break;
        if (r < 0) {
            err =
                ck_error(CK_EFORMAT, "'%s': member '%s': %s", zi->path, name, zip_file_strerror(f));
            break;
        }
    }
    zip_fclose(f);
    return err;
}

int ck_zipin_check_crcs(const struct ck_tensor_set *s, struct ck_tensor_crcs *crcs)
{
    /* scratch: the central directory's offsets, so s itself stays untouched */
    struct ck_tensor_set *scratch = ck_tensor_set_new("zip", s->path);
    struct ck_zipin zi = {0};
    struct ck_sumpass sp;
    const unsigned char *base, *data;
    uint64_t blen, *offs = NULL;
    int err;
    if (!scratch)
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = ck_sumpass_init(&sp, s, crcs)) < 0) {
        ck_tensor_set_free(scratch);
        return err;
    }
    if ((err = ck_tensor_set_first_mapping(s, &base, &blen)) < 0 ||
        (err = ck_zipin_open(&zi, s->path)) < 0)
        goto out;
    for (uint64_t i = 0; i < zi.nentries; i++) {
        const char *name = ck_zipin_name(&zi, i);
        zip_stat_t st;
        zip_stat_init(&st);
        if (zip_stat_index(zi.z, i, 0, &st) < 0 || !(st.valid & ZIP_STAT_COMP_METHOD) ||
            !(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_CRC)) {
            err = ck_error(CK_EFORMAT, "'%s': member '%s': no sizes", s->path, name);
            goto out;
        }
        if (st.comp_method != ZIP_CM_STORE) {
            if ((err = check_compressed(&zi, i, name)) < 0)
                goto out;
            continue;
        }
        if (!offs && (err = ck_zipin_local_offsets(scratch, base, blen, zi.nentries, &offs)) < 0)
            goto out;
        if ((err = ck_zipin_stored(scratch, base, blen, offs[i], name, st.size, &data)) < 0)
            goto out;
        uint32_t crc = ck_sumpass_region(&sp, data, st.size);
        if (crc != st.crc) {
            err = ck_error(CK_EFORMAT, "'%s': member '%s': zip CRC-32 %08x, stored %08x", s->path,
                           name, (unsigned)crc, (unsigned)st.crc);
            goto out;
        }
    }
out:
    ck_zipin_close(&zi);
    ck_sumpass_release(&sp);
    ck_tensor_set_free(scratch);
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
