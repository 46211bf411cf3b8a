#include "common/hash.h"
#include "common/error.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
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

struct ck_hash_ctx {
    EVP_MD_CTX *md5, *sha;
    uint64_t size;
};

struct ck_hash_ctx *ck_hash_ctx_new(enum ck_hash_want want)
{
    struct ck_hash_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    if (want & CK_HASH_MD5) {
        c->md5 = EVP_MD_CTX_new();
        if (!c->md5 || !EVP_DigestInit_ex(c->md5, EVP_md5(), NULL))
            goto fail;
    }
    if (want & CK_HASH_SHA256) {
        c->sha = EVP_MD_CTX_new();
        if (!c->sha || !EVP_DigestInit_ex(c->sha, EVP_sha256(), NULL))
            goto fail;
    }
    return c;
fail:
    ck_hash_ctx_free(c);
    return NULL;
}

void ck_hash_ctx_update(struct ck_hash_ctx *c, const void *data, size_t len)
{
    if (c->md5)
        EVP_DigestUpdate(c->md5, data, len);
    if (c->sha)
        EVP_DigestUpdate(c->sha, data, len);
    c->size += len;
}

static void final_hex(EVP_MD_CTX *ctx, char *out)
{
    unsigned char bin[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx, bin, &n);
    ck_hex(out, bin, n);
}

void ck_hash_ctx_final(struct ck_hash_ctx *c, struct ck_digests *out)
{
    memset(out, 0, sizeof *out);
    if (c->md5)
        final_hex(c->md5, out->md5);
    if (c->sha)
        final_hex(c->sha, out->sha256);
    out->size = c->size;
}

void ck_hash_ctx_free(struct ck_hash_ctx *c)
{
    if (!c)
        return;
    EVP_MD_CTX_free(c->md5);
    EVP_MD_CTX_free(c->sha);
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
    EVP_MD_CTX *sha;
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

        EVP_DigestUpdate(r->sha, r->buf[slot], r->len[slot]);

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
    EVP_MD_CTX *md5 = NULL;

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
        md5 = EVP_MD_CTX_new();
        if (!md5 || !EVP_DigestInit_ex(md5, EVP_md5(), NULL)) {
            err = ck_error(CK_ENOMEM, "cannot set up md5");
            goto out;
        }
    }
    if (want & CK_HASH_SHA256) {
        r.sha = EVP_MD_CTX_new();
        if (!r.sha || !EVP_DigestInit_ex(r.sha, EVP_sha256(), NULL)) {
            err = ck_error(CK_ENOMEM, "cannot set up sha256");
            goto out;
        }
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
            EVP_DigestUpdate(md5, r.buf[slot], (size_t)n);
        if (r.sha && !threaded)
            EVP_DigestUpdate(r.sha, r.buf[slot], (size_t)n);
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
            final_hex(md5, out->md5);
        if (r.sha)
            final_hex(r.sha, out->sha256);
        if (st_out)
            *st_out = before;
    }
    EVP_MD_CTX_free(md5);
    EVP_MD_CTX_free(r.sha);
    for (int i = 0; i < SLOTS; i++)
        free(r.buf[i]);
    if (ring_ready) {
        pthread_mutex_destroy(&r.mu);
        pthread_cond_destroy(&r.cv);
    }
    close(fd);
    return err;
}
