/* SameDiff reader: FlatGraph files written field by field here, the ADR-0001
 * zip layout, hostile input, and the real DL4J files (CK_SHARED_DATA). */
#include "test_main.h"

#include "common/error.h"
#include "readers/flatbuf.h"
#include "readers/reader.h"
#include "fbbuild.h"

#include <math.h>
#include <zip.h>

/* What a test may change in the graph it builds. */
struct knobs {
    uint32_t buf_bytes; /* w's buffer length (24 is right: 2x3 float32) */
    int64_t rank;       /* w's shape info rank (2 is right) */
    int32_t in_a;       /* first input of the node: variable id (2 is right) */
    int no_outnames;    /* leave out the node's outputNames */
};

static const struct knobs good = {24, 2, 2, 0};

struct built {
    struct fbb f;
    uint32_t graph, vars, w_var, w_arr, w_buf, node;
};

static void be_floats(unsigned char *out, const float *v, int n)
{
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++)
            out[4 * i + k] = (unsigned char)(u >> (24 - 8 * k));
    }
}

static uint32_t int_pair(struct fbb *f, int32_t a, int32_t b)
{
    uint32_t t = fbb_table(f, 2, 3);
    fbb_i32(f, t, 0, a);
    fbb_i32(f, t, 1, b);
    return t;
}

/* A FlatArray table: shape info for dims, buffer of nbytes from data. */
static uint32_t flat_array(struct fbb *f, const int64_t *si, uint32_t nsi, const void *data,
                           uint32_t nbytes, uint8_t dtype, uint32_t *bufvec)
{
    uint32_t a = fbb_table(f, 4, data ? 0xf : 0xd);
    fbb_u8(f, a, 2, dtype);
    fbb_u8(f, a, 3, 1);
    fbb_off(f, a, 0, fbb_vec_i64(f, si, nsi));
    if (data) {
        uint32_t v = fbb_vec(f, data, nbytes, 1);
        fbb_off(f, a, 1, v);
        if (bufvec)
            *bufvec = v;
    }
    return a;
}

static uint32_t variable(struct fbb *f, int32_t id, const char *name, uint8_t dtype, uint8_t vt,
                         uint32_t present_extra)
{
    uint32_t v = fbb_table(f, 7, 0x1 | 0x2 | 0x4 | 0x40 | present_extra);
    fbb_u8(f, v, 2, dtype);
    fbb_u8(f, v, 6, vt);
    fbb_off(f, v, 0, int_pair(f, id, 0));
    fbb_off(f, v, 1, fbb_str(f, name));
    return v;
}

static void build_graph(struct built *g, const struct knobs *k)
{
    struct fbb *f = &g->f;
    static const float w[6] = {1, 2, 3, 4, 5, 6.5f};
    unsigned char wbytes[64];
    be_floats(wbytes, w, 6);
    fbb_init(f);
    g->graph = fbb_table(f, 9, 0x1 | 0x2 | 0x4 | 0x8 | 0x20);
    fbb_root(f, g->graph);
    fbb_i64(f, g->graph, 0, 77);
    g->vars = fbb_vec(f, NULL, 3, 4);
    fbb_off(f, g->graph, 1, g->vars);

    g->w_var = variable(f, 1, "w", 5, 1, 0x10);
    fbb_elem(f, g->vars, 0, g->w_var);
    int64_t si[8] = {k->rank, 2, 3, 3, 1, 8192, 1, 99};
    g->w_arr = flat_array(f, si, 8, wbytes, k->buf_bytes, 5, &g->w_buf);
    fbb_off(f, g->w_var, 4, g->w_arr);

    uint32_t x = variable(f, 2, "x", 5, 3, 0x8);
    fbb_elem(f, g->vars, 1, x);
    int64_t xs[2] = {-1, 3};
    fbb_off(f, x, 3, fbb_vec_i64(f, xs, 2));

    uint32_t y = variable(f, 3, "y", 5, 2, 0);
    fbb_elem(f, g->vars, 2, y);

    uint32_t nodes = fbb_vec(f, NULL, 1, 4);
    fbb_off(f, g->graph, 2, nodes);
    /* slots: 0 id, 1 name, 2 opType, 3 opNum, 6 inputPaired, 9 extraInteger, 15 outputNames, 16
     * opName */
    g->node = fbb_table(
        f, 17, 0x1 | 0x2 | 0x4 | 0x8 | 0x40 | 0x200 | 0x10000 | (k->no_outnames ? 0 : 0x8000));
    fbb_elem(f, nodes, 0, g->node);
    fbb_i32(f, g->node, 0, 3);
    fbb_u8(f, g->node, 2, 21);
    fbb_i64(f, g->node, 3, 5);
    fbb_off(f, g->node, 1, fbb_str(f, "mm"));
    fbb_off(f, g->node, 16, fbb_str(f, "mmul"));
    uint32_t ins = fbb_vec(f, NULL, 2, 4);
    fbb_off(f, g->node, 6, ins);
    fbb_elem(f, ins, 0, int_pair(f, k->in_a, 0));
    fbb_elem(f, ins, 1, int_pair(f, 1, 0));
    if (!k->no_outnames) {
        uint32_t outn = fbb_vec(f, NULL, 1, 4);
        fbb_off(f, g->node, 15, outn);
        fbb_elem(f, outn, 0, fbb_str(f, "y"));
    }

    uint32_t outs = fbb_vec(f, NULL, 1, 4);
    fbb_off(f, g->graph, 3, outs);
    fbb_elem(f, outs, 0, int_pair(f, 3, 0));
    uint32_t ph = fbb_vec(f, NULL, 1, 4);
    fbb_off(f, g->graph, 5, ph);
    fbb_elem(f, ph, 0, fbb_str(f, "x"));
    /* Last, so that cutting any byte off the file removes something in use. */
    int64_t ei[2] = {1, 0};
    fbb_off(f, g->node, 9, fbb_vec_i64(f, ei, 2));
}

static void write_file(const char *path, const void *p, size_t len)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    if (len)
        assert_int_equal(fwrite(p, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

static int open_bytes(const char *dir, const char *name, const void *p, size_t len,
                      struct ck_tensor_set **out, char *path)
{
    snprintf(path, 4096, "%s/%s", dir, name);
    write_file(path, p, len);
    return ck_reader_find("samediff")->open(path, out);
}

/* Opening fails with CK_EFORMAT and a message naming the file and containing what. */
static void expect_error(const char *dir, const struct built *g, const char *what)
{
    struct ck_tensor_set *s = NULL;
    char path[4096];
    int err = open_bytes(dir, "bad.fb", g->f.b, g->f.len, &s, path);
    assert_int_equal(err, CK_EFORMAT);
    assert_null(s);
    const char *msg = ck_error_msg();
    if (!strstr(msg, path) || !strstr(msg, what))
        fail_msg("message '%s' should name '%s' and say '%s'", msg, path, what);
}

static void graph_fields(void **state)
{
    struct built g;
    struct ck_tensor_set *s = NULL;
    char dir[4096], path[4096];
    ck_test_tmpdir(dir, "sd_fields");
    build_graph(&g, &good);
    assert_int_equal(open_bytes(dir, "g.fb", g.f.b, g.f.len, &s, path), 0);
    assert_string_equal(s->format, "samediff");
    assert_int_equal(s->ntensors, 2); /* w and the placeholder x; y is an op output */
    struct ck_tensor *w = ck_tensor_set_find(s, "w"), *x = ck_tensor_set_find(s, "x");
    assert_non_null(w);
    assert_non_null(x);
    assert_null(ck_tensor_set_find(s, "y"));
    assert_int_equal(w->dtype, CK_DT_F32);
    assert_int_equal(w->rank, 2);
    assert_int_equal(w->dims[0], 2);
    assert_int_equal(w->dims[1], 3);
    assert_true(w->big_endian);
    assert_false(w->fortran_order);
    assert_string_equal(w->role, "constant");
    assert_int_equal(w->nbytes, 24);
    static const double want[6] = {1, 2, 3, 4, 5, 6.5};
    for (int i = 0; i < 6; i++)
        assert_true(ck_tensor_get_f64(w, (uint64_t)i) == want[i]);
    assert_string_equal(x->role, "placeholder");
    assert_null(x->data);
    assert_int_equal(x->rank, 2);
    assert_int_equal(x->dims[0], -1);
    assert_int_equal(x->dims[1], 3);
    const struct ck_graph *gr = s->graph;
    assert_non_null(gr);
    assert_int_equal(gr->ninputs, 1);
    assert_string_equal(gr->inputs[0], "x");
    assert_int_equal(gr->noutputs, 1);
    assert_string_equal(gr->outputs[0], "y");
    assert_int_equal(gr->nnodes, 1);
    const struct ck_graph_node *n = &gr->nodes[0];
    assert_string_equal(n->name, "mm");
    assert_string_equal(n->op, "mmul");
    assert_int_equal(n->ninputs, 2);
    assert_string_equal(n->inputs[0], "x");
    assert_string_equal(n->inputs[1], "w");
    assert_int_equal(n->noutputs, 1);
    assert_string_equal(n->outputs[0], "y");
    int seen = 0;
    for (size_t i = 0; i < n->nattrs; i++) {
        if (!strcmp(n->attrs[i].key, "opType"))
            assert_string_equal(n->attrs[i].value, "21"), seen |= 1;
        if (!strcmp(n->attrs[i].key, "opNum"))
            assert_string_equal(n->attrs[i].value, "5"), seen |= 2;
        if (!strcmp(n->attrs[i].key, "extraInteger"))
            assert_string_equal(n->attrs[i].value, "[1,0]"), seen |= 4;
    }
    assert_int_equal(seen, 7);
    bool id_seen = false;
    for (size_t i = 0; i < s->nmeta; i++)
        if (!strcmp(s->meta[i].key, "graph_id"))
            assert_string_equal(s->meta[i].value, "77"), id_seen = true;
    assert_true(id_seen);
    ck_tensor_set_free(s);
}

/* A node without outputNames produces the variables whose id pair starts
 * with the node's id. */
static void outputs_from_ids(void **state)
{
    struct built g;
    struct ck_tensor_set *s = NULL;
    char dir[4096], path[4096];
    struct knobs k = good;
    k.no_outnames = 1;
    ck_test_tmpdir(dir, "sd_outids");
    build_graph(&g, &k);
    if (open_bytes(dir, "g.fb", g.f.b, g.f.len, &s, path) < 0)
        fail_msg("%s", ck_error_msg());
    assert_int_equal(s->graph->nodes[0].noutputs, 1);
    assert_string_equal(s->graph->nodes[0].outputs[0], "y");
    ck_tensor_set_free(s);
}

static void truncated_everywhere(void **state)
{
    struct built g;
    char dir[4096], path[4096];
    ck_test_tmpdir(dir, "sd_trunc");
    build_graph(&g, &good);
    for (uint32_t cut = 0; cut < g.f.len; cut++) {
        struct ck_tensor_set *s = NULL;
        int err = open_bytes(dir, "cut.fb", g.f.b, cut, &s, path);
        if (err != CK_EFORMAT || s)
            fail_msg("a file cut to %u of %u bytes gave %d: %s", cut, g.f.len, err, ck_error_msg());
        assert_non_null(strstr(ck_error_msg(), path));
    }
}

static void offset_past_the_end(void **state)
{
    struct built g;
    char dir[4096];
    ck_test_tmpdir(dir, "sd_off");
    build_graph(&g, &good);
    fbb_w32(&g.f, fbb_slot(g.graph, 1), 0x7ffffff0u); /* the variables vector */
    expect_error(dir, &g, "past the end");
    build_graph(&g, &good);
    fbb_w32(&g.f, 0, g.f.len + 100); /* the root */
    expect_error(dir, &g, "past the end");
}

static void vtable_out_of_range(void **state)
{
    struct built g;
    char dir[4096];
    ck_test_tmpdir(dir, "sd_vt");
    build_graph(&g, &good);
    fbb_w32(&g.f, g.w_var, (uint32_t)-100000); /* vtable far past the end */
    expect_error(dir, &g, "vtable");
    build_graph(&g, &good);
    fbb_w32(&g.f, g.w_var, g.w_var + 64); /* vtable before the start */
    expect_error(dir, &g, "vtable");
    build_graph(&g, &good);
    /* A vtable whose field offset points past the table's own size. */
    uint32_t vt = g.w_var - 20; /* 7 slots: a vtable of 18 bytes, padded to 20 */
    g.f.b[vt + 4 + 2 * 1] = 0xf0;
    expect_error(dir, &g, "overruns the table");
}

static void vector_length_2_31(void **state)
{
    struct built g;
    char dir[4096];
    ck_test_tmpdir(dir, "sd_vec");
    build_graph(&g, &good);
    fbb_w32(&g.f, g.w_buf, 0x80000000u);
    expect_error(dir, &g, "overrun");
    build_graph(&g, &good);
    fbb_w32(&g.f, g.vars, 0x80000000u);
    expect_error(dir, &g, "overrun");
}

static void wrong_data_count(void **state)
{
    struct built g;
    char dir[4096];
    ck_test_tmpdir(dir, "sd_count");
    struct knobs k = good;
    k.buf_bytes = 20;
    build_graph(&g, &k);
    expect_error(dir, &g, "tensor 'w': buffer of 20 bytes for 6 elements");
    k = good;
    k.rank = 3; /* 8 shape values do not fit rank 3 */
    build_graph(&g, &k);
    expect_error(dir, &g, "tensor 'w': shape info");
    k = good;
    k.in_a = 9;
    build_graph(&g, &k);
    expect_error(dir, &g, "node 'mm': input 0 (9:0) names no variable");
}

static void flatbuf_reader_limits(void **state)
{
    struct ck_fb fb;
    struct ck_fb_table t;
    unsigned char tiny[3] = {0};
    assert_int_equal(ck_fb_init(&fb, tiny, sizeof(tiny)), 0);
    assert_int_equal(ck_fb_root(&fb, &t), CK_EFORMAT);
    assert_false(ck_fb_looks_valid(tiny, sizeof(tiny)));
    struct built g;
    build_graph(&g, &good);
    assert_true(ck_fb_looks_valid(g.f.b, g.f.len));
    assert_int_equal(ck_fb_init(&fb, g.f.b, g.f.len), 0);
    assert_int_equal(ck_fb_root(&fb, &t), 0);
    int64_t id;
    assert_int_equal(ck_fb_i64(&t, 0, -1, &id), 1);
    assert_int_equal(id, 77);
    /* A slot past the vtable is absent and reads as its default. */
    assert_int_equal(ck_fb_i64(&t, 40, -1, &id), 0);
    assert_int_equal(id, -1);
    struct ck_fb_vec v;
    assert_int_equal(ck_fb_vector(&t, 1, 4, &v), 1);
    assert_int_equal(v.n, 3);
    struct ck_fb_table e;
    assert_int_equal(ck_fb_vec_table(&v, 3, &e), CK_EFORMAT);
}

/* ---- the ADR-0001 zip ---- */

static void zip_put(zip_t *z, const char *name, const void *p, size_t len)
{
    zip_source_t *src = zip_source_buffer(z, p, len, 0);
    assert_non_null(src);
    assert_true(zip_file_add(z, name, src, ZIP_FL_ENC_UTF_8) >= 0);
}

static void adr_zip_newest_tag(void **state)
{
    struct built g_old, g_new;
    struct fbb param;
    char dir[4096], path[8200];
    ck_test_tmpdir(dir, "sd_zip");
    build_graph(&g_old, &good);
    build_graph(&g_new, &good);
    fbb_i64(&g_new.f, g_new.graph, 0, 78); /* the newer graph's id */
    /* params/0.fb: a FlatArray root with w = [7, 8] (shape [2]). */
    fbb_init(&param);
    static const float pv[2] = {7, 8};
    unsigned char pb[8];
    be_floats(pb, pv, 2);
    int64_t si[6] = {1, 2, 1, 8192, 1, 99};
    fbb_root(&param, flat_array(&param, si, 6, pb, 8, 5, NULL));
    snprintf(path, sizeof(path), "%s/model.zip", dir);
    zip_t *z = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, NULL);
    assert_non_null(z);
    /* second's w is shared with first (ADR 0001: "<name> <othertag>/<N>"). */
    static const char tags[] = "first\nsecond\n", params[] = "w first/0\n";
    zip_put(z, "tags.txt", tags, strlen(tags));
    zip_put(z, "first/graph.fb", g_old.f.b, g_old.f.len);
    zip_put(z, "second/graph.fb", g_new.f.b, g_new.f.len);
    zip_put(z, "second/params.txt", params, strlen(params));
    zip_put(z, "first/params/0.fb", param.b, param.len);
    assert_int_equal(zip_close(z), 0);
    const struct ck_reader_ops *ops;
    assert_int_equal(ck_reader_detect(path, &ops), 0);
    assert_string_equal(ops->name, "samediff");
    struct ck_tensor_set *s = NULL;
    assert_int_equal(ck_reader_open(path, NULL, &s), 0);
    const char *tag = NULL, *id = NULL;
    for (size_t i = 0; i < s->nmeta; i++) {
        if (!strcmp(s->meta[i].key, "tag"))
            tag = s->meta[i].value;
        if (!strcmp(s->meta[i].key, "graph_id"))
            id = s->meta[i].value;
    }
    assert_non_null(tag);
    assert_string_equal(tag, "second");
    assert_string_equal(id, "78");
    struct ck_tensor *w = ck_tensor_set_find(s, "w");
    assert_non_null(w);
    assert_int_equal(w->rank, 1);
    assert_int_equal(w->dims[0], 2);
    assert_true(ck_tensor_get_f64(w, 0) == 7 && ck_tensor_get_f64(w, 1) == 8);
    assert_string_equal(w->role, "constant");
    ck_tensor_set_free(s);
}

static void adr_zip_hostile(void **state)
{
    struct built g;
    char dir[4096], path[8200];
    ck_test_tmpdir(dir, "sd_zipbad");
    build_graph(&g, &good);
    static const struct {
        const char *member, *content, *want;
    } cases[] = {
        {"../x", "hello", "unsafe name"},
        {"/etc/x", "hello", "unsafe name"},
        {"t/params.txt", "w ../0\n", "unknown tag '..'"},
        {"t/params.txt", "w 0\n", "no member 't/params/0.fb'"},
        {"t/params.txt", "nosuch 0\n", "graph has no variable 'nosuch'"},
        {"t/params.txt", "w\n", "expected '<name> <file>'"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(path, sizeof(path), "%s/bad%zu.zip", dir, i);
        zip_t *z = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, NULL);
        assert_non_null(z);
        zip_put(z, "tags.txt", "t\n", 2);
        zip_put(z, "t/graph.fb", g.f.b, g.f.len);
        zip_put(z, cases[i].member, cases[i].content, strlen(cases[i].content));
        assert_int_equal(zip_close(z), 0);
        struct ck_tensor_set *s = NULL;
        int err = ck_reader_find("samediff")->open(path, &s);
        assert_true(err < 0);
        assert_null(s);
        if (!strstr(ck_error_msg(), path) || !strstr(ck_error_msg(), cases[i].want))
            fail_msg("case %zu: '%s' should name the file and say '%s'", i, ck_error_msg(),
                     cases[i].want);
    }
}

/* ---- the real files ---- */

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

static void real_pad_1d(void **state)
{
    char path[4096];
    if (!shared("samediff/pad_1D.fb", path))
        skip();
    struct ck_tensor_set *s = NULL;
    if (ck_reader_open(path, NULL, &s) < 0)
        fail_msg("%s", ck_error_msg());
    assert_string_equal(s->format, "samediff");
    /* Expected values: specs/FORMAT-FACTS.md 3.2, decoded independently. */
    struct ck_tensor *in0 = ck_tensor_set_find(s, "in_0"), *in1 = ck_tensor_set_find(s, "in_1"),
                     *in2 = ck_tensor_set_find(s, "in_2");
    assert_non_null(in0);
    assert_non_null(in1);
    assert_non_null(in2);
    static const double v0[5] = {0.7787856, 0.8011978, 0.7243747, 0.2308943, 0.7271413};
    assert_int_equal(in0->dtype, CK_DT_F32);
    assert_int_equal(in0->rank, 1);
    assert_int_equal(in0->dims[0], 5);
    assert_true(in0->big_endian);
    for (int i = 0; i < 5; i++)
        assert_true(fabs(ck_tensor_get_f64(in0, (uint64_t)i) - v0[i]) < 1e-7);
    assert_int_equal(in1->dtype, CK_DT_I32);
    assert_int_equal(in1->rank, 2);
    assert_int_equal(in1->dims[0], 1);
    assert_int_equal(in1->dims[1], 2);
    assert_int_equal(in1->nbytes, 8);
    assert_int_equal(in2->rank, 0);
    assert_true(ck_tensor_get_f64(in2, 0) == 10.0);
    assert_string_equal(in0->role, "constant");
    assert_int_equal(s->graph->nnodes, 1);
    const struct ck_graph_node *n = &s->graph->nodes[0];
    assert_string_equal(n->name, "PadV2");
    assert_string_equal(n->op, "pad");
    assert_int_equal(n->ninputs, 3);
    assert_string_equal(n->inputs[0], "in_0");
    assert_string_equal(n->inputs[1], "in_1");
    assert_string_equal(n->inputs[2], "in_2");
    bool opnum = false;
    for (size_t i = 0; i < n->nattrs; i++)
        if (!strcmp(n->attrs[i].key, "opNum"))
            opnum = !strcmp(n->attrs[i].value, "3562692701058070261");
    assert_true(opnum);
    ck_tensor_set_free(s);
}

static void real_all_files_open(void **state)
{
    static const char *const files[] = {
        "assert_type_rank2_int64.fb",
        "assertsomething.fb",
        "avg_pooling3d.fb",
        "channels_last_b1_k2_s1_d1_SAME_crelu.fb",
        "cond_true.fb",
        "identity_n_2.fb",
        "non2d_0A.fb",
        "non2d_1.fb",
        "pad_1D.fb",
        "reduce_all_rank2_d0_keep.fb",
        "scalar_float32.fb",
        "scatter_nd_update.fb",
        "simpleif_0_alt.fb",
        "simplewhile_1.fb",
        "simplewhile_nested.fb",
        "tensor_array_close_sz1_float32_nodynamic_noname_noshape.fb",
        "tensor_array_split_sz1_float32_nodynamic_noname_noshape.fb",
        "tensor_array_stack_sz3-1_int32_dynamic_name_shape.fb",
        "tensor_array_unstack_sz1_int64_nodynamic_noname_shape2-3.fb",
        "while_iter3.fb",
    };
    char path[4096], rel[600];
    snprintf(rel, sizeof(rel), "samediff/%s", files[0]);
    if (!shared(rel, path))
        skip();
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        struct ck_tensor_set *s = NULL;
        snprintf(rel, sizeof(rel), "samediff/%s", files[i]);
        assert_non_null(shared(rel, path));
        if (ck_reader_open(path, NULL, &s) < 0)
            fail_msg("%s", ck_error_msg());
        assert_string_equal(s->format, "samediff");
        assert_non_null(s->graph);
        assert_true(s->graph->nnodes > 0);
        for (size_t k = 0; k < s->ntensors; k++) {
            const struct ck_tensor *t = &s->tensors[k];
            if (t->data && t->dtype != CK_DT_STRING && ck_tensor_check_size(t, path) < 0)
                fail_msg("%s", ck_error_msg());
        }
        ck_tensor_set_free(s);
    }
}

/* non2d_0A: two placeholders with arrays, the graph inputs. */
static void real_placeholders(void **state)
{
    char path[4096];
    if (!shared("samediff/non2d_0A.fb", path))
        skip();
    struct ck_tensor_set *s = NULL;
    if (ck_reader_open(path, NULL, &s) < 0)
        fail_msg("%s", ck_error_msg());
    assert_int_equal(s->graph->ninputs, 2);
    assert_string_equal(s->graph->inputs[0], "scalarA");
    assert_string_equal(s->graph->inputs[1], "scalarB");
    struct ck_tensor *a = ck_tensor_set_find(s, "scalarA");
    assert_non_null(a);
    assert_string_equal(a->role, "placeholder");
    assert_int_equal(a->dtype, CK_DT_I32);
    ck_tensor_set_free(s);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(graph_fields),         cmocka_unit_test(outputs_from_ids),
    cmocka_unit_test(truncated_everywhere), cmocka_unit_test(offset_past_the_end),
    cmocka_unit_test(vtable_out_of_range),  cmocka_unit_test(vector_length_2_31),
    cmocka_unit_test(wrong_data_count),     cmocka_unit_test(flatbuf_reader_limits),
    cmocka_unit_test(adr_zip_newest_tag),   cmocka_unit_test(adr_zip_hostile),
    cmocka_unit_test(real_pad_1d),          cmocka_unit_test(real_all_files_open),
    cmocka_unit_test(real_placeholders),
};

CK_TEST_MAIN(tests)
