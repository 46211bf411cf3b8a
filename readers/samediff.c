/* SameDiff (DL4J) graphs: a FlatBuffers file whose root is sd.graph.FlatGraph
 * (what SameDiff.save writes), or a zip in the ADR-0001 layout (tags.txt,
 * <tag>/graph.fb, <tag>/params.txt, <tag>/params/N.fb), read at its newest
 * tag. Field numbers: specs/FORMAT-FACTS.md section 3.2.
 *
 * What becomes what:
 * - every variable that has an array (FlatVariable.ndarray, or a params/N.fb
 *   in a zip) is a tensor with that array's dtype, shape and bytes (big-endian
 *   when byteOrder is BE, as Java writes them); its role is the variable type
 *   ("variable", "constant", "array", "placeholder", "sequence");
 * - a variable without an array but with a declared shape (placeholders) is a
 *   tensor with data NULL and the declared dims (-1 for an unknown one);
 *   "array" variables without either (op outputs) appear only in the graph;
 * - nodes become graph nodes (op = opName), inputs resolved through
 *   inputPaired (variable id pairs), outputs from outputNames; opType, opNum,
 *   extraInteger/extraParams/extraBools/dimensions become text attributes;
 * - placeholders are the graph inputs, FlatGraph.outputs the graph outputs
 *   (when the file declares none, the node outputs no node consumes, and the
 *   graph attribute "outputs" says "inferred"); lossVariables become the
 *   graph attribute "loss_variables" ("a,b"), trainingConfig the meta entry
 *   "training_config", FlatGraph.id the meta entry "graph_id".
 * - ND4J empty arrays (no buffer, the empty flag 8 in the shape info extras)
 *   are tensors of shape [0] when their rank is 0.
 * - UTF8 arrays become string tensors; both header layouts seen in real files
 *   are accepted (offsets only, little-endian; or a count then offsets,
 *   big-endian), each checked to describe exactly the bytes present. */
#include "readers/reader.h"

#include "common/fsutil.h"
#include "common/buf.h"
#include "common/error.h"
#include "model/sdschema.h"
#include "common/zipjournal.h"
#include "readers/flatbuf.h"
#include "readers/jsonin.h"
#include "readers/nameidx.h"
#include "readers/sdmodel.h"
#include "readers/sdtests.h"
#include "readers/zipin.h"
#include "common/text.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>


#define SD_MAX_TEXT (1u << 20)              /* tags.txt, params.txt */
#define SD_MAX_MEMBER ((uint64_t)INT32_MAX) /* FlatBuffers cannot address more */

struct var {
    int32_t a, b;
    const char *name; /* set memory */
};

struct ctx {
    struct ck_tensor_set *s;
    const char *file; /* for messages: "x.fb" or "x.zip: tag/graph.fb" */
    struct var *vars; /* owned; sorted by (a, b) after loading */
    size_t nvars;
    struct ck_pool *pool; /* names and string tables, in the set's memory */
};

static const char *const sd_roles[] = {"variable", "constant", "array", "placeholder", "sequence"};

static enum ck_dtype sd_dtype(int t)
{
    switch (t) {
    case 1:
        return CK_DT_BOOL;
    case 3:
        return CK_DT_F16;
    case 5:
        return CK_DT_F32;
    case 6:
        return CK_DT_F64;
    case 7:
        return CK_DT_I8;
    case 8:
        return CK_DT_I16;
    case 9:
        return CK_DT_I32;
    case 10:
        return CK_DT_I64;
    case 11:
        return CK_DT_U8;
    case 12:
        return CK_DT_U16;
    case 13:
        return CK_DT_U32;
    case 14:
        return CK_DT_U64;
    case 15:
        return CK_DT_QI8;
    case 16:
        return CK_DT_QI16;
    case 17:
        return CK_DT_BF16;
    case SD_UTF8:
        return CK_DT_STRING;
    default:
        return CK_DT_INVALID;
    }
}

/* A NUL-terminated copy in the set of a FlatBuffers string; names must be
 * non-empty and free of NUL bytes. */
static int fb_name(struct ctx *c, const char *p, uint32_t len, const char *what, char **out)
{
    if (len == 0 || memchr(p, 0, len))
        return ck_error(CK_EFORMAT, "'%s': %s has an empty name or one with a NUL byte", c->file,
                        what);
    if (!(*out = ck_pool_strdup(c->pool, p, len)))
        return ck_error(CK_ENOMEM, "'%s': out of memory", c->file);
    return 0;
}

static uint64_t rd_u64(const unsigned char *p, bool be)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[be ? 7 - i : i] << (8 * i);
    return v;
}

/* Tries one UTF8 header layout: [count] then numel+1 offsets, then the bytes;
 * true when it describes exactly len bytes. */
static bool utf8_layout(const unsigned char *p, uint64_t len, uint64_t numel, bool count, bool be,
                        uint64_t *hdr)
{
    uint64_t h = 8 * (numel + 1) + (count ? 8 : 0);
    if (numel >= len / 8 || h > len)
        return false;
    if (count && rd_u64(p, be) != numel)
        return false;
    const unsigned char *offs = p + (count ? 8 : 0);
    uint64_t prev = 0;
    for (uint64_t i = 0; i <= numel; i++) {
        uint64_t o = rd_u64(offs + 8 * i, be);
        if ((i == 0 && o != 0) || o < prev || o > len - h)
            return false;
        prev = o;
    }
    if (prev != len - h)
        return false;
    *hdr = h;
    return true;
}

static int read_strings(struct ctx *c, const char *name, const unsigned char *p, uint64_t len,
                        struct ck_tensor *t)
{
    uint64_t numel, hdr = 0;
    int err;
    bool count = false, be = false;
    if ((err = ck_tensor_numel(t, &numel)) < 0)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': bad shape", c->file, name);
    static const bool layouts[4][2] = {{true, true}, {true, false}, {false, true}, {false, false}};
    int k;
    for (k = 0; k < 4; k++) {
        count = layouts[k][0];
        be = layouts[k][1];
        if (utf8_layout(p, len, numel, count, be, &hdr))
            break;
    }
    if (k == 4)
        return ck_error(CK_EFORMAT,
                        "'%s': tensor '%s': utf8 buffer of %" PRIu64 " bytes does not hold %" PRIu64
                        " strings",
                        c->file, name, len, numel);
    void *mem;
    if ((err = ck_pool_alloc(c->pool, numel * sizeof(struct ck_bytes), &mem)) < 0)
        return err;
    struct ck_bytes *strs = mem;
    const unsigned char *offs = p + (count ? 8 : 0);
    for (uint64_t i = 0; i < numel; i++) {
        uint64_t a = rd_u64(offs + 8 * i, be), b = rd_u64(offs + 8 * (i + 1), be);
        strs[i].p = p + hdr + a;
        strs[i].len = b - a;
    }
    t->dtype = CK_DT_STRING;
    t->strings = strs;
    t->data = p + hdr;
    t->nbytes = len - hdr;
    return 0;
}

/* Fills t from a FlatArray table (the dtype, dims, bytes and flags). */
static int read_array(struct ctx *c, const char *name, const struct ck_fb_table *arr,
                      struct ck_tensor *t)
{
    struct ck_fb_vec si, buf;
    uint8_t dt, order8;
    int err;
    int has_buf;
    if ((err = ck_fb_vector(arr, FA_SHAPE, 8, &si)) < 0 ||
        (err = has_buf = ck_fb_vector(arr, FA_BUFFER, 1, &buf)) < 0 ||
        (err = ck_fb_u8(arr, FA_DTYPE, 0, &dt)) < 0 ||
        (err = ck_fb_u8(arr, FA_BYTEORDER, 0, &order8)) < 0)
        return ck_error_wrap(err, "'%s': tensor '%s'", c->file, name);
    if (si.n < 4)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': shape info of %u values is too short",
                        c->file, name, si.n);
    int64_t rank = ck_fb_vec_i64(&si, 0);
    if (rank < 0 || rank > CK_TENSOR_MAX_RANK || (uint64_t)si.n != 2 * (uint64_t)rank + 4)
        return ck_error(CK_EFORMAT,
                        "'%s': tensor '%s': shape info of %u values does not fit rank %" PRId64,
                        c->file, name, si.n, rank);
    int64_t order = ck_fb_vec_i64(&si, si.n - 1), extras = ck_fb_vec_i64(&si, si.n - 3);
    if (order != SD_ORDER_C && order != SD_ORDER_F)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': unknown order %" PRId64, c->file, name,
                        order);
    t->rank = (int)rank;
    for (int i = 0; i < t->rank; i++) {
        t->dims[i] = ck_fb_vec_i64(&si, (uint32_t)i + 1);
        if (t->dims[i] < 0)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': dimension %d is %" PRId64, c->file,
                            name, i, t->dims[i]);
    }
    t->fortran_order = order == SD_ORDER_F;
    t->dtype = sd_dtype(dt);
    if (t->dtype == CK_DT_INVALID || dt == SD_UTF16 || dt == SD_UTF32)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': unsupported dtype %u", c->file, name, dt);
    uint64_t numel;
    if ((err = ck_tensor_numel(t, &numel)) < 0)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': shape overflows", c->file, name);
    if (!has_buf) {
        if (numel != 0 && !(extras & SD_FLAG_EMPTY))
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': no buffer for %" PRIu64 " elements",
                            c->file, name, numel);
        if (t->rank == 0) {
            t->rank = 1;
            t->dims[0] = 0;
        }
        t->data = (const unsigned char *)"";
        t->nbytes = 0;
        return 0;
    }
    const unsigned char *p = buf.fb->p + buf.pos;
    if (t->dtype == CK_DT_STRING)
        return read_strings(c, name, p, buf.n, t);
    size_t es = ck_dtype_size(t->dtype);
    if (numel > buf.n / es || numel * es != buf.n)
        return ck_error(CK_EFORMAT,
                        "'%s': tensor '%s': buffer of %u bytes for %" PRIu64
                        " elements of %zu bytes",
                        c->file, name, buf.n, numel, es);
    t->data = p;
    t->nbytes = buf.n;
    t->big_endian = order8 == 1 && es > 1;
    return 0;
}

static int var_cmp(const void *x, const void *y)
{
    const struct var *a = x, *b = y;
    if (a->a != b->a)
        return a->a < b->a ? -1 : 1;
    return a->b < b->b ? -1 : a->b > b->b;
}

static const char *var_lookup(const struct ctx *c, int32_t a, int32_t b)
{
    struct var key = {a, b, NULL};
    if (!c->nvars)
        return NULL;
    const struct var *v = bsearch(&key, c->vars, c->nvars, sizeof(*c->vars), var_cmp);
    return v ? v->name : NULL;
}

static int name_cmp(const void *x, const void *y)
{
    return strcmp(*(const char *const *)x, *(const char *const *)y);
}

static int read_variable(struct ctx *c, uint32_t i, const struct ck_fb_table *v)
{
    struct ck_fb_table idt, arr;
    struct ck_fb_vec shape;
    const char *np;
    uint32_t nl;
    uint8_t dt, vt;
    int32_t a = 0, b = 0;
    char what[64], *name;
    struct ck_tensor t;
    int err, has_arr, has_shape;
    memset(&t, 0, sizeof(t));
    snprintf(what, sizeof(what), "variable %u", i);
    if ((err = ck_fb_string(v, FV_NAME, &np, &nl)) < 0 || (err = ck_fb_table(v, FV_ID, &idt)) < 0)
        return ck_error_wrap(err, "'%s': %s", c->file, what);
    if (err == 1 &&
        ((err = ck_fb_i32(&idt, 0, 0, &a)) < 0 || (err = ck_fb_i32(&idt, 1, 0, &b)) < 0))
        return ck_error_wrap(err, "'%s': %s", c->file, what);
    if ((err = fb_name(c, np, nl, what, &name)) < 0)
        return err;
    if ((err = ck_fb_u8(v, FV_DTYPE, 0, &dt)) < 0 || (err = ck_fb_u8(v, FV_VARTYPE, 0, &vt)) < 0 ||
        (err = has_shape = ck_fb_vector(v, FV_SHAPE, 8, &shape)) < 0 ||
        (err = has_arr = ck_fb_table(v, FV_NDARRAY, &arr)) < 0)
        return ck_error_wrap(err, "'%s': variable '%s'", c->file, name);
    c->vars[c->nvars++] = (struct var){a, b, name};
    if (vt >= sizeof(sd_roles) / sizeof(sd_roles[0]))
        return ck_error(CK_EFORMAT, "'%s': variable '%s': unknown variable type %u", c->file, name,
                        vt);
    t.name = name;
    t.role = sd_roles[vt];
    if (has_arr) {
        if ((err = read_array(c, name, &arr, &t)) < 0)
            return err;
    } else if (has_shape || vt == 3) {
        if (shape.n > CK_TENSOR_MAX_RANK)
            return ck_error(CK_EFORMAT, "'%s': variable '%s': rank %u is over %d", c->file, name,
                            shape.n, CK_TENSOR_MAX_RANK);
        t.rank = (int)shape.n;
        for (uint32_t k = 0; k < shape.n; k++) {
            t.dims[k] = ck_fb_vec_i64(&shape, k);
            if (t.dims[k] < -1)
                return ck_error(CK_EFORMAT, "'%s': variable '%s': dimension %u is %" PRId64,
                                c->file, name, k, t.dims[k]);
        }
        t.dtype = sd_dtype(dt);
        if (t.dtype == CK_DT_INVALID)
            return ck_error(CK_EFORMAT, "'%s': variable '%s': unsupported dtype %u", c->file, name,
                            dt);
    } else {
        return 0; /* an op output: the graph shows it */
    }
    return ck_tensor_set_add(c->s, &t, NULL);
}

static int read_variables(struct ctx *c, const struct ck_fb_table *g)
{
    struct ck_fb_vec vv;
    int err;
    if ((err = ck_fb_vector(g, FG_VARIABLES, 4, &vv)) < 0)
        return ck_error_wrap(err, "'%s': variables", c->file);
    if (vv.n && !(c->vars = calloc(vv.n, sizeof(*c->vars))))
        return ck_error(CK_ENOMEM, "'%s': out of memory", c->file);
    for (uint32_t i = 0; i < vv.n; i++) {
        struct ck_fb_table v;
        if ((err = ck_fb_vec_table(&vv, i, &v)) < 0)
            return ck_error_wrap(err, "'%s': variable %u", c->file, i);
        if ((err = read_variable(c, i, &v)) < 0)
            return err;
    }
    if (c->nvars)
        qsort(c->vars, c->nvars, sizeof(*c->vars), var_cmp);
    for (size_t i = 1; i < c->nvars; i++)
        if (!var_cmp(&c->vars[i - 1], &c->vars[i]))
            return ck_error(CK_EFORMAT, "'%s': variables '%s' and '%s' share the id %d:%d", c->file,
                            c->vars[i - 1].name, c->vars[i].name, c->vars[i].a, c->vars[i].b);
    const char **names = calloc(c->nvars ? c->nvars : 1, sizeof(*names));
    if (!names)
        return ck_error(CK_ENOMEM, "'%s': out of memory", c->file);
    for (size_t i = 0; i < c->nvars; i++)
        names[i] = c->vars[i].name;
    qsort(names, c->nvars, sizeof(*names), name_cmp);
    for (size_t i = 1; i < c->nvars && !err; i++)
        if (!strcmp(names[i - 1], names[i]))
            err = ck_error(CK_EFORMAT, "'%s': variable '%s' appears twice", c->file, names[i]);
    free(names);
    return err;
}

/* "[a,b,c]" of a numeric vector into a node attribute. */
static int vec_attr(struct ctx *c, struct ck_graph_node *n, const char *key,
                    const struct ck_fb_vec *v, char kind)
{
    struct ck_buf b;
    int err = 0;
    ck_buf_init(&b, 1u << 24);
    err = ck_buf_putc(&b, '[');
    for (uint32_t i = 0; i < v->n && err >= 0; i++) {
        if (i)
            err = ck_buf_putc(&b, ',');
        if (err < 0)
            break;
        if (kind == 'i')
            err = ck_buf_printf(&b, "%" PRId32, ck_fb_vec_i32(v, i));
        else if (kind == 'l')
            err = ck_buf_printf(&b, "%" PRId64, ck_fb_vec_i64(v, i));
        else if (kind == 'd')
            err = ck_buf_printf(&b, "%.17g", ck_fb_vec_f64(v, i));
        else
            err = ck_buf_puts(&b, ck_fb_vec_u8(v, i) ? "true" : "false");
    }
    if (err >= 0)
        err = ck_buf_putc(&b, ']');
    if (err >= 0)
        err = ck_graph_node_add_attr(n, key, ck_buf_str(&b));
    ck_buf_release(&b);
    return err < 0 ? ck_error_wrap(err, "'%s': node '%s': attribute '%s'", c->file, n->name, key)
                   : 0;
}

/* FlatProperties (ADR 0001's named arguments): each becomes the attribute
 * "arg.<name>" holding its first non-empty value list as text. */
static int node_props(struct ctx *c, struct ck_graph_node *n, const struct ck_fb_table *t)
{
    static const struct {
        int slot;
        uint32_t elem;
        char kind;
    } kinds[] = {{FP_L, 8, 'l'}, {FP_I, 4, 'i'}, {FP_D, 8, 'd'}, {FP_B, 1, 'b'}};
    struct ck_fb_vec pv;
    int err;
    if ((err = ck_fb_vector(t, FN_PROPS, 4, &pv)) < 0)
        return ck_error_wrap(err, "'%s': node '%s': properties", c->file, n->name);
    for (uint32_t i = 0; i < pv.n; i++) {
        struct ck_fb_table p;
        const char *np;
        uint32_t nl;
        char key[160];
        if ((err = ck_fb_vec_table(&pv, i, &p)) < 0 || (err = ck_fb_string(&p, FP_NAME, &np, &nl)) < 0)
            return ck_error_wrap(err, "'%s': node '%s': property %u", c->file, n->name, i);
        if (nl == 0 || nl > 128 || memchr(np, 0, nl))
            return ck_error(CK_EFORMAT, "'%s': node '%s': property %u has a bad name", c->file,
                            n->name, i);
        snprintf(key, sizeof(key), "arg.%.*s", (int)nl, np);
        for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
            struct ck_fb_vec v;
            if ((err = ck_fb_vector(&p, kinds[k].slot, kinds[k].elem, &v)) < 0)
                return ck_error_wrap(err, "'%s': node '%s': property '%s'", c->file, n->name,
                                     key + 4);
            if (err == 1 && v.n) {
                if ((err = vec_attr(c, n, key, &v, kinds[k].kind)) < 0)
                    return err;
                break;
            }
        }
    }
    return 0;
}

static int node_attrs(struct ctx *c, struct ck_graph_node *n, const struct ck_fb_table *t)
{
    static const struct {
        int slot;
        const char *key;
        uint32_t elem;
        char kind;
    } vecs[] = {
        {FN_EXTRAINT, "extraInteger", 8, 'l'},
        {FN_EXTRAPARAMS, "extraParams", 8, 'd'},
        {FN_EXTRABOOLS, "extraBools", 1, 'b'},
        {FN_DIMENSIONS, "dimensions", 4, 'i'},
    };
    uint8_t optype;
    int64_t opnum;
    char num[32];
    int err;
    if ((err = ck_fb_u8(t, FN_OPTYPE, 0, &optype)) < 0 ||
        (err = ck_fb_i64(t, FN_OPNUM, 0, &opnum)) < 0)
        return ck_error_wrap(err, "'%s': node '%s'", c->file, n->name);
    snprintf(num, sizeof(num), "%u", optype);
    if ((err = ck_graph_node_add_attr(n, "opType", num)) < 0)
        return err;
    snprintf(num, sizeof(num), "%" PRId64, opnum);
    if ((err = ck_graph_node_add_attr(n, "opNum", num)) < 0)
        return err;
    for (size_t k = 0; k < sizeof(vecs) / sizeof(vecs[0]); k++) {
        struct ck_fb_vec v;
        if ((err = ck_fb_vector(t, vecs[k].slot, vecs[k].elem, &v)) < 0)
            return ck_error_wrap(err, "'%s': node '%s': %s", c->file, n->name, vecs[k].key);
        if (err == 1 && v.n && (err = vec_attr(c, n, vecs[k].key, &v, vecs[k].kind)) < 0)
            return err;
    }
    return node_props(c, n, t);
}

static int node_io(struct ctx *c, struct ck_graph_node *n, const struct ck_fb_table *t, int32_t id)
{
    struct ck_fb_vec ins, outs;
    int err;
    if ((err = ck_fb_vector(t, FN_INPUTPAIRED, 4, &ins)) < 0 ||
        (err = ck_fb_vector(t, FN_OUTPUTNAMES, 4, &outs)) < 0)
        return ck_error_wrap(err, "'%s': node '%s'", c->file, n->name);
    for (uint32_t i = 0; i < ins.n; i++) {
        struct ck_fb_table p;
        int32_t a = 0, b = 0;
        if ((err = ck_fb_vec_table(&ins, i, &p)) < 0 || (err = ck_fb_i32(&p, 0, 0, &a)) < 0 ||
            (err = ck_fb_i32(&p, 1, 0, &b)) < 0)
            return ck_error_wrap(err, "'%s': node '%s': input %u", c->file, n->name, i);
        const char *vn = var_lookup(c, a, b);
        if (!vn)
            return ck_error(CK_EFORMAT, "'%s': node '%s': input %u (%d:%d) names no variable",
                            c->file, n->name, i, a, b);
        if ((err = ck_graph_node_add_input(n, vn)) < 0)
            return err;
    }
    if (outs.n) {
        for (uint32_t i = 0; i < outs.n; i++) {
            const char *sp;
            uint32_t sl;
            char *on, what[48];
            snprintf(what, sizeof(what), "output %u", i);
            if ((err = ck_fb_vec_string(&outs, i, &sp, &sl)) < 0)
                return ck_error_wrap(err, "'%s': node '%s': output %u", c->file, n->name, i);
            if ((err = fb_name(c, sp, sl, what, &on)) < 0 ||
                (err = ck_graph_node_add_output(n, on)) < 0)
                return err;
        }
        return 0;
    }
    /* No names: the variables this node's id produces, by output index
     * (c->vars is sorted by id pair). */
    size_t lo = 0, hi = c->nvars;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->vars[mid].a < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = lo; i < c->nvars && c->vars[i].a == id; i++)
        if ((err = ck_graph_node_add_output(n, c->vars[i].name)) < 0)
            return err;
    return 0;
}

static int read_nodes(struct ctx *c, const struct ck_fb_table *g, struct ck_graph *gr)
{
    struct ck_fb_vec nv;
    int err;
    if ((err = ck_fb_vector(g, FG_NODES, 4, &nv)) < 0)
        return ck_error_wrap(err, "'%s': nodes", c->file);
    for (uint32_t i = 0; i < nv.n; i++) {
        struct ck_fb_table t;
        const char *np, *op;
        uint32_t nl, ol;
        int32_t id;
        char what[32], *name, *opname, opbuf[32];
        struct ck_graph_node *n;
        snprintf(what, sizeof(what), "node %u", i);
        if ((err = ck_fb_vec_table(&nv, i, &t)) < 0 ||
            (err = ck_fb_string(&t, FN_NAME, &np, &nl)) < 0 ||
            (err = ck_fb_string(&t, FN_OPNAME, &op, &ol)) < 0 ||
            (err = ck_fb_i32(&t, FN_ID, 0, &id)) < 0)
            return ck_error_wrap(err, "'%s': %s", c->file, what);
        if ((err = fb_name(c, np, nl, what, &name)) < 0)
            return err;
        if (ol) {
            if ((err = fb_name(c, op, ol, what, &opname)) < 0)
                return err;
        } else {
            uint8_t ot;
            ck_fb_u8(&t, FN_OPTYPE, 0, &ot);
            snprintf(opbuf, sizeof(opbuf), "optype-%u", ot);
            opname = opbuf;
        }
        if ((err = ck_graph_add_node(gr, name, opname, &n)) < 0 ||
            (err = node_attrs(c, n, &t)) < 0 || (err = node_io(c, n, &t, id)) < 0)
            return err;
    }
    return 0;
}

/* The node outputs no node consumes, as graph outputs. */
static int infer_outputs(struct ck_graph *gr)
{
    struct ck_nameidx ins;
    size_t n = 0;
    int err;
    for (size_t i = 0; i < gr->nnodes; i++)
        n += gr->nodes[i].ninputs;
    const char **names = calloc(n ? n : 1, sizeof(*names));
    if (!names)
        return ck_error(CK_ENOMEM, "out of memory");
    n = 0;
    for (size_t i = 0; i < gr->nnodes; i++)
        for (size_t k = 0; k < gr->nodes[i].ninputs; k++)
            names[n++] = gr->nodes[i].inputs[k];
    err = ck_nameidx_names(&ins, names, n);
    for (size_t i = 0; i < gr->nnodes && err >= 0; i++)
        for (size_t k = 0; k < gr->nodes[i].noutputs && err >= 0; k++)
            if (!ck_nameidx_find(&ins, gr->nodes[i].outputs[k]))
                err = ck_graph_add_io(gr, true, gr->nodes[i].outputs[k]);
    ck_nameidx_release(&ins);
    free(names);
    if (err >= 0)
        err = ck_graph_add_attr(gr, "outputs", "inferred");
    return err;
}

static int read_io(struct ctx *c, const struct ck_fb_table *g, struct ck_graph *gr)
{
    struct ck_fb_vec ph, outs, loss;
    int err;
    if ((err = ck_fb_vector(g, FG_PLACEHOLDERS, 4, &ph)) < 0 ||
        (err = ck_fb_vector(g, FG_OUTPUTS, 4, &outs)) < 0 ||
        (err = ck_fb_vector(g, FG_LOSS, 4, &loss)) < 0)
        return ck_error_wrap(err, "'%s'", c->file);
    struct ck_nameidx tix;
    if ((err = ck_nameidx_tensors(&tix, c->s)) < 0)
        return err;
    for (uint32_t i = 0; i < ph.n && err >= 0; i++) {
        const char *sp;
        uint32_t sl;
        char *name;
        if ((err = ck_fb_vec_string(&ph, i, &sp, &sl)) < 0)
            err = ck_error_wrap(err, "'%s': placeholder %u", c->file, i);
        else if ((err = fb_name(c, sp, sl, "a placeholder", &name)) < 0)
            ;
        else if (!ck_nameidx_find(&tix, name))
            err = ck_error(CK_EFORMAT, "'%s': placeholder '%s' is not a variable", c->file, name);
        else
            err = ck_graph_add_io(gr, false, name);
    }
    ck_nameidx_release(&tix);
    if (err < 0)
        return err;
    for (uint32_t i = 0; i < outs.n; i++) {
        struct ck_fb_table p;
        int32_t a = 0, b = 0;
        if ((err = ck_fb_vec_table(&outs, i, &p)) < 0 || (err = ck_fb_i32(&p, 0, 0, &a)) < 0 ||
            (err = ck_fb_i32(&p, 1, 0, &b)) < 0)
            return ck_error_wrap(err, "'%s': output %u", c->file, i);
        const char *vn = var_lookup(c, a, b);
        if (!vn)
            return ck_error(CK_EFORMAT, "'%s': output %u (%d:%d) names no variable", c->file, i, a,
                            b);
        if ((err = ck_graph_add_io(gr, true, vn)) < 0)
            return err;
    }
    if (outs.n == 0 && (err = infer_outputs(gr)) < 0)
        return err;
    struct ck_buf lv = CK_BUF_INIT;
    for (uint32_t i = 0; i < loss.n && err >= 0; i++) {
        const char *sp;
        uint32_t sl;
        char *name;
        if ((err = ck_fb_vec_string(&loss, i, &sp, &sl)) < 0)
            err = ck_error_wrap(err, "'%s': loss variable %u", c->file, i);
        else if ((err = fb_name(c, sp, sl, "a loss variable", &name)) >= 0)
            err = ck_buf_printf(&lv, "%s%s", i ? "," : "", name);
    }
    if (err >= 0 && loss.n)
        err = ck_graph_add_attr(gr, "loss_variables", ck_buf_str(&lv));
    ck_buf_release(&lv);
    if (err < 0)
        return err;
    return 0;
}

/* The name an optimizer-state array takes in the set: "<param>/updater/<key>". */
static int updater_name(struct ck_pool *pool, const char *file, const char *param,
                        const char *key, size_t keylen, char **out)
{
    char buf[8192];
    int n = snprintf(buf, sizeof(buf), "%s/updater/%.*s", param, (int)keylen, key);
    if (n < 0 || (size_t)n >= sizeof(buf) || keylen == 0 || memchr(key, 0, keylen))
        return ck_error(CK_EFORMAT, "'%s': updater state of '%s': bad key", file, param);
    if (!(*out = ck_pool_strdup(pool, buf, (size_t)n)))
        return ck_error(CK_ENOMEM, "'%s': out of memory", file);
    return 0;
}

/* FlatGraph.updaterState (what SameDiff.save(file, true) writes): each
 * state array is a tensor "<param>/updater/<key>" with role "updater". */
static int read_updater(struct ctx *c, const struct ck_fb_table *g)
{
    struct ck_fb_vec uv;
    int err;
    if ((err = ck_fb_vector(g, FG_UPDATER, 4, &uv)) < 0)
        return ck_error_wrap(err, "'%s': updater state", c->file);
    for (uint32_t i = 0; i < uv.n; i++) {
        struct ck_fb_table u;
        struct ck_fb_vec keys, vals;
        const char *pp;
        uint32_t pl;
        char *param;
        if ((err = ck_fb_vec_table(&uv, i, &u)) < 0 ||
            (err = ck_fb_string(&u, US_PARAM, &pp, &pl)) < 0 ||
            (err = ck_fb_vector(&u, US_KEYS, 4, &keys)) < 0 ||
            (err = ck_fb_vector(&u, US_VALUES, 4, &vals)) < 0)
            return ck_error_wrap(err, "'%s': updater state %u", c->file, i);
        if ((err = fb_name(c, pp, pl, "an updater state", &param)) < 0)
            return err;
        if (keys.n != vals.n)
            return ck_error(CK_EFORMAT, "'%s': updater state of '%s': %u keys for %u arrays",
                            c->file, param, keys.n, vals.n);
        for (uint32_t k = 0; k < keys.n; k++) {
            struct ck_fb_table arr;
            const char *kp;
            uint32_t kl;
            char *name;
            struct ck_tensor t;
            memset(&t, 0, sizeof(t));
            if ((err = ck_fb_vec_string(&keys, k, &kp, &kl)) < 0 ||
                (err = ck_fb_vec_table(&vals, k, &arr)) < 0)
                return ck_error_wrap(err, "'%s': updater state of '%s'", c->file, param);
            if ((err = updater_name(c->pool, c->file, param, kp, kl, &name)) < 0 ||
                (err = read_array(c, name, &arr, &t)) < 0)
                return err;
            t.name = name;
            t.role = "updater";
            if ((err = ck_tensor_set_add(c->s, &t, NULL)) < 0)
                return err;
        }
    }
    return 0;
}

/* Reads a FlatGraph held in p (memory of the set) into c->s. */
static int read_graph(struct ck_tensor_set *s, struct ck_pool *pool, const char *file,
                      const unsigned char *p, uint64_t len)
{
    struct ctx c = {s, file, NULL, 0, pool};
    struct ck_fb fb;
    struct ck_fb_table g;
    struct ck_graph *gr = NULL;
    int64_t id;
    const char *tc;
    uint32_t tcl;
    char num[32];
    int err;
    if ((err = ck_fb_init(&fb, p, len)) < 0 || (err = ck_fb_root(&fb, &g)) < 0 ||
        (err = ck_fb_i64(&g, FG_ID, 0, &id)) < 0 ||
        (err = ck_fb_string(&g, FG_TRAINING, &tc, &tcl)) < 0) {
        err = ck_error_wrap(err, "'%s': not a SameDiff graph", file);
        goto out;
    }
    if ((err = read_variables(&c, &g)) < 0)
        goto out;
    if (!(gr = ck_graph_new())) {
        err = ck_error(CK_ENOMEM, "'%s': out of memory", file);
        goto out;
    }
    if ((err = read_nodes(&c, &g, gr)) < 0 || (err = read_io(&c, &g, gr)) < 0 ||
        (err = read_updater(&c, &g)) < 0)
        goto out;
    snprintf(num, sizeof(num), "%" PRId64, id);
    if ((err = ck_tensor_set_add_meta(s, "graph_id", num)) < 0)
        goto out;
    if (tcl) {
        char *js = ck_pool_strdup(pool, tc, tcl);
        if (!js || (err = ck_tensor_set_add_meta(s, "training_config", js)) < 0) {
            err = err < 0 ? err : ck_error(CK_ENOMEM, "'%s': out of memory", file);
            goto out;
        }
    }
    s->graph = gr;
    gr = NULL;
out:
    ck_graph_free(gr);
    free(c.vars);
    return err;
}

/* ---- the ADR-0001 zip ---- */

/* Splits text into lines (in place, in set memory); calls fn for each non-empty one. */
static int each_line(char *text, uint64_t len, int (*fn)(void *, char *, unsigned), void *arg)
{
    unsigned lineno = 0;
    char *p = text, *end = text + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end;
        lineno++;
        *e = 0;
        if (e > p && e[-1] == '\r')
            e[-1] = 0;
        int err = *p ? fn(arg, p, lineno) : 0;
        if (err < 0)
            return err;
        p = e + 1;
    }
    return 0;
}

struct tagref {
    const char *name;
    size_t index;
};

struct zipctx {
    struct ck_zipin zi;
    struct ck_tensor_set *s;
    const char *path;
    char **tags;
    size_t ntags, captags;
    struct tagref *byname; /* owned: the tags sorted by name, case folded */
    unsigned *tagline;     /* owned: each tag's line of tags.txt */
    const char *tag;
    size_t tagidx;
    struct ck_nameidx tensors; /* built before params.txt is read */
    struct ck_pool pool;
    const struct ck_jin *ukeys; /* trainingConfig's "updaterStateKeys" object, or NULL */
};

static int read_text(struct zipctx *z, const char *member, char **out, uint64_t *len)
{
    uint64_t idx;
    const unsigned char *d;
    int err;
    if ((err = ck_zipin_find(&z->zi, member, &idx)) < 0 ||
        (err = ck_zipin_read(&z->zi, z->s, idx, SD_MAX_TEXT, &d, len)) < 0)
        return err;
    if (memchr(d, 0, *len))
        return ck_error(CK_EFORMAT, "'%s': '%s' holds a NUL byte", z->path, member);
    *out = (char *)d; /* set memory, writable: ck_zipin_read allocates it */
    return 0;
}

static int add_tag(void *arg, char *line, unsigned lineno)
{
    struct zipctx *z = arg;
    if (!ck_zipin_name_is_safe(line) || strchr(line, '/') || strlen(line) > 255)
        return ck_error(CK_EFORMAT, "'%s': tags.txt line %u: '%s' is not a valid tag", z->path,
                        lineno, line);
    if (z->ntags == z->captags) { /* doubling: a 100k-line tags.txt costs no copy per line */
        size_t cap = z->captags ? 2 * z->captags : 16;
        char **nt = realloc(z->tags, cap * sizeof(*nt));
        unsigned *nl = nt ? realloc(z->tagline, cap * sizeof(*nl)) : NULL;
        if (nt)
            z->tags = nt;
        if (!nl)
            return ck_error(CK_ENOMEM, "'%s': out of memory for %zu tags", z->path, cap);
        z->tagline = nl;
        z->captags = cap;
    }
    z->tagline[z->ntags] = lineno;
    z->tags[z->ntags++] = line;
    return 0;
}

static int tagref_cmp(const void *a, const void *b)
{
    const struct tagref *x = a, *y = b;
    int c = strcasecmp(x->name, y->name);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

/* The tags sorted by name (case folded, as DL4J's tags are): each name then
 * costs a binary search, and a tag listed twice is found in n log n, not n^2
 * (a 100k-line tags.txt took 12 s). */
static int index_tags(struct zipctx *z)
{
    if (!(z->byname = malloc((z->ntags ? z->ntags : 1) * sizeof *z->byname)))
        return ck_error(CK_ENOMEM, "'%s': out of memory for %zu tags", z->path, z->ntags);
    for (size_t i = 0; i < z->ntags; i++)
        z->byname[i] = (struct tagref){z->tags[i], i};
    qsort(z->byname, z->ntags, sizeof *z->byname, tagref_cmp);
    for (size_t i = 1; i < z->ntags; i++)
        if (!strcasecmp(z->byname[i - 1].name, z->byname[i].name)) {
            size_t k = z->byname[i].index; /* the later of the two */
            return ck_error(CK_EFORMAT, "'%s': tags.txt line %u: tag '%s' appears twice",
                            z->path, z->tagline[k], z->tags[k]);
        }
    return 0;
}

/* The index of the tag named name[0..len) (case folded), or ntags. */
static size_t find_tag(const struct zipctx *z, const char *name, size_t len)
{
    size_t lo = 0, hi = z->ntags;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const char *t = z->byname[mid].name;
        int c = strncasecmp(t, name, len);
        if (c == 0)
            c = t[len] ? 1 : 0;
        if (c == 0)
            return z->byname[mid].index;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return z->ntags;
}

static int is_digits(const char *p)
{
    if (!*p || strlen(p) > 9)
        return 0;
    for (; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

static int add_param(void *arg, char *line, unsigned lineno)
{
    struct zipctx *z = arg;
    char member[600], label[4800];
    const char *tag = z->tag, *num;
    char *sp = strrchr(line, ' ');
    int err;
    if (!sp || sp == line)
        return ck_error(CK_EFORMAT, "'%s': %s/params.txt line %u: expected '<name> <file>'",
                        z->path, z->tag, lineno);
    *sp = 0;
    num = sp + 1;
    char *slash = strchr(sp + 1, '/');
    if (slash) {
        *slash = 0;
        tag = sp + 1;
        num = slash + 1;
        size_t i = find_tag(z, tag, strlen(tag));
        if (i == z->ntags)
            return ck_error(CK_EFORMAT, "'%s': %s/params.txt line %u: unknown tag '%s'", z->path,
                            z->tag, lineno, tag);
        /* A reference points at a file an older tag stored; one to this tag
         * or a newer one could close a cycle once tags refer to each other. */
        if (i >= z->tagidx)
            return ck_error(CK_EFORMAT,
                            "'%s': %s/params.txt line %u: reference to tag '%s' is circular or "
                            "forward (only older tags can be referenced)",
                            z->path, z->tag, lineno, tag);
        tag = z->tags[i];
    }
    if (!is_digits(num))
        return ck_error(CK_EFORMAT, "'%s': %s/params.txt line %u: '%s' is not a file number",
                        z->path, z->tag, lineno, num);
    const struct ck_nameidx_entry *e = ck_nameidx_find(&z->tensors, line);
    struct ck_tensor *t = e ? &z->s->tensors[e->index] : NULL;
    if (!t)
        return ck_error(CK_EFORMAT, "'%s': %s/params.txt line %u: graph has no variable '%s'",
                        z->path, z->tag, lineno, line);
    snprintf(member, sizeof(member), "%s/params/%s.fb", tag, num);
    snprintf(label, sizeof(label), "%s: %s", z->path, member);
    uint64_t idx, len;
    const unsigned char *d;
    if ((err = ck_zipin_find(&z->zi, member, &idx)) < 0)
        return ck_error_wrap(CK_EFORMAT, "%s/params.txt line %u", z->tag, lineno);
    if ((err = ck_zipin_read(&z->zi, z->s, idx, SD_MAX_MEMBER, &d, &len)) < 0)
        return err;
    struct ck_fb fb;
    struct ck_fb_table arr;
    struct ctx c = {z->s, label, NULL, 0, &z->pool};
    if ((err = ck_fb_init(&fb, d, len)) < 0 || (err = ck_fb_root(&fb, &arr)) < 0)
        return ck_error_wrap(err, "'%s'", label);
    struct ck_tensor nt;
    memset(&nt, 0, sizeof(nt));
    if ((err = read_array(&c, t->name, &arr, &nt)) < 0)
        return err;
    t->dtype = nt.dtype;
    t->rank = nt.rank;
    memcpy(t->dims, nt.dims, sizeof(t->dims));
    t->data = nt.data;
    t->nbytes = nt.nbytes;
    t->big_endian = nt.big_endian;
    t->fortran_order = nt.fortran_order;
    t->strings = nt.strings;
    return 0;
}

/* tags.txt and the folders agree: every member is tags.txt or sits under a
 * listed tag (spelled as listed), and every listed tag has its graph. */
static int check_folders(struct zipctx *z)
{
    bool *seen = calloc(z->ntags, 1);
    int err = 0;
    if (!seen)
        return ck_error(CK_ENOMEM, "'%s': out of memory", z->path);
    for (uint64_t i = 0; i < z->zi.nentries && err >= 0; i++) {
        const char *name = ck_zipin_name(&z->zi, i);
        if (!name || !strcmp(name, "tags.txt"))
            continue;
        const char *slash = strchr(name, '/');
        size_t k = slash ? find_tag(z, name, (size_t)(slash - name)) : z->ntags;
        if (k < z->ntags && strncmp(z->tags[k], name, (size_t)(slash - name)))
            k = z->ntags; /* spelled otherwise than listed */
        if (k == z->ntags)
            err = ck_error(CK_EFORMAT,
                           "'%s': member '%s' is not under a tag tags.txt lists (tags.txt "
                           "disagrees with the folders)",
                           z->path, name);
        else if (!strcmp(slash + 1, "graph.fb"))
            seen[k] = true;
    }
    for (size_t k = 0; k < z->ntags && err >= 0; k++)
        if (!seen[k])
            err = ck_error(CK_EFORMAT, "'%s': tags.txt lists '%s' but '%s/graph.fb' is missing",
                           z->path, z->tags[k], z->tags[k]);
    free(seen);
    return err;
}

/* Resolves "<N>" or "<tag>/<N>" of the current tag's list file to a member
 * "<tag>/<folder>/<N>.fb" (references only to older tags). */
static int ref_member(struct zipctx *z, const char *list, unsigned lineno, char *ref,
                      const char *folder, char *member, size_t msz)
{
    const char *tag = z->tag, *num = ref;
    char *slash = strchr(ref, '/');
    if (slash) {
        *slash = 0;
        size_t i = find_tag(z, ref, strlen(ref));
        if (i == z->ntags)
            return ck_error(CK_EFORMAT, "'%s': %s/%s line %u: unknown tag '%s'", z->path, z->tag,
                            list, lineno, ref);
        if (i >= z->tagidx)
            return ck_error(CK_EFORMAT,
                            "'%s': %s/%s line %u: reference to tag '%s' is circular or forward "
                            "(only older tags can be referenced)",
                            z->path, z->tag, list, lineno, ref);
        tag = z->tags[i];
        num = slash + 1;
    }
    if (!is_digits(num))
        return ck_error(CK_EFORMAT, "'%s': %s/%s line %u: '%s' is not a file number", z->path,
                        z->tag, list, lineno, num);
    snprintf(member, msz, "%s/%s/%s.fb", tag, folder, num);
    return 0;
}

/* updater.txt: "<param> <i> <j> ..." (one file per state array, keys in the
 * order trainingConfig's "updaterStateKeys" lists, else "0", "1", ...). */
static int add_updater(void *arg, char *line, unsigned lineno)
{
    struct zipctx *z = arg;
    char *refs[64];
    int nrefs = 0, err;
    const struct ck_jin *keys;
    /* The references are the trailing words that look like one. */
    char *end = line + strlen(line);
    while (nrefs < 64) {
        char *sp = memrchr(line, ' ', (size_t)(end - line));
        if (!sp || sp == line || !sp[1] || !isdigit((unsigned char)end[-1]))
            break;
        refs[nrefs++] = sp + 1;
        *sp = 0;
        end = sp;
    }
    if (nrefs == 0)
        return ck_error(CK_EFORMAT, "'%s': %s/updater.txt line %u: expected '<name> <file>...'",
                        z->path, z->tag, lineno);
    keys = z->ukeys ? ck_jin_get(z->ukeys, line) : NULL;
    if (keys && (keys->type != CK_JIN_ARRAY || keys->n != (size_t)nrefs))
        return ck_error(CK_EFORMAT, "'%s': %s/updater.txt line %u: '%s' has %d files but %zu keys",
                        z->path, z->tag, lineno, line, nrefs, keys ? keys->n : 0);
    const struct ck_jin *key = keys ? keys->first : NULL;
    for (int k = nrefs - 1; k >= 0; k--) {
        char member[600], label[4800], kbuf[24], *name;
        uint64_t idx, len;
        const unsigned char *d;
        struct ck_fb fb;
        struct ck_fb_table arr;
        struct ck_tensor t;
        if ((err = ref_member(z, "updater.txt", lineno, refs[k], "updater", member,
                              sizeof(member))) < 0)
            return err;
        snprintf(label, sizeof(label), "%s: %s", z->path, member);
        const char *kname = kbuf;
        if (key && key->type == CK_JIN_STRING)
            kname = key->str;
        else
            snprintf(kbuf, sizeof(kbuf), "%d", nrefs - 1 - k);
        if (key)
            key = key->next;
        if ((err = ck_zipin_find(&z->zi, member, &idx)) < 0)
            return ck_error_wrap(CK_EFORMAT, "%s/updater.txt line %u", z->tag, lineno);
        if ((err = ck_zipin_read(&z->zi, z->s, idx, SD_MAX_MEMBER, &d, &len)) < 0)
            return err;
        struct ctx c = {z->s, label, NULL, 0, &z->pool};
        if ((err = ck_fb_init(&fb, d, len)) < 0 || (err = ck_fb_root(&fb, &arr)) < 0)
            return ck_error_wrap(err, "'%s'", label);
        if ((err = updater_name(&z->pool, label, line, kname, strlen(kname), &name)) < 0)
            return err;
        memset(&t, 0, sizeof(t));
        if ((err = read_array(&c, name, &arr, &t)) < 0)
            return err;
        t.name = name;
        t.role = "updater";
        if ((err = ck_tensor_set_add(z->s, &t, NULL)) < 0)
            return err;
    }
    return 0;
}

/* The tag's updater state, when it has one. */
static int read_updater_zip(struct zipctx *z)
{
    char member[600], *text = NULL;
    uint64_t idx, len = 0;
    const unsigned char *d;
    struct ck_jin_doc *doc = NULL;
    int err;
    snprintf(member, sizeof(member), "%s/updater.txt", z->tag);
    if (ck_zipin_find(&z->zi, member, &idx) < 0) {
        ck_error_clear();
        return 0;
    }
    snprintf(member, sizeof(member), "%s/trainingConfig.fb", z->tag);
    if (ck_zipin_find(&z->zi, member, &idx) == 0) {
        struct ck_fb fb;
        struct ck_fb_table g;
        const char *tc;
        uint32_t tcl = 0;
        const struct ck_jin *root;
        if ((err = ck_zipin_read(&z->zi, z->s, idx, SD_MAX_TEXT, &d, &len)) < 0)
            return err;
        if ((err = ck_fb_init(&fb, d, len)) < 0 || (err = ck_fb_root(&fb, &g)) < 0 ||
            (err = ck_fb_string(&g, FG_TRAINING, &tc, &tcl)) < 0)
            return ck_error_wrap(err, "'%s': %s", z->path, member);
        if (tcl) {
            if ((err = ck_jin_parse(tc, tcl, &doc, &root)) < 0)
                return ck_error_wrap(err, "'%s': %s: trainingConfig", z->path, member);
            z->ukeys = ck_jin_get(root, "updaterStateKeys");
        }
    } else {
        ck_error_clear();
    }
    snprintf(member, sizeof(member), "%s/updater.txt", z->tag);
    if ((err = read_text(z, member, &text, &len)) >= 0)
        err = each_line(text, len, add_updater, z);
    z->ukeys = NULL;
    ck_jin_free(doc);
    return err;
}

static int open_zip(struct ck_tensor_set *s, const char *path, const char *want)
{
    struct zipctx z;
    char member[600], label[4800], *text = NULL;
    uint64_t len, idx;
    const unsigned char *d;
    struct ck_buf all = CK_BUF_INIT;
    int err;
    memset(&z, 0, sizeof(z));
    z.s = s;
    z.path = path;
    ck_pool_init(&z.pool, s);
    if ((err = ck_zipin_open(&z.zi, path)) < 0)
        return err;
    if ((err = read_text(&z, "tags.txt", &text, &len)) < 0 ||
        (err = each_line(text, len, add_tag, &z)) < 0 || (err = index_tags(&z)) < 0)
        goto out;
    if (!z.ntags) {
        err = ck_error(CK_EFORMAT, "'%s': tags.txt lists no tag", path);
        goto out;
    }
    if ((err = check_folders(&z)) < 0)
        goto out;
    z.tagidx = z.ntags - 1;
    if (want) {
        z.tagidx = find_tag(&z, want, strlen(want));
        if (z.tagidx == z.ntags) {
            err = ck_error(CK_ENOENT, "'%s': no tag '%s' (tags.txt lists %zu)", path, want,
                           z.ntags);
            goto out;
        }
    }
    z.tag = z.tags[z.tagidx];
    snprintf(member, sizeof(member), "%s/graph.fb", z.tag);
    snprintf(label, sizeof(label), "%s: %s", path, member);
    if ((err = ck_zipin_find(&z.zi, member, &idx)) < 0 ||
        (err = ck_zipin_read(&z.zi, s, idx, SD_MAX_MEMBER, &d, &len)) < 0 ||
        (err = read_graph(s, &z.pool, label, d, len)) < 0)
        goto out;
    snprintf(member, sizeof(member), "%s/params.txt", z.tag);
    if (ck_zipin_find(&z.zi, member, &idx) == 0) {
        if ((err = read_text(&z, member, &text, &len)) < 0 ||
            (err = ck_nameidx_tensors(&z.tensors, s)) < 0 ||
            (err = each_line(text, len, add_param, &z)) < 0)
            goto out;
    } else {
        ck_error_clear();
    }
    if ((err = read_updater_zip(&z)) < 0)
        goto out;
    for (size_t i = 0; i < z.ntags && err >= 0; i++)
        err = ck_buf_printf(&all, "%s%s", i ? "," : "", z.tags[i]);
    if (err < 0 || (err = ck_tensor_set_add_meta(s, "tag", z.tag)) < 0 ||
        (err = ck_tensor_set_add_meta(s, "tags", ck_buf_str(&all))) < 0)
        goto out;
out:
    ck_buf_release(&all);
    ck_nameidx_release(&z.tensors);
    free(z.tags);
    free(z.tagline);
    free(z.byname);
    ck_zipin_close(&z.zi);
    return err;
}

static int sd_probe(const char *full, const unsigned char *head, size_t headlen)
{
    char file[4096], h2[64];
    const char *want, *path = full;
    if (headlen == 0 && ck_path_split_part(full, file, sizeof(file), &want)) {
        /* "RUN.zip#TAG": probe the archive itself. */
        FILE *f = fopen(file, "rb");
        if (!f)
            return CK_PROBE_NO;
        headlen = fread(h2, 1, sizeof(h2), f);
        fclose(f);
        head = (const unsigned char *)h2;
        path = file;
    }
    if (ck_zipin_is_zip(head, headlen)) {
        char jp[4096];
        struct stat st;
        /* An append a crash interrupted: open() rolls it back first. */
        if (ck_zipjournal_path(path, jp, sizeof(jp)) == 0 && stat(jp, &st) == 0)
            return CK_PROBE_CONTENT;
        struct ck_zipin zi;
        uint64_t idx;
        int score = CK_PROBE_NO;
        if (ck_zipin_open(&zi, path) == 0) {
            if (ck_zipin_find(&zi, "tags.txt", &idx) == 0)
                score = CK_PROBE_CONTENT;
            ck_zipin_close(&zi);
        } else if (ck_text_ends_with_icase(path, ".zip")) {
            score = CK_PROBE_NAME; /* a broken archive: open() says what is wrong */
        }
        ck_error_clear();
        return score;
    }
    if (!ck_text_ends_with_icase(path, ".fb"))
        return CK_PROBE_NO;
    return ck_fb_looks_valid(head, headlen) ? CK_PROBE_CONTENT : CK_PROBE_NAME;
}

/* Reads an archive under a shared lock, after rolling back an append a
 * crash interrupted (common/zipjournal.h), so a reader never sees one half
 * done. */
static int open_zip_locked(struct ck_tensor_set *s, const char *path, const char *want)
{
    int err, fd;
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return ck_error_os(CK_EIO, "cannot open '%s'", path);
    while (flock(fd, LOCK_SH) < 0 && errno == EINTR)
        ;
    err = open_zip(s, path, want);
    close(fd);
    return err;
}

static int sd_open(const char *full, struct ck_tensor_set **out)
{
    char file[4096];
    const char *want = NULL, *path = full;
    if (ck_path_split_part(full, file, sizeof(file), &want))
        path = file;
    struct ck_tensor_set *s = ck_tensor_set_new("samediff", path);
    const unsigned char *p;
    uint64_t len;
    int err;
    if (!s)
        return ck_error(CK_ENOMEM, "'%s': out of memory", path);
    if ((err = ck_zipjournal_recover_path(path)) < 0 ||
        (err = ck_tensor_set_map_file(s, path, &p, &len)) < 0)
        goto out;
    if (ck_zipin_is_zip(p, len)) {
        err = open_zip_locked(s, path, want);
    } else if (want) {
        err = ck_error(CK_EFORMAT, "'%s': not a zip archive: it has no tag '%s'", path, want);
    } else {
        struct ck_pool pool;
        ck_pool_init(&pool, s);
        err = read_graph(s, &pool, path, p, len);
    }
out:
    if (err < 0) {
        ck_tensor_set_free(s);
        return err;
    }
    *out = s;
    return 0;
}

const struct ck_reader_ops ck_reader_samediff = {
    .name = "samediff",
    .description = "DL4J SameDiff FlatBuffers graph (.fb) or tagged zip",
    .probe = sd_probe,
    .open = sd_open,
    .verify = ck_zipin_verify_archive, /* a zip: every member (every tag) */
    .to_model = ck_samediff_to_model,
};

/* ---- for readers/sdtests.c: one FlatArray file ---- */

int ck_samediff_flatarray(struct ck_tensor_set *s, const char *label, const char *name,
                          const unsigned char *data, uint64_t len, struct ck_tensor *t)
{
    struct ck_pool pool;
    struct ck_fb fb;
    struct ck_fb_table arr;
    int err;
    ck_pool_init(&pool, s);
    struct ctx c = {s, label, NULL, 0, &pool};
    memset(t, 0, sizeof(*t));
    if ((err = ck_fb_init(&fb, data, len)) < 0 || (err = ck_fb_root(&fb, &arr)) < 0)
        return ck_error_wrap(err, "'%s'", label);
    return read_array(&c, name, &arr, t);
}
