/* Known-good outputs inside an .mldef (docs/mldef.md section 6): recording a
 * test data set (`ckptd verify --record`) and loading every recorded set
 * back (`ckptd verify ARCHIVE` with no inputs). */
#ifndef CK_MLDEFREC_H
#define CK_MLDEFREC_H

#include "agent/testdata.h"
#include "infer/infer.h"
#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>

/* Whether path is a zip holding manifest.json with "Format": "mldef". */
bool ck_mldefrec_is_mldef(const char *path);

/* Every test set of the archive, arrays in the model's input/output order.
 * CK_EFORMAT naming the archive, the set and the file for a set that does
 * not fit the model. *n is 0 when the archive has no Tests. Freed with
 * ck_testset_free. */
int ck_mldefrec_load(const char *path, const struct ck_model *m, struct ck_testset **sets,
                     size_t *n);

/* Adds a test set (the inputs and the outputs computed on them, float32 in
 * tests/) to the archive at path, rewritten atomically (every other entry's
 * content kept byte for byte; manifest.json gains the set in Tests).
 * keyfile (may be NULL) re-signs; a signed archive without keyfile is
 * refused (CK_ESTATE), as is a signed one whose signature does not verify.
 * *set_name receives the new set's name (owned by the caller). */
int ck_mldefrec_record(const char *path, const struct ck_model *m, const struct ck_infer_array *in,
                       const struct ck_infer_array *out, double tolerance, const char *keyfile,
                       char **set_name);

#endif
