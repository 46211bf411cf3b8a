#include "writers/pmf.h"
#include "common/error.h"
#include "common/yamlutil.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CHECKPOINTS 10000000

static const char *status_names[] = {"pending", "running", "finished", "failed"};

const char *ck_pmf_status_name(enum ck_pmf_status s)
{
    return status_names[s];
}

int ck_pmf_status_parse(const char *s, enum ck_pmf_status *out)
{
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, status_names[i])) {
            *out = (enum ck_pmf_status)i;
            return 0;
        }
    return CK_EFORMAT;
}

bool ck_pmf_md5_is_valid(const char *s)
{
    if (strlen(s) != 32)
        return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return false;
    return true;
}

bool ck_pmf_producer_name_is_valid(const char *s)
{
    size_t n = strlen(s);
    if (n < 2)
        return false;
    if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')))
        return false;
    for (size_t i = 1; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return false;
    }
    return true;
}

bool ck_pmf_ref_equal(const struct ck_pmf_ref *a, const struct ck_pmf_ref *b)
{
    if (a->is_int != b->is_int)
        return false;
    return a->is_int ? a->i == b->i : !strcmp(a->s, b->s);
}

int ck_pmf_ref_copy(struct ck_pmf_ref *dst, const struct ck_pmf_ref *src)
{
    dst->is_int = src->is_int;
    dst->i = src->i;
    dst->s = NULL;
    if (!src->is_int && !(dst->s = strdup(src->s)))
        return ck_error(CK_ENOMEM, "out of memory");
    return 0;
}

void ck_pmf_ref_release(struct ck_pmf_ref *r)
{
    free(r->s);
    r->s = NULL;
}

const char *ck_pmf_ref_str(const struct ck_pmf_ref *r, char *out, size_t outsz)
{
    if (r->is_int)
        snprintf(out, outsz, "%" PRId64, r->i);
    else
        snprintf(out, outsz, "%s", r->s);
    return out;
}

void ck_pmf_meta_init(struct ck_pmf_meta *m)
{
    memset(m, 0, sizeof *m);
}

static void init_release(struct ck_pmf_init *in)
{
    free(in->name);
    free(in->path);
    free(in->id);
    ck_pmf_ref_release(&in->checkpoint);
    memset(in, 0, sizeof *in);
}

void ck_pmf_meta_release(struct ck_pmf_meta *m)
{
    free(m->producer_name);
    free(m->producer_version_format);
    free(m->producer_version);
    free(m->name);
    free(m->id);
    free(m->config_path);
    init_release(&m->init);
    ck_pmf_ref_release(&m->latest);
    for (size_t i = 0; i < m->ncheckpoints; i++) {
        ck_pmf_ref_release(&m->checkpoints[i].ref);
        free(m->checkpoints[i].path);
    }
    free(m->checkpoints);
    memset(m, 0, sizeof *m);
}

/* ---- parsing ---- */

struct pctx {
    struct ck_yaml_doc *doc;
    const char *name;
};

#define fail(c, n, ...) ck_yaml_error_at((c)->name, (n), __VA_ARGS__)

/* Checks that map holds exactly the keys in names (each a string key, no
 * duplicates) and fills vals[i] with the value node of names[i]. */
static int exact_keys(struct pctx *c, yaml_node_t *map, const char *where,
                      const char *const *names, size_t n, yaml_node_t **vals)
{
    if (map->type != YAML_MAPPING_NODE)
        return fail(c, map, "'%s' must be a mapping", where);
    for (size_t i = 0; i < n; i++)
        vals[i] = NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = ck_yaml_node(c->doc, p->key);
        struct ck_yaml_value kv;
        ck_yaml_resolve(k, &kv);
        if (kv.type != CK_Y_STR)
            return fail(c, k, "unexpected key in '%s' (PMF allows no extra keys)", where);
        size_t i;
        for (i = 0; i < n; i++)
            if (!strcmp(names[i], kv.s))
                break;
        if (i == n)
            return fail(c, k, "unexpected key '%s' in '%s' (PMF allows no extra keys)", kv.s,
                        where);
        if (vals[i])
            return fail(c, k, "duplicate key '%s' in '%s'", kv.s, where);
        vals[i] = ck_yaml_node(c->doc, p->value);
    }
    for (size_t i = 0; i < n; i++)
        if (!vals[i])
            return fail(c, map, "'%s' is missing the key '%s'", where, names[i]);
    return 0;
}

static int get_str(struct pctx *c, yaml_node_t *n, const char *what, bool nullable, char **out)
{
    struct ck_yaml_value v;
    ck_yaml_resolve(n, &v);
    *out = NULL;
    if (v.type == CK_Y_NULL && nullable)
        return 0;
    if (v.type != CK_Y_STR)
        return fail(c, n, "'%s' must be a string%s, not %s", what, nullable ? " or null" : "",
                    ck_yaml_type_name(v.type));
    if (!(*out = strndup(v.s, v.len)))
        return ck_error(CK_ENOMEM, "out of memory");
    return 0;
}

static int get_path(struct pctx *c, yaml_node_t *n, const char *what, char **out)
{
    int err = get_str(c, n, what, false, out);
    if (err < 0)
        return err;
    if (!**out || memchr(*out, '\0', strlen(*out)))
        return fail(c, n, "'%s' must be a non-empty path", what);
    return 0;
}

static int get_md5(struct pctx *c, yaml_node_t *n, const char *what, char out[33])
{
    struct ck_yaml_value v;
    ck_yaml_resolve(n, &v);
    if (v.type != CK_Y_STR || v.len != 32 || !ck_pmf_md5_is_valid(v.s))
        return fail(c, n, "'%s' must be a lower-case hex MD5 (32 digits)", what);
    memcpy(out, v.s, 33);
    return 0;
}

static int get_ref(struct pctx *c, yaml_node_t *n, const char *what, struct ck_pmf_ref *out)
{
    struct ck_yaml_value v;
    ck_yaml_resolve(n, &v);
    memset(out, 0, sizeof *out);
    if (v.type == CK_Y_INT) {
        out->is_int = true;
        out->i = v.i;
        return 0;
    }
    if (v.type == CK_Y_STR) {
        if (!(out->s = strndup(v.s, v.len)))
            return ck_error(CK_ENOMEM, "out of memory");
        return 0;
    }
    return fail(c, n, "'%s' must be a string or an int, not %s", what, ck_yaml_type_name(v.type));
}

static int get_time(struct pctx *c, yaml_node_t *n, const char *what, struct ck_pmf_opt_time *out)
{
    struct ck_yaml_value v;
    ck_yaml_resolve(n, &v);
    out->set = true;
    if (v.type == CK_Y_NULL)
        out->set = false;
    else if (v.type == CK_Y_INT)
        out->v = (double)v.i;
    else if (v.type == CK_Y_FLOAT && isfinite(v.f))
        out->v = v.f;
    else
        return fail(c, n, "'%s' must be a number of seconds or null", what);
    return 0;
}

static int get_epoch(struct pctx *c, yaml_node_t *n, const char *what,
                     struct ck_pmf_opt_epoch *out)
{
    struct ck_yaml_value v;
    ck_yaml_resolve(n, &v);
    out->set = v.type != CK_Y_NULL;
    if (v.type == CK_Y_INT)
        out->v = v.i;
    else if (out->set)
        return fail(c, n, "'%s' must be an int or null (PMF rejects floats like 12.0)", what);
    return 0;
}

static int parse_format(struct pctx *c, yaml_node_t *n, struct ck_pmf_meta *m)
{
    static const char *const fk[] = {"version", "producer"};
    static const char *const pk[] = {"name", "version"};
    static const char *const vk[] = {"format", "value"};
    yaml_node_t *f[2], *p[2], *v[2];
    char *version = NULL;
    int err;
    if ((err = exact_keys(c, n, "format", fk, 2, f)) < 0)
        return err;
    if ((err = get_str(c, f[0], "format.version", false, &version)) < 0)
        return err;
    bool ok = !strcmp(version, "1.0.0");
    free(version);
    if (!ok)
        return fail(c, f[0], "'format.version' must be \"1.0.0\"");
    if ((err = exact_keys(c, f[1], "format.producer", pk, 2, p)) < 0 ||
        (err = get_str(c, p[0], "format.producer.name", false, &m->producer_name)) < 0)
        return err;
    if (!ck_pmf_producer_name_is_valid(m->producer_name))
        return fail(c, p[0], "'format.producer.name' must match ^[a-zA-Z][0-9a-zA-Z_]+$");
    if ((err = exact_keys(c, p[1], "format.producer.version", vk, 2, v)) < 0 ||
        (err = get_str(c, v[0], "format.producer.version.format", false,
                       &m->producer_version_format)) < 0 ||
        (err = get_str(c, v[1], "format.producer.version.value", false, &m->producer_version)) <
            0)
        return err;
    return 0;
}

static int parse_init(struct pctx *c, yaml_node_t *n, struct ck_pmf_init *in)
{
    static const char *const fk[] = {"name", "path", "hash"};
    static const char *const pk[] = {"name", "id", "path", "checkpoint"};
    struct ck_yaml_value v;
    yaml_node_t *vals[4];
    int err;
    ck_yaml_resolve(n, &v);
    if (v.type == CK_Y_NULL)
        return 0;
    if (n->type != YAML_MAPPING_NODE || n->data.mapping.pairs.top - n->data.mapping.pairs.start != 1)
        return fail(c, n, "'model.initialisation' must be null, {file: ...} or {pmf: ...}");
    yaml_node_pair_t *p = n->data.mapping.pairs.start;
    yaml_node_t *k = ck_yaml_node(c->doc, p->key), *body = ck_yaml_node(c->doc, p->value);
    ck_yaml_resolve(k, &v);
    if (v.type == CK_Y_STR && !strcmp(v.s, "file")) {
        in->kind = CK_PMF_INIT_FILE;
        if ((err = exact_keys(c, body, "model.initialisation.file", fk, 3, vals)) < 0 ||
            (err = get_str(c, vals[0], "initialisation.file.name", true, &in->name)) < 0 ||
            (err = get_path(c, vals[1], "initialisation.file.path", &in->path)) < 0 ||
            (err = get_md5(c, vals[2], "initialisation.file.hash", in->md5)) < 0)
            return err;
        return 0;
    }
    if (v.type == CK_Y_STR && !strcmp(v.s, "pmf")) {
        in->kind = CK_PMF_INIT_PMF;
        if ((err = exact_keys(c, body, "model.initialisation.pmf", pk, 4, vals)) < 0 ||
            (err = get_str(c, vals[0], "initialisation.pmf.name", true, &in->name)) < 0 ||
            (err = get_str(c, vals[1], "initialisation.pmf.id", false, &in->id)) < 0 ||
            (err = get_path(c, vals[2], "initialisation.pmf.path", &in->path)) < 0 ||
            (err = get_ref(c, vals[3], "initialisation.pmf.checkpoint", &in->checkpoint)) < 0)
            return err;
        return 0;
    }
    return fail(c, k, "'model.initialisation' must be null, {file: ...} or {pmf: ...}");
}

static int add_checkpoint(struct ck_pmf_meta *m, struct ck_pmf_checkpoint *cp)
{
    if (m->ncheckpoints == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 16;
        if (cap > MAX_CHECKPOINTS)
            return ck_error(CK_ESIZE, "more than %d checkpoints", MAX_CHECKPOINTS);
        void *p = realloc(m->checkpoints, cap * sizeof *m->checkpoints);
        if (!p)
            return ck_error(CK_ENOMEM, "out of memory");
        m->checkpoints = p;
        m->cap = cap;
    }
    m->checkpoints[m->ncheckpoints++] = *cp;
    return 0;
}

static int cmp_ref(const void *a, const void *b)
{
    const struct ck_pmf_ref *x = *(const struct ck_pmf_ref *const *)a;
    const struct ck_pmf_ref *y = *(const struct ck_pmf_ref *const *)b;
    if (x->is_int != y->is_int)
        return x->is_int ? -1 : 1;
    if (x->is_int)
        return x->i < y->i ? -1 : x->i > y->i;
    return strcmp(x->s, y->s);
}

/* Sorted, so that 10,000 checkpoints cost n log n comparisons, not n^2. */
static int check_duplicates(struct pctx *c, yaml_node_t *n, struct ck_pmf_meta *m)
{
    if (m->ncheckpoints < 2)
        return 0;
    const struct ck_pmf_ref **v = malloc(m->ncheckpoints * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < m->ncheckpoints; i++)
        v[i] = &m->checkpoints[i].ref;
    qsort(v, m->ncheckpoints, sizeof *v, cmp_ref);
    int err = 0;
    for (size_t i = 1; i < m->ncheckpoints && err == 0; i++)
        if (cmp_ref(&v[i - 1], &v[i]) == 0) {
            char txt[64];
            err = fail(c, n, "duplicate checkpoint reference '%s'",
                       ck_pmf_ref_str(v[i], txt, sizeof txt));
        }
    free(v);
    return err;
}

static int parse_checkpoints(struct pctx *c, yaml_node_t *n, struct ck_pmf_meta *m)
{
    static const char *const ck[] = {"epoch", "path", "hash"};
    if (n->type != YAML_MAPPING_NODE)
        return fail(c, n, "'model.training.checkpoints' must be a mapping ({} when empty, not null)");
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = ck_yaml_node(c->doc, p->key), *v = ck_yaml_node(c->doc, p->value);
        yaml_node_t *vals[3];
        struct ck_pmf_checkpoint cp;
        struct ck_pmf_opt_epoch e = {false, 0};
        int err;
        memset(&cp, 0, sizeof cp);
        if ((err = get_ref(c, k, "checkpoint reference", &cp.ref)) < 0)
            return err;
        if ((err = exact_keys(c, v, "checkpoint", ck, 3, vals)) < 0 ||
            (err = get_epoch(c, vals[0], "checkpoint epoch", &e)) < 0 ||
            (err = get_path(c, vals[1], "checkpoint path", &cp.path)) < 0 ||
            (err = get_md5(c, vals[2], "checkpoint hash", cp.md5)) < 0 ||
            (!e.set && (err = fail(c, vals[0], "a checkpoint needs an int epoch")) < 0) ||
            (err = add_checkpoint(m, &cp)) < 0) {
            ck_pmf_ref_release(&cp.ref);
            free(cp.path);
            return err;
        }
        m->checkpoints[m->ncheckpoints - 1].epoch = e.v;
    }
    return check_duplicates(c, n, m);
}

static int parse_training(struct pctx *c, yaml_node_t *n, struct ck_pmf_meta *m)
{
    static const char *const tk[] = {"status",      "start_time", "latest_time", "end_time",
                                     "start_epoch", "latest_epoch", "end_epoch", "latest",
                                     "checkpoints"};
    yaml_node_t *t[9];
    char *status = NULL;
    int err;
    if ((err = exact_keys(c, n, "model.training", tk, 9, t)) < 0 ||
        (err = get_str(c, t[0], "training.status", false, &status)) < 0)
        return err;
    err = ck_pmf_status_parse(status, &m->status);
    free(status);
    if (err < 0)
        return fail(c, t[0], "'training.status' must be pending, running, finished or failed");
    if ((err = get_time(c, t[1], "training.start_time", &m->start_time)) < 0 ||
        (err = get_time(c, t[2], "training.latest_time", &m->latest_time)) < 0 ||
        (err = get_time(c, t[3], "training.end_time", &m->end_time)) < 0 ||
        (err = get_epoch(c, t[4], "training.start_epoch", &m->start_epoch)) < 0 ||
        (err = get_epoch(c, t[5], "training.latest_epoch", &m->latest_epoch)) < 0 ||
        (err = get_epoch(c, t[6], "training.end_epoch", &m->end_epoch)) < 0)
        return err;
    struct ck_yaml_value v;
    ck_yaml_resolve(t[7], &v);
    if (v.type != CK_Y_NULL) {
        if ((err = get_ref(c, t[7], "training.latest", &m->latest)) < 0)
            return err;
        m->has_latest = true;
    }
    return parse_checkpoints(c, t[8], m);
}

static int parse_model(struct pctx *c, yaml_node_t *n, struct ck_pmf_meta *m)
{
    static const char *const mk[] = {"name", "id", "configuration", "initialisation", "training"};
    static const char *const ck[] = {"path", "hash"};
    yaml_node_t *f[5], *cf[2];
    int err;
    if ((err = exact_keys(c, n, "model", mk, 5, f)) < 0 ||
        (err = get_str(c, f[0], "model.name", true, &m->name)) < 0 ||
        (err = get_str(c, f[1], "model.id", false, &m->id)) < 0 ||
        (err = exact_keys(c, f[2], "model.configuration", ck, 2, cf)) < 0 ||
        (err = get_path(c, cf[0], "model.configuration.path", &m->config_path)) < 0 ||
        (err = get_md5(c, cf[1], "model.configuration.hash", m->config_md5)) < 0 ||
        (err = parse_init(c, f[3], &m->init)) < 0)
        return err;
    return parse_training(c, f[4], m);
}

int ck_pmf_parse(struct ck_pmf_meta *m, const char *name, const char *data, size_t len)
{
    static const char *const top[] = {"format", "model"};
    struct ck_yaml_doc doc;
    yaml_node_t *vals[2];
    struct pctx c = {&doc, name};
    int err;
    ck_pmf_meta_init(m);
    if ((err = ck_yaml_load(&doc, name, data, len)) < 0)
        return err;
    yaml_node_t *root = ck_yaml_root(&doc);
    if (!root)
        err = ck_error(CK_EFORMAT, "'%s' is empty: not a PMF metadata file", name);
    else if ((err = exact_keys(&c, root, "(top level)", top, 2, vals)) == 0 &&
             (err = parse_format(&c, vals[0], m)) == 0 && (err = parse_model(&c, vals[1], m)) == 0)
        err = ck_pmf_validate(m, name);
    ck_yaml_release(&doc);
    if (err < 0)
        ck_pmf_meta_release(m);
    return err;
}

/* ---- the cross-field rules (plums' Training.validate) ---- */

static int rule(const char *name, const char *msg)
{
    return ck_error(CK_EFORMAT, "'%s': training: %s", name, msg);
}

int ck_pmf_validate(const struct ck_pmf_meta *m, const char *name)
{
    const struct ck_pmf_opt_time *st = &m->start_time, *lt = &m->latest_time, *et = &m->end_time;
    const struct ck_pmf_opt_epoch *se = &m->start_epoch, *le = &m->latest_epoch,
                                  *ee = &m->end_epoch;
    if (et->set && (!st->set || !lt->set))
        return rule(name, "end_time needs start_time and latest_time");
    if (lt->set && !st->set)
        return rule(name, "latest_time needs start_time");
    if ((st->set && lt->set && st->v > lt->v) || (lt->set && et->set && lt->v > et->v))
        return rule(name, "times must satisfy start_time <= latest_time <= end_time");
    if (ee->set && (!se->set || !le->set))
        return rule(name, "end_epoch needs start_epoch and latest_epoch");
    if (le->set && !se->set)
        return rule(name, "latest_epoch needs start_epoch");
    if ((se->set && le->set && se->v > le->v) || (le->set && ee->set && le->v > ee->v))
        return rule(name, "epochs must satisfy start_epoch <= latest_epoch <= end_epoch");
    if (se->set != st->set || le->set != lt->set || ee->set != et->set)
        return rule(name, "each *_epoch needs its matching *_time and the other way round");
    if (m->status == CK_PMF_PENDING && (st->set || lt->set || et->set || se->set))
        return rule(name, "status pending forbids start, latest and end values");
    if (m->status == CK_PMF_RUNNING && (et->set || ee->set))
        return rule(name, "status running forbids end values");
    if (m->ncheckpoints > 0) {
        if (!m->has_latest || ck_pmf_find(m, &m->latest) < 0)
            return rule(name, "'latest' must be the reference of a registered checkpoint");
    }
    if (le->set)
        for (size_t i = 0; i < m->ncheckpoints; i++)
            if (m->checkpoints[i].epoch > le->v)
                return rule(name, "every checkpoint epoch must be <= latest_epoch");
    if (m->init.kind == CK_PMF_INIT_FILE && !ck_pmf_md5_is_valid(m->init.md5))
        return rule(name, "initialisation file hash is not an MD5");
    return 0;
}

/* ---- emitting ---- */

static void emit_ref(struct ck_yaml_out *o, const struct ck_pmf_ref *r)
{
    if (r->is_int)
        ck_yaml_int(o, r->i);
    else
        ck_yaml_str(o, r->s);
}

static void emit_time(struct ck_yaml_out *o, const char *key, const struct ck_pmf_opt_time *t)
{
    ck_yaml_str(o, key);
    if (t->set)
        ck_yaml_float(o, t->v);
    else
        ck_yaml_null(o);
}

static void emit_epoch(struct ck_yaml_out *o, const char *key, const struct ck_pmf_opt_epoch *e)
{
    ck_yaml_str(o, key);
    if (e->set)
        ck_yaml_int(o, e->v);
    else
        ck_yaml_null(o);
}

static void kv(struct ck_yaml_out *o, const char *k, const char *v)
{
    ck_yaml_str(o, k);
    ck_yaml_str(o, v);
}

static void emit_init(struct ck_yaml_out *o, const struct ck_pmf_init *in)
{
    ck_yaml_str(o, "initialisation");
    if (in->kind == CK_PMF_INIT_NONE) {
        ck_yaml_null(o);
        return;
    }
    ck_yaml_map_begin(o);
    ck_yaml_str(o, in->kind == CK_PMF_INIT_FILE ? "file" : "pmf");
    ck_yaml_map_begin(o);
    kv(o, "name", in->name);
    if (in->kind == CK_PMF_INIT_FILE) {
        kv(o, "path", in->path);
        kv(o, "hash", in->md5);
    } else {
        kv(o, "id", in->id);
        kv(o, "path", in->path);
        ck_yaml_str(o, "checkpoint");
        emit_ref(o, &in->checkpoint);
    }
    ck_yaml_map_end(o);
    ck_yaml_map_end(o);
}

/* The checkpoints can be written without libyaml's emitter: every
 * reference an int or a simple plain key, every path and hash simple plain
 * (the emitter writes each of those as it is). At 10,000 checkpoints the
 * emitter was a third of a new checkpoint's CPU in the watcher. */
static bool checkpoints_direct(const struct ck_pmf_meta *m)
{
    for (size_t i = 0; i < m->ncheckpoints; i++) {
        const struct ck_pmf_checkpoint *cp = &m->checkpoints[i];
        if (!cp->ref.is_int && (strlen(cp->ref.s) > 128 || !ck_yaml_simple_plain(cp->ref.s)))
            return false;
        if (!ck_yaml_simple_plain(cp->path) || !ck_yaml_simple_plain(cp->md5))
            return false;
    }
    return m->ncheckpoints > 0;
}

static int emit(const struct ck_pmf_meta *m, struct ck_buf *out, bool direct);

int ck_pmf_emit(const struct ck_pmf_meta *m, struct ck_buf *out)
{
    return emit(m, out, true);
}

int ck_pmf_emit_by_emitter(const struct ck_pmf_meta *m, struct ck_buf *out)
{
    return emit(m, out, false);
}

/* The last key of the file, as the emitter writes an empty one: the
 * checkpoints follow it when written directly. */
#define EMPTY_CHECKPOINTS "\n    checkpoints: {}\n"

static int emit(const struct ck_pmf_meta *m, struct ck_buf *out, bool direct)
{
    struct ck_yaml_out o;
    int err;
    direct = direct && checkpoints_direct(m);
    size_t start = out->len;
    if ((err = ck_pmf_validate(m, "metadata.yaml")) < 0)
        return err;
    if (!ck_pmf_producer_name_is_valid(m->producer_name))
        return ck_error(CK_EFORMAT, "producer name '%s' is not valid PMF", m->producer_name);
    if ((err = ck_yaml_out_begin(&o, out)) < 0)
        return err;
    ck_yaml_map_begin(&o);
    ck_yaml_str(&o, "format");
    ck_yaml_map_begin(&o);
    kv(&o, "version", "1.0.0");
    ck_yaml_str(&o, "producer");
    ck_yaml_map_begin(&o);
    kv(&o, "name", m->producer_name);
    ck_yaml_str(&o, "version");
    ck_yaml_map_begin(&o);
    kv(&o, "format", m->producer_version_format);
    kv(&o, "value", m->producer_version);
    ck_yaml_map_end(&o);
    ck_yaml_map_end(&o);
    ck_yaml_map_end(&o);

    ck_yaml_str(&o, "model");
    ck_yaml_map_begin(&o);
    kv(&o, "name", m->name);
    kv(&o, "id", m->id);
    ck_yaml_str(&o, "configuration");
    ck_yaml_map_begin(&o);
    kv(&o, "path", m->config_path);
    kv(&o, "hash", m->config_md5);
    ck_yaml_map_end(&o);
    emit_init(&o, &m->init);
    ck_yaml_str(&o, "training");
    ck_yaml_map_begin(&o);
    kv(&o, "status", status_names[m->status]);
    emit_time(&o, "start_time", &m->start_time);
    emit_time(&o, "latest_time", &m->latest_time);
    emit_time(&o, "end_time", &m->end_time);
    emit_epoch(&o, "start_epoch", &m->start_epoch);
    emit_epoch(&o, "latest_epoch", &m->latest_epoch);
    emit_epoch(&o, "end_epoch", &m->end_epoch);
    ck_yaml_str(&o, "latest");
    if (m->has_latest)
        emit_ref(&o, &m->latest);
    else
        ck_yaml_null(&o);
    ck_yaml_str(&o, "checkpoints");
    if (m->ncheckpoints == 0 || direct) {
        /* an empty block mapping is written as {} */
        ck_yaml_map_begin(&o);
        ck_yaml_map_end(&o);
    } else {
        ck_yaml_map_begin(&o);
        for (size_t i = 0; i < m->ncheckpoints; i++) {
            const struct ck_pmf_checkpoint *cp = &m->checkpoints[i];
            emit_ref(&o, &cp->ref);
            ck_yaml_map_begin(&o);
            ck_yaml_str(&o, "epoch");
            ck_yaml_int(&o, cp->epoch);
            kv(&o, "path", cp->path);
            kv(&o, "hash", cp->md5);
            ck_yaml_map_end(&o);
        }
        ck_yaml_map_end(&o);
    }
    ck_yaml_map_end(&o);
    ck_yaml_map_end(&o);
    ck_yaml_map_end(&o);
    if ((err = ck_yaml_out_end(&o)) < 0 || !direct)
        return err;
    /* the emitter's text up to "checkpoints:", then each checkpoint as the
     * emitter writes it (tests/unit/test_pmf.c compares the two) */
    size_t tl = strlen(EMPTY_CHECKPOINTS);
    if (out->len - start < tl || memcmp(out->data + out->len - tl, EMPTY_CHECKPOINTS, tl))
        return ck_error(CK_ERR, "metadata.yaml: the emitter's text does not end with its checkpoints");
    out->len -= 4; /* " {}\n" */
    out->data[out->len] = '\0';
    if ((err = ck_buf_putc(out, '\n')) < 0 || (err = ck_buf_reserve(out, m->ncheckpoints * 128)) < 0)
        return err;
    for (size_t i = 0; i < m->ncheckpoints && err == 0; i++) {
        const struct ck_pmf_checkpoint *cp = &m->checkpoints[i];
        if (cp->ref.is_int)
            err = ck_buf_printf(out, "      %" PRId64 ":\n", cp->ref.i);
        else
            err = ck_buf_printf(out, "      %s:\n", cp->ref.s);
        if (err == 0)
            err = ck_buf_printf(out, "        epoch: %" PRId64 "\n        path: %s\n        hash: %s\n",
                                cp->epoch, cp->path, cp->md5);
    }
    return err;
}

/* ---- changes ---- */

ptrdiff_t ck_pmf_find(const struct ck_pmf_meta *m, const struct ck_pmf_ref *ref)
{
    for (size_t i = 0; i < m->ncheckpoints; i++)
        if (ck_pmf_ref_equal(&m->checkpoints[i].ref, ref))
            return (ptrdiff_t)i;
    return -1;
}

int ck_pmf_register(struct ck_pmf_meta *m, const struct ck_pmf_ref *ref, int64_t epoch,
                    const char *path, const char *md5, double now, int64_t start_epoch)
{
    struct ck_pmf_checkpoint cp;
    char tmp[64];
    int err;
    if (ck_pmf_find(m, ref) >= 0)
        return ck_error(CK_EEXIST, "checkpoint '%s' is already registered",
                        ck_pmf_ref_str(ref, tmp, sizeof tmp));
    if (m->status == CK_PMF_FINISHED || m->status == CK_PMF_FAILED)
        return ck_error(CK_ESTATE, "cannot register checkpoint '%s': the training is %s",
                        ck_pmf_ref_str(ref, tmp, sizeof tmp), status_names[m->status]);
    if (!ck_pmf_md5_is_valid(md5))
        return ck_error(CK_EFORMAT, "'%s' is not an MD5", md5);
    memset(&cp, 0, sizeof cp);
    if ((err = ck_pmf_ref_copy(&cp.ref, ref)) < 0)
        return err;
    cp.epoch = epoch;
    memcpy(cp.md5, md5, 33);
    if (!(cp.path = strdup(path)) || (err = add_checkpoint(m, &cp)) < 0) {
        ck_pmf_ref_release(&cp.ref);
        free(cp.path);
        return cp.path ? err : ck_error(CK_ENOMEM, "out of memory");
    }
    if (m->status == CK_PMF_PENDING) {
        m->status = CK_PMF_RUNNING;
        m->start_time = (struct ck_pmf_opt_time){true, now};
        m->start_epoch = (struct ck_pmf_opt_epoch){true, start_epoch < epoch ? start_epoch : epoch};
    }
    /* latest_epoch is the highest epoch seen (plums: max), latest_time only moves forward. */
    if (!m->latest_epoch.set || epoch > m->latest_epoch.v)
        m->latest_epoch = (struct ck_pmf_opt_epoch){true, epoch};
    if (!m->latest_time.set || now > m->latest_time.v)
        m->latest_time = (struct ck_pmf_opt_time){true, now};
    if (m->start_epoch.v > m->latest_epoch.v)
        m->start_epoch.v = m->latest_epoch.v;
    ck_pmf_ref_release(&m->latest);
    m->has_latest = true;
    return ck_pmf_ref_copy(&m->latest, ref);
}

int ck_pmf_unregister(struct ck_pmf_meta *m, size_t index)
{
    if (index >= m->ncheckpoints)
        return ck_error(CK_ENOENT, "no checkpoint at index %zu", index);
    bool was_latest = m->has_latest && ck_pmf_ref_equal(&m->latest, &m->checkpoints[index].ref);
    ck_pmf_ref_release(&m->checkpoints[index].ref);
    free(m->checkpoints[index].path);
    memmove(&m->checkpoints[index], &m->checkpoints[index + 1],
            (m->ncheckpoints - index - 1) * sizeof *m->checkpoints);
    m->ncheckpoints--;
    if (was_latest) {
        ck_pmf_ref_release(&m->latest);
        m->has_latest = m->ncheckpoints > 0;
        if (m->has_latest)
            return ck_pmf_ref_copy(&m->latest, &m->checkpoints[m->ncheckpoints - 1].ref);
    }
    return 0;
}

int ck_pmf_set_status(struct ck_pmf_meta *m, enum ck_pmf_status to, double now)
{
    enum ck_pmf_status from = m->status;
    if (from == to)
        return 0;
    if (to == CK_PMF_PENDING)
        return ck_error(CK_ESTATE, "training cannot go back to pending (it is %s)",
                        status_names[from]);
    if (from == CK_PMF_FINISHED || from == CK_PMF_FAILED)
        return ck_error(CK_ESTATE, "training already ended as %s; PMF forbids changing it to %s",
                        status_names[from], status_names[to]);
    if (from == CK_PMF_PENDING && to == CK_PMF_FINISHED)
        return ck_error(CK_ESTATE, "training cannot be finished before it started: "
                                   "no checkpoint was registered (PMF forbids pending -> finished)");
    if (to == CK_PMF_RUNNING) {
        m->status = CK_PMF_RUNNING;
        if (!m->start_time.set) {
            m->start_time = (struct ck_pmf_opt_time){true, now};
            m->latest_time = m->start_time;
            m->start_epoch = (struct ck_pmf_opt_epoch){true, 0};
            m->latest_epoch = m->start_epoch;
        }
        return 0;
    }
    /* finished or failed: plums copies latest into end. */
    m->status = to;
    m->end_time = m->latest_time;
    m->end_epoch = m->latest_epoch;
    if (m->latest_time.set && now > m->latest_time.v) {
        m->latest_time.v = now;
        m->end_time.v = now;
    }
    return 0;
}
