/* The two small files the nodes of a multi-node training meet through in
 * the store (docs/multinode.md): a node's part manifest
 * (.ckptd/parts/STEP/node-R-of-N.yaml: what one node holds of one step) and
 * the step's commit record (.ckptd/commits/STEP.yaml: every node's files,
 * written once the set is complete). Both are emitted here and parsed here
 * as hostile input (they come back from a shared store). The commit
 * record's bytes are a function of the manifests alone, so that every node
 * that commits a step writes the same bytes. */
#ifndef CK_NODEPARTS_H
#define CK_NODEPARTS_H

#include "common/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CK_NODEPART_FORMAT "ckptd-part/1"
#define CK_NODECOMMIT_FORMAT "ckptd-commit/1"
/* A manifest or record bigger than this is refused before it is parsed. */
#define CK_NODEPART_MAX (64u << 20)
/* The most files one part (or one record) may list. */
#define CK_NODEPART_MAX_FILES 1000000

/* One file of a part: its path relative to data/checkpoints/ (the form of
 * the step's .md5sums lines), '/'-separated, no "." or ".." component. */
struct ck_nodefile {
    char *path; /* owned */
    uint64_t size;
    char md5[33];
    char sha256[65]; /* "" in a commit record (it carries path, size and md5) */
};

struct ck_nodepart {
    char *checkpoint; /* owned: the step's reference (its folder or set name) */
    bool has_step;
    int64_t step;
    int64_t epoch;
    int rank, count;
    bool failed;    /* the node's wrapped command failed (training: failed) */
    double settled; /* when the node registered its part, UNIX seconds, milliseconds kept */
    struct ck_nodefile *files; /* owned, sorted by path, no path twice */
    size_t nfiles;
};

struct ck_nodecommit {
    char *checkpoint; /* owned */
    bool has_step;
    int64_t step;
    int64_t epoch; /* rank 0's */
    int count;
    double settled;          /* the latest of the parts' */
    char (*part_md5)[33];    /* owned: count entries, the MD5 of each rank's manifest bytes */
    struct ck_nodefile *files; /* owned, sorted by path, sha256 "" */
    size_t nfiles;
};

void ck_nodepart_release(struct ck_nodepart *p);
void ck_nodecommit_release(struct ck_nodecommit *c);

/* Whether a part path is one the tree can hold: relative, '/'-separated, no
 * empty, "." or ".." component, no backslash or control character (an
 * .md5sums line holds it as is), valid UTF-8, at most 4095 bytes. */
bool ck_nodefile_path_is_valid(const char *path);

/* Sorts p's files by path; CK_EFORMAT naming the path when one is listed twice. */
int ck_nodepart_sort(struct ck_nodepart *p);
/* The manifest's bytes (p sorted). */
int ck_nodepart_emit(const struct ck_nodepart *p, struct ck_buf *out);
/* Parses a manifest named name (for messages); CK_EFORMAT naming the file and
 * the line for anything out of format. */
int ck_nodepart_parse(struct ck_nodepart *p, const char *name, const char *data, size_t len);

/* The commit record of parts[0..n) (n == count, parts[i].rank == i, every
 * one of the same checkpoint and count) whose manifests' bytes have the MD5s
 * md5s[i]. A path two parts list with a different size or MD5 is a conflict:
 * CK_EEXIST naming the path and the two ranks (nothing is committed). The
 * same file listed by two parts is listed once. */
int ck_nodecommit_build(struct ck_nodecommit *c, const struct ck_nodepart *parts, size_t n,
                        const char (*md5s)[33]);
int ck_nodecommit_emit(const struct ck_nodecommit *c, struct ck_buf *out);
int ck_nodecommit_parse(struct ck_nodecommit *c, const char *name, const char *data, size_t len);
/* The step's .md5sums (md5sum -c format from data/checkpoints/): one line per file. */
int ck_nodecommit_md5sums(const struct ck_nodecommit *c, struct ck_buf *out);

#endif
