#include "agent/config_check.h"
#include "agent/ops.h"
#include "common/error.h"
#include "common/secret.h"
#include "hooks/hooks.h"
#include "stores/store.h"

#include <stdio.h>
#include <string.h>

/* Loads a secret reference and throws the value away: present, readable,
 * mode 0600 for a file. */
static int resolve_secret(const char *ref, const char *what)
{
    char *v = NULL;
    int err = ck_secret_load(ref, &v);
    ck_secret_free(v);
    if (err < 0)
        return ck_error_wrap(CK_ECONFIG, "%s", what);
    return 0;
}

static bool is_reference(const char *s)
{
    return s && (strncmp(s, "env:", 4) == 0 || strncmp(s, "file:", 5) == 0);
}

static int resolve_store(const struct ck_store_spec *s, size_t i)
{
    char url[512], what[600];
    int err;
    ck_store_url_redact(url, sizeof url, s->url ? s->url : "");
    if ((err = ck_store_check(s)) < 0)
        return ck_error_wrap(CK_ECONFIG, "upload.stores[%zu]", i);
    snprintf(what, sizeof what, "upload.stores[%zu] '%s': credentials", i, url);
    if (is_reference(s->credentials) && (err = resolve_secret(s->credentials, what)) < 0)
        return err;
    if (s->key_file) {
        char ref[4200];
        snprintf(what, sizeof what, "upload.stores[%zu] '%s': key_file", i, url);
        snprintf(ref, sizeof ref, "file:%s", s->key_file);
        if ((err = resolve_secret(ref, what)) < 0)
            return err;
    }
    return 0;
}

int ck_config_resolve(const struct ck_config *cfg)
{
    int err;
    /* webhooks: URLs and signing secrets, exactly as the start builds them */
    struct ck_hooks *h = NULL;
    err = ck_hooks_new(&cfg->hooks, cfg->source ? cfg->source : "(defaults)", &h);
    ck_hooks_free(h);
    if (err < 0)
        return err == CK_ECONFIG ? err : ck_error_wrap(CK_ECONFIG, "hooks");
    for (size_t i = 0; i < cfg->n_upload_stores; i++)
        if ((err = resolve_store(&cfg->upload_stores[i], i)) < 0)
            return err;
    if (cfg->listen) {
        char host[256];
        int port;
        if (ck_ops_parse_listen(cfg->listen, "listen", host, sizeof host, &port) < 0)
            return ck_error_wrap(CK_ECONFIG, "listen");
    }
    return 0;
}
