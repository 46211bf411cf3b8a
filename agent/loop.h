/* The daemon's one event loop: epoll over file descriptors and timers
 * (timerfd). Single-threaded; every callback runs on the loop's thread and
 * must not block for long.
 *
 * Other modules plug in without knowing the watcher's internals:
 *
 *   ck_loop_add_fd(loop, listen_fd, EPOLLIN, on_accept, srv, &h);     the ops HTTP listener
 *   ck_loop_add_timer(loop, 1.0, 1.0, run_due_uploads, queue, &t);    "run what is due"
 *
 * A handler may remove itself or any other handler from inside a callback:
 * removed handlers are freed after the current batch of events. */
#ifndef CK_LOOP_H
#define CK_LOOP_H

#include <stdbool.h>
#include <stdint.h>

struct ck_loop;
struct ck_loop_handler; /* opaque: a registered fd or timer */

/* events: EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP as epoll reported them. */
typedef void (*ck_loop_fd_fn)(struct ck_loop *loop, int fd, uint32_t events, void *arg);
typedef void (*ck_loop_timer_fn)(struct ck_loop *loop, void *arg);

/* Heap object. */
int ck_loop_new(struct ck_loop **out);
/* Frees every handler and closes the timers' fds (never the fds added with add_fd). */
void ck_loop_free(struct ck_loop *loop);

/* Calls fn when fd is ready for events (EPOLLIN, EPOLLOUT). fd stays the
 * caller's: remove it before closing it. *out (may be NULL) is the handle. */
int ck_loop_add_fd(struct ck_loop *loop, int fd, uint32_t events, ck_loop_fd_fn fn, void *arg,
                   struct ck_loop_handler **out);
int ck_loop_mod_fd(struct ck_loop *loop, struct ck_loop_handler *h, uint32_t events);

/* A timer: first fires after first seconds (0: disarmed), then every interval
 * seconds (0: once). Missed expirations are folded into one call. */
int ck_loop_add_timer(struct ck_loop *loop, double first, double interval, ck_loop_timer_fn fn,
                      void *arg, struct ck_loop_handler **out);
/* Re-arms a timer (first 0 disarms it). */
int ck_loop_timer_set(struct ck_loop *loop, struct ck_loop_handler *h, double first,
                      double interval);

/* A module that keeps its own changing set of fds and one deadline (the ops
 * HTTP endpoint, exec hooks): before each wait the loop asks for its fds
 * (up to max, as struct pollfd) and its deadline (monotonic ms, -1: none);
 * step is called when one of them is ready or the deadline has passed. */
struct pollfd;
struct ck_loop_poller {
    int (*fds)(void *arg, struct pollfd *fds, int max);
    int64_t (*deadline_ms)(void *arg);
    void (*step)(void *arg);
};
/* ops is copied. */
int ck_loop_add_poller(struct ck_loop *loop, const struct ck_loop_poller *ops, void *arg,
                       struct ck_loop_handler **out);

/* Unregisters a handler (fd, timer or poller); h may be NULL. */
void ck_loop_remove(struct ck_loop *loop, struct ck_loop_handler *h);

/* Runs until ck_loop_stop. Returns 0, or an error when epoll itself fails. */
int ck_loop_run(struct ck_loop *loop);
/* Makes ck_loop_run return after the current batch of events. */
void ck_loop_stop(struct ck_loop *loop);
bool ck_loop_is_stopping(const struct ck_loop *loop);

#endif
