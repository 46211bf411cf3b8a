#include "agent/retention_worker.h"
#include "agent/sender.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/log.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Records from the helper, NUL-separated fields after a one-letter type:
 *   C ref md5 stores   a checkpoint whose copies checked out
 *   E held requeued    the round ended */
#define CHECKED_FIELDS 4
#define END_FIELDS 3

struct ck_retention_worker {
    const struct ck_config *cfg;
    char dir[PATH_MAX];
    struct ck_sender *sender;
    struct ck_retention_worker_cb cb;
};

/* ---- in the helper ---- */

static void send_checked(void *arg, const struct ck_retention_checked *c)
{
    struct ck_buf b = CK_BUF_INIT;
    (void)arg;
    ck_buf_printf(&b, "C%c%s%c%s%c%s", 0, c->ref, 0, c->md5, 0, c->stores);
    if (ck_sender_send(b.data, b.len) < 0)
        ck_warn("retention.report_lost", "checkpoint='%s': the watcher is not reading", c->ref);
    ck_buf_release(&b);
}

static double round_main(void *arg)
{
    struct ck_retention_worker *w = arg;
    struct ck_retention_result res = {0};
    struct ck_state st;
    int err = ck_state_open(&st, w->dir);
    if (err == 0) {
        err = ck_retention_check(&st, w->dir, w->cfg, send_checked, w, &res);
        ck_state_close(&st);
    }
    if (err < 0)
        ck_err("retention.failed", "%s", ck_error_msg());
    char rec[64];
    /* requeued: what wants an upload round (a copy sent again, the stores'
     * metadata.yaml without what is being pruned) */
    int n = snprintf(rec, sizeof rec, "E%c%zu%c%zu", 0, res.held + (err < 0) + res.prune_waiting,
                     0, res.requeued + res.prune_waiting);
    ck_sender_send(rec, (size_t)n);
    return -1;
}

/* From the helper's SIGTERM handler: a round deletes nothing, so ending it
 * anywhere loses nothing (the next round checks again). */
static void round_stop(void *arg)
{
    (void)arg;
    _exit(0);
}

/* ---- in the watcher ---- */


static void on_record(void *arg, const char *data, size_t len)
{
    struct ck_retention_worker *w = arg;
    const char *f[CHECKED_FIELDS];
    char *copy = malloc(len + 1); /* the last field needs its terminator */
    if (!copy) {
        ck_warn("retention.report_lost", "out of memory");
        return;
    }
    memcpy(copy, data, len);
    copy[len] = '\0';
    size_t n = ck_sender_fields(copy, len, f, CHECKED_FIELDS);
    if (n == CHECKED_FIELDS && !strcmp(f[0], "C")) {
        struct ck_retention_checked c = {f[1], f[2], f[3]};
        if (w->cb.on_checked)
            w->cb.on_checked(w->cb.arg, &c);
    } else if (n == END_FIELDS && !strcmp(f[0], "E")) {
        if (w->cb.on_round)
            w->cb.on_round(w->cb.arg, strtoull(f[1], NULL, 10), strtoull(f[2], NULL, 10));
    } else {
        ck_warn("retention.report_lost", "a record of %zu bytes from the helper cannot be read",
                len);
    }
    free(copy);
}

int ck_retention_worker_start(struct ck_retention_worker **out, const struct ck_config *cfg,
                              const char *dir, struct ck_state *st, struct ck_loop *loop,
                              const struct ck_retention_worker_cb *cb)
{
    struct ck_retention_worker *w = calloc(1, sizeof *w);
    int err;
    *out = NULL;
    if (!w)
        return ck_error(CK_ENOMEM, "out of memory");
    w->cfg = cfg;
    w->cb = *cb;
    if (snprintf(w->dir, sizeof w->dir, "%s", dir) >= (int)sizeof w->dir) {
        free(w);
        return ck_error(CK_ESIZE, "'%s': path too long", dir);
    }
    struct ck_sender_spec spec = {"retention", round_main, round_stop, on_record, w};
    if ((err = ck_sender_new(loop, &spec, st, &w->sender)) < 0) {
        free(w);
        return err;
    }
    *out = w;
    return 0;
}

void ck_retention_worker_kick(struct ck_retention_worker *w)
{
    if (w)
        ck_sender_kick(w->sender);
}

void ck_retention_worker_free(struct ck_retention_worker *w)
{
    if (!w)
        return;
    /* what the helper checked but did not report is checked again next time */
    w->cb.on_checked = NULL;
    w->cb.on_round = NULL;
    ck_sender_stop(w->sender, 1.0);
    ck_sender_free(w->sender);
    free(w);
}
