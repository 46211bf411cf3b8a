/* Recorded test data sets of an .mldef (docs/mldef.md section 6). The
 * archive is read through libzip (names checked by readers/zipin.h) and
 * rewritten through writers/mldefzip.h (temporary, fsync, rename, SIGNATURE
 * recomputed), so recording never leaves a half-written archive. */
#include "agent/mldefrec.h"
#include "agent/testdata.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/json.h"
#include "common/sign.h"
#include "readers/jsonin.h"
#include "readers/mldefcheck.h"
#include "readers/zipin.h"
#include "writers/mldefzip.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zip.h>

#define MANIFEST_MAX (UINT64_C(64) << 20)
#define TESTFILE_MAX (UINT64_C(4) << 30)

static int read_entry(const struct ck_zipin *zi, const char *name, uint64_t max,
                      unsigned char **data, size_t *len)
{
    uint64_t i;
    zip_stat_t st;
    int err = ck_zipin_find(zi, name, &i);
    if (err < 0)
        return err;
    if (zip_stat_index(zi->z, i, 0, &st) < 0 || !(st.valid & ZIP_STAT_SIZE))
        return ck_error(CK_EFORMAT, "'%s': cannot read '%s'", zi->path, name);
    if (st.size > max)
        return ck_error(CK_ESIZE, "'%s': '%s' is %" PRIu64 " bytes, more than %" PRIu64, zi->path,
                        name, (uint64_t)st.size, max);
    unsigned char *d = malloc(st.size + 1);
    zip_file_t *f = d ? zip_fopen_index(zi->z, i, 0) : NULL;
    if (!f) {
        free(d);
        return ck_error(CK_EFORMAT, "'%s': cannot open '%s'", zi->path, name);
    }
    zip_int64_t n = st.size ? zip_fread(f, d, st.size) : 0;
    zip_fclose(f);
    if (n < 0 || (uint64_t)n != st.size) {
        free(d);
        return ck_error(CK_EFORMAT, "'%s': '%s' is corrupt or short", zi->path, name);
    }
    d[st.size] = 0;
    *data = d;
    *len = (size_t)st.size;
    return 0;
}

static int read_manifest(const struct ck_zipin *zi, unsigned char **text, struct ck_jin_doc **doc,
                         const struct ck_jin **root)
{
    size_t len = 0;
    int err = read_entry(zi, "manifest.json", MANIFEST_MAX, text, &len);
    if (err < 0)
        return err;
    if ((err = ck_jin_parse((const char *)*text, len, doc, root)) < 0)
        return ck_error_wrap(err, "'%s': manifest.json", zi->path);
    if ((*root)->type != CK_JIN_OBJECT)
        return ck_error(CK_EFORMAT, "'%s': manifest.json is not an object", zi->path);
    return 0;
}

bool ck_mldefrec_is_mldef(const char *path)
{
    struct ck_zipin zi;
    unsigned char *text = NULL;
    struct ck_jin_doc *doc = NULL;
    const struct ck_jin *root, *f;
    bool yes = false;
    if (ck_zipin_open(&zi, path) < 0) {
        ck_error_clear();
        return false;
    }
    if (read_manifest(&zi, &text, &doc, &root) == 0 && (f = ck_jin_get(root, "Format")) &&
        f->type == CK_JIN_STRING && strcmp(f->str, "mldef") == 0)
        yes = true;
    ck_jin_free(doc);
    free(text);
    ck_zipin_close(&zi);
    if (!yes)
        ck_error_clear(); /* not an .mldef is an answer, not an error */
    return yes;
}

static const char *jstr(const struct ck_jin *obj, const char *key)
{
    const struct ck_jin *v = ck_jin_get(obj, key);
    return v && v->type == CK_JIN_STRING ? v->str : NULL;
}

/* The entry of list (Inputs or Outputs of a test) for node range name. */
static const char *path_for(const struct ck_jin *list, const char *name)
{
    if (!list || list->type != CK_JIN_ARRAY)
        return NULL;
    for (const struct ck_jin *e = list->first; e; e = e->next) {
        const char *nr = jstr(e, "NodeRange");
        if (nr && strcmp(nr, name) == 0)
            return jstr(e, "Path");
    }
    return NULL;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* A test file as a flat float32 array: .float32, .float64 or the csv form
 * (docs/mldef.md section 4). */
static int load_values(const struct ck_zipin *zi, const char *set, const char *path,
                       struct ck_infer_array *a)
{
    bool f64 = ends_with(path, ".float64"), csv = ends_with(path, ".csv");
    if (!f64 && !csv && !ends_with(path, ".float32"))
        return ck_error(CK_EFORMAT,
                        "'%s': test '%s': '%s': only .float32, .float64 and .csv test "
                        "files are run",
                        zi->path, set, path);
    unsigned char *d;
    size_t len;
    int err = read_entry(zi, path, TESTFILE_MAX, &d, &len);
    if (err < 0)
        return ck_error_wrap(err, "test '%s'", set);
    if (csv) {
        char label[600];
        float *v = NULL;
        uint64_t nv = 0, lines;
        snprintf(label, sizeof label, "%s: %s", zi->path, path);
        err = ck_testdata_parse_csv((char *)d, len, label, 0, &v, &nv, &lines);
        free(d);
        if (err < 0)
            return ck_error_wrap(err, "test '%s'", set);
        int64_t n = (int64_t)nv;
        if ((err = ck_infer_array_init(a, path, 1, &n)) == 0)
            memcpy(a->data, v, nv * sizeof *v);
        free(v);
        return err < 0 ? ck_error_wrap(err, "'%s': test '%s'", zi->path, set) : 0;
    }
    size_t pt = f64 ? 8 : 4;
    if (len % pt) {
        free(d);
        return ck_error(CK_EFORMAT,
                        "'%s': test '%s': '%s' is %zu bytes, not a whole number "
                        "of values",
                        zi->path, set, path, len);
    }
    int64_t n = (int64_t)(len / pt);
    if ((err = ck_infer_array_init(a, path, 1, &n)) < 0) {
        free(d);
        return ck_error_wrap(err, "'%s': test '%s'", zi->path, set);
    }
    for (int64_t i = 0; i < n; i++) {
        uint64_t u = 0;
        for (size_t b = 0; b < pt; b++)
            u |= (uint64_t)d[(size_t)i * pt + b] << (8 * b);
        if (f64) {
            double x;
            memcpy(&x, &u, sizeof x);
            a->data[i] = (float)x;
        } else {
            uint32_t v = (uint32_t)u;
            float x;
            memcpy(&x, &v, sizeof x);
            a->data[i] = x;
        }
    }
    free(d);
    return 0;
}

/* Gives the flat input k the model input's shape with the batch the values make. */
static int shape_input(const char *archive, const char *set, const struct ck_model_io *io,
                       struct ck_infer_array *a, int64_t *batch)
{
    int64_t per = 1;
    if (io->rank < 1 || io->rank > CK_INFER_MAX_RANK)
        return ck_error(CK_EFORMAT, "input '%s': rank %d", io->name, io->rank);
    for (int d = 1; d < io->rank; d++)
        per *= io->dims[d] < 0 ? 0 : io->dims[d];
    if (per <= 0 || a->dims[0] % per)
        return ck_error(CK_EFORMAT,
                        "'%s': test '%s': '%s' does not hold a whole number of "
                        "samples of input '%s'",
                        archive, set, a->name, io->name);
    int64_t b = a->dims[0] / per;
    if (*batch >= 0 && b != *batch)
        return ck_error(CK_EFORMAT,
                        "'%s': test '%s': '%s' holds %" PRId64 " samples, the "
                        "set's first input %" PRId64,
                        archive, set, a->name, b, *batch);
    *batch = b;
    a->rank = io->rank;
    a->dims[0] = b;
    for (int d = 1; d < io->rank; d++)
        a->dims[d] = io->dims[d];
    return 0;
}

static int load_set(const struct ck_zipin *zi, const struct ck_model *m, const struct ck_jin *t,
                    size_t idx, struct ck_testset *s)
{
    char fallback[32];
    const char *name = jstr(t, "Name");
    snprintf(fallback, sizeof fallback, "#%zu", idx);
    s->name = strdup(name ? name : fallback);
    s->in = calloc(m->ninputs + 1, sizeof *s->in);
    s->want = calloc(m->noutputs + 1, sizeof *s->want);
    s->want_paths = calloc(m->noutputs + 1, sizeof *s->want_paths);
    s->tolerance = -1;
    if (!s->name || !s->in || !s->want || !s->want_paths)
        return ck_error(CK_ENOMEM, "out of memory");
    const struct ck_jin *tol = ck_jin_get(t, "Tolerance");
    if (tol && tol->type == CK_JIN_NUMBER)
        s->tolerance = strtod(tol->str, NULL);
    int64_t batch = -1;
    int err;
    for (size_t k = 0; k < m->ninputs; k++) {
        const char *p = path_for(ck_jin_get(t, "Inputs"), m->inputs[k].name);
        if (!p)
            return ck_error(CK_EFORMAT, "'%s': test '%s' gives no values for input '%s'", zi->path,
                            s->name, m->inputs[k].name);
        if ((err = load_values(zi, s->name, p, &s->in[k])) < 0 ||
            (err = shape_input(zi->path, s->name, &m->inputs[k], &s->in[k], &batch)) < 0)
            return err;
    }
    for (size_t i = 0; i < m->noutputs; i++) {
        const char *p = path_for(ck_jin_get(t, "Outputs"), m->outputs[i].name);
        if (!p)
            return ck_error(CK_EFORMAT,
                            "'%s': test '%s' has no known-good values for "
                            "output '%s'",
                            zi->path, s->name, m->outputs[i].name);
        if (!(s->want_paths[i] = strdup(p)))
            return ck_error(CK_ENOMEM, "out of memory");
        if ((err = load_values(zi, s->name, p, &s->want[i])) < 0)
            return err;
    }
    return 0;
}

int ck_mldefrec_load(const char *path, const struct ck_model *m, struct ck_testset **sets,
                     size_t *n)
{
    struct ck_zipin zi;
    unsigned char *text = NULL;
    struct ck_jin_doc *doc = NULL;
    const struct ck_jin *root;
    *sets = NULL;
    *n = 0;
    int err = ck_zipin_open(&zi, path);
    if (err < 0)
        return err;
    if ((err = read_manifest(&zi, &text, &doc, &root)) < 0)
        goto out;
    const struct ck_jin *tests = ck_jin_get(root, "Tests");
    if (!tests)
        goto out;
    if (tests->type != CK_JIN_ARRAY) {
        err = ck_error(CK_EFORMAT, "'%s': manifest.json: Tests is not an array", path);
        goto out;
    }
    *sets = calloc(tests->n + 1, sizeof **sets);
    if (!*sets) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    for (const struct ck_jin *t = tests->first; t; t = t->next) {
        (*n)++;
        if ((err = load_set(&zi, m, t, *n - 1, &(*sets)[*n - 1])) < 0)
            break;
    }
out:
    if (err < 0) {
        ck_testset_free(m, *sets, *n);
        *sets = NULL;
        *n = 0;
    }
    ck_jin_free(doc);
    free(text);
    ck_zipin_close(&zi);
    return err;
}

/* ---- recording ---- */

/* Writes v back as JSON (numbers as their literal text, members in order). */
static void emit_value(struct ck_buf *b, const struct ck_jin *v, int depth)
{
    switch (v->type) {
    case CK_JIN_NULL:
        ck_buf_puts(b, "null");
        break;
    case CK_JIN_BOOL:
        ck_buf_puts(b, v->b ? "true" : "false");
        break;
    case CK_JIN_NUMBER:
        ck_buf_append(b, v->str, v->len);
        break;
    case CK_JIN_STRING:
        ck_json_escape(b, v->str, v->len);
        break;
    case CK_JIN_ARRAY:
    case CK_JIN_OBJECT: {
        bool obj = v->type == CK_JIN_OBJECT;
        ck_buf_putc(b, obj ? '{' : '[');
        for (const struct ck_jin *c = v->first; c; c = c->next) {
            if (c != v->first)
                ck_buf_putc(b, ',');
            if (depth == 0)
                ck_buf_puts(b, "\n  ");
            if (obj) {
                ck_json_escape(b, c->key, c->keylen);
                ck_buf_puts(b, ": ");
            }
            emit_value(b, c, depth + 1);
        }
        if (depth == 0)
            ck_buf_putc(b, '\n');
        ck_buf_putc(b, obj ? '}' : ']');
        break;
    }
    }
}

static void emit_entries(struct ck_buf *b, const char *kind, const struct ck_model_io *io, size_t n,
                         const char *set, char c)
{
    ck_buf_printf(b, "\"%s\": [", kind);
    for (size_t i = 0; i < n; i++) {
        ck_buf_puts(b, i ? ", {\"NodeRange\": " : "{\"NodeRange\": ");
        ck_json_escape(b, io[i].name, strlen(io[i].name));
        ck_buf_printf(b, ", \"Path\": \"tests/%s%c%zu.float32\"}", set, c, i);
    }
    ck_buf_puts(b, "]");
}

/* The manifest with the new set appended to Tests (created when absent). */
static int new_manifest(const struct ck_jin *root, const struct ck_model *m, const char *set,
                        double tol, struct ck_buf *b)
{
    const struct ck_jin *tests = ck_jin_get(root, "Tests");
    ck_buf_putc(b, '{');
    bool first = true;
    for (const struct ck_jin *c = root->first; c; c = c->next) {
        if (c == tests)
            continue;
        ck_buf_puts(b, first ? "\n  " : ",\n  ");
        first = false;
        ck_json_escape(b, c->key, c->keylen);
        ck_buf_puts(b, ": ");
        emit_value(b, c, 1);
    }
    ck_buf_puts(b, first ? "\n  \"Tests\": [" : ",\n  \"Tests\": [");
    for (const struct ck_jin *t = tests ? tests->first : NULL; t; t = t->next) {
        ck_buf_puts(b, "\n    ");
        emit_value(b, t, 2);
        ck_buf_putc(b, ',');
    }
    ck_buf_printf(b, "\n    {\"Name\": \"%s\",\n     ", set);
    emit_entries(b, "Inputs", m->inputs, m->ninputs, set, 'i');
    ck_buf_puts(b, ",\n     ");
    emit_entries(b, "Outputs", m->outputs, m->noutputs, set, 'o');
    ck_buf_printf(b, ",\n     \"Tolerance\": %.17g}\n  ]\n}\n", tol);
    return b->data ? 0 : ck_error(CK_ENOMEM, "out of memory");
}

static bool set_name_taken(const struct ck_jin *tests, const char *name)
{
    for (const struct ck_jin *t = tests ? tests->first : NULL; t; t = t->next) {
        const char *n = jstr(t, "Name");
        if (n && strcmp(n, name) == 0)
            return true;
    }
    return false;
}

struct entry_stream {
    zip_t *z;
    zip_uint64_t index;
    zip_file_t *f;
};

static int64_t es_next(void *ctx, void *buf, size_t len, const void **out)
{
    struct entry_stream *s = ctx;
    if (!s->f && !(s->f = zip_fopen_index(s->z, s->index, 0)))
        return ck_error(CK_EFORMAT, "cannot open entry %" PRIu64, (uint64_t)s->index);
    zip_int64_t n = zip_fread(s->f, buf, len);
    *out = buf;
    return n < 0 ? ck_error(CK_EFORMAT, "entry %" PRIu64 " is corrupt", (uint64_t)s->index) : n;
}

static int f32_bytes(const struct ck_infer_array *a, unsigned char **out, size_t *len)
{
    uint64_t n = ck_infer_array_numel(a);
    unsigned char *d = malloc(n * 4 + 1);
    if (!d)
        return ck_error(CK_ENOMEM, "out of memory");
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &a->data[i], 4);
        for (int b = 0; b < 4; b++)
            d[i * 4 + (uint64_t)b] = (unsigned char)(u >> (8 * b));
    }
    *out = d;
    *len = (size_t)(n * 4);
    return 0;
}

static int add_arrays(struct ck_mldef_zip *z, const char *set, char c,
                      const struct ck_infer_array *a, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char name[64];
        unsigned char *d = NULL;
        size_t len = 0;
        snprintf(name, sizeof name, "tests/%s%c%zu.float32", set, c, i);
        int err = f32_bytes(&a[i], &d, &len);
        if (err == 0)
            err = ck_mldef_zip_add_buffer(z, name, d, len);
        free(d);
        if (err < 0)
            return err;
    }
    return 0;
}

/* A signed archive is re-signed only when its signature verifies now, so
 * recording never launders a changed archive into a freshly signed one. */
static int check_signature(const char *path)
{
    struct ck_mldef_check_opts co = {.require_signature = true};
    struct ck_mldef_report r;
    int err = ck_mldef_check(path, &co, &r, NULL);
    if (err < 0)
        return err;
    bool ok = r.signature_ok && r.n == 0 && r.dropped == 0;
    ck_mldef_report_release(&r);
    return ok ? 0
              : ck_error(CK_ESTATE,
                         "'%s': the archive breaks a rule or its signature does "
                         "not verify (mldef -i -s names why): not re-signing it",
                         path);
}

static int rewrite(const struct ck_zipin *zi, const struct ck_buf *man, const char *set,
                   const struct ck_model *m, const struct ck_infer_array *in,
                   const struct ck_infer_array *out, const struct ck_sign_key *key, int level)
{
    struct ck_mldef_zip *z = NULL;
    struct entry_stream *es = calloc(zi->nentries + 1, sizeof *es);
    int err =
        es ? ck_mldef_zip_open(zi->path, level, key, &z) : ck_error(CK_ENOMEM, "out of memory");
    if (err == 0)
        err = ck_mldef_zip_add_buffer(z, "manifest.json", man->data, man->len);
    for (uint64_t i = 0; err == 0 && i < zi->nentries; i++) {
        const char *name = ck_zipin_name(zi, i);
        zip_stat_t st;
        if (!name || strcmp(name, "manifest.json") == 0 || strcmp(name, "SIGNATURE") == 0 ||
            name[strlen(name) - 1] == '/')
            continue;
        if (zip_stat_index(zi->z, i, 0, &st) < 0 || !(st.valid & ZIP_STAT_SIZE)) {
            err = ck_error(CK_EFORMAT, "'%s': cannot read '%s'", zi->path, name);
            break;
        }
        es[i] = (struct entry_stream){.z = zi->z, .index = i};
        struct ck_mldef_stream s = {.size = st.size, .next = es_next, .ctx = &es[i]};
        err = ck_mldef_zip_add_stream(z, name, &s);
    }
    if (err == 0)
        err = add_arrays(z, set, 'i', in, m->ninputs);
    if (err == 0)
        err = add_arrays(z, set, 'o', out, m->noutputs);
    if (err == 0)
        err = ck_mldef_zip_finish(z);
    ck_mldef_zip_free(z);
    for (uint64_t i = 0; es && i < zi->nentries; i++)
        if (es[i].f)
            zip_fclose(es[i].f);
    free(es);
    return err;
}

/* Files after recording: every file entry but SIGNATURE, the new ones, and
 * SIGNATURE when signing (docs/mldef.md: at most 100, both included). */
static int count_files(const struct ck_zipin *zi, const struct ck_model *m, bool sign, int *level)
{
    uint64_t files = 0;
    *level = 0;
    for (uint64_t i = 0; i < zi->nentries; i++) {
        const char *name = ck_zipin_name(zi, i);
        zip_stat_t st;
        if (!name || name[strlen(name) - 1] == '/' || strcmp(name, "SIGNATURE") == 0)
            continue;
        files++;
        if (zip_stat_index(zi->z, i, 0, &st) == 0 && (st.valid & ZIP_STAT_COMP_METHOD) &&
            st.comp_method != ZIP_CM_STORE)
            *level = 9;
    }
    files += m->ninputs + m->noutputs + (sign ? 1 : 0);
    if (files > 100)
        return ck_error(CK_ESIZE,
                        "'%s': recording would make %" PRIu64 " files, more than the "
                        "100 an .mldef may hold [files.count]",
                        zi->path, files);
    return 0;
}

int ck_mldefrec_record(const char *path, const struct ck_model *m, const struct ck_infer_array *in,
                       const struct ck_infer_array *out, double tolerance, const char *keyfile,
                       char **set_name)
{
    struct ck_zipin zi;
    unsigned char *text = NULL;
    struct ck_jin_doc *doc = NULL;
    const struct ck_jin *root;
    struct ck_buf man;
    struct ck_sign_key key;
    bool have_key = false;
    char set[16];
    uint64_t sig;
    int level = 0;
    *set_name = NULL;
    ck_buf_init(&man, 0);
    if (m->ninputs > 10 || m->noutputs > 10)
        return ck_error(CK_ESIZE,
                        "'%s': recording takes models of at most 10 inputs and 10 "
                        "outputs (file names of 15 characters)",
                        path);
    int err = ck_zipin_open(&zi, path);
    if (err < 0)
        return err;
    bool is_signed = ck_zipin_find(&zi, "SIGNATURE", &sig) == 0;
    ck_error_clear();
    if (is_signed && !keyfile) {
        err = ck_error(CK_ESTATE,
                       "'%s' is signed: recording adds files, so its SIGNATURE "
                       "would no longer verify; give --sign-key FILE to sign it again",
                       path);
        goto out;
    }
    if ((err = read_manifest(&zi, &text, &doc, &root)) < 0 ||
        (err = count_files(&zi, m, keyfile != NULL, &level)) < 0)
        goto out;
    if (is_signed && (err = check_signature(path)) < 0)
        goto out;
    if (keyfile) {
        if ((err = ck_sign_load(keyfile, &key)) < 0)
            goto out;
        have_key = true;
        if (!key.has_priv) {
            err = ck_error(CK_ECONFIG,
                           "'%s': a public key cannot sign: --sign-key takes the "
                           "private key file",
                           keyfile);
            goto out;
        }
    }
    const struct ck_jin *tests = ck_jin_get(root, "Tests");
    if (tests && tests->type != CK_JIN_ARRAY) {
        err = ck_error(CK_EFORMAT, "'%s': manifest.json: Tests is not an array", path);
        goto out;
    }
    int k = 0;
    for (; k < 100; k++) {
        snprintf(set, sizeof set, "rec%d", k);
        if (!set_name_taken(tests, set))
            break;
    }
    if (k == 100) {
        err = ck_error(CK_ESIZE, "'%s': already 100 recorded sets", path);
        goto out;
    }
    if ((err = new_manifest(root, m, set, tolerance, &man)) < 0 ||
        (err = rewrite(&zi, &man, set, m, in, out, have_key ? &key : NULL, level)) < 0)
        goto out;
    if (!(*set_name = strdup(set)))
        err = ck_error(CK_ENOMEM, "out of memory");
out:
    if (have_key)
        ck_sign_key_wipe(&key);
    ck_buf_release(&man);
    ck_jin_free(doc);
    free(text);
    ck_zipin_close(&zi);
    return err;
}
