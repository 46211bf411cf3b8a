/* The upload stage, one round: queue the PMF tree (when asked), run the
 * queue, log upload.summary. The one copy of "queue the tree, run it, log a
 * summary": the watcher's helper process runs it per round
 * (agent/upload_worker.h), scan and status run it in the foreground through
 * the pipeline (agent/pipeline.h), upload and queue run it over the queue
 * alone. It prints nothing: the command layer turns the report into words
 * and an exit code. */
#ifndef CK_UPLOAD_ROUND_H
#define CK_UPLOAD_ROUND_H

#include "agent/config.h"
#include "stores/uploader.h"

#include <sqlite3.h>
#include <stdbool.h>

struct ck_upload_round {
    const struct ck_config *cfg; /* upload.stores and upload.* (borrowed) */
    const char *root;            /* the PMF tree to queue first, or NULL: the queue as it is */
    const char *spool;           /* compressed files and bundles being sent */
    struct ck_uploader_run_opts run;
    bool quiet_when_idle; /* no upload.summary when nothing moved (the watcher's rounds) */
};

/* Runs one round on an open state database; ctl is the stop switch. 0 when
 * the round itself worked (the report says what failed). */
int ck_upload_round_run(sqlite3 *db, const struct ck_upload_round *r, struct ck_upload_ctl *ctl,
                        struct ck_upload_report *rep);
/* The same in the foreground of a command: SIGTERM/SIGINT stop the round
 * (in-flight transfers get upload.grace), SIGPIPE is ignored; the previous
 * handlers come back afterwards. */
int ck_upload_round_foreground(sqlite3 *db, const struct ck_upload_round *r,
                               struct ck_upload_report *rep);

#endif
