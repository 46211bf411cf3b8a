/* ckptd watch DIR [-- COMMAND ARGS...]: the sidecar (agent/watch.h). */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/config.h"
#include "agent/config_check.h"
#include "agent/nodecommit.h"
#include "agent/nodes.h"
#include "agent/dirwait.h"
#include "agent/scan.h"
#include "agent/watch.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <stdio.h>
#include <string.h>

static const char head[] =
    "usage: ckptd watch [options] DIR [-- COMMAND [ARGS...]]\n"
    "\n"
    "Keeps DIR's PMF tree current while training runs: registers each checkpoint in\n"
    "DIR/metadata.yaml moments after it is complete (a file closed or renamed into\n"
    "place and unchanged for the settle window, with no process writing it; a TF\n"
    "bundle once every shard is there; a folder once its marker is written or it is\n"
    "renamed into place), never while it is written, never twice.\n"
    "\n"
    "With a COMMAND, starts it (no shell) in its own process group, sets the status\n"
    "running, forwards SIGINT/SIGTERM/SIGHUP to it, and when it exits registers what\n"
    "is left, sets finished (exit 0) or failed, and exits with its status (128+N\n"
    "for signal N). Without one, 'ckptd status DIR --finished|--failed' or a\n"
    "training.finished_marker/failed_marker file ends the training and the watcher.\n"
    "A DIR that does not exist yet is waited for (the trainer makes it), or made\n"
    "with --create; with a COMMAND it is made (the command starts only once DIR\n"
    "exists: waiting for the command to make it would never end).\n"
    "\n";
static const char tail[] =
    "\n"
    "signals: SIGTERM/SIGINT stop (after the command when there is one), SIGHUP\n"
    "reloads the config (a bad one is logged and the running one kept)\n"
    "exit: the command's status; else 0 stopped or training ended, 1 failed,\n"
    "2 usage or config error, 3 another ckptd holds DIR's lock\n";

struct watch_flags {
    bool check;
    bool create;
};

#define O(f) offsetof(struct watch_flags, f)
static const struct ck_opt options[] = {
    {"poll", 0, CK_OPT_CONFIG, "watch.poll", "true", 0, 0, NULL,
     "poll instead of using inotify (network filesystems are\npolled anyway)"},
    {"poll-interval", 0, CK_OPT_CONFIG, "watch.poll_interval", NULL, 0, 0, "DUR",
     "time between two polls (default 2s)"},
    {"settle", 0, CK_OPT_CONFIG, "watch.settle", NULL, 0, 0, "DUR",
     "a file must be unchanged this long (default 200ms)"},
    {"grace-period", 0, CK_OPT_CONFIG, "watch.grace_period", NULL, 0, 0, "DUR",
     "after SIGTERM/SIGINT, time the command gets before SIGKILL\n(default 20s)"},
    {"listen", 0, CK_OPT_CONFIG, "listen", NULL, 0, 0, "HOST:PORT",
     "serve /healthz /readyz /metrics /status there"},
    {"check", 'n', CK_OPT_SET, NULL, NULL, O(check), 0, NULL,
     "check the config and DIR/metadata.yaml, then exit"},
    {"create", 0, CK_OPT_SET, NULL, NULL, O(create), 0, NULL,
     "make DIR (and the folders above it) when it does not exist;\nwithout it, "
     "a missing DIR is waited for (made anyway with a COMMAND)"},
    {NULL, 0, 0, NULL, NULL, 0, 0, NULL, NULL},
};

int ck_cmd_watch(int argc, char **argv)
{
    struct ck_cli cli;
    struct watch_flags fl = {false};
    struct ck_watch_opts wo = {0};
    int rc;
    ck_cli_init(&cli);
    /* Options may come before or after DIR, never after "--": that is the command's. */
    int nopts = 1;
    while (nopts < argc && strcmp(argv[nopts], "--"))
        nopts++;
    if ((rc = ck_cli_parse("watch", nopts, argv, options, &fl, &cli, true)) != 0)
        return rc;
    bool check = fl.check;
    if (cli.help) {
        ck_cli_help(head, options, tail);
        return CK_EXIT_OK;
    }
    if (optind >= nopts)
        return ck_cli_usage_error("watch", "expected DIR");
    if (optind + 1 < nopts)
        return ck_cli_usage_error("watch", "unexpected '%s' after DIR (a command comes after "
                                           "'--')", argv[optind + 1]);
    wo.dir = argv[optind];
    if (nopts < argc) {
        if (nopts + 1 >= argc)
            return ck_cli_usage_error("watch", "expected a command after '--'");
        wo.command = argv + nopts + 1;
    }
    wo.config_path = cli.config_path;
    wo.log_format = cli.log_format;
    wo.log_level = cli.log_level;
    wo.overrides = cli.overrides;
    wo.noverrides = cli.noverrides;

    /* A sidecar starts before the trainer makes its folder: wait for it (or
     * make it), then read the config it may hold. */
    if (ck_exists(wo.dir) && !ck_is_dir(wo.dir))
        return ck_cli_usage_error("watch", "'%s' is not a folder", wo.dir);
    if (!check && !ck_is_dir(wo.dir)) {
        bool stopped = false;
        int e;
        ck_cli_setup_logging(&cli, CK_LOG_TEXT, CK_LOG_INFO);
        /* with a command, ours to start: made, since the command may be
         * what would make it */
        if (fl.create || wo.command) {
            e = ck_mkdirs(wo.dir, 0755);
            if (e == 0)
                ck_info("watch.dir_created", "dir='%s': it did not exist", wo.dir);
        } else {
            e = ck_dir_wait(wo.dir, &stopped);
        }
        if (e < 0)
            return ck_cli_fail("watch", e);
        if (stopped)
            return CK_EXIT_OK;
    }
    struct ck_config cfg;
    int err = ck_config_for_dir(&cfg, cli.config_path, wo.dir);
    ck_cli_setup_logging(&cli, cfg.log_format, cfg.log_level);
    if (err == 0 && (err = ck_watch_apply_flags(&wo, &cfg)) == 0)
        err = ck_watch_check_config(&cfg);
    /* secrets, key files, the listen address: resolved before anything
     * starts, so that -n and a start fail alike (exit 2) */
    if (err == 0)
        err = ck_config_resolve(&cfg);
    if (err < 0) {
        ck_config_release(&cfg);
        return ck_cli_fail("watch", err);
    }
    if (!ck_is_dir(wo.dir)) {
        ck_config_release(&cfg);
        return ck_cli_usage_error("watch", "'%s' is not a folder", wo.dir);
    }
    if ((err = ck_config_check_dir(wo.dir)) < 0) { /* what the first pass writes */
        ck_config_release(&cfg);
        return ck_cli_fail("watch", err);
    }
    /* which node this is: a node of several needs stores that list and write
     * only if a name is free (exit 2 when not, -n too) */
    struct ck_nodes nodes;
    if ((err = ck_nodes_resolve(&nodes, &cfg, NULL)) < 0 ||
        (err = ck_noderound_check(&cfg, &nodes)) < 0) {
        ck_config_release(&cfg);
        return ck_cli_fail("watch", err);
    }
    if (check) {
        /* No lock: checking a config must work beside the running watcher. */
        struct ck_scan_opts so = {.dir = wo.dir, .cfg = &cfg, .end_status = -1, .min_age = -1};
        err = ck_scan_check(&so);
        ck_config_release(&cfg);
        if (err < 0)
            return ck_cli_fail("watch", err);
        printf("%s: ok\n", wo.dir);
        return CK_EXIT_OK;
    }
    ck_nodes_apply(&cfg, &nodes);
    ck_nodes_log_start(&nodes);
    wo.nodes = &nodes;
    int failed;
    int code = ck_watch_run(&wo, &cfg, &failed);
    if (failed < 0)
        ck_cli_fail("watch", failed);
    return code;
}
