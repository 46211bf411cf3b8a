#include "hooks/exec.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "common/spawnattr.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Without a pidfd (kernels before 5.3) the child is polled this often. */
#define REAP_POLL_MS 50

struct ck_exec {
    char *name;
    pid_t pid;
    int pidfd;    /* -1 when the kernel has none */
    int out_fd;   /* read end of stdout+stderr; -1 once closed */
    int in_fd;    /* our end of the stdin socket; -1 once all is written */
    char *in_buf; /* owned copy of what goes to stdin */
    size_t in_len, in_off;
    int64_t start_ms, timeout_at, kill_at; /* kill_at: 0 until SIGTERM was sent */
    char line[CK_EXEC_LINE_MAX + 1];
    size_t line_len;
    size_t logged; /* output bytes seen */
    bool truncated;
    bool done;
    struct ck_exec_result res;
};

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

int ck_exec_start(const char *name, char *const *argv, char *const *envp, const char *stdin_data,
                  size_t stdin_len, double timeout, struct ck_exec **out)
{
    int outp[2] = {-1, -1}, inp[2] = {-1, -1}, err = 0;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    *out = NULL;
    if (!argv || !argv[0])
        return ck_error(CK_ECONFIG, "%s: no command", name);
    struct ck_exec *x = calloc(1, sizeof *x);
    if (!x || !(x->name = strdup(name)) || !(x->in_buf = malloc(stdin_len + 1))) {
        if (x)
            free(x->name);
        free(x);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    memcpy(x->in_buf, stdin_data, stdin_len);
    x->in_len = stdin_len;
    x->pidfd = x->out_fd = x->in_fd = -1;
    if (pipe2(outp, O_CLOEXEC) < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, inp) < 0) {
        err = ck_error_os(CK_EIO, "%s: cannot create pipes", name);
        goto fail;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, inp[1], 0);
    posix_spawn_file_actions_adddup2(&fa, outp[1], 1);
    posix_spawn_file_actions_adddup2(&fa, outp[1], 2);
    ck_spawnattr_clean(&attr);
    int rc = posix_spawnp(&x->pid, argv[0], &fa, &attr, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        errno = rc;
        err = ck_error_os(CK_ECONFIG, "%s: cannot run '%s'", name, argv[0]);
        goto fail;
    }
    close_fd(&outp[1]);
    close_fd(&inp[1]);
    x->out_fd = outp[0];
    x->in_fd = inp[0];
    fcntl(x->out_fd, F_SETFL, O_NONBLOCK);
    fcntl(x->in_fd, F_SETFL, O_NONBLOCK);
    x->pidfd = (int)syscall(SYS_pidfd_open, x->pid, 0);
    x->start_ms = ck_mono_ms();
    x->timeout_at = x->start_ms + (int64_t)(timeout * 1000);
    ck_info("hook.exec.started", "hook='%s' pid=%d", name, (int)x->pid);
    *out = x;
    return 0;
fail:
    close_fd(&outp[0]);
    close_fd(&outp[1]);
    close_fd(&inp[0]);
    close_fd(&inp[1]);
    free(x->in_buf);
    free(x->name);
    free(x);
    return err;
}

int ck_exec_poll_fds(const struct ck_exec *x, struct pollfd *out, int max)
{
    int n = 0;
    if (x->done)
        return 0;
    if (x->out_fd >= 0 && n < max)
        out[n++] = (struct pollfd){x->out_fd, POLLIN, 0};
    if (x->in_fd >= 0 && n < max)
        out[n++] = (struct pollfd){x->in_fd, POLLOUT, 0};
    if (x->pidfd >= 0 && n < max)
        out[n++] = (struct pollfd){x->pidfd, POLLIN, 0};
    return n;
}

int64_t ck_exec_deadline_ms(const struct ck_exec *x)
{
    int64_t d = x->kill_at ? x->kill_at : x->timeout_at;
    if (x->pidfd < 0) {
        int64_t poll_at = ck_mono_ms() + REAP_POLL_MS;
        if (poll_at < d)
            d = poll_at;
    }
    return d;
}

static void log_line(struct ck_exec *x)
{
    if (x->line_len == 0)
        return;
    x->line[x->line_len] = '\0';
    for (size_t i = 0; i < x->line_len; i++)
        if ((unsigned char)x->line[i] < 0x20 && x->line[i] != '\t')
            x->line[i] = ' ';
    ck_info("hook.exec.output", "hook='%s' | %s", x->name, x->line);
    x->line_len = 0;
}

static void take_output(struct ck_exec *x, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (x->logged >= CK_EXEC_OUTPUT_MAX) {
            if (!x->truncated)
                ck_warn("hook.exec.output",
                        "hook='%s' more than %d bytes of output: the rest "
                        "is not logged",
                        x->name, CK_EXEC_OUTPUT_MAX);
            x->truncated = true;
            return;
        }
        x->logged++;
        if (p[i] == '\n') {
            log_line(x);
            continue;
        }
        x->line[x->line_len++] = p[i];
        if (x->line_len == CK_EXEC_LINE_MAX)
            log_line(x);
    }
}

static void read_output(struct ck_exec *x)
{
    char buf[4096];
    while (x->out_fd >= 0) {
        ssize_t n = read(x->out_fd, buf, sizeof buf);
        if (n > 0) {
            take_output(x, buf, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        close_fd(&x->out_fd); /* EOF or error */
    }
}

static void write_input(struct ck_exec *x)
{
    while (x->in_fd >= 0 && x->in_off < x->in_len) {
        ssize_t n = send(x->in_fd, x->in_buf + x->in_off, x->in_len - x->in_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            x->in_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && errno == EAGAIN) {
            return;
        } else {
            break; /* EPIPE: the command does not read its stdin, which is fine */
        }
    }
    close_fd(&x->in_fd); /* all written, or the reader is gone: EOF for the command */
}

static void finish(struct ck_exec *x, int status)
{
    read_output(x); /* what is already in the pipe */
    take_output(x, "\n", 1);
    close_fd(&x->out_fd);
    close_fd(&x->in_fd);
    close_fd(&x->pidfd);
    x->res.seconds = (double)(ck_mono_ms() - x->start_ms) / 1000.0;
    if (WIFEXITED(status)) {
        x->res.exited = true;
        x->res.exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
        x->res.signal = WTERMSIG(status);
    }
    if (x->res.timed_out)
        /* the group may hold children of the command: they go too */
        kill(-x->pid, SIGKILL);
    x->done = true;
}

bool ck_exec_step(struct ck_exec *x)
{
    int status;
    if (x->done)
        return true;
    write_input(x);
    read_output(x);
    pid_t r = waitpid(x->pid, &status, WNOHANG);
    if (r == x->pid) {
        finish(x, status);
        return true;
    }
    if (r < 0 && errno == ECHILD) {
        /* someone else reaped it: treat as ended by an unknown cause */
        finish(x, 0xff00);
        return true;
    }
    int64_t now = ck_mono_ms();
    if (!x->kill_at && now >= x->timeout_at) {
        ck_warn("hook.exec.timeout", "hook='%s' pid=%d still running at its timeout: SIGTERM",
                x->name, (int)x->pid);
        x->res.timed_out = true;
        kill(-x->pid, SIGTERM);
        x->kill_at = now + (int64_t)(CK_EXEC_GRACE_S * 1000);
    } else if (x->kill_at && now >= x->kill_at) {
        ck_warn("hook.exec.timeout", "hook='%s' pid=%d ignored SIGTERM: SIGKILL", x->name,
                (int)x->pid);
        kill(-x->pid, SIGKILL);
        x->kill_at = now + 60 * 1000; /* it cannot survive SIGKILL; just wait for the reap */
    }
    return false;
}

const char *ck_exec_name(const struct ck_exec *x)
{
    return x->name;
}

bool ck_exec_is_done(const struct ck_exec *x)
{
    return x->done;
}

const struct ck_exec_result *ck_exec_result(const struct ck_exec *x)
{
    return &x->res;
}

void ck_exec_wait(struct ck_exec *x)
{
    while (!ck_exec_step(x)) {
        struct pollfd fds[3];
        int n = ck_exec_poll_fds(x, fds, 3);
        int64_t wait = ck_exec_deadline_ms(x) - ck_mono_ms();
        if (wait < 0)
            wait = 0;
        if (wait > 1000)
            wait = 1000;
        poll(fds, (nfds_t)n, (int)wait);
    }
}

void ck_exec_free(struct ck_exec *x)
{
    if (!x)
        return;
    if (!x->done) {
        kill(-x->pid, SIGKILL);
        int status = 0xff00;
        while (waitpid(x->pid, &status, 0) < 0 && errno == EINTR)
            ;
        x->res.timed_out = true;
        finish(x, status);
    }
    free(x->in_buf);
    free(x->name);
    free(x);
}
