/* A small hash map from relative paths to records the caller defines. The
 * records embed struct ck_pathmap_entry as their first member; the map owns
 * the key of each entry and frees the record with the free function given
 * to ck_pathmap_init (NULL: free()). Used by the watcher's settle tracker
 * and its polling snapshot. */
#ifndef CK_PATHMAP_H
#define CK_PATHMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ck_pathmap_entry {
    char *key; /* owned by the map */
    uint64_t hash;
    struct ck_pathmap_entry *next;
};

struct ck_pathmap {
    struct ck_pathmap_entry **buckets;
    size_t nbuckets, n;
    void (*free_fn)(void *);
};

void ck_pathmap_init(struct ck_pathmap *m, void (*free_fn)(void *));
void ck_pathmap_release(struct ck_pathmap *m);
void *ck_pathmap_get(const struct ck_pathmap *m, const char *key);
/* Finds key or inserts a zeroed record of size bytes; *created says which. */
int ck_pathmap_put(struct ck_pathmap *m, const char *key, size_t size, void **out, bool *created);
/* Removes and frees the record of key (no-op when absent). */
void ck_pathmap_del(struct ck_pathmap *m, const char *key);
/* Removes key and every key below the folder key ("a" removes "a" and "a/..."). */
size_t ck_pathmap_del_tree(struct ck_pathmap *m, const char *key);

/* Iteration that tolerates removing the current entry:
 *   struct ck_pathmap_iter it; ck_pathmap_iter_init(&it, m);
 *   while ((e = ck_pathmap_next(&it))) ... */
struct ck_pathmap_iter {
    const struct ck_pathmap *m;
    size_t bucket;
    struct ck_pathmap_entry *next;
};
void ck_pathmap_iter_init(struct ck_pathmap_iter *it, const struct ck_pathmap *m);
void *ck_pathmap_next(struct ck_pathmap_iter *it);

#endif
