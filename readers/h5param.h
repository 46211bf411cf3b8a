/* NNabla parameters in HDF5 (parameter.h5, or a bare .h5): one float32
 * dataset per parameter, named by the parameter key with '/' as groups,
 * attributes need_grad (int8 enum) and index (int64, the save order).
 * See specs/FORMAT-FACTS.md 4.3.
 *
 * Read with Debian's libhdf5, which is not hardened against hostile files
 * (a corrupt header can make it allocate hundreds of GiB): it runs only in a
 * forked child with CPU and address-space limits, which streams the datasets
 * back through a pipe; a child that dies or overruns is an error naming the
 * file. Each dataset's type, rank and element count are checked, and its
 * byte size against the size of the file, in the child and again in the
 * parent before it allocates. Soft and external links are refused (an
 * external link would open another file). libhdf5's error printing is off. */
#ifndef CK_H5PARAM_H
#define CK_H5PARAM_H

#include "model/tensor.h"

#include <stddef.h>

/* Adds every dataset of the HDF5 file as a tensor of s (role "parameter"),
 * in the order of their index attributes (then by name), and a meta entry
 * "need_grad:<name>" = "true"/"false" for each that has the attribute.
 * Reads the file at path, or the in-memory image (borrowed) when image is
 * not NULL; label names the source in messages. */
int ck_h5param_read(struct ck_tensor_set *s, const char *label, const char *path, const void *image,
                    size_t imagelen);

/* Flags of ck_h5param_read_flags. CK_H5PARAM_INTEGERS: integer datasets
 * (1 to 8 bytes, any order and sign) are read too, as int64 (CK_DT_I64),
 * for NNabla solver states' step counts "t"; without it they are an error. */
#define CK_H5PARAM_INTEGERS 1u

int ck_h5param_read_flags(struct ck_tensor_set *s, const char *label, const char *path,
                          const void *image, size_t imagelen, unsigned flags);

/* Whether head starts with the HDF5 signature. */
int ck_h5param_is_hdf5(const unsigned char *head, size_t len);

#endif
