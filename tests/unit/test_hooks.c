/* hooks/: signing, secrets, URLs, backoff, templates, events, the outbox, exec hooks. */
#include "test_main.h"

#include "common/buf.h"
#include "common/error.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "hooks/event.h"
#include "hooks/exec.h"
#include "hooks/hooks.h"
#include "hooks/outbox.h"
#include "hooks/template.h"
#include "hooks/webhook.h"

#include <sqlite3.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* The published example of the Standard Webhooks reference libraries
 * (standard-webhooks/standard-webhooks, libraries/javascript/src/webhook.test.ts,
 * "sign function works"). */
static void sign_standard_webhooks_vector(void **state)
{
    struct ck_webhook_key k;
    assert_int_equal(ck_webhook_key_decode("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "t", &k), 0);
    assert_int_equal(k.len, 24);
    struct ck_buf b = CK_BUF_INIT;
    const char *body = "{\"test\": 2432232314}";
    assert_int_equal(
        ck_webhook_sign(&k, 1, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body, strlen(body), &b),
        0);
    assert_string_equal(ck_buf_str(&b), "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    ck_buf_release(&b);
}

static void sign_with_two_keys_gives_two_signatures(void **state)
{
    struct ck_webhook_key k[2];
    assert_int_equal(ck_webhook_key_decode("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "t", &k[0]),
                     0);
    /* 32 bytes 0x00..0x1f */
    assert_int_equal(
        ck_webhook_key_decode("whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=", "t", &k[1]), 0);
    assert_int_equal(k[1].len, 32);
    assert_int_equal(k[1].bytes[31], 0x1f);
    struct ck_buf b = CK_BUF_INIT;
    const char *body = "{\"test\": 2432232314}";
    assert_int_equal(
        ck_webhook_sign(k, 2, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body, strlen(body), &b),
        0);
    const char *s = ck_buf_str(&b);
    assert_true(!strncmp(s, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1,", 51));
    assert_int_equal(strlen(s), 51 + 44);
    assert_null(strchr(s + 51, ' '));
    ck_buf_release(&b);
}

static void bad_secrets_are_refused_without_the_value(void **state)
{
    struct ck_webhook_key k;
    static const char *bad[] = {
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",       /* no prefix */
        "whsec_",                                 /* empty */
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS",  /* not a multiple of 4 */
        "whsec_MfKQ9r8GKYqrTwjU*D8ILPZIo2LaLaSw", /* not base64 */
        "whsec_c2hvcnQ=",                         /* 5 bytes: too short */
        "whsec_Mf=Q9r8GKYqrTwjUPD8ILPZIo2LaLaSw", /* padding inside */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(ck_webhook_key_decode(bad[i], "hooks.webhooks[0].secret", &k), CK_ECONFIG);
        assert_non_null(strstr(ck_error_msg(), "hooks.webhooks[0].secret"));
        if (strlen(bad[i]) > 10)
            assert_null(strstr(ck_error_msg(), bad[i] + 6));
    }
}

static void urls_are_checked(void **state)
{
    assert_int_equal(ck_webhook_check_url("https://hooks.example.com/a/b?c=1", "u"), 0);
    assert_int_equal(ck_webhook_check_url("http://127.0.0.1:8080/", "u"), 0);
    static const char *bad[] = {"ftp://x/",          "hooks.example.com/x",   "https://",
                                "http://a b/",       "https://user:pw@host/", "",
                                "file:///etc/passwd"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(ck_webhook_check_url(bad[i], "hooks.webhooks[2].url"), CK_ECONFIG);
    /* the message names the key and never the URL, which may be a secret */
    ck_webhook_check_url("https://user:hunter2@host/", "hooks.webhooks[2].url");
    assert_non_null(strstr(ck_error_msg(), "hooks.webhooks[2].url"));
    assert_null(strstr(ck_error_msg(), "hunter2"));
    char shown[128];
    ck_webhook_redact_url("https://hooks.slack.com:443/services/T000/B000/XXXX", shown,
                          sizeof shown);
    assert_string_equal(shown, "https://hooks.slack.com:443");
    ck_webhook_redact_url("http://127.0.0.1/x/secret-token", shown, sizeof shown);
    assert_string_equal(shown, "http://127.0.0.1");
}

static void backoff_schedule(void **state)
{
    const struct ck_backoff *b = &ck_backoff_default;
    /* the delays with no jitter (u = 0.5 gives factor 1.0) */
    static const int64_t want_s[] = {5, 30, 120, 600, 1800, 3600, 7200, 14400, 21600, 28800};
    int64_t total = 0;
    assert_int_equal(b->n, 10);
    for (int a = 1; a <= 10; a++) {
        assert_int_equal(ck_backoff_delay_ms(b, a, 0.5), want_s[a - 1] * 1000);
        /* jitter stays within +-20% */
        assert_true(ck_backoff_delay_ms(b, a, 0.0) >= want_s[a - 1] * 800);
        assert_true(ck_backoff_delay_ms(b, a, 0.999999) < want_s[a - 1] * 1200);
        total += want_s[a - 1];
    }
    /* a long schedule: about a day, not forever */
    assert_true(total > 20 * 3600 && total < 26 * 3600);
    assert_int_equal(ck_backoff_delay_ms(b, 11, 0.5), -1);
    assert_int_equal(ck_backoff_delay_ms(b, 0, 0.5), -1);
}

static void event_json_and_fields(void **state)
{
    struct ck_event ev;
    assert_int_equal(ck_event_init(&ev, CK_EV_CHECKPOINT_REGISTERED), 0);
    assert_true(!strncmp(ev.id, "evt_", 4));
    assert_int_equal(strlen(ev.id), 30);
    struct ck_event ev2;
    ck_event_init(&ev2, CK_EV_CHECKPOINT_REGISTERED);
    assert_string_not_equal(ev.id, ev2.id);
    ev.time_ms = 1700000000123LL;
    ev.model_name = "resnet \"small\"";
    ev.checkpoint = "e3";
    ev.epoch = 3;
    ev.md5 = "0123456789abcdef0123456789abcdef";
    struct ck_buf b = CK_BUF_INIT;
    assert_int_equal(ck_event_json(&ev, &b), 0);
    char want[512];
    snprintf(want, sizeof want,
             "{\"type\":\"checkpoint.registered\",\"id\":\"%s\","
             "\"timestamp\":\"2023-11-14T22:13:20.123Z\",\"data\":{\"model\":{\"name\":"
             "\"resnet \\\"small\\\"\"},\"checkpoint\":{\"reference\":\"e3\",\"epoch\":3,"
             "\"md5\":\"0123456789abcdef0123456789abcdef\"}}}",
             ev.id);
    assert_string_equal(ck_buf_str(&b), want);
    ck_buf_reset(&b);
    assert_int_equal(ck_event_field(&ev, "epoch", &b), 1);
    assert_string_equal(ck_buf_str(&b), "3");
    ck_buf_reset(&b);
    assert_int_equal(ck_event_field(&ev, "sha256", &b), 0);
    assert_int_equal(ck_event_field(&ev, "nope", &b), CK_ENOENT);
    ck_buf_release(&b);

    char **env = NULL;
    size_t n = 0;
    assert_int_equal(ck_event_env(&ev, &env, &n), 0);
    bool saw_event = false, saw_epoch = false, saw_sha = false;
    for (size_t i = 0; i < n; i++) {
        saw_event |= !strcmp(env[i], "CKPTD_EVENT=checkpoint.registered");
        saw_epoch |= !strcmp(env[i], "CKPTD_EPOCH=3");
        saw_sha |= !strncmp(env[i], "CKPTD_SHA256=", 13);
    }
    assert_null(env[n]);
    assert_true(saw_event && saw_epoch && !saw_sha);
    ck_event_env_free(env, n);

    assert_int_equal(ck_event_type_parse("training.finished"), CK_EV_TRAINING_FINISHED);
    assert_int_equal(ck_event_type_parse("training.done"), -1);
    assert_true(ck_event_filter_is_valid("upload.*"));
    assert_true(ck_event_filter_is_valid("*"));
    assert_false(ck_event_filter_is_valid("uploads.*"));
    assert_true(ck_event_filter_matches("upload.*", "upload.failed"));
    assert_false(ck_event_filter_matches("upload.*", "training.failed"));
}

static void template_escapes_values(void **state)
{
    struct ck_event ev;
    ck_event_init(&ev, CK_EV_TRAINING_FAILED);
    ev.model_name = "m\"x\\y\nz";
    ev.error = "exit 3\t<oops>";
    const char *tpl = "{\"text\": \"{{ type }}: {{model_name}} ({{error}}) {{checkpoint}}.\"}";
    assert_int_equal(ck_template_check("t.json", tpl), 0);
    struct ck_buf b = CK_BUF_INIT;
    assert_int_equal(ck_template_render(tpl, &ev, &b), 0);
    assert_string_equal(ck_buf_str(&b),
                        "{\"text\": \"training.failed: m\\\"x\\\\y\\nz (exit 3\\t<oops>) .\"}");
    ck_buf_release(&b);
    assert_int_equal(ck_template_check("t.json", "{\"a\": \"{{model}}\"}"), CK_ECONFIG);
    assert_non_null(strstr(ck_error_msg(), "'model' is not an event field"));
    assert_int_equal(ck_template_check("t.json", "{\n\"a\": \"{{model_name\"}"), CK_ECONFIG);
    assert_non_null(strstr(ck_error_msg(), "line 2"));
}

static sqlite3 *open_db(void)
{
    char dir[4096], path[4200];
    sqlite3 *db;
    ck_test_tmpdir(dir, "outbox");
    snprintf(path, sizeof path, "%s/state.db", dir);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "PRAGMA foreign_keys=ON", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(ck_outbox_init(db), 0);
    assert_int_equal(ck_outbox_init(db), 0); /* idempotent */
    return db;
}

static void outbox_transitions(void **state)
{
    sqlite3 *db = open_db();
    const char *hooks[] = {"wh_a", "wh_b"};
    const char *bodies[] = {NULL, "{\"text\":\"hi\"}"};
    int64_t t0 = 1000000;
    assert_int_equal(
        ck_outbox_add(db, "evt_1", "checkpoint.registered", t0, "{\"p\":1}", hooks, bodies, 2, t0),
        0);
    assert_int_equal(
        ck_outbox_add(db, "evt_1", "checkpoint.registered", t0, "{}", hooks, NULL, 1, t0),
        CK_EEXIST);
    int64_t v;
    assert_int_equal(ck_outbox_pending(db, &v), 0);
    assert_int_equal(v, 2);

    struct ck_outbox_item *it;
    size_t n;
    assert_int_equal(ck_outbox_due(db, t0 - 1, 10, &it, &n), 0);
    assert_int_equal(n, 0);
    ck_outbox_items_free(it, n);
    assert_int_equal(ck_outbox_due(db, t0, 10, &it, &n), 0);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(it[i].body,
                            !strcmp(it[i].hook, "wh_a") ? "{\"p\":1}" : "{\"text\":\"hi\"}");
    ck_outbox_items_free(it, n);

    /* a claim is exclusive */
    bool claimed;
    assert_int_equal(ck_outbox_claim(db, "evt_1", "wh_a", t0, t0 + 5000, &claimed), 0);
    assert_true(claimed);
    assert_int_equal(ck_outbox_claim(db, "evt_1", "wh_a", t0, t0 + 5000, &claimed), 0);
    assert_false(claimed);

    /* wh_a delivered; wh_b fails through a two-step schedule and is given up */
    assert_int_equal(ck_outbox_mark_delivered(db, "evt_1", "wh_a", 200, t0 + 10), 0);
    static const double delays[] = {1, 10};
    struct ck_backoff b = {delays, 2};
    bool gave_up;
    assert_int_equal(
        ck_outbox_mark_failed(db, "evt_1", "wh_b", 500, "HTTP 500", &b, 0.5, t0, &gave_up), 0);
    assert_false(gave_up);
    assert_int_equal(ck_outbox_next_due(db, &v), 0);
    assert_int_equal(v, t0 + 1000);
    assert_int_equal(
        ck_outbox_mark_failed(db, "evt_1", "wh_b", 503, "HTTP 503", &b, 0.5, t0 + 1000, &gave_up),
        0);
    assert_false(gave_up);
    assert_int_equal(ck_outbox_next_due(db, &v), 0);
    assert_int_equal(v, t0 + 11000);
    assert_int_equal(
        ck_outbox_mark_failed(db, "evt_1", "wh_b", 0, "refused", &b, 0.5, t0 + 11000, &gave_up), 0);
    assert_true(gave_up);
    assert_int_equal(ck_outbox_pending(db, &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(ck_outbox_next_due(db, &v), 0);
    assert_int_equal(v, -1);

    /* replay: both deliveries pending again with attempts reset */
    size_t nr;
    assert_int_equal(ck_outbox_replay(db, "evt_1", t0 + 20000, &nr), 0);
    assert_int_equal(nr, 2);
    assert_int_equal(ck_outbox_due(db, t0 + 20000, 10, &it, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(it[0].attempts + it[1].attempts, 0);
    ck_outbox_items_free(it, n);
    assert_int_equal(ck_outbox_replay(db, "evt_nope", t0, &nr), CK_ENOENT);

    /* prune keeps events with pending deliveries */
    assert_int_equal(ck_outbox_prune(db, t0 + 1000000), 0);
    char *type, *payload;
    assert_int_equal(ck_outbox_event(db, "evt_1", &type, &payload), 0);
    assert_string_equal(type, "checkpoint.registered");
    free(type);
    free(payload);
    assert_int_equal(ck_outbox_mark_delivered(db, "evt_1", "wh_a", 200, t0 + 30000), 0);
    assert_int_equal(ck_outbox_mark_delivered(db, "evt_1", "wh_b", 200, t0 + 30000), 0);
    assert_int_equal(ck_outbox_prune(db, t0 + 1000000), 0);
    assert_int_equal(ck_outbox_event(db, "evt_1", &type, &payload), CK_ENOENT);
    sqlite3_close(db);
}

static void receiver_marked_failing_then_recovers(void **state)
{
    sqlite3 *db = open_db();
    int tr;
    bool failing;
    for (int i = 1; i <= 2; i++) {
        assert_int_equal(ck_outbox_receiver_update(db, "wh_x", false, "HTTP 500", 3, i, &tr), 0);
        assert_int_equal(tr, 0);
    }
    assert_int_equal(ck_outbox_receiver_update(db, "wh_x", false, "HTTP 500", 3, 3, &tr), 0);
    assert_int_equal(tr, 1);
    assert_int_equal(ck_outbox_receiver_failing(db, "wh_x", &failing), 0);
    assert_true(failing);
    assert_int_equal(ck_outbox_receiver_update(db, "wh_x", false, "HTTP 500", 3, 4, &tr), 0);
    assert_int_equal(tr, 0); /* reported once, not on every failure */
    int64_t n;
    assert_int_equal(ck_outbox_failing_count(db, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ck_outbox_receiver_update(db, "wh_x", true, NULL, 3, 5, &tr), 0);
    assert_int_equal(tr, -1);
    assert_int_equal(ck_outbox_failing_count(db, &n), 0);
    assert_int_equal(n, 0);
    sqlite3_close(db);
}

static void exec_gets_env_and_stdin(void **state)
{
    char dir[4096], out[4200];
    ck_test_tmpdir(dir, "exec");
    snprintf(out, sizeof out, "%s/out", dir);
    char script[9000];
    snprintf(script, sizeof script, "printf '%%s|' \"$CKPTD_EVENT\" > '%s'; cat >> '%s'; exit 0",
             out, out);
    char *argv[] = {"/bin/sh", "-c", script, NULL};
    char *envp[] = {"CKPTD_EVENT=checkpoint.registered", "PATH=/usr/bin:/bin", NULL};
    struct ck_exec *x;
    const char *json = "{\"type\":\"checkpoint.registered\"}";
    assert_int_equal(ck_exec_start("t", argv, envp, json, strlen(json), 30, &x), 0);
    ck_exec_wait(x);
    const struct ck_exec_result *r = ck_exec_result(x);
    assert_true(r->exited);
    assert_int_equal(r->exit_code, 0);
    assert_false(r->timed_out);
    ck_exec_free(x);
    struct ck_buf b = CK_BUF_INIT;
    FILE *f = fopen(out, "r");
    assert_non_null(f);
    char line[256] = "";
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    assert_string_equal(line, "checkpoint.registered|{\"type\":\"checkpoint.registered\"}");
    ck_buf_release(&b);
}

static void exec_failure_is_reported(void **state)
{
    char *argv[] = {"/bin/sh", "-c", "echo failing on purpose; exit 7", NULL};
    char *envp[] = {NULL};
    struct ck_exec *x;
    assert_int_equal(ck_exec_start("t", argv, envp, "", 0, 30, &x), 0);
    ck_exec_wait(x);
    assert_true(ck_exec_result(x)->exited);
    assert_int_equal(ck_exec_result(x)->exit_code, 7);
    ck_exec_free(x);
    /* a command that does not exist is an error at start, not a hang */
    char *argv2[] = {"/nonexistent/ckptd-hook", NULL};
    assert_true(ck_exec_start("t", argv2, envp, "", 0, 30, &x) < 0);
}

static void exec_hanging_is_killed_with_its_children(void **state)
{
    char dir[4096], pidfile[4200], script[4400];
    ck_test_tmpdir(dir, "exec");
    snprintf(pidfile, sizeof pidfile, "%s/child.pid", dir);
    /* ignores SIGTERM, and leaves a grandchild that would hold the pipe open */
    snprintf(script, sizeof script,
             "trap '' TERM; sleep 300 & echo $! > '%s'; while :; do sleep 1; done", pidfile);
    char *argv[] = {"/bin/sh", "-c", script, NULL};
    char *envp[] = {"PATH=/usr/bin:/bin", NULL};
    struct ck_exec *x;
    assert_int_equal(ck_exec_start("t", argv, envp, "", 0, 0.3, &x), 0);
    ck_exec_wait(x); /* bounded: timeout + grace */
    const struct ck_exec_result *r = ck_exec_result(x);
    assert_true(r->timed_out);
    assert_false(r->exited);
    assert_int_equal(r->signal, SIGKILL);
    ck_exec_free(x);
    FILE *f = fopen(pidfile, "r");
    assert_non_null(f);
    int pid = 0;
    assert_int_equal(fscanf(f, "%d", &pid), 1);
    fclose(f);
    /* the grandchild went with the group (give the kernel a moment to deliver) */
    bool gone = false;
    for (int i = 0; i < 100 && !gone; i++) {
        char path[64], st[512] = "";
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        FILE *s = fopen(path, "r");
        gone = !s || (fgets(st, sizeof st, s) && strstr(st, ") Z "));
        if (s)
            fclose(s);
        if (!gone)
            usleep(20000);
    }
    assert_true(gone);
}

static void hooks_new_rejects_bad_secret_value(void **state)
{
    struct ck_webhook_conf w = {0};
    char *secrets[] = {"env:CK_TEST_BAD_SECRET"};
    w.url = "http://127.0.0.1:9/";
    w.secrets = secrets;
    w.nsecrets = 1;
    w.line = 7;
    struct ck_hooks_conf c = {0};
    c.webhooks = &w;
    c.nwebhooks = 1;
    struct ck_hooks *h;
    setenv("CK_TEST_BAD_SECRET", "not-a-whsec-secret-value", 1);
    assert_int_equal(ck_hooks_new(&c, "ckptd.yaml", &h), CK_ECONFIG);
    assert_non_null(strstr(ck_error_msg(), "line 7"));
    assert_non_null(strstr(ck_error_msg(), "hooks.webhooks[0].secret"));
    assert_null(strstr(ck_error_msg(), "not-a-whsec"));
    unsetenv("CK_TEST_BAD_SECRET");
    assert_int_equal(ck_hooks_new(&c, "ckptd.yaml", &h), CK_ECONFIG);
    assert_non_null(strstr(ck_error_msg(), "not set"));
    setenv("CK_TEST_BAD_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", 1);
    assert_int_equal(ck_hooks_new(&c, "ckptd.yaml", &h), 0);
    assert_int_equal(ck_hooks_webhook_count(h), 1);
    ck_hooks_free(h);
    w.url = "https://x y/";
    assert_int_equal(ck_hooks_new(&c, "ckptd.yaml", &h), CK_ECONFIG);
    assert_non_null(strstr(ck_error_msg(), "hooks.webhooks[0].url"));
}

/* The receiver of tests/lib, started as a process; returns its pid. */
static pid_t start_receiver(const char *dir, int *port, const char *slow, char *log, size_t logsz)
{
    char script[4096], portstr[16];
    snprintf(script, sizeof script, "%s", __FILE__);
    char *slash = strrchr(script, '/');
    snprintf(slash ? slash + 1 : script, sizeof script - (size_t)(slash ? slash + 1 - script : 0),
             "../lib/webhook_receiver.py");
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    getsockname(fd, (struct sockaddr *)&a, &al);
    close(fd);
    *port = ntohs(a.sin_port);
    snprintf(portstr, sizeof portstr, "%d", *port);
    snprintf(log, logsz, "%s/receiver.jsonl", dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/usr/bin/python3", "python3", script, portstr, log, "--slow", slow, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 400; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        int ok = connect(c, (struct sockaddr *)&a, sizeof a) == 0;
        close(c);
        if (ok)
            return pid;
        usleep(50000);
    }
    fail_msg("the webhook receiver did not start");
    return -1;
}

static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = 0, c;
    if (!f)
        return 0;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

static void count_wake(void *arg)
{
    ++*(int *)arg;
}

/* The watcher's webhook helper: emit wakes it, a round delivers what is due
 * and says when the next delivery is due. */
static void deliver_round_and_waker(void **state)
{
    char dir[4096], db_path[4200], log[4200], url[128];
    int port;
    (void)state;
    ck_test_tmpdir(dir, "delivery");
    pid_t rpid = start_receiver(dir, &port, "0", log, sizeof log);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/hook", port);
    snprintf(db_path, sizeof db_path, "%s/state.db", dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(db_path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    assert_int_equal(sqlite3_exec(db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(ck_outbox_init(db), 0);

    struct ck_webhook_conf w = {0};
    w.url = url;
    w.timeout = 60;
    struct ck_hooks_conf c = {0};
    c.webhooks = &w;
    c.nwebhooks = 1;
    struct ck_hooks *h;
    int wakes = 0;
    assert_int_equal(ck_hooks_new(&c, "test", &h), 0);
    ck_hooks_set_waker(h, count_wake, &wakes);

    struct ck_event ev1, ev2, ev3;
    ck_event_init(&ev1, CK_EV_CHECKPOINT_REGISTERED);
    ck_event_init(&ev2, CK_EV_CHECKPOINT_REGISTERED);
    ck_event_init(&ev3, CK_EV_CHECKPOINT_REGISTERED);
    assert_int_equal(ck_hooks_emit(h, db, &ev1), 0);
    assert_int_equal(ck_hooks_emit(h, db, &ev2), 0);
    assert_int_equal(wakes, 2);
    assert_int_equal(count_lines(log), 0); /* emit itself sends nothing */

    atomic_bool abort_flag = false;
    double again = 99;
    assert_int_equal(ck_hooks_deliver_round(h, db, ck_mono_ms() + 60000, &abort_flag, &again), 0);
    assert_int_equal(count_lines(log), 2);
    int64_t pending;
    assert_int_equal(ck_outbox_pending(db, &pending), 0);
    assert_int_equal(pending, 0);
    assert_true(again < 0); /* nothing left */

    /* stopped before it starts: nothing sent, and it says the rest is due now */
    assert_int_equal(ck_hooks_emit(h, db, &ev3), 0);
    atomic_store(&abort_flag, true);
    assert_int_equal(ck_hooks_deliver_round(h, db, ck_mono_ms() + 60000, &abort_flag, &again), 0);
    assert_int_equal(count_lines(log), 2);
    assert_int_equal(ck_outbox_pending(db, &pending), 0);
    assert_int_equal(pending, 1);
    assert_true(again >= 0 && again < 1);
    ck_hooks_free(h);
    sqlite3_close(db);
    kill(rpid, SIGTERM);
    waitpid(rpid, NULL, 0);
}

int main(int argc, char **argv);
static const struct CMUnitTest tests[] = {
    cmocka_unit_test(sign_standard_webhooks_vector),
    cmocka_unit_test(sign_with_two_keys_gives_two_signatures),
    cmocka_unit_test(bad_secrets_are_refused_without_the_value),
    cmocka_unit_test(urls_are_checked),
    cmocka_unit_test(backoff_schedule),
    cmocka_unit_test(event_json_and_fields),
    cmocka_unit_test(template_escapes_values),
    cmocka_unit_test(outbox_transitions),
    cmocka_unit_test(receiver_marked_failing_then_recovers),
    cmocka_unit_test(exec_gets_env_and_stdin),
    cmocka_unit_test(exec_failure_is_reported),
    cmocka_unit_test(exec_hanging_is_killed_with_its_children),
    cmocka_unit_test(hooks_new_rejects_bad_secret_value),
    cmocka_unit_test(deliver_round_and_waker),
};
CK_TEST_MAIN(tests)
