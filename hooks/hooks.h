/* Hooks: the agent's notifications. One object built from the config holds
 * the webhooks (resolved secrets, templates) and the exec hooks; the agent
 * hands it events and drives it:
 *
 *   ck_hooks_emit(h, db, &ev)         store for every matching webhook (outbox,
 *                                     durable), start the matching exec hooks
 *   ck_hooks_run_due(h, db, deadline) deliver the webhooks that are due
 *   ck_hooks_poll_fds / _deadline_ms / _step    drive exec hooks from an event loop
 *   ck_hooks_wait_exec(h)             or wait for them (scan mode)
 *
 * A webhook receiver or a hook command that fails or hangs costs at most its
 * timeout: the agent goes on. */
#ifndef CK_HOOKS_H
#define CK_HOOKS_H

#include "common/json.h"
#include "hooks/event.h"

#include <poll.h>
#include <stdatomic.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The config (agent/config.c fills it; every pointer owned). */
struct ck_webhook_conf {
    char *url;      /* an http(s) URL, or a secret reference (env:NAME, file:/path)
                     * holding it, for receivers whose URL is itself the secret */
    char **secrets; /* secret references of whsec_ keys; several during a rotation */
    size_t nsecrets;
    char **events; /* type filters (globs: "upload.*"); none means every event */
    size_t nevents;
    char *template_path; /* a payload template (chat webhooks); NULL: the event JSON */
    double timeout;      /* seconds per attempt; 0: the default (10 s) */
    int line;            /* where it is in the config, for messages */
};

struct ck_exec_conf {
    char *event; /* a type filter (glob) */
    char **argv; /* the command; argv[0] searched on PATH */
    size_t argc;
    bool shell;     /* the command was one string: run as /bin/sh -c STRING */
    double timeout; /* seconds; 0: the default (30 s) */
    char **env;     /* env: the variable names passed from the agent's environment (an
                     * allow-list); NULL: the whole environment but the config's secrets */
    size_t nenv;
    int line;
};

struct ck_hooks_conf {
    struct ck_webhook_conf *webhooks;
    size_t nwebhooks;
    struct ck_exec_conf *execs;
    size_t nexecs;
    double *retry_schedule; /* seconds before each retry; NULL: ck_backoff_default */
    size_t nretry;
    int64_t failing_after; /* consecutive failures that mark a receiver failing; 0: 5 */
    char **secret_env; /* variables any part of the config reads a secret from (its
                        * env:NAME references: store credentials, webhook keys...):
                        * never passed to an exec hook, whatever its env: says */
    size_t nsecret_env;
};

#define CK_HOOKS_WEBHOOK_TIMEOUT_S 10.0
#define CK_HOOKS_EXEC_TIMEOUT_S 30.0
#define CK_HOOKS_FAILING_AFTER 5
#define CK_HOOKS_MAX_RUNNING 4  /* exec hooks at once; more wait their turn */
#define CK_HOOKS_MAX_QUEUED 256 /* exec hooks waiting; past it new ones are dropped (logged) */

void ck_hooks_conf_release(struct ck_hooks_conf *c);
/* Checks what can be checked without reading secrets: URLs, secret
 * references, filters, timeouts. Messages name config_name, the line and
 * the key (hooks.webhooks[1].url). */
int ck_hooks_conf_check(const struct ck_hooks_conf *c, const char *config_name);

struct ck_hooks;

/* Builds the hooks: resolves the URL and secret references (a secret that is
 * not "whsec_" + base64 is CK_ECONFIG naming the key, never the value),
 * reads and checks templates. conf is borrowed for the life of the hooks
 * object; config_name is for messages. An empty conf gives a working object
 * that does nothing. */
int ck_hooks_new(const struct ck_hooks_conf *conf, const char *config_name, struct ck_hooks **out);
/* Frees; exec hooks still running are killed (wait for them first). */
void ck_hooks_free(struct ck_hooks *h);
size_t ck_hooks_webhook_count(const struct ck_hooks *h);

/* Stores ev in the outbox of db for every webhook whose filters match
 * (in one transaction, before any attempt) and starts (or queues) every
 * matching exec hook. db may be NULL only when no webhook is configured. */
int ck_hooks_emit(struct ck_hooks *h, sqlite3 *db, const struct ck_event *ev);

/* Delivers due webhook deliveries until none is due or deadline_ms
 * (ck_mono_ms clock) passes; an attempt's timeout is cut to the time
 * left. A receiver that fails once is not tried again in the same call.
 * *delivered (may be NULL) receives how many were accepted. */
int ck_hooks_run_due(struct ck_hooks *h, sqlite3 *db, int64_t deadline_ms, size_t *delivered);
/* Deliveries this h gave up: webhooks past their retry schedule, exec hooks
 * that failed, timed out or were dropped (what a one-shot command's exit
 * code reports). 0 for NULL. */
size_t ck_hooks_failures(const struct ck_hooks *h);
/* Delivery away from the caller's event loop (the watcher runs it in a
 * helper process, agent/sender.h, so that a receiver that answers slowly or
 * not at all never stalls it, and libcurl never stays in its memory).
 * ck_hooks_set_waker: fn is called whenever ck_hooks_emit stored a delivery.
 * ck_hooks_deliver_round, on the helper's own connection to the database
 * ck_hooks_emit writes, delivers what is due like ck_hooks_run_due, stopping
 * early when *abort is set, and sets *again_s to the seconds until the next
 * delivery is due (-1: none pending; at least a second after a round with a
 * failure). */
void ck_hooks_set_waker(struct ck_hooks *h, void (*fn)(void *arg), void *arg);
int ck_hooks_deliver_round(struct ck_hooks *h, sqlite3 *db, int64_t deadline_ms, atomic_bool *abort,
                           double *again_s);

/* Unix ms of the next delivery due (-1: none pending), for the daemon's timer. */
int ck_hooks_next_due(struct ck_hooks *h, sqlite3 *db, int64_t *unix_ms);

/* Exec hooks from an event loop: poll these fds (up to max), wake up by
 * the deadline (ck_mono_ms clock; -1: no exec hook running), then step. */
int ck_hooks_poll_fds(const struct ck_hooks *h, struct pollfd *fds, int max);
int64_t ck_hooks_deadline_ms(const struct ck_hooks *h);
void ck_hooks_step(struct ck_hooks *h);
size_t ck_hooks_exec_running(const struct ck_hooks *h);
/* Blocks until every started or queued exec hook has finished. */
void ck_hooks_wait_exec(struct ck_hooks *h);
/* Exec hooks are durable: each run is stored with its event (ck_hooks_emit)
 * and its row removed once the command ended. flush removes the rows of the
 * runs that ended since the last flush (call it after ck_hooks_wait_exec, and
 * it runs at every emit); recover, once per hooks object, runs again what an
 * earlier process stored and never finished (a crash, kill -9): at least
 * once, like webhooks. A run whose hook left the config is logged and dropped. */
int ck_hooks_exec_flush(struct ck_hooks *h, sqlite3 *db);
int ck_hooks_exec_recover(struct ck_hooks *h, sqlite3 *db);

/* The "hooks" part of /status: an array with, per webhook, its key, its
 * redacted URL, its filters, whether it is failing, its last error and its
 * pending deliveries; then the exec hooks running. */
int ck_hooks_status_json(struct ck_hooks *h, sqlite3 *db, struct ck_json *j);

/* The key a webhook is stored under in the outbox: "wh_" + 16 hex digits of
 * the SHA-256 of its URL (the URL itself may be a secret). out: >= 20 bytes. */
void ck_hooks_key(const char *url, char *out, size_t outsz);

/* For `ckptd hooks test`: one signed attempt of ev to url with the given
 * secret references, outside the outbox. */
struct ck_webhook_result;
int ck_hooks_send_once(const char *url_or_ref, char *const *secret_refs, size_t nsecrets,
                       const struct ck_event *ev, double timeout, struct ck_webhook_result *r);

#endif
