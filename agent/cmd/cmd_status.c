/* ckptd status DIR [--finished|--failed] [--json]: the training's status, and
 * ending it (through the running watcher, or under the lock). */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/config.h"
#include "agent/control.h"
#include "agent/lock.h"
#include "agent/nodecommit.h"
#include "agent/pipeline.h"
#include "agent/scan.h"
#include "agent/state.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "writers/pmf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#define METADATA_MAX (256u << 20)

static const char head[] =
    "usage: ckptd status [options] DIR\n"
    "\n"
    "Shows the training status of DIR's PMF tree (metadata.yaml): status, number of\n"
    "checkpoints, the latest, and whether a watcher runs on DIR.\n"
    "\n";
static const char tail[] =
    "\n"
    "exit: 0 done, 1 the status could not be read or changed, or (--finished/--failed\n"
    "with no watcher) the final pass could not pack, verify or upload everything or a\n"
    "hook's delivery was given up, 2 usage or config error, 3 DIR's lock is held by a\n"
    "process that did not answer\n";

struct status_flags {
    int to; /* -1, CK_PMF_FINISHED or CK_PMF_FAILED */
    bool json, wait;
    double timeout;
};

#define O(f) offsetof(struct status_flags, f)
static const struct ck_opt options[] = {
    {"finished", 0, CK_OPT_VALUE, NULL, NULL, O(to), CK_PMF_FINISHED, NULL,
     "end the training as finished"},
    {"failed", 0, CK_OPT_VALUE, NULL, NULL, O(to), CK_PMF_FAILED, NULL,
     "end the training as failed\n"
     "(through the running 'ckptd watch', which registers\n"
     "what is complete first and then exits; with no watcher,\n"
     "directly under DIR's lock: the final pass, its events\n"
     "and its uploads, as the watcher would have done)"},
    {"wait", 0, CK_OPT_SET, NULL, NULL, O(wait), 0, NULL,
     "then wait until the watcher has let go of DIR (its uploads\n"
     "drained, or left queued after its grace period); alone,\n"
     "waits for a watcher that is ending for another reason"},
    {"timeout", 0, CK_OPT_DURATION, NULL, NULL, O(timeout), 0, "DURATION",
     "how long to wait for the watcher's answer, and with\n"
     "--wait for its exit (default 60s each)"},
    {"json", 0, CK_OPT_SET, NULL, NULL, O(json), 0, NULL, "one JSON object on stdout"},
    {NULL, 0, 0, NULL, NULL, 0, 0, NULL, NULL},
};

/* No watcher: the final pass here, and everything it hands on (events,
 * uploads: agent/pipeline.h), as a watcher would have done. *upload_rc gets
 * the uploads' exit code. */
static int end_under_lock(const char *dir, struct ck_config *cfg, int to, int *upload_rc)
{
    struct ck_lock lock;
    struct ck_state st = {0};
    struct ck_scan_result res = {0};
    struct ck_hooks *hooks = NULL;
    /* Ending the training means the writer is done: take whatever is complete. */
    struct ck_scan_opts so = {.dir = dir, .cfg = cfg, .end_status = to, .min_age = 0};
    int err = ck_lock_acquire(&lock, dir);
    if (err < 0)
        return err;
    /* built before the pass, so that a bad secret stops it early (as scan) */
    if ((err = ck_hooks_new(&cfg->hooks, cfg->source ? cfg->source : "(defaults)", &hooks)) == 0 &&
        (err = ck_state_open(&st, dir)) == 0) {
        struct ck_pipeline pl = {.cfg = cfg, .dir = dir, .st = &st, .hooks = hooks};
        err = ck_pipeline_pass(&pl, &so, &res);
        if (pl.uploaded)
            *upload_rc = ck_upload_report_exit("status", pl.upload_err, &pl.upload);
        ck_pipeline_finish(&pl);
        int failed = ck_pipeline_failed(&pl); /* a stage or a hook: the status is set */
        if (err == 0 && failed < 0)
            *upload_rc = ck_cli_fail("status", failed);
    }
    ck_scan_result_release(&res);
    ck_hooks_free(hooks);
    ck_state_close(&st);
    ck_lock_release(&lock);
    return err;
}

static int end_training(const char *dir, struct ck_config *cfg, int to, double timeout,
                        int *upload_rc)
{
    char answer[2048];
    for (int attempt = 0; attempt < 3; attempt++) {
        int err = end_under_lock(dir, cfg, to, upload_rc);
        if (err != CK_ELOCKED)
            return err;
        err = ck_control_request(dir, to, timeout, answer, sizeof answer);
        if (err != CK_ENOENT)
            return err;
        if (ck_lock_holder(dir) != 0)
            return ck_error(CK_ELOCKED, "the process holding the lock on '%s' did not answer "
                                        "within %.3gs", dir, timeout);
    }
    return ck_error(CK_ELOCKED, "the lock on '%s' keeps changing hands", dir);
}

/* --wait: until no process holds DIR's lock. A watcher releases it last, after
 * its final pass and its uploads, so a job's epilogue or a preStop hook can
 * know that everything was handed over. */
static int wait_for_watcher(const char *dir, double timeout)
{
    double end = ck_mono_s() + timeout;
    long holder;
    while ((holder = ck_lock_holder(dir)) != 0) {
        if (ck_mono_s() >= end)
            return ck_error(CK_ERR, "the watcher on '%s' (pid %ld) is still running after %.3gs",
                            dir, holder, timeout);
        usleep(20000);
    }
    return 0;
}

static void print_ref(FILE *out, const struct ck_pmf_ref *r)
{
    if (r->is_int)
        fprintf(out, "%lld", (long long)r->i);
    else
        fprintf(out, "%s", r->s);
}

/* What the state records, read without the lock (the state database is in
 * WAL mode; none when there is no state yet): what retention did
 * (agent/retention.h), and for a node of several the steps its last round
 * left waiting for other nodes' parts (agent/nodecommit.h,
 * CK_NODES_WAITING_KEY; NULL when none). The waiting steps are not worth
 * failing the status for: a failure to read them is logged. */
static int load_state(const char *dir, struct ck_retained **rows, size_t *n, char **waiting)
{
    char path[PATH_MAX];
    struct ck_state s = {0};
    *rows = NULL;
    *n = 0;
    *waiting = NULL;
    if (ck_path_join(path, sizeof path, dir, ".ckptd/state.db") < 0 || !ck_exists(path))
        return 0;
    int err = ck_state_open_db(path, &s.db);
    if (err == 0 && (err = ck_state_retained_list(s.db, rows, n)) == CK_ENOENT)
        err = 0;
    if (err == 0 && ck_state_get(&s, CK_NODES_WAITING_KEY, waiting) < 0) {
        ck_warn("status.nodes_unknown", "%s", ck_error_msg());
        ck_error_clear();
    }
    ck_state_close(&s);
    return err;
}

/* One line of the waiting list: CHECKPOINT, MISSING_RANKS, STORE (tab-separated). */
struct waiting_line {
    const char *f[3];
    int len[3];
};

static const char *next_waiting(const char *s, struct waiting_line *w)
{
    if (!s || !*s)
        return NULL;
    const char *nl = strchr(s, '\n');
    const char *end = nl ? nl : s + strlen(s);
    for (int i = 0; i < 3; i++) {
        const char *tab = i < 2 ? memchr(s, '\t', (size_t)(end - s)) : NULL;
        const char *e = tab ? tab : end;
        w->f[i] = s;
        w->len[i] = (int)(e - s);
        s = tab ? tab + 1 : end;
    }
    return nl ? nl + 1 : end;
}

/* "a,b" from the one-per-line list of stores */
static void stores_text(const char *lines, char *out, size_t outsz)
{
    out[0] = '\0';
    for (const char *s = lines; *s;) {
        const char *nl = strchr(s, '\n');
        size_t l = nl ? (size_t)(nl - s) : strlen(s);
        snprintf(out + strlen(out), outsz - strlen(out), "%s%.*s", out[0] ? "," : "", (int)l, s);
        s += l + (nl != NULL);
    }
}

static bool listed(const struct ck_pmf_meta *m, bool exists, const struct ck_retained *r)
{
    struct ck_pmf_ref ref = {r->ref_is_int != 0, strtoll(r->ref, NULL, 10),
                             r->ref_is_int ? NULL : r->ref};
    return exists && ck_pmf_find(m, &ref) >= 0;
}

static int show(const char *dir, bool json)
{
    char path[PATH_MAX];
    struct ck_buf b = CK_BUF_INIT;
    struct ck_pmf_meta m;
    int err = ck_path_join(path, sizeof path, dir, "metadata.yaml");
    long holder = ck_lock_holder(dir);
    bool exists = err == 0 && ck_exists(path);
    if (exists && (err = ck_read_file(path, METADATA_MAX, &b)) == 0)
        err = ck_pmf_parse(&m, path, ck_buf_str(&b), b.len);
    ck_buf_release(&b);
    if (err < 0)
        return err;
    struct ck_retained *rows = NULL;
    size_t nrows = 0;
    char *waiting = NULL;
    struct waiting_line wl;
    if ((err = load_state(dir, &rows, &nrows, &waiting)) < 0) {
        if (exists)
            ck_pmf_meta_release(&m);
        return err;
    }
    char where[2048];
    const char *status = exists ? ck_pmf_status_name(m.status) : "none";
    if (json) {
        struct ck_buf o = CK_BUF_INIT;
        struct ck_json j;
        char txt[1024];
        ck_json_init(&j, &o, false);
        ck_json_begin_object(&j);
        ck_json_kstr(&j, "dir", dir);
        ck_json_kstr(&j, "status", status);
        ck_json_kint(&j, "checkpoints", exists ? (int64_t)m.ncheckpoints : 0);
        ck_json_key(&j, "latest");
        if (exists && m.has_latest)
            ck_json_str(&j, ck_pmf_ref_str(&m.latest, txt, sizeof txt));
        else
            ck_json_null(&j);
        ck_json_key(&j, "latest_epoch");
        if (exists && m.latest_epoch.set)
            ck_json_int(&j, m.latest_epoch.v);
        else
            ck_json_null(&j);
        ck_json_key(&j, "watcher_pid");
        if (holder > 0)
            ck_json_int(&j, holder);
        else
            ck_json_null(&j);
        ck_json_kbool(&j, "locked", holder != 0);
        /* where each checkpoint's bytes are: local (in metadata.yaml), or
         * only in the stores once retention deleted them */
        ck_json_key(&j, "where");
        ck_json_begin_array(&j);
        for (size_t i = 0; exists && i < m.ncheckpoints; i++) {
            ck_json_begin_object(&j);
            ck_json_kstr(&j, "checkpoint", ck_pmf_ref_str(&m.checkpoints[i].ref, txt, sizeof txt));
            ck_json_kstr(&j, "location", "local");
            ck_json_end_object(&j);
        }
        for (size_t i = 0; i < nrows; i++) {
            if (listed(&m, exists, &rows[i]))
                continue;
            ck_json_begin_object(&j);
            ck_json_kstr(&j, "checkpoint", rows[i].ref);
            /* gone: retention.store pruned it from the stores too */
            ck_json_kstr(&j, "location", rows[i].pruned == 2 ? "gone"
                                         : rows[i].deleted  ? "stores"
                                                            : "deleting");
            ck_json_key(&j, "stores");
            ck_json_begin_array(&j);
            for (const char *s = rows[i].stores; *s;) {
                const char *nl = strchr(s, '\n');
                size_t l = nl ? (size_t)(nl - s) : strlen(s);
                ck_json_strn(&j, s, l);
                s += l + (nl != NULL);
            }
            ck_json_end_array(&j);
            ck_json_end_object(&j);
        }
        ck_json_end_array(&j);
        /* a node of several: the steps waiting for other nodes' parts */
        ck_json_key(&j, "nodes_waiting");
        ck_json_begin_array(&j);
        for (const char *s = waiting; (s = next_waiting(s, &wl));) {
            ck_json_begin_object(&j);
            ck_json_key(&j, "checkpoint");
            ck_json_strn(&j, wl.f[0], (size_t)wl.len[0]);
            ck_json_key(&j, "missing_ranks");
            ck_json_begin_array(&j);
            for (const char *r = wl.f[1]; r < wl.f[1] + wl.len[1];) {
                ck_json_int(&j, strtoll(r, NULL, 10));
                const char *comma = memchr(r, ',', (size_t)(wl.f[1] + wl.len[1] - r));
                r = comma ? comma + 1 : wl.f[1] + wl.len[1];
            }
            ck_json_end_array(&j);
            ck_json_key(&j, "store");
            ck_json_strn(&j, wl.f[2], (size_t)wl.len[2]);
            ck_json_end_object(&j);
        }
        ck_json_end_array(&j);
        ck_json_end_object(&j);
        printf("%s\n", ck_buf_str(&o));
        ck_buf_release(&o);
    } else {
        printf("dir:          %s\nstatus:       %s\n", dir, status);
        printf("checkpoints:  %zu\n", exists ? m.ncheckpoints : (size_t)0);
        printf("latest:       ");
        if (exists && m.has_latest) {
            print_ref(stdout, &m.latest);
            if (m.latest_epoch.set)
                printf(" (epoch %lld)", (long long)m.latest_epoch.v);
        } else {
            printf("-");
        }
        printf("\nwatcher:      ");
        if (holder > 0)
            printf("running (pid %ld)\n", holder);
        else
            printf(holder < 0 ? "running\n" : "none\n");
        /* a node of several: what its last round found missing */
        for (const char *s = waiting; (s = next_waiting(s, &wl));)
            printf("waiting:      %.*s for the parts of nodes %.*s (%.*s)\n", wl.len[0], wl.f[0],
                   wl.len[1], wl.f[1], wl.len[2], wl.f[2]);
        /* once retention deleted some: where each one is */
        if (nrows)
            printf("where:\n");
        for (size_t i = 0; nrows && i < (exists ? m.ncheckpoints : 0); i++) {
            printf("  %-28s local\n", ck_pmf_ref_str(&m.checkpoints[i].ref, where, sizeof where));
        }
        for (size_t i = 0; i < nrows; i++) {
            if (listed(&m, exists, &rows[i]))
                continue;
            stores_text(rows[i].stores, where, sizeof where);
            if (rows[i].pruned == 2) {
                printf("  %-28s gone: pruned from the stores (retention.store)\n", rows[i].ref);
                continue;
            }
            printf("  %-28s %s %s\n", rows[i].ref,
                   rows[i].deleted ? "stores only:" : "being deleted, copies in:",
                   where[0] ? where : "none (retention.without_store)");
        }
    }
    if (exists)
        ck_pmf_meta_release(&m);
    ck_retained_list_free(rows, nrows);
    free(waiting);
    return 0;
}

int ck_cmd_status(int argc, char **argv)
{
    struct ck_cli cli;
    struct status_flags fl = {.to = -1, .timeout = 60};
    int rc;
    ck_cli_init(&cli);
    if ((rc = ck_cli_parse("status", argc, argv, options, &fl, &cli, true)) != 0)
        return rc;
    if (cli.help) {
        ck_cli_help(head, options, tail);
        return CK_EXIT_OK;
    }
    int to = fl.to;
    bool json = fl.json, wait = fl.wait;
    double timeout = fl.timeout;
    if (optind + 1 != argc)
        return ck_cli_usage_error("status", "expected one DIR");
    const char *dir = argv[optind];
    struct ck_config cfg;
    int err = ck_config_for_dir(&cfg, cli.config_path, dir);
    ck_cli_setup_logging(&cli, cfg.log_format, cfg.log_level);
    if (err < 0) {
        ck_config_release(&cfg);
        return ck_cli_fail("status", err);
    }
    if (!ck_is_dir(dir)) {
        ck_config_release(&cfg);
        return ck_cli_usage_error("status", "'%s' is not a folder", dir);
    }
    int upload_rc = CK_EXIT_OK;
    if (to >= 0 && (err = end_training(dir, &cfg, to, timeout, &upload_rc)) < 0) {
        ck_config_release(&cfg);
        return ck_cli_fail("status", err);
    }
    ck_config_release(&cfg);
    if (wait && (err = wait_for_watcher(dir, timeout)) < 0)
        return ck_cli_fail("status", err);
    err = show(dir, json);
    return err < 0 ? ck_cli_fail("status", err) : upload_rc;
}
