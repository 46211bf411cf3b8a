/* The HTTP-ish plumbing every store shares: one request over a reused curl
 * easy handle, with retries (exponential backoff, full jitter, Retry-After
 * and S3's SlowDown honoured), a bandwidth cap shared by all transfers of a
 * run, stop/deadline handling and progress counting. */
#ifndef CK_STORE_NET_H
#define CK_STORE_NET_H

#include "common/buf.h"
#include "stores/store.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* One run's shared state. */
struct ck_net {
    const struct ck_upload_opts *opts; /* borrowed */
    struct ck_upload_ctl *ctl;         /* borrowed */
    pthread_mutex_t rate_mu;           /* guards the rate bucket, rand_state and making the share */
    long long rate_t0;                 /* monotonic ms of the last refill */
    double tokens;                     /* bytes that may go now */
    unsigned rand_state;
    /* the connections, DNS answers and TLS sessions every handle of the run
     * shares: a job or part reuses the connection the one before it left
     * (a new TCP and TLS handshake, or SSH login, per file otherwise) */
    CURLSH *share;     /* made by the first ck_net_handle */
    bool share_failed; /* ... which could not make it */
    pthread_mutex_t share_mu[CURL_LOCK_DATA_LAST];
};

int ck_net_init(struct ck_net *n, const struct ck_upload_opts *opts, struct ck_upload_ctl *ctl);
void ck_net_release(struct ck_net *n);
/* Blocks until len more bytes fit under max_rate (no-op without a cap).
 * Returns false when the run's deadline passed meanwhile. */
bool ck_net_throttle(struct ck_net *n, size_t len);

/* A request. The body comes from memory or from a range of a file. */
struct ck_req {
    const char *method;         /* "GET", "HEAD", "PUT", "POST", "MOVE", "DELETE", or NULL for
                                 * a protocol's default (an sftp upload) */
    const char *url;            /* may carry credentials (sftp key) never: see setup */
    struct curl_slist *headers; /* borrowed */
    const void *mem;            /* body from memory ... */
    size_t mem_len;
    int fd; /* ... or from fd at [off, off+len); -1: none */
    uint64_t off, len;
    bool upload;             /* send a body (PUT, sftp upload) */
    atomic_ullong *progress; /* when set, bytes sent are added (and removed on a retry) */
    /* backend setup applied on each attempt after the common options (auth, sigv4, ssh) */
    void (*setup)(CURL *h, void *ctx);
    void *setup_ctx;
    const char *what; /* for messages: "'key' part 3" */
    /* a download: the response body goes here instead of ck_resp.body; called
     * with data NULL when an attempt starts (start over); a negative return
     * fails the attempt. NULL: the body is kept in ck_resp.body */
    int (*sink)(void *ctx, const void *data, size_t n);
    void *sink_ctx;
};

/* What came back. */
struct ck_resp {
    long status;        /* HTTP status, or 0 (sftp: 0 on success) */
    struct ck_buf body; /* first 1 MiB of the response body */
    char etag[80];
    char code[64];      /* S3 error <Code>, when the body is an S3 error */
    double retry_after; /* seconds; 0 when none */
    int64_t length;     /* Content-Length of the response, -1 when none */
    int64_t sha_header; /* unused by most: set when x-amz-checksum-sha256 came back */
    char checksum_sha256[64];
};
void ck_resp_init(struct ck_resp *r);
void ck_resp_release(struct ck_resp *r);

/* Performs r with retries. 2xx is 0. Errors: CK_EAUTH for 401/403 (never
 * retried), CK_EREFUSED for any other answer that is final (a 4xx but 408
 * and 429: never retried), CK_EUNREACH when nobody answered (connection
 * refused, unknown host) after the retries, CK_ENET when the retries ran out
 * otherwise (the message says the status or curl's error, the S3 code and
 * the URL without secrets); a stop past the deadline is CK_ENET too. Each
 * attempt that will be retried is logged at info level (upload.retry). A
 * status in ok_status (0-terminated; NULL: 2xx only) also counts as success. */
int ck_net_request(struct ck_net *n, CURL *h, struct ck_req *r, struct ck_resp *resp,
                   const long *ok_status);

/* The backoff before retry number attempt (0-based): base*2^attempt capped at
 * cap, with jitter (rnd01 in [0,1) picks a point in the upper half), and never
 * less than retry_after. */
double ck_backoff_delay(int attempt, double base, double cap, double retry_after, double rnd01);
/* Parses a Retry-After value (delta seconds or an HTTP date) relative to now
 * (seconds since the epoch); -1 when it is neither. */
double ck_parse_retry_after(const char *v, long long now);
/* Whether a status/S3 code pair is worth retrying. */
bool ck_net_is_retryable(long status, const char *s3code);
/* The text of an XML element <tag>...</tag> in body (first match, entities
 * &amp; &lt; &gt; &quot; &apos; decoded) into out; false when absent. */
bool ck_xml_tag(const char *body, const char *tag, char *out, size_t outsz);

/* A handle on n's shared connections (curl_easy_cleanup it before
 * ck_net_release); reuse it across the requests of one thread. */
CURL *ck_net_handle(struct ck_net *n);

#endif
