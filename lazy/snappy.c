/* Snappy's C interface, loaded on first use (see lazy.h). Snappy is C++: not
 * linking it also keeps libstdc++ out of the agent. */
#include <snappy-c.h>

#include "lazy/trampoline.h"

#define LAZY_LIB CK_LIB_SNAPPY
#define LAZY_SYMBOLS ck_lazy_symbols_snappy

#define FUNCS(F, V)                                                                                \
    F(snappy_status, snappy_uncompressed_length, (const char *in, size_t n, size_t *result),       \
      (in, n, result))                                                                             \
    F(snappy_status, snappy_uncompress, (const char *in, size_t n, char *out, size_t *out_n),      \
      (in, n, out, out_n))
#define HANDWRITTEN(F, V)

CK_LAZY_LIBRARY(FUNCS, HANDWRITTEN)
