/* What a checkpoint records about itself: the epoch and the step the trainer
 * wrote into it, which win over what its name says (agent/rules.h reads the
 * name). Two trainers record them where ckptd can read them without running
 * anything:
 *
 *   PyTorch Lightning  a .ckpt file: torch.save of a dict with "epoch" and
 *                      "global_step" beside "pytorch-lightning_version"
 *                      (read by the restricted unpickler, readers/pickle.h)
 *   Hugging Face       a checkpoint-N/ folder: trainer_state.json's
 *                      "global_step" and "epoch" (a float: epochs done,
 *                      fractions included; its whole part is the epoch)
 *
 * Other training dicts ({"epoch": 3, ...} from a hand-written loop) are not
 * read: whether their epoch counts from 0 or 1 is each script's choice. */
#ifndef CK_COUNTERS_H
#define CK_COUNTERS_H

#include "agent/discover.h"

#include <stdbool.h>
#include <stdint.h>

struct ck_counters {
    bool has_epoch, has_step;
    int64_t epoch, step;
    const char *source; /* static: "lightning" or "trainer_state.json"; NULL: none */
};

/* Fills out from the candidate's files (dir is DIR). 0 with out->source
 * NULL when the checkpoint is of neither kind; an error naming the file
 * when it is but its counters cannot be read (the caller then keeps the
 * name's reading and says so). */
int ck_counters_read(const char *dir, const struct ck_candidate *c, struct ck_counters *out);

#endif
