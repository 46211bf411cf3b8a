/* Errors: one enum of codes, a message kept beside the last one (per thread).
 *
 *   if ((err = ck_thing(...)) < 0) goto out;
 *   return ck_error(CK_EIO, "cannot open '%s'", path);
 *   return ck_error_os(CK_EIO, "cannot open '%s'", path);   appends ": strerror(errno)"
 *
 * Messages are lower case, no final period, what failed first, subjects quoted.
 * Only main() and the daemon's top level print them. */
#ifndef CK_ERROR_H
#define CK_ERROR_H

enum ck_err {
    CK_OK = 0,
    CK_ERR = -1,       /* generic failure */
    CK_ENOMEM = -2,    /* out of memory, or a size over its limit */
    CK_EIO = -3,       /* the OS refused: open, read, write, fsync, rename */
    CK_EFORMAT = -4,   /* a file is not what it claims to be (hostile or corrupt input) */
    CK_ENOENT = -5,    /* a file or key does not exist */
    CK_ECONFIG = -6,   /* bad configuration */
    CK_EUSAGE = -7,    /* bad command line */
    CK_ELOCKED = -8,   /* another ckptd holds the lock */
    CK_ECHANGED = -9,  /* a file changed or vanished while it was read */
    CK_ESTATE = -10,   /* an operation the current state forbids (PMF status rules) */
    CK_ENET = -11,     /* a remote store or receiver failed (may be retried) */
    CK_EAUTH = -12,    /* a remote refused our credentials (not retried) */
    CK_EEXIST = -13,   /* something is already there */
    CK_ESIZE = -14,    /* a length or size out of range */
    CK_EUNREACH = -15, /* a remote cannot be reached: connection refused, unknown host */
    CK_EREFUSED = -16, /* a remote refused the request for good (a 4xx but 408, 429) */
    CK_EUNSUPPORTED = -17, /* a valid model uses an op, attribute, mode or dtype ckptd does not
                              compute: refused by name, nothing run */
};

/* Sets the thread's message and returns code (so it can be returned directly). */
int ck_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same, with ": <strerror(errno)>" appended; reads errno first. */
int ck_error_os(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current message with "<context>: " (for adding the file name). */
int ck_error_wrap(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last message of this thread; never NULL ("" when none). Valid until the next ck_error. */
const char *ck_error_msg(void);
void ck_error_clear(void);
/* A short name for a code: "io", "format", ... */
const char *ck_err_name(int code);

/* The documented process exit codes (README "Exit codes"). */
enum ck_exit {
    CK_EXIT_OK = 0,      /* success */
    CK_EXIT_FAILED = 1,  /* the work failed (details in the log) */
    CK_EXIT_USAGE = 2,   /* usage or configuration error */
    CK_EXIT_LOCKED = 3,  /* another ckptd holds the lock on this directory */
    CK_EXIT_UNSUPPORTED = 4, /* the model uses what ckptd does not compute (refused, not run) */
};
/* Maps an error code to the exit code main() should return. */
int ck_exit_code(int err);

#endif
