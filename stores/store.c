#include "stores/store.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "lazy/lazy.h"

#include <nettle/base64.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern const struct ck_store_ops ck_store_s3, ck_store_http, ck_store_https, ck_store_sftp,
    ck_store_file;

/* Adding a store: write its ops in its own file and add a row here. */
static const struct ck_store_ops *const stores[] = {
    &ck_store_s3, &ck_store_http, &ck_store_https, &ck_store_sftp, &ck_store_file,
};

void ck_upload_opts_init(struct ck_upload_opts *o)
{
    memset(o, 0, sizeof *o); /* every flag off (sha256_always was left as the stack had it) */
    o->part_size = 8u << 20;
    o->multipart_threshold = 64u << 20;
    o->max_rate = 0;
    o->concurrency = 8;
    o->transfers = 4;
    o->retries = 6;
    o->retry_base = 0.5;
    o->retry_cap = 60;
    o->grace = 20;
    o->timeout = 60;
}

void ck_upload_ctl_init(struct ck_upload_ctl *c, double grace)
{
    atomic_init(&c->stop, 0);
    atomic_init(&c->deadline, 0);
    c->grace = grace;
}

void ck_upload_ctl_stop(struct ck_upload_ctl *c)
{
    atomic_store(&c->stop, 1);
    long long none = 0;
    atomic_compare_exchange_strong(&c->deadline, &none,
                                   ck_mono_ms() + (long long)(c->grace * 1000));
}

void ck_upload_ctl_set_deadline(struct ck_upload_ctl *c, long long mono_ms)
{
    atomic_store(&c->deadline, mono_ms);
}

bool ck_upload_ctl_stopping(struct ck_upload_ctl *c)
{
    if (atomic_load(&c->stop)) {
        ck_upload_ctl_stop(c); /* a signal handler only sets stop: fix the deadline here */
        return true;
    }
    long long d = atomic_load(&c->deadline);
    return d && ck_mono_ms() >= d;
}

bool ck_upload_ctl_expired(struct ck_upload_ctl *c)
{
    if (atomic_load(&c->stop))
        ck_upload_ctl_stop(c);
    long long d = atomic_load(&c->deadline);
    return d && ck_mono_ms() >= d;
}

const struct ck_store_ops *ck_store_ops_find(const char *url)
{
    const char *colon = strstr(url, "://");
    if (!colon)
        return NULL;
    size_t n = (size_t)(colon - url);
    for (size_t i = 0; i < sizeof stores / sizeof *stores; i++)
        if (strlen(stores[i]->scheme) == n && !strncasecmp(url, stores[i]->scheme, n))
            return stores[i];
    return NULL;
}

int ck_store_check(const struct ck_store_spec *spec)
{
    if (!spec->url || !*spec->url)
        return ck_error(CK_ECONFIG, "a store needs a 'url'");
    const struct ck_store_ops *ops = ck_store_ops_find(spec->url);
    char u[512];
    ck_store_url_redact(u, sizeof u, spec->url);
    if (!ops)
        return ck_error(CK_ECONFIG,
                        "store '%s': unknown scheme (s3://, http://, https://, sftp://, file://)",
                        u);
    if (spec->compress && spec->bundle)
        return ck_error(CK_ECONFIG, "store '%s': 'compress' and 'bundle' exclude each other", u);
    return ops->check(spec);
}

int ck_store_open(struct ck_store **out, const struct ck_store_spec *spec, struct ck_net *net)
{
    int err;
    *out = NULL;
    if ((err = ck_store_check(spec)) < 0)
        return err;
    const struct ck_store_ops *ops = ck_store_ops_find(spec->url);
    if (ops->uses_curl && (err = ck_lazy_load(CK_LIB_CURL)) < 0)
        return err;
    if ((err = ops->open(out, spec, net)) < 0)
        return err;
    (*out)->ops = ops;
    (*out)->spec = spec;
    (*out)->net = net;
    return 0;
}

int ck_store_put(struct ck_store *s, struct ck_xfer *x)
{
    if (x->if_absent && !s->ops->if_absent)
        return ck_error(CK_ERR, "'%s': store '%s' cannot write only if the name is free",
                        x->key, s->ops->scheme);
    return s->ops->put(s, x);
}

int ck_store_del(struct ck_store *s, const char *key)
{
    if (!s->ops->del)
        return ck_error(CK_ERR, "store '%s' cannot delete objects", s->ops->scheme);
    return s->ops->del(s, key);
}

int ck_store_abort_upload(struct ck_store *s, const char *key, const char *upload_id)
{
    return s->ops->abort_upload ? s->ops->abort_upload(s, key, upload_id) : 0;
}

void ck_remote_list_release(struct ck_remote_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].key);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

int ck_remote_list_add(struct ck_remote_list *l, const char *key, int64_t size, const char *md5)
{
    if (l->n >= CK_STORE_LIST_MAX)
        return ck_error(CK_ESIZE, "more than %d objects listed", CK_STORE_LIST_MAX);
    if ((l->n & (l->n - 1)) == 0) { /* 0, 1, 2, 4, ...: grow by doubling */
        struct ck_remote_entry *v = realloc(l->v, (l->n ? 2 * l->n : 1) * sizeof *v);
        if (!v)
            return ck_error(CK_ENOMEM, "out of memory");
        l->v = v;
    }
    struct ck_remote_entry *e = &l->v[l->n];
    if (!(e->key = strdup(key)))
        return ck_error(CK_ENOMEM, "out of memory");
    e->size = size;
    snprintf(e->md5, sizeof e->md5, "%s", md5 ? md5 : "");
    l->n++;
    return 0;
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct ck_remote_entry *)a)->key,
                  ((const struct ck_remote_entry *)b)->key);
}

int ck_store_list(struct ck_store *s, const char *prefix, struct ck_remote_list *out)
{
    memset(out, 0, sizeof *out);
    if (!s->ops->list)
        return ck_error(CK_ERR, "store '%s' cannot list objects", s->ops->scheme);
    int err = s->ops->list(s, prefix, out);
    if (err < 0) {
        ck_remote_list_release(out);
        return err;
    }
    if (out->n > 1)
        qsort(out->v, out->n, sizeof *out->v, cmp_entry);
    return 0;
}

bool ck_store_can_delete(const char *url)
{
    const struct ck_store_ops *ops = ck_store_ops_find(url);
    return ops && ops->del;
}

int ck_store_stat(struct ck_store *s, const char *key, struct ck_remote_obj *out)
{
    out->size = -1;
    out->md5[0] = '\0';
    if (!s->ops->stat)
        return ck_error(CK_ERR, "store '%s' cannot say what it holds", s->ops->scheme);
    return s->ops->stat(s, key, out);
}

int ck_store_get(struct ck_store *s, const char *key, int fd)
{
    if (!s->ops->get)
        return ck_error(CK_ERR, "store '%s' cannot be read back", s->ops->scheme);
    return s->ops->get(s, key, fd);
}

int ck_fd_sink_write(void *ctx, const void *data, size_t n)
{
    struct ck_fd_sink *k = ctx;
    if (!data) {
        if (k->start < 0 && (k->start = lseek(k->fd, 0, SEEK_CUR)) < 0)
            return ck_error_os(CK_EIO, "cannot seek the download's file");
        if (ftruncate(k->fd, k->start) < 0 || lseek(k->fd, k->start, SEEK_SET) < 0)
            return ck_error_os(CK_EIO, "cannot start the download's file over");
        return 0;
    }
    if (ck_write_all(k->fd, data, n) < 0)
        return ck_error_os(CK_EIO, "cannot write the download's file");
    return 0;
}

void ck_store_free(struct ck_store *s)
{
    if (s)
        s->ops->free(s);
}

static int dup_field(char **dst, const char *src)
{
    *dst = NULL;
    if (!src)
        return 0;
    *dst = strdup(src);
    return *dst ? 0 : ck_error(CK_ENOMEM, "out of memory");
}

int ck_store_spec_copy(struct ck_store_spec *dst, const struct ck_store_spec *src)
{
    /* every scalar option carried by the copy; the strings duplicated below */
    *dst = *src;
    dst->url = dst->endpoint = dst->region = dst->profile = dst->credentials = NULL;
    dst->auth = dst->key_file = dst->host_key = NULL;
    if (dup_field(&dst->url, src->url) < 0 || dup_field(&dst->endpoint, src->endpoint) < 0 ||
        dup_field(&dst->region, src->region) < 0 || dup_field(&dst->profile, src->profile) < 0 ||
        dup_field(&dst->credentials, src->credentials) < 0 ||
        dup_field(&dst->auth, src->auth) < 0 || dup_field(&dst->key_file, src->key_file) < 0 ||
        dup_field(&dst->host_key, src->host_key) < 0) {
        ck_store_spec_release(dst);
        return CK_ENOMEM;
    }
    return 0;
}

void ck_store_spec_release(struct ck_store_spec *s)
{
    free(s->url);
    free(s->endpoint);
    free(s->region);
    free(s->profile);
    free(s->credentials);
    free(s->auth);
    free(s->key_file);
    free(s->host_key);
    memset(s, 0, sizeof *s);
}

void ck_store_url_redact(char *out, size_t outsz, const char *url)
{
    const char *sch = strstr(url, "://");
    const char *host = sch ? sch + 3 : url;
    const char *slash = strchr(host, '/');
    const char *at = strchr(host, '@');
    size_t o = 0;
    if (sch && (!at || (slash && at > slash)))
        at = NULL;
    /* scheme:// then the host part without user info (sftp keeps the user: not a secret) */
    if (at && strncmp(url, "sftp", 4) != 0) {
        o = (size_t)snprintf(out, outsz, "%.*s", (int)(host - url), url);
        host = at + 1;
    } else {
        o = (size_t)snprintf(out, outsz, "%.*s", (int)(host - url), url);
    }
    if (o >= outsz)
        return;
    size_t rest = strcspn(host, "?#");
    snprintf(out + o, outsz - o, "%.*s%s", (int)rest, host, host[rest] == '?' ? "?..." : "");
}

int ck_store_encode(char *out, size_t outsz, const char *s, bool keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                     c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/');
        if (o + (plain ? 1 : 3) >= outsz)
            return ck_error(CK_ESIZE, "'%.100s': the encoded name is too long", s);
        if (plain) {
            out[o++] = (char)c;
        } else {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    if (o >= outsz)
        return ck_error(CK_ESIZE, "'%.100s': the encoded name is too long", s);
    out[o] = '\0';
    return 0;
}

int ck_store_join_key(char *out, size_t outsz, const char *prefix, const char *key)
{
    while (*key == '/')
        key++;
    size_t pl = prefix ? strlen(prefix) : 0;
    while (pl && prefix[pl - 1] == '/')
        pl--;
    const char *p = prefix ? prefix : "";
    while (pl && *p == '/')
        p++, pl--;
    int n = pl ? snprintf(out, outsz, "%.*s/%s", (int)pl, p, key) : snprintf(out, outsz, "%s", key);
    if (n < 0 || (size_t)n >= outsz)
        return ck_error(CK_ESIZE, "'%.100s': the remote name is too long", key);
    return 0;
}

static int set_bool(bool *out, const char *v, const char *key)
{
    if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on")) {
        *out = true;
        return 0;
    }
    if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off")) {
        *out = false;
        return 0;
    }
    return ck_error(CK_ECONFIG, "'%s' must be true or false", key);
}

int ck_store_spec_set(struct ck_store_spec *s, const char *key, const char *v)
{
    static const struct {
        const char *key;
        size_t off;
    } strs[] = {
        {"url", offsetof(struct ck_store_spec, url)},
        {"endpoint", offsetof(struct ck_store_spec, endpoint)},
        {"region", offsetof(struct ck_store_spec, region)},
        {"profile", offsetof(struct ck_store_spec, profile)},
        {"credentials", offsetof(struct ck_store_spec, credentials)},
        {"auth", offsetof(struct ck_store_spec, auth)},
        {"key", offsetof(struct ck_store_spec, key_file)},
        {"host_key", offsetof(struct ck_store_spec, host_key)},
    };
    for (size_t i = 0; i < sizeof strs / sizeof *strs; i++)
        if (!strcmp(key, strs[i].key)) {
            char **f = (char **)((char *)s + strs[i].off);
            free(*f);
            *f = strdup(v);
            return *f ? 0 : ck_error(CK_ENOMEM, "out of memory");
        }
    if (!strcmp(key, "compress")) {
        if (!strcmp(v, "zstd"))
            s->compress = true;
        else if (!strcmp(v, "none") || !strcmp(v, "false") || !strcmp(v, "no"))
            s->compress = false;
        else
            return ck_error(CK_ECONFIG, "'compress' must be zstd or none");
        return 0;
    }
    if (!strcmp(key, "bundle"))
        return set_bool(&s->bundle, v, key);
    if (!strcmp(key, "commit")) {
        if (strcmp(v, "put") && strcmp(v, "multipart"))
            return ck_error(CK_ECONFIG, "'commit' must be put or multipart");
        s->commit_multipart = !strcmp(v, "multipart");
        return 0;
    }
    if (!strcmp(key, "move")) {
        bool move;
        int err = set_bool(&move, v, key);
        s->no_move = !move;
        return err;
    }
    return ck_error(CK_ENOENT, "is not a store key (url, endpoint, region, credentials, auth, key, "
                               "host_key, compress, bundle, move, commit)");
}
