#include "common/text.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

bool ck_text_ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

bool ck_text_ends_with_icase(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcasecmp(s + a - b, suffix);
}

void ck_text_bytes(char *out, size_t outsz, double v)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (v >= 1024 && i < 4)
        v /= 1024, i++;
    snprintf(out, outsz, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

const char *ck_signal_name(int sig, char *buf, size_t bufsz)
{
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev)
        snprintf(buf, bufsz, "SIG%s", abbrev);
    else
        snprintf(buf, bufsz, "%d", sig);
    return buf;
}
