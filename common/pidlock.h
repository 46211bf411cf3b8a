/* A lock file that names its holder: an flock held for the life of the
 * process, the file holding the holder's pid so that a refusal can say who
 * holds it. DIR's lock (agent/lock.h) and the upload queue's lock
 * (stores/uploader.h) are both this. */
#ifndef CK_PIDLOCK_H
#define CK_PIDLOCK_H

#include <stddef.h>
#include <sys/types.h>

/* Takes the lock at path (created with mode). 0 and *fd: the lock (close it
 * to release); CK_ELOCKED when another process holds it, holder then gets
 * its pid as text ("" when unknown), and no message is set (the caller says
 * what is locked); CK_EIO naming the file otherwise. */
int ck_pidlock_acquire(const char *path, mode_t mode, int *fd, char *holder, size_t holdersz);
/* The pid of the process holding the lock at path: 0 when none does (or no
 * file), -1 when it is held but its pid is unknown. */
long ck_pidlock_holder(const char *path);

#endif
