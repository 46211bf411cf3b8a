#include "writers/mldef.h"
#include "model/optstate.h"

#include "common/buf.h"
#include "common/error.h"
#include "common/strset.h"
#include "common/json.h"
#include "common/log.h"
#include "common/sign.h"
#include "model/convert.h"
#include "model/mldef.h"
#include "writers/mldefzip.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the .mldef writer copies float data as is: little-endian hosts only"
#endif

#define STAGE (1u << 20)

struct seg {
    const struct ck_tensor *t;
    uint64_t numel;
};

/* One data file: its weights in order and the streaming state. */
struct datafile {
    char name[16];
    char path[32];
    enum ck_dtype kind; /* CK_DT_F32 or CK_DT_F64 */
    struct seg *segs;
    size_t nsegs;
    uint64_t npoints;
    /* streaming */
    const struct ck_tensor_set *set;
    size_t cur;       /* segment */
    uint64_t elem;    /* element within it */
    const unsigned char *handed; /* mapped bytes handed out by the last df_next */
    uint64_t handed_len;
    unsigned char *stage;
    size_t stage_len, stage_pos;
    struct ck_convert_report *reps; /* per segment: what converting lost */
};

/* Where each node's new weights went. */
struct placed {
    size_t file; /* index into files, SIZE_MAX when the node brings none */
    uint64_t start;
    uint64_t count;
    size_t first_seg, nsegs;
};

struct mldef_writer {
    struct ck_writer base;
    char *path;
    struct ck_writer_opts o;
    struct ck_sign_key key;
    bool sign;
    struct ck_mldef_zip *zip;
    struct datafile *files;
    size_t nfiles;
    struct placed *placed;
    struct ck_buf manifest;
    bool added;
};

static int mldef_open(const char *path, const struct ck_writer_opts *o, struct ck_writer **out)
{
    struct mldef_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    w->o = *o;
    w->o.sign_key = NULL; /* not kept: the key is loaded now */
    ck_buf_init(&w->manifest, CK_MLDEF_MAX_MANIFEST);
    int err = 0;
    if (o->sign_key) {
        if ((err = ck_sign_load(o->sign_key, &w->key)) < 0)
            goto bad;
        w->sign = true;
    }
    if ((err = ck_mldef_zip_open(path, o->level, w->sign ? &w->key : NULL, &w->zip)) >= 0)
        ck_mldef_zip_set_check(w->zip, o->check, o->check_arg);
    if (err < 0)
        goto bad;
    *out = &w->base;
    return 0;
bad:
    ck_sign_key_wipe(&w->key);
    ck_buf_release(&w->manifest);
    free(w->path);
    free(w);
    return err;
}

/* ---- layout ---- */

static bool node_brings(const struct ck_model *m, size_t upto, const char *name)
{
    /* whether an earlier node already used this weight */
    for (size_t i = 0; i < upto; i++)
        for (size_t k = 0; k < m->nodes[i].ninputs; k++)
            if (strcmp(m->nodes[i].inputs[k], name) == 0)
                return false;
    return true;
}

static bool is_new_weight(const struct ck_model *m, size_t node, size_t k)
{
    const struct ck_model_node *n = &m->nodes[node];
    if (!ck_model_weight(m, n->inputs[k]))
        return false;
    for (size_t j = 0; j < k; j++)
        if (strcmp(n->inputs[j], n->inputs[k]) == 0)
            return false;
    return node_brings(m, node, n->inputs[k]);
}

static int new_file(struct mldef_writer *w, enum ck_dtype kind)
{
    if (w->nfiles + 2 + w->sign > CK_MLDEF_MAX_FILES)
        return ck_error(CK_EFORMAT, "'%s': the weights need more than %d files (rule files.count)",
                        w->path, CK_MLDEF_MAX_FILES);
    struct datafile *v = realloc(w->files, (w->nfiles + 1) * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    w->files = v;
    struct datafile *f = &v[w->nfiles];
    memset(f, 0, sizeof *f);
    f->kind = kind;
    snprintf(f->name, sizeof f->name, "w%03zu", w->nfiles);
    snprintf(f->path, sizeof f->path, "data/%s.%s", f->name,
             kind == CK_DT_F64 ? "float64" : "float32");
    w->nfiles++;
    return 0;
}

static int add_seg(struct datafile *f, const struct ck_tensor *t, uint64_t numel)
{
    struct seg *v = realloc(f->segs, (f->nsegs + 1) * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    f->segs = v;
    v[f->nsegs++] = (struct seg){t, numel};
    f->npoints += numel;
    return 0;
}

/* Tensors no layer uses (a training checkpoint's optimizer state, its
 * callbacks' tensors): one line for all of them, each one at debug level. */
static void log_unused(const struct mldef_writer *w, const struct ck_model *m)
{
    struct ck_optstate os = {0};
    size_t unused = 0, optimizer = 0, other = 0;
    char first[512] = "";
    if (ck_optstate_find(m->weights, &os) < 0)
        ck_error_clear(); /* then every unused tensor is counted as other */
    for (size_t i = 0; i < m->weights->ntensors; i++) {
        const char *name = m->weights->tensors[i].name;
        bool used = false;
        for (size_t k = 0; k < m->nnodes && !used; k++)
            for (size_t j = 0; j < m->nodes[k].ninputs && !used; j++)
                used = strcmp(m->nodes[k].inputs[j], name) == 0;
        if (used)
            continue;
        unused++;
        ck_debug("pack.skip", "archive=%s tensor='%s' reason=\"used by no layer\"", w->path, name);
        if (os.is_state && os.is_state[i]) {
            optimizer++;
        } else if (other++ < 3) {
            size_t l = strlen(first);
            snprintf(first + l, sizeof first - l, "%s'%.120s'", l ? ", " : "", name);
        }
    }
    ck_optstate_release(&os);
    if (unused)
        ck_info("pack.skip",
                "archive=%s tensors=%zu reason=\"used by no layer\" optimizer_state=%zu "
                "other=%zu%s%s%s",
                w->path, unused, optimizer, other, other ? " (" : "", first,
                other > 3 ? ", ...)"
                : other   ? ")"
                          : "");
}

/* Places each node's new weights back to back in one data file. */
static int layout(struct mldef_writer *w, const struct ck_model *m)
{
    if (!(w->placed = calloc(m->nnodes ? m->nnodes : 1, sizeof *w->placed)))
        return ck_error(CK_ENOMEM, "out of memory");
    size_t cur[2] = {SIZE_MAX, SIZE_MAX}; /* open file per kind: f32, f64 */
    int err;
    for (size_t i = 0; i < m->nnodes; i++) {
        const struct ck_model_node *n = &m->nodes[i];
        struct placed *p = &w->placed[i];
        p->file = SIZE_MAX;
        bool all64 = true, any = false;
        uint64_t bytes = 0;
        for (size_t k = 0; k < n->ninputs; k++) {
            if (!is_new_weight(m, i, k))
                continue;
            const struct ck_tensor *t = ck_model_weight(m, n->inputs[k]);
            uint64_t numel;
            if (t->dtype == CK_DT_STRING || ck_dtype_size(t->dtype) == 0)
                return ck_error(CK_EFORMAT, "'%s': layer %zu '%s': weight '%s' is %s, not numbers",
                                w->path, i, n->name, t->name, ck_dtype_name(t->dtype));
            if (!t->data)
                return ck_error(CK_ENOENT, "'%s': layer %zu '%s': weight '%s' has no data", w->path,
                                i, n->name, t->name);
            if ((err = ck_tensor_numel(t, &numel)) < 0 ||
                (err = ck_tensor_check_size(t, m->weights->path)) < 0)
                return err;
            any = true;
            all64 &= t->dtype == CK_DT_F64;
            bytes += numel * 8;
        }
        if (!any)
            continue;
        enum ck_dtype kind = all64 ? CK_DT_F64 : CK_DT_F32;
        int slot = all64;
        size_t es = all64 ? 8 : 4;
        bytes = bytes / 8 * es;
        if (cur[slot] == SIZE_MAX ||
            (w->files[cur[slot]].npoints * es + bytes > CK_MLDEF_DATAFILE_MAX &&
             w->files[cur[slot]].npoints > 0)) {
            if ((err = new_file(w, kind)) < 0)
                return err;
            cur[slot] = w->nfiles - 1;
        }
        struct datafile *f = &w->files[cur[slot]];
        p->file = cur[slot];
        p->start = f->npoints;
        p->first_seg = f->nsegs;
        for (size_t k = 0; k < n->ninputs; k++) {
            if (!is_new_weight(m, i, k))
                continue;
            const struct ck_tensor *t = ck_model_weight(m, n->inputs[k]);
            uint64_t numel;
            ck_tensor_numel(t, &numel);
            if ((err = add_seg(f, t, numel)) < 0)
                return err;
            p->nsegs++;
        }
        p->count = f->npoints - p->start;
    }
    log_unused(w, m);
    return 0;
}

/* ---- manifest ---- */

static void shape(struct ck_json *j, const char *key, int rank, const int64_t *dims)
{
    ck_json_key(j, key);
    ck_json_begin_array(j);
    for (int d = 0; d < rank; d++)
        ck_json_int(j, dims[d]);
    ck_json_end_array(j);
}

static void params(struct ck_json *j, const struct ck_op_params *p)
{
    bool any = false;
    for (const struct ck_mldef_param *d = ck_mldef_params; d->key; d++)
        any |= ck_mldef_param_is_set(d, p);
    if (!any)
        return;
    ck_json_key(j, "Params");
    ck_json_begin_object(j);
    for (const struct ck_mldef_param *d = ck_mldef_params; d->key; d++) {
        if (!ck_mldef_param_is_set(d, p))
            continue;
        const char *a = (const char *)p + d->offset;
        ck_json_key(j, d->key);
        switch (d->kind) {
        case CK_MLDEF_P_INT2:
        case CK_MLDEF_P_INT4:
            ck_json_begin_array(j);
            for (int k = 0; k < (d->kind == CK_MLDEF_P_INT2 ? 2 : 4); k++)
                ck_json_int(j, ((const int64_t *)a)[k]);
            ck_json_end_array(j);
            break;
        case CK_MLDEF_P_INT:
        case CK_MLDEF_P_AXIS:
            ck_json_int(j, *(const int64_t *)a);
            break;
        case CK_MLDEF_P_BOOL:
            ck_json_bool(j, *(const bool *)a);
            break;
        case CK_MLDEF_P_FLOAT:
        case CK_MLDEF_P_SCALAR:
        case CK_MLDEF_P_BOUND:
            ck_json_double(j, *(const float *)a);
            break;
        case CK_MLDEF_P_INTS:
            ck_json_begin_array(j);
            for (size_t k = 0; k < p->nints; k++)
                ck_json_int(j, p->ints[k]);
            ck_json_end_array(j);
            break;
        }
    }
    ck_json_end_object(j);
}

static bool is_graph_output(const struct ck_model *m, const struct ck_model_node *n)
{
    for (size_t o = 0; o < m->noutputs; o++)
        for (size_t k = 0; k < n->noutputs; k++)
            if (strcmp(m->outputs[o].name, n->outputs[k]) == 0)
                return true;
    return false;
}

/* Layer names must be unique; the source's node names usually are, but an
 * empty or repeated one gets its index. firsts maps each name (inputs first)
 * to its first user: one look-up per layer (100k layers took minutes). */
static void layer_name(const struct ck_model *m, const struct ck_strset *firsts, size_t i,
                       char *out, size_t outsz)
{
    const char *name = m->nodes[i].name && *m->nodes[i].name ? m->nodes[i].name : "layer";
    size_t first = 0;
    bool clash = !m->nodes[i].name || !*m->nodes[i].name ||
                 (ck_strset_get(firsts, name, &first) && first != m->ninputs + i);
    if (clash)
        snprintf(out, outsz, "%s.%zu", name, i);
    else
        snprintf(out, outsz, "%s", name);
}

static void node_layer(struct mldef_writer *w, struct ck_json *j, const struct ck_model *m,
                       const struct ck_strset *firsts, size_t i)
{
    const struct ck_model_node *n = &m->nodes[i];
    const struct placed *p = &w->placed[i];
    char name[512], caps[96];
    layer_name(m, firsts, i, name, sizeof name);
    ck_mldef_capabilities(n->op, n->ninputs, n->p.has_scalar, is_graph_output(m, n), caps,
                          sizeof caps);
    ck_json_begin_object(j);
    ck_json_kstr(j, "Name", name);
    ck_json_kstr(j, "Op", ck_op_name(n->op));
    ck_json_kstr(j, "Capabilities", caps);
    ck_json_kstr(j, "Prior", n->ninputs ? n->inputs[0] : "");
    ck_json_key(j, "Inputs");
    ck_json_begin_array(j);
    for (size_t k = 0; k < n->ninputs; k++)
        ck_json_str(j, n->inputs[k]);
    ck_json_end_array(j);
    ck_json_key(j, "Outputs");
    ck_json_begin_array(j);
    for (size_t k = 0; k < n->noutputs; k++)
        ck_json_str(j, n->outputs[k]);
    ck_json_end_array(j);
    if (p->file != SIZE_MAX) {
        const struct datafile *f = &w->files[p->file];
        ck_json_kstr(j, "DataSource", f->name);
        ck_json_key(j, "StartIndex");
        ck_json_uint(j, p->start);
        ck_json_key(j, "Count");
        ck_json_uint(j, p->count);
        ck_json_key(j, "Weights");
        ck_json_begin_array(j);
        for (size_t s = 0; s < p->nsegs; s++) {
            const struct ck_tensor *t = f->segs[p->first_seg + s].t;
            ck_json_begin_object(j);
            ck_json_kstr(j, "Name", t->name);
            shape(j, "Shape", t->rank, t->dims);
            ck_json_end_object(j);
        }
        ck_json_end_array(j);
    }
    params(j, &n->p);
    ck_json_end_object(j);
}

static int manifest(struct mldef_writer *w, const struct ck_model *m)
{
    struct ck_json j;
    ck_json_init(&j, &w->manifest, true);
    ck_json_begin_object(&j);
    ck_json_kstr(&j, "Format", "mldef");
    ck_json_kint(&j, "FormatVersion", CK_MLDEF_FORMAT_VERSION);
    ck_json_key(&j, "Model");
    ck_json_begin_object(&j);
    ck_json_kstr(&j, "Name", m->name ? m->name : "model");
    ck_json_kstr(&j, "Description", "packed by ckptd");
    if (m->source)
        ck_json_kstr(&j, "Source", m->source);
    ck_json_end_object(&j);
    ck_json_key(&j, "DataFiles");
    ck_json_begin_array(&j);
    for (size_t i = 0; i < w->nfiles; i++) {
        ck_json_begin_object(&j);
        ck_json_kstr(&j, "Name", w->files[i].name);
        ck_json_kstr(&j, "Path", w->files[i].path);
        ck_json_kint(&j, "StorageBytes", w->files[i].kind == CK_DT_F64 ? 8 : 4);
        ck_json_kstr(&j, "StorageFormat", "float");
        ck_json_end_object(&j);
    }
    ck_json_end_array(&j);
    ck_json_key(&j, "NodeRanges");
    ck_json_begin_array(&j);
    for (int out = 0; out < 2; out++)
        for (size_t i = 0; i < (out ? m->noutputs : m->ninputs); i++) {
            const struct ck_model_io *io = out ? &m->outputs[i] : &m->inputs[i];
            ck_json_begin_object(&j);
            ck_json_kstr(&j, "Name", io->name);
            ck_json_kstr(&j, "Type", out ? "output" : "input");
            ck_json_key(&j, "Count");
            ck_json_uint(&j, ck_model_io_per_sample(io));
            shape(&j, "Shape", io->rank, io->dims);
            ck_json_end_object(&j);
        }
    ck_json_end_array(&j);
    ck_json_key(&j, "Layers");
    ck_json_begin_array(&j);
    for (size_t i = 0; i < m->ninputs; i++) {
        ck_json_begin_object(&j);
        ck_json_kstr(&j, "Name", m->inputs[i].name);
        ck_json_kstr(&j, "Capabilities", "input");
        ck_json_key(&j, "Count");
        ck_json_uint(&j, ck_model_io_per_sample(&m->inputs[i]));
        shape(&j, "Shape", m->inputs[i].rank, m->inputs[i].dims);
        ck_json_end_object(&j);
    }
    struct ck_strset firsts = CK_STRSET_INIT;
    int err = 0;
    for (size_t i = 0; i < m->ninputs && err == 0; i++)
        err = ck_strset_put(&firsts, m->inputs[i].name, i, NULL);
    for (size_t i = 0; i < m->nnodes && err == 0; i++)
        if (m->nodes[i].name && *m->nodes[i].name)
            err = ck_strset_put(&firsts, m->nodes[i].name, m->ninputs + i, NULL);
    for (size_t i = 0; i < m->nnodes && err == 0; i++)
        node_layer(w, &j, m, &firsts, i);
    ck_strset_release(&firsts);
    if (err < 0)
        return err;
    ck_json_end_array(&j);
    ck_json_end_object(&j);
    if (ck_json_error(&j) < 0 || ck_buf_putc(&w->manifest, '\n') < 0)
        return ck_error(CK_ESIZE, "'%s': manifest.json over %u bytes", w->path,
                        CK_MLDEF_MAX_MANIFEST);
    return 0;
}

/* ---- streaming a data file ---- */

static int df_start(struct datafile *f)
{
    f->cur = 0;
    f->elem = 0;
    f->handed = NULL;
    f->handed_len = 0;
    f->stage_len = f->stage_pos = 0;
    free(f->reps);
    f->reps = calloc(f->nsegs ? f->nsegs : 1, sizeof *f->reps);
    if (!f->reps || (!f->stage && !(f->stage = malloc(STAGE))))
        return ck_error(CK_ENOMEM, "out of memory");
    return 0;
}

/* Converts the next elements into the stage (model/convert.h does the
 * dtypes, byte orders and element orders); pages of the source are dropped
 * behind the read so a pass over a big checkpoint stays small. */
static int df_fill(struct datafile *f)
{
    size_t es = f->kind == CK_DT_F64 ? 8 : 4, room = STAGE / es, n = 0;
    int err;
    while (n < room && f->cur < f->nsegs) {
        const struct seg *s = &f->segs[f->cur];
        uint64_t take = s->numel - f->elem < room - n ? s->numel - f->elem : room - n;
        const struct ck_tensor *t = s->t;
        unsigned char *dst = f->stage + n * es;
        struct ck_convert_report *rep = &f->reps[f->cur];
        if (f->kind == CK_DT_F64)
            err = ck_tensor_read_f64(t, f->elem, take, (double *)(void *)dst, rep);
        else
            err = ck_tensor_read_f32(t, f->elem, take, (float *)(void *)dst, rep);
        if (err < 0)
            return err;
        size_t ss = ck_dtype_size(t->dtype);
        if (!t->fortran_order)
            ck_tensor_set_drop_pages(f->set, t->data + f->elem * ss, take * ss);
        n += take;
        f->elem += take;
        if (f->elem == s->numel) {
            if (t->fortran_order)
                ck_tensor_set_drop_pages(f->set, t->data, t->nbytes);
            if (t->dtype != f->kind)
                ck_info("pack.convert",
                        "tensor='%s' from=%s to=%s inexact=%llu nonfinite=%llu imag_dropped=%llu",
                        t->name, ck_dtype_name(t->dtype), ck_dtype_name(f->kind),
                        (unsigned long long)rep->inexact, (unsigned long long)rep->nonfinite,
                        (unsigned long long)rep->imag_dropped);
            f->cur++;
            f->elem = 0;
        }
    }
    f->stage_len = n * es;
    f->stage_pos = 0;
    return 0;
}

/* Whether the current segment is stored exactly as the data file wants it,
 * so its mapped bytes go to the zip writer as they are. */
static bool passthrough(const struct datafile *f)
{
    if (f->cur >= f->nsegs || f->stage_pos != f->stage_len)
        return false;
    const struct ck_tensor *t = f->segs[f->cur].t;
    return t->dtype == f->kind && !t->big_endian && !t->fortran_order;
}

static int64_t df_next(void *ctx, void *buf, size_t len, const void **out)
{
    (void)buf;
    struct datafile *f = ctx;
    int err;
    size_t es = f->kind == CK_DT_F64 ? 8 : 4;
    /* The bytes handed out last time are written by now: their pages go, so
     * a pass over a big checkpoint stays small. */
    if (f->handed_len) {
        ck_tensor_set_drop_pages(f->set, f->handed, f->handed_len);
        f->handed_len = 0;
    }
    if (passthrough(f) && len >= es) {
        const struct seg *s = &f->segs[f->cur];
        uint64_t take = (s->numel - f->elem) < len / es ? s->numel - f->elem : len / es;
        const unsigned char *src = s->t->data + f->elem * es;
        *out = f->handed = src;
        f->handed_len = take * es;
        f->reps[f->cur].converted += take;
        f->elem += take;
        if (f->elem == s->numel) {
            f->cur++;
            f->elem = 0;
        }
        return (int64_t)(take * es);
    }
    if (f->stage_pos == f->stage_len && (err = df_fill(f)) < 0)
        return err;
    size_t n = f->stage_len - f->stage_pos < len ? f->stage_len - f->stage_pos : len;
    *out = f->stage + f->stage_pos;
    f->stage_pos += n;
    return (int64_t)n;
}

static int mldef_add(struct ck_writer *base, const struct ck_model *m)
{
    struct mldef_writer *w = (struct mldef_writer *)base;
    if (w->added)
        return ck_error(CK_EUSAGE, "'%s': an .mldef holds one model", w->path);
    w->added = true;
    int err;
    if ((err = ck_model_check(m)) < 0)
        return ck_error_wrap(err, "'%s'", w->path);
    if (m->nnodes == 0)
        return ck_error(CK_EFORMAT, "'%s': the model has no layer", w->path);
    if (!is_graph_output(m, &m->nodes[m->nnodes - 1]))
        return ck_error(CK_EFORMAT,
                        "'%s': the last layer '%s' produces no graph output "
                        "(rule noderange.output)",
                        w->path, m->nodes[m->nnodes - 1].name);
    if ((err = layout(w, m)) < 0 || (err = manifest(w, m)) < 0)
        return err;
    if ((err = ck_mldef_zip_add_buffer(w->zip, CK_MLDEF_MANIFEST, w->manifest.data,
                                       w->manifest.len)) < 0)
        return err;
    for (size_t i = 0; i < w->nfiles; i++) {
        struct datafile *f = &w->files[i];
        f->set = m->weights;
        struct ck_mldef_stream s = {
            .size = f->npoints * (f->kind == CK_DT_F64 ? 8 : 4), .next = df_next, .ctx = f};
        if ((err = df_start(f)) < 0 || (err = ck_mldef_zip_add_stream(w->zip, f->path, &s)) < 0)
            return err;
        free(f->stage);
        f->stage = NULL;
    }
    if (w->o.verbose)
        ck_info("pack.layout", "archive=%s layers=%zu data_files=%zu", w->path, m->nnodes,
                w->nfiles);
    return 0;
}

static int mldef_finish(struct ck_writer *base)
{
    struct mldef_writer *w = (struct mldef_writer *)base;
    if (!w->added)
        return ck_error(CK_EUSAGE, "'%s': no model added", w->path);
    return ck_mldef_zip_finish(w->zip);
}

static void mldef_free(struct ck_writer *base)
{
    struct mldef_writer *w = (struct mldef_writer *)base;
    ck_mldef_zip_free(w->zip);
    for (size_t i = 0; i < w->nfiles; i++) {
        free(w->files[i].segs);
        free(w->files[i].stage);
        free(w->files[i].reps);
    }
    free(w->files);
    free(w->placed);
    ck_buf_release(&w->manifest);
    ck_sign_key_wipe(&w->key);
    free(w->path);
    free(w);
}

const struct ck_writer_ops ck_writer_mldef = {
    .name = "mldef",
    .extension = ".mldef",
    .description = "mldef deployment archive: manifest.json and raw float data files in a zip",
    .open = mldef_open,
    .add = mldef_add,
    .finish = mldef_finish,
    .free = mldef_free,
};
