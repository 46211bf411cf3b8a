/* Hex and base64: the encodings several folders parse or produce (stores'
 * request signing, readers' text formats). */
#ifndef CK_CODEC_H
#define CK_CODEC_H

#include <stddef.h>

/* The value of one hex digit (either case), or -1. */
int ck_codec_hexval(char c);
/* Hex digits to bytes; the number of bytes, or -1 on a bad digit, an odd
 * length or more than outsz bytes. */
int ck_codec_unhex(unsigned char *out, size_t outsz, const char *hex);
/* Standard base64 of len bytes into out (4*ceil(len/3)+1 bytes). */
void ck_codec_base64(char *out, const unsigned char *in, size_t len);

#endif
