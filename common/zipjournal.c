#include "common/zipjournal.h"

#include "common/buf.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define HDR 36

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

static uint64_t get(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int ck_zipjournal_path(const char *path, char *out, size_t outsz)
{
    int n = snprintf(out, outsz, "%s%s", path, CK_ZIPJOURNAL_SUFFIX);
    if (n < 0 || (size_t)n >= outsz)
        return ck_error(CK_ESIZE, "'%s': path too long", path);
    return 0;
}

int ck_zipjournal_write_to(const char *jp, const char *path, uint64_t old_len, uint64_t tail_off,
                           const void *tail, uint64_t tail_len)
{
    int err;
    if (tail_len > CK_ZIPJOURNAL_MAX)
        return ck_error(CK_ESIZE, "'%s': central directory of %" PRIu64 " bytes", path, tail_len);
    unsigned char *b = malloc(HDR + (size_t)tail_len);
    if (!b)
        return ck_error(CK_ENOMEM, "'%s': out of memory", path);
    memcpy(b, "CKZJ", 4);
    put32(b + 4, 1);
    put64(b + 8, old_len);
    put64(b + 16, tail_off);
    put64(b + 24, tail_len);
    put32(b + 32, ck_crc32c(tail, (size_t)tail_len));
    memcpy(b + HDR, tail, (size_t)tail_len);
    err = ck_write_file_atomic(jp, b, HDR + (size_t)tail_len, 0644);
    free(b);
    return err;
}

int ck_zipjournal_write(const char *path, uint64_t old_len, uint64_t tail_off, const void *tail,
                        uint64_t tail_len)
{
    char jp[4096];
    int err;
    if ((err = ck_zipjournal_path(path, jp, sizeof(jp))) < 0)
        return err;
    return ck_zipjournal_write_to(jp, path, old_len, tail_off, tail, tail_len);
}

int ck_zipjournal_remove(const char *path)
{
    char jp[4096], dir[4096];
    int err;
    if ((err = ck_zipjournal_path(path, jp, sizeof(jp))) < 0)
        return err;
    if (unlink(jp) < 0 && errno != ENOENT)
        return ck_error_os(CK_EIO, "cannot remove '%s'", jp);
    ck_dirname(dir, sizeof(dir), path);
    return ck_fsync_dir(dir);
}

int ck_zipjournal_recover(const char *path, int fd, bool *rolled_back)
{
    char jp[4096];
    struct ck_buf j = CK_BUF_INIT;
    int err;
    *rolled_back = false;
    if ((err = ck_zipjournal_path(path, jp, sizeof(jp))) < 0)
        return err;
    ck_buf_init(&j, (size_t)CK_ZIPJOURNAL_MAX + HDR);
    if ((err = ck_read_file(jp, (size_t)CK_ZIPJOURNAL_MAX + HDR, &j)) < 0) {
        ck_buf_release(&j);
        if (err == CK_ENOENT) {
            ck_error_clear();
            return 0;
        }
        return err;
    }
    const unsigned char *b = (const unsigned char *)j.data;
    uint64_t old_len = 0, off = 0, tl = 0;
    if (j.len < HDR || memcmp(b, "CKZJ", 4) || get(b + 4, 4) != 1) {
        err = ck_error(CK_EFORMAT, "'%s': not an append journal", jp);
        goto out;
    }
    old_len = get(b + 8, 8);
    off = get(b + 16, 8);
    tl = get(b + 24, 8);
    if (tl != j.len - HDR || off > old_len || old_len - off != tl ||
        ck_crc32c(b + HDR, (size_t)tl) != (uint32_t)get(b + 32, 4)) {
        err =
            ck_error(CK_EFORMAT, "'%s': append journal is inconsistent; '%s' left alone", jp, path);
        goto out;
    }
    if (ck_pwrite_all(fd, b + HDR, tl, off) < 0 || ftruncate(fd, (off_t)old_len) < 0 ||
        fsync(fd) < 0) {
        err = ck_error_os(CK_EIO, "'%s': cannot roll back the interrupted append", path);
        goto out;
    }
    *rolled_back = true;
    err = ck_zipjournal_remove(path);
out:
    ck_buf_release(&j);
    return err;
}

int ck_zipjournal_recover_path(const char *path)
{
    char jp[4096];
    struct stat st;
    bool rb;
    int err;
    if ((err = ck_zipjournal_path(path, jp, sizeof(jp))) < 0)
        return err;
    if (stat(jp, &st) < 0)
        return 0;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(CK_EIO, "'%s': an append was interrupted and cannot be rolled back",
                           path);
    while (flock(fd, LOCK_EX) < 0 && errno == EINTR)
        ;
    err = ck_zipjournal_recover(path, fd, &rb);
    close(fd);
    return err;
}
