/* stores: the README that keeps an empty data/initialisation/ in every copy
 * of a PMF tree (issue 17). The rule (FORMAT-FACTS.md 1.3): only a model
 * trained from scratch (initialisation: null) may have plain files there, so
 * the file is written only then, only into an empty or missing folder, and
 * nothing else of the tree is touched. */
#include "tests/unit/test_main.h"

#include "stores/pmftree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static void put(const char *dir, const char *rel, const char *text)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static bool has_readme(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, CK_PMFTREE_INIT_README);
    return access(path, F_OK) == 0;
}

static void make_tree(char *dir, const char *name, const char *meta, bool with_init_dir)
{
    char p[4200];
    ck_test_tmpdir(dir, name);
    snprintf(p, sizeof p, "%s/data", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    if (with_init_dir) {
        snprintf(p, sizeof p, "%s/data/initialisation", dir);
        assert_int_equal(mkdir(p, 0755), 0);
    }
    if (meta)
        put(dir, "metadata.yaml", meta);
}

static void from_scratch_gets_the_readme(void **state)
{
    char dir[4000];
    bool wrote = false;
    make_tree(dir, "pmf_null", "model:\n  name: x\n  initialisation: null\n", true);
    assert_int_equal(ck_pmftree_mark_empty_init(dir, &wrote), 0);
    assert_true(wrote);
    assert_true(has_readme(dir));
    /* a second call finds the folder no longer empty */
    assert_int_equal(ck_pmftree_mark_empty_init(dir, &wrote), 0);
    assert_false(wrote);
    /* '~' and an empty value are YAML nulls too; a missing folder is created */
    make_tree(dir, "pmf_tilde", "model:\n  initialisation: ~\n", false);
    assert_int_equal(ck_pmftree_mark_empty_init(dir, &wrote), 0);
    assert_true(wrote && has_readme(dir));
    make_tree(dir, "pmf_empty", "model:\n  initialisation:\n  name: y\n", true);
    assert_int_equal(ck_pmftree_mark_empty_init(dir, &wrote), 0);
    assert_true(wrote);
}

static void other_trees_are_left_alone(void **state)
{
    char dir[4000];
    bool wrote = true;
    /* a file initialisation: the folder must hold that file, not a README */
    make_tree(dir, "pmf_file",
              "model:\n  initialisation: {file: {name: a, path: data/initialisation/a.pt, "
              "hash: 0123456789abcdef0123456789abcdef}}\n",
              true);
    assert_int_equal(ck_pmftree_mark_empty_init(dir, &wrote), 0);
    assert_false(wrote);
    assert_false(has_readme(dir));
    /* "null" quoted is a string, not null */
    make_tree(dir, "pmf_quoted", "model:\n  initialisation: 'null'\n", true);
    assert_int_equal(ck_pmftree_mark_empty_init(dir, &wrote), 0);
    assert_false(wrote);
    /* a folder that already has files */
    make_tree(dir, "pmf_full", "model:\n  initialisation: null\n", true);
    put(dir, "data/initialisation/notes.txt", "x");
    assert_int_equal(ck_pmftree_mark_empty_init(dir, &wrote), 0);
    assert_false(wrote);
    assert_false(has_readme(dir));
    /* no metadata.yaml, or one that is not YAML: not a PMF tree to fix */
    make_tree(dir, "pmf_nometa", NULL, true);
    assert_int_equal(ck_pmftree_mark_empty_init(dir, &wrote), 0);
    assert_false(wrote);
    make_tree(dir, "pmf_badyaml", "model: [unclosed\n", true);
    assert_int_equal(ck_pmftree_mark_empty_init(dir, &wrote), 0);
    assert_false(wrote);
}

/* Which checkpoint an uploaded file is part of: a file checkpoint by its own
 * path, a folder checkpoint's files by the folder (written with or without
 * its slash), anything else none; references as metadata.yaml spells them. */
static void files_map_to_their_checkpoint(void **state)
{
    char dir[4000], meta[4200];
    struct ck_pmftree_ckpts c;
    make_tree(dir, "pmf_ckpts",
              "model:\n  training:\n    checkpoints:\n"
              "      epoch_1.pt: {epoch: 1, path: data/checkpoints/epoch_1.pt, hash: x}\n"
              "      7: {epoch: 7, path: data/checkpoints/step_7/, hash: y}\n"
              "      step_70: {epoch: 7, path: data/checkpoints/step_70, hash: z}\n",
              false);
    snprintf(meta, sizeof meta, "%s/metadata.yaml", dir);
    ck_pmftree_checkpoints(meta, &c);
    assert_int_equal(c.n, 3);
    assert_string_equal(ck_pmftree_checkpoint_of(&c, "data/checkpoints/epoch_1.pt"), "epoch_1.pt");
    assert_string_equal(ck_pmftree_checkpoint_of(&c, "data/checkpoints/step_7/model.safetensors"),
                        "7");
    assert_string_equal(ck_pmftree_checkpoint_of(&c, "data/checkpoints/step_7/a/b.bin"), "7");
    assert_string_equal(ck_pmftree_checkpoint_of(&c, "data/checkpoints/step_70/x"), "step_70");
    assert_null(ck_pmftree_checkpoint_of(&c, "data/checkpoints/step_7x"));
    assert_null(ck_pmftree_checkpoint_of(&c, "data/checkpoints/epoch_1.pt.md5"));
    assert_null(ck_pmftree_checkpoint_of(&c, "data/build_parameters.yaml"));
    ck_pmftree_checkpoints_release(&c);
    /* unreadable: no names, no error */
    put(dir, "metadata.yaml", "model: [unclosed\n");
    ck_pmftree_checkpoints(meta, &c);
    assert_int_equal(c.n, 0);
    assert_null(ck_pmftree_checkpoint_of(&c, "data/checkpoints/epoch_1.pt"));
    ck_pmftree_checkpoints_release(&c);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(files_map_to_their_checkpoint),
    cmocka_unit_test(from_scratch_gets_the_readme),
    cmocka_unit_test(other_trees_are_left_alone),
};
CK_TEST_MAIN(tests)
