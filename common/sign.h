/* Ed25519 keys and signatures (RFC 8032, Nettle's ed25519_sha512), for
 * signed deployment archives (docs/mldef.md section 7).
 *
 * Key files are one text line each: "ed25519-private <64 hex>" (the 32-byte
 * seed; mode 0600) and "ed25519-public <64 hex>". The private key never
 * appears in a log line or an error. */
#ifndef CK_SIGN_H
#define CK_SIGN_H

#include <stdbool.h>
#include <stddef.h>

#define CK_SIGN_KEY_SIZE 32
#define CK_SIGN_SIG_SIZE 64

struct ck_sign_key {
    unsigned char priv[CK_SIGN_KEY_SIZE]; /* zero when only the public half is known */
    unsigned char pub[CK_SIGN_KEY_SIZE];
    bool has_priv;
};

/* A new key from the kernel's random source. */
int ck_sign_generate(struct ck_sign_key *k);
/* Writes path (mode 0600) and path.pub; CK_EEXIST when either exists. Each
 * file appears whole or not at all. */
int ck_sign_write_keys(const struct ck_sign_key *k, const char *path);
/* Loads a private key file (its public half is derived) or a public one.
 * ref may be "file:/path" or a plain path. A private key file readable by
 * group or others is refused (CK_ECONFIG). */
int ck_sign_load(const char *ref, struct ck_sign_key *k);
/* Wipes the private half. */
void ck_sign_key_wipe(struct ck_sign_key *k);

void ck_sign(const struct ck_sign_key *k, const void *msg, size_t len,
             unsigned char sig[CK_SIGN_SIG_SIZE]);
bool ck_sign_verify(const unsigned char pub[CK_SIGN_KEY_SIZE], const void *msg, size_t len,
                    const unsigned char sig[CK_SIGN_SIG_SIZE]);

/* Lower-case hex to bytes: exactly 2*n hex characters. */
bool ck_sign_unhex(const char *hex, size_t hexlen, unsigned char *out, size_t n);

#endif
