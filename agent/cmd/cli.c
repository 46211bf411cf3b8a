#include "agent/cmd/cli.h"
#include "stores/store.h"
#include "common/error.h"
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const struct ck_command *ck_command_find(const char *name)
{
    for (const struct ck_command *c = ck_commands; c->name; c++)
        if (!strcmp(c->name, name))
            return c;
    return NULL;
}

void ck_cli_init(struct ck_cli *c)
{
    memset(c, 0, sizeof *c);
    c->log_format = -1;
    c->log_level = -1;
}

int ck_cli_common(struct ck_cli *c, const char *cmd, int opt, const char *arg)
{
    switch (opt) {
    case 'c':
        c->config_path = arg;
        return 1;
    case CK_OPT_LOG_FORMAT:
        c->log_format = ck_log_format_parse(arg);
        if (c->log_format < 0)
            return ck_cli_usage_error(cmd, "--log-format takes 'text' or 'json', not '%s'", arg);
        return 1;
    case 'v':
        c->log_level = CK_LOG_DEBUG;
        return 1;
    case 'q':
        c->log_level = CK_LOG_WARN;
        return 1;
    case 'h':
        c->help = true;
        return 1;
    case '?':
        return ck_cli_usage_error(cmd, "unknown option or missing argument");
    default:
        return 0;
    }
}

void ck_cli_setup_logging(const struct ck_cli *c, int cfg_format, int cfg_level)
{
    ck_log_setup_over(c->log_format, c->log_level, cfg_format, cfg_level);
}

int ck_cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "ckptd %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'ckptd %s --help'.\n", cmd);
    return CK_EXIT_USAGE;
}

int ck_cli_fail(const char *cmd, int err)
{
    const char *msg = ck_error_msg();
    if (ck_log_format_get() == CK_LOG_JSON)
        ck_err("command.failed", "%s: %s", cmd, *msg ? msg : ck_err_name(err));
    else
        fprintf(stderr, "ckptd %s: %s\n", cmd, *msg ? msg : ck_err_name(err));
    return ck_exit_code(err);
}

/* ---- options from a table ---- */

#define MAX_OPTS 48

/* "--a and --b" for the CK_OPT_VALUE rows sharing t's field */
static void value_group(const struct ck_opt *table, const struct ck_opt *t, char *out, size_t n)
{
    out[0] = '\0';
    for (const struct ck_opt *o = table; o->name; o++)
        if (o->kind == CK_OPT_VALUE && o->offset == t->offset)
            snprintf(out + strlen(out), n - strlen(out), "%s--%s", out[0] ? " and " : "",
                     o->name);
}

static int apply(const char *cmd, const struct ck_opt *table, const struct ck_opt *t,
                 const char *arg, void *opts, struct ck_cli *cli)
{
    char *field = (char *)opts + t->offset;
    const char *value = t->arg ? arg : t->fixed;
    switch (t->kind) {
    case CK_OPT_SET:
    case CK_OPT_CLEAR:
        *(bool *)field = t->kind == CK_OPT_SET;
        return 0;
    case CK_OPT_STR:
        *(const char **)field = arg;
        return 0;
    case CK_OPT_VALUE: {
        char group[128];
        if (*(int *)field >= 0) {
            value_group(table, t, group, sizeof group);
            return ck_cli_usage_error(cmd, "%s exclude each other", group);
        }
        *(int *)field = t->value;
        return 0;
    }
    case CK_OPT_CONFIG: {
        if (cli->noverrides == CK_CLI_MAX_OVERRIDES)
            return ck_cli_usage_error(cmd, "too many options");
        char *origin = cli->origins[cli->noverrides];
        snprintf(origin, sizeof cli->origins[0], "--%s", t->name);
        /* checked now by the key's parser, so a bad value is a usage error at once */
        struct ck_config scratch;
        ck_config_init(&scratch);
        int err = ck_config_set(&scratch, t->key, value, origin);
        ck_config_release(&scratch);
        if (err < 0)
            return ck_cli_usage_error(cmd, "%s", ck_error_msg());
        cli->overrides[cli->noverrides++] = (struct ck_config_override){t->key, value, origin};
        return 0;
    }
    case CK_OPT_STORE:
        if (ck_store_spec_set((struct ck_store_spec *)field, t->key, value) < 0)
            return ck_cli_usage_error(cmd, "%s", ck_error_msg());
        return 0;
    }
    return 0;
}

int ck_cli_parse(const char *cmd, int argc, char **argv, const struct ck_opt *table, void *opts,
                 struct ck_cli *cli, bool permute)
{
    static const struct option common[] = {CK_CLI_LONGOPTS};
    struct option lo[MAX_OPTS + 8];
    char so[2 * MAX_OPTS + 16];
    size_t n = 0, nt = 0;
    for (size_t i = 0; i < sizeof common / sizeof common[0]; i++)
        lo[n++] = common[i];
    snprintf(so, sizeof so, "%s", permute ? CK_CLI_SHORTOPTS + 1 : CK_CLI_SHORTOPTS);
    for (const struct ck_opt *t = table; t->name && nt < MAX_OPTS; t++, nt++) {
        lo[n++] = (struct option){t->name, t->arg ? required_argument : no_argument, NULL,
                                  CK_OPT_FIRST_COMMAND_OPTION + (int)nt};
        if (t->shortname) {
            size_t len = strlen(so);
            so[len++] = t->shortname;
            if (t->arg)
                so[len++] = ':';
            so[len] = '\0';
        }
    }
    lo[n] = (struct option){NULL, 0, NULL, 0};
    int opt, rc;
    optind = 1;
    while ((opt = getopt_long(argc, argv, so, lo, NULL)) != -1) {
        if ((rc = ck_cli_common(cli, cmd, opt, optarg)) != 0) {
            if (rc != 1)
                return rc;
            continue;
        }
        const struct ck_opt *t = NULL;
        if (opt >= CK_OPT_FIRST_COMMAND_OPTION && opt < CK_OPT_FIRST_COMMAND_OPTION + (int)nt)
            t = &table[opt - CK_OPT_FIRST_COMMAND_OPTION];
        for (const struct ck_opt *o = table; !t && o->name; o++)
            if (o->shortname && o->shortname == opt)
                t = o;
        if (!t)
            return ck_cli_usage_error(cmd, "unknown option");
        if ((rc = apply(cmd, table, t, optarg, opts, cli)) != 0)
            return rc;
    }
    return 0;
}

void ck_cli_help(const char *head, const struct ck_opt *table, const char *tail)
{
    fputs(head, stdout);
    for (const struct ck_opt *t = table; t->name; t++) {
        char flag[64];
        snprintf(flag, sizeof flag, "%s%c%s--%s%s%s", t->shortname ? "-" : "",
                 t->shortname ? t->shortname : ' ', t->shortname ? ", " : "", t->name,
                 t->arg ? " " : "", t->arg ? t->arg : "");
        const char *f = t->shortname ? flag : flag + 1; /* no "-x, ": no leading gap */
        printf("  %-22s", f);
        if (strlen(f) > 21)
            printf("\n  %22s", "");
        size_t col = 24;
        for (const char *p = t->help; *p; p++, col++) {
            putchar(*p);
            if (*p == '\n') {
                printf("  %22s", "");
                col = 23;
            }
        }
        /* the config key the flag sets, on its own line when it does not fit */
        if (t->kind == CK_OPT_CONFIG) {
            if (col + strlen(t->key) + 10 > 80)
                printf("\n  %22s[config: %s]", "", t->key);
            else
                printf(" [config: %s]", t->key);
        }
        putchar('\n');
    }
    fputs(CK_CLI_HELP, stdout);
    fputs(tail, stdout);
}
