/* Deployment writers: one const table of operations per archive format
 * (mldef, samediff), looked up by name. Each consumes the in-memory model
 * (model/model.h) and nothing from readers/. Adding a format is adding a
 * file and a row in writer.c.
 *
 * Lifecycle: open() prepares the output (a temporary beside it, or for an
 * appendable archive the recorded state needed to roll a torn append back),
 * add() writes one model (a tag for SameDiff, the archive's one model for
 * mldef), finish() makes the result durable under its final name, free()
 * releases the writer and, when finish() did not succeed, removes every
 * temporary so the previous archive (or none) stays as it was. */
#ifndef CK_WRITER_H
#define CK_WRITER_H

#include "model/model.h"

#include <stdbool.h>

struct ck_writer_opts {
    int level;            /* zip compression: -1 the format's default, 0 stored, 1..9 */
    const char *tag;      /* appendable formats: the tag to write; NULL: from ref */
    const char *ref;      /* the checkpoint's reference (epoch or step), or NULL */
    const char *dtype;    /* convert weights: "fp16", "bf16", "int8"; NULL keeps them */
    const char *sign_key; /* an Ed25519 private key file to sign with, or NULL */
    bool verbose;         /* log what was converted, grouped or skipped */
    /* Formats written as a new file (mldef): called with the whole archive at
     * its temporary name before it replaces the output; an error keeps the
     * output as it was and removes the temporary (writers/zipapp.h). */
    int (*check)(const char *tmp, void *arg);
    void *check_arg;
};

/* Every writer embeds this first (libgit2's parent pattern). */
struct ck_writer {
    const struct ck_writer_ops *ops;
};

struct ck_writer_ops {
    const char *name;      /* "mldef", "samediff" */
    const char *extension; /* ".mldef", ".zip" */
    const char *description;
    int (*open)(const char *path, const struct ck_writer_opts *o, struct ck_writer **out);
    int (*add)(struct ck_writer *w, const struct ck_model *m);
    int (*finish)(struct ck_writer *w);
    void (*free)(struct ck_writer *w);
};

/* The table, NULL-terminated (writer.c). */
extern const struct ck_writer_ops *const ck_writers[];

const struct ck_writer_ops *ck_writer_find(const char *name);
/* Wrappers: callers never call w->ops->... directly. */
int ck_writer_open(const struct ck_writer_ops *ops, const char *path,
                   const struct ck_writer_opts *o, struct ck_writer **out);
int ck_writer_add(struct ck_writer *w, const struct ck_model *m);
int ck_writer_finish(struct ck_writer *w);
void ck_writer_free(struct ck_writer *w);

#endif
