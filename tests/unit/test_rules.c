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
};

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
};
CK_TEST_MAIN(tests)
