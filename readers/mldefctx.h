/* Private to the .mldef validator (readers/mldefcheck.c, mldeflayers.c,
 * mldefsig.c): the state of one check and the helpers its parts share. */
#ifndef CK_MLDEFCTX_H
#define CK_MLDEFCTX_H

#include "common/strset.h"
#include "model/model.h"
#include "readers/jsonin.h"
#include "readers/mldefcheck.h"
#include "readers/mldefsrc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CK_MLDEFC_MAX_VIOLATIONS 1000
#define CK_MLDEFC_MAX_CSV (UINT64_C(1) << 30)

struct ck_mldefc_df {
    const char *name, *path;
    bool ok;
    bool csv;
    int es; /* bytes per point as stored: 4, 8; csv: 8 after parsing */
    uint64_t npoints;
    const unsigned char *data; /* when loading */
};

struct ck_mldefc {
    struct ck_mldef_report *r;
    struct ck_mldef_src src;
    struct ck_tensor_set *set; /* scratch memory; the weights when loading */
    const struct ck_jin *root;
    struct ck_mldefc_df *dfs;
    size_t ndfs;
    const char **values; /* defined value names */
    size_t nvalues, capvalues;
    struct ck_strset valueset; /* the same names, for look-ups */
    const char **files; /* every file the manifest names (for the count and SIGNATURE) */
    size_t nfiles, capfiles;
    bool load;
    struct ck_model *m;
    struct ck_jin_doc *doc; /* owned: the manifest's tree */
};

struct ck_mldefc_input {
    const char *name;
    uint64_t count;
    int rank;
    int64_t dims[CK_TENSOR_MAX_RANK];
};

struct ck_mldefc_walk {
    struct ck_mldefc_input *in;
    size_t nin;
    const char **last_outputs;
    size_t nlast;
    const char **layer_names;
    size_t nlayer_names, caplayer_names;
    struct ck_strset layerset; /* the same names, for look-ups */
};

/* Records a violation of rule at where (a key path or a file name). */
void ck_mldefc_vio(struct ck_mldefc *c, const char *rule, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool ck_mldefc_push(const char ***v, size_t *n, size_t *cap, const char *s);
bool ck_mldefc_has(const char *const *v, size_t n, const char *s);
const char *ck_mldefc_str(struct ck_mldefc *c, const struct ck_jin *obj, const char *key,
                          bool required, const char *where);
bool ck_mldefc_uint(struct ck_mldefc *c, const struct ck_jin *obj, const char *key, uint64_t *out,
                    const char *where);
bool ck_mldefc_int(const struct ck_jin *v, int64_t *out);
bool ck_mldefc_num(const struct ck_jin *v, double *out);
bool ck_mldefc_shape(struct ck_mldefc *c, const struct ck_jin *obj, const char *where, int *rank,
                     int64_t *dims, bool allow_any);
uint64_t ck_mldefc_numel(int rank, const int64_t *dims, bool skip_batch, bool *overflow);
bool ck_mldefc_has_word(const char *list, const char *word);
bool ck_mldefc_file_ok(struct ck_mldefc *c, const char *path, const char *where);
int ck_mldefc_csv(struct ck_mldefc *c, const char *path, const unsigned char *p, uint64_t len,
                  double *out, uint64_t *count);
const char *ck_mldefc_ext(const char *path);
struct ck_mldefc_df *ck_mldefc_find_df(struct ck_mldefc *c, const char *name);
void ck_mldefc_layers(struct ck_mldefc *c, struct ck_mldefc_walk *w);
void ck_mldefc_node_ranges(struct ck_mldefc *c, struct ck_mldefc_walk *w);
void ck_mldefc_tests(struct ck_mldefc *c, const struct ck_mldefc_walk *w);
void ck_mldefc_signature(struct ck_mldefc *c, const struct ck_mldef_check_opts *o);

#endif
