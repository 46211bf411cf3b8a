/* A hash map from strings (borrowed) to indexes, for the checks that ask
 * "was this name seen before" once per entry of a hostile file: a list of
 * 100k layers or values must cost 100k look-ups, not 100k^2/2 compares.
 * The hash is seeded per process, so names crafted to collide in one run
 * do not collide in the next. */
#ifndef CK_STRSET_H
#define CK_STRSET_H

#include <stdbool.h>
#include <stddef.h>

struct ck_strset {
    const char **key; /* owned array; the strings are borrowed and must outlive the set */
    size_t *val;      /* owned */
    size_t cap, n;
};

#define CK_STRSET_INIT {0}

/* Adds key -> val unless key is there; *had (may be NULL) says whether it
 * was, and then its value is kept. CK_ENOMEM when the table cannot grow. */
int ck_strset_put(struct ck_strset *s, const char *key, size_t val, bool *had);
/* Whether key is there; its value in *val (may be NULL). */
bool ck_strset_get(const struct ck_strset *s, const char *key, size_t *val);
void ck_strset_release(struct ck_strset *s);

#endif
