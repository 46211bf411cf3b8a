/* ckptd queue: list the upload queue, put failed jobs back (retry), or run
 * it now (run). The queue of a model directory (DIR/.ckptd/state.db) or of
 * `ckptd upload` (--state DIR, default $XDG_STATE_HOME/ckptd). */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/config.h"
#include "agent/lock.h"
#include "agent/state.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "stores/uploader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char head[] =
    "usage: ckptd queue [list] [--json] [--state DIR | DIR]\n"
    "       ckptd queue retry (ID | --all) [--state DIR | DIR]\n"
    "       ckptd queue run [--state DIR | DIR]\n"
    "\n"
    "The upload queue: every upload is a job (pending, running, done or failed).\n"
    "list shows them (--json: one JSON object per line); retry puts failed jobs back\n"
    "to pending; run sends what is pending now. DIR is a model directory (its queue\n"
    "is DIR/.ckptd/state.db); without one, the queue of `ckptd upload` (--state DIR,\n"
    "default $XDG_STATE_HOME/ckptd or ~/.local/state/ckptd).\n"
    "\n";

struct queue_flags {
    const char *state_dir;
    bool all, json, progress;
};

#define O(f) offsetof(struct queue_flags, f)
static const struct ck_opt options[] = {
    {"state", 0, CK_OPT_STR, NULL, NULL, O(state_dir), 0, "DIR", "the queue folder of `ckptd upload`"},
    {"all", 0, CK_OPT_SET, NULL, NULL, O(all), 0, NULL, "retry: every failed job"},
    {"json", 0, CK_OPT_SET, NULL, NULL, O(json), 0, NULL, "list: JSON lines"},
    {"no-progress", 0, CK_OPT_CLEAR, NULL, NULL, O(progress), 0, NULL, "run: no progress bar"},
    {NULL, 0, 0, NULL, NULL, 0, 0, NULL, NULL},
};

struct list_ctx {
    bool json;
    int n;
};

static int print_job(const struct ck_job *j, void *ctx)
{
    struct list_ctx *c = ctx;
    char where[512];
    ck_store_url_redact(where, sizeof where, j->store_url);
    if (c->json) {
        struct ck_buf b = CK_BUF_INIT;
        struct ck_json w;
        ck_json_init(&w, &b, false);
        ck_json_begin_object(&w);
        ck_json_kint(&w, "id", j->id);
        ck_json_kstr(&w, "state", ck_job_state_name(j->state));
        ck_json_kstr(&w, "store", where);
        ck_json_kstr(&w, "key", j->key);
        ck_json_kstr(&w, "src", j->src);
        ck_json_kint(&w, "phase", j->phase);
        ck_json_kint(&w, "size", (int64_t)j->size);
        ck_json_kint(&w, "attempts", j->attempts);
        ck_json_kstr(&w, "upload_id", j->upload_id);
        ck_json_kstr(&w, "sha256", j->sha256);
        ck_json_kstr(&w, "original_sha256", j->orig_sha256);
        if (j->error)
            ck_json_kstr(&w, "error", j->error);
        else {
            ck_json_key(&w, "error");
            ck_json_null(&w);
        }
        ck_json_end_object(&w);
        puts(ck_buf_str(&b));
        ck_buf_release(&b);
    } else {
        if (c->n == 0)
            printf("%-6s %-8s %-12s %-5s %-40s %s\n", "ID", "STATE", "SIZE", "TRIES", "STORE/KEY",
                   "ERROR");
        char sz[32];
        snprintf(sz, sizeof sz, "%llu", (unsigned long long)j->size);
        printf("%-6lld %-8s %-12s %-5d %s/%s%s%s\n", (long long)j->id, ck_job_state_name(j->state),
               sz, j->attempts, where, j->key, j->error && j->state != CK_JOB_DONE ? "  " : "",
               j->error && j->state != CK_JOB_DONE ? j->error : "");
    }
    c->n++;
    return 0;
}

int ck_cmd_queue(int argc, char **argv)
{
    struct ck_cli cli;
    struct ck_config cfg;
    struct ck_state st = {0};
    struct ck_lock lock = {.fd = -1};
    struct queue_flags fl = {.progress = isatty(2)};
    int rc, lockfd = -1;
    sqlite3 *db = NULL, *own_db = NULL;
    ck_config_init(&cfg);
    ck_cli_init(&cli);
    if ((rc = ck_cli_parse("queue", argc, argv, options, &fl, &cli, true)) != 0)
        goto done;
    const char *state_dir = fl.state_dir;
    bool all = fl.all, json = fl.json, progress = fl.progress;
    if (cli.help) {
        ck_cli_help(head, options, "");
        rc = CK_EXIT_OK;
        goto done;
    }
    const char *sub = "list";
    if (optind < argc && (!strcmp(argv[optind], "list") || !strcmp(argv[optind], "retry") ||
                          !strcmp(argv[optind], "run")))
        sub = argv[optind++];
    int64_t id = 0;
    if (!strcmp(sub, "retry") && !all) {
        char *end;
        if (optind >= argc || (id = strtoll(argv[optind], &end, 10)) <= 0 || *end) {
            rc = ck_cli_usage_error("queue", "retry needs a job ID or --all");
            goto done;
        }
        optind++;
    }
    const char *dir = optind < argc ? argv[optind++] : NULL;
    if (optind < argc || (dir && state_dir)) {
        rc = ck_cli_usage_error("queue", "expected at most one of DIR and --state DIR");
        goto done;
    }
    ck_config_release(&cfg); /* ck_config_for_dir starts from the defaults again */
    if ((rc = ck_config_for_dir(&cfg, cli.config_path, dir)) < 0) {
        rc = ck_cli_fail("queue", rc);
        goto done;
    }
    ck_cli_setup_logging(&cli, cfg.log_format, cfg.log_level);
    char sdir[4096], path[4200], spool[4200];
    if (dir) {
        if (!ck_is_dir(dir)) {
            rc = ck_cli_usage_error("queue", "'%s' is not a directory", dir);
            goto done;
        }
        if ((rc = ck_state_open(&st, dir)) < 0) {
            rc = ck_cli_fail("queue", rc);
            goto done;
        }
        db = st.db;
        snprintf(sdir, sizeof sdir, "%s", st.dir);
    } else {
        if (state_dir)
            snprintf(sdir, sizeof sdir, "%s", state_dir);
        else if ((rc = ck_uploader_default_state(sdir, sizeof sdir)) < 0) {
            rc = ck_cli_fail("queue", rc);
            goto done;
        }
        if ((rc = ck_mkdirs(sdir, 0700)) < 0) {
            rc = ck_cli_fail("queue", rc);
            goto done;
        }
        snprintf(path, sizeof path, "%s/state.db", sdir);
        if ((rc = ck_state_open_db(path, &own_db)) < 0) {
            rc = ck_cli_fail("queue", rc);
            goto done;
        }
        db = own_db;
    }
    if ((rc = ck_queue_init(db)) < 0) {
        rc = ck_cli_fail("queue", rc);
        goto done;
    }
    if (!strcmp(sub, "list")) {
        struct list_ctx c = {json, 0};
        if ((rc = ck_queue_each(db, print_job, &c)) < 0) {
            rc = ck_cli_fail("queue", rc);
            goto done;
        }
        int counts[4];
        ck_queue_counts(db, counts);
        if (!json)
            printf("%d pending, %d running, %d done, %d failed\n", counts[0], counts[1], counts[2],
                   counts[3]);
        rc = CK_EXIT_OK;
    } else if (!strcmp(sub, "retry")) {
        int n;
        if ((rc = ck_queue_retry(db, id, &n)) < 0) {
            rc = ck_cli_fail("queue", rc);
            goto done;
        }
        if (id && n == 0) {
            rc = ck_cli_fail("queue", ck_error(CK_ENOENT, "no failed job %lld", (long long)id));
            goto done;
        }
        printf("%d job(s) back to pending\n", n);
        rc = CK_EXIT_OK;
    } else {
        /* run: the same lock a scan of DIR or an upload into the state folder takes */
        rc = dir ? ck_lock_acquire(&lock, dir) : ck_uploader_lock(sdir, &lockfd);
        if (rc < 0) {
            rc = ck_cli_fail("queue", rc);
            goto done;
        }
        snprintf(spool, sizeof spool, "%s/spool", sdir);
        rc = ck_upload_run_queue(db, &cfg, spool, progress, "queue");
    }
done:
    if (lockfd >= 0)
        close(lockfd);
    if (lock.fd >= 0)
        ck_lock_release(&lock);
    if (own_db)
        sqlite3_close(own_db);
    if (st.db)
        ck_state_close(&st);
    ck_config_release(&cfg);
    return rc;
}
