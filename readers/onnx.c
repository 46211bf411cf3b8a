/* ONNX models (.onnx): a protobuf ModelProto, read with the schema-less wire
 * reader (pbwire.h). Field numbers are onnx/onnx.proto's:
 *   ModelProto: ir_version 1, producer_name 2, producer_version 3, domain 4,
 *     model_version 5, graph 7, opset_import 8 (domain 1, version 2),
 *     metadata_props 14 (key 1, value 2)
 *   GraphProto: node 1, name 2, initializer 5, input 11, output 12,
 *     value_info 13, sparse_initializer 15
 *   NodeProto: input 1, output 2, name 3, op_type 4, attribute 5, domain 7
 *   AttributeProto: name 1, f 2, i 3, s 4, t 5, g 6, floats 7, ints 8,
 *     strings 9, tensors 10, graphs 11, type 20
 *   TensorProto: dims 1, data_type 2, segment 3, float_data 4, int32_data 5,
 *     string_data 6, int64_data 7, name 8, raw_data 9, double_data 10,
 *     uint64_data 11, external_data 13 (key 1, value 2), data_location 14
 *   ValueInfoProto: name 1, type 2 -> TypeProto.tensor_type 1 -> elem_type 1,
 *     shape 2 -> dim 1 -> dim_value 1 | dim_param 2
 *
 * Initializers become tensors with the role "initializer" (raw_data used in
 * place in the mapping; typed fields converted into a block of the set);
 * a Constant node's value (and any tensor attribute) becomes a tensor with
 * the role "constant" named by the node's output. The graph (ck_graph) keeps
 * every node with its attributes as text (ints "[1, 2]", floats "%.9g",
 * a tensor attribute "tensor NAME"), and graph attributes "shape.NAME" and
 * "dtype.NAME" for every value whose type the file declares. External data
 * (data_location EXTERNAL: location, offset, length) is read from a file
 * inside the model's folder only: a location that is absolute, climbs with
 * "..", or resolves (through symlinks) outside that folder is refused. */
#include "readers/onnx.h"
#include "readers/pbwire.h"
#include "readers/reader.h"
#include "readers/zipin.h"

#include "common/buf.h"
#include "common/error.h"
#include "common/utf8.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 4096
#define NODES_MAX (1u << 20)
#define ATTR_TEXT_MAX (1u << 16)

static const enum ck_dtype dtypes[] = {
    [1] = CK_DT_F32,      [2] = CK_DT_U8,       [3] = CK_DT_I8,    [4] = CK_DT_U16,
    [5] = CK_DT_I16,      [6] = CK_DT_I32,      [7] = CK_DT_I64,   [8] = CK_DT_STRING,
    [9] = CK_DT_BOOL,     [10] = CK_DT_F16,     [11] = CK_DT_F64,  [12] = CK_DT_U32,
    [13] = CK_DT_U64,     [14] = CK_DT_C64,     [15] = CK_DT_C128, [16] = CK_DT_BF16,
    [17] = CK_DT_F8_E4M3, [19] = CK_DT_F8_E5M2,
};

enum ck_dtype ck_onnx_dtype(uint64_t t)
{
    return t < sizeof dtypes / sizeof dtypes[0] ? dtypes[t] : CK_DT_INVALID;
}

struct ext_file {
    char *location; /* owned */
    const unsigned char *base;
    uint64_t len;
};

struct rd {
    struct ck_tensor_set *s;
    char dir[PATH_MAX]; /* the model's folder, resolved */
    struct ext_file *ext;
    size_t next;
    struct ck_graph *g;
};

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int probe(const char *path, const unsigned char *head, size_t len)
{
    /* ir_version (field 1, varint 3..12) first, then producer_name (2),
     * graph (7) or opset_import (8): what every exporter writes. */
    if (len >= 4 && head[0] == 0x08 && head[1] >= 3 && head[1] <= 12 &&
        (head[2] == 0x12 || head[2] == 0x3a || head[2] == 0x42))
        return CK_PROBE_CONTENT;
    return ends_with(path, ".onnx") ? CK_PROBE_NAME : CK_PROBE_NO;
}

/* A LEN field as a NUL-terminated string in the set (NUL and bad UTF-8 refused). */
static int str(struct rd *r, const struct ck_pb_field *f, const char *what, char **out)
{
    if (f->wire != CK_PB_LEN)
        return ck_error(CK_EFORMAT, "'%s': %s is not a string", r->s->path, what);
    if (f->len > NAME_MAX_LEN * 16 || memchr(f->data, 0, f->len) ||
        !ck_utf8_is_valid((const char *)f->data, f->len))
        return ck_error(CK_EFORMAT, "'%s': %s is not a text string", r->s->path, what);
    if (!(*out = ck_tensor_set_strdup(r->s, (const char *)f->data, f->len)))
        return ck_error(CK_ENOMEM, "out of memory");
    return 0;
}

static int wrap(int err, struct rd *r)
{
    return ck_error_wrap(err, "'%s'", r->s->path);
}

/* ---- tensors ---- */

struct tp {
    char *name;
    uint64_t type;
    int rank;
    int64_t dims[CK_TENSOR_MAX_RANK];
    const struct ck_pb_field *raw;
    struct ck_pb_field rawf;
    bool has_raw, external;
    char *location;
    uint64_t offset, length;
    bool has_length;
    size_t nvalues; /* typed values counted in the first pass */
    size_t nstrings;
};

static int ext_kv(struct rd *r, struct tp *t, const struct ck_pb_field *f)
{
    struct ck_pb m;
    struct ck_pb_field e;
    char *k = NULL, *v = NULL;
    int rc = 0, err = 0;
    ck_pb_init_field(&m, f);
    while ((rc = ck_pb_next(&m, &e)) > 0) {
        if (e.num == 1 && (err = str(r, &e, "external_data key", &k)) < 0)
            return err;
        if (e.num == 2 && (err = str(r, &e, "external_data value", &v)) < 0)
            return err;
    }
    if (rc < 0)
        return wrap(rc, r);
    if (!k || !v)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': external_data entry without key or value",
                        r->s->path, t->name ? t->name : "");
    char *end = NULL;
    if (!strcmp(k, "location")) {
        t->location = v;
    } else if (!strcmp(k, "offset") || !strcmp(k, "length")) {
        unsigned long long n = strtoull(v, &end, 10);
        if (!*v || *end || *v == '-')
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': external_data %s '%s' is not a number",
                            r->s->path, t->name ? t->name : "", k, v);
        if (k[0] == 'o') {
            t->offset = n;
        } else {
            t->length = n;
            t->has_length = true;
        }
    }
    return 0;
}

/* First pass over a TensorProto: everything but the typed values, which are counted. */
static int tensor_meta(struct rd *r, const struct ck_pb_field *f, struct tp *t)
{
    struct ck_pb m;
    struct ck_pb_field e;
    int rc = 0, err = 0;
    size_t c = 0;
    memset(t, 0, sizeof *t);
    ck_pb_init_field(&m, f);
    while ((rc = ck_pb_next(&m, &e)) > 0) {
        switch (e.num) {
        case 1: {
            uint64_t d[CK_TENSOR_MAX_RANK];
            size_t n = 0;
            if ((err = ck_pb_varints_count(&e, &c)) < 0 || t->rank + c > CK_TENSOR_MAX_RANK)
                return ck_error(CK_EFORMAT, "'%s': a tensor of rank over %d", r->s->path,
                                CK_TENSOR_MAX_RANK);
            if ((err = ck_pb_varints(&e, d, CK_TENSOR_MAX_RANK, &n)) < 0)
                return wrap(err, r);
            for (size_t i = 0; i < n; i++)
                t->dims[t->rank++] = (int64_t)d[i];
            break;
        }
        case 2:
            t->type = e.v;
            break;
        case 3:
            return ck_error(CK_EFORMAT, "'%s': segmented tensors are not supported", r->s->path);
        case 4:
        case 5:
        case 7:
        case 11:
            if ((err = e.num == 4 ? ck_pb_fixed32s_count(&e, &c) : ck_pb_varints_count(&e, &c)) < 0)
                return wrap(err, r);
            t->nvalues += c;
            break;
        case 10:
            if ((err = ck_pb_fixed64s_count(&e, &c)) < 0)
                return wrap(err, r);
            t->nvalues += c;
            break;
        case 6:
            t->nstrings++;
            break;
        case 8:
            if ((err = str(r, &e, "a tensor name", &t->name)) < 0)
                return err;
            break;
        case 9:
            t->rawf = e;
            t->has_raw = true;
            break;
        case 13:
            if ((err = ext_kv(r, t, &e)) < 0)
                return err;
            break;
        case 14:
            t->external = e.v == 1;
            break;
        }
    }
    return rc < 0 ? wrap(rc, r) : 0;
}

/* The file an external tensor names, inside the model's folder, mapped once. */
static int external_file(struct rd *r, const struct tp *t, const unsigned char **base,
                         uint64_t *len)
{
    char path[PATH_MAX], real[PATH_MAX];
    const char *name = t->name ? t->name : "";
    if (!t->location || !ck_zipin_name_is_safe(t->location))
        return ck_error(CK_EFORMAT,
                        "'%s': tensor '%s': external data location '%s' is not a "
                        "relative path inside the model's folder",
                        r->s->path, name, t->location ? t->location : "");
    for (size_t i = 0; i < r->next; i++)
        if (!strcmp(r->ext[i].location, t->location)) {
            *base = r->ext[i].base;
            *len = r->ext[i].len;
            return 0;
        }
    if ((size_t)snprintf(path, sizeof path, "%s/%s", r->dir, t->location) >= sizeof path)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': external data path too long", r->s->path,
                        name);
    if (!realpath(path, real))
        return ck_error_os(CK_ENOENT, "'%s': tensor '%s': external data '%s'", r->s->path, name,
                           t->location);
    size_t dl = strlen(r->dir);
    if (strncmp(real, r->dir, dl) || (real[dl] != '/' && strcmp(r->dir, "/")))
        return ck_error(CK_EFORMAT,
                        "'%s': tensor '%s': external data '%s' resolves outside the "
                        "model's folder",
                        r->s->path, name, t->location);
    struct ext_file *e = realloc(r->ext, (r->next + 1) * sizeof *e);
    if (!e)
        return ck_error(CK_ENOMEM, "out of memory");
    r->ext = e;
    int err = ck_tensor_set_map_file(r->s, real, base, len);
    if (err < 0)
        return err;
    if (!(e[r->next].location = strdup(t->location)))
        return ck_error(CK_ENOMEM, "out of memory");
    e[r->next].base = *base;
    e[r->next++].len = *len;
    return 0;
}

/* The TensorProto field that holds values of type t when raw_data is absent. */
static unsigned values_field(enum ck_dtype t)
{
    switch (t) {
    case CK_DT_F32:
    case CK_DT_C64:
        return 4;
    case CK_DT_I64:
        return 7;
    case CK_DT_F64:
    case CK_DT_C128:
        return 10;
    case CK_DT_U32:
    case CK_DT_U64:
        return 11;
    default:
        return 5; /* int32_data: the 8- and 16-bit types, bool, int32 */
    }
}

/* Second pass: the typed values, little-endian, into a block of the set. */
static int typed_values(struct rd *r, const struct ck_pb_field *f, struct ck_tensor *t,
                        uint64_t numel)
{
    size_t esz = ck_dtype_size(t->dtype);
    bool complex = t->dtype == CK_DT_C64 || t->dtype == CK_DT_C128;
    uint64_t want = complex ? numel * 2 : numel;
    size_t vsz = complex ? esz / 2 : esz;
    unsigned char *out = NULL;
    struct ck_pb m;
    struct ck_pb_field e;
    size_t at = 0, held = 0;
    int rc = 0, err = 0;
    /* count first: the dims claim the size, the values must be there before
     * anything is allocated for them (fuzz_onnx: a 2.5 KB file claimed 2 GiB) */
    ck_pb_init_field(&m, f);
    while ((rc = ck_pb_next(&m, &e)) > 0) {
        size_t cnt = 0;
        if (e.num != 4 && e.num != 5 && e.num != 7 && e.num != 10 && e.num != 11)
            continue;
        if (e.num != values_field(t->dtype))
            return ck_error(CK_EFORMAT,
                            "'%s': tensor '%s': values in field %u, not the field of "
                            "its data type (%u)",
                            r->s->path, t->name, (unsigned)e.num, values_field(t->dtype));
        if ((err = e.num == 4    ? ck_pb_fixed32s_count(&e, &cnt)
                   : e.num == 10 ? ck_pb_fixed64s_count(&e, &cnt)
                                 : ck_pb_varints_count(&e, &cnt)) < 0)
            return wrap(err, r);
        held += cnt;
    }
    if (rc < 0)
        return wrap(rc, r);
    if (held != want)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': %zu values for %" PRIu64 " elements",
                        r->s->path, t->name, held, numel);
    if ((err = ck_tensor_set_alloc(r->s, t->nbytes ? t->nbytes : 1, (void **)&out)) < 0)
        return err;
    ck_pb_init_field(&m, f);
    while ((rc = ck_pb_next(&m, &e)) > 0) {
        if (e.num != values_field(t->dtype))
            continue; /* checked by the count above */
        uint64_t v[256];
        size_t n = 0;
        /* decode in pieces of 256 values: no allocation of a claimed size */
        size_t cnt = 0;
        err = e.num == 4    ? ck_pb_fixed32s_count(&e, &cnt)
              : e.num == 10 ? ck_pb_fixed64s_count(&e, &cnt)
                            : ck_pb_varints_count(&e, &cnt);
        if (err < 0)
            return wrap(err, r);
        if (at + cnt > want)
            return ck_error(CK_EFORMAT,
                            "'%s': tensor '%s': more values than its %" PRIu64 " elements",
                            r->s->path, t->name, numel);
        const unsigned char *p = e.data, *end = e.data + e.len;
        for (size_t done = 0; done < cnt; done += n) {
            n = 0;
            if (e.wire == CK_PB_LEN) {
                size_t k = cnt - done < 256 ? cnt - done : 256;
                for (; n < k; n++) {
                    if (e.num == 4) {
                        v[n] = (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 |
                               (uint64_t)p[3] << 24;
                        p += 4;
                    } else if (e.num == 10) {
                        v[n] = 0;
                        for (int b = 7; b >= 0; b--)
                            v[n] = v[n] << 8 | p[b];
                        p += 8;
                    } else if ((err = ck_pb_read_varint(&p, end, &v[n])) < 0) {
                        return wrap(err, r);
                    }
                }
            } else {
                v[0] = e.v;
                n = 1;
            }
            for (size_t i = 0; i < n; i++, at++)
                for (size_t b = 0; b < vsz; b++)
                    out[at * vsz + b] = (unsigned char)(v[i] >> (8 * b));
        }
    }
    if (rc < 0)
        return wrap(rc, r);
    if (at != want)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': %zu values for %" PRIu64 " elements",
                        r->s->path, t->name, at, numel);
    t->data = out;
    return 0;
}

static int string_values(struct rd *r, const struct ck_pb_field *f, struct ck_tensor *t,
                         const struct tp *tp, uint64_t numel)
{
    struct ck_pb m;
    struct ck_pb_field e;
    size_t at = 0;
    int rc = 0, err = 0;
    if (tp->nstrings != numel)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': %zu strings for %" PRIu64 " elements",
                        r->s->path, t->name, tp->nstrings, numel);
    if ((err = ck_tensor_set_alloc(r->s, (numel ? numel : 1) * sizeof *t->strings,
                                   (void **)&t->strings)) < 0)
        return err;
    ck_pb_init_field(&m, f);
    while ((rc = ck_pb_next(&m, &e)) > 0)
        if (e.num == 6 && e.wire == CK_PB_LEN) {
            t->strings[at].p = e.data;
            t->strings[at++].len = e.len;
            t->nbytes += e.len;
        }
    return rc < 0 ? wrap(rc, r) : 0;
}

/* A TensorProto into the set (name given for attribute tensors). */
static int add_tensor(struct rd *r, const struct ck_pb_field *f, const char *name, const char *role)
{
    struct tp tp;
    struct ck_tensor t;
    uint64_t numel = 0;
    int err = 0;
    if ((err = tensor_meta(r, f, &tp)) < 0)
        return err;
    memset(&t, 0, sizeof t);
    t.name = (char *)(name ? name : tp.name);
    if (!t.name || !*t.name)
        return ck_error(CK_EFORMAT, "'%s': an initializer without a name", r->s->path);
    t.role = role;
    t.dtype = ck_onnx_dtype(tp.type);
    if (t.dtype == CK_DT_INVALID)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': unsupported data_type %" PRIu64, r->s->path,
                        t.name, tp.type);
    t.rank = tp.rank;
    memcpy(t.dims, tp.dims, sizeof t.dims);
    if ((err = ck_tensor_numel(&t, &numel)) < 0)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': bad dimensions", r->s->path, t.name);
    if (t.dtype == CK_DT_STRING) {
        if ((err = string_values(r, f, &t, &tp, numel)) < 0)
            return err;
        return ck_tensor_set_add(r->s, &t, NULL);
    }
    if (numel > UINT64_MAX / ck_dtype_size(t.dtype))
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': too many elements", r->s->path, t.name);
    t.nbytes = numel * ck_dtype_size(t.dtype);
    if (tp.external) {
        const unsigned char *base = NULL;
        uint64_t len = 0;
        if ((err = external_file(r, &tp, &base, &len)) < 0)
            return err;
        uint64_t n = tp.has_length ? tp.length : t.nbytes;
        if (tp.offset > len || n > len - tp.offset || n != t.nbytes)
            return ck_error(CK_EFORMAT,
                            "'%s': tensor '%s': external data at %" PRIu64 " of %" PRIu64
                            " bytes does not fit '%s' (%" PRIu64 " bytes) or the tensor (%" PRIu64
                            " bytes)",
                            r->s->path, t.name, tp.offset, n, tp.location, len, t.nbytes);
        t.data = base + tp.offset;
    } else if (tp.has_raw) {
        if (tp.rawf.wire != CK_PB_LEN || tp.rawf.len != t.nbytes)
            return ck_error(CK_EFORMAT,
                            "'%s': tensor '%s': raw_data of %zu bytes, expected %" PRIu64,
                            r->s->path, t.name, tp.rawf.len, t.nbytes);
        t.data = tp.rawf.data;
    } else if ((err = typed_values(r, f, &t, numel)) < 0) {
        return err;
    }
    return ck_tensor_set_add(r->s, &t, NULL);
}

/* ---- nodes and attributes ---- */

static void float_text(struct ck_buf *b, float f)
{
    ck_buf_printf(b, "%.9g", (double)f);
}

/* An attribute's value as text (see the top of the file). */
static int attr_text(struct rd *r, const struct ck_pb_field *f, const char *node, char **key,
                     struct ck_buf *b, int *tensor_out)
{
    struct ck_pb m;
    struct ck_pb_field e;
    int rc, err, n = 0;
    uint64_t type = 0;
    *key = NULL;
    ck_pb_init_field(&m, f);
    while ((rc = ck_pb_next(&m, &e)) > 0)
        if (e.num == 1 && (err = str(r, &e, "an attribute name", key)) < 0)
            return err;
        else if (e.num == 20)
            type = e.v;
    if (rc < 0)
        return wrap(rc, r);
    if (!*key)
        return ck_error(CK_EFORMAT, "'%s': node '%s': an attribute without a name", r->s->path,
                        node);
    bool list = type == 6 || type == 7 || type == 8;
    if (list)
        ck_buf_putc(b, '[');
    ck_pb_init_field(&m, f);
    while ((rc = ck_pb_next(&m, &e)) > 0) {
        struct ck_pb_field one = e;
        size_t cnt = 1;
        switch (e.num) {
        case 2:
            float_text(b, ck_pb_float(&e));
            break;
        case 3:
            ck_buf_printf(b, "%" PRId64, (int64_t)e.v);
            break;
        case 4:
        case 9:
            if (e.wire != CK_PB_LEN || memchr(e.data, 0, e.len) ||
                !ck_utf8_is_valid((const char *)e.data, e.len))
                return ck_error(CK_EFORMAT, "'%s': node '%s': attribute '%s' is not text",
                                r->s->path, node, *key);
            if (e.num == 9 && n++)
                ck_buf_puts(b, ", ");
            ck_buf_append(b, e.data, e.len);
            break;
        case 5:
            *tensor_out = 1;
            ck_buf_puts(b, "tensor");
            break;
        case 6:
        case 10:
        case 11:
            ck_buf_puts(b, e.num == 6 ? "graph" : e.num == 10 ? "tensors" : "graphs");
            break;
        case 7:
        case 8:
            if ((err = e.num == 7 ? ck_pb_fixed32s_count(&e, &cnt)
                                  : ck_pb_varints_count(&e, &cnt)) < 0)
                return wrap(err, r);
            for (size_t i = 0; i < cnt && b->len < ATTR_TEXT_MAX; i++) {
                uint64_t v = e.v;
                if (e.wire == CK_PB_LEN) {
                    const unsigned char *p = e.data;
                    if (e.num == 7) {
                        p += 4 * i;
                        v = (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 |
                            (uint64_t)p[3] << 24;
                    } else {
                        /* the i-th varint: walk from the start of this run */
                        if (i == 0)
                            one.data = e.data;
                        if ((err = ck_pb_read_varint(&one.data, e.data + e.len, &v)) < 0)
                            return wrap(err, r);
                    }
                }
                if (n++)
                    ck_buf_puts(b, ", ");
                if (e.num == 7) {
                    struct ck_pb_field x = {.v = v};
                    float_text(b, ck_pb_float(&x));
                } else {
                    ck_buf_printf(b, "%" PRId64, (int64_t)v);
                }
            }
            break;
        }
    }
    if (rc < 0)
        return wrap(rc, r);
    if (list)
        ck_buf_putc(b, ']');
    if (b->len >= ATTR_TEXT_MAX)
        return ck_error(CK_EFORMAT, "'%s': node '%s': attribute '%s' over %u bytes of text",
                        r->s->path, node, *key, ATTR_TEXT_MAX);
    return 0;
}

/* A tensor attribute becomes a tensor of the set named after the node's
 * first output (a Constant) or "NODE:ATTR". */
static int attr_tensor(struct rd *r, const struct ck_pb_field *f, struct ck_graph_node *n,
                       const char *key, struct ck_buf *b)
{
    struct ck_pb m;
    struct ck_pb_field e;
    int rc = 0;
    char name[NAME_MAX_LEN + 80];
    bool constant = !strcmp(n->op, "Constant") && n->noutputs == 1;
    snprintf(name, sizeof name, constant ? "%s" : "%s:%s", constant ? n->outputs[0] : n->name, key);
    ck_pb_init_field(&m, f);
    while ((rc = ck_pb_next(&m, &e)) > 0)
        if (e.num == 5) {
            int err = add_tensor(r, &e, name, "constant");
            if (err < 0)
                return err;
        }
    if (rc < 0)
        return wrap(rc, r);
    ck_buf_reset(b);
    ck_buf_printf(b, "tensor %s", name);
    return 0;
}

static int strings_of(struct rd *r, const struct ck_pb_field *f, uint32_t num, bool output,
                      struct ck_graph_node *n)
{
    struct ck_pb m;
    struct ck_pb_field e;
    int rc = 0, err = 0;
    ck_pb_init_field(&m, f);
    while ((rc = ck_pb_next(&m, &e)) > 0) {
        char *s = NULL;
        if (e.num != num)
            continue;
        if ((err = str(r, &e, "a value name", &s)) < 0)
            return err;
        if ((err = output ? ck_graph_node_add_output(n, s) : ck_graph_node_add_input(n, s)) < 0)
            return err;
    }
    return rc < 0 ? wrap(rc, r) : 0;
}

static int node(struct rd *r, const struct ck_pb_field *f)
{
    struct ck_pb m;
    struct ck_pb_field e;
    char *name = NULL, *op = NULL, *domain = NULL, full[600];
    struct ck_graph_node *n = NULL;
    struct ck_buf b;
    int rc = 0, err = 0;
    if (r->g->nnodes >= NODES_MAX)
        return ck_error(CK_EFORMAT, "'%s': more than %u nodes", r->s->path, NODES_MAX);
    ck_pb_init_field(&m, f);
    while ((rc = ck_pb_next(&m, &e)) > 0) {
        if (e.num == 3 && (err = str(r, &e, "a node name", &name)) < 0)
            return err;
        if (e.num == 4 && (err = str(r, &e, "an op_type", &op)) < 0)
            return err;
        if (e.num == 7 && (err = str(r, &e, "a node domain", &domain)) < 0)
            return err;
    }
    if (rc < 0)
        return wrap(rc, r);
    if (!op || !*op)
        return ck_error(CK_EFORMAT, "'%s': node %zu has no op_type", r->s->path, r->g->nnodes);
    if (domain && *domain && strcmp(domain, "ai.onnx"))
        snprintf(full, sizeof full, "%.200s::%.300s", domain, op);
    else
        snprintf(full, sizeof full, "%.500s", op);
    if ((err = ck_graph_add_node(r->g, name ? name : "", full, &n)) < 0 ||
        (err = strings_of(r, f, 1, false, n)) < 0 || (err = strings_of(r, f, 2, true, n)) < 0)
        return err;
    if (!*n->name && n->noutputs) { /* unnamed: its first output names it in messages */
        free(n->name);
        if (!(n->name = strdup(n->outputs[0])))
            return ck_error(CK_ENOMEM, "out of memory");
    }
    ck_buf_init(&b, ATTR_TEXT_MAX + 256);
    ck_pb_init_field(&m, f);
    while ((rc = ck_pb_next(&m, &e)) > 0) {
        char *key = NULL;
        int tensor = 0;
        if (e.num != 5)
            continue;
        ck_buf_reset(&b);
        if ((err = attr_text(r, &e, n->name, &key, &b, &tensor)) < 0 ||
            (tensor && (err = attr_tensor(r, &e, n, key, &b)) < 0) ||
            (err = ck_graph_node_add_attr(n, key, ck_buf_str(&b))) < 0) {
            ck_buf_release(&b);
            return err;
        }
    }
    ck_buf_release(&b);
    return rc < 0 ? wrap(rc, r) : 0;
}

/* ValueInfoProto: "shape.NAME" = "2,5,8" (-1 for a symbolic dimension) and
 * "dtype.NAME" as graph attributes; the name is added to the graph's
 * inputs or outputs when io is 1 or 2. */
static int value_info(struct rd *r, const struct ck_pb_field *f, int io, char ***names,
                      size_t *nnames)
{
    struct ck_pb m, t, tt, sh, dm;
    struct ck_pb_field e, x, y, z, w;
    char *name = NULL;
    struct ck_buf shape;
    uint64_t elem = 0;
    bool has_shape = false;
    int rc, err = 0;
    ck_buf_init(&shape, 4096);
    ck_pb_init_field(&m, f);
    while ((rc = ck_pb_next(&m, &e)) > 0) {
        if (e.num == 1 && (err = str(r, &e, "a value name", &name)) < 0)
            goto out;
        if (e.num != 2 || e.wire != CK_PB_LEN)
            continue;
        ck_pb_init_field(&t, &e);
        while ((rc = ck_pb_next(&t, &x)) > 0) {
            if (x.num != 1 || x.wire != CK_PB_LEN)
                continue;
            ck_pb_init_field(&tt, &x);
            while ((rc = ck_pb_next(&tt, &y)) > 0) {
                if (y.num == 1)
                    elem = y.v;
                if (y.num != 2 || y.wire != CK_PB_LEN)
                    continue;
                has_shape = true;
                ck_pb_init_field(&sh, &y);
                int nd = 0;
                while ((rc = ck_pb_next(&sh, &z)) > 0) {
                    if (z.num != 1 || z.wire != CK_PB_LEN)
                        continue;
                    int64_t d = -1;
                    ck_pb_init_field(&dm, &z);
                    while ((rc = ck_pb_next(&dm, &w)) > 0)
                        if (w.num == 1 && w.wire == CK_PB_VARINT)
                            d = (int64_t)w.v;
                    if (rc < 0)
                        break;
                    ck_buf_printf(&shape, nd++ ? ",%" PRId64 : "%" PRId64, d);
                }
                if (rc < 0)
                    break;
            }
            if (rc < 0)
                break;
        }
        if (rc < 0)
            break;
    }
    if (rc < 0) {
        err = wrap(rc, r);
        goto out;
    }
    if (!name) {
        err = ck_error(CK_EFORMAT, "'%s': a graph value without a name", r->s->path);
        goto out;
    }
    char key[NAME_MAX_LEN + 16];
    snprintf(key, sizeof key, "shape.%s", name);
    if (has_shape && (err = ck_graph_add_attr(r->g, key, ck_buf_str(&shape))) < 0)
        goto out;
    snprintf(key, sizeof key, "dtype.%s", name);
    if (elem && (err = ck_graph_add_attr(r->g, key, ck_dtype_name(ck_onnx_dtype(elem)))) < 0)
        goto out;
    if (io) {
        char **n = realloc(*names, (*nnames + 1) * sizeof *n);
        if (!n) {
            err = ck_error(CK_ENOMEM, "out of memory");
            goto out;
        }
        *names = n;
        n[(*nnames)++] = name;
    }
out:
    ck_buf_release(&shape);
    return err;
}

static int graph(struct rd *r, const struct ck_pb_field *f)
{
    struct ck_pb m;
    struct ck_pb_field e;
    char **in = NULL, **out = NULL, *gname = NULL;
    size_t nin = 0, nout = 0;
    int rc, err = 0;
    if (!(r->g = ck_graph_new()))
        return ck_error(CK_ENOMEM, "out of memory");
    r->s->graph = r->g;
    ck_pb_init_field(&m, f);
    while (err == 0 && (rc = ck_pb_next(&m, &e)) > 0) {
        if (e.wire != CK_PB_LEN)
            continue;
        switch (e.num) {
        case 1:
            err = node(r, &e);
            break;
        case 2:
            if ((err = str(r, &e, "the graph name", &gname)) == 0) {
                free(r->g->name);
                if (!(r->g->name = strdup(gname)))
                    err = ck_error(CK_ENOMEM, "out of memory");
            }
            break;
        case 5:
            err = add_tensor(r, &e, NULL, "initializer");
            break;
        case 11:
        case 12:
        case 13:
            err = value_info(r, &e,
                             e.num == 11   ? 1
                             : e.num == 12 ? 2
                                           : 0,
                             e.num == 11 ? &in : &out, e.num == 11 ? &nin : &nout);
            break;
        case 15:
            err = ck_error(CK_EFORMAT, "'%s': sparse initializers are not supported", r->s->path);
            break;
        }
    }
    if (err == 0 && rc < 0)
        err = wrap(rc, r);
    /* Initializers listed as inputs too (keep_initializers_as_inputs) are weights. */
    for (size_t i = 0; err == 0 && i < nin; i++)
        if (!ck_tensor_set_find(r->s, in[i]))
            err = ck_graph_add_io(r->g, false, in[i]);
    for (size_t i = 0; err == 0 && i < nout; i++)
        err = ck_graph_add_io(r->g, true, out[i]);
    free(in);
    free(out);
    return err;
}

static int model(struct rd *r, const unsigned char *base, uint64_t len)
{
    struct ck_pb m, k;
    struct ck_pb_field e, x;
    bool has_graph = false;
    char num[32], *s;
    int rc = 0, err = 0;
    ck_pb_init(&m, base, (size_t)len);
    while ((rc = ck_pb_next(&m, &e)) > 0) {
        switch (e.num) {
        case 1:
        case 5:
            snprintf(num, sizeof num, "%" PRId64, (int64_t)e.v);
            if ((err = ck_tensor_set_add_meta(r->s, e.num == 1 ? "ir_version" : "model_version",
                                              num)) < 0)
                return err;
            break;
        case 2:
        case 3:
        case 4:
            if ((err = str(r, &e, "a model string", &s)) < 0 ||
                (err = ck_tensor_set_add_meta(r->s,
                                              e.num == 2   ? "producer_name"
                                              : e.num == 3 ? "producer_version"
                                                           : "domain",
                                              s)) < 0)
                return err;
            break;
        case 7:
            if (has_graph)
                return ck_error(CK_EFORMAT, "'%s': two graphs", r->s->path);
            has_graph = true;
            if ((err = graph(r, &e)) < 0)
                return err;
            break;
        case 8:
        case 14: {
            char *a = NULL, *b = NULL, key[600];
            uint64_t version = 0;
            ck_pb_init_field(&k, &e);
            while ((rc = ck_pb_next(&k, &x)) > 0) {
                if (x.num == 1 && (err = str(r, &x, "a key", &a)) < 0)
                    return err;
                if (x.num == 2 && e.num == 14 && (err = str(r, &x, "a value", &b)) < 0)
                    return err;
                if (x.num == 2 && e.num == 8)
                    version = x.v;
            }
            if (rc < 0)
                return wrap(rc, r);
            snprintf(num, sizeof num, "%" PRIu64, version);
            snprintf(key, sizeof key, "%s%.500s", e.num == 8 ? "opset." : "",
                     e.num == 8 ? (a && *a ? a : "ai.onnx")
                     : a        ? a
                                : "");
            if ((err = ck_tensor_set_add_meta(r->s, key, e.num == 8 ? num : b ? b : "")) < 0)
                return err;
            break;
        }
        }
    }
    if (rc < 0)
        return wrap(rc, r);
    if (!has_graph)
        return ck_error(CK_EFORMAT, "'%s': not an ONNX model: no graph", r->s->path);
    return 0;
}

static int onnx_open(const char *path, struct ck_tensor_set **out)
{
    struct rd r;
    const unsigned char *base = NULL;
    uint64_t len = 0;
    char dir[PATH_MAX];
    int err = 0;
    *out = NULL;
    memset(&r, 0, sizeof r);
    if (!(r.s = ck_tensor_set_new("onnx", path)))
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = ck_tensor_set_map_file(r.s, path, &base, &len)) < 0)
        goto out;
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = 0;
    else
        strcpy(dir, ".");
    if (!realpath(dir, r.dir)) {
        err = ck_error_os(CK_EIO, "'%s': cannot resolve its folder", path);
        goto out;
    }
    if ((err = model(&r, base, len)) < 0 || (err = ck_tensor_set_check_unique(r.s)) < 0)
        goto out;
    *out = r.s;
    r.s = NULL;
out:
    for (size_t i = 0; i < r.next; i++)
        free(r.ext[i].location);
    free(r.ext);
    ck_tensor_set_free(r.s);
    return err;
}

const struct ck_reader_ops ck_reader_onnx = {
    .name = "onnx",
    .description = "ONNX model (protobuf ModelProto): graph, initializers, external data",
    .probe = probe,
    .open = onnx_open,
    .verify = NULL,
    .to_model = ck_onnx_to_model,
};
