#include "hooks/hooks.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/text.h"
#include "common/metrics.h"
#include "common/secret.h"
#include "lazy/lazy.h"
#include "hooks/exec.h"
#include "hooks/outbox.h"
#include "hooks/template.h"
#include "hooks/webhook.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* Delivered and given-up events are kept this long for `ckptd hooks replay`. */
#define KEEP_DELIVERED_MS (7LL * 24 * 3600 * 1000)
/* An attempt is not started with less time than this left before the deadline. */
#define MIN_ATTEMPT_S 2.0
/* How many deliveries are read from the outbox at a time. */
#define DUE_BATCH 32

struct webhook {
    const struct ck_webhook_conf *conf;
    char *url;       /* owned, resolved (may be a secret: never logged) */
    char shown[256]; /* scheme://host:port, what logs show */
    char key[24];    /* outbox key */
    struct ck_webhook_key *keys;
    size_t nkeys;
    char *template; /* owned, or NULL */
    double timeout;
};

struct queued_exec {
    size_t conf; /* index into conf->execs */
    char *json;  /* owned */
    char **env;  /* owned, NULL-terminated */
    size_t nenv;
    char *name;  /* owned */
    char *run;   /* owned: "EVENT_ID HOOK_KEY", its row in exec_runs */
};

struct ck_hooks {
    const struct ck_hooks_conf *conf;
    struct webhook *hooks;
    size_t nhooks;
    struct ck_backoff backoff;
    int failing_after;
    char **hidden_env; /* names of the env vars holding our secrets: not passed to commands */
    size_t nhidden;
    struct ck_exec *running[CK_HOOKS_MAX_RUNNING];
    char *running_run[CK_HOOKS_MAX_RUNNING]; /* owned: their exec_runs rows */
    char **ended;  /* owned: rows of runs that ended, removed at the next flush */
    size_t nended;
    bool recovered; /* what an earlier process left in exec_runs was looked at */
    struct queued_exec *queue;
    size_t nqueue;
    sqlite3 *outbox_db; /* the database whose outbox tables are known to exist */
    /* called when ck_hooks_emit stored a delivery (ck_hooks_set_waker) */
    void (*waker)(void *arg);
    void *waker_arg;
    size_t failures; /* deliveries given up by this process (ck_hooks_failures) */
};

void ck_hooks_key(const char *url, char *out, size_t outsz)
{
    struct ck_digests d;
    struct ck_hash_ctx *c = ck_hash_ctx_new(CK_HASH_SHA256);
    if (!c) {
        snprintf(out, outsz, "wh_unknown");
        return;
    }
    ck_hash_ctx_update(c, url, strlen(url));
    ck_hash_ctx_final(c, &d);
    ck_hash_ctx_free(c);
    snprintf(out, outsz, "wh_%.16s", d.sha256);
}

static void free_strv(char **v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

void ck_hooks_conf_release(struct ck_hooks_conf *c)
{
    for (size_t i = 0; i < c->nwebhooks; i++) {
        struct ck_webhook_conf *w = &c->webhooks[i];
        free(w->url);
        free_strv(w->secrets, w->nsecrets);
        free_strv(w->events, w->nevents);
        free(w->template_path);
    }
    free(c->webhooks);
    for (size_t i = 0; i < c->nexecs; i++) {
        free(c->execs[i].event);
        free_strv(c->execs[i].argv, c->execs[i].argc);
        free_strv(c->execs[i].env, c->execs[i].nenv);
    }
    free_strv(c->secret_env, c->nsecret_env);
    free(c->execs);
    free(c->retry_schedule);
    memset(c, 0, sizeof *c);
}

static bool is_secret_ref(const char *s)
{
    return !strncmp(s, "env:", 4) || !strncmp(s, "file:", 5);
}

int ck_hooks_conf_check(const struct ck_hooks_conf *c, const char *cfg)
{
    char what[512];
    int err;
    for (size_t i = 0; i < c->nwebhooks; i++) {
        const struct ck_webhook_conf *w = &c->webhooks[i];
        snprintf(what, sizeof what, "'%s' line %d: 'hooks.webhooks[%zu].url'", cfg, w->line, i);
        if (!w->url || !*w->url)
            return ck_error(CK_ECONFIG, "%s is missing", what);
        if (is_secret_ref(w->url)) {
            if ((err = ck_secret_check_ref(w->url)) < 0)
                return ck_error_wrap(err, "%s", what);
        } else if ((err = ck_webhook_check_url(w->url, what)) < 0) {
            return err;
        }
        for (size_t k = 0; k < w->nsecrets; k++)
            if ((err = ck_secret_check_ref(w->secrets[k])) < 0)
                return ck_error_wrap(err, "'%s' line %d: 'hooks.webhooks[%zu].secret'", cfg,
                                     w->line, i);
        for (size_t k = 0; k < w->nevents; k++)
            if (!ck_event_filter_is_valid(w->events[k]))
                return ck_error(CK_ECONFIG,
                                "'%s' line %d: 'hooks.webhooks[%zu].events': '%s' matches no event "
                                "type (docs/hooks.md, \"Events\")",
                                cfg, w->line, i, w->events[k]);
        if (w->timeout < 0)
            return ck_error(CK_ECONFIG, "'%s' line %d: 'hooks.webhooks[%zu].timeout' is negative",
                            cfg, w->line, i);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(c->webhooks[j].url, w->url))
                return ck_error(CK_ECONFIG,
                                "'%s' line %d: 'hooks.webhooks[%zu].url' is the same as "
                                "hooks.webhooks[%zu]: give one hook several event filters instead",
                                cfg, w->line, i, j);
    }
    for (size_t i = 0; i < c->nexecs; i++) {
        const struct ck_exec_conf *e = &c->execs[i];
        if (!e->event || !ck_event_filter_is_valid(e->event))
            return ck_error(CK_ECONFIG,
                            "'%s' line %d: 'hooks.exec[%zu].event': '%s' matches no event type",
                            cfg, e->line, i, e->event ? e->event : "");
        if (e->argc == 0 || !e->argv[0][0])
            return ck_error(CK_ECONFIG, "'%s' line %d: 'hooks.exec[%zu].command' is empty", cfg,
                            e->line, i);
    }
    for (size_t i = 0; i < c->nretry; i++)
        if (c->retry_schedule[i] < 0)
            return ck_error(CK_ECONFIG, "'%s': 'hooks.retry_schedule' has a negative delay", cfg);
    return 0;
}

static int add_hidden(struct ck_hooks *h, const char *ref)
{
    if (strncmp(ref, "env:", 4) != 0)
        return 0;
    char **p = realloc(h->hidden_env, (h->nhidden + 1) * sizeof *p);
    if (!p)
        return ck_error(CK_ENOMEM, "out of memory");
    h->hidden_env = p;
    if (!(p[h->nhidden] = strdup(ref + 4)))
        return ck_error(CK_ENOMEM, "out of memory");
    h->nhidden++;
    return 0;
}

/* Resolves a URL given literally or as a secret reference into *out (owned). */
static int resolve_url(const char *url_or_ref, const char *what, char **out)
{
    int err;
    if (!is_secret_ref(url_or_ref)) {
        if ((err = ck_webhook_check_url(url_or_ref, what)) < 0)
            return err;
        *out = strdup(url_or_ref);
        return *out ? 0 : ck_error(CK_ENOMEM, "out of memory");
    }
    if ((err = ck_secret_load(url_or_ref, out)) < 0)
        return ck_error_wrap(err, "%s", what);
    if ((err = ck_webhook_check_url(*out, what)) < 0) {
        ck_secret_free(*out);
        *out = NULL;
    }
    return err;
}

/* Loads and decodes secret references into keys (owned, *n of them). */
static int load_keys(char *const *refs, size_t nrefs, const char *what,
                     struct ck_webhook_key **keys, size_t *n)
{
    int err = 0;
    *n = 0;
    *keys = calloc(nrefs ? nrefs : 1, sizeof **keys);
    if (!*keys)
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t k = 0; k < nrefs; k++) {
        char *secret = NULL;
        if ((err = ck_secret_load(refs[k], &secret)) < 0)
            return ck_error_wrap(err, "%s", what);
        err = ck_webhook_key_decode(secret, what, &(*keys)[k]);
        ck_secret_free(secret);
        if (err < 0)
            return err;
        ++*n;
    }
    return 0;
}

static int setup_webhook(struct ck_hooks *h, size_t i, const char *cfg)
{
    const struct ck_webhook_conf *c = &h->conf->webhooks[i];
    struct webhook *w = &h->hooks[i];
    char what[512];
    int err;
    w->conf = c;
    w->timeout = c->timeout > 0 ? c->timeout : CK_HOOKS_WEBHOOK_TIMEOUT_S;
    snprintf(what, sizeof what, "'%s' line %d: 'hooks.webhooks[%zu].url'", cfg, c->line, i);
    if ((err = resolve_url(c->url, what, &w->url)) < 0)
        return err;
    ck_webhook_redact_url(w->url, w->shown, sizeof w->shown);
    ck_hooks_key(w->url, w->key, sizeof w->key);
    if ((err = add_hidden(h, c->url)) < 0)
        return err;
    snprintf(what, sizeof what, "'%s' line %d: 'hooks.webhooks[%zu].secret'", cfg, c->line, i);
    if ((err = load_keys(c->secrets, c->nsecrets, what, &w->keys, &w->nkeys)) < 0)
        return err;
    for (size_t k = 0; k < c->nsecrets; k++)
        if ((err = add_hidden(h, c->secrets[k])) < 0)
            return err;
    if (c->template_path) {
        struct ck_buf b = CK_BUF_INIT;
        if ((err = ck_read_file(c->template_path, CK_TEMPLATE_MAX, &b)) < 0) {
            ck_buf_release(&b);
            return ck_error_wrap(err, "'%s' line %d: 'hooks.webhooks[%zu].template'", cfg, c->line,
                                 i);
        }
        w->template = ck_buf_detach(&b);
        if ((err = ck_template_check(c->template_path, w->template)) < 0)
            return ck_error_wrap(err, "'%s' line %d: 'hooks.webhooks[%zu].template'", cfg, c->line,
                                 i);
    }
    return 0;
}

int ck_hooks_new(const struct ck_hooks_conf *conf, const char *cfg, struct ck_hooks **out)
{
    int err;
    *out = NULL;
    if ((err = ck_hooks_conf_check(conf, cfg)) < 0)
        return err;
    struct ck_hooks *h = calloc(1, sizeof *h);
    if (!h)
        return ck_error(CK_ENOMEM, "out of memory");
    h->conf = conf;
    h->backoff = conf->retry_schedule ? (struct ck_backoff){conf->retry_schedule, conf->nretry}
                                      : ck_backoff_default;
    h->failing_after = conf->failing_after > 0 ? conf->failing_after : CK_HOOKS_FAILING_AFTER;
    if (conf->nwebhooks) {
        /* libcurl is loaded where a delivery is attempted, not here: the
         * watcher delivers in a helper process and stays small */
        if (!(h->hooks = calloc(conf->nwebhooks, sizeof *h->hooks))) {
            free(h);
            return ck_error(CK_ENOMEM, "out of memory");
        }
    }
    h->nhooks = conf->nwebhooks;
    for (size_t i = 0; i < conf->nsecret_env; i++) {
        char ref[512];
        snprintf(ref, sizeof ref, "env:%s", conf->secret_env[i]);
        if ((err = add_hidden(h, ref)) < 0) {
            ck_hooks_free(h);
            return err;
        }
    }
    for (size_t i = 0; i < conf->nwebhooks; i++)
        if ((err = setup_webhook(h, i, cfg)) < 0) {
            ck_hooks_free(h);
            return err;
        }
    *out = h;
    return 0;
}

static void queued_free(struct queued_exec *q)
{
    free(q->run);
    free(q->json);
    ck_event_env_free(q->env, q->nenv);
    free(q->name);
}

void ck_hooks_free(struct ck_hooks *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->nhooks; i++) {
        struct webhook *w = &h->hooks[i];
        if (w->url)
            ck_secret_free(w->url);
        for (size_t k = 0; k < w->nkeys; k++)
            ck_webhook_key_wipe(&w->keys[k]);
        free(w->keys);
        free(w->template);
    }
    free(h->hooks);
    for (size_t i = 0; i < CK_HOOKS_MAX_RUNNING; i++) {
        ck_exec_free(h->running[i]);
        free(h->running_run[i]);
    }
    free_strv(h->ended, h->nended);
    for (size_t i = 0; i < h->nqueue; i++)
        queued_free(&h->queue[i]);
    free(h->queue);
    free_strv(h->hidden_env, h->nhidden);
    free(h);
}

size_t ck_hooks_webhook_count(const struct ck_hooks *h)
{
    return h ? h->nhooks : 0;
}

static bool wants(char *const *filters, size_t n, const char *type)
{
    if (n == 0)
        return true;
    for (size_t i = 0; i < n; i++)
        if (ck_event_filter_matches(filters[i], type))
            return true;
    return false;
}

static int64_t now_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double uniform(void)
{
    uint32_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != sizeof r)
        r = (uint32_t)now_unix_ms() * 2654435761u;
    return (double)r / 4294967296.0;
}

/* --- exec hooks ---------------------------------------------------------- */

extern char **environ;

static bool hidden(const struct ck_hooks *h, const char *kv)
{
    for (size_t i = 0; i < h->nhidden; i++) {
        size_t n = strlen(h->hidden_env[i]);
        if (!strncmp(kv, h->hidden_env[i], n) && kv[n] == '=')
            return true;
    }
    return false;
}

/* Whether kv ("NAME=value") is named by the hook's env: allow-list. */
static bool allowed(const struct ck_exec_conf *x, const char *kv)
{
    if (!x->env)
        return true;
    for (size_t i = 0; i < x->nenv; i++) {
        size_t n = strlen(x->env[i]);
        if (!strncmp(kv, x->env[i], n) && kv[n] == '=')
            return true;
    }
    return false;
}

/* The command's environment: ours (only what its env: names, when it has
 * one) without the variables any of the config's secrets come from and
 * without stale CKPTD_* values, then the event's fields. */
static int build_env(const struct ck_hooks *h, const struct ck_exec_conf *x, const char *lines,
                     char ***env, size_t *n)
{
    int err;
    *env = NULL;
    *n = 0;
    for (char **e = environ; e && *e; e++) {
        if (hidden(h, *e) || !strncmp(*e, "CKPTD_", 6) || !allowed(x, *e))
            continue;
        char **p = realloc(*env, (*n + 2) * sizeof *p);
        if (!p)
            goto nomem;
        *env = p;
        if (!(p[*n] = strdup(*e)))
            goto nomem;
        p[++*n] = NULL;
    }
    (void)err;
    for (const char *p = lines; p && *p;) {
        size_t len = strcspn(p, "\n");
        char **e = realloc(*env, (*n + 2) * sizeof *e);
        if (!e)
            goto nomem;
        *env = e;
        if (!(e[*n] = strndup(p, len)))
            goto nomem;
        e[++*n] = NULL;
        p += len + (p[len] == '\n');
    }
    return 0;
nomem:
    ck_event_env_free(*env, *n);
    return ck_error(CK_ENOMEM, "out of memory");
}

/* A run ended (run owned, may be NULL): its row goes at the next flush. */
static void ended(struct ck_hooks *h, char *run)
{
    if (!run)
        return;
    char **p = realloc(h->ended, (h->nended + 1) * sizeof *p);
    if (!p) {
        free(run); /* the row stays: a restart runs it again (at least once) */
        return;
    }
    h->ended = p;
    h->ended[h->nended++] = run;
}

static void start_queued(struct ck_hooks *h)
{
    for (size_t slot = 0; slot < CK_HOOKS_MAX_RUNNING && h->nqueue > 0; slot++) {
        if (h->running[slot])
            continue;
        struct queued_exec q = h->queue[0];
        memmove(h->queue, h->queue + 1, (h->nqueue - 1) * sizeof *h->queue);
        h->nqueue--;
        const struct ck_exec_conf *c = &h->conf->execs[q.conf];
        char *shell_argv[] = {"/bin/sh", "-c", c->argv[0], NULL};
        double timeout = c->timeout > 0 ? c->timeout : CK_HOOKS_EXEC_TIMEOUT_S;
        int err = ck_exec_start(q.name, c->shell ? shell_argv : c->argv, q.env, q.json,
                                strlen(q.json), timeout, &h->running[slot]);
        if (err < 0) {
            ck_err("hook.exec.failed", "%s", ck_error_msg());
            ck_metrics_add(CK_M_EXEC_HOOKS_FAILED, 1);
            ck_metrics_add(CK_M_FAILURES_HOOK, 1);
            h->failures++;
            ended(h, q.run); /* it ran as far as it could: not again after a restart */
            q.run = NULL;
        } else {
            h->running_run[slot] = q.run;
            q.run = NULL;
        }
        queued_free(&q);
    }
}

/* The stable id of exec hook i: what a restart finds it by, whatever its
 * place in the config. */
static void exec_key(const struct ck_exec_conf *c, char *out, size_t outsz)
{
    struct ck_buf b = CK_BUF_INIT;
    ck_buf_puts(&b, c->event ? c->event : "*");
    for (size_t k = 0; k < c->argc; k++) {
        ck_buf_putc(&b, '\x1f');
        ck_buf_puts(&b, c->argv[k]);
    }
    char wh[64];
    ck_hooks_key(ck_buf_str(&b), wh, sizeof wh); /* "wh_" + 16 hex */
    snprintf(out, outsz, "ex_%s", wh + 3);
    ck_buf_release(&b);
}

/* Queues exec hook i for an event: env holds the event's CKPTD_* variables
 * (NAME=value a line), added to ours without our secrets' variables. */
static int queue_exec(struct ck_hooks *h, size_t i, const char *event_id, const char *type,
                      const char *json, const char *env_lines)
{
    char name[256], key[64];
    int err = 0;
    snprintf(name, sizeof name, "exec[%zu] %s", i, type);
    exec_key(&h->conf->execs[i], key, sizeof key);
    if (h->nqueue >= CK_HOOKS_MAX_QUEUED) {
        ck_err("hook.exec.dropped", "hook='%s' id=%s: %d hooks already waiting", name, event_id,
               CK_HOOKS_MAX_QUEUED);
        ck_metrics_add(CK_M_FAILURES_HOOK, 1);
        h->failures++;
        return 0;
    }
    struct queued_exec q = {i, strdup(json), NULL, 0, strdup(name), NULL};
    size_t rl = strlen(event_id) + strlen(key) + 2;
    if ((q.run = malloc(rl)))
        snprintf(q.run, rl, "%s %s", event_id, key);
    if (!q.json || !q.name || !q.run) {
        queued_free(&q);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    if ((err = build_env(h, &h->conf->execs[i], env_lines, &q.env, &q.nenv)) < 0) {
        queued_free(&q);
        return err;
    }
    struct queued_exec *p = realloc(h->queue, (h->nqueue + 1) * sizeof *p);
    if (!p) {
        queued_free(&q);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    h->queue = p;
    h->queue[h->nqueue++] = q;
    return 0;
}

static void reap(struct ck_hooks *h, size_t slot)
{
    struct ck_exec *x = h->running[slot];
    const struct ck_exec_result *r = ck_exec_result(x);
    if (r->timed_out) {
        ck_metrics_add(CK_M_EXEC_HOOKS_TIMED_OUT, 1);
        ck_metrics_add(CK_M_FAILURES_HOOK, 1);
        h->failures++;
        ck_err("hook.exec.timeout", "hook='%s' ended after %.1fs: it did not finish in time",
               ck_exec_name(x), r->seconds);
    } else if (r->exited && r->exit_code == 0) {
        ck_metrics_add(CK_M_EXEC_HOOKS_OK, 1);
        ck_info("hook.exec.done", "hook='%s' code=0 seconds=%.2f", ck_exec_name(x), r->seconds);
    } else {
        ck_metrics_add(CK_M_EXEC_HOOKS_FAILED, 1);
        ck_metrics_add(CK_M_FAILURES_HOOK, 1);
        h->failures++;
        if (r->exited)
            ck_err("hook.exec.failed", "hook='%s' code=%d seconds=%.2f", ck_exec_name(x),
                   r->exit_code, r->seconds);
        else
        {
            char sig[32];
            ck_err("hook.exec.failed", "hook='%s' signal=%s seconds=%.2f", ck_exec_name(x),
                   ck_signal_name(r->signal, sig, sizeof sig), r->seconds);
        }
    }
    ck_exec_free(x);
    h->running[slot] = NULL;
    ended(h, h->running_run[slot]);
    h->running_run[slot] = NULL;
}

void ck_hooks_step(struct ck_hooks *h)
{
    for (size_t i = 0; i < CK_HOOKS_MAX_RUNNING; i++)
        if (h->running[i] && ck_exec_step(h->running[i]))
            reap(h, i);
    start_queued(h);
}

int ck_hooks_poll_fds(const struct ck_hooks *h, struct pollfd *fds, int max)
{
    int n = 0;
    for (size_t i = 0; i < CK_HOOKS_MAX_RUNNING; i++)
        if (h->running[i])
            n += ck_exec_poll_fds(h->running[i], fds + n, max - n);
    return n;
}

int64_t ck_hooks_deadline_ms(const struct ck_hooks *h)
{
    int64_t d = -1;
    for (size_t i = 0; h->nqueue > 0 && i < CK_HOOKS_MAX_RUNNING; i++)
        if (!h->running[i])
            return ck_mono_ms(); /* queued with a free slot: start it now */
    for (size_t i = 0; i < CK_HOOKS_MAX_RUNNING; i++)
        if (h->running[i]) {
            int64_t x = ck_exec_deadline_ms(h->running[i]);
            if (d < 0 || x < d)
                d = x;
        }
    return d;
}

size_t ck_hooks_exec_running(const struct ck_hooks *h)
{
    size_t n = h->nqueue;
    for (size_t i = 0; i < CK_HOOKS_MAX_RUNNING; i++)
        n += h->running[i] != NULL;
    return n;
}

void ck_hooks_wait_exec(struct ck_hooks *h)
{
    ck_hooks_step(h);
    while (ck_hooks_exec_running(h) > 0) {
        struct pollfd fds[3 * CK_HOOKS_MAX_RUNNING];
        int n = ck_hooks_poll_fds(h, fds, 3 * CK_HOOKS_MAX_RUNNING);
        int64_t wait = ck_hooks_deadline_ms(h) - ck_mono_ms();
        if (wait < 0)
            wait = 0;
        if (wait > 1000)
            wait = 1000;
        poll(fds, (nfds_t)n, (int)wait);
        ck_hooks_step(h);
    }
}

/* --- emit ------------------------------------------------------------------ */

/* Creates the outbox tables once per database handle. */
static int ensure_outbox(struct ck_hooks *h, sqlite3 *db)
{
    int err;
    if (h->outbox_db == db)
        return 0;
    if ((err = ck_outbox_init(db)) < 0)
        return err;
    h->outbox_db = db;
    return 0;
}

static void update_gauges(sqlite3 *db)
{
    int64_t v;
    if (ck_outbox_pending(db, &v) == 0)
        ck_metrics_set(CK_M_HOOK_OUTBOX_DEPTH, v);
    if (ck_outbox_failing_count(db, &v) == 0)
        ck_metrics_set(CK_M_WEBHOOKS_FAILING, v);
}

/* The event's CKPTD_* variables as NAME=value lines (a value holding a
 * newline cannot be one line: it is left out, and said so). */
static int event_env_lines(const struct ck_event *ev, struct ck_buf *out)
{
    char **env = NULL;
    size_t n = 0;
    int err = ck_event_env(ev, &env, &n);
    for (size_t i = 0; err == 0 && i < n; i++) {
        if (strchr(env[i], '\n')) {
            ck_warn("hook.exec.env", "id=%s: %.*s holds a newline: not passed", ev->id,
                    (int)strcspn(env[i], "="), env[i]);
            continue;
        }
        err = ck_buf_printf(out, "%s\n", env[i]);
    }
    ck_event_env_free(env, n);
    return err;
}

int ck_hooks_exec_flush(struct ck_hooks *h, sqlite3 *db)
{
    int err = 0;
    if (!h || !db || !h->nended)
        return 0;
    if ((err = ensure_outbox(h, db)) < 0)
        return err;
    size_t done = 0;
    for (; done < h->nended && err == 0; done++) {
        char *sp = strchr(h->ended[done], ' ');
        if (!sp)
            continue;
        *sp = '\0';
        err = ck_outbox_exec_done(db, h->ended[done], sp + 1);
        *sp = ' ';
    }
    if (err < 0)
        done--; /* that one stays for the next flush */
    for (size_t i = 0; i < done; i++)
        free(h->ended[i]);
    memmove(h->ended, h->ended + done, (h->nended - done) * sizeof *h->ended);
    h->nended -= done;
    return err;
}

struct recover_ctx {
    struct ck_hooks *h;
    sqlite3 *db;
    struct ck_buf gone; /* NUL-separated "event\0hook\0" of runs no hook matches */
    size_t rerun;
    int err;
};

static int recover_one(const struct ck_outbox_exec *r, void *arg)
{
    struct recover_ctx *c = arg;
    char key[64];
    for (size_t i = 0; i < c->h->conf->nexecs; i++) {
        exec_key(&c->h->conf->execs[i], key, sizeof key);
        if (strcmp(key, r->hook) != 0)
            continue;
        ck_warn("hook.exec.recovered",
                "hook='exec[%zu] %s' id=%s: an earlier run was interrupted; running it again",
                i, r->type, r->event_id);
        c->rerun++;
        return (c->err = queue_exec(c->h, i, r->event_id, r->type, r->payload, r->env)) < 0 ? -1
                                                                                          : 0;
    }
    ck_warn("hook.exec.dropped", "hook=%s id=%s: interrupted, and the config has no such exec "
            "hook any more", r->hook, r->event_id);
    ck_buf_append(&c->gone, r->event_id, strlen(r->event_id) + 1);
    ck_buf_append(&c->gone, r->hook, strlen(r->hook) + 1);
    return 0;
}

int ck_hooks_exec_recover(struct ck_hooks *h, sqlite3 *db)
{
    int err;
    if (!h || !db || h->recovered)
        return 0;
    h->recovered = true;
    if ((err = ensure_outbox(h, db)) < 0)
        return err;
    struct recover_ctx c = {h, db, CK_BUF_INIT, 0, 0};
    err = ck_outbox_exec_each(db, recover_one, &c);
    if (err == 0 && c.err < 0)
        err = c.err;
    for (size_t off = 0; err == 0 && off < c.gone.len;) {
        const char *ev = c.gone.data + off, *hook = ev + strlen(ev) + 1;
        err = ck_outbox_exec_done(db, ev, hook);
        off += strlen(ev) + strlen(hook) + 2;
    }
    ck_buf_release(&c.gone);
    start_queued(h);
    return err;
}

int ck_hooks_emit(struct ck_hooks *h, sqlite3 *db, const struct ck_event *ev)
{
    struct ck_buf json = CK_BUF_INIT, env = CK_BUF_INIT;
    const char *type = ck_event_type_name(ev->type);
    const char **keys = NULL;
    char **bodies = NULL;
    size_t n = 0;
    int err;
    if ((err = ck_event_json(ev, &json)) < 0)
        goto out;
    ck_metrics_add(CK_M_EVENTS_EMITTED, 1);
    if (h->nhooks) {
        if (!db) {
            err = ck_error(CK_ESTATE, "webhooks need the state database for their outbox");
            goto out;
        }
        keys = calloc(h->nhooks, sizeof *keys);
        bodies = calloc(h->nhooks, sizeof *bodies);
        if (!keys || !bodies) {
            err = ck_error(CK_ENOMEM, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < h->nhooks; i++) {
            struct webhook *w = &h->hooks[i];
            if (!wants(w->conf->events, w->conf->nevents, type))
                continue;
            keys[n] = w->key;
            if (w->template) {
                struct ck_buf b = CK_BUF_INIT;
                if ((err = ck_template_render(w->template, ev, &b)) < 0) {
                    ck_buf_release(&b);
                    goto out;
                }
                bodies[n] = ck_buf_detach(&b);
            }
            n++;
        }
    }
    size_t nexec = 0;
    for (size_t i = 0; i < h->conf->nexecs; i++)
        nexec += ck_event_filter_matches(h->conf->execs[i].event, type);
    if (nexec && (err = event_env_lines(ev, &env)) < 0)
        goto out;
    /* the event, its webhook deliveries and its exec runs: stored together */
    if (db && (n || nexec)) {
        bool own;
        if ((err = ensure_outbox(h, db)) < 0 || (err = ck_hooks_exec_flush(h, db)) < 0 ||
            (err = ck_outbox_begin(db, &own)) < 0)
            goto out;
        if (n)
            err = ck_outbox_add(db, ev->id, type, ev->time_ms, ck_buf_str(&json), keys,
                                (const char *const *)bodies, n, now_unix_ms());
        for (size_t i = 0; err == 0 && i < h->conf->nexecs; i++) {
            char key[64];
            if (!ck_event_filter_matches(h->conf->execs[i].event, type))
                continue;
            exec_key(&h->conf->execs[i], key, sizeof key);
            err = ck_outbox_exec_add(db, ev->id, key, type, ck_buf_str(&json), ck_buf_str(&env),
                                     ev->time_ms);
        }
        if ((err = ck_outbox_end(db, own, err)) < 0)
            goto out;
        if (n) {
            update_gauges(db);
            if (h->waker)
                h->waker(h->waker_arg);
        }
    }
    /* an event nothing listens to is worth a debug line only */
    ck_log(n + nexec ? CK_LOG_INFO : CK_LOG_DEBUG, "event.emitted",
           "type=%s id=%s webhooks=%zu exec=%zu", type, ev->id, n, nexec);
    for (size_t i = 0; i < h->conf->nexecs; i++)
        if (ck_event_filter_matches(h->conf->execs[i].event, type) &&
            (err = queue_exec(h, i, ev->id, type, ck_buf_str(&json), ck_buf_str(&env))) < 0)
            goto out;
    /* Inside the caller's transaction the runs are not stored until it
     * commits: a command started now could be killed with us before that and
     * never be run again. They start at the next ck_hooks_step (due at once,
     * ck_hooks_deadline_ms) or ck_hooks_wait_exec, after the commit. */
    if (!db || sqlite3_get_autocommit(db))
        start_queued(h);
out:
    ck_buf_release(&env);
    if (bodies)
        for (size_t i = 0; i < n; i++)
            free(bodies[i]);
    free(bodies);
    free(keys);
    ck_buf_release(&json);
    return err;
}

/* --- delivery -------------------------------------------------------------- */

static struct webhook *find_hook(struct ck_hooks *h, const char *key)
{
    for (size_t i = 0; i < h->nhooks; i++)
        if (!strcmp(h->hooks[i].key, key))
            return &h->hooks[i];
    return NULL;
}

/* One attempt of item to w, recorded in the outbox. Returns 1 delivered,
 * 0 failed (recorded), negative on a database error. */
static int attempt(struct ck_hooks *h, sqlite3 *db, struct webhook *w,
                   const struct ck_outbox_item *it, double timeout)
{
    struct ck_buf sig = CK_BUF_INIT;
    struct ck_webhook_result r;
    int64_t ts = now_unix_ms() / 1000;
    int err, transition = 0;
    size_t len = strlen(it->body);
    if ((err = ck_webhook_sign(w->keys, w->nkeys, it->event_id, ts, it->body, len, &sig)) < 0) {
        ck_buf_release(&sig);
        return err;
    }
    int rc = ck_webhook_post(w->url, it->event_id, ts, w->nkeys ? ck_buf_str(&sig) : NULL,
                             "application/json", it->body, len, timeout, &r);
    ck_buf_release(&sig);
    int64_t now = now_unix_ms();
    if (rc == 0) {
        ck_metrics_add(CK_M_WEBHOOK_DELIVERED, 1);
        ck_info("webhook.delivered",
                "hook=%s url=%s type=%s id=%s http_status=%ld attempt=%d "
                "seconds=%.3f",
                w->key, w->shown, it->type, it->event_id, r.status, it->attempts + 1, r.seconds);
        if ((err = ck_outbox_mark_delivered(db, it->event_id, w->key, r.status, now)) < 0 ||
            (err = ck_outbox_receiver_update(db, w->key, true, NULL, h->failing_after, now,
                                             &transition)) < 0)
            return err;
        if (transition < 0)
            ck_info("webhook.recovered", "hook=%s url=%s answers again", w->key, w->shown);
        return 1;
    }
    char why[300];
    if (r.status)
        snprintf(why, sizeof why, "HTTP %ld%s%s", r.status, r.detail[0] ? ": " : "", r.detail);
    else
        snprintf(why, sizeof why, "%s", r.detail[0] ? r.detail : "no answer");
    bool gave_up = false;
    ck_metrics_add(CK_M_WEBHOOK_ATTEMPT_FAILED, 1);
    if ((err = ck_outbox_mark_failed(db, it->event_id, w->key, r.status, why, &h->backoff,
                                     uniform(), now, &gave_up)) < 0 ||
        (err = ck_outbox_receiver_update(db, w->key, false, why, h->failing_after, now,
                                         &transition)) < 0)
        return err;
    ck_warn("webhook.attempt_failed", "hook=%s url=%s type=%s id=%s attempt=%d: %s", w->key,
            w->shown, it->type, it->event_id, it->attempts + 1, why);
    if (gave_up) {
        ck_metrics_add(CK_M_WEBHOOK_GAVE_UP, 1);
        ck_metrics_add(CK_M_FAILURES_HOOK, 1);
        h->failures++;
        ck_err("webhook.gave_up",
               "hook=%s url=%s type=%s id=%s after %d attempts "
               "('ckptd hooks replay %s' resends it)",
               w->key, w->shown, it->type, it->event_id, it->attempts + 1, it->event_id);
    }
    if (transition > 0)
        ck_err("webhook.failing",
               "hook=%s url=%s marked failing after %d consecutive failures: "
               "%s",
               w->key, w->shown, h->failing_after, why);
    return 0;
}

/* run_due on a database whose outbox exists; stops early when *abort is set. */
static int deliver_due(struct ck_hooks *h, sqlite3 *db, int64_t deadline_ms, size_t *delivered,
                       size_t *failed, atomic_bool *abort)
{
    struct ck_outbox_item *items = NULL;
    size_t n = 0, ok = 0;
    int err = 0;
    bool *failed_now = NULL;
    failed_now = calloc(h->nhooks, sizeof *failed_now);
    if (!failed_now)
        return ck_error(CK_ENOMEM, "out of memory");
    bool progress = true;
    while (progress && ck_mono_ms() < deadline_ms && !(abort && atomic_load(abort))) {
        progress = false;
        if ((err = ck_outbox_due(db, now_unix_ms(), DUE_BATCH, &items, &n)) < 0)
            break;
        for (size_t i = 0; i < n && ck_mono_ms() < deadline_ms; i++) {
            if (abort && atomic_load(abort))
                break;
            struct webhook *w = find_hook(h, items[i].hook);
            bool gave_up, claimed;
            int64_t now = now_unix_ms();
            if (!w) {
                /* its hook left the config: nothing can deliver it (replay after re-adding) */
                err = ck_outbox_mark_failed(db, items[i].event_id, items[i].hook, 0,
                                            "no such webhook in the config",
                                            &(struct ck_backoff){NULL, 0}, 0, now, &gave_up);
                ck_warn("webhook.orphaned", "id=%s hook=%s is not in the config any more",
                        items[i].event_id, items[i].hook);
                progress = true;
            } else if (failed_now[w - h->hooks]) {
                continue; /* one failure per receiver per round: no tight loop on a dead one */
            } else {
                double left = (double)(deadline_ms - ck_mono_ms()) / 1000.0;
                double timeout = w->timeout < left ? w->timeout : left;
                /* too little time left: an attempt cut this short would count as a failure */
                if (timeout < (w->timeout < MIN_ATTEMPT_S ? w->timeout : MIN_ATTEMPT_S))
                    continue;
                /* covers the attempt; after a crash the delivery is due again soon after */
                int64_t lease = now + (int64_t)(timeout * 1000) + 2000;
                if ((err = ck_outbox_claim(db, items[i].event_id, w->key, now, lease, &claimed)) <
                        0 ||
                    !claimed)
                    continue;
                int rc = attempt(h, db, w, &items[i], timeout);
                if (rc < 0) {
                    err = rc;
                } else {
                    ok += (size_t)rc;
                    *failed += rc == 0;
                    failed_now[w - h->hooks] |= rc == 0;
                    progress = true;
                }
            }
            if (err < 0)
                break;
        }
        ck_outbox_items_free(items, n);
        items = NULL;
        if (err < 0)
            break;
    }
    free(failed_now);
    update_gauges(db);
    ck_outbox_prune(db, now_unix_ms() - KEEP_DELIVERED_MS);
    *delivered = ok;
    return err;
}

size_t ck_hooks_failures(const struct ck_hooks *h)
{
    return h ? h->failures : 0;
}

int ck_hooks_run_due(struct ck_hooks *h, sqlite3 *db, int64_t deadline_ms, size_t *delivered)
{
    size_t ok = 0, failed = 0;
    int err = 0;
    if (h->nhooks && db && (err = ensure_outbox(h, db)) == 0)
        err = deliver_due(h, db, deadline_ms, &ok, &failed, NULL);
    if (delivered)
        *delivered = ok;
    return err;
}

int ck_hooks_next_due(struct ck_hooks *h, sqlite3 *db, int64_t *unix_ms)
{
    int err;
    *unix_ms = -1;
    if (h->nhooks == 0 || !db)
        return 0;
    if ((err = ensure_outbox(h, db)) < 0)
        return err;
    return ck_outbox_next_due(db, unix_ms);
}

/* --- delivery away from the caller's loop -------------------------------- */

/* A round with a failed attempt is followed by this pause at least: a dead
 * receiver with many deliveries due gets about one request a second. */
#define FAILED_ROUND_PAUSE_S 1.0

void ck_hooks_set_waker(struct ck_hooks *h, void (*fn)(void *arg), void *arg)
{
    h->waker = fn;
    h->waker_arg = arg;
}

int ck_hooks_deliver_round(struct ck_hooks *h, sqlite3 *db, int64_t deadline_ms, atomic_bool *abort,
                           double *again_s)
{
    size_t ok = 0, failed = 0;
    int64_t next = -1;
    int err;
    *again_s = -1;
    if (h->nhooks == 0)
        return 0;
    /* not ensure_outbox: in a helper, h->outbox_db names the watcher's
     * connection, closed before the fork */
    if ((err = ck_outbox_init(db)) < 0 ||
        (err = deliver_due(h, db, deadline_ms, &ok, &failed, abort)) < 0 ||
        (err = ck_outbox_next_due(db, &next)) < 0 || next < 0)
        return err;
    double wait = (double)(next - now_unix_ms()) / 1000.0;
    if (failed && wait < FAILED_ROUND_PAUSE_S)
        wait = FAILED_ROUND_PAUSE_S;
    *again_s = wait > 0 ? wait : 0;
    return 0;
}

/* --- status and test ------------------------------------------------------- */

static int64_t hook_pending(sqlite3 *db, const char *key)
{
    sqlite3_stmt *st;
    int64_t n = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT count(*) FROM hook_deliveries WHERE hook = ? AND "
                           "state = 'pending'",
                           -1, &st, NULL) != SQLITE_OK)
        return -1;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
}

static void receiver_json(sqlite3 *db, const char *key, struct ck_json *j)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "SELECT consecutive_failures, failing, last_error, last_attempt_ms,"
                           " last_success_ms FROM hook_receivers WHERE hook = ?",
                           -1, &st, NULL) != SQLITE_OK)
        return;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_TRANSIENT);
    bool row = sqlite3_step(st) == SQLITE_ROW;
    ck_json_kint(j, "consecutive_failures", row ? sqlite3_column_int64(st, 0) : 0);
    ck_json_kbool(j, "failing", row && sqlite3_column_int(st, 1));
    const unsigned char *e = row ? sqlite3_column_text(st, 2) : NULL;
    ck_json_key(j, "last_error");
    if (e)
        ck_json_str(j, (const char *)e);
    else
        ck_json_null(j);
    ck_json_key(j, "last_success_ms");
    if (row && sqlite3_column_type(st, 4) != SQLITE_NULL)
        ck_json_int(j, sqlite3_column_int64(st, 4));
    else
        ck_json_null(j);
    sqlite3_finalize(st);
}

int ck_hooks_status_json(struct ck_hooks *h, sqlite3 *db, struct ck_json *j)
{
    if (db && h->nhooks && ensure_outbox(h, db) < 0)
        return ck_json_error(j) < 0 ? ck_json_error(j) : CK_EIO;
    ck_json_key(j, "webhooks");
    ck_json_begin_array(j);
    for (size_t i = 0; i < h->nhooks; i++) {
        struct webhook *w = &h->hooks[i];
        ck_json_begin_object(j);
        ck_json_kstr(j, "hook", w->key);
        ck_json_kstr(j, "url", w->shown);
        ck_json_key(j, "events");
        ck_json_begin_array(j);
        for (size_t k = 0; k < w->conf->nevents; k++)
            ck_json_str(j, w->conf->events[k]);
        ck_json_end_array(j);
        ck_json_kint(j, "keys", (int64_t)w->nkeys);
        if (db) {
            ck_json_kint(j, "pending", hook_pending(db, w->key));
            receiver_json(db, w->key, j);
        }
        ck_json_end_object(j);
    }
    ck_json_end_array(j);
    ck_json_kint(j, "exec_hooks_running", (int64_t)ck_hooks_exec_running(h));
    return ck_json_error(j);
}

int ck_hooks_send_once(const char *url_or_ref, char *const *secret_refs, size_t nsecrets,
                       const struct ck_event *ev, double timeout, struct ck_webhook_result *r)
{
    struct ck_webhook_key *keys = NULL;
    struct ck_buf body = CK_BUF_INIT, sig = CK_BUF_INIT;
    char *url = NULL;
    size_t nkeys = 0;
    int err;
    memset(r, 0, sizeof *r);
    if ((err = ck_lazy_load(CK_LIB_CURL)) < 0)
        return err;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if ((err = resolve_url(url_or_ref, "the URL", &url)) < 0)
        goto out;
    if ((err = load_keys(secret_refs, nsecrets, "--secret", &keys, &nkeys)) < 0)
        goto out;
    if ((err = ck_event_json(ev, &body)) < 0)
        goto out;
    int64_t ts = now_unix_ms() / 1000;
    if ((err = ck_webhook_sign(keys, nkeys, ev->id, ts, body.data, body.len, &sig)) < 0)
        goto out;
    err = ck_webhook_post(url, ev->id, ts, nkeys ? ck_buf_str(&sig) : NULL, "application/json",
                          body.data, body.len, timeout, r);
out:
    for (size_t k = 0; keys && k < nsecrets; k++)
        ck_webhook_key_wipe(&keys[k]);
    free(keys);
    if (url)
        ck_secret_free(url);
    ck_buf_release(&body);
    ck_buf_release(&sig);
    return err;
}
