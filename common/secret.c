#include "common/secret.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SECRET_MAX 65536

int ck_secret_check_ref(const char *ref)
{
    if (!strncmp(ref, "env:", 4) && ref[4])
        return 0;
    if (!strncmp(ref, "file:", 5) && ref[5])
        return 0;
    return ck_error(CK_ECONFIG,
                    "a secret must be given as 'env:NAME' or 'file:/path' (mode 0600), "
                    "not written into the config");
}

int ck_secret_load(const char *ref, char **out)
{
    int err;
    *out = NULL;
    if ((err = ck_secret_check_ref(ref)) < 0)
        return err;
    if (!strncmp(ref, "env:", 4)) {
        const char *v = getenv(ref + 4);
        if (!v || !*v)
            return ck_error(CK_ECONFIG, "secret '%s': the environment variable is not set", ref);
        *out = strdup(v);
        return *out ? 0 : ck_error(CK_ENOMEM, "out of memory");
    }
    const char *path = ref + 5;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ck_error_os(CK_ECONFIG, "secret file '%s'", path);
    struct stat st;
    if (fstat(fd, &st) < 0) {
        err = ck_error_os(CK_ECONFIG, "secret file '%s'", path);
        close(fd);
        return err;
    }
    close(fd);
    if (st.st_mode & 077)
        return ck_error(CK_ECONFIG, "secret file '%s' has mode %04o: it must be 0600 or stricter",
                        path, (unsigned)(st.st_mode & 07777));
    struct ck_buf b = CK_BUF_INIT;
    if ((err = ck_read_file(path, SECRET_MAX, &b)) < 0) {
        ck_buf_release(&b);
        return ck_error(err, "cannot read secret file '%s'", path);
    }
    while (b.len && (b.data[b.len - 1] == '\n' || b.data[b.len - 1] == '\r'))
        b.data[--b.len] = '\0';
    *out = ck_buf_detach(&b);
    return 0;
}

void ck_secret_free(char *secret)
{
    if (!secret)
        return;
    /* volatile so the compiler cannot drop the wipe of memory about to be freed */
    volatile char *p = secret;
    while (*p)
        *p++ = 0;
    free(secret);
}
