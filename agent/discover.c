#include "agent/discover.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/utf8.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DEPTH 32
#define MAX_FILES_PER_FOLDER 100000

/* ---- the walk ---- */

static bool in_tree(const char *rel)
{
    return !strncmp(rel, "data/checkpoints/", 17);
}

struct walk {
    const char *root;
    const struct ck_ckpt_rules *rules;
    struct ck_discovery *d;
    int err;
    bool shallow; /* ck_discover_dirs: the folders named, not the ones below them */
    bool (*known)(void *arg, const char *ref); /* folder checkpoints to leave out */
    void *known_arg;
};

static double mtime_of(const struct stat *st)
{
    return (double)st->st_mtim.tv_sec + st->st_mtim.tv_nsec / 1e9;
}

static int add_problem(struct walk *w, const char *rel, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int add_problem(struct walk *w, const char *rel, const char *fmt, ...)
{
    struct ck_discovery *d = w->d;
    char msg[1024], printable[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (d->nproblems == d->pcap) {
        size_t cap = d->pcap ? d->pcap * 2 : 8;
        void *p = realloc(d->problems, cap * sizeof *d->problems);
        if (!p)
            return ck_error(CK_ENOMEM, "out of memory");
        d->problems = p;
        d->pcap = cap;
    }
    ck_utf8_sanitize(printable, sizeof printable, rel);
    d->problems[d->nproblems].path = strdup(printable);
    d->problems[d->nproblems].msg = strdup(msg);
    d->nproblems++;
    return 0;
}

/* A new candidate with its name, path and captures; NULL on out of memory. */
static struct ck_candidate *new_cand(struct walk *w, enum ck_cand_kind kind, const char *ref,
                                     const char *rel, const struct ck_name_captures *cap)
{
    struct ck_discovery *d = w->d;
    if (d->ncands == d->cap) {
        size_t ncap = d->cap ? d->cap * 2 : 64;
        void *p = realloc(d->cands, ncap * sizeof *d->cands);
        if (!p)
            return NULL;
        d->cands = p;
        d->cap = ncap;
    }
    struct ck_candidate *c = &d->cands[d->ncands];
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->has_epoch = cap->has_epoch;
    c->epoch = cap->epoch;
    c->has_step = cap->has_step;
    c->step = cap->step;
    c->names = *cap;
    c->in_tree = in_tree(rel);
    c->ref = strdup(ref);
    c->rel = strdup(rel);
    if (!c->ref || !c->rel) {
        free(c->ref);
        free(c->rel);
        return NULL;
    }
    d->ncands++;
    return c;
}

/* 64-bit FNV-1a, then SplitMix64's finaliser: a sum of these over files
 * is order-free and changes with any field of any file. Not a defence
 * against a crafted tree, like the hash cache it stands beside (stat facts). */
static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t file_print(const struct ck_candidate *c, const char *rel, const struct stat *st)
{
    /* the name inside the checkpoint: a folder's path below it, else the file name */
    const char *name = c->kind == CK_CAND_DIR ? rel + strlen(c->rel) + 1 : ck_basename(rel);
    int64_t f[4] = {(int64_t)st->st_dev, (int64_t)st->st_ino, (int64_t)st->st_size,
                    ck_mtime_ns(st)};
    uint64_t h = mix(0xcbf29ce484222325ull, name, strlen(name) + 1);
    h = mix(h, f, sizeof f);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

static int cand_add_file(struct ck_candidate *c, const char *rel, const struct stat *st)
{
    c->fingerprint += file_print(c, rel, st);
    char **p = realloc(c->files, (c->nfiles + 1) * sizeof *p);
    if (!p)
        return ck_error(CK_ENOMEM, "out of memory");
    c->files = p;
    if (!(p[c->nfiles] = strdup(rel)))
        return ck_error(CK_ENOMEM, "out of memory");
    c->nfiles++;
    return 0;
}

/* Splits a TF bundle file name: returns the prefix length and fills shard
 * info, or 0 when the name is not a bundle part. */
static size_t tf_part(const char *name, bool *is_index, long *shard, long *nshards)
{
    size_t n = strlen(name);
    if (n > 6 && !strcmp(name + n - 6, ".index")) {
        *is_index = true;
        return n - 6;
    }
    const char *d = strstr(name, ".data-");
    if (!d)
        return 0;
    long a, b;
    int used = 0;
    if (sscanf(d, ".data-%5ld-of-%5ld%n", &a, &b, &used) == 2 && d[used] == '\0' &&
        strlen(d) == 20 && b > 0 && a < b) {
        *is_index = false;
        *shard = a;
        *nshards = b;
        return (size_t)(d - name);
    }
    return 0;
}

static struct ck_candidate *find_tfset(struct walk *w, const char *rel_prefix)
{
    for (size_t i = 0; i < w->d->ncands; i++) {
        struct ck_candidate *c = &w->d->cands[i];
        if (c->kind == CK_CAND_TFSET && !strcmp(c->rel, rel_prefix))
            return c;
    }
    return NULL;
}

static int take_file(struct walk *w, const char *rel, const char *name, const struct stat *st)
{
    struct ck_name_captures cap;
    bool is_index = false;
    long shard = 0, nshards = 0;
    size_t plen = tf_part(name, &is_index, &shard, &nshards);
    if (plen > 0) {
        char prefix[NAME_MAX + 1], rel_prefix[PATH_MAX];
        snprintf(prefix, sizeof prefix, "%.*s", (int)plen, name);
        snprintf(rel_prefix, sizeof rel_prefix, "%.*s", (int)(strlen(rel) - strlen(name) + plen),
                 rel);
        if (!ck_rules_match(w->rules, prefix, rel_prefix, false, &cap))
            return 0;
        if (!ck_utf8_is_valid(rel, strlen(rel)))
            return add_problem(w, rel, "name is not valid UTF-8: not registered");
        struct ck_candidate *c = find_tfset(w, rel_prefix);
        /* complete is decided once all parts are listed (see finish_tfsets) */
        if (!c && !(c = new_cand(w, CK_CAND_TFSET, prefix, rel_prefix, &cap)))
            return ck_error(CK_ENOMEM, "out of memory");
        if (mtime_of(st) > c->newest_mtime)
            c->newest_mtime = mtime_of(st);
        return cand_add_file(c, rel, st);
    }
    if (!ck_rules_match(w->rules, name, rel, false, &cap))
        return 0;
    if (!ck_utf8_is_valid(rel, strlen(rel)))
        return add_problem(w, rel, "name is not valid UTF-8: not registered");
    struct ck_candidate *c = new_cand(w, CK_CAND_FILE, name, rel, &cap);
    if (!c)
        return ck_error(CK_ENOMEM, "out of memory");
    c->complete = true;
    c->newest_mtime = mtime_of(st);
    return cand_add_file(c, rel, st);
}

/* A TF set is complete when its index and every one of its shards exist. */
static void finish_tfsets(struct ck_discovery *d)
{
    for (size_t i = 0; i < d->ncands; i++) {
        struct ck_candidate *c = &d->cands[i];
        if (c->kind != CK_CAND_TFSET)
            continue;
        bool index = false;
        long nshards = -1, seen = 0;
        bool consistent = true;
        for (size_t f = 0; f < c->nfiles; f++) {
            bool is_index;
            long shard, n;
            if (!tf_part(ck_basename(c->files[f]), &is_index, &shard, &n))
                continue;
            if (is_index) {
                index = true;
            } else {
                if (nshards >= 0 && n != nshards)
                    consistent = false;
                nshards = n;
                seen++;
            }
        }
        c->complete = index && consistent && nshards > 0 && seen == nshards;
    }
}

static int walk_dir(struct walk *w, int dfd, const char *rel, int depth);

/* Lists every regular file below a folder checkpoint. */
static int collect_folder(struct walk *w, struct ck_candidate *c, int dfd, const char *rel,
                          int depth, bool *marker, bool *broken)
{
    DIR *dir = fdopendir(dfd);
    if (!dir) {
        close(dfd);
        return add_problem(w, rel, "cannot list the folder: %s", strerror(errno));
    }
    struct dirent *e;
    int err = 0;
    while (err == 0 && (e = readdir(dir))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char sub[PATH_MAX];
        if (snprintf(sub, sizeof sub, "%s/%s", rel, e->d_name) >= (int)sizeof sub)
            continue;
        struct stat st;
        if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (depth == 0 && ck_rules_is_marker(w->rules, e->d_name))
            *marker = true;
        if (S_ISDIR(st.st_mode) && depth < MAX_DEPTH) {
            int fd = openat(dirfd(dir), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd >= 0)
                err = collect_folder(w, c, fd, sub, depth + 1, marker, broken);
        } else if (S_ISREG(st.st_mode)) {
            if (c->nfiles >= MAX_FILES_PER_FOLDER)
                return add_problem(w, rel, "more than %d files in one checkpoint folder",
                                   MAX_FILES_PER_FOLDER);
            if (!ck_utf8_is_valid(sub, strlen(sub))) {
                err = add_problem(w, sub, "name is not valid UTF-8: folder not registered");
                *broken = true; /* listing goes on: other problems are worth reporting */
                continue;
            }
            if (mtime_of(&st) > c->newest_mtime)
                c->newest_mtime = mtime_of(&st);
            err = cand_add_file(c, sub, &st);
        }
    }
    closedir(dir);
    return err;
}

/* DeepSpeed writes 'latest' (the tag of the newest save) once a save is
 * complete: the tag it names is whole, and so is every global_stepN folder
 * up to the step of a global_stepN tag it names (saved before it). */
static bool deepspeed_latest_names(int parent_fd, const char *name,
                                   const struct ck_name_captures *cap)
{
    char buf[256], *end;
    if (ck_read_small_at(parent_fd, "latest", true, buf, sizeof buf) < 0)
        return false;
    buf[strcspn(buf, "\r\n")] = '\0';
    if (!strcmp(buf, name))
        return true;
    if (!cap->has_step || strncmp(name, "global_step", 11) || strncmp(buf, "global_step", 11) ||
        buf[11] < '0' || buf[11] > '9')
        return false;
    errno = 0;
    long long step = strtoll(buf + 11, &end, 10);
    return errno == 0 && *end == '\0' && step >= cap->step;
}

/* Megatron-LM writes latest_checkpointed_iteration.txt (the iteration, or
 * "release") beside its iter_NNNNNNN folders once a save is complete: every
 * iteration up to the one it names is whole. */
static bool megatron_tracker_covers(int parent_fd, const struct ck_name_captures *cap)
{
    char buf[64], *end;
    if (!cap->has_step ||
        ck_read_small_at(parent_fd, CK_MEGATRON_TRACKER, true, buf, sizeof buf) < 0)
        return false;
    buf[strcspn(buf, "\r\n")] = '\0';
    if (buf[0] < '0' || buf[0] > '9')
        return false;
    errno = 0;
    long long it = strtoll(buf, &end, 10);
    return errno == 0 && *end == '\0' && it >= cap->step;
}

static int take_folder(struct walk *w, int parent_fd, const char *rel, const char *name,
                       bool *taken)
{
    struct ck_name_captures cap;
    *taken = false;
    if (!ck_rules_match(w->rules, name, rel, true, &cap))
        return 0;
    *taken = true;
    if (!ck_utf8_is_valid(rel, strlen(rel)))
        return add_problem(w, rel, "name is not valid UTF-8: not registered");
    if (w->known && w->known(w->known_arg, name))
        return 0;
    struct ck_candidate *c = new_cand(w, CK_CAND_DIR, name, rel, &cap);
    if (!c)
        return ck_error(CK_ENOMEM, "out of memory");
    int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return add_problem(w, rel, "cannot open the folder: %s", strerror(errno));
    bool marker = false, broken = false;
    int err = collect_folder(w, c, fd, rel, 0, &marker, &broken);
    if (c->in_tree)
        marker = true; /* our own copy is only made once the source was complete */
    c->complete = !broken && (marker || deepspeed_latest_names(parent_fd, name, &cap) ||
                              megatron_tracker_covers(parent_fd, &cap) ||
                              ((w->rules->folder_markers.n == 0 || w->rules->markers_optional) &&
                               c->nfiles > 0));
    return err;
}

static int take_symlink(struct walk *w, const char *rel, const char *name)
{
    struct ck_name_captures cap;
    if (!ck_rules_match(w->rules, name, rel, false, &cap) &&
        !ck_rules_match(w->rules, name, rel, true, &cap))
        return 0;
    char full[PATH_MAX], real[PATH_MAX], root[PATH_MAX];
    if (ck_path_join(full, sizeof full, w->root, rel) < 0 || !realpath(w->root, root))
        return 0;
    if (!realpath(full, real))
        return add_problem(w, rel, "symbolic link to nothing: not registered");
    size_t n = strlen(root);
    if (strncmp(real, root, n) != 0 || (real[n] != '/' && real[n] != '\0'))
        return add_problem(w, rel, "symbolic link pointing outside '%s' (to '%s'): not registered",
                           w->root, real);
    /* A link inside the tree: its target is found by the walk itself. */
    return 0;
}

static int walk_dir(struct walk *w, int dfd, const char *rel, int depth)
{
    DIR *dir = fdopendir(dfd);
    if (!dir) {
        close(dfd);
        return add_problem(w, rel[0] ? rel : ".", "cannot list the folder: %s", strerror(errno));
    }
    struct dirent *e;
    int err = 0;
    while (err == 0 && (e = readdir(dir))) {
        const char *name = e->d_name;
        if (!strcmp(name, ".") || !strcmp(name, ".."))
            continue;
        char sub[PATH_MAX];
        if (rel[0])
            snprintf(sub, sizeof sub, "%s/%s", rel, name);
        else
            snprintf(sub, sizeof sub, "%s", name);
        if (!strcmp(sub, ".ckptd") || !strcmp(sub, "data/initialisation"))
            continue;
        if (ck_rules_ignored(w->rules, name))
            continue;
        /* our own manifests next to checkpoint sets */
        if (in_tree(sub) && strlen(name) > 8 && !strcmp(name + strlen(name) - 8, ".md5sums"))
            continue;
        struct stat st;
        if (fstatat(dirfd(dir), name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            if (errno != ENOENT)
                err = add_problem(w, sub, "cannot stat: %s", strerror(errno));
            continue;
        }
        if (S_ISLNK(st.st_mode)) {
            err = take_symlink(w, sub, name);
        } else if (S_ISDIR(st.st_mode)) {
            bool taken;
            if ((err = take_folder(w, dirfd(dir), sub, name, &taken)) < 0 || taken)
                continue;
            if (depth >= MAX_DEPTH || w->shallow)
                continue;
            int fd = openat(dirfd(dir), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd < 0) {
                err = add_problem(w, sub, "cannot open the folder: %s", strerror(errno));
                continue;
            }
            err = walk_dir(w, fd, sub, depth + 1);
        } else if (S_ISREG(st.st_mode)) {
            err = take_file(w, sub, name, &st);
        }
    }
    closedir(dir);
    return err;
}

int ck_discover(const char *dir, const struct ck_ckpt_rules *rules, struct ck_discovery *out)
{
    struct walk w = {dir, rules, out, 0, false, NULL, NULL};
    memset(out, 0, sizeof *out);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(CK_EIO, "cannot open '%s'", dir);
    int err = walk_dir(&w, fd, "", 0);
    if (err < 0) {
        ck_discovery_release(out);
        return err;
    }
    finish_tfsets(out);
    return 0;
}

/* A folder named to ck_discover_dirs that is a folder checkpoint itself:
 * taken alone, as the walk of its parent would take it (*taken), without
 * listing its siblings. */
static int take_named_folder(struct walk *w, const char *rel, bool *taken)
{
    char parent_rel[PATH_MAX], parent[PATH_MAX];
    const char *name = ck_basename(rel);
    struct stat st;
    *taken = false;
    ck_dirname(parent_rel, sizeof parent_rel, rel);
    if (!strcmp(parent_rel, "."))
        parent_rel[0] = '\0';
    if (ck_path_join(parent, sizeof parent, w->root, parent_rel[0] ? parent_rel : ".") < 0)
        return 0; /* too long: the parent's walk says so */
    int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (pfd < 0)
        return 0;
    int err = 0;
    if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode) &&
        !ck_rules_ignored(w->rules, name))
        err = take_folder(w, pfd, rel, name, taken);
    close(pfd);
    return err;
}

int ck_discover_dirs(const char *dir, const struct ck_ckpt_rules *rules, char *const *subdirs,
                     size_t n, bool (*known)(void *arg, const char *ref), void *known_arg,
                     struct ck_discovery *out)
{
    struct walk w = {dir, rules, out, 0, true, known, known_arg};
    char path[PATH_MAX];
    int err = 0;
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < n && err == 0; i++) {
        const char *rel = subdirs[i];
        bool taken = false;
        if (rel[0] && (err = take_named_folder(&w, rel, &taken)) < 0)
            break;
        if (taken)
            continue;
        if ((err = ck_path_join(path, sizeof path, dir, rel[0] ? rel : ".")) < 0)
            break;
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            continue; /* gone meanwhile: nothing to take there */
        err = walk_dir(&w, fd, rel, 1);
    }
    if (err < 0) {
        ck_discovery_release(out);
        return err;
    }
    finish_tfsets(out);
    return 0;
}

void ck_discovery_release(struct ck_discovery *d)
{
    for (size_t i = 0; i < d->ncands; i++) {
        struct ck_candidate *c = &d->cands[i];
        free(c->ref);
        free(c->rel);
        for (size_t f = 0; f < c->nfiles; f++)
            free(c->files[f]);
        free(c->files);
    }
    free(d->cands);
    for (size_t i = 0; i < d->nproblems; i++) {
        free(d->problems[i].path);
        free(d->problems[i].msg);
    }
    free(d->problems);
    memset(d, 0, sizeof *d);
}
