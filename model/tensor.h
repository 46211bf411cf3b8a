/* The in-memory model of a checkpoint: named tensors with dtype, shape and
 * data, format metadata, and the network graph where the format has one.
 *
 * Ownership: a ck_tensor_set owns everything reachable from it (names, dims,
 * strings, graph) and the memory its tensors' data points into: file
 * mappings and owned blocks registered with ck_tensor_set_map_file/_alloc.
 * Large files are mapped, not read, so a 20 GiB checkpoint costs little
 * resident memory. */
#ifndef CK_TENSOR_H
#define CK_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ck_dtype {
    CK_DT_INVALID = 0,
    CK_DT_BOOL,
    CK_DT_I8, CK_DT_I16, CK_DT_I32, CK_DT_I64,
    CK_DT_U8, CK_DT_U16, CK_DT_U32, CK_DT_U64,
    CK_DT_F16, CK_DT_BF16, CK_DT_F32, CK_DT_F64,
    CK_DT_F8_E4M3, CK_DT_F8_E5M2,
    CK_DT_C64, CK_DT_C128,       /* complex: two f32 / two f64 */
    CK_DT_QI8, CK_DT_QU8, CK_DT_QI16, CK_DT_QU16, CK_DT_QI32, /* TF quantized */
    CK_DT_STRING,                /* variable-length byte strings, see ck_tensor.strings */
    CK_DT_COUNT
};

/* "float32", "int64", "string", ... (numpy-style names). */
const char *ck_dtype_name(enum ck_dtype t);
/* Element size in bytes; 0 for CK_DT_STRING and CK_DT_INVALID. */
size_t ck_dtype_size(enum ck_dtype t);
enum ck_dtype ck_dtype_from_name(const char *name);

struct ck_bytes {
    const unsigned char *p; /* borrowed from the set */
    uint64_t len;
};

#define CK_TENSOR_MAX_RANK 64

struct ck_tensor {
    char *name;                 /* owned by the set; UTF-8 */
    enum ck_dtype dtype;
    int rank;                   /* 0 for a scalar */
    int64_t dims[CK_TENSOR_MAX_RANK];
    uint64_t nbytes;            /* bytes of element data (for strings: sum of lengths) */
    const unsigned char *data;  /* element bytes, C order; NULL when not available
                                   (e.g. a TF index whose data shards are missing) */
    bool big_endian;            /* elements stored big-endian (DL4J writes them so) */
    bool fortran_order;         /* elements stored in Fortran order (numpy) */
    struct ck_bytes *strings;   /* CK_DT_STRING: numel entries, owned by the set */
    bool has_crc32c;            /* the file stores a masked-or-plain CRC32C of the data */
    uint32_t crc32c;            /* that CRC32C (unmasked) */
    const unsigned char *raw;   /* the stored bytes the file's checksum covers when they are
                                   not data (TF string tensors: lengths, length checksum,
                                   bytes; npz: the whole .npy member); borrowed from the set;
                                   NULL otherwise */
    uint64_t rawlen;
    bool has_crc32;             /* the file stores an IEEE CRC-32 of raw (a stored zip member) */
    uint32_t crc32;
    const char *role;           /* static string or NULL: "parameter", "constant", "buffer", ... */
};

struct ck_kv {
    char *key;   /* owned */
    char *value; /* owned */
};

struct ck_graph_node {
    char *name;   /* owned */
    char *op;     /* owned: the operation's type name ("Convolution", "pad") */
    char **inputs;  size_t ninputs;   /* owned: tensor names */
    char **outputs; size_t noutputs;  /* owned: tensor names */
    struct ck_kv *attrs; size_t nattrs; /* owned: attributes as text */
};

struct ck_graph {
    char *name;                         /* owned or NULL */
    char **inputs;  size_t ninputs;     /* owned: graph input tensor names */
    char **outputs; size_t noutputs;    /* owned: graph output tensor names */
    struct ck_graph_node *nodes; size_t nnodes;
    struct ck_kv *attrs; size_t nattrs; /* owned: e.g. batch_size */
};

struct ck_region; /* a mapping or an owned block, released with the set */

struct ck_tensor_set {
    const char *format;         /* static: the reader's name */
    char *path;                 /* owned */
    struct ck_tensor *tensors;  /* owned array */
    size_t ntensors, cap;
    struct ck_kv *meta; size_t nmeta; /* owned: format metadata, in file order */
    struct ck_graph *graph;     /* owned or NULL */
    struct ck_region *regions;  /* owned list */
};

/* A new empty set (format is a static string). NULL on out of memory. */
struct ck_tensor_set *ck_tensor_set_new(const char *format, const char *path);
void ck_tensor_set_free(struct ck_tensor_set *s);
/* Appends a copy of *t (its name is copied; data/strings stay borrowed from
 * the set's regions). *out, when not NULL, points at the stored tensor
 * (valid until the next add). */
int ck_tensor_set_add(struct ck_tensor_set *s, const struct ck_tensor *t, struct ck_tensor **out);
int ck_tensor_set_add_meta(struct ck_tensor_set *s, const char *key, const char *value);
/* Maps path read-only for the life of the set. An empty file maps to a
 * non-NULL zero-length region. A file truncated while it is mapped faults
 * (SIGBUS) when a page past its new end is read: see ck_tensor_guarded. */
int ck_tensor_set_map_file(struct ck_tensor_set *s, const char *path, const unsigned char **base,
                           uint64_t *len);
/* The set's first mapping (the file its reader opened, mapped before anything
 * else); CK_ENOENT when it maps nothing. */
int ck_tensor_set_first_mapping(const struct ck_tensor_set *s, const unsigned char **base,
                                uint64_t *len);
/* An owned, zeroed block of size bytes for the life of the set. Sizes over
 * CK_TENSOR_ALLOC_MAX are CK_ESIZE; callers check a size a file claims against
 * what the file can really hold (its size, a compression ratio) before asking. */
#define CK_TENSOR_ALLOC_MAX (UINT64_C(16) << 30)
int ck_tensor_set_alloc(struct ck_tensor_set *s, uint64_t size, void **out);
/* Runs fn(arg) so that a read of a mapped file that was truncated meanwhile
 * returns CK_ECHANGED ("'PATH' was truncated while it was being read")
 * instead of killing the process. What fn was building when the fault came
 * is abandoned where it stood (not freed): end the operation and report the
 * error. Outside it such a fault keeps SIGBUS's default action. Nests; per
 * thread. */
int ck_tensor_guarded(int (*fn)(void *arg), void *arg);
/* Tells the kernel the caller is done with [p, p+len) of a file mapping of
 * the set, so a pass over a 20 GiB file does not keep 20 GiB resident (the
 * page cache keeps the pages; touching them again faults them back). A no-op
 * for owned blocks and for memory the set does not hold. */
void ck_tensor_set_drop_pages(const struct ck_tensor_set *s, const void *p, uint64_t len);
/* The same for [p, p+len) the caller knows lies in a file mapping, without
 * searching the set's regions (a set of 70k members has 70k of them). */
void ck_tensor_drop_range(const void *p, uint64_t len);
/* Copies a string into the set's memory. */
char *ck_tensor_set_strdup(struct ck_tensor_set *s, const char *p, size_t len);
struct ck_tensor *ck_tensor_set_find(const struct ck_tensor_set *s, const char *name);
/* CK_EFORMAT naming the file and the tensor when two tensors share a name
 * (sorts a copy of the names: O(n log n), for sets of any size). */
int ck_tensor_set_check_unique(const struct ck_tensor_set *s);

/* Number of elements; CK_ESIZE when dims are negative or the product overflows. */
int ck_tensor_numel(const struct ck_tensor *t, uint64_t *out);
/* Checks numel * dtype size == nbytes (not for strings). */
int ck_tensor_check_size(const struct ck_tensor *t, const char *file);
/* Element i (counted in C order, also for a Fortran-order tensor) as a double,
 * for any numeric dtype and byte order; the real part of a complex; the raw
 * integer of a quantized type. NaN for strings, a tensor without data, or i
 * past the end. */
double ck_tensor_get_f64(const struct ck_tensor *t, uint64_t i);
/* Element i as an exact integer into *out: the 64-bit integer dtypes as
 * stored (U64 above INT64_MAX refused), the others through the double of
 * ck_tensor_get_f64 when it is finite, integral and in int64's range (a
 * real past 2^63 saturates: INT64_MAX in a float tensor means "to the end").
 * CK_EFORMAT when the element is no such integer or does not exist. */
int ck_tensor_get_i64(const struct ck_tensor *t, uint64_t i, int64_t *out);
/* One element at p as a double, for any numeric dtype in either byte order
 * (the one decoder: model/convert uses it for its general path); *imag, when
 * not NULL, gets a complex's imaginary part (0 otherwise). The 64-bit
 * integers round to the nearest double. NaN for strings and unknown dtypes. */
double ck_dtype_get_f64(const unsigned char *p, enum ck_dtype dtype, bool big_endian,
                        double *imag);
/* CRC-32C of the tensor's data, read in chunks whose pages are dropped after
 * use (ck_tensor_set_drop_pages). For strings: over each string's length as
 * 8 little-endian bytes followed by its bytes. CK_ENOENT when data is NULL. */
int ck_tensor_crc32c(const struct ck_tensor_set *s, const struct ck_tensor *t, uint32_t *out);

/* The graph: allocation helpers so that readers do not hand-roll arrays. */
struct ck_graph *ck_graph_new(void);
void ck_graph_free(struct ck_graph *g);
int ck_graph_add_node(struct ck_graph *g, const char *name, const char *op,
                      struct ck_graph_node **out);
int ck_graph_node_add_input(struct ck_graph_node *n, const char *tensor);
int ck_graph_node_add_output(struct ck_graph_node *n, const char *tensor);
int ck_graph_node_add_attr(struct ck_graph_node *n, const char *key, const char *value);
int ck_graph_add_io(struct ck_graph *g, bool output, const char *tensor);

/* How many inputs and outputs an op of a source format takes, as its
 * reader's op table declares it; a hi of 0 means any number. */
struct ck_arity {
    uint16_t in_lo, in_hi, out_lo, out_hi;
};

/* The one check of a source node's input and output counts, made before a
 * mapping reads any of them: CK_EFORMAT naming the file, the node and its op
 * when a count is outside a, or when one of the first in_lo inputs (the
 * required ones) has an empty name (ONNX's "absent"). After it, a mapping
 * may read inputs[0..in_lo) and outputs[0..out_lo). */
int ck_graph_node_check_arity(const struct ck_graph_node *n, const struct ck_arity *a,
                              const char *path);
int ck_graph_add_attr(struct ck_graph *g, const char *key, const char *value);

/* IEEE half and bfloat16 to float. */
float ck_f16_to_f32(uint16_t h);
float ck_bf16_to_f32(uint16_t h);

#endif
