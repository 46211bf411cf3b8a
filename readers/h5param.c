/* NNabla parameters from HDF5; see h5param.h. */
#include "readers/h5param.h"

#include "common/error.h"

#include <hdf5.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
        w->err = ck_error(CK_EFORMAT, "'%s': '%s' is neither a group nor a dataset", w->label,
                          name);
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
        w->err = ck_error(CK_EFORMAT, "'%s': tensor '%s': attribute 'index' or 'need_grad' is "
                          "not a scalar integer", w->label, name);
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

static int read_dataset(struct ck_tensor_set *s, const struct h5walk *w, hid_t file,
                        const struct h5item *it)
{
    hid_t d = -1, t = -1, sp = -1;
    int err = 0;
    struct ck_tensor ten;
    hsize_t dims[H5S_MAX_RANK];
    memset(&ten, 0, sizeof(ten));
    if ((d = H5Dopen2(file, it->name, H5P_DEFAULT)) < 0 || (t = H5Dget_type(d)) < 0 ||
        (sp = H5Dget_space(d)) < 0) {
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s': cannot open the dataset", w->label,
                       it->name);
        goto out;
    }
    if (H5Tget_class(t) != H5T_FLOAT || H5Tget_size(t) != 4) {
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s': not float32", w->label, it->name);
        goto out;
    }
    H5S_class_t sc = H5Sget_simple_extent_type(sp);
    int rank = sc == H5S_SCALAR ? 0 : H5Sget_simple_extent_ndims(sp);
    if ((sc != H5S_SIMPLE && sc != H5S_SCALAR) || rank < 0 || rank > CK_TENSOR_MAX_RANK ||
        rank > H5S_MAX_RANK || (rank && H5Sget_simple_extent_dims(sp, dims, NULL) != rank)) {
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s': unsupported dataspace", w->label,
                       it->name);
        goto out;
    }
    ten.name = it->name;
    ten.dtype = CK_DT_F32;
    ten.rank = rank;
    ten.role = "parameter";
    for (int i = 0; i < rank; i++) {
        if (dims[i] > (hsize_t)INT64_MAX) {
            err = ck_error(CK_EFORMAT, "'%s': tensor '%s': dimension too large", w->label,
                           it->name);
            goto out;
        }
        ten.dims[i] = (int64_t)dims[i];
    }
    uint64_t numel;
    if ((err = ck_tensor_numel(&ten, &numel)) < 0 || numel > w->file_size / 4) {
        err = ck_error(CK_EFORMAT,
                       "'%s': tensor '%s': %" PRIu64 " elements cannot fit in a file of %" PRIu64
                       " bytes",
                       w->label, it->name, err < 0 ? UINT64_MAX : numel, w->file_size);
        goto out;
    }
    hsize_t stored = H5Dget_storage_size(d);
    if (numel && (stored == 0 || stored > w->file_size)) {
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s': %llu bytes stored for %" PRIu64
                       " elements", w->label, it->name, (unsigned long long)stored, numel);
        goto out;
    }
    void *buf;
    if ((err = ck_tensor_set_alloc(s, numel * 4, &buf)) < 0)
        goto out;
    if (numel && H5Dread(d, H5T_IEEE_F32LE, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s': cannot read the data", w->label,
                       it->name);
        goto out;
    }
    ten.data = buf;
    ten.nbytes = numel * 4;
    if (ck_tensor_set_find(s, it->name)) {
        err = ck_error(CK_EFORMAT, "'%s': tensor '%s' appears twice", w->label, it->name);
        goto out;
    }
    if ((err = ck_tensor_set_add(s, &ten, NULL)) < 0)
        goto out;
    if (it->need_grad >= 0) {
        char key[4200];
        snprintf(key, sizeof(key), "need_grad:%s", it->name);
        err = ck_tensor_set_add_meta(s, key, it->need_grad ? "true" : "false");
    }
out:
    if (sp >= 0)
        H5Sclose(sp);
    if (t >= 0)
        H5Tclose(t);
    if (d >= 0)
        H5Dclose(d);
    return err;
}

int ck_h5param_read(struct ck_tensor_set *s, const char *label, const char *path,
                    const void *image, size_t imagelen)
{
    struct h5walk w;
    hid_t fapl = -1, file = -1;
    int err = 0;
    memset(&w, 0, sizeof(w));
    w.label = label;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (image) {
        w.file_size = imagelen;
        if ((fapl = H5Pcreate(H5P_FILE_ACCESS)) < 0 || H5Pset_fapl_core(fapl, 1 << 16, 0) < 0 ||
            H5Pset_file_image(fapl, (void *)image, imagelen) < 0) {
            err = ck_error(CK_ENOMEM, "'%s': cannot set up an HDF5 file image", label);
            goto out;
        }
        file = H5Fopen("parameter.h5", H5F_ACC_RDONLY, fapl);
    } else {
        struct stat st;
        if (stat(path, &st) < 0) {
            err = ck_error_os(CK_EIO, "cannot stat '%s'", path);
            goto out;
        }
        w.file_size = (uint64_t)st.st_size;
        file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    }
    if (file < 0) {
        err = ck_error(CK_EFORMAT, "'%s': not a readable HDF5 file", label);
        goto out;
    }
    if (H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, visit, &w) < 0) {
        err = w.err ? w.err : ck_error(CK_EFORMAT, "'%s': cannot list the HDF5 file", label);
        goto out;
    }
    qsort(w.items, w.n, sizeof(*w.items), item_cmp);
    for (size_t i = 0; i < w.n && err >= 0; i++)
        err = read_dataset(s, &w, file, &w.items[i]);
out:
    for (size_t i = 0; i < w.n; i++)
        free(w.items[i].name);
    free(w.items);
    if (file >= 0)
        H5Fclose(file);
    if (fapl >= 0)
        H5Pclose(fapl);
    return err;
}
