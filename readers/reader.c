#include "readers/reader.h"
#include "readers/onnx.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "model/layers.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Adding a format: write readers/<name>.c with its ck_reader_<name>, declare
 * it in reader.h, add a row here. On equal probe scores the earlier row wins. */
/* clang-format off */
const struct ck_reader_ops *const ck_readers[] = {
    &ck_reader_safetensors,
    &ck_reader_npy,
    &ck_reader_npz,
    &ck_reader_tfbundle,
    &ck_reader_mldef, /* before nnp: an .mldef is a zip too */
    &ck_reader_nnp,
    &ck_reader_samediff,
    &ck_reader_pt,
    &ck_reader_onnx,
    NULL,
};
/* clang-format on */

const struct ck_reader_ops *ck_reader_find(const char *name)
{
    for (size_t i = 0; name && ck_readers[i]; i++)
        if (!strcmp(ck_readers[i]->name, name))
            return ck_readers[i];
    return NULL;
}

const struct ck_reader_ops *ck_reader_of(const struct ck_tensor_set *s)
{
    return s ? ck_reader_find(s->format) : NULL;
}

/* The first bytes of a regular file; 0 bytes for a folder or a path that
 * does not exist (a TF prefix). */
static int read_head(const char *path, unsigned char *head, size_t *len)
{
    struct stat st;
    *len = 0;
    if (stat(path, &st) < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return 0;
        return ck_error_os(CK_EIO, "cannot stat '%s'", path);
    }
    if (!S_ISREG(st.st_mode))
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(CK_EIO, "cannot open '%s'", path);
    size_t got = 0;
    while (got < CK_READER_HEAD_MAX) {
        ssize_t n = read(fd, head + got, CK_READER_HEAD_MAX - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int err = ck_error_os(CK_EIO, "cannot read '%s'", path);
            close(fd);
            return err;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    *len = got;
    return 0;
}

int ck_reader_detect(const char *path, const struct ck_reader_ops **out)
{
    unsigned char head[CK_READER_HEAD_MAX];
    size_t len;
    int err, best = CK_PROBE_NO;
    const struct ck_reader_ops *found = NULL;
    if ((err = read_head(path, head, &len)) < 0)
        return err;
    for (size_t i = 0; ck_readers[i]; i++) {
        int score = ck_readers[i]->probe(path, head, len);
        if (score > best) {
            best = score;
            found = ck_readers[i];
        }
    }
    if (!found) {
        if (!ck_exists(path))
            return ck_error(CK_ENOENT, "'%s': no such file, folder or checkpoint prefix", path);
        return ck_error(CK_EFORMAT, "'%s': not a checkpoint format ckptd reads", path);
    }
    *out = found;
    return 0;
}

int ck_reader_open(const char *path, const char *format, struct ck_tensor_set **out)
{
    const struct ck_reader_ops *ops;
    int err;
    *out = NULL;
    if (format) {
        if (!(ops = ck_reader_find(format)))
            return ck_error(CK_EUSAGE, "unknown format '%s'", format);
    } else if ((err = ck_reader_detect(path, &ops)) < 0) {
        return err;
    }
    return ops->open(path, out);
}

int ck_reader_verify(const struct ck_reader_ops *ops, const struct ck_tensor_set *s,
                     struct ck_tensor_crcs *crcs)
{
    if (!ops || !ops->verify)
        return CK_VERIFY_NONE;
    return ops->verify(s, crcs);
}

bool ck_reader_has_graph(const struct ck_tensor_set *s)
{
    const struct ck_reader_ops *ops = ck_reader_of(s);
    return ops && ops->to_model && s->graph;
}

/* The model from s and what the caller gave for its graph; takes s. */
static int model_of(struct ck_tensor_set *s, const char *graph_path, struct ck_yaml_doc *d,
                    yaml_node_t *graph, const char *label, const struct ck_layers_opts *lo,
                    struct ck_model **out)
{
    const struct ck_reader_ops *ops = ck_reader_of(s);
    if (graph_path) {
        /* A graph file: an ONNX model (its initializers matched to the
         * checkpoint's tensors by name) or a YAML layer list. */
        const struct ck_reader_ops *g;
        if (ck_reader_detect(graph_path, &g) == 0 && g == &ck_reader_onnx)
            return ck_onnx_graph_for(s, graph_path, out);
        ck_error_clear();
        return ck_layers_load_opts(s, graph_path, lo, out);
    }
    if (graph)
        return ck_layers_build_opts(s, d, graph, label, lo, out);
    if (ops && ops->to_model && s->graph)
        return ops->to_model(s, out);
    int err = ck_error(CK_EUSAGE,
                       "'%s' holds weights only: give its graph with --graph FILE (a layer "
                       "list, docs/model.md)",
                       s->path ? s->path : "");
    ck_tensor_set_free(s);
    return err;
}

int ck_reader_open_model(const char *path, const char *format, const char *graph_path,
                         struct ck_model **out)
{
    struct ck_tensor_set *s;
    int err;
    *out = NULL;
    if ((err = ck_reader_open(path, format, &s)) < 0)
        return err;
    return model_of(s, graph_path, NULL, NULL, NULL, NULL, out);
}

int ck_reader_open_model_yaml(const char *path, const char *format, struct ck_yaml_doc *d,
                              yaml_node_t *graph, const char *label, struct ck_model **out)
{
    struct ck_tensor_set *s;
    int err;
    *out = NULL;
    if ((err = ck_reader_open(path, format, &s)) < 0)
        return err;
    return model_of(s, NULL, d, graph, label ? label : "pack.graph", NULL, out);
}

int ck_reader_open_model_text(const char *path, const char *format, const char *text, size_t len,
                              const char *label, struct ck_model **out)
{
    struct ck_tensor_set *s;
    int err;
    *out = NULL;
    if ((err = ck_reader_open(path, format, &s)) < 0)
        return err;
    if (!text)
        return model_of(s, NULL, NULL, NULL, NULL, NULL, out);
    return ck_layers_parse(s, label ? label : "pack.graph", text, len, out);
}

int ck_reader_open_model_sel(const char *path, const char *format, const char *graph_path,
                             const char *text, size_t len, const char *label,
                             const struct ck_layers_opts *lo, struct ck_model **out)
{
    struct ck_tensor_set *s;
    int err;
    *out = NULL;
    if ((err = ck_reader_open(path, format, &s)) < 0)
        return err;
    if (text && !graph_path)
        return ck_layers_parse_opts(s, label ? label : "pack.graph", text, len, lo, out);
    return model_of(s, graph_path, NULL, NULL, NULL, lo, out);
}
