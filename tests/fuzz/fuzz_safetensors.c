/* libFuzzer: the safetensors reader. */
#include "fuzz_common.h"

CK_FUZZ_ONE_FILE("safetensors", ".safetensors")
