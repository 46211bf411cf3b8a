/* ckptd pack SRC -o OUT: a checkpoint as a deployment archive, through the
 * writers table (agent/pack.h), so a new format is a row there, not here. */
#include "agent/cli.h"
#include "agent/commands.h"
#include "agent/pack.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "readers/reader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f)
{
    fprintf(f, "usage: ckptd pack SRC -o OUT [--format NAME] [--graph FILE] [-0..-9]\n"
               "                  [--sign-key file:/path] [--src-format NAME]\n"
               "                  [--tag TAG] [--ref REF] [--dtype fp16|bf16|int8]\n"
               "\n"
               "Packs the checkpoint SRC (anything `ckptd inspect` reads that has a network:\n"
               ".nnp, SameDiff, .mldef; weight-only formats with --graph) into a deployment\n"
               "archive. OUT is written to a temporary name, fsynced and renamed: it is\n"
               "either the old file or the complete new one. An existing OUT that is not an\n"
               "archive of that format is not replaced.\n"
               "\n"
               "  -o, --output FILE     the archive to write\n"
               "      --format NAME     archive format (default mldef):");
    for (size_t i = 0; ck_writers[i]; i++)
        fprintf(f, " %s", ck_writers[i]->name);
    fprintf(f, "\n"
               "      --graph FILE      the layer list (YAML) of a weight-only checkpoint\n"
               "  -0 .. -9              zip level: -0 stores data files uncompressed so a loader\n"
               "                        can map them (the default); -1..-9 deflate\n"
               "      --sign-key REF    sign with this Ed25519 private key (file:/path, made by\n"
               "                        `ckptd keygen`)\n"
               "      --src-format NAME skip detection of SRC's format\n"
               "\n"
               "samediff: OUT is a tagged archive (DL4J ADR 0001) that SRC is appended to as\n"
               "a new tag, in place and crash-safe; earlier tags stay byte for byte, and a\n"
               "parameter identical to one an earlier tag stored is referenced, not copied.\n"
               "      --tag TAG         the new tag (default: REF made a valid file name,\n"
               "                        plus -DTYPE with --dtype)\n"
               "      --ref REF         the checkpoint's reference, epoch or step (default:\n"
               "                        SRC's file name without its extension)\n"
               "      --dtype D         convert floating-point weights: fp16, bf16 or int8\n"
               "                        (symmetric, one scale per tensor)\n" CK_CLI_HELP);
}

enum { O_FORMAT = CK_OPT_FIRST_COMMAND_OPTION, O_GRAPH, O_SIGN, O_SRCFMT, O_TAG, O_REF, O_DTYPE };

int ck_cmd_pack(int argc, char **argv)
{
    static const struct option longopts[] = {CK_CLI_LONGOPTS,
                                             {"output", required_argument, NULL, 'o'},
                                             {"format", required_argument, NULL, O_FORMAT},
                                             {"graph", required_argument, NULL, O_GRAPH},
                                             {"sign-key", required_argument, NULL, O_SIGN},
                                             {"src-format", required_argument, NULL, O_SRCFMT},
                                             {"tag", required_argument, NULL, O_TAG},
                                             {"ref", required_argument, NULL, O_REF},
                                             {"dtype", required_argument, NULL, O_DTYPE},
                                             {NULL, 0, NULL, 0}};
    struct ck_cli cli;
    struct ck_pack_opts o = {.format = "mldef", .w = {.level = -1}};
    const char *out = NULL;
    int opt, rc;
    ck_cli_init(&cli);
    optind = 1;
    while ((opt = getopt_long(argc, argv, "c:vqho:0123456789", longopts, NULL)) != -1) {
        if ((rc = ck_cli_common(&cli, "pack", opt, optarg)) != 0) {
            if (rc != 1)
                return rc;
            continue;
        }
        if (opt >= '0' && opt <= '9')
            o.w.level = opt - '0';
        else if (opt == 'o')
            out = optarg;
        else if (opt == O_FORMAT)
            o.format = optarg;
        else if (opt == O_GRAPH)
            o.graph = optarg;
        else if (opt == O_SIGN)
            o.w.sign_key = optarg;
        else if (opt == O_SRCFMT)
            o.src_format = optarg;
        else if (opt == O_TAG)
            o.w.tag = optarg;
        else if (opt == O_REF)
            o.w.ref = optarg;
        else if (opt == O_DTYPE)
            o.w.dtype = optarg;
        else
            return ck_cli_usage_error("pack", "unknown option");
    }
    if (cli.help) {
        help(stdout);
        return CK_EXIT_OK;
    }
    ck_cli_setup_logging(&cli, -1, -1);
    if (argc - optind != 1 || !out)
        return ck_cli_usage_error("pack", "expected SRC and -o OUT");
    if (!ck_writer_find(o.format))
        return ck_cli_usage_error("pack", "unknown --format '%s'", o.format);
    if (o.src_format && !ck_reader_find(o.src_format))
        return ck_cli_usage_error("pack", "unknown --src-format '%s'", o.src_format);
    o.w.verbose = cli.log_level >= 0;
    char ref[256];
    if (!o.w.ref) {
        /* The checkpoint's reference, for a tag: its file name without the extension. */
        snprintf(ref, sizeof ref, "%s", ck_basename(argv[optind]));
        char *dot = strrchr(ref, '.');
        if (dot && dot != ref)
            *dot = 0;
        o.w.ref = ref;
    }
    struct ck_pack_result r;
    int err = ck_pack(argv[optind], out, &o, &r);
    if (err < 0)
        return ck_cli_fail("pack", err);
    if (r.samediff.tag[0])
        printf("%s: tag %s: %zu parameters written, %zu shared with earlier tags\n", out,
               r.samediff.tag, r.samediff.params, r.samediff.shared);
    ck_info("archive.packed", "path=\"%s\" format=%s size=%llu layers=%zu", out, o.format,
            (unsigned long long)r.size, r.nlayers);
    return CK_EXIT_OK;
}
