#include "agent/config.h"
#include "agent/nodes.h"
#include "agent/ops.h"
#include "agent/rules.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/yamlutil.h"
#include "hooks/hooks.h"
#include "infer/infer.h"
#include "writers/writer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_MAX (1u << 20)

/* T_PATH, T_PATHLIST: a T_STR or T_STRLIST of file paths, under the one path rule (config_path) */
enum key_type {
    T_STR,
    T_PATH,
    T_INT,
    T_BOOL,
    T_DURATION,
    T_STRLIST,
    T_PATHLIST,
    T_LOGFORMAT,
    T_LOGLEVEL,
    T_CUSTOM
};

struct parse_ctx {
    struct ck_config *cfg;
    struct ck_yaml_doc *doc;
    const char *text; /* the config file's text (NULL for a flag) */
    size_t len;
    bool flag;        /* the value came from a flag (doc->name): no line number in messages */
    const char *base; /* the config file's folder, absolute; NULL for a flag */
};

typedef int (*custom_fn)(struct parse_ctx *c, yaml_node_t *n, const char *key);

struct key {
    const char *name;
    enum key_type type;
    size_t offset;
    custom_fn parse;
    const char *help;
};

static int parse_initialisation(struct parse_ctx *c, yaml_node_t *n, const char *key);
static int parse_build_parameters(struct parse_ctx *c, yaml_node_t *n, const char *key);
static int parse_webhooks(struct parse_ctx *c, yaml_node_t *n, const char *key);
static int parse_exec_hooks(struct parse_ctx *c, yaml_node_t *n, const char *key);
static int parse_retry_schedule(struct parse_ctx *c, yaml_node_t *n, const char *key);
static int parse_listen(struct parse_ctx *c, yaml_node_t *n, const char *key);
static int parse_upload_stores(struct parse_ctx *c, yaml_node_t *n, const char *key);
static int parse_upload_opt(struct parse_ctx *c, yaml_node_t *n, const char *key);
static int parse_pack_formats(struct parse_ctx *c, yaml_node_t *n, const char *key);
static int parse_pack_graph(struct parse_ctx *c, yaml_node_t *n, const char *key);
static int parse_verify_opt(struct parse_ctx *c, yaml_node_t *n, const char *key);
static int parse_verify_inputs(struct parse_ctx *c, yaml_node_t *n, const char *key);
static int parse_min_free(struct parse_ctx *c, yaml_node_t *n, const char *key);
static int parse_nodes(struct parse_ctx *c, yaml_node_t *n, const char *key);

#define F(field) offsetof(struct ck_config, field)

/* Every config key. docs/configuration.md and ckptd.yaml(5) are generated from
 * this table by the build (scripts/gendocs.py, through `ckptd config --keys`). */
static const struct key keys[] = {
    {"model.name", T_STR, F(model_name), NULL, "model name in metadata.yaml (default: the folder's name)"},
    {"model.configuration", T_PATH, F(model_configuration), NULL,
     "training configuration file (default: config.yaml, config.json, hparams.yaml, config.py, ...)"},
    {"model.initialisation", T_CUSTOM, 0, parse_initialisation,
     "null, {file: PATH, name: NAME} or {pmf: PATH, checkpoint: REF}"},
    {"model.build_parameters", T_CUSTOM, 0, parse_build_parameters,
     "a mapping written into data/build_parameters.yaml"},
    {"checkpoints.patterns", T_STRLIST, F(ckpt.patterns), NULL,
     "checkpoint name patterns: {epoch} and {step} capture numbers, '*' any text, a final '/' a folder"},
    {"checkpoints.ignore", T_STRLIST, F(ckpt.ignore), NULL, "temporary names never registered (globs)"},
    {"checkpoints.folder_markers", T_STRLIST, F(ckpt.folder_markers), NULL,
     "files a framework writes last into a folder checkpoint ([] : complete once min_age old)"},
    {"checkpoints.steps_per_epoch", T_INT, F(steps_per_epoch), NULL,
     "with a {step}-only pattern: epoch = step / steps_per_epoch (default: epoch = step)"},
    {"checkpoints.min_age", T_DURATION, F(min_age), NULL,
     "scan takes a file only once it is this old (default 2s): it may still be written"},
    {"checkpoints.mirror_deletes", T_BOOL, F(mirror_deletes), NULL,
     "unregister a checkpoint when the training job deletes it (default false: keep it)"},
    {"training.finished_marker", T_STR, F(finished_marker), NULL,
     "a file in DIR whose appearance marks the training finished"},
    {"training.failed_marker", T_STR, F(failed_marker), NULL,
     "a file in DIR whose appearance marks the training failed"},
    {"watch.poll", T_BOOL, F(watch_poll), NULL,
     "poll instead of using inotify (default false; network filesystems are polled anyway)"},
    {"watch.poll_interval", T_DURATION, F(watch_poll_interval), NULL,
     "time between two polls of a polled folder (default 2s)"},
    {"watch.settle", T_DURATION, F(watch_settle), NULL,
     "a written file must be unchanged (size, mtime) this long before it is taken (default 200ms)"},
    {"watch.check_writers", T_BOOL, F(watch_check_writers), NULL,
     "wait while a process has the file open for writing, as /proc shows (default true)"},
    {"watch.reconcile_interval", T_DURATION, F(watch_reconcile_interval), NULL,
     "a full pass this often catches anything the events missed (default 5m, 0: never)"},
    {"watch.grace_period", T_DURATION, F(watch_grace_period), NULL,
     "after SIGTERM/SIGINT, time the wrapped command gets before SIGKILL (default 20s)"},
    {"log.format", T_LOGFORMAT, F(log_format), NULL, "text or json"},
    {"log.level", T_LOGLEVEL, F(log_level), NULL, "debug, info, warn or error"},
    {"hooks.webhooks", T_CUSTOM, 0, parse_webhooks,
     "webhooks: [{url: https://... | env:NAME | file:/path, secret: env:NAME | file:/path"
     " (whsec_...), secrets: [...] (rotation), events: [checkpoint.*, ...], template: FILE,"
     " timeout: 10s}]"},
    {"hooks.exec", T_CUSTOM, 0, parse_exec_hooks,
     "commands per event: [{event: checkpoint.registered, command: [argv...] (a string runs with"
     " /bin/sh -c), timeout: 30s, env: [PATH, ...] (only these of ckptd's variables)}]"},
    {"hooks.retry_schedule", T_CUSTOM, 0, parse_retry_schedule,
     "delays before each webhook retry (default 5s 30s 2m 10m 30m 1h 2h 4h 6h 8h)"},
    {"hooks.failing_after", T_INT, F(hooks.failing_after), NULL,
     "consecutive failures that mark a webhook receiver failing (default 5)"},
    {"metrics_file", T_PATH, F(metrics_file), NULL,
     "scan writes its metrics here at the end (node_exporter textfile collector, *.prom)"},
    {"listen", T_CUSTOM, 0, parse_listen,
     "watch serves /healthz /readyz /metrics /status on HOST:PORT (like 127.0.0.1:9464)"},
    {"upload.stores", T_CUSTOM, 0, parse_upload_stores,
     "list of stores: {url: s3://b/p | http(s)://... | sftp://u@h/p | file:///p, endpoint, region,"
     " profile,"
     " credentials: s3 env | file:/path, http/sftp env:NAME | file:/path, auth: basic|bearer, key,"
     " host_key, compress: zstd, bundle: true, move: false, commit: put|multipart (s3: how"
     " metadata.yaml goes; multipart for servers that keep a PUT cut short)}"},
    {"upload.concurrency", T_CUSTOM, 0, parse_upload_opt, "parallel parts per upload (default 8)"},
    {"upload.transfers", T_CUSTOM, 0, parse_upload_opt, "files sending at once (default 4; their checks run beside)"},
    {"upload.max_rate", T_CUSTOM, 0, parse_upload_opt,
     "bandwidth cap over all uploads, bytes per second like 50MiB (default: none)"},
    {"upload.part_size", T_CUSTOM, 0, parse_upload_opt, "multipart part size (default 8MiB, min 5MiB)"},
    {"upload.multipart_threshold", T_CUSTOM, 0, parse_upload_opt,
     "files this large go multipart (default 64MiB)"},
    {"upload.retries", T_CUSTOM, 0, parse_upload_opt,
     "retries per request after the first attempt (default 6), backoff with jitter"},
    {"upload.retry_base", T_CUSTOM, 0, parse_upload_opt, "first retry delay (default 500ms)"},
    {"upload.grace", T_CUSTOM, 0, parse_upload_opt,
     "after SIGTERM, time to finish uploads in flight (default 20s)"},
    {"upload.timeout", T_CUSTOM, 0, parse_upload_opt,
     "a transfer that moves nothing this long fails and is retried (default 60s)"},
    {"upload.sha256", T_CUSTOM, 0, parse_upload_opt,
     "http, sftp: always (hash files the agent has not hashed) or known (default: record the "
     "hash cache's)"},
    {"pack.formats", T_CUSTOM, 0, parse_pack_formats,
     "archives made of every new checkpoint: [mldef], [samediff] or both (default: none)"},
    {"pack.graph", T_CUSTOM, 0, parse_pack_graph,
     "the layer list of weight-only checkpoints: inline (YAML) or file:/path"},
    {"pack.weights", T_STR, F(pack_weights), NULL,
     "where a training checkpoint keeps the model's tensors for the layer list: a container"
     " (state_dict, model, ema, ...) or a dotted prefix (default: found; docs/model.md)"},
    {"pack.dir", T_PATH, F(pack_dir), NULL, "where archives are written (default DIR/data/deploy)"},
    {"pack.sign_key", T_PATH, F(pack_sign_key), NULL,
     "mldef: sign archives with this Ed25519 private key (file:/path)"},
    {"verify.inputs", T_CUSTOM, 0, parse_verify_inputs,
     "input files (.npy, csv, raw float32), one per network input, or 'recorded': the "
     "archive's recorded test sets (default: those when it has some, else fixed inputs)"},
    {"verify.expected", T_PATHLIST, F(verify_expected), NULL,
     "the trainer's expected output files, one per output; {name} and {stem} stand for the "
     "checkpoint's name (default: the source checkpoint's outputs, which cannot catch a wrong "
     "layer list)"},
    {"verify.record", T_BOOL, F(verify_record), NULL,
     "record the inputs and outputs of a passing verification in the archive (default false)"},
    {"verify.atol", T_CUSTOM, 0, parse_verify_opt, "absolute tolerance (default 1e-4)"},
    {"verify.rtol", T_CUSTOM, 0, parse_verify_opt, "relative tolerance (default 1e-5)"},
    {"verify.timeout", T_DURATION, F(verify_timeout), NULL,
     "CPU time the engine may use per archive (default 300s)"},
    {"verify.max_memory", T_CUSTOM, 0, parse_verify_opt,
     "address space of the engine's child (default 8GiB; 0: no limit)"},
    {"verify.on_failure", T_CUSTOM, 0, parse_verify_opt,
     "hold (not uploaded, the default) or upload_marked"},
    {"verify.threads", T_CUSTOM, 0, parse_verify_opt,
     "threads of the engine's heavy kernels, 1 to 64 (default 1: the trainer keeps its cores; "
     "the outputs are the same bits at any count)"},
    {"retention.keep_last", T_INT, F(keep_last), NULL,
     "delete local checkpoints but the newest N, once every store holds a verified copy"},
    {"retention.keep_every", T_INT, F(keep_every), NULL,
     "keep the checkpoints whose epoch is a multiple of E"},
    {"retention.keep_best.metric", T_STR, F(keep_best_metric), NULL,
     "keep the best checkpoints by this metric (trainer_state.json, a Lightning name like "
     "val_loss=0.12, or retention.metrics_file)"},
    {"retention.keep_best.mode", T_STR, F(keep_best_mode), NULL, "min (default) or max"},
    {"retention.keep_best.count", T_INT, F(keep_best_count), NULL,
     "how many best checkpoints stay (default 1)"},
    {"retention.metrics_file", T_PATH, F(retention_metrics_file), NULL,
     "a metrics.jsonl or CSV the trainer appends to (a step or epoch column and the metric)"},
    {"retention.min_free", T_CUSTOM, 0, parse_min_free,
     "free space to keep on DIR's filesystem, like 20GiB: the oldest deletable go first"},
    {"retention.without_store", T_BOOL, F(without_store), NULL,
     "allow retention with no store configured: deleted checkpoints are then gone (default "
     "false)"},
    {"retention.store.keep_last", T_INT, F(store_keep_last), NULL,
     "remote retention: the stores keep the newest M checkpoints (and those still on the local "
     "disk); older ones are deleted from every store, its metadata.yaml first"},
    {"retention.store.keep_every", T_INT, F(store_keep_every), NULL,
     "remote retention: the stores keep the checkpoints whose epoch is a multiple of E"},
    {"retention.store.keep_best.metric", T_STR, F(store_best_metric), NULL,
     "remote retention: the stores keep the best by this metric (retention.metrics_file or the "
     "name)"},
    {"retention.store.keep_best.mode", T_STR, F(store_best_mode), NULL, "min (default) or max"},
    {"retention.store.keep_best.count", T_INT, F(store_best_count), NULL,
     "how many best checkpoints the stores keep (default 1)"},
    {"retention.interval", T_DURATION, F(retention_interval), NULL,
     "the watcher: how often it checks the free space (min_free) and retries what a failing "
     "store held (default 60s; it also runs after each upload of metadata.yaml)"},
    {"nodes.rank", T_CUSTOM, 0, parse_nodes,
     "this node's number, 0 to nodes.count - 1 (default, with several nodes: SLURM_NODEID, "
     "PET_NODE_RANK, GROUP_RANK, JOB_COMPLETION_INDEX, OMPI_COMM_WORLD_RANK or PMI_RANK; "
     "docs/multinode.md)"},
    {"nodes.count", T_CUSTOM, 0, parse_nodes,
     "nodes of the training, one ckptd each (default: SLURM_NNODES, PET_NNODES, NNODES, "
     "OMPI_COMM_WORLD_SIZE or PMI_SIZE, else 1: a single node, whose sidecar sees every file)"},
};
#define NKEYS (sizeof keys / sizeof keys[0])

/* The names the common frameworks give checkpoints (docs/checkpoints.md has
 * an example of each). Each base is tried with each extension, so that
 * 'epoch_3.log' is not taken for a checkpoint. A name several patterns read
 * is read by the one that captures the most (agent/rules.h). */
static const char *default_bases[] = {
    "epoch_{epoch}", "epoch-{epoch}", "epoch{epoch}", "*_epoch_{epoch}", "*-epoch-{epoch}",
    "*_epoch{epoch}", "*-epoch={epoch}*", "checkpoint_{step}", "checkpoint-{step}", "ckpt_{step}",
    "ckpt-{step}", "step_{step}", "step-{step}", "*_step_{step}", "*-step-{step}", "*-step={step}",
    "model_{step}", "iter_{step}",
    /* Keras ModelCheckpoint: weights.{epoch:02d}-{val_loss:.2f}.h5 */
    "weights.{epoch}-*", "weights.{epoch}", "model.{epoch}-*", "model.{epoch}",
};
static const char *default_exts[] = {
    "pt", "pth", "bin", "ckpt", "safetensors", "h5", "hdf5", "keras", "npz", "npy", "nnp",
    "pkl", "msgpack", "onnx", "fb", "zip", "tar",
};
static const char *default_other[] = {
    /* PyTorch Lightning's ModelCheckpoint (filename '{epoch}-{step}', metrics
     * and '-v1' versions after them); last.ckpt's epoch comes from the file */
    "epoch={epoch}-step={step}.ckpt", "epoch={epoch}-step={step}-*.ckpt",
    "*-epoch={epoch}-step={step}*.ckpt", "epoch={epoch}-*.ckpt", "epoch={epoch}.ckpt",
    "step={step}.ckpt", "last.ckpt",
    "*.ckpt-{step}", "ckpt-{step}", "model.ckpt-{step}", "cp-{epoch}.ckpt", /* TensorFlow bundles */
    "checkpoint-{step}/",  /* Hugging Face Trainer (trainer_state.json) */
    "global_step{step}/",  /* DeepSpeed (its 'latest' file) */
    "iter_{step}/",        /* Megatron-LM (latest_checkpointed_iteration.txt) */
    "step_{step}/", "step-{step}/", "ckpt-{step}/", "epoch_{epoch}/", /* PyTorch DCP, Orbax */
};
static const char *default_markers[] = {
    "trainer_state.json",  /* Hugging Face Trainer */
    ".metadata",           /* PyTorch DCP */
    "commit_success.txt",  /* Orbax */
    "_CHECKPOINT_METADATA",/* Orbax (newer) */
};
static const char *default_ignore[] = {
    "*.tmp", "*.temp", "*.partial", "*.tempstate*", "*.orbax-checkpoint-tmp-*", ".~*", ".*",
};

/* pack.weights: a dotted name (state_dict, state_dict.model), no spaces, no empty part. */
static int ck_weights_key_check(const char *v)
{
    bool ok = *v && *v != '.';
    for (const char *p = v; *p && ok; p++)
        ok = (unsigned char)*p > ' ' && *p != 0x7f && !(p[0] == '.' && p[1] == '.');
    return ok ? 0
              : ck_error(CK_ECONFIG, "'%s' is not a container name or dotted prefix (like "
                                     "state_dict or state_dict.model)",
                         v);
}

void ck_config_init(struct ck_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    char pat[128];
    for (size_t b = 0; b < sizeof default_bases / sizeof *default_bases; b++)
        for (size_t e = 0; e < sizeof default_exts / sizeof *default_exts; e++) {
            snprintf(pat, sizeof pat, "%s.%s", default_bases[b], default_exts[e]);
            ck_strlist_add(&cfg->ckpt.patterns, pat);
        }
    for (size_t i = 0; i < sizeof default_other / sizeof *default_other; i++)
        ck_strlist_add(&cfg->ckpt.patterns, default_other[i]);
    for (size_t i = 0; i < sizeof default_markers / sizeof *default_markers; i++)
        ck_strlist_add(&cfg->ckpt.folder_markers, default_markers[i]);
    for (size_t i = 0; i < sizeof default_ignore / sizeof *default_ignore; i++)
        ck_strlist_add(&cfg->ckpt.ignore, default_ignore[i]);
    cfg->min_age = 2.0;
    cfg->watch_poll_interval = 2.0;
    cfg->watch_settle = 0.2;
    cfg->watch_check_writers = true;
    cfg->watch_reconcile_interval = 300;
    cfg->watch_grace_period = 20;
    cfg->retention_interval = 60;
    cfg->log_format = -1;
    cfg->log_level = -1;
    ck_upload_opts_init(&cfg->upload);
    cfg->verify_atol = 1e-4;
    cfg->verify_rtol = 1e-5;
    cfg->verify_timeout = 300;
    cfg->verify_max_memory = 8ull << 30;
    cfg->verify_threads = 1;
    cfg->verify_on_failure = CK_VERIFY_HOLD;
    cfg->nodes_rank = -1;
    cfg->nodes_count = -1;
}

void ck_config_release(struct ck_config *cfg)
{
    for (size_t i = 0; i < NKEYS; i++) {
        void *field = (char *)cfg + keys[i].offset;
        if (keys[i].type == T_STR || keys[i].type == T_PATH)
            free(*(char **)field);
        else if (keys[i].type == T_STRLIST || keys[i].type == T_PATHLIST)
            ck_strlist_release(field);
    }
    free(cfg->init_path);
    free(cfg->init_name);
    free(cfg->init_checkpoint);
    free(cfg->build_parameters_yaml);
    ck_strlist_release(&cfg->pack_formats);
    ck_strlist_release(&cfg->verify_inputs);
    free(cfg->pack_graph_yaml);
    free(cfg->pack_graph_file);
    free(cfg->pack_graph_label);
    ck_hooks_conf_release(&cfg->hooks);
    free(cfg->listen);
    free(cfg->source);
    free(cfg->nodes_rank_from);
    free(cfg->nodes_count_from);
    for (size_t i = 0; i < cfg->n_upload_stores; i++)
        ck_store_spec_release(&cfg->upload_stores[i]);
    free(cfg->upload_stores);
    memset(cfg, 0, sizeof *cfg);
}

int ck_parse_duration(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v < 0)
        return ck_error(CK_ECONFIG, "'%s' is not a duration (like 500ms, 2s, 5m)", s);
    if (!*end || !strcmp(end, "s"))
        *out = v;
    else if (!strcmp(end, "ms"))
        *out = v / 1000;
    else if (!strcmp(end, "m"))
        *out = v * 60;
    else if (!strcmp(end, "h"))
        *out = v * 3600;
    else
        return ck_error(CK_ECONFIG, "'%s' is not a duration (like 500ms, 2s, 5m)", s);
    return 0;
}

int ck_parse_size(const char *s, uint64_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v < 0)
        return ck_error(CK_ECONFIG, "'%s' is not a size (like 4096, 64KiB, 8MiB, 1G)", s);
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {{"", 1},       {"B", 1},         {"K", 1e3},         {"KB", 1e3},
                 {"KiB", 1024}, {"M", 1e6},       {"MB", 1e6},        {"MiB", 1048576.0},
                 {"G", 1e9},    {"GB", 1e9},      {"GiB", 1073741824.0}};
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (!strcmp(end, units[i].suffix)) {
            double bytes = v * units[i].mult;
            if (!(bytes < 0x1p64)) /* the cast of a larger double is undefined */
                return ck_error(CK_ECONFIG, "'%s' is too large a size", s);
            *out = (uint64_t)bytes;
            return 0;
        }
    return ck_error(CK_ECONFIG, "'%s' is not a size (like 4096, 64KiB, 8MiB, 1G)", s);
}

static int bad(struct parse_ctx *c, yaml_node_t *n, const char *key, const char *what)
{
    if (c->flag)
        return ck_error(CK_ECONFIG, "%s: '%s' %s", c->doc->name, key, what);
    return ck_error(CK_ECONFIG, "'%s' line %d: '%s' %s", c->doc->name, ck_yaml_line(n), key, what);
}

static int scalar_str(struct parse_ctx *c, yaml_node_t *n, const char *key, const char **out)
{
    if (n->type != YAML_SCALAR_NODE)
        return bad(c, n, key, "must be a single value");
    *out = (const char *)n->data.scalar.value;
    return 0;
}

static int set_str(char **field, const char *v)
{
    free(*field);
    *field = strdup(v);
    return *field ? 0 : ck_error(CK_ENOMEM, "out of memory");
}

/* The one path rule (docs/config.md, "Paths in the config"): a relative path written
 * in a config file is relative to that file's folder (for DIR/ckptd.yaml:
 * DIR), whatever the working directory; a flag's value is the command line's,
 * relative to the working directory, and stays as given. A value "file:X"
 * (a secret or key reference) has X resolved; with any_path, a value with no
 * such prefix is a path too ("env:NAME" never is). *field gets the result. */
static int config_path(struct parse_ctx *c, const char *s, bool any_path, char **field)
{
    const char *path = s;
    if (!strncmp(s, "file:", 5))
        path = s + 5;
    else if (!any_path || !strncmp(s, "env:", 4))
        path = NULL;
    if (!path || !path[0] || path[0] == '/' || !c->base)
        return set_str(field, s);
    char out[8192];
    if (snprintf(out, sizeof out, "%.*s%s/%s", (int)(path - s), s, c->base, path) >=
        (int)sizeof out)
        return ck_error(CK_ECONFIG, "'%s': path '%s' too long", c->doc->name, s);
    return set_str(field, out);
}

static int parse_value(struct parse_ctx *c, const struct key *k, yaml_node_t *n, const char *key)
{
    void *field = (char *)c->cfg + k->offset;
    struct ck_yaml_value v;
    const char *s = NULL;
    int err;
    ck_yaml_resolve(n, &v);
    switch (k->type) {
    case T_STR:
        if (v.type == CK_Y_NULL) {
            free(*(char **)field);
            *(char **)field = NULL;
            return 0;
        }
        if ((err = scalar_str(c, n, key, &s)) < 0)
            return err;
        return set_str(field, s);
    case T_PATH:
        if (v.type == CK_Y_NULL) {
            free(*(char **)field);
            *(char **)field = NULL;
            return 0;
        }
        if ((err = scalar_str(c, n, key, &s)) < 0)
            return err;
        return config_path(c, s, true, field);
    case T_INT:
        if (v.type != CK_Y_INT)
            return bad(c, n, key, "must be a whole number");
        *(int64_t *)field = v.i;
        return 0;
    case T_BOOL:
        if (v.type != CK_Y_BOOL)
            return bad(c, n, key, "must be true or false");
        *(bool *)field = v.b;
        return 0;
    case T_DURATION:
        if ((err = scalar_str(c, n, key, &s)) < 0)
            return err;
        if (ck_parse_duration(s, field) < 0)
            return bad(c, n, key, "must be a duration like 500ms, 2s or 5m");
        return 0;
    case T_STRLIST:
    case T_PATHLIST: {
        struct ck_strlist *l = field;
        if (n->type != YAML_SEQUENCE_NODE)
            return bad(c, n, key, "must be a list");
        ck_strlist_release(l);
        for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
             it++) {
            yaml_node_t *item = ck_yaml_node(c->doc, *it);
            char *path = NULL;
            if ((err = scalar_str(c, item, key, &s)) < 0)
                return err;
            if (k->type == T_PATHLIST && (err = config_path(c, s, true, &path)) < 0)
                return err;
            err = ck_strlist_add(l, path ? path : s);
            free(path);
            if (err < 0)
                return err;
        }
        return 0;
    }
    case T_LOGFORMAT:
    case T_LOGLEVEL: {
        if ((err = scalar_str(c, n, key, &s)) < 0)
            return err;
        int x = k->type == T_LOGFORMAT ? ck_log_format_parse(s) : ck_log_level_parse(s);
        if (x < 0)
            return bad(c, n, key,
                       k->type == T_LOGFORMAT ? "must be text or json"
                                              : "must be debug, info, warn or error");
        *(int *)field = x;
        return 0;
    }
    case T_CUSTOM:
        return k->parse(c, n, key);
    }
    return 0;
}

static int parse_initialisation(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    struct ck_config *cfg = c->cfg;
    struct ck_yaml_value v;
    ck_yaml_resolve(n, &v);
    if (v.type == CK_Y_NULL) {
        cfg->init_kind = CK_INIT_NONE;
        return 0;
    }
    if (n->type != YAML_MAPPING_NODE)
        return bad(c, n, key, "must be null, {file: PATH} or {pmf: PATH, checkpoint: REF}");
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = ck_yaml_node(c->doc, p->key), *vn = ck_yaml_node(c->doc, p->value);
        const char *k = NULL, *s = NULL;
        int err;
        if ((err = scalar_str(c, kn, key, &k)) < 0 || (err = scalar_str(c, vn, key, &s)) < 0)
            return err;
        char full[128];
        snprintf(full, sizeof full, "%s.%s", key, k);
        if (!strcmp(k, "file") || !strcmp(k, "pmf")) {
            if (cfg->init_kind != CK_INIT_NONE)
                return bad(c, kn, full, "conflicts with another initialisation kind");
            cfg->init_kind = k[0] == 'f' ? CK_INIT_FILE : CK_INIT_PMF;
            err = config_path(c, s, true, &cfg->init_path);
        } else if (!strcmp(k, "name")) {
            err = set_str(&cfg->init_name, s);
        } else if (!strcmp(k, "checkpoint")) {
            err = set_str(&cfg->init_checkpoint, s);
        } else {
            return bad(c, kn, full, "is not a known key (file, pmf, name, checkpoint)");
        }
        if (err < 0)
            return err;
    }
    if (cfg->init_kind == CK_INIT_NONE)
        return bad(c, n, key, "needs 'file' or 'pmf'");
    if (cfg->init_kind == CK_INIT_PMF && !cfg->init_checkpoint)
        return bad(c, n, key, "with 'pmf' needs 'checkpoint'");
    return 0;
}

/* nodes.rank, nodes.count (agent/nodes.h): a whole number, and where it came
 * from (the file and line, or the flag) for `ckptd config` */
static int parse_nodes(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    struct ck_yaml_value v;
    bool rank = !strcmp(key, "nodes.rank");
    long long min = rank ? 0 : 1, max = rank ? CK_NODES_MAX - 1 : CK_NODES_MAX;
    ck_yaml_resolve(n, &v);
    if (v.type != CK_Y_INT || v.i < min || v.i > max) {
        char what[96];
        snprintf(what, sizeof what, "must be a whole number from %lld to %lld", min, max);
        return bad(c, n, key, what);
    }
    char from[512];
    if (c->flag)
        snprintf(from, sizeof from, "%s", c->doc->name);
    else
        snprintf(from, sizeof from, "'%s' line %d", c->doc->name, ck_yaml_line(n));
    *(rank ? &c->cfg->nodes_rank : &c->cfg->nodes_count) = v.i;
    return set_str(rank ? &c->cfg->nodes_rank_from : &c->cfg->nodes_count_from, from);
}

static int parse_build_parameters(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    struct ck_buf b = CK_BUF_INIT;
    struct ck_yaml_out o;
    if (n->type != YAML_MAPPING_NODE)
        return bad(c, n, key, "must be a mapping");
    int err = ck_yaml_out_begin(&o, &b);
    ck_yaml_copy(&o, c->doc, n);
    if (err == 0)
        err = ck_yaml_out_end(&o);
    if (err < 0) {
        ck_buf_release(&b);
        return err;
    }
    free(c->cfg->build_parameters_yaml);
    c->cfg->build_parameters_yaml = ck_buf_detach(&b);
    return 0;
}

/* pack.formats: a list of writer names, each checked against the writers table */
static int parse_pack_formats(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    const char *s = NULL;
    int err;
    bool one = c->flag && n->type == YAML_SCALAR_NODE; /* a flag (pack --format) names one */
    if (n->type != YAML_SEQUENCE_NODE && !one)
        return bad(c, n, key, "must be a list of formats, like [mldef, samediff]");
    ck_strlist_release(&c->cfg->pack_formats);
    yaml_node_item_t self = 0;
    yaml_node_item_t *start = one ? &self : n->data.sequence.items.start,
                     *top = one ? &self + 1 : n->data.sequence.items.top;
    for (yaml_node_item_t *it = start; it < top; it++) {
        yaml_node_t *item = one ? n : ck_yaml_node(c->doc, *it);
        if ((err = scalar_str(c, item, key, &s)) < 0)
            return err;
        if (!ck_writer_find(s))
            return bad(c, item, key, "names an unknown format (known: mldef, samediff)");
        if ((err = ck_strlist_add(&c->cfg->pack_formats, s)) < 0)
            return err;
    }
    return 0;
}

/* The text of node n as written in the config file, at its own lines: the
 * lines before it blank, the part of its first line before it spaces, so
 * that what reports a line of it reports the config file's line. NULL
 * (nothing set) when the text is not at hand (a flag). */
static int source_text(struct parse_ctx *c, yaml_node_t *n, char **out)
{
    *out = NULL;
    if (!c->text)
        return 0;
    size_t l0 = n->start_mark.line, l1 = n->end_mark.line, line = 0, i = 0;
    struct ck_buf b = CK_BUF_INIT;
    int err = 0;
    for (size_t k = 0; k < l0 && err == 0; k++)
        err = ck_buf_append(&b, "\n", 1);
    while (i < c->len && line < l0) /* to the node's first line */
        if (c->text[i++] == '\n')
            line++;
    for (; i < c->len && line <= l1 && err == 0; line++) {
        size_t end = i;
        while (end < c->len && c->text[end] != '\n')
            end++;
        size_t col = 0, from = i, to = end;
        if (line == l1) /* the last line up to the node's end (characters, not bytes) */
            for (to = i; to < end && col < n->end_mark.column; to++)
                col += ((unsigned char)c->text[to] & 0xC0) != 0x80;
        if (line == l0) /* the first line from the node's start: what is before it, spaces */
            for (col = 0; from < to && col < n->start_mark.column; from++) {
                bool lead = ((unsigned char)c->text[from] & 0xC0) != 0x80;
                col += lead;
                if (lead)
                    err = err ? err : ck_buf_append(&b, " ", 1);
            }
        if (err == 0)
            err = ck_buf_append(&b, c->text + from, to - from);
        if (err == 0)
            err = ck_buf_append(&b, "\n", 1);
        i = end + 1;
    }
    if (err < 0) {
        ck_buf_release(&b);
        return err;
    }
    *out = ck_buf_detach(&b);
    return *out ? 0 : ck_error(CK_ENOMEM, "out of memory");
}

/* pack.graph: a layer list (mapping or bare list, kept as YAML text and
 * checked when a checkpoint is packed) or file:/path */
static int parse_pack_graph(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    struct ck_config *cfg = c->cfg;
    free(cfg->pack_graph_yaml);
    free(cfg->pack_graph_file);
    free(cfg->pack_graph_label);
    cfg->pack_graph_yaml = cfg->pack_graph_file = cfg->pack_graph_label = NULL;
    if (n->type == YAML_SCALAR_NODE) {
        const char *s = NULL;
        int err = scalar_str(c, n, key, &s);
        if (err < 0)
            return err;
        if (c->flag && strncmp(s, "file:", 5) != 0 && s[0]) /* pack --graph FILE */
            return set_str(&cfg->pack_graph_file, s);
        if (strncmp(s, "file:", 5) != 0 || !s[5])
            return bad(c, n, key, "must be a layer list or file:/path");
        return config_path(c, s + 5, true, &cfg->pack_graph_file);
    }
    /* as written, so that a layer's line is the config's line */
    int err = source_text(c, n, &cfg->pack_graph_yaml);
    if (err < 0)
        return err;
    if ((err = set_str(&cfg->pack_graph_label, c->text ? c->doc->name : "pack.graph")) < 0)
        return err;
    if (cfg->pack_graph_yaml)
        return 0;
    struct ck_buf b = CK_BUF_INIT;
    struct ck_yaml_out o;
    err = ck_yaml_out_begin(&o, &b);
    ck_yaml_copy(&o, c->doc, n);
    if (err == 0)
        err = ck_yaml_out_end(&o);
    if (err < 0) {
        ck_buf_release(&b);
        return err;
    }
    cfg->pack_graph_yaml = ck_buf_detach(&b);
    return 0;
}

/* verify.inputs: a list of files, or the word "recorded" */
static int parse_verify_inputs(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    struct ck_config *cfg = c->cfg;
    const char *s = NULL;
    int err;
    ck_strlist_release(&cfg->verify_inputs);
    if (n->type == YAML_SCALAR_NODE) {
        if ((err = scalar_str(c, n, key, &s)) < 0)
            return err;
        if (strcmp(s, "recorded") != 0)
            return bad(c, n, key, "must be a list of files or 'recorded'");
        cfg->verify_source = CK_VERIFY_RECORDED;
        return 0;
    }
    if (n->type != YAML_SEQUENCE_NODE)
        return bad(c, n, key, "must be a list of files or 'recorded'");
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        char *path = NULL;
        if ((err = scalar_str(c, ck_yaml_node(c->doc, *it), key, &s)) < 0 ||
            (err = config_path(c, s, true, &path)) < 0)
            return err;
        err = ck_strlist_add(&cfg->verify_inputs, path);
        free(path);
        if (err < 0)
            return err;
    }
    cfg->verify_source = cfg->verify_inputs.n ? CK_VERIFY_FILES : CK_VERIFY_AUTO;
    return 0;
}

static int parse_verify_opt(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    struct ck_config *cfg = c->cfg;
    const char *s = NULL;
    int err = scalar_str(c, n, key, &s);
    if (err < 0)
        return err;
    if (!strcmp(key, "verify.on_failure")) {
        if (!strcmp(s, "hold"))
            cfg->verify_on_failure = CK_VERIFY_HOLD;
        else if (!strcmp(s, "upload_marked"))
            cfg->verify_on_failure = CK_VERIFY_UPLOAD_MARKED;
        else
            return bad(c, n, key, "must be hold or upload_marked");
        return 0;
    }
    if (!strcmp(key, "verify.max_memory")) {
        if (ck_parse_size(s, &cfg->verify_max_memory) < 0)
            return bad(c, n, key, "must be a size like 512MiB or 8G (0: no limit)");
        return 0;
    }
    char *end;
    errno = 0;
    if (!strcmp(key, "verify.threads")) {
        long t = strtol(s, &end, 10);
        if (end == s || *end || errno || t < 1 || t > CK_INFER_MAX_THREADS)
            return bad(c, n, key, "must be a whole number from 1 to 64");
        cfg->verify_threads = (int)t;
        return 0;
    }
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < 0)
        return bad(c, n, key, "must be a number >= 0");
    *(!strcmp(key, "verify.atol") ? &cfg->verify_atol : &cfg->verify_rtol) = v;
    return 0;
}

/* upload.stores: a list of mappings; each is checked (scheme, URL, secret
 * references) here so a bad store fails at load with its line. */
static int parse_upload_stores(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    struct ck_config *cfg = c->cfg;
    if (n->type != YAML_SEQUENCE_NODE)
        return bad(c, n, key, "must be a list of stores ({url: ...})");
    for (size_t i = 0; i < cfg->n_upload_stores; i++)
        ck_store_spec_release(&cfg->upload_stores[i]);
    free(cfg->upload_stores);
    cfg->upload_stores = NULL;
    cfg->n_upload_stores = 0;
    size_t count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (count == 0)
        return 0;
    if (!(cfg->upload_stores = calloc(count, sizeof *cfg->upload_stores)))
        return ck_error(CK_ENOMEM, "out of memory");
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        yaml_node_t *item = ck_yaml_node(c->doc, *it);
        struct ck_store_spec *spec = &cfg->upload_stores[cfg->n_upload_stores++];
        char full[128];
        int err;
        if (item->type == YAML_SCALAR_NODE) {
            if ((err = ck_store_spec_set(spec, "url", (const char *)item->data.scalar.value)) < 0)
                return err;
        } else if (item->type != YAML_MAPPING_NODE) {
            return bad(c, item, key, "items must be a URL or a mapping with 'url'");
        } else {
            for (yaml_node_pair_t *p = item->data.mapping.pairs.start;
                 p < item->data.mapping.pairs.top; p++) {
                yaml_node_t *kn = ck_yaml_node(c->doc, p->key), *vn = ck_yaml_node(c->doc, p->value);
                const char *k = NULL, *v = NULL;
                if ((err = scalar_str(c, kn, key, &k)) < 0)
                    return err;
                snprintf(full, sizeof full, "%s.%s", key, k);
                if ((err = scalar_str(c, vn, full, &v)) < 0)
                    return err;
                char *path = NULL; /* key files and secret references: the path rule */
                if ((!strcmp(k, "key") || !strcmp(k, "credentials")) &&
                    (err = config_path(c, v, !strcmp(k, "key"), &path)) < 0)
                    return err;
                err = ck_store_spec_set(spec, k, path ? path : v);
                free(path);
                if (err < 0) {
                    char msg[512];
                    snprintf(msg, sizeof msg, "%s", ck_error_msg());
                    return bad(c, kn, full, msg);
                }
            }
        }
        if ((err = ck_store_check(spec)) < 0) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", ck_error_msg());
            return bad(c, item, key, msg);
        }
    }
    return 0;
}

static int parse_upload_opt(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    struct ck_upload_opts *o = &c->cfg->upload;
    const char *name = key + strlen("upload."), *s = NULL;
    struct ck_yaml_value v;
    int err;
    ck_yaml_resolve(n, &v);
    if (!strcmp(name, "concurrency") || !strcmp(name, "retries") || !strcmp(name, "transfers")) {
        if (v.type != CK_Y_INT || v.i < 0 || v.i > 64)
            return bad(c, n, key, "must be a whole number from 0 to 64");
        if (name[0] != 'r' && v.i < 1)
            return bad(c, n, key, "must be at least 1");
        *(name[0] == 'c' ? &o->concurrency : name[0] == 't' ? &o->transfers : &o->retries) =
            (int)v.i;
        return 0;
    }
    if ((err = scalar_str(c, n, key, &s)) < 0)
        return err;
    if (!strcmp(name, "sha256")) {
        if (strcmp(s, "always") && strcmp(s, "known"))
            return bad(c, n, key, "must be always or known");
        o->sha256_always = s[0] == 'a';
        return 0;
    }
    if (!strcmp(name, "max_rate") || !strcmp(name, "part_size") ||
        !strcmp(name, "multipart_threshold")) {
        uint64_t x;
        if (ck_parse_size(s, &x) < 0)
            return bad(c, n, key, "must be a size like 8MiB");
        if (name[0] == 'p' && (x < (5u << 20) || x > (5ull << 30)))
            return bad(c, n, key, "must be between 5MiB and 5GiB (S3's limits)");
        *(name[0] == 'm' && name[1] == 'a' ? &o->max_rate
          : name[0] == 'p'                 ? &o->part_size
                                           : &o->multipart_threshold) = x;
        return 0;
    }
    double d;
    if (ck_parse_duration(s, &d) < 0)
        return bad(c, n, key, "must be a duration like 500ms, 2s or 5m");
    *(!strcmp(name, "retry_base") ? &o->retry_base : !strcmp(name, "grace") ? &o->grace
                                                                          : &o->timeout) = d;
    return 0;
}

/* hooks.*, listen: the keys of hooks/ and agent/ops.c. */
static int hook_item_key(struct parse_ctx *c, yaml_node_pair_t *p, const char *key, size_t i,
                         char *full, size_t fullsz, const char **k, yaml_node_t **vn)
{
    int err;
    if ((err = scalar_str(c, ck_yaml_node(c->doc, p->key), key, k)) < 0)
        return err;
    snprintf(full, fullsz, "%s[%zu].%s", key, i, *k);
    *vn = ck_yaml_node(c->doc, p->value);
    return 0;
}

/* A list of strings, or one string taken as a list of one, into (*v, *n). */
static int hook_strv(struct parse_ctx *c, yaml_node_t *n, const char *key, char ***v, size_t *nv)
{
    const char *s = NULL;
    int err;
    if (n->type == YAML_SCALAR_NODE) {
        if (!(*v = calloc(2, sizeof **v)) || !((*v)[0] = strdup((const char *)n->data.scalar.value)))
            return ck_error(CK_ENOMEM, "out of memory");
        *nv = 1;
        return 0;
    }
    if (n->type != YAML_SEQUENCE_NODE)
        return bad(c, n, key, "must be a string or a list of strings");
    size_t count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (!(*v = calloc(count + 1, sizeof **v)))
        return ck_error(CK_ENOMEM, "out of memory");
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
        if ((err = scalar_str(c, ck_yaml_node(c->doc, *it), key, &s)) < 0)
            return err;
        if (!((*v)[*nv] = strdup(s)))
            return ck_error(CK_ENOMEM, "out of memory");
        ++*nv;
    }
    return 0;
}

static int hook_duration(struct parse_ctx *c, yaml_node_t *n, const char *key, double *out)
{
    const char *s = NULL;
    int err;
    if ((err = scalar_str(c, n, key, &s)) < 0)
        return err;
    if (ck_parse_duration(s, out) < 0 || *out <= 0)
        return bad(c, n, key, "must be a positive duration like 500ms, 10s or 2m");
    return 0;
}

/* The keys of one item of a list key (hooks.webhooks[i], hooks.exec[i]): a
 * table like the top-level one, over the item's struct. */
/* I_REF, I_REFV: an I_STR, I_STRV whose "file:X" references follow the path rule */
enum item_type { I_STR, I_REF, I_STRV, I_REFV, I_PATH, I_TIMEOUT };

#define NO_FIELD ((size_t)-1)

struct item_key {
    const char *name;
    enum item_type type;
    size_t offset;
    size_t count_offset; /* I_STRV: its size_t count */
    size_t shell_offset; /* I_STRV: a bool set when the value was one string, or NO_FIELD */
    const char *twice;   /* I_STRV: the complaint when the list is given twice */
};

#define WH(f) offsetof(struct ck_webhook_conf, f)
#define EX(f) offsetof(struct ck_exec_conf, f)

static const struct item_key webhook_keys[] = {
    {"url", I_REF, WH(url), 0, NO_FIELD, NULL},
    {"secret", I_REFV, WH(secrets), WH(nsecrets), NO_FIELD,
     "repeats the secret: use 'secrets' for several"},
    {"secrets", I_REFV, WH(secrets), WH(nsecrets), NO_FIELD,
     "repeats the secret: use 'secrets' for several"},
    {"events", I_STRV, WH(events), WH(nevents), NO_FIELD, "is given twice"},
    {"template", I_PATH, WH(template_path), 0, NO_FIELD, NULL},
    {"timeout", I_TIMEOUT, WH(timeout), 0, NO_FIELD, NULL},
    {NULL, I_STR, 0, 0, NO_FIELD, NULL},
};

/* a list runs without a shell; one string runs with /bin/sh -c */
static const struct item_key exec_keys[] = {
    {"event", I_STR, EX(event), 0, NO_FIELD, NULL},
    {"command", I_STRV, EX(argv), EX(argc), EX(shell), "is given twice"},
    {"timeout", I_TIMEOUT, EX(timeout), 0, NO_FIELD, NULL},
    {"env", I_STRV, EX(env), EX(nenv), NO_FIELD, "is given twice"},
    {NULL, I_STR, 0, 0, NO_FIELD, NULL},
};

static int parse_item_value(struct parse_ctx *c, const struct item_key *ik, yaml_node_t *vn,
                            const char *full, void *base)
{
    char *field = (char *)base + ik->offset;
    const char *s = NULL;
    int err;
    switch (ik->type) {
    case I_STR:
        if ((err = scalar_str(c, vn, full, &s)) < 0)
            return err;
        return set_str((char **)field, s);
    case I_REF:
    case I_PATH:
        if ((err = scalar_str(c, vn, full, &s)) < 0)
            return err;
        return config_path(c, s, ik->type == I_PATH, (char **)field);
    case I_STRV:
    case I_REFV: {
        size_t *count = (size_t *)((char *)base + ik->count_offset);
        if (*count)
            return bad(c, vn, full, ik->twice);
        if (ik->shell_offset != NO_FIELD)
            *(bool *)((char *)base + ik->shell_offset) = vn->type == YAML_SCALAR_NODE;
        if ((err = hook_strv(c, vn, full, (char ***)field, count)) < 0)
            return err;
        for (size_t i = 0; ik->type == I_REFV && i < *count; i++) {
            char **v = &(*(char ***)field)[i], *path = NULL;
            if ((err = config_path(c, *v, false, &path)) < 0)
                return err;
            free(*v);
            *v = path;
        }
        return 0;
    }
    case I_TIMEOUT:
        return hook_duration(c, vn, full, (double *)field);
    }
    return 0;
}

/* One mapping of a list key through its item table. */
static int parse_item(struct parse_ctx *c, yaml_node_t *item, const char *key, size_t i,
                      const struct item_key *table, void *base)
{
    char full[128];
    for (yaml_node_pair_t *p = item->data.mapping.pairs.start; p < item->data.mapping.pairs.top;
         p++) {
        const char *k = NULL;
        yaml_node_t *vn;
        int err;
        if ((err = hook_item_key(c, p, key, i, full, sizeof full, &k, &vn)) < 0)
            return err;
        const struct item_key *ik = table;
        while (ik->name && strcmp(ik->name, k))
            ik++;
        if (!ik->name) {
            char known[256] = "is not a known key (";
            for (const struct item_key *t = table; t->name; t++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s",
                         t == table ? "" : ", ", t->name);
            snprintf(known + strlen(known), sizeof known - strlen(known), ")");
            return bad(c, ck_yaml_node(c->doc, p->key), full, known);
        }
        if ((err = parse_item_value(c, ik, vn, full, base)) < 0)
            return err;
    }
    return 0;
}

static int parse_webhooks(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    struct ck_hooks_conf *h = &c->cfg->hooks;
    char full[128];
    if (n->type != YAML_SEQUENCE_NODE)
        return bad(c, n, key, "must be a list of {url, secret, events, template, timeout}");
    size_t count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    for (size_t i = 0; i < h->nwebhooks; i++)
        free(h->webhooks[i].url); /* a repeated key replaces the list (rare: keep it simple) */
    free(h->webhooks);
    h->nwebhooks = 0;
    if (!(h->webhooks = calloc(count ? count : 1, sizeof *h->webhooks)))
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < count; i++) {
        yaml_node_t *item = ck_yaml_node(c->doc, n->data.sequence.items.start[i]);
        struct ck_webhook_conf *w = &h->webhooks[h->nwebhooks++];
        int err;
        w->line = ck_yaml_line(item);
        if (item->type != YAML_MAPPING_NODE)
            return bad(c, item, key, "items must be mappings with at least 'url'");
        if ((err = parse_item(c, item, key, i, webhook_keys, w)) < 0)
            return err;
        if (!w->url) {
            snprintf(full, sizeof full, "%s[%zu].url", key, i);
            return bad(c, item, full, "is missing");
        }
    }
    return ck_hooks_conf_check(h, c->doc->name);
}

static int parse_exec_hooks(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    struct ck_hooks_conf *h = &c->cfg->hooks;
    char full[128];
    if (n->type != YAML_SEQUENCE_NODE)
        return bad(c, n, key, "must be a list of {event, command, timeout}");
    size_t count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (h->nexecs)
        return bad(c, n, key, "is given twice");
    if (!(h->execs = calloc(count ? count : 1, sizeof *h->execs)))
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < count; i++) {
        yaml_node_t *item = ck_yaml_node(c->doc, n->data.sequence.items.start[i]);
        struct ck_exec_conf *e = &h->execs[h->nexecs++];
        int err;
        e->line = ck_yaml_line(item);
        if (item->type != YAML_MAPPING_NODE)
            return bad(c, item, key, "items must be mappings with 'event' and 'command'");
        if ((err = parse_item(c, item, key, i, exec_keys, e)) < 0)
            return err;
        if (!e->event || !e->argc) {
            snprintf(full, sizeof full, "%s[%zu]", key, i);
            return bad(c, item, full, "needs 'event' and 'command'");
        }
    }
    return ck_hooks_conf_check(h, c->doc->name);
}

static int parse_retry_schedule(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    struct ck_hooks_conf *h = &c->cfg->hooks;
    const char *s = NULL;
    int err;
    if (n->type != YAML_SEQUENCE_NODE)
        return bad(c, n, key, "must be a list of durations (the delay before each retry)");
    size_t count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    free(h->retry_schedule);
    h->nretry = 0;
    if (!(h->retry_schedule = calloc(count ? count : 1, sizeof *h->retry_schedule)))
        return ck_error(CK_ENOMEM, "out of memory");
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
        yaml_node_t *vn = ck_yaml_node(c->doc, *it);
        if ((err = scalar_str(c, vn, key, &s)) < 0)
            return err;
        if (ck_parse_duration(s, &h->retry_schedule[h->nretry]) < 0)
            return bad(c, vn, key, "must list durations like 5s, 10m, 2h");
        h->nretry++;
    }
    return 0;
}

static int parse_listen(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    char host[64];
    int port;
    const char *s = NULL;
    int err;
    if ((err = scalar_str(c, n, key, &s)) < 0)
        return err;
    if (ck_ops_parse_listen(s, key, host, sizeof host, &port) < 0)
        return bad(c, n, key, "must be PORT or HOST:PORT with an IP address (like 127.0.0.1:9464)");
    return set_str(&c->cfg->listen, s);
}

static int parse_min_free(struct parse_ctx *c, yaml_node_t *n, const char *key)
{
    const char *s = NULL;
    int err;
    if ((err = scalar_str(c, n, key, &s)) < 0)
        return err;
    if (ck_parse_size(s, &c->cfg->min_free) < 0)
        return bad(c, n, key, "must be a size like 20GiB or 500MB");
    return 0;
}

bool ck_config_has_retention(const struct ck_config *cfg)
{
    return cfg->keep_last > 0 || cfg->keep_every > 0 || cfg->keep_best_metric ||
           cfg->min_free > 0 || ck_config_has_store_retention(cfg);
}

bool ck_config_has_store_retention(const struct ck_config *cfg)
{
    return cfg->store_keep_last > 0 || cfg->store_keep_every > 0 || cfg->store_best_metric;
}

/* The retention keys together (a flag may have set one after the file). */
static int check_retention(const struct ck_config *cfg, const char *name)
{
    if (cfg->keep_last < 0 || cfg->keep_every < 0 || cfg->keep_best_count < 0)
        return ck_error(CK_ECONFIG, "'%s': retention: keep_last, keep_every and keep_best.count "
                        "must not be negative", name);
    if (cfg->keep_best_mode && strcmp(cfg->keep_best_mode, "min") &&
        strcmp(cfg->keep_best_mode, "max"))
        return ck_error(CK_ECONFIG, "'%s': retention.keep_best.mode: '%s' is not min or max", name,
                        cfg->keep_best_mode);
    if ((cfg->keep_best_mode || cfg->keep_best_count) && !cfg->keep_best_metric)
        return ck_error(CK_ECONFIG, "'%s': retention.keep_best needs 'metric'", name);
    if (cfg->keep_best_metric && (!cfg->keep_best_metric[0] ||
                                  strpbrk(cfg->keep_best_metric, "=\"\n\r")))
        return ck_error(CK_ECONFIG, "'%s': retention.keep_best.metric: '%s' is not a metric name",
                        name, cfg->keep_best_metric);
    if (cfg->retention_metrics_file && !cfg->keep_best_metric && !cfg->store_best_metric)
        return ck_error(CK_ECONFIG, "'%s': retention.metrics_file is read for keep_best.metric, "
                        "which is not set", name);
    if (cfg->store_keep_last < 0 || cfg->store_keep_every < 0 || cfg->store_best_count < 0)
        return ck_error(CK_ECONFIG, "'%s': retention.store: keep_last, keep_every and "
                        "keep_best.count must not be negative", name);
    if (cfg->store_best_mode && strcmp(cfg->store_best_mode, "min") &&
        strcmp(cfg->store_best_mode, "max"))
        return ck_error(CK_ECONFIG, "'%s': retention.store.keep_best.mode: '%s' is not min or max",
                        name, cfg->store_best_mode);
    if ((cfg->store_best_mode || cfg->store_best_count) && !cfg->store_best_metric)
        return ck_error(CK_ECONFIG, "'%s': retention.store.keep_best needs 'metric'", name);
    if (cfg->store_best_metric && (!cfg->store_best_metric[0] ||
                                   strpbrk(cfg->store_best_metric, "=\"\n\r")))
        return ck_error(CK_ECONFIG, "'%s': retention.store.keep_best.metric: '%s' is not a metric "
                        "name", name, cfg->store_best_metric);
    if (!(cfg->retention_interval >= 1))
        return ck_error(CK_ECONFIG, "'%s': retention.interval must be at least 1s", name);
    return 0;
}

static const struct key *find_key(const char *name)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (!strcmp(keys[i].name, name))
            return &keys[i];
    return NULL;
}

static bool is_section(const char *prefix)
{
    size_t n = strlen(prefix);
    for (size_t i = 0; i < NKEYS; i++)
        if (!strncmp(keys[i].name, prefix, n) && keys[i].name[n] == '.')
            return true;
    return false;
}

static int walk(struct parse_ctx *c, yaml_node_t *map, const char *prefix)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *kn = ck_yaml_node(c->doc, p->key), *vn = ck_yaml_node(c->doc, p->value);
        const char *k = NULL;
        int err;
        if ((err = scalar_str(c, kn, prefix[0] ? prefix : "(top)", &k)) < 0)
            return err;
        char full[256];
        snprintf(full, sizeof full, "%s%s%s", prefix, prefix[0] ? "." : "", k);
        const struct key *def = find_key(full);
        if (def) {
            if ((err = parse_value(c, def, vn, full)) < 0)
                return err;
        } else if (is_section(full)) {
            if (vn->type != YAML_MAPPING_NODE)
                return bad(c, vn, full, "must be a mapping");
            if ((err = walk(c, vn, full)) < 0)
                return err;
        } else {
            return bad(c, kn, full, "is not a known key (see 'ckptd config --keys')");
        }
    }
    return 0;
}

/* Every env:NAME the document holds, wherever (store credentials, webhook
 * URLs and keys, any key that takes a secret): the variables exec hooks
 * must never see. */
static int collect_secret_env(struct ck_yaml_doc *doc, yaml_node_t *n,
                              struct ck_hooks_conf *h, int depth)
{
    int err;
    if (!n || depth > 64)
        return 0;
    if (n->type == YAML_SCALAR_NODE) {
        const char *v = (const char *)n->data.scalar.value;
        if (strncmp(v, "env:", 4) || !v[4])
            return 0;
        for (size_t i = 0; i < h->nsecret_env; i++)
            if (!strcmp(h->secret_env[i], v + 4))
                return 0;
        char **p = realloc(h->secret_env, (h->nsecret_env + 1) * sizeof *p);
        if (!p)
            return ck_error(CK_ENOMEM, "out of memory");
        h->secret_env = p;
        if (!(p[h->nsecret_env] = strdup(v + 4)))
            return ck_error(CK_ENOMEM, "out of memory");
        h->nsecret_env++;
        return 0;
    }
    if (n->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
             it++)
            if ((err = collect_secret_env(doc, ck_yaml_node(doc, *it), h, depth + 1)) < 0)
                return err;
    } else if (n->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++)
            if ((err = collect_secret_env(doc, ck_yaml_node(doc, p->value), h, depth + 1)) < 0)
                return err;
    }
    return 0;
}

int ck_config_load(struct ck_config *cfg, const char *path)
{
    struct ck_buf b = CK_BUF_INIT;
    struct ck_yaml_doc doc;
    int err = ck_read_file(path, CONFIG_MAX, &b);
    if (err < 0) {
        ck_buf_release(&b);
        return ck_error_wrap(CK_ECONFIG, "cannot read config");
    }
    if ((err = ck_yaml_load(&doc, path, ck_buf_str(&b), b.len)) < 0) {
        ck_buf_release(&b);
        return CK_ECONFIG;
    }
    yaml_node_t *root = ck_yaml_root(&doc);
    char dir[4096], base[4096];
    ck_dirname(dir, sizeof dir, path);
    if (!realpath(dir, base)) {
        ck_yaml_release(&doc);
        ck_buf_release(&b);
        return ck_error_os(CK_ECONFIG, "'%s': cannot resolve its folder", path);
    }
    struct parse_ctx c = {cfg, &doc, ck_buf_str(&b), b.len, false, base};
    if (root && root->type != YAML_MAPPING_NODE)
        err = ck_error(CK_ECONFIG, "'%s' line %d: the config must be a mapping of keys", path,
                       ck_yaml_line(root));
    else if (root)
        err = walk(&c, root, "");
    if (err == 0 && root)
        err = collect_secret_env(&doc, root, &cfg->hooks, 0);
    if (err == 0 && cfg->pack_weights && ck_weights_key_check(cfg->pack_weights) < 0)
        err = ck_error_wrap(CK_ECONFIG, "'%s': pack.weights", path);
    if (err == 0 && ck_patterns_check(&cfg->ckpt.patterns) < 0)
        err = ck_error_wrap(CK_ECONFIG, "'%s': checkpoints.patterns", path);
    if (err == 0 && cfg->verify_source == CK_VERIFY_RECORDED && cfg->verify_expected.n)
        err = ck_error(CK_ECONFIG,
                       "'%s': verify.expected: not with verify.inputs: recorded (a recorded set "
                       "carries its own known-good outputs)",
                       path);
    if (err == 0)
        err = check_retention(cfg, path);
    if (err == 0)
        err = set_str(&cfg->source, path);
    ck_yaml_release(&doc);
    ck_buf_release(&b);
    return err;
}

int ck_config_set(struct ck_config *cfg, const char *key, const char *value, const char *origin)
{
    const struct key *k = NULL;
    for (size_t i = 0; i < NKEYS && !k; i++)
        if (!strcmp(keys[i].name, key))
            k = &keys[i];
    if (!k)
        return ck_error(CK_ECONFIG, "%s: '%s' is not a config key", origin, key);
    struct ck_yaml_doc doc;
    memset(&doc, 0, sizeof doc);
    snprintf(doc.name, sizeof doc.name, "%s", origin);
    if (!yaml_document_initialize(&doc.doc, NULL, NULL, NULL, 1, 1))
        return ck_error(CK_ENOMEM, "out of memory");
    doc.loaded = true;
    int id = yaml_document_add_scalar(&doc.doc, NULL, (yaml_char_t *)value, (int)strlen(value),
                                      YAML_PLAIN_SCALAR_STYLE);
    int err;
    if (id == 0) {
        err = ck_error(CK_ENOMEM, "out of memory");
    } else {
        struct parse_ctx c = {cfg, &doc, NULL, 0, true, NULL};
        err = parse_value(&c, k, ck_yaml_node(&doc, id), k->name);
    }
    ck_yaml_release(&doc);
    return err;
}

int ck_config_apply(struct ck_config *cfg, const struct ck_config_override *ov, size_t n)
{
    int err;
    for (size_t i = 0; i < n; i++)
        if ((err = ck_config_set(cfg, ov[i].key, ov[i].value, ov[i].origin)) < 0)
            return err;
    return 0;
}

int ck_config_for_dir(struct ck_config *cfg, const char *explicit_path, const char *dir)
{
    char path[4096];
    ck_config_init(cfg);
    if (explicit_path)
        return ck_config_load(cfg, explicit_path);
    if (dir && ck_path_join(path, sizeof path, dir, "ckptd.yaml") == 0 && ck_exists(path))
        return ck_config_load(cfg, path);
    return 0;
}

void ck_config_print_keys(void)
{
    for (size_t i = 0; i < NKEYS; i++)
        printf("%-32s %s\n", keys[i].name, keys[i].help);
}
