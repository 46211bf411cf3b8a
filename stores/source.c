#include "stores/source.h"
#include "common/error.h"
#include "common/fsutil.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void *hash_thread(void *arg)
{
    struct ck_source *src = arg;
    src->hash_err = ck_hash_file(src->path, CK_HASH_SHA256, &src->d, NULL);
    if (src->hash_err < 0)
        snprintf(src->hash_msg, sizeof src->hash_msg, "%s", ck_error_msg());
    return NULL;
}

bool ck_source_known_for(const struct ck_xfer *x, const struct stat *st)
{
    const struct stat *k = &x->known_st;
    return x->known_sha256[0] && k->st_dev == st->st_dev && k->st_ino == st->st_ino &&
           ck_stat_unchanged(k, st);
}

int ck_source_open(struct ck_source *src, const struct ck_xfer *x)
{
    memset(src, 0, sizeof *src);
    src->path = x->path;
    if ((src->fd = open(x->path, O_RDONLY | O_CLOEXEC)) < 0)
        return ck_error_os(CK_EIO, "cannot open '%s'", x->path);
    if (fstat(src->fd, &src->before) < 0 || (uint64_t)src->before.st_size != x->size)
        return ck_error(CK_ECHANGED, "'%s' changed since it was queued", x->path);
    posix_fadvise(src->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    src->known = ck_source_known_for(x, &src->before);
    /* without the thread the transfer still goes; only its SHA-256 is missing */
    if (!src->known && x->hash_unknown)
        src->hashing = pthread_create(&src->tid, NULL, hash_thread, src) == 0;
    return 0;
}

int ck_source_check_unchanged(const struct ck_source *src, const struct ck_xfer *x)
{
    struct stat after;
    if (fstat(src->fd, &after) < 0 || !ck_stat_unchanged(&src->before, &after))
        return ck_error(CK_ECHANGED, "'%s' changed while it was uploaded", x->path);
    return 0;
}

int ck_source_finish(struct ck_source *src, struct ck_xfer *x, int err)
{
    if (src->known && err == 0)
        memcpy(x->sha256, x->known_sha256, sizeof x->sha256);
    if (src->hashing) {
        pthread_join(src->tid, NULL);
        src->hashing = false;
        if (err == 0 && src->hash_err < 0)
            err = ck_error(src->hash_err, "%s", src->hash_msg);
        else if (err == 0)
            memcpy(x->sha256, src->d.sha256, sizeof x->sha256);
    }
    if (src->fd >= 0)
        close(src->fd);
    src->fd = -1;
    return err;
}
