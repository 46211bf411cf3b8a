#include "agent/hook_worker.h"
#include "agent/sender.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>

/* A webhook helper's round ends by then; what is still due starts another. */
#define WEBHOOK_ROUND_S 60

struct ck_hook_worker {
    struct ck_hooks *hooks; /* owned */
    struct ck_loop *loop;
    struct ck_loop_handler *poller;
    struct ck_sender *wh;   /* webhook deliveries, NULL when there are no webhooks */
    atomic_bool wh_abort;   /* in the helper: stop between attempts */
    int64_t wh_drain_until; /* ck_mono_ms: a helper started now ends by then */
    char db_path[PATH_MAX]; /* the state database, for the helper's own connection */
};

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

/* In the webhook helper: delivers what is due, on a connection of its own. */
static double webhook_round(void *arg)
{
    struct ck_hook_worker *hw = arg;
    double again = -1;
    int64_t deadline =
        hw->wh_drain_until > 0 ? hw->wh_drain_until : ck_mono_ms() + WEBHOOK_ROUND_S * 1000;
    sqlite3 *db = NULL;
    int err = ck_state_open_db(hw->db_path, &db);
    if (err == 0)
        err = ck_hooks_deliver_round(hw->hooks, db, deadline, &hw->wh_abort, &again);
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
    struct ck_hook_worker *hw = arg;
    atomic_store(&hw->wh_abort, true);
}

/* A delivery was stored in the outbox. */
static void wake_webhooks(void *arg)
{
    struct ck_hook_worker *hw = arg;
    ck_sender_kick(hw->wh);
}

int ck_hook_worker_start(struct ck_hook_worker **out, struct ck_hooks *h, struct ck_loop *loop,
                         struct ck_state *st)
{
    static const struct ck_loop_poller poller = {hooks_fds, hooks_deadline, hooks_step};
    int err;
    *out = NULL;
    if (!h)
        return 0;
    struct ck_hook_worker *hw = calloc(1, sizeof *hw);
    if (!hw) {
        ck_hooks_free(h);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    hw->hooks = h;
    hw->loop = loop;
    *out = hw;
    if ((err = ck_state_db_path(st, hw->db_path, sizeof hw->db_path)) < 0)
        return err;
    if (ck_hooks_webhook_count(h) > 0) {
        struct ck_sender_spec spec = {"webhook", webhook_round, webhook_stop, NULL, hw};
        if ((err = ck_sender_new(loop, &spec, st, &hw->wh)) < 0)
            return err;
        ck_hooks_set_waker(h, wake_webhooks, hw);
        ck_sender_kick(hw->wh); /* what a previous run left in the outbox */
    }
    return ck_loop_add_poller(loop, &poller, h, &hw->poller);
}

struct ck_hooks *ck_hook_worker_hooks(const struct ck_hook_worker *hw)
{
    return hw ? hw->hooks : NULL;
}

void ck_hook_worker_pump(struct ck_hook_worker *hw, int timeout_ms)
{
    if (hw && hw->wh)
        ck_sender_pump(hw->wh, timeout_ms);
}

void ck_hook_worker_stop(struct ck_hook_worker *hw, double drain)
{
    if (!hw)
        return;
    if (hw->poller)
        ck_loop_remove(hw->loop, hw->poller);
    if (hw->wh) {
        /* a helper started from now on ends its attempts by then */
        hw->wh_drain_until = ck_mono_ms() + (int64_t)(drain * 1000);
        while (drain > 0 && ck_sender_busy(hw->wh) && ck_mono_ms() < hw->wh_drain_until)
            ck_sender_pump(hw->wh, 100);
        ck_sender_stop(hw->wh, drain > 0 ? 0.5 : 1.0);
        ck_sender_free(hw->wh);
    }
    ck_hooks_wait_exec(hw->hooks);
    ck_hooks_free(hw->hooks);
    free(hw);
}
