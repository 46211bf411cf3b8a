/* safetensors: an 8-byte little-endian header size N, N bytes of JSON, then
 * the data. The rules are upstream's (huggingface/safetensors, lib.rs
 * validate): N at most 100 MB and inside the file, the header an object
 * starting with '{' (trailing spaces allowed), each tensor
 * {"dtype","shape","data_offsets"} with offsets relative to the data,
 * sorted they cover the data exactly from 0 with no hole and no overlap,
 * end - begin == element size x element count, and "__metadata__" a map of
 * strings to strings. Stricter than upstream: unknown keys in a tensor
 * entry and duplicate keys are refused. */
#include "readers/reader.h"
#include "readers/jsonin.h"
#include "common/error.h"
#include "common/text.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define HEADER_MAX UINT64_C(100000000)

static const struct {
    const char *name;
    enum ck_dtype dt;
} dtypes[] = {
    {"BOOL", CK_DT_BOOL}, {"U8", CK_DT_U8},           {"I8", CK_DT_I8},
    {"I16", CK_DT_I16},   {"U16", CK_DT_U16},         {"I32", CK_DT_I32},
    {"U32", CK_DT_U32},   {"I64", CK_DT_I64},         {"U64", CK_DT_U64},
    {"F16", CK_DT_F16},   {"BF16", CK_DT_BF16},       {"F32", CK_DT_F32},
    {"F64", CK_DT_F64},   {"F8_E4M3", CK_DT_F8_E4M3}, {"F8_E5M2", CK_DT_F8_E5M2},
    {"C64", CK_DT_C64},
};

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int probe(const char *path, const unsigned char *head, size_t len)
{
    struct stat st;
    /* The header is an object: '{' then a key or '}' (spaces only pad its end). */
    if (len >= 10 && head[8] == '{' && (head[9] == '"' || head[9] == '}') && stat(path, &st) == 0) {
        uint64_t n = le64(head);
        if (n >= 2 && n <= HEADER_MAX && n <= (uint64_t)st.st_size - 8)
            return CK_PROBE_CONTENT;
    }
    return ck_text_ends_with(path, ".safetensors") ? CK_PROBE_NAME : CK_PROBE_NO;
}

struct span {
    uint64_t begin, end;
    size_t index;
};

static int span_cmp(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

static int read_metadata(struct ck_tensor_set *s, const struct ck_jin *m)
{
    if (m->type != CK_JIN_OBJECT)
        return ck_error(CK_EFORMAT, "'%s': __metadata__ is not an object", s->path);
    for (const struct ck_jin *kv = m->first; kv; kv = kv->next) {
        if (kv->type != CK_JIN_STRING)
            return ck_error(CK_EFORMAT, "'%s': __metadata__ '%s': value is not a string", s->path,
                            kv->key);
        if (strlen(kv->key) != kv->keylen || strlen(kv->str) != kv->len)
            return ck_error(CK_EFORMAT, "'%s': __metadata__ '%s': NUL character", s->path, kv->key);
        int err = ck_tensor_set_add_meta(s, kv->key, kv->str);
        if (err < 0)
            return err;
    }
    return 0;
}

/* One tensor entry into t (name borrowed from the header) and its offsets. */
static int read_entry(const struct ck_tensor_set *s, const struct ck_jin *e, struct ck_tensor *t,
                      struct span *sp)
{
    const char *f = s->path, *name = e->key;
    const struct ck_jin *dt = NULL, *shape = NULL, *off = NULL;
    if (e->type != CK_JIN_OBJECT)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': entry is not an object", f, name);
    for (const struct ck_jin *c = e->first; c; c = c->next) {
        if (!strcmp(c->key, "dtype"))
            dt = c;
        else if (!strcmp(c->key, "shape"))
            shape = c;
        else if (!strcmp(c->key, "data_offsets"))
            off = c;
        else
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': unknown key '%s'", f, name, c->key);
    }
    if (!dt || !shape || !off)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': missing %s", f, name,
                        !dt      ? "dtype"
                        : !shape ? "shape"
                                 : "data_offsets");
    memset(t, 0, sizeof *t);
    t->name = (char *)name;
    if (dt->type != CK_JIN_STRING)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': dtype is not a string", f, name);
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(dt->str, dtypes[i].name))
            t->dtype = dtypes[i].dt;
    if (t->dtype == CK_DT_INVALID)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': unknown dtype '%.40s'", f, name, dt->str);
    if (shape->type != CK_JIN_ARRAY)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': shape is not an array", f, name);
    if (shape->n > CK_TENSOR_MAX_RANK)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': rank %zu over %d", f, name, shape->n,
                        CK_TENSOR_MAX_RANK);
    for (const struct ck_jin *d = shape->first; d; d = d->next) {
        uint64_t v;
        if (!ck_jin_uint(d, &v) || v > INT64_MAX)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': bad dimension '%.40s'", f, name,
                            d->type == CK_JIN_NUMBER ? d->str : "(not a number)");
        t->dims[t->rank++] = (int64_t)v;
    }
    if (off->type != CK_JIN_ARRAY || off->n != 2 || !ck_jin_uint(off->first, &sp->begin) ||
        !ck_jin_uint(off->first->next, &sp->end))
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': data_offsets is not [begin, end]", f, name);
    if (sp->end < sp->begin)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': data_offsets end %llu before begin %llu", f,
                        name, (unsigned long long)sp->end, (unsigned long long)sp->begin);
    t->nbytes = sp->end - sp->begin;
    return ck_tensor_check_size(t, f);
}

/* Sorted by offset, the tensors must tile [0, datalen) exactly. */
static int check_layout(const struct ck_tensor_set *s, struct span *sp, size_t n, uint64_t datalen)
{
    uint64_t at = 0;
    if (n)
        qsort(sp, n, sizeof *sp, span_cmp);
    for (size_t i = 0; i < n; i++) {
        const char *name = s->tensors[sp[i].index].name;
        if (sp[i].begin > at)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': hole before offset %llu", s->path, name,
                            (unsigned long long)sp[i].begin);
        if (sp[i].begin < at)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': overlaps the previous tensor", s->path,
                            name);
        if (sp[i].end > datalen)
            return ck_error(CK_EFORMAT,
                            "'%s': tensor '%s': data_offsets end %llu past the end "
                            "of the data (%llu bytes)",
                            s->path, name, (unsigned long long)sp[i].end,
                            (unsigned long long)datalen);
        at = sp[i].end;
    }
    if (at != datalen)
        return ck_error(CK_EFORMAT, "'%s': %llu bytes after the last tensor", s->path,
                        (unsigned long long)(datalen - at));
    return 0;
}

static int st_open(const char *path, struct ck_tensor_set **out)
{
    struct ck_tensor_set *s = ck_tensor_set_new("safetensors", path);
    struct ck_jin_doc *doc = NULL;
    const struct ck_jin *root;
    struct span *sp = NULL;
    const unsigned char *base;
    uint64_t len, n;
    int err;
    *out = NULL;
    if (!s)
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = ck_tensor_set_map_file(s, path, &base, &len)) < 0)
        goto out;
    err = CK_EFORMAT;
    if (len < 8) {
        ck_error(err, "'%s': %llu bytes, shorter than the 8-byte header size", path,
                 (unsigned long long)len);
        goto out;
    }
    n = le64(base);
    if (n > HEADER_MAX) {
        ck_error(err, "'%s': header size %llu over the limit of 100 MB", path,
                 (unsigned long long)n);
        goto out;
    }
    if (n > len - 8) {
        ck_error(err, "'%s': header size %llu past the end of the file (%llu bytes)", path,
                 (unsigned long long)n, (unsigned long long)len);
        goto out;
    }
    if (n == 0 || base[8] != '{') {
        ck_error(err, "'%s': the header does not start with '{'", path);
        goto out;
    }
    if ((err = ck_jin_parse((const char *)base + 8, (size_t)n, &doc, &root)) < 0) {
        ck_error_wrap(err, "'%s': header", path);
        goto out;
    }
    if (root->type != CK_JIN_OBJECT) {
        err = ck_error(CK_EFORMAT, "'%s': the header is not an object", path);
        goto out;
    }
    if (root->n && !(sp = calloc(root->n, sizeof *sp))) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    const unsigned char *data = base + 8 + n;
    for (const struct ck_jin *e = root->first; e; e = e->next) {
        struct ck_tensor t;
        struct ck_tensor *added;
        if (!strcmp(e->key, "__metadata__")) {
            if ((err = read_metadata(s, e)) < 0)
                goto out;
            continue;
        }
        if (strlen(e->key) != e->keylen) {
            err = ck_error(CK_EFORMAT, "'%s': a tensor name holds a NUL character", path);
            goto out;
        }
        struct span *p = &sp[s->ntensors];
        if ((err = read_entry(s, e, &t, p)) < 0)
            goto out;
        p->index = s->ntensors;
        if ((err = ck_tensor_set_add(s, &t, &added)) < 0)
            goto out;
    }
    if ((err = check_layout(s, sp, s->ntensors, len - 8 - n)) < 0)
        goto out;
    /* Offsets are checked: point every tensor at its bytes. */
    for (size_t i = 0; i < s->ntensors; i++)
        s->tensors[sp[i].index].data = data + sp[i].begin;
    *out = s;
    s = NULL;
    err = 0;
out:
    free(sp);
    ck_jin_free(doc);
    ck_tensor_set_free(s);
    return err;
}

const struct ck_reader_ops ck_reader_safetensors = {
    .name = "safetensors",
    .description = "Hugging Face safetensors (JSON header, raw little-endian data)",
    .probe = probe,
    .open = st_open,
    .verify = NULL,
};
