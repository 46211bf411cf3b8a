/* ckptd hooks: test a receiver, emit an event by hand, deliver or replay
 * what is in a directory's webhook outbox, show the hooks' state. */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/config.h"
#include "agent/state.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/secret.h"
#include "hooks/exec.h"
#include "hooks/hooks.h"
#include "hooks/outbox.h"
#include "hooks/webhook.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char help[] =
    "usage: ckptd hooks test URL [--secret REF]... [--timeout DURATION]\n"
    "       ckptd hooks emit TYPE [DIR] [--set FIELD=VALUE]...\n"
    "       ckptd hooks deliver [DIR] [--wait DURATION]\n"
    "       ckptd hooks replay ID [DIR]\n"
    "       ckptd hooks status [DIR]\n"
    "\n"
    "test     sends one signed hook.test event to URL (or env:NAME / file:/path holding\n"
    "         it), signed with each --secret (env:NAME or file:/path of a whsec_ key);\n"
    "         exit 0 when the receiver answered 2xx\n"
    "emit     emits an event of TYPE (docs/hooks.md, \"Events\") as the agent would: stored in\n"
    "         DIR's outbox for every matching webhook, exec hooks run, then delivered\n"
    "deliver  delivers what is due in DIR's outbox; with --wait, keeps going until\n"
    "         nothing is pending or DURATION has passed\n"
    "replay   resends event ID (same webhook-id) to every webhook that had it\n"
    "status   the webhooks of DIR's config with their pending deliveries and health (JSON)\n"
    "\n"
    "DIR defaults to '.'; its config (or --config) names the hooks.\n"
    "  -s, --secret REF      test: a signing secret reference (repeat during a rotation)\n"
    "  -t, --timeout D       test: the attempt's timeout (default 10s)\n"
    "      --set F=V         emit: an event field (model_name, checkpoint, epoch, ...)\n"
    "  -w, --wait D          deliver: keep delivering for up to D\n" CK_CLI_HELP "\n"
    "exit: 0 done; 1 test: no 2xx answer, deliver: still pending or given up, replay: not\n"
    "accepted, emit: not stored;\n"
    "2 usage or config error\n";

enum { OPT_SET = CK_OPT_FIRST_COMMAND_OPTION };

struct opts {
    struct ck_cli cli;
    char *secrets[16];
    size_t nsecrets;
    const char *sets[64];
    size_t nsets;
    double timeout;
    double wait;
};

/* What the commands that work on a directory share. */
struct dir_ctx {
    const char *dir;
    struct ck_config cfg;
    struct ck_state st;
    bool st_open;
    struct ck_hooks *hooks;
};

static int open_dir(struct dir_ctx *d, const struct opts *o, const char *dir, const char *cmd)
{
    int err;
    memset(d, 0, sizeof *d);
    d->dir = dir;
    if ((err = ck_config_for_dir(&d->cfg, o->cli.config_path, dir)) < 0)
        return ck_cli_fail(cmd, err);
    ck_cli_setup_logging(&o->cli, d->cfg.log_format, d->cfg.log_level);
    if ((err = ck_hooks_new(&d->cfg.hooks, d->cfg.source ? d->cfg.source : "(defaults)",
                            &d->hooks)) < 0)
        return ck_cli_fail(cmd, err);
    if (!ck_is_dir(dir))
        return ck_cli_fail(cmd, ck_error(CK_ENOENT, "'%s' is not a folder", dir));
    if ((err = ck_state_open(&d->st, dir)) < 0)
        return ck_cli_fail(cmd, err);
    d->st_open = true;
    if ((err = ck_outbox_init(d->st.db)) < 0)
        return ck_cli_fail(cmd, err);
    return 0;
}

static void close_dir(struct dir_ctx *d)
{
    ck_hooks_free(d->hooks);
    if (d->st_open)
        ck_state_close(&d->st);
    ck_config_release(&d->cfg);
}

static int64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Delivers until nothing is due (wait == 0) or until nothing is pending or
 * wait seconds have passed, sleeping until the next delivery is due. */
static int deliver(struct dir_ctx *d, double wait, size_t *delivered, int64_t *pending)
{
    int64_t end = ck_mono_ms() + (int64_t)(wait * 1000);
    int err;
    *delivered = 0;
    for (;;) {
        size_t n = 0;
        /* one attempt is bounded by its webhook's timeout; give it at least that */
        int64_t deadline = ck_mono_ms() + 3600 * 1000;
        if ((err = ck_hooks_run_due(d->hooks, d->st.db, deadline, &n)) < 0)
            return err;
        *delivered += n;
        int64_t next;
        if ((err = ck_hooks_next_due(d->hooks, d->st.db, &next)) < 0 ||
            (err = ck_outbox_pending(d->st.db, pending)) < 0)
            return err;
        if (next < 0 || wait <= 0)
            return 0;
        int64_t sleep_ms = next - unix_ms();
        if (ck_mono_ms() + (sleep_ms > 0 ? sleep_ms : 0) > end)
            return 0;
        if (sleep_ms > 0)
            usleep((useconds_t)(sleep_ms > 1000 ? 1000 : sleep_ms) * 1000);
    }
}

static int cmd_test(struct opts *o, int argc, char **argv)
{
    if (argc != 1)
        return ck_cli_usage_error("hooks", "test takes one URL");
    ck_cli_setup_logging(&o->cli, -1, -1);
    struct ck_event ev;
    char host[256] = "", msg[400];
    gethostname(host, sizeof host - 1);
    snprintf(msg, sizeof msg, "test event from ckptd on %s", host);
    int err = ck_event_init(&ev, CK_EV_HOOK_TEST);
    ev.message = msg;
    struct ck_webhook_result r;
    if (err == 0)
        err = ck_hooks_send_once(argv[0], o->secrets, o->nsecrets, &ev,
                                 o->timeout > 0 ? o->timeout : CK_HOOKS_WEBHOOK_TIMEOUT_S, &r);
    if (err == CK_ENET) {
        printf("failed: %s%ld %s (id %s, %.3fs)\n", r.status ? "HTTP " : "", r.status, r.detail,
               ev.id, r.seconds);
        return CK_EXIT_FAILED;
    }
    if (err < 0)
        return ck_cli_fail("hooks", err);
    printf("delivered: HTTP %ld in %.3fs (id %s, %zu signature%s)\n", r.status, r.seconds, ev.id,
           o->nsecrets, o->nsecrets == 1 ? "" : "s");
    return CK_EXIT_OK;
}

static int cmd_emit(struct opts *o, int argc, char **argv)
{
    if (argc < 1 || argc > 2)
        return ck_cli_usage_error("hooks", "emit takes TYPE and an optional DIR");
    int type = ck_event_type_parse(argv[0]);
    if (type < 0)
        return ck_cli_usage_error("hooks", "'%s' is not an event type (docs/hooks.md, \"Events\")",
                                  argv[0]);
    struct dir_ctx d;
    int err, rc = open_dir(&d, o, argc > 1 ? argv[1] : ".", "hooks");
    if (rc) {
        close_dir(&d);
        return rc;
    }
    struct ck_event ev;
    char *model_id = NULL, name_buf[4096];
    if ((err = ck_event_init(&ev, (enum ck_event_type)type)) < 0)
        goto out;
    char real[4096];
    ev.dir = realpath(d.dir, real) ? real : d.dir;
    snprintf(name_buf, sizeof name_buf, "%s", ck_basename(ev.dir));
    ev.model_name = d.cfg.model_name ? d.cfg.model_name : name_buf;
    if (ck_state_get(&d.st, "model_id", &model_id) == 0)
        ev.model_id = model_id;
    for (size_t i = 0; i < o->nsets; i++) {
        char *eq = strchr(o->sets[i], '=');
        if (!eq) {
            rc = ck_cli_usage_error("hooks", "--set takes FIELD=VALUE, not '%s'", o->sets[i]);
            goto done;
        }
        *eq = '\0';
        if ((err = ck_event_set(&ev, o->sets[i], eq + 1)) < 0) {
            rc = ck_cli_usage_error("hooks", "%s", ck_error_msg());
            goto done;
        }
    }
    if ((err = ck_hooks_emit(d.hooks, d.st.db, &ev)) < 0)
        goto out;
    printf("%s\n", ev.id);
    fflush(stdout);
    ck_hooks_wait_exec(d.hooks);
    if ((err = ck_hooks_exec_flush(d.hooks, d.st.db)) < 0)
        goto out;
    size_t delivered;
    int64_t pending;
    err = deliver(&d, 0, &delivered, &pending);
out:
    rc = err < 0 ? ck_cli_fail("hooks", err) : CK_EXIT_OK;
done:
    free(model_id);
    close_dir(&d);
    return rc;
}

static int cmd_deliver(struct opts *o, int argc, char **argv)
{
    if (argc > 1)
        return ck_cli_usage_error("hooks", "deliver takes an optional DIR");
    struct dir_ctx d;
    int rc = open_dir(&d, o, argc ? argv[0] : ".", "hooks");
    if (rc) {
        close_dir(&d);
        return rc;
    }
    size_t delivered;
    int64_t pending = 0;
    /* a delivery given up (its retries spent) or an exec hook that failed
     * during this run: nothing pending, and yet not done */
    size_t failures = ck_hooks_failures(d.hooks);
    int err = deliver(&d, o->wait, &delivered, &pending);
    failures = ck_hooks_failures(d.hooks) - failures;
    if (err < 0)
        rc = ck_cli_fail("hooks", err);
    else
        printf("delivered %zu, pending %lld, given up %zu\n", delivered, (long long)pending,
               failures);
    close_dir(&d);
    return err < 0 ? rc : pending > 0 || failures ? CK_EXIT_FAILED : CK_EXIT_OK;
}

static int cmd_replay(struct opts *o, int argc, char **argv)
{
    if (argc < 1 || argc > 2)
        return ck_cli_usage_error("hooks", "replay takes an event ID and an optional DIR");
    struct dir_ctx d;
    int rc = open_dir(&d, o, argc > 1 ? argv[1] : ".", "hooks");
    if (rc) {
        close_dir(&d);
        return rc;
    }
    size_t n = 0, delivered = 0;
    int64_t pending = 0;
    int err = ck_outbox_replay(d.st.db, argv[0], unix_ms(), &n);
    if (err == 0 && n == 0)
        err = ck_error(CK_ENOENT, "event '%s' went to no webhook: nothing to replay", argv[0]);
    if (err == 0)
        err = deliver(&d, 0, &delivered, &pending);
    if (err < 0) {
        rc = ck_cli_fail("hooks", err);
    } else {
        printf("replayed %s: %zu deliver%s, %zu accepted, %lld pending\n", argv[0], n,
               n == 1 ? "y" : "ies", delivered, (long long)pending);
        rc = delivered == n ? CK_EXIT_OK : CK_EXIT_FAILED;
    }
    close_dir(&d);
    return rc;
}

static int cmd_status(struct opts *o, int argc, char **argv)
{
    if (argc > 1)
        return ck_cli_usage_error("hooks", "status takes an optional DIR");
    struct dir_ctx d;
    int rc = open_dir(&d, o, argc ? argv[0] : ".", "hooks");
    if (rc) {
        close_dir(&d);
        return rc;
    }
    struct ck_buf b = CK_BUF_INIT;
    struct ck_json j;
    ck_json_init(&j, &b, true);
    ck_json_begin_object(&j);
    int err = ck_hooks_status_json(d.hooks, d.st.db, &j);
    ck_json_end_object(&j);
    if (err == 0)
        err = ck_json_error(&j);
    if (err < 0)
        rc = ck_cli_fail("hooks", err);
    else
        printf("%s\n", ck_buf_str(&b));
    ck_buf_release(&b);
    close_dir(&d);
    return rc;
}

int ck_cmd_hooks(int argc, char **argv)
{
    static const struct option longopts[] = {
        CK_CLI_LONGOPTS,
        {"secret", required_argument, NULL, 's'},
        {"timeout", required_argument, NULL, 't'},
        {"set", required_argument, NULL, OPT_SET},
        {"wait", required_argument, NULL, 'w'},
        {NULL, 0, NULL, 0},
    };
    struct opts o;
    char *ops[8];
    int opt, rc, nops = 0;
    memset(&o, 0, sizeof o);
    ck_cli_init(&o.cli);
    optind = 1;
    /* options may follow the subcommand and its operands */
    while ((opt = getopt_long(argc, argv, "-c:vqhs:t:w:", longopts, NULL)) != -1) {
        if (opt == 1) { /* an operand ("-" mode keeps them in order among options) */
            if (nops == (int)(sizeof ops / sizeof *ops))
                return ck_cli_usage_error("hooks", "too many arguments");
            ops[nops++] = optarg;
            continue;
        }
        if ((rc = ck_cli_common(&o.cli, "hooks", opt, optarg)) != 0) {
            if (rc != 1)
                return rc;
            continue;
        }
        switch (opt) {
        case 's':
            if (o.nsecrets == sizeof o.secrets / sizeof *o.secrets)
                return ck_cli_usage_error("hooks", "too many --secret");
            if (ck_secret_check_ref(optarg) < 0)
                return ck_cli_usage_error("hooks", "--secret: %s", ck_error_msg());
            o.secrets[o.nsecrets++] = optarg;
            break;
        case 't':
        case 'w':
            if (ck_parse_duration(optarg, opt == 't' ? &o.timeout : &o.wait) < 0)
                return ck_cli_usage_error("hooks", "%s", ck_error_msg());
            break;
        case OPT_SET:
            if (o.nsets == sizeof o.sets / sizeof *o.sets)
                return ck_cli_usage_error("hooks", "too many --set");
            o.sets[o.nsets++] = optarg;
            break;
        }
    }
    if (o.cli.help) {
        fputs(help, stdout);
        return CK_EXIT_OK;
    }
    if (nops == 0)
        return ck_cli_usage_error("hooks", "expected test, emit, deliver, replay or status");
    static const struct {
        const char *name;
        int (*run)(struct opts *o, int argc, char **argv);
    } subs[] = {{"test", cmd_test},
                {"emit", cmd_emit},
                {"deliver", cmd_deliver},
                {"replay", cmd_replay},
                {"status", cmd_status}};
    for (size_t i = 0; i < sizeof subs / sizeof *subs; i++)
        if (!strcmp(ops[0], subs[i].name))
            return subs[i].run(&o, nops - 1, ops + 1);
    return ck_cli_usage_error("hooks", "'%s' is not test, emit, deliver, replay or status", ops[0]);
}
