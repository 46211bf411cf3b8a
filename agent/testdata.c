/* Test data files: .npy, csv, raw float32 (agent/testdata.h). */
#include "agent/testdata.h"
#include "agent/npyio.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/text.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char npy_magic[6] = "\x93NUMPY";

int ck_testdata_form_of(const char *path, enum ck_testdata_form *form)
{
    char head[sizeof npy_magic];
    *form = CK_TESTDATA_BINARY;
    if (strcmp(path, "-") == 0)
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(errno == ENOENT ? CK_ENOENT : CK_EIO, "cannot open '%s'", path);
    ssize_t n = read(fd, head, sizeof head);
    close(fd);
    if (n == (ssize_t)sizeof head && memcmp(head, npy_magic, sizeof head) == 0)
        *form = CK_TESTDATA_NPY;
    else if (ck_text_ends_with(path, ".npy"))
        *form = CK_TESTDATA_NPY; /* the npy reader says what is wrong with it */
    else if (ck_text_ends_with_icase(path, ".csv"))
        *form = CK_TESTDATA_CSV;
    return 0;
}

const char *ck_testdata_form_name(enum ck_testdata_form form)
{
    return form == CK_TESTDATA_NPY ? "npy" : form == CK_TESTDATA_CSV ? "csv" : "binary";
}

int ck_testdata_read(const char *path, char **data, size_t *len)
{
    struct ck_buf b;
    int err = 0;
    ck_buf_init(&b, CK_TESTDATA_MAX + 1);
    if (strcmp(path, "-") != 0) {
        err = ck_read_file(path, CK_TESTDATA_MAX, &b);
    } else {
        char chunk[65536];
        for (;;) {
            ssize_t n = read(STDIN_FILENO, chunk, sizeof chunk);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                err = ck_error_os(CK_EIO, "cannot read stdin");
                break;
            }
            if (n == 0)
                break;
            if (b.len + (size_t)n > CK_TESTDATA_MAX) {
                err = ck_error(CK_ESIZE, "stdin holds more than %zu bytes", CK_TESTDATA_MAX);
                break;
            }
            if ((err = ck_buf_append(&b, chunk, (size_t)n)) < 0)
                break;
        }
    }
    if (err < 0) {
        ck_buf_release(&b);
        return err;
    }
    *len = b.len;
    if (!(*data = ck_buf_detach(&b))) /* NUL-terminated, also when empty */
        return ck_error(CK_ENOMEM, "out of memory");
    return 0;
}

int ck_testdata_parse_csv(char *text, size_t len, const char *label, uint64_t per_line, float **out,
                          uint64_t *nvalues, uint64_t *nlines)
{
    size_t cap = 0, n = 0;
    float *v = NULL;
    uint64_t line = 0, lines = 0;
    char *p = text, *end = text + len;
    int err = 0;
    if (memchr(text, 0, len))
        return ck_error(CK_EFORMAT, "'%s': a NUL byte in csv data", label);
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
        return ck_error(CK_EFORMAT, "'%s': csv data starts with a byte order mark", label);
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
                err =
                    ck_error(CK_EFORMAT, "'%s' line %" PRIu64 ": value %" PRIu64 " is not a number",
                             label, line, got + 1);
                goto fail;
            }
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 1024;
                float *nv = nc > SIZE_MAX / sizeof *v ? NULL : realloc(v, nc * sizeof *v);
                if (!nv) {
                    err = ck_error(CK_ENOMEM, "'%s': out of memory", label);
                    goto fail;
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
                err =
                    ck_error(CK_EFORMAT, "'%s' line %" PRIu64 ": expected ',' after value %" PRIu64,
                             label, line, got);
                goto fail;
            }
            s++;
        }
        if (per_line && got != per_line) {
            err = ck_error(CK_EFORMAT,
                           "'%s' line %" PRIu64 ": %" PRIu64 " values, a sample holds %" PRIu64,
                           label, line, got, per_line);
            goto fail;
        }
        lines++;
    }
    *out = v ? v : malloc(sizeof *v);
    if (!*out)
        return ck_error(CK_ENOMEM, "'%s': out of memory", label);
    *nvalues = n;
    *nlines = lines;
    return 0;
fail:
    free(v);
    return err;
}

static float f32le(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

int ck_testdata_parse_binary(const void *data, size_t len, const char *label, uint64_t per_sample,
                             float **out, uint64_t *nvalues)
{
    if (len % 4 || (per_sample && (len / 4) % per_sample))
        return ck_error(CK_EFORMAT,
                        "'%s': %zu bytes is not a whole number of samples "
                        "(%" PRIu64 " float32 values each)",
                        label, len, per_sample ? per_sample : 1);
    size_t n = len / 4;
    float *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "'%s': out of memory", label);
    for (size_t i = 0; i < n; i++)
        v[i] = f32le((const unsigned char *)data + 4 * i);
    *out = v;
    *nvalues = n;
    return 0;
}

/* Values of one sample of io (its shape without the batch dimension); 0
 * when a dimension past the first is unknown, or io has no batch dimension
 * or more than the engine takes. */
static uint64_t per_sample(const struct ck_model_io *io)
{
    if (io->rank < 1 || io->rank > CK_INFER_MAX_RANK)
        return 0;
    return ck_model_io_per_sample(io);
}

int ck_testdata_sample_sizes(const struct ck_model *m, uint64_t *per_input, uint64_t *total)
{
    *total = 0;
    for (size_t k = 0; k < m->ninputs; k++) {
        const struct ck_model_io *io = &m->inputs[k];
        if (io->rank < 1 || io->rank > CK_INFER_MAX_RANK)
            return ck_error(CK_EFORMAT, "input '%s': rank %d has no batch dimension", io->name,
                            io->rank);
        if (!(per_input[k] = per_sample(io)))
            return ck_error(CK_EFORMAT, "input '%s': a dimension past the batch is unknown or 0",
                            io->name);
        *total += per_input[k];
    }
    if (*total == 0)
        return ck_error(CK_EFORMAT, "the model's inputs take no values");
    return 0;
}

/* in: an array of io's shape with ns samples (the batch dimension); an
 * input's fixed batch must match (an output's is whatever the run makes). */
static int batch_array(const struct ck_model_io *io, const char *label, uint64_t ns, bool is_output,
                       struct ck_infer_array *in)
{
    if (!is_output && io->dims[0] >= 0 && (uint64_t)io->dims[0] != ns)
        return ck_error(CK_EFORMAT,
                        "'%s': %" PRIu64 " samples, input '%s' takes a batch of %" PRId64, label,
                        ns, io->name, io->dims[0]);
    if (ns > INT64_MAX)
        return ck_error(CK_EFORMAT, "'%s': too many samples", label);
    int64_t dims[CK_INFER_MAX_RANK];
    memcpy(dims, io->dims, sizeof dims[0] * (size_t)io->rank);
    dims[0] = (int64_t)ns;
    int err = ck_infer_array_init(in, io->name, io->rank, dims);
    return err < 0 ? ck_error_wrap(err, "'%s'", label) : 0;
}

int ck_testdata_split(const struct ck_model *m, const uint64_t *per_input, uint64_t total,
                      const float *v, uint64_t ns, const char *label, struct ck_infer_array *in)
{
    uint64_t off = 0;
    for (size_t k = 0; k < m->ninputs; k++) {
        int err = batch_array(&m->inputs[k], label, ns, false, &in[k]);
        if (err < 0)
            return err;
        for (uint64_t s = 0; s < ns; s++)
            memcpy(in[k].data + s * per_input[k], v + s * total + off,
                   per_input[k] * sizeof(float));
        off += per_input[k];
    }
    return 0;
}

int ck_testdata_load(const char *path, const struct ck_model_io *io, bool is_output,
                     struct ck_infer_array *out)
{
    enum ck_testdata_form form;
    char *data = NULL;
    size_t len = 0;
    float *v = NULL;
    uint64_t n = 0, lines = 0;
    int err;
    memset(out, 0, sizeof *out);
    if ((err = ck_testdata_form_of(path, &form)) < 0)
        return err;
    if (form == CK_TESTDATA_NPY)
        return ck_npyio_load(path, out);
    if (!is_output && (io->rank < 1 || io->rank > CK_INFER_MAX_RANK))
        return ck_error(CK_EFORMAT, "'%s': input '%s' has rank %d: give it as .npy", path, io->name,
                        io->rank);
    uint64_t ps = per_sample(io);
    if (!is_output && !ps)
        return ck_error(CK_EFORMAT,
                        "'%s': input '%s' has an unknown dimension past the batch: give it as .npy",
                        path, io->name);
    if ((err = ck_testdata_read(path, &data, &len)) < 0)
        return err;
    err = form == CK_TESTDATA_CSV ? ck_testdata_parse_csv(data, len, path, ps, &v, &n, &lines)
                                  : ck_testdata_parse_binary(data, len, path, ps, &v, &n);
    if (err < 0)
        goto out;
    if (n == 0) {
        err = ck_error(CK_EFORMAT, "'%s': no values", path);
        goto out;
    }
    if (ps) {
        if ((err = batch_array(io, path, n / ps, is_output, out)) < 0)
            goto out;
    } else { /* an output of unknown shape: flat */
        int64_t flat = (int64_t)n;
        if ((err = ck_infer_array_init(out, io->name, 1, &flat)) < 0) {
            err = ck_error_wrap(err, "'%s'", path);
            goto out;
        }
    }
    memcpy(out->data, v, n * sizeof *v);
out:
    free(v);
    free(data);
    return err;
}

void ck_testset_free(const struct ck_model *m, struct ck_testset *sets, size_t n)
{
    for (size_t i = 0; sets && i < n; i++) {
        struct ck_testset *s = &sets[i];
        free(s->name);
        ck_infer_arrays_free(s->in, m->ninputs);
        ck_infer_arrays_free(s->want, m->noutputs);
        for (size_t k = 0; s->want_paths && k < m->noutputs; k++)
            free(s->want_paths[k]);
        free(s->want_paths);
    }
    free(sets);
}
