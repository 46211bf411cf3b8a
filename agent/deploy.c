/* The pack and verify stages (agent/deploy.h). */
#include "agent/deploy.h"
#include "agent/mldefrec.h"
#include "agent/pack.h"
#include "agent/sdrec.h"
#include "agent/testdata.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/text.h"
#include "common/hash.h"
#include "writers/zipapp.h"
#include "infer/sandbox.h"
#include "readers/reader.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What the pack stage made, for the verify stage of the same pass (which
 * gets only the archive): the checkpoint and how to open what was written. */
struct packed {
    char *path, *ref, *format, *spec; /* spec: path, or "path#TAG" for a SameDiff tag */
    char *src;                        /* the checkpoint it was packed from */
    char *undo; /* samediff: the undo record of the archive before this tag (owned) or NULL */
    char prev[3][PATH_MAX / 4]; /* samediff: the record's tag, checkpoint, verification before */
    bool repack;                /* samediff: rolled back with an earlier tag: append again */
    bool passed;                /* samediff: verified this pass and passed */
};
static struct packed *packed;
static size_t npacked;

static int remember(const char *path, const char *ref, const char *format, const char *tag,
                    const char *src)
{
    struct packed *v = realloc(packed, (npacked + 1) * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    packed = v;
    char spec[PATH_MAX + 300];
    snprintf(spec, sizeof spec, tag && tag[0] ? "%s#%s" : "%s", path, tag);
    struct packed *e = &packed[npacked];
    e->path = strdup(path);
    e->ref = strdup(ref);
    e->format = strdup(format);
    e->spec = strdup(spec);
    e->src = strdup(src);
    e->undo = NULL;
    e->repack = e->passed = false;
    if (!e->path || !e->ref || !e->format || !e->spec || !e->src) {
        free(e->path), free(e->ref), free(e->format), free(e->spec), free(e->src);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    npacked++;
    return 0;
}

/* Takes the entry of path out of the table (the caller frees it). */
static bool take(const char *path, struct packed *out)
{
    for (size_t i = 0; i < npacked; i++)
        if (!strcmp(packed[i].path, path)) {
            *out = packed[i];
            /* in order: the SameDiff gate relies on append order */
            memmove(&packed[i], &packed[i + 1], (npacked - i - 1) * sizeof *packed);
            npacked--;
            return true;
        }
    return false;
}

static void packed_free(struct packed *e)
{
    free(e->path), free(e->ref), free(e->format), free(e->spec), free(e->src), free(e->undo);
}

static const char *model_name(const struct ck_pipeline *p, char *buf, size_t n)
{
    if (p->cfg->model_name)
        return p->cfg->model_name;
    char real[PATH_MAX];
    snprintf(buf, n, "%s", ck_basename(realpath(p->dir, real) ? real : p->dir));
    return buf;
}

/* a reference as a file name: what is not [A-Za-z0-9._-] becomes '_' */
static void safe_name(char *out, size_t n, const char *s)
{
    size_t i = 0;
    for (; s[i] && i + 1 < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '-' || c == '_';
        out[i] = ok && !(i == 0 && c == '.') ? c : '_';
    }
    out[i] = '\0';
}

static int deploy_dir(const struct ck_pipeline *p, char *out, size_t n)
{
    const char *d = p->cfg->pack_dir ? p->cfg->pack_dir : "data/deploy";
    if (d[0] == '/')
        return snprintf(out, n, "%s", d) < (int)n ? 0 : ck_error(CK_EUSAGE, "pack.dir too long");
    return ck_path_join(out, n, p->dir, d);
}

static void emit(const struct ck_pipeline *p, struct ck_event *ev)
{
    if (p->hooks && ck_hooks_emit(p->hooks, p->st->db, ev) < 0)
        ck_warn("hooks.emit_failed", "type=%s: %s", ck_event_type_name(ev->type), ck_error_msg());
}

static void event_base(const struct ck_pipeline *p, struct ck_event *ev, const char *ref,
                       const char *model)
{
    ev->dir = p->dir;
    ev->model_name = model;
    ev->checkpoint = ref;
}

/* ---- the gate's undo records for SameDiff tags (hold: a failed tag is taken back) ---- */

/* The state folder's undo/ and a fresh record name for the archive name. */
static int undo_path(const struct ck_pipeline *p, const char *name, char *out, size_t n)
{
    static unsigned seq;
    char dir[PATH_MAX];
    int err;
    if ((err = ck_path_join(dir, sizeof dir, p->st->dir, "undo")) < 0 ||
        (err = ck_mkdirs(dir, 0700)) < 0)
        return err;
    if (snprintf(out, n, "%s/%s.%ld.%u", dir, name, (long)getpid(), ++seq) >= (int)n)
        return ck_error(CK_ESIZE, "'%s': path too long", dir);
    return 0;
}

/* Undo records a killed pass left (its tags were never verified): the
 * archive goes back to before the oldest of them (the shortest length). */
static void gate_leftovers(const struct ck_pipeline *p, const char *path, const char *name)
{
    char dir[PATH_MAX], f[PATH_MAX], best[PATH_MAX] = "";
    uint64_t bestlen = UINT64_MAX, len;
    size_t nl = strlen(name);
    if (ck_path_join(dir, sizeof dir, p->st->dir, "undo") < 0)
        return;
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *de; (de = readdir(d));) {
        if (strncmp(de->d_name, name, nl) || de->d_name[nl] != '.' ||
            ck_path_join(f, sizeof f, dir, de->d_name) < 0)
            continue;
        if (ck_zipapp_undo_length(f, &len) < 0) {
            ck_error_clear();
            continue;
        }
        if (len < bestlen) {
            if (best[0])
                unlink(best);
            bestlen = len;
            snprintf(best, sizeof best, "%s", f);
        } else {
            unlink(f);
        }
    }
    closedir(d);
    if (!best[0])
        return;
    if (ck_zipapp_restore(path, best) < 0)
        ck_err("archive.rollback_failed", "'%s': tags never verified stay: %s", path,
               ck_error_msg());
    else
        ck_warn("archive.unverified_rolled_back",
                "'%s': tags appended by a pass that stopped before verifying them were taken "
                "back",
                path);
}

/* Before an append: the archive's undo record (and what a killed pass left, undone). */
static int gate_snapshot(const struct ck_pipeline *p, const char *path, const char *name,
                         char *undo, size_t n)
{
    bool pending = false;
    for (size_t i = 0; i < npacked && !pending; i++)
        pending = !strcmp(packed[i].path, path);
    if (!pending)
        gate_leftovers(p, path, name);
    int err = undo_path(p, name, undo, n);
    if (err == 0 && (err = ck_zipapp_snapshot(path, undo)) < 0)
        undo[0] = '\0';
    return err;
}

/* The archive's record before this append: what a roll-back of every tag of the pass restores. */
static void gate_prev(const struct ck_pipeline *p, const char *name, char prev[3][PATH_MAX / 4])
{
    static const char *const keys[3] = {"tag", "checkpoint", "verification"};
    for (int k = 0; k < 3; k++)
        if (ck_deploy_record_get(p->dir, name, keys[k], prev[k], PATH_MAX / 4) < 0) {
            ck_error_clear();
            prev[k][0] = '\0';
        }
}

static int gate_remember(const char *undo, char prev[3][PATH_MAX / 4])
{
    struct packed *e = &packed[npacked - 1];
    if (!(e->undo = strdup(undo)))
        return ck_error(CK_ENOMEM, "out of memory");
    memcpy(e->prev, prev, sizeof e->prev);
    return 0;
}

/* One format of one checkpoint: the archive written, recorded, announced. */
static int pack_one(const struct ck_pipeline *p, const char *ref, const char *src,
                    const char *format, struct ck_archives *out)
{
    char dir[PATH_MAX], path[PATH_MAX], name[512], mbuf[256], key[PATH_MAX];
    const char *model = model_name(p, mbuf, sizeof mbuf);
    const struct ck_writer_ops *ops = ck_writer_find(format);
    int err;
    if (!ops)
        return ck_error(CK_EUSAGE, "unknown archive format '%s'", format);
    if (!strcmp(format, "samediff"))
        safe_name(name, sizeof name - 8, model);
    else
        safe_name(name, sizeof name - 8, ref);
    strcat(name, ops->extension);
    if ((err = deploy_dir(p, dir, sizeof dir)) < 0 || (err = ck_mkdirs(dir, 0755)) < 0 ||
        (err = ck_path_join(path, sizeof path, dir, name)) < 0)
        return err;
    struct ck_pack_opts o = {
        .format = format,
        .graph = p->cfg->pack_graph_file,
        .graph_text = p->cfg->pack_graph_yaml,
        .graph_label = p->cfg->pack_graph_label,
        .weights = p->cfg->pack_weights,
        .digest = true,
        .w = {.level = -1, .ref = ref},
    };
    if (!strcmp(format, "mldef"))
        o.w.sign_key = p->cfg->pack_sign_key;
    struct ck_pack_result r;
    char undo[PATH_MAX] = "";
    if (!strcmp(format, "samediff") && (err = gate_snapshot(p, path, name, undo, sizeof undo)) < 0)
        return err;
    if ((err = ck_pack_isolated(src, path, &o, &r)) < 0) {
        if (undo[0])
            unlink(undo); /* a failed append leaves the archive as it was */
        return err;
    }
    /* the store key: where the archive is in the tree, else deploy/NAME
     * (pack.dir may name the tree's folder by another path: compared resolved) */
    char root[PATH_MAX], real[PATH_MAX];
    if (!realpath(p->dir, root))
        snprintf(root, sizeof root, "%s", p->dir);
    if (!realpath(dir, real))
        snprintf(real, sizeof real, "%s", dir);
    size_t dl = strlen(root);
    if (!strncmp(real, root, dl) && (real[dl] == '/' || !real[dl]))
        snprintf(key, sizeof key, "%s%s%s", real + dl + (real[dl] == '/'), real[dl] ? "/" : "",
                 name);
    else
        snprintf(key, sizeof key, "deploy/%s", name);
    char size[32];
    snprintf(size, sizeof size, "%llu", (unsigned long long)r.size);
    const char *fields[14];
    size_t nf = 0;
#define FIELD(k, v) (fields[2 * nf] = (k), fields[2 * nf + 1] = (v), nf++)
    FIELD("format", format);
    FIELD("checkpoint", ref);
    FIELD("path", key);
    FIELD("size", size);
    FIELD("sha256", r.sha256);
    if (r.samediff.tag[0])
        FIELD("tag", r.samediff.tag);
    FIELD("verification", "pending");
#undef FIELD
    char prev[3][PATH_MAX / 4];
    if (undo[0])
        gate_prev(p, name, prev);
    if ((err = ck_deploy_record(p->dir, name, fields, nf)) < 0 ||
        (err = remember(path, ref, format, r.samediff.tag, src)) < 0)
        return err;
    if (undo[0] && (err = gate_remember(undo, prev)) < 0)
        return err;
    /* a SameDiff archive gets a tag per checkpoint: one upload of it per pass */
    bool listed = false;
    for (size_t i = 0; i < out->n && !listed; i++)
        listed = !strcmp(out->v[i].path, path);
    if (!listed && (err = ck_archives_add(out, path, key)) < 0)
        return err;
    ck_metrics_add(CK_M_ARCHIVES_PACKED, 1);
    ck_info("archive.packed", "checkpoint='%s' format=%s path='%s' bytes=%llu sha256=%s%s%s", ref,
            format, path, (unsigned long long)r.size, r.sha256, r.samediff.tag[0] ? " tag=" : "",
            r.samediff.tag);
    struct ck_event ev;
    if (ck_event_init(&ev, CK_EV_ARCHIVE_PACKED) == 0) {
        event_base(p, &ev, ref, model);
        ev.archive_format = format;
        ev.archive_path = path;
        ev.archive_sha256 = r.sha256;
        ev.size = (int64_t)r.size;
        emit(p, &ev);
    }
    return 0;
}

int ck_deploy_pack(struct ck_pipeline *p, const char *ref, struct ck_archives *out)
{
    const struct ck_strlist *f = &p->cfg->pack_formats;
    if (f->n == 0)
        return 0;
    struct ck_ckpt_record rec;
    char src[PATH_MAX], mbuf[256], why[1024] = "";
    int err = ck_state_ckpt_get(p->st, ref, &rec);
    if (err == 0)
        err = rec.tree_path[0] == '/' ? (snprintf(src, sizeof src, "%s", rec.tree_path), 0)
                                      : ck_path_join(src, sizeof src, p->dir, rec.tree_path);
    for (size_t i = 0; i < f->n; i++) {
        int e = err < 0 ? err : pack_one(p, ref, src, f->items[i], out);
        if (e < 0) {
            ck_metrics_add(CK_M_FAILURES_PACK, 1);
            ck_err("archive.failed", "checkpoint='%s' format=%s: %s", ref, f->items[i],
                   ck_error_msg());
            snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s: %s", why[0] ? "; " : "",
                     f->items[i], ck_error_msg());
        }
    }
    if (why[0]) {
        p->pack_failed++;
        /* once per checkpoint, whichever formats failed */
        struct ck_event ev;
        if (ck_event_init(&ev, CK_EV_ARCHIVE_FAILED) == 0) {
            event_base(p, &ev, ref, model_name(p, mbuf, sizeof mbuf));
            ev.error = why;
            emit(p, &ev);
        }
    }
    return 0; /* logged and announced here; the checkpoint goes on */
}

/* ---- verify ---- */

static int inputs_for(const struct ck_pipeline *p, const struct ck_model *m,
                      struct ck_infer_array **in, size_t *nin)
{
    const struct ck_strlist *l = &p->cfg->verify_inputs;
    *nin = m->ninputs;
    if (l->n && l->n != m->ninputs)
        return ck_error(CK_EUSAGE, "verify.inputs names %zu files, the network has %zu inputs",
                        l->n, m->ninputs);
    if (!(*in = calloc(*nin ? *nin : 1, sizeof **in)))
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t k = 0; k < *nin; k++) {
        if (l->n) {
            int err = ck_testdata_load(l->items[k], &m->inputs[k], false, &(*in)[k]);
            if (err < 0)
                return err;
            continue;
        }
        /* the same fixed inputs as `ckptd verify` without --inputs */
        int err = ck_infer_default_input(&m->inputs[k], k, 0, &(*in)[k]);
        if (err < 0)
            return err;
    }
    return 0;
}

/* 0, or CK_ERR with the output, the index and by how much it deviated from
 * want (NULL: only finite values are asked for); what names the reference */
static int check_output_atol(const struct ck_pipeline *p, const struct ck_infer_array *got,
                             const struct ck_infer_array *want, const char *what, double atol)
{
    const char *name = got->name ? got->name : "?";
    uint64_t n = ck_infer_array_numel(got);
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(got->data[i]))
            return ck_error(CK_ERR, "output '%s': value %llu is %g (not finite)", name,
                            (unsigned long long)i, (double)got->data[i]);
    if (!want)
        return 0;
    bool same = want->rank == got->rank;
    for (int d = 0; same && d < got->rank; d++)
        same = want->dims[d] == got->dims[d];
    if (!same)
        return ck_error(CK_ERR, "output '%s': shape differs from %s", name, what);
    double rtol = p->cfg->verify_rtol, worst = -1;
    uint64_t bad = 0, at = 0;
    for (uint64_t i = 0; i < n; i++) {
        double g = got->data[i], w = want->data[i], diff = fabs(g - w);
        if (diff > atol + rtol * fabs(w) || isnan(w)) {
            if (diff > worst || bad == 0) {
                worst = diff;
                at = i;
            }
            bad++;
        }
    }
    if (bad)
        return ck_error(CK_ERR,
                        "output '%s': %llu of %llu values outside atol %g rtol %g; largest "
                        "deviation %.6g at index %llu: got %.9g, expected %.9g (%s)",
                        name, (unsigned long long)bad, (unsigned long long)n, atol, rtol, worst,
                        (unsigned long long)at, (double)got->data[at], (double)want->data[at],
                        what);
    return 0;
}

static int check_output(const struct ck_pipeline *p, const struct ck_infer_array *got,
                        const struct ck_infer_array *want, const char *what)
{
    return check_output_atol(p, got, want, what, p->cfg->verify_atol);
}

/* spec's network on the inputs, in the sandbox: *out, *nout as ck_infer_run's */
static int run_model(const struct ck_pipeline *p, const char *spec, const char *graph,
                     const char *graph_text, struct ck_infer_array **outv, size_t *nout,
                     double *seconds)
{
    struct ck_model *m = NULL;
    struct ck_infer_array *in = NULL;
    size_t nin = 0;
    enum ck_sandbox_status st;
    struct ck_infer_stats stats = {0};
    struct ck_layers_opts lo = {p->cfg->pack_weights, "pack.weights"};
    int err = ck_reader_open_model_sel(spec, NULL, graph_text ? NULL : graph, graph_text,
                                       graph_text ? strlen(graph_text) : 0,
                                       p->cfg->pack_graph_label, &lo,
                                       &m);
    if (err < 0)
        return err;
    if ((err = inputs_for(p, m, &in, &nin)) == 0) {
        struct ck_infer_options io = {.max_memory = p->cfg->verify_max_memory,
                                      .threads = p->cfg->verify_threads};
        struct ck_sandbox_limits lim = {.max_memory = p->cfg->verify_max_memory,
                                        .timeout = p->cfg->verify_timeout};
        err = ck_infer_run_sandboxed(m, &io, &lim, in, nin, 1, outv, nout, &st, &stats);
        *seconds = stats.median_s;
    }
    ck_infer_arrays_free(in, nin);
    ck_model_free(m);
    return err;
}

/* ---- verify: the archive's recorded test sets ---- */

/* Whether the gate looks for recorded sets: verify.inputs: recorded, or
 * neither verify.inputs nor verify.expected given. */
static bool wants_sets(const struct ck_pipeline *p)
{
    return p->cfg->verify_source == CK_VERIFY_RECORDED ||
           (p->cfg->verify_source == CK_VERIFY_AUTO && !p->cfg->verify_expected.n);
}

/* The sets archive e offers: an .mldef's Tests, a SameDiff tag's recorded
 * sets, or else those of the newest older tag that has some (*own false:
 * only their inputs apply; their outputs are another tag's network's). */
static int archive_sets(const struct packed *e, const struct ck_model *m, struct ck_testset **sets,
                        size_t *n, bool *own)
{
    const char *hash = strchr(e->spec + strlen(e->path), '#');
    char from[256];
    *own = true;
    if (!hash)
        return ck_mldefrec_is_mldef(e->path) ? ck_mldefrec_load(e->path, m, sets, n)
                                             : (*sets = NULL, *n = 0, 0);
    int err = ck_sdrec_load_latest(e->spec, m, sets, n, from, sizeof from);
    *own = err < 0 || *n == 0 || !strcasecmp(from, hash + 1);
    return err;
}

/* m on in (m's inputs) in the sandbox; *seconds gets the run's time added. */
static int run_on(const struct ck_pipeline *p, const struct ck_model *m,
                  const struct ck_infer_array *in, struct ck_infer_array **out, size_t *nout,
                  double *seconds)
{
    struct ck_infer_options io = {.max_memory = p->cfg->verify_max_memory,
                                  .threads = p->cfg->verify_threads};
    struct ck_sandbox_limits lim = {.max_memory = p->cfg->verify_max_memory,
                                    .timeout = p->cfg->verify_timeout};
    struct ck_infer_stats stats = {0};
    enum ck_sandbox_status st;
    int err = ck_infer_run_sandboxed(m, &io, &lim, in, m->ninputs, 1, out, nout, &st, &stats);
    if (seconds)
        *seconds += stats.median_s;
    return err;
}

/* Every set: the archive's outputs finite and within the set's known-good
 * ones (its Tolerance as atol), or for sets of an older tag within the
 * checkpoint's own network's outputs on the same inputs. 1: the archive
 * has none and fixed inputs may run instead. */
static int run_recorded(const struct ck_pipeline *p, const struct packed *e, double *seconds,
                        const char **against)
{
    struct ck_model *m = NULL, *ref = NULL;
    struct ck_testset *sets = NULL;
    size_t n = 0;
    bool own;
    int err = ck_reader_open_model(e->spec, NULL, NULL, &m);
    if (err < 0)
        return err;
    if ((err = archive_sets(e, m, &sets, &n, &own)) < 0)
        goto out;
    if (n == 0) {
        err = p->cfg->verify_source == CK_VERIFY_RECORDED
                  ? ck_error(CK_ERR, "verify.inputs: recorded: the archive has no recorded test "
                                     "sets")
                  : 1;
        goto out;
    }
    *against = own ? CK_AGAINST_RECORDED : CK_AGAINST_SOURCE;
    if (!own) {
        const char *gt = p->cfg->pack_graph_yaml;
        struct ck_layers_opts lo = {p->cfg->pack_weights, "pack.weights"};
        err = ck_reader_open_model_sel(e->src, NULL, gt ? NULL : p->cfg->pack_graph_file, gt,
                                       gt ? strlen(gt) : 0,
                                       p->cfg->pack_graph_label, &lo, &ref);
        if (err < 0)
            goto out;
    }
    *seconds = 0;
    for (size_t s = 0; s < n && err == 0; s++) {
        struct ck_infer_array *got = NULL, *want = NULL;
        size_t ngot = 0, nwant = 0;
        double atol = sets[s].tolerance >= 0 ? sets[s].tolerance : p->cfg->verify_atol;
        if ((err = run_on(p, m, sets[s].in, &got, &ngot, seconds)) == 0 && !own)
            err = run_on(p, ref, sets[s].in, &want, &nwant, NULL);
        if (err == 0 && ngot != (own ? m->noutputs : nwant))
            err = ck_error(CK_ERR, "the archive has %zu outputs, the reference %zu", ngot,
                           own ? m->noutputs : nwant);
        for (size_t k = 0; k < ngot && err == 0; k++) {
            struct ck_infer_array *w = own ? &sets[s].want[k] : &want[k];
            if (w->rank == 1 && ck_infer_array_numel(w) == ck_infer_array_numel(&got[k])) {
                w->rank = got[k].rank; /* flat known-good files take the computed shape */
                memcpy(w->dims, got[k].dims, sizeof w->dims);
            }
            err = own ? check_output_atol(p, &got[k], w, "its known-good output", atol)
                      : check_output(p, &got[k], w, "the checkpoint's own output");
        }
        if (err < 0)
            err = ck_error_wrap(err, "recorded test '%s'", sets[s].name);
        ck_infer_arrays_free(got, ngot);
        ck_infer_arrays_free(want, nwant);
    }
out:
    ck_testset_free(m, sets, n);
    ck_model_free(ref);
    ck_model_free(m);
    return err;
}

/* verify.record, after a pass: the inputs the gate ran (a set of an older
 * tag, verify.inputs files or the fixed inputs; not the archive's own sets,
 * which are there already) and the archive's outputs on them, recorded in
 * it (an .mldef signed again with pack.sign_key); its entry's size and
 * sha256 follow. The archive runs once more for it. */
static int record_passed(const struct ck_pipeline *p, const struct ck_archive *a,
                         const struct packed *e)
{
    struct ck_model *m = NULL;
    struct ck_testset *sets = NULL;
    struct ck_infer_array *in = NULL, *out = NULL;
    size_t n = 0, nin = 0, nout = 0;
    bool own = true, mldef = !strchr(e->spec + strlen(e->path), '#');
    int err = ck_reader_open_model(e->spec, NULL, NULL, &m);
    if (err < 0)
        return err;
    if (wants_sets(p) && (err = archive_sets(e, m, &sets, &n, &own)) < 0)
        goto out;
    if (n && own)
        goto out; /* nothing new */
    if (!n && (err = inputs_for(p, m, &in, &nin)) < 0)
        goto out;
    for (size_t s = 0; s < (n ? n : 1) && err == 0; s++) {
        const struct ck_infer_array *x = n ? sets[s].in : in;
        char *name = NULL;
        if ((err = run_on(p, m, x, &out, &nout, NULL)) < 0)
            break;
        err = mldef ? ck_mldefrec_record(e->path, m, x, out, p->cfg->verify_atol,
                                         p->cfg->pack_sign_key, &name)
                    : ck_sdrec_record(e->spec, m, x, out, p->cfg->verify_atol, &name);
        if (err == 0)
            ck_info("verification.recorded", "archive='%s' set='%s'", e->spec, name);
        free(name);
        ck_infer_arrays_free(out, nout);
        out = NULL;
        nout = 0;
    }
    if (err == 0) { /* the archive changed: its entry follows */
        struct ck_digests d;
        char size[32];
        if ((err = ck_hash_file(e->path, CK_HASH_SHA256, &d, NULL)) == 0) {
            snprintf(size, sizeof size, "%llu", (unsigned long long)d.size);
            const char *fields[] = {"size", size, "sha256", d.sha256};
            err = ck_deploy_record(p->dir, ck_basename(a->path), fields, 2);
        }
    }
out:
    ck_infer_arrays_free(in, nin);
    ck_testset_free(m, sets, n);
    ck_model_free(m);
    return err;
}

/* A verify.expected entry for the checkpoint src: "{name}" becomes its file
 * or folder name, "{stem}" that name without its extension. */
static int expected_path(const char *pattern, const char *src, char *out, size_t n)
{
    char name[PATH_MAX], stem[PATH_MAX];
    snprintf(name, sizeof name, "%s", src);
    for (size_t l = strlen(name); l > 1 && name[l - 1] == '/'; l--)
        name[l - 1] = '\0'; /* a folder checkpoint */
    snprintf(name, sizeof name, "%s", ck_basename(name));
    snprintf(stem, sizeof stem, "%s", name);
    char *dot = strrchr(stem, '.');
    if (dot && dot != stem)
        *dot = '\0';
    size_t used = 0;
    for (const char *s = pattern; *s;) {
        const char *v = NULL;
        size_t skip = 1;
        if (!strncmp(s, "{name}", 6))
            v = name, skip = 6;
        else if (!strncmp(s, "{stem}", 6))
            v = stem, skip = 6;
        size_t l = v ? strlen(v) : 1;
        if (used + l >= n)
            return ck_error(CK_ESIZE, "verify.expected '%s': path too long", pattern);
        memcpy(out + used, v ? v : s, l);
        used += l;
        s += skip;
    }
    out[used] = '\0';
    return 0;
}

/* The archive's outputs: finite, and within the tolerances of
 * verify.expected (against the trainer's outputs), of the archive's own
 * recorded sets, or else of the checkpoint's own network run on the same
 * inputs (against the source: a packing mistake shows here, a wrong layer
 * list cannot, since both sides run it). *against names which. */
static int run_engine(const struct ck_pipeline *p, const struct packed *e, double *seconds,
                      const char **against)
{
    struct ck_infer_array *outv = NULL, *ref = NULL;
    size_t nout = 0, nref = 0;
    const struct ck_strlist *exp = &p->cfg->verify_expected;
    double ignored;
    *against = exp->n ? CK_AGAINST_EXPECTED : CK_AGAINST_SOURCE;
    int err = wants_sets(p) ? run_recorded(p, e, seconds, against) : 1;
    if (err <= 0)
        return err; /* the archive's recorded sets decided */
    *against = exp->n ? CK_AGAINST_EXPECTED : CK_AGAINST_SOURCE;
    err = run_model(p, e->spec, NULL, NULL, &outv, &nout, seconds);
    if (err < 0)
        return err;
    for (size_t k = 0; k < nout && err == 0; k++)
        err = check_output(p, &outv[k], NULL, NULL);
    if (err == 0 && exp->n && exp->n != nout)
        err = ck_error(CK_EUSAGE, "verify.expected names %zu files, the network has %zu outputs",
                       exp->n, nout);
    if (err == 0 && !exp->n &&
        (err = run_model(p, e->src, p->cfg->pack_graph_file, p->cfg->pack_graph_yaml, &ref, &nref,
                         &ignored)) == 0 &&
        nref != nout)
        err = ck_error(CK_ERR, "the archive has %zu outputs, its checkpoint %zu", nout, nref);
    for (size_t k = 0; k < nout && err == 0; k++) {
        if (exp->n) {
            struct ck_infer_array want = {0};
            char what[PATH_MAX + 8], file[PATH_MAX];
            if ((err = expected_path(exp->items[k], e->src, file, sizeof file)) < 0)
                break;
            snprintf(what, sizeof what, "'%s'", file);
            struct ck_model_io io = {.name = outv[k].name, .rank = outv[k].rank};
            memcpy(io.dims, outv[k].dims, sizeof outv[k].dims);
            if ((err = ck_testdata_load(file, &io, true, &want)) == 0)
                err = check_output(p, &outv[k], &want, what);
            else
                err = ck_error_wrap(err, "verify.expected");
            ck_infer_array_release(&want);
        } else {
            err = check_output(p, &outv[k], &ref[k], "the checkpoint's own output");
        }
    }
    ck_infer_arrays_free(outv, nout);
    ck_infer_arrays_free(ref, nref);
    return err;
}

/* verify.record: what passed becomes the archive's recorded test sets. */
static void record_if_asked(const struct ck_pipeline *p, const struct ck_archive *a,
                            const struct packed *e)
{
    if (p->cfg->verify_record && record_passed(p, a, e) < 0)
        ck_warn("verification.record_failed", "archive='%s': %s", e->spec, ck_error_msg());
}

/* One packed model (a .mldef, or a tag of a SameDiff archive): run, recorded
 * (unless record is false: the caller records once the archive is final),
 * announced. */
static int verify_one(struct ck_pipeline *p, const struct ck_archive *a, const struct packed *e,
                      bool record, char *why, size_t whysz)
{
    char mbuf[256], secs[32];
    const char *name = ck_basename(a->path), *model = model_name(p, mbuf, sizeof mbuf);
    double seconds = 0;
    const char *against = CK_AGAINST_SOURCE;
    int err = run_engine(p, e, &seconds, &against);
    if (err == 0 && record)
        record_if_asked(p, a, e);
    const char *tag = strchr(e->spec + strlen(e->path), '#');
    if (err < 0)
        snprintf(why, whysz, "%s%s%s", tag ? "tag " : "", tag ? tag + 1 : "", tag ? ": " : "");
    snprintf(why + strlen(why), whysz - strlen(why), "%s", err < 0 ? ck_error_msg() : "");
    snprintf(secs, sizeof secs, "%.6f", seconds);
    bool hold = err < 0 && p->cfg->verify_on_failure == CK_VERIFY_HOLD;
    const char *fields[] = {"verification",
                            err < 0 ? "failed" : "passed",
                            "verification_error",
                            err < 0 ? why : NULL,
                            "verification_seconds",
                            err < 0 ? NULL : secs,
                            "uploaded",
                            hold ? "held" : "yes",
                            "against",
                            against};
    if (ck_deploy_record(p->dir, name, fields, 5) < 0)
        ck_warn("archive.record_failed", "'%s': %s", name, ck_error_msg());
    struct ck_event ev;
    if (ck_event_init(&ev, err < 0 ? CK_EV_VERIFICATION_FAILED : CK_EV_VERIFICATION_PASSED) == 0) {
        event_base(p, &ev, e->ref, model);
        ev.archive_format = e->format;
        ev.archive_path = a->path;
        ev.seconds = err < 0 ? -1 : seconds;
        ev.error = err < 0 ? why : NULL;
        ev.against = against;
        emit(p, &ev);
    }
    ck_metrics_add(err < 0 ? CK_M_VERIFICATIONS_FAILED : CK_M_VERIFICATIONS_PASSED, 1);
    if (err < 0) {
        p->verify_failed++;
        ck_metrics_add(CK_M_FAILURES_VERIFY, 1);
        ck_err("verification.failed", "checkpoint='%s' archive='%s' against=%s: %s: %s", e->ref,
               e->spec, against, why,
               hold ? "held back (verify.on_failure: hold)" : "uploaded marked failed");
    } else {
        ck_info("verification.passed", "checkpoint='%s' archive='%s' against=%s seconds=%.6f",
                e->ref, e->spec, against, seconds);
    }
    return err;
}

/* The entries of path in append order, out of the table. */
static int take_all(const char *path, struct packed **out, size_t *n)
{
    size_t kept = 0;
    *n = 0;
    if (!(*out = calloc(npacked + 1, sizeof **out)))
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < npacked; i++) {
        if (!strcmp(packed[i].path, path))
            (*out)[(*n)++] = packed[i];
        else
            packed[kept++] = packed[i];
    }
    npacked = kept;
    return 0;
}

/* Appends e's checkpoint again under its tag (after a roll-back took it out). */
static int gate_repack(const struct ck_pipeline *p, struct packed *e)
{
    const char *tag = strchr(e->spec + strlen(e->path), '#');
    char undo[PATH_MAX];
    struct ck_pack_result r;
    struct ck_pack_opts o = {
        .format = "samediff",
        .graph = p->cfg->pack_graph_file,
        .graph_text = p->cfg->pack_graph_yaml,
        .graph_label = p->cfg->pack_graph_label,
        .weights = p->cfg->pack_weights,
        .w = {.level = -1, .ref = e->ref, .tag = tag ? tag + 1 : NULL},
    };
    int err = undo_path(p, ck_basename(e->path), undo, sizeof undo);
    if (err == 0 && (err = ck_zipapp_snapshot(e->path, undo)) == 0 &&
        (err = ck_pack_isolated(e->src, e->path, &o, &r)) < 0)
        unlink(undo);
    if (err < 0)
        return err;
    free(e->undo);
    if (!(e->undo = strdup(undo)))
        return ck_error(CK_ENOMEM, "out of memory");
    e->repack = false;
    ck_info("archive.reappended", "checkpoint='%s' archive='%s' tag='%s'", e->ref, e->path,
            r.samediff.tag);
    return 0;
}

static void gate_note(const struct ck_pipeline *p, const char *name, const struct packed *e,
                      const char *why, bool kept)
{
    const char *tag = strchr(e->spec + strlen(e->path), '#');
    char key[400], val[1600];
    snprintf(key, sizeof key, "failed.%s", tag ? tag + 1 : e->ref);
    snprintf(val, sizeof val, "checkpoint '%s': %s (%s)", e->ref, why,
             kept ? "kept in the archive, marked failed"
                  : "taken back: not in the archive (verify.on_failure: hold)");
    const char *fields[] = {key, val};
    if (ck_deploy_record(p->dir, name, fields, 1) < 0)
        ck_warn("archive.record_failed", "'%s': %s", name, ck_error_msg());
}

/* A SameDiff archive's tags of this pass, in append order: each verified;
 * under hold a failed one is rolled back (with the tags appended after it,
 * which are appended again and verified again), so the archive holds only
 * tags that passed. Queued for upload when a tag of the pass remains. */
static int gate_samediff(struct ck_pipeline *p, const struct ck_archive *a)
{
    struct packed *v;
    size_t n, kept = 0, last = 0;
    const char *name = ck_basename(a->path);
    bool hold = p->cfg->verify_on_failure == CK_VERIFY_HOLD, failed = false, broken = false;
    char why[1024] = "";
    int err = take_all(a->path, &v, &n);
    if (err < 0)
        return err;
    for (size_t i = 0; i < n; i++) {
        char one[1024] = "";
        if (v[i].repack && gate_repack(p, &v[i]) < 0) {
            snprintf(one, sizeof one, "could not be appended again: %s", ck_error_msg());
            gate_note(p, name, &v[i], one, false);
            failed = true;
            continue;
        }
        /* Recording waits for the loop's end: a later tag's roll-back
         * truncates the archive to before that tag, and with it anything
         * appended after it (a test set recorded for this one). */
        if ((v[i].passed = verify_one(p, a, &v[i], false, one, sizeof one) == 0) || !hold ||
            broken) {
            if (v[i].undo)
                unlink(v[i].undo);
            if (one[0]) { /* upload_marked (or a roll-back that could not be done) */
                failed = true;
                snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s", why[0] ? "; " : "",
                         one);
                gate_note(p, name, &v[i], one, true);
            }
            kept++;
            last = i;
            continue;
        }
        /* hold: back to before this tag; the later ones are appended again */
        if (ck_zipapp_restore(a->path, v[i].undo) < 0) {
            ck_err("archive.rollback_failed", "'%s': tag of '%s' stays: %s", a->path, v[i].ref,
                   ck_error_msg());
            broken = failed = true;
            snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s", why[0] ? "; " : "", one);
            gate_note(p, name, &v[i], one, true);
            continue;
        }
        gate_note(p, name, &v[i], one, false);
        ck_warn("archive.tag_rolled_back", "checkpoint='%s' archive='%s': %s", v[i].ref, a->path,
                one);
        for (size_t j = i + 1; j < n; j++) {
            if (v[j].undo && !v[j].repack)
                unlink(v[j].undo);
            v[j].repack = true;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (v[i].passed)
            record_if_asked(p, a, &v[i]);
    /* the archive's record: what it holds now */
    char size[32] = "", sha[65] = "";
    struct ck_digests d;
    struct stat st;
    bool exists = stat(a->path, &st) == 0;
    if (exists && ck_hash_file(a->path, CK_HASH_SHA256, &d, NULL) == 0) {
        snprintf(size, sizeof size, "%llu", (unsigned long long)st.st_size);
        memcpy(sha, d.sha256, sizeof sha);
    }
    const char *tag = kept ? strchr(v[last].spec + strlen(v[last].path), '#') : NULL;
    const char *fields[] = {
        "size",
        size[0] ? size : NULL,
        "sha256",
        sha[0] ? sha : NULL,
        "tag",
        kept ? (tag ? tag + 1 : NULL) : (v[0].prev[0][0] ? v[0].prev[0] : NULL),
        "checkpoint",
        kept ? v[last].ref : (v[0].prev[1][0] ? v[0].prev[1] : NULL),
        "verification",
        kept ? (failed && (!hold || broken) ? "failed" : "passed")
             : (v[0].prev[2][0] && exists ? v[0].prev[2] : "failed"),
        "verification_error",
        kept && failed && (!hold || broken) ? why : NULL,
        "uploaded",
        kept || exists ? "yes" : "held", /* as before the pass when none */
    };
    if (ck_deploy_record(p->dir, name, fields, 7) < 0)
        ck_warn("archive.record_failed", "'%s': %s", name, ck_error_msg());
    for (size_t i = 0; i < n; i++)
        packed_free(&v[i]);
    free(v);
    if (kept)
        return 0;
    return ck_error(CK_ERR, "no tag of this pass passed verification: '%s' as before", a->path);
}

int ck_deploy_verify(struct ck_pipeline *p, const struct ck_archive *a)
{
    for (size_t i = 0; i < npacked; i++)
        if (!strcmp(packed[i].path, a->path) && packed[i].undo)
            return gate_samediff(p, a);
    struct packed e;
    char why[1024] = "", one[1024];
    const char *name = ck_basename(a->path);
    bool failed = false;
    /* a SameDiff archive may have got several tags this pass: each is run */
    while (take(a->path, &e)) {
        one[0] = '\0';
        if (verify_one(p, a, &e, true, one, sizeof one) < 0) {
            failed = true;
            snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s", why[0] ? "; " : "", one);
        }
        packed_free(&e);
    }
    bool hold = failed && p->cfg->verify_on_failure == CK_VERIFY_HOLD;
    if (failed) { /* the archive's record says failed when any of its tags did */
        const char *fields[] = {
            "verification",         "failed", "verification_error", why,
            "verification_seconds", NULL,     "uploaded",           hold ? "held" : "yes"};
        if (ck_deploy_record(p->dir, name, fields, 4) < 0)
            ck_warn("archive.record_failed", "'%s': %s", name, ck_error_msg());
    }
    if (!hold)
        return 0;
    /* Held: out of data/, or the tree's upload would take it along. A
     * SameDiff archive holds every earlier tag too and stays (README). */
    char held[PATH_MAX], to[PATH_MAX];
    if (ck_text_ends_with(name, ".zip") ||
        ck_path_join(held, sizeof held, p->st->dir, "held") < 0 || ck_mkdirs(held, 0700) < 0 ||
        ck_path_join(to, sizeof to, held, name) < 0 || rename(a->path, to) < 0)
        ck_warn("archive.hold_failed", "'%s' stays where it is", a->path);
    return ck_error(CK_ERR, "%s", why);
}
