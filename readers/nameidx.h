/* A sorted index of names for the readers, so that checking a name against
 * a file's tensors or variables costs a binary search instead of a scan: a
 * hostile file with a million tiny entries must not take hours. */
#ifndef CK_NAMEIDX_H
#define CK_NAMEIDX_H

#include "model/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ck_nameidx_entry {
    const char *name; /* borrowed */
    size_t index;     /* the caller's index of the named thing */
};

struct ck_nameidx {
    struct ck_nameidx_entry *e; /* owned */
    size_t n;
};

/* Indexes the tensors of s (names borrowed from s: rebuild after adding). */
int ck_nameidx_tensors(struct ck_nameidx *ix, const struct ck_tensor_set *s);
/* Indexes n names (borrowed); entry i has index i. */
int ck_nameidx_names(struct ck_nameidx *ix, const char *const *names, size_t n);
void ck_nameidx_release(struct ck_nameidx *ix);
/* The entry named name, or NULL. With duplicates, the one of lowest index. */
const struct ck_nameidx_entry *ck_nameidx_find(const struct ck_nameidx *ix, const char *name);
/* A name that appears more than once, or NULL. */
const char *ck_nameidx_duplicate(const struct ck_nameidx *ix);

/* Small blocks (names, string tables, small arrays) carved from 1 MiB blocks
 * of the set, so that a file of a million names does not become a million
 * regions of the set. Blocks live as long as the set. */
struct ck_pool {
    struct ck_tensor_set *s; /* borrowed */
    unsigned char *cur;
    size_t left;
};

void ck_pool_init(struct ck_pool *p, struct ck_tensor_set *s);
/* size bytes aligned to 8, zeroed; CK_ESIZE/CK_ENOMEM as ck_tensor_set_alloc. */
int ck_pool_alloc(struct ck_pool *p, uint64_t size, void **out);
/* A NUL-terminated copy of len bytes; NULL when out of memory (error set). */
char *ck_pool_strdup(struct ck_pool *p, const char *src, size_t len);

#endif
