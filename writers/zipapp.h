/* Appending members to a zip archive in place, crash-safe (libzip rewrites
 * whole archives on close; a 100-checkpoint archive must not be copied for
 * the 101st).
 *
 * New members are written where the old central directory began; then a new
 * central directory (the kept old records verbatim plus the new ones) and
 * the end records (zip64 when an offset, a size or the count needs it).
 * Before the first byte is overwritten, common/zipjournal records the old
 * length and the bytes from the old central directory to the end, so a kill
 * at any instant rolls back to the old archive on the next open. A member
 * replaced by name (tags.txt) stays in the file as dead bytes: earlier
 * members are never moved or rewritten. A new archive is written to a
 * temporary and renamed into place.
 *
 * New members are stored (method 0) or deflated, written whole or streamed in
 * pieces (zip64 sizes past 4 GiB); existing members may be stored or
 * deflated. The archive is flock()ed exclusively from open to commit/abort.
 *
 * It is also the one zip writer of ckptd for new archives (ck_zipapp_create:
 * .mldef archives too): a member's bytes go from the caller's memory (often a
 * mapped checkpoint) to the file with no copy in between, their CRC-32 taken
 * on the way (common/crc32, 18 GB/s), and the disk writes them while the
 * rest is being copied. libzip's writer (8 KiB pieces through stdio and
 * zlib's 1 GB/s CRC) took 10x cp's time for a 1 GiB archive. */
#ifndef CK_ZIPAPP_H
#define CK_ZIPAPP_H

#include "common/buf.h"
#include "common/fsutil.h"
#include "common/writebehind.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <zlib.h>

struct ck_zipapp_entry {
    char *name; /* owned */
    uint32_t crc;
    uint64_t csize, usize, local; /* compressed, uncompressed size; local header offset */
    uint16_t method;
    bool dropped; /* left out of the new central directory */
    bool added;   /* written by this append */
    size_t rec;   /* offset of its central record in cd */
    size_t reclen;
};

/* The member being written (ck_zipapp_begin to _end). */
struct ck_zipapp_member {
    char *name; /* owned; NULL when none */
    uint64_t size, done, csize, local;
    uint32_t crc;
    int level;
    bool z64;   /* sizes in a zip64 extra */
    size_t pad; /* bytes of the alignment extra field (0: none) */
    bool deflating;
    z_stream zs;
    unsigned char *out;
};

struct ck_zipapp {
    char *path;     /* owned */
    int fd;         /* the archive (or the temporary of a new one) */
    int lockfd;     /* the archive, locked; -1 for a new archive */
    bool fresh;     /* a new archive (written to tmp) */
    bool journaled; /* the journal exists: abort must roll back */
    struct ck_atomic_file tmp;
    uint64_t old_len, start, pos;
    struct ck_writebehind wb; /* the new members' bytes, handed to the disk as they come */
    uint32_t dos_time; /* of new members: the clock at open unless set */
    uint16_t align;    /* stored data starts at a multiple of it (0: anywhere) */
    bool zip64;        /* zip64 sizes for new members of any size (else past 4 GiB only) */
    struct ck_zipapp_member cur;
    struct ck_zipapp_entry *ents;
    size_t nents, cap;
    struct ck_buf cd; /* central records of every entry, in order */
    /* A new archive only: called with the temporary's name once the archive
     * is whole there, before it replaces path; an error stops the commit and
     * removes the temporary, so path keeps what it held. NULL: none. */
    int (*precommit)(const char *tmp, void *arg);
    void *precommit_arg;
};

/* Opens path for appending: recovers a torn earlier append, checks that an
 * existing file is a zip (CK_EFORMAT naming it otherwise) and reads its
 * central directory; a missing file starts a new archive. CK_ELOCKED when
 * another process is appending. */
int ck_zipapp_open(struct ck_zipapp *z, const char *path);
/* Starts a new archive for path whatever is there now: written at a
 * temporary beside it (mode), renamed over it at commit. The caller has
 * decided that what path holds may be replaced. */
int ck_zipapp_create(struct ck_zipapp *z, const char *path, mode_t mode);
/* New members carry this DOS date and time instead of the clock's (the same
 * content then gives the same bytes). */
#define CK_ZIPAPP_DOS_1980 ((UINT32_C(1) << 21) | (UINT32_C(1) << 16)) /* 1980-01-01 00:00 */
/* Setting z->align (a power of two, at most 4096) makes stored data start at a multiple of
 * it, padded with a zipalign extra field (0xd935) in the local header, so a
 * reader can map a member in place. */
/* The entry named name, or NULL (dropped entries are not found). */
struct ck_zipapp_entry *ck_zipapp_find(struct ck_zipapp *z, const char *name);
/* Reads an existing entry whole (at most max bytes) into out. */
int ck_zipapp_read(struct ck_zipapp *z, const struct ck_zipapp_entry *e, uint64_t max,
                   struct ck_buf *out);
/* Whether an existing stored entry holds exactly these bytes (by CRC, size, then content). */
bool ck_zipapp_same(struct ck_zipapp *z, const struct ck_zipapp_entry *e, const void *data,
                    uint64_t len, uint32_t crc);
/* Leaves an existing entry out of the new central directory. */
void ck_zipapp_drop(struct ck_zipapp *z, struct ck_zipapp_entry *e);
/* Writes a new stored member whole. */
int ck_zipapp_add(struct ck_zipapp *z, const char *name, const void *data, uint64_t len);
/* A new member written in pieces: begin with its exact size and a level (0
 * stored, 1..9 deflated), write exactly size bytes in any pieces, end.
 * Writing more, or ending with fewer, is an error naming the member; after
 * an error abort the archive. */
int ck_zipapp_begin(struct ck_zipapp *z, const char *name, uint64_t size, int level);
int ck_zipapp_write(struct ck_zipapp *z, const void *data, size_t len);
int ck_zipapp_end(struct ck_zipapp *z);
/* Writes the central directory and end records, makes the archive durable
 * and removes the journal (or renames the new archive into place). z is
 * released in every case; on failure the old archive is restored. */
int ck_zipapp_commit(struct ck_zipapp *z);
/* Rolls back and releases (accepts a released z). */
void ck_zipapp_abort(struct ck_zipapp *z);

/* Undo records for taking complete appends back later (the sidecar's
 * verification gate drops a tag that failed). ck_zipapp_snapshot records
 * the archive as it is now in undo (common/zipjournal's layout: its length
 * and the bytes from its central directory to the end, written atomically;
 * an empty file when the archive does not exist). ck_zipapp_restore returns
 * the archive byte for byte to that state, taking back every append since
 * (removing an archive that did not exist), and removes undo: the record is
 * first made the archive's journal, so a kill during the restore leaves the
 * roll-back to the next open. An archive shorter than the record is left
 * alone (CK_EFORMAT). Only for the one process that appends to archive. */
int ck_zipapp_snapshot(const char *archive, const char *undo);
int ck_zipapp_restore(const char *archive, const char *undo);
/* The archive length an undo record restores (0: the archive did not exist). */
int ck_zipapp_undo_length(const char *undo, uint64_t *len);

#endif
