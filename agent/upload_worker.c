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

struct ck_upload_worker {
    const struct ck_config *cfg;
    char root[PATH_MAX], db_path[PATH_MAX], spool[PATH_MAX];
    struct ck_sender *sender;
    ck_upload_outcome_fn on_outcome;
    void *arg;
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

/* One round of the upload stage (agent/upload_round.h) in the helper. */
static double round_main(void *arg)
{
    struct ck_upload_worker *w = arg;
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

static void on_record(void *arg, const char *data, size_t len)
{
    struct ck_upload_worker *w = arg;
    const char *f[OUTCOME_FIELDS];
    size_t n = 0, pos = 0;
    char *copy = malloc(len + 1); /* the last field needs its terminator */
    if (!copy) {
        ck_warn("upload.outcome_lost", "out of memory");
        return;
    }
    memcpy(copy, data, len);
    copy[len] = '\0';
    data = copy;
    while (n < OUTCOME_FIELDS && pos <= len) {
        f[n++] = data + pos;
        const char *z = memchr(data + pos, '\0', len - pos);
        if (!z)
            break;
        pos = (size_t)(z - data) + 1;
    }
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
    if (w->on_outcome)
        w->on_outcome(w->arg, &o);
    free(copy);
}

int ck_upload_worker_start(struct ck_upload_worker **out, const struct ck_config *cfg,
                           const char *dir, struct ck_state *st, struct ck_loop *loop,
                           ck_upload_outcome_fn on_outcome, void *arg)
{
    struct ck_upload_worker *w = calloc(1, sizeof *w);
    int err;
    *out = NULL;
    if (!w)
        return ck_error(CK_ENOMEM, "out of memory");
    w->cfg = cfg;
    w->on_outcome = on_outcome;
    w->arg = arg;
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
