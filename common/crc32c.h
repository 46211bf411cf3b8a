/* CRC-32C (Castagnoli), as TensorFlow and LevelDB store it. Debian 12 ships
 * no C library for it, so it is here: SSE4.2 crc32 instructions when the CPU
 * has them (checked once at run time), a slicing-by-8 table otherwise. */
#ifndef CK_CRC32C_H
#define CK_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of data appended to a stream whose CRC so far is crc (0 to start). */
uint32_t ck_crc32c_extend(uint32_t crc, const void *data, size_t len);
static inline uint32_t ck_crc32c(const void *data, size_t len)
{
    return ck_crc32c_extend(0, data, len);
}
/* The same with the portable table only (tests compare both paths). */
uint32_t ck_crc32c_extend_sw(uint32_t crc, const void *data, size_t len);

/* LevelDB/TF store CRCs "masked" so that a CRC of data holding CRCs stays useful. */
static inline uint32_t ck_crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
static inline uint32_t ck_crc32c_unmask(uint32_t masked)
{
    uint32_t rot = masked - 0xa282ead8u;
    return (rot >> 17) | (rot << 15);
}

#endif
