/* Recording a test set under a tag of a SameDiff archive (`ckptd verify
 * --record`): the inputs and the outputs computed on them become
 * <tag>/tests/recN/inputs/K.fb, outputs/K.fb (root FlatArrays, as
 * writers/sdarray.h writes parameters) and <tag>/tests/recN/set.txt, the
 * layout readers/sdtests.h reads back and README "SameDiff tagged archives"
 * documents. The members are appended in place through writers/zipapp.h
 * (journaled, crash-safe): no existing member is moved, rewritten or
 * dropped, and tags.txt is left as it is. */
#ifndef CK_SDRECORD_H
#define CK_SDRECORD_H

#include "model/tensor.h"

#include <stddef.h>

struct ck_sdrecord_result {
    char tag[256]; /* the tag as tags.txt spells it */
    char set[32];  /* "recN": the first N this tag does not use */
};

/* spec: "RUN.zip" (its newest tag) or "RUN.zip#TAG". in/out: one tensor per
 * graph input/output in graph order, named after it (names without line
 * breaks). tolerance: the set's absolute tolerance (set.txt). CK_ENOENT for
 * a missing archive or tag, CK_EFORMAT for a file that is not a SameDiff
 * archive, CK_ELOCKED while another process appends. */
int ck_sdrecord_add(const char *spec, const struct ck_tensor *in, size_t nin,
                    const struct ck_tensor *out, size_t nout, double tolerance,
                    struct ck_sdrecord_result *res);

#endif
