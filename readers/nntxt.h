/* A strict parser for the protobuf text format as NNabla writes it
 * (network.nntxt): fields "name: value" and "name { ... }", repeated fields,
 * strings with C escapes (adjacent strings concatenate), numbers,
 * identifiers (enums, true/false), '#' comments, optional ';' or ','
 * separators and "name: [a, b]" lists. No schema: the result is a tree that
 * the caller walks. Limits: nesting depth, node count and text size, so a
 * hostile file fails with a clear error instead of exhausting the stack or
 * memory. Extensions ("[pkg.ext] { }") and Any are refused. */
#ifndef CK_NNTXT_H
#define CK_NNTXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CK_NNTXT_MAX_DEPTH 64
#define CK_NNTXT_MAX_NODES (1u << 22)
#define CK_NNTXT_MAX_TEXT ((size_t)256 << 20)

enum ck_nntxt_kind { CK_NNTXT_MSG, CK_NNTXT_STRING, CK_NNTXT_NUMBER, CK_NNTXT_IDENT };

struct ck_nntxt {
    char *name; /* owned: the field name ("" for the root) */
    enum ck_nntxt_kind kind;
    char *value;            /* owned: scalars' text (strings decoded, NUL-terminated) */
    size_t len;             /* value length (a decoded string may hold NUL bytes) */
    unsigned line;          /* where the field starts */
    struct ck_nntxt *child; /* owned: first field of a message */
    struct ck_nntxt *next;  /* owned: next field of the same message */
};

/* Parses text (len bytes, borrowed). file names the source in messages.
 * *out (owned by the caller, free with ck_nntxt_free) is the root message. */
int ck_nntxt_parse(const char *text, size_t len, const char *file, struct ck_nntxt **out);
void ck_nntxt_free(struct ck_nntxt *n);

/* The first field named name in msg (NULL when absent), and the next field
 * with the same name after n. */
const struct ck_nntxt *ck_nntxt_get(const struct ck_nntxt *msg, const char *name);
const struct ck_nntxt *ck_nntxt_next(const struct ck_nntxt *n);
/* How many fields named name msg has. */
size_t ck_nntxt_count(const struct ck_nntxt *msg, const char *name);
/* A scalar as an integer (decimal, 0x hex, octal with leading 0), a double,
 * a bool (true/false/t/f/1/0). CK_EFORMAT naming file and line otherwise. */
int ck_nntxt_int(const struct ck_nntxt *n, const char *file, int64_t *out);
int ck_nntxt_double(const struct ck_nntxt *n, const char *file, double *out);
int ck_nntxt_bool(const struct ck_nntxt *n, const char *file, bool *out);
/* A string field's value; CK_EFORMAT when n is not a string or holds a NUL. */
int ck_nntxt_str(const struct ck_nntxt *n, const char *file, const char **out);

#endif
