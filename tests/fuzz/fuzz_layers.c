/* libFuzzer: a layer list (YAML) over a fixed set of weights: the parser,
 * every key's checks, the references, and the shape inference of what
 * builds, run through the CPU engine. */
#include "fuzz_common.h"
#include "model/layers.h"

static struct ck_tensor_set *weights(void)
{
    static const struct {
        const char *name;
        int rank;
        int64_t dims[4];
    } w[] = {
        {"fc1.weight", 2, {8, 12}},    {"fc1.bias", 1, {8}}, {"fc2.weight", 2, {4, 8}},
        {"c.weight", 4, {4, 2, 3, 3}}, {"c.bias", 1, {4}},   {"bn", 1, {4}},
        {"table", 2, {10, 3}},         {"scalar", 0, {0}},
    };
    static float data[512];
    struct ck_tensor_set *s = ck_tensor_set_new("safetensors", "fuzz.safetensors");
    for (size_t i = 0; s && i < sizeof w / sizeof *w; i++) {
        struct ck_tensor t;
        uint64_t n = 1;
        memset(&t, 0, sizeof t);
        t.name = (char *)w[i].name;
        t.dtype = CK_DT_F32;
        t.rank = w[i].rank;
        for (int k = 0; k < t.rank; k++)
            n *= (uint64_t)(t.dims[k] = w[i].dims[k]);
        t.data = (const unsigned char *)data;
        t.nbytes = n * 4;
        if (ck_tensor_set_add(s, &t, NULL) < 0)
            abort();
    }
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ck_model *m = NULL;
    struct ck_model_shapes sh;
    if (ck_layers_parse(weights(), "fuzz.yaml", (const char *)data, size, &m) == 0 &&
        ck_model_infer_shapes(m, &sh) == 0) {
        ck_model_shapes_release(&sh);
        ck_fuzz_run_model(m);
    }
    ck_model_free(m);
    ck_error_clear();
    return 0;
}
