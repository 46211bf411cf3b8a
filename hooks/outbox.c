#include "hooks/outbox.h"
#include "common/error.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS hook_events (id TEXT PRIMARY KEY, type TEXT NOT NULL,"
    "  created_ms INTEGER NOT NULL, payload TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS hook_deliveries ("
    "  event_id TEXT NOT NULL REFERENCES hook_events(id) ON DELETE CASCADE,"
    "  hook TEXT NOT NULL, body TEXT,"
    "  state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'dead')),"
    "  attempts INTEGER NOT NULL DEFAULT 0, next_ms INTEGER NOT NULL,"
    "  last_status INTEGER, last_error TEXT, delivered_ms INTEGER,"
    "  PRIMARY KEY (event_id, hook));"
    "CREATE INDEX IF NOT EXISTS hook_deliveries_due ON hook_deliveries (state, next_ms);"
    "CREATE TABLE IF NOT EXISTS hook_receivers (hook TEXT PRIMARY KEY,"
    "  consecutive_failures INTEGER NOT NULL DEFAULT 0, failing INTEGER NOT NULL DEFAULT 0,"
    "  last_error TEXT, last_attempt_ms INTEGER, last_success_ms INTEGER);"
    /* exec hooks: a row from the event's transaction until the command ended */
    "CREATE TABLE IF NOT EXISTS exec_runs (event_id TEXT NOT NULL, hook TEXT NOT NULL,"
    "  type TEXT NOT NULL, payload TEXT NOT NULL, env TEXT NOT NULL,"
    "  created_ms INTEGER NOT NULL, PRIMARY KEY (event_id, hook));";

static int db_fail(sqlite3 *db, const char *what)
{
    return ck_error(CK_EIO, "webhook outbox: %s: %s", what, sqlite3_errmsg(db));
}

static int exec(sqlite3 *db, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        int err = ck_error(CK_EIO, "webhook outbox: %s", msg ? msg : sqlite3_errmsg(db));
        sqlite3_free(msg);
        return err;
    }
    return 0;
}

int ck_outbox_init(sqlite3 *db)
{
    return exec(db, schema);
}

/* Prepares sql and binds the arguments described by types: 't' text (NULL
 * binds null), 'i' int64. */
static int vprepare(sqlite3 *db, sqlite3_stmt **st, const char *sql, const char *types, va_list ap)
{
    if (sqlite3_prepare_v2(db, sql, -1, st, NULL) != SQLITE_OK)
        return db_fail(db, "prepare");
    for (int i = 0; types[i]; i++) {
        int rc;
        if (types[i] == 't') {
            const char *s = va_arg(ap, const char *);
            rc = s ? sqlite3_bind_text(*st, i + 1, s, -1, SQLITE_TRANSIENT)
                   : sqlite3_bind_null(*st, i + 1);
        } else {
            rc = sqlite3_bind_int64(*st, i + 1, va_arg(ap, int64_t));
        }
        if (rc != SQLITE_OK) {
            sqlite3_finalize(*st);
            *st = NULL;
            return db_fail(db, "bind");
        }
    }
    return 0;
}

static int prepare(sqlite3 *db, sqlite3_stmt **st, const char *sql, const char *types, ...)
{
    va_list ap;
    va_start(ap, types);
    int err = vprepare(db, st, sql, types, ap);
    va_end(ap);
    return err;
}

/* Runs a statement that returns no rows; a constraint violation is CK_EEXIST. */
static int run(sqlite3 *db, const char *sql, const char *types, ...)
{
    sqlite3_stmt *st;
    va_list ap;
    va_start(ap, types);
    int err = vprepare(db, &st, sql, types, ap);
    va_end(ap);
    if (err < 0)
        return err;
    int rc = sqlite3_step(st);
    /* only a key that exists is "already there"; a trigger or a CHECK that
     * refuses the row is a failure to store, with SQLite's reason */
    int ext = sqlite3_extended_errcode(db);
    sqlite3_finalize(st);
    if (rc == SQLITE_CONSTRAINT &&
        (ext == SQLITE_CONSTRAINT_PRIMARYKEY || ext == SQLITE_CONSTRAINT_UNIQUE))
        return CK_EEXIST;
    return rc == SQLITE_DONE ? 0 : db_fail(db, "write");
}

/* Inside a caller's transaction a savepoint nests. Alone, a savepoint would
 * open a deferred transaction: its first statement takes a read snapshot, and
 * when another connection (the delivery helper, a scan) commits before the
 * insert, upgrading that snapshot to a write fails at once with "database is
 * locked", without the busy handler. BEGIN IMMEDIATE takes the write lock
 * first, waiting up to the busy timeout, so an event is never lost to that. */
int ck_outbox_begin(sqlite3 *db, bool *own)
{
    *own = sqlite3_get_autocommit(db) != 0;
    return exec(db, *own ? "BEGIN IMMEDIATE" : "SAVEPOINT outbox_add");
}

int ck_outbox_end(sqlite3 *db, bool own, int err)
{
    if (err < 0) {
        exec(db, own ? "ROLLBACK" : "ROLLBACK TO outbox_add");
        if (!own)
            exec(db, "RELEASE outbox_add");
        return err;
    }
    return exec(db, own ? "COMMIT" : "RELEASE outbox_add");
}

int ck_outbox_add(sqlite3 *db, const char *event_id, const char *type, int64_t created_ms,
                  const char *payload, const char *const *hooks, const char *const *bodies,
                  size_t nhooks, int64_t now_ms)
{
    bool own;
    int err;
    if ((err = ck_outbox_begin(db, &own)) < 0)
        return err;
    err = run(db, "INSERT INTO hook_events (id, type, created_ms, payload) VALUES (?, ?, ?, ?)",
              "ttit", event_id, type, created_ms, payload);
    if (err == CK_EEXIST)
        err = ck_error(CK_EEXIST, "webhook outbox: event '%s' is already stored", event_id);
    for (size_t i = 0; err == 0 && i < nhooks; i++)
        err = run(db,
                  "INSERT INTO hook_deliveries (event_id, hook, body, state, next_ms)"
                  " VALUES (?, ?, ?, 'pending', ?)",
                  "ttti", event_id, hooks[i], bodies ? bodies[i] : NULL, now_ms);
    return ck_outbox_end(db, own, err);
}

void ck_outbox_items_free(struct ck_outbox_item *items, size_t n)
{
    for (size_t i = 0; items && i < n; i++)
        free(items[i].body);
    free(items);
}

static void copy_col(char *out, size_t outsz, sqlite3_stmt *st, int col)
{
    const unsigned char *s = sqlite3_column_text(st, col);
    snprintf(out, outsz, "%s", s ? (const char *)s : "");
}

int ck_outbox_due(sqlite3 *db, int64_t now_ms, size_t max, struct ck_outbox_item **out, size_t *n)
{
    sqlite3_stmt *st;
    int err, rc;
    *out = NULL;
    *n = 0;
    if (max == 0)
        return 0;
    if ((err = prepare(db, &st,
                       "SELECT d.event_id, d.hook, e.type, coalesce(d.body, e.payload), d.attempts"
                       " FROM hook_deliveries d JOIN hook_events e ON e.id = d.event_id"
                       " WHERE d.state = 'pending' AND d.next_ms <= ?"
                       " ORDER BY d.next_ms, e.created_ms LIMIT ?",
                       "ii", now_ms, (int64_t)max)) < 0)
        return err;
    struct ck_outbox_item *items = calloc(max, sizeof *items);
    if (!items) {
        sqlite3_finalize(st);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && *n < max) {
        struct ck_outbox_item *it = &items[*n];
        copy_col(it->event_id, sizeof it->event_id, st, 0);
        copy_col(it->hook, sizeof it->hook, st, 1);
        copy_col(it->type, sizeof it->type, st, 2);
        const unsigned char *body = sqlite3_column_text(st, 3);
        it->body = strdup(body ? (const char *)body : "");
        it->attempts = sqlite3_column_int(st, 4);
        ++*n;
        if (!it->body) {
            rc = SQLITE_NOMEM;
            break;
        }
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        ck_outbox_items_free(items, *n);
        *n = 0;
        return rc == SQLITE_NOMEM ? ck_error(CK_ENOMEM, "out of memory")
                                  : db_fail(db, "reading due deliveries");
    }
    *out = items;
    return 0;
}

int ck_outbox_claim(sqlite3 *db, const char *event_id, const char *hook, int64_t now_ms,
                    int64_t lease_until_ms, bool *claimed)
{
    int err = run(db,
                  "UPDATE hook_deliveries SET next_ms = ? WHERE event_id = ? AND hook = ?"
                  " AND state = 'pending' AND next_ms <= ?",
                  "itti", lease_until_ms, event_id, hook, now_ms);
    *claimed = err == 0 && sqlite3_changes(db) == 1;
    return err;
}

static int single_int(sqlite3 *db, const char *sql, int64_t *out, int64_t if_null)
{
    sqlite3_stmt *st;
    int err;
    if ((err = prepare(db, &st, sql, "")) < 0)
        return err;
    int rc = sqlite3_step(st);
    *out = rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL
               ? sqlite3_column_int64(st, 0)
               : if_null;
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_fail(db, "read");
}

int ck_outbox_next_due(sqlite3 *db, int64_t *out_ms)
{
    return single_int(db, "SELECT min(next_ms) FROM hook_deliveries WHERE state = 'pending'",
                      out_ms, -1);
}

int ck_outbox_pending(sqlite3 *db, int64_t *out)
{
    return single_int(db, "SELECT count(*) FROM hook_deliveries WHERE state = 'pending'", out, 0);
}

int ck_outbox_failing_count(sqlite3 *db, int64_t *out)
{
    return single_int(db, "SELECT count(*) FROM hook_receivers WHERE failing", out, 0);
}

static const double default_delays[] = {5, 30, 120, 600, 1800, 3600, 7200, 14400, 21600, 28800};
const struct ck_backoff ck_backoff_default = {default_delays,
                                              sizeof default_delays / sizeof *default_delays};

int64_t ck_backoff_delay_ms(const struct ck_backoff *b, int attempts, double u)
{
    if (attempts < 1 || (size_t)attempts > b->n)
        return -1;
    double ms = b->delays[attempts - 1] * 1000.0 * (0.8 + 0.4 * u);
    return (int64_t)ms;
}

int ck_outbox_mark_delivered(sqlite3 *db, const char *event_id, const char *hook, long status,
                             int64_t now_ms)
{
    return run(db,
               "UPDATE hook_deliveries SET state = 'delivered', attempts = attempts + 1,"
               " last_status = ?, last_error = NULL, delivered_ms = ?"
               " WHERE event_id = ? AND hook = ?",
               "iitt", (int64_t)status, now_ms, event_id, hook);
}

int ck_outbox_mark_failed(sqlite3 *db, const char *event_id, const char *hook, long status,
                          const char *error, const struct ck_backoff *b, double u, int64_t now_ms,
                          bool *gave_up)
{
    sqlite3_stmt *st;
    int err;
    *gave_up = false;
    if ((err = prepare(db, &st,
                       "SELECT attempts FROM hook_deliveries WHERE event_id = ? AND hook = ?", "tt",
                       event_id, hook)) < 0)
        return err;
    int rc = sqlite3_step(st);
    int attempts = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) + 1 : -1;
    sqlite3_finalize(st);
    if (attempts < 0)
        return ck_error(CK_ENOENT, "webhook outbox: no delivery of '%s' to hook '%s'", event_id,
                        hook);
    int64_t delay = ck_backoff_delay_ms(b, attempts, u);
    *gave_up = delay < 0;
    return run(db,
               "UPDATE hook_deliveries SET state = ?, attempts = ?, next_ms = ?,"
               " last_status = ?, last_error = ? WHERE event_id = ? AND hook = ?",
               "tiiittt", *gave_up ? "dead" : "pending", (int64_t)attempts,
               *gave_up ? now_ms : now_ms + delay, (int64_t)status, error, event_id, hook);
}

int ck_outbox_receiver_update(sqlite3 *db, const char *hook, bool ok, const char *error,
                              int failing_after, int64_t now_ms, int *transition)
{
    sqlite3_stmt *st;
    int err;
    bool was_failing = false;
    int64_t failures = 0;
    *transition = 0;
    if ((err = prepare(db, &st,
                       "SELECT consecutive_failures, failing FROM hook_receivers WHERE hook = ?",
                       "t", hook)) < 0)
        return err;
    if (sqlite3_step(st) == SQLITE_ROW) {
        failures = sqlite3_column_int64(st, 0);
        was_failing = sqlite3_column_int(st, 1) != 0;
    }
    sqlite3_finalize(st);
    failures = ok ? 0 : failures + 1;
    bool failing = ok ? false : was_failing || failures >= failing_after;
    if (failing && !was_failing)
        *transition = 1;
    else if (!failing && was_failing)
        *transition = -1;
    return run(db,
               "INSERT INTO hook_receivers (hook, consecutive_failures, failing, last_error,"
               "  last_attempt_ms, last_success_ms) VALUES (?1, ?2, ?3, ?4, ?5, nullif(?6, -1))"
               " ON CONFLICT (hook) DO UPDATE SET consecutive_failures = ?2, failing = ?3,"
               "  last_error = coalesce(?4, last_error), last_attempt_ms = ?5,"
               "  last_success_ms = coalesce(nullif(?6, -1), last_success_ms)",
               "tiitii", hook, failures, (int64_t)failing, ok ? NULL : error, now_ms,
               ok ? now_ms : (int64_t)-1);
}

int ck_outbox_receiver_failing(sqlite3 *db, const char *hook, bool *failing)
{
    sqlite3_stmt *st;
    int err;
    *failing = false;
    if ((err = prepare(db, &st, "SELECT failing FROM hook_receivers WHERE hook = ?", "t", hook)) <
        0)
        return err;
    if (sqlite3_step(st) == SQLITE_ROW)
        *failing = sqlite3_column_int(st, 0) != 0;
    sqlite3_finalize(st);
    return 0;
}

int ck_outbox_replay(sqlite3 *db, const char *event_id, int64_t now_ms, size_t *n)
{
    int err;
    char *type = NULL, *payload = NULL;
    *n = 0;
    if ((err = ck_outbox_event(db, event_id, &type, &payload)) < 0)
        return err;
    free(type);
    free(payload);
    if ((err = run(db,
                   "UPDATE hook_deliveries SET state = 'pending', attempts = 0, next_ms = ?,"
                   " delivered_ms = NULL WHERE event_id = ?",
                   "it", now_ms, event_id)) < 0)
        return err;
    *n = (size_t)sqlite3_changes(db);
    return 0;
}

int ck_outbox_event(sqlite3 *db, const char *event_id, char **type, char **payload)
{
    sqlite3_stmt *st;
    int err;
    *type = *payload = NULL;
    if ((err = prepare(db, &st, "SELECT type, payload FROM hook_events WHERE id = ?", "t",
                       event_id)) < 0)
        return err;
    if (sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return ck_error(CK_ENOENT, "no event '%s' in the webhook outbox", event_id);
    }
    *type = strdup((const char *)sqlite3_column_text(st, 0));
    *payload = strdup((const char *)sqlite3_column_text(st, 1));
    sqlite3_finalize(st);
    if (!*type || !*payload) {
        free(*type);
        free(*payload);
        *type = *payload = NULL;
        return ck_error(CK_ENOMEM, "out of memory");
    }
    return 0;
}

int ck_outbox_prune(sqlite3 *db, int64_t before_ms)
{
    int err;
    if ((err = run(db,
                   "DELETE FROM hook_deliveries WHERE event_id IN (SELECT id FROM hook_events"
                   " WHERE created_ms < ?1 AND NOT EXISTS (SELECT 1 FROM hook_deliveries d"
                   " WHERE d.event_id = hook_events.id AND d.state = 'pending'))",
                   "i", before_ms)) < 0)
        return err;
    return run(db,
               "DELETE FROM hook_events WHERE created_ms < ? AND NOT EXISTS"
               " (SELECT 1 FROM hook_deliveries d WHERE d.event_id = hook_events.id)",
               "i", before_ms);
}

int ck_outbox_exec_add(sqlite3 *db, const char *event_id, const char *hook, const char *type,
                       const char *payload, const char *env, int64_t created_ms)
{
    return run(db,
               "INSERT OR REPLACE INTO exec_runs (event_id, hook, type, payload, env, created_ms)"
               " VALUES (?, ?, ?, ?, ?, ?)",
               "ttttti", event_id, hook, type, payload, env, created_ms);
}

int ck_outbox_exec_done(sqlite3 *db, const char *event_id, const char *hook)
{
    return run(db, "DELETE FROM exec_runs WHERE event_id = ? AND hook = ?", "tt", event_id, hook);
}

int ck_outbox_exec_each(sqlite3 *db, int (*fn)(const struct ck_outbox_exec *r, void *ctx),
                        void *ctx)
{
    sqlite3_stmt *st;
    int err = prepare(db, &st,
                      "SELECT event_id, hook, type, payload, env FROM exec_runs"
                      " ORDER BY created_ms, event_id",
                      "");
    if (err < 0)
        return err;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct ck_outbox_exec r = {
            (const char *)sqlite3_column_text(st, 0), (const char *)sqlite3_column_text(st, 1),
            (const char *)sqlite3_column_text(st, 2), (const char *)sqlite3_column_text(st, 3),
            (const char *)sqlite3_column_text(st, 4)};
        if ((err = fn(&r, ctx)) != 0)
            break;
    }
    sqlite3_finalize(st);
    if (err < 0)
        return err;
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_fail(db, "read");
}
