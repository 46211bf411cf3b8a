#include "agent/loop.h"
#include "common/clock.h"
#include "common/error.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_EVENTS 64
#define POLLER_MAX_FDS 64

struct ck_loop_handler {
    int fd;
    bool is_timer;
    bool is_poller;
    bool dead;
    bool ready;                   /* poller: one of its fds was reported */
    struct ck_loop_poller poller; /* poller: its functions */
    int pfds[POLLER_MAX_FDS];     /* poller: the fds registered last time */
    uint32_t pevents[POLLER_MAX_FDS];
    int npfds;
    ck_loop_fd_fn fd_fn;
    ck_loop_timer_fn timer_fn;
    void *arg;
    struct ck_loop_handler *next; /* all handlers, or the graveyard */
};

struct ck_loop {
    int epfd;
    bool stopping;
    struct ck_loop_handler *live;
    struct ck_loop_handler *dead; /* freed after the current batch */
};

int ck_loop_new(struct ck_loop **out)
{
    struct ck_loop *l = calloc(1, sizeof *l);
    if (!l)
        return ck_error(CK_ENOMEM, "out of memory");
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (l->epfd < 0) {
        free(l);
        return ck_error_os(CK_EIO, "cannot create an epoll instance");
    }
    *out = l;
    return 0;
}

static void free_list(struct ck_loop_handler *h)
{
    while (h) {
        struct ck_loop_handler *next = h->next;
        if (h->is_timer && h->fd >= 0)
            close(h->fd);
        free(h);
        h = next;
    }
}

void ck_loop_free(struct ck_loop *loop)
{
    if (!loop)
        return;
    free_list(loop->live);
    free_list(loop->dead);
    close(loop->epfd);
    free(loop);
}

static int add(struct ck_loop *loop, struct ck_loop_handler *h, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = h};
    if (epoll_ctl(loop->epfd, EPOLL_CTL_ADD, h->fd, &ev) < 0)
        return ck_error_os(CK_EIO, "cannot add fd %d to the event loop", h->fd);
    h->next = loop->live;
    loop->live = h;
    return 0;
}

int ck_loop_add_fd(struct ck_loop *loop, int fd, uint32_t events, ck_loop_fd_fn fn, void *arg,
                   struct ck_loop_handler **out)
{
    struct ck_loop_handler *h = calloc(1, sizeof *h);
    if (!h)
        return ck_error(CK_ENOMEM, "out of memory");
    h->fd = fd;
    h->fd_fn = fn;
    h->arg = arg;
    int err = add(loop, h, events);
    if (err < 0) {
        free(h);
        return err;
    }
    if (out)
        *out = h;
    return 0;
}

int ck_loop_mod_fd(struct ck_loop *loop, struct ck_loop_handler *h, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = h};
    if (epoll_ctl(loop->epfd, EPOLL_CTL_MOD, h->fd, &ev) < 0)
        return ck_error_os(CK_EIO, "cannot change fd %d in the event loop", h->fd);
    return 0;
}

static struct timespec to_ts(double s)
{
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L)
        ts.tv_nsec = 999999999L;
    return ts;
}

int ck_loop_timer_set(struct ck_loop *loop, struct ck_loop_handler *h, double first,
                      double interval)
{
    (void)loop;
    struct itimerspec its = {.it_interval = to_ts(interval), .it_value = to_ts(first)};
    if (first > 0 && its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
        its.it_value.tv_nsec = 1; /* 0 would disarm: fire as soon as possible */
    if (timerfd_settime(h->fd, 0, &its, NULL) < 0)
        return ck_error_os(CK_EIO, "cannot arm a timer");
    return 0;
}

int ck_loop_add_timer(struct ck_loop *loop, double first, double interval, ck_loop_timer_fn fn,
                      void *arg, struct ck_loop_handler **out)
{
    struct ck_loop_handler *h = calloc(1, sizeof *h);
    if (!h)
        return ck_error(CK_ENOMEM, "out of memory");
    h->is_timer = true;
    h->timer_fn = fn;
    h->arg = arg;
    h->fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (h->fd < 0) {
        free(h);
        return ck_error_os(CK_EIO, "cannot create a timer");
    }
    int err = ck_loop_timer_set(loop, h, first, interval);
    if (err == 0)
        err = add(loop, h, EPOLLIN);
    if (err < 0) {
        close(h->fd);
        free(h);
        return err;
    }
    if (out)
        *out = h;
    return 0;
}

void ck_loop_remove(struct ck_loop *loop, struct ck_loop_handler *h)
{
    if (!h || h->dead)
        return;
    if (h->is_poller) {
        for (int i = 0; i < h->npfds; i++)
            epoll_ctl(loop->epfd, EPOLL_CTL_DEL, h->pfds[i], NULL);
        h->npfds = 0;
    } else {
        epoll_ctl(loop->epfd, EPOLL_CTL_DEL, h->fd, NULL);
    }
    for (struct ck_loop_handler **p = &loop->live; *p; p = &(*p)->next)
        if (*p == h) {
            *p = h->next;
            break;
        }
    h->dead = true;
    h->next = loop->dead;
    loop->dead = h;
}

void ck_loop_stop(struct ck_loop *loop)
{
    loop->stopping = true;
}

bool ck_loop_is_stopping(const struct ck_loop *loop)
{
    return loop->stopping;
}

int ck_loop_add_poller(struct ck_loop *loop, const struct ck_loop_poller *ops, void *arg,
                       struct ck_loop_handler **out)
{
    struct ck_loop_handler *h = calloc(1, sizeof *h);
    if (!h)
        return ck_error(CK_ENOMEM, "out of memory");
    h->is_poller = true;
    h->fd = -1;
    h->poller = *ops;
    h->arg = arg;
    h->next = loop->live;
    loop->live = h;
    if (out)
        *out = h;
    return 0;
}

static bool fd_owned_by_other(struct ck_loop *loop, int fd)
{
    for (struct ck_loop_handler *h = loop->live; h; h = h->next)
        if (!h->is_poller && h->fd == fd)
            return true;
    return false;
}

static uint32_t to_epoll(short ev)
{
    return (ev & POLLIN ? EPOLLIN : 0) | (ev & POLLOUT ? EPOLLOUT : 0);
}

/* Brings the poller's fds in epoll in line with what it wants now. A fd it
 * closed has left epoll by itself; its number may belong to someone else now. */
static void sync_poller(struct ck_loop *loop, struct ck_loop_handler *h)
{
    struct pollfd want[POLLER_MAX_FDS];
    int n = h->poller.fds(h->arg, want, POLLER_MAX_FDS);
    if (n < 0)
        n = 0;
    for (int i = 0; i < h->npfds; i++) {
        bool kept = false;
        for (int j = 0; j < n && !kept; j++)
            kept = want[j].fd == h->pfds[i];
        if (!kept && !fd_owned_by_other(loop, h->pfds[i]))
            epoll_ctl(loop->epfd, EPOLL_CTL_DEL, h->pfds[i], NULL);
    }
    int old_n = h->npfds;
    int old_fds[POLLER_MAX_FDS];
    memcpy(old_fds, h->pfds, sizeof old_fds);
    h->npfds = 0;
    for (int j = 0; j < n; j++) {
        uint32_t ev = to_epoll(want[j].events);
        struct epoll_event e = {.events = ev, .data.ptr = h};
        bool known = false;
        for (int i = 0; i < old_n; i++)
            known = known || old_fds[i] == want[j].fd;
        /* A number it had may be a new fd: the old one closed (leaving epoll)
         * and a new one opened under the same number since the last sync (a
         * helper ended and the next started in one step). MOD finds no entry
         * then, and the fd is added again. */
        int op = known ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
        if (epoll_ctl(loop->epfd, op, want[j].fd, &e) < 0)
            epoll_ctl(loop->epfd, errno == ENOENT ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, want[j].fd,
                      &e);
        h->pfds[h->npfds] = want[j].fd;
        h->pevents[h->npfds++] = ev;
    }
}

/* Syncs every poller and returns the epoll timeout their deadlines allow. */
static int prepare_pollers(struct ck_loop *loop)
{
    int timeout = -1;
    double now_ms = ck_mono_s() * 1000;
    for (struct ck_loop_handler *h = loop->live; h; h = h->next) {
        if (!h->is_poller)
            continue;
        sync_poller(loop, h);
        int64_t d = h->poller.deadline_ms ? h->poller.deadline_ms(h->arg) : -1;
        if (d < 0)
            continue;
        int t = d <= now_ms ? 0 : (int)(d - now_ms) + 1;
        if (timeout < 0 || t < timeout)
            timeout = t;
    }
    return timeout;
}

static void step_pollers(struct ck_loop *loop)
{
    double now_ms = ck_mono_s() * 1000;
    for (struct ck_loop_handler *h = loop->live; h; h = h->next) {
        if (!h->is_poller || h->dead)
            continue;
        int64_t d = h->poller.deadline_ms ? h->poller.deadline_ms(h->arg) : -1;
        if (h->ready || (d >= 0 && d <= now_ms)) {
            h->ready = false;
            h->poller.step(h->arg);
        }
    }
}

static void dispatch(struct ck_loop *loop, struct ck_loop_handler *h, uint32_t events)
{
    if (h->dead)
        return;
    if (h->is_poller) {
        h->ready = true;
        return;
    }
    if (h->is_timer) {
        uint64_t n;
        if (read(h->fd, &n, sizeof n) != (ssize_t)sizeof n)
            return; /* re-armed or read already: nothing expired */
        h->timer_fn(loop, h->arg);
    } else {
        h->fd_fn(loop, h->fd, events, h->arg);
    }
}

int ck_loop_run(struct ck_loop *loop)
{
    struct epoll_event evs[MAX_EVENTS];
    while (!loop->stopping) {
        int n = epoll_wait(loop->epfd, evs, MAX_EVENTS, prepare_pollers(loop));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return ck_error_os(CK_EIO, "epoll_wait failed");
        }
        for (int i = 0; i < n; i++)
            dispatch(loop, evs[i].data.ptr, evs[i].events);
        step_pollers(loop);
        free_list(loop->dead);
        loop->dead = NULL;
    }
    return 0;
}
