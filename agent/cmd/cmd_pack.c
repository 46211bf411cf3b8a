/* ckptd pack SRC -o OUT: a checkpoint as a deployment archive, through the
 * writers table (agent/pack.h), so a new format is a row there, not here. */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/pack.h"
#include "common/error.h"
#include "common/log.h"
#include "readers/reader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f)
{
    fprintf(f, "usage: ckptd pack SRC -o OUT [--format NAME] [--graph FILE] [-0..-9]\n"
               "                  [--sign-key file:/path] [--src-format NAME]\n"
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
               "      --src-format NAME skip detection of SRC's format\n" CK_CLI_HELP);
}

enum { O_FORMAT = CK_OPT_FIRST_COMMAND_OPTION, O_GRAPH, O_SIGN, O_SRCFMT };

int ck_cmd_pack(int argc, char **argv)
{
    static const struct option longopts[] = {CK_CLI_LONGOPTS,
                                             {"output", required_argument, NULL, 'o'},
                                             {"format", required_argument, NULL, O_FORMAT},
                                             {"graph", required_argument, NULL, O_GRAPH},
                                             {"sign-key", required_argument, NULL, O_SIGN},
                                             {"src-format", required_argument, NULL, O_SRCFMT},
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
    struct ck_pack_result r;
    int err = ck_pack(argv[optind], out, &o, &r);
    if (err < 0)
        return ck_cli_fail("pack", err);
    ck_info("archive.packed", "path=\"%s\" format=%s size=%llu layers=%zu", out, o.format,
            (unsigned long long)r.size, r.nlayers);
    return CK_EXIT_OK;
}
