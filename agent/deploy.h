/* The deployment stages of the pipeline (rows of agent/stages.c):
 *
 *   ck_deploy_pack    each newly registered checkpoint -> one archive per
 *                     pack.formats entry (mldef: DIR/data/deploy/<ref>.mldef;
 *                     samediff: a new tag in DIR/data/deploy/<model>.zip),
 *                     recorded under `archives:` in data/build_parameters.yaml,
 *                     archive.packed / archive.failed, the metrics.
 *   ck_deploy_verify  the archive as written, run by the CPU engine in its
 *                     sandbox on verify.inputs (or the archive's recorded
 *                     test sets, or fixed inputs): outputs finite, and
 *                     within atol/rtol of verify.expected, of a set's
 *                     known-good outputs, or else of the source checkpoint's
 *                     own network's outputs; verify.record records what
 *                     passed into the archive;
 *                     verification.passed / .failed, the record updated; a
 *                     failure holds the archive back (verify.on_failure: hold)
 *                     or lets it go marked (upload_marked). A SameDiff tag
 *                     that fails under hold is taken out of the run's archive
 *                     again (the append rolled back from an undo record kept
 *                     in DIR/.ckptd/undo/, later tags of the pass appended
 *                     again and verified again), so the archive uploaded
 *                     holds only tags that passed; each failed tag is noted
 *                     as failed.<tag> in the archive's record.
 *
 * A checkpoint that cannot be packed stays registered and uploaded: these
 * stages log and emit their failures and never fail the pass; they count
 * them in p->pack_failed and p->verify_failed. */
#ifndef CK_DEPLOY_H
#define CK_DEPLOY_H

#include "agent/pipeline.h"
#include "common/buf.h"

/* What a verification compared the archive's outputs with (the `against`
 * of its log line, event and record):
 *   expected  the trainer's expected outputs (verify.expected): the only
 *             reference that catches a wrong layer list
 *   recorded  known-good outputs recorded in the archive (its test sets)
 *   source    the source checkpoint's network run before packing, on the
 *             same inputs: proves the packing, not the graph (both sides run
 *             the same layer list) */
#define CK_AGAINST_EXPECTED "expected"
#define CK_AGAINST_RECORDED "recorded"
#define CK_AGAINST_SOURCE "source"

int ck_deploy_pack(struct ck_pipeline *p, const char *ref, struct ck_archives *out);
int ck_deploy_verify(struct ck_pipeline *p, const struct ck_archive *a);

/* Records (or replaces) the entry `name` under `archives:` of
 * DIR/data/build_parameters.yaml, keeping every other key. fields are
 * key/value text pairs (values written as strings, except "size" as an
 * integer; a NULL value removes the key); n pairs. */
int ck_deploy_record(const char *dir, const char *name, const char *const *fields, size_t n);

/* The text of archives.<name>.<key> in DIR/data/build_parameters.yaml into
 * out ("" when absent). */
int ck_deploy_record_get(const char *dir, const char *name, const char *key, char *out, size_t n);

/* The archives recorded for checkpoint ref (retention checks their copies):
 * each "NAME\tKEY\n" appended to out, NAME the file under pack.dir, KEY its
 * store key; a SameDiff archive is every checkpoint's (one tag each). */
int ck_deploy_record_archives_of(const char *dir, const char *ref, struct ck_buf *out);

#endif
