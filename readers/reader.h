/* Checkpoint readers: one const table of operations per format, looked up
 * by name or detected by content. Adding a format is adding a file and a row
 * in reader.c. Every reader treats its input as hostile: every length and
 * offset is checked against the real file size before use, and errors name
 * the file, the tensor and the problem. */
#ifndef CK_READER_H
#define CK_READER_H

#include "common/yamlutil.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/tensor.h"

#include <stdbool.h>
#include <stddef.h>

/* What a verify pass hands back on the way: the CRC-32C of the data of each
 * tensor it read whole (crc32c[i], valid when known[i]), so a caller showing
 * them (inspect) needs no second pass over a file too large to keep in
 * memory. Both arrays have s->ntensors entries and belong to the caller. */
struct ck_tensor_crcs {
    uint32_t *crc32c;
    bool *known;
};

struct ck_reader_ops {
    const char *name; /* "safetensors", "tf-bundle", "npy", "npz", "nnp", "samediff" */
    const char *description;
    /* Whether path looks like this format. head holds the first bytes of the
     * file (up to 4096; fewer for a short file; 0 for a folder or a set
     * named by prefix). Content first, the name only as a tie-breaker. */
    int (*probe)(const char *path, const unsigned char *head, size_t headlen);
    /* Reads path into a new set (*out owned by the caller). */
    int (*open)(const char *path, struct ck_tensor_set **out);
    /* Checks every checksum the file stores (NULL: the format stores none):
     * 0 when there were some and all matched, CK_VERIFY_NONE when this file
     * stores none (a SameDiff .fb, where its zip has a CRC per member);
     * CK_EFORMAT naming the first tensor or member whose data does not match.
     * crcs (may be NULL) gets the CRC-32C of the tensors it read on the way. */
    int (*verify)(const struct ck_tensor_set *s, struct ck_tensor_crcs *crcs);
    /* Builds the canonical model (model/model.h) from a set this reader
     * opened, mapping the format's op names through its one table; takes
     * ownership of s (freed also on failure). NULL for weight-only formats,
     * whose graph comes from a layer list. An op with no mapping is
     * CK_EFORMAT naming the op and the node. */
    int (*to_model)(struct ck_tensor_set *s, struct ck_model **out);
};

/* probe() scores: higher wins. */
enum { CK_PROBE_NO = 0, CK_PROBE_NAME = 1, CK_PROBE_CONTENT = 2 };

/* The table, NULL-terminated (reader.c). */
extern const struct ck_reader_ops *const ck_readers[];

/* One per format, each in its own file (readers/<name>.c). */
extern const struct ck_reader_ops ck_reader_safetensors;
extern const struct ck_reader_ops ck_reader_tfbundle;
extern const struct ck_reader_ops ck_reader_npy;
extern const struct ck_reader_ops ck_reader_npz;
extern const struct ck_reader_ops ck_reader_nnp;
extern const struct ck_reader_ops ck_reader_samediff;
extern const struct ck_reader_ops ck_reader_pt;
extern const struct ck_reader_ops ck_reader_onnx;
extern const struct ck_reader_ops ck_reader_mldef;

/* The most head bytes detection reads and passes to probe(). */
#define CK_READER_HEAD_MAX 4096

const struct ck_reader_ops *ck_reader_find(const char *name);
/* Detects the format of path (a file, a folder or a TF prefix); CK_EFORMAT
 * naming the path when nothing recognises it. */
int ck_reader_detect(const char *path, const struct ck_reader_ops **out);
/* Detects (or uses format when not NULL) and opens. */
int ck_reader_open(const char *path, const char *format, struct ck_tensor_set **out);
/* What a verify returns when there was nothing to check (> 0: no error). */
#define CK_VERIFY_NONE 1
/* ops->verify, or CK_VERIFY_NONE when the format stores no checksums; crcs
 * may be NULL. 0 only when checksums were there and every one matched. */
int ck_reader_verify(const struct ck_reader_ops *ops, const struct ck_tensor_set *s,
                     struct ck_tensor_crcs *crcs);
/* The reader that made s (by s->format); NULL when none. */
const struct ck_reader_ops *ck_reader_of(const struct ck_tensor_set *s);

/* Whether s carries a network its reader can turn into a model (to_model
 * and a graph), so no layer list is needed. */
bool ck_reader_has_graph(const struct ck_tensor_set *s);

/* Opens path (format detected when NULL) as a deployable model (*out owned
 * by the caller). The graph: graph_path when given (a YAML layer list,
 * docs/model.md; it wins over the file's own network), else the file's own
 * network (the reader's to_model). A weight-only file without graph_path is
 * CK_EUSAGE: "'x.safetensors' holds weights only: give its graph with
 * --graph FILE (a layer list, docs/model.md)". */
int ck_reader_open_model(const char *path, const char *format, const char *graph_path,
                         struct ck_model **out);
/* The same with the layer list as a parsed YAML node (the config's
 * pack.graph; label names it in errors); graph NULL behaves as above. */
int ck_reader_open_model_yaml(const char *path, const char *format, struct ck_yaml_doc *d,
                              yaml_node_t *graph, const char *label, struct ck_model **out);
/* The same with the layer list as YAML text (a config keeps pack.graph as
 * text: ck_yaml_copy of the node into a buffer); text NULL behaves as above. */
int ck_reader_open_model_text(const char *path, const char *format, const char *text, size_t len,
                              const char *label, struct ck_model **out);

/* Any of the above: the layer list from graph_path (a file: YAML or an ONNX
 * graph) or text[0..len) (YAML; label names it), or neither; lo (may be
 * NULL) says where a training checkpoint's weights are (model/layers.h). */
int ck_reader_open_model_sel(const char *path, const char *format, const char *graph_path,
                             const char *text, size_t len, const char *label,
                             const struct ck_layers_opts *lo, struct ck_model **out);

#endif
