/* Test data files as engine arrays, in the forms docs/mldef.md defines
 * (section 4 and 5) and .npy: the inputs of `mldef -r`, the --inputs and
 * --expected of `ckptd verify`, verify.inputs/verify.expected of the
 * sidecar's gate, the csv test files of an .mldef's test sets.
 *
 * - .npy: through agent/npyio.h (its own shape; any real dtype);
 * - csv: decimal numbers as strtod reads them, separated by commas, one
 *   sample per line (empty lines ignored, "\r\n" accepted);
 * - binary: float32 little-endian values back to back, no header.
 *
 * A sample is the values of one batch row: the product of the shape
 * without its first (batch) dimension. Every length is checked against
 * the data before it is used; errors name the file (or "stdin") and the
 * line. */
#ifndef CK_TESTDATA_H
#define CK_TESTDATA_H

#include "infer/infer.h"
#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CK_TESTDATA_MAX ((size_t)1 << 30) /* the largest test data file read */

enum ck_testdata_form {
    CK_TESTDATA_NPY,
    CK_TESTDATA_CSV,
    CK_TESTDATA_BINARY,
};

/* The form of a file by its first bytes and its name: the .npy magic, else
 * a name ending in .csv, else binary. "-" (stdin) is binary. CK_EIO when
 * the file cannot be opened. */
int ck_testdata_form_of(const char *path, enum ck_testdata_form *form);
const char *ck_testdata_form_name(enum ck_testdata_form form);

/* Reads path whole ("-": stdin), at most CK_TESTDATA_MAX bytes; *data
 * (NUL-terminated, owned by the caller) and *len. */
int ck_testdata_read(const char *path, char **data, size_t *len);

/* csv text (modified in place: lines are cut) into float32 values. per_line
 * > 0: every non-empty line holds exactly that many values (one sample);
 * 0: any number (the flat form of an .mldef data file). *out owned by the
 * caller; *nlines the non-empty lines. label names the file in errors. */
int ck_testdata_parse_csv(char *text, size_t len, const char *label, uint64_t per_line, float **out,
                          uint64_t *nvalues, uint64_t *nlines);
/* Raw float32 little-endian values; per_sample > 0: the length must be a
 * whole number of samples of that many values. */
int ck_testdata_parse_binary(const void *data, size_t len, const char *label, uint64_t per_sample,
                             float **out, uint64_t *nvalues);

/* Values per sample of every model input (its shape without the batch
 * dimension; per_input has m->ninputs entries) and their sum: a csv line or
 * binary record of `mldef -r` holds every input's values, in model order. */
int ck_testdata_sample_sizes(const struct ck_model *m, uint64_t *per_input, uint64_t *total);
/* Splits ns samples of total values each (inputs back to back per sample)
 * into one batch array per model input (in: m->ninputs arrays, initialised
 * here; release them on failure too). label names the data in errors. */
int ck_testdata_split(const struct ck_model *m, const uint64_t *per_input, uint64_t total,
                      const float *v, uint64_t ns, const char *label, struct ck_infer_array *in);

/* One file as one array for the graph value io (an input, or an output
 * when is_output): an .npy keeps its own shape; csv and binary take io's
 * shape with the batch the file holds (one sample per line or per record).
 * An output whose shape is not known beyond its batch is read flat (rank 1;
 * verify takes the shape it computes when the counts agree). CK_EFORMAT
 * naming the file and the problem. */
int ck_testdata_load(const char *path, const struct ck_model_io *io, bool is_output,
                     struct ck_infer_array *out);

/* A test data set of an archive (an .mldef's Tests, a SameDiff tag's
 * recorded sets): inputs to run and the known-good outputs to compare. */
struct ck_testset {
    char *name;                  /* owned */
    double tolerance;            /* the set's absolute tolerance, or -1 when absent */
    struct ck_infer_array *in;   /* one per model input, model order */
    struct ck_infer_array *want; /* one per model output (flat ones take the computed shape) */
    char **want_paths;           /* entry names, for messages */
};

/* Frees n sets of m's inputs and outputs (accepts NULL). */
void ck_testset_free(const struct ck_model *m, struct ck_testset *sets, size_t n);

#endif
