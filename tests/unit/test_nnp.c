/* NNabla reader: .nnp archives built here (network text + parameter.protobuf
 * encoded by hand, or parameter.h5 written by h5py), the text-format parser,
 * hostile input, and the real LeNet file (CK_SHARED_DATA). */
#include "test_main.h"

#include "common/error.h"
#include "readers/nntxt.h"
#include "readers/reader.h"

#include <math.h>
#include <time.h>
#include <zip.h>

#ifndef CK_TEST_SOURCE_DIR
#error "CK_TEST_SOURCE_DIR: the folder of this file, set by tests/unit/CMakeLists.txt"
#endif

static const char net_text[] =
    "# a one-layer network\n"
    "network {\n"
    "  name: \"net\"\n"
    "  batch_size: 4\n"
    "  variable { name: \"x\" type: \"Buffer\" shape { dim: -1 dim: 3 } }\n"
    "  variable { name: \"fc/W\" type: \"Parameter\" shape { dim: 3 dim: 2 } }\n"
    "  variable { name: \"fc/b\" type: \"Parameter\" shape { dim: 2 } }\n"
    "  variable { name: \"y\" type: \"Buffer\" shape { dim: -1 dim: 2 } }\n"
    "  function {\n"
    "    name: \"Affine\"\n"
    "    type: \"Affine\"\n"
    "    input: \"x\"\n"
    "    input: \"fc/W\"\n"
    "    input: \"fc/b\"\n"
    "    output: \"y\"\n"
    "    affine_param { base_axis: 1 }\n"
    "  }\n"
    "}\n"
    "executor {\n"
    "  name: \"run\"\n"
    "  network_name: \"net\"\n"
    "  data_variable { variable_name: \"x\" data_name: \"x\" }\n"
    "  output_variable { variable_name: \"y\" data_name: \"y\" }\n"
    "  parameter_variable { variable_name: \"fc/W\" }\n"
    "  parameter_variable { variable_name: \"fc/b\" }\n"
    "}\n";

static const float fc_w[6] = {0.5f, -1.25f, 2, 3.75f, -0.125f, 1e-3f};
static const float fc_b[2] = {0.25f, -4};

/* ---- a protobuf writer, by the wire format's rules ---- */

struct pbw {
    unsigned char b[1 << 14];
    size_t len;
};

static void pb_varint(struct pbw *w, uint64_t v)
{
    do {
        unsigned char c = v & 0x7f;
        v >>= 7;
        w->b[w->len++] = c | (v ? 0x80 : 0);
    } while (v);
}

static void pb_bytes(struct pbw *w, uint32_t num, const void *p, size_t n)
{
    pb_varint(w, (uint64_t)num << 3 | 2);
    pb_varint(w, n);
    memcpy(w->b + w->len, p, n);
    w->len += n;
}

static void pb_floats_le(unsigned char *out, const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++)
            out[4 * i + k] = (unsigned char)(u >> (8 * k));
    }
}

/* Parameter { variable_name=1, shape=20 {dim=1 packed}, data=100 packed, need_grad=101 } */
static void pb_param(struct pbw *file, const char *name, const int64_t *dims, int rank,
                     const float *data, size_t n, int need_grad)
{
    struct pbw shape = {.len = 0}, dimv = {.len = 0}, p = {.len = 0};
    unsigned char raw[256];
    for (int i = 0; i < rank; i++)
        pb_varint(&dimv, (uint64_t)dims[i]);
    pb_bytes(&shape, 1, dimv.b, dimv.len);
    pb_bytes(&p, 1, name, strlen(name));
    pb_bytes(&p, 20, shape.b, shape.len);
    pb_floats_le(raw, data, n);
    pb_bytes(&p, 100, raw, 4 * n);
    if (need_grad >= 0) {
        pb_varint(&p, 101 << 3 | 0);
        pb_varint(&p, (uint64_t)need_grad);
    }
    pb_bytes(file, 200, p.b, p.len);
}

static void params_pb(struct pbw *w, size_t nw)
{
    static const int64_t dw[2] = {3, 2}, db[1] = {2};
    w->len = 0;
    pb_param(w, "fc/W", dw, 2, fc_w, nw, 1);
    pb_param(w, "fc/b", db, 1, fc_b, 2, 0);
}

/* ---- files ---- */

struct member {
    const char *name;
    const void *p;
    size_t len;
};

static void make_zip(const char *path, const struct member *m, size_t n)
{
    zip_t *z = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, NULL);
    assert_non_null(z);
    for (size_t i = 0; i < n; i++) {
        zip_source_t *src = zip_source_buffer(z, m[i].p, m[i].len, 0);
        assert_non_null(src);
        assert_true(zip_file_add(z, m[i].name, src, ZIP_FL_ENC_UTF_8) >= 0);
    }
    assert_int_equal(zip_close(z), 0);
}

static void write_file(const char *path, const void *p, size_t len)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    if (len)
        assert_int_equal(fwrite(p, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

static const char *meta(const struct ck_tensor_set *s, const char *key)
{
    for (size_t i = 0; i < s->nmeta; i++)
        if (!strcmp(s->meta[i].key, key))
            return s->meta[i].value;
    return NULL;
}

static const char *attr(const struct ck_graph_node *n, const char *key)
{
    for (size_t i = 0; i < n->nattrs; i++)
        if (!strcmp(n->attrs[i].key, key))
            return n->attrs[i].value;
    return NULL;
}

static void expect_open_error(const char *path, const char *want)
{
    struct ck_tensor_set *s = NULL;
    int err = ck_reader_find("nnp")->open(path, &s);
    assert_true(err < 0);
    assert_null(s);
    if (!strstr(ck_error_msg(), path) || !strstr(ck_error_msg(), want))
        fail_msg("'%s' should name '%s' and say '%s'", ck_error_msg(), path, want);
}

static void check_small_net(const struct ck_tensor_set *s, bool need_grad_meta)
{
    const struct ck_tensor *w = ck_tensor_set_find(s, "fc/W"), *b = ck_tensor_set_find(s, "fc/b"),
                           *x = ck_tensor_set_find(s, "x");
    assert_non_null(w);
    assert_non_null(b);
    assert_non_null(x);
    assert_string_equal(s->tensors[0].name, "fc/W"); /* parameters first, in file order */
    assert_string_equal(s->tensors[1].name, "fc/b");
    assert_int_equal(w->dtype, CK_DT_F32);
    assert_int_equal(w->rank, 2);
    assert_int_equal(w->dims[0], 3);
    assert_int_equal(w->dims[1], 2);
    assert_int_equal(w->nbytes, 24);
    assert_string_equal(w->role, "parameter");
    for (int i = 0; i < 6; i++)
        assert_true(ck_tensor_get_f64(w, (uint64_t)i) == (double)fc_w[i]);
    for (int i = 0; i < 2; i++)
        assert_true(ck_tensor_get_f64(b, (uint64_t)i) == (double)fc_b[i]);
    assert_string_equal(x->role, "buffer");
    assert_null(x->data);
    assert_int_equal(x->dims[0], -1);
    if (need_grad_meta) {
        assert_string_equal(meta(s, "need_grad:fc/W"), "true");
        assert_string_equal(meta(s, "need_grad:fc/b"), "false");
    }
    const struct ck_graph *g = s->graph;
    assert_non_null(g);
    assert_string_equal(g->name, "net");
    assert_int_equal(g->ninputs, 1);
    assert_string_equal(g->inputs[0], "x");
    assert_int_equal(g->noutputs, 1);
    assert_string_equal(g->outputs[0], "y");
    assert_int_equal(g->nattrs, 1);
    assert_string_equal(g->attrs[0].key, "batch_size");
    assert_string_equal(g->attrs[0].value, "4");
    assert_int_equal(g->nnodes, 1);
    assert_string_equal(g->nodes[0].op, "Affine");
    assert_int_equal(g->nodes[0].ninputs, 3);
    assert_string_equal(g->nodes[0].inputs[1], "fc/W");
    assert_string_equal(attr(&g->nodes[0], "base_axis"), "1");
    assert_string_equal(meta(s, "executor"), "run");
}

static void nnp_with_protobuf(void **state)
{
    char dir[4096], path[8200];
    struct pbw pb;
    ck_test_tmpdir(dir, "nnp_pb");
    params_pb(&pb, 6);
    snprintf(path, sizeof(path), "%s/m.nnp", dir);
    struct member m[] = {{"nnp_version.txt", "0.1\n", 4},
                         {"network.nntxt", net_text, strlen(net_text)},
                         {"parameter.protobuf", pb.b, pb.len}};
    make_zip(path, m, 3);
    const struct ck_reader_ops *ops;
    assert_int_equal(ck_reader_detect(path, &ops), 0);
    assert_string_equal(ops->name, "nnp");
    struct ck_tensor_set *s = NULL;
    if (ck_reader_open(path, NULL, &s) < 0)
        fail_msg("%s", ck_error_msg());
    check_small_net(s, true);
    assert_string_equal(meta(s, "nnp_version"), "0.1");
    assert_string_equal(meta(s, "parameter_file"), "parameter.protobuf");
    ck_tensor_set_free(s);

    /* The same parameters alone, as a bare .protobuf. */
    snprintf(path, sizeof(path), "%s/parameter.protobuf", dir);
    write_file(path, pb.b, pb.len);
    assert_int_equal(ck_reader_detect(path, &ops), 0);
    assert_string_equal(ops->name, "nnp");
    if (ck_reader_open(path, NULL, &s) < 0)
        fail_msg("%s", ck_error_msg());
    assert_int_equal(s->ntensors, 2);
    assert_null(s->graph);
    assert_true(ck_tensor_get_f64(ck_tensor_set_find(s, "fc/W"), 5) == (double)fc_w[5]);
    ck_tensor_set_free(s);
}

static void nntxt_syntax(void **state)
{
    static const char text[] =
        "# comment\n"
        "a: 1 b: -2.5e-3f; c: 'x\\'y' \"z\\n\\x41\\101\\u00e9\" # adjacent strings\n"
        "m < k: true >\n"
        "m { k: false, l: [1, 2, 0x10] e: ENUM_V }\n"
        "inf_v: -inf\n";
    struct ck_nntxt *root = NULL;
    if (ck_nntxt_parse(text, strlen(text), "t.nntxt", &root) < 0)
        fail_msg("%s", ck_error_msg());
    int64_t i;
    double d;
    bool b;
    const char *str;
    assert_int_equal(ck_nntxt_int(ck_nntxt_get(root, "a"), "t", &i), 0);
    assert_int_equal(i, 1);
    assert_int_equal(ck_nntxt_double(ck_nntxt_get(root, "b"), "t", &d), 0);
    assert_true(d == -2.5e-3);
    assert_int_equal(ck_nntxt_str(ck_nntxt_get(root, "c"), "t", &str), 0);
    assert_string_equal(str, "x'yz\nAA\xc3\xa9");
    assert_int_equal(ck_nntxt_count(root, "m"), 2);
    const struct ck_nntxt *m1 = ck_nntxt_get(root, "m"), *m2 = ck_nntxt_next(m1);
    assert_int_equal(ck_nntxt_bool(ck_nntxt_get(m1, "k"), "t", &b), 0);
    assert_true(b);
    assert_int_equal(ck_nntxt_bool(ck_nntxt_get(m2, "k"), "t", &b), 0);
    assert_false(b);
    assert_int_equal(ck_nntxt_count(m2, "l"), 3);
    const struct ck_nntxt *l3 = ck_nntxt_next(ck_nntxt_next(ck_nntxt_get(m2, "l")));
    assert_int_equal(ck_nntxt_int(l3, "t", &i), 0);
    assert_int_equal(i, 16);
    assert_int_equal(ck_nntxt_get(m2, "e")->kind, CK_NNTXT_IDENT);
    assert_string_equal(ck_nntxt_get(m2, "e")->value, "ENUM_V");
    assert_int_equal(ck_nntxt_double(ck_nntxt_get(root, "inf_v"), "t", &d), 0);
    assert_true(isinf(d) && d < 0);
    /* Wrong kinds are errors naming the file and line. */
    assert_int_equal(ck_nntxt_int(ck_nntxt_get(root, "c"), "t.nntxt", &i), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "'t.nntxt' line 2"));
    ck_nntxt_free(root);
}

static void nntxt_hostile(void **state)
{
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"a: \"open\n", "line 1: unterminated string"},
        {"a: \"\\q\"", "unknown escape"},
        {"a: 1.2.3", "'1.2.3' is not a number"},
        {"m {\n a: 1\n", "line 3: expected '}'"},
        {"[ext.x] { }", "extension and Any fields are not supported"},
        {"a 1", "expected ':' or '{'"},
        {"a: [1, 2", "expected ',' or ']'"},
        {"a: \"\\u12\"", "expected hex digits"},
        {"a: \"\\ud800\"", "unicode escape out of range"},
        {"a: ", "expected a value"},
        {"}", "expected a field name"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct ck_nntxt *root = (struct ck_nntxt *)1;
        int err = ck_nntxt_parse(cases[i].text, strlen(cases[i].text), "h.nntxt", &root);
        assert_int_equal(err, CK_EFORMAT);
        assert_null(root);
        if (!strstr(ck_error_msg(), "'h.nntxt'") || !strstr(ck_error_msg(), cases[i].want))
            fail_msg("case %zu: '%s' should say '%s'", i, ck_error_msg(), cases[i].want);
    }
    /* A depth bomb: 200000 nested messages. */
    size_t n = 200000;
    char *bomb = malloc(4 * n + 1);
    assert_non_null(bomb);
    for (size_t i = 0; i < n; i++)
        memcpy(bomb + 4 * i, "a { ", 4);
    struct ck_nntxt *root = NULL;
    assert_int_equal(ck_nntxt_parse(bomb, 4 * n, "bomb.nntxt", &root), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "nested deeper than 64"));
    assert_null(root);
    free(bomb);
}

/* A bare .nntxt may carry its parameters in the text itself. */
static void nntxt_with_text_parameters(void **state)
{
    static const char params[] =
        "parameter { variable_name: \"fc/W\" shape { dim: 3 dim: 2 }\n"
        "  data: 0.5 data: -1.25 data: 2 data: 3.75 data: -0.125 data: 0.001 need_grad: true }\n"
        "parameter { variable_name: \"fc/b\" shape { dim: 2 } data: [0.25, -4]\n"
        "  need_grad: false }\n";
    char dir[4096], path[8200], text[8192];
    ck_test_tmpdir(dir, "nntxt_params");
    snprintf(text, sizeof(text), "%s%s", params, net_text);
    snprintf(path, sizeof(path), "%s/model.nntxt", dir);
    write_file(path, text, strlen(text));
    const struct ck_reader_ops *ops;
    assert_int_equal(ck_reader_detect(path, &ops), 0);
    assert_string_equal(ops->name, "nnp");
    struct ck_tensor_set *s = NULL;
    if (ck_reader_open(path, NULL, &s) < 0)
        fail_msg("%s", ck_error_msg());
    check_small_net(s, true);
    ck_tensor_set_free(s);
    /* Five values for six elements. */
    const char *at = strstr(params, " data: 0.001");
    assert_non_null(at);
    snprintf(text, sizeof(text), "%.*s%s%s", (int)(at - params), params,
             at + strlen(" data: 0.001"), net_text);
    write_file(path, text, strlen(text));
    expect_open_error(path, "tensor 'fc/W': 5 values for shape [3,2] of 6 elements");
}

static void nnp_unsafe_and_duplicate_members(void **state)
{
    char dir[4096], path[8200];
    struct pbw pb;
    ck_test_tmpdir(dir, "nnp_bad");
    params_pb(&pb, 6);
    snprintf(path, sizeof(path), "%s/escape.nnp", dir);
    struct member m[] = {{"network.nntxt", net_text, strlen(net_text)},
                         {"parameter.protobuf", pb.b, pb.len},
                         {"../x", "boo", 3}};
    make_zip(path, m, 3);
    expect_open_error(path, "member '../x' has an unsafe name");
    snprintf(path, sizeof(path), "%s/two.nnp", dir);
    struct member two[] = {{"network.nntxt", net_text, strlen(net_text)},
                           {"parameter.protobuf", pb.b, pb.len},
                           {"parameter.h5", "x", 1}};
    make_zip(path, two, 3);
    expect_open_error(path, "both 'parameter.protobuf' and 'parameter.h5' hold the parameters");
}

static void nnp_wrong_data_count(void **state)
{
    char dir[4096], path[8200];
    struct pbw pb;
    ck_test_tmpdir(dir, "nnp_count");
    params_pb(&pb, 5);
    snprintf(path, sizeof(path), "%s/m.nnp", dir);
    struct member m[] = {{"network.nntxt", net_text, strlen(net_text)},
                         {"parameter.protobuf", pb.b, pb.len}};
    make_zip(path, m, 2);
    expect_open_error(path, "parameter.protobuf': tensor 'fc/W': 5 values for shape [3,2] of 6 "
                            "elements");
}

static void nnp_truncated_protobuf(void **state)
{
    char dir[4096], path[8200];
    struct pbw pb;
    ck_test_tmpdir(dir, "nnp_trunc");
    params_pb(&pb, 6);
    snprintf(path, sizeof(path), "%s/m.nnp", dir);
    for (size_t cut = 0; cut < pb.len; cut++) {
        struct member m[] = {{"network.nntxt", net_text, strlen(net_text)},
                             {"parameter.protobuf", pb.b, cut}};
        make_zip(path, m, 2);
        struct ck_tensor_set *s = NULL;
        int err = ck_reader_find("nnp")->open(path, &s);
        if (err != CK_EFORMAT || s)
            fail_msg("cut at %zu of %zu: %d '%s'", cut, pb.len, err, ck_error_msg());
        assert_non_null(strstr(ck_error_msg(), path));
    }
}

static void nnp_network_checks(void **state)
{
    char dir[4096], path[8200], text[4096];
    struct pbw pb;
    ck_test_tmpdir(dir, "nnp_net");
    params_pb(&pb, 6);
    static const struct {
        const char *from, *to, *want;
    } cases[] = {
        {"shape { dim: 3 dim: 2 }", "shape { dim: 2 dim: 3 }",
         "tensor 'fc/W': shape [2,3] differs from [3,2] in the parameters"},
        {"input: \"x\"", "input: \"nosuch\"", "input 'nosuch' is not a variable of the network"},
        {"network_name: \"net\"", "network_name: \"other\"", "names network 'other'"},
        {"parameter_variable { variable_name: \"fc/b\" }",
         "parameter_variable { variable_name: \"y\" }", "the parameters hold no tensor 'y'"},
        {"batch_size: 4", "batch_size: \"four\"", "field 'batch_size' is not an integer"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *at = strstr(net_text, cases[i].from);
        assert_non_null(at);
        snprintf(text, sizeof(text), "%.*s%s%s", (int)(at - net_text), net_text, cases[i].to,
                 at + strlen(cases[i].from));
        snprintf(path, sizeof(path), "%s/m%zu.nnp", dir, i);
        struct member m[] = {{"network.nntxt", text, strlen(text)},
                             {"parameter.protobuf", pb.b, pb.len}};
        make_zip(path, m, 2);
        expect_open_error(path, cases[i].want);
    }
}

/* 200000 one-value parameters: read in well under the test's timeout (every
 * name check is a sorted lookup, not a scan: this took minutes when it was). */
static void nnp_many_parameters(void **state)
{
    char dir[4096], path[8200];
    size_t n = 200000, cap = n * 40;
    unsigned char *pb = malloc(cap);
    size_t len = 0;
    assert_non_null(pb);
    for (size_t i = 0; i < n; i++) {
        struct pbw p = {.len = 0}, w = {.len = 0};
        char name[32];
        float v = (float)i;
        unsigned char raw[4];
        static const unsigned char shape[] = {0x0a, 0x01, 0x01}; /* Shape {dim: [1]} */
        snprintf(name, sizeof(name), "p%zu", i);
        pb_bytes(&p, 1, name, strlen(name));
        pb_bytes(&p, 20, shape, sizeof(shape));
        pb_floats_le(raw, &v, 1);
        pb_bytes(&p, 100, raw, 4);
        pb_bytes(&w, 200, p.b, p.len);
        assert_true(len + w.len <= cap);
        memcpy(pb + len, w.b, w.len);
        len += w.len;
    }
    ck_test_tmpdir(dir, "nnp_many");
    snprintf(path, sizeof(path), "%s/parameter.protobuf", dir);
    write_file(path, pb, len);
    free(pb);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    struct ck_tensor_set *s = NULL;
    if (ck_reader_open(path, NULL, &s) < 0)
        fail_msg("%s", ck_error_msg());
    clock_gettime(CLOCK_MONOTONIC, &b);
    assert_int_equal(s->ntensors, n);
    assert_string_equal(s->tensors[n - 1].name, "p199999");
    assert_true(ck_tensor_get_f64(&s->tensors[n - 1], 0) == 199999.0);
    ck_tensor_set_free(s);
    double secs = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    if (secs > 30)
        fail_msg("%zu parameters took %.1f s", n, secs);
}

/* ---- HDF5, written by h5py as NNabla does ---- */

static const char h5_script[] =
    "import sys, h5py, numpy as np\n"
    "mode = sys.argv[2]\n"
    "with h5py.File(sys.argv[1], 'w') as f:\n"
    "    # written in reverse order; the index attribute gives the real one\n"
    "    b = f.create_dataset('fc/b', data=np.array([0.25, -4], dtype='<f4'))\n"
    "    b.attrs['need_grad'] = False\n"
    "    b.attrs['index'] = np.int64(1)\n"
    "    if mode == 'int':\n"
    "        w = f.create_dataset('fc/W', data=np.arange(6, dtype='<i4').reshape(3, 2))\n"
    "    else:\n"
    "        w = f.create_dataset('fc/W', data=np.array([0.5, -1.25, 2, 3.75, -0.125, 1e-3],\n"
    "                                               dtype='<f4').reshape(3, 2))\n"
    "    w.attrs['need_grad'] = True\n"
    "    w.attrs['index'] = np.int64(0)\n"
    "    if mode == 'external':\n"
    "        f['ext'] = h5py.ExternalLink('/etc/passwd', '/x')\n";

static void make_h5(const char *dir, const char *path, const char *mode)
{
    char script[8200], cmd[20000];
    snprintf(script, sizeof(script), "%s/make_h5.py", dir);
    write_file(script, h5_script, strlen(h5_script));
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 '%s' '%s' %s", script, path, mode);
    if (system(cmd) != 0)
        fail_msg("'%s' failed (python3-h5py is in .ci/packages.txt)", cmd);
}

static void *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc((size_t)n + 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return p;
}

static void nnp_with_h5(void **state)
{
    char dir[4096], h5[8200], path[8200];
    ck_test_tmpdir(dir, "nnp_h5");
    snprintf(h5, sizeof(h5), "%s/parameter.h5", dir);
    make_h5(dir, h5, "good");
    const struct ck_reader_ops *ops;
    assert_int_equal(ck_reader_detect(h5, &ops), 0);
    assert_string_equal(ops->name, "nnp");
    struct ck_tensor_set *s = NULL;
    if (ck_reader_open(h5, NULL, &s) < 0)
        fail_msg("%s", ck_error_msg());
    assert_int_equal(s->ntensors, 2);
    assert_string_equal(s->tensors[0].name, "fc/W");
    assert_string_equal(meta(s, "need_grad:fc/W"), "true");
    assert_string_equal(meta(s, "need_grad:fc/b"), "false");
    for (int i = 0; i < 6; i++)
        assert_true(ck_tensor_get_f64(&s->tensors[0], (uint64_t)i) == (double)fc_w[i]);
    ck_tensor_set_free(s);

    size_t len;
    void *img = slurp(h5, &len);
    snprintf(path, sizeof(path), "%s/m.nnp", dir);
    struct member m[] = {{"nnp_version.txt", "0.1\n", 4},
                         {"network.nntxt", net_text, strlen(net_text)},
                         {"parameter.h5", img, len}};
    make_zip(path, m, 3);
    if (ck_reader_open(path, NULL, &s) < 0)
        fail_msg("%s", ck_error_msg());
    check_small_net(s, true);
    assert_string_equal(meta(s, "parameter_file"), "parameter.h5");
    ck_tensor_set_free(s);
    free(img);
}

static void h5_hostile(void **state)
{
    char dir[4096], h5[8200];
    ck_test_tmpdir(dir, "nnp_h5bad");
    snprintf(h5, sizeof(h5), "%s/int.h5", dir);
    make_h5(dir, h5, "int");
    expect_open_error(h5, "tensor 'fc/W': not float32");
    snprintf(h5, sizeof(h5), "%s/ext.h5", dir);
    make_h5(dir, h5, "external");
    expect_open_error(h5, "'ext' is a external link");
    /* Cut short anywhere: an error, never a crash. */
    snprintf(h5, sizeof(h5), "%s/good.h5", dir);
    make_h5(dir, h5, "good");
    size_t len;
    unsigned char *img = slurp(h5, &len);
    char cut_path[8200];
    snprintf(cut_path, sizeof(cut_path), "%s/cut.h5", dir);
    for (size_t cut = 8; cut < len; cut += 97) {
        write_file(cut_path, img, cut);
        struct ck_tensor_set *s = NULL;
        int err = ck_reader_find("nnp")->open(cut_path, &s);
        if (err == 0) {
            /* HDF5 may not need the tail; then every value must still be right. */
            assert_int_equal(s->ntensors, 2);
            ck_tensor_set_free(s);
            continue;
        }
        assert_null(s);
        assert_non_null(strstr(ck_error_msg(), cut_path));
    }
    free(img);
}

/* An HDF5 parameter file found by fuzzing that makes libhdf5 itself ask for 176 GB:
 * the child process reading it fails, the caller gets an error naming the
 * file, and this process never allocates. */
static void h5_library_failure_is_contained(void **state)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/data/hdf5_huge_alloc.h5", CK_TEST_SOURCE_DIR);
    struct ck_tensor_set *s = NULL;
    int err = ck_reader_find("nnp")->open(path, &s);
    assert_true(err < 0);
    assert_null(s);
    if (!strstr(ck_error_msg(), path) || !strstr(ck_error_msg(), "HDF5"))
        fail_msg("'%s' should name '%s' and HDF5", ck_error_msg(), path);
}

/* ---- the real LeNet ---- */

static const char *shared(const char *rel, char *out)
{
    const char *base = getenv("CK_SHARED_DATA");
    if (!base || !*base)
        return NULL;
    snprintf(out, 4096, "%s/%s", base, rel);
    FILE *f = fopen(out, "rb");
    if (!f)
        return NULL;
    fclose(f);
    return out;
}

static void real_lenet(void **state)
{
    char path[4096];
    if (!shared("nnabla/lenet_010000.nnp", path))
        skip();
    struct ck_tensor_set *s = NULL;
    if (ck_reader_open(path, NULL, &s) < 0)
        fail_msg("%s", ck_error_msg());
    assert_string_equal(s->format, "nnp");
    /* specs/FORMAT-FACTS.md 4.4 */
    static const struct {
        const char *name;
        int rank;
        int64_t dims[4];
    } params[8] = {
        {"conv1/conv/W", 4, {16, 1, 5, 5}},  {"conv1/conv/b", 1, {16}},
        {"conv2/conv/W", 4, {16, 16, 5, 5}}, {"conv2/conv/b", 1, {16}},
        {"fc3/affine/W", 2, {256, 50}},      {"fc3/affine/b", 1, {50}},
        {"fc4/affine/W", 2, {50, 10}},       {"fc4/affine/b", 1, {10}},
    };
    size_t nparams = 0;
    for (size_t i = 0; i < s->ntensors; i++)
        nparams += s->tensors[i].data != NULL;
    assert_int_equal(nparams, 8);
    for (size_t i = 0; i < 8; i++) {
        const struct ck_tensor *t = &s->tensors[i];
        char key[128];
        assert_string_equal(t->name, params[i].name);
        assert_int_equal(t->rank, params[i].rank);
        for (int d = 0; d < t->rank; d++)
            assert_int_equal(t->dims[d], params[i].dims[d]);
        assert_int_equal(ck_tensor_check_size(t, path), 0);
        snprintf(key, sizeof(key), "need_grad:%s", t->name);
        assert_string_equal(meta(s, key), "true");
    }
    /* The first parameter's data bytes sit at offset 31 of parameter.protobuf
     * (FORMAT-FACTS 4.2: c2 0c de 0c | 0a 0c name | a2 01 06 ... | a2 06 c0 0c). */
    zip_t *z = zip_open(path, ZIP_RDONLY, NULL);
    assert_non_null(z);
    zip_file_t *zf = zip_fopen(z, "parameter.protobuf", 0);
    assert_non_null(zf);
    unsigned char head[31 + 1600];
    assert_int_equal(zip_fread(zf, head, sizeof(head)), (zip_int64_t)sizeof(head));
    zip_fclose(zf);
    zip_discard(z);
    static const unsigned char tag[4] = {0xa2, 0x06, 0xc0, 0x0c};
    assert_memory_equal(head + 27, tag, 4);
    assert_int_equal(s->tensors[0].nbytes, 1600);
    assert_memory_equal(s->tensors[0].data, head + 31, 1600);

    const struct ck_graph *g = s->graph;
    static const char *const ops[10] = {"MulScalar",   "Convolution", "MaxPooling", "ReLU",
                                        "Convolution", "MaxPooling",  "ReLU",       "Affine",
                                        "ReLU",        "Affine"};
    assert_non_null(g);
    assert_string_equal(g->name, "runtime");
    assert_int_equal(g->nnodes, 10);
    for (int i = 0; i < 10; i++)
        assert_string_equal(g->nodes[i].op, ops[i]);
    assert_string_equal(attr(&g->nodes[0], "val"), "0.00392156862745098");
    assert_string_equal(attr(&g->nodes[1], "pad"), "[0,0]");
    assert_string_equal(attr(&g->nodes[1], "stride"), "[1,1]");
    assert_string_equal(attr(&g->nodes[1], "group"), "1");
    assert_string_equal(attr(&g->nodes[2], "kernel"), "[2,2]");
    assert_string_equal(attr(&g->nodes[2], "ignore_border"), "true");
    assert_string_equal(attr(&g->nodes[7], "base_axis"), "1");
    assert_int_equal(g->ninputs, 1);
    assert_string_equal(g->inputs[0], "x");
    assert_int_equal(g->noutputs, 1);
    assert_string_equal(g->outputs[0], "y");
    assert_string_equal(g->attrs[0].value, "128");
    const struct ck_tensor *x = ck_tensor_set_find(s, "x");
    assert_non_null(x);
    assert_int_equal(x->rank, 4);
    assert_int_equal(x->dims[0], -1);
    assert_int_equal(x->dims[2], 28);
    assert_string_equal(meta(s, "nnp_version"), "0.1");
    ck_tensor_set_free(s);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(nnp_with_protobuf),
    cmocka_unit_test(nntxt_syntax),
    cmocka_unit_test(nntxt_hostile),
    cmocka_unit_test(nntxt_with_text_parameters),
    cmocka_unit_test(nnp_unsafe_and_duplicate_members),
    cmocka_unit_test(nnp_wrong_data_count),
    cmocka_unit_test(nnp_truncated_protobuf),
    cmocka_unit_test(nnp_network_checks),
    cmocka_unit_test(nnp_many_parameters),
    cmocka_unit_test(nnp_with_h5),
    cmocka_unit_test(h5_hostile),
    cmocka_unit_test(h5_library_failure_is_contained),
    cmocka_unit_test(real_lenet),
};

CK_TEST_MAIN(tests)
