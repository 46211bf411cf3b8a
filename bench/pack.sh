#!/usr/bin/env bash
# Issue 11's figures: `ckptd pack --format mldef -0` of a 1 GiB safetensors
# checkpoint (16 float32 tensors of 4096x4096 and a layer list of 16 dense
# layers), page-cached, against `cp` of the same file and Info-ZIP `zip -0`
# (Debian's zip) in the same run, on a release build. CKPTD_BENCH_ROUNDS
# rounds (default 7), each running every contender once in turn (so a slow
# spell of the machine hits all of them); the best and the median wall time
# of each (a VM's times are noisy; the median is not biased by the one
# lucky run that the best picks); max RSS
# from /usr/bin/time. Goals: at most 1.2x cp's time, at least zip -0's
# speed, RSS under 64 MiB. Also `cp` followed by `sync FILE`: pack
# fsyncs its archive before renaming it into place, cp and zip do not; the
# sync's own time (the disk writing the copy's bytes) is the floor of any
# durable write of the checkpoint, and is printed beside cp's.
# Usage: bench/pack.sh [BUILD_DIR] [SIZE_MIB]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build-bench}
size_mib=${2:-1024}
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPTD_SANITIZE=OFF -DCKPTD_WERROR=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target ckptd >/dev/null
ckptd=$build/agent/ckptd
work=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Every timed run starts from the same machine state (bench/same_start.py:
# the outputs removed, the disk settled, the checkpoint page-cached, a
# page-cached copy of it written and removed).
same_start() {
    rm -f "$work"/out.*
    /usr/bin/python3 "$here/bench/same_start.py" "$work" "$src"
}
# One timed run of "$@" in seconds.
once() {
    local t0 t1
    same_start
    t0=$(date +%s.%N); "$@" >/dev/null 2>&1; t1=$(date +%s.%N)
    awk -v a="$t0" -v z="$t1" 'BEGIN { printf "%.4f", z - a }'
}
# "TOTAL SYNC" seconds of one `cp` then `sync FILE`
cp_then_sync() {
    local t0 t1 t2
    same_start
    t0=$(date +%s.%N); cp "$src" "$work/out.cps"; t1=$(date +%s.%N); sync "$work/out.cps"; t2=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v z="$t2" 'BEGIN { printf "%.4f %.4f\n", z - a, z - b }'
}
best() { printf '%s\n' "$@" | sort -g | head -1; }
median() {
    printf '%s\n' "$@" | sort -g |
        awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
mbps() { awk -v mb="$1" -v t="$2" 'BEGIN { printf "%.0f", mb * 1.048576 / t }'; }
# "RSS_KIB CPU_S" of one run: max RSS, and user + system CPU seconds (on a
# shared machine the CPU a tool needs says more than its wall time).
rss_cpu() {
    rm -f "$work"/out.*
    /usr/bin/time -f '%M %U %S' -o "$work/time" "$@" >/dev/null 2>&1
    awk '{ printf "%s %.2f\n", $1, $2 + $3 }' "$work/time"
}

# The checkpoint: safetensors written by the test writer, streamed to disk.
n=$((size_mib / 64))
PYTHONPATH=$here/tests/lib /usr/bin/python3 - "$work" "$n" <<'PY'
import json, struct, sys
import numpy as np
work, n = sys.argv[1], int(sys.argv[2])
dim = 4096
size = dim * dim * 4
hdr, off = {}, 0
for i in range(n):
    hdr[f"fc{i}.weight"] = {"dtype": "F32", "shape": [dim, dim], "data_offsets": [off, off + size]}
    off += size
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
rng = np.random.default_rng(0)
block = rng.standard_normal(dim * dim, dtype=np.float32).tobytes()
with open(f"{work}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for i in range(n):
        f.write(block)
with open(f"{work}/graph.yaml", "w") as f:
    f.write("input: {name: x, shape: [-1, %d]}\nlayers:\n" % dim)
    for i in range(n):
        f.write("  - {op: dense, weight: fc%d.weight}\n" % i)
PY
src=$work/model.safetensors
mib=$(( $(stat -c %s "$src") >> 20 ))

rounds=${CKPTD_BENCH_ROUNDS:-7}
T_cp=() T_cps=() T_sync=() T_zip=() T_pack=()
for _ in $(seq "$rounds"); do
    T_pack+=("$(once "$ckptd" pack --format mldef -0 "$src" --graph "$work/graph.yaml" -o "$work/out.mldef")")
    T_cp+=("$(once cp "$src" "$work/out.cp")")
    # cp does not fsync; pack does (a finished archive survives a crash), so
    # the same durability from cp costs a sync of the copy too. The sync's
    # own time is the disk's for the file's bytes: no durable archive of
    # them can be written in less.
    read -r t_all t_sync < <(cp_then_sync)
    T_cps+=("$t_all") T_sync+=("$t_sync")
    T_zip+=("$(once zip -0 -q -j "$work/out.zip" "$src")")
done
t_cp=$(best "${T_cp[@]}") m_cp=$(median "${T_cp[@]}")
t_cps=$(best "${T_cps[@]}") m_cps=$(median "${T_cps[@]}")
t_sync=$(best "${T_sync[@]}") m_sync=$(median "${T_sync[@]}")
t_zip=$(best "${T_zip[@]}") m_zip=$(median "${T_zip[@]}")
t_pack=$(best "${T_pack[@]}") m_pack=$(median "${T_pack[@]}")
read -r rss_pack cpu_pack < <(rss_cpu "$ckptd" pack --format mldef -0 "$src" --graph "$work/graph.yaml" -o "$work/out.mldef")
read -r rss_zip cpu_zip < <(rss_cpu zip -0 -q -j "$work/out.zip" "$src")
read -r rss_cp cpu_cp < <(rss_cpu cp "$src" "$work/out.cp")

printf 'checkpoint: %d MiB safetensors, %d tensors of 4096x4096 float32; %d rounds\n' "$mib" "$n" "$rounds"
printf '%-30s %8s %8s %7s %7s %9s\n' "" "best" "median" "MiB/s" "cpu" "rss"
row() { printf '%-30s %7ss %7ss %7s %6ss %5s KiB\n' "$1" "$2" "$3" "$(mbps "$mib" "$2")" "$4" "$5"; }
row "cp" "$t_cp" "$m_cp" "$cpu_cp" "$rss_cp"
row "cp + sync FILE" "$t_cps" "$m_cps" "-" "-"
row "  of which sync FILE" "$t_sync" "$m_sync" "-" "-"
row "zip -0" "$t_zip" "$m_zip" "$cpu_zip" "$rss_zip"
row "ckptd pack --format mldef -0" "$t_pack" "$m_pack" "$cpu_pack" "$rss_pack"
printf 'pack / cp time: %sx by bests, %sx by medians (goal <= 1.2)\n' "$(ratio "$t_pack" "$t_cp")" \
    "$(ratio "$m_pack" "$m_cp")"
printf 'zip -0 / pack time: %sx by bests, %sx by medians (goal >= 1.0); rss goal < 65536 KiB\n' \
    "$(ratio "$t_zip" "$t_pack")" "$(ratio "$m_zip" "$m_pack")"
printf 'pack / (cp + sync) time: %sx by bests, %sx by medians (the same durability)\n' \
    "$(ratio "$t_pack" "$t_cps")" "$(ratio "$m_pack" "$m_cps")"
printf 'the disk writing the file (sync after cp) / cp time: %sx by bests, %sx by medians; pack / that: %sx, %sx\n' \
    "$(ratio "$t_sync" "$t_cp")" "$(ratio "$m_sync" "$m_cp")" "$(ratio "$t_pack" "$t_sync")" "$(ratio "$m_pack" "$m_sync")"
printf 'cpu: pack / cp %sx, zip -0 / pack %sx; load average %s\n' "$(ratio "$cpu_pack" "$cpu_cp")" \
    "$(ratio "$cpu_zip" "$cpu_pack")" "$(cut -d' ' -f1-3 /proc/loadavg)"
