#include "agent/notify.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/metrics.h"
#include "hooks/exec.h"
#include "writers/pmf.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define META_MAX (64u << 20)

static const struct ck_pmf_checkpoint *find(const struct ck_pmf_meta *m, const char *ref)
{
    char txt[1024];
    for (size_t i = 0; i < m->ncheckpoints; i++)
        if (!strcmp(ck_pmf_ref_str(&m->checkpoints[i].ref, txt, sizeof txt), ref))
            return &m->checkpoints[i];
    return NULL;
}

/* c: the checkpoint's entry in metadata.yaml m (NULL: neither is known).
 * Passed in, not looked up: a first pass over 10,000 new checkpoints looked
 * each up by a walk of all of them, a third of its CPU. */
static int emit_registered(struct ck_hooks *h, struct ck_state *st, const char *dir,
                           const struct ck_scan_result *res, const struct ck_pmf_meta *m,
                           const struct ck_pmf_checkpoint *c, const char *ref, char *id_out,
                           size_t id_outsz)
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
    snprintf(id_out, id_outsz, "%s", ev.id);
    return ck_hooks_emit(h, st->db, &ev);
}

static int emit_status(struct ck_hooks *h, struct ck_state *st, const char *dir,
                       const struct ck_scan_result *res, enum ck_pmf_status status)
{
    enum ck_event_type t;
    switch (status) {
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
    ev.status = ck_pmf_status_name(status);
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

/* What was announced, so that a crash between metadata.yaml and the outbox
 * loses no event: each pass announces whatever metadata.yaml lists and was
 * not announced yet (at least once: the outbox and this table change in one
 * savepoint). The first pass that creates the table takes what was
 * registered before as known: turning hooks on does not replay a history. */
static const char announced_schema[] =
    "CREATE TABLE IF NOT EXISTS hook_announced (ref TEXT PRIMARY KEY, event_id TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS hook_announced_status (id INTEGER PRIMARY KEY CHECK (id = 1),"
    "  status TEXT NOT NULL);";

/* Runs sql with up to two text parameters: 1 when it gave a row, 0 when not. */
static int db_run(sqlite3 *db, const char *sql, const char *a, const char *b)
{
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK)
        return ck_error(CK_EIO, "state database: %s", sqlite3_errmsg(db));
    if (a)
        sqlite3_bind_text(q, 1, a, -1, SQLITE_TRANSIENT);
    if (b)
        sqlite3_bind_text(q, 2, b, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW)
        return ck_error(CK_EIO, "state database: %s", sqlite3_errmsg(db));
    return rc == SQLITE_ROW ? 1 : 0;
}

static int mark(sqlite3 *db, const char *ref, const char *id)
{
    return db_run(db, "INSERT OR REPLACE INTO hook_announced (ref, event_id) VALUES (?, ?)", ref,
                  id);
}

static int set_status(sqlite3 *db, const char *status)
{
    return db_run(db, "INSERT OR REPLACE INTO hook_announced_status (id, status) VALUES (1, ?)",
                  status, NULL);
}

static bool in_list(char *const *list, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i], s))
            return true;
    return false;
}

/* First use of the table: what is already there is not news. */
static int seed(sqlite3 *db, const struct ck_pmf_meta *m, const struct ck_scan_result *res)
{
    char txt[1024];
    int err = 0;
    for (size_t i = 0; err >= 0 && i < m->ncheckpoints; i++) {
        const char *ref = ck_pmf_ref_str(&m->checkpoints[i].ref, txt, sizeof txt);
        if (!in_list(res->registered, res->nregistered, ref))
            err = mark(db, ref, "");
    }
    return err < 0 ? err : set_status(db, ck_pmf_status_name(res->old_status));
}

/* Forgets checkpoints that left metadata.yaml (mirror_deletes): one may come
 * back under the same reference and is news again. */
static int forget_gone(sqlite3 *db, const struct ck_pmf_meta *m)
{
    sqlite3_stmt *q;
    int err = 0;
    if (sqlite3_prepare_v2(db, "SELECT ref FROM hook_announced", -1, &q, NULL) != SQLITE_OK)
        return ck_error(CK_EIO, "state database: %s", sqlite3_errmsg(db));
    struct ck_buf gone = CK_BUF_INIT; /* NUL-separated */
    while (err == 0 && sqlite3_step(q) == SQLITE_ROW) {
        const char *ref = (const char *)sqlite3_column_text(q, 0);
        if (ref && !find(m, ref))
            err = ck_buf_append(&gone, ref, strlen(ref) + 1);
    }
    sqlite3_finalize(q);
    for (size_t off = 0; err == 0 && off < gone.len; off += strlen(gone.data + off) + 1)
        err = db_run(db, "DELETE FROM hook_announced WHERE ref = ?", gone.data + off, NULL);
    ck_buf_release(&gone);
    return err < 0 ? err : 0;
}

static int savepoint(sqlite3 *db, const char *sql)
{
    if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK)
        return ck_error(CK_EIO, "state database: %s", sqlite3_errmsg(db));
    return 0;
}

/* Set once a pass has looked at every checkpoint of metadata.yaml. */
static bool all_checked;

static int announce_in(struct ck_hooks *h, struct ck_state *st, const char *dir,
                       const struct ck_scan_result *res, const struct ck_pmf_meta *m);

/* One outer savepoint for the whole pass: the per-event savepoints inside it
 * nest, so 1,000 new checkpoints cost one commit (one fsync), not 1,000. */
static int announce(struct ck_hooks *h, struct ck_state *st, const char *dir,
                    const struct ck_scan_result *res, const struct ck_pmf_meta *m)
{
    /* Alone, the pass takes the write lock first (BEGIN IMMEDIATE waits for
     * it): a deferred transaction that reads, then writes after another
     * connection committed, fails at once with "database is locked", and the
     * event would be lost. Inside a caller's transaction, a savepoint nests. */
    bool own = sqlite3_get_autocommit(st->db) != 0;
    int err = savepoint(st->db, own ? "BEGIN IMMEDIATE" : "SAVEPOINT announce_pass");
    if (err < 0)
        return err;
    err = announce_in(h, st, dir, res, m);
    if (err < 0)
        sqlite3_exec(st->db, own ? "ROLLBACK" : "ROLLBACK TO announce_pass", NULL, NULL, NULL);
    const char *done = own ? (err < 0 ? NULL : "COMMIT") : "RELEASE announce_pass";
    if (done && sqlite3_exec(st->db, done, NULL, NULL, NULL) != SQLITE_OK && err >= 0)
        err = ck_error(CK_EIO, "state database: %s", sqlite3_errmsg(st->db));
    return err;
}

static int announce_in(struct ck_hooks *h, struct ck_state *st, const char *dir,
                       const struct ck_scan_result *res, const struct ck_pmf_meta *m)
{
    char txt[1024], id[64];
    sqlite3 *db = st->db;
    int err, existed;
    if ((existed = db_run(db, "SELECT 1 FROM sqlite_master WHERE name = 'hook_announced'", NULL,
                          NULL)) < 0)
        return existed;
    if ((err = savepoint(db, announced_schema)) < 0)
        return err;
    if (!existed && (err = seed(db, m, res)) < 0)
        return err;
    if (res->removed && (err = forget_gone(db, m)) < 0)
        return err;
    /* Every checkpoint is looked at once per process (what a crash left
     * unannounced); after that only what the pass registered can be new. */
    for (size_t i = 0; i < m->ncheckpoints; i++) {
        const char *ref = ck_pmf_ref_str(&m->checkpoints[i].ref, txt, sizeof txt);
        if (all_checked && !in_list(res->registered, res->nregistered, ref))
            continue;
        if ((err = db_run(db, "SELECT 1 FROM hook_announced WHERE ref = ?", ref, NULL)) != 0) {
            if (err < 0)
                return err;
            continue;
        }
        if ((err = savepoint(db, "SAVEPOINT announce")) < 0)
            return err;
        if ((err = emit_registered(h, st, dir, res, m, &m->checkpoints[i], ref, id, sizeof id)) >=
            0)
            err = mark(db, ref, id);
        if (err < 0)
            sqlite3_exec(db, "ROLLBACK TO announce", NULL, NULL, NULL);
        sqlite3_exec(db, "RELEASE announce", NULL, NULL, NULL);
        if (err < 0)
            return err;
    }
    all_checked = true;
    const char *status = ck_pmf_status_name(m->status);
    if ((err = db_run(db, "SELECT 1 FROM hook_announced_status WHERE status = ?", status, NULL)) !=
        0)
        return err < 0 ? err : 0;
    if ((err = savepoint(db, "SAVEPOINT announce")) < 0)
        return err;
    if ((err = emit_status(h, st, dir, res, m->status)) >= 0)
        err = set_status(db, status);
    if (err < 0)
        sqlite3_exec(db, "ROLLBACK TO announce", NULL, NULL, NULL);
    sqlite3_exec(db, "RELEASE announce", NULL, NULL, NULL);
    return err < 0 ? err : 0;
}

static int notify_scan(struct ck_hooks *h, struct ck_state *st, const char *dir,
                       const struct ck_scan_result *res)
{
    char path[PATH_MAX], id[64];
    struct ck_buf b = CK_BUF_INIT;
    struct ck_pmf_meta m;
    bool have_meta = false;
    int err = 0;
    /* a pass that wrote nothing changed nothing: no need to read the tree (the
     * watcher runs many of them) */
    if (all_checked && !res->metadata_written)
        return 0;
    ck_pmf_meta_init(&m);
    const struct ck_pmf_meta *mp = res->meta; /* the pass's own, when it kept it */
    if (!mp && ck_path_join(path, sizeof path, dir, "metadata.yaml") == 0 &&
        ck_read_file(path, META_MAX, &b) == 0 && ck_pmf_parse(&m, path, b.data, b.len) == 0)
        mp = &m;
    if (mp) {
        have_meta = true;
        ck_metrics_set(CK_M_CHECKPOINTS, (int64_t)mp->ncheckpoints);
        if (mp->latest_time.set)
            ck_metrics_set_max(CK_M_NEWEST_CHECKPOINT_TIME, (int64_t)mp->latest_time.v);
    }
    ck_buf_release(&b);
    if (h && have_meta) {
        err = announce(h, st, dir, res, mp);
    } else if (h) {
        /* no readable metadata.yaml: what the pass says, without the bookkeeping */
        for (size_t i = 0; err >= 0 && i < res->nregistered; i++)
            err = emit_registered(h, st, dir, res, NULL, NULL, res->registered[i], id, sizeof id);
        if (err >= 0 && res->new_status != res->old_status)
            err = emit_status(h, st, dir, res, res->new_status);
    }
    ck_pmf_meta_release(&m);
    return err < 0 ? err : 0;
}

int ck_notify_scan(struct ck_hooks *h, struct ck_state *st, const char *dir,
                   const struct ck_scan_result *res)
{
    struct saved_error e;
    save_error(&e);
    /* exec runs an earlier process stored and never finished: once per process */
    int err = h ? ck_hooks_exec_recover(h, st->db) : 0;
    if (err == 0)
        err = notify_scan(h, st, dir, res);
    if (err < 0) {
        ck_err("hooks.emit", "%s", ck_error_msg());
        ck_metrics_add(CK_M_FAILURES_HOOK, 1);
    }
    restore_error(&e);
    return err;
}

/* Emits an event of type for the model at dir, with the model id the state
 * knows, and what fill (may be NULL) sets from arg. A failure is logged;
 * the caller's error message is kept. */
static void emit_for_model(struct ck_hooks *h, struct ck_state *st, const char *dir,
                           enum ck_event_type type, void (*fill)(struct ck_event *, void *),
                           void *arg)
{
    struct saved_error e;
    struct ck_event ev;
    char *id = NULL;
    if (!h)
        return;
    save_error(&e);
    int err = ck_event_init(&ev, type);
    if (err == 0) {
        ck_state_get(st, "model_id", &id);
        ev.dir = dir;
        ev.model_id = id;
        if (fill)
            fill(&ev, arg);
        err = ck_hooks_emit(h, st->db, &ev);
    }
    if (err < 0)
        ck_err("hooks.emit", "%s", ck_error_msg());
    free(id);
    restore_error(&e);
}

void ck_notify_agent(struct ck_hooks *h, struct ck_state *st, const char *dir,
                     enum ck_event_type type)
{
    emit_for_model(h, st, dir, type, NULL, NULL);
}

static void fill_upload(struct ck_event *ev, void *arg)
{
    const struct ck_upload_outcome *o = arg;
    ev->source = o->src;
    ev->store = o->store_url;
    ev->remote_url = o->key;
    ev->bytes = (int64_t)o->bytes;
    ev->seconds = o->seconds;
    ev->sha256 = o->sha256 && o->sha256[0] ? o->sha256 : NULL;
    ev->error = o->error;
    ev->check = o->check;
}

void ck_notify_upload(struct ck_hooks *h, struct ck_state *st, const char *dir,
                      const struct ck_upload_outcome *o)
{
    emit_for_model(h, st, dir, o->ok ? CK_EV_UPLOAD_COMPLETED : CK_EV_UPLOAD_FAILED, fill_upload,
                   (void *)o);
}

/* checkpoint.committed's fields, and the text they borrow */
struct commit_fields {
    const struct ck_node_commit *c;
    char path[PATH_MAX], msg[128];
};

static void fill_commit(struct ck_event *ev, void *arg)
{
    struct commit_fields *f = arg;
    const struct ck_node_commit *c = f->c;
    /* the step as the store's metadata.yaml lists it */
    snprintf(f->path, sizeof f->path, "data/checkpoints/%s.md5sums", c->checkpoint);
    snprintf(f->msg, sizeof f->msg, "committed across %d nodes, %zu files", c->nodes, c->files);
    ev->checkpoint = c->checkpoint;
    ev->epoch = c->epoch;
    ev->path = f->path;
    ev->size = (int64_t)c->bytes;
    ev->store = c->store_url;
    ev->remote_url = c->record_key;
    ev->message = f->msg;
}

void ck_notify_committed(struct ck_hooks *h, struct ck_state *st, const char *dir,
                         const struct ck_node_commit *c)
{
    struct commit_fields f = {.c = c};
    emit_for_model(h, st, dir, CK_EV_CHECKPOINT_COMMITTED, fill_commit, &f);
}

void ck_notify_finish(struct ck_hooks *h, struct ck_state *st, double budget_s)
{
    struct saved_error e;
    size_t delivered = 0;
    if (!h)
        return;
    save_error(&e);
    ck_hooks_wait_exec(h);
    if (ck_hooks_exec_flush(h, st->db) < 0)
        ck_warn("hook.exec.flush", "%s: a later run may run them again", ck_error_msg());
    int err =
        ck_hooks_run_due(h, st->db, ck_mono_ms() + (int64_t)(budget_s * 1000), &delivered);
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

void ck_notify_load_totals(struct ck_state *st)
{
    struct saved_error e;
    char *text = NULL;
    save_error(&e);
    if (ck_state_get(st, "metrics_totals", &text) == 0 && text)
        ck_metrics_load_totals(text, strlen(text));
    free(text);
    restore_error(&e);
}

void ck_notify_save_totals(struct ck_state *st, bool succeeded)
{
    struct saved_error e;
    struct ck_buf b = CK_BUF_INIT;
    save_error(&e);
    if (succeeded)
        ck_metrics_set(CK_M_LAST_SUCCESS_TIME, (int64_t)time(NULL));
    if (ck_metrics_save_totals(&b) < 0 || ck_state_set(st, "metrics_totals", ck_buf_str(&b)) < 0)
        ck_warn("metrics.totals", "cannot keep the metrics for the next run: %s", ck_error_msg());
    ck_buf_release(&b);
    restore_error(&e);
}
