/* The sandboxed runner (see sandbox.h). The child's answer on the pipe:
 *   'O' then the payload, or
 *   'E', the error code (int32 LE) and the message up to the end.
 * Outputs of the engine as a payload: u32 count, then per array u32 name
 * length, the name, u32 rank, rank x i64 dims, numel x float32. */
#include "infer/sandbox.h"
#include "common/clock.h"
#include "common/error.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define CK_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CK_UNDER_ASAN 1
#endif
#endif

/* What runs in the child, for messages. */
#define WHO(lim) ((lim) && (lim)->who ? (lim)->who : "the engine")

const char *ck_sandbox_status_name(enum ck_sandbox_status s)
{
    static const char *const names[] = {"ok", "failed", "timeout", "memory", "crashed"};
    return (unsigned)s < 5 ? names[s] : "crashed";
}

static int write_all(int fd, const void *p, size_t n)
{
    const unsigned char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static void child(ck_sandbox_fn fn, void *arg, const struct ck_sandbox_limits *lim, int wfd)
{
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
    }
    if (wfd != 3) {
        dup2(wfd, 3);
        wfd = 3;
    }
    close_range(4, ~0U, 0);
    if (lim->timeout > 0) {
        rlim_t s = (rlim_t)lim->timeout + (lim->timeout > (double)(rlim_t)lim->timeout);
        struct rlimit r = {s, s + 1};
        setrlimit(RLIMIT_CPU, &r);
    }
#ifndef CK_UNDER_ASAN
    if (lim->max_memory) {
        struct rlimit r = {lim->max_memory, lim->max_memory};
        setrlimit(RLIMIT_AS, &r);
    }
#endif
    ck_error_clear();
    int err = fn(arg, wfd);
    if (err < 0) {
        const char *msg = ck_error_msg();
        int32_t code = err;
        /* the payload may be half written: the parent reads the last 'E' frame
         * only when the exit status says so */
        (void)write_all(wfd, "\n\0E", 3);
        (void)write_all(wfd, &code, 4);
        (void)write_all(wfd, msg, strlen(msg));
        _exit(3);
    }
    _exit(0);
}

/* Reads the child's answer until EOF or the wall-clock deadline. */
static int read_answer(const struct ck_sandbox_limits *lim, int fd, pid_t pid, double wall,
                       uint64_t max, unsigned char **buf, uint64_t *len, bool *killed)
{
    uint64_t cap = 4096;
    double deadline = wall > 0 ? ck_mono_s() + wall : 0;
    *buf = malloc(cap);
    *len = 0;
    if (!*buf)
        return ck_error(CK_ENOMEM, "out of memory for %s's answer", WHO(lim));
    for (;;) {
        int ms = -1;
        if (deadline) {
            double left = deadline - ck_mono_s();
            if (left <= 0) {
                kill(pid, SIGKILL);
                *killed = true;
                return 0;
            }
            ms = (int)(left * 1000) + 1;
        }
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue;
        if (*len == cap) {
            if (cap >= max + 64) {
                kill(pid, SIGKILL);
                return ck_error(CK_ESIZE, "%s's answer is over %llu bytes", WHO(lim),
                                (unsigned long long)max);
            }
            unsigned char *n = realloc(*buf, cap * 2);
            if (!n) {
                kill(pid, SIGKILL);
                return ck_error(CK_ENOMEM, "out of memory for %s's answer", WHO(lim));
            }
            *buf = n;
            cap *= 2;
        }
        ssize_t got = read(fd, *buf + *len, cap - *len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return 0;
        *len += (uint64_t)got;
    }
}

/* The error frame at the end of what a failed child wrote. */
static int child_error(const struct ck_sandbox_limits *lim, const unsigned char *buf, uint64_t len,
                       enum ck_sandbox_status *status)
{
    const unsigned char *e = NULL;
    for (uint64_t i = 0; i + 7 <= len; i++)
        if (buf[i] == '\n' && buf[i + 1] == 0 && buf[i + 2] == 'E')
            e = buf + i;
    if (!e) {
        *status = CK_SANDBOX_CRASHED;
        return ck_error(CK_ERR, "crashed: %s exited without an answer", WHO(lim));
    }
    int32_t code;
    memcpy(&code, e + 3, 4);
    int n = (int)(len - (uint64_t)(e + 7 - buf));
    *status = code == CK_ENOMEM ? CK_SANDBOX_MEMORY : CK_SANDBOX_FAILED;
    if (code >= 0 || code < -64)
        code = CK_ERR;
    if (*status == CK_SANDBOX_MEMORY)
        return ck_error(code, "memory: %.*s", n, (const char *)e + 7);
    return ck_error(code, "%.*s", n, (const char *)e + 7);
}

int ck_sandbox_call(ck_sandbox_fn fn, void *arg, const struct ck_sandbox_limits *lim,
                    uint64_t max_answer, unsigned char **answer, uint64_t *len,
                    enum ck_sandbox_status *status, struct rusage *ru)
{
    struct rusage ignored;
    int fds[2], err, ws = 0;
    bool killed = false;
    *answer = NULL;
    *len = 0;
    *status = CK_SANDBOX_CRASHED;
    if (pipe2(fds, O_CLOEXEC) < 0)
        return ck_error_os(CK_EIO, "cannot create %s's pipe", WHO(lim));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return ck_error_os(CK_EIO, "cannot start %s's process", WHO(lim));
    }
    if (pid == 0) {
        close(fds[0]);
        child(fn, arg, lim, fds[1]);
    }
    close(fds[1]);
    unsigned char *buf = NULL;
    double wall = lim->timeout > 0 ? lim->timeout * 3 + 1 : 0;
    err = read_answer(lim, fds[0], pid, wall, max_answer, &buf, len, &killed);
    close(fds[0]);
    if (killed || err < 0)
        kill(pid, SIGKILL);
    while (wait4(pid, &ws, 0, ru ? ru : &ignored) < 0 && errno == EINTR)
        ;
    if (err < 0)
        goto fail;
    if (killed || (WIFSIGNALED(ws) && WTERMSIG(ws) == SIGXCPU)) {
        *status = CK_SANDBOX_TIMEOUT;
        err = ck_error(CK_ERR, "timeout: %s ran over its limit of %g s", WHO(lim), lim->timeout);
    } else if (WIFSIGNALED(ws)) {
        /* SIGKILL we did not send: the kernel's OOM killer */
        *status = WTERMSIG(ws) == SIGKILL ? CK_SANDBOX_MEMORY : CK_SANDBOX_CRASHED;
        const char *abbrev = sigabbrev_np(WTERMSIG(ws));
        err = ck_error(CK_ERR, "%s: %s was killed by signal %d (SIG%s, %s)",
                       ck_sandbox_status_name(*status), WHO(lim), WTERMSIG(ws),
                       abbrev ? abbrev : "?", strsignal(WTERMSIG(ws)));
    } else if (WEXITSTATUS(ws) == 0) {
        *status = CK_SANDBOX_OK;
        *answer = buf;
        return 0;
    } else if (WEXITSTATUS(ws) == 3) {
        err = child_error(lim, buf, *len, status);
    } else {
        err = ck_error(CK_ERR, "crashed: %s exited with status %d", WHO(lim), WEXITSTATUS(ws));
    }
fail:
    free(buf);
    *len = 0;
    return err;
}

int ck_sandbox_call_fixed(ck_sandbox_fn fn, void *arg, const char *who, const char *path,
                          void *out, size_t size)
{
    struct ck_sandbox_limits lim = {.who = who};
    enum ck_sandbox_status st;
    unsigned char *answer = NULL;
    uint64_t len = 0;
    int err = ck_sandbox_call(fn, arg, &lim, size, &answer, &len, &st, NULL);
    if (err == 0 && len != size)
        err = ck_error(CK_ERR, "'%s': %s answered %llu bytes, not %zu", path, who,
                       (unsigned long long)len, size);
    if (err == 0)
        memcpy(out, answer, size);
    else if (st == CK_SANDBOX_CRASHED)
        ck_error_wrap(err, "'%s'", path);
    free(answer);
    return err;
}
