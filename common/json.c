#include "common/json.h"
#include "common/error.h"
#include "common/utf8.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ck_json_init(struct ck_json *j, struct ck_buf *out, bool pretty)
{
    memset(j, 0, sizeof *j);
    j->out = out;
    j->pretty = pretty;
}

static void indent(struct ck_json *j)
{
    if (!j->pretty)
        return;
    ck_buf_putc(j->out, '\n');
    for (int i = 0; i < j->depth; i++)
        ck_buf_puts(j->out, "  ");
}

/* Called before every value: commas between siblings, nothing after a key. */
static void before_value(struct ck_json *j)
{
    if (j->after_key) {
        j->after_key = false;
        return;
    }
    if (j->depth > 0) {
        if (j->need_comma[j->depth])
            ck_buf_putc(j->out, ',');
        j->need_comma[j->depth] = true;
        indent(j);
    }
}

static void open(struct ck_json *j, char c)
{
    if (j->err)
        return;
    before_value(j);
    if (j->depth + 1 >= CK_JSON_MAX_DEPTH) {
        j->err = ck_error(CK_ESIZE, "json nesting deeper than %d", CK_JSON_MAX_DEPTH);
        return;
    }
    ck_buf_putc(j->out, c);
    j->depth++;
    j->need_comma[j->depth] = false;
}

static void close_(struct ck_json *j, char c)
{
    if (j->err)
        return;
    bool had = j->need_comma[j->depth];
    j->depth--;
    if (had)
        indent(j);
    ck_buf_putc(j->out, c);
}

void ck_json_begin_object(struct ck_json *j) { open(j, '{'); }
void ck_json_end_object(struct ck_json *j) { close_(j, '}'); }
void ck_json_begin_array(struct ck_json *j) { open(j, '['); }
void ck_json_end_array(struct ck_json *j) { close_(j, ']'); }

int ck_json_escape(struct ck_buf *b, const char *s, size_t len)
{
    int err = ck_buf_putc(b, '"');
    size_t i = 0;
    while (err == 0 && i < len) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            size_t n = ck_utf8_char_len(s + i, len - i);
            if (n == 0) {
                err = ck_buf_puts(b, "\\ufffd");
                i++;
            } else {
                err = ck_buf_append(b, s + i, n);
                i += n;
            }
            continue;
        }
        switch (c) {
        case '"': err = ck_buf_puts(b, "\\\""); break;
        case '\\': err = ck_buf_puts(b, "\\\\"); break;
        case '\n': err = ck_buf_puts(b, "\\n"); break;
        case '\r': err = ck_buf_puts(b, "\\r"); break;
        case '\t': err = ck_buf_puts(b, "\\t"); break;
        default:
            if (c < 0x20)
                err = ck_buf_printf(b, "\\u%04x", c);
            else
                err = ck_buf_putc(b, (char)c);
        }
        i++;
    }
    if (err == 0)
        err = ck_buf_putc(b, '"');
    return err;
}

void ck_json_key(struct ck_json *j, const char *key)
{
    if (j->err)
        return;
    before_value(j);
    j->err = ck_json_escape(j->out, key, strlen(key));
    ck_buf_puts(j->out, j->pretty ? ": " : ":");
    j->after_key = true;
}

void ck_json_strn(struct ck_json *j, const char *s, size_t len)
{
    if (j->err)
        return;
    before_value(j);
    j->err = ck_json_escape(j->out, s, len);
}

void ck_json_str(struct ck_json *j, const char *s)
{
    if (!s) {
        ck_json_null(j);
        return;
    }
    ck_json_strn(j, s, strlen(s));
}

static void raw(struct ck_json *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void raw(struct ck_json *j, const char *fmt, ...)
{
    if (j->err)
        return;
    before_value(j);
    va_list ap;
    va_start(ap, fmt);
    j->err = ck_buf_vprintf(j->out, fmt, ap);
    va_end(ap);
}

void ck_json_int(struct ck_json *j, int64_t v) { raw(j, "%" PRId64, v); }
void ck_json_uint(struct ck_json *j, uint64_t v) { raw(j, "%" PRIu64, v); }
void ck_json_bool(struct ck_json *j, bool v) { raw(j, "%s", v ? "true" : "false"); }
void ck_json_null(struct ck_json *j) { raw(j, "null"); }

/* The shortest of %.15g, %.16g, %.17g that reads back as v: 0.06 is "0.06",
 * not "0.059999999999999998", and every value still round-trips. */
void ck_json_double(struct ck_json *j, double v)
{
    if (!isfinite(v)) {
        raw(j, "null");
        return;
    }
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (prec == 17 || strtod(buf, NULL) == v)
            break;
    }
    raw(j, "%s", buf);
}

void ck_json_kstr(struct ck_json *j, const char *key, const char *s)
{
    ck_json_key(j, key);
    ck_json_str(j, s);
}

void ck_json_kint(struct ck_json *j, const char *key, int64_t v)
{
    ck_json_key(j, key);
    ck_json_int(j, v);
}

void ck_json_kdouble(struct ck_json *j, const char *key, double v)
{
    ck_json_key(j, key);
    ck_json_double(j, v);
}

void ck_json_kbool(struct ck_json *j, const char *key, bool v)
{
    ck_json_key(j, key);
    ck_json_bool(j, v);
}

int ck_json_error(const struct ck_json *j)
{
    return j->err;
}
