/* libcurl's functions that ckptd calls, loaded on first use (see lazy.h). */
#define CURL_DISABLE_TYPECHECK /* its macros would hide the two variadic functions below */
#include <curl/curl.h>

#include "lazy/trampoline.h"

#include <stdarg.h>

#define LAZY_LIB CK_LIB_CURL
#define LAZY_SYMBOLS ck_lazy_symbols_curl

#define FUNCS(F, V)                                                                                \
    F(CURLcode, curl_global_init, (long flags), (flags))                                           \
    F(CURL *, curl_easy_init, (void), ())                                                          \
    F(CURLcode, curl_easy_perform, (CURL * h), (h))                                                \
    V(curl_easy_reset, (CURL * h), (h))                                                            \
    V(curl_easy_cleanup, (CURL * h), (h))                                                          \
    F(const char *, curl_easy_strerror, (CURLcode code), (code))                                   \
    F(struct curl_slist *, curl_slist_append, (struct curl_slist * l, const char *s), (l, s))      \
    V(curl_slist_free_all, (struct curl_slist * l), (l))                                           \
    F(time_t, curl_getdate, (const char *p, const time_t *unused), (p, unused))                    \
    V(curl_free, (void *p), (p))                                                                   \
    F(CURLU *, curl_url, (void), ())                                                               \
    V(curl_url_cleanup, (CURLU * u), (u))                                                          \
    F(CURLUcode, curl_url_get, (CURLU * u, CURLUPart what, char **part, unsigned int flags),       \
      (u, what, part, flags))                                                                      \
    F(CURLUcode, curl_url_set, (CURLU * u, CURLUPart what, const char *part, unsigned int flags),  \
      (u, what, part, flags))                                                                      \
    F(CURLSH *, curl_share_init, (void), ())                                                       \
    F(CURLSHcode, curl_share_cleanup, (CURLSH * sh), (sh))

#define HANDWRITTEN(F, V)                                                                          \
    F(CURLcode, curl_easy_setopt, (CURL * h, CURLoption o, ...), ())                               \
    F(CURLcode, curl_easy_getinfo, (CURL * h, CURLINFO i, ...), ())                                \
    F(CURLSHcode, curl_share_setopt, (CURLSH * sh, CURLSHoption o, ...), ())

CK_LAZY_LIBRARY(FUNCS, HANDWRITTEN)

typedef CURLcode (*setopt_fn)(CURL *, CURLoption, ...);
typedef CURLcode (*getinfo_fn)(CURL *, CURLINFO, ...);
typedef CURLSHcode (*share_setopt_fn)(CURLSH *, CURLSHoption, ...);

/* The option's number says the type of its one argument, the way libcurl
 * itself reads it; it is passed on with that type. */
CURLcode curl_easy_setopt(CURL *h, CURLoption o, ...)
{
    setopt_fn f = (setopt_fn)CK_LAZY_ADDR(curl_easy_setopt);
    va_list ap;
    CURLcode rc;
    va_start(ap, o);
    if (o < CURLOPTTYPE_OBJECTPOINT)
        rc = f(h, o, va_arg(ap, long));
    else if (o < CURLOPTTYPE_FUNCTIONPOINT)
        rc = f(h, o, va_arg(ap, void *));
    else if (o < CURLOPTTYPE_OFF_T)
        rc = f(h, o, va_arg(ap, void (*)(void)));
    else if (o < CURLOPTTYPE_BLOB)
        rc = f(h, o, va_arg(ap, curl_off_t));
    else
        rc = f(h, o, va_arg(ap, void *)); /* struct curl_blob * */
    va_end(ap);
    return rc;
}

/* Every CURLINFO takes a pointer to where the answer goes. */
CURLcode curl_easy_getinfo(CURL *h, CURLINFO i, ...)
{
    getinfo_fn f = (getinfo_fn)CK_LAZY_ADDR(curl_easy_getinfo);
    va_list ap;
    va_start(ap, i);
    CURLcode rc = f(h, i, va_arg(ap, void *));
    va_end(ap);
    return rc;
}

/* Passed on with the type libcurl reads for each option: an int for
 * CURLSHOPT_SHARE and UNSHARE, a function pointer for the lock functions, a
 * pointer for USERDATA. */
CURLSHcode curl_share_setopt(CURLSH *sh, CURLSHoption o, ...)
{
    share_setopt_fn f = (share_setopt_fn)CK_LAZY_ADDR(curl_share_setopt);
    va_list ap;
    CURLSHcode rc;
    va_start(ap, o);
    if (o == CURLSHOPT_SHARE || o == CURLSHOPT_UNSHARE)
        rc = f(sh, o, va_arg(ap, int));
    else if (o == CURLSHOPT_LOCKFUNC)
        rc = f(sh, o, va_arg(ap, curl_lock_function));
    else if (o == CURLSHOPT_UNLOCKFUNC)
        rc = f(sh, o, va_arg(ap, curl_unlock_function));
    else
        rc = f(sh, o, va_arg(ap, void *));
    va_end(ap);
    return rc;
}
