#include "common/buf.h"
#include "common/error.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MAX ((size_t)1 << 30)

void ck_buf_init(struct ck_buf *b, size_t max)
{
    b->data = NULL;
    b->len = b->cap = 0;
    b->max = max;
}

void ck_buf_release(struct ck_buf *b)
{
    free(b->data);
    ck_buf_init(b, b->max);
}

void ck_buf_wipe(struct ck_buf *b)
{
    if (b->data)
        explicit_bzero(b->data, b->cap);
    ck_buf_release(b);
}

void ck_buf_reset(struct ck_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

int ck_buf_reserve(struct ck_buf *b, size_t extra)
{
    size_t max = b->max ? b->max : DEFAULT_MAX;
    if (extra > max || b->len > max - extra)
        return ck_error(CK_ENOMEM, "buffer would exceed its limit of %zu bytes", max);
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return ck_error(CK_ENOMEM, "out of memory growing a buffer to %zu bytes", cap);
    b->data = p;
    b->cap = cap;
    return 0;
}

int ck_buf_append(struct ck_buf *b, const void *data, size_t len)
{
    int err = ck_buf_reserve(b, len);
    if (err < 0)
        return err;
    if (len)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return 0;
}

int ck_buf_puts(struct ck_buf *b, const char *s)
{
    return ck_buf_append(b, s, strlen(s));
}

int ck_buf_putc(struct ck_buf *b, char c)
{
    return ck_buf_append(b, &c, 1);
}

int ck_buf_vprintf(struct ck_buf *b, const char *fmt, va_list ap)
{
    /* Formatted once into the room there is; again only when it did not fit
     * (a YAML file of 10,000 entries is that many calls: measuring each
     * first doubled their cost). */
    va_list ap2;
    va_copy(ap2, ap);
    size_t room = b->cap > b->len ? b->cap - b->len : 0;
    int n = vsnprintf(room ? b->data + b->len : NULL, room, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        if (room)
            b->data[b->len] = '\0';
        return ck_error(CK_ERR, "bad format string");
    }
    size_t max = b->max ? b->max : DEFAULT_MAX;
    if ((size_t)n < room && (size_t)n <= max && b->len <= max - (size_t)n) {
        b->len += (size_t)n;
        return 0;
    }
    if (room)
        b->data[b->len] = '\0'; /* what did not fit is not the buffer's */
    int err = ck_buf_reserve(b, (size_t)n);
    if (err < 0)
        return err;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return 0;
}

int ck_buf_printf(struct ck_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int err = ck_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return err;
}

char *ck_buf_detach(struct ck_buf *b)
{
    char *p = b->data;
    if (!p)
        p = calloc(1, 1);
    ck_buf_init(b, b->max);
    return p;
}

const char *ck_buf_str(const struct ck_buf *b)
{
    return b->data ? b->data : "";
}
