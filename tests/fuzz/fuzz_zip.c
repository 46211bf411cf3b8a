/* libFuzzer: the zip layer itself, as every zip-based reader uses it
 * (readers/zipin: .nnp, SameDiff archives, .npz, PyTorch's zip form, .mldef):
 * the central directory (libzip, then ckptd's name checks), the local
 * headers of stored members read in place (their offsets from the
 * directory, each header's name and the bytes' extent), every member read
 * under a size cap (CRC and true size checked), data descriptors included;
 * and the layout check every reader relies on (ck_zipin_layout: local headers
 * against the directory, order, overlaps, claimed sizes) and the member check
 * of inspect --verify and mldef -i (ck_zipin_check_members: every member
 * inflated no further than it declares) on the raw bytes, whether or not
 * libzip opens them. A member ckptd accepts must have a safe name. */
#include "fuzz_common.h"
#include "readers/zipin.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600];
    struct ck_zipin zi;
    snprintf(path, sizeof path, "%s/input.zip", ck_fuzz_dir());
    ck_fuzz_write(path, data, size);
    (void)ck_zipin_is_zip(data, size);
    struct ck_zipin_member *v = NULL;
    uint64_t nv = 0;
    if (ck_zipin_layout(path, data, size, 1u << 20, &v, &nv) == 0) {
        for (uint64_t i = 0; i < nv; i++) /* what it accepts lies inside the input, in order */
            if (v[i].data > size || v[i].csize > size - v[i].data || v[i].usize > 1u << 20 ||
                (i && v[i].local < v[i - 1].data + v[i - 1].csize))
                abort();
        (void)ck_zipin_check_members(path, data, size, 1u << 20, NULL);
    }
    free(v);
    if (ck_zipin_open(&zi, path) == 0) {
        struct ck_tensor_set *s = ck_tensor_set_new("zip", path);
        uint64_t *offs = NULL;
        const unsigned char *base = NULL;
        uint64_t len = 0;
        if (!s)
            abort();
        for (uint64_t i = 0; i < zi.nentries && i < 64; i++) {
            const char *name = ck_zipin_name(&zi, i);
            const unsigned char *member = NULL;
            uint64_t n = 0, at = 0;
            if (name && !ck_zipin_name_is_safe(name))
                abort(); /* ck_zipin_open refuses an archive with such a name */
            if (name && ck_zipin_find(&zi, name, &at) < 0)
                abort(); /* every listed member can be found by its name */
            if (ck_zipin_read(&zi, s, i, 1u << 20, &member, &n) == 0 && n && member)
                (void)member[n - 1];
        }
        if (ck_tensor_set_map_file(s, path, &base, &len) == 0 &&
            ck_zipin_local_offsets(s, base, len, zi.nentries, &offs) == 0) {
            for (uint64_t i = 0; i < zi.nentries && i < 64; i++) {
                const char *name = ck_zipin_name(&zi, i);
                const unsigned char *member = NULL;
                if (name && ck_zipin_stored(s, base, len, offs[i], name, 16, &member) == 0)
                    (void)member[15];
            }
            (void)ck_zipin_check_crcs(s, NULL);
        }
        ck_tensor_set_free(s);
        ck_zipin_close(&zi);
    }
    ck_error_clear();
    unlink(path);
    return 0;
}
