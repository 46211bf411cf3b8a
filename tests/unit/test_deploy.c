/* data/build_parameters.yaml's `archives:` (agent/deploy_record.c): other
 * keys are kept as they were, an entry is added or updated in place (NULL
 * removes a key), and a file that is not a mapping is refused untouched.
 * Expected documents are written out by hand below. */
#include "test_main.h"

#include "agent/deploy.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"

#include <stdio.h>
#include <string.h>

static void put(const char *dir, const char *text)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/data", dir);
    assert_int_equal(ck_mkdirs(p, 0755), 0);
    snprintf(p, sizeof p, "%s/data/build_parameters.yaml", dir);
    assert_int_equal(ck_write_file_atomic(p, text, strlen(text), 0644), 0);
}

static void expect(const char *dir, const char *want)
{
    char p[4200];
    struct ck_buf b = CK_BUF_INIT;
    snprintf(p, sizeof p, "%s/data/build_parameters.yaml", dir);
    assert_int_equal(ck_read_file(p, 1 << 20, &b), 0);
    assert_string_equal(ck_buf_str(&b), want);
    ck_buf_release(&b);
}

static void records_keep_other_keys(void **state)
{
    (void)state;
    char dir[4000];
    ck_test_tmpdir(dir, "deploy");
    put(dir, "lr: 0.1\nckptd:\n  version: x\narchives:\n  old.mldef:\n    format: mldef\n");
    const char *f1[] = {"format", "samediff", "size", "123", "verification", "pending"};
    assert_int_equal(ck_deploy_record(dir, "m.zip", f1, 3), 0);
    expect(dir, "lr: 0.1\nckptd:\n  version: x\narchives:\n  old.mldef:\n    format: mldef\n"
                "  m.zip:\n    format: samediff\n    size: 123\n    verification: pending\n");
    /* an update: the fields given replace theirs, NULL removes one, others stay */
    const char *f2[] = {"verification", "failed", "size", NULL, "why", "output 'y': 1.5"};
    assert_int_equal(ck_deploy_record(dir, "m.zip", f2, 3), 0);
    expect(dir, "lr: 0.1\nckptd:\n  version: x\narchives:\n  old.mldef:\n    format: mldef\n"
                "  m.zip:\n    format: samediff\n    verification: failed\n"
                "    why: 'output ''y'': 1.5'\n");
    char cmd[4100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void not_a_mapping_is_refused(void **state)
{
    (void)state;
    char dir[4000];
    ck_test_tmpdir(dir, "deploy");
    put(dir, "- a\n- b\n");
    const char *f[] = {"format", "mldef"};
    assert_int_equal(ck_deploy_record(dir, "x.mldef", f, 1), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "build_parameters.yaml"));
    expect(dir, "- a\n- b\n");
    /* no file yet: one is made */
    char cmd[4100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/data'", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(ck_deploy_record(dir, "x.mldef", f, 1), 0);
    expect(dir, "archives:\n  x.mldef:\n    format: mldef\n");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(records_keep_other_keys),
    cmocka_unit_test(not_a_mapping_is_refused),
};
CK_TEST_MAIN(tests)
