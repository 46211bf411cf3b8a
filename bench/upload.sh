#!/usr/bin/env bash
# Upload figures against the tools a user would use instead, in the same run,
# on a release build, servers on loopback (tests/lib/servers.py):
#  - one 1 GiB file and one folder of 64 files of 16 MiB (a sharded checkpoint,
#    a Hugging Face folder), each to s3rver (S3), to Ceph's RADOS Gateway
#    (production S3, started for the bench by tests/lib/rgw.sh; skipped
#    without Debian's radosgw) and to nginx (WebDAV);
#  - 32 files of 1 MiB to s3rver through a proxy that adds a round trip
#    (CKPTD_BENCH_RTT_MS, default 50) to every request: a far region;
#  - peers: `aws s3 cp [--recursive]` (S3, RGW), `curl -T` (WebDAV; --parallel for
#    the folder), `rclone copy` (both; Debian's rclone, skipped when absent);
#  - 5 runs of each tool (CKPTD_BENCH_ROUNDS), tools alternating; each tool's
#    best and median; the ratio is the fastest peer's time over ckptd's (above
#    1: ckptd is faster), by medians and by bests; peak RSS (VmHWM) of every tool,
#    its CPU time, and how busy the server's main thread was (its CPU time over
#    the run's wall time: near 100%, the server sets the pace for every tool;
#    RGW: radosgw's and the OSD's threads, all of them, so in cores).
# Every remote copy is deleted from the server's disk right after its run,
# and the scratch folder on exit (a trap): the bench needs about 2.5 GiB.
# Usage: bench/upload.sh [BUILD_DIR] [FILE_MIB] [FOLDER_FILES] [FOLDER_FILE_MIB]
# (extra cmake arguments, e.g. -DCKPTD_WERROR=OFF, in $CKPTD_BENCH_CMAKE_ARGS;
# CKPTD_BENCH_ONLY=s3, rgw, webdav or latency runs one part)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build-bench}
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPTD_SANITIZE=OFF \
    ${CKPTD_BENCH_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"$(nproc)" --target ckptd >/dev/null
work=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-bench-upload.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
export CKPTD_BENCH_BIN=$build/agent/ckptd CKPTD_BENCH_WORK=$work \
    CKPTD_BENCH_FILE_MIB=${2:-1024} CKPTD_BENCH_FILES=${3:-64} CKPTD_BENCH_FILES_MIB=${4:-16} \
    CKPTD_BENCH_LIB=$here/tests/lib
# not exec: the EXIT trap must run to remove $work (GBs)
/usr/bin/python3 "$here/bench/upload_bench.py"
