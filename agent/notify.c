#include "agent/notify.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/metrics.h"
#include "hooks/exec.h"
#include "writers/pmf.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#define META_MAX (64u << 20)

static const struct ck_pmf_checkpoint *find(const struct ck_pmf_meta *m, const char *ref)
{
    char txt[1024];
    for (size_t i = 0; i < m->ncheckpoints; i++)
        if (!strcmp(ck_pmf_ref_str(&m->checkpoints[i].ref, txt, sizeof txt), ref))
            return &m->checkpoints[i];
    return NULL;
}

static int emit_registered(struct ck_hooks *h, struct ck_state *st, const char *dir,
                           const struct ck_scan_result *res, const struct ck_pmf_meta *m,
                           const char *ref)
{
    struct ck_event ev;
    struct ck_ckpt_record rec;
    int err = ck_event_init(&ev, CK_EV_CHECKPOINT_REGISTERED);
    if (err < 0)
        return err;
    ev.dir = dir;
    ev.model_name = res->model_name[0] ? res->model_name : NULL;
    ev.model_id = res->model_id[0] ? res->model_id : NULL;
    ev.checkpoint = ref;
    const struct ck_pmf_checkpoint *c = m ? find(m, ref) : NULL;
    if (c) {
        ev.epoch = c->epoch;
        ev.path = c->path;
        ev.md5 = c->md5;
    }
    if (ck_state_ckpt_get(st, ref, &rec) == 0) {
        ev.source = rec.source;
        ev.sha256 = rec.sha256[0] ? rec.sha256 : NULL;
        ev.size = (int64_t)rec.size;
        if (!ev.path)
            ev.path = rec.tree_path;
    }
    ev.status = m ? ck_pmf_status_name(m->status) : NULL;
    return ck_hooks_emit(h, st->db, &ev);
}

static int emit_status(struct ck_hooks *h, struct ck_state *st, const char *dir,
                       const struct ck_scan_result *res)
{
    enum ck_event_type t;
    switch (res->new_status) {
    case CK_PMF_RUNNING:
        t = CK_EV_TRAINING_STARTED;
        break;
    case CK_PMF_FINISHED:
        t = CK_EV_TRAINING_FINISHED;
        break;
    case CK_PMF_FAILED:
        t = CK_EV_TRAINING_FAILED;
        break;
    default:
        return 0;
    }
    struct ck_event ev;
    int err = ck_event_init(&ev, t);
    if (err < 0)
        return err;
    ev.dir = dir;
    ev.model_name = res->model_name[0] ? res->model_name : NULL;
    ev.model_id = res->model_id[0] ? res->model_id : NULL;
    ev.status = ck_pmf_status_name(res->new_status);
    return ck_hooks_emit(h, st->db, &ev);
}

/* These run after the command's own work: they keep its error message (the
 * one main() prints) and log their own problems instead. */
struct saved_error {
    char msg[1024];
};

static void save_error(struct saved_error *e)
{
    snprintf(e->msg, sizeof e->msg, "%s", ck_error_msg());
}

static void restore_error(const struct saved_error *e)
{
    if (e->msg[0])
        ck_error(CK_ERR, "%s", e->msg);
    else
        ck_error_clear();
}

static int notify_scan(struct ck_hooks *h, struct ck_state *st, const char *dir,
                       const struct ck_scan_result *res)
{
    char path[PATH_MAX];
    struct ck_buf b = CK_BUF_INIT;
    struct ck_pmf_meta m;
    bool have_meta = false;
    int err = 0;
    ck_pmf_meta_init(&m);
    if (ck_path_join(path, sizeof path, dir, "metadata.yaml") == 0 &&
        ck_read_file(path, META_MAX, &b) == 0 && ck_pmf_parse(&m, path, b.data, b.len) == 0) {
        have_meta = true;
        ck_metrics_set(CK_M_CHECKPOINTS, (int64_t)m.ncheckpoints);
        if (m.latest_time.set)
            ck_metrics_set_max(CK_M_NEWEST_CHECKPOINT_TIME, (int64_t)m.latest_time.v);
    }
    ck_buf_release(&b);
    for (size_t i = 0; h && err == 0 && i < res->nregistered; i++)
        err = emit_registered(h, st, dir, res, have_meta ? &m : NULL, res->registered[i]);
    if (h && err == 0 && res->new_status != res->old_status)
        err = emit_status(h, st, dir, res);
    ck_pmf_meta_release(&m);
    return err;
}

int ck_notify_scan(struct ck_hooks *h, struct ck_state *st, const char *dir,
                   const struct ck_scan_result *res)
{
    struct saved_error e;
    save_error(&e);
    int err = notify_scan(h, st, dir, res);
    if (err < 0) {
        ck_err("hooks.emit", "%s", ck_error_msg());
        ck_metrics_add(CK_M_FAILURES_HOOK, 1);
    }
    restore_error(&e);
    return err;
}

void ck_notify_finish(struct ck_hooks *h, struct ck_state *st, double budget_s)
{
    struct saved_error e;
    size_t delivered = 0;
    if (!h)
        return;
    save_error(&e);
    ck_hooks_wait_exec(h);
    int err = ck_hooks_run_due(h, st->db, ck_exec_now_ms() + (int64_t)(budget_s * 1000),
                               &delivered);
    if (err < 0)
        ck_err("webhook.outbox", "%s", ck_error_msg());
    restore_error(&e);
}

void ck_notify_write_metrics(const char *path)
{
    struct saved_error e;
    if (!path)
        return;
    save_error(&e);
    if (ck_metrics_write_file(path) < 0)
        ck_err("metrics.file", "%s", ck_error_msg());
    restore_error(&e);
}
