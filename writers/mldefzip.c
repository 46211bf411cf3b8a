#include "writers/mldefzip.h"

#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "lazy/lazy.h"
#include "model/mldef.h"
#include "writers/zipapp.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

/* What a stream that copies gets to fill at a time. */
#define SCRATCH (4u << 20)

/* An entry written: its name and, when signing, its digest. */
struct entry {
    char *name;
    char sha256[65];
};

struct ck_mldef_zip {
    char *path;
    struct ck_zipapp za;
    bool open; /* za holds the temporary: not yet committed nor aborted */
    int level;
    const struct ck_sign_key *key;
    struct entry *entries;
    size_t n;
    unsigned char *scratch;
    bool failed; /* an add failed part way: the archive is not finished */
    uint64_t size;
};

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
    int err;
    if (level < -1 || level > 9)
        return ck_error(CK_EUSAGE, "'%s': compression level %d (0 to 9)", path, level);
    if (key && !key->has_priv)
        return ck_error(CK_ECONFIG, "'%s': signing needs a private key, not a public one", path);
    struct stat st;
    if (stat(path, &st) == 0) {
        /* libzip reads the old archive: the check is its business, not ours */
        if ((err = ck_lazy_load(CK_LIB_ZIP)) < 0)
            return ck_error_wrap(err, "'%s'", path);
        if (!S_ISREG(st.st_mode) || !is_mldef(path))
            return ck_error(CK_EEXIST, "'%s' exists and is not an .mldef archive: not replacing it",
                            path);
    }
    struct ck_mldef_zip *z = calloc(1, sizeof *z);
    if (!z || !(z->path = strdup(path)) || !(z->scratch = malloc(SCRATCH))) {
        ck_mldef_zip_free(z);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    z->level = level < 0 ? 0 : level;
    z->key = key;
    /* an archive is an ordinary file: the umask decides (read and restored
     * at once: the agent sets no umask from other threads) */
    mode_t um = umask(0);
    umask(um);
    if ((err = ck_zipapp_create(&z->za, path, 0666 & ~um)) < 0) {
        ck_mldef_zip_free(z);
        return err;
    }
    z->open = true;
    /* the same model gives the same bytes */
    z->za.dos_time = CK_ZIPAPP_DOS_1980;
    /* stored data files start on a page: a loader can map them in place
     * (and the copy into the archive runs page to page) */
    z->za.align = 4096;
    *out = z;
    return 0;
}

/* The rules an entry's name must meet before anything of it is written. */
static int check_entry(struct ck_mldef_zip *z, const char *name, bool is_signature)
{
    char why[160];
    const char *rule = is_signature ? NULL : ck_mldef_path_rule(name, why, sizeof why);
    if (z->failed || !z->open)
        return ck_error(CK_EUSAGE, "'%s': the archive was abandoned after an error", z->path);
    if (rule)
        return ck_error(CK_EFORMAT, "'%s': entry '%s' breaks rule %s: %s", z->path, name, rule,
                        why);
    for (size_t i = 0; i < z->n; i++)
        if (strcmp(z->entries[i].name, name) == 0)
            return ck_error(CK_EFORMAT, "'%s': entry '%s' twice (rule files.duplicate)", z->path,
                            name);
    if (z->n + 1 + (z->key && !is_signature) > CK_MLDEF_MAX_FILES)
        return ck_error(CK_EFORMAT, "'%s': more than %d files (rule files.count) at '%s'", z->path,
                        CK_MLDEF_MAX_FILES, name);
    return 0;
}

/* Writes one entry from s: its bytes straight to the zip writer, and
 * through SHA-256 when signing. */
static int write_entry(struct ck_mldef_zip *z, const char *name, const struct ck_mldef_stream *s,
                       bool is_signature)
{
    int err = check_entry(z, name, is_signature);
    if (err < 0)
        return err;
    struct entry *v = realloc(z->entries, (z->n + 1) * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    z->entries = v;
    struct entry *e = &v[z->n];
    memset(e, 0, sizeof *e);
    struct ck_hash_ctx *h = NULL;
    z->failed = true; /* until the entry is whole */
    if (!(e->name = strdup(name)) ||
        (z->key && !is_signature && !(h = ck_hash_ctx_new(CK_HASH_SHA256)))) {
        free(e->name);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    if ((err = ck_zipapp_begin(&z->za, name, s->size, z->level)) < 0)
        goto out;
    uint64_t done = 0;
    for (;;) {
        const void *p = NULL;
        int64_t n = s->next(s->ctx, z->scratch, SCRATCH, &p);
        if (n < 0) {
            err = ck_error_wrap((int)n, "'%s': entry '%s'", z->path, name);
            goto out;
        }
        if (n == 0)
            break;
        if ((uint64_t)n > s->size - done) {
            err = ck_error(CK_ECHANGED, "'%s': entry '%s': more than its %llu bytes", z->path,
                           name, (unsigned long long)s->size);
            goto out;
        }
        if (h)
            ck_hash_ctx_update(h, p, (size_t)n);
        if ((err = ck_zipapp_write(&z->za, p, (size_t)n)) < 0)
            goto out;
        done += (uint64_t)n;
    }
    if (done != s->size) {
        err = ck_error(CK_ECHANGED, "'%s': entry '%s': %llu bytes instead of %llu", z->path, name,
                       (unsigned long long)done, (unsigned long long)s->size);
        goto out;
    }
    if ((err = ck_zipapp_end(&z->za)) < 0)
        goto out;
    if (h) {
        struct ck_digests d;
        ck_hash_ctx_final(h, &d);
        memcpy(e->sha256, d.sha256, sizeof e->sha256);
    }
    z->n++;
    z->failed = false;
out:
    ck_hash_ctx_free(h);
    if (err < 0)
        free(e->name);
    return err;
}

/* ---- the stream kinds ---- */

struct buf_stream {
    const unsigned char *p;
    size_t len, pos;
};

static int64_t buf_next(void *ctx, void *buf, size_t len, const void **out)
{
    (void)buf;
    struct buf_stream *b = ctx;
    size_t n = b->len - b->pos < len ? b->len - b->pos : len;
    *out = b->p + b->pos;
    b->pos += n;
    return (int64_t)n;
}

int ck_mldef_zip_add_buffer(struct ck_mldef_zip *z, const char *name, const void *data, size_t len)
{
    struct buf_stream b = {.p = data, .len = len};
    struct ck_mldef_stream s = {.size = len, .next = buf_next, .ctx = &b};
    return write_entry(z, name, &s, false);
}

struct file_stream {
    const char *src;
    int fd;
};

static int64_t file_next(void *ctx, void *buf, size_t len, const void **out)
{
    struct file_stream *f = ctx;
    for (;;) {
        ssize_t n = read(f->fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ck_error_os(CK_EIO, "cannot read '%s'", f->src);
        /* Tell the kernel we are done with what we read: one pass over a big
         * file should not push everything else out of the page cache. */
        if (n > 0)
            posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
        *out = buf;
        return n;
    }
}

int ck_mldef_zip_add_file(struct ck_mldef_zip *z, const char *name, const char *src)
{
    struct file_stream f = {.src = src, .fd = open(src, O_RDONLY | O_CLOEXEC)};
    struct stat before, after;
    int err;
    if (f.fd < 0 || fstat(f.fd, &before) < 0 || !S_ISREG(before.st_mode)) {
        err = ck_error_os(CK_ENOENT, "'%s': cannot add '%s'", z->path, src);
        goto out;
    }
    struct ck_mldef_stream s = {.size = (uint64_t)before.st_size, .next = file_next, .ctx = &f};
    if ((err = write_entry(z, name, &s, false)) < 0)
        goto out;
    if (fstat(f.fd, &after) < 0 || !ck_stat_unchanged(&before, &after)) {
        z->failed = true;
        err = ck_error(CK_ECHANGED, "'%s': '%s' changed while it was packed", z->path, src);
    }
out:
    if (f.fd >= 0)
        close(f.fd);
    return err;
}

int ck_mldef_zip_add_stream(struct ck_mldef_zip *z, const char *name,
                            const struct ck_mldef_stream *s)
{
    return write_entry(z, name, s, false);
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

/* SIGNATURE: one line per entry (sorted by name) with its SHA-256, then the
 * Ed25519 signature over those lines (docs/mldef.md section 7). */
static int add_signature(struct ck_mldef_zip *z)
{
    struct ck_buf sig = CK_BUF_INIT;
    struct entry *v = malloc((z->n ? z->n : 1) * sizeof *v);
    int err = 0;
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    memcpy(v, z->entries, z->n * sizeof *v);
    qsort(v, z->n, sizeof *v, cmp_entry);
    ck_buf_init(&sig, 1 << 20);
    err = ck_buf_printf(&sig, "mldef-signature 1\n");
    for (size_t i = 0; i < z->n && err >= 0; i++)
        err = ck_buf_printf(&sig, "sha256 %s %s\n", v[i].sha256, v[i].name);
    free(v);
    if (err < 0) {
        ck_buf_release(&sig);
        return ck_error(CK_ENOMEM, "'%s': SIGNATURE too large", z->path);
    }
    unsigned char s[CK_SIGN_SIG_SIZE];
    ck_sign(z->key, sig.data, sig.len, s);
    char pubhex[2 * CK_SIGN_KEY_SIZE + 1], sighex[2 * CK_SIGN_SIG_SIZE + 1];
    ck_hex(pubhex, z->key->pub, CK_SIGN_KEY_SIZE);
    ck_hex(sighex, s, CK_SIGN_SIG_SIZE);
    if (ck_buf_printf(&sig, "ed25519 %s %s\n", pubhex, sighex) < 0)
        err = ck_error(CK_ENOMEM, "'%s': SIGNATURE too large", z->path);
    else {
        struct buf_stream b = {.p = (const unsigned char *)sig.data, .len = sig.len};
        struct ck_mldef_stream st = {.size = sig.len, .next = buf_next, .ctx = &b};
        err = write_entry(z, CK_MLDEF_SIGNATURE, &st, true);
    }
    ck_buf_release(&sig);
    return err;
}

int ck_mldef_zip_finish(struct ck_mldef_zip *z)
{
    int err;
    if (z->failed || !z->open)
        return ck_error(CK_EUSAGE, "'%s': the archive was abandoned after an error", z->path);
    if (z->key && (err = add_signature(z)) < 0)
        return err;
    z->open = false;
    /* writes the central directory, fsyncs, renames, fsyncs the folder */
    if ((err = ck_zipapp_commit(&z->za)) < 0)
        return err;
    struct stat st;
    if (stat(z->path, &st) < 0)
        return ck_error_os(CK_EIO, "cannot stat '%s'", z->path);
    z->size = (uint64_t)st.st_size;
    return 0;
}

void ck_mldef_zip_set_check(struct ck_mldef_zip *z, int (*check)(const char *tmp, void *arg),
                            void *arg)
{
    z->za.precommit = check;
    z->za.precommit_arg = arg;
}

uint64_t ck_mldef_zip_size(const struct ck_mldef_zip *z)
{
    return z->size;
}

void ck_mldef_zip_free(struct ck_mldef_zip *z)
{
    if (!z)
        return;
    if (z->open)
        ck_zipapp_abort(&z->za); /* removes the temporary */
    for (size_t i = 0; i < z->n; i++)
        free(z->entries[i].name);
    free(z->entries);
    free(z->scratch);
    free(z->path);
    free(z);
}
