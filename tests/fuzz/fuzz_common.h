/* Shared by the libFuzzer targets: the input becomes a file (the readers
 * map files), is opened by one reader, and every tensor is touched (CRC,
 * values) and verified, so reads past a mapping show up under ASan. */
#ifndef CK_FUZZ_COMMON_H
#define CK_FUZZ_COMMON_H

#include "common/error.h"
#include "infer/infer.h"
#include "model/convert.h"
#include "model/shape.h"
#include "readers/reader.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char ck_fuzz_dirname[512];

static inline void ck_fuzz_cleanup(void)
{
    rmdir(ck_fuzz_dirname); /* the targets unlink their files after each run */
}

/* A per-process scratch folder under $TMPDIR (or /tmp), removed at exit. */
static inline const char *ck_fuzz_dir(void)
{
    if (!ck_fuzz_dirname[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(ck_fuzz_dirname, sizeof ck_fuzz_dirname, "%s/ckptd-fuzz.XXXXXX",
                 t && *t ? t : "/tmp");
        if (!mkdtemp(ck_fuzz_dirname))
            abort();
        atexit(ck_fuzz_cleanup);
    }
    return ck_fuzz_dirname;
}

static inline void ck_fuzz_write(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    if (size && fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
}

/* Runs a model that opened through the CPU engine on one sample per input
 * (ckptd verify's default input; a sample over 64 Ki values is not run),
 * under a 64 MiB limit for activations and converted weights: a graph that
 * passed the checks must run or fail with an error, never read or write out
 * of bounds. */
static inline void ck_fuzz_run_model(const struct ck_model *m)
{
    struct ck_infer_array in[8];
    size_t n = 0;
    if (m->ninputs > sizeof in / sizeof *in)
        return;
    for (; n < m->ninputs; n++) {
        if (ck_infer_default_input(&m->inputs[n], n, 64u << 10, &in[n]) < 0)
            break;
        /* an integer or bool input holds whole numbers (the engine's integers) */
        enum ck_dtype t = m->inputs[n].dtype;
        if (ck_dtype_is_int(t) || t == CK_DT_BOOL)
            for (uint64_t i = 0; i < ck_infer_array_numel(&in[n]); i++)
                in[n].data[i] = t == CK_DT_BOOL ? in[n].data[i] > 0 : nearbyintf(in[n].data[i] * 9);
    }
    struct ck_infer_options o = {.max_memory = 64u << 20};
    struct ck_infer *e = NULL;
    struct ck_infer_array *out = NULL;
    size_t nout = 0;
    if (n == m->ninputs && ck_infer_new(m, &o, &e) == 0 && ck_infer_run(e, in, n, &out, &nout) == 0)
        ck_infer_arrays_free(out, nout);
    ck_infer_free(e);
    for (size_t i = 0; i < n; i++)
        ck_infer_array_release(&in[i]);
    ck_error_clear();
}

/* Opens path with the named reader, touches and verifies what it read. */
static inline void ck_fuzz_open(const char *path, const char *format)
{
    struct ck_tensor_set *s = NULL;
    const struct ck_reader_ops *ops;
    (void)ck_reader_detect(path, &ops);
    if (ck_reader_open(path, format, &s) == 0) {
        for (size_t i = 0; i < s->ntensors; i++) {
            uint32_t crc;
            uint64_t n;
            (void)ck_tensor_crc32c(s, &s->tensors[i], &crc);
            if (ck_tensor_numel(&s->tensors[i], &n) == 0 && n)
                (void)ck_tensor_get_f64(&s->tensors[i], n - 1);
        }
        { /* with the CRC-32C hand-back, as inspect --verify asks */
            struct ck_tensor_crcs crcs = {calloc(s->ntensors + 1, sizeof(uint32_t)),
                                          calloc(s->ntensors + 1, sizeof(bool))};
            if (crcs.crc32c && crcs.known)
                (void)ck_reader_verify(ck_reader_of(s), s, &crcs);
            free(crcs.crc32c);
            free(crcs.known);
        }
        for (size_t i = 0; i < s->ntensors; i++) {
            uint64_t n;
            float f[4];
            if (ck_tensor_numel(&s->tensors[i], &n) == 0 && n)
                (void)ck_tensor_read_f32(&s->tensors[i], n - 1, 1, f, NULL);
        }
        /* a file with a network: its mapping to the model and the shapes */
        if (ck_reader_has_graph(s)) {
            struct ck_model *m = NULL;
            struct ck_model_shapes sh;
            if (ck_reader_open_model(path, format, NULL, &m) == 0 &&
                ck_model_infer_shapes(m, &sh) == 0) {
                ck_model_shapes_release(&sh);
                ck_fuzz_run_model(m);
            }
            ck_model_free(m);
        }
    }
    ck_tensor_set_free(s);
    ck_error_clear();
}

/* A target for a one-file format: the input is the file. */
#define CK_FUZZ_ONE_FILE(format, suffix)                                                           \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)                                   \
    {                                                                                              \
        char path[600];                                                                            \
        snprintf(path, sizeof path, "%s/input%s", ck_fuzz_dir(), suffix);                          \
        ck_fuzz_write(path, data, size);                                                           \
        ck_fuzz_open(path, format);                                                                \
        unlink(path);                                                                              \
        return 0;                                                                                  \
    }

#endif
