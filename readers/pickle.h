/* A restricted unpickler for PyTorch state dicts: it knows only the binary
 * opcodes (protocols 2 to 5) and the globals a torch.save of tensors,
 * dicts, OrderedDicts, lists, tuples, sets (as lists), strings, numbers and
 * torch.Size (a tuple of ints) needs, and builds
 * a tree of plain values from them. Nothing is called or imported: a
 * global is a name compared with a fixed list, and any other name (os.system,
 * builtins.eval, a user's class) is refused with an error naming it, before
 * anything else happens. This is what torch.load(weights_only=True) allows.
 *
 * Limits (hostile input): the value stack, the mark stack (nesting), the
 * memo and every length are bounded and checked against the bytes that are
 * left; a truncated stream is an error naming the offset.
 *
 * Ownership: values live in the ck_pk they were loaded into and die with
 * it; strings point into the caller's pickle bytes (borrowed: keep them
 * alive as long as the ck_pk). */
#ifndef CK_PICKLE_H
#define CK_PICKLE_H

#include "model/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ck_pk_kind {
    CK_PK_NONE,
    CK_PK_BOOL,
    CK_PK_INT,
    CK_PK_FLOAT,
    CK_PK_STR,     /* UTF-8 text (s, n), not NUL-terminated */
    CK_PK_BYTES,   /* (s, n) */
    CK_PK_TUPLE,   /* items[0..n) */
    CK_PK_LIST,    /* items[0..n) */
    CK_PK_DICT,    /* items[0..2n): key, value, key, value ... in insertion order */
    CK_PK_GLOBAL,  /* one of the allowed globals (g, dtype) */
    CK_PK_STORAGE, /* a persistent id ('storage', type, key, location, numel) */
    CK_PK_TENSOR,  /* torch._utils._rebuild_tensor_v2(...) (tensor) */
    CK_PK_MARK,    /* internal: a MARK on the value stack */
};

enum ck_pk_global {
    CK_PKG_ORDERED_DICT,
    CK_PKG_REBUILD_TENSOR_V2,
    CK_PKG_REBUILD_PARAMETER,
    CK_PKG_REBUILD_PARAMETER_WITH_STATE,
    CK_PKG_STORAGE, /* torch.FloatStorage, ... (dtype) */
    CK_PKG_SIZE,    /* torch.Size((d0, d1, ...)): becomes the tuple of ints (DeepSpeed's param_shapes) */
    CK_PKG_SET,     /* set([items]) (protocol 2's __builtin__.set): becomes the list */
};

struct ck_pk_val;

struct ck_pk_tensor {
    const struct ck_pk_val *storage; /* a CK_PK_STORAGE value */
    int64_t offset;                  /* in elements */
    int rank;
    int64_t size[CK_TENSOR_MAX_RANK];
    int64_t stride[CK_TENSOR_MAX_RANK]; /* in elements */
    bool parameter;                     /* went through _rebuild_parameter */
};

struct ck_pk_val {
    enum ck_pk_kind kind;
    bool b;
    int64_t i;
    double f;
    const char *s; /* STR, BYTES; STORAGE: the key */
    size_t n;      /* STR, BYTES, STORAGE key: bytes; TUPLE, LIST: items; DICT: pairs */
    struct ck_pk_val **items;
    size_t cap;
    enum ck_pk_global g;    /* GLOBAL */
    enum ck_dtype dtype;    /* GLOBAL storage type, STORAGE */
    uint64_t numel;         /* STORAGE: elements the persistent id claims */
    struct ck_pk_tensor *t; /* TENSOR: owned by the ck_pk */
    struct ck_pk_val *next; /* the ck_pk's list of every value */
};

struct ck_pk;

#define CK_PK_STACK_MAX (1u << 20)
#define CK_PK_MARKS_MAX 256u
#define CK_PK_MEMO_MAX (1u << 20)

/* Runs the pickle in data[0..len) and returns its result in *root (owned by
 * *out, which the caller frees with ck_pk_free, also after a failure).
 * name is the member's name for messages ("'x.pt': archive/data.pkl: ..."). */
int ck_pk_load(const char *file, const char *name, const unsigned char *data, size_t len,
               struct ck_pk **out, const struct ck_pk_val **root);
void ck_pk_free(struct ck_pk *pk);

#endif
