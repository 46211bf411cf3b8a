/* The upload stage of a node of several (nodes.count > 1), for `ckptd scan`
 * (docs/multinode.md, "What is built today"). In place of the single
 * node's tree upload:
 *
 *   1. the node's part of each step it registered (its files, under their
 *      final keys data/checkpoints/...; rank 0 also the tree around them:
 *      the configuration, data/initialisation/, data/build_parameters.yaml
 *      without ckptd's per-checkpoint section, and its metadata.yaml as the
 *      model record .ckptd/model.yaml) goes through the durable queue;
 *   2. once each of a step's files is stored and checked, its part manifest
 *      .ckptd/parts/STEP/node-R-of-N.yaml is written if absent (never
 *      replaced: another part for the same step is a conflict);
 *   3. one listing of the step's parts; when all N are there and no commit
 *      record exists, the node commits: every manifest read, no path listed
 *      twice with other content, every object stored with its size (one
 *      listing), then .ckptd/commits/STEP.yaml if absent, STEP.md5sums, and
 *      metadata.yaml derived from every commit record and the model record.
 *
 * A node never uploads its own metadata.yaml as the store's. */
#ifndef CK_NODECOMMIT_H
#define CK_NODECOMMIT_H

#include "agent/config.h"
#include "agent/nodes.h"
#include "agent/state.h"
#include "stores/uploader.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A step this run committed: it created the commit record (or, on a store
 * that ignores conditional writes, wrote it; docs/multinode.md). */
struct ck_node_commit {
    const char *store_url; /* redacted */
    const char *checkpoint;
    const char *record_key; /* .ckptd/commits/STEP.yaml */
    int64_t epoch;          /* rank 0's part's, -1 when none */
    int nodes;
    size_t files;
    uint64_t bytes; /* every node's shards */
};
typedef void (*ck_node_commit_fn)(void *arg, const struct ck_node_commit *c);

struct ck_noderound {
    const struct ck_config *cfg; /* borrowed */
    const char *dir;             /* the model root (this node's folder) */
    struct ck_state *st;         /* open, DIR's lock held */
    const struct ck_nodes *nodes;
    struct ck_uploader_run_opts run; /* the queue run's callbacks (upload events) */
    /* NULL: the queue runs in the foreground of a command (SIGTERM stops it,
     * ck_upload_round_foreground); else the watcher's helper's stop switch */
    struct ck_upload_ctl *ctl;
    /* each step this run committed, after the store's metadata.yaml was written */
    ck_node_commit_fn on_commit;
    void *on_commit_arg;
    /* out */
    int upload_err;                  /* the queue run itself */
    struct ck_upload_report upload;  /* what the queue run did */
    size_t parts_written;  /* manifests this run wrote */
    size_t committed;      /* records this run created (or found already written with its bytes) */
    size_t waiting;        /* steps of this node waiting for its own uploads or other nodes' parts */
    size_t refused;        /* steps not committed for a conflict or a missing object (logged) */
    size_t failed;         /* store operations that failed (logged): run again */
    /* parts of other nodes the waiting steps lack, summed over the stores
     * (the ckptd_nodes_parts_missing gauge) */
    size_t parts_missing;
    /* when to look for them again (the watcher): seconds, or -1 when no step
     * waits for another node. The wait grows with the time the step has
     * waited since this node settled its part, from 1 s to
     * CK_NODES_LOOK_MAX_S: a backoff that needs no memory across the
     * helper's rounds. */
    double next_look;
};

/* The longest wait between two looks for another node's part. */
#define CK_NODES_LOOK_MAX_S 60.0

/* The state key where a round leaves the steps waiting for other nodes'
 * parts, for `ckptd status`: a line per step and store,
 * "CHECKPOINT<TAB>MISSING_RANKS<TAB>STORE_URL" (ranks comma-separated). */
#define CK_NODES_WAITING_KEY "nodes_waiting"

/* What a node of several needs of the config, checked at the start of a
 * scan (and by scan -n): upload.stores, each able to list and to write only
 * if a name is free (s3, file), none compressed or bundled; no pack formats
 * and no retention (not built for several nodes). CK_ECONFIG naming the key. */
int ck_noderound_check(const struct ck_config *cfg, const struct ck_nodes *nodes);

/* Runs the stage for every store. 0 when it ran (the counters say what
 * happened, each problem logged); an error when it could not start (the
 * local metadata.yaml, the queue). */
int ck_noderound_run(struct ck_noderound *r);

#endif
