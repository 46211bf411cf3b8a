/* NNabla parameters from HDF5; see h5param.h.
 *
 * libhdf5 is not written for hostile files: a corrupt header can make it
 * allocate hundreds of gigabytes or crash. So it only ever runs in a child
 * process with an address-space and CPU limit; the child streams what it
 * read through a pipe (records: 'T' tensor, 'E' error, 'D' done) and the
 * parent checks every length in them against the file's size again before
 * it allocates. A child that dies is an error naming the file. */
#include "readers/h5param.h"

#include "common/error.h"
#include "lazy/lazy.h"
#include "readers/nameidx.h"
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define H5P_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define H5P_UNDER_ASAN 1
#endif
#endif

/* What the child may use beyond what it inherits: HDF5's caches plus one
 * dataset (at most the file's size) being read and written to the pipe. */
#define H5P_CHILD_MEM_BASE ((uint64_t)1 << 30)
#define H5P_CHILD_CPU_SECONDS 120
#define H5P_MAX_NAME 65536

struct h5item {
    char *name; /* owned */
    int64_t index;
    bool has_index;
    int need_grad; /* -1 when absent */
    size_t order;  /* visit order, to keep the sort stable */
};

struct h5walk {
    const char *label;
    uint64_t file_size;
    unsigned flags; /* CK_H5PARAM_* */
    struct h5item *items;
    size_t n, cap;
    int err;
};

int ck_h5param_is_hdf5(const unsigned char *head, size_t len)
{
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    return len >= 8 && !memcmp(head, sig, 8);
}

/* A scalar integer attribute (any integer or enum type of at most 8 bytes). */
static int attr_int(hid_t obj, const char *attr, int64_t *out, bool *present)
{
    *present = false;
    htri_t ex = H5Aexists(obj, attr);
    if (ex <= 0)
        return ex < 0 ? -1 : 0;
    hid_t a = H5Aopen(obj, attr, H5P_DEFAULT);
    if (a < 0)
        return -1;
    int rc = -1;
    hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
    if (t >= 0 && sp >= 0 && H5Sget_simple_extent_npoints(sp) == 1) {
        H5T_class_t cls = H5Tget_class(t);
        size_t sz = H5Tget_size(t);
        if (cls == H5T_INTEGER) {
            long long v;
            if (H5Aread(a, H5T_NATIVE_LLONG, &v) >= 0) {
                *out = v;
                rc = 0;
            }
        } else if (cls == H5T_ENUM && sz >= 1 && sz <= 8) {
            /* An enum is read in its own type; its base is a native-order integer. */
            hid_t base = H5Tget_super(t);
            unsigned char raw[8] = {0};
            if (base >= 0 && H5Aread(a, t, raw) >= 0) {
                H5T_sign_t sg = H5Tget_sign(base);
                int64_t v = 0;
                if (sz == 1)
                    v = sg == H5T_SGN_2 ? (int8_t)raw[0] : raw[0];
                else if (sz == 2) {
                    int16_t x;
                    memcpy(&x, raw, 2);
                    v = x;
                } else if (sz == 4) {
                    int32_t x;
                    memcpy(&x, raw, 4);
                    v = x;
                } else if (sz == 8) {
                    memcpy(&v, raw, 8);
                }
                *out = v;
                rc = 0;
            }
            if (base >= 0)
                H5Tclose(base);
        }
        if (rc == 0)
            *present = true;
    }
    if (t >= 0)
        H5Tclose(t);
    if (sp >= 0)
        H5Sclose(sp);
    H5Aclose(a);
    return rc == 0 ? 0 : 1; /* 1: present but not a scalar integer */
}

static herr_t visit(hid_t group, const char *name, const H5L_info_t *info, void *arg)
{
    struct h5walk *w = arg;
    if (info->type != H5L_TYPE_HARD) {
        w->err = ck_error(CK_EFORMAT, "'%s': '%s' is a %s link; only plain datasets are read",
                          w->label, name, info->type == H5L_TYPE_SOFT ? "soft" : "external");
        return -1;
    }
    H5O_info_t oi;
    if (H5Oget_info_by_name(group, name, &oi, H5P_DEFAULT) < 0) {
        w->err = ck_error(CK_EFORMAT, "'%s': cannot read object '%s'", w->label, name);
        return -1;
    }
    if (oi.type == H5O_TYPE_GROUP)
        return 0;
    if (oi.type != H5O_TYPE_DATASET) {
        w->err =
            ck_error(CK_EFORMAT, "'%s': '%s' is neither a group nor a dataset", w->label, name);
        return -1;
    }
    if (w->n == w->cap) {
        size_t nc = w->cap ? 2 * w->cap : 16;
        struct h5item *ni = realloc(w->items, nc * sizeof(*ni));
        if (!ni) {
            w->err = ck_error(CK_ENOMEM, "'%s': out of memory", w->label);
            return -1;
        }
        w->items = ni;
        w->cap = nc;
    }
    struct h5item *it = &w->items[w->n];
    memset(it, 0, sizeof(*it));
    if (!(it->name = strdup(name))) {
        w->err = ck_error(CK_ENOMEM, "'%s': out of memory", w->label);
        return -1;
    }
    it->order = w->n++;
    it->need_grad = -1;
    hid_t d = H5Dopen2(group, name, H5P_DEFAULT);
    if (d < 0) {
        w->err = ck_error(CK_EFORMAT, "'%s': cannot open dataset '%s'", w->label, name);
        return -1;
    }
    int64_t v;
    bool present;
    int rc = attr_int(d, "index", &v, &present);
    if (rc == 0 && present) {
        it->index = v;
        it->has_index = true;
    }
    if (rc == 0)
        rc = attr_int(d, "need_grad", &v, &present);
    if (rc == 0 && present)
        it->need_grad = v != 0;
    H5Dclose(d);
    if (rc != 0) {
        w->err = ck_error(CK_EFORMAT,
                          "'%s': tensor '%s': attribute 'index' or 'need_grad' is "
                          "not a scalar integer",
                          w->label, name);
        return -1;
    }
    return 0;
}

static int item_cmp(const void *x, const void *y)
{
    const struct h5item *a = x, *b = y;
    if (a->has_index != b->has_index)
        return a->has_index ? -1 : 1;
    if (a->has_index && a->index != b->index)
        return a->index < b->index ? -1 : 1;
    return a->order < b->order ? -1 : a->order > b->order;
}

/* ---- the child: libhdf5 ---- */

static void child_fail(int fd, int code)
{
    const char *msg = ck_error_msg();
    uint32_t len = (uint32_t)strlen(msg);
    int32_t c = code;
    (void)(ck_write_all(fd, "E", 1) || ck_write_all(fd, &c, 4) || ck_write_all(fd, &len, 4) ||
           ck_write_all(fd, msg, len));
    _exit(1);
}

static int child_dataset(const struct h5walk *w, hid_t file, const struct h5item *it, int fd)
{
    hid_t d = -1, t = -1, sp = -1;
    int err = 0;
    hsize_t dims[H5S_MAX_RANK];
    void *buf = NULL;
    if ((d = H5Dopen2(file, it->name, H5P_DEFAULT)) < 0 || (t = H5Dget_type(d)) < 0 ||
        (sp = H5Dget_space(d)) < 0) {
        err =
            ck_error(CK_EFORMAT, "'%s': tensor '%s': cannot open the dataset", w->label, it->name);
        goto out;
    }
    /* float32, or (CK_H5PARAM_INTEGERS) an integer of 1 to 8 bytes read as int64
     * (native long long: little-endian on the Linux targets ckptd builds for) */
    H5T_class_t cls = H5Tget_class(t);
    size_t stored_size = H5Tget_size(t);
    bool integer = cls == H5T_INTEGER && (w->flags & CK_H5PARAM_INTEGERS);
    if (integer && (stored_size < 1 || stored_size > 8)) {
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s': an integer of %zu bytes", w->label, it->name,
                       stored_size);
        goto out;
    }
    if (!integer && (cls != H5T_FLOAT || stored_size != 4)) {
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s': not float32%s", w->label, it->name,
                       (w->flags & CK_H5PARAM_INTEGERS) ? " nor an integer" : "");
        goto out;
    }
    size_t esize = integer ? 8 : 4;
    H5S_class_t sc = H5Sget_simple_extent_type(sp);
    int rank = sc == H5S_SCALAR ? 0 : H5Sget_simple_extent_ndims(sp);
    if ((sc != H5S_SIMPLE && sc != H5S_SCALAR) || rank < 0 || rank > CK_TENSOR_MAX_RANK ||
        rank > H5S_MAX_RANK || (rank && H5Sget_simple_extent_dims(sp, dims, NULL) != rank)) {
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s': unsupported dataspace", w->label, it->name);
        goto out;
    }
    uint64_t numel = 1;
    int64_t sdims[CK_TENSOR_MAX_RANK];
    for (int i = 0; i < rank; i++) {
        if (dims[i] && numel > w->file_size / dims[i]) {
            numel = UINT64_MAX;
            break;
        }
        numel *= dims[i];
        sdims[i] = (int64_t)dims[i];
    }
    if (numel > w->file_size / stored_size) {
        err = ck_error(CK_EFORMAT,
                       "'%s': tensor '%s': its elements cannot fit in a file of %" PRIu64 " bytes",
                       w->label, it->name, w->file_size);
        goto out;
    }
    hsize_t stored = H5Dget_storage_size(d);
    if (numel && (stored == 0 || stored > w->file_size)) {
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s': %llu bytes stored for %" PRIu64 " elements",
                       w->label, it->name, (unsigned long long)stored, numel);
        goto out;
    }
    uint64_t nbytes = numel * esize;
    if (!(buf = malloc(nbytes ? nbytes : 1))) {
        err = ck_error(CK_ENOMEM, "'%s': tensor '%s': out of memory", w->label, it->name);
        goto out;
    }
    if (numel && H5Dread(d, integer ? H5T_NATIVE_LLONG : H5T_IEEE_F32LE, H5S_ALL, H5S_ALL,
                         H5P_DEFAULT, buf) < 0) {
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s': cannot read the data", w->label, it->name);
        goto out;
    }
    uint32_t nl = (uint32_t)strlen(it->name);
    int32_t r = rank, ng = it->need_grad, kind = integer;
    if (ck_write_all(fd, "T", 1) || ck_write_all(fd, &nl, 4) || ck_write_all(fd, it->name, nl) ||
        ck_write_all(fd, &r, 4) || ck_write_all(fd, sdims, sizeof(int64_t) * (size_t)rank) ||
        ck_write_all(fd, &ng, 4) || ck_write_all(fd, &kind, 4) || ck_write_all(fd, &nbytes, 8) ||
        ck_write_all(fd, buf, nbytes))
        _exit(1); /* the parent went away */
out:
    free(buf);
    if (sp >= 0)
        H5Sclose(sp);
    if (t >= 0)
        H5Tclose(t);
    if (d >= 0)
        H5Dclose(d);
    return err;
}

static void child_main(int fd, const char *label, const char *path, const void *image,
                       size_t imagelen, uint64_t file_size, unsigned flags)
{
    struct h5walk w;
    hid_t fapl = -1, file = -1;
    int err = 0;
    memset(&w, 0, sizeof(w));
    w.label = label;
    w.file_size = file_size;
    w.flags = flags;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (image) {
        if ((fapl = H5Pcreate(H5P_FILE_ACCESS)) < 0 || H5Pset_fapl_core(fapl, 1 << 16, 0) < 0 ||
            H5Pset_file_image(fapl, (void *)image, imagelen) < 0)
            child_fail(fd, ck_error(CK_ENOMEM, "'%s': cannot set up an HDF5 file image", label));
        file = H5Fopen("parameter.h5", H5F_ACC_RDONLY, fapl);
    } else {
        file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    }
    if (file < 0)
        child_fail(fd, ck_error(CK_EFORMAT, "'%s': not a readable HDF5 file", label));
    if (H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, visit, &w) < 0)
        child_fail(fd,
                   w.err ? w.err : ck_error(CK_EFORMAT, "'%s': cannot list the HDF5 file", label));
    if (w.n)
        qsort(w.items, w.n, sizeof(*w.items), item_cmp);
    for (size_t i = 0; i < w.n; i++)
        if ((err = child_dataset(&w, file, &w.items[i], fd)) < 0)
            child_fail(fd, err);
    if (ck_write_all(fd, "D", 1))
        _exit(1);
    _exit(0);
}

/* Limits the child: CPU time, and address space on top of what it inherits
 * (not under ASan, whose shadow memory needs a huge address space). */
static void child_limits(uint64_t file_size)
{
    struct rlimit cpu = {H5P_CHILD_CPU_SECONDS, H5P_CHILD_CPU_SECONDS};
    setrlimit(RLIMIT_CPU, &cpu);
#ifndef H5P_UNDER_ASAN
    unsigned long long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%llu", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    uint64_t cur = (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t lim = cur + H5P_CHILD_MEM_BASE + 2 * file_size;
    struct rlimit as = {(rlim_t)lim, (rlim_t)lim};
    setrlimit(RLIMIT_AS, &as);
#endif
}

/* ---- the parent: checks and keeps what the child sent ---- */

static int read_all(int fd, void *p, size_t n)
{
    unsigned char *b = p;
    while (n) {
        ssize_t r = read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

static int parent_tensor(struct ck_tensor_set *s, const char *label, uint64_t file_size,
                         unsigned flags, int fd)
{
    uint32_t nl;
    int32_t rank, ng, kind;
    uint64_t nbytes, numel;
    struct ck_tensor t;
    char *name = NULL;
    void *data;
    int err;
    memset(&t, 0, sizeof(t));
    if (read_all(fd, &nl, 4) || nl == 0 || nl > H5P_MAX_NAME || !(name = malloc(nl + 1)) ||
        read_all(fd, name, nl) || read_all(fd, &rank, 4) || rank < 0 || rank > CK_TENSOR_MAX_RANK ||
        read_all(fd, t.dims, 8 * (size_t)rank) || read_all(fd, &ng, 4) || read_all(fd, &kind, 4) ||
        (kind != 0 && kind != 1) || (kind == 1 && !(flags & CK_H5PARAM_INTEGERS)) ||
        read_all(fd, &nbytes, 8)) {
        free(name);
        return ck_error(CK_EFORMAT, "'%s': the HDF5 reader sent a bad record", label);
    }
    name[nl] = 0;
    t.name = name;
    t.rank = rank;
    t.dtype = kind ? CK_DT_I64 : CK_DT_F32;
    t.role = "parameter";
    /* an integer is stored in at least one byte of the file, a float32 in four */
    uint64_t esize = kind ? 8 : 4;
    if (ck_tensor_numel(&t, &numel) < 0 || numel > file_size / (kind ? 1 : 4) ||
        nbytes != numel * esize) {
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s': bad size from the HDF5 reader", label, name);
        goto out;
    }
    if ((err = ck_tensor_set_alloc(s, nbytes, &data)) < 0)
        goto out;
    if (read_all(fd, data, nbytes)) {
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s': the HDF5 reader stopped", label, name);
        goto out;
    }
    t.data = data;
    t.nbytes = nbytes;
    if ((err = ck_tensor_set_add(s, &t, NULL)) < 0)
        goto out;
    if (ng >= 0) {
        size_t kl = nl + 16;
        char *key = malloc(kl);
        if (!key) {
            err = ck_error(CK_ENOMEM, "'%s': out of memory", label);
            goto out;
        }
        snprintf(key, kl, "need_grad:%s", name);
        err = ck_tensor_set_add_meta(s, key, ng ? "true" : "false");
        free(key);
    }
out:
    free(name);
    return err;
}

static int parent_error(const char *label, int fd)
{
    int32_t code;
    uint32_t len;
    char msg[4096];
    if (read_all(fd, &code, 4) || read_all(fd, &len, 4) || len >= sizeof(msg) ||
        read_all(fd, msg, len) || code >= 0)
        return ck_error(CK_EFORMAT, "'%s': the HDF5 reader sent a bad record", label);
    msg[len] = 0;
    return ck_error(code, "%s", msg);
}

int ck_h5param_read(struct ck_tensor_set *s, const char *label, const char *path, const void *image,
                    size_t imagelen)
{
    return ck_h5param_read_flags(s, label, path, image, imagelen, 0);
}

int ck_h5param_read_flags(struct ck_tensor_set *s, const char *label, const char *path,
                          const void *image, size_t imagelen, unsigned flags)
{
    uint64_t file_size = imagelen;
    int fds[2], err = 0, status = 0;
    bool done = false;
    if (!image) {
        struct stat st;
        if (stat(path, &st) < 0)
            return ck_error_os(CK_EIO, "cannot stat '%s'", path);
        file_size = (uint64_t)st.st_size;
    }
    /* Loaded by the parent, before fork(): dlopen in the child of a threaded
     * process could meet a loader lock another thread held at the fork. */
    if ((err = ck_lazy_load(CK_LIB_HDF5)) < 0)
        return ck_error_wrap(err, "'%s'", label);
    if (pipe2(fds, O_CLOEXEC) < 0)
        return ck_error_os(CK_EIO, "'%s': cannot make a pipe", label);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return ck_error_os(CK_EIO, "'%s': cannot start the HDF5 reader", label);
    }
    if (pid == 0) {
        close(fds[0]);
        signal(SIGPIPE, SIG_DFL);
        child_limits(file_size);
        child_main(fds[1], label, path, image, imagelen, file_size, flags);
    }
    close(fds[1]);
    while (err >= 0 && !done) {
        char kind;
        if (read_all(fds[0], &kind, 1)) {
            err = 1; /* the child ended without a word: see its status below */
            break;
        }
        if (kind == 'T')
            err = parent_tensor(s, label, file_size, flags, fds[0]);
        else if (kind == 'E')
            err = parent_error(label, fds[0]);
        else if (kind == 'D')
            done = true;
        else
            err = ck_error(CK_EFORMAT, "'%s': the HDF5 reader sent a bad record", label);
    }
    if (err < 0)
        kill(pid, SIGKILL); /* it may still be writing */
    close(fds[0]);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (err < 0)
        return err;
    if (done && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        struct ck_nameidx ix; /* HDF5 names are unique within a file; checked all the same */
        if ((err = ck_nameidx_tensors(&ix, s)) < 0)
            return err;
        const char *dup = ck_nameidx_duplicate(&ix);
        if (dup)
            err = ck_error(CK_EFORMAT, "'%s': tensor '%s' appears twice", label, dup);
        ck_nameidx_release(&ix);
        return err;
    }
    if (WIFSIGNALED(status))
        return ck_error(CK_EFORMAT,
                        "'%s': the HDF5 reader died (signal %d); the file is "
                        "corrupt or needs more memory than its size allows",
                        label, WTERMSIG(status));
    return ck_error(CK_EFORMAT, "'%s': the HDF5 reader failed on this file", label);
}
