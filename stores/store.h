/* Upload backends ("stores"): one const struct ck_store_ops per URL scheme
 * (s3.c, http.c, sftp.c, file.c) and a lookup table (store.c). Callers go
 * through the ck_store_* wrappers, never through ops directly.
 *
 * A store sends one local file to one remote name and checks, after the
 * upload, that the remote object has the size (and, where the protocol lets
 * us see it, the checksum) of what was sent. A multipart upload reports its
 * upload id and every accepted part through callbacks, so the queue can
 * record them and a later attempt resumes with the missing parts only. */
#ifndef CK_STORE_H
#define CK_STORE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

/* Where to send: what one row of `upload.stores` in the config says.
 * Every string is owned (free with ck_store_spec_release). No field holds a
 * secret: credentials are "env:NAME"/"file:/path" references or "env". */
struct ck_store_spec {
    char *url; /* s3://bucket/prefix, http(s)://host/path, sftp://user@host/path, file:///path */
    char *endpoint;    /* s3: http(s)://host[:port] of an S3-compatible service (default: the
                        * AWS CLI's order, awsconfig.h, else AWS) */
    char *region;      /* s3: signing region (default: the AWS CLI's order, else us-east-1) */
    char *profile;     /* s3: the AWS profile (as aws --profile: environment keys are not
                        * used; default AWS_PROFILE, else "default") */
    char *credentials; /* s3: "env" (AWS_* variables only) or "file:/path" (AWS credentials
                        * format, mode 0600); unset: the AWS CLI's chain (awscred.h);
                        * http: reference to "user:password" (basic) or a token
                        * (bearer); sftp: reference to the key's passphrase, if any */
    char *auth;     /* http: "basic" or "bearer" (default: none, or basic when credentials set) */
    char *key_file; /* sftp: private key (ed25519), mode 0600 */
    char *host_key; /* sftp: the server's host key as "SHA256:base64" (ssh-keygen -lf) */
    bool compress;  /* compress: zstd -- checkpoints are sent as NAME.zst */
    bool bundle;    /* bundle: true -- a PMF tree is sent as one NAME.tar.zst */
    bool no_move;   /* http: move: false -- PUT straight to the final name (presigned URLs) */
    /* s3: commit: multipart -- commit objects (metadata.yaml, written last)
     * go as multipart uploads whatever their size, for servers that keep the
     * first bytes of a PUT cut short instead of refusing a body whose signed
     * SHA-256 does not match (s3rver); default: a single PUT */
    bool commit_multipart;
};

/* Tunables shared by every store (upload.* in the config). */
struct ck_upload_opts {
    uint64_t part_size;           /* multipart part size (default 8 MiB, at least 5 MiB) */
    uint64_t multipart_threshold; /* files this size or larger go multipart (default 64 MiB) */
    uint64_t max_rate;            /* bytes per second over all transfers; 0: no cap */
    int concurrency;              /* parallel parts per object (default 8) */
    int transfers;                /* bodies in flight per run (default 4, as rclone --transfers) */
    int retries;                  /* attempts after the first, per request (default 6) */
    double retry_base;            /* first backoff in seconds (default 0.5) */
    double retry_cap;             /* longest backoff (default 60) */
    double grace;                 /* seconds to finish in-flight work after SIGTERM (default 20) */
    double timeout; /* a transfer that moves nothing for this long fails (default 60) */
    /* upload.sha256: always: HTTP and SFTP uploads hash (on a spare core) the
     * files the agent has not hashed already. Default (known): they record
     * the SHA-256 the agent's hash cache holds for the file and compute none,
     * like curl and rclone (these servers cannot check one). S3 parts and
     * path stores always hash what they send. */
    bool sha256_always;
};

void ck_upload_opts_init(struct ck_upload_opts *o);

/* Stop control shared by a run and its transfers. A signal handler may set
 * stop (it is lock free); the first transfer to see it fixes the deadline at
 * now + grace. Past the deadline, in-flight transfers are aborted. */
struct ck_upload_ctl {
    atomic_int stop;       /* set to 1 to stop starting new work */
    atomic_llong deadline; /* CLOCK_MONOTONIC milliseconds; 0: none yet */
    double grace;          /* seconds */
};
void ck_upload_ctl_init(struct ck_upload_ctl *c, double grace);
/* Sets stop and fixes the deadline (now + grace) if none is fixed yet. */
void ck_upload_ctl_stop(struct ck_upload_ctl *c);
/* Fixes an absolute deadline (monotonic ms) for a run that must end by then. */
void ck_upload_ctl_set_deadline(struct ck_upload_ctl *c, long long mono_ms);
bool ck_upload_ctl_stopping(struct ck_upload_ctl *c);
/* Whether in-flight transfers must be aborted now. */
bool ck_upload_ctl_expired(struct ck_upload_ctl *c);

/* One accepted part of a multipart upload. */
struct ck_part {
    int number; /* 1-based */
    uint64_t size;
    char etag[80];       /* as the server returned it, quotes included */
    char sha256_b64[48]; /* base64 of the part's SHA-256 (x-amz-checksum-sha256) */
    char md5[33];        /* hex MD5 of the part */
};

/* One page of an S3 ListParts answer: the <Part> entries whose number,
 * size and ETag parse (and their ChecksumSHA256 when given) are appended to
 * *v (*nv of them, realloc'd, the caller frees; at most 10,000 in all);
 * *next_marker is the next page's part-number-marker, 0 when this was the
 * last. Hostile text: entries that do not parse are skipped. */
int ck_s3_list_parts_parse(const char *body, struct ck_part **v, size_t *nv, int *next_marker);

/* One object to send. The caller (the queue) fills the inputs and the
 * resume state it recorded; the store calls the callbacks as it goes. */
struct ck_xfer {
    /* in */
    int64_t id;              /* queue job id (temporary names use it) */
    const char *path;        /* local file (borrowed) */
    const char *key;         /* remote name under the store's prefix, '/'-separated, not encoded */
    uint64_t size;           /* the file's size when queued */
    int64_t mtime_ns;        /* its mtime when queued (ns; 0: not known) */
    const char *orig_sha256; /* compress: SHA-256 of the uncompressed original, recorded remotely */
    bool atomic;             /* the object must appear whole or not at all even on servers that
                              * keep a truncated PUT (s3: multipart whatever the size) */
    /* create only (docs/multinode.md, "The store's conditional write"): the
     * object is written only if key is free, in one request the server checks
     * (s3: a single PUT with If-None-Match: *, whatever the size); CK_EEXIST
     * when the key is taken. A store whose ops lack if_absent refuses it
     * (CK_ERR, as ck_store_del). A server that ignores the condition overwrites: see
     * the fallback in docs/multinode.md */
    bool if_absent;
    /* the file's SHA-256 when the agent knows it for exactly this file
     * (device, inode, size, mtime: known_st; its registration read it),
     * else "": HTTP and SFTP record it, an S3 single PUT signs and sends it
     * (and known_md5, its Content-MD5) instead of reading the file for them */
    char known_sha256[65];
    char known_md5[33]; /* "" when not known */
    struct stat known_st;
    bool hash_unknown; /* hash the file when known_sha256 does not apply */
    /* resume state (multipart): owned by the caller */
    char upload_id[512];   /* "" when none was created yet */
    uint64_t part_size;    /* the part size of that upload */
    struct ck_part *parts; /* parts accepted so far, any order */
    size_t nparts;
    /* callbacks into the queue; a negative return aborts the transfer */
    int (*save_upload)(void *ctx, const char *upload_id, uint64_t part_size);
    int (*save_part)(void *ctx, const struct ck_part *p);
    void *cb_ctx;
    /* upload.transfers bounds the bodies in flight, not the files: once the
     * body has gone (before MOVE, rename, HEAD, CompleteMultipartUpload,
     * fsync) a store calls body_sent, so the next file's body can start
     * while this one's tail runs (as rclone keeps its checks apart from its
     * transfers); before sending a body again (a PUT to the final name, a
     * multipart upload started over) it calls body_again, which waits for a
     * slot. Through ck_xfer_body_sent/_again; both may be NULL. */
    void (*body_sent)(void *ctx);
    int (*body_again)(void *ctx);
    /* progress: bytes accepted so far (parts and whole objects), read by a progress thread */
    atomic_ullong sent;
    /* out */
    char sha256[65];   /* hex SHA-256 of the whole object sent, when computed */
    /* Which check of what landed the store made, a static name (docs/uploads.md):
     * "sha256" the service's own SHA-256 of the object equals what was sent;
     * "md5" its ETag equals the MD5 of what was sent; "read-back-sha256" the
     * copy was read back and hashed; "size" only the stored size could be
     * compared; "none" nothing could be asked (a presigned PUT URL). */
    const char *check;
    /* if_absent refused (CK_EEXIST): the stored object has the bytes this
     * transfer would have written (its size and checksum or MD5 ETag): a
     * writer of the same bytes got there first, or this transfer's own
     * earlier attempt whose answer was lost */
    bool same_bytes;
    int parts_sent;    /* parts sent by this call (not counting resumed ones) */
    int parts_resumed; /* parts skipped because an earlier run had them accepted */
};

static inline void ck_xfer_body_sent(struct ck_xfer *x)
{
    if (x->body_sent)
        x->body_sent(x->cb_ctx);
}

static inline int ck_xfer_body_again(struct ck_xfer *x)
{
    return x->body_again ? x->body_again(x->cb_ctx) : 0;
}

struct ck_store;
struct ck_net;

/* What a store says about one stored object (ck_store_stat). */
struct ck_remote_obj {
    int64_t size; /* bytes stored */
    char md5[33]; /* the MD5 of the bytes as the store reports it (S3's ETag of a single PUT),
                   * "" when the store reports none: read it back (ck_store_get) to know */
};

/* The objects a listing found (ck_store_list), sorted by key. */
struct ck_remote_entry {
    char *key;    /* owned; relative to the store's prefix, as put names it */
    int64_t size; /* bytes stored */
    char md5[33]; /* the MD5 the store reports (S3: an ETag of that form), or "" */
};
struct ck_remote_list {
    struct ck_remote_entry *v; /* owned */
    size_t n;
};
#define CK_STORE_LIST_MAX 1000000 /* more objects under one prefix is an error */
void ck_remote_list_release(struct ck_remote_list *l);
/* Appends an entry (key copied); CK_ESIZE past CK_STORE_LIST_MAX. */
int ck_remote_list_add(struct ck_remote_list *l, const char *key, int64_t size, const char *md5);

/* One page of an S3 ListObjectsV2 answer: each <Contents> whose Key starts
 * with strip (the store's prefix and its '/') and whose Size parses is
 * appended to l with the key after strip; *truncated and next (the
 * NextContinuationToken, "" when none) say whether a page follows. Hostile
 * text: entries that do not parse are skipped; a truncated answer without a
 * token is CK_EFORMAT. */
int ck_s3_list_objects_parse(const char *body, const char *strip, struct ck_remote_list *l,
                             bool *truncated, char *next, size_t nextsz);

struct ck_store_ops {
    const char *scheme; /* "s3", "http", "https", "sftp", "file" */
    bool uses_curl;     /* ck_store_open loads libcurl first (lazy/) */
    bool if_absent;     /* put honours ck_xfer.if_absent */
    /* Checks spec (URL, references) without network or secrets: for config load. */
    int (*check)(const struct ck_store_spec *spec);
    int (*open)(struct ck_store **out, const struct ck_store_spec *spec, struct ck_net *net);
    int (*put)(struct ck_store *s, struct ck_xfer *x);
    /* The stored object key (as put names it): CK_ENOENT when the store does not have it. */
    int (*stat)(struct ck_store *s, const char *key, struct ck_remote_obj *out);
    /* The stored object's bytes, written to fd from its current offset (a
     * retried request starts over: fd is truncated back to that offset). */
    int (*get)(struct ck_store *s, const char *key, int fd);
    /* Removes the stored object key (remote retention); gone already is
     * fine. NULL: the store cannot delete (refused at config check). */
    int (*del)(struct ck_store *s, const char *key);
    /* Gives up the multipart upload upload_id of key (its parts are freed);
     * gone already is fine. NULL: the store makes no multipart uploads. */
    int (*abort_upload)(struct ck_store *s, const char *key, const char *upload_id);
    /* Every object whose key is under the folder prefix ("" for all; a
     * trailing '/' is implied), in any order (multi-node: docs/multinode.md). NULL:
     * the store cannot list (CK_ERR from ck_store_list, as ck_store_del). */
    int (*list)(struct ck_store *s, const char *prefix, struct ck_remote_list *out);
    void (*free)(struct ck_store *s);
};

/* The fields every store begins with. */
struct ck_store {
    const struct ck_store_ops *ops;
    const struct ck_store_spec *spec; /* borrowed: must outlive the store */
    struct ck_net *net;               /* borrowed */
};

/* The ops for url's scheme, or NULL. */
const struct ck_store_ops *ck_store_ops_find(const char *url);
/* Checks a spec at config load: scheme known, URL well formed, references
 * well formed. CK_ECONFIG with a message naming the URL. */
int ck_store_check(const struct ck_store_spec *spec);
int ck_store_open(struct ck_store **out, const struct ck_store_spec *spec, struct ck_net *net);
int ck_store_put(struct ck_store *s, struct ck_xfer *x);
/* Retention's checks (agent/retention.c) and `ckptd fetch`: what the store
 * holds under key, and its bytes. CK_ENOENT: not there. */
int ck_store_stat(struct ck_store *s, const char *key, struct ck_remote_obj *out);
int ck_store_get(struct ck_store *s, const char *key, int fd);
/* The objects under the folder prefix, sorted by key; out is the caller's to
 * release (ck_remote_list_release), empty on an error. */
int ck_store_list(struct ck_store *s, const char *prefix, struct ck_remote_list *out);
/* Remote retention (retention.store): removes key; not there is fine. */
int ck_store_del(struct ck_store *s, const char *key);
/* ops->abort_upload; 0 for a store that makes no multipart uploads. */
int ck_store_abort_upload(struct ck_store *s, const char *key, const char *upload_id);
/* Whether the store of url can delete objects. */
bool ck_store_can_delete(const char *url);
/* A ck_req sink (stores/net.h) that writes to the fd in ctx (an int *),
 * starting over at the offset the fd had when the first attempt began. */
struct ck_fd_sink {
    int fd;
    int64_t start; /* -1 until the first attempt */
};
int ck_fd_sink_write(void *ctx, const void *data, size_t n);
void ck_store_free(struct ck_store *s);

/* Sets one field from its config key (url, endpoint, region, profile, credentials,
 * auth, key, host_key, compress: zstd|none, bundle: bool, move: bool, commit:
 * put|multipart).
 * CK_ENOENT for an unknown key, CK_ECONFIG for a bad value. */
int ck_store_spec_set(struct ck_store_spec *s, const char *key, const char *value);
int ck_store_spec_copy(struct ck_store_spec *dst, const struct ck_store_spec *src);
void ck_store_spec_release(struct ck_store_spec *s);
/* The URL without user info or query (for logs and errors), into out. */
void ck_store_url_redact(char *out, size_t outsz, const char *url);

/* Percent-encodes a key per RFC 3986: unreserved bytes stay, '/' stays when
 * keep_slash, every other byte becomes %XX (upper case). CK_ESIZE when it does
 * not fit in outsz. */
int ck_store_encode(char *out, size_t outsz, const char *s, bool keep_slash);
/* Joins a prefix and a key with exactly one '/' between (either may be empty). */
int ck_store_join_key(char *out, size_t outsz, const char *prefix, const char *key);

#endif
