/* Write-behind for a large file written front to back and fsynced at the
 * end (an archive ckptd packs): a helper thread hands each window of fresh
 * data to the disk as soon as it is written (sync_file_range, which starts
 * the writeback without waiting), waits for the window before it to be on
 * disk and drops it from the page cache.
 *
 * Why: the kernel's flusher starts only once 10% of memory is dirty or
 * after 30 s, so without this the fsync at the end writes the whole file
 * while the writer waits (a 1 GiB .mldef: 0.3 s more than its copy). Doing
 * it in the writer's own thread put the writeback's CPU (submitting the
 * pages, freeing their buffers) on the copy's path; on a thread it runs on
 * the second core. Dropping what is on disk keeps the file from pushing the
 * training job's own data out of the page cache (like `dd oflag=nocache`),
 * and the pages freed are the ones the next writes get, instead of fresh
 * memory that a VM's host must back first.
 *
 * Every call is advisory: an I/O error comes back from the fsync. */
#ifndef CK_WRITEBEHIND_H
#define CK_WRITEBEHIND_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct ck_writebehind {
    int fd;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool started, quit;
    bool off; /* no thread could be had, or stopped: the fsync writes the rest */
    uint64_t written; /* the data before it is written (guarded by mu) */
    uint64_t kicked;  /* handed to the disk before it (guarded by mu) */
    uint64_t dropped; /* on disk and out of the page cache before it (the thread's) */
};

/* For fd, whose data before `from` is not this writer's (an archive being
 * appended to): nothing before it is touched. No thread yet. */
void ck_writebehind_init(struct ck_writebehind *wb, int fd, uint64_t from);

/* The data before `end` is written. Starts the thread at the first full
 * window (a small file never gets one); wakes it once a window is full. */
void ck_writebehind_wrote(struct ck_writebehind *wb, uint64_t end);

/* Stops and joins the thread (before the fsync or the close). The file's
 * tail is left to the fsync. Safe to call again, and without a thread. */
void ck_writebehind_stop(struct ck_writebehind *wb);

/* The window: the file keeps at most two of them in the page cache, and
 * the fsync at the end finds at most one to write. (8 MiB and 2 MiB windows
 * made a 1 GiB pack slower and less steady: more calls, more waits.) */
#define CK_WRITEBEHIND_WINDOW (32u << 20)

#endif
