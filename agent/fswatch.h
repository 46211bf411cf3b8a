/* Noticing changes under a training directory: recursive inotify watches,
 * and polling where inotify cannot see (network filesystems, --poll, no
 * watch left under fs.inotify.max_user_watches).
 *
 * inotify: every folder gets a watch (IN_CLOSE_WRITE, IN_MOVED_TO/FROM,
 * IN_CREATE, IN_DELETE); a new folder is listed right after its watch is
 * added, so nothing written into it before the watch existed is missed;
 * IN_Q_OVERFLOW asks for a full rescan; events of unknown watches are
 * dropped. DIR/.ckptd gets a watch of its own (requests from `ckptd status`)
 * and DIR/data/initialisation none.
 *
 * Polling: the polled subtrees are walked every poll interval and compared
 * with the previous walk (size, mtime, inode). A subtree on NFS, Lustre,
 * CIFS/SMB, FUSE, 9p, Ceph or AFS (statfs) is polled: those deliver no
 * inotify events for writes made on other hosts. */
#ifndef CK_FSWATCH_H
#define CK_FSWATCH_H

#include "agent/loop.h"

#include <stdbool.h>
#include <stddef.h>

struct ck_fswatch_cb {
    /* rel (relative to the root) was written: closed after writing, moved in,
     * found in a new folder, or changed between two polls. */
    void (*changed)(void *arg, const char *rel);
    /* rel was deleted or moved away (is_dir: with everything below it). */
    void (*gone)(void *arg, const char *rel, bool is_dir);
    /* the folder rel was renamed into place (a complete folder checkpoint). */
    void (*dir_in)(void *arg, const char *rel);
    /* events were lost: everything must be looked at again. */
    void (*rescan)(void *arg);
    /* something was written into DIR/.ckptd. */
    void (*request)(void *arg);
};

struct ck_fswatch;

/* Watches root (copied) from the loop (borrowed, must outlive the watch).
 * force_poll: poll everything. What exists already is not reported. */
int ck_fswatch_new(struct ck_fswatch **out, struct ck_loop *loop, const char *root,
                   bool force_poll, double poll_interval, const struct ck_fswatch_cb *cb,
                   void *arg);
void ck_fswatch_free(struct ck_fswatch *w);
int ck_fswatch_set_poll_interval(struct ck_fswatch *w, double seconds);

/* "inotify", "poll" or "inotify+poll". */
const char *ck_fswatch_backend(const struct ck_fswatch *w);
size_t ck_fswatch_nwatches(const struct ck_fswatch *w);
size_t ck_fswatch_npolled(const struct ck_fswatch *w);

/* Exposed for tests: whether statfs's f_type is a network or FUSE filesystem
 * (name set to its name when it is). */
bool ck_fswatch_fs_is_remote(long f_type, const char **name);

#endif
