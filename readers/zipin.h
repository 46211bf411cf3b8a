/* Reading members of a zip archive (libzip) for the readers that take one
 * (.nnp, SameDiff zips), with hostile input in mind: an archive with a member
 * whose name could escape a folder ("../x", "/etc/x", "a\\b", "C:x") or holds a control byte is
 * refused as a whole, and a member is read only after its size has been
 * checked against the caller's maximum and against what its compressed size
 * can really expand to. */
#ifndef CK_ZIPIN_H
#define CK_ZIPIN_H

#include "model/tensor.h"
#include "readers/reader.h"

#include <stdbool.h>
#include <stdint.h>

struct zip;
struct ck_sumpass;

struct ck_zipin {
    struct zip *z;    /* owned */
    const char *path; /* borrowed: the archive's name, for messages */
    uint64_t nentries;
};

/* Whether head starts like a zip archive (a local header or an empty archive). */
bool ck_zipin_is_zip(const unsigned char *head, size_t len);
/* Opens path (borrowed; must outlive zi), checks every member's name and
 * the archive's layout (ck_zipin_layout: local headers, order, overlaps). */
int ck_zipin_open(struct ck_zipin *zi, const char *path);
void ck_zipin_close(struct ck_zipin *zi);
/* The member's name (borrowed from zi) or NULL. */
const char *ck_zipin_name(const struct ck_zipin *zi, uint64_t i);
/* Index of the member named name; CK_ENOENT (message naming the archive) when absent. */
int ck_zipin_find(const struct ck_zipin *zi, const char *name, uint64_t *index);
/* Reads member i whole into memory owned by s; CK_ESIZE when it is larger
 * than max, CK_EFORMAT when it is corrupt (bad CRC, short data). */
int ck_zipin_read(const struct ck_zipin *zi, struct ck_tensor_set *s, uint64_t i, uint64_t max,
                  const unsigned char **data, uint64_t *len);
/* Stored members used in place: the local header offset of each of the
 * n central directory entries of the mapped archive b (in libzip's order),
 * read from the directory and checked against len; *offs is set memory. */
int ck_zipin_local_offsets(struct ck_tensor_set *s, const unsigned char *b, uint64_t len, uint64_t n,
                           uint64_t **offs);
/* Where the size bytes of the stored member whose local header is at loff
 * start in b, after checking that header names member and the bytes are in
 * the file. */
int ck_zipin_stored(struct ck_tensor_set *s, const unsigned char *b, uint64_t len, uint64_t loff,
                    const char *member, uint64_t size, const unsigned char **data);
/* One entry of the central directory, checked against its local header
 * (ck_zipin_layout). name points into the mapping (namelen bytes, no NUL). */
struct ck_zipin_member {
    const unsigned char *name;
    size_t namelen;
    uint64_t local, data;  /* offsets of the local header and of the bytes */
    uint64_t csize, usize; /* zip64 values applied */
    uint32_t crc;
    uint16_t method, flags;
};

/* The one structural check every zip reader of ckptd relies on (ck_zipin_open
 * runs it; the .mldef validator too), from the file's bytes b (len): every
 * central directory record well formed; a method ckptd reads (0 or 8), no
 * encryption; each size within max and, deflated, within what its compressed
 * bytes can expand to, stored, equal to them (all before anything is read or
 * allocated by size); each local header at its offset with the same name
 * (a local name like '../../x' that the directory does not show is refused),
 * method, CRC and sizes; the members' bytes inside the file before the
 * directory, listed in the file's order and none overlapping another. *out
 * (malloc'ed, the caller frees it) gets the n entries. CK_EFORMAT or
 * CK_ESIZE naming path and the member. */
int ck_zipin_layout(const char *path, const unsigned char *b, uint64_t len, uint64_t max,
                    struct ck_zipin_member **out, uint64_t *n);
/* ck_zipin_layout, then every member's content: its CRC-32 and its true
 * size (a deflated member inflated in 64 KiB pieces, never past its declared
 * size, from exactly its compressed bytes). Stored members go through sp
 * (their tensors' CRC-32C on the way; sp NULL: a plain CRC-32). This decides
 * what "valid" means for every command: inspect --verify, mldef -i, pack's
 * read-back, the sidecar's gate. */
int ck_zipin_check_members(const char *path, const unsigned char *b, uint64_t len, uint64_t max,
                           struct ck_sumpass *sp);
/* ck_zipin_layout (members false) or ck_zipin_check_members (true, sizes up
 * to CK_TENSOR_ALLOC_MAX) of the file at path, mapped for the check. */
int ck_zipin_check_file(const char *path, bool members);
/* The file at path mapped read-only (len 0 and b NULL for an empty file);
 * ck_zipin_unmap releases it. */
int ck_zipin_map(const char *path, const unsigned char **b, uint64_t *len);
void ck_zipin_unmap(const unsigned char *b, uint64_t len);
/* Checks the CRC-32 of every member of the archive s was read from (s->path,
 * mapped first by its reader): stored ones in that mapping, pages dropped as
 * it goes, with the CRC-32C of s's tensors inside them taken in the same pass
 * (into crcs, which may be NULL; readers/sumpass.h); ck_zipin_check_members.
 * CK_EFORMAT naming the archive and the first bad member. */
int ck_zipin_check_crcs(const struct ck_tensor_set *s, struct ck_tensor_crcs *crcs);
/* A reader's verify for formats that are a zip or a plain file (.nnp,
 * SameDiff): a zip (s's first mapping) has every member's CRC-32 and size
 * checked (ck_zipin_check_crcs), the older tags of a SameDiff archive too;
 * anything else stores no checksum (CK_VERIFY_NONE). */
int ck_zipin_verify_archive(const struct ck_tensor_set *s, struct ck_tensor_crcs *crcs);
/* Whether a member name is safe to use as a relative path (and to print: no
 * control bytes). */
bool ck_zipin_name_is_safe(const char *name);

#endif
