/* ckptd inspect: what a checkpoint holds, read by the same readers the
 * daemon uses. Text for people, --json for programs (schema: docs/formats.md,
 * "ckptd inspect --json"). */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/pack.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/json.h"
#include "common/sign.h"
#include "model/optstate.h"
#include "model/weightsel.h"
#include "readers/reader.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char head[] =
    "usage: ckptd inspect PATH [--json] [--verify] [--values N] [--format NAME] [--tag TAG]\n"
    "                     [--model [--weights PREFIX]]\n"
    "\n"
    "Detects the checkpoint format of PATH by content (a file, or a TensorFlow\n"
    "prefix such as DIR/variables), and prints every tensor: name, dtype, shape,\n"
    "bytes and the CRC-32C of its data (for strings: of each string's 8-byte\n"
    "little-endian length and bytes), then the metadata and the graph.\n"
    "\n"
    "An .mldef archive (or a manifest.json) is first checked against every rule of\n"
    "docs/mldef.md, SIGNATURE included; each violation is listed with where it is,\n"
    "and the exit code is 1 when any rule is broken.\n"
    "\n";

struct opts {
    bool json, verify;
    const char *values_arg; /* --values N, checked after parsing */
    uint64_t values;
    bool want_values;
    const char *format;
    const char *pubkey;
    const char *tag;
    bool model;          /* --model: the model's tensors only, as a layer list names them */
    const char *weights; /* --weights: their container or prefix (default: found) */
    /* set for --model before printing */
    const char *mprefix; /* stripped from the names shown */
    const char *mcontainer;
    const bool *mkeep; /* per tensor: shown */
    size_t mshown, mopt, mother;
};

#define O(f) offsetof(struct opts, f)
static const struct ck_opt options[] = {
    {"json", 0, CK_OPT_SET, NULL, NULL, O(json), 0, NULL, "one JSON document instead of text"},
    {"verify", 0, CK_OPT_SET, NULL, NULL, O(verify), 0, NULL,
     "check every checksum the file stores; exit 1 naming\nthe file and tensor of the first "
     "mismatch"},
    {"values", 0, CK_OPT_STR, NULL, NULL, O(values_arg), 0, "N",
     "also print the values of tensors of at most N elements"},
    {"format", 0, CK_OPT_STR, NULL, NULL, O(format), 0, "NAME",
     "skip detection: safetensors, tf-bundle, npy, npz, nnp,\nsamediff, pt, onnx, mldef"},
    {"pubkey", 0, CK_OPT_STR, NULL, NULL, O(pubkey), 0, "FILE",
     ".mldef: the trusted key its SIGNATURE must be made with"},
    {"tag", 0, CK_OPT_STR, NULL, NULL, O(tag), 0, "TAG",
     "a SameDiff archive's tag (default: the newest; also\nwritten PATH#TAG)"},
    {"model", 0, CK_OPT_SET, NULL, NULL, O(model), 0, NULL,
     "a training checkpoint: only the model's tensors, named\nas a layer list names them "
     "(the container found,\nmodel./module./_orig_mod. stripped); the rest counted"},
    {"weights", 0, CK_OPT_STR, NULL, NULL, O(weights), 0, "PREFIX",
     "with --model: the container or prefix of the model's\ntensors (state_dict, model, ema, "
     "...)"},
    {NULL, 0, 0, NULL, NULL, 0, 0, NULL, NULL},
};

/* The CRC-32C shown for t. After a successful --verify, a tensor whose data
 * the pass read (crcs, NULL otherwise) already has it: no second pass. */
static int tensor_crc(const struct ck_tensor_set *s, const struct ck_tensor *t,
                      const struct ck_tensor_crcs *crcs, uint32_t *crc)
{
    size_t i = (size_t)(t - s->tensors);
    if (crcs && crcs->known[i]) {
        *crc = crcs->crc32c[i];
        return 0;
    }
    return ck_tensor_crc32c(s, t, crc);
}

/* The name shown: without the --model prefix. */
static const char *shown(const struct opts *o, const struct ck_tensor *t)
{
    size_t n = o->mprefix ? strlen(o->mprefix) : 0;
    return n && !strncmp(t->name, o->mprefix, n) ? t->name + n : t->name;
}

static bool hidden(const struct ck_tensor_set *s, const struct opts *o, const struct ck_tensor *t)
{
    return o->mkeep && !o->mkeep[t - s->tensors];
}

static void shape_text(struct ck_buf *b, const struct ck_tensor *t)
{
    ck_buf_putc(b, '[');
    for (int d = 0; d < t->rank; d++)
        ck_buf_printf(b, d ? ", %" PRId64 : "%" PRId64, t->dims[d]);
    ck_buf_putc(b, ']');
}

static bool show_values(const struct opts *o, const struct ck_tensor *t, uint64_t *n)
{
    if (!o->want_values || ck_tensor_numel(t, n) < 0 || *n > o->values)
        return false;
    return t->dtype == CK_DT_STRING ? t->strings != NULL : t->data != NULL;
}

/* Integers up to 2^53 print exactly through a double; floats with 17 digits. */
static void value_text(struct ck_buf *b, double v)
{
    if (isnan(v))
        ck_buf_puts(b, "nan");
    else if (isinf(v))
        ck_buf_puts(b, v > 0 ? "inf" : "-inf");
    else
        ck_buf_printf(b, "%.17g", v);
}

static int print_text(const struct ck_tensor_set *s, const struct opts *o,
                      const struct ck_tensor_crcs *verified)
{
    struct ck_buf b = CK_BUF_INIT;
    uint64_t total = 0;
    for (size_t i = 0; i < s->ntensors; i++)
        total += s->tensors[i].nbytes;
    printf("%s: %s, %zu tensors, %" PRIu64 " bytes%s\n", s->path, s->format, s->ntensors, total,
           verified ? ", checksums verified" : "");
    if (ck_reader_has_graph(s))
        printf("  deployable: its own network (docs/model.md)\n");
    else
        printf("  deployable: weights only, give the graph with --graph FILE (a layer list, "
               "docs/model.md)\n");
    if (o->mkeep)
        printf("  model: %zu tensors under '%s' (container '%s'), named as a layer list names "
               "them; not shown: %zu optimizer state, %zu other\n",
               o->mshown, o->mprefix, o->mcontainer, o->mopt, o->mother);
    for (size_t i = 0; i < s->nmeta; i++)
        printf("  meta %s = %s\n", s->meta[i].key, s->meta[i].value);
    for (size_t i = 0; i < s->ntensors; i++) {
        const struct ck_tensor *t = &s->tensors[i];
        uint32_t crc;
        uint64_t n;
        if (hidden(s, o, t))
            continue;
        ck_buf_reset(&b);
        shape_text(&b, t);
        if (tensor_crc(s, t, verified, &crc) == 0)
            printf("  %s  %s %s  %" PRIu64 " bytes  crc32c %08x\n", shown(o, t),
                   ck_dtype_name(t->dtype), ck_buf_str(&b), t->nbytes, crc);
        else
            printf("  %s  %s %s  %" PRIu64 " bytes  (no data)\n", shown(o, t),
                   ck_dtype_name(t->dtype), ck_buf_str(&b), t->nbytes);
        if (show_values(o, t, &n)) {
            ck_buf_reset(&b);
            for (uint64_t k = 0; k < n; k++) {
                if (k)
                    ck_buf_puts(&b, ", ");
                if (t->dtype == CK_DT_STRING)
                    ck_json_escape(&b, (const char *)t->strings[k].p, t->strings[k].len);
                else
                    value_text(&b, ck_tensor_get_f64(t, k));
            }
            printf("    values [%s]\n", ck_buf_str(&b));
        }
    }
    if (s->graph) {
        const struct ck_graph *g = s->graph;
        printf("  graph %s: %zu nodes\n", g->name ? g->name : "", g->nnodes);
        for (size_t i = 0; i < g->ninputs; i++)
            printf("    input %s\n", g->inputs[i]);
        for (size_t i = 0; i < g->noutputs; i++)
            printf("    output %s\n", g->outputs[i]);
        for (size_t i = 0; i < g->nnodes; i++) {
            const struct ck_graph_node *nd = &g->nodes[i];
            printf("    node %s: %s(", nd->name, nd->op);
            for (size_t k = 0; k < nd->ninputs; k++)
                printf(k ? ", %s" : "%s", nd->inputs[k]);
            printf(") ->");
            for (size_t k = 0; k < nd->noutputs; k++)
                printf(" %s", nd->outputs[k]);
            printf("\n");
        }
    }
    ck_buf_release(&b);
    return 0;
}

static void json_strs(struct ck_json *j, const char *key, char **v, size_t n)
{
    ck_json_key(j, key);
    ck_json_begin_array(j);
    for (size_t i = 0; i < n; i++)
        ck_json_str(j, v[i]);
    ck_json_end_array(j);
}

static void json_kvs(struct ck_json *j, const char *key, const struct ck_kv *kv, size_t n)
{
    ck_json_key(j, key);
    ck_json_begin_object(j);
    for (size_t i = 0; i < n; i++)
        ck_json_kstr(j, kv[i].key, kv[i].value);
    ck_json_end_object(j);
}

static void json_graph(struct ck_json *j, const struct ck_graph *g)
{
    ck_json_key(j, "graph");
    if (!g) {
        ck_json_null(j);
        return;
    }
    ck_json_begin_object(j);
    ck_json_key(j, "name");
    if (g->name)
        ck_json_str(j, g->name);
    else
        ck_json_null(j);
    json_strs(j, "inputs", g->inputs, g->ninputs);
    json_strs(j, "outputs", g->outputs, g->noutputs);
    json_kvs(j, "attrs", g->attrs, g->nattrs);
    ck_json_key(j, "nodes");
    ck_json_begin_array(j);
    for (size_t i = 0; i < g->nnodes; i++) {
        const struct ck_graph_node *n = &g->nodes[i];
        ck_json_begin_object(j);
        ck_json_kstr(j, "name", n->name);
        ck_json_kstr(j, "op", n->op);
        json_strs(j, "inputs", n->inputs, n->ninputs);
        json_strs(j, "outputs", n->outputs, n->noutputs);
        json_kvs(j, "attrs", n->attrs, n->nattrs);
        ck_json_end_object(j);
    }
    ck_json_end_array(j);
    ck_json_end_object(j);
}

static void json_tensor(struct ck_json *j, const struct ck_tensor_set *s, const struct ck_tensor *t,
                        const struct opts *o, const struct ck_tensor_crcs *verified)
{
    char hex[9];
    uint32_t crc;
    uint64_t n = 0;
    ck_json_begin_object(j);
    ck_json_kstr(j, "name", shown(o, t));
    ck_json_kstr(j, "dtype", ck_dtype_name(t->dtype));
    ck_json_key(j, "shape");
    ck_json_begin_array(j);
    for (int d = 0; d < t->rank; d++)
        ck_json_int(j, t->dims[d]);
    ck_json_end_array(j);
    ck_json_key(j, "elements");
    if (ck_tensor_numel(t, &n) == 0)
        ck_json_uint(j, n);
    else
        ck_json_null(j);
    ck_json_key(j, "bytes");
    ck_json_uint(j, t->nbytes);
    bool has = tensor_crc(s, t, verified, &crc) == 0;
    ck_json_kbool(j, "has_data", has);
    ck_json_key(j, "crc32c");
    if (has) {
        snprintf(hex, sizeof hex, "%08x", crc);
        ck_json_str(j, hex);
    } else {
        ck_json_null(j);
    }
    ck_json_key(j, "stored_crc32c");
    if (t->has_crc32c) {
        snprintf(hex, sizeof hex, "%08x", t->crc32c);
        ck_json_str(j, hex);
    } else {
        ck_json_null(j);
    }
    ck_json_key(j, "stored_crc32");
    if (t->has_crc32) {
        snprintf(hex, sizeof hex, "%08x", t->crc32);
        ck_json_str(j, hex);
    } else {
        ck_json_null(j);
    }
    ck_json_key(j, "role");
    if (t->role)
        ck_json_str(j, t->role);
    else
        ck_json_null(j);
    if (t->big_endian)
        ck_json_kbool(j, "big_endian", true);
    if (t->fortran_order)
        ck_json_kbool(j, "fortran_order", true);
    if (show_values(o, t, &n)) {
        ck_json_key(j, "values");
        ck_json_begin_array(j);
        for (uint64_t k = 0; k < n; k++) {
            if (t->dtype == CK_DT_STRING) {
                ck_json_strn(j, (const char *)t->strings[k].p, t->strings[k].len);
                continue;
            }
            double v = ck_tensor_get_f64(t, k);
            if (isnan(v))
                ck_json_str(j, "nan");
            else if (isinf(v))
                ck_json_str(j, v > 0 ? "inf" : "-inf");
            else
                ck_json_double(j, v);
        }
        ck_json_end_array(j);
    }
    ck_json_end_object(j);
}

static int print_json(const struct ck_tensor_set *s, const struct opts *o,
                      const struct ck_tensor_crcs *verified)
{
    struct ck_buf b = CK_BUF_INIT;
    struct ck_json j;
    ck_buf_init(&b, 0);
    ck_json_init(&j, &b, true);
    ck_json_begin_object(&j);
    ck_json_kstr(&j, "path", s->path);
    ck_json_kstr(&j, "format", s->format);
    ck_json_kbool(&j, "verified", verified != NULL);
    ck_json_kbool(&j, "has_network", ck_reader_has_graph(s));
    json_kvs(&j, "metadata", s->meta, s->nmeta);
    if (o->mkeep) {
        ck_json_key(&j, "model");
        ck_json_begin_object(&j);
        ck_json_kstr(&j, "container", o->mcontainer);
        ck_json_kstr(&j, "prefix", o->mprefix);
        ck_json_key(&j, "tensors");
        ck_json_int(&j, (int64_t)o->mshown);
        ck_json_key(&j, "optimizer_state");
        ck_json_int(&j, (int64_t)o->mopt);
        ck_json_key(&j, "other");
        ck_json_int(&j, (int64_t)o->mother);
        ck_json_end_object(&j);
    }
    ck_json_key(&j, "tensors");
    ck_json_begin_array(&j);
    for (size_t i = 0; i < s->ntensors; i++)
        if (!hidden(s, o, &s->tensors[i]))
            json_tensor(&j, s, &s->tensors[i], o, verified);
    ck_json_end_array(&j);
    json_graph(&j, s->graph);
    ck_json_end_object(&j);
    int err = ck_json_error(&j);
    if (err == 0) {
        fwrite(ck_buf_str(&b), 1, b.len, stdout);
        fputc('\n', stdout);
    }
    ck_buf_release(&b);
    return err < 0 ? ck_error(err, "cannot write the JSON document") : 0;
}

static int parse_count(const char *arg, uint64_t *out)
{
    char *end;
    if (!arg || !*arg || *arg == '-')
        return -1;
    unsigned long long v = strtoull(arg, &end, 10);
    if (*end)
        return -1;
    *out = v;
    return 0;
}

struct run {
    const char *path;
    const struct opts *o;
};

/* Reads PATH and prints it (under ck_tensor_guarded). */
static int inspect(void *arg)
{
    const struct run *r = arg;
    const struct opts *o = r->o;
    struct ck_tensor_set *s = NULL;
    struct ck_tensor_crcs crcs = {0};
    int err = ck_reader_open(r->path, o->format, &s);
    if (err == 0 && o->verify) {
        crcs.crc32c = calloc(s->ntensors + 1, sizeof *crcs.crc32c);
        crcs.known = calloc(s->ntensors + 1, sizeof *crcs.known);
        err = crcs.crc32c && crcs.known ? ck_reader_verify(ck_reader_of(s), s, &crcs)
                                        : ck_error(CK_ENOMEM, "out of memory");
    }
    /* "verified" only where checksums were there to check */
    bool checked = o->verify && err == 0;
    if (err == CK_VERIFY_NONE) {
        err = 0;
        if (!o->json)
            printf("%s: no checksums to verify: this %s file stores none\n", r->path,
                   s->format);
    }
    struct opts mo = *o;
    struct ck_weightsel sel;
    struct ck_optstate os = {0};
    bool *keep = NULL;
    if (err == 0 && o->model && (err = ck_weightsel_find(s, o->weights, "--weights", &sel)) == 0 &&
        (err = ck_optstate_find(s, &os)) == 0) {
        size_t pl = strlen(sel.prefix);
        if (!(keep = calloc(s->ntensors + 1, sizeof *keep)))
            err = ck_error(CK_ENOMEM, "out of memory");
        for (size_t i = 0; keep && i < s->ntensors; i++) {
            bool state = os.is_state && os.is_state[i];
            keep[i] = !strncmp(s->tensors[i].name, sel.prefix, pl) && !state;
            mo.mshown += keep[i];
            mo.mopt += !keep[i] && state;
            mo.mother += !keep[i] && !state;
        }
        mo.mkeep = keep;
        mo.mprefix = sel.prefix;
        mo.mcontainer = sel.container;
    }
    if (err == 0)
        err = o->json ? print_json(s, &mo, checked ? &crcs : NULL)
                      : print_text(s, &mo, checked ? &crcs : NULL);
    ck_optstate_release(&os);
    free(keep);
    free(crcs.crc32c);
    free(crcs.known);
    ck_tensor_set_free(s);
    return err;
}

/* An .mldef or a manifest.json: the validator's report first; -1 when path
 * is neither, or it is valid and the listing follows. */
static int check_mldef(const char *path, const struct opts *o)
{
    const struct ck_reader_ops *ops = NULL;
    size_t len = strlen(path);
    bool manifest = len >= 5 && strcmp(path + len - 5, ".json") == 0;
    if (!manifest && (o->format ? strcmp(o->format, "mldef") != 0
                                : ck_reader_detect(path, &ops) < 0 || ops != &ck_reader_mldef)) {
        ck_error_clear();
        return -1;
    }
    struct ck_mldef_check_opts co = {0};
    struct ck_sign_key pub;
    int err;
    if (o->pubkey) {
        if ((err = ck_sign_load(o->pubkey, &pub)) < 0)
            return ck_cli_fail("inspect", err);
        co.trusted_pub = pub.pub;
        co.require_signature = true;
    }
    struct ck_mldef_report r;
    if ((err = ck_mldef_check(path, &co, &r, NULL)) < 0)
        return ck_cli_fail("inspect", err);
    bool bad = r.n || r.dropped;
    if (bad || manifest || o->json)
        ck_pack_print_report(bad ? stderr : stdout, path, &r, o->json);
    else
        ck_pack_print_report(stdout, path, &r, false);
    ck_mldef_report_release(&r);
    if (bad)
        return CK_EXIT_FAILED;
    return manifest || o->json ? CK_EXIT_OK : -1;
}

int ck_cmd_inspect(int argc, char **argv)
{
    struct ck_cli cli;
    struct opts o = {0};
    int rc, err;
    ck_cli_init(&cli);
    if ((rc = ck_cli_parse("inspect", argc, argv, options, &o, &cli, true)) != 0)
        return rc;
    if (o.values_arg) {
        if (parse_count(o.values_arg, &o.values) < 0)
            return ck_cli_usage_error("inspect", "--values takes a count, not '%s'", o.values_arg);
        o.want_values = true;
    }
    if (o.weights && !o.model)
        return ck_cli_usage_error("inspect", "--weights goes with --model");
    if (o.format && !ck_reader_find(o.format))
        return ck_cli_usage_error("inspect", "unknown format '%s'", o.format);
    if (cli.help) {
        ck_cli_help(head, options, "");
        return CK_EXIT_OK;
    }
    if (optind + 1 != argc)
        return ck_cli_usage_error("inspect", "expected one PATH");
    ck_cli_setup_logging(&cli, -1, -1);
    const char *path = argv[optind];
    if ((rc = check_mldef(path, &o)) != -1)
        return rc;
    char tagged[4096];
    if (o.tag) {
        /* The SameDiff reader takes a tag as "PATH#TAG". */
        if (snprintf(tagged, sizeof tagged, "%s#%s", path, o.tag) >= (int)sizeof tagged)
            return ck_cli_usage_error("inspect", "PATH and --tag are too long");
        path = tagged;
    }
    struct run r = {.path = path, .o = &o};
    /* the file truncated under us while mapped is an error, not a crash */
    err = ck_tensor_guarded(inspect, &r);
    if (fflush(stdout) != 0 && err == 0)
        err = ck_error_os(CK_EIO, "cannot write the output");
    return err < 0 ? ck_cli_fail("inspect", err) : CK_EXIT_OK;
}
