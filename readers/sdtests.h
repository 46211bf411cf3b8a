/* Test sets recorded under a tag of a SameDiff archive (`ckptd verify
 * --record`; README "SameDiff tagged archives"):
 *
 *   <tag>/tests/<set>/set.txt        "ckptd-test 1", then "tolerance X",
 *                                    "input K NAME", "output K NAME" lines
 *   <tag>/tests/<set>/inputs/K.fb    root FlatArray: input K's values
 *   <tag>/tests/<set>/outputs/K.fb   root FlatArray: output K's known-good values
 *
 * K counts from 0 in the graph's input (output) order. The model reader
 * (readers/samediff.c) never reads these members; this one checks every
 * member under <tag>/tests/ against the layout (hostile input: sizes
 * checked before anything is read, every file listed, every listed file
 * present and a whole FlatArray). Sets come in the order their set.txt
 * entries have in the archive (the order they were recorded). */
#ifndef CK_SDTESTS_H
#define CK_SDTESTS_H

#include "model/tensor.h"

#include <stdbool.h>
#include <stddef.h>

#define CK_SDTESTS_MAX_ARRAYS 4096 /* inputs or outputs of one set */
#define CK_SDTESTS_NAME_MAX 64     /* a set's name: [A-Za-z0-9._-], no leading dot */

struct ck_sdtest_array {
    char *value;        /* owned: the graph input or output set.txt names */
    char *member;       /* owned: the archive member, for messages */
    struct ck_tensor t; /* data in the set memory of ck_sdtests.s */
};

struct ck_sdtest {
    char *name;                       /* owned */
    double tolerance;                 /* absolute; -1 when set.txt gives none */
    struct ck_sdtest_array *in, *out; /* owned, nin and nout of them */
    size_t nin, nout;
};

struct ck_sdtests {
    char *path;              /* owned: the archive */
    char *tag;               /* owned: the tag as tags.txt spells it */
    struct ck_tensor_set *s; /* owned: the memory of every array */
    struct ck_sdtest *sets;  /* owned */
    size_t n;
};

/* Whether spec ("RUN.zip" or "RUN.zip#TAG") names a zip holding tags.txt. */
bool ck_sdtests_is_archive(const char *spec);
/* The sets of spec's tag (the newest without "#TAG"); out->n is 0 when the
 * tag has none. CK_EFORMAT naming the archive and the member for anything
 * that does not follow the layout; CK_ENOENT for an unknown tag. Takes the
 * archive's shared lock while reading (after rolling a torn append back). */
int ck_sdtests_load(const char *spec, struct ck_sdtests *out);
/* The same, but when spec's tag has no sets, those of the newest older tag
 * that has some (out->tag names the tag they are from). */
int ck_sdtests_load_latest(const char *spec, struct ck_sdtests *out);
void ck_sdtests_release(struct ck_sdtests *t);

/* One FlatArray file (readers/samediff.c): t's data points into data. */
int ck_samediff_flatarray(struct ck_tensor_set *s, const char *label, const char *name,
                          const unsigned char *data, uint64_t len, struct ck_tensor *t);

#endif
