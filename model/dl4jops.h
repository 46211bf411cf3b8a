/* The DL4J/SameDiff op mapping, one table for both directions: the SameDiff
 * reader maps a FlatNode's opName to the canonical op (model/model.h) and its
 * arguments to ck_op_params; the SameDiff writer maps a canonical node to a
 * DL4J op name, its input order and its named arguments. Lives in model/
 * because a writer never includes a reader.
 *
 * Arguments are named (ADR 0001's Map<String,T>): the writer stores each as
 * a FlatProperties {name, l|d|b} and also positionally in extraInteger /
 * extraParams / extraBools in table order (ints lists last), which is how
 * DL4J's 2021 FlatNode carries iArgs/tArgs/bArgs. A reader prefers the names
 * and falls back to the positions. */
#ifndef CK_DL4JOPS_H
#define CK_DL4JOPS_H

#include "model/model.h"

#include <stdbool.h>
#include <stdint.h>

/* Which ck_op_params field an argument carries. */
enum ck_dl4j_field {
    CK_DF_CONST, /* a fixed value (def): written, not read back */
    CK_DF_KH,
    CK_DF_KW,
    CK_DF_SH,
    CK_DF_SW,
    CK_DF_PH,
    CK_DF_PW, /* symmetric pads: pad[0]==pad[2], pad[1]==pad[3] */
    CK_DF_DH,
    CK_DF_DW,
    CK_DF_AXIS,
    CK_DF_TRANS_W,
    CK_DF_COUNT_PAD,
    CK_DF_KEEPDIMS,
    CK_DF_SCALAR,
    CK_DF_ALPHA,
    CK_DF_EPS,
    CK_DF_MIN,
    CK_DF_MAX,
    CK_DF_INTS, /* p.ints as a list of longs */
    /* strided_slice: p.ints (start, end, step per axis) in DL4J's form */
    CK_DF_BEGIN_MASK, /* bit i: axis i starts at its beginning (p.ints' start ignored) */
    CK_DF_END_MASK,   /* bit i: axis i runs to its end */
    CK_DF_ZERO,       /* a mask ckptd cannot express: written 0, refused when not 0 */
    CK_DF_BEGINS,     /* list: every axis' start */
    CK_DF_ENDS,       /* list: every axis' end */
    CK_DF_STRIDES,    /* list: every axis' step */
    /* cast: p.ints[0], ONNX's TensorProto code, said as libnd4j's DataType
     * (graph.fb's DType); read back into p.ints = [ONNX code] */
    CK_DF_CAST_TO,
};

/* Which flags of ck_op_params select a row (the same DL4J op cannot carry them). */
enum ck_dl4j_variant {
    CK_DV_PLAIN,   /* none of the flags below */
    CK_DV_SCALAR,  /* has_scalar: a op scalar */
    CK_DV_RSCALAR, /* has_scalar && scalar_first: scalar op a */
    CK_DV_APPROX,  /* approx_tanh */
    /* conv2d with groups == input channels, weights in DL4J's [mC, iC, kH, kW]:
     * never chosen for a canonical node (the SameDiff writer lowers a grouped
     * convolution to it, writers/sdlower.h); the reader turns it back into a
     * canonical conv2d */
    CK_DV_DEPTHWISE,
};

struct ck_dl4j_arg {
    const char *name; /* DL4J's argument name */
    char kind;        /* 'i' long (iArg), 't' double (tArg), 'b' bool (bArg) */
    enum ck_dl4j_field field;
    double def; /* CK_DF_CONST's value, and the default when a file omits it */
};

#define CK_DL4J_MAX_ARGS 12
#define CK_DL4J_MAX_INPUTS 6

struct ck_dl4j_op {
    enum ck_op op;
    const char *name; /* FlatNode.opName */
    enum ck_dl4j_variant variant;
    bool read_only; /* an alias a reader accepts; the writer uses the first row */
    /* DL4J input k is canonical input inputs[k]; -1 ends the list (an empty
     * list means the same order). */
    int8_t inputs[CK_DL4J_MAX_INPUTS];
    /* When >= 0: DL4J input index that carries p.ints (pad's paddings,
     * reshape's shape, tile's repeats) or p.scalar as a constant array in
     * files DL4J wrote. A node written with that input (pad's, from
     * writers/sdlower.c) has its p.ints there only, not also as arguments. */
    int8_t ints_input, scalar_input;
    struct ck_dl4j_arg args[CK_DL4J_MAX_ARGS]; /* ends at name NULL */
};

/* The table, ended by a row whose name is NULL. */
extern const struct ck_dl4j_op ck_dl4j_ops[];

/* Reader side: the row for a DL4J opName, NULL when none: the exact spelling
 * first ("Pow" and "pow" are two ops), else a case-insensitive match. */
const struct ck_dl4j_op *ck_dl4j_by_name(const char *name);
/* Writer side: the row for a canonical node (its op and variant flags);
 * CK_EFORMAT naming the op and the node when DL4J has no such op or the
 * parameters cannot be expressed in one op (asymmetric pads, groups, ceil
 * mode: writers/sdlower.h lowers those first). */
int ck_dl4j_for_node(const struct ck_model_node *n, const struct ck_dl4j_op **out);

/* An argument's value from params (p.ints are not scalars: see CK_DF_INTS). */
double ck_dl4j_arg_get(const struct ck_dl4j_arg *a, const struct ck_op_params *p);
/* Whether the argument sets an integer field (read with the exact integer). */
bool ck_dl4j_arg_is_int(const struct ck_dl4j_arg *a);
/* Sets params from an argument's value: integer fields from i (exact, as the
 * file wrote it), the others from v. */
void ck_dl4j_arg_set(const struct ck_dl4j_arg *a, struct ck_op_params *p, int64_t i, double v);
/* Whether the argument is a list of longs (CK_DF_INTS and the slice lists):
 * written after every single value, in table order. */
bool ck_dl4j_arg_is_list(const struct ck_dl4j_arg *a);
/* A list argument's values from params into out (at most max); the count
 * in *n. CK_EFORMAT when more than max. */
int ck_dl4j_arg_list(const struct ck_dl4j_arg *a, const struct ck_op_params *p, int64_t *out,
                     size_t max, size_t *n);
/* strided_slice read back: DL4J's masks and its begins, ends and strides
 * (n each) as canonical (start, end, step) triples into out (3 n values).
 * CK_EFORMAT for a zero step. */
int ck_dl4j_slice_triples(int64_t begin_mask, int64_t end_mask, const int64_t *begins,
                          const int64_t *ends, const int64_t *strides, size_t n, int64_t *out);
/* cast's target both ways: ONNX's TensorProto code (the canonical cast's
 * p.ints[0]) to libnd4j's DataType code (graph.fb's DType: 5 FLOAT, 10
 * INT64, 1 BOOL, ...) and back; -1 for a code with no counterpart. */
int64_t ck_dl4j_dtype_of_onnx(int64_t onnx);
int64_t ck_dl4j_onnx_of_dtype(int64_t dl4j);
/* Sets the row's variant flags on p. */
void ck_dl4j_apply_variant(const struct ck_dl4j_op *row, struct ck_op_params *p);
/* Canonical input index of DL4J input k, or -1 when the row has no such input. */
int ck_dl4j_input(const struct ck_dl4j_op *row, int k, int ncanonical);

/* ADR 0001 tags, shared by the SameDiff reader and writer: "valid file/
 * folder identifiers", here portable ones: 1..200 bytes of valid UTF-8, no
 * control character or space (params.txt separates a name from its
 * "<tag>/<N>" reference by a space), none of / \\ : * ? " < > |, not "." or
 * "..", no leading or trailing dot, and not "tags.txt" (the archive's index
 * sits beside the tag folders). Compared case-insensitively (ASCII). */
#define CK_SD_TAG_MAX 200
bool ck_sd_tag_is_valid(const char *tag);
/* A valid tag made from any text (a checkpoint's reference): invalid bytes
 * become '_'; out holds at least CK_SD_TAG_MAX + 1 bytes. Returns false when
 * nothing usable remains. */
bool ck_sd_tag_from(const char *text, char *out, size_t outsz);

#endif
