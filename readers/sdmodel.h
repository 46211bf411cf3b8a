/* The SameDiff reader's to_model: DL4J op names and arguments into the
 * canonical model through the one table (model/dl4jops.h). */
#ifndef CK_SDMODEL_H
#define CK_SDMODEL_H

#include "model/model.h"

/* Takes ownership of s (freed also on failure). Placeholders become graph
 * inputs; constant inputs that DL4J passes as arrays (pad's paddings,
 * reshape's shape) become op parameters; int8 weights with their
 * "<name>/scale" constant are dequantized to float32; values without data
 * leave the weights. An op the table lacks is CK_EFORMAT naming it and the
 * node. */
int ck_samediff_to_model(struct ck_tensor_set *s, struct ck_model **out);

#endif
