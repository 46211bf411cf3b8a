/* Secrets (keys, tokens, webhook secrets) come only from the environment or
 * from a file that nobody but its owner can read. A config names them as
 * "env:NAME" or "file:/path"; a literal secret in a config is refused.
 * Never log a secret, never put one in an error message. */
#ifndef CK_SECRET_H
#define CK_SECRET_H

/* Resolves ref into a newly allocated string (free it with ck_secret_free,
 * which wipes it). A file must have mode 0600 or stricter (no group/other
 * bits); trailing newlines are removed. Errors name the reference, never
 * the value. */
int ck_secret_load(const char *ref, char **out);
void ck_secret_free(char *secret);
/* Whether ref has a form ck_secret_load accepts (for checking a config early). */
int ck_secret_check_ref(const char *ref);

#endif
