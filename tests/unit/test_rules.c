/* The checkpoint-name rule (agent/rules.h): scan's walk (ck_discover) and the
 * watcher's path filter (ck_pathfilter_relevant) must accept and refuse the
 * same names, temporary names included. The expected answers come from the
 * documented default rules (README: checkpoints.patterns, .ignore), written
 * out by hand below, not from either function. */
#include "test_main.h"

#include "agent/config.h"
#include "agent/discover.h"
#include "agent/pathfilter.h"
#include "common/fsutil.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct name_case {
    const char *rel;
    bool checkpoint; /* by the default rules */
};

static const struct name_case cases[] = {
    {"epoch_1.pt", true},
    {"epoch-12.safetensors", true},
    {"model-epoch=3-val_loss=0.5.ckpt", true},
    {"checkpoint_100.bin", true},
    {"runs/a/epoch_2.pth", true},
    {"iter_7.npz", true},
    {"net_step_9.h5", true},
    {"epoch_1.pt.tmp", false},             /* *.tmp */
    {"epoch_2.pt.partial", false},         /* *.partial */
    {"epoch_3.pt.tempstate123", false},    /* *.tempstate* */
    {".epoch_4.pt", false},                /* .* */
    {".~lock.epoch_5.pt", false},          /* .~* */
    {".hidden/epoch_6.pt", false},         /* inside a temporary folder */
    {"tmp.partial/epoch_7.pt", false},     /* same */
    {"epoch_3.log", false},                /* not a checkpoint extension */
    {"notes.txt", false},
    {"epoch_.pt", false},                  /* {epoch} needs a number */
    {"lightning_logs/version_0/checkpoints/epoch=2-step=150.ckpt", true},
    {"lightning_logs/version_0/checkpoints/last.ckpt", true},
    {"epoch=3-val_loss=0.12.ckpt", true},
    {"weights.03-0.12.h5", true},
    {"last.pt", false},                    /* only Lightning's last.ckpt */
};

/* How the default rules read names (docs/checkpoints.md, written out by hand). */
struct reading {
    const char *name;
    bool folder, has_epoch, has_step;
    int64_t epoch, step;
};

static const struct reading readings[] = {
    {"epoch=2-step=150.ckpt", false, true, true, 2, 150}, /* not epoch 150: issue 29 */
    {"epoch=3-step=200-v1.ckpt", false, true, true, 3, 200},
    {"mnist-epoch=3-step=200.ckpt", false, true, true, 3, 200},
    {"epoch=3-val_loss=0.12.ckpt", false, true, false, 3, 0},
    {"last.ckpt", false, false, false, 0, 0},
    {"weights.03-0.12.h5", false, true, false, 3, 0},
    {"model.05.keras", false, true, false, 5, 0},
    {"epoch_3.pt", false, true, false, 3, 0},
    {"model_1200.pt", false, false, true, 0, 1200},
    {"checkpoint-500", true, false, true, 0, 500},
    {"global_step200", true, false, true, 0, 200},
    {"iter_0001000", true, false, true, 0, 1000},
    {"step-200", true, false, true, 0, 200},
};

static void default_names_are_read_as_documented(void **state)
{
    (void)state;
    struct ck_config cfg;
    ck_config_init(&cfg);
    for (size_t i = 0; i < sizeof readings / sizeof readings[0]; i++) {
        const struct reading *r = &readings[i];
        struct ck_name_captures c;
        if (!ck_rules_match(&cfg.ckpt, r->name, r->name, r->folder, &c))
            fail_msg("'%s' is not a checkpoint", r->name);
        if (c.has_epoch != r->has_epoch || c.has_step != r->has_step ||
            (r->has_epoch && c.epoch != r->epoch) || (r->has_step && c.step != r->step))
            fail_msg("'%s': read as epoch %d:%lld step %d:%lld by '%s'", r->name, c.has_epoch,
                     (long long)c.epoch, c.has_step, (long long)c.step, c.pattern);
        if (c.ambiguous)
            fail_msg("'%s': ambiguous with '%s'", r->name, c.alt_pattern);
    }
    ck_config_release(&cfg);
}

static void contradicting_patterns_are_reported(void **state)
{
    (void)state;
    struct ck_ckpt_rules r = {0};
    ck_strlist_add(&r.patterns, "*-{step}.pt");
    ck_strlist_add(&r.patterns, "ep{epoch}-*.pt");
    ck_strlist_add(&r.patterns, "*-{epoch}.pt");
    struct ck_name_captures c;
    assert_true(ck_rules_match(&r, "ep3-7.pt", "ep3-7.pt", false, &c));
    /* one capture each: the first pattern's reading, step 7; epoch 3 says otherwise */
    assert_true(c.has_step && !c.has_epoch && c.step == 7);
    assert_string_equal(c.pattern, "*-{step}.pt");
    assert_true(c.ambiguous);
    assert_true(c.alt_has_epoch && !c.alt_has_step && c.alt_epoch == 3);
    assert_string_equal(c.alt_pattern, "ep{epoch}-*.pt");
    ck_strlist_release(&r.patterns);
    ck_strlist_add(&r.patterns, "ep{epoch}-*.pt");
    ck_strlist_add(&r.patterns, "*-{epoch}.pt");
    ck_strlist_add(&r.patterns, "ep{epoch}-{step}.pt");
    assert_true(ck_rules_match(&r, "ep3-7.pt", "ep3-7.pt", false, &c));
    assert_true(c.has_epoch && c.has_step && c.epoch == 3 && c.step == 7);
    assert_string_equal(c.pattern, "ep{epoch}-{step}.pt");
    assert_true(c.ambiguous);
    assert_true(c.alt_has_epoch && c.alt_epoch == 7);
    assert_string_equal(c.alt_pattern, "*-{epoch}.pt");
    /* the path filter's question (no captures) stops at the first match */
    assert_true(ck_rules_match(&r, "ep3-7.pt", "ep3-7.pt", false, NULL));
    assert_false(ck_rules_match(&r, "ep3-7.pth", "ep3-7.pth", false, NULL));
    ck_strlist_release(&r.patterns);
}

static void write_file(const char *dir, const char *rel)
{
    char path[4096], parent[4096];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    ck_dirname(parent, sizeof parent, path);
    assert_int_equal(ck_mkdirs(parent, 0755), 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("x", f);
    fclose(f);
}

static bool discovered(const struct ck_discovery *d, const char *rel)
{
    for (size_t i = 0; i < d->ncands; i++)
        if (d->cands[i].kind == CK_CAND_FILE && !strcmp(d->cands[i].rel, rel))
            return true;
    return false;
}

static void scan_and_watch_agree_on_names(void **state)
{
    (void)state;
    char dir[] = "/tmp/ck_rules_XXXXXX";
    assert_non_null(mkdtemp(dir));
    size_t n = sizeof cases / sizeof cases[0];
    for (size_t i = 0; i < n; i++)
        write_file(dir, cases[i].rel);
    struct ck_config cfg;
    ck_config_init(&cfg);
    struct ck_discovery d = {0};
    assert_int_equal(ck_discover(dir, &cfg.ckpt, &d), 0);
    struct ck_pathfilter f = {&cfg.ckpt, NULL, NULL};
    for (size_t i = 0; i < n; i++) {
        bool scan = discovered(&d, cases[i].rel);
        bool watch = ck_pathfilter_relevant(&f, cases[i].rel);
        if (scan != cases[i].checkpoint || watch != cases[i].checkpoint)
            fail_msg("'%s': expected %s, scan says %s, watch says %s", cases[i].rel,
                     cases[i].checkpoint ? "yes" : "no", scan ? "yes" : "no",
                     watch ? "yes" : "no");
    }
    ck_discovery_release(&d);
    ck_config_release(&cfg);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(scan_and_watch_agree_on_names),
    cmocka_unit_test(default_names_are_read_as_documented),
    cmocka_unit_test(contradicting_patterns_are_reported),
};
CK_TEST_MAIN(tests)
