/* .npy files as engine arrays: the inputs and expected outputs of
 * `ckptd verify`, and the outputs it saves. Reading goes through the npy
 * reader (readers/npy.c: strict header, sizes checked against the file);
 * any real numeric dtype converts to float32 (integers past 2^24 refused).
 * Writing is little-endian, version 1.0, C order. */
#ifndef CK_NPYIO_H
#define CK_NPYIO_H

#include "infer/infer.h"

/* *out initialised and owned by the caller (ck_infer_array_release). CK_EFORMAT
 * naming the file for a file that is not an array of real numbers. */
int ck_npyio_load(const char *path, struct ck_infer_array *out);
/* Written atomically (temporary name, fsync, rename), mode 0644. */
int ck_npyio_save(const char *path, const struct ck_infer_array *a);
/* The same in dtype (float16, float64, the integer types, bool; bfloat16 as
 * float32, which holds its values): CK_EFORMAT naming the file when a value
 * is not one of the integer type's (not whole, or out of its range). */
int ck_npyio_save_as(const char *path, const struct ck_infer_array *a, enum ck_dtype dtype);

#endif
