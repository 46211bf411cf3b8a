#include "agent/nodecommit.h"
#include "agent/layout.h"
#include "agent/nodeparts.h"
#include "agent/rules.h"
#include "agent/upload_round.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/syncset.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/metrics.h"
#include "stores/net.h"
#include "stores/pmftree.h"
#include "stores/queue.h"
#include "writers/pmf.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MODEL_KEY ".ckptd/model.yaml"
#define PARTS_DIR ".ckptd/parts"
#define COMMITS_DIR ".ckptd/commits"
#define STATUS_DIR ".ckptd/nodes"
#define STATUS_MAX 256 /* a node's status record: two short lines */
#define CKPT_DIR "data/checkpoints"
#define MAX_META_ROUNDS 5 /* metadata.yaml written again when a record appeared meanwhile */

/* A step this run committed on the store being worked on (its event comes
 * once the store's metadata.yaml lists it). */
struct done {
    char *checkpoint; /* owned */
    bool created;     /* this run wrote the record (else it found it with these bytes) */
    int64_t epoch;
    size_t files;
    uint64_t bytes;
};

/* One step this node holds a part of, and its upload jobs per store. */
struct local {
    struct ck_nodepart part;
    int64_t **jobs; /* [store][file]: queue job ids */
};

struct run {
    struct ck_noderound *r;
    struct local *v;
    size_t n;
    int64_t **extra; /* rank 0: [store][i] the tree around the parts, the model record */
    size_t nextra;
    struct ck_strlist extra_src, extra_key;
    /* per store, while it is being worked on */
    struct ck_store *store;
    char url[1024];
    size_t si;
    struct done *commits; /* the steps this run committed on this store */
    size_t ncommits;
    struct ck_buf waiting;  /* CK_NODES_WAITING_KEY's text, every store */
    /* this node's training status (its own metadata.yaml) and when it ended */
    enum ck_pmf_status local_status;
    double local_end;
};

static void run_release(struct run *u)
{
    size_t ns = u->r->cfg->n_upload_stores;
    for (size_t i = 0; i < u->n; i++) {
        ck_nodepart_release(&u->v[i].part);
        for (size_t s = 0; u->v[i].jobs && s < ns; s++)
            free(u->v[i].jobs[s]);
        free(u->v[i].jobs);
    }
    free(u->v);
    for (size_t s = 0; u->extra && s < ns; s++)
        free(u->extra[s]);
    free(u->extra);
    ck_strlist_release(&u->extra_src);
    ck_strlist_release(&u->extra_key);
    ck_buf_release(&u->waiting);
}

static void commits_release(struct run *u)
{
    for (size_t i = 0; i < u->ncommits; i++)
        free(u->commits[i].checkpoint);
    free(u->commits);
    u->commits = NULL;
    u->ncommits = 0;
}

static int src_of(const struct run *u, const char *path, char *out, size_t outsz)
{
    int n = snprintf(out, outsz, "%s/" CKPT_DIR "/%s", u->r->dir, path);
    return n < 0 || (size_t)n >= outsz ? ck_error(CK_ESIZE, "path too long: '%s'", path) : 0;
}

/* ---- this node's parts, from its own metadata.yaml ---- */

static int add_file(struct run *u, struct ck_nodepart *p, const char *path)
{
    char src[PATH_MAX];
    struct ck_hash_entry h;
    uint64_t size;
    int err;
    if (!ck_nodefile_path_is_valid(path))
        return ck_error(CK_EFORMAT, "checkpoint '%s': '%s' cannot be a part's path",
                        p->checkpoint, path);
    struct ck_nodefile *v = realloc(p->files, (p->nfiles + 1) * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    p->files = v;
    if ((err = src_of(u, path, src, sizeof src)) < 0 ||
        (err = ck_state_hash_file(u->r->st, src, &h, &size)) < 0)
        return err;
    struct ck_nodefile *f = &p->files[p->nfiles];
    memset(f, 0, sizeof *f);
    if (!(f->path = strdup(path)))
        return ck_error(CK_ENOMEM, "out of memory");
    f->size = size;
    memcpy(f->md5, h.md5, 33);
    memcpy(f->sha256, h.sha256, 65);
    p->nfiles++;
    return 0;
}

/* The files of a registered checkpoint: its .md5sums lines (a folder or a
 * set), else its one file. */
static int part_files(struct run *u, struct ck_nodepart *p, const char *tree_path)
{
    char full[PATH_MAX];
    size_t tl = strlen(tree_path);
    int err;
    if (strncmp(tree_path, CKPT_DIR "/", sizeof CKPT_DIR))
        return ck_error(CK_EFORMAT, "checkpoint '%s': its path '%s' is not under " CKPT_DIR "/",
                        p->checkpoint, tree_path);
    if (tl < 8 || strcmp(tree_path + tl - 8, ".md5sums"))
        return add_file(u, p, tree_path + sizeof CKPT_DIR);
    struct ck_buf text = CK_BUF_INIT;
    if ((err = ck_path_join(full, sizeof full, u->r->dir, tree_path)) < 0 ||
        (err = ck_read_file(full, 64u << 20, &text)) < 0)
        return err;
    const char *s = ck_buf_str(&text), *end = s + text.len;
    while (err == 0 && s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);
        char path[4096];
        if (n < 35 || s[32] != ' ' || s[33] != ' ' || n - 34 >= sizeof path)
            err = ck_error(CK_EFORMAT, "'%s': a line is not 'MD5  PATH'", full);
        else {
            memcpy(path, s + 34, n - 34);
            path[n - 34] = '\0';
            err = add_file(u, p, path);
        }
        s += n + 1;
    }
    ck_buf_release(&text);
    return err;
}

static int load_part(struct run *u, const struct ck_pmf_checkpoint *cp, struct ck_nodepart *p)
{
    char txt[64], full[PATH_MAX];
    const struct ck_nodes *nodes = u->r->nodes;
    struct stat st;
    int err;
    memset(p, 0, sizeof *p);
    if (!(p->checkpoint = strdup(ck_pmf_ref_str(&cp->ref, txt, sizeof txt))))
        return ck_error(CK_ENOMEM, "out of memory");
    p->epoch = cp->epoch;
    p->rank = nodes->rank;
    p->count = nodes->count;
    /* the step as the checkpoint's name says it (its source's name) */
    struct ck_ckpt_record rec;
    struct ck_name_captures cap;
    size_t tl = strlen(cp->path);
    bool folder = tl > 8 && !strcmp(cp->path + tl - 8, ".md5sums");
    if (ck_state_ckpt_get(u->r->st, p->checkpoint, &rec) == 0 &&
        ck_rules_match(&u->r->cfg->ckpt, ck_basename(rec.source), rec.source, folder, &cap) &&
        cap.has_step) {
        p->has_step = true;
        p->step = cap.step;
    }
    ck_error_clear();
    /* settled: when the node registered it (its PMF file's time), to the millisecond */
    if ((err = ck_path_join(full, sizeof full, u->r->dir, cp->path)) < 0)
        return err;
    if (stat(full, &st) < 0)
        return ck_error_os(CK_EIO, "cannot stat '%s'", full);
    p->settled = round((double)st.st_mtim.tv_sec * 1000.0 + st.st_mtim.tv_nsec / 1e6) / 1000.0;
    if ((err = part_files(u, p, cp->path)) < 0)
        return err;
    return ck_nodepart_sort(p);
}

static bool ref_is_key_safe(const char *ref)
{
    return ck_nodefile_path_is_valid(ref) && !strchr(ref, '/');
}

static int load_parts(struct run *u, const struct ck_pmf_meta *m)
{
    if (!(u->v = calloc(m->ncheckpoints ? m->ncheckpoints : 1, sizeof *u->v)))
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < m->ncheckpoints; i++) {
        struct local *l = &u->v[u->n];
        int err = load_part(u, &m->checkpoints[i], &l->part);
        if (err == 0 && !ref_is_key_safe(l->part.checkpoint))
            err = ck_error(CK_EFORMAT, "its name cannot be a store key");
        if (err < 0) {
            ck_err("nodes.part_unreadable", "checkpoint='%s': %s: not uploaded as a part",
                   m->checkpoints[i].path, ck_error_msg());
            u->r->refused++;
            ck_nodepart_release(&l->part);
            continue;
        }
        u->n++;
    }
    return 0;
}

/* ---- rank 0: the tree around the parts ---- */

static int extra_add(struct run *u, const char *src, const char *key)
{
    int err = ck_strlist_add(&u->extra_src, src);
    return err < 0 ? err : ck_strlist_add(&u->extra_key, key);
}

static int extra_walk(struct run *u, const char *rel, int depth)
{
    char full[PATH_MAX], sub[PATH_MAX];
    int err = 0;
    if (depth > 16)
        return ck_error(CK_ESIZE, "'%s': folders nested too deep", rel);
    if ((err = ck_path_join(full, sizeof full, u->r->dir, rel)) < 0)
        return err;
    DIR *d = opendir(full);
    if (!d)
        return 0;
    struct dirent *e;
    while (err == 0 && (e = readdir(d))) {
        struct stat st;
        if (e->d_name[0] == '.' ||
            (err = ck_path_join(sub, sizeof sub, rel, e->d_name)) < 0 ||
            (err = ck_path_join(full, sizeof full, u->r->dir, sub)) < 0 || lstat(full, &st) < 0)
            continue;
        if (S_ISDIR(st.st_mode))
            err = extra_walk(u, sub, depth + 1);
        else if (S_ISREG(st.st_mode))
            err = extra_add(u, full, sub);
    }
    closedir(d);
    return err;
}

/* A file of the state folder, written when its bytes changed. */
static int state_file(struct run *u, const char *name, const char *data, size_t len, char *path,
                      size_t pathsz)
{
    struct ck_buf old = CK_BUF_INIT;
    char dir[PATH_MAX];
    int err;
    if ((err = ck_path_join(dir, sizeof dir, u->r->st->dir, "nodes")) < 0 ||
        (err = ck_mkdirs(dir, 0700)) < 0 || (err = ck_path_join(path, pathsz, dir, name)) < 0)
        return err;
    bool same = ck_read_file(path, CK_METADATA_MAX, &old) == 0 && old.len == len &&
                !memcmp(ck_buf_str(&old), data, len);
    ck_error_clear();
    ck_buf_release(&old);
    return same ? 0 : ck_write_file_atomic(path, data, len, 0644);
}

/* data/build_parameters.yaml for the store: the keys before ckptd's section
 * (the section lists this node's checkpoints only, which the store's tree is not) */
static int build_parameters(struct run *u)
{
    char full[PATH_MAX], path[PATH_MAX];
    struct ck_buf text = CK_BUF_INIT;
    int err;
    if ((err = ck_path_join(full, sizeof full, u->r->dir, "data/build_parameters.yaml")) < 0 ||
        (err = ck_read_file(full, CK_METADATA_MAX, &text)) < 0)
        return err;
    const char *s = ck_buf_str(&text);
    size_t len = text.len;
    const char *sec = !strncmp(s, "ckptd:", 6) ? s : strstr(s, "\nckptd:");
    if (sec)
        len = (size_t)(sec - s) + (sec != s);
    if (len == 0)
        s = "{}\n", len = 3;
    err = state_file(u, "build_parameters.yaml", s, len, path, sizeof path);
    ck_buf_release(&text);
    return err < 0 ? err : extra_add(u, path, "data/build_parameters.yaml");
}

static int rank0_extras(struct run *u, const struct ck_pmf_meta *m)
{
    char full[PATH_MAX], path[PATH_MAX];
    struct ck_buf text = CK_BUF_INIT;
    int err;
    if (m->config_path && (err = ck_path_join(full, sizeof full, u->r->dir, m->config_path)) == 0 &&
        ck_exists(full) && (err = extra_add(u, full, m->config_path)) < 0)
        return err;
    /* an empty data/initialisation/ would not survive the trip (stores/pmftree.h) */
    bool wrote;
    if ((err = ck_pmftree_mark_empty_init(u->r->dir, &wrote)) < 0 ||
        (err = extra_walk(u, "data/initialisation", 0)) < 0 || (err = build_parameters(u)) < 0)
        return err;
    /* the model record: this node's metadata.yaml, whose identity, configuration
     * and initialisation the store's metadata.yaml takes */
    if ((err = ck_path_join(full, sizeof full, u->r->dir, "metadata.yaml")) < 0 ||
        (err = ck_read_file(full, CK_METADATA_MAX, &text)) < 0)
        return err;
    err = state_file(u, "model.yaml", ck_buf_str(&text), text.len, path, sizeof path);
    ck_buf_release(&text);
    return err < 0 ? err : extra_add(u, path, MODEL_KEY);
}

/* ---- the queue ---- */

static int queue_one(struct run *u, int64_t sid, const char *src, const char *key,
                     const char *ckpt, int64_t *id)
{
    bool added;
    int err = ck_queue_add(u->r->st->db, sid, src, key, 0, CK_JOB_FILE, id, &added);
    if (err == 0 && added && ckpt)
        err = ck_queue_set_checkpoint(u->r->st->db, *id, ckpt);
    if (err == 0 && added)
        ck_info("upload.queued", "job=%lld key=\"%s\" phase=0%s%s%s", (long long)*id, key,
                ckpt ? " checkpoint='" : "", ckpt ? ckpt : "", ckpt ? "'" : "");
    return err;
}

static int queue_store(struct run *u, size_t s)
{
    const struct ck_store_spec *spec = &u->r->cfg->upload_stores[s];
    sqlite3 *db = u->r->st->db;
    char key[PATH_MAX];
    int64_t sid;
    int err;
    if ((err = ck_queue_store_put(db, spec, &sid)) < 0)
        return err;
    if (!(u->extra[s] = calloc(u->nextra ? u->nextra : 1, sizeof **u->extra)))
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < u->nextra && err == 0; i++)
        err = queue_one(u, sid, u->extra_src.items[i], u->extra_key.items[i], NULL,
                        &u->extra[s][i]);
    for (size_t i = 0; i < u->n && err == 0; i++) {
        struct local *l = &u->v[i];
        if (!(l->jobs[s] = calloc(l->part.nfiles ? l->part.nfiles : 1, sizeof *l->jobs[s])))
            return ck_error(CK_ENOMEM, "out of memory");
        for (size_t j = 0; j < l->part.nfiles && err == 0; j++) {
            char src[PATH_MAX];
            snprintf(key, sizeof key, CKPT_DIR "/%s", l->part.files[j].path);
            if ((err = src_of(u, l->part.files[j].path, src, sizeof src)) == 0)
                err = queue_one(u, sid, src, key, l->part.checkpoint, &l->jobs[s][j]);
        }
    }
    return err;
}

static int queue_all(struct run *u)
{
    size_t ns = u->r->cfg->n_upload_stores;
    sqlite3 *db = u->r->st->db;
    int err;
    u->nextra = u->extra_src.n;
    if (!(u->extra = calloc(ns, sizeof *u->extra)))
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < u->n; i++)
        if (!(u->v[i].jobs = calloc(ns, sizeof *u->v[i].jobs)))
            return ck_error(CK_ENOMEM, "out of memory");
    if ((err = ck_queue_init(db)) < 0 || (err = ck_queue_batch_begin(db)) < 0)
        return err;
    for (size_t s = 0; s < ns && err == 0; s++)
        err = queue_store(u, s);
    return ck_queue_batch_end(db, err);
}

/* Whether every job of ids is done (stored and checked). */
static bool all_done(sqlite3 *db, const int64_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct ck_job j;
        if (ck_queue_get(db, ids[i], &j) < 0) {
            ck_error_clear();
            return false;
        }
        bool done = j.state == CK_JOB_DONE;
        ck_job_release(&j);
        if (!done)
            return false;
    }
    return true;
}

/* ---- the store ---- */

static int no_upload(void *ctx, const char *id, uint64_t ps)
{
    (void)ctx, (void)id, (void)ps;
    return 0;
}

static int no_part(void *ctx, const struct ck_part *p)
{
    (void)ctx, (void)p;
    return 0;
}

/* Puts bytes as key (through a file of the state folder: a store sends files). */
static int put_bytes(struct run *u, const char *key, const struct ck_buf *b, bool if_absent,
                     bool atomic, bool *same_bytes)
{
    char tmp[PATH_MAX];
    int err;
    if ((err = ck_path_join(tmp, sizeof tmp, u->r->st->dir, "nodes-put-XXXXXX")) < 0)
        return err;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(CK_EIO, "cannot create '%s'", tmp);
    if (write(fd, ck_buf_str(b), b->len) != (ssize_t)b->len || fsync(fd) < 0)
        err = ck_error_os(CK_EIO, "cannot write '%s'", tmp);
    close(fd);
    if (err == 0) {
        struct ck_xfer x;
        memset(&x, 0, sizeof x);
        /* temporary names on the store carry the id: unique per node and process */
        x.id = ((int64_t)u->r->nodes->rank << 32) | (int64_t)getpid();
        x.path = tmp;
        x.key = key;
        x.size = b->len;
        x.atomic = atomic;
        x.if_absent = if_absent;
        x.hash_unknown = true;
        x.save_upload = no_upload;
        x.save_part = no_part;
        err = ck_store_put(u->store, &x);
        if (same_bytes)
            *same_bytes = x.same_bytes;
    }
    unlink(tmp);
    return err;
}

static int get_bytes(struct run *u, const char *key, struct ck_buf *out)
{
    char tmp[PATH_MAX];
    int err;
    if ((err = ck_path_join(tmp, sizeof tmp, u->r->st->dir, "nodes-get-XXXXXX")) < 0)
        return err;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(CK_EIO, "cannot create '%s'", tmp);
    err = ck_store_get(u->store, key, fd);
    close(fd);
    if (err == 0)
        err = ck_read_file(tmp, CK_METADATA_MAX, out);
    unlink(tmp);
    return err;
}

static void md5_of(const struct ck_buf *b, char out[33])
{
    struct ck_digests d;
    struct ck_hash_ctx *h = ck_hash_ctx_new(CK_HASH_MD5);
    out[0] = '\0';
    if (!h)
        return;
    ck_hash_ctx_update(h, ck_buf_str(b), b->len);
    ck_hash_ctx_final(h, &d);
    ck_hash_ctx_free(h);
    memcpy(out, d.md5, 33);
}

/* A manifest or record that does not parse is read again, a little later:
 * a store that ignores the condition (s3rver) truncates an object another
 * node is writing again with the same bytes, and a read meanwhile sees it
 * short. */
#define READ_TRIES 4
#define READ_WAIT_US 250000

/* Whether the store holds want as key, read back (again a little later
 * while it holds something else: another writer's PUT of the same bytes
 * half-done). 0 with *equal set or not (the store's whole bytes differ),
 * or the last read's error. */
static int read_back(struct run *u, const char *key, const struct ck_buf *want, bool *equal,
                     struct ck_buf *got_out)
{
    struct ck_buf got = CK_BUF_INIT;
    int err = 0;
    *equal = false;
    for (int t = 0; t < READ_TRIES && !*equal; t++) {
        if (t > 0) {
            ck_error_clear();
            usleep(READ_WAIT_US);
        }
        ck_buf_reset(&got);
        if ((err = get_bytes(u, key, &got)) == 0)
            *equal = got.len == want->len && !memcmp(ck_buf_str(&got), ck_buf_str(want), got.len);
    }
    if (got_out) { /* the store's bytes as last read ("" when none could be) */
        ck_buf_release(got_out);
        *got_out = got;
    } else {
        ck_buf_release(&got);
    }
    return *equal ? 0 : err;
}

/* Puts b as key, an object every writer writes with the same bytes (a
 * commit record, a .md5sums), and makes sure the store holds them: 0 when
 * it does (*created: this PUT wrote it, for a conditional write),
 * CK_EEXIST when it holds other bytes, else the write's error. A store
 * that ignores the condition and keeps an object as it arrives (s3rver)
 * lets two committers' PUTs of the same bytes meet: the check after one
 * PUT then sees the other half-done and fails, though the object ends with
 * these bytes; what the store holds then decides, read back. */
static int put_same(struct run *u, const char *key, const struct ck_buf *b, bool if_absent,
                    bool *created)
{
    bool same = false, equal;
    char why[1024];
    *created = false;
    int err = put_bytes(u, key, b, if_absent, false, &same);
    if (err == 0) {
        *created = true;
        return 0;
    }
    if (err == CK_EEXIST && same) {
        ck_error_clear();
        return 0;
    }
    snprintf(why, sizeof why, "%s", ck_error_msg());
    ck_error_clear();
    int e = read_back(u, key, b, &equal, NULL);
    if (equal) {
        ck_info("nodes.write_checked", "store=\"%s\" key=\"%s\": %s; read back: the store "
                "holds these bytes", u->url, key, why);
        return 0;
    }
    ck_error_clear();
    if (e == 0)
        return ck_error(CK_EEXIST, "%s; read back: the store holds other bytes", why);
    return ck_error(err, "%s", why);
}

static void part_key(char *out, size_t outsz, const char *ckpt, int rank, int count)
{
    snprintf(out, outsz, PARTS_DIR "/%s/node-%d-of-%d.yaml", ckpt, rank, count);
}

/* The rank a node file's name says ("node-R-of-N.yaml", written by
 * part_key and status_key, exactly: no leading zeros or signs) for a count
 * of count nodes; -1 for any other name. */
static int node_file_rank(const char *name, int count)
{
    char canon[128];
    int rank, n, used = 0;
    if (sscanf(name, "node-%d-of-%d.yaml%n", &rank, &n, &used) != 2 ||
        used != (int)strlen(name) || n != count || rank < 0 || rank >= count)
        return -1;
    snprintf(canon, sizeof canon, "node-%d-of-%d.yaml", rank, n);
    return strcmp(canon, name) ? -1 : rank;
}

static void store_failed(struct run *u, const char *what, const char *ckpt)
{
    ck_err("nodes.store_failed", "store=\"%s\" checkpoint='%s': %s: %s", u->url, ckpt, what,
           ck_error_msg());
    ck_error_clear();
    u->r->failed++;
}

/* The ranks of count whose manifests the listing of the step's parts shows,
 * and the MD5 the store reports for this node's own ("" when none). */
static int listed_ranks(struct run *u, const char *ckpt, bool *have, int *nhave, char own_md5[33])
{
    char prefix[PATH_MAX];
    struct ck_remote_list l = {0};
    int count = u->r->nodes->count;
    snprintf(prefix, sizeof prefix, PARTS_DIR "/%s", ckpt);
    int err = ck_store_list(u->store, prefix, &l);
    *nhave = 0;
    own_md5[0] = '\0';
    memset(have, 0, (size_t)count * sizeof *have);
    for (size_t i = 0; err == 0 && i < l.n; i++) {
        int rank = node_file_rank(ck_basename(l.v[i].key), count);
        if (rank >= 0 && !have[rank]) {
            have[rank] = true;
            (*nhave)++;
            if (rank == u->r->nodes->rank)
                memcpy(own_md5, l.v[i].md5, 33);
        }
    }
    ck_remote_list_release(&l);
    return err;
}

/* Every file of the record is stored with its size (one listing). */
static int check_stored(struct run *u, const struct ck_nodecommit *c, char *missing,
                        size_t missingsz)
{
    char prefix[PATH_MAX];
    size_t cl = strlen(c->checkpoint);
    bool under = true;
    for (size_t i = 0; i < c->nfiles && under; i++)
        under = !strncmp(c->files[i].path, c->checkpoint, cl) && c->files[i].path[cl] == '/';
    snprintf(prefix, sizeof prefix, under ? CKPT_DIR "/%s" : CKPT_DIR, c->checkpoint);
    struct ck_remote_list l = {0};
    int err = ck_store_list(u->store, prefix, &l);
    missing[0] = '\0';
    size_t j = 0;
    for (size_t i = 0; err == 0 && i < c->nfiles && !missing[0]; i++) {
        char key[PATH_MAX];
        snprintf(key, sizeof key, CKPT_DIR "/%s", c->files[i].path);
        while (j < l.n && strcmp(l.v[j].key, key) < 0)
            j++;
        if (j == l.n || strcmp(l.v[j].key, key))
            snprintf(missing, missingsz, "'%s' is not stored", key);
        else if ((uint64_t)l.v[j].size != c->files[i].size)
            snprintf(missing, missingsz, "'%s' is stored with %lld bytes, its part says %llu",
                     key, (long long)l.v[j].size, (unsigned long long)c->files[i].size);
        else if (l.v[j].md5[0] && strcmp(l.v[j].md5, c->files[i].md5))
            snprintf(missing, missingsz, "'%s' is stored with md5 %s, its part says %s", key,
                     l.v[j].md5, c->files[i].md5);
    }
    ck_remote_list_release(&l);
    return err;
}

/* Reads the count manifests of ckpt into parts (and their bytes' MD5s). */
static int read_parts(struct run *u, const char *ckpt, struct ck_nodepart *parts,
                      char (*md5s)[33])
{
    int count = u->r->nodes->count, err = 0;
    for (int i = 0; i < count && err == 0; i++) {
        char key[PATH_MAX];
        struct ck_buf b = CK_BUF_INIT;
        part_key(key, sizeof key, ckpt, i, count);
        for (int t = 0; t < READ_TRIES; t++) {
            if (t > 0) {
                ck_error_clear();
                ck_buf_reset(&b);
                usleep(READ_WAIT_US);
            }
            if ((err = get_bytes(u, key, &b)) == 0 &&
                (err = ck_nodepart_parse(&parts[i], key, ck_buf_str(&b), b.len)) != CK_EFORMAT)
                break;
        }
        if (err == 0 &&
            (parts[i].rank != i || parts[i].count != count || strcmp(parts[i].checkpoint, ckpt)))
            err = ck_error(CK_EFORMAT, "'%s' says node %d of %d, checkpoint '%s'", key,
                           parts[i].rank, parts[i].count, parts[i].checkpoint);
        md5_of(&b, md5s[i]);
        ck_buf_release(&b);
    }
    return err;
}

/* The commit of one step whose parts are all listed. */
static void commit(struct run *u, const char *ckpt)
{
    int count = u->r->nodes->count, err;
    char key[PATH_MAX], missing[PATH_MAX + 256];
    struct ck_nodepart *parts = calloc((size_t)count, sizeof *parts);
    char(*md5s)[33] = calloc((size_t)count, sizeof *md5s);
    struct ck_nodecommit c = {0};
    struct ck_buf rec = CK_BUF_INIT, sums = CK_BUF_INIT;
    if (!parts || !md5s) {
        ck_error(CK_ENOMEM, "out of memory");
        store_failed(u, "committing", ckpt);
        goto out;
    }
    if ((err = read_parts(u, ckpt, parts, md5s)) < 0) {
        ck_err("nodes.commit_refused", "store=\"%s\" checkpoint='%s': %s: not committed", u->url,
               ckpt, ck_error_msg());
        ck_error_clear();
        u->r->refused++;
        goto out;
    }
    if ((err = ck_nodecommit_build(&c, parts, (size_t)count, (const char(*)[33])md5s)) ==
        CK_EEXIST) {
        ck_err("nodes.part_conflict", "store=\"%s\" checkpoint='%s': %s: not committed", u->url,
               ckpt, ck_error_msg());
        ck_error_clear();
        u->r->refused++;
        goto out;
    }
    if (err < 0 || (err = check_stored(u, &c, missing, sizeof missing)) < 0) {
        store_failed(u, "checking the parts' objects", ckpt);
        goto out;
    }
    if (missing[0]) {
        ck_err("nodes.commit_refused", "store=\"%s\" checkpoint='%s': %s: not committed", u->url,
               ckpt, missing);
        u->r->refused++;
        goto out;
    }
    bool created = false, sums_created;
    snprintf(key, sizeof key, COMMITS_DIR "/%s.yaml", ckpt);
    if ((err = ck_nodecommit_emit(&c, &rec)) == 0)
        err = put_same(u, key, &rec, true, &created);
    if (err == CK_EEXIST) {
        ck_err("nodes.commit_differs",
               "store=\"%s\" checkpoint='%s': '%s' exists with other bytes than these parts "
               "make: left as it is (%s)", u->url, ckpt, key, ck_error_msg());
        ck_error_clear();
        u->r->refused++;
        goto out;
    }
    if (err < 0) {
        store_failed(u, "writing the commit record", ckpt);
        goto out;
    }
    snprintf(key, sizeof key, CKPT_DIR "/%s.md5sums", ckpt);
    if ((err = ck_nodecommit_md5sums(&c, &sums)) < 0 ||
        (err = put_same(u, key, &sums, false, &sums_created)) < 0) {
        store_failed(u, "writing the .md5sums", ckpt);
        goto out;
    }
    uint64_t bytes = 0;
    for (size_t i = 0; i < c.nfiles; i++)
        bytes += c.files[i].size;
    ck_info("nodes.committed", "store=\"%s\" checkpoint='%s' nodes=%d files=%zu bytes=%llu "
            "created=%s%s", u->url, ckpt, count, c.nfiles, (unsigned long long)bytes,
            created ? "yes" : "no", created ? "" : ": the record was there with these bytes");
    struct done *grown = realloc(u->commits, (u->ncommits + 1) * sizeof *grown);
    char *name = grown ? strdup(ckpt) : NULL;
    if (grown)
        u->commits = grown;
    if (!name) {
        ck_error(CK_ENOMEM, "out of memory");
        store_failed(u, "committing", ckpt);
        goto out;
    }
    u->commits[u->ncommits++] = (struct done){name, created, c.epoch, c.nfiles, bytes};
    u->r->committed++;
    if (created)
        ck_metrics_add(CK_M_NODES_STEPS_COMMITTED, 1);
out:
    for (int i = 0; parts && i < count; i++)
        ck_nodepart_release(&parts[i]);
    free(parts);
    free(md5s);
    ck_nodecommit_release(&c);
    ck_buf_release(&rec);
    ck_buf_release(&sums);
}

/* ---- the training status across nodes ---- */

/* A node's status record, .ckptd/nodes/node-R-of-N.yaml: written by a node
 * whose training failed, and by rank 0 once its training finished and each
 * of its steps is committed in the store. Its bytes come from the node's own
 * metadata.yaml (the status and its end time), so a rewrite writes the same. */
static void status_key(char *out, size_t outsz, int rank, int count)
{
    snprintf(out, outsz, STATUS_DIR "/node-%d-of-%d.yaml", rank, count);
}

static void status_emit(struct ck_buf *b, enum ck_pmf_status st, double when)
{
    ck_buf_printf(b, "training: %s\ntime: %.3f\n", ck_pmf_status_name(st), when);
}

/* Parses a record (hostile: it comes back from a shared store): exactly the
 * two lines status_emit writes, finished or failed, a time that is a finite
 * non-negative number. */
static int status_parse(const char *key, const char *data, size_t len, enum ck_pmf_status *st,
                        double *when)
{
    char word[16], rest[2];
    double t = 0;
    int used = 0;
    if (len > STATUS_MAX || memchr(data, '\0', len))
        return ck_error(CK_EFORMAT, "'%s': not a node's status record", key);
    char text[STATUS_MAX + 1];
    memcpy(text, data, len);
    text[len] = '\0';
    if (sscanf(text, "training: %15[a-z]\ntime: %lf\n%n%1s", word, &t, &used, rest) != 2 ||
        used != (int)len || !isfinite(t) || t < 0 ||
        (strcmp(word, "finished") && strcmp(word, "failed")))
        return ck_error(CK_EFORMAT, "'%s': not a node's status record (training: finished or "
                        "failed, then time:)", key);
    *st = strcmp(word, "failed") ? CK_PMF_FINISHED : CK_PMF_FAILED;
    *when = t;
    return 0;
}

/* This node's record, when its status says the store's training should
 * end: failed at once; finished (rank 0 only) once none of its steps waits
 * in this store (pending). Written when the store does not hold these bytes. */
static void node_status(struct run *u, bool pending)
{
    const struct ck_nodes *n = u->r->nodes;
    bool failed = u->local_status == CK_PMF_FAILED;
    if (!failed && !(n->rank == 0 && u->local_status == CK_PMF_FINISHED && !pending))
        return;
    char key[PATH_MAX];
    struct ck_buf want = CK_BUF_INIT, have = CK_BUF_INIT;
    status_key(key, sizeof key, n->rank, n->count);
    status_emit(&want, u->local_status, u->local_end);
    int err = get_bytes(u, key, &have);
    if (err == 0 && have.len == want.len && !memcmp(ck_buf_str(&have), ck_buf_str(&want), want.len))
        goto out;
    ck_error_clear();
    if ((err = put_bytes(u, key, &want, false, true, NULL)) < 0) {
        store_failed(u, "writing this node's training status", "*");
        goto out;
    }
    ck_info("nodes.status_written", "store=\"%s\" key=\"%s\" status=%s", u->url, key,
            ck_pmf_status_name(u->local_status));
out:
    ck_buf_release(&want);
    ck_buf_release(&have);
}

/* The store's training status from the nodes' records: failed when any
 * node's says so (at the earliest failure), finished when rank 0's does;
 * else running. A record that does not parse is left out, and said. */
static int store_status(struct run *u, enum ck_pmf_status *st, double *when)
{
    struct ck_remote_list l = {0};
    int count = u->r->nodes->count;
    *st = CK_PMF_RUNNING;
    *when = 0;
    int err = ck_store_list(u->store, STATUS_DIR, &l);
    for (size_t i = 0; err == 0 && i < l.n; i++) {
        int rank = node_file_rank(ck_basename(l.v[i].key), count);
        if (rank < 0)
            continue;
        struct ck_buf b = CK_BUF_INIT;
        enum ck_pmf_status s = CK_PMF_RUNNING;
        double t = 0;
        if ((err = get_bytes(u, l.v[i].key, &b)) == 0 &&
            status_parse(l.v[i].key, ck_buf_str(&b), b.len, &s, &t) < 0) {
            ck_warn("nodes.status_unreadable", "store=\"%s\" %s: left out", u->url,
                    ck_error_msg());
            ck_error_clear();
        } else if (err == 0 && s == CK_PMF_FAILED) {
            if (*st != CK_PMF_FAILED || t < *when)
                *when = t;
            *st = CK_PMF_FAILED;
        } else if (err == 0 && rank == 0 && *st == CK_PMF_RUNNING) {
            *st = CK_PMF_FINISHED;
            *when = t;
        }
        ck_buf_release(&b);
    }
    ck_remote_list_release(&l);
    return err;
}

/* ---- rank 0 restarted with an empty disk ---- */

/* Rank 0's folder starts a new local tree (an empty disk, a new machine),
 * with a model id of its own, while the store holds the run's model record:
 * the store's identity stays. Rank 0 takes the model id (and the name, unless
 * the config sets one) of the first store's record into its own
 * metadata.yaml and state, before its model record goes: the store's
 * metadata.yaml keeps naming the run it has named. A store that cannot be
 * read is left for the next round (this one's record is not sent). */
static int adopt_identity(struct run *u, struct ck_net *net, const char *meta_path,
                          struct ck_pmf_meta *local)
{
    struct ck_pmf_meta rec;
    struct ck_buf b = CK_BUF_INIT, out = CK_BUF_INIT;
    char url[1024];
    ck_pmf_meta_init(&rec);
    ck_store_url_redact(url, sizeof url, u->r->cfg->upload_stores[0].url);
    int err = ck_store_open(&u->store, &u->r->cfg->upload_stores[0], net);
    if (err == 0 && (err = get_bytes(u, MODEL_KEY, &b)) == CK_ENOENT) {
        ck_error_clear(); /* the run's first record is this node's */
        err = 0;
        goto out;
    }
    if (err == 0)
        err = ck_pmf_parse(&rec, MODEL_KEY, ck_buf_str(&b), b.len);
    if (err < 0 || !rec.id || !strcmp(rec.id, local->id))
        goto out;
    ck_info("nodes.identity_adopted", "store=\"%s\" model_id=%s was=%s: this node's tree is new; "
            "the run's model record in the store names the model", url, rec.id, local->id);
    char *id = strdup(rec.id), *name = rec.name && !u->r->cfg->model_name ? strdup(rec.name)
                                                                          : NULL;
    if (!id || (rec.name && !u->r->cfg->model_name && !name)) {
        free(id);
        free(name);
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    free(local->id);
    local->id = id;
    if (name) {
        free(local->name);
        local->name = name;
    }
    if ((err = ck_pmf_emit(local, &out)) == 0 &&
        (err = ck_write_file_atomic(meta_path, ck_buf_str(&out), out.len, 0644)) == 0)
        err = ck_state_set(u->r->st, "model_id", local->id);
out:
    if (err < 0)
        ck_err("nodes.identity_unknown", "store=\"%s\": %s: the model record waits", url,
               ck_error_msg());
    ck_store_free(u->store);
    u->store = NULL;
    ck_pmf_meta_release(&rec);
    ck_buf_release(&b);
    ck_buf_release(&out);
    return err;
}

/* ---- metadata.yaml from the records ---- */

static int cmp_rec(const void *a, const void *b)
{
    const struct ck_nodecommit *x = a, *y = b;
    if (x->epoch != y->epoch)
        return x->epoch < y->epoch ? -1 : 1;
    if (x->has_step && y->has_step && x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return strcmp(x->checkpoint, y->checkpoint);
}

/* The record keys a listing of the commits folder shows, sorted. */
static int list_records(struct run *u, struct ck_remote_list *l)
{
    int err = ck_store_list(u->store, COMMITS_DIR, l);
    size_t kept = 0;
    for (size_t i = 0; err == 0 && i < l->n; i++) {
        const char *k = l->v[i].key, *name = ck_basename(k);
        size_t nl = strlen(name);
        if (nl > 5 && !strcmp(name + nl - 5, ".yaml") && ck_basename(k) - k == sizeof COMMITS_DIR)
            l->v[kept++] = l->v[i];
        else
            free(l->v[i].key);
    }
    if (err == 0)
        l->n = kept;
    return err;
}

/* ---- what this node has read of the store, kept ----
 *
 * A commit record is created once and never changed (a conditional create;
 * where the condition is ignored, the same bytes), and a step's .md5sums,
 * once stored, stays. So a round reads only the records it has not read
 * before, and looks for a .md5sums only once: without this a round costs a
 * GET and a HEAD per committed step, and a run of S steps S^2 requests.
 * The cache is DIR/.ckptd/nodes/store-H/ (H: the store's URL's MD5, 12 hex
 * digits): NAME.yaml, a record as read, used when the listing reports its
 * MD5 and the copy has it (a store that reports none, the file store, is
 * read each time: it is local); NAME.md5sums-ok, the MD5 of the .md5sums
 * this node found stored or wrote. A cache that cannot be written costs
 * requests, not correctness (the store's bytes decide). */
static int cache_file(struct run *u, const char *name, const char *suffix, char *out,
                      size_t outsz)
{
    char hex[33], dir[PATH_MAX];
    const char *url = u->r->cfg->upload_stores[u->si].url;
    struct ck_buf ub = {(char *)url, strlen(url), 0, 0}; /* borrowed, read only */
    md5_of(&ub, hex);
    hex[12] = '\0';
    int n = snprintf(dir, sizeof dir, "%s/nodes/store-%s", u->r->st->dir, hex);
    if (n < 0 || (size_t)n >= sizeof dir)
        return ck_error(CK_ESIZE, "path too long: '%s'", u->r->st->dir);
    int err = ck_mkdirs(dir, 0700);
    if (err == 0 && ((n = snprintf(out, outsz, "%s/%s%s", dir, name, suffix)) < 0 ||
                     (size_t)n >= outsz))
        err = ck_error(CK_ESIZE, "path too long: '%s'", name);
    return err;
}

/* A record as the listing entry e names it: the cached copy when it has the
 * listed MD5, else the store's (kept when it has it). */
static int get_record(struct run *u, const struct ck_remote_entry *e, struct ck_buf *out)
{
    char path[PATH_MAX], md5[33];
    bool cacheable = e->md5[0] && cache_file(u, ck_basename(e->key), "", path, sizeof path) == 0;
    ck_error_clear();
    if (cacheable && ck_read_file(path, CK_NODEPART_MAX, out) == 0) {
        md5_of(out, md5);
        if (!strcmp(md5, e->md5))
            return 0;
    }
    ck_error_clear();
    ck_buf_reset(out);
    int err = get_bytes(u, e->key, out);
    if (err == 0 && cacheable) {
        md5_of(out, md5);
        if (!strcmp(md5, e->md5) &&
            ck_write_file_replace_nosync(path, ck_buf_str(out), out->len, 0600) < 0)
            ck_error_clear();
    }
    return err;
}

/* Whether this node found the step's .md5sums stored with these bytes before. */
static bool sums_known(struct run *u, const char *ckpt, const char md5[33])
{
    char path[PATH_MAX], have[40];
    bool yes = cache_file(u, ckpt, ".md5sums-ok", path, sizeof path) == 0 &&
               ck_read_small_at(AT_FDCWD, path, true, have, sizeof have) == 32 &&
               !strcmp(have, md5);
    ck_error_clear();
    return yes;
}

static void sums_stored(struct run *u, const char *ckpt, const char md5[33])
{
    char path[PATH_MAX];
    if (cache_file(u, ckpt, ".md5sums-ok", path, sizeof path) < 0 ||
        ck_write_file_replace_nosync(path, md5, 32, 0600) < 0)
        ck_error_clear();
}

/* The model record's identity, configuration and initialisation, with no
 * checkpoint and pending status: the base every writer starts from. */
static int model_base(struct run *u, struct ck_pmf_meta *m)
{
    struct ck_buf b = CK_BUF_INIT;
    int err = get_bytes(u, MODEL_KEY, &b);
    if (err == 0)
        err = ck_pmf_parse(m, MODEL_KEY, ck_buf_str(&b), b.len);
    ck_buf_release(&b);
    if (err < 0)
        return err;
    for (size_t i = 0; i < m->ncheckpoints; i++) {
        ck_pmf_ref_release(&m->checkpoints[i].ref);
        free(m->checkpoints[i].path);
    }
    m->ncheckpoints = 0;
    if (m->has_latest)
        ck_pmf_ref_release(&m->latest);
    m->has_latest = false;
    m->status = CK_PMF_PENDING;
    m->start_time.set = m->latest_time.set = m->end_time.set = false;
    m->start_epoch.set = m->latest_epoch.set = m->end_epoch.set = false;
    return 0;
}

/* Builds metadata.yaml from the records in l (their .md5sums written when
 * missing), into out; *nrec the records it lists. */
static int build_meta(struct run *u, const struct ck_remote_list *l, struct ck_buf *out)
{
    struct ck_nodecommit *recs = calloc(l->n ? l->n : 1, sizeof *recs);
    struct ck_pmf_meta m;
    size_t n = 0;
    int err = 0;
    ck_pmf_meta_init(&m);
    if (!recs)
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < l->n && err == 0; i++) {
        struct ck_buf b = CK_BUF_INIT;
        for (int t = 0; t < READ_TRIES; t++) {
            if (t > 0) {
                ck_error_clear();
                ck_buf_reset(&b);
                usleep(READ_WAIT_US);
            }
            if ((err = get_record(u, &l->v[i], &b)) == 0 &&
                (err = ck_nodecommit_parse(&recs[n], l->v[i].key, ck_buf_str(&b), b.len)) !=
                    CK_EFORMAT)
                break;
        }
        if (err == 0) {
            char want[PATH_MAX];
            snprintf(want, sizeof want, COMMITS_DIR "/%s.yaml", recs[n].checkpoint);
            if (strcmp(want, l->v[i].key) || !ref_is_key_safe(recs[n].checkpoint))
                err = ck_error(CK_EFORMAT, "'%s' is the record of '%s'", l->v[i].key,
                               recs[n].checkpoint);
            n += err == 0;
        }
        ck_buf_release(&b);
    }
    if (err == 0)
        err = model_base(u, &m);
    qsort(recs, n, sizeof *recs, cmp_rec);
    for (size_t i = 0; i < n && err == 0; i++) {
        /* the .md5sums first: metadata.yaml names it (a committer may have died before it) */
        struct ck_buf sums = CK_BUF_INIT;
        struct ck_remote_obj o;
        char key[PATH_MAX], md5[33];
        snprintf(key, sizeof key, CKPT_DIR "/%s.md5sums", recs[i].checkpoint);
        if ((err = ck_nodecommit_md5sums(&recs[i], &sums)) == 0 &&
            (md5_of(&sums, md5), !sums_known(u, recs[i].checkpoint, md5))) {
            int e = ck_store_stat(u->store, key, &o);
            if (e == CK_ENOENT || (e == 0 && (o.size != (int64_t)sums.len ||
                                              (o.md5[0] && strcmp(o.md5, md5))))) {
                bool wrote;
                ck_error_clear();
                err = put_same(u, key, &sums, false, &wrote);
            } else {
                err = e;
            }
            if (err == 0)
                sums_stored(u, recs[i].checkpoint, md5);
        }
        ck_buf_release(&sums);
        struct ck_pmf_ref ref = {false, 0, recs[i].checkpoint};
        if (err == 0)
            err = ck_pmf_register(&m, &ref, recs[i].epoch, key, md5, recs[i].settled,
                                  recs[i].epoch);
    }
    /* the training's status from the nodes' records, once a step is listed
     * (PMF: pending cannot become finished) */
    enum ck_pmf_status st = CK_PMF_RUNNING;
    double when = 0;
    if (err == 0 && n > 0 && (err = store_status(u, &st, &when)) == 0 && st != CK_PMF_RUNNING)
        err = ck_pmf_set_status(&m, st, when);
    if (err == 0)
        err = ck_pmf_emit(&m, out);
    for (size_t i = 0; i < n; i++)
        ck_nodecommit_release(&recs[i]);
    free(recs);
    ck_pmf_meta_release(&m);
    return err;
}

static bool same_keys(const struct ck_remote_list *a, const struct ck_remote_list *b)
{
    if (a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->v[i].key, b->v[i].key))
            return false;
    return true;
}

static bool has_record(const struct ck_remote_list *recs, const char *ckpt)
{
    char key[PATH_MAX];
    snprintf(key, sizeof key, COMMITS_DIR "/%s.yaml", ckpt);
    for (size_t i = 0; i < recs->n; i++)
        if (!strcmp(recs->v[i].key, key))
            return true;
    return false;
}

/* Whether the listing l shows the record of every step this node
 * committed on this store in this run. */
static bool lists_done(const struct run *u, const struct ck_remote_list *l)
{
    for (size_t i = 0; i < u->ncommits; i++)
        if (!has_record(l, u->commits[i].checkpoint))
            return false;
    return true;
}

/* Whether the store's metadata.yaml (file: its bytes, as this round read
 * them) lists a step whose record exists but that the listing l does not show. Records are never deleted (a node of several has no
 * retention), so such a listing is stale: another node created a record
 * after it, and wrote the file since. Written from l, the file would lose
 * that step until the next round. A file that cannot be read or parsed is
 * not ahead (ours replaces it). */
static bool store_is_ahead(struct run *u, const struct ck_remote_list *l,
                           const struct ck_buf *file)
{
    struct ck_pmf_meta m;
    bool ahead = false;
    ck_pmf_meta_init(&m);
    if (file->len && ck_pmf_parse(&m, "metadata.yaml", ck_buf_str(file), file->len) == 0) {
        for (size_t i = 0; i < m.ncheckpoints && !ahead; i++) {
            char name[PATH_MAX - 32], key[PATH_MAX]; /* a record's key fits */
            struct ck_remote_obj o;
            ck_pmf_ref_str(&m.checkpoints[i].ref, name, sizeof name);
            snprintf(key, sizeof key, COMMITS_DIR "/%s.yaml", name);
            /* a step the store lists with no record at all (another
             * writer's file: a single node's, by hand) is not committed:
             * ours replaces it */
            ahead = !has_record(l, name) && ref_is_key_safe(name) &&
                    ck_store_stat(u->store, key, &o) == 0;
        }
    }
    ck_error_clear();
    ck_pmf_meta_release(&m);
    return ahead;
}

/* metadata.yaml from every record, and read back: done once the store's
 * file has the bytes computed from a listing of the records that shows
 * every record this node committed. Written when its bytes differ, then
 * the records listed again (one that appeared meanwhile: computed and
 * written again) and the file read back; at most MAX_META_ROUNDS rounds.
 * A committer that reports success has read its steps in the store's
 * metadata.yaml (docs/multinode.md). */
static void refresh_meta(struct run *u)
{
    struct ck_remote_list l = {0}, again = {0};
    struct ck_buf meta = CK_BUF_INIT, old = CK_BUF_INIT;
    bool built = false, wrote = false, ok = false;
    int err = list_records(u, &l), writes = 0;
    for (int round = 0; err == 0 && round < MAX_META_ROUNDS; round++) {
        if (round > 0) {
            if ((err = list_records(u, &again)) < 0)
                break;
            if (!same_keys(&l, &again))
                built = false;
            ck_remote_list_release(&l);
            l = again;
            again = (struct ck_remote_list){0};
        }
        if (l.n == 0 && u->ncommits == 0) {
            ok = true; /* no record: the nodes write no metadata.yaml */
            break;
        }
        if (!lists_done(u, &l)) { /* a listing behind this node's own records */
            usleep(READ_WAIT_US);
            continue;
        }
        if (!built) {
            ck_buf_reset(&meta);
            if ((err = build_meta(u, &l, &meta)) < 0)
                break;
            built = true;
        }
        /* the store's file: once written by this node, read back as another
         * writer's PUT of it may be half-done (s3rver) */
        bool equal = false;
        if (wrote) {
            read_back(u, "metadata.yaml", &meta, &equal, &old);
        } else {
            ck_buf_reset(&old);
            equal = get_bytes(u, "metadata.yaml", &old) == 0 && old.len == meta.len &&
                    !memcmp(ck_buf_str(&old), ck_buf_str(&meta), meta.len);
        }
        ck_error_clear();
        if (equal) {
            ok = true;
            break;
        }
        if (store_is_ahead(u, &l, &old)) { /* list again: the next round has the record */
            ck_info("nodes.listing_behind", "store=\"%s\": the store's metadata.yaml lists a "
                    "step this listing of the records does not: listed again", u->url);
            built = false;
            continue;
        }
        if ((err = put_bytes(u, "metadata.yaml", &meta, false, true, NULL)) == 0) {
            ck_info("nodes.metadata_written", "store=\"%s\" checkpoints=%zu", u->url, l.n);
        } else {
            /* the check after the PUT may have met another writer's PUT: the
             * store's bytes decide */
            char why[1024];
            snprintf(why, sizeof why, "%s", ck_error_msg());
            ck_error_clear();
            read_back(u, "metadata.yaml", &meta, &equal, NULL);
            ck_error_clear();
            if (!equal) {
                err = ck_error(err, "%s", why);
                break;
            }
            err = 0;
        }
        wrote = true;
        writes++;
    }
    if (err == 0 && !ok)
        err = ck_error(CK_ECHANGED, "the store's metadata.yaml did not hold the file computed "
                       "from its %zu record(s) after %d round(s) (%d write(s))%s", l.n,
                       MAX_META_ROUNDS, writes, lists_done(u, &l) ? "" : "; the listing of "
                       "the records does not show every record this node committed");
    if (err < 0)
        store_failed(u, "writing metadata.yaml", "*");
    ck_buf_release(&meta);
    ck_buf_release(&old);
    ck_remote_list_release(&l);
    ck_remote_list_release(&again);
}

/* ---- one store ---- */

/* A step whose part is in and that waits for other nodes': logged, left for
 * `ckptd status`, counted in the gauge, and its next look scheduled. */
static void log_waiting(struct run *u, const struct ck_nodepart *p, const bool *have)
{
    char ranks[512] = "";
    size_t missing = 0;
    for (int i = 0; i < u->r->nodes->count; i++) {
        if (have[i])
            continue;
        missing++;
        if (strlen(ranks) < sizeof ranks - 16)
            snprintf(ranks + strlen(ranks), sizeof ranks - strlen(ranks), "%s%d",
                     ranks[0] ? "," : "", i);
    }
    ck_info("nodes.waiting", "store=\"%s\" checkpoint='%s' missing_ranks=%s", u->url,
            p->checkpoint, ranks);
    ck_buf_printf(&u->waiting, "%s\t%s\t%s\n", p->checkpoint, ranks, u->url);
    u->r->waiting++;
    u->r->parts_missing += missing;
    /* waited w seconds since this node settled its part: look again after w
     * (1 s to the cap), so the looks double their spacing as the wait grows */
    double look = ck_wall_s() - p->settled;
    look = look < 1.0 ? 1.0 : look > CK_NODES_LOOK_MAX_S ? CK_NODES_LOOK_MAX_S : look;
    if (u->r->next_look < 0 || look < u->r->next_look)
        u->r->next_look = look;
}

/* This node's part of one step: its manifest once its files are in, then the commit when the
 * set is complete. */
static void one_step(struct run *u, struct local *l, bool rank0_ready, bool *have)
{
    const struct ck_nodepart *p = &l->part;
    char key[PATH_MAX];
    struct ck_buf b = CK_BUF_INIT;
    int err, nhave;
    if (!rank0_ready || !all_done(u->r->st->db, l->jobs[u->si], p->nfiles)) {
        ck_info("nodes.part_not_stored", "store=\"%s\" checkpoint='%s': this node's files are "
                "not all stored yet: its part manifest waits", u->url, p->checkpoint);
        u->r->waiting++;
        return;
    }
    /* one listing: the other parts, and whether this node's is there already */
    char own[33], mine[33];
    if ((err = listed_ranks(u, p->checkpoint, have, &nhave, own)) < 0 ||
        (err = ck_nodepart_emit(p, &b)) < 0) {
        ck_buf_release(&b);
        store_failed(u, "listing the parts", p->checkpoint);
        return;
    }
    md5_of(&b, mine);
    part_key(key, sizeof key, p->checkpoint, p->rank, p->count);
    /* written when absent, or when the store reports no MD5 to compare (the
     * conditional write then says whether the stored one has these bytes);
     * listed with another MD5: another part of this node, never replaced
     * (not even on a store that ignores the condition) */
    if (have[p->rank] && own[0] && strcmp(own, mine)) {
        err = CK_EEXIST;
        ck_err("nodes.part_conflict", "store=\"%s\" checkpoint='%s': '%s' exists with "
               "another part of this node (its files changed after it was announced): the "
               "first stays", u->url, p->checkpoint, key);
        ck_buf_release(&b);
        u->r->refused++;
        return;
    }
    if (!have[p->rank] || !own[0]) {
        bool same = false;
        err = put_bytes(u, key, &b, true, false, &same);
        if (err == CK_EEXIST && !same) {
            ck_err("nodes.part_conflict", "store=\"%s\" checkpoint='%s': '%s' exists with "
                   "another part of this node (its files changed after it was announced): the "
                   "first stays", u->url, p->checkpoint, key);
            ck_error_clear();
            ck_buf_release(&b);
            u->r->refused++;
            return;
        }
        if (err == 0) {
            ck_info("nodes.part_written", "store=\"%s\" checkpoint='%s' key=\"%s\" files=%zu",
                    u->url, p->checkpoint, key, p->nfiles);
            u->r->parts_written++;
        } else if (err == CK_EEXIST) {
            ck_error_clear();
        } else {
            ck_buf_release(&b);
            store_failed(u, "writing the part manifest", p->checkpoint);
            return;
        }
        /* The listing above ran before this write: another node writing its
         * manifest meanwhile was not in it, and that node's listing may have
         * run before this write too; both would wait, and nobody commit.
         * Listed again now that this node's manifest is stored, the node
         * whose listing starts last sees every manifest stored before it:
         * every node's (docs/multinode.md, "What the protocol relies on"). */
        if ((err = listed_ranks(u, p->checkpoint, have, &nhave, own)) < 0) {
            ck_buf_release(&b);
            store_failed(u, "listing the parts again", p->checkpoint);
            return;
        }
        if (!have[p->rank]) /* a listing that lags: this node's is stored */
            nhave++;
        have[p->rank] = true;
    }
    ck_buf_release(&b);
    if (nhave < p->count) {
        log_waiting(u, p, have);
        return;
    }
    /* the record may have appeared since the listing of the records */
    char rkey[PATH_MAX];
    struct ck_remote_obj o;
    snprintf(rkey, sizeof rkey, COMMITS_DIR "/%s.yaml", p->checkpoint);
    if ((err = ck_store_stat(u->store, rkey, &o)) == 0)
        return;
    if (err != CK_ENOENT) {
        store_failed(u, "looking for the commit record", p->checkpoint);
        return;
    }
    ck_error_clear();
    commit(u, p->checkpoint);
}

static void one_store(struct run *u, struct ck_net *net)
{
    const struct ck_store_spec *spec = &u->r->cfg->upload_stores[u->si];
    struct ck_remote_list recs = {0};
    ck_store_url_redact(u->url, sizeof u->url, spec->url);
    if (ck_store_open(&u->store, spec, net) < 0) {
        store_failed(u, "opening the store", "*");
        return;
    }
    bool *have = calloc((size_t)u->r->nodes->count, sizeof *have);
    if (!have || list_records(u, &recs) < 0) {
        if (!have)
            ck_error(CK_ENOMEM, "out of memory");
        store_failed(u, "listing the commit records", "*");
        goto out;
    }
    bool rank0_ready = u->r->nodes->rank != 0 || all_done(u->r->st->db, u->extra[u->si],
                                                          u->nextra);
    size_t before = u->r->waiting + u->r->refused + u->r->failed;
    for (size_t i = 0; i < u->n; i++)
        if (!has_record(&recs, u->v[i].part.checkpoint))
            one_step(u, &u->v[i], rank0_ready, have);
    /* a step of this node not committed in this store keeps rank 0's
     * training from finishing there */
    node_status(u, u->r->waiting + u->r->refused + u->r->failed != before);
    refresh_meta(u);
    /* checkpoint.committed: once per step, by the node that created its
     * record (a store that ignores If-None-Match may let two create it) */
    for (size_t i = 0; u->r->on_commit && i < u->ncommits; i++) {
        const struct done *d = &u->commits[i];
        char rkey[PATH_MAX];
        if (!d->created)
            continue;
        snprintf(rkey, sizeof rkey, COMMITS_DIR "/%s.yaml", d->checkpoint);
        struct ck_node_commit ev = {u->url, d->checkpoint, rkey, d->epoch,
                                    u->r->nodes->count, d->files, d->bytes};
        u->r->on_commit(u->r->on_commit_arg, &ev);
    }
out:
    commits_release(u);
    free(have);
    ck_remote_list_release(&recs);
    ck_store_free(u->store);
    u->store = NULL;
}

int ck_noderound_check(const struct ck_config *cfg, const struct ck_nodes *nodes)
{
    if (!ck_nodes_is_multi(nodes))
        return 0;
    if (!cfg->n_upload_stores)
        return ck_error(CK_ECONFIG, "nodes.count %d (%s): a node of several needs upload.stores, "
                        "where the nodes' parts meet", nodes->count, nodes->count_from);
    for (size_t i = 0; i < cfg->n_upload_stores; i++) {
        const struct ck_store_spec *s = &cfg->upload_stores[i];
        const struct ck_store_ops *ops = ck_store_ops_find(s->url);
        if (!ops || !ops->if_absent || !ops->list)
            return ck_error(CK_ECONFIG, "nodes.count %d (%s): upload.stores[%zu] cannot list "
                            "objects and write only if a name is free (supported: s3, file)",
                            nodes->count, nodes->count_from, i);
        if (s->compress || s->bundle)
            return ck_error(CK_ECONFIG, "nodes.count %d (%s): upload.stores[%zu] sends %s: the "
                            "nodes' parts are stored as files", nodes->count, nodes->count_from,
                            i, s->bundle ? "a bundle" : "compressed files");
    }
    if (cfg->pack_formats.n)
        return ck_error(CK_ECONFIG, "nodes.count %d (%s): pack.formats is not built for a node "
                        "of several (each node holds only its part of a step)", nodes->count,
                        nodes->count_from);
    if (ck_config_has_retention(cfg))
        return ck_error(CK_ECONFIG, "nodes.count %d (%s): retention is not built for a node of "
                        "several", nodes->count, nodes->count_from);
    return 0;
}

int ck_noderound_run(struct ck_noderound *r)
{
    struct run u = {.r = r};
    struct ck_pmf_meta m;
    char meta[PATH_MAX], spool[PATH_MAX];
    int err;
    r->parts_written = r->committed = r->waiting = r->refused = r->failed = 0;
    r->parts_missing = 0;
    r->next_look = -1;
    memset(&r->upload, 0, sizeof r->upload);
    ck_pmf_meta_init(&m);
    if ((err = ck_path_join(meta, sizeof meta, r->dir, "metadata.yaml")) < 0 ||
        (err = ck_path_join(spool, sizeof spool, r->st->dir, "spool")) < 0)
        return err;
    if (!ck_exists(meta))
        return 0; /* nothing registered yet */
    if ((err = ck_layout_read_meta(meta, &m)) < 0)
        return err;
    u.local_status = m.status;
    u.local_end = m.end_time.set ? m.end_time.v : ck_wall_s();
    struct ck_upload_ctl ctl;
    struct ck_net net;
    bool net_up = false;
    ck_upload_ctl_init(&ctl, r->cfg->upload.grace);
    if ((err = ck_net_init(&net, &r->cfg->upload, r->ctl ? r->ctl : &ctl)) < 0)
        goto out;
    net_up = true;
    /* rank 0: the store's identity first (once per local tree: the state
     * says when it was checked) */
    char *checked = NULL;
    bool adopt = r->nodes->rank == 0 && ck_state_get(r->st, "nodes_identity_checked", &checked) == 0 &&
                 (!checked || strcmp(checked, m.id));
    free(checked);
    ck_error_clear();
    if (adopt) {
        if (adopt_identity(&u, &net, meta, &m) < 0) {
            ck_error_clear();
            r->failed++;
            goto out; /* its model record must not go with another identity */
        }
        if (ck_state_set(r->st, "nodes_identity_checked", m.id) < 0)
            ck_error_clear();
    }
    if ((err = load_parts(&u, &m)) < 0 || (r->nodes->rank == 0 && (err = rank0_extras(&u, &m)) < 0) ||
        (err = queue_all(&u)) < 0)
        goto out;
    /* the queue, as every upload runs (agent/upload_round.h): root NULL, the
     * jobs above and what an earlier run left */
    struct ck_upload_round round = {.cfg = r->cfg, .root = NULL, .spool = spool, .run = r->run,
                                    .quiet_when_idle = r->ctl != NULL};
    r->upload_err = r->ctl ? ck_upload_round_run(r->st->db, &round, r->ctl, &r->upload)
                           : ck_upload_round_foreground(r->st->db, &round, &r->upload);
    if (r->upload_err < 0) {
        ck_err("nodes.upload_failed", "%s", ck_error_msg());
        ck_error_clear();
    }
    for (u.si = 0; u.si < r->cfg->n_upload_stores; u.si++)
        one_store(&u, &net);
    /* what the steps wait for: the gauge, and the state for `ckptd status`
     * (a store that could not be listed leaves its steps out: not known) */
    ck_metrics_set(CK_M_NODES_PARTS_MISSING, (int64_t)r->parts_missing);
    if (ck_state_set(r->st, CK_NODES_WAITING_KEY, ck_buf_str(&u.waiting)) < 0) {
        ck_warn("nodes.status_lost", "the steps waiting for other nodes are not kept for "
                "`ckptd status`: %s", ck_error_msg());
        ck_error_clear();
    }
out:
    if (net_up)
        ck_net_release(&net);
    run_release(&u);
    ck_pmf_meta_release(&m);
    return err;
}
