#include "agent/control.h"
#include "agent/lock.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "writers/pmf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

/* ---- the watcher's side ---- */

static void reply(const struct ck_control *c, const char *pid, const char *text)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/.ckptd/reply.%s", c->dir, pid);
    if (ck_write_file_atomic(path, text, strlen(text), 0600) < 0)
        ck_err("request.reply_failed", "%s", ck_error_msg());
}

static void handle_request(const struct ck_control *c, int dfd, const char *name)
{
    const char *pid = name + 8;
    char buf[64] = "";
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    unlinkat(dfd, name, 0);
    buf[n > 0 ? n : 0] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    enum ck_pmf_status to;
    if (ck_pmf_status_parse(buf, &to) < 0 || (to != CK_PMF_FINISHED && to != CK_PMF_FAILED)) {
        reply(c, pid, "error the request must be 'finished' or 'failed'\n");
        return;
    }
    ck_info("request.received", "from pid %s: end the training as %s", pid, buf);
    char reached[64] = "", text[2048];
    int err = c->end(c->arg, (int)to, reached, sizeof reached);
    if (err < 0)
        snprintf(text, sizeof text, "error %s\n", ck_error_msg());
    else
        snprintf(text, sizeof text, "ok %s\n", reached);
    reply(c, pid, text);
}

void ck_control_serve(const struct ck_control *c)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/.ckptd", c->dir);
    DIR *d = opendir(path);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) && !(c->stop && *c->stop)) {
        const char *p = e->d_name;
        if (strncmp(p, "request.", 8) || !p[8] || strspn(p + 8, "0123456789") != strlen(p + 8))
            continue;
        handle_request(c, dirfd(d), p);
    }
    closedir(d);
}

/* ---- the client's side ---- */

/* 1: no answer yet; 0: "ok ..."; CK_ESTATE: "error ...". */
static int read_answer(const char *path, char *answer, size_t answersz)
{
    struct ck_buf b = CK_BUF_INIT;
    if (ck_read_file(path, 4096, &b) < 0) {
        ck_buf_release(&b);
        return 1;
    }
    unlink(path);
    char s[2048];
    snprintf(s, sizeof s, "%s", ck_buf_str(&b));
    s[strcspn(s, "\n")] = '\0';
    bool ok = !strncmp(s, "ok ", 3);
    snprintf(answer, answersz, "%s", s + (ok ? 3 : strncmp(s, "error ", 6) ? 0 : 6));
    ck_buf_release(&b);
    return ok ? 0 : ck_error(CK_ESTATE, "%s", answer);
}

int ck_control_request(const char *dir, int status, double timeout, char *answer,
                       size_t answersz)
{
    char req[PATH_MAX], rep[PATH_MAX];
    const char *word = ck_pmf_status_name((enum ck_pmf_status)status);
    long pid = (long)getpid();
    int err;
    snprintf(req, sizeof req, "%s/.ckptd/request.%ld", dir, pid);
    snprintf(rep, sizeof rep, "%s/.ckptd/reply.%ld", dir, pid);
    unlink(rep);
    char text[32];
    snprintf(text, sizeof text, "%s\n", word);
    if ((err = ck_write_file_atomic(req, text, strlen(text), 0600)) < 0)
        return err;
    double end = ck_mono_s() + timeout;
    while (ck_mono_s() < end) {
        if ((err = read_answer(rep, answer, answersz)) != 1)
            return err;
        if (ck_lock_holder(dir) == 0)
            break; /* no watcher (any more) */
        usleep(10000);
    }
    if (unlink(req) < 0 && errno == ENOENT) {
        /* taken meanwhile: give the answer a last moment */
        for (int i = 0; i < 100; i++) {
            if ((err = read_answer(rep, answer, answersz)) != 1)
                return err;
            usleep(10000);
        }
    }
    return ck_error(CK_ENOENT, "no watcher answered for '%s'", dir);
}
