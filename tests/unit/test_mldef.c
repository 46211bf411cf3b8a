/* The .mldef pieces in C: the name rules, Ed25519 keys and signatures, the
 * zip layer's limits, and the writer on a model built by hand, read back by
 * the validator/loader. Expected values are the literals the model was made
 * from (float16 values chosen to be exact). */
#include "test_main.h"

#include "common/error.h"
#include "common/hash.h"
#include "common/sign.h"
#include "model/mldef.h"
#include "model/model.h"
#include "readers/mldefcheck.h"
#include "writers/mldef.h"
#include "writers/mldefzip.h"
#include "writers/writer.h"

#include <dirent.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

static void path_rules(void **state)
{
    (void)state;
    char why[160];
    const char *ok[] = {"manifest.json", "data/w000.float32", "a/b/c.csv", "SIGNATURE",
                        "abcdefghijklmno"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        assert_null(ck_mldef_path_rule(ok[i], why, sizeof why));
    struct {
        const char *path, *rule;
    } bad[] = {{"Data/w.csv", "name.charset"},
               {"data/w x.csv", "name.charset"},
               {"abcdefghijklmnop", "name.length"},
               {"a/b/c/d.csv", "path.depth"},
               {"../w.csv", "path.escape"},
               {"/etc/w.csv", "path.escape"},
               {"a//w.csv", "path.escape"},
               {"a\\w.csv", "path.escape"},
               {"c:w.csv", "path.escape"},
               {"./w.csv", "path.escape"},
               {"", "path.escape"},
               {"data/SIGNATURE", "name.charset"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *r = ck_mldef_path_rule(bad[i].path, why, sizeof why);
        assert_non_null(r);
        assert_string_equal(r, bad[i].rule);
    }
}

static void sign_round_trip_and_key_files(void **state)
{
    (void)state;
    char dir[4000], key[4100], pub[4200];
    ck_test_tmpdir(dir, "sign");
    snprintf(key, sizeof key, "%s/k", dir);
    snprintf(pub, sizeof pub, "%s/k.pub", dir);
    struct ck_sign_key k, loaded, pubonly;
    assert_int_equal(ck_sign_generate(&k), 0);
    assert_int_equal(ck_sign_write_keys(&k, key), 0);
    struct stat st;
    assert_int_equal(stat(key, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(ck_sign_write_keys(&k, key), CK_EEXIST);
    assert_int_equal(ck_sign_load(key, &loaded), 0);
    assert_true(loaded.has_priv);
    assert_memory_equal(loaded.pub, k.pub, 32);
    char ref[4300];
    snprintf(ref, sizeof ref, "file:%s", pub);
    assert_int_equal(ck_sign_load(ref, &pubonly), 0);
    assert_false(pubonly.has_priv);
    assert_memory_equal(pubonly.pub, k.pub, 32);
    unsigned char sig[64];
    const char msg[] = "mldef-signature 1\n";
    ck_sign(&loaded, msg, sizeof msg - 1, sig);
    assert_true(ck_sign_verify(k.pub, msg, sizeof msg - 1, sig));
    assert_false(ck_sign_verify(k.pub, msg, sizeof msg - 2, sig));
    sig[5] ^= 1;
    assert_false(ck_sign_verify(k.pub, msg, sizeof msg - 1, sig));
    /* a private key others can read is refused, and the error holds no key */
    chmod(key, 0644);
    assert_int_equal(ck_sign_load(key, &loaded), CK_ECONFIG);
    char hex[65];
    ck_hex(hex, k.priv, 32);
    assert_null(strstr(ck_error_msg(), hex));
    unlink(key);
    unlink(pub);
    rmdir(dir);
}

static void zip_limits(void **state)
{
    (void)state;
    char dir[4000], out[4100];
    ck_test_tmpdir(dir, "ziplim");
    snprintf(out, sizeof out, "%s/a.mldef", dir);
    struct ck_mldef_zip *z;
    assert_int_equal(ck_mldef_zip_open(out, 0, NULL, &z), 0);
    assert_int_equal(ck_mldef_zip_add_buffer(z, "Bad.csv", "1", 1), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "name.charset"));
    assert_int_equal(ck_mldef_zip_add_buffer(z, "a.csv", "1", 1), 0);
    assert_int_equal(ck_mldef_zip_add_buffer(z, "a.csv", "1", 1), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "files.duplicate"));
    char name[32];
    for (int i = 1; i < 100; i++) {
        snprintf(name, sizeof name, "f%d.csv", i);
        assert_int_equal(ck_mldef_zip_add_buffer(z, name, "1", 1), 0);
    }
    assert_int_equal(ck_mldef_zip_add_buffer(z, "f100.csv", "1", 1), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "files.count"));
    ck_mldef_zip_free(z); /* never finished: nothing is left */
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.' || (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."));
    closedir(d);
    assert_int_equal(n, 0);
    rmdir(dir);
}

/* x[-1,3] -> dense(W f16 [3,2] in_out, b f32 [2]) -> relu -> mul 2.5 ->
 * concat(relu, mul) axis 1 -> dense(W f64 [4,1], b f64 [1], trans_w off) -> y */
static const float w1[6] = {0.5f, -1.0f, 2.0f, 0.25f, -0.125f, 3.0f};
static const float b1[2] = {0.1f, -0.2f};
static const double w2[4] = {1.0 / 3, -2.0 / 7, 5.5, 1e-300};
static const double b2[1] = {0.7};

static uint16_t f16(float v)
{
    /* the f16 bits of the exact values above (sign, exponent, mantissa) */
    union {
        float f;
        uint32_t u;
    } x = {.f = v};
    uint32_t sign = (x.u >> 16) & 0x8000, exp = (x.u >> 23) & 0xff, man = x.u & 0x7fffff;
    return (uint16_t)(sign | ((exp - 127 + 15) << 10) | (man >> 13));
}

static void add_tensor(struct ck_tensor_set *s, const char *name, enum ck_dtype dt, int rank,
                       const int64_t *dims, const void *data, size_t nbytes)
{
    void *buf = NULL;
    assert_int_equal(ck_tensor_set_alloc(s, nbytes, &buf), 0);
    memcpy(buf, data, nbytes);
    struct ck_tensor t = {
        .name = (char *)name, .dtype = dt, .rank = rank, .nbytes = nbytes, .data = buf};
    memcpy(t.dims, dims, (size_t)rank * sizeof *dims);
    assert_int_equal(ck_tensor_set_add(s, &t, NULL), 0);
}

static struct ck_model *hand_model(bool drop_data)
{
    struct ck_tensor_set *s = ck_tensor_set_new("test", "hand");
    uint16_t h[6];
    for (int i = 0; i < 6; i++)
        h[i] = f16(w1[i]);
    add_tensor(s, "fc1.w", CK_DT_F16, 2, (int64_t[]){3, 2}, h, sizeof h);
    add_tensor(s, "fc1.b", CK_DT_F32, 1, (int64_t[]){2}, b1, sizeof b1);
    add_tensor(s, "fc2.w", CK_DT_F64, 2, (int64_t[]){4, 1}, w2, sizeof w2);
    add_tensor(s, "fc2.b", CK_DT_F64, 1, (int64_t[]){1}, b2, sizeof b2);
    if (drop_data)
        s->tensors[2].data = NULL;
    struct ck_model *m;
    assert_int_equal(ck_model_new(s, "layers", &m), 0);
    m->name = strdup("hand");
    assert_int_equal(ck_model_add_io(m, false, "x", CK_DT_F32, 2, (int64_t[]){-1, 3}), 0);
    assert_int_equal(ck_model_add_io(m, true, "y", CK_DT_F32, 2, (int64_t[]){-1, 1}), 0);
    struct ck_model_node *n;
    assert_int_equal(ck_model_add_node(m, "fc1", CK_OP_DENSE, &n), 0);
    ck_model_node_add_input(n, "x");
    ck_model_node_add_input(n, "fc1.w");
    ck_model_node_add_input(n, "fc1.b");
    ck_model_node_add_output(n, "h1");
    assert_int_equal(ck_model_add_node(m, "act", CK_OP_RELU, &n), 0);
    ck_model_node_add_input(n, "h1");
    ck_model_node_add_output(n, "a");
    assert_int_equal(ck_model_add_node(m, "twice", CK_OP_MUL, &n), 0);
    ck_model_node_add_input(n, "a");
    ck_model_node_add_output(n, "b");
    n->p.has_scalar = true;
    n->p.scalar = 2.5f;
    assert_int_equal(ck_model_add_node(m, "join", CK_OP_CONCAT, &n), 0);
    ck_model_node_add_input(n, "a");
    ck_model_node_add_input(n, "b");
    ck_model_node_add_output(n, "c");
    n->p.axis = 1;
    assert_int_equal(ck_model_add_node(m, "fc2", CK_OP_DENSE, &n), 0);
    ck_model_node_add_input(n, "c");
    ck_model_node_add_input(n, "fc2.w");
    ck_model_node_add_input(n, "fc2.b");
    ck_model_node_add_output(n, "y");
    n->p.alpha = 0.2f; /* not read by dense, but must survive */
    assert_int_equal(ck_model_node_set_ints(n, (int64_t[]){7, -1}, 2), 0);
    return m;
}

static void writer_hand_model_round_trip(void **state)
{
    (void)state;
    char dir[4000], out[4100];
    ck_test_tmpdir(dir, "hand");
    snprintf(out, sizeof out, "%s/hand.mldef", dir);
    struct ck_model *m = hand_model(false);
    const struct ck_writer_ops *ops = ck_writer_find("mldef");
    assert_non_null(ops);
    struct ck_writer_opts o = {.level = 0};
    struct ck_writer *w;
    assert_int_equal(ck_writer_open(ops, out, &o, &w), 0);
    assert_int_equal(ck_writer_add(w, m), 0);
    assert_int_equal(ck_writer_finish(w), 0);
    ck_writer_free(w);

    struct ck_mldef_report r;
    struct ck_model *back = NULL;
    assert_int_equal(ck_mldef_check(out, NULL, &r, &back), 0);
    for (size_t i = 0; i < r.n; i++)
        print_error("%s: %s [%s]\n", r.v[i].where, r.v[i].msg, r.v[i].rule);
    assert_int_equal(r.n, 0);
    ck_mldef_report_release(&r);
    assert_non_null(back);
    assert_string_equal(back->name, "hand");
    assert_int_equal(back->nnodes, m->nnodes);
    for (size_t i = 0; i < m->nnodes; i++) {
        const struct ck_model_node *a = &m->nodes[i], *b = &back->nodes[i];
        assert_string_equal(a->name, b->name);
        assert_int_equal(a->op, b->op);
        assert_int_equal(a->ninputs, b->ninputs);
        for (size_t k = 0; k < a->ninputs; k++)
            assert_string_equal(a->inputs[k], b->inputs[k]);
        assert_int_equal(a->noutputs, b->noutputs);
        assert_string_equal(a->outputs[0], b->outputs[0]);
        assert_int_equal(a->p.has_scalar, b->p.has_scalar);
        assert_true(a->p.scalar == b->p.scalar);
        assert_true(a->p.alpha == b->p.alpha);
        assert_int_equal(a->p.axis, b->p.axis);
        assert_int_equal(a->p.nints, b->p.nints);
    }
    assert_int_equal(back->nodes[4].p.ints[0], 7);
    assert_int_equal(back->nodes[4].p.ints[1], -1);
    assert_int_equal(back->ninputs, 1);
    assert_int_equal(back->inputs[0].dims[1], 3);
    assert_int_equal(back->noutputs, 1);
    /* weights: float16 became float32 exactly; float64 layers stayed float64 */
    const struct ck_tensor *t = ck_model_weight(back, "fc1.w");
    assert_int_equal(t->dtype, CK_DT_F32);
    assert_int_equal(t->dims[0], 3);
    for (int i = 0; i < 6; i++)
        assert_true(((const float *)(const void *)t->data)[i] == w1[i]);
    t = ck_model_weight(back, "fc1.b");
    assert_memory_equal(t->data, b1, sizeof b1);
    t = ck_model_weight(back, "fc2.w");
    assert_int_equal(t->dtype, CK_DT_F64);
    assert_memory_equal(t->data, w2, sizeof w2);
    t = ck_model_weight(back, "fc2.b");
    assert_memory_equal(t->data, b2, sizeof b2);
    ck_model_free(back);
    ck_model_free(m);
    unlink(out);
    rmdir(dir);
}

static void writer_failures_leave_nothing(void **state)
{
    (void)state;
    char dir[4000], out[4100];
    ck_test_tmpdir(dir, "fail");
    snprintf(out, sizeof out, "%s/x.mldef", dir);
    const struct ck_writer_ops *ops = ck_writer_find("mldef");
    struct ck_writer_opts o = {.level = -1};
    struct ck_writer *w;
    /* a weight without data */
    struct ck_model *m = hand_model(true);
    assert_int_equal(ck_writer_open(ops, out, &o, &w), 0);
    assert_int_equal(ck_writer_add(w, m), CK_ENOENT);
    assert_non_null(strstr(ck_error_msg(), "fc2.w"));
    ck_writer_free(w);
    ck_model_free(m);
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d)))
        assert_true(!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."));
    closedir(d);
    /* an existing file that is not an .mldef stays as it was */
    FILE *f = fopen(out, "w");
    fputs("precious", f);
    fclose(f);
    assert_int_equal(ck_writer_open(ops, out, &o, &w), CK_EEXIST);
    assert_non_null(strstr(ck_error_msg(), "not an .mldef"));
    char buf[16] = {0};
    f = fopen(out, "r");
    assert_non_null(fgets(buf, sizeof buf, f));
    fclose(f);
    assert_string_equal(buf, "precious");
    unlink(out);
    rmdir(dir);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(path_rules),
    cmocka_unit_test(sign_round_trip_and_key_files),
    cmocka_unit_test(zip_limits),
    cmocka_unit_test(writer_hand_model_round_trip),
    cmocka_unit_test(writer_failures_leave_nothing),
};
CK_TEST_MAIN(tests)
