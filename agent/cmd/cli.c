#include "agent/cmd/cli.h"
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
