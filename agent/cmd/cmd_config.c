/* ckptd config: check a config (-n in daemon terms) or list the keys. */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/config.h"
#include "agent/config_check.h"
#include "agent/nodes.h"
#include "common/error.h"

#include <stdio.h>
#include <string.h>

static const char head[] =
    "usage: ckptd config [--keys] [-c FILE | DIR]\n"
    "\n"
    "Checks a config file (the one --config names, else DIR/ckptd.yaml) and exits\n"
    "0 when it is valid, 2 with the key and line of the first problem when not.\n"
    "Every env: and file: secret, key file, AWS profile, the layer list (its keys\n"
    "and ops against the engine's), the verify files and the listen address are\n"
    "resolved as a start resolves them (values are never printed), and DIR and\n"
    "DIR/.ckptd must be writable: a config that passes starts.\n"
    "It then prints the node identity (nodes.rank, nodes.count) and where each\n"
    "value came from: the config, a launcher's variable, or the default.\n"
    "\n";

static const struct ck_opt options[] = {
    {"keys", 'k', CK_OPT_SET, NULL, NULL, 0, 0, NULL, "list every config key with its meaning"},
    {NULL, 0, 0, NULL, NULL, 0, 0, NULL, NULL},
};

int ck_cmd_config(int argc, char **argv)
{
    struct ck_cli cli;
    bool keys = false;
    int rc;
    ck_cli_init(&cli);
    if ((rc = ck_cli_parse("config", argc, argv, options, &keys, &cli, true)) != 0)
        return rc;
    if (cli.help) {
        ck_cli_help(head, options, "");
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
    if (err == 0)
        err = ck_config_resolve(&cfg); /* what the start resolves, resolved now */
    /* the folder the first pass writes */
    if (err == 0 && optind < argc)
        err = ck_config_check_dir(dir);
    if (err < 0) {
        ck_config_release(&cfg);
        return ck_cli_fail("config", err);
    }
    struct ck_nodes nodes;
    if ((err = ck_nodes_resolve(&nodes, &cfg, NULL)) < 0) { /* resolved above: cannot fail */
        ck_config_release(&cfg);
        return ck_cli_fail("config", err);
    }
    printf("%s: ok\n", cfg.source ? cfg.source : "(no config file: defaults)");
    printf("nodes.rank: %d (%s)\n", nodes.rank, nodes.rank_from);
    printf("nodes.count: %d (%s)\n", nodes.count, nodes.count_from);
    if (nodes.unused[0])
        printf("nodes: not used: %s\n", nodes.unused);
    ck_config_release(&cfg);
    return CK_EXIT_OK;
}
