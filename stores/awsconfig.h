/* The AWS CLI's shared files (~/.aws/config and ~/.aws/credentials) and the
 * settings resolved from them and the environment, in the order the AWS CLI
 * and SDKs document: region and S3 endpoint for a store, and the profile
 * the credential chain (awscred.h) reads.
 *
 * The files are INI: "[section]" lines, "key = value" lines, '#' and ';'
 * comments; an indented "key = value" under "parent =" is a nested setting,
 * kept as "parent.key" (e.g. "s3.endpoint_url"). In the config file a
 * profile is "[profile NAME]" ("[default]" for default); in the credentials
 * file it is "[NAME]". The values may be secrets: they are wiped on free and
 * never appear in an error or a log line. */
#ifndef CK_STORE_AWSCONFIG_H
#define CK_STORE_AWSCONFIG_H

#include <stdbool.h>
#include <stddef.h>

struct ck_awsini; /* one parsed file */

/* Parses path. A file that does not exist is *out = NULL and 0 (the AWS CLI
 * treats it as empty); one that cannot be read or is larger than 1 MiB is
 * CK_ECONFIG naming the file. */
int ck_awsini_load(struct ck_awsini **out, const char *path);
/* The value of key in section (both compared as written, keys without case),
 * or NULL. f may be NULL. The string belongs to f. */
const char *ck_awsini_get(const struct ck_awsini *f, const char *section, const char *key);
bool ck_awsini_has_section(const struct ck_awsini *f, const char *section);
/* The name of the first section, or NULL. */
const char *ck_awsini_first_section(const struct ck_awsini *f);
void ck_awsini_free(struct ck_awsini *f);

/* One profile of the shared files. Owned fields; release with
 * ck_awsprofile_release. */
struct ck_awsprofile {
    char name[128];                   /* AWS_PROFILE, AWS_DEFAULT_PROFILE, or "default" */
    bool named;                       /* the name was given (the environment or explicit) */
    bool explicit_name;               /* given by the store's profile: (aws --profile) */
    char config_path[1024];           /* AWS_CONFIG_FILE or ~/.aws/config */
    char creds_path[1024];            /* AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials */
    struct ck_awsini *config, *creds; /* NULL when the file is absent */
};

/* Reads both files for the profile named explicitly (name, or NULL) or by
 * the environment. A profile named that neither file has is CK_ECONFIG (as
 * the AWS CLI does). */
int ck_awsprofile_open(struct ck_awsprofile *p, const char *name);
void ck_awsprofile_release(struct ck_awsprofile *p);
/* Whether either file has a section for the profile's name. */
bool ck_awsprofile_exists(const struct ck_awsprofile *p);
/* A key of the profile's section in the config file, or NULL. */
const char *ck_awsprofile_config(const struct ck_awsprofile *p, const char *key);
/* A key of the profile's section in the credentials file, or NULL. */
const char *ck_awsprofile_creds(const struct ck_awsprofile *p, const char *key);

/* The signing region: given (region: / --region), AWS_REGION,
 * AWS_DEFAULT_REGION, the profile's region, else "us-east-1". */
void ck_awsconfig_region(char *out, size_t outsz, const char *given, const struct ck_awsprofile *p);
/* A service's endpoint: given (endpoint: / --endpoint), AWS_ENDPOINT_URL_<SERVICE>,
 * AWS_ENDPOINT_URL, the profile's "<service>.endpoint_url", its
 * "endpoint_url"; "" when none (the service's AWS default). service is the
 * lower-case id ("s3", "sts"). CK_ECONFIG when the value is not http(s)://. */
int ck_awsconfig_endpoint(char *out, size_t outsz, const char *given, const char *service,
                          const struct ck_awsprofile *p);

#endif
