/* The canonical graph said in the ops DL4J has, before graph.fb is written:
 * a node no single DL4J op computes becomes a few that do, with the same
 * result (docs/samediff.md, "Lowered nodes"):
 * - conv2d with groups == input channels: the weights reshaped and permuted
 *   in the graph to DL4J's [mC, iC, kH, kW], then depthwise_conv2d;
 * - conv2d with other groups: per group a strided_slice of x, W and b, a
 *   conv2d, and one concat along the channels;
 * - maxpool / avgpool with ceil mode or asymmetric padding: the pool with
 *   DL4J's symmetric padding grown by whole strides (DL4J's pools skip
 *   padding cells: the max never sees them, the average divides by the cells
 *   inside the input), then a strided_slice of the windows wanted;
 *   avgpool counting its padding gets an explicit zero pad first;
 * - hard_sigmoid: mul_scalar, add_scalar, clipbyvalue to [0, 1];
 * - hard_swish: x times (div_scalar 6, add_scalar 0.5, clipbyvalue);
 * - where with broadcasting: each operand not of the output's shape
 *   reshaped to its rank and tiled to its shape, then DL4J's Where (which
 *   takes operands of one shape);
 * - pad: its paddings a constant int64 array [rank, 2] (input 1, as
 *   libnd4j's pad reads them), held in the lowered model's weights.
 * - expand to a constant shape: reshape and tile (as where's operands),
 *   then identity;
 * - rnn, gru (linear_before_reset), lstm: unrolled over the sequence known
 *   at pack time, per step matmul, add, strided_slice of the gates,
 *   sigmoid, tanh, multiply, rsub_scalar; Y, Y_h, Y_c by reshape and
 *   concat; absent initial states as float32 zeros [1, H].
 * - a dynamic export's shape values (docs/samediff.md, "Dynamic shapes"):
 *   shape with bounds as shape_of and strided_slice; constant_of_shape as
 *   fill with its value a scalar constant; expand of a computed shape, and
 *   where or expand whose dims are not known at pack time, as broadcast_to
 *   of the larger of the operands' computed dims (shape_of, maximum); a
 *   slice whose bounds are computed as strided_slice's input form (begin,
 *   end, strides per axis); comparisons only on shape values;
 * What cannot be lowered exactly is refused naming the node and why (a
 * trilu's k or a resize's sizes computed, a comparison of tensor values). */
#ifndef CK_SDLOWER_H
#define CK_SDLOWER_H

#include "model/dl4jops.h"
#include "model/model.h"

struct ck_sdlower {
    /* owned: the nodes as written, in order; their inputs name the source
     * model's weights, inputs and earlier outputs, and the constants the
     * lowering adds (its own weights: pad's paddings), which graph.fb holds
     * inline as CONSTANT variables */
    struct ck_model *m;
    const struct ck_dl4j_op **rows; /* owned array: rows[i] is m->nodes[i]'s DL4J op */
};

/* Lowers src's nodes into out (released on failure). CK_EFORMAT naming the
 * node (label first) when a node has no exact DL4J form. */
int ck_sdlower_build(const struct ck_model *src, const char *label, struct ck_sdlower *out);
void ck_sdlower_release(struct ck_sdlower *l);

#endif
