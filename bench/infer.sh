#!/usr/bin/env bash
# Issue 13's figures: ckptd verify's engine against PyTorch CPU on the same
# models (tests/lib/make_torch_models.py: an MLP, a CNN with batch norm and
# pooling, a residual block), the same inputs, one thread each
# (OpenBLAS with OPENBLAS_NUM_THREADS=1, torch.set_num_threads(1)), batch 1
# and 64, in the same run. Times are the median of REPEAT runs inside each
# process (ckptd verify --repeat; torch after 3 warm-up runs), so neither
# side pays its start-up. Also: the engine with plain-loop products
# (--naive-gemm) to show what OpenBLAS buys, and the peak RSS of both
# processes (ckptd: the engine's sandboxed child; torch: its Python process).
# Usage: bench/infer.sh [BUILD_DIR] [REPEAT]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build-bench}
repeat=${2:-200}
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPTD_SANITIZE=OFF -DCKPTD_WERROR=OFF >/dev/null
cmake --build "$build" -j2 --target ckptd >/dev/null
ckptd=$build/agent/ckptd
work=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 "$here/tests/lib/make_torch_models.py" "$work" >/dev/null

engine() { # median_ms peak_rss_mib of ckptd verify ... --repeat
    "$ckptd" verify "$work/$1.safetensors" --graph "$work/$1.yaml" --inputs "$work/$1.in$2.npy" \
        --expected "$work/$1.out$2.npy" --repeat "$repeat" "${@:3}" |
        awk '/^engine:/ { for (i = 1; i <= NF; i++) { if ($i == "median") m = $(i+1);
             if ($i == "RSS") r = $(i+1) } print m, r }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo "| model | batch | ckptd ms | ckptd naive ms | torch ms | ckptd/torch | BLAS speed-up | ckptd RSS MiB | torch RSS MiB |"
echo "|---|---|---|---|---|---|---|---|---|"
for model in mlp cnn residual; do
    for batch in 1 64; do
        read -r ck ck_rss < <(engine "$model" "$batch")
        read -r naive _ < <(engine "$model" "$batch" --naive-gemm)
        read -r th _ th_rss < <(/usr/bin/python3 "$here/bench/infer_torch.py" "$work" "$model" "$batch" "$repeat")
        echo "| $model | $batch | $ck | $naive | $th | $(ratio "$ck" "$th") | $(ratio "$naive" "$ck") | $ck_rss | $th_rss |"
    done
done
