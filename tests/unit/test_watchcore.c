/* The watcher's parts: the event loop, the path map, settle tracking, the
 * filesystem table. The whole watcher is tested end to end (test_watch.py). */
#include "test_main.h"
#include "common/clock.h"

#include "agent/fswatch.h"
#include "agent/loop.h"
#include "agent/pathmap.h"
#include "agent/settle.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- loop ---- */

struct trace {
    struct ck_loop_handler *other;
    int fd_calls, timer_calls, other_calls, steps;
    char order[16];
    size_t n;
};

static void on_timer_write(struct ck_loop *loop, void *arg)
{
    int *fds = arg;
    (void)loop;
    assert_int_equal(write(fds[1], "x", 1), 1);
}

static void on_readable(struct ck_loop *loop, int fd, uint32_t events, void *arg)
{
    struct trace *t = arg;
    char c;
    assert_true(events & EPOLLIN);
    assert_int_equal(read(fd, &c, 1), 1);
    t->fd_calls++;
    ck_loop_stop(loop);
}

static void loop_fd_and_timer(void **state)
{
    (void)state;
    struct ck_loop *loop;
    int fds[2];
    struct trace t = {0};
    assert_int_equal(pipe2(fds, O_NONBLOCK | O_CLOEXEC), 0);
    assert_int_equal(ck_loop_new(&loop), 0);
    assert_int_equal(ck_loop_add_fd(loop, fds[0], EPOLLIN, on_readable, &t, NULL), 0);
    assert_int_equal(ck_loop_add_timer(loop, 0.01, 0, on_timer_write, fds, NULL), 0);
    assert_int_equal(ck_loop_run(loop), 0); /* returns: the fd callback stopped it */
    assert_int_equal(t.fd_calls, 1);
    assert_true(ck_loop_is_stopping(loop));
    ck_loop_free(loop);
    close(fds[0]);
    close(fds[1]);
}

static void count_timer(struct ck_loop *loop, void *arg)
{
    struct trace *t = arg;
    if (++t->timer_calls == 3)
        ck_loop_stop(loop);
}

static void loop_periodic_timer_and_rearm(void **state)
{
    (void)state;
    struct ck_loop *loop;
    struct ck_loop_handler *h;
    struct trace t = {0};
    assert_int_equal(ck_loop_new(&loop), 0);
    assert_int_equal(ck_loop_add_timer(loop, 0, 0, count_timer, &t, &h), 0); /* disarmed */
    assert_int_equal(ck_loop_timer_set(loop, h, 0.001, 0.001), 0);
    assert_int_equal(ck_loop_run(loop), 0);
    assert_int_equal(t.timer_calls, 3);
    ck_loop_free(loop);
}

/* Both fds are readable in the same batch; whichever runs first removes the other. */
static void remove_other(struct ck_loop *loop, int fd, uint32_t events, void *arg)
{
    struct trace *t = arg;
    char c;
    (void)events;
    assert_int_equal(read(fd, &c, 1), 1);
    t->fd_calls++;
    ck_loop_remove(loop, t->other);
    t->other = NULL;
    ck_loop_stop(loop);
}

static void loop_remove_inside_a_callback(void **state)
{
    (void)state;
    struct ck_loop *loop;
    int a[2], b[2];
    struct ck_loop_handler *ha, *hb;
    struct trace ta = {0}, tb = {0};
    assert_int_equal(pipe2(a, O_NONBLOCK), 0);
    assert_int_equal(pipe2(b, O_NONBLOCK), 0);
    assert_int_equal(write(a[1], "x", 1), 1);
    assert_int_equal(write(b[1], "x", 1), 1);
    assert_int_equal(ck_loop_new(&loop), 0);
    assert_int_equal(ck_loop_add_fd(loop, a[0], EPOLLIN, remove_other, &ta, &ha), 0);
    assert_int_equal(ck_loop_add_fd(loop, b[0], EPOLLIN, remove_other, &tb, &hb), 0);
    ta.other = hb;
    tb.other = ha;
    assert_int_equal(ck_loop_run(loop), 0);
    /* exactly one ran: the other was removed before its turn (ASan: not used after free) */
    assert_int_equal(ta.fd_calls + tb.fd_calls, 1);
    ck_loop_free(loop);
    close(a[0]), close(a[1]), close(b[0]), close(b[1]);
}

struct pollme {
    int fd;
    int64_t deadline;
    int steps;
    struct ck_loop *loop;
};

static int pm_fds(void *arg, struct pollfd *fds, int max)
{
    struct pollme *p = arg;
    if (max < 1 || p->fd < 0)
        return 0;
    fds[0] = (struct pollfd){p->fd, POLLIN, 0};
    return 1;
}

static int64_t pm_deadline(void *arg)
{
    return ((struct pollme *)arg)->deadline;
}

static void pm_step(void *arg)
{
    struct pollme *p = arg;
    char c;
    p->steps++;
    if (p->fd >= 0 && read(p->fd, &c, 1) == 1)
        p->fd = -1; /* done with the fd: the next step comes from the deadline */
    else
        p->deadline = -1;
    if (p->steps == 2)
        ck_loop_stop(p->loop);
    else
        p->deadline = (int64_t)(ck_mono_s() * 1000) + 5;
}

/* A poller that, on its first step, closes its pipe and opens a new one under
 * the same fd number with a byte waiting (as a helper ending and the next one
 * starting in one step): the loop must report the new fd too. */
struct reuse {
    int fd, wfd, steps;
    struct ck_loop *loop;
};

static int ru_fds(void *arg, struct pollfd *fds, int max)
{
    struct reuse *r = arg;
    if (max < 1)
        return 0;
    fds[0] = (struct pollfd){r->fd, POLLIN, 0};
    return 1;
}

static void ru_step(void *arg)
{
    struct reuse *r = arg;
    char c;
    if (read(r->fd, &c, 1) != 1)
        return;
    if (++r->steps == 2) {
        ck_loop_stop(r->loop);
        return;
    }
    int p[2];
    assert_int_equal(pipe(p), 0);
    close(r->wfd);
    assert_int_equal(dup2(p[0], r->fd), r->fd); /* the same number, a new pipe */
    close(p[0]);
    r->wfd = p[1];
    assert_int_equal(write(r->wfd, "y", 1), 1);
}

static void on_give_up(struct ck_loop *loop, void *arg)
{
    (void)arg;
    ck_loop_stop(loop);
}

static void loop_poller_fd_number_reused(void **state)
{
    (void)state;
    struct ck_loop *loop;
    struct ck_loop_handler *h, *t;
    int p[2];
    assert_int_equal(ck_loop_new(&loop), 0);
    assert_int_equal(pipe(p), 0);
    struct reuse r = {p[0], p[1], 0, loop};
    static const struct ck_loop_poller ops = {ru_fds, NULL, ru_step};
    assert_int_equal(ck_loop_add_poller(loop, &ops, &r, &h), 0);
    assert_int_equal(ck_loop_add_timer(loop, 5, 0, on_give_up, NULL, &t), 0);
    assert_int_equal(write(r.wfd, "x", 1), 1);
    assert_int_equal(ck_loop_run(loop), 0);
    assert_int_equal(r.steps, 2); /* not 1: the byte in the new pipe was seen */
    ck_loop_free(loop);
    close(r.fd), close(r.wfd);
}

static void loop_poller_fds_and_deadline(void **state)
{
    (void)state;
    static const struct ck_loop_poller ops = {pm_fds, pm_deadline, pm_step};
    struct ck_loop *loop;
    int fds[2];
    assert_int_equal(pipe2(fds, O_NONBLOCK), 0);
    assert_int_equal(write(fds[1], "x", 1), 1);
    assert_int_equal(ck_loop_new(&loop), 0);
    struct pollme p = {fds[0], -1, 0, loop};
    assert_int_equal(ck_loop_add_poller(loop, &ops, &p, NULL), 0);
    assert_int_equal(ck_loop_run(loop), 0);
    assert_int_equal(p.steps, 2); /* once readable, once by its deadline */
    ck_loop_free(loop);
    close(fds[0]);
    close(fds[1]);
}

/* ---- pathmap ---- */

static void pathmap_put_get_del_tree(void **state)
{
    (void)state;
    struct ck_pathmap m;
    struct ck_pathmap_entry *e;
    bool created;
    char key[64];
    ck_pathmap_init(&m, NULL);
    const char *keys[] = {"a", "a/b", "a/b/c", "ab", "b/a"};
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(ck_pathmap_put(&m, keys[i], sizeof *e, (void **)&e, &created), 0);
        assert_true(created);
    }
    assert_int_equal(ck_pathmap_put(&m, "a/b", sizeof *e, (void **)&e, &created), 0);
    assert_false(created);
    for (int i = 0; i < 1000; i++) { /* growth keeps every key */
        snprintf(key, sizeof key, "x/%d", i);
        assert_int_equal(ck_pathmap_put(&m, key, sizeof *e, (void **)&e, NULL), 0);
    }
    assert_int_equal(m.n, 1005);
    assert_int_equal(ck_pathmap_del_tree(&m, "a"), 3);
    assert_null(ck_pathmap_get(&m, "a/b/c"));
    assert_non_null(ck_pathmap_get(&m, "ab"));
    assert_non_null(ck_pathmap_get(&m, "b/a"));
    assert_non_null(ck_pathmap_get(&m, "x/999"));
    ck_pathmap_del(&m, "x/999");
    assert_null(ck_pathmap_get(&m, "x/999"));
    size_t seen = 0;
    struct ck_pathmap_iter it;
    ck_pathmap_iter_init(&it, &m);
    while ((e = ck_pathmap_next(&it)))
        seen++;
    assert_int_equal(seen, m.n);
    ck_pathmap_release(&m);
}

/* ---- settle ---- */

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "ab");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void settle_waits_for_the_window(void **state)
{
    (void)state;
    char dir[4000];
    struct ck_settle *s;
    size_t n;
    double next;
    ck_test_tmpdir(dir, "settle_window");
    write_file(dir, "epoch_1.pt", "abc");
    assert_int_equal(ck_settle_new(&s, dir, 30.0, true), 0);
    assert_false(ck_settle_is_settled(s, "epoch_1.pt")); /* unknown: touched */
    assert_int_equal(ck_settle_npending(s), 1);
    double now = ck_mono_s();
    assert_int_equal(ck_settle_check(s, now, &n, &next), 0);
    assert_int_equal(n, 0); /* written just now: 30 s to go */
    assert_true(next > 20 && next <= 30);
    assert_int_equal(ck_settle_check(s, now + 31, &n, &next), 0);
    assert_int_equal(n, 1);
    assert_true(next < 0);
    assert_true(ck_settle_is_settled(s, "epoch_1.pt"));
    /* written again: it waits again */
    write_file(dir, "epoch_1.pt", "more");
    assert_false(ck_settle_is_settled(s, "epoch_1.pt"));
    assert_int_equal(ck_settle_npending(s), 1);
    ck_settle_free(s);
}

static void settle_forgets_what_vanishes(void **state)
{
    (void)state;
    char dir[4000], path[4200];
    struct ck_settle *s;
    size_t n;
    double next;
    ck_test_tmpdir(dir, "settle_vanish");
    write_file(dir, "epoch_2.pt", "abc");
    assert_int_equal(ck_settle_new(&s, dir, 0, true), 0);
    assert_int_equal(ck_settle_touch(s, "epoch_2.pt"), 0);
    snprintf(path, sizeof path, "%s/epoch_2.pt", dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(ck_settle_check(s, ck_mono_s() + 1, &n, &next), 0);
    assert_int_equal(n, 0);
    assert_int_equal(ck_settle_npending(s), 0);
    assert_int_equal(ck_settle_nsettled(s), 0);
    /* a folder gone: everything below it is forgotten */
    write_file(dir, "x", "1");
    assert_int_equal(ck_settle_touch(s, "x"), 0);
    ck_settle_forget(s, "x");
    assert_int_equal(ck_settle_npending(s), 0);
    ck_settle_free(s);
}

static void settle_waits_while_a_process_writes(void **state)
{
    (void)state;
    char dir[4000], path[4200];
    struct ck_settle *s;
    size_t n;
    double next;
    int go[2], done[2];
    ck_test_tmpdir(dir, "settle_writer");
    write_file(dir, "epoch_3.pt", "half");
    snprintf(path, sizeof path, "%s/epoch_3.pt", dir);
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(done), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* a writer holding the file open */
        int fd = open(path, O_WRONLY | O_APPEND);
        char c;
        if (write(go[1], "r", 1) != 1 || read(done[0], &c, 1) != 1)
            _exit(1);
        close(fd);
        _exit(0);
    }
    char c;
    assert_int_equal(read(go[0], &c, 1), 1);
    assert_true(ck_settle_has_writer(path));
    assert_int_equal(ck_settle_new(&s, dir, 0, true), 0);
    assert_int_equal(ck_settle_touch(s, "epoch_3.pt"), 0);
    assert_int_equal(ck_settle_check(s, ck_mono_s() + 1, &n, &next), 0);
    assert_int_equal(n, 0); /* unchanged and old enough, but still open for writing */
    assert_true(next > 0);
    /* the same, with the check switched off */
    ck_settle_configure(s, 0, false);
    assert_int_equal(ck_settle_check(s, ck_mono_s() + 100, &n, &next), 0);
    assert_int_equal(n, 1);
    ck_settle_configure(s, 0, true);
    assert_int_equal(write(done[1], "x", 1), 1);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(status, 0);
    assert_false(ck_settle_has_writer(path));
    assert_int_equal(ck_settle_touch(s, "epoch_3.pt"), 0);
    assert_int_equal(ck_settle_check(s, ck_mono_s() + 1, &n, &next), 0);
    assert_int_equal(n, 1);
    ck_settle_free(s);
    close(go[0]), close(go[1]), close(done[0]), close(done[1]);
}

/* ---- filesystems ---- */

static void remote_filesystems_are_polled(void **state)
{
    (void)state;
    const char *name = NULL;
    assert_true(ck_fswatch_fs_is_remote(0x6969, &name));
    assert_string_equal(name, "nfs");
    assert_true(ck_fswatch_fs_is_remote(0x0BD00BD0, &name));
    assert_string_equal(name, "lustre");
    assert_true(ck_fswatch_fs_is_remote((long)(int)0xFF534D42, &name)); /* f_type may be negative */
    assert_string_equal(name, "cifs");
    assert_true(ck_fswatch_fs_is_remote(0x65735546, &name));
    assert_string_equal(name, "fuse");
    assert_false(ck_fswatch_fs_is_remote(0xEF53, NULL));     /* ext4 */
    assert_false(ck_fswatch_fs_is_remote(0x01021994, NULL)); /* tmpfs */
    assert_false(ck_fswatch_fs_is_remote(0x58465342, NULL)); /* xfs */
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(loop_fd_and_timer),
    cmocka_unit_test(loop_periodic_timer_and_rearm),
    cmocka_unit_test(loop_remove_inside_a_callback),
    cmocka_unit_test(loop_poller_fds_and_deadline),
    cmocka_unit_test(loop_poller_fd_number_reused),
    cmocka_unit_test(pathmap_put_get_del_tree),
    cmocka_unit_test(settle_waits_for_the_window),
    cmocka_unit_test(settle_forgets_what_vanishes),
    cmocka_unit_test(settle_waits_while_a_process_writes),
    cmocka_unit_test(remote_filesystems_are_polled),
};
CK_TEST_MAIN(tests)
