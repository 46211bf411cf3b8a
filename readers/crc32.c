/* CRC-32 (IEEE 802.3, zlib's crc32) of stored zip members, at the speed of
 * reading the page cache: zlib's table code runs at about 1 GB/s, so a
 * 1 GiB .pt checked with it would take several times cat's time. With
 * PCLMULQDQ the data is folded 64 bytes at a time with carry-less products
 * (Gopal et al., "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ Instruction", Intel, 2009; the constants are x^(k) mod P(x)
 * for the bit-reflected polynomial 0x1db710641) and reduced to 32 bits with
 * Barrett's method; the head shorter than a block and the tail go through
 * zlib. Checked against zlib on every length from 0 to 4096 in the tests. */
#include "readers/crc32.h"

#include <zlib.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define FOLD(x, k, y)                                                                              \
    _mm_xor_si128(                                                                                 \
        _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), y)

/* crc is the raw (not inverted) register; len >= 64 and a multiple of 16. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t fold(uint32_t crc, const unsigned char *p,
                                                              size_t len)
{
    const __m128i k12 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k34 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i a = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)crc));
    __m128i b = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(p + 48));
    for (p += 64, len -= 64; len >= 64; p += 64, len -= 64) {
        a = FOLD(a, k12, _mm_loadu_si128((const __m128i *)p));
        b = FOLD(b, k12, _mm_loadu_si128((const __m128i *)(p + 16)));
        c = FOLD(c, k12, _mm_loadu_si128((const __m128i *)(p + 32)));
        d = FOLD(d, k12, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    a = FOLD(a, k34, b);
    a = FOLD(a, k34, c);
    a = FOLD(a, k34, d);
    for (; len >= 16; p += 16, len -= 16)
        a = FOLD(a, k34, _mm_loadu_si128((const __m128i *)p));
    /* 128 bits to 64, then Barrett to 32 */
    __m128i t = _mm_clmulepi64_si128(a, k34, 0x10);
    a = _mm_xor_si128(_mm_srli_si128(a, 8), t);
    t = _mm_srli_si128(a, 4);
    a = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(a, low32), k5, 0x00), t);
    t = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(a, low32), poly, 0x10), low32);
    a = _mm_xor_si128(a, _mm_clmulepi64_si128(t, poly, 0x00));
    return (uint32_t)_mm_extract_epi32(a, 1);
}

static bool has_pclmul(void)
{
    static int cached = -1;
    if (cached < 0)
        cached = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    return cached;
}
#endif

uint32_t ck_crc32_extend(uint32_t crc, const void *data, size_t len)
{
    const unsigned char *p = data;
#if defined(__x86_64__)
    if (len >= 128 && has_pclmul()) {
        size_t n = len & ~(size_t)15;
        crc = ~fold(~crc, p, n);
        p += n;
        len -= n;
    }
#endif
    while (len) {
        uInt n = len > (1u << 30) ? 1u << 30 : (uInt)len;
        crc = (uint32_t)crc32(crc, p, n);
        p += n;
        len -= n;
    }
    return crc;
}
