#include "readers/mldefsrc.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "lazy/lazy.h"
#include "readers/zipin.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

int ck_mldef_src_open(struct ck_mldef_src *s, const char *path)
{
    memset(s, 0, sizeof *s);
    s->path = path;
    size_t pl = strlen(path);
    const char *base = ck_basename(path);
    if (strcmp(base, "manifest.json") == 0 || (pl > 5 && strcmp(path + pl - 5, ".json") == 0)) {
        ck_dirname(s->dir, sizeof s->dir, path);
        return 0;
    }
    s->is_zip = true;
    int err = ck_lazy_load(CK_LIB_ZIP);
    if (err < 0)
        return ck_error_wrap(err, "'%s'", path);
    int zerr = 0;
    /* Not ZIP_CHECKCONS: it refuses duplicate names as a whole, and the
     * validator wants to name them (CRCs are still checked on every read). */
    s->z = zip_open(path, ZIP_RDONLY, &zerr);
    if (!s->z) {
        zip_error_t e;
        zip_error_init_with_code(&e, zerr);
        err = ck_error(CK_EFORMAT, "'%s': not a readable zip archive: %s", path,
                       zip_error_strerror(&e));
        zip_error_fini(&e);
        return err;
    }
    /* the layout every zip reader of ckptd checks (local headers agree with
     * the directory, no overlap): before any member is read or hashed */
    if ((err = ck_zipin_check_file(path, false)) < 0) {
        ck_mldef_src_close(s);
        return err;
    }
    zip_int64_t n = zip_get_num_entries(s->z, 0);
    if (n < 0 || n > 100000) {
        ck_mldef_src_close(s);
        return ck_error(CK_EFORMAT, "'%s': %lld entries", path, (long long)n);
    }
    s->names = calloc((size_t)n + 1, sizeof *s->names);
    s->index = calloc((size_t)n + 1, sizeof *s->index);
    if (!s->names || !s->index) {
        ck_mldef_src_close(s);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    for (zip_int64_t i = 0; i < n; i++) {
        const char *name = zip_get_name(s->z, (zip_uint64_t)i, ZIP_FL_ENC_RAW);
        if (!name)
            name = "";
        size_t len = strlen(name);
        if (len && name[len - 1] == '/')
            continue; /* a folder entry */
        if (!(s->names[s->n] = strdup(name))) {
            ck_mldef_src_close(s);
            return ck_error(CK_ENOMEM, "out of memory");
        }
        if ((err = ck_strset_put(&s->byname, s->names[s->n], s->n, NULL)) < 0) {
            ck_mldef_src_close(s);
            return err;
        }
        s->index[s->n++] = (uint64_t)i;
    }
    return 0;
}

void ck_mldef_src_close(struct ck_mldef_src *s)
{
    if (s->z)
        zip_discard(s->z);
    for (size_t i = 0; i < s->n; i++)
        free(s->names[i]);
    free(s->names);
    free(s->index);
    ck_strset_release(&s->byname);
    memset(s, 0, sizeof *s);
}

static bool find(const struct ck_mldef_src *s, const char *name, uint64_t *index)
{
    size_t k;
    if (!ck_strset_get(&s->byname, name, &k))
        return false;
    *index = s->index[k];
    return true;
}

/* A name beside the manifest; only names that passed the path rules reach
 * here, but refuse anything that could leave the folder all the same. */
static bool beside(const struct ck_mldef_src *s, const char *name, char *out, size_t outsz)
{
    if (!ck_zipin_name_is_safe(name))
        return false;
    return ck_path_join(out, outsz, s->dir, name) == 0;
}

bool ck_mldef_src_size(const struct ck_mldef_src *s, const char *name, uint64_t *size)
{
    if (s->is_zip) {
        uint64_t i;
        zip_stat_t st;
        zip_stat_init(&st);
        if (!find(s, name, &i) || zip_stat_index(s->z, i, 0, &st) < 0 ||
            !(st.valid & ZIP_STAT_SIZE))
            return false;
        *size = st.size;
        return true;
    }
    char p[4096];
    struct stat st;
    if (!beside(s, name, p, sizeof p) || stat(p, &st) < 0 || !S_ISREG(st.st_mode))
        return false;
    *size = (uint64_t)st.st_size;
    return true;
}

int ck_mldef_src_read(const struct ck_mldef_src *s, const char *name, uint64_t max,
                      struct ck_tensor_set *set, const unsigned char **data, uint64_t *len)
{
    if (s->is_zip) {
        uint64_t i;
        if (!find(s, name, &i))
            return ck_error(CK_ENOENT, "'%s': no entry '%s'", s->path, name);
        struct ck_zipin zi = {.z = s->z, .path = s->path, .nentries = s->n};
        return ck_zipin_read(&zi, set, i, max, data, len);
    }
    char p[4096];
    uint64_t size;
    if (!beside(s, name, p, sizeof p) || !ck_mldef_src_size(s, name, &size))
        return ck_error(CK_ENOENT, "'%s': no file '%s' beside it", s->path, name);
    if (size > max)
        return ck_error(CK_ESIZE, "'%s': '%s' is over %llu bytes", s->path, name,
                        (unsigned long long)max);
    return ck_tensor_set_map_file(set, p, data, len);
}

int ck_mldef_src_sha256(const struct ck_mldef_src *s, const char *name, char hex[65])
{
    struct ck_digests d;
    if (!s->is_zip) {
        char p[4096];
        if (!beside(s, name, p, sizeof p))
            return ck_error(CK_ENOENT, "'%s': no file '%s'", s->path, name);
        int err = ck_hash_file(p, CK_HASH_SHA256, &d, NULL);
        if (err < 0)
            return err;
        memcpy(hex, d.sha256, 65);
        return 0;
    }
    uint64_t i;
    if (!find(s, name, &i))
        return ck_error(CK_ENOENT, "'%s': no entry '%s'", s->path, name);
    zip_file_t *f = zip_fopen_index(s->z, i, 0);
    if (!f)
        return ck_error(CK_EFORMAT, "'%s': cannot open entry '%s': %s", s->path, name,
                        zip_strerror(s->z));
    struct ck_hash_ctx *c = ck_hash_ctx_new(CK_HASH_SHA256);
    unsigned char *buf = malloc(1 << 20);
    int err = 0;
    if (!c || !buf) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    for (;;) {
        zip_int64_t r = zip_fread(f, buf, 1 << 20);
        if (r < 0) {
            err = ck_error(CK_EFORMAT, "'%s': entry '%s': %s", s->path, name, zip_file_strerror(f));
            goto out;
        }
        if (r == 0)
            break;
        ck_hash_ctx_update(c, buf, (size_t)r);
    }
    ck_hash_ctx_final(c, &d);
    memcpy(hex, d.sha256, 65);
out:
    ck_hash_ctx_free(c);
    free(buf);
    zip_fclose(f);
    return err;
}
