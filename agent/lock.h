/* One ckptd per model directory: an flock on DIR/.ckptd/lock, held for the
 * life of the process (a scan, or a watcher). The file holds the holder's pid
 * so that the refusal can say who holds it. */
#ifndef CK_LOCK_H
#define CK_LOCK_H

struct ck_lock {
    int fd;
};

/* CK_ELOCKED (exit code 3) when another process holds it. */
int ck_lock_acquire(struct ck_lock *l, const char *model_dir);
void ck_lock_release(struct ck_lock *l);
/* The pid of the process holding DIR's lock: 0 when none does, -1 when it
 * is held but its pid is unknown. */
long ck_lock_holder(const char *model_dir);

#endif
