/* The upload progress bar on a terminal: the command layer draws it from
 * the uploader's progress callback (stores/ prints nothing). */
#include "agent/cmd/commands.h"
#include "common/text.h"
#include "stores/uploader.h"

#include <stdio.h>

void ck_cmd_progress_bar(void *arg, const struct ck_upload_progress *p)
{
    char a[32], b[32], r[32], bar[31];
    (void)arg;
    ck_text_bytes(a, sizeof a, (double)p->sent);
    ck_text_bytes(b, sizeof b, (double)p->total);
    ck_text_bytes(r, sizeof r, p->rate);
    int fill = p->percent * 30 / 100;
    for (int i = 0; i < 30; i++)
        bar[i] = i < fill ? '#' : ' ';
    bar[30] = '\0';
    fprintf(stderr, "\r%-32.32s [%s] %3d%% %10s / %-10s %10s/s%s", p->key, bar, p->percent, a, b,
            r, p->final ? "\n" : "");
    fflush(stderr);
}
