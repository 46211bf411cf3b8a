#!/usr/bin/env bash
# Issue 13's figures: ckptd verify's engine against PyTorch CPU on the same
# models (tests/lib/make_torch_models.py: an MLP, a CNN with batch norm and
# pooling, a residual block), the same inputs, one thread each
# (OpenBLAS with OPENBLAS_NUM_THREADS=1, torch.set_num_threads(1)), batch 1
# and 64, in the same run. Times are the median of REPEAT runs inside each
# process (ckptd verify --repeat; torch after 3 warm-up runs), so neither
# side pays its start-up: CPU time of the computing thread (what a batch
# costs; on a shared machine wall time mostly measures the other jobs), and
# the wall-clock medians beside them. Also: the engine with plain-loop products
# (--naive-gemm) to show what OpenBLAS buys, and the peak RSS of both
# processes (ckptd: the engine's sandboxed child; torch: its Python process).
# Then issue 31's zoo at real sizes (bench/infer_zoo.py: torchvision's
# resnet18, mobilenet_v2, efficientnet_b0, regnet_y_400mf at 224x224, the
# zoo's ConvNeXt-style block at 224x224, a BERT-shaped model of d 64 and 128
# tokens; ONNX opset 14), batch 1 and 4, ZOO_REPEAT runs each, worst ratio
# first, with the GFLOP/s each side reaches (2 x the multiply-adds of the
# convolutions and products torch runs, over the median CPU time) beside
# OpenBLAS sgemm's on the same machine (one thread, a 512x3136x576 product),
# and both again with THREADS threads (ckptd verify --threads,
# torch.set_num_threads; CKPTD_BENCH_THREADS, default 2): their wall-clock
# medians and each one's speed-up over its own one-thread run.
# Usage: bench/infer.sh [BUILD_DIR] [REPEAT] [ZOO_REPEAT]
# CKPTD_BENCH_ONLY=small or zoo runs one of the two tables. CKPTD_BENCH_ZOO=DIR
# keeps the zoo's exported models in DIR (made when missing) and uses them
# again in later runs instead of exporting them afresh.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build-bench}
repeat=${2:-200}
zoo_repeat=${3:-20}
only=${CKPTD_BENCH_ONLY:-}
threads=${CKPTD_BENCH_THREADS:-2}
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPTD_SANITIZE=OFF -DCKPTD_WERROR=OFF >/dev/null
cmake --build "$build" -j2 --target ckptd >/dev/null
ckptd=$build/agent/ckptd
work=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

engine() { # median_cpu_ms median_wall_ms peak_rss_mib of ckptd verify ... --repeat
    "$ckptd" verify "$work/$1.safetensors" --graph "$work/$1.yaml" --inputs "$work/$1.in$2.npy" \
        --expected "$work/$1.out$2.npy" --repeat "$repeat" "${@:3}" |
        awk '/^engine:/ { for (i = 1; i <= NF; i++) { if ($i == "median" && !m) m = $(i+1);
             if ($i == "CPU") c = $(i+1); if ($i == "RSS") r = $(i+1) } print c, m, r }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
gflops() { awk -v g="$1" -v ms="$2" 'BEGIN { printf "%.1f", g / ms * 1e3 }'; }

if [ "$only" != zoo ]; then
/usr/bin/python3 "$here/tests/lib/make_torch_models.py" "$work" >/dev/null
echo "| model | batch | ckptd CPU ms | torch CPU ms | ckptd/torch | ckptd naive-gemm CPU ms | BLAS speed-up | wall ms ckptd / torch | peak RSS MiB ckptd / torch |"
echo "|---|---|---|---|---|---|---|---|---|"
for model in mlp cnn residual; do
    for batch in 1 64; do
        read -r ck ck_wall ck_rss < <(engine "$model" "$batch")
        read -r naive _ _ < <(engine "$model" "$batch" --naive-gemm)
        read -r th th_wall th_rss < <(/usr/bin/python3 "$here/bench/infer_torch.py" "$work" "$model" "$batch" "$repeat")
        echo "| $model | $batch | $ck | $th | $(ratio "$ck" "$th") | $naive | $(ratio "$naive" "$ck") | $ck_wall / $th_wall | $ck_rss / $th_rss |"
    done
done
echo
fi

[ "$only" = small ] && exit 0
zoo=${CKPTD_BENCH_ZOO:-$work/zoo}
mkdir -p "$zoo"
[ -f "$zoo/exported" ] || {
    /usr/bin/python3 "$here/bench/infer_zoo.py" export "$zoo" >/dev/null 2>&1
    touch "$zoo/exported"
}
sgemm=$(/usr/bin/python3 "$here/bench/infer_zoo.py" sgemm 20)
zoo_engine() { # median_cpu_ms median_wall_ms peak_rss_mib
    "$ckptd" verify "$zoo/$1.b$2.onnx" --inputs "$zoo/$1.in$2.npy" --expected "$zoo/$1.out$2.npy" \
        --repeat "$zoo_repeat" "${@:3}" |
        awk '/^engine:/ { for (i = 1; i <= NF; i++) { if ($i == "median" && !m) m = $(i+1);
             if ($i == "CPU") c = $(i+1); if ($i == "RSS") r = $(i+1) } print c, m, r }'
}
echo "| model | batch | ckptd CPU ms | torch CPU ms | ckptd/torch | GFLOP | GFLOP/s ckptd / torch / sgemm | wall ms ckptd / torch | peak RSS MiB ckptd / torch | $threads threads: wall ms ckptd / torch | $threads threads: speed-up ckptd / torch | $threads threads: ckptd/torch |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for model in $(/usr/bin/python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import infer_zoo; print(*infer_zoo.NAMES)' "$here/bench"); do
    for batch in 1 4; do
        read -r ck ck_wall ck_rss < <(zoo_engine "$model" "$batch")
        [ -n "$ck" ] || { echo "ckptd verify failed on $model batch $batch" >&2; exit 1; }
        read -r th th_wall th_rss < <(/usr/bin/python3 "$here/bench/infer_zoo.py" torch "$zoo" "$model" "$batch" "$zoo_repeat")
        read -r _ ckn_wall _ < <(zoo_engine "$model" "$batch" --threads "$threads")
        read -r _ thn_wall _ < <(/usr/bin/python3 "$here/bench/infer_zoo.py" torch "$zoo" "$model" "$batch" "$zoo_repeat" "$threads")
        g=$(cat "$zoo/$model.gflop$batch")
        echo "| $model | $batch | $ck | $th | $(ratio "$ck" "$th") | $g | $(gflops "$g" "$ck") / $(gflops "$g" "$th") / $sgemm | $ck_wall / $th_wall | $ck_rss / $th_rss | $ckn_wall / $thn_wall | $(ratio "$ck_wall" "$ckn_wall") / $(ratio "$th_wall" "$thn_wall") | $(ratio "$ckn_wall" "$thn_wall") |"
    done
done | sort -t '|' -k6,6 -gr
