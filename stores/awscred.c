#include "stores/awscred.h"
#include "common/buf.h"
#include "common/codec.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/log.h"
#include "common/secret.h"
#include "stores/awsconfig.h"
#include "stores/awsprocess.h"
#include "stores/net.h"
#include "stores/store.h"

#include <curl/curl.h>
#include <nettle/sha1.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define BODY_MAX (256u << 10)
#define TOKEN_FILE_MAX (64u << 10)
#define ECS_HOST "http://169.254.170.2"
#define IMDS_HOST "http://169.254.169.254"

enum src {
    SRC_EXPLICIT,
    SRC_ENV,
    SRC_ASSUME_ROLE,
    SRC_WEB_IDENTITY,
    SRC_SSO,
    SRC_SHARED,
    SRC_PROCESS,
    SRC_CONTAINER,
    SRC_IMDS
};
static const char *const src_names[] = {"config",       "environment", "assume-role",
                                        "web-identity", "sso",         "shared-files",
                                        "process",      "container",   "instance-metadata"};

/* The sources whose keys can be fetched again (and may expire). */
static bool renewable(enum src k)
{
    return k == SRC_ASSUME_ROLE || k == SRC_WEB_IDENTITY || k == SRC_SSO || k == SRC_PROCESS ||
           k == SRC_CONTAINER || k == SRC_IMDS;
}

struct ck_awscred {
    pthread_mutex_t mu;
    enum src kind;
    struct ck_awskeys keys;
    long long expiry;   /* seconds since the epoch; 0: the keys do not expire */
    long long fetched;  /* when they were fetched */
    long long retry_at; /* after a failed early renewal, not before this (s) */
    char where[2200];   /* the file or profile the keys came from (no secret) */
    /* what a refresh needs */
    char role_arn[2048], token_file[1024], session_name[128], sts_url[600];
    char container_url[1200], container_token_file[1024];
    char imds_url[600];
    /* credential_process: the command (it may hold secrets: never logged) */
    char process_cmd[4096], process_what[400];
    /* IAM Identity Center: the token cache file `aws sso login` writes and
     * the portal's GetRoleCredentials URL (account and role in its query) */
    char sso_cache[1200], sso_url[1600];
    /* the sso-session form's token is refreshed at the OIDC service (CreateToken) */
    char sso_oidc_url[600];
    bool sso_refreshes;
    /* assume role (role_arn, session_name and sts_url above): the keys that
     * sign the AssumeRole request, from source_profile or credential_source */
    struct ck_awscred *source; /* owned */
    char external_id[1300], sigv4[160], profile[128];
    long duration_s;
};

/* source_profile chains longer than this are refused (and catch loops) */
#define ROLE_CHAIN_MAX 5

void ck_awskeys_wipe(struct ck_awskeys *k)
{
    explicit_bzero(k, sizeof *k);
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static long long now_s(void)
{
    return (long long)time(NULL);
}

/* ---- small parsers ---- */

long long ck_awscred_parse_time(const char *s)
{
    struct tm tm = {0};
    int n = 0;
    if (!s ||
        sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &n) != 6 ||
        n != 19)
        return -1;
    const char *p = s + n;
    if (*p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++)
            ;
    long off = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int hh, mm, k = 0;
        if (sscanf(p + 1, "%2d:%2d%n", &hh, &mm, &k) != 2 || k != 5)
            return -1;
        off = (hh * 3600L + mm * 60L) * (*p == '+' ? 1 : -1);
        p += 6;
    } else {
        return -1;
    }
    if (*p || tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 ||
        tm.tm_hour > 23 || tm.tm_min > 59 || tm.tm_sec > 60)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (long long)timegm(&tm) - off;
}

/* Where the value of key name starts in a flat JSON object (blanks after
 * the ':' skipped), or NULL when no key has that name. */
static const char *json_value(const char *json, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = json; (p = strchr(p, '"'));) {
        /* p opens a string: a key when it is name and a ':' follows */
        bool match = !strncmp(p + 1, name, nl) && p[1 + nl] == '"';
        const char *q = p + 1;
        while (*q && *q != '"')
            q += *q == '\\' && q[1] ? 2 : 1;
        if (!*q)
            return NULL;
        q++;
        const char *c = q;
        while (*c == ' ' || *c == '\t' || *c == '\r' || *c == '\n')
            c++;
        if (*c != ':') {
            p = q; /* a value, or a key of another name */
            continue;
        }
        if (!match) {
            p = c + 1;
            continue;
        }
        for (c++; *c == ' ' || *c == '\t' || *c == '\r' || *c == '\n'; c++)
            ;
        return c;
    }
    return NULL;
}

bool ck_awscred_json_int(const char *json, const char *name, long long *out)
{
    const char *c = json_value(json, name);
    if (!c || !((*c >= '0' && *c <= '9') || (*c == '-' && c[1] >= '0' && c[1] <= '9')))
        return false;
    errno = 0;
    char *end;
    long long v = strtoll(c, &end, 10);
    if (errno || *end == '.' || *end == 'e' || *end == 'E')
        return false; /* out of range, or not an integer */
    *out = v;
    return true;
}

bool ck_awscred_json_str(const char *json, const char *name, char *out, size_t outsz)
{
    const char *c = json_value(json, name);
    if (!c || *c != '"')
        return false;
    size_t o = 0;
    for (c++; *c && *c != '"'; c++) {
        char ch = *c;
        if (ch == '\\') {
            c++;
            switch (*c) {
            case 'n':
                ch = '\n';
                break;
            case 't':
                ch = '\t';
                break;
            case 'r':
                ch = '\r';
                break;
            case 'b':
                ch = '\b';
                break;
            case 'f':
                ch = '\f';
                break;
            case 'u': {
                /* exactly four hex digits, each looked at before the
                 * next (sscanf's %4x takes fewer, a sign or spaces, and
                 * the skip of four would then pass the terminator) */
                unsigned v = 0;
                for (int i = 1; i <= 4; i++) {
                    int d = ck_codec_hexval(c[i]);
                    if (d < 0)
                        return false;
                    v = v * 16 + (unsigned)d;
                }
                if (v > 0x7f)
                    return false; /* keys and tokens are ASCII */
                ch = (char)v;
                c += 4;
                break;
            }
            case '\0':
                return false;
            default:
                ch = *c;
                break;
            }
        }
        if (o + 1 >= outsz)
            return false;
        out[o++] = ch;
    }
    if (*c != '"')
        return false;
    out[o] = '\0';
    return true;
}

bool ck_awscred_is_expired_code(const char *code)
{
    static const char *const codes[] = {"ExpiredToken",         "ExpiredTokenException",
                                        "TokenRefreshRequired", "RequestExpired",
                                        "InvalidToken",         "InvalidAccessKeyId"};
    for (size_t i = 0; code && i < sizeof codes / sizeof *codes; i++)
        if (!strcmp(code, codes[i]))
            return true;
    return false;
}

/* ---- HTTP for the credential services (not S3: no retries of ck_net, short timeouts) ---- */

static size_t body_cb(char *data, size_t size, size_t n, void *ud)
{
    struct ck_buf *b = ud;
    size_t len = size * n;
    if (b->len + len > BODY_MAX)
        return 0;
    ck_buf_append(b, data, len);
    return len;
}

/* A request signed with SigV4 (STS AssumeRole): the keys and libcurl's
 * provider string ("aws:amz:REGION:sts"); the session token goes in the
 * caller's headers. */
struct signing {
    const struct ck_awskeys *keys;
    const char *sigv4;
};

/* One request (signed when sign is set); *status is the HTTP status (0
 * when none came back). Tries again after a connection error or a 5xx,
 * attempts times. */

static int fetch(const char *what, const char *method, const char *url, struct curl_slist *hd,
                 const char *body, const struct signing *sign, long timeout_s, int attempts,
                 struct ck_buf *out, long *status)
{
    CURL *h = curl_easy_init();
    if (!h)
        return ck_error(CK_ENOMEM, "cannot create a curl handle");
    char errbuf[CURL_ERROR_SIZE], where[512];
    ck_store_url_redact(where, sizeof where, url);
    int err = 0;
    for (int i = 0; i < attempts; i++) {
        if (i)
            usleep(200000u << i);
        if (out->data)
            explicit_bzero(out->data, out->len);
        out->len = 0;
        *status = 0;
        errbuf[0] = '\0';
        curl_easy_reset(h);
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, timeout_s);
        curl_easy_setopt(h, CURLOPT_TIMEOUT, timeout_s * 5);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, body_cb);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
        curl_easy_setopt(h, CURLOPT_USERAGENT, "ckptd/" CKPTD_VERSION);
        curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
        if (hd)
            curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
        if (sign) {
            curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sign->sigv4);
            curl_easy_setopt(h, CURLOPT_USERNAME, sign->keys->id);
            curl_easy_setopt(h, CURLOPT_PASSWORD, sign->keys->secret);
        }
        if (body) {
            curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
            curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
        }
        if (strcmp(method, body ? "POST" : "GET"))
            curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
        CURLcode cc = curl_easy_perform(h);
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
        ck_buf_str(out); /* NUL-terminated for the parsers */
        if (cc == CURLE_OK && *status < 500) {
            err = 0;
            break;
        }
        if (cc != CURLE_OK)
            err = ck_error(CK_ENET, "%s: %s (%s)", what,
                           errbuf[0] ? errbuf : curl_easy_strerror(cc), where);
        else
            err = ck_error(CK_ENET, "%s: HTTP %ld (%s)", what, *status, where);
    }
    curl_easy_cleanup(h);
    return err;
}

static int copy_key(char *dst, size_t dsz, const char *v, const char *what, const char *name)
{
    if (!v || !*v)
        return ck_error(CK_ECONFIG, "%s: no %s", what, name);
    if (strlen(v) >= dsz)
        return ck_error(CK_ECONFIG, "%s: %s is too long", what, name);
    snprintf(dst, dsz, "%s", v);
    return 0;
}

static int set_keys(struct ck_awskeys *k, const char *id, const char *sec, const char *tok,
                    const char *what)
{
    int err;
    if ((err = copy_key(k->id, sizeof k->id, id, what, "access key id")) < 0 ||
        (err = copy_key(k->secret, sizeof k->secret, sec, what, "secret access key")) < 0)
        return err;
    if (tok && *tok)
        return copy_key(k->token, sizeof k->token, tok, what, "session token");
    k->token[0] = '\0';
    return 0;
}

/* ---- the sources that fetch ---- */

/* Tokens and keys do not outlive the request in memory: headers and buffers
 * are zeroed before they are freed. */
static void wipe_headers(struct curl_slist *hd)
{
    for (struct curl_slist *i = hd; i; i = i->next)
        explicit_bzero(i->data, strlen(i->data));
    curl_slist_free_all(hd);
}

static void wipe_bufs(struct ck_buf *a, struct ck_buf *b, struct ck_buf *c)
{
    ck_buf_wipe(a);
    ck_buf_wipe(b);
    ck_buf_wipe(c);
}

/* The Credentials of an STS answer (AssumeRole, AssumeRoleWithWebIdentity). */
static int sts_credentials(const char *x, const char *what, struct ck_awskeys *k, long long *expiry)
{
    char exp[64];
    struct ck_awskeys nk = {0};
    if (!ck_xml_tag(x, "AccessKeyId", nk.id, sizeof nk.id) ||
        !ck_xml_tag(x, "SecretAccessKey", nk.secret, sizeof nk.secret) ||
        !ck_xml_tag(x, "SessionToken", nk.token, sizeof nk.token) ||
        !ck_xml_tag(x, "Expiration", exp, sizeof exp) ||
        (*expiry = ck_awscred_parse_time(exp)) < 0 || !nk.id[0] || !nk.secret[0]) {
        ck_awskeys_wipe(&nk);
        return ck_error(CK_ENET, "%s: STS answered without credentials or expiration", what);
    }
    *k = nk;
    ck_awskeys_wipe(&nk);
    return 0;
}

/* POSTs an STS form (SigV4-signed with sign's keys, their session token in
 * a header, when sign is set) and takes the Credentials of the answer. A
 * refusal says "WHAT: STS refused WHOM: HTTP <status> <Code>". */
static int sts_call(const char *url, const char *form, const struct signing *sign, const char *what,
                    const char *action, const char *whom, struct ck_awskeys *k, long long *expiry)
{
    struct ck_buf resp = CK_BUF_INIT, tokhdr = CK_BUF_INIT;
    char label[128];
    long status = 0;
    struct curl_slist *hd =
        curl_slist_append(NULL, "Content-Type: application/x-www-form-urlencoded");
    hd = curl_slist_append(hd, "Accept: application/xml");
    if (sign && sign->keys->token[0]) {
        ck_buf_printf(&tokhdr, "x-amz-security-token: %s", sign->keys->token);
        hd = curl_slist_append(hd, ck_buf_str(&tokhdr));
    }
    snprintf(label, sizeof label, "%s: STS %s", what, action);
    int err = fetch(label, "POST", url, hd, form, sign, 10, 3, &resp, &status);
    wipe_headers(hd);
    const char *x = ck_buf_str(&resp);
    if (err == 0 && status != 200) {
        char code[128] = "";
        ck_xml_tag(x, "Code", code, sizeof code);
        err = ck_error(status == 400 || status == 403 ? CK_EAUTH : CK_ENET,
                       "%s: STS refused %s: HTTP %ld %s", what, whom, status, code);
    } else if (err == 0) {
        err = sts_credentials(x, what, k, expiry);
    }
    ck_buf_wipe(&resp);
    ck_buf_wipe(&tokhdr);
    return err;
}

/* STS AssumeRoleWithWebIdentity: the token file is read again each time (it rotates). */
static int fetch_web_identity(struct ck_awscred *c, struct ck_awskeys *k, long long *expiry)
{
    struct ck_buf tok = CK_BUF_INIT, body = CK_BUF_INIT;
    char *enc = NULL, arn[6200], name[400];
    int err;
    if ((err = ck_read_file(c->token_file, TOKEN_FILE_MAX, &tok)) < 0) {
        err = ck_error(CK_ECONFIG, "web identity: cannot read the token file '%s'", c->token_file);
        goto out;
    }
    while (tok.len && (tok.data[tok.len - 1] == '\n' || tok.data[tok.len - 1] == '\r' ||
                       tok.data[tok.len - 1] == ' '))
        tok.data[--tok.len] = '\0';
    if (!tok.len) {
        err = ck_error(CK_ECONFIG, "web identity: the token file '%s' is empty", c->token_file);
        goto out;
    }
    size_t encsz = tok.len * 3 + 1;
    if (!(enc = malloc(encsz)) || ck_store_encode(enc, encsz, ck_buf_str(&tok), false) < 0 ||
        ck_store_encode(arn, sizeof arn, c->role_arn, false) < 0 ||
        ck_store_encode(name, sizeof name, c->session_name, false) < 0) {
        err = ck_error(CK_ECONFIG, "web identity: the role ARN or the token is too long");
        goto out;
    }
    ck_buf_printf(&body,
                  "Action=AssumeRoleWithWebIdentity&RoleArn=%s&RoleSessionName=%s"
                  "&Version=2011-06-15&WebIdentityToken=%s",
                  arn, name, enc);
    char whom[3400];
    snprintf(whom, sizeof whom, "role '%s' with the token in '%s'", c->role_arn, c->token_file);
    err = sts_call(c->sts_url, ck_buf_str(&body), NULL, "web identity", "AssumeRoleWithWebIdentity",
                   whom, k, expiry);
out:
    if (enc) {
        explicit_bzero(enc, strlen(enc));
        free(enc);
    }
    ck_buf_wipe(&tok);
    ck_buf_wipe(&body);
    return err;
}

/* The keys of a JSON credentials document: AccessKeyId, SecretAccessKey,
 * the session token under token_key (optional) and an ISO 8601 Expiration
 * (optional: without one the keys do not expire). noun names the document
 * in errors ("answer", "output"); err_code is the error they give. */
static int json_creds(const char *json, const char *token_key, const char *what, const char *noun,
                      int err_code, struct ck_awskeys *k, long long *expiry)
{
    char exp[64];
    struct ck_awskeys nk = {0};
    int err = 0;
    *expiry = 0;
    if (!ck_awscred_json_str(json, "AccessKeyId", nk.id, sizeof nk.id) ||
        !ck_awscred_json_str(json, "SecretAccessKey", nk.secret, sizeof nk.secret) || !nk.id[0] ||
        !nk.secret[0])
        err = ck_error(err_code, "%s: the %s has no AccessKeyId and SecretAccessKey", what, noun);
    else if (ck_awscred_json_str(json, "Expiration", exp, sizeof exp) &&
             (*expiry = ck_awscred_parse_time(exp)) < 0)
        err = ck_error(err_code, "%s: the %s's Expiration '%s' is not an ISO 8601 time", what, noun,
                       exp);
    if (err == 0) {
        if (!ck_awscred_json_str(json, token_key, nk.token, sizeof nk.token))
            nk.token[0] = '\0';
        *k = nk;
    }
    ck_awskeys_wipe(&nk);
    return err;
}

/* The JSON of the container and instance metadata services. */
static int parse_json_creds(const char *json, const char *what, struct ck_awskeys *k,
                            long long *expiry)
{
    char code[64];
    if (ck_awscred_json_str(json, "Code", code, sizeof code) && strcmp(code, "Success"))
        return ck_error(CK_EAUTH, "%s: the service answered Code '%s'", what, code);
    return json_creds(json, "Token", what, "answer", CK_ENET, k, expiry);
}

static int fetch_container(struct ck_awscred *c, struct ck_awskeys *k, long long *expiry)
{
    struct ck_buf tok = CK_BUF_INIT, resp = CK_BUF_INIT, hdr = CK_BUF_INIT;
    struct curl_slist *hd = NULL;
    long status = 0;
    int err = 0;
    const char *what = "container credentials";
    if (c->container_token_file[0]) {
        if (ck_read_file(c->container_token_file, TOKEN_FILE_MAX, &tok) < 0) {
            err =
                ck_error(CK_ECONFIG, "%s: cannot read AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE '%s'",
                         what, c->container_token_file);
            goto out;
        }
        while (tok.len && (tok.data[tok.len - 1] == '\n' || tok.data[tok.len - 1] == '\r'))
            tok.data[--tok.len] = '\0';
    } else if (env("AWS_CONTAINER_AUTHORIZATION_TOKEN")) {
        ck_buf_puts(&tok, env("AWS_CONTAINER_AUTHORIZATION_TOKEN"));
    }
    if (tok.len) {
        if (memchr(tok.data, '\n', tok.len) || memchr(tok.data, '\r', tok.len)) {
            err = ck_error(CK_ECONFIG, "%s: the authorization token has a line break", what);
            goto out;
        }
        ck_buf_printf(&hdr, "Authorization: %s", ck_buf_str(&tok));
        hd = curl_slist_append(hd, ck_buf_str(&hdr));
    }
    hd = curl_slist_append(hd, "Accept: application/json");
    if ((err = fetch(what, "GET", c->container_url, hd, NULL, NULL, 5, 3, &resp, &status)) < 0)
        goto out;
    if (status != 200) {
        err = ck_error(status == 401 || status == 403 ? CK_EAUTH : CK_ENET,
                       "%s: HTTP %ld from the credentials endpoint", what, status);
        goto out;
    }
    err = parse_json_creds(ck_buf_str(&resp), what, k, expiry);
out:
    wipe_headers(hd);
    wipe_bufs(&tok, &hdr, &resp);
    return err;
}

/* IMDSv2: a session token (PUT), the role name, then its credentials. */
static int fetch_imds(struct ck_awscred *c, struct ck_awskeys *k, long long *expiry)
{
    struct ck_buf tok = CK_BUF_INIT, resp = CK_BUF_INIT, hdr = CK_BUF_INIT;
    char url[1200], role[256];
    long status = 0;
    int err;
    const char *what = "instance metadata";
    snprintf(url, sizeof url, "%s/latest/api/token", c->imds_url);
    struct curl_slist *hd = curl_slist_append(NULL, "X-aws-ec2-metadata-token-ttl-seconds: 21600");
    err = fetch(what, "PUT", url, hd, NULL, NULL, 1, 2, &tok, &status);
    curl_slist_free_all(hd);
    hd = NULL;
    if (err < 0)
        goto out;
    if (status != 200 || !tok.len || strpbrk(ck_buf_str(&tok), "\r\n")) {
        err = ck_error(CK_ENET, "%s: no session token (HTTP %ld from %s)", what, status, url);
        goto out;
    }
    ck_buf_printf(&hdr, "X-aws-ec2-metadata-token: %s", ck_buf_str(&tok));
    hd = curl_slist_append(NULL, ck_buf_str(&hdr));
    snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/", c->imds_url);
    if ((err = fetch(what, "GET", url, hd, NULL, NULL, 1, 2, &resp, &status)) < 0)
        goto out;
    size_t rl = strcspn(ck_buf_str(&resp), "\r\n");
    if (status != 200 || rl == 0 || rl >= sizeof role ||
        strspn(resp.data, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+=,.@_-") <
            rl) {
        err =
            ck_error(CK_ENET, "%s: no IAM role attached to this instance (HTTP %ld)", what, status);
        goto out;
    }
    memcpy(role, resp.data, rl);
    role[rl] = '\0';
    snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/%s", c->imds_url, role);
    if ((err = fetch(what, "GET", url, hd, NULL, NULL, 1, 2, &resp, &status)) < 0)
        goto out;
    if (status != 200) {
        err = ck_error(CK_ENET, "%s: HTTP %ld for role '%s'", what, status, role);
        goto out;
    }
    err = parse_json_creds(ck_buf_str(&resp), what, k, expiry);
out:
    wipe_headers(hd);
    wipe_bufs(&tok, &hdr, &resp);
    return err;
}

/* The AWS CLI's process credentials: {"Version": 1, "AccessKeyId",
 * "SecretAccessKey", "SessionToken"?, "Expiration"?}; without an Expiration
 * the keys do not expire. */
static int fetch_process(struct ck_awscred *c, struct ck_awskeys *k, long long *expiry)
{
    struct ck_buf out = CK_BUF_INIT;
    long long version = 0;
    const char *what = c->process_what;
    int err = ck_awsprocess_run(c->process_cmd, what, CK_AWSPROCESS_TIMEOUT_S, &out);
    const char *json = ck_buf_str(&out);
    if (err == 0 && (!ck_awscred_json_int(json, "Version", &version) || version != 1))
        err = ck_error(CK_EAUTH, "%s: the output is not {\"Version\": 1, ...} JSON", what);
    if (err == 0)
        err = json_creds(json, "SessionToken", what, "output", CK_EAUTH, k, expiry);
    ck_buf_wipe(&out);
    return err;
}

int ck_awscred_sso_cache_parse(const char *json, const char *what, char *tok, size_t toksz,
                               long long *until)
{
    char exp[64];
    if (!ck_awscred_json_str(json, "accessToken", tok, toksz) || !tok[0] ||
        !ck_awscred_json_str(json, "expiresAt", exp, sizeof exp))
        return ck_error(CK_EAUTH, "%s has no accessToken and expiresAt", what);
    if (strpbrk(tok, "\r\n"))
        return ck_error(CK_EAUTH, "%s: the accessToken has a line break", what);
    /* the AWS CLI v1 wrote "2019-11-14T04:05:45UTC" */
    size_t el = strlen(exp);
    if (el > 3 && !strcmp(exp + el - 3, "UTC"))
        snprintf(exp + el - 3, sizeof exp - (el - 3), "Z");
    if ((*until = ck_awscred_parse_time(exp)) < 0)
        return ck_error(CK_EAUTH, "%s: expiresAt '%s' is not an ISO 8601 time", what, exp);
    return 0;
}

int ck_awscred_sso_answer_parse(const char *json, const char *what, struct ck_awskeys *k,
                                long long *expiry)
{
    struct ck_awskeys nk = {0};
    long long ms = 0;
    int err = 0;
    if (!ck_awscred_json_str(json, "accessKeyId", nk.id, sizeof nk.id) ||
        !ck_awscred_json_str(json, "secretAccessKey", nk.secret, sizeof nk.secret) ||
        !ck_awscred_json_str(json, "sessionToken", nk.token, sizeof nk.token) || !nk.id[0] ||
        !nk.secret[0] || !ck_awscred_json_int(json, "expiration", &ms) || ms <= 0)
        err = ck_error(CK_ENET,
                       "%s: the portal's answer has no roleCredentials with keys and expiration",
                       what);
    if (err == 0) {
        *expiry = ms / 1000; /* milliseconds since the epoch */
        *k = nk;
    }
    ck_awskeys_wipe(&nk);
    return err;
}

/* t (seconds since the epoch) as ISO 8601 UTC, as the AWS CLI writes it. */
static void iso_utc(char out[32], long long t)
{
    time_t tt = (time_t)t;
    struct tm tm;
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&tt, &tm));
}

#define SSO_REFRESH_WINDOW_S (15 * 60) /* as the AWS CLI v2: 15 minutes before expiry */

/* The sso-session form, as the AWS CLI v2 and the SDKs do it: within 15
 * minutes of its expiry, the access token is renewed at the OIDC service
 * (CreateToken with grant type refresh_token and the client registration
 * the cache holds), and the cache file is rewritten (atomically, mode 0600)
 * with the new token, for the AWS CLI too. On success tok and until hold the
 * new token; a cache without a registration is CK_ENOENT (nothing to try). */
static int sso_refresh(struct ck_awscred *c, const char *what, const char *cache, char *tok,
                       size_t toksz, long long *until)
{
    char cid[1024], csec[8192], rtok[8192], regexp[64], start[1200], region[64], code[128];
    char ntok[8192], nrtok[8192], exp[32];
    struct ck_buf body = CK_BUF_INIT, resp = CK_BUF_INIT, out = CK_BUF_INIT;
    struct curl_slist *hd = NULL;
    long status = 0;
    long long in = 0;
    int err = 0;
    if (!ck_awscred_json_str(cache, "clientId", cid, sizeof cid) ||
        !ck_awscred_json_str(cache, "clientSecret", csec, sizeof csec) ||
        !ck_awscred_json_str(cache, "refreshToken", rtok, sizeof rtok)) {
        err = CK_ENOENT;
        goto out;
    }
    bool has_reg = ck_awscred_json_str(cache, "registrationExpiresAt", regexp, sizeof regexp);
    if (has_reg && ck_awscred_parse_time(regexp) >= 0 && ck_awscred_parse_time(regexp) <= now_s()) {
        err = ck_error(CK_EAUTH, "%s: the client registration in the cache expired at %s", what,
                       regexp);
        goto out;
    }
    struct ck_json j;
    ck_json_init(&j, &body, false);
    ck_json_begin_object(&j);
    ck_json_kstr(&j, "clientId", cid);
    ck_json_kstr(&j, "clientSecret", csec);
    ck_json_kstr(&j, "grantType", "refresh_token");
    ck_json_kstr(&j, "refreshToken", rtok);
    ck_json_end_object(&j);
    char url[700];
    snprintf(url, sizeof url, "%s/token", c->sso_oidc_url);
    hd = curl_slist_append(hd, "Content-Type: application/json");
    hd = curl_slist_append(hd, "Accept: application/json");
    if ((err = fetch(what, "POST", url, hd, ck_buf_str(&body), NULL, 5, 2, &resp, &status)) < 0)
        goto out;
    const char *json = ck_buf_str(&resp);
    if (status != 200) {
        if (!ck_awscred_json_str(json, "error", code, sizeof code))
            code[0] = '\0';
        err = ck_error(CK_EAUTH, "%s: the OIDC service refused to refresh the token: HTTP %ld %s",
                       what, status, code);
        goto out;
    }
    if (!ck_awscred_json_str(json, "accessToken", ntok, sizeof ntok) || !ntok[0] ||
        strpbrk(ntok, "\r\n") || strlen(ntok) >= toksz ||
        !ck_awscred_json_int(json, "expiresIn", &in) || in <= 0 || in > 30LL * 86400) {
        err = ck_error(CK_ENET, "%s: the OIDC service's answer has no accessToken and expiresIn",
                       what);
        goto out;
    }
    if (!ck_awscred_json_str(json, "refreshToken", nrtok, sizeof nrtok) || !nrtok[0])
        snprintf(nrtok, sizeof nrtok, "%s", rtok);
    long long t = now_s() + in;
    iso_utc(exp, t);
    /* the cache as the AWS CLI writes it */
    ck_json_init(&j, &out, false);
    ck_json_begin_object(&j);
    if (ck_awscred_json_str(cache, "startUrl", start, sizeof start))
        ck_json_kstr(&j, "startUrl", start);
    if (ck_awscred_json_str(cache, "region", region, sizeof region))
        ck_json_kstr(&j, "region", region);
    ck_json_kstr(&j, "accessToken", ntok);
    ck_json_kstr(&j, "expiresAt", exp);
    ck_json_kstr(&j, "clientId", cid);
    ck_json_kstr(&j, "clientSecret", csec);
    if (has_reg)
        ck_json_kstr(&j, "registrationExpiresAt", regexp);
    ck_json_kstr(&j, "refreshToken", nrtok);
    ck_json_end_object(&j);
    if ((err = ck_write_file_atomic(c->sso_cache, out.data, out.len, 0600)) < 0) {
        err = ck_error_wrap(err, "%s: cannot write the refreshed token", what);
        goto out;
    }
    snprintf(tok, toksz, "%s", ntok);
    *until = t;
    ck_info("s3.credentials.sso_token_refreshed", "profile=%s expires_in_seconds=%lld", c->profile, in);
out:
    explicit_bzero(cid, sizeof cid);
    explicit_bzero(csec, sizeof csec);
    explicit_bzero(rtok, sizeof rtok);
    explicit_bzero(ntok, sizeof ntok);
    explicit_bzero(nrtok, sizeof nrtok);
    wipe_headers(hd);
    wipe_bufs(&body, &resp, &out);
    return err;
}

/* IAM Identity Center (AWS SSO): the access token `aws sso login` left in
 * its cache, read again each time (a new login replaces it), refreshed when
 * near its expiry (the sso-session form: sso_refresh), traded at the portal
 * for the role's keys (GetRoleCredentials: a GET with the token in
 * x-amz-sso_bearer_token). An expired token that cannot be refreshed is an
 * error that says to log in again. */
static int fetch_sso(struct ck_awscred *c, struct ck_awskeys *k, long long *expiry)
{
    struct ck_buf cache = CK_BUF_INIT, hdr = CK_BUF_INIT, resp = CK_BUF_INIT;
    struct curl_slist *hd = NULL;
    char tok[8192], what[300], file[1600];
    long status = 0;
    long long until = 0;
    int err = 0;
    snprintf(what, sizeof what, "IAM Identity Center for profile '%s'", c->profile);
    snprintf(file, sizeof file, "%s: '%s'", what, c->sso_cache);
    if ((err = ck_read_file(c->sso_cache, TOKEN_FILE_MAX, &cache)) < 0) {
        err = ck_error(err == CK_ENOENT ? CK_EAUTH : err,
                       "%s: no cached token ('%s'): run 'aws sso login --profile %s'", what,
                       c->sso_cache, c->profile);
        goto out;
    }
    if ((err = ck_awscred_sso_cache_parse(ck_buf_str(&cache), file, tok, sizeof tok, &until)) < 0)
        goto out;
    if (c->sso_refreshes && until - now_s() < SSO_REFRESH_WINDOW_S) {
        /* a failed refresh leaves a token that is still valid in use */
        int rerr = sso_refresh(c, what, ck_buf_str(&cache), tok, sizeof tok, &until);
        if (rerr < 0 && rerr != CK_ENOENT && until > now_s()) {
            ck_warn("s3.credentials.sso_refresh_failed", "profile=%s expires_in_seconds=%lld error=\"%s\"",
                    c->profile, until - now_s(), ck_error_msg());
            ck_error_clear();
        }
    }
    if (until <= now_s()) {
        char when[32];
        iso_utc(when, until);
        err = ck_error(CK_EAUTH,
                       "%s: the cached token expired at %s: run 'aws sso login --profile %s'", what,
                       when, c->profile);
        goto out;
    }
    ck_buf_printf(&hdr, "x-amz-sso_bearer_token: %s", tok);
    hd = curl_slist_append(hd, ck_buf_str(&hdr));
    hd = curl_slist_append(hd, "Accept: application/json");
    if ((err = fetch(what, "GET", c->sso_url, hd, NULL, NULL, 5, 3, &resp, &status)) < 0)
        goto out;
    if (status == 401 || status == 403)
        err = ck_error(
            CK_EAUTH,
            "%s: the portal refused the cached token (HTTP %ld): run 'aws sso login --profile %s'",
            what, status, c->profile);
    else if (status != 200)
        err = ck_error(CK_ENET, "%s: HTTP %ld from the portal", what, status);
    else
        err = ck_awscred_sso_answer_parse(ck_buf_str(&resp), what, k, expiry);
out:
    explicit_bzero(tok, sizeof tok);
    wipe_headers(hd);
    wipe_bufs(&cache, &hdr, &resp);
    return err;
}

/* STS AssumeRole signed with the source keys (taken anew each time: they
 * may be temporary themselves and renewed). */
static int fetch_assume_role(struct ck_awscred *c, struct ck_awskeys *k, long long *expiry)
{
    struct ck_awskeys sk;
    struct ck_buf body = CK_BUF_INIT;
    char arn[6200], name[400], ext[4000];
    int err;
    memset(&sk, 0, sizeof sk);
    if ((err = ck_awscred_get(c->source, &sk)) < 0) {
        err = ck_error_wrap(err, "assume role '%s' (profile '%s'): its source credentials",
                            c->role_arn, c->profile);
        goto out;
    }
    if (ck_store_encode(arn, sizeof arn, c->role_arn, false) < 0 ||
        ck_store_encode(name, sizeof name, c->session_name, false) < 0 ||
        ck_store_encode(ext, sizeof ext, c->external_id, false) < 0) {
        err = ck_error(CK_ECONFIG,
                       "profile '%s': role_arn, role_session_name or external_id is "
                       "too long",
                       c->profile);
        goto out;
    }
    ck_buf_printf(&body, "Action=AssumeRole&DurationSeconds=%ld", c->duration_s);
    if (c->external_id[0])
        ck_buf_printf(&body, "&ExternalId=%s", ext);
    ck_buf_printf(&body, "&RoleArn=%s&RoleSessionName=%s&Version=2011-06-15", arn, name);
    struct signing sign = {&sk, c->sigv4};
    char whom[2600];
    snprintf(whom, sizeof whom, "role '%s' for profile '%s' (source: %s)", c->role_arn, c->profile,
             src_names[c->source->kind]);
    err = sts_call(c->sts_url, ck_buf_str(&body), &sign, "assume role", "AssumeRole", whom, k,
                   expiry);
out:
    ck_awskeys_wipe(&sk);
    ck_buf_release(&body);
    return err;
}

static int fetch_again(struct ck_awscred *c, struct ck_awskeys *k, long long *expiry)
{
    switch (c->kind) {
    case SRC_ASSUME_ROLE:
        return fetch_assume_role(c, k, expiry);
    case SRC_WEB_IDENTITY:
        return fetch_web_identity(c, k, expiry);
    case SRC_SSO:
        return fetch_sso(c, k, expiry);
    case SRC_PROCESS:
        return fetch_process(c, k, expiry);
    case SRC_CONTAINER:
        return fetch_container(c, k, expiry);
    case SRC_IMDS:
        return fetch_imds(c, k, expiry);
    default:
        return ck_error(CK_EAUTH, "credentials from %s cannot be renewed", src_names[c->kind]);
    }
}

/* ---- the chain ---- */

static int from_explicit_file(struct ck_awscred *c, const char *ref)
{
    char *text = NULL;
    int err;
    /* ck_secret_load checks the mode (0600) before anything is read */
    if ((err = ck_secret_load(ref, &text)) < 0)
        return err;
    ck_secret_free(text);
    struct ck_awsini *f = NULL;
    if ((err = ck_awsini_load(&f, ref + 5)) < 0)
        return err;
    const char *sec = ck_awsini_has_section(f, "default") ? "default" : ck_awsini_first_section(f);
    err = sec ? set_keys(&c->keys, ck_awsini_get(f, sec, "aws_access_key_id"),
                         ck_awsini_get(f, sec, "aws_secret_access_key"),
                         ck_awsini_get(f, sec, "aws_session_token"), ref)
              : ck_error(CK_ECONFIG, "credentials '%s': no section in it", ref);
    if (err < 0)
        err =
            ck_error(CK_ECONFIG,
                     "credentials '%s': no aws_access_key_id and aws_secret_access_key in it", ref);
    ck_awsini_free(f);
    snprintf(c->where, sizeof c->where, "%s", ref + 5);
    return err;
}

static bool from_env(struct ck_awscred *c)
{
    if (!env("AWS_ACCESS_KEY_ID") || !env("AWS_SECRET_ACCESS_KEY"))
        return false;
    return set_keys(&c->keys, env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"),
                    env("AWS_SESSION_TOKEN"), "AWS_ACCESS_KEY_ID") == 0;
}

static int sts_url(struct ck_awscred *c, const struct ck_awsprofile *p, const char *region)
{
    int err = ck_awsconfig_endpoint(c->sts_url, sizeof c->sts_url, NULL, "sts", p);
    if (err < 0)
        return err;
    if (!c->sts_url[0])
        snprintf(c->sts_url, sizeof c->sts_url, "https://sts.%s.amazonaws.com", region);
    size_t l = strlen(c->sts_url);
    if (l + 1 < sizeof c->sts_url && c->sts_url[l - 1] != '/')
        strcat(c->sts_url, "/");
    return 0;
}

/* Web identity from the environment (with use_env), else from the
 * profile. 1 when configured. */
static int web_identity_config(struct ck_awscred *c, const struct ck_awsprofile *p, bool use_env)
{
    const char *file = use_env ? env("AWS_WEB_IDENTITY_TOKEN_FILE") : NULL,
               *arn = use_env ? env("AWS_ROLE_ARN") : NULL,
               *name = use_env ? env("AWS_ROLE_SESSION_NAME") : NULL;
    if (!file || !arn) {
        file = ck_awsprofile_config(p, "web_identity_token_file");
        arn = ck_awsprofile_config(p, "role_arn");
        name = ck_awsprofile_config(p, "role_session_name");
        snprintf(c->where, sizeof c->where, "profile %s", p ? p->name : "default");
    } else {
        snprintf(c->where, sizeof c->where, "AWS_WEB_IDENTITY_TOKEN_FILE");
    }
    if (!file || !arn)
        return 0;
    if (strlen(file) >= sizeof c->token_file || strlen(arn) >= sizeof c->role_arn ||
        (name && strlen(name) >= sizeof c->session_name))
        return ck_error(CK_ECONFIG,
                        "web identity: the token file, role or session name is too long");
    snprintf(c->token_file, sizeof c->token_file, "%s", file);
    snprintf(c->role_arn, sizeof c->role_arn, "%s", arn);
    if (name)
        snprintf(c->session_name, sizeof c->session_name, "%s", name);
    else
        snprintf(c->session_name, sizeof c->session_name, "ckptd-%lld", now_s());
    return 1;
}

/* The profile's keys in the credentials file (config_file false) or the
 * config file. 1 when found. */
static int from_shared(struct ck_awscred *c, const struct ck_awsprofile *p, bool config_file)
{
    const char *id = config_file ? NULL : ck_awsprofile_creds(p, "aws_access_key_id");
    if (id) {
        snprintf(c->where, sizeof c->where, "%s [%s]", p->creds_path, p->name);
        return set_keys(&c->keys, id, ck_awsprofile_creds(p, "aws_secret_access_key"),
                        ck_awsprofile_creds(p, "aws_session_token"), c->where) == 0
                   ? 1
                   : ck_error(CK_ECONFIG,
                              "'%s' profile '%s': aws_access_key_id without "
                              "aws_secret_access_key",
                              p->creds_path, p->name);
    }
    if (config_file && (id = ck_awsprofile_config(p, "aws_access_key_id"))) {
        snprintf(c->where, sizeof c->where, "%s [profile %s]", p->config_path, p->name);
        return set_keys(&c->keys, id, ck_awsprofile_config(p, "aws_secret_access_key"),
                        ck_awsprofile_config(p, "aws_session_token"), c->where) == 0
                   ? 1
                   : ck_error(CK_ECONFIG,
                              "'%s' profile '%s': aws_access_key_id without "
                              "aws_secret_access_key",
                              p->config_path, p->name);
    }
    return 0;
}

/* A key of the profile, the credentials file's first (the AWS CLI merges
 * the two files, the credentials file winning). */
static const char *profile_get(const struct ck_awsprofile *p, const char *key)
{
    const char *v = ck_awsprofile_creds(p, key);
    return v ? v : ck_awsprofile_config(p, key);
}

/* The profile's credential_process. 1 when configured. */
static int process_config(struct ck_awscred *c, const struct ck_awsprofile *p)
{
    const char *cmd = profile_get(p, "credential_process");
    if (!cmd || !*cmd)
        return 0;
    snprintf(c->process_what, sizeof c->process_what, "credential_process of profile '%s'",
             p->name);
    if (strlen(cmd) >= sizeof c->process_cmd)
        return ck_error(CK_ECONFIG, "%s: the command is too long", c->process_what);
    snprintf(c->process_cmd, sizeof c->process_cmd, "%s", cmd);
    snprintf(c->where, sizeof c->where, "profile %s credential_process", p->name);
    return 1;
}

/* The profile's IAM Identity Center settings, as the AWS CLI's SSO provider
 * reads them: sso_account_id and sso_role_name in the profile, sso_start_url
 * and sso_region in the [sso-session NAME] section it names (or, the older
 * form, in the profile itself). The token cache is
 * ~/.aws/sso/cache/<SHA-1 hex of the session name, else of the start URL>.json.
 * 1 when configured. */
static int sso_config(struct ck_awscred *c, const struct ck_awsprofile *p)
{
    const char *account = profile_get(p, "sso_account_id"), *role = profile_get(p, "sso_role_name"),
               *session = profile_get(p, "sso_session"), *start = profile_get(p, "sso_start_url"),
               *region = profile_get(p, "sso_region");
    if (!account && !role) {
        /* sign-in settings alone give no keys: rather than another identity
         * further down the chain, say so (unless the profile has keys or a
         * process of its own) */
        if ((session || start) && !profile_get(p, "credential_process") &&
            !profile_get(p, "aws_access_key_id"))
            return ck_error(CK_ECONFIG,
                            "profile '%s' uses IAM Identity Center but has no sso_account_id and "
                            "sso_role_name",
                            p->name);
        return 0;
    }
    if (session) {
        char sect[300];
        snprintf(sect, sizeof sect, "sso-session %s", session);
        if (!ck_awsini_has_section(p->config, sect))
            return ck_error(CK_ECONFIG, "profile '%s': its sso_session '%s' has no [%s] in '%s'",
                            p->name, session, sect, p->config_path);
        static const char *const shared[] = {"sso_start_url", "sso_region"};
        const char **mine[] = {&start, &region};
        for (int i = 0; i < 2; i++) {
            const char *v = ck_awsini_get(p->config, sect, shared[i]);
            if (v && *mine[i] && strcmp(v, *mine[i]))
                return ck_error(CK_ECONFIG, "profile '%s': %s differs between the profile and [%s]",
                                p->name, shared[i], sect);
            if (v)
                *mine[i] = v;
        }
    }
    char missing[200] = "";
    const char *const names[] = {"sso_start_url", "sso_region", "sso_account_id", "sso_role_name"};
    const char *const vals[] = {start, region, account, role};
    for (int i = 0; i < 4; i++)
        if (!vals[i] || !*vals[i])
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s",
                     missing[0] ? ", " : "", names[i]);
    if (missing[0])
        return ck_error(CK_ECONFIG, "profile '%s' is set up for IAM Identity Center but misses %s",
                        p->name, missing);
    const char *home = env("HOME");
    if (!home)
        return ck_error(CK_ECONFIG,
                        "profile '%s': IAM Identity Center's token cache is under "
                        "~/.aws/sso/cache, and HOME is not set",
                        p->name);
    /* the cache file's name, as the AWS CLI derives it */
    const char *key = session ? session : start;
    struct sha1_ctx h;
    uint8_t bin[SHA1_DIGEST_SIZE];
    char hex[2 * SHA1_DIGEST_SIZE + 1], base[600], acc[200], rol[400];
    sha1_init(&h);
    sha1_update(&h, strlen(key), (const uint8_t *)key);
    sha1_digest(&h, sizeof bin, bin);
    ck_hex(hex, bin, sizeof bin);
    int n = snprintf(c->sso_cache, sizeof c->sso_cache, "%s/.aws/sso/cache/%s.json", home, hex);
    if (n < 0 || (size_t)n >= sizeof c->sso_cache)
        return ck_error(CK_ECONFIG, "HOME is too long");
    int err = ck_awsconfig_endpoint(base, sizeof base, NULL, "sso", p);
    if (err < 0)
        return err;
    if (!base[0])
        snprintf(base, sizeof base, "https://portal.sso.%s.amazonaws.com", region);
    size_t bl = strlen(base);
    while (bl && base[bl - 1] == '/')
        base[--bl] = '\0';
    if (ck_store_encode(acc, sizeof acc, account, false) < 0 ||
        ck_store_encode(rol, sizeof rol, role, false) < 0 || strlen(p->name) >= sizeof c->profile)
        return ck_error(CK_ECONFIG, "profile '%s': sso_account_id or sso_role_name is too long",
                        p->name);
    snprintf(c->sso_url, sizeof c->sso_url, "%s/federation/credentials?account_id=%s&role_name=%s",
             base, acc, rol);
    /* only the sso-session form refreshes its token (as the AWS CLI) */
    c->sso_refreshes = session != NULL;
    if ((err = ck_awsconfig_endpoint(c->sso_oidc_url, sizeof c->sso_oidc_url, NULL, "sso_oidc",
                                     p)) < 0)
        return err;
    if (!c->sso_oidc_url[0])
        snprintf(c->sso_oidc_url, sizeof c->sso_oidc_url, "https://oidc.%s.amazonaws.com", region);
    snprintf(c->profile, sizeof c->profile, "%s", p->name);
    snprintf(c->where, sizeof c->where, "profile %s %s %s, role %s in account %s", p->name,
             session ? "sso_session" : "sso_start_url", key, role, account);
    return 1;
}

/* Full URIs must stay on this host or the known link-local agents, or use TLS (as the SDKs check).
 */
static bool container_host_allowed(const char *url)
{
    if (!strncmp(url, "https://", 8))
        return true;
    if (strncmp(url, "http://", 7))
        return false;
    const char *h = url + 7;
    static const char *const ok[] = {"127.",          "localhost",      "[::1]",
                                     "169.254.170.2", "169.254.170.23", "[fd00:ec2::23]"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        size_t l = strlen(ok[i]);
        if (!strncmp(h, ok[i], l) &&
            (ok[i][l - 1] == '.' || h[l] == '\0' || h[l] == ':' || h[l] == '/'))
            return true;
    }
    return false;
}

static int container_config(struct ck_awscred *c)
{
    const char *rel = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"),
               *full = env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    if (rel) {
        /* CKPTD_TEST_ECS_HOST lets the tests stand in for 169.254.170.2 */
        const char *host = env("CKPTD_TEST_ECS_HOST") ? env("CKPTD_TEST_ECS_HOST") : ECS_HOST;
        int n = snprintf(c->container_url, sizeof c->container_url, "%s%s", host, rel);
        if (rel[0] != '/' || n < 0 || (size_t)n >= sizeof c->container_url)
            return ck_error(CK_ECONFIG, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI must be a path");
    } else if (full) {
        if (!container_host_allowed(full) || strlen(full) >= sizeof c->container_url)
            return ck_error(CK_ECONFIG,
                            "AWS_CONTAINER_CREDENTIALS_FULL_URI '%s' is neither https nor a "
                            "loopback or container agent address",
                            full);
        snprintf(c->container_url, sizeof c->container_url, "%s", full);
    } else {
        return 0;
    }
    const char *tf = env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
    if (tf && strlen(tf) < sizeof c->container_token_file)
        snprintf(c->container_token_file, sizeof c->container_token_file, "%s", tf);
    ck_store_url_redact(c->where, sizeof c->where, c->container_url);
    return 1;
}

static bool imds_enabled(struct ck_awscred *c, const struct ck_awsprofile *p)
{
    const char *off = env("AWS_EC2_METADATA_DISABLED");
    if (off && !strcasecmp(off, "true"))
        return false;
    const char *ep = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    if (!ep)
        ep = ck_awsprofile_config(p, "ec2_metadata_service_endpoint");
    snprintf(c->imds_url, sizeof c->imds_url, "%s", ep ? ep : IMDS_HOST);
    size_t l = strlen(c->imds_url);
    while (l && c->imds_url[l - 1] == '/')
        c->imds_url[--l] = '\0';
    snprintf(c->where, sizeof c->where, "%s", c->imds_url);
    return true;
}

static int fetch_first(struct ck_awscred *c)
{
    int err = fetch_again(c, &c->keys, &c->expiry);
    c->fetched = now_s();
    return err;
}

static int assume_role_config(struct ck_awscred *c, const struct ck_awsprofile *p,
                              const char *region, int depth);

/* The keys that sign a role's AssumeRole: credential_source (Environment,
 * Ec2InstanceMetadata, EcsContainer) or source_profile, whose own keys are
 * taken as the AWS CLI takes them: another role (chained), web identity, IAM
 * Identity Center, a credential_process, or static keys (a profile that names itself as its
 * source uses its static keys). */
static int role_source(struct ck_awscred *s, const struct ck_awsprofile *p, const char *region,
                       int depth)
{
    const char *sp = profile_get(p, "source_profile"), *cs = profile_get(p, "credential_source");
    int err;
    if (sp && cs)
        return ck_error(CK_ECONFIG, "profile '%s': both source_profile and credential_source",
                        p->name);
    if (cs) {
        snprintf(s->where, sizeof s->where, "credential_source %s", cs);
        if (!strcmp(cs, "Environment")) {
            s->kind = SRC_ENV;
            return from_env(s) ? 0
                               : ck_error(CK_ECONFIG,
                                          "profile '%s': credential_source Environment, but "
                                          "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set",
                                          p->name);
        }
        if (!strcmp(cs, "EcsContainer")) {
            s->kind = SRC_CONTAINER;
            if ((err = container_config(s)) == 0)
                err = ck_error(CK_ECONFIG,
                               "profile '%s': credential_source EcsContainer, but neither "
                               "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI nor _FULL_URI is set",
                               p->name);
            return err < 0 ? err : fetch_first(s);
        }
        if (!strcmp(cs, "Ec2InstanceMetadata")) {
            s->kind = SRC_IMDS;
            if (!imds_enabled(s, p))
                return ck_error(CK_ECONFIG,
                                "profile '%s': credential_source Ec2InstanceMetadata, but "
                                "AWS_EC2_METADATA_DISABLED is true",
                                p->name);
            return fetch_first(s);
        }
        return ck_error(CK_ECONFIG,
                        "profile '%s': credential_source '%s' is none of Environment, "
                        "Ec2InstanceMetadata, EcsContainer",
                        p->name, cs);
    }
    struct ck_awsprofile q = *p; /* the same files, borrowed */
    if (strlen(sp) >= sizeof q.name)
        return ck_error(CK_ECONFIG, "profile '%s': source_profile is too long", p->name);
    snprintf(q.name, sizeof q.name, "%s", sp);
    if (!ck_awsprofile_exists(&q))
        return ck_error(CK_ECONFIG,
                        "profile '%s': its source_profile '%s' is in neither '%s' nor '%s'",
                        p->name, sp, p->creds_path, p->config_path);
    if (strcmp(sp, p->name) != 0) {
        s->kind = SRC_ASSUME_ROLE;
        if ((err = assume_role_config(s, &q, region, depth + 1)) != 0)
            return err < 0 ? err : fetch_first(s);
        s->kind = SRC_WEB_IDENTITY;
        if ((err = web_identity_config(s, &q, false)) != 0) {
            if (err < 0 || (err = sts_url(s, &q, region)) < 0)
                return err;
            return fetch_first(s);
        }
        s->kind = SRC_SSO;
        if ((err = sso_config(s, &q)) != 0)
            return err < 0 ? err : fetch_first(s);
        s->kind = SRC_PROCESS;
        if ((err = process_config(s, &q)) != 0)
            return err < 0 ? err : fetch_first(s);
    }
    s->kind = SRC_SHARED;
    if ((err = from_shared(s, &q, false)) != 0 || (err = from_shared(s, &q, true)) != 0)
        return err < 0 ? err : 0;
    return ck_error(CK_ECONFIG, "profile '%s': its source_profile '%s' has no credentials", p->name,
                    sp);
}

/* A profile with role_arn and source_profile or credential_source (without
 * web_identity_token_file: that is web identity). 1 when configured, with
 * the source's keys in hand. */
static int assume_role_config(struct ck_awscred *c, const struct ck_awsprofile *p,
                              const char *region, int depth)
{
    const char *arn = profile_get(p, "role_arn");
    if (!arn || profile_get(p, "web_identity_token_file"))
        return 0;
    if (!profile_get(p, "source_profile") && !profile_get(p, "credential_source"))
        return ck_error(CK_ECONFIG,
                        "profile '%s': role_arn without source_profile, credential_source or "
                        "web_identity_token_file",
                        p->name);
    if (depth >= ROLE_CHAIN_MAX)
        return ck_error(CK_ECONFIG,
                        "profile '%s': more than %d roles chained through source_profile (a loop?)",
                        p->name, ROLE_CHAIN_MAX);
    const char *name = profile_get(p, "role_session_name"), *ext = profile_get(p, "external_id"),
               *dur = profile_get(p, "duration_seconds");
    if (strlen(arn) >= sizeof c->role_arn || (name && strlen(name) >= sizeof c->session_name) ||
        (ext && strlen(ext) >= sizeof c->external_id))
        return ck_error(CK_ECONFIG,
                        "profile '%s': role_arn, role_session_name or external_id is too long",
                        p->name);
    char *end = NULL;
    c->duration_s = dur ? strtol(dur, &end, 10) : 3600;
    if (dur && (*end || c->duration_s < 900 || c->duration_s > 43200))
        return ck_error(CK_ECONFIG,
                        "profile '%s': duration_seconds '%s' is not a number of seconds from 900 "
                        "to 43200",
                        p->name, dur);
    snprintf(c->role_arn, sizeof c->role_arn, "%s", arn);
    if (name)
        snprintf(c->session_name, sizeof c->session_name, "%s", name);
    else
        snprintf(c->session_name, sizeof c->session_name, "ckptd-%lld", now_s());
    snprintf(c->external_id, sizeof c->external_id, "%s", ext ? ext : "");
    snprintf(c->profile, sizeof c->profile, "%s", p->name);
    snprintf(c->sigv4, sizeof c->sigv4, "aws:amz:%s:sts", region);
    int err = sts_url(c, p, region);
    if (err < 0)
        return err;
    struct ck_awscred *src = calloc(1, sizeof *src);
    if (!src)
        return ck_error(CK_ENOMEM, "out of memory");
    pthread_mutex_init(&src->mu, NULL);
    c->source = src;
    if ((err = role_source(src, p, region, depth)) < 0)
        return err;
    snprintf(c->where, sizeof c->where, "profile %s role_arn %s, source: %s", p->name, arn,
             src_names[src->kind]);
    return 1;
}

static int resolve(struct ck_awscred *c, const char *ref, const struct ck_awsprofile *p,
                   const char *region, const char *label, struct ck_buf *tried)
{
    int err;
    if (ref && !strncmp(ref, "file:", 5)) {
        c->kind = SRC_EXPLICIT;
        return from_explicit_file(c, ref);
    }
    c->kind = SRC_ENV;
    snprintf(c->where, sizeof c->where, "AWS_ACCESS_KEY_ID");
    /* a profile named in the store's config (aws --profile) is used even when
     * keys are in the environment, as the AWS CLI does */
    if ((!p->explicit_name || (ref && !strcmp(ref, "env"))) && from_env(c))
        return 0;
    if (ref && !strcmp(ref, "env"))
        return ck_error(CK_ECONFIG,
                        "store '%s': AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set "
                        "(credentials: env)",
                        label);
    ck_buf_puts(tried,
                p->explicit_name ? "(not the environment: profile given)" : "the environment");
    c->kind = SRC_ASSUME_ROLE;
    if ((err = assume_role_config(c, p, region, 0)) < 0)
        return err;
    if (err == 1)
        return fetch_first(c);
    c->kind = SRC_WEB_IDENTITY;
    if ((err = web_identity_config(c, p, true)) < 0)
        return err;
    if (err == 1) {
        if ((err = sts_url(c, p, region)) < 0)
            return err;
        return fetch_first(c);
    }
    ck_buf_puts(tried, ", web identity");
    /* IAM Identity Center comes next in the AWS CLI's order */
    c->kind = SRC_SSO;
    if ((err = sso_config(c, p)) < 0)
        return err;
    if (err == 1)
        return fetch_first(c);
    /* the AWS CLI's order: the credentials file's keys, the profile's
     * credential_process, then the config file's keys */
    c->kind = SRC_SHARED;
    if ((err = from_shared(c, p, false)) != 0)
        return err < 0 ? err : 0;
    c->kind = SRC_PROCESS;
    if ((err = process_config(c, p)) < 0)
        return err;
    if (err == 1)
        return fetch_first(c);
    c->kind = SRC_SHARED;
    if ((err = from_shared(c, p, true)) != 0)
        return err < 0 ? err : 0;
    ck_buf_printf(tried, ", profile '%s' in '%s' and '%s'", p->name, p->creds_path, p->config_path);
    c->kind = SRC_CONTAINER;
    if ((err = container_config(c)) < 0)
        return err;
    if (err == 1)
        return fetch_first(c);
    ck_buf_puts(tried, ", container credentials");
    c->kind = SRC_IMDS;
    if (imds_enabled(c, p)) {
        if ((err = fetch_first(c)) == 0)
            return 0;
        ck_buf_printf(tried, ", instance metadata (%s)", ck_error_msg());
    } else {
        ck_buf_puts(tried, ", instance metadata (AWS_EC2_METADATA_DISABLED)");
    }
    return ck_error(CK_ECONFIG, "store '%s': no AWS credentials found; tried %s", label,
                    ck_buf_str(tried));
}

int ck_awscred_open(struct ck_awscred **out, const char *explicit_ref,
                    const struct ck_awsprofile *profile, const char *region, const char *label)
{
    *out = NULL;
    struct ck_awscred *c = calloc(1, sizeof *c);
    if (!c)
        return ck_error(CK_ENOMEM, "out of memory");
    pthread_mutex_init(&c->mu, NULL);
    struct ck_buf tried = CK_BUF_INIT;
    int err = resolve(c, explicit_ref, profile, region, label, &tried);
    ck_buf_release(&tried);
    if (err < 0) {
        ck_awscred_free(c);
        return err;
    }
    /* debug: the watcher opens its stores every round (ckptd upload -v shows it) */
    if (c->expiry)
        ck_debug("s3.credentials", "store=\"%s\" source=%s from=\"%s\" expires_in_seconds=%lld", label,
                 src_names[c->kind], c->where, c->expiry - now_s());
    else
        ck_debug("s3.credentials", "store=\"%s\" source=%s from=\"%s\"", label, src_names[c->kind],
                 c->where);
    *out = c;
    return 0;
}

void ck_awscred_free(struct ck_awscred *c)
{
    if (!c)
        return;
    ck_awscred_free(c->source);
    pthread_mutex_destroy(&c->mu);
    explicit_bzero(c, sizeof *c);
    free(c);
}

const char *ck_awscred_source(const struct ck_awscred *c)
{
    return src_names[c->kind];
}

/* Called with mu held. */
static int renew(struct ck_awscred *c, const char *reason)
{
    struct ck_awskeys nk;
    long long exp = 0;
    memset(&nk, 0, sizeof nk);
    int err = fetch_again(c, &nk, &exp);
    if (err == 0) {
        c->keys = nk;
        c->expiry = exp;
        c->fetched = now_s();
        ck_info("s3.credentials.refresh", "source=%s reason=%s expires_in_seconds=%lld",
                src_names[c->kind], reason, exp ? exp - c->fetched : 0);
    }
    ck_awskeys_wipe(&nk);
    return err;
}

int ck_awscred_get(struct ck_awscred *c, struct ck_awskeys *k)
{
    int err = 0;
    pthread_mutex_lock(&c->mu);
    if (c->expiry && renewable(c->kind)) {
        long long now = now_s(), life = c->expiry - c->fetched;
        long long window = life / 2 < 300 ? life / 2 : 300;
        /* a renewal that failed is tried again after 10 s, not by every request */
        if (now >= c->expiry - window && (now >= c->expiry || now >= c->retry_at) &&
            (err = renew(c, "expiring")) < 0) {
            c->retry_at = now + 10;
            if (now < c->expiry) {
                ck_warn("s3.credentials.refresh_failed",
                        "source=%s expires_in_seconds=%lld error=\"%s\" (keeping the current keys)",
                        src_names[c->kind], c->expiry - now, ck_error_msg());
                ck_error_clear();
                err = 0;
            }
        }
    }
    if (err == 0)
        *k = c->keys;
    pthread_mutex_unlock(&c->mu);
    return err;
}

bool ck_awscred_refresh_now(struct ck_awscred *c, const struct ck_awskeys *rejected)
{
    if (!renewable(c->kind))
        return false;
    pthread_mutex_lock(&c->mu);
    /* several parts may be refused at once: one fetch serves them all. The
     * token tells keys apart: IMDS and some STS setups renew the session
     * and keep the key id. */
    bool current = !strcmp(c->keys.id, rejected->id) && !strcmp(c->keys.token, rejected->token);
    int err = current ? renew(c, "rejected") : 0;
    pthread_mutex_unlock(&c->mu);
    if (err < 0)
        ck_warn("s3.credentials.refresh_failed", "source=%s error=\"%s\"", src_names[c->kind],
                ck_error_msg());
    return err == 0;
}
