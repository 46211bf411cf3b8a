/* ckptd upload PATH DEST: queue a file or a PMF tree for a store, then run
 * the queue (with a progress bar on a terminal). The queue lives in a state
 * folder (--state DIR, else $XDG_STATE_HOME/ckptd or ~/.local/state/ckptd),
 * so a run that was killed continues where it stopped on the next start. */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/upload_round.h"
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

static const char head[] =
    "usage: ckptd upload [options] PATH DEST\n"
    "\n"
    "Uploads PATH (a file, or a PMF tree: its files first, metadata.yaml last) to DEST,\n"
    "a store URL: s3://bucket/key, http(s)://host/path, sftp://user@host/path,\n"
    "file:///path. As aws s3 cp: a file goes to DEST itself (s3://b/x/w.pt is the\n"
    "object x/w.pt), or keeps its name under DEST when DEST ends with '/' (s3://b/x/),\n"
    "is a bucket or host alone, is a store of the config, or is an existing folder\n"
    "(file://). A folder always goes under DEST, keeping its layout.\n"
    "Every upload is a job in a durable queue: after a crash or a kill, running\n"
    "`ckptd upload` (or `ckptd queue run`) again resumes it, multipart uploads with\n"
    "the missing parts only. A store named in the config (upload.stores) takes its\n"
    "options from there.\n"
    "\n";
static const char tail[] =
    "\n"
    "exit: 0 all sent and checked, 1 something failed or was left queued (SIGTERM),\n"
    "2 usage or config error, 3 another ckptd runs this queue\n";

struct upload_flags {
    struct ck_store_spec store; /* the store options of DEST when the config has no row for it */
    const char *state_dir;
    bool queue_only, progress;
};

#define O(f) offsetof(struct upload_flags, f)
static const struct ck_opt options[] = {
    {"endpoint", 0, CK_OPT_STORE, "endpoint", NULL, O(store), 0, "URL",
     "s3: an S3-compatible service (default: AWS_ENDPOINT_URL_S3,\n"
     "AWS_ENDPOINT_URL, the AWS profile's endpoint_url, AWS)"},
    {"region", 0, CK_OPT_STORE, "region", NULL, O(store), 0, "NAME",
     "s3: signing region (default: AWS_REGION, AWS_DEFAULT_REGION,\n"
     "the AWS profile's region, us-east-1)"},
    {"profile", 0, CK_OPT_STORE, "profile", NULL, O(store), 0, "NAME",
     "s3: the AWS profile, as aws --profile (its role, process or keys;\n"
     "keys in the environment are then not used; default: AWS_PROFILE)"},
    {"credentials", 0, CK_OPT_STORE, "credentials", NULL, O(store), 0, "REF",
     "s3: env (AWS_* variables) or file:/path (0600, AWS format);\n"
     "default: the AWS CLI's chain (env, a profile's role, web identity,\n"
     "IAM Identity Center (aws sso login), ~/.aws keys or\n"
     "credential_process, container, instance metadata;\n"
     "see docs/stores.md)\n"
     "http: env:NAME or file:/path holding user:password or a token"},
    {"auth", 0, CK_OPT_STORE, "auth", NULL, O(store), 0, "basic|bearer", "http authentication"},
    {"key", 0, CK_OPT_STORE, "key", NULL, O(store), 0, "FILE",
     "sftp: private key (ed25519, mode 0600)"},
    {"host-key", 0, CK_OPT_STORE, "host_key", NULL, O(store), 0, "SHA256:..",
     "sftp: the server's host key fingerprint (pinned)"},
    {"compress", 0, CK_OPT_STORE, "compress", NULL, O(store), 0, "zstd",
     "send files as NAME.zst (the original's SHA-256 is recorded)"},
    {"bundle", 0, CK_OPT_STORE, "bundle", "true", O(store), 0, NULL,
     "send a tree as one NAME.tar.zst"},
    {"no-move", 0, CK_OPT_STORE, "move", "false", O(store), 0, NULL,
     "http: PUT to the final name (no temporary + MOVE)"},
    {"commit", 0, CK_OPT_STORE, "commit", NULL, O(store), 0, "put|multipart",
     "s3: how metadata.yaml (sent last) goes: one PUT (default), or\n"
     "multipart for servers that keep a PUT cut short (s3rver)"},
    {"concurrency", 0, CK_OPT_CONFIG, "upload.concurrency", NULL, 0, 0, "N",
     "parallel parts per file (default 8)"},
    {"transfers", 0, CK_OPT_CONFIG, "upload.transfers", NULL, 0, 0, "N",
     "files sending at once (default 4; their checks run beside)"},
    {"max-rate", 0, CK_OPT_CONFIG, "upload.max_rate", NULL, 0, 0, "SIZE",
     "bandwidth cap, bytes per second (50MiB)"},
    {"part-size", 0, CK_OPT_CONFIG, "upload.part_size", NULL, 0, 0, "SIZE",
     "multipart part size (default 8MiB)"},
    {"multipart-threshold", 0, CK_OPT_CONFIG, "upload.multipart_threshold", NULL, 0, 0, "SIZE",
     "files this large go multipart (default 64MiB)"},
    {"retries", 0, CK_OPT_CONFIG, "upload.retries", NULL, 0, 0, "N",
     "retries per request (default 6)"},
    {"sha256", 0, CK_OPT_CONFIG, "upload.sha256", "always", 0, 0, NULL,
     "http, sftp: hash files the agent has not hashed, to\nrecord their SHA-256 (costs a core)"},
    {"state", 0, CK_OPT_STR, NULL, NULL, O(state_dir), 0, "DIR", "the queue's folder"},
    {"queue-only", 0, CK_OPT_SET, NULL, NULL, O(queue_only), 0, NULL,
     "queue the jobs and exit without sending"},
    {"no-progress", 0, CK_OPT_CLEAR, NULL, NULL, O(progress), 0, NULL,
     "no progress bar even on a terminal"},
    {NULL, 0, 0, NULL, NULL, 0, 0, NULL, NULL},
};

/* aws-cli's rule for where a single file goes (aws s3 cp FILE DEST): DEST
 * names the object itself, unless it ends with '/' (a prefix: the file
 * keeps its name), has no path below the bucket or host, names a store of
 * the config (a store is a prefix), names an existing folder of a file://
 * store (cp's rule), or is a URL with a query (a presigned PUT URL: the
 * object itself, sent there as it is). Splits DEST into the store URL
 * (store, the part before the last '/') and the object's name (name);
 * name is "" when DEST is a prefix. */
static int dest_object(const struct ck_config *cfg, const char *dest, char *store, size_t ssz,
                       char *name, size_t nsz)
{
    name[0] = '\0';
    if (snprintf(store, ssz, "%s", dest) >= (int)ssz)
        return ck_error(CK_EUSAGE, "'%s': the destination is too long", dest);
    size_t l = strlen(dest);
    const char *scheme = strstr(dest, "://");
    if (!scheme || l == 0 || dest[l - 1] == '/' || strchr(dest, '?'))
        return 0;
    for (size_t i = 0; i < cfg->n_upload_stores; i++)
        if (!strcmp(cfg->upload_stores[i].url, dest))
            return 0;
    const char *path = strchr(scheme + 3, '/'); /* after the bucket or host */
    if (!path || !path[1])
        return 0;
    if (!strncmp(dest, "file://", 7) && ck_is_dir(dest + 7))
        return 0;
    const char *slash = strrchr(dest, '/');
    if (snprintf(name, nsz, "%s", slash + 1) >= (int)nsz)
        return ck_error(CK_EUSAGE, "'%s': the object name is too long", dest);
    store[slash - dest] = '\0';
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

int ck_upload_report_exit(const char *cmd, int err, const struct ck_upload_report *rep)
{
    if (err < 0)
        return ck_cli_fail(cmd, err);
    if (rep->stopped && rep->left) {
        fprintf(stderr, "ckptd %s: stopped: %d job(s) kept in the queue; run again to continue\n",
                cmd, rep->left);
        return CK_EXIT_FAILED;
    }
    if (rep->failed || rep->left) {
        fprintf(stderr,
                "ckptd %s: %d upload(s) failed, %d left in the queue (%d held back: metadata "
                "waits for the data); see 'ckptd queue'\n",
                cmd, rep->failed, rep->left, rep->blocked);
        return CK_EXIT_FAILED;
    }
    return CK_EXIT_OK;
}

/* Runs the queue of an open database and turns the report into an exit code. */
int ck_upload_run_queue(sqlite3 *db, const struct ck_config *cfg, const char *spool, bool progress,
                        const char *cmd)
{
    struct ck_upload_report rep;
    struct ck_upload_round r = {
        .cfg = cfg,
        .spool = spool,
        .run = {.on_progress = progress ? ck_cmd_progress_bar : NULL, .wait_retries = true}};
    int err = ck_upload_round_foreground(db, &r, &rep);
    return ck_upload_report_exit(cmd, err, &rep);
}

int ck_cmd_upload(int argc, char **argv)
{
    struct ck_cli cli;
    struct upload_flags fl = {.progress = isatty(2)};
    struct ck_store_spec spec;
    struct ck_config cfg;
    int rc, lockfd = -1;
    sqlite3 *db = NULL;
    memset(&spec, 0, sizeof spec);
    ck_config_init(&cfg);
    ck_cli_init(&cli);
    if ((rc = ck_cli_parse("upload", argc, argv, options, &fl, &cli, true)) != 0)
        goto done;
    if (cli.help) {
        ck_cli_help(head, options, tail);
        rc = CK_EXIT_OK;
        goto done;
    }
    if (argc - optind != 2) {
        rc = ck_cli_usage_error("upload", "expected PATH and DEST");
        goto done;
    }
    const char *path = argv[optind], *dest = argv[optind + 1];
    if ((cli.config_path && (rc = ck_config_load(&cfg, cli.config_path)) < 0) ||
        (rc = ck_config_apply(&cfg, cli.overrides, cli.noverrides)) < 0) {
        ck_cli_setup_logging(&cli, cfg.log_format, cfg.log_level);
        rc = ck_cli_fail("upload", rc);
        goto done;
    }
    ck_cli_setup_logging(&cli, cfg.log_format, cfg.log_level);
    /* a folder goes under DEST (always a prefix); a file to DEST's object */
    char store_url[4096], object[1024] = "";
    snprintf(store_url, sizeof store_url, "%s", dest);
    if (!ck_is_dir(path) &&
        (rc = dest_object(&cfg, dest, store_url, sizeof store_url, object, sizeof object)) < 0) {
        rc = ck_cli_fail("upload", rc);
        goto done;
    }
    if ((rc = pick_spec(&cfg, store_url, &fl.store, &spec)) < 0 ||
        (rc = ck_store_check(&spec)) < 0) {
        rc = ck_cli_fail("upload", rc);
        goto done;
    }
    if (!ck_exists(path)) {
        rc = ck_cli_usage_error("upload", "'%s' does not exist", path);
        goto done;
    }
    char sdir[4096], spool[4200];
    if ((rc = ck_state_open_upload_dir(fl.state_dir, sdir, sizeof sdir, &db)) < 0 ||
        (rc = ck_queue_init(db)) < 0) {
        rc = ck_cli_fail("upload", rc);
        goto done;
    }
    snprintf(spool, sizeof spool, "%s/spool", sdir);
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
        rc = ck_uploader_enqueue_file(db, &spec, real, object[0] ? object : ck_basename(real), 0,
                                      &added);
        queued = added;
    }
    if (rc < 0) {
        rc = ck_cli_fail("upload", rc);
        goto done;
    }
    if (!queued)
        ck_info("upload.unchanged", "path=\"%s\": already queued or sent with this content", path);
    if (fl.queue_only) {
        rc = CK_EXIT_OK;
        goto done;
    }
    if ((rc = ck_uploader_lock(sdir, &lockfd)) < 0) {
        rc = ck_cli_fail("upload", rc);
        goto done;
    }
    rc = ck_upload_run_queue(db, &cfg, spool, fl.progress, "upload");
done:
    if (lockfd >= 0)
        close(lockfd);
    if (db)
        sqlite3_close(db);
    ck_store_spec_release(&fl.store);
    ck_store_spec_release(&spec);
    ck_config_release(&cfg);
    return rc;
}
