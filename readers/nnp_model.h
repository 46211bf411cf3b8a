/* The NNabla network as the canonical model: NNabla function types map to
 * ckptd's operations through one table (nnp_model.c, docs/model.md "NNabla"). */
#ifndef CK_NNP_MODEL_H
#define CK_NNP_MODEL_H

#include "model/model.h"

/* ck_reader_nnp.to_model: builds the model from a set the nnp reader opened
 * (its graph, its parameters, the declared shapes of its variables); takes
 * ownership of s. CK_EFORMAT naming the file, the node and the function type
 * for a function with no mapping or parameters ckptd cannot honour. */
int ck_nnp_to_model(struct ck_tensor_set *s, struct ck_model **out);

/* The NNabla function types that map (NULL-terminated; for docs and tests). */
extern const char *const ck_nnp_mapped_types[];

#endif
