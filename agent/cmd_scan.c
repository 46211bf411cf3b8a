/* ckptd scan DIR: one idempotent pass, for cron. */
#include "agent/cli.h"
#include "agent/commands.h"
#include "agent/config.h"
#include "agent/config_check.h"
#include "agent/lock.h"
#include "agent/notify.h"
#include "agent/scan.h"
#include "agent/state.h"
#include "agent/sweep.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char help[] =
    "usage: ckptd scan [options] DIR\n"
    "\n"
    "Brings DIR's PMF tree up to date once and exits: registers every complete\n"
    "checkpoint not registered yet in DIR/metadata.yaml (linking it under\n"
    "data/checkpoints/), updates the training status, and changes nothing when\n"
    "there is nothing new. Safe to run from cron.\n"
    "\n"
    "  --finished            mark the training finished (after registering)\n"
    "  --failed              mark the training failed\n"
    "  --min-age DURATION    take only files unchanged for this long (default 2s)\n"
    "  --metrics-file PATH   write the run's metrics there at the end (node_exporter\n"
    "                        textfile collector; default: metrics_file in the config)\n"
    "  -n, --check           check the config and DIR/metadata.yaml, change nothing\n" CK_CLI_HELP
    "\n"
    "exit: 0 done, 1 something could not be done (see the log), 2 usage or config\n"
    "error, 3 another ckptd holds DIR's lock\n";

enum { OPT_FINISHED = CK_OPT_FIRST_COMMAND_OPTION, OPT_FAILED, OPT_MIN_AGE, OPT_METRICS_FILE };

/* upload.* events of the uploads a scan runs */
struct upload_ctx {
    struct ck_hooks *hooks;
    struct ck_state *st;
    const char *dir;
};

static void scan_upload_event(void *arg, const struct ck_upload_outcome *o)
{
    struct upload_ctx *c = arg;
    ck_notify_upload(c->hooks, c->st, c->dir, o);
}

/* A cron job's textfile must show counters that keep growing across runs:
 * the totals live in the state database between runs (loaded before the
 * pass, saved after it, with the time of this run when it succeeded). A
 * failure here costs only the carried numbers, never the scan. */
static void carry_metrics(struct ck_state *st, bool save, bool succeeded)
{
    char *text = NULL;
    struct ck_buf b = CK_BUF_INIT;
    if (!save) {
        if (ck_state_get(st, "metrics_totals", &text) == 0 && text)
            ck_metrics_load_totals(text, strlen(text));
        free(text);
        return;
    }
    if (succeeded)
        ck_metrics_set(CK_M_LAST_SUCCESS_TIME, (int64_t)time(NULL));
    if (ck_metrics_save_totals(&b) < 0 || ck_state_set(st, "metrics_totals", ck_buf_str(&b)) < 0)
        ck_warn("metrics.totals", "cannot keep the metrics for the next run: %s", ck_error_msg());
    ck_buf_release(&b);
}

int ck_cmd_scan(int argc, char **argv)
{
    static const struct option longopts[] = {
        CK_CLI_LONGOPTS,
        {"finished", no_argument, NULL, OPT_FINISHED},
        {"failed", no_argument, NULL, OPT_FAILED},
        {"min-age", required_argument, NULL, OPT_MIN_AGE},
        {"metrics-file", required_argument, NULL, OPT_METRICS_FILE},
        {"check", no_argument, NULL, 'n'},
        {NULL, 0, NULL, 0},
    };
    struct ck_cli cli;
    struct ck_scan_opts so = {.end_status = -1, .min_age = -1};
    bool check = false;
    const char *metrics_file = NULL;
    int opt, rc;
    ck_cli_init(&cli);
    optind = 1;
    while ((opt = getopt_long(argc, argv, CK_CLI_SHORTOPTS "n", longopts, NULL)) != -1) {
        if ((rc = ck_cli_common(&cli, "scan", opt, optarg)) != 0) {
            if (rc != 1)
                return rc;
            continue;
        }
        switch (opt) {
        case OPT_FINISHED:
        case OPT_FAILED:
            if (so.end_status >= 0)
                return ck_cli_usage_error("scan", "--finished and --failed exclude each other");
            so.end_status = opt == OPT_FINISHED ? CK_PMF_FINISHED : CK_PMF_FAILED;
            break;
        case OPT_MIN_AGE:
            if (ck_parse_duration(optarg, &so.min_age) < 0)
                return ck_cli_usage_error("scan", "%s", ck_error_msg());
            break;
        case 'n':
            check = true;
            break;
        case OPT_METRICS_FILE:
            metrics_file = optarg;
            break;
        }
    }
    if (cli.help) {
        fputs(help, stdout);
        return CK_EXIT_OK;
    }
    if (optind + 1 != argc)
        return ck_cli_usage_error("scan", "expected one DIR");
    so.dir = argv[optind];

    struct ck_config cfg;
    int err = ck_config_for_dir(&cfg, cli.config_path, so.dir);
    ck_cli_setup_logging(&cli, cfg.log_format, cfg.log_level);
    if (err == 0) /* what the run resolves, resolved first: --check fails alike */
        err = ck_config_resolve(&cfg);
    if (err < 0) {
        ck_config_release(&cfg);
        return ck_cli_fail("scan", err);
    }
    if (!ck_is_dir(so.dir)) {
        ck_config_release(&cfg);
        return ck_cli_usage_error("scan", "'%s' is not a folder", so.dir);
    }
    so.cfg = &cfg;
    /* hooks (issue 6): built before the pass, so that a bad secret stops it early */
    struct ck_hooks *hooks = NULL;
    if ((err = ck_hooks_new(&cfg.hooks, cfg.source ? cfg.source : "(defaults)", &hooks)) < 0) {
        ck_config_release(&cfg);
        return ck_cli_fail("scan", err);
    }

    struct ck_lock lock;
    struct ck_state st = {0};
    struct ck_scan_result res = {0};
    int upload_rc = CK_EXIT_OK; /* uploads (issue 5) */
    if ((err = ck_lock_acquire(&lock, so.dir)) < 0) {
        ck_hooks_free(hooks);
        ck_config_release(&cfg);
        return ck_cli_fail("scan", err);
    }
    ck_tree_sweep(so.dir); /* the lock is ours: no other ckptd is writing here */
    if ((err = ck_state_open(&st, so.dir)) < 0)
        goto out;
    carry_metrics(&st, false, false);
    if (check) {
        err = ck_scan_check(&so);
        if (err == 0)
            printf("%s: ok\n", so.dir);
        goto out;
    }
    err = ck_scan_run(&st, &so, &res);
    /* hooks (issue 6): this pass's events (only when metadata.yaml took them) */
    if (err == 0 || res.metadata_written)
        ck_notify_scan(hooks, &st, so.dir, &res);
    if (err == 0)
        ck_info("scan.done",
                "dir='%s' registered=%zu updated=%zu removed=%zu waiting=%zu problems=%zu status=%s",
                so.dir, res.nregistered, res.updated, res.removed, res.waiting, res.problems,
                ck_pmf_status_name(res.new_status));
    /* uploads (issue 5, cmd_upload.c): once metadata.yaml is written, queue the PMF
     * tree's new files for every upload.stores entry, metadata.yaml last, and run the
     * queue until it is empty (SIGTERM: upload.grace); failed uploads make exit 1.
     * Also when some checkpoint had a problem: what is registered is complete. */
    struct upload_ctx uctx = {hooks, &st, so.dir};
    if (err == 0 && cfg.n_upload_stores > 0)
        upload_rc = ck_upload_after_scan(st.db, &cfg, so.dir, st.dir, scan_upload_event, &uctx);
    /* the exec hooks to their end, then whatever webhooks are due, within a budget */
    ck_notify_finish(hooks, &st, CK_NOTIFY_FINISH_BUDGET_S);
    if (err == 0 && res.problems > 0)
        err = ck_error(CK_ERR, "%zu checkpoint(s) could not be registered (see the log)",
                       res.problems);
out:
    ck_scan_result_release(&res);
    if (st.db && !check)
        carry_metrics(&st, true, err == 0 && upload_rc == CK_EXIT_OK);
    ck_notify_write_metrics(metrics_file ? metrics_file : cfg.metrics_file);
    ck_hooks_free(hooks);
    ck_state_close(&st);
    ck_lock_release(&lock);
    ck_config_release(&cfg);
    return err < 0 ? ck_cli_fail("scan", err) : upload_rc;
}
