#include "common/crc32c.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#define POLY 0x82f63b78u /* reflected Castagnoli polynomial */

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

uint32_t ck_crc32c_extend_sw(uint32_t crc, const void *data, size_t len)
{
    const unsigned char *p = data;
    pthread_once(&table_once, table_init);
    crc = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8); /* little-endian hosts only (Linux x86_64/arm64) */
        w ^= crc;
        crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
              table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
              table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint64_t crc_hw1(uint64_t c, const unsigned char *p, size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    while (len >= 32) {
        uint64_t w0, w1, w2, w3;
        memcpy(&w0, p, 8);
        memcpy(&w1, p + 8, 8);
        memcpy(&w2, p + 16, 8);
        memcpy(&w3, p + 24, 8);
        c = _mm_crc32_u64(c, w0);
        c = _mm_crc32_u64(c, w1);
        c = _mm_crc32_u64(c, w2);
        c = _mm_crc32_u64(c, w3);
        p += 32;
        len -= 32;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        len -= 8;
    }
    while (len--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return c;
}

/* One dependent chain of crc32 instructions runs at a third of their
 * throughput (latency 3 cycles, one issued per cycle), so long inputs are cut
 * into three consecutive blocks of BLOCK bytes summed at once, the two later
 * ones from a zero register, then joined: since the raw register is linear,
 * crc(A B) = shift(crc(A)) ^ crc0(B), where shift multiplies by x^(8 BLOCK)
 * mod P (the method of zlib's crc32_combine), four table lookups here. */
#define BLOCK 4096

static uint32_t shift_table[4][256]; /* shift_table[k][b]: shift(b << 8k) */
static pthread_once_t shift_once = PTHREAD_ONCE_INIT;

__attribute__((target("sse4.2"))) static void shift_init(void)
{
    static const unsigned char zeros[BLOCK];
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++)
            shift_table[k][b] = (uint32_t)crc_hw1((uint64_t)b << (8 * k), zeros, BLOCK);
}

static uint32_t shift(uint32_t c)
{
    return shift_table[0][c & 0xff] ^ shift_table[1][(c >> 8) & 0xff] ^
           shift_table[2][(c >> 16) & 0xff] ^ shift_table[3][c >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t c = ~crc;
    if (len >= 3 * BLOCK)
        pthread_once(&shift_once, shift_init);
    for (; len >= 3 * BLOCK; p += 3 * BLOCK, len -= 3 * BLOCK) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < BLOCK; i += 8) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p + BLOCK + i, 8);
            memcpy(&w2, p + 2 * BLOCK + i, 8);
            c = _mm_crc32_u64(c, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
        }
        c = shift(shift((uint32_t)c) ^ (uint32_t)c1) ^ (uint32_t)c2;
    }
    return ~(uint32_t)crc_hw1(c, p, len);
}

static bool have_hw(void)
{
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    }
    return cached == 1;
}
#endif

uint32_t ck_crc32c_extend(uint32_t crc, const void *data, size_t len)
{
#if defined(__x86_64__)
    if (have_hw())
        return crc_hw(crc, data, len);
#endif
    return ck_crc32c_extend_sw(crc, data, len);
}
