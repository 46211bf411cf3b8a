#include "agent/npyio.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "readers/reader.h"

#include <stdio.h>
#include <string.h>

static bool real_number(enum ck_dtype t)
{
    return t != CK_DT_STRING && t != CK_DT_INVALID && t != CK_DT_C64 && t != CK_DT_C128 &&
           ck_dtype_size(t) > 0;
}

int ck_npyio_load(const char *path, struct ck_infer_array *out)
{
    struct ck_tensor_set *s = NULL;
    int err;
    memset(out, 0, sizeof *out);
    if ((err = ck_reader_open(path, "npy", &s)) < 0)
        return err;
    const struct ck_tensor *t = s->ntensors == 1 ? &s->tensors[0] : NULL;
    if (!t || !real_number(t->dtype) || !t->data) {
        err = ck_error(CK_EFORMAT, "'%s': not an array of real numbers (dtype %s)", path,
                       t ? ck_dtype_name(t->dtype) : "none");
        goto out;
    }
    if (t->rank > CK_INFER_MAX_RANK) {
        err = ck_error(CK_EFORMAT, "'%s': rank %d, at most %d", path, t->rank, CK_INFER_MAX_RANK);
        goto out;
    }
    if ((err = ck_infer_array_init(out, NULL, t->rank, t->dims)) < 0) {
        err = ck_error_wrap(err, "'%s'", path);
        goto out;
    }
    uint64_t n = ck_infer_array_numel(out);
    for (uint64_t i = 0; i < n; i++)
        out->data[i] = (float)ck_tensor_get_f64(t, i);
out:
    ck_tensor_set_free(s);
    return err;
}

int ck_npyio_save(const char *path, const struct ck_infer_array *a)
{
    struct ck_buf h;
    char dict[512];
    int used = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    for (int i = 0; i < a->rank; i++)
        used += snprintf(dict + used, sizeof dict - (size_t)used, "%lld,%s",
                         (long long)a->dims[i], i + 1 < a->rank ? " " : "");
    used += snprintf(dict + used, sizeof dict - (size_t)used, "), }");
    /* magic (6) + version (2) + length (2) + dict, padded with spaces to 64, '\n' last */
    size_t total = 10 + (size_t)used + 1;
    size_t padded = (total + 63) / 64 * 64;
    ck_buf_init(&h, (size_t)-1);
    ck_buf_append(&h, "\x93NUMPY\x01", 8);
    uint16_t hl = (uint16_t)(padded - 10);
    unsigned char le[2] = {(unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
    ck_buf_append(&h, le, 2);
    ck_buf_append(&h, dict, (size_t)used);
    for (size_t i = total; i < padded; i++)
        ck_buf_putc(&h, ' ');
    ck_buf_putc(&h, '\n');
    int err = ck_buf_append(&h, a->data, sizeof(float) * ck_infer_array_numel(a));
    if (err >= 0)
        err = ck_write_file_atomic(path, h.data, h.len, 0644);
    ck_buf_release(&h);
    return err;
}
