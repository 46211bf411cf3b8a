/* libFuzzer: the .npz reader (libzip underneath). */
#include "fuzz_common.h"

CK_FUZZ_ONE_FILE("npz", ".npz")
