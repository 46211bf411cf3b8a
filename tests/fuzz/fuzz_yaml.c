/* libFuzzer: the YAML files ckptd reads from a user or a training folder:
 * its config (ckptd.yaml: every key's parser, the checkpoint patterns, inline
 * layer lists), and a PMF metadata.yaml as a trainer, a user or a crash may
 * have left it (parsed, validated; what parses must emit again and parse
 * back to the same text), and a multi-node part manifest or commit record
 * as a shared store may hand it back (agent/nodeparts.h: the same round trip). */
#include "fuzz_common.h"
#include "agent/config.h"
#include "agent/nodeparts.h"
#include "common/buf.h"
#include "writers/pmf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ckptd.yaml", ck_fuzz_dir());
    ck_fuzz_write(path, data, size);
    struct ck_config cfg;
    ck_config_init(&cfg);
    (void)ck_config_load(&cfg, path);
    ck_config_release(&cfg);
    ck_error_clear();
    unlink(path);

    struct ck_pmf_meta m;
    ck_pmf_meta_init(&m);
    if (ck_pmf_parse(&m, "metadata.yaml", (const char *)data, size) == 0) {
        struct ck_buf a = CK_BUF_INIT, b = CK_BUF_INIT;
        struct ck_pmf_meta again;
        ck_pmf_meta_init(&again);
        if (ck_pmf_emit(&m, &a) == 0) {
            /* what ckptd writes it must read back, and write the same way */
            if (ck_pmf_parse(&again, "emitted", a.data, a.len) < 0 || ck_pmf_emit(&again, &b) < 0 ||
                a.len != b.len || memcmp(a.data, b.data, a.len))
                abort();
        }
        ck_pmf_meta_release(&again);
        ck_buf_release(&a);
        ck_buf_release(&b);
    }
    ck_pmf_meta_release(&m);
    ck_error_clear();

    struct ck_nodepart p;
    if (ck_nodepart_parse(&p, "part.yaml", (const char *)data, size) == 0) {
        struct ck_buf a = CK_BUF_INIT, b = CK_BUF_INIT;
        struct ck_nodepart again;
        if (ck_nodepart_emit(&p, &a) < 0 || ck_nodepart_parse(&again, "emitted", a.data, a.len) < 0)
            abort();
        if (ck_nodepart_emit(&again, &b) < 0 || a.len != b.len || memcmp(a.data, b.data, a.len))
            abort();
        /* a step of this one part commits, and its record reads back */
        struct ck_nodecommit c, c2;
        char md5[1][33] = {"00000000000000000000000000000000"};
        p.rank = 0;
        p.count = 1;
        ck_buf_reset(&b);
        if (ck_nodecommit_build(&c, &p, 1, (const char(*)[33])md5) == 0) {
            if (ck_nodecommit_emit(&c, &b) < 0 ||
                ck_nodecommit_parse(&c2, "record", b.data, b.len) < 0)
                abort();
            ck_nodecommit_release(&c2);
            ck_nodecommit_release(&c);
        }
        ck_nodepart_release(&again);
        ck_nodepart_release(&p);
        ck_buf_release(&a);
        ck_buf_release(&b);
    }
    ck_error_clear();
    struct ck_nodecommit r;
    if (ck_nodecommit_parse(&r, "record.yaml", (const char *)data, size) == 0) {
        struct ck_buf a = CK_BUF_INIT;
        struct ck_nodecommit again;
        if (ck_nodecommit_emit(&r, &a) < 0 ||
            ck_nodecommit_parse(&again, "emitted", a.data, a.len) < 0)
            abort();
        ck_nodecommit_release(&again);
        ck_nodecommit_release(&r);
        ck_buf_release(&a);
    }
    ck_error_clear();
    return 0;
}
