/* Open addressing with linear probing, kept under half full. */
#include "common/strset.h"
#include "common/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static uint64_t seed(void)
{
    static uint64_t s;
    static int done;
    if (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
        uint64_t v = 0;
        if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v)
            v = (uint64_t)(uintptr_t)&v ^ 0x9e3779b97f4a7c15u;
        __atomic_store_n(&s, v | 1, __ATOMIC_RELAXED);
        __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&s, __ATOMIC_RELAXED);
}

static size_t hash(const char *k)
{
    uint64_t h = 0xcbf29ce484222325u ^ seed();
    for (const unsigned char *p = (const unsigned char *)k; *p; p++)
        h = (h ^ *p) * 0x100000001b3u;
    h ^= h >> 31; /* the low bits pick the slot: mix the high ones in */
    h *= 0x7fb5d329728ea185u;
    h ^= h >> 27;
    return (size_t)h;
}

static size_t slot(const struct ck_strset *s, const char *key)
{
    size_t i = hash(key) & (s->cap - 1);
    while (s->key[i] && strcmp(s->key[i], key) != 0)
        i = (i + 1) & (s->cap - 1);
    return i;
}

static int grow(struct ck_strset *s)
{
    size_t cap = s->cap ? 2 * s->cap : 64;
    struct ck_strset t = {calloc(cap, sizeof *t.key), calloc(cap, sizeof *t.val), cap, s->n};
    if (!t.key || !t.val) {
        free(t.key);
        free(t.val);
        return ck_error(CK_ENOMEM, "out of memory for a table of %zu names", cap);
    }
    for (size_t i = 0; i < s->cap; i++)
        if (s->key[i]) {
            size_t j = slot(&t, s->key[i]);
            t.key[j] = s->key[i];
            t.val[j] = s->val[i];
        }
    free(s->key);
    free(s->val);
    *s = t;
    return 0;
}

int ck_strset_put(struct ck_strset *s, const char *key, size_t val, bool *had)
{
    int err;
    if (2 * (s->n + 1) > s->cap && (err = grow(s)) < 0)
        return err;
    size_t i = slot(s, key);
    if (had)
        *had = s->key[i] != NULL;
    if (!s->key[i]) {
        s->key[i] = key;
        s->val[i] = val;
        s->n++;
    }
    return 0;
}

bool ck_strset_get(const struct ck_strset *s, const char *key, size_t *val)
{
    if (!s->n)
        return false;
    size_t i = slot(s, key);
    if (!s->key[i])
        return false;
    if (val)
        *val = s->val[i];
    return true;
}

void ck_strset_release(struct ck_strset *s)
{
    free(s->key);
    free(s->val);
    memset(s, 0, sizeof *s);
}
