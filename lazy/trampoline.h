/* Internal to lazy/: how a library file writes its trampolines from one list.
 *
 * A library file defines LAZY_LIB (its enum value) and LAZY_SYMBOLS (the name
 * of its symbol table, which lazy.c reads), includes the library's own header
 * (so the compiler checks every prototype below against it), lists the
 * functions ckptd calls, and expands CK_LAZY_LIBRARY:
 *
 *   #define FUNCS(F, V)                                                       \
 *       F(zip_t *, zip_open, (const char *p, int f, int *e), (p, f, e))        \
 *       V(zip_discard, (zip_t *z), (z))          <- V: returns void
 *   #define HANDWRITTEN(F, V)
 *   CK_LAZY_LIBRARY(FUNCS, HANDWRITTEN)
 *
 * The second list holds functions whose trampolines are written by hand (the
 * variadic ones): they are resolved with the others, and the hand-written
 * trampoline finds its function with CK_LAZY_ADDR(name). */
#ifndef CK_LAZY_TRAMPOLINE_H
#define CK_LAZY_TRAMPOLINE_H

#include "lazy/lazy.h"

#include <stdatomic.h>
#include <stddef.h>

struct ck_lazy_symbols {
    const char *const *names; /* the functions to resolve, in index order */
    void **addr;              /* filled by the loader before ck_lazy_ready is set */
    size_t n;
};

/* Defined by lazy.c: set (release) once all of a library's symbols are resolved. */
extern atomic_bool ck_lazy_ready[CK_LIB_COUNT];
/* Loads lib or aborts with the reason (see lazy.h). */
void ck_lazy_need(enum ck_lazy_lib lib);

static inline void *ck_lazy_get(enum ck_lazy_lib lib, void *const *table, size_t index)
{
    if (!atomic_load_explicit(&ck_lazy_ready[lib], memory_order_acquire))
        ck_lazy_need(lib);
    return table[index];
}

#define CK_LAZY_INDEX(name) ck_lazy_idx_##name
#define CK_LAZY_ADDR(name) ck_lazy_get(LAZY_LIB, ck_lazy_table, CK_LAZY_INDEX(name))

#define CK_LAZY_ENUM_F(ret, name, params, args) CK_LAZY_INDEX(name),
#define CK_LAZY_ENUM_V(name, params, args) CK_LAZY_INDEX(name),
#define CK_LAZY_NAME_F(ret, name, params, args) #name,
#define CK_LAZY_NAME_V(name, params, args) #name,
#define CK_LAZY_TRAMP_F(ret, name, params, args)                                                   \
    ret name params                                                                                \
    {                                                                                              \
        return ((ret(*) params)CK_LAZY_ADDR(name))args;                                            \
    }
#define CK_LAZY_TRAMP_V(name, params, args)                                                        \
    void name params                                                                               \
    {                                                                                              \
        ((void(*) params)CK_LAZY_ADDR(name)) args;                                                 \
    }

/* FUNCS get generated trampolines; HANDWRITTEN (same F form) are only resolved,
 * their trampolines are written by hand after this. */
#define CK_LAZY_LIBRARY(FUNCS, HANDWRITTEN)                                                        \
    enum {                                                                                         \
        FUNCS(CK_LAZY_ENUM_F, CK_LAZY_ENUM_V) HANDWRITTEN(CK_LAZY_ENUM_F, CK_LAZY_ENUM_V)          \
            ck_lazy_count                                                                          \
    };                                                                                             \
    static const char *const ck_lazy_names[] = {FUNCS(CK_LAZY_NAME_F, CK_LAZY_NAME_V)              \
                                                    HANDWRITTEN(CK_LAZY_NAME_F, CK_LAZY_NAME_V)};  \
    static void *ck_lazy_table[ck_lazy_count];                                                     \
    const struct ck_lazy_symbols LAZY_SYMBOLS = {ck_lazy_names, ck_lazy_table, ck_lazy_count};     \
    FUNCS(CK_LAZY_TRAMP_F, CK_LAZY_TRAMP_V)

#endif
