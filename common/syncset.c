#include "common/syncset.h"
#include "common/error.h"
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int push(char ***v, size_t *n, const char *s)
{
    char **p = realloc(*v, (*n + 1) * sizeof *p);
    if (!p)
        return ck_error(CK_ENOMEM, "out of memory");
    *v = p;
    if (!(p[*n] = strdup(s)))
        return ck_error(CK_ENOMEM, "out of memory");
    (*n)++;
    return 0;
}

int ck_syncset_add_file(struct ck_syncset *s, const char *path)
{
    return push(&s->files, &s->nfiles, path);
}

int ck_syncset_add_dir(struct ck_syncset *s, const char *dir, bool *had)
{
    bool was = ck_strset_get(&s->seen, dir, NULL);
    if (had)
        *had = was;
    if (was)
        return 0;
    int err = push(&s->dirs, &s->ndirs, dir);
    if (err == 0 && (err = ck_strset_put(&s->seen, s->dirs[s->ndirs - 1], 0, NULL)) < 0) {
        free(s->dirs[--s->ndirs]);
        return err;
    }
    return err;
}

static int fsync_file(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(CK_EIO, "cannot open '%s' to fsync it", path);
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc < 0 ? ck_error_os(CK_EIO, "cannot fsync '%s'", path) : 0;
}

int ck_syncset_flush(struct ck_syncset *s, const char *fs_path)
{
    int err = 0;
    if (s->nfiles + s->ndirs >= CK_SYNCSET_SYNCFS_MIN) {
        int fd = open(fs_path, O_RDONLY | O_CLOEXEC | O_DIRECTORY);
        if (fd < 0)
            err = ck_error_os(CK_EIO, "cannot open '%s' to sync its filesystem", fs_path);
        else if (syncfs(fd) < 0)
            err = ck_error_os(CK_EIO, "cannot sync the filesystem of '%s'", fs_path);
        if (fd >= 0)
            close(fd);
    } else {
        /* files first: a folder's fsync then makes durable names of durable bytes */
        for (size_t i = 0; i < s->nfiles && err == 0; i++)
            err = fsync_file(s->files[i]);
        for (size_t i = 0; i < s->ndirs && err == 0; i++)
            err = ck_fsync_dir(s->dirs[i]);
    }
    ck_syncset_release(s);
    return err;
}

void ck_syncset_release(struct ck_syncset *s)
{
    for (size_t i = 0; i < s->nfiles; i++)
        free(s->files[i]);
    for (size_t i = 0; i < s->ndirs; i++)
        free(s->dirs[i]);
    free(s->files);
    free(s->dirs);
    ck_strset_release(&s->seen);
    memset(s, 0, sizeof *s);
}

int ck_write_file_replace_nosync(const char *path, const void *data, size_t len, unsigned mode)
{
    struct ck_atomic_file f;
    int err = ck_atomic_open(&f, path, (mode_t)mode);
    if (err < 0)
        return err;
    if ((err = ck_atomic_write(&f, data, len)) < 0) {
        ck_atomic_abort(&f);
        return err;
    }
    return ck_atomic_commit_nosync(&f);
}
