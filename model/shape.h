/* Shape inference over a ck_model: the shape of every value (graph inputs,
 * weights, node outputs) computed node by node with each op's rules of
 * docs/model.md. It is how a layer list's mistakes are found ("layer 2
 * (dense): weight 'fc2.weight' [10, 64] expects 64 input features, layer 1
 * gives 128"), how a mapped .nnp network is checked against the shapes its
 * file declares, and what the engine and the writers can plan buffers with.
 *
 * A dimension of -1 is unknown (the batch dimension of a graph input
 * declared -1); it propagates, and checks that need it are skipped. */
#ifndef CK_SHAPE_H
#define CK_SHAPE_H

#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

struct ck_shape {
    int rank;
    int64_t dims[CK_TENSOR_MAX_RANK];
};

struct ck_shape_value {
    const char *name; /* borrowed from the model */
    long producer;    /* node index; -1 a graph input; -2 a weight */
    struct ck_shape shape;
};

/* Every value's shape. Owns its arrays; names are borrowed from the model,
 * which must outlive it. */
struct ck_model_shapes {
    struct ck_shape_value *values;
    size_t nvalues;
    size_t *slots; /* hash table of value indices + 1 (0: empty) */
    size_t nslots;
};

/* Infers every node's output shapes in node order. CK_EFORMAT naming the
 * node (for a layer list: "layer N (op)"), the tensor and both shapes when a
 * rule fails; CK_EFORMAT also for what ck_model_check finds. out is released
 * on failure. */
int ck_model_infer_shapes(const struct ck_model *m, struct ck_model_shapes *out);
void ck_model_shapes_release(struct ck_model_shapes *s);
/* The shape of a value, or NULL when it is unknown to the model. */
const struct ck_shape *ck_model_shape_of(const struct ck_model_shapes *s, const char *value);

/* "[10, 64]" into buf (always terminated). */
const char *ck_shape_text(const struct ck_shape *s, char *buf, size_t len);
/* The product of the dims; -1 when one is unknown; CK_ESIZE-free: saturates at INT64_MAX. */
int64_t ck_shape_numel(const struct ck_shape *s);

#endif
