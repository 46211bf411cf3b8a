#!/bin/sh
# ckptd watch, measured (issue 3). Needs a release build:
#   cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=Release && cmake --build build-rel -j2
#   bench/watch.sh [path/to/ckptd]
#
# 1. latency: a 1 MiB checkpoint's close -> metadata.yaml replaced, median of 50,
#    for 'ckptd watch --settle 0' and with the default settle window (200ms),
#    against a polling peer in the same run: 'ckptd scan' every second.
# 2. burst: 1,000 checkpoints written within one second: all registered, none twice.
# 3. idle: an idle watcher over a tree of 10,000 files: CPU used and resident memory
#    (from /proc/PID/stat and /proc/PID/status).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ckptd=${1:-$here/../build-rel/agent/ckptd}
[ -x "$ckptd" ] || { echo "no ckptd at $ckptd (build-rel first)" >&2; exit 2; }
py=/usr/bin/python3
echo "ckptd: $ckptd ($("$ckptd" --version)); $(nproc) CPUs; $(uname -r)"
$py "$here/watch_bench.py" "$ckptd" latency 50 0
$py "$here/watch_bench.py" "$ckptd" latency 50 200ms
$py "$here/watch_bench.py" "$ckptd" burst 1000
$py "$here/watch_bench.py" "$ckptd" idle 10000 20
