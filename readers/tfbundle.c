/* TensorFlow v2 checkpoints ("tensor bundles"): PREFIX.index and
 * PREFIX.data-NNNNN-of-MMMMM.
 *
 * The index is a LevelDB-style table (tensorflow/core/lib/io/table):
 *   - a 48-byte footer: the metaindex and index block handles (each two
 *     varint64: offset, size), zero padding to 40 bytes, then the fixed64
 *     magic 0xdb4775248b80fb57;
 *   - blocks: entries (varint32 shared, varint32 non_shared, varint32
 *     value_length, key delta, value), then uint32 restart offsets and their
 *     uint32 count; each block is followed by a trailer: 1 byte compression
 *     type (0 none, 1 Snappy) and the masked CRC-32C of contents + type;
 *   - the index block maps each data block's last key to its handle.
 * Keys are tensor names, sorted; the empty key holds the BundleHeaderProto
 * (num_shards 1, endianness 2, version 3), every other a BundleEntryProto
 * (dtype 1, shape 2, shard_id 3, offset 4, size 5, crc32c 6 fixed32 masked,
 * slices 7) locating the tensor's bytes in a data shard.
 *
 * String tensors are stored as varint64 lengths, the masked CRC-32C of the
 * lengths (each as 4 little-endian bytes, 8 when over 2^32-1), then the
 * bytes; the entry's CRC covers those lengths, the 4 stored checksum bytes
 * and the string bytes (tensor_bundle.cc WriteStringTensor). Variant
 * tensors are, per element, varint64 length, bytes, and the masked CRC so
 * far; the entry's CRC covers lengths as 8 bytes, bytes and those 4 bytes. */
#include "readers/reader.h"
#include "common/crc32c.h"
#include "readers/pbwire.h"
#include "common/buf.h"
#include "common/error.h"
#include "lazy/lazy.h"
#include "common/text.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <snappy-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TABLE_MAGIC UINT64_C(0xdb4775248b80fb57)
#define FOOTER_LEN 48
#define KEY_MAX (1u << 16)
#define BLOCK_MAX ((size_t)256 << 20)
#define SHARDS_MAX 1000000

/* TF DataType values (types.proto) with a fixed element size. */
static enum ck_dtype tf_dtype(uint64_t v)
{
    switch (v) {
    case 1:
        return CK_DT_F32;
    case 2:
        return CK_DT_F64;
    case 3:
        return CK_DT_I32;
    case 4:
        return CK_DT_U8;
    case 5:
        return CK_DT_I16;
    case 6:
        return CK_DT_I8;
    case 7:
        return CK_DT_STRING;
    case 8:
        return CK_DT_C64;
    case 9:
        return CK_DT_I64;
    case 10:
        return CK_DT_BOOL;
    case 11:
        return CK_DT_QI8;
    case 12:
        return CK_DT_QU8;
    case 13:
        return CK_DT_QI32;
    case 14:
        return CK_DT_BF16;
    case 15:
        return CK_DT_QI16;
    case 16:
        return CK_DT_QU16;
    case 17:
        return CK_DT_U16;
    case 18:
        return CK_DT_C128;
    case 19:
        return CK_DT_F16;
    case 22:
        return CK_DT_U32;
    case 23:
        return CK_DT_U64;
    case 24:
        return CK_DT_F8_E5M2;
    case 25:
        return CK_DT_F8_E4M3;
    default:
        return CK_DT_INVALID; /* resource, variant, int4, ...: listed without data */
    }
}

/* Whether path is an index file: its last 8 bytes are the table magic. */
static bool has_magic(const char *path)
{
    unsigned char m[8];
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    bool ok = false;
    if (fd < 0)
        return false;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= FOOTER_LEN &&
        pread(fd, m, 8, st.st_size - 8) == 8) {
        uint64_t v = 0;
        for (int i = 7; i >= 0; i--)
            v = (v << 8) | m[i];
        ok = v == TABLE_MAGIC;
    }
    close(fd);
    return ok;
}

/* The bundle prefix named by path: the prefix itself, PREFIX.index,
 * PREFIX.data-NNNNN-of-MMMMM, or a folder holding exactly one *.index. */
static int resolve_prefix(const char *path, char *out, size_t outsz)
{
    size_t n = strlen(path);
    const char *d;
    if (n + 7 > outsz)
        return ck_error(CK_ESIZE, "'%s': path too long", path);
    if (ck_text_ends_with(path, ".index")) {
        snprintf(out, outsz, "%.*s", (int)(n - 6), path);
        return 0;
    }
    if ((d = strstr(path, ".data-")) && !strchr(d, '/')) {
        unsigned a, b;
        int used = 0;
        if (sscanf(d, ".data-%5u-of-%5u%n", &a, &b, &used) == 2 && d[used] == 0) {
            snprintf(out, outsz, "%.*s", (int)(d - path), path);
            return 0;
        }
    }
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        DIR *dir = opendir(path);
        struct dirent *e;
        int found = 0;
        if (!dir)
            return ck_error_os(CK_EIO, "cannot list '%s'", path);
        size_t dl = n;
        while (dl > 1 && path[dl - 1] == '/')
            dl--; /* "dir/" names "dir/variables", not "dir//variables" */
        while ((e = readdir(dir)))
            if (ck_text_ends_with(e->d_name, ".index") && found++ == 0)
                snprintf(out, outsz, "%.*s/%.*s", (int)dl, path, (int)(strlen(e->d_name) - 6),
                         e->d_name);
        closedir(dir);
        /* A SavedModel folder: its variables are DIR/variables/variables.*. */
        if (found == 0) {
            char idx[4200];
            snprintf(idx, sizeof idx, "%.*s/variables/variables.index", (int)dl, path);
            if (strlen(idx) + 1 < outsz && has_magic(idx)) {
                snprintf(out, outsz, "%.*s/variables/variables", (int)dl, path);
                return 0;
            }
        }
        if (found != 1)
            return ck_error(CK_EFORMAT, "'%s': a folder with %d .index files", path, found);
        if (strlen(out) + 7 > outsz)
            return ck_error(CK_ESIZE, "'%s': path too long", path);
        return 0;
    }
    snprintf(out, outsz, "%s", path);
    return 0;
}

static int probe(const char *path, const unsigned char *head, size_t len)
{
    char prefix[4096], index[4104];
    if (resolve_prefix(path, prefix, sizeof prefix) < 0)
        return CK_PROBE_NO;
    snprintf(index, sizeof index, "%s.index", prefix);
    if (has_magic(index))
        return CK_PROBE_CONTENT;
    return ck_text_ends_with(path, ".index") ? CK_PROBE_NAME : CK_PROBE_NO;
}

/* ---- reading ---- */

struct shard {
    const unsigned char *base; /* NULL: missing */
    uint64_t len;
    bool tried;
};

struct ctx {
    struct ck_tensor_set *s;
    const char *index; /* the index file's name, for messages */
    char prefix[4096];
    const unsigned char *ib; /* the index file */
    uint64_t ilen;
    unsigned char *scratch; /* decompressed block, reused */
    size_t scratch_cap;
    struct ck_buf key, last; /* the current and the previous key */
    bool have_last, have_header;
    uint64_t num_shards;
    bool big_endian;
    struct shard *shards;
    uint64_t missing;   /* tensors whose shard is missing */
    uint64_t data_end;  /* end of the last data block read */
    uint64_t key_bytes; /* sum of the full keys' lengths so far */
};

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int handle(struct ctx *c, const unsigned char **p, const unsigned char *end, uint64_t *off,
                  uint64_t *size, const char *what)
{
    if (ck_pb_read_varint(p, end, off) < 0 || ck_pb_read_varint(p, end, size) < 0)
        return ck_error(CK_EFORMAT, "'%s': bad %s block handle", c->index, what);
    return 0;
}

/* The contents of the block at handle (off, size): checked against the file,
 * its CRC checked, decompressed when Snappy. *out points into the file or
 * into c->scratch (valid until the next call). */
static int read_block(struct ctx *c, uint64_t off, uint64_t size, const char *what,
                      const unsigned char **out, size_t *outlen)
{
    if (off > c->ilen || size > c->ilen - off || c->ilen - off - size < 5)
        return ck_error(CK_EFORMAT, "'%s': %s block at %llu (+%llu) past the end", c->index, what,
                        (unsigned long long)off, (unsigned long long)size);
    const unsigned char *b = c->ib + off;
    uint8_t type = b[size];
    uint32_t stored = ck_crc32c_unmask((uint32_t)le(b + size + 1, 4));
    uint32_t actual = ck_crc32c(b, (size_t)size + 1);
    if (stored != actual)
        return ck_error(CK_EFORMAT, "'%s': %s block at %llu: CRC-32C %08x, stored %08x", c->index,
                        what, (unsigned long long)off, actual, stored);
    if (type == 0) {
        *out = b;
        *outlen = (size_t)size;
        return 0;
    }
    if (type != 1)
        return ck_error(CK_EFORMAT, "'%s': %s block at %llu: unknown compression %u", c->index,
                        what, (unsigned long long)off, type);
    size_t ulen;
    int loaded = ck_lazy_load(CK_LIB_SNAPPY);
    if (loaded < 0)
        return ck_error_wrap(loaded, "'%s'", c->index);
    if (snappy_uncompressed_length((const char *)b, (size_t)size, &ulen) != SNAPPY_OK)
        return ck_error(CK_EFORMAT, "'%s': %s block at %llu: bad Snappy header", c->index, what,
                        (unsigned long long)off);
    /* Snappy expands at most ~22x (a 3-byte copy of 64 bytes); more is a lie. */
    if (ulen > BLOCK_MAX || ulen / 32 > size + 1)
        return ck_error(CK_EFORMAT, "'%s': %s block at %llu claims %zu bytes from %llu", c->index,
                        what, (unsigned long long)off, ulen, (unsigned long long)size);
    if (ulen > c->scratch_cap) {
        unsigned char *n = realloc(c->scratch, ulen ? ulen : 1);
        if (!n)
            return ck_error(CK_ENOMEM, "'%s': out of memory", c->index);
        c->scratch = n;
        c->scratch_cap = ulen;
    }
    size_t got = ulen;
    if (snappy_uncompress((const char *)b, (size_t)size, (char *)c->scratch, &got) != SNAPPY_OK ||
        got != ulen)
        return ck_error(CK_EFORMAT, "'%s': %s block at %llu: corrupt Snappy data", c->index, what,
                        (unsigned long long)off);
    *out = c->scratch;
    *outlen = ulen;
    return 0;
}

/* Walks the entries of a block, calling fn(c, key, value) for each. The
 * block is copied out of the scratch buffer first when fn reads blocks too. */
typedef int (*entry_fn)(struct ctx *c, const unsigned char *v, size_t vlen);

static int walk_block(struct ctx *c, const unsigned char *b, size_t len, const char *what,
                      entry_fn fn)
{
    if (len < 4)
        return ck_error(CK_EFORMAT, "'%s': %s block of %zu bytes", c->index, what, len);
    uint64_t nr = le(b + len - 4, 4);
    if (nr == 0 || nr > (len - 4) / 4)
        return ck_error(CK_EFORMAT, "'%s': %s block: %llu restart points do not fit", c->index,
                        what, (unsigned long long)nr);
    size_t limit = len - 4 - (size_t)nr * 4;
    for (uint64_t i = 0; i < nr; i++)
        if (le(b + limit + 4 * i, 4) > limit)
            return ck_error(CK_EFORMAT, "'%s': %s block: restart point past the entries", c->index,
                            what);
    const unsigned char *p = b, *end = b + limit;
    int err;
    ck_buf_reset(&c->key);
    while (p < end) {
        uint64_t shared, nonshared, vlen;
        if (ck_pb_read_varint(&p, end, &shared) < 0 || ck_pb_read_varint(&p, end, &nonshared) < 0 ||
            ck_pb_read_varint(&p, end, &vlen) < 0)
            return ck_error(CK_EFORMAT, "'%s': %s block: truncated entry", c->index, what);
        if (shared > c->key.len)
            return ck_error(CK_EFORMAT, "'%s': %s block: key shares %llu bytes of %zu", c->index,
                            what, (unsigned long long)shared, c->key.len);
        if (nonshared > (uint64_t)(end - p) || vlen > (uint64_t)(end - p) - nonshared)
            return ck_error(CK_EFORMAT, "'%s': %s block: entry past the end", c->index, what);
        c->key.len = (size_t)shared;
        if ((err = ck_buf_append(&c->key, p, (size_t)nonshared)) < 0)
            return ck_error(CK_EFORMAT, "'%s': %s block: key over %u bytes", c->index, what,
                            KEY_MAX);
        p += nonshared;
        /* Prefix compression lets a 3-byte entry stand for a 64 KiB key; the
         * keys are copied and compared whole, so their total is bounded. */
        c->key_bytes += c->key.len;
        if (c->key_bytes > 256 * c->ilen + ((uint64_t)16 << 20))
            return ck_error(CK_EFORMAT, "'%s': keys of %llu bytes in all from a %llu-byte index",
                            c->index, (unsigned long long)c->key_bytes,
                            (unsigned long long)c->ilen);
        if ((err = fn(c, p, (size_t)vlen)) < 0)
            return err;
        p += vlen;
    }
    return 0;
}

static int read_header(struct ctx *c, const unsigned char *v, size_t len)
{
    struct ck_pb r;
    struct ck_pb_field f;
    int rc;
    char buf[64];
    uint64_t producer = 0, min_consumer = 0, endianness = 0;
    ck_pb_init(&r, v, len);
    c->num_shards = 0;
    while ((rc = ck_pb_next(&r, &f)) > 0) {
        if (f.num == 1 && f.wire == CK_PB_VARINT)
            c->num_shards = f.v;
        else if (f.num == 2 && f.wire == CK_PB_VARINT)
            endianness = f.v;
        else if (f.num == 3 && f.wire == CK_PB_LEN) {
            struct ck_pb vr;
            struct ck_pb_field vf;
            ck_pb_init_field(&vr, &f);
            while ((rc = ck_pb_next(&vr, &vf)) > 0)
                if (vf.wire == CK_PB_VARINT && vf.num == 1)
                    producer = vf.v;
                else if (vf.wire == CK_PB_VARINT && vf.num == 2)
                    min_consumer = vf.v;
            if (rc < 0)
                break;
        }
    }
    if (rc < 0)
        return ck_error_wrap(CK_EFORMAT, "'%s': bundle header", c->index);
    if (endianness > 1)
        return ck_error(CK_EFORMAT, "'%s': bundle header: unknown endianness %llu", c->index,
                        (unsigned long long)endianness);
    c->big_endian = endianness == 1;
    if (c->num_shards < 1 || c->num_shards > SHARDS_MAX)
        return ck_error(CK_EFORMAT, "'%s': bundle header: %llu shards", c->index,
                        (unsigned long long)c->num_shards);
    /* This reader follows kTensorBundleVersion 1. */
    if (min_consumer > 1)
        return ck_error(CK_EFORMAT, "'%s': bundle version needs a reader of version %llu", c->index,
                        (unsigned long long)min_consumer);
    if (!(c->shards = calloc((size_t)c->num_shards, sizeof *c->shards)))
        return ck_error(CK_ENOMEM, "'%s': out of memory", c->index);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)c->num_shards);
    int err = ck_tensor_set_add_meta(c->s, "num_shards", buf);
    if (err == 0)
        err = ck_tensor_set_add_meta(c->s, "endianness", c->big_endian ? "big" : "little");
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)producer);
    if (err == 0)
        err = ck_tensor_set_add_meta(c->s, "version.producer", buf);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)min_consumer);
    if (err == 0)
        err = ck_tensor_set_add_meta(c->s, "version.min_consumer", buf);
    return err;
}

static struct shard *shard_get(struct ctx *c, uint64_t id)
{
    struct shard *sh = &c->shards[id];
    if (!sh->tried) {
        char path[4200];
        sh->tried = true;
        snprintf(path, sizeof path, "%s.data-%05llu-of-%05llu", c->prefix, (unsigned long long)id,
                 (unsigned long long)c->num_shards);
        if (ck_tensor_set_map_file(c->s, path, &sh->base, &sh->len) < 0)
            sh->base = NULL;
        ck_error_clear();
    }
    return sh;
}

static int read_shape(struct ctx *c, const char *name, const struct ck_pb_field *f,
                      struct ck_tensor *t)
{
    struct ck_pb r, dr;
    struct ck_pb_field g, d;
    int rc;
    ck_pb_init_field(&r, f);
    while ((rc = ck_pb_next(&r, &g)) > 0) {
        if (g.num == 3 && g.wire == CK_PB_VARINT && g.v)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': shape of unknown rank", c->index, name);
        if (g.num != 2 || g.wire != CK_PB_LEN)
            continue;
        if (t->rank >= CK_TENSOR_MAX_RANK)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': more than %d dimensions", c->index,
                            name, CK_TENSOR_MAX_RANK);
        int64_t size = 0;
        ck_pb_init_field(&dr, &g);
        while ((rc = ck_pb_next(&dr, &d)) > 0)
            if (d.num == 1 && d.wire == CK_PB_VARINT)
                size = (int64_t)d.v;
        if (rc < 0)
            break;
        if (size < 0)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': dimension %lld", c->index, name,
                            (long long)size);
        t->dims[t->rank++] = size;
    }
    if (rc < 0)
        return ck_error_wrap(CK_EFORMAT, "'%s': tensor '%s': shape", c->index, name);
    return 0;
}

/* Splits a string tensor's stored bytes into its strings. */
static int read_strings(struct ctx *c, struct ck_tensor *t, const unsigned char *p, uint64_t size)
{
    uint64_t n, total = 0;
    const unsigned char *q = p, *end = p + size;
    struct ck_bytes *v;
    int err;
    if ((err = ck_tensor_numel(t, &n)) < 0 || n > size)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': %s strings cannot fit in %llu bytes",
                        c->index, t->name, err < 0 ? "too many" : "that many",
                        (unsigned long long)size);
    if ((err = ck_tensor_set_alloc(c->s, n * sizeof *v, (void **)&v)) < 0)
        return err;
    for (uint64_t i = 0; i < n; i++) {
        if (ck_pb_read_varint(&q, end, &v[i].len) < 0)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': string lengths past the end", c->index,
                            t->name);
        if (v[i].len > size)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': string %llu of %llu bytes", c->index,
                            t->name, (unsigned long long)i, (unsigned long long)v[i].len);
        total += v[i].len; /* both <= size < 2^63: no overflow */
        if (total > size)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': strings longer than their region",
                            c->index, t->name);
    }
    if ((uint64_t)(end - q) < 4 || total != (uint64_t)(end - q) - 4)
        return ck_error(CK_EFORMAT,
                        "'%s': tensor '%s': %llu bytes of strings in a %llu-byte "
                        "region",
                        c->index, t->name, (unsigned long long)total, (unsigned long long)size);
    q += 4;
    for (uint64_t i = 0; i < n; i++) {
        v[i].p = q;
        q += v[i].len;
    }
    t->strings = v;
    t->nbytes = total;
    return 0;
}

static int read_entry(struct ctx *c, const unsigned char *v, size_t len)
{
    struct ck_tensor t = {0};
    struct ck_pb r;
    struct ck_pb_field f;
    uint64_t dtype = 0, shard = 0, off = 0, size = 0, crc = 0;
    bool sliced = false;
    int rc, err;
    const char *name = ck_buf_str(&c->key);
    if (strlen(name) != c->key.len)
        return ck_error(CK_EFORMAT, "'%s': a tensor name holds a NUL character", c->index);
    t.name = (char *)name;
    ck_pb_init(&r, v, len);
    while ((rc = ck_pb_next(&r, &f)) > 0) {
        bool vi = f.wire == CK_PB_VARINT;
        if (f.num == 1 && vi)
            dtype = f.v;
        else if (f.num == 2 && f.wire == CK_PB_LEN) {
            if ((err = read_shape(c, name, &f, &t)) < 0)
                return err;
        } else if (f.num == 3 && vi)
            shard = f.v;
        else if (f.num == 4 && vi)
            off = f.v;
        else if (f.num == 5 && vi)
            size = f.v;
        else if (f.num == 6 && f.wire == CK_PB_FIXED32)
            crc = f.v;
        else if (f.num == 7)
            sliced = true;
    }
    if (rc < 0)
        return ck_error_wrap(CK_EFORMAT, "'%s': tensor '%s'", c->index, name);
    t.dtype = tf_dtype(dtype);
    t.big_endian = c->big_endian && ck_dtype_size(t.dtype) > 1;
    t.has_crc32c = true;
    t.crc32c = ck_crc32c_unmask((uint32_t)crc);
    uint64_t numel;
    if ((err = ck_tensor_numel(&t, &numel)) < 0)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': shape overflows", c->index, name);
    if (sliced) {
        /* A partitioned variable: its slices are stored under other keys. */
        t.role = "partitioned";
        t.has_crc32c = false;
        return ck_tensor_set_add(c->s, &t, NULL);
    }
    if (shard >= c->num_shards)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': shard %llu of %llu", c->index, name,
                        (unsigned long long)shard, (unsigned long long)c->num_shards);
    if (t.dtype != CK_DT_STRING && t.dtype != CK_DT_INVALID) {
        t.nbytes = size;
        if ((err = ck_tensor_check_size(&t, c->index)) < 0)
            return err;
    }
    struct shard *sh = shard_get(c, shard);
    if (!sh->base) {
        c->missing++;
        if (t.dtype != CK_DT_STRING)
            t.nbytes = size;
        return ck_tensor_set_add(c->s, &t, NULL);
    }
    if (off > sh->len || size > sh->len - off)
        return ck_error(CK_EFORMAT,
                        "'%s': tensor '%s': %llu bytes at offset %llu past the end of "
                        "shard %llu (%llu bytes)",
                        c->index, name, (unsigned long long)size, (unsigned long long)off,
                        (unsigned long long)shard, (unsigned long long)sh->len);
    const unsigned char *data = sh->base + off;
    if (t.dtype == CK_DT_STRING) {
        if ((err = read_strings(c, &t, data, size)) < 0)
            return err;
        t.raw = data;
        t.rawlen = size;
    } else if (t.dtype == CK_DT_INVALID) {
        t.role = dtype == 21 ? "variant" : "unsupported-dtype";
        t.raw = data;
        t.rawlen = size;
        t.nbytes = size;
    } else {
        t.data = data;
    }
    return ck_tensor_set_add(c->s, &t, NULL);
}

static int on_data_entry(struct ctx *c, const unsigned char *v, size_t len)
{
    /* Keys are strictly increasing across the table; the empty key (the
     * header) therefore comes first and only once. */
    if (c->have_last) {
        size_t a = c->last.len, b = c->key.len, m = a < b ? a : b;
        int cmp = memcmp(c->last.data ? c->last.data : "", c->key.data ? c->key.data : "", m);
        if (cmp > 0 || (cmp == 0 && a >= b))
            return ck_error(CK_EFORMAT, "'%s': keys out of order at '%.200s'", c->index,
                            ck_buf_str(&c->key));
    }
    c->have_last = true;
    ck_buf_reset(&c->last);
    if (ck_buf_append(&c->last, c->key.data ? c->key.data : "", c->key.len) < 0)
        return ck_error(CK_ENOMEM, "'%s': out of memory", c->index);
    if (c->key.len == 0) {
        c->have_header = true;
        return read_header(c, v, len);
    }
    if (!c->have_header)
        return ck_error(CK_EFORMAT, "'%s': no bundle header before tensor '%.200s'", c->index,
                        ck_buf_str(&c->key));
    return read_entry(c, v, len);
}

/* An index block entry: a data block's handle. The index block itself was
 * copied out of the scratch buffer, which the data block reuses. */
static int on_index_entry(struct ctx *c, const unsigned char *v, size_t len)
{
    const unsigned char *p = v, *b;
    uint64_t off, size;
    size_t blen;
    int err;
    struct ck_buf saved = c->key;
    if ((err = handle(c, &p, v + len, &off, &size, "data")) < 0)
        return err;
    /* Data blocks follow one another: an index naming a block twice (or
     * going backwards) would make a small file cost unbounded work. */
    if (off < c->data_end)
        return ck_error(CK_EFORMAT, "'%s': data block at %llu overlaps the previous one", c->index,
                        (unsigned long long)off);
    if ((err = read_block(c, off, size, "data", &b, &blen)) < 0)
        return err;
    c->data_end = off + size + 5; /* read_block checked it is inside the file */
    /* walk_block uses c->key for the data block's keys; keep the index key. */
    ck_buf_init(&c->key, KEY_MAX);
    err = walk_block(c, b, blen, "data", on_data_entry);
    ck_buf_release(&c->key);
    c->key = saved;
    return err;
}

static int tf_open(const char *path, struct ck_tensor_set **out)
{
    struct ctx c = {0};
    char index[4200];
    unsigned char *ib_copy = NULL;
    const unsigned char *b;
    size_t blen;
    int err;
    *out = NULL;
    ck_buf_init(&c.key, KEY_MAX);
    ck_buf_init(&c.last, KEY_MAX);
    if ((err = resolve_prefix(path, c.prefix, sizeof c.prefix)) < 0)
        return err;
    snprintf(index, sizeof index, "%s.index", c.prefix);
    c.index = index;
    if (!(c.s = ck_tensor_set_new("tf-bundle", c.prefix)))
        return ck_error(CK_ENOMEM, "out of memory");
    if ((err = ck_tensor_set_map_file(c.s, index, &c.ib, &c.ilen)) < 0)
        goto out;
    if (c.ilen < FOOTER_LEN || le(c.ib + c.ilen - 8, 8) != TABLE_MAGIC) {
        err = ck_error(CK_EFORMAT, "'%s': not a table (no footer magic)", index);
        goto out;
    }
    const unsigned char *fp = c.ib + c.ilen - FOOTER_LEN, *fend = c.ib + c.ilen - 8;
    uint64_t moff, msize, ioff, isize;
    if ((err = handle(&c, &fp, fend, &moff, &msize, "metaindex")) < 0 ||
        (err = handle(&c, &fp, fend, &ioff, &isize, "index")) < 0)
        goto out;
    /* The metaindex block is checked (CRC, layout) though TF leaves it empty. */
    if ((err = read_block(&c, moff, msize, "metaindex", &b, &blen)) < 0)
        goto out;
    if ((err = read_block(&c, ioff, isize, "index", &b, &blen)) < 0)
        goto out;
    if (!(ib_copy = malloc(blen ? blen : 1))) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    memcpy(ib_copy, b, blen);
    if ((err = walk_block(&c, ib_copy, blen, "index", on_index_entry)) < 0)
        goto out;
    if (!c.have_header) {
        err = ck_error(CK_EFORMAT, "'%s': no bundle header", index);
        goto out;
    }
    if (c.missing) {
        char buf[32];
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)c.missing);
        if ((err = ck_tensor_set_add_meta(c.s, "tensors_without_data", buf)) < 0)
            goto out;
    }
    *out = c.s;
    c.s = NULL;
out:
    free(ib_copy);
    free(c.scratch);
    free(c.shards);
    ck_buf_release(&c.key);
    ck_buf_release(&c.last);
    ck_tensor_set_free(c.s);
    return err;
}

/* The entry CRC of a string tensor: over each length as a little-endian
 * uint32 (uint64 when it does not fit; not the varints on disk), the 4 stored bytes of the lengths'
 * masked CRC, then the string bytes; the lengths' own CRC is checked on the way. */
static int string_crc(const struct ck_tensor_set *s, const struct ck_tensor *t, uint32_t *out)
{
    uint64_t n;
    uint32_t lc = 0;
    if (ck_tensor_numel(t, &n) < 0)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': shape overflows", s->path, t->name);
    for (uint64_t k = 0; k < n; k++) {
        /* Lengths that fit 32 bits count as 4 bytes (older TF wrote uint32s). */
        unsigned char l8[8];
        uint64_t len = t->strings[k].len;
        for (int b = 0; b < 8; b++)
            l8[b] = (unsigned char)(len >> (8 * b));
        lc = ck_crc32c_extend(lc, l8, len <= UINT32_MAX ? 4 : 8);
    }
    /* The lengths' checksum sits right before the first string's bytes. */
    const unsigned char *ck = n ? t->strings[0].p - 4 : t->raw + t->rawlen - 4;
    if (ck_crc32c_unmask((uint32_t)le(ck, 4)) != lc)
        return ck_error(CK_EFORMAT,
                        "'%s': tensor '%s': string lengths do not match their "
                        "CRC-32C",
                        s->path, t->name);
    uint32_t crc = ck_crc32c_extend(lc, ck, 4);
    for (uint64_t k = 0; k < n; k++)
        crc = ck_crc32c_extend(crc, t->strings[k].p, (size_t)t->strings[k].len);
    *out = crc;
    return 0;
}

/* The entry CRC of a variant tensor, checking each element's own CRC. */
static int variant_crc(const struct ck_tensor_set *s, const struct ck_tensor *t, uint32_t *out)
{
    const unsigned char *p = t->raw, *end = t->raw + t->rawlen;
    uint64_t n, len;
    uint32_t crc = 0;
    if (ck_tensor_numel(t, &n) < 0)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': shape overflows", s->path, t->name);
    for (uint64_t k = 0; k < n; k++) {
        unsigned char l8[8];
        if (ck_pb_read_varint(&p, end, &len) < 0 || len > (uint64_t)(end - p) ||
            (uint64_t)(end - p) - len < 4)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': variant element %llu past the end",
                            s->path, t->name, (unsigned long long)k);
        for (int b = 0; b < 8; b++)
            l8[b] = (unsigned char)(len >> (8 * b));
        crc = ck_crc32c_extend(crc, l8, 8);
        crc = ck_crc32c_extend(crc, p, (size_t)len);
        p += len;
        if (ck_crc32c_unmask((uint32_t)le(p, 4)) != crc)
            return ck_error(CK_EFORMAT,
                            "'%s': tensor '%s': variant element %llu does not match "
                            "its CRC-32C",
                            s->path, t->name, (unsigned long long)k);
        crc = ck_crc32c_extend(crc, p, 4);
        p += 4;
    }
    if (p != end)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': bytes after the last variant element",
                        s->path, t->name);
    *out = crc;
    return 0;
}

static int tf_verify(const struct ck_tensor_set *s, struct ck_tensor_crcs *crcs)
{
    int err;
    for (size_t i = 0; i < s->ntensors; i++) {
        const struct ck_tensor *t = &s->tensors[i];
        const unsigned char *p = t->raw ? t->raw : t->data;
        uint64_t len = t->raw ? t->rawlen : t->nbytes;
        uint32_t crc = 0;
        bool data_only = false; /* the sum covers the tensor's data and nothing else */
        if (!t->has_crc32c)
            continue;
        if (!p && len)
            return ck_error(CK_ENOENT, "'%s': tensor '%s': its data shard is missing", s->path,
                            t->name);
        if (t->dtype == CK_DT_STRING && t->strings) {
            if ((err = string_crc(s, t, &crc)) < 0)
                return err;
        } else if (t->role && !strcmp(t->role, "variant")) {
            if ((err = variant_crc(s, t, &crc)) < 0)
                return err;
        } else {
            data_only = p == t->data;
            for (uint64_t at = 0; at < len;) {
                uint64_t n = len - at < ((uint64_t)8 << 20) ? len - at : (uint64_t)8 << 20;
                crc = ck_crc32c_extend(crc, p + at, (size_t)n);
                ck_tensor_set_drop_pages(s, p + at, n);
                at += n;
            }
        }
        if (crc != t->crc32c)
            return ck_error(CK_EFORMAT, "'%s': tensor '%s': CRC-32C %08x, stored %08x", s->path,
                            t->name, crc, t->crc32c);
        if (crcs && data_only) {
            crcs->crc32c[i] = crc;
            crcs->known[i] = true;
        }
    }
    return 0;
}

const struct ck_reader_ops ck_reader_tfbundle = {
    .name = "tf-bundle",
    .description = "TensorFlow v2 checkpoint (PREFIX.index + PREFIX.data-NNNNN-of-MMMMM)",
    .probe = probe,
    .open = tf_open,
    .verify = tf_verify,
};
