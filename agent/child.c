#include "agent/child.h"
#include "common/error.h"
#include "common/log.h"
#include "common/text.h"
#include "common/spawnattr.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

static void close_capture(struct ck_child *c)
{
    for (int i = 0; i < 2; i++) {
        if (c->out[i] >= 0)
            close(c->out[i]);
        c->out[i] = -1;
        free(c->partial[i]);
        c->partial[i] = NULL;
        c->npartial[i] = 0;
    }
}

/* Our environment without CKPTD_DIR and CKPTD_CONFIG, then theirs for the
 * command (*out and the strings set[] owned by the caller; free with free). */
static int child_env(const char *dir, const char *config, char ***out, char *set[2])
{
    char abs[2][PATH_MAX];
    size_t n = 0, k = 0;
    *out = NULL;
    set[0] = set[1] = NULL;
    if (!realpath(dir, abs[0]))
        return ck_error_os(CK_EIO, "cannot resolve '%s'", dir);
    if (config && !realpath(config, abs[1]))
        return ck_error_os(CK_EIO, "cannot resolve '%s'", config);
    while (environ[n])
        n++;
    char **env = calloc(n + 3, sizeof *env);
    if (env && asprintf(&set[0], "CKPTD_DIR=%s", abs[0]) < 0)
        set[0] = NULL;
    if (env && set[0] && config && asprintf(&set[1], "CKPTD_CONFIG=%s", abs[1]) < 0)
        set[1] = NULL;
    if (!env || !set[0] || (config && !set[1])) {
        free(env);
        free(set[0]);
        set[0] = NULL;
        return ck_error(CK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "CKPTD_DIR=", 10) && strncmp(environ[i], "CKPTD_CONFIG=", 13))
            env[k++] = environ[i];
    env[k++] = set[0];
    if (set[1])
        env[k++] = set[1];
    env[k] = NULL;
    *out = env;
    return 0;
}

int ck_child_spawn(struct ck_child *c, char *const *argv, bool capture, const char *dir,
                   const char *config)
{
    char **env = NULL, *set[2] = {NULL, NULL};
    int eerr = child_env(dir, config, &env, set);
    if (eerr < 0)
        return eerr;
    int pipes[2][2] = {{-1, -1}, {-1, -1}};
    c->out[0] = c->out[1] = -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    for (int i = 0; capture && i < 2; i++) {
        /* our end non-blocking and close-on-exec; theirs becomes fd 1 or 2 */
        if (pipe2(pipes[i], O_CLOEXEC) < 0) {
            int err = ck_error_os(CK_EIO, "cannot make a pipe for the command's output");
            for (int k = 0; k <= i; k++)
                for (int e = 0; e < 2; e++)
                    if (pipes[k][e] >= 0)
                        close(pipes[k][e]);
            posix_spawn_file_actions_destroy(&fa);
            free(env);
            free(set[0]);
            free(set[1]);
            return err;
        }
        fcntl(pipes[i][0], F_SETFL, O_NONBLOCK);
        posix_spawn_file_actions_adddup2(&fa, pipes[i][1], i + 1);
    }
    /* Every signal at its default and none blocked, whatever ckptd's parent
     * ignored (nohup, a shell's background job) or ckptd set for itself
     * (its signalfd's mask, SIGPIPE and SIGIO ignored: agent/settle.h); its
     * own process group, so that our signals reach the command and its
     * children once each, whoever sent them. */
    posix_spawnattr_t attr;
    ck_spawnattr_clean(&attr);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], capture ? &fa : NULL, &attr, argv, env);
    posix_spawnattr_destroy(&attr);
    free(env);
    free(set[0]);
    free(set[1]);
    posix_spawn_file_actions_destroy(&fa);
    for (int i = 0; capture && i < 2; i++) {
        close(pipes[i][1]);
        c->out[i] = pipes[i][0];
    }
    if (rc != 0) {
        close_capture(c);
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
    char name[32];
    if (c->pid <= 0)
        return;
    if (kill(-c->pid, sig) < 0 && kill(c->pid, sig) < 0)
        return;
    ck_info("command.signalled", "pid=%ld signal=%s", (long)c->pid, ck_signal_name(sig, name, sizeof name));
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
    ck_child_drain(c, 1.0); /* its last lines first, then its exit */
    if (WIFEXITED(status)) {
        c->code = WEXITSTATUS(status);
        ck_info("command.exited", "pid=%ld code=%d", (long)c->pid, c->code);
    } else {
        char name[32];
        c->code = 128 + WTERMSIG(status);
        ck_info("command.exited", "pid=%ld signal=%s code=%d", (long)c->pid,
                ck_signal_name(WTERMSIG(status), name, sizeof name), c->code);
    }
    c->pid = 0;
    return true;
}

static void log_line(int stream, const char *p, size_t n)
{
    char line[CK_CHILD_LINE_MAX + 1];
    if (n > CK_CHILD_LINE_MAX)
        n = CK_CHILD_LINE_MAX;
    memcpy(line, p, n);
    line[n] = '\0';
    ck_log_kv(CK_LOG_INFO, "command.output", "the command wrote a line", "stream",
              stream ? "stderr" : "stdout", "line", line, NULL);
}

/* Logs the complete lines of partial + data; keeps the rest. */
static void take(struct ck_child *c, int stream, const char *data, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char ch = data[i];
        if (ch != '\n' && c->npartial[stream] < CK_CHILD_LINE_MAX) {
            if (!c->partial[stream] && !(c->partial[stream] = malloc(CK_CHILD_LINE_MAX)))
                return; /* out of memory: the line is lost, the command goes on */
            c->partial[stream][c->npartial[stream]++] = ch;
            continue;
        }
        log_line(stream, c->partial[stream] ? c->partial[stream] : "", c->npartial[stream]);
        c->npartial[stream] = 0;
        if (ch != '\n') /* a line over the maximum: this byte starts the next piece */
            i--;
    }
}

bool ck_child_read(struct ck_child *c, int stream)
{
    char buf[65536];
    if (c->out[stream] < 0)
        return false;
    for (;;) {
        ssize_t n = read(c->out[stream], buf, sizeof buf);
        if (n > 0) {
            take(c, stream, buf, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return true;
        /* the end (or an error: the same for us) */
        if (c->npartial[stream])
            log_line(stream, c->partial[stream], c->npartial[stream]);
        close(c->out[stream]);
        c->out[stream] = -1;
        free(c->partial[stream]);
        c->partial[stream] = NULL;
        c->npartial[stream] = 0;
        return false;
    }
}

void ck_child_drain(struct ck_child *c, double timeout)
{
    struct pollfd p[2];
    int ms = (int)(timeout * 1000);
    while (c->out[0] >= 0 || c->out[1] >= 0) {
        int n = 0;
        for (int i = 0; i < 2; i++)
            if (c->out[i] >= 0)
                p[n++] = (struct pollfd){.fd = c->out[i], .events = POLLIN};
        if (poll(p, (nfds_t)n, ms) <= 0)
            break; /* a grandchild holds the pipe open: stop here */
        for (int i = 0; i < 2; i++)
            ck_child_read(c, i);
    }
    close_capture(c);
}

void ck_child_end(struct ck_child *c)
{
    if (c->pid <= 0)
        return;
    kill(-c->pid, SIGTERM);
    waitpid(c->pid, NULL, 0);
}
