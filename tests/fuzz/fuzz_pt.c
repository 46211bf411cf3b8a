/* libFuzzer: the PyTorch reader. The input is the pickle (data.pkl): a
 * mutated zip would almost never pass its CRC, so the target wraps the input
 * in a stored zip laid out as torch.save lays it out, with three storages
 * (keys 0, 1, 2) of 64 bytes, and opens that with the pt reader. */
#include "fuzz_common.h"

#include <zlib.h>

static void le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

struct member {
    const char *name;
    const unsigned char *data;
    size_t len;
};

static void write_zip(const char *path, const struct member *m, size_t n)
{
    FILE *f = fopen(path, "wb");
    unsigned char h[46];
    uint64_t off[8], at = 0;
    if (!f || n > 8)
        abort();
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(m[i].name);
        uint32_t crc = (uint32_t)crc32(0, m[i].data, (uInt)m[i].len);
        memset(h, 0, 30);
        le(h, 0x04034b50, 4), le(h + 4, 20, 2), le(h + 14, crc, 4);
        le(h + 18, m[i].len, 4), le(h + 22, m[i].len, 4), le(h + 26, nl, 2);
        off[i] = at;
        fwrite(h, 1, 30, f), fwrite(m[i].name, 1, nl, f), fwrite(m[i].data, 1, m[i].len, f);
        at += 30 + nl + m[i].len;
    }
    uint64_t cd = at;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(m[i].name);
        uint32_t crc = (uint32_t)crc32(0, m[i].data, (uInt)m[i].len);
        memset(h, 0, 46);
        le(h, 0x02014b50, 4), le(h + 4, 20, 2), le(h + 6, 20, 2), le(h + 16, crc, 4);
        le(h + 20, m[i].len, 4), le(h + 24, m[i].len, 4), le(h + 28, nl, 2);
        le(h + 42, off[i], 4);
        fwrite(h, 1, 46, f), fwrite(m[i].name, 1, nl, f);
        at += 46 + nl;
    }
    memset(h, 0, 22);
    le(h, 0x06054b50, 4), le(h + 8, n, 2), le(h + 10, n, 2), le(h + 12, at - cd, 4);
    le(h + 16, cd, 4);
    fwrite(h, 1, 22, f);
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned char storage[64];
    char path[600];
    for (size_t i = 0; i < sizeof storage; i++)
        storage[i] = (unsigned char)(i * 37);
    struct member m[] = {
        {"archive/data.pkl", data, size},
        {"archive/data/0", storage, 64},
        {"archive/data/1", storage, 64},
        {"archive/data/2", storage, 64},
        {"archive/version", (const unsigned char *)"3\n", 2},
    };
    snprintf(path, sizeof path, "%s/input.pt", ck_fuzz_dir());
    write_zip(path, m, sizeof m / sizeof m[0]);
    ck_fuzz_open(path, "pt");
    unlink(path);
    return 0;
}
