#include "stores/net.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RESP_MAX (1u << 20)
#define CHUNK_CAPPED (64u << 10) /* read size while a bandwidth cap is on */
#define UNREACHABLE_CAP 2.0      /* seconds: the longest wait to retry where nobody answered */

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *ud)
{
    struct ck_net *n = ud;
    (void)h, (void)access;
    pthread_mutex_lock(&n->share_mu[(unsigned)data < CURL_LOCK_DATA_LAST ? data : 0]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *ud)
{
    struct ck_net *n = ud;
    (void)h;
    pthread_mutex_unlock(&n->share_mu[(unsigned)data < CURL_LOCK_DATA_LAST ? data : 0]);
}

int ck_net_init(struct ck_net *n, const struct ck_upload_opts *opts, struct ck_upload_ctl *ctl)
{
    memset(n, 0, sizeof *n);
    n->opts = opts;
    n->ctl = ctl;
    n->rand_state = (unsigned)(ck_mono_ms() ^ (long long)getpid() << 16);
    if (pthread_mutex_init(&n->rate_mu, NULL) != 0)
        return ck_error(CK_ERR, "cannot create a mutex");
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&n->share_mu[i], NULL);
    return 0;
}

void ck_net_release(struct ck_net *n)
{
    if (n->share)
        curl_share_cleanup(n->share);
    n->share = NULL;
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&n->share_mu[i]);
    pthread_mutex_destroy(&n->rate_mu);
}

/* The share is made by the first handle, not by ck_net_init: a run with
 * only path stores never loads libcurl (lazy/), and a curl store's open has
 * loaded it by then. Without one (out of memory) handles work unshared. */
static CURLSH *share_get(struct ck_net *n)
{
    pthread_mutex_lock(&n->rate_mu);
    if (!n->share && !n->share_failed) {
        CURLSH *sh = curl_share_init();
        if (!sh || curl_share_setopt(sh, CURLSHOPT_LOCKFUNC, share_lock) != CURLSHE_OK ||
            curl_share_setopt(sh, CURLSHOPT_UNLOCKFUNC, share_unlock) != CURLSHE_OK ||
            curl_share_setopt(sh, CURLSHOPT_USERDATA, n) != CURLSHE_OK ||
            curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) != CURLSHE_OK ||
            curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) != CURLSHE_OK ||
            curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION) != CURLSHE_OK) {
            if (sh)
                curl_share_cleanup(sh);
            n->share_failed = true;
            ck_warn("upload.no_shared_connections",
                    "libcurl's shared connection cache could not be made: each transfer opens "
                    "its own connections");
        } else {
            n->share = sh;
        }
    }
    pthread_mutex_unlock(&n->rate_mu);
    return n->share;
}

static void sleep_ms(long long ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A token bucket shared by every transfer: tokens accrue at max_rate up to
 * a burst of a tenth of a second (at least one chunk), so an idle spell
 * never banks more than that. */
bool ck_net_throttle(struct ck_net *n, size_t len)
{
    double rate = (double)n->opts->max_rate;
    if (rate <= 0)
        return true;
    double burst = rate / 10 > CHUNK_CAPPED ? rate / 10 : CHUNK_CAPPED;
    if ((double)len > burst)
        burst = (double)len;
    for (;;) {
        pthread_mutex_lock(&n->rate_mu);
        long long now = ck_mono_ms();
        if (!n->rate_t0) {
            n->rate_t0 = now;
            n->tokens = burst;
        }
        n->tokens += rate * (double)(now - n->rate_t0) / 1000.0;
        n->rate_t0 = now;
        if (n->tokens > burst)
            n->tokens = burst;
        if (n->tokens >= (double)len) {
            n->tokens -= (double)len;
            pthread_mutex_unlock(&n->rate_mu);
            return true;
        }
        double wait = ((double)len - n->tokens) * 1000.0 / rate;
        pthread_mutex_unlock(&n->rate_mu);
        if (ck_upload_ctl_expired(n->ctl))
            return false;
        sleep_ms(wait < 1 ? 1 : wait > 200 ? 200 : (long long)wait);
    }
}

void ck_resp_init(struct ck_resp *r)
{
    memset(r, 0, sizeof *r);
    ck_buf_init(&r->body, RESP_MAX);
    r->length = -1;
}

void ck_resp_release(struct ck_resp *r)
{
    ck_buf_release(&r->body);
}

static void resp_reset(struct ck_resp *r)
{
    ck_buf_reset(&r->body);
    r->status = 0;
    r->etag[0] = r->code[0] = r->checksum_sha256[0] = '\0';
    r->retry_after = 0;
    r->length = -1;
}

double ck_backoff_delay(int attempt, double base, double cap, double retry_after, double rnd01)
{
    double d = base * pow(2.0, attempt > 30 ? 30 : attempt);
    if (d > cap)
        d = cap;
    d = d / 2 + rnd01 * d / 2;
    if (retry_after > d)
        d = retry_after > 600 ? 600 : retry_after;
    return d;
}

double ck_parse_retry_after(const char *v, long long now)
{
    while (*v == ' ')
        v++;
    if (!*v)
        return -1;
    bool digits = true;
    for (const char *p = v; *p && *p != '\r' && *p != '\n'; p++)
        if (!isdigit((unsigned char)*p) && !(*p == ' ' && p[1] == '\0'))
            digits = false;
    if (digits) {
        char *end;
        double s = strtod(v, &end);
        return end == v ? -1 : s;
    }
    time_t t = curl_getdate(v, NULL);
    if (t == -1)
        return -1;
    return t > now ? (double)(t - now) : 0;
}

bool ck_net_is_retryable(long status, const char *s3code)
{
    if (s3code && (!strcmp(s3code, "SlowDown") || !strcmp(s3code, "RequestTimeout") ||
                   !strcmp(s3code, "InternalError") || !strcmp(s3code, "ServiceUnavailable")))
        return true;
    /* S3's answer to a conditional write while another is in flight on the
     * same key: "retry" (AWS's words); it is final for neither writer */
    if (status == 409 && s3code && !strcmp(s3code, "ConditionalRequestConflict"))
        return true;
    return status == 0 || status == 408 || status == 429 || status >= 500;
}

bool ck_xml_tag(const char *body, const char *tag, char *out, size_t outsz)
{
    char open[80], close[80];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *a = strstr(body, open);
    if (!a)
        return false;
    a += strlen(open);
    const char *b = strstr(a, close);
    if (!b)
        return false;
    static const struct {
        const char *ent;
        char c;
    } ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    size_t o = 0;
    while (a < b && o + 1 < outsz) {
        bool done = false;
        if (*a == '&')
            for (size_t i = 0; i < sizeof ents / sizeof *ents; i++) {
                size_t l = strlen(ents[i].ent);
                if ((size_t)(b - a) >= l && !strncmp(a, ents[i].ent, l)) {
                    out[o++] = ents[i].c;
                    a += l;
                    done = true;
                    break;
                }
            }
        if (!done)
            out[o++] = *a++;
    }
    out[o] = '\0';
    return a == b;
}

CURL *ck_net_handle(struct ck_net *n)
{
    CURLSH *sh = share_get(n);
    CURL *h = curl_easy_init();
    /* curl_easy_reset (each attempt's setup) keeps the share */
    if (h && sh)
        curl_easy_setopt(h, CURLOPT_SHARE, sh);
    return h;
}

/* One attempt's state, seen by the callbacks. */
struct attempt {
    struct ck_net *net;
    struct ck_req *req;
    struct ck_resp *resp;
    uint64_t pos;     /* bytes of the body handed to curl */
    uint64_t counted; /* bytes added to req->progress by this attempt */
    bool aborted;     /* the deadline passed */
    int read_err;     /* errno of a failed pread */
};

static size_t read_cb(char *buf, size_t size, size_t nitems, void *ud)
{
    struct attempt *a = ud;
    struct ck_req *r = a->req;
    size_t want = size * nitems;
    uint64_t total = r->fd >= 0 ? r->len : r->mem_len;
    if (a->pos >= total)
        return 0;
    if (want > total - a->pos)
        want = (size_t)(total - a->pos);
    if (a->net->opts->max_rate && want > CHUNK_CAPPED)
        want = CHUNK_CAPPED;
    if (!ck_net_throttle(a->net, want)) {
        a->aborted = true;
        return CURL_READFUNC_ABORT;
    }
    if (r->fd >= 0) {
        ssize_t got = pread(r->fd, buf, want, (off_t)(r->off + a->pos));
        if (got <= 0) {
            a->read_err = got < 0 ? errno : EIO;
            return CURL_READFUNC_ABORT;
        }
        want = (size_t)got;
    } else {
        memcpy(buf, (const char *)r->mem + a->pos, want);
    }
    a->pos += want;
    if (r->progress) {
        atomic_fetch_add(r->progress, want);
        a->counted += want;
    }
    return want;
}

static int seek_cb(void *ud, curl_off_t offset, int origin)
{
    struct attempt *a = ud;
    if (origin != SEEK_SET || offset < 0)
        return CURL_SEEKFUNC_CANTSEEK;
    if (a->req->progress) {
        atomic_fetch_sub(a->req->progress, a->counted);
        a->counted = 0;
    }
    a->pos = (uint64_t)offset;
    return CURL_SEEKFUNC_OK;
}

static size_t write_cb(char *data, size_t size, size_t nmemb, void *ud)
{
    struct attempt *a = ud;
    size_t n = size * nmemb;
    if (a->req->sink)
        return a->req->sink(a->req->sink_ctx, data, n) < 0 ? 0 : n;
    size_t room = RESP_MAX - a->resp->body.len;
    ck_buf_append(&a->resp->body, data, n < room ? n : room);
    return n;
}

static void header_value(char *out, size_t outsz, const char *v, size_t len)
{
    while (len && (*v == ' ' || *v == '\t'))
        v++, len--;
    while (len && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' '))
        len--;
    if (len >= outsz)
        len = outsz - 1;
    memcpy(out, v, len);
    out[len] = '\0';
}

static size_t header_cb(char *data, size_t size, size_t nmemb, void *ud)
{
    struct attempt *a = ud;
    size_t n = size * nmemb;
    const char *colon = memchr(data, ':', n);
    if (!colon)
        return n;
    size_t klen = (size_t)(colon - data);
    const char *v = colon + 1;
    size_t vlen = n - klen - 1;
    char tmp[256];
    if (klen == 4 && !strncasecmp(data, "etag", 4)) {
        header_value(a->resp->etag, sizeof a->resp->etag, v, vlen);
    } else if (klen == 11 && !strncasecmp(data, "retry-after", 11)) {
        header_value(tmp, sizeof tmp, v, vlen);
        double s = ck_parse_retry_after(tmp, (long long)time(NULL));
        if (s > 0)
            a->resp->retry_after = s;
    } else if (klen == 14 && !strncasecmp(data, "content-length", 14)) {
        header_value(tmp, sizeof tmp, v, vlen);
        a->resp->length = strtoll(tmp, NULL, 10);
    } else if (klen == 21 && !strncasecmp(data, "x-amz-checksum-sha256", 21)) {
        header_value(a->resp->checksum_sha256, sizeof a->resp->checksum_sha256, v, vlen);
    }
    return n;
}

static int xferinfo_cb(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    struct attempt *a = ud;
    if (ck_upload_ctl_expired(a->net->ctl)) {
        a->aborted = true;
        return 1;
    }
    return 0;
}

static void setup_handle(CURL *h, struct ck_net *n, struct ck_req *r, struct attempt *a)
{
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, r->url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME,
                     (long)(n->opts->timeout > 1 ? n->opts->timeout : 1));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, a);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, a);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, xferinfo_cb);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, a);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "ckptd/" CKPTD_VERSION);
    /* the shared pool keeps a connection for every request that can be in
     * flight at once: each transfer's parts, and a tail request (HEAD, MOVE,
     * CompleteMultipartUpload) per transfer beside them (libcurl's default,
     * 5, closed most of them as parts ended: 107 connections for one 1 GiB
     * multipart upload) */
    long pool = (long)(n->opts->transfers > 0 ? n->opts->transfers : 1) *
                    ((n->opts->concurrency > 0 ? n->opts->concurrency : 1) + 1) +
                4;
    curl_easy_setopt(h, CURLOPT_MAXCONNECTS, pool);
    /* a large upload buffer: fewer syscalls per byte than curl's 64 KiB default */
    curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 2L * 1024 * 1024);
    if (r->headers)
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, r->headers);
    uint64_t total = r->fd >= 0 ? r->len : r->mem_len;
    const char *m = r->method;
    if (r->upload) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, read_cb);
        curl_easy_setopt(h, CURLOPT_READDATA, a);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, seek_cb);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, a);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)total);
        if (m && strcmp(m, "PUT"))
            curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, m);
    } else if (m && !strcmp(m, "POST")) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, r->mem ? (const char *)r->mem : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->mem_len);
    } else if (m && !strcmp(m, "HEAD")) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (m && strcmp(m, "GET")) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, m);
    }
    if (r->setup)
        r->setup(h, r->setup_ctx);
}

static void url_for_msg(char *out, size_t outsz, const char *url)
{
    ck_store_url_redact(out, outsz, url);
}

int ck_net_request(struct ck_net *n, CURL *h, struct ck_req *r, struct ck_resp *resp,
                   const long *ok_status)
{
    char errbuf[CURL_ERROR_SIZE], where[512];
    int retries = n->opts->retries < 0 ? 0 : n->opts->retries;
    url_for_msg(where, sizeof where, r->url);
    for (int attempt = 0;; attempt++) {
        struct attempt a = {n, r, resp, 0, 0, false, 0};
        resp_reset(resp);
        errbuf[0] = '\0';
        if (ck_upload_ctl_expired(n->ctl))
            return ck_error(CK_ENET, "%s: stopped before it finished", r->what ? r->what : where);
        if (r->sink && r->sink(r->sink_ctx, NULL, 0) < 0)
            return ck_error_wrap(CK_EIO, "%s", r->what ? r->what : where);
        setup_handle(h, n, r, &a);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
        CURLcode cc = curl_easy_perform(h);
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp->status);
        if (resp->body.len && strstr(ck_buf_str(&resp->body), "<Error>"))
            ck_xml_tag(ck_buf_str(&resp->body), "Code", resp->code, sizeof resp->code);
        bool ok = false;
        if (cc == CURLE_OK) {
            ok = (resp->status >= 200 && resp->status < 300) ||
                 (resp->status == 0 && strncmp(r->url, "http", 4) != 0);
            for (const long *s = ok_status; s && *s && !ok; s++)
                ok = resp->status == *s;
        }
        if (ok)
            return 0;
        if (r->progress && a.counted)
            atomic_fetch_sub(r->progress, a.counted);
        const char *what = r->what ? r->what : where;
        char detail[600];
        if (a.aborted)
            return ck_error(CK_ENET, "%s: stopped before it finished (deadline)", what);
        if (a.read_err) {
            errno = a.read_err;
            return ck_error_os(CK_EIO, "%s: cannot read the local file", what);
        }
        bool retry;
        if (cc != CURLE_OK) {
            snprintf(detail, sizeof detail, "%s", errbuf[0] ? errbuf : curl_easy_strerror(cc));
            retry = cc != CURLE_LOGIN_DENIED && cc != CURLE_REMOTE_ACCESS_DENIED &&
                    cc != CURLE_PEER_FAILED_VERIFICATION && cc != CURLE_SSH &&
                    cc != CURLE_UNSUPPORTED_PROTOCOL && cc != CURLE_URL_MALFORMAT;
            if (cc == CURLE_PEER_FAILED_VERIFICATION && !strncmp(r->url, "sftp:", 5))
                return ck_error(CK_EAUTH,
                                "%s: the server's host key is not the pinned one: %s (%s)", what,
                                detail, where);
            if (cc == CURLE_LOGIN_DENIED || cc == CURLE_REMOTE_ACCESS_DENIED ||
                cc == CURLE_PEER_FAILED_VERIFICATION)
                return ck_error(CK_EAUTH, "%s: %s (%s)", what, detail, where);
            if (cc == CURLE_SSH)
                return ck_error(CK_EAUTH, "%s: %s (%s): check the key and the pinned host key",
                                what, detail, where);
        } else {
            snprintf(detail, sizeof detail, "HTTP %ld%s%s", resp->status, resp->code[0] ? " " : "",
                     resp->code);
            if (resp->status == 401 || resp->status == 403)
                return ck_error(CK_EAUTH, "%s: %s: the store refused the credentials (%s)", what,
                                detail, where);
            retry = ck_net_is_retryable(resp->status, resp->code);
        }
        /* nobody answers there: the caller gives up the whole store for
         * now, not just this request (stores/net.h) */
        bool unreachable = cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ||
                           cc == CURLE_COULDNT_RESOLVE_PROXY;
        if (!retry || attempt >= retries)
            return ck_error(unreachable ? CK_EUNREACH
                            : !retry && cc == CURLE_OK ? CK_EREFUSED
                                                       : CK_ENET,
                            "%s: %s (%s)%s", what, detail, where,
                            retry ? ", giving up after retries" : "");
        pthread_mutex_lock(&n->rate_mu); /* transfers retry from several threads */
        double rnd = (double)rand_r(&n->rand_state) / ((double)RAND_MAX + 1.0);
        pthread_mutex_unlock(&n->rate_mu);
        /* Nobody answering costs the server nothing, and the job is not
         * failed by it (it stays queued for the next round): short delays,
         * so that a round learns soon that the store is down. */
        double cap = unreachable && n->opts->retry_cap > UNREACHABLE_CAP ? UNREACHABLE_CAP
                                                                         : n->opts->retry_cap;
        double d = ck_backoff_delay(attempt, n->opts->retry_base, cap, resp->retry_after, rnd);
        /* an attempt that will be retried is news, not a problem: the warning
         * is the caller's once the retries are spent (one per store when
         * nobody answers, see stores/uploader.c) */
        ck_info("upload.retry", "what=\"%s\" error=\"%s\" attempt=%d delay_seconds=%.1f", what, detail,
                attempt + 1, d);
        long long until = ck_mono_ms() + (long long)(d * 1000);
        while (ck_mono_ms() < until) {
            if (ck_upload_ctl_stopping(n->ctl))
                return ck_error(CK_ENET, "%s: %s (%s); stopped while waiting to retry", what,
                                detail, where);
            sleep_ms(until - ck_mono_ms() > 100 ? 100 : until - ck_mono_ms());
        }
    }
}
