#include "stores/bundle.h"
#include "common/error.h"
#include "common/strlist.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "lazy/lazy.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#define IO_BLOCK (1u << 20)
#define MAX_ENTRIES 1000000

static int list_add(struct ck_strlist *l, const char *s)
{
    if (l->n >= MAX_ENTRIES)
        return ck_error(CK_ESIZE, "more than %d entries to pack", MAX_ENTRIES);
    return ck_strlist_add(l, s);
}

static bool skipped(const char *name)
{
    size_t n = strlen(name);
    return !strcmp(name, ".ckptd") || (n > 5 && !strcmp(name + n - 5, ".part")) ||
           (n > 4 && !strcmp(name + n - 4, ".tmp")) || strstr(name, ".ckptd-tmp") != NULL;
}

/* Relative paths of folders and files under root/rel, recursively. */
static int walk(const char *root, const char *rel, struct ck_strlist *out, int depth)
{
    char path[8192];
    int err = 0;
    if (depth > 64)
        return ck_error(CK_ESIZE, "'%s': folders nested too deep", root);
    if (snprintf(path, sizeof path, "%s%s%s", root, *rel ? "/" : "", rel) >= (int)sizeof path)
        return ck_error(CK_ESIZE, "'%s/%s': path too long", root, rel);
    DIR *d = opendir(path);
    if (!d)
        return ck_error_os(CK_EIO, "cannot list '%s'", path);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || skipped(e->d_name))
            continue;
        char sub[4096], full[8192];
        if (snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", e->d_name) >=
            (int)sizeof sub) {
            err = ck_error(CK_ESIZE, "'%s/%s': path too long", path, e->d_name);
            break;
        }
        snprintf(full, sizeof full, "%s/%s", root, sub);
        struct stat st;
        if (lstat(full, &st) < 0)
            continue; /* vanished meanwhile */
        if (S_ISDIR(st.st_mode)) {
            if ((err = list_add(out, sub)) < 0 || (err = walk(root, sub, out, depth + 1)) < 0)
                break;
        } else if (S_ISREG(st.st_mode)) {
            if ((err = list_add(out, sub)) < 0)
                break;
        }
    }
    closedir(d);
    return err;
}

static int cmp_entry(const void *a, const void *b)
{
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    bool mx = !strcmp(x, "metadata.yaml"), my = !strcmp(y, "metadata.yaml");
    if (mx != my)
        return mx ? 1 : -1;
    return strcmp(x, y);
}

static int ar_fail(struct archive *a, const char *out)
{
    return ck_error(CK_EIO, "cannot write '%s': %s", out, archive_error_string(a));
}

static int add_entry(struct archive *a, const char *root, const char *rel, const char *out,
                     char *buf)
{
    char full[8192];
    struct stat st;
    int err = 0, fd = -1;
    snprintf(full, sizeof full, "%s/%s", root, rel);
    if ((fd = open(full, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) < 0)
        return ck_error_os(CK_EIO, "cannot open '%s'", full);
    if (fstat(fd, &st) < 0) {
        close(fd);
        return ck_error_os(CK_EIO, "cannot stat '%s'", full);
    }
    struct archive_entry *e = archive_entry_new();
    archive_entry_set_pathname(e, rel);
    archive_entry_set_mode(e, S_ISDIR(st.st_mode) ? (AE_IFDIR | 0755) : (AE_IFREG | 0644));
    archive_entry_set_size(e, S_ISDIR(st.st_mode) ? 0 : st.st_size);
    archive_entry_set_mtime(e, st.st_mtim.tv_sec, 0);
    if (archive_write_header(a, e) != ARCHIVE_OK) {
        err = ar_fail(a, out);
        goto done;
    }
    if (S_ISREG(st.st_mode)) {
        int64_t left = st.st_size;
        while (left > 0) {
            ssize_t n = read(fd, buf, IO_BLOCK);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                err = n < 0
                          ? ck_error_os(CK_EIO, "cannot read '%s'", full)
                          : ck_error(CK_ECHANGED, "'%s' became shorter while it was packed", full);
                goto done;
            }
            if (n > left) {
                err = ck_error(CK_ECHANGED, "'%s' grew while it was packed", full);
                goto done;
            }
            if (archive_write_data(a, buf, (size_t)n) != n) {
                err = ar_fail(a, out);
                goto done;
            }
            left -= n;
        }
    }
done:
    archive_entry_free(e);
    close(fd);
    return err;
}

static int write_list(const char *root, struct ck_strlist *l, const char *out, int level, int threads,
                      int *nfiles);

int ck_bundle_write(const char *root, const char *out, int level, int threads, int *nfiles)
{
    struct ck_strlist l = {0};
    int err = walk(root, "", &l, 0);
    if (err == 0)
        err = write_list(root, &l, out, level, threads, nfiles);
    ck_strlist_release(&l);
    return err;
}

int ck_bundle_write_files(const char *root, const char *const *only, size_t nonly, const char *out,
                          int level, int threads, int *nfiles)
{
    struct ck_strlist l = {0};
    int err = 0;
    for (size_t i = 0; i < nonly && err == 0; i++)
        err = list_add(&l, only[i]);
    if (err == 0)
        err = write_list(root, &l, out, level, threads, nfiles);
    ck_strlist_release(&l);
    return err;
}

static int write_list(const char *root, struct ck_strlist *lp, const char *out, int level, int threads,
                      int *nfiles)
{
    struct ck_strlist l = *lp;
    struct ck_atomic_file f = {.fd = -1};
    struct archive *a = NULL;
    char *buf = NULL, opt[32];
    int err = 0;
    *nfiles = 0;
    qsort(l.items, l.n, sizeof *l.items, cmp_entry);
    if ((err = ck_lazy_load(CK_LIB_ARCHIVE)) < 0)
        goto out;
    if ((err = ck_atomic_open(&f, out, 0644)) < 0)
        goto out;
    if (!(buf = malloc(IO_BLOCK)) || !(a = archive_write_new())) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    archive_write_set_format_pax_restricted(a);
    archive_write_add_filter_zstd(a);
    snprintf(opt, sizeof opt, "%d", level);
    archive_write_set_filter_option(a, "zstd", "compression-level", opt);
    snprintf(opt, sizeof opt, "%d", threads > 0 ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
    /* "threads" needs a libzstd built with threads; without, one thread is fine */
    archive_write_set_filter_option(a, "zstd", "threads", opt);
    archive_write_set_bytes_in_last_block(a, 1);
    if (archive_write_open_fd(a, f.fd) != ARCHIVE_OK) {
        err = ar_fail(a, out);
        goto out;
    }
    for (size_t i = 0; i < l.n; i++) {
        if ((err = add_entry(a, root, l.items[i], out, buf)) < 0)
            goto out;
        char full[8192];
        snprintf(full, sizeof full, "%s/%s", root, l.items[i]);
        if (!ck_is_dir(full))
            (*nfiles)++;
    }
    if (archive_write_close(a) != ARCHIVE_OK) {
        err = ar_fail(a, out);
        goto out;
    }
    archive_write_free(a);
    a = NULL;
    err = ck_atomic_commit(&f);
out:
    if (a)
        archive_write_free(a);
    if (err < 0)
        ck_atomic_abort(&f);
    free(buf);
    return err;
}

int ck_zstd_file(const char *src, const char *out, int level, int threads, char *orig_sha256,
                 uint64_t *out_size)
{
    struct ck_atomic_file f = {.fd = -1};
    struct ck_hash_ctx *hc = ck_hash_ctx_new(CK_HASH_SHA256);
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    size_t ocap = ZSTD_CStreamOutSize();
    char *ibuf = malloc(IO_BLOCK), *obuf = malloc(ocap);
    struct stat st;
    int err = 0, fd = -1;
    *out_size = 0;
    if (!hc || !cc || !ibuf || !obuf) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    if ((fd = open(src, O_RDONLY | O_CLOEXEC)) < 0 || fstat(fd, &st) < 0) {
        err = ck_error_os(CK_EIO, "cannot open '%s'", src);
        goto out;
    }
    ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_nbWorkers,
                           threads > 0 ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
    ZSTD_CCtx_setPledgedSrcSize(cc, (unsigned long long)st.st_size);
    if ((err = ck_atomic_open(&f, out, 0600)) < 0)
        goto out;
    uint64_t total = 0;
    for (;;) {
        ssize_t n = read(fd, ibuf, IO_BLOCK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            err = ck_error_os(CK_EIO, "cannot read '%s'", src);
            goto out;
        }
        total += (uint64_t)n;
        if (total > (uint64_t)st.st_size) {
            err = ck_error(CK_ECHANGED, "'%s' grew while it was compressed", src);
            goto out;
        }
        ck_hash_ctx_update(hc, ibuf, (size_t)n);
        ZSTD_EndDirective mode = n == 0 ? ZSTD_e_end : ZSTD_e_continue;
        ZSTD_inBuffer in = {ibuf, (size_t)n, 0};
        bool finished = false;
        do {
            ZSTD_outBuffer ob = {obuf, ocap, 0};
            size_t rem = ZSTD_compressStream2(cc, &ob, &in, mode);
            if (ZSTD_isError(rem)) {
                err = ck_error(CK_ERR, "cannot compress '%s': %s", src, ZSTD_getErrorName(rem));
                goto out;
            }
            if ((err = ck_atomic_write(&f, obuf, ob.pos)) < 0)
                goto out;
            *out_size += ob.pos;
            finished = mode == ZSTD_e_end ? rem == 0 : in.pos == in.size;
        } while (!finished);
        if (n == 0)
            break;
    }
    if (total != (uint64_t)st.st_size) {
        err = ck_error(CK_ECHANGED, "'%s' changed while it was compressed", src);
        goto out;
    }
    struct ck_digests d;
    ck_hash_ctx_final(hc, &d);
    memcpy(orig_sha256, d.sha256, 65);
    err = ck_atomic_commit(&f);
out:
    if (err < 0)
        ck_atomic_abort(&f);
    if (fd >= 0)
        close(fd);
    ZSTD_freeCCtx(cc);
    ck_hash_ctx_free(hc);
    free(ibuf);
    free(obuf);
    return err;
}
