/* The command line: a table of commands over the functions the daemon uses.
 * Every command parses its own options with getopt_long, and shares the
 * common ones below (--config, --log-format, -v, -q, --help). */
#ifndef CK_CLI_H
#define CK_CLI_H

#include <getopt.h>
#include <stdbool.h>

struct ck_command {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the command name; returns an exit code */
    const char *summary;
};

/* The table lives in commands.c; the last row has name == NULL. */
extern const struct ck_command ck_commands[];
const struct ck_command *ck_command_find(const char *name);

/* Options every command takes. */
struct ck_cli {
    const char *config_path; /* --config FILE, borrowed from argv */
    int log_format;          /* -1: not given */
    int log_level;           /* -1: not given */
    bool help;
};

enum { CK_OPT_LOG_FORMAT = 1000, CK_OPT_FIRST_COMMAND_OPTION = 1100 };

#define CK_CLI_SHORTOPTS "+c:vqh"
#define CK_CLI_LONGOPTS                                                                            \
    {"config", required_argument, NULL, 'c'},                                                      \
        {"log-format", required_argument, NULL, CK_OPT_LOG_FORMAT},                                \
        {"verbose", no_argument, NULL, 'v'}, {"quiet", no_argument, NULL, 'q'},                    \
        {"help", no_argument, NULL, 'h'}

#define CK_CLI_HELP                                                                                \
    "  -c, --config FILE     config file (default: DIR/ckptd.yaml when present)\n"                 \
    "      --log-format F    text (default on a terminal) or json (JSON lines)\n"                  \
    "  -v, --verbose         debug logs;  -q, --quiet: warnings and errors only\n"                 \
    "  -h, --help            this help\n"

void ck_cli_init(struct ck_cli *c);
/* Handles a common option: 1 when handled, 0 when opt is not a common one,
 * CK_EXIT_USAGE (after printing) when its argument is bad. */
int ck_cli_common(struct ck_cli *c, const char *cmd, int opt, const char *arg);
/* Applies --log-format/-v/-q over what the config said (config may be NULL). */
void ck_cli_setup_logging(const struct ck_cli *c, int cfg_format, int cfg_level);
/* Prints "ckptd CMD: message" and a hint, returns CK_EXIT_USAGE. */
int ck_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints the last error as "ckptd CMD: message" and returns the exit code for err. */
int ck_cli_fail(const char *cmd, int err);

#endif
