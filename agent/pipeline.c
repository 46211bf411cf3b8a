#include "agent/pipeline.h"
#include "agent/nodecommit.h"
#include "agent/nodes.h"
#include "agent/notify.h"
#include "agent/upload_round.h"
#include "agent/upload_worker.h"
#include "stores/queue.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ck_archives_add(struct ck_archives *a, const char *path, const char *key)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 4;
        struct ck_archive *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return ck_error(CK_ENOMEM, "out of memory");
        a->v = v;
        a->cap = cap;
    }
    struct ck_archive *e = &a->v[a->n];
    e->path = strdup(path);
    e->key = strdup(key);
    if (!e->path || !e->key) {
        free(e->path);
        free(e->key);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    a->n++;
    return 0;
}

void ck_archives_release(struct ck_archives *a)
{
    for (size_t i = 0; i < a->n; i++) {
        free(a->v[i].path);
        free(a->v[i].key);
    }
    free(a->v);
    memset(a, 0, sizeof *a);
}

/* pack: every stage over every checkpoint this pass registered */
static void pack(struct ck_pipeline *p, const struct ck_scan_result *res, struct ck_archives *out)
{
    for (size_t i = 0; i < res->nregistered; i++)
        for (const struct ck_pack_stage *s = ck_pack_stages; s->name; s++)
            if (s->pack(p, res->registered[i], out) < 0) {
                p->pack_failed++;
                ck_err("pipeline.pack_failed", "stage=%s checkpoint='%s': %s", s->name,
                       res->registered[i], ck_error_msg());
            }
}

/* verify: an archive a stage refuses is dropped from the list */
static void verify(struct ck_pipeline *p, struct ck_archives *a)
{
    size_t kept = 0;
    for (size_t i = 0; i < a->n; i++) {
        const struct ck_verify_stage *s;
        size_t counted = p->verify_failed; /* a stage may count its failures itself */
        for (s = ck_verify_stages; s->name; s++)
            if (s->verify(p, &a->v[i]) < 0)
                break;
        if (s->name) {
            if (p->verify_failed == counted)
                p->verify_failed++;
            ck_err("pipeline.verify_failed", "stage=%s archive='%s': %s: not uploaded", s->name,
                   a->v[i].path, ck_error_msg());
            free(a->v[i].path);
            free(a->v[i].key);
            continue;
        }
        a->v[kept++] = a->v[i];
    }
    a->n = kept;
}

/* upload, first half: the archives join the queue (the tree joins it in the round) */
static size_t queue_archives(struct ck_pipeline *p, const struct ck_archives *a)
{
    const struct ck_config *cfg = p->cfg;
    size_t queued = 0;
    int err = ck_queue_init(p->st->db);
    /* The tree first, so that the archives go after the checkpoint data and
     * before metadata.yaml (the queue runs by phase, then order; the round
     * queues the tree again and finds it queued). */
    if (err == 0 && (a->n || (p->queue_tree_now && !ck_nodes_is_multi(p->nodes)))) {
        /* (a node of several never sends the tree: its round queues its part) */
        char root[PATH_MAX];
        int q = 0;
        if (!realpath(p->dir, root))
            snprintf(root, sizeof root, "%s", p->dir);
        err =
            ck_uploader_enqueue_pmf(p->st->db, cfg->upload_stores, cfg->n_upload_stores, root, false, &q);
        queued += (size_t)q;
    }
    for (size_t s = 0; err == 0 && s < cfg->n_upload_stores; s++) {
        bool any = false;
        for (size_t i = 0; err == 0 && i < a->n; i++) {
            bool added = false;
            err = ck_uploader_enqueue_file(p->st->db, &cfg->upload_stores[s], a->v[i].path,
                                           a->v[i].key, 0, &added);
            queued += added;
            any |= added;
        }
        /* metadata.yaml may have gone while these were being made (a round
         * runs beside the pass): it goes again after them, so that the last
         * thing a store receives is metadata.yaml, its checkpoints' archives
         * there before it (a pending one waits for them anyway) */
        int64_t sid;
        bool redone;
        if (err == 0 && any &&
            (err = ck_queue_store_put(p->st->db, &cfg->upload_stores[s], &sid)) == 0)
            err = ck_queue_redo(p->st->db, sid, "metadata.yaml", &redone);
    }
    if (err < 0)
        ck_err("pipeline.queue_failed", "%s", ck_error_msg());
    return queued;
}

static void upload_job_ended(void *arg, const struct ck_upload_outcome *o)
{
    ck_pipeline_upload_event(arg, o);
}

/* upload, the round: here until the queue is empty */
static void upload_foreground(struct ck_pipeline *p)
{
    char root[PATH_MAX], spool[PATH_MAX];
    if (!realpath(p->dir, root))
        snprintf(root, sizeof root, "%s", p->dir);
    p->uploaded = true;
    if ((p->upload_err = ck_path_join(spool, sizeof spool, p->st->dir, "spool")) < 0)
        return;
    struct ck_upload_round r = {
        .cfg = p->cfg,
        .root = root,
        .spool = spool,
        .run = {.wait_retries = true, .on_job = upload_job_ended, .on_job_arg = p},
    };
    p->upload_err = ck_upload_round_foreground(p->st->db, &r, &p->upload);
}

static void node_committed(void *arg, const struct ck_node_commit *c)
{
    struct ck_pipeline *p = arg;
    ck_notify_committed(p->hooks, p->st, p->dir, c);
}

/* upload for a node of several: its part, then the commits (agent/nodecommit.h) */
static void upload_node_part(struct ck_pipeline *p)
{
    struct ck_noderound r = {
        .cfg = p->cfg,
        .dir = p->dir,
        .st = p->st,
        .nodes = p->nodes,
        .run = {.wait_retries = true, .on_job = upload_job_ended, .on_job_arg = p},
        .on_commit = node_committed,
        .on_commit_arg = p,
    };
    p->uploaded = true;
    if ((p->upload_err = ck_noderound_run(&r)) == 0)
        p->upload_err = r.upload_err;
    p->upload = r.upload;
    p->nodes_refused = r.refused;
    p->nodes_failed = r.failed;
}

int ck_pipeline_pass(struct ck_pipeline *p, const struct ck_scan_opts *so,
                     struct ck_scan_result *res)
{
    struct ck_archives archives = {0};
    struct ck_retention_result resumed;
    /* a retention pass killed mid-deletion: finished before the scan sees its remains
     * (the watcher's deletions are made in its own process too: agent/retention_worker.h) */
    if (ck_retention_resume(p->st, p->dir, p->cfg, p->hooks, &resumed) < 0)
        ck_err("pipeline.retention_failed", "%s", ck_error_msg());
    int err = ck_scan_run(p->st, so, res);
    /* events: only what metadata.yaml took */
    if (err == 0 || res->metadata_written)
        p->events_err = ck_notify_scan(p->hooks, p->st, p->dir, res);
    pack(p, res, &archives);
    verify(p, &archives);
    size_t queued = p->cfg->n_upload_stores ? queue_archives(p, &archives) : 0;
    ck_archives_release(&archives);
    /* upload. Foreground: whenever the pass worked, so that what an earlier
     * run left queued goes too; what is registered is complete even when
     * another checkpoint had a problem. The helper: when the tree changed
     * (data first, metadata.yaml last: the queue's order). */
    if (!p->uploads && ck_nodes_is_multi(p->nodes)) {
        /* no retention for a node of several (refused at the start: ck_noderound_check) */
        if (err == 0)
            upload_node_part(p);
    } else if (!p->uploads) {
        if (err == 0 && p->cfg->n_upload_stores > 0)
            upload_foreground(p);
        /* retention: the stores are checked again, whatever the round said */
        if (err == 0 &&
            (p->retention_err = ck_retention_run(p->st, p->dir, p->cfg, p->hooks, false,
                                                     &p->retention)) < 0)
            ck_err("pipeline.retention_failed", "%s", ck_error_msg());
        /* retention.store: the stores' metadata.yaml without what is being
         * pruned goes now, then a second look deletes their files */
        if (err == 0 && p->retention_err == 0 && p->retention.prune_waiting &&
            p->cfg->n_upload_stores > 0) {
            upload_foreground(p);
            if ((p->retention_err = ck_retention_run(p->st, p->dir, p->cfg, p->hooks, false,
                                                     &p->retention)) < 0)
                ck_err("pipeline.retention_failed", "%s", ck_error_msg());
        }
    } else if (res->metadata_written || queued) {
        ck_upload_worker_kick(p->uploads);
    }
    return err;
}

int ck_pipeline_failed(const struct ck_pipeline *p)
{
    char why[512] = "";
    size_t hooks = ck_hooks_failures(p->hooks);
#define WHY(...) snprintf(why + strlen(why), sizeof why - strlen(why), __VA_ARGS__)
    if (p->pack_failed)
        WHY("%s%zu checkpoint(s) could not be packed", why[0] ? ", " : "", p->pack_failed);
    if (p->verify_failed)
        WHY("%s%zu archive(s) failed verification", why[0] ? ", " : "", p->verify_failed);
    if (hooks)
        WHY("%s%zu hook delivery(ies) given up", why[0] ? ", " : "", hooks);
    if (p->retention_err < 0)
        WHY("%sthe retention stage failed", why[0] ? ", " : "");
    if (p->nodes_refused)
        WHY("%s%zu step(s) not committed across nodes", why[0] ? ", " : "", p->nodes_refused);
    if (p->nodes_failed)
        WHY("%s%zu store operation(s) of the commit failed", why[0] ? ", " : "",
            p->nodes_failed);
#undef WHY
    return why[0] ? ck_error(CK_ERR, "%s (see the log)", why) : 0;
}

void ck_pipeline_upload_event(struct ck_pipeline *p, const struct ck_upload_outcome *o)
{
    ck_notify_upload(p->hooks, p->st, p->dir, o);
}

void ck_pipeline_finish(struct ck_pipeline *p)
{
    ck_notify_finish(p->hooks, p->st, CK_NOTIFY_FINISH_BUDGET_S);
}
