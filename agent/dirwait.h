/* A sidecar usually starts before the trainer has made its output folder:
 * `ckptd watch DIR` on a DIR that does not exist yet waits for it to appear
 * (inotify on the nearest folder above it that exists, and a look every
 * second for network filesystems), instead of failing the pod's start. */
#ifndef CK_DIRWAIT_H
#define CK_DIRWAIT_H

#include <stdbool.h>

/* Returns 0 once dir is a folder; *stopped true (and 0) when SIGTERM or
 * SIGINT came first. CK_EEXIST when dir exists and is not a folder. */
int ck_dir_wait(const char *dir, bool *stopped);

#endif
