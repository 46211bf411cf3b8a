/* OpenBLAS, loaded on first use rather than linked: a linked OpenBLAS
 * starts its thread pool when the library loads, in every ckptd process
 * (the idle watcher too), and maps ~30 MiB. The engine runs in the
 * sandbox's child, which loads it there with OPENBLAS_NUM_THREADS=1 so
 * the pool is never started. Without the library (or with naive_gemm) the
 * products run as plain loops: slower, the same results within float32
 * rounding. */
#include "infer/internal.h"
#include "common/log.h"

#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

typedef void (*sgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, int, int,
                         int, float, const float *, int, const float *, int, float, float *, int);
typedef void (*threads_fn)(int);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static sgemm_fn sgemm;

static void load(void)
{
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    void *h = dlopen(CKPTD_SONAME_OPENBLAS, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        ck_warn("infer.blas_missing", "library=%s fallback=loops", CKPTD_SONAME_OPENBLAS);
        return;
    }
    threads_fn set_threads = (threads_fn)dlsym(h, "openblas_set_num_threads");
    if (set_threads)
        set_threads(1);
    sgemm = (sgemm_fn)dlsym(h, "cblas_sgemm");
}

bool ck_infer_blas_available(void)
{
    pthread_once(&once, load);
    return sgemm != NULL;
}

void ck_infer_blas_sgemm(bool ta, bool tb, int m, int n, int k, const float *a, int lda,
                         const float *b, int ldb, float beta, float *c, int ldc)
{
    sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
          1.0f, a, lda, b, ldb, beta, c, ldc);
}
