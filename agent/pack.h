/* Packing a checkpoint into a deployment archive, as one library call the
 * command line (`ckptd pack`, `mldef`) and the sidecar pipeline share:
 * open the model (reader + to_model, or a layer list), writer open/add/
 * finish through the writers table, then check the result (for mldef, the
 * validator reads the archive back). */
#ifndef CK_PACK_H
#define CK_PACK_H

#include "model/model.h"
#include "readers/mldefcheck.h"
#include "writers/samediff.h"
#include "writers/writer.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct ck_pack_opts {
    const char *format;     /* writer name: "mldef", "samediff" */
    const char *src_format; /* reader name, or NULL to detect */
    const char *graph;      /* a layer list file (YAML) for weight-only checkpoints, or NULL */
    const char *graph_text; /* or the layer list as YAML text (the config's pack.graph) */
    const char *graph_label; /* what errors in graph_text name (NULL: "pack.graph") */
    const char *weights;    /* where a training dict's model tensors are (pack.weights), or NULL */
    const char *weights_key;/* what set it, for messages: "pack.weights" (NULL) or "--weights" */
    struct ck_writer_opts w;
    bool digest; /* fill r->sha256 (one more read of the archive; the pipeline records it) */
};

struct ck_pack_result {
    uint64_t size;   /* bytes of the archive written */
    char sha256[65]; /* of the archive */
    size_t nlayers;
    struct ck_samediff_result samediff; /* samediff: the tag appended (tag "" otherwise) */
};

/* Packs src into out. Nothing is left under out's name when this fails. */
int ck_pack(const char *src, const char *out, const struct ck_pack_opts *o,
            struct ck_pack_result *r);

/* ck_pack in a child process (infer/sandbox, no resource limits): the
 * readers parse files that a trainer, or anyone who can write the watched
 * folder, made, and a reader that crashes on one costs the child, not the
 * sidecar. A crash is CK_ERR naming the signal ("crashed: the checkpoint's
 * reader was killed by signal 11 (SIGSEGV, ...)"); whatever the child left
 * under a temporary name is the next sweep's. */
int ck_pack_isolated(const char *src, const char *out, const struct ck_pack_opts *o,
                     struct ck_pack_result *r);

/* `mldef -c`: checks manifest (outside a zip) and every file it names, then
 * zips them into out (nothing written when a rule is broken: CK_EFORMAT
 * after printing every violation to err). sign_key may be NULL. */
int ck_pack_mldef_from_manifest(const char *manifest, const char *out, int level,
                                const char *sign_key, FILE *err);

/* Valid means runnable: when the engine cannot run m (ck_infer_check), a
 * violation "engine.runs" saying why is added to r (`mldef -i`, `mldef -c`). */
int ck_pack_check_runnable(struct ck_mldef_report *r, const struct ck_model *m);

/* Prints a validator report: one line per violation ("PATH: WHERE: MESSAGE
 * [RULE]"), then a summary; or one JSON document. */
void ck_pack_print_report(FILE *f, const char *path, const struct ck_mldef_report *r, bool json);

#endif
