/* ckptd pack SRC -o OUT: a checkpoint as a deployment archive, through the
 * writers table (agent/pack.h), so a new format is a row there, not here. */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/pack.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "readers/reader.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char head[] =
    "usage: ckptd pack SRC -o OUT [--format mldef|samediff] [--graph FILE] [-0..-9]\n"
    "                  [--weights PREFIX]\n"
    "                  [--sign-key file:/path] [--src-format NAME]\n"
    "                  [--tag TAG] [--ref REF] [--dtype fp16|bf16|int8]\n"
    "\n"
    "Packs the checkpoint SRC (anything `ckptd inspect` reads that has a network:\n"
    ".nnp, SameDiff, .mldef; weight-only formats with --graph) into a deployment\n"
    "archive, through the writers table (writers/writer.h). OUT is written to a\n"
    "temporary name, fsynced and renamed: it is either the old file or the complete\n"
    "new one. An existing OUT that is not an archive of that format is not replaced.\n"
    "\n"
    "mldef: one model per archive (docs/mldef.md), optionally signed.\n"
    "samediff: OUT is a tagged archive (DL4J ADR 0001) that SRC is appended to as\n"
    "a new tag, in place and crash-safe; earlier tags stay byte for byte, and a\n"
    "parameter identical to one an earlier tag stored is referenced, not copied.\n"
    "\n";

struct pack_flags {
    const char *out, *format, *graph, *weights, *sign_key, *src_format, *tag, *ref, *dtype;
    int level; /* -1: the format's default */
};

#define O(f) offsetof(struct pack_flags, f)
#define LEVEL(d, h)                                                                                \
    {                                                                                              \
        "level-" #d, (char)('0' + (d)), CK_OPT_VALUE, NULL, NULL, O(level), d, NULL, h             \
    }
static const struct ck_opt options[] = {
    {"output", 'o', CK_OPT_STR, NULL, NULL, O(out), 0, "FILE", "the archive to write"},
    {"format", 0, CK_OPT_STR, NULL, NULL, O(format), 0, "NAME",
     "archive format (default mldef; the list below)"},
    {"graph", 0, CK_OPT_STR, NULL, NULL, O(graph), 0, "FILE",
     "the layer list (YAML) of a weight-only checkpoint"},
    {"weights", 0, CK_OPT_STR, NULL, NULL, O(weights), 0, "PREFIX",
     "a training checkpoint's container of the model's\ntensors (state_dict, model, ema, ...) "
     "or a dotted\nprefix; default: found (the config's pack.weights)"},
    LEVEL(0, "zip level: -0 stores data files uncompressed so a\n"
             "loader can map them (the default); -1..-9 deflate"),
    LEVEL(1, "deflate, fastest"),
    LEVEL(2, ""),
    LEVEL(3, ""),
    LEVEL(4, ""),
    LEVEL(5, ""),
    LEVEL(6, ""),
    LEVEL(7, ""),
    LEVEL(8, ""),
    LEVEL(9, "deflate, smallest"),
    {"sign-key", 0, CK_OPT_STR, NULL, NULL, O(sign_key), 0, "REF",
     "mldef: sign with this Ed25519 private key\n(file:/path, made by `ckptd keygen`)"},
    {"src-format", 0, CK_OPT_STR, NULL, NULL, O(src_format), 0, "NAME",
     "skip detection of SRC's format"},
    {"tag", 0, CK_OPT_STR, NULL, NULL, O(tag), 0, "TAG",
     "samediff: the new tag (default: REF made a valid\nfile name, plus -DTYPE with --dtype)"},
    {"ref", 0, CK_OPT_STR, NULL, NULL, O(ref), 0, "REF",
     "the checkpoint's reference, epoch or step\n(default: SRC's file name without its extension)"},
    {"dtype", 0, CK_OPT_STR, NULL, NULL, O(dtype), 0, "D",
     "samediff: convert floating-point weights: fp16,\nbf16 or int8 (symmetric, one scale per "
     "tensor)"},
    {NULL, 0, 0, NULL, NULL, 0, 0, NULL, NULL},
};

int ck_cmd_pack(int argc, char **argv)
{
    struct ck_cli cli;
    struct pack_flags fl = {.format = "mldef", .level = -1};
    int rc;
    ck_cli_init(&cli);
    if ((rc = ck_cli_parse("pack", argc, argv, options, &fl, &cli, true)) != 0)
        return rc;
    if (cli.help) {
        /* the formats as the writers table has them, so a new writer shows up here */
        char tail[512] = "\nformats:";
        for (size_t i = 0; ck_writers[i]; i++)
            snprintf(tail + strlen(tail), sizeof tail - strlen(tail), " %s (%s)",
                     ck_writers[i]->name, ck_writers[i]->extension);
        snprintf(tail + strlen(tail), sizeof tail - strlen(tail), "\n");
        ck_cli_help(head, options, tail);
        return CK_EXIT_OK;
    }
    const char *out = fl.out;
    struct ck_pack_opts o = {
        .format = fl.format,
        .src_format = fl.src_format,
        .graph = fl.graph,
        .weights = fl.weights,
        .weights_key = "--weights",
        .w = {.level = fl.level,
              .sign_key = fl.sign_key,
              .tag = fl.tag,
              .ref = fl.ref,
              .dtype = fl.dtype},
    };
    ck_cli_setup_logging(&cli, -1, -1);
    if (argc - optind != 1 || !out)
        return ck_cli_usage_error("pack", "expected SRC and -o OUT");
    if (o.weights && !o.graph)
        return ck_cli_usage_error("pack", "--weights goes with --graph (a layer list)");
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
