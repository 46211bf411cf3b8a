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

static const char head[] =
    "usage: ckptd bundle DIR -o OUT.tar.zst [--level N] [--threads N]\n"
    "\n"
    "Packs the PMF tree DIR (every file and folder but the agent's .ckptd state and\n"
    "temporary names; metadata.yaml last) into one POSIX tar compressed with zstd.\n"
    "OUT is written to a temporary name and renamed when complete.\n"
    "\n";

struct bundle_flags {
    const char *out;
    int level, threads;
};

#define O(f) offsetof(struct bundle_flags, f)
static const struct ck_opt options[] = {
    {"output", 'o', CK_OPT_STR, NULL, NULL, O(out), 0, "FILE", "the bundle to write"},
    {"level", 0, CK_OPT_INT, NULL, NULL, O(level), 19, "N", "zstd level 1..19 (default 3)"},
    {"threads", 0, CK_OPT_INT, NULL, NULL, O(threads), 256, "N",
     "zstd worker threads (default: one per core)"},
    {NULL, 0, 0, NULL, NULL, 0, 0, NULL, NULL},
};

int ck_cmd_bundle(int argc, char **argv)
{
    struct ck_cli cli;
    struct bundle_flags fl = {NULL, 3, 0};
    int rc;
    ck_cli_init(&cli);
    if ((rc = ck_cli_parse("bundle", argc, argv, options, &fl, &cli, true)) != 0)
        return rc;
    if (cli.help) {
        ck_cli_help(head, options, "");
        return CK_EXIT_OK;
    }
    const char *out = fl.out;
    int level = fl.level, threads = fl.threads;
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
