/* common/: YAML typing as PyYAML does it, JSON escaping, hashing, atomic
 * files, secrets, UTF-8. Expected values are published test vectors or
 * YAML 1.1 facts, not output of the code under test. */
#include "tests/unit/test_main.h"

#include "common/buf.h"
#include "common/log.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/secret.h"
#include "common/utf8.h"
#include "common/yamlutil.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static void yaml_plain_types(void **state)
{
    static const struct {
        const char *s;
        enum ck_yaml_type t;
    } cases[] = {
        {"yes", CK_Y_BOOL},     {"Off", CK_Y_BOOL},     {"TRUE", CK_Y_BOOL},
        {"y", CK_Y_STR},        {"12", CK_Y_INT},       {"012", CK_Y_INT},
        {"0x1F", CK_Y_INT},     {"1_000", CK_Y_INT},    {"1:30", CK_Y_INT},
        {"0o7", CK_Y_STR},      {"1e5", CK_Y_STR},      {"1.0e+5", CK_Y_FLOAT},
        {"1.5", CK_Y_FLOAT},    {".inf", CK_Y_FLOAT},   {"1.0.0", CK_Y_STR},
        {"~", CK_Y_NULL},       {"null", CK_Y_NULL},    {"", CK_Y_NULL},
        {"2002-12-14", CK_Y_OTHER},                     {"epoch_3.pt", CK_Y_STR},
        {"9d1d08d1fbd1ebc350ccf3c0256b06e9", CK_Y_STR}, {"1234567", CK_Y_INT},
        /* a digit first (the patterns are skipped for some): as PyYAML's
         * safe_load types them */
        {"3fa2e1", CK_Y_STR},   {"09", CK_Y_STR},       {"0b101", CK_Y_INT},
        {"9+3", CK_Y_STR},      {"7a.5", CK_Y_STR},     {"5_a", CK_Y_STR},
        {"1E+5", CK_Y_STR},     {"08_1", CK_Y_STR},     {"1__", CK_Y_INT},
        {"3f-2", CK_Y_STR},     {"0x1f", CK_Y_INT},     {"12:30", CK_Y_INT},
    };
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        enum ck_yaml_type t = ck_yaml_plain_type(cases[i].s, strlen(cases[i].s));
        if (t != cases[i].t)
            fail_msg("'%s' typed %s, expected %s", cases[i].s, ck_yaml_type_name(t),
                     ck_yaml_type_name(cases[i].t));
    }
}

static void yaml_values(void **state)
{
    (void)state;
    const char *text = "a: 012\nb: 0x10\nc: 1:30\nd: '12'\ne: !!str 7\nf: -1.5\ng: on\n";
    struct ck_yaml_doc d;
    assert_int_equal(ck_yaml_load(&d, "t.yaml", text, strlen(text)), 0);
    yaml_node_t *root = ck_yaml_root(&d);
    int64_t want_i[] = {10, 16, 90};
    yaml_node_pair_t *p = root->data.mapping.pairs.start;
    for (int i = 0; i < 3; i++, p++) {
        struct ck_yaml_value v;
        ck_yaml_resolve(ck_yaml_node(&d, p->value), &v);
        assert_int_equal(v.type, CK_Y_INT);
        assert_int_equal(v.i, want_i[i]);
    }
    struct ck_yaml_value v;
    ck_yaml_resolve(ck_yaml_node(&d, p->value), &v);
    assert_int_equal(v.type, CK_Y_STR);
    p += 2;
    ck_yaml_resolve(ck_yaml_node(&d, p->value), &v);
    assert_int_equal(v.type, CK_Y_FLOAT);
    assert_true(v.f == -1.5);
    p++;
    ck_yaml_resolve(ck_yaml_node(&d, p->value), &v);
    assert_int_equal(v.type, CK_Y_BOOL);
    assert_true(v.b);
    ck_yaml_release(&d);
}

static void yaml_error_names_line(void **state)
{
    (void)state;
    const char *text = "a: 1\nb: [1, 2\nc: 3\n";
    struct ck_yaml_doc d;
    assert_int_equal(ck_yaml_load(&d, "bad.yaml", text, strlen(text)), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "'bad.yaml' line "));
}

static void yaml_emit_quotes_what_would_change_type(void **state)
{
    (void)state;
    struct ck_buf b = CK_BUF_INIT;
    struct ck_yaml_out o;
    assert_int_equal(ck_yaml_out_begin(&o, &b), 0);
    ck_yaml_map_begin(&o);
    const char *keys[] = {"12", "yes", "null", "1.5", "plain", "a: b"};
    for (size_t i = 0; i < 6; i++) {
        ck_yaml_str(&o, keys[i]);
        ck_yaml_str(&o, keys[i]);
    }
    ck_yaml_map_end(&o);
    assert_int_equal(ck_yaml_out_end(&o), 0);
    /* read back: every one must still be the same string */
    struct ck_yaml_doc d;
    assert_int_equal(ck_yaml_load(&d, "out", ck_buf_str(&b), b.len), 0);
    yaml_node_t *root = ck_yaml_root(&d);
    size_t i = 0;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++, i++) {
        struct ck_yaml_value k, v;
        ck_yaml_resolve(ck_yaml_node(&d, p->key), &k);
        ck_yaml_resolve(ck_yaml_node(&d, p->value), &v);
        assert_int_equal(k.type, CK_Y_STR);
        assert_int_equal(v.type, CK_Y_STR);
        assert_string_equal(v.s, keys[i]);
    }
    assert_int_equal(i, 6);
    assert_non_null(strstr(ck_buf_str(&b), "plain: plain"));
    ck_yaml_release(&d);
    ck_buf_release(&b);
}

static void json_escapes(void **state)
{
    (void)state;
    struct ck_buf b = CK_BUF_INIT;
    struct ck_json j;
    ck_json_init(&j, &b, false);
    ck_json_begin_object(&j);
    ck_json_kstr(&j, "s", "a\"b\\c\n\x01\xff");
    ck_json_kint(&j, "i", -3);
    ck_json_key(&j, "a");
    ck_json_begin_array(&j);
    ck_json_bool(&j, true);
    ck_json_null(&j);
    ck_json_double(&j, 0.5);
    ck_json_end_array(&j);
    ck_json_end_object(&j);
    assert_int_equal(ck_json_error(&j), 0);
    assert_string_equal(ck_buf_str(&b),
                        "{\"s\":\"a\\\"b\\\\c\\n\\u0001\\ufffd\",\"i\":-3,\"a\":[true,null,0.5]}");
    ck_buf_release(&b);
    /* doubles: the shortest text that reads back as the same value */
    const double vals[] = {0.06, 0.1 + 0.2, 1e300, -2.5e-8, 123456789.125, 1.0 / 3.0};
    const char *want[] = {"0.06", "0.30000000000000004", "1e+300", "-2.5e-08", "123456789.125",
                          "0.3333333333333333"};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        ck_json_init(&j, &b, false);
        ck_json_double(&j, vals[i]);
        assert_string_equal(ck_buf_str(&b), want[i]);
        assert_true(strtod(ck_buf_str(&b), NULL) == vals[i]);
        ck_buf_release(&b);
    }
}

static void write_tmp(char *path, const char *name, const void *data, size_t len)
{
    char dir[4000];
    ck_test_tmpdir(dir, name);
    snprintf(path, 4096, "%s/f", dir);
    assert_int_equal(ck_write_file_atomic(path, data, len, 0644), 0);
}

static void hash_vectors(void **state)
{
    (void)state;
    char path[4096];
    struct ck_digests d;
    /* RFC 1321 and FIPS 180-2 test vectors */
    write_tmp(path, "hash", "abc", 3);
    assert_int_equal(ck_hash_file(path, CK_HASH_BOTH, &d, NULL), 0);
    assert_string_equal(d.md5, "900150983cd24fb0d6963f7d28e17f72");
    assert_string_equal(d.sha256,
                        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    assert_int_equal(d.size, 3);
    write_tmp(path, "hash_empty", "", 0);
    assert_int_equal(ck_hash_file(path, CK_HASH_MD5, &d, NULL), 0);
    assert_string_equal(d.md5, "d41d8cd98f00b204e9800998ecf8427e");
    assert_string_equal(d.sha256, "");
}

static void hash_large_crosses_blocks(void **state)
{
    (void)state;
    /* 1,000,000 'a': FIPS 180-2's long vector, over several 1 MiB reads */
    size_t n = 1000000;
    char *buf = malloc(n);
    memset(buf, 'a', n);
    char path[4096];
    write_tmp(path, "hash_big", buf, 1000000);
    struct ck_digests d;
    assert_int_equal(ck_hash_file(path, CK_HASH_BOTH, &d, NULL), 0);
    assert_string_equal(d.sha256,
                        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    assert_string_equal(d.md5, "7707d6ae4e027c70eea2a935c2296f21");
    /* the same through the incremental context */
    struct ck_hash_ctx *c = ck_hash_ctx_new(CK_HASH_BOTH);
    for (int i = 0; i < 1000; i++)
        ck_hash_ctx_update(c, buf, 1000);
    ck_hash_ctx_final(c, &d);
    ck_hash_ctx_free(c);
    assert_string_equal(d.md5, "7707d6ae4e027c70eea2a935c2296f21");
    free(buf);
}

static void hash_missing_is_changed(void **state)
{
    (void)state;
    struct ck_digests d;
    assert_int_equal(ck_hash_file("/nonexistent/ckptd-test", CK_HASH_MD5, &d, NULL), CK_ECHANGED);
    assert_non_null(strstr(ck_error_msg(), "vanished"));
}

static void atomic_abort_leaves_nothing(void **state)
{
    (void)state;
    char dir[4000], path[4096];
    ck_test_tmpdir(dir, "atomic");
    snprintf(path, sizeof path, "%s/x", dir);
    assert_int_equal(ck_write_file_atomic(path, "old", 3, 0644), 0);
    struct ck_atomic_file f;
    assert_int_equal(ck_atomic_open(&f, path, 0600), 0);
    assert_int_equal(ck_atomic_write(&f, "new", 3), 0);
    ck_atomic_abort(&f);
    struct ck_buf b = CK_BUF_INIT;
    assert_int_equal(ck_read_file(path, 100, &b), 0);
    assert_string_equal(ck_buf_str(&b), "old");
    ck_buf_release(&b);
    /* only x is left in the folder */
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", dir);
    assert_int_equal(system(cmd), 0);
}

static void read_file_limit(void **state)
{
    (void)state;
    char path[4096];
    write_tmp(path, "limit", "0123456789", 10);
    struct ck_buf b = CK_BUF_INIT;
    assert_int_equal(ck_read_file(path, 9, &b), CK_ESIZE);
    ck_buf_release(&b);
}

static void secrets_from_env_and_0600_file(void **state)
{
    (void)state;
    char *s = NULL;
    setenv("CK_TEST_SECRET", "hunter2", 1);
    assert_int_equal(ck_secret_load("env:CK_TEST_SECRET", &s), 0);
    assert_string_equal(s, "hunter2");
    ck_secret_free(s);
    assert_int_equal(ck_secret_load("hunter2", &s), CK_ECONFIG);
    assert_null(strstr(ck_error_msg(), "hunter2"));
    char path[4096], ref[4200];
    write_tmp(path, "secret", "topsecret\n", 10);
    snprintf(ref, sizeof ref, "file:%s", path);
    chmod(path, 0644);
    assert_int_equal(ck_secret_load(ref, &s), CK_ECONFIG);
    assert_non_null(strstr(ck_error_msg(), "0600"));
    assert_null(strstr(ck_error_msg(), "topsecret"));
    chmod(path, 0600);
    assert_int_equal(ck_secret_load(ref, &s), 0);
    assert_string_equal(s, "topsecret");
    ck_secret_free(s);
}

static void utf8_checks(void **state)
{
    (void)state;
    assert_true(ck_utf8_is_valid("h\xc3\xa9llo", 6));
    assert_false(ck_utf8_is_valid("\xff", 1));
    assert_false(ck_utf8_is_valid("\xc0\xaf", 2));         /* overlong '/' */
    assert_false(ck_utf8_is_valid("\xed\xa0\x80", 3));     /* surrogate */
    assert_false(ck_utf8_is_valid("\xe2\x82", 2));         /* truncated */
    char out[64];
    ck_utf8_sanitize(out, sizeof out, "a\xff" "b");
    assert_string_equal(out, "a\\xffb");
}

static void buf_limit(void **state)
{
    (void)state;
    struct ck_buf b;
    ck_buf_init(&b, 8);
    assert_int_equal(ck_buf_puts(&b, "12345678"), 0);
    assert_int_equal(ck_buf_putc(&b, '9'), CK_ENOMEM);
    assert_int_equal(b.len, 8);
    ck_buf_release(&b);
}

/* ck_buf_printf formats into the room there is first: what fits, what
 * needs the buffer grown, and what the limit refuses even when it would fit
 * the room, leaving the buffer as it was. */
static void buf_printf_room_growth_and_limit(void **state)
{
    (void)state;
    struct ck_buf b;
    ck_buf_init(&b, 20);
    assert_int_equal(ck_buf_reserve(&b, 16), 0); /* room: 64 bytes */
    assert_int_equal(ck_buf_printf(&b, "%s-%d", "ab", 12), 0);
    assert_string_equal(ck_buf_str(&b), "ab-12");
    /* fits the room (64), not the limit (20): refused, the text stays */
    assert_int_equal(ck_buf_printf(&b, "%s", "0123456789abcdef"), CK_ENOMEM);
    assert_int_equal(b.len, 5);
    assert_string_equal(ck_buf_str(&b), "ab-12");
    assert_int_equal(ck_buf_printf(&b, "%015d", 7), 0); /* exactly the limit */
    assert_string_equal(ck_buf_str(&b), "ab-12000000000000007");
    ck_buf_release(&b);
    /* larger than the room: grown, formatted whole */
    struct ck_buf g = CK_BUF_INIT;
    char big[300];
    memset(big, 'x', sizeof big - 1), big[sizeof big - 1] = '\0';
    assert_int_equal(ck_buf_printf(&g, "<%s>", "a"), 0);
    assert_int_equal(ck_buf_printf(&g, "%s|%s", big, big), 0);
    assert_int_equal(g.len, 3 + 2 * 299 + 1);
    assert_int_equal(strlen(ck_buf_str(&g)), g.len);
    assert_memory_equal(g.data + 3 + 299, "|x", 2);
    ck_buf_release(&g);
}

/* One JSON log line for msg, as ck_log writes it (time stripped). */
static void log_json_line(const char *msg, char *out, size_t outsz)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    ck_log_setup(CK_LOG_JSON, CK_LOG_DEBUG, f);
    ck_info("test.event", "%s", msg);
    ck_log_setup(CK_LOG_TEXT, CK_LOG_INFO, NULL);
    rewind(f);
    char line[4096];
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    /* {"time":"...","level":"info","event":"test.event",...} */
    const char *rest = strstr(line, "\"event\":\"test.event\",");
    assert_non_null(rest);
    snprintf(out, outsz, "%s", rest + strlen("\"event\":\"test.event\","));
    out[strcspn(out, "\n")] = 0;
}

static void log_json_fields_are_typed_members(void **state)
{
    (void)state;
    char got[4096];
    log_json_line("ref='epoch_1.pt' epoch=1 bytes=100000 ok=true ratio=0.5", got, sizeof got);
    assert_string_equal(got, "\"ref\":\"epoch_1.pt\",\"epoch\":1,\"bytes\":100000,\"ok\":true,"
                             "\"ratio\":0.5,\"msg\":\"test event\"}");
    /* prose stays the message; punctuation that separated a pair goes */
    log_json_line("status=finished: stopping the watcher", got, sizeof got);
    assert_string_equal(got, "\"status\":\"finished\",\"msg\":\"stopping the watcher\"}");
    log_json_line("pid=42 did not exit within 2s of the signal", got, sizeof got);
    assert_string_equal(got, "\"pid\":42,\"msg\":\"did not exit within 2s of the signal\"}");
    /* an id with a leading zero, a negative, a path with blanks */
    log_json_line("id=007 delta=-3 path='a b/c d': gone", got, sizeof got);
    assert_string_equal(got, "\"id\":\"007\",\"delta\":-3,\"path\":\"a b/c d\",\"msg\":\"gone\"}");
    /* reserved names, repeats and an unclosed quote stay prose */
    log_json_line("msg=x level=y a=1 a=2 b='open", got, sizeof got);
    assert_string_equal(got, "\"a\":1,\"msg\":\"msg=x level=y a=2 b='open\"}");
    /* a pair after prose is a field; one inside a word is not */
    log_json_line("cannot parse 'x': expected key=value x-y=1", got, sizeof got);
    assert_string_equal(got,
                        "\"key\":\"value\",\"msg\":\"cannot parse 'x': expected x-y=1\"}");
    /* a decimal is written as it was logged, not as the nearest double's 17 digits */
    log_json_line("seconds=0.06 rate=0.1", got, sizeof got);
    assert_string_equal(got, "\"seconds\":0.06,\"rate\":0.1,\"msg\":\"test event\"}");
}

static void own_temporaries_are_told_apart(void **state)
{
    (void)state;
    assert_true(ck_is_own_temporary(".metadata.yaml.ckptd-a1B2c3.tmp"));
    assert_true(ck_is_own_temporary(".epoch_3.pt.ckptd-zzzzzz.tmp"));
    assert_true(ck_is_own_temporary(".metadata.yaml.Ab12Cd.tmp")); /* before the marker */
    assert_false(ck_is_own_temporary(".ckptd-a1B2c3.tmp"));         /* no name before it */
    assert_false(ck_is_own_temporary("metadata.yaml.ckptd-a1B2c3.tmp"));
    assert_false(ck_is_own_temporary(".x.ckptd-a1B2c.tmp"));
    assert_false(ck_is_own_temporary(".x.ckptd-a1B2c3.tmpx"));
    assert_false(ck_is_own_temporary(".x.ckptd-a1_2c3.tmp"));
    assert_false(ck_is_own_temporary(".epoch_3.pt.Ab12Cd.tmp")); /* a trainer's, perhaps */
    assert_false(ck_is_own_temporary(".metadata.yaml.Ab12Cde.tmp"));
    /* what ck_atomic_open makes is recognised, and the sweep removes only that */
    char dir[4000], path[4100];
    ck_test_tmpdir(dir, "sweep");
    snprintf(path, sizeof path, "%s/metadata.yaml", dir);
    struct ck_atomic_file f;
    assert_int_equal(ck_atomic_open(&f, path, 0644), 0);
    assert_true(ck_is_own_temporary(ck_basename(f.tmp)));
    close(f.fd);
    f.fd = -1;
    snprintf(path, sizeof path, "%s/.theirs.abcdef.tmp", dir);
    FILE *t = fopen(path, "w");
    assert_non_null(t);
    fclose(t);
    size_t removed = 0;
    assert_int_equal(ck_sweep_temporaries(dir, &removed), 0);
    assert_int_equal(removed, 1);
    assert_true(ck_exists(path));
    assert_false(ck_exists(f.tmp));
    free(f.tmp);
    free(f.path);
    assert_int_equal(ck_sweep_temporaries("/no/such/folder", &removed), 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(own_temporaries_are_told_apart),
    cmocka_unit_test(log_json_fields_are_typed_members),
    cmocka_unit_test(yaml_plain_types),
    cmocka_unit_test(yaml_values),
    cmocka_unit_test(yaml_error_names_line),
    cmocka_unit_test(yaml_emit_quotes_what_would_change_type),
    cmocka_unit_test(json_escapes),
    cmocka_unit_test(hash_vectors),
    cmocka_unit_test(hash_large_crosses_blocks),
    cmocka_unit_test(hash_missing_is_changed),
    cmocka_unit_test(atomic_abort_leaves_nothing),
    cmocka_unit_test(read_file_limit),
    cmocka_unit_test(secrets_from_env_and_0600_file),
    cmocka_unit_test(utf8_checks),
    cmocka_unit_test(buf_limit),
    cmocka_unit_test(buf_printf_room_growth_and_limit),
};

CK_TEST_MAIN(tests)
