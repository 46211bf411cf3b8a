/* credential_process (the AWS CLI's "sourcing credentials with an external
 * process"): a profile names a command that prints the keys as JSON. The
 * command line is split as the AWS CLI splits it (Python's shlex.split: no
 * shell, quotes and backslashes as a POSIX shell has them) and run with
 * posix_spawnp: stdin /dev/null, stdout captured (it holds the keys), stderr
 * ours (a helper's own messages reach the log's stream), in its own process
 * group, killed at the timeout. Neither the command line nor its output
 * appears in an error: both may hold secrets. */
#ifndef CK_STORE_AWSPROCESS_H
#define CK_STORE_AWSPROCESS_H

#include "common/buf.h"

#include <stddef.h>

#define CK_AWSPROCESS_OUTPUT_MAX (64u << 10)
#define CK_AWSPROCESS_TIMEOUT_S 60.0

/* Splits cmd into a NULL-terminated argv (owned: ck_awsprocess_argv_free).
 * CK_ECONFIG, prefixed with what, on an unclosed quote, a trailing
 * backslash or an empty command. */
int ck_awsprocess_split(const char *cmd, const char *what, char ***argv);
void ck_awsprocess_argv_free(char **argv);

/* Runs cmd and puts its whole stdout into out (at most
 * CK_AWSPROCESS_OUTPUT_MAX bytes). Errors (prefixed with what) name the
 * program (argv[0]) and say why: it could not start, exited non-zero or by
 * a signal, did not finish within timeout seconds, printed too much. */
int ck_awsprocess_run(const char *cmd, const char *what, double timeout, struct ck_buf *out);

#endif
