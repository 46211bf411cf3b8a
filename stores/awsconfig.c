#include "stores/awsconfig.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define INI_MAX (1u << 20)

struct entry {
    char *section, *key, *value;
};

struct ck_awsini {
    struct entry *e;
    size_t n, cap;
};

static void wipe_free(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}

void ck_awsini_free(struct ck_awsini *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++) {
        free(f->e[i].section);
        free(f->e[i].key);
        wipe_free(f->e[i].value);
    }
    free(f->e);
    free(f);
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t l = strlen(s);
    while (l && (s[l - 1] == ' ' || s[l - 1] == '\t' || s[l - 1] == '\r'))
        s[--l] = '\0';
    return s;
}

static int add(struct ck_awsini *f, const char *section, const char *key, const char *value)
{
    /* a later line for the same key wins, as in the AWS CLI */
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->e[i].section, section) && !strcasecmp(f->e[i].key, key)) {
            char *v = strdup(value);
            if (!v)
                return ck_error(CK_ENOMEM, "out of memory");
            wipe_free(f->e[i].value);
            f->e[i].value = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        struct entry *e = realloc(f->e, cap * sizeof *e);
        if (!e)
            return ck_error(CK_ENOMEM, "out of memory");
        f->e = e;
        f->cap = cap;
    }
    struct entry *e = &f->e[f->n];
    e->section = strdup(section);
    e->key = strdup(key);
    e->value = strdup(value);
    if (!e->section || !e->key || !e->value) {
        free(e->section), free(e->key), wipe_free(e->value);
        return ck_error(CK_ENOMEM, "out of memory");
    }
    f->n++;
    return 0;
}

static int parse(struct ck_awsini *f, char *text, const char *path)
{
    char section[256] = "", parent[128] = "";
    bool have_section = false;
    int lineno = 0, err;
    for (char *save = NULL, *raw = strtok_r(text, "\n", &save); raw;
         raw = strtok_r(NULL, "\n", &save)) {
        lineno++;
        bool indented = *raw == ' ' || *raw == '\t';
        char *line = trim(raw);
        if (!*line || *line == '#' || *line == ';')
            continue;
        if (*line == '[') {
            char *end = strchr(line, ']');
            if (!end)
                return ck_error(CK_ECONFIG, "'%s': line %d: a section without ']'", path, lineno);
            *end = '\0';
            char *name = trim(line + 1);
            if (strlen(name) >= sizeof section)
                return ck_error(CK_ECONFIG, "'%s': line %d: the section name is too long", path,
                                lineno);
            /* "[profile  x]" and "[profile x]" are the same section */
            if (!strncmp(name, "profile", 7) && (name[7] == ' ' || name[7] == '\t'))
                snprintf(section, sizeof section, "profile %s", trim(name + 8));
            else
                snprintf(section, sizeof section, "%s", name);
            have_section = true;
            parent[0] = '\0';
            continue;
        }
        char *eq = strchr(line, '=');
        if (!eq || !have_section)
            continue; /* the AWS CLI ignores such lines too */
        *eq = '\0';
        char *k = trim(line), *v = trim(eq + 1);
        char key[256];
        if (indented && parent[0]) {
            snprintf(key, sizeof key, "%s.%s", parent, k);
        } else {
            snprintf(key, sizeof key, "%s", k);
            /* "s3 =" with nothing after opens nested settings */
            if (!*v && strlen(k) < sizeof parent)
                snprintf(parent, sizeof parent, "%s", k);
            else
                parent[0] = '\0';
        }
        if ((err = add(f, section, key, v)) < 0)
            return err;
    }
    return 0;
}

int ck_awsini_load(struct ck_awsini **out, const char *path)
{
    *out = NULL;
    struct ck_buf b = CK_BUF_INIT;
    FILE *probe = fopen(path, "r");
    if (!probe)
        return 0; /* absent or unreadable: treated as empty, like the AWS CLI */
    fclose(probe);
    int err = ck_read_file(path, INI_MAX, &b);
    if (err < 0) {
        ck_buf_release(&b);
        return ck_error(CK_ECONFIG, "cannot read '%s' (at most 1 MiB)", path);
    }
    struct ck_awsini *f = calloc(1, sizeof *f);
    if (!f) {
        err = ck_error(CK_ENOMEM, "out of memory");
    } else {
        err = parse(f, (char *)ck_buf_str(&b), path);
    }
    ck_buf_wipe(&b);
    if (err < 0) {
        ck_awsini_free(f);
        return err;
    }
    *out = f;
    return 0;
}

const char *ck_awsini_get(const struct ck_awsini *f, const char *section, const char *key)
{
    for (size_t i = 0; f && i < f->n; i++)
        if (!strcmp(f->e[i].section, section) && !strcasecmp(f->e[i].key, key))
            return f->e[i].value;
    return NULL;
}

bool ck_awsini_has_section(const struct ck_awsini *f, const char *section)
{
    for (size_t i = 0; f && i < f->n; i++)
        if (!strcmp(f->e[i].section, section))
            return true;
    return false;
}

const char *ck_awsini_first_section(const struct ck_awsini *f)
{
    return f && f->n ? f->e[0].section : NULL;
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static void default_path(char *out, size_t outsz, const char *var, const char *file)
{
    const char *v = env(var), *home = env("HOME");
    if (v && v[0] == '~' && v[1] == '/' && home)
        snprintf(out, outsz, "%s%s", home, v + 1);
    else if (v)
        snprintf(out, outsz, "%s", v);
    else
        snprintf(out, outsz, "%s/.aws/%s", home ? home : "", file);
}

/* The profile's section name in the config file. */
static void config_section(char *out, size_t outsz, const struct ck_awsprofile *p)
{
    if (!strcmp(p->name, "default") && ck_awsini_has_section(p->config, "default"))
        snprintf(out, outsz, "default");
    else
        snprintf(out, outsz, "profile %s", p->name);
}

int ck_awsprofile_open(struct ck_awsprofile *p, const char *name)
{
    memset(p, 0, sizeof *p);
    p->explicit_name = name != NULL;
    if (!name)
        name = env("AWS_PROFILE");
    if (!name)
        name = env("AWS_DEFAULT_PROFILE");
    p->named = name != NULL;
    if (strlen(name ? name : "") >= sizeof p->name)
        return ck_error(CK_ECONFIG, "%s: the profile name is too long",
                        p->explicit_name ? "profile" : "AWS_PROFILE");
    snprintf(p->name, sizeof p->name, "%s", name ? name : "default");
    default_path(p->config_path, sizeof p->config_path, "AWS_CONFIG_FILE", "config");
    default_path(p->creds_path, sizeof p->creds_path, "AWS_SHARED_CREDENTIALS_FILE", "credentials");
    int err;
    if ((err = ck_awsini_load(&p->config, p->config_path)) < 0 ||
        (err = ck_awsini_load(&p->creds, p->creds_path)) < 0) {
        ck_awsprofile_release(p);
        return err;
    }
    if (p->named && !ck_awsprofile_exists(p)) {
        err = ck_error(CK_ECONFIG, "the AWS profile '%s' is in neither '%s' nor '%s'", p->name,
                       p->config_path, p->creds_path);
        ck_awsprofile_release(p);
        return err;
    }
    return 0;
}

bool ck_awsprofile_exists(const struct ck_awsprofile *p)
{
    char sec[300];
    config_section(sec, sizeof sec, p);
    return ck_awsini_has_section(p->config, sec) || ck_awsini_has_section(p->creds, p->name);
}

void ck_awsprofile_release(struct ck_awsprofile *p)
{
    ck_awsini_free(p->config);
    ck_awsini_free(p->creds);
    p->config = p->creds = NULL;
}

const char *ck_awsprofile_config(const struct ck_awsprofile *p, const char *key)
{
    char sec[300];
    if (!p)
        return NULL;
    config_section(sec, sizeof sec, p);
    const char *v = ck_awsini_get(p->config, sec, key);
    return v && *v ? v : NULL;
}

const char *ck_awsprofile_creds(const struct ck_awsprofile *p, const char *key)
{
    const char *v = p ? ck_awsini_get(p->creds, p->name, key) : NULL;
    return v && *v ? v : NULL;
}

void ck_awsconfig_region(char *out, size_t outsz, const char *given, const struct ck_awsprofile *p)
{
    const char *r = given && *given ? given : NULL;
    if (!r)
        r = env("AWS_REGION");
    if (!r)
        r = env("AWS_DEFAULT_REGION");
    if (!r)
        r = ck_awsprofile_config(p, "region");
    snprintf(out, outsz, "%s", r ? r : "us-east-1");
}

int ck_awsconfig_endpoint(char *out, size_t outsz, const char *given, const char *service,
                          const struct ck_awsprofile *p)
{
    char var[64], key[64];
    const char *v = given && *given ? given : NULL, *from = "endpoint";
    const char *ignore = env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS");
    bool configured = !(ignore && !strcasecmp(ignore, "true"));
    snprintf(var, sizeof var, "AWS_ENDPOINT_URL_%s", service);
    for (char *c = var; *c; c++)
        *c = (char)toupper((unsigned char)*c);
    snprintf(key, sizeof key, "%s.endpoint_url", service);
    if (!v && configured && (v = env(var)))
        from = var;
    if (!v && configured && (v = env("AWS_ENDPOINT_URL")))
        from = "AWS_ENDPOINT_URL";
    if (!v && configured && (v = ck_awsprofile_config(p, key)))
        from = p->config_path;
    if (!v && configured && (v = ck_awsprofile_config(p, "endpoint_url")))
        from = p->config_path;
    out[0] = '\0';
    if (!v)
        return 0;
    if (strncmp(v, "http://", 7) && strncmp(v, "https://", 8))
        return ck_error(CK_ECONFIG, "%s: the %s endpoint '%s' must start with http:// or https://",
                        from, service, v);
    if (strlen(v) >= outsz)
        return ck_error(CK_ECONFIG, "%s: the %s endpoint is too long", from, service);
    snprintf(out, outsz, "%s", v);
    size_t l = strlen(out);
    while (l && out[l - 1] == '/')
        out[--l] = '\0';
    return 0;
}
