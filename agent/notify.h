/* The agent's side of notifications: turns what a scan pass did into events
 * (checkpoint.registered per new checkpoint, training.* on a status change),
 * keeps the metrics that describe the tree, and finishes a one-shot run
 * (exec hooks to their end, due webhooks delivered within a budget). The
 * watcher calls ck_notify_scan after each pass and drives the hooks from its
 * loop instead of ck_notify_finish. */
#ifndef CK_NOTIFY_H
#define CK_NOTIFY_H

#include "agent/nodecommit.h"
#include "agent/scan.h"
#include "agent/state.h"
#include "hooks/hooks.h"
#include "stores/uploader.h"

/* How long a one-shot command spends delivering webhooks before it exits;
 * what is left stays in the outbox for the next run. */
#define CK_NOTIFY_FINISH_BUDGET_S 60

/* Emits the events of res (h may be NULL: metrics only). dir is the model
 * root; metadata.yaml there supplies epochs and md5s. Failures are logged
 * and returned; the caller's error message is kept. */
int ck_notify_scan(struct ck_hooks *h, struct ck_state *st, const char *dir,
                   const struct ck_scan_result *res);
/* Emits agent.started or agent.stopping (type) for the agent working on dir,
 * with the model's name and id as the state knows them. Logged, not returned. */
void ck_notify_agent(struct ck_hooks *h, struct ck_state *st, const char *dir,
                     enum ck_event_type type);
/* Emits upload.completed or upload.failed for one job of the upload queue. */
void ck_notify_upload(struct ck_hooks *h, struct ck_state *st, const char *dir,
                      const struct ck_upload_outcome *o);
/* Emits checkpoint.committed for a step of several nodes that this node
 * committed in a store (agent/nodecommit.h). */
void ck_notify_committed(struct ck_hooks *h, struct ck_state *st, const char *dir,
                         const struct ck_node_commit *c);
/* Waits for the exec hooks, then delivers due webhooks for at most
 * budget_s seconds; logs (does not return) delivery problems. */
void ck_notify_finish(struct ck_hooks *h, struct ck_state *st, double budget_s);
/* Writes the metrics to path (NULL: nothing) for node_exporter's textfile
 * collector; a failure is logged. Both keep the caller's error message. */
void ck_notify_write_metrics(const char *path);
/* A one-shot run (cron) writes a textfile whose counters must keep growing
 * across runs: the totals live in the state database between runs. Load
 * before the pass; save after it, with this run's time as the last success
 * when it succeeded. A failure costs only the carried numbers (logged). */
void ck_notify_load_totals(struct ck_state *st);
void ck_notify_save_totals(struct ck_state *st, bool succeeded);

#endif
