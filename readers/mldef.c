/* The .mldef reader: an archive ckptd (or anyone following docs/mldef.md)
 * made, read back into tensors and the canonical model, so that `inspect`
 * lists it and the engine can run it. Everything goes through the
 * validator (mldefcheck.h): an archive that breaks a rule is not opened. */
#include "common/error.h"
#include "model/mldef.h"
#include "readers/mldefcheck.h"
#include "readers/reader.h"
#include "readers/zipin.h"

#include <stdlib.h>
#include <string.h>

static bool has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int mldef_probe(const char *path, const unsigned char *head, size_t headlen)
{
    if (!ck_zipin_is_zip(head, headlen))
        return CK_PROBE_NO;
    if (has_suffix(path, ".mldef"))
        return CK_PROBE_CONTENT;
    struct ck_zipin zi;
    uint64_t idx;
    int score = CK_PROBE_NO;
    if (ck_zipin_open(&zi, path) == 0) {
        if (ck_zipin_find(&zi, CK_MLDEF_MANIFEST, &idx) == 0)
            score = CK_PROBE_CONTENT;
        ck_zipin_close(&zi);
    }
    ck_error_clear();
    return score;
}

/* The model of path, or CK_EFORMAT naming the first violations. */
static int load(const char *path, struct ck_model **out)
{
    struct ck_mldef_report r;
    int err = ck_mldef_check(path, NULL, &r, out);
    if (err == 0 && r.n) {
        err = ck_error(CK_EFORMAT, "'%s': %s: %s (rule %s)%s", path, r.v[0].where, r.v[0].msg,
                       r.v[0].rule, r.n > 1 ? "; ckptd inspect lists every violation" : "");
    }
    ck_mldef_report_release(&r);
    return err;
}

static int graph_of(const struct ck_model *m, struct ck_graph **out)
{
    struct ck_graph *g = ck_graph_new();
    int err = g ? 0 : ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; err == 0 && i < m->ninputs; i++)
        err = ck_graph_add_io(g, false, m->inputs[i].name);
    for (size_t i = 0; err == 0 && i < m->noutputs; i++)
        err = ck_graph_add_io(g, true, m->outputs[i].name);
    for (size_t i = 0; err == 0 && i < m->nnodes; i++) {
        const struct ck_model_node *n = &m->nodes[i];
        struct ck_graph_node *gn;
        if ((err = ck_graph_add_node(g, n->name, ck_op_name(n->op), &gn)) < 0)
            break;
        for (size_t k = 0; err == 0 && k < n->ninputs; k++)
            err = ck_graph_node_add_input(gn, n->inputs[k]);
        for (size_t k = 0; err == 0 && k < n->noutputs; k++)
            err = ck_graph_node_add_output(gn, n->outputs[k]);
    }
    if (err < 0) {
        ck_graph_free(g);
        return err;
    }
    if (m->name)
        err = ck_graph_add_attr(g, "name", m->name);
    *out = g;
    return err;
}

static int mldef_open(const char *path, struct ck_tensor_set **out)
{
    struct ck_model *m = NULL;
    int err = load(path, &m);
    if (err < 0)
        return err;
    struct ck_tensor_set *s = m->weights;
    struct ck_graph *g = NULL;
    if ((err = graph_of(m, &g)) < 0) {
        ck_model_free(m);
        return err;
    }
    m->weights = NULL;
    ck_model_free(m);
    s->graph = g;
    *out = s;
    return 0;
}

static int mldef_to_model(struct ck_tensor_set *s, struct ck_model **out)
{
    /* Built again from the archive: the manifest is the model's only
     * complete description (the set's graph is for listing). */
    int err = load(s->path, out);
    ck_tensor_set_free(s);
    return err;
}

const struct ck_reader_ops ck_reader_mldef = {
    .name = "mldef",
    .description = "mldef deployment archive (docs/mldef.md)",
    .probe = mldef_probe,
    .open = mldef_open,
    .verify = NULL,
    .to_model = mldef_to_model,
};
