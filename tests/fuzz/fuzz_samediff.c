/* libFuzzer: the SameDiff reader (FlatGraph files; tagged zips when the
 * input starts like one). */
#include "fuzz_common.h"

CK_FUZZ_ONE_FILE("samediff", ".fb")
