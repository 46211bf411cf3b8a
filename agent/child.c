#include "agent/child.h"
#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

int ck_child_spawn(struct ck_child *c, char *const *argv)
{
    posix_spawnattr_t attr;
    sigset_t none, dfl;
    sigemptyset(&none);
    sigemptyset(&dfl);
    sigaddset(&dfl, SIGINT);
    sigaddset(&dfl, SIGTERM);
    sigaddset(&dfl, SIGHUP);
    sigaddset(&dfl, SIGCHLD);
    sigaddset(&dfl, SIGPIPE);
    sigaddset(&dfl, SIGIO); /* ignored in the watcher (agent/settle.h), not in the command */
    posix_spawnattr_init(&attr);
    /* Its own process group: our signals reach the command and its children
     * once each, whoever sent them. */
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                        POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &dfl);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], NULL, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        errno = rc;
        return ck_error_os(CK_ERR, "cannot start '%s'", argv[0]);
    }
    c->pid = pid;
    c->started = true;
    ck_info("command.started", "pid=%ld command='%s'", (long)pid, argv[0]);
    return 0;
}

void ck_child_signal(struct ck_child *c, int sig)
{
    if (c->pid <= 0)
        return;
    if (kill(-c->pid, sig) < 0 && kill(c->pid, sig) < 0)
        return;
    ck_info("command.signalled", "pid=%ld signal=%s", (long)c->pid, strsignal(sig));
}

void ck_child_kill(struct ck_child *c, double grace)
{
    if (c->pid <= 0)
        return;
    ck_warn("command.killed", "pid=%ld did not exit within %.3gs of the signal: SIGKILL",
            (long)c->pid, grace);
    kill(-c->pid, SIGKILL);
    kill(c->pid, SIGKILL);
}

bool ck_child_reap(struct ck_child *c)
{
    int status;
    if (c->pid <= 0 || waitpid(c->pid, &status, WNOHANG) != c->pid)
        return false;
    if (WIFEXITED(status)) {
        c->code = WEXITSTATUS(status);
        ck_info("command.exited", "pid=%ld code=%d", (long)c->pid, c->code);
    } else {
        c->code = 128 + WTERMSIG(status);
        ck_info("command.exited", "pid=%ld signal=%s code=%d", (long)c->pid,
                strsignal(WTERMSIG(status)), c->code);
    }
    c->pid = 0;
    return true;
}

void ck_child_end(struct ck_child *c)
{
    if (c->pid <= 0)
        return;
    kill(-c->pid, SIGTERM);
    waitpid(c->pid, NULL, 0);
}
