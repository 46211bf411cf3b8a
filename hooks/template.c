#include "hooks/template.h"
#include "common/error.h"
#include "common/json.h"

#include <string.h>

#define FIELD_NAME_MAX 64

/* The name between {{ and }} at p (p points after "{{"), spaces trimmed, into
 * name; *end is set past "}}". CK_EFORMAT when unclosed or too long. */
static int placeholder(const char *p, char *name, const char **end)
{
    const char *close = strstr(p, "}}");
    if (!close)
        return CK_EFORMAT;
    while (p < close && *p == ' ')
        p++;
    const char *q = close;
    while (q > p && q[-1] == ' ')
        q--;
    if (q == p || (size_t)(q - p) >= FIELD_NAME_MAX)
        return CK_EFORMAT;
    memcpy(name, p, (size_t)(q - p));
    name[q - p] = '\0';
    *end = close + 2;
    return 0;
}

static int line_of(const char *tpl, const char *at)
{
    int line = 1;
    for (const char *p = tpl; p < at; p++)
        line += *p == '\n';
    return line;
}

int ck_template_check(const char *name, const char *tpl)
{
    char field[FIELD_NAME_MAX];
    const char *p = tpl, *end;
    if (strlen(tpl) > CK_TEMPLATE_MAX)
        return ck_error(CK_ESIZE, "template '%s' is larger than %d bytes", name, CK_TEMPLATE_MAX);
    while ((p = strstr(p, "{{")) != NULL) {
        if (placeholder(p + 2, field, &end) < 0)
            return ck_error(CK_ECONFIG, "template '%s' line %d: '{{' without a field name and '}}'",
                            name, line_of(tpl, p));
        if (!ck_event_field_exists(field))
            return ck_error(CK_ECONFIG,
                            "template '%s' line %d: '%s' is not an event field (docs/hooks.md, \"Events\")",
                            name, line_of(tpl, p), field);
        p = end;
    }
    return 0;
}

int ck_template_render(const char *tpl, const struct ck_event *ev, struct ck_buf *out)
{
    char field[FIELD_NAME_MAX];
    struct ck_buf v = CK_BUF_INIT;
    const char *p = tpl, *open, *end;
    int err = 0;
    while ((open = strstr(p, "{{")) != NULL) {
        if ((err = ck_buf_append(out, p, (size_t)(open - p))) < 0)
            goto out;
        if (placeholder(open + 2, field, &end) < 0) {
            err = ck_error(CK_EFORMAT, "template: '{{' without a field name and '}}'");
            goto out;
        }
        ck_buf_reset(&v);
        int set = ck_event_field(ev, field, &v);
        if (set < 0) {
            err = ck_error(CK_EFORMAT, "template: '%s' is not an event field", field);
            goto out;
        }
        /* ck_json_escape writes a quoted string: keep what is inside the quotes */
        struct ck_buf q = CK_BUF_INIT;
        if ((err = ck_json_escape(&q, ck_buf_str(&v), v.len)) == 0)
            err = ck_buf_append(out, q.data + 1, q.len - 2);
        ck_buf_release(&q);
        if (err < 0)
            goto out;
        p = end;
    }
    err = ck_buf_puts(out, p);
out:
    ck_buf_release(&v);
    return err;
}
