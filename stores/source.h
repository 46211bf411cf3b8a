/* The local file a store sends in one piece (HTTP, SFTP): opened and checked
 * against what was queued, its SHA-256 taken from the agent's hash cache or
 * (upload.sha256: always) computed on a second core while the bytes go out,
 * and checked again afterwards: a file that changed while it was sent is an
 * error, never a silently different remote copy. The servers cannot check a
 * SHA-256, so it is only recorded; on two cores computing it took as much
 * CPU as the transfer and nginx together. */
#ifndef CK_STORE_SOURCE_H
#define CK_STORE_SOURCE_H

#include "common/hash.h"
#include "stores/store.h"

#include <pthread.h>
#include <stdbool.h>
#include <sys/stat.h>

struct ck_source {
    int fd;               /* the file, read by the transfer; -1 when not open */
    struct stat before;
    pthread_t tid;
    bool hashing;
    bool known; /* x->known_sha256 is this file's */
    const char *path;     /* borrowed from the xfer */
    struct ck_digests d;
    int hash_err;
    char hash_msg[512];
};

/* Whether the SHA-256 the agent took at registration (x->known_sha256)
 * is that of the file with stat st: same device, inode, size and times. */
bool ck_source_known_for(const struct ck_xfer *x, const struct stat *st);
/* Opens x->path (CK_ECHANGED when its size is not the queued one) and starts
 * hashing it unless its SHA-256 is known or not wanted. On error nothing is left to release but ck_source_finish. */
int ck_source_open(struct ck_source *src, const struct ck_xfer *x);
/* After the transfer: CK_ECHANGED when the file changed meanwhile. */
int ck_source_check_unchanged(const struct ck_source *src, const struct ck_xfer *x);
/* Waits for the hash, records it (or the known one) in x->sha256 when err is
 * 0, closes the file.
 * Returns err, or the hashing error when err was 0. Always call it. */
int ck_source_finish(struct ck_source *src, struct ck_xfer *x, int err);

#endif
