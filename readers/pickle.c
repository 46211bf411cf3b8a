/* The restricted unpickler; see pickle.h. Opcode meanings are CPython's
 * Lib/pickletools.py; torch's use of them is torch/serialization.py
 * (persistent ids) and torch/_utils.py (the rebuild functions). */
#include "readers/pickle.h"

#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ck_pk {
    struct ck_pk_val *all; /* every value, for ck_pk_free */
    const char *file, *name;
    const unsigned char *p, *start, *end;
    struct ck_pk_val **stack; /* grown by doubling up to CK_PK_STACK_MAX */
    size_t sp, stack_cap;
    size_t marks[CK_PK_MARKS_MAX];
    size_t nmarks;
    struct ck_pk_val **memo;
    size_t nmemo;    /* slots allocated */
    size_t memo_len; /* slots filled: MEMOIZE's index, as len(memo) in Python */
};

/* The globals a state dict needs; every other name is refused. */
static const struct {
    const char *module, *name;
    enum ck_pk_global g;
    enum ck_dtype dtype;
} globals[] = {
    {"collections", "OrderedDict", CK_PKG_ORDERED_DICT, CK_DT_INVALID},
    {"torch", "Size", CK_PKG_SIZE, CK_DT_INVALID},
    {"__builtin__", "set", CK_PKG_SET, CK_DT_INVALID},
    {"builtins", "set", CK_PKG_SET, CK_DT_INVALID},
    {"torch._utils", "_rebuild_tensor_v2", CK_PKG_REBUILD_TENSOR_V2, CK_DT_INVALID},
    {"torch._utils", "_rebuild_parameter", CK_PKG_REBUILD_PARAMETER, CK_DT_INVALID},
    {"torch._utils", "_rebuild_parameter_with_state", CK_PKG_REBUILD_PARAMETER_WITH_STATE,
     CK_DT_INVALID},
    {"torch", "FloatStorage", CK_PKG_STORAGE, CK_DT_F32},
    {"torch", "DoubleStorage", CK_PKG_STORAGE, CK_DT_F64},
    {"torch", "HalfStorage", CK_PKG_STORAGE, CK_DT_F16},
    {"torch", "BFloat16Storage", CK_PKG_STORAGE, CK_DT_BF16},
    {"torch", "ByteStorage", CK_PKG_STORAGE, CK_DT_U8},
    {"torch", "CharStorage", CK_PKG_STORAGE, CK_DT_I8},
    {"torch", "ShortStorage", CK_PKG_STORAGE, CK_DT_I16},
    {"torch", "IntStorage", CK_PKG_STORAGE, CK_DT_I32},
    {"torch", "LongStorage", CK_PKG_STORAGE, CK_DT_I64},
    {"torch", "BoolStorage", CK_PKG_STORAGE, CK_DT_BOOL},
    {"torch", "ComplexFloatStorage", CK_PKG_STORAGE, CK_DT_C64},
    {"torch", "ComplexDoubleStorage", CK_PKG_STORAGE, CK_DT_C128},
};

static int fail(struct ck_pk *pk, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct ck_pk *pk, const char *fmt, ...)
{
    char what[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ck_error(CK_EFORMAT, "'%s': %s: %s (at byte %zu)", pk->file, pk->name, what,
                    (size_t)(pk->p - pk->start));
}

static struct ck_pk_val *new_val(struct ck_pk *pk, enum ck_pk_kind kind)
{
    struct ck_pk_val *v = calloc(1, sizeof *v);
    if (!v)
        return NULL;
    v->kind = kind;
    v->next = pk->all;
    pk->all = v;
    return v;
}

void ck_pk_free(struct ck_pk *pk)
{
    if (!pk)
        return;
    for (struct ck_pk_val *v = pk->all, *next; v; v = next) {
        next = v->next;
        free(v->items);
        free(v->t);
        free(v);
    }
    free(pk->stack);
    free(pk->memo);
    free(pk);
}

/* ---- reading the stream ---- */

static int need(struct ck_pk *pk, uint64_t n, const unsigned char **at)
{
    if (n > (uint64_t)(pk->end - pk->p))
        return fail(pk, "%s: the stream ends inside an opcode's argument", "truncated");
    *at = pk->p;
    pk->p += n;
    return 0;
}

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* A text line ending in '\n' (GLOBAL's module and name). */
static int line(struct ck_pk *pk, const char **s, size_t *n)
{
    const unsigned char *nl = memchr(pk->p, '\n', (size_t)(pk->end - pk->p));
    if (!nl)
        return fail(pk, "%s: a GLOBAL name has no end of line", "truncated");
    *s = (const char *)pk->p;
    *n = (size_t)(nl - pk->p);
    pk->p = nl + 1;
    return 0;
}

/* ---- the stack ---- */

static int push(struct ck_pk *pk, struct ck_pk_val *v)
{
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    if (pk->sp == pk->stack_cap) {
        if (pk->stack_cap == CK_PK_STACK_MAX)
            return fail(pk, "more than %s values on the stack", "1048576");
        size_t cap = pk->stack_cap ? pk->stack_cap * 2 : 256;
        struct ck_pk_val **st = realloc(pk->stack, cap * sizeof *st);
        if (!st)
            return ck_error(CK_ENOMEM, "out of memory");
        pk->stack = st;
        pk->stack_cap = cap;
    }
    pk->stack[pk->sp++] = v;
    return 0;
}

static int pop(struct ck_pk *pk, struct ck_pk_val **v)
{
    if (pk->sp == 0 || (pk->nmarks && pk->sp == pk->marks[pk->nmarks - 1]))
        return fail(pk, "%s: pop from an empty stack", "bad pickle");
    *v = pk->stack[--pk->sp];
    return 0;
}

static int top(struct ck_pk *pk, struct ck_pk_val **v)
{
    if (pk->sp == 0 || (pk->nmarks && pk->sp == pk->marks[pk->nmarks - 1]))
        return fail(pk, "%s: the stack is empty", "bad pickle");
    *v = pk->stack[pk->sp - 1];
    return 0;
}

/* The values above the last MARK: stack[*from..sp); the mark is removed. */
static int pop_mark(struct ck_pk *pk, size_t *from)
{
    if (!pk->nmarks)
        return fail(pk, "%s: no MARK", "bad pickle");
    *from = pk->marks[--pk->nmarks];
    return 0;
}

static int append_items(struct ck_pk *pk, struct ck_pk_val *c, struct ck_pk_val **v, size_t n)
{
    if (n == 0)
        return 0;
    if (n > CK_PK_STACK_MAX || c->n + n > CK_PK_STACK_MAX)
        return fail(pk, "%s", "a container over 1048576 items");
    size_t want = (c->kind == CK_PK_DICT ? 2 : 1) * c->n + n;
    if (want > c->cap) {
        size_t cap = c->cap ? c->cap : 8;
        while (cap < want)
            cap *= 2;
        struct ck_pk_val **items = realloc(c->items, cap * sizeof *items);
        if (!items)
            return ck_error(CK_ENOMEM, "out of memory");
        c->items = items;
        c->cap = cap;
    }
    memcpy(c->items + (c->kind == CK_PK_DICT ? 2 : 1) * c->n, v, n * sizeof *v);
    c->n += c->kind == CK_PK_DICT ? n / 2 : n;
    return 0;
}

static int make_seq(struct ck_pk *pk, enum ck_pk_kind kind, size_t from)
{
    struct ck_pk_val *t = new_val(pk, kind);
    int err = 0;
    if (!t)
        return ck_error(CK_ENOMEM, "out of memory");
    if (pk->sp > from && (err = append_items(pk, t, pk->stack + from, pk->sp - from)) < 0)
        return err;
    pk->sp = from;
    return push(pk, t);
}

/* ---- memo ---- */

static int memo_put(struct ck_pk *pk, uint64_t idx)
{
    struct ck_pk_val *v = NULL;
    int err = 0;
    if ((err = top(pk, &v)) < 0)
        return err;
    if (idx >= CK_PK_MEMO_MAX) {
        char n[32];
        snprintf(n, sizeof n, "%llu", (unsigned long long)idx);
        return fail(pk, "memo index %s out of range", n);
    }
    if (idx >= pk->nmemo) {
        size_t cap = idx + 1 > pk->nmemo * 2 ? idx + 1 : pk->nmemo * 2;
        struct ck_pk_val **m = realloc(pk->memo, cap * sizeof *m);
        if (!m)
            return ck_error(CK_ENOMEM, "out of memory");
        memset(m + pk->nmemo, 0, (cap - pk->nmemo) * sizeof *m);
        pk->memo = m;
        pk->nmemo = cap;
    }
    if (!pk->memo[idx])
        pk->memo_len++;
    pk->memo[idx] = v;
    return 0;
}

static int memo_get(struct ck_pk *pk, uint64_t idx)
{
    if (idx >= pk->nmemo || !pk->memo[idx]) {
        char n[32];
        snprintf(n, sizeof n, "%llu", (unsigned long long)idx);
        return fail(pk, "memo index %s was never stored", n);
    }
    return push(pk, pk->memo[idx]);
}

/* ---- globals, calls, persistent ids ---- */

/* Whether the opcodes after a refused GLOBAL make an instance of it: its
 * memo put, then EMPTY_TUPLE NEWOBJ (how protocol 2, torch.save's, pickles
 * an object: a saved nn.Module starts so). Only peeks; nothing runs. */
static bool instantiated(const struct ck_pk *pk)
{
    const unsigned char *p = pk->p, *end = pk->end;
    if (p < end && *p == 'q')
        p += 2;
    else if (p < end && *p == 'r')
        p += 5;
    else if (p < end && *p == 0x94)
        p += 1;
    return p < end && end - p >= 2 && p[0] == ')' && p[1] == 0x81;
}

static int global(struct ck_pk *pk, const char *mod, size_t ml, const char *name, size_t nl)
{
    char full[160];
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (strlen(globals[i].module) == ml && !memcmp(globals[i].module, mod, ml) &&
            strlen(globals[i].name) == nl && !memcmp(globals[i].name, name, nl)) {
            struct ck_pk_val *v = new_val(pk, CK_PK_GLOBAL);
            if (v) {
                v->g = globals[i].g;
                v->dtype = globals[i].dtype;
            }
            return push(pk, v);
        }
    /* Name it as Python would print it, control characters escaped. */
    size_t k = 0;
    for (size_t i = 0; i < ml + 1 + nl && k + 5 < sizeof full; i++) {
        unsigned char c = i < ml    ? (unsigned char)mod[i]
                          : i == ml ? '.'
                                    : (unsigned char)name[i - ml - 1];
        if (c < 0x20 || c == 0x7f || c == '\'')
            k += (size_t)snprintf(full + k, sizeof full - k, "\\x%02x", c);
        else
            full[k++] = (char)c;
    }
    full[k] = 0;
    if (instantiated(pk))
        return fail(pk,
                    "an object of class '%s' (torch.save(model) pickles the whole module, "
                    "which only its own code can load, and ckptd runs none): save "
                    "model.state_dict() instead, e.g. torch.save(model.state_dict(), PATH)",
                    full);
    return fail(pk,
                "global '%s' is not allowed (a state dict holds only tensors, dicts, lists, "
                "tuples, strings and numbers; nothing is executed)",
                full);
}

static int stack_global(struct ck_pk *pk)
{
    struct ck_pk_val *mod = NULL, *name = NULL;
    int err = 0;
    if ((err = pop(pk, &name)) < 0 || (err = pop(pk, &mod)) < 0)
        return err;
    if (mod->kind != CK_PK_STR || name->kind != CK_PK_STR)
        return fail(pk, "%s: STACK_GLOBAL of values that are not strings", "bad pickle");
    return global(pk, mod->s, mod->n, name->s, name->n);
}

static bool is_int_tuple(const struct ck_pk_val *v)
{
    if (v->kind != CK_PK_TUPLE || v->n > CK_TENSOR_MAX_RANK)
        return false;
    for (size_t i = 0; i < v->n; i++)
        if (v->items[i]->kind != CK_PK_INT || v->items[i]->i < 0)
            return false;
    return true;
}

/* _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
 * backward_hooks[, metadata]) */
static int rebuild_tensor(struct ck_pk *pk, const struct ck_pk_val *a)
{
    static const char *const fn = "torch._utils._rebuild_tensor_v2";
    if (a->n < 6 || a->n > 7)
        return fail(pk, "%s: %zu arguments, it takes 6 or 7", fn, a->n);
    if (a->items[0]->kind != CK_PK_STORAGE)
        return fail(pk, "%s: its first argument is not a storage", fn);
    if (a->items[1]->kind != CK_PK_INT || a->items[1]->i < 0)
        return fail(pk, "%s: the storage offset is not an integer of at least 0", fn);
    if (!is_int_tuple(a->items[2]) || !is_int_tuple(a->items[3]))
        return fail(pk, "%s: the size or the stride is not a tuple of at most %d integers of at "
                        "least 0",
                    fn, CK_TENSOR_MAX_RANK);
    if (a->items[2]->n != a->items[3]->n || a->items[4]->kind != CK_PK_BOOL)
        return fail(pk, "%s: the size and the stride differ in rank, or requires_grad is not a "
                        "bool",
                    fn);
    struct ck_pk_val *v = new_val(pk, CK_PK_TENSOR);
    if (!v || !(v->t = calloc(1, sizeof *v->t)))
        return ck_error(CK_ENOMEM, "out of memory");
    v->t->storage = a->items[0];
    v->t->offset = a->items[1]->i;
    v->t->rank = (int)a->items[2]->n;
    for (int d = 0; d < v->t->rank; d++) {
        v->t->size[d] = a->items[2]->items[d]->i;
        v->t->stride[d] = a->items[3]->items[d]->i;
    }
    return push(pk, v);
}

/* _rebuild_parameter(data, requires_grad, backward_hooks[, state]) */
static int rebuild_parameter(struct ck_pk *pk, const struct ck_pk_val *a, size_t nargs)
{
    if (a->n != nargs || a->items[0]->kind != CK_PK_TENSOR || a->items[1]->kind != CK_PK_BOOL)
        return fail(pk, "%s: unexpected arguments", "torch._utils._rebuild_parameter");
    struct ck_pk_val *v = new_val(pk, CK_PK_TENSOR);
    if (!v || !(v->t = malloc(sizeof *v->t)))
        return ck_error(CK_ENOMEM, "out of memory");
    *v->t = *a->items[0]->t;
    v->t->parameter = true;
    return push(pk, v);
}

/* OrderedDict() or OrderedDict([(k, v), ...]) */
static int ordered_dict(struct ck_pk *pk, const struct ck_pk_val *a)
{
    struct ck_pk_val *d = new_val(pk, CK_PK_DICT);
    int err = 0;
    if (!d)
        return ck_error(CK_ENOMEM, "out of memory");
    if (a->n > 1 || (a->n == 1 && a->items[0]->kind != CK_PK_LIST))
        return fail(pk, "%s: unexpected arguments", "collections.OrderedDict");
    for (size_t i = 0; a->n && i < a->items[0]->n; i++) {
        const struct ck_pk_val *kv = a->items[0]->items[i];
        if ((kv->kind != CK_PK_TUPLE && kv->kind != CK_PK_LIST) || kv->n != 2)
            return fail(pk, "%s: an item is not a pair", "collections.OrderedDict");
        if ((err = append_items(pk, d, kv->items, 2)) < 0)
            return err;
    }
    return push(pk, d);
}

/* torch.Size((ints...)): the tuple itself, every item an int. */
static int torch_size(struct ck_pk *pk, struct ck_pk_val *args)
{
    struct ck_pk_val *dims = args->n == 1 ? args->items[0] : NULL;
    if (!dims || dims->kind != CK_PK_TUPLE)
        return fail(pk, "%s: torch.Size of something that is not a tuple", "bad pickle");
    for (size_t i = 0; i < dims->n; i++)
        if (dims->items[i]->kind != CK_PK_INT)
            return fail(pk, "%s: torch.Size with an item that is not an int", "bad pickle");
    return push(pk, dims);
}

static int reduce(struct ck_pk *pk)
{
    struct ck_pk_val *args = NULL, *f = NULL;
    int err = 0;
    if ((err = pop(pk, &args)) < 0 || (err = pop(pk, &f)) < 0)
        return err;
    if (f->kind != CK_PK_GLOBAL || args->kind != CK_PK_TUPLE)
        return fail(pk, "%s: REDUCE of something that is not an allowed global", "bad pickle");
    switch (f->g) {
    case CK_PKG_ORDERED_DICT:
        return ordered_dict(pk, args);
    case CK_PKG_REBUILD_TENSOR_V2:
        return rebuild_tensor(pk, args);
    case CK_PKG_REBUILD_PARAMETER:
        return rebuild_parameter(pk, args, 3);
    case CK_PKG_REBUILD_PARAMETER_WITH_STATE:
        return rebuild_parameter(pk, args, 4);
    case CK_PKG_SIZE:
        return torch_size(pk, args);
    case CK_PKG_SET:
        if (args->n != 1 || args->items[0]->kind != CK_PK_LIST)
            return fail(pk, "%s: set of something that is not a list", "bad pickle");
        return push(pk, args->items[0]);
    case CK_PKG_STORAGE:
        break;
    }
    return fail(pk, "%s: a storage type is not callable", "bad pickle");
}

/* BUILD sets an object's state: an OrderedDict's (the state dict's
 * _metadata) is dropped; nothing else takes one. */
static int build(struct ck_pk *pk)
{
    struct ck_pk_val *state = NULL, *obj = NULL;
    int err = 0;
    if ((err = pop(pk, &state)) < 0 || (err = top(pk, &obj)) < 0)
        return err;
    if (obj->kind != CK_PK_DICT)
        return fail(pk, "%s: BUILD of something that is not a dict", "bad pickle");
    return 0;
}

/* ('storage', torch.XStorage, key, location, numel) */
static int persistent_id(struct ck_pk *pk)
{
    struct ck_pk_val *pid = NULL;
    int err = 0;
    if ((err = pop(pk, &pid)) < 0)
        return err;
    struct ck_pk_val **it = pid->items;
    if (pid->kind != CK_PK_TUPLE || pid->n != 5 || it[0]->kind != CK_PK_STR || it[0]->n != 7 ||
        memcmp(it[0]->s, "storage", 7) || it[1]->kind != CK_PK_GLOBAL ||
        it[1]->g != CK_PKG_STORAGE || it[2]->kind != CK_PK_STR || it[3]->kind != CK_PK_STR ||
        it[4]->kind != CK_PK_INT || it[4]->i < 0)
        return fail(pk, "%s: a persistent id that is not ('storage', type, key, location, size)",
                    "bad pickle");
    struct ck_pk_val *v = new_val(pk, CK_PK_STORAGE);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    v->dtype = it[1]->dtype;
    v->s = it[2]->s;
    v->n = it[2]->n;
    v->numel = (uint64_t)it[4]->i;
    return push(pk, v);
}

/* ---- scalars ---- */

static int push_int(struct ck_pk *pk, int64_t i)
{
    struct ck_pk_val *v = new_val(pk, CK_PK_INT);
    if (v)
        v->i = i;
    return push(pk, v);
}

static int push_bytes(struct ck_pk *pk, enum ck_pk_kind kind, int lenbytes)
{
    const unsigned char *a = NULL, *s = NULL;
    int err = 0;
    if ((err = need(pk, (uint64_t)lenbytes, &a)) < 0)
        return err;
    uint64_t n = le(a, lenbytes);
    if ((err = need(pk, n, &s)) < 0)
        return err;
    struct ck_pk_val *v = new_val(pk, kind);
    if (v) {
        v->s = (const char *)s;
        v->n = (size_t)n;
    }
    return push(pk, v);
}

/* LONG1: a little-endian two's complement integer of n bytes (n <= 8 here). */
static int push_long(struct ck_pk *pk, int lenbytes)
{
    const unsigned char *a = NULL, *b = NULL;
    int err = 0;
    if ((err = need(pk, (uint64_t)lenbytes, &a)) < 0)
        return err;
    uint64_t n = le(a, lenbytes);
    if (n > 8)
        return fail(pk, "%s: an integer over 64 bits", "unsupported");
    if ((err = need(pk, n, &b)) < 0)
        return err;
    uint64_t u = le(b, (int)n);
    if (n && n < 8 && (b[n - 1] & 0x80))
        u |= ~UINT64_C(0) << (8 * n);
    return push_int(pk, (int64_t)u);
}

static int push_float(struct ck_pk *pk)
{
    const unsigned char *a = NULL;
    int err = 0;
    if ((err = need(pk, 8, &a)) < 0)
        return err;
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u = (u << 8) | a[i]; /* big-endian */
    struct ck_pk_val *v = new_val(pk, CK_PK_FLOAT);
    if (v)
        memcpy(&v->f, &u, 8);
    return push(pk, v);
}

static int push_simple(struct ck_pk *pk, enum ck_pk_kind kind, bool b)
{
    struct ck_pk_val *v = new_val(pk, kind);
    if (v)
        v->b = b;
    return push(pk, v);
}

/* ---- the loop ---- */

static int fixed(struct ck_pk *pk, int n, uint64_t *out)
{
    const unsigned char *a = NULL;
    int err = need(pk, (uint64_t)n, &a);
    if (err == 0)
        *out = le(a, n);
    return err;
}

static int container_op(struct ck_pk *pk, unsigned char op)
{
    struct ck_pk_val *c = NULL, *k = NULL, *v = NULL;
    size_t from = 0;
    int err = 0;
    switch (op) {
    case 'a': /* APPEND */
        if ((err = pop(pk, &v)) < 0 || (err = top(pk, &c)) < 0)
            return err;
        if (c->kind != CK_PK_LIST)
            return fail(pk, "%s: APPEND to something that is not a list", "bad pickle");
        return append_items(pk, c, &v, 1);
    case 'e': /* APPENDS */
    case 'u': /* SETITEMS */
        if ((err = pop_mark(pk, &from)) < 0)
            return err;
        if (from <= (pk->nmarks ? pk->marks[pk->nmarks - 1] : 0))
            return fail(pk, "%s: nothing to add to", "bad pickle");
        c = pk->stack[from - 1];
        if (c->kind != (op == 'e' ? CK_PK_LIST : CK_PK_DICT) || (op == 'u' && (pk->sp - from) % 2))
            return fail(pk, "%s: APPENDS or SETITEMS on the wrong kind of value", "bad pickle");
        err = append_items(pk, c, pk->stack + from, pk->sp - from);
        pk->sp = from;
        return err;
    case 's': /* SETITEM */
        if ((err = pop(pk, &v)) < 0 || (err = pop(pk, &k)) < 0 || (err = top(pk, &c)) < 0)
            return err;
        if (c->kind != CK_PK_DICT)
            return fail(pk, "%s: SETITEM on something that is not a dict", "bad pickle");
        struct ck_pk_val *kv[2] = {k, v};
        return append_items(pk, c, kv, 2);
    }
    return CK_EFORMAT;
}

static int tuple_n(struct ck_pk *pk, size_t n)
{
    size_t floor = pk->nmarks ? pk->marks[pk->nmarks - 1] : 0;
    if (pk->sp - floor < n)
        return fail(pk, "%s: TUPLE of missing values", "bad pickle");
    return make_seq(pk, CK_PK_TUPLE, pk->sp - n);
}

static int step(struct ck_pk *pk, unsigned char op, bool *stop)
{
    uint64_t u = 0;
    size_t from = 0;
    struct ck_pk_val *v = NULL;
    int err = 0;
    const char *mod = NULL, *name = NULL;
    size_t ml = 0, nl = 0;
    switch (op) {
    case 0x80: /* PROTO */
        if ((err = fixed(pk, 1, &u)) < 0)
            return err;
        return u >= 2 && u <= 5 ? 0 : fail(pk, "pickle protocol %s not supported", "<2 or >5");
    case 0x95: /* FRAME: a length hint only */
        return fixed(pk, 8, &u);
    case '.':
        *stop = true;
        return 0;
    case '(':
        if (pk->nmarks == CK_PK_MARKS_MAX)
            return fail(pk, "nested deeper than %s MARKs", "256");
        pk->marks[pk->nmarks++] = pk->sp;
        return 0;
    case '0':
        return pop(pk, &v);
    case '1':
        if ((err = pop_mark(pk, &from)) == 0)
            pk->sp = from;
        return err;
    case '2':
        return (err = top(pk, &v)) < 0 ? err : push(pk, v);
    case 'N':
        return push_simple(pk, CK_PK_NONE, false);
    case 0x88:
    case 0x89:
        return push_simple(pk, CK_PK_BOOL, op == 0x88);
    case 'J':
        return (err = fixed(pk, 4, &u)) < 0 ? err : push_int(pk, (int32_t)(uint32_t)u);
    case 'K':
        return (err = fixed(pk, 1, &u)) < 0 ? err : push_int(pk, (int64_t)u);
    case 'M':
        return (err = fixed(pk, 2, &u)) < 0 ? err : push_int(pk, (int64_t)u);
    case 0x8a:
        return push_long(pk, 1);
    case 0x8b:
        return push_long(pk, 4);
    case 'G':
        return push_float(pk);
    case 'X':
    case 'T':
        return push_bytes(pk, CK_PK_STR, 4);
    case 0x8c:
    case 'U':
        return push_bytes(pk, CK_PK_STR, 1);
    case 0x8d:
        return push_bytes(pk, CK_PK_STR, 8);
    case 'C':
        return push_bytes(pk, CK_PK_BYTES, 1);
    case 'B':
        return push_bytes(pk, CK_PK_BYTES, 4);
    case 0x8e:
        return push_bytes(pk, CK_PK_BYTES, 8);
    case ')':
        return make_seq(pk, CK_PK_TUPLE, pk->sp);
    case 't':
        return (err = pop_mark(pk, &from)) < 0 ? err : make_seq(pk, CK_PK_TUPLE, from);
    case 0x85:
    case 0x86:
    case 0x87:
        return tuple_n(pk, (size_t)(op - 0x84));
    case ']':
        return make_seq(pk, CK_PK_LIST, pk->sp);
    case 'l':
        return (err = pop_mark(pk, &from)) < 0 ? err : make_seq(pk, CK_PK_LIST, from);
    case '}':
        return push_simple(pk, CK_PK_DICT, false);
    case 'd':
        if ((err = pop_mark(pk, &from)) < 0)
            return err;
        if ((pk->sp - from) % 2)
            return fail(pk, "%s: DICT of an odd number of values", "bad pickle");
        return make_seq(pk, CK_PK_DICT, from);
    case 'a':
    case 'e':
    case 's':
    case 'u':
        return container_op(pk, op);
    case 'c':
        if ((err = line(pk, &mod, &ml)) < 0 || (err = line(pk, &name, &nl)) < 0)
            return err;
        return global(pk, mod, ml, name, nl);
    case 0x93:
        return stack_global(pk);
    case 'R':
        return reduce(pk);
    case 'b':
        return build(pk);
    case 'Q':
        return persistent_id(pk);
    case 'q':
        return (err = fixed(pk, 1, &u)) < 0 ? err : memo_put(pk, u);
    case 'r':
        return (err = fixed(pk, 4, &u)) < 0 ? err : memo_put(pk, u);
    case 0x94:
        return memo_put(pk, pk->memo_len);
    case 'h':
        return (err = fixed(pk, 1, &u)) < 0 ? err : memo_get(pk, u);
    case 'j':
        return (err = fixed(pk, 4, &u)) < 0 ? err : memo_get(pk, u);
    }
    char hex[8];
    snprintf(hex, sizeof hex, "0x%02x", op);
    return fail(pk, "opcode %s is not allowed in a state dict", hex);
}

int ck_pk_load(const char *file, const char *name, const unsigned char *data, size_t len,
               struct ck_pk **out, const struct ck_pk_val **root)
{
    struct ck_pk *pk = calloc(1, sizeof *pk);
    bool stop = false;
    int err = 0;
    *out = pk;
    *root = NULL;
    if (!pk)
        return ck_error(CK_ENOMEM, "out of memory");
    pk->file = file;
    pk->name = name;
    pk->p = pk->start = data;
    pk->end = data + len;
    while (!stop) {
        if (pk->p == pk->end)
            return fail(pk, "%s: the stream ends before STOP", "truncated");
        unsigned char op = *pk->p++;
        if ((err = step(pk, op, &stop)) < 0)
            return err;
    }
    if (pk->sp != 1 || pk->nmarks)
        return fail(pk, "%s: STOP with a stack that does not hold one value", "bad pickle");
    *root = pk->stack[0];
    return 0;
}
