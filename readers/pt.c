/* PyTorch .pt / .pth (torch.save since torch 1.6): a zip whose members share
 * one top folder (the file's stem, or "archive"): PREFIX/data.pkl, the
 * pickle of the saved object; PREFIX/data/KEY, the bytes of each storage;
 * PREFIX/version; and, in newer versions, PREFIX/byteorder ("little" or
 * "big"). The pickle is run by the restricted unpickler (pickle.h): only
 * state-dict values and torch's tensor rebuild functions, nothing executed.
 *
 * Each tensor is a view (offset, sizes, strides, in elements) into a
 * storage. A C-contiguous view points into the mapped file (stored members
 * are used in place); any other view (a transposed or sliced tensor) is
 * copied into C order in a block of the set, after its furthest element
 * has been checked against the storage. Tensors that share a storage (tied
 * weights, slices of one buffer) get the role "shared" and a metadata entry
 * "shared_storage.KEY" listing them. A nested checkpoint names each tensor
 * by its path through dicts and lists ("model.fc1.weight",
 * "optimizer.state.0.exp_avg"); numbers, strings, booleans and None become
 * metadata under their path ("epoch" = "3"), and so do lists and tuples of
 * them ("optimizer.param_groups.0.betas" = "(0.9, 0.999)").
 *
 * The format before torch 1.6 (a bare pickle stream) is recognised and
 * refused: its pickle names storages differently and it holds no zip
 * checksums. */
#include "readers/pickle.h"
#include "readers/reader.h"
#include "readers/zipin.h"

#include "common/buf.h"
#include "common/error.h"
#include "common/utf8.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zip.h>

#define PKL_MAX (UINT64_C(256) << 20)
#define NAME_MAX_LEN 4096
#define DEPTH_MAX 64
#define VISITS_MAX (1u << 22)
#define META_VALUE_MAX 4096

/* torch/serialization.py: MAGIC_NUMBER, pickled as a LONG1 after PROTO 2. */
static const unsigned char legacy_magic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c,
                                             0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int probe(const char *path, const unsigned char *head, size_t len)
{
    /* torch.save writes PREFIX/data.pkl first: the first local header's name. */
    if (ck_zipin_is_zip(head, len) && len >= 30 && head[2] == 3) {
        size_t n = (size_t)head[26] | (size_t)head[27] << 8;
        if (n >= 9 && 30 + n <= len && !memcmp(head + 30 + n - 9, "/data.pkl", 9))
            return CK_PROBE_CONTENT;
    }
    if (len >= sizeof legacy_magic && !memcmp(head, legacy_magic, sizeof legacy_magic))
        return CK_PROBE_CONTENT;
    return ends_with(path, ".pt") || ends_with(path, ".pth") ? CK_PROBE_NAME : CK_PROBE_NO;
}

struct storage {
    const char *key; /* borrowed from the pickle */
    size_t keylen;
    enum ck_dtype dtype;
    uint64_t numel;
    const unsigned char *data; /* the member's bytes (mapped or inflated) */
    uint64_t size;
    bool stored; /* in place in the mapping: its CRC-32 is the member's */
    uint32_t crc;
    size_t users; /* tensors viewing it */
    size_t first; /* index of the first of them */
};

struct pt {
    struct ck_tensor_set *s;
    struct ck_zipin zi;
    const unsigned char *base;
    uint64_t blen, *offs;
    char prefix[256];
    bool big_endian;
    struct storage *st; /* open addressing by key */
    size_t nst, capst;
    struct {
        const char *s;
        size_t n;
    } * tkeys; /* each tensor's storage key, by tensor index */
    size_t tkeys_cap;
    uint64_t copied; /* bytes of materialised views, bounded by the file size */
    size_t visits;
    char name[NAME_MAX_LEN];
};

/* ---- storages ---- */

static uint64_t hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211u;
    return h;
}

static int grow_storages(struct pt *r)
{
    size_t cap = r->capst ? r->capst * 2 : 64;
    struct storage *n = calloc(cap, sizeof *n);
    if (!n)
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < r->capst; i++) {
        if (!r->st[i].key)
            continue;
        size_t h = (size_t)hash(r->st[i].key, r->st[i].keylen) & (cap - 1);
        while (n[h].key)
            h = (h + 1) & (cap - 1);
        n[h] = r->st[i];
    }
    free(r->st);
    r->st = n;
    r->capst = cap;
    return 0;
}

static bool key_is_safe(const char *k, size_t n)
{
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((k[i] >= '0' && k[i] <= '9') || (k[i] >= 'a' && k[i] <= 'z') ||
              (k[i] >= 'A' && k[i] <= 'Z') || k[i] == '_' || k[i] == '-'))
            return false;
    return true;
}

/* The bytes of member PREFIX/data/KEY: in place when stored, else inflated. */
static int load_storage(struct pt *r, struct storage *st)
{
    char member[400];
    uint64_t i = 0;
    zip_stat_t zs;
    int err = 0;
    snprintf(member, sizeof member, "%s/data/%.*s", r->prefix, (int)st->keylen, st->key);
    if ((err = ck_zipin_find(&r->zi, member, &i)) < 0)
        return ck_error(CK_EFORMAT, "'%s': storage '%.*s' has no member '%s'", r->s->path,
                        (int)st->keylen, st->key, member);
    zip_stat_init(&zs);
    if (zip_stat_index(r->zi.z, i, 0, &zs) < 0 || !(zs.valid & ZIP_STAT_COMP_METHOD) ||
        !(zs.valid & ZIP_STAT_SIZE) || !(zs.valid & ZIP_STAT_COMP_SIZE) ||
        !(zs.valid & ZIP_STAT_CRC))
        return ck_error(CK_EFORMAT, "'%s': member '%s': no sizes", r->s->path, member);
    if ((zs.valid & ZIP_STAT_ENCRYPTION_METHOD) && zs.encryption_method != ZIP_EM_NONE)
        return ck_error(CK_EFORMAT, "'%s': member '%s' is encrypted", r->s->path, member);
    if (zs.comp_method != ZIP_CM_STORE)
        return ck_zipin_read(&r->zi, r->s, i, CK_TENSOR_ALLOC_MAX, &st->data, &st->size);
    if (zs.size != zs.comp_size)
        return ck_error(CK_EFORMAT, "'%s': stored member '%s' claims %llu bytes in %llu",
                        r->s->path, member, (unsigned long long)zs.size,
                        (unsigned long long)zs.comp_size);
    if (!r->offs &&
        (err = ck_zipin_local_offsets(r->s, r->base, r->blen, r->zi.nentries, &r->offs)) < 0)
        return err;
    if ((err = ck_zipin_stored(r->s, r->base, r->blen, r->offs[i], member, zs.size, &st->data)) < 0)
        return err;
    st->size = zs.size;
    st->stored = true;
    st->crc = zs.crc;
    return 0;
}

static int find_storage(struct pt *r, const struct ck_pk_val *v, struct storage **out)
{
    int err = 0;
    if (!key_is_safe(v->s, v->n))
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': storage key '%.*s' is not a plain name",
                        r->s->path, r->name, (int)(v->n > 64 ? 64 : v->n), v->s);
    if (2 * (r->nst + 1) > r->capst && (err = grow_storages(r)) < 0)
        return err;
    size_t h = (size_t)hash(v->s, v->n) & (r->capst - 1);
    while (r->st[h].key && (r->st[h].keylen != v->n || memcmp(r->st[h].key, v->s, v->n)))
        h = (h + 1) & (r->capst - 1);
    struct storage *st = &r->st[h];
    if (st->key) {
        if (st->dtype != v->dtype || st->numel != v->numel)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': storage '%.*s' seen with another type",
                            r->s->path, r->name, (int)v->n, v->s);
        *out = st;
        return 0;
    }
    st->key = v->s;
    st->keylen = v->n;
    st->dtype = v->dtype;
    st->numel = v->numel;
    r->nst++;
    if ((err = load_storage(r, st)) < 0)
        return err;
    size_t esz = ck_dtype_size(st->dtype);
    if (st->numel > st->size / esz)
        return ck_error(CK_EFORMAT,
                        "'%s': storage '%.*s' claims %" PRIu64 " elements of %zu bytes, its "
                        "member holds %" PRIu64 " bytes",
                        r->s->path, (int)v->n, v->s, st->numel, esz, st->size);
    *out = st;
    return 0;
}

/* ---- tensors ---- */

/* Copies a strided view into C order, the last dimension innermost. */
static void gather(unsigned char *dst, const unsigned char *src, const struct ck_pk_tensor *v,
                   size_t esz)
{
    int64_t idx[CK_TENSOR_MAX_RANK] = {0};
    uint64_t off = (uint64_t)v->offset;
    int last = v->rank - 1;
    for (;;) {
        const unsigned char *p = src + off * esz;
        int64_t n = last >= 0 ? v->size[last] : 1, step = last >= 0 ? v->stride[last] : 0;
        for (int64_t k = 0; k < n; k++, dst += esz)
            memcpy(dst, p + (uint64_t)(k * step) * esz, esz);
        int d = last - 1;
        for (; d >= 0; d--) {
            off += (uint64_t)v->stride[d];
            if (++idx[d] < v->size[d])
                break;
            off -= (uint64_t)(v->stride[d] * v->size[d]);
            idx[d] = 0;
        }
        if (d < 0)
            return;
    }
}

static int view_bounds(struct pt *r, const struct ck_pk_tensor *v, const struct storage *st,
                       uint64_t *numel, bool *contiguous)
{
    uint64_t n = 1, last = (uint64_t)v->offset, want = 1;
    *contiguous = true;
    for (int d = v->rank - 1; d >= 0; d--) {
        uint64_t sz = (uint64_t)v->size[d], sd = (uint64_t)v->stride[d], reach;
        if (__builtin_mul_overflow(n, sz, &n) || n > INT64_MAX)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': too many elements", r->s->path,
                            r->name);
        if (sz > 1 && sd != want)
            *contiguous = false;
        if (sz && (__builtin_mul_overflow(sz - 1, sd, &reach) ||
                   __builtin_add_overflow(last, reach, &last)))
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': strides reach past 2^64", r->s->path,
                            r->name);
        if (__builtin_mul_overflow(want, sz ? sz : 1, &want))
            want = UINT64_MAX;
    }
    if (n && last >= st->numel)
        return ck_error(CK_EFORMAT,
                        "'%s': tensor '%s': element %" PRIu64 " past the end of storage '%.*s' "
                        "(%" PRIu64 " elements)",
                        r->s->path, r->name, last, (int)st->keylen, st->key, st->numel);
    *numel = n;
    return 0;
}

static int add_tensor(struct pt *r, const struct ck_pk_tensor *v)
{
    struct storage *st = NULL;
    struct ck_tensor t;
    uint64_t numel = 0;
    bool contiguous = false;
    int err = 0;
    if ((err = find_storage(r, v->storage, &st)) < 0 ||
        (err = view_bounds(r, v, st, &numel, &contiguous)) < 0)
        return err;
    size_t esz = ck_dtype_size(st->dtype);
    if (numel > UINT64_MAX / esz)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': too many elements", r->s->path, r->name);
    memset(&t, 0, sizeof t);
    t.name = r->name;
    t.dtype = st->dtype;
    t.rank = v->rank;
    memcpy(t.dims, v->size, sizeof(int64_t) * (size_t)v->rank);
    t.nbytes = numel * esz;
    t.big_endian = r->big_endian && esz > 1;
    t.role = v->parameter ? "parameter" : NULL;
    if (contiguous || numel == 0) {
        t.data = st->data + (numel ? (uint64_t)v->offset * esz : 0);
    } else {
        void *block;
        if (t.nbytes > r->blen || r->copied > r->blen - t.nbytes)
            return ck_error(CK_EFORMAT,
                            "'%s': tensor '%s': strided views would copy more bytes than the "
                            "file holds",
                            r->s->path, r->name);
        if ((err = ck_tensor_set_alloc(r->s, t.nbytes, &block)) < 0)
            return err;
        r->copied += t.nbytes;
        gather(block, st->data, v, esz);
        t.data = block;
    }
    if (r->s->ntensors == r->tkeys_cap) {
        size_t cap = r->tkeys_cap ? r->tkeys_cap * 2 : 64;
        void *k = realloc(r->tkeys, cap * sizeof *r->tkeys);
        if (!k)
            return ck_error(CK_ENOMEM, "out of memory");
        r->tkeys = k;
        r->tkeys_cap = cap;
    }
    r->tkeys[r->s->ntensors].s = st->key;
    r->tkeys[r->s->ntensors].n = st->keylen;
    if (st->users++ == 0) {
        st->first = r->s->ntensors;
        if (st->stored) {
            t.raw = st->data;
            t.rawlen = st->size;
            t.has_crc32 = true;
            t.crc32 = st->crc;
        }
    }
    return ck_tensor_set_add(r->s, &t, NULL);
}

/* ---- walking the saved object ---- */

static bool is_scalar(const struct ck_pk_val *v)
{
    return v->kind == CK_PK_NONE || v->kind == CK_PK_BOOL || v->kind == CK_PK_INT ||
           v->kind == CK_PK_FLOAT || v->kind == CK_PK_STR || v->kind == CK_PK_BYTES;
}

/* Python's repr of a float: the shortest text that reads back the same. */
static void float_text(struct ck_buf *b, double f)
{
    char t[40];
    if (f != f) {
        ck_buf_puts(b, "nan");
        return;
    }
    if (f > 1.7976931348623157e308 || f < -1.7976931348623157e308) {
        ck_buf_puts(b, f > 0 ? "inf" : "-inf");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*g", prec, f);
        if (strtod(t, NULL) == f)
            break;
    }
    ck_buf_puts(b, t);
    if (!strpbrk(t, ".en"))
        ck_buf_puts(b, ".0");
}

static void scalar_text(struct ck_buf *b, const struct ck_pk_val *v, bool quote)
{
    switch (v->kind) {
    case CK_PK_NONE:
        ck_buf_puts(b, "None");
        break;
    case CK_PK_BOOL:
        ck_buf_puts(b, v->b ? "True" : "False");
        break;
    case CK_PK_INT:
        ck_buf_printf(b, "%" PRId64, v->i);
        break;
    case CK_PK_FLOAT:
        float_text(b, v->f);
        break;
    case CK_PK_STR:
        if (quote)
            ck_buf_putc(b, '\'');
        ck_buf_append(b, v->s, v->n);
        if (quote)
            ck_buf_putc(b, '\'');
        break;
    default:
        ck_buf_printf(b, "<%zu bytes>", v->n);
        break;
    }
}

static int bad_text(struct pt *r, const struct ck_pk_val *v, const char *what)
{
    if (v->kind == CK_PK_STR && (memchr(v->s, 0, v->n) || !ck_utf8_is_valid(v->s, v->n)))
        return ck_error(CK_EFORMAT, "'%s': %s under '%s' is not text (NUL or bad UTF-8)",
                        r->s->path, what, r->name);
    return 0;
}

static int add_meta(struct pt *r, const struct ck_pk_val *v)
{
    struct ck_buf b;
    int err = 0;
    ck_buf_init(&b, META_VALUE_MAX + 64);
    if (is_scalar(v)) {
        if ((err = bad_text(r, v, "a string")) < 0)
            goto out;
        scalar_text(&b, v, false);
    } else {
        bool tuple = v->kind == CK_PK_TUPLE;
        ck_buf_putc(&b, tuple ? '(' : v->kind == CK_PK_DICT ? '{' : '[');
        for (size_t i = 0; i < v->n && b.len < META_VALUE_MAX; i++) {
            if ((err = bad_text(r, v->items[i], "a string")) < 0)
                goto out;
            if (i)
                ck_buf_puts(&b, ", ");
            scalar_text(&b, v->items[i], true);
        }
        if (b.len >= META_VALUE_MAX)
            ck_buf_puts(&b, ", ...");
        else if (tuple && v->n == 1)
            ck_buf_putc(&b, ',');
        ck_buf_putc(&b, tuple ? ')' : v->kind == CK_PK_DICT ? '}' : ']');
    }
    err = ck_tensor_set_add_meta(r->s, r->name[0] ? r->name : "value", ck_buf_str(&b));
out:
    ck_buf_release(&b);
    return err;
}

/* Appends ".key" (or "key" at the top) to r->name; *mark is where to cut back. */
static int push_name(struct pt *r, const struct ck_pk_val *k, size_t *mark)
{
    struct ck_buf b;
    int err = 0;
    *mark = strlen(r->name);
    if (k->kind == CK_PK_STR && (err = bad_text(r, k, "a key")) < 0)
        return err;
    if (!is_scalar(k) || k->kind == CK_PK_BYTES)
        return ck_error(CK_EFORMAT, "'%s': a key under '%s' is not a string or a number",
                        r->s->path, r->name);
    ck_buf_init(&b, NAME_MAX_LEN);
    scalar_text(&b, k, false);
    size_t n = b.len;
    if (*mark + 1 + n >= NAME_MAX_LEN) {
        ck_buf_release(&b);
        return ck_error(CK_EFORMAT, "'%s': a name under '%.64s' is over %d bytes", r->s->path,
                        r->name, NAME_MAX_LEN);
    }
    if (*mark)
        r->name[(*mark)++] = '.';
    memcpy(r->name + *mark, ck_buf_str(&b), n);
    r->name[*mark + n] = 0;
    if (*mark && r->name[*mark - 1] == '.')
        (*mark)--;
    ck_buf_release(&b);
    return 0;
}

static int walk(struct pt *r, const struct ck_pk_val *v, int depth)
{
    int err = 0;
    if (++r->visits > VISITS_MAX)
        return ck_error(CK_EFORMAT, "'%s': more than %u values to visit", r->s->path, VISITS_MAX);
    if (depth > DEPTH_MAX)
        return ck_error(CK_EFORMAT, "'%s': nested deeper than %d levels at '%.64s'", r->s->path,
                        DEPTH_MAX, r->name);
    switch (v->kind) {
    case CK_PK_TENSOR: {
        char save = r->name[0];
        if (!save)
            strcpy(r->name, "tensor");
        err = add_tensor(r, v->t);
        if (!save)
            r->name[0] = 0;
        return err;
    }
    case CK_PK_DICT:
    case CK_PK_LIST:
    case CK_PK_TUPLE: {
        size_t step = v->kind == CK_PK_DICT ? 2 : 1;
        bool plain = true;
        for (size_t i = 0; i < v->n && plain; i++)
            plain = is_scalar(v->items[i * step + step - 1]);
        if (plain && (v->kind != CK_PK_DICT || v->n == 0))
            return add_meta(r, v);
        for (size_t i = 0; i < v->n; i++) {
            struct ck_pk_val index = {.kind = CK_PK_INT, .i = (int64_t)i};
            const struct ck_pk_val *k = step == 2 ? v->items[2 * i] : &index;
            size_t mark = 0;
            if ((err = push_name(r, k, &mark)) < 0 ||
                (err = walk(r, v->items[i * step + step - 1], depth + 1)) < 0)
                return err;
            r->name[mark] = 0;
        }
        return 0;
    }
    case CK_PK_GLOBAL:
    case CK_PK_STORAGE:
    case CK_PK_MARK:
        return ck_error(CK_EFORMAT, "'%s': '%s' is a bare %s, not a tensor", r->s->path,
                        r->name[0] ? r->name : "(the saved object)",
                        v->kind == CK_PK_STORAGE ? "storage" : "class");
    default:
        return add_meta(r, v);
    }
}

/* Tensors of one storage: role "shared" and one metadata entry naming them. */
static int mark_shared(struct pt *r)
{
    for (size_t i = 0; i < r->capst; i++) {
        struct storage *st = &r->st[i];
        if (!st->key || st->users < 2)
            continue;
        struct ck_buf b;
        char key[96];
        int err = 0;
        ck_buf_init(&b, 0);
        for (size_t k = st->first, n = 0; k < r->s->ntensors && n < st->users; k++) {
            struct ck_tensor *t = &r->s->tensors[k];
            if (r->tkeys[k].n != st->keylen || memcmp(r->tkeys[k].s, st->key, st->keylen))
                continue;
            t->role = "shared";
            ck_buf_printf(&b, n++ ? ", %s" : "%s", t->name);
        }
        snprintf(key, sizeof key, "shared_storage.%.*s", (int)st->keylen, st->key);
        err = ck_tensor_set_add_meta(r->s, key, ck_buf_str(&b));
        ck_buf_release(&b);
        if (err < 0)
            return err;
    }
    return 0;
}

/* ---- the archive ---- */

/* PREFIX of PREFIX/data.pkl; every member must be under it. */
static int find_prefix(struct pt *r, uint64_t *pkl)
{
    const char *path = r->s->path;
    bool found = false, script = false;
    for (uint64_t i = 0; i < r->zi.nentries; i++) {
        const char *m = ck_zipin_name(&r->zi, i), *slash = m ? strchr(m, '/') : NULL;
        if (!slash)
            return ck_error(CK_EFORMAT,
                            "'%s': member '%s' is not in a folder: not a torch.save "
                            "archive",
                            path, m ? m : "");
        if (!found && !strcmp(slash, "/data.pkl")) {
            size_t n = (size_t)(slash - m);
            if (n >= sizeof r->prefix)
                return ck_error(CK_EFORMAT, "'%s': archive folder name over 255 bytes", path);
            memcpy(r->prefix, m, n);
            r->prefix[n] = 0;
            *pkl = i;
            found = true;
        }
        if (!strncmp(slash, "/code/", 6) || !strcmp(slash, "/constants.pkl"))
            script = true;
    }
    if (!found)
        return ck_error(CK_EFORMAT, "'%s': no data.pkl member: not a torch.save archive", path);
    if (script)
        return ck_error(CK_EFORMAT,
                        "'%s': a TorchScript archive (torch.jit.save), whose code ckptd does not "
                        "run: save the model's state_dict() with torch.save instead",
                        path);
    size_t pl = strlen(r->prefix);
    for (uint64_t i = 0; i < r->zi.nentries; i++) {
        const char *m = ck_zipin_name(&r->zi, i);
        if (strncmp(m, r->prefix, pl) || m[pl] != '/')
            return ck_error(CK_EFORMAT, "'%s': member '%s' is outside the archive folder '%s'",
                            path, m, r->prefix);
    }
    return 0;
}

/* PREFIX/byteorder: "little" or "big"; absent means little (before torch 1.10). */
static int byte_order(struct pt *r)
{
    char member[300];
    const unsigned char *d = NULL;
    uint64_t i = 0, n = 0;
    int err = 0;
    snprintf(member, sizeof member, "%s/byteorder", r->prefix);
    if (ck_zipin_find(&r->zi, member, &i) < 0) {
        ck_error_clear();
        return 0;
    }
    if ((err = ck_zipin_read(&r->zi, r->s, i, 16, &d, &n)) < 0)
        return err;
    if (n == 3 && !memcmp(d, "big", 3))
        r->big_endian = true;
    else if (!(n == 6 && !memcmp(d, "little", 6)))
        return ck_error(CK_EFORMAT, "'%s': member '%s' is neither 'little' nor 'big'", r->s->path,
                        member);
    if (r->big_endian)
        return ck_tensor_set_add_meta(r->s, "byteorder", "big");
    return 0;
}

static int legacy(const char *path, const unsigned char *b, uint64_t len)
{
    if (len >= sizeof legacy_magic && !memcmp(b, legacy_magic, sizeof legacy_magic))
        return ck_error(CK_EFORMAT,
                        "'%s': a legacy PyTorch file (torch before 1.6, not a zip archive); "
                        "ckptd reads the zip format: load it and save it again with torch 1.6 "
                        "or later",
                        path);
    if (len >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5)
        return ck_error(CK_EFORMAT, "'%s': a bare pickle, not a torch.save zip archive", path);
    return 0;
}

static int pt_open(const char *path, struct ck_tensor_set **out)
{
    struct pt r;
    struct ck_pk *pk = NULL;
    const struct ck_pk_val *root = NULL;
    const unsigned char *pkl = NULL;
    uint64_t ipkl = 0, pkllen = 0;
    char member[300];
    int err = 0;
    *out = NULL;
    memset(&r, 0, sizeof r);
    if (!(r.s = ck_tensor_set_new("pt", path)))
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = ck_tensor_set_map_file(r.s, path, &r.base, &r.blen)) < 0 ||
        (err = legacy(path, r.base, r.blen)) < 0 || (err = ck_zipin_open(&r.zi, path)) < 0 ||
        (err = find_prefix(&r, &ipkl)) < 0 || (err = byte_order(&r)) < 0)
        goto out;
    snprintf(member, sizeof member, "%s/data.pkl", r.prefix);
    if ((err = ck_zipin_read(&r.zi, r.s, ipkl, PKL_MAX, &pkl, &pkllen)) < 0 ||
        (err = ck_pk_load(path, member, pkl, (size_t)pkllen, &pk, &root)) < 0 ||
        (err = walk(&r, root, 0)) < 0 || (err = mark_shared(&r)) < 0 ||
        (err = ck_tensor_set_check_unique(r.s)) < 0)
        goto out;
    *out = r.s;
    r.s = NULL;
out:
    ck_pk_free(pk);
    ck_zipin_close(&r.zi);
    free(r.st);
    free(r.tkeys);
    ck_tensor_set_free(r.s);
    return err;
}

/* Every member's zip CRC-32: storages in place in the mapping, page by page,
 * with the CRC-32C of the tensors they hold in the same pass. */
static int pt_verify(const struct ck_tensor_set *s, struct ck_tensor_crcs *crcs)
{
    return ck_zipin_check_crcs(s, crcs);
}

const struct ck_reader_ops ck_reader_pt = {
    .name = "pt",
    .description = "PyTorch torch.save archive (.pt, .pth): tensors read without running the "
                   "pickle",
    .probe = probe,
    .open = pt_open,
    .verify = pt_verify,
};
