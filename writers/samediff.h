/* The SameDiff tagged archive writer (ADR 0001 zip layout, DL4J's FlatGraph
 * and FlatArray inside): one tag per model added, appended in place
 * (writers/zipapp.h) so earlier tags stay byte for byte and a kill at any
 * instant leaves the archive with every earlier tag. Registered in the
 * writers table as "samediff"; README "SameDiff archives" documents it. */
#ifndef CK_WRITERS_SAMEDIFF_H
#define CK_WRITERS_SAMEDIFF_H

#include "writers/writer.h"

#include <stddef.h>

extern const struct ck_writer_ops ck_writer_samediff;

/* What an append did, for logs and the sidecar's build_parameters. */
struct ck_samediff_result {
    char tag[256];
    size_t params;    /* parameter files written under the new tag */
    size_t shared;    /* parameters pointing at an earlier tag's file */
    uint64_t written; /* bytes appended (members, central directory) */
    uint64_t saved;   /* bytes not written thanks to sharing */
    size_t updater;   /* optimizer state arrays (updater.txt entries) */
    size_t unmapped;  /* optimizer state left out: not tied to a variable (model/optstate.h) */
};

/* The library entry point the sidecar calls: appends m to archive as one
 * tag (o->tag, or o->ref made a valid file name, plus "-<dtype>" with
 * o->dtype); creates the archive when it does not exist. res may be NULL. */
int ck_samediff_append(const char *archive, const struct ck_model *m,
                       const struct ck_writer_opts *o, struct ck_samediff_result *res);
/* The result of the last finish() of a samediff writer. */
const struct ck_samediff_result *ck_samediff_last(const struct ck_writer *w);

#endif
