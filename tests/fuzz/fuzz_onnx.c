/* libFuzzer: the ONNX reader and its mapping into the canonical model (op
 * table, shape propagation, constant folding). */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600];
    struct ck_model *m = NULL;
    snprintf(path, sizeof path, "%s/input.onnx", ck_fuzz_dir());
    ck_fuzz_write(path, data, size);
    ck_fuzz_open(path, "onnx");
    (void)ck_reader_open_model(path, "onnx", NULL, &m);
    ck_model_free(m);
    ck_error_clear();
    unlink(path);
    return 0;
}
