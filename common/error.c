#include "common/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MSG_MAX 2048

static _Thread_local char msg[MSG_MAX];

static void vset(const char *fmt, va_list ap)
{
    vsnprintf(msg, sizeof msg, fmt, ap);
}

int ck_error(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(fmt, ap);
    va_end(ap);
    return code;
}

int ck_error_os(int code, const char *fmt, ...)
{
    int saved = errno;
    va_list ap;
    va_start(ap, fmt);
    vset(fmt, ap);
    va_end(ap);
    size_t n = strlen(msg);
    snprintf(msg + n, sizeof msg - n, ": %s", strerror(saved));
    errno = saved;
    return code;
}

int ck_error_wrap(int code, const char *fmt, ...)
{
    char prefix[MSG_MAX / 2], old[MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, msg, sizeof old);
    /* Truncation is fine for a message; %.*s keeps the compiler's checks quiet. */
    if (old[0])
        snprintf(msg, sizeof msg, "%s: %.*s", prefix, (int)(MSG_MAX / 2 - 3), old);
    else
        snprintf(msg, sizeof msg, "%s", prefix);
    return code;
}

const char *ck_error_msg(void)
{
    return msg;
}

void ck_error_clear(void)
{
    msg[0] = '\0';
}

const char *ck_err_name(int code)
{
    switch (code) {
    case CK_OK: return "ok";
    case CK_ENOMEM: return "nomem";
    case CK_EIO: return "io";
    case CK_EFORMAT: return "format";
    case CK_ENOENT: return "noent";
    case CK_ECONFIG: return "config";
    case CK_EUSAGE: return "usage";
    case CK_ELOCKED: return "locked";
    case CK_ECHANGED: return "changed";
    case CK_ESTATE: return "state";
    case CK_ENET: return "net";
    case CK_EAUTH: return "auth";
    case CK_EEXIST: return "exist";
    case CK_ESIZE: return "size";
    case CK_EUNREACH: return "unreachable";
    case CK_EREFUSED: return "refused";
    case CK_EUNSUPPORTED: return "unsupported";
    default: return "error";
    }
}

int ck_exit_code(int err)
{
    if (err >= 0)
        return CK_EXIT_OK;
    switch (err) {
    case CK_EUSAGE:
    case CK_ECONFIG: return CK_EXIT_USAGE;
    case CK_ELOCKED: return CK_EXIT_LOCKED;
    case CK_EUNSUPPORTED: return CK_EXIT_UNSUPPORTED;
    default: return CK_EXIT_FAILED;
    }
}
