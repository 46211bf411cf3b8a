#include "agent/upload_worker.h"
#include "agent/state.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "stores/queue.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* A failed job waits for its retry time; the thread looks again this often. */
#define RETRY_LOOK_S 5
#define MAX_PENDING_OUTCOMES 4096

struct outcome {
    struct ck_upload_outcome o; /* strings point into text */
    char *text;                 /* owned: the strings, one block */
};

struct ck_upload_worker {
    const struct ck_config *cfg;
    char root[PATH_MAX], db_path[PATH_MAX], spool[PATH_MAX];
    pthread_t tid;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool kicked, stopping, running, retry_later, thread_done;
    struct ck_upload_ctl ctl;
    int efd;
    struct outcome *outcomes; /* guarded by mu */
    size_t noutcomes;
};

/* On the worker thread: copy the outcome for the loop's thread. */
static void on_job(void *arg, const struct ck_upload_outcome *o)
{
    struct ck_upload_worker *w = arg;
    struct outcome c = {*o, NULL};
    size_t a = strlen(o->store_url ? o->store_url : "") + 1, b = strlen(o->key ? o->key : "") + 1,
           s = strlen(o->src ? o->src : "") + 1, h = strlen(o->sha256 ? o->sha256 : "") + 1,
           e = o->error ? strlen(o->error) + 1 : 0;
    if (!(c.text = malloc(a + b + s + h + e + 1)))
        return;
    char *p = c.text;
    c.o.store_url = memcpy(p, o->store_url ? o->store_url : "", a), p += a;
    c.o.key = memcpy(p, o->key ? o->key : "", b), p += b;
    c.o.src = memcpy(p, o->src ? o->src : "", s), p += s;
    c.o.sha256 = memcpy(p, o->sha256 ? o->sha256 : "", h), p += h;
    c.o.error = o->error ? memcpy(p, o->error, e) : NULL;
    pthread_mutex_lock(&w->mu);
    void *grown = w->noutcomes < MAX_PENDING_OUTCOMES
                      ? realloc(w->outcomes, (w->noutcomes + 1) * sizeof *w->outcomes)
                      : NULL;
    if (grown) {
        w->outcomes = grown;
        w->outcomes[w->noutcomes++] = c;
    } else {
        free(c.text); /* the loop is not draining: the log has it anyway */
    }
    pthread_mutex_unlock(&w->mu);
    uint64_t one = 1;
    if (write(w->efd, &one, sizeof one) < 0) {
        /* the counter is only a wake-up: a full counter still wakes */
    }
}

static void run_once(struct ck_upload_worker *w, sqlite3 *db)
{
    struct ck_upload_report rep = {0};
    struct ck_uploader_run_opts ro = {.wait_retries = false, .on_job = on_job, .on_job_arg = w};
    int queued = 0;
    int err = ck_uploader_enqueue_pmf(db, w->cfg->upload_stores, w->cfg->n_upload_stores, w->root,
                                      &queued);
    if (err == 0 && queued)
        ck_info("upload.queued_tree", "dir=\"%s\" jobs=%d", w->root, queued);
    if (err == 0)
        err = ck_uploader_run(db, &w->cfg->upload, w->spool, &w->ctl, &ro, &rep);
    if (err < 0) {
        ck_err("upload.queue_failed", "%s", ck_error_msg());
        rep.left = 1; /* look again later */
    } else if (rep.done || rep.failed || rep.left) {
        ck_info("upload.summary", "done=%d failed=%d left=%d blocked=%d%s", rep.done, rep.failed,
                rep.left, rep.blocked, rep.stopped ? " stopped=yes" : "");
    }
    pthread_mutex_lock(&w->mu);
    w->retry_later = rep.left > 0 && !rep.stopped;
    pthread_mutex_unlock(&w->mu);
}

static void *thread_main(void *arg)
{
    struct ck_upload_worker *w = arg;
    sqlite3 *db = NULL;
    int err = ck_state_open_db(w->db_path, &db);
    if (err == 0)
        err = ck_queue_init(db);
    if (err < 0)
        ck_err("upload.queue_failed", "%s: no uploads until the next start", ck_error_msg());
    pthread_mutex_lock(&w->mu);
    while (err == 0 && !w->stopping) {
        if (!w->kicked) {
            if (w->retry_later) {
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_sec += RETRY_LOOK_S;
                if (pthread_cond_timedwait(&w->cv, &w->mu, &until) != 0)
                    w->kicked = true; /* time to look at the retries */
            } else {
                pthread_cond_wait(&w->cv, &w->mu);
            }
            continue;
        }
        w->kicked = false;
        w->running = true;
        pthread_mutex_unlock(&w->mu);
        run_once(w, db);
        pthread_mutex_lock(&w->mu);
        w->running = false;
        pthread_cond_broadcast(&w->cv);
    }
    w->thread_done = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    sqlite3_close(db);
    return NULL;
}

int ck_upload_worker_start(struct ck_upload_worker **out, const struct ck_config *cfg,
                           const char *dir, const char *state_dir)
{
    struct ck_upload_worker *w = calloc(1, sizeof *w);
    int err;
    *out = NULL;
    if (!w)
        return ck_error(CK_ENOMEM, "out of memory");
    w->cfg = cfg;
    w->efd = -1;
    if (!realpath(dir, w->root))
        snprintf(w->root, sizeof w->root, "%s", dir);
    if ((err = ck_path_join(w->db_path, sizeof w->db_path, state_dir, "state.db")) < 0 ||
        (err = ck_path_join(w->spool, sizeof w->spool, state_dir, "spool")) < 0) {
        free(w);
        return err;
    }
    w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->efd < 0) {
        free(w);
        return ck_error_os(CK_EIO, "cannot create an eventfd for the uploads");
    }
    ck_upload_ctl_init(&w->ctl, cfg->upload.grace);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->tid, NULL, thread_main, w) != 0) {
        ck_upload_worker_free(w);
        return ck_error(CK_ENOMEM, "cannot start the upload thread");
    }
    w->started = true;
    *out = w;
    return 0;
}

int ck_upload_worker_fd(const struct ck_upload_worker *w)
{
    return w->efd;
}

void ck_upload_worker_kick(struct ck_upload_worker *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->kicked = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void ck_upload_worker_drain(struct ck_upload_worker *w,
                            void (*fn)(void *arg, const struct ck_upload_outcome *o), void *arg)
{
    uint64_t n;
    if (!w)
        return;
    if (read(w->efd, &n, sizeof n) < 0) {
        /* nothing counted: fine, the list below says what is there */
    }
    pthread_mutex_lock(&w->mu);
    struct outcome *list = w->outcomes;
    size_t count = w->noutcomes;
    w->outcomes = NULL;
    w->noutcomes = 0;
    pthread_mutex_unlock(&w->mu);
    for (size_t i = 0; i < count; i++) {
        if (fn)
            fn(arg, &list[i].o);
        free(list[i].text);
    }
    free(list);
}

void ck_upload_worker_stop(struct ck_upload_worker *w, double grace)
{
    if (!w)
        return;
    w->ctl.grace = grace;
    ck_upload_ctl_stop(&w->ctl); /* in-flight transfers: until now + grace */
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

bool ck_upload_worker_is_idle(struct ck_upload_worker *w)
{
    pthread_mutex_lock(&w->mu);
    bool idle = w->thread_done || (!w->kicked && !w->running);
    pthread_mutex_unlock(&w->mu);
    return idle;
}

void ck_upload_worker_join(struct ck_upload_worker *w)
{
    if (!w || !w->started)
        return;
    ck_upload_worker_stop(w, w->ctl.grace);
    pthread_join(w->tid, NULL);
    w->started = false;
}

void ck_upload_worker_free(struct ck_upload_worker *w)
{
    if (!w)
        return;
    ck_upload_worker_join(w);
    ck_upload_worker_drain(w, NULL, NULL);
    if (w->efd >= 0)
        close(w->efd);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}
