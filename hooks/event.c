#include "hooks/event.h"
#include "common/error.h"
#include "common/json.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static const char *const type_names[CK_EV__COUNT] = {
    [CK_EV_CHECKPOINT_REGISTERED] = "checkpoint.registered",
    [CK_EV_CHECKPOINT_DELETED] = "checkpoint.deleted",
    [CK_EV_ARCHIVE_PACKED] = "archive.packed",
    [CK_EV_ARCHIVE_FAILED] = "archive.failed",
    [CK_EV_VERIFICATION_PASSED] = "verification.passed",
    [CK_EV_VERIFICATION_FAILED] = "verification.failed",
    [CK_EV_UPLOAD_COMPLETED] = "upload.completed",
    [CK_EV_UPLOAD_FAILED] = "upload.failed",
    [CK_EV_TRAINING_STARTED] = "training.started",
    [CK_EV_TRAINING_FINISHED] = "training.finished",
    [CK_EV_TRAINING_FAILED] = "training.failed",
    [CK_EV_AGENT_STARTED] = "agent.started",
    [CK_EV_AGENT_STOPPING] = "agent.stopping",
    [CK_EV_HOOK_TEST] = "hook.test",
    [CK_EV_CHECKPOINT_COMMITTED] = "checkpoint.committed",
};

const char *ck_event_type_name(enum ck_event_type t)
{
    return (unsigned)t < CK_EV__COUNT ? type_names[t] : NULL;
}

int ck_event_type_parse(const char *name)
{
    for (int i = 0; i < CK_EV__COUNT; i++)
        if (!strcmp(type_names[i], name))
            return i;
    return -1;
}

bool ck_event_filter_matches(const char *pattern, const char *type_name)
{
    return fnmatch(pattern, type_name, 0) == 0;
}

bool ck_event_filter_is_valid(const char *pattern)
{
    for (int i = 0; i < CK_EV__COUNT; i++)
        if (ck_event_filter_matches(pattern, type_names[i]))
            return true;
    return false;
}

/* Fields: one row each. group is the JSON object under "data" the field
 * goes into ("" for data itself), key its name there. */
enum ftype { F_STR, F_INT, F_DBL };
struct field {
    const char *name; /* template name; the env var is CKPTD_ + upper case */
    enum ftype type;
    size_t offset;
    const char *group;
    const char *key;
};
#define O(f) offsetof(struct ck_event, f)
static const struct field fields[] = {
    {"model_name", F_STR, O(model_name), "model", "name"},
    {"model_id", F_STR, O(model_id), "model", "id"},
    {"dir", F_STR, O(dir), "", "dir"},
    {"checkpoint", F_STR, O(checkpoint), "checkpoint", "reference"},
    {"epoch", F_INT, O(epoch), "checkpoint", "epoch"},
    {"path", F_STR, O(path), "checkpoint", "path"},
    {"source", F_STR, O(source), "checkpoint", "source"},
    {"md5", F_STR, O(md5), "checkpoint", "md5"},
    {"sha256", F_STR, O(sha256), "checkpoint", "sha256"},
    {"size", F_INT, O(size), "checkpoint", "size"},
    {"archive_format", F_STR, O(archive_format), "archive", "format"},
    {"archive_path", F_STR, O(archive_path), "archive", "path"},
    {"archive_sha256", F_STR, O(archive_sha256), "archive", "sha256"},
    {"store", F_STR, O(store), "upload", "store"},
    {"remote_url", F_STR, O(remote_url), "upload", "url"},
    {"bytes", F_INT, O(bytes), "upload", "bytes"},
    {"check", F_STR, O(check), "upload", "check"},
    {"seconds", F_DBL, O(seconds), "", "seconds"},
    {"status", F_STR, O(status), "training", "status"},
    {"exit_code", F_INT, O(exit_code), "training", "exit_code"},
    {"error", F_STR, O(error), "", "error"},
    {"against", F_STR, O(against), "verification", "against"},
    {"message", F_STR, O(message), "", "message"},
};
#define NFIELDS (sizeof fields / sizeof fields[0])
static const char *const groups[] = {"",       "model",    "checkpoint",  "archive",
                                     "upload", "training", "verification"};

const char *const ck_event_field_names[] = {
    "type",         "id",
    "timestamp",    "model_name",
    "model_id",     "dir",
    "checkpoint",   "epoch",
    "path",         "source",
    "md5",          "sha256",
    "size",         "archive_format",
    "archive_path", "archive_sha256",
    "store",        "remote_url",
    "bytes",        "seconds",
    "status",       "exit_code",
    "error",        "message",
    "against",      "check",
    NULL,
};

static bool field_is_set(const struct ck_event *ev, const struct field *f)
{
    const char *p = (const char *)ev + f->offset;
    switch (f->type) {
    case F_STR:
        return *(const char *const *)p != NULL;
    case F_INT:
        return *(const int64_t *)p >= 0;
    case F_DBL:
        return *(const double *)p >= 0;
    }
    return false;
}

int ck_event_random_id(char *out, size_t outsz)
{
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz234567";
    unsigned char rnd[26];
    if (outsz < 27)
        return ck_error(CK_ESIZE, "event id buffer too small");
    size_t got = 0;
    while (got < sizeof rnd) {
        ssize_t n = getrandom(rnd + got, sizeof rnd - got, 0);
        if (n < 0)
            return ck_error_os(CK_EIO, "cannot read random bytes");
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof rnd; i++)
        out[i] = alphabet[rnd[i] & 31];
    out[26] = '\0';
    return 0;
}

int ck_event_init(struct ck_event *ev, enum ck_event_type type)
{
    memset(ev, 0, sizeof *ev);
    ev->type = type;
    ev->epoch = ev->size = ev->bytes = ev->exit_code = -1;
    ev->seconds = -1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ev->time_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    memcpy(ev->id, "evt_", 4);
    return ck_event_random_id(ev->id + 4, sizeof ev->id - 4);
}

static void timestamp(int64_t ms, char *out, size_t outsz)
{
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    size_t n = strftime(out, outsz, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, outsz - n, ".%03dZ", (int)(ms % 1000));
}

static void json_field(struct ck_json *j, const struct ck_event *ev, const struct field *f)
{
    const char *p = (const char *)ev + f->offset;
    switch (f->type) {
    case F_STR:
        ck_json_kstr(j, f->key, *(const char *const *)p);
        break;
    case F_INT:
        ck_json_kint(j, f->key, *(const int64_t *)p);
        break;
    case F_DBL:
        ck_json_kdouble(j, f->key, *(const double *)p);
        break;
    }
}

int ck_event_json(const struct ck_event *ev, struct ck_buf *out)
{
    char ts[40];
    struct ck_json j;
    const char *name = ck_event_type_name(ev->type);
    if (!name)
        return ck_error(CK_ERR, "unknown event type %d", (int)ev->type);
    timestamp(ev->time_ms, ts, sizeof ts);
    ck_json_init(&j, out, false);
    ck_json_begin_object(&j);
    ck_json_kstr(&j, "type", name);
    ck_json_kstr(&j, "id", ev->id);
    ck_json_kstr(&j, "timestamp", ts);
    ck_json_key(&j, "data");
    ck_json_begin_object(&j);
    for (size_t g = 0; g < sizeof groups / sizeof *groups; g++) {
        bool opened = false;
        for (size_t i = 0; i < NFIELDS; i++) {
            if (strcmp(fields[i].group, groups[g]) != 0 || !field_is_set(ev, &fields[i]))
                continue;
            if (g > 0 && !opened) {
                ck_json_key(&j, groups[g]);
                ck_json_begin_object(&j);
                opened = true;
            }
            json_field(&j, ev, &fields[i]);
        }
        if (opened)
            ck_json_end_object(&j);
    }
    ck_json_end_object(&j);
    ck_json_end_object(&j);
    return ck_json_error(&j);
}

static const struct field *find_field(const char *name)
{
    for (size_t i = 0; i < NFIELDS; i++)
        if (!strcmp(fields[i].name, name))
            return &fields[i];
    return NULL;
}

bool ck_event_field_exists(const char *name)
{
    for (size_t i = 0; ck_event_field_names[i]; i++)
        if (!strcmp(ck_event_field_names[i], name))
            return true;
    return false;
}

int ck_event_field(const struct ck_event *ev, const char *name, struct ck_buf *out)
{
    if (!strcmp(name, "type"))
        return ck_buf_puts(out, ck_event_type_name(ev->type)) < 0 ? CK_ENOMEM : 1;
    if (!strcmp(name, "id"))
        return ck_buf_puts(out, ev->id) < 0 ? CK_ENOMEM : 1;
    if (!strcmp(name, "timestamp")) {
        char ts[40];
        timestamp(ev->time_ms, ts, sizeof ts);
        return ck_buf_puts(out, ts) < 0 ? CK_ENOMEM : 1;
    }
    const struct field *f = find_field(name);
    if (!f)
        return CK_ENOENT;
    if (!field_is_set(ev, f))
        return 0;
    const char *p = (const char *)ev + f->offset;
    int err = 0;
    switch (f->type) {
    case F_STR:
        err = ck_buf_puts(out, *(const char *const *)p);
        break;
    case F_INT:
        err = ck_buf_printf(out, "%lld", (long long)*(const int64_t *)p);
        break;
    case F_DBL:
        err = ck_buf_printf(out, "%.3f", *(const double *)p);
        break;
    }
    return err < 0 ? err : 1;
}

int ck_event_set(struct ck_event *ev, const char *name, const char *value)
{
    const struct field *f = find_field(name);
    char *end;
    if (!f)
        return ck_error(CK_EUSAGE, "'%s' is not an event field that can be set", name);
    char *p = (char *)ev + f->offset;
    switch (f->type) {
    case F_STR:
        *(const char **)p = value;
        return 0;
    case F_INT: {
        long long v = strtoll(value, &end, 10);
        if (!*value || *end || v < 0)
            return ck_error(CK_EUSAGE, "'%s' must be a whole number >= 0, not '%s'", name, value);
        *(int64_t *)p = v;
        return 0;
    }
    case F_DBL: {
        double v = strtod(value, &end);
        if (!*value || *end || !(v >= 0))
            return ck_error(CK_EUSAGE, "'%s' must be a number >= 0, not '%s'", name, value);
        *(double *)p = v;
        return 0;
    }
    }
    return 0;
}

int ck_event_env(const struct ck_event *ev, char ***env, size_t *n)
{
    struct ck_buf v = CK_BUF_INIT;
    int err = 0;
    for (size_t i = 0; ck_event_field_names[i]; i++) {
        const char *name = ck_event_field_names[i];
        ck_buf_reset(&v);
        /* CKPTD_EVENT for the type reads better in a script than CKPTD_TYPE */
        if ((err = ck_buf_puts(&v, !strcmp(name, "type") ? "CKPTD_EVENT" : "CKPTD_")) < 0)
            break;
        if (strcmp(name, "type") != 0)
            for (const char *c = name; *c; c++)
                if ((err = ck_buf_putc(&v, (char)(*c >= 'a' && *c <= 'z' ? *c - 32 : *c))) < 0)
                    goto out;
        if ((err = ck_buf_putc(&v, '=')) < 0)
            break;
        int set = ck_event_field(ev, name, &v);
        if (set < 0) {
            err = set;
            break;
        }
        if (set == 0)
            continue;
        char **p = realloc(*env, (*n + 2) * sizeof *p);
        if (!p) {
            err = ck_error(CK_ENOMEM, "out of memory");
            break;
        }
        *env = p;
        p[*n] = ck_buf_detach(&v);
        p[++*n] = NULL;
    }
out:
    ck_buf_release(&v);
    return err < 0 ? err : 0;
}

void ck_event_env_free(char **env, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(env[i]);
    free(env);
}
