/* common/metrics: counters, gauges, the histogram and the exposition text. */
#include "test_main.h"

#include "common/buf.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/metrics.h"

#include <sys/stat.h>
#include <time.h>

/* The value on the line that starts with "series " in text, or -12345 when absent. */
static double value_of(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -12345;
}

static int count_lines_starting(const char *text, const char *prefix)
{
    int k = 0;
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, prefix, n))
            k++;
    return k;
}

static void counters_and_gauges(void **state)
{
    ck_metrics_reset();
    ck_metrics_add(CK_M_CHECKPOINTS_REGISTERED, 3);
    ck_metrics_add(CK_M_CHECKPOINTS_REGISTERED, 2);
    ck_metrics_add(CK_M_BYTES_HASHED, 1u << 20);
    ck_metrics_add(CK_M_UPLOADS_FAILED, 1);
    ck_metrics_set(CK_M_UPLOAD_QUEUE_DEPTH, 7);
    ck_metrics_set(CK_M_UPLOAD_QUEUE_DEPTH, 4);
    ck_metrics_set_max(CK_M_NEWEST_CHECKPOINT_TIME, 1000);
    ck_metrics_set_max(CK_M_NEWEST_CHECKPOINT_TIME, 900);
    assert_int_equal(ck_metrics_get(CK_M_CHECKPOINTS_REGISTERED), 5);
    assert_int_equal(ck_metrics_get(CK_M_NEWEST_CHECKPOINT_TIME), 1000);

    struct ck_buf b = CK_BUF_INIT;
    assert_int_equal(ck_metrics_render(&b), 0);
    const char *t = ck_buf_str(&b);
    assert_true(value_of(t, "ckptd_checkpoints_registered_total") == 5);
    assert_true(value_of(t, "ckptd_hashed_bytes_total") == 1048576);
    assert_true(value_of(t, "ckptd_uploads_total{result=\"failed\"}") == 1);
    assert_true(value_of(t, "ckptd_uploads_total{result=\"completed\"}") == 0);
    assert_true(value_of(t, "ckptd_upload_queue_depth") == 4);
    /* nothing landed remotely yet */
    assert_true(value_of(t, "ckptd_newest_remote_checkpoint_age_seconds") == -1);
    /* one HELP and one TYPE per metric name, even with several labelled series */
    assert_int_equal(count_lines_starting(t, "# TYPE ckptd_uploads_total "), 1);
    assert_int_equal(count_lines_starting(t, "# HELP ckptd_uploads_total "), 1);
    assert_int_equal(count_lines_starting(t, "# TYPE ckptd_failures_total counter"), 1);
    assert_int_equal(count_lines_starting(t, "ckptd_failures_total{stage="), 7);
    assert_true(value_of(t, "ckptd_start_time_seconds") > 1.6e9);
    ck_buf_release(&b);
}

static void remote_age_grows_from_timestamp(void **state)
{
    ck_metrics_reset();
    time_t now = time(NULL);
    ck_metrics_set_max(CK_M_NEWEST_REMOTE_CHECKPOINT_TIME, (int64_t)now - 600);
    struct ck_buf b = CK_BUF_INIT;
    assert_int_equal(ck_metrics_render(&b), 0);
    double age = value_of(ck_buf_str(&b), "ckptd_newest_remote_checkpoint_age_seconds");
    assert_true(age >= 600 && age < 660);
    ck_buf_release(&b);
}

static void histogram_buckets_are_cumulative(void **state)
{
    ck_metrics_reset();
    ck_metrics_observe(CK_H_UPLOAD_SECONDS, 0.05); /* <= 0.1 */
    ck_metrics_observe(CK_H_UPLOAD_SECONDS, 0.1);  /* le is inclusive */
    ck_metrics_observe(CK_H_UPLOAD_SECONDS, 3);    /* <= 5 */
    ck_metrics_observe(CK_H_UPLOAD_SECONDS, 7200); /* only +Inf */
    ck_metrics_observe(CK_H_UPLOAD_SECONDS, -1);   /* ignored */
    assert_int_equal(ck_metrics_count(CK_H_UPLOAD_SECONDS), 4);
    struct ck_buf b = CK_BUF_INIT;
    assert_int_equal(ck_metrics_render(&b), 0);
    const char *t = ck_buf_str(&b);
    assert_true(value_of(t, "ckptd_upload_duration_seconds_bucket{le=\"0.1\"}") == 2);
    assert_true(value_of(t, "ckptd_upload_duration_seconds_bucket{le=\"2.5\"}") == 2);
    assert_true(value_of(t, "ckptd_upload_duration_seconds_bucket{le=\"5\"}") == 3);
    assert_true(value_of(t, "ckptd_upload_duration_seconds_bucket{le=\"3600\"}") == 3);
    assert_true(value_of(t, "ckptd_upload_duration_seconds_bucket{le=\"+Inf\"}") == 4);
    assert_true(value_of(t, "ckptd_upload_duration_seconds_count") == 4);
    double sum = value_of(t, "ckptd_upload_duration_seconds_sum");
    assert_true(sum > 7203.149 && sum < 7203.151);
    assert_int_equal(count_lines_starting(t, "# TYPE ckptd_upload_duration_seconds histogram"), 1);
    ck_buf_release(&b);
}

static void write_file_is_atomic_and_readable(void **state)
{
    char dir[4096], path[4200];
    ck_test_tmpdir(dir, "metrics");
    snprintf(path, sizeof path, "%s/ckptd.prom", dir);
    ck_metrics_reset();
    ck_metrics_add(CK_M_CHECKPOINTS_REGISTERED, 9);
    assert_int_equal(ck_metrics_write_file(path), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    struct ck_buf b = CK_BUF_INIT;
    assert_int_equal(ck_read_file(path, 1 << 20, &b), 0);
    assert_true(value_of(ck_buf_str(&b), "ckptd_checkpoints_registered_total") == 9);
    /* a textfile is read long after it is written: an age would be frozen at
     * write time, so it carries the timestamp only (the age is PromQL's) */
    assert_null(strstr(ck_buf_str(&b), "ckptd_newest_remote_checkpoint_age_seconds"));
    assert_non_null(strstr(ck_buf_str(&b), "\nckptd_newest_remote_checkpoint_timestamp_seconds "));
    ck_buf_release(&b);
    /* no temporary left beside it */
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", dir);
    assert_int_equal(system(cmd), 0);
    /* a folder that does not exist is an error, not a crash */
    snprintf(path, sizeof path, "%s/missing/ckptd.prom", dir);
    assert_true(ck_metrics_write_file(path) < 0);
}

static void exposition_over_its_maximum_fails(void **state)
{
    struct ck_buf b;
    ck_buf_init(&b, 64);
    assert_true(ck_metrics_render(&b) < 0);
    ck_buf_release(&b);
}

/* A helper process's counts reach the parent: take a mark, count, send the
 * changes; the parent applies them on top of its own. Simulated here in one
 * process by resetting between the two roles. */
static void changes_since_a_mark_are_applied_elsewhere(void **state)
{
    (void)state;
    ck_metrics_reset();
    ck_metrics_add(CK_M_UPLOADS_COMPLETED, 5); /* the "parent" had counted these at the fork */
    ck_metrics_set(CK_M_UPLOAD_QUEUE_DEPTH, 7);
    struct ck_metrics_mark mark;
    ck_metrics_mark(&mark);
    /* the helper's work */
    ck_metrics_add(CK_M_UPLOADS_COMPLETED, 2);
    ck_metrics_add(CK_M_BYTES_UPLOADED, 3000);
    ck_metrics_set(CK_M_UPLOAD_QUEUE_DEPTH, 1);
    ck_metrics_observe(CK_H_UPLOAD_SECONDS, 0.3);
    ck_metrics_observe(CK_H_UPLOAD_SECONDS, 40);
    struct ck_buf b = CK_BUF_INIT;
    assert_int_equal(ck_metrics_changes(&mark, &b), 0);
    /* nothing changed since: nothing more to send */
    struct ck_buf again = CK_BUF_INIT;
    assert_int_equal(ck_metrics_changes(&mark, &again), 0);
    assert_int_equal(again.len, 0);
    ck_buf_release(&again);

    /* the "parent", which meanwhile counted on its own */
    ck_metrics_reset();
    ck_metrics_add(CK_M_UPLOADS_COMPLETED, 5);
    ck_metrics_add(CK_M_CHECKPOINTS_REGISTERED, 4);
    ck_metrics_set(CK_M_UPLOAD_QUEUE_DEPTH, 7);
    assert_int_equal(ck_metrics_apply(b.data, b.len), 0);
    assert_int_equal(ck_metrics_get(CK_M_UPLOADS_COMPLETED), 7);
    assert_int_equal(ck_metrics_get(CK_M_BYTES_UPLOADED), 3000);
    assert_int_equal(ck_metrics_get(CK_M_CHECKPOINTS_REGISTERED), 4);
    assert_int_equal(ck_metrics_get(CK_M_UPLOAD_QUEUE_DEPTH), 1);
    assert_int_equal(ck_metrics_count(CK_H_UPLOAD_SECONDS), 2);
    struct ck_buf text = CK_BUF_INIT;
    assert_int_equal(ck_metrics_render(&text), 0);
    assert_true(value_of(ck_buf_str(&text), "ckptd_upload_duration_seconds_bucket{le=\"0.5\"}") ==
                1);
    assert_true(value_of(ck_buf_str(&text), "ckptd_upload_duration_seconds_bucket{le=\"60\"}") ==
                2);
    assert_true(value_of(ck_buf_str(&text), "ckptd_upload_duration_seconds_sum") == 40.3);
    ck_buf_release(&text);
    ck_buf_release(&b);

    /* garbage is refused, by line */
    static const char *bad[] = {"x 1 2\n", "c 9999 1\n", "h 0 99 1\n", "c 1\n", "s 0 nan\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(ck_metrics_apply(bad[i], strlen(bad[i])), CK_EFORMAT);
}

int main(int argc, char **argv);
static void totals_carry_counters_across_runs(void **state)
{
    (void)state;
    ck_metrics_reset();
    ck_metrics_add(CK_M_CHECKPOINTS_REGISTERED, 3);
    ck_metrics_add(CK_M_FAILURES_UPLOAD, 1);
    ck_metrics_set(CK_M_CHECKPOINTS, 7);             /* a gauge of the tree: not carried */
    ck_metrics_set(CK_M_LAST_SUCCESS_TIME, 1700000000);
    ck_metrics_observe(CK_H_UPLOAD_SECONDS, 0.3);
    struct ck_buf b = CK_BUF_INIT;
    assert_int_equal(ck_metrics_save_totals(&b), 0);
    assert_non_null(strstr(ck_buf_str(&b), "ckptd_checkpoints_registered_total 3\n"));
    assert_non_null(strstr(ck_buf_str(&b), "ckptd_failures_total{stage=\"upload\"} 1\n"));
    assert_null(strstr(ck_buf_str(&b), "ckptd_checkpoints "));
    /* the next run starts from zero, loads, and counts on */
    ck_metrics_reset();
    ck_metrics_add(CK_M_CHECKPOINTS_REGISTERED, 2);
    const char *extra = "ckptd_a_metric_of_a_newer_version 5\n";
    assert_int_equal(ck_buf_puts(&b, extra), 0);
    assert_int_equal(ck_metrics_load_totals(b.data, b.len), 0);
    assert_int_equal(ck_metrics_get(CK_M_CHECKPOINTS_REGISTERED), 5);
    assert_int_equal(ck_metrics_get(CK_M_FAILURES_UPLOAD), 1);
    assert_int_equal(ck_metrics_get(CK_M_CHECKPOINTS), 0);
    assert_int_equal(ck_metrics_get(CK_M_LAST_SUCCESS_TIME), 1700000000);
    assert_int_equal(ck_metrics_count(CK_H_UPLOAD_SECONDS), 1);
    struct ck_buf r = CK_BUF_INIT;
    assert_int_equal(ck_metrics_render(&r), 0);
    assert_non_null(strstr(ck_buf_str(&r), "ckptd_upload_duration_seconds_bucket{le=\"0.5\"} 1\n"));
    assert_non_null(strstr(ck_buf_str(&r), "ckptd_build_info{version=\"" CKPTD_VERSION "\"} 1\n"));
    ck_buf_release(&r);
    ck_buf_release(&b);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(totals_carry_counters_across_runs),
    cmocka_unit_test(counters_and_gauges),
    cmocka_unit_test(remote_age_grows_from_timestamp),
    cmocka_unit_test(histogram_buckets_are_cumulative),
    cmocka_unit_test(write_file_is_atomic_and_readable),
    cmocka_unit_test(exposition_over_its_maximum_fails),
    cmocka_unit_test(changes_since_a_mark_are_applied_elsewhere),
};
CK_TEST_MAIN(tests)
