#!/bin/sh
# Builds the libFuzzer targets with clang in BUILD_DIR and runs each for
# SECONDS (default 5; "long" is 600, the routine run before a parser is
# called done) on a corpus made of: what earlier runs in BUILD_DIR found,
# the minimised corpus kept in the repository (tests/fuzz/corpus/TARGET: the
# regression seeds, so every short run replays them), generated seeds
# (seeds.py) and the real files under $CK_SHARED_DATA (default ../shared/data
# next to the repo).
#
#   tests/fuzz/run.sh BUILD_DIR [SECONDS|long] [TARGET...]
#
# Exits non-zero when a target finds a crash, undefined behaviour (UBSan
# halts: -fno-sanitize-recover and halt_on_error), a leak or a timeout; the
# reproducer is left in BUILD_DIR/fuzz-artifacts/. Each target's figures
# (executions, coverage, corpus size) go to BUILD_DIR/fuzz-summary.tsv.
# CK_FUZZ_JOBS=N runs N targets at a time (default 1).
# CK_FUZZ_KEEP=1 then merges each target's corpus, minimised (libFuzzer's
# -merge=1 keeps the inputs that add coverage), into tests/fuzz/corpus, less
# any input holding a copy of the real files (keep_clean.py).
set -eu
if [ $# -lt 1 ]; then
    echo "usage: $0 BUILD_DIR [SECONDS|long] [TARGET...]" >&2
    exit 2
fi
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$1
secs=${2:-5}
[ "$secs" = long ] && secs=600
shift $(($# < 2 ? $# : 2))
: "${CK_SHARED_DATA:=$src/../shared/data}"
: "${CK_FUZZ_JOBS:=1}"
export CK_SHARED_DATA
# a finding stops the run (the build's -fno-sanitize-recover does it too)
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}

# Warnings are errors in the gcc build; clang's extra ones need not stop fuzzing.
cmake -S "$src" -B "$build" -DCMAKE_C_COMPILER=clang -DCKPTD_FUZZ=ON -DCKPTD_WERROR=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=$(sed -n '/^foreach(name /,/)$/p' "$src/tests/fuzz/CMakeLists.txt" |
    sed -e 's/^foreach(name //' -e 's/)$//' | tr -s ' \n' ' ')
if [ $# -gt 0 ]; then
    for t in "$@"; do
        case " $targets " in *" $t "*) ;; *) echo "$0: no target '$t' (targets: $targets)" >&2; exit 2 ;; esac
    done
    targets="$*"
fi
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
summary=$build/fuzz-summary.tsv
printf 'target\tseconds\texecutions\tcoverage\tfeatures\tcorpus\tresult\n' >"$summary"

# One target: its run, its line in the summary; non-zero when it found something.
run_one() {
    t=$1
    corpus=$build/fuzz-corpus/$t
    kept=$src/tests/fuzz/corpus/$t
    mkdir -p "$corpus" "$seeds/$t"
    set -- "$corpus"
    [ -d "$kept" ] && set -- "$@" "$kept"
    log=$build/fuzz-$t.log
    result=ok
    if ! "$build/tests/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$t-" \
        "$@" "$seeds/$t" >"$log" 2>&1; then
        result=FOUND
    fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    corp=$(echo "$last" | sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$secs" "${execs:-?}" "${cov:-?}" "${ft:-?}" \
        "${corp:-?}" "$result" >>"$summary"
    if [ "$result" != ok ]; then
        echo "fuzz_$t: FAILED (log: $log)" >&2
        tail -40 "$log" >&2
        return 1
    fi
    echo "fuzz_$t: ${secs}s, ${execs:-?} runs, cov ${cov:-?}"
    if [ "${CK_FUZZ_KEEP:-0}" = 1 ]; then
        mkdir -p "$kept"
        "$build/tests/fuzz/fuzz_$t" -merge=1 "$kept" "$corpus" "$seeds/$t" >"$log.merge" 2>&1
        # the real files seed every run from ../shared/data; the repository
        # keeps only what the fuzzers made, no copy of them
        /usr/bin/python3 "$src/tests/fuzz/keep_clean.py" "$kept"
    fi
}

status=0
running=0
pids=""
for t in $targets; do
    echo "fuzz_$t: ${secs}s"
    run_one "$t" &
    pids="$pids $!"
    running=$((running + 1))
    if [ "$running" -ge "$CK_FUZZ_JOBS" ]; then
        for p in $pids; do wait "$p" || status=1; done
        pids=""
        running=0
    fi
done
for p in $pids; do wait "$p" || status=1; done
exit $status
