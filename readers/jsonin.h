/* A small strict JSON parser (RFC 8259) for headers inside checkpoint files
 * (safetensors). Strict: no comments, no trailing commas, no leading zeros,
 * no control characters or invalid UTF-8 in strings, no lone surrogates, no
 * duplicate keys, nesting at most CK_JIN_MAX_DEPTH, nothing but whitespace
 * after the value. The whole tree lives in one document freed at once. */
#ifndef CK_JSONIN_H
#define CK_JSONIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CK_JIN_MAX_DEPTH 64

enum ck_jin_type {
    CK_JIN_NULL,
    CK_JIN_BOOL,
    CK_JIN_NUMBER,
    CK_JIN_STRING,
    CK_JIN_ARRAY,
    CK_JIN_OBJECT
};

struct ck_jin {
    enum ck_jin_type type;
    const char *key; /* member of an object: its key (decoded, NUL-terminated) */
    size_t keylen;
    const char *str; /* STRING: decoded, NUL-terminated; NUMBER: the literal text */
    size_t len;
    bool b;               /* BOOL */
    struct ck_jin *first; /* ARRAY/OBJECT: first child */
    struct ck_jin *next;  /* next sibling */
    size_t n;             /* ARRAY/OBJECT: number of children */
};

struct ck_jin_doc;

/* Parses text[0..len) (need not be NUL-terminated). On error the message
 * says what and at which byte offset; the caller prefixes the file name. */
int ck_jin_parse(const char *text, size_t len, struct ck_jin_doc **doc, const struct ck_jin **root);
void ck_jin_free(struct ck_jin_doc *doc);

/* Member of an object by key, NULL when absent (or v is not an object). */
const struct ck_jin *ck_jin_get(const struct ck_jin *v, const char *key);
/* A NUMBER that is a non-negative integer (no fraction, no exponent) fitting
 * 64 bits; false otherwise. */
bool ck_jin_uint(const struct ck_jin *v, uint64_t *out);

#endif
