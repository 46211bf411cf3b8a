#include "lazy/lazy.h"
#include "common/error.h"
#include "lazy/trampoline.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* The sonames come from the build (CMake reads them from the libraries it
 * found), so the binary loads the ABI it was compiled against. */
extern const struct ck_lazy_symbols ck_lazy_symbols_curl, ck_lazy_symbols_archive,
    ck_lazy_symbols_zip, ck_lazy_symbols_hdf5, ck_lazy_symbols_snappy;

static const struct {
    const char *name, *soname;
    const struct ck_lazy_symbols *syms;
} libs[CK_LIB_COUNT] = {
    [CK_LIB_CURL] = {"libcurl", CKPTD_SONAME_CURL, &ck_lazy_symbols_curl},
    [CK_LIB_ARCHIVE] = {"libarchive", CKPTD_SONAME_ARCHIVE, &ck_lazy_symbols_archive},
    [CK_LIB_ZIP] = {"libzip", CKPTD_SONAME_ZIP, &ck_lazy_symbols_zip},
    [CK_LIB_HDF5] = {"libhdf5", CKPTD_SONAME_HDF5, &ck_lazy_symbols_hdf5},
    [CK_LIB_SNAPPY] = {"snappy", CKPTD_SONAME_SNAPPY, &ck_lazy_symbols_snappy},
};

atomic_bool ck_lazy_ready[CK_LIB_COUNT];

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static char load_failure[CK_LIB_COUNT][512]; /* why the first attempt failed */

/* Under load_lock. The handle is never closed: libraries such as libcurl and
 * the TLS stack under it keep process-wide state and are not meant to unload. */
static void load_locked(enum ck_lazy_lib lib)
{
    const struct ck_lazy_symbols *s = libs[lib].syms;
    void *h = dlopen(libs[lib].soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(load_failure[lib], sizeof load_failure[lib], "cannot load %s (%s): %s",
                 libs[lib].name, libs[lib].soname, dlerror());
        return;
    }
    for (size_t i = 0; i < s->n; i++) {
        dlerror();
        void *p = dlsym(h, s->names[i]);
        if (!p) {
            const char *why = dlerror();
            snprintf(load_failure[lib], sizeof load_failure[lib], "%s (%s) has no function %s: %s",
                     libs[lib].name, libs[lib].soname, s->names[i], why ? why : "null address");
            return; /* the handle stays open: dlclose could run its destructors half set up */
        }
        s->addr[i] = p;
    }
    atomic_store_explicit(&ck_lazy_ready[lib], true, memory_order_release);
}

int ck_lazy_load(enum ck_lazy_lib lib)
{
    if (atomic_load_explicit(&ck_lazy_ready[lib], memory_order_acquire))
        return 0;
    pthread_mutex_lock(&load_lock);
    if (!atomic_load_explicit(&ck_lazy_ready[lib], memory_order_relaxed) && !load_failure[lib][0])
        load_locked(lib);
    bool ok = atomic_load_explicit(&ck_lazy_ready[lib], memory_order_relaxed);
    int err = ok ? 0 : ck_error(CK_ERR, "%s", load_failure[lib]);
    pthread_mutex_unlock(&load_lock);
    return err;
}

void ck_lazy_need(enum ck_lazy_lib lib)
{
    if (ck_lazy_load(lib) < 0) {
        fprintf(stderr, "ckptd: fatal: %s\n", ck_error_msg());
        abort();
    }
}

bool ck_lazy_loaded(enum ck_lazy_lib lib)
{
    return atomic_load_explicit(&ck_lazy_ready[lib], memory_order_acquire);
}

const char *ck_lazy_name(enum ck_lazy_lib lib)
{
    return libs[lib].name;
}

const char *ck_lazy_soname(enum ck_lazy_lib lib)
{
    return libs[lib].soname;
}
