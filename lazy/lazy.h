/* Heavy libraries, loaded on first use.
 *
 * libcurl, libarchive, libzip, libhdf5 and snappy pull in about 9 MiB of
 * shared libraries (TLS, Kerberos, LDAP, ICU, libxml2, libstdc++, ...) that a
 * watcher which only registers checkpoints never calls. ckptd does not link
 * them. This folder defines the functions of theirs that ckptd calls, as small
 * trampolines: the first call dlopen()s the library (by the soname found at
 * build time), resolves every function ckptd uses, and jumps to the real one.
 * Callers include the libraries' own headers and call them as usual.
 *
 * Each user calls ck_lazy_load() at its entry point (opening a store, a zip,
 * an HDF5 file...) so that a missing library is an ordinary error naming it.
 * A trampoline called before that loads the library itself, and if it cannot,
 * prints why and aborts: that is a bug (a missing ck_lazy_load), not input. */
#ifndef CK_LAZY_H
#define CK_LAZY_H

#include <stdbool.h>

enum ck_lazy_lib {
    CK_LIB_CURL,    /* stores (S3, HTTP, SFTP) and webhooks */
    CK_LIB_ARCHIVE, /* bundles (tar + zstd) */
    CK_LIB_ZIP,     /* .nnp, .npz and SameDiff zips */
    CK_LIB_HDF5,    /* NNabla parameter.h5, only in the reader's child process */
    CK_LIB_SNAPPY,  /* Snappy-compressed blocks of TensorFlow bundles */
    CK_LIB_COUNT
};

/* Loads lib and resolves its functions, once per process (thread-safe).
 * 0, or CK_ERR with a message naming the library and the loader's reason. */
int ck_lazy_load(enum ck_lazy_lib lib);

/* Whether lib has been loaded in this process. */
bool ck_lazy_loaded(enum ck_lazy_lib lib);

/* The library's short name ("libcurl") and the soname it is loaded by. */
const char *ck_lazy_name(enum ck_lazy_lib lib);
const char *ck_lazy_soname(enum ck_lazy_lib lib);

#endif
