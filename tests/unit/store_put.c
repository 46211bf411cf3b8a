/* store_put: one ck_store_put of FILE to KEY of a store, for end-to-end tests
 * of what no command sends yet (the conditional write the multi-node commit
 * will use: docs/multinode.md). The real store code against a real server:
 *
 *   store_put [--if-absent] [--endpoint URL] STORE-URL FILE KEY
 *   store_put --list [--endpoint URL] STORE-URL PREFIX
 *
 * S3 credentials from the AWS_* variables (credentials: env). Prints one
 * line, "ok check=CHECK" or "exists same_bytes=0|1" or "error: MESSAGE";
 * exits 0 (stored), 3 (exists: if-absent refused), 1 (any other failure),
 * 2 (usage). --list prints "KEY SIZE MD5|-" per object, sorted, and exits 0
 * or 1. */
#include "common/error.h"
#include "stores/net.h"
#include "stores/store.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int main(int argc, char **argv)
{
    bool if_absent = false, list = false;
    const char *endpoint = NULL;
    int i = 1;
    for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
        if (!strcmp(argv[i], "--if-absent"))
            if_absent = true;
        else if (!strcmp(argv[i], "--list"))
            list = true;
        else if (!strcmp(argv[i], "--endpoint") && i + 1 < argc)
            endpoint = argv[++i];
        else
            break;
    }
    if (argc - i != (list ? 2 : 3)) {
        fprintf(stderr, "usage: store_put [--if-absent] [--endpoint URL] STORE-URL FILE KEY\n"
                        "       store_put --list [--endpoint URL] STORE-URL PREFIX\n");
        return 2;
    }
    const char *url = argv[i], *file = list ? "/dev/null" : argv[i + 1],
               *key = list ? argv[i + 1] : argv[i + 2];
    struct stat st;
    if (stat(file, &st) < 0) {
        perror(file);
        return 2;
    }
    struct ck_store_spec spec = {0};
    int err = ck_store_spec_set(&spec, "url", url);
    if (err == 0 && strncmp(url, "s3:", 3) == 0)
        err = ck_store_spec_set(&spec, "credentials", "env");
    if (err == 0 && endpoint)
        err = ck_store_spec_set(&spec, "endpoint", endpoint);
    struct ck_upload_opts opts;
    ck_upload_opts_init(&opts);
    opts.retries = 2;
    opts.retry_base = 0.1;
    struct ck_upload_ctl ctl;
    ck_upload_ctl_init(&ctl, 5);
    struct ck_net net;
    struct ck_store *store = NULL;
    struct ck_xfer x;
    memset(&x, 0, sizeof x);
    x.id = 1;
    x.path = file;
    x.key = key;
    x.size = (uint64_t)st.st_size;
    x.if_absent = if_absent;
    struct ck_remote_list l = {0};
    if (err == 0 && (err = ck_net_init(&net, &opts, &ctl)) == 0) {
        if ((err = ck_store_open(&store, &spec, &net)) == 0)
            err = list ? ck_store_list(store, key, &l) : ck_store_put(store, &x);
        ck_store_free(store);
        ck_net_release(&net);
    }
    ck_store_spec_release(&spec);
    if (err == 0 && list) {
        for (size_t k = 0; k < l.n; k++)
            printf("%s %lld %s\n", l.v[k].key, (long long)l.v[k].size,
                   l.v[k].md5[0] ? l.v[k].md5 : "-");
        ck_remote_list_release(&l);
        return 0;
    }
    if (err == 0) {
        printf("ok check=%s\n", x.check ? x.check : "none");
        return 0;
    }
    if (err == CK_EEXIST) {
        printf("exists same_bytes=%d\n", x.same_bytes ? 1 : 0);
        fprintf(stderr, "%s\n", ck_error_msg());
        return 3;
    }
    printf("error: %s\n", ck_error_msg());
    return 1;
}
