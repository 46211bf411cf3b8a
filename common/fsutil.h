/* Files written the safe way: a temporary name in the destination folder,
 * fsync, rename, then fsync of the folder. A crash at any instant leaves
 * either the old file or the new one, never a torn one. */
#ifndef CK_FSUTIL_H
#define CK_FSUTIL_H

#include "common/buf.h"

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

/* An atomic file being written. Free an unfinished one with _abort: the
 * temporary is removed and the destination is untouched. */
struct ck_atomic_file {
    int fd;
    char *path;  /* owned: the final name */
    char *tmp;   /* owned: the temporary name */
};

int ck_atomic_open(struct ck_atomic_file *f, const char *path, mode_t mode);
int ck_atomic_write(struct ck_atomic_file *f, const void *data, size_t len);
/* fsync, rename into place, fsync the folder; releases f in every case. */
int ck_atomic_commit(struct ck_atomic_file *f);
/* The same without either fsync, for a caller that makes a whole set durable
 * at once (common/syncset.h): a crash may leave the old file, never a torn
 * name once the set's flush returned. */
int ck_atomic_commit_nosync(struct ck_atomic_file *f);
/* Removes the temporary; accepts a file that was never opened or already done. */
void ck_atomic_abort(struct ck_atomic_file *f);

/* Whole-file helpers on top of the above. */
int ck_write_file_atomic(const char *path, const void *data, size_t len, mode_t mode);
struct stat;
/* The same, and *st (when not NULL) gets the new file's stat as written (an
 * fstat before the rename, which changes nothing a ck_file_id compares). */
int ck_write_file_atomic_stat(const char *path, const void *data, size_t len, mode_t mode,
                              struct stat *st);
/* Writes all of data to fd (again after EINTR and short writes): 0, or -1
 * with errno set. Sets no error message: usable in a forked helper. */
int ck_write_all(int fd, const void *data, size_t len);
/* pread/pwrite of exactly len bytes at off (retried on EINTR and short
 * transfers, in pieces of at most 1 GiB); -1 with errno on failure or when
 * the file ends first. Raw: the callers word their own errors. */
int ck_pread_all(int fd, void *buf, uint64_t len, uint64_t off);
int ck_pwrite_all(int fd, const void *buf, uint64_t len, uint64_t off);
/* Reads up to bufsz-1 bytes of name (relative to dirfd; O_NOFOLLOW when
 * nofollow) into buf and terminates it: the byte count, or -1 when it cannot
 * be opened or read or is empty. For small files read in passing (a
 * DeepSpeed 'latest', /proc/PID/fdinfo): no error message is set. */
ssize_t ck_read_small_at(int dirfd, const char *name, bool nofollow, char *buf, size_t bufsz);
/* Reads at most max bytes; a larger file is CK_ESIZE naming the path. */
int ck_read_file(const char *path, size_t max, struct ck_buf *out);

int ck_fsync_dir(const char *dir);
/* mkdir -p; existing folders are fine. */
int ck_mkdirs(const char *path, mode_t mode);
/* Places src at dst without copying data where it can: hard link, then a
 * reflink (FICLONE), then a copy (copy_file_range) to a temporary and rename.
 * An existing dst that is the same file is success; a different one is CK_EEXIST. */
int ck_place_file(const char *src, const char *dst);
/* The same without the fsync of dst's folder, for callers placing many files
 * into one folder: they fsync it once (ck_fsync_dir) before relying on it.
 * Returns 0 when dst is src's own inode (linked now or before), 1 when it
 * is a copy (a reflink or the bytes). */
int ck_place_file_nosync(const char *src, const char *dst);
/* Writes "a/b" into out; CK_ESIZE when it does not fit. */
int ck_path_join(char *out, size_t outsz, const char *a, const char *b);
/* The folder part of path into out ("." when there is none). */
void ck_dirname(char *out, size_t outsz, const char *path);
const char *ck_basename(const char *path);
/* "FILE#PART" names PART inside FILE (a SameDiff archive's tag) when no file
 * has the whole name: then file gets FILE, *part points after the last '#'
 * and the result is true. Otherwise file gets all of spec, *part is NULL. */
bool ck_path_split_part(const char *spec, char *file, size_t filesz, const char **part);
bool ck_is_dir(const char *path);
/* Whether name (a file name, no folder) is a temporary ck_atomic_open makes:
 * ".NAME.ckptd-XXXXXX.tmp", or the unmarked ".metadata.yaml.XXXXXX.tmp" and
 * ".build_parameters.yaml.XXXXXX.tmp" of earlier versions. Never a name a
 * trainer would write by chance. */
bool ck_is_own_temporary(const char *name);
/* Removes ckptd's own temporaries directly inside dir (not below it), left by
 * a run that was killed; adds how many to *removed. A missing dir is fine.
 * Call only while holding the folder's lock: a live writer's temporary
 * matches too. */
int ck_sweep_temporaries(const char *dir, size_t *removed);
/* The same for those whose name starts with prefix only (".OUT." for the
 * temporaries of OUT and of OUT's journal). */
int ck_sweep_temporaries_of(const char *dir, const char *prefix, size_t *removed);
bool ck_exists(const char *path);

struct stat;
/* A file's mtime in nanoseconds: the form the queue and the hash cache keep
 * (one formula, so their keys match). */
int64_t ck_mtime_ns(const struct stat *st);
/* Whether two stats of one file show the same content as far as a stat can
 * tell: size and mtime (nanoseconds) equal. */
bool ck_stat_unchanged(const struct stat *before, const struct stat *after);

/* Which file a path named, and which version of it: device, inode, size and
 * mtime. A file this process wrote and kept in memory (a parse, its bytes)
 * is known to be unchanged while its id is the same; anyone else's atomic
 * write gives a new inode. */
struct ck_file_id {
    uint64_t dev, ino, size;
    int64_t mtime_ns;
};
struct ck_file_id ck_file_id_of(const struct stat *st);
bool ck_file_id_equal(const struct ck_file_id *a, const struct ck_file_id *b);

#endif
