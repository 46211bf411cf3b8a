/* A small JSON writer over ck_buf. Strings that are not valid UTF-8 have
 * their bad bytes written as U+FFFD, so the output is always valid JSON. */
#ifndef CK_JSON_H
#define CK_JSON_H

#include "common/buf.h"

#include <stdbool.h>
#include <stdint.h>

#define CK_JSON_MAX_DEPTH 32

struct ck_json {
    struct ck_buf *out;  /* borrowed */
    bool pretty;
    int depth;
    bool need_comma[CK_JSON_MAX_DEPTH];
    bool after_key;
    int err;             /* first error; every call is a no-op after one */
};

void ck_json_init(struct ck_json *j, struct ck_buf *out, bool pretty);
void ck_json_begin_object(struct ck_json *j);
void ck_json_end_object(struct ck_json *j);
void ck_json_begin_array(struct ck_json *j);
void ck_json_end_array(struct ck_json *j);
void ck_json_key(struct ck_json *j, const char *key);
void ck_json_str(struct ck_json *j, const char *s);
void ck_json_strn(struct ck_json *j, const char *s, size_t len);
void ck_json_int(struct ck_json *j, int64_t v);
void ck_json_uint(struct ck_json *j, uint64_t v);
/* Non-finite values are written as null (JSON has no NaN). */
void ck_json_double(struct ck_json *j, double v);
void ck_json_bool(struct ck_json *j, bool v);
void ck_json_null(struct ck_json *j);
/* key + value in one call. */
void ck_json_kstr(struct ck_json *j, const char *key, const char *s);
void ck_json_kint(struct ck_json *j, const char *key, int64_t v);
void ck_json_kdouble(struct ck_json *j, const char *key, double v);
void ck_json_kbool(struct ck_json *j, const char *key, bool v);
/* Appends s as a quoted JSON string to b (no structure bookkeeping). */
int ck_json_escape(struct ck_buf *b, const char *s, size_t len);
/* 0 when well formed so far, else the first error code. */
int ck_json_error(const struct ck_json *j);

#endif
