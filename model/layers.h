/* Layer lists: the graph of a weight-only checkpoint (safetensors, TF
 * bundles, .npy/.npz, .pt) written as YAML, from a file (--graph FILE) or
 * from the config (pack.graph:). docs/model.md is the reference; in short:
 *
 *   input: {name: x, shape: [-1, 1, 28, 28]}     # optional for a first dense/conv2d layer
 *   output: y                                    # optional, the last layer's value name
 *   layers:
 *     - {op: conv2d, weight: c1.weight, bias: c1.bias, stride: 1, padding: 2}
 *     - {op: relu, name: r1}
 *     - {op: add, from: [-1, r1]}                # a residual: previous layer + layer r1
 *     - {op: flatten}
 *     - {op: dense, weight: fc.weight, bias: fc.bias}   # layout: out_in (torch) by default
 *
 * A bare list (no mapping) is the layers alone. Every layer is one node of
 * the model; the tensors named must exist in the weights and the shapes must
 * chain: mistakes are CK_EFORMAT naming the file, the layer index and op and
 * the tensor ("'g.yaml': layer 2 (dense): weight 'fc2.weight' [10, 64]
 * expects 64 input features, layer 1 gives 128"). */
#ifndef CK_LAYERS_H
#define CK_LAYERS_H

#include "common/yamlutil.h"
#include "model/model.h"

/* The most bytes a layer list file may have. */
#define CK_LAYERS_MAX_FILE (4u << 20)

/* Where the layer list's tensor names are looked up, for a training
 * checkpoint whose weights sit under a container (model/weightsel.h): a
 * name not in the file as written is looked up under the prefix found (or
 * chosen), which is logged once (weights.chosen). */
struct ck_layers_opts {
    const char *weights;     /* the container or prefix of the model's tensors; NULL: found */
    const char *weights_key; /* what sets it, for messages (default "pack.weights") */
};

/* Builds a model from the layer list at node of d, on weights (owned: freed
 * with the model, also on failure). label names the list in errors (the file
 * name, or "pack.graph"). The model's outputs carry the inferred shapes. */
int ck_layers_build(struct ck_tensor_set *weights, struct ck_yaml_doc *d, yaml_node_t *node,
                    const char *label, struct ck_model **out);
/* The list's own shape, before any checkpoint (the config check): keys,
 * ops, references, counts, the input; not what the weights decide (tensor
 * names, the shapes that chain). *out gets its nodes (ops, inputs by name,
 * weights as named) without weights or shapes, for checking the ops; owned
 * by the caller. Errors as ck_layers_build's. */
int ck_layers_check(const char *label, const char *text, size_t len, struct ck_model **out);
int ck_layers_build_opts(struct ck_tensor_set *weights, struct ck_yaml_doc *d, yaml_node_t *node,
                         const char *label, const struct ck_layers_opts *o, struct ck_model **out);
/* Reads the YAML file at path and builds (weights owned as above). */
int ck_layers_load(struct ck_tensor_set *weights, const char *path, struct ck_model **out);
int ck_layers_load_opts(struct ck_tensor_set *weights, const char *path,
                        const struct ck_layers_opts *o, struct ck_model **out);
/* The same from YAML text in memory (tests, the config's copy). */
int ck_layers_parse(struct ck_tensor_set *weights, const char *label, const char *text, size_t len,
                    struct ck_model **out);
int ck_layers_parse_opts(struct ck_tensor_set *weights, const char *label, const char *text,
                         size_t len, const struct ck_layers_opts *o, struct ck_model **out);

#endif
