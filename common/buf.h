/* A growable byte buffer with a maximum, always NUL-terminated. */
#ifndef CK_BUF_H
#define CK_BUF_H

#include <stdarg.h>
#include <stddef.h>

struct ck_buf {
    char *data;   /* owned; NUL-terminated; NULL until the first append */
    size_t len;
    size_t cap;
    size_t max;   /* appends past this fail with CK_ENOMEM; 0 means 1 GiB */
};

#define CK_BUF_INIT {NULL, 0, 0, 0}

void ck_buf_init(struct ck_buf *b, size_t max);
void ck_buf_release(struct ck_buf *b);
/* ck_buf_release for a buffer that held a secret: what it held is zeroed first. */
void ck_buf_wipe(struct ck_buf *b);
void ck_buf_reset(struct ck_buf *b);
int ck_buf_reserve(struct ck_buf *b, size_t extra);
int ck_buf_append(struct ck_buf *b, const void *data, size_t len);
int ck_buf_puts(struct ck_buf *b, const char *s);
int ck_buf_putc(struct ck_buf *b, char c);
int ck_buf_printf(struct ck_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ck_buf_vprintf(struct ck_buf *b, const char *fmt, va_list ap);
/* Hands the data to the caller (free() it); the buffer is empty afterwards. */
char *ck_buf_detach(struct ck_buf *b);
/* "" when empty, never NULL. */
const char *ck_buf_str(const struct ck_buf *b);

#endif
