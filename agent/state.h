/* The agent's durable state: one SQLite database, DIR/.ckptd/state.db, in
 * WAL mode. The agent owns the connection; other modules (the upload queue,
 * the webhook outbox) get the sqlite3 handle and create their own tables.
 * What lives here: the model id, the hash cache, what each registered
 * checkpoint is made of (sha256, size, source). */
#ifndef CK_STATE_H
#define CK_STATE_H

#include <sqlite3.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

enum { CK_STATE_NSTMT = 9 };

struct ck_state {
    sqlite3 *db;
    char *dir;                          /* owned: DIR/.ckptd */
    sqlite3_stmt *stmt[CK_STATE_NSTMT]; /* prepared once, reused: a scan makes 10,000s of lookups */
};

/* Opens (creating) DIR/.ckptd/state.db. */
int ck_state_open(struct ck_state *s, const char *model_dir);
void ck_state_close(struct ck_state *s);

/* SQLite must not be carried across fork(): its unix VFS keeps per-process
 * lock bookkeeping that a child would inherit and trust, and a connection the
 * child opens would share it (seen: a child waiting forever for a WAL read
 * lock). A process that forks a child which uses the database
 * (agent/sender.c) closes its connection first and opens it again after. */
int ck_state_close_db(struct ck_state *s);
/* DIR/.ckptd/state.db: for a helper's own connection (ck_state_open_db). */
int ck_state_db_path(const struct ck_state *s, char *out, size_t outsz);
int ck_state_reopen_db(struct ck_state *s);
/* Opens a database file at path with the agent's settings (WAL, busy
 * timeout, foreign keys). For tools that keep a state outside a model dir. */
int ck_state_open_db(const char *path, sqlite3 **out);
/* The state folder of `ckptd upload` (state_dir, or NULL: the default of
 * ck_uploader_default_state), created 0700, into dir; its state.db opened. */
int ck_state_open_upload_dir(const char *state_dir, char *dir, size_t dirsz, sqlite3 **out);

int ck_state_begin(struct ck_state *s);
int ck_state_commit(struct ck_state *s);
void ck_state_rollback(struct ck_state *s);

/* meta: small key/value facts (model_id, ...). *out owned by the caller, NULL when absent. */
int ck_state_get(struct ck_state *s, const char *key, char **out);
int ck_state_set(struct ck_state *s, const char *key, const char *value);

/* The hash cache, keyed by device and inode, valid while size and mtime are
 * unchanged. A hit fills md5/sha256 (sha256 may be "" when never computed). */
struct ck_hash_entry {
    char md5[33];
    char sha256[65];
};
bool ck_state_hash_lookup(struct ck_state *s, const struct stat *st, struct ck_hash_entry *out);
int ck_state_hash_store(struct ck_state *s, const struct stat *st, const char *md5,
                        const char *sha256);
/* md5 and sha256 of the file at path through the cache (hashing it on a
 * miss); size (may be NULL) gets its size. CK_ECHANGED when it vanished. */
int ck_state_hash_file(struct ck_state *s, const char *path, struct ck_hash_entry *out,
                       uint64_t *size);

/* What a registered checkpoint is made of. */
struct ck_ckpt_record {
    char ref[1024];       /* the reference as text */
    char source[4096];    /* where the training job wrote it, relative to DIR */
    char tree_path[4096]; /* its PMF path (the file the md5 is of) */
    char sha256[65];      /* of the tree_path file */
    uint64_t size;        /* bytes of all its files */
    int nfiles;
    uint64_t fingerprint; /* of its files as last hashed (agent/discover.h); 0: none */
};
int ck_state_ckpt_put(struct ck_state *s, const struct ck_ckpt_record *r);
int ck_state_ckpt_get(struct ck_state *s, const char *ref, struct ck_ckpt_record *out);
int ck_state_ckpt_delete(struct ck_state *s, const char *ref);

/* What ckptd's section of build_parameters.yaml says of each registered
 * checkpoint, read in one statement: a file of 10,000 checkpoints written
 * from 10,000 lookups spent a sixth of a new checkpoint's CPU in them. */
struct ck_ckpt_brief {
    const char *ref;    /* in ck_ckpt_briefs.text, as in ck_ckpt_record */
    const char *source; /* in ck_ckpt_briefs.text */
    char sha256[65];
    uint64_t size;
    int nfiles;
};
struct ck_ckpt_briefs {
    struct ck_ckpt_brief *v; /* sorted by ref (strcmp order) */
    size_t n;
    char *text; /* every ref and source, one allocation: 20,000 small ones
                 * freed each pass left the idle watcher's heap in pieces */
};
int ck_state_ckpt_briefs(struct ck_state *s, struct ck_ckpt_briefs *out);
const struct ck_ckpt_brief *ck_ckpt_briefs_find(const struct ck_ckpt_briefs *b, const char *ref);
void ck_ckpt_briefs_release(struct ck_ckpt_briefs *b);
/* Records that a registered checkpoint's files, with this fingerprint, are
 * still the ones registered. */
int ck_state_ckpt_set_fingerprint(struct ck_state *s, const char *ref, uint64_t fingerprint);

/* A checkpoint retention deletes or deleted locally (agent/retention.h):
 * recorded with deleted false before its first byte goes, true once all are
 * gone. What metadata.yaml said of it is kept, so the stores' metadata.yaml
 * keeps listing it and `ckptd fetch` can bring it back. */
struct ck_retained {
    char *ref;        /* owned */
    int ref_is_int;   /* the reference is a YAML int in metadata.yaml */
    bool deleted;     /* false: deleting (a pass was interrupted: the next one finishes) */
    int pruned;       /* remote retention, once deleted: 1 pruning (the stores' metadata.yaml
                       * drops it, then its objects go), 2 pruned (gone from the stores too) */
    int64_t epoch;
    char *path;       /* owned: its PMF path (data/checkpoints/...) */
    char md5[33];     /* of the PMF path's file */
    char *source;     /* owned: where the trainer wrote it, relative to DIR */
    int kind;         /* enum ck_cand_kind (agent/discover.h) */
    char *files;      /* owned: its files in the tree (relative to DIR), one per line */
    char *stores;     /* owned: the stores holding verified copies (URLs without secrets),
                       * one per line; "" with retention.without_store */
    int64_t seq;      /* its place in metadata.yaml's order (registration) */
};
void ck_retained_release(struct ck_retained *r);
int ck_state_retained_put(struct ck_state *s, const struct ck_retained *r);
int ck_state_retained_delete(struct ck_state *s, const char *ref);
/* Every record, in registration order (a malloc'ed array; free with
 * ck_retained_list_free). CK_ENOENT (no message) for a database without
 * the table (an upload-only queue folder). */
int ck_state_retained_list(sqlite3 *db, struct ck_retained **out, size_t *n);
void ck_retained_list_free(struct ck_retained *v, size_t n);
/* Whether retention is deleting ref (an interrupted pass recorded it and its
 * deletion could not be finished yet): scan does not register what is left. */
bool ck_state_retained_deleting(struct ck_state *s, const char *ref);

#endif
