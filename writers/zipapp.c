#include "writers/zipapp.h"

#include "common/crc32.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/writebehind.h"
#include "common/zipjournal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define U32MAX 0xffffffffu
#define U16MAX 0xffffu
#define EOCD_LEN 22
#define MAX_COMMENT 65535
#define MAX_CD (UINT64_C(1) << 30)
#define FLAG_UTF8 0x0800

static uint64_t get(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t dos_time(void)
{
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    if (tm.tm_year < 80)
        return (1 << 21) | (1 << 16); /* 1980-01-01 */
    uint32_t date = (uint32_t)((tm.tm_year - 80) << 9 | (tm.tm_mon + 1) << 5 | tm.tm_mday);
    uint32_t t = (uint32_t)(tm.tm_hour << 11 | tm.tm_min << 5 | tm.tm_sec / 2);
    return date << 16 | t;
}

static int add_entry(struct ck_zipapp *z, struct ck_zipapp_entry **out)
{
    if (z->nents == z->cap) {
        size_t cap = z->cap ? 2 * z->cap : 64;
        struct ck_zipapp_entry *n = realloc(z->ents, cap * sizeof(*n));
        if (!n)
            return ck_error(CK_ENOMEM, "'%s': out of memory", z->path);
        z->ents = n;
        z->cap = cap;
    }
    *out = &z->ents[z->nents++];
    memset(*out, 0, sizeof(**out));
    return 0;
}

/* Finds the end records; fills the central directory's offset, size and count. */
static int find_end(struct ck_zipapp *z, uint64_t size, uint64_t *cd_off, uint64_t *cd_size,
                    uint64_t *count)
{
    uint64_t tail = size < EOCD_LEN + MAX_COMMENT ? size : EOCD_LEN + MAX_COMMENT;
    unsigned char *b = malloc(tail ? (size_t)tail : 1);
    int err = 0;
    if (!b)
        return ck_error(CK_ENOMEM, "'%s': out of memory", z->path);
    if (size < EOCD_LEN || ck_pread_all(z->fd, b, tail, size - tail) < 0) {
        err = ck_error(CK_EFORMAT, "'%s': not a zip archive (too short)", z->path);
        goto out;
    }
    int64_t at = -1;
    for (int64_t i = (int64_t)tail - EOCD_LEN; i >= 0; i--)
        if (get(b + i, 4) == SIG_EOCD && (uint64_t)i + EOCD_LEN + get(b + i + 20, 2) == tail) {
            at = i;
            break;
        }
    if (at < 0) {
        err =
            ck_error(CK_EFORMAT, "'%s': not a zip archive (no end of central directory)", z->path);
        goto out;
    }
    const unsigned char *e = b + at;
    uint64_t eocd = size - tail + (uint64_t)at;
    *count = get(e + 10, 2);
    *cd_size = get(e + 12, 4);
    *cd_off = get(e + 16, 4);
    if (get(e + 4, 2) != 0 || get(e + 6, 2) != 0) {
        err = ck_error(CK_EFORMAT, "'%s': multi-disk zip archives are not supported", z->path);
        goto out;
    }
    if (*count == U16MAX || *cd_size == U32MAX || *cd_off == U32MAX) {
        unsigned char loc[20], r[56];
        if (eocd < 20 || ck_pread_all(z->fd, loc, 20, eocd - 20) < 0 || get(loc, 4) != SIG_LOC64 ||
            get(loc + 8, 8) + 56 > eocd || ck_pread_all(z->fd, r, 56, get(loc + 8, 8)) < 0 ||
            get(r, 4) != SIG_EOCD64) {
            err = ck_error(CK_EFORMAT, "'%s': zip64 end records are missing or corrupt", z->path);
            goto out;
        }
        *count = get(r + 32, 8);
        *cd_size = get(r + 40, 8);
        *cd_off = get(r + 48, 8);
        eocd = get(loc + 8, 8);
    }
    if (*cd_off > eocd || *cd_size > eocd - *cd_off || *cd_size > MAX_CD)
        err = ck_error(CK_EFORMAT,
                       "'%s': central directory at %" PRIu64 " (%" PRIu64
                       " bytes) lies outside the archive",
                       z->path, *cd_off, *cd_size);
out:
    free(b);
    return err;
}

static int parse_cd(struct ck_zipapp *z, const unsigned char *cd, uint64_t len, uint64_t count,
                    uint64_t cd_off)
{
    uint64_t p = 0;
    int err;
    for (uint64_t i = 0; i < count; i++) {
        if (len - p < 46 || get(cd + p, 4) != SIG_CENTRAL)
            return ck_error(CK_EFORMAT, "'%s': central directory record %" PRIu64 " is corrupt",
                            z->path, i);
        const unsigned char *r = cd + p;
        uint64_t nl = get(r + 28, 2), xl = get(r + 30, 2), cl = get(r + 32, 2);
        if (len - p - 46 < nl + xl + cl || nl == 0)
            return ck_error(CK_EFORMAT, "'%s': central directory record %" PRIu64 " is truncated",
                            z->path, i);
        struct ck_zipapp_entry *e = NULL;
        if ((err = add_entry(z, &e)) < 0)
            return err;
        if (!(e->name = strndup((const char *)r + 46, (size_t)nl)) || strlen(e->name) != nl)
            return ck_error(CK_EFORMAT, "'%s': member %" PRIu64 " has a bad name", z->path, i);
        e->method = (uint16_t)get(r + 10, 2);
        e->crc = (uint32_t)get(r + 16, 4);
        e->csize = get(r + 20, 4);
        e->usize = get(r + 24, 4);
        e->local = get(r + 42, 4);
        const unsigned char *x = r + 46 + nl, *xe = x + xl;
        while (xe - x >= 4) {
            uint64_t id = get(x, 2), sz = get(x + 2, 2);
            if ((uint64_t)(xe - x - 4) < sz)
                break;
            if (id == 1) {
                const unsigned char *q = x + 4, *qe = q + sz;
                uint64_t *f[3] = {&e->usize, &e->csize, &e->local};
                for (int k = 0; k < 3; k++)
                    if (*f[k] == U32MAX && qe - q >= 8) {
                        *f[k] = get(q, 8);
                        q += 8;
                    }
            }
            x += 4 + sz;
        }
        if (e->local >= cd_off || e->csize > cd_off - e->local)
            return ck_error(CK_EFORMAT, "'%s': member '%s' lies outside the archive", z->path,
                            e->name);
        e->rec = z->cd.len;
        e->reclen = (size_t)(46 + nl + xl + cl);
        if ((err = ck_buf_append(&z->cd, r, e->reclen)) < 0)
            return err;
        p += e->reclen;
    }
    return 0;
}

static int open_existing(struct ck_zipapp *z)
{
    struct stat st;
    uint64_t cd_off = 0, cd_size = 0, count = 0;
    bool rolled;
    int err;
    if (flock(z->fd, LOCK_EX | LOCK_NB) < 0)
        return errno == EWOULDBLOCK
                   ? ck_error(CK_ELOCKED, "'%s': another process is appending to it", z->path)
                   : ck_error_os(CK_EIO, "'%s': cannot lock", z->path);
    z->lockfd = z->fd;
    if ((err = ck_zipjournal_recover(z->path, z->fd, &rolled)) < 0)
        return err;
    if (fstat(z->fd, &st) < 0)
        return ck_error_os(CK_EIO, "cannot stat '%s'", z->path);
    if (!S_ISREG(st.st_mode))
        return ck_error(CK_EFORMAT, "'%s': not a regular file", z->path);
    z->old_len = (uint64_t)st.st_size;
    if ((err = find_end(z, z->old_len, &cd_off, &cd_size, &count)) < 0)
        return err;
    if (count > cd_size / 46 + 1)
        return ck_error(CK_EFORMAT,
                        "'%s': %" PRIu64 " members cannot fit a central directory of %" PRIu64
                        " bytes",
                        z->path, count, cd_size);
    unsigned char *cd = malloc(cd_size ? (size_t)cd_size : 1);
    if (!cd)
        return ck_error(CK_ENOMEM, "'%s': out of memory", z->path);
    if (ck_pread_all(z->fd, cd, cd_size, cd_off) < 0)
        err = ck_error_os(CK_EIO, "cannot read '%s'", z->path);
    else
        err = parse_cd(z, cd, cd_size, count, cd_off);
    free(cd);
    z->start = z->pos = cd_off;
    return err;
}

static int init(struct ck_zipapp *z, const char *path)
{
    memset(z, 0, sizeof(*z));
    z->fd = z->lockfd = -1;
    z->tmp.fd = -1;
    z->dos_time = dos_time();
    ck_buf_init(&z->cd, (size_t)MAX_CD);
    if (!(z->path = strdup(path)))
        return ck_error(CK_ENOMEM, "out of memory");
    return 0;
}

int ck_zipapp_create(struct ck_zipapp *z, const char *path, mode_t mode)
{
    int err = init(z, path);
    if (err < 0)
        return err;
    z->fresh = true;
    if ((err = ck_atomic_open(&z->tmp, path, mode)) < 0) {
        ck_zipapp_abort(z);
        return err;
    }
    z->fd = z->tmp.fd;
    ck_writebehind_init(&z->wb, z->fd, 0);
    return 0;
}

int ck_zipapp_open(struct ck_zipapp *z, const char *path)
{
    int err = init(z, path);
    if (err < 0)
        return err;
    z->fd = open(path, O_RDWR | O_CLOEXEC);
    if (z->fd >= 0) {
        err = open_existing(z);
    } else if (errno == ENOENT) {
        z->fresh = true;
        if ((err = ck_atomic_open(&z->tmp, path, 0644)) >= 0)
            z->fd = z->tmp.fd;
    } else {
        err = ck_error_os(CK_EIO, "cannot open '%s'", path);
    }
    if (err < 0)
        ck_zipapp_abort(z);
    else
        ck_writebehind_init(&z->wb, z->fd, z->pos);
    return err;
}

struct ck_zipapp_entry *ck_zipapp_find(struct ck_zipapp *z, const char *name)
{
    for (size_t i = 0; i < z->nents; i++)
        if (!z->ents[i].dropped && !strcmp(z->ents[i].name, name))
            return &z->ents[i];
    return NULL;
}

/* The offset of an existing entry's data, checked against the old archive. */
static int data_at(struct ck_zipapp *z, const struct ck_zipapp_entry *e, uint64_t *out)
{
    unsigned char h[30];
    if (ck_pread_all(z->fd, h, 30, e->local) < 0 || get(h, 4) != SIG_LOCAL)
        return ck_error(CK_EFORMAT, "'%s': member '%s': bad local header", z->path, e->name);
    uint64_t at = e->local + 30 + get(h + 26, 2) + get(h + 28, 2);
    if (at > z->start || e->csize > z->start - at)
        return ck_error(CK_EFORMAT, "'%s': member '%s' lies outside the archive", z->path, e->name);
    *out = at;
    return 0;
}

int ck_zipapp_read(struct ck_zipapp *z, const struct ck_zipapp_entry *e, uint64_t max,
                   struct ck_buf *out)
{
    uint64_t at;
    int err;
    if (e->usize > max)
        return ck_error(CK_ESIZE, "'%s': member '%s' is over %" PRIu64 " bytes", z->path, e->name,
                        max);
    if ((err = data_at(z, e, &at)) < 0)
        return err;
    if (e->method != 0 && e->method != 8)
        return ck_error(CK_EFORMAT, "'%s': member '%s': compression method %u", z->path, e->name,
                        e->method);
    unsigned char *c = malloc(e->csize ? (size_t)e->csize : 1);
    if (!c)
        return ck_error(CK_ENOMEM, "'%s': out of memory", z->path);
    if (ck_pread_all(z->fd, c, e->csize, at) < 0) {
        free(c);
        return ck_error_os(CK_EIO, "cannot read '%s'", z->path);
    }
    if (e->method == 0) {
        err = e->csize == e->usize
                  ? ck_buf_append(out, c, (size_t)e->csize)
                  : ck_error(CK_EFORMAT, "'%s': member '%s': sizes disagree", z->path, e->name);
    } else if ((err = ck_buf_reserve(out, (size_t)e->usize + 1)) >= 0) {
        z_stream s;
        memset(&s, 0, sizeof(s));
        s.next_in = c;
        s.avail_in = (uInt)e->csize;
        s.next_out = (unsigned char *)out->data + out->len;
        s.avail_out = (uInt)e->usize;
        int zr = inflateInit2(&s, -MAX_WBITS);
        if (zr == Z_OK)
            zr = inflate(&s, Z_FINISH);
        if (zr != Z_STREAM_END || s.total_out != e->usize)
            err = ck_error(CK_EFORMAT, "'%s': member '%s' does not inflate", z->path, e->name);
        inflateEnd(&s);
        if (err >= 0) {
            out->len += (size_t)e->usize;
            out->data[out->len] = 0;
        }
    }
    free(c);
    if (err >= 0 && (uint32_t)crc32(0, (const unsigned char *)out->data + out->len - e->usize,
                                    (uInt)e->usize) != e->crc)
        err = ck_error(CK_EFORMAT, "'%s': member '%s': CRC mismatch", z->path, e->name);
    return err;
}

bool ck_zipapp_same(struct ck_zipapp *z, const struct ck_zipapp_entry *e, const void *data,
                    uint64_t len, uint32_t crc)
{
    uint64_t at;
    if (e->added || e->method != 0 || e->crc != crc || e->usize != len || e->csize != len)
        return false;
    if (data_at(z, e, &at) < 0) {
        ck_error_clear();
        return false;
    }
    unsigned char buf[65536];
    const unsigned char *p = data;
    for (uint64_t off = 0; off < len;) {
        uint64_t n = len - off < sizeof(buf) ? len - off : sizeof(buf);
        if (ck_pread_all(z->fd, buf, n, at + off) < 0 || memcmp(buf, p + off, (size_t)n))
            return false;
        off += n;
    }
    return true;
}

void ck_zipapp_drop(struct ck_zipapp *z, struct ck_zipapp_entry *e)
{
    (void)z;
    e->dropped = true;
}

/* Before the first byte of the old archive is overwritten. */
static int ensure_journal(struct ck_zipapp *z)
{
    if (z->fresh || z->journaled)
        return 0;
    uint64_t tl = z->old_len - z->start;
    unsigned char *tail = malloc(tl ? (size_t)tl : 1);
    int err;
    if (!tail)
        return ck_error(CK_ENOMEM, "'%s': out of memory", z->path);
    if (ck_pread_all(z->fd, tail, tl, z->start) < 0)
        err = ck_error_os(CK_EIO, "cannot read '%s'", z->path);
    else
        err = ck_zipjournal_write(z->path, z->old_len, z->start, tail, tl);
    free(tail);
    if (err >= 0)
        z->journaled = true;
    return err;
}

/* ---- writing members ---- */

/* The CRC is taken on pieces this size right before they are written, while
 * they are in cache. */
#define PIECE (1u << 20)
#define OUTBUF (256u << 10)

/* Writes n bytes at the end; common/writebehind hands them to the disk
 * while the rest is being written, so the fsync at commit finds most of a
 * large archive on disk already. */
static int put_data(struct ck_zipapp *z, const void *p, size_t n)
{
    if (ck_pwrite_all(z->fd, p, n, z->pos) < 0)
        return errno == EFAULT ? ck_error(CK_ECHANGED,
                                          "'%s': the data to write became unreadable "
                                          "(its file truncated meanwhile?)",
                                          z->path)
                               : ck_error_os(CK_EIO, "cannot write '%s'", z->path);
    z->pos += n;
    ck_writebehind_wrote(&z->wb, z->pos);
    return 0;
}

/* The local header of the member being written (its CRC and sizes final
 * once the member ends; the same length either way). h holds LOCAL_MAX. */
#define LOCAL_MAX (30 + 4096 + 20 + 6 + 4096)
static size_t local_header(const struct ck_zipapp *z, unsigned char *h)
{
    const struct ck_zipapp_member *m = &z->cur;
    size_t nl = strlen(m->name);
    put(h, SIG_LOCAL, 4);
    put(h + 4, m->z64 ? 45 : 20, 2);
    put(h + 6, FLAG_UTF8, 2);
    put(h + 8, m->level ? 8 : 0, 2);
    put(h + 10, z->dos_time, 4);
    put(h + 14, m->crc, 4);
    put(h + 18, m->z64 ? U32MAX : m->csize, 4);
    put(h + 22, m->z64 ? U32MAX : m->size, 4);
    put(h + 26, nl, 2);
    memcpy(h + 30, m->name, nl);
    size_t at = 30 + nl;
    if (m->z64) {
        put(h + at, 1, 2);
        put(h + at + 2, 16, 2);
        put(h + at + 4, m->size, 8);
        put(h + at + 12, m->csize, 8);
        at += 20;
    }
    if (m->pad) {
        /* zipalign's field: the alignment, then zeros up to it */
        put(h + at, 0xd935, 2);
        put(h + at + 2, m->pad - 4, 2);
        put(h + at + 4, z->align, 2);
        memset(h + at + 6, 0, m->pad - 6);
        at += m->pad;
    }
    put(h + 28, at - 30 - nl, 2);
    return at;
}

int ck_zipapp_begin(struct ck_zipapp *z, const char *name, uint64_t size, int level)
{
    size_t nl = strlen(name);
    int err;
    if (z->cur.name)
        return ck_error(CK_EUSAGE, "'%s': member '%s' is still being written", z->path,
                        z->cur.name);
    if (nl == 0 || nl > 4096)
        return ck_error(CK_EUSAGE, "'%s': bad member name '%s'", z->path, name);
    if (level < 0 || level > 9)
        return ck_error(CK_EUSAGE, "'%s': compression level %d (0 to 9)", z->path, level);
    if ((err = ensure_journal(z)) < 0)
        return err;
    struct ck_zipapp_member *m = &z->cur;
    memset(m, 0, sizeof(*m));
    if (!(m->name = strdup(name)))
        return ck_error(CK_ENOMEM, "out of memory");
    m->size = size;
    m->level = level;
    /* zip64 sizes when they may not fit 32 bits: deflate can grow
     * incompressible data by a few bytes per 16 KiB block. */
    m->z64 = z->zip64 || size >= U32MAX - (level ? size / 1024 + 4096 : 0);
    m->local = z->pos;
    if (z->align && !level) {
        uint64_t base = m->local + 30 + nl + (m->z64 ? 20 : 0) + 6;
        m->pad = 6 + (size_t)((z->align - base % z->align) % z->align);
    }
    if (level) {
        if (!(m->out = malloc(OUTBUF)))
            return ck_error(CK_ENOMEM, "out of memory");
        if (deflateInit2(&m->zs, level, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
            free(m->out);
            m->out = NULL;
            return ck_error(CK_ENOMEM, "'%s': cannot start deflate", z->path);
        }
        m->deflating = true;
    }
    unsigned char h[LOCAL_MAX];
    size_t hl = local_header(z, h);
    if (ck_pwrite_all(z->fd, h, hl, z->pos) < 0)
        return ck_error_os(CK_EIO, "cannot write '%s'", z->path);
    z->pos += hl;
    return 0;
}

static int deflate_some(struct ck_zipapp *z, int flush)
{
    struct ck_zipapp_member *m = &z->cur;
    int err;
    do {
        m->zs.next_out = m->out;
        m->zs.avail_out = OUTBUF;
        int zr = deflate(&m->zs, flush);
        if (zr == Z_STREAM_ERROR)
            return ck_error(CK_ERR, "'%s': member '%s': deflate failed", z->path, m->name);
        size_t n = OUTBUF - m->zs.avail_out;
        if (n && (err = put_data(z, m->out, n)) < 0)
            return err;
        m->csize += n;
        if (zr == Z_STREAM_END)
            return 0;
    } while (m->zs.avail_out == 0 || (flush == Z_FINISH));
    return 0;
}

int ck_zipapp_write(struct ck_zipapp *z, const void *data, size_t len)
{
    struct ck_zipapp_member *m = &z->cur;
    const unsigned char *p = data;
    int err;
    if (!m->name)
        return ck_error(CK_EUSAGE, "'%s': no member is being written", z->path);
    if (len > m->size - m->done)
        return ck_error(CK_ESIZE, "'%s': member '%s': more than the %" PRIu64 " bytes declared",
                        z->path, m->name, m->size);
    /* Each piece's CRC is taken right before the kernel copies (or deflate
     * reads) it, while it is in cache. (A second thread for the CRC was
     * tried: on two cores it fought the writeback worker and made a 1 GiB
     * pack 0.4 to 1.5 s instead of a steady 0.4 s.) */
    while (len) {
        size_t n = len < PIECE ? len : PIECE;
        m->crc = ck_crc32_extend(m->crc, p, n);
        if (m->deflating) {
            m->zs.next_in = (Bytef *)(uintptr_t)p;
            m->zs.avail_in = (uInt)n;
            err = deflate_some(z, Z_NO_FLUSH);
        } else {
            err = put_data(z, p, n);
            m->csize += n;
        }
        if (err < 0)
            return err;
        m->done += n;
        p += n;
        len -= n;
    }
    return 0;
}

static void member_release(struct ck_zipapp_member *m)
{
    if (m->deflating)
        deflateEnd(&m->zs);
    free(m->out);
    free(m->name);
    memset(m, 0, sizeof(*m));
}

int ck_zipapp_end(struct ck_zipapp *z)
{
    struct ck_zipapp_member *m = &z->cur;
    struct ck_zipapp_entry *e = NULL;
    int err;
    if (!m->name)
        return ck_error(CK_EUSAGE, "'%s': no member is being written", z->path);
    if (m->done != m->size)
        return ck_error(CK_ECHANGED, "'%s': member '%s': %" PRIu64 " bytes of the %" PRIu64
                        " declared",
                        z->path, m->name, m->done, m->size);
    if (m->deflating && (err = deflate_some(z, Z_FINISH)) < 0)
        return err;
    if (!m->z64 && m->csize >= U32MAX)
        return ck_error(CK_ESIZE, "'%s': member '%s' deflated past 4 GiB", z->path, m->name);
    unsigned char h[LOCAL_MAX];
    size_t hl = local_header(z, h);
    if (ck_pwrite_all(z->fd, h, hl, m->local) < 0)
        return ck_error_os(CK_EIO, "cannot write '%s'", z->path);
    /* The central record: a zip64 extra for sizes or an offset past 4 GiB. */
    size_t nl = strlen(m->name);
    bool far = m->local >= U32MAX;
    unsigned char x[4 + 24];
    size_t xl = 0;
    if (m->z64 || far) {
        xl = 4;
        if (m->z64) {
            put(x + xl, m->size, 8);
            put(x + xl + 8, m->csize, 8);
            xl += 16;
        }
        if (far) {
            put(x + xl, m->local, 8);
            xl += 8;
        }
        put(x, 1, 2);
        put(x + 2, xl - 4, 2);
    }
    uint16_t ver = m->z64 || far ? 45 : 20;
    unsigned char r[46];
    put(r, SIG_CENTRAL, 4);
    put(r + 4, 3 << 8 | ver, 2); /* made by unix */
    put(r + 6, ver, 2);
    put(r + 8, FLAG_UTF8, 2);
    put(r + 10, m->level ? 8 : 0, 2);
    put(r + 12, z->dos_time, 4);
    put(r + 16, m->crc, 4);
    put(r + 20, m->z64 ? U32MAX : m->csize, 4);
    put(r + 24, m->z64 ? U32MAX : m->size, 4);
    put(r + 28, nl, 2);
    put(r + 30, xl, 2);
    put(r + 32, 0, 2);
    put(r + 34, 0, 2);
    put(r + 36, 0, 2);
    put(r + 38, (uint64_t)0100644 << 16, 4);
    put(r + 42, far ? U32MAX : m->local, 4);
    if ((err = add_entry(z, &e)) < 0)
        return err;
    e->name = m->name;
    m->name = NULL;
    e->method = m->level ? 8 : 0;
    e->crc = m->crc;
    e->csize = m->csize;
    e->usize = m->size;
    e->local = m->local;
    e->added = true;
    e->rec = z->cd.len;
    e->reclen = 46 + nl + xl;
    member_release(m);
    if ((err = ck_buf_append(&z->cd, r, 46)) < 0 ||
        (err = ck_buf_append(&z->cd, e->name, nl)) < 0 ||
        (xl && (err = ck_buf_append(&z->cd, x, xl)) < 0))
        return err;
    return 0;
}

int ck_zipapp_add(struct ck_zipapp *z, const char *name, const void *data, uint64_t len)
{
    int err;
    if ((err = ck_zipapp_begin(z, name, len, 0)) < 0 ||
        (err = ck_zipapp_write(z, data, (size_t)len)) < 0)
        return err;
    return ck_zipapp_end(z);
}

static int write_end(struct ck_zipapp *z)
{
    struct ck_buf out = CK_BUF_INIT;
    uint64_t count = 0;
    int err = 0;
    ck_buf_init(&out, (size_t)MAX_CD + 256);
    for (size_t i = 0; i < z->nents && err >= 0; i++)
        if (!z->ents[i].dropped) {
            err = ck_buf_append(&out, z->cd.data + z->ents[i].rec, z->ents[i].reclen);
            count++;
        }
    uint64_t cd_off = z->pos, cd_size = out.len;
    bool z64 = count >= U16MAX || cd_off >= U32MAX || cd_size >= U32MAX;
    unsigned char e[56 + 20 + 22];
    size_t el = 0;
    if (z64) {
        uint64_t at = cd_off + cd_size;
        put(e, SIG_EOCD64, 4);
        put(e + 4, 44, 8);
        put(e + 12, 3 << 8 | 45, 2);
        put(e + 14, 45, 2);
        put(e + 16, 0, 4);
        put(e + 20, 0, 4);
        put(e + 24, count, 8);
        put(e + 32, count, 8);
        put(e + 40, cd_size, 8);
        put(e + 48, cd_off, 8);
        put(e + 56, SIG_LOC64, 4);
        put(e + 60, 0, 4);
        put(e + 64, at, 8);
        put(e + 72, 1, 4);
        el = 76;
    }
    put(e + el, SIG_EOCD, 4);
    put(e + el + 4, 0, 4);
    put(e + el + 8, z64 ? U16MAX : count, 2);
    put(e + el + 10, z64 ? U16MAX : count, 2);
    put(e + el + 12, z64 ? U32MAX : cd_size, 4);
    put(e + el + 16, z64 ? U32MAX : cd_off, 4);
    put(e + el + 20, 0, 2);
    el += 22;
    if (err >= 0 && (err = ck_buf_append(&out, e, el)) >= 0) {
        if (ck_pwrite_all(z->fd, out.data, out.len, cd_off) < 0 ||
            ftruncate(z->fd, (off_t)(cd_off + out.len)) < 0)
            err = ck_error_os(CK_EIO, "cannot write '%s'", z->path);
    }
    ck_buf_release(&out);
    return err;
}

static void release(struct ck_zipapp *z)
{
    ck_writebehind_stop(&z->wb);
    if (z->fresh)
        ck_atomic_abort(&z->tmp);
    else if (z->fd >= 0)
        close(z->fd); /* also drops the lock */
    member_release(&z->cur);
    for (size_t i = 0; i < z->nents; i++)
        free(z->ents[i].name);
    free(z->ents);
    ck_buf_release(&z->cd);
    free(z->path);
    memset(z, 0, sizeof(*z));
    z->fd = z->lockfd = z->tmp.fd = -1;
}

int ck_zipapp_commit(struct ck_zipapp *z)
{
    int err;
    if (z->cur.name) {
        err = ck_error(CK_EUSAGE, "'%s': member '%s' was not finished", z->path, z->cur.name);
        goto fail;
    }
    if ((err = ensure_journal(z)) < 0 || (err = write_end(z)) < 0)
        goto fail;
    ck_writebehind_stop(&z->wb); /* its thread is done with the file: the fsync does the rest */
    if (z->fresh) {
        if (z->precommit && (err = z->precommit(z->tmp.tmp, z->precommit_arg)) < 0)
            goto fail;
        err = ck_atomic_commit(&z->tmp); /* fsync, rename, folder fsync */
        z->fresh = false;
        z->fd = -1;
        release(z);
        return err;
    }
    if (fsync(z->fd) < 0) {
        err = ck_error_os(CK_EIO, "cannot fsync '%s'", z->path);
        goto fail;
    }
    /* Durable: from here the journal would only undo a complete append. */
    err = ck_zipjournal_remove(z->path);
    z->journaled = false;
    release(z);
    return err;
fail:
    ck_zipapp_abort(z);
    return err;
}

void ck_zipapp_abort(struct ck_zipapp *z)
{
    if (!z->path)
        return;
    if (z->journaled && z->fd >= 0) {
        bool rolled;
        if (ck_zipjournal_recover(z->path, z->fd, &rolled) < 0)
            ck_error_clear(); /* the journal stays: the next open rolls back */
    }
    release(z);
}

/* ---- undo records (the sidecar's verification gate) ---- */

int ck_zipapp_snapshot(const char *archive, const char *undo)
{
    struct ck_zipapp z;
    int err;
    if (!ck_exists(archive))
        return ck_write_file_atomic(undo, "", 0, 0600);
    if ((err = ck_zipapp_open(&z, archive)) < 0)
        return err;
    uint64_t tl = z.old_len - z.start;
    unsigned char *tail = malloc(tl ? (size_t)tl : 1);
    if (!tail)
        err = ck_error(CK_ENOMEM, "'%s': out of memory", archive);
    else if (ck_pread_all(z.fd, tail, tl, z.start) < 0)
        err = ck_error_os(CK_EIO, "cannot read '%s'", archive);
    else
        err = ck_zipjournal_write_to(undo, archive, z.old_len, z.start, tail, tl);
    free(tail);
    ck_zipapp_abort(&z); /* nothing was written: releases the lock */
    return err;
}

static int read_undo(const char *undo, struct ck_buf *b)
{
    ck_buf_init(b, (size_t)CK_ZIPJOURNAL_MAX + 64);
    return ck_read_file(undo, (size_t)CK_ZIPJOURNAL_MAX + 64, b);
}

int ck_zipapp_undo_length(const char *undo, uint64_t *len)
{
    struct ck_buf b = CK_BUF_INIT;
    int err = read_undo(undo, &b);
    *len = 0;
    if (err >= 0 && b.len && (b.len < 16 || memcmp(b.data, "CKZJ", 4)))
        err = ck_error(CK_EFORMAT, "'%s': not an undo record", undo);
    if (err >= 0 && b.len)
        *len = get((const unsigned char *)b.data + 8, 8);
    ck_buf_release(&b);
    return err;
}

int ck_zipapp_restore(const char *archive, const char *undo)
{
    struct ck_buf b = CK_BUF_INIT;
    char jp[4096], dir[4096];
    struct stat st;
    int err;
    if ((err = read_undo(undo, &b)) < 0)
        goto out;
    ck_dirname(dir, sizeof dir, archive);
    if (b.len == 0) { /* the archive did not exist */
        if (unlink(archive) < 0 && errno != ENOENT)
            err = ck_error_os(CK_EIO, "cannot remove '%s'", archive);
        else
            err = ck_fsync_dir(dir);
        goto done;
    }
    if (b.len < 40 || memcmp(b.data, "CKZJ", 4)) {
        err = ck_error(CK_EFORMAT, "'%s': not an undo record; '%s' left alone", undo, archive);
        goto out;
    }
    uint64_t old_len = get((const unsigned char *)b.data + 8, 8);
    if (stat(archive, &st) < 0 || (uint64_t)st.st_size < old_len) {
        err = ck_error(CK_EFORMAT, "'%s': shorter than its undo record '%s'; left alone", archive,
                       undo);
        goto out;
    }
    if ((err = ck_zipjournal_path(archive, jp, sizeof jp)) < 0 ||
        (err = ck_write_file_atomic(jp, b.data, b.len, 0644)) < 0 ||
        (err = ck_zipjournal_recover_path(archive)) < 0)
        goto out;
done:
    if (err >= 0 && unlink(undo) < 0 && errno != ENOENT)
        err = ck_error_os(CK_EIO, "cannot remove '%s'", undo);
out:
    ck_buf_release(&b);
    return err;
}
