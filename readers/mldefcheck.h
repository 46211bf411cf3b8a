/* The .mldef validator and loader (docs/mldef.md): checks a .mldef archive,
 * or a manifest.json outside a zip against the files beside it, rule by rule,
 * collecting EVERY violation with where it is (a key path such as
 * "Layers[3].StartIndex", or a file name), and verifies SIGNATURE. The same
 * walk builds the canonical model (model/model.h) when asked and nothing was
 * broken, so the reader (readers/mldef.c) never trusts what the validator
 * did not check. Input is hostile: entry names that could escape a folder,
 * duplicate names, sizes that do not match, manifests of any shape. */
#ifndef CK_MLDEFCHECK_H
#define CK_MLDEFCHECK_H

#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>

struct ck_mldef_violation {
    char *rule;  /* owned: "layer.range", ... (docs/mldef.md) */
    char *where; /* owned: key path or file name */
    char *msg;   /* owned */
};

struct ck_mldef_report {
    struct ck_mldef_violation *v; /* owned */
    size_t n, cap;
    size_t dropped; /* violations past the first 1000, counted only */
    bool is_zip;
    size_t nfiles; /* files in the archive (or the manifest's set) */
    size_t nlayers;
    bool has_signature;
    bool signature_ok; /* digests and Ed25519 signature all good */
    char signer[65];   /* hex public key on the SIGNATURE line, "" when none */
};

struct ck_mldef_check_opts {
    const unsigned char *trusted_pub; /* 32 bytes, or NULL: any signer is reported */
    bool require_signature;
};

/* Checks path (a .mldef, or a manifest.json). Returns 0 when the check ran
 * (r lists what is broken; r->n == 0 means valid), negative only when it
 * could not run (out of memory). When model is not NULL and nothing is
 * broken, *model receives the model (owned by the caller). */
int ck_mldef_check(const char *path, const struct ck_mldef_check_opts *o, struct ck_mldef_report *r,
                   struct ck_model **model);
void ck_mldef_report_release(struct ck_mldef_report *r);

/* The files a valid manifest.json outside a zip names (data files, tests,
 * license), in manifest order, as archive names (owned array of owned
 * strings). For `mldef -c`. */
int ck_mldef_manifest_files(const char *manifest, char ***names, size_t *n);

#endif
