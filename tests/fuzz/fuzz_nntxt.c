/* libFuzzer: the protobuf text-format parser alone (every scalar converted),
 * then the same bytes as a bare network.nntxt through the NNabla reader. */
#include "fuzz_common.h"
#include "readers/nntxt.h"

#include <stdbool.h>

static void walk(const struct ck_nntxt *n)
{
    for (; n; n = n->next) {
        int64_t i;
        double d;
        bool b;
        const char *s;
        if (n->kind == CK_NNTXT_MSG) {
            (void)ck_nntxt_count(n, "dim");
            walk(n->child);
            continue;
        }
        (void)ck_nntxt_int(n, "fuzz", &i);
        (void)ck_nntxt_double(n, "fuzz", &d);
        (void)ck_nntxt_bool(n, "fuzz", &b);
        (void)ck_nntxt_str(n, "fuzz", &s);
        (void)ck_nntxt_next(n);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ck_nntxt *root = NULL;
    if (ck_nntxt_parse((const char *)data, size, "fuzz", &root) == 0)
        walk(root);
    ck_nntxt_free(root);
    ck_error_clear();
    char path[600];
    snprintf(path, sizeof path, "%s/network.nntxt", ck_fuzz_dir());
    ck_fuzz_write(path, data, size);
    ck_fuzz_open(path, "nnp");
    unlink(path);
    return 0;
}
