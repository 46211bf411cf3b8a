#!/usr/bin/env bash
# Issue 2's figures, measured against the tools a user would use instead, in
# the same run, on a release build:
#  1. ckptd's hasher vs md5sum on one 1 GiB page-cached file (MD5 alone, and
#     MD5+SHA-256 from one read vs md5sum alone);
#  2. ckptd scan registering that 1 GiB checkpoint vs md5sum of it;
#  3. a scan over 10,000 already-registered checkpoints (nothing to do).
# Usage: bench/scan.sh [BUILD_DIR] [SIZE_MIB]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build-bench}
size_mib=${2:-1024}
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPTD_SANITIZE=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target ckptd hashbench >/dev/null
ckptd=$build/agent/ckptd
work=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

best() { # best wall time in seconds of 3 runs of "$@"
    local b=999999 t0 t1 t
    for _ in 1 2 3; do
        t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N)
        b=$(awk -v a="$t0" -v z="$t1" -v b="$b" 'BEGIN { t = z - a; print (t < b ? t : b) }')
    done
    printf '%.4f' "$b"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
mbps() { awk -v mb="$1" -v t="$2" 'BEGIN { printf "%.0f", mb * 1.048576 / t }'; }

f=$work/model/epoch_1.pt
mkdir -p "$work/model"
head -c $((size_mib << 20)) /dev/urandom > "$f"
touch -d '1 min ago' "$f"
cat "$f" > /dev/null  # page cache
mb=$size_mib

md5sum_t=$(best md5sum "$f")
sha256sum_t=$(best sha256sum "$f")
read -r _ md5_t < <("$build/bench/hashbench" "$f" 3 | grep '^md5 ')
read -r _ both_t < <("$build/bench/hashbench" "$f" 3 | grep '^both ')
echo "== hashing ${mb} MiB, page-cached ($(nproc) cores)"
printf 'md5sum                      %7.3f s  %6.0f MB/s\n' "$md5sum_t" "$(mbps "$mb" "$md5sum_t")"
printf 'sha256sum                   %7.3f s  %6.0f MB/s\n' "$sha256sum_t" "$(mbps "$mb" "$sha256sum_t")"
printf 'ckptd md5                   %7.3f s  %6.0f MB/s  throughput vs md5sum: %sx\n' "$md5_t" "$(mbps "$mb" "$md5_t")" "$(ratio "$md5sum_t" "$md5_t")"
printf 'ckptd md5+sha256 (one read) %7.3f s  %6.0f MB/s  vs md5sum alone: %sx, vs ckptd md5 alone: %sx\n' "$both_t" "$(mbps "$mb" "$both_t")" "$(ratio "$md5sum_t" "$both_t")" "$(ratio "$md5_t" "$both_t")"

# 2. the user-level path: register a fresh 1 GiB checkpoint
scan_once() { rm -rf "$work/model/.ckptd" "$work/model/metadata.yaml" "$work/model/data"; "$ckptd" scan -q "$work/model"; }
scan_t=$(best scan_once)
printf 'ckptd scan (register 1 ckpt)%7.3f s  vs md5sum: %sx\n' "$scan_t" "$(ratio "$md5sum_t" "$scan_t")"

# 3. 10,000 registered checkpoints, nothing new
many=$work/many
mkdir -p "$many/ckpts"
( cd "$many/ckpts" && for i in $(seq 1 10000); do printf '%d' "$i" > "epoch_$i.pt"; done && touch -d '1 min ago' ./* )
t0=$(date +%s.%N); "$ckptd" scan -q "$many"; t1=$(date +%s.%N)
first=$(awk -v a="$t0" -v z="$t1" 'BEGIN { print z - a }')
noop_t=$(best "$ckptd" scan -q "$many")
n=$(grep -c '^ *epoch: ' "$many/metadata.yaml")
echo "== scan of 10,000 checkpoints"
printf 'first scan (registers %d)   %7.3f s\n' "$n" "$first"
printf 'scan with nothing new       %7.3f s  (goal: under 1 s)\n' "$noop_t"
