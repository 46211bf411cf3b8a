/* libFuzzer: the .mldef validator and loader (readers/mldefcheck.c) on a
 * hostile manifest.json outside a zip, checked against a fixed set of files
 * beside it (binary data files of both widths and of an odd length, a csv,
 * test files, a license): every rule's walk, then the model it builds when
 * nothing was broken, its shapes, and a run of it through the CPU engine. The input is the
 * manifest, and what follows a NUL byte in it (which no manifest holds) is written as the SIGNATURE
 * beside it. The validator maps the files and reads the manifest through the same code as a zip's.
 */
#include "fuzz_common.h"
#include "readers/mldefcheck.h"

#include <sys/stat.h>

static const char *folder(void)
{
    static char dir[700];
    if (dir[0])
        return dir;
    snprintf(dir, sizeof dir, "%s/m", ck_fuzz_dir());
    char p[800];
    static const char *const sub[] = {"", "/data", "/tests"};
    for (size_t i = 0; i < sizeof sub / sizeof *sub; i++) {
        snprintf(p, sizeof p, "%s%s", dir, sub[i]);
        if (mkdir(p, 0700) < 0)
            abort();
    }
    static float f32[256];
    static double f64[64];
    for (int i = 0; i < 256; i++)
        f32[i] = (float)(i % 17) / 8.0f - 1.0f;
    for (int i = 0; i < 64; i++)
        f64[i] = (double)(i % 5) - 2.0;
#define TEXT(s) s, sizeof s - 1
    static const struct {
        const char *name;
        const void *data;
        size_t len;
    } files[] = {
        {"data/w000.float32", f32, sizeof f32},
        {"data/w001.float64", f64, sizeof f64},
        {"data/w002.float32", f32, 10}, /* not a whole number of points */
        {"data/w003.csv", TEXT("1,2.5,-3\n4e1,nan,inf\n0x10,  7\n")},
        {"tests/case0x.float32", f32, 64},
        {"tests/case0y.float32", f32 + 16, 32},
        {"tests/case1.csv", TEXT("0.5,0.25\n1,2\n")},
        {"license.txt", TEXT("MIT\n")},
    };
#undef TEXT
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i].name);
        ck_fuzz_write(p, files[i].data, files[i].len);
    }
    return dir;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[800], sig[800];
    snprintf(path, sizeof path, "%s/manifest.json", folder());
    snprintf(sig, sizeof sig, "%s/SIGNATURE", folder());
    const uint8_t *nul = memchr(data, 0, size);
    size_t mlen = nul ? (size_t)(nul - data) : size;
    ck_fuzz_write(path, data, mlen);
    if (nul)
        ck_fuzz_write(sig, nul + 1, size - mlen - 1);
    static const unsigned char key[32] = {1, 2, 3};
    struct ck_mldef_check_opts o = {.trusted_pub = size % 2 ? key : NULL,
                                    .require_signature = nul && size % 3 == 0};
    struct ck_mldef_report r;
    struct ck_model *m = NULL;
    if (ck_mldef_check(path, &o, &r, &m) == 0) {
        for (size_t i = 0; i < r.n; i++)
            if (!r.v[i].rule || !r.v[i].where || !r.v[i].msg)
                abort(); /* every violation names its rule, place and reason */
        ck_mldef_report_release(&r);
    }
    if (m) {
        struct ck_model_shapes sh;
        if (ck_model_infer_shapes(m, &sh) == 0) {
            ck_model_shapes_release(&sh);
            ck_fuzz_run_model(m);
        }
        ck_model_free(m);
    }
    char **names = NULL;
    size_t n = 0;
    if (ck_mldef_manifest_files(path, &names, &n) == 0) {
        for (size_t i = 0; i < n; i++)
            free(names[i]);
        free(names);
    }
    unlink(path);
    unlink(sig);
    ck_error_clear();
    return 0;
}
