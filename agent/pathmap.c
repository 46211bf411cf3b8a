#include "agent/pathmap.h"
#include "common/error.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

void ck_pathmap_init(struct ck_pathmap *m, void (*free_fn)(void *))
{
    memset(m, 0, sizeof *m);
    m->free_fn = free_fn ? free_fn : free;
}

static void free_entry(struct ck_pathmap *m, struct ck_pathmap_entry *e)
{
    free(e->key);
    m->free_fn(e);
}

void ck_pathmap_release(struct ck_pathmap *m)
{
    for (size_t b = 0; b < m->nbuckets; b++)
        for (struct ck_pathmap_entry *e = m->buckets[b], *next; e; e = next) {
            next = e->next;
            free_entry(m, e);
        }
    free(m->buckets);
    m->buckets = NULL;
    m->nbuckets = m->n = 0;
}

void *ck_pathmap_get(const struct ck_pathmap *m, const char *key)
{
    if (!m->nbuckets)
        return NULL;
    uint64_t h = hash_str(key);
    for (struct ck_pathmap_entry *e = m->buckets[h % m->nbuckets]; e; e = e->next)
        if (e->hash == h && !strcmp(e->key, key))
            return e;
    return NULL;
}

static int grow(struct ck_pathmap *m)
{
    size_t nb = m->nbuckets ? m->nbuckets * 2 : 64;
    struct ck_pathmap_entry **b = calloc(nb, sizeof *b);
    if (!b)
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < m->nbuckets; i++)
        for (struct ck_pathmap_entry *e = m->buckets[i], *next; e; e = next) {
            next = e->next;
            e->next = b[e->hash % nb];
            b[e->hash % nb] = e;
        }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = nb;
    return 0;
}

int ck_pathmap_put(struct ck_pathmap *m, const char *key, size_t size, void **out, bool *created)
{
    struct ck_pathmap_entry *e = ck_pathmap_get(m, key);
    if (created)
        *created = !e;
    if (e) {
        *out = e;
        return 0;
    }
    int err;
    if (m->n >= m->nbuckets && (err = grow(m)) < 0)
        return err;
    e = calloc(1, size);
    if (!e || !(e->key = strdup(key))) {
        free(e);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    e->hash = hash_str(key);
    e->next = m->buckets[e->hash % m->nbuckets];
    m->buckets[e->hash % m->nbuckets] = e;
    m->n++;
    *out = e;
    return 0;
}

static bool unlink_entry(struct ck_pathmap *m, struct ck_pathmap_entry *victim)
{
    for (struct ck_pathmap_entry **p = &m->buckets[victim->hash % m->nbuckets]; *p; p = &(*p)->next)
        if (*p == victim) {
            *p = victim->next;
            m->n--;
            return true;
        }
    return false;
}

void ck_pathmap_del(struct ck_pathmap *m, const char *key)
{
    struct ck_pathmap_entry *e = ck_pathmap_get(m, key);
    if (e && unlink_entry(m, e))
        free_entry(m, e);
}

size_t ck_pathmap_del_tree(struct ck_pathmap *m, const char *key)
{
    size_t n = strlen(key), removed = 0;
    struct ck_pathmap_iter it;
    struct ck_pathmap_entry *e;
    ck_pathmap_iter_init(&it, m);
    while ((e = ck_pathmap_next(&it)))
        if (!strncmp(e->key, key, n) && (e->key[n] == '\0' || e->key[n] == '/' || n == 0)) {
            unlink_entry(m, e);
            free_entry(m, e);
            removed++;
        }
    return removed;
}

void ck_pathmap_iter_init(struct ck_pathmap_iter *it, const struct ck_pathmap *m)
{
    it->m = m;
    it->bucket = 0;
    it->next = m->nbuckets ? m->buckets[0] : NULL;
}

void *ck_pathmap_next(struct ck_pathmap_iter *it)
{
    while (!it->next) {
        if (++it->bucket >= it->m->nbuckets)
            return NULL;
        it->next = it->m->buckets[it->bucket];
    }
    struct ck_pathmap_entry *e = it->next;
    it->next = e->next;
    return e;
}
