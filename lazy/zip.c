/* libzip's functions that ckptd calls (reading .nnp, .npz and SameDiff zips,
 * reading and writing .mldef archives),
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
    F(const char *, zip_file_strerror, (zip_file_t * f), (f))                                      \
    F(zip_source_t *, zip_source_function, (zip_t * z, zip_source_callback cb, void *ud),          \
      (z, cb, ud))                                                                                 \
    V(zip_source_free, (zip_source_t * s), (s))                                                    \
    F(zip_int64_t, zip_file_add, (zip_t * z, const char *name, zip_source_t *s, zip_flags_t fl),   \
      (z, name, s, fl))                                                                            \
    F(int, zip_set_file_compression, (zip_t * z, zip_uint64_t i, zip_int32_t m, zip_uint32_t l),   \
      (z, i, m, l))                                                                                \
    F(int, zip_close, (zip_t * z), (z))                                                            \
    F(zip_error_t *, zip_get_error, (zip_t * z), (z))                                              \
    F(int, zip_error_code_zip, (const zip_error_t *e), (e))
#define HANDWRITTEN(F, V)

CK_LAZY_LIBRARY(FUNCS, HANDWRITTEN)
