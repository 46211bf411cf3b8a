/* agent/nodes: the node identity from the config and the launchers'
 * variables (docs/multinode.md), with an environment of the test's own. */
#include "test_main.h"

#include "agent/config.h"
#include "agent/nodes.h"
#include "common/error.h"

/* The environment the resolver sees: "NAME=VALUE" strings, NULL-ended. */
static const char *const *fake_env;

static const char *fake_getenv(const char *name)
{
    size_t n = strlen(name);
    for (const char *const *e = fake_env; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

/* Resolves with env and the config values (-1: not set; set ones come from
 * the flags --rank and --count, through the key table's parser). */
static int resolve(struct ck_nodes *out, const char *const *env, const char *rank,
                   const char *count)
{
    struct ck_config cfg;
    ck_config_init(&cfg);
    int err = 0;
    if (rank)
        err = ck_config_set(&cfg, "nodes.rank", rank, "--rank");
    if (err == 0 && count)
        err = ck_config_set(&cfg, "nodes.count", count, "--count");
    fake_env = env;
    if (err == 0)
        err = ck_nodes_resolve(out, &cfg, fake_getenv);
    ck_config_release(&cfg);
    return err;
}

#define ENV(...) ((const char *const[]){__VA_ARGS__, NULL})

static void expect(const char *const *env, const char *rank, const char *count, int want_rank,
                   int want_count, const char *rank_from, const char *count_from)
{
    struct ck_nodes n;
    int err = resolve(&n, env, rank, count);
    if (err < 0)
        fail_msg("%s", ck_error_msg());
    assert_int_equal(n.rank, want_rank);
    assert_int_equal(n.count, want_count);
    assert_string_equal(n.rank_from, rank_from);
    assert_string_equal(n.count_from, count_from);
}

/* The error names the key and every word of want (the variables, values). */
static void refused(const char *const *env, const char *rank, const char *count, const char *key,
                    const char *want1, const char *want2)
{
    struct ck_nodes n;
    int err = resolve(&n, env, rank, count);
    if (err != CK_ECONFIG)
        fail_msg("accepted: rank %d count %d", n.rank, n.count);
    const char *msg = ck_error_msg();
    if (!strstr(msg, key) || !strstr(msg, want1) || (want2 && !strstr(msg, want2)))
        fail_msg("'%s' does not name '%s', '%s', '%s'", msg, key, want1, want2 ? want2 : "");
}

static void defaults_are_a_single_node(void **state)
{
    (void)state;
    expect(ENV("PATH=/bin"), NULL, NULL, 0, 1, "default", "default: a single node");
    /* a rank with no count anywhere (an Indexed Job running a sweep of
     * single-node trainings): a single node, the variable noted as unused */
    struct ck_nodes n;
    assert_int_equal(resolve(&n, ENV("JOB_COMPLETION_INDEX=3"), NULL, NULL), 0);
    assert_int_equal(n.count, 1);
    assert_int_equal(n.rank, 0);
    assert_non_null(strstr(n.unused, "JOB_COMPLETION_INDEX=3"));
}

static void each_launcher_gives_rank_and_count(void **state)
{
    (void)state;
    expect(ENV("SLURM_NODEID=2", "SLURM_NNODES=4", "SLURM_JOB_ID=77"), NULL, NULL, 2, 4,
           "SLURM_NODEID=2", "SLURM_NNODES=4");
    expect(ENV("PET_NODE_RANK=1", "PET_NNODES=3"), NULL, NULL, 1, 3, "PET_NODE_RANK=1",
           "PET_NNODES=3");
    expect(ENV("GROUP_RANK=5", "NNODES=8"), NULL, NULL, 5, 8, "GROUP_RANK=5", "NNODES=8");
    /* torchrun's elastic form with a fixed number */
    expect(ENV("PET_NODE_RANK=0", "PET_NNODES=4:4"), NULL, NULL, 0, 4, "PET_NODE_RANK=0",
           "PET_NNODES=4:4");
    /* an Indexed Job gives the index; the count comes from the config */
    expect(ENV("JOB_COMPLETION_INDEX=3"), NULL, "4", 3, 4, "JOB_COMPLETION_INDEX=3", "--count");
    expect(ENV("OMPI_COMM_WORLD_RANK=6", "OMPI_COMM_WORLD_SIZE=7",
               "OMPI_COMM_WORLD_LOCAL_SIZE=1"),
           NULL, NULL, 6, 7, "OMPI_COMM_WORLD_RANK=6", "OMPI_COMM_WORLD_SIZE=7");
    expect(ENV("PMI_RANK=1", "PMI_SIZE=2"), NULL, NULL, 1, 2, "PMI_RANK=1", "PMI_SIZE=2");
    /* two launchers that agree (torchrun under SLURM) */
    expect(ENV("SLURM_NODEID=1", "SLURM_NNODES=2", "PET_NODE_RANK=1", "PET_NNODES=2"), NULL, NULL,
           1, 2, "SLURM_NODEID=1", "SLURM_NNODES=2");
}

static void config_overrides_launchers(void **state)
{
    (void)state;
    struct ck_nodes n;
    expect(ENV("SLURM_NODEID=1", "SLURM_NNODES=2"), "3", "4", 3, 4, "--rank", "--count");
    assert_int_equal(resolve(&n, ENV("SLURM_NODEID=1", "SLURM_NNODES=2"), NULL, "4"), 0);
    assert_int_equal(n.rank, 1); /* the rank still from SLURM */
    assert_non_null(strstr(n.unused, "SLURM_NNODES=2"));
    /* an overridden variable is not read: a bad one does not matter */
    expect(ENV("SLURM_NODEID=x", "SLURM_NNODES=y"), "0", "2", 0, 2, "--rank", "--count");
}

static void count_one_is_a_single_node(void **state)
{
    (void)state;
    expect(ENV("SLURM_NODEID=0", "SLURM_NNODES=1"), NULL, NULL, 0, 1, "default",
           "SLURM_NNODES=1");
    /* nodes.count: 1 (one sidecar on a shared filesystem) on any node of a job */
    expect(ENV("SLURM_NODEID=3", "SLURM_NNODES=4"), NULL, "1", 0, 1, "default", "--count");
    refused(ENV("PATH=/bin"), "1", "1", "nodes.rank", "is not below nodes.count 1", "--rank");
}

static void bad_values_name_key_and_variable(void **state)
{
    (void)state;
    refused(ENV("SLURM_NODEID=x", "SLURM_NNODES=4"), NULL, NULL, "nodes.rank", "SLURM_NODEID='x'",
            NULL);
    refused(ENV("SLURM_NODEID=-1", "SLURM_NNODES=4"), NULL, NULL, "nodes.rank",
            "SLURM_NODEID='-1'", NULL);
    refused(ENV("SLURM_NODEID=0", "SLURM_NNODES=0"), NULL, NULL, "nodes.count", "SLURM_NNODES='0'",
            NULL);
    refused(ENV("SLURM_NODEID=0", "SLURM_NNODES=99999999"), NULL, NULL, "nodes.count",
            "SLURM_NNODES='99999999'", NULL);
    refused(ENV("SLURM_NODEID=4", "SLURM_NNODES=4"), NULL, NULL, "nodes.rank", "SLURM_NODEID=4",
            "SLURM_NNODES=4");
    refused(ENV("PET_NODE_RANK=0", "PET_NNODES=2:4"), NULL, NULL, "nodes.count",
            "PET_NNODES='2:4'", "elastic");
    refused(ENV("SLURM_NODEID=0", "SLURM_NNODES=2", "PET_NNODES=4"), NULL, NULL, "nodes.count",
            "SLURM_NNODES=2", "PET_NNODES=4");
    refused(ENV("SLURM_NODEID=0", "SLURM_NNODES=2", "PMI_RANK=1"), NULL, NULL, "nodes.rank",
            "SLURM_NODEID=0", "PMI_RANK=1");
    refused(ENV("SLURM_NNODES=2"), NULL, NULL, "nodes.rank", "SLURM_NNODES=2", "set nodes.rank");
    refused(ENV("PATH=/bin"), NULL, "3", "nodes.rank", "--count", "set nodes.rank");
    refused(ENV("OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=16",
                "OMPI_COMM_WORLD_LOCAL_SIZE=4"),
            NULL, NULL, "nodes.", "OMPI_COMM_WORLD_LOCAL_SIZE=4", "one ckptd per node");
    refused(ENV("PMI_RANK=3", "PMI_SIZE=16", "MPI_LOCALNRANKS=8"), NULL, NULL, "nodes.",
            "MPI_LOCALNRANKS=8", NULL);
    /* the config's own values, through the key table's parser */
    refused(ENV("PATH=/bin"), "-1", NULL, "nodes.rank", "--rank", "whole number");
    refused(ENV("PATH=/bin"), NULL, "0", "nodes.count", "--count", "whole number");
    refused(ENV("PATH=/bin"), NULL, "two", "nodes.count", "--count", "whole number");
    refused(ENV("PATH=/bin"), "0", "65537", "nodes.count", "--count", "65536");
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(defaults_are_a_single_node),
    cmocka_unit_test(each_launcher_gives_rank_and_count),
    cmocka_unit_test(config_overrides_launchers),
    cmocka_unit_test(count_one_is_a_single_node),
    cmocka_unit_test(bad_values_name_key_and_variable),
};
CK_TEST_MAIN(tests)
