/* The durable upload queue, in the agent's SQLite database (the caller
 * opens it, in WAL mode: agent/state.h). The connection is used by one
 * thread at a time (callers serialise the part callbacks). Every upload is a row in
 * upload_jobs; a multipart upload's id and each accepted part are recorded
 * (upload_parts) as they happen, so a run after a crash sends only the
 * missing parts. Each change is one transaction (queueing a tree: one
 * batch).
 *
 * States: pending -> running -> done | failed; running rows left by a dead
 * process go back to pending (ck_queue_recover); failed rows go back to
 * pending with ck_queue_retry. A job of phase 1 (metadata.yaml) is not
 * started while any phase-0 job of the same store is not done (pending,
 * running or failed): a remote reader never sees metadata naming a missing
 * object. */
#ifndef CK_STORE_QUEUE_H
#define CK_STORE_QUEUE_H

#include "stores/store.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <stdbool.h>
#include <stdint.h>

#define CK_QUEUE_SCHEMA 5 /* 2: upload_stores.profile, 3: upload_jobs.checked,
                            * 4: upload_stores.commit_multipart,
                            * 5: upload_jobs.checkpoint */

/* GONE: the source was removed from the disk before it was sent (a trainer's
 * rotation, mirror_deletes): nothing to send, not a failure, and it does not
 * hold metadata.yaml back (the metadata sent is the one that lists what is there). */
enum ck_job_state { CK_JOB_PENDING, CK_JOB_RUNNING, CK_JOB_DONE, CK_JOB_FAILED, CK_JOB_GONE };
#define CK_JOB_NSTATES 5
/* BUNDLE packs the folder src; BUNDLE_PMF only its PMF tree (data/, the configuration,
 * metadata.yaml), for a training folder that holds other files too. */
enum ck_job_kind { CK_JOB_FILE = 0, CK_JOB_ZSTD = 1, CK_JOB_BUNDLE = 2, CK_JOB_BUNDLE_PMF = 3 };

struct ck_job {
    int64_t id;
    int64_t store_id;
    char *store_url; /* owned */
    char *src;       /* owned: the local file (or the PMF root for a bundle) */
    char *key;       /* owned: the remote name under the store's prefix */
    char *spool;     /* owned: compressed/bundled temporary to send, or NULL */
    int phase;       /* 0 data, 1 metadata (last) */
    enum ck_job_kind kind;
    enum ck_job_state state;
    uint64_t size; /* of src when queued (of spool once made) */
    int64_t mtime_ns;
    char upload_id[512];
    uint64_t part_size;
    int attempts;
    char sha256[65];         /* of what was sent, once done */
    char orig_sha256[65];    /* zstd: of the original */
    char checked[24];        /* once done: which check the store made (ck_xfer.check) */
    char *error;             /* owned: the last error, or NULL */
    char *checkpoint;        /* owned: the checkpoint (its reference) the file is part of, or NULL */
    double created, updated; /* seconds since the epoch */
};
void ck_job_release(struct ck_job *j);
const char *ck_job_state_name(enum ck_job_state s);

/* Creates the tables (idempotent); CK_ESTATE when the database has a newer schema. */
int ck_queue_init(sqlite3 *db);
/* Records (or updates) a store's spec by URL; *id is its row. */
int ck_queue_store_put(sqlite3 *db, const struct ck_store_spec *spec, int64_t *id);
/* Loads a store's spec (owned by the caller: ck_store_spec_release). */
int ck_queue_store_get(sqlite3 *db, int64_t id, struct ck_store_spec *out);

/* Queues src for store as key. An identical job (same store, key, size and
 * mtime, or same SHA-256 after a rewrite) that is pending, running or done is
 * not queued again (*added false); a failed one goes back to pending with its
 * accepted parts; a pending or failed job for the same key with another file
 * is replaced (its multipart state dropped). */
int ck_queue_add(sqlite3 *db, int64_t store_id, const char *src, const char *key, int phase,
                 enum ck_job_kind kind, int64_t *id, bool *added);
/* The same with src's size and mtime as the caller saw them earlier (known):
 * a metadata.yaml is recorded as it was before its data was listed, so that a
 * newer one, naming data this listing missed, is seen as changed when sent. */
int ck_queue_add_as(sqlite3 *db, int64_t store_id, const char *src, const char *key, int phase,
                    enum ck_job_kind kind, const struct stat *known, int64_t *id, bool *added);
/* A batch: the ck_queue_add calls between begin and end are one transaction
 * (one fsync for a whole tree instead of one per file; each add is a
 * savepoint inside it). end commits when err is 0, else rolls the batch back
 * and returns err. */
int ck_queue_batch_begin(sqlite3 *db);
int ck_queue_batch_end(sqlite3 *db, int err);
/* The SHA-256 and MD5 the agent's hash cache (agent/state.c's hash_cache
 * table, in the same database) holds for exactly the file st describes
 * (device, inode, size, mtime), into sha256 and md5 (md5 "" when the row has
 * none); false, both "", when there is none or no such table (a queue folder
 * of `ckptd upload` alone). */
bool ck_queue_known_digests(sqlite3 *db, const struct stat *st, char sha256[65], char md5[33]);
/* Claims the next runnable job (pending, not blocked by the metadata-last
 * rule, next_try reached) and marks it running. CK_ENOENT when none. */
int ck_queue_claim(sqlite3 *db, struct ck_job *job);
/* The same, leaving the jobs of the nskip stores in skip (queue store ids)
 * alone: stores a run gave up (stores/uploader.c). */
int ck_queue_claim_except(sqlite3 *db, const int64_t *skip, size_t nskip, struct ck_job *job);
/* ids as a JSON array ("[1,2]") for SQLite's json_each: as many as fit in
 * outsz (CK_QUEUE_IDS_JSON_MAX holds 32). */
#define CK_QUEUE_IDS_JSON_MAX 1024
void ck_queue_ids_json(char *out, size_t outsz, const int64_t *ids, size_t n);
int ck_queue_get(sqlite3 *db, int64_t id, struct ck_job *job);
/* Multipart bookkeeping. Setting another upload id drops the recorded parts. */
int ck_queue_set_upload(sqlite3 *db, int64_t id, const char *upload_id, uint64_t part_size);
int ck_queue_add_part(sqlite3 *db, int64_t id, const struct ck_part *p);
/* The accepted parts (malloc'ed array, the caller frees). */
int ck_queue_parts(sqlite3 *db, int64_t id, struct ck_part **parts, size_t *n);
int ck_queue_set_spool(sqlite3 *db, int64_t id, const char *spool, uint64_t size,
                       const char *orig_sha256);
/* The source changed since it was queued: new size and mtime, multipart state dropped. */
int ck_queue_reset_source(sqlite3 *db, int64_t id, uint64_t size, int64_t mtime_ns);
/* Ends a running job. */
int ck_queue_done(sqlite3 *db, int64_t id, const char *sha256, const char *checked);
/* permanent: failed now; else pending again after delay seconds unless
 * attempts reached max_attempts (then failed). */
int ck_queue_fail(sqlite3 *db, int64_t id, const char *msg, bool permanent, double delay,
                  int max_attempts);
/* Back to pending without counting an attempt (a stop). */
int ck_queue_requeue(sqlite3 *db, int64_t id, const char *msg);
/* Records which checkpoint (its reference in metadata.yaml) job id's file
 * belongs to, for the log and the events (NULL or "": none). */
int ck_queue_set_checkpoint(sqlite3 *db, int64_t id, const char *ref);
/* The job's source is gone from the disk: state gone, msg kept as its error. */
int ck_queue_gone(sqlite3 *db, int64_t id, const char *msg);
/* running -> pending for every job (at the start of a run that holds the lock). */
int ck_queue_recover(sqlite3 *db);
/* failed -> pending: one job (id > 0) or all (id == 0); *n the count. */
int ck_queue_retry(sqlite3 *db, int64_t id, int *n);
/* The newest job of store_id for key, when done, goes back to pending (its
 * multipart state dropped): the store lost what it had accepted. *redone says
 * whether there was such a job. */
int ck_queue_redo(sqlite3 *db, int64_t store_id, const char *key, bool *redone);
/* Counts per state: out[CK_JOB_PENDING..CK_JOB_GONE]. */
int ck_queue_counts(sqlite3 *db, int out[CK_JOB_NSTATES]);
/* Calls fn for every job (newest last); fn returning non-zero stops. */
int ck_queue_each(sqlite3 *db, int (*fn)(const struct ck_job *j, void *ctx), void *ctx);
/* Removes done jobs older than age seconds (and their parts). */
int ck_queue_prune(sqlite3 *db, double age);

/* A multipart upload begun and given up before it completed (the queue's
 * triggers record one whenever a job that is not done drops or loses its
 * upload id): to abort in the store, then forget. */
struct ck_abandoned {
    int64_t id, store_id;
    char *key;       /* owned: the job's key (the store adds its prefix) */
    char *upload_id; /* owned */
    int attempts;    /* aborts tried and failed */
};
/* The oldest max of them; *out is the caller's (ck_queue_abandoned_release). */
int ck_queue_abandoned(sqlite3 *db, size_t max, struct ck_abandoned **out, size_t *n);
/* forget: aborted (or given up): removed; else one more failed attempt counted. */
int ck_queue_abandoned_settle(sqlite3 *db, int64_t id, bool forget);
void ck_queue_abandoned_release(struct ck_abandoned *v, size_t n);

#endif
