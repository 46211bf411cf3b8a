/* File digests. PMF needs MD5 and the stores want SHA-256: both come from
 * one read of the file, MD5 on the calling thread and SHA-256 on a second
 * one, so on two cores the pair costs the wall time of MD5 alone. */
#ifndef CK_HASH_H
#define CK_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

struct ck_digests {
    char md5[33];      /* lower-case hex */
    char sha256[65];   /* lower-case hex; "" when not asked for */
    uint64_t size;     /* bytes hashed */
};

enum ck_hash_want { CK_HASH_MD5 = 1, CK_HASH_SHA256 = 2, CK_HASH_BOTH = 3 };

/* Hashes path. The file must not change meanwhile: size, mtime and ctime are
 * compared before and after, and a change (or a file that vanishes) is
 * CK_ECHANGED naming the path. st, when not NULL, receives the stat taken. */
int ck_hash_file(const char *path, enum ck_hash_want want, struct ck_digests *out,
                 struct stat *st);

/* Incremental digests for data that is not a file (uploads, tests). */
struct ck_hash_ctx;
struct ck_hash_ctx *ck_hash_ctx_new(enum ck_hash_want want);
void ck_hash_ctx_update(struct ck_hash_ctx *c, const void *data, size_t len);
void ck_hash_ctx_final(struct ck_hash_ctx *c, struct ck_digests *out);
void ck_hash_ctx_free(struct ck_hash_ctx *c);

/* Hex of a binary digest into out (2*len+1 bytes). */
void ck_hex(char *out, const unsigned char *bin, size_t len);

#endif
