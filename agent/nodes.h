/* Which node of a multi-node training this sidecar is (docs/multinode.md):
 * nodes.rank and nodes.count from the config, else from the
 * variables the usual launchers set (SLURM, torchrun/elastic and Kubeflow's
 * PyTorchJob, Kubernetes Indexed Jobs and JobSet, Open MPI and PMI), else a
 * single node (count 1: today's behaviour). Each value says where it came
 * from, for `ckptd config` and the start's log line. */
#ifndef CK_NODES_H
#define CK_NODES_H

#include "agent/config.h"

#include <stdbool.h>

/* The largest node count accepted (a rank is below the count). */
#define CK_NODES_MAX 65536

struct ck_nodes {
    int rank;              /* 0-based, below count */
    int count;             /* 1 or more; 1: a single node */
    char rank_from[256];   /* "default", "'ckptd.yaml' line 3", "--rank", "SLURM_NODEID=2" */
    char count_from[256];
    /* launcher variables seen but not used (a config value overrides them,
     * or a rank with no node count anywhere), "" when none: for `ckptd config` */
    char unused[512];
};

/* The environment, as getenv reads it (tests pass their own). */
typedef const char *(*ck_nodes_getenv_fn)(const char *name);

/* Resolves the node identity of cfg (nodes.rank, nodes.count, each -1 when
 * not set) and env (NULL: getenv). CK_ECONFIG naming the key and the
 * variable for a value that is not a node number, launchers that disagree,
 * a rank not below the count, a count above 1 with no rank, an elastic
 * range of nodes, or MPI ranks that count processes rather than nodes. */
int ck_nodes_resolve(struct ck_nodes *out, const struct ck_config *cfg, ck_nodes_getenv_fn env);

/* Logs the identity of a node of several at a start of `ckptd scan` or
 * `ckptd watch` (nodes.start; nothing for a single node: its log is as
 * before). */
void ck_nodes_log_start(const struct ck_nodes *n);

/* What being node n changes in cfg: a node of several other than rank 0
 * takes a folder checkpoint without its marker (ckpt.markers_optional). */
void ck_nodes_apply(struct ck_config *cfg, const struct ck_nodes *n);

/* Whether this sidecar is one of several nodes (NULL: a single node). */
static inline bool ck_nodes_is_multi(const struct ck_nodes *n)
{
    return n && n->count > 1;
}

#endif
