/* Durability in a batch: the files and folders a pass wrote, made durable
 * together before anything names them (metadata.yaml last).
 *
 * Registering 10,000 checkpoints wrote a manifest and a folder each, and an
 * fsync per file and per folder made the pass wait for 20,000 journal
 * commits and device flushes on a disk the trainer is writing to. Written
 * without fsync and flushed at the end, the few stay a few fsyncs and the
 * many become one syncfs (one commit, one flush). A crash before the flush
 * loses nothing named: metadata.yaml is replaced only after it, and the next
 * pass compares each manifest with what it should hold and writes it again. */
#ifndef CK_SYNCSET_H
#define CK_SYNCSET_H

#include "common/strset.h"

#include <stdbool.h>
#include <stddef.h>

struct ck_syncset {
    char **files, **dirs;  /* owned */
    size_t nfiles, ndirs;
    struct ck_strset seen; /* folders already in dirs (keys borrowed from dirs) */
};

#define CK_SYNCSET_INIT {0}

/* Above this many entries a flush is one syncfs of the filesystem. */
#define CK_SYNCSET_SYNCFS_MIN 64

int ck_syncset_add_file(struct ck_syncset *s, const char *path);
/* A folder whose entries changed; *had (may be NULL) says it was added before
 * (so the caller knows it exists: no mkdir needed). */
int ck_syncset_add_dir(struct ck_syncset *s, const char *dir, bool *had);
/* Makes every entry durable (fs_path: a path on their filesystem, for
 * syncfs) and empties the set, in every case. */
int ck_syncset_flush(struct ck_syncset *s, const char *fs_path);
/* Forgets the entries without syncing them (a pass that failed before
 * naming anything). */
void ck_syncset_release(struct ck_syncset *s);

/* Writes path through a temporary and a rename, without fsync: the caller
 * adds it (and its folder) to a syncset. */
int ck_write_file_replace_nosync(const char *path, const void *data, size_t len, unsigned mode);

#endif
