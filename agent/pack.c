#include "agent/pack.h"
#include "infer/sandbox.h"

#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/log.h"
#include "common/sign.h"
#include "infer/infer.h"
#include "model/mldef.h"
#include "readers/reader.h"
#include "writers/mldefzip.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/file.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Read back what was written, with the same rules a device applies, while
 * it is still at its temporary name: an archive that fails is never renamed
 * over the output (which keeps what it held). */
static int read_back(const char *tmp, void *arg)
{
    const char *out = arg;
    struct ck_mldef_report rep;
    int err = ck_mldef_check(tmp, NULL, &rep, NULL);
    if (err == 0 && rep.n)
        err = ck_error(CK_ERR,
                       "'%s': the archive written breaks rule %s at %s: %s (a ckptd bug: please "
                       "report; '%s' is left as it was)",
                       out, rep.v[0].rule, rep.v[0].where, rep.v[0].msg, out);
    else if (err < 0)
        err = ck_error_wrap(err, "'%s': reading back the archive written", out);
    ck_mldef_report_release(&rep);
    return err;
}

/* Temporaries of this output's name beside it ('.OUT.ckptd-XXXXXX.tmp', and
 * those of the run archive's journal), left by a pack that was killed: the
 * next pack to the same output removes them and says how many. Other files,
 * other outputs' temporaries included, are never touched. */
static void sweep_beside(const char *out)
{
    char dir[PATH_MAX], prefix[NAME_MAX + 2];
    size_t removed = 0;
    /* an archive being appended to is flock()ed by its writer (writers/zipapp.h):
     * its temporaries are alive, not leftovers */
    int fd = open(out, O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0) {
        close(fd);
        return;
    }
    ck_dirname(dir, sizeof dir, out);
    snprintf(prefix, sizeof prefix, ".%s.", ck_basename(out));
    if (ck_sweep_temporaries_of(dir, prefix, &removed) < 0)
        ck_warn("sweep.failed", "%s", ck_error_msg());
    if (removed)
        ck_info("sweep.removed",
                "dir='%s' output='%s' temporaries=%zu: left by a pack that was killed", dir,
                ck_basename(out), removed);
    if (fd >= 0)
        close(fd); /* and the lock with it */
}

int ck_pack(const char *src, const char *out, const struct ck_pack_opts *o,
            struct ck_pack_result *r)
{
    memset(r, 0, sizeof *r);
    const struct ck_writer_ops *ops = ck_writer_find(o->format);
    if (!ops)
        return ck_error(CK_EUSAGE, "unknown archive format '%s'", o->format);
    struct ck_model *m = NULL;
    struct ck_writer *w = NULL;
    int err;
    struct ck_layers_opts lo = {o->weights, o->weights_key};
    err =
        ck_reader_open_model_sel(src, o->src_format, o->graph_text ? NULL : o->graph, o->graph_text,
                                 o->graph_text ? strlen(o->graph_text) : 0,
                                 o->graph_label ? o->graph_label : "pack.graph", &lo, &m);
    if (err < 0)
        return err;
    /* valid means runnable: what ckptd's own engine cannot run is not packed */
    if ((err = ck_infer_check(m)) < 0) {
        err = ck_error_wrap(err, "'%s': not packed: the inference engine could not run it", src);
        goto out;
    }
    if ((err = ck_infer_check_float32(m)) < 0) {
        err = ck_error_wrap(err, "'%s': not packed as %s", src, ops->name);
        goto out;
    }
    r->nlayers = m->nnodes;
    struct ck_writer_opts wo = o->w;
    if (strcmp(ops->name, "mldef") == 0) {
        wo.check = read_back;
        wo.check_arg = (void *)out;
    }
    sweep_beside(out); /* before the writer makes its own temporary */
    if ((err = ck_writer_open(ops, out, &wo, &w)) < 0 || (err = ck_writer_add(w, m)) < 0 ||
        (err = ck_writer_finish(w)) < 0)
        goto out;
    if (ck_samediff_last(w))
        r->samediff = *ck_samediff_last(w);
    struct stat st;
    if (stat(out, &st) < 0) {
        err = ck_error_os(CK_EIO, "cannot stat '%s'", out);
        goto out;
    }
    r->size = (uint64_t)st.st_size;
    if (o->digest) {
        struct ck_digests d;
        if ((err = ck_hash_file(out, CK_HASH_SHA256, &d, NULL)) < 0)
            goto out;
        memcpy(r->sha256, d.sha256, sizeof r->sha256);
    }
out:
    ck_writer_free(w);
    ck_model_free(m);
    return err;
}

void ck_pack_print_report(FILE *f, const char *path, const struct ck_mldef_report *r, bool json)
{
    if (json) {
        struct ck_buf b = CK_BUF_INIT;
        struct ck_json j;
        ck_json_init(&j, &b, true);
        ck_json_begin_object(&j);
        ck_json_kstr(&j, "path", path);
        ck_json_kbool(&j, "valid", r->n == 0 && r->dropped == 0);
        ck_json_kint(&j, "files", (int64_t)r->nfiles);
        ck_json_kint(&j, "layers", (int64_t)r->nlayers);
        ck_json_kbool(&j, "signed", r->has_signature);
        if (r->has_signature) {
            ck_json_kbool(&j, "signature_ok", r->signature_ok);
            ck_json_kstr(&j, "signer", r->signer);
        }
        ck_json_key(&j, "violations");
        ck_json_begin_array(&j);
        for (size_t i = 0; i < r->n; i++) {
            ck_json_begin_object(&j);
            ck_json_kstr(&j, "rule", r->v[i].rule);
            ck_json_kstr(&j, "where", r->v[i].where);
            ck_json_kstr(&j, "message", r->v[i].msg);
            ck_json_end_object(&j);
        }
        ck_json_end_array(&j);
        ck_json_end_object(&j);
        if (b.data)
            fprintf(f, "%s\n", b.data);
        ck_buf_release(&b);
        return;
    }
    for (size_t i = 0; i < r->n; i++)
        fprintf(f, "%s: %s: %s [%s]\n", path, r->v[i].where, r->v[i].msg, r->v[i].rule);
    if (r->dropped)
        fprintf(f, "%s: ... and %zu more violations\n", path, r->dropped);
    if (r->n == 0 && r->dropped == 0)
        fprintf(f, "%s: valid mldef: %zu files, %zu layers%s%s%s\n", path, r->nfiles, r->nlayers,
                r->has_signature ? ", signed by " : ", not signed",
                r->has_signature ? r->signer : "", r->has_signature ? " (signature good)" : "");
    else
        fprintf(f, "%s: %zu violation%s\n", path, r->n + r->dropped,
                r->n + r->dropped == 1 ? "" : "s");
}

struct isolated {
    const char *src, *out;
    const struct ck_pack_opts *o;
};

static int pack_child(void *arg, int fd)
{
    const struct isolated *j = arg;
    struct ck_pack_result r;
#ifndef NDEBUG
    /* Debug builds only (the tests'): a reader that crashes, on demand, to
     * show what the sidecar does about one (no release binary has this). */
    const char *fault = getenv("CKPTD_TEST_FAULT");
    if (fault && !strcmp(fault, "reader-crash")) {
        /* SIGILL, as __builtin_trap gives: a signal no sanitizer catches
         * first, so every build shows the same; no core file */
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none);
        raise(SIGILL);
    }
#endif
    memset(&r, 0, sizeof r);
    int err = ck_pack(j->src, j->out, j->o, &r);
    if (err < 0)
        return err;
    return ck_write_all(fd, &r, sizeof r) < 0 ? ck_error_os(CK_EIO, "cannot answer") : 0;
}

int ck_pack_isolated(const char *src, const char *out, const struct ck_pack_opts *o,
                     struct ck_pack_result *r)
{
    struct isolated j = {src, out, o};
    int err = ck_sandbox_call_fixed(pack_child, &j, "the checkpoint's reader", src, r, sizeof *r);
    if (err == 0) {
        r->sha256[sizeof r->sha256 - 1] = 0;
        r->samediff.tag[sizeof r->samediff.tag - 1] = 0;
    }
    return err;
}

int ck_pack_check_runnable(struct ck_mldef_report *r, const struct ck_model *m)
{
    if (ck_infer_check_shapes(m) == 0)
        return 0;
    struct ck_mldef_violation *v = realloc(r->v, (r->n + 1) * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    r->v = v;
    r->cap = r->n + 1;
    v = &r->v[r->n];
    v->rule = strdup("engine.runs");
    v->where = strdup("Layers");
    v->msg = strdup(ck_error_msg());
    if (!v->rule || !v->where || !v->msg) {
        free(v->rule), free(v->where), free(v->msg);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    r->n++;
    return 0;
}

int ck_pack_mldef_from_manifest(const char *manifest, const char *out, int level,
                                const char *sign_key, FILE *errf)
{
    struct ck_mldef_report rep;
    struct ck_model *m = NULL;
    int err = ck_mldef_check(manifest, NULL, &rep, &m);
    if (err == 0 && m)
        err = ck_pack_check_runnable(&rep, m);
    ck_model_free(m);
    if (err < 0) {
        ck_mldef_report_release(&rep);
        return err;
    }
    if (rep.n || rep.dropped) {
        ck_pack_print_report(errf, manifest, &rep, false);
        err = ck_error(CK_EFORMAT, "'%s': %zu rule%s broken: nothing written", manifest,
                       rep.n + rep.dropped, rep.n + rep.dropped == 1 ? "" : "s");
        ck_mldef_report_release(&rep);
        return err;
    }
    ck_mldef_report_release(&rep);
    char **names = NULL;
    size_t n = 0;
    struct ck_sign_key key;
    bool have_key = false;
    struct ck_mldef_zip *z = NULL;
    if ((err = ck_mldef_manifest_files(manifest, &names, &n)) < 0)
        return err;
    if (sign_key) {
        if ((err = ck_sign_load(sign_key, &key)) < 0)
            goto out;
        have_key = true;
    }
    char dir[4096], p[4096];
    ck_dirname(dir, sizeof dir, manifest);
    if ((err = ck_mldef_zip_open(out, level, have_key ? &key : NULL, &z)) < 0 ||
        (err = ck_mldef_zip_add_file(z, CK_MLDEF_MANIFEST, manifest)) < 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        if ((err = ck_path_join(p, sizeof p, dir, names[i])) < 0 ||
            (err = ck_mldef_zip_add_file(z, names[i], p)) < 0)
            goto out;
    }
    err = ck_mldef_zip_finish(z);
out:
    ck_mldef_zip_free(z);
    if (have_key)
        ck_sign_key_wipe(&key);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return err;
}
