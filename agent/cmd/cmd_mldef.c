/* The `mldef` command line (the seed's option table; docs/mldef.md), a
 * second executable beside ckptd (also reached as ckptd's argv[0] alias). */
#include "agent/cmd/cmd_mldef.h"
#include "agent/cmd/mldef_run.h"
#include "agent/pack.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/sign.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char help[] =
    "usage: mldef <options> <manifest file>\n"
    "       mldef <options> <mldef file>\n"
    "\n"
    "  -h, --help              this help\n"
    "  -v, --verbose           more logs while working (statistics with -r)\n"
    "  -c, --create            create an .mldef from the manifest.json given, with the files\n"
    "                          it names taken from beside it; to stdout unless -f. Every rule\n"
    "                          is checked first: nothing is written when one is broken\n"
    "  -f, --file FILE         write to FILE instead of stdout (with -c or -r); FILE is\n"
    "                          written to a temporary name and renamed when complete\n"
    "  -0 .. -9                zip level with -c: -0 stores data uncompressed (the default,\n"
    "                          so a device can map it), -9 compresses most\n"
    "  -s, --signature         with -c: sign (SIGNATURE, needs --key); on an .mldef: verify\n"
    "                          its SIGNATURE (with --pubkey: also that this key signed it)\n"
    "  -i, --inspect           check every rule of the manifest (outside a zip: against the\n"
    "                          files beside it) or the .mldef, listing every violation\n"
    "  -r, --run TESTDATA      run the model of the .mldef on TESTDATA ('-' for stdin),\n"
    "                          outputs on stdout or -f FILE; one sample = the values of\n"
    "                          every input (model order, C order, no batch dimension);\n"
    "                          output: per sample, every output's values. With -v: each\n"
    "                          layer's time and the totals on stderr\n"
    "  -o, --output-format F   -r output: csv (default: one sample per line, values\n"
    "                          comma separated) or binary (float32 little-endian)\n"
    "      --input-format F    -r input: csv or binary (default: csv when TESTDATA ends in\n"
    "                          .csv, else binary). Long form only: the seed gives -i to\n"
    "                          both --inspect and --input-format; -i means --inspect here\n"
    "      --key FILE          the Ed25519 private key for -c -s (from `ckptd keygen`)\n"
    "      --pubkey FILE       the trusted public key for -s or -i\n"
    "      --json              -i and -s: the report as one JSON document\n"
    "\n"
    "exit codes: 0 ok, 1 invalid (a rule broken, a bad signature) or the work failed,\n"
    "            2 usage error\n"
    "The format: docs/mldef.md.\n";

enum { O_INFMT = 1000, O_KEY, O_PUBKEY, O_JSON };

struct opts {
    bool create, sign, inspect, json, verbose;
    const char *file, *run, *outfmt, *infmt, *key, *pubkey;
    int level;
};

static int usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mldef: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n'mldef --help' lists the options\n");
    return CK_EXIT_USAGE;
}

static int fail(int err)
{
    fprintf(stderr, "mldef: %s\n", ck_error_msg());
    return ck_exit_code(err);
}

static int copy_to_stdout(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(CK_EIO, "cannot open '%s'", path);
    char buf[1 << 16];
    int err = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n < 0)
                err = ck_error_os(CK_EIO, "cannot read '%s'", path);
            break;
        }
        if (fwrite(buf, 1, (size_t)n, stdout) != (size_t)n) {
            err = ck_error_os(CK_EIO, "cannot write to stdout");
            break;
        }
    }
    close(fd);
    if (fflush(stdout) != 0 && err == 0)
        err = ck_error_os(CK_EIO, "cannot write to stdout");
    return err;
}

static int create(const struct opts *o, const char *manifest)
{
    const char *key = o->sign ? o->key : NULL;
    if (o->file) {
        int err = ck_pack_mldef_from_manifest(manifest, o->file, o->level, key, stderr);
        if (err == 0 && o->verbose)
            ck_info("mldef.created", "path=\"%s\"", o->file);
        return err < 0 ? fail(err) : CK_EXIT_OK;
    }
    if (isatty(STDOUT_FILENO))
        return usage("%s", "not writing a zip archive to a terminal: redirect stdout or use -f");
    /* libzip needs a seekable file: build it in a private folder, then copy. */
    const char *tmpdir = getenv("TMPDIR");
    char tdir[4096], full[4200];
    snprintf(tdir, sizeof tdir, "%s/mldef.XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    if (!mkdtemp(tdir))
        return fail(ck_error_os(CK_EIO, "cannot create a temporary folder"));
    snprintf(full, sizeof full, "%s/out.mldef", tdir);
    int err = ck_pack_mldef_from_manifest(manifest, full, o->level, key, stderr);
    if (err == 0)
        err = copy_to_stdout(full);
    unlink(full);
    rmdir(tdir);
    return err < 0 ? fail(err) : CK_EXIT_OK;
}

static int check(const struct opts *o, const char *path, bool signature)
{
    struct ck_sign_key pub;
    struct ck_mldef_check_opts co = {.require_signature = signature};
    if (o->pubkey) {
        int err = ck_sign_load(o->pubkey, &pub);
        if (err < 0)
            return fail(err);
        co.trusted_pub = pub.pub;
    }
    struct ck_mldef_report r;
    struct ck_model *m = NULL;
    int err = ck_mldef_check(path, &co, &r, &m);
    if (err == 0 && m) /* valid means ckptd's engine runs it (`ckptd verify`) */
        err = ck_pack_check_runnable(&r, m);
    ck_model_free(m);
    if (err < 0) {
        ck_mldef_report_release(&r);
        return fail(err);
    }
    ck_pack_print_report(r.n ? stderr : stdout, path, &r, o->json);
    int rc = (r.n || r.dropped) ? CK_EXIT_FAILED : CK_EXIT_OK;
    ck_mldef_report_release(&r);
    return rc;
}

static bool is_fmt(const char *f)
{
    return strcmp(f, "csv") == 0 || strcmp(f, "binary") == 0;
}

int ck_mldef_main(int argc, char **argv)
{
    static const struct option longopts[] = {{"help", no_argument, NULL, 'h'},
                                             {"verbose", no_argument, NULL, 'v'},
                                             {"create", no_argument, NULL, 'c'},
                                             {"file", required_argument, NULL, 'f'},
                                             {"signature", no_argument, NULL, 's'},
                                             {"inspect", no_argument, NULL, 'i'},
                                             {"run", required_argument, NULL, 'r'},
                                             {"output-format", required_argument, NULL, 'o'},
                                             {"input-format", required_argument, NULL, O_INFMT},
                                             {"key", required_argument, NULL, O_KEY},
                                             {"pubkey", required_argument, NULL, O_PUBKEY},
                                             {"json", no_argument, NULL, O_JSON},
                                             {NULL, 0, NULL, 0}};
    struct opts o = {.level = -1};
    bool level_given = false;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":hvcf:0123456789sir:o:", longopts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            fputs(help, stdout);
            return CK_EXIT_OK;
        case 'v':
            o.verbose = true;
            break;
        case 'c':
            o.create = true;
            break;
        case 'f':
            o.file = optarg;
            break;
        case 's':
            o.sign = true;
            break;
        case 'i':
            o.inspect = true;
            break;
        case 'r':
            o.run = optarg;
            break;
        case 'o':
            if (!is_fmt(optarg))
                return usage("--output-format '%s': csv or binary", optarg);
            o.outfmt = optarg;
            break;
        case O_INFMT:
            if (!is_fmt(optarg))
                return usage("--input-format '%s': csv or binary", optarg);
            o.infmt = optarg;
            break;
        case O_KEY:
            o.key = optarg;
            break;
        case O_PUBKEY:
            o.pubkey = optarg;
            break;
        case O_JSON:
            o.json = true;
            break;
        case ':':
            return usage("option '%s' needs an argument", argv[optind - 1]);
        case '?':
            return usage("unknown option '%s'", argv[optind - 1]);
        default:
            if (opt >= '0' && opt <= '9') {
                o.level = opt - '0';
                level_given = true;
                break;
            }
            return usage("unknown option '%s'", argv[optind - 1]);
        }
    }
    ck_log_setup(CK_LOG_TEXT, o.verbose ? CK_LOG_DEBUG : CK_LOG_WARN, stderr);
    if (argc - optind != 1)
        return usage("%s", "expected one manifest.json or .mldef file");
    const char *path = argv[optind];
    int modes =
        o.create + (o.run != NULL) + (o.inspect && !o.create) + (o.sign && !o.create && !o.inspect);
    if (modes == 0)
        return usage("%s", "nothing to do: give -c, -i, -s or -r");
    if (modes > 1)
        return usage("%s", "give one of -c, -i, -s and -r");
    if (o.file && !o.create && !o.run)
        return usage("%s", "-f is only valid with -c or -r");
    if (level_given && !o.create)
        return usage("%s", "-0..-9 are only valid with -c");
    if ((o.outfmt || o.infmt) && !o.run)
        return usage("%s", "--output-format and --input-format are only valid with -r");
    if (o.create) {
        if (o.sign && !o.key)
            return usage("%s", "-c -s needs --key FILE (a private key from ckptd keygen)");
        return create(&o, path);
    }
    if (o.run) {
        if (strcmp(o.run, "-") != 0 && !ck_exists(o.run))
            return usage("-r: test data '%s' does not exist", o.run);
        size_t tl = strlen(o.run);
        struct ck_mldef_run_opts ro = {
            .testdata = o.run,
            .file = o.file,
            .csv_in = o.infmt ? strcmp(o.infmt, "csv") == 0
                              : tl >= 4 && strcmp(o.run + tl - 4, ".csv") == 0,
            .csv_out = !o.outfmt || strcmp(o.outfmt, "csv") == 0,
            .verbose = o.verbose,
        };
        if (!o.file && !ro.csv_out && isatty(STDOUT_FILENO))
            return usage("%s",
                         "not writing binary outputs to a terminal: redirect stdout or use -f");
        int err = ck_mldef_run(path, &ro);
        return err < 0 ? fail(err) : CK_EXIT_OK;
    }
    return check(&o, path, o.sign && !o.inspect);
}
