/* libFuzzer: the NNabla .nnp reader (libzip, the text-format parser, the
 * protobuf wire decoder and libhdf5 underneath). */
#include "fuzz_common.h"

/* libhdf5 1.10 leaks internal blocks when H5Fopen fails on a corrupt file
 * (seen with a fuzzed parameter.h5); a leak inside it is not ours to fix,
 * while a crash there still stops the run. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libhdf5\n";
}

CK_FUZZ_ONE_FILE("nnp", ".nnp")
