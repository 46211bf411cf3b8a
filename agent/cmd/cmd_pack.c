/* ckptd pack SRC -o OUT: a checkpoint as a deployment archive, through the
 * writers table (agent/pack.h), so a new format is a row there, not here. */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "agent/config.h"
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
    "       ckptd pack SRC --dir DIR ... (or pack.dir in the config)\n"
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
    "\n"
    "The pack.* keys of the config (-c FILE) apply as the sidecar applies them:\n"
    "pack.formats, pack.graph, pack.weights, pack.sign_key, pack.dir; a flag overrides its key.\n"
    "Without -o, each format of pack.formats (default mldef) is written into\n"
    "pack.dir, named as the sidecar names it: REF.mldef, MODEL.zip (model.name,\n"
    "else REF).\n"
    "\n";

struct pack_flags {
    const char *out, *src_format, *tag, *ref, *dtype;
    int level; /* -1: the format's default */
    const char *weights_origin; /* what set pack.weights, for messages: "--weights" or the key */
};

#define O(f) offsetof(struct pack_flags, f)
#define LEVEL(d, h)                                                                                \
    {                                                                                              \
        "level-" #d, (char)('0' + (d)), CK_OPT_VALUE, NULL, NULL, O(level), d, NULL, h             \
    }
static const struct ck_opt options[] = {
    {"output", 'o', CK_OPT_STR, NULL, NULL, O(out), 0, "FILE", "the archive to write"},
    {"format", 0, CK_OPT_CONFIG, "pack.formats", NULL, 0, 0, "NAME",
     "archive format (default mldef; the list below)"},
    {"graph", 0, CK_OPT_CONFIG, "pack.graph", NULL, 0, 0, "FILE",
     "the layer list (YAML) of a weight-only checkpoint"},
    {"dir", 0, CK_OPT_CONFIG, "pack.dir", NULL, 0, 0, "DIR",
     "without -o: write the archive into DIR"},
    {"weights", 0, CK_OPT_CONFIG, "pack.weights", NULL, 0, 0, "PREFIX",
     "a training checkpoint's container of the model's\ntensors (state_dict, model, ema, ...) "
     "or a dotted\nprefix; default: found"},
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
    {"sign-key", 0, CK_OPT_CONFIG, "pack.sign_key", NULL, 0, 0, "REF",
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

/* The archive of one format: to out, or into pack.dir named as the sidecar names it. */
static int pack_one(const struct ck_config *cfg, const struct pack_flags *fl, const char *src,
                    const char *format, const char *ref, bool verbose)
{
    const struct ck_writer_ops *ops = ck_writer_find(format);
    char path[4096], name[600];
    const char *out = fl->out;
    if (!out) {
        /* anything but [A-Za-z0-9._-] as '_', as agent/deploy.c names archives */
        const char *base = !strcmp(format, "samediff") && cfg->model_name ? cfg->model_name : ref;
        size_t i = 0;
        for (; base[i] && i + 1 < 512; i++) {
            char c = base[i];
            bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '-' || c == '_';
            name[i] = ok && !(i == 0 && c == '.') ? c : '_';
        }
        snprintf(name + i, sizeof name - i, "%s", ops->extension);
        int err = ck_mkdirs(cfg->pack_dir, 0755);
        if (err == 0)
            err = ck_path_join(path, sizeof path, cfg->pack_dir, name);
        if (err < 0)
            return ck_cli_fail("pack", err);
        out = path;
    }
    struct ck_pack_opts o = {
        .format = format,
        .src_format = fl->src_format,
        .graph = cfg->pack_graph_file,
        .graph_text = cfg->pack_graph_yaml,
        .graph_label = cfg->pack_graph_label,
        .weights = cfg->pack_weights,
        .weights_key = fl->weights_origin,
        .w = {.level = fl->level,
              .sign_key = cfg->pack_sign_key,
              .tag = fl->tag,
              .ref = ref,
              .dtype = fl->dtype,
              .verbose = verbose},
    };
    struct ck_pack_result r;
    int err = ck_pack(src, out, &o, &r);
    if (err < 0)
        return ck_cli_fail("pack", err);
    if (r.samediff.tag[0])
        printf("%s: tag %s: %zu parameters written, %zu shared with earlier tags\n", out,
               r.samediff.tag, r.samediff.params, r.samediff.shared);
    ck_info("archive.packed", "path=\"%s\" format=%s bytes=%llu layers=%zu%s", out, format,
            (unsigned long long)r.size, r.nlayers, o.w.sign_key ? " signed=yes" : "");
    return CK_EXIT_OK;
}

int ck_cmd_pack(int argc, char **argv)
{
    struct ck_cli cli;
    struct pack_flags fl = {.level = -1};
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
    fl.weights_origin = "pack.weights";
    for (size_t i = 0; i < cli.noverrides; i++)
        if (!strcmp(cli.overrides[i].key, "pack.weights"))
            fl.weights_origin = "--weights";
    /* the config's pack.* keys, the flags over them (one table: agent/config.c) */
    struct ck_config cfg;
    int err = ck_config_for_dir(&cfg, cli.config_path, NULL);
    if (err == 0)
        err = ck_config_apply(&cfg, cli.overrides, cli.noverrides);
    ck_cli_setup_logging(&cli, cfg.log_format, cfg.log_level);
    if (err < 0) {
        ck_config_release(&cfg);
        return ck_cli_fail("pack", err);
    }
    rc = CK_EXIT_OK;
    if (argc - optind != 1 || (!fl.out && !cfg.pack_dir))
        rc = ck_cli_usage_error("pack", "expected SRC and -o OUT (or --dir, pack.dir)");
    else if (fl.out && cfg.pack_formats.n > 1)
        rc = ck_cli_usage_error("pack",
                                "pack.formats names %zu formats and -o one archive: give "
                                "--format",
                                cfg.pack_formats.n);
    else if (cfg.pack_weights && !cfg.pack_graph_file && !cfg.pack_graph_yaml)
        rc = ck_cli_usage_error("pack", "--weights goes with --graph (a layer list)");
    else if (fl.src_format && !ck_reader_find(fl.src_format))
        rc = ck_cli_usage_error("pack", "unknown --src-format '%s'", fl.src_format);
    if (rc != CK_EXIT_OK) {
        ck_config_release(&cfg);
        return rc;
    }
    char ref[256];
    if (fl.ref) {
        snprintf(ref, sizeof ref, "%s", fl.ref);
    } else {
        /* The checkpoint's reference, for a tag: its file name without the extension. */
        snprintf(ref, sizeof ref, "%s", ck_basename(argv[optind]));
        char *dot = strrchr(ref, '.');
        if (dot && dot != ref)
            *dot = 0;
    }
    size_t n = cfg.pack_formats.n ? cfg.pack_formats.n : 1;
    for (size_t i = 0; i < n && rc == CK_EXIT_OK; i++)
        rc = pack_one(&cfg, &fl, argv[optind],
                      cfg.pack_formats.n ? cfg.pack_formats.items[i] : "mldef", ref,
                      cli.log_level >= 0);
    ck_config_release(&cfg);
    return rc;
}
