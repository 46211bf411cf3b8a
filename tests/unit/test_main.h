/* The main() of every cmocka test binary: with an argument it runs the one
 * case of that name (ctest registers each case as its own test), without one
 * it runs them all. An unknown case name fails, so a typo cannot pass. */
#ifndef CK_TEST_MAIN_H
#define CK_TEST_MAIN_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define CK_TEST_MAIN(tests)                                                                        \
    int main(int argc, char **argv)                                                                \
    {                                                                                              \
        if (argc > 1) {                                                                            \
            size_t n_ = sizeof(tests) / sizeof((tests)[0]), i_;                                    \
            for (i_ = 0; i_ < n_; i_++)                                                            \
                if (!strcmp((tests)[i_].name, argv[1]))                                            \
                    break;                                                                         \
            if (i_ == n_) {                                                                        \
                fprintf(stderr, "no test case '%s'\n", argv[1]);                                   \
                return 2;                                                                          \
            }                                                                                      \
            cmocka_set_test_filter(argv[1]);                                                       \
        }                                                                                          \
        return cmocka_run_group_tests(tests, NULL, NULL);                                          \
    }

/* A fresh scratch folder for a test under $CK_TEST_TMP (or /tmp); out must hold 4000. */
static inline void ck_test_tmpdir(char *out, const char *name)
{
    const char *base = getenv("CK_TEST_TMP");
    snprintf(out, 4000, "%s/%s.XXXXXX", base && *base ? base : "/tmp", name);
    if (!mkdtemp(out))
        fail_msg("cannot create a scratch folder under '%s'", out);
}

#endif
