/* sftp://user@host[:port]/absolute/path with key authentication and a
 * pinned host key (libcurl accepts any host key without a known_hosts file,
 * so a store without host_key is refused). The object goes to a temporary
 * name, then a rename puts it in place; a listing of the folder then checks
 * the stored size. Key files must have mode 0600. */
#include "common/error.h"
#include "common/hash.h"
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

struct sftp {
    struct ck_store base;
    char origin[1024]; /* sftp://user@host:port */
    char root[4096];   /* absolute path on the server, no trailing '/' */
    char fp[128];      /* host key SHA-256, base64 without padding */
    char *passphrase;  /* owned; wiped */
};

static int split(const char *url, char *origin, size_t osz, char *root, size_t rsz)
{
    const char *host = url + 7; /* "sftp://" */
    const char *slash = strchr(host, '/');
    if (!slash || slash == host)
        return ck_error(CK_ECONFIG, "store '%s': an sftp URL is sftp://user@host/absolute/path",
                        url);
    if ((size_t)(slash - url) >= osz || strlen(slash) >= rsz)
        return ck_error(CK_ECONFIG, "store '%s': the URL is too long", url);
    snprintf(origin, osz, "%.*s", (int)(slash - url), url);
    snprintf(root, rsz, "%s", slash);
    size_t l = strlen(root);
    while (l > 1 && root[l - 1] == '/')
        root[--l] = '\0';
    if (l == 1)
        root[0] = '\0';
    return 0;
}

static int sftp_check(const struct ck_store_spec *spec)
{
    char o[1024], r[4096];
    int err;
    if ((err = split(spec->url, o, sizeof o, r, sizeof r)) < 0)
        return err;
    const char *at = strchr(o + 7, '@');
    if (!at || (strchr(o + 7, ':') && strchr(o + 7, ':') < at))
        return ck_error(CK_ECONFIG,
                        "store '%s': name the user (sftp://user@host/path), no "
                        "password in the URL",
                        spec->url);
    if (strpbrk(spec->url, "?#%\"\n"))
        return ck_error(CK_ECONFIG, "store '%s': an sftp URL takes a plain path", spec->url);
    if (!spec->key_file)
        return ck_error(CK_ECONFIG, "store '%s': sftp needs 'key: /path/to/private_key'",
                        spec->url);
    if (!spec->host_key || strncmp(spec->host_key, "SHA256:", 7) || strlen(spec->host_key) < 40)
        return ck_error(CK_ECONFIG,
                        "store '%s': sftp needs the server's pinned 'host_key: SHA256:...' "
                        "(ssh-keygen -lf the host's public key)",
                        spec->url);
    if (spec->credentials)
        return ck_secret_check_ref(spec->credentials);
    return 0;
}

static void sftp_free(struct ck_store *st)
{
    struct sftp *s = (struct sftp *)st;
    ck_secret_free(s->passphrase);
    free(s);
}

static int sftp_open(struct ck_store **out, const struct ck_store_spec *spec, struct ck_net *net)
{
    struct sftp *s = calloc(1, sizeof *s);
    struct stat st;
    int err;
    if (!s)
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = split(spec->url, s->origin, sizeof s->origin, s->root, sizeof s->root)) < 0)
        goto fail;
    if (stat(spec->key_file, &st) < 0) {
        err = ck_error_os(CK_ECONFIG, "sftp key '%s'", spec->key_file);
        goto fail;
    }
    if (st.st_mode & 077) {
        err = ck_error(CK_ECONFIG, "sftp key '%s' has mode %04o: it must be 0600 or stricter",
                       spec->key_file, (unsigned)(st.st_mode & 07777));
        goto fail;
    }
    snprintf(s->fp, sizeof s->fp, "%s", spec->host_key + 7);
    /* ssh-keygen prints the base64 without padding; libcurl compares it padded */
    if (strlen(s->fp) == 43)
        strcat(s->fp, "=");
    if (spec->credentials && (err = ck_secret_load(spec->credentials, &s->passphrase)) < 0)
        goto fail;
    *out = &s->base;
    return 0;
fail:
    sftp_free(&s->base);
    return err;
}

static void sftp_setup(CURL *h, void *ctx)
{
    struct sftp *s = ctx;
    curl_easy_setopt(h, CURLOPT_SSH_AUTH_TYPES, (long)CURLSSH_AUTH_PUBLICKEY);
    curl_easy_setopt(h, CURLOPT_SSH_PRIVATE_KEYFILE, s->base.spec->key_file);
    curl_easy_setopt(h, CURLOPT_SSH_HOST_PUBLIC_KEY_SHA256, s->fp);
    if (s->passphrase)
        curl_easy_setopt(h, CURLOPT_KEYPASSWD, s->passphrase);
    curl_easy_setopt(h, CURLOPT_FTP_CREATE_MISSING_DIRS, (long)CURLFTP_CREATE_DIR_RETRY);
}

struct post {
    struct sftp *s;
    struct curl_slist *quote;
};

static void sftp_setup_post(CURL *h, void *ctx)
{
    struct post *p = ctx;
    sftp_setup(h, p->s);
    curl_easy_setopt(h, CURLOPT_POSTQUOTE, p->quote);
}

/* The size of name in the listing of dir_url (an "ls -l" style line per
 * entry: the fifth field is the size, the name follows the eighth), -1 when
 * it is not listed. */
static int64_t listed_size(const char *listing, const char *name)
{
    const char *line = listing;
    while (line && *line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[4096];
        if (len < sizeof buf) {
            memcpy(buf, line, len);
            buf[len] = '\0';
            if (len && buf[len - 1] == '\r')
                buf[--len] = '\0';
            char *f[9] = {0}, *p = buf;
            int nf = 0;
            while (nf < 8 && *p) {
                while (*p == ' ')
                    p++;
                f[nf++] = p;
                while (*p && *p != ' ')
                    p++;
                if (*p)
                    *p++ = '\0';
            }
            while (*p == ' ')
                p++;
            if (nf == 8 && !strcmp(p, name))
                return strtoll(f[4], NULL, 10);
        }
        line = end ? end + 1 : NULL;
    }
    return -1;
}

static int sftp_put(struct ck_store *st, struct ck_xfer *x)
{
    struct sftp *s = (struct sftp *)st;
    char path[8192], dir[8192], tmp[8300], enc[8192 * 3], url[30000], q[17000];
    struct post post = {s, NULL};
    struct ck_source src = {.fd = -1};
    int err;
    if (strpbrk(x->key, "\"\n\r"))
        return ck_error(CK_EFORMAT, "'%s': a name with quotes or newlines cannot go over sftp",
                        x->key);
    if ((err = ck_store_join_key(path, sizeof path, s->root, x->key)) < 0)
        return err;
    if (path[0] != '/') {
        memmove(path + 1, path, strlen(path) + 1);
        path[0] = '/';
    }
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    snprintf(tmp, sizeof tmp, "%s/.%s.ckptd-%lld.part", dir, slash + 1, (long long)x->id);
    CURL *h = ck_net_handle(s->base.net);
    if (!h)
        return ck_error(CK_ENOMEM, "cannot create a curl handle");
    if ((err = ck_source_open(&src, x)) < 0)
        goto out;
    /* upload to the temporary, then (in the same session) replace the final name */
    if ((err = ck_store_encode(enc, sizeof enc, tmp, true)) < 0)
        goto out;
    snprintf(url, sizeof url, "%s%s", s->origin, enc);
    snprintf(q, sizeof q, "*rm \"%s\"", path);
    post.quote = curl_slist_append(post.quote, q);
    snprintf(q, sizeof q, "rename \"%s\" \"%s\"", tmp, path);
    post.quote = curl_slist_append(post.quote, q);
    struct ck_req r = {.url = url,
                       .fd = src.fd,
                       .len = x->size,
                       .upload = true,
                       .progress = &x->sent,
                       .setup = sftp_setup_post,
                       .setup_ctx = &post,
                       .what = x->key};
    struct ck_resp resp;
    ck_resp_init(&resp);
    err = ck_net_request(s->base.net, h, &r, &resp, NULL);
    ck_resp_release(&resp);
    if (err < 0)
        goto out;
    ck_xfer_body_sent(x);
    /* list the folder: the final name must be there with the size sent */
    if ((err = ck_store_encode(enc, sizeof enc, dir, true)) < 0)
        goto out;
    snprintf(url, sizeof url, "%s%s/", s->origin, enc);
    struct ck_req lr = {.url = url, .fd = -1, .setup = sftp_setup, .setup_ctx = s, .what = x->key};
    ck_resp_init(&resp);
    err = ck_net_request(s->base.net, h, &lr, &resp, NULL);
    int64_t got = err == 0 ? listed_size(ck_buf_str(&resp.body), slash + 1) : -1;
    ck_resp_release(&resp);
    if (err < 0)
        goto out;
    if (got < 0 || (uint64_t)got != x->size) {
        err = ck_error(CK_ENET, "'%s': the server lists %lld bytes, %llu were sent", x->key,
                       (long long)got, (unsigned long long)x->size);
        goto out;
    }
    x->check = "size";
    if ((err = ck_source_check_unchanged(&src, x)) < 0)
        goto out;
    x->parts_sent = 1;
out:
    err = ck_source_finish(&src, x, err);
    curl_slist_free_all(post.quote);
    curl_easy_cleanup(h);
    return err;
}

static int remote_path(struct sftp *s, const char *key, char *path, size_t pathsz)
{
    if (strpbrk(key, "\"\n\r"))
        return ck_error(CK_EFORMAT, "'%s': a name with quotes or newlines cannot go over sftp",
                        key);
    int err = ck_store_join_key(path, pathsz, s->root, key);
    if (err == 0 && path[0] != '/') {
        if (strlen(path) + 2 > pathsz)
            return ck_error(CK_ESIZE, "'%s': path too long", key);
        memmove(path + 1, path, strlen(path) + 1);
        path[0] = '/';
    }
    return err;
}

/* The listing of the object's folder: its size there (sftp gives no checksum). */
static int sftp_stat(struct ck_store *st, const char *key, struct ck_remote_obj *out)
{
    struct sftp *s = (struct sftp *)st;
    char path[8192], enc[8192 * 3], url[30000];
    struct ck_resp resp;
    int err = remote_path(s, key, path, sizeof path);
    if (err < 0)
        return err;
    const char *slash = strrchr(path, '/');
    char dir[8192];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if ((err = ck_store_encode(enc, sizeof enc, dir, true)) < 0)
        return err;
    snprintf(url, sizeof url, "%s%s/", s->origin, enc);
    CURL *h = ck_net_handle(s->base.net);
    if (!h)
        return ck_error(CK_ENOMEM, "cannot create a curl handle");
    struct ck_req r = {.url = url, .fd = -1, .setup = sftp_setup, .setup_ctx = s, .what = key};
    ck_resp_init(&resp);
    err = ck_net_request(s->base.net, h, &r, &resp, NULL);
    int64_t got = err == 0 ? listed_size(ck_buf_str(&resp.body), slash + 1) : -1;
    ck_resp_release(&resp);
    curl_easy_cleanup(h);
    if (err == 0 && got < 0)
        err = ck_error(CK_ENOENT, "'%s': the store does not list it", key);
    out->size = got;
    return err;
}

static int sftp_get(struct ck_store *st, const char *key, int fd)
{
    struct sftp *s = (struct sftp *)st;
    char path[8192], enc[8192 * 3], url[30000];
    struct ck_resp resp;
    struct ck_fd_sink sink = {fd, -1};
    int err = remote_path(s, key, path, sizeof path);
    if (err < 0 || (err = ck_store_encode(enc, sizeof enc, path, true)) < 0)
        return err;
    snprintf(url, sizeof url, "%s%s", s->origin, enc);
    CURL *h = ck_net_handle(s->base.net);
    if (!h)
        return ck_error(CK_ENOMEM, "cannot create a curl handle");
    struct ck_req r = {.url = url, .fd = -1, .setup = sftp_setup, .setup_ctx = s, .what = key,
                       .sink = ck_fd_sink_write, .sink_ctx = &sink};
    ck_resp_init(&resp);
    err = ck_net_request(s->base.net, h, &r, &resp, NULL);
    ck_resp_release(&resp);
    curl_easy_cleanup(h);
    return err;
}

const struct ck_store_ops ck_store_sftp = {
    .scheme = "sftp",
    .uses_curl = true,
    .check = sftp_check,
    .open = sftp_open,
    .put = sftp_put,
    .stat = sftp_stat,
    .get = sftp_get,
    .free = sftp_free,
};
