#include "common/writebehind.h"

#include <fcntl.h>

#define WINDOW ((uint64_t)CK_WRITEBEHIND_WINDOW)

void ck_writebehind_init(struct ck_writebehind *wb, int fd, uint64_t from)
{
    *wb = (struct ck_writebehind){.fd = fd, .written = from, .kicked = from, .dropped = from};
}

static void *flusher(void *arg)
{
    struct ck_writebehind *wb = arg;
    pthread_mutex_lock(&wb->mu);
    for (;;) {
        while (!wb->quit && wb->written - wb->kicked < WINDOW)
            pthread_cond_wait(&wb->cv, &wb->mu);
        if (wb->quit)
            break;
        uint64_t from = wb->kicked, end = wb->written;
        pthread_mutex_unlock(&wb->mu);
        (void)sync_file_range(wb->fd, (off64_t)from, (off64_t)(end - from), SYNC_FILE_RANGE_WRITE);
        /* The window before the newest one has had a window's time to reach
         * the disk: wait for what is left of it, then let its pages go. */
        if (end - wb->dropped >= 2 * WINDOW) {
            uint64_t upto = end - WINDOW;
            (void)sync_file_range(wb->fd, (off64_t)wb->dropped, (off64_t)(upto - wb->dropped),
                                  SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                      SYNC_FILE_RANGE_WAIT_AFTER);
            (void)posix_fadvise(wb->fd, (off_t)wb->dropped, (off_t)(upto - wb->dropped),
                                POSIX_FADV_DONTNEED);
            wb->dropped = upto; /* the thread's own */
        }
        pthread_mutex_lock(&wb->mu);
        wb->kicked = end;
    }
    pthread_mutex_unlock(&wb->mu);
    return NULL;
}

void ck_writebehind_wrote(struct ck_writebehind *wb, uint64_t end)
{
    if (wb->off || end <= wb->written)
        return;
    if (!wb->started) {
        wb->written = end;
        if (end - wb->kicked < WINDOW)
            return;
        pthread_mutex_init(&wb->mu, NULL);
        pthread_cond_init(&wb->cv, NULL);
        if (pthread_create(&wb->thread, NULL, flusher, wb) != 0) {
            /* no thread: the fsync writes it all, as without write-behind */
            pthread_mutex_destroy(&wb->mu);
            pthread_cond_destroy(&wb->cv);
            wb->off = true;
            return;
        }
        wb->started = true;
        return; /* the thread finds the full window on its first look */
    }
    pthread_mutex_lock(&wb->mu);
    wb->written = end;
    if (end - wb->kicked >= WINDOW)
        pthread_cond_signal(&wb->cv);
    pthread_mutex_unlock(&wb->mu);
}

void ck_writebehind_stop(struct ck_writebehind *wb)
{
    if (!wb->started)
        return;
    pthread_mutex_lock(&wb->mu);
    wb->quit = true;
    pthread_cond_signal(&wb->cv);
    pthread_mutex_unlock(&wb->mu);
    pthread_join(wb->thread, NULL);
    pthread_mutex_destroy(&wb->mu);
    pthread_cond_destroy(&wb->cv);
    wb->started = false;
    wb->off = true; /* stopped for good: later writes are the fsync's */
}
