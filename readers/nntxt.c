/* Protobuf text format, strictly; see nntxt.h. */
#include "readers/nntxt.h"

#include "common/buf.h"
#include "common/error.h"
#include "common/codec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct lx {
    const char *p, *end;
    const char *file;
    unsigned line;
    size_t nodes;
};

static int lx_err(const struct lx *l, const char *what)
{
    if (l->p >= l->end)
        return ck_error(CK_EFORMAT, "'%s' line %u: %s at the end of the text", l->file, l->line,
                        what);
    unsigned char c = (unsigned char)*l->p;
    if (c >= 0x20 && c < 0x7f)
        return ck_error(CK_EFORMAT, "'%s' line %u: %s, found '%c'", l->file, l->line, what, c);
    return ck_error(CK_EFORMAT, "'%s' line %u: %s, found byte 0x%02x", l->file, l->line, what, c);
}

static void skip_ws(struct lx *l)
{
    while (l->p < l->end) {
        char c = *l->p;
        if (c == '\n') {
            l->line++;
            l->p++;
        } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
            l->p++;
        } else if (c == '#') {
            while (l->p < l->end && *l->p != '\n')
                l->p++;
        } else {
            break;
        }
    }
}

static bool is_ident_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_ident_char(char c)
{
    return is_ident_start(c) || (c >= '0' && c <= '9');
}

static int new_node(struct lx *l, const char *name, size_t nlen, enum ck_nntxt_kind kind,
                    unsigned line, struct ck_nntxt **out)
{
    if (++l->nodes > CK_NNTXT_MAX_NODES)
        return ck_error(CK_ESIZE, "'%s' line %u: more than %u fields", l->file, line,
                        CK_NNTXT_MAX_NODES);
    struct ck_nntxt *n = calloc(1, sizeof(*n));
    if (!n || !(n->name = strndup(name, nlen))) {
        free(n);
        return ck_error(CK_ENOMEM, "'%s': out of memory", l->file);
    }
    n->kind = kind;
    n->line = line;
    *out = n;
    return 0;
}

/* Appends code point cp as UTF-8. */
static int put_utf8(struct ck_buf *b, uint32_t cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | cp >> 6);
        u[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | cp >> 12);
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        u[0] = (char)(0xf0 | cp >> 18);
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    return ck_buf_append(b, u, n);
}

static int escape(struct lx *l, struct ck_buf *b)
{
    static const char simple[] = "n\nt\tr\ra\ab\bf\fv\v\\\\''\"\"??";
    char c = *l->p++;
    for (const char *s = simple; *s; s += 2)
        if (*s == c)
            return ck_buf_putc(b, s[1]);
    if (c >= '0' && c <= '7') {
        int v = c - '0';
        for (int i = 0; i < 2 && l->p < l->end && *l->p >= '0' && *l->p <= '7'; i++)
            v = v * 8 + (*l->p++ - '0');
        if (v > 255)
            return lx_err(l, "octal escape over \\377");
        return ck_buf_putc(b, (char)v);
    }
    if (c == 'x' || c == 'X') {
        int v = 0, k = 0;
        while (k < 2 && l->p < l->end && ck_codec_hexval(*l->p) >= 0)
            v = v * 16 + ck_codec_hexval(*l->p++), k++;
        if (!k)
            return lx_err(l, "expected hex digits after \\x");
        return ck_buf_putc(b, (char)v);
    }
    if (c == 'u' || c == 'U') {
        int want = c == 'u' ? 4 : 8;
        uint32_t v = 0;
        for (int k = 0; k < want; k++) {
            if (l->p >= l->end || ck_codec_hexval(*l->p) < 0)
                return lx_err(l, "expected hex digits in a unicode escape");
            v = v * 16 + (uint32_t)ck_codec_hexval(*l->p++);
        }
        if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
            return lx_err(l, "unicode escape out of range");
        return put_utf8(b, v);
    }
    l->p--;
    return lx_err(l, "unknown escape in a string");
}

/* One or more adjacent quoted strings. */
static int string_value(struct lx *l, struct ck_nntxt *n)
{
    struct ck_buf b;
    int err = 0;
    ck_buf_init(&b, CK_NNTXT_MAX_TEXT);
    if ((err = ck_buf_append(&b, "", 0)) < 0)
        goto out;
    while (l->p < l->end && (*l->p == '"' || *l->p == '\'')) {
        char q = *l->p++;
        for (;;) {
            if (l->p >= l->end || *l->p == '\n') {
                err = lx_err(l, "unterminated string");
                goto out;
            }
            char c = *l->p++;
            if (c == q)
                break;
            if (c == '\\') {
                if (l->p >= l->end) {
                    err = lx_err(l, "unterminated string");
                    goto out;
                }
                if ((err = escape(l, &b)) < 0)
                    goto out;
            } else if ((err = ck_buf_putc(&b, c)) < 0) {
                goto out;
            }
        }
        skip_ws(l);
    }
    n->len = b.len;
    n->value = ck_buf_detach(&b);
    if (!n->value)
        err = ck_error(CK_ENOMEM, "'%s': out of memory", l->file);
out:
    ck_buf_release(&b);
    return err;
}

static bool number_ok(const char *s)
{
    char *e;
    size_t n = strlen(s);
    errno = 0;
    (void)strtoll(s, &e, 0);
    if (*e == 0 && e != s)
        return true;
    if (!strncmp(s, "0x", 2) || !strncmp(s, "0X", 2) || !strncmp(s, "-0x", 3))
        return false;
    char tmp[128];
    if (n == 0 || n >= sizeof(tmp))
        return false;
    (void)strtod(s, &e);
    if (*e == 0 && e != s)
        return true;
    memcpy(tmp, s, n + 1);
    if (tmp[n - 1] != 'f' && tmp[n - 1] != 'F')
        return false;
    tmp[n - 1] = 0;
    (void)strtod(tmp, &e);
    return *e == 0 && e != tmp && n > 1;
}

static int scalar_value(struct lx *l, struct ck_nntxt *n)
{
    if (l->p < l->end && (*l->p == '"' || *l->p == '\'')) {
        n->kind = CK_NNTXT_STRING;
        return string_value(l, n);
    }
    const char *s = l->p;
    if (l->p < l->end && (*l->p == '-' || *l->p == '+'))
        l->p++;
    if (l->p < l->end && is_ident_start(*l->p) && s == l->p) {
        while (l->p < l->end && is_ident_char(*l->p))
            l->p++;
        n->kind = CK_NNTXT_IDENT;
    } else {
        while (l->p < l->end &&
               (is_ident_char(*l->p) || *l->p == '.' ||
                ((*l->p == '-' || *l->p == '+') && (l->p[-1] == 'e' || l->p[-1] == 'E'))))
            l->p++;
        n->kind = CK_NNTXT_NUMBER;
    }
    size_t len = (size_t)(l->p - s);
    if (len == 0 || (len == 1 && (*s == '-' || *s == '+'))) {
        l->p = s;
        return lx_err(l, "expected a value");
    }
    if (!(n->value = strndup(s, len)))
        return ck_error(CK_ENOMEM, "'%s': out of memory", l->file);
    n->len = len;
    if (n->kind == CK_NNTXT_NUMBER && !number_ok(n->value)) {
        l->p = s;
        return ck_error(CK_EFORMAT, "'%s' line %u: '%s' is not a number", l->file, l->line,
                        n->value);
    }
    return 0;
}

static int parse_message(struct lx *l, struct ck_nntxt *msg, int depth, char closer);

/* A value after "name:" or "name" (a message), appended to msg via *tail. */
static int field_value(struct lx *l, struct ck_nntxt *msg, struct ck_nntxt ***tail,
                       const char *name, size_t nlen, unsigned line, int depth, bool colon)
{
    struct ck_nntxt *n = NULL;
    int err;
    if (l->p < l->end && (*l->p == '{' || *l->p == '<')) {
        char closer = *l->p == '{' ? '}' : '>';
        l->p++;
        if ((err = new_node(l, name, nlen, CK_NNTXT_MSG, line, &n)) < 0)
            return err;
        **tail = n;
        *tail = &n->next;
        if (depth + 1 > CK_NNTXT_MAX_DEPTH)
            return ck_error(CK_EFORMAT, "'%s' line %u: messages nested deeper than %d", l->file,
                            line, CK_NNTXT_MAX_DEPTH);
        return parse_message(l, n, depth + 1, closer);
    }
    if (!colon)
        return lx_err(l, "expected ':' or '{' after a field name");
    if ((err = new_node(l, name, nlen, CK_NNTXT_NUMBER, line, &n)) < 0)
        return err;
    **tail = n;
    *tail = &n->next;
    (void)msg;
    return scalar_value(l, n);
}

static int parse_field(struct lx *l, struct ck_nntxt *msg, struct ck_nntxt ***tail, int depth)
{
    unsigned line = l->line;
    if (l->p < l->end && *l->p == '[')
        return lx_err(l, "extension and Any fields are not supported");
    if (l->p >= l->end || !is_ident_start(*l->p))
        return lx_err(l, "expected a field name");
    const char *name = l->p;
    while (l->p < l->end && is_ident_char(*l->p))
        l->p++;
    size_t nlen = (size_t)(l->p - name);
    skip_ws(l);
    bool colon = false;
    if (l->p < l->end && *l->p == ':') {
        colon = true;
        l->p++;
        skip_ws(l);
    }
    int err;
    if (colon && l->p < l->end && *l->p == '[') {
        l->p++;
        skip_ws(l);
        if (l->p < l->end && *l->p == ']') {
            l->p++;
            return 0;
        }
        for (;;) {
            if ((err = field_value(l, msg, tail, name, nlen, line, depth, true)) < 0)
                return err;
            skip_ws(l);
            if (l->p < l->end && *l->p == ',') {
                l->p++;
                skip_ws(l);
                continue;
            }
            if (l->p < l->end && *l->p == ']') {
                l->p++;
                return 0;
            }
            return lx_err(l, "expected ',' or ']' in a list");
        }
    }
    return field_value(l, msg, tail, name, nlen, line, depth, colon);
}

static int parse_message(struct lx *l, struct ck_nntxt *msg, int depth, char closer)
{
    struct ck_nntxt **tail = &msg->child;
    int err;
    for (;;) {
        skip_ws(l);
        if (l->p >= l->end) {
            if (closer)
                return lx_err(l, closer == '}' ? "expected '}'" : "expected '>'");
            return 0;
        }
        if (closer && *l->p == closer) {
            l->p++;
            return 0;
        }
        if ((err = parse_field(l, msg, &tail, depth)) < 0)
            return err;
        skip_ws(l);
        if (l->p < l->end && (*l->p == ';' || *l->p == ','))
            l->p++;
    }
}

int ck_nntxt_parse(const char *text, size_t len, const char *file, struct ck_nntxt **out)
{
    struct lx l = {text, text + len, file, 1, 0};
    struct ck_nntxt *root = NULL;
    int err;
    *out = NULL;
    if (len > CK_NNTXT_MAX_TEXT)
        return ck_error(CK_ESIZE, "'%s': %zu bytes of text is over the limit", file, len);
    if ((err = new_node(&l, "", 0, CK_NNTXT_MSG, 1, &root)) < 0)
        return err;
    if ((err = parse_message(&l, root, 0, 0)) < 0) {
        ck_nntxt_free(root);
        return err;
    }
    *out = root;
    return 0;
}

void ck_nntxt_free(struct ck_nntxt *n)
{
    while (n) {
        struct ck_nntxt *next = n->next;
        ck_nntxt_free(n->child);
        free(n->name);
        free(n->value);
        free(n);
        n = next;
    }
}

const struct ck_nntxt *ck_nntxt_get(const struct ck_nntxt *msg, const char *name)
{
    for (const struct ck_nntxt *c = msg ? msg->child : NULL; c; c = c->next)
        if (!strcmp(c->name, name))
            return c;
    return NULL;
}

const struct ck_nntxt *ck_nntxt_next(const struct ck_nntxt *n)
{
    for (const struct ck_nntxt *c = n ? n->next : NULL; c; c = c->next)
        if (!strcmp(c->name, n->name))
            return c;
    return NULL;
}

size_t ck_nntxt_count(const struct ck_nntxt *msg, const char *name)
{
    size_t k = 0;
    for (const struct ck_nntxt *c = ck_nntxt_get(msg, name); c; c = ck_nntxt_next(c))
        k++;
    return k;
}

static int want(const struct ck_nntxt *n, const char *file, const char *what)
{
    return ck_error(CK_EFORMAT, "'%s' line %u: field '%s' is not %s", file, n->line, n->name, what);
}

int ck_nntxt_int(const struct ck_nntxt *n, const char *file, int64_t *out)
{
    char *e;
    if (n->kind != CK_NNTXT_NUMBER)
        return want(n, file, "an integer");
    errno = 0;
    long long v = strtoll(n->value, &e, 0);
    if (*e || e == n->value || errno == ERANGE)
        return want(n, file, "an integer in range");
    *out = v;
    return 0;
}

int ck_nntxt_double(const struct ck_nntxt *n, const char *file, double *out)
{
    char tmp[128], *e;
    if (n->kind != CK_NNTXT_NUMBER && n->kind != CK_NNTXT_IDENT)
        return want(n, file, "a number");
    size_t len = strlen(n->value);
    if (len == 0 || len >= sizeof(tmp))
        return want(n, file, "a number");
    memcpy(tmp, n->value, len + 1);
    if (strncmp(tmp, "0x", 2) && (tmp[len - 1] == 'f' || tmp[len - 1] == 'F') &&
        strcasecmp(tmp, "inf") && strcasecmp(tmp, "-inf"))
        tmp[len - 1] = 0;
    double v = strtod(tmp, &e);
    if (*e || e == tmp)
        return want(n, file, "a number");
    *out = v;
    return 0;
}

int ck_nntxt_bool(const struct ck_nntxt *n, const char *file, bool *out)
{
    const char *v = n->value;
    if (n->kind == CK_NNTXT_IDENT && (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "t")))
        *out = true;
    else if (n->kind == CK_NNTXT_IDENT &&
             (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "f")))
        *out = false;
    else if (n->kind == CK_NNTXT_NUMBER && (!strcmp(v, "1") || !strcmp(v, "0")))
        *out = v[0] == '1';
    else
        return want(n, file, "a bool");
    return 0;
}

int ck_nntxt_str(const struct ck_nntxt *n, const char *file, const char **out)
{
    if (n->kind != CK_NNTXT_STRING || strlen(n->value) != n->len)
        return want(n, file, "a string without NUL bytes");
    *out = n->value;
    return 0;
}
