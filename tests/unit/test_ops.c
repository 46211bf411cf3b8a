/* agent/ops: the /healthz /readyz /metrics /status endpoint, served in-process
 * from a thread that runs the same poll + step loop the daemon runs, and
 * scraped with the real curl binary and with raw sockets. */
#include "test_main.h"

#include "agent/ops.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

struct server {
    struct ck_ops *ops;
    pthread_t thread;
    atomic_bool stop;
    atomic_bool ready;
};

static bool ready_cb(void *ctx, struct ck_buf *why)
{
    struct server *s = ctx;
    if (!atomic_load(&s->ready))
        ck_buf_puts(why, "queue unreachable");
    return atomic_load(&s->ready);
}

static int status_cb(void *ctx, struct ck_json *j)
{
    ck_json_kstr(j, "model", "unit \"test\"");
    ck_json_kint(j, "checkpoints", 3);
    return 0;
}

static void *loop(void *p)
{
    struct server *s = p;
    while (!atomic_load(&s->stop)) {
        struct pollfd fds[CK_OPS_MAX_CLIENTS + 1];
        int n = ck_ops_poll_fds(s->ops, fds, CK_OPS_MAX_CLIENTS + 1);
        poll(fds, (nfds_t)n, 50);
        ck_ops_step(s->ops);
    }
    return NULL;
}

static struct server *start(void)
{
    static struct server s;
    memset(&s, 0, sizeof s);
    atomic_store(&s.ready, true);
    struct ck_ops_callbacks cb = {ready_cb, status_cb, &s};
    assert_int_equal(ck_ops_new("127.0.0.1:0", &cb, &s.ops), 0);
    assert_true(ck_ops_port(s.ops) > 0);
    assert_int_equal(pthread_create(&s.thread, NULL, loop, &s), 0);
    return &s;
}

static void stop(struct server *s)
{
    atomic_store(&s->stop, true);
    pthread_join(s->thread, NULL);
    ck_ops_free(s->ops);
}

/* Runs curl on path; the body goes to a file read back into body, the
 * status code is returned. */
static int curl_get(struct server *s, const char *path, const char *extra, struct ck_buf *body)
{
    char dir[4096], out[4200], cmd[9000];
    ck_test_tmpdir(dir, "ops");
    snprintf(out, sizeof out, "%s/body", dir);
    snprintf(
        cmd, sizeof cmd,
        "curl -s -o '%s' -w '%%{http_code}' --max-time 10 %s 'http://127.0.0.1:%d%s' > '%s.code'",
        out, extra, ck_ops_port(s->ops), path, out);
    assert_int_equal(system(cmd), 0);
    ck_buf_reset(body);
    assert_int_equal(ck_read_file(out, 1 << 20, body), 0);
    struct ck_buf code = CK_BUF_INIT;
    snprintf(cmd, sizeof cmd, "%s.code", out);
    assert_int_equal(ck_read_file(cmd, 64, &code), 0);
    int c = atoi(ck_buf_str(&code));
    ck_buf_release(&code);
    return c;
}

static void healthz_and_readyz(void **state)
{
    struct server *s = start();
    struct ck_buf b = CK_BUF_INIT;
    assert_int_equal(curl_get(s, "/healthz", "", &b), 200);
    assert_string_equal(ck_buf_str(&b), "ok\n");
    assert_int_equal(curl_get(s, "/readyz", "", &b), 200);
    atomic_store(&s->ready, false);
    assert_int_equal(curl_get(s, "/readyz", "", &b), 503);
    assert_non_null(strstr(ck_buf_str(&b), "queue unreachable"));
    assert_int_equal(curl_get(s, "/nope", "", &b), 404);
    assert_int_equal(curl_get(s, "/healthz", "-X POST -d x=1", &b), 405);
    ck_buf_release(&b);
    stop(s);
}

static void metrics_are_prometheus_text(void **state)
{
    struct server *s = start();
    ck_metrics_reset();
    ck_metrics_add(CK_M_CHECKPOINTS_REGISTERED, 4);
    ck_metrics_set(CK_M_UPLOAD_QUEUE_DEPTH, 2);
    ck_metrics_observe(CK_H_UPLOAD_SECONDS, 1.5);
    char dir[4096], path[4200], cmd[9000];
    ck_test_tmpdir(dir, "ops");
    snprintf(path, sizeof path, "%s/metrics.txt", dir);
    snprintf(cmd, sizeof cmd,
             "curl -sf --max-time 10 -D '%s.h' -o '%s' http://127.0.0.1:%d/metrics", path, path,
             ck_ops_port(s->ops));
    assert_int_equal(system(cmd), 0);
    /* parsed by an independent reader of the text format: every sample line
     * is NAME{LABELS} VALUE with a float value, every family has HELP and TYPE */
    snprintf(
        cmd, sizeof cmd,
        "/usr/bin/python3 - '%s' <<'PY'\n"
        "import re, sys\n"
        "fam, types, samples = set(), {}, {}\n"
        "for line in open(sys.argv[1]):\n"
        "    line = line.rstrip('\\n')\n"
        "    if line.startswith('# HELP '): fam.add(line.split()[2]); continue\n"
        "    if line.startswith('# TYPE '): types[line.split()[2]] = line.split()[3]; continue\n"
        "    m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\\{[^}]*\\})? (\\S+)', line)\n"
        "    assert m, line\n"
        "    samples[m.group(1) + (m.group(2) or '')] = float(m.group(3))\n"
        "assert fam == set(types), (fam ^ set(types))\n"
        "assert samples['ckptd_checkpoints_registered_total'] == 4\n"
        "assert samples['ckptd_upload_queue_depth'] == 2\n"
        "assert samples['ckptd_upload_duration_seconds_bucket{le=\"2.5\"}'] == 1\n"
        "assert samples['ckptd_upload_duration_seconds_bucket{le=\"1\"}'] == 0\n"
        "assert types['ckptd_upload_duration_seconds'] == 'histogram'\n"
        "assert all(k.startswith('ckptd_') for k in samples)\n"
        "PY",
        path);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "grep -qi '^content-type: text/plain; version=0.0.4' '%s.h'", path);
    assert_int_equal(system(cmd), 0);
    stop(s);
}

static void status_is_json(void **state)
{
    struct server *s = start();
    struct ck_buf b = CK_BUF_INIT;
    assert_int_equal(curl_get(s, "/status", "", &b), 200);
    char dir[4096], path[4200], cmd[9000];
    ck_test_tmpdir(dir, "ops");
    snprintf(path, sizeof path, "%s/status.json", dir);
    assert_int_equal(ck_write_file_atomic(path, b.data, b.len, 0644), 0);
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
             "assert d[\"model\"] == \"unit \\\"test\\\"\" and d[\"checkpoints\"] == 3 "
             "and d[\"uptime_seconds\"] >= 0 and d[\"pid\"] > 0, d' '%s'",
             path);
    assert_int_equal(system(cmd), 0);
    ck_buf_release(&b);
    stop(s);
}

static int raw_connect(struct server *s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)ck_ops_port(s->ops));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static size_t read_all(int fd, char *buf, size_t max)
{
    size_t got = 0;
    ssize_t n;
    while (got < max - 1 && (n = read(fd, buf + got, max - 1 - got)) > 0)
        got += (size_t)n;
    buf[got] = '\0';
    return got;
}

static void bad_requests_are_bounded(void **state)
{
    struct server *s = start();
    char buf[4096];
    /* an endless header is cut at the request limit */
    int fd = raw_connect(s);
    char junk[1024];
    memset(junk, 'a', sizeof junk);
    assert_int_equal(write(fd, "GET /metrics HTTP/1.1\r\nX-A: ", 28), 28);
    for (int i = 0; i < 16; i++)
        if (write(fd, junk, sizeof junk) < 0)
            break;
    read_all(fd, buf, sizeof buf);
    assert_true(!strncmp(buf, "HTTP/1.1 431 ", 13));
    close(fd);
    /* garbage is a 400 */
    fd = raw_connect(s);
    assert_int_equal(write(fd, "HELLO\r\n\r\n", 9), 9);
    read_all(fd, buf, sizeof buf);
    assert_true(!strncmp(buf, "HTTP/1.1 400 ", 13));
    close(fd);
    /* a client that says nothing is dropped after the request timeout, and
     * meanwhile others are served */
    int idle = raw_connect(s);
    struct ck_buf b = CK_BUF_INIT;
    assert_int_equal(curl_get(s, "/healthz", "", &b), 200);
    ck_buf_release(&b);
    read_all(idle, buf, sizeof buf);
    assert_true(!strncmp(buf, "HTTP/1.1 408 ", 13));
    close(idle);
    /* HEAD has headers only */
    fd = raw_connect(s);
    const char *head = "HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(write(fd, head, strlen(head)), (ssize_t)strlen(head));
    read_all(fd, buf, sizeof buf);
    assert_true(!strncmp(buf, "HTTP/1.1 200 ", 13));
    assert_non_null(strstr(buf, "Content-Length: 3\r\n"));
    assert_true(strlen(buf) == (size_t)(strstr(buf, "\r\n\r\n") - buf) + 4);
    close(fd);
    stop(s);
}

static void listen_addresses(void **state)
{
    char host[64];
    int port;
    assert_int_equal(ck_ops_parse_listen("127.0.0.1:9464", "listen", host, sizeof host, &port), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 9464);
    assert_int_equal(ck_ops_parse_listen("9100", "listen", host, sizeof host, &port), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 9100);
    assert_int_equal(ck_ops_parse_listen("[::1]:80", "listen", host, sizeof host, &port), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(ck_ops_parse_listen("localhost:1", "listen", host, sizeof host, &port), 0);
    assert_string_equal(host, "127.0.0.1");
    static const char *bad[] = {"127.0.0.1:",   "127.0.0.1:70000", ":80", "example.com:80",
                                "127.0.0.1:8o", "[::1]80",         ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(ck_ops_parse_listen(bad[i], "listen", host, sizeof host, &port),
                         CK_ECONFIG);
    /* a port in use is an error, not a silent second listener */
    struct ck_ops *a, *b;
    assert_int_equal(ck_ops_new("127.0.0.1:0", NULL, &a), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ck_ops_port(a));
    assert_int_equal(ck_ops_new(addr, NULL, &b), CK_EIO);
    ck_ops_free(a);
}

int main(int argc, char **argv);
static const struct CMUnitTest tests[] = {
    cmocka_unit_test(healthz_and_readyz), cmocka_unit_test(metrics_are_prometheus_text),
    cmocka_unit_test(status_is_json),     cmocka_unit_test(bad_requests_are_bounded),
    cmocka_unit_test(listen_addresses),
};
CK_TEST_MAIN(tests)
