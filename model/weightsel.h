/* The model's own tensors inside a training checkpoint. torch.save of a
 * training loop's dict, a Lightning .ckpt, a DDP or torch.compile'd model
 * name each weight by its path ("state_dict.model.fc1.weight",
 * "model.module._orig_mod.fc1.weight"), while a layer list names it as the
 * module does ("fc1.weight"). This finds the prefix between the two:
 *
 *   1. the container: the top-level key holding the model's state dict
 *      (state_dict, model_state_dict, model, module, net, network, ema,
 *      model_ema, ema_state_dict, state_dict_ema, ema_model, params,
 *      weights); keys that are training state (optimizer*, lr_scheduler*,
 *      callbacks, loops, scaler, ...) are never it. A checkpoint with a
 *      tensor under any other top-level key is a plain state dict: no
 *      container. Two containers holding tensors are ambiguous: an error
 *      listing both (the caller names the key that picks one).
 *   2. the wrappers below it that every tensor there shares, stripped in
 *      turn: "model." (a LightningModule's self.model), "module." (DDP,
 *      DataParallel), "_orig_mod." (torch.compile).
 *
 * A choice given (pack.weights) names the container, or any dotted prefix;
 * the wrappers below it are still stripped. */
#ifndef CK_WEIGHTSEL_H
#define CK_WEIGHTSEL_H

#include "model/tensor.h"

#include <stdbool.h>
#include <stddef.h>

#define CK_WEIGHTSEL_PREFIX_MAX 512

struct ck_weightsel {
    char container[CK_WEIGHTSEL_PREFIX_MAX]; /* "state_dict", "" for the top level */
    char prefix[CK_WEIGHTSEL_PREFIX_MAX];    /* the whole prefix: "state_dict.model." or "" */
    size_t ntensors;                         /* tensors under prefix */
};

/* Finds the prefix of s's model tensors (choice NULL: by the rules above).
 * CK_EFORMAT naming the file when two containers qualify (listing them and
 * key, the config key or flag that picks one) or when choice names no
 * tensor. */
int ck_weightsel_find(const struct ck_tensor_set *s, const char *choice, const char *key,
                      struct ck_weightsel *out);

/* Up to n tensor names of s closest to name (a name ending in it first,
 * then by edit distance), written as "'a', 'b'" into out; a name under
 * prefix (may be NULL) is compared and shown without it. */
void ck_weightsel_closest(const struct ck_tensor_set *s, const char *prefix, const char *name,
                          size_t n, char *out, size_t outsz);

#endif
