/* s3://bucket/prefix on any S3-compatible service, signed with libcurl's
 * own SigV4 (CURLOPT_AWS_SIGV4). libcurl 7.88 neither adds
 * x-amz-content-sha256 nor sorts the query: every request here sets the
 * payload hash itself and builds its query in canonical order.
 *
 * Under multipart_threshold: one PUT with x-amz-checksum-sha256 (and
 * Content-MD5 until the service has shown that it keeps checksums); a HEAD
 * then checks the size and S3's checksum of the object, or on services that
 * return none the ETag against the body's MD5.
 * Above (and for metadata, whatever its size): CreateMultipartUpload, parts
 * in parallel, each read into memory so the bytes hashed are the bytes sent,
 * each with x-amz-checksum-sha256 (SHA-256 alone: one hash per byte), then
 * CompleteMultipartUpload; a HEAD then checks the size and S3's checksum of
 * the object (base64 SHA-256 of the parts' SHA-256s, "-N"), or on services
 * that do not return it, the ETag against the parts' MD5s (taken with their
 * SHA-256 while no part has come back with S3's checksum). */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "common/log.h"
#include "stores/awsconfig.h"
#include "stores/awscred.h"
#include "stores/net.h"
#include "stores/source.h"
#include "stores/store.h"
#include "common/codec.h"

#include <errno.h>
#include <fcntl.h>
#include <nettle/base64.h>
#include <nettle/md5.h>
#include <nettle/sha2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_PARTS 10000
#define MIN_PART (5u << 20)
#define S3_SINGLE_PUT_MAX (5ull << 30) /* S3's largest PUT */
#define PART_IO (1u << 20) /* read size while hashing a part */
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

struct s3 {
    struct ck_store base;
    char bucket[256];
    char prefix[1024];
    char endpoint[512];
    char sigv4[128];
    struct ck_awscred *cred; /* owned: the credential chain (awscred.h) */
    /* a HEAD or a part came back with S3's own x-amz-checksum-sha256: the
     * service checks the checksum sent with each body and keeps it (AWS,
     * MinIO), so later uploads need no MD5 (ETags are not MD5s anyway on
     * SSE-KMS or SSE-C buckets) */
    atomic_bool server_checks;
};

static int parse_url(const char *url, char *bucket, size_t bsz, char *prefix, size_t psz)
{
    const char *b = url + 5; /* "s3://" */
    size_t n = strcspn(b, "/?#");
    if (n == 0 || n >= bsz)
        return ck_error(CK_ECONFIG, "store '%s': the bucket name is missing or too long", url);
    for (size_t i = 0; i < n; i++) {
        char c = b[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.'))
            return ck_error(CK_ECONFIG, "store '%s': '%.*s' is not a valid bucket name", url,
                            (int)n, b);
    }
    if (b[n] == '?' || b[n] == '#')
        return ck_error(CK_ECONFIG, "store '%s': an s3 URL takes no query", url);
    memcpy(bucket, b, n);
    bucket[n] = '\0';
    const char *p = b[n] == '/' ? b + n + 1 : b + n;
    if (strlen(p) >= psz)
        return ck_error(CK_ECONFIG, "store '%s': the prefix is too long", url);
    snprintf(prefix, psz, "%s", p);
    size_t pl = strlen(prefix);
    while (pl && prefix[pl - 1] == '/')
        prefix[--pl] = '\0';
    return 0;
}

static int s3_check(const struct ck_store_spec *spec)
{
    char bucket[256], prefix[1024];
    int err;
    if ((err = parse_url(spec->url, bucket, sizeof bucket, prefix, sizeof prefix)) < 0)
        return err;
    if (spec->endpoint && strncmp(spec->endpoint, "http://", 7) &&
        strncmp(spec->endpoint, "https://", 8))
        return ck_error(CK_ECONFIG, "store '%s': endpoint '%s' must start with http:// or https://",
                        spec->url, spec->endpoint);
    if (spec->credentials && strcmp(spec->credentials, "env") &&
        strncmp(spec->credentials, "file:", 5))
        return ck_error(CK_ECONFIG,
                        "store '%s': credentials must be 'env' (AWS_ACCESS_KEY_ID, "
                        "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or 'file:/path' (mode 0600)",
                        spec->url);
    if (spec->region && (!*spec->region || strlen(spec->region) > 60))
        return ck_error(CK_ECONFIG, "store '%s': bad region", spec->url);
    if (spec->profile && (!*spec->profile || strlen(spec->profile) > 127))
        return ck_error(CK_ECONFIG, "store '%s': bad profile name", spec->url);
    return 0;
}

static void s3_free(struct ck_store *st)
{
    struct s3 *s = (struct s3 *)st;
    ck_awscred_free(s->cred);
    free(s);
}

static int s3_open(struct ck_store **out, const struct ck_store_spec *spec, struct ck_net *net)
{
    struct s3 *s = calloc(1, sizeof *s);
    struct ck_awsprofile prof;
    char region[64], label[512];
    int err;
    if (!s)
        return ck_error(CK_ENOMEM, "out of memory");
    atomic_init(&s->server_checks, false);
    s->base.spec = spec;
    ck_store_url_redact(label, sizeof label, spec->url);
    if ((err = parse_url(spec->url, s->bucket, sizeof s->bucket, s->prefix, sizeof s->prefix)) <
        0) {
        s3_free(&s->base);
        return err;
    }
    /* region, endpoint and credentials as the AWS CLI resolves them (awsconfig.h) */
    if ((err = ck_awsprofile_open(&prof, spec->profile)) < 0) {
        s3_free(&s->base);
        return err;
    }
    ck_awsconfig_region(region, sizeof region, spec->region, &prof);
    if ((err = ck_awsconfig_endpoint(s->endpoint, sizeof s->endpoint, spec->endpoint, "s3",
                                     &prof)) == 0)
        err = ck_awscred_open(&s->cred, spec->credentials, &prof, region, label);
    ck_awsprofile_release(&prof);
    if (err < 0) {
        s3_free(&s->base);
        return err;
    }
    if (!s->endpoint[0])
        snprintf(s->endpoint, sizeof s->endpoint, "https://s3.%s.amazonaws.com", region);
    size_t el = strlen(s->endpoint);
    while (el && s->endpoint[el - 1] == '/')
        s->endpoint[--el] = '\0';
    snprintf(s->sigv4, sizeof s->sigv4, "aws:amz:%s:s3", region);
    ck_debug("s3.open", "store=\"%s\" region=%s endpoint=\"%s\"", label, region, s->endpoint);
    *out = &s->base;
    return 0;
}

/* One request's copy of the keys (a refresh meanwhile does not change them
 * under curl's feet). */
struct s3call {
    struct s3 *s;
    struct ck_awskeys keys;
};

static void s3_setup(CURL *h, void *ctx)
{
    struct s3call *c = ctx;
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, c->s->sigv4);
    curl_easy_setopt(h, CURLOPT_USERNAME, c->keys.id);
    curl_easy_setopt(h, CURLOPT_PASSWORD, c->keys.secret);
}

static void free_headers(struct curl_slist *l)
{
    for (struct curl_slist *i = l; i; i = i->next)
        if (!strncasecmp(i->data, "x-amz-security-token:", 21))
            explicit_bzero(i->data, strlen(i->data));
    curl_slist_free_all(l);
}

/* ck_net_request with the current keys (fetched again when about to expire)
 * and the session token in a signed header. Keys refused as expired are
 * renewed once and the request sent again. */
static int s3_request(struct s3 *s, CURL *h, struct ck_req *r, struct ck_resp *resp)
{
    struct curl_slist *base = r->headers;
    void *base_ctx = r->setup_ctx;
    struct s3call *c = malloc(sizeof *c); /* 8 KiB: not on a part thread's stack */
    int err;
    if (!c)
        return ck_error(CK_ENOMEM, "out of memory");
    c->s = s;
    for (int round = 0;; round++) {
        if ((err = ck_awscred_get(s->cred, &c->keys)) < 0)
            break;
        struct curl_slist *hd = NULL;
        for (struct curl_slist *i = base; i; i = i->next)
            hd = curl_slist_append(hd, i->data);
        if (c->keys.token[0]) {
            struct ck_buf b = CK_BUF_INIT;
            ck_buf_printf(&b, "x-amz-security-token: %s", c->keys.token);
            hd = curl_slist_append(hd, ck_buf_str(&b));
            ck_buf_wipe(&b);
        }
        r->headers = hd;
        r->setup_ctx = c;
        err = ck_net_request(s->base.net, h, r, resp, NULL);
        r->headers = base;
        r->setup_ctx = base_ctx;
        free_headers(hd);
        /* S3 answers ExpiredToken with 400, a revoked temporary key with 403 */
        if (err < 0 && round == 0 && ck_awscred_is_expired_code(resp->code) &&
            ck_awscred_refresh_now(s->cred, &c->keys)) {
            ck_warn("s3.credentials.expired", "what=\"%s\" error_code=%s: sending again with new keys",
                    r->what ? r->what : "request", resp->code);
            ck_error_clear();
            continue;
        }
        break;
    }
    ck_awskeys_wipe(&c->keys);
    free(c);
    return err;
}

/* The object's URL (path style) plus an already canonical query. */
static int object_url(struct s3 *s, const char *key, const char *query, char *out, size_t outsz)
{
    char full[2048], enc[6144];
    int err;
    if ((err = ck_store_join_key(full, sizeof full, s->prefix, key)) < 0 ||
        (err = ck_store_encode(enc, sizeof enc, full, true)) < 0)
        return err;
    int n = snprintf(out, outsz, "%s/%s/%s%s%s", s->endpoint, s->bucket, enc, query ? "?" : "",
                     query ? query : "");
    if (n < 0 || (size_t)n >= outsz)
        return ck_error(CK_ESIZE, "'%s': the URL is too long", key);
    return 0;
}

/* Common headers; the list is the caller's to free. */
static struct curl_slist *base_headers(struct s3 *s, const char *payload_sha256)
{
    char h[256];
    struct curl_slist *l = NULL;
    snprintf(h, sizeof h, "x-amz-content-sha256: %s", payload_sha256);
    l = curl_slist_append(l, h);
    /* no "Expect:" override: libcurl 7.88 would sign the empty header it then drops;
     * the session token is added per request by s3_request (it may be renewed) */
    (void)s;
    return l;
}

/* Appends "name: value". */
static struct curl_slist *add(struct curl_slist *l, const char *name, const char *v)
{
    char h[512];
    snprintf(h, sizeof h, "%s: %s", name, v);
    return curl_slist_append(l, h);
}

static void sha256_bin(const void *data, size_t len, uint8_t out[SHA256_DIGEST_SIZE])
{
    struct sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, len, data);
    sha256_digest(&c, SHA256_DIGEST_SIZE, out);
}

/* HEAD the stored object asking for S3's checksum of it (x-amz-checksum-mode)
 * and compare its size with what was sent, then that checksum, when the
 * service gave one, with want (a single PUT's SHA-256, a multipart
 * object's composite). A match also tells that the service keeps checksums.
 * resp (initialised here, released by the caller) keeps the ETag for
 * services that give no checksum. */
static int head_stored(struct s3 *s, CURL *h, const struct ck_xfer *x, const char *want,
                       struct ck_resp *resp)
{
    char url[8192];
    ck_resp_init(resp);
    int err = object_url(s, x->key, NULL, url, sizeof url);
    if (err < 0)
        return err;
    struct curl_slist *hd = base_headers(s, EMPTY_SHA256);
    hd = curl_slist_append(hd, "x-amz-checksum-mode: ENABLED");
    struct ck_req r = {.method = "HEAD",
                       .url = url,
                       .headers = hd,
                       .fd = -1,
                       .setup = s3_setup,
                       .setup_ctx = s,
                       .what = x->key};
    err = s3_request(s, h, &r, resp);
    curl_slist_free_all(hd);
    if (err == 0 && (resp->length < 0 || (uint64_t)resp->length != x->size))
        err = ck_error(CK_ENET, "'%s': the stored object has %lld bytes, %llu were sent", x->key,
                       (long long)resp->length, (unsigned long long)x->size);
    if (err == 0 && resp->checksum_sha256[0]) {
        if (strcmp(resp->checksum_sha256, want) != 0)
            err = ck_error(CK_ENET,
                           "'%s': the stored object's checksum %s is not %s: the data differ",
                           x->key, resp->checksum_sha256, want);
        else
            atomic_store(&s->server_checks, true);
    }
    return err;
}

/* The ETag of an object stored by a service that gives no checksum, against
 * the MD5 ETag computed for it. */
static int etag_is(const struct ck_xfer *x, const struct ck_resp *resp, const char *etag)
{
    if (strcasecmp(resp->etag, etag) != 0)
        return ck_error(CK_ENET, "'%s': the stored object's ETag %s is not %s: the data differ",
                        x->key, resp->etag, etag);
    return 0;
}

/* After a single PUT: head_stored with the SHA-256 sent; on a service that
 * returns no checksum, the ETag against the body's MD5 (md5_hex, or taken
 * from the file now when the PUT went without one). */
static int verify(struct s3 *s, CURL *h, struct ck_xfer *x, const char *sha256_b64,
                  const char *md5_hex)
{
    struct ck_resp resp;
    struct ck_digests d;
    char etag[40];
    int err = head_stored(s, h, x, sha256_b64, &resp);
    if (err == 0 && !resp.checksum_sha256[0]) {
        /* without md5_hex: the service had kept checksums before, not this time */
        if (md5_hex || (err = ck_hash_file(x->path, CK_HASH_MD5, &d, NULL)) == 0) {
            snprintf(etag, sizeof etag, "\"%s\"", md5_hex ? md5_hex : d.md5);
            err = etag_is(x, &resp, etag);
        }
    }
    if (err == 0)
        x->check = resp.checksum_sha256[0] ? "sha256" : "md5";
    ck_resp_release(&resp);
    return err;
}

/* After a conditional PUT was refused: whether the stored object holds the
 * bytes that PUT carried (its size, and its checksum or MD5 ETag). */
static bool stored_same(struct s3 *s, CURL *h, struct ck_xfer *x, const char *sha256_b64,
                        const char *md5_hex)
{
    struct ck_resp resp;
    char etag[40];
    bool same = head_stored(s, h, x, sha256_b64, &resp) == 0;
    if (same && !resp.checksum_sha256[0]) {
        snprintf(etag, sizeof etag, "\"%s\"", md5_hex);
        same = strcasecmp(resp.etag, etag) == 0;
    }
    ck_resp_release(&resp);
    ck_error_clear();
    return same;
}

static int put_single(struct s3 *s, struct ck_xfer *x)
{
    struct ck_digests d;
    struct stat st;
    char url[8192], b64[48], md5b64[32];
    unsigned char bin[32];
    int err, fd = -1;
    /* the MD5 only for a service not known to keep checksums: for its
     * Content-MD5 and the ETag check (half of the CPU a PUT costs) */
    bool want_md5 = !atomic_load(&s->server_checks) || x->if_absent;
    struct curl_slist *hd = NULL;
    if ((fd = open(x->path, O_RDONLY | O_CLOEXEC)) < 0)
        return ck_error_os(CK_EIO, "cannot open '%s'", x->path);
    if (fstat(fd, &st) < 0) {
        err = ck_error_os(CK_EIO, "cannot stat '%s'", x->path);
        goto out;
    }
    if (ck_source_known_for(x, &st) && (!want_md5 || x->known_md5[0])) {
        /* the registration read this very file (device, inode, size, mtime)
         * for both digests: the body is read once more, to send it, and the
         * service checks it against the signed SHA-256 and the Content-MD5 */
        memset(&d, 0, sizeof d);
        memcpy(d.sha256, x->known_sha256, sizeof d.sha256);
        memcpy(d.md5, x->known_md5, sizeof d.md5);
        d.size = (uint64_t)st.st_size;
        ck_debug("upload.digests_known", "key=\"%s\": the digests its registration took, not read "
                 "again", x->key);
    } else {
        struct stat opened = st;
        if ((err = ck_hash_file(x->path, want_md5 ? CK_HASH_BOTH : CK_HASH_SHA256, &d, &st)) < 0)
            goto out;
        /* what was hashed is the file open here, unchanged since */
        if (opened.st_dev != st.st_dev || opened.st_ino != st.st_ino ||
            !ck_stat_unchanged(&opened, &st)) {
            err = ck_error(CK_ECHANGED, "'%s' changed while it was hashed", x->path);
            goto out;
        }
    }
    if (d.size != x->size) {
        err = ck_error(CK_ECHANGED, "'%s' has %llu bytes, %llu when it was queued", x->path,
                       (unsigned long long)d.size, (unsigned long long)x->size);
        goto out;
    }
    memcpy(x->sha256, d.sha256, sizeof x->sha256);
    if ((err = object_url(s, x->key, NULL, url, sizeof url)) < 0)
        goto out;
    ck_codec_unhex(bin, 32, d.sha256);
    ck_codec_base64(b64, bin, 32);
    hd = base_headers(s, d.sha256);
    hd = add(hd, "x-amz-checksum-sha256", b64);
    if (want_md5) {
        ck_codec_unhex(bin, 16, d.md5);
        ck_codec_base64(md5b64, bin, 16);
        hd = add(hd, "Content-MD5", md5b64);
    }
    hd = curl_slist_append(hd, "Content-Type: application/octet-stream");
    if (x->orig_sha256)
        hd = add(hd, "x-amz-meta-ckptd-original-sha256", x->orig_sha256);
    if (x->if_absent) /* signed, like every header libcurl's SigV4 sees */
        hd = curl_slist_append(hd, "If-None-Match: *");
    struct ck_req r = {.method = "PUT",
                       .url = url,
                       .headers = hd,
                       .fd = fd,
                       .off = 0,
                       .len = x->size,
                       .upload = true,
                       .progress = &x->sent,
                       .setup = s3_setup,
                       .setup_ctx = s,
                       .what = x->key};
    struct ck_resp resp;
    ck_resp_init(&resp);
    CURL *h = ck_net_handle(s->base.net);
    if (!h) {
        err = ck_error(CK_ENOMEM, "cannot create a curl handle");
    } else if ((err = s3_request(s, h, &r, &resp)) == 0) {
        ck_xfer_body_sent(x);
        struct stat st2;
        if (fstat(fd, &st2) == 0 && !ck_stat_unchanged(&st, &st2))
            err = ck_error(CK_ECHANGED, "'%s' changed while it was uploaded", x->path);
        else
            err = verify(s, h, x, b64, want_md5 ? d.md5 : NULL);
    } else if (x->if_absent && err == CK_EREFUSED && resp.status == 412) {
        ck_error_clear();
        x->same_bytes = stored_same(s, h, x, b64, d.md5);
        err = ck_error(CK_EEXIST, "'%s': already exists (HTTP 412 %s): not overwritten%s", x->key,
                       resp.code[0] ? resp.code : "PreconditionFailed",
                       x->same_bytes ? ", and it has the same bytes" : "");
    }
    if (err == 0)
        x->parts_sent = 1;
    curl_easy_cleanup(h);
    ck_resp_release(&resp);
out:
    if (fd >= 0)
        close(fd);
    curl_slist_free_all(hd);
    return err;
}

static int create_upload(struct s3 *s, CURL *h, struct ck_xfer *x, uint64_t part_size)
{
    char url[8192];
    int err;
    if ((err = object_url(s, x->key, "uploads=", url, sizeof url)) < 0)
        return err;
    struct curl_slist *hd = base_headers(s, EMPTY_SHA256);
    hd = curl_slist_append(hd, "x-amz-checksum-algorithm: SHA256");
    hd = curl_slist_append(hd, "Content-Type: application/octet-stream");
    if (x->orig_sha256)
        hd = add(hd, "x-amz-meta-ckptd-original-sha256", x->orig_sha256);
    struct ck_req r = {.method = "POST",
                       .url = url,
                       .headers = hd,
                       .fd = -1,
                       .setup = s3_setup,
                       .setup_ctx = s,
                       .what = x->key};
    struct ck_resp resp;
    ck_resp_init(&resp);
    if ((err = s3_request(s, h, &r, &resp)) == 0) {
        if (!ck_xml_tag(ck_buf_str(&resp.body), "UploadId", x->upload_id, sizeof x->upload_id) ||
            !x->upload_id[0])
            err = ck_error(CK_ENET, "'%s': CreateMultipartUpload answered without an UploadId",
                           x->key);
        else if ((err = x->save_upload(x->cb_ctx, x->upload_id, part_size)) == 0)
            x->part_size = part_size;
    }
    ck_resp_release(&resp);
    curl_slist_free_all(hd);
    return err;
}

/* The MD5 ETag a service may give a multipart object at path: of each
 * part_size slice combined (AWS, MinIO, s3rver: "md5(md5s)-N"), or, with
 * whole set, of the whole body ("md5": a few other services). Only the one
 * asked for: each is a full MD5 pass, and on a 2-core node computing both
 * took more CPU than the transfer (MD5 runs at about 0.6 GB/s). */
struct md5job {
    const char *path;
    uint64_t part_size;
    bool whole;
    char etag[64];
};

static int md5_etags(struct md5job *j)
{
    const char *path = j->path;
    uint64_t part_size = j->part_size;
    int nparts = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(CK_EIO, "cannot open '%s'", path);
    struct md5_ctx all, part, comb;
    unsigned char *buf = malloc(1u << 20), bin[MD5_DIGEST_SIZE];
    char hex[33];
    int err = 0;
    uint64_t in_part = 0;
    if (!buf) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    md5_init(&all);
    md5_init(&part);
    md5_init(&comb);
    for (;;) {
        size_t want = 1u << 20;
        if (!j->whole && part_size - in_part < want)
            want = (size_t)(part_size - in_part); /* a read never spans two parts */
        ssize_t n = read(fd, buf, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            err = ck_error_os(CK_EIO, "cannot read '%s'", path);
            goto out;
        }
        if (n > 0) {
            md5_update(j->whole ? &all : &part, (size_t)n, buf);
            in_part += (uint64_t)n;
        }
        if (!j->whole && ((n == 0 && in_part) || in_part == part_size)) {
            md5_digest(&part, sizeof bin, bin); /* also resets it for the next part */
            md5_update(&comb, sizeof bin, bin);
            in_part = 0;
            nparts++;
        }
        if (n == 0)
            break;
    }
    if (j->whole) {
        md5_digest(&all, sizeof bin, bin);
        ck_hex(hex, bin, 16);
        snprintf(j->etag, sizeof j->etag, "\"%s\"", hex);
    } else {
        md5_digest(&comb, sizeof bin, bin);
        ck_hex(hex, bin, 16);
        snprintf(j->etag, sizeof j->etag, "\"%s-%d\"", hex, nparts);
    }
out:
    free(buf);
    close(fd);
    return err;
}

/* The parallel part senders. */
struct mp {
    struct s3 *s;
    struct ck_xfer *x;
    int fd;
    /* the file when this run opened it: every part sent must be of it. A
     * part checked only against itself (its stat before and after its own
     * send) let a rewrite between two parts make an object of two versions */
    struct stat start;
    int nparts;
    unsigned char *done; /* per part (index number-1): 1 when accepted */
    pthread_mutex_t mu;
    int next; /* next part index to look at */
    int err;
    char msg[1024];
};

static int next_part(struct mp *m)
{
    int i = -1;
    pthread_mutex_lock(&m->mu);
    while (m->err == 0 && m->next < m->nparts) {
        if (!m->done[m->next]) {
            i = m->next++;
            break;
        }
        m->next++;
    }
    pthread_mutex_unlock(&m->mu);
    return i;
}

static int send_part(struct mp *m, CURL *h, int idx, unsigned char *buf)
{
    struct ck_xfer *x = m->x;
    struct s3 *s = m->s;
    uint64_t off = (uint64_t)idx * x->part_size;
    size_t len = (size_t)(x->size - off < x->part_size ? x->size - off : x->part_size);
    struct stat before, after;
    if (fstat(m->fd, &before) < 0)
        return ck_error_os(CK_EIO, "cannot stat '%s'", x->path);
    /* the part is hashed, then streamed from the file (page cache) rather than
     * held in memory: memory stays a few MiB whatever part_size and concurrency.
     * S3 checks x-amz-checksum-sha256 against what it received; the file's stat
     * is compared after the send, and the whole object's checksum or MD5 at the end.
     * One hash per byte: SHA-256 (SHA-NI makes it the cheapest); no Content-MD5. */
    struct sha256_ctx md;
    struct md5_ctx md5;
    /* for a service that does not check checksums: each part's MD5, taken on
     * the same bytes while in cache, against the part's ETag and the object's */
    bool want_md5 = !atomic_load(&s->server_checks);
    sha256_init(&md);
    md5_init(&md5);
    size_t got = 0;
    while (got < len) {
        size_t want = len - got < PART_IO ? len - got : PART_IO;
        ssize_t n = pread(m->fd, buf, want, (off_t)(off + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            return n < 0 ? ck_error_os(CK_EIO, "cannot read '%s'", x->path)
                         : ck_error(CK_ECHANGED, "'%s' became shorter while it was uploaded",
                                    x->path);
        }
        sha256_update(&md, (size_t)n, buf);
        if (want_md5)
            md5_update(&md5, (size_t)n, buf);
        got += (size_t)n;
    }
    struct ck_part p = {.number = idx + 1, .size = len};
    if (want_md5) {
        unsigned char bin[MD5_DIGEST_SIZE];
        md5_digest(&md5, sizeof bin, bin);
        ck_hex(p.md5, bin, MD5_DIGEST_SIZE);
    }
    unsigned char sha[SHA256_DIGEST_SIZE];
    char sha_hex[65], query[700], url[8192], enc_id[600];
    sha256_digest(&md, sizeof sha, sha);
    ck_hex(sha_hex, sha, 32);
    ck_codec_base64(p.sha256_b64, sha, 32);
    int err;
    if ((err = ck_store_encode(enc_id, sizeof enc_id, x->upload_id, false)) < 0)
        return err;
    /* canonical order: partNumber < uploadId */
    snprintf(query, sizeof query, "partNumber=%d&uploadId=%s", p.number, enc_id);
    if ((err = object_url(s, x->key, query, url, sizeof url)) < 0)
        return err;
    struct curl_slist *hd = base_headers(s, sha_hex);
    hd = add(hd, "x-amz-checksum-sha256", p.sha256_b64);
    char what[1200];
    snprintf(what, sizeof what, "'%s' part %d", x->key, p.number);
    struct ck_req r = {.method = "PUT",
                       .url = url,
                       .headers = hd,
                       .fd = m->fd,
                       .off = off,
                       .len = len,
                       .upload = true,
                       .progress = &x->sent,
                       .setup = s3_setup,
                       .setup_ctx = s,
                       .what = what};
    struct ck_resp resp;
    ck_resp_init(&resp);
    if ((err = s3_request(s, h, &r, &resp)) == 0) {
        snprintf(p.etag, sizeof p.etag, "%s", resp.etag);
        if (!resp.etag[0])
            err = ck_error(CK_ENET, "%s: accepted without an ETag", what);
        else if (resp.checksum_sha256[0] && strcmp(resp.checksum_sha256, p.sha256_b64) != 0)
            err = ck_error(CK_ENET, "%s: the server's checksum %s is not the SHA-256 sent %s", what,
                           resp.checksum_sha256, p.sha256_b64);
        else if (resp.checksum_sha256[0])
            atomic_store(&s->server_checks, true); /* later parts need no MD5 */
    }
    if (err == 0 && (fstat(m->fd, &after) < 0 || !ck_stat_unchanged(&before, &after) ||
                     !ck_stat_unchanged(&m->start, &after)))
        err = ck_error(CK_ECHANGED, "'%s' changed while it was uploaded", x->path);
    ck_resp_release(&resp);
    curl_slist_free_all(hd);
    if (err < 0)
        return err;
    pthread_mutex_lock(&m->mu);
    err = x->save_part(x->cb_ctx, &p);
    if (err == 0) {
        m->done[idx] = 1;
        x->parts[x->nparts++] = p;
        x->parts_sent++;
    }
    pthread_mutex_unlock(&m->mu);
    return err;
}

/* One <Part> of a ListParts answer: its number, size, ETag and (when the
 * service keeps it) its SHA-256 checksum. false when a field is missing or
 * out of range (a hostile or broken answer is not trusted). */
static bool listed_part(const char *blk, struct ck_part *p)
{
    char num[16], size[24];
    memset(p, 0, sizeof *p);
    if (!ck_xml_tag(blk, "PartNumber", num, sizeof num) ||
        !ck_xml_tag(blk, "Size", size, sizeof size) || !ck_xml_tag(blk, "ETag", p->etag, sizeof p->etag))
        return false;
    char *end;
    long n = strtol(num, &end, 10);
    if (*end || n < 1 || n > MAX_PARTS)
        return false;
    unsigned long long z = strtoull(size, &end, 10);
    if (*end || !size[0] || size[0] == '-')
        return false;
    p->number = (int)n;
    p->size = z;
    if (!ck_xml_tag(blk, "ChecksumSHA256", p->sha256_b64, sizeof p->sha256_b64))
        p->sha256_b64[0] = '\0';
    return true;
}

/* One page of a ListParts answer (docs in stores/store.h). */
int ck_s3_list_parts_parse(const char *body, struct ck_part **v, size_t *nv, int *next_marker)
{
    *next_marker = 0;
    for (const char *a = strstr(body, "<Part>"); a; a = strstr(a, "<Part>")) {
        const char *b = strstr(a, "</Part>");
        if (!b)
            break;
        char blk[1024];
        size_t len = (size_t)(b - a);
        const char *from = a;
        a = b + 7;
        if (len >= sizeof blk)
            continue;
        memcpy(blk, from, len);
        blk[len] = '\0';
        struct ck_part p;
        if (!listed_part(blk, &p))
            continue;
        if (*nv >= MAX_PARTS)
            break;
        struct ck_part *nvv = realloc(*v, (*nv + 1) * sizeof **v);
        if (!nvv)
            return ck_error(CK_ENOMEM, "out of memory");
        *v = nvv;
        (*v)[(*nv)++] = p;
    }
    char trunc[8] = "", next[16] = "";
    if (ck_xml_tag(body, "IsTruncated", trunc, sizeof trunc) && !strcmp(trunc, "true") &&
        ck_xml_tag(body, "NextPartNumberMarker", next, sizeof next)) {
        char *end;
        long nm = strtol(next, &end, 10);
        if (!*end && nm > 0 && nm <= MAX_PARTS)
            *next_marker = (int)nm;
    }
    return 0;
}

/* ListParts: the parts the service holds for x's multipart upload, every
 * page. A run killed after the service accepted a part and before the
 * queue recorded it left the part on the server only: resuming from the
 * record alone sends it again. *out is the caller's to free. */
static int list_parts(struct s3 *s, CURL *h, const struct ck_xfer *x, struct ck_part **out,
                      size_t *n)
{
    char url[8192], enc_id[600], query[720];
    struct ck_part *v = NULL;
    size_t nv = 0;
    int marker = 0, err;
    *out = NULL;
    *n = 0;
    if ((err = ck_store_encode(enc_id, sizeof enc_id, x->upload_id, false)) < 0)
        return err;
    for (int page = 0; page <= MAX_PARTS / 1000; page++) {
        /* canonical order: part-number-marker < uploadId */
        if (marker)
            snprintf(query, sizeof query, "part-number-marker=%d&uploadId=%s", marker, enc_id);
        else
            snprintf(query, sizeof query, "uploadId=%s", enc_id);
        if ((err = object_url(s, x->key, query, url, sizeof url)) < 0)
            break;
        struct curl_slist *hd = base_headers(s, EMPTY_SHA256);
        struct ck_req r = {.method = "GET", .url = url, .headers = hd, .fd = -1,
                           .setup = s3_setup, .setup_ctx = s, .what = x->key};
        struct ck_resp resp;
        ck_resp_init(&resp);
        err = s3_request(s, h, &r, &resp);
        curl_slist_free_all(hd);
        int next = 0;
        if (err == 0)
            err = ck_s3_list_parts_parse(ck_buf_str(&resp.body), &v, &nv, &next);
        ck_resp_release(&resp);
        if (err < 0 || next <= marker) /* a marker that does not advance ends the walk */
            break;
        marker = next;
    }
    if (err < 0) {
        free(v);
        return err;
    }
    *out = v;
    *n = nv;
    return 0;
}

/* Takes the parts the service holds and the record lacks, each only when
 * the service's checksum of it (or, on a service that keeps none, its MD5
 * ETag) equals that of the file's bytes at its place: read here, which
 * costs a read of those parts instead of their upload. */
static size_t adopt_listed_parts(struct mp *m, const struct ck_part *listed, size_t nlisted)
{
    struct ck_xfer *x = m->x;
    size_t taken = 0;
    unsigned char *buf = NULL;
    for (size_t i = 0; i < nlisted; i++) {
        const struct ck_part *l = &listed[i];
        if (l->number < 1 || l->number > m->nparts || m->done[l->number - 1])
            continue;
        uint64_t off = (uint64_t)(l->number - 1) * x->part_size;
        uint64_t want = x->size - off < x->part_size ? x->size - off : x->part_size;
        if (l->size != want)
            continue;
        if (!buf && !(buf = malloc(PART_IO)))
            break;
        struct sha256_ctx md;
        struct md5_ctx md5;
        sha256_init(&md);
        md5_init(&md5);
        uint64_t got = 0;
        while (got < want) {
            size_t chunk = want - got < PART_IO ? (size_t)(want - got) : PART_IO;
            ssize_t r = pread(m->fd, buf, chunk, (off_t)(off + got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            sha256_update(&md, (size_t)r, buf);
            md5_update(&md5, (size_t)r, buf);
            got += (uint64_t)r;
        }
        if (got != want)
            break;
        unsigned char sha[SHA256_DIGEST_SIZE], mb[MD5_DIGEST_SIZE];
        struct ck_part p = {.number = l->number, .size = want};
        sha256_digest(&md, sizeof sha, sha);
        md5_digest(&md5, sizeof mb, mb);
        ck_codec_base64(p.sha256_b64, sha, 32);
        ck_hex(p.md5, mb, MD5_DIGEST_SIZE);
        char md5_etag[40];
        snprintf(md5_etag, sizeof md5_etag, "\"%s\"", p.md5);
        bool same = l->sha256_b64[0] ? !strcmp(l->sha256_b64, p.sha256_b64)
                                     : !strcasecmp(l->etag, md5_etag);
        if (!same)
            continue; /* sent again: what the service holds is not these bytes */
        snprintf(p.etag, sizeof p.etag, "%s", l->etag);
        if (x->save_part(x->cb_ctx, &p) < 0) {
            ck_error_clear();
            break;
        }
        m->done[p.number - 1] = 1;
        x->parts[x->nparts++] = p;
        atomic_fetch_add(&x->sent, p.size);
        taken++;
    }
    free(buf);
    return taken;
}

static void *part_worker(void *arg)
{
    struct mp *m = arg;
    CURL *h = ck_net_handle(m->s->base.net);
    unsigned char *buf = malloc(PART_IO);
    int err = 0;
    if (!h || !buf) {
        err = ck_error(CK_ENOMEM, "out of memory for a part buffer");
    } else {
        for (int i; (i = next_part(m)) >= 0;) {
            if (ck_upload_ctl_stopping(m->s->base.net->ctl)) {
                err = ck_error(CK_ENET, "'%s': stopped with parts left", m->x->key);
                break;
            }
            if ((err = send_part(m, h, i, buf)) < 0)
                break;
        }
    }
    if (err < 0) {
        pthread_mutex_lock(&m->mu);
        if (m->err == 0) {
            m->err = err;
            snprintf(m->msg, sizeof m->msg, "%s", ck_error_msg());
        }
        pthread_mutex_unlock(&m->mu);
    }
    free(buf);
    if (h)
        curl_easy_cleanup(h);
    return NULL;
}

static int cmp_part(const void *a, const void *b)
{
    return ((const struct ck_part *)a)->number - ((const struct ck_part *)b)->number;
}

/* S3's checksum of a multipart object: base64(SHA-256 of the parts' binary
 * SHA-256s) "-N". */
static int composite_sha256(struct ck_xfer *x, int nparts, char *out, size_t outsz)
{
    unsigned char bin[32];
    char b64[48];
    if ((int)x->nparts != nparts)
        return -1;
    qsort(x->parts, x->nparts, sizeof *x->parts, cmp_part);
    struct sha256_ctx md;
    sha256_init(&md);
    for (int i = 0; i < nparts; i++) {
        const char *part_b64 = x->parts[i].sha256_b64;
        uint8_t pb[BASE64_DECODE_LENGTH(sizeof x->parts[i].sha256_b64)];
        size_t n = 0;
        struct base64_decode_ctx dc;
        base64_decode_init(&dc);
        if (!base64_decode_update(&dc, &n, pb, strlen(part_b64), part_b64) ||
            !base64_decode_final(&dc) || n != SHA256_DIGEST_SIZE)
            return -1;
        sha256_update(&md, n, pb);
    }
    sha256_digest(&md, sizeof bin, bin);
    ck_codec_base64(b64, bin, 32);
    snprintf(out, outsz, "%s-%d", b64, nparts);
    return 0;
}

/* Whether every part (sorted, all there) has the MD5 send_part took. */
static bool parts_have_md5(const struct ck_xfer *x, int nparts)
{
    if ((int)x->nparts != nparts)
        return false;
    for (int i = 0; i < nparts; i++)
        if (strlen(x->parts[i].md5) != 32)
            return false;
    return true;
}

/* The "md5(md5s)-N" ETag of AWS-style services, from the parts' MD5s. */
static void composite_md5(const struct ck_xfer *x, int nparts, char *out, size_t outsz)
{
    struct md5_ctx comb;
    unsigned char bin[MD5_DIGEST_SIZE];
    char hex[33];
    md5_init(&comb);
    for (int i = 0; i < nparts; i++) {
        ck_codec_unhex(bin, MD5_DIGEST_SIZE, x->parts[i].md5);
        md5_update(&comb, sizeof bin, bin);
    }
    md5_digest(&comb, sizeof bin, bin);
    ck_hex(hex, bin, MD5_DIGEST_SIZE);
    snprintf(out, outsz, "\"%s-%d\"", hex, nparts);
}

/* Whether every part's ETag (as the service answered it) is its MD5. */
static bool part_etags_are_md5s(const struct ck_xfer *x, int nparts)
{
    for (int i = 0; i < nparts; i++) {
        const char *e = x->parts[i].etag;
        size_t n = strlen(e);
        if (n >= 2 && e[0] == '"' && e[n - 1] == '"')
            e++, n -= 2;
        if (n != 32 || strncasecmp(e, x->parts[i].md5, 32) != 0)
            return false;
    }
    return true;
}

/* After a multipart upload: the size, then S3's own checksum of the object
 * when the service returns it (x-amz-checksum-mode), else the ETag against
 * MD5s. An AWS-style "md5(md5s)-N" ETag is checked against the parts' MD5s
 * that send_part took (a pass over the file only for parts recorded without
 * one); a whole-body MD5 ETag (s3rver and a few others) is accepted when
 * every part's ETag was that part's MD5 (the same proof the composite gives
 * AWS), else checked against the file's MD5 (one more read). */
static int verify_multipart(struct s3 *s, CURL *h, struct ck_xfer *x, int nparts)
{
    char want[80];
    if (composite_sha256(x, nparts, want, sizeof want) < 0)
        return ck_error(CK_ENET, "'%s': the recorded parts do not cover the file", x->key);
    struct ck_resp resp;
    int err = head_stored(s, h, x, want, &resp);
    if (err == 0 && !resp.checksum_sha256[0]) {
        bool whole = !strchr(resp.etag, '-');
        bool have = parts_have_md5(x, nparts); /* sorted by composite_sha256 */
        struct md5job now = {.path = x->path, .part_size = x->part_size, .whole = whole};
        if (whole && have && part_etags_are_md5s(x, nparts)) {
            /* each part landed as sent */
        } else if (!whole && have) {
            composite_md5(x, nparts, now.etag, sizeof now.etag);
        } else {
            err = md5_etags(&now);
        }
        if (err == 0 && now.etag[0])
            err = etag_is(x, &resp, now.etag);
    }
    if (err == 0)
        x->check = resp.checksum_sha256[0] ? "sha256" : "md5";
    ck_resp_release(&resp);
    return err;
}

static int complete_upload(struct s3 *s, CURL *h, struct ck_xfer *x, int nparts)
{
    struct ck_buf body = CK_BUF_INIT;
    char url[8192], enc_id[600], query[700], sha_hex[65];
    unsigned char sha[32];
    int err;
    qsort(x->parts, x->nparts, sizeof *x->parts, cmp_part);
    ck_buf_puts(&body,
                "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">");
    for (int i = 0; i < nparts; i++) {
        const struct ck_part *p = &x->parts[i];
        ck_buf_printf(&body,
                      "<Part><ChecksumSHA256>%s</ChecksumSHA256><ETag>%s</ETag>"
                      "<PartNumber>%d</PartNumber></Part>",
                      p->sha256_b64, p->etag, p->number);
    }
    ck_buf_puts(&body, "</CompleteMultipartUpload>");
    sha256_bin(body.data, body.len, sha);
    ck_hex(sha_hex, sha, 32);
    if ((err = ck_store_encode(enc_id, sizeof enc_id, x->upload_id, false)) < 0)
        goto out;
    snprintf(query, sizeof query, "uploadId=%s", enc_id);
    if ((err = object_url(s, x->key, query, url, sizeof url)) < 0)
        goto out;
    struct curl_slist *hd = base_headers(s, sha_hex);
    hd = curl_slist_append(hd, "Content-Type: application/xml");
    struct ck_req r = {.method = "POST",
                       .url = url,
                       .headers = hd,
                       .fd = -1,
                       .mem = body.data,
                       .mem_len = body.len,
                       .setup = s3_setup,
                       .setup_ctx = s,
                       .what = x->key};
    struct ck_resp resp;
    ck_resp_init(&resp);
    /* S3 may answer 200 with an <Error> body: that is a failure (and retryable) */
    for (int tries = 0;; tries++) {
        err = s3_request(s, h, &r, &resp);
        if (err == 0 && strstr(ck_buf_str(&resp.body), "<Error>")) {
            char code[64] = "";
            ck_xml_tag(ck_buf_str(&resp.body), "Code", code, sizeof code);
            err = ck_error(CK_ENET, "'%s': CompleteMultipartUpload failed: %s", x->key, code);
            if (tries < s->base.net->opts->retries && ck_net_is_retryable(500, code))
                continue;
        }
        break;
    }
    if (err < 0 && !strcmp(resp.code, "NoSuchUpload"))
        err = CK_ENOENT;
    ck_resp_release(&resp);
    curl_slist_free_all(hd);
out:
    ck_buf_release(&body);
    return err;
}

static int put_multipart(struct s3 *s, struct ck_xfer *x)
{
    const struct ck_upload_opts *o = s->base.net->opts;
    uint64_t ps = o->part_size < MIN_PART ? MIN_PART : o->part_size;
    while ((x->size + ps - 1) / ps > MAX_PARTS)
        ps *= 2;
    CURL *h = ck_net_handle(s->base.net);
    struct mp m = {.s = s, .x = x, .fd = -1};
    int err = 0;
    if (!h)
        return ck_error(CK_ENOMEM, "cannot create a curl handle");
    pthread_mutex_init(&m.mu, NULL);
    bool resuming = x->upload_id[0] && x->part_size;
    for (int round = 0; round < 2; round++) {
        if (round > 0 && (err = ck_xfer_body_again(x)) < 0)
            break;
        if (!x->upload_id[0] || !x->part_size) {
            x->nparts = 0;
            if ((err = create_upload(s, h, x, ps)) < 0)
                break;
        }
        m.nparts = (int)((x->size + x->part_size - 1) / x->part_size);
        free(m.done);
        m.done = calloc((size_t)m.nparts, 1);
        size_t cap = (size_t)m.nparts > x->nparts ? (size_t)m.nparts : x->nparts;
        struct ck_part *parts = realloc(x->parts, cap * sizeof *parts);
        if (!m.done || !parts) {
            if (parts)
                x->parts = parts;
            err = ck_error(CK_ENOMEM, "out of memory");
            break;
        }
        x->parts = parts;
        /* keep the parts an earlier run had accepted (when they fit this file) */
        size_t kept = 0;
        for (size_t i = 0; i < x->nparts; i++) {
            struct ck_part *p = &x->parts[i];
            uint64_t off = (uint64_t)(p->number - 1) * x->part_size;
            uint64_t want = x->size - off < x->part_size ? x->size - off : x->part_size;
            if (p->number < 1 || p->number > m.nparts || p->size != want || m.done[p->number - 1])
                continue;
            m.done[p->number - 1] = 1;
            x->parts[kept++] = *p;
        }
        x->nparts = kept;
        for (size_t i = 0; i < kept; i++)
            atomic_fetch_add(&x->sent, x->parts[i].size);
        if ((m.fd = open(x->path, O_RDONLY | O_CLOEXEC)) < 0) {
            err = ck_error_os(CK_EIO, "cannot open '%s'", x->path);
            break;
        }
        if (fstat(m.fd, &m.start) < 0) {
            err = ck_error_os(CK_EIO, "cannot stat '%s'", x->path);
            break;
        }
        /* parts an earlier run sent are of the file as queued (the queue
         * starts over when its size or mtime changed since): this run's
         * must be of the same, or the object would mix the two */
        if (kept && ((uint64_t)m.start.st_size != x->size ||
                     (x->mtime_ns && ck_mtime_ns(&m.start) != x->mtime_ns))) {
            err = ck_error(CK_ECHANGED, "'%s' changed since it was queued", x->path);
            break;
        }
        /* an upload an earlier run began: the service's list of its parts,
         * not only the record (a part may have landed unrecorded) */
        size_t listed_n = 0, adopted = 0;
        if (resuming && round == 0 && (int)kept < m.nparts) {
            struct ck_part *listed = NULL;
            if (list_parts(s, h, x, &listed, &listed_n) == 0)
                adopted = adopt_listed_parts(&m, listed, listed_n);
            else {
                /* the record alone, as before; a vanished upload shows below */
                ck_warn("upload.list_parts_failed", "key=\"%s\" error=\"%s\": resuming from the "
                        "record only", x->key, ck_error_msg());
                ck_error_clear();
            }
            free(listed);
            kept = x->nparts;
        }
        x->parts_resumed = (int)kept;
        if (kept)
            ck_info("upload.resume",
                    "key=\"%s\" parts_accepted=%zu parts_total=%d parts_listed=%zu "
                    "parts_unrecorded_taken=%zu",
                    x->key, kept, m.nparts, listed_n, adopted);
        if ((int)kept == m.nparts && round == 0) {
            /* every part was accepted before: an earlier run may have completed the
             * upload and died before recording it; if the object is there, done */
            if (verify_multipart(s, h, x, m.nparts) == 0) {
                ck_info("upload.already_complete", "key=\"%s\"", x->key);
                close(m.fd);
                m.fd = -1;
                err = 0;
                break;
            }
            ck_error_clear();
        }
        int nt = o->concurrency < 1 ? 1 : o->concurrency;
        if (nt > m.nparts - (int)kept)
            nt = m.nparts - (int)kept;
        pthread_t th[64];
        int started = 0;
        m.next = 0;
        m.err = 0;
        for (int i = 0; i < nt && i < 64; i++)
            if (pthread_create(&th[i], NULL, part_worker, &m) == 0)
                started++;
        for (int i = 0; i < started; i++)
            pthread_join(th[i], NULL);
        close(m.fd);
        m.fd = -1;
        if (m.err < 0) {
            err = ck_error(m.err, "%s", m.msg);
            break;
        }
        if (nt > 0 && started == 0) {
            err = ck_error(CK_ERR, "cannot start the part threads");
            break;
        }
        ck_xfer_body_sent(x);
        err = complete_upload(s, h, x, m.nparts);
        if (err == CK_ENOENT) {
            /* NoSuchUpload: either an earlier run completed it and died before
             * recording that, or the upload was aborted: check, else start over */
            if (verify_multipart(s, h, x, m.nparts) == 0) {
                err = 0;
                break;
            }
            ck_warn("upload.restart", "key=\"%s\" reason=\"the multipart upload is gone\"", x->key);
            x->upload_id[0] = '\0';
            x->nparts = 0;
            atomic_store(&x->sent, 0);
            if ((err = x->save_upload(x->cb_ctx, "", 0)) < 0)
                break;
            err = ck_error(CK_ENET, "'%s': the multipart upload vanished twice", x->key);
            continue;
        }
        if (err == 0)
            err = verify_multipart(s, h, x, m.nparts);
        break;
    }
    /* the parts were hashed one by one, never the whole file: record the
     * SHA-256 the agent took at registration when it is this file's (as
     * HTTP and SFTP do, stores/source.h) */
    struct stat st;
    if (err == 0 && stat(x->path, &st) == 0 && ck_source_known_for(x, &st))
        memcpy(x->sha256, x->known_sha256, sizeof x->sha256);
    free(m.done);
    pthread_mutex_destroy(&m.mu);
    curl_easy_cleanup(h);
    return err;
}

static int s3_put(struct ck_store *st, struct ck_xfer *x)
{
    struct s3 *s = (struct s3 *)st;
    /* A commit object (x->atomic: metadata.yaml, sent last) must appear whole
     * or not at all. A single PUT does that on S3, RGW and MinIO: the body's
     * SHA-256 is signed and its checksum sent, so a body cut short is refused,
     * and it is one request (If-None-Match applies to it, not to a multipart
     * Complete on RGW). A server that stores the first bytes of a PUT whose
     * client died (s3rver) needs commit: multipart, where the object appears
     * only at Complete. */
    bool commit_multipart = x->atomic && s->base.spec->commit_multipart;
    /* a conditional write is one PUT whatever the size: RGW ignores
     * If-None-Match on CompleteMultipartUpload (docs/multinode.md) */
    if (x->if_absent) {
        x->same_bytes = false;
        if (x->size > S3_SINGLE_PUT_MAX)
            return ck_error(CK_ESIZE, "'%s': %llu bytes: a conditional write is one PUT, at most "
                                      "5 GiB", x->key, (unsigned long long)x->size);
        return put_single(s, x);
    }
    if ((commit_multipart || x->size >= s->base.net->opts->multipart_threshold) && x->size > 0)
        return put_multipart(s, x);
    return put_single(s, x);
}

/* One bodiless request on an object (HEAD, GET into sink, DELETE): resp is
 * the caller's, initialised here, to release. A 404 is CK_ENOENT naming the
 * key. */
static int object_request_q(struct s3 *s, const char *method, const char *key, const char *query,
                            int (*sink)(void *, const void *, size_t), void *sink_ctx,
                            struct ck_resp *resp)
{
    char url[8192];
    ck_resp_init(resp);
    int err = object_url(s, key, query, url, sizeof url);
    if (err < 0)
        return err;
    CURL *h = ck_net_handle(s->base.net);
    if (!h)
        return ck_error(CK_ENOMEM, "cannot create a curl handle");
    struct curl_slist *hd = base_headers(s, EMPTY_SHA256);
    struct ck_req r = {.method = method, .url = url, .headers = hd, .fd = -1,
                       .setup = s3_setup, .setup_ctx = s, .what = key,
                       .sink = sink, .sink_ctx = sink_ctx};
    err = s3_request(s, h, &r, resp);
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    if (err < 0 && resp->status == 404)
        err = ck_error(CK_ENOENT, "'%s': the store does not have it (HTTP 404)", key);
    return err;
}

static int object_request(struct s3 *s, const char *method, const char *key,
                          int (*sink)(void *, const void *, size_t), void *sink_ctx,
                          struct ck_resp *resp)
{
    return object_request_q(s, method, key, NULL, sink, sink_ctx, resp);
}

/* The ETag as an MD5 (lower case hex) when it has the form of one (a single
 * PUT without SSE-KMS; a multipart object's "MD5-N" is not); "" otherwise. */
static void etag_md5(const char *e, char md5[33])
{
    size_t el = strlen(e);
    md5[0] = '\0';
    if (el == 34 && e[0] == '"' && e[33] == '"') {
        e++;
        el = 32;
    }
    bool hex = el == 32;
    for (size_t i = 0; hex && i < 32; i++)
        hex = strchr("0123456789abcdefABCDEF", e[i]) != NULL;
    if (!hex)
        return;
    for (size_t i = 0; i < 32; i++)
        md5[i] = (char)(e[i] >= 'A' && e[i] <= 'F' ? e[i] - 'A' + 'a' : e[i]);
    md5[32] = '\0';
}

/* HEAD: the size, and the ETag as an MD5 when it has the form of one. */
static int s3_stat(struct ck_store *st, const char *key, struct ck_remote_obj *out)
{
    struct ck_resp resp;
    int err = object_request((struct s3 *)st, "HEAD", key, NULL, NULL, &resp);
    if (err == 0 && resp.length < 0)
        err = ck_error(CK_ENET, "'%s': the store did not say the stored size", key);
    out->size = resp.length;
    if (err == 0)
        etag_md5(resp.etag, out->md5);
    ck_resp_release(&resp);
    return err;
}

/* One page of a ListObjectsV2 answer (docs in stores/store.h). */
int ck_s3_list_objects_parse(const char *body, const char *strip, struct ck_remote_list *l,
                             bool *truncated, char *next, size_t nextsz)
{
    size_t sl = strlen(strip);
    int err;
    *truncated = false;
    next[0] = '\0';
    for (const char *a = strstr(body, "<Contents>"); a; a = strstr(a, "<Contents>")) {
        const char *b = strstr(a, "</Contents>");
        if (!b)
            break;
        char blk[8192], key[6144], size[24], etag[80] = "", md5[33];
        size_t len = (size_t)(b - a);
        const char *from = a;
        a = b + 11;
        if (len >= sizeof blk)
            continue;
        memcpy(blk, from, len);
        blk[len] = '\0';
        if (!ck_xml_tag(blk, "Key", key, sizeof key) || !ck_xml_tag(blk, "Size", size, sizeof size))
            continue;
        char *end;
        errno = 0;
        unsigned long long z = strtoull(size, &end, 10);
        if (*end || !size[0] || size[0] == '-' || errno || z > INT64_MAX)
            continue;
        if (strncmp(key, strip, sl) != 0 || !key[sl])
            continue;
        ck_xml_tag(blk, "ETag", etag, sizeof etag);
        etag_md5(etag, md5);
        if ((err = ck_remote_list_add(l, key + sl, (int64_t)z, md5)) < 0)
            return err;
    }
    char trunc[8] = "";
    if (ck_xml_tag(body, "IsTruncated", trunc, sizeof trunc) && !strcmp(trunc, "true")) {
        *truncated = true;
        if (!ck_xml_tag(body, "NextContinuationToken", next, nextsz) || !next[0])
            return ck_error(CK_EFORMAT, "a listing says more follows but gives no token for it");
    }
    return 0;
}

/* ListObjectsV2 under the folder prefix, every page: 100 keys a page, so
 * that a page (keys up to 1024 bytes, entities included) fits the 1 MiB a
 * response keeps. */
static int s3_list(struct ck_store *st, const char *prefix, struct ck_remote_list *out)
{
    struct s3 *s = (struct s3 *)st;
    char full[2048], folder[2100], strip[1100], enc[6400], token[1024] = "", enc_tok[3100];
    char query[10000], url[11000];
    int err;
    if ((err = ck_store_join_key(full, sizeof full, s->prefix, prefix)) < 0)
        return err;
    size_t fl = strlen(full);
    snprintf(folder, sizeof folder, "%s%s", full, fl && full[fl - 1] != '/' ? "/" : "");
    snprintf(strip, sizeof strip, "%s%s", s->prefix, s->prefix[0] ? "/" : "");
    if ((err = ck_store_encode(enc, sizeof enc, folder, false)) < 0)
        return err;
    CURL *h = ck_net_handle(s->base.net);
    if (!h)
        return ck_error(CK_ENOMEM, "cannot create a curl handle");
    /* a server that always says more follows is stopped at the list's maximum */
    for (int page = 0;; page++) {
        if (page > CK_STORE_LIST_MAX / 100) {
            err = ck_error(CK_ESIZE, "'%s': more than %d listing pages", folder,
                           CK_STORE_LIST_MAX / 100);
            break;
        }
        /* canonical order: continuation-token < list-type < max-keys < prefix */
        if (token[0] && (err = ck_store_encode(enc_tok, sizeof enc_tok, token, false)) < 0)
            break;
        snprintf(query, sizeof query, "%s%s%slist-type=2&max-keys=100&prefix=%s",
                 token[0] ? "continuation-token=" : "", token[0] ? enc_tok : "",
                 token[0] ? "&" : "", enc);
        int n = snprintf(url, sizeof url, "%s/%s?%s", s->endpoint, s->bucket, query);
        if (n < 0 || (size_t)n >= sizeof url) {
            err = ck_error(CK_ESIZE, "'%s': the listing URL is too long", prefix);
            break;
        }
        struct curl_slist *hd = base_headers(s, EMPTY_SHA256);
        struct ck_req r = {.method = "GET", .url = url, .headers = hd, .fd = -1,
                           .setup = s3_setup, .setup_ctx = s, .what = folder};
        struct ck_resp resp;
        ck_resp_init(&resp);
        err = s3_request(s, h, &r, &resp);
        curl_slist_free_all(hd);
        bool more = false;
        if (err == 0 && resp.body.len >= (1u << 20) - 1)
            err = ck_error(CK_EFORMAT, "'%s': a listing page over 1 MiB", folder);
        if (err == 0)
            err = ck_s3_list_objects_parse(ck_buf_str(&resp.body), strip, out, &more, token,
                                           sizeof token);
        ck_resp_release(&resp);
        if (err < 0 || !more)
            break;
    }
    curl_easy_cleanup(h);
    return err;
}

static int s3_get(struct ck_store *st, const char *key, int fd)
{
    struct ck_resp resp;
    struct ck_fd_sink sink = {fd, -1};
    int err = object_request((struct s3 *)st, "GET", key, ck_fd_sink_write, &sink, &resp);
    ck_resp_release(&resp);
    return err;
}

/* DELETE (remote retention): 204, and 404 (gone already) is fine too. */
static int s3_del(struct ck_store *st, const char *key)
{
    struct ck_resp resp;
    int err = object_request((struct s3 *)st, "DELETE", key, NULL, NULL, &resp);
    if (err == CK_ENOENT) {
        ck_error_clear();
        err = 0;
    }
    ck_resp_release(&resp);
    return err;
}

/* AbortMultipartUpload: the parts of an upload ckptd will not complete
 * (its file changed or went, its job was replaced) are kept, and billed, by
 * the service until it is aborted or a lifecycle rule expires it. NoSuchUpload
 * (404) is done already. */
static int s3_abort_upload(struct ck_store *st, const char *key, const char *upload_id)
{
    char enc_id[600], query[720];
    int err = ck_store_encode(enc_id, sizeof enc_id, upload_id, false);
    if (err < 0)
        return err;
    snprintf(query, sizeof query, "uploadId=%s", enc_id);
    struct ck_resp resp;
    err = object_request_q((struct s3 *)st, "DELETE", key, query, NULL, NULL, &resp);
    if (err == CK_ENOENT) {
        ck_error_clear();
        err = 0;
    }
    ck_resp_release(&resp);
    return err;
}

const struct ck_store_ops ck_store_s3 = {
    .scheme = "s3",
    .uses_curl = true,
    .if_absent = true,
    .check = s3_check,
    .open = s3_open,
    .put = s3_put,
    .stat = s3_stat,
    .get = s3_get,
    .del = s3_del,
    .abort_upload = s3_abort_upload,
    .list = s3_list,
    .free = s3_free,
};
