/* libFuzzer: what the credential chain and the S3 client parse from a
 * server or a user's files: the JSON of the container and instance metadata
 * services and IAM Identity Center (its token cache, its portal's answer),
 * the XML of STS and S3 answers (one tag's text, entities
 * decoded; a ListParts page, a ListObjectsV2 page), ISO 8601 expirations, Retry-After, the AWS CLI's INI files
 * (~/.aws/config and credentials) and the splitting of a credential_process
 * line. An endpoint can be hostile or broken; the
 * input is copied to the heap with its terminator and nothing after it, so
 * a read past the end shows up under ASan. */
#include "fuzz_common.h"
#include "stores/awsconfig.h"
#include "stores/awscred.h"
#include "stores/awsprocess.h"
#include "stores/net.h"
#include "stores/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    char out[2048], small[8];
    static const char *const keys[] = {"Code",  "AccessKeyId", "SecretAccessKey",
                                       "Token", "Expiration",  "UploadId"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        if (ck_awscred_json_str(s, keys[i], out, sizeof out))
            (void)ck_awscred_parse_time(out);
        (void)ck_awscred_json_str(s, keys[i], small, sizeof small);
        if (ck_xml_tag(s, keys[i], out, sizeof out))
            (void)ck_awscred_is_expired_code(out);
        (void)ck_xml_tag(s, keys[i], small, sizeof small);
    }
    long long v;
    (void)ck_awscred_json_int(s, "Version", &v);
    struct ck_awskeys k; /* IAM Identity Center's token cache and portal answer */
    if (ck_awscred_sso_cache_parse(s, "fuzz", out, sizeof out, &v) == 0)
        (void)ck_awscred_sso_cache_parse(s, "fuzz", small, sizeof small, &v);
    (void)ck_awscred_sso_answer_parse(s, "fuzz", &k, &v);
    ck_awskeys_wipe(&k);
    (void)ck_awscred_parse_time(s);
    char **argv = NULL; /* a credential_process line */
    if (ck_awsprocess_split(s, "fuzz", &argv) == 0)
        ck_awsprocess_argv_free(argv);
    (void)ck_parse_retry_after(s, 1795507200LL);
    struct ck_part *parts = NULL; /* a ListParts page */
    size_t nparts = 0;
    int next = 0;
    (void)ck_s3_list_parts_parse(s, &parts, &nparts, &next);
    free(parts);
    struct ck_remote_list objs = {0}; /* a ListObjectsV2 page, under a prefix and not */
    bool more;
    char token[1024];
    (void)ck_s3_list_objects_parse(s, "runs/r1/", &objs, &more, token, sizeof token);
    (void)ck_s3_list_objects_parse(s, "", &objs, &more, small, sizeof small);
    ck_remote_list_release(&objs);

    char path[600];
    snprintf(path, sizeof path, "%s/config", ck_fuzz_dir());
    ck_fuzz_write(path, data, size);
    struct ck_awsini *ini = NULL;
    if (ck_awsini_load(&ini, path) == 0 && ini) {
        const char *sec = ck_awsini_first_section(ini);
        if (sec) {
            (void)ck_awsini_get(ini, sec, "region");
            (void)ck_awsini_has_section(ini, sec);
        }
        (void)ck_awsini_get(ini, "default", "aws_access_key_id");
        (void)ck_awsini_get(ini, "profile dev", "endpoint_url");
    }
    ck_awsini_free(ini);
    unlink(path);
    free(s);
    ck_error_clear();
    return 0;
}
