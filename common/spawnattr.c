#include "common/spawnattr.h"

#include <signal.h>

void ck_spawnattr_clean(posix_spawnattr_t *a)
{
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_init(a);
    posix_spawnattr_setsigmask(a, &none);
    posix_spawnattr_setsigdefault(a, &all);
    posix_spawnattr_setpgroup(a, 0);
    posix_spawnattr_setflags(a, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                    POSIX_SPAWN_SETPGROUP);
}
