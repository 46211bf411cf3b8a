/* UTF-8 checks: file names must be UTF-8 to go into YAML or JSON. */
#ifndef CK_UTF8_H
#define CK_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when it is invalid
 * (overlong, surrogate, past U+10FFFF, truncated). */
size_t ck_utf8_char_len(const char *s, size_t left);
bool ck_utf8_is_valid(const char *s, size_t len);
/* Writes s into out (size outsz) with every invalid byte as \xNN, for messages. */
void ck_utf8_sanitize(char *out, size_t outsz, const char *s);

#endif
