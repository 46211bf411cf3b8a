#!/usr/bin/env bash
# Issue 12's figures, on a release build, page cache warm:
# 1. appending the 50th tag of a 256 MiB model to a SameDiff archive vs
#    appending the first (goal: at most 1.2x). Every tag has distinct weights
#    (the source's tensors change between appends), so the archive grows by
#    256 MiB per tag; the peer is Info-ZIP's zip adding the same tag's files to
#    the 49-tag archive (it copies the archive to a temporary: a rewrite).
# 2. the saving of parameter sharing on a fine-tuning run where half the
#    layers are frozen: archive bytes vs the bytes of every tag stored whole
#    (counted independently with zipfile from params.txt).
# Usage: bench/samediff.sh [BUILD_DIR] [SIZE_MIB] [TAGS]   (ONLY=append|sharing: one part)
# Disk: about SIZE_MIB * TAGS * 2 at the peak (the peer's temporary copy).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build-bench}
size_mib=${2:-256}
tags=${3:-50}
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPTD_SANITIZE=OFF -DCKPTD_WERROR=OFF >/dev/null
cmake --build "$build" -j2 --target ckptd >/dev/null
ckptd=$build/agent/ckptd
work=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
export PYTHONPATH=$here/tests/lib

secs() { awk -v a="$1" -v z="$2" 'BEGIN { printf "%.3f", z - a }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

# A model of SIZE_MIB in four dense layers, and a tool that makes its weights
# distinct per tag (writes the tag number into each tensor's first element).
/usr/bin/python3 - "$work/model.fb" "$size_mib" <<'PY'
import sys, numpy as np, sdfb
path, mib = sys.argv[1], int(sys.argv[2])
n = int((mib * 2**20 / 4 / 4) ** 0.5)
rng = np.random.default_rng(0)
layers = [(rng.standard_normal((n, n), dtype=np.float32), np.zeros(n, np.float32)) for _ in range(4)]
sdfb.chain(path, layers, n)
PY
mutate() {
    /usr/bin/python3 - "$work/model.fb" "$1" <<'PY'
import sys, struct, sdfb
path, k = sys.argv[1], int(sys.argv[2])
offs = sdfb.buffer_offsets(path)
with open(path, "r+b") as f:
    for off in offs.values():
        f.seek(off)
        f.write(struct.pack(">f", float(k)))
PY
}

if [ "${ONLY:-append}" = append ]; then
arc=$work/run.zip
first=0 last=0
: > "$work/times"
for k in $(seq 1 "$tags"); do
    mutate "$k"
    cat "$work/model.fb" > /dev/null
    t0=$(date +%s.%N)
    "$ckptd" pack --format samediff "$work/model.fb" -o "$arc" --tag "t$k" -q >/dev/null
    t1=$(date +%s.%N)
    secs "$t0" "$t1" >> "$work/times"; echo >> "$work/times"
    [ "$k" -eq 1 ] && first=$(secs "$t0" "$t1")
    [ "$k" -eq "$tags" ] && last=$(secs "$t0" "$t1")
done
# On a shared machine one run is noisy: the medians of the first and last five too.
med() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
head_med=$(head -n 5 "$work/times" | med)
tail_med=$(tail -n 5 "$work/times" | med)
archive_mib=$(( $(stat -c %s "$arc") >> 20 ))
# The peer: Info-ZIP zip adding the last tag's files again, under a new folder.
mkdir -p "$work/x" && (cd "$work/x" && unzip -q "$arc" "t$tags/*" && mv "t$tags" peer)
t0=$(date +%s.%N)
(cd "$work/x" && zip -0 -q -r "$arc" peer)
t1=$(date +%s.%N)
peer=$(secs "$t0" "$t1")
echo "append, ${size_mib} MiB model, archive of ${tags} tags (${archive_mib} MiB):"
echo "  ckptd first tag     ${first} s"
echo "  ckptd tag ${tags}       ${last} s   ratio ${tags}th/first: $(ratio "$last" "$first") (goal <= 1.2)"
echo "  zip -0 (rewrite)    ${peer} s   ratio zip/ckptd tag ${tags}: $(ratio "$peer" "$last")"
echo "  medians: appends 1-5 ${head_med} s, last 5 ${tail_med} s, ratio $(ratio "$tail_med" "$head_med")"
rm -rf "$work/x" "$arc"
fi
[ "${ONLY:-sharing}" = sharing ] || exit 0

# 2. Fine-tuning with half the layers frozen: 8 layers, layers 0-3 frozen,
#    10 epochs; each epoch changes the unfrozen layers.
/usr/bin/python3 - "$work" "$size_mib" <<'PY'
import sys, numpy as np, sdfb
work, mib = sys.argv[1], int(sys.argv[2])
n = int((mib * 2**20 / 4 / 8) ** 0.5)
rng = np.random.default_rng(1)
layers = [(rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal(n, dtype=np.float32))
          for _ in range(8)]
for e in range(10):
    for i in range(4, 8):
        w, b = layers[i]
        layers[i] = (w + np.float32(0.01), b + np.float32(0.01))
    sdfb.chain(f"{work}/ft{e}.fb", layers, n)
PY
ft=$work/ft.zip
for e in $(seq 0 9); do
    "$ckptd" pack --format samediff "$work/ft$e.fb" -o "$ft" --tag "epoch$e" -q >/dev/null
done
/usr/bin/python3 - "$ft" <<'PY'
import sys, zipfile
path = sys.argv[1]
with zipfile.ZipFile(path) as z:
    tags = z.read("tags.txt").decode().split()
    size = {i.filename: i.file_size for i in z.infolist()}
    whole = stored = 0
    for t in tags:
        for line in z.read(f"{t}/params.txt").decode().splitlines():
            ref = line.rsplit(" ", 1)[1]
            other, num = ref.split("/") if "/" in ref else (t, ref)
            whole += size[f"{other}/params/{num}.fb"]
    stored = sum(v for k, v in size.items() if "/params/" in k)
import os
total = os.path.getsize(path)
print(f"fine-tuning, half the layers frozen, {len(tags)} epochs:")
print(f"  parameters stored {stored / 2**20:.0f} MiB vs {whole / 2**20:.0f} MiB without sharing "
      f"(saving {100 * (1 - stored / whole):.0f}%), archive {total / 2**20:.0f} MiB")
PY
