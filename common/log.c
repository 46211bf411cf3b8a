#include "common/log.h"
#include "common/buf.h"
#include "common/json.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static enum ck_log_format fmt_ = CK_LOG_TEXT;
static enum ck_log_level level_ = CK_LOG_INFO;
static FILE *out_;

static const char *level_names[] = {"debug", "info", "warn", "error"};

void ck_log_setup(enum ck_log_format format, enum ck_log_level level, FILE *out)
{
    fmt_ = format;
    level_ = level;
    out_ = out;
}

void ck_log_setup_over(int flag_format, int flag_level, int cfg_format, int cfg_level)
{
    int format = flag_format >= 0 ? flag_format : cfg_format >= 0 ? cfg_format : CK_LOG_TEXT;
    int level = flag_level >= 0 ? flag_level : cfg_level >= 0 ? cfg_level : CK_LOG_INFO;
    ck_log_setup(format, level, stderr);
}

enum ck_log_format ck_log_format_get(void)
{
    return fmt_;
}

int ck_log_format_parse(const char *s)
{
    if (!strcmp(s, "text"))
        return CK_LOG_TEXT;
    if (!strcmp(s, "json"))
        return CK_LOG_JSON;
    return -1;
}

int ck_log_level_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, level_names[i]))
            return i;
    return -1;
}

/* RFC 3339, UTC, milliseconds. */
static void timestamp(char *ts, size_t tssz)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm tm;
    gmtime_r(&now.tv_sec, &tm);
    size_t n = strftime(ts, tssz, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, tssz - n, ".%03ldZ", now.tv_nsec / 1000000);
}

/* --- JSON fields ------------------------------------------------------------
 * Call sites write "key=value" pairs and a few words of prose, which reads
 * well on a terminal. In JSON mode each pair becomes a member with its type
 * (so `jq .epoch` and Loki see numbers), and what is left is "msg". A value
 * is 'quoted', "quoted" or runs to the next blank; a bare value loses a
 * trailing ':' ',' or ';' (prose punctuation). The member names are the keys
 * the call sites use (docs/logging.md lists them). */

static bool is_key_char(char c, bool first)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (!first && (c >= '0' && c <= '9'));
}

static bool reserved_key(const char *k, size_t n)
{
    static const char *const r[] = {"time", "level", "event", "msg"};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (strlen(r[i]) == n && memcmp(r[i], k, n) == 0)
            return true;
    return false;
}

/* Writes a bare value with its JSON type: integers and finite decimals as
 * numbers, true/false as booleans, anything else as a string. */
static void json_typed(struct ck_json *j, const char *v, size_t n)
{
    char tmp[64];
    if (n > 0 && n < sizeof tmp) {
        memcpy(tmp, v, n);
        tmp[n] = 0;
        if (!strcmp(tmp, "true") || !strcmp(tmp, "false")) {
            ck_json_bool(j, tmp[0] == 't');
            return;
        }
        char *end;
        errno = 0;
        /* digits only (no hex, no leading '+', no "inf"): what a reader expects a number to be */
        bool numeric = true, dot = false;
        for (size_t i = (tmp[0] == '-'); i < n; i++) {
            if (tmp[i] == '.' && !dot && i > (size_t)(tmp[0] == '-') && i + 1 < n)
                dot = true;
            else if (!isdigit((unsigned char)tmp[i]))
                numeric = false;
        }
        size_t sign = tmp[0] == '-';
        /* "007" stays a string: a leading zero is an id, not a number */
        bool leading_zero = tmp[sign] == '0' && n > sign + 1 && tmp[sign + 1] != '.';
        if (numeric && n > sign && !leading_zero) {
            if (!dot) {
                long long ll = strtoll(tmp, &end, 10);
                if (errno == 0 && *end == 0) {
                    ck_json_int(j, ll);
                    return;
                }
            } else {
                double d = strtod(tmp, &end);
                if (errno == 0 && *end == 0) {
                    ck_json_double(j, d);
                    return;
                }
            }
        }
    }
    ck_json_strn(j, v, n);
}

/* Splits msg into typed members of j and the prose left over (into rest). */
static void json_fields(struct ck_json *j, const char *msg, struct ck_buf *rest)
{
    const char *p = msg;
    const char *seen[32];
    size_t seen_len[32], nseen = 0;
    while (*p) {
        const char *word = p;
        const char *k = p;
        while (is_key_char(*p, p == k))
            p++;
        size_t klen = (size_t)(p - k);
        bool field = klen > 0 && *p == '=' && (word == msg || isspace((unsigned char)word[-1]) ||
                                               word[-1] == '(' || word[-1] == ',');
        for (size_t i = 0; field && i < nseen; i++)
            if (seen_len[i] == klen && memcmp(seen[i], k, klen) == 0)
                field = false; /* JSON objects want unique names: a repeat stays prose */
        if (field && !reserved_key(k, klen) && nseen < 32) {
            const char *v = ++p, *vend;
            bool quoted = (*v == '\'' || *v == '"');
            if (quoted) {
                const char *close = strchr(v + 1, *v);
                if (!close) {
                    p = word;
                    goto prose;
                }
                vend = close;
                p = close + 1;
                v++;
            } else {
                while (*p && !isspace((unsigned char)*p))
                    p++;
                vend = p;
                while (vend > v && (vend[-1] == ':' || vend[-1] == ',' || vend[-1] == ';'))
                    vend--;
            }
            char key[64];
            size_t kn = klen < sizeof key - 1 ? klen : sizeof key - 1;
            memcpy(key, k, kn);
            key[kn] = 0;
            ck_json_key(j, key);
            if (quoted)
                ck_json_strn(j, v, (size_t)(vend - v));
            else
                json_typed(j, v, (size_t)(vend - v));
            seen[nseen] = k;
            seen_len[nseen++] = klen;
            /* drop the punctuation that only separated the pair from the prose */
            while (*p == ':' || *p == ',' || *p == ';')
                p++;
            while (isspace((unsigned char)*p))
                p++;
            continue;
        }
        p = word;
    prose:
        /* copy one word of prose, with the blank after it */
        while (*p && !isspace((unsigned char)*p))
            ck_buf_append(rest, p++, 1);
        while (isspace((unsigned char)*p))
            p++;
        if (*p)
            ck_buf_append(rest, " ", 1);
    }
}

void ck_log(enum ck_log_level level, const char *event, const char *fmt, ...)
{
    if (level < level_)
        return;
    FILE *out = out_ ? out_ : stderr;
    char msg[4096], ts[40];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    timestamp(ts, sizeof ts);

    if (fmt_ == CK_LOG_JSON) {
        struct ck_buf b = CK_BUF_INIT;
        struct ck_json j;
        ck_json_init(&j, &b, false);
        ck_json_begin_object(&j);
        ck_json_kstr(&j, "time", ts);
        ck_json_kstr(&j, "level", level_names[level]);
        ck_json_kstr(&j, "event", event);
        struct ck_buf rest = CK_BUF_INIT;
        json_fields(&j, msg, &rest);
        /* trailing blanks of the prose come from a field at the end */
        while (rest.len && rest.data[rest.len - 1] == ' ')
            rest.data[--rest.len] = 0;
        if (!rest.len) /* all pairs: the event's name is the sentence */
            for (const char *e = event; *e; e++)
                ck_buf_putc(&rest, *e == '.' || *e == '_' ? ' ' : *e);
        ck_json_kstr(&j, "msg", ck_buf_str(&rest));
        ck_buf_release(&rest);
        ck_json_end_object(&j);
        flockfile(out);
        fprintf(out, "%s\n", ck_buf_str(&b));
        funlockfile(out);
        ck_buf_release(&b);
    } else {
        flockfile(out);
        fprintf(out, "%s %-5s %s: %s\n", ts, level_names[level], event, msg);
        funlockfile(out);
    }
    fflush(out);
}

void ck_log_kv(enum ck_log_level level, const char *event, const char *msg, ...)
{
    if (level < level_)
        return;
    FILE *out = out_ ? out_ : stderr;
    char ts[40];
    timestamp(ts, sizeof ts);
    struct ck_buf b = CK_BUF_INIT;
    va_list ap;
    va_start(ap, msg);
    if (fmt_ == CK_LOG_JSON) {
        struct ck_json j;
        ck_json_init(&j, &b, false);
        ck_json_begin_object(&j);
        ck_json_kstr(&j, "time", ts);
        ck_json_kstr(&j, "level", level_names[level]);
        ck_json_kstr(&j, "event", event);
        for (const char *k; (k = va_arg(ap, const char *));)
            ck_json_kstr(&j, k, va_arg(ap, const char *));
        ck_json_kstr(&j, "msg", msg);
        ck_json_end_object(&j);
    } else {
        ck_buf_printf(&b, "%s %-5s %s: %s", ts, level_names[level], event, msg);
        for (const char *k; (k = va_arg(ap, const char *));)
            ck_buf_printf(&b, " %s='%s'", k, va_arg(ap, const char *));
    }
    va_end(ap);
    flockfile(out);
    fprintf(out, "%s\n", ck_buf_str(&b));
    funlockfile(out);
    fflush(out);
    ck_buf_release(&b);
}
