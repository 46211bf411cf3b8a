/* The zip half of writing an .mldef (docs/mldef.md sections 1 and 7): an
 * archive built at a temporary name beside the destination by the project's
 * zip writer (writers/zipapp), each entry written as it is added and streamed
 * (never a whole entry in memory; bytes a stream holds, such as a mapped
 * tensor, go to the file uncopied), each entry's SHA-256 taken as its bytes
 * pass when signing, an optional signed SIGNATURE last, then fsync and
 * rename. A kill -9 at any instant leaves the old archive (or none) under the
 * final name, plus at most a dot-named temporary.
 *
 * Used by the model writer (writers/mldef.c) and by `mldef -c`, which zips a
 * manifest.json and the files beside it. Entries are checked against the
 * name rules (model/mldef.h) as they are added. */
#ifndef CK_MLDEFZIP_H
#define CK_MLDEFZIP_H

#include "common/sign.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ck_mldef_zip;

/* An entry's bytes, in order. next hands the following ones: it either
 * copies up to len of them into buf or points at up to len bytes it holds
 * itself (which must stay valid until its next call), sets *out to where
 * they are and returns their count (0 at the end, negative ck error). */
struct ck_mldef_stream {
    uint64_t size; /* exact number of bytes the entry has */
    int64_t (*next)(void *ctx, void *buf, size_t len, const void **out);
    void *ctx; /* borrowed for the call that adds it */
};

/* Prepares path (the destination; "-" is not accepted: the caller copies a
 * finished temporary to stdout). level: 0 stored, 1..9 deflate, -1 stored.
 * key (borrowed, may be NULL) signs at finish. An existing path that is not
 * an .mldef (a zip with manifest.json at its root) is refused (CK_EEXIST). */
int ck_mldef_zip_open(const char *path, int level, const struct ck_sign_key *key,
                      struct ck_mldef_zip **out);
/* Each add writes the entry at once; after an error only free is left. */
/* Adds name with the bytes of data. */
int ck_mldef_zip_add_buffer(struct ck_mldef_zip *z, const char *name, const void *data, size_t len);
/* Adds name streamed from the file src (a file that changes while it is
 * read is an error naming it). */
int ck_mldef_zip_add_file(struct ck_mldef_zip *z, const char *name, const char *src);
/* Adds name streamed from s. */
int ck_mldef_zip_add_stream(struct ck_mldef_zip *z, const char *name,
                            const struct ck_mldef_stream *s);
/* Writes everything (SIGNATURE last when signing), fsyncs, renames into place. */
int ck_mldef_zip_finish(struct ck_mldef_zip *z);
/* Frees; removes the temporary when finish did not succeed. Accepts NULL. */
void ck_mldef_zip_free(struct ck_mldef_zip *z);
/* Bytes of the finished archive (after finish). */
/* The archive's check before it replaces its path (ck_zipapp precommit). */
void ck_mldef_zip_set_check(struct ck_mldef_zip *z, int (*check)(const char *tmp, void *arg),
                            void *arg);
uint64_t ck_mldef_zip_size(const struct ck_mldef_zip *z);

#endif
