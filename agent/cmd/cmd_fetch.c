/* ckptd fetch DIR CHECKPOINT [-o DEST]: a checkpoint retention deleted
 * locally, back from a store that holds a checked copy, MD5-checked. */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/config.h"
#include "agent/config_check.h"
#include "agent/retention.h"
#include "agent/state.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <stdio.h>
#include <string.h>

static const char head[] =
    "usage: ckptd fetch [options] DIR CHECKPOINT\n"
    "\n"
    "Downloads a checkpoint that retention deleted from DIR's disk (ckptd status DIR\n"
    "lists them: 'stores only') from the first configured store that held a checked\n"
    "copy, and checks every file against the MD5 metadata.yaml recorded (a folder's\n"
    "files: against its manifest). A file checkpoint lands as DEST/NAME, a folder as\n"
    "DEST/REF/ with DEST/REF.md5sums. DIR's tree is not changed.\n"
    "\n";
static const char tail[] =
    "\n"
    "exit: 0 fetched, 1 no store gave it back whole, 2 usage or config error\n";

struct fetch_flags {
    const char *out;
};

#define O(f) offsetof(struct fetch_flags, f)
static const struct ck_opt options[] = {
    {"output", 'o', CK_OPT_STR, NULL, NULL, O(out), 0, "DEST",
     "the folder to write it into (default: the current folder)"},
    {NULL, 0, 0, NULL, NULL, 0, 0, NULL, NULL},
};

int ck_cmd_fetch(int argc, char **argv)
{
    struct ck_cli cli;
    struct fetch_flags fl = {"."};
    int rc;
    ck_cli_init(&cli);
    if ((rc = ck_cli_parse("fetch", argc, argv, options, &fl, &cli, true)) != 0)
        return rc;
    if (cli.help) {
        ck_cli_help(head, options, tail);
        return CK_EXIT_OK;
    }
    if (argc - optind != 2)
        return ck_cli_usage_error("fetch", "expected DIR and CHECKPOINT");
    const char *dir = argv[optind], *ref = argv[optind + 1];
    struct ck_config cfg;
    int err = ck_config_for_dir(&cfg, cli.config_path, dir);
    if (err == 0)
        err = ck_config_apply(&cfg, cli.overrides, cli.noverrides);
    if (err == 0)
        err = ck_config_resolve(&cfg);
    ck_cli_setup_logging(&cli, cfg.log_format, cfg.log_level);
    if (err < 0) {
        ck_config_release(&cfg);
        return ck_cli_fail("fetch", err);
    }
    if (!ck_is_dir(dir) || !ck_is_dir(fl.out)) {
        ck_config_release(&cfg);
        return ck_cli_usage_error("fetch", "'%s' is not a folder", ck_is_dir(dir) ? fl.out : dir);
    }
    struct ck_state st = {0};
    size_t n = 0;
    if ((err = ck_state_open(&st, dir)) == 0 &&
        (err = ck_retention_fetch(&st, dir, &cfg, ref, fl.out, &n)) == 0)
        ck_info("fetch.done", "checkpoint='%s' files=%zu dest=\"%s\"", ref, n, fl.out);
    ck_state_close(&st);
    ck_config_release(&cfg);
    return err < 0 ? ck_cli_fail("fetch", err) : CK_EXIT_OK;
}
