#include "agent/dirwait.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/signalfd.h>
#include <unistd.h>

/* The nearest existing folder above dir (or "." / "/"). */
static void nearest_parent(const char *dir, char *out, size_t outsz)
{
    snprintf(out, outsz, "%s", dir);
    for (;;) {
        char *slash = strrchr(out, '/');
        if (!slash) {
            snprintf(out, outsz, ".");
            return;
        }
        if (slash == out) {
            out[1] = '\0';
            return;
        }
        *slash = '\0';
        if (ck_is_dir(out))
            return;
    }
}

int ck_dir_wait(const char *dir, bool *stopped)
{
    *stopped = false;
    if (ck_is_dir(dir))
        return 0;
    if (ck_exists(dir))
        return ck_error(CK_EEXIST, "'%s' exists and is not a folder", dir);
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    if (sigprocmask(SIG_BLOCK, &set, &old) < 0)
        return ck_error_os(CK_EIO, "cannot block signals");
    int sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    int ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    int err = 0, wd = -1;
    char watched[PATH_MAX] = "";
    ck_info("watch.waiting", "dir='%s': it does not exist yet; waiting for it", dir);
    while (!ck_is_dir(dir)) {
        if (ck_exists(dir)) {
            err = ck_error(CK_EEXIST, "'%s' exists and is not a folder", dir);
            break;
        }
        /* watch the nearest existing folder: as parents appear, move down */
        char parent[PATH_MAX];
        nearest_parent(dir, parent, sizeof parent);
        if (ifd >= 0 && strcmp(parent, watched) != 0) {
            if (wd >= 0)
                inotify_rm_watch(ifd, wd);
            wd = inotify_add_watch(ifd, parent, IN_CREATE | IN_MOVED_TO | IN_ONLYDIR);
            snprintf(watched, sizeof watched, "%s", parent);
        }
        struct pollfd p[2] = {{.fd = sfd, .events = POLLIN}, {.fd = ifd, .events = POLLIN}};
        if (poll(p, 2, 1000) < 0 && errno != EINTR) {
            err = ck_error_os(CK_EIO, "waiting for '%s'", dir);
            break;
        }
        struct signalfd_siginfo si;
        if (sfd >= 0 && read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
            ck_info("watch.stopped", "signal=%s: '%s' never appeared",
                    si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM", dir);
            *stopped = true;
            break;
        }
        char buf[4096];
        while (ifd >= 0 && read(ifd, buf, sizeof buf) > 0)
            ; /* what changed does not matter: look again */
    }
    if (ifd >= 0)
        close(ifd);
    if (sfd >= 0)
        close(sfd);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (err == 0 && !*stopped)
        ck_info("watch.dir_appeared", "dir='%s'", dir);
    return err;
}
