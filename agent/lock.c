#include "agent/lock.h"
#include "common/error.h"
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

int ck_lock_acquire(struct ck_lock *l, const char *model_dir)
{
    char dir[4096], path[4096];
    int err;
    l->fd = -1;
    if ((err = ck_path_join(dir, sizeof dir, model_dir, ".ckptd")) < 0 ||
        (err = ck_mkdirs(dir, 0700)) < 0 || (err = ck_path_join(path, sizeof path, dir, "lock")) < 0)
        return err;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return ck_error_os(CK_EIO, "cannot open lock file '%s'", path);
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        close(fd);
        if (errno != EWOULDBLOCK)
            return ck_error_os(CK_EIO, "cannot lock '%s'", path);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        return ck_error(CK_ELOCKED, "another ckptd (pid %s) is working on '%s'",
                        pid[0] ? pid : "unknown", model_dir);
    }
    char buf[32];
    int len = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) == 0 && pwrite(fd, buf, (size_t)len, 0) < 0) {
        /* The pid is only informative; the flock is what protects. */
    }
    l->fd = fd;
    return 0;
}

void ck_lock_release(struct ck_lock *l)
{
    if (l->fd >= 0)
        close(l->fd); /* closing drops the flock */
    l->fd = -1;
}
