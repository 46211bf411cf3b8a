#include "readers/jsonin.h"
#include "common/error.h"
#include "common/utf8.h"

#include <stdlib.h>
#include <string.h>

/* Nodes and decoded strings come from a chain of blocks. */
struct block {
    struct block *next;
    size_t used, cap;
    max_align_t data[];
};

struct ck_jin_doc {
    struct block *blocks;
};

struct parser {
    const char *p, *start, *end;
    struct ck_jin_doc *doc;
    int depth;
};

static void *arena(struct ck_jin_doc *d, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    struct block *b = d->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = d->blocks;
        d->blocks = b;
    }
    void *r = (char *)b->data + b->used;
    b->used += n;
    return r;
}

static int fail(struct parser *ps, const char *what)
{
    return ck_error(CK_EFORMAT, "json: %s at byte %zu", what, (size_t)(ps->p - ps->start));
}

static void skip_ws(struct parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int hex4(struct parser *ps, unsigned *out)
{
    unsigned v = 0;
    if (ps->end - ps->p < 4)
        return fail(ps, "truncated \\u escape");
    for (int i = 0; i < 4; i++) {
        char c = *ps->p++;
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return fail(ps, "bad \\u escape");
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* A string at ps->p (the opening quote); decoded into the arena. A decoded
 * string is never longer than its source, so the source length bounds it. */
static int string(struct parser *ps, const char **out, size_t *outlen)
{
    const char *q = ++ps->p;
    while (q < ps->end && *q != '"') {
        if (*q == '\\')
            q++;
        q++;
    }
    if (q >= ps->end)
        return fail(ps, "unterminated string");
    char *o = arena(ps->doc, (size_t)(q - ps->p) + 1);
    size_t n = 0;
    int err;
    if (!o)
        return ck_error(CK_ENOMEM, "json: out of memory");
    while (*ps->p != '"') {
        unsigned char c = (unsigned char)*ps->p;
        if (c < 0x20)
            return fail(ps, "control character in string");
        if (c != '\\') {
            size_t cl = ck_utf8_char_len(ps->p, (size_t)(ps->end - ps->p));
            if (!cl)
                return fail(ps, "invalid UTF-8 in string");
            memcpy(o + n, ps->p, cl);
            n += cl;
            ps->p += cl;
            continue;
        }
        ps->p++;
        char e = *ps->p++;
        unsigned cp, lo;
        switch (e) {
        case '"':
            o[n++] = '"';
            break;
        case '\\':
            o[n++] = '\\';
            break;
        case '/':
            o[n++] = '/';
            break;
        case 'b':
            o[n++] = '\b';
            break;
        case 'f':
            o[n++] = '\f';
            break;
        case 'n':
            o[n++] = '\n';
            break;
        case 'r':
            o[n++] = '\r';
            break;
        case 't':
            o[n++] = '\t';
            break;
        case 'u':
            if ((err = hex4(ps, &cp)) < 0)
                return err;
            if (cp >= 0xdc00 && cp <= 0xdfff)
                return fail(ps, "lone low surrogate");
            if (cp >= 0xd800 && cp <= 0xdbff) {
                if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u')
                    return fail(ps, "lone high surrogate");
                ps->p += 2;
                if ((err = hex4(ps, &lo)) < 0)
                    return err;
                if (lo < 0xdc00 || lo > 0xdfff)
                    return fail(ps, "bad surrogate pair");
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            /* \uXXXX is 6 source bytes for at most 3 output; a pair 12 for 4. */
            n += put_utf8(o + n, cp);
            break;
        default:
            ps->p--;
            return fail(ps, "bad escape");
        }
    }
    ps->p++;
    o[n] = 0;
    *out = o;
    *outlen = n;
    return 0;
}

static int number(struct parser *ps, struct ck_jin *v)
{
    const char *s = ps->p;
    if (ps->p < ps->end && *ps->p == '-')
        ps->p++;
    if (ps->p >= ps->end)
        return fail(ps, "truncated number");
    if (*ps->p == '0') {
        ps->p++;
    } else if (*ps->p >= '1' && *ps->p <= '9') {
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    } else {
        return fail(ps, "bad number");
    }
    if (ps->p < ps->end && *ps->p == '.') {
        ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
            return fail(ps, "bad fraction");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
            ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
            return fail(ps, "bad exponent");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    char *t = arena(ps->doc, (size_t)(ps->p - s) + 1);
    if (!t)
        return ck_error(CK_ENOMEM, "json: out of memory");
    memcpy(t, s, (size_t)(ps->p - s));
    t[ps->p - s] = 0;
    v->type = CK_JIN_NUMBER;
    v->str = t;
    v->len = (size_t)(ps->p - s);
    return 0;
}

static int literal(struct parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n))
        return fail(ps, "unexpected character");
    ps->p += n;
    return 0;
}

static int value(struct parser *ps, struct ck_jin *v);

static int key_cmp(const void *a, const void *b)
{
    const struct ck_jin *x = *(const struct ck_jin *const *)a,
                        *y = *(const struct ck_jin *const *)b;
    size_t n = x->keylen < y->keylen ? x->keylen : y->keylen;
    int c = memcmp(x->key, y->key, n);
    if (c)
        return c;
    return x->keylen < y->keylen ? -1 : x->keylen > y->keylen;
}

/* Duplicate keys, found by sorting (a linear scan per key would make a
 * hostile header with a million keys quadratic). */
static int check_duplicates(struct parser *ps, const struct ck_jin *v)
{
    if (v->n < 2)
        return 0;
    const struct ck_jin **a = malloc(v->n * sizeof *a);
    size_t i = 0;
    if (!a)
        return ck_error(CK_ENOMEM, "json: out of memory");
    for (const struct ck_jin *c = v->first; c; c = c->next)
        a[i++] = c;
    qsort(a, v->n, sizeof *a, key_cmp);
    for (i = 1; i < v->n; i++)
        if (!key_cmp(&a[i - 1], &a[i])) {
            int err = ck_error(CK_EFORMAT, "json: duplicate key '%.200s'", a[i]->key);
            free(a);
            return err;
        }
    free(a);
    return 0;
}

static int container(struct parser *ps, struct ck_jin *v, bool object)
{
    char close = object ? '}' : ']';
    struct ck_jin **tail = &v->first;
    int err;
    if (++ps->depth > CK_JIN_MAX_DEPTH)
        return fail(ps, "nesting too deep");
    v->type = object ? CK_JIN_OBJECT : CK_JIN_ARRAY;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        ps->depth--;
        return 0;
    }
    for (;;) {
        struct ck_jin *c = arena(ps->doc, sizeof *c);
        if (!c)
            return ck_error(CK_ENOMEM, "json: out of memory");
        memset(c, 0, sizeof *c);
        skip_ws(ps);
        if (object) {
            if (ps->p >= ps->end || *ps->p != '"')
                return fail(ps, "expected a key");
            if ((err = string(ps, &c->key, &c->keylen)) < 0)
                return err;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':')
                return fail(ps, "expected ':'");
            ps->p++;
        }
        if ((err = value(ps, c)) < 0)
            return err;
        *tail = c;
        tail = &c->next;
        v->n++;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            ps->depth--;
            return object ? check_duplicates(ps, v) : 0;
        }
        return fail(ps, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int value(struct parser *ps, struct ck_jin *v)
{
    skip_ws(ps);
    if (ps->p >= ps->end)
        return fail(ps, "unexpected end");
    switch (*ps->p) {
    case '{':
        return container(ps, v, true);
    case '[':
        return container(ps, v, false);
    case '"':
        v->type = CK_JIN_STRING;
        return string(ps, &v->str, &v->len);
    case 't':
        v->type = CK_JIN_BOOL;
        v->b = true;
        return literal(ps, "true");
    case 'f':
        v->type = CK_JIN_BOOL;
        return literal(ps, "false");
    case 'n':
        v->type = CK_JIN_NULL;
        return literal(ps, "null");
    default:
        return number(ps, v);
    }
}

int ck_jin_parse(const char *text, size_t len, struct ck_jin_doc **doc, const struct ck_jin **root)
{
    struct parser ps = {text, text, text + len, NULL, 0};
    int err;
    *doc = NULL;
    if (!(ps.doc = calloc(1, sizeof *ps.doc)))
        return ck_error(CK_ENOMEM, "json: out of memory");
    struct ck_jin *v = arena(ps.doc, sizeof *v);
    if (!v) {
        ck_jin_free(ps.doc);
        return ck_error(CK_ENOMEM, "json: out of memory");
    }
    memset(v, 0, sizeof *v);
    if ((err = value(&ps, v)) < 0)
        goto out;
    skip_ws(&ps);
    if (ps.p != ps.end) {
        err = fail(&ps, "trailing characters");
        goto out;
    }
    *doc = ps.doc;
    *root = v;
    return 0;
out:
    ck_jin_free(ps.doc);
    return err;
}

void ck_jin_free(struct ck_jin_doc *doc)
{
    if (!doc)
        return;
    struct block *b = doc->blocks;
    while (b) {
        struct block *n = b->next;
        free(b);
        b = n;
    }
    free(doc);
}

const struct ck_jin *ck_jin_get(const struct ck_jin *v, const char *key)
{
    if (!v || v->type != CK_JIN_OBJECT)
        return NULL;
    size_t kl = strlen(key);
    for (const struct ck_jin *c = v->first; c; c = c->next)
        if (c->keylen == kl && !memcmp(c->key, key, kl))
            return c;
    return NULL;
}

bool ck_jin_uint(const struct ck_jin *v, uint64_t *out)
{
    uint64_t n = 0;
    if (!v || v->type != CK_JIN_NUMBER || !v->len)
        return false;
    for (size_t i = 0; i < v->len; i++) {
        char c = v->str[i];
        if (c < '0' || c > '9')
            return false;
        if (n > (UINT64_MAX - (uint64_t)(c - '0')) / 10)
            return false;
        n = n * 10 + (uint64_t)(c - '0');
    }
    *out = n;
    return true;
}
