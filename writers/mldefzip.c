#include "writers/mldefzip.h"

#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "lazy/lazy.h"
#include "model/mldef.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

#define CHUNK (1u << 20)

/* One entry: where its bytes come from, and their digest once read whole. */
struct entry {
    struct ck_mldef_zip *z;
    char *name;
    struct ck_mldef_stream s;
    /* a file source */
    char *src;
    int fd;
    struct stat st;
    /* a buffer source */
    unsigned char *data;
    size_t len, pos;
    /* digest of the bytes handed to libzip in the last full pass */
    struct ck_hash_ctx *hash;
    uint64_t done;
    char sha256[65];
    bool digested;
    bool is_signature;
};

struct ck_mldef_zip {
    char *path;
    char *tmp;
    zip_t *zip;
    int level;
    const struct ck_sign_key *key;
    struct entry **entries;
    size_t n;
    int err; /* the first error a callback met, as a ck error code */
    char errmsg[512];
    struct ck_buf sig;
    uint64_t size;
    bool finished;
};

static int fail(struct ck_mldef_zip *z, int code)
{
    if (!z->err) {
        z->err = code;
        snprintf(z->errmsg, sizeof z->errmsg, "%s", ck_error_msg());
    }
    return code;
}

/* ---- the stream kinds ---- */

static int buf_rewind(void *ctx)
{
    ((struct entry *)ctx)->pos = 0;
    return 0;
}

static int64_t buf_read(void *ctx, void *out, size_t len)
{
    struct entry *e = ctx;
    size_t n = e->len - e->pos < len ? e->len - e->pos : len;
    memcpy(out, e->data + e->pos, n);
    e->pos += n;
    return (int64_t)n;
}

static int file_rewind(void *ctx)
{
    struct entry *e = ctx;
    struct stat st;
    if (e->fd < 0 && (e->fd = open(e->src, O_RDONLY | O_CLOEXEC)) < 0)
        return ck_error_os(CK_EIO, "cannot open '%s'", e->src);
    if (fstat(e->fd, &st) < 0 || st.st_size != e->st.st_size ||
        st.st_mtim.tv_sec != e->st.st_mtim.tv_sec || st.st_mtim.tv_nsec != e->st.st_mtim.tv_nsec)
        return ck_error(CK_ECHANGED, "'%s' changed while it was packed", e->src);
    if (lseek(e->fd, 0, SEEK_SET) < 0)
        return ck_error_os(CK_EIO, "cannot seek in '%s'", e->src);
    return 0;
}

static int64_t file_read(void *ctx, void *out, size_t len)
{
    struct entry *e = ctx;
    for (;;) {
        ssize_t n = read(e->fd, out, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ck_error_os(CK_EIO, "cannot read '%s'", e->src);
        /* Tell the kernel we are done with what we read: one pass over a big
         * file should not push everything else out of the page cache. */
        if (n > 0)
            posix_fadvise(e->fd, 0, 0, POSIX_FADV_DONTNEED);
        return n;
    }
}

/* ---- the libzip callback ---- */

static zip_int64_t source_cb(void *ud, void *data, zip_uint64_t len, zip_source_cmd_t cmd)
{
    struct entry *e = ud;
    struct ck_mldef_zip *z = e->z;
    switch (cmd) {
    case ZIP_SOURCE_OPEN:
        if (z->err)
            return -1;
        if (e->is_signature) {
            /* SIGNATURE is added last, so libzip reaches it after every other
             * entry has been read whole; refuse rather than sign a guess. */
            for (size_t i = 0; i < z->n; i++)
                if (!z->entries[i]->is_signature && !z->entries[i]->digested) {
                    fail(z, ck_error(CK_ERR, "'%s': '%s' was not written before SIGNATURE", z->path,
                                     z->entries[i]->name));
                    return -1;
                }
        }
        if (e->s.rewind && e->s.rewind(e->s.ctx) < 0) {
            fail(z, ck_error_wrap(CK_EIO, "'%s': entry '%s'", z->path, e->name));
            return -1;
        }
        ck_hash_ctx_free(e->hash);
        e->hash = NULL;
        /* Digests are for SIGNATURE only: an unsigned archive skips them. */
        if (z->key && !e->is_signature && !(e->hash = ck_hash_ctx_new(CK_HASH_SHA256))) {
            fail(z, ck_error(CK_ENOMEM, "out of memory"));
            return -1;
        }
        e->done = 0;
        e->digested = false;
        return 0;
    case ZIP_SOURCE_READ: {
        if (len > CHUNK)
            len = CHUNK;
        if (e->done + len > e->s.size)
            len = e->s.size - e->done;
        int64_t n = len ? e->s.read(e->s.ctx, data, (size_t)len) : 0;
        if (n < 0) {
            fail(z, ck_error_wrap((int)n, "'%s': entry '%s'", z->path, e->name));
            return -1;
        }
        if (n == 0 && e->done != e->s.size) {
            fail(z, ck_error(CK_ECHANGED, "'%s': entry '%s': %llu bytes instead of %llu", z->path,
                             e->name, (unsigned long long)e->done, (unsigned long long)e->s.size));
            return -1;
        }
        if (n > 0 && e->hash)
            ck_hash_ctx_update(e->hash, data, (size_t)n);
        e->done += (uint64_t)n;
        if (e->done == e->s.size && !e->digested) {
            if (e->hash) {
                struct ck_digests d;
                ck_hash_ctx_final(e->hash, &d);
                ck_hash_ctx_free(e->hash);
                e->hash = NULL;
                memcpy(e->sha256, d.sha256, sizeof e->sha256);
            }
            e->digested = true;
        }
        return n;
    }
    case ZIP_SOURCE_CLOSE:
        return 0;
    case ZIP_SOURCE_STAT: {
        zip_stat_t *st = data;
        zip_stat_init(st);
        st->size = e->s.size;
        st->mtime = 315532800; /* 1980-01-01: the same model gives the same bytes */
        st->valid |= ZIP_STAT_SIZE | ZIP_STAT_MTIME;
        return sizeof *st;
    }
    case ZIP_SOURCE_ERROR: {
        int *v = data;
        if (len < 2 * sizeof(int))
            return -1;
        v[0] = ZIP_ER_READ;
        v[1] = 0;
        return 2 * sizeof(int);
    }
    case ZIP_SOURCE_FREE:
        return 0;
    case ZIP_SOURCE_SUPPORTS:
        return ZIP_SOURCE_SUPPORTS_READABLE;
    default:
        return -1;
    }
}

/* ---- building ---- */

static bool is_mldef(const char *path)
{
    int zerr = 0;
    zip_t *old = zip_open(path, ZIP_RDONLY, &zerr);
    if (!old)
        return false;
    bool ok = zip_name_locate(old, CK_MLDEF_MANIFEST, 0) >= 0;
    zip_discard(old);
    return ok;
}

int ck_mldef_zip_open(const char *path, int level, const struct ck_sign_key *key,
                      struct ck_mldef_zip **out)
{
    *out = NULL;
    int err = ck_lazy_load(CK_LIB_ZIP);
    if (err < 0)
        return ck_error_wrap(err, "'%s'", path);
    if (level < -1 || level > 9)
        return ck_error(CK_EUSAGE, "'%s': compression level %d (0 to 9)", path, level);
    if (key && !key->has_priv)
        return ck_error(CK_ECONFIG, "'%s': signing needs a private key, not a public one", path);
    struct stat st;
    if (stat(path, &st) == 0 && (!S_ISREG(st.st_mode) || !is_mldef(path)))
        return ck_error(CK_EEXIST, "'%s' exists and is not an .mldef archive: not replacing it",
                        path);
    struct ck_mldef_zip *z = calloc(1, sizeof *z);
    if (!z || !(z->path = strdup(path)))
        goto nomem;
    z->level = level;
    z->key = key;
    ck_buf_init(&z->sig, 1 << 20);
    char dir[4096];
    ck_dirname(dir, sizeof dir, path);
    size_t n = strlen(dir) + strlen(ck_basename(path)) + 32;
    if (!(z->tmp = malloc(n)))
        goto nomem;
    snprintf(z->tmp, n, "%s/.%s.XXXXXX.tmp", dir, ck_basename(path));
    int fd = mkostemps(z->tmp, 4, O_CLOEXEC);
    if (fd < 0) {
        err = ck_error_os(CK_EIO, "cannot create a temporary file for '%s'", path);
        free(z->tmp);
        z->tmp = NULL;
        ck_mldef_zip_free(z);
        return err;
    }
    close(fd);
    int zerr = 0;
    if (!(z->zip = zip_open(z->tmp, ZIP_CREATE | ZIP_TRUNCATE, &zerr))) {
        zip_error_t e;
        zip_error_init_with_code(&e, zerr);
        err = ck_error(CK_EIO, "'%s': cannot start the archive: %s", path, zip_error_strerror(&e));
        zip_error_fini(&e);
        ck_mldef_zip_free(z);
        return err;
    }
    *out = z;
    return 0;
nomem:
    ck_mldef_zip_free(z);
    return ck_error(CK_ENOMEM, "out of memory");
}

static void entry_free(struct entry *e)
{
    if (!e)
        return;
    if (e->fd >= 0)
        close(e->fd);
    ck_hash_ctx_free(e->hash);
    free(e->name);
    free(e->src);
    free(e->data);
    free(e);
}

static int add_entry(struct ck_mldef_zip *z, struct entry *e)
{
    char why[160];
    const char *rule = e->is_signature ? NULL : ck_mldef_path_rule(e->name, why, sizeof why);
    int err = 0;
    if (rule) {
        err = ck_error(CK_EFORMAT, "'%s': entry '%s' breaks rule %s: %s", z->path, e->name, rule,
                       why);
        goto bad;
    }
    for (size_t i = 0; i < z->n; i++)
        if (strcmp(z->entries[i]->name, e->name) == 0) {
            err = ck_error(CK_EFORMAT, "'%s': entry '%s' twice (rule files.duplicate)", z->path,
                           e->name);
            goto bad;
        }
    if (z->n + 1 + (z->key && !e->is_signature) > CK_MLDEF_MAX_FILES) {
        err = ck_error(CK_EFORMAT, "'%s': more than %d files (rule files.count) at '%s'", z->path,
                       CK_MLDEF_MAX_FILES, e->name);
        goto bad;
    }
    struct entry **v = realloc(z->entries, (z->n + 1) * sizeof *v);
    if (!v) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto bad;
    }
    z->entries = v;
    e->z = z;
    zip_source_t *src = zip_source_function(z->zip, source_cb, e);
    if (!src) {
        err = ck_error(CK_ENOMEM, "'%s': %s", z->path, zip_strerror(z->zip));
        goto bad;
    }
    zip_int64_t idx = zip_file_add(z->zip, e->name, src, ZIP_FL_ENC_UTF_8);
    if (idx < 0) {
        err = ck_error(CK_EIO, "'%s': cannot add '%s': %s", z->path, e->name, zip_strerror(z->zip));
        zip_source_free(src);
        goto bad;
    }
    int level = z->level < 0 ? 0 : z->level;
    if (zip_set_file_compression(z->zip, (zip_uint64_t)idx, level ? ZIP_CM_DEFLATE : ZIP_CM_STORE,
                                 (zip_uint32_t)level) < 0) {
        err = ck_error(CK_EIO, "'%s': '%s': %s", z->path, e->name, zip_strerror(z->zip));
        goto bad;
    }
    z->entries[z->n++] = e;
    return 0;
bad:
    entry_free(e);
    return err;
}

static struct entry *entry_new(const char *name)
{
    struct entry *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->fd = -1;
    if (!(e->name = strdup(name))) {
        free(e);
        return NULL;
    }
    return e;
}

int ck_mldef_zip_add_buffer(struct ck_mldef_zip *z, const char *name, const void *data, size_t len)
{
    struct entry *e = entry_new(name);
    if (!e || !(e->data = malloc(len ? len : 1))) {
        entry_free(e);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    memcpy(e->data, data, len);
    e->len = len;
    e->s = (struct ck_mldef_stream){.size = len, .rewind = buf_rewind, .read = buf_read, .ctx = e};
    return add_entry(z, e);
}

int ck_mldef_zip_add_file(struct ck_mldef_zip *z, const char *name, const char *src)
{
    struct entry *e = entry_new(name);
    if (!e || !(e->src = strdup(src))) {
        entry_free(e);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    if (stat(src, &e->st) < 0 || !S_ISREG(e->st.st_mode)) {
        int err = ck_error_os(CK_ENOENT, "'%s': cannot add '%s'", z->path, src);
        entry_free(e);
        return err;
    }
    e->s = (struct ck_mldef_stream){
        .size = (uint64_t)e->st.st_size, .rewind = file_rewind, .read = file_read, .ctx = e};
    return add_entry(z, e);
}

int ck_mldef_zip_add_stream(struct ck_mldef_zip *z, const char *name,
                            const struct ck_mldef_stream *s)
{
    struct entry *e = entry_new(name);
    if (!e)
        return ck_error(CK_ENOMEM, "out of memory");
    e->s = *s;
    return add_entry(z, e);
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp((*(struct entry *const *)a)->name, (*(struct entry *const *)b)->name);
}

/* The SIGNATURE entry's stream builds its text when libzip opens it, from
 * the digests taken while the other entries were written. */
static int sig_rewind(void *ctx)
{
    struct entry *e = ctx;
    struct ck_mldef_zip *z = e->z;
    size_t n = z->n - 1;
    struct entry **v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    memcpy(v, z->entries, n * sizeof *v);
    qsort(v, n, sizeof *v, cmp_entry);
    ck_buf_reset(&z->sig);
    int err = ck_buf_printf(&z->sig, "mldef-signature 1\n");
    for (size_t i = 0; i < n && err >= 0; i++)
        err = ck_buf_printf(&z->sig, "sha256 %s %s\n", v[i]->sha256, v[i]->name);
    free(v);
    if (err < 0)
        return ck_error(CK_ENOMEM, "'%s': SIGNATURE too large", z->path);
    unsigned char sig[CK_SIGN_SIG_SIZE];
    ck_sign(z->key, z->sig.data, z->sig.len, sig);
    char pubhex[2 * CK_SIGN_KEY_SIZE + 1], sighex[2 * CK_SIGN_SIG_SIZE + 1];
    ck_hex(pubhex, z->key->pub, CK_SIGN_KEY_SIZE);
    ck_hex(sighex, sig, CK_SIGN_SIG_SIZE);
    if (ck_buf_printf(&z->sig, "ed25519 %s %s\n", pubhex, sighex) < 0)
        return ck_error(CK_ENOMEM, "'%s': SIGNATURE too large", z->path);
    e->data = NULL;
    e->pos = 0;
    return 0;
}

static int64_t sig_read(void *ctx, void *out, size_t len)
{
    struct entry *e = ctx;
    struct ck_buf *b = &e->z->sig;
    size_t n = b->len - e->pos < len ? b->len - e->pos : len;
    memcpy(out, b->data + e->pos, n);
    e->pos += n;
    return (int64_t)n;
}

static int add_signature(struct ck_mldef_zip *z)
{
    struct entry *e = entry_new(CK_MLDEF_SIGNATURE);
    if (!e)
        return ck_error(CK_ENOMEM, "out of memory");
    e->is_signature = true;
    /* The exact size: header, one fixed-width line per entry, the last line. */
    uint64_t size = strlen("mldef-signature 1\n") + strlen("ed25519  \n") + 2 * CK_SIGN_KEY_SIZE +
                    2 * CK_SIGN_SIG_SIZE;
    for (size_t i = 0; i < z->n; i++)
        size += strlen("sha256  \n") + 64 + strlen(z->entries[i]->name);
    e->s = (struct ck_mldef_stream){.size = size, .rewind = sig_rewind, .read = sig_read, .ctx = e};
    return add_entry(z, e);
}

int ck_mldef_zip_finish(struct ck_mldef_zip *z)
{
    int err;
    if (z->key && (err = add_signature(z)) < 0)
        return err;
    zip_t *zip = z->zip;
    z->zip = NULL;
    if (zip_close(zip) < 0) {
        if (z->err)
            err = ck_error(z->err, "%s", z->errmsg);
        else
            err =
                ck_error(CK_EIO, "'%s': cannot write the archive: %s", z->path, zip_strerror(zip));
        zip_discard(zip);
        return err;
    }
    if (z->err)
        return ck_error(z->err, "%s", z->errmsg);
    /* The temporary was made 0600; an archive is an ordinary file, so the
     * umask decides (read and restored at once: the agent sets no umask
     * from other threads). */
    mode_t um = umask(0);
    umask(um);
    int fd = open(z->tmp, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fchmod(fd, 0666 & ~um) < 0 || fsync(fd) < 0 || fstat(fd, &st) < 0) {
        err = ck_error_os(CK_EIO, "'%s': cannot fsync the archive", z->path);
        if (fd >= 0)
            close(fd);
        return err;
    }
    close(fd);
    z->size = (uint64_t)st.st_size;
    if (rename(z->tmp, z->path) < 0)
        return ck_error_os(CK_EIO, "cannot rename the archive to '%s'", z->path);
    z->finished = true;
    char dir[4096];
    ck_dirname(dir, sizeof dir, z->path);
    return ck_fsync_dir(dir);
}

uint64_t ck_mldef_zip_size(const struct ck_mldef_zip *z)
{
    return z->size;
}

void ck_mldef_zip_free(struct ck_mldef_zip *z)
{
    if (!z)
        return;
    if (z->zip)
        zip_discard(z->zip);
    if (z->tmp && !z->finished)
        unlink(z->tmp);
    for (size_t i = 0; i < z->n; i++)
        entry_free(z->entries[i]);
    free(z->entries);
    ck_buf_release(&z->sig);
    free(z->tmp);
    free(z->path);
    free(z);
}
