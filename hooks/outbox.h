/* The durable webhook outbox, in the agent's SQLite database (the caller
 * owns the sqlite3 handle; this module creates its tables).
 *
 * An event is stored, with one delivery row per webhook it goes to, in one
 * transaction before any delivery is tried, so a crash or a restart loses
 * nothing: whatever is still pending is delivered by the next run.
 *
 *   hook_events(id, type, created_ms, payload)
 *   hook_deliveries(event_id, hook, body, state, attempts, next_ms, last_status,
 *                   last_error, delivered_ms)      state: pending | delivered | dead
 *   hook_receivers(hook, consecutive_failures, failing, last_error, last_attempt_ms,
 *                  last_success_ms)
 *
 * A hook is named by a key derived from its URL (never the URL itself: a
 * chat webhook's URL is a secret). A failed attempt schedules the next one
 * after the retry schedule's delay for that attempt, with +-20% jitter;
 * past the schedule's end the delivery is "dead" (given up, replayable). A
 * receiver with failing_after consecutive failures is marked failing until
 * one attempt succeeds. */
#ifndef CK_OUTBOX_H
#define CK_OUTBOX_H

#include <sqlite3.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

int ck_outbox_init(sqlite3 *db);
/* A transaction of its own when none is open (BEGIN IMMEDIATE: the write
 * lock first, so a busy database waits instead of failing), else a
 * savepoint in the caller's; end commits (or rolls back when err < 0) and
 * returns err or the commit's error. */
int ck_outbox_begin(sqlite3 *db, bool *own);
int ck_outbox_end(sqlite3 *db, bool own, int err);

/* Exec hooks are durable too: a run is stored with its event (payload: the
 * command's stdin; env: its CKPTD_* variables, one NAME=value a line) and
 * removed once the command ended; what a crash left is run again. */
struct ck_outbox_exec {
    const char *event_id, *hook, *type, *payload, *env; /* valid during the callback */
};
int ck_outbox_exec_add(sqlite3 *db, const char *event_id, const char *hook, const char *type,
                       const char *payload, const char *env, int64_t created_ms);
int ck_outbox_exec_done(sqlite3 *db, const char *event_id, const char *hook);
/* Calls fn for every stored run, oldest first; fn returning non-zero stops
 * (a negative value is returned). */
int ck_outbox_exec_each(sqlite3 *db, int (*fn)(const struct ck_outbox_exec *r, void *ctx),
                        void *ctx);

/* Stores an event and one pending delivery per hook, due at now_ms.
 * bodies[i] is what to send to hooks[i] (a rendered template), or NULL for
 * the payload itself. An event id already stored is CK_EEXIST. */
int ck_outbox_add(sqlite3 *db, const char *event_id, const char *type, int64_t created_ms,
                  const char *payload, const char *const *hooks, const char *const *bodies,
                  size_t nhooks, int64_t now_ms);

struct ck_outbox_item {
    char event_id[64];
    char hook[64];
    char type[64];
    char *body;   /* owned: what to send */
    int attempts; /* attempts already made */
};
void ck_outbox_items_free(struct ck_outbox_item *items, size_t n);

/* Up to max pending deliveries due at now_ms, oldest first. */
int ck_outbox_due(sqlite3 *db, int64_t now_ms, size_t max, struct ck_outbox_item **out, size_t *n);
/* Claims a due delivery for one attempt: pushes its next attempt to
 * lease_until_ms so that another process delivering from the same outbox
 * skips it (and a crash mid-attempt retries it after the lease). *claimed is
 * false when someone else took it first or it is no longer due. */
int ck_outbox_claim(sqlite3 *db, const char *event_id, const char *hook, int64_t now_ms,
                    int64_t lease_until_ms, bool *claimed);
/* The earliest next attempt among pending deliveries (unix ms), or -1 when none. */
int ck_outbox_next_due(sqlite3 *db, int64_t *out_ms);
/* Pending deliveries (the outbox depth). */
int ck_outbox_pending(sqlite3 *db, int64_t *out);

/* The retry schedule: delay (seconds) before retry k (k = 0 after the first
 * failed attempt); n entries, so 1 + n attempts in all. */
struct ck_backoff {
    const double *delays;
    size_t n;
};
/* The default: 5s 30s 2m 10m 30m 1h 2h 4h 6h 8h (about 22 h in all). */
extern const struct ck_backoff ck_backoff_default;
/* The delay in ms before the next attempt after `attempts` failed attempts,
 * jittered by +-20% with u in [0,1); -1 when the schedule is exhausted. */
int64_t ck_backoff_delay_ms(const struct ck_backoff *b, int attempts, double u);

int ck_outbox_mark_delivered(sqlite3 *db, const char *event_id, const char *hook, long status,
                             int64_t now_ms);
/* Records a failed attempt: reschedules, or gives up (*gave_up = true). */
int ck_outbox_mark_failed(sqlite3 *db, const char *event_id, const char *hook, long status,
                          const char *error, const struct ck_backoff *b, double u, int64_t now_ms,
                          bool *gave_up);

/* A receiver's health after an attempt. *transition: 1 it just became
 * failing (after failing_after consecutive failures), -1 it just recovered,
 * 0 no change. */
int ck_outbox_receiver_update(sqlite3 *db, const char *hook, bool ok, const char *error,
                              int failing_after, int64_t now_ms, int *transition);
/* Whether a receiver is marked failing, and how many are. */
int ck_outbox_receiver_failing(sqlite3 *db, const char *hook, bool *failing);
int ck_outbox_failing_count(sqlite3 *db, int64_t *out);

/* Makes every delivery of event_id pending again, due now, attempts reset;
 * *n receives how many. CK_ENOENT when the event is unknown. */
int ck_outbox_replay(sqlite3 *db, const char *event_id, int64_t now_ms, size_t *n);
/* An event's type and payload (owned by the caller). */
int ck_outbox_event(sqlite3 *db, const char *event_id, char **type, char **payload);

/* Deletes events older than before_ms whose deliveries are all delivered or dead. */
int ck_outbox_prune(sqlite3 *db, int64_t before_ms);

#endif
