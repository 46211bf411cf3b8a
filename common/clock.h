/* The monotonic clock, for deadlines, timeouts and durations (never for
 * timestamps that leave the process: those use the wall clock). */
#ifndef CK_CLOCK_H
#define CK_CLOCK_H

#include <stdint.h>

/* Milliseconds since an arbitrary point (CLOCK_MONOTONIC). */
int64_t ck_mono_ms(void);
/* The same clock in seconds, with nanosecond resolution. */
double ck_mono_s(void);
/* The wall clock (CLOCK_REALTIME) in UNIX seconds, nanoseconds kept: for
 * times compared with file times or written where other processes read them. */
double ck_wall_s(void);

#endif
