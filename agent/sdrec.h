/* Known-good outputs under a SameDiff tag: `ckptd verify --record` into a
 * tagged archive (writers/sdrecord.h) and the recorded sets loaded back as
 * engine arrays (readers/sdtests.h) for `ckptd verify RUN.zip[#TAG]` with
 * no inputs and for the sidecar's gate. */
#ifndef CK_SDREC_H
#define CK_SDREC_H

#include "agent/testdata.h"
#include "infer/infer.h"
#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>

/* Whether spec ("RUN.zip" or "RUN.zip#TAG") is a SameDiff tagged archive. */
bool ck_sdrec_is_archive(const char *spec);

/* The recorded sets of spec's tag (the newest without "#TAG"), arrays in
 * m's input/output order with their recorded shapes. A set whose inputs or
 * outputs are not m's (count or names) is CK_EFORMAT naming the archive,
 * the tag, the set and the value. *n is 0 when the tag has none; free with
 * ck_testset_free. */
int ck_sdrec_load(const char *spec, const struct ck_model *m, struct ck_testset **sets, size_t *n);

/* The same, or when the tag has none, the sets of the newest older tag
 * that has some (the sidecar's gate: a new tag runs the inputs recorded
 * before it); from receives the tag they come from ("" on failure). */
int ck_sdrec_load_latest(const char *spec, const struct ck_model *m, struct ck_testset **sets,
                         size_t *n, char *from, size_t fromsz);

/* Appends in (m's inputs) and out (the outputs computed on them) under
 * spec's tag as a new set with that tolerance; *set_name receives
 * "TAG/recN" (owned by the caller). */
int ck_sdrec_record(const char *spec, const struct ck_model *m, const struct ck_infer_array *in,
                    const struct ck_infer_array *out, double tolerance, char **set_name);

#endif
