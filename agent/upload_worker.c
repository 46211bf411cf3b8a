#include "agent/upload_worker.h"
#include "agent/sender.h"
#include "agent/state.h"
#include "agent/upload_round.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "stores/queue.h"

#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A failed job waits for its retry time; a round is run again this often. */
#define RETRY_LOOK_S 5
/* Fields of an outcome record, NUL-separated, in this order. */
#define OUTCOME_FIELDS 10
/* A commit record starts with this field (an outcome's first is "0" or "1"). */
#define COMMIT_TAG "commit"
#define COMMIT_FIELDS 8

struct ck_upload_worker {
    const struct ck_config *cfg;
    char root[PATH_MAX], db_path[PATH_MAX], spool[PATH_MAX];
    struct ck_sender *sender;
    struct ck_upload_worker_calls calls;
    struct ck_nodes nodes; /* count 1: a single node */
    struct ck_upload_ctl ctl; /* the helper's copy is the one that matters */
};

/* ---- in the helper ---- */

/* ok, bytes, seconds, store_url, key, src, sha256, check, has_error, error */
static void send_outcome(void *arg, const struct ck_upload_outcome *o)
{
    struct ck_buf b = CK_BUF_INIT;
    (void)arg;
    ck_buf_printf(&b, "%d%c%" PRIu64 "%c%.6f%c", o->ok ? 1 : 0, 0, o->bytes, 0, o->seconds, 0);
    const char *s[] = {o->store_url, o->key, o->src, o->sha256, o->check};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        ck_buf_puts(&b, s[i] ? s[i] : "");
        ck_buf_putc(&b, '\0');
    }
    ck_buf_printf(&b, "%d%c%s", o->error ? 1 : 0, 0, o->error ? o->error : "");
    if (ck_sender_send(b.data, b.len) < 0)
        ck_warn("upload.outcome_lost", "key=\"%s\": the watcher is not reading",
                o->key ? o->key : "");
    ck_buf_release(&b);
}

/* tag, store_url, checkpoint, record_key, epoch, nodes, files, bytes */
static void send_commit(void *arg, const struct ck_node_commit *c)
{
    struct ck_buf b = CK_BUF_INIT;
    (void)arg;
    ck_buf_printf(&b, COMMIT_TAG "%c%s%c%s%c%s%c%" PRId64 "%c%d%c%zu%c%" PRIu64, 0, c->store_url,
                  0, c->checkpoint, 0, c->record_key, 0, c->epoch, 0, c->nodes, 0, c->files, 0,
                  c->bytes);
    if (ck_sender_send(b.data, b.len) < 0)
        ck_warn("nodes.event_lost", "checkpoint='%s': the watcher is not reading: its "
                "checkpoint.committed is not emitted", c->checkpoint);
    ck_buf_release(&b);
}

/* A node of several: its part and the commits (agent/nodecommit.h), on the
 * helper's own connection. The next round comes when the queue wants a
 * retry, or when the steps waiting for other nodes should look again. */
static double node_round(struct ck_upload_worker *w)
{
    struct ck_state st = {0};
    int err = ck_state_open(&st, w->root);
    if (err < 0) {
        ck_err("upload.queue_failed", "%s", ck_error_msg());
        return RETRY_LOOK_S;
    }
    struct ck_noderound r = {
        .cfg = w->cfg,
        .dir = w->root,
        .st = &st,
        .nodes = &w->nodes,
        .run = {.wait_retries = false, .on_job = send_outcome},
        .ctl = &w->ctl,
        .on_commit = send_commit,
    };
    err = ck_noderound_run(&r);
    ck_state_close(&st);
    if (err < 0) {
        ck_err("upload.queue_failed", "%s", ck_error_msg());
        return RETRY_LOOK_S;
    }
    if (r.upload.stopped)
        return -1;
    double next = r.next_look;
    if ((r.upload.left > 0 || r.failed > 0) && (next < 0 || next > RETRY_LOOK_S))
        next = RETRY_LOOK_S;
    return next;
}

/* One round of the upload stage (agent/upload_round.h) in the helper. */
static double round_main(void *arg)
{
    struct ck_upload_worker *w = arg;
    if (ck_nodes_is_multi(&w->nodes))
        return node_round(w);
    struct ck_upload_report rep = {0};
    struct ck_upload_round r = {
        .cfg = w->cfg,
        .root = w->root,
        .spool = w->spool,
        .run = {.wait_retries = false, .on_job = send_outcome},
        .quiet_when_idle = true,
    };
    sqlite3 *db = NULL;
    int err = ck_state_open_db(w->db_path, &db);
    if (err == 0)
        err = ck_upload_round_run(db, &r, &w->ctl, &rep);
    sqlite3_close(db);
    if (err < 0) {
        ck_err("upload.queue_failed", "%s", ck_error_msg());
        return RETRY_LOOK_S; /* look again later */
    }
    return rep.left > 0 && !rep.stopped ? RETRY_LOOK_S : -1;
}

static void round_stop(void *arg)
{
    struct ck_upload_worker *w = arg;
    ck_upload_ctl_stop(&w->ctl); /* lock free: in-flight transfers get the grace */
}

/* ---- in the watcher ---- */

static void on_commit_record(struct ck_upload_worker *w, const char *data, size_t len)
{
    const char *f[COMMIT_FIELDS];
    if (ck_sender_fields(data, len, f, COMMIT_FIELDS) != COMMIT_FIELDS) {
        ck_warn("nodes.event_lost", "a commit record of %zu bytes from the helper cannot be "
                "read", len);
        return;
    }
    struct ck_node_commit c = {
        .store_url = f[1],
        .checkpoint = f[2],
        .record_key = f[3],
        .epoch = strtoll(f[4], NULL, 10),
        .nodes = atoi(f[5]),
        .files = (size_t)strtoull(f[6], NULL, 10),
        .bytes = strtoull(f[7], NULL, 10),
    };
    if (w->calls.on_commit)
        w->calls.on_commit(w->calls.arg, &c);
}

static void on_record(void *arg, const char *data, size_t len)
{
    struct ck_upload_worker *w = arg;
    const char *f[OUTCOME_FIELDS];
    size_t n;
    char *copy = malloc(len + 1); /* the last field needs its terminator */
    if (!copy) {
        ck_warn("upload.outcome_lost", "out of memory");
        return;
    }
    memcpy(copy, data, len);
    copy[len] = '\0';
    data = copy;
    if (len > sizeof COMMIT_TAG && !memcmp(data, COMMIT_TAG, sizeof COMMIT_TAG)) {
        on_commit_record(w, data, len);
        free(copy);
        return;
    }
    n = ck_sender_fields(data, len, f, OUTCOME_FIELDS);
    if (n != OUTCOME_FIELDS) {
        ck_warn("upload.outcome_lost", "a record of %zu bytes from the helper cannot be read", len);
        free(copy);
        return;
    }
    struct ck_upload_outcome o = {
        .ok = f[0][0] == '1',
        .bytes = strtoull(f[1], NULL, 10),
        .seconds = strtod(f[2], NULL),
        .store_url = f[3],
        .key = f[4],
        .src = f[5],
        .sha256 = f[6],
        .check = f[7][0] ? f[7] : NULL,
        .error = f[8][0] == '1' ? f[9] : NULL,
    };
    if (w->calls.on_outcome)
        w->calls.on_outcome(w->calls.arg, &o);
    free(copy);
}

int ck_upload_worker_start(struct ck_upload_worker **out, const struct ck_config *cfg,
                           const char *dir, struct ck_state *st, struct ck_loop *loop,
                           const struct ck_nodes *nodes, const struct ck_upload_worker_calls *calls)
{
    struct ck_upload_worker *w = calloc(1, sizeof *w);
    int err;
    *out = NULL;
    if (!w)
        return ck_error(CK_ENOMEM, "out of memory");
    w->cfg = cfg;
    w->calls = *calls;
    if (nodes)
        w->nodes = *nodes;
    else
        w->nodes.count = 1;
    if (!realpath(dir, w->root))
        snprintf(w->root, sizeof w->root, "%s", dir);
    if ((err = ck_state_db_path(st, w->db_path, sizeof w->db_path)) < 0 ||
        (err = ck_path_join(w->spool, sizeof w->spool, st->dir, "spool")) < 0) {
        free(w);
        return err;
    }
    ck_upload_ctl_init(&w->ctl, cfg->upload.grace);
    struct ck_sender_spec spec = {"upload", round_main, round_stop, on_record, w};
    if ((err = ck_sender_new(loop, &spec, st, &w->sender)) < 0) {
        free(w);
        return err;
    }
    *out = w;
    return 0;
}

void ck_upload_worker_kick(struct ck_upload_worker *w)
{
    if (w)
        ck_sender_kick(w->sender);
}

bool ck_upload_worker_is_idle(const struct ck_upload_worker *w)
{
    return !w || !ck_sender_busy(w->sender);
}

void ck_upload_worker_pump(struct ck_upload_worker *w, int timeout_ms)
{
    if (w)
        ck_sender_pump(w->sender, timeout_ms);
}

void ck_upload_worker_stop(struct ck_upload_worker *w, double grace)
{
    /* the helper's own deadline is now + upload.grace; past the watcher's,
     * it is killed: a transfer cut there resumes at the next start */
    if (w)
        ck_sender_stop(w->sender, grace + 1.0);
}

void ck_upload_worker_free(struct ck_upload_worker *w)
{
    if (!w)
        return;
    ck_sender_free(w->sender);
    free(w);
}
