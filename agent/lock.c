#include "agent/lock.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/pidlock.h"

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
    char pid[32];
    int fd;
    if ((err = ck_pidlock_acquire(path, 0600, &fd, pid, sizeof pid)) == CK_ELOCKED)
        return ck_error(CK_ELOCKED, "another ckptd (pid %s) is working on '%s'",
                        pid[0] ? pid : "unknown", model_dir);
    if (err < 0)
        return err;
    l->fd = fd;
    return 0;
}

void ck_lock_release(struct ck_lock *l)
{
    if (l->fd >= 0)
        close(l->fd); /* closing drops the flock */
    l->fd = -1;
}

long ck_lock_holder(const char *model_dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/.ckptd/lock", model_dir) >= (int)sizeof path)
        return 0;
    return ck_pidlock_holder(path);
}
