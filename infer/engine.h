/* The engine's state (struct ck_infer) shared by infer.c, values.c and
 * plan.c; not for callers outside infer/. */
#ifndef CK_INFER_ENGINE_H
#define CK_INFER_ENGINE_H

#include "infer/internal.h"
#include "infer/pool.h"

enum ck_value_kind { CK_VALUE_WEIGHT, CK_VALUE_INPUT, CK_VALUE_NODE };

struct ck_value {
    const char *name; /* borrowed from the model */
    enum ck_value_kind kind;
    struct ck_ishape shape;
    enum ck_dtype dtype; /* what the model says the value is (ck_infer_dtypes); stored as float32 */
    float *data;      /* weights: converted (owned when .owned) or in place; others: a buffer */
    bool owned;
    bool graph_output;
    int last_use;     /* the last node reading it; INT32_MAX for graph outputs */
    int buf;          /* the plan's buffer, -1 for none */
    /* a value the plan computed before the run (shapeval.c): its integers
     * (a shape value; NULL for a float one) and its float32 copy, which
     * .data points to; both owned by the plan */
    bool planned;
    bool inexact;     /* an integer past 2^24: float32 cannot give it to a kernel */
    int64_t *ival;
    float *pdata;
};

struct ck_enode {
    int *in;  /* value indices (one allocation holds in and out) */
    int *out;
    size_t nin;  /* inputs the kernel reads: the node's, and a folded batch norm's bias */
    bool skip;   /* folded into the node before it (fuse.c): not run */
    enum ck_infer_act act; /* the activation folded into this one's output */
    float act_min, act_max;
    /* the plan of the last run (shapeval.c) */
    bool planned;  /* computed before the run: not run */
    bool has_spec; /* its shape, repeats or slice bounds came from shape values: */
    struct ck_model_node spec; /* the node with them as parameters, data input only
                                  (spec.p.ints owned) */
    float *wpack; /* conv2d, dense, matmul by a constant matrix: its weights packed
                     for pgemm.c (owned), NULL: none */
};

struct ck_buffer {
    int64_t cap;  /* floats the last plan needs */
    int64_t held; /* floats allocated at data (kept from run to run, at least cap) */
    float *data;
};

struct ck_infer {
    const struct ck_model *m;
    struct ck_infer_options o;
    struct ck_value *values;
    size_t nvalues, values_cap;
    int *map;
    size_t map_cap;
    struct ck_enode *nodes;
    uint64_t weight_bytes;
    /* the plan of the last run; its buffers and scratch are kept for the
     * next run, which re-plans and allocates only what no longer fits */
    struct ck_buffer *bufs;
    size_t nbufs, bufs_cap;
    int64_t scratch_floats;
    struct ck_buffer scratch;
    uint64_t peak_bytes;
    double *node_seconds;
    size_t fused; /* nodes folded into another (ck_infer_fuse) */
    bool dtypes_only; /* values_build: shapes and dtypes of weights, nothing converted */
    struct ck_pool *pool; /* NULL: one thread */
    bool plan_stopped; /* the shapes were planned up to a graph input's unbound values */
};

int ck_infer_value_find(const struct ck_infer *e, const char *name);
int ck_infer_value_add(struct ck_infer *e, const char *name, enum ck_value_kind kind);
int ck_infer_values_build(struct ck_infer *e);
/* Every node output's dtype from its inputs' (values_build calls it): a
 * cast's target, bool for comparisons and logic, int64 for indices, else
 * the first data input's. float16 and bfloat16 values are rounded to their
 * dtype after the node that computes them (infer.c); integers are whole
 * float32 numbers (ck_infer_k_int keeps them under 2^24). */
void ck_infer_dtypes(struct ck_infer *e);
/* Folds what the node table allows at load time (fuse.c): a batch norm into
 * the convolution before it. The model is not changed: the engine's node
 * table is. */
int ck_infer_fuse(struct ck_infer *e);
/* Packs each convolution's weights for pgemm.c when the CPU runs it
 * (after ck_infer_fuse: the folded weights). */
int ck_infer_prepack(struct ck_infer *e);
void ck_infer_values_free(struct ck_infer *e);

/* Shapes of every value from the inputs' (already set), then buffers: the
 * buffers of the previous plan are used again where they still fit. */
int ck_infer_plan(struct ck_infer *e);
/* The first part of ck_infer_plan: every value's shape from the bound input
 * shapes, nothing allocated for the activations. */
int ck_infer_plan_shapes(struct ck_infer *e);
/* Frees the buffers and the scratch the plans kept. */
void ck_infer_plan_release(struct ck_infer *e);

/* Shape values (shapeval.c, docs/model.md): node i of the plan, before its
 * shapes are inferred. Evaluates it when it computes integers from shapes
 * (*planned set: its outputs' values and shapes are known, it does not
 * run), or specialises it when its shape, repeats or slice bounds are
 * inputs (the engine's node then has them as parameters). CK_EFORMAT naming
 * the node when such an input depends on tensor values, not only on
 * shapes, or an integer is out of range. 1 when a parameter is a graph
 * input whose values are not bound (ck_infer_check_shapes): the check stops
 * there. */
int ck_infer_shapeval_plan(struct ck_infer *e, size_t i, bool *planned);
/* The node the plan runs for node i: the specialised one, or the model's. */
const struct ck_model_node *ck_infer_node_of(const struct ck_infer *e, size_t i);
/* Inputs the kernel of node i reads. */
size_t ck_infer_node_nin(const struct ck_infer *e, size_t i);
/* Frees what the plan computed for shape values. */
void ck_infer_shapeval_release(struct ck_infer *e);

#endif
