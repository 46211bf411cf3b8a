/* The SameDiff tagged archive: tags.txt plus, per tag, graph.fb, params.txt
 * + params/N.fb, trainingConfig.fb (ADR 0001; FORMAT-FACTS.md section 3).
 * A parameter whose FlatArray is byte-identical to a file an earlier tag
 * stored is not stored again: params.txt says "<name> <thattag>/<N>". */
#include "writers/samediff.h"

#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "model/dl4jops.h"
#include "model/optstate.h"
#include "writers/fbbuild.h"
#include "writers/sdarray.h"
#include "writers/sdgraph.h"
#include "writers/zipapp.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "common/crc32.h"

#define SD_MAX_TEXT (1u << 24)

/* A params file an earlier tag stored: a candidate for sharing. */
struct stored {
    size_t ent; /* index into z.ents (by index: ents may move) */
    size_t tag; /* index into tags */
    unsigned num;
    bool updater; /* <tag>/updater/N.fb rather than <tag>/params/N.fb */
};

struct sd_writer {
    struct ck_writer base;
    struct ck_zipapp z;
    bool open;
    struct ck_writer_opts o;
    char *tagopt, *ref, *dtype; /* owned copies of o's strings */
    char **tags;                /* owned: tags.txt, oldest first */
    size_t ntags, captags;
    size_t *byname; /* owned: the indexes of tags read from tags.txt, sorted by name, case
                       folded (nbyname of them) */
    size_t nbyname;
    struct stored *stored;
    size_t nstored;
    bool added;
    struct ck_samediff_result res;
};

static int push_tag(struct sd_writer *w, const char *tag, size_t len)
{
    if (w->ntags == w->captags) { /* doubling: no copy of the list per tag */
        size_t cap = w->captags ? 2 * w->captags : 16;
        char **n = realloc(w->tags, cap * sizeof(*n));
        if (!n)
            return ck_error(CK_ENOMEM, "out of memory for %zu tags", cap);
        w->tags = n;
        w->captags = cap;
    }
    if (!(w->tags[w->ntags] = strndup(tag, len)))
        return ck_error(CK_ENOMEM, "out of memory");
    w->ntags++;
    return 0;
}

/* tag[0..len) against the NUL-terminated t, case folded, in strcasecmp's order */
static int tag_cmp(const char *t, const char *tag, size_t len)
{
    int c = strncasecmp(t, tag, len);
    return c ? c : t[len] ? 1 : 0;
}

static const struct sd_writer *sort_w; /* qsort has no argument: set around the call */

static int byname_cmp(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    int c = strcasecmp(sort_w->tags[x], sort_w->tags[y]);
    return c ? c : (x > y) - (x < y);
}

/* A binary search over the tags read from tags.txt, a scan over the few
 * added since: a 100k-line tags.txt costs n log n, not n^2. */
static ssize_t find_tag(const struct sd_writer *w, const char *tag, size_t len)
{
    size_t lo = 0, hi = w->nbyname;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = tag_cmp(w->tags[w->byname[mid]], tag, len);
        if (c == 0)
            return (ssize_t)w->byname[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = w->nbyname; i < w->ntags; i++)
        if (!tag_cmp(w->tags[i], tag, len))
            return (ssize_t)i;
    return -1;
}

/* Sorts the tags read so far into byname; CK_EFORMAT naming a tag listed twice. */
static int index_tags(struct sd_writer *w, const unsigned *lines)
{
    free(w->byname);
    w->nbyname = 0;
    if (!(w->byname = malloc((w->ntags ? w->ntags : 1) * sizeof *w->byname)))
        return ck_error(CK_ENOMEM, "out of memory for %zu tags", w->ntags);
    for (size_t i = 0; i < w->ntags; i++)
        w->byname[i] = i;
    sort_w = w;
    qsort(w->byname, w->ntags, sizeof *w->byname, byname_cmp);
    sort_w = NULL;
    for (size_t i = 1; i < w->ntags; i++)
        if (!strcasecmp(w->tags[w->byname[i - 1]], w->tags[w->byname[i]])) {
            size_t k = w->byname[i];
            return ck_error(CK_EFORMAT, "'%s': tags.txt line %u: tag '%s' appears twice",
                            w->z.path, lines[k], w->tags[k]);
        }
    w->nbyname = w->ntags;
    return 0;
}

static int read_tags(struct sd_writer *w)
{
    struct ck_zipapp *z = &w->z;
    struct ck_zipapp_entry *e = ck_zipapp_find(z, "tags.txt");
    struct ck_buf b = CK_BUF_INIT;
    int err;
    if (!e)
        return ck_error(CK_EFORMAT, "'%s': a zip without tags.txt is not a SameDiff archive",
                        z->path);
    ck_buf_init(&b, SD_MAX_TEXT + 1);
    unsigned *lines = NULL; /* each tag's line number, for the message */
    size_t caplines = 0;
    if ((err = ck_zipapp_read(z, e, SD_MAX_TEXT, &b)) < 0)
        goto out;
    unsigned lineno = 0;
    for (char *p = b.data, *end = b.data + b.len; p && p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = (size_t)((nl ? nl : end) - p);
        lineno++;
        if (len && p[len - 1] == '\r')
            len--;
        if (len) {
            char tag[CK_SD_TAG_MAX + 1];
            snprintf(tag, sizeof(tag), "%.*s", (int)(len > CK_SD_TAG_MAX ? 0 : len), p);
            if (len > CK_SD_TAG_MAX || strlen(tag) != len || !ck_sd_tag_is_valid(tag)) {
                err = ck_error(CK_EFORMAT, "'%s': tags.txt line %u is not a valid tag", z->path,
                               lineno);
                goto out;
            }
            if (w->ntags == caplines) {
                size_t cap = caplines ? 2 * caplines : 16;
                unsigned *nl2 = realloc(lines, cap * sizeof *lines);
                if (!nl2) {
                    err = ck_error(CK_ENOMEM, "out of memory for %zu tags", cap);
                    goto out;
                }
                lines = nl2;
                caplines = cap;
            }
            lines[w->ntags] = lineno;
            if ((err = push_tag(w, p, len)) < 0)
                goto out;
        }
        p = nl ? nl + 1 : end;
    }
    err = index_tags(w, lines);
out:
    free(lines);
    ck_buf_release(&b);
    return err;
}

/* Every member belongs to a listed tag; every tag has its graph; collects
 * the params files earlier tags stored. */
static int check_members(struct sd_writer *w)
{
    struct ck_zipapp *z = &w->z;
    bool *has_graph = calloc(w->ntags ? w->ntags : 1, 1);
    int err = 0;
    if (!has_graph)
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < z->nents && err >= 0; i++) {
        struct ck_zipapp_entry *e = &z->ents[i];
        if (e->dropped || !strcmp(e->name, "tags.txt"))
            continue;
        const char *slash = strchr(e->name, '/');
        ssize_t t = slash ? find_tag(w, e->name, (size_t)(slash - e->name)) : -1;
        if (t < 0 || strncmp(w->tags[t], e->name, (size_t)(slash - e->name))) {
            err = ck_error(CK_EFORMAT, "'%s': member '%s' is not under a tag tags.txt lists",
                           z->path, e->name);
            break;
        }
        const char *rest = slash + 1;
        unsigned num;
        int used = 0;
        if (!strcmp(rest, "graph.fb"))
            has_graph[t] = true;
        else if ((sscanf(rest, "params/%9u.fb%n", &num, &used) == 1 && rest[used] == 0) ||
                 (sscanf(rest, "updater/%9u.fb%n", &num, &used) == 1 && rest[used] == 0)) {
            struct stored *n = realloc(w->stored, (w->nstored + 1) * sizeof(*n));
            if (!n) {
                err = ck_error(CK_ENOMEM, "out of memory");
                break;
            }
            w->stored = n;
            w->stored[w->nstored++] = (struct stored){i, (size_t)t, num, rest[0] == 'u'};
        }
    }
    for (size_t t = 0; t < w->ntags && err >= 0; t++)
        if (!has_graph[t])
            err = ck_error(CK_EFORMAT, "'%s': tags.txt lists '%s' but '%s/graph.fb' is missing",
                           z->path, w->tags[t], w->tags[t]);
    free(has_graph);
    return err;
}

static int sd_open(const char *path, const struct ck_writer_opts *o, struct ck_writer **out)
{
    struct sd_writer *w = calloc(1, sizeof(*w));
    int err;
    if (!w)
        return ck_error(CK_ENOMEM, "out of memory");
    w->o = *o;
    if ((o->tag && !(w->tagopt = strdup(o->tag))) || (o->ref && !(w->ref = strdup(o->ref))) ||
        (o->dtype && !(w->dtype = strdup(o->dtype)))) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto fail;
    }
    if (w->dtype && strcmp(w->dtype, "fp16") && strcmp(w->dtype, "bf16") &&
        strcmp(w->dtype, "int8")) {
        err = ck_error(CK_EUSAGE, "dtype '%s': expected fp16, bf16 or int8", w->dtype);
        goto fail;
    }
    if (w->tagopt && !ck_sd_tag_is_valid(w->tagopt)) {
        err = ck_error(CK_EUSAGE, "'%s': tag '%s' is not a valid file name", path, w->tagopt);
        goto fail;
    }
    if ((err = ck_zipapp_open(&w->z, path)) < 0)
        goto fail;
    w->open = true;
    if (!w->z.fresh && ((err = read_tags(w)) < 0 || (err = check_members(w)) < 0))
        goto fail;
    *out = &w->base;
    return 0;
fail:
    w->base.ops = &ck_writer_samediff;
    ck_writer_samediff.free(&w->base);
    return err;
}

static enum ck_dtype target_dtype(const char *d)
{
    if (!d)
        return CK_DT_INVALID;
    return !strcmp(d, "fp16") ? CK_DT_F16 : !strcmp(d, "bf16") ? CK_DT_BF16 : CK_DT_QI8;
}

static int choose_tag(struct sd_writer *w, const struct ck_model *m, char *tag, size_t tagsz)
{
    const char *path = w->z.path;
    if (w->tagopt) {
        snprintf(tag, tagsz, "%s", w->tagopt);
    } else {
        char base[CK_SD_TAG_MAX + 1];
        const char *src = w->ref ? w->ref : m->name;
        if (!src || !ck_sd_tag_from(src, base, sizeof(base)))
            return ck_error(CK_EUSAGE, "'%s': no tag: the checkpoint has no reference; pass --tag",
                            path);
        int n = snprintf(tag, tagsz, "%s%s%s", base, w->dtype ? "-" : "", w->dtype ? w->dtype : "");
        if (n < 0 || (size_t)n >= tagsz || !ck_sd_tag_is_valid(tag))
            return ck_error(CK_EUSAGE, "'%s': tag '%s' is not a valid file name", path, tag);
    }
    ssize_t t = find_tag(w, tag, strlen(tag));
    if (t >= 0)
        return ck_error(CK_EEXIST, "'%s': tag '%s' already exists (as '%s')", path, tag,
                        w->tags[t]);
    return 0;
}

/* The earlier tag's params file holding exactly these bytes, or NULL. */
static const struct stored *shared_file(struct sd_writer *w, bool updater, const void *data,
                                        uint64_t len, uint32_t crc)
{
    for (size_t i = 0; i < w->nstored; i++)
        if (w->stored[i].updater == updater &&
            ck_zipapp_same(&w->z, &w->z.ents[w->stored[i].ent], data, len, crc))
            return &w->stored[i];
    return NULL;
}

static int add_member(struct sd_writer *w, const char *name, const void *p, uint64_t len)
{
    int err = ck_zipapp_add(&w->z, name, p, len);
    if (err >= 0)
        w->res.written += 30 + strlen(name) + len;
    return err;
}

static int check_name(const char *label, const char *name)
{
    if (!*name || strpbrk(name, "\n\r"))
        return ck_error(CK_EFORMAT, "'%s': variable '%s' has a name params.txt cannot hold", label,
                        name);
    return 0;
}

/* updater.txt + updater/N.fb: one line per variable, its state arrays in
 * order (model/optstate.h says which tensors they are); the keys go to
 * trainingConfig's "updaterStateKeys" (json). */
static int write_updater(struct sd_writer *w, const struct ck_model *m,
                         const struct ck_optstate *os, const char *tag, const char *label,
                         struct ck_json *json, struct ck_buf *txt)
{
    const struct ck_tensor_set *s = m->weights;
    unsigned next = 0;
    int err = 0;
    ck_json_key(json, "updaterStateKeys");
    ck_json_begin_object(json);
    for (size_t i = 0; i < os->n && err >= 0;) {
        const char *param = os->v[i].param;
        size_t j = i;
        while (j < os->n && !strcmp(os->v[j].param, param))
            j++;
        bool any = false;
        for (size_t k = i; k < j; k++)
            any = any || s->tensors[os->v[k].tensor].data;
        if (!any) { /* declared only (an index without its data) */
            i = j;
            continue;
        }
        if ((err = check_name(label, param)) < 0 || (err = ck_buf_puts(txt, param)) < 0)
            break;
        ck_json_key(json, param);
        ck_json_begin_array(json);
        for (size_t k = i; k < j && err >= 0; k++) {
            const struct ck_tensor *u = &s->tensors[os->v[k].tensor];
            if (!u->data) {
                err = ck_error(CK_EFORMAT, "'%s': optimizer state '%s' of '%s' has no data",
                               label, os->v[k].key, param);
                break;
            }
            if (strchr(os->v[k].key, ' ')) {
                err = ck_error(CK_EFORMAT, "'%s': optimizer state key '%s' of '%s' has a space",
                               label, os->v[k].key, param);
                break;
            }
            ck_json_str(json, os->v[k].key);
            struct ck_fbb b;
            float scale;
            ck_fbb_init(&b);
            if ((err = ck_sdarray_file(&b, u, CK_DT_INVALID, label, &scale)) < 0) {
                ck_fbb_release(&b);
                break;
            }
            uint32_t crc = ck_crc32_extend(0, b.p, b.len);
            const struct stored *sh = shared_file(w, true, b.p, b.len, crc);
            if (sh) {
                err = ck_buf_printf(txt, " %s/%u", w->tags[sh->tag], sh->num);
                w->res.saved += b.len;
            } else {
                char member[CK_SD_TAG_MAX + 32];
                snprintf(member, sizeof(member), "%s/updater/%u.fb", tag, next);
                if ((err = add_member(w, member, b.p, b.len)) >= 0)
                    err = ck_buf_printf(txt, " %u", next++);
            }
            w->res.updater++;
            ck_fbb_release(&b);
        }
        ck_json_end_array(json);
        if (err >= 0)
            err = ck_buf_putc(txt, '\n');
        i = j;
    }
    ck_json_end_object(json);
    return err;
}

/* The weights the tag stores (placeholders and declared-only values have
 * no data: the graph has them) and the dtype each is stored as. */
static int list_weights(struct sd_writer *w, const struct ck_model *m,
                        const struct ck_optstate *os, const char *label,
                        struct ck_sdgraph_weight *ws, size_t *nws)
{
    enum ck_dtype to = target_dtype(w->dtype);
    const struct ck_tensor_set *s = m->weights;
    int err;
    *nws = 0;
    for (size_t i = 0; i < s->ntensors; i++) {
        const struct ck_tensor *t = &s->tensors[i];
        if (!t->data || os->is_state[i])
            continue;
        if ((err = check_name(label, t->name)) < 0)
            return err;
        ws[*nws].t = t;
        ws[*nws].stored = ck_sdarray_converts(t, to) ? to : t->dtype;
        ws[*nws].scale = 1;
        (*nws)++;
    }
    return 0;
}

/* params.txt and params/N.fb; records each int8 weight's scale in ws. */
static int write_params(struct sd_writer *w, const char *tag, const char *label,
                        struct ck_sdgraph_weight *ws, size_t nws, struct ck_buf *txt)
{
    enum ck_dtype to = target_dtype(w->dtype);
    unsigned next = 0;
    int err = 0;
    for (size_t i = 0; i < nws && err >= 0; i++) {
        const struct ck_tensor *t = ws[i].t;
        struct ck_fbb b;
        float scale = 1;
        ck_fbb_init(&b);
        if ((err = ck_sdarray_file(&b, t, to, label, &scale)) < 0) {
            ck_fbb_release(&b);
            break;
        }
        uint32_t crc = ck_crc32_extend(0, b.p, b.len);
        const struct stored *sh = shared_file(w, false, b.p, b.len, crc);
        if (sh) {
            err = ck_buf_printf(txt, "%s %s/%u\n", t->name, w->tags[sh->tag], sh->num);
            w->res.shared++;
            w->res.saved += b.len;
        } else {
            char member[CK_SD_TAG_MAX + 32];
            snprintf(member, sizeof(member), "%s/params/%u.fb", tag, next);
            if ((err = add_member(w, member, b.p, b.len)) >= 0)
                err = ck_buf_printf(txt, "%s %u\n", t->name, next++);
            w->res.params++;
        }
        ck_fbb_release(&b);
        ws[i].scale = scale;
    }
    return err;
}

static int write_fb(struct sd_writer *w, const char *member, struct ck_fbb *b)
{
    int err = add_member(w, member, b->p, b->len);
    ck_fbb_release(b);
    return err;
}

static int sd_add(struct ck_writer *base, const struct ck_model *m)
{
    struct sd_writer *w = (struct sd_writer *)base;
    char tag[CK_SD_TAG_MAX + 1], label[4600], member[CK_SD_TAG_MAX + 32];
    struct ck_buf txt = CK_BUF_INIT, jbuf = CK_BUF_INIT;
    struct ck_json json;
    struct ck_fbb b;
    struct ck_sdgraph_weight *ws = NULL;
    struct ck_optstate os = {0};
    size_t nws = 0;
    int err;
    if (w->added)
        return ck_error(CK_EUSAGE, "'%s': one model per append", w->z.path);
    if ((err = choose_tag(w, m, tag, sizeof(tag))) < 0)
        return err;
    snprintf(label, sizeof(label), "%s: tag '%s'", w->z.path, tag);
    if (!(ws = calloc(m->weights->ntensors + 1, sizeof(*ws))))
        return ck_error(CK_ENOMEM, "out of memory");
    ck_buf_init(&txt, SD_MAX_TEXT);
    ck_fbb_init(&b);
    /* The graph first: an op DL4J lacks fails before anything is written. */
    if ((err = ck_model_check(m)) < 0 || (err = ck_optstate_find(m->weights, &os)) < 0 ||
        (err = list_weights(w, m, &os, label, ws, &nws)) < 0 ||
        (err = ck_sdgraph_build(&b, m, ws, nws, label)) < 0)
        goto out;
    ck_fbb_release(&b);
    if ((err = write_params(w, tag, label, ws, nws, &txt)) < 0)
        goto out;
    snprintf(member, sizeof(member), "%s/params.txt", tag);
    if ((err = add_member(w, member, txt.data ? txt.data : "", txt.len)) < 0)
        goto out;
    ck_fbb_init(&b);
    snprintf(member, sizeof(member), "%s/graph.fb", tag);
    if ((err = ck_sdgraph_build(&b, m, ws, nws, label)) < 0 || (err = write_fb(w, member, &b)) < 0)
        goto out;
    /* Optimizer state, and the training configuration naming its keys. */
    ck_buf_reset(&txt);
    ck_json_init(&json, &jbuf, false);
    ck_json_begin_object(&json);
    if ((err = write_updater(w, m, &os, tag, label, &json, &txt)) < 0)
        goto out;
    ck_json_end_object(&json);
    if ((err = ck_json_error(&json)) < 0)
        goto out;
    snprintf(member, sizeof(member), "%s/updater.txt", tag);
    if (txt.len && (err = add_member(w, member, txt.data, txt.len)) < 0)
        goto out;
    ck_fbb_init(&b);
    snprintf(member, sizeof(member), "%s/trainingConfig.fb", tag);
    if ((err = ck_sdgraph_training_config(&b, txt.len ? ck_buf_str(&jbuf) : "{}")) < 0 ||
        (err = write_fb(w, member, &b)) < 0)
        goto out;
    ck_buf_reset(&txt);
    for (size_t i = 0; i < w->ntags && err >= 0; i++)
        err = ck_buf_printf(&txt, "%s\n", w->tags[i]);
    if (err < 0 || (err = ck_buf_printf(&txt, "%s\n", tag)) < 0)
        goto out;
    struct ck_zipapp_entry *old = ck_zipapp_find(&w->z, "tags.txt");
    if (old)
        ck_zipapp_drop(&w->z, old);
    if ((err = add_member(w, "tags.txt", txt.data, txt.len)) < 0)
        goto out;
    snprintf(w->res.tag, sizeof(w->res.tag), "%s", tag);
    w->res.unmapped = os.unmapped;
    w->added = true;
out:
    ck_fbb_release(&b);
    ck_buf_release(&txt);
    ck_buf_release(&jbuf);
    free(ws);
    ck_optstate_release(&os);
    return err;
}

static int sd_finish(struct ck_writer *base)
{
    struct sd_writer *w = (struct sd_writer *)base;
    if (!w->added)
        return ck_error(CK_EUSAGE, "'%s': nothing to append", w->z.path);
    char path[4096];
    snprintf(path, sizeof(path), "%s", w->z.path);
    w->open = false;
    int err = ck_zipapp_commit(&w->z); /* releases w->z */
    if (err >= 0)
        ck_info("samediff.appended",
                "archive=%s tag=%s params=%zu shared=%zu updater=%zu bytes=%" PRIu64
                " saved=%" PRIu64,
                path, w->res.tag, w->res.params, w->res.shared, w->res.updater, w->res.written,
                w->res.saved);
    if (err >= 0 && w->res.unmapped)
        ck_warn("samediff.updater_unmapped",
                "archive=%s tag=%s arrays=%zu: optimizer state not tied to a variable, not stored",
                path, w->res.tag, w->res.unmapped);
    return err;
}

static void sd_free(struct ck_writer *base)
{
    struct sd_writer *w = (struct sd_writer *)base;
    if (!w)
        return;
    if (w->open)
        ck_zipapp_abort(&w->z);
    for (size_t i = 0; i < w->ntags; i++)
        free(w->tags[i]);
    free(w->tags);
    free(w->byname);
    free(w->stored);
    free(w->tagopt);
    free(w->ref);
    free(w->dtype);
    free(w);
}

const struct ck_writer_ops ck_writer_samediff = {
    .name = "samediff",
    .extension = ".zip",
    .description = "DL4J SameDiff tagged zip (ADR 0001): one tag per checkpoint, appended in place",
    .open = sd_open,
    .add = sd_add,
    .finish = sd_finish,
    .free = sd_free,
};

const struct ck_samediff_result *ck_samediff_last(const struct ck_writer *w)
{
    return w && w->ops == &ck_writer_samediff ? &((const struct sd_writer *)w)->res : NULL;
}

int ck_samediff_append(const char *archive, const struct ck_model *m,
                       const struct ck_writer_opts *o, struct ck_samediff_result *res)
{
    struct ck_writer *w;
    char dir[4096];
    int err;
    /* The sidecar's DIR/data/deploy/ may not exist yet. */
    ck_dirname(dir, sizeof(dir), archive);
    if ((err = ck_mkdirs(dir, 0755)) < 0)
        return err;
    if ((err = ck_writer_open(&ck_writer_samediff, archive, o, &w)) < 0)
        return err;
    if ((err = ck_writer_add(w, m)) >= 0 && (err = ck_writer_finish(w)) >= 0 && res)
        *res = *ck_samediff_last(w);
    ck_writer_free(w);
    return err;
}
