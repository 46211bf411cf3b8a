/* Optimizer state in a checkpoint's tensors: which tensors are a variable's
 * optimizer slots, by each source's naming. The SameDiff writer stores them
 * as updater.txt + updater/N.fb, never as parameters.
 *
 *   SameDiff, NNabla  role "updater", "<var>/updater/<key>" (the readers name
 *                     FlatGraph.updaterState and solver states so); tied only
 *                     when "<var>" is a tensor of the set, and for NNabla
 *                     (format "nnp") a state array that is not a scalar (the
 *                     step count "t") only when its shape is the variable's
 *   TF v2 bundles     "<v>/.OPTIMIZER_SLOT/<optimizer>/<key>/.ATTRIBUTES/VARIABLE_VALUE",
 *                     the slot of "<v>/.ATTRIBUTES/VARIABLE_VALUE"
 *   TF v1 bundles     "<var>/<key>" with key Adam, Adam_1, Momentum, RMSProp,
 *                     RMSProp_1, Adagrad, Adadelta, Adadelta_1, Ftrl, Ftrl_1,
 *                     when "<var>" is a tensor of the same dtype and shape
 *   PyTorch           "<P>state.<N>.<key>" with metadata "<P>param_groups.<g>.params"
 *                     ("[0, 1, ...]"): state N belongs to the N-th floating-point
 *                     tensor outside "<P>" in file order, not counting BatchNorm's
 *                     running_mean/running_var (what model.parameters() lists);
 *                     tied only when the counts agree and every array's shape is
 *                     its variable's, else the state is counted as unmapped; in a
 *                     training checkpoint with a model container (model/weightsel.h:
 *                     a Lightning .ckpt's state_dict), only the tensors under it count */
#ifndef CK_OPTSTATE_H
#define CK_OPTSTATE_H

#include "model/tensor.h"

#include <stdbool.h>
#include <stddef.h>

struct ck_optslot {
    size_t tensor; /* index into the set's tensors */
    char *param;   /* owned: the variable (a tensor name of the set) */
    char *key;     /* owned: the slot: "M", "m", "exp_avg", "Momentum" */
};

struct ck_optstate {
    struct ck_optslot *v; /* owned: grouped by variable (first appearance), keys in file order */
    size_t n;
    bool *is_state;  /* owned: one per tensor: optimizer state, tied or not */
    size_t unmapped; /* optimizer state that could not be tied to a variable */
};

/* Fills o (released with ck_optstate_release, also on failure). */
int ck_optstate_find(const struct ck_tensor_set *s, struct ck_optstate *o);
void ck_optstate_release(struct ck_optstate *o);

#endif
