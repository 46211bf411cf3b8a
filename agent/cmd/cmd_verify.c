/* ckptd verify: runs a checkpoint's network on the CPU (infer/, in the
 * sandbox) and compares what it computes with expected outputs, so an
 * archive that unzips fine but computes garbage (a transposed matrix, a
 * lost bias, a truncated data file) is caught before it is shipped. */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/config.h"
#include "agent/mldefrec.h"
#include "agent/npyio.h"
#include "agent/sdrec.h"
#include "agent/testdata.h"
#include "common/error.h"
#include "infer/infer.h"
#include "infer/sandbox.h"
#include "readers/reader.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: ckptd verify MODEL [--inputs FILE...] [--expected FILE...] [--graph FILE]\n"
    "                   [--weights PREFIX]\n"
    "                   [--atol X] [--rtol Y] [--save-outputs DIR] [--timeout D]\n"
    "                   [--max-memory BYTES] [--threads N] [--tag TAG]\n"
    "                   [--record [--sign-key file:KEY]]\n"
    "\n"
    "Runs MODEL's network on the CPU in float32 and checks what it computes.\n"
    "MODEL is any checkpoint the readers read: an .nnp runs its executor's\n"
    "network; a weight-only checkpoint (safetensors, .npy/.npz, TF bundle) needs\n"
    "its layer list (--graph FILE, docs/model.md); a SameDiff archive runs its\n"
    "newest tag, or TAG with RUN.zip#TAG or --tag TAG.\n"
    "\n"
    "  --inputs FILE...      one file per model input, in the model's order: .npy\n"
    "                        (any real dtype, converted to float32), csv (.csv: one\n"
    "                        sample per line, values separated by commas) or raw\n"
    "                        float32 little-endian (any other name); csv and raw\n"
    "                        files take the input's shape, batch = their samples\n"
    "                        (docs/mldef.md sections 4, 5). Without it, each\n"
    "                        input k gets deterministic values: element i (C order)\n"
    "                        is sin(0.5 i + k), with batch size 1 for a -1 dimension\n"
    "                        (numpy: np.sin(0.5*np.arange(n) + k).astype('f4'))\n"
    "  --expected FILE...    one file per model output (.npy, csv or raw, as\n"
    "                        --inputs): the run passes when every\n"
    "                        value satisfies |got - expected| <= atol + rtol*|expected|\n"
    "                        (numpy.isclose's rule); the largest deviation is\n"
    "                        reported with its index and both values\n"
    "      --atol X          absolute tolerance (default 1e-4)\n"
    "      --rtol Y          relative tolerance (default 1e-5)\n"
    "      --graph FILE      the network of a weight-only checkpoint: a layer list\n"
    "                        (YAML) or an ONNX model of the same parameters\n"
    "      --weights PREFIX  with --graph, where a training checkpoint keeps the\n"
    "                        model's tensors: state_dict, model, ema, ... or a dotted\n"
    "                        prefix (default: found; docs/model.md)\n"
    "      --save-outputs DIR  write each output as DIR/NAME.npy (its declared dtype)\n"
    "      --timeout D       CPU time the engine may use: seconds or a duration (90s, 5m;\n"
    "                        default 300)\n"
    "      --max-memory N    bytes the engine's process may map (K, M, G suffixes;\n"
    "                        default 8G; 0: no limit)\n"
    "      --threads N       threads computing the products, convolutions and large\n"
    "                        element-wise ops (1 to 64, default 1); the outputs are\n"
    "                        the same bits at any N (docs/performance.md)\n"
    "      --naive-gemm      matrix products as plain loops instead of OpenBLAS\n"
    "                        (to measure what BLAS buys)\n"
    "      --repeat N        run N times (timing; outputs of the last run)\n"
    "      --tag TAG         the tag of a SameDiff archive (the same as MODEL#TAG)\n"
    "      --record          MODEL is an archive: store the --inputs and the outputs\n"
    "                        computed on them in it as a test data set; with\n"
    "                        --expected, only when they match. An .mldef gets\n"
    "                        tests/recN*.float32 and a manifest Tests entry\n"
    "                        (Tolerance = atol), rewritten atomically; a SameDiff\n"
    "                        archive gets TAG/tests/recN/ (set.txt, inputs/K.fb,\n"
    "                        outputs/K.fb: FlatArrays) under the tag, appended in\n"
    "                        place (crash-safe; earlier members untouched)\n"
    "      --sign-key KEY    re-sign an .mldef after --record (a private key from\n"
    "                        ckptd keygen, 'file:PATH' or PATH). A signed archive is\n"
    "                        refused without it (its signature would break)\n"
    "\n"
    "Without --inputs, an .mldef holding test data sets (recorded or written by\n"
    "its author), or a SameDiff tag with recorded sets, re-runs every set and\n"
    "compares with its known-good outputs:\n"
    "|got - want| <= Tolerance + rtol*|want| (Tolerance: the set's, else --atol).\n"
    "\n"
    "End a list of files with -- or another option when MODEL follows it. The\n"
    "engine runs in a child process: a model that loops, exhausts its memory or\n"
    "crashes the engine is reported as timeout, memory or crashed. Outputs\n"
    "that are NaN or infinite fail. The line 'engine:' gives the median time\n"
    "of a run (wall clock, and CPU time of the engine's threads), the planned\n"
    "activation memory and the engine process's peak RSS.\n"
    "Exit 0: every output matches (or was\n"
    "computed, without --expected); 1: a mismatch or a failure; 2: usage.\n" CK_CLI_HELP;

enum {
    OPT_INPUTS = CK_OPT_FIRST_COMMAND_OPTION,
    OPT_EXPECTED,
    OPT_ATOL,
    OPT_RTOL,
    OPT_GRAPH,
    OPT_WEIGHTS,
    OPT_SAVE,
    OPT_TIMEOUT,
    OPT_MAXMEM,
    OPT_NAIVE,
    OPT_REPEAT,
    OPT_RECORD,
    OPT_SIGNKEY,
    OPT_TAG,
    OPT_THREADS,
};

struct opts {
    const char *model, *graph, *weights, *save, *sign_key, *tag;
    char *spec; /* owned: MODEL#TAG with --tag */
    bool record;
    const char **inputs, **expected;
    size_t ninputs, nexpected;
    double atol, rtol, timeout;
    unsigned repeat;
    uint64_t max_memory;
    bool naive;
    int threads;
};

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || isinf(v))
        return -1;
    *out = v;
    return 0;
}

static int parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *s == '-')
        return -1;
    int shift = 0;
    if (*end == 'K' || *end == 'k')
        shift = 10;
    else if (*end == 'M' || *end == 'm')
        shift = 20;
    else if (*end == 'G' || *end == 'g')
        shift = 30;
    if (shift)
        end++;
    if (*end || (shift && v > (UINT64_MAX >> shift)))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

/* "--inputs a b c" becomes "--inputs a --inputs b --inputs c" so getopt sees
 * one file per option. The new vector borrows argv's strings. */
static char **expand_lists(int argc, char **argv, int *nargc)
{
    char **v = calloc((size_t)argc * 2 + 1, sizeof *v);
    int n = 0;
    if (!v)
        return NULL;
    for (int i = 0; i < argc; i++) {
        v[n++] = argv[i];
        if (strcmp(argv[i], "--inputs") && strcmp(argv[i], "--expected"))
            continue;
        char *opt = argv[i];
        if (i + 1 < argc)
            v[n++] = argv[++i];
        while (i + 1 < argc && argv[i + 1][0] != '-') {
            v[n++] = opt;
            v[n++] = argv[++i];
        }
    }
    v[n] = NULL;
    *nargc = n;
    return v;
}

static int push(const char ***list, size_t *n, const char *s)
{
    const char **l = realloc(*list, sizeof *l * (*n + 1));
    if (!l)
        return -1;
    l[(*n)++] = s;
    *list = l;
    return 0;
}

static int parse(int argc, char **argv, struct ck_cli *cli, struct opts *o)
{
    static const struct option longopts[] = {CK_CLI_LONGOPTS,
                                             {"inputs", required_argument, NULL, OPT_INPUTS},
                                             {"expected", required_argument, NULL, OPT_EXPECTED},
                                             {"atol", required_argument, NULL, OPT_ATOL},
                                             {"rtol", required_argument, NULL, OPT_RTOL},
                                             {"graph", required_argument, NULL, OPT_GRAPH},
                                             {"weights", required_argument, NULL, OPT_WEIGHTS},
                                             {"save-outputs", required_argument, NULL, OPT_SAVE},
                                             {"timeout", required_argument, NULL, OPT_TIMEOUT},
                                             {"max-memory", required_argument, NULL, OPT_MAXMEM},
                                             {"naive-gemm", no_argument, NULL, OPT_NAIVE},
                                             {"repeat", required_argument, NULL, OPT_REPEAT},
                                             {"record", no_argument, NULL, OPT_RECORD},
                                             {"sign-key", required_argument, NULL, OPT_SIGNKEY},
                                             {"tag", required_argument, NULL, OPT_TAG},
                                             {"threads", required_argument, NULL, OPT_THREADS},
                                             {NULL, 0, NULL, 0}};
    int opt, rc;
    optind = 1;
    while ((opt = getopt_long(argc, argv, CK_CLI_SHORTOPTS + 1, longopts, NULL)) != -1) {
        if ((rc = ck_cli_common(cli, "verify", opt, optarg)) != 0) {
            if (rc != 1)
                return rc;
            continue;
        }
        switch (opt) {
        case OPT_INPUTS:
        case OPT_EXPECTED:
            if (opt == OPT_INPUTS ? push(&o->inputs, &o->ninputs, optarg)
                                  : push(&o->expected, &o->nexpected, optarg))
                return ck_cli_usage_error("verify", "out of memory");
            break;
        case OPT_ATOL:
        case OPT_RTOL:
            if (parse_double(optarg, opt == OPT_ATOL ? &o->atol : &o->rtol) < 0)
                return ck_cli_usage_error("verify", "%s takes a number >= 0, not '%s'",
                                          opt == OPT_ATOL ? "--atol" : "--rtol", optarg);
            break;
        case OPT_GRAPH:
            o->graph = optarg;
            break;
        case OPT_WEIGHTS:
            o->weights = optarg;
            break;
        case OPT_SAVE:
            o->save = optarg;
            break;
        case OPT_TIMEOUT:
            /* a duration as the config's verify.timeout (plain: seconds) */
            if (ck_parse_duration(optarg, &o->timeout) < 0 || !(o->timeout > 0)) {
                ck_error_clear();
                return ck_cli_usage_error("verify", "--timeout takes a duration (300, 90s, 5m), "
                                          "not '%s'", optarg);
            }
            break;
        case OPT_MAXMEM:
            if (parse_bytes(optarg, &o->max_memory) < 0)
                return ck_cli_usage_error("verify", "--max-memory takes bytes (K, M, G), not '%s'",
                                          optarg);
            break;
        case OPT_NAIVE:
            o->naive = true;
            break;
        case OPT_REPEAT: {
            double r;
            if (parse_double(optarg, &r) < 0 || r < 1 || r > 100000 || r != (unsigned)r)
                return ck_cli_usage_error("verify", "--repeat takes a count from 1, not '%s'",
                                          optarg);
            o->repeat = (unsigned)r;
            break;
        }
        case OPT_RECORD:
            o->record = true;
            break;
        case OPT_SIGNKEY:
            o->sign_key = optarg;
            break;
        case OPT_TAG:
            o->tag = optarg;
            break;
        case OPT_THREADS: {
            double t;
            if (parse_double(optarg, &t) < 0 || t < 1 || t > CK_INFER_MAX_THREADS ||
                t != (int)t)
                return ck_cli_usage_error("verify", "--threads takes a count from 1 to %d, not '%s'",
                                          CK_INFER_MAX_THREADS, optarg);
            o->threads = (int)t;
            break;
        }
        default:
            return ck_cli_usage_error("verify", "unknown option");
        }
    }
    if (cli->help)
        return -1;
    if (optind + 1 != argc)
        return ck_cli_usage_error("verify", "expected one MODEL");
    o->model = argv[optind];
    if (o->tag) {
        size_t len = strlen(o->model) + strlen(o->tag) + 2;
        if (!o->tag[0] || strchr(o->tag, '/') || strchr(o->tag, '#'))
            return ck_cli_usage_error("verify", "--tag '%s' is not a tag", o->tag);
        if (o->graph)
            return ck_cli_usage_error("verify", "--tag names a SameDiff tag, not a --graph model");
        if (!(o->spec = malloc(len)))
            return ck_cli_usage_error("verify", "out of memory");
        snprintf(o->spec, len, "%s#%s", o->model, o->tag);
        o->model = o->spec;
    }
    if (o->sign_key && !o->record)
        return ck_cli_usage_error("verify", "--sign-key is only valid with --record");
    if (o->record && !o->ninputs)
        return ck_cli_usage_error("verify", "--record needs --inputs FILE...");
    if (o->weights && !o->graph)
        return ck_cli_usage_error("verify", "--weights goes with --graph (a layer list)");
    if (o->record && o->graph)
        return ck_cli_usage_error("verify",
                                  "--record takes an archive (.mldef, SameDiff), not --graph");
    return 0;
}

/* The model: the file's own network, or the one --graph gives it (a layer
 * list or an ONNX file), through the readers' one entry point. */
static int open_model(const struct opts *o, struct ck_model **m)
{
    struct ck_layers_opts lo = {o->weights, "--weights"};
    return ck_reader_open_model_sel(o->model, NULL, o->graph, NULL, 0, NULL, &lo, m);
}

/* The default inputs are made here, in the parent, so they are held to
 * --max-memory before they are allocated: together they may take at most the
 * limit's worth of float32 values (a model declaring a [1, 30000, 30000]
 * input is refused here, not after 3.6 GB of sines). */
static int default_inputs(const struct ck_model *m, const char *model, uint64_t max_memory,
                          struct ck_infer_array *in)
{
    uint64_t left = max_memory / sizeof(float);
    for (size_t k = 0; k < m->ninputs; k++) {
        int err = left ? ck_infer_default_input(&m->inputs[k], k, left, &in[k])
                       : ck_error(CK_ESIZE, "input '%s': no values left", m->inputs[k].name);
        if (err < 0)
            return ck_error_wrap(err, "'%s': the default input (--max-memory %llu bytes)", model,
                                 (unsigned long long)max_memory);
        left -= ck_infer_array_numel(&in[k]);
    }
    return 0;
}

static void index_text(const struct ck_infer_array *a, uint64_t i, char *buf, size_t size)
{
    int64_t idx[CK_INFER_MAX_RANK];
    for (int d = a->rank - 1; d >= 0; d--) {
        idx[d] = a->dims[d] ? (int64_t)(i % (uint64_t)a->dims[d]) : 0;
        i = a->dims[d] ? i / (uint64_t)a->dims[d] : 0;
    }
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < a->rank && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, d ? ", %" PRId64 : "%" PRId64, idx[d]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

static void shape_text(const struct ck_infer_array *a, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < a->rank && used < size; d++)
        used +=
            (size_t)snprintf(buf + used, size - used, d ? ", %" PRId64 : "%" PRId64, a->dims[d]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

/* Checks every value of got; compares with want when given. 0 pass, 1 fail. */
static int compare(const struct opts *o, const char *set, const char *name,
                   const struct ck_infer_array *got, const struct ck_infer_array *want,
                   const char *want_path)
{
    char shape[256], ix[256];
    if (set) /* every path below prints exactly one line */
        printf("test '%s': ", set);
    uint64_t n = ck_infer_array_numel(got);
    shape_text(got, shape, sizeof shape);
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(got->data[i])) {
            index_text(got, i, ix, sizeof ix);
            printf("output '%s' %s: FAILED: value at %s is %g (not finite)\n", name, shape, ix,
                   (double)got->data[i]);
            return 1;
        }
    if (!want) {
        printf("output '%s' %s:", name, shape);
        for (uint64_t i = 0; i < n && i < 16; i++)
            printf(" %.8g", (double)got->data[i]);
        printf("%s\n", n > 16 ? " ..." : "");
        return 0;
    }
    bool same_shape = want->rank == got->rank;
    for (int d = 0; same_shape && d < got->rank; d++)
        same_shape = want->dims[d] == got->dims[d];
    if (!same_shape) {
        char ws[256];
        shape_text(want, ws, sizeof ws);
        printf("output '%s' %s: FAILED: expected shape %s ('%s')\n", name, shape, ws, want_path);
        return 1;
    }
    uint64_t bad = 0, worst = 0, worst_bad = UINT64_MAX;
    double worst_diff = -1, worst_excess = 0;
    for (uint64_t i = 0; i < n; i++) {
        double g = got->data[i], w = want->data[i], diff = fabs(g - w);
        double excess = diff - (o->atol + o->rtol * fabs(w));
        if (diff > worst_diff || isnan(diff)) {
            worst_diff = diff;
            worst = i;
        }
        if (excess > 0 || isnan(w) != isnan(g)) {
            bad++;
            if (worst_bad == UINT64_MAX || excess > worst_excess) {
                worst_bad = i;
                worst_excess = excess;
            }
        }
    }
    uint64_t at = bad ? worst_bad : worst;
    index_text(got, at, ix, sizeof ix);
    if (bad) {
        printf("output '%s' %s: MISMATCH: %" PRIu64 " of %" PRIu64
               " values outside atol %g rtol %g; largest deviation %.6g at %s: got %.9g, "
               "expected %.9g\n",
               name, shape, bad, n, o->atol, o->rtol,
               fabs((double)got->data[at] - (double)want->data[at]), ix, (double)got->data[at],
               (double)want->data[at]);
        return 1;
    }
    if (n)
        printf("output '%s' %s: ok, largest deviation %.3g at %s: got %.9g, expected %.9g\n", name,
               shape, worst_diff, ix, (double)got->data[at], (double)want->data[at]);
    else
        printf("output '%s' %s: ok (empty)\n", name, shape);
    return 0;
}

/* Each output in the dtype the model declares for it (ONNX's int64 indices
 * as int64, a float16 output as float16). */
static int save_outputs(const char *dir, const struct ck_model *m, const struct ck_infer_array *out,
                        size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char path[4096], safe[256];
        size_t k = 0;
        for (const char *c = out[i].name; *c && k + 1 < sizeof safe; c++, k++)
            safe[k] = (*c == '/' || *c == '\\' || (k == 0 && *c == '.')) ? '_' : *c;
        safe[k] = 0;
        if (snprintf(path, sizeof path, "%s/%s.npy", dir, safe) >= (int)sizeof path)
            return ck_error(CK_ESIZE, "'%s': path too long", dir);
        enum ck_dtype t = i < m->noutputs ? m->outputs[i].dtype : CK_DT_F32;
        int err = ck_npyio_save_as(path, &out[i], t == CK_DT_INVALID ? CK_DT_F32 : t);
        if (err < 0)
            return err;
    }
    return 0;
}

/* One file per graph input or output (.npy, csv, binary: agent/testdata.h). */
static int load_all(const char **paths, size_t n, const struct ck_model_io *io, bool outputs,
                    struct ck_infer_array *arrays)
{
    for (size_t i = 0; i < n; i++) {
        int err = ck_testdata_load(paths[i], &io[i], outputs, &arrays[i]);
        if (err < 0)
            return err;
    }
    return 0;
}

/* Known-good values stored flat (an .mldef's test files, csv or binary
 * expected outputs of a graph output whose shape the model leaves open)
 * take the shape of what was computed when they hold as many values. */
static void flat_takes_shape(struct ck_infer_array *want, const struct ck_infer_array *got)
{
    if (want->rank == 1 && ck_infer_array_numel(want) == ck_infer_array_numel(got)) {
        want->rank = got->rank;
        memcpy(want->dims, got->dims, sizeof want->dims);
    }
}

/* Every test data set of an .mldef or a SameDiff tag, run and compared with
 * its known-good outputs; -1 when the archive has none (the caller runs
 * default inputs). */
static int replay(const struct opts *o, const struct ck_model *m, bool mldef)
{
    struct ck_testset *sets;
    size_t n;
    int err =
        mldef ? ck_mldefrec_load(o->model, m, &sets, &n) : ck_sdrec_load(o->model, m, &sets, &n);
    if (err < 0)
        return ck_cli_fail("verify", err);
    if (n == 0)
        return -1;
    int rc = CK_EXIT_OK;
    struct ck_infer_options io = {.naive_gemm = o->naive, .max_memory = o->max_memory,
                                  .threads = o->threads};
    struct ck_sandbox_limits lim = {.max_memory = o->max_memory, .timeout = o->timeout};
    for (size_t s = 0; s < n && rc != CK_EXIT_USAGE; s++) {
        struct ck_infer_array *out = NULL;
        size_t nout = 0;
        enum ck_sandbox_status st;
        struct opts so = *o;
        if (sets[s].tolerance >= 0)
            so.atol = sets[s].tolerance;
        err =
            ck_infer_run_sandboxed(m, &io, &lim, sets[s].in, m->ninputs, 1, &out, &nout, &st, NULL);
        if (err < 0) {
            printf("test '%s': FAILED: %s (%s)\n", sets[s].name, ck_error_msg(),
                   ck_sandbox_status_name(st));
            rc = CK_EXIT_FAILED;
            continue;
        }
        for (size_t i = 0; i < nout && i < m->noutputs; i++) {
            struct ck_infer_array *w = &sets[s].want[i];
            flat_takes_shape(w, &out[i]);
            if (compare(&so, sets[s].name, m->outputs[i].name, &out[i], w, sets[s].want_paths[i]))
                rc = CK_EXIT_FAILED;
        }
        ck_infer_arrays_free(out, nout);
    }
    printf("verify: '%s': %zu test set%s %s against=recorded (the known-good outputs recorded "
           "in the archive)\n",
           o->model, n, n == 1 ? "" : "s", rc == CK_EXIT_OK ? "ok" : "FAILED");
    ck_testset_free(m, sets, n);
    return rc;
}

static int record(const struct opts *o, const struct ck_model *m, const struct ck_infer_array *in,
                  const struct ck_infer_array *out)
{
    char *set = NULL;
    int err = ck_mldefrec_is_mldef(o->model)
                  ? ck_mldefrec_record(o->model, m, in, out, o->atol, o->sign_key, &set)
                  : ck_sdrec_record(o->model, m, in, out, o->atol, &set);
    if (err < 0)
        return ck_cli_fail("verify", ck_error_wrap(err, "--record"));
    printf("verify: '%s': recorded test '%s' (%zu input%s, %zu output%s)%s\n", o->model, set,
           m->ninputs, m->ninputs == 1 ? "" : "s", m->noutputs, m->noutputs == 1 ? "" : "s",
           o->sign_key ? ", signed again" : "");
    free(set);
    return CK_EXIT_OK;
}

static int run(const struct opts *o)
{
    struct ck_model *m = NULL;
    struct ck_infer_array *in = NULL, *want = NULL, *out = NULL;
    size_t nout = 0, nin = 0;
    enum ck_sandbox_status st;
    int err, rc = CK_EXIT_FAILED;
    if ((err = open_model(o, &m)) < 0)
        return ck_cli_fail("verify", err);
    bool mldef = ck_mldefrec_is_mldef(o->model);
    bool samediff = !mldef && !o->graph && ck_sdrec_is_archive(o->model);
    if (o->record && !mldef && !samediff) {
        rc = ck_cli_usage_error("verify",
                                "--record takes an archive (.mldef or SameDiff tagged zip), and "
                                "'%s' is neither",
                                o->model);
        goto done;
    }
    if (o->record && samediff && o->sign_key) {
        rc = ck_cli_usage_error("verify",
                                "--sign-key signs .mldef archives, and '%s' is a "
                                "SameDiff archive",
                                o->model);
        goto done;
    }
    if (!o->ninputs && !o->nexpected && !o->graph && (mldef || samediff)) {
        if ((rc = replay(o, m, mldef)) >= 0)
            goto done;
        rc = CK_EXIT_FAILED;
    }
    /* what the engine does not run is refused here, before the child, so the
     * refusal keeps its code (exit 4, unsupported) */
    if ((err = ck_infer_check(m)) < 0) {
        err = ck_error_wrap(err, "'%s'", o->model);
        goto out;
    }
    nin = m->ninputs;
    in = calloc(nin + 1, sizeof *in);
    want = calloc(o->nexpected + 1, sizeof *want);
    if (!in || !want) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    if (o->ninputs && o->ninputs != m->ninputs) {
        rc = ck_cli_usage_error("verify", "the model takes %zu inputs, %zu --inputs given",
                                m->ninputs, o->ninputs);
        goto done;
    }
    if (o->nexpected && o->nexpected != m->noutputs) {
        rc = ck_cli_usage_error("verify", "the model has %zu outputs, %zu --expected given",
                                m->noutputs, o->nexpected);
        goto done;
    }
    if ((err = o->ninputs ? load_all(o->inputs, nin, m->inputs, false, in)
                          : default_inputs(m, o->model, o->max_memory, in)) < 0 ||
        (err = load_all(o->expected, o->nexpected, m->outputs, true, want)) < 0)
        goto out;
    struct ck_infer_options io = {.naive_gemm = o->naive, .max_memory = o->max_memory,
                                  .threads = o->threads};
    struct ck_sandbox_limits lim = {.max_memory = o->max_memory, .timeout = o->timeout};
    struct ck_infer_stats stats;
    if ((err = ck_infer_run_sandboxed(m, &io, &lim, in, nin, o->repeat, &out, &nout, &st, &stats)) <
        0) {
        err = ck_error_wrap(err, "'%s': verification failed (%s)", o->model,
                            ck_sandbox_status_name(st));
        goto out;
    }
    if (o->save && (err = save_outputs(o->save, m, out, nout)) < 0)
        goto out;
    rc = CK_EXIT_OK;
    for (size_t i = 0; i < nout; i++) {
        enum ck_testdata_form form = CK_TESTDATA_NPY;
        if (o->nexpected && ck_testdata_form_of(o->expected[i], &form) == 0 &&
            form != CK_TESTDATA_NPY)
            flat_takes_shape(&want[i], &out[i]);
        if (compare(o, NULL, m->outputs[i].name, &out[i], o->nexpected ? &want[i] : NULL,
                    o->nexpected ? o->expected[i] : NULL))
            rc = CK_EXIT_FAILED;
    }
    printf("engine: %u run%s, median %.3f ms (min %.3f ms), median CPU %.3f ms, activations "
           "%.1f KiB, converted weights %.1f KiB, peak RSS %.1f MiB\n",
           stats.runs, stats.runs == 1 ? "" : "s", stats.median_s * 1e3, stats.min_s * 1e3,
           stats.median_cpu_s * 1e3, (double)stats.peak_activation_bytes / 1024,
           (double)stats.weight_bytes / 1024, (double)stats.child_max_rss / (1 << 20));
    if (o->nexpected)
        printf("verify: '%s': %s against=expected (the --expected files)\n", o->model,
               rc == CK_EXIT_OK ? "ok" : "FAILED");
    else
        printf("verify: '%s': %s against=none (outputs %s; nothing to compare them with: give "
               "--expected)\n",
               o->model, rc == CK_EXIT_OK ? "ok" : "FAILED",
               rc == CK_EXIT_OK ? "finite" : "not finite");
    if (rc == CK_EXIT_OK && o->record) {
        if (fflush(stdout) != 0)
            goto done;
        rc = record(o, m, in, out);
    }
    goto done;
out:
    rc = ck_cli_fail("verify", err);
done:
    if (fflush(stdout) != 0 && rc == CK_EXIT_OK)
        rc = ck_cli_fail("verify", ck_error_os(CK_EIO, "cannot write the output"));
    ck_infer_arrays_free(in, nin);
    ck_infer_arrays_free(want, o->nexpected);
    ck_infer_arrays_free(out, nout);
    ck_model_free(m);
    return rc;
}

int ck_cmd_verify(int argc, char **argv)
{
    struct ck_cli cli;
    struct opts o = {.atol = 1e-4, .rtol = 1e-5, .timeout = 300, .max_memory = UINT64_C(8) << 30};
    int nargc, rc;
    char **args = expand_lists(argc, argv, &nargc);
    if (!args)
        return ck_cli_usage_error("verify", "out of memory");
    ck_cli_init(&cli);
    rc = parse(nargc, args, &cli, &o);
    if (rc == -1) {
        fputs(help, stdout);
        rc = CK_EXIT_OK;
    } else if (rc == 0) {
        ck_cli_setup_logging(&cli, -1, -1);
        rc = run(&o);
    }
    free(o.inputs);
    free(o.expected);
    free(o.spec);
    free(args);
    return rc;
}
