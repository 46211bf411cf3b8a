/* mldef -r: runs the model of an .mldef on test data (docs/mldef.md 5). */
#ifndef CK_CMD_MLDEF_RUN_H
#define CK_CMD_MLDEF_RUN_H

#include <stdbool.h>

struct ck_mldef_run_opts {
    const char *testdata; /* a file or "-" for stdin */
    const char *file;     /* output file (written atomically) or NULL: stdout */
    bool csv_in, csv_out; /* csv (one sample per line) or raw float32 little-endian */
    bool verbose;         /* per-layer timing and totals on stderr */
};

/* 0, or a negative error naming the archive, the test data and the problem. */
int ck_mldef_run(const char *archive, const struct ck_mldef_run_opts *o);

#endif
