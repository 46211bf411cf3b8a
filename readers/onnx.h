/* ONNX: the reader (onnx.c) and the mapping of its graph into the canonical
 * model (onnx_model.c), which share the data type table. */
#ifndef CK_ONNX_H
#define CK_ONNX_H

#include "model/model.h"
#include "model/tensor.h"

#include <stdint.h>

/* TensorProto.DataType to a dtype; CK_DT_INVALID for unknown ones. */
enum ck_dtype ck_onnx_dtype(uint64_t t);
/* The reader's to_model: maps the graph ck_reader_onnx read into s through
 * one table of ONNX op names, folding the shape arithmetic exporters emit
 * (Shape, Gather, Concat, Unsqueeze on constants) when shapes are static.
 * Takes ownership of s. */
int ck_onnx_to_model(struct ck_tensor_set *s, struct ck_model **out);

/* The network of a weight-only checkpoint w (a .pt, safetensors...) from the
 * ONNX file at onnx_path: every initializer of the file must be a tensor of
 * w with the same shape (by name, or the one name ending in ".NAME"); the
 * file's constants are copied into w. Takes ownership of w. */
int ck_onnx_graph_for(struct ck_tensor_set *w, const char *onnx_path, struct ck_model **out);

#endif
