#include "agent/retention.h"
#include "agent/deploy.h"
#include "agent/discover.h"
#include "agent/layout.h"
#include "agent/settle.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/strlist.h"
#include "readers/jsonin.h"
#include "stores/net.h"
#include "stores/pmftree.h"
#include "stores/queue.h"
#include "stores/store.h"
#include "writers/pmf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define METRICS_FILE_MAX (64u << 20)
#define TRAINER_STATE_MAX (64u << 20)

int ck_retention_free_bytes(const char *dir, uint64_t *out)
{
    struct statvfs sv;
    if (statvfs(dir, &sv) < 0)
        return ck_error_os(CK_EIO, "cannot read the free space of '%s'", dir);
    *out = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    ck_metrics_set(CK_M_DISK_FREE_BYTES, (int64_t)*out);
    return 0;
}

/* ---- the stores' metadata.yaml ---- */

/* Appends a checkpoint without touching latest or the times (ck_pmf_register would). */
static int append_ckpt(struct ck_pmf_meta *m, const struct ck_retained *r)
{
    if (m->ncheckpoints == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 8;
        struct ck_pmf_checkpoint *v = realloc(m->checkpoints, cap * sizeof *v);
        if (!v)
            return ck_error(CK_ENOMEM, "out of memory");
        m->checkpoints = v;
        m->cap = cap;
    }
    struct ck_pmf_checkpoint *c = &m->checkpoints[m->ncheckpoints];
    memset(c, 0, sizeof *c);
    c->ref.is_int = r->ref_is_int;
    if (r->ref_is_int)
        c->ref.i = strtoll(r->ref, NULL, 10);
    else if (!(c->ref.s = strdup(r->ref)))
        return ck_error(CK_ENOMEM, "out of memory");
    if (!(c->path = strdup(r->path))) {
        free(c->ref.s);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    c->epoch = r->epoch;
    snprintf(c->md5, sizeof c->md5, "%s", r->md5);
    m->ncheckpoints++;
    return 0;
}

int ck_retention_remote_meta(sqlite3 *db, const char *dir)
{
    char meta_path[PATH_MAX], remote[PATH_MAX];
    struct ck_retained *rows = NULL;
    size_t n = 0;
    struct ck_pmf_meta m;
    struct ck_buf out = CK_BUF_INIT, old = CK_BUF_INIT;
    bool have_meta = false;
    int err;
    if ((err = ck_path_join(meta_path, sizeof meta_path, dir, "metadata.yaml")) < 0 ||
        (err = ck_path_join(remote, sizeof remote, dir, CK_PMFTREE_REMOTE_META)) < 0)
        return err;
    if ((err = ck_state_retained_list(db, &rows, &n)) == CK_ENOENT)
        return 0; /* not the agent's database: its file stays as the agent left it */
    if (err < 0)
        return err;
    if (n == 0 || !ck_exists(meta_path)) {
        if (unlink(remote) < 0 && errno != ENOENT)
            err = ck_error_os(CK_EIO, "cannot remove '%s'", remote);
        goto out;
    }
    if ((err = ck_layout_read_meta(meta_path, &m)) < 0)
        goto out;
    have_meta = true;
    for (size_t i = 0; i < n && err == 0; i++) {
        struct ck_pmf_ref ref = {rows[i].ref_is_int != 0, strtoll(rows[i].ref, NULL, 10),
                                 rows[i].ref_is_int ? NULL : rows[i].ref};
        /* listed locally still: an interrupted deletion; pruning or pruned:
         * the stores drop it (retention.store) */
        if (ck_pmf_find(&m, &ref) < 0 && !rows[i].pruned)
            err = append_ckpt(&m, &rows[i]);
    }
    if (err == 0 && (err = ck_pmf_emit(&m, &out)) == 0) {
        bool same = ck_read_file(remote, CK_METADATA_MAX, &old) == 0 && old.len == out.len &&
                    !memcmp(ck_buf_str(&old), ck_buf_str(&out), out.len);
        ck_error_clear();
        if (!same)
            err = ck_write_file_atomic(remote, ck_buf_str(&out), out.len, 0644);
    }
out:
    if (have_meta)
        ck_pmf_meta_release(&m);
    ck_buf_release(&out);
    ck_buf_release(&old);
    ck_retained_list_free(rows, n);
    return err;
}

/* ---- metrics for keep_best ---- */

/* A Lightning name's "metric=value" (epoch=3-val_loss=0.12.ckpt). */
static bool metric_from_name(const char *name, const char *metric, double *out)
{
    size_t ml = strlen(metric);
    for (const char *p = strstr(name, metric); p; p = strstr(p + 1, metric)) {
        bool start = p == name || p[-1] == '-' || p[-1] == '_' || p[-1] == '/';
        if (!start || p[ml] != '=')
            continue;
        char *end;
        double v = strtod(p + ml + 1, &end);
        if (end != p + ml + 1 && isfinite(v)) {
            *out = v;
            return true;
        }
    }
    return false;
}

static bool jin_number(const struct ck_jin *v, double *out)
{
    if (!v || v->type != CK_JIN_NUMBER)
        return false;
    *out = strtod(v->str, NULL);
    return isfinite(*out);
}

/* trainer_state.json: the log_history entry with the metric (or eval_METRIC)
 * at this checkpoint's global_step, else the last one before it. */
static bool metric_from_trainer_state(const char *path, const char *metric, double *out)
{
    struct ck_buf b = CK_BUF_INIT;
    struct ck_jin_doc *doc = NULL;
    const struct ck_jin *root = NULL;
    char eval[256];
    bool found = false;
    snprintf(eval, sizeof eval, "eval_%s", metric);
    if (ck_read_file(path, TRAINER_STATE_MAX, &b) == 0 &&
        ck_jin_parse(ck_buf_str(&b), b.len, &doc, &root) == 0) {
        uint64_t gstep = UINT64_MAX, step;
        ck_jin_uint(ck_jin_get(root, "global_step"), &gstep);
        const struct ck_jin *hist = ck_jin_get(root, "log_history");
        for (const struct ck_jin *e = hist && hist->type == CK_JIN_ARRAY ? hist->first : NULL; e;
             e = e->next) {
            double v;
            if (ck_jin_uint(ck_jin_get(e, "step"), &step) && step > gstep)
                continue;
            if (jin_number(ck_jin_get(e, metric), &v) || jin_number(ck_jin_get(e, eval), &v)) {
                *out = v;
                found = true;
            }
        }
    }
    ck_error_clear();
    ck_jin_free(doc);
    ck_buf_release(&b);
    return found;
}

/* A line of retention.metrics_file: a step or epoch and the metric. */
struct mrow {
    bool has_step, has_epoch;
    int64_t step, epoch;
    double v;
};

struct mtable {
    struct mrow *v;
    size_t n;
};

static int mtable_add(struct mtable *t, const struct mrow *r)
{
    struct mrow *v = realloc(t->v, (t->n + 1) * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    t->v = v;
    v[t->n++] = *r;
    return 0;
}

static bool count_of(const char *s, int64_t *out)
{
    char *end;
    double d = strtod(s, &end);
    if (end == s || !(d >= 0 && d < 9e15))
        return false;
    *out = (int64_t)floor(d);
    return true;
}

/* metrics.jsonl (one JSON object a line) or CSV (a header line naming the
 * columns: step and/or epoch, and the metric). Lines that do not parse are
 * skipped: the trainer may be writing the last one. */
static int read_metrics_file(const char *path, const char *metric, struct mtable *t)
{
    struct ck_buf b = CK_BUF_INIT;
    int err = ck_read_file(path, METRICS_FILE_MAX, &b);
    if (err < 0)
        return err;
    char *text = (char *)ck_buf_str(&b), *save = NULL;
    int col_m = -1, col_s = -1, col_e = -1;
    bool csv = false, first = true;
    for (char *line = strtok_r(text, "\n", &save); line && err == 0;
         line = strtok_r(NULL, "\n", &save)) {
        size_t l = strlen(line);
        if (l && line[l - 1] == '\r')
            line[--l] = '\0';
        struct mrow r = {0};
        bool has_v = false;
        if (line[0] == '{') {
            struct ck_jin_doc *doc = NULL;
            const struct ck_jin *root = NULL;
            if (ck_jin_parse(line, l, &doc, &root) == 0) {
                const struct ck_jin *s = ck_jin_get(root, "step"), *e = ck_jin_get(root, "epoch");
                r.has_step = s && s->type == CK_JIN_NUMBER && count_of(s->str, &r.step);
                r.has_epoch = e && e->type == CK_JIN_NUMBER && count_of(e->str, &r.epoch);
                has_v = jin_number(ck_jin_get(root, metric), &r.v);
            }
            ck_error_clear();
            ck_jin_free(doc);
        } else if (first) {
            csv = true;
            int i = 0;
            char *s2 = NULL;
            for (char *f = strtok_r(line, ",", &s2); f; f = strtok_r(NULL, ",", &s2), i++) {
                while (*f == ' ' || *f == '"')
                    f++;
                size_t fl = strlen(f);
                while (fl && (f[fl - 1] == ' ' || f[fl - 1] == '"'))
                    f[--fl] = '\0';
                if (!strcmp(f, metric))
                    col_m = i;
                else if (!strcmp(f, "step") || !strcmp(f, "global_step"))
                    col_s = i;
                else if (!strcmp(f, "epoch"))
                    col_e = i;
            }
        } else if (csv && col_m >= 0) {
            int i = 0;
            char *p = line;
            for (;; i++) {
                char *comma = strchr(p, ',');
                if (comma)
                    *comma = '\0';
                if (i == col_m && *p) {
                    char *end;
                    r.v = strtod(p, &end);
                    has_v = end != p && isfinite(r.v);
                } else if (i == col_s) {
                    r.has_step = *p && count_of(p, &r.step);
                } else if (i == col_e) {
                    r.has_epoch = *p && count_of(p, &r.epoch);
                }
                if (!comma)
                    break;
                p = comma + 1;
            }
        }
        first = false;
        if (has_v && (r.has_step || r.has_epoch))
            err = mtable_add(t, &r);
    }
    ck_buf_release(&b);
    return err;
}

/* The last value logged at the checkpoint's step, else at its epoch. */
static bool metric_from_table(const struct mtable *t, const struct ck_candidate *c, int64_t epoch,
                              double *out)
{
    bool found = false;
    for (size_t i = 0; c && c->has_step && i < t->n; i++)
        if (t->v[i].has_step && t->v[i].step == c->step) {
            *out = t->v[i].v;
            found = true;
        }
    for (size_t i = 0; !found && i < t->n; i++)
        if (t->v[i].has_epoch && t->v[i].epoch == epoch && !t->v[i].has_step) {
            *out = t->v[i].v;
            found = true;
        }
    return found;
}

bool ck_retention_metric_in_file(const char *path, const char *metric, bool has_step, int64_t step,
                                 int64_t epoch, double *out)
{
    struct mtable t = {0};
    struct ck_candidate c;
    memset(&c, 0, sizeof c);
    c.has_step = has_step;
    c.step = step;
    bool found = read_metrics_file(path, metric, &t) == 0 && metric_from_table(&t, &c, epoch, out);
    ck_error_clear();
    free(t.v);
    return found;
}

bool ck_retention_metric_in_name(const char *name, const char *metric, double *out)
{
    return metric_from_name(name, metric, out);
}

bool ck_retention_metric_in_trainer_state(const char *path, const char *metric, double *out)
{
    return metric_from_trainer_state(path, metric, out);
}

/* ---- one pass ---- */

struct item {
    const struct ck_pmf_checkpoint *cp;
    char ref[1024];
    const struct ck_candidate *src;  /* the trainer's copy, or NULL */
    const struct ck_candidate *tree; /* ours under data/checkpoints/, or NULL */
    bool keep;                       /* a count rule or the latest keeps it */
    bool protect;                    /* latest or a kept best: min_free never takes it */
    bool has_metric;
    double metric;
};

struct store_slot {
    const struct ck_store_spec *spec;
    struct ck_store *store;
    int64_t queue_id;
    bool failing; /* answered with an error this pass: nothing more is deleted */
    char url[512];
};

struct pass {
    struct ck_state *st;
    struct ck_hooks *hooks;
    const char *dir;
    const struct ck_config *cfg;
    bool dry_run;
    /* The watcher's helper (ck_retention_check): what checks out goes to
     * on_checked instead of being deleted here. */
    ck_retention_checked_fn on_checked;
    void *on_checked_arg;
    struct ck_retention_result *res;
    struct ck_net net;
    struct ck_upload_ctl ctl;
    bool net_ready;
    struct store_slot *stores;
    size_t nstores;
    bool stores_failing;
};

static const struct ck_candidate *find_cand(const struct ck_discovery *d, const char *ref, bool tree)
{
    for (size_t i = 0; i < d->ncands; i++)
        if (d->cands[i].in_tree == tree && !strcmp(d->cands[i].ref, ref))
            return &d->cands[i];
    return NULL;
}

static int open_stores(struct pass *p)
{
    const struct ck_config *cfg = p->cfg;
    int err;
    if (p->nstores || !cfg->n_upload_stores)
        return 0;
    ck_upload_ctl_init(&p->ctl, cfg->upload.grace);
    if ((err = ck_net_init(&p->net, &cfg->upload, &p->ctl)) < 0)
        return err;
    p->net_ready = true;
    if (!(p->stores = calloc(cfg->n_upload_stores, sizeof *p->stores)))
        return ck_error(CK_ENOMEM, "out of memory");
    p->nstores = cfg->n_upload_stores;
    if ((err = ck_queue_init(p->st->db)) < 0)
        return err;
    for (size_t i = 0; i < p->nstores; i++) {
        struct store_slot *s = &p->stores[i];
        s->spec = &cfg->upload_stores[i];
        ck_store_url_redact(s->url, sizeof s->url, s->spec->url);
        if ((err = ck_queue_store_put(p->st->db, s->spec, &s->queue_id)) < 0)
            return err;
        if (ck_store_open(&s->store, s->spec, &p->net) < 0) {
            ck_warn("retention.store_failing", "store=\"%s\": %s", s->url, ck_error_msg());
            ck_error_clear();
            s->failing = true;
            p->stores_failing = true;
        }
    }
    return 0;
}

static void close_stores(struct pass *p)
{
    for (size_t i = 0; i < p->nstores; i++)
        ck_store_free(p->stores[i].store);
    free(p->stores);
    p->stores = NULL;
    p->nstores = 0;
    if (p->net_ready)
        ck_net_release(&p->net);
    p->net_ready = false;
}

/* The files of a checkpoint in the tree (relative to DIR): its PMF path
 * (the file, or a set's or folder's manifest), then the files the manifest
 * lists (what its MD5 in metadata.yaml covers). */
static int tree_files(struct pass *p, const struct item *it, struct ck_buf *out)
{
    char path[PATH_MAX];
    struct ck_buf m = CK_BUF_INIT;
    int err = ck_buf_printf(out, "%s\n", it->cp->path);
    size_t pl = strlen(it->cp->path);
    if (err < 0 || pl < 8 || strcmp(it->cp->path + pl - 8, ".md5sums"))
        return err; /* a single file is its own PMF path */
    if ((err = ck_path_join(path, sizeof path, p->dir, it->cp->path)) < 0 ||
        (err = ck_read_file(path, 64u << 20, &m)) < 0)
        return err;
    char *save = NULL;
    for (char *line = strtok_r((char *)ck_buf_str(&m), "\n", &save); line && err == 0;
         line = strtok_r(NULL, "\n", &save)) {
        const char *name = strlen(line) > 34 && line[32] == ' ' && line[33] == ' ' ? line + 34
                                                                                  : NULL;
        if (!name || name[0] == '/' || strstr(name, ".."))
            err = ck_error(CK_EFORMAT, "'%s': not a manifest line: '%.80s'", path, line);
        else
            err = ck_buf_printf(out, "data/checkpoints/%s\n", name);
    }
    ck_buf_release(&m);
    return err;
}

/* Reads key back from the store and compares its MD5 with want. */
static int read_back(struct pass *p, struct store_slot *s, const char *key, const char *want,
                     bool *same)
{
    char tmp[PATH_MAX];
    struct ck_digests d;
    int err;
    *same = false;
    if ((err = ck_path_join(tmp, sizeof tmp, p->st->dir, "retention-check.tmp")) < 0)
        return err;
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return ck_error_os(CK_EIO, "cannot create '%s'", tmp);
    err = ck_store_get(s->store, key, fd);
    close(fd);
    if (err == 0 && (err = ck_hash_file(tmp, CK_HASH_MD5, &d, NULL)) == 0)
        *same = !strcmp(d.md5, want);
    unlink(tmp);
    return err;
}

/* What is checked in every store before it goes: each "KEY\tLOCAL\n", its
 * tree files (files: KEY relative to DIR) and, when the pack stage made any,
 * its archives (data/build_parameters.yaml: they stay on the disk, but the
 * checkpoint is not the only source of its deliverables once they are in
 * every store). */
static int check_list(struct pass *p, const struct item *it, const char *files, struct ck_buf *out)
{
    struct ck_buf arch = CK_BUF_INIT;
    char local[PATH_MAX], deploy[PATH_MAX];
    int err = 0;
    for (const char *f = files; *f && err == 0;) {
        const char *nl = strchr(f, '\n');
        char key[PATH_MAX];
        snprintf(key, sizeof key, "%.*s", (int)(nl - f), f);
        f = nl + 1;
        if ((err = ck_path_join(local, sizeof local, p->dir, key)) == 0)
            err = ck_buf_printf(out, "%s\t%s\n", key, local);
    }
    if (err < 0 || (err = ck_deploy_record_archives_of(p->dir, it->ref, &arch)) < 0)
        goto out;
    const char *d = p->cfg->pack_dir ? p->cfg->pack_dir : "data/deploy";
    if (d[0] == '/')
        snprintf(deploy, sizeof deploy, "%s", d);
    else if ((err = ck_path_join(deploy, sizeof deploy, p->dir, d)) < 0)
        goto out;
    for (const char *f = ck_buf_str(&arch); *f && err == 0;) {
        const char *tab = strchr(f, '\t'), *nl = strchr(f, '\n');
        char name[PATH_MAX];
        snprintf(name, sizeof name, "%.*s", (int)(tab - f), f);
        if ((err = ck_path_join(local, sizeof local, deploy, name)) == 0)
            err = ck_buf_printf(out, "%.*s\t%s\n", (int)(nl - tab - 1), tab + 1, local);
        f = nl + 1;
    }
out:
    ck_buf_release(&arch);
    return err;
}

/* Whether every store holds every file of checks ("KEY\tLOCAL" lines) as
 * the local disk has it. A missing or different copy is queued again (the
 * next upload round sends it); a store that does not answer marks the pass
 * failing. */
static bool copies_checked(struct pass *p, const struct item *it, const char *checks)
{
    bool ok = true;
    for (size_t si = 0; si < p->nstores && ok; si++) {
        struct store_slot *s = &p->stores[si];
        if (s->failing) {
            ok = false;
            break;
        }
        for (const char *f = checks; *f && ok;) {
            const char *tab = strchr(f, '\t'), *nl = strchr(f, '\n');
            char key[PATH_MAX], local[PATH_MAX];
            snprintf(key, sizeof key, "%.*s", (int)(tab - f), f);
            snprintf(local, sizeof local, "%.*s", (int)(nl - tab - 1), tab + 1);
            f = nl + 1;
            struct ck_hash_entry h;
            uint64_t size;
            struct ck_remote_obj obj;
            if (ck_state_hash_file(p->st, local, &h, &size) < 0) {
                ck_warn("retention.held", "checkpoint='%s': '%s': %s", it->ref, key, ck_error_msg());
                ck_error_clear();
                ok = false;
                break;
            }
            int err = ck_store_stat(s->store, key, &obj);
            bool same = false, lost = false;
            if (err == CK_ENOENT) {
                lost = true;
            } else if (err == 0 && (uint64_t)obj.size != size) {
                lost = true;
                ck_error(CK_ERR, "'%s': the store has %lld bytes, the local file %llu", key,
                         (long long)obj.size, (unsigned long long)size);
            } else if (err == 0 && obj.md5[0] && !strcmp(obj.md5, h.md5)) {
                same = true;
            } else if (err == 0) {
                /* no checksum from the store (or not an MD5 one): its bytes decide */
                if ((err = read_back(p, s, key, h.md5, &same)) == 0 && !same) {
                    lost = true;
                    ck_error(CK_ERR, "'%s': the store's bytes differ from the local file's", key);
                }
            }
            if (lost) {
                bool redone = false;
                char why[512];
                snprintf(why, sizeof why, "%s", ck_error_msg());
                if (ck_queue_redo(p->st->db, s->queue_id, key, &redone) < 0)
                    ck_err("retention.requeue_failed", "key=\"%s\": %s", key, ck_error_msg());
                p->res->requeued += redone;
                ck_warn("retention.copy_missing",
                        "checkpoint='%s' store=\"%s\" key=\"%s\": %s; not deleted%s", it->ref, s->url,
                        key, why, redone ? ", queued to be sent again" : "");
                ck_error_clear();
                ok = false;
            } else if (err < 0) {
                ck_warn("retention.store_failing",
                        "store=\"%s\": %s; nothing is deleted while a store cannot show its "
                        "copies",
                        s->url, ck_error_msg());
                ck_error_clear();
                s->failing = true;
                p->stores_failing = true;
                ok = false;
            } else if (!same) {
                ok = false;
            }
        }
    }
    return ok;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    if (remove(path) < 0 && errno != ENOENT)
        return ck_error_os(CK_EIO, "cannot remove '%s'", path);
    return 0;
}

/* Removes path, a file or a whole folder; gone already is fine. */
static int remove_path(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) < 0)
        return errno == ENOENT ? 0 : ck_error_os(CK_EIO, "cannot stat '%s'", path);
    if (!S_ISDIR(sb.st_mode))
        return unlink(path) < 0 && errno != ENOENT ? ck_error_os(CK_EIO, "cannot remove '%s'", path)
                                                    : 0;
    int rc = nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc < 0 ? ck_error_os(CK_EIO, "cannot remove '%s'", path) : rc;
}

/* The bytes of a checkpoint: its tree files and the trainer's source. */
static int delete_bytes(struct pass *p, const struct ck_retained *r, uint64_t *freed)
{
    char path[PATH_MAX], parent[PATH_MAX];
    struct stat sb;
    int err = 0;
    *freed = 0;
    for (const char *f = r->files; *f && err == 0;) {
        const char *nl = strchr(f, '\n');
        char rel[PATH_MAX];
        snprintf(rel, sizeof rel, "%.*s", (int)(nl ? nl - f : (ptrdiff_t)strlen(f)), f);
        f = nl ? nl + 1 : f + strlen(f);
        if ((err = ck_path_join(path, sizeof path, p->dir, rel)) < 0)
            break;
        if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_nlink == 1)
            *freed += (uint64_t)sb.st_size;
        err = remove_path(path);
    }
    /* a folder checkpoint's folder in the tree: data/checkpoints/REF/ */
    if (err == 0 && r->kind == CK_CAND_DIR && r->ref[0] && !strchr(r->ref, '/')) {
        snprintf(parent, sizeof parent, "data/checkpoints/%s", r->ref);
        if ((err = ck_path_join(path, sizeof path, p->dir, parent)) == 0)
            err = remove_path(path);
    }
    /* the trainer's copy: the file, the folder whole, or a set's files */
    if (err == 0 && r->source[0] && strncmp(r->source, "data/checkpoints/", 17) &&
        (err = ck_path_join(path, sizeof path, p->dir, r->source)) == 0) {
        if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode))
            *freed += (uint64_t)sb.st_size;
        if (r->kind == CK_CAND_DIR || ck_exists(path)) {
            err = remove_path(path);
        } else {
            /* a set named by its prefix (a TF bundle): its files start with it */
            char dir[PATH_MAX];
            ck_dirname(dir, sizeof dir, path);
            const char *base = ck_basename(path);
            DIR *d = opendir(dir);
            for (struct dirent *e; err == 0 && d && (e = readdir(d));) {
                if (strncmp(e->d_name, base, strlen(base)) || e->d_name[strlen(base)] != '.')
                    continue;
                char full[PATH_MAX];
                if ((err = ck_path_join(full, sizeof full, dir, e->d_name)) == 0) {
                    if (lstat(full, &sb) == 0 && S_ISREG(sb.st_mode))
                        *freed += (uint64_t)sb.st_size;
                    err = remove_path(full);
                }
            }
            if (d)
                closedir(d);
        }
        if (err == 0) {
            ck_dirname(parent, sizeof parent, path);
            ck_fsync_dir(parent);
        }
    }
    if (err == 0 && ck_path_join(path, sizeof path, p->dir, "data/checkpoints") == 0)
        ck_fsync_dir(path);
    return err;
}

/* metadata.yaml without ref (nothing written when it is not listed). */
static int unlist(struct pass *p, const struct ck_retained *r)
{
    char meta_path[PATH_MAX];
    struct ck_pmf_meta m;
    struct ck_buf out = CK_BUF_INIT;
    int err;
    if ((err = ck_path_join(meta_path, sizeof meta_path, p->dir, "metadata.yaml")) < 0 ||
        (err = ck_layout_read_meta(meta_path, &m)) < 0)
        return err;
    struct ck_pmf_ref ref = {r->ref_is_int != 0, strtoll(r->ref, NULL, 10),
                             r->ref_is_int ? NULL : r->ref};
    ptrdiff_t i = ck_pmf_find(&m, &ref);
    if (i >= 0 && (err = ck_pmf_unregister(&m, (size_t)i)) == 0 &&
        (err = ck_pmf_emit(&m, &out)) == 0)
        err = ck_write_file_atomic(meta_path, ck_buf_str(&out), out.len, 0644);
    ck_pmf_meta_release(&m);
    ck_buf_release(&out);
    return err;
}

/* checkpoint.deleted: store carries the stores holding its copies. */
static int emit_deleted(struct pass *p, const struct ck_retained *r, const char *where)
{
    struct ck_event ev;
    struct ck_ckpt_record rec;
    char meta_path[PATH_MAX];
    int err;
    if (!p->hooks)
        return 0;
    if ((err = ck_event_init(&ev, CK_EV_CHECKPOINT_DELETED)) < 0)
        return err;
    ev.dir = p->dir;
    ev.checkpoint = r->ref;
    ev.epoch = r->epoch;
    ev.path = r->path;
    ev.md5 = r->md5;
    ev.source = r->source[0] ? r->source : NULL;
    ev.store = where[0] ? where : "none";
    if (ck_state_ckpt_get(p->st, r->ref, &rec) == 0)
        ev.size = (int64_t)rec.size;
    struct ck_pmf_meta m;
    bool have = ck_path_join(meta_path, sizeof meta_path, p->dir, "metadata.yaml") == 0 &&
                ck_layout_read_meta(meta_path, &m) == 0;
    ck_error_clear();
    if (have) {
        ev.model_name = m.name;
        ev.model_id = m.id;
    }
    err = ck_hooks_emit(p->hooks, p->st->db, &ev);
    if (have)
        ck_pmf_meta_release(&m);
    return err;
}

/* From a recorded intent to done: the stores' metadata first (it must keep
 * the checkpoint before the local one drops it), the local metadata.yaml
 * (the local tree stays valid: it no longer names the files), the files,
 * then the record says deleted. Each step may run again after a kill. */
static int finish(struct pass *p, struct ck_retained *r)
{
    uint64_t freed = 0;
    int err;
    if ((err = ck_retention_remote_meta(p->st->db, p->dir)) < 0 || (err = unlist(p, r)) < 0 ||
        (err = delete_bytes(p, r, &freed)) < 0)
        return ck_error_wrap(err, "ref '%s'", r->ref);
    r->deleted = true;
    char where[1024] = "";
    for (const char *s = r->stores; *s;) {
        const char *nl = strchr(s, '\n');
        size_t l = nl ? (size_t)(nl - s) : strlen(s);
        snprintf(where + strlen(where), sizeof where - strlen(where), "%s%.*s",
                 where[0] ? "," : "", (int)l, s);
        s += l + (nl != NULL);
    }
    if ((err = ck_state_begin(p->st)) < 0)
        return err;
    if ((err = ck_state_retained_put(p->st, r)) < 0 ||
        (err = ck_state_ckpt_delete(p->st, r->ref)) < 0 || (err = emit_deleted(p, r, where)) < 0) {
        ck_state_rollback(p->st);
        return err;
    }
    if ((err = ck_state_commit(p->st)) < 0)
        return err;
    p->res->deleted++;
    p->res->freed += freed;
    ck_metrics_add(CK_M_CHECKPOINTS_DELETED, 1);
    ck_info("checkpoint.deleted", "checkpoint='%s' epoch=%lld bytes_freed=%llu copies=\"%s\"", r->ref,
            (long long)r->epoch, (unsigned long long)freed, where[0] ? where : "none");
    return 0;
}

static int finish_interrupted(struct pass *p)
{
    struct ck_retained *rows = NULL;
    size_t n = 0;
    int err = ck_state_retained_list(p->st->db, &rows, &n);
    if (err == CK_ENOENT)
        err = 0;
    for (size_t i = 0; i < n && err == 0; i++) {
        if (rows[i].deleted)
            continue;
        if (p->dry_run) {
            ck_info("retention.would_finish", "checkpoint='%s': an interrupted deletion", rows[i].ref);
            continue;
        }
        ck_info("retention.resumed", "checkpoint='%s': finishing an interrupted deletion", rows[i].ref);
        err = finish(p, &rows[i]);
    }
    ck_retained_list_free(rows, n);
    return err;
}

static bool someone_writes(struct pass *p, const struct item *it)
{
    char path[PATH_MAX];
    if (!p->cfg->watch_check_writers || !it->src)
        return false;
    for (size_t i = 0; i < it->src->nfiles; i++)
        if (ck_path_join(path, sizeof path, p->dir, it->src->files[i]) == 0 &&
            ck_settle_has_writer(path))
            return true;
    return false;
}

static bool commit_one(struct pass *p, const struct item *it, int64_t seq, const char *files,
                       const char *stores, int *errp);

/* Checks and deletes one checkpoint (with on_checked: hands it on); false
 * when it was held. */
static bool delete_one(struct pass *p, const struct item *it, int64_t seq, int *errp)
{
    struct ck_buf files = CK_BUF_INIT, stores = CK_BUF_INIT, checks = CK_BUF_INIT;
    bool done = false;
    if (p->dry_run) {
        ck_info("retention.would_delete", "checkpoint='%s' epoch=%lld path=%s", it->ref,
                (long long)it->cp->epoch, it->cp->path);
        p->res->would_delete++;
        return true;
    }
    if (someone_writes(p, it)) {
        ck_warn("retention.held", "checkpoint='%s': a process has it open for writing", it->ref);
        p->res->held++;
        return false;
    }
    if (tree_files(p, it, &files) < 0 || check_list(p, it, ck_buf_str(&files), &checks) < 0) {
        ck_warn("retention.held", "checkpoint='%s': %s", it->ref, ck_error_msg());
        ck_error_clear();
        p->res->held++;
        goto out;
    }
    if (p->stores_failing || !copies_checked(p, it, ck_buf_str(&checks))) {
        p->res->held++;
        goto out;
    }
    for (size_t i = 0; i < p->nstores; i++)
        ck_buf_printf(&stores, "%s\n", p->stores[i].url);
    if (p->on_checked) {
        struct ck_retention_checked c = {it->ref, it->cp->md5, ck_buf_str(&stores)};
        p->on_checked(p->on_checked_arg, &c);
        p->res->would_delete++;
        done = true;
        goto out;
    }
    done = commit_one(p, it, seq, ck_buf_str(&files), ck_buf_str(&stores), errp);
out:
    ck_buf_release(&files);
    ck_buf_release(&stores);
    ck_buf_release(&checks);
    return done;
}

/* Records the intent (before the first byte goes) and deletes. */
static bool commit_one(struct pass *p, const struct item *it, int64_t seq, const char *files,
                       const char *stores, int *errp)
{
    struct ck_retained r;
    bool done = false;
    memset(&r, 0, sizeof r);
    r.ref = strdup(it->ref);
    r.ref_is_int = it->cp->ref.is_int;
    r.epoch = it->cp->epoch;
    r.path = strdup(it->cp->path);
    snprintf(r.md5, sizeof r.md5, "%s", it->cp->md5);
    r.source = strdup(it->src ? it->src->rel : "");
    r.kind = it->src ? (int)it->src->kind : it->tree ? (int)it->tree->kind : (int)CK_CAND_FILE;
    char folder[PATH_MAX];
    if (!it->src && !it->tree && snprintf(folder, sizeof folder, "%s/data/checkpoints/%s", p->dir,
                                          it->ref) < (int)sizeof folder && ck_is_dir(folder))
        r.kind = CK_CAND_DIR; /* the trainer deleted its copy, discovery did not list ours */
    r.files = strdup(files);
    r.stores = strdup(stores);
    r.seq = seq;
    if (!r.ref || !r.path || !r.source || !r.files || !r.stores)
        *errp = ck_error(CK_ENOMEM, "out of memory");
    else if ((*errp = ck_state_retained_put(p->st, &r)) == 0 && (*errp = finish(p, &r)) == 0)
        done = true;
    ck_retained_release(&r);
    return done;
}

static int cmp_metric(const void *a, const void *b)
{
    const struct item *x = *(const struct item *const *)a, *y = *(const struct item *const *)b;
    return x->metric < y->metric ? -1 : x->metric > y->metric;
}

static int mark_best(struct pass *p, struct item *items, size_t n,
                     const struct ck_discovery *d)
{
    const struct ck_config *cfg = p->cfg;
    struct mtable table = {0};
    int err = 0;
    if (cfg->retention_metrics_file &&
        (err = read_metrics_file(cfg->retention_metrics_file, cfg->keep_best_metric, &table)) < 0) {
        ck_warn("retention.metrics_unread", "%s: keep_best holds every checkpoint", ck_error_msg());
        ck_error_clear();
        for (size_t i = 0; i < n; i++)
            items[i].keep = items[i].protect = true;
        return 0;
    }
    struct item **ranked = calloc(n ? n : 1, sizeof *ranked);
    size_t nr = 0;
    if (!ranked) {
        free(table.v);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        struct item *it = &items[i];
        const struct ck_candidate *c = it->src ? it->src : it->tree;
        char ts[PATH_MAX];
        if (cfg->retention_metrics_file)
            it->has_metric = metric_from_table(&table, c, it->cp->epoch, &it->metric);
        if (!it->has_metric)
            it->has_metric = metric_from_name(it->ref, cfg->keep_best_metric, &it->metric);
        if (!it->has_metric && c && c->kind == CK_CAND_DIR &&
            snprintf(ts, sizeof ts, "%s/%s/trainer_state.json", p->dir, c->rel) < (int)sizeof ts)
            it->has_metric = metric_from_trainer_state(ts, cfg->keep_best_metric, &it->metric);
        if (it->has_metric) {
            ranked[nr++] = it;
        } else {
            /* unknown: not ranked, and not deleted by keep_best */
            ck_debug("retention.no_metric", "checkpoint='%s' metric=%s: kept", it->ref,
                     cfg->keep_best_metric);
            it->keep = true;
        }
    }
    qsort(ranked, nr, sizeof *ranked, cmp_metric);
    bool max = cfg->keep_best_mode && !strcmp(cfg->keep_best_mode, "max");
    size_t count = cfg->keep_best_count > 0 ? (size_t)cfg->keep_best_count : 1;
    for (size_t k = 0; k < count && k < nr; k++) {
        struct item *it = ranked[max ? nr - 1 - k : k];
        it->keep = it->protect = true;
        ck_debug("retention.best", "checkpoint='%s' %s=%g", it->ref, cfg->keep_best_metric, it->metric);
    }
    (void)d;
    free(ranked);
    free(table.v);
    return 0;
}

/* The rules over metadata.yaml's checkpoints: items[i] for m's i-th, keep
 * and protect set. *out is the caller's to free. */
static int plan(struct pass *p, const struct ck_pmf_meta *m, const struct ck_discovery *d,
                struct item **out)
{
    const struct ck_config *cfg = p->cfg;
    size_t n = m->ncheckpoints;
    struct item *items = calloc(n ? n : 1, sizeof *items);
    int err = 0;
    *out = NULL;
    if (!items)
        return ck_error(CK_ENOMEM, "out of memory");
    bool count_rule = cfg->keep_last > 0 || cfg->keep_every > 0 || cfg->keep_best_metric;
    for (size_t i = 0; i < n; i++) {
        struct item *it = &items[i];
        it->cp = &m->checkpoints[i];
        ck_pmf_ref_str(&it->cp->ref, it->ref, sizeof it->ref);
        it->src = find_cand(d, it->ref, false);
        it->tree = find_cand(d, it->ref, true);
        bool latest = m->has_latest && ck_pmf_ref_equal(&m->latest, &it->cp->ref);
        it->protect = latest;
        it->keep = latest || !count_rule;
        if (cfg->keep_last > 0 && n - i <= (size_t)cfg->keep_last)
            it->keep = true;
        if (cfg->keep_every > 0 && it->cp->epoch % cfg->keep_every == 0)
            it->keep = true;
    }
    if (cfg->keep_best_metric && (err = mark_best(p, items, n, d)) < 0) {
        free(items);
        return err;
    }
    *out = items;
    return 0;
}

static int plan_and_delete(struct pass *p, const struct ck_pmf_meta *m,
                           const struct ck_discovery *d)
{
    const struct ck_config *cfg = p->cfg;
    size_t n = m->ncheckpoints;
    struct item *items = NULL;
    int err = plan(p, m, d, &items);
    if (err < 0)
        return err;
    /* the dry run and the watcher's helper delete nothing: what would go is assumed freed */
    bool simulate = p->dry_run || p->on_checked;
    /* count rules: oldest first */
    bool any = false;
    for (size_t i = 0; i < n; i++)
        any |= !items[i].keep;
    if (any && !p->dry_run && (err = open_stores(p)) < 0)
        goto out;
    for (size_t i = 0; i < n && err == 0; i++)
        if (!items[i].keep)
            delete_one(p, &items[i], (int64_t)i, &err);
    /* min_free: more, oldest first, never the latest nor a kept best */
    uint64_t free_bytes = 0;
    if (err == 0 && cfg->min_free > 0 && (err = ck_retention_free_bytes(p->dir, &free_bytes)) == 0 &&
        free_bytes < cfg->min_free) {
        ck_info("retention.low_space", "free_bytes=%llu min_free_bytes=%llu",
                (unsigned long long)free_bytes, (unsigned long long)cfg->min_free);
        uint64_t assumed = 0; /* simulated: what the deletions would free */
        for (size_t i = 0; i < n && err == 0 && free_bytes + assumed < cfg->min_free; i++) {
            if (items[i].protect || !items[i].keep)
                continue; /* protected, or taken or held by the count rules already */
            if (!p->dry_run && (err = open_stores(p)) < 0)
                break;
            struct ck_ckpt_record rec;
            if (delete_one(p, &items[i], (int64_t)i, &err) && simulate &&
                ck_state_ckpt_get(p->st, items[i].ref, &rec) == 0)
                assumed += rec.size;
            if (err == 0 && !simulate)
                err = ck_retention_free_bytes(p->dir, &free_bytes);
            if (p->stores_failing)
                break;
        }
        if (err == 0 && !simulate && free_bytes < cfg->min_free)
            ck_warn("retention.space_short",
                    "free_bytes=%llu min_free_bytes=%llu: nothing more may be deleted (the latest, the kept "
                    "best and the held stay)",
                    (unsigned long long)free_bytes, (unsigned long long)cfg->min_free);
    }
out:
    free(items);
    return err;
}

int ck_retention_resume(struct ck_state *st, const char *dir, const struct ck_config *cfg,
                        struct ck_hooks *hooks, struct ck_retention_result *res)
{
    struct pass p = {.st = st, .hooks = hooks, .dir = dir, .cfg = cfg, .res = res};
    memset(res, 0, sizeof *res);
    return finish_interrupted(&p);
}


/* ---- remote retention (retention.store) ---- */

/* What the stores hold: a checkpoint listed locally, or deleted locally
 * (its retention record) and not pruned yet. */
struct sitem {
    const char *ref; /* a record's, or lref */
    char lref[1024]; /* a local checkpoint's reference */
    int64_t epoch;
    bool local, keep;
    struct ck_retained *row; /* NULL when local */
    bool has_metric;
    double metric;
    size_t order;
};

static int cmp_sitem(const void *a, const void *b)
{
    const struct sitem *x = a, *y = b;
    if (x->epoch != y->epoch)
        return x->epoch < y->epoch ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static int cmp_smetric(const void *a, const void *b)
{
    const struct sitem *x = *(const struct sitem *const *)a, *y = *(const struct sitem *const *)b;
    return x->metric < y->metric ? -1 : x->metric > y->metric;
}

/* The store rules over what the stores hold: keep set on what stays. Local
 * checkpoints always stay (a local deletion needs the stores' copy first). */
static int store_plan(struct pass *p, struct sitem *v, size_t n)
{
    const struct ck_config *cfg = p->cfg;
    qsort(v, n, sizeof *v, cmp_sitem);
    for (size_t i = 0; i < n; i++) {
        if (v[i].local)
            v[i].ref = v[i].lref; /* moved by the sort */
        v[i].keep = v[i].local;
        if (cfg->store_keep_last > 0 && n - i <= (size_t)cfg->store_keep_last)
            v[i].keep = true;
        if (cfg->store_keep_every > 0 && v[i].epoch % cfg->store_keep_every == 0)
            v[i].keep = true;
    }
    if (!cfg->store_best_metric)
        return 0;
    struct mtable table = {0};
    if (cfg->retention_metrics_file &&
        read_metrics_file(cfg->retention_metrics_file, cfg->store_best_metric, &table) < 0) {
        ck_warn("retention.metrics_unread", "%s: retention.store.keep_best keeps every checkpoint",
                ck_error_msg());
        ck_error_clear();
        for (size_t i = 0; i < n; i++)
            v[i].keep = true;
        return 0;
    }
    struct sitem **ranked = calloc(n ? n : 1, sizeof *ranked);
    size_t nr = 0;
    if (!ranked) {
        free(table.v);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        struct sitem *it = &v[i];
        if (cfg->retention_metrics_file)
            it->has_metric = metric_from_table(&table, NULL, it->epoch, &it->metric);
        if (!it->has_metric)
            it->has_metric = metric_from_name(it->ref, cfg->store_best_metric, &it->metric);
        if (it->has_metric)
            ranked[nr++] = it;
        else
            it->keep = true; /* unknown: not pruned by keep_best */
    }
    qsort(ranked, nr, sizeof *ranked, cmp_smetric);
    bool max = cfg->store_best_mode && !strcmp(cfg->store_best_mode, "max");
    size_t count = cfg->store_best_count > 0 ? (size_t)cfg->store_best_count : 1;
    for (size_t k = 0; k < count && k < nr; k++)
        ranked[max ? nr - 1 - k : k]->keep = true;
    free(ranked);
    free(table.v);
    return 0;
}

/* Whether the store's metadata.yaml (read back now) lists ref; a store with
 * none lists nothing. */
static int store_lists(struct pass *p, struct store_slot *s, const struct ck_retained *r,
                       bool *listed)
{
    char tmp[PATH_MAX];
    struct ck_pmf_meta m;
    int err;
    *listed = true;
    if ((err = ck_path_join(tmp, sizeof tmp, p->st->dir, "retention-meta.tmp")) < 0)
        return err;
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return ck_error_os(CK_EIO, "cannot create '%s'", tmp);
    err = ck_store_get(s->store, "metadata.yaml", fd);
    close(fd);
    if (err == CK_ENOENT) {
        ck_error_clear();
        *listed = false;
        err = 0;
    } else if (err == 0 && (err = ck_layout_read_meta(tmp, &m)) == 0) {
        struct ck_pmf_ref ref = {r->ref_is_int != 0, strtoll(r->ref, NULL, 10),
                                 r->ref_is_int ? NULL : r->ref};
        *listed = ck_pmf_find(&m, &ref) >= 0;
        ck_pmf_meta_release(&m);
    }
    unlink(tmp);
    return err;
}

/* A pruning record's last steps: once no store's metadata.yaml lists it,
 * its files go from every store, then the record says pruned. */
static int prune_finish(struct pass *p, struct ck_retained *r)
{
    int err;
    for (size_t si = 0; si < p->nstores; si++) {
        bool listed;
        if ((err = store_lists(p, &p->stores[si], r, &listed)) < 0)
            goto failing;
        if (listed) {
            ck_debug("retention.prune_waiting",
                     "checkpoint='%s' store=\"%s\": its metadata.yaml lists it still", r->ref,
                     p->stores[si].url);
            p->res->prune_waiting++;
            return 0;
        }
    }
    for (size_t si = 0; si < p->nstores; si++)
        for (const char *f = r->files; *f;) {
            const char *nl = strchr(f, '\n');
            char key[PATH_MAX];
            snprintf(key, sizeof key, "%.*s", (int)(nl ? nl - f : (ptrdiff_t)strlen(f)), f);
            f = nl ? nl + 1 : f + strlen(f);
            if ((err = ck_store_del(p->stores[si].store, key)) < 0) {
                ck_error_wrap(err, "cannot delete '%s' from store '%s'", key, p->stores[si].url);
                goto failing;
            }
        }
    r->pruned = 2;
    if ((err = ck_state_retained_put(p->st, r)) < 0)
        return err;
    p->res->pruned++;
    ck_info("checkpoint.pruned", "checkpoint='%s' epoch=%lld: deleted from every store "
            "(retention.store)", r->ref, (long long)r->epoch);
    return 0;
failing:
    ck_warn("retention.store_failing", "%s; nothing is pruned while a store fails", ck_error_msg());
    ck_error_clear();
    p->stores_failing = true;
    return 0;
}

/* Remote retention: what the store rules let go is recorded (pruning), the
 * stores' metadata.yaml is written without it (the next upload sends it),
 * and once every store's metadata.yaml no longer lists it, its files go
 * from the stores. The store's tree is valid at every instant. */
static int prune(struct pass *p)
{
    const struct ck_config *cfg = p->cfg;
    char meta_path[PATH_MAX];
    struct ck_pmf_meta m;
    struct ck_retained *rows = NULL;
    size_t nrows = 0, n = 0, newly = 0;
    struct sitem *v = NULL;
    bool have_meta = false;
    int err;
    if (!ck_config_has_store_retention(cfg) || !cfg->n_upload_stores)
        return 0;
    if ((err = ck_path_join(meta_path, sizeof meta_path, p->dir, "metadata.yaml")) < 0 ||
        !ck_exists(meta_path))
        return err;
    if ((err = ck_layout_read_meta(meta_path, &m)) < 0)
        return err;
    have_meta = true;
    if ((err = ck_state_retained_list(p->st->db, &rows, &nrows)) == CK_ENOENT)
        err = 0;
    if (err < 0)
        goto out;
    if (!(v = calloc(m.ncheckpoints + nrows + 1, sizeof *v))) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nrows; i++) {
        struct ck_pmf_ref ref = {rows[i].ref_is_int != 0, strtoll(rows[i].ref, NULL, 10),
                                 rows[i].ref_is_int ? NULL : rows[i].ref};
        if (!rows[i].deleted || rows[i].pruned == 2 || ck_pmf_find(&m, &ref) >= 0)
            continue;
        v[n] = (struct sitem){.ref = rows[i].ref, .epoch = rows[i].epoch, .row = &rows[i],
                              .order = n};
        n++;
    }
    for (size_t i = 0; i < m.ncheckpoints; i++) {
        v[n] = (struct sitem){.epoch = m.checkpoints[i].epoch, .local = true, .order = n};
        v[n].ref = ck_pmf_ref_str(&m.checkpoints[i].ref, v[n].lref, sizeof v[n].lref);
        n++;
    }
    if ((err = store_plan(p, v, n)) < 0)
        goto out;
    for (size_t i = 0; i < n && err == 0; i++) {
        struct ck_retained *r = v[i].row;
        if (v[i].keep || !r || r->pruned)
            continue;
        if (p->dry_run) {
            ck_info("retention.would_prune", "checkpoint='%s' epoch=%lld: from every store", r->ref,
                    (long long)r->epoch);
            p->res->would_prune++;
            continue;
        }
        r->pruned = 1; /* the intent, before the stores' metadata.yaml drops it */
        if ((err = ck_state_retained_put(p->st, r)) == 0)
            newly++;
    }
    if (err < 0 || p->dry_run)
        goto out;
    bool any = false;
    for (size_t i = 0; i < nrows; i++)
        any |= rows[i].pruned == 1;
    if (!any)
        goto out;
    if (newly)
        ck_info("retention.pruning", "%zu checkpoint(s) leave the stores' metadata.yaml; their "
                "files go once every store has it", newly);
    if ((err = ck_retention_remote_meta(p->st->db, p->dir)) < 0 || (err = open_stores(p)) < 0)
        goto out;
    for (size_t i = 0; i < nrows && err == 0 && !p->stores_failing; i++)
        if (rows[i].pruned == 1)
            err = prune_finish(p, &rows[i]);
out:
    free(v);
    ck_retained_list_free(rows, nrows);
    if (have_meta)
        ck_pmf_meta_release(&m);
    return err;
}

static int run(struct pass *p)
{
    const struct ck_config *cfg = p->cfg;
    const char *dir = p->dir;
    struct ck_discovery d = {0};
    struct ck_pmf_meta m;
    char meta_path[PATH_MAX];
    bool have_meta = false;
    int err = 0;
    memset(p->res, 0, sizeof *p->res);
    uint64_t free_bytes;
    if (ck_retention_free_bytes(dir, &free_bytes) < 0)
        ck_error_clear();
    /* what a killed pass recorded is finished whatever the config says now
     * (the watcher's helper leaves that to the watcher) */
    if (!p->on_checked && (err = finish_interrupted(p)) < 0)
        goto out;
    if (!ck_config_has_retention(cfg))
        goto out;
    if (!cfg->n_upload_stores && !cfg->without_store) {
        err = ck_error(CK_ECONFIG, "retention: no store is configured and "
                                   "retention.without_store is not true: nothing is deleted");
        goto out;
    }
    if ((err = ck_path_join(meta_path, sizeof meta_path, dir, "metadata.yaml")) < 0 ||
        !ck_exists(meta_path))
        goto out;
    if ((err = ck_layout_read_meta(meta_path, &m)) < 0)
        goto out;
    have_meta = true;
    if ((err = ck_discover(dir, &cfg->ckpt, &d)) < 0)
        goto out;
    err = plan_and_delete(p, &m, &d);
    if (err == 0 && !p->stores_failing)
        err = prune(p);
    if (p->stores_failing && p->res->held)
        ck_warn("retention.held_all",
                "%zu checkpoint(s) kept on the local disk: a store did not answer or failed "
                "(see retention.store_failing)",
                p->res->held);
out:
    close_stores(p);
    if (have_meta)
        ck_pmf_meta_release(&m);
    ck_discovery_release(&d);
    if (ck_retention_free_bytes(dir, &free_bytes) < 0)
        ck_error_clear();
    return err;
}

int ck_retention_run(struct ck_state *st, const char *dir, const struct ck_config *cfg,
                     struct ck_hooks *hooks, bool dry_run, struct ck_retention_result *res)
{
    struct pass p = {.st = st, .hooks = hooks, .dir = dir, .cfg = cfg, .dry_run = dry_run, .res = res};
    return run(&p);
}

int ck_retention_check(struct ck_state *st, const char *dir, const struct ck_config *cfg,
                       ck_retention_checked_fn on_checked, void *arg,
                       struct ck_retention_result *res)
{
    struct pass p = {.st = st, .dir = dir, .cfg = cfg, .on_checked = on_checked,
                     .on_checked_arg = arg, .res = res};
    return run(&p);
}

int ck_retention_apply(struct ck_state *st, const char *dir, const struct ck_config *cfg,
                       struct ck_hooks *hooks, const struct ck_retention_checked *c,
                       struct ck_retention_result *res)
{
    struct pass p = {.st = st, .hooks = hooks, .dir = dir, .cfg = cfg, .res = res};
    struct ck_discovery d = {0};
    struct ck_pmf_meta m;
    struct item *items = NULL;
    const struct item *it = NULL;
    struct ck_buf files = CK_BUF_INIT;
    uint64_t free_bytes = UINT64_MAX;
    char meta_path[PATH_MAX];
    int err;
    memset(res, 0, sizeof *res);
    if (!ck_config_has_retention(cfg))
        return 0; /* a reload took the keys away since the check */
    if ((err = ck_path_join(meta_path, sizeof meta_path, dir, "metadata.yaml")) < 0 ||
        (err = ck_layout_read_meta(meta_path, &m)) < 0)
        return err;
    if ((err = ck_discover(dir, &cfg->ckpt, &d)) < 0 || (err = plan(&p, &m, &d, &items)) < 0)
        goto out;
    for (size_t i = 0; i < m.ncheckpoints && !it; i++)
        if (!strcmp(items[i].ref, c->ref))
            it = &items[i];
    if (it && it->keep && !it->protect && cfg->min_free > 0 &&
        ck_retention_free_bytes(dir, &free_bytes) < 0)
        ck_error_clear();
    if (!it) {
        ck_debug("retention.gone", "checkpoint='%s': no longer listed", c->ref);
    } else if (strcmp(it->cp->md5, c->md5)) {
        /* written again since its copies were checked: the next check decides */
        ck_info("retention.changed", "checkpoint='%s': its MD5 changed since its copies were checked",
                c->ref);
        res->held++;
    } else if (it->protect || (it->keep && !(cfg->min_free > 0 && free_bytes < cfg->min_free))) {
        ck_debug("retention.kept", "checkpoint='%s': the rules keep it now", c->ref);
    } else if (someone_writes(&p, it)) {
        ck_warn("retention.held", "checkpoint='%s': a process has it open for writing", it->ref);
        res->held++;
    } else if (tree_files(&p, it, &files) < 0) {
        ck_warn("retention.held", "checkpoint='%s': %s", it->ref, ck_error_msg());
        ck_error_clear();
        res->held++;
    } else {
        commit_one(&p, it, (int64_t)(it - items), ck_buf_str(&files), c->stores, &err);
    }
out:
    ck_buf_release(&files);
    free(items);
    ck_pmf_meta_release(&m);
    ck_discovery_release(&d);
    if (ck_retention_free_bytes(dir, &free_bytes) < 0)
        ck_error_clear();
    return err;
}

/* ---- fetch ---- */

/* The MD5 a manifest ("MD5  NAME" lines, NAME relative to data/checkpoints/)
 * gives for name, into out; false when it lists no such name. */
static bool manifest_md5(const char *manifest, const char *name, char out[33])
{
    size_t nl = strlen(name);
    for (const char *line = manifest; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len == 34 + nl && line[32] == ' ' && line[33] == ' ' && !memcmp(line + 34, name, nl)) {
            memcpy(out, line, 32);
            out[32] = '\0';
            return ck_pmf_md5_is_valid(out);
        }
        line = end ? end + 1 : NULL;
    }
    return false;
}

/* Every file of r from one store into temporaries beside their final names
 * under dest, each MD5-checked; renamed into place only when all are. */
static int fetch_from(struct pass *p, struct store_slot *s, const struct ck_retained *r,
                      const char *dest, size_t *nfiles)
{
    struct ck_buf manifest = CK_BUF_INIT;
    struct ck_strlist names = {0}; /* the final names of the temporaries made */
    int err = 0;
    *nfiles = 0;
    for (const char *f = r->files; *f && err == 0;) {
        const char *nl = strchr(f, '\n');
        char key[PATH_MAX], final[PATH_MAX], tmp[PATH_MAX + 32], dir[PATH_MAX], want[33];
        snprintf(key, sizeof key, "%.*s", (int)(nl ? nl - f : (ptrdiff_t)strlen(f)), f);
        f = nl ? nl + 1 : f + strlen(f);
        if (strncmp(key, "data/checkpoints/", 17) || strstr(key, "..")) {
            err = ck_error(CK_EFORMAT, "ref '%s': '%s' is not a checkpoint file", r->ref, key);
            break;
        }
        if ((err = ck_path_join(final, sizeof final, dest, key + 17)) < 0)
            break;
        snprintf(tmp, sizeof tmp, "%s.ckptd-fetch", final);
        ck_dirname(dir, sizeof dir, final);
        if ((err = ck_mkdirs(dir, 0755)) < 0)
            break;
        int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            err = ck_error_os(CK_EIO, "cannot create '%s'", tmp);
            break;
        }
        if ((err = ck_strlist_add(&names, final)) == 0)
            err = ck_store_get(s->store, key, fd);
        if (err == 0 && fsync(fd) < 0)
            err = ck_error_os(CK_EIO, "cannot fsync '%s'", tmp);
        close(fd);
        struct ck_digests d;
        if (err < 0 || (err = ck_hash_file(tmp, CK_HASH_MD5, &d, NULL)) < 0)
            break;
        /* the PMF path: metadata.yaml's MD5; a folder's files: its manifest's */
        bool is_pmf = !strcmp(key, r->path);
        if (is_pmf)
            snprintf(want, sizeof want, "%s", r->md5);
        else if (!manifest_md5(ck_buf_str(&manifest), key + 17, want))
            want[0] = '\0';
        if (strcmp(d.md5, want)) {
            err = ck_error(CK_ECHANGED, "'%s' from store '%s': MD5 %s, %s %s", key, s->url,
                           d.md5, is_pmf ? "metadata.yaml records" : "its manifest says",
                           want[0] ? want : "nothing");
            break;
        }
        if (is_pmf && r->kind != CK_CAND_FILE &&
            (err = ck_read_file(tmp, 64u << 20, &manifest)) < 0)
            break;
    }
    for (size_t i = 0; i < names.n; i++) {
        char tmp[PATH_MAX + 32];
        snprintf(tmp, sizeof tmp, "%s.ckptd-fetch", names.items[i]);
        if (err == 0 && rename(tmp, names.items[i]) < 0)
            err = ck_error_os(CK_EIO, "cannot rename '%s'", tmp);
        if (err < 0)
            unlink(tmp);
    }
    *nfiles = err == 0 ? names.n : 0;
    ck_strlist_release(&names);
    ck_buf_release(&manifest);
    return err;
}

int ck_retention_fetch(struct ck_state *st, const char *dir, const struct ck_config *cfg,
                       const char *ref, const char *dest, size_t *nfiles)
{
    struct ck_retention_result res;
    struct pass p = {.st = st, .dir = dir, .cfg = cfg, .res = &res};
    struct ck_retained *rows = NULL, *r = NULL;
    size_t n = 0;
    int err = ck_state_retained_list(st->db, &rows, &n);
    *nfiles = 0;
    if (err == CK_ENOENT)
        err = 0;
    for (size_t i = 0; err == 0 && i < n && !r; i++)
        if (!strcmp(rows[i].ref, ref))
            r = &rows[i];
    if (err == 0 && !r)
        err = ck_error(CK_ENOENT, "'%s': retention deleted no checkpoint '%s' (one in "
                                  "metadata.yaml is in data/checkpoints/)", dir, ref);
    if (err == 0 && r->pruned == 2)
        err = ck_error(CK_ENOENT, "'%s': '%s' was pruned from the stores too (retention.store): "
                                  "no copy is left", dir, ref);
    if (err == 0 && !r->stores[0])
        err = ck_error(CK_ENOENT, "'%s': '%s' was deleted with retention.without_store: no "
                                  "store holds it", dir, ref);
    if (err == 0)
        err = open_stores(&p);
    /* the stores that held checked copies when it was deleted, in config order */
    bool tried = false;
    for (size_t i = 0; err == 0 && i < p.nstores && !*nfiles; i++) {
        struct store_slot *s = &p.stores[i];
        char line[600];
        snprintf(line, sizeof line, "%s\n", s->url);
        if (s->failing || !strstr(r->stores, line))
            continue;
        tried = true;
        if (fetch_from(&p, s, r, dest, nfiles) < 0) {
            ck_warn("fetch.store_failed", "store=\"%s\" checkpoint='%s': %s", s->url, ref, ck_error_msg());
            ck_error_clear();
        }
    }
    if (err == 0 && !*nfiles)
        err = ck_error(CK_ENET, "'%s': no configured store gave '%s' back whole%s", dir, ref,
                       tried ? " (see the warnings)" : ": none of the stores that hold it is "
                                                       "configured now");
    close_stores(&p);
    ck_retained_list_free(rows, n);
    return err;
}
