/* Logs: one line per event. Human text on a terminal, JSON lines when asked.
 * Never pass a secret to these functions: nothing here can redact it. */
#ifndef CK_LOG_H
#define CK_LOG_H

#include <stdio.h>

enum ck_log_level { CK_LOG_DEBUG, CK_LOG_INFO, CK_LOG_WARN, CK_LOG_ERROR };
enum ck_log_format { CK_LOG_TEXT, CK_LOG_JSON };

/* out is borrowed and must outlive logging; NULL means stderr. */
void ck_log_setup(enum ck_log_format format, enum ck_log_level level, FILE *out);
/* Command-line flags over the config over the defaults (text, info); each
 * argument negative when not given. Logs go to stderr. */
void ck_log_setup_over(int flag_format, int flag_level, int cfg_format, int cfg_level);
enum ck_log_format ck_log_format_get(void);
/* "text"/"json" and "debug"/"info"/"warn"/"error"; -1 when unknown. */
int ck_log_format_parse(const char *s);
int ck_log_level_parse(const char *s);

/* event is a stable dotted name ("checkpoint.registered"); the message is free text,
 * preferably key=value pairs so both humans and grep can read it. */
void ck_log(enum ck_log_level level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define ck_debug(ev, ...) ck_log(CK_LOG_DEBUG, ev, __VA_ARGS__)
#define ck_info(ev, ...) ck_log(CK_LOG_INFO, ev, __VA_ARGS__)
#define ck_warn(ev, ...) ck_log(CK_LOG_WARN, ev, __VA_ARGS__)
#define ck_err(ev, ...) ck_log(CK_LOG_ERROR, ev, __VA_ARGS__)

#endif
