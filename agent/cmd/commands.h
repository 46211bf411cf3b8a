/* One entry point per command; the table is in commands.c. */
#ifndef CK_COMMANDS_H
#define CK_COMMANDS_H

int ck_cmd_scan(int argc, char **argv);
int ck_cmd_config(int argc, char **argv);
int ck_cmd_inspect(int argc, char **argv);
int ck_cmd_verify(int argc, char **argv);
int ck_cmd_keygen(int argc, char **argv);
int ck_cmd_pack(int argc, char **argv);
int ck_cmd_hooks(int argc, char **argv);
int ck_cmd_watch(int argc, char **argv);
int ck_cmd_status(int argc, char **argv);

int ck_cmd_upload(int argc, char **argv);
int ck_cmd_queue(int argc, char **argv);
int ck_cmd_bundle(int argc, char **argv);
int ck_cmd_fetch(int argc, char **argv);

/* Shared by upload and queue run (cmd_upload.c): runs an open upload queue
 * in the foreground (agent/upload_round.h: SIGTERM/SIGINT give in-flight work
 * upload.grace), logs a summary and returns the exit code (0 all sent, 1
 * failed or left). */
#include <sqlite3.h>
#include <stdbool.h>
struct ck_config;
struct ck_upload_report;
int ck_upload_run_queue(sqlite3 *db, const struct ck_config *cfg, const char *spool,
                        bool progress, const char *cmd);
/* The uploader's on_progress for a terminal: one bar on stderr (progress.c). */
struct ck_upload_progress;
void ck_cmd_progress_bar(void *arg, const struct ck_upload_progress *p);
/* The exit code of an upload round (err its error, else its report), with
 * what went wrong on stderr as "ckptd CMD: ...". */
int ck_upload_report_exit(const char *cmd, int err, const struct ck_upload_report *rep);

#endif
