/* ckptd upload PATH DEST: queue a file or a PMF tree for a store, then run
 * the queue (with a progress bar on a terminal). The queue lives in a state
 * folder (--state DIR, else $XDG_STATE_HOME/ckptd or ~/.local/state/ckptd),
 * so a run that was killed continues where it stopped on the next start. */
#include "agent/cli.h"
#include "agent/commands.h"
#include "agent/config.h"
#include "agent/state.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "stores/uploader.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char help[] =
    "usage: ckptd upload [options] PATH DEST\n"
    "\n"
    "Uploads PATH (a file, or a PMF tree: its files first, metadata.yaml last) to DEST,\n"
    "a store URL taken as a folder: s3://bucket/prefix, http(s)://host/path,\n"
    "sftp://user@host/path, file:///path. A file keeps its name; a tree keeps its layout.\n"
    "Every upload is a job in a durable queue: after a crash or a kill, running\n"
    "`ckptd upload` (or `ckptd queue run`) again resumes it, multipart uploads with\n"
    "the missing parts only. A store named in the config (upload.stores) takes its\n"
    "options from there.\n"
    "\n"
    "  --endpoint URL        s3: an S3-compatible service (default: AWS_ENDPOINT_URL_S3,\n"
    "                        AWS_ENDPOINT_URL, the AWS profile's endpoint_url, AWS)\n"
    "  --region NAME         s3: signing region (default: AWS_REGION, AWS_DEFAULT_REGION,\n"
    "                        the AWS profile's region, us-east-1)\n"
    "  --credentials REF     s3: env (AWS_* variables) or file:/path (0600, AWS format);\n"
    "                        default: the AWS CLI's chain (env, web identity, ~/.aws,\n"
    "                        container, instance metadata; see the README)\n"
    "                        http: env:NAME or file:/path holding user:password or a token\n"
    "  --auth basic|bearer   http authentication\n"
    "  --key FILE            sftp: private key (ed25519, mode 0600)\n"
    "  --host-key SHA256:..  sftp: the server's host key fingerprint (pinned)\n"
    "  --compress zstd       send files as NAME.zst (the original's SHA-256 is recorded)\n"
    "  --bundle              send a tree as one NAME.tar.zst\n"
    "  --no-move             http: PUT to the final name (no temporary + MOVE)\n"
    "  --concurrency N       parallel parts per file (default 8)\n"
    "  --transfers N         files in flight at once (default 4)\n"
    "  --max-rate SIZE       bandwidth cap, bytes per second (50MiB)\n"
    "  --part-size SIZE      multipart part size (default 8MiB)\n"
    "  --multipart-threshold SIZE   (default 64MiB)\n"
    "  --retries N           retries per request (default 6)\n"
    "  --state DIR           the queue's folder\n"
    "  --queue-only          queue the jobs and exit without sending\n"
    "  --no-progress         no progress bar even on a terminal\n" CK_CLI_HELP "\n"
    "exit: 0 all sent and checked, 1 something failed or was left queued (SIGTERM),\n"
    "2 usage or config error, 3 another ckptd runs this queue\n";

static struct ck_upload_ctl *volatile g_ctl;

static void on_signal(int sig)
{
    if (g_ctl)
        atomic_store(&g_ctl->stop, 1);
}

enum {
    O_ENDPOINT = CK_OPT_FIRST_COMMAND_OPTION,
    O_REGION,
    O_CREDS,
    O_AUTH,
    O_KEY,
    O_HOSTKEY,
    O_COMPRESS,
    O_BUNDLE,
    O_NOMOVE,
    O_CONC,
    O_RATE,
    O_PART,
    O_THRESH,
    O_RETRIES,
    O_STATE,
    O_QONLY,
    O_NOPROG,
    O_TRANSFERS,
};

static int set_size(const char *v, uint64_t *out, const char *opt)
{
    if (ck_parse_size(v, out) < 0)
        return ck_cli_usage_error("upload", "%s: '%s' is not a size", opt, v);
    return 0;
}

/* The spec for DEST: the config's row with that URL, else DEST with the flags. */
static int pick_spec(const struct ck_config *cfg, const char *dest,
                     const struct ck_store_spec *flags, struct ck_store_spec *out)
{
    for (size_t i = 0; i < cfg->n_upload_stores; i++)
        if (!strcmp(cfg->upload_stores[i].url, dest))
            return ck_store_spec_copy(out, &cfg->upload_stores[i]);
    int err = ck_store_spec_copy(out, flags);
    if (err == 0) {
        free(out->url);
        if (!(out->url = strdup(dest)))
            return ck_error(CK_ENOMEM, "out of memory");
    }
    return err;
}

/* The handlers set only the stop flag; the previous ones come back after the run. */
static void install_signals(struct ck_upload_ctl *ctl, struct sigaction old[3])
{
    struct sigaction sa, ign;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    g_ctl = ctl;
    sigaction(SIGTERM, &sa, &old[0]);
    sigaction(SIGINT, &sa, &old[1]);
    sigaction(SIGPIPE, &ign, &old[2]);
}

static void restore_signals(const struct sigaction old[3])
{
    sigaction(SIGTERM, &old[0], NULL);
    sigaction(SIGINT, &old[1], NULL);
    sigaction(SIGPIPE, &old[2], NULL);
    g_ctl = NULL;
}

/* Runs the queue of an open database and turns the report into an exit code. */
int ck_upload_run_queue(sqlite3 *db, const struct ck_config *cfg, const char *spool, bool progress,
                        const char *cmd, void (*on_job)(void *, const struct ck_upload_outcome *),
                        void *arg)
{
    struct ck_upload_ctl ctl;
    struct ck_upload_report rep;
    struct ck_uploader_run_opts ro = {
        .progress_bar = progress, .wait_retries = true, .on_job = on_job, .on_job_arg = arg};
    struct sigaction old[3];
    ck_upload_ctl_init(&ctl, cfg->upload.grace);
    install_signals(&ctl, old);
    int err = ck_uploader_run(db, &cfg->upload, spool, &ctl, &ro, &rep);
    restore_signals(old);
    if (err < 0)
        return ck_cli_fail(cmd, err);
    ck_info("upload.summary", "done=%d failed=%d left=%d blocked=%d%s", rep.done, rep.failed,
            rep.left, rep.blocked, rep.stopped ? " stopped=yes" : "");
    if (rep.stopped && rep.left) {
        fprintf(stderr, "ckptd %s: stopped: %d job(s) kept in the queue; run again to continue\n",
                cmd, rep.left);
        return CK_EXIT_FAILED;
    }
    if (rep.failed || rep.left) {
        fprintf(stderr,
                "ckptd %s: %d upload(s) failed, %d left in the queue (%d held back: metadata "
                "waits for the data); see 'ckptd queue'\n",
                cmd, rep.failed, rep.left, rep.blocked);
        return CK_EXIT_FAILED;
    }
    return CK_EXIT_OK;
}

int ck_upload_after_scan(sqlite3 *db, const struct ck_config *cfg, const char *dir,
                         const char *state_dir,
                         void (*on_job)(void *, const struct ck_upload_outcome *), void *arg)
{
    char root[4096], spool[4200];
    int queued = 0, err;
    if (!cfg->n_upload_stores)
        return CK_EXIT_OK;
    if (!realpath(dir, root))
        snprintf(root, sizeof root, "%s", dir);
    snprintf(spool, sizeof spool, "%s/spool", state_dir);
    if ((err = ck_queue_init(db)) < 0 ||
        (err = ck_uploader_enqueue_pmf(db, cfg->upload_stores, cfg->n_upload_stores, root,
                                       &queued)) < 0)
        return ck_cli_fail("scan", err);
    if (queued)
        ck_info("upload.queued_tree", "dir=\"%s\" jobs=%d", dir, queued);
    return ck_upload_run_queue(db, cfg, spool, false, "scan", on_job, arg);
}

int ck_cmd_upload(int argc, char **argv)
{
    static const struct option longopts[] = {
        CK_CLI_LONGOPTS,
        {"endpoint", required_argument, NULL, O_ENDPOINT},
        {"region", required_argument, NULL, O_REGION},
        {"credentials", required_argument, NULL, O_CREDS},
        {"auth", required_argument, NULL, O_AUTH},
        {"key", required_argument, NULL, O_KEY},
        {"host-key", required_argument, NULL, O_HOSTKEY},
        {"compress", required_argument, NULL, O_COMPRESS},
        {"bundle", no_argument, NULL, O_BUNDLE},
        {"no-move", no_argument, NULL, O_NOMOVE},
        {"concurrency", required_argument, NULL, O_CONC},
        {"transfers", required_argument, NULL, O_TRANSFERS},
        {"max-rate", required_argument, NULL, O_RATE},
        {"part-size", required_argument, NULL, O_PART},
        {"multipart-threshold", required_argument, NULL, O_THRESH},
        {"retries", required_argument, NULL, O_RETRIES},
        {"state", required_argument, NULL, O_STATE},
        {"queue-only", no_argument, NULL, O_QONLY},
        {"no-progress", no_argument, NULL, O_NOPROG},
        {NULL, 0, NULL, 0}};
    struct ck_cli cli;
    struct ck_store_spec flags, spec;
    struct ck_config cfg;
    const char *state_dir = NULL;
    bool queue_only = false, progress = isatty(2);
    uint64_t rate = 0, part = 0, thresh = 0;
    int conc = 0, transfers = 0, retries = -1, opt, rc, lockfd = -1;
    sqlite3 *db = NULL;
    memset(&flags, 0, sizeof flags);
    memset(&spec, 0, sizeof spec);
    ck_config_init(&cfg);
    ck_cli_init(&cli);
    optind = 1;
    while ((opt = getopt_long(argc, argv, CK_CLI_SHORTOPTS + 1, longopts, NULL)) != -1) {
        if ((rc = ck_cli_common(&cli, "upload", opt, optarg)) != 0) {
            if (rc != 1)
                goto done;
            continue;
        }
        rc = 0;
        switch (opt) {
        case O_ENDPOINT:
            rc = ck_store_spec_set(&flags, "endpoint", optarg);
            break;
        case O_REGION:
            rc = ck_store_spec_set(&flags, "region", optarg);
            break;
        case O_CREDS:
            rc = ck_store_spec_set(&flags, "credentials", optarg);
            break;
        case O_AUTH:
            rc = ck_store_spec_set(&flags, "auth", optarg);
            break;
        case O_KEY:
            rc = ck_store_spec_set(&flags, "key", optarg);
            break;
        case O_HOSTKEY:
            rc = ck_store_spec_set(&flags, "host_key", optarg);
            break;
        case O_COMPRESS:
            rc = ck_store_spec_set(&flags, "compress", optarg);
            break;
        case O_BUNDLE:
            flags.bundle = true;
            break;
        case O_NOMOVE:
            flags.no_move = true;
            break;
        case O_CONC:
            conc = atoi(optarg);
            if (conc < 1 || conc > 64)
                rc = ck_error(CK_EUSAGE, "--concurrency: 1 to 64");
            break;
        case O_TRANSFERS:
            transfers = atoi(optarg);
            if (transfers < 1 || transfers > 64)
                rc = ck_error(CK_EUSAGE, "--transfers: 1 to 64");
            break;
        case O_RETRIES:
            retries = atoi(optarg);
            if (retries < 0 || retries > 64)
                rc = ck_error(CK_EUSAGE, "--retries: 0 to 64");
            break;
        case O_RATE:
            if ((rc = set_size(optarg, &rate, "--max-rate")) != 0)
                goto done;
            break;
        case O_PART:
            if ((rc = set_size(optarg, &part, "--part-size")) != 0)
                goto done;
            break;
        case O_THRESH:
            if ((rc = set_size(optarg, &thresh, "--multipart-threshold")) != 0)
                goto done;
            break;
        case O_STATE:
            state_dir = optarg;
            break;
        case O_QONLY:
            queue_only = true;
            break;
        case O_NOPROG:
            progress = false;
            break;
        default:
            rc = ck_cli_usage_error("upload", "unknown option");
            goto done;
        }
        if (rc < 0) {
            rc = ck_cli_usage_error("upload", "%s", ck_error_msg());
            goto done;
        }
    }
    if (cli.help) {
        fputs(help, stdout);
        rc = CK_EXIT_OK;
        goto done;
    }
    if (argc - optind != 2) {
        rc = ck_cli_usage_error("upload", "expected PATH and DEST");
        goto done;
    }
    const char *path = argv[optind], *dest = argv[optind + 1];
    if (cli.config_path && (rc = ck_config_load(&cfg, cli.config_path)) < 0) {
        rc = ck_cli_fail("upload", rc);
        goto done;
    }
    ck_cli_setup_logging(&cli, cfg.log_format, cfg.log_level);
    if (conc)
        cfg.upload.concurrency = conc;
    if (transfers)
        cfg.upload.transfers = transfers;
    if (retries >= 0)
        cfg.upload.retries = retries;
    if (rate)
        cfg.upload.max_rate = rate;
    if (part) {
        if (part < (5u << 20)) {
            rc = ck_cli_usage_error("upload", "--part-size: at least 5MiB (S3's minimum)");
            goto done;
        }
        cfg.upload.part_size = part;
    }
    if (thresh)
        cfg.upload.multipart_threshold = thresh;
    if ((rc = pick_spec(&cfg, dest, &flags, &spec)) < 0 || (rc = ck_store_check(&spec)) < 0) {
        rc = ck_cli_fail("upload", rc);
        goto done;
    }
    if (!ck_exists(path)) {
        rc = ck_cli_usage_error("upload", "'%s' does not exist", path);
        goto done;
    }
    char sdir[4096], dbpath[4200], spool[4200];
    if (state_dir)
        snprintf(sdir, sizeof sdir, "%s", state_dir);
    else if ((rc = ck_uploader_default_state(sdir, sizeof sdir)) < 0) {
        rc = ck_cli_fail("upload", rc);
        goto done;
    }
    if ((rc = ck_mkdirs(sdir, 0700)) < 0) {
        rc = ck_cli_fail("upload", rc);
        goto done;
    }
    snprintf(dbpath, sizeof dbpath, "%s/state.db", sdir);
    snprintf(spool, sizeof spool, "%s/spool", sdir);
    if ((rc = ck_state_open_db(dbpath, &db)) < 0 || (rc = ck_queue_init(db)) < 0) {
        rc = ck_cli_fail("upload", rc);
        goto done;
    }
    /* queue first (safe beside a running queue: one transaction each) */
    int queued = 0;
    bool added = false;
    if (ck_is_dir(path)) {
        char root[4096];
        if (!realpath(path, root))
            snprintf(root, sizeof root, "%s", path);
        rc = ck_uploader_enqueue_tree(db, &spec, 1, root, NULL, 0, &queued);
    } else {
        char real[4096];
        if (!realpath(path, real))
            snprintf(real, sizeof real, "%s", path);
        rc = ck_uploader_enqueue_file(db, &spec, real, ck_basename(real), 0, &added);
        queued = added;
    }
    if (rc < 0) {
        rc = ck_cli_fail("upload", rc);
        goto done;
    }
    if (!queued)
        ck_info("upload.unchanged", "path=\"%s\": already queued or sent with this content", path);
    if (queue_only) {
        rc = CK_EXIT_OK;
        goto done;
    }
    if ((rc = ck_uploader_lock(sdir, &lockfd)) < 0) {
        rc = ck_cli_fail("upload", rc);
        goto done;
    }
    rc = ck_upload_run_queue(db, &cfg, spool, progress, "upload", NULL, NULL);
done:
    if (lockfd >= 0)
        close(lockfd);
    if (db)
        sqlite3_close(db);
    ck_store_spec_release(&flags);
    ck_store_spec_release(&spec);
    ck_config_release(&cfg);
    return rc;
}
