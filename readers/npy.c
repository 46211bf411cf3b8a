/* numpy .npy and .npz.
 *
 * .npy (numpy/lib/format.py): "\x93NUMPY", major, minor (1.0, 2.0 or 3.0),
 * the header length (2 bytes LE in 1.0, 4 bytes in 2.0 and 3.0), then the
 * header: a Python dict literal {'descr': '<f4', 'fortran_order': False,
 * 'shape': (2, 3), } padded with spaces and ended by '\n' (3.0 allows UTF-8
 * in it). The data follows, exactly numel x itemsize bytes. The header is
 * parsed strictly: exactly those three keys, simple dtypes only (no record
 * dtypes, no object arrays, whose data are pickles).
 *
 * .npz: a zip of .npy members, stored or deflated; each array is named after
 * its member without ".npy", as numpy.load names them. A stored member is
 * used in place in the mapped archive (its offset comes from the central
 * directory and its local header, both checked against the file); its zip
 * CRC-32 is checked by verify(). A deflated member is inflated by libzip
 * into a block of the size the archive claims, after that claim is checked
 * against the largest expansion deflate allows; libzip checks its CRC-32. */
#include "readers/reader.h"
#include "readers/zipin.h"
#include "readers/sumpass.h"
#include "common/error.h"
#include "common/text.h"

#include <stdlib.h>
#include <string.h>
#include <zip.h>

#define NPY_HEADER_MAX (1u << 20)

static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

static int npy_probe(const char *path, const unsigned char *head, size_t len)
{
    if (len >= 10 && !memcmp(head, magic, 6) && head[6] >= 1 && head[6] <= 3)
        return CK_PROBE_CONTENT;
    return ck_text_ends_with(path, ".npy") ? CK_PROBE_NAME : CK_PROBE_NO;
}

static int npz_probe(const char *path, const unsigned char *head, size_t len)
{
    /* A zip whose first member is an .npy: the local header's name ends in
     * ".npy" (offset 26: name length, 28: extra length, 30: the name). */
    if (ck_zipin_is_zip(head, len) && len >= 30 && head[2] == 3) {
        size_t n = (size_t)head[26] | (size_t)head[27] << 8;
        if (n >= 4 && 30 + n <= len && !memcmp(head + 30 + n - 4, ".npy", 4))
            return CK_PROBE_CONTENT;
    }
    return ck_text_ends_with(path, ".npz") ? CK_PROBE_NAME : CK_PROBE_NO;
}

/* ---- the header dict ---- */

struct hdr {
    const char *p, *end;
    const char *file, *name; /* for messages */
};

static int bad(const struct hdr *h, const char *what)
{
    return ck_error(CK_EFORMAT, "'%s': tensor '%s': header: %s", h->file, h->name, what);
}

static void ws(struct hdr *h)
{
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r'))
        h->p++;
}

static bool eat(struct hdr *h, char c)
{
    ws(h);
    if (h->p < h->end && *h->p == c) {
        h->p++;
        return true;
    }
    return false;
}

/* A quoted Python string without escapes (numpy never writes any) into out. */
static int pystr(struct hdr *h, char *out, size_t outsz)
{
    ws(h);
    if (h->p >= h->end || (*h->p != '\'' && *h->p != '"'))
        return bad(h, "expected a string");
    char q = *h->p++;
    size_t n = 0;
    while (h->p < h->end && *h->p != q) {
        if (*h->p == '\\' || *h->p == '\n')
            return bad(h, "unexpected character in a string");
        if (n + 1 >= outsz)
            return bad(h, "string too long");
        out[n++] = *h->p++;
    }
    if (h->p >= h->end)
        return bad(h, "unterminated string");
    h->p++;
    out[n] = 0;
    return 0;
}

static int shape_tuple(struct hdr *h, struct ck_tensor *t)
{
    if (!eat(h, '('))
        return bad(h, "shape is not a tuple");
    t->rank = 0;
    if (eat(h, ')'))
        return 0;
    for (;;) {
        ws(h);
        uint64_t v = 0;
        const char *s = h->p;
        while (h->p < h->end && *h->p >= '0' && *h->p <= '9') {
            if (v > (UINT64_C(0x7fffffffffffffff) - (uint64_t)(*h->p - '0')) / 10)
                return bad(h, "dimension overflows");
            v = v * 10 + (uint64_t)(*h->p++ - '0');
        }
        if (h->p == s)
            return bad(h, "bad dimension");
        if (t->rank >= CK_TENSOR_MAX_RANK)
            return bad(h, "too many dimensions");
        t->dims[t->rank++] = (int64_t)v;
        bool comma = eat(h, ',');
        if (eat(h, ')')) {
            if (t->rank == 1 && !comma)
                return bad(h, "a one-element shape needs a trailing comma");
            return 0;
        }
        if (!comma)
            return bad(h, "expected ',' or ')' in shape");
    }
}

static int descr(struct hdr *h, const char *d, struct ck_tensor *t)
{
    char order = d[0], kind = d[1];
    char *endp;
    if (!order || !kind || !d[2])
        return bad(h, "unsupported descr");
    unsigned long size = strtoul(d + 2, &endp, 10);
    if (*endp || d[2] < '1' || d[2] > '9')
        return bad(h, "unsupported descr");
    static const struct {
        char kind;
        unsigned long size;
        enum ck_dtype dt;
    } map[] = {
        {'b', 1, CK_DT_BOOL}, {'i', 1, CK_DT_I8},    {'i', 2, CK_DT_I16}, {'i', 4, CK_DT_I32},
        {'i', 8, CK_DT_I64},  {'u', 1, CK_DT_U8},    {'u', 2, CK_DT_U16}, {'u', 4, CK_DT_U32},
        {'u', 8, CK_DT_U64},  {'f', 2, CK_DT_F16},   {'f', 4, CK_DT_F32}, {'f', 8, CK_DT_F64},
        {'c', 8, CK_DT_C64},  {'c', 16, CK_DT_C128},
    };
    t->dtype = CK_DT_INVALID;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i].kind == kind && map[i].size == size)
            t->dtype = map[i].dt;
    if (t->dtype == CK_DT_INVALID) {
        if (kind == 'O')
            return bad(h, "object arrays (pickled data) are not read");
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': unsupported dtype '%.20s'", h->file,
                        h->name, d);
    }
    if (order == '>')
        t->big_endian = size > 1;
    else if (order == '|' && size != 1)
        return bad(h, "'|' byte order on a multi-byte type");
    else if (order != '<' && order != '|' && order != '=')
        return bad(h, "bad byte order");
    /* complex: the element is two floats; get_f64 reads the first. */
    return 0;
}

static int parse_dict(struct hdr *h, struct ck_tensor *t)
{
    bool seen_descr = false, seen_fo = false, seen_shape = false;
    char key[32], val[64];
    int err;
    if (!eat(h, '{'))
        return bad(h, "not a dict");
    for (;;) {
        if (eat(h, '}'))
            break;
        if ((err = pystr(h, key, sizeof key)) < 0)
            return err;
        if (!eat(h, ':'))
            return bad(h, "expected ':'");
        if (!strcmp(key, "descr") && !seen_descr) {
            seen_descr = true;
            ws(h);
            if (h->p < h->end && *h->p == '[')
                return bad(h, "record dtypes are not read");
            if ((err = pystr(h, val, sizeof val)) < 0 || (err = descr(h, val, t)) < 0)
                return err;
        } else if (!strcmp(key, "fortran_order") && !seen_fo) {
            seen_fo = true;
            ws(h);
            if (h->end - h->p >= 4 && !memcmp(h->p, "True", 4)) {
                t->fortran_order = true;
                h->p += 4;
            } else if (h->end - h->p >= 5 && !memcmp(h->p, "False", 5)) {
                h->p += 5;
            } else {
                return bad(h, "fortran_order is not True or False");
            }
        } else if (!strcmp(key, "shape") && !seen_shape) {
            seen_shape = true;
            if ((err = shape_tuple(h, t)) < 0)
                return err;
        } else {
            return bad(h, "unknown or repeated key");
        }
        if (!eat(h, ',')) {
            if (!eat(h, '}'))
                return bad(h, "expected ',' or '}'");
            break;
        }
    }
    if (!seen_descr || !seen_fo || !seen_shape)
        return bad(h, "missing descr, fortran_order or shape");
    ws(h);
    if (h->p != h->end)
        return bad(h, "trailing characters");
    return 0;
}

/* An .npy image at [base, base+len) into t (name borrowed). */
static int parse_npy(const char *file, const char *name, const unsigned char *base, uint64_t len,
                     struct ck_tensor *t)
{
    memset(t, 0, sizeof *t);
    t->name = (char *)name;
    if (len < 10 || memcmp(base, magic, 6))
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': not an .npy (bad magic)", file, name);
    unsigned major = base[6];
    uint64_t hl, at;
    if (major == 1) {
        hl = (uint64_t)base[8] | (uint64_t)base[9] << 8;
        at = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': truncated header", file, name);
        hl = (uint64_t)base[8] | (uint64_t)base[9] << 8 | (uint64_t)base[10] << 16 |
             (uint64_t)base[11] << 24;
        at = 12;
    } else {
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': .npy version %u.%u not supported", file,
                        name, major, base[7]);
    }
    if (base[7] != 0)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': .npy version %u.%u not supported", file,
                        name, major, base[7]);
    if (hl > NPY_HEADER_MAX)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': header of %llu bytes over the limit", file,
                        name, (unsigned long long)hl);
    if (hl > len - at)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': header length %llu past the end", file,
                        name, (unsigned long long)hl);
    const char *hp = (const char *)base + at;
    if (!hl || hp[hl - 1] != '\n')
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': header does not end with a newline", file,
                        name);
    for (uint64_t i = 0; i < hl; i++)
        if (major < 3 && (unsigned char)hp[i] >= 0x80)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': non-ASCII header in version %u", file,
                            name, major);
    struct hdr h = {hp, hp + hl, file, name};
    int err;
    if ((err = parse_dict(&h, t)) < 0)
        return err;
    uint64_t n, es = ck_dtype_size(t->dtype);
    if ((err = ck_tensor_numel(t, &n)) < 0 || n > UINT64_MAX / es)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': shape overflows", file, name);
    at += hl;
    t->nbytes = n * es;
    if (t->nbytes != len - at)
        return ck_error(CK_EFORMAT,
                        "'%s': tensor '%s': shape needs %llu bytes, the file holds %llu", file,
                        name, (unsigned long long)t->nbytes, (unsigned long long)(len - at));
    t->data = base + at;
    return 0;
}

static int npy_open(const char *path, struct ck_tensor_set **out)
{
    struct ck_tensor_set *s = ck_tensor_set_new("npy", path);
    const unsigned char *base;
    uint64_t len;
    struct ck_tensor t;
    int err;
    *out = NULL;
    if (!s)
        return ck_error(CK_ENOMEM, "out of memory");
    /* The array is named after the file, as numpy.load of an .npz names members. */
    const char *slash = strrchr(path, '/');
    const char *bn = slash ? slash + 1 : path;
    size_t bl = strlen(bn);
    if (bl > 4 && !strcmp(bn + bl - 4, ".npy"))
        bl -= 4;
    char *name = ck_tensor_set_strdup(s, bn, bl);
    if (!name) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    if ((err = ck_tensor_set_map_file(s, path, &base, &len)) < 0 ||
        (err = parse_npy(path, name, base, len, &t)) < 0 ||
        (err = ck_tensor_set_add(s, &t, NULL)) < 0)
        goto out;
    *out = s;
    return 0;
out:
    ck_tensor_set_free(s);
    return err;
}

static int npz_member(struct ck_tensor_set *s, struct ck_zipin *zi, uint64_t i,
                      const unsigned char *base, uint64_t blen, uint64_t **offs, const char *name,
                      struct ck_tensor *t)
{
    const char *member = ck_zipin_name(zi, i);
    zip_stat_t st;
    const unsigned char *data;
    uint64_t len;
    int err;
    zip_stat_init(&st);
    if (zip_stat_index(zi->z, i, 0, &st) < 0 || !(st.valid & ZIP_STAT_COMP_METHOD) ||
        !(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_COMP_SIZE) ||
        !(st.valid & ZIP_STAT_CRC))
        return ck_error(CK_EFORMAT, "'%s': member '%s': no sizes", s->path, member);
    if ((st.valid & ZIP_STAT_ENCRYPTION_METHOD) && st.encryption_method != ZIP_EM_NONE)
        return ck_error(CK_EFORMAT, "'%s': member '%s' is encrypted", s->path, member);
    if (st.comp_method != ZIP_CM_STORE) {
        if ((err = ck_zipin_read(zi, s, i, CK_TENSOR_ALLOC_MAX, &data, &len)) < 0)
            return err;
        return parse_npy(s->path, name, data, len, t);
    }
    if (st.size != st.comp_size)
        return ck_error(CK_EFORMAT, "'%s': stored member '%s' claims %llu bytes in %llu", s->path,
                        member, (unsigned long long)st.size, (unsigned long long)st.comp_size);
    if (!*offs && (err = ck_zipin_local_offsets(s, base, blen, zi->nentries, offs)) < 0)
        return err;
    if ((err = ck_zipin_stored(s, base, blen, (*offs)[i], member, st.size, &data)) < 0 ||
        (err = parse_npy(s->path, name, data, st.size, t)) < 0)
        return err;
    t->raw = data;
    t->rawlen = st.size;
    t->has_crc32 = true;
    t->crc32 = st.crc;
    return 0;
}

static int npz_open(const char *path, struct ck_tensor_set **out)
{
    struct ck_tensor_set *s = ck_tensor_set_new("npz", path);
    struct ck_zipin zi = {0};
    const unsigned char *base;
    uint64_t blen, *offs = NULL;
    int err;
    *out = NULL;
    if (!s)
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = ck_zipin_open(&zi, path)) < 0 ||
        (err = ck_tensor_set_map_file(s, path, &base, &blen)) < 0)
        goto out;
    for (uint64_t i = 0; i < zi.nentries; i++) {
        const char *member = ck_zipin_name(&zi, i);
        size_t ml = member ? strlen(member) : 0;
        if (!ml || member[ml - 1] == '/')
            continue; /* a folder entry */
        if (ml < 4 || strcmp(member + ml - 4, ".npy")) {
            err = ck_error(CK_EFORMAT, "'%s': member '%s' is not an .npy", path, member);
            goto out;
        }
        char *name = ck_tensor_set_strdup(s, member, ml - 4);
        struct ck_tensor t;
        if (!name) {
            err = ck_error(CK_ENOMEM, "out of memory");
            goto out;
        }
        if ((err = npz_member(s, &zi, i, base, blen, &offs, name, &t)) < 0 ||
            (err = ck_tensor_set_add(s, &t, NULL)) < 0)
            goto out;
    }
    if ((err = ck_tensor_set_check_unique(s)) < 0)
        goto out;
    *out = s;
    s = NULL;
out:
    ck_zipin_close(&zi);
    ck_tensor_set_free(s);
    return err;
}

const struct ck_reader_ops ck_reader_npy = {
    .name = "npy",
    .description = "numpy .npy array (format versions 1, 2, 3)",
    .probe = npy_probe,
    .open = npy_open,
    .verify = NULL,
};

/* The zip CRC-32 of each stored member (deflated ones were checked by
 * libzip when open() inflated them). */
static int npz_verify(const struct ck_tensor_set *s, struct ck_tensor_crcs *crcs)
{
    struct ck_sumpass sp;
    int err = ck_sumpass_init(&sp, s, crcs);
    for (size_t i = 0; err == 0 && i < s->ntensors; i++) {
        const struct ck_tensor *t = &s->tensors[i];
        if (!t->has_crc32)
            continue;
        uint32_t crc = ck_sumpass_region(&sp, t->raw, t->rawlen);
        if (crc != t->crc32)
            err = ck_error(CK_EFORMAT, "'%s': tensor '%s': zip CRC-32 %08x, stored %08x", s->path,
                           t->name, (unsigned)crc, t->crc32);
    }
    ck_sumpass_release(&sp);
    return err;
}

const struct ck_reader_ops ck_reader_npz = {
    .name = "npz",
    .description = "numpy .npz archive of .npy arrays (stored or deflated)",
    .probe = npz_probe,
    .open = npz_open,
    .verify = npz_verify,
};
