#include "hooks/webhook.h"
#include "common/clock.h"
#include "common/error.h"
#include "lazy/lazy.h"

#include <ctype.h>
#include <curl/curl.h>
#include <nettle/base64.h>
#include <nettle/hmac.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int ck_webhook_key_decode(const char *secret, const char *what, struct ck_webhook_key *out)
{
    static const char prefix[] = "whsec_";
    unsigned char tmp[3 * (CK_WEBHOOK_KEY_MAX * 4 / 3 + 8) / 4 + 4];
    memset(out, 0, sizeof *out);
    if (strncmp(secret, prefix, sizeof prefix - 1) != 0)
        return ck_error(CK_ECONFIG, "%s: a webhook secret must start with 'whsec_'", what);
    const char *b64 = secret + sizeof prefix - 1;
    size_t n = strlen(b64);
    if (n == 0 || n % 4 != 0 || n > (CK_WEBHOOK_KEY_MAX + 2) / 3 * 4)
        return ck_error(CK_ECONFIG,
                        "%s: a webhook secret must be 'whsec_' + base64 of %d to %d bytes", what,
                        CK_WEBHOOK_KEY_MIN, CK_WEBHOOK_KEY_MAX);
    for (size_t i = 0; i < n; i++) {
        char c = b64[i];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  c == '+' || c == '/' || (c == '=' && i >= n - 2);
        if (!ok || (c != '=' && i > 0 && b64[i - 1] == '='))
            return ck_error(CK_ECONFIG, "%s: a webhook secret is not valid base64 after 'whsec_'",
                            what);
    }
    struct base64_decode_ctx dc;
    size_t got = sizeof tmp;
    base64_decode_init(&dc);
    if (!base64_decode_update(&dc, &got, tmp, n, b64) || !base64_decode_final(&dc)) {
        explicit_bzero(tmp, sizeof tmp);
        return ck_error(CK_ECONFIG, "%s: a webhook secret is not valid base64 after 'whsec_'",
                        what);
    }
    int len = (int)got;
    if (len < CK_WEBHOOK_KEY_MIN || len > CK_WEBHOOK_KEY_MAX) {
        explicit_bzero(tmp, sizeof tmp);
        return ck_error(CK_ECONFIG, "%s: a webhook secret must hold %d to %d bytes, not %d", what,
                        CK_WEBHOOK_KEY_MIN, CK_WEBHOOK_KEY_MAX, len);
    }
    memcpy(out->bytes, tmp, (size_t)len);
    out->len = (size_t)len;
    explicit_bzero(tmp, sizeof tmp);
    return 0;
}

void ck_webhook_key_wipe(struct ck_webhook_key *k)
{
    explicit_bzero(k, sizeof *k);
}

int ck_webhook_sign(const struct ck_webhook_key *keys, size_t nkeys, const char *id,
                    int64_t timestamp, const char *body, size_t len, struct ck_buf *out)
{
    char prefix[128];
    int pn = snprintf(prefix, sizeof prefix, "%s.%lld.", id, (long long)timestamp);
    if (pn < 0 || (size_t)pn >= sizeof prefix)
        return ck_error(CK_ESIZE, "webhook id '%s' too long", id);
    for (size_t i = 0; i < nkeys; i++) {
        uint8_t mac[SHA256_DIGEST_SIZE];
        char b64[BASE64_ENCODE_RAW_LENGTH(SHA256_DIGEST_SIZE) + 1];
        struct hmac_sha256_ctx ctx;
        hmac_sha256_set_key(&ctx, keys[i].len, keys[i].bytes);
        hmac_sha256_update(&ctx, (size_t)pn, (const uint8_t *)prefix);
        hmac_sha256_update(&ctx, len, (const uint8_t *)body);
        hmac_sha256_digest(&ctx, sizeof mac, mac);
        explicit_bzero(&ctx, sizeof ctx); /* it holds the key's pads */
        base64_encode_raw(b64, sizeof mac, mac);
        b64[sizeof b64 - 1] = '\0';
        explicit_bzero(mac, sizeof mac);
        int err = ck_buf_printf(out, "%sv1,%s", i ? " " : "", (const char *)b64);
        if (err < 0)
            return err;
    }
    return 0;
}

/* The parts of an http(s) URL that the config check and the logs need.
 * Deliberately small and strict (what it accepts, libcurl accepts too): the
 * check runs in the watcher, which must not load libcurl just for this (it
 * brings 40 libraries and 5 MiB; the sending is done by a helper process). */
struct url_parts {
    char scheme[8]; /* lower case */
    const char *host, *port;
    size_t hostlen, portlen;
    bool userinfo;
};

static bool host_char(unsigned char c)
{
    return isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == '%' || c >= 0x80;
}

/* False when it is not scheme://authority[/...]. */
static bool split_url(const char *url, struct url_parts *p)
{
    memset(p, 0, sizeof *p);
    const char *sep = strstr(url, "://");
    size_t n = sep ? (size_t)(sep - url) : 0;
    if (n == 0 || n >= sizeof p->scheme)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (!isalpha((unsigned char)url[i]))
            return false;
        p->scheme[i] = (char)tolower((unsigned char)url[i]);
    }
    const char *a = sep + 3, *end = a + strcspn(a, "/?#");
    for (const char *q = a; q < end; q++)
        if (*q == '@') {
            p->userinfo = true;
            a = q + 1;
        }
    const char *h = a;
    if (h < end && *h == '[') { /* an IPv6 literal */
        const char *close = memchr(h, ']', (size_t)(end - h));
        if (!close)
            return false;
        for (const char *q = h + 1; q < close; q++)
            if (!isxdigit((unsigned char)*q) && *q != ':' && *q != '.')
                return false;
        p->host = h;
        p->hostlen = (size_t)(close + 1 - h);
        h = close + 1;
    } else {
        p->host = h;
        while (h < end && *h != ':') {
            if (!host_char((unsigned char)*h))
                return false;
            h++;
        }
        p->hostlen = (size_t)(h - p->host);
    }
    if (h < end) {
        if (*h != ':' || h + 1 == end || end - (h + 1) > 5)
            return false;
        p->port = h + 1;
        p->portlen = (size_t)(end - p->port);
        long port = 0;
        for (const char *q = p->port; q < end; q++) {
            if (!isdigit((unsigned char)*q))
                return false;
            port = port * 10 + (*q - '0');
        }
        if (port < 1 || port > 65535)
            return false;
    }
    return true;
}

int ck_webhook_check_url(const char *url, const char *what)
{
    struct url_parts p;
    for (const char *c = url; *c; c++)
        if ((unsigned char)*c <= ' ' || *c == 0x7f)
            return ck_error(CK_ECONFIG, "%s: the URL contains a space or a control character",
                            what);
    if (!split_url(url, &p))
        return ck_error(CK_ECONFIG, "%s: not a valid URL (like https://host/path)", what);
    if (strcmp(p.scheme, "http") != 0 && strcmp(p.scheme, "https") != 0)
        return ck_error(CK_ECONFIG, "%s: the URL must start with http:// or https://", what);
    if (p.userinfo)
        return ck_error(CK_ECONFIG,
                        "%s: the URL must not carry credentials (user:password@); "
                        "give the whole URL as a secret (env:NAME or file:/path) instead",
                        what);
    if (p.hostlen == 0)
        return ck_error(CK_ECONFIG, "%s: the URL has no host", what);
    return 0;
}

void ck_webhook_redact_url(const char *url, char *out, size_t outsz)
{
    struct url_parts p;
    if (split_url(url, &p) && p.hostlen)
        snprintf(out, outsz, "%s://%.*s%s%.*s", p.scheme, (int)p.hostlen, p.host, p.port ? ":" : "",
                 (int)p.portlen, p.port ? p.port : "");
    else
        snprintf(out, outsz, "(invalid url)");
}

/* The answer: its first bytes kept for the log, the rest counted and dropped,
 * and the transfer stopped past CK_WEBHOOK_BODY_MAX. */
struct sink {
    char head[160];
    size_t head_len;
    size_t total;
};

static size_t on_body(char *data, size_t size, size_t nmemb, void *p)
{
    struct sink *s = p;
    size_t n = size * nmemb;
    if (s->total + n > CK_WEBHOOK_BODY_MAX)
        return 0; /* CURLE_WRITE_ERROR: the status we already have still counts */
    size_t room = sizeof s->head - 1 - s->head_len;
    size_t take = n < room ? n : room;
    memcpy(s->head + s->head_len, data, take);
    s->head_len += take;
    s->total += n;
    return n;
}

static void printable(char *out, size_t outsz, const char *s, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 1 < outsz; i++)
        out[o++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : ' ';
    out[o] = '\0';
}

int ck_webhook_post(const char *url, const char *id, int64_t timestamp, const char *sig,
                    const char *content_type, const char *body, size_t len, double timeout,
                    struct ck_webhook_result *r)
{
    char h[512];
    struct curl_slist *hdrs = NULL, *t;
    struct sink sink = {{0}, 0, 0};
    char errbuf[CURL_ERROR_SIZE] = "";
    memset(r, 0, sizeof *r);
    int loaded = ck_lazy_load(CK_LIB_CURL);
    if (loaded < 0)
        return loaded;
    CURL *c = curl_easy_init();
    if (!c)
        return ck_error(CK_ENOMEM, "cannot create a curl handle");
#define ADD(...)                                                                                   \
    do {                                                                                           \
        snprintf(h, sizeof h, __VA_ARGS__);                                                        \
        if (!(t = curl_slist_append(hdrs, h)))                                                     \
            goto nomem;                                                                            \
        hdrs = t;                                                                                  \
    } while (0)
    ADD("Content-Type: %s", content_type);
    ADD("webhook-id: %s", id);
    ADD("webhook-timestamp: %lld", (long long)timestamp);
    ADD("User-Agent: ckptd/%s", CKPTD_VERSION);
    ADD("Expect:"); /* no 100-continue round trip */
    if (sig) {
        /* may be long with several keys: build it outside the fixed buffer */
        struct ck_buf b = CK_BUF_INIT;
        if (ck_buf_printf(&b, "webhook-signature: %s", sig) < 0 ||
            !(t = curl_slist_append(hdrs, ck_buf_str(&b)))) {
            ck_buf_release(&b);
            goto nomem;
        }
        hdrs = t;
        ck_buf_release(&b);
    }
#undef ADD
    long total_ms = (long)(timeout * 1000);
    if (total_ms < 1)
        total_ms = 1;
    long connect_ms = (long)(CK_WEBHOOK_CONNECT_MAX_S * 1000);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, total_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, connect_ms < total_ms ? connect_ms : total_ms);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    double t0 = ck_mono_s();
    CURLcode rc = curl_easy_perform(c);
    r->seconds = ck_mono_s() - t0;
    r->curl_code = (int)rc;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(c);
    bool got_2xx = r->status >= 200 && r->status < 300;
    /* a 2xx whose body we cut short is still a delivery */
    if (got_2xx && (rc == CURLE_OK || rc == CURLE_WRITE_ERROR))
        return 0;
    if (rc != CURLE_OK && rc != CURLE_WRITE_ERROR)
        printable(r->detail, sizeof r->detail, *errbuf ? errbuf : curl_easy_strerror(rc),
                  strlen(*errbuf ? errbuf : curl_easy_strerror(rc)));
    else if (rc == CURLE_WRITE_ERROR)
        snprintf(r->detail, sizeof r->detail, "answer larger than %d bytes", CK_WEBHOOK_BODY_MAX);
    else
        printable(r->detail, sizeof r->detail, sink.head, sink.head_len);
    return CK_ENET;
nomem:
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(c);
    return ck_error(CK_ENOMEM, "out of memory");
}
