#include "common/strlist.h"
#include "common/error.h"

#include <stdlib.h>
#include <string.h>

int ck_strlist_add(struct ck_strlist *l, const char *s)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **p = realloc(l->items, cap * sizeof *p);
        if (!p)
            return ck_error(CK_ENOMEM, "out of memory");
        l->items = p;
        l->cap = cap;
    }
    if (!(l->items[l->n] = strdup(s)))
        return ck_error(CK_ENOMEM, "out of memory");
    l->n++;
    return 0;
}

void ck_strlist_release(struct ck_strlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->items[i]);
    free(l->items);
    l->items = NULL;
    l->n = l->cap = 0;
}
