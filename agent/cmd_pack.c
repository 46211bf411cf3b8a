/* ckptd pack: a checkpoint into a deployment archive, through the writers
 * table (writers/writer.h): the source is read by its reader, turned into
 * the canonical model (the reader's to_model) and handed to the writer. */
#include "agent/cli.h"
#include "agent/commands.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "readers/reader.h"
#include "writers/samediff.h"
#include "writers/writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: ckptd pack --format FORMAT SRC -o OUT [--tag TAG] [--ref REF]\n"
    "                  [--dtype fp16|bf16|int8] [--source-format NAME]\n"
    "\n"
    "Reads the checkpoint SRC (format detected by content) with its graph and\n"
    "writes it as a deployment archive. FORMAT samediff appends SRC to OUT as a\n"
    "new tag (creating OUT when missing); earlier tags stay byte for byte and a\n"
    "parameter identical to one an earlier tag stored is referenced, not copied.\n"
    "\n"
    "      --format FORMAT   the archive format: samediff\n"
    "  -o, --output OUT      the archive to write or append to\n"
    "      --tag TAG         the new tag (default: REF made a valid file name,\n"
    "                        plus -DTYPE with --dtype)\n"
    "      --ref REF         the checkpoint's reference, epoch or step (default:\n"
    "                        SRC's file name without its extension)\n"
    "      --dtype D         convert floating-point weights: fp16, bf16 or int8\n"
    "                        (symmetric, one scale per tensor)\n"
    "      --source-format N skip detection of SRC's format\n" CK_CLI_HELP;

enum {
    OPT_FORMAT = CK_OPT_FIRST_COMMAND_OPTION,
    OPT_TAG,
    OPT_REF,
    OPT_DTYPE,
    OPT_SRCFMT,
};

static int load_model(const char *src, const char *fmt, struct ck_model **m)
{
    struct ck_tensor_set *s;
    int err;
    if ((err = ck_reader_open(src, fmt, &s)) < 0)
        return err;
    const struct ck_reader_ops *ops = ck_reader_of(s);
    if (!ops || !ops->to_model) {
        err = ck_error(CK_EFORMAT, "'%s': a %s checkpoint carries no graph to pack", src,
                       s->format);
        ck_tensor_set_free(s);
        return err;
    }
    return ops->to_model(s, m);
}

int ck_cmd_pack(int argc, char **argv)
{
    static const struct option longopts[] = {CK_CLI_LONGOPTS,
                                             {"format", required_argument, NULL, OPT_FORMAT},
                                             {"output", required_argument, NULL, 'o'},
                                             {"tag", required_argument, NULL, OPT_TAG},
                                             {"ref", required_argument, NULL, OPT_REF},
                                             {"dtype", required_argument, NULL, OPT_DTYPE},
                                             {"source-format", required_argument, NULL, OPT_SRCFMT},
                                             {NULL, 0, NULL, 0}};
    struct ck_cli cli;
    struct ck_writer_opts o = {.level = -1};
    const char *format = NULL, *out = NULL, *srcfmt = NULL;
    char ref[256];
    int opt, rc, err;
    ck_cli_init(&cli);
    optind = 1;
    while ((opt = getopt_long(argc, argv, "c:vqho:", longopts, NULL)) != -1) {
        if ((rc = ck_cli_common(&cli, "pack", opt, optarg)) != 0) {
            if (rc != 1)
                return rc;
            continue;
        }
        switch (opt) {
        case OPT_FORMAT: format = optarg; break;
        case 'o': out = optarg; break;
        case OPT_TAG: o.tag = optarg; break;
        case OPT_REF: o.ref = optarg; break;
        case OPT_DTYPE: o.dtype = optarg; break;
        case OPT_SRCFMT: srcfmt = optarg; break;
        default: return ck_cli_usage_error("pack", "unknown option");
        }
    }
    if (cli.help) {
        fputs(help, stdout);
        return CK_EXIT_OK;
    }
    if (optind + 1 != argc || !out)
        return ck_cli_usage_error("pack", "expected SRC and -o OUT");
    if (!format)
        return ck_cli_usage_error("pack", "--format is required (samediff)");
    const struct ck_writer_ops *wops = ck_writer_find(format);
    if (!wops)
        return ck_cli_usage_error("pack", "unknown format '%s'", format);
    if (srcfmt && !ck_reader_find(srcfmt))
        return ck_cli_usage_error("pack", "unknown source format '%s'", srcfmt);
    ck_cli_setup_logging(&cli, -1, -1);
    const char *src = argv[optind];
    if (!o.ref) {
        snprintf(ref, sizeof ref, "%s", ck_basename(src));
        char *dot = strrchr(ref, '.');
        if (dot && dot != ref)
            *dot = 0;
        o.ref = ref;
    }
    struct ck_model *m = NULL;
    struct ck_writer *w = NULL;
    if ((err = load_model(src, srcfmt, &m)) < 0)
        return ck_cli_fail("pack", err);
    if ((err = ck_writer_open(wops, out, &o, &w)) >= 0 && (err = ck_writer_add(w, m)) >= 0 &&
        (err = ck_writer_finish(w)) >= 0) {
        const struct ck_samediff_result *r = ck_samediff_last(w);
        if (r)
            printf("%s: tag %s: %zu parameters written, %zu shared with earlier tags\n", out,
                   r->tag, r->params, r->shared);
    }
    ck_writer_free(w);
    ck_model_free(m);
    return err < 0 ? ck_cli_fail("pack", err) : CK_EXIT_OK;
}
