/* Packing for upload: a PMF tree as one zstd-compressed tar (libarchive,
 * multithreaded zstd), and a single file compressed with zstd. Both write
 * the safe way (temporary name, fsync, rename). */
#ifndef CK_STORE_BUNDLE_H
#define CK_STORE_BUNDLE_H

#include <stddef.h>
#include <stdint.h>

/* Packs every regular file and folder under root (sorted by path, the
 * agent's own .ckptd folder and temporary names left out, metadata.yaml
 * last) into out as a POSIX tar compressed with zstd at level, on threads
 * workers (0: one per core). *nfiles receives the number of files packed. */
int ck_bundle_write(const char *root, const char *out, int level, int threads, int *nfiles);
/* The same for the files named in only (relative to root; metadata.yaml, when
 * listed, last); folders are implied by the paths. */
int ck_bundle_write_files(const char *root, const char *const *only, size_t nonly, const char *out,
                          int level, int threads, int *nfiles);

/* Compresses src into out (zstd frame, content size recorded). orig_sha256
 * (65 bytes) receives the SHA-256 of src as read; *out_size the size of out. */
int ck_zstd_file(const char *src, const char *out, int level, int threads, char *orig_sha256,
                 uint64_t *out_size);

#endif
