/* Times ck_hash_file on one file: MD5 alone, then MD5+SHA-256 from one read.
 * Prints "md5 SECONDS" and "both SECONDS" (best of N runs). bench/scan.sh
 * compares these with md5sum and sha256sum on the same page-cached file. */
#include "common/error.h"
#include "common/hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double best_of(const char *path, enum ck_hash_want want, int runs, struct ck_digests *d)
{
    double best = 1e9;
    for (int i = 0; i < runs; i++) {
        double t0 = now();
        if (ck_hash_file(path, want, d, NULL) < 0) {
            fprintf(stderr, "hashbench: %s\n", ck_error_msg());
            exit(1);
        }
        double t = now() - t0;
        if (t < best)
            best = t;
    }
    return best;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: hashbench FILE [RUNS]\n");
        return 2;
    }
    int runs = argc > 2 ? atoi(argv[2]) : 3;
    struct ck_digests d;
    printf("md5 %.4f\n", best_of(argv[1], CK_HASH_MD5, runs, &d));
    printf("both %.4f\n", best_of(argv[1], CK_HASH_BOTH, runs, &d));
    printf("md5sum_value %s\n", d.md5);
    return 0;
}
