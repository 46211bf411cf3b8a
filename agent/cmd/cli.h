/* The command line: a table of commands over the functions the daemon uses.
 * Every command parses its own options with getopt_long, and shares the
 * common ones below (--config, --log-format, -v, -q, --help). */
#ifndef CK_CLI_H
#define CK_CLI_H

#include "agent/config.h"

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>

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
    /* CK_OPT_CONFIG options given, in order (values borrowed from argv) */
    struct ck_config_override overrides[16];
    size_t noverrides;
    char origins[16][48]; /* "--name" of each override */
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

/* ---- options from a table ----
 * One row per option drives getopt_long, the command's --help lines and the
 * config override: a flag that stands for a config key carries the key's
 * name, its value goes through that key's own parser (agent/config.c), so a
 * flag and its config key cannot drift. */
enum ck_opt_kind {
    CK_OPT_SET,    /* no argument: the bool at offset becomes true */
    CK_OPT_CLEAR,  /* no argument: the bool at offset becomes false */
    CK_OPT_STR,    /* the argument (borrowed from argv) into the const char * at offset */
    CK_OPT_VALUE,  /* no argument: the int at offset (-1 before) becomes value, once */
    CK_OPT_CONFIG, /* a value of config key `key`: checked now, applied over the config
                    * once it is loaded (ck_config_apply with cli->overrides) */
    CK_OPT_STORE,  /* a store option `key` (as in upload.stores) into the
                    * struct ck_store_spec at offset */
};

struct ck_opt {
    const char *name;  /* --name; NULL ends the table */
    char shortname;    /* -x, or 0 */
    enum ck_opt_kind kind;
    const char *key;   /* CK_OPT_CONFIG: the config key; CK_OPT_STORE: the store option */
    const char *fixed; /* CONFIG/STORE without an argument: the value the flag stands for */
    size_t offset;     /* into the command's options struct */
    int value;         /* CK_OPT_VALUE */
    const char *arg;   /* the argument's name in --help; NULL: the option takes none */
    const char *help;  /* the help text ('\n' starts a continuation line) */
};

#define CK_CLI_MAX_OVERRIDES 16

/* Parses argv[1..argc) by table (and the common options into cli) into opts.
 * permute: options may come after operands. 0 with optind at the first
 * operand, or an exit code after printing the usage error. */
int ck_cli_parse(const char *cmd, int argc, char **argv, const struct ck_opt *table, void *opts,
                 struct ck_cli *cli, bool permute);
/* --help: head, the table's lines, the common options, tail. */
void ck_cli_help(const char *head, const struct ck_opt *table, const char *tail);

#endif
