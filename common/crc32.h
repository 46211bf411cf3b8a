/* CRC-32 (zlib's), fast on x86-64 with PCLMULQDQ; see crc32.c. */
#ifndef CK_CRC32_H
#define CK_CRC32_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CRC-32 of data appended to a stream whose CRC so far is crc (0 to start). */
uint32_t ck_crc32_extend(uint32_t crc, const void *data, size_t len);

#endif
