#include "agent/sender.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* Frames on the pipe: a type byte, a 4-byte length (host order: both ends
 * are the same binary), the data. */
#define FRAME_RECORD 'R'
#define FRAME_METRICS 'M'
#define FRAME_AGAIN 'A'
#define FRAME_HEADER 5
#define FRAME_MAX (1u << 20)
/* A helper that failed (crashed, was killed, could not start) is tried again
 * after this long: its work is still in the database. */
#define FAILED_RETRY_MS 5000
/* The helper's end of the pipe, where dup2 puts it. */
#define HELPER_FD 3

struct ck_sender {
    struct ck_sender_spec spec;
    struct ck_loop *loop;
    struct ck_loop_handler *h;
    struct ck_state *state; /* closed around fork, NULL: none */
    pid_t pid;              /* the running helper, 0: none */
    int fd;                 /* the read end of its pipe, -1: none */
    struct ck_buf in;
    bool kicked, stopped;
    int64_t again_at; /* ck_mono_ms of a round asked for later, -1: none */
};

/* ---- in the helper ---- */

static int helper_fd = -1;
static const struct ck_sender_spec *helper_spec;
static pthread_mutex_t helper_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ck_metrics_mark helper_mark;

static int send_frame(char type, const void *data, size_t len)
{
    unsigned char hdr[FRAME_HEADER];
    uint32_t n = (uint32_t)len;
    if (helper_fd < 0 || len > FRAME_MAX)
        return -1;
    hdr[0] = (unsigned char)type;
    memcpy(hdr + 1, &n, sizeof n);
    if (ck_write_all(helper_fd, hdr, sizeof hdr) < 0 || ck_write_all(helper_fd, data, len) < 0)
        return -1;
    return 0;
}

/* With helper_mu held. */
static void send_metrics(void)
{
    struct ck_buf b = CK_BUF_INIT;
    if (ck_metrics_changes(&helper_mark, &b) == 0 && b.len)
        send_frame(FRAME_METRICS, b.data, b.len);
    ck_buf_release(&b);
}

int ck_sender_send(const void *data, size_t len)
{
    pthread_mutex_lock(&helper_mu);
    int r = send_frame(FRAME_RECORD, data, len);
    send_metrics();
    pthread_mutex_unlock(&helper_mu);
    return r;
}

/* The gauges a round sets as it goes (ckptd_upload_queue_depth while a
 * transfer runs, ckptd_hook_outbox_depth) reach the watcher's /metrics this
 * often, not only when a job ends. */
#define METRICS_FLUSH_MS 500

static void *metrics_flusher(void *arg)
{
    (void)arg;
    for (;;) {
        struct timespec ts = {0, METRICS_FLUSH_MS * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&helper_mu);
        send_metrics();
        pthread_mutex_unlock(&helper_mu);
    }
    return NULL;
}

static void helper_on_signal(int sig)
{
    (void)sig;
    if (helper_spec && helper_spec->stop)
        helper_spec->stop(helper_spec->arg);
}

static void close_from(int first)
{
    if (close_range((unsigned)first, ~0u, 0) == 0)
        return;
    long max = sysconf(_SC_OPEN_MAX);
    for (long fd = first; fd < (max > 0 && max < 65536 ? max : 65536); fd++)
        close((int)fd);
}

/* The helper keeps stdin, stdout, stderr (its log lines go where the
 * watcher's go) and its pipe: not the lock on the model folder, the ops
 * listener, inotify or the watcher's database connection. */
static _Noreturn void helper_main(struct ck_sender *s, int wfd, pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
        _exit(1); /* the watcher is already gone */
    if (wfd != HELPER_FD && dup2(wfd, HELPER_FD) < 0)
        _exit(1);
    close_from(HELPER_FD + 1);
    helper_fd = HELPER_FD;
    helper_spec = &s->spec;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = helper_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGHUP, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGCHLD, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL); /* the watcher blocks them for its signalfd */
    ck_metrics_mark(&helper_mark);
    pthread_t flusher;
    if (pthread_create(&flusher, NULL, metrics_flusher, NULL) != 0)
        ck_debug("metrics.helper", "no flushing thread: the metrics come with each record");

    double again = s->spec.round(s->spec.arg);

    pthread_mutex_lock(&helper_mu);
    send_metrics();
    if (again >= 0) {
        char t[32];
        int n = snprintf(t, sizeof t, "%.3f", again);
        send_frame(FRAME_AGAIN, t, (size_t)n);
    }
    pthread_mutex_unlock(&helper_mu);
    fflush(NULL);
    _exit(0); /* no atexit handlers: they belong to the watcher */
}

/* ---- in the watcher ---- */

static void event_name(char *out, size_t outsz, const struct ck_sender *s, const char *what)
{
    snprintf(out, outsz, "%s.%s", s->spec.name, what);
}

/* A helper could not be started: say why, try again later. */
static void spawn_failed(struct ck_sender *s, const char *why)
{
    char ev[64];
    event_name(ev, sizeof ev, s, "helper_failed");
    ck_err(ev, "%s; trying again in %ds", why, FAILED_RETRY_MS / 1000);
    s->again_at = ck_mono_ms() + FAILED_RETRY_MS;
}

static void spawn(struct ck_sender *s)
{
    char ev[64], why[256];
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
        snprintf(why, sizeof why, "cannot create a pipe: %s", strerror(errno));
        spawn_failed(s, why);
        return;
    }
    if (s->state && ck_state_close_db(s->state) < 0) {
        close(p[0]);
        close(p[1]);
        spawn_failed(s, ck_error_msg());
        return;
    }
    fflush(NULL); /* nothing buffered is written twice */
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        helper_main(s, p[1], parent);
    }
    int errno_fork = errno;
    if (s->state && ck_state_reopen_db(s->state) < 0) {
        /* nothing the watcher does works without it: end, and let the
         * supervisor start it again (restart-safe) */
        ck_err("state.failed", "%s: cannot go on", ck_error_msg());
        if (pid > 0)
            kill(pid, SIGKILL);
        _exit(CK_EXIT_FAILED);
    }
    errno = errno_fork;
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        snprintf(why, sizeof why, "cannot start a helper process: %s", strerror(errno));
        spawn_failed(s, why);
        return;
    }
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    s->pid = pid;
    s->fd = p[0];
    s->kicked = false;
    s->again_at = -1;
    ck_buf_reset(&s->in);
    event_name(ev, sizeof ev, s, "helper_started");
    ck_debug(ev, "pid=%ld", (long)pid);
}

static void reap(struct ck_sender *s)
{
    char ev[64];
    int status = 0;
    close(s->fd);
    s->fd = -1;
    while (waitpid(s->pid, &status, 0) < 0 && errno == EINTR)
        ;
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) {
        char why[48];
        if (WIFSIGNALED(status))
            snprintf(why, sizeof why, "killed by signal %d", WTERMSIG(status));
        else
            snprintf(why, sizeof why, "exit status %d", WEXITSTATUS(status));
        event_name(ev, sizeof ev, s, "helper_failed");
        if (s->stopped)
            ck_info(ev, "pid=%ld %s (stopping)", (long)s->pid, why);
        else
            ck_err(ev, "pid=%ld %s; what it was doing stays queued, trying again in %ds",
                   (long)s->pid, why, FAILED_RETRY_MS / 1000);
        if (!s->stopped && s->again_at < 0)
            s->again_at = ck_mono_ms() + FAILED_RETRY_MS;
    } else {
        event_name(ev, sizeof ev, s, "helper_ended");
        ck_debug(ev, "pid=%ld", (long)s->pid);
    }
    s->pid = 0;
    ck_buf_reset(&s->in);
}

/* Handles the complete frames in s->in. False when the stream is garbage
 * (it never should be: the helper is this binary). */
static bool parse_frames(struct ck_sender *s)
{
    size_t pos = 0;
    bool ok = true;
    while (s->in.len - pos >= FRAME_HEADER) {
        const char *f = s->in.data + pos;
        uint32_t n;
        memcpy(&n, f + 1, sizeof n);
        if (n > FRAME_MAX) {
            ok = false;
            break;
        }
        if (s->in.len - pos - FRAME_HEADER < n)
            break;
        const char *data = f + FRAME_HEADER;
        if (f[0] == FRAME_RECORD) {
            if (s->spec.on_record)
                s->spec.on_record(s->spec.arg, data, n);
        } else if (f[0] == FRAME_METRICS) {
            if (ck_metrics_apply(data, n) < 0)
                ck_warn("metrics.helper", "%s", ck_error_msg());
        } else if (f[0] == FRAME_AGAIN) {
            char t[32];
            size_t k = n < sizeof t - 1 ? n : sizeof t - 1;
            memcpy(t, data, k);
            t[k] = '\0';
            double secs = strtod(t, NULL);
            if (secs >= 0 && secs < 1e9 && !s->stopped)
                s->again_at = ck_mono_ms() + (int64_t)(secs * 1000);
        } else {
            ok = false;
            break;
        }
        pos += FRAME_HEADER + n;
    }
    if (pos) {
        memmove(s->in.data, s->in.data + pos, s->in.len - pos);
        s->in.len -= pos;
        s->in.data[s->in.len] = '\0'; /* the buffer's invariant */
    }
    return ok;
}

/* Reads what is there without blocking; reaps at end of file. */
static void read_records(struct ck_sender *s)
{
    char tmp[16384];
    while (s->fd >= 0) {
        ssize_t n = read(s->fd, tmp, sizeof tmp);
        if (n > 0) {
            if (ck_buf_append(&s->in, tmp, (size_t)n) < 0 || !parse_frames(s)) {
                char ev[64];
                event_name(ev, sizeof ev, s, "helper_failed");
                ck_err(ev, "pid=%ld sent what cannot be read; stopping it", (long)s->pid);
                kill(s->pid, SIGKILL);
                reap(s);
            }
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        reap(s); /* end of file: the helper has exited */
    }
}

static void maybe_spawn(struct ck_sender *s)
{
    if (s->stopped || s->pid)
        return;
    if (s->kicked || (s->again_at >= 0 && ck_mono_ms() >= s->again_at))
        spawn(s);
}

static int poll_fds(void *arg, struct pollfd *fds, int max)
{
    struct ck_sender *s = arg;
    if (s->fd < 0 || max < 1)
        return 0;
    fds[0] = (struct pollfd){.fd = s->fd, .events = POLLIN};
    return 1;
}

static int64_t deadline_ms(void *arg)
{
    struct ck_sender *s = arg;
    if (s->stopped || s->pid)
        return -1;
    if (s->kicked)
        return ck_mono_ms();
    return s->again_at;
}

static void step(void *arg)
{
    struct ck_sender *s = arg;
    read_records(s);
    maybe_spawn(s);
}

int ck_sender_new(struct ck_loop *loop, const struct ck_sender_spec *spec, struct ck_state *state,
                  struct ck_sender **out)
{
    static const struct ck_loop_poller poller = {poll_fds, deadline_ms, step};
    struct ck_sender *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!s)
        return ck_error(CK_ENOMEM, "out of memory");
    s->spec = *spec;
    s->loop = loop;
    s->state = state;
    s->fd = -1;
    s->again_at = -1;
    ck_buf_init(&s->in, FRAME_MAX + FRAME_HEADER + 16384);
    int err;
    if (loop && (err = ck_loop_add_poller(loop, &poller, s, &s->h)) < 0) {
        ck_buf_release(&s->in);
        free(s);
        return err;
    }
    *out = s;
    return 0;
}

void ck_sender_kick(struct ck_sender *s)
{
    if (s && !s->stopped)
        s->kicked = true;
}

bool ck_sender_busy(const struct ck_sender *s)
{
    return s && (s->pid != 0 || (s->kicked && !s->stopped));
}

void ck_sender_pump(struct ck_sender *s, int timeout_ms)
{
    if (!s)
        return;
    maybe_spawn(s);
    if (s->fd < 0)
        return;
    struct pollfd p = {.fd = s->fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) > 0)
        read_records(s);
    maybe_spawn(s);
}

void ck_sender_stop(struct ck_sender *s, double grace)
{
    if (!s)
        return;
    s->stopped = true;
    s->kicked = false;
    s->again_at = -1;
    if (!s->pid)
        return;
    kill(s->pid, SIGTERM);
    int64_t end = ck_mono_ms() + (int64_t)(grace * 1000);
    bool killed = false;
    while (s->fd >= 0) {
        int64_t left = end - ck_mono_ms();
        if (left <= 0 && !killed) {
            char ev[64];
            event_name(ev, sizeof ev, s, "helper_killed");
            ck_warn(ev, "pid=%ld still running after %.3gs; what it was doing stays queued",
                    (long)s->pid, grace);
            kill(s->pid, SIGKILL);
            killed = true;
        }
        struct pollfd p = {.fd = s->fd, .events = POLLIN};
        poll(&p, 1, killed ? 1000 : (int)(left < 1000 ? left : 1000));
        read_records(s);
    }
}

void ck_sender_free(struct ck_sender *s)
{
    if (!s)
        return;
    ck_sender_stop(s, 0);
    if (s->loop)
        ck_loop_remove(s->loop, s->h);
    ck_buf_release(&s->in);
    free(s);
}

size_t ck_sender_fields(const char *data, size_t len, const char **f, size_t max)
{
    size_t n = 0, pos = 0;
    while (n < max && pos <= len) {
        f[n++] = data + pos;
        const char *z = memchr(data + pos, '\0', len - pos);
        if (!z)
            break;
        pos = (size_t)(z - data) + 1;
    }
    return n;
}
