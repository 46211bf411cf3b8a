/* mldef -r: runs an .mldef's model on test data (docs/mldef.md section 5)
 * in this process (the mldef tool is a user's command, not the sidecar, so
 * the sandbox is not needed) and writes the outputs as csv or binary. */
#include "agent/cmd/mldef_run.h"
#include "agent/testdata.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "infer/infer.h"
#include "readers/reader.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void put_f32le(FILE *f, float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    unsigned char b[4] = {(unsigned char)u, (unsigned char)(u >> 8), (unsigned char)(u >> 16),
                          (unsigned char)(u >> 24)};
    fwrite(b, 1, 4, f);
}

/* One record per sample: every output's values for it, outputs in order. */
static int write_outputs(FILE *f, const struct ck_infer_array *out, size_t nout, uint64_t ns,
                         bool csv)
{
    for (size_t i = 0; i < nout; i++)
        if (ns == 0 || ck_infer_array_numel(&out[i]) % ns)
            return ck_error(CK_EFORMAT,
                            "output '%s': %" PRIu64 " values do not split into %" PRIu64 " samples",
                            out[i].name ? out[i].name : "?", ck_infer_array_numel(&out[i]), ns);
    for (uint64_t s = 0; s < ns; s++) {
        bool first = true;
        for (size_t i = 0; i < nout; i++) {
            uint64_t per = ck_infer_array_numel(&out[i]) / ns;
            for (uint64_t j = 0; j < per; j++) {
                float x = out[i].data[s * per + j];
                if (csv)
                    fprintf(f, first ? "%.9g" : ",%.9g", (double)x);
                else
                    put_f32le(f, x);
                first = false;
            }
        }
        if (csv)
            fputc('\n', f);
    }
    return ferror(f) ? ck_error_os(CK_EIO, "cannot write the outputs") : 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void print_timing(const struct ck_model *m, const struct ck_infer *e, double total,
                         uint64_t ns)
{
    const double *sec = ck_infer_node_seconds(e);
    double sum = 0;
    for (size_t i = 0; sec && i < m->nnodes; i++) {
        fprintf(stderr, "layer %-24s %-14s %10.3f ms\n", m->nodes[i].name,
                ck_op_name(m->nodes[i].op), sec[i] * 1e3);
        sum += sec[i];
    }
    fprintf(stderr,
            "total: %" PRIu64 " sample%s, %zu layers %.3f ms, run %.3f ms, "
            "activations %.1f KiB\n",
            ns, ns == 1 ? "" : "s", m->nnodes, sum * 1e3, total * 1e3,
            (double)ck_infer_peak_activation_bytes(e) / 1024);
}

static int emit(const struct ck_mldef_run_opts *o, const struct ck_infer_array *out, size_t nout,
                uint64_t ns)
{
    char *mem = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mem, &len);
    if (!f)
        return ck_error_os(CK_ENOMEM, "out of memory");
    int err = write_outputs(f, out, nout, ns, o->csv_out);
    if (fclose(f) != 0 && err == 0)
        err = ck_error_os(CK_EIO, "cannot write the outputs");
    if (err == 0 && o->file) {
        struct ck_atomic_file af;
        if ((err = ck_atomic_open(&af, o->file, 0644)) == 0) {
            if ((err = ck_atomic_write(&af, mem, len)) == 0)
                err = ck_atomic_commit(&af);
            else
                ck_atomic_abort(&af);
        }
    } else if (err == 0) {
        if (fwrite(mem, 1, len, stdout) != len || fflush(stdout) != 0)
            err = ck_error_os(CK_EIO, "cannot write to stdout");
    }
    free(mem);
    return err;
}

int ck_mldef_run(const char *archive, const struct ck_mldef_run_opts *o)
{
    struct ck_model *m = NULL;
    struct ck_infer *e = NULL;
    struct ck_infer_array *in = NULL, *out = NULL;
    size_t nout = 0;
    char *data = NULL;
    size_t len = 0;
    float *v = NULL;
    uint64_t *per = NULL, ss, nv = 0, ns = 0;
    const char *label = strcmp(o->testdata, "-") == 0 ? "stdin" : o->testdata;
    int err = ck_reader_open_model(archive, NULL, NULL, &m);
    if (err < 0)
        return err;
    per = calloc(m->ninputs + 1, sizeof *per);
    in = calloc(m->ninputs + 1, sizeof *in);
    if (!per || !in) {
        err = ck_error(CK_ENOMEM, "out of memory");
        goto out;
    }
    if ((err = ck_testdata_sample_sizes(m, per, &ss)) < 0 ||
        (err = ck_testdata_read(o->testdata, &data, &len)) < 0)
        goto out;
    err = o->csv_in ? ck_testdata_parse_csv(data, len, label, ss, &v, &nv, &ns)
                    : ck_testdata_parse_binary(data, len, label, ss, &v, &nv);
    if (err < 0)
        goto out;
    ns = nv / ss;
    if (ns == 0) {
        err = ck_error(CK_EFORMAT, "'%s': no samples", label);
        goto out;
    }
    if ((err = ck_testdata_split(m, per, ss, v, ns, label, in)) < 0)
        goto out;
    struct ck_infer_options io = {0};
    if ((err = ck_infer_new(m, &io, &e)) < 0)
        goto out;
    double t0 = now_s();
    if ((err = ck_infer_run(e, in, m->ninputs, &out, &nout)) < 0)
        goto out;
    double total = now_s() - t0;
    if (o->verbose)
        print_timing(m, e, total, ns);
    err = emit(o, out, nout, ns);
out:
    if (err < 0)
        err = ck_error_wrap(err, "'%s': -r '%s'", archive, label);
    ck_infer_free(e);
    ck_infer_arrays_free(in, m ? m->ninputs : 0);
    ck_infer_arrays_free(out, nout);
    free(per);
    free(v);
    free(data);
    ck_model_free(m);
    return err;
}
