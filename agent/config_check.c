#include "agent/config_check.h"
#include "agent/nodes.h"
#include "agent/ops.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/secret.h"
#include "common/sign.h"
#include "hooks/hooks.h"
#include "infer/infer.h"
#include "model/layers.h"
#include "stores/awsconfig.h"
#include "stores/store.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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
    /* a profile the AWS files do not have fails the first upload: fail here */
    if (s->profile) {
        struct ck_awsprofile prof;
        err = ck_awsprofile_open(&prof, s->profile);
        ck_awsprofile_release(&prof);
        if (err < 0)
            return ck_error_wrap(CK_ECONFIG, "upload.stores[%zu] '%s': profile", i, url);
    }
    if (s->key_file) {
        char ref[4200];
        snprintf(what, sizeof what, "upload.stores[%zu] '%s': key_file", i, url);
        snprintf(ref, sizeof ref, "file:%s", s->key_file);
        if ((err = resolve_secret(ref, what)) < 0)
            return err;
    }
    return 0;
}

/* pack.graph: the layer list read and checked as far as it goes without a
 * checkpoint (keys, ops, references), and its ops against the engine's
 * table: what the first pack would refuse for any weights. */
static int resolve_graph(const struct ck_config *cfg)
{
    struct ck_buf b = CK_BUF_INIT;
    struct ck_model *m = NULL;
    const char *label = cfg->pack_graph_label ? cfg->pack_graph_label : "pack.graph";
    int err = 0;
    if (cfg->pack_graph_file) {
        label = cfg->pack_graph_file;
        if ((err = ck_read_file(cfg->pack_graph_file, CK_LAYERS_MAX_FILE, &b)) < 0)
            err = ck_error_wrap(CK_ECONFIG, "pack.graph");
    }
    const char *text = cfg->pack_graph_file ? ck_buf_str(&b) : cfg->pack_graph_yaml;
    size_t len = cfg->pack_graph_file ? b.len : strlen(cfg->pack_graph_yaml);
    if (err == 0 && (err = ck_layers_check(label, text, len, &m)) == 0)
        err = ck_infer_check_nodes(m);
    if (err < 0 && err != CK_ECONFIG)
        err = ck_error_wrap(CK_ECONFIG, "pack.graph");
    ck_model_free(m);
    ck_buf_release(&b);
    return err;
}

/* verify.inputs and the verify.expected files that name no checkpoint
 * ({name}, {stem}: known at each checkpoint), and pack.sign_key: readable */
static int resolve_files(const struct ck_config *cfg)
{
    const struct ck_strlist *lists[2] = {&cfg->verify_inputs, &cfg->verify_expected};
    const char *keys[2] = {"verify.inputs", "verify.expected"};
    for (int l = 0; l < 2; l++)
        for (size_t i = 0; i < lists[l]->n; i++) {
            const char *f = lists[l]->items[i];
            if (strstr(f, "{name}") || strstr(f, "{stem}"))
                continue;
            if (access(f, R_OK) < 0)
                return ck_error_os(CK_ECONFIG, "%s: '%s'", keys[l], f);
        }
    if (cfg->pack_sign_key) {
        struct ck_sign_key k;
        if (ck_sign_load(cfg->pack_sign_key, &k) < 0)
            return ck_error_wrap(CK_ECONFIG, "pack.sign_key");
        ck_sign_key_wipe(&k);
    }
    return 0;
}

int ck_config_check_dir(const char *dir)
{
    char state[PATH_MAX];
    if (access(dir, W_OK | X_OK) < 0)
        return ck_error_os(CK_ECONFIG, "'%s': the model folder is not writable by this user", dir);
    if (ck_path_join(state, sizeof state, dir, ".ckptd") < 0)
        return ck_error(CK_ECONFIG, "'%s': path too long", dir);
    if (access(state, F_OK) == 0 && access(state, W_OK | X_OK) < 0)
        return ck_error_os(CK_ECONFIG, "'%s': the state folder is not writable by this user",
                           state);
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
    if ((cfg->pack_graph_file || cfg->pack_graph_yaml) && (err = resolve_graph(cfg)) < 0)
        return err;
    if ((err = resolve_files(cfg)) < 0)
        return err;
    if (ck_config_has_retention(cfg)) {
        if (!cfg->n_upload_stores && !cfg->without_store)
            return ck_error(CK_ECONFIG,
                            "retention: no store is configured (upload.stores), so a deleted "
                            "checkpoint would be gone for good; set retention.without_store: "
                            "true to allow it");
        if (ck_config_has_store_retention(cfg) && !cfg->n_upload_stores)
            return ck_error(CK_ECONFIG, "retention.store: no store is configured (upload.stores) "
                                        "to prune");
        for (size_t i = 0; i < cfg->n_upload_stores && ck_config_has_store_retention(cfg); i++)
            if (!ck_store_can_delete(cfg->upload_stores[i].url))
                return ck_error(CK_ECONFIG, "retention.store: upload.stores[%zu] cannot delete "
                                            "objects (supported: file, s3, http/WebDAV)", i);
        for (size_t i = 0; i < cfg->n_upload_stores; i++)
            if (cfg->upload_stores[i].compress || cfg->upload_stores[i].bundle)
                return ck_error(CK_ECONFIG,
                                "retention: upload.stores[%zu] sends %s: retention checks each "
                                "checkpoint file as stored, which such a store does not keep",
                                i, cfg->upload_stores[i].bundle ? "a bundle" : "compressed files");
    }
    /* the node identity, with the launchers' variables of this environment */
    struct ck_nodes nodes;
    if ((err = ck_nodes_resolve(&nodes, cfg, NULL)) < 0)
        return err;
    if (cfg->listen) {
        char host[256];
        int port;
        if (ck_ops_parse_listen(cfg->listen, "listen", host, sizeof host, &port) < 0)
            return ck_error_wrap(CK_ECONFIG, "listen");
    }
    return 0;
}
