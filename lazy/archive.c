/* libarchive's functions that ckptd calls (writing bundles), loaded on first
 * use (see lazy.h). */
#include <archive.h>
#include <archive_entry.h>

#include "lazy/trampoline.h"

#define LAZY_LIB CK_LIB_ARCHIVE
#define LAZY_SYMBOLS ck_lazy_symbols_archive

#define FUNCS(F, V)                                                                                \
    F(struct archive *, archive_write_new, (void), ())                                             \
    F(int, archive_write_set_format_pax_restricted, (struct archive * a), (a))                     \
    F(int, archive_write_add_filter_zstd, (struct archive * a), (a))                               \
    F(int, archive_write_set_filter_option,                                                        \
      (struct archive * a, const char *m, const char *o, const char *v), (a, m, o, v))             \
    F(int, archive_write_set_bytes_in_last_block, (struct archive * a, int n), (a, n))             \
    F(int, archive_write_open_fd, (struct archive * a, int fd), (a, fd))                           \
    F(int, archive_write_header, (struct archive * a, struct archive_entry * e), (a, e))           \
    F(la_ssize_t, archive_write_data, (struct archive * a, const void *p, size_t n), (a, p, n))    \
    F(int, archive_write_close, (struct archive * a), (a))                                         \
    F(int, archive_write_free, (struct archive * a), (a))                                          \
    F(const char *, archive_error_string, (struct archive * a), (a))                               \
    F(struct archive_entry *, archive_entry_new, (void), ())                                       \
    V(archive_entry_free, (struct archive_entry * e), (e))                                         \
    V(archive_entry_set_pathname, (struct archive_entry * e, const char *p), (e, p))               \
    V(archive_entry_set_size, (struct archive_entry * e, la_int64_t n), (e, n))                    \
    V(archive_entry_set_mode, (struct archive_entry * e, __LA_MODE_T m), (e, m))                   \
    V(archive_entry_set_mtime, (struct archive_entry * e, time_t t, long ns), (e, t, ns))
#define HANDWRITTEN(F, V)

CK_LAZY_LIBRARY(FUNCS, HANDWRITTEN)
