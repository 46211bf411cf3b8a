/* The CPU inference engine: runs a struct ck_model (model/model.h) in
 * float32 on the CPU, to check that what was packed computes what it should.
 *
 * ck_infer_new converts every weight to float32 once (fp16, bf16, int8, ...
 * through model/convert.h; float32 little-endian weights
 * that are aligned are used in place, not copied). ck_infer_run infers
 * every value's shape from the input shapes (infer/shape.c), plans the
 * activation buffers so a buffer is reused once its value is dead
 * (infer/plan.c), and runs the kernels node by node.
 *
 * The engine includes neither a reader nor a writer: callers open the model.
 * Ownership: a ck_infer borrows the model (it must outlive the engine) and
 * owns the converted weights; a ck_infer_array owns its data and name. */
#ifndef CK_INFER_H
#define CK_INFER_H

#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CK_INFER_MAX_RANK 8
/* The most inputs, and the most outputs, of one node the engine runs. */

/* A float32 array in C order. */
struct ck_infer_array {
    char *name; /* owned or NULL */
    int rank;
    int64_t dims[CK_INFER_MAX_RANK];
    float *data; /* owned */
};

struct ck_infer_options {
    bool naive_gemm;     /* plain loops instead of BLAS (for measuring what BLAS buys) */
    uint64_t max_memory; /* activations + converted weights; 0: no limit */
    int threads;         /* threads computing the heavy kernels (infer/pool.h), at most
                            CK_INFER_MAX_THREADS; 0 or 1: the calling thread only */
};

#define CK_INFER_MAX_THREADS 64

struct ck_infer;

/* Checks the model (ck_model_check) and converts its weights. CK_EFORMAT
 * naming the weight for a dtype that is not a number; a non-finite weight
 * is a warning in the log naming the tensor (outputs are checked later). */
int ck_infer_new(const struct ck_model *m, const struct ck_infer_options *o,
                 struct ck_infer **out);
void ck_infer_free(struct ck_infer *e);

/* Whether the engine can run m, without converting or running anything: the
 * model is well formed (ck_model_check), every node's op is in the engine's
 * op table (any number of inputs and outputs), and every graph input and
 * output has a rank of at most CK_INFER_MAX_RANK. The one
 * check `ckptd pack`, `mldef -i` and the config check share with the engine,
 * so an archive they call valid is one `ckptd verify` runs. CK_EFORMAT
 * naming the node and the limit. */
int ck_infer_check(const struct ck_model *m);
/* ck_infer_check, then every node's shape rules with each graph input at its
 * declared shape, -1 taken as 1: an archive whose shapes do not chain (a
 * concat axis out of range) is refused naming the node, as `ckptd verify`
 * would refuse it, before anything is run. The weights are converted; no
 * activation is allocated. */
int ck_infer_check_shapes(const struct ck_model *m);
/* The nodes' part of ck_infer_check (op table, inputs and outputs per
 * node), for a model whose values are not complete yet: the config check's
 * layer list, before any weights. */
int ck_infer_check_nodes(const struct ck_model *m);
/* Whether m computes the same without its values' dtypes (an .mldef or a
 * SameDiff archive holds float32 values only): CK_EUNSUPPORTED naming the
 * first node that rounds to float16 or bfloat16, casts to an integer or
 * bool, or runs the integer kernels. Nothing is converted. */
int ck_infer_check_float32(const struct ck_model *m);
/* Whether op is in the engine's op table. */
bool ck_infer_op_is_supported(enum ck_op op);

/* Runs the model on inputs (one per model input, in the model's order; their
 * names are ignored). *outputs is a new array of the model's outputs, owned
 * by the caller (ck_infer_arrays_free). Errors name the node, its op and the
 * problem: shapes that do not chain, an op the engine does not run. */
int ck_infer_run(struct ck_infer *e, const struct ck_infer_array *inputs, size_t ninputs,
                 struct ck_infer_array **outputs, size_t *noutputs);

/* The most bytes the last run held at once (activations, not weights). */
uint64_t ck_infer_peak_activation_bytes(const struct ck_infer *e);
/* Bytes of weights the engine converted (copies, not borrowed in place). */
uint64_t ck_infer_weight_bytes(const struct ck_infer *e);

/* Per-node timing of the last run in seconds (NULL when not run; 0 for a
 * node folded into another). */
const double *ck_infer_node_seconds(const struct ck_infer *e);
/* How many nodes ck_infer_new folded into the node before them (a batch
 * norm into its convolution's weights): they are not run on their own. */
size_t ck_infer_fused_nodes(const struct ck_infer *e);

int ck_infer_array_init(struct ck_infer_array *a, const char *name, int rank,
                        const int64_t *dims);
uint64_t ck_infer_array_numel(const struct ck_infer_array *a);
/* The fixed input `ckptd verify` and the pack stage run when given none:
 * one sample of the model's input io (an unknown dimension taken as 1),
 * value i of input k being sin(0.5 i + k) (numpy: np.sin(0.5*np.arange(n) +
 * k).astype('f4')). CK_EFORMAT for a rank over CK_INFER_MAX_RANK, CK_ESIZE
 * for more than max_values values (0: no limit), before anything is
 * allocated. */
int ck_infer_default_input(const struct ck_model_io *io, size_t k, uint64_t max_values,
                           struct ck_infer_array *out);
void ck_infer_array_release(struct ck_infer_array *a);
void ck_infer_arrays_free(struct ck_infer_array *a, size_t n);

#endif
