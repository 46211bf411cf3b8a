#include "agent/watch.h"
#include "agent/child.h"
#include "agent/config_check.h"
#include "agent/control.h"
#include "agent/discover.h"
#include "agent/fswatch.h"
#include "agent/hook_worker.h"
#include "agent/lock.h"
#include "agent/notify.h"
#include "agent/upload_worker.h"
#include "agent/loop.h"
#include "agent/ops.h"
#include "agent/pathfilter.h"
#include "agent/pathmap.h"
#include "agent/pipeline.h"
#include "agent/retention.h"
#include "agent/retention_worker.h"
#include "agent/scan.h"
#include "agent/sender.h"
#include "agent/settle.h"
#include "agent/state.h"
#include "agent/sweep.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/metrics.h"
#include "hooks/outbox.h"
#include "stores/queue.h"

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

/* Passes in a row before other events get their turn. */
#define MAX_ROUNDS 8
/* seconds without a pass before the heap is trimmed (see pass()) */
#define TRIM_IDLE_S 1.0

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
    struct ck_hooks *hooks; /* webhooks and exec hooks (hw's, borrowed) */
    bool announced_start;   /* agent.started was emitted: agent.stopping follows */
    /* the network work runs in helper processes (agent/sender.h) */
    struct ck_upload_worker *up; /* upload.stores */
    bool queue_ready;            /* the upload queue's tables exist (send_first) */
    struct ck_hook_worker *hw;   /* exec hooks, webhook deliveries */
    struct ck_retention_worker *ret; /* retention.*: the stores' copies checked */
    struct ck_loop_handler *retention_t;
    size_t ret_held; /* the last retention round kept checkpoints: look again */
    struct ck_loop_handler *sig_h, *settle_t, *reconcile_t, *grace_t, *ops_h, *output_h;
    struct ck_loop_handler *trim_t; /* gives the heap back once passes stop */
    int sfd;
    sigset_t old_mask;
    struct ck_pathmap renamed; /* folders renamed into place: complete */
    struct ck_scan_memo memo;  /* metadata.yaml as the last pass wrote it */
    struct admitted *admitted;
    size_t nadmitted;
    bool want_pass;
    bool want_full; /* the next pass looks at everything (else: where things changed) */
    bool ready;     /* the first pass is done */
    bool ended;     /* the training ended: stop */
    size_t passes;
    enum ck_pmf_status status;
    /* the wrapped command */
    struct ck_child child;
    bool terminating; /* SIGTERM/SIGINT came */
    double signal_at; /* ck_mono_s of the first, when the command ran (0: none) */
    int exit_code;
    /* SIGTERM/SIGINT with no wrapped command: everything complete is handed
     * over until this deadline (ck_mono_s), see handover() */
    double handover_until;
    double final_window; /* the settle window, shortened to what the grace allows */
    struct timespec handover_real; /* when the hand-over began (CLOCK_REALTIME) */
    double handover_t0;            /* and by ck_mono_s */
    size_t young;        /* checkpoints the last final pass found too fresh */
};

/* ---- config ---- */

int ck_watch_apply_flags(const struct ck_watch_opts *o, struct ck_config *cfg)
{
    return ck_config_apply(cfg, o->overrides, o->noverrides);
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

/* ---- which paths matter (agent/pathfilter.h) ---- */

static struct ck_pathfilter filter_of(const struct watcher *w)
{
    return (struct ck_pathfilter){&w->cfg.ckpt, w->cfg.finished_marker, w->cfg.failed_marker};
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

struct scopes {
    struct ck_pathfilter filter;
    struct ck_pathmap set;
    char **list; /* borrowed from set's keys */
    size_t n;
    int err;
};

static void add_scope_at(struct scopes *sc, const char *dir)
{
    struct ck_pathmap_entry *e;
    bool created;
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

static void add_scope(void *arg, const char *rel)
{
    char dir[PATH_MAX];
    ck_pathfilter_scope(&((struct scopes *)arg)->filter, rel, dir, sizeof dir);
    add_scope_at(arg, dir);
}

static bool remember(struct watcher *w, const struct ck_candidate *c);

/* Complete by discover's rules, or a folder renamed into place (inotify saw it). */
static bool is_complete(const struct watcher *w, const struct ck_candidate *c)
{
    return c->complete || (c->kind == CK_CAND_DIR && c->nfiles > 0 &&
                           ck_pathmap_get(&w->renamed, c->rel) != NULL);
}

static bool admit(void *arg, const struct ck_candidate *c)
{
    struct watcher *w = arg;
    if (!is_complete(w, c))
        return false;
    bool ok = true;
    for (size_t i = 0; i < c->nfiles; i++)
        if (!ck_settle_is_settled(w->settle, c->files[i]))
            ok = false; /* looked at all the same: each is touched when unknown */
    if (!ok)
        return false;
    return remember(w, c);
}

/* Notes an admitted candidate, to forget its settle state once registered. */
static bool remember(struct watcher *w, const struct ck_candidate *c)
{
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
/* The hand-over's admission: complete, no file open for writing (when
 * watch.check_writers), and every file at least final_window old by mtime:
 * what is still being written stays out, what was closed a moment ago is in. */
static bool admit_final(void *arg, const struct ck_candidate *c)
{
    struct watcher *w = arg;
    if (!is_complete(w, c))
        return false;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (size_t i = 0; i < c->nfiles; i++) {
        char path[PATH_MAX];
        struct stat st;
        if (ck_path_join(path, sizeof path, w->o->dir, c->files[i]) < 0 || stat(path, &st) < 0)
            return false;
        double age = (double)(now.tv_sec - st.st_mtim.tv_sec) +
                     (double)(now.tv_nsec - st.st_mtim.tv_nsec) / 1e9;
        if (age < w->final_window || (w->cfg.watch_check_writers && ck_settle_has_writer(path))) {
            /* written before the signal: worth another pass; after it, the
             * trainer is still running and this one is the next start's */
            if (st.st_mtim.tv_sec < w->handover_real.tv_sec ||
                (st.st_mtim.tv_sec == w->handover_real.tv_sec &&
                 st.st_mtim.tv_nsec <= w->handover_real.tv_nsec))
                w->young++;
            return false;
        }
    }
    return remember(w, c);
}

static int pass(struct watcher *w, int end_status, bool final, bool targeted)
{
    /* Targeted: only the folders of what is being settled (a full pass over
     * a big tree costs a walk and a match of every name). */
    struct scopes sc = {.filter = filter_of(w)};
    ck_pathmap_init(&sc.set, NULL);
    if (targeted) {
        ck_settle_each(w->settle, add_scope, &sc);
        struct ck_pathmap_iter it;
        struct ck_pathmap_entry *e;
        ck_pathmap_iter_init(&it, &w->renamed);
        while ((e = ck_pathmap_next(&it)))
            add_scope_at(&sc, e->key); /* a folder checkpoint: taken alone */
        if (sc.err)
            targeted = false;
    }
    struct ck_scan_opts so = {
        .dir = w->o->dir,
        .cfg = &w->cfg,
        .end_status = end_status,
        .mark_running = w->child.started && w->child.pid > 0,
        .min_age = 0,
        .admit = final ? NULL : w->handover_until > 0 ? admit_final : admit,
        .admit_arg = w,
        .only_dirs = targeted ? (sc.list ? sc.list : (char *[]){""}) : NULL,
        .nonly_dirs = targeted ? sc.n : 0,
        .memo = &w->memo,
        /* a new checkpoint's upload runs beside its hashing, not after it */
        .send_first = !final && w->up && w->handover_until <= 0 && w->cfg.n_upload_stores > 0 &&
                      !ck_nodes_is_multi(w->o->nodes),
    };
    if (so.send_first && !w->queue_ready) {
        if (ck_queue_init(w->st.db) == 0)
            w->queue_ready = true;
        else
            so.send_first = false;
        ck_error_clear();
    }
    struct ck_scan_result res = {0};
    double t0 = ck_mono_s();
    /* the pass and what it hands on: events, pack, verify, a kick to the upload helper */
    struct ck_pipeline pl = {
        .cfg = &w->cfg, .dir = w->o->dir, .st = &w->st, .hooks = w->hooks, .uploads = w->up,
        .nodes = w->o->nodes, .queue_tree_now = final && w->up};
    int err = ck_pipeline_pass(&pl, &so, &res);
    w->passes++;
    if (err >= 0 && res.sent_first.n) {
        /* queued before they were hashed (agent/scan.h): their upload starts
         * now, in its helper, while this process takes their digests from
         * the page cache; the pass after registers them with those */
        ck_upload_worker_kick(w->up);
        ck_upload_worker_pump(w->up, 0);
        for (size_t i = 0; i < res.sent_first.n; i++) {
            struct ck_hash_entry h;
            if (ck_state_hash_file(&w->st, res.sent_first.items[i], &h, NULL) < 0)
                ck_error_clear(); /* the pass hashes it again and says why */
        }
        forget_registered(w, &res);
        ck_scan_result_release(&res);
        so.send_first = false;
        /* The tree (metadata.yaml naming them, build_parameters.yaml) joins
         * the queue now, from here: the helper's round, busy sending them,
         * would list the tree only once it ends, so metadata.yaml would wait
         * for a whole round and the queue would not show it. Queued now, the
         * round's free workers take it, metadata.yaml as soon as the
         * checkpoints' bytes are in (the queue's phases). */
        pl.queue_tree_now = true;
        err = ck_pipeline_pass(&pl, &so, &res);
        pl.queue_tree_now = final && w->up;
        w->passes++;
    }
    if (pl.events_err < 0 && !w->ended) {
        /* an event that cannot be stored is lost unless a restart announces
         * it: stop with a failure, never 0 (systemd and Kubernetes restart) */
        ck_err("watch.event_lost", "an event could not be stored (hooks.emit says why): "
               "stopping with a failure, so that a restart announces it");
        w->exit_code = CK_EXIT_FAILED;
        w->ended = true;
        ck_loop_stop(w->loop);
    }
    forget_registered(w, &res);
    /* with no store there is no upload to wait for (retention.without_store) */
    if (res.nregistered && w->cfg.n_upload_stores == 0)
        ck_retention_worker_kick(w->ret);
    if (err < 0) {
        ck_err("watch.pass_failed", "%s", ck_error_msg());
    } else {
        if (res.problems == 0 && pl.events_err == 0) /* what an alert compares with now */
            ck_metrics_set(CK_M_LAST_SUCCESS_TIME, (int64_t)time(NULL));
        w->status = res.new_status;
        ck_debug("watch.pass",
                 "registered=%zu updated=%zu removed=%zu waiting=%zu problems=%zu status=%s "
                 "pending=%zu seconds=%.4f",
                 res.nregistered, res.updated, res.removed, res.waiting, res.problems,
                 ck_pmf_status_name(res.new_status), ck_settle_npending(w->settle),
                 ck_mono_s() - t0);
        if (res.new_status != res.old_status &&
            (res.new_status == CK_PMF_FINISHED || res.new_status == CK_PMF_FAILED) &&
            w->child.pid <= 0) {
            ck_info("watch.training_ended", "status=%s: stopping",
                    ck_pmf_status_name(res.new_status));
            w->ended = true;
            ck_loop_stop(w->loop);
        }
    }
    ck_scan_result_release(&res);
    free(sc.list);
    ck_pathmap_release(&sc.set);
    /* A pass over a big tree allocates and frees a lot: give it back once
     * the watcher idles (issue 3: resident memory while idle). Not after
     * every pass: trimming a heap the next pass grows again costs each new
     * checkpoint its page faults and TLB flushes (a tenth of its CPU at
     * 10,000 registered); a burst trims once, TRIM_IDLE_S after its last pass. */
    if (w->trim_t)
        ck_loop_timer_set(w->loop, w->trim_t, TRIM_IDLE_S, 0);
    else
        malloc_trim(0);
    return err;
}

static void on_trim_timer(struct ck_loop *loop, void *arg)
{
    (void)loop;
    (void)arg;
    malloc_trim(0);
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
    struct ck_pathfilter f = filter_of(w);
    if (!ck_pathfilter_relevant(&f, rel))
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
    struct ck_pathfilter f = filter_of(w);
    if (w->cfg.mirror_deletes && (is_dir || ck_pathfilter_relevant(&f, rel)))
        kick(w);
}

static void on_dir_in(void *arg, const char *rel)
{
    struct watcher *w = arg;
    void *e;
    struct ck_pathfilter f = filter_of(w);
    if (!ck_pathfilter_is_folder_checkpoint(&f, rel))
        return;
    if (ck_pathmap_put(&w->renamed, rel, sizeof(struct ck_pathmap_entry), &e, NULL) == 0)
        ck_info("folder.renamed_in", "path='%s': complete once its files settle", rel);
    arm_settle(w, 0);
}

static void on_rescan(void *arg)
{
    kick(arg);
}

/* ---- requests from ckptd status (agent/control.h) ---- */

static int end_on_request(void *arg, int status, char *answer, size_t answersz)
{
    struct watcher *w = arg;
    int err = pass(w, status, true, false);
    if (err == 0)
        snprintf(answer, answersz, "%s", ck_pmf_status_name(w->status));
    return err;
}

static void on_request(void *arg)
{
    struct watcher *w = arg;
    struct ck_control c = {.dir = w->o->dir, .end = end_on_request, .arg = w, .stop = &w->ended};
    ck_control_serve(&c);
}

/* ---- the wrapped command (agent/child.h) ---- */

/* SIGTERM or SIGINT with no wrapped command. In a pod with a native sidecar
 * the trainer has already exited when ckptd gets SIGTERM: what is complete
 * on disk can and must be registered and handed over within
 * watch.grace_period. A final pass takes every complete checkpoint that no
 * process is writing and that is at least the (shortened) settle window old;
 * one that is too fresh gets passes again until half the grace is spent.
 * release() then drains the uploads and webhooks until the deadline. */
static void handover(struct watcher *w)
{
    double t0 = ck_mono_s(), grace = w->cfg.watch_grace_period;
    w->handover_until = t0 + grace;
    w->handover_t0 = t0;
    clock_gettime(CLOCK_REALTIME, &w->handover_real);
    w->final_window = grace / 4 < w->cfg.watch_settle ? grace / 4 : w->cfg.watch_settle;
    size_t passes = 0;
    do {
        if (passes++)
            usleep((useconds_t)((w->final_window < 0.05 ? w->final_window : 0.05) * 1e6) + 1000);
        w->young = 0;
        w->want_full = true;
        pass(w, -1, false, false);
    } while (w->young > 0 && ck_mono_s() - t0 < grace / 2);
    ck_info("watch.final_pass", "passes=%zu too_fresh=%zu seconds=%.3f", passes, w->young,
            ck_mono_s() - t0);
}

/* What is still to hand over by the deadline (or -1: no deadline). */
static double handover_left(const struct watcher *w)
{
    if (w->handover_until <= 0)
        return -1;
    double left = w->handover_until - ck_mono_s();
    return left > 0 ? left : 0;
}

static void on_grace(struct ck_loop *loop, void *arg)
{
    struct watcher *w = arg;
    (void)loop;
    ck_child_kill(&w->child, w->cfg.watch_grace_period);
}

/* The wrapped command's output, when captured (ck_child_spawn). */
static int output_fds(void *arg, struct pollfd *fds, int max)
{
    struct watcher *w = arg;
    int n = 0;
    for (int i = 0; i < 2 && n < max; i++)
        if (w->child.started && w->child.out[i] >= 0)
            fds[n++] = (struct pollfd){.fd = w->child.out[i], .events = POLLIN};
    return n;
}

static int64_t output_deadline(void *arg)
{
    (void)arg;
    return -1;
}

static void output_step(void *arg)
{
    struct watcher *w = arg;
    for (int i = 0; i < 2; i++)
        ck_child_read(&w->child, i);
}

/* The wrapped command ended after SIGTERM/SIGINT: from here on it is the
 * hand-over of a watcher without a command (handover()), except that the
 * final pass is reap's own (the writer is gone: no settle window). Its
 * deadline: what is left of watch.grace_period since the signal, and at
 * least upload.grace, which a transfer in flight would get anyway. */
static void handover_after_command(struct watcher *w)
{
    double now = ck_mono_s(), until = w->signal_at + w->cfg.watch_grace_period;
    if (until < now + w->cfg.upload.grace)
        until = now + w->cfg.upload.grace;
    w->handover_until = until;
    w->handover_t0 = now;
    clock_gettime(CLOCK_REALTIME, &w->handover_real);
}

static void reap(struct watcher *w)
{
    if (!ck_child_reap(&w->child))
        return;
    if (w->terminating && w->handover_until <= 0)
        handover_after_command(w);
    int end = w->child.code == 0 ? CK_PMF_FINISHED : CK_PMF_FAILED;
    int err = pass(w, end, true, false);
    w->exit_code = w->child.code;
    if (err < 0 && w->child.code == 0)
        w->exit_code = CK_EXIT_FAILED;
    w->ended = true;
    ck_loop_stop(w->loop);
}

/* ---- hooks (agent/hook_worker.h) ---- */

/* Builds the hooks of cfg; a bad secret or URL is a config error. */
static int hooks_new(const struct ck_config *cfg, struct ck_hooks **out)
{
    return ck_hooks_new(&cfg->hooks, cfg->source ? cfg->source : "(defaults)", out);
}

static int hooks_start(struct watcher *w, struct ck_hooks *h)
{
    int err = ck_hook_worker_start(&w->hw, h, w->loop, &w->st);
    w->hooks = ck_hook_worker_hooks(w->hw);
    return err;
}

static void hooks_stop(struct watcher *w, double drain)
{
    ck_hook_worker_stop(w->hw, drain);
    w->hw = NULL;
    w->hooks = NULL;
}

/* ---- uploads ---- */

/* On the loop's thread: a job ended in the upload helper; tell the hooks. */
static void emit_upload(void *arg, const struct ck_upload_outcome *o)
{
    struct watcher *w = arg;
    struct ck_pipeline pl = {.cfg = &w->cfg, .dir = w->o->dir, .st = &w->st, .hooks = w->hooks};
    ck_pipeline_upload_event(&pl, o);
    /* metadata.yaml goes last: what it lists is in the store (retention checks it) */
    size_t kl = o->key ? strlen(o->key) : 0;
    if (o->ok && kl >= 13 && !strcmp(o->key + kl - 13, "metadata.yaml") &&
        (kl == 13 || o->key[kl - 14] == '/'))
        ck_retention_worker_kick(w->ret);
}

/* On the loop's thread: the helper committed a step of several nodes. */
static void emit_committed(void *arg, const struct ck_node_commit *c)
{
    struct watcher *w = arg;
    ck_notify_committed(w->hooks, &w->st, w->o->dir, c);
}

static int uploads_start(struct watcher *w)
{
    if (w->cfg.n_upload_stores == 0)
        return 0;
    const struct ck_upload_worker_calls calls = {emit_upload, emit_committed, w};
    return ck_upload_worker_start(&w->up, &w->cfg, w->o->dir, &w->st, w->loop, w->o->nodes,
                                  &calls);
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
    if (!w->terminating || w->handover_until > 0) {
        ck_upload_worker_kick(w->up); /* the last pass's metadata.yaml */
        while (!ck_upload_worker_is_idle(w->up) && handover_left(w) != 0) {
            struct signalfd_siginfo si;
            if (w->sfd >= 0 && read(w->sfd, &si, sizeof si) == (ssize_t)sizeof si &&
                (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT)) {
                ck_info("signal.received", "signal=%s: stopping the uploads",
                        si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
                break;
            }
            ck_upload_worker_pump(w->up, 100);
            ck_hook_worker_pump(w->hw, 0); /* the upload.* events meanwhile */
        }
    }
    double left = handover_left(w);
    ck_upload_worker_stop(w->up, left >= 0 && left < w->cfg.upload.grace ? left : w->cfg.upload.grace);
    ck_upload_worker_free(w->up);
    w->up = NULL;
}

/* After a hand-over: what could not be finished stays queued for the next
 * start; say how much, so nobody wonders where it went. */
static void log_left_behind(struct watcher *w)
{
    int jobs[CK_JOB_NSTATES] = {0};
    int64_t deliveries = 0;
    if (w->handover_until <= 0 || !w->st.db)
        return;
    ck_queue_counts(w->st.db, jobs);
    ck_outbox_pending(w->st.db, &deliveries);
    int uploads = jobs[CK_JOB_PENDING] + jobs[CK_JOB_RUNNING];
    if (uploads || deliveries)
        ck_warn("watch.handover_incomplete",
                "uploads_left=%d deliveries_left=%lld: still queued, the next start sends them",
                uploads, (long long)deliveries);
    else
        ck_info("watch.handed_over", "seconds=%.3f: everything registered, uploaded and delivered",
                ck_mono_s() - w->handover_t0);
}

/* ---- retention (agent/retention_worker.h) ---- */

/* On the loop's thread: the helper found every copy of c checked. */
static void retention_checked(void *arg, const struct ck_retention_checked *c)
{
    struct watcher *w = arg;
    struct ck_retention_result res;
    if (ck_retention_apply(&w->st, w->o->dir, &w->cfg, w->hooks, c, &res) < 0) {
        ck_err("retention.failed", "%s", ck_error_msg());
        w->ret_held++;
    }
    w->ret_held += res.held;
}

static void retention_round(void *arg, size_t held, size_t requeued)
{
    struct watcher *w = arg;
    w->ret_held += held;
    if (requeued)
        ck_upload_worker_kick(w->up); /* a copy went missing: sent again, then checked */
}

/* Every retention.interval: the free space (ckptd_disk_free_bytes), and a
 * round when it is below min_free or the last round held checkpoints. */
static void on_retention_timer(struct ck_loop *loop, void *arg)
{
    struct watcher *w = arg;
    uint64_t free_bytes;
    (void)loop;
    if (ck_retention_free_bytes(w->o->dir, &free_bytes) < 0) {
        ck_warn("retention.free_unknown", "%s", ck_error_msg());
        ck_error_clear();
        free_bytes = UINT64_MAX;
    }
    if (w->ret_held || (w->cfg.min_free > 0 && free_bytes < w->cfg.min_free)) {
        w->ret_held = 0;
        ck_retention_worker_kick(w->ret);
    }
}

static int retention_start(struct watcher *w)
{
    static const struct ck_retention_worker_cb cb0 = {retention_checked, retention_round, NULL};
    struct ck_retention_worker_cb cb = cb0;
    int err;
    cb.arg = w;
    if (!ck_config_has_retention(&w->cfg))
        return 0; /* (without a store and retention.without_store, ck_config_resolve refused) */
    if ((err = ck_retention_worker_start(&w->ret, &w->cfg, w->o->dir, &w->st, w->loop, &cb)) < 0)
        return err;
    double r = w->cfg.retention_interval;
    if (w->retention_t)
        return ck_loop_timer_set(w->loop, w->retention_t, r, r);
    return ck_loop_add_timer(w->loop, r, r, on_retention_timer, w, &w->retention_t);
}

static void retention_stop(struct watcher *w)
{
    ck_retention_worker_free(w->ret);
    w->ret = NULL;
    w->ret_held = 0;
}

/* ---- signals ---- */

static void reload(struct watcher *w)
{
    struct ck_config fresh;
    int err = ck_config_for_dir(&fresh, w->o->config_path, w->o->dir);
    struct ck_hooks *h = NULL;
    if (err == 0) {
        if ((err = ck_watch_apply_flags(w->o, &fresh)) == 0)
            err = ck_watch_check_config(&fresh);
    }
    if (err == 0)
        err = ck_config_resolve(&fresh); /* hooks, secrets, listen: as a start checks */
    if (err == 0 && w->o->nodes) /* what a node of several needs, as a start checks */
        err = ck_noderound_check(&fresh, w->o->nodes);
    struct ck_nodes again;
    if (err == 0 && w->o->nodes) {
        if (ck_nodes_resolve(&again, &fresh, NULL) == 0 &&
            (again.rank != w->o->nodes->rank || again.count != w->o->nodes->count))
            ck_warn("config.restart_needed", "nodes.rank %d and nodes.count %d change at the "
                    "next start (running as node %d of %d)", again.rank, again.count,
                    w->o->nodes->rank, w->o->nodes->count);
        ck_error_clear(); /* an identity that does not resolve now: the start's stays */
        ck_nodes_apply(&fresh, w->o->nodes);
    }
    if (err < 0) {
        ck_err("config.reload_failed", "%s; keeping the running config", ck_error_msg());
        ck_config_release(&fresh);
        return;
    }
    hooks_stop(w, 0);
    uploads_stop_now(w);
    retention_stop(w);
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
    if (retention_start(w) < 0)
        ck_err("retention.failed", "%s: no retention until the next reload", ck_error_msg());
    if (!w->ret && w->retention_t)
        ck_loop_timer_set(w->loop, w->retention_t, 0, 0); /* the keys are gone */
    ck_retention_worker_kick(w->ret);
    ck_log_setup_over(w->o->log_format, w->o->log_level, w->cfg.log_format, w->cfg.log_level);
    ck_settle_configure(w->settle, w->cfg.watch_settle, w->cfg.watch_check_writers);
    ck_fswatch_set_poll_interval(w->fs, w->cfg.watch_poll_interval);
    double r = w->cfg.watch_reconcile_interval;
    ck_loop_timer_set(w->loop, w->reconcile_t, r, r);
    ck_info("config.reloaded", "source=%s settle_seconds=%.3g poll_interval_seconds=%.3g",
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
            ck_child_signal(&w->child, sig);
            reload(w);
            break;
        case SIGINT:
        case SIGTERM:
            ck_info("signal.received", "signal=%s", sig == SIGINT ? "SIGINT" : "SIGTERM");
            w->terminating = true;
            if (w->child.pid > 0) {
                if (w->signal_at <= 0)
                    w->signal_at = ck_mono_s();
                ck_child_signal(&w->child, sig);
                if (!w->grace_t)
                    ck_loop_add_timer(loop, w->cfg.watch_grace_period, 0, on_grace, w, &w->grace_t);
            } else if (w->handover_until <= 0 && w->ready) {
                handover(w);
                ck_loop_stop(loop);
            } else {
                ck_loop_stop(loop); /* a second signal: stop now */
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
    ck_json_kint(j, "command_pid", w->child.pid > 0 ? w->child.pid : 0);
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
        ck_loop_remove(w->loop, w->output_h);
    }
    if (w->child.started)
        ck_child_drain(&w->child, 0.2);
    ck_ops_free(w->ops);
    retention_stop(w); /* deletes nothing more: the next start checks again */
    if (w->loop)
        uploads_finish(w);
    if (w->announced_start)
        ck_notify_agent(w->hooks, &w->st, w->o->dir, CK_EV_AGENT_STOPPING);
    if (w->loop) {
        double left = handover_left(w);
        hooks_stop(w, left >= 0 ? left : w->cfg.watch_grace_period < 5 ? w->cfg.watch_grace_period : 5);
        log_left_behind(w);
    }
    ck_fswatch_free(w->fs);
    ck_loop_free(w->loop);
    ck_settle_free(w->settle);
    ck_pathmap_release(&w->renamed);
    ck_scan_memo_release(&w->memo);
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
        (err = setup_signals(w)) < 0)
        return err;
    struct ck_hooks *h = NULL;
    if ((err = hooks_new(cfg, &h)) < 0 || (err = hooks_start(w, h)) < 0 ||
        (err = uploads_start(w)) < 0)
        return err;
    if ((err = ck_loop_add_timer(w->loop, 0, 0, on_settle_timer, w, &w->settle_t)) < 0 ||
        (err = ck_loop_add_timer(w->loop, 0, 0, on_trim_timer, w, &w->trim_t)) < 0 ||
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
            "dir='%s' backend=%s watches=%zu polled=%zu settle_seconds=%.3g poll_interval_seconds=%.3g "
            "reconcile_seconds=%.3g pid=%ld",
            w->o->dir, ck_fswatch_backend(w->fs), ck_fswatch_nwatches(w->fs),
            ck_fswatch_npolled(w->fs), cfg->watch_settle, cfg->watch_poll_interval,
            cfg->watch_reconcile_interval, (long)getpid());
    if ((err = retention_start(w)) < 0 || (err = pass(w, -1, false, false)) < 0)
        return err;
    /* after the first pass, so that the event carries the model's id */
    ck_notify_agent(w->hooks, &w->st, w->o->dir, CK_EV_AGENT_STARTED);
    w->announced_start = true;
    ck_upload_worker_kick(w->up); /* what a previous run left queued, and this pass */
    ck_retention_worker_kick(w->ret); /* what is in the stores already */
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
        /* JSON logs: the command's output becomes command.output records, so
         * that one stream stays parseable; text: it shares ours */
        bool capture = ck_log_format_get() == CK_LOG_JSON;
        static const struct ck_loop_poller output = {output_fds, output_deadline, output_step};
        /* the command is told DIR and the config in use (the one a reload reads) */
        char conf[PATH_MAX];
        const char *config = w->o->config_path;
        if (!config && ck_path_join(conf, sizeof conf, w->o->dir, "ckptd.yaml") == 0 &&
            ck_exists(conf))
            config = conf;
        if ((err = ck_child_spawn(&w->child, w->o->command, capture, w->o->dir, config)) < 0 ||
            (capture && (err = ck_loop_add_poller(w->loop, &output, w, &w->output_h)) < 0)) {
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

int ck_watch_run(const struct ck_watch_opts *o, struct ck_config *cfg, int *failed)
{
    *failed = 0;
    struct watcher w = {.o = o, .cfg = *cfg, .sfd = -1, .lock = {-1}, .status = CK_PMF_PENDING};
    memset(cfg, 0, sizeof *cfg); /* ours now */
    ck_pathmap_init(&w.renamed, NULL);
    int err = start(&w);
    if (err == 0 && !w.ended)
        err = ck_loop_run(w.loop);
    if (err < 0) {
        int code = w.exit_code ? w.exit_code : ck_exit_code(err);
        /* the command layer prints it; what release() logs must not replace it */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ck_error_msg());
        ck_child_end(&w.child); /* it started, then we failed: do not leave it behind */
        release(&w);
        *failed = *msg ? ck_error(err, "%s", msg) : err;
        return code;
    }
    bool stopped = w.terminating && w.child.pid <= 0 && !w.child.started;
    int code = w.exit_code;
    release(&w); /* the uploads drain or are handed over here */
    if (stopped) /* last: nothing of this watcher runs after it */
        ck_info("watch.stopped", "by a signal: state saved, exiting");
    return code;
}
