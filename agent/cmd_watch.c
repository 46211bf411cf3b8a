/* ckptd watch DIR [-- COMMAND ARGS...]: the sidecar (agent/watch.h). */
#include "agent/cli.h"
#include "agent/commands.h"
#include "agent/config.h"
#include "agent/config_check.h"
#include "agent/ops.h"
#include "agent/scan.h"
#include "agent/watch.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <stdio.h>
#include <string.h>

static const char help[] =
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
    "\n"
    "  --poll                poll instead of using inotify (network filesystems are\n"
    "                        polled anyway)\n"
    "  --poll-interval DUR   time between two polls (watch.poll_interval, default 2s)\n"
    "  --settle DUR          a file must be unchanged this long (watch.settle, 200ms)\n"
    "  --grace-period DUR    after SIGTERM/SIGINT, time the command gets before SIGKILL\n"
    "                        (watch.grace_period, default 20s)\n"
    "  --listen HOST:PORT    serve /healthz /readyz /metrics /status there (listen:)\n"
    "  -n, --check           check the config and DIR/metadata.yaml, then exit\n" CK_CLI_HELP
    "\n"
    "signals: SIGTERM/SIGINT stop (after the command when there is one), SIGHUP\n"
    "reloads the config (a bad one is logged and the running one kept)\n"
    "exit: the command's status; else 0 stopped or training ended, 1 failed,\n"
    "2 usage or config error, 3 another ckptd holds DIR's lock\n";

enum {
    OPT_POLL = CK_OPT_FIRST_COMMAND_OPTION,
    OPT_POLL_INTERVAL,
    OPT_SETTLE,
    OPT_GRACE,
    OPT_LISTEN
};

static int duration_flag(const char *name, const char *arg, double *out)
{
    if (ck_parse_duration(arg, out) < 0)
        return ck_cli_usage_error("watch", "%s: %s", name, ck_error_msg());
    return 0;
}

int ck_cmd_watch(int argc, char **argv)
{
    static const struct option longopts[] = {
        CK_CLI_LONGOPTS,
        {"poll", no_argument, NULL, OPT_POLL},
        {"poll-interval", required_argument, NULL, OPT_POLL_INTERVAL},
        {"settle", required_argument, NULL, OPT_SETTLE},
        {"grace-period", required_argument, NULL, OPT_GRACE},
        {"listen", required_argument, NULL, OPT_LISTEN},
        {"check", no_argument, NULL, 'n'},
        {NULL, 0, NULL, 0},
    };
    struct ck_cli cli;
    struct ck_watch_opts wo = {.poll = -1, .poll_interval = -1, .settle = -1, .grace_period = -1};
    bool check = false;
    int opt, rc;
    ck_cli_init(&cli);
    /* Options may come before or after DIR, never after "--": that is the command's. */
    int nopts = 1;
    while (nopts < argc && strcmp(argv[nopts], "--"))
        nopts++;
    optind = 1;
    const char *shortopts = CK_CLI_SHORTOPTS "n";
    while ((opt = getopt_long(nopts, argv, shortopts + 1 /* no '+': permute */, longopts,
                              NULL)) != -1) {
        if ((rc = ck_cli_common(&cli, "watch", opt, optarg)) != 0) {
            if (rc != 1)
                return rc;
            continue;
        }
        rc = 0;
        switch (opt) {
        case OPT_POLL:
            wo.poll = 1;
            break;
        case OPT_POLL_INTERVAL:
            rc = duration_flag("--poll-interval", optarg, &wo.poll_interval);
            break;
        case OPT_SETTLE:
            rc = duration_flag("--settle", optarg, &wo.settle);
            break;
        case OPT_GRACE:
            rc = duration_flag("--grace-period", optarg, &wo.grace_period);
            break;
        case OPT_LISTEN: {
            char host[64];
            int port;
            if (ck_ops_parse_listen(optarg, "--listen", host, sizeof host, &port) < 0)
                return ck_cli_usage_error("watch", "%s", ck_error_msg());
            wo.listen = optarg;
            break;
        }
        case 'n':
            check = true;
            break;
        }
        if (rc)
            return rc;
    }
    if (cli.help) {
        fputs(help, stdout);
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
    wo.cli = &cli;

    struct ck_config cfg;
    int err = ck_config_for_dir(&cfg, cli.config_path, wo.dir);
    ck_cli_setup_logging(&cli, cfg.log_format, cfg.log_level);
    if (err == 0) {
        ck_watch_apply_flags(&wo, &cfg);
        err = ck_watch_check_config(&cfg);
    }
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
    return ck_watch_run(&wo, &cfg);
}
