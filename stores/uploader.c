#include "stores/uploader.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/strlist.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/yamlutil.h"
#include "stores/bundle.h"
#include "stores/net.h"
#include "common/pidlock.h"
#include "common/text.h"
#include "stores/pmftree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_TREE_FILES 100000

/* ck_uploader_enqueue_file with path's stat as the caller saw it (NULL: now)
 * and the checkpoint it is part of (NULL: none). */
static int enqueue_file_as(sqlite3 *db, const struct ck_store_spec *store, const char *path,
                           const char *key, int phase, const struct stat *known, const char *ckpt,
                           bool *added);

int ck_uploader_enqueue_file(sqlite3 *db, const struct ck_store_spec *store, const char *path,
                             const char *key, int phase, bool *added)
{
    return enqueue_file_as(db, store, path, key, phase, NULL, NULL, added);
}

int ck_uploader_enqueue_checkpoint(sqlite3 *db, const struct ck_store_spec *store,
                                   const char *path, const char *key, const char *ckpt,
                                   bool *added)
{
    return enqueue_file_as(db, store, path, key, 0, NULL, ckpt, added);
}

static int enqueue_file_as(sqlite3 *db, const struct ck_store_spec *store, const char *path,
                           const char *key, int phase, const struct stat *known, const char *ckpt,
                           bool *added)
{
    int64_t sid, id;
    int err;
    *added = false;
    if ((err = ck_store_check(store)) < 0)
        return err;
    if ((err = ck_queue_store_put(db, store, &sid)) < 0)
        return err;
    bool zst = false;
    size_t kl = strlen(key);
    char zkey[4096];
    if (store->compress && phase == 0 && !(kl > 4 && !strcmp(key + kl - 4, ".zst"))) {
        snprintf(zkey, sizeof zkey, "%s.zst", key);
        zst = true;
    }
    if ((err = ck_queue_add_as(db, sid, path, zst ? zkey : key, phase,
                               zst ? CK_JOB_ZSTD : CK_JOB_FILE, known, &id, added)) < 0)
        return err;
    if (*added && ckpt && (err = ck_queue_set_checkpoint(db, id, ckpt)) < 0)
        return err;
    if (*added)
        ck_info("upload.queued", "job=%lld key=\"%s\" phase=%d%s%s%s", (long long)id,
                zst ? zkey : key, phase, ckpt ? " checkpoint='" : "", ckpt ? ckpt : "",
                ckpt ? "'" : "");
    return 0;
}

static bool skip_name(const char *name)
{
    size_t n = strlen(name);
    return name[0] == '.' || (n > 4 && !strcmp(name + n - 4, ".tmp")) ||
           (n > 5 && !strcmp(name + n - 5, ".part"));
}

static int names_add(struct ck_strlist *l, const char *s)
{
    if (l->n >= MAX_TREE_FILES)
        return ck_error(CK_ESIZE, "more than %d files to upload", MAX_TREE_FILES);
    return ck_strlist_add(l, s);
}

static int list_tree(const char *root, const char *rel, struct ck_strlist *out, int depth)
{
    char path[4096];
    int err = 0;
    if (depth > 64)
        return ck_error(CK_ESIZE, "'%s': folders nested too deep", root);
    snprintf(path, sizeof path, "%s%s%s", root, *rel ? "/" : "", rel);
    DIR *d = opendir(path);
    if (!d)
        return ck_error_os(CK_EIO, "cannot list '%s'", path);
    /* inside a folder checkpoint a dot name is the trainer's (DCP's .metadata,
     * listed in the folder's manifest): it goes with the folder */
    bool in_folder_ckpt = !strncmp(rel, "data/checkpoints/", 17);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (in_folder_ckpt && e->d_name[0] == '.' && strcmp(e->d_name, ".") &&
            strcmp(e->d_name, "..") && !ck_is_own_temporary(e->d_name)) {
            /* taken below */
        } else if (skip_name(e->d_name)) {
            continue;
        }
        char sub[4096], full[8192];
        snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        snprintf(full, sizeof full, "%s/%s", root, sub);
        struct stat st;
        if (lstat(full, &st) < 0)
            continue;
        if (S_ISDIR(st.st_mode))
            err = list_tree(root, sub, out, depth + 1);
        else if (S_ISREG(st.st_mode) && strcmp(sub, "metadata.yaml"))
            err = names_add(out, sub);
        if (err < 0)
            break;
    }
    closedir(d);
    return err;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int enqueue(sqlite3 *db, const struct ck_store_spec *stores, size_t nstores,
                   const char *root, const char *const *changed, size_t nchanged,
                   enum ck_job_kind bundle_kind, const struct stat *meta_st, int *queued);

int ck_uploader_enqueue_tree(sqlite3 *db, const struct ck_store_spec *stores, size_t nstores,
                             const char *root, const char *const *changed, size_t nchanged,
                             int *queued)
{
    /* a PMF tree (metadata.yaml and data/) sends the tree only, never the
     * trainer's files beside it (issue 17); any other folder goes whole */
    char meta[4200], data[4200];
    snprintf(meta, sizeof meta, "%s/metadata.yaml", root);
    snprintf(data, sizeof data, "%s/data", root);
    if (!changed && ck_exists(meta) && ck_is_dir(data))
        return ck_uploader_enqueue_pmf(db, stores, nstores, root, true, queued);
    return enqueue(db, stores, nstores, root, changed, nchanged, CK_JOB_BUNDLE, NULL, queued);
}

/* A tree is queued in batches (stores/queue.h): one fsync per tree instead
 * of one per file (64 files took 64 fsyncs before the first byte went). A
 * batch holds the queue's write lock, so it is committed and a new one begun
 * once it is a second old: the workers claiming jobs meanwhile never wait
 * long. *open says whether a batch is open when this returns. */
static int batch_renew(sqlite3 *db, long long *t0, bool *open)
{
    int err = 0;
    if (*open && ck_mono_ms() - *t0 < 1000)
        return 0;
    if (*open) {
        *open = false;
        if ((err = ck_queue_batch_end(db, 0)) < 0)
            return err;
    }
    if ((err = ck_queue_batch_begin(db)) == 0)
        *open = true;
    *t0 = ck_mono_ms();
    return err;
}

/* The metadata.yaml to send, as it is before the data is listed (meta_st,
 * when the caller listed the data itself, or now): a metadata.yaml written
 * meanwhile may name a checkpoint the listing missed; queued as it was, it is
 * seen changed when sent and the tree is queued again first
 * (metadata_requeued). Returns whether there is one. */
static bool meta_before_listing(const char *root, char *meta, size_t metasz, struct stat *st)
{
    ck_pmftree_meta_source(root, meta, metasz);
    return stat(meta, st) == 0;
}

static int enqueue(sqlite3 *db, const struct ck_store_spec *stores, size_t nstores,
                   const char *root, const char *const *changed, size_t nchanged,
                   enum ck_job_kind bundle_kind, const struct stat *meta_st, int *queued)
{
    struct ck_strlist files = {0};
    char meta[4096], full[8192];
    struct stat mst;
    int err = 0;
    bool added;
    *queued = 0;
    bool has_meta = meta_before_listing(root, meta, sizeof meta, &mst);
    if (meta_st)
        mst = *meta_st;
    has_meta = has_meta || meta_st;
    struct ck_pmftree_ckpts ckpts = {0};
    if (has_meta)
        ck_pmftree_checkpoints(meta, &ckpts);
    if (!changed) {
        if ((err = list_tree(root, "", &files, 0)) < 0)
            goto out;
        qsort(files.items, files.n, sizeof *files.items, cmp_str);
    } else {
        for (size_t i = 0; i < nchanged; i++)
            if (strcmp(changed[i], "metadata.yaml") && (err = names_add(&files, changed[i])) < 0)
                goto out;
    }
    long long batch_t0 = 0;
    bool batch = false;
    if ((err = batch_renew(db, &batch_t0, &batch)) < 0)
        goto end;
    for (size_t s = 0; s < nstores; s++) {
        const struct ck_store_spec *st = &stores[s];
        if (st->bundle) {
            char real[4096], key[4200];
            int64_t sid, id;
            if (!realpath(root, real))
                snprintf(real, sizeof real, "%s", root);
            snprintf(key, sizeof key, "%s.tar.zst", ck_basename(real));
            if ((err = ck_store_check(st)) < 0 || (err = ck_queue_store_put(db, st, &sid)) < 0 ||
                (err = ck_queue_add(db, sid, root, key, 0, bundle_kind, &id, &added)) < 0)
                goto end;
            *queued += added;
            continue;
        }
        for (size_t i = 0; i < files.n; i++) {
            snprintf(full, sizeof full, "%s/%s", root, files.items[i]);
            const char *ckpt = ck_pmftree_checkpoint_of(&ckpts, files.items[i]);
            if ((err = enqueue_file_as(db, st, full, files.items[i], 0, NULL, ckpt, &added)) <
                    0 ||
                (err = batch_renew(db, &batch_t0, &batch)) < 0)
                goto end;
            *queued += added;
        }
        if (has_meta) {
            if ((err = enqueue_file_as(db, st, meta, "metadata.yaml", 1, &mst, NULL, &added)) < 0)
                goto end;
            *queued += added;
        }
    }
end:
    if (batch)
        err = ck_queue_batch_end(db, err);
out:
    ck_pmftree_checkpoints_release(&ckpts);
    ck_strlist_release(&files);
    return err;
}

/* model.configuration.path of root/metadata.yaml into out ("" when none,
 * or when it is not a plain relative path inside the tree). */
static void pmf_config_path(const char *root, char *out, size_t outsz)
{
    char path[4200];
    struct ck_buf b = CK_BUF_INIT;
    struct ck_yaml_doc doc;
    out[0] = '\0';
    snprintf(path, sizeof path, "%s/metadata.yaml", root);
    if (ck_read_file(path, 16u << 20, &b) < 0 ||
        ck_yaml_load(&doc, path, ck_buf_str(&b), b.len) < 0) {
        ck_buf_release(&b);
        ck_error_clear();
        return;
    }
    yaml_node_t *n = ck_yaml_root(&doc);
    static const char *const walk[] = {"model", "configuration", "path"};
    for (size_t w = 0; n && w < 3; w++) {
        yaml_node_t *next = NULL;
        if (n->type == YAML_MAPPING_NODE)
            for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
                 p++) {
                yaml_node_t *k = ck_yaml_node(&doc, p->key);
                if (k && k->type == YAML_SCALAR_NODE &&
                    !strcmp((char *)k->data.scalar.value, walk[w]))
                    next = ck_yaml_node(&doc, p->value);
            }
        n = next;
    }
    if (n && n->type == YAML_SCALAR_NODE) {
        const char *v = (const char *)n->data.scalar.value;
        if (v[0] && v[0] != '/' && !strstr(v, "..") && strlen(v) < outsz)
            snprintf(out, outsz, "%s", v);
    }
    ck_yaml_release(&doc);
    ck_buf_release(&b);
}

/* The files of the PMF tree at root, metadata.yaml not included; data/deploy/
 * only when with_deploy (see ck_uploader_enqueue_pmf). */
static int pmf_files(const char *root, bool with_deploy, struct ck_strlist *files)
{
    char data[4200], cfgrel[4096], full[8300];
    int err = 0;
    snprintf(data, sizeof data, "%s/data", root);
    if (ck_is_dir(data) && (err = list_tree(root, "data", files, 0)) < 0)
        return err;
    /* data/deploy/ holds the pipeline's deployment archives: the pipeline
     * queues them itself, each once it passed verification (agent/deploy.h) */
    size_t kept = 0;
    for (size_t i = 0; i < files->n; i++) {
        if (!with_deploy && !strncmp(files->items[i], "data/deploy/", 12))
            free(files->items[i]);
        else
            files->items[kept++] = files->items[i];
    }
    files->n = kept;
    qsort(files->items, files->n, sizeof *files->items, cmp_str);
    pmf_config_path(root, cfgrel, sizeof cfgrel);
    snprintf(full, sizeof full, "%s/%s", root, cfgrel);
    if (cfgrel[0] && strncmp(cfgrel, "data/", 5) && ck_exists(full) && !ck_is_dir(full))
        err = names_add(files, cfgrel);
    return err;
}

int ck_uploader_enqueue_pmf(sqlite3 *db, const struct ck_store_spec *stores, size_t nstores,
                            const char *root, bool with_deploy, int *queued)
{
    struct ck_strlist files = {0};
    int err;
    bool wrote;
    *queued = 0;
    /* an empty data/initialisation/ would not survive the trip (pmftree.h) */
    if (ck_pmftree_mark_empty_init(root, &wrote) < 0) {
        ck_warn("upload.init_readme", "error=\"%s\": the remote copy will lack "
                "data/initialisation/", ck_error_msg());
        ck_error_clear();
    } else if (wrote) {
        ck_info("upload.init_readme", "path=\"%s/%s\"", root, CK_PMFTREE_INIT_README);
    }
    char meta[4096];
    struct stat mst;
    bool has_meta = meta_before_listing(root, meta, sizeof meta, &mst);
    if ((err = pmf_files(root, with_deploy, &files)) < 0)
        goto out;
#ifndef NDEBUG
    /* Debug builds only (the tests'): a listing that takes long, so that a
     * pass writes a newer metadata.yaml meanwhile (no release binary has this) */
    const char *fault = getenv("CKPTD_TEST_FAULT");
    if (fault && !strcmp(fault, "slow-listing"))
        usleep(700000);
#endif
    err = enqueue(db, stores, nstores, root, (const char *const *)files.items, files.n,
                  CK_JOB_BUNDLE_PMF, has_meta ? &mst : NULL, queued);
out:
    ck_strlist_release(&files);
    return err;
}

/* ---- running ---- */

struct progress {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool quit;
    void (*fn)(void *arg, const struct ck_upload_progress *p); /* NULL: log lines */
    void *arg;
    struct ck_xfer *x; /* the transfer being shown, or NULL */
    uint64_t total;
    char key[256];
    long long t0;
};

static void show(struct progress *p, bool final)
{
    uint64_t sent = atomic_load(&p->x->sent);
    double secs = (double)(ck_mono_ms() - p->t0) / 1000.0;
    double rate = secs > 0 ? (double)sent / secs : 0;
    int pct = p->total ? (int)((double)sent * 100.0 / (double)p->total) : 100;
    if (pct > 100)
        pct = 100;
    if (p->fn) {
        struct ck_upload_progress pr = {p->key, sent, p->total, rate, pct, final};
        p->fn(p->arg, &pr);
    } else if (!final) {
        char r[32];
        ck_text_bytes(r, sizeof r, rate);
        ck_info("upload.progress",
                "key=\"%s\" sent=%llu total=%llu percent=%d bytes_per_second=%.0f: %s/s", p->key,
                (unsigned long long)sent, (unsigned long long)p->total, pct, rate, r);
    }
}

static void *progress_thread(void *arg)
{
    struct progress *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->quit) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ms = p->fn ? 200 : 5000;
        ts.tv_sec += ms / 1000;
        ts.tv_nsec += (ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        if (!p->quit && p->x)
            show(p, false);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void progress_set(struct progress *p, struct ck_xfer *x, const char *key, uint64_t total)
{
    pthread_mutex_lock(&p->mu);
    if (x && p->x && p->x != x) {
        /* several transfers: the one shown stays until it ends */
        pthread_mutex_unlock(&p->mu);
        return;
    }
    if (!x && p->x && p->fn)
        show(p, true);
    p->x = x;
    p->total = total;
    p->t0 = ck_mono_ms();
    snprintf(p->key, sizeof p->key, "%s", key ? key : "");
    pthread_mutex_unlock(&p->mu);
}

/* Transfer x ended: the bar stops showing it (another may be shown instead). */
static void progress_end(struct progress *p, struct ck_xfer *x)
{
    pthread_mutex_lock(&p->mu);
    bool shown = p->x == x;
    pthread_mutex_unlock(&p->mu);
    if (shown)
        progress_set(p, NULL, NULL, 0);
}

/* Opened stores by queue store id (a run rarely has more than a few). */
struct opened {
    int64_t id;
    struct ck_store_spec spec;
    struct ck_store *store;
    int err;
    char msg[512];
    bool gone; /* nobody answered there: this run leaves its jobs queued */
};

struct run {
    sqlite3 *db; /* one connection (NOMUTEX): every use holds mu */
    const struct ck_upload_opts *opts;
    const struct ck_uploader_run_opts *ro; /* may be NULL */
    const char *spool_dir;
    struct ck_net net;
    struct opened **stores; /* each allocated once: open stores borrow their spec */
    size_t nstores;
    /* parallel transfers (upload.transfers): the workers share the queue */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a job ended: blocked jobs (metadata) may be claimable */
    int active;        /* workers running a job */
    int fatal;         /* the queue itself failed: every worker stops */
    char fatal_msg[1024];
    struct ck_upload_ctl *ctl;
    struct progress *pg;
    int attempts_max;
    /* upload.transfers: bodies that may be in flight now. A worker takes one
     * before it claims a job and gives it back when the store says the body
     * has gone (ck_xfer_body_sent), so twice as many workers as transfers
     * run: a file's tail (MOVE, HEAD, fsync, the queue's bookkeeping) runs
     * beside the next file's body. */
    int bodies_free;
    int64_t depth_at; /* ck_mono_ms of the last ckptd_upload_queue_depth */
};

static void db_lock(struct run *r)
{
    pthread_mutex_lock(&r->mu);
}

static void db_unlock(struct run *r)
{
    pthread_mutex_unlock(&r->mu);
}

/* Called with r->mu held: a store is opened once per run, by the first
 * worker that needs it (credentials may take a network round trip). */
static int get_store(struct run *r, int64_t id, struct ck_store **out)
{
    for (size_t i = 0; i < r->nstores; i++)
        if (r->stores[i]->id == id) {
            *out = r->stores[i]->store;
            return r->stores[i]->err ? ck_error(r->stores[i]->err, "%s", r->stores[i]->msg) : 0;
        }
    struct opened **v = realloc(r->stores, (r->nstores + 1) * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    r->stores = v;
    struct opened *o = calloc(1, sizeof *o);
    if (!o)
        return ck_error(CK_ENOMEM, "out of memory");
    v[r->nstores++] = o;
    o->id = id;
    int err = ck_queue_store_get(r->db, id, &o->spec);
    if (err == 0)
        err = ck_store_open(&o->store, &o->spec, &r->net);
    if (err < 0) {
        o->err = err;
        snprintf(o->msg, sizeof o->msg, "%s", ck_error_msg());
    }
    *out = o->store;
    return err;
}

struct cb {
    struct run *r;
    int64_t id;
    bool body_held; /* this job holds one of bodies_free (guarded by r->mu) */
};

/* Called with r->mu held: waits for r->cv (a job ended, a body slot was
 * given back) for 200 ms at most, so that the caller rechecks stop. */
static void wait_a_little(struct run *r)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200000000L;
    if (ts.tv_nsec >= 1000000000L)
        ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

static void body_sent(void *ctx)
{
    struct cb *c = ctx;
    db_lock(c->r);
    if (c->body_held) {
        c->body_held = false;
        c->r->bodies_free++;
        pthread_cond_broadcast(&c->r->cv);
    }
    db_unlock(c->r);
}

static int body_again(void *ctx)
{
    struct cb *c = ctx;
    struct run *r = c->r;
    int err = 0;
    db_lock(r);
    while (!c->body_held) {
        if (ck_upload_ctl_stopping(r->ctl)) {
            err = ck_error(CK_ENET, "stopping");
            break;
        }
        if (r->bodies_free > 0) {
            r->bodies_free--;
            c->body_held = true;
            break;
        }
        wait_a_little(r);
    }
    db_unlock(r);
    return err;
}

static int save_upload(void *ctx, const char *upload_id, uint64_t part_size)
{
    struct cb *c = ctx;
    db_lock(c->r);
    int err = ck_queue_set_upload(c->r->db, c->id, upload_id, part_size);
    db_unlock(c->r);
    return err;
}

static int save_part(void *ctx, const struct ck_part *p)
{
    struct cb *c = ctx;
    db_lock(c->r);
    int err = ck_queue_add_part(c->r->db, c->id, p);
    db_unlock(c->r);
    return err;
}

/* Makes the file to send for a compressed or bundled job (once: a spool
 * file that survived a crash is reused, so resumed parts still match). */
static int prepare_spool(struct run *r, struct ck_job *j)
{
    char path[4096];
    struct stat st;
    int err;
    if (j->spool && stat(j->spool, &st) == 0 && (uint64_t)st.st_size == j->size)
        return 0;
    if ((err = ck_mkdirs(r->spool_dir, 0700)) < 0)
        return err;
    snprintf(path, sizeof path, "%s/job-%lld%s", r->spool_dir, (long long)j->id,
             j->kind == CK_JOB_ZSTD ? ".zst" : ".tar.zst");
    uint64_t size = 0;
    char orig[65] = "";
    if (j->kind == CK_JOB_BUNDLE || j->kind == CK_JOB_BUNDLE_PMF) {
        int n;
        if (j->kind == CK_JOB_BUNDLE) {
            err = ck_bundle_write(j->src, path, 3, 0, &n);
        } else {
            struct ck_strlist files = {0};
            char meta[4200];
            snprintf(meta, sizeof meta, "%s/metadata.yaml", j->src);
            if ((err = pmf_files(j->src, false, &files)) == 0 &&
                (!ck_exists(meta) || (err = names_add(&files, "metadata.yaml")) == 0))
                err = ck_bundle_write_files(j->src, (const char *const *)files.items, files.n, path, 3,
                                            0, &n);
            ck_strlist_release(&files);
        }
        if (err < 0)
            return err;
        if (stat(path, &st) < 0)
            return ck_error_os(CK_EIO, "cannot stat '%s'", path);
        size = (uint64_t)st.st_size;
        ck_info("upload.bundled", "job=%lld files=%d bytes=%llu", (long long)j->id, n,
                (unsigned long long)size);
    } else {
        if ((err = ck_zstd_file(j->src, path, 3, 0, orig, &size)) < 0)
            return err;
    }
    db_lock(r);
    if ((err = ck_queue_set_upload(r->db, j->id, "", 0)) == 0)
        err = ck_queue_set_spool(r->db, j->id, path, size, orig);
    db_unlock(r);
    if (err < 0)
        return err;
    free(j->spool);
    j->spool = strdup(path);
    j->size = size;
    j->upload_id[0] = '\0';
    j->part_size = 0;
    snprintf(j->orig_sha256, sizeof j->orig_sha256, "%s", orig);
    return j->spool ? 0 : ck_error(CK_ENOMEM, "out of memory");
}

/* A PMF tree's metadata.yaml that changed since it was queued may name
 * checkpoints queued after it, or not queued yet (the watcher wrote it
 * while this round ran): sent as it is now, it would reach the store before
 * them. So the tree is queued again for this job's store: the new data
 * files get jobs, and metadata.yaml a new one behind them (stores/queue.c
 * replaces a pending job), which this run sends once they are done. True
 * when that was done (the job is no longer this worker's). */
static bool metadata_requeued(struct run *r, struct ck_job *j, int *err)
{
    struct stat st;
    char root[4096];
    *err = 0;
    if (j->kind != CK_JOB_FILE || j->phase != 1 ||
        !ck_pmftree_root_of_meta(j->src, root, sizeof root) || stat(j->src, &st) < 0 ||
        ((uint64_t)st.st_size == j->size && ck_mtime_ns(&st) == j->mtime_ns))
        return false;
    db_lock(r);
    const struct ck_store_spec *spec = NULL;
    for (size_t i = 0; i < r->nstores; i++)
        if (r->stores[i]->id == j->store_id)
            spec = &r->stores[i]->spec;
    int queued = 0;
    if (spec && (*err = ck_queue_requeue(r->db, j->id, NULL)) == 0)
        *err = ck_uploader_enqueue_pmf(r->db, spec, 1, root, false, &queued);
    db_unlock(r);
    if (!spec)
        return false;
    if (*err == 0)
        ck_info("upload.metadata_changed",
                "job=%lld path=\"%s\": changed since it was queued; the tree is queued again "
                "(%d job(s)), metadata.yaml after its data",
                (long long)j->id, j->src, queued);
    return true;
}

/* metadata.yaml is sent from a copy taken from one open descriptor whose size
 * and mtime are the queued ones: a metadata.yaml replaced between the check
 * (metadata_requeued) and the send could name data not queued yet. *changed:
 * it is not the queued one any more (the caller queues the tree again). */
/* " checkpoint='REF'" when the job's file is part of a checkpoint, else "":
 * one grep finds a checkpoint's registration, archives and uploads. */
static const char *ckpt_field(const struct ck_job *j, char *buf, size_t n)
{
    snprintf(buf, n, "%s%s%s", j->checkpoint ? " checkpoint='" : "",
             j->checkpoint ? j->checkpoint : "", j->checkpoint ? "'" : "");
    return buf;
}

#define META_SNAPSHOT_MAX (256u << 20) /* the largest metadata.yaml ckptd reads (agent/layout.h) */
static int snapshot_metadata(struct run *r, const struct ck_job *j, char *out, size_t outsz,
                             bool *changed)
{
    struct stat st;
    struct ck_buf b = CK_BUF_INIT;
    int err;
    *changed = false;
    int fd = open(j->src, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(CK_ENOENT, "'%s' vanished before it was uploaded", j->src);
    if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != j->size ||
        ck_mtime_ns(&st) != j->mtime_ns || st.st_size > META_SNAPSHOT_MAX) {
        close(fd);
        *changed = true;
        return 0;
    }
    err = ck_buf_reserve(&b, (size_t)st.st_size + 1);
    if (err == 0)
        err = ck_pread_all(fd, b.data, (uint64_t)st.st_size, 0);
    close(fd);
    if (err == 0 && (err = ck_mkdirs(r->spool_dir, 0700)) == 0) {
        snprintf(out, outsz, "%s/job-%lld.metadata.yaml", r->spool_dir, (long long)j->id);
        err = ck_write_file_atomic(out, b.data, (size_t)st.st_size, 0600);
    }
    ck_buf_release(&b);
    return err;
}

/* A plain file that changed since it was queued is sent as it is now. */
static int refresh_source(struct run *r, struct ck_job *j)
{
    struct stat st;
    if (stat(j->src, &st) < 0)
        return ck_error_os(CK_ENOENT, "'%s' vanished before it was uploaded", j->src);
    int64_t mt = ck_mtime_ns(&st);
    if ((uint64_t)st.st_size == j->size && mt == j->mtime_ns)
        return 0;
    ck_warn("upload.changed", "job=%lld path=\"%s\": changed since it was queued, sending it anew",
            (long long)j->id, j->src);
    j->size = (uint64_t)st.st_size;
    j->mtime_ns = mt;
    j->upload_id[0] = '\0';
    j->part_size = 0;
    db_lock(r);
    int err = ck_queue_reset_source(r->db, j->id, j->size, mt);
    db_unlock(r);
    return err;
}

/* A metadata.yaml landed after its data: the newest data file of that store
 * is now safely remote (ckptd_newest_remote_checkpoint_timestamp_seconds). */
static void remote_checkpoint_time(sqlite3 *db, int64_t store)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "SELECT max(mtime_ns) FROM upload_jobs WHERE store = ?1 AND phase = 0"
                           " AND state = 2",
                           -1, &st, NULL) != SQLITE_OK)
        return;
    sqlite3_bind_int64(st, 1, store);
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
        ck_metrics_set_max(CK_M_NEWEST_REMOTE_CHECKPOINT_TIME,
                           sqlite3_column_int64(st, 0) / 1000000000LL);
    sqlite3_finalize(st);
}

/* The job's source (file, or folder of a bundle) no longer exists. */
static bool source_gone(const struct ck_job *j)
{
    struct stat st;
    return lstat(j->src, &st) < 0 && errno == ENOENT;
}

static bool is_permanent(int err)
{
    return err == CK_EAUTH || err == CK_ECONFIG || err == CK_EFORMAT || err == CK_ENOENT ||
           err == CK_ESIZE || err == CK_EREFUSED;
}

/* With r->mu held: the ids of the stores this run gave up, for the queue's
 * claim (at most n). */
static size_t gone_ids(const struct run *r, int64_t *ids, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < r->nstores && k < n; i++)
        if (r->stores[i]->gone)
            ids[k++] = r->stores[i]->id;
    return k;
}

/* With r->mu held: jobs of a store still queued. */
static int store_pending(sqlite3 *db, int64_t store)
{
    sqlite3_stmt *st;
    int n = 0;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM upload_jobs WHERE store = ?1 AND state IN (0, 1)",
                           -1, &st, NULL) != SQLITE_OK)
        return 0;
    sqlite3_bind_int64(st, 1, store);
    if (sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return n;
}

/* Nobody answered at j's store after the retries (connection refused, an
 * unknown host): the job goes back to the queue without an attempt counted
 * (the file is not at fault), the rest of the run leaves that store alone,
 * and one warning says so for the store, not one per file and attempt. */
static int give_up_store(struct run *r, const struct ck_job *j, const char *where,
                         const char *msg)
{
    db_lock(r);
    int err = ck_queue_requeue(r->db, j->id, msg);
    for (size_t i = 0; i < r->nstores; i++) {
        struct opened *o = r->stores[i];
        if (o->id != j->store_id || o->gone)
            continue;
        o->gone = true;
        ck_warn("upload.store_unreachable",
                "store=\"%s\" error=\"%s\": giving up this store for now; %d job(s) stay "
                "queued for the next round",
                where, msg, store_pending(r->db, j->store_id));
        ck_metrics_add(CK_M_FAILURES_UPLOAD, 1);
    }
    db_unlock(r);
    return err;
}

static void report_outcome(struct run *r, const struct ck_job *j, const char *where, bool ok,
                           const char *sha256, const char *check, double secs, const char *error)
{
    if (!r->ro || !r->ro->on_job)
        return;
    struct ck_upload_outcome o = {ok, where, j->key, j->src, j->size, secs, sha256, error, check};
    /* one at a time, with the database's lock: callers record events in it */
    db_lock(r);
    r->ro->on_job(r->ro->on_job_arg, &o);
    db_unlock(r);
}

static int run_job(struct run *r, struct ck_job *j, struct progress *pg, struct ck_upload_ctl *ctl,
                   int attempts_max, struct ck_upload_report *rep)
{
    struct ck_store *store = NULL;
    struct ck_xfer *x = calloc(1, sizeof *x);
    struct cb cb = {r, j->id, true}; /* the worker took a body slot for it */
    char where[512], snap[4096] = "", ckf[600] = "";
    int err;
    if (!x) {
        body_sent(&cb);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    ck_store_url_redact(where, sizeof where, j->store_url);
    long long t0 = ck_mono_ms();
    db_lock(r);
    err = get_store(r, j->store_id, &store);
    db_unlock(r);
    if (err < 0)
        goto failed;
    if (metadata_requeued(r, j, &err)) {
        if (err < 0)
            goto failed;
        goto out;
    }
    bool meta_changed = false;
    if (j->kind == CK_JOB_FILE && j->phase == 1)
        err = snapshot_metadata(r, j, snap, sizeof snap, &meta_changed);
    else if (j->kind == CK_JOB_FILE)
        err = refresh_source(r, j);
    else
        err = prepare_spool(r, j);
    if (err < 0)
        goto failed;
    if (meta_changed) { /* replaced since the check above: the tree again, then it */
        if (metadata_requeued(r, j, &err) && err < 0)
            goto failed;
        goto out;
    }
    x->id = j->id;
    x->path = snap[0] ? snap : j->kind == CK_JOB_FILE ? j->src : j->spool;
    x->key = j->key;
    x->size = j->size;
    /* the queued mtime is of the source itself, not of a snapshot or spool copy */
    x->mtime_ns = !snap[0] && j->kind == CK_JOB_FILE ? j->mtime_ns : 0;
    x->orig_sha256 = j->orig_sha256[0] ? j->orig_sha256 : NULL;
    x->atomic = j->phase == 1;
    x->hash_unknown = r->opts->sha256_always;
    if (j->kind == CK_JOB_FILE && stat(x->path, &x->known_st) == 0) {
        db_lock(r);
        ck_queue_known_digests(r->db, &x->known_st, x->known_sha256, x->known_md5);
        db_unlock(r);
    }
    snprintf(x->upload_id, sizeof x->upload_id, "%s", j->upload_id);
    x->part_size = j->part_size;
    db_lock(r);
    if (x->upload_id[0])
        err = ck_queue_parts(r->db, j->id, &x->parts, &x->nparts);
    db_unlock(r);
    if (err < 0)
        goto failed;
    x->save_upload = save_upload;
    x->save_part = save_part;
    x->body_sent = body_sent;
    x->body_again = body_again;
    x->cb_ctx = &cb;
    atomic_init(&x->sent, 0);
    ck_info("upload.start", "job=%lld store=\"%s\" key=\"%s\"%s bytes=%llu", (long long)j->id,
            where, j->key, ckpt_field(j, ckf, sizeof ckf), (unsigned long long)j->size);
    progress_set(pg, x, j->key, j->size);
    err = ck_store_put(store, x);
    progress_end(pg, x);
    if (err < 0)
        goto failed;
    db_lock(r);
    if (!x->check)
        x->check = "none"; /* a store that says nothing has checked nothing */
    err = ck_queue_done(r->db, j->id, x->sha256, x->check);
    if (err == 0 && j->phase == 1)
        remote_checkpoint_time(r->db, j->store_id);
    db_unlock(r);
    if (err < 0)
        goto out;
    if (j->spool)
        unlink(j->spool);
    double secs = (double)(ck_mono_ms() - t0) / 1000.0;
    ck_info("upload.done",
            "job=%lld store=\"%s\" key=\"%s\"%s bytes=%llu sha256=%s check=%s parts_sent=%d "
            "parts_resumed=%d seconds=%.2f bytes_per_second=%.0f",
            (long long)j->id, where, j->key, ckf, (unsigned long long)j->size,
            x->sha256[0] ? x->sha256 : "-", x->check, x->parts_sent, x->parts_resumed, secs,
            secs > 0 ? (double)j->size / secs : 0.0);
    rep->done++;
    ck_metrics_add(CK_M_UPLOADS_COMPLETED, 1);
    ck_metrics_add(CK_M_BYTES_UPLOADED, j->size);
    ck_metrics_observe(CK_H_UPLOAD_SECONDS, secs);
    report_outcome(r, j, where, true, x->sha256, x->check, secs, NULL);
    goto out;
failed : {
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", ck_error_msg());
    if (ck_upload_ctl_stopping(ctl) && !is_permanent(err)) {
        ck_warn("upload.stopped", "job=%lld key=\"%s\": kept in the queue", (long long)j->id,
                j->key);
        db_lock(r);
        err = ck_queue_requeue(r->db, j->id, msg);
        db_unlock(r);
        rep->stopped = true;
        goto out;
    }
    if (err == CK_EUNREACH) {
        ck_debug("upload.kept", "job=%lld key=\"%s\": its store is not answering", (long long)j->id,
                 j->key);
        err = give_up_store(r, j, where, msg);
        goto out;
    }
    if (err == CK_ENOENT && source_gone(j)) {
        /* removed on purpose (a trainer's rotation, mirror_deletes): nothing
         * to send and nobody to blame; metadata.yaml no longer waits for it */
        ck_warn("upload.source_gone",
                "job=%lld key=\"%s\"%s path=\"%s\": removed from the disk before it was sent;"
                " not sent, not counted as failed",
                (long long)j->id, j->key, ckpt_field(j, ckf, sizeof ckf), j->src);
        db_lock(r);
        err = ck_queue_gone(r->db, j->id, msg);
        db_unlock(r);
        goto out;
    }
    bool permanent = is_permanent(err) || j->attempts + 1 >= attempts_max;
    double rnd = (double)rand() / ((double)RAND_MAX + 1.0);
    double delay =
        ck_backoff_delay(j->attempts, r->opts->retry_base * 4, r->opts->retry_cap, 0, rnd);
    ck_err(permanent ? "upload.failed" : "upload.retry_later",
           "job=%lld key=\"%s\"%s error=\"%s\"%s", (long long)j->id, j->key,
           ckpt_field(j, ckf, sizeof ckf), msg, permanent ? "" : " (will retry)");
    db_lock(r);
    err = ck_queue_fail(r->db, j->id, msg, permanent, delay, attempts_max);
    db_unlock(r);
    if (permanent) {
        rep->failed++;
        ck_metrics_add(CK_M_UPLOADS_FAILED, 1);
        report_outcome(r, j, where, false, "", NULL, (double)(ck_mono_ms() - t0) / 1000.0, msg);
    }
    ck_metrics_add(CK_M_FAILURES_UPLOAD, 1);
}
out:
    if (snap[0])
        unlink(snap);
    body_sent(&cb); /* its slot, if the store did not give it back */
    free(x->parts);
    free(x);
    return err;
}

/* Seconds until the next job waiting for its retry time may run, -1 when
 * none waits (claim found nothing runnable now: the rest is blocked). */
static double next_wait(sqlite3 *db, const int64_t *skip, size_t nskip)
{
    sqlite3_stmt *st;
    double w = -1;
    struct timespec ts;
    char skipped[CK_QUEUE_IDS_JSON_MAX];
    clock_gettime(CLOCK_REALTIME, &ts);
    double now = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    if (sqlite3_prepare_v2(db,
                           "SELECT min(next_try) FROM upload_jobs WHERE state = 0 AND next_try > ?1"
                           " AND store NOT IN (SELECT value FROM json_each(?2))",
                           -1, &st, NULL) != SQLITE_OK)
        return -1;
    sqlite3_bind_double(st, 1, now);
    ck_queue_ids_json(skipped, sizeof skipped, skip, nskip);
    sqlite3_bind_text(st, 2, skipped, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
        w = sqlite3_column_double(st, 0) - now;
    sqlite3_finalize(st);
    return w;
}

static void count_left(sqlite3 *db, struct ck_upload_report *rep)
{
    sqlite3_stmt *st;
    rep->left = rep->blocked = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT count(*), coalesce(sum(phase = 1 AND EXISTS (SELECT 1 FROM"
                           " upload_jobs d WHERE d.store = j.store AND d.phase = 0"
                           " AND d.state = 3)), 0) FROM upload_jobs j WHERE state = 0",
                           -1, &st, NULL) != SQLITE_OK)
        return;
    if (sqlite3_step(st) == SQLITE_ROW) {
        rep->left = sqlite3_column_int(st, 0);
        rep->blocked = sqlite3_column_int(st, 1);
    }
    sqlite3_finalize(st);
}

/* ckptd_upload_queue_depth: jobs waiting or running, as the queue says now. */
static void queue_depth(sqlite3 *db)
{
    int counts[CK_JOB_NSTATES];
    if (ck_queue_counts(db, counts) == 0)
        ck_metrics_set(CK_M_UPLOAD_QUEUE_DEPTH, counts[CK_JOB_PENDING] + counts[CK_JOB_RUNNING]);
}

/* The same while a long transfer runs: the watcher queues jobs beside the
 * round (a checkpoint's metadata.yaml, the next checkpoint), and a gauge set
 * only when a job starts or ends would not show them for the length of the
 * transfer. Once a second at most: the count is a query. Holds mu. */
#define QUEUE_DEPTH_REFRESH_MS 1000

static void queue_depth_refresh(struct run *r)
{
    int64_t now = ck_mono_ms();
    if (now - r->depth_at < QUEUE_DEPTH_REFRESH_MS)
        return;
    r->depth_at = now;
    queue_depth(r->db);
}

/* One of upload.transfers workers: claims a job, runs it, again. A worker
 * that finds nothing to claim while others still run waits for one of them
 * to end (a finished data job may free the metadata job); it leaves when no
 * job runs and none can be claimed (or only retries later, without
 * wait_retries). rep is the worker's own. */
struct worker {
    struct run *r;
    struct ck_upload_report rep;
    pthread_t tid;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct run *r = w->r;
    struct ck_upload_ctl *ctl = r->ctl;
    db_lock(r);
    for (;;) {
        if (r->fatal)
            break;
        if (ck_upload_ctl_stopping(ctl)) {
            w->rep.stopped = true;
            break;
        }
        if (r->bodies_free == 0) {
            /* every body slot is taken: woken when one is given back */
            queue_depth_refresh(r);
            wait_a_little(r);
            continue;
        }
        struct ck_job j;
        int64_t gone[32];
        size_t ngone = gone_ids(r, gone, sizeof gone / sizeof *gone);
        int err = ck_queue_claim_except(r->db, gone, ngone, &j);
        if (err == CK_ENOENT) {
            if (r->active > 0) {
                /* woken when a job ends; the timeout rechecks stop */
                queue_depth_refresh(r);
                wait_a_little(r);
                continue;
            }
            double wt = next_wait(r->db, gone, ngone);
            if (wt < 0 || !(r->ro && r->ro->wait_retries))
                break;
            long long d = atomic_load(&ctl->deadline);
            if (d && ck_mono_ms() + (long long)(wt * 1000) > d)
                break;
            long long until = ck_mono_ms() + (long long)(wt * 1000) + 10;
            db_unlock(r);
            while (ck_mono_ms() < until && !ck_upload_ctl_stopping(ctl))
                usleep(50000);
            db_lock(r);
            continue;
        }
        if (err < 0) {
            r->fatal = err;
            snprintf(r->fatal_msg, sizeof r->fatal_msg, "%s", ck_error_msg());
            break;
        }
        r->active++;
        r->bodies_free--; /* run_job gives it back */
        queue_depth(r->db);
        db_unlock(r);
        err = run_job(r, &j, r->pg, ctl, r->attempts_max, &w->rep);
        ck_job_release(&j);
        db_lock(r);
        r->active--;
        pthread_cond_broadcast(&r->cv);
        queue_depth(r->db);
        if (err < 0 && !r->fatal) {
            r->fatal = err; /* the queue itself failed: stop */
            snprintf(r->fatal_msg, sizeof r->fatal_msg, "%s", ck_error_msg());
            pthread_cond_broadcast(&r->cv);
        }
    }
    pthread_cond_broadcast(&r->cv);
    db_unlock(r);
    return NULL;
}

/* The multipart uploads the queue gave up (stores/queue.h, ck_abandoned)
 * are aborted in their stores once the round's jobs are done: a service keeps
 * and bills the parts of an upload nobody completes. A store that fails keeps
 * the record for a later round; after ABORT_ATTEMPTS_MAX rounds the upload is
 * left to the service's lifecycle rules, said with its id. No worker runs. */
#define ABORT_ATTEMPTS_MAX 10
#define ABORT_PER_ROUND 256

static void abort_abandoned(struct run *r)
{
    struct ck_abandoned *v;
    size_t n;
    if (ck_queue_abandoned(r->db, ABORT_PER_ROUND, &v, &n) < 0) {
        ck_warn("upload.abort_failed", "%s", ck_error_msg());
        ck_error_clear();
        return;
    }
    for (size_t i = 0; i < n && !ck_upload_ctl_stopping(r->ctl); i++) {
        struct ck_store *store = NULL;
        char where[512] = "";
        int err = get_store(r, v[i].store_id, &store);
        for (size_t k = 0; k < r->nstores; k++)
            if (r->stores[k]->id == v[i].store_id && r->stores[k]->spec.url)
                ck_store_url_redact(where, sizeof where, r->stores[k]->spec.url);
        if (err == 0)
            err = ck_store_abort_upload(store, v[i].key, v[i].upload_id);
        bool forget = err == 0 || v[i].attempts + 1 >= ABORT_ATTEMPTS_MAX;
        if (err == 0)
            ck_info("upload.multipart_aborted",
                    "store=\"%s\" key=\"%s\" upload_id=\"%s\": given up before it completed "
                    "(its file changed or went); its parts are freed in the store",
                    where, v[i].key, v[i].upload_id);
        else
            ck_warn("upload.abort_failed", "store=\"%s\" key=\"%s\" upload_id=\"%s\" attempt=%d: %s%s",
                    where, v[i].key, v[i].upload_id, v[i].attempts + 1, ck_error_msg(),
                    forget ? ": given up; the store keeps its parts until they are aborted "
                             "by hand (aws s3api abort-multipart-upload) or a lifecycle rule "
                             "expires them"
                           : ": tried again in a later round");
        ck_error_clear();
        if (ck_queue_abandoned_settle(r->db, v[i].id, forget) < 0) {
            ck_warn("upload.abort_failed", "%s", ck_error_msg());
            ck_error_clear();
            break;
        }
    }
    ck_queue_abandoned_release(v, n);
}

int ck_uploader_run(sqlite3 *db, const struct ck_upload_opts *opts, const char *spool_dir,
                    struct ck_upload_ctl *ctl, const struct ck_uploader_run_opts *ro,
                    struct ck_upload_report *rep)
{
    struct run r = {.db = db, .opts = opts, .ro = ro, .spool_dir = spool_dir, .ctl = ctl};
    struct progress pg = {.fn = ro ? ro->on_progress : NULL, .arg = ro ? ro->on_progress_arg : NULL};
    pthread_t pt;
    bool pt_started = false;
    r.attempts_max = ro && ro->job_attempts > 0 ? ro->job_attempts : 3;
    r.pg = &pg;
    int err;
    memset(rep, 0, sizeof *rep);
    if ((err = ck_queue_init(db)) < 0 || (err = ck_queue_recover(db)) < 0)
        return err;
    queue_depth(db);
    if ((err = ck_net_init(&r.net, opts, ctl)) < 0)
        return err;
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    pthread_mutex_init(&pg.mu, NULL);
    pthread_cond_init(&pg.cv, NULL);
    if (pthread_create(&pt, NULL, progress_thread, &pg) == 0)
        pt_started = true;
    int nt = opts->transfers < 1 ? 1 : opts->transfers > 64 ? 64 : opts->transfers;
    int nw = 2 * nt; /* a body and a tail per transfer */
    r.bodies_free = nt;
    struct worker *w = calloc((size_t)nw, sizeof *w);
    int started = 0;
    if (!w) {
        err = ck_error(CK_ENOMEM, "out of memory");
    } else {
        for (int i = 0; i < nw; i++) {
            w[i].r = &r;
            if (pthread_create(&w[i].tid, NULL, worker_main, &w[i]) == 0)
                started++;
            else
                break;
        }
        if (started == 0)
            err = ck_error(CK_ERR, "cannot start an upload thread");
        for (int i = 0; i < started; i++) {
            pthread_join(w[i].tid, NULL);
            rep->done += w[i].rep.done;
            rep->failed += w[i].rep.failed;
            rep->stopped = rep->stopped || w[i].rep.stopped;
        }
        free(w);
    }
    if (err == 0 && r.fatal < 0)
        err = ck_error(r.fatal, "%s", r.fatal_msg);
    if (err == 0)
        abort_abandoned(&r);
    if (pt_started) {
        pthread_mutex_lock(&pg.mu);
        pg.quit = true;
        pthread_cond_signal(&pg.cv);
        pthread_mutex_unlock(&pg.mu);
        pthread_join(pt, NULL);
    }
    pthread_mutex_destroy(&pg.mu);
    pthread_cond_destroy(&pg.cv);
    for (size_t i = 0; i < r.nstores; i++) {
        ck_store_free(r.stores[i]->store);
        ck_store_spec_release(&r.stores[i]->spec);
        free(r.stores[i]);
    }
    free(r.stores);
    ck_net_release(&r.net);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.cv);
    if (err == 0)
        count_left(db, rep);
    queue_depth(db);
    return err;
}

int ck_uploader_default_state(char *out, size_t outsz)
{
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && *xdg == '/')
        n = snprintf(out, outsz, "%s/ckptd", xdg);
    else if (home && *home)
        n = snprintf(out, outsz, "%s/.local/state/ckptd", home);
    else
        return ck_error(CK_ECONFIG, "neither XDG_STATE_HOME nor HOME is set: give --state DIR");
    if (n < 0 || (size_t)n >= outsz)
        return ck_error(CK_ESIZE, "the state folder's path is too long");
    return 0;
}

int ck_uploader_lock(const char *state_dir, int *fd_out)
{
    char path[4096];
    int err;
    *fd_out = -1;
    if ((err = ck_mkdirs(state_dir, 0700)) < 0)
        return err;
    snprintf(path, sizeof path, "%s/upload.lock", state_dir);
    char pid[32];
    int fd;
    if ((err = ck_pidlock_acquire(path, 0600, &fd, pid, sizeof pid)) == CK_ELOCKED)
        return ck_error(CK_ELOCKED, "another ckptd (pid %s) runs the upload queue in '%s'",
                        pid[0] ? pid : "?", state_dir);
    if (err < 0)
        return err;
    *fd_out = fd;
    return 0;
}
