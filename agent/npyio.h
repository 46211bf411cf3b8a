/* .npy files as engine arrays: the inputs and expected outputs of
 * `ckptd verify`, and the outputs it saves. Reading goes through the npy
 * reader (readers/npy.c: strict header, sizes checked against the file);
 * any real numeric dtype converts to float32. Writing is float32
 * little-endian, version 1.0, C order. */
#ifndef CK_NPYIO_H
#define CK_NPYIO_H

#include "infer/infer.h"

/* *out initialised and owned by the caller (ck_infer_array_release). CK_EFORMAT
 * naming the file for a file that is not an array of real numbers. */
int ck_npyio_load(const char *path, struct ck_infer_array *out);
/* Written atomically (temporary name, fsync, rename), mode 0644. */
int ck_npyio_save(const char *path, const struct ck_infer_array *a);

#endif
