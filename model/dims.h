/* Checked shape arithmetic: the one helper every shape computation of a
 * graph read from a file goes through (readers' shape folding, the canonical
 * shape rules, the engine's shapes). Dims are int64 and come from hostile
 * files: a product or a sum of them can overflow, which C leaves undefined.
 * A shape is usable only when the product of its non-zero dims fits in
 * int64: then every partial product, in any order and whatever the zeros,
 * fits too. */
#ifndef CK_MODEL_DIMS_H
#define CK_MODEL_DIMS_H

#include <stdbool.h>
#include <stdint.h>

/* a * b and a + b into *out; false on overflow (*out is then unspecified). */
static inline bool ck_dim_mul(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

static inline bool ck_dim_add(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* The product of dims[from, to) into *out; false when a dim is negative
 * (unknown) or the product of the non-zero ones overflows. */
static inline bool ck_dims_prod(const int64_t *dims, int from, int to, int64_t *out)
{
    int64_t nz = 1;
    bool zero = false;
    for (int i = from; i < to; i++) {
        if (dims[i] < 0)
            return false;
        if (!dims[i])
            zero = true;
        else if (!ck_dim_mul(nz, dims[i], &nz))
            return false;
    }
    *out = zero ? 0 : nz;
    return true;
}

/* A dim or index kept as a double (folded constants, a float tensor's
 * values) as an int64: saturating, since INT64_MAX (Slice's "to the end")
 * reads back as 2^63; false for a NaN or an infinity, which are no integer. */
static inline bool ck_dim_from_double(double d, int64_t *out)
{
    if (!__builtin_isfinite(d))
        return false;
    *out = d >= 0x1p63 ? INT64_MAX : d <= -0x1p63 ? INT64_MIN : (int64_t)d;
    return true;
}

#endif
