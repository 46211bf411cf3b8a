/* libFuzzer: the .npy reader. */
#include "fuzz_common.h"

CK_FUZZ_ONE_FILE("npy", ".npy")
