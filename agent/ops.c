#include "agent/ops.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct client {
    int fd; /* -1: free slot */
    char req[CK_OPS_REQUEST_MAX + 1];
    size_t len;
    int64_t deadline;  /* monotonic ms */
    struct ck_buf out; /* the answer being written */
    size_t sent;
    bool answering;
};

struct ck_ops {
    int fd;
    int port;
    struct ck_ops_callbacks cb;
    struct client clients[CK_OPS_MAX_CLIENTS];
    int64_t started; /* monotonic ms */
};

int ck_ops_parse_listen(const char *s, const char *what, char *host, size_t hostsz, int *port)
{
    const char *p = s, *colon;
    size_t hl;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return ck_error(CK_ECONFIG, "%s: '%s' is not HOST:PORT", what, s);
        p = s + 1;
        hl = (size_t)(close - p);
        colon = close + 1;
    } else if ((colon = strrchr(s, ':')) != NULL) {
        hl = (size_t)(colon - s);
    } else {
        hl = strlen(CK_OPS_DEFAULT_HOST);
        p = CK_OPS_DEFAULT_HOST;
        colon = s - 1; /* the whole string is the port */
    }
    if (hl == 0 || hl >= hostsz)
        return ck_error(CK_ECONFIG, "%s: '%s' has no host (like 127.0.0.1:9464)", what, s);
    memcpy(host, p, hl);
    host[hl] = '\0';
    if (!strcmp(host, "localhost"))
        snprintf(host, hostsz, "127.0.0.1");
    unsigned char a[16];
    if (inet_pton(AF_INET, host, a) != 1 && inet_pton(AF_INET6, host, a) != 1)
        return ck_error(CK_ECONFIG, "%s: '%s' is not an IP address (like 127.0.0.1)", what, host);
    char *end;
    const char *ps = colon + 1;
    long v = strtol(ps, &end, 10);
    if (!*ps || *end || v < 0 || v > 65535)
        return ck_error(CK_ECONFIG, "%s: '%s' is not a port number (0-65535)", what, ps);
    *port = (int)v;
    return 0;
}

int ck_ops_new(const char *listen_on, const struct ck_ops_callbacks *cb, struct ck_ops **out)
{
    char host[64];
    int port, err;
    struct sockaddr_storage ss;
    socklen_t sl;
    *out = NULL;
    if ((err = ck_ops_parse_listen(listen_on, "--listen", host, sizeof host, &port)) < 0)
        return err;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        sl = sizeof *v4;
    } else {
        inet_pton(AF_INET6, host, &v6->sin6_addr);
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        sl = sizeof *v6;
    }
    struct ck_ops *o = calloc(1, sizeof *o);
    if (!o)
        return ck_error(CK_ENOMEM, "out of memory");
    for (int i = 0; i < CK_OPS_MAX_CLIENTS; i++) {
        o->clients[i].fd = -1;
        ck_buf_init(&o->clients[i].out, 16u << 20);
    }
    if (cb)
        o->cb = *cb;
    o->started = ck_mono_ms();
    o->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (o->fd < 0 || setsockopt(o->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(o->fd, (struct sockaddr *)&ss, sl) < 0 || listen(o->fd, 64) < 0) {
        err = ck_error_os(CK_EIO, "cannot listen on '%s'", listen_on);
        ck_ops_free(o);
        return err;
    }
    sl = sizeof ss;
    getsockname(o->fd, (struct sockaddr *)&ss, &sl);
    o->port = ntohs(ss.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);
    *out = o;
    return 0;
}

static void drop(struct client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->len = c->sent = 0;
    c->answering = false;
    ck_buf_reset(&c->out);
}

void ck_ops_free(struct ck_ops *o)
{
    if (!o)
        return;
    for (int i = 0; i < CK_OPS_MAX_CLIENTS; i++) {
        drop(&o->clients[i]);
        ck_buf_release(&o->clients[i].out);
    }
    if (o->fd >= 0)
        close(o->fd);
    free(o);
}

int ck_ops_port(const struct ck_ops *o)
{
    return o->port;
}

int ck_ops_poll_fds(const struct ck_ops *o, struct pollfd *fds, int max)
{
    int n = 0;
    if (n < max)
        fds[n++] = (struct pollfd){o->fd, POLLIN, 0};
    for (int i = 0; i < CK_OPS_MAX_CLIENTS && n < max; i++)
        if (o->clients[i].fd >= 0)
            fds[n++] = (struct pollfd){o->clients[i].fd,
                                       (short)(o->clients[i].answering ? POLLOUT : POLLIN), 0};
    return n;
}

int64_t ck_ops_deadline_ms(const struct ck_ops *o)
{
    int64_t d = -1;
    for (int i = 0; i < CK_OPS_MAX_CLIENTS; i++)
        if (o->clients[i].fd >= 0 && (d < 0 || o->clients[i].deadline < d))
            d = o->clients[i].deadline;
    return d;
}

static void respond(struct client *c, int status, const char *reason, const char *type,
                    const char *body, size_t len, bool head)
{
    ck_buf_reset(&c->out);
    ck_buf_printf(&c->out,
                  "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                  "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
                  status, reason, type, len);
    if (!head)
        ck_buf_append(&c->out, body, len);
    c->answering = true;
    c->sent = 0;
}

static void text(struct client *c, int status, const char *reason, const char *msg, bool head)
{
    respond(c, status, reason, "text/plain; charset=utf-8", msg, strlen(msg), head);
}

static void serve(struct ck_ops *o, struct client *c)
{
    char method[8], target[256];
    /* "GET /path HTTP/1.1": anything else is a 400 */
    if (sscanf(c->req, "%7[A-Z] %255[^ \r\n] HTTP/1.%*1[01]\r", method, target) != 2) {
        text(c, 400, "Bad Request", "bad request\n", false);
        return;
    }
    bool head = !strcmp(method, "HEAD");
    if (strcmp(method, "GET") != 0 && !head) {
        text(c, 405, "Method Not Allowed", "only GET and HEAD\n", false);
        return;
    }
    char *q = strchr(target, '?');
    if (q)
        *q = '\0';
    struct ck_buf b = CK_BUF_INIT;
    if (!strcmp(target, "/healthz")) {
        text(c, 200, "OK", "ok\n", head);
    } else if (!strcmp(target, "/readyz")) {
        bool ready = !o->cb.ready || o->cb.ready(o->cb.ctx, &b);
        if (ready) {
            text(c, 200, "OK", "ready\n", head);
        } else {
            struct ck_buf m = CK_BUF_INIT;
            ck_buf_printf(&m, "not ready: %s\n", b.len ? ck_buf_str(&b) : "starting");
            text(c, 503, "Service Unavailable", ck_buf_str(&m), head);
            ck_buf_release(&m);
        }
    } else if (!strcmp(target, "/metrics")) {
        if (ck_metrics_render(&b) < 0)
            text(c, 500, "Internal Server Error", "metrics unavailable\n", head);
        else
            respond(c, 200, "OK", CK_METRICS_CONTENT_TYPE, b.data, b.len, head);
    } else if (!strcmp(target, "/status")) {
        struct ck_json j;
        ck_json_init(&j, &b, true);
        ck_json_begin_object(&j);
        ck_json_kstr(&j, "version", CKPTD_VERSION);
        ck_json_kint(&j, "pid", (int64_t)getpid());
        ck_json_kint(&j, "uptime_seconds", (ck_mono_ms() - o->started) / 1000);
        if (o->cb.status && o->cb.status(o->cb.ctx, &j) < 0)
            j.err = j.err ? j.err : CK_ERR;
        ck_json_end_object(&j);
        if (ck_json_error(&j) < 0) {
            text(c, 500, "Internal Server Error", "status unavailable\n", head);
        } else {
            ck_buf_putc(&b, '\n');
            respond(c, 200, "OK", "application/json", b.data, b.len, head);
        }
    } else {
        text(c, 404, "Not Found", "not found: try /healthz /readyz /metrics /status\n", head);
    }
    ck_buf_release(&b);
}

static void accept_clients(struct ck_ops *o)
{
    for (;;) {
        int slot = -1;
        for (int i = 0; i < CK_OPS_MAX_CLIENTS && slot < 0; i++)
            if (o->clients[i].fd < 0)
                slot = i;
        if (slot < 0)
            return; /* full: the rest wait in the backlog */
        int fd = accept4(o->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        struct client *c = &o->clients[slot];
        c->fd = fd;
        c->len = c->sent = 0;
        c->answering = false;
        c->deadline = ck_mono_ms() + CK_OPS_REQUEST_TIMEOUT_S * 1000;
    }
}

static void read_request(struct ck_ops *o, struct client *c)
{
    for (;;) {
        if (c->len >= CK_OPS_REQUEST_MAX) {
            text(c, 431, "Request Header Fields Too Large", "request too large\n", false);
            return;
        }
        ssize_t n = read(c->fd, c->req + c->len, CK_OPS_REQUEST_MAX - c->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            drop(c);
            return;
        }
        c->len += (size_t)n;
        c->req[c->len] = '\0';
        if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n")) {
            serve(o, c);
            return;
        }
    }
}

static void write_answer(struct client *c)
{
    while (c->sent < c->out.len) {
        ssize_t n =
            send(c->fd, c->out.data + c->sent, c->out.len - c->sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0)
            break;
        c->sent += (size_t)n;
    }
    drop(c);
}

void ck_ops_step(struct ck_ops *o)
{
    accept_clients(o);
    int64_t now = ck_mono_ms();
    for (int i = 0; i < CK_OPS_MAX_CLIENTS; i++) {
        struct client *c = &o->clients[i];
        if (c->fd < 0)
            continue;
        if (!c->answering)
            read_request(o, c);
        if (c->fd >= 0 && c->answering)
            write_answer(c);
        if (c->fd >= 0 && now >= c->deadline) {
            if (!c->answering) {
                text(c, 408, "Request Timeout", "request timeout\n", false);
                write_answer(c);
            }
            drop(c); /* a reader that does not read its answer loses it */
        }
    }
}
