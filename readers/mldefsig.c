/* SIGNATURE (docs/mldef.md section 7): every file's digest against its
 * line, every line against a file, the Ed25519 signature, the trusted key. */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/sign.h"
#include "model/mldef.h"
#include "readers/mldefctx.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- SIGNATURE ---- */

struct sigline {
    char sha[65];
    char name[256];
};

void ck_mldefc_signature(struct ck_mldefc *c, const struct ck_mldef_check_opts *o)
{
    struct ck_mldef_report *r = c->r;
    uint64_t size;
    if (!ck_mldef_src_size(&c->src, CK_MLDEF_SIGNATURE, &size)) {
        if (o && o->require_signature)
            ck_mldefc_vio(c, "signature.missing", CK_MLDEF_SIGNATURE, "the archive is not signed");
        return;
    }
    r->has_signature = true;
    size_t before = r->n;
    const unsigned char *text;
    uint64_t len;
    if (ck_mldef_src_read(&c->src, CK_MLDEF_SIGNATURE, 1 << 20, c->set, &text, &len) < 0)
        return ck_mldefc_vio(c, "signature.format", CK_MLDEF_SIGNATURE, "%s", ck_error_msg());
    /* The files a signature must cover. */
    const char **files = NULL;
    size_t nfiles = 0, cap = 0;
    if (c->src.is_zip) {
        for (size_t i = 0; i < c->src.n; i++)
            if (strcmp(c->src.names[i], CK_MLDEF_SIGNATURE) != 0)
                ck_mldefc_push(&files, &nfiles, &cap, c->src.names[i]);
    } else {
        ck_mldefc_push(&files, &nfiles, &cap, CK_MLDEF_MANIFEST);
        for (size_t i = 0; i < c->nfiles; i++)
            ck_mldefc_push(&files, &nfiles, &cap, c->files[i]);
    }
    bool *seen = calloc(nfiles + 1, 1);
    const char *s = (const char *)text, *end = s + len, *sigline = NULL;
    size_t lineno = 0;
    bool header = false;
    while (s < end && seen) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        lineno++;
        char where[64];
        snprintf(where, sizeof where, "SIGNATURE line %zu", lineno);
        if (!nl) {
            ck_mldefc_vio(c, "signature.format", where, "the last line has no line end");
            break;
        }
        size_t ll = (size_t)(nl - s);
        char line[512];
        if (ll >= sizeof line) {
            ck_mldefc_vio(c, "signature.format", where, "line too long");
            s = nl + 1;
            continue;
        }
        memcpy(line, s, ll);
        line[ll] = '\0';
        if (lineno == 1) {
            header = strcmp(line, "mldef-signature 1") == 0;
            if (!header)
                ck_mldefc_vio(c, "signature.format", where, "not 'mldef-signature 1'");
        } else if (strncmp(line, "sha256 ", 7) == 0 && ll > 7 + 64 + 1 && line[71] == ' ') {
            const char *name = line + 72;
            size_t k = 0;
            while (k < nfiles && strcmp(files[k], name) != 0)
                k++;
            if (k == nfiles) {
                ck_mldefc_vio(c, "signature.removed", name,
                              "signed, but not in the %s (removed or "
                              "renamed)",
                              c->src.is_zip ? "archive" : "manifest's set");
            } else if (seen[k]) {
                ck_mldefc_vio(c, "signature.format", where, "'%s' listed twice", name);
            } else {
                seen[k] = true;
                char hex[65];
                line[71] = '\0';
                if (ck_mldef_src_sha256(&c->src, name, hex) < 0)
                    ck_mldefc_vio(c, "signature.changed", name, "%s", ck_error_msg());
                else if (strcmp(hex, line + 7) != 0)
                    ck_mldefc_vio(c, "signature.changed", name,
                                  "changed since it was signed (sha256 %s, "
                                  "signed %s)",
                                  hex, line + 7);
            }
        } else if (strncmp(line, "ed25519 ", 8) == 0) {
            sigline = s;
            unsigned char pub[32], sig[64];
            if (ll != 8 + 64 + 1 + 128 || line[72] != ' ' ||
                !ck_sign_unhex(line + 8, 64, pub, 32) || !ck_sign_unhex(line + 73, 128, sig, 64)) {
                ck_mldefc_vio(c, "signature.format", where, "not 'ed25519 <64 hex> <128 hex>'");
            } else {
                memcpy(r->signer, line + 8, 64);
                r->signer[64] = '\0';
                if (!ck_sign_verify(pub, text, (size_t)(sigline - (const char *)text), sig))
                    ck_mldefc_vio(c, "signature.invalid", CK_MLDEF_SIGNATURE,
                                  "the Ed25519 signature does not match its lines (key %.16s...)",
                                  r->signer);
                if (o && o->trusted_pub && memcmp(o->trusted_pub, pub, 32) != 0)
                    ck_mldefc_vio(c, "signature.key", CK_MLDEF_SIGNATURE,
                                  "signed by key %.16s..., not by the trusted key", r->signer);
            }
            if (nl + 1 != end)
                ck_mldefc_vio(c, "signature.format", where, "lines after the signature line");
            break;
        } else {
            ck_mldefc_vio(c, "signature.format", where, "unknown line");
        }
        s = nl + 1;
    }
    if (!sigline)
        ck_mldefc_vio(c, "signature.format", CK_MLDEF_SIGNATURE, "no ed25519 signature line");
    for (size_t k = 0; seen && k < nfiles; k++)
        if (!seen[k])
            ck_mldefc_vio(c, "signature.added", files[k],
                          "not covered by SIGNATURE (added or renamed)");
    free(seen);
    free(files);
    r->signature_ok = r->n == before;
}
