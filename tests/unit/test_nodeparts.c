/* agent/nodeparts: the part manifest and the commit record of a multi-node
 * step (docs/multinode.md): what is written reads back and is written again
 * as the same bytes, a file two parts share is listed once, a conflicting path is refused,
 * and hostile text is refused naming the file and the line. */
#include "test_main.h"

#include "agent/nodeparts.h"
#include "common/error.h"

#define MD5A "0cc175b9c0f1b6a831c399e269772661"
#define MD5B "92eb5ffee6ae2fec3ad71c777531578f"
#define SHA "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"

static void part_init(struct ck_nodepart *p, int rank, const char *const *paths, size_t n,
                      const char *md5)
{
    memset(p, 0, sizeof *p);
    p->checkpoint = strdup("global_step100");
    p->has_step = true;
    p->step = 100;
    p->epoch = 3;
    p->rank = rank;
    p->count = 2;
    p->settled = 1764340000.125 + rank;
    p->files = calloc(n, sizeof *p->files);
    for (size_t i = 0; i < n; i++) {
        p->files[i].path = strdup(paths[i]);
        p->files[i].size = 10 + i;
        strcpy(p->files[i].md5, md5);
        strcpy(p->files[i].sha256, SHA);
    }
    p->nfiles = n;
    assert_int_equal(ck_nodepart_sort(p), 0);
}

static void part_round_trip(void **state)
{
    (void)state;
    const char *paths[] = {"global_step100/b.pt", "global_step100/a b&c.pt"};
    struct ck_nodepart p, q;
    struct ck_buf a = CK_BUF_INIT, b = CK_BUF_INIT;
    part_init(&p, 1, paths, 2, MD5A);
    assert_int_equal(ck_nodepart_emit(&p, &a), 0);
    assert_int_equal(ck_nodepart_parse(&q, "p.yaml", a.data, a.len), 0);
    assert_string_equal(q.checkpoint, "global_step100");
    assert_true(q.has_step);
    assert_int_equal(q.step, 100);
    assert_int_equal(q.rank, 1);
    assert_int_equal(q.count, 2);
    assert_int_equal(q.nfiles, 2);
    assert_string_equal(q.files[0].path, "global_step100/a b&c.pt"); /* sorted */
    assert_string_equal(q.files[1].sha256, SHA);
    assert_true(q.settled > 1764340001.124 && q.settled < 1764340001.126);
    assert_int_equal(ck_nodepart_emit(&q, &b), 0);
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.data, b.data, a.len);
    ck_nodepart_release(&p);
    ck_nodepart_release(&q);
    ck_buf_release(&a);
    ck_buf_release(&b);
}

static void record_is_a_function_of_the_parts(void **state)
{
    (void)state;
    const char *p0[] = {"global_step100/zero_pp_rank_0.pt", "global_step100/shared.pt"};
    const char *p1[] = {"global_step100/zero_pp_rank_1.pt", "global_step100/shared.pt"};
    struct ck_nodepart parts[2];
    char md5s[2][33] = {MD5A, MD5B};
    struct ck_nodecommit c, d;
    struct ck_buf a = CK_BUF_INIT, b = CK_BUF_INIT, sums = CK_BUF_INIT;
    part_init(&parts[0], 0, p0, 2, MD5A);
    part_init(&parts[1], 1, p1, 2, MD5A);
    /* the same file (path, size, md5) in two parts is listed once */
    for (int i = 0; i < 2; i++)
        for (size_t j = 0; j < 2; j++)
            if (strstr(parts[i].files[j].path, "shared"))
                parts[i].files[j].size = 99;
    assert_int_equal(ck_nodecommit_build(&c, parts, 2, (const char(*)[33])md5s), 0);
    assert_int_equal(c.nfiles, 3);
    assert_int_equal(c.count, 2);
    assert_true(c.settled > 1764340001.1); /* the latest of the parts' */
    assert_int_equal(ck_nodecommit_emit(&c, &a), 0);
    assert_int_equal(ck_nodecommit_parse(&d, "r.yaml", a.data, a.len), 0);
    assert_int_equal(ck_nodecommit_emit(&d, &b), 0);
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.data, b.data, a.len);
    assert_string_equal(d.part_md5[1], MD5B);
    assert_int_equal(ck_nodecommit_md5sums(&d, &sums), 0);
    assert_string_equal(ck_buf_str(&sums), MD5A "  global_step100/shared.pt\n" MD5A
                                           "  global_step100/zero_pp_rank_0.pt\n" MD5A
                                           "  global_step100/zero_pp_rank_1.pt\n");
    ck_nodecommit_release(&c);
    ck_nodecommit_release(&d);
    /* the same path with other bytes: a conflict naming it and both nodes */
    strcpy(parts[1].files[0].md5, MD5B);
    assert_int_equal(ck_nodecommit_build(&c, parts, 2, (const char(*)[33])md5s), CK_EEXIST);
    assert_non_null(strstr(ck_error_msg(), "'global_step100/shared.pt' is listed by node 0"));
    assert_non_null(strstr(ck_error_msg(), "by node 1"));
    ck_error_clear();
    ck_nodepart_release(&parts[0]);
    ck_nodepart_release(&parts[1]);
    ck_buf_release(&a);
    ck_buf_release(&b);
    ck_buf_release(&sums);
}

static void refused(const char *text, const char *words)
{
    struct ck_nodepart p;
    assert_int_equal(ck_nodepart_parse(&p, "node-1-of-2.yaml", text, strlen(text)), CK_EFORMAT);
    if (!strstr(ck_error_msg(), words) || !strstr(ck_error_msg(), "'node-1-of-2.yaml' line"))
        fail_msg("'%s' not in: %s", words, ck_error_msg());
    ck_error_clear();
}

#define HEAD "format: ckptd-part/1\ncheckpoint: s\nstep: 1\nepoch: 0\n"
#define NODE "node: {rank: 1, count: 2}\ntraining: running\nsettled: 1.5\n"
#define FILE1(path) "  - {path: " path ", size: 1, md5: " MD5A ", sha256: " SHA "}\n"

static void hostile_parts_are_refused(void **state)
{
    (void)state;
    struct ck_nodepart p;
    const char *ok = HEAD NODE "files:\n" FILE1("s/a") FILE1("s/b");
    assert_int_equal(ck_nodepart_parse(&p, "x", ok, strlen(ok)), 0);
    ck_nodepart_release(&p);
    refused("format: ckptd-part/2\ncheckpoint: s\nstep: 1\nepoch: 0\n" NODE "files: []\n",
            "'format' must be 'ckptd-part/1'");
    refused(HEAD NODE "files:\n" FILE1("s/b") FILE1("s/a"), "sorted by path");
    refused(HEAD NODE "files:\n" FILE1("s/a") FILE1("s/a"), "sorted by path, each once");
    refused(HEAD NODE "files:\n" FILE1("../etc/passwd"), "not a relative path");
    refused(HEAD NODE "files:\n" FILE1("/abs"), "not a relative path");
    refused(HEAD NODE "files:\n" FILE1("s//a"), "not a relative path");
    refused(HEAD NODE "files:\n" FILE1("'s/a\\\\b'"), "not a relative path");
    refused(HEAD NODE "files:\n" FILE1("\"s/a\\nb\""), "not a relative path");
    refused(HEAD NODE "files:\n  - {path: s/a, size: -1, md5: " MD5A ", sha256: " SHA "}\n",
            "'size' must be a whole number");
    refused(HEAD NODE "files:\n  - {path: s/a, size: 1, md5: " MD5B "0, sha256: " SHA "}\n",
            "'md5' must be 32 lower-case hex digits");
    refused(HEAD NODE "files:\n  - {path: s/a, size: 1, md5: " MD5A "}\n", "missing the key 'sha256'");
    refused(HEAD "node: {rank: 2, count: 2}\ntraining: running\nsettled: 1.5\nfiles: []\n",
            "'node.rank' must be a whole number from 0 to 1");
    refused(HEAD "node: {rank: 0, count: 0}\ntraining: running\nsettled: 1.5\nfiles: []\n",
            "'node.count'");
    refused(HEAD "node: {rank: 0, count: 2}\ntraining: done\nsettled: 1.5\nfiles: []\n",
            "'training' must be");
    refused(HEAD "node: {rank: 0, count: 2}\ntraining: running\nsettled: .nan\nfiles: []\n",
            "'settled' must be a time");
    refused(HEAD NODE "files: []\nextra: 1\n", "unexpected key");
    refused(HEAD NODE "files: {}\n", "'files' must be a list");
    refused("- just\n- a list\n", "'the part' must be a mapping");
    refused(HEAD NODE "files: []\nfiles: []\n", "duplicate key 'files'");
}

static void hostile_records_are_refused(void **state)
{
    (void)state;
    struct ck_nodecommit c;
    const char *two = "format: ckptd-commit/1\ncheckpoint: s\nstep: null\nepoch: 0\nnodes: 2\n"
                      "settled: 2.0\nparts:\n  - {rank: 0, md5: " MD5A "}\nfiles: []\n";
    assert_int_equal(ck_nodecommit_parse(&c, "r.yaml", two, strlen(two)), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "'parts' must list the 2 parts"));
    ck_error_clear();
    const char *swapped = "format: ckptd-commit/1\ncheckpoint: s\nstep: null\nepoch: 0\nnodes: 2\n"
                          "settled: 2.0\nparts:\n  - {rank: 1, md5: " MD5A "}\n"
                          "  - {rank: 0, md5: " MD5A "}\nfiles: []\n";
    assert_int_equal(ck_nodecommit_parse(&c, "r.yaml", swapped, strlen(swapped)), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "'parts[].rank' must be a whole number from 0 to 0"));
    ck_error_clear();
    const char *ok = "format: ckptd-commit/1\ncheckpoint: s\nstep: null\nepoch: 0\nnodes: 1\n"
                     "settled: 2.0\nparts:\n  - {rank: 0, md5: " MD5A "}\nfiles:\n"
                     "  - {path: s/a, size: 1, md5: " MD5A "}\n";
    assert_int_equal(ck_nodecommit_parse(&c, "r.yaml", ok, strlen(ok)), 0);
    assert_false(c.has_step);
    assert_string_equal(c.files[0].sha256, "");
    ck_nodecommit_release(&c);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(part_round_trip),
    cmocka_unit_test(record_is_a_function_of_the_parts),
    cmocka_unit_test(hostile_parts_are_refused),
    cmocka_unit_test(hostile_records_are_refused),
};
CK_TEST_MAIN(tests)
