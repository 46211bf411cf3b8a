/* Process-wide metrics: counters, gauges and one histogram family, with the
 * Prometheus text exposition (served on /metrics, or written to a file for
 * node_exporter's textfile collector with --metrics-file).
 *
 * Every metric is a constant here, so a caller only does
 *
 *   ck_metrics_add(CK_M_CHECKPOINTS_REGISTERED, 1);
 *   ck_metrics_add(CK_M_BYTES_HASHED, st.st_size);
 *   ck_metrics_set(CK_M_UPLOAD_QUEUE_DEPTH, depth);
 *   ck_metrics_observe(CK_H_UPLOAD_SECONDS, elapsed);
 *   ck_metrics_set(CK_M_NEWEST_REMOTE_CHECKPOINT_TIME, mtime_of_what_landed);
 *
 * Thread-safe: counters and gauges are atomics, the histogram takes a mutex.
 * Names carry the ckptd_ prefix; a row may carry one fixed label (failures
 * by stage). Adding a metric: a constant below and a row in metrics.c. */
#ifndef CK_METRICS_H
#define CK_METRICS_H

#include "common/buf.h"

#include <stdint.h>

enum ck_metric {
    /* counters (only grow) */
    CK_M_CHECKPOINTS_REGISTERED,   /* ckptd_checkpoints_registered_total */
    CK_M_CHECKPOINTS_UNREGISTERED, /* ckptd_checkpoints_unregistered_total */
    CK_M_CHECKPOINTS_DELETED,      /* ckptd_checkpoints_deleted_total: by retention */
    CK_M_BYTES_HASHED,             /* ckptd_hashed_bytes_total */
    CK_M_ARCHIVES_PACKED,          /* ckptd_archives_packed_total */
    CK_M_VERIFICATIONS_PASSED,     /* ckptd_verifications_total{result="passed"} */
    CK_M_VERIFICATIONS_FAILED,     /* ckptd_verifications_total{result="failed"} */
    CK_M_UPLOADS_COMPLETED,        /* ckptd_uploads_total{result="completed"} */
    CK_M_UPLOADS_FAILED,           /* ckptd_uploads_total{result="failed"} */
    CK_M_BYTES_UPLOADED,           /* ckptd_uploaded_bytes_total */
    CK_M_EVENTS_EMITTED,           /* ckptd_events_total */
    CK_M_WEBHOOK_DELIVERED,        /* ckptd_webhook_deliveries_total{result="delivered"} */
    CK_M_WEBHOOK_ATTEMPT_FAILED,   /* ckptd_webhook_deliveries_total{result="attempt_failed"} */
    CK_M_WEBHOOK_GAVE_UP,          /* ckptd_webhook_deliveries_total{result="gave_up"} */
    CK_M_EXEC_HOOKS_OK,            /* ckptd_exec_hooks_total{result="ok"} */
    CK_M_EXEC_HOOKS_FAILED,        /* ckptd_exec_hooks_total{result="failed"} (exit != 0) */
    CK_M_EXEC_HOOKS_TIMED_OUT,     /* ckptd_exec_hooks_total{result="timeout"} */
    CK_M_FAILURES_SCAN,            /* ckptd_failures_total{stage="scan"} */
    CK_M_FAILURES_HASH,            /* ckptd_failures_total{stage="hash"} */
    CK_M_FAILURES_METADATA,        /* ckptd_failures_total{stage="metadata"} */
    CK_M_FAILURES_PACK,            /* ckptd_failures_total{stage="pack"} */
    CK_M_FAILURES_VERIFY,          /* ckptd_failures_total{stage="verify"} */
    CK_M_FAILURES_UPLOAD,          /* ckptd_failures_total{stage="upload"} */
    CK_M_FAILURES_HOOK,            /* ckptd_failures_total{stage="hook"} */
    CK_M_NODES_STEPS_COMMITTED,    /* ckptd_nodes_steps_committed_total: records this node created */
    /* gauges (set to a value) */
    CK_M_UPLOAD_QUEUE_DEPTH,     /* ckptd_upload_queue_depth: jobs waiting or running */
    CK_M_HOOK_OUTBOX_DEPTH,      /* ckptd_hook_outbox_depth: webhook deliveries pending */
    CK_M_WEBHOOKS_FAILING,       /* ckptd_webhooks_failing: receivers marked failing */
    CK_M_CHECKPOINTS,            /* ckptd_checkpoints: registered in metadata.yaml now */
    CK_M_NEWEST_CHECKPOINT_TIME, /* ckptd_newest_checkpoint_timestamp_seconds (unix) */
    CK_M_DISK_FREE_BYTES,        /* ckptd_disk_free_bytes: free on DIR's filesystem (retention) */
    CK_M_NODES_PARTS_MISSING,    /* ckptd_nodes_parts_missing: other nodes' parts the waiting steps lack */
    /* unix time of the newest checkpoint whose upload (metadata included)
     * completed; /metrics also shows its age in
     * ckptd_newest_remote_checkpoint_age_seconds, computed when scraped (a
     * textfile has the timestamp only: an age written there would freeze) */
    CK_M_NEWEST_REMOTE_CHECKPOINT_TIME,
    CK_M_START_TIME, /* ckptd_start_time_seconds (unix), set by ck_metrics_reset */
    /* unix time a run (scan) or the watcher's last pass ended without a failure;
     * carried across one-shot runs with the totals below */
    CK_M_LAST_SUCCESS_TIME,
    CK_M__COUNT
};

enum ck_histogram {
    CK_H_UPLOAD_SECONDS, /* ckptd_upload_duration_seconds: one whole object upload */
    CK_H__COUNT
};

/* Adds n to a counter or gauge. */
void ck_metrics_add(enum ck_metric m, uint64_t n);
/* Sets a gauge (also accepted on a counter, for restoring state at start). */
void ck_metrics_set(enum ck_metric m, int64_t v);
/* Sets a gauge to v only if v is larger (newest-timestamp gauges). */
void ck_metrics_set_max(enum ck_metric m, int64_t v);
int64_t ck_metrics_get(enum ck_metric m);
/* Records one observation (seconds) in a histogram. */
void ck_metrics_observe(enum ck_histogram h, double seconds);
/* Observation count of a histogram (tests, /status). */
uint64_t ck_metrics_count(enum ck_histogram h);

/* Zeroes everything and sets ckptd_start_time_seconds to now. */
void ck_metrics_reset(void);

/* Forwarding what a helper process counted (agent/sender.c runs uploads and
 * webhook deliveries in children forked from the watcher). The child takes a
 * mark right after the fork; ck_metrics_changes appends what changed since
 * the mark as text and moves the mark; the parent passes that text to
 * ck_metrics_apply. Counters and histogram observations are added, a gauge
 * the child changed is set to the child's value. */
#define CK_METRICS_NBUCKETS 14 /* histogram buckets, +Inf included */
struct ck_metrics_mark {
    int64_t values[CK_M__COUNT];
    uint64_t buckets[CK_H__COUNT][CK_METRICS_NBUCKETS];
    double sum[CK_H__COUNT];
};
void ck_metrics_mark(struct ck_metrics_mark *mark);
int ck_metrics_changes(struct ck_metrics_mark *mark, struct ck_buf *out);
/* CK_EFORMAT for a line it does not understand; lines before it are applied. */
int ck_metrics_apply(const char *text, size_t len);

/* One-shot runs (cron) write a textfile whose counters must keep growing
 * across runs, as Prometheus expects of a counter. The cumulative part of the
 * metrics (counters, histograms, the newest-remote and last-success times) as
 * text keyed by metric name, so a binary with more or fewer metrics reads it:
 * "<name>[{label}] <value>" per line. load adds what it reads to the current
 * values (gauges: sets them) and skips names it does not know. */
int ck_metrics_save_totals(struct ck_buf *out);
int ck_metrics_load_totals(const char *text, size_t len);

/* The Prometheus text exposition format (version 0.0.4) of every metric,
 * appended to out. The content type to serve it with: */
#define CK_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
int ck_metrics_render(struct ck_buf *out);
/* Writes the exposition to path atomically (temporary name, fsync, rename),
 * mode 0644: node_exporter's textfile collector never reads a torn file.
 * Without ckptd_newest_remote_checkpoint_age_seconds: the file is read long
 * after it is written, so it has the timestamp the age is computed from.
 * The name should end in .prom; the temporary is a dot file that it skips. */
int ck_metrics_write_file(const char *path);

#endif
