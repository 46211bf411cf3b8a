/* Webhook delivery per the Standard Webhooks convention
 * (https://www.standardwebhooks.com/):
 *
 *   webhook-id:        the event id; the same on every retry, so a receiver
 *                      can drop a duplicate
 *   webhook-timestamp: unix seconds of this attempt
 *   webhook-signature: "v1,<base64 HMAC-SHA256(key, id "." timestamp "." body)>",
 *                      one per key, space-separated, during a key rotation
 *
 * Keys are "whsec_" + base64 of 24 to 64 random bytes. A POST over libcurl
 * with connect and total timeouts and a bounded read of the answer. */
#ifndef CK_WEBHOOK_H
#define CK_WEBHOOK_H

#include "common/buf.h"

#include <stddef.h>
#include <stdint.h>

#define CK_WEBHOOK_KEY_MIN 24
#define CK_WEBHOOK_KEY_MAX 64

struct ck_webhook_key {
    unsigned char bytes[CK_WEBHOOK_KEY_MAX];
    size_t len;
};

/* Decodes "whsec_<base64>". CK_ECONFIG (naming only what, never the value)
 * when the prefix, the base64 or the length is wrong. */
int ck_webhook_key_decode(const char *secret, const char *what, struct ck_webhook_key *out);
/* Wipes the key bytes. */
void ck_webhook_key_wipe(struct ck_webhook_key *k);

/* The webhook-signature header value for body: "v1,<sig>" per key, joined
 * with spaces, appended to out. */
int ck_webhook_sign(const struct ck_webhook_key *keys, size_t nkeys, const char *id,
                    int64_t timestamp, const char *body, size_t len, struct ck_buf *out);

/* Checks a receiver URL: http or https, a host, no credentials in it, no
 * spaces or control characters. CK_ECONFIG naming what (not the URL, which
 * may itself be a secret, as chat webhook URLs are). */
int ck_webhook_check_url(const char *url, const char *what);
/* "scheme://host[:port]" of url into out: what logs may show. */
void ck_webhook_redact_url(const char *url, char *out, size_t outsz);

struct ck_webhook_result {
    long status;      /* HTTP status; 0 when none came back */
    int curl_code;    /* CURLcode */
    double seconds;   /* time the attempt took */
    char detail[200]; /* why it failed, printable ASCII: curl's error or the body's start */
};

/* Upper bounds on what a receiver can make us read or wait for. */
#define CK_WEBHOOK_BODY_MAX (1 << 20) /* bytes of an answer read; past it we hang up */
#define CK_WEBHOOK_CONNECT_MAX_S 10.0 /* connect timeout, at most the total timeout */

/* One attempt: POST body to url with the three headers (no signature header
 * when sig is NULL) and content_type, within timeout seconds in total.
 * 0 on a 2xx answer; CK_ENET otherwise, with r filled either way. */
int ck_webhook_post(const char *url, const char *id, int64_t timestamp, const char *sig,
                    const char *content_type, const char *body, size_t len, double timeout,
                    struct ck_webhook_result *r);

#endif
