/* One entry point per command; the table is in commands.c. */
#ifndef CK_COMMANDS_H
#define CK_COMMANDS_H

int ck_cmd_scan(int argc, char **argv);
int ck_cmd_config(int argc, char **argv);
int ck_cmd_inspect(int argc, char **argv);
int ck_cmd_keygen(int argc, char **argv);
int ck_cmd_pack(int argc, char **argv);
int ck_cmd_hooks(int argc, char **argv);
int ck_cmd_watch(int argc, char **argv);
int ck_cmd_status(int argc, char **argv);

int ck_cmd_upload(int argc, char **argv);
int ck_cmd_queue(int argc, char **argv);
int ck_cmd_bundle(int argc, char **argv);

/* Shared by upload, queue run and scan (cmd_upload.c): runs an open upload
 * queue with SIGTERM/SIGINT handled (in-flight work gets upload.grace), logs
 * a summary and returns the exit code (0 all sent, 1 failed or left). */
#include <sqlite3.h>
#include <stdbool.h>
struct ck_config;
struct ck_upload_outcome;
/* on_job (may be NULL) hears how each job ended, for upload.* events. */
int ck_upload_run_queue(sqlite3 *db, const struct ck_config *cfg, const char *spool,
                        bool progress, const char *cmd,
                        void (*on_job)(void *, const struct ck_upload_outcome *), void *arg);
/* For scan and watch: queues DIR's PMF tree for every upload.stores entry
 * (data/ and the configuration first, metadata.yaml last), then runs the
 * queue (spool under state_dir). An exit code; 0 when there are no stores. */
int ck_upload_after_scan(sqlite3 *db, const struct ck_config *cfg, const char *dir,
                         const char *state_dir,
                         void (*on_job)(void *, const struct ck_upload_outcome *), void *arg);

#endif
