/* ckptd: the agent beside a training job. See README.md. */
#include "agent/cmd/cli.h"
#include "agent/cmd/cmd_mldef.h"
#include "common/fsutil.h"
#include "common/error.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out, "usage: ckptd <command> [options] [args]\n\ncommands:\n");
    for (const struct ck_command *c = ck_commands; c->name; c++)
        fprintf(out, "  %-10s %s\n", c->name, c->summary);
    fprintf(out, "\n'ckptd <command> --help' describes a command.\n"
                 "exit codes: 0 success, 1 the work failed, 2 usage or config error,\n"
                 "            3 another ckptd holds the lock\n");
}

int main(int argc, char **argv)
{
    /* Started as "mldef" (a link to ckptd): the mldef tool. */
    if (argc > 0 && strcmp(ck_basename(argv[0]), "mldef") == 0)
        return ck_mldef_main(argc, argv);
    if (argc < 2) {
        usage(stderr);
        return CK_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        if (argc > 2 && strcmp(name, "help") == 0) {
            const struct ck_command *c = ck_command_find(argv[2]);
            if (c) {
                char *sub[] = {argv[2], "--help", NULL};
                return c->run(2, sub);
            }
        }
        usage(stdout);
        return CK_EXIT_OK;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "version")) {
        printf("ckptd %s\n", CKPTD_VERSION);
        return CK_EXIT_OK;
    }
    const struct ck_command *c = ck_command_find(name);
    if (!c) {
        fprintf(stderr, "ckptd: unknown command '%s'\n", name);
        usage(stderr);
        return CK_EXIT_USAGE;
    }
    return c->run(argc - 1, argv + 1);
}
