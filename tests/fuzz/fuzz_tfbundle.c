/* libFuzzer: the TF v2 bundle reader. The input is a 4-byte little-endian
 * length N, N bytes of PREFIX.index, and the rest as the single data shard
 * PREFIX.data-00000-of-00001 (seeds: tests/fuzz/seeds.py). */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char prefix[600], index[700], shard[700];
    size_t n = 0;
    if (size >= 4)
        n = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
    data += size >= 4 ? 4 : size;
    size -= size >= 4 ? 4 : size;
    if (n > size)
        n = size;
    snprintf(prefix, sizeof prefix, "%s/model", ck_fuzz_dir());
    snprintf(index, sizeof index, "%s.index", prefix);
    snprintf(shard, sizeof shard, "%s.data-00000-of-00001", prefix);
    ck_fuzz_write(index, data, n);
    ck_fuzz_write(shard, data + n, size - n);
    ck_fuzz_open(prefix, "tf-bundle");
    unlink(index);
    unlink(shard);
    return 0;
}
