/* libhdf5's functions that ckptd calls (NNabla parameter.h5, read only in the
 * reader's resource-limited child process), loaded on first use (see lazy.h).
 *
 * HDF5's predefined ids are global variables (H5P_FILE_ACCESS expands to
 * "(H5open(), H5P_CLS_FILE_ACCESS_ID_g)"). ckptd keeps its own copies of the
 * ones it uses; the H5open trampoline fills them from the library after the
 * library's own H5open has set them. */
#include <hdf5.h>

#include "lazy/trampoline.h"

#define LAZY_LIB CK_LIB_HDF5
#define LAZY_SYMBOLS ck_lazy_symbols_hdf5

#define FUNCS(F, V)                                                                                \
    F(herr_t, H5check_version, (unsigned maj, unsigned min, unsigned rel), (maj, min, rel))        \
    F(herr_t, H5Eset_auto2, (hid_t stack, H5E_auto2_t func, void *data), (stack, func, data))      \
    F(hid_t, H5Pcreate, (hid_t cls), (cls))                                                        \
    F(herr_t, H5Pset_fapl_core, (hid_t fapl, size_t increment, hbool_t backing),                   \
      (fapl, increment, backing))                                                                  \
    F(herr_t, H5Pset_file_image, (hid_t fapl, void *buf, size_t len), (fapl, buf, len))            \
    F(hid_t, H5Fopen, (const char *name, unsigned flags, hid_t fapl), (name, flags, fapl))         \
    F(herr_t, H5Lvisit,                                                                            \
      (hid_t grp, H5_index_t idx, H5_iter_order_t order, H5L_iterate_t op, void *data),            \
      (grp, idx, order, op, data))                                                                 \
    F(herr_t, H5Oget_info_by_name, (hid_t loc, const char *name, H5O_info_t *info, hid_t lapl),    \
      (loc, name, info, lapl))                                                                     \
    F(hid_t, H5Dopen2, (hid_t loc, const char *name, hid_t dapl), (loc, name, dapl))               \
    F(hid_t, H5Dget_type, (hid_t d), (d))                                                          \
    F(hid_t, H5Dget_space, (hid_t d), (d))                                                         \
    F(hsize_t, H5Dget_storage_size, (hid_t d), (d))                                                \
    F(herr_t, H5Dread,                                                                             \
      (hid_t d, hid_t mem_type, hid_t mem_space, hid_t file_space, hid_t xfer, void *buf),         \
      (d, mem_type, mem_space, file_space, xfer, buf))                                             \
    F(herr_t, H5Dclose, (hid_t d), (d))                                                            \
    F(htri_t, H5Aexists, (hid_t obj, const char *name), (obj, name))                               \
    F(hid_t, H5Aopen, (hid_t obj, const char *name, hid_t aapl), (obj, name, aapl))                \
    F(hid_t, H5Aget_type, (hid_t a), (a))                                                          \
    F(hid_t, H5Aget_space, (hid_t a), (a))                                                         \
    F(herr_t, H5Aread, (hid_t a, hid_t type, void *buf), (a, type, buf))                           \
    F(herr_t, H5Aclose, (hid_t a), (a))                                                            \
    F(H5T_class_t, H5Tget_class, (hid_t t), (t))                                                   \
    F(size_t, H5Tget_size, (hid_t t), (t))                                                         \
    F(H5T_sign_t, H5Tget_sign, (hid_t t), (t))                                                     \
    F(hid_t, H5Tget_super, (hid_t t), (t))                                                         \
    F(herr_t, H5Tclose, (hid_t t), (t))                                                            \
    F(H5S_class_t, H5Sget_simple_extent_type, (hid_t s), (s))                                      \
    F(int, H5Sget_simple_extent_ndims, (hid_t s), (s))                                             \
    F(int, H5Sget_simple_extent_dims, (hid_t s, hsize_t dims[], hsize_t maxdims[]),                \
      (s, dims, maxdims))                                                                          \
    F(hssize_t, H5Sget_simple_extent_npoints, (hid_t s), (s))                                      \
    F(herr_t, H5Sclose, (hid_t s), (s))

/* H5open, and the library's global ids ckptd reads (resolved as data). */
#define HANDWRITTEN(F, V)                                                                          \
    F(herr_t, H5open, (void), ())                                                                  \
    F(hid_t, H5P_CLS_FILE_ACCESS_ID_g, , )                                                         \
    F(hid_t, H5T_IEEE_F32LE_g, , )                                                                 \
    F(hid_t, H5T_NATIVE_LLONG_g, , )

CK_LAZY_LIBRARY(FUNCS, HANDWRITTEN)

hid_t H5P_CLS_FILE_ACCESS_ID_g = H5I_INVALID_HID;
hid_t H5T_IEEE_F32LE_g = H5I_INVALID_HID;
hid_t H5T_NATIVE_LLONG_g = H5I_INVALID_HID;

herr_t H5open(void)
{
    herr_t rc = ((herr_t(*)(void))CK_LAZY_ADDR(H5open))();
    if (rc >= 0) {
        H5P_CLS_FILE_ACCESS_ID_g = *(const hid_t *)CK_LAZY_ADDR(H5P_CLS_FILE_ACCESS_ID_g);
        H5T_IEEE_F32LE_g = *(const hid_t *)CK_LAZY_ADDR(H5T_IEEE_F32LE_g);
        H5T_NATIVE_LLONG_g = *(const hid_t *)CK_LAZY_ADDR(H5T_NATIVE_LLONG_g);
    }
    return rc;
}
