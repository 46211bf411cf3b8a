/* When is a file complete? Per-path settle tracking for the watcher.
 *
 * A path is touched when an event says it was written (closed after writing,
 * renamed into place, found in a new folder, changed between two polls). It
 * settles once its size, mtime and inode are unchanged since it was last
 * looked at, its mtime is at least the settle window old, and (where it can
 * be checked, see below) no process has it open for writing. A path that
 * disappears before settling is forgotten.
 *
 * Writers: first a read lease (fcntl F_SETLEASE F_RDLCK, taken and dropped
 * at once), which the kernel refuses while any process has the file open for
 * writing: exact and cheap, but only for our own files (or with CAP_LEASE) on
 * local filesystems. Otherwise /proc/PID/fd of every process we may read is
 * compared by device and inode, and /proc/PID/fdinfo's flags say whether a
 * match is open for writing; processes we cannot read (another user, another
 * PID namespace) and writers on other hosts (NFS) are not seen: then the
 * settle window is the only guard. check_writers false skips both.
 * ck_settle_new sets SIGIO (lease breaks) to ignored for the process. */
#ifndef CK_SETTLE_H
#define CK_SETTLE_H

#include <stdbool.h>
#include <stddef.h>

struct ck_settle;

/* root is copied; paths are relative to it. */
int ck_settle_new(struct ck_settle **out, const char *root, double window, bool check_writers);
void ck_settle_free(struct ck_settle *s);
void ck_settle_configure(struct ck_settle *s, double window, bool check_writers);

/* The file at rel was written: it waits again. */
int ck_settle_touch(struct ck_settle *s, const char *rel);
/* rel (a file, or a folder and everything below it) is gone. */
void ck_settle_forget(struct ck_settle *s, const char *rel);

/* Looks at the pending paths that are due (now: ck_mono_s()). *nsettled
 * counts those that settled; *next is the delay in seconds until the next
 * one is due, or -1 when none is pending. */
int ck_settle_check(struct ck_settle *s, double now, size_t *nsettled, double *next);

/* Whether rel has settled and is unchanged since. When it has not, it is
 * touched (so that it is looked at when due) unless it is pending already. */
bool ck_settle_is_settled(struct ck_settle *s, const char *rel);

size_t ck_settle_npending(const struct ck_settle *s);
/* Calls fn for every path tracked (pending, or settled and not forgotten). */
void ck_settle_each(const struct ck_settle *s, void (*fn)(void *arg, const char *rel), void *arg);
size_t ck_settle_nsettled(const struct ck_settle *s);

/* Exposed for tests: whether a process other than this one has the file at
 * path open for writing. */
bool ck_settle_has_writer(const char *path);

#endif
