/* Recorded test sets of a SameDiff tag as engine arrays (agent/sdrec.h). */
#include "agent/sdrec.h"
#include "common/error.h"
#include "readers/sdtests.h"
#include "writers/sdrecord.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool ck_sdrec_is_archive(const char *spec)
{
    return ck_sdtests_is_archive(spec);
}

/* A recorded array as float32 with its own shape; checked against the
 * graph value it stands for. */
static int to_array(const struct ck_sdtests *t, const struct ck_sdtest *set,
                    const struct ck_sdtest_array *a, const char *want_name,
                    struct ck_infer_array *out)
{
    if (strcmp(a->value, want_name) != 0)
        return ck_error(CK_EFORMAT,
                        "'%s': tag '%s': test '%s': '%s' is for '%s', the model's is '%s'", t->path,
                        t->tag, set->name, a->member, a->value, want_name);
    if (a->t.rank > CK_INFER_MAX_RANK)
        return ck_error(CK_EFORMAT, "'%s': tag '%s': test '%s': '%s' has rank %d, at most %d",
                        t->path, t->tag, set->name, a->member, a->t.rank, CK_INFER_MAX_RANK);
    int err = ck_infer_array_init(out, want_name, a->t.rank, a->t.dims);
    if (err < 0)
        return ck_error_wrap(err, "'%s': tag '%s': test '%s': '%s'", t->path, t->tag, set->name,
                             a->member);
    uint64_t n = ck_infer_array_numel(out);
    for (uint64_t i = 0; i < n; i++)
        out->data[i] = (float)ck_tensor_get_f64(&a->t, i);
    return 0;
}

static int load_set(const struct ck_sdtests *t, const struct ck_sdtest *set,
                    const struct ck_model *m, struct ck_testset *s)
{
    s->tolerance = set->tolerance;
    s->name = strdup(set->name);
    s->in = calloc(m->ninputs + 1, sizeof *s->in);
    s->want = calloc(m->noutputs + 1, sizeof *s->want);
    s->want_paths = calloc(m->noutputs + 1, sizeof *s->want_paths);
    if (!s->name || !s->in || !s->want || !s->want_paths)
        return ck_error(CK_ENOMEM, "out of memory");
    if (set->nin != m->ninputs || set->nout != m->noutputs)
        return ck_error(CK_EFORMAT,
                        "'%s': tag '%s': test '%s' has %zu inputs and %zu outputs, the model %zu "
                        "and %zu",
                        t->path, t->tag, set->name, set->nin, set->nout, m->ninputs, m->noutputs);
    int err;
    for (size_t k = 0; k < m->ninputs; k++)
        if ((err = to_array(t, set, &set->in[k], m->inputs[k].name, &s->in[k])) < 0)
            return err;
    for (size_t k = 0; k < m->noutputs; k++) {
        if ((err = to_array(t, set, &set->out[k], m->outputs[k].name, &s->want[k])) < 0)
            return err;
        if (!(s->want_paths[k] = strdup(set->out[k].member)))
            return ck_error(CK_ENOMEM, "out of memory");
    }
    return 0;
}

static int load(const char *spec, const struct ck_model *m, bool or_earlier,
                struct ck_testset **sets, size_t *n, char *from, size_t fromsz)
{
    struct ck_sdtests t;
    *sets = NULL;
    *n = 0;
    if (from && fromsz)
        from[0] = 0;
    int err = or_earlier ? ck_sdtests_load_latest(spec, &t) : ck_sdtests_load(spec, &t);
    if (err < 0)
        return err;
    if (t.n && !(*sets = calloc(t.n, sizeof **sets)))
        err = ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < t.n && err >= 0; i++) {
        (*n)++;
        err = load_set(&t, &t.sets[i], m, &(*sets)[i]);
    }
    if (err < 0) {
        ck_testset_free(m, *sets, *n);
        *sets = NULL;
        *n = 0;
    }
    if (from)
        snprintf(from, fromsz, "%s", t.tag ? t.tag : "");
    ck_sdtests_release(&t);
    return err;
}

int ck_sdrec_load(const char *spec, const struct ck_model *m, struct ck_testset **sets, size_t *n)
{
    return load(spec, m, false, sets, n, NULL, 0);
}

int ck_sdrec_load_latest(const char *spec, const struct ck_model *m, struct ck_testset **sets,
                         size_t *n, char *from, size_t fromsz)
{
    return load(spec, m, true, sets, n, from, fromsz);
}

/* A float32 array seen as a tensor (borrowed data, little-endian host). */
static void as_tensor(const struct ck_infer_array *a, const char *name, struct ck_tensor *t)
{
    memset(t, 0, sizeof *t);
    t->name = (char *)name;
    t->dtype = CK_DT_F32;
    t->rank = a->rank;
    memcpy(t->dims, a->dims, sizeof a->dims[0] * (size_t)a->rank);
    t->nbytes = ck_infer_array_numel(a) * sizeof(float);
    t->data = (const unsigned char *)a->data;
}

int ck_sdrec_record(const char *spec, const struct ck_model *m, const struct ck_infer_array *in,
                    const struct ck_infer_array *out, double tolerance, char **set_name)
{
    struct ck_tensor *t = calloc(m->ninputs + m->noutputs + 1, sizeof *t);
    struct ck_sdrecord_result r;
    int err;
    if (!t)
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t k = 0; k < m->ninputs; k++)
        as_tensor(&in[k], m->inputs[k].name, &t[k]);
    for (size_t k = 0; k < m->noutputs; k++)
        as_tensor(&out[k], m->outputs[k].name, &t[m->ninputs + k]);
    err = ck_sdrecord_add(spec, t, m->ninputs, t + m->ninputs, m->noutputs, tolerance, &r);
    free(t);
    if (err < 0)
        return err;
    size_t len = strlen(r.tag) + strlen(r.set) + 2;
    if (!(*set_name = malloc(len)))
        return ck_error(CK_ENOMEM, "out of memory");
    snprintf(*set_name, len, "%s/%s", r.tag, r.set);
    return 0;
}
