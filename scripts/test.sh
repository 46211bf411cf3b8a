#!/usr/bin/env bash
# Installs what is missing (Debian 12), builds with ASan+UBSan and warnings as
# errors, and runs every test with ctest. Usage: scripts/test.sh [ctest args...]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${CKPTD_BUILD_DIR:-$here/build-asan}
"$here/scripts/setup.sh" "$build" -DCMAKE_BUILD_TYPE=Debug -DCKPTD_SANITIZE=ON
# halt_on_error: a sanitizer report fails the test that caused it
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
cd "$build"
ctest --output-on-failure -j"$(nproc)" --timeout 300 "$@"
