/* The operations endpoint (--listen 127.0.0.1:PORT): a tiny HTTP/1.1 server
 * for the platform around the agent, driven by the daemon's event loop.
 *
 *   GET /healthz   200 "ok": the process is alive and its loop turns
 *   GET /readyz    200 when the ready callback says so, else 503 with why
 *   GET /metrics   Prometheus text (common/metrics.h)
 *   GET /status    JSON: version, uptime, and what the status callback adds
 *
 * GET and HEAD only; a request is at most CK_OPS_REQUEST_MAX bytes and must
 * arrive within CK_OPS_REQUEST_TIMEOUT_S; at most CK_OPS_MAX_CLIENTS at once
 * (more wait in the kernel's backlog); every answer closes the connection.
 * Nothing blocks: poll the fds of ck_ops_poll_fds, call ck_ops_step when one
 * is ready or by ck_ops_deadline_ms. */
#ifndef CK_OPS_H
#define CK_OPS_H

#include "common/buf.h"
#include "common/json.h"

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>

#define CK_OPS_REQUEST_MAX 8192
#define CK_OPS_REQUEST_TIMEOUT_S 5
#define CK_OPS_MAX_CLIENTS 16
#define CK_OPS_DEFAULT_HOST "127.0.0.1"

struct ck_ops_callbacks {
    /* true when ready; else writes why into why. NULL: always ready. */
    bool (*ready)(void *ctx, struct ck_buf *why);
    /* adds members to the /status object (keys and values). NULL: none. */
    int (*status)(void *ctx, struct ck_json *j);
    void *ctx;
};

/* Parses "PORT", "HOST:PORT" or "[V6]:PORT" (HOST an IP address or
 * "localhost"; PORT 0-65535, 0 picks a free one) into host (>= 64 bytes)
 * and port. CK_ECONFIG naming what. */
int ck_ops_parse_listen(const char *s, const char *what, char *host, size_t hostsz, int *port);

struct ck_ops;
/* Binds and listens (non-blocking, close-on-exec). cb is copied. */
int ck_ops_new(const char *listen, const struct ck_ops_callbacks *cb, struct ck_ops **out);
void ck_ops_free(struct ck_ops *o);
/* The port actually bound (useful with port 0). */
int ck_ops_port(const struct ck_ops *o);
/* Up to max fds to poll (the listening socket and each client). */
int ck_ops_poll_fds(const struct ck_ops *o, struct pollfd *fds, int max);
/* Monotonic ms of the earliest client timeout, -1 when no client. */
int64_t ck_ops_deadline_ms(const struct ck_ops *o);
/* Accepts, reads, answers and times out without blocking. */
void ck_ops_step(struct ck_ops *o);

#endif
