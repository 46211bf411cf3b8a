/* What the .mldef writer (writers/mldef.c) and its reader and validator
 * (readers/mldef.c, readers/mldefcheck.c) share: the format's limits, the
 * portability rules for names, and the table of op parameters with their
 * manifest keys. docs/mldef.md is the reference. */
#ifndef CK_MLDEF_H
#define CK_MLDEF_H

#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>

#define CK_MLDEF_FORMAT_VERSION 1
#define CK_MLDEF_MANIFEST "manifest.json"
#define CK_MLDEF_SIGNATURE "SIGNATURE"
#define CK_MLDEF_MAX_COMPONENT 15 /* characters per path component */
#define CK_MLDEF_MAX_DEPTH 2      /* folders above a file */
#define CK_MLDEF_MAX_FILES 100
#define CK_MLDEF_MAX_MANIFEST (64u << 20)

/* Checks one archive path against the rules of docs/mldef.md section 1.
 * Returns NULL when it is fine, else the rule's id ("path.escape",
 * "name.charset", "name.length", "path.depth") and a reason in why. */
const char *ck_mldef_path_rule(const char *path, char *why, size_t whysz);

/* The parameters of struct ck_op_params as manifest keys ("Kernel", ...). */
enum ck_mldef_pkind {
    CK_MLDEF_P_INT2,   /* int64_t[2] */
    CK_MLDEF_P_INT4,   /* int64_t[4] */
    CK_MLDEF_P_INT,    /* int64_t */
    CK_MLDEF_P_AXIS,   /* int64_t, CK_AXIS_DEFAULT when unset */
    CK_MLDEF_P_BOOL,   /* bool */
    CK_MLDEF_P_FLOAT,  /* float */
    CK_MLDEF_P_SCALAR, /* float scalar with has_scalar */
    CK_MLDEF_P_BOUND,  /* float, omitted when infinite */
    CK_MLDEF_P_INTS,   /* ints/nints */
};

struct ck_mldef_param {
    const char *key;
    enum ck_mldef_pkind kind;
    size_t offset; /* into struct ck_op_params */
};

/* NULL-key terminated. */
extern const struct ck_mldef_param ck_mldef_params[];

/* Whether the parameter differs from ck_op_params_init's default (writers
 * write only those). */
bool ck_mldef_param_is_set(const struct ck_mldef_param *d, const struct ck_op_params *p);

/* Capability words for a layer running op (docs/mldef.md 2.5), into out. */
void ck_mldef_capabilities(enum ck_op op, size_t ninputs, bool has_scalar, bool output, char *out,
                           size_t outsz);

#endif
