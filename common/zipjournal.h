/* The roll-back journal of an in-place zip append (the SameDiff archive's
 * tags). Before an appender overwrites anything, it records the archive's
 * old length and the bytes it is about to overwrite (the old central
 * directory and end records, which new entries replace) in "<archive>.journal",
 * written atomically and fsynced. While the journal exists the archive may
 * be torn; ck_zipjournal_recover puts the old bytes back, truncates to the
 * old length and removes the journal, so every earlier entry stays byte for
 * byte. The appender removes the journal once the new archive is durable.
 *
 * Who may recover: only a holder of the archive's exclusive flock (a live
 * appender holds it for the whole append; kill -9 releases it). Readers take
 * a shared flock while they read, so they never see an append half done.
 *
 * Journal layout (little-endian): "CKZJ" u32 version(1) u64 old_len
 * u64 tail_off u64 tail_len u32 crc32c(tail) then the tail bytes. Lives in
 * common/ because both the writer (before appending) and the reader (on open)
 * recover. */
#ifndef CK_ZIPJOURNAL_H
#define CK_ZIPJOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CK_ZIPJOURNAL_SUFFIX ".journal"
#define CK_ZIPJOURNAL_MAX (UINT64_C(1) << 30) /* a central directory is never this big */

/* "<path>.journal" into out. */
int ck_zipjournal_path(const char *path, char *out, size_t outsz);
/* Records the roll-back state (atomic write, fsync, folder fsync). */
int ck_zipjournal_write(const char *path, uint64_t old_len, uint64_t tail_off, const void *tail,
                        uint64_t tail_len);
/* fd: the archive opened read-write and locked exclusively. Rolls a torn
 * append back when a journal exists (*rolled_back true), and removes the
 * journal. A journal that does not check out is CK_EFORMAT naming it: the
 * archive is left alone. */
int ck_zipjournal_recover(const char *path, int fd, bool *rolled_back);
/* The same record written to jp instead (an undo record kept for later:
 * writers/zipapp.h ck_zipapp_snapshot); path names the archive in errors. */
int ck_zipjournal_write_to(const char *jp, const char *path, uint64_t old_len, uint64_t tail_off,
                           const void *tail, uint64_t tail_len);
/* Removes the journal once the append is durable (folder fsynced). */
int ck_zipjournal_remove(const char *path);
/* For readers: when a journal exists, opens the archive read-write, takes
 * the exclusive lock (waiting for a live appender) and recovers. */
int ck_zipjournal_recover_path(const char *path);

#endif
