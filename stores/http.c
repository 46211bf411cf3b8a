/* http(s)://host/path: PUT (WebDAV servers, artifact servers, presigned
 * URLs). The object goes to a temporary name beside the final one and is
 * MOVEd into place, so a reader never sees half an object; a server without
 * MOVE gets a PUT to the final name (and the temporary is deleted). A URL with
 * a query (a presigned URL) names the object itself: one PUT, no MOVE.
 * Afterwards a HEAD checks the size. The SHA-256 of what was sent is computed
 * on a second thread while the body streams (nginx and most servers have no
 * hash to compare it with; it is recorded in the queue). */
#include "common/error.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/secret.h"
#include "stores/net.h"
#include "stores/source.h"
#include "stores/store.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct http {
    struct ck_store base;
    char base_url[4096]; /* without a trailing '/' */
    bool exact;          /* the URL names the object (presigned) */
    bool bearer;
    char *user, *password, *token; /* owned; wiped */
};

static int http_check(const struct ck_store_spec *spec)
{
    const char *u = spec->url;
    const char *host = strstr(u, "://") + 3;
    if (!*host || *host == '/')
        return ck_error(CK_ECONFIG, "store '%.40s...': no host in the URL", u);
    if (strchr(host, '@') &&
        strchr(host, '@') < (strchr(host, '/') ? strchr(host, '/') : host + strlen(host)))
        return ck_error(CK_ECONFIG, "store: put no user or password in an http URL: use "
                                    "'credentials: env:NAME' or 'file:/path'");
    if (spec->auth && strcmp(spec->auth, "basic") && strcmp(spec->auth, "bearer"))
        return ck_error(CK_ECONFIG, "store: auth must be 'basic' or 'bearer'");
    if (spec->auth && !spec->credentials)
        return ck_error(CK_ECONFIG, "store: auth '%s' needs credentials (env:NAME or file:/path)",
                        spec->auth);
    if (spec->credentials)
        return ck_secret_check_ref(spec->credentials);
    return 0;
}

static void http_free(struct ck_store *st)
{
    struct http *s = (struct http *)st;
    ck_secret_free(s->user);
    ck_secret_free(s->password);
    ck_secret_free(s->token);
    free(s);
}

static int http_open(struct ck_store **out, const struct ck_store_spec *spec, struct ck_net *net)
{
    struct http *s = calloc(1, sizeof *s);
    int err = 0;
    if (!s)
        return ck_error(CK_ENOMEM, "out of memory");
    snprintf(s->base_url, sizeof s->base_url, "%s", spec->url);
    s->exact = strchr(spec->url, '?') != NULL;
    size_t l = strlen(s->base_url);
    while (!s->exact && l && s->base_url[l - 1] == '/')
        s->base_url[--l] = '\0';
    if (spec->credentials) {
        char *secret = NULL;
        if ((err = ck_secret_load(spec->credentials, &secret)) < 0) {
            http_free(&s->base);
            return err;
        }
        s->bearer = spec->auth && !strcmp(spec->auth, "bearer");
        if (s->bearer) {
            s->token = secret;
        } else {
            char *colon = strchr(secret, ':');
            if (!colon) {
                ck_secret_free(secret);
                http_free(&s->base);
                return ck_error(CK_ECONFIG, "credentials '%s': basic auth needs 'user:password'",
                                spec->credentials);
            }
            *colon = '\0';
            s->user = strdup(secret);
            s->password = strdup(colon + 1);
            ck_secret_free(secret);
        }
    }
    *out = &s->base;
    return 0;
}

static void http_setup(CURL *h, void *ctx)
{
    struct http *s = ctx;
    if (s->token) {
        curl_easy_setopt(h, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
        curl_easy_setopt(h, CURLOPT_XOAUTH2_BEARER, s->token);
    } else if (s->user) {
        curl_easy_setopt(h, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
        curl_easy_setopt(h, CURLOPT_USERNAME, s->user);
        curl_easy_setopt(h, CURLOPT_PASSWORD, s->password);
    }
}

static int request(struct http *s, CURL *h, const char *method, const char *url,
                   struct curl_slist *hd, const char *what, struct ck_resp *resp, const long *ok)
{
    struct ck_req r = {.method = method,
                       .url = url,
                       .headers = hd,
                       .fd = -1,
                       .setup = http_setup,
                       .setup_ctx = s,
                       .what = what};
    return ck_net_request(s->base.net, h, &r, resp, ok);
}

/* MKCOL every folder of url's path below the store's base (for WebDAV
 * servers that do not create them on PUT). Existing folders answer 405. */
static int make_parents(struct http *s, CURL *h, const char *url, const char *what)
{
    static const long ok[] = {405, 301, 0};
    char dir[8192];
    size_t base = strlen(s->base_url);
    snprintf(dir, sizeof dir, "%s", url);
    for (char *p = dir + base + 1; (p = strchr(p, '/')) != NULL; p++) {
        char saved = p[1];
        p[1] = '\0';
        struct ck_resp resp;
        ck_resp_init(&resp);
        int err = request(s, h, "MKCOL", dir, NULL, what, &resp, ok);
        ck_resp_release(&resp);
        p[1] = saved;
        if (err < 0)
            return err;
    }
    return 0;
}

static int put_body(struct http *s, CURL *h, struct ck_xfer *x, int fd, const char *url,
                    struct curl_slist *hd)
{
    static const long ok[] = {0};
    struct ck_req r = {.method = "PUT",
                       .url = url,
                       .headers = hd,
                       .fd = fd,
                       .len = x->size,
                       .upload = true,
                       .progress = &x->sent,
                       .setup = http_setup,
                       .setup_ctx = s,
                       .what = x->key};
    struct ck_resp resp;
    ck_resp_init(&resp);
    int err = ck_net_request(s->base.net, h, &r, &resp, ok);
    if (err < 0 && resp.status == 409 && !s->exact) {
        /* WebDAV: a missing parent folder is 409 Conflict */
        ck_resp_release(&resp);
        if ((err = make_parents(s, h, url, x->key)) < 0)
            return err;
        ck_resp_init(&resp);
        err = ck_net_request(s->base.net, h, &r, &resp, ok);
    }
    ck_resp_release(&resp);
    return err;
}

static int http_put(struct ck_store *st, struct ck_xfer *x)
{
    struct http *s = (struct http *)st;
    char enc[6144], final[10300], tmp[10400], hdr[10500];
    struct curl_slist *hd = NULL, *mv = NULL;
    struct ck_source src = {.fd = -1};
    int err;
    CURL *h = ck_net_handle(s->base.net);
    if (!h)
        return ck_error(CK_ENOMEM, "cannot create a curl handle");
    if (s->exact) {
        snprintf(final, sizeof final, "%s", s->base_url);
    } else {
        if ((err = ck_store_encode(enc, sizeof enc, x->key, true)) < 0)
            goto out;
        if (snprintf(final, sizeof final, "%s/%s", s->base_url, enc) >= (int)sizeof final) {
            err = ck_error(CK_ESIZE, "'%s': the URL is too long", x->key);
            goto out;
        }
    }
    /* the temporary: ".NAME.ckptd-ID.part" in the same folder */
    const char *slash = strrchr(final, '/');
    snprintf(tmp, sizeof tmp, "%.*s/.%s.ckptd-%lld.part", (int)(slash - final), final, slash + 1,
             (long long)x->id);
    bool move = !s->exact && !s->base.spec->no_move;
    if ((err = ck_source_open(&src, x)) < 0)
        goto out;
    /* libcurl's own Expect: 100-continue for bodies over 1 MiB stays: the
     * server can refuse (401, 409 for a missing folder) before the body goes,
     * and nginx takes a body announced that way faster (64 files of 16 MiB:
     * 1.3 s instead of 1.6 s with four transfers at once) */
    hd = curl_slist_append(hd, "Content-Type: application/octet-stream");
    if (x->orig_sha256) {
        snprintf(hdr, sizeof hdr, "X-Ckptd-Original-Sha256: %s", x->orig_sha256);
        hd = curl_slist_append(hd, hdr);
    }
    if ((err = put_body(s, h, x, src.fd, move ? tmp : final, hd)) < 0)
        goto out;
    ck_xfer_body_sent(x);
    /* a file written while it was read left a mix of its bytes in the
     * temporary: never moved into place */
    if (move && (err = ck_source_check_unchanged(&src, x)) < 0) {
        static const long gone[] = {404, 0};
        struct ck_resp resp;
        ck_resp_init(&resp);
        int derr = request(s, h, "DELETE", tmp, NULL, x->key, &resp, gone);
        ck_resp_release(&resp);
        if (derr < 0) /* the first error is the one to report */
            err = ck_error(CK_ECHANGED, "'%s' changed while it was uploaded", x->path);
        goto out;
    }
    if (move) {
        static const long ok[] = {0};
        struct ck_resp resp;
        snprintf(hdr, sizeof hdr, "Destination: %s", final);
        mv = curl_slist_append(mv, hdr);
        mv = curl_slist_append(mv, "Overwrite: T");
        ck_resp_init(&resp);
        err = request(s, h, "MOVE", tmp, mv, x->key, &resp, ok);
        long status = resp.status;
        ck_resp_release(&resp);
        if (err < 0 && (status == 405 || status == 501 || status == 400)) {
            ck_warn("upload.no_move",
                    "key=\"%s\" http_status=%ld: the server has no MOVE, putting "
                    "to the final name",
                    x->key, status);
            static const long gone[] = {404, 0};
            ck_resp_init(&resp);
            request(s, h, "DELETE", tmp, NULL, x->key, &resp, gone);
            ck_resp_release(&resp);
            atomic_store(&x->sent, 0);
            if ((err = ck_xfer_body_again(x)) == 0) {
                err = put_body(s, h, x, src.fd, final, hd);
                ck_xfer_body_sent(x);
            }
        }
        if (err < 0)
            goto out;
    }
    /* the size that landed; a presigned PUT URL cannot be HEADed with its signature */
    if (!s->exact) {
        struct ck_resp resp;
        ck_resp_init(&resp);
        err = request(s, h, "HEAD", final, NULL, x->key, &resp, NULL);
        if (err == 0 && resp.length >= 0 && (uint64_t)resp.length != x->size)
            err = ck_error(CK_ENET, "'%s': the server has %lld bytes, %llu were sent", x->key,
                           (long long)resp.length, (unsigned long long)x->size);
        else if (err == 0 && resp.length < 0)
            err = ck_error(CK_ENET, "'%s': the server did not say the stored size", x->key);
        ck_resp_release(&resp);
        if (err < 0)
            goto out;
    }
    x->check = s->exact ? "none" : "size";
    if ((err = ck_source_check_unchanged(&src, x)) < 0)
        goto out;
    x->parts_sent = 1;
out:
    err = ck_source_finish(&src, x, err);
    curl_slist_free_all(hd);
    curl_slist_free_all(mv);
    curl_easy_cleanup(h);
    return err;
}

static int object_url(struct http *s, const char *key, char *out, size_t outsz)
{
    char enc[6144];
    int err;
    if (s->exact)
        return ck_error(CK_ERR, "store '%s': a presigned URL cannot be read back",
                        s->base.spec->url);
    if ((err = ck_store_encode(enc, sizeof enc, key, true)) < 0)
        return err;
    if (snprintf(out, outsz, "%s/%s", s->base_url, enc) >= (int)outsz)
        return ck_error(CK_ESIZE, "'%s': the URL is too long", key);
    return 0;
}

/* One bodiless request on an object (HEAD, DELETE): resp is the caller's,
 * initialised here, to release. A 404 is CK_ENOENT naming the key. */
static int object_request(struct http *s, const char *method, const char *key,
                          struct ck_resp *resp)
{
    char url[10300];
    ck_resp_init(resp);
    int err = object_url(s, key, url, sizeof url);
    if (err < 0)
        return err;
    CURL *h = ck_net_handle(s->base.net);
    if (!h)
        return ck_error(CK_ENOMEM, "cannot create a curl handle");
    err = request(s, h, method, url, NULL, key, resp, NULL);
    curl_easy_cleanup(h);
    if (err < 0 && resp->status == 404)
        err = ck_error(CK_ENOENT, "'%s': the store does not have it (HTTP 404)", key);
    return err;
}

static int http_stat(struct ck_store *st, const char *key, struct ck_remote_obj *out)
{
    struct ck_resp resp;
    int err = object_request((struct http *)st, "HEAD", key, &resp);
    if (err == 0 && resp.length < 0)
        err = ck_error(CK_ENET, "'%s': the server did not say the stored size", key);
    out->size = resp.length;
    ck_resp_release(&resp);
    return err; /* an ETag here is mtime-size (nginx), not a checksum: read it back */
}

static int http_get(struct ck_store *st, const char *key, int fd)
{
    struct http *s = (struct http *)st;
    char url[10300];
    struct ck_resp resp;
    struct ck_fd_sink sink = {fd, -1};
    int err = object_url(s, key, url, sizeof url);
    if (err < 0)
        return err;
    CURL *h = ck_net_handle(s->base.net);
    if (!h)
        return ck_error(CK_ENOMEM, "cannot create a curl handle");
    struct ck_req r = {.method = "GET", .url = url, .fd = -1, .setup = http_setup,
                       .setup_ctx = s, .what = key, .sink = ck_fd_sink_write,
                       .sink_ctx = &sink};
    ck_resp_init(&resp);
    err = ck_net_request(s->base.net, h, &r, &resp, NULL);
    if (err < 0 && resp.status == 404)
        err = ck_error(CK_ENOENT, "'%s': the store does not have it (HTTP 404)", key);
    ck_resp_release(&resp);
    curl_easy_cleanup(h);
    return err;
}

static int http_del(struct ck_store *st, const char *key)
{
    struct ck_resp resp;
    int err = object_request((struct http *)st, "DELETE", key, &resp);
    if (err == CK_ENOENT) {
        ck_error_clear();
        err = 0; /* gone already */
    }
    ck_resp_release(&resp);
    return err;
}

const struct ck_store_ops ck_store_http = {
    .scheme = "http",
    .uses_curl = true,
    .check = http_check,
    .open = http_open,
    .put = http_put,
    .stat = http_stat,
    .get = http_get,
    .del = http_del,
    .free = http_free,
};
const struct ck_store_ops ck_store_https = {
    .scheme = "https",
    .uses_curl = true,
    .check = http_check,
    .open = http_open,
    .put = http_put,
    .stat = http_stat,
    .get = http_get,
    .del = http_del,
    .free = http_free,
};
