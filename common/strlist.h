/* A growable list of owned strings. */
#ifndef CK_STRLIST_H
#define CK_STRLIST_H

#include <stddef.h>

struct ck_strlist {
    char **items; /* owned, each owned */
    size_t n, cap;
};

/* Appends a copy of s. Callers that read names from outside bound n first. */
int ck_strlist_add(struct ck_strlist *l, const char *s);
void ck_strlist_release(struct ck_strlist *l);

#endif
