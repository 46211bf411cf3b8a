/* Events: what happened, with a stable dotted type name, a unique id and a
 * JSON payload (documented in docs/hooks.md, "Events"). The same event feeds the
 * webhooks (its JSON is the body), the exec hooks (its fields become
 * CKPTD_* environment variables, its JSON their stdin) and the templates
 * ({{field}}). Secrets never go into an event. */
#ifndef CK_EVENT_H
#define CK_EVENT_H

#include "common/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ck_event_type {
    CK_EV_CHECKPOINT_REGISTERED, /* checkpoint.registered */
    CK_EV_CHECKPOINT_DELETED,    /* checkpoint.deleted: retention freed its local bytes */
    CK_EV_ARCHIVE_PACKED,        /* archive.packed */
    CK_EV_ARCHIVE_FAILED,        /* archive.failed: a checkpoint could not be packed */
    CK_EV_VERIFICATION_PASSED,   /* verification.passed */
    CK_EV_VERIFICATION_FAILED,   /* verification.failed */
    CK_EV_UPLOAD_COMPLETED,      /* upload.completed */
    CK_EV_UPLOAD_FAILED,         /* upload.failed */
    CK_EV_TRAINING_STARTED,      /* training.started */
    CK_EV_TRAINING_FINISHED,     /* training.finished */
    CK_EV_TRAINING_FAILED,       /* training.failed */
    CK_EV_AGENT_STARTED,         /* agent.started */
    CK_EV_AGENT_STOPPING,        /* agent.stopping */
    CK_EV_HOOK_TEST,             /* hook.test: `ckptd hooks test` */
    CK_EV_CHECKPOINT_COMMITTED,  /* checkpoint.committed: a step of several nodes, by its committer */
    CK_EV__COUNT
};

/* The stable name of a type ("checkpoint.registered"); NULL when out of range. */
const char *ck_event_type_name(enum ck_event_type t);
/* The type of a name; -1 when unknown. */
int ck_event_type_parse(const char *name);
/* Whether an event-type filter ("checkpoint.registered", "upload.*", "*")
 * matches at least one known type (for checking a config). */
bool ck_event_filter_is_valid(const char *pattern);
bool ck_event_filter_matches(const char *pattern, const char *type_name);

/* An event. Every string is borrowed from the caller for the life of the
 * struct; NULL (or -1 for numbers) means "not part of this event" and the
 * field is left out of the JSON and the environment. */
struct ck_event {
    enum ck_event_type type;
    char id[32];     /* "evt_" + 26 random base32 characters; set by ck_event_init */
    int64_t time_ms; /* unix milliseconds; set by ck_event_init */

    const char *model_name;
    const char *model_id;
    const char *dir;        /* the training directory */
    const char *checkpoint; /* the PMF checkpoint reference */
    int64_t epoch;
    const char *path;   /* the checkpoint's path in the PMF tree */
    const char *source; /* where the training job wrote it */
    const char *md5;
    const char *sha256;
    const char *check; /* upload.completed: which check of the stored copy ran */
    int64_t size;               /* bytes */
    const char *archive_format; /* mldef, samediff, bundle */
    const char *archive_path;
    const char *archive_sha256;
    const char *store;      /* the store's name in the config */
    const char *remote_url; /* where the object landed (never with credentials) */
    int64_t bytes;          /* bytes uploaded */
    double seconds;         /* duration of the step; < 0 when none */
    const char *status;     /* training status: pending, running, finished, failed */
    int64_t exit_code;      /* training command's exit status */
    const char *error;      /* what failed, for *.failed events */
    const char *against;    /* verification.*: what the outputs were compared with */
    const char *message;    /* free text (hook.test) */
};

/* Sets type, a fresh random id and the current time; every field to "none". */
int ck_event_init(struct ck_event *ev, enum ck_event_type type);

/* The payload: {"type", "id", "timestamp" (RFC 3339 UTC), "data": {...}}.
 * Compact, one line, valid UTF-8. Appended to out. */
int ck_event_json(const struct ck_event *ev, struct ck_buf *out);

/* Field access by name, for templates and exec environments: "type", "id",
 * "timestamp", "model_name", "checkpoint", "epoch", ... (docs/hooks.md lists them).
 * Writes the value as text into out; returns 1 when the field is set, 0
 * when it exists but is not set for this event, and CK_ENOENT when no field
 * has that name. */
int ck_event_field(const struct ck_event *ev, const char *name, struct ck_buf *out);
/* Sets a field from text (for `ckptd hooks emit --set`): value is borrowed
 * for strings; numbers are parsed. "type", "id" and "timestamp" cannot be
 * set. CK_EUSAGE naming the field when unknown or not a number. */
int ck_event_set(struct ck_event *ev, const char *name, const char *value);
/* Whether a field of that name exists (for checking templates early). */
bool ck_event_field_exists(const char *name);

/* The environment variables of an exec hook: NULL-terminated "CKPTD_X=v"
 * strings for every field that is set, appended to *env (a growable array of
 * owned strings, *n entries). Free with ck_event_env_free. */
int ck_event_env(const struct ck_event *ev, char ***env, size_t *n);
void ck_event_env_free(char **env, size_t n);

/* The list of field names, NULL-terminated (docs/hooks.md, tests). */
extern const char *const ck_event_field_names[];

/* Fills out (size >= 27) with 26 random characters from the RFC 4648 base32
 * alphabet in lower case, from the OS's random source. */
int ck_event_random_id(char *out, size_t outsz);

#endif
