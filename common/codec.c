#include "common/codec.h"

#include <nettle/base64.h>
#include <string.h>

int ck_codec_hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int ck_codec_unhex(unsigned char *out, size_t outsz, const char *hex)
{
    size_t n = strlen(hex);
    if (n % 2 || n / 2 > outsz)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = ck_codec_hexval(hex[2 * i]), lo = ck_codec_hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return (int)(n / 2);
}

void ck_codec_base64(char *out, const unsigned char *in, size_t len)
{
    base64_encode_raw(out, len, in);
    out[BASE64_ENCODE_RAW_LENGTH(len)] = '\0';
}
