/* Checking a config the way a start uses it. Loading a config checks its
 * shape (keys, types, URL forms); a start then resolves what the config only
 * names: env: and file: secrets, key files, AWS profiles, the listen
 * address, the layer list (read, its keys and ops against the engine's op
 * table), the verify files and the signing key. `ckptd config`
 * and `ckptd watch -n` call this too, so whatever makes a start exit 2 makes
 * them exit 2 (and a config they call ok starts). No value is ever printed. */
#ifndef CK_CONFIG_CHECK_H
#define CK_CONFIG_CHECK_H

#include "agent/config.h"

/* CK_ECONFIG naming the key (and the reference, never its value) of the first
 * thing that does not resolve; 0 when everything does. No network. */
int ck_config_resolve(const struct ck_config *cfg);

/* DIR, and DIR/.ckptd when it exists, writable by this process's user (what
 * the first pass writes): CK_ECONFIG naming the folder. */
int ck_config_check_dir(const char *dir);

#endif
