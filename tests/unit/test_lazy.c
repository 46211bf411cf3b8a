/* lazy/: libraries loaded on first use, and the trampolines that forward to
 * them (the variadic curl ones pass each argument type through). */
#include "test_main.h"

#include "common/buf.h"
#include "common/fsutil.h"
#include "lazy/lazy.h"

#include <curl/curl.h>
#include <snappy-c.h>
#include <stdio.h>
#include <string.h>

static void loads_on_first_use(void **state)
{
    (void)state;
    for (int lib = 0; lib < CK_LIB_COUNT; lib++) {
        assert_false(ck_lazy_loaded(lib)); /* nothing loads at start */
        assert_non_null(strstr(ck_lazy_soname(lib), ".so."));
    }
    assert_int_equal(ck_lazy_load(CK_LIB_SNAPPY), 0);
    assert_true(ck_lazy_loaded(CK_LIB_SNAPPY));
    assert_false(ck_lazy_loaded(CK_LIB_CURL));
    assert_int_equal(ck_lazy_load(CK_LIB_SNAPPY), 0); /* once */
    /* a Snappy stream by hand: length 5, one literal of 5 bytes */
    static const char packed[] = "\x05\x10hello";
    char out[8];
    size_t n = 0;
    assert_int_equal(snappy_uncompressed_length(packed, 7, &n), SNAPPY_OK);
    assert_int_equal(n, 5);
    assert_int_equal(snappy_uncompress(packed, 7, out, &n), SNAPPY_OK);
    assert_memory_equal(out, "hello", 5);
}

static size_t sink(char *p, size_t size, size_t n, void *ud)
{
    ck_buf_append(ud, p, size * n);
    return size * n;
}

static void curl_variadic_arguments_pass_through(void **state)
{
    (void)state;
    char dir[4096], path[4200], url[4300];
    ck_test_tmpdir(dir, "lazy");
    snprintf(path, sizeof path, "%s/data.txt", dir);
    assert_int_equal(ck_write_file_atomic(path, "lazy curl\n", 10, 0644), 0);
    snprintf(url, sizeof url, "file://%s", path);

    assert_int_equal(ck_lazy_load(CK_LIB_CURL), 0);
    struct ck_buf got;
    ck_buf_init(&got, 64);
    CURL *h = curl_easy_init();
    assert_non_null(h);
    /* one option of each kind: pointer, long, function, data pointer, curl_off_t */
    assert_int_equal(curl_easy_setopt(h, CURLOPT_URL, url), CURLE_OK);
    assert_int_equal(curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L), CURLE_OK);
    assert_int_equal(curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink), CURLE_OK);
    assert_int_equal(curl_easy_setopt(h, CURLOPT_WRITEDATA, &got), CURLE_OK);
    assert_int_equal(curl_easy_setopt(h, CURLOPT_MAX_RECV_SPEED_LARGE, (curl_off_t)1 << 30),
                     CURLE_OK);
    /* a long option given a value the library must see exactly: an unknown
     * protocol version is refused, so the value did not arrive as garbage */
    assert_int_equal(curl_easy_setopt(h, CURLOPT_HTTP_VERSION, 99L), CURLE_UNSUPPORTED_PROTOCOL);
    assert_int_equal(curl_easy_perform(h), CURLE_OK);
    assert_int_equal(got.len, 10);
    assert_memory_equal(got.data, "lazy curl\n", 10);
    curl_off_t size = -1;
    assert_int_equal(curl_easy_getinfo(h, CURLINFO_SIZE_DOWNLOAD_T, &size), CURLE_OK);
    assert_int_equal(size, 10);
    char *eff = NULL;
    assert_int_equal(curl_easy_getinfo(h, CURLINFO_EFFECTIVE_URL, &eff), CURLE_OK);
    assert_string_equal(eff, url);
    curl_easy_cleanup(h);
    ck_buf_release(&got);
    assert_string_equal(curl_easy_strerror(CURLE_OK), "No error");
}

int main(int argc, char **argv);
static const struct CMUnitTest tests[] = {
    cmocka_unit_test(loads_on_first_use),
    cmocka_unit_test(curl_variadic_arguments_pass_through),
};
CK_TEST_MAIN(tests)
