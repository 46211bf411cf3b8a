/* Sorted name lookups; see nameidx.h. */
#include "readers/nameidx.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>

static int cmp(const void *x, const void *y)
{
    const struct ck_nameidx_entry *a = x, *b = y;
    int c = strcmp(a->name, b->name);
    if (c)
        return c;
    return a->index < b->index ? -1 : a->index > b->index;
}

static int alloc(struct ck_nameidx *ix, size_t n)
{
    ix->n = 0;
    ix->e = calloc(n ? n : 1, sizeof(*ix->e));
    return ix->e ? 0 : ck_error(CK_ENOMEM, "out of memory indexing %zu names", n);
}

static void sort(struct ck_nameidx *ix)
{
    if (ix->n)
        qsort(ix->e, ix->n, sizeof(*ix->e), cmp);
}

int ck_nameidx_tensors(struct ck_nameidx *ix, const struct ck_tensor_set *s)
{
    int err;
    if ((err = alloc(ix, s->ntensors)) < 0)
        return err;
    for (size_t i = 0; i < s->ntensors; i++)
        ix->e[ix->n++] = (struct ck_nameidx_entry){s->tensors[i].name, i};
    sort(ix);
    return 0;
}

int ck_nameidx_names(struct ck_nameidx *ix, const char *const *names, size_t n)
{
    int err;
    if ((err = alloc(ix, n)) < 0)
        return err;
    for (size_t i = 0; i < n; i++)
        ix->e[ix->n++] = (struct ck_nameidx_entry){names[i], i};
    sort(ix);
    return 0;
}

void ck_nameidx_release(struct ck_nameidx *ix)
{
    free(ix->e);
    ix->e = NULL;
    ix->n = 0;
}

const struct ck_nameidx_entry *ck_nameidx_find(const struct ck_nameidx *ix, const char *name)
{
    size_t lo = 0, hi = ix->n;
    while (lo < hi) { /* the first entry whose name is >= name */
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(ix->e[mid].name, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < ix->n && !strcmp(ix->e[lo].name, name) ? &ix->e[lo] : NULL;
}

const char *ck_nameidx_duplicate(const struct ck_nameidx *ix)
{
    for (size_t i = 1; i < ix->n; i++)
        if (!strcmp(ix->e[i - 1].name, ix->e[i].name))
            return ix->e[i].name;
    return NULL;
}

#define POOL_BLOCK ((size_t)1 << 20)

void ck_pool_init(struct ck_pool *p, struct ck_tensor_set *s)
{
    p->s = s;
    p->cur = NULL;
    p->left = 0;
}

int ck_pool_alloc(struct ck_pool *p, uint64_t size, void **out)
{
    uint64_t need = (size + 7) & ~(uint64_t)7;
    int err;
    if (size > POOL_BLOCK / 4) /* big: a block of its own */
        return ck_tensor_set_alloc(p->s, size, out);
    if (need > p->left) {
        void *b;
        if ((err = ck_tensor_set_alloc(p->s, POOL_BLOCK, &b)) < 0)
            return err;
        p->cur = b;
        p->left = POOL_BLOCK;
    }
    *out = p->cur;
    p->cur += need;
    p->left -= (size_t)need;
    return 0;
}

char *ck_pool_strdup(struct ck_pool *p, const char *src, size_t len)
{
    void *d;
    if (len == SIZE_MAX || ck_pool_alloc(p, (uint64_t)len + 1, &d) < 0)
        return NULL;
    if (len)
        memcpy(d, src, len);
    ((char *)d)[len] = 0;
    return d;
}
