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
    "The upload queue: every upload is a job (pending, running, done, failed, or gone:\n"
    "removed from the disk before it was sent).\n"
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
    /* the object's name as the store has it: a store URL written with a
     * trailing slash (s3://b/c/) names the same prefix as without */
    size_t wl = strlen(where);
    while (wl > 0 && where[wl - 1] == '/' && !(wl >= 3 && !strcmp(where + wl - 3, "://")))
        where[--wl] = '\0';
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
        ck_json_kstr(&w, "check", j->checked);
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

/* list: one line (or JSON object) per job, then the counts */
static int queue_list(sqlite3 *db, bool json)
{
    struct list_ctx c = {json, 0};
    int err = ck_queue_each(db, print_job, &c);
    if (err < 0)
        return ck_cli_fail("queue", err);
    int counts[CK_JOB_NSTATES];
    ck_queue_counts(db, counts);
    if (!json)
        printf("%d pending, %d running, %d done, %d failed, %d gone\n", counts[0], counts[1],
               counts[2], counts[3], counts[4]);
    return CK_EXIT_OK;
}

/* retry: failed jobs (id, or every one when 0) back to pending */
static int queue_retry(sqlite3 *db, int64_t id)
{
    int n, err = ck_queue_retry(db, id, &n);
    if (err < 0)
        return ck_cli_fail("queue", err);
    if (id && n == 0)
        return ck_cli_fail("queue", ck_error(CK_ENOENT, "no failed job %lld", (long long)id));
    printf("%d job(s) back to pending\n", n);
    return CK_EXIT_OK;
}

/* The queue of DIR, or of the upload state folder. */
struct queue_db {
    struct ck_state st;   /* DIR's state, when DIR */
    sqlite3 *own;         /* the state folder's database, else */
    sqlite3 *db;          /* the one in use */
    char sdir[4096];      /* its folder */
};

static int queue_open(struct queue_db *q, const char *dir, const char *state_dir)
{
    int err;
    if (dir) {
        if (!ck_is_dir(dir))
            return ck_cli_usage_error("queue", "'%s' is not a directory", dir);
        if ((err = ck_state_open(&q->st, dir)) < 0)
            return ck_cli_fail("queue", err);
        q->db = q->st.db;
        snprintf(q->sdir, sizeof q->sdir, "%s", q->st.dir);
    } else {
        if ((err = ck_state_open_upload_dir(state_dir, q->sdir, sizeof q->sdir, &q->own)) < 0)
            return ck_cli_fail("queue", err);
        q->db = q->own;
    }
    if ((err = ck_queue_init(q->db)) < 0)
        return ck_cli_fail("queue", err);
    return 0;
}

static void queue_close(struct queue_db *q)
{
    if (q->own)
        sqlite3_close(q->own);
    if (q->st.db)
        ck_state_close(&q->st);
}

/* run: under the same lock a scan of DIR or an upload into the state folder takes */
static int queue_run(struct queue_db *q, const char *dir, const struct ck_config *cfg,
                     bool progress)
{
    struct ck_lock lock = {.fd = -1};
    char spool[4200];
    int lockfd = -1;
    int rc = dir ? ck_lock_acquire(&lock, dir) : ck_uploader_lock(q->sdir, &lockfd);
    if (rc < 0)
        return ck_cli_fail("queue", rc);
    snprintf(spool, sizeof spool, "%s/spool", q->sdir);
    rc = ck_upload_run_queue(q->db, cfg, spool, progress, "queue");
    if (lockfd >= 0)
        close(lockfd);
    if (lock.fd >= 0)
        ck_lock_release(&lock);
    return rc;
}

int ck_cmd_queue(int argc, char **argv)
{
    struct ck_cli cli;
    struct queue_flags fl = {.progress = isatty(2)};
    int rc;
    ck_cli_init(&cli);
    if ((rc = ck_cli_parse("queue", argc, argv, options, &fl, &cli, true)) != 0)
        return rc;
    if (cli.help) {
        ck_cli_help(head, options, "");
        return CK_EXIT_OK;
    }
    const char *sub = "list";
    if (optind < argc && (!strcmp(argv[optind], "list") || !strcmp(argv[optind], "retry") ||
                          !strcmp(argv[optind], "run")))
        sub = argv[optind++];
    int64_t id = 0;
    if (!strcmp(sub, "retry") && !fl.all) {
        char *end;
        if (optind >= argc || (id = strtoll(argv[optind], &end, 10)) <= 0 || *end)
            return ck_cli_usage_error("queue", "retry needs a job ID or --all");
        optind++;
    }
    const char *dir = optind < argc ? argv[optind++] : NULL;
    if (optind < argc || (dir && fl.state_dir))
        return ck_cli_usage_error("queue", "expected at most one of DIR and --state DIR");
    struct ck_config cfg;
    if ((rc = ck_config_for_dir(&cfg, cli.config_path, dir)) < 0) {
        ck_config_release(&cfg);
        return ck_cli_fail("queue", rc);
    }
    ck_cli_setup_logging(&cli, cfg.log_format, cfg.log_level);
    struct queue_db q;
    memset(&q, 0, sizeof q);
    if ((rc = queue_open(&q, dir, fl.state_dir)) == 0)
        rc = !strcmp(sub, "list")    ? queue_list(q.db, fl.json)
             : !strcmp(sub, "retry") ? queue_retry(q.db, id)
                                     : queue_run(&q, dir, &cfg, fl.progress);
    queue_close(&q);
    ck_config_release(&cfg);
    return rc;
}
