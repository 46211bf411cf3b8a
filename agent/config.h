/* The config: a YAML file (--config FILE, else DIR/ckptd.yaml) read through
 * a table of keys (config.c). Command-line flags override it. An unknown
 * key or a value of the wrong type is an error naming the key and its line.
 * Secrets are never values here: only "env:NAME" or "file:/path" references. */
#ifndef CK_CONFIG_H
#define CK_CONFIG_H

#include "agent/rules.h"
#include "hooks/hooks.h"

#include "common/strlist.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stores/store.h"

enum ck_init_kind { CK_INIT_NONE, CK_INIT_FILE, CK_INIT_PMF };

/* verify.on_failure: what happens to an archive that fails verification */
enum ck_verify_on_failure {
    CK_VERIFY_HOLD,          /* not uploaded (the default) */
    CK_VERIFY_UPLOAD_MARKED, /* uploaded, marked failed in data/build_parameters.yaml */
};

/* verify.inputs: where the gate's inputs come from */
enum ck_verify_source {
    CK_VERIFY_AUTO,     /* not set: the archive's recorded test sets when it has some, else the
                           engine's fixed inputs */
    CK_VERIFY_FILES,    /* a list of files (verify_inputs) */
    CK_VERIFY_RECORDED, /* "recorded": the archive's recorded test sets, which must exist */
};

struct ck_config {
    char *source;                 /* the file it came from, or NULL for defaults */

    /* model: */
    char *model_name;             /* default: the folder's name */
    char *model_configuration;    /* training configuration file; default: found by name */
    enum ck_init_kind init_kind;  /* model.initialisation */
    char *init_path;              /* file or PMF tree to initialise from */
    char *init_name;              /* optional name */
    char *init_checkpoint;        /* pmf: the reference in that tree */
    char *build_parameters_yaml;  /* model.build_parameters as YAML text, or NULL */

    /* checkpoints: */
    struct ck_ckpt_rules ckpt;    /* patterns, ignore, folder_markers (agent/rules.h) */
    int64_t steps_per_epoch;      /* epoch = step / steps_per_epoch when only a step is named */
    double min_age;               /* seconds a file must be unchanged before scan takes it */
    bool mirror_deletes;          /* unregister checkpoints whose source was deleted */

    /* training: */
    char *finished_marker;        /* a file whose appearance ends the training: finished */
    char *failed_marker;          /* ... failed */

    /* watch: (agent/watch.h) */
    bool watch_poll;              /* poll instead of inotify everywhere */
    double watch_poll_interval;   /* seconds between two polls (default 2) */
    double watch_settle;          /* a file must be unchanged this long (default 0.2) */
    bool watch_check_writers;     /* look in /proc for processes writing a file (default true) */
    double watch_reconcile_interval; /* a full pass this often, to catch anything missed */
    double watch_grace_period;    /* after SIGTERM: time for the command to exit (default 20) */

    /* log: */
    int log_format;               /* -1: not set */
    int log_level;                /* -1: not set */

    /* hooks: webhooks, exec hooks, retry schedule (hooks/hooks.h) */
    struct ck_hooks_conf hooks;

    /* operations: */
    char *metrics_file;           /* scan: Prometheus textfile collector output */
    char *listen;                 /* watch: HOST:PORT of /healthz /readyz /metrics /status */

    /* upload: (stores/store.h) */
    struct ck_store_spec *upload_stores; /* owned: upload.stores, in order */
    size_t n_upload_stores;
    struct ck_upload_opts upload;        /* upload.concurrency, .max_rate, .part_size, ... */

    /* pack / verify: the deployment stages of the pipeline (agent/stages.c) */
    struct ck_strlist pack_formats; /* writer names (writers/writer.h); empty: no packing */
    char *pack_graph_yaml;          /* pack.graph given inline: the layer list as YAML text */
    char *pack_graph_file;          /* pack.graph: file:/path */
    /* what errors in the inline layer list name: the config file (whose line
     * numbers pack_graph_yaml keeps: its text as written, earlier lines
     * blank), or "pack.graph" for a flag */
    char *pack_graph_label;
    char *pack_weights;             /* pack.weights: where a training dict's model tensors are */
    char *pack_dir;                 /* where archives go; NULL: DIR/data/deploy */
    char *pack_sign_key;            /* mldef: sign with this key (file:/path) */
    enum ck_verify_source verify_source; /* verify.inputs: files, "recorded" or not set */
    struct ck_strlist verify_inputs;   /* input files (.npy, csv, raw float32) when FILES */
    struct ck_strlist verify_expected; /* expected outputs (same forms); empty: the checkpoint's */
    bool verify_record;                /* record what a passing gate ran into the archive */
    double verify_atol, verify_rtol;
    double verify_timeout;        /* CPU seconds of the engine's child */
    uint64_t verify_max_memory;   /* bytes of address space of the child; 0: no limit */
    int verify_threads;           /* threads of the engine's kernels (default 1) */
    enum ck_verify_on_failure verify_on_failure;

    /* retention: which checkpoints may leave the local disk once every store
     * holds a verified copy (agent/retention.h, docs/retention.md); 0/NULL: not set */
    int64_t keep_last;            /* the newest N stay */
    int64_t keep_every;           /* checkpoints whose epoch is a multiple of E stay */
    char *keep_best_metric;       /* keep_best.metric */
    char *keep_best_mode;         /* keep_best.mode: min or max (default min) */
    int64_t keep_best_count;      /* keep_best.count (default 1 when a metric is set) */
    char *retention_metrics_file; /* a metrics.jsonl or CSV the trainer appends to */
    uint64_t min_free;            /* bytes that must stay free on DIR's filesystem */
    bool without_store;           /* retention with no store configured */
    double retention_interval;    /* the watcher: how often it looks again (min_free, held) */
    /* retention.store: which checkpoints the stores keep (remote retention) */
    int64_t store_keep_last, store_keep_every, store_best_count;
    char *store_best_metric, *store_best_mode;

    /* nodes: this sidecar's node of a multi-node training (agent/nodes.h,
     * which adds the launchers' variables); -1: not set here */
    int64_t nodes_rank, nodes_count;
    char *nodes_rank_from, *nodes_count_from; /* the file and line, or the flag, that set them */
};

/* Whether any retention key asks for deletions. */
bool ck_config_has_retention(const struct ck_config *cfg);
/* retention.store.* is set: the stores are pruned (agent/retention.h). */
bool ck_config_has_store_retention(const struct ck_config *cfg);

/* Defaults only. */
void ck_config_init(struct ck_config *cfg);
void ck_config_release(struct ck_config *cfg);
/* Loads path over the defaults; CK_ECONFIG naming the key and line on bad input. */
int ck_config_load(struct ck_config *cfg, const char *path);
/* The config for a directory: --config when given, else DIR/ckptd.yaml if it
 * exists, else the defaults. */
int ck_config_for_dir(struct ck_config *cfg, const char *explicit_path, const char *dir);
/* A value given for a key elsewhere than the file (a command-line flag). */
struct ck_config_override {
    const char *key;    /* a config key, like "watch.settle" */
    const char *value;  /* as it would be written in YAML (plain) */
    const char *origin; /* what gave it, for messages ("--settle") */
};
/* Sets key from one plain value through the key's own parser (the same
 * types and checks as the file); CK_ECONFIG naming origin and the key. */
int ck_config_set(struct ck_config *cfg, const char *key, const char *value, const char *origin);
/* ck_config_set for each override, in order. */
int ck_config_apply(struct ck_config *cfg, const struct ck_config_override *ov, size_t n);
/* Writes every key with its help text (for `ckptd config --keys`). */
void ck_config_print_keys(void);


/* "250ms", "2s", "5m", "1h" or a bare number of seconds. */
int ck_parse_duration(const char *s, double *out);
/* "64MiB", "1G", "4096" bytes. */
int ck_parse_size(const char *s, uint64_t *out);

#endif
