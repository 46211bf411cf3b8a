#!/usr/bin/env bash
# Installs what building and testing ckptd needs on Debian 12 (as root, or
# with sudo), then configures and builds. Usage: scripts/setup.sh [BUILD_DIR] [cmake args...]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
shift || true
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
mapfile -t pkgs < <(sed -e 's/#.*//' -e '/^\s*$/d' "$here/.ci/packages.txt")
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The S3 test server (tests/lib/package.json) runs on node. Debian 12 packages
# node and npm separately; images that bring their own node (with npm) keep it.
if [ -f "$here/tests/lib/package.json" ] && ! command -v npm >/dev/null 2>&1; then
    missing+=(nodejs npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ -f "$here/tests/lib/package.json" ] && [ ! -d "$here/tests/lib/node_modules" ]; then
    echo "setup: installing the test servers from npm"
    (cd "$here/tests/lib" && npm ci --silent --no-audit --no-fund)
fi
cmake -S "$here" -B "$build" "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
