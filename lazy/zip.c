/* libzip's functions that ckptd calls (reading .nnp, .npz and SameDiff zips),
 * loaded on first use (see lazy.h). */
#include <zip.h>

#include "lazy/trampoline.h"

#define LAZY_LIB CK_LIB_ZIP
#define LAZY_SYMBOLS ck_lazy_symbols_zip

#define FUNCS(F, V)                                                                                \
    F(zip_t *, zip_open, (const char *path, int flags, int *errorp), (path, flags, errorp))        \
    V(zip_discard, (zip_t * z), (z))                                                               \
    F(const char *, zip_strerror, (zip_t * z), (z))                                                \
    V(zip_error_init_with_code, (zip_error_t * e, int code), (e, code))                            \
    F(const char *, zip_error_strerror, (zip_error_t * e), (e))                                    \
    V(zip_error_fini, (zip_error_t * e), (e))                                                      \
    F(zip_int64_t, zip_get_num_entries, (zip_t * z, zip_flags_t fl), (z, fl))                      \
    F(const char *, zip_get_name, (zip_t * z, zip_uint64_t i, zip_flags_t fl), (z, i, fl))         \
    F(zip_int64_t, zip_name_locate, (zip_t * z, const char *name, zip_flags_t fl), (z, name, fl))  \
    V(zip_stat_init, (zip_stat_t * st), (st))                                                      \
    F(int, zip_stat_index, (zip_t * z, zip_uint64_t i, zip_flags_t fl, zip_stat_t * st),           \
      (z, i, fl, st))                                                                              \
    F(zip_file_t *, zip_fopen_index, (zip_t * z, zip_uint64_t i, zip_flags_t fl), (z, i, fl))      \
    F(zip_int64_t, zip_fread, (zip_file_t * f, void *buf, zip_uint64_t n), (f, buf, n))            \
    F(int, zip_fclose, (zip_file_t * f), (f))                                                      \
    F(const char *, zip_file_strerror, (zip_file_t * f), (f))
#define HANDWRITTEN(F, V)

CK_LAZY_LIBRARY(FUNCS, HANDWRITTEN)
