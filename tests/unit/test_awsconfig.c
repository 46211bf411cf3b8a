/* stores: the AWS shared files (INI with profiles and nested settings), the
 * region and endpoint order, and the small parsers of the credential chain.
 * Expected values come from the AWS CLI's documentation of its files and
 * variables (docs.aws.amazon.com/cli/latest/userguide/cli-configure-files.html,
 * .../cli-configure-envvars.html, the SDKs' "Service-specific endpoints"),
 * ISO 8601, and Python's calendar.timegm for the epoch values. */
#include "tests/unit/test_main.h"

#include "common/clock.h"
#include "common/error.h"
#include "stores/awsconfig.h"
#include "stores/awscred.h"
#include "stores/awsprocess.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const vars[] = {"AWS_PROFILE",
                                   "AWS_DEFAULT_PROFILE",
                                   "AWS_CONFIG_FILE",
                                   "AWS_SHARED_CREDENTIALS_FILE",
                                   "AWS_REGION",
                                   "AWS_DEFAULT_REGION",
                                   "AWS_ENDPOINT_URL",
                                   "AWS_ENDPOINT_URL_S3",
                                   "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"};

static void clean_env(void)
{
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
}

static void write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static void ini_sections_and_nesting(void **state)
{
    char dir[4000], path[4100];
    ck_test_tmpdir(dir, "awsini");
    snprintf(path, sizeof path, "%s/config", dir);
    write_file(path, "# comment\n"
                     "[default]\r\n"
                     "region = us-west-2\r\n"
                     "; another comment\n"
                     "[profile   dev ]\n"
                     "region=eu-west-3\n"
                     "s3 =\n"
                     "    addressing_style = path\n"
                     "    endpoint_url = http://127.0.0.1:9000\n"
                     "output = json\n"
                     "region = eu-central-1\n"
                     "[sso-session x]\n"
                     "sso_region = us-east-1\n");
    struct ck_awsini *f = NULL;
    assert_int_equal(ck_awsini_load(&f, path), 0);
    assert_non_null(f);
    assert_string_equal(ck_awsini_get(f, "default", "region"), "us-west-2");
    /* a later line for the same key wins */
    assert_string_equal(ck_awsini_get(f, "profile dev", "region"), "eu-central-1");
    assert_string_equal(ck_awsini_get(f, "profile dev", "s3.addressing_style"), "path");
    assert_string_equal(ck_awsini_get(f, "profile dev", "s3.endpoint_url"),
                        "http://127.0.0.1:9000");
    /* the nested block ends at the next unindented key */
    assert_string_equal(ck_awsini_get(f, "profile dev", "output"), "json");
    assert_null(ck_awsini_get(f, "profile dev", "s3.output"));
    assert_null(ck_awsini_get(f, "default", "output"));
    assert_true(ck_awsini_has_section(f, "sso-session x"));
    assert_string_equal(ck_awsini_first_section(f), "default");
    ck_awsini_free(f);
    /* absent: empty, not an error */
    snprintf(path, sizeof path, "%s/none", dir);
    assert_int_equal(ck_awsini_load(&f, path), 0);
    assert_null(f);
    assert_null(ck_awsini_get(NULL, "default", "region"));
    /* a section without ']' names the file and the line */
    snprintf(path, sizeof path, "%s/bad", dir);
    write_file(path, "[default]\nregion = x\n[broken\n");
    assert_int_equal(ck_awsini_load(&f, path), CK_ECONFIG);
    assert_non_null(strstr(ck_error_msg(), "line 3"));
}

static void profile_region_endpoint_order(void **state)
{
    char dir[4000], cfg[4100], creds[4100], out[512];
    ck_test_tmpdir(dir, "awsprofile");
    snprintf(cfg, sizeof cfg, "%s/config", dir);
    snprintf(creds, sizeof creds, "%s/credentials", dir);
    write_file(cfg, "[default]\nregion = us-west-2\nendpoint_url = https://default.example\n"
                    "[profile dev]\nregion = eu-west-3\nendpoint_url = https://dev.example/\n"
                    "s3 =\n  endpoint_url = https://s3.dev.example\n");
    write_file(creds, "[dev]\naws_access_key_id = AKIDDEV\n[only-creds]\nx = 1\n");
    clean_env();
    setenv("AWS_CONFIG_FILE", cfg, 1);
    setenv("AWS_SHARED_CREDENTIALS_FILE", creds, 1);
    struct ck_awsprofile p;
    assert_int_equal(ck_awsprofile_open(&p, NULL), 0);
    assert_string_equal(p.name, "default");
    ck_awsconfig_region(out, sizeof out, NULL, &p);
    assert_string_equal(out, "us-west-2");
    assert_int_equal(ck_awsconfig_endpoint(out, sizeof out, NULL, "sts", &p), 0);
    assert_string_equal(out, "https://default.example");
    ck_awsprofile_release(&p);

    setenv("AWS_PROFILE", "dev", 1);
    assert_int_equal(ck_awsprofile_open(&p, NULL), 0);
    assert_string_equal(ck_awsprofile_creds(&p, "aws_access_key_id"), "AKIDDEV");
    ck_awsconfig_region(out, sizeof out, NULL, &p);
    assert_string_equal(out, "eu-west-3");
    /* the service's own endpoint_url before the profile's general one */
    assert_int_equal(ck_awsconfig_endpoint(out, sizeof out, NULL, "s3", &p), 0);
    assert_string_equal(out, "https://s3.dev.example");
    assert_int_equal(ck_awsconfig_endpoint(out, sizeof out, NULL, "sts", &p), 0);
    assert_string_equal(out, "https://dev.example");
    /* environment over the files, the service's variable over the general one */
    setenv("AWS_DEFAULT_REGION", "ap-south-1", 1);
    ck_awsconfig_region(out, sizeof out, NULL, &p);
    assert_string_equal(out, "ap-south-1");
    setenv("AWS_REGION", "ca-central-1", 1);
    ck_awsconfig_region(out, sizeof out, NULL, &p);
    assert_string_equal(out, "ca-central-1");
    ck_awsconfig_region(out, sizeof out, "sa-east-1", &p);
    assert_string_equal(out, "sa-east-1");
    setenv("AWS_ENDPOINT_URL", "http://general:1", 1);
    assert_int_equal(ck_awsconfig_endpoint(out, sizeof out, NULL, "s3", &p), 0);
    assert_string_equal(out, "http://general:1");
    setenv("AWS_ENDPOINT_URL_S3", "http://s3only:2/", 1);
    assert_int_equal(ck_awsconfig_endpoint(out, sizeof out, NULL, "s3", &p), 0);
    assert_string_equal(out, "http://s3only:2");
    assert_int_equal(ck_awsconfig_endpoint(out, sizeof out, "http://flag:3", "s3", &p), 0);
    assert_string_equal(out, "http://flag:3");
    /* ignoring configured endpoints leaves the AWS default ("") */
    setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true", 1);
    assert_int_equal(ck_awsconfig_endpoint(out, sizeof out, NULL, "s3", &p), 0);
    assert_string_equal(out, "");
    unsetenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS");
    setenv("AWS_ENDPOINT_URL_S3", "ftp://nope", 1);
    assert_int_equal(ck_awsconfig_endpoint(out, sizeof out, NULL, "s3", &p), CK_ECONFIG);
    assert_non_null(strstr(ck_error_msg(), "AWS_ENDPOINT_URL_S3"));
    ck_awsprofile_release(&p);

    /* a profile only the credentials file has is found; one neither has is an error */
    setenv("AWS_PROFILE", "only-creds", 1);
    assert_int_equal(ck_awsprofile_open(&p, NULL), 0);
    ck_awsprofile_release(&p);
    setenv("AWS_PROFILE", "missing", 1);
    assert_int_equal(ck_awsprofile_open(&p, NULL), CK_ECONFIG);
    assert_non_null(strstr(ck_error_msg(), "'missing'"));
    clean_env();
}

static void iso8601_times(void **state)
{
    /* calendar.timegm((2026, 11, 24, 8, 0, 0)) == 1795507200 */
    assert_true(ck_awscred_parse_time("2026-11-24T08:00:00Z") == 1795507200LL);
    assert_true(ck_awscred_parse_time("2026-11-24T08:00:00.123Z") == 1795507200LL);
    assert_true(ck_awscred_parse_time("2026-11-24T09:00:00+01:00") == 1795507200LL);
    assert_true(ck_awscred_parse_time("2026-11-24T07:30:00-00:30") == 1795507200LL);
    assert_true(ck_awscred_parse_time("1970-01-01T00:00:00Z") == 0);
    assert_true(ck_awscred_parse_time("2026-11-24 08:00:00Z") == -1);
    assert_true(ck_awscred_parse_time("2026-13-24T08:00:00Z") == -1);
    assert_true(ck_awscred_parse_time("2026-11-24T08:00:00") == -1);
    assert_true(ck_awscred_parse_time("2026-11-24T08:00:00Zjunk") == -1);
    assert_true(ck_awscred_parse_time("") == -1);
}

static void json_fields(void **state)
{
    char out[64];
    const char *doc = "{\n  \"Code\" : \"Success\",\n  \"Note\": \"AccessKeyId\",\n"
                      "  \"AccessKeyId\": \"ASIA\\u0041\\/B\",\n  \"Token\": \"a\\\"b\",\n"
                      "  \"Num\": 3, \"Expiration\": \"2026-11-24T08:00:00Z\"}";
    /* a value equal to a key's name is not that key */
    assert_true(ck_awscred_json_str(doc, "AccessKeyId", out, sizeof out));
    assert_string_equal(out, "ASIAA/B");
    assert_true(ck_awscred_json_str(doc, "Token", out, sizeof out));
    assert_string_equal(out, "a\"b");
    assert_true(ck_awscred_json_str(doc, "Code", out, sizeof out));
    assert_string_equal(out, "Success");
    assert_false(ck_awscred_json_str(doc, "Num", out, sizeof out));
    assert_false(ck_awscred_json_str(doc, "Missing", out, sizeof out));
    /* too long for out: false, never truncated */
    assert_false(ck_awscred_json_str(doc, "Expiration", out, 8));
    /* hostile: unterminated strings */
    assert_false(ck_awscred_json_str("{\"AccessKeyId\": \"abc", "AccessKeyId", out, sizeof out));
    assert_false(ck_awscred_json_str("{\"AccessKeyId", "AccessKeyId", out, sizeof out));
    assert_false(ck_awscred_json_str("{\"AccessKeyId\": \"\\", "AccessKeyId", out, sizeof out));
    /* hostile: a \u escape with fewer than four hex digits, at the end of
     * the input (its skip of four must not step past the terminator), or
     * with what sscanf's %x would take (a sign, spaces) */
    /* the input ends right before an unreadable page: a read past its
     * terminator faults (cmocka's guarded malloc would hide it from ASan) */
    static const char cut[] = "{\"AccessKeyId\": \"\\u7";
    long pg = sysconf(_SC_PAGESIZE);
    char *pages =
        mmap(NULL, 2 * (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(pages != MAP_FAILED);
    assert_int_equal(mprotect(pages + pg, (size_t)pg, PROT_NONE), 0);
    char *edge = pages + pg - sizeof cut;
    memcpy(edge, cut, sizeof cut);
    assert_false(ck_awscred_json_str(edge, "AccessKeyId", out, sizeof out));
    munmap(pages, 2 * (size_t)pg);
    assert_false(
        ck_awscred_json_str("{\"AccessKeyId\": \"\\u7\"}", "AccessKeyId", out, sizeof out));
    assert_false(
        ck_awscred_json_str("{\"AccessKeyId\": \"\\u+041\"}", "AccessKeyId", out, sizeof out));
    assert_false(
        ck_awscred_json_str("{\"AccessKeyId\": \"\\u 041\"}", "AccessKeyId", out, sizeof out));
    assert_true(ck_awscred_json_str("{\"AccessKeyId\": \"\\u004a\\u004B\"}", "AccessKeyId", out,
                                    sizeof out));
    assert_string_equal(out, "JK");
}

static void json_integers(void **state)
{
    (void)state;
    long long v = 0;
    assert_true(ck_awscred_json_int("{\"Version\": 1}", "Version", &v));
    assert_int_equal(v, 1);
    assert_true(ck_awscred_json_int("{\"A\":\"Version\", \"Version\":-12,}", "Version", &v));
    assert_int_equal(v, -12);
    assert_false(ck_awscred_json_int("{\"Version\": \"1\"}", "Version", &v));
    assert_false(ck_awscred_json_int("{\"Version\": 1.0}", "Version", &v));
    assert_false(ck_awscred_json_int("{\"Version\": 1e3}", "Version", &v));
    assert_false(ck_awscred_json_int("{\"Version\": -}", "Version", &v));
    assert_false(ck_awscred_json_int("{\"Version\": 99999999999999999999}", "Version", &v));
    assert_false(ck_awscred_json_int("{\"Version\"", "Version", &v));
}

/* IAM Identity Center: what `aws sso login` caches and what the portal
 * answers. 2026-11-25T12:00:00Z is 1795608000 s after the epoch (date -ud). */
static void sso_parsers(void **state)
{
    (void)state;
    char tok[64], small[4];
    long long t = 0;
    assert_int_equal(ck_awscred_sso_cache_parse("{\"startUrl\": \"u\", \"accessToken\": \"aoa1\","
                                                " \"expiresAt\": \"2026-11-25T12:00:00Z\"}",
                                                "c", tok, sizeof tok, &t),
                     0);
    assert_string_equal(tok, "aoa1");
    assert_int_equal(t, 1795608000LL);
    /* the AWS CLI v1's form */
    assert_int_equal(ck_awscred_sso_cache_parse("{\"accessToken\": \"x\", \"expiresAt\": "
                                                "\"2026-11-25T12:00:00UTC\"}",
                                                "c", tok, sizeof tok, &t),
                     0);
    assert_int_equal(t, 1795608000LL);
    static const char *const bad[] = {
        "{\"accessToken\": \"x\"}",                                              /* no expiry */
        "{\"expiresAt\": \"2026-11-25T12:00:00Z\"}",                             /* no token */
        "{\"accessToken\": \"\", \"expiresAt\": \"2026-11-25T12:00:00Z\"}",      /* empty */
        "{\"accessToken\": \"a\\nb\", \"expiresAt\": \"2026-11-25T12:00:00Z\"}", /* a header break
                                                                                  */
        "{\"accessToken\": \"x\", \"expiresAt\": \"tomorrow\"}",
        "{\"accessToken\": \"x\", \"expiresAt\": 1795608000}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(ck_awscred_sso_cache_parse(bad[i], "c", tok, sizeof tok, &t), CK_EAUTH);
    /* a token longer than the buffer is refused, not cut */
    assert_int_equal(ck_awscred_sso_cache_parse("{\"accessToken\": \"abcdef\", \"expiresAt\": "
                                                "\"2026-11-25T12:00:00Z\"}",
                                                "c", small, sizeof small, &t),
                     CK_EAUTH);

    struct ck_awskeys k;
    assert_int_equal(ck_awscred_sso_answer_parse(
                         "{\"roleCredentials\": {\"accessKeyId\": \"ASIA1\", \"secretAccessKey\": "
                         "\"s/k\", \"sessionToken\": \"t\", \"expiration\": 1795608000999}}",
                         "p", &k, &t),
                     0);
    assert_string_equal(k.id, "ASIA1");
    assert_string_equal(k.secret, "s/k");
    assert_string_equal(k.token, "t");
    assert_int_equal(t, 1795608000LL); /* milliseconds in the answer */
    ck_awskeys_wipe(&k);
    static const char *const bad_answers[] = {
        "{\"roleCredentials\": {\"accessKeyId\": \"A\", \"secretAccessKey\": \"s\", "
        "\"sessionToken\": \"t\"}}",
        "{\"roleCredentials\": {\"accessKeyId\": \"A\", \"secretAccessKey\": \"s\", "
        "\"sessionToken\": \"t\", \"expiration\": 0}}",
        "{\"roleCredentials\": {\"accessKeyId\": \"\", \"secretAccessKey\": \"s\", "
        "\"sessionToken\": \"t\", \"expiration\": 1}}",
        "{\"message\": \"Session token not found or invalid\"}",
    };
    for (size_t i = 0; i < sizeof bad_answers / sizeof *bad_answers; i++)
        assert_int_equal(ck_awscred_sso_answer_parse(bad_answers[i], "p", &k, &t), CK_ENET);
    ck_error_clear();
}

/* The splitting of credential_process, against what Python's shlex.split
 * (the AWS CLI's splitter) gives for the same line (worked out by hand from
 * its rules; tests/e2e/test_awscred.py compares with shlex itself). */
static void process_command_split(void **state)
{
    (void)state;
    static const struct {
        const char *cmd;
        const char *want[6];
    } ok[] = {
        {"helper", {"helper"}},
        {"  /bin/helper --profile  dev\t", {"/bin/helper", "--profile", "dev"}},
        {"a 'b c' \"d e\"", {"a", "b c", "d e"}},
        {"a 'it''s' x\\ y", {"a", "its", "x y"}},
        {"a \"q\\\"q\" \"b\\\\s\" \"\\n\"", {"a", "q\"q", "b\\s", "\\n"}},
        {"a '' \"\" b", {"a", "", "", "b"}},
        {"a'b'\"c\"d", {"abcd"}},
        {"a '\\' \\'", {"a", "\\", "'"}},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        char **argv = NULL;
        assert_int_equal(ck_awsprocess_split(ok[i].cmd, "t", &argv), 0);
        size_t n = 0;
        for (; ok[i].want[n]; n++) {
            assert_non_null(argv[n]);
            assert_string_equal(argv[n], ok[i].want[n]);
        }
        assert_null(argv[n]);
        ck_awsprocess_argv_free(argv);
    }
    static const char *const bad[] = {"a 'b", "a \"b", "a \"b\\\"", "a b\\", "", "  \t "};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char **argv = (char **)1;
        assert_true(ck_awsprocess_split(bad[i], "credential_process of profile 'x'", &argv) < 0);
        assert_null(argv);
        assert_non_null(strstr(ck_error_msg(), "credential_process of profile 'x'"));
        ck_error_clear();
    }
}

static void process_run(void **state)
{
    (void)state;
    struct ck_buf out = CK_BUF_INIT;
    const char *what = "credential_process of profile 'u'";
    assert_int_equal(ck_awsprocess_run("printf '%s|' 'a b' \"c\"", what, 10, &out), 0);
    assert_string_equal(ck_buf_str(&out), "a b|c|");
    ck_buf_reset(&out);
    /* stdin is /dev/null: a helper that reads it ends */
    assert_int_equal(ck_awsprocess_run("cat", what, 10, &out), 0);
    assert_int_equal(out.len, 0);
    static const struct {
        const char *cmd, *says;
    } bad[] = {
        {"sh -c 'echo secret-in-output; exit 3'", "'sh' exited with status 3"},
        {"sh -c 'kill -TERM $$'", "'sh' was ended by signal 15"},
        {"/nonexistent/helper --token secret-in-args", "cannot run '/nonexistent/helper'"},
        {"head -c 70000 /dev/zero", "'head' printed more than 64 KiB"},
        {"sh -c 'sleep 30'", "'sh' did not finish within 1 s (killed)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_buf_reset(&out);
        int64_t t0 = ck_mono_ms();
        assert_true(ck_awsprocess_run(bad[i].cmd, what, 1, &out) < 0);
        assert_true(ck_mono_ms() - t0 < 10000); /* the sleeper was killed, not waited for */
        const char *msg = ck_error_msg();
        assert_non_null(strstr(msg, what));
        if (!strstr(msg, bad[i].says))
            fail_msg("'%s': '%s' does not say '%s'", bad[i].cmd, msg, bad[i].says);
        assert_null(strstr(msg, "secret-in"));
        ck_error_clear();
    }
    ck_buf_release(&out);
}

static void expired_codes(void **state)
{
    assert_true(ck_awscred_is_expired_code("ExpiredToken"));
    assert_true(ck_awscred_is_expired_code("RequestExpired"));
    assert_true(ck_awscred_is_expired_code("InvalidAccessKeyId"));
    assert_false(ck_awscred_is_expired_code("SignatureDoesNotMatch"));
    assert_false(ck_awscred_is_expired_code("AccessDenied"));
    assert_false(ck_awscred_is_expired_code(""));
    assert_false(ck_awscred_is_expired_code(NULL));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(ini_sections_and_nesting),
    cmocka_unit_test(profile_region_endpoint_order),
    cmocka_unit_test(iso8601_times),
    cmocka_unit_test(json_fields),
    cmocka_unit_test(json_integers),
    cmocka_unit_test(sso_parsers),
    cmocka_unit_test(process_command_split),
    cmocka_unit_test(process_run),
    cmocka_unit_test(expired_codes),
};
CK_TEST_MAIN(tests)
