#include "common/hash.h"
#include "common/error.h"

#include <errno.h>
#include <fcntl.h>
#include <nettle/md5.h>
#include <nettle/sha2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCK (1u << 20)  /* 1 MiB reads: large enough to amortise syscalls */
#define SLOTS 4           /* ring depth between the reader and the SHA-256 thread */

void ck_hex(char *out, const unsigned char *bin, size_t len)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[bin[i] >> 4];
        out[2 * i + 1] = digits[bin[i] & 15];
    }
    out[2 * len] = '\0';
}

/* Nettle, not OpenSSL: its contexts are plain structs (no allocation, no
 * provider lookup), and the library is small. Linking libcrypto only for
 * two digests cost the watcher about 3.5 MiB of resident memory. */
struct ck_hash_ctx {
    bool want_md5, want_sha;
    struct md5_ctx md5;
    struct sha256_ctx sha;
    uint64_t size;
};

struct ck_hash_ctx *ck_hash_ctx_new(enum ck_hash_want want)
{
    struct ck_hash_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->want_md5 = want & CK_HASH_MD5;
    c->want_sha = want & CK_HASH_SHA256;
    md5_init(&c->md5);
    sha256_init(&c->sha);
    return c;
}

void ck_hash_ctx_update(struct ck_hash_ctx *c, const void *data, size_t len)
{
    if (c->want_md5)
        md5_update(&c->md5, len, data);
    if (c->want_sha)
        sha256_update(&c->sha, len, data);
    c->size += len;
}

static void md5_hex(struct md5_ctx *ctx, char *out)
{
    uint8_t bin[MD5_DIGEST_SIZE];
    md5_digest(ctx, sizeof bin, bin);
    ck_hex(out, bin, sizeof bin);
}

static void sha256_hex(struct sha256_ctx *ctx, char *out)
{
    uint8_t bin[SHA256_DIGEST_SIZE];
    sha256_digest(ctx, sizeof bin, bin);
    ck_hex(out, bin, sizeof bin);
}

void ck_hash_ctx_final(struct ck_hash_ctx *c, struct ck_digests *out)
{
    memset(out, 0, sizeof *out);
    if (c->want_md5)
        md5_hex(&c->md5, out->md5);
    if (c->want_sha)
        sha256_hex(&c->sha, out->sha256);
    out->size = c->size;
}

void ck_hash_ctx_free(struct ck_hash_ctx *c)
{
    free(c);
}

/* The reader fills slots in order; the SHA-256 thread consumes them in the
 * same order. A slot is reused only after the SHA-256 thread released it. */
struct ring {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned char *buf[SLOTS];
    size_t len[SLOTS];
    uint64_t produced, consumed; /* block counts */
    bool done;                   /* no more blocks will come */
    struct sha256_ctx *sha;      /* NULL: SHA-256 not wanted */
};

static void *sha_thread(void *arg)
{
    struct ring *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        while (r->consumed == r->produced && !r->done)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->consumed == r->produced && r->done) {
            pthread_mutex_unlock(&r->mu);
            return NULL;
        }
        unsigned slot = (unsigned)(r->consumed % SLOTS);
        pthread_mutex_unlock(&r->mu);

        sha256_update(r->sha, r->len[slot], r->buf[slot]);

        pthread_mutex_lock(&r->mu);
        r->consumed++;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
}

static bool same_file_state(const struct stat *a, const struct stat *b)
{
    return a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
           a->st_mtim.tv_nsec == b->st_mtim.tv_nsec && a->st_ctim.tv_sec == b->st_ctim.tv_sec &&
           a->st_ctim.tv_nsec == b->st_ctim.tv_nsec && a->st_ino == b->st_ino;
}

static ssize_t read_full(int fd, unsigned char *p, size_t want)
{
    size_t got = 0;
    while (got < want) {
        ssize_t n = read(fd, p + got, want - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

int ck_hash_file(const char *path, enum ck_hash_want want, struct ck_digests *out,
                 struct stat *st_out)
{
    struct ring r;
    struct stat before, after;
    pthread_t tid;
    bool threaded = false, ring_ready = false;
    int err = 0;
    struct md5_ctx md5_state, *md5 = NULL;
    struct sha256_ctx sha_state;

    memset(out, 0, sizeof *out);
    memset(&r, 0, sizeof r);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT)
            return ck_error(CK_ECHANGED, "'%s' vanished before it was hashed", path);
        return ck_error_os(CK_EIO, "cannot open '%s'", path);
    }
    if (fstat(fd, &before) < 0) {
        err = ck_error_os(CK_EIO, "cannot stat '%s'", path);
        goto out;
    }
    /* read-ahead advice matters to a file of many reads, not to one read
     * (a syscall per file of a 100,000-file registration) */
    if (before.st_size > (off_t)BLOCK)
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    /* Small files (most configs, many checkpoints in tests and bursts): one
     * small buffer and no thread; the second core only pays off on big ones. */
    size_t block = before.st_size < (off_t)BLOCK ? (size_t)before.st_size + 1 : BLOCK;
    bool use_thread = (want & CK_HASH_SHA256) && (want & CK_HASH_MD5) &&
                      before.st_size >= (off_t)(2 * BLOCK);
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    ring_ready = true;
    for (int i = 0; i < SLOTS; i++) {
        r.buf[i] = malloc(block);
        if (!r.buf[i]) {
            err = ck_error(CK_ENOMEM, "out of memory hashing '%s'", path);
            goto out;
        }
    }
    if (want & CK_HASH_MD5) {
        md5 = &md5_state;
        md5_init(md5);
    }
    if (want & CK_HASH_SHA256) {
        r.sha = &sha_state;
        sha256_init(r.sha);
        if (use_thread) {
            if (pthread_create(&tid, NULL, sha_thread, &r) != 0) {
                err = ck_error(CK_ENOMEM, "cannot start the hashing thread");
                goto out;
            }
            threaded = true;
        }
    }

    for (;;) {
        pthread_mutex_lock(&r.mu);
        while (threaded && r.produced - r.consumed >= SLOTS)
            pthread_cond_wait(&r.cv, &r.mu);
        unsigned slot = (unsigned)(r.produced % SLOTS);
        pthread_mutex_unlock(&r.mu);

        ssize_t n = read_full(fd, r.buf[slot], block);
        if (n < 0) {
            err = ck_error_os(CK_EIO, "cannot read '%s'", path);
            break;
        }
        if (n == 0)
            break;
        out->size += (uint64_t)n;
        if (md5)
            md5_update(md5, (size_t)n, r.buf[slot]);
        if (r.sha && !threaded)
            sha256_update(r.sha, (size_t)n, r.buf[slot]);
        if (threaded) {
            pthread_mutex_lock(&r.mu);
            r.len[slot] = (size_t)n;
            r.produced++;
            pthread_cond_broadcast(&r.cv);
            pthread_mutex_unlock(&r.mu);
        }
        if ((size_t)n < block)
            break;
    }

out:
    if (threaded) {
        pthread_mutex_lock(&r.mu);
        r.done = true;
        pthread_cond_broadcast(&r.cv);
        pthread_mutex_unlock(&r.mu);
        pthread_join(tid, NULL);
    }
    if (err == 0) {
        if (fstat(fd, &after) < 0 || !same_file_state(&before, &after) ||
            out->size != (uint64_t)after.st_size) {
            err = ck_error(CK_ECHANGED, "'%s' changed while it was hashed", path);
        } else if (stat(path, &after) < 0 || after.st_ino != before.st_ino) {
            err = ck_error(CK_ECHANGED, "'%s' was replaced or removed while it was hashed", path);
        }
    }
    if (err == 0) {
        if (md5)
            md5_hex(md5, out->md5);
        if (r.sha)
            sha256_hex(r.sha, out->sha256);
        if (st_out)
            *st_out = before;
    }
    for (int i = 0; i < SLOTS; i++)
        free(r.buf[i]);
    if (ring_ready) {
        pthread_mutex_destroy(&r.mu);
        pthread_cond_destroy(&r.cv);
    }
    close(fd);
    return err;
}
