/* The engine through the sandbox: the child loads and runs the model and
 * writes the outputs (format in sandbox.c); the parent decodes them, checking
 * every length against what arrived. */
#include "infer/sandbox.h"
#include "infer/internal.h"
#include "common/clock.h"
#include "common/error.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The CPU time of the engine's threads: the calling thread's alone when it
 * is the only one (the process clock moved in whole ticks on this VM: a
 * 1 ms run read 0), the child's (it runs nothing else) with a pool. */
static double thread_cpu_s(bool pool)
{
    struct timespec ts;
    clock_gettime(pool ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double median(double *t, unsigned n)
{
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

struct job {
    const struct ck_model *m;
    const struct ck_infer_options *o;
    const struct ck_infer_array *in;
    size_t nin;
    unsigned repeat;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int put(int fd, const void *p, size_t n)
{
    const unsigned char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w <= 0)
            return ck_error_os(CK_EIO, "cannot write the engine's answer");
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int run_job(void *arg, int fd)
{
    struct job *j = arg;
    struct ck_infer *e = NULL;
    struct ck_infer_array *out = NULL;
    size_t nout = 0;
    int err;
    double *t = calloc(2 * (size_t)j->repeat, sizeof(double)), *cpu = t + j->repeat;
    if (!t)
        return ck_error(CK_ENOMEM, "out of memory for the timings");
    if ((err = ck_infer_new(j->m, j->o, &e)) < 0)
        goto out;
    for (unsigned r = 0; r < j->repeat; r++) {
        ck_infer_arrays_free(out, nout);
        out = NULL;
        nout = 0;
        bool pool = j->o && j->o->threads > 1;
        double t0 = ck_mono_s(), c0 = thread_cpu_s(pool);
        if ((err = ck_infer_run(e, j->in, j->nin, &out, &nout)) < 0)
            goto out;
        t[r] = ck_mono_s() - t0;
        cpu[r] = thread_cpu_s(pool) - c0;
    }
    qsort(t, j->repeat, sizeof *t, cmp_double);
    qsort(cpu, j->repeat, sizeof *cpu, cmp_double);
    uint32_t n32 = (uint32_t)nout;
    if ((err = put(fd, &n32, 4)) < 0)
        goto out;
    for (size_t i = 0; i < nout; i++) {
        uint32_t nl = (uint32_t)strlen(out[i].name), rank = (uint32_t)out[i].rank;
        if ((err = put(fd, &nl, 4)) < 0 || (err = put(fd, out[i].name, nl)) < 0 ||
            (err = put(fd, &rank, 4)) < 0 ||
            (err = put(fd, out[i].dims, sizeof(int64_t) * rank)) < 0 ||
            (err = put(fd, out[i].data, sizeof(float) * ck_infer_array_numel(&out[i]))) < 0)
            goto out;
    }
    double med = median(t, j->repeat), med_cpu = median(cpu, j->repeat);
    uint64_t peak = ck_infer_peak_activation_bytes(e), wb = ck_infer_weight_bytes(e);
    uint32_t runs = j->repeat;
    if ((err = put(fd, &runs, 4)) < 0 || (err = put(fd, &med, 8)) < 0 ||
        (err = put(fd, &t[0], 8)) < 0 || (err = put(fd, &med_cpu, 8)) < 0 ||
        (err = put(fd, &peak, 8)) < 0 ||
        (err = put(fd, &wb, 8)) < 0)
        goto out;
out:
    free(t);
    ck_infer_arrays_free(out, nout);
    ck_infer_free(e);
    return err;
}

static int take(const unsigned char **p, const unsigned char *end, void *dst, uint64_t n)
{
    if ((uint64_t)(end - *p) < n)
        return ck_error(CK_EFORMAT, "the engine's answer is truncated");
    memcpy(dst, *p, n);
    *p += n;
    return 0;
}

static int decode(const unsigned char *p, uint64_t len, struct ck_infer_array **outputs,
                  size_t *noutputs, struct ck_infer_stats *st)
{
    const unsigned char *end = p + len;
    uint32_t n = 0;
    int err;
    if ((err = take(&p, end, &n, 4)) < 0)
        return err;
    if (n > len / 8)
        return ck_error(CK_EFORMAT, "the engine's answer claims %u outputs", n);
    struct ck_infer_array *a = calloc(n ? n : 1, sizeof *a);
    if (!a)
        return ck_error(CK_ENOMEM, "out of memory for the outputs");
    for (uint32_t i = 0; i < n; i++) {
        uint32_t nl = 0, rank = 0;
        char name[1024];
        int64_t dims[CK_INFER_MAX_RANK];
        if ((err = take(&p, end, &nl, 4)) < 0)
            goto fail;
        if (nl >= sizeof name) {
            err = ck_error(CK_EFORMAT, "the engine's answer has a name of %u bytes", nl);
            goto fail;
        }
        if ((err = take(&p, end, name, nl)) < 0 || (err = take(&p, end, &rank, 4)) < 0)
            goto fail;
        name[nl] = 0;
        if (rank > CK_INFER_MAX_RANK) {
            err = ck_error(CK_EFORMAT, "the engine's answer has rank %u", rank);
            goto fail;
        }
        if ((err = take(&p, end, dims, sizeof(int64_t) * rank)) < 0)
            goto fail;
        struct ck_ishape s = {(int)rank, {0}};
        memcpy(s.d, dims, sizeof(int64_t) * rank);
        int64_t numel = ck_ishape_numel(&s);
        if (numel < 0 || (uint64_t)numel > (uint64_t)(end - p) / sizeof(float)) {
            err = ck_error(CK_EFORMAT, "the engine's answer is truncated in output '%s'", name);
            goto fail;
        }
        if ((err = ck_infer_array_init(&a[i], name, (int)rank, dims)) < 0 ||
            (err = take(&p, end, a[i].data, sizeof(float) * (uint64_t)numel)) < 0)
            goto fail;
    }
    uint32_t runs = 0;
    if ((err = take(&p, end, &runs, 4)) < 0 || (err = take(&p, end, &st->median_s, 8)) < 0 ||
        (err = take(&p, end, &st->min_s, 8)) < 0 ||
        (err = take(&p, end, &st->median_cpu_s, 8)) < 0 ||
        (err = take(&p, end, &st->peak_activation_bytes, 8)) < 0 ||
        (err = take(&p, end, &st->weight_bytes, 8)) < 0)
        goto fail;
    st->runs = runs;
    *outputs = a;
    *noutputs = n;
    return 0;
fail:
    ck_infer_arrays_free(a, n);
    return err;
}

int ck_infer_run_sandboxed(const struct ck_model *m, const struct ck_infer_options *o,
                           const struct ck_sandbox_limits *lim,
                           const struct ck_infer_array *inputs, size_t ninputs, unsigned repeat,
                           struct ck_infer_array **outputs, size_t *noutputs,
                           enum ck_sandbox_status *status, struct ck_infer_stats *stats)
{
    struct job j = {m, o, inputs, ninputs, repeat ? repeat : 1};
    struct ck_infer_stats ignored;
    struct rusage ru = {0};
    unsigned char *answer = NULL;
    uint64_t len = 0;
    *outputs = NULL;
    *noutputs = 0;
    if (!stats)
        stats = &ignored;
    memset(stats, 0, sizeof *stats);
    int err = ck_sandbox_call(run_job, &j, lim, UINT64_C(16) << 30, &answer, &len, status, &ru);
    if (err < 0)
        return err;
    stats->child_max_rss = (uint64_t)ru.ru_maxrss * 1024;
    err = decode(answer, len, outputs, noutputs, stats);
    if (err < 0)
        *status = CK_SANDBOX_CRASHED;
    free(answer);
    return err;
}
