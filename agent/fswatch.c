#include "agent/fswatch.h"
#include "agent/pathmap.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define MAX_DEPTH 32
#define DIR_MASK                                                                                   \
    (IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_ONLYDIR |           \
     IN_DONT_FOLLOW | IN_EXCL_UNLINK)
#define CKPTD_MASK (IN_CLOSE_WRITE | IN_MOVED_TO | IN_ONLYDIR | IN_DONT_FOLLOW)

struct wdent {
    int wd;
    char *rel; /* owned; "" for the root */
};

struct polled {
    char *rel;   /* owned */
    bool primed; /* walked once: later walks report what changed */
};

struct snap {
    struct ck_pathmap_entry e;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    unsigned gen;
};

struct ck_fswatch {
    struct ck_loop *loop;
    char *root;
    struct ck_fswatch_cb cb;
    void *arg;
    int ifd;
    int ckptd_wd;
    struct ck_loop_handler *ih, *poll_timer;
    struct wdent *wds; /* sorted by wd (inotify hands them out increasing) */
    size_t nwds, capwds;
    struct polled *polled;
    size_t npolled;
    double poll_interval;
    struct ck_pathmap snap;
    unsigned gen;
    bool exhausted_warned;
};

/* ---- filesystems ---- */

bool ck_fswatch_fs_is_remote(long f_type, const char **name)
{
    static const struct {
        unsigned long magic;
        const char *name;
    } remote[] = {
        {0x6969, "nfs"},           {0x0BD00BD0, "lustre"}, {0xFF534D42, "cifs"},
        {0xFE534D42, "smb2"},      {0x517B, "smb"},        {0x65735546, "fuse"},
        {0x01021997, "9p"},        {0x00C36400, "ceph"},   {0x5346414F, "afs"},
        {0x6B414653, "kafs"},      {0x47504653, "gpfs"},   {0x19830326, "fhgfs/beegfs"},
        {0x013111A8, "ibrix"},     {0x73757245, "coda"},   {0x564C, "ncp"},
    };
    for (size_t i = 0; i < sizeof remote / sizeof *remote; i++)
        if ((unsigned long)(unsigned int)f_type == remote[i].magic) {
            if (name)
                *name = remote[i].name;
            return true;
        }
    return false;
}

/* ---- the wd table ---- */

static struct wdent *wd_find(struct ck_fswatch *w, int wd)
{
    size_t lo = 0, hi = w->nwds;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (w->wds[mid].wd == wd)
            return &w->wds[mid];
        if (w->wds[mid].wd < wd)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int wd_put(struct ck_fswatch *w, int wd, const char *rel)
{
    char *copy = strdup(rel);
    if (!copy)
        return ck_error(CK_ENOMEM, "out of memory");
    struct wdent *e = wd_find(w, wd);
    if (e) { /* the same folder again (after an overflow), or a new path for it */
        free(e->rel);
        e->rel = copy;
        return 0;
    }
    if (w->nwds == w->capwds) {
        size_t cap = w->capwds ? w->capwds * 2 : 64;
        void *p = realloc(w->wds, cap * sizeof *w->wds);
        if (!p) {
            free(copy);
            return ck_error(CK_ENOMEM, "out of memory");
        }
        w->wds = p;
        w->capwds = cap;
    }
    size_t at = w->nwds;
    while (at > 0 && w->wds[at - 1].wd > wd)
        at--;
    memmove(&w->wds[at + 1], &w->wds[at], (w->nwds - at) * sizeof *w->wds);
    w->wds[at] = (struct wdent){wd, copy};
    w->nwds++;
    return 0;
}

static void wd_drop(struct ck_fswatch *w, int wd)
{
    struct wdent *e = wd_find(w, wd);
    if (!e)
        return;
    free(e->rel);
    size_t at = (size_t)(e - w->wds);
    memmove(&w->wds[at], &w->wds[at + 1], (w->nwds - at - 1) * sizeof *w->wds);
    w->nwds--;
}

static bool below(const char *rel, const char *dir)
{
    size_t n = strlen(dir);
    return !strncmp(rel, dir, n) && (rel[n] == '\0' || rel[n] == '/');
}

/* A folder moved away: its watches (and those below it) now name stale paths. */
static void unwatch_tree(struct ck_fswatch *w, const char *rel)
{
    for (size_t i = 0; i < w->nwds;) {
        if (below(w->wds[i].rel, rel)) {
            inotify_rm_watch(w->ifd, w->wds[i].wd);
            wd_drop(w, w->wds[i].wd);
        } else {
            i++;
        }
    }
}

/* ---- polling ---- */

static bool skipped(const char *rel)
{
    return !strcmp(rel, ".ckptd") || !strcmp(rel, "data/initialisation");
}

static void join_rel(char *out, size_t outsz, const char *dir, const char *name)
{
    if (dir[0])
        snprintf(out, outsz, "%s/%s", dir, name);
    else
        snprintf(out, outsz, "%s", name);
}

static void poll_walk(struct ck_fswatch *w, int dfd, const char *rel, bool report, int depth)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char sub[PATH_MAX];
        struct stat st;
        join_rel(sub, sizeof sub, rel, e->d_name);
        if (skipped(sub) || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            int fd = depth < MAX_DEPTH ? openat(dirfd(d), e->d_name,
                                                O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                                       : -1;
            if (fd >= 0)
                poll_walk(w, fd, sub, report, depth + 1);
            continue;
        }
        if (!S_ISREG(st.st_mode))
            continue;
        struct snap *s;
        bool created;
        if (ck_pathmap_put(&w->snap, sub, sizeof *s, (void **)&s, &created) < 0)
            continue;
        bool changed = created || s->dev != st.st_dev || s->ino != st.st_ino ||
                       s->size != st.st_size || s->mtime.tv_sec != st.st_mtim.tv_sec ||
                       s->mtime.tv_nsec != st.st_mtim.tv_nsec;
        s->dev = st.st_dev;
        s->ino = st.st_ino;
        s->size = st.st_size;
        s->mtime = st.st_mtim;
        s->gen = w->gen;
        if (changed && report)
            w->cb.changed(w->arg, sub);
    }
    closedir(d);
}

static void poll_tick(struct ck_loop *loop, void *arg)
{
    struct ck_fswatch *w = arg;
    (void)loop;
    w->gen++;
    for (size_t i = 0; i < w->npolled; i++) {
        char path[PATH_MAX];
        struct polled *p = &w->polled[i];
        if (ck_path_join(path, sizeof path, w->root, p->rel[0] ? p->rel : ".") < 0)
            continue;
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0)
            poll_walk(w, fd, p->rel, p->primed, 0);
        p->primed = true;
    }
    struct ck_pathmap_iter it;
    struct snap *s;
    ck_pathmap_iter_init(&it, &w->snap);
    while ((s = ck_pathmap_next(&it)))
        if (s->gen != w->gen) {
            w->cb.gone(w->arg, s->e.key, false);
            ck_pathmap_del(&w->snap, s->e.key);
        }
    if (w->cb.request)
        w->cb.request(w->arg); /* a request may come from another host */
}

static int start_polling(struct ck_fswatch *w, const char *rel, bool report)
{
    for (size_t i = 0; i < w->npolled; i++)
        if (below(rel, w->polled[i].rel))
            return 0;
    void *p = realloc(w->polled, (w->npolled + 1) * sizeof *w->polled);
    if (!p)
        return ck_error(CK_ENOMEM, "out of memory");
    w->polled = p;
    if (!(w->polled[w->npolled].rel = strdup(rel)))
        return ck_error(CK_ENOMEM, "out of memory");
    w->polled[w->npolled++].primed = report;
    if (w->poll_timer)
        return 0;
    return ck_loop_add_timer(w->loop, w->poll_interval, w->poll_interval, poll_tick, w,
                             &w->poll_timer);
}

/* ---- inotify ---- */

static void warn_exhausted(struct ck_fswatch *w, const char *rel)
{
    if (w->exhausted_warned)
        return;
    w->exhausted_warned = true;
    ck_warn("watch.exhausted",
            "no inotify watch left for '%s' (fs.inotify.max_user_watches, %zu in use here): "
            "polling what could not be watched every %.3gs; raise it with "
            "'sysctl fs.inotify.max_user_watches=N'",
            rel[0] ? rel : ".", w->nwds, w->poll_interval);
}

/* Watches the folder rel and everything below it; report: say what is in it
 * (a folder that appeared while we run). */
static int add_tree(struct ck_fswatch *w, const char *rel, bool report, dev_t parent_dev,
                    int depth)
{
    char path[PATH_MAX];
    struct stat st;
    int err;
    if ((err = ck_path_join(path, sizeof path, w->root, rel[0] ? rel : ".")) < 0)
        return err;
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return 0; /* gone already */
    if (fstat(dfd, &st) < 0) {
        close(dfd);
        return 0;
    }
    if (depth == 0 || st.st_dev != parent_dev) {
        struct statfs sf;
        const char *fs;
        if (fstatfs(dfd, &sf) == 0 && ck_fswatch_fs_is_remote((long)sf.f_type, &fs)) {
            ck_warn("watch.remote_fs",
                    "'%s' is on %s, which reports no writes made on other hosts: polling it "
                    "every %.3gs", rel[0] ? rel : ".", fs, w->poll_interval);
            close(dfd);
            return start_polling(w, rel, report);
        }
    }
    int wd = inotify_add_watch(w->ifd, path, DIR_MASK);
    if (wd < 0) {
        close(dfd);
        if (errno == ENOSPC) {
            warn_exhausted(w, rel);
            return start_polling(w, rel, report);
        }
        if (errno == ENOENT || errno == ENOTDIR)
            return 0;
        ck_warn("watch.failed", "cannot watch '%s': %s; polling it", path, strerror(errno));
        return start_polling(w, rel, report);
    }
    if ((err = wd_put(w, wd, rel)) < 0) {
        close(dfd);
        return err;
    }
    /* List it only now that the watch exists: whatever is written from here
     * on gives an event, and whatever was written before is listed. */
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return 0;
    }
    struct dirent *e;
    while (err == 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char sub[PATH_MAX];
        struct stat cst;
        join_rel(sub, sizeof sub, rel, e->d_name);
        if (skipped(sub) || fstatat(dirfd(d), e->d_name, &cst, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (S_ISDIR(cst.st_mode) && depth < MAX_DEPTH)
            err = add_tree(w, sub, report, st.st_dev, depth + 1);
        else if (S_ISREG(cst.st_mode) && report)
            w->cb.changed(w->arg, sub);
    }
    closedir(d);
    return err;
}

static void add_ckptd_watch(struct ck_fswatch *w)
{
    char path[PATH_MAX];
    if (ck_path_join(path, sizeof path, w->root, ".ckptd") < 0)
        return;
    w->ckptd_wd = inotify_add_watch(w->ifd, path, CKPTD_MASK);
    if (w->ckptd_wd < 0)
        ck_warn("watch.failed", "cannot watch '%s' for requests: %s", path, strerror(errno));
}

static void on_event(struct ck_fswatch *w, const struct inotify_event *ev)
{
    if (ev->mask & IN_Q_OVERFLOW) {
        ck_warn("watch.overflow", "the inotify queue overflowed: events were lost; rescanning");
        add_tree(w, "", false, 0, 0); /* folders created meanwhile get their watches */
        w->cb.rescan(w->arg);
        return;
    }
    if (ev->wd == w->ckptd_wd && w->ckptd_wd >= 0) {
        if (w->cb.request && ev->len && !strncmp(ev->name, "request.", 8))
            w->cb.request(w->arg);
        return;
    }
    struct wdent *we = wd_find(w, ev->wd);
    if (!we)
        return; /* a watch we dropped already */
    if (ev->mask & IN_IGNORED) {
        wd_drop(w, ev->wd);
        return;
    }
    if (!ev->len)
        return;
    char rel[PATH_MAX];
    join_rel(rel, sizeof rel, we->rel, ev->name);
    bool is_dir = ev->mask & IN_ISDIR;
    if (skipped(rel))
        return;
    ck_debug("watch.event", "path='%s' mask=0x%x", rel, ev->mask);
    if (is_dir) {
        if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
            add_tree(w, rel, true, 0, 1);
            if ((ev->mask & IN_MOVED_TO) && w->cb.dir_in)
                w->cb.dir_in(w->arg, rel);
        } else if (ev->mask & IN_MOVED_FROM) {
            unwatch_tree(w, rel);
            w->cb.gone(w->arg, rel, true);
        } else if (ev->mask & IN_DELETE) {
            w->cb.gone(w->arg, rel, true);
        }
        return;
    }
    if (ev->mask & (IN_CLOSE_WRITE | IN_MOVED_TO))
        w->cb.changed(w->arg, rel);
    else if (ev->mask & (IN_DELETE | IN_MOVED_FROM))
        w->cb.gone(w->arg, rel, false);
}

static void on_inotify(struct ck_loop *loop, int fd, uint32_t events, void *arg)
{
    struct ck_fswatch *w = arg;
    char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
    (void)loop;
    (void)events;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            return; /* EAGAIN: drained */
        }
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            on_event(w, ev);
            p += sizeof *ev + ev->len;
        }
    }
}

/* ---- lifecycle ---- */

int ck_fswatch_new(struct ck_fswatch **out, struct ck_loop *loop, const char *root,
                   bool force_poll, double poll_interval, const struct ck_fswatch_cb *cb,
                   void *arg)
{
    struct ck_fswatch *w = calloc(1, sizeof *w);
    int err = 0;
    if (!w || !(w->root = strdup(root))) {
        free(w);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    w->loop = loop;
    w->cb = *cb;
    w->arg = arg;
    w->ckptd_wd = -1;
    w->poll_interval = poll_interval > 0 ? poll_interval : 2.0;
    ck_pathmap_init(&w->snap, NULL);
    w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->ifd < 0) {
        ck_warn("watch.no_inotify", "inotify is not available (%s): polling every %.3gs",
                strerror(errno), w->poll_interval);
        force_poll = true;
    } else if ((err = ck_loop_add_fd(loop, w->ifd, EPOLLIN, on_inotify, w, &w->ih)) < 0) {
        goto fail;
    } else {
        add_ckptd_watch(w);
    }
    if (force_poll)
        err = start_polling(w, "", false);
    else
        err = add_tree(w, "", false, 0, 0);
    if (err < 0)
        goto fail;
    if (w->npolled)
        poll_tick(loop, w); /* the first walk: what is there now is not news */
    *out = w;
    return 0;
fail:
    ck_fswatch_free(w);
    return err;
}

void ck_fswatch_free(struct ck_fswatch *w)
{
    if (!w)
        return;
    ck_loop_remove(w->loop, w->ih);
    ck_loop_remove(w->loop, w->poll_timer);
    if (w->ifd >= 0)
        close(w->ifd);
    for (size_t i = 0; i < w->nwds; i++)
        free(w->wds[i].rel);
    free(w->wds);
    for (size_t i = 0; i < w->npolled; i++)
        free(w->polled[i].rel);
    free(w->polled);
    ck_pathmap_release(&w->snap);
    free(w->root);
    free(w);
}

int ck_fswatch_set_poll_interval(struct ck_fswatch *w, double seconds)
{
    if (seconds <= 0)
        return ck_error(CK_ECONFIG, "the poll interval must be positive");
    w->poll_interval = seconds;
    return w->poll_timer ? ck_loop_timer_set(w->loop, w->poll_timer, seconds, seconds) : 0;
}

const char *ck_fswatch_backend(const struct ck_fswatch *w)
{
    if (!w->npolled)
        return "inotify";
    return w->nwds ? "inotify+poll" : "poll";
}

size_t ck_fswatch_nwatches(const struct ck_fswatch *w)
{
    return w->nwds;
}

size_t ck_fswatch_npolled(const struct ck_fswatch *w)
{
    return w->npolled;
}
