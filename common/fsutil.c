#include "common/fsutil.h"
#include "common/error.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

int ck_path_join(char *out, size_t outsz, const char *a, const char *b)
{
    int n;
    if (!a || !*a)
        n = snprintf(out, outsz, "%s", b);
    else if (a[strlen(a) - 1] == '/')
        n = snprintf(out, outsz, "%s%s", a, b);
    else
        n = snprintf(out, outsz, "%s/%s", a, b);
    if (n < 0 || (size_t)n >= outsz)
        return ck_error(CK_ESIZE, "path too long: '%s/%s'", a, b);
    return 0;
}

void ck_dirname(char *out, size_t outsz, const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(out, outsz, ".");
    } else if (slash == path) {
        snprintf(out, outsz, "/");
    } else {
        snprintf(out, outsz, "%.*s", (int)(slash - path), path);
    }
}

bool ck_path_split_part(const char *spec, char *file, size_t filesz, const char **part)
{
    const char *hash = strrchr(spec, '#');
    struct stat st;
    *part = NULL;
    if (!hash || stat(spec, &st) == 0 || (size_t)(hash - spec) >= filesz || !hash[1]) {
        snprintf(file, filesz, "%s", spec);
        return false;
    }
    snprintf(file, filesz, "%.*s", (int)(hash - spec), spec);
    *part = hash + 1;
    return true;
}

const char *ck_basename(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

bool ck_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool ck_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

int ck_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(CK_EIO, "cannot open folder '%s'", dir);
    int rc = fsync(fd);
    close(fd);
    if (rc < 0 && errno != EINVAL)
        return ck_error_os(CK_EIO, "cannot fsync folder '%s'", dir);
    return 0;
}

int ck_mkdirs(const char *path, mode_t mode)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return ck_error(CK_ESIZE, "path too long: '%s'", path);
    /* the parent is there (the common case): one call, not one per component */
    if (mkdir(tmp, mode) == 0)
        return 0;
    if (errno != ENOENT)
        goto last;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, mode) < 0 && errno != EEXIST)
            return ck_error_os(CK_EIO, "cannot create folder '%s'", tmp);
        *p = '/';
    }
last:
    if (mkdir(tmp, mode) < 0 && errno != EEXIST)
        return ck_error_os(CK_EIO, "cannot create folder '%s'", tmp);
    if (!ck_is_dir(tmp))
        return ck_error(CK_EEXIST, "'%s' exists and is not a folder", tmp);
    return 0;
}

int ck_atomic_open(struct ck_atomic_file *f, const char *path, mode_t mode)
{
    char dir[4096];
    f->fd = -1;
    f->tmp = NULL;
    f->path = strdup(path);
    if (!f->path)
        return ck_error(CK_ENOMEM, "out of memory");
    ck_dirname(dir, sizeof dir, path);
    size_t n = strlen(dir) + strlen(ck_basename(path)) + 32;
    f->tmp = malloc(n);
    if (!f->tmp) {
        ck_atomic_abort(f);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    /* A dot name so that directory scans skip it, a .tmp suffix so that
     * anything watching the folder knows it is not finished, and "ckptd-" so
     * that a later start can tell its own leftovers from the trainer's files
     * (ck_is_own_temporary). */
    snprintf(f->tmp, n, "%s/.%s.ckptd-XXXXXX.tmp", dir, ck_basename(path));
    f->fd = mkostemps(f->tmp, 4, O_CLOEXEC);
    if (f->fd < 0) {
        int err = ck_error_os(CK_EIO, "cannot create a temporary file for '%s'", path);
        free(f->tmp);
        f->tmp = NULL;
        ck_atomic_abort(f);
        return err;
    }
    if (fchmod(f->fd, mode) < 0) {
        int err = ck_error_os(CK_EIO, "cannot set the mode of '%s'", f->tmp);
        ck_atomic_abort(f);
        return err;
    }
    return 0;
}

int ck_write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EIO;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

ssize_t ck_read_small_at(int dirfd, const char *name, bool nofollow, char *buf, size_t bufsz)
{
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0));
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, bufsz - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return n;
}

int ck_atomic_write(struct ck_atomic_file *f, const void *data, size_t len)
{
    if (ck_write_all(f->fd, data, len) < 0)
        return ck_error_os(CK_EIO, "cannot write '%s'", f->path);
    return 0;
}

/* Closes, renames into place and, when sync, fsyncs the bytes first and the
 * folder after: the one way both commits finish a file. */
static int atomic_finish(struct ck_atomic_file *f, bool sync)
{
    char dir[4096];
    int err = 0;
    if (sync && fsync(f->fd) < 0) {
        err = ck_error_os(CK_EIO, "cannot fsync '%s'", f->path);
        goto out;
    }
    if (close(f->fd) < 0) {
        f->fd = -1;
        err = ck_error_os(CK_EIO, "cannot close '%s'", f->path);
        goto out;
    }
    f->fd = -1;
    if (rename(f->tmp, f->path) < 0) {
        err = ck_error_os(CK_EIO, "cannot rename '%s' to '%s'", f->tmp, f->path);
        goto out;
    }
    free(f->tmp);
    f->tmp = NULL;
    if (sync) {
        ck_dirname(dir, sizeof dir, f->path);
        err = ck_fsync_dir(dir);
    }
out:
    ck_atomic_abort(f);
    return err;
}

int ck_atomic_commit(struct ck_atomic_file *f)
{
    return atomic_finish(f, true);
}

int ck_atomic_commit_nosync(struct ck_atomic_file *f)
{
    return atomic_finish(f, false);
}

void ck_atomic_abort(struct ck_atomic_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
    if (f->tmp)
        unlink(f->tmp);
    free(f->tmp);
    free(f->path);
    f->tmp = f->path = NULL;
}

int ck_write_file_atomic(const char *path, const void *data, size_t len, mode_t mode)
{
    return ck_write_file_atomic_stat(path, data, len, mode, NULL);
}

int ck_write_file_atomic_stat(const char *path, const void *data, size_t len, mode_t mode,
                              struct stat *st)
{
    struct ck_atomic_file f;
    int err = ck_atomic_open(&f, path, mode);
    if (err < 0)
        return err;
    if ((err = ck_atomic_write(&f, data, len)) < 0 || (st && fstat(f.fd, st) < 0)) {
        if (err == 0)
            err = ck_error_os(CK_EIO, "cannot stat '%s'", f.tmp);
        ck_atomic_abort(&f);
        return err;
    }
    return ck_atomic_commit(&f);
}

int ck_read_file(const char *path, size_t max, struct ck_buf *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(errno == ENOENT ? CK_ENOENT : CK_EIO, "cannot open '%s'", path);
    int err = 0;
    char chunk[65536];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            err = ck_error_os(CK_EIO, "cannot read '%s'", path);
            break;
        }
        if (n == 0)
            break;
        if (out->len + (size_t)n > max) {
            err = ck_error(CK_ESIZE, "'%s' is larger than %zu bytes", path, max);
            break;
        }
        if ((err = ck_buf_append(out, chunk, (size_t)n)) < 0)
            break;
    }
    close(fd);
    return err;
}

/* copy_file_range where the kernel does it (same filesystem, or any since
 * Linux 5.19), read/write where it refuses (EXDEV on older kernels). */
static int copy_data(int in, int out, off_t size, const char *src, const char *dst)
{
    off_t left = size;
    bool plain = false;
    char block[1 << 16];
    while (left > 0) {
        ssize_t n;
        if (!plain) {
            n = copy_file_range(in, NULL, out, NULL, (size_t)left, 0);
            if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
                          errno == EOPNOTSUPP) && left == size) {
                plain = true;
                continue;
            }
        } else {
            n = read(in, block, sizeof block);
            if (n > 0 && write(out, block, (size_t)n) != n)
                return ck_error_os(CK_EIO, "cannot write '%s'", dst);
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ck_error_os(CK_EIO, "cannot copy '%s' to '%s'", src, dst);
        if (n == 0)
            return ck_error(CK_ECHANGED, "'%s' shrank while it was copied", src);
        left -= n;
    }
    return 0;
}

static int copy_to(const char *src, const char *dst)
{
    struct ck_atomic_file f;
    struct stat st;
    int err;
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return ck_error_os(CK_EIO, "cannot open '%s'", src);
    if (fstat(in, &st) < 0) {
        err = ck_error_os(CK_EIO, "cannot stat '%s'", src);
        close(in);
        return err;
    }
    if ((err = ck_atomic_open(&f, dst, st.st_mode & 0777)) < 0) {
        close(in);
        return err;
    }
    /* A reflink shares the blocks (btrfs, xfs): no data is copied. */
    if (ioctl(f.fd, FICLONE, in) < 0 && (err = copy_data(in, f.fd, st.st_size, src, dst)) < 0) {
        ck_atomic_abort(&f);
        close(in);
        return err;
    }
    close(in);
    return ck_atomic_commit(&f);
}

static int place_file(const char *src, const char *dst, bool sync)
{
    /* The link first: the stats that explain a failure are paid only on
     * one (a first registration of 100,000 files made 200,000 of them) */
    if (link(src, dst) == 0) {
        char dir[4096];
        ck_dirname(dir, sizeof dir, dst);
        return sync ? ck_fsync_dir(dir) : 0;
    }
    int e = errno;
    struct stat a, b;
    if (stat(src, &a) < 0)
        return ck_error_os(errno == ENOENT ? CK_ECHANGED : CK_EIO, "cannot stat '%s'", src);
    if (e == EEXIST && lstat(dst, &b) == 0) {
        if (a.st_dev == b.st_dev && a.st_ino == b.st_ino)
            return 0;
        return ck_error(CK_EEXIST, "'%s' already exists and is not '%s'", dst, src);
    }
    errno = e;
    if (errno != EXDEV && errno != EPERM && errno != EMLINK && errno != EOPNOTSUPP)
        return ck_error_os(CK_EIO, "cannot link '%s' to '%s'", src, dst);
    int err = copy_to(src, dst);
    return err < 0 ? err : 1;
}

int ck_place_file(const char *src, const char *dst)
{
    int err = place_file(src, dst, true);
    return err < 0 ? err : 0;
}

int ck_place_file_nosync(const char *src, const char *dst)
{
    return place_file(src, dst, false);
}

static bool six_random(const char *p)
{
    for (int i = 0; i < 6; i++)
        if (!isalnum((unsigned char)p[i]))
            return false;
    return true;
}

bool ck_is_own_temporary(const char *name)
{
    size_t n = strlen(name);
    /* ".NAME.ckptd-XXXXXX.tmp": at least one character of NAME */
    const size_t tail = strlen(".ckptd-XXXXXX.tmp");
    if (n > tail + 1 && name[0] == '.' && strcmp(name + n - 4, ".tmp") == 0 &&
        strncmp(name + n - tail, ".ckptd-", 7) == 0 && six_random(name + n - 10))
        return true;
    /* before 0.2, without the marker: only the names ckptd alone writes */
    static const char *const owned[] = {".metadata.yaml.", ".build_parameters.yaml."};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) {
        size_t k = strlen(owned[i]);
        if (n == k + 10 && strncmp(name, owned[i], k) == 0 && six_random(name + k) &&
            strcmp(name + k + 6, ".tmp") == 0)
            return true;
    }
    return false;
}

int ck_sweep_temporaries(const char *dir, size_t *removed)
{
    return ck_sweep_temporaries_of(dir, NULL, removed);
}

int ck_sweep_temporaries_of(const char *dir, const char *prefix, size_t *removed)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT || errno == ENOTDIR ? 0
                                                   : ck_error_os(CK_EIO, "cannot list '%s'", dir);
    struct dirent *e;
    int err = 0;
    while ((e = readdir(d)) != NULL) {
        if (!ck_is_own_temporary(e->d_name) ||
            (prefix && strncmp(e->d_name, prefix, strlen(prefix)) != 0))
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            (*removed)++;
        else if (errno != ENOENT && err == 0)
            err = ck_error_os(CK_EIO, "cannot remove '%s/%s'", dir, e->d_name);
    }
    closedir(d);
    return err;
}

int ck_pread_all(int fd, void *buf, uint64_t len, uint64_t off)
{
    unsigned char *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len > (1u << 30) ? (1u << 30) : (size_t)len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (uint64_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

int ck_pwrite_all(int fd, const void *buf, uint64_t len, uint64_t off)
{
    const unsigned char *p = buf;
    while (len) {
        ssize_t n = pwrite(fd, p, len > (1u << 30) ? (1u << 30) : (size_t)len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (uint64_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

int64_t ck_mtime_ns(const struct stat *st)
{
    return (int64_t)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
}

struct ck_file_id ck_file_id_of(const struct stat *st)
{
    return (struct ck_file_id){(uint64_t)st->st_dev, (uint64_t)st->st_ino, (uint64_t)st->st_size,
                               ck_mtime_ns(st)};
}

bool ck_file_id_equal(const struct ck_file_id *a, const struct ck_file_id *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns;
}

bool ck_stat_unchanged(const struct stat *before, const struct stat *after)
{
    return before->st_size == after->st_size && ck_mtime_ns(before) == ck_mtime_ns(after);
}
