/* file:///path: a mounted disk (NFS, a local volume). Copy to a temporary
 * name beside the final one while hashing what is read (the source's size
 * and mtime the same after as before), fsync, read the copy back and compare
 * its SHA-256, rename into place, fsync the folder. */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "stores/net.h"
#include "stores/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define COPY_BLOCK (1u << 20)

struct file_store {
    struct ck_store base;
    char root[4096];
};

static int file_check(const struct ck_store_spec *spec)
{
    const char *p = spec->url + 7; /* "file://" */
    if (*p != '/')
        return ck_error(CK_ECONFIG, "store '%s': a file URL is file:///absolute/path", spec->url);
    if (strchr(p, '?') || strchr(p, '%'))
        return ck_error(CK_ECONFIG, "store '%s': a file URL takes a plain path", spec->url);
    return 0;
}

static int file_open(struct ck_store **out, const struct ck_store_spec *spec, struct ck_net *net)
{
    struct file_store *s = calloc(1, sizeof *s);
    if (!s)
        return ck_error(CK_ENOMEM, "out of memory");
    snprintf(s->root, sizeof s->root, "%s", spec->url + 7);
    size_t l = strlen(s->root);
    while (l > 1 && s->root[l - 1] == '/')
        s->root[--l] = '\0';
    *out = &s->base;
    return 0;
}

static void file_free(struct ck_store *s)
{
    free(s);
}

static int copy(struct file_store *s, struct ck_xfer *x, int in, int out, const char *tmp,
                char *sha)
{
    struct ck_hash_ctx *hc = ck_hash_ctx_new(CK_HASH_SHA256);
    char *buf = malloc(COPY_BLOCK);
    int err = 0;
    uint64_t total = 0;
    if (!hc || !buf) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    for (;;) {
        if (ck_upload_ctl_expired(s->base.net->ctl)) {
            err = ck_error(CK_ENET, "'%s': stopped before it finished", x->key);
            goto out;
        }
        ssize_t n = read(in, buf, COPY_BLOCK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            err = ck_error_os(CK_EIO, "cannot read '%s'", x->path);
            goto out;
        }
        if (n == 0)
            break;
        if (!ck_net_throttle(s->base.net, (size_t)n)) {
            err = ck_error(CK_ENET, "'%s': stopped before it finished", x->key);
            goto out;
        }
        ck_hash_ctx_update(hc, buf, (size_t)n);
        if (ck_write_all(out, buf, (size_t)n) < 0 &&
            (err = ck_error_os(CK_EIO, "cannot write '%s'", tmp)) < 0)
            goto out;
        total += (uint64_t)n;
        atomic_fetch_add(&x->sent, (unsigned long long)n);
    }
    if (total != x->size) {
        err = ck_error(CK_ECHANGED, "'%s' has %llu bytes, %llu when it was queued", x->path,
                       (unsigned long long)total, (unsigned long long)x->size);
        goto out;
    }
    struct ck_digests d;
    ck_hash_ctx_final(hc, &d);
    memcpy(sha, d.sha256, 65);
out:
    ck_hash_ctx_free(hc);
    free(buf);
    return err;
}

static int file_put(struct ck_store *st, struct ck_xfer *x)
{
    struct file_store *s = (struct file_store *)st;
    char final[8192], dir[8192], tmp[8300], sha[65];
    struct ck_digests back;
    int err, in = -1, out = -1;
    if ((err = ck_store_join_key(final, sizeof final, s->root, x->key)) < 0)
        return err;
    if (s->root[0] == '/' && final[0] != '/') {
        memmove(final + 1, final, strlen(final) + 1);
        final[0] = '/';
    }
    ck_dirname(dir, sizeof dir, final);
    if ((err = ck_mkdirs(dir, 0755)) < 0)
        return err;
    x->same_bytes = false;
    /* a conditional write may race writers of other machines (a shared
     * NFS folder) whose job ids are the same: its temporary is unique */
    if (x->if_absent)
        snprintf(tmp, sizeof tmp, "%s/.%s.ckptd-%lld-XXXXXX.part", dir, ck_basename(final),
                 (long long)x->id);
    else
        snprintf(tmp, sizeof tmp, "%s/.%s.ckptd-%lld.part", dir, ck_basename(final),
                 (long long)x->id);
    if ((in = open(x->path, O_RDONLY | O_CLOEXEC)) < 0)
        return ck_error_os(CK_EIO, "cannot open '%s'", x->path);
    posix_fadvise(in, 0, 0, POSIX_FADV_SEQUENTIAL);
    out = x->if_absent ? mkostemps(tmp, 5, O_CLOEXEC)
                       : open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0 || (x->if_absent && fchmod(out, 0644) < 0)) {
        err = ck_error_os(CK_EIO, "cannot create '%s'", tmp);
        if (out < 0)
            tmp[0] = '\0';
        goto out;
    }
    struct stat before, after;
    if (fstat(in, &before) < 0) {
        err = ck_error_os(CK_EIO, "cannot stat '%s'", x->path);
        goto out;
    }
    if ((err = copy(s, x, in, out, tmp, sha)) < 0)
        goto out;
    /* a file written meanwhile would leave a copy of mixed bytes, its
     * read-back agreeing with the mix: never renamed into place */
    if (fstat(in, &after) < 0 || !ck_stat_unchanged(&before, &after)) {
        err = ck_error(CK_ECHANGED, "'%s' changed while it was uploaded", x->path);
        goto out;
    }
    ck_xfer_body_sent(x); /* the fsync and the read-back are its tail */
    if (fsync(out) < 0) {
        err = ck_error_os(CK_EIO, "cannot fsync '%s'", tmp);
        goto out;
    }
    close(out);
    out = -1;
    /* read the copy back: what is on the destination is what was read */
    if ((err = ck_hash_file(tmp, CK_HASH_SHA256, &back, NULL)) < 0)
        goto out;
    if (back.size != x->size || strcmp(back.sha256, sha) != 0) {
        err = ck_error(CK_EIO, "'%s': the copy at '%s' differs from what was written", x->key, tmp);
        goto out;
    }
    if (x->if_absent) {
        /* link(2) fails when the name is taken, atomically (NFS too) */
        if (link(tmp, final) < 0) {
            if (errno != EEXIST) {
                err = ck_error_os(CK_EIO, "cannot link '%s' to '%s'", tmp, final);
                goto out;
            }
            struct ck_digests there;
            x->same_bytes = ck_hash_file(final, CK_HASH_SHA256, &there, NULL) == 0 &&
                            there.size == x->size && strcmp(there.sha256, sha) == 0;
            ck_error_clear();
            err = ck_error(CK_EEXIST, "'%s': already exists: not overwritten%s", x->key,
                           x->same_bytes ? ", and it has the same bytes" : "");
            goto out;
        }
        unlink(tmp);
    } else if (rename(tmp, final) < 0) {
        err = ck_error_os(CK_EIO, "cannot rename '%s' to '%s'", tmp, final);
        goto out;
    }
    tmp[0] = '\0';
    if ((err = ck_fsync_dir(dir)) < 0)
        goto out;
    memcpy(x->sha256, sha, sizeof x->sha256);
    x->check = "read-back-sha256";
    x->parts_sent = 1;
out:
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    if (err < 0 && tmp[0])
        unlink(tmp);
    return err;
}

static int final_path(struct file_store *s, const char *key, char *out, size_t outsz)
{
    int err = ck_store_join_key(out, outsz, s->root, key);
    if (err == 0 && s->root[0] == '/' && out[0] != '/') {
        if (strlen(out) + 2 > outsz)
            return ck_error(CK_ESIZE, "'%s': path too long", key);
        memmove(out + 1, out, strlen(out) + 1);
        out[0] = '/';
    }
    return err;
}

/* Whether name is one of put's temporaries (".NAME.ckptd-ID[-XXXXXX].part"). */
static bool is_temporary(const char *name)
{
    size_t n = strlen(name);
    return name[0] == '.' && strstr(name, ".ckptd-") && n > 5 && !strcmp(name + n - 5, ".part");
}

/* The regular files under path (key: its name under the store's root), put's
 * temporaries left out, symbolic links not followed, 64 levels at most. */
static int walk(const char *path, const char *key, int depth, struct ck_remote_list *out)
{
    DIR *d = opendir(path);
    int err = 0;
    if (!d)
        return errno == ENOENT ? 0 : ck_error_os(CK_EIO, "cannot list '%s'", path);
    if (depth > 64) {
        closedir(d);
        return ck_error(CK_ESIZE, "'%s': folders more than 64 deep", path);
    }
    for (struct dirent *e; err == 0 && (errno = 0, e = readdir(d));) {
        char sub[8192], subkey[8192];
        struct stat st;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || is_temporary(e->d_name))
            continue;
        if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub ||
            snprintf(subkey, sizeof subkey, "%s%s%s", key, key[0] ? "/" : "", e->d_name) >=
                (int)sizeof subkey) {
            err = ck_error(CK_ESIZE, "'%s': path too long", path);
            break;
        }
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            if (errno != ENOENT) /* removed meanwhile: not there */
                err = ck_error_os(CK_EIO, "cannot stat '%s'", sub);
        } else if (S_ISDIR(st.st_mode)) {
            err = walk(sub, subkey, depth + 1, out);
        } else if (S_ISREG(st.st_mode)) {
            err = ck_remote_list_add(out, subkey, (int64_t)st.st_size, NULL);
        }
    }
    if (err == 0 && errno)
        err = ck_error_os(CK_EIO, "cannot list '%s'", path);
    closedir(d);
    return err;
}

/* The files under the folder prefix (a missing folder lists nothing). */
static int file_list(struct ck_store *st, const char *prefix, struct ck_remote_list *out)
{
    struct file_store *s = (struct file_store *)st;
    char path[8192], key[4096];
    int err;
    snprintf(key, sizeof key, "%s", prefix);
    size_t kl = strlen(key);
    while (kl && key[kl - 1] == '/')
        key[--kl] = '\0';
    if (kl && (err = final_path(s, key, path, sizeof path)) < 0)
        return err;
    if (!kl)
        snprintf(path, sizeof path, "%s", s->root);
    return walk(path, key, 0, out);
}

static int file_stat(struct ck_store *st, const char *key, struct ck_remote_obj *out)
{
    struct file_store *s = (struct file_store *)st;
    char path[8192];
    struct stat sb;
    int err = final_path(s, key, path, sizeof path);
    if (err < 0)
        return err;
    if (stat(path, &sb) < 0)
        return ck_error_os(errno == ENOENT ? CK_ENOENT : CK_EIO, "cannot stat '%s'", path);
    if (!S_ISREG(sb.st_mode))
        return ck_error(CK_ENOENT, "'%s' is not a file", path);
    out->size = (int64_t)sb.st_size;
    return 0;
}

static int file_get(struct ck_store *st, const char *key, int fd)
{
    struct file_store *s = (struct file_store *)st;
    char path[8192];
    int err = final_path(s, key, path, sizeof path), in;
    if (err < 0)
        return err;
    if ((in = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return ck_error_os(errno == ENOENT ? CK_ENOENT : CK_EIO, "cannot open '%s'", path);
    char *buf = malloc(COPY_BLOCK);
    if (!buf) {
        close(in);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    for (;;) {
        ssize_t n = read(in, buf, COPY_BLOCK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            err = ck_error_os(CK_EIO, "cannot read '%s'", path);
            break;
        }
        if (n == 0)
            break;
        if (ck_write_all(fd, buf, (size_t)n) < 0) {
            err = ck_error_os(CK_EIO, "cannot write the copy of '%s'", path);
            break;
        }
    }
    free(buf);
    close(in);
    return err;
}

static int file_del(struct ck_store *st, const char *key)
{
    struct file_store *s = (struct file_store *)st;
    char path[8192], dir[8192];
    int err = final_path(s, key, path, sizeof path);
    if (err < 0)
        return err;
    if (unlink(path) < 0 && errno != ENOENT)
        return ck_error_os(CK_EIO, "cannot remove '%s'", path);
    ck_dirname(dir, sizeof dir, path);
    ck_fsync_dir(dir);
    return 0;
}

const struct ck_store_ops ck_store_file = {
    .scheme = "file",
    .if_absent = true,
    .check = file_check,
    .open = file_open,
    .put = file_put,
    .list = file_list,
    .stat = file_stat,
    .get = file_get,
    .del = file_del,
    .free = file_free,
};
