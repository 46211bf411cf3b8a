/* Small predicates over C strings. */
#ifndef CK_TEXT_H
#define CK_TEXT_H

#include <stdbool.h>
#include <stddef.h>

/* Whether s ends with suffix (byte for byte). */
bool ck_text_ends_with(const char *s, const char *suffix);
/* The same, ASCII letters in either case (file extensions). */
bool ck_text_ends_with_icase(const char *s, const char *suffix);

/* A byte count for people: "512 B", "1.5 KiB", "3.2 GiB". */
void ck_text_bytes(char *out, size_t outsz, double bytes);
/* A signal's name as signal.h spells it ("SIGTERM"), the same in every log
 * event (strsignal's descriptions differ: "Terminated"); the number when the
 * signal has no name. */
const char *ck_signal_name(int sig, char *buf, size_t bufsz);

#endif
