/* The files of an .mldef for the validator and loader: the entries of the
 * zip, or the files beside a manifest.json. Private to readers/mldef*.c. */
#ifndef CK_MLDEFSRC_H
#define CK_MLDEFSRC_H

#include "common/strset.h"
#include "model/tensor.h"

#include <stdbool.h>
#include <stdint.h>

struct zip;

struct ck_mldef_src {
    const char *path; /* borrowed: the .mldef or the manifest.json */
    bool is_zip;
    struct zip *z;   /* owned when is_zip */
    char dir[4096];  /* the manifest's folder when !is_zip */
    char **names;    /* owned: zip entries (files, not folders), in archive order */
    uint64_t *index; /* their zip indexes */
    size_t n;
    struct ck_strset byname; /* names -> their first position in names */
};

/* Opens path; CK_EFORMAT with a message when a zip cannot be opened. */
int ck_mldef_src_open(struct ck_mldef_src *s, const char *path);
void ck_mldef_src_close(struct ck_mldef_src *s);
/* Whether name exists as a regular file / entry; its uncompressed size. */
bool ck_mldef_src_size(const struct ck_mldef_src *s, const char *name, uint64_t *size);
/* Reads name whole into memory owned by set (a zip entry) or maps it (a
 * file beside the manifest); at most max bytes. */
int ck_mldef_src_read(const struct ck_mldef_src *s, const char *name, uint64_t max,
                      struct ck_tensor_set *set, const unsigned char **data, uint64_t *len);
/* SHA-256 (hex) of name, streamed. */
int ck_mldef_src_sha256(const struct ck_mldef_src *s, const char *name, char hex[65]);

#endif
