#include "common/pidlock.h"
#include "common/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

static void read_pid(int fd, char *out, size_t outsz)
{
    char buf[32] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    snprintf(out, outsz, "%s", buf);
}

int ck_pidlock_acquire(const char *path, mode_t mode, int *fd_out, char *holder, size_t holdersz)
{
    *fd_out = -1;
    if (holdersz)
        holder[0] = '\0';
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, mode);
    if (fd < 0)
        return ck_error_os(CK_EIO, "cannot open lock file '%s'", path);
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        read_pid(fd, holder, holdersz);
        close(fd);
        errno = e;
        if (e != EWOULDBLOCK)
            return ck_error_os(CK_EIO, "cannot lock '%s'", path);
        return CK_ELOCKED;
    }
    char buf[32];
    int len = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) == 0 && pwrite(fd, buf, (size_t)len, 0) < 0) {
        /* The pid is only informative; the flock is what protects. */
    }
    *fd_out = fd;
    return 0;
}

long ck_pidlock_holder(const char *path)
{
    char buf[32];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    long pid = 0;
    if (flock(fd, LOCK_SH | LOCK_NB) < 0 && errno == EWOULDBLOCK) {
        read_pid(fd, buf, sizeof buf);
        pid = atol(buf);
        if (pid <= 0)
            pid = -1; /* held, pid unknown */
    }
    close(fd); /* drops a shared lock we may have got */
    return pid;
}
