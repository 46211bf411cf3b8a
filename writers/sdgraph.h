/* graph.fb of a SameDiff tag: a root FlatGraph (FORMAT-FACTS 3.2 field ids)
 * from the canonical model, nodes named with DL4J ops through the one table
 * (model/dl4jops.h). Weights are variables with dtype and shape whose arrays
 * live in params/ (params.txt); int8 weights get a scalar FLOAT constant
 * "<name>/scale" with their scale, inline. */
#ifndef CK_SDGRAPH_H
#define CK_SDGRAPH_H

#include "model/model.h"
#include "writers/fbbuild.h"

/* What the graph needs to know of each weight as stored. */
struct ck_sdgraph_weight {
    const struct ck_tensor *t; /* borrowed */
    enum ck_dtype stored;      /* the dtype written (after conversion) */
    float scale;               /* QI8: the per-tensor scale */
};

/* Builds graph.fb into b (initialised by the caller). label names the
 * archive and tag in errors. */
int ck_sdgraph_build(struct ck_fbb *b, const struct ck_model *m, const struct ck_sdgraph_weight *w,
                     size_t nw, const char *label);
/* trainingConfig.fb: a root FlatGraph carrying only trainingConfig (JSON),
 * the slot DL4J keeps it in (its schema has no table of its own). */
int ck_sdgraph_training_config(struct ck_fbb *b, const char *json);

#endif
