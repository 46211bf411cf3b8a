/* AWS credentials for the s3 store, resolved as the AWS CLI and SDKs do,
 * first source that has them wins:
 *   1. the store's explicit config: credentials: env | file:/path
 *   2. the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY [, AWS_SESSION_TOKEN]
 *   3. assume role: the profile's role_arn with source_profile (its keys,
 *      process, web identity, Identity Center or own role: chained) or
 *      credential_source (Environment, EcsContainer, Ec2InstanceMetadata),
 *      through STS AssumeRole signed with those keys
 *   4. web identity (IRSA): AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN
 *      [+ AWS_ROLE_SESSION_NAME] (or the profile's web_identity_token_file,
 *      role_arn, role_session_name), through STS AssumeRoleWithWebIdentity
 *   5. IAM Identity Center: the profile's sso_account_id and sso_role_name
 *      with sso_session (or sso_start_url and sso_region): the token
 *      `aws sso login` cached (refreshed at the OIDC service near its
 *      expiry, sso-session form), traded at the portal (GetRoleCredentials)
 *   6. the shared files: the profile (AWS_PROFILE)'s keys in
 *      AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials), its
 *      credential_process (stores/awsprocess.h), its keys in AWS_CONFIG_FILE
 *      (~/.aws/config)
 *   7. container credentials (ECS, EKS Pod Identity):
 *      AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI, with
 *      AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE or _TOKEN
 *   8. EC2 instance metadata (IMDSv2, session token first), unless
 *      AWS_EC2_METADATA_DISABLED=true; AWS_EC2_METADATA_SERVICE_ENDPOINT
 * Temporary credentials (3, 4, 5, 7, 8, and a process's keys with an
 * Expiration) are fetched again before they expire: when less than min(5
 * min, half their lifetime) is left. Every request takes a copy of the
 * current keys, so a refresh in the middle of a multipart upload applies to
 * the next part.
 *
 * Thread safe. The keys live only in memory that is wiped when released;
 * errors and log lines name the source, never a key. */
#ifndef CK_STORE_AWSCRED_H
#define CK_STORE_AWSCRED_H

#include <stdbool.h>
#include <stddef.h>

/* One copy of the keys, taken for one request. Wipe with ck_awskeys_wipe. */
struct ck_awskeys {
    char id[128];
    char secret[128];
    char token[8192]; /* "" when none */
};
void ck_awskeys_wipe(struct ck_awskeys *k);

struct ck_awsprofile;
struct ck_awscred;

/* Resolves the chain. explicit_ref: the store's credentials: value, or NULL
 * (then the chain starts at the environment). profile: the shared files
 * (borrowed for the call only). label: names the store in errors. No source
 * found is CK_ECONFIG listing what was tried. */
int ck_awscred_open(struct ck_awscred **out, const char *explicit_ref,
                    const struct ck_awsprofile *profile, const char *region, const char *label);
void ck_awscred_free(struct ck_awscred *c);

/* Copies the current keys into k, first fetching new ones when they are
 * about to expire. A failed refresh keeps keys that are still valid (with a
 * warning); once they expired it is an error. */
int ck_awscred_get(struct ck_awscred *c, struct ck_awskeys *k);
/* After the service refused the keys `rejected` as expired: fetches new
 * ones now, unless another thread already replaced them (told by the session
 * token: a renewal may hand out the same key id). false when the source
 * cannot give new keys (static keys) or the fetch failed. */
bool ck_awscred_refresh_now(struct ck_awscred *c, const struct ck_awskeys *rejected);
/* The source that supplied the keys ("environment", "web-identity", ...). */
const char *ck_awscred_source(const struct ck_awscred *c);
/* Whether an S3 error code means the keys expired or the service wants new ones. */
bool ck_awscred_is_expired_code(const char *code);

/* An ISO 8601 UTC time (2026-11-24T08:00:00Z, fractions and +00:00 allowed)
 * as seconds since the epoch; -1 when it is not one. */
long long ck_awscred_parse_time(const char *s);
/* The string value of "name" in a flat JSON object (escapes decoded), into
 * out; false when absent or not a string. */
bool ck_awscred_json_str(const char *json, const char *name, char *out, size_t outsz);
/* The integer value of "name" in a flat JSON object; false when absent, not
 * an integer or out of range. */
bool ck_awscred_json_int(const char *json, const char *name, long long *out);

/* IAM Identity Center, parsed apart from the I/O so that they can be fuzzed.
 * The accessToken and expiresAt (seconds since the epoch; the AWS CLI v1's
 * "...UTC" form too) of a token cache file; what names the file in errors. */
int ck_awscred_sso_cache_parse(const char *json, const char *what, char *tok, size_t toksz,
                               long long *until);
/* The keys and expiry (milliseconds in the answer) of a GetRoleCredentials
 * answer, {"roleCredentials": {"accessKeyId", "secretAccessKey",
 * "sessionToken", "expiration"}}. */
int ck_awscred_sso_answer_parse(const char *json, const char *what, struct ck_awskeys *k,
                                long long *expiry);

#endif
