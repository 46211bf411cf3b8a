#include "readers/sumpass.h"

#include "common/crc32c.h"
#include "common/error.h"
#include "common/crc32.h"

#include <stdlib.h>
#include <string.h>

/* Pages are dropped 8 MiB at a time; both sums run on 256 KiB pieces, which
 * stay in the core's cache between the first sum and the second. */
#define DROP_BYTES ((uint64_t)8 << 20)
#define PIECE_BYTES ((uint64_t)256 << 10)

static int by_address(const void *a, const void *b, void *set)
{
    const struct ck_tensor_set *s = set;
    uintptr_t x = (uintptr_t)s->tensors[*(const size_t *)a].data;
    uintptr_t y = (uintptr_t)s->tensors[*(const size_t *)b].data;
    return x < y ? -1 : x > y;
}

int ck_sumpass_init(struct ck_sumpass *sp, const struct ck_tensor_set *s,
                    struct ck_tensor_crcs *crcs)
{
    memset(sp, 0, sizeof *sp);
    sp->s = s;
    sp->crcs = crcs;
    if (ck_tensor_set_first_mapping(s, &sp->base, &sp->blen) < 0) {
        sp->base = NULL;
        sp->blen = 0;
        ck_error_clear();
    }
    if (!crcs || !s->ntensors)
        return 0;
    if (!(sp->order = malloc(s->ntensors * sizeof *sp->order)) ||
        !(sp->run = calloc(s->ntensors, sizeof *sp->run))) {
        ck_sumpass_release(sp);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < s->ntensors; i++)
        if (s->tensors[i].data && s->tensors[i].dtype != CK_DT_STRING)
            sp->order[sp->n++] = i;
    qsort_r(sp->order, sp->n, sizeof *sp->order, by_address, (void *)s);
    return 0;
}

void ck_sumpass_release(struct ck_sumpass *sp)
{
    free(sp->order);
    free(sp->run);
    memset(sp, 0, sizeof *sp);
}

/* The first position in order whose data starts at or after p. */
static size_t lower_bound(const struct ck_sumpass *sp, uintptr_t p)
{
    size_t lo = 0, hi = sp->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)sp->s->tensors[sp->order[mid]].data < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

uint32_t ck_sumpass_region(struct ck_sumpass *sp, const unsigned char *p, uint64_t len)
{
    const uintptr_t start = (uintptr_t)p, end = start + len;
    size_t lo = 0, hi = 0;
    uint32_t crc = 0;
    if (sp->crcs) {
        /* Tensors wholly inside; views of one storage may overlap each other. */
        lo = lower_bound(sp, start);
        hi = lower_bound(sp, end);
        for (size_t k = lo; k < hi; k++)
            sp->run[sp->order[k]] = 0;
    }
    for (uint64_t at = 0; at < len;) {
        uint64_t drop = len - at < DROP_BYTES ? len - at : DROP_BYTES;
        for (uint64_t q = at; q < at + drop;) {
            uint64_t n = at + drop - q < PIECE_BYTES ? at + drop - q : PIECE_BYTES;
            const uintptr_t a = start + q, b = a + n;
            crc = ck_crc32_extend(crc, p + q, (size_t)n);
            for (size_t k = lo; k < hi; k++) {
                const struct ck_tensor *t = &sp->s->tensors[sp->order[k]];
                uintptr_t ts = (uintptr_t)t->data, te = ts + t->nbytes;
                uintptr_t x = ts > a ? ts : a, y = te < b ? te : b;
                if (te <= end && x < y)
                    sp->run[sp->order[k]] =
                        ck_crc32c_extend(sp->run[sp->order[k]], (const void *)x, y - x);
            }
            q += n;
        }
        if (sp->base && p + at >= sp->base && p + at + drop <= sp->base + sp->blen)
            ck_tensor_drop_range(p + at, drop);
        else
            ck_tensor_set_drop_pages(sp->s, p + at, drop);
        at += drop;
    }
    for (size_t k = lo; k < hi; k++) {
        const struct ck_tensor *t = &sp->s->tensors[sp->order[k]];
        if ((uintptr_t)t->data + t->nbytes <= end) {
            sp->crcs->crc32c[sp->order[k]] = sp->run[sp->order[k]];
            sp->crcs->known[sp->order[k]] = true;
        }
    }
    return crc;
}
