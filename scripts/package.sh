#!/usr/bin/env bash
# Builds the Debian package: an optimised build installed under /usr, then
# cpack. Usage: scripts/package.sh [BUILD_DIR]; prints the .deb's path last.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build-pkg}
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null
log=$(cd "$build" && cpack -G DEB 2>&1) || { echo "$log" >&2; exit 1; }
ls "$build"/ckptd_*_"$(dpkg --print-architecture)".deb
