#include "model/tensor.h"
#include "model/dims.h"
#include "common/crc32c.h"
#include "common/error.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A file mapping (munmap on release) or an owned block (free). */
struct ck_region {
    struct ck_region *next;
    void *p;
    uint64_t len;
    bool mapped;
    int guard; /* mapped: its SIGBUS guard slot, or -1 */
};

/* ---- files truncated while they are mapped ----
 * Reading a page of a mapped file past its new end raises SIGBUS: the file
 * shrank under us (a job rewriting it in place, a cleanup). Inside
 * ck_tensor_guarded the handler jumps back to it, which returns CK_ECHANGED
 * naming the file; elsewhere the signal keeps its default action. The
 * library neither prints nor exits: the caller reports the error.
 * The handler reads a fixed table without locks: a slot's length and path
 * are written before its start address is published, and it is unpublished
 * before munmap. */
#define GUARD_SLOTS 64

static struct guard {
    atomic_bool used;
    _Atomic uintptr_t start; /* 0: not published */
    size_t len;
    char path[512];
} guards[GUARD_SLOTS];

/* The recovery point of this thread's ck_tensor_guarded, and the slot that faulted. */
static _Thread_local sigjmp_buf *recover;
static _Thread_local volatile int faulted = -1;

static void on_sigbus(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < GUARD_SLOTS && recover; i++) {
        uintptr_t start = atomic_load_explicit(&guards[i].start, memory_order_acquire);
        if (start && a >= start && a - start < guards[i].len) {
            faulted = i;
            siglongjmp(*recover, 1);
        }
    }
    /* not one of our mappings, or no recovery point: the default action when
     * the access is retried */
    signal(sig, SIG_DFL);
}

static void guard_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

int ck_tensor_guarded(int (*fn)(void *arg), void *arg)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    sigjmp_buf here;
    sigjmp_buf *outer = recover;
    pthread_once(&once, guard_install);
    if (sigsetjmp(here, 1)) {
        recover = outer;
        int slot = faulted;
        faulted = -1;
        return ck_error(CK_ECHANGED,
                        "'%s' was truncated while it was being read (another process changed it)",
                        slot >= 0 ? guards[slot].path : "a mapped file");
    }
    recover = &here;
    int err = fn(arg);
    recover = outer;
    return err;
}

/* Returns the slot, or -1 when all are taken (that mapping is then unguarded). */
static int guard_add(const void *p, size_t len, const char *path)
{
    for (int i = 0; i < GUARD_SLOTS; i++) {
        bool expect = false;
        if (!atomic_compare_exchange_strong(&guards[i].used, &expect, true))
            continue;
        snprintf(guards[i].path, sizeof guards[i].path, "%s", path);
        guards[i].len = len;
        atomic_store_explicit(&guards[i].start, (uintptr_t)p, memory_order_release);
        return i;
    }
    return -1;
}

static void guard_remove(int slot)
{
    if (slot < 0)
        return;
    atomic_store_explicit(&guards[slot].start, 0, memory_order_release);
    atomic_store_explicit(&guards[slot].used, false, memory_order_release);
}

/* ---- dtypes ---- */

static const struct {
    const char *name;
    size_t size;
} dtypes[CK_DT_COUNT] = {
    [CK_DT_INVALID] = {"invalid", 0},
    [CK_DT_BOOL] = {"bool", 1},
    [CK_DT_I8] = {"int8", 1},
    [CK_DT_I16] = {"int16", 2},
    [CK_DT_I32] = {"int32", 4},
    [CK_DT_I64] = {"int64", 8},
    [CK_DT_U8] = {"uint8", 1},
    [CK_DT_U16] = {"uint16", 2},
    [CK_DT_U32] = {"uint32", 4},
    [CK_DT_U64] = {"uint64", 8},
    [CK_DT_F16] = {"float16", 2},
    [CK_DT_BF16] = {"bfloat16", 2},
    [CK_DT_F32] = {"float32", 4},
    [CK_DT_F64] = {"float64", 8},
    [CK_DT_F8_E4M3] = {"float8_e4m3fn", 1},
    [CK_DT_F8_E5M2] = {"float8_e5m2", 1},
    [CK_DT_C64] = {"complex64", 8},
    [CK_DT_C128] = {"complex128", 16},
    [CK_DT_QI8] = {"qint8", 1},
    [CK_DT_QU8] = {"quint8", 1},
    [CK_DT_QI16] = {"qint16", 2},
    [CK_DT_QU16] = {"quint16", 2},
    [CK_DT_QI32] = {"qint32", 4},
    [CK_DT_STRING] = {"string", 0},
};

const char *ck_dtype_name(enum ck_dtype t)
{
    if ((unsigned)t >= CK_DT_COUNT)
        return "invalid";
    return dtypes[t].name;
}

size_t ck_dtype_size(enum ck_dtype t)
{
    if ((unsigned)t >= CK_DT_COUNT)
        return 0;
    return dtypes[t].size;
}

enum ck_dtype ck_dtype_from_name(const char *name)
{
    if (!name)
        return CK_DT_INVALID;
    for (int t = 1; t < CK_DT_COUNT; t++)
        if (!strcmp(dtypes[t].name, name))
            return (enum ck_dtype)t;
    return CK_DT_INVALID;
}

/* ---- the set ---- */

struct ck_tensor_set *ck_tensor_set_new(const char *format, const char *path)
{
    struct ck_tensor_set *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->format = format;
    if (path && !(s->path = strdup(path))) {
        free(s);
        return NULL;
    }
    return s;
}

static void kv_free(struct ck_kv *kv, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(kv[i].key);
        free(kv[i].value);
    }
    free(kv);
}

void ck_tensor_set_free(struct ck_tensor_set *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->ntensors; i++)
        free(s->tensors[i].name);
    free(s->tensors);
    kv_free(s->meta, s->nmeta);
    ck_graph_free(s->graph);
    struct ck_region *r = s->regions;
    while (r) {
        struct ck_region *next = r->next;
        if (r->mapped && r->len) {
            guard_remove(r->guard);
            munmap(r->p, r->len);
        } else if (!r->mapped) {
            free(r->p);
        }
        free(r);
        r = next;
    }
    free(s->path);
    free(s);
}

int ck_tensor_set_add(struct ck_tensor_set *s, const struct ck_tensor *t, struct ck_tensor **out)
{
    if (s->ntensors == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        if (cap > SIZE_MAX / sizeof *s->tensors)
            return ck_error(CK_ENOMEM, "'%s': too many tensors", s->path ? s->path : "");
        struct ck_tensor *n = realloc(s->tensors, cap * sizeof *n);
        if (!n)
            return ck_error(CK_ENOMEM, "'%s': out of memory", s->path ? s->path : "");
        s->tensors = n;
        s->cap = cap;
    }
    struct ck_tensor *d = &s->tensors[s->ntensors];
    *d = *t;
    if (t->rank < 0 || t->rank > CK_TENSOR_MAX_RANK)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': rank %d out of range",
                        s->path ? s->path : "", t->name ? t->name : "", t->rank);
    if (!(d->name = strdup(t->name ? t->name : "")))
        return ck_error(CK_ENOMEM, "'%s': out of memory", s->path ? s->path : "");
    s->ntensors++;
    if (out)
        *out = d;
    return 0;
}

static int kv_push(struct ck_kv **arr, size_t *n, const char *key, const char *value)
{
    if (*n >= SIZE_MAX / sizeof **arr / 2)
        return ck_error(CK_ENOMEM, "too many attributes");
    /* Grow by powers of two: capacity is implied by n. */
    if ((*n & (*n - 1)) == 0) {
        size_t cap = *n ? *n * 2 : 1;
        struct ck_kv *a = realloc(*arr, cap * sizeof *a);
        if (!a)
            return ck_error(CK_ENOMEM, "out of memory");
        *arr = a;
    }
    char *k = strdup(key ? key : ""), *v = strdup(value ? value : "");
    if (!k || !v) {
        free(k);
        free(v);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    (*arr)[*n].key = k;
    (*arr)[*n].value = v;
    (*n)++;
    return 0;
}

static int str_push(char ***arr, size_t *n, const char *s)
{
    if (*n >= SIZE_MAX / sizeof **arr / 2)
        return ck_error(CK_ENOMEM, "too many names");
    if ((*n & (*n - 1)) == 0) {
        size_t cap = *n ? *n * 2 : 1;
        char **a = realloc(*arr, cap * sizeof *a);
        if (!a)
            return ck_error(CK_ENOMEM, "out of memory");
        *arr = a;
    }
    if (!((*arr)[*n] = strdup(s ? s : "")))
        return ck_error(CK_ENOMEM, "out of memory");
    (*n)++;
    return 0;
}

int ck_tensor_set_add_meta(struct ck_tensor_set *s, const char *key, const char *value)
{
    return kv_push(&s->meta, &s->nmeta, key, value);
}

static int region_push(struct ck_tensor_set *s, void *p, uint64_t len, bool mapped)
{
    struct ck_region *r = calloc(1, sizeof *r);
    if (!r)
        return ck_error(CK_ENOMEM, "out of memory");
    r->p = p;
    r->len = len;
    r->mapped = mapped;
    r->guard = -1;
    r->next = s->regions;
    s->regions = r;
    return 0;
}

int ck_tensor_set_map_file(struct ck_tensor_set *s, const char *path, const unsigned char **base,
                           uint64_t *len)
{
    static const unsigned char empty[1];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(errno == ENOENT ? CK_ENOENT : CK_EIO, "cannot open '%s'", path);
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int err = ck_error_os(CK_EIO, "cannot stat '%s'", path);
        close(fd);
        return err;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ck_error(CK_EFORMAT, "'%s': not a regular file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return ck_error(CK_ESIZE, "'%s': too large to map", path);
    }
    void *p = (void *)empty;
    if (st.st_size > 0) {
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = ck_error_os(CK_EIO, "cannot map '%s'", path);
            close(fd);
            return err;
        }
        madvise(p, (size_t)st.st_size, MADV_SEQUENTIAL);
    }
    close(fd);
    int err = region_push(s, p, (uint64_t)st.st_size, true);
    if (err < 0) {
        if (st.st_size > 0)
            munmap(p, (size_t)st.st_size);
        return err;
    }
    if (st.st_size > 0)
        s->regions->guard = guard_add(p, (size_t)st.st_size, path);
    *base = p;
    *len = (uint64_t)st.st_size;
    return 0;
}

int ck_tensor_set_first_mapping(const struct ck_tensor_set *s, const unsigned char **base,
                                uint64_t *len)
{
    const struct ck_region *first = NULL;
    for (const struct ck_region *r = s->regions; r; r = r->next) /* newest first */
        if (r->mapped)
            first = r;
    if (!first)
        return ck_error(CK_ENOENT, "'%s': not mapped", s->path ? s->path : "");
    *base = first->p;
    *len = first->len;
    return 0;
}

int ck_tensor_set_alloc(struct ck_tensor_set *s, uint64_t size, void **out)
{
    if (size > CK_TENSOR_ALLOC_MAX || size > SIZE_MAX)
        return ck_error(CK_ESIZE, "'%s': a block of %llu bytes is over the limit",
                        s->path ? s->path : "", (unsigned long long)size);
    void *p = calloc(1, size ? (size_t)size : 1);
    if (!p)
        return ck_error(CK_ENOMEM, "'%s': cannot allocate %llu bytes", s->path ? s->path : "",
                        (unsigned long long)size);
    int err = region_push(s, p, size, false);
    if (err < 0) {
        free(p);
        return err;
    }
    *out = p;
    return 0;
}

char *ck_tensor_set_strdup(struct ck_tensor_set *s, const char *p, size_t len)
{
    void *block = NULL;
    if (len == SIZE_MAX || ck_tensor_set_alloc(s, (uint64_t)len + 1, &block) < 0)
        return NULL;
    char *d = block;
    if (len)
        memcpy(d, p, len);
    d[len] = 0;
    return d;
}

struct ck_tensor *ck_tensor_set_find(const struct ck_tensor_set *s, const char *name)
{
    for (size_t i = 0; i < s->ntensors; i++)
        if (!strcmp(s->tensors[i].name, name))
            return &s->tensors[i];
    return NULL;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int ck_tensor_set_check_unique(const struct ck_tensor_set *s)
{
    if (s->ntensors < 2)
        return 0;
    const char **v = malloc(s->ntensors * sizeof *v);
    if (!v)
        return ck_error(CK_ENOMEM, "out of memory");
    for (size_t i = 0; i < s->ntensors; i++)
        v[i] = s->tensors[i].name;
    qsort(v, s->ntensors, sizeof *v, name_cmp);
    int err = 0;
    for (size_t i = 1; i < s->ntensors && !err; i++)
        if (!strcmp(v[i - 1], v[i]))
            err = ck_error(CK_EFORMAT, "'%s': tensor '%s': two tensors of that name",
                           s->path ? s->path : "", v[i]);
    free(v);
    return err;
}

void ck_tensor_set_drop_pages(const struct ck_tensor_set *s, const void *p, uint64_t len)
{
    const unsigned char *a = p;
    for (const struct ck_region *r = s->regions; r; r = r->next) {
        const unsigned char *b = r->p;
        if (!r->mapped || !r->len || a < b || a >= b + r->len)
            continue;
        if (len > r->len - (uint64_t)(a - b))
            len = r->len - (uint64_t)(a - b);
        ck_tensor_drop_range(a, len);
        return;
    }
}

void ck_tensor_drop_range(const void *p, uint64_t len)
{
    /* Whole pages inside the range only: a neighbour may still be in use. */
    static long pg;
    if (!pg)
        pg = sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    uintptr_t hi = ((uintptr_t)p + (uintptr_t)len) & ~((uintptr_t)pg - 1);
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* ---- tensors ---- */

int ck_tensor_numel(const struct ck_tensor *t, uint64_t *out)
{
    uint64_t n = 1;
    if (t->rank < 0 || t->rank > CK_TENSOR_MAX_RANK)
        return ck_error(CK_ESIZE, "tensor '%s': rank %d out of range", t->name ? t->name : "",
                        t->rank);
    for (int i = 0; i < t->rank; i++) {
        if (t->dims[i] < 0)
            return ck_error(CK_ESIZE, "tensor '%s': negative dimension %lld",
                            t->name ? t->name : "", (long long)t->dims[i]);
        uint64_t d = (uint64_t)t->dims[i];
        if (d && n > UINT64_MAX / d)
            return ck_error(CK_ESIZE, "tensor '%s': element count overflows",
                            t->name ? t->name : "");
        n *= d;
    }
    *out = n;
    return 0;
}

int ck_tensor_check_size(const struct ck_tensor *t, const char *file)
{
    uint64_t n;
    int err;
    size_t es = ck_dtype_size(t->dtype);
    if (!es)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': dtype %s has no fixed size", file, t->name,
                        ck_dtype_name(t->dtype));
    if ((err = ck_tensor_numel(t, &n)) < 0)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': shape overflows", file, t->name);
    if (n > UINT64_MAX / es)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': byte size overflows", file, t->name);
    if (n * es != t->nbytes)
        return ck_error(CK_EFORMAT, "'%s': tensor '%s': %llu bytes, but %s x %llu elements is %llu",
                        file, t->name, (unsigned long long)t->nbytes, ck_dtype_name(t->dtype),
                        (unsigned long long)n, (unsigned long long)(n * es));
    return 0;
}

float ck_f16_to_f32(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexpf((float)(m | 0x400), e - 25);
    return (h & 0x8000) ? -v : v;
}

float ck_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float8 e4m3fn: bias 7, no infinities, S.1111.111 is NaN. */
static double f8e4m3(uint8_t b)
{
    int e = (b >> 3) & 0xf, m = b & 7;
    double v;
    if (e == 15 && m == 7)
        return NAN;
    v = e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
    return (b & 0x80) ? -v : v;
}

/* float8 e5m2: IEEE-like, bias 15, with infinities and NaNs. */
static double f8e5m2(uint8_t b)
{
    int e = (b >> 2) & 0x1f, m = b & 3;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = e ? ldexp(4 + m, e - 17) : ldexp(m, -16);
    return (b & 0x80) ? -v : v;
}

static uint64_t load(const unsigned char *p, size_t n, bool be)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)p[be ? i : n - 1 - i] << (8 * (n - 1 - i));
    return v;
}

/* The storage index of C-order element i of a Fortran-order tensor. */
static uint64_t fortran_index(const struct ck_tensor *t, uint64_t i)
{
    uint64_t off = 0, stride = 1;
    uint64_t rest = i;
    int64_t idx[CK_TENSOR_MAX_RANK];
    for (int d = t->rank - 1; d >= 0; d--) {
        uint64_t dim = (uint64_t)t->dims[d];
        idx[d] = (int64_t)(rest % dim);
        rest /= dim;
    }
    for (int d = 0; d < t->rank; d++) {
        off += (uint64_t)idx[d] * stride;
        stride *= (uint64_t)t->dims[d];
    }
    return off;
}

double ck_dtype_get_f64(const unsigned char *p, enum ck_dtype dtype, bool be, double *imag)
{
    uint64_t u;
    if (imag)
        *imag = 0;
    switch (dtype) {
    case CK_DT_BOOL:
        return p[0] ? 1.0 : 0.0;
    case CK_DT_I8:
    case CK_DT_QI8:
        return (int8_t)p[0];
    case CK_DT_U8:
    case CK_DT_QU8:
        return p[0];
    case CK_DT_I16:
    case CK_DT_QI16:
        return (int16_t)load(p, 2, be);
    case CK_DT_U16:
    case CK_DT_QU16:
        return (double)load(p, 2, be);
    case CK_DT_I32:
    case CK_DT_QI32:
        return (int32_t)load(p, 4, be);
    case CK_DT_U32:
        return (double)load(p, 4, be);
    case CK_DT_I64:
        return (double)(int64_t)load(p, 8, be);
    case CK_DT_U64:
        return (double)load(p, 8, be);
    case CK_DT_F16:
        return ck_f16_to_f32((uint16_t)load(p, 2, be));
    case CK_DT_BF16:
        return ck_bf16_to_f32((uint16_t)load(p, 2, be));
    case CK_DT_F32:
    case CK_DT_C64: {
        uint32_t w = (uint32_t)load(p, 4, be);
        float f;
        memcpy(&f, &w, 4);
        if (imag && dtype == CK_DT_C64) {
            uint32_t v = (uint32_t)load(p + 4, 4, be);
            float g;
            memcpy(&g, &v, 4);
            *imag = g;
        }
        return f;
    }
    case CK_DT_F64:
    case CK_DT_C128: {
        double d;
        u = load(p, 8, be);
        memcpy(&d, &u, 8);
        if (imag && dtype == CK_DT_C128) {
            double e;
            u = load(p + 8, 8, be);
            memcpy(&e, &u, 8);
            *imag = e;
        }
        return d;
    }
    case CK_DT_F8_E4M3:
        return f8e4m3(p[0]);
    case CK_DT_F8_E5M2:
        return f8e5m2(p[0]);
    default:
        return NAN;
    }
}

double ck_tensor_get_f64(const struct ck_tensor *t, uint64_t i)
{
    size_t es = ck_dtype_size(t->dtype);
    uint64_t n;
    if (!es || !t->data || ck_tensor_numel(t, &n) < 0 || i >= n)
        return NAN;
    if (n > t->nbytes / es)
        return NAN;
    if (t->fortran_order && t->rank > 1)
        i = fortran_index(t, i);
    return ck_dtype_get_f64(t->data + i * es, t->dtype, t->big_endian, NULL);
}

int ck_tensor_get_i64(const struct ck_tensor *t, uint64_t i, int64_t *out)
{
    size_t es = ck_dtype_size(t->dtype);
    uint64_t n;
    if ((t->dtype == CK_DT_I64 || t->dtype == CK_DT_U64) && t->data &&
        ck_tensor_numel(t, &n) == 0 && i < n && n <= t->nbytes / es) {
        if (t->fortran_order && t->rank > 1)
            i = fortran_index(t, i);
        uint64_t u = load(t->data + i * es, 8, t->big_endian);
        if (t->dtype == CK_DT_U64 && u > INT64_MAX)
            return CK_EFORMAT;
        *out = (int64_t)u;
        return 0;
    }
    double d = ck_tensor_get_f64(t, i);
    return d == floor(d) && ck_dim_from_double(d, out) ? 0 : CK_EFORMAT;
}

#define CRC_CHUNK ((uint64_t)8 << 20)

static uint32_t crc_chunked(const struct ck_tensor_set *s, uint32_t crc, const unsigned char *p,
                            uint64_t len)
{
    while (len) {
        uint64_t n = len < CRC_CHUNK ? len : CRC_CHUNK;
        crc = ck_crc32c_extend(crc, p, (size_t)n);
        if (s)
            ck_tensor_set_drop_pages(s, p, n);
        p += n;
        len -= n;
    }
    return crc;
}

int ck_tensor_crc32c(const struct ck_tensor_set *s, const struct ck_tensor *t, uint32_t *out)
{
    if (t->dtype == CK_DT_STRING) {
        uint64_t n;
        if (!t->strings)
            return ck_error(CK_ENOENT, "tensor '%s': no data", t->name);
        if (ck_tensor_numel(t, &n) < 0)
            return CK_ESIZE;
        uint32_t crc = 0;
        for (uint64_t i = 0; i < n; i++) {
            unsigned char len[8];
            for (int k = 0; k < 8; k++)
                len[k] = (unsigned char)(t->strings[i].len >> (8 * k));
            crc = ck_crc32c_extend(crc, len, 8);
            crc = crc_chunked(s, crc, t->strings[i].p, t->strings[i].len);
        }
        *out = crc;
        return 0;
    }
    if (!t->data)
        return ck_error(CK_ENOENT, "tensor '%s': no data", t->name);
    *out = crc_chunked(s, 0, t->data, t->nbytes);
    return 0;
}

/* ---- graphs ---- */

struct ck_graph *ck_graph_new(void)
{
    return calloc(1, sizeof(struct ck_graph));
}

static void strv_free(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

void ck_graph_free(struct ck_graph *g)
{
    if (!g)
        return;
    free(g->name);
    strv_free(g->inputs, g->ninputs);
    strv_free(g->outputs, g->noutputs);
    for (size_t i = 0; i < g->nnodes; i++) {
        struct ck_graph_node *n = &g->nodes[i];
        free(n->name);
        free(n->op);
        strv_free(n->inputs, n->ninputs);
        strv_free(n->outputs, n->noutputs);
        kv_free(n->attrs, n->nattrs);
    }
    free(g->nodes);
    kv_free(g->attrs, g->nattrs);
    free(g);
}

int ck_graph_add_node(struct ck_graph *g, const char *name, const char *op,
                      struct ck_graph_node **out)
{
    if (g->nnodes >= SIZE_MAX / sizeof *g->nodes / 2)
        return ck_error(CK_ENOMEM, "too many graph nodes");
    if ((g->nnodes & (g->nnodes - 1)) == 0) {
        size_t cap = g->nnodes ? g->nnodes * 2 : 1;
        struct ck_graph_node *a = realloc(g->nodes, cap * sizeof *a);
        if (!a)
            return ck_error(CK_ENOMEM, "out of memory");
        g->nodes = a;
    }
    struct ck_graph_node *n = &g->nodes[g->nnodes];
    memset(n, 0, sizeof *n);
    n->name = strdup(name ? name : "");
    n->op = strdup(op ? op : "");
    if (!n->name || !n->op) {
        free(n->name);
        free(n->op);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    g->nnodes++;
    if (out)
        *out = n;
    return 0;
}

int ck_graph_node_add_input(struct ck_graph_node *n, const char *tensor)
{
    return str_push(&n->inputs, &n->ninputs, tensor);
}

int ck_graph_node_add_output(struct ck_graph_node *n, const char *tensor)
{
    return str_push(&n->outputs, &n->noutputs, tensor);
}

int ck_graph_node_add_attr(struct ck_graph_node *n, const char *key, const char *value)
{
    return kv_push(&n->attrs, &n->nattrs, key, value);
}

static bool count_ok(size_t n, size_t lo, size_t hi)
{
    return n >= lo && (!hi || n <= hi);
}

/* "2", "2 to 3", "at least 1" */
static const char *count_text(size_t lo, size_t hi, char *buf, size_t size)
{
    if (lo == hi)
        snprintf(buf, size, "%zu", lo);
    else if (!hi)
        snprintf(buf, size, "at least %zu", lo);
    else
        snprintf(buf, size, "%zu to %zu", lo, hi);
    return buf;
}

int ck_graph_node_check_arity(const struct ck_graph_node *n, const struct ck_arity *a,
                              const char *path)
{
    char want[64];
    if (!count_ok(n->ninputs, a->in_lo, a->in_hi))
        return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): %zu inputs, the op takes %s", path,
                        n->name, n->op, n->ninputs,
                        count_text(a->in_lo, a->in_hi, want, sizeof want));
    if (!count_ok(n->noutputs, a->out_lo, a->out_hi))
        return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): %zu outputs, the op gives %s", path,
                        n->name, n->op, n->noutputs,
                        count_text(a->out_lo, a->out_hi, want, sizeof want));
    for (size_t i = 0; i < a->in_lo; i++)
        if (!n->inputs[i][0])
            return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): required input %zu is missing",
                            path, n->name, n->op, i);
    for (size_t i = 0; i < a->out_lo; i++)
        if (!n->outputs[i][0])
            return ck_error(CK_EFORMAT, "'%s': node '%s' (%s): output %zu has no name", path,
                            n->name, n->op, i);
    return 0;
}

int ck_graph_add_io(struct ck_graph *g, bool output, const char *tensor)
{
    return output ? str_push(&g->outputs, &g->noutputs, tensor)
                  : str_push(&g->inputs, &g->ninputs, tensor);
}

int ck_graph_add_attr(struct ck_graph *g, const char *key, const char *value)
{
    return kv_push(&g->attrs, &g->nattrs, key, value);
}
