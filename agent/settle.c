#include "agent/settle.h"
#include "agent/loop.h"
#include "agent/pathmap.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A file held open for writing is looked at again after this long at least. */
#define WRITER_RECHECK 0.25

struct entry {
    struct ck_pathmap_entry e;
    bool settled;
    bool has_stat;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    double due; /* monotonic seconds */
    bool writer; /* was open for writing at the last look */
};

struct ck_settle {
    char *root;
    double window;
    bool check_writers;
    struct ck_pathmap map;
    size_t npending;
};

int ck_settle_new(struct ck_settle **out, const char *root, double window, bool check_writers)
{
    struct ck_settle *s = calloc(1, sizeof *s);
    if (!s || !(s->root = strdup(root))) {
        free(s);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    ck_pathmap_init(&s->map, NULL);
    ck_settle_configure(s, window, check_writers);
    /* A lease broken while we hold it (microseconds) sends SIGIO: not a reason to die. */
    signal(SIGIO, SIG_IGN);
    *out = s;
    return 0;
}

void ck_settle_free(struct ck_settle *s)
{
    if (!s)
        return;
    ck_pathmap_release(&s->map);
    free(s->root);
    free(s);
}

void ck_settle_configure(struct ck_settle *s, double window, bool check_writers)
{
    s->window = window;
    s->check_writers = check_writers;
}

static double ts_seconds(struct timespec t)
{
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* When a file with this mtime has been unchanged for the window. A future
 * mtime (clock skew on a network filesystem) counts as now. */
static double due_for(const struct ck_settle *s, struct timespec mtime, double now)
{
    double age = ck_wall_s() - ts_seconds(mtime);
    if (age < 0)
        age = 0;
    double wait = s->window - age;
    return now + (wait > 0 ? wait : 0);
}

static int stat_rel(const struct ck_settle *s, const char *rel, struct stat *st)
{
    char path[PATH_MAX];
    if (ck_path_join(path, sizeof path, s->root, rel) < 0)
        return -1;
    return lstat(path, st) == 0 && S_ISREG(st->st_mode) ? 0 : -1;
}

static bool same(const struct entry *e, const struct stat *st)
{
    return e->has_stat && e->dev == st->st_dev && e->ino == st->st_ino &&
           e->size == st->st_size && e->mtime.tv_sec == st->st_mtim.tv_sec &&
           e->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

static void take_stat(struct entry *e, const struct stat *st)
{
    e->has_stat = true;
    e->dev = st->st_dev;
    e->ino = st->st_ino;
    e->size = st->st_size;
    e->mtime = st->st_mtim;
}

static int touch_stat(struct ck_settle *s, const char *rel, const struct stat *st)
{
    struct entry *e;
    bool created;
    int err = ck_pathmap_put(&s->map, rel, sizeof *e, (void **)&e, &created);
    if (err < 0)
        return err;
    if (created || e->settled)
        s->npending++;
    e->settled = false;
    e->writer = false;
    if (st) {
        take_stat(e, st);
        e->due = due_for(s, st->st_mtim, ck_mono_s());
    } else {
        e->has_stat = false;
        e->due = ck_mono_s() + s->window;
    }
    return 0;
}

int ck_settle_touch(struct ck_settle *s, const char *rel)
{
    struct stat st;
    if (stat_rel(s, rel, &st) < 0) {
        ck_settle_forget(s, rel); /* gone already, or not a file */
        return 0;
    }
    return touch_stat(s, rel, &st);
}

void ck_settle_forget(struct ck_settle *s, const char *rel)
{
    struct ck_pathmap_iter it;
    struct entry *e;
    size_t n = strlen(rel);
    ck_pathmap_iter_init(&it, &s->map);
    while ((e = ck_pathmap_next(&it)))
        if (!strncmp(e->e.key, rel, n) && (e->e.key[n] == '\0' || e->e.key[n] == '/')) {
            if (!e->settled) {
                s->npending--;
                ck_debug("file.forgotten", "path='%s': gone before it settled", e->e.key);
            }
            ck_pathmap_del(&s->map, e->e.key);
        }
}

/* ---- who has a file open for writing ---- */

struct probe {
    struct entry **items; /* borrowed */
    size_t n;
};

static bool fd_writable(int fdinfo_dir, const char *fdname)
{
    char buf[512];
    if (ck_read_small_at(fdinfo_dir, fdname, false, buf, sizeof buf) < 0)
        return false;
    const char *f = strstr(buf, "flags:");
    if (!f)
        return false;
    unsigned long flags = strtoul(f + 6, NULL, 8);
    return (flags & O_ACCMODE) == O_WRONLY || (flags & O_ACCMODE) == O_RDWR;
}

/* The cheap, exact test: the kernel grants a read lease (F_SETLEASE F_RDLCK)
 * only on a file that nobody has open for writing, in any process or PID
 * namespace. 1: a writer, 0: none, -1: cannot tell (not our file and no
 * CAP_LEASE, leases disabled, a network filesystem): ask /proc instead.
 * The lease is dropped at once; a writer opening it meanwhile would make the
 * kernel send SIGIO, which the watcher ignores (ck_settle_new). */
static int lease_says(int dirfd, const char *rel)
{
    int fd = openat(dirfd, rel, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return -1;
    int r = -1;
    if (fcntl(fd, F_SETLEASE, F_RDLCK) == 0) {
        fcntl(fd, F_SETLEASE, F_UNLCK);
        r = 0;
    } else if (errno == EAGAIN || errno == EBUSY) {
        r = 1;
    }
    close(fd);
    return r;
}

/* Marks e->writer for every probe entry some process has open for writing. */
static void scan_proc(struct probe *p)
{
    DIR *proc = opendir("/proc");
    if (!proc)
        return;
    pid_t self = getpid();
    struct dirent *d;
    while ((d = readdir(proc))) {
        if (!isdigit((unsigned char)d->d_name[0]) || atol(d->d_name) == self)
            continue;
        char path[300];
        snprintf(path, sizeof path, "/proc/%s/fd", d->d_name);
        int fdd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fdd < 0)
            continue; /* gone, or not ours to read */
        DIR *fds = fdopendir(fdd);
        if (!fds) {
            close(fdd);
            continue;
        }
        int infod = -1;
        struct dirent *f;
        while ((f = readdir(fds))) {
            struct stat st;
            if (f->d_name[0] == '.' || fstatat(dirfd(fds), f->d_name, &st, 0) < 0 ||
                !S_ISREG(st.st_mode))
                continue;
            for (size_t i = 0; i < p->n; i++) {
                struct entry *e = p->items[i];
                if (e->writer || e->dev != st.st_dev || e->ino != st.st_ino)
                    continue;
                if (infod < 0) {
                    snprintf(path, sizeof path, "/proc/%s/fdinfo", d->d_name);
                    infod = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                }
                if (infod >= 0 && fd_writable(infod, f->d_name))
                    e->writer = true;
            }
        }
        if (infod >= 0)
            close(infod);
        closedir(fds);
    }
    closedir(proc);
}

bool ck_settle_has_writer(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return false;
    int says = lease_says(AT_FDCWD, path);
    if (says >= 0)
        return says == 1;
    struct entry e = {0};
    take_stat(&e, &st);
    struct entry *items[] = {&e};
    struct probe p = {items, 1};
    scan_proc(&p);
    return e.writer;
}

/* ---- checking what is due ---- */

int ck_settle_check(struct ck_settle *s, double now, size_t *nsettled, double *next)
{
    struct ck_pathmap_iter it;
    struct entry *e;
    struct probe p = {NULL, 0};
    *nsettled = 0;
    *next = -1;
    if (s->npending && !(p.items = calloc(s->npending, sizeof *p.items)))
        return ck_error(CK_ENOMEM, "out of memory");
    ck_pathmap_iter_init(&it, &s->map);
    while ((e = ck_pathmap_next(&it))) {
        if (e->settled || e->due > now)
            continue;
        struct stat st;
        if (stat_rel(s, e->e.key, &st) < 0) {
            ck_debug("file.forgotten", "path='%s': gone before it settled", e->e.key);
            s->npending--;
            ck_pathmap_del(&s->map, e->e.key);
            continue;
        }
        if (!same(e, &st)) {
            take_stat(e, &st);
            e->due = due_for(s, st.st_mtim, now);
            if (e->due > now)
                continue; /* changed: wait the window again */
        }
        e->writer = false;
        if (p.n < s->npending)
            p.items[p.n++] = e;
    }
    if (p.n && s->check_writers) {
        /* leases answer most; /proc is read only for what they could not */
        struct probe rest = {p.items, 0};
        int root = open(s->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        for (size_t i = 0; i < p.n; i++) {
            int says = root >= 0 ? lease_says(root, p.items[i]->e.key) : -1;
            if (says < 0) {
                struct entry *tmp = p.items[rest.n];
                p.items[rest.n++] = p.items[i];
                p.items[i] = tmp;
            } else {
                p.items[i]->writer = says == 1;
            }
        }
        if (root >= 0)
            close(root);
        if (rest.n)
            scan_proc(&rest);
    }
    for (size_t i = 0; i < p.n; i++) {
        e = p.items[i];
        if (e->writer) {
            double wait = s->window > WRITER_RECHECK ? s->window : WRITER_RECHECK;
            e->due = now + wait;
            ck_debug("file.open_for_writing", "path='%s': a process still writes it", e->e.key);
            continue;
        }
        e->settled = true;
        s->npending--;
        (*nsettled)++;
        ck_debug("file.settled", "path='%s' bytes=%lld", e->e.key, (long long)e->size);
    }
    free(p.items);
    ck_pathmap_iter_init(&it, &s->map);
    while ((e = ck_pathmap_next(&it)))
        if (!e->settled && (*next < 0 || e->due - now < *next))
            *next = e->due > now ? e->due - now : 0;
    return 0;
}

bool ck_settle_is_settled(struct ck_settle *s, const char *rel)
{
    struct entry *e = ck_pathmap_get(&s->map, rel);
    struct stat st;
    if (stat_rel(s, rel, &st) < 0) {
        if (e)
            ck_settle_forget(s, rel);
        return false;
    }
    if (e && e->settled && same(e, &st))
        return true;
    if (e && !e->settled)
        return false; /* pending: its due time stands */
    touch_stat(s, rel, &st);
    return false;
}

void ck_settle_each(const struct ck_settle *s, void (*fn)(void *arg, const char *rel), void *arg)
{
    struct ck_pathmap_iter it;
    struct entry *e;
    ck_pathmap_iter_init(&it, &s->map);
    while ((e = ck_pathmap_next(&it)))
        fn(arg, e->e.key);
}

size_t ck_settle_npending(const struct ck_settle *s)
{
    return s->npending;
}

size_t ck_settle_nsettled(const struct ck_settle *s)
{
    return s->map.n - s->npending;
}
