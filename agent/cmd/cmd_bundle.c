/* ckptd bundle DIR -o OUT.tar.zst: a PMF tree as one zstd-compressed tar
 * (libarchive, multithreaded zstd), metadata.yaml last. */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "stores/bundle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: ckptd bundle DIR -o OUT.tar.zst [--level N] [--threads N]\n"
    "\n"
    "Packs the PMF tree DIR (every file and folder but the agent's .ckptd state and\n"
    "temporary names; metadata.yaml last) into one POSIX tar compressed with zstd.\n"
    "OUT is written to a temporary name and renamed when complete.\n"
    "\n"
    "  -o, --output FILE     the bundle to write\n"
    "      --level N         zstd level 1..19 (default 3)\n"
    "      --threads N       zstd worker threads (default: one per core)\n" CK_CLI_HELP;

enum { O_LEVEL = CK_OPT_FIRST_COMMAND_OPTION, O_THREADS };

int ck_cmd_bundle(int argc, char **argv)
{
    static const struct option longopts[] = {CK_CLI_LONGOPTS,
                                             {"output", required_argument, NULL, 'o'},
                                             {"level", required_argument, NULL, O_LEVEL},
                                             {"threads", required_argument, NULL, O_THREADS},
                                             {NULL, 0, NULL, 0}};
    struct ck_cli cli;
    const char *out = NULL;
    int level = 3, threads = 0, opt, rc;
    ck_cli_init(&cli);
    optind = 1;
    while ((opt = getopt_long(argc, argv, "c:vqho:", longopts, NULL)) != -1) {
        if ((rc = ck_cli_common(&cli, "bundle", opt, optarg)) != 0) {
            if (rc != 1)
                return rc;
            continue;
        }
        if (opt == 'o')
            out = optarg;
        else if (opt == O_LEVEL && ((level = atoi(optarg)) < 1 || level > 19))
            return ck_cli_usage_error("bundle", "--level: 1 to 19");
        else if (opt == O_THREADS && ((threads = atoi(optarg)) < 1 || threads > 256))
            return ck_cli_usage_error("bundle", "--threads: 1 to 256");
        else if (opt != 'o' && opt != O_LEVEL && opt != O_THREADS)
            return ck_cli_usage_error("bundle", "unknown option");
    }
    if (cli.help) {
        fputs(help, stdout);
        return CK_EXIT_OK;
    }
    ck_cli_setup_logging(&cli, -1, -1);
    if (argc - optind != 1 || !out)
        return ck_cli_usage_error("bundle", "expected DIR and -o OUT.tar.zst");
    const char *dir = argv[optind];
    if (!ck_is_dir(dir))
        return ck_cli_usage_error("bundle", "'%s' is not a directory", dir);
    int n = 0, err = ck_bundle_write(dir, out, level, threads, &n);
    if (err < 0)
        return ck_cli_fail("bundle", err);
    ck_info("bundle.written", "path=\"%s\" files=%d", out, n);
    return CK_EXIT_OK;
}
