/* libFuzzer: the reader of test sets recorded under a SameDiff tag
 * (readers/sdtests.c). The input is a set.txt, then the bytes 0xff 0xfe,
 * then member names (one per line) of the archive the target writes with
 * ckptd's zip writer: tags.txt ("t0", "t1"), <t0>/tests/rec0/set.txt from
 * the input, and each named member holding a small valid FlatArray. So the
 * fuzzer works on what this reader owns, set.txt and the layout of the
 * members (FlatArray parsing itself is fuzz_samediff's). Both loads run:
 * t0's sets, and t1's, which has none and falls back to t0's. */
#include "fuzz_common.h"
#include "readers/sdtests.h"
#include "writers/fbbuild.h"
#include "writers/sdarray.h"
#include "writers/zipapp.h"

static void add_array(struct ck_zipapp *z, const char *member)
{
    static const float v[6] = {1, -2, 3.5f, 0, 7, -0.25f};
    struct ck_tensor t;
    struct ck_fbb b;
    float scale;
    memset(&t, 0, sizeof t);
    t.name = (char *)"a";
    t.dtype = CK_DT_F32;
    t.rank = 2;
    t.dims[0] = 2;
    t.dims[1] = 3;
    t.data = (const unsigned char *)v;
    t.nbytes = sizeof v;
    ck_fbb_init(&b);
    if (ck_sdarray_file(&b, &t, CK_DT_INVALID, member, &scale) >= 0)
        (void)ck_zipapp_add(z, member, b.p, b.len);
    ck_fbb_release(&b);
}

static void touch(const struct ck_sdtests *t)
{
    for (size_t i = 0; i < t->n; i++)
        for (int out = 0; out < 2; out++) {
            const struct ck_sdtest_array *a = out ? t->sets[i].out : t->sets[i].in;
            size_t n = out ? t->sets[i].nout : t->sets[i].nin;
            for (size_t k = 0; k < n; k++) {
                uint64_t numel;
                if (ck_tensor_numel(&a[k].t, &numel) == 0 && numel)
                    (void)ck_tensor_get_f64(&a[k].t, numel - 1);
            }
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600], spec[620];
    size_t cut = size;
    for (size_t i = 0; i + 1 < size; i++)
        if (data[i] == 0xff && data[i + 1] == 0xfe) {
            cut = i;
            break;
        }
    snprintf(path, sizeof path, "%s/run.zip", ck_fuzz_dir());
    struct ck_zipapp z;
    if (ck_zipapp_create(&z, path, 0600) < 0)
        abort();
    (void)ck_zipapp_add(&z, "tags.txt", "t0\nt1\n", 6);
    (void)ck_zipapp_add(&z, "t0/tests/rec0/set.txt", data, cut);
    /* the member names: at most 64 lines of at most 200 bytes */
    const char *p = (const char *)data + (cut + 2 <= size ? cut + 2 : size);
    const char *end = (const char *)data + size;
    for (int lines = 0; p < end && lines < 64; lines++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = (size_t)((nl ? nl : end) - p);
        char name[201];
        if (len && len < sizeof name) {
            memcpy(name, p, len);
            name[len] = '\0';
            if (!memchr(name, '\0', len) && !ck_zipapp_find(&z, name))
                add_array(&z, name);
        }
        p += len + 1;
    }
    ck_error_clear();
    if (ck_zipapp_commit(&z) < 0) {
        ck_error_clear();
        unlink(path);
        return 0;
    }
    struct ck_sdtests t;
    if (ck_sdtests_load(path, &t) == 0) {
        touch(&t);
        ck_sdtests_release(&t);
    }
    snprintf(spec, sizeof spec, "%s#t1", path);
    if (ck_sdtests_load_latest(spec, &t) == 0) {
        touch(&t);
        ck_sdtests_release(&t);
    }
    ck_error_clear();
    unlink(path);
    return 0;
}
