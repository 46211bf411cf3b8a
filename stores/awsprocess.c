#include "stores/awsprocess.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/spawnattr.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

void ck_awsprocess_argv_free(char **argv)
{
    for (size_t i = 0; argv && argv[i]; i++) {
        explicit_bzero(argv[i], strlen(argv[i]));
        free(argv[i]);
    }
    free(argv);
}

static int push(char ***argv, size_t *n, struct ck_buf *tok)
{
    char **v = realloc(*argv, (*n + 2) * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    *argv = v;
    if (!(v[*n] = strdup(ck_buf_str(tok))))
        return ck_error(CK_ENOMEM, "out of memory");
    v[++*n] = NULL;
    ck_buf_reset(tok);
    return 0;
}

/* shlex.split in POSIX mode: blanks separate words; outside quotes a
 * backslash takes the next character as it is; '...' is literal; in "..."
 * only \" and \\ are escapes (a backslash before anything else stays); a
 * quoted empty string is a word. */
int ck_awsprocess_split(const char *cmd, const char *what, char ***argv_out)
{
    struct ck_buf tok = CK_BUF_INIT;
    char **argv = NULL;
    size_t n = 0;
    bool in_word = false;
    int err = 0;
    *argv_out = NULL;
    ck_buf_init(&tok, CK_AWSPROCESS_OUTPUT_MAX);
    for (const char *p = cmd; *p && err >= 0; p++) {
        char c = *p;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            if (in_word)
                err = push(&argv, &n, &tok);
            in_word = false;
            continue;
        }
        in_word = true;
        if (c == '\\') {
            if (!p[1]) {
                err = ck_error(CK_ECONFIG, "%s: the command ends in a backslash", what);
                break;
            }
            err = ck_buf_putc(&tok, *++p);
        } else if (c == '\'') {
            const char *end = strchr(p + 1, '\'');
            if (!end) {
                err = ck_error(CK_ECONFIG, "%s: the command has no closing quotation", what);
                break;
            }
            err = ck_buf_append(&tok, p + 1, (size_t)(end - p - 1));
            p = end;
        } else if (c == '"') {
            for (p++; *p && *p != '"' && err >= 0; p++) {
                if (*p == '\\' && (p[1] == '"' || p[1] == '\\'))
                    p++;
                err = ck_buf_putc(&tok, *p);
            }
            if (!*p && err >= 0) {
                err = ck_error(CK_ECONFIG, "%s: the command has no closing quotation", what);
                break;
            }
        } else {
            err = ck_buf_putc(&tok, c);
        }
    }
    if (err >= 0 && in_word)
        err = push(&argv, &n, &tok);
    if (err >= 0 && n == 0)
        err = ck_error(CK_ECONFIG, "%s: the command is empty", what);
    ck_buf_wipe(&tok);
    if (err < 0) {
        ck_awsprocess_argv_free(argv);
        return err;
    }
    *argv_out = argv;
    return 0;
}

/* Waits for pid until deadline (monotonic ms); at the deadline its group is
 * killed. Returns the wait status, or -1 when it had to be killed. */
static int reap(pid_t pid, int64_t deadline)
{
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0 && errno != EINTR)
            return 0; /* not ours to wait for any more: nothing to report */
        if (ck_mono_ms() >= deadline) {
            kill(-pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
            return -1;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int ck_awsprocess_run(const char *cmd, const char *what, double timeout, struct ck_buf *out)
{
    char **argv = NULL;
    int err = ck_awsprocess_split(cmd, what, &argv);
    if (err < 0)
        return err;
    int pipefd[2] = {-1, -1};
    pid_t pid = 0;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    if (pipe2(pipefd, O_CLOEXEC) < 0) {
        err = ck_error_os(CK_EIO, "%s: cannot create a pipe", what);
        goto out;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
    ck_spawnattr_clean(&attr); /* a group of its own, to be killed with */
    int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(pipefd[1]);
    pipefd[1] = -1;
    if (rc != 0) {
        errno = rc;
        err = ck_error_os(CK_ECONFIG, "%s: cannot run '%s'", what, argv[0]);
        goto out;
    }
    int64_t deadline = ck_mono_ms() + (int64_t)(timeout * 1000);
    bool too_much = false, late = false;
    char buf[4096];
    for (;;) {
        int64_t left = deadline - ck_mono_ms();
        if (left <= 0) {
            late = true;
            break;
        }
        struct pollfd pf = {pipefd[0], POLLIN, 0};
        int pr = poll(&pf, 1, (int)(left > 1000 ? 1000 : left));
        if (pr < 0 && errno != EINTR)
            break;
        if (pr <= 0)
            continue;
        ssize_t r = read(pipefd[0], buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break; /* its end, or an error: what came so far is judged */
        if (out->len + (size_t)r > CK_AWSPROCESS_OUTPUT_MAX ||
            ck_buf_append(out, buf, (size_t)r) < 0) {
            too_much = true;
            break;
        }
    }
    explicit_bzero(buf, sizeof buf);
    if (late || too_much)
        kill(-pid, SIGKILL); /* its whole group: a child of it may hold the pipe */
    /* after our SIGKILL, reap's -1 only says the child was not dead yet
     * when first looked at: the reason it was killed is ours to give */
    int status = reap(pid, late || too_much ? 0 : deadline);
    if (too_much)
        err = ck_error(CK_EAUTH, "%s: '%s' printed more than %u KiB", what, argv[0],
                       CK_AWSPROCESS_OUTPUT_MAX >> 10);
    else if (late || status == -1)
        err = ck_error(CK_EAUTH, "%s: '%s' did not finish within %.0f s (killed)", what, argv[0],
                       timeout);
    else if (WIFSIGNALED(status))
        err =
            ck_error(CK_EAUTH, "%s: '%s' was ended by signal %d", what, argv[0], WTERMSIG(status));
    else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        err = ck_error(CK_EAUTH, "%s: '%s' exited with status %d", what, argv[0],
                       WEXITSTATUS(status));
out:
    if (pipefd[0] >= 0)
        close(pipefd[0]);
    if (pipefd[1] >= 0)
        close(pipefd[1]);
    ck_awsprocess_argv_free(argv);
    return err;
}
