#include "common/utf8.h"

#include <stdio.h>
#include <string.h>

size_t ck_utf8_char_len(const char *s, size_t left)
{
    const unsigned char *p = (const unsigned char *)s;
    if (left == 0)
        return 0;
    if (p[0] < 0x80)
        return 1;
    size_t n;
    unsigned cp;
    if ((p[0] & 0xE0) == 0xC0) {
        n = 2;
        cp = p[0] & 0x1F;
    } else if ((p[0] & 0xF0) == 0xE0) {
        n = 3;
        cp = p[0] & 0x0F;
    } else if ((p[0] & 0xF8) == 0xF0) {
        n = 4;
        cp = p[0] & 0x07;
    } else {
        return 0;
    }
    if (left < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

bool ck_utf8_is_valid(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        size_t n = ck_utf8_char_len(s + i, len - i);
        if (n == 0)
            return false;
        i += n;
    }
    return true;
}

void ck_utf8_sanitize(char *out, size_t outsz, const char *s)
{
    size_t len = strlen(s), o = 0;
    if (outsz == 0)
        return;
    for (size_t i = 0; i < len && o + 5 < outsz;) {
        size_t n = ck_utf8_char_len(s + i, len - i);
        if (n == 0 || (n == 1 && (unsigned char)s[i] < 0x20)) {
            o += (size_t)snprintf(out + o, outsz - o, "\\x%02x", (unsigned char)s[i]);
            i++;
        } else {
            if (o + n >= outsz)
                break;
            memcpy(out + o, s + i, n);
            o += n;
            i += n;
        }
    }
    out[o] = '\0';
}
