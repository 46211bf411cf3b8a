/* mldef -r: runs an .mldef's model on test data (docs/mldef.md section 5)
 * in this process (the mldef tool is a user's command, not the sidecar, so
 * the sandbox is not needed) and writes the outputs as csv or binary. */
#include "agent/cmd/mldef_run.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "infer/infer.h"
#include "readers/reader.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct buf {
    char *data;
    size_t len;
};

static int read_fd(int fd, const char *label, struct buf *b)
{
    size_t cap = 1 << 16;
    b->len = 0;
    b->data = malloc(cap + 1);
    if (!b->data)
        return ck_error(CK_ENOMEM, "out of memory");
    for (;;) {
        if (b->len == cap) {
            char *d = cap > SIZE_MAX / 4 ? NULL : realloc(b->data, cap * 2 + 1);
            if (!d)
                return ck_error(CK_ENOMEM, "'%s': out of memory", label);
            b->data = d;
            cap *= 2;
        }
        ssize_t n = read(fd, b->data + b->len, cap - b->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ck_error_os(CK_EIO, "cannot read '%s'", label);
        if (n == 0)
            break;
        b->len += (size_t)n;
    }
    b->data[b->len] = 0;
    return 0;
}

static int read_input(const char *path, struct buf *b)
{
    if (strcmp(path, "-") == 0)
        return read_fd(STDIN_FILENO, "stdin", b);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(CK_EIO, "cannot open '%s'", path);
    int err = read_fd(fd, path, b);
    close(fd);
    return err;
}

/* Values per sample of every graph input (the product of its shape without
 * the batch dimension), summed: one csv line or binary record holds them
 * all, inputs in the model's order. */
static int sample_size(const struct ck_model *m, uint64_t *per_input, uint64_t *total)
{
    *total = 0;
    for (size_t k = 0; k < m->ninputs; k++) {
        const struct ck_model_io *io = &m->inputs[k];
        if (io->rank < 1 || io->rank > CK_INFER_MAX_RANK)
            return ck_error(CK_EFORMAT, "input '%s': rank %d has no batch dimension", io->name,
                            io->rank);
        uint64_t n = 1;
        for (int d = 1; d < io->rank; d++) {
            if (io->dims[d] < 0)
                return ck_error(CK_EFORMAT, "input '%s': dimension %d is unknown", io->name, d);
            n *= (uint64_t)io->dims[d];
        }
        per_input[k] = n;
        *total += n;
    }
    if (*total == 0)
        return ck_error(CK_EFORMAT, "the model's inputs take no values");
    return 0;
}

static int parse_csv(const struct buf *b, const char *label, uint64_t ss, float **out,
                     uint64_t *nsamples)
{
    size_t cap = 0, n = 0;
    float *v = NULL;
    uint64_t line = 0, samples = 0;
    char *p = b->data, *end = b->data + b->len;
    if (memchr(b->data, 0, b->len))
        return ck_error(CK_EFORMAT, "'%s': a NUL byte in csv input", label);
    while (p < end) {
        char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        line++;
        *eol = 0;
        if (eol > p && eol[-1] == '\r')
            eol[-1] = 0;
        char *s = p;
        p = eol + 1;
        while (*s == ' ' || *s == '\t')
            s++;
        if (!*s)
            continue;
        uint64_t got = 0;
        for (;;) {
            char *e;
            errno = 0;
            double d = strtod(s, &e);
            if (e == s) {
                free(v);
                return ck_error(CK_EFORMAT,
                                "'%s' line %" PRIu64 ": value %" PRIu64 " is not a number", label,
                                line, got + 1);
            }
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 1024;
                float *nv = realloc(v, nc * sizeof *v);
                if (!nv) {
                    free(v);
                    return ck_error(CK_ENOMEM, "out of memory");
                }
                v = nv;
                cap = nc;
            }
            v[n++] = (float)d;
            got++;
            s = e;
            while (*s == ' ' || *s == '\t')
                s++;
            if (!*s)
                break;
            if (*s != ',') {
                free(v);
                return ck_error(CK_EFORMAT,
                                "'%s' line %" PRIu64 ": expected ',' after value %" PRIu64, label,
                                line, got);
            }
            s++;
        }
        if (got != ss) {
            free(v);
            return ck_error(CK_EFORMAT,
                            "'%s' line %" PRIu64 ": %" PRIu64
                            " values, the model's inputs take %" PRIu64 " per sample",
                            label, line, got, ss);
        }
        samples++;
    }
    *out = v;
    *nsamples = samples;
    return 0;
}

static float f32le(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static int parse_binary(const struct buf *b, const char *label, uint64_t ss, float **out,
                        uint64_t *nsamples)
{
    if (b->len % (4 * ss))
        return ck_error(CK_EFORMAT,
                        "'%s': %zu bytes is not a whole number of samples "
                        "(%" PRIu64 " float32 values each)",
                        label, b->len, ss);
    size_t n = b->len / 4;
    float *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        v[i] = f32le((const unsigned char *)b->data + 4 * i);
    *out = v;
    *nsamples = n / ss;
    return 0;
}

/* Splits the samples (all inputs back to back per sample) into one batch
 * array per input. */
static int make_inputs(const struct ck_model *m, const uint64_t *per, uint64_t ss, const float *v,
                       uint64_t ns, struct ck_infer_array *in)
{
    uint64_t off = 0;
    for (size_t k = 0; k < m->ninputs; k++) {
        const struct ck_model_io *io = &m->inputs[k];
        if (io->dims[0] >= 0 && (uint64_t)io->dims[0] != ns)
            return ck_error(CK_EFORMAT,
                            "input '%s' takes a batch of %" PRId64 ", the test data holds %" PRIu64
                            " samples",
                            io->name, io->dims[0], ns);
        int64_t dims[CK_INFER_MAX_RANK];
        memcpy(dims, io->dims, sizeof dims[0] * (size_t)io->rank);
        dims[0] = (int64_t)ns;
        int err = ck_infer_array_init(&in[k], io->name, io->rank, dims);
        if (err < 0)
            return err;
        for (uint64_t s = 0; s < ns; s++)
            memcpy(in[k].data + s * per[k], v + s * ss + off, per[k] * sizeof(float));
        off += per[k];
    }
    return 0;
}

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
    struct buf b = {0};
    float *v = NULL;
    uint64_t *per = NULL, ss, ns = 0;
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
    if ((err = sample_size(m, per, &ss)) < 0 || (err = read_input(o->testdata, &b)) < 0)
        goto out;
    err = o->csv_in ? parse_csv(&b, label, ss, &v, &ns) : parse_binary(&b, label, ss, &v, &ns);
    if (err < 0)
        goto out;
    if (ns == 0) {
        err = ck_error(CK_EFORMAT, "'%s': no samples", label);
        goto out;
    }
    if ((err = make_inputs(m, per, ss, v, ns, in)) < 0)
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
    free(b.data);
    ck_model_free(m);
    return err;
}
