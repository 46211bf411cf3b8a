#include "stores/queue.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* The schema version lives in its own table: PRAGMA user_version belongs to
 * the agent's own migrations (agent/state.c). */
static const char schema_sql[] =
    "CREATE TABLE IF NOT EXISTS upload_schema(version INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS upload_stores("
    "  id INTEGER PRIMARY KEY, url TEXT NOT NULL UNIQUE, endpoint TEXT, region TEXT,"
    "  credentials TEXT, auth TEXT, key_file TEXT, host_key TEXT,"
    "  compress INTEGER NOT NULL DEFAULT 0, bundle INTEGER NOT NULL DEFAULT 0,"
    "  no_move INTEGER NOT NULL DEFAULT 0, profile TEXT,"
    "  commit_multipart INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS upload_jobs("
    "  id INTEGER PRIMARY KEY, store INTEGER NOT NULL REFERENCES upload_stores(id),"
    "  src TEXT NOT NULL, key TEXT NOT NULL, phase INTEGER NOT NULL, kind INTEGER NOT NULL,"
    "  state INTEGER NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,"
    "  spool TEXT, upload_id TEXT NOT NULL DEFAULT '', part_size INTEGER NOT NULL DEFAULT 0,"
    "  attempts INTEGER NOT NULL DEFAULT 0, next_try REAL NOT NULL DEFAULT 0,"
    "  sha256 TEXT NOT NULL DEFAULT '', orig_sha256 TEXT NOT NULL DEFAULT '', error TEXT,"
    "  created REAL NOT NULL, updated REAL NOT NULL, checked TEXT NOT NULL DEFAULT '',"
    "  checkpoint TEXT);"
    "CREATE INDEX IF NOT EXISTS upload_jobs_by_key ON upload_jobs(store, key);"
    "CREATE INDEX IF NOT EXISTS upload_jobs_by_state ON upload_jobs(state, phase, id);"
    "CREATE TABLE IF NOT EXISTS upload_parts("
    "  job INTEGER NOT NULL REFERENCES upload_jobs(id) ON DELETE CASCADE,"
    "  number INTEGER NOT NULL, size INTEGER NOT NULL, etag TEXT NOT NULL,"
    "  sha256_b64 TEXT NOT NULL, md5 TEXT NOT NULL, PRIMARY KEY(job, number));"
    /* Multipart uploads begun and given up before completion (the file
     * changed or went, the job was replaced or pruned): the service keeps and
     * bills their parts until they are aborted, which the next upload round
     * does (stores/uploader.c). Triggers, so that no path that drops an
     * upload id can forget one; a done job's id is of a completed upload and
     * is not one. Added without a schema version: an older ckptd ignores the
     * table and its triggers go on filling it. */
    "CREATE TABLE IF NOT EXISTS upload_abandoned("
    "  id INTEGER PRIMARY KEY, store INTEGER NOT NULL, key TEXT NOT NULL,"
    "  upload_id TEXT NOT NULL, created REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,"
    "  UNIQUE(store, key, upload_id));"
    "CREATE TRIGGER IF NOT EXISTS upload_abandoned_on_change AFTER UPDATE OF upload_id"
    "  ON upload_jobs WHEN OLD.upload_id <> '' AND NEW.upload_id IS NOT OLD.upload_id"
    "  AND OLD.state <> 2 AND NEW.state <> 2 BEGIN"
    "  INSERT OR IGNORE INTO upload_abandoned(store, key, upload_id, created)"
    "  VALUES(OLD.store, OLD.key, OLD.upload_id, (julianday('now') - 2440587.5) * 86400.0); END;"
    "CREATE TRIGGER IF NOT EXISTS upload_abandoned_on_delete AFTER DELETE ON upload_jobs"
    "  WHEN OLD.upload_id <> '' AND OLD.state <> 2 BEGIN"
    "  INSERT OR IGNORE INTO upload_abandoned(store, key, upload_id, created)"
    "  VALUES(OLD.store, OLD.key, OLD.upload_id, (julianday('now') - 2440587.5) * 86400.0); END;";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int db_err(sqlite3 *db, const char *what)
{
    int rc = sqlite3_errcode(db);
    if (rc == SQLITE_FULL)
        return ck_error(CK_EIO, "upload queue: %s: the disk holding the state database is full",
                        what);
    return ck_error(CK_EIO, "upload queue: %s: %s", what, sqlite3_errmsg(db));
}

static int exec(sqlite3 *db, const char *sql, const char *what)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        int err =
            sqlite3_errcode(db) == SQLITE_FULL
                ? ck_error(CK_EIO,
                           "upload queue: %s: the disk holding the state database "
                           "is full",
                           what)
                : ck_error(CK_EIO, "upload queue: %s: %s", what, msg ? msg : sqlite3_errmsg(db));
        sqlite3_free(msg);
        return err;
    }
    return 0;
}

static int prep(sqlite3 *db, const char *sql, sqlite3_stmt **st)
{
    if (sqlite3_prepare_v2(db, sql, -1, st, NULL) != SQLITE_OK)
        return db_err(db, "preparing a statement");
    return 0;
}

/* Runs a prepared statement to completion and finalizes it. */
static int run(sqlite3 *db, sqlite3_stmt *st, const char *what)
{
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW)
        return db_err(db, what);
    return 0;
}

static void bind_text(sqlite3_stmt *st, int i, const char *s)
{
    if (s)
        sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, i);
}

/* Adds table.column (with its declaration) to a queue an older ckptd made,
 * where it is missing; in the caller's transaction. */
static int add_column(sqlite3 *db, const char *table, const char *column, const char *decl)
{
    sqlite3_stmt *st;
    char sql[256];
    int err;
    if ((err = prep(db, "SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2", &st)) < 0)
        return err;
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, column, -1, SQLITE_STATIC);
    bool has = sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    if (has)
        return 0;
    snprintf(sql, sizeof sql, "ALTER TABLE %s ADD COLUMN %s %s", table, column, decl);
    return exec(db, sql, "adding a column to the upload queue");
}

int ck_queue_init(sqlite3 *db)
{
    int err;
    sqlite3_stmt *st;
    if ((err = exec(db, "BEGIN IMMEDIATE", "creating the tables")) < 0)
        return err;
    if ((err = exec(db, schema_sql, "creating the tables")) < 0)
        goto fail;
    int version = 0;
    if ((err = prep(db, "SELECT max(version) FROM upload_schema", &st)) < 0)
        goto fail;
    if (sqlite3_step(st) == SQLITE_ROW)
        version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    if (version > CK_QUEUE_SCHEMA) {
        err = ck_error(CK_ESTATE, "the upload queue was written by a newer ckptd (schema %d > %d)",
                       version, CK_QUEUE_SCHEMA);
        goto fail;
    }
    /* schema 1 had no upload_stores.profile (queues a ckptd before it left) */
    if (version == 1 &&
        (err = exec(db, "ALTER TABLE upload_stores ADD COLUMN profile TEXT", "adding profile")) < 0)
        goto fail;
    /* schemas 1 and 2 had no upload_jobs.checked (a schema 1 queue may also
     * have had no upload_jobs at all: then the CREATE above made it whole),
     * schemas before 4 no upload_stores.commit_multipart, before 5 no
     * upload_jobs.checkpoint */
    if ((err = add_column(db, "upload_jobs", "checked", "TEXT NOT NULL DEFAULT ''")) < 0 ||
        (err = add_column(db, "upload_jobs", "checkpoint", "TEXT")) < 0 ||
        (err = add_column(db, "upload_stores", "commit_multipart", "INTEGER NOT NULL DEFAULT 0")) < 0)
        goto fail;
    if (version < CK_QUEUE_SCHEMA) {
        char sql[96];
        snprintf(sql, sizeof sql, "DELETE FROM upload_schema; INSERT INTO upload_schema VALUES(%d)",
                 CK_QUEUE_SCHEMA);
        if ((err = exec(db, sql, "recording the schema version")) < 0)
            goto fail;
    }
    return exec(db, "COMMIT", "creating the tables");
fail:
    exec(db, "ROLLBACK", "rollback");
    return err;
}

int ck_queue_store_put(sqlite3 *db, const struct ck_store_spec *s, int64_t *id)
{
    sqlite3_stmt *st;
    int err;
    if ((err = prep(db,
                    "INSERT INTO upload_stores(url, endpoint, region, credentials, auth, key_file,"
                    " host_key, compress, bundle, no_move, profile, commit_multipart)"
                    " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12)"
                    " ON CONFLICT(url) DO UPDATE SET endpoint=?2, region=?3, credentials=?4,"
                    " auth=?5, key_file=?6, host_key=?7, compress=?8, bundle=?9, no_move=?10,"
                    " profile=?11, commit_multipart=?12",
                    &st)) < 0)
        return err;
    bind_text(st, 1, s->url);
    bind_text(st, 2, s->endpoint);
    bind_text(st, 3, s->region);
    bind_text(st, 4, s->credentials);
    bind_text(st, 5, s->auth);
    bind_text(st, 6, s->key_file);
    bind_text(st, 7, s->host_key);
    sqlite3_bind_int(st, 8, s->compress);
    sqlite3_bind_int(st, 9, s->bundle);
    sqlite3_bind_int(st, 10, s->no_move);
    bind_text(st, 11, s->profile);
    sqlite3_bind_int(st, 12, s->commit_multipart);
    if ((err = run(db, st, "recording a store")) < 0)
        return err;
    if ((err = prep(db, "SELECT id FROM upload_stores WHERE url = ?1", &st)) < 0)
        return err;
    bind_text(st, 1, s->url);
    if (sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return db_err(db, "reading a store");
    }
    *id = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return 0;
}

static char *col_dup(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

int ck_queue_store_get(sqlite3 *db, int64_t id, struct ck_store_spec *out)
{
    sqlite3_stmt *st;
    int err;
    memset(out, 0, sizeof *out);
    if ((err = prep(db,
                    "SELECT url, endpoint, region, credentials, auth, key_file, host_key,"
                    " compress, bundle, no_move, profile, commit_multipart FROM upload_stores"
                    " WHERE id = ?1",
                    &st)) < 0)
        return err;
    sqlite3_bind_int64(st, 1, id);
    if (sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return ck_error(CK_ENOENT, "upload queue: no store %lld", (long long)id);
    }
    out->url = col_dup(st, 0);
    out->endpoint = col_dup(st, 1);
    out->region = col_dup(st, 2);
    out->credentials = col_dup(st, 3);
    out->auth = col_dup(st, 4);
    out->key_file = col_dup(st, 5);
    out->host_key = col_dup(st, 6);
    out->compress = sqlite3_column_int(st, 7);
    out->bundle = sqlite3_column_int(st, 8);
    out->no_move = sqlite3_column_int(st, 9);
    out->profile = col_dup(st, 10);
    out->commit_multipart = sqlite3_column_int(st, 11);
    sqlite3_finalize(st);
    return out->url ? 0 : ck_error(CK_ENOMEM, "out of memory");
}

void ck_job_release(struct ck_job *j)
{
    free(j->store_url);
    free(j->src);
    free(j->key);
    free(j->spool);
    free(j->error);
    free(j->checkpoint);
    memset(j, 0, sizeof *j);
}

const char *ck_job_state_name(enum ck_job_state s)
{
    static const char *names[] = {"pending", "running", "done", "failed", "gone"};
    return (unsigned)s < CK_JOB_NSTATES ? names[s] : "?";
}

#define JOB_COLS                                                                                   \
    "j.id, j.store, s.url, j.src, j.key, j.spool, j.phase, j.kind, j.state, j.size, j.mtime_ns,"   \
    " j.upload_id, j.part_size, j.attempts, j.sha256, j.orig_sha256, j.error, j.created,"          \
    " j.updated, j.checked, j.checkpoint FROM upload_jobs j JOIN upload_stores s ON s.id = j.store"

static void read_job(sqlite3_stmt *st, struct ck_job *j)
{
    memset(j, 0, sizeof *j);
    j->id = sqlite3_column_int64(st, 0);
    j->store_id = sqlite3_column_int64(st, 1);
    j->store_url = col_dup(st, 2);
    j->src = col_dup(st, 3);
    j->key = col_dup(st, 4);
    j->spool = col_dup(st, 5);
    j->phase = sqlite3_column_int(st, 6);
    j->kind = (enum ck_job_kind)sqlite3_column_int(st, 7);
    j->state = (enum ck_job_state)sqlite3_column_int(st, 8);
    j->size = (uint64_t)sqlite3_column_int64(st, 9);
    j->mtime_ns = sqlite3_column_int64(st, 10);
    const unsigned char *t = sqlite3_column_text(st, 11);
    snprintf(j->upload_id, sizeof j->upload_id, "%s", t ? (const char *)t : "");
    j->part_size = (uint64_t)sqlite3_column_int64(st, 12);
    j->attempts = sqlite3_column_int(st, 13);
    t = sqlite3_column_text(st, 14);
    snprintf(j->sha256, sizeof j->sha256, "%s", t ? (const char *)t : "");
    t = sqlite3_column_text(st, 15);
    snprintf(j->orig_sha256, sizeof j->orig_sha256, "%s", t ? (const char *)t : "");
    j->error = col_dup(st, 16);
    j->created = sqlite3_column_double(st, 17);
    j->updated = sqlite3_column_double(st, 18);
    t = sqlite3_column_text(st, 19);
    snprintf(j->checked, sizeof j->checked, "%s", t ? (const char *)t : "");
    j->checkpoint = col_dup(st, 20);
}

int ck_queue_batch_begin(sqlite3 *db)
{
    return exec(db, "BEGIN IMMEDIATE", "queueing");
}

int ck_queue_batch_end(sqlite3 *db, int err)
{
    if (err < 0) {
        exec(db, "ROLLBACK", "rollback");
        return err;
    }
    return exec(db, "COMMIT", "queueing");
}

int ck_queue_add(sqlite3 *db, int64_t store_id, const char *src, const char *key, int phase,
                 enum ck_job_kind kind, int64_t *id, bool *added)
{
    return ck_queue_add_as(db, store_id, src, key, phase, kind, NULL, id, added);
}

int ck_queue_add_as(sqlite3 *db, int64_t store_id, const char *src, const char *key, int phase,
                    enum ck_job_kind kind, const struct stat *known, int64_t *id, bool *added)
{
    struct stat sb;
    sqlite3_stmt *st;
    int err;
    *added = false;
    *id = 0;
    if (known)
        sb = *known;
    else if (stat(src, &sb) < 0)
        return ck_error_os(CK_ENOENT, "cannot queue '%s'", src);
    bool bundle = kind == CK_JOB_BUNDLE || kind == CK_JOB_BUNDLE_PMF;
    uint64_t size = bundle ? 0 : (uint64_t)sb.st_size;
    int64_t mtime = bundle ? 0 : ck_mtime_ns(&sb);
    /* inside a caller's batch (ck_queue_batch_begin) a savepoint, so a
     * failure undoes this job only */
    bool nested = !sqlite3_get_autocommit(db);
    if ((err = exec(db, nested ? "SAVEPOINT queue_add" : "BEGIN IMMEDIATE", "queueing")) < 0)
        return err;
    /* the newest job for this store and key decides */
    if ((err = prep(db,
                    "SELECT id, state, size, mtime_ns, kind, sha256, orig_sha256 FROM upload_jobs"
                    " WHERE store = ?1 AND key = ?2 ORDER BY id DESC LIMIT 1",
                    &st)) < 0)
        goto fail;
    sqlite3_bind_int64(st, 1, store_id);
    bind_text(st, 2, key);
    int64_t old = 0;
    int ostate = -1;
    bool same = false;
    if (sqlite3_step(st) == SQLITE_ROW) {
        old = sqlite3_column_int64(st, 0);
        ostate = sqlite3_column_int(st, 1);
        same = (uint64_t)sqlite3_column_int64(st, 2) == size &&
               sqlite3_column_int64(st, 3) == mtime && sqlite3_column_int(st, 4) == (int)kind;
        /* a bundle is made when it is sent: a pending one already covers this */
        if (bundle && ostate == CK_JOB_DONE)
            same = false;
        /* rewritten with the same bytes (a new mtime only): sent already, not again */
        const char *sent = (const char *)sqlite3_column_text(st, kind == CK_JOB_ZSTD ? 6 : 5);
        if (!same && !bundle && ostate == CK_JOB_DONE && sqlite3_column_int(st, 4) == (int)kind &&
            (uint64_t)sqlite3_column_int64(st, 2) == size && sent && strlen(sent) == 64) {
            struct ck_digests d;
            if (ck_hash_file(src, CK_HASH_SHA256, &d, NULL) == 0 && d.size == size &&
                !strcmp(d.sha256, sent))
                same = true;
            ck_error_clear();
        }
    }
    sqlite3_finalize(st);
    double t = now_s();
    if (old && same && (ostate == CK_JOB_FAILED || ostate == CK_JOB_GONE)) {
        /* queued again after it failed: pending, its accepted parts kept */
        char sql[160];
        snprintf(sql, sizeof sql,
                 "UPDATE upload_jobs SET state = 0, attempts = 0, next_try = 0 WHERE id = %lld",
                 (long long)old);
        if ((err = exec(db, sql, "queueing")) < 0)
            goto fail;
        *id = old;
        *added = true;
    } else if (old && same) {
        *id = old;
        char sql[128];
        snprintf(sql, sizeof sql, "UPDATE upload_jobs SET mtime_ns = %lld WHERE id = %lld",
                 (long long)mtime, (long long)old);
        if (!bundle && (err = exec(db, sql, "queueing")) < 0)
            goto fail;
    } else {
        if (old && (ostate == CK_JOB_PENDING || ostate == CK_JOB_FAILED || ostate == CK_JOB_GONE)) {
            /* replaced, not updated: the new row's id orders it after the data
             * jobs queued meanwhile (the metadata-last rule compares ids) */
            char sql[128];
            snprintf(sql, sizeof sql,
                     "DELETE FROM upload_parts WHERE job = %lld; DELETE FROM upload_jobs WHERE"
                     " id = %lld",
                     (long long)old, (long long)old);
            if ((err = exec(db, sql, "replacing a job")) < 0)
                goto fail;
        }
        if ((err = prep(db,
                        "INSERT INTO upload_jobs(store, src, key, phase, kind, state, size,"
                        " mtime_ns, created, updated) VALUES(?1,?2,?3,?4,?5,0,?6,?7,?8,?8)",
                        &st)) < 0)
            goto fail;
        sqlite3_bind_int64(st, 1, store_id);
        bind_text(st, 2, src);
        bind_text(st, 3, key);
        sqlite3_bind_int(st, 4, phase);
        sqlite3_bind_int(st, 5, (int)kind);
        sqlite3_bind_int64(st, 6, (int64_t)size);
        sqlite3_bind_int64(st, 7, mtime);
        sqlite3_bind_double(st, 8, t);
        if ((err = run(db, st, "queueing a job")) < 0)
            goto fail;
        *id = sqlite3_last_insert_rowid(db);
        *added = true;
    }
    return exec(db, nested ? "RELEASE queue_add" : "COMMIT", "queueing");
fail:
    exec(db, nested ? "ROLLBACK TO queue_add; RELEASE queue_add" : "ROLLBACK", "rollback");
    return err;
}

bool ck_queue_known_digests(sqlite3 *db, const struct stat *st, char sha256[65], char md5[33])
{
    sqlite3_stmt *q;
    bool hit = false;
    sha256[0] = '\0';
    md5[0] = '\0';
    /* no table (a queue of its own): unknown, not an error */
    if (sqlite3_prepare_v2(db,
                           "SELECT sha256, md5 FROM hash_cache WHERE dev = ?1 AND ino = ?2 AND"
                           " size = ?3 AND mtime_ns = ?4",
                           -1, &q, NULL) != SQLITE_OK)
        return false;
    sqlite3_bind_int64(q, 1, (sqlite3_int64)st->st_dev);
    sqlite3_bind_int64(q, 2, (sqlite3_int64)st->st_ino);
    sqlite3_bind_int64(q, 3, (sqlite3_int64)st->st_size);
    sqlite3_bind_int64(q, 4, ck_mtime_ns(st));
    if (sqlite3_step(q) == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(q, 0);
        const unsigned char *m = sqlite3_column_text(q, 1);
        if (t && strlen((const char *)t) == 64) {
            memcpy(sha256, t, 65);
            hit = true;
            /* the MD5 only beside its SHA-256: one row, one read of one file */
            if (m && strlen((const char *)m) == 32)
                memcpy(md5, m, 33);
        }
    }
    sqlite3_finalize(q);
    return hit;
}

/* The connection's PRAGMA synchronous (2, FULL, when it cannot be read). */
static int sync_level(sqlite3 *db)
{
    sqlite3_stmt *st;
    int level = 2;
    if (sqlite3_prepare_v2(db, "PRAGMA synchronous", -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW)
            level = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    return level;
}

static int claim(sqlite3 *db, const int64_t *skip, size_t nskip, struct ck_job *job);

/* Claiming a job needs no durability of its own: a running job whose process
 * is gone goes back to pending anyway. So its commit is not synced (WAL with
 * synchronous=NORMAL: written, not fsynced) and becomes durable with the
 * next synced commit (the job's end). One fsync less per job. */
int ck_queue_claim(sqlite3 *db, struct ck_job *job)
{
    return ck_queue_claim_except(db, NULL, 0, job);
}

int ck_queue_claim_except(sqlite3 *db, const int64_t *skip, size_t nskip, struct ck_job *job)
{
    int level = sync_level(db);
    char sql[48];
    if (level > 1)
        exec(db, "PRAGMA synchronous=NORMAL", "claiming a job");
    int err = claim(db, skip, nskip, job);
    if (level > 1) {
        snprintf(sql, sizeof sql, "PRAGMA synchronous=%d", level);
        int e2 = exec(db, sql, "claiming a job");
        if (err == 0 && e2 < 0) {
            ck_job_release(job);
            err = e2;
        }
    }
    return err;
}

void ck_queue_ids_json(char *out, size_t outsz, const int64_t *ids, size_t n)
{
    size_t o = 0;
    out[o++] = '[';
    for (size_t i = 0; i < n && o + 24 < outsz; i++)
        o += (size_t)snprintf(out + o, outsz - o, "%s%lld", i ? "," : "", (long long)ids[i]);
    snprintf(out + o, outsz - o, "]");
}

static int claim(sqlite3 *db, const int64_t *skip, size_t nskip, struct ck_job *job)
{
    sqlite3_stmt *st;
    char skipped[CK_QUEUE_IDS_JSON_MAX];
    int err;
    memset(job, 0, sizeof *job);
    ck_queue_ids_json(skipped, sizeof skipped, skip, nskip);
    if ((err = exec(db, "BEGIN IMMEDIATE", "claiming a job")) < 0)
        return err;
    /* data first; metadata only when no data job of its store is unfinished (the
     * metadata may name any of them); none of a skipped store */
    if ((err = prep(db,
                    "SELECT " JOB_COLS " WHERE j.state = 0 AND j.next_try <= ?1 AND"
                    " (j.phase = 0 OR NOT EXISTS (SELECT 1 FROM upload_jobs d WHERE"
                    " d.store = j.store AND d.phase = 0 AND d.state NOT IN (2, 4)))"
                    " AND j.store NOT IN (SELECT value FROM json_each(?2))"
                    " ORDER BY j.phase, j.id LIMIT 1",
                    &st)) < 0)
        goto fail;
    sqlite3_bind_text(st, 2, skipped, -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 1, now_s());
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        sqlite3_finalize(st);
        exec(db, "ROLLBACK", "rollback");
        return rc == SQLITE_DONE ? CK_ENOENT : db_err(db, "claiming a job");
    }
    read_job(st, job);
    sqlite3_finalize(st);
    if ((err = prep(db, "UPDATE upload_jobs SET state=1, updated=?2 WHERE id=?1", &st)) < 0)
        goto fail;
    sqlite3_bind_int64(st, 1, job->id);
    sqlite3_bind_double(st, 2, now_s());
    if ((err = run(db, st, "claiming a job")) < 0)
        goto fail;
    job->state = CK_JOB_RUNNING;
    return exec(db, "COMMIT", "claiming a job");
fail:
    ck_job_release(job);
    exec(db, "ROLLBACK", "rollback");
    return err;
}

int ck_queue_get(sqlite3 *db, int64_t id, struct ck_job *job)
{
    sqlite3_stmt *st;
    int err;
    memset(job, 0, sizeof *job);
    if ((err = prep(db, "SELECT " JOB_COLS " WHERE j.id = ?1", &st)) < 0)
        return err;
    sqlite3_bind_int64(st, 1, id);
    if (sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return ck_error(CK_ENOENT, "upload queue: no job %lld", (long long)id);
    }
    read_job(st, job);
    sqlite3_finalize(st);
    return 0;
}

int ck_queue_set_upload(sqlite3 *db, int64_t id, const char *upload_id, uint64_t part_size)
{
    sqlite3_stmt *st;
    int err;
    if ((err = exec(db, "BEGIN IMMEDIATE", "recording an upload id")) < 0)
        return err;
    if ((err = prep(db, "DELETE FROM upload_parts WHERE job = ?1", &st)) < 0)
        goto fail;
    sqlite3_bind_int64(st, 1, id);
    if ((err = run(db, st, "dropping parts")) < 0)
        goto fail;
    if ((err = prep(db, "UPDATE upload_jobs SET upload_id=?2, part_size=?3, updated=?4 WHERE id=?1",
                    &st)) < 0)
        goto fail;
    sqlite3_bind_int64(st, 1, id);
    bind_text(st, 2, upload_id);
    sqlite3_bind_int64(st, 3, (int64_t)part_size);
    sqlite3_bind_double(st, 4, now_s());
    if ((err = run(db, st, "recording an upload id")) < 0)
        goto fail;
    return exec(db, "COMMIT", "recording an upload id");
fail:
    exec(db, "ROLLBACK", "rollback");
    return err;
}

int ck_queue_add_part(sqlite3 *db, int64_t id, const struct ck_part *p)
{
    sqlite3_stmt *st;
    int err;
    if ((err = prep(db,
                    "INSERT OR REPLACE INTO upload_parts(job, number, size, etag, sha256_b64, md5)"
                    " VALUES(?1,?2,?3,?4,?5,?6)",
                    &st)) < 0)
        return err;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int(st, 2, p->number);
    sqlite3_bind_int64(st, 3, (int64_t)p->size);
    bind_text(st, 4, p->etag);
    bind_text(st, 5, p->sha256_b64);
    bind_text(st, 6, p->md5);
    return run(db, st, "recording a part");
}

int ck_queue_parts(sqlite3 *db, int64_t id, struct ck_part **parts, size_t *n)
{
    sqlite3_stmt *st;
    int err;
    *parts = NULL;
    *n = 0;
    if ((err = prep(db,
                    "SELECT number, size, etag, sha256_b64, md5 FROM upload_parts WHERE job = ?1"
                    " ORDER BY number",
                    &st)) < 0)
        return err;
    sqlite3_bind_int64(st, 1, id);
    size_t cap = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            struct ck_part *np = realloc(*parts, cap * sizeof *np);
            if (!np) {
                sqlite3_finalize(st);
                return ck_error(CK_ENOMEM, "out of memory");
            }
            *parts = np;
        }
        struct ck_part *p = &(*parts)[(*n)++];
        memset(p, 0, sizeof *p);
        p->number = sqlite3_column_int(st, 0);
        p->size = (uint64_t)sqlite3_column_int64(st, 1);
        snprintf(p->etag, sizeof p->etag, "%s", (const char *)sqlite3_column_text(st, 2));
        snprintf(p->sha256_b64, sizeof p->sha256_b64, "%s",
                 (const char *)sqlite3_column_text(st, 3));
        snprintf(p->md5, sizeof p->md5, "%s", (const char *)sqlite3_column_text(st, 4));
    }
    sqlite3_finalize(st);
    return 0;
}

int ck_queue_set_spool(sqlite3 *db, int64_t id, const char *spool, uint64_t size,
                       const char *orig_sha256)
{
    sqlite3_stmt *st;
    int err;
    if ((err = prep(db,
                    "UPDATE upload_jobs SET spool=?2, size=?3, orig_sha256=?4, updated=?5 WHERE"
                    " id=?1",
                    &st)) < 0)
        return err;
    sqlite3_bind_int64(st, 1, id);
    bind_text(st, 2, spool);
    sqlite3_bind_int64(st, 3, (int64_t)size);
    bind_text(st, 4, orig_sha256 ? orig_sha256 : "");
    sqlite3_bind_double(st, 5, now_s());
    return run(db, st, "recording a spool file");
}

int ck_queue_done(sqlite3 *db, int64_t id, const char *sha256, const char *checked)
{
    sqlite3_stmt *st;
    int err;
    if ((err = prep(db,
                    "UPDATE upload_jobs SET state=2, sha256=?2, error=NULL, spool=NULL, updated=?3,"
                    " checked=?4 WHERE id=?1",
                    &st)) < 0)
        return err;
    sqlite3_bind_int64(st, 1, id);
    bind_text(st, 2, sha256 ? sha256 : "");
    sqlite3_bind_double(st, 3, now_s());
    bind_text(st, 4, checked ? checked : "");
    return run(db, st, "finishing a job");
}

int ck_queue_fail(sqlite3 *db, int64_t id, const char *msg, bool permanent, double delay,
                  int max_attempts)
{
    sqlite3_stmt *st;
    int err;
    if ((err = prep(db,
                    "UPDATE upload_jobs SET attempts = attempts + 1, error=?2, updated=?3,"
                    " next_try=?4, state = CASE WHEN ?5 OR attempts + 1 >= ?6 THEN 3 ELSE 0 END"
                    " WHERE id=?1",
                    &st)) < 0)
        return err;
    double t = now_s();
    sqlite3_bind_int64(st, 1, id);
    bind_text(st, 2, msg);
    sqlite3_bind_double(st, 3, t);
    sqlite3_bind_double(st, 4, t + delay);
    sqlite3_bind_int(st, 5, permanent);
    sqlite3_bind_int(st, 6, max_attempts);
    return run(db, st, "recording a failure");
}

int ck_queue_requeue(sqlite3 *db, int64_t id, const char *msg)
{
    sqlite3_stmt *st;
    int err;
    if ((err = prep(db, "UPDATE upload_jobs SET state=0, error=?2, updated=?3 WHERE id=?1", &st)) <
        0)
        return err;
    sqlite3_bind_int64(st, 1, id);
    bind_text(st, 2, msg);
    sqlite3_bind_double(st, 3, now_s());
    return run(db, st, "requeueing a job");
}

int ck_queue_set_checkpoint(sqlite3 *db, int64_t id, const char *ref)
{
    sqlite3_stmt *st;
    int err;
    if ((err = prep(db, "UPDATE upload_jobs SET checkpoint=?2 WHERE id=?1", &st)) < 0)
        return err;
    sqlite3_bind_int64(st, 1, id);
    if (ref && *ref)
        bind_text(st, 2, ref);
    else
        sqlite3_bind_null(st, 2);
    return run(db, st, "recording a job's checkpoint");
}

int ck_queue_gone(sqlite3 *db, int64_t id, const char *msg)
{
    sqlite3_stmt *st;
    int err;
    /* the multipart upload it began is given up (upload_abandoned's
     * trigger): a file that comes back is another file, sent anew */
    if ((err = prep(db,
                    "UPDATE upload_jobs SET state=4, error=?2, updated=?3, upload_id='',"
                    " part_size=0 WHERE id=?1",
                    &st)) < 0)
        return err;
    sqlite3_bind_int64(st, 1, id);
    bind_text(st, 2, msg);
    sqlite3_bind_double(st, 3, now_s());
    if ((err = run(db, st, "recording a removed source")) < 0)
        return err;
    char sql[96];
    snprintf(sql, sizeof sql, "DELETE FROM upload_parts WHERE job = %lld", (long long)id);
    return exec(db, sql, "recording a removed source");
}

int ck_queue_recover(sqlite3 *db)
{
    return exec(db, "UPDATE upload_jobs SET state=0 WHERE state=1", "recovering jobs");
}

int ck_queue_retry(sqlite3 *db, int64_t id, int *n)
{
    sqlite3_stmt *st;
    int err;
    *n = 0;
    if ((err = prep(db,
                    id > 0 ? "UPDATE upload_jobs SET state=0, attempts=0, next_try=0 WHERE state=3"
                             " AND id=?1"
                           : "UPDATE upload_jobs SET state=0, attempts=0, next_try=0 WHERE state=3",
                    &st)) < 0)
        return err;
    if (id > 0)
        sqlite3_bind_int64(st, 1, id);
    if ((err = run(db, st, "retrying jobs")) < 0)
        return err;
    *n = sqlite3_changes(db);
    return 0;
}

int ck_queue_counts(sqlite3 *db, int out[CK_JOB_NSTATES])
{
    sqlite3_stmt *st;
    int err;
    memset(out, 0, CK_JOB_NSTATES * sizeof *out);
    if ((err = prep(db, "SELECT state, count(*) FROM upload_jobs GROUP BY state", &st)) < 0)
        return err;
    while (sqlite3_step(st) == SQLITE_ROW) {
        int s = sqlite3_column_int(st, 0);
        if (s >= 0 && s < CK_JOB_NSTATES)
            out[s] = sqlite3_column_int(st, 1);
    }
    sqlite3_finalize(st);
    return 0;
}

int ck_queue_each(sqlite3 *db, int (*fn)(const struct ck_job *j, void *ctx), void *ctx)
{
    sqlite3_stmt *st;
    int err;
    if ((err = prep(db, "SELECT " JOB_COLS " ORDER BY j.id", &st)) < 0)
        return err;
    while (sqlite3_step(st) == SQLITE_ROW) {
        struct ck_job j;
        read_job(st, &j);
        int stop = fn(&j, ctx);
        ck_job_release(&j);
        if (stop)
            break;
    }
    sqlite3_finalize(st);
    return 0;
}

int ck_queue_prune(sqlite3 *db, double age)
{
    sqlite3_stmt *st;
    int err;
    if ((err = prep(db, "DELETE FROM upload_jobs WHERE state IN (2, 4) AND updated < ?1", &st)) < 0)
        return err;
    sqlite3_bind_double(st, 1, now_s() - age);
    return run(db, st, "pruning jobs");
}

int ck_queue_reset_source(sqlite3 *db, int64_t id, uint64_t size, int64_t mtime_ns)
{
    sqlite3_stmt *st;
    int err;
    if ((err = ck_queue_set_upload(db, id, "", 0)) < 0)
        return err;
    if ((err = prep(db, "UPDATE upload_jobs SET size=?2, mtime_ns=?3, updated=?4 WHERE id=?1",
                    &st)) < 0)
        return err;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, (int64_t)size);
    sqlite3_bind_int64(st, 3, mtime_ns);
    sqlite3_bind_double(st, 4, now_s());
    return run(db, st, "updating a job's source");
}

int ck_queue_redo(sqlite3 *db, int64_t store_id, const char *key, bool *redone)
{
    static const char *const sql[] = {
        "DELETE FROM upload_parts WHERE job = (SELECT id FROM upload_jobs WHERE store = ?1 AND"
        " key = ?2 AND state = 2 ORDER BY id DESC LIMIT 1)",
        "UPDATE upload_jobs SET state = 0, attempts = 0, next_try = 0, upload_id = '',"
        " part_size = 0 WHERE id = (SELECT id FROM upload_jobs WHERE store = ?1 AND key = ?2"
        " ORDER BY id DESC LIMIT 1) AND state = 2",
    };
    sqlite3_stmt *st;
    int err;
    *redone = false;
    for (size_t i = 0; i < 2; i++) {
        if ((err = prep(db, sql[i], &st)) < 0)
            return err;
        sqlite3_bind_int64(st, 1, store_id);
        bind_text(st, 2, key);
        if ((err = run(db, st, "queueing a job again")) < 0)
            return err;
    }
    *redone = sqlite3_changes(db) > 0;
    return 0;
}

int ck_queue_abandoned(sqlite3 *db, size_t max, struct ck_abandoned **out, size_t *n)
{
    sqlite3_stmt *st;
    int err;
    *out = NULL;
    *n = 0;
    if ((err = prep(db, "SELECT id, store, key, upload_id, attempts FROM upload_abandoned"
                        " ORDER BY id LIMIT ?1", &st)) < 0)
        return err;
    sqlite3_bind_int64(st, 1, (int64_t)max);
    struct ck_abandoned *v = NULL;
    size_t nv = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct ck_abandoned *g = realloc(v, (nv + 1) * sizeof *v);
        if (!g) {
            err = ck_error(CK_ENOMEM, "out of memory");
            break;
        }
        v = g;
        struct ck_abandoned *a = &v[nv];
        a->id = sqlite3_column_int64(st, 0);
        a->store_id = sqlite3_column_int64(st, 1);
        a->key = col_dup(st, 2);
        a->upload_id = col_dup(st, 3);
        a->attempts = sqlite3_column_int(st, 4);
        nv++;
        if (!a->key || !a->upload_id) {
            err = ck_error(CK_ENOMEM, "out of memory");
            break;
        }
    }
    if (err == 0 && rc != SQLITE_DONE)
        err = db_err(db, "reading the abandoned uploads");
    sqlite3_finalize(st);
    if (err < 0) {
        ck_queue_abandoned_release(v, nv);
        return err;
    }
    *out = v;
    *n = nv;
    return 0;
}

int ck_queue_abandoned_settle(sqlite3 *db, int64_t id, bool forget)
{
    sqlite3_stmt *st;
    int err = prep(db, forget ? "DELETE FROM upload_abandoned WHERE id = ?1"
                              : "UPDATE upload_abandoned SET attempts = attempts + 1 WHERE id = ?1",
                   &st);
    if (err < 0)
        return err;
    sqlite3_bind_int64(st, 1, id);
    return run(db, st, "recording an abandoned upload");
}

void ck_queue_abandoned_release(struct ck_abandoned *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i].key);
        free(v[i].upload_id);
    }
    free(v);
}
