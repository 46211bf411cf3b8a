/* Small predicates over C strings. */
#ifndef CK_TEXT_H
#define CK_TEXT_H

#include <stdbool.h>

/* Whether s ends with suffix (byte for byte). */
bool ck_text_ends_with(const char *s, const char *suffix);
/* The same, ASCII letters in either case (file extensions). */
bool ck_text_ends_with_icase(const char *s, const char *suffix);

#endif
