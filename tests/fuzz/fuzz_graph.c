/* libFuzzer: the canonical model and the CPU engine on hostile graphs, of
 * every op, whatever format they came from: the input is decoded into graph
 * inputs (shapes, some of them huge), small weights, and a chain of nodes
 * whose ops, wiring and parameters (kernels, strides, pads, axes, shapes,
 * permutations, scalars) come from the bytes. The structural check, the
 * canonical shape rules and the engine (its shape inference, plan and
 * kernels, under a 64 MiB limit) must each refuse what they cannot run with
 * an error: never read or write out of bounds, never overflow. A graph
 * whose shapes infer is also lowered for the SameDiff writer
 * (writers/sdlower.h: grouped convolutions, pools, where, pad, expand, the
 * unrolled rnn, gru and lstm, a dynamic export's shape ops), which refuses
 * or lowers, nothing else; what it lowers is written as graph.fb and read
 * back by the SameDiff reader. */
#include "fuzz_common.h"
#include "model/model.h"
#include "writers/sdgraph.h"
#include "writers/sdlower.h"

struct bytes {
    const uint8_t *p;
    size_t n;
};

static uint8_t u8(struct bytes *b)
{
    if (!b->n)
        return 0;
    b->n--;
    return *b->p++;
}

/* Mostly small values, sometimes any 64-bit value (the hostile case). */
static int64_t i64(struct bytes *b)
{
    uint8_t k = u8(b);
    if (k < 0xf0)
        return (int8_t)k;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | u8(b);
    return (int64_t)v;
}

static float f32(struct bytes *b)
{
    uint8_t k = u8(b);
    if (k < 0xf8)
        return (float)(int8_t)k / 16.0f;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v = v << 8 | u8(b);
    float f;
    memcpy(&f, &v, 4);
    return f;
}

static float wdata[4096];

static int add_weight(struct ck_tensor_set *s, const char *name, struct bytes *b)
{
    struct ck_tensor t;
    uint64_t n = 1;
    memset(&t, 0, sizeof t);
    t.name = (char *)name;
    t.dtype = CK_DT_F32;
    t.rank = u8(b) % 5;
    for (int d = 0; d < t.rank; d++)
        n *= (uint64_t)(t.dims[d] = u8(b) % 7);
    if (n > sizeof wdata / sizeof *wdata)
        return 0;
    t.nbytes = n * 4;
    t.data = (const unsigned char *)wdata;
    return ck_tensor_set_add(s, &t, NULL);
}

/* A graph the lowering takes, written as graph.fb (the dtypes declared,
 * the nodes' arguments and inputs) and read back by ckptd's SameDiff
 * reader: the weights are declared there without their arrays (a tag keeps
 * those in params/), so a graph with weights reads back without them. */
static void write_and_read(const struct ck_model *m)
{
    struct ck_sdgraph_weight *w = calloc(m->weights->ntensors + 1, sizeof *w);
    struct ck_fbb b;
    if (!w)
        return;
    for (size_t i = 0; i < m->weights->ntensors; i++)
        w[i] = (struct ck_sdgraph_weight){&m->weights->tensors[i], m->weights->tensors[i].dtype, 0};
    ck_fbb_init(&b);
    if (ck_sdgraph_build(&b, m, w, m->weights->ntensors, "fuzz") == 0) {
        char path[600];
        snprintf(path, sizeof path, "%s/graph.fb", ck_fuzz_dir());
        ck_fuzz_write(path, b.p, b.len);
        ck_fuzz_open(path, "samediff");
        unlink(path);
    }
    ck_fbb_release(&b);
    free(w);
    ck_error_clear();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct bytes b = {data, size};
    char names[64][16];
    size_t nvalues = 0;
    struct ck_model *m = NULL;
    struct ck_tensor_set *s = ck_tensor_set_new("fuzz", "fuzz.graph");
    if (!s)
        abort();
    if (!wdata[1])
        for (size_t i = 0; i < sizeof wdata / sizeof *wdata; i++)
            wdata[i] = (float)((i * 7919) % 13) / 8.0f - 0.75f;
    size_t nw = u8(&b) % 5;
    for (size_t i = 0; i < nw; i++) {
        snprintf(names[nvalues], sizeof names[0], "w%zu", i);
        if (add_weight(s, names[nvalues], &b) < 0) {
            ck_tensor_set_free(s);
            ck_error_clear();
            return 0;
        }
        nvalues++;
    }
    if (ck_model_new(s, "fuzz", &m) < 0)
        goto out; /* s freed by ck_model_new */
    size_t nin = 1 + u8(&b) % 2;
    for (size_t i = 0; i < nin; i++) {
        int64_t dims[CK_TENSOR_MAX_RANK];
        /* the rank byte's higher values pick an integer, float16 or bool
         * input (the engine's dtype paths: casts, integer kernels) */
        static const enum ck_dtype dts[] = {CK_DT_F32, CK_DT_I64, CK_DT_U8, CK_DT_F16, CK_DT_BOOL,
                                            CK_DT_I32, CK_DT_F64};
        uint8_t rb = u8(&b);
        int rank = rb % 5;
        enum ck_dtype dt = dts[(rb / 5) % (sizeof dts / sizeof dts[0])];
        for (int d = 0; d < rank; d++) {
            int64_t v = i64(&b);
            dims[d] = v >= -1 && v < 9 ? (v ? v : 1) : v; /* -1: any batch */
        }
        snprintf(names[nvalues], sizeof names[0], "x%zu", i);
        if (ck_model_add_io(m, false, names[nvalues], dt, rank, dims) < 0)
            goto out;
        nvalues++;
    }
    size_t nnodes = 1 + u8(&b) % 12;
    const char *last = NULL;
    for (size_t k = 0; k < nnodes && nvalues < 60; k++) {
        struct ck_model_node *n = NULL;
        enum ck_op op = (enum ck_op)(1 + u8(&b) % (CK_OP_COUNT - 1));
        char nm[16];
        snprintf(nm, sizeof nm, "n%zu", k);
        if (ck_model_add_node(m, nm, op, &n) < 0)
            goto out;
        size_t ni = u8(&b) % 6;
        for (size_t i = 0; i < ni; i++)
            if (ck_model_node_add_input(n, names[u8(&b) % nvalues]) < 0)
                goto out;
        size_t no = op == CK_OP_SPLIT || op == CK_OP_TOPK ? 1 + u8(&b) % 3 : 1;
        for (size_t i = 0; i < no && nvalues < 64; i++) {
            snprintf(names[nvalues], sizeof names[0], "v%zu", nvalues);
            if (ck_model_node_add_output(n, names[nvalues]) < 0)
                goto out;
            last = names[nvalues++];
        }
        struct ck_op_params *p = &n->p;
        for (int i = 0; i < 2; i++) {
            p->kernel[i] = i64(&b);
            p->stride[i] = i64(&b);
            p->dilation[i] = i64(&b);
        }
        for (int i = 0; i < 4; i++)
            p->pad[i] = i64(&b);
        uint8_t flags = u8(&b);
        p->groups = flags & 1 ? i64(&b) : 1;
        p->axis = flags & 2 ? i64(&b) : CK_AXIS_DEFAULT;
        p->trans_w = flags & 4;
        p->ceil_mode = flags & 8;
        p->count_include_pad = flags & 16;
        p->keepdims = flags & 32;
        p->approx_tanh = flags & 64;
        p->has_scalar = flags & 128;
        flags = u8(&b);
        p->scalar_first = flags & 1;
        p->scalar = f32(&b);
        p->alpha = f32(&b);
        p->eps = f32(&b);
        p->min = f32(&b);
        p->max = f32(&b);
        int64_t ints[12];
        size_t nints = u8(&b) % 13;
        for (size_t i = 0; i < nints; i++)
            ints[i] = i64(&b);
        if (nints && ck_model_node_set_ints(n, ints, nints) < 0)
            goto out;
    }
    if (!last || ck_model_add_io(m, true, last, CK_DT_F32, 0, NULL) < 0)
        goto out;
    if (ck_model_check(m) == 0) {
        struct ck_model_shapes sh;
        if (ck_model_infer_shapes(m, &sh) == 0) {
            struct ck_sdlower low;
            ck_model_shapes_release(&sh);
            if (ck_sdlower_build(m, "fuzz", &low) == 0) {
                ck_sdlower_release(&low);
                write_and_read(m);
            }
            ck_error_clear();
        }
        ck_fuzz_run_model(m);
    }
out:
    ck_model_free(m);
    ck_error_clear();
    return 0;
}
