#include "common/sign.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"

#include <errno.h>
#include <fcntl.h>
#include <nettle/eddsa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define PRIV_TAG "ed25519-private "
#define PUB_TAG "ed25519-public "

int ck_sign_generate(struct ck_sign_key *k)
{
    memset(k, 0, sizeof *k);
    size_t got = 0;
    while (got < CK_SIGN_KEY_SIZE) {
        ssize_t n = getrandom(k->priv + got, CK_SIGN_KEY_SIZE - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ck_error_os(CK_EIO, "cannot read random bytes for a key");
        got += (size_t)n;
    }
    ed25519_sha512_public_key(k->pub, k->priv);
    k->has_priv = true;
    return 0;
}

void ck_sign_key_wipe(struct ck_sign_key *k)
{
    explicit_bzero(k->priv, sizeof k->priv);
    k->has_priv = false;
}

/* Writes a temporary, fsyncs it, then link()s it to path: link fails when
 * path exists (never overwriting a key) and a crash leaves no torn key. */
static int write_exclusive(const char *path, const char *text, mode_t mode)
{
    struct ck_atomic_file f;
    int err = ck_atomic_open(&f, path, mode);
    if (err < 0)
        return err;
    if (fchmod(f.fd, mode) < 0) {
        err = ck_error_os(CK_EIO, "'%s': cannot set the mode", path);
        goto out;
    }
    if ((err = ck_atomic_write(&f, text, strlen(text))) < 0)
        goto out;
    if (fsync(f.fd) < 0) {
        err = ck_error_os(CK_EIO, "'%s': cannot fsync", path);
        goto out;
    }
    if (link(f.tmp, path) < 0) {
        err = errno == EEXIST ? ck_error(CK_EEXIST, "'%s' exists: not overwriting a key", path)
                              : ck_error_os(CK_EIO, "cannot create '%s'", path);
        goto out;
    }
    char dir[4096];
    ck_dirname(dir, sizeof dir, path);
    err = ck_fsync_dir(dir);
out:
    ck_atomic_abort(&f);
    return err;
}

int ck_sign_write_keys(const struct ck_sign_key *k, const char *path)
{
    char pubpath[4096];
    if (snprintf(pubpath, sizeof pubpath, "%s.pub", path) >= (int)sizeof pubpath)
        return ck_error(CK_ESIZE, "'%s': path too long", path);
    if (ck_exists(path))
        return ck_error(CK_EEXIST, "'%s' exists: not overwriting a key", path);
    if (ck_exists(pubpath))
        return ck_error(CK_EEXIST, "'%s' exists: not overwriting a key", pubpath);
    char line[128], hex[2 * CK_SIGN_KEY_SIZE + 1];
    ck_hex(hex, k->priv, CK_SIGN_KEY_SIZE);
    snprintf(line, sizeof line, PRIV_TAG "%s\n", hex);
    explicit_bzero(hex, sizeof hex);
    int err = write_exclusive(path, line, 0600);
    explicit_bzero(line, sizeof line);
    if (err < 0)
        return err;
    ck_hex(hex, k->pub, CK_SIGN_KEY_SIZE);
    snprintf(line, sizeof line, PUB_TAG "%s\n", hex);
    if ((err = write_exclusive(pubpath, line, 0644)) < 0)
        unlink(path);
    return err;
}

bool ck_sign_unhex(const char *hex, size_t hexlen, unsigned char *out, size_t n)
{
    if (hexlen != 2 * n)
        return false;
    for (size_t i = 0; i < n; i++) {
        int v = 0;
        for (int k = 0; k < 2; k++) {
            char c = hex[2 * i + (size_t)k];
            int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
            if (d < 0)
                return false;
            v = v * 16 + d;
        }
        out[i] = (unsigned char)v;
    }
    return true;
}

int ck_sign_load(const char *ref, struct ck_sign_key *k)
{
    memset(k, 0, sizeof *k);
    const char *path = strncmp(ref, "file:", 5) == 0 ? ref + 5 : ref;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(CK_ENOENT, "cannot open key '%s'", path);
    struct stat st;
    char text[256];
    ssize_t n = fstat(fd, &st) < 0 ? -1 : read(fd, text, sizeof text - 1);
    close(fd);
    if (n < 0)
        return ck_error_os(CK_EIO, "cannot read key '%s'", path);
    text[n] = '\0';
    size_t len = strcspn(text, "\n");
    int err = 0;
    if (strncmp(text, PRIV_TAG, strlen(PRIV_TAG)) == 0) {
        if (st.st_mode & 077)
            err = ck_error(CK_ECONFIG,
                           "'%s': a private key readable by others (mode %03o); "
                           "chmod 600 it",
                           path, (unsigned)(st.st_mode & 0777));
        else if (!ck_sign_unhex(text + strlen(PRIV_TAG), len - strlen(PRIV_TAG), k->priv,
                                CK_SIGN_KEY_SIZE))
            err = ck_error(CK_EFORMAT, "'%s': not an ed25519 private key file", path);
        else {
            ed25519_sha512_public_key(k->pub, k->priv);
            k->has_priv = true;
        }
    } else if (strncmp(text, PUB_TAG, strlen(PUB_TAG)) == 0) {
        if (!ck_sign_unhex(text + strlen(PUB_TAG), len - strlen(PUB_TAG), k->pub, CK_SIGN_KEY_SIZE))
            err = ck_error(CK_EFORMAT, "'%s': not an ed25519 public key file", path);
    } else {
        err = ck_error(CK_EFORMAT, "'%s': not an ed25519 key file (made by ckptd keygen)", path);
    }
    explicit_bzero(text, sizeof text);
    if (err < 0)
        ck_sign_key_wipe(k);
    return err;
}

void ck_sign(const struct ck_sign_key *k, const void *msg, size_t len,
             unsigned char sig[CK_SIGN_SIG_SIZE])
{
    ed25519_sha512_sign(k->pub, k->priv, len, msg, sig);
}

bool ck_sign_verify(const unsigned char pub[CK_SIGN_KEY_SIZE], const void *msg, size_t len,
                    const unsigned char sig[CK_SIGN_SIG_SIZE])
{
    return ed25519_sha512_verify(pub, len, msg, sig) == 1;
}
