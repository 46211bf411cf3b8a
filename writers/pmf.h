/* PMF (Plums Model Format): metadata.yaml and the model tree.
 *
 * metadata.yaml is checked by the rules of the reference validator (plums),
 * which are stricter than the prose spec: exactly its keys at every level,
 * lower-case hex MD5s, typed references, and the time/epoch cross rules
 * (../shared/specs/FORMAT-FACTS.md section 1). ck_pmf_parse refuses what
 * plums refuses, naming the file and line; ck_pmf_emit writes only what it
 * accepts. */
#ifndef CK_PMF_H
#define CK_PMF_H

#include "common/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A checkpoint reference: a YAML string or int (they differ: 12 != "12"). */
struct ck_pmf_ref {
    bool is_int;
    int64_t i;
    char *s; /* owned when !is_int */
};

struct ck_pmf_checkpoint {
    struct ck_pmf_ref ref;
    int64_t epoch;
    char *path;    /* owned: relative to the model root, e.g. data/checkpoints/x.pt */
    char md5[33];
};

enum ck_pmf_status { CK_PMF_PENDING, CK_PMF_RUNNING, CK_PMF_FINISHED, CK_PMF_FAILED };

struct ck_pmf_opt_time {
    bool set;
    double v;       /* UNIX seconds */
};

struct ck_pmf_opt_epoch {
    bool set;
    int64_t v;
};

enum ck_pmf_init_kind { CK_PMF_INIT_NONE, CK_PMF_INIT_FILE, CK_PMF_INIT_PMF };

struct ck_pmf_init {
    enum ck_pmf_init_kind kind;
    char *name;                  /* owned or NULL */
    char *path;                  /* owned */
    char md5[33];                /* file */
    char *id;                    /* owned: pmf */
    struct ck_pmf_ref checkpoint;/* pmf */
};

struct ck_pmf_meta {
    char *producer_name;         /* owned */
    char *producer_version_format; /* owned: "py_pa" */
    char *producer_version;      /* owned */
    char *name;                  /* owned or NULL (the key is still written) */
    char *id;                    /* owned */
    char *config_path;           /* owned: a top-level file name */
    char config_md5[33];
    struct ck_pmf_init init;
    enum ck_pmf_status status;
    struct ck_pmf_opt_time start_time, latest_time, end_time;
    struct ck_pmf_opt_epoch start_epoch, latest_epoch, end_epoch;
    bool has_latest;
    struct ck_pmf_ref latest;
    struct ck_pmf_checkpoint *checkpoints; /* owned, in insertion (registration) order */
    size_t ncheckpoints, cap;
};

void ck_pmf_meta_init(struct ck_pmf_meta *m);
void ck_pmf_meta_release(struct ck_pmf_meta *m);

/* Parses and checks data (the contents of file name). CK_EFORMAT with
 * "'name' line N: ..." when plums would reject it. */
int ck_pmf_parse(struct ck_pmf_meta *m, const char *name, const char *data, size_t len);
/* The cross-field rules alone (times, epochs, status, latest). */
int ck_pmf_validate(const struct ck_pmf_meta *m, const char *name);
/* Writes metadata.yaml text (validates first). */
int ck_pmf_emit(const struct ck_pmf_meta *m, struct ck_buf *out);
/* The same text, every scalar through libyaml's emitter (ck_pmf_emit writes
 * simple checkpoints directly): what tests compare ck_pmf_emit with. */
int ck_pmf_emit_by_emitter(const struct ck_pmf_meta *m, struct ck_buf *out);

/* Index of ref in m->checkpoints, or -1. */
ptrdiff_t ck_pmf_find(const struct ck_pmf_meta *m, const struct ck_pmf_ref *ref);
/* Registers a checkpoint (ref copied) as the latest: status pending becomes
 * running (start_* = now and start_epoch), latest_* updated. CK_EEXIST for a
 * reference already registered. */
int ck_pmf_register(struct ck_pmf_meta *m, const struct ck_pmf_ref *ref, int64_t epoch,
                    const char *path, const char *md5, double now, int64_t start_epoch);
/* Removes a checkpoint; latest becomes the previous insertion (plums' rule). */
int ck_pmf_unregister(struct ck_pmf_meta *m, size_t index);
/* Status transitions as plums allows them: pending -> running -> finished|failed,
 * pending -> failed. Others are CK_ESTATE with a message saying why. */
int ck_pmf_set_status(struct ck_pmf_meta *m, enum ck_pmf_status to, double now);
const char *ck_pmf_status_name(enum ck_pmf_status s);
int ck_pmf_status_parse(const char *s, enum ck_pmf_status *out);

bool ck_pmf_ref_equal(const struct ck_pmf_ref *a, const struct ck_pmf_ref *b);
int ck_pmf_ref_copy(struct ck_pmf_ref *dst, const struct ck_pmf_ref *src);
void ck_pmf_ref_release(struct ck_pmf_ref *r);
/* Text of a reference for logs ("12" or "epoch_3.pt"); out holds at least 32. */
const char *ck_pmf_ref_str(const struct ck_pmf_ref *r, char *out, size_t outsz);
bool ck_pmf_md5_is_valid(const char *s);
/* plums' producer name rule: ^[a-zA-Z][0-9a-zA-Z_]+$ */
bool ck_pmf_producer_name_is_valid(const char *s);

#endif
