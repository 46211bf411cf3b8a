/* libFuzzer: what reaches the watcher from other processes: an HTTP request
 * on the ops endpoint (/healthz /readyz /metrics /status, over a real
 * loopback socket to a real ck_ops, in one or two writes), and a control
 * request file (`ckptd status DIR --finished|--failed`). Every request gets
 * an HTTP answer with a status line, or a reply file saying ok or error. */
#include "fuzz_common.h"
#include "agent/control.h"
#include "agent/ops.h"
#include "common/log.h"
#include "writers/pmf.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>

static struct ck_ops *ops;
static int ended;

static int end_training(void *arg, int status, char *answer, size_t answersz)
{
    (void)arg;
    ended++;
    snprintf(answer, answersz, "%s", status == CK_PMF_FAILED ? "failed" : "finished");
    return 0;
}

static void http_request(const uint8_t *data, size_t size)
{
    int port = ck_ops_port(ops);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {1, 0};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        /* loopback's ports run out after some 10^5 connections: not the server's fault */
        if (fd >= 0)
            close(fd);
        return;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t half = size ? data[0] % (size + 1) : 0;
    if (half && send(fd, data, half, MSG_NOSIGNAL) < 0)
        abort();
    ck_ops_step(ops); /* the first part alone */
    if (size > half && send(fd, data + half, size - half, MSG_NOSIGNAL) < 0)
        abort();
    shutdown(fd, SHUT_WR);
    char answer[512];
    size_t got = 0;
    for (int i = 0; i < 50 && got < sizeof answer - 1; i++) {
        ck_ops_step(ops);
        ssize_t n = recv(fd, answer + got, sizeof answer - 1 - got, MSG_DONTWAIT);
        if (n > 0)
            got += (size_t)n;
        else if (n == 0)
            break;
    }
    answer[got] = '\0';
    /* the request ended (a read of 0): answered, or dropped with nothing */
    if (got && strncmp(answer, "HTTP/1.1 ", 9))
        abort();
    close(fd);
    for (int i = 0; i < 4; i++)
        ck_ops_step(ops); /* the server side closes */
}

static void control_request(const uint8_t *data, size_t size)
{
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/run", ck_fuzz_dir());
    snprintf(path, sizeof path, "%s/.ckptd", dir);
    mkdir(dir, 0700);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/.ckptd/request.42", dir);
    ck_fuzz_write(path, data, size);
    struct ck_control c = {dir, end_training, NULL, NULL};
    ck_control_serve(&c);
    snprintf(path, sizeof path, "%s/.ckptd/reply.42", dir);
    FILE *f = fopen(path, "r");
    char reply[64] = "";
    if (!f || !fgets(reply, sizeof reply, f))
        abort(); /* every request is answered */
    fclose(f);
    unlink(path);
    if (strncmp(reply, "ok ", 3) && strncmp(reply, "error ", 6))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ops) {
        struct ck_ops_callbacks cb = {0};
        ck_log_setup(CK_LOG_TEXT, CK_LOG_ERROR, stderr); /* not a line per request */
        if (ck_ops_new("127.0.0.1:0", &cb, &ops) < 0)
            abort();
    }
    if (size && data[0] & 0x80)
        control_request(data + 1, size - 1);
    else
        http_request(data, size);
    ck_error_clear();
    return 0;
}
