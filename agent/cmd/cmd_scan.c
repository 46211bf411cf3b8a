/* ckptd scan DIR: one idempotent pass, for cron. */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/config.h"
#include "agent/config_check.h"
#include "agent/nodecommit.h"
#include "agent/nodes.h"
#include "agent/lock.h"
#include "agent/notify.h"
#include "agent/pipeline.h"
#include "agent/retention.h"
#include "agent/scan.h"
#include "agent/state.h"
#include "agent/sweep.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <stdio.h>
#include <string.h>

static const char head[] =
    "usage: ckptd scan [options] DIR\n"
    "\n"
    "Brings DIR's PMF tree up to date once and exits: registers every complete\n"
    "checkpoint not registered yet in DIR/metadata.yaml (linking it under\n"
    "data/checkpoints/), updates the training status, and changes nothing when\n"
    "there is nothing new. Safe to run from cron.\n"
    "\n";
static const char tail[] =
    "\n"
    "exit: 0 done, 1 something could not be done (a checkpoint registered, packed,\n"
    "verified or uploaded, a hook delivered: see the log), 2 usage or config error,\n"
    "3 another ckptd holds DIR's lock\n";

struct scan_flags {
    int end_status; /* -1, CK_PMF_FINISHED or CK_PMF_FAILED */
    bool check;
    bool dry_run;
};

#define O(f) offsetof(struct scan_flags, f)
static const struct ck_opt options[] = {
    {"finished", 0, CK_OPT_VALUE, NULL, NULL, O(end_status), CK_PMF_FINISHED, NULL,
     "mark the training finished (after registering)"},
    {"failed", 0, CK_OPT_VALUE, NULL, NULL, O(end_status), CK_PMF_FAILED, NULL,
     "mark the training failed"},
    {"min-age", 0, CK_OPT_CONFIG, "checkpoints.min_age", NULL, 0, 0, "DURATION",
     "take only files unchanged for this long (default 2s)"},
    {"metrics-file", 0, CK_OPT_CONFIG, "metrics_file", NULL, 0, 0, "PATH",
     "write the run's metrics there at the end\n(node_exporter textfile collector)"},
    {"check", 'n', CK_OPT_SET, NULL, NULL, O(check), 0, NULL,
     "check the config and DIR/metadata.yaml, change nothing"},
    {"dry-run", 0, CK_OPT_SET, NULL, NULL, O(dry_run), 0, NULL,
     "list what retention would delete now (its copies are checked only by a real run),\n"
     "change nothing"},
    {NULL, 0, 0, NULL, NULL, 0, 0, NULL, NULL},
};

int ck_cmd_scan(int argc, char **argv)
{
    struct ck_cli cli;
    struct scan_flags fl = {.end_status = -1};
    struct ck_scan_opts so = {.end_status = -1, .min_age = -1};
    int rc;
    ck_cli_init(&cli);
    if ((rc = ck_cli_parse("scan", argc, argv, options, &fl, &cli, true)) != 0)
        return rc;
    if (cli.help) {
        ck_cli_help(head, options, tail);
        return CK_EXIT_OK;
    }
    if (optind + 1 != argc)
        return ck_cli_usage_error("scan", "expected one DIR");
    so.end_status = fl.end_status;
    bool check = fl.check;
    so.dir = argv[optind];

    struct ck_config cfg;
    int err = ck_config_for_dir(&cfg, cli.config_path, so.dir);
    if (err == 0) /* the flags over the file (--min-age, --metrics-file) */
        err = ck_config_apply(&cfg, cli.overrides, cli.noverrides);
    if (err == 0) /* what the run resolves, resolved first: --check fails alike */
        err = ck_config_resolve(&cfg);
    ck_cli_setup_logging(&cli, cfg.log_format, cfg.log_level);
    if (err < 0) {
        ck_config_release(&cfg);
        return ck_cli_fail("scan", err);
    }
    if (!ck_is_dir(so.dir)) {
        ck_config_release(&cfg);
        return ck_cli_usage_error("scan", "'%s' is not a folder", so.dir);
    }
    if ((err = ck_config_check_dir(so.dir)) < 0) { /* what the pass writes */
        ck_config_release(&cfg);
        return ck_cli_fail("scan", err);
    }
    so.cfg = &cfg;
    struct ck_nodes nodes;
    if ((err = ck_nodes_resolve(&nodes, &cfg, NULL)) < 0 || /* resolved above */
        (err = ck_noderound_check(&cfg, &nodes)) < 0) {
        ck_config_release(&cfg);
        return ck_cli_fail("scan", err);
    }
    ck_nodes_apply(&cfg, &nodes);
    ck_nodes_log_start(&nodes);
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
    ck_notify_load_totals(&st);
    if (check) {
        err = ck_scan_check(&so);
        if (err == 0)
            printf("%s: ok\n", so.dir);
        goto out;
    }
    if (fl.dry_run) {
        struct ck_retention_result rr;
        check = true; /* nothing of the run is saved */
        if ((err = ck_retention_run(&st, so.dir, &cfg, NULL, true, &rr)) == 0 &&
            ck_config_has_store_retention(&cfg))
            printf("%s: retention would delete %zu checkpoint(s), and prune %zu from the "
                   "stores\n", so.dir, rr.would_delete, rr.would_prune);
        else if (err == 0)
            printf("%s: retention would delete %zu checkpoint(s)%s\n", so.dir, rr.would_delete,
                   ck_config_has_retention(&cfg) ? "" : " (no retention key is set)");
        goto out;
    }
    /* the pass and what it hands on (agent/pipeline.h): events, pack, verify,
     * and the uploads, run here until the queue is empty (SIGTERM: upload.grace) */
    struct ck_pipeline pl = {.cfg = &cfg, .dir = so.dir, .st = &st, .hooks = hooks,
                             .nodes = &nodes};
    err = ck_pipeline_pass(&pl, &so, &res);
    if (err == 0 && pl.events_err < 0) /* logged; the next run announces it */
        err = ck_error(CK_ERR, "an event of this pass could not be stored (see the log)");
    if (err == 0)
        ck_info("scan.done",
                "dir='%s' registered=%zu updated=%zu removed=%zu waiting=%zu problems=%zu status=%s",
                so.dir, res.nregistered, res.updated, res.removed, res.waiting, res.problems,
                ck_pmf_status_name(res.new_status));
    if (pl.uploaded)
        upload_rc = ck_upload_report_exit("scan", pl.upload_err, &pl.upload);
    ck_pipeline_finish(&pl);
    if (err == 0 && res.problems > 0)
        err = ck_error(CK_ERR, "%zu checkpoint(s) could not be registered (see the log)",
                       res.problems);
    if (err == 0) /* a stage after the pass, or a hook, failed: all was done that could be */
        err = ck_pipeline_failed(&pl);
out:
    ck_scan_result_release(&res);
    if (st.db && !check)
        ck_notify_save_totals(&st, err == 0 && upload_rc == CK_EXIT_OK);
    ck_notify_write_metrics(cfg.metrics_file);
    ck_hooks_free(hooks);
    ck_state_close(&st);
    ck_lock_release(&lock);
    ck_config_release(&cfg);
    return err < 0 ? ck_cli_fail("scan", err) : upload_rc;
}
