#!/bin/sh
# Builds the libFuzzer targets with clang in BUILD_DIR and runs each for
# SECONDS (default 5) on a corpus seeded with generated files and the real
# files under $CK_SHARED_DATA (default ../shared/data next to the repo).
# Exits non-zero when a target finds a crash, a leak or a timeout; the
# reproducer is left in BUILD_DIR/fuzz-artifacts/.
#
#   tests/fuzz/run.sh BUILD_DIR [SECONDS]
set -eu
if [ $# -lt 1 ]; then
    echo "usage: $0 BUILD_DIR [SECONDS]" >&2
    exit 2
fi
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$1
secs=${2:-5}
: "${CK_SHARED_DATA:=$src/../shared/data}"
export CK_SHARED_DATA

# Warnings are errors in the gcc build; clang's extra ones need not stop fuzzing.
cmake -S "$src" -B "$build" -DCMAKE_C_COMPILER=clang -DCKPTD_FUZZ=ON -DCKPTD_WERROR=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=$(sed -n 's/^foreach(name \(.*\))$/\1/p' "$src/tests/fuzz/CMakeLists.txt")
set --
for t in $targets; do set -- "$@" "fuzz_$t"; done
cmake --build "$build" -j"$(nproc)" --target "$@" >/dev/null

seeds=$build/fuzz-seeds
rm -rf "$seeds"
/usr/bin/python3 "$src/tests/fuzz/seeds.py" "$seeds"
# Formats whose seeds are real files only (targets other helpers add).
seed_shared() { # target subfolder glob
    mkdir -p "$seeds/$1"
    for f in "$CK_SHARED_DATA"/$2/$3; do
        [ -f "$f" ] && cp "$f" "$seeds/$1/" || true
    done
}
seed_shared nnp nnabla '*.nnp'
seed_shared samediff samediff '*.fb'

mkdir -p "$build/fuzz-artifacts"
status=0
for t in $targets; do
    corpus=$build/fuzz-corpus/$t
    mkdir -p "$corpus" "$seeds/$t"
    echo "fuzz_$t: ${secs}s"
    if ! "$build/tests/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$t-" \
        "$corpus" "$seeds/$t" >"$build/fuzz-$t.log" 2>&1; then
        echo "fuzz_$t: FAILED (log: $build/fuzz-$t.log)" >&2
        tail -40 "$build/fuzz-$t.log" >&2
        status=1
    else
        grep -E '^stat::number_of_executed_units' "$build/fuzz-$t.log" || true
    fi
done
exit $status
