#include "agent/scan.h"
#include "agent/counters.h"
#include "agent/discover.h"
#include "agent/layout.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/syncset.h"
#include "common/yamlutil.h"
#include "stores/uploader.h"

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

struct scan {
    struct ck_state *st;
    const struct ck_scan_opts *o;
    struct ck_scan_result *res;
    struct ck_pmf_meta meta;
    double now;
    /* Lookups that would be quadratic over 10,000 checkpoints, kept sorted. */
    const struct ck_candidate **byref; /* candidates by reference, sources before our links */
    size_t nbyref;
    struct ck_syncset unsynced;        /* links and manifests written, made durable at the end */
};

static const struct ck_candidate *find_twin(struct scan *s, const struct ck_candidate *c);

static int replace_str(char **field, const char *v)
{
    char *p = strdup(v);
    if (!p)
        return ck_error(CK_ENOMEM, "out of memory");
    free(*field);
    *field = p;
    return 0;
}

static int path_in(struct scan *s, char *out, const char *rel)
{
    return ck_path_join(out, PATH_MAX, s->o->dir, rel);
}

/* ---- checkpoints ---- */

/* A new checkpoint with what it will be registered as: the epoch and step
 * its file records (agent/counters.h) win over its name's. */
struct todo {
    const struct ck_candidate *c;
    struct ck_counters file;
    bool has_epoch, has_step;
    int64_t epoch, step; /* epoch: the one registered */
};

static int cmp_todo(const void *a, const void *b)
{
    const struct todo *tx = a, *ty = b;
    const struct ck_candidate *x = tx->c, *y = ty->c;
    if (tx->epoch != ty->epoch)
        return tx->epoch < ty->epoch ? -1 : 1;
    if (tx->step != ty->step)
        return tx->step < ty->step ? -1 : 1;
    if (x->newest_mtime != y->newest_mtime)
        return x->newest_mtime < y->newest_mtime ? -1 : 1;
    return strcmp(x->ref, y->ref);
}

/* The epoch and step of t->c: its file's, else its name's; false when
 * neither says (a plain name like last.ckpt whose file records nothing). */
static bool resolve_counters(struct scan *s, struct todo *t)
{
    const struct ck_candidate *c = t->c;
    if (ck_counters_read(s->o->dir, c, &t->file) < 0)
        ck_warn("checkpoint.counters_unread", "checkpoint='%s': %s; the name's epoch and step are used",
                c->ref, ck_error_msg());
    t->has_step = t->file.has_step || c->has_step;
    t->step = t->file.has_step ? t->file.step : c->has_step ? c->step : 0;
    t->has_epoch = true;
    if (t->file.has_epoch)
        t->epoch = t->file.epoch;
    else if (c->has_epoch)
        t->epoch = c->epoch;
    else if (t->has_step)
        t->epoch = s->o->cfg->steps_per_epoch > 0 ? t->step / s->o->cfg->steps_per_epoch : t->step;
    else
        t->has_epoch = false;
    return t->has_epoch;
}

/* A name two patterns read differently: said once, when it is registered. */
static void log_ambiguous(const struct ck_candidate *c)
{
    const struct ck_name_captures *n = &c->names;
    if (!n->ambiguous)
        return;
    char took[96] = "", other[96] = "";
    if (n->has_epoch)
        snprintf(took, sizeof took, "epoch %lld", (long long)n->epoch);
    if (n->has_step)
        snprintf(took + strlen(took), sizeof took - strlen(took), "%sstep %lld",
                 n->has_epoch ? " " : "", (long long)n->step);
    if (n->alt_has_epoch)
        snprintf(other, sizeof other, "epoch %lld", (long long)n->alt_epoch);
    if (n->alt_has_step)
        snprintf(other + strlen(other), sizeof other - strlen(other), "%sstep %lld",
                 n->alt_has_epoch ? " " : "", (long long)n->alt_step);
    ck_warn("checkpoint.name_ambiguous",
            "checkpoint='%s': read as %s (pattern '%s'), not as %s (pattern '%s'); set "
            "checkpoints.patterns to choose",
            c->ref, took, n->pattern ? n->pattern : "", other,
            n->alt_pattern ? n->alt_pattern : "");
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

/* Hard-links (or reflinks, or copies) the candidate's files into
 * data/checkpoints; *linked says every copy is its source's own inode.
 * keep_others: a copy that is another file already (a registered
 * checkpoint's source replaced by a rename) stays, the registered bytes. */
static int place(struct scan *s, const struct ck_candidate *c, bool keep_others, bool *linked)
{
    char src[PATH_MAX], rel[PATH_MAX], dst[PATH_MAX], dir[PATH_MAX];
    int err;
    *linked = true;
    if (c->in_tree)
        return 0;
    for (size_t i = 0; i < c->nfiles; i++) {
        if ((err = path_in(s, src, c->files[i])) < 0 ||
            (err = tree_rel(c, c->files[i], rel, sizeof rel)) < 0 || (err = path_in(s, dst, rel)) < 0)
            return err;
        ck_dirname(dir, sizeof dir, dst);
        bool had;
        if ((err = ck_syncset_add_dir(&s->unsynced, dir, &had)) < 0 ||
            (!had && (err = ck_mkdirs(dir, 0755)) < 0))
            return err;
        if ((err = ck_place_file_nosync(src, dst)) == CK_EEXIST && keep_others)
            ck_error_clear();
        else if (err < 0)
            return err;
        if (err != 0)
            *linked = false;
    }
    return 0;
}

/* What this pass placed and wrote, durable before metadata.yaml names it. */
static int sync_placed(struct scan *s)
{
    return ck_syncset_flush(&s->unsynced, s->o->dir);
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
        return ck_state_hash_file(s->st, path, h, total);
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
            (err = ck_state_hash_file(s->st, path, &fh, &size)) < 0)
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
        {
            char dir[PATH_MAX];
            ck_dirname(dir, sizeof dir, path);
            if ((err = ck_write_file_replace_nosync(path, ck_buf_str(&manifest), manifest.len,
                                                    0644)) == 0 &&
                (err = ck_syncset_add_file(&s->unsynced, path)) == 0)
                err = ck_syncset_add_dir(&s->unsynced, dir, NULL);
        }
        ck_buf_release(&old);
        if (err == 0)
            err = ck_state_hash_file(s->st, path, h, NULL);
    }
    ck_buf_release(&manifest);
    return err;
}

/* The fingerprint to record for a candidate (agent/discover.h), or 0 (none:
 * its files are looked at each full pass). A source stands for its tree copy
 * only when the copy is our hard link to the same files: then the walk of
 * data/checkpoints found the copy with the same fingerprint. */
static uint64_t fingerprint_of(struct scan *s, const struct ck_candidate *c)
{
    if (c->in_tree)
        return c->fingerprint;
    const struct ck_candidate *twin = find_twin(s, c);
    return twin && twin->fingerprint == c->fingerprint ? c->fingerprint : 0;
}

static int record(struct scan *s, const struct ck_candidate *c, const char *pmf_rel,
                  const struct ck_hash_entry *h, uint64_t total, uint64_t fingerprint)
{
    struct ck_ckpt_record r;
    memset(&r, 0, sizeof r);
    snprintf(r.ref, sizeof r.ref, "%s", c->ref);
    snprintf(r.source, sizeof r.source, "%s", c->rel);
    snprintf(r.tree_path, sizeof r.tree_path, "%s", pmf_rel);
    snprintf(r.sha256, sizeof r.sha256, "%s", h->sha256);
    r.size = total;
    r.nfiles = (int)c->nfiles;
    r.fingerprint = fingerprint;
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

/* A problem of one checkpoint, counted under its stage (ckptd_failures_total):
 * CK_M_FAILURES_SCAN, or CK_M_FAILURES_HASH when its files could not be hashed. */
static void problem_at(struct scan *s, const char *rel, const char *msg, enum ck_metric stage)
{
    ck_err("checkpoint.problem", "path='%s': %s", rel, msg);
    s->res->problems++;
    ck_metrics_add(stage, 1);
}

static void problem(struct scan *s, const char *rel, const char *msg)
{
    problem_at(s, rel, msg, CK_M_FAILURES_SCAN);
}

/* Hashes a registered checkpoint again and records what it found, with the
 * fingerprint of the files it hashed when the copies are their sources. */
static int recheck(struct scan *s, size_t idx, const struct ck_candidate *c)
{
    struct ck_pmf_checkpoint *cp = &s->meta.checkpoints[idx];
    char pmf_rel[PATH_MAX];
    struct ck_hash_entry h;
    uint64_t total;
    ck_debug("checkpoint.rechecked", "checkpoint='%s': its files are not the ones last seen",
             c->ref);
    bool linked;
    /* a file added to a registered folder is placed like the others were */
    int err = place(s, c, true, &linked);
    if (err == 0)
        err = hash_candidate(s, c, pmf_rel, &h, &total);
    if (err == CK_ECHANGED) {
        ck_warn("checkpoint.changing", "checkpoint='%s': %s", c->ref, ck_error_msg());
        s->res->waiting++;
        return 0;
    }
    if (err < 0)
        return err;
    if (strcmp(cp->md5, h.md5) || strcmp(cp->path, pmf_rel)) {
        ck_warn("checkpoint.changed", "checkpoint='%s' changed after it was registered: md5 %s -> %s",
                c->ref, cp->md5, h.md5);
        memcpy(cp->md5, h.md5, 33);
        if ((err = replace_str(&cp->path, pmf_rel)) < 0)
            return err;
        /* a file rewritten in place (Lightning's last.ckpt) moves to the epoch it records */
        struct ck_counters fc;
        if (s->meta.status == CK_PMF_RUNNING && s->meta.latest_epoch.set &&
            ck_counters_read(s->o->dir, c, &fc) == 0 && fc.has_epoch && fc.epoch != cp->epoch) {
            ck_info("checkpoint.epoch_changed", "checkpoint='%s': epoch %lld -> %lld (from=%s)", c->ref,
                    (long long)cp->epoch, (long long)fc.epoch, fc.source);
            cp->epoch = fc.epoch;
            if (fc.epoch > s->meta.latest_epoch.v)
                s->meta.latest_epoch.v = fc.epoch;
            if (s->meta.start_epoch.set && fc.epoch < s->meta.start_epoch.v)
                s->meta.start_epoch.v = fc.epoch;
        }
        ck_error_clear();
        s->res->updated++;
        return record(s, c, pmf_rel, &h, total, linked ? c->fingerprint : 0);
    }
    /* the same bytes: the next pass needs no look unless the files change */
    return linked ? ck_state_ckpt_set_fingerprint(s->st, c->ref, c->fingerprint) : 0;
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

/* Our copy in data/checkpoints of the source candidate c (sorted right
 * after it), or NULL. */
static const struct ck_candidate *find_twin(struct scan *s, const struct ck_candidate *c)
{
    if (c->in_tree || !s->byref)
        return NULL;
    const struct ck_candidate *const *p =
        bsearch(&c, s->byref, s->nbyref, sizeof *s->byref, cmp_byref);
    if (!p || *p != c || (size_t)(p - s->byref) + 1 >= s->nbyref)
        return NULL;
    const struct ck_candidate *next = p[1];
    return next->in_tree && !strcmp(next->ref, c->ref) ? next : NULL;
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

static bool is_known(void *arg, const char *ref)
{
    return strset_has(arg, ref);
}

static void remove_tree_copy(struct scan *s, const struct ck_ckpt_record *r)
{
    char path[PATH_MAX];
    if (path_in(s, path, r->tree_path) == 0)
        unlink(path);
}

/* targeted: a pass over the folders the watcher saw change. It looks only
 * at the registered checkpoints found there (a file rewritten in place, as
 * Lightning's last.ckpt or a trainer writing over a checkpoint being sent,
 * is hashed again now, not at the next full pass); deletions are for the full
 * pass, which sees the whole tree. */
static int registered_pass(struct scan *s, bool targeted)
{
    char txt[64];
    int err;
    for (size_t i = 0; i < s->meta.ncheckpoints; i++) {
        const struct ck_pmf_ref *ref = &s->meta.checkpoints[i].ref;
        const char *name = ck_pmf_ref_str(ref, txt, sizeof txt);
        const struct ck_candidate *c = find_cand(s, name);
        if (targeted && !c)
            continue;
        struct ck_ckpt_record r;
        bool have_record = s->o->cfg->mirror_deletes && ck_state_ckpt_get(s->st, name, &r) == 0;
        bool source_gone = false;
        if (have_record) {
            char src[PATH_MAX];
            source_gone = strncmp(r.source, "data/checkpoints/", 17) &&
                          path_in(s, src, r.source) == 0 && !ck_exists(src);
        }
        if (s->o->cfg->mirror_deletes && !targeted && (source_gone || !c)) {
            ck_info("checkpoint.unregistered", "checkpoint='%s': the training job deleted it", name);
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
        if (!c)
            continue;
        /* unchanged since it was registered or last looked at: nothing to read */
        uint64_t print = fingerprint_of(s, c);
        if (print && (have_record || ck_state_ckpt_get(s->st, name, &r) == 0) &&
            r.fingerprint == print)
            continue;
        if ((err = recheck(s, i, c)) < 0)
            problem_at(s, c->rel, ck_error_msg(), CK_M_FAILURES_HASH);
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

/* checkpoint.registered: the epoch and step taken, where they came from
 * (the file or the name), and the name's reading beside the file's. */
static void log_registered(const struct ck_pmf_ref *ref, const struct todo *t, const char *pmf_rel,
                           const struct ck_hash_entry *h, uint64_t total)
{
    const struct ck_candidate *c = t->c;
    char txt[64], step[32] = "", name[96] = "";
    if (t->has_step)
        snprintf(step, sizeof step, " step=%lld", (long long)t->step);
    if (t->file.source && c->has_epoch)
        snprintf(name, sizeof name, " name_epoch=%lld", (long long)c->epoch);
    if (t->file.source && c->has_step)
        snprintf(name + strlen(name), sizeof name - strlen(name), " name_step=%lld",
                 (long long)c->step);
    ck_info("checkpoint.registered", "checkpoint='%s' epoch=%lld path=%s md5=%s bytes=%llu%s from=%s%s",
            ck_pmf_ref_str(ref, txt, sizeof txt), (long long)t->epoch, pmf_rel, h->md5,
            (unsigned long long)total, step, t->file.source ? t->file.source : "name", name);
    if (t->file.source && ((t->file.has_epoch && c->has_epoch && t->file.epoch != c->epoch) ||
                           (t->file.has_step && c->has_step && t->file.step != c->step)))
        ck_warn("checkpoint.name_differs",
                "checkpoint='%s': the file (%s) records epoch %lld step %lld, the name says otherwise; "
                "the file's are registered",
                c->ref, t->file.source, (long long)t->epoch, (long long)t->step);
}

/* send_first (agent/scan.h): 1 when the placed file checkpoint c was queued
 * for the stores before its hashing (it waits), 0 when it is to be hashed
 * and registered now: its digests are known, a store bundles the tree, an
 * S3 store sends it as one PUT (which needs both digests before its body:
 * the registration's serve it, stores/s3.c), or every store has this very
 * file queued or sent already (a pass after the one that queued it). */
static int send_first(struct scan *s, const struct ck_candidate *c)
{
    const struct ck_config *cfg = s->o->cfg;
    char rel[PATH_MAX], path[PATH_MAX], root[PATH_MAX], full[PATH_MAX];
    struct ck_hash_entry h;
    struct stat st;
    if (!s->o->send_first || c->kind != CK_CAND_FILE || cfg->n_upload_stores == 0)
        return 0;
    if (tree_rel(c, c->files[0], rel, sizeof rel) < 0 || path_in(s, path, rel) < 0 ||
        stat(path, &st) < 0 || ck_state_hash_lookup(s->st, &st, &h) || !realpath(s->o->dir, root) ||
        ck_path_join(full, sizeof full, root, rel) < 0) {
        ck_error_clear();
        return 0;
    }
    for (size_t i = 0; i < cfg->n_upload_stores; i++) {
        const struct ck_store_spec *sp = &cfg->upload_stores[i];
        if (sp->bundle || (!strncmp(sp->url, "s3://", 5) && !sp->compress &&
                           (uint64_t)st.st_size < cfg->upload.multipart_threshold))
            return 0;
    }
    bool any = false;
    for (size_t i = 0; i < cfg->n_upload_stores; i++) {
        bool added;
        int err = ck_uploader_enqueue_checkpoint(s->st->db, &cfg->upload_stores[i], full, rel,
                                                 c->ref, &added);
        if (err < 0)
            return err;
        any = any || added;
    }
    if (!any)
        return 0;
    ck_debug("checkpoint.sent_first", "checkpoint='%s' path=%s: queued for the stores before its "
             "hashing", c->ref, rel);
    return ck_strlist_add(&s->res->sent_first, path) < 0 ? ck_error(CK_ENOMEM, "out of memory")
                                                          : 1;
}

static int new_pass(struct scan *s, const struct ck_discovery *d)
{
    double min_age = s->o->min_age >= 0 ? s->o->min_age : s->o->cfg->min_age;
    struct todo *todo = calloc(d->ncands ? d->ncands : 1, sizeof *todo);
    struct strset refs = {0}, paths = {0};
    size_t n = 0;
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
        if (ck_state_retained_deleting(s->st, c->ref))
            continue; /* retention is deleting it (agent/retention.h): what is left goes too */
        double age = ck_wall_s() - c->newest_mtime;
        bool take = s->o->admit ? s->o->admit(s->o->admit_arg, c) : c->complete && age >= min_age;
        if (!take) {
            ck_debug("checkpoint.waiting", "checkpoint='%s' complete=%d age_seconds=%.3f", c->ref, c->complete,
                     age);
            s->res->waiting++;
            continue;
        }
        todo[n].c = c;
        if (!resolve_counters(s, &todo[n])) {
            problem(s, c->rel,
                    "its name has no {epoch} or {step} and the file records neither (a "
                    "Lightning .ckpt records both): not registered");
            continue;
        }
        n++;
    }
    qsort(todo, n, sizeof *todo, cmp_todo);
    for (size_t i = 0; i < n && err == 0; i++) {
        const struct todo *t = &todo[i];
        const struct ck_candidate *c = t->c;
        char pmf_rel[PATH_MAX];
        struct ck_hash_entry h;
        uint64_t total;
        enum ck_metric stage = CK_M_FAILURES_SCAN;
        bool linked;
        int e = place(s, c, false, &linked);
        if (e == 0 && (e = send_first(s, c)) == 1) {
            s->res->waiting++;
            continue;
        }
        if (e == 0) {
            stage = CK_M_FAILURES_HASH;
            e = hash_candidate(s, c, pmf_rel, &h, &total);
        }
        if (e == CK_ECHANGED) {
            ck_warn("checkpoint.changing", "checkpoint='%s': %s; will retry", c->ref, ck_error_msg());
            s->res->waiting++;
            continue;
        }
        if (e < 0) {
            problem_at(s, c->rel, ck_error_msg(), stage);
            continue;
        }
        struct ck_pmf_ref ref = {false, 0, c->ref};
        int64_t epoch = t->epoch;
        if ((err = ck_pmf_register(&s->meta, &ref, epoch, pmf_rel, h.md5, s->now, 0)) == CK_ESTATE) {
            problem(s, c->rel, ck_error_msg());
            err = 0;
            continue;
        }
        if (err < 0)
            break;
        /* the walk's view of the source is the copy's when they are one file */
        if ((err = record(s, c, pmf_rel, &h, total, linked ? c->fingerprint : 0)) < 0 ||
            (err = add_registered(s->res, c->ref)) < 0)
            break;
        ck_metrics_add(CK_M_CHECKPOINTS_REGISTERED, 1);
        log_ambiguous(c);
        log_registered(&ref, t, pmf_rel, &h, total);
    }
    /* the links and manifests must be durable before metadata.yaml names them */
    if (err == 0)
        err = sync_placed(s);
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

/* ---- the pass ---- */

/* The metadata.yaml part of the memo; the build_parameters part stays. */
static void memo_forget(struct ck_scan_memo *m)
{
    if (m->valid) {
        ck_pmf_meta_release(&m->meta);
        ck_buf_release(&m->bytes);
    }
    m->valid = false;
}

void ck_scan_memo_release(struct ck_scan_memo *m)
{
    memo_forget(m);
    ck_layout_memo_release(&m->build_parameters);
    memset(m, 0, sizeof *m);
}

int ck_scan_run(struct ck_state *st, const struct ck_scan_opts *o, struct ck_scan_result *res)
{
    struct scan s = {.st = st, .o = o, .res = res, .now = ck_wall_s()};
    struct ck_discovery d = {0};
    struct ck_buf old = CK_BUF_INIT, out = CK_BUF_INIT;
    char meta_path[PATH_MAX];
    bool in_txn = false;
    int err;
    memset(res, 0, sizeof *res);
    if ((err = path_in(&s, meta_path, "metadata.yaml")) < 0)
        return err;

    struct stat mst;
    bool fresh = stat(meta_path, &mst) < 0 && errno == ENOENT;
    struct ck_scan_memo *memo = o->memo;
    struct ck_file_id mid = ck_file_id_of(&mst);
    if (memo && memo->valid && !fresh && ck_file_id_equal(&memo->id, &mid)) {
        /* the file this process wrote last: its parse is in memory */
        s.meta = memo->meta;
        old = memo->bytes;
        memo->valid = false;
        ck_pmf_meta_init(&memo->meta);
        memo->bytes = (struct ck_buf)CK_BUF_INIT;
    } else if (!fresh) {
        if (memo)
            memo_forget(memo);
        if ((err = ck_read_file(meta_path, CK_METADATA_MAX, &old)) < 0 ||
            (err = ck_pmf_parse(&s.meta, meta_path, ck_buf_str(&old), old.len)) < 0) {
            ck_buf_release(&old);
            ck_metrics_add(CK_M_FAILURES_METADATA, 1);
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

    /* the tree around the checkpoints (agent/layout.h) */
    struct ck_layout lay = {.dir = o->dir, .cfg = o->cfg, .st = st, .meta = &s.meta,
                            .memo = memo ? &memo->build_parameters : NULL};
    if ((err = ck_layout_ensure(&lay)) < 0 || (err = ck_layout_identity(&lay, fresh)) < 0)
        goto out;
    snprintf(res->model_id, sizeof res->model_id, "%s", s.meta.id ? s.meta.id : "");
    snprintf(res->model_name, sizeof res->model_name, "%s", s.meta.name ? s.meta.name : "");
    if ((err = ck_layout_configuration(&lay)) < 0 || (err = ck_layout_initialisation(&lay)) < 0)
        goto out;
    if (o->only_dirs) {
        /* a targeted pass leaves registered folders alone: not listed at all */
        struct strset known = {0};
        if ((err = strset_build(&known, &s.meta, false)) == 0)
            err = ck_discover_dirs(o->dir, &o->cfg->ckpt, o->only_dirs, o->nonly_dirs, is_known,
                                   &known, &d);
        strset_release(&known);
    } else {
        err = ck_discover(o->dir, &o->cfg->ckpt, &d);
    }
    if (err < 0 || (err = index_candidates(&s, &d)) < 0)
        goto out;
    for (size_t i = 0; i < d.nproblems; i++)
        problem(&s, d.problems[i].path, d.problems[i].msg);
    if ((err = registered_pass(&s, o->only_dirs != NULL)) < 0 || (err = new_pass(&s, &d)) < 0)
        goto out;
    /* A checkpoint sent before its hashing (send_first) is registered by the
     * pass right after this one: the training's end (a marker written with
     * the last checkpoint) waits for that pass, or it would close the run
     * before its last checkpoint and never take it */
    int status_err = res->sent_first.n ? 0 : status_pass(&s);
    res->new_status = s.meta.status;

    /* Data first, metadata.yaml last: a reader never sees metadata naming a
     * file that is not there yet. The state (hash cache, records) commits
     * before metadata.yaml is replaced. */
    if ((err = ck_layout_build_parameters(&lay)) < 0 || (err = ck_pmf_emit(&s.meta, &out)) < 0)
        goto out;
    in_txn = false;
    if ((err = ck_state_commit(st)) < 0)
        goto out;
    if (fresh || out.len != old.len || memcmp(ck_buf_str(&out), ck_buf_str(&old), out.len)) {
        if ((err = ck_write_file_atomic_stat(meta_path, ck_buf_str(&out), out.len, 0644,
                                             &mst)) < 0) {
            ck_metrics_add(CK_M_FAILURES_METADATA, 1);
            goto out;
        }
        res->metadata_written = true;
        /* counted once metadata.yaml says so */
        ck_metrics_add(CK_M_CHECKPOINTS_UNREGISTERED, res->removed);
        ck_info("metadata.written", "path=%s checkpoints=%zu status=%s", meta_path,
                s.meta.ncheckpoints, ck_pmf_status_name(s.meta.status));
    }
    err = status_err;
    if (memo && err == 0 && (res->metadata_written || !fresh)) {
        /* the file as this pass knew it: the one it wrote (its own fstat), or
         * the one it read, as stat'ed before reading. Never a stat now: a
         * write by another hand meanwhile would pass for ours and never be
         * read (metrics.failures_and_removals found it under load). */
        memo->id = ck_file_id_of(&mst);
        memo->meta = s.meta;
        memo->bytes = out;
        ck_pmf_meta_init(&s.meta);
        out = (struct ck_buf)CK_BUF_INIT;
        memo->valid = true;
        res->meta = &memo->meta;
    }
out:
    if (in_txn)
        ck_state_rollback(st);
    ck_syncset_release(&s.unsynced); /* flushed by new_pass, unless the pass failed before */
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
    ck_strlist_release(&r->sent_first);
    memset(r, 0, sizeof *r);
}

int ck_scan_check(const struct ck_scan_opts *o)
{
    char path[PATH_MAX];
    struct ck_pmf_meta m;
    int err = ck_path_join(path, sizeof path, o->dir, "metadata.yaml");
    if (err < 0 || !ck_exists(path))
        return err;
    if ((err = ck_layout_read_meta(path, &m)) == 0)
        ck_pmf_meta_release(&m);
    return err;
}
