#include "agent/scan.h"
#include "agent/discover.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/yamlutil.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define METADATA_MAX (256u << 20)
#define PRODUCER "ckptd"

/* Names a training configuration file commonly has, most specific first. */
static const char *const config_names[] = {
    "config.yaml", "config.yml", "config.json", "hparams.yaml", "hparams.yml", "hparams.json",
    "config.py", "config.toml", "training_args.json", "train_config.yaml", "params.yaml",
    "args.json", "args.yaml",
};

#define FALLBACK_CONFIG "configuration.yaml"

struct scan {
    struct ck_state *st;
    const struct ck_scan_opts *o;
    struct ck_scan_result *res;
    struct ck_pmf_meta meta;
    double now;
    /* Lookups that would be quadratic over 10,000 checkpoints, kept sorted. */
    const struct ck_candidate **byref; /* candidates by reference, sources before our links */
    size_t nbyref;
    char **dirty_dirs;                 /* folders we linked into, fsynced once at the end */
    size_t ndirty;
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int path_in(struct scan *s, char *out, const char *rel)
{
    return ck_path_join(out, PATH_MAX, s->o->dir, rel);
}

/* md5 (and sha256) of a file, through the hash cache. */
static int hash_cached(struct scan *s, const char *path, struct ck_hash_entry *out, uint64_t *size)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return ck_error_os(errno == ENOENT ? CK_ECHANGED : CK_EIO, "cannot stat '%s'", path);
    if (size)
        *size = (uint64_t)st.st_size;
    if (ck_state_hash_lookup(s->st, &st, out) && out->sha256[0])
        return 0;
    struct ck_digests d;
    int err = ck_hash_file(path, CK_HASH_BOTH, &d, &st);
    if (err < 0)
        return err;
    ck_metrics_add(CK_M_BYTES_HASHED, d.size);
    memcpy(out->md5, d.md5, sizeof out->md5);
    memcpy(out->sha256, d.sha256, sizeof out->sha256);
    ck_debug("file.hashed", "path='%s' bytes=%llu md5=%s", path, (unsigned long long)d.size, d.md5);
    return ck_state_hash_store(s->st, &st, d.md5, d.sha256);
}

static int set_str(char **field, const char *v)
{
    char *p = v ? strdup(v) : NULL;
    if (v && !p)
        return ck_error(CK_ENOMEM, "out of memory");
    free(*field);
    *field = p;
    return 0;
}

/* ---- identity ---- */

static int model_identity(struct scan *s, bool fresh)
{
    struct ck_pmf_meta *m = &s->meta;
    int err;
    if (fresh) {
        if ((err = set_str(&m->producer_name, PRODUCER)) < 0 ||
            (err = set_str(&m->producer_version_format, "py_pa")) < 0)
            return err;
    }
    /* Keep another producer's identity; keep ours current. */
    if (!strcmp(m->producer_name, PRODUCER) &&
        (err = set_str(&m->producer_version, CKPTD_VERSION)) < 0)
        return err;

    if (s->o->cfg->model_name) {
        if ((err = set_str(&m->name, s->o->cfg->model_name)) < 0)
            return err;
    } else if (fresh) {
        char real[PATH_MAX];
        const char *base = realpath(s->o->dir, real) ? ck_basename(real) : ck_basename(s->o->dir);
        if ((err = set_str(&m->name, base[0] ? base : "model")) < 0)
            return err;
    }

    char *id = NULL;
    if ((err = ck_state_get(s->st, "model_id", &id)) < 0)
        return err;
    if (m->id) {
        /* metadata.yaml is the authority; the state keeps a copy in case it is deleted */
        if (!id || strcmp(id, m->id))
            err = ck_state_set(s->st, "model_id", m->id);
    } else if (id) {
        err = set_str(&m->id, id);
    } else {
        unsigned char rnd[16];
        char hex[33];
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
            free(id);
            return ck_error_os(CK_EIO, "cannot generate a model id");
        }
        ck_hex(hex, rnd, sizeof rnd);
        if ((err = set_str(&m->id, hex)) == 0)
            err = ck_state_set(s->st, "model_id", hex);
    }
    free(id);
    snprintf(s->res->model_id, sizeof s->res->model_id, "%s", m->id ? m->id : "");
    snprintf(s->res->model_name, sizeof s->res->model_name, "%s", m->name ? m->name : "");
    return err;
}

/* ---- the training configuration file ---- */

static int write_fallback_config(struct scan *s, char *path)
{
    static const char text[] =
        "# Written by ckptd: no training configuration file was found in this folder.\n"
        "# Name it with model.configuration in ckptd.yaml, or save one as config.yaml.\n"
        "producer: ckptd\n";
    if (ck_exists(path))
        return 0;
    return ck_write_file_atomic(path, text, sizeof text - 1, 0644);
}

/* The real configuration appeared after ours stood in for it: ours goes,
 * unless someone edited it (then it is theirs). */
static void remove_fallback_config(struct scan *s)
{
    char path[PATH_MAX];
    struct ck_buf b = CK_BUF_INIT;
    if (path_in(s, path, FALLBACK_CONFIG) == 0 && ck_read_file(path, 4096, &b) == 0 &&
        strstr(ck_buf_str(&b), "# Written by ckptd: no training configuration") == ck_buf_str(&b))
        unlink(path);
    ck_buf_release(&b);
}

static int configuration(struct scan *s)
{
    struct ck_pmf_meta *m = &s->meta;
    const struct ck_config *cfg = s->o->cfg;
    char src[PATH_MAX], dst[PATH_MAX];
    const char *name = NULL;
    int err;

    if (cfg->model_configuration) {
        if (cfg->model_configuration[0] == '/')
            snprintf(src, sizeof src, "%s", cfg->model_configuration);
        else if ((err = path_in(s, src, cfg->model_configuration)) < 0)
            return err;
        if (!ck_exists(src))
            return ck_error(CK_ECONFIG, "model.configuration: '%s' does not exist", src);
        name = ck_basename(src);
        if ((err = path_in(s, dst, name)) < 0)
            return err;
        /* PMF wants the configuration at the top of the tree. */
        if ((err = ck_place_file(src, dst)) < 0)
            return ck_error_wrap(err, "model.configuration");
    } else {
        for (size_t i = 0; i < sizeof config_names / sizeof *config_names && !name; i++) {
            if ((err = path_in(s, dst, config_names[i])) < 0)
                return err;
            if (ck_exists(dst))
                name = config_names[i];
        }
        if (!name && m->config_path && strcmp(m->config_path, FALLBACK_CONFIG) &&
            path_in(s, dst, m->config_path) == 0 && ck_exists(dst))
            name = m->config_path; /* someone named it in metadata.yaml: keep it */
        if (!name) {
            name = FALLBACK_CONFIG;
            if ((err = path_in(s, dst, name)) < 0 || (err = write_fallback_config(s, dst)) < 0)
                return err;
        }
    }
    struct ck_hash_entry h;
    if ((err = hash_cached(s, dst, &h, NULL)) < 0)
        return err;
    if (!m->config_path || strcmp(m->config_path, name) || strcmp(m->config_md5, h.md5)) {
        if (m->config_path)
            ck_info("configuration.changed", "path=%s md5=%s", name, h.md5);
        if (m->config_path && !strcmp(m->config_path, FALLBACK_CONFIG) && strcmp(name, FALLBACK_CONFIG))
            remove_fallback_config(s);
        if ((err = set_str(&m->config_path, name)) < 0)
            return err;
        memcpy(m->config_md5, h.md5, 33);
    }
    return 0;
}

/* ---- initialisation ---- */

static int copy_tree(const char *src, const char *dst, int depth, bool skip_checkpoints);

static int init_file(struct scan *s)
{
    const struct ck_config *cfg = s->o->cfg;
    char src[PATH_MAX], dst[PATH_MAX], rel[PATH_MAX];
    int err;
    if (cfg->init_path[0] == '/')
        snprintf(src, sizeof src, "%s", cfg->init_path);
    else if ((err = path_in(s, src, cfg->init_path)) < 0)
        return err;
    if (!ck_exists(src))
        return ck_error(CK_ECONFIG, "model.initialisation: '%s' does not exist", src);
    snprintf(rel, sizeof rel, "data/initialisation/%s", ck_basename(src));
    if ((err = path_in(s, dst, rel)) < 0 || (err = ck_place_file(src, dst)) < 0)
        return err;
    struct ck_hash_entry h;
    if ((err = hash_cached(s, dst, &h, NULL)) < 0)
        return err;
    struct ck_pmf_init *in = &s->meta.init;
    if (in->kind == CK_PMF_INIT_FILE && in->path && !strcmp(in->path, rel) &&
        !strcmp(in->md5, h.md5))
        return 0;
    free(in->name);
    free(in->path);
    free(in->id);
    ck_pmf_ref_release(&in->checkpoint);
    memset(in, 0, sizeof *in);
    in->kind = CK_PMF_INIT_FILE;
    memcpy(in->md5, h.md5, 33);
    if ((err = set_str(&in->path, rel)) < 0)
        return err;
    return set_str(&in->name, cfg->init_name ? cfg->init_name : ck_basename(src));
}

static int read_meta(const char *path, struct ck_pmf_meta *m)
{
    struct ck_buf b = CK_BUF_INIT;
    int err = ck_read_file(path, METADATA_MAX, &b);
    if (err == 0)
        err = ck_pmf_parse(m, path, ck_buf_str(&b), b.len);
    ck_buf_release(&b);
    return err;
}

static int init_pmf(struct scan *s)
{
    const struct ck_config *cfg = s->o->cfg;
    char src[PATH_MAX], meta_path[PATH_MAX], dst[PATH_MAX];
    struct ck_pmf_meta other;
    int err;
    if (cfg->init_path[0] == '/')
        snprintf(src, sizeof src, "%s", cfg->init_path);
    else if ((err = path_in(s, src, cfg->init_path)) < 0)
        return err;
    if ((err = ck_path_join(meta_path, sizeof meta_path, src, "metadata.yaml")) < 0)
        return err;
    if ((err = read_meta(meta_path, &other)) < 0)
        return ck_error_wrap(CK_ECONFIG, "model.initialisation.pmf");
    /* The reference must exist in that tree, with the type it has there. */
    struct ck_pmf_ref ref = {false, 0, cfg->init_checkpoint};
    ptrdiff_t at = ck_pmf_find(&other, &ref);
    if (at < 0) {
        char *end;
        long long v = strtoll(cfg->init_checkpoint, &end, 10);
        struct ck_pmf_ref iref = {true, v, NULL};
        if (!*end && cfg->init_checkpoint[0])
            at = ck_pmf_find(&other, &iref);
    }
    if (at < 0) {
        ck_pmf_meta_release(&other);
        return ck_error(CK_ECONFIG, "model.initialisation: checkpoint '%s' is not in '%s'",
                        cfg->init_checkpoint, meta_path);
    }
    struct ck_pmf_init *in = &s->meta.init;
    struct ck_pmf_init fresh = {0};
    fresh.kind = CK_PMF_INIT_PMF;
    if ((err = ck_pmf_ref_copy(&fresh.checkpoint, &other.checkpoints[at].ref)) < 0 ||
        (err = set_str(&fresh.id, other.id)) < 0 || (err = set_str(&fresh.path, "data/initialisation")) < 0 ||
        (err = set_str(&fresh.name, cfg->init_name ? cfg->init_name : other.name)) < 0) {
        ck_pmf_meta_release(&other);
        return err;
    }
    ck_pmf_meta_release(&other);
    if ((err = path_in(s, dst, "data/initialisation")) < 0 ||
        (err = copy_tree(src, dst, 0, true)) < 0) {
        free(fresh.name), free(fresh.path), free(fresh.id), ck_pmf_ref_release(&fresh.checkpoint);
        return err;
    }
    free(in->name), free(in->path), free(in->id), ck_pmf_ref_release(&in->checkpoint);
    *in = fresh;
    return 0;
}

/* Links a PMF tree into dst, without its data/checkpoints (PMF's rule for an
 * initialisation tree). */
static int copy_tree(const char *src, const char *dst, int depth, bool skip_checkpoints)
{
    int err = ck_mkdirs(dst, 0755);
    if (err < 0)
        return err;
    if (depth > 16)
        return ck_error(CK_ESIZE, "'%s' is nested too deep", src);
    DIR *d = opendir(src);
    if (!d)
        return ck_error_os(CK_EIO, "cannot list '%s'", src);
    struct dirent *e;
    while (err == 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, ".ckptd"))
            continue;
        char a[PATH_MAX], b[PATH_MAX];
        struct stat st;
        if ((err = ck_path_join(a, sizeof a, src, e->d_name)) < 0 ||
            (err = ck_path_join(b, sizeof b, dst, e->d_name)) < 0)
            break;
        if (lstat(a, &st) < 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            bool is_ckpts = skip_checkpoints && depth == 1 && !strcmp(e->d_name, "checkpoints");
            if (!is_ckpts)
                err = copy_tree(a, b, depth + 1, skip_checkpoints);
        } else if (S_ISREG(st.st_mode)) {
            err = ck_place_file(a, b);
        }
    }
    closedir(d);
    return err;
}

/* ---- checkpoints ---- */

static int cmp_cands(const void *a, const void *b)
{
    const struct ck_candidate *x = *(const struct ck_candidate *const *)a;
    const struct ck_candidate *y = *(const struct ck_candidate *const *)b;
    int64_t ex = x->has_epoch ? x->epoch : x->step, ey = y->has_epoch ? y->epoch : y->step;
    if (ex != ey)
        return ex < ey ? -1 : 1;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    if (x->newest_mtime != y->newest_mtime)
        return x->newest_mtime < y->newest_mtime ? -1 : 1;
    return strcmp(x->ref, y->ref);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Where a candidate's files go in the tree (relative to DIR). */
static int tree_rel(const struct ck_candidate *c, const char *file, char *out, size_t outsz)
{
    int n;
    if (c->kind == CK_CAND_DIR)
        n = snprintf(out, outsz, "data/checkpoints/%s%s", c->ref, file + strlen(c->rel));
    else
        n = snprintf(out, outsz, "data/checkpoints/%s", ck_basename(file));
    return n < 0 || (size_t)n >= outsz ? ck_error(CK_ESIZE, "path too long: '%s'", file) : 0;
}

static int mark_dirty(struct scan *s, const char *dir)
{
    for (size_t i = s->ndirty; i > 0; i--)
        if (!strcmp(s->dirty_dirs[i - 1], dir))
            return 0;
    char **p = realloc(s->dirty_dirs, (s->ndirty + 1) * sizeof *p);
    if (!p)
        return ck_error(CK_ENOMEM, "out of memory");
    s->dirty_dirs = p;
    if (!(p[s->ndirty] = strdup(dir)))
        return ck_error(CK_ENOMEM, "out of memory");
    s->ndirty++;
    return 0;
}

/* Hard-links (or reflinks, or copies) the candidate's files into data/checkpoints. */
static int place(struct scan *s, const struct ck_candidate *c)
{
    char src[PATH_MAX], rel[PATH_MAX], dst[PATH_MAX], dir[PATH_MAX];
    int err;
    if (c->in_tree)
        return 0;
    for (size_t i = 0; i < c->nfiles; i++) {
        if ((err = path_in(s, src, c->files[i])) < 0 ||
            (err = tree_rel(c, c->files[i], rel, sizeof rel)) < 0 || (err = path_in(s, dst, rel)) < 0)
            return err;
        ck_dirname(dir, sizeof dir, dst);
        if ((err = ck_mkdirs(dir, 0755)) < 0 || (err = ck_place_file_nosync(src, dst)) < 0 ||
            (err = mark_dirty(s, dir)) < 0)
            return err;
    }
    return 0;
}

static int sync_dirty(struct scan *s)
{
    int err = 0;
    for (size_t i = 0; i < s->ndirty; i++) {
        if (err == 0)
            err = ck_fsync_dir(s->dirty_dirs[i]);
        free(s->dirty_dirs[i]);
    }
    free(s->dirty_dirs);
    s->dirty_dirs = NULL;
    s->ndirty = 0;
    return err;
}

/* Hashes a candidate as placed in the tree. A single file is its own PMF
 * path; a set or a folder gets a manifest "<ref>.md5sums" (the format of
 * md5sum, so `md5sum -c` checks it from data/checkpoints) and the manifest
 * is the PMF path: PMF wants one file and its MD5. */
static int hash_candidate(struct scan *s, const struct ck_candidate *c, char *pmf_rel,
                          struct ck_hash_entry *h, uint64_t *total)
{
    char rel[PATH_MAX], path[PATH_MAX];
    int err;
    *total = 0;
    if (c->kind == CK_CAND_FILE) {
        if ((err = tree_rel(c, c->files[0], pmf_rel, PATH_MAX)) < 0 ||
            (err = path_in(s, path, pmf_rel)) < 0)
            return err;
        return hash_cached(s, path, h, total);
    }
    char **sorted = malloc(c->nfiles * sizeof *sorted);
    if (!sorted)
        return ck_error(CK_ENOMEM, "out of memory");
    memcpy(sorted, c->files, c->nfiles * sizeof *sorted);
    qsort(sorted, c->nfiles, sizeof *sorted, cmp_str);
    struct ck_buf manifest = CK_BUF_INIT;
    err = 0;
    for (size_t i = 0; i < c->nfiles && err == 0; i++) {
        struct ck_hash_entry fh;
        uint64_t size;
        if ((err = tree_rel(c, sorted[i], rel, sizeof rel)) < 0 || (err = path_in(s, path, rel)) < 0 ||
            (err = hash_cached(s, path, &fh, &size)) < 0)
            break;
        *total += size;
        err = ck_buf_printf(&manifest, "%s  %s\n", fh.md5, rel + strlen("data/checkpoints/"));
    }
    free(sorted);
    if (err == 0) {
        snprintf(pmf_rel, PATH_MAX, "data/checkpoints/%s.md5sums", c->ref);
        struct ck_buf old = CK_BUF_INIT;
        if ((err = path_in(s, path, pmf_rel)) == 0 &&
            (ck_read_file(path, 64u << 20, &old) < 0 || old.len != manifest.len ||
             memcmp(ck_buf_str(&old), ck_buf_str(&manifest), old.len)))
            err = ck_write_file_atomic(path, ck_buf_str(&manifest), manifest.len, 0644);
        ck_buf_release(&old);
        if (err == 0)
            err = hash_cached(s, path, h, NULL);
    }
    ck_buf_release(&manifest);
    return err;
}

static int record(struct scan *s, const struct ck_candidate *c, const char *pmf_rel,
                  const struct ck_hash_entry *h, uint64_t total)
{
    struct ck_ckpt_record r;
    memset(&r, 0, sizeof r);
    snprintf(r.ref, sizeof r.ref, "%s", c->ref);
    snprintf(r.source, sizeof r.source, "%s", c->rel);
    snprintf(r.tree_path, sizeof r.tree_path, "%s", pmf_rel);
    snprintf(r.sha256, sizeof r.sha256, "%s", h->sha256);
    r.size = total;
    r.nfiles = (int)c->nfiles;
    return ck_state_ckpt_put(s->st, &r);
}

static int add_registered(struct ck_scan_result *res, const char *ref)
{
    char **p = realloc(res->registered, (res->nregistered + 1) * sizeof *p);
    if (!p)
        return ck_error(CK_ENOMEM, "out of memory");
    res->registered = p;
    if (!(p[res->nregistered] = strdup(ref)))
        return ck_error(CK_ENOMEM, "out of memory");
    res->nregistered++;
    return 0;
}

static void problem(struct scan *s, const char *rel, const char *msg)
{
    ck_err("checkpoint.problem", "path='%s': %s", rel, msg);
    s->res->problems++;
    ck_metrics_add(CK_M_FAILURES_SCAN, 1);
}

/* A registered checkpoint: has its content changed, or was it deleted? */
static int recheck(struct scan *s, size_t idx, const struct ck_candidate *c)
{
    struct ck_pmf_checkpoint *cp = &s->meta.checkpoints[idx];
    char pmf_rel[PATH_MAX];
    struct ck_hash_entry h;
    uint64_t total;
    int err = hash_candidate(s, c, pmf_rel, &h, &total);
    if (err == CK_ECHANGED) {
        ck_warn("checkpoint.changing", "ref='%s': %s", c->ref, ck_error_msg());
        s->res->waiting++;
        return 0;
    }
    if (err < 0)
        return err;
    if (strcmp(cp->md5, h.md5) || strcmp(cp->path, pmf_rel)) {
        ck_warn("checkpoint.changed", "ref='%s' changed after it was registered: md5 %s -> %s",
                c->ref, cp->md5, h.md5);
        memcpy(cp->md5, h.md5, 33);
        if ((err = set_str(&cp->path, pmf_rel)) < 0)
            return err;
        s->res->updated++;
        return record(s, c, pmf_rel, &h, total);
    }
    return 0;
}

/* Sources sort before our own links to them, so the first of a name is the one to take. */
static int cmp_byref(const void *a, const void *b)
{
    const struct ck_candidate *x = *(const struct ck_candidate *const *)a;
    const struct ck_candidate *y = *(const struct ck_candidate *const *)b;
    int c = strcmp(x->ref, y->ref);
    return c ? c : (int)x->in_tree - (int)y->in_tree;
}

static int index_candidates(struct scan *s, const struct ck_discovery *d)
{
    s->byref = malloc((d->ncands ? d->ncands : 1) * sizeof *s->byref);
    if (!s->byref)
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < d->ncands; i++)
        s->byref[i] = &d->cands[i];
    s->nbyref = d->ncands;
    qsort(s->byref, s->nbyref, sizeof *s->byref, cmp_byref);
    return 0;
}

static const struct ck_candidate *find_cand(struct scan *s, const char *ref)
{
    size_t lo = 0, hi = s->nbyref;
    while (lo < hi) { /* the first candidate whose ref is >= ref */
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(s->byref[mid]->ref, ref) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->nbyref && !strcmp(s->byref[lo]->ref, ref) ? s->byref[lo] : NULL;
}

/* A sorted list of strings, for membership tests. */
struct strset {
    char **v;
    size_t n;
};

static int strset_build(struct strset *set, const struct ck_pmf_meta *m, bool basenames)
{
    set->n = 0;
    set->v = malloc((m->ncheckpoints ? m->ncheckpoints : 1) * sizeof *set->v);
    if (!set->v)
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < m->ncheckpoints; i++) {
        char txt[64];
        const char *v = basenames ? ck_basename(m->checkpoints[i].path)
                                  : ck_pmf_ref_str(&m->checkpoints[i].ref, txt, sizeof txt);
        if (!(set->v[set->n] = strdup(v)))
            return ck_error(CK_ENOMEM, "out of memory");
        set->n++;
    }
    qsort(set->v, set->n, sizeof *set->v, cmp_str);
    return 0;
}

static bool strset_has(const struct strset *set, const char *v)
{
    return bsearch(&v, set->v, set->n, sizeof *set->v, cmp_str) != NULL;
}

static void strset_release(struct strset *set)
{
    for (size_t i = 0; i < set->n; i++)
        free(set->v[i]);
    free(set->v);
    set->v = NULL;
    set->n = 0;
}

static void remove_tree_copy(struct scan *s, const struct ck_ckpt_record *r)
{
    char path[PATH_MAX];
    if (path_in(s, path, r->tree_path) == 0)
        unlink(path);
}

static int registered_pass(struct scan *s)
{
    char txt[64];
    int err;
    for (size_t i = 0; i < s->meta.ncheckpoints; i++) {
        const struct ck_pmf_ref *ref = &s->meta.checkpoints[i].ref;
        const char *name = ck_pmf_ref_str(ref, txt, sizeof txt);
        const struct ck_candidate *c = find_cand(s, name);
        struct ck_ckpt_record r;
        bool have_record = s->o->cfg->mirror_deletes && ck_state_ckpt_get(s->st, name, &r) == 0;
        bool source_gone = false;
        if (have_record) {
            char src[PATH_MAX];
            source_gone = strncmp(r.source, "data/checkpoints/", 17) &&
                          path_in(s, src, r.source) == 0 && !ck_exists(src);
        }
        if (s->o->cfg->mirror_deletes && (source_gone || !c)) {
            ck_info("checkpoint.unregistered", "ref='%s': the training job deleted it", name);
            if (have_record) {
                remove_tree_copy(s, &r);
                ck_state_ckpt_delete(s->st, name);
            }
            if ((err = ck_pmf_unregister(&s->meta, i)) < 0)
                return err;
            s->res->removed++;
            i--;
            continue;
        }
        if (c && (err = recheck(s, i, c)) < 0)
            problem(s, c->rel, ck_error_msg());
    }
    return 0;
}

/* Whether the file this candidate would become in the tree is already the
 * path of a registered checkpoint. PMF compares file names only. */
static bool path_registered(const struct strset *paths, const struct ck_candidate *c)
{
    char rel[PATH_MAX];
    if (c->kind != CK_CAND_FILE || tree_rel(c, c->files[0], rel, sizeof rel) < 0)
        return false;
    return strset_has(paths, ck_basename(rel));
}

static int new_pass(struct scan *s, const struct ck_discovery *d)
{
    double min_age = s->o->min_age >= 0 ? s->o->min_age : s->o->cfg->min_age;
    const struct ck_candidate **todo = calloc(d->ncands ? d->ncands : 1, sizeof *todo);
    struct strset refs = {0}, paths = {0};
    size_t n = 0;
    char txt[64];
    int err = 0;
    if (!todo)
        return ck_error(CK_ENOMEM, "out of memory");
    /* references as text: a file named "12" is the registered int 12 as well as "12" */
    if ((err = strset_build(&refs, &s->meta, false)) < 0 ||
        (err = strset_build(&paths, &s->meta, true)) < 0)
        goto out;
    for (size_t i = 0; i < s->nbyref; i++) {
        const struct ck_candidate *c = s->byref[i];
        if (i > 0 && !strcmp(s->byref[i - 1]->ref, c->ref)) {
            /* the same name twice: our own link (fine), or two sources (ambiguous) */
            if (!c->in_tree) {
                char msg[2048];
                snprintf(msg, sizeof msg, "two checkpoints are named '%s' ('%s' and '%s'): "
                         "only the first is registered", c->ref, s->byref[i - 1]->rel, c->rel);
                problem(s, c->rel, msg);
            }
            continue;
        }
        if (strset_has(&refs, c->ref))
            continue;
        if (path_registered(&paths, c))
            continue; /* already registered under another reference (a tree someone else wrote) */
        double age = now_seconds() - c->newest_mtime;
        bool take = s->o->admit ? s->o->admit(s->o->admit_arg, c) : c->complete && age >= min_age;
        if (!take) {
            ck_debug("checkpoint.waiting", "ref='%s' complete=%d age=%.3fs", c->ref, c->complete,
                     age);
            s->res->waiting++;
            continue;
        }
        todo[n++] = c;
    }
    qsort(todo, n, sizeof *todo, cmp_cands);
    for (size_t i = 0; i < n && err == 0; i++) {
        const struct ck_candidate *c = todo[i];
        char pmf_rel[PATH_MAX];
        struct ck_hash_entry h;
        uint64_t total;
        int e = place(s, c);
        if (e == 0)
            e = hash_candidate(s, c, pmf_rel, &h, &total);
        if (e == CK_ECHANGED) {
            ck_warn("checkpoint.changing", "ref='%s': %s; will retry", c->ref, ck_error_msg());
            s->res->waiting++;
            continue;
        }
        if (e < 0) {
            problem(s, c->rel, ck_error_msg());
            continue;
        }
        struct ck_pmf_ref ref = {false, 0, c->ref};
        int64_t epoch = ck_candidate_epoch(c, s->o->cfg->steps_per_epoch);
        if ((err = ck_pmf_register(&s->meta, &ref, epoch, pmf_rel, h.md5, s->now, 0)) == CK_ESTATE) {
            problem(s, c->rel, ck_error_msg());
            err = 0;
            continue;
        }
        if (err < 0)
            break;
        if ((err = record(s, c, pmf_rel, &h, total)) < 0 ||
            (err = add_registered(s->res, c->ref)) < 0)
            break;
        ck_metrics_add(CK_M_CHECKPOINTS_REGISTERED, 1);
        ck_info("checkpoint.registered", "ref='%s' epoch=%lld path=%s md5=%s bytes=%llu",
                ck_pmf_ref_str(&ref, txt, sizeof txt), (long long)epoch, pmf_rel, h.md5,
                (unsigned long long)total);
    }
    /* the links must be durable before metadata.yaml names them */
    if (err == 0)
        err = sync_dirty(s);
out:
    strset_release(&refs);
    strset_release(&paths);
    free(todo);
    return err;
}

/* ---- status ---- */

static int status_pass(struct scan *s)
{
    const struct ck_config *cfg = s->o->cfg;
    char path[PATH_MAX];
    int to = s->o->end_status;
    if (to < 0 && cfg->failed_marker && path_in(s, path, cfg->failed_marker) == 0 && ck_exists(path))
        to = CK_PMF_FAILED;
    if (to < 0 && cfg->finished_marker && path_in(s, path, cfg->finished_marker) == 0 &&
        ck_exists(path))
        to = CK_PMF_FINISHED;
    if (s->o->mark_running && s->meta.status == CK_PMF_PENDING) {
        int err = ck_pmf_set_status(&s->meta, CK_PMF_RUNNING, s->now);
        if (err < 0)
            return err;
    }
    if (to < 0 || s->meta.status == (enum ck_pmf_status)to)
        return 0;
    int err = ck_pmf_set_status(&s->meta, (enum ck_pmf_status)to, s->now);
    if (err == 0)
        ck_info("training.ended", "status=%s", ck_pmf_status_name(s->meta.status));
    return err;
}

/* ---- build_parameters.yaml ---- */

/* Keeps every key someone else put there, the keys of model.build_parameters
 * from the config, and ckptd's own section (sha256 and size of each checkpoint). */
static int build_parameters(struct scan *s)
{
    char path[PATH_MAX];
    struct ck_buf old = CK_BUF_INIT, out = CK_BUF_INIT, cfgb = CK_BUF_INIT;
    struct ck_yaml_doc doc = {0}, cdoc = {0};
    struct ck_yaml_out o;
    int err;
    if ((err = path_in(s, path, "data/build_parameters.yaml")) < 0)
        return err;
    bool exists = ck_exists(path);
    if (exists && (err = ck_read_file(path, 64u << 20, &old)) < 0)
        return err;
    if (exists && old.len && (err = ck_yaml_load(&doc, path, ck_buf_str(&old), old.len)) < 0)
        goto out;
    yaml_node_t *root = doc.loaded ? ck_yaml_root(&doc) : NULL;
    if (root && root->type != YAML_MAPPING_NODE) {
        err = ck_error(CK_EFORMAT, "'%s' line %d: expected a mapping", path, ck_yaml_line(root));
        goto out;
    }
    const char *cfg_yaml = s->o->cfg->build_parameters_yaml;
    if (cfg_yaml && (err = ck_yaml_load(&cdoc, "model.build_parameters", cfg_yaml, strlen(cfg_yaml))) < 0)
        goto out;
    yaml_node_t *croot = cdoc.loaded ? ck_yaml_root(&cdoc) : NULL;

    if ((err = ck_yaml_out_begin(&o, &out)) < 0)
        goto out;
    ck_yaml_map_begin(&o);
    /* existing keys, unless the config or ckptd overrides them */
    if (root) {
        for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
            yaml_node_t *k = ck_yaml_node(&doc, p->key);
            const char *ks = k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "";
            bool overridden = !strcmp(ks, "ckptd");
            if (croot)
                for (yaml_node_pair_t *q = croot->data.mapping.pairs.start;
                     q < croot->data.mapping.pairs.top; q++) {
                    yaml_node_t *ck = ck_yaml_node(&cdoc, q->key);
                    if (ck->type == YAML_SCALAR_NODE && !strcmp((const char *)ck->data.scalar.value, ks))
                        overridden = true;
                }
            if (overridden)
                continue;
            ck_yaml_copy(&o, &doc, k);
            ck_yaml_copy(&o, &doc, ck_yaml_node(&doc, p->value));
        }
    }
    if (croot)
        for (yaml_node_pair_t *q = croot->data.mapping.pairs.start; q < croot->data.mapping.pairs.top; q++) {
            ck_yaml_copy(&o, &cdoc, ck_yaml_node(&cdoc, q->key));
            ck_yaml_copy(&o, &cdoc, ck_yaml_node(&cdoc, q->value));
        }
    ck_yaml_str(&o, "ckptd");
    ck_yaml_map_begin(&o);
    ck_yaml_str(&o, "version");
    ck_yaml_str(&o, CKPTD_VERSION);
    ck_yaml_str(&o, "checkpoints");
    ck_yaml_map_begin(&o);
    for (size_t i = 0; i < s->meta.ncheckpoints; i++) {
        char txt[1024];
        struct ck_ckpt_record r;
        const char *ref = ck_pmf_ref_str(&s->meta.checkpoints[i].ref, txt, sizeof txt);
        if (ck_state_ckpt_get(s->st, ref, &r) < 0)
            continue;
        ck_yaml_str(&o, ref);
        ck_yaml_map_begin(&o);
        ck_yaml_str(&o, "sha256");
        ck_yaml_str(&o, r.sha256);
        ck_yaml_str(&o, "size");
        ck_yaml_int(&o, (int64_t)r.size);
        ck_yaml_str(&o, "files");
        ck_yaml_int(&o, r.nfiles);
        ck_yaml_str(&o, "source");
        ck_yaml_str(&o, r.source);
        ck_yaml_map_end(&o);
    }
    ck_yaml_map_end(&o);
    ck_yaml_map_end(&o);
    ck_yaml_map_end(&o);
    if ((err = ck_yaml_out_end(&o)) < 0)
        goto out;
    if (!exists || old.len != out.len || memcmp(ck_buf_str(&old), ck_buf_str(&out), out.len))
        err = ck_write_file_atomic(path, ck_buf_str(&out), out.len, 0644);
out:
    ck_yaml_release(&doc);
    ck_yaml_release(&cdoc);
    ck_buf_release(&old);
    ck_buf_release(&out);
    ck_buf_release(&cfgb);
    return err;
}

/* ---- the pass ---- */

static int ensure_tree(struct scan *s)
{
    char path[PATH_MAX];
    int err;
    if ((err = path_in(s, path, "data/checkpoints")) < 0 || (err = ck_mkdirs(path, 0755)) < 0 ||
        (err = path_in(s, path, "data/initialisation")) < 0 || (err = ck_mkdirs(path, 0755)) < 0)
        return err;
    return 0;
}

int ck_scan_run(struct ck_state *st, const struct ck_scan_opts *o, struct ck_scan_result *res)
{
    struct scan s = {.st = st, .o = o, .res = res, .now = now_seconds()};
    struct ck_discovery d = {0};
    struct ck_buf old = CK_BUF_INIT, out = CK_BUF_INIT;
    char meta_path[PATH_MAX];
    bool in_txn = false;
    int err;
    memset(res, 0, sizeof *res);
    if ((err = path_in(&s, meta_path, "metadata.yaml")) < 0)
        return err;

    bool fresh = !ck_exists(meta_path);
    if (!fresh) {
        if ((err = ck_read_file(meta_path, METADATA_MAX, &old)) < 0 ||
            (err = ck_pmf_parse(&s.meta, meta_path, ck_buf_str(&old), old.len)) < 0) {
            ck_buf_release(&old);
            return ck_error_wrap(err, "not touching it");
        }
    } else {
        ck_pmf_meta_init(&s.meta);
        s.meta.status = CK_PMF_PENDING;
    }
    res->old_status = s.meta.status;
    /* One transaction for the pass: 10,000 cache rows cost one fsync, not 10,000. */
    if ((err = ck_state_begin(st)) < 0)
        goto out;
    in_txn = true;

    if ((err = ensure_tree(&s)) < 0 || (err = model_identity(&s, fresh)) < 0 ||
        (err = configuration(&s)) < 0)
        goto out;
    if (o->cfg->init_kind == CK_INIT_FILE && (err = init_file(&s)) < 0)
        goto out;
    if (o->cfg->init_kind == CK_INIT_PMF && (err = init_pmf(&s)) < 0)
        goto out;
    err = o->only_dirs ? ck_discover_dirs(o->dir, &o->cfg->ckpt, o->only_dirs, o->nonly_dirs, &d)
                       : ck_discover(o->dir, &o->cfg->ckpt, &d);
    if (err < 0 || (err = index_candidates(&s, &d)) < 0)
        goto out;
    for (size_t i = 0; i < d.nproblems; i++)
        problem(&s, d.problems[i].path, d.problems[i].msg);
    if ((!o->only_dirs && (err = registered_pass(&s)) < 0) || (err = new_pass(&s, &d)) < 0)
        goto out;
    int status_err = status_pass(&s);
    res->new_status = s.meta.status;

    /* Data first, metadata.yaml last: a reader never sees metadata naming a
     * file that is not there yet. The state (hash cache, records) commits
     * before metadata.yaml is replaced. */
    if ((err = build_parameters(&s)) < 0 || (err = ck_pmf_emit(&s.meta, &out)) < 0)
        goto out;
    in_txn = false;
    if ((err = ck_state_commit(st)) < 0)
        goto out;
    if (fresh || out.len != old.len || memcmp(ck_buf_str(&out), ck_buf_str(&old), out.len)) {
        if ((err = ck_write_file_atomic(meta_path, ck_buf_str(&out), out.len, 0644)) < 0)
            goto out;
        res->metadata_written = true;
        ck_info("metadata.written", "path=%s checkpoints=%zu status=%s", meta_path,
                s.meta.ncheckpoints, ck_pmf_status_name(s.meta.status));
    }
    err = status_err;
out:
    if (in_txn)
        ck_state_rollback(st);
    sync_dirty(&s);
    free(s.byref);
    ck_discovery_release(&d);
    ck_pmf_meta_release(&s.meta);
    ck_buf_release(&old);
    ck_buf_release(&out);
    return err;
}

void ck_scan_result_release(struct ck_scan_result *r)
{
    for (size_t i = 0; i < r->nregistered; i++)
        free(r->registered[i]);
    free(r->registered);
    memset(r, 0, sizeof *r);
}

int ck_scan_check(const struct ck_scan_opts *o)
{
    char path[PATH_MAX];
    struct ck_pmf_meta m;
    int err = ck_path_join(path, sizeof path, o->dir, "metadata.yaml");
    if (err < 0 || !ck_exists(path))
        return err;
    if ((err = read_meta(path, &m)) == 0)
        ck_pmf_meta_release(&m);
    return err;
}
