/* Zip members in, safely; see zipin.h. */
#include "readers/zipin.h"

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
