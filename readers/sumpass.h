/* One read of a stored region for two checksums: the zip CRC-32 the file
 * keeps for the region (a stored .pt storage, an .npy member) and the
 * CRC-32C ckptd shows for each tensor whose data lies inside it (inspect),
 * taken piece by piece while the piece is still in cache. Two passes would
 * read a 1 GiB checkpoint from memory twice and fault its pages in twice
 * (each pass drops them behind itself to stay small). */
#ifndef CK_SUMPASS_H
#define CK_SUMPASS_H

#include "model/tensor.h"
#include "readers/reader.h"

#include <stddef.h>
#include <stdint.h>

struct ck_sumpass {
    const struct ck_tensor_set *s; /* borrowed */
    struct ck_tensor_crcs *crcs;   /* borrowed; NULL: the CRC-32 only */
    size_t *order;                 /* owned: tensors with data, by data address */
    size_t n;
    uint32_t *run;                 /* owned: running CRC-32C, by tensor index */
    const unsigned char *base;     /* s's file mapping (NULL: none): its pages are dropped */
    uint64_t blen;                 /* without a search of s's regions */
};

/* crcs (NULL, or s->ntensors entries) receives the tensors' CRC-32C. */
int ck_sumpass_init(struct ck_sumpass *sp, const struct ck_tensor_set *s,
                    struct ck_tensor_crcs *crcs);
void ck_sumpass_release(struct ck_sumpass *sp);
/* The CRC-32 of [p, p+len), a range of one of s's mappings, whose pages are
 * dropped behind the pass. Every tensor whose data lies wholly inside gets
 * its CRC-32C in crcs. */
uint32_t ck_sumpass_region(struct ck_sumpass *sp, const unsigned char *p, uint64_t len);

#endif
