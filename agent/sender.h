/* Network work in a child process. The watcher forks a helper for each round
 * of uploads or webhook deliveries, and the helper exits when the round is
 * done. Two reasons:
 *
 *  - memory: the first transfer loads libcurl and its TLS stacks (OpenSSL
 *    and GnuTLS on Debian: 12 MiB resident, and none of it is ever given
 *    back). In a helper it is gone when the helper exits, and the sidecar
 *    idles at its own few MiB;
 *  - isolation: a crash or a hang in a transfer ends the helper, not the
 *    watcher; the round runs again later.
 *
 * The work itself needs no hand-over: the upload queue and the webhook outbox
 * are durable in the state database, and the helper is a fork, so it already
 * has the config. A round only needs to be told to look now (ck_sender_kick).
 * What the parent must learn from it comes back through a pipe as records:
 * the spec's own (upload outcomes), the metrics it counted, and when it wants
 * another round even without a kick (retries waiting).
 *
 * Parent side: single-threaded, driven by the watcher's loop (a poller), or
 * by ck_sender_pump where the loop is not running. */
#ifndef CK_SENDER_H
#define CK_SENDER_H

#include "agent/loop.h"
#include "agent/state.h"

#include <stdbool.h>
#include <stddef.h>

struct ck_sender_spec {
    const char *name; /* "upload", "webhook": in log lines */
    /* In the helper: one round. Returns the seconds after which another round
     * is wanted without a kick, or a negative value for none. */
    double (*round)(void *arg);
    /* In the helper, from its SIGTERM handler (so async-signal-safe): finish
     * soon. The parent kills the helper if it has not ended by the grace. */
    void (*stop)(void *arg);
    /* In the parent: a record the helper sent with ck_sender_send. */
    void (*on_record)(void *arg, const char *data, size_t len);
    void *arg;
};

struct ck_sender;

/* Registers with loop (NULL: driven by ck_sender_pump only). spec is copied;
 * its arg must outlive the sender. state (may be NULL) is the caller's
 * database connection: closed around each fork (see ck_state_close_db). No
 * helper runs until the first kick. */
int ck_sender_new(struct ck_loop *loop, const struct ck_sender_spec *spec, struct ck_state *state,
                  struct ck_sender **out);
/* A round is wanted: one starts at the loop's next turn, or right after the
 * running one ends. */
void ck_sender_kick(struct ck_sender *s);
/* A helper is running, or a kick is waiting for one. A round asked for later
 * (a retry time) does not count. */
bool ck_sender_busy(const struct ck_sender *s);
/* Outside the loop: starts a kicked round, reads records and reaps, waiting
 * at most timeout_ms for something to happen. */
void ck_sender_pump(struct ck_sender *s, int timeout_ms);
/* No more rounds. A running helper gets SIGTERM, and SIGKILL if it is still
 * there after grace seconds; its records are read until it ends. */
void ck_sender_stop(struct ck_sender *s, double grace);
/* Stops (grace 0) and frees. NULL is fine. */
void ck_sender_free(struct ck_sender *s);

/* In the parent: a record's NUL-separated fields, at most max (data must be
 * NUL-terminated at len, so that the last field ends): the count found. */
size_t ck_sender_fields(const char *data, size_t len, const char **f, size_t max);

/* In the helper, from any thread: sends a record to the parent's on_record,
 * and what the metrics counted since the last send. */
int ck_sender_send(const void *data, size_t len);

#endif
