#include "agent/state.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/metrics.h"
#include "stores/uploader.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* How long a command waits for another process's transaction. */
#define BUSY_TIMEOUT_MS 10000

/* Schema changes append a step; user_version records how many ran. */
static const char *const migrations[] = {
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE hash_cache (dev INTEGER NOT NULL, ino INTEGER NOT NULL,"
    "  size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, md5 TEXT NOT NULL,"
    "  sha256 TEXT NOT NULL DEFAULT '', PRIMARY KEY (dev, ino));"
    "CREATE TABLE checkpoints (ref TEXT PRIMARY KEY, source TEXT NOT NULL,"
    "  tree_path TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL,"
    "  nfiles INTEGER NOT NULL, registered_at REAL NOT NULL DEFAULT ((julianday('now') - "
    "2440587.5) * 86400.0));",
    /* retention (agent/retention.h): a checkpoint whose local bytes are being
     * or were deleted, what metadata.yaml said of it, and where its copies are */
    "CREATE TABLE retention (ref TEXT PRIMARY KEY, ref_is_int INTEGER NOT NULL, state TEXT NOT "
    "NULL, epoch INTEGER NOT NULL, path TEXT NOT NULL, md5 TEXT NOT NULL, source TEXT NOT NULL,"
    "  kind INTEGER NOT NULL, files TEXT NOT NULL, stores TEXT NOT NULL, seq INTEGER NOT NULL,"
    "  updated REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0));",
    /* what a full pass saw of a registered checkpoint's files (agent/discover.h):
     * 0 for rows of older versions, whose files are looked at once more */
    "ALTER TABLE checkpoints ADD COLUMN fingerprint INTEGER NOT NULL DEFAULT 0;",
};

/* SQLite's message, with the OS error behind it when there is one
 * ("disk I/O error" alone does not tell a full disk from a bad one). */
static const char *db_msg(sqlite3 *db, char *out, size_t outsz)
{
    int sys = db ? sqlite3_system_errno(db) : 0;
    if (sys)
        snprintf(out, outsz, "%s (%s)", sqlite3_errmsg(db), strerror(sys));
    else
        snprintf(out, outsz, "%s", db ? sqlite3_errmsg(db) : "no database");
    return out;
}

static int db_fail(sqlite3 *db, const char *what)
{
    char msg[512];
    return ck_error(CK_EIO, "state database: %s: %s", what, db_msg(db, msg, sizeof msg));
}

static int exec(sqlite3 *db, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        char full[512];
        int err = ck_error(CK_EIO, "state database: %s", db_msg(db, full, sizeof full));
        sqlite3_free(msg);
        return err;
    }
    return 0;
}

static int migrate(sqlite3 *db)
{
    sqlite3_stmt *st;
    int version = 0, err;
    if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK)
        return db_fail(db, "reading the schema version");
    if (sqlite3_step(st) == SQLITE_ROW)
        version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    int n = (int)(sizeof migrations / sizeof *migrations);
    if (version > n)
        return ck_error(CK_ESTATE, "state database was written by a newer ckptd (schema %d > %d)",
                        version, n);
    for (int i = version; i < n; i++) {
        char sql[64];
        if ((err = exec(db, "BEGIN IMMEDIATE")) < 0)
            return err;
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d", i + 1);
        if ((err = exec(db, migrations[i])) < 0 || (err = exec(db, sql)) < 0) {
            exec(db, "ROLLBACK");
            return err;
        }
        if ((err = exec(db, "COMMIT")) < 0)
            return err;
    }
    return 0;
}

/* WAL + synchronous=FULL: a committed transaction survives a power cut.
 * Switching a new database to WAL takes an exclusive lock, and SQLite answers
 * SQLITE_BUSY at once, without the busy handler, when another process is doing
 * the same (two ckptd commands started together on a fresh state folder): so
 * that is retried for as long as the busy timeout. */
static int set_wal(sqlite3 *db)
{
    for (int waited_ms = 0;; waited_ms += 5) {
        char *msg = NULL;
        int rc = sqlite3_exec(db, "PRAGMA journal_mode=WAL", NULL, NULL, &msg);
        sqlite3_free(msg);
        if (rc == SQLITE_OK)
            return exec(db, "PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON");
        bool busy = (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED;
        if (!busy || waited_ms >= BUSY_TIMEOUT_MS)
            return db_fail(db, "switching to WAL mode");
        usleep(5000);
    }
}

int ck_state_open_db(const char *path, sqlite3 **out)
{
    sqlite3 *db = NULL;
    int err;
    *out = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        err = ck_error(CK_EIO, "cannot open state database '%s': %s", path,
                       db ? sqlite3_errmsg(db) : "out of memory");
        sqlite3_close(db);
        return err;
    }
    sqlite3_busy_timeout(db, BUSY_TIMEOUT_MS);
    if ((err = set_wal(db)) < 0) {
        sqlite3_close(db);
        return ck_error_wrap(err, "'%s'", path);
    }
    *out = db;
    return 0;
}

int ck_state_open(struct ck_state *s, const char *model_dir)
{
    char path[4096];
    int err;
    memset(s, 0, sizeof *s);
    if ((err = ck_path_join(path, sizeof path, model_dir, ".ckptd")) < 0)
        return err;
    if ((err = ck_mkdirs(path, 0700)) < 0)
        return err;
    if (!(s->dir = strdup(path)))
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = ck_state_db_path(s, path, sizeof path)) < 0 ||
        (err = ck_state_open_db(path, &s->db)) < 0 || (err = migrate(s->db)) < 0) {
        ck_state_close(s);
        return err;
    }
    return 0;
}

void ck_state_close(struct ck_state *s)
{
    for (int i = 0; i < CK_STATE_NSTMT; i++)
        sqlite3_finalize(s->stmt[i]);
    if (s->db)
        sqlite3_close(s->db);
    free(s->dir);
    memset(s, 0, sizeof *s);
}

int ck_state_db_path(const struct ck_state *s, char *out, size_t outsz)
{
    return ck_path_join(out, outsz, s->dir, "state.db");
}

int ck_state_close_db(struct ck_state *s)
{
    for (int i = 0; i < CK_STATE_NSTMT; i++) {
        sqlite3_finalize(s->stmt[i]);
        s->stmt[i] = NULL;
    }
    if (s->db && sqlite3_close(s->db) != SQLITE_OK)
        return ck_error(CK_EIO, "cannot close the state database: %s", sqlite3_errmsg(s->db));
    s->db = NULL;
    return 0;
}

int ck_state_reopen_db(struct ck_state *s)
{
    char path[4096];
    int err;
    if (s->db)
        return 0;
    if ((err = ck_state_db_path(s, path, sizeof path)) < 0)
        return err;
    return ck_state_open_db(path, &s->db);
}

int ck_state_begin(struct ck_state *s)
{
    return exec(s->db, "BEGIN IMMEDIATE");
}

int ck_state_commit(struct ck_state *s)
{
    return exec(s->db, "COMMIT");
}

void ck_state_rollback(struct ck_state *s)
{
    exec(s->db, "ROLLBACK");
}

/* The statements of this module, prepared on first use and kept. */
enum { S_HASH_GET, S_HASH_PUT, S_CKPT_PUT, S_CKPT_GET, S_CKPT_DEL, S_CKPT_PRINT, S_META_GET,
       S_META_SET, S_CKPT_ALL };
static const char *const stmt_sql[] = {
    [S_HASH_GET] = "SELECT md5, sha256 FROM hash_cache WHERE dev = ? AND ino = ? AND size = ? "
                   "AND mtime_ns = ?",
    [S_HASH_PUT] = "INSERT OR REPLACE INTO hash_cache (dev, ino, size, mtime_ns, md5, sha256) "
                   "VALUES (?, ?, ?, ?, ?, ?)",
    [S_CKPT_PUT] = "INSERT OR REPLACE INTO checkpoints (ref, source, tree_path, sha256, size, "
                   "nfiles, fingerprint) VALUES (?, ?, ?, ?, ?, ?, ?)",
    [S_CKPT_GET] = "SELECT source, tree_path, sha256, size, nfiles, fingerprint FROM checkpoints "
                   "WHERE ref = ?",
    [S_CKPT_DEL] = "DELETE FROM checkpoints WHERE ref = ?",
    [S_CKPT_PRINT] = "UPDATE checkpoints SET fingerprint = ? WHERE ref = ?",
    [S_META_GET] = "SELECT value FROM meta WHERE key = ?",
    [S_META_SET] = "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
    /* BINARY collation: memcmp order, which is strcmp's for text without NULs */
    [S_CKPT_ALL] = "SELECT ref, source, sha256, size, nfiles FROM checkpoints ORDER BY ref",
};
_Static_assert(sizeof stmt_sql / sizeof *stmt_sql == CK_STATE_NSTMT, "one slot per statement");

/* A reset statement ready for binding, or NULL (the message is set). */
static sqlite3_stmt *stmt(struct ck_state *s, int which)
{
    if (!s->stmt[which] && sqlite3_prepare_v3(s->db, stmt_sql[which], -1, SQLITE_PREPARE_PERSISTENT,
                                              &s->stmt[which], NULL) != SQLITE_OK) {
        db_fail(s->db, "preparing a statement");
        return NULL;
    }
    sqlite3_reset(s->stmt[which]);
    sqlite3_clear_bindings(s->stmt[which]);
    return s->stmt[which];
}

int ck_state_get(struct ck_state *s, const char *key, char **out)
{
    sqlite3_stmt *st = stmt(s, S_META_GET);
    *out = NULL;
    if (!st)
        return CK_EIO;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int err = 0;
    if (sqlite3_step(st) == SQLITE_ROW) {
        *out = strdup((const char *)sqlite3_column_text(st, 0));
        if (!*out)
            err = ck_error(CK_ENOMEM, "out of memory");
    }
    sqlite3_reset(st);
    return err;
}

int ck_state_set(struct ck_state *s, const char *key, const char *value)
{
    sqlite3_stmt *st = stmt(s, S_META_SET);
    if (!st)
        return CK_EIO;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, value, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? 0 : db_fail(s->db, "writing meta");
}

bool ck_state_hash_lookup(struct ck_state *s, const struct stat *st, struct ck_hash_entry *out)
{
    sqlite3_stmt *q = stmt(s, S_HASH_GET);
    bool hit = false;
    if (!q)
        return false;
    sqlite3_bind_int64(q, 1, (sqlite3_int64)st->st_dev);
    sqlite3_bind_int64(q, 2, (sqlite3_int64)st->st_ino);
    sqlite3_bind_int64(q, 3, (sqlite3_int64)st->st_size);
    sqlite3_bind_int64(q, 4, ck_mtime_ns(st));
    if (sqlite3_step(q) == SQLITE_ROW) {
        snprintf(out->md5, sizeof out->md5, "%s", (const char *)sqlite3_column_text(q, 0));
        snprintf(out->sha256, sizeof out->sha256, "%s", (const char *)sqlite3_column_text(q, 1));
        hit = strlen(out->md5) == 32;
    }
    sqlite3_reset(q);
    return hit;
}

int ck_state_hash_store(struct ck_state *s, const struct stat *st, const char *md5,
                        const char *sha256)
{
    sqlite3_stmt *q = stmt(s, S_HASH_PUT);
    if (!q)
        return CK_EIO;
    sqlite3_bind_int64(q, 1, (sqlite3_int64)st->st_dev);
    sqlite3_bind_int64(q, 2, (sqlite3_int64)st->st_ino);
    sqlite3_bind_int64(q, 3, (sqlite3_int64)st->st_size);
    sqlite3_bind_int64(q, 4, ck_mtime_ns(st));
    sqlite3_bind_text(q, 5, md5, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 6, sha256 ? sha256 : "", -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_reset(q);
    return rc == SQLITE_DONE ? 0 : db_fail(s->db, "writing the hash cache");
}

int ck_state_ckpt_put(struct ck_state *s, const struct ck_ckpt_record *r)
{
    sqlite3_stmt *q = stmt(s, S_CKPT_PUT);
    if (!q)
        return CK_EIO;
    sqlite3_bind_text(q, 1, r->ref, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, r->source, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, r->tree_path, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 4, r->sha256, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 5, (sqlite3_int64)r->size);
    sqlite3_bind_int(q, 6, r->nfiles);
    sqlite3_bind_int64(q, 7, (sqlite3_int64)r->fingerprint);
    int rc = sqlite3_step(q);
    sqlite3_reset(q);
    return rc == SQLITE_DONE ? 0 : db_fail(s->db, "recording a checkpoint");
}

int ck_state_ckpt_get(struct ck_state *s, const char *ref, struct ck_ckpt_record *out)
{
    sqlite3_stmt *q = stmt(s, S_CKPT_GET);
    if (!q)
        return CK_EIO;
    sqlite3_bind_text(q, 1, ref, -1, SQLITE_STATIC);
    int err = CK_ENOENT;
    if (sqlite3_step(q) == SQLITE_ROW) {
        snprintf(out->ref, sizeof out->ref, "%s", ref);
        snprintf(out->source, sizeof out->source, "%s", (const char *)sqlite3_column_text(q, 0));
        snprintf(out->tree_path, sizeof out->tree_path, "%s",
                 (const char *)sqlite3_column_text(q, 1));
        snprintf(out->sha256, sizeof out->sha256, "%s", (const char *)sqlite3_column_text(q, 2));
        out->size = (uint64_t)sqlite3_column_int64(q, 3);
        out->nfiles = sqlite3_column_int(q, 4);
        out->fingerprint = (uint64_t)sqlite3_column_int64(q, 5);
        err = 0;
    }
    sqlite3_reset(q);
    return err;
}

void ck_ckpt_briefs_release(struct ck_ckpt_briefs *b)
{
    free(b->v);
    free(b->text);
    b->v = NULL;
    b->text = NULL;
    b->n = 0;
}

int ck_state_ckpt_briefs(struct ck_state *s, struct ck_ckpt_briefs *out)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *q = stmt(s, S_CKPT_ALL);
    if (!q)
        return CK_EIO;
    struct ck_buf text = CK_BUF_INIT;
    size_t cap = 0;
    int rc, err = 0;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (out->n == cap) {
            size_t ncap = cap ? cap * 2 : 256;
            struct ck_ckpt_brief *v = realloc(out->v, ncap * sizeof *v);
            if (!v) {
                err = ck_error(CK_ENOMEM, "out of memory reading the checkpoints' records");
                break;
            }
            out->v = v, cap = ncap;
        }
        struct ck_ckpt_brief *b = &out->v[out->n];
        const char *ref = (const char *)sqlite3_column_text(q, 0);
        const char *src = (const char *)sqlite3_column_text(q, 1);
        const char *sha = (const char *)sqlite3_column_text(q, 2);
        /* offsets until the text stops moving; pointers after the loop */
        size_t at_ref = text.len;
        if ((err = ck_buf_append(&text, ref ? ref : "", ref ? strlen(ref) + 1 : 1)) < 0)
            break;
        size_t at_src = text.len;
        if ((err = ck_buf_append(&text, src ? src : "", src ? strlen(src) + 1 : 1)) < 0)
            break;
        b->ref = (const char *)(uintptr_t)at_ref;
        b->source = (const char *)(uintptr_t)at_src;
        snprintf(b->sha256, sizeof b->sha256, "%s", sha ? sha : "");
        b->size = (uint64_t)sqlite3_column_int64(q, 3);
        b->nfiles = sqlite3_column_int(q, 4);
        out->n++;
    }
    if (!err && rc != SQLITE_DONE)
        err = db_fail(s->db, "reading the checkpoints' records");
    sqlite3_reset(q);
    out->text = ck_buf_detach(&text);
    if (!err && !out->text)
        err = ck_error(CK_ENOMEM, "out of memory reading the checkpoints' records");
    for (size_t i = 0; !err && i < out->n; i++) {
        out->v[i].ref = out->text + (uintptr_t)out->v[i].ref;
        out->v[i].source = out->text + (uintptr_t)out->v[i].source;
    }
    if (err < 0)
        ck_ckpt_briefs_release(out);
    return err;
}

const struct ck_ckpt_brief *ck_ckpt_briefs_find(const struct ck_ckpt_briefs *b, const char *ref)
{
    size_t lo = 0, hi = b->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(b->v[mid].ref, ref);
        if (c == 0)
            return &b->v[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int ck_state_ckpt_set_fingerprint(struct ck_state *s, const char *ref, uint64_t fingerprint)
{
    sqlite3_stmt *q = stmt(s, S_CKPT_PRINT);
    if (!q)
        return CK_EIO;
    sqlite3_bind_int64(q, 1, (sqlite3_int64)fingerprint);
    sqlite3_bind_text(q, 2, ref, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_reset(q);
    return rc == SQLITE_DONE ? 0 : db_fail(s->db, "recording a checkpoint");
}

int ck_state_ckpt_delete(struct ck_state *s, const char *ref)
{
    sqlite3_stmt *q = stmt(s, S_CKPT_DEL);
    if (!q)
        return CK_EIO;
    sqlite3_bind_text(q, 1, ref, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_reset(q);
    return rc == SQLITE_DONE ? 0 : db_fail(s->db, "removing a checkpoint");
}

static int text_col(sqlite3_stmt *q, int col, char **out)
{
    const char *v = (const char *)sqlite3_column_text(q, col);
    *out = strdup(v ? v : "");
    return *out ? 0 : ck_error(CK_ENOMEM, "out of memory");
}

void ck_retained_release(struct ck_retained *r)
{
    free(r->ref);
    free(r->path);
    free(r->source);
    free(r->files);
    free(r->stores);
    memset(r, 0, sizeof *r);
}

int ck_state_retained_put(struct ck_state *s, const struct ck_retained *r)
{
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(s->db,
                           "INSERT OR REPLACE INTO retention (ref, ref_is_int, state, epoch, path, "
                           "md5, source, kind, files, stores, seq) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                           -1, &q, NULL) != SQLITE_OK)
        return db_fail(s->db, "preparing a statement");
    sqlite3_bind_text(q, 1, r->ref, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, r->ref_is_int);
    sqlite3_bind_text(q, 3,
                      r->pruned == 2 ? "pruned"
                      : r->pruned    ? "pruning"
                      : r->deleted   ? "deleted"
                                     : "deleting",
                      -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 4, r->epoch);
    sqlite3_bind_text(q, 5, r->path, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 6, r->md5, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 7, r->source ? r->source : "", -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 8, r->kind);
    sqlite3_bind_text(q, 9, r->files ? r->files : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 10, r->stores ? r->stores : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 11, r->seq);
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? 0 : db_fail(s->db, "recording a retention step");
}

int ck_state_retained_delete(struct ck_state *s, const char *ref)
{
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(s->db, "DELETE FROM retention WHERE ref = ?", -1, &q, NULL) !=
        SQLITE_OK)
        return db_fail(s->db, "preparing a statement");
    sqlite3_bind_text(q, 1, ref, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? 0 : db_fail(s->db, "removing a retention record");
}

int ck_state_retained_list(sqlite3 *db, struct ck_retained **out, size_t *n)
{
    sqlite3_stmt *q;
    *out = NULL;
    *n = 0;
    int rc = sqlite3_prepare_v2(db,
                                "SELECT ref, ref_is_int, state, epoch, path, md5, source, kind, "
                                "files, stores, seq FROM retention ORDER BY seq, ref",
                                -1, &q, NULL);
    if (rc != SQLITE_OK) /* a database without the table (an upload-only queue folder) */
        return sqlite3_errcode(db) == SQLITE_ERROR ? CK_ENOENT
                                                   : db_fail(db, "listing retention records");
    int err = 0;
    while (err == 0 && (rc = sqlite3_step(q)) == SQLITE_ROW) {
        struct ck_retained *v = realloc(*out, (*n + 1) * sizeof *v);
        if (!v) {
            err = ck_error(CK_ENOMEM, "out of memory");
            break;
        }
        *out = v;
        struct ck_retained *r = &v[*n];
        memset(r, 0, sizeof *r);
        (*n)++;
        r->ref_is_int = sqlite3_column_int(q, 1);
        const char *state = (const char *)sqlite3_column_text(q, 2);
        r->pruned = !strcmp(state, "pruned") ? 2 : !strcmp(state, "pruning") ? 1 : 0;
        r->deleted = r->pruned || !strcmp(state, "deleted");
        r->epoch = sqlite3_column_int64(q, 3);
        snprintf(r->md5, sizeof r->md5, "%s", (const char *)sqlite3_column_text(q, 5));
        r->kind = sqlite3_column_int(q, 7);
        r->seq = sqlite3_column_int64(q, 10);
        if ((err = text_col(q, 0, &r->ref)) < 0 || (err = text_col(q, 4, &r->path)) < 0 ||
            (err = text_col(q, 6, &r->source)) < 0 || (err = text_col(q, 8, &r->files)) < 0 ||
            (err = text_col(q, 9, &r->stores)) < 0)
            break;
    }
    if (err == 0 && rc != SQLITE_DONE)
        err = db_fail(db, "listing retention records");
    sqlite3_finalize(q);
    if (err < 0) {
        ck_retained_list_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return err;
}

bool ck_state_retained_deleting(struct ck_state *s, const char *ref)
{
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(s->db, "SELECT 1 FROM retention WHERE ref = ? AND state = 'deleting'",
                           -1, &q, NULL) !=
        SQLITE_OK)
        return false;
    sqlite3_bind_text(q, 1, ref, -1, SQLITE_STATIC);
    bool has = sqlite3_step(q) == SQLITE_ROW;
    sqlite3_finalize(q);
    return has;
}

void ck_retained_list_free(struct ck_retained *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_retained_release(&v[i]);
    free(v);
}

int ck_state_hash_file(struct ck_state *s, const char *path, struct ck_hash_entry *out,
                       uint64_t *size)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return ck_error_os(errno == ENOENT ? CK_ECHANGED : CK_EIO, "cannot stat '%s'", path);
    if (size)
        *size = (uint64_t)st.st_size;
    if (ck_state_hash_lookup(s, &st, out) && out->sha256[0])
        return 0;
    struct ck_digests d;
    int err = ck_hash_file(path, CK_HASH_BOTH, &d, &st);
    if (err < 0)
        return err;
    ck_metrics_add(CK_M_BYTES_HASHED, d.size);
    memcpy(out->md5, d.md5, sizeof out->md5);
    memcpy(out->sha256, d.sha256, sizeof out->sha256);
    ck_debug("file.hashed", "path='%s' bytes=%llu md5=%s", path, (unsigned long long)d.size, d.md5);
    return ck_state_hash_store(s, &st, d.md5, d.sha256);
}

int ck_state_open_upload_dir(const char *state_dir, char *dir, size_t dirsz, sqlite3 **out)
{
    char path[4200];
    int err;
    *out = NULL;
    if (state_dir)
        snprintf(dir, dirsz, "%s", state_dir);
    else if ((err = ck_uploader_default_state(dir, dirsz)) < 0)
        return err;
    if ((err = ck_mkdirs(dir, 0700)) < 0 ||
        (err = ck_path_join(path, sizeof path, dir, "state.db")) < 0)
        return err;
    return ck_state_open_db(path, out);
}
