/* DL4J FlatArrays as Java writes them (BaseNDArray.toFlatArray): the full
 * ND4J shape info [rank, dims, strides, extras, ews, order], the elements
 * big-endian, byteOrder BE; an empty array has no buffer. Optionally
 * converts floating-point tensors to fp16, bf16 or int8 (symmetric,
 * per-tensor scale max|x|/127, stored as DL4J's QINT8). */
#ifndef CK_SDARRAY_H
#define CK_SDARRAY_H

#include "model/tensor.h"
#include "writers/fbbuild.h"

#include <stdbool.h>

/* DL4J's DType byte for t, or -1 when DL4J has none. */
int ck_sdarray_dtype(enum ck_dtype t);
/* Whether conversion to a dtype applies to t (floating point, with data). */
bool ck_sdarray_converts(const struct ck_tensor *t, enum ck_dtype to);
/* Writes t as a FlatArray table into b (*table: its position). to is the
 * dtype to convert to (CK_DT_INVALID keeps t's: F16, BF16 or QI8); for QI8
 * *scale gets the per-tensor scale. CK_EFORMAT naming file and tensor when
 * DL4J cannot hold it; CK_ESIZE past FlatBuffers' 2 GiB. */
int ck_sdarray_write(struct ck_fbb *b, const struct ck_tensor *t, enum ck_dtype to,
                     const char *file, uint32_t *table, float *scale);
/* A whole .fb whose root is the FlatArray (b initialised by the caller). */
int ck_sdarray_file(struct ck_fbb *b, const struct ck_tensor *t, enum ck_dtype to, const char *file,
                    float *scale);

#endif
