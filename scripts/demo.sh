#!/usr/bin/env bash
# The main job on a demo: a simulated training run writes five checkpoints
# (safetensors of a small MLP) while `ckptd watch` runs beside it as a sidecar
# would. ckptd registers each one in a PMF tree the moment it is complete,
# packs it into a deployment archive (.mldef) and a new tag of the run's
# SameDiff archive, runs each archive on the CPU before anything is uploaded,
# uploads the tree and the archives that passed to a local "remote" store
# (file://, metadata.yaml last), and ends the training as finished when the
# job exits 0. Then the tree is checked with an independent PMF validator, a
# checkpoint is read back, and the last archive is validated and run again
# against the known-good outputs the sidecar recorded in it.
# Usage: scripts/demo.sh [DEMO_DIR]   (installs what is missing on Debian 12)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${CKPTD_BUILD_DIR:-$here/build}
"$here/scripts/setup.sh" "$build"
ckptd=$build/agent/ckptd
demo=${1:-$(mktemp -d "${TMPDIR:-/tmp}/ckptd-demo.XXXXXX")}
run=$demo/run
remote=$demo/remote
mkdir -p "$run" "$remote"

cat > "$run/ckptd.yaml" <<YAML
model:
  name: demo_mnist
  build_parameters: {dataset: mnist, batch_size: 64}
upload:
  stores:
    - url: file://$remote
# the network the weight-only checkpoints belong to (docs/model.md)
pack:
  formats: [mldef, samediff]
  graph:
    input: {name: x, shape: [-1, 16]}
    layers:
      - {op: dense, weight: fc1.weight, bias: fc1.bias}
      - {op: relu}
      - {op: dense, weight: fc2.weight, bias: fc2.bias}
      - {op: softmax}
verify:
  timeout: 30s
  record: true   # a passing run's inputs and outputs go into the archive: its known-good outputs
YAML

# the job's own training configuration, there before it starts (as with most jobs)
printf 'lr: 0.01\nepochs: 5\nbatch_size: 64\n' > "$run/config.yaml"

echo "== ckptd watch $run -- sim_trainer.py (5 epochs)"
"$ckptd" watch "$run" -- /usr/bin/python3 "$here/tests/sim_trainer.py" "$run" \
    --mode mlp --epochs 5 --interval 0.3 --size 400000

echo
echo "== $run/metadata.yaml"
cat "$run/metadata.yaml"
echo
echo "== the PMF tree, checked by an independent validator (tests/lib/pmf_validate.py)"
/usr/bin/python3 "$here/tests/lib/pmf_validate.py" "$run"
echo
echo "== the remote copy ($remote)"
(cd "$remote" && find . -type f | sort)
cmp "$run/metadata.yaml" "$remote/metadata.yaml" && echo "remote metadata.yaml is identical"
echo
latest=$(/usr/bin/python3 -c 'import sys, yaml; t = yaml.safe_load(open(sys.argv[1]))["model"]["training"]; print(t["checkpoints"][t["latest"]]["path"])' "$run/metadata.yaml")
echo "== ckptd inspect --verify $latest"
"$ckptd" inspect --verify "$run/$latest"
echo
echo "== the deployment archives (data/deploy/), as recorded in data/build_parameters.yaml"
ls -l "$run/data/deploy"
archive=$(ls "$run"/data/deploy/*.mldef | sort -V | tail -1)
echo
echo "== mldef -i $archive (every rule of docs/mldef.md)"
"$build/agent/mldef" -i "$archive"
echo
echo "== ckptd verify $archive (the engine, in its sandbox: the known-good outputs the sidecar recorded in it, computed again)"
"$ckptd" verify "$archive"
echo
echo "demo folder: $demo"
