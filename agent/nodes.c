#include "agent/nodes.h"
#include "common/error.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A launcher's variable and, for MPI, the variable that says how many of its
 * processes run on this node: MPI ranks count processes, so they are node
 * numbers only with one process per node. */
struct var {
    const char *name;
    const char *local_size;
};

/* In the order they are named in messages (docs/multinode.md lists them). */
static const struct var rank_vars[] = {
    {"SLURM_NODEID", NULL},         /* SLURM: the node's index in the job (step) */
    {"PET_NODE_RANK", NULL},        /* torchrun's --node-rank as Kubeflow's PyTorchJob sets it */
    {"GROUP_RANK", NULL},           /* torchrun/elastic: the node's rank */
    {"JOB_COMPLETION_INDEX", NULL}, /* Kubernetes Indexed Jobs, JobSet */
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}, /* Open MPI */
    {"PMI_RANK", "MPI_LOCALNRANKS"},                        /* MPICH/Hydra, Intel MPI */
};
static const struct var count_vars[] = {
    {"SLURM_NNODES", NULL},
    {"PET_NNODES", NULL}, /* torchrun's --nnodes: N or an elastic MIN:MAX */
    {"NNODES", NULL},
    {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"PMI_SIZE", "MPI_LOCALNRANKS"},
};
#define NVARS(a) (sizeof(a) / sizeof(a)[0])

/* A whole number in [min, max], decimal digits only (no sign, no space). */
static bool parse_num(const char *s, long min, long max, long *out)
{
    long v = 0;
    if (!*s || strlen(s) > 9)
        return false;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return false;
        v = v * 10 + (*p - '0');
    }
    *out = v;
    return v >= min && v <= max;
}

static void append(char *out, size_t outsz, const char *text)
{
    size_t n = strlen(out);
    if (n + 1 < outsz)
        snprintf(out + n, outsz - n, "%s%s", n ? ", " : "", text);
}

/* One variable's value: a node number in [min, max], or torchrun's elastic
 * "MIN:MAX" with MIN == MAX for a count. */
static int var_value(const char *key, const char *name, const char *v, long min, long max,
                     long *out)
{
    const char *colon = strchr(v, ':');
    if (colon && !strcmp(name, "PET_NNODES")) {
        char lo[16];
        long a, b;
        size_t n = (size_t)(colon - v);
        if (n < sizeof lo) {
            memcpy(lo, v, n);
            lo[n] = '\0';
            if (parse_num(lo, min, max, &a) && parse_num(colon + 1, min, max, &b)) {
                if (a == b) {
                    *out = a;
                    return 0;
                }
                return ck_error(CK_ECONFIG,
                                "%s: %s='%s' is an elastic range of nodes: the parts of a step "
                                "are counted against a fixed number; set %s",
                                key, name, v, key);
            }
        }
    }
    if (!parse_num(v, min, max, out))
        return ck_error(CK_ECONFIG, "%s: %s='%.40s' is not a %s from %ld to %ld", key, name, v,
                        min ? "node count" : "node rank", min, max);
    return 0;
}

/* MPI ranks are node numbers only with one process per node. */
static int one_per_node(const char *key, const struct var *var, ck_nodes_getenv_fn env)
{
    const char *v = var->local_size ? env(var->local_size) : NULL;
    long n;
    if (!v || !*v || !parse_num(v, 1, 1 << 20, &n) || n == 1)
        return 0;
    return ck_error(CK_ECONFIG,
                    "%s: %s counts processes, and %s=%ld says this node runs %ld of them: start "
                    "one ckptd per node (mpirun --map-by ppr:1:node) or set nodes.rank and "
                    "nodes.count",
                    key, var->name, var->local_size, n, n);
}

/* The value the launcher variables give key, when any does: every variable
 * set must hold a number in [min, max] and all must agree. *found false when
 * none is set. */
static int from_env(const char *key, const struct var *vars, size_t nvars, long min, long max,
                    ck_nodes_getenv_fn env, long *value, char *from, size_t fromsz, bool *found)
{
    const struct var *first = NULL;
    int err;
    *found = false;
    for (size_t i = 0; i < nvars; i++) {
        const char *v = env(vars[i].name);
        long x;
        if (!v || !*v)
            continue;
        if ((err = var_value(key, vars[i].name, v, min, max, &x)) < 0)
            return err;
        if (!first) {
            first = &vars[i];
            *value = x;
            snprintf(from, fromsz, "%s=%s", vars[i].name, v);
        } else if (x != *value) {
            return ck_error(CK_ECONFIG,
                            "%s: the launchers disagree (%s, %s=%.40s): set %s in the config",
                            key, from, vars[i].name, v, key);
        }
        if ((err = one_per_node(key, &vars[i], env)) < 0)
            return err;
    }
    *found = first != NULL;
    return 0;
}

/* The variables of vars that are set, as NAME=VALUE notes with why, into unused. */
static void note_unused(char *unused, size_t sz, const struct var *vars, size_t nvars,
                        ck_nodes_getenv_fn env, const char *why)
{
    for (size_t i = 0; i < nvars; i++) {
        const char *v = env(vars[i].name);
        char note[160];
        if (!v || !*v)
            continue;
        snprintf(note, sizeof note, "%s=%.40s (%s)", vars[i].name, v, why);
        append(unused, sz, note);
    }
}

static const char *real_getenv(const char *name)
{
    return getenv(name);
}

int ck_nodes_resolve(struct ck_nodes *out, const struct ck_config *cfg, ck_nodes_getenv_fn env)
{
    long count = 1, rank = 0;
    bool found = false;
    int err;
    memset(out, 0, sizeof *out);
    if (!env)
        env = real_getenv;
    /* the count: the config, else the launchers, else a single node */
    if (cfg->nodes_count > 0) {
        count = cfg->nodes_count;
        snprintf(out->count_from, sizeof out->count_from, "%s", cfg->nodes_count_from);
        note_unused(out->unused, sizeof out->unused, count_vars, NVARS(count_vars), env,
                    "nodes.count is set");
    } else {
        if ((err = from_env("nodes.count", count_vars, NVARS(count_vars), 1, CK_NODES_MAX, env,
                            &count, out->count_from, sizeof out->count_from, &found)) < 0)
            return err;
        if (!found)
            snprintf(out->count_from, sizeof out->count_from, "default: a single node");
    }
    /* the rank: the config, else the launchers when there are several nodes
     * (a rank alone, like an Indexed Job's index, does not make a node of
     * several: a sweep of single-node trainings has one too; count 1 is a
     * single node whatever a launcher numbers it) */
    if (cfg->nodes_rank >= 0) {
        rank = cfg->nodes_rank;
        snprintf(out->rank_from, sizeof out->rank_from, "%s", cfg->nodes_rank_from);
        note_unused(out->unused, sizeof out->unused, rank_vars, NVARS(rank_vars), env,
                    "nodes.rank is set");
    } else if (count == 1) {
        snprintf(out->rank_from, sizeof out->rank_from, "default");
        note_unused(out->unused, sizeof out->unused, rank_vars, NVARS(rank_vars), env,
                    cfg->nodes_count > 0 || found ? "a single node" : "no node count is set");
    } else {
        if ((err = from_env("nodes.rank", rank_vars, NVARS(rank_vars), 0, CK_NODES_MAX - 1, env,
                            &rank, out->rank_from, sizeof out->rank_from, &found)) < 0)
            return err;
        if (!found)
            return ck_error(CK_ECONFIG,
                            "nodes.rank: nodes.count is %ld (%s) but nothing says which node this "
                            "is: set nodes.rank (or SLURM_NODEID, PET_NODE_RANK, GROUP_RANK, "
                            "JOB_COMPLETION_INDEX, OMPI_COMM_WORLD_RANK, PMI_RANK)",
                            count, out->count_from);
    }
    if (rank >= count)
        return ck_error(CK_ECONFIG, "nodes.rank: %ld (%s) is not below nodes.count %ld (%s)", rank,
                        out->rank_from, count, out->count_from);
    out->rank = (int)rank;
    out->count = (int)count;
    return 0;
}

void ck_nodes_apply(struct ck_config *cfg, const struct ck_nodes *n)
{
    cfg->ckpt.markers_optional = n->count > 1 && n->rank != 0;
}

void ck_nodes_log_start(const struct ck_nodes *n)
{
    if (!ck_nodes_is_multi(n))
        return;
    ck_info("nodes.start", "rank=%d count=%d rank_from=\"%s\" count_from=\"%s\": this node "
            "uploads its part of each step; a step enters the store's metadata.yaml once "
            "every node's part is there", n->rank, n->count, n->rank_from, n->count_from);
}
