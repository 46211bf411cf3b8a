/* The .mldef writer (docs/mldef.md): one row of the writers table. add()
 * lays the model's weights out in data files, writes manifest.json and
 * streams the data (converted to little-endian float32/float64 in chunks)
 * through writers/mldefzip.h. */
#ifndef CK_WRITER_MLDEF_H
#define CK_WRITER_MLDEF_H

#include "writers/writer.h"

extern const struct ck_writer_ops ck_writer_mldef;

/* A data file starts after this many bytes (so none grows without bound and
 * a model keeps under the 100-file rule up to ~24 GiB). */
#define CK_MLDEF_DATAFILE_MAX (UINT64_C(256) << 20)

#endif
