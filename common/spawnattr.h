/* The start every child of ckptd gets (exec hooks, the wrapped training
 * command, credential_process): the agent blocks signals for its signalfd
 * and ignores some (SIGPIPE, SIGIO), and a child must inherit neither; a
 * process group of its own lets one kill(-pid) reach it and its children. */
#ifndef CK_SPAWNATTR_H
#define CK_SPAWNATTR_H

#include <spawn.h>

/* Initialises a (posix_spawnattr_destroy it after the spawn): no signal
 * blocked, every signal at its default disposition, a new process group. */
void ck_spawnattr_clean(posix_spawnattr_t *a);

#endif
