/* writers/pmf: the reference validator's rules (FORMAT-FACTS section 1),
 * status transitions, and agent/discover's name patterns. */
#include "tests/unit/test_main.h"

#include "agent/discover.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "writers/pmf.h"

#include <stdlib.h>

static const char good[] =
    "format:\n"
    "  version: 1.0.0\n"
    "  producer: {name: ckptd, version: {format: py_pa, value: 0.1.0}}\n"
    "model:\n"
    "  name: m\n"
    "  id: '0123'\n"
    "  configuration: {path: config.yaml, hash: 9d1d08d1fbd1ebc350ccf3c0256b06e9}\n"
    "  initialisation: null\n"
    "  training:\n"
    "    status: running\n"
    "    start_time: 10\n"
    "    latest_time: 12.5\n"
    "    end_time: null\n"
    "    start_epoch: 0\n"
    "    latest_epoch: 12\n"
    "    end_epoch: null\n"
    "    latest: 12\n"
    "    checkpoints:\n"
    "      1: {epoch: 1, path: data/checkpoints/1.h5, hash: b4975f62e007d54a55f53b44a367d998}\n"
    "      12: {epoch: 12, path: data/checkpoints/12.h5, hash: 01afa021fdf47b609decd434755c06f6}\n";

static int parse_with(const char *from, const char *to, struct ck_pmf_meta *m)
{
    char text[4096];
    const char *at = strstr(good, from);
    if (!at)
        fail_msg("test bug: '%s' not in the document", from);
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - good), good, to, at + strlen(from));
    return ck_pmf_parse(m, "metadata.yaml", text, strlen(text));
}

static void parses_good(void **state)
{
    (void)state;
    struct ck_pmf_meta m;
    assert_int_equal(ck_pmf_parse(&m, "metadata.yaml", good, strlen(good)), 0);
    assert_int_equal(m.ncheckpoints, 2);
    assert_true(m.checkpoints[1].ref.is_int);
    assert_int_equal(m.checkpoints[1].ref.i, 12);
    assert_true(m.latest.is_int);
    assert_string_equal(m.id, "0123");
    assert_int_equal(m.status, CK_PMF_RUNNING);
    ck_pmf_meta_release(&m);
}

static void rejects_what_plums_rejects(void **state)
{
    (void)state;
    static const struct {
        const char *from, *to, *why;
    } cases[] = {
        {"model:\n", "extra: 1\nmodel:\n", "unexpected key 'extra'"},
        {"  name: m\n", "  name: m\n  sha256: x\n", "unexpected key 'sha256'"},
        {"  name: m\n", "", "missing the key 'name'"},
        {"    end_epoch: null\n", "", "missing the key 'end_epoch'"},
        {"version: 1.0.0", "version: 1.0.1", "1.0.0"},
        {"name: ckptd", "name: ck-ptd", "producer.name"},
        {"id: '0123'", "id: 123", "model.id"},
        {"hash: 9d1d08d1fbd1ebc350ccf3c0256b06e9", "hash: 9D1D08D1FBD1EBC350CCF3C0256B06E9",
         "lower-case"},
        {"status: running", "status: Running", "pending, running"},
        {"latest_epoch: 12", "latest_epoch: 12.0", "rejects floats"},
        {"latest: 12", "latest: '12'", "'latest' must be the reference"},
        {"end_time: null\n    start_epoch: 0\n    latest_epoch: 12\n    end_epoch: null",
         "end_time: 13\n    start_epoch: 0\n    latest_epoch: 12\n    end_epoch: 12",
         "running forbids end"},
        {"start_time: 10", "start_time: 20", "start_time <= latest_time"},
        {"    start_epoch: 0\n", "    start_epoch: null\n", "latest_epoch needs start_epoch"},
        {"    checkpoints:\n      1:", "    checkpoints: null\n    x:\n      1:", "unexpected"},
        {"{epoch: 12,", "{epoch: 13,", "<= latest_epoch"},
        {"  initialisation: null", "  initialisation: {file: {name: x, path: y}}", "'hash'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct ck_pmf_meta m;
        int err = parse_with(cases[i].from, cases[i].to, &m);
        if (err != CK_EFORMAT)
            fail_msg("case %zu (%s) was accepted", i, cases[i].why);
        if (!strstr(ck_error_msg(), cases[i].why))
            fail_msg("case %zu: message '%s' does not mention '%s'", i, ck_error_msg(),
                     cases[i].why);
        if (!strstr(ck_error_msg(), "'metadata.yaml'"))
            fail_msg("case %zu: message '%s' does not name the file", i, ck_error_msg());
    }
}

static void checkpoints_null_is_invalid(void **state)
{
    (void)state;
    struct ck_pmf_meta m;
    const char *from = "    latest: 12\n    checkpoints:\n";
    char text[4096];
    const char *at = strstr(good, from);
    snprintf(text, sizeof text, "%.*s    latest: null\n    checkpoints: null\n", (int)(at - good),
             good);
    assert_int_equal(ck_pmf_parse(&m, "metadata.yaml", text, strlen(text)), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "not null"));
}

static void emit_round_trips(void **state)
{
    (void)state;
    struct ck_pmf_meta m, back;
    struct ck_buf out = CK_BUF_INIT;
    assert_int_equal(ck_pmf_parse(&m, "metadata.yaml", good, strlen(good)), 0);
    struct ck_pmf_ref r = {false, 0, "13"};
    assert_int_equal(ck_pmf_register(&m, &r, 13, "data/checkpoints/13", "0123456789abcdef0123456789abcdef", 20.0, 0), 0);
    assert_int_equal(ck_pmf_emit(&m, &out), 0);
    assert_int_equal(ck_pmf_parse(&back, "out", ck_buf_str(&out), out.len), 0);
    assert_int_equal(back.ncheckpoints, 3);
    assert_false(back.checkpoints[2].ref.is_int); /* "13" stayed a string */
    assert_string_equal(back.checkpoints[2].ref.s, "13");
    assert_false(back.latest.is_int);
    assert_int_equal(back.latest_epoch.v, 13);
    assert_true(back.latest_time.v == 20.0);
    ck_pmf_meta_release(&m);
    ck_pmf_meta_release(&back);
    ck_buf_release(&out);
}

/* ck_pmf_emit writes simple checkpoints without libyaml's emitter: its text
 * must be the emitter's, byte for byte, for every form of reference it takes
 * directly, and it must leave to the emitter those it cannot write. */
static void emit_direct_is_the_emitters_text(void **state)
{
    (void)state;
    char k128[129], k129[130];
    memset(k128, 'k', 128), k128[128] = '\0';
    memset(k129, 'q', 129), k129[129] = '\0';
    const char *names[] = {"step_1", "9abc", "ckpt-3.pt", "0b1x", "3f-2", k128,
                           /* each of these makes the emitter write all: */ "13", k129, "a b",
                           "1e5.0"};
    for (size_t extra = 5; extra < sizeof names / sizeof *names; extra++) {
        struct ck_pmf_meta m;
        struct ck_buf direct = CK_BUF_INIT, emitter = CK_BUF_INIT;
        assert_int_equal(ck_pmf_parse(&m, "metadata.yaml", good, strlen(good)), 0);
        int64_t epoch = 20;
        for (size_t i = 0; i <= extra; i++) {
            struct ck_pmf_ref r = {false, 0, (char *)names[i]};
            char path[300];
            snprintf(path, sizeof path, "data/checkpoints/%s", names[i]);
            if (!strcmp(names[i], "a b"))
                snprintf(path, sizeof path, "data/checkpoints/a b");
            assert_int_equal(ck_pmf_register(&m, &r, epoch++, path,
                                             "0123456789abcdef0123456789abcdef", 30.0, 0), 0);
        }
        struct ck_pmf_ref neg = {true, -7, NULL}, big = {true, INT64_MAX, NULL};
        assert_int_equal(ck_pmf_register(&m, &neg, epoch++, "data/checkpoints/n7",
                                         "9d1d08d1fbd1ebc350ccf3c0256b06e9", 31.0, 0), 0);
        assert_int_equal(ck_pmf_register(&m, &big, epoch++, "data/checkpoints/big",
                                         "1234567890123456789012345678901a", 32.0, 0), 0);
        assert_int_equal(ck_pmf_emit(&m, &direct), 0);
        assert_int_equal(ck_pmf_emit_by_emitter(&m, &emitter), 0);
        if (direct.len != emitter.len || memcmp(direct.data, emitter.data, direct.len))
            fail_msg("with '%s': direct text\n%s\nemitter's\n%s", names[extra],
                     ck_buf_str(&direct), ck_buf_str(&emitter));
        ck_pmf_meta_release(&m);
        ck_buf_release(&direct);
        ck_buf_release(&emitter);
    }
}

static void empty_checkpoints_emit_braces(void **state)
{
    (void)state;
    struct ck_pmf_meta m;
    struct ck_buf out = CK_BUF_INIT;
    ck_pmf_meta_init(&m);
    m.producer_name = strdup("ckptd");
    m.producer_version_format = strdup("py_pa");
    m.producer_version = strdup("1");
    m.id = strdup("x");
    m.config_path = strdup("c.yaml");
    strcpy(m.config_md5, "9d1d08d1fbd1ebc350ccf3c0256b06e9");
    assert_int_equal(ck_pmf_emit(&m, &out), 0);
    assert_non_null(strstr(ck_buf_str(&out), "checkpoints: {}"));
    assert_non_null(strstr(ck_buf_str(&out), "name: null"));
    ck_pmf_meta_release(&m);
    ck_buf_release(&out);
}

static void transitions(void **state)
{
    (void)state;
    struct ck_pmf_meta m;
    ck_pmf_meta_init(&m);
    m.status = CK_PMF_PENDING;
    assert_int_equal(ck_pmf_set_status(&m, CK_PMF_FINISHED, 1.0), CK_ESTATE);
    assert_int_equal(ck_pmf_set_status(&m, CK_PMF_RUNNING, 1.0), 0);
    assert_int_equal(ck_pmf_set_status(&m, CK_PMF_PENDING, 2.0), CK_ESTATE);
    assert_int_equal(ck_pmf_set_status(&m, CK_PMF_FINISHED, 3.0), 0);
    assert_true(m.end_time.set && m.end_epoch.set);
    assert_int_equal(ck_pmf_set_status(&m, CK_PMF_FAILED, 4.0), CK_ESTATE);
    assert_int_equal(ck_pmf_validate(&m, "m"), 0);
    struct ck_pmf_ref r = {false, 0, "late"};
    assert_int_equal(ck_pmf_register(&m, &r, 1, "p", "0123456789abcdef0123456789abcdef", 5.0, 0),
                     CK_ESTATE);
    ck_pmf_meta_release(&m);
}

static void unregister_moves_latest_back(void **state)
{
    (void)state;
    struct ck_pmf_meta m;
    assert_int_equal(ck_pmf_parse(&m, "metadata.yaml", good, strlen(good)), 0);
    assert_int_equal(ck_pmf_unregister(&m, 1), 0);
    assert_true(m.latest.is_int);
    assert_int_equal(m.latest.i, 1);
    ck_pmf_meta_release(&m);
}

static void golden_tree_parses(void **state)
{
    (void)state;
    const char *shared = getenv("CK_SHARED_DATA");
    char path[4096];
    snprintf(path, sizeof path, "%s/pmf/plums_golden/metadata.yaml", shared ? shared : "");
    if (!shared || !ck_exists(path))
        skip();
    struct ck_buf b = CK_BUF_INIT;
    struct ck_pmf_meta m;
    assert_int_equal(ck_read_file(path, 1 << 20, &b), 0);
    assert_int_equal(ck_pmf_parse(&m, path, ck_buf_str(&b), b.len), 0);
    assert_int_equal(m.ncheckpoints, 2);
    assert_false(m.checkpoints[0].ref.is_int);
    assert_string_equal(m.checkpoints[0].ref.s, "epoch_1");
    assert_true(m.checkpoints[1].ref.is_int);
    assert_int_equal(m.status, CK_PMF_FINISHED);
    assert_int_equal(m.init.kind, CK_PMF_INIT_FILE);
    ck_pmf_meta_release(&m);
    ck_buf_release(&b);
}

static void patterns(void **state)
{
    (void)state;
    bool he, hs;
    int64_t e, s;
    assert_true(ck_pattern_match("epoch_{epoch}.pt", "epoch_12.pt", &he, &e, &hs, &s));
    assert_true(he && !hs && e == 12);
    assert_true(ck_pattern_match("*.ckpt-{step}", "model.ckpt-300", &he, &e, &hs, &s));
    assert_true(hs && s == 300);
    assert_true(ck_pattern_match("e{epoch}_s{step}.bin", "e3_s1200.bin", &he, &e, &hs, &s));
    assert_true(e == 3 && s == 1200);
    assert_true(ck_pattern_match("step{step}0.pt", "step120.pt", &he, &e, &hs, &s));
    assert_true(s == 12);
    assert_false(ck_pattern_match("epoch_{epoch}.pt", "epoch_.pt", &he, &e, &hs, &s));
    assert_false(ck_pattern_match("epoch_{epoch}.pt", "epoch_1.pt.tmp", &he, &e, &hs, &s));
    assert_false(ck_pattern_match("epoch_{epoch}.pt", "epoch_99999999999999999999.pt", &he, &e,
                                  &hs, &s));
    assert_true(ck_glob_match("*.tmp", "a.tmp"));
    assert_true(ck_glob_match(".~*", ".~lock"));
    assert_false(ck_glob_match("*.tmp", "a.tmpx"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(parses_good),
    cmocka_unit_test(rejects_what_plums_rejects),
    cmocka_unit_test(checkpoints_null_is_invalid),
    cmocka_unit_test(emit_direct_is_the_emitters_text),
    cmocka_unit_test(emit_round_trips),
    cmocka_unit_test(empty_checkpoints_emit_braces),
    cmocka_unit_test(transitions),
    cmocka_unit_test(unregister_moves_latest_back),
    cmocka_unit_test(golden_tree_parses),
    cmocka_unit_test(patterns),
};

CK_TEST_MAIN(tests)
