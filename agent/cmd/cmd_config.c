/* ckptd config: check a config (-n in daemon terms) or list the keys. */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/config.h"
#include "common/error.h"

#include <stdio.h>
#include <string.h>

static const char help[] =
    "usage: ckptd config [--keys] [-c FILE | DIR]\n"
    "\n"
    "Checks a config file (the one --config names, else DIR/ckptd.yaml) and exits\n"
    "0 when it is valid, 2 with the key and line of the first problem when not.\n"
    "\n"
    "  -k, --keys            list every config key with its meaning\n" CK_CLI_HELP;

int ck_cmd_config(int argc, char **argv)
{
    static const struct option longopts[] = {CK_CLI_LONGOPTS, {"keys", no_argument, NULL, 'k'},
                                              {NULL, 0, NULL, 0}};
    struct ck_cli cli;
    bool keys = false;
    int opt, rc;
    ck_cli_init(&cli);
    optind = 1;
    while ((opt = getopt_long(argc, argv, CK_CLI_SHORTOPTS "k", longopts, NULL)) != -1) {
        if ((rc = ck_cli_common(&cli, "config", opt, optarg)) != 0) {
            if (rc != 1)
                return rc;
            continue;
        }
        if (opt == 'k')
            keys = true;
    }
    if (cli.help) {
        fputs(help, stdout);
        return CK_EXIT_OK;
    }
    if (keys) {
        ck_config_print_keys();
        return CK_EXIT_OK;
    }
    if (optind + 1 < argc)
        return ck_cli_usage_error("config", "expected at most one DIR");
    const char *dir = optind < argc ? argv[optind] : ".";
    struct ck_config cfg;
    int err = ck_config_for_dir(&cfg, cli.config_path, dir);
    if (err < 0) {
        ck_config_release(&cfg);
        return ck_cli_fail("config", err);
    }
    printf("%s: ok\n", cfg.source ? cfg.source : "(no config file: defaults)");
    ck_config_release(&cfg);
    return CK_EXIT_OK;
}
