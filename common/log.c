#include "common/log.h"
#include "common/buf.h"
#include "common/json.h"

#include <stdarg.h>
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

    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm tm;
    gmtime_r(&now.tv_sec, &tm);
    size_t n = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, sizeof ts - n, ".%03ldZ", now.tv_nsec / 1000000);

    if (fmt_ == CK_LOG_JSON) {
        struct ck_buf b = CK_BUF_INIT;
        struct ck_json j;
        ck_json_init(&j, &b, false);
        ck_json_begin_object(&j);
        ck_json_kstr(&j, "time", ts);
        ck_json_kstr(&j, "level", level_names[level]);
        ck_json_kstr(&j, "event", event);
        ck_json_kstr(&j, "msg", msg);
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
