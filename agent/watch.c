#include "agent/watch.h"
#include "agent/config_check.h"
#include "agent/discover.h"
#include "agent/fswatch.h"
#include "agent/lock.h"
#include "agent/notify.h"
#include "agent/upload_worker.h"
#include "agent/loop.h"
#include "agent/ops.h"
#include "agent/pathmap.h"
#include "agent/scan.h"
#include "agent/sender.h"
#include "agent/settle.h"
#include "agent/state.h"
#include "agent/sweep.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* Passes in a row before other events get their turn. */
#define MAX_ROUNDS 8
/* A webhook helper's round ends by then; what is still due starts another. */
#define WEBHOOK_ROUND_S 60

struct admitted {
    char *ref;    /* owned */
    char **files; /* owned */
    size_t nfiles;
};

struct watcher {
    const struct ck_watch_opts *o;
    struct ck_config cfg;
    struct ck_loop *loop;
    struct ck_lock lock;
    struct ck_state st;
    struct ck_settle *settle;
    struct ck_fswatch *fs;
    struct ck_ops *ops;
    struct ck_hooks *hooks; /* webhooks and exec hooks */
    bool announced_start;   /* agent.started was emitted: agent.stopping follows */
    /* the network work runs in helper processes (agent/sender.h) */
    struct ck_upload_worker *up; /* upload.stores */
    struct ck_sender *wh;        /* webhook deliveries */
    atomic_bool wh_abort;        /* in the webhook helper: stop between attempts */
    int64_t wh_drain_until;      /* ck_mono_ms: a webhook helper started now ends by then */
    char db_path[PATH_MAX];      /* the state database, for the helpers' own connections */
    struct ck_loop_handler *sig_h, *settle_t, *reconcile_t, *grace_t, *ops_h, *hooks_h;
    int sfd;
    sigset_t old_mask;
    struct ck_pathmap renamed; /* folders renamed into place: complete */
    struct admitted *admitted;
    size_t nadmitted;
    bool want_pass;
    bool want_full; /* the next pass looks at everything (else: where things changed) */
    bool ready;     /* the first pass is done */
    bool ended;     /* the training ended: stop */
    size_t passes;
    enum ck_pmf_status status;
    /* the wrapped command */
    pid_t child; /* 0: none, or reaped */
    bool child_started;
    int child_code;   /* its exit code (128+N for signal N) */
    bool terminating; /* SIGTERM/SIGINT came */
    int exit_code;
};

/* ---- config ---- */

void ck_watch_apply_flags(const struct ck_watch_opts *o, struct ck_config *cfg)
{
    if (o->poll >= 0)
        cfg->watch_poll = o->poll;
    if (o->poll_interval >= 0)
        cfg->watch_poll_interval = o->poll_interval;
    if (o->settle >= 0)
        cfg->watch_settle = o->settle;
    if (o->grace_period >= 0)
        cfg->watch_grace_period = o->grace_period;
    if (o->listen) { /* a failed strdup leaves no listener rather than a wrong one */
        free(cfg->listen);
        cfg->listen = strdup(o->listen);
    }
}

int ck_watch_check_config(const struct ck_config *cfg)
{
    if (cfg->watch_poll_interval < 0.01)
        return ck_error(CK_ECONFIG, "watch.poll_interval must be at least 10ms");
    if (cfg->watch_settle > 3600)
        return ck_error(CK_ECONFIG, "watch.settle must be at most 1h");
    if (cfg->watch_reconcile_interval > 0 && cfg->watch_reconcile_interval < 1)
        return ck_error(CK_ECONFIG, "watch.reconcile_interval must be 0 (never) or at least 1s");
    return 0;
}

/* ---- which paths matter ---- */

static bool any_component_ignored(const struct ck_config *cfg, const char *rel)
{
    char part[NAME_MAX + 1];
    for (const char *p = rel; *p;) {
        size_t n = strcspn(p, "/");
        snprintf(part, sizeof part, "%.*s", (int)(n < NAME_MAX ? n : NAME_MAX), p);
        for (size_t i = 0; i < cfg->ignore.n; i++)
            if (ck_glob_match(cfg->ignore.items[i], part))
                return true;
        p += n;
        if (*p == '/')
            p++;
    }
    return false;
}

static bool pattern_hits(const struct ck_config *cfg, const char *name, const char *rel,
                         bool folder)
{
    char pat[1024];
    for (size_t i = 0; i < cfg->patterns.n; i++) {
        const char *p = cfg->patterns.items[i];
        size_t n = strlen(p);
        bool is_folder = n > 0 && p[n - 1] == '/';
        if (is_folder != folder)
            continue;
        snprintf(pat, sizeof pat, "%.*s", (int)(is_folder ? n - 1 : n), p);
        if (ck_glob_match(pat, strchr(pat, '/') ? rel : name))
            return true;
    }
    return false;
}

/* Whether a change to rel may change what a pass does: a checkpoint file, a
 * part of a TF bundle, anything inside a folder checkpoint, DeepSpeed's
 * 'latest', a marker. Our own outputs are not. A wrong yes costs a pass; a
 * wrong no waits for the reconciliation pass. */
static bool relevant(const struct ck_config *cfg, const char *rel)
{
    const char *name = ck_basename(rel);
    if (!strcmp(rel, "metadata.yaml") || !strcmp(rel, "data/build_parameters.yaml") ||
        !strncmp(rel, ".ckptd/", 7) || !strncmp(rel, "data/initialisation/", 20))
        return false;
    if (!strncmp(rel, "data/checkpoints/", 17) && strlen(name) > 8 &&
        !strcmp(name + strlen(name) - 8, ".md5sums"))
        return false;
    if ((cfg->finished_marker && !strcmp(rel, cfg->finished_marker)) ||
        (cfg->failed_marker && !strcmp(rel, cfg->failed_marker)))
        return true;
    if (any_component_ignored(cfg, rel))
        return false;
    if (!strcmp(name, "latest") || pattern_hits(cfg, name, rel, false))
        return true;
    /* a TF bundle part: PREFIX.index, PREFIX.data-NNNNN-of-MMMMM */
    char prefix[PATH_MAX];
    const char *cut = strstr(name, ".data-");
    size_t n = strlen(name);
    if (!cut && n > 6 && !strcmp(name + n - 6, ".index"))
        cut = name + n - 6;
    if (cut) {
        size_t dir_len = (size_t)(name - rel);
        snprintf(prefix, sizeof prefix, "%.*s", (int)(dir_len + (size_t)(cut - name)), rel);
        if (pattern_hits(cfg, ck_basename(prefix), prefix, false))
            return true;
    }
    /* inside a folder checkpoint: some folder above it matches */
    for (const char *p = strchr(rel, '/'); p; p = strchr(p + 1, '/')) {
        snprintf(prefix, sizeof prefix, "%.*s", (int)(p - rel), rel);
        if (pattern_hits(cfg, ck_basename(prefix), prefix, true))
            return true;
    }
    return false;
}

static bool folder_checkpoint(const struct ck_config *cfg, const char *rel)
{
    return !any_component_ignored(cfg, rel) && pattern_hits(cfg, ck_basename(rel), rel, true);
}

/* ---- passes ---- */

static void arm_settle(struct watcher *w, double delay)
{
    ck_loop_timer_set(w->loop, w->settle_t, delay < 0 ? 0 : delay > 0 ? delay : 1e-9, 0);
}

static void kick(struct watcher *w)
{
    w->want_pass = true;
    w->want_full = true;
    arm_settle(w, 0);
}

/* The folder a targeted pass lists to find rel's checkpoint: the one holding
 * the folder checkpoint rel is in, else rel's own folder ("" the top). */
static void scope_of(const struct ck_config *cfg, const char *rel, char *out, size_t outsz)
{
    char prefix[PATH_MAX];
    for (const char *p = strchr(rel, '/'); p; p = strchr(p + 1, '/')) {
        snprintf(prefix, sizeof prefix, "%.*s", (int)(p - rel), rel);
        if (pattern_hits(cfg, ck_basename(prefix), prefix, true)) {
            ck_dirname(out, outsz, prefix);
            goto done;
        }
    }
    ck_dirname(out, outsz, rel);
done:
    if (!strcmp(out, "."))
        out[0] = '\0';
}

struct scopes {
    const struct ck_config *cfg;
    struct ck_pathmap set;
    char **list; /* borrowed from set's keys */
    size_t n;
    int err;
};

static void add_scope(void *arg, const char *rel)
{
    struct scopes *sc = arg;
    char dir[PATH_MAX];
    struct ck_pathmap_entry *e;
    bool created;
    scope_of(sc->cfg, rel, dir, sizeof dir);
    if (sc->err || ck_pathmap_put(&sc->set, dir, sizeof *e, (void **)&e, &created) < 0) {
        sc->err = CK_ENOMEM;
        return;
    }
    if (!created)
        return;
    char **l = realloc(sc->list, (sc->n + 1) * sizeof *l);
    if (!l) {
        sc->err = CK_ENOMEM;
        return;
    }
    sc->list = l;
    l[sc->n++] = e->key;
}

static bool admit(void *arg, const struct ck_candidate *c)
{
    struct watcher *w = arg;
    bool complete = c->complete || (c->kind == CK_CAND_DIR && c->nfiles > 0 &&
                                    ck_pathmap_get(&w->renamed, c->rel) != NULL);
    if (!complete)
        return false;
    bool ok = true;
    for (size_t i = 0; i < c->nfiles; i++)
        if (!ck_settle_is_settled(w->settle, c->files[i]))
            ok = false; /* looked at all the same: each is touched when unknown */
    if (!ok)
        return false;
    struct admitted *p = realloc(w->admitted, (w->nadmitted + 1) * sizeof *p);
    if (!p)
        return false;
    w->admitted = p;
    struct admitted *a = &p[w->nadmitted];
    a->ref = strdup(c->ref);
    a->files = calloc(c->nfiles ? c->nfiles : 1, sizeof *a->files);
    a->nfiles = 0;
    if (!a->ref || !a->files) {
        free(a->ref);
        free(a->files);
        return false;
    }
    for (size_t i = 0; i < c->nfiles; i++)
        if ((a->files[a->nfiles] = strdup(c->files[i])))
            a->nfiles++;
    if (c->kind == CK_CAND_DIR) {
        /* remember the folder, to forget its rename once registered */
        char **f = realloc(a->files, (a->nfiles + 1) * sizeof *f);
        if (f) {
            a->files = f;
            if ((f[a->nfiles] = strdup(c->rel)))
                a->nfiles++;
        }
    }
    w->nadmitted++;
    return true;
}

static void forget_registered(struct watcher *w, const struct ck_scan_result *res)
{
    for (size_t i = 0; i < w->nadmitted; i++) {
        struct admitted *a = &w->admitted[i];
        bool registered = false;
        for (size_t r = 0; r < res->nregistered && !registered; r++)
            registered = !strcmp(res->registered[r], a->ref);
        for (size_t f = 0; f < a->nfiles; f++) {
            if (registered) {
                ck_settle_forget(w->settle, a->files[f]);
                ck_pathmap_del(&w->renamed, a->files[f]);
            }
            free(a->files[f]);
        }
        free(a->files);
        free(a->ref);
    }
    free(w->admitted);
    w->admitted = NULL;
    w->nadmitted = 0;
}

/* One pass. end_status >= 0 ends the training; final: take every complete
 * checkpoint now (the writer is gone). Returns the pass's error. */
static int pass(struct watcher *w, int end_status, bool final, bool targeted)
{
    /* Targeted: only the folders of what is being settled (a full pass over
     * a big tree costs a walk and a match of every name). */
    struct scopes sc = {.cfg = &w->cfg};
    ck_pathmap_init(&sc.set, NULL);
    if (targeted) {
        ck_settle_each(w->settle, add_scope, &sc);
        struct ck_pathmap_iter it;
        struct ck_pathmap_entry *e;
        ck_pathmap_iter_init(&it, &w->renamed);
        while ((e = ck_pathmap_next(&it)))
            add_scope(&sc, e->key);
        if (sc.err)
            targeted = false;
    }
    struct ck_scan_opts so = {
        .dir = w->o->dir,
        .cfg = &w->cfg,
        .end_status = end_status,
        .mark_running = w->child_started && w->child > 0,
        .min_age = 0,
        .admit = final ? NULL : admit,
        .admit_arg = w,
        .only_dirs = targeted ? (sc.list ? sc.list : (char *[]){""}) : NULL,
        .nonly_dirs = targeted ? sc.n : 0,
    };
    struct ck_scan_result res = {0};
    double t0 = ck_mono_s();
    int err = ck_scan_run(&w->st, &so, &res);
    w->passes++;
    if (err == 0 || res.metadata_written)
        ck_notify_scan(w->hooks, &w->st, w->o->dir, &res); /* events: hooks and metrics */
    if (res.metadata_written)
        ck_upload_worker_kick(w->up); /* data first, metadata.yaml last (the queue's order) */
    forget_registered(w, &res);
    if (err < 0) {
        ck_err("watch.pass_failed", "%s", ck_error_msg());
    } else {
        w->status = res.new_status;
        ck_debug("watch.pass",
                 "registered=%zu updated=%zu removed=%zu waiting=%zu problems=%zu status=%s "
                 "pending=%zu seconds=%.4f",
                 res.nregistered, res.updated, res.removed, res.waiting, res.problems,
                 ck_pmf_status_name(res.new_status), ck_settle_npending(w->settle),
                 ck_mono_s() - t0);
        if (res.new_status != res.old_status &&
            (res.new_status == CK_PMF_FINISHED || res.new_status == CK_PMF_FAILED) &&
            w->child <= 0) {
            ck_info("watch.training_ended", "status=%s: stopping",
                    ck_pmf_status_name(res.new_status));
            w->ended = true;
            ck_loop_stop(w->loop);
        }
    }
    ck_scan_result_release(&res);
    free(sc.list);
    ck_pathmap_release(&sc.set);
    /* A pass over a big tree allocates and frees a lot: give it back, the
     * watcher then idles (issue 3: resident memory while idle). */
    malloc_trim(0);
    return err;
}

static void on_settle_timer(struct ck_loop *loop, void *arg)
{
    struct watcher *w = arg;
    (void)loop;
    for (int round = 0; round < MAX_ROUNDS && !w->ended; round++) {
        size_t n = 0;
        double next = -1;
        if (ck_settle_check(w->settle, ck_mono_s(), &n, &next) < 0)
            ck_err("watch.settle_failed", "%s", ck_error_msg());
        if (n)
            w->want_pass = true;
        if (!w->want_pass) {
            if (next >= 0)
                arm_settle(w, next);
            return;
        }
        bool full = w->want_full;
        w->want_pass = w->want_full = false;
        pass(w, -1, false, !full);
    }
    if (!w->ended)
        arm_settle(w, 0); /* more to do: let other events have their turn first */
}

static void on_reconcile(struct ck_loop *loop, void *arg)
{
    struct watcher *w = arg;
    (void)loop;
    ck_debug("watch.reconcile", "a full pass");
    kick(w);
}

/* ---- change notices ---- */

static void on_changed(void *arg, const char *rel)
{
    struct watcher *w = arg;
    if (!relevant(&w->cfg, rel))
        return;
    ck_settle_touch(w->settle, rel);
    arm_settle(w, 0);
}

static void on_gone(void *arg, const char *rel, bool is_dir)
{
    struct watcher *w = arg;
    ck_settle_forget(w->settle, rel);
    if (is_dir)
        ck_pathmap_del_tree(&w->renamed, rel);
    if (w->cfg.mirror_deletes && (is_dir || relevant(&w->cfg, rel)))
        kick(w);
}

static void on_dir_in(void *arg, const char *rel)
{
    struct watcher *w = arg;
    void *e;
    if (!folder_checkpoint(&w->cfg, rel))
        return;
    if (ck_pathmap_put(&w->renamed, rel, sizeof(struct ck_pathmap_entry), &e, NULL) == 0)
        ck_info("folder.renamed_in", "path='%s': complete once its files settle", rel);
    arm_settle(w, 0);
}

static void on_rescan(void *arg)
{
    kick(arg);
}

/* ---- requests from ckptd status ---- */

static void reply(struct watcher *w, const char *pid, const char *text)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/.ckptd/reply.%s", w->o->dir, pid);
    if (ck_write_file_atomic(path, text, strlen(text), 0600) < 0)
        ck_err("request.reply_failed", "%s", ck_error_msg());
}

static void handle_request(struct watcher *w, int dfd, const char *name)
{
    const char *pid = name + 8;
    char buf[64] = "";
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    unlinkat(dfd, name, 0);
    buf[n > 0 ? n : 0] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    enum ck_pmf_status to;
    if (ck_pmf_status_parse(buf, &to) < 0 || (to != CK_PMF_FINISHED && to != CK_PMF_FAILED)) {
        reply(w, pid, "error the request must be 'finished' or 'failed'\n");
        return;
    }
    ck_info("request.received", "from pid %s: end the training as %s", pid, buf);
    int err = pass(w, to, true, false);
    char text[2048];
    if (err < 0)
        snprintf(text, sizeof text, "error %s\n", ck_error_msg());
    else
        snprintf(text, sizeof text, "ok %s\n", ck_pmf_status_name(w->status));
    reply(w, pid, text);
}

static void on_request(void *arg)
{
    struct watcher *w = arg;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/.ckptd", w->o->dir);
    DIR *d = opendir(path);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) && !w->ended) {
        const char *p = e->d_name;
        if (strncmp(p, "request.", 8) || !p[8] || strspn(p + 8, "0123456789") != strlen(p + 8))
            continue;
        handle_request(w, dirfd(d), p);
    }
    closedir(d);
}

/* ---- the wrapped command ---- */

static int spawn_child(struct watcher *w)
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
    sigaddset(&dfl, SIGIO); /* ignored here (agent/settle.h), not in the command */
    posix_spawnattr_init(&attr);
    /* Its own process group: our signals reach the command and its children
     * once each, whoever sent them. */
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                        POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &dfl);
    pid_t pid;
    int rc = posix_spawnp(&pid, w->o->command[0], NULL, &attr, w->o->command, environ);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        errno = rc;
        return ck_error_os(CK_ERR, "cannot start '%s'", w->o->command[0]);
    }
    w->child = pid;
    w->child_started = true;
    ck_info("command.started", "pid=%ld command='%s'", (long)pid, w->o->command[0]);
    return 0;
}

static void forward(struct watcher *w, int sig)
{
    if (w->child <= 0)
        return;
    if (kill(-w->child, sig) < 0 && kill(w->child, sig) < 0)
        return;
    ck_info("command.signalled", "pid=%ld signal=%s", (long)w->child, strsignal(sig));
}

static void on_grace(struct ck_loop *loop, void *arg)
{
    struct watcher *w = arg;
    (void)loop;
    if (w->child <= 0)
        return;
    ck_warn("command.killed", "pid=%ld did not exit within %.3gs of the signal: SIGKILL",
            (long)w->child, w->cfg.watch_grace_period);
    kill(-w->child, SIGKILL);
    kill(w->child, SIGKILL);
}

static void reap(struct watcher *w)
{
    int status;
    if (w->child <= 0 || waitpid(w->child, &status, WNOHANG) != w->child)
        return;
    if (WIFEXITED(status)) {
        w->child_code = WEXITSTATUS(status);
        ck_info("command.exited", "pid=%ld code=%d", (long)w->child, w->child_code);
    } else {
        w->child_code = 128 + WTERMSIG(status);
        ck_info("command.exited", "pid=%ld signal=%s code=%d", (long)w->child,
                strsignal(WTERMSIG(status)), w->child_code);
    }
    w->child = 0;
    int end = w->child_code == 0 ? CK_PMF_FINISHED : CK_PMF_FAILED;
    int err = pass(w, end, true, false);
    w->exit_code = w->child_code;
    if (err < 0 && w->child_code == 0)
        w->exit_code = CK_EXIT_FAILED;
    w->ended = true;
    ck_loop_stop(w->loop);
}

/* ---- hooks ---- */

static int hooks_fds(void *arg, struct pollfd *fds, int max)
{
    return ck_hooks_poll_fds(arg, fds, max);
}

static int64_t hooks_deadline(void *arg)
{
    return ck_hooks_deadline_ms(arg);
}

static void hooks_step(void *arg)
{
    ck_hooks_step(arg);
}

/* Builds the hooks of cfg; a bad secret or URL is a config error. */
static int hooks_new(const struct ck_config *cfg, struct ck_hooks **out)
{
    return ck_hooks_new(&cfg->hooks, cfg->source ? cfg->source : "(defaults)", out);
}

/* In the webhook helper: delivers what is due, on a connection of its own. */
static double webhook_round(void *arg)
{
    struct watcher *w = arg;
    double again = -1;
    int64_t deadline =
        w->wh_drain_until > 0 ? w->wh_drain_until : ck_mono_ms() + WEBHOOK_ROUND_S * 1000;
    sqlite3 *db = NULL;
    int err = ck_state_open_db(w->db_path, &db);
    if (err == 0)
        err = ck_hooks_deliver_round(w->hooks, db, deadline, &w->wh_abort, &again);
    sqlite3_close(db);
    if (err < 0) {
        ck_err("webhook.outbox", "%s", ck_error_msg());
        return WEBHOOK_ROUND_S;
    }
    return again;
}

/* In the webhook helper, on SIGTERM. */
static void webhook_stop(void *arg)
{
    struct watcher *w = arg;
    atomic_store(&w->wh_abort, true);
}

/* A delivery was stored in the outbox. */
static void wake_webhooks(void *arg)
{
    struct watcher *w = arg;
    ck_sender_kick(w->wh);
}

static int hooks_start(struct watcher *w, struct ck_hooks *h)
{
    static const struct ck_loop_poller poller = {hooks_fds, hooks_deadline, hooks_step};
    int err;
    w->hooks = h;
    if (!h)
        return 0;
    if (ck_hooks_webhook_count(h) > 0) {
        struct ck_sender_spec spec = {"webhook", webhook_round, webhook_stop, NULL, w};
        if ((err = ck_sender_new(w->loop, &spec, &w->st, &w->wh)) < 0)
            return err;
        ck_hooks_set_waker(h, wake_webhooks, w);
        ck_sender_kick(w->wh); /* what a previous run left in the outbox */
    }
    return ck_loop_add_poller(w->loop, &poller, h, &w->hooks_h);
}

/* Delivers what is due for up to drain seconds, lets the exec hooks finish,
 * frees. A delivery cut short stays in the outbox for the next start. */
static void hooks_stop(struct watcher *w, double drain)
{
    if (!w->hooks)
        return;
    ck_loop_remove(w->loop, w->hooks_h);
    w->hooks_h = NULL;
    if (w->wh) {
        /* a helper started from now on ends its attempts by then */
        w->wh_drain_until = ck_mono_ms() + (int64_t)(drain * 1000);
        while (drain > 0 && ck_sender_busy(w->wh) && ck_mono_ms() < w->wh_drain_until)
            ck_sender_pump(w->wh, 100);
        ck_sender_stop(w->wh, drain > 0 ? 0.5 : 1.0);
        ck_sender_free(w->wh);
        w->wh = NULL;
        w->wh_drain_until = 0;
    }
    ck_hooks_wait_exec(w->hooks);
    ck_hooks_free(w->hooks);
    w->hooks = NULL;
}

/* ---- uploads ---- */

/* On the loop's thread: a job ended in the upload helper; tell the hooks. */
static void emit_upload(void *arg, const struct ck_upload_outcome *o)
{
    struct watcher *w = arg;
    ck_notify_upload(w->hooks, &w->st, w->o->dir, o);
}

static int uploads_start(struct watcher *w)
{
    if (w->cfg.n_upload_stores == 0)
        return 0;
    return ck_upload_worker_start(&w->up, &w->cfg, w->o->dir, &w->st, w->loop, emit_upload, w);
}

/* The config the helper was forked with is about to change: stop it quickly
 * (what is in flight is requeued and resumes with its accepted parts). */
static void uploads_stop_now(struct watcher *w)
{
    if (!w->up)
        return;
    ck_upload_worker_stop(w->up, 1.0);
    ck_upload_worker_free(w->up);
    w->up = NULL;
}

/* At exit. After SIGTERM/SIGINT: what is in flight gets upload.grace, the
 * rest stays queued. After a normal end (the training ended): wait until the
 * queue has nothing left to send, unless a SIGTERM/SIGINT comes meanwhile. */
static void uploads_finish(struct watcher *w)
{
    if (!w->up)
        return;
    if (!w->terminating) {
        ck_upload_worker_kick(w->up); /* the last pass's metadata.yaml */
        while (!ck_upload_worker_is_idle(w->up)) {
            struct signalfd_siginfo si;
            if (w->sfd >= 0 && read(w->sfd, &si, sizeof si) == (ssize_t)sizeof si &&
                (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT)) {
                ck_info("signal.received", "signal=%s: stopping the uploads",
                        si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
                break;
            }
            ck_upload_worker_pump(w->up, 100);
            ck_sender_pump(w->wh, 0); /* the upload.* events meanwhile */
        }
    }
    ck_upload_worker_stop(w->up, w->cfg.upload.grace);
    ck_upload_worker_free(w->up);
    w->up = NULL;
}

/* ---- signals ---- */

static void reload(struct watcher *w)
{
    struct ck_config fresh;
    int err = ck_config_for_dir(&fresh, w->o->config_path, w->o->dir);
    struct ck_hooks *h = NULL;
    if (err == 0) {
        ck_watch_apply_flags(w->o, &fresh);
        err = ck_watch_check_config(&fresh);
    }
    if (err == 0)
        err = ck_config_resolve(&fresh); /* hooks, secrets, listen: as a start checks */
    if (err < 0) {
        ck_err("config.reload_failed", "%s; keeping the running config", ck_error_msg());
        ck_config_release(&fresh);
        return;
    }
    hooks_stop(w, 0);
    uploads_stop_now(w);
    if (fresh.watch_poll != w->cfg.watch_poll)
        ck_warn("config.restart_needed", "watch.poll changes at the next start");
    ck_config_release(&w->cfg);
    w->cfg = fresh;
    /* the hooks keep pointers into their config: built from w->cfg, where it stays */
    h = NULL;
    if ((err = hooks_new(&w->cfg, &h)) < 0 || (err = hooks_start(w, h)) < 0)
        ck_err("hooks.failed", "%s: no hooks until the next reload", ck_error_msg());
    if (uploads_start(w) < 0)
        ck_err("upload.failed", "%s: no uploads until the next reload", ck_error_msg());
    ck_upload_worker_kick(w->up);
    ck_cli_setup_logging(w->o->cli, w->cfg.log_format, w->cfg.log_level);
    ck_settle_configure(w->settle, w->cfg.watch_settle, w->cfg.watch_check_writers);
    ck_fswatch_set_poll_interval(w->fs, w->cfg.watch_poll_interval);
    double r = w->cfg.watch_reconcile_interval;
    ck_loop_timer_set(w->loop, w->reconcile_t, r, r);
    ck_info("config.reloaded", "source=%s settle=%.3gs poll_interval=%.3gs",
            w->cfg.source ? w->cfg.source : "(defaults)", w->cfg.watch_settle,
            w->cfg.watch_poll_interval);
    kick(w);
}

static void on_signal(struct ck_loop *loop, int fd, uint32_t events, void *arg)
{
    struct watcher *w = arg;
    struct signalfd_siginfo si;
    (void)events;
    while (read(fd, &si, sizeof si) == (ssize_t)sizeof si) {
        int sig = (int)si.ssi_signo;
        switch (sig) {
        case SIGCHLD:
            reap(w);
            break;
        case SIGHUP:
            ck_info("signal.received", "signal=SIGHUP: reloading the config");
            forward(w, sig);
            reload(w);
            break;
        case SIGINT:
        case SIGTERM:
            ck_info("signal.received", "signal=%s", sig == SIGINT ? "SIGINT" : "SIGTERM");
            w->terminating = true;
            if (w->child > 0) {
                forward(w, sig);
                if (!w->grace_t)
                    ck_loop_add_timer(loop, w->cfg.watch_grace_period, 0, on_grace, w, &w->grace_t);
            } else {
                ck_loop_stop(loop);
            }
            break;
        }
    }
}

static int setup_signals(struct watcher *w)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &set, &w->old_mask) < 0)
        return ck_error_os(CK_EIO, "cannot block signals");
    w->sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (w->sfd < 0)
        return ck_error_os(CK_EIO, "cannot create a signalfd");
    return ck_loop_add_fd(w->loop, w->sfd, EPOLLIN, on_signal, w, &w->sig_h);
}

/* ---- the ops endpoint ---- */

static int ops_fds(void *arg, struct pollfd *fds, int max)
{
    return ck_ops_poll_fds(arg, fds, max);
}

static int64_t ops_deadline(void *arg)
{
    return ck_ops_deadline_ms(arg);
}

static void ops_step(void *arg)
{
    ck_ops_step(arg);
}

static bool ops_ready(void *ctx, struct ck_buf *why)
{
    struct watcher *w = ctx;
    if (!w->ready)
        ck_buf_printf(why, "the first pass has not finished yet");
    return w->ready;
}

static int ops_status(void *ctx, struct ck_json *j)
{
    struct watcher *w = ctx;
    ck_json_kstr(j, "dir", w->o->dir);
    ck_json_kstr(j, "backend", ck_fswatch_backend(w->fs));
    ck_json_kstr(j, "training", ck_pmf_status_name(w->status));
    ck_json_kint(j, "pending", (int64_t)ck_settle_npending(w->settle));
    ck_json_kint(j, "passes", (int64_t)w->passes);
    ck_json_kint(j, "command_pid", w->child > 0 ? w->child : 0);
    return 0;
}

static int setup_ops(struct watcher *w)
{
    if (!w->cfg.listen)
        return 0;
    struct ck_ops_callbacks cb = {ops_ready, ops_status, w};
    static const struct ck_loop_poller poller = {ops_fds, ops_deadline, ops_step};
    int err = ck_ops_new(w->cfg.listen, &cb, &w->ops);
    if (err == 0)
        err = ck_loop_add_poller(w->loop, &poller, w->ops, &w->ops_h);
    if (err == 0)
        ck_info("ops.listening", "listen=%s port=%d", w->cfg.listen, ck_ops_port(w->ops));
    return err;
}

/* ---- the run ---- */

static void release(struct watcher *w)
{
    if (w->loop) {
        ck_loop_remove(w->loop, w->ops_h);
        ck_loop_remove(w->loop, w->sig_h);
    }
    ck_ops_free(w->ops);
    if (w->loop)
        uploads_finish(w);
    if (w->announced_start)
        ck_notify_agent(w->hooks, &w->st, w->o->dir, CK_EV_AGENT_STOPPING);
    if (w->loop)
        hooks_stop(w, w->cfg.watch_grace_period < 5 ? w->cfg.watch_grace_period : 5);
    ck_fswatch_free(w->fs);
    ck_loop_free(w->loop);
    ck_settle_free(w->settle);
    ck_pathmap_release(&w->renamed);
    if (w->sfd >= 0) {
        close(w->sfd);
        sigprocmask(SIG_SETMASK, &w->old_mask, NULL);
    }
    ck_state_close(&w->st);
    ck_lock_release(&w->lock);
    ck_config_release(&w->cfg);
}

static int start(struct watcher *w)
{
    static const struct ck_fswatch_cb cb = {on_changed, on_gone, on_dir_in, on_rescan, on_request};
    const struct ck_config *cfg = &w->cfg;
    int err;
    if ((err = ck_lock_acquire(&w->lock, w->o->dir)) < 0)
        return err;
    ck_tree_sweep(w->o->dir); /* the lock is ours: no other ckptd is writing here */
    if ((err = ck_state_open(&w->st, w->o->dir)) < 0 || (err = ck_loop_new(&w->loop)) < 0 ||
        (err = ck_settle_new(&w->settle, w->o->dir, cfg->watch_settle, cfg->watch_check_writers)) <
            0 ||
        (err = setup_signals(w)) < 0 ||
        (err = ck_state_db_path(&w->st, w->db_path, sizeof w->db_path)) < 0)
        return err;
    struct ck_hooks *h = NULL;
    if ((err = hooks_new(cfg, &h)) < 0 || (err = hooks_start(w, h)) < 0 ||
        (err = uploads_start(w)) < 0)
        return err;
    if ((err = ck_loop_add_timer(w->loop, 0, 0, on_settle_timer, w, &w->settle_t)) < 0 ||
        (err = ck_loop_add_timer(w->loop, cfg->watch_reconcile_interval,
                                 cfg->watch_reconcile_interval, on_reconcile, w, &w->reconcile_t)) <
            0)
        return err;
    /* Watches first, then the first pass: whatever is written meanwhile gives an event. */
    if ((err = ck_fswatch_new(&w->fs, w->loop, w->o->dir, cfg->watch_poll, cfg->watch_poll_interval,
                              &cb, w)) < 0 ||
        (err = setup_ops(w)) < 0)
        return err;
    ck_info("watch.started",
            "dir='%s' backend=%s watches=%zu polled=%zu settle=%.3gs reconcile=%.3gs pid=%ld",
            w->o->dir, ck_fswatch_backend(w->fs), ck_fswatch_nwatches(w->fs),
            ck_fswatch_npolled(w->fs), cfg->watch_settle, cfg->watch_reconcile_interval,
            (long)getpid());
    if ((err = pass(w, -1, false, false)) < 0)
        return err;
    /* after the first pass, so that the event carries the model's id */
    ck_notify_agent(w->hooks, &w->st, w->o->dir, CK_EV_AGENT_STARTED);
    w->announced_start = true;
    ck_upload_worker_kick(w->up); /* what a previous run left queued, and this pass */
    if (w->status == CK_PMF_FINISHED || w->status == CK_PMF_FAILED) {
        if (w->o->command)
            return ck_error(CK_ESTATE,
                            "the training in '%s' already ended as %s: not starting "
                            "the command (PMF forbids going back to running)",
                            w->o->dir, ck_pmf_status_name(w->status));
        ck_info("watch.training_ended", "status=%s: the training in '%s' already ended",
                ck_pmf_status_name(w->status), w->o->dir);
        w->ended = true;
        return 0;
    }
    if (w->o->command) {
        if ((err = spawn_child(w)) < 0) {
            w->exit_code = 127;
            return err;
        }
        if ((err = pass(w, -1, false, false)) < 0) /* status running */
            return err;
    }
    on_request(w); /* a request left while no watcher ran */
    w->ready = true;
    arm_settle(w, 0);
    return 0;
}

int ck_watch_run(const struct ck_watch_opts *o, struct ck_config *cfg)
{
    struct watcher w = {.o = o, .cfg = *cfg, .sfd = -1, .lock = {-1}, .status = CK_PMF_PENDING};
    memset(cfg, 0, sizeof *cfg); /* ours now */
    ck_pathmap_init(&w.renamed, NULL);
    int err = start(&w);
    if (err == 0 && !w.ended)
        err = ck_loop_run(w.loop);
    if (err < 0) {
        int code = w.exit_code ? w.exit_code : ck_exit_code(err);
        ck_cli_fail("watch", err);
        if (w.child > 0) { /* it started, then we failed: do not leave it behind */
            kill(-w.child, SIGTERM);
            waitpid(w.child, NULL, 0);
        }
        release(&w);
        return code;
    }
    if (w.terminating && w.child <= 0 && !w.child_started)
        ck_info("watch.stopped", "signal: state saved, exiting");
    int code = w.exit_code;
    release(&w);
    return code;
}

/* ---- the client side of a request ---- */

static bool lock_is_held(const char *dir)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/.ckptd/lock", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    bool held = flock(fd, LOCK_SH | LOCK_NB) < 0 && errno == EWOULDBLOCK;
    close(fd); /* drops a shared lock we may have got */
    return held;
}

/* 1: no answer yet; 0: "ok ..."; CK_ESTATE: "error ...". */
static int read_answer(const char *path, char *answer, size_t answersz)
{
    struct ck_buf b = CK_BUF_INIT;
    if (ck_read_file(path, 4096, &b) < 0) {
        ck_buf_release(&b);
        return 1;
    }
    unlink(path);
    char s[2048];
    snprintf(s, sizeof s, "%s", ck_buf_str(&b));
    s[strcspn(s, "\n")] = '\0';
    bool ok = !strncmp(s, "ok ", 3);
    snprintf(answer, answersz, "%s", s + (ok ? 3 : strncmp(s, "error ", 6) ? 0 : 6));
    ck_buf_release(&b);
    return ok ? 0 : ck_error(CK_ESTATE, "%s", answer);
}

int ck_watch_request(const char *dir, int status, double timeout, char *answer, size_t answersz)
{
    char req[PATH_MAX], rep[PATH_MAX];
    const char *word = ck_pmf_status_name((enum ck_pmf_status)status);
    long pid = (long)getpid();
    int err;
    snprintf(req, sizeof req, "%s/.ckptd/request.%ld", dir, pid);
    snprintf(rep, sizeof rep, "%s/.ckptd/reply.%ld", dir, pid);
    unlink(rep);
    char text[32];
    snprintf(text, sizeof text, "%s\n", word);
    if ((err = ck_write_file_atomic(req, text, strlen(text), 0600)) < 0)
        return err;
    double end = ck_mono_s() + timeout;
    while (ck_mono_s() < end) {
        if ((err = read_answer(rep, answer, answersz)) != 1)
            return err;
        if (!lock_is_held(dir))
            break; /* no watcher (any more) */
        usleep(10000);
    }
    if (unlink(req) < 0 && errno == ENOENT) {
        /* taken meanwhile: give the answer a last moment */
        for (int i = 0; i < 100; i++) {
            if ((err = read_answer(rep, answer, answersz)) != 1)
                return err;
            usleep(10000);
        }
    }
    return ck_error(CK_ENOENT, "no watcher answered for '%s'", dir);
}
