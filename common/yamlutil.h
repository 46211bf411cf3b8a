/* YAML through libyaml, with scalars typed the way PyYAML's safe_load types
 * them (YAML 1.1: "yes" is a bool, "0o7" a string, "1e5" a string, "012" an
 * octal int). PMF is defined by a Python validator, so what matters is what
 * Python sees. */
#ifndef CK_YAMLUTIL_H
#define CK_YAMLUTIL_H

#include "common/buf.h"

#include <stdbool.h>
#include <stdint.h>
#include <yaml.h>

struct ck_yaml_doc {
    yaml_document_t doc;
    bool loaded;
    char name[256];  /* the file name used in messages */
};

/* How deep a document may nest (mappings and sequences): far past what PMF
 * metadata or a config needs, short of libyaml's quadratic cost. */
#define CK_YAML_MAX_DEPTH 64
/* The most nodes a document may hold with its aliases expanded: a long run's
 * metadata.yaml (10k checkpoints) is about 100k. */
#define CK_YAML_MAX_NODES 4000000
/* Parses exactly one document. Errors: "cannot parse 'NAME' line L column C: problem". */
int ck_yaml_load(struct ck_yaml_doc *d, const char *name, const char *data, size_t len);
void ck_yaml_release(struct ck_yaml_doc *d);
/* NULL for an empty document. */
yaml_node_t *ck_yaml_root(struct ck_yaml_doc *d);
yaml_node_t *ck_yaml_node(struct ck_yaml_doc *d, int id);
/* 1-based line of a node. */
int ck_yaml_line(const yaml_node_t *n);
/* CK_EFORMAT "'NAME' line L: message" for a document's node n (line 1 when
 * NULL): what a parser of a YAML file says of a node it refuses. */
int ck_yaml_error_at(const char *name, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

enum ck_yaml_type {
    CK_Y_NULL, CK_Y_BOOL, CK_Y_INT, CK_Y_FLOAT, CK_Y_STR,
    CK_Y_OTHER,  /* timestamps, merge keys, ints too large for int64 */
    CK_Y_MAP, CK_Y_SEQ
};

struct ck_yaml_value {
    enum ck_yaml_type type;
    bool b;
    int64_t i;
    double f;
    const char *s;  /* the scalar text, borrowed from the document */
    size_t len;
};

/* Types node as PyYAML safe_load would (quoted scalars are strings; explicit
 * !!str/!!int/... tags are honoured). */
void ck_yaml_resolve(const yaml_node_t *n, struct ck_yaml_value *out);
/* How a plain (unquoted) scalar with this text would be typed. */
enum ck_yaml_type ck_yaml_plain_type(const char *s, size_t len);
/* A scalar libyaml's emitter (as ck_yaml_out sets it up) writes plain and
 * as it is, so that text can be written without the emitter: 1 to 256
 * letters, digits and . _ / -, not starting with a punctuation mark, read
 * back as a string. As a mapping key it must also be at most 128 bytes
 * (longer keys are written in the "? key" form). */
bool ck_yaml_simple_plain(const char *s);
const char *ck_yaml_type_name(enum ck_yaml_type t);

/* Emitting: a thin layer over libyaml's emitter writing into a ck_buf.
 * Strings are written plain when that reads back as the same string, else
 * single- or double-quoted; so a reference "12" never turns into the int 12. */
struct ck_yaml_out {
    yaml_emitter_t em;
    struct ck_buf *buf;  /* borrowed */
    int err;
};
int ck_yaml_out_begin(struct ck_yaml_out *o, struct ck_buf *buf);
int ck_yaml_out_end(struct ck_yaml_out *o);  /* closes the document and stream */
void ck_yaml_map_begin(struct ck_yaml_out *o);
void ck_yaml_map_end(struct ck_yaml_out *o);
void ck_yaml_seq_begin(struct ck_yaml_out *o);
void ck_yaml_seq_end(struct ck_yaml_out *o);
void ck_yaml_str(struct ck_yaml_out *o, const char *s);  /* NULL writes null */
void ck_yaml_int(struct ck_yaml_out *o, int64_t v);
void ck_yaml_float(struct ck_yaml_out *o, double v);
void ck_yaml_bool(struct ck_yaml_out *o, bool v);
void ck_yaml_null(struct ck_yaml_out *o);
/* Copies node n of d (any depth) to the output: keeps keys ckptd does not know. */
void ck_yaml_copy(struct ck_yaml_out *o, struct ck_yaml_doc *d, yaml_node_t *n);

#endif
