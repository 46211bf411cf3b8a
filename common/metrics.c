#include "common/metrics.h"
#include "common/error.h"
#include "common/fsutil.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum kind { COUNTER, GAUGE };

struct def {
    const char *name; /* without the ckptd_ prefix */
    enum kind kind;
    const char *label; /* 'name="value"' or NULL */
    const char *help;
};

/* Rows sharing a name must be adjacent: HELP and TYPE are written once per name. */
static const struct def defs[CK_M__COUNT] = {
    [CK_M_CHECKPOINTS_REGISTERED] = {"checkpoints_registered_total", COUNTER, NULL,
                                     "Checkpoints registered in metadata.yaml."},
    [CK_M_CHECKPOINTS_UNREGISTERED] = {"checkpoints_unregistered_total", COUNTER, NULL,
                                       "Checkpoints removed from metadata.yaml."},
    [CK_M_CHECKPOINTS_DELETED] = {"checkpoints_deleted_total", COUNTER, NULL,
                                  "Checkpoints deleted locally by retention, their verified "
                                  "copies kept in every store."},
    [CK_M_BYTES_HASHED] = {"hashed_bytes_total", COUNTER, NULL,
                           "Bytes of checkpoint files hashed."},
    [CK_M_ARCHIVES_PACKED] = {"archives_packed_total", COUNTER, NULL,
                              "Deployment archives written."},
    [CK_M_VERIFICATIONS_PASSED] = {"verifications_total", COUNTER, "result=\"passed\"",
                                   "Verification runs on packed archives, by result."},
    [CK_M_VERIFICATIONS_FAILED] = {"verifications_total", COUNTER, "result=\"failed\"", NULL},
    [CK_M_UPLOADS_COMPLETED] = {"uploads_total", COUNTER, "result=\"completed\"",
                                "Object uploads to remote stores, by result."},
    [CK_M_UPLOADS_FAILED] = {"uploads_total", COUNTER, "result=\"failed\"", NULL},
    [CK_M_BYTES_UPLOADED] = {"uploaded_bytes_total", COUNTER, NULL,
                             "Bytes accepted by remote stores."},
    [CK_M_EVENTS_EMITTED] = {"events_total", COUNTER, NULL, "Events emitted to hooks."},
    [CK_M_WEBHOOK_DELIVERED] = {"webhook_deliveries_total", COUNTER, "result=\"delivered\"",
                                "Webhook delivery attempts, by result."},
    [CK_M_WEBHOOK_ATTEMPT_FAILED] = {"webhook_deliveries_total", COUNTER,
                                     "result=\"attempt_failed\"", NULL},
    [CK_M_WEBHOOK_GAVE_UP] = {"webhook_deliveries_total", COUNTER, "result=\"gave_up\"", NULL},
    [CK_M_EXEC_HOOKS_OK] = {"exec_hooks_total", COUNTER, "result=\"ok\"",
                            "Exec hook runs, by result."},
    [CK_M_EXEC_HOOKS_FAILED] = {"exec_hooks_total", COUNTER, "result=\"failed\"", NULL},
    [CK_M_EXEC_HOOKS_TIMED_OUT] = {"exec_hooks_total", COUNTER, "result=\"timeout\"", NULL},
    [CK_M_FAILURES_SCAN] = {"failures_total", COUNTER, "stage=\"scan\"",
                            "Failed operations, by stage."},
    [CK_M_FAILURES_HASH] = {"failures_total", COUNTER, "stage=\"hash\"", NULL},
    [CK_M_FAILURES_METADATA] = {"failures_total", COUNTER, "stage=\"metadata\"", NULL},
    [CK_M_FAILURES_PACK] = {"failures_total", COUNTER, "stage=\"pack\"", NULL},
    [CK_M_FAILURES_VERIFY] = {"failures_total", COUNTER, "stage=\"verify\"", NULL},
    [CK_M_FAILURES_UPLOAD] = {"failures_total", COUNTER, "stage=\"upload\"", NULL},
    [CK_M_FAILURES_HOOK] = {"failures_total", COUNTER, "stage=\"hook\"", NULL},
    [CK_M_NODES_STEPS_COMMITTED] = {"nodes_steps_committed_total", COUNTER, NULL,
                                    "Steps of a multi-node training this node committed in a "
                                    "store (created their commit record)."},
    [CK_M_UPLOAD_QUEUE_DEPTH] = {"upload_queue_depth", GAUGE, NULL,
                                 "Upload jobs waiting or running."},
    [CK_M_HOOK_OUTBOX_DEPTH] = {"hook_outbox_depth", GAUGE, NULL,
                                "Webhook deliveries waiting in the outbox."},
    [CK_M_WEBHOOKS_FAILING] = {"webhooks_failing", GAUGE, NULL,
                               "Webhook receivers marked failing after repeated errors."},
    [CK_M_CHECKPOINTS] = {"checkpoints", GAUGE, NULL, "Checkpoints listed in metadata.yaml."},
    [CK_M_NEWEST_CHECKPOINT_TIME] = {"newest_checkpoint_timestamp_seconds", GAUGE, NULL,
                                     "Unix time of the newest registered checkpoint."},
    [CK_M_DISK_FREE_BYTES] = {"disk_free_bytes", GAUGE, NULL,
                              "Bytes free on the training folder's filesystem, as retention "
                              "last saw it."},
    [CK_M_NODES_PARTS_MISSING] = {"nodes_parts_missing", GAUGE, NULL,
                                  "Other nodes' parts that this node's uncommitted steps wait "
                                  "for, summed over the stores, as the last round listed them."},
    [CK_M_NEWEST_REMOTE_CHECKPOINT_TIME] =
        {"newest_remote_checkpoint_timestamp_seconds", GAUGE, NULL,
         "Unix time of the newest checkpoint safely stored remotely (0: none yet)."},
    [CK_M_START_TIME] = {"start_time_seconds", GAUGE, NULL, "Unix time the agent started."},
    [CK_M_LAST_SUCCESS_TIME] = {"last_success_timestamp_seconds", GAUGE, NULL,
                                "Unix time of the last run or pass that ended without a failure "
                                "(0: none yet)."},
};

static _Atomic int64_t values[CK_M__COUNT];

/* Upload latency buckets (seconds): from a small file on a LAN to a large
 * checkpoint over a slow link. */
static const double bounds[] = {0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600};
#define NBOUNDS (sizeof bounds / sizeof bounds[0])
_Static_assert(NBOUNDS + 1 == CK_METRICS_NBUCKETS, "CK_METRICS_NBUCKETS is the bucket count");

struct histogram {
    const char *name;
    const char *help;
    uint64_t buckets[NBOUNDS + 1]; /* not cumulative; the last is +Inf */
    uint64_t count;
    double sum;
};

static struct histogram hists[CK_H__COUNT] = {
    [CK_H_UPLOAD_SECONDS] =
        {"upload_duration_seconds", "Time to upload one object to a remote store.", {0}, 0, 0},
};
static pthread_mutex_t hist_lock = PTHREAD_MUTEX_INITIALIZER;

static int64_t now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

__attribute__((constructor)) static void set_start_time(void)
{
    atomic_store(&values[CK_M_START_TIME], now_seconds());
}

static bool valid(enum ck_metric m)
{
    return (unsigned)m < CK_M__COUNT;
}

void ck_metrics_add(enum ck_metric m, uint64_t n)
{
    if (valid(m))
        atomic_fetch_add(&values[m], (int64_t)n);
}

void ck_metrics_set(enum ck_metric m, int64_t v)
{
    if (valid(m))
        atomic_store(&values[m], v);
}

void ck_metrics_set_max(enum ck_metric m, int64_t v)
{
    if (!valid(m))
        return;
    int64_t cur = atomic_load(&values[m]);
    while (v > cur && !atomic_compare_exchange_weak(&values[m], &cur, v))
        ;
}

int64_t ck_metrics_get(enum ck_metric m)
{
    return valid(m) ? atomic_load(&values[m]) : 0;
}

void ck_metrics_observe(enum ck_histogram h, double seconds)
{
    if ((unsigned)h >= CK_H__COUNT || !isfinite(seconds) || seconds < 0)
        return;
    size_t i = 0;
    while (i < NBOUNDS && seconds > bounds[i])
        i++;
    pthread_mutex_lock(&hist_lock);
    hists[h].buckets[i]++;
    hists[h].count++;
    hists[h].sum += seconds;
    pthread_mutex_unlock(&hist_lock);
}

uint64_t ck_metrics_count(enum ck_histogram h)
{
    if ((unsigned)h >= CK_H__COUNT)
        return 0;
    pthread_mutex_lock(&hist_lock);
    uint64_t n = hists[h].count;
    pthread_mutex_unlock(&hist_lock);
    return n;
}

void ck_metrics_reset(void)
{
    for (size_t i = 0; i < CK_M__COUNT; i++)
        atomic_store(&values[i], 0);
    atomic_store(&values[CK_M_START_TIME], now_seconds());
    pthread_mutex_lock(&hist_lock);
    for (size_t h = 0; h < CK_H__COUNT; h++) {
        memset(hists[h].buckets, 0, sizeof hists[h].buckets);
        hists[h].count = 0;
        hists[h].sum = 0;
    }
    pthread_mutex_unlock(&hist_lock);
}

void ck_metrics_mark(struct ck_metrics_mark *mark)
{
    for (size_t i = 0; i < CK_M__COUNT; i++)
        mark->values[i] = atomic_load(&values[i]);
    pthread_mutex_lock(&hist_lock);
    for (size_t h = 0; h < CK_H__COUNT; h++) {
        memcpy(mark->buckets[h], hists[h].buckets, sizeof mark->buckets[h]);
        mark->sum[h] = hists[h].sum;
    }
    pthread_mutex_unlock(&hist_lock);
}

/* One line per change: "c M DELTA", "g M VALUE", "h H BUCKET DELTA",
 * "s H SUM-DELTA" (M and H the enum values; the two processes are the same
 * binary, so they agree on them). */
int ck_metrics_changes(struct ck_metrics_mark *mark, struct ck_buf *out)
{
    struct ck_metrics_mark now;
    int err = 0;
    ck_metrics_mark(&now);
    for (size_t i = 0; i < CK_M__COUNT && err == 0; i++) {
        if (now.values[i] == mark->values[i])
            continue;
        if (defs[i].kind == COUNTER)
            err = ck_buf_printf(out, "c %zu %" PRId64 "\n", i, now.values[i] - mark->values[i]);
        else
            err = ck_buf_printf(out, "g %zu %" PRId64 "\n", i, now.values[i]);
    }
    for (size_t h = 0; h < CK_H__COUNT && err == 0; h++) {
        for (size_t b = 0; b < CK_METRICS_NBUCKETS && err == 0; b++)
            if (now.buckets[h][b] != mark->buckets[h][b])
                err = ck_buf_printf(out, "h %zu %zu %" PRIu64 "\n", h, b,
                                    now.buckets[h][b] - mark->buckets[h][b]);
        if (err == 0 && now.sum[h] != mark->sum[h])
            err = ck_buf_printf(out, "s %zu %.17g\n", h, now.sum[h] - mark->sum[h]);
    }
    if (err < 0)
        return err;
    *mark = now;
    return 0;
}

int ck_metrics_apply(const char *text, size_t len)
{
    char line[128];
    size_t pos = 0;
    while (pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t n = (nl ? (size_t)(nl - text) : len) - pos;
        if (n >= sizeof line)
            return ck_error(CK_EFORMAT, "metrics from a helper: a line of %zu bytes", n);
        memcpy(line, text + pos, n);
        line[n] = '\0';
        pos += n + 1;
        char kind;
        unsigned long idx, bucket;
        long long v;
        unsigned long long u;
        double d;
        int used = 0;
        if (sscanf(line, "%c %lu %lld%n", &kind, &idx, &v, &used) == 3 && used == (int)n &&
            (kind == 'c' || kind == 'g') && idx < CK_M__COUNT && idx != CK_M_START_TIME) {
            if (kind == 'c')
                atomic_fetch_add(&values[idx], (int64_t)v);
            else
                atomic_store(&values[idx], (int64_t)v);
        } else if (sscanf(line, "h %lu %lu %llu%n", &idx, &bucket, &u, &used) == 3 &&
                   used == (int)n && idx < CK_H__COUNT && bucket < CK_METRICS_NBUCKETS) {
            pthread_mutex_lock(&hist_lock);
            hists[idx].buckets[bucket] += u;
            hists[idx].count += u;
            pthread_mutex_unlock(&hist_lock);
        } else if (sscanf(line, "s %lu %lg%n", &idx, &d, &used) == 2 && used == (int)n &&
                   idx < CK_H__COUNT && isfinite(d)) {
            pthread_mutex_lock(&hist_lock);
            hists[idx].sum += d;
            pthread_mutex_unlock(&hist_lock);
        } else {
            return ck_error(CK_EFORMAT, "metrics from a helper: cannot read '%s'", line);
        }
    }
    return 0;
}

/* Appends to out; after the first failure (the buffer's maximum) every call
 * is a no-op and *err keeps that failure. */
static void put(struct ck_buf *out, int *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void put(struct ck_buf *out, int *err, const char *fmt, ...)
{
    va_list ap;
    if (*err < 0)
        return;
    va_start(ap, fmt);
    *err = ck_buf_vprintf(out, fmt, ap);
    va_end(ap);
}

static void header(struct ck_buf *out, int *err, const char *name, const char *type,
                   const char *help)
{
    put(out, err, "# HELP ckptd_%s %s\n# TYPE ckptd_%s %s\n", name, help, name, type);
}

static void render_histogram(struct ck_buf *out, int *err, const struct histogram *h)
{
    header(out, err, h->name, "histogram", h->help);
    uint64_t cum = 0;
    for (size_t i = 0; i <= NBOUNDS; i++) {
        cum += h->buckets[i];
        if (i < NBOUNDS)
            put(out, err, "ckptd_%s_bucket{le=\"%g\"} %llu\n", h->name, bounds[i],
                (unsigned long long)cum);
        else
            put(out, err, "ckptd_%s_bucket{le=\"+Inf\"} %llu\n", h->name, (unsigned long long)cum);
    }
    put(out, err, "ckptd_%s_sum %.6f\nckptd_%s_count %llu\n", h->name, h->sum, h->name,
        (unsigned long long)h->count);
}

/* live: the exposition is read when it is rendered (/metrics), so an age
 * computed now is true when scraped; a textfile is read for minutes after it
 * was written, so it carries only the timestamps (the textfile convention:
 * the age is time() - ckptd_newest_remote_checkpoint_timestamp_seconds in
 * PromQL). */
static int render(struct ck_buf *out, bool live)
{
    int err = 0;
    for (size_t i = 0; i < CK_M__COUNT; i++) {
        const struct def *d = &defs[i];
        if (i == 0 || strcmp(defs[i - 1].name, d->name) != 0)
            header(out, &err, d->name, d->kind == COUNTER ? "counter" : "gauge", d->help);
        int64_t v = atomic_load(&values[i]);
        if (d->label)
            put(out, &err, "ckptd_%s{%s} %lld\n", d->name, d->label, (long long)v);
        else
            put(out, &err, "ckptd_%s %lld\n", d->name, (long long)v);
    }
    /* The age is what an alert wants ("nothing safe remotely for 2 h"); it is
     * computed now so that it grows between events. -1 until something landed. */
    int64_t remote = atomic_load(&values[CK_M_NEWEST_REMOTE_CHECKPOINT_TIME]);
    if (live) {
        header(out, &err, "newest_remote_checkpoint_age_seconds", "gauge",
               "Seconds since the newest checkpoint safely stored remotely was written (-1: none).");
        put(out, &err, "ckptd_newest_remote_checkpoint_age_seconds %lld\n",
            remote > 0 ? (long long)(now_seconds() - remote) : -1LL);
    }
    /* the usual join target for "which version runs where" */
    header(out, &err, "build_info", "gauge", "The ckptd version running, as a label; always 1.");
    put(out, &err, "ckptd_build_info{version=\"%s\"} 1\n", CKPTD_VERSION);
    pthread_mutex_lock(&hist_lock);
    for (size_t h = 0; h < CK_H__COUNT; h++)
        render_histogram(out, &err, &hists[h]);
    pthread_mutex_unlock(&hist_lock);
    if (err < 0)
        return ck_error(CK_ENOMEM, "the metrics exposition does not fit its buffer");
    return 0;
}

int ck_metrics_render(struct ck_buf *out)
{
    return render(out, true);
}

/* Gauges that are carried with the totals: the times an alert compares with now. */
static bool carried(size_t i)
{
    return defs[i].kind == COUNTER || i == CK_M_NEWEST_REMOTE_CHECKPOINT_TIME ||
           i == CK_M_LAST_SUCCESS_TIME;
}

static void metric_key(size_t i, char *out, size_t outsz)
{
    if (defs[i].label)
        snprintf(out, outsz, "ckptd_%s{%s}", defs[i].name, defs[i].label);
    else
        snprintf(out, outsz, "ckptd_%s", defs[i].name);
}

int ck_metrics_save_totals(struct ck_buf *out)
{
    char key[160];
    int err = 0;
    for (size_t i = 0; i < CK_M__COUNT; i++) {
        if (!carried(i))
            continue;
        metric_key(i, key, sizeof key);
        put(out, &err, "%s %lld\n", key, (long long)atomic_load(&values[i]));
    }
    pthread_mutex_lock(&hist_lock);
    for (size_t h = 0; h < CK_H__COUNT; h++) {
        for (size_t b = 0; b <= NBOUNDS; b++) {
            if (b < NBOUNDS)
                put(out, &err, "ckptd_%s_bucket{le=\"%g\"} %llu\n", hists[h].name, bounds[b],
                    (unsigned long long)hists[h].buckets[b]);
            else
                put(out, &err, "ckptd_%s_bucket{le=\"+Inf\"} %llu\n", hists[h].name,
                    (unsigned long long)hists[h].buckets[b]);
        }
        put(out, &err, "ckptd_%s_sum %.17g\n", hists[h].name, hists[h].sum);
    }
    pthread_mutex_unlock(&hist_lock);
    return err < 0 ? ck_error(CK_ENOMEM, "the metrics totals do not fit their buffer") : 0;
}

/* Applies one "key value" line; false when the key is not known. */
static bool load_line(const char *key, const char *val)
{
    char k[160], *end;
    for (size_t i = 0; i < CK_M__COUNT; i++) {
        if (!carried(i))
            continue;
        metric_key(i, k, sizeof k);
        if (strcmp(k, key) != 0)
            continue;
        long long v = strtoll(val, &end, 10);
        if (*end || v < 0)
            return false;
        if (defs[i].kind == COUNTER)
            atomic_fetch_add(&values[i], (int64_t)v);
        else
            ck_metrics_set_max((enum ck_metric)i, (int64_t)v);
        return true;
    }
    for (size_t h = 0; h < CK_H__COUNT; h++) {
        snprintf(k, sizeof k, "ckptd_%s_sum", hists[h].name);
        if (strcmp(k, key) == 0) {
            double d = strtod(val, &end);
            if (*end || !isfinite(d) || d < 0)
                return false;
            hists[h].sum += d;
            return true;
        }
        for (size_t b = 0; b <= NBOUNDS; b++) {
            if (b < NBOUNDS)
                snprintf(k, sizeof k, "ckptd_%s_bucket{le=\"%g\"}", hists[h].name, bounds[b]);
            else
                snprintf(k, sizeof k, "ckptd_%s_bucket{le=\"+Inf\"}", hists[h].name);
            if (strcmp(k, key) != 0)
                continue;
            unsigned long long u = strtoull(val, &end, 10);
            if (*end || val[0] == '-')
                return false;
            hists[h].buckets[b] += u;
            hists[h].count += u;
            return true;
        }
    }
    return false;
}

int ck_metrics_load_totals(const char *text, size_t len)
{
    char line[256];
    size_t pos = 0;
    pthread_mutex_lock(&hist_lock);
    while (pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t n = (nl ? (size_t)(nl - text) : len) - pos;
        if (n < sizeof line) {
            memcpy(line, text + pos, n);
            line[n] = '\0';
            char *sp = strrchr(line, ' ');
            if (sp) {
                *sp = '\0';
                load_line(line, sp + 1); /* unknown: a metric this binary does not have */
            }
        }
        pos += n + 1;
    }
    pthread_mutex_unlock(&hist_lock);
    return 0;
}

int ck_metrics_write_file(const char *path)
{
    struct ck_buf b = CK_BUF_INIT;
    int err = render(&b, false);
    if (err == 0)
        err = ck_write_file_atomic(path, b.data, b.len, 0644);
    ck_buf_release(&b);
    return err;
}
