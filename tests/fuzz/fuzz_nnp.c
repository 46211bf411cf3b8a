/* libFuzzer: the NNabla .nnp reader (libzip, the text-format parser, the
 * protobuf wire decoder, and libhdf5 in its limited child process). */
#include "fuzz_common.h"

CK_FUZZ_ONE_FILE("nnp", ".nnp")
