/* The inference engine's kernels, shapes, plan and sandbox on small graphs
 * whose expected values are computed by hand (in the comments) or from
 * closed forms (erf, tanh), never from the engine. */
#include "test_main.h"

#include "common/error.h"
#include "infer/engine.h"
#include "infer/infer.h"
#include "infer/sandbox.h"
#include "model/model.h"

#include <math.h>
#include <signal.h>
#include <unistd.h>

static struct ck_model *model_new(void)
{
    struct ck_model *m = NULL;
    assert_int_equal(ck_model_new(ck_tensor_set_new("test", "mem"), "test", &m), 0);
    return m;
}

static void weight_typed(struct ck_model *m, const char *name, enum ck_dtype dt, int rank,
                         const int64_t *dims, const void *vals, size_t nbytes)
{
    void *data;
    assert_int_equal(ck_tensor_set_alloc(m->weights, nbytes, &data), 0);
    memcpy(data, vals, nbytes);
    struct ck_tensor t = {.name = (char *)name, .dtype = dt, .rank = rank, .nbytes = nbytes,
                          .data = data};
    if (rank)
        memcpy(t.dims, dims, sizeof(int64_t) * (size_t)rank);
    assert_int_equal(ck_tensor_set_add(m->weights, &t, NULL), 0);
}

static void weight(struct ck_model *m, const char *name, int rank, const int64_t *dims,
                   const float *vals)
{
    size_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= (size_t)dims[i];
    weight_typed(m, name, CK_DT_F32, rank, dims, vals, n * sizeof(float));
}

/* A node reading the comma-separated inputs and writing out. */
static struct ck_model_node *node(struct ck_model *m, enum ck_op op, const char *ins,
                                  const char *out)
{
    struct ck_model_node *n;
    char buf[256], *save = NULL;
    assert_int_equal(ck_model_add_node(m, out, op, &n), 0);
    snprintf(buf, sizeof buf, "%s", ins);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        assert_int_equal(ck_model_node_add_input(n, t), 0);
    assert_int_equal(ck_model_node_add_output(n, out), 0);
    return n;
}

static void io(struct ck_model *m, bool output, const char *name, int rank, const int64_t *dims)
{
    assert_int_equal(ck_model_add_io(m, output, name, CK_DT_F32, rank, dims), 0);
}

/* The tolerance of run_check: |got - want| <= rtol |want| + atol. */
static float check_rtol = 1e-5f, check_atol = 1e-5f;

/* Runs m on one input and checks its one output against want. */
static void run_check(const struct ck_model *m, bool naive, int rank, const int64_t *dims,
                      const float *x, int orank, const int64_t *odims, const float *want)
{
    struct ck_infer_options o = {.naive_gemm = naive};
    struct ck_infer *e = NULL;
    struct ck_infer_array in, *out = NULL;
    size_t nout = 0;
    assert_int_equal(ck_infer_new(m, &o, &e), 0);
    assert_int_equal(ck_infer_array_init(&in, "x", rank, dims), 0);
    memcpy(in.data, x, sizeof(float) * ck_infer_array_numel(&in));
    int err = ck_infer_run(e, &in, 1, &out, &nout);
    if (err < 0)
        fail_msg("run failed: %s", ck_error_msg());
    assert_int_equal(nout, 1);
    assert_int_equal(out[0].rank, orank);
    for (int i = 0; i < orank; i++)
        assert_int_equal(out[0].dims[i], odims[i]);
    for (uint64_t i = 0; i < ck_infer_array_numel(&out[0]); i++)
        if (!(fabsf(out[0].data[i] - want[i]) <= check_rtol * fabsf(want[i]) + check_atol))
            fail_msg("value %llu: got %.9g, want %.9g", (unsigned long long)i,
                     (double)out[0].data[i], (double)want[i]);
    ck_infer_arrays_free(out, nout);
    ck_infer_array_release(&in);
    ck_infer_free(e);
}

static const int64_t d12[] = {1, 2};

static void dense_both_layouts(void **state)
{
    /* x [1,2] = [1,2]; W [[1,2,3],[4,5,6]]; b [0.5, 0, -1]
     * y = [1+8+0.5, 2+10+0, 3+12-1] = [9.5, 12, 14] */
    static const float w[] = {1, 2, 3, 4, 5, 6}, wt[] = {1, 4, 2, 5, 3, 6}, b[] = {0.5f, 0, -1};
    static const float x[] = {1, 2}, want[] = {9.5f, 12, 14};
    for (int trans = 0; trans < 2; trans++)
        for (int naive = 0; naive < 2; naive++) {
            struct ck_model *m = model_new();
            int64_t wd[] = {trans ? 3 : 2, trans ? 2 : 3}, bd[] = {3}, od[] = {1, 3};
            weight(m, "W", 2, wd, trans ? wt : w);
            weight(m, "b", 1, bd, b);
            io(m, false, "x", 2, (int64_t[]){-1, 2});
            node(m, CK_OP_DENSE, "x,W,b", "y")->p.trans_w = trans;
            io(m, true, "y", 2, od);
            run_check(m, naive, 2, d12, x, 2, od, want);
            ck_model_free(m);
        }
}

static void dense_converts_f16_bf16_int8(void **state)
{
    /* the same W in float16 (1=0x3C00, 2=0x4000, 3=0x4200, 4=0x4400, 5=0x4500,
     * 6=0x4600), bfloat16 (1=0x3F80, 2=0x4000, 3=0x4040, 4=0x4080, 5=0x40A0,
     * 6=0x40C0) and int8; no bias: y = [9, 12, 15] */
    static const uint16_t f16[] = {0x3C00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};
    static const uint16_t bf16[] = {0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0};
    static const int8_t i8[] = {1, 2, 3, 4, 5, 6};
    static const float x[] = {1, 2}, want[] = {9, 12, 15};
    const void *data[] = {f16, bf16, i8};
    const enum ck_dtype dt[] = {CK_DT_F16, CK_DT_BF16, CK_DT_I8};
    const size_t sz[] = {sizeof f16, sizeof bf16, sizeof i8};
    for (int i = 0; i < 3; i++) {
        struct ck_model *m = model_new();
        int64_t wd[] = {2, 3}, od[] = {1, 3};
        weight_typed(m, "W", dt[i], 2, wd, data[i], sz[i]);
        io(m, false, "x", 2, d12);
        node(m, CK_OP_DENSE, "x,W", "y");
        io(m, true, "y", 2, od);
        run_check(m, false, 2, d12, x, 2, od, want);
        ck_model_free(m);
    }
}

static const float nine[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
static const int64_t x133[] = {1, 1, 3, 3};

static void conv_case(const int64_t *stride, const int64_t *pad, const int64_t *dil,
                      const int64_t *od, const float *want)
{
    static const float ones[] = {1, 1, 1, 1};
    for (int naive = 0; naive < 2; naive++) {
        struct ck_model *m = model_new();
        weight(m, "W", 4, (int64_t[]){1, 1, 2, 2}, ones);
        io(m, false, "x", 4, x133);
        struct ck_model_node *n = node(m, CK_OP_CONV2D, "x,W", "y");
        memcpy(n->p.stride, stride, sizeof n->p.stride);
        memcpy(n->p.pad, pad, sizeof n->p.pad);
        memcpy(n->p.dilation, dil, sizeof n->p.dilation);
        io(m, true, "y", 4, od);
        run_check(m, naive, 4, x133, nine, 4, od, want);
        ck_model_free(m);
    }
}

static void conv2d_stride_pad_dilation_groups(void **state)
{
    /* x = 1..9 in 3x3, a 2x2 kernel of ones: each output sums its window */
    conv_case((int64_t[]){1, 1}, (int64_t[]){0, 0, 0, 0}, (int64_t[]){1, 1},
              (int64_t[]){1, 1, 2, 2}, (float[]){12, 16, 24, 28});
    /* pad 1, stride 2: windows at rows/cols -1 and 1: [1], [2+3], [4+7], [5+6+8+9] */
    conv_case((int64_t[]){2, 2}, (int64_t[]){1, 1, 1, 1}, (int64_t[]){1, 1},
              (int64_t[]){1, 1, 2, 2}, (float[]){1, 5, 11, 28});
    /* dilation 2: the four corners 1+3+7+9 */
    conv_case((int64_t[]){1, 1}, (int64_t[]){0, 0, 0, 0}, (int64_t[]){2, 2},
              (int64_t[]){1, 1, 1, 1}, (float[]){20});
    /* a batch of two images (one product for both): the second is the first
     * plus 9, so each window sums 36 more; bias 1 */
    float x2[18];
    for (int i = 0; i < 18; i++)
        x2[i] = (float)(i + 1);
    for (int naive = 0; naive < 2; naive++) {
        struct ck_model *mb = model_new();
        const int64_t xd[] = {2, 1, 3, 3}, od[] = {2, 1, 2, 2};
        weight(mb, "W", 4, (int64_t[]){1, 1, 2, 2}, (float[]){1, 1, 1, 1});
        weight(mb, "b", 1, (int64_t[]){1}, (float[]){1});
        io(mb, false, "x", 4, (int64_t[]){-1, 1, 3, 3});
        node(mb, CK_OP_CONV2D, "x,W,b", "y");
        io(mb, true, "y", 4, od);
        run_check(mb, naive, 4, xd, x2, 4, od, (float[]){13, 17, 25, 29, 49, 53, 61, 65});
        ck_model_free(mb);
    }
    /* groups 2, 1x1: x [1,2,1,1] = [1,2]; W [2,1,1,1] = [3,4]; bias [10,20] -> [13, 28] */
    struct ck_model *m = model_new();
    weight(m, "W", 4, (int64_t[]){2, 1, 1, 1}, (float[]){3, 4});
    weight(m, "b", 1, (int64_t[]){2}, (float[]){10, 20});
    io(m, false, "x", 4, (int64_t[]){1, 2, 1, 1});
    node(m, CK_OP_CONV2D, "x,W,b", "y")->p.groups = 2;
    io(m, true, "y", 4, (int64_t[]){1, 2, 1, 1});
    run_check(m, false, 4, (int64_t[]){1, 2, 1, 1}, (float[]){1, 2}, 4, (int64_t[]){1, 2, 1, 1},
              (float[]){13, 28});
    ck_model_free(m);
}

/* One unary node over x; p set by the caller through *pn. */
static struct ck_model *unary(enum ck_op op, int rank, const int64_t *dims,
                              struct ck_model_node **pn)
{
    struct ck_model *m = model_new();
    io(m, false, "x", rank, dims);
    *pn = node(m, op, "x", "y");
    return m;
}

static void pool_case(enum ck_op op, const int64_t *xd, const float *x, int64_t k, int64_t s,
                      int64_t pad, bool ceil_mode, bool incl, const int64_t *od, const float *want)
{
    struct ck_model_node *n;
    struct ck_model *m = unary(op, 4, xd, &n);
    n->p.kernel[0] = n->p.kernel[1] = k;
    n->p.stride[0] = n->p.stride[1] = s;
    for (int i = 0; i < 4; i++)
        n->p.pad[i] = pad;
    n->p.ceil_mode = ceil_mode;
    n->p.count_include_pad = incl;
    io(m, true, "y", 4, od);
    run_check(m, false, 4, xd, x, 4, od, want);
    ck_model_free(m);
}

static void pooling(void **state)
{
    float x16[16];
    for (int i = 0; i < 16; i++)
        x16[i] = (float)i;
    const int64_t d44[] = {1, 1, 4, 4}, d22[] = {1, 1, 2, 2}, d11[] = {1, 1, 1, 1};
    pool_case(CK_OP_MAXPOOL, d44, x16, 2, 2, 0, false, false, d22, (float[]){5, 7, 13, 15});
    pool_case(CK_OP_AVGPOOL, d44, x16, 2, 2, 0, false, false, d22,
              (float[]){2.5f, 4.5f, 10.5f, 12.5f});
    pool_case(CK_OP_GLOBAL_AVGPOOL, d44, x16, 0, 1, 0, false, false, d11, (float[]){7.5f});
    pool_case(CK_OP_GLOBAL_MAXPOOL, d44, x16, 0, 1, 0, false, false, d11, (float[]){15});
    /* 2x2 input [1,2,3,4], pad 1, kernel 2, stride 2: each window holds one value */
    const float x4[] = {1, 2, 3, 4};
    pool_case(CK_OP_AVGPOOL, d22, x4, 2, 2, 1, false, false, d22, x4);
    pool_case(CK_OP_AVGPOOL, d22, x4, 2, 2, 1, false, true, d22,
              (float[]){0.25f, 0.5f, 0.75f, 1});
    /* 3x3, kernel 2, stride 2, ceil mode: 2x2 windows cut at the border */
    pool_case(CK_OP_MAXPOOL, x133, nine, 2, 2, 0, true, false, d22, (float[]){5, 6, 8, 9});
    pool_case(CK_OP_AVGPOOL, x133, nine, 2, 2, 0, true, false, d22,
              (float[]){3, 4.5f, 7.5f, 9});
}

static void activations(void **state)
{
    const int64_t d[] = {1, 4};
    const float x[] = {-2, 0, 1, 3};
    struct {
        enum ck_op op;
        float want[4];
    } cases[] = {
        {CK_OP_RELU, {0, 0, 1, 3}},
        {CK_OP_LEAKY_RELU, {-0.02f, 0, 1, 3}},
        {CK_OP_SIGMOID, {0.11920292f, 0.5f, 0.73105858f, 0.95257413f}},
        {CK_OP_TANH, {-0.96402758f, 0, 0.76159416f, 0.99505475f}},
        /* x/2 (1 + erf(x/sqrt 2)) */
        {CK_OP_GELU, {-0.04550026f, 0, 0.84134475f, 2.99595031f}},
        {CK_OP_NEG, {2, 0, -1, -3}},
        {CK_OP_EXP, {0.13533528f, 1, 2.71828183f, 20.08553692f}},
        {CK_OP_ERF, {-0.99532227f, 0, 0.84270079f, 0.99997791f}},
        {CK_OP_CLIP, {-1, 0, 1, 2}},
        {CK_OP_IDENTITY, {-2, 0, 1, 3}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct ck_model_node *n;
        struct ck_model *m = unary(cases[i].op, 2, d, &n);
        n->p.min = -1;
        n->p.max = 2;
        io(m, true, "y", 2, d);
        run_check(m, false, 2, d, x, 2, d, cases[i].want);
        ck_model_free(m);
    }
    /* the tanh form of GELU at 1: 0.5 (1 + tanh(sqrt(2/pi) 1.044715)) */
    struct ck_model_node *n;
    struct ck_model *m = unary(CK_OP_GELU, 2, d, &n);
    n->p.approx_tanh = true;
    io(m, true, "y", 2, d);
    run_check(m, false, 2, d, x, 2, d, (float[]){-0.04540231f, 0, 0.84119199f, 2.99636261f});
    ck_model_free(m);
    m = unary(CK_OP_SQRT, 2, d12, &n);
    io(m, true, "y", 2, d12);
    run_check(m, false, 2, d12, (float[]){4, 2}, 2, d12, (float[]){2, 1.41421356f});
    ck_model_free(m);
    m = unary(CK_OP_LOG, 2, d12, &n);
    io(m, true, "y", 2, d12);
    run_check(m, false, 2, d12, (float[]){1, 2.71828183f}, 2, d12, (float[]){0, 1});
    ck_model_free(m);
}

static void tanh_matches_libm_everywhere(void **state)
{
    /* the engine's tanh against double-precision tanh over [-20, 20], both
     * signs, tiny values and the non-finite ones */
    enum { N = 40001 };
    const int64_t d[] = {1, N + 4};
    static float x[N + 4], want[N + 4];
    for (int i = 0; i < N; i++) {
        x[i] = -20.0f + (float)i * 0.001f;
        want[i] = (float)tanh((double)x[i]);
    }
    x[N] = 1e-30f, want[N] = 1e-30f;
    x[N + 1] = -INFINITY, want[N + 1] = -1;
    x[N + 2] = INFINITY, want[N + 2] = 1;
    x[N + 3] = -3e-8f, want[N + 3] = -3e-8f;
    struct ck_model_node *n;
    struct ck_model *m = unary(CK_OP_TANH, 2, d, &n);
    io(m, true, "y", 2, d);
    check_rtol = 1e-6f; /* a few float32 ulp, also for the tiny values */
    check_atol = 0;
    run_check(m, false, 2, d, x, 2, d, want);
    check_rtol = check_atol = 1e-5f;
    ck_model_free(m);
}

static void softmax_on_an_axis(void **state)
{
    /* [1,2,3]: e^x / (e + e^2 + e^3) and x - log(e + e^2 + e^3) */
    const int64_t d[] = {1, 3}, dt[] = {3, 1};
    const float x[] = {1, 2, 3};
    const float sm[] = {0.09003057f, 0.24472847f, 0.66524096f};
    const float lsm[] = {-2.40760596f, -1.40760596f, -0.40760596f};
    struct ck_model_node *n;
    struct ck_model *m = unary(CK_OP_SOFTMAX, 2, d, &n);
    io(m, true, "y", 2, d);
    run_check(m, false, 2, d, x, 2, d, sm);
    ck_model_free(m);
    m = unary(CK_OP_LOG_SOFTMAX, 2, dt, &n);
    n->p.axis = 0;
    io(m, true, "y", 2, dt);
    run_check(m, false, 2, dt, x, 2, dt, lsm);
    ck_model_free(m);
}

static void binary_broadcast_and_scalar(void **state)
{
    const int64_t d23[] = {2, 3};
    const float a[] = {1, 2, 3, 4, 5, 6};
    struct ck_model *m = model_new();
    weight(m, "row", 1, (int64_t[]){3}, (float[]){10, 20, 30});
    weight(m, "col", 2, (int64_t[]){2, 1}, (float[]){100, 200});
    io(m, false, "x", 2, d23);
    node(m, CK_OP_ADD, "x,row", "s");  /* [11,22,33,14,25,36] */
    node(m, CK_OP_MUL, "s,col", "p");  /* [1100,2200,3300,2800,5000,7200] */
    node(m, CK_OP_DIV, "p,row", "q");  /* [110,110,110,280,250,240] */
    struct ck_model_node *n = node(m, CK_OP_SUB, "q", "r"); /* 1000 - q */
    n->p.has_scalar = n->p.scalar_first = true;
    n->p.scalar = 1000;
    n = node(m, CK_OP_POW, "r", "y"); /* squared */
    n->p.has_scalar = true;
    n->p.scalar = 2;
    io(m, true, "y", 2, d23);
    run_check(m, false, 2, d23, a, 2, d23,
              (float[]){792100, 792100, 792100, 518400, 562500, 577600});
    ck_model_free(m);
}

static void matmul_batch_broadcast(void **state)
{
    /* a [2,1,2] = [[1,2]],[[3,4]]; b [2,1] = [5,6]: [[17]], [[39]] */
    struct ck_model *m = model_new();
    weight(m, "b", 2, (int64_t[]){2, 1}, (float[]){5, 6});
    const int64_t ad[] = {2, 1, 2}, od[] = {2, 1, 1};
    io(m, false, "x", 3, ad);
    node(m, CK_OP_MATMUL, "x,b", "y");
    io(m, true, "y", 3, od);
    run_check(m, false, 3, ad, (float[]){1, 2, 3, 4}, 3, od, (float[]){17, 39});
    run_check(m, true, 3, ad, (float[]){1, 2, 3, 4}, 3, od, (float[]){17, 39});
    ck_model_free(m);
}

static void layout_ops(void **state)
{
    const int64_t d23[] = {2, 3};
    const float a[] = {1, 2, 3, 4, 5, 6};
    struct ck_model_node *n;
    /* transpose [2,3] -> [3,2] */
    struct ck_model *m = unary(CK_OP_TRANSPOSE, 2, d23, &n);
    io(m, true, "y", 2, (int64_t[]){3, 2});
    run_check(m, false, 2, d23, a, 2, (int64_t[]){3, 2}, (float[]){1, 4, 2, 5, 3, 6});
    ck_model_free(m);
    /* slice rows 0.., columns from the end backwards by 2: [[3,1],[6,4]] */
    m = unary(CK_OP_SLICE, 2, d23, &n);
    assert_int_equal(ck_model_node_set_ints(n, (int64_t[]){0, 99, 1, -1, -100, -2}, 6), 0);
    io(m, true, "y", 2, d12);
    run_check(m, false, 2, d23, a, 2, (int64_t[]){2, 2}, (float[]){3, 1, 6, 4});
    ck_model_free(m);
    /* pad one column of 7 on the left: [[7,1,2,3],[7,4,5,6]] */
    m = unary(CK_OP_PAD, 2, d23, &n);
    assert_int_equal(ck_model_node_set_ints(n, (int64_t[]){0, 0, 1, 0}, 4), 0);
    n->p.scalar = 7;
    io(m, true, "y", 2, d12);
    run_check(m, false, 2, d23, a, 2, (int64_t[]){2, 4}, (float[]){7, 1, 2, 3, 7, 4, 5, 6});
    ck_model_free(m);
    /* reshape to [3, -1], then flatten from axis 0... unsqueeze, squeeze */
    m = unary(CK_OP_RESHAPE, 2, d23, &n);
    assert_int_equal(ck_model_node_set_ints(n, (int64_t[]){3, -1}, 2), 0);
    n = node(m, CK_OP_UNSQUEEZE, "y", "u");
    assert_int_equal(ck_model_node_set_ints(n, (int64_t[]){0}, 1), 0);
    node(m, CK_OP_SQUEEZE, "u", "z");
    io(m, true, "z", 2, d12);
    run_check(m, false, 2, d23, a, 2, (int64_t[]){3, 2}, a);
    ck_model_free(m);
    /* split columns [1, 2], concat them back in the other order */
    m = unary(CK_OP_IDENTITY, 2, d23, &n);
    assert_int_equal(ck_model_add_node(m, "sp", CK_OP_SPLIT, &n), 0);
    assert_int_equal(ck_model_node_add_input(n, "y"), 0);
    assert_int_equal(ck_model_node_add_output(n, "l"), 0);
    assert_int_equal(ck_model_node_add_output(n, "r"), 0);
    assert_int_equal(ck_model_node_set_ints(n, (int64_t[]){1, 2}, 2), 0);
    n->p.axis = 1;
    node(m, CK_OP_CONCAT, "r,l", "c")->p.axis = -1;
    io(m, true, "c", 2, d23);
    run_check(m, false, 2, d23, a, 2, d23, (float[]){2, 3, 1, 5, 6, 4});
    ck_model_free(m);
    /* gather rows 2, 0, -1 of a [3,2] table */
    m = model_new();
    weight(m, "table", 2, (int64_t[]){3, 2}, a);
    io(m, false, "x", 1, (int64_t[]){3});
    node(m, CK_OP_GATHER, "table,x", "y");
    io(m, true, "y", 2, (int64_t[]){3, 2});
    run_check(m, false, 1, (int64_t[]){3}, (float[]){2, 0, -1}, 2, (int64_t[]){3, 2},
              (float[]){5, 6, 1, 2, 5, 6});
    ck_model_free(m);
}

static void norms_and_reductions(void **state)
{
    /* batchnorm, eps 0: channel 0 (1-1)/sqrt 4 * 2 + 0 = 0; channel 1 (2-1)/1 * 3 + 1 = 4 */
    struct ck_model *m = model_new();
    const int64_t xd[] = {1, 2, 1, 1}, c2[] = {2};
    weight(m, "g", 1, c2, (float[]){2, 3});
    weight(m, "b", 1, c2, (float[]){0, 1});
    weight(m, "mu", 1, c2, (float[]){1, 1});
    weight(m, "var", 1, c2, (float[]){4, 1});
    io(m, false, "x", 4, xd);
    node(m, CK_OP_BATCHNORM, "x,g,b,mu,var", "y")->p.eps = 0;
    io(m, true, "y", 4, xd);
    run_check(m, false, 4, xd, (float[]){1, 2}, 4, xd, (float[]){0, 4});
    ck_model_free(m);
    /* layernorm of [1,2,3,4]: mean 2.5, variance 1.25 */
    struct ck_model_node *n;
    const int64_t d14[] = {1, 4};
    m = unary(CK_OP_LAYERNORM, 2, d14, &n);
    n->p.eps = 0;
    io(m, true, "y", 2, d14);
    run_check(m, false, 2, d14, (float[]){1, 2, 3, 4}, 2, d14,
              (float[]){-1.34164079f, -0.44721360f, 0.44721360f, 1.34164079f});
    ck_model_free(m);
    /* reduce_mean over axis 1 kept: [[2],[5]]; reduce_sum of everything: 21 */
    const int64_t d23[] = {2, 3};
    const float a[] = {1, 2, 3, 4, 5, 6};
    m = unary(CK_OP_REDUCE_MEAN, 2, d23, &n);
    assert_int_equal(ck_model_node_set_ints(n, (int64_t[]){1}, 1), 0);
    n->p.keepdims = true;
    io(m, true, "y", 2, (int64_t[]){2, 1});
    run_check(m, false, 2, d23, a, 2, (int64_t[]){2, 1}, (float[]){2, 5});
    ck_model_free(m);
    m = unary(CK_OP_REDUCE_SUM, 2, d23, &n);
    io(m, true, "y", 0, NULL);
    run_check(m, false, 2, d23, a, 0, NULL, (float[]){21});
    ck_model_free(m);
}

static void errors_name_the_node(void **state)
{
    struct ck_model *m = model_new();
    weight(m, "W", 2, (int64_t[]){3, 4}, (float[12]){0});
    io(m, false, "x", 2, d12);
    node(m, CK_OP_DENSE, "x,W", "fc1");
    io(m, true, "fc1", 2, (int64_t[]){1, 4});
    struct ck_infer *e = NULL;
    struct ck_infer_array in, *out = NULL;
    size_t nout = 0;
    assert_int_equal(ck_infer_new(m, NULL, &e), 0);
    assert_int_equal(ck_infer_array_init(&in, "x", 2, d12), 0);
    assert_int_equal(ck_infer_run(e, &in, 1, &out, &nout), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "node 'fc1' (dense)"));
    assert_non_null(strstr(ck_error_msg(), "has 2 features"));
    ck_infer_array_release(&in);
    /* an input of the wrong shape */
    assert_int_equal(ck_infer_array_init(&in, "x", 2, (int64_t[]){1, 3}), 0);
    assert_int_equal(ck_infer_run(e, &in, 1, &out, &nout), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "input 'x': shape [1, 3] does not match"));
    ck_infer_array_release(&in);
    ck_infer_free(e);
    ck_model_free(m);
    /* a weight that is not a number */
    m = model_new();
    weight_typed(m, "W", CK_DT_C64, 1, (int64_t[]){1}, (float[2]){0}, 8);
    io(m, false, "x", 1, (int64_t[]){1});
    node(m, CK_OP_ADD, "x,W", "y");
    io(m, true, "y", 1, (int64_t[]){1});
    assert_int_equal(ck_infer_new(m, NULL, &e), CK_EFORMAT);
    assert_non_null(strstr(ck_error_msg(), "weight 'W': dtype complex64"));
    ck_model_free(m);
}

/* x [dims] -> relu -> ... -> relu (n of them, r0 .. r{n-1}) -> the output. */
static struct ck_model *relu_chain(int n, const int64_t dims[2])
{
    struct ck_model *m = model_new();
    io(m, false, "x", 2, dims);
    char prev[16] = "x", name[16];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "r%d", i);
        node(m, CK_OP_RELU, prev, name);
        memcpy(prev, name, sizeof prev);
    }
    io(m, true, prev, 2, dims);
    return m;
}

/* The buffers of a run are kept for the next one (no page is allocated
 * again at the same shapes), and a run at other input shapes plans again:
 * each run's outputs are its own input's relu, whatever ran before. */
static void plan_keeps_buffers_between_runs(void **state)
{
    const int64_t any[] = {-1, 1000};
    struct ck_model *m = relu_chain(3, any);
    struct ck_infer *e = NULL;
    assert_int_equal(ck_infer_new(m, NULL, &e), 0);
    static const int64_t batches[] = {2, 2, 1, 4, 4, 1};
    float *kept[2] = {NULL, NULL};
    uint64_t peak4 = 0;
    for (size_t r = 0; r < sizeof batches / sizeof *batches; r++) {
        int64_t d[] = {batches[r], 1000};
        struct ck_infer_array in, *out = NULL;
        size_t nout = 0;
        assert_int_equal(ck_infer_array_init(&in, "x", 2, d), 0);
        for (uint64_t i = 0; i < ck_infer_array_numel(&in); i++) /* signs differ per run */
            in.data[i] = (float)((int64_t)((i * 7 + r * 13) % 11) - 5) * (float)(r + 1);
        assert_int_equal(ck_infer_run(e, &in, 1, &out, &nout), 0);
        assert_int_equal(out[0].rank, 2);
        assert_int_equal(out[0].dims[0], batches[r]);
        for (uint64_t i = 0; i < ck_infer_array_numel(&in); i++)
            assert_true(out[0].data[i] == (in.data[i] < 0 ? 0.0f : in.data[i]));
        assert_int_equal(e->nbufs, 2);
        if (r == 1 || r == 4) /* the same shapes as the run before: the same buffers */
            for (int b = 0; b < 2; b++)
                assert_ptr_equal(e->bufs[b].data, kept[b]);
        if (r == 2) /* smaller: the larger buffers still fit */
            assert_int_equal(ck_infer_peak_activation_bytes(e), 2 * 2000 * sizeof(float));
        if (r == 3)
            peak4 = ck_infer_peak_activation_bytes(e);
        for (int b = 0; b < 2; b++) {
            kept[b] = e->bufs[b].data;
            assert_true(e->bufs[b].held >= batches[r] * 1000);
        }
        ck_infer_arrays_free(out, nout);
        ck_infer_array_release(&in);
    }
    assert_int_equal(peak4, 2 * 4000 * sizeof(float));
    assert_int_equal(ck_infer_peak_activation_bytes(e), peak4); /* batch 1 after 4 keeps them */
    ck_infer_free(e);
    ck_model_free(m);
}

/* The sigmoids' e^x (ck_infer_expf) against exp in double rounded to
 * float: within 2 ulp over the whole range it covers, NaN kept, and the
 * clamped ends where the documentation says. */
static void expf_within_two_ulp(void **state)
{
    double worst = 0;
    for (int64_t i = 0; i <= 2000000; i++) {
        float x = (float)(-87.3 + 175.6 * (double)i / 2000000.0);
        float want = (float)exp((double)x), got = ck_infer_expf(x);
        double ulp = (double)nextafterf(want, INFINITY) - (double)want;
        double err = fabs((double)got - (double)want) / ulp;
        if (err > worst)
            worst = err;
        if (err > 2.0)
            fail_msg("expf(%.9g): got %.9g, want %.9g (%.2f ulp)", (double)x, (double)got,
                     (double)want, err);
    }
    print_message("ck_infer_expf: worst %.2f ulp\n", worst);
    assert_true(isnan(ck_infer_expf(NAN)));
    assert_true(ck_infer_expf(-1000.0f) > 0 && ck_infer_expf(-1000.0f) < 1.2e-38f);
    assert_true(ck_infer_expf(-INFINITY) < 1.2e-38f);
    assert_true(isfinite(ck_infer_expf(1000.0f)) && ck_infer_expf(1000.0f) > 2e38f);
    assert_true(ck_infer_expf(0.0f) == 1.0f);
}

/* The products with weights packed at load (pgemm.c) against a double
 * reference, at sizes around every block edge (rows around the 8-row
 * panel, columns around the 16- and 32-column tiles and the 128-column
 * block, k around the 256 k block), with ldb and ldc past n; and every
 * part of a product (rows at multiples of 8, columns anywhere) the same
 * bits as the whole, nothing outside the part written. */
static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static void pgemm_matches_a_double_reference(void **state)
{
    (void)state;
    if (!ck_infer_pgemm_available()) {
        print_message("no AVX-512F: the packed products are not used on this CPU\n");
        skip();
    }
    static const int64_t sz[][3] = {{1, 1, 1},    {8, 32, 256}, {7, 15, 3},    {9, 17, 257},
                                    {13, 33, 300}, {16, 16, 1},  {64, 129, 27}, {70, 49, 513},
                                    {3, 200, 64},  {24, 1, 600}, {100, 9, 72},  {5, 31, 0}};
    uint32_t seed = 7;
    for (size_t t = 0; t < sizeof sz / sizeof sz[0]; t++) {
        int64_t m = sz[t][0], n = sz[t][1], k = sz[t][2], ldb = n + 3, ldc = n + 5;
        float *a = malloc(sizeof(float) * (size_t)(m * k + 1));
        float *b = malloc(sizeof(float) * (size_t)(k * ldb + 1));
        float *ap = malloc(sizeof(float) * (size_t)(ck_infer_pgemm_pack_floats(m, k) + 1));
        float *c = malloc(sizeof(float) * (size_t)(m * ldc));
        float *c2 = malloc(sizeof(float) * (size_t)(m * ldc));
        assert_non_null(a);
        assert_non_null(b);
        assert_non_null(ap);
        assert_non_null(c);
        assert_non_null(c2);
        for (int64_t i = 0; i < m * k; i++)
            a[i] = (float)((int)(lcg(&seed) % 2001) - 1000) / 997.0f;
        for (int64_t i = 0; i < k * ldb; i++)
            b[i] = (float)((int)(lcg(&seed) % 2001) - 1000) / 991.0f;
        for (int64_t i = 0; i < m * ldc; i++)
            c[i] = c2[i] = -7.0f; /* sentinels: the columns past n stay */
        ck_infer_pgemm_pack(m, k, a, k, ap);
        struct ck_pgemm_src src = {.b = b, .ldb = ldb};
        ck_infer_pgemm(ap, m, k, &src, c, ldc, 0, m, 0, n);
        for (int64_t i = 0; i < m; i++) {
            for (int64_t j = 0; j < n; j++) {
                double want = 0, mag = 0;
                for (int64_t p = 0; p < k; p++) {
                    want += (double)a[i * k + p] * (double)b[p * ldb + j];
                    mag += fabs((double)a[i * k + p] * (double)b[p * ldb + j]);
                }
                double got = c[i * ldc + j];
                if (fabs(got - want) > 1e-5 * mag + 1e-30)
                    fail_msg("%lldx%lldx%lld: C[%lld, %lld] = %.9g, want %.9g", (long long)m,
                             (long long)n, (long long)k, (long long)i, (long long)j, got, want);
            }
            for (int64_t j = n; j < ldc; j++)
                assert_true(c[i * ldc + j] == -7.0f);
        }
        /* in parts: rows cut at 8, columns at 5 and 37; a part writes
         * only its own outputs */
        int64_t rc[] = {0, m > 8 ? 8 : m, m}, cc[] = {0, n > 5 ? 5 : n, n > 37 ? 37 : n, n};
        for (int ri = 0; ri < 2; ri++)
            for (int ci = 0; ci < 3; ci++) {
                if (rc[ri] == rc[ri + 1] || cc[ci] == cc[ci + 1])
                    continue;
                for (int64_t i = 0; i < m * ldc; i++)
                    c2[i] = -7.0f;
                ck_infer_pgemm(ap, m, k, &src, c2, ldc, rc[ri], rc[ri + 1], cc[ci], cc[ci + 1]);
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < ldc; j++)
                        if (i >= rc[ri] && i < rc[ri + 1] && j >= cc[ci] && j < cc[ci + 1])
                            assert_memory_equal(&c2[i * ldc + j], &c[i * ldc + j], sizeof(float));
                        else if (c2[i * ldc + j] != -7.0f)
                            fail_msg("%lldx%lldx%lld: part [%lld, %lld) x [%lld, %lld) wrote "
                                     "C[%lld, %lld]", (long long)m, (long long)n, (long long)k,
                                     (long long)rc[ri], (long long)rc[ri + 1], (long long)cc[ci],
                                     (long long)cc[ci + 1], (long long)i, (long long)j);
            }
        free(a);
        free(b);
        free(ap);
        free(c);
        free(c2);
    }
}

/* ck_infer_erff against libm's erff over a dense sweep: every 61st float
 * bit pattern from 0 to infinity (35 million values: each binade, the
 * subnormals, the clamp at 4 and beyond), with either sign, and a grid of
 * 4 million points of [-5, 5]; within 4 ulp of erff's result (the ulp
 * below it: erf's values just under 1 are 2^-24 apart); NaN, the
 * infinities and the zeros exactly as erff. */
static void erf_check(float x, double *worst, float *at)
{
    float want = erff(x), got = ck_infer_erff(x);
    if (isnan(want) || want == 0.0f || isinf(x)) {
        if (memcmp(&want, &got, sizeof want) != 0 && !(isnan(want) && isnan(got)))
            fail_msg("erf(%.9g): got %.9g, erff %.9g", (double)x, (double)got, (double)want);
        return;
    }
    float aw = fabsf(want);
    double ulp = (double)aw - (double)nextafterf(aw, 0.0f);
    double err = fabs((double)got - (double)want) / ulp;
    if (err > *worst) {
        *worst = err;
        *at = x;
    }
    if (!(err <= 4.0))
        fail_msg("erf(%.9g): got %.9g, erff %.9g (%.2f ulp)", (double)x, (double)got,
                 (double)want, err);
}

static void erf_within_four_ulp_of_libm(void **state)
{
    (void)state;
    double worst = 0;
    float at = 0;
    for (uint32_t b = 0; b < 0x7f800000u; b += 61) {
        float x;
        memcpy(&x, &b, sizeof x);
        erf_check(x, &worst, &at);
        erf_check(-x, &worst, &at);
    }
    for (int64_t i = 0; i <= 4000000; i++)
        erf_check((float)(-5.0 + 10.0 * (double)i / 4000000.0), &worst, &at);
    const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 4.0f, -4.0f, 1.0f, -1.0f,
                             3.92f, 1e-45f, -1e-45f, 1e-38f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        erf_check(special[i], &worst, &at);
    assert_true(signbit(ck_infer_erff(-0.0f)) && ck_infer_erff(INFINITY) == 1.0f);
    print_message("ck_infer_erff: worst %.2f ulp at %.9g\n", worst, (double)at);
}

/* ck_infer_erf_array (16 at a time with AVX-512F) gives the scalar
 * ck_infer_erff's bits, for erf and for GELU, in place and not, at every
 * length around the vector's 16 (the scalar tail). */
static void erf_vector_same_bits(void **state)
{
    (void)state;
    enum { N = 50021 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    assert_true(x && y);
    uint32_t seed = 3;
    for (int i = 0; i < N; i++)
        x[i] = (float)((double)lcg(&seed) / (1 << 24) * (i % 2 ? 12.0 : 60.0) -
                       (i % 2 ? 6.0 : 30.0));
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 4.0f, -4.0f, 1.0f,
                             -1.0f, 0.99999994f, 1e-40f, -3.9f, 2.5f};
    memcpy(x + 7, special, sizeof special);
    for (int gelu = 0; gelu < 2; gelu++)
        for (int inplace = 0; inplace < 2; inplace++)
            for (int64_t n = N; n >= N - 17; n--) {
                for (int i = 0; i < N; i++)
                    y[i] = inplace ? x[i] : -7.0f;
                ck_infer_erf_array(inplace ? y : x, y, n, gelu);
                for (int64_t i = 0; i < N; i++) {
                    float want = i >= n ? (inplace ? x[i] : -7.0f)
                                 : gelu ? 0.5f * x[i] *
                                              (1.0f + ck_infer_erff(x[i] * (float)M_SQRT1_2))
                                        : ck_infer_erff(x[i]);
                    if (memcmp(&want, &y[i], sizeof want) != 0 && !(isnan(want) && isnan(y[i])))
                        fail_msg("%s(%.9g) at %lld of %lld: %.9g, the scalar code %.9g",
                                 gelu ? "gelu" : "erf", (double)x[i], (long long)i,
                                 (long long)n, (double)y[i], (double)want);
                }
            }
    free(x);
    free(y);
}

/* Dense products from a weight packed at load (pgemm.c's packb and
 * pgemm_dense) against a double reference: M, N, K of 1, 7, 33 and sizes
 * around the 8-row panel, the 64-row block, the 16- and 32-column tiles and
 * the 256 k block, B as [k, n] and transposed ([n, k]: Gemm's transB), lda
 * and ldc past the matrices; and every part of the product (rows cut
 * anywhere, columns at tile edges) the same bits as the whole, nothing
 * outside the part written. */
static void pgemm_dense_matches_a_double_reference(void **state)
{
    (void)state;
    if (!ck_infer_pgemm_available()) {
        print_message("no AVX-512F: the packed products are not used on this CPU\n");
        skip();
    }
    static const int64_t sz[][3] = {{1, 1, 1},    {7, 7, 7},    {33, 33, 33},  {1, 33, 7},
                                    {33, 1, 1},   {7, 1, 33},   {8, 32, 256},  {9, 17, 257},
                                    {65, 31, 300}, {130, 70, 513}, {64, 64, 64}, {3, 100, 0},
                                    {1, 1000, 512}};
    uint32_t seed = 11;
    for (size_t t = 0; t < sizeof sz / sizeof sz[0]; t++)
        for (int trans = 0; trans < 2; trans++) {
            int64_t m = sz[t][0], n = sz[t][1], k = sz[t][2], lda = k + 2, ldc = n + 5;
            int64_t ldb = trans ? k + 1 : n + 3, brows = trans ? n : k;
            float *a = malloc(sizeof(float) * (size_t)(m * lda + 1));
            float *b = malloc(sizeof(float) * (size_t)(brows * ldb + 1));
            float *bp = aligned_alloc(64, sizeof(float) *
                                              (size_t)(ck_infer_pgemm_packb_floats(k, n) + 16));
            float *c = malloc(sizeof(float) * (size_t)(m * ldc));
            float *c2 = malloc(sizeof(float) * (size_t)(m * ldc));
            assert_true(a && b && bp && c && c2);
            for (int64_t i = 0; i < m * lda; i++)
                a[i] = (float)((int)(lcg(&seed) % 2001) - 1000) / 997.0f;
            for (int64_t i = 0; i < brows * ldb; i++)
                b[i] = (float)((int)(lcg(&seed) % 2001) - 1000) / 991.0f;
            for (int64_t i = 0; i < m * ldc; i++)
                c[i] = c2[i] = -7.0f;
            ck_infer_pgemm_packb(k, n, b, ldb, trans, bp);
            ck_infer_pgemm_dense(a, lda, bp, k, n, c, ldc, 0, m, 0, n);
            for (int64_t i = 0; i < m; i++) {
                for (int64_t j = 0; j < n; j++) {
                    double want = 0, mag = 0;
                    for (int64_t p = 0; p < k; p++) {
                        double bv = trans ? b[j * ldb + p] : b[p * ldb + j];
                        want += (double)a[i * lda + p] * bv;
                        mag += fabs((double)a[i * lda + p] * bv);
                    }
                    double got = c[i * ldc + j];
                    if (fabs(got - want) > 1e-5 * mag + 1e-30)
                        fail_msg("%lldx%lldx%lld%s: C[%lld, %lld] = %.9g, want %.9g",
                                 (long long)m, (long long)n, (long long)k, trans ? " (B^T)" : "",
                                 (long long)i, (long long)j, got, want);
                }
                for (int64_t j = n; j < ldc; j++)
                    assert_true(c[i * ldc + j] == -7.0f);
            }
            int64_t rc[] = {0, m > 3 ? 3 : m, m > 70 ? 70 : m, m};
            int64_t cc[] = {0, n > 32 ? 32 : n, n > 64 ? 64 : n, n};
            for (int ri = 0; ri < 3; ri++)
                for (int ci = 0; ci < 3; ci++) {
                    if (rc[ri] == rc[ri + 1] || cc[ci] == cc[ci + 1])
                        continue;
                    for (int64_t i = 0; i < m * ldc; i++)
                        c2[i] = -7.0f;
                    ck_infer_pgemm_dense(a, lda, bp, k, n, c2, ldc, rc[ri], rc[ri + 1], cc[ci],
                                         cc[ci + 1]);
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = 0; j < ldc; j++)
                            if (i >= rc[ri] && i < rc[ri + 1] && j >= cc[ci] && j < cc[ci + 1])
                                assert_memory_equal(&c2[i * ldc + j], &c[i * ldc + j],
                                                    sizeof(float));
                            else if (c2[i * ldc + j] != -7.0f)
                                fail_msg("%lldx%lldx%lld: part [%lld, %lld) x [%lld, %lld) "
                                         "wrote C[%lld, %lld]", (long long)m, (long long)n,
                                         (long long)k, (long long)rc[ri], (long long)rc[ri + 1],
                                         (long long)cc[ci], (long long)cc[ci + 1], (long long)i,
                                         (long long)j);
                }
            free(a);
            free(b);
            free(bp);
            free(c);
            free(c2);
        }
}

/* Runs m (input "x" of xd, output of od) with the given threads; the output
 * in a new array of numel floats. */
static float *run_threads(const struct ck_model *m, int threads, int rank, const int64_t *xd,
                          const float *x, uint64_t numel)
{
    struct ck_infer_options o = {.threads = threads};
    struct ck_infer *e = NULL;
    struct ck_infer_array in, *out = NULL;
    size_t nout = 0;
    assert_int_equal(ck_infer_new(m, &o, &e), 0);
    assert_int_equal(ck_infer_array_init(&in, "x", rank, xd), 0);
    memcpy(in.data, x, sizeof(float) * ck_infer_array_numel(&in));
    if (ck_infer_run(e, &in, 1, &out, &nout) < 0)
        fail_msg("run failed: %s", ck_error_msg());
    assert_int_equal(nout, 1);
    assert_int_equal(ck_infer_array_numel(&out[0]), numel);
    float *y = malloc(sizeof(float) * (size_t)numel);
    assert_non_null(y);
    memcpy(y, out[0].data, sizeof(float) * (size_t)numel);
    ck_infer_arrays_free(out, nout);
    ck_infer_array_release(&in);
    ck_infer_free(e);
    return y;
}

/* Dense layers and matmuls by a constant matrix through the engine, where
 * their weights are packed at load: a dense layer with a bias broadcast
 * over the rows, W [in, out] and [out, in] (trans_w), x of 3 dims; a matmul
 * of a batch [2, m, k] by a constant [k, n], and by the transpose of a
 * constant [n, k] (torch's export of a Linear on a sequence: the transpose
 * is folded, not run). Each against a naive reference computed here in
 * double, the same bits at 1 and 4 threads, and the packed copy counted in
 * the weight bytes (so the packed path ran) in place of the converted one. */
static void dense_packed_against_naive(void **state)
{
    (void)state;
    static const int64_t sz[][3] = {{1, 1, 1},     {7, 7, 7},     {33, 33, 33},
                                    {1, 1000, 33}, {7, 33, 1},    {33, 1, 7},
                                    {70, 65, 300}, {130, 40, 64}, {3, 600, 700}};
    uint32_t seed = 5;
    for (size_t t = 0; t < sizeof sz / sizeof sz[0]; t++)
        for (int kind = 0; kind < 4; kind++) { /* dense [in, out], [out, in], matmul, of W^T */
            int64_t rows = sz[t][0], out = sz[t][1], in = sz[t][2];
            int64_t b0 = kind >= 2 ? 2 : 1, m = kind >= 2 ? (rows + 1) / 2 : rows;
            rows = b0 * m;
            float *w = malloc(sizeof(float) * (size_t)(in * out));
            float *bias = malloc(sizeof(float) * (size_t)out);
            float *x = malloc(sizeof(float) * (size_t)(rows * in));
            assert_true(w && bias && x);
            for (int64_t i = 0; i < in * out; i++)
                w[i] = (float)((int)(lcg(&seed) % 2001) - 1000) / 997.0f;
            for (int64_t i = 0; i < out; i++)
                bias[i] = (float)((int)(lcg(&seed) % 2001) - 1000) / 97.0f;
            for (int64_t i = 0; i < rows * in; i++)
                x[i] = (float)((int)(lcg(&seed) % 2001) - 1000) / 991.0f;
            struct ck_model *md = model_new();
            bool wt = kind == 1 || kind == 3; /* W [out, in] */
            int64_t wd[2] = {wt ? out : in, wt ? in : out}, bd[1] = {out};
            int64_t xd[3] = {b0, m, in}, od[3] = {b0, m, out};
            /* float64: converted to an owned float32 copy at load, which
             * packing lets go of part by part (600 x 700 is 2 parts) */
            double *w64 = malloc(sizeof(double) * (size_t)(in * out));
            assert_non_null(w64);
            for (int64_t i = 0; i < in * out; i++)
                w64[i] = w[i];
            weight_typed(md, "W", CK_DT_F64, 2, wd, w64, sizeof(double) * (size_t)(in * out));
            free(w64);
            io(md, false, "x", 3, xd);
            if (kind < 2) {
                weight(md, "b", 1, bd, bias);
                struct ck_model_node *n = node(md, CK_OP_DENSE, "x,W,b", "y");
                n->p.trans_w = kind == 1;
                n->p.axis = 2; /* x [1, rows, in]: rows of in features */
            } else if (kind == 2) {
                node(md, CK_OP_MATMUL, "x,W", "y");
            } else {
                static const int64_t perm[] = {1, 0};
                struct ck_model_node *tr = node(md, CK_OP_TRANSPOSE, "W", "Wt");
                assert_int_equal(ck_model_node_set_ints(tr, perm, 2), 0);
                node(md, CK_OP_MATMUL, "x,Wt", "y");
            }
            io(md, true, "y", 3, od);
            struct ck_infer *e = NULL;
            assert_int_equal(ck_infer_new(md, NULL, &e), 0);
            /* packed unless padding its columns to 32 would more than
             * double it (out 1 and 7) */
            int64_t pf = ck_infer_pgemm_packb_floats(in, out);
            uint64_t packed = ck_infer_pgemm_available() && pf <= 2 * in * out
                                  ? (uint64_t)pf * sizeof(float)
                                  : 0;
            /* the packed copy replaces the converted one */
            assert_int_equal(ck_infer_weight_bytes(e),
                             packed ? packed : (uint64_t)(in * out) * sizeof(float));
            assert_int_equal(ck_infer_fused_nodes(e), kind == 3 && packed ? 1 : 0);
            ck_infer_free(e);
            float *y1 = run_threads(md, 1, 3, xd, x, (uint64_t)(rows * out));
            float *y4 = run_threads(md, 4, 3, xd, x, (uint64_t)(rows * out));
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < out; j++) {
                    double want = kind < 2 ? bias[j] : 0, mag = fabs(want);
                    for (int64_t p = 0; p < in; p++) {
                        double wv = wt ? w[j * in + p] : w[p * out + j];
                        want += (double)x[i * in + p] * wv;
                        mag += fabs((double)x[i * in + p] * wv);
                    }
                    double got = y1[i * out + j];
                    if (fabs(got - want) > 1e-5 * mag + 1e-30)
                        fail_msg("%s %lldx%lldx%lld: y[%lld, %lld] = %.9g, want %.9g",
                                 kind == 3 ? "matmul W^T" : kind == 2 ? "matmul"
                                                        : kind ? "dense [out, in]" : "dense",
                                 (long long)rows, (long long)out, (long long)in, (long long)i,
                                 (long long)j, got, want);
                }
            assert_memory_equal(y1, y4, sizeof(float) * (size_t)(rows * out));
            free(y1);
            free(y4);
            ck_model_free(md);
            free(w);
            free(bias);
            free(x);
        }
}

/* A packed weight replaces the engine's own copy of it: a float16 W [2, 32]
 * (converted to an owned copy of 64 floats at load) read by one dense layer
 * is freed once packed (one panel of 32 columns, 2 k: 64 floats); read by
 * two, each has its packed copy and the converted one stays. W's rows are
 * all 1 and all 2: y = [1, 2] W = 5 in every column, 10 for the two. */
static void packed_weight_replaces_its_copy(void **state)
{
    (void)state;
    uint16_t f16[64];
    float want[32], want2[32];
    for (int j = 0; j < 32; j++) {
        f16[j] = 0x3C00;      /* 1 */
        f16[32 + j] = 0x4000; /* 2 */
        want[j] = 5;
        want2[j] = 10;
    }
    static const float x[] = {1, 2};
    bool packs = ck_infer_pgemm_available();
    for (int shared = 0; shared < 2; shared++) {
        struct ck_model *m = model_new();
        int64_t wd[] = {2, 32}, od[] = {1, 32};
        weight_typed(m, "W", CK_DT_F16, 2, wd, f16, sizeof f16);
        io(m, false, "x", 2, (int64_t[]){-1, 2});
        node(m, CK_OP_DENSE, "x,W", shared ? "h" : "y");
        if (shared) {
            node(m, CK_OP_DENSE, "x,W", "h2");
            node(m, CK_OP_ADD, "h,h2", "y");
        }
        io(m, true, "y", 2, od);
        struct ck_infer *e = NULL;
        assert_int_equal(ck_infer_new(m, NULL, &e), 0);
        uint64_t want_bytes = !packs ? 64 : shared ? 64 + 2 * 64 : 64;
        assert_int_equal(ck_infer_weight_bytes(e), want_bytes * sizeof(float));
        ck_infer_free(e);
        run_check(m, false, 2, d12, x, 2, od, shared ? want2 : want);
        ck_model_free(m);
    }
}

/* The packed product reading a convolution's input image (no im2col
 * matrix) gives the bits of the same product over the im2col matrix built
 * here by its definition: strides, padding past the kernel, dilation, 1x1
 * at stride 2, rows narrower and wider than a 32-column tile, several
 * images side by side, and images further apart than their channels (a
 * group of a grouped convolution). */
static void pgemm_reads_the_image(void **state)
{
    (void)state;
    if (!ck_infer_pgemm_available()) {
        print_message("no AVX-512F: the packed products are not used on this CPU\n");
        skip();
    }
    /* c h w kh kw sy sx py px dy dx images extra_channels m */
    static const int64_t cs[][14] = {
        {3, 9, 11, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 13}, {2, 40, 37, 3, 3, 2, 2, 1, 1, 1, 1, 1, 0, 8},
        {4, 7, 5, 5, 3, 1, 3, 4, 2, 1, 1, 2, 0, 9},   {5, 15, 9, 1, 1, 2, 2, 0, 0, 1, 1, 3, 0, 7},
        {3, 20, 21, 3, 3, 1, 1, 2, 2, 2, 2, 1, 2, 17}, {30, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 4, 5, 16},
        {1, 3, 2, 7, 7, 1, 1, 3, 3, 1, 1, 2, 1, 3},   {2, 50, 3, 3, 1, 1, 1, 0, 0, 1, 1, 1, 0, 24},
    };
    uint32_t seed = 3;
    for (size_t t = 0; t < sizeof cs / sizeof cs[0]; t++) {
        const int64_t *q = cs[t];
        int64_t c = q[0], h = q[1], w = q[2], kh = q[3], kw = q[4], sy = q[5], sx = q[6];
        int64_t py = q[7], px = q[8], dy = q[9], dx = q[10], imgs = q[11], m = q[13];
        int64_t img = (c + q[12]) * h * w; /* floats between images */
        int64_t oh = (h + 2 * py - dy * (kh - 1) - 1) / sy + 1;
        int64_t ow = (w + 2 * px - dx * (kw - 1) - 1) / sx + 1;
        int64_t k = c * kh * kw, n = imgs * oh * ow;
        float *x = malloc(sizeof(float) * (size_t)(imgs * img));
        float *a = malloc(sizeof(float) * (size_t)(m * k));
        float *col = malloc(sizeof(float) * (size_t)(k * n));
        float *ap = malloc(sizeof(float) * (size_t)ck_infer_pgemm_pack_floats(m, k));
        float *want = malloc(sizeof(float) * (size_t)(m * n));
        float *got = malloc(sizeof(float) * (size_t)(m * n));
        assert_true(x && a && col && ap && want && got);
        for (int64_t i = 0; i < imgs * img; i++)
            x[i] = (float)((int)(lcg(&seed) % 2001) - 1000) / 1000.0f;
        for (int64_t i = 0; i < m * k; i++)
            a[i] = (float)((int)(lcg(&seed) % 2001) - 1000) / 1000.0f;
        for (int64_t ci = 0; ci < c; ci++)
            for (int64_t ki = 0; ki < kh; ki++)
                for (int64_t kj = 0; kj < kw; kj++)
                    for (int64_t b = 0; b < imgs; b++)
                        for (int64_t oy = 0; oy < oh; oy++)
                            for (int64_t ox = 0; ox < ow; ox++) {
                                int64_t iy = oy * sy - py + ki * dy, ix = ox * sx - px + kj * dx;
                                col[((ci * kh + ki) * kw + kj) * n + (b * oh + oy) * ow + ox] =
                                    iy < 0 || iy >= h || ix < 0 || ix >= w
                                        ? 0.0f
                                        : x[b * img + (ci * h + iy) * w + ix];
                            }
        ck_infer_pgemm_pack(m, k, a, k, ap);
        struct ck_pgemm_src mat = {.b = col, .ldb = n};
        struct ck_pgemm_src im = {.x = x, .c = c, .h = h, .w = w, .kh = kh, .kw = kw, .sy = sy,
                                  .sx = sx, .py = py, .px = px, .dy = dy, .dx = dx, .oh = oh,
                                  .ow = ow, .img_stride = img};
        ck_infer_pgemm(ap, m, k, &mat, want, n, 0, m, 0, n);
        for (int64_t i = 0; i < m * n; i++)
            got[i] = -7.0f;
        /* in two column parts, the second starting inside an output row */
        int64_t cut = n > 37 ? 37 : n / 2;
        ck_infer_pgemm(ap, m, k, &im, got, n, 0, m, 0, cut);
        ck_infer_pgemm(ap, m, k, &im, got, n, 0, m, cut, n);
        for (int64_t i = 0; i < m * n; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                fail_msg("case %zu: C[%lld, %lld] = %.9g from the image, %.9g from im2col", t,
                         (long long)(i / n), (long long)(i % n), (double)got[i],
                         (double)want[i]);
        free(x);
        free(a);
        free(col);
        free(ap);
        free(want);
        free(got);
    }
}

/* Softmax along contiguous rows (the AVX-512 path where the CPU has it)
 * against e^(x - max) / sum in double, at lengths around the 16-value
 * vectors: values over a wide range, rows with -inf entries (an attention
 * mask; within 1e-30 of 0), with a NaN (the whole row NaN, as the sum is),
 * and a row of equal values (exactly 1 / len). Within 4e-6
 * relative: x - max is rounded to float32 first (e^-40 moves by 2e-6). */
static void softmax_rows_against_double(void **state)
{
    (void)state;
    static const int64_t lens[] = {1, 2, 15, 16, 17, 31, 33, 128, 1000};
    uint32_t seed = 5;
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++) {
        int64_t len = lens[t], d[] = {4, len};
        float *x = malloc(sizeof(float) * (size_t)(4 * len));
        float *want = malloc(sizeof(float) * (size_t)(4 * len));
        assert_true(x && want);
        for (int64_t i = 0; i < len; i++) {
            x[i] = (float)((double)lcg(&seed) / (1 << 24) * 60.0 - 30.0);
            x[len + i] = i % 5 == 1 ? -INFINITY : (float)(i % 7) - 3.0f;
            x[2 * len + i] = 0.25f;
            x[3 * len + i] = i == len / 2 && len > 1 ? NAN : (float)(i % 3);
        }
        for (int r = 0; r < 4; r++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t i = 0; i < len; i++)
                mx = x[r * len + i] > mx ? x[r * len + i] : mx;
            for (int64_t i = 0; i < len; i++)
                sum += exp((double)x[r * len + i] - mx);
            for (int64_t i = 0; i < len; i++)
                want[r * len + i] = (float)(exp((double)x[r * len + i] - mx) / sum);
        }
        struct ck_model_node *n;
        struct ck_model *m = unary(CK_OP_SOFTMAX, 2, d, &n);
        io(m, true, "y", 2, d);
        struct ck_infer *e = NULL;
        struct ck_infer_array in, *out = NULL;
        size_t nout = 0;
        assert_int_equal(ck_infer_new(m, NULL, &e), 0);
        assert_int_equal(ck_infer_array_init(&in, "x", 2, d), 0);
        memcpy(in.data, x, sizeof(float) * (size_t)(4 * len));
        assert_int_equal(ck_infer_run(e, &in, 1, &out, &nout), 0);
        for (int64_t i = 0; i < 4 * len; i++) {
            float got = out[0].data[i], w = want[i];
            bool ok = isnan(w) ? isnan(got) : fabsf(got - w) <= 4e-6f * fabsf(w) + 1e-30f;
            if (!ok)
                fail_msg("len %lld, row %lld, value %lld: got %.9g, want %.9g", (long long)len,
                         (long long)(i / len), (long long)(i % len), (double)got, (double)w);
        }
        if (len == 16)
            assert_true(out[0].data[2 * len] == 1.0f / 16);
        ck_infer_arrays_free(out, nout);
        ck_infer_array_release(&in);
        ck_infer_free(e);
        ck_model_free(m);
        free(x);
        free(want);
    }
}

/* ck_infer_sigmoid_inplace (16 at a time with AVX-512F) gives the bits of
 * the scalar expression, for every length's tail, on values across expf's
 * clamps, signed zeros, infinities and NaN. */
static void sigmoid_vector_same_bits(void **state)
{
    (void)state;
    enum { N = 70003 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    assert_non_null(x);
    assert_non_null(y);
    uint32_t seed = 11;
    for (int i = 0; i < N; i++) {
        uint32_t r = lcg(&seed);
        x[i] = i % 3 ? (float)((double)r / (1 << 24) * 240.0 - 120.0)
                     : (float)((double)r / (1 << 24) * 20.0 - 10.0);
    }
    float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.3762626647949f, 88.38f, -87.34f,
                       -87.3365447505531f, 1e-30f, -1e-30f, 100.0f, -104.0f};
    memcpy(x + 5, special, sizeof special);
    for (int silu = 0; silu < 2; silu++)
        for (int64_t n = N; n >= N - 17; n--) {
            memcpy(y, x, sizeof(float) * N);
            ck_infer_sigmoid_inplace(y, n, silu);
            for (int64_t i = 0; i < N; i++) {
                float s = 1.0f / (1.0f + ck_infer_expf(-x[i]));
                float want = i >= n ? x[i] : silu ? x[i] * s : s;
                if (memcmp(&want, &y[i], sizeof want) != 0 && !(isnan(want) && isnan(y[i])))
                    fail_msg("%s(%.9g) at %lld of %lld: %.9g, the scalar code %.9g",
                             silu ? "silu" : "sigmoid", (double)x[i], (long long)i, (long long)n,
                             (double)y[i], (double)want);
            }
        }
    free(x);
    free(y);
}

/* Shape values (docs/model.md): x [-1, 6] reshaped to [B, 3, 2] with B read
 * from x's shape by the plan, at the batch of each run. */
static struct ck_model *dyn_reshape(const float *tail, size_t ntail)
{
    struct ck_model *m = model_new();
    weight(m, "zero", 0, NULL, (float[]){0});
    weight(m, "tail", 1, (int64_t[]){(int64_t)ntail}, tail);
    io(m, false, "x", 2, (int64_t[]){-1, 6});
    node(m, CK_OP_SHAPE, "x", "s");
    node(m, CK_OP_GATHER, "s,zero", "b");
    struct ck_model_node *n = node(m, CK_OP_UNSQUEEZE, "b", "bv");
    assert_int_equal(ck_model_node_set_ints(n, (int64_t[]){0}, 1), 0);
    node(m, CK_OP_CONCAT, "bv,tail", "shape");
    node(m, CK_OP_RESHAPE, "x,shape", "y");
    io(m, true, "y", 3, (int64_t[]){-1, 3, 2});
    return m;
}

static void shape_values_follow_the_batch(void **state)
{
    float x[18];
    for (int i = 0; i < 18; i++)
        x[i] = (float)i;
    struct ck_model *m = dyn_reshape((float[]){3, 2}, 2);
    run_check(m, false, 2, (int64_t[]){1, 6}, x, 3, (int64_t[]){1, 3, 2}, x);
    run_check(m, false, 2, (int64_t[]){3, 6}, x, 3, (int64_t[]){3, 3, 2}, x);
    ck_model_free(m);
    /* integer arithmetic on shapes: div truncates (B = 3: 3 / 2 is 1, not
     * 1.5), a range of positions, cast to float32 data: y = [0, 1 ... B - 1] * (B / 2) */
    m = model_new();
    weight(m, "zero", 0, NULL, (float[]){0});
    weight(m, "one", 0, NULL, (float[]){1});
    io(m, false, "x", 2, (int64_t[]){-1, 2});
    node(m, CK_OP_SHAPE, "x", "s");
    node(m, CK_OP_GATHER, "s,zero", "b");
    struct ck_model_node *n = node(m, CK_OP_DIV, "b", "half");
    n->p.has_scalar = true;
    n->p.scalar = 2;
    node(m, CK_OP_RANGE, "zero,b,one", "pos");
    node(m, CK_OP_MUL, "pos,half", "scaled");
    n = node(m, CK_OP_CAST, "scaled", "y"); /* to float32: ONNX's code 1 */
    assert_int_equal(ck_model_node_set_ints(n, (int64_t[]){1}, 1), 0);
    io(m, true, "y", 1, (int64_t[]){-1});
    run_check(m, false, 2, (int64_t[]){3, 2}, x, 1, (int64_t[]){3}, (float[]){0, 1, 2});
    run_check(m, false, 2, (int64_t[]){5, 2}, x, 1, (int64_t[]){5}, (float[]){0, 2, 4, 6, 8});
    ck_model_free(m);
    /* computed slice bounds: x[:, 0:B] of x [-1, 8], and size */
    m = model_new();
    weight(m, "zero", 1, (int64_t[]){1}, (float[]){0});
    weight(m, "ax", 1, (int64_t[]){1}, (float[]){1});
    io(m, false, "x", 2, (int64_t[]){-1, 8});
    node(m, CK_OP_SHAPE, "x", "s");
    n = node(m, CK_OP_SLICE, "s", "b"); /* s[0:1] */
    assert_int_equal(ck_model_node_set_ints(n, (int64_t[]){0, 1, 1}, 3), 0);
    node(m, CK_OP_SLICE, "x,zero,b,ax", "y");
    io(m, true, "y", 2, (int64_t[]){-1, -1});
    run_check(m, false, 2, (int64_t[]){2, 8}, x, 2, (int64_t[]){2, 2},
              (float[]){0, 1, 8, 9});
    ck_model_free(m);
    /* a float32 weight expanded to [B, 2] by a computed shape (ViT's class
     * token) stays float32: the shape's int64 is a parameter, not the data
     * (the dtype was once taken from it and the add refused 0.5 as no integer) */
    m = model_new();
    weight(m, "zero", 0, NULL, (float[]){0});
    weight(m, "two", 1, (int64_t[]){1}, (float[]){2});
    weight(m, "tok", 2, (int64_t[]){1, 2}, (float[]){0.5f, 1.25f});
    io(m, false, "x", 2, (int64_t[]){-1, 2});
    node(m, CK_OP_SHAPE, "x", "s");
    node(m, CK_OP_GATHER, "s,zero", "b");
    n = node(m, CK_OP_UNSQUEEZE, "b", "bv");
    assert_int_equal(ck_model_node_set_ints(n, (int64_t[]){0}, 1), 0);
    node(m, CK_OP_CONCAT, "bv,two", "shape");
    node(m, CK_OP_EXPAND, "tok,shape", "toks");
    node(m, CK_OP_ADD, "toks,toks", "twice");
    node(m, CK_OP_ADD, "twice,x", "y");
    io(m, true, "y", 2, (int64_t[]){-1, 2});
    run_check(m, false, 2, (int64_t[]){2, 2}, x, 2, (int64_t[]){2, 2},
              (float[]){1.0f, 3.5f, 3.0f, 5.5f});
    ck_model_free(m);
}

static void run_fails(const struct ck_model *m, int rank, const int64_t *dims, const char *want1,
                      const char *want2)
{
    struct ck_infer *e = NULL;
    struct ck_infer_array in, *out = NULL;
    size_t nout = 0;
    assert_int_equal(ck_infer_new(m, NULL, &e), 0);
    assert_int_equal(ck_infer_array_init(&in, "x", rank, dims), 0);
    assert_int_equal(ck_infer_run(e, &in, 1, &out, &nout), CK_EFORMAT);
    if (!strstr(ck_error_msg(), want1) || !strstr(ck_error_msg(), want2))
        fail_msg("error '%s' does not say '%s' and '%s'", ck_error_msg(), want1, want2);
    assert_null(out);
    ck_infer_array_release(&in);
    ck_infer_free(e);
}

static void shape_values_refuse_hostile(void **state)
{
    const int64_t b2[] = {2, 6};
    /* a computed negative dim, a product that does not match */
    struct ck_model *m = dyn_reshape((float[]){-5}, 1);
    run_fails(m, 2, b2, "node 'y' (reshape)", "dimension -5");
    ck_model_free(m);
    m = dyn_reshape((float[]){4}, 1);
    run_fails(m, 2, b2, "node 'y' (reshape)", "has 12 elements");
    ck_model_free(m);
    /* a huge computed dim: refused by the shape rules, nothing allocated */
    m = dyn_reshape((float[]){1099511627776.0f, 1099511627776.0f}, 2);
    run_fails(m, 2, b2, "node 'y' (reshape)", "too large");
    ck_model_free(m);
    /* a shape computed from tensor values */
    m = model_new();
    weight(m, "w", 1, (int64_t[]){2}, (float[]){3, 4});
    io(m, false, "x", 2, (int64_t[]){-1, 6});
    node(m, CK_OP_RELU, "w", "r");
    node(m, CK_OP_RESHAPE, "x,r", "y");
    io(m, true, "y", 2, (int64_t[]){-1, -1});
    run_fails(m, 2, (int64_t[]){2, 6}, "node 'y' (reshape)", "input 'r' depends on tensor values");
    ck_model_free(m);
    /* a computed slice with starts and no ends (fuzz_graph: read past the
     * operands; an archive's node is not checked as ONNX's reader checks) */
    m = model_new();
    io(m, false, "x", 2, (int64_t[]){-1, 6});
    node(m, CK_OP_SHAPE, "x", "s");
    node(m, CK_OP_SLICE, "x,s", "y");
    io(m, true, "y", 2, (int64_t[]){-1, -1});
    run_fails(m, 2, b2, "node 'y' (slice)", "1 inputs after the data");
    ck_model_free(m);
    /* division by zero, a huge range, a huge constant_of_shape */
    for (int k = 0; k < 3; k++) {
        static const char *const want[][2] = {{"node 'q' (div)", "division by zero"},
                                               {"node 'r' (range)", "over the"},
                                               {"node 'r' (constant_of_shape)", "too large"}};
        m = model_new();
        weight(m, "zero", 0, NULL, (float[]){0});
        weight(m, "one", 0, NULL, (float[]){1});
        weight(m, "big", 0, NULL, (float[]){1073741824.0f});
        io(m, false, "x", 2, (int64_t[]){-1, 6});
        node(m, CK_OP_SIZE, "x", "n");
        node(m, k ? CK_OP_MUL : CK_OP_DIV, k ? "n,big" : "n,zero", "q");
        if (k == 1)
            node(m, CK_OP_RANGE, "zero,q,one", "r");
        if (k == 2) {
            struct ck_model_node *u = node(m, CK_OP_UNSQUEEZE, "q", "qv");
            assert_int_equal(ck_model_node_set_ints(u, (int64_t[]){0}, 1), 0);
            node(m, CK_OP_CONCAT, "qv,qv", "dims");
            node(m, CK_OP_CONSTANT_OF_SHAPE, "dims", "r");
        }
        io(m, true, k ? "r" : "q", k ? 1 : 0, (int64_t[]){-1});
        run_fails(m, 2, b2, want[k][0], want[k][1]);
        ck_model_free(m);
    }
}

/* One engine at changing batches: each run plans its shape values again on
 * top of the buffers kept from the run before (both plans compose); a run
 * whose kept buffers would pass the memory limit frees and plans them again
 * and keeps the shape values it computed. */
static void shape_values_between_kept_runs(void **state)
{
    struct ck_model *m = model_new();
    weight(m, "zero", 0, NULL, (float[]){0});
    weight(m, "tail", 1, (int64_t[]){2}, (float[]){3, 2});
    io(m, false, "x", 2, (int64_t[]){-1, 6});
    node(m, CK_OP_SHAPE, "x", "s");
    node(m, CK_OP_GATHER, "s,zero", "b");
    struct ck_model_node *n = node(m, CK_OP_UNSQUEEZE, "b", "bv");
    assert_int_equal(ck_model_node_set_ints(n, (int64_t[]){0}, 1), 0);
    node(m, CK_OP_CONCAT, "bv,tail", "shape");
    node(m, CK_OP_RESHAPE, "x,shape", "r");
    node(m, CK_OP_RELU, "r", "y");
    io(m, true, "y", 3, (int64_t[]){-1, 3, 2});
    struct ck_infer *e = NULL;
    struct ck_infer_array in, *out = NULL;
    size_t nout = 0;
    /* what batch 1 needs, from an engine of its own */
    assert_int_equal(ck_infer_new(m, NULL, &e), 0);
    assert_int_equal(ck_infer_array_init(&in, "x", 2, (int64_t[]){1, 6}), 0);
    assert_int_equal(ck_infer_run(e, &in, 1, &out, &nout), 0);
    uint64_t act1 = ck_infer_peak_activation_bytes(e), need1 = act1 + ck_infer_weight_bytes(e);
    assert_true(act1 > 0);
    ck_infer_arrays_free(out, nout);
    ck_infer_array_release(&in);
    ck_infer_free(e);
    assert_int_equal(ck_infer_new(m, NULL, &e), 0);
    static const int64_t batches[] = {1, 3, 3, 4, 1};
    for (size_t k = 0; k < sizeof batches / sizeof *batches; k++) {
        int64_t d[] = {batches[k], 6};
        if (k == 4) /* the batch-4 buffers kept would pass it: freed, planned again */
            e->o.max_memory = need1;
        assert_int_equal(ck_infer_array_init(&in, "x", 2, d), 0);
        for (uint64_t i = 0; i < ck_infer_array_numel(&in); i++)
            in.data[i] = (float)((int64_t)((i * 5 + k * 3) % 9) - 4) * (float)(k + 1);
        if (ck_infer_run(e, &in, 1, &out, &nout) < 0)
            fail_msg("run %zu (batch %lld): %s", k, (long long)batches[k], ck_error_msg());
        assert_int_equal(out[0].rank, 3);
        assert_int_equal(out[0].dims[0], batches[k]);
        assert_int_equal(out[0].dims[1], 3);
        assert_int_equal(out[0].dims[2], 2);
        for (uint64_t i = 0; i < ck_infer_array_numel(&in); i++)
            assert_true(out[0].data[i] == (in.data[i] < 0 ? 0.0f : in.data[i]));
        ck_infer_arrays_free(out, nout);
        ck_infer_array_release(&in);
    }
    assert_int_equal(ck_infer_peak_activation_bytes(e), act1);
    ck_infer_free(e);
    ck_model_free(m);
}

/* A cast of shape values takes dtype's parameter (ONNX's code): to an
 * integer type or bool it stays exact integers, to float16 it is rounded
 * (2049 to 2048, nearest even); past a narrow type's range it is an error
 * naming the node. y = cast(size(x)) or cast(shape(x)). */
static struct ck_model *shape_cast(enum ck_op op, int64_t code)
{
    struct ck_model *m = model_new();
    io(m, false, "x", 2, (int64_t[]){-1, -1});
    node(m, op, "x", "s");
    struct ck_model_node *n = node(m, CK_OP_CAST, "s", "y");
    assert_int_equal(ck_model_node_set_ints(n, &code, 1), 0);
    io(m, true, "y", op == CK_OP_SIZE ? 0 : 1, (int64_t[]){2});
    return m;
}

static void shape_value_casts_follow_the_dtype(void **state)
{
    static float x[2 * 2049];
    struct ck_model *m = shape_cast(CK_OP_SIZE, 10); /* float16 */
    run_check(m, false, 2, (int64_t[]){1, 2049}, x, 0, NULL, (float[]){2048});
    run_check(m, false, 2, (int64_t[]){1, 2050}, x, 0, NULL, (float[]){2050});
    ck_model_free(m);
    m = shape_cast(CK_OP_SHAPE, 9); /* bool */
    run_check(m, false, 2, (int64_t[]){3, 0}, x, 1, (int64_t[]){2}, (float[]){1, 0});
    ck_model_free(m);
    m = shape_cast(CK_OP_SHAPE, 3); /* int8 */
    run_check(m, false, 2, (int64_t[]){127, 2}, x, 1, (int64_t[]){2}, (float[]){127, 2});
    run_fails(m, 2, (int64_t[]){128, 2}, "node 'y' (cast)", "128 is out of the range of int8");
    ck_model_free(m);
    m = shape_cast(CK_OP_SHAPE, 7); /* int64 */
    run_check(m, false, 2, (int64_t[]){128, 2}, x, 1, (int64_t[]){2}, (float[]){128, 2});
    ck_model_free(m);
}

static void plan_reuses_dead_buffers(void **state)
{
    /* ten relus over 1000 values: two buffers of 1000 floats, not ten */
    const int64_t d[] = {1, 1000};
    struct ck_model *m = relu_chain(10, d);
    struct ck_infer *e = NULL;
    struct ck_infer_array in, *out = NULL;
    size_t nout = 0;
    assert_int_equal(ck_infer_new(m, NULL, &e), 0);
    assert_int_equal(ck_infer_array_init(&in, "x", 2, d), 0);
    assert_int_equal(ck_infer_run(e, &in, 1, &out, &nout), 0);
    assert_int_equal(ck_infer_peak_activation_bytes(e), 2 * 1000 * sizeof(float));
    assert_int_equal(ck_infer_weight_bytes(e), 0);
    ck_infer_arrays_free(out, nout);
    /* the limit is checked before anything is allocated */
    ck_infer_free(e);
    struct ck_infer_options o = {.max_memory = 4000};
    assert_int_equal(ck_infer_new(m, &o, &e), 0);
    assert_int_equal(ck_infer_run(e, &in, 1, &out, &nout), CK_ENOMEM);
    assert_non_null(strstr(ck_error_msg(), "over the limit"));
    ck_infer_array_release(&in);
    ck_infer_free(e);
    ck_model_free(m);
}

/* A 1x1 convolution of x [1,1,1,2] = [1, 2] by W = [2, 3] (no bias), then
 * a batch norm: gamma [1, 2], beta [0.5, -1], mean [1, 0], var [3, 0],
 * eps 1, so s = gamma / sqrt(var + eps) = [0.5, 2]:
 *   conv: c0 = [2, 4], c1 = [3, 6]
 *   bn:   c0 = ([2, 4] - 1) 0.5 + 0.5 = [1, 2], c1 = [3, 6] 2 - 1 = [5, 11]
 * When also_add, y = conv + bn reads the convolution's output too, so the
 * batch norm must not be folded: y = [3, 6, 8, 17]. */
static struct ck_model *conv_bn_model(bool also_add, bool f16)
{
    static const float w[] = {2, 3}, gamma[] = {1, 2}, beta[] = {0.5f, -1}, mean[] = {1, 0},
                       var[] = {3, 0};
    const int64_t xd[] = {1, 1, 1, 2}, wd[] = {2, 1, 1, 1}, cd[] = {2}, yd[] = {1, 2, 1, 2};
    static const uint16_t w16[] = {0x4000, 0x4200}; /* 2, 3 */
    struct ck_model *m = model_new();
    if (f16)
        weight_typed(m, "W", CK_DT_F16, 4, wd, w16, sizeof w16);
    else
        weight(m, "W", 4, wd, w);
    weight(m, "gamma", 1, cd, gamma);
    weight(m, "beta", 1, cd, beta);
    weight(m, "mean", 1, cd, mean);
    weight(m, "var", 1, cd, var);
    io(m, false, "x", 4, xd);
    struct ck_model_node *c = node(m, CK_OP_CONV2D, "x,W", "c");
    c->p.kernel[0] = c->p.kernel[1] = 1;
    node(m, CK_OP_BATCHNORM, "c,gamma,beta,mean,var", "bn")->p.eps = 1;
    if (also_add)
        node(m, CK_OP_ADD, "c,bn", "y");
    io(m, true, also_add ? "y" : "bn", 4, yd);
    return m;
}

static void batchnorm_folds_into_its_convolution(void **state)
{
    static const float x[] = {1, 2}, folded[] = {1, 2, 5, 11}, added[] = {3, 6, 8, 17};
    const int64_t xd[] = {1, 1, 1, 2}, yd[] = {1, 2, 1, 2};
    for (int also_add = 0; also_add < 2; also_add++) {
        struct ck_model *m = conv_bn_model(also_add, false);
        struct ck_infer *e = NULL;
        assert_int_equal(ck_infer_new(m, NULL, &e), 0);
        /* folded only when the batch norm is the convolution's one reader */
        assert_int_equal(ck_infer_fused_nodes(e), also_add ? 0 : 1);
        ck_infer_free(e);
        run_check(m, false, 4, xd, x, 4, yd, also_add ? added : folded);
        ck_model_free(m);
    }
    /* a float16 W is converted to an owned copy at load: the fold's copy
     * (W and the bias, 4 floats) replaces it rather than adding to it;
     * where the CPU runs pgemm.c, W is packed too: 2 output channels of
     * one weight each, one panel of 8 rows (zeros past the 2), and the
     * folded W (2 floats), read by nothing else, freed once packed */
    struct ck_model *m = conv_bn_model(false, true);
    struct ck_infer *e = NULL;
    assert_int_equal(ck_infer_new(m, NULL, &e), 0);
    assert_int_equal(ck_infer_weight_bytes(e),
                     (ck_infer_pgemm_available() ? 2 + 8 : 4) * sizeof(float));
    ck_infer_free(e);
    run_check(m, false, 4, xd, x, 4, yd, folded);
    ck_model_free(m);
}

/* dense x [1, 2] = [1, -2] by the identity: h = [1, -2], then act; with
 * shared, the activation's input (or silu's sigmoid) is a graph output too,
 * so nothing may be folded. */
static void act_case(enum ck_op op, bool silu, bool shared, size_t fused, const float *want)
{
    static const float eye[] = {1, 0, 0, 1}, x[] = {1, -2};
    const int64_t wd[] = {2, 2};
    struct ck_model *m = model_new();
    weight(m, "W", 2, wd, eye);
    io(m, false, "x", 2, d12);
    node(m, CK_OP_DENSE, "x,W", "h");
    if (silu) {
        node(m, CK_OP_SIGMOID, "h", "s");
        node(m, CK_OP_MUL, "s,h", "y"); /* the sigmoid first: either order is silu */
    } else {
        struct ck_model_node *n = node(m, op, "h", "y");
        n->p.min = -1.5f;
        n->p.max = 0.5f;
    }
    io(m, true, "y", 2, d12);
    if (shared)
        io(m, true, silu ? "s" : "h", 2, d12);
    struct ck_infer *e = NULL;
    assert_int_equal(ck_infer_new(m, NULL, &e), 0);
    assert_int_equal(ck_infer_fused_nodes(e), fused);
    ck_infer_free(e);
    if (!shared)
        run_check(m, false, 2, d12, x, 2, d12, want);
    ck_model_free(m);
}

static void activations_fold_into_the_producer(void **state)
{
    /* relu [1, 0]; clip to [-1.5, 0.5]: [0.5, -1.5]; sigmoid 1 / (1 + e^-h):
     * [0.7310586, 0.1192029]; silu h sigmoid(h): [0.7310586, -0.2384058];
     * gelu 0.5 h (1 + erf(h / sqrt 2)): [0.8413447, -0.0455003] */
    act_case(CK_OP_RELU, false, false, 1, (float[]){1, 0});
    act_case(CK_OP_CLIP, false, false, 1, (float[]){0.5f, -1.5f});
    act_case(CK_OP_SIGMOID, false, false, 1, (float[]){0.7310586f, 0.1192029f});
    act_case(CK_OP_MUL, true, false, 2, (float[]){0.7310586f, -0.2384058f});
    act_case(CK_OP_GELU, false, false, 1, (float[]){0.8413447f, -0.0455003f});
    act_case(CK_OP_RELU, false, true, 0, NULL);
    act_case(CK_OP_MUL, true, true, 0, NULL);
}

static int spin(void *arg, int fd)
{
    for (volatile unsigned long i = 0;; i++)
        ;
    return 0;
}

static int crash(void *arg, int fd)
{
    raise(SIGSEGV);
    return 0;
}

static int fail_enomem(void *arg, int fd)
{
    return ck_error(CK_ENOMEM, "no room for layer 'big'");
}

static int answer(void *arg, int fd)
{
    return write(fd, "hello", 5) == 5 ? 0 : CK_EIO;
}

static void sandbox_reports_by_name(void **state)
{
    struct ck_sandbox_limits lim = {.timeout = 1};
    enum ck_sandbox_status st;
    unsigned char *buf;
    uint64_t len;
    assert_int_equal(ck_sandbox_call(answer, NULL, &lim, 100, &buf, &len, &st, NULL), 0);
    assert_int_equal(st, CK_SANDBOX_OK);
    assert_memory_equal(buf, "hello", 5);
    assert_int_equal(len, 5);
    free(buf);
    assert_true(ck_sandbox_call(spin, NULL, &lim, 100, &buf, &len, &st, NULL) < 0);
    assert_int_equal(st, CK_SANDBOX_TIMEOUT);
    assert_non_null(strstr(ck_error_msg(), "timeout"));
    assert_true(ck_sandbox_call(crash, NULL, &lim, 100, &buf, &len, &st, NULL) < 0);
    assert_int_equal(st, CK_SANDBOX_CRASHED);
    assert_true(ck_sandbox_call(fail_enomem, NULL, &lim, 100, &buf, &len, &st, NULL) < 0);
    assert_int_equal(st, CK_SANDBOX_MEMORY);
    assert_non_null(strstr(ck_error_msg(), "no room for layer 'big'"));
}

static void sandboxed_run_matches(void **state)
{
    /* x @ W with W = [[1,2,3],[4,5,6]]: [9, 12, 15] through the child */
    struct ck_model *m = model_new();
    weight(m, "W", 2, (int64_t[]){2, 3}, (float[]){1, 2, 3, 4, 5, 6});
    io(m, false, "x", 2, d12);
    node(m, CK_OP_DENSE, "x,W", "y");
    io(m, true, "y", 2, (int64_t[]){1, 3});
    struct ck_infer_array in, *out = NULL;
    size_t nout = 0;
    enum ck_sandbox_status st;
    struct ck_infer_stats stats;
    struct ck_sandbox_limits lim = {.timeout = 10, .max_memory = UINT64_C(4) << 30};
    assert_int_equal(ck_infer_array_init(&in, "x", 2, d12), 0);
    in.data[0] = 1;
    in.data[1] = 2;
    assert_int_equal(ck_infer_run_sandboxed(m, NULL, &lim, &in, 1, 3, &out, &nout, &st, &stats), 0);
    assert_int_equal(st, CK_SANDBOX_OK);
    assert_int_equal(nout, 1);
    assert_string_equal(out[0].name, "y");
    assert_int_equal(out[0].dims[1], 3);
    assert_true(out[0].data[0] == 9 && out[0].data[1] == 12 && out[0].data[2] == 15);
    assert_int_equal(stats.runs, 3);
    assert_true(stats.min_s >= 0 && stats.median_s >= stats.min_s && stats.median_cpu_s >= 0);
    assert_int_equal(stats.peak_activation_bytes, 3 * sizeof(float));
    assert_true(stats.child_max_rss > 0);
    ck_infer_arrays_free(out, nout);
    /* a memory limit the plan already exceeds: reported as memory */
    struct ck_infer_options o = {.max_memory = 8};
    assert_true(ck_infer_run_sandboxed(m, &o, &lim, &in, 1, 1, &out, &nout, &st, NULL) < 0);
    assert_int_equal(st, CK_SANDBOX_MEMORY);
    ck_infer_array_release(&in);
    ck_model_free(m);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(dense_both_layouts),
    cmocka_unit_test(dense_converts_f16_bf16_int8),
    cmocka_unit_test(conv2d_stride_pad_dilation_groups),
    cmocka_unit_test(pooling),
    cmocka_unit_test(activations),
    cmocka_unit_test(tanh_matches_libm_everywhere),
    cmocka_unit_test(softmax_on_an_axis),
    cmocka_unit_test(binary_broadcast_and_scalar),
    cmocka_unit_test(matmul_batch_broadcast),
    cmocka_unit_test(layout_ops),
    cmocka_unit_test(norms_and_reductions),
    cmocka_unit_test(errors_name_the_node),
    cmocka_unit_test(plan_reuses_dead_buffers),
    cmocka_unit_test(plan_keeps_buffers_between_runs),
    cmocka_unit_test(expf_within_two_ulp),
    cmocka_unit_test(pgemm_matches_a_double_reference),
    cmocka_unit_test(pgemm_reads_the_image),
    cmocka_unit_test(pgemm_dense_matches_a_double_reference),
    cmocka_unit_test(dense_packed_against_naive),
    cmocka_unit_test(packed_weight_replaces_its_copy),
    cmocka_unit_test(sigmoid_vector_same_bits),
    cmocka_unit_test(erf_within_four_ulp_of_libm),
    cmocka_unit_test(erf_vector_same_bits),
    cmocka_unit_test(softmax_rows_against_double),
    cmocka_unit_test(shape_values_follow_the_batch),
    cmocka_unit_test(shape_values_refuse_hostile),
    cmocka_unit_test(shape_values_between_kept_runs),
    cmocka_unit_test(shape_value_casts_follow_the_dtype),
    cmocka_unit_test(batchnorm_folds_into_its_convolution),
    cmocka_unit_test(activations_fold_into_the_producer),
    cmocka_unit_test(sandbox_reports_by_name),
    cmocka_unit_test(sandboxed_run_matches),
};

CK_TEST_MAIN(tests)
