#include "common/yamlutil.h"
#include "common/error.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <search.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* PyYAML's implicit resolvers (resolver.py), as POSIX extended regexes. */
static const char *re_src[] = {
    /* bool */
    "^(yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$",
    /* float */
    "^([-+]?([0-9][0-9_]*)\\.[0-9_]*([eE][-+][0-9]+)?|\\.[0-9_]+([eE][-+][0-9]+)?"
    "|[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\\.[0-9_]*|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN))$",
    /* int */
    "^([-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+"
    "|[-+]?[1-9][0-9_]*(:[0-5]?[0-9])+)$",
    /* null */
    "^(~|null|Null|NULL|)$",
    /* timestamp */
    "^([0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?"
    "([Tt]|[ \t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9](\\.[0-9]*)?([ \t]*(Z|[-+][0-9][0-9]?(:[0-9][0-9])?))?)$",
    /* merge and value keys */
    "^(<<|=)$",
};
enum { RE_BOOL, RE_FLOAT, RE_INT, RE_NULL, RE_TIME, RE_OTHER, RE_COUNT };
static regex_t re[RE_COUNT];
static pthread_once_t re_once = PTHREAD_ONCE_INIT;

static void re_init(void)
{
    for (int i = 0; i < RE_COUNT; i++)
        if (regcomp(&re[i], re_src[i], REG_EXTENDED | REG_NOSUB) != 0)
            abort(); /* a bug in the patterns above, not a runtime condition */
}

static bool matches(int which, const char *s)
{
    return regexec(&re[which], s, 0, NULL, 0) == 0;
}

const char *ck_yaml_type_name(enum ck_yaml_type t)
{
    static const char *names[] = {"null", "bool", "int", "float", "str", "other", "mapping",
                                  "sequence"};
    return names[t];
}

/* Sexagesimal and underscored forms: strip '_' then fold "a:b:c" base 60. */
static bool parse_int(const char *s, int64_t *out)
{
    char tmp[128];
    size_t n = 0;
    for (const char *p = s; *p; p++)
        if (*p != '_') {
            if (n + 1 >= sizeof tmp)
                return false;
            tmp[n++] = *p;
        }
    tmp[n] = '\0';
    const char *p = tmp;
    int sign = 1;
    if (*p == '-' || *p == '+') {
        sign = *p == '-' ? -1 : 1;
        p++;
    }
    errno = 0;
    long long v;
    char *end;
    if (strchr(p, ':')) {
        v = 0;
        for (char *tok = strtok(tmp + (p - tmp), ":"); tok; tok = strtok(NULL, ":")) {
            long long d = strtoll(tok, NULL, 10);
            if (v > (INT64_MAX - d) / 60)
                return false;
            v = v * 60 + d;
        }
    } else if (!strncmp(p, "0b", 2)) {
        v = strtoll(p + 2, &end, 2);
    } else if (!strncmp(p, "0x", 2)) {
        v = strtoll(p + 2, &end, 16);
    } else if (p[0] == '0' && p[1]) {
        v = strtoll(p + 1, &end, 8);
    } else {
        v = strtoll(p, &end, 10);
    }
    if (errno == ERANGE)
        return false;
    *out = sign * v;
    return true;
}

static double parse_float(const char *s)
{
    char tmp[128];
    size_t n = 0;
    for (const char *p = s; *p && n + 1 < sizeof tmp; p++)
        if (*p != '_')
            tmp[n++] = *p;
    tmp[n] = '\0';
    const char *p = tmp;
    double sign = 1;
    if (*p == '-' || *p == '+') {
        sign = *p == '-' ? -1 : 1;
        p++;
    }
    if (!strcasecmp(p, ".inf"))
        return sign * INFINITY;
    if (!strcasecmp(p, ".nan"))
        return NAN;
    if (strchr(p, ':')) {
        double v = 0;
        char *save = NULL;
        for (char *tok = strtok_r((char *)p, ":", &save); tok; tok = strtok_r(NULL, ":", &save))
            v = v * 60 + strtod(tok, NULL);
        return sign * v;
    }
    return sign * strtod(p, NULL);
}

enum ck_yaml_type ck_yaml_plain_type(const char *s, size_t len)
{
    /* Every non-string form starts with one of these characters (null, bool,
     * int, float, timestamp, merge/value); anything else is a string without
     * running the patterns. */
    if (len > 0 && !strchr("0123456789+-.~<=yYnNtTfFoO", s[0]))
        return CK_Y_STR;
    /* A digest, an id or a step name that starts with a digit: with a digit
     * first, a float needs '.', a sexagesimal ':', a timestamp '-', a binary
     * or hex int "0b"/"0x", and every other int is digits and '_' only. So
     * without those, a character outside [0-9_] makes it a string (the
     * patterns were most of the cost of writing a large metadata.yaml). */
    if (len > 1 && s[0] >= '0' && s[0] <= '9' && s[1] != 'b' && s[1] != 'x' &&
        !memchr(s, '.', len) && !memchr(s, ':', len) && !memchr(s, '-', len))
        for (size_t i = 1; i < len; i++)
            if (!(s[i] >= '0' && s[i] <= '9') && s[i] != '_')
                return CK_Y_STR;
    pthread_once(&re_once, re_init);
    if (memchr(s, '\0', len) || len > 256)
        return CK_Y_STR;
    char tmp[257];
    memcpy(tmp, s, len);
    tmp[len] = '\0';
    if (matches(RE_BOOL, tmp))
        return CK_Y_BOOL;
    if (matches(RE_FLOAT, tmp))
        return CK_Y_FLOAT;
    if (matches(RE_INT, tmp))
        return CK_Y_INT;
    if (matches(RE_NULL, tmp))
        return CK_Y_NULL;
    if (matches(RE_TIME, tmp) || matches(RE_OTHER, tmp))
        return CK_Y_OTHER;
    return CK_Y_STR;
}

bool ck_yaml_simple_plain(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 256)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!alnum && !(c == '_' || (i > 0 && (c == '.' || c == '/' || c == '-'))))
            return false;
    }
    return ck_yaml_plain_type(s, n) == CK_Y_STR;
}

void ck_yaml_resolve(const yaml_node_t *n, struct ck_yaml_value *out)
{
    memset(out, 0, sizeof *out);
    if (n->type == YAML_MAPPING_NODE) {
        out->type = CK_Y_MAP;
        return;
    }
    if (n->type == YAML_SEQUENCE_NODE) {
        out->type = CK_Y_SEQ;
        return;
    }
    out->s = (const char *)n->data.scalar.value;
    out->len = n->data.scalar.length;
    const char *tag = (const char *)n->tag;
    enum ck_yaml_type t;
    if (tag && strcmp(tag, YAML_STR_TAG) && strcmp(tag, "!")) {
        /* An explicit tag: honour the core ones. libyaml puts the default
         * str tag on untagged scalars, so only explicit non-str tags land here. */
        if (!strcmp(tag, YAML_INT_TAG))
            t = CK_Y_INT;
        else if (!strcmp(tag, YAML_FLOAT_TAG))
            t = CK_Y_FLOAT;
        else if (!strcmp(tag, YAML_BOOL_TAG))
            t = CK_Y_BOOL;
        else if (!strcmp(tag, YAML_NULL_TAG))
            t = CK_Y_NULL;
        else
            t = CK_Y_OTHER;
    } else if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
        t = CK_Y_STR;
    } else {
        t = ck_yaml_plain_type(out->s, out->len);
    }
    out->type = t;
    if (t == CK_Y_BOOL)
        out->b = strchr("yYtTo", out->s[0]) && strcasecmp(out->s, "off");
    if (t == CK_Y_INT && !parse_int(out->s, &out->i))
        out->type = CK_Y_OTHER;
    if (t == CK_Y_FLOAT)
        out->f = parse_float(out->s);
}

/* One anchor's size: the nodes its alias stands for when expanded. */
struct anchor_size {
    char *name;
    uint64_t nodes;
};

static int anchor_cmp(const void *a, const void *b)
{
    return strcmp(((const struct anchor_size *)a)->name, ((const struct anchor_size *)b)->name);
}

static void anchor_free(void *a)
{
    free(((struct anchor_size *)a)->name);
    free(a);
}

/* Records (or, for an anchor defined again, updates) what anchor expands to. */
static int anchor_put(void **root, const unsigned char *anchor, uint64_t nodes)
{
    struct anchor_size *a = calloc(1, sizeof *a);
    if (!a || !(a->name = strdup((const char *)anchor))) {
        free(a);
        return -1;
    }
    a->nodes = nodes;
    struct anchor_size **slot = tsearch(a, root, anchor_cmp);
    if (!slot) {
        anchor_free(a);
        return -1;
    }
    if (*slot != a) {
        (*slot)->nodes = nodes;
        anchor_free(a);
    }
    return 0;
}

static uint64_t anchor_nodes(void *const *root, const unsigned char *anchor)
{
    struct anchor_size key = {(char *)anchor, 0};
    struct anchor_size **a = tfind(&key, root, anchor_cmp);
    return a ? (*a)->nodes : 1; /* an undefined alias: the load words that error */
}

/* Refuses, from libyaml's events and before the document is built, what would
 * make a linear walk of it costly:
 * - nesting deeper than CK_YAML_MAX_DEPTH: libyaml's scanner checks every open
 *   flow level on every token, so 100k nested brackets (200 KB) cost minutes;
 * - aliases that expand past CK_YAML_MAX_NODES nodes: libyaml shares an
 *   aliased node, but every reader of ours walks it once per alias, so nine
 *   lines of nested aliases ("billion laughs") would be walked 10^9 times.
 * Each anchor's expanded size is counted as its node closes, so the pass costs
 * a fixed amount per event. A syntax error is left to the load, which words it. */
static int size_check(const char *name, const char *data, size_t len)
{
    yaml_parser_t p;
    yaml_event_t ev;
    struct {
        uint64_t nodes;
        unsigned char *anchor; /* owned */
    } open[CK_YAML_MAX_DEPTH + 1] = {{0, NULL}};
    void *anchors = NULL;
    int depth = 0, err = 0;
    uint64_t total = 0;
    if (!yaml_parser_initialize(&p))
        return ck_error(CK_ENOMEM, "out of memory parsing '%s'", name);
    yaml_parser_set_input_string(&p, (const unsigned char *)data, len);
    for (bool done = false; !done && yaml_parser_parse(&p, &ev);) {
        uint64_t add = 0; /* nodes this event adds to the open collection */
        done = ev.type == YAML_STREAM_END_EVENT;
        switch (ev.type) {
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT: {
            const unsigned char *anchor = ev.type == YAML_SEQUENCE_START_EVENT
                                              ? ev.data.sequence_start.anchor
                                              : ev.data.mapping_start.anchor;
            if (++depth > CK_YAML_MAX_DEPTH) {
                err = ck_error(CK_EFORMAT,
                               "cannot parse '%s' line %zu column %zu: nested more than %d deep",
                               name, ev.start_mark.line + 1, ev.start_mark.column + 1,
                               CK_YAML_MAX_DEPTH);
                done = true;
                depth--;
                break;
            }
            open[depth].nodes = 1;
            open[depth].anchor = anchor ? (unsigned char *)strdup((const char *)anchor) : NULL;
            if (anchor && !open[depth].anchor)
                err = ck_error(CK_ENOMEM, "out of memory parsing '%s'", name), done = true;
            total++;
            break;
        }
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            if (depth > 0) {
                add = open[depth].nodes;
                if (open[depth].anchor && anchor_put(&anchors, open[depth].anchor, add) < 0)
                    err = ck_error(CK_ENOMEM, "out of memory parsing '%s'", name), done = true;
                free(open[depth].anchor);
                open[depth].anchor = NULL;
                depth--;
            }
            break;
        case YAML_SCALAR_EVENT:
            add = 1;
            total++;
            if (ev.data.scalar.anchor && anchor_put(&anchors, ev.data.scalar.anchor, 1) < 0)
                err = ck_error(CK_ENOMEM, "out of memory parsing '%s'", name), done = true;
            break;
        case YAML_ALIAS_EVENT:
            add = anchor_nodes(&anchors, ev.data.alias.anchor);
            total += add;
            break;
        default:
            break;
        }
        if (depth > 0 && add) /* sizes only grow: each is at most total */
            open[depth].nodes += add;
        if (!err && total > CK_YAML_MAX_NODES) {
            err = ck_error(CK_EFORMAT,
                           "cannot parse '%s' line %zu column %zu: its aliases expand past %d "
                           "nodes",
                           name, ev.start_mark.line + 1, ev.start_mark.column + 1,
                           CK_YAML_MAX_NODES);
            done = true;
        }
        yaml_event_delete(&ev);
    }
    for (int i = 0; i <= CK_YAML_MAX_DEPTH; i++)
        free(open[i].anchor);
    tdestroy(anchors, anchor_free);
    yaml_parser_delete(&p);
    return err;
}

int ck_yaml_load(struct ck_yaml_doc *d, const char *name, const char *data, size_t len)
{
    yaml_parser_t p;
    int err = 0;
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name);
    if ((err = size_check(name, data, len)) < 0)
        return err;
    if (!yaml_parser_initialize(&p))
        return ck_error(CK_ENOMEM, "out of memory parsing '%s'", name);
    yaml_parser_set_input_string(&p, (const unsigned char *)data, len);
    if (!yaml_parser_load(&p, &d->doc)) {
        const char *problem = p.problem ? p.problem : "not valid YAML";
        err = ck_error(CK_EFORMAT, "cannot parse '%s' line %zu column %zu: %s", name,
                       p.problem_mark.line + 1, p.problem_mark.column + 1, problem);
        yaml_parser_delete(&p);
        return err;
    }
    d->loaded = true;
    /* A second document in the same file is not something we write or accept. */
    yaml_document_t extra;
    if (yaml_parser_load(&p, &extra)) {
        bool more = yaml_document_get_root_node(&extra) != NULL;
        size_t line = p.mark.line + 1;
        yaml_document_delete(&extra);
        if (more)
            err = ck_error(CK_EFORMAT, "cannot parse '%s' line %zu: more than one YAML document",
                           name, line);
    }
    yaml_parser_delete(&p);
    if (err < 0)
        ck_yaml_release(d);
    return err;
}

void ck_yaml_release(struct ck_yaml_doc *d)
{
    if (d->loaded)
        yaml_document_delete(&d->doc);
    d->loaded = false;
}

yaml_node_t *ck_yaml_root(struct ck_yaml_doc *d)
{
    return d->loaded ? yaml_document_get_root_node(&d->doc) : NULL;
}

yaml_node_t *ck_yaml_node(struct ck_yaml_doc *d, int id)
{
    return yaml_document_get_node(&d->doc, id);
}

int ck_yaml_line(const yaml_node_t *n)
{
    return (int)n->start_mark.line + 1;
}

int ck_yaml_error_at(const char *name, const yaml_node_t *n, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ck_error(CK_EFORMAT, "'%s' line %d: %s", name, n ? ck_yaml_line(n) : 1, msg);
}

/* ---- emitting ---- */

static int write_handler(void *data, unsigned char *buffer, size_t size)
{
    struct ck_yaml_out *o = data;
    if (ck_buf_append(o->buf, buffer, size) < 0) {
        o->err = CK_ENOMEM;
        return 0;
    }
    return 1;
}

static void emit(struct ck_yaml_out *o, yaml_event_t *ev)
{
    if (o->err) {
        yaml_event_delete(ev);
        return;
    }
    if (!yaml_emitter_emit(&o->em, ev))
        o->err = ck_error(CK_ERR, "cannot write YAML: %s",
                          o->em.problem ? o->em.problem : "emitter error");
}

int ck_yaml_out_begin(struct ck_yaml_out *o, struct ck_buf *buf)
{
    yaml_event_t ev;
    memset(o, 0, sizeof *o);
    o->buf = buf;
    if (!yaml_emitter_initialize(&o->em))
        return ck_error(CK_ENOMEM, "out of memory");
    yaml_emitter_set_output(&o->em, write_handler, o);
    yaml_emitter_set_unicode(&o->em, 1);
    yaml_emitter_set_indent(&o->em, 2);
    yaml_emitter_set_width(&o->em, -1);
    yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING);
    emit(o, &ev);
    yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1);
    emit(o, &ev);
    return o->err;
}

int ck_yaml_out_end(struct ck_yaml_out *o)
{
    yaml_event_t ev;
    yaml_document_end_event_initialize(&ev, 1);
    emit(o, &ev);
    yaml_stream_end_event_initialize(&ev);
    emit(o, &ev);
    if (!o->err && !yaml_emitter_flush(&o->em))
        o->err = ck_error(CK_ERR, "cannot write YAML");
    yaml_emitter_delete(&o->em);
    return o->err;
}

void ck_yaml_map_begin(struct ck_yaml_out *o)
{
    yaml_event_t ev;
    yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE);
    emit(o, &ev);
}

void ck_yaml_map_end(struct ck_yaml_out *o)
{
    yaml_event_t ev;
    yaml_mapping_end_event_initialize(&ev);
    emit(o, &ev);
}

void ck_yaml_seq_begin(struct ck_yaml_out *o)
{
    yaml_event_t ev;
    yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_SEQUENCE_STYLE);
    emit(o, &ev);
}

void ck_yaml_seq_end(struct ck_yaml_out *o)
{
    yaml_event_t ev;
    yaml_sequence_end_event_initialize(&ev);
    emit(o, &ev);
}

static void scalar(struct ck_yaml_out *o, const char *s, yaml_scalar_style_t style)
{
    yaml_event_t ev;
    if (o->err)
        return;
    if (!yaml_scalar_event_initialize(&ev, NULL, NULL, (const yaml_char_t *)s, (int)strlen(s), 1,
                                      1, style)) {
        o->err = ck_error(CK_ENOMEM, "out of memory");
        return;
    }
    emit(o, &ev);
}

void ck_yaml_str(struct ck_yaml_out *o, const char *s)
{
    if (!s) {
        ck_yaml_null(o);
        return;
    }
    bool plain_ok = ck_yaml_plain_type(s, strlen(s)) == CK_Y_STR;
    scalar(o, s, plain_ok ? YAML_ANY_SCALAR_STYLE : YAML_SINGLE_QUOTED_SCALAR_STYLE);
}

void ck_yaml_int(struct ck_yaml_out *o, int64_t v)
{
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%" PRId64, v);
    scalar(o, tmp, YAML_PLAIN_SCALAR_STYLE);
}

void ck_yaml_float(struct ck_yaml_out *o, double v)
{
    char tmp[64];
    /* Microseconds, like Python's time.time(); always with a '.' so that
     * YAML 1.1 reads it back as a float. */
    snprintf(tmp, sizeof tmp, "%.6f", v);
    if (!strchr(tmp, '.'))
        strcat(tmp, ".0");
    scalar(o, tmp, YAML_PLAIN_SCALAR_STYLE);
}

void ck_yaml_bool(struct ck_yaml_out *o, bool v)
{
    scalar(o, v ? "true" : "false", YAML_PLAIN_SCALAR_STYLE);
}

void ck_yaml_null(struct ck_yaml_out *o)
{
    scalar(o, "null", YAML_PLAIN_SCALAR_STYLE);
}

void ck_yaml_copy(struct ck_yaml_out *o, struct ck_yaml_doc *d, yaml_node_t *n)
{
    yaml_event_t ev;
    if (o->err || !n)
        return;
    switch (n->type) {
    case YAML_SCALAR_NODE: {
        bool plain = n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        if (!yaml_scalar_event_initialize(&ev, NULL, NULL, n->data.scalar.value,
                                          (int)n->data.scalar.length, plain, !plain,
                                          n->data.scalar.style)) {
            o->err = ck_error(CK_ENOMEM, "out of memory");
            return;
        }
        emit(o, &ev);
        break;
    }
    case YAML_SEQUENCE_NODE:
        ck_yaml_seq_begin(o);
        for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
             it++)
            ck_yaml_copy(o, d, ck_yaml_node(d, *it));
        ck_yaml_seq_end(o);
        break;
    case YAML_MAPPING_NODE:
        ck_yaml_map_begin(o);
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
             p++) {
            ck_yaml_copy(o, d, ck_yaml_node(d, p->key));
            ck_yaml_copy(o, d, ck_yaml_node(d, p->value));
        }
        ck_yaml_map_end(o);
        break;
    default:
        break;
    }
}
