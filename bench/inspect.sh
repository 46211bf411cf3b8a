#!/usr/bin/env bash
# Issue 4's figures: ckptd inspect --verify on a 1 GiB safetensors file and a
# 1 GiB TensorFlow bundle (64 MiB tensors), page-cached, against reading the
# file (cat FILE > /dev/null) and reading + CRC-32C in the same run
# (python3-crc32c, SSE4.2, 8 MiB chunks), on a release build. Max RSS from
# /usr/bin/time -v. Goal: within 2x of read + CRC-32C, RSS under 32 MiB.
# Issue 14's: the same for a 1 GiB .pt written by torch.save (python3-torch;
# skipped without it), whose zip members are checked with CRC-32: against
# cat and read + zlib.crc32. Goal: within 1.5x of cat, RSS under 32 MiB.
# Usage: bench/inspect.sh [BUILD_DIR] [SIZE_MIB]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build-bench}
size_mib=${2:-1024}
# A benchmark is not the warnings gate (the CI builds are): -O2 adds false
# maybe-uninitialized warnings that must not stop a measurement.
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPTD_SANITIZE=OFF -DCKPTD_WERROR=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target ckptd >/dev/null
ckptd=$build/agent/ckptd
work=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

best() { # best wall time in seconds of 3 runs of "$@"
    local b=999999 t0 t1
    for _ in 1 2 3; do
        t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N)
        b=$(awk -v a="$t0" -v z="$t1" -v b="$b" 'BEGIN { t = z - a; print (t < b ? t : b) }')
    done
    printf '%.4f' "$b"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
mbps() { awk -v mb="$1" -v t="$2" 'BEGIN { printf "%.0f", mb * 1.048576 / t }'; }
maxrss_kib() { /usr/bin/time -v "$@" 2>&1 >/dev/null | awk -F': ' '/Maximum resident/ { print $2 }'; }
cat_file() { cat "$@" > /dev/null; }
crc32_file() { # read + zlib's CRC-32 of each file (the .pt's checksum)
    /usr/bin/python3 -c '
import sys, zlib
for p in sys.argv[1:]:
    c = 0
    with open(p, "rb", buffering=0) as f:
        while True:
            b = f.read(8 << 20)
            if not b:
                break
            c = zlib.crc32(b, c)
' "$@"
}
crc_file() { # read + CRC-32C of each file, the reference for the goal
    /usr/bin/python3 -c '
import sys, crc32c
for p in sys.argv[1:]:
    c = 0
    with open(p, "rb", buffering=0) as f:
        while True:
            b = f.read(8 << 20)
            if not b:
                break
            c = crc32c.crc32c(b, c)
' "$@"
}

# The two checkpoints, written by the test writers (tests/lib/ckpt_formats.py).
PYTHONPATH=$here/tests/lib /usr/bin/python3 - "$work" "$size_mib" <<'PY'
import os, sys
import numpy as np
import json
import struct
from ckpt_formats import crc32c, mask, pb_bytes, pb_fixed32, pb_varint, table_bytes
work, mib = sys.argv[1], int(sys.argv[2])
tensor_mib = 64 if mib >= 64 else mib
n = mib // tensor_mib
rng = np.random.default_rng(0)
chunks = [rng.integers(0, 256, tensor_mib << 20, dtype=np.uint8).tobytes() for _ in range(2)]
# safetensors: header, then the data, streamed
size = tensor_mib << 20
hdr = {f"layer{i:03d}.weight": {"dtype": "F32", "shape": [size // 4],
                                "data_offsets": [i * size, (i + 1) * size]} for i in range(n)}
h = json.dumps(hdr, separators=(",", ":")).encode()
h += b" " * (-(8 + len(h)) % 8)
with open(os.path.join(work, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for i in range(n):
        f.write(chunks[i % 2])
# TF bundle: one data shard, then the index
entries = []
with open(os.path.join(work, "model.data-00000-of-00001"), "wb") as f:
    for i in range(n):
        data = chunks[i % 2]
        e = pb_varint(1, 1) + pb_bytes(2, pb_bytes(2, pb_varint(1, len(data) // 4)))
        e += pb_varint(4, i * len(data)) + pb_varint(5, len(data))
        e += pb_fixed32(6, mask(crc32c(data)))
        entries.append((f"layer{i:03d}/kernel".encode(), e))
        f.write(data)
header = pb_varint(1, 1) + pb_bytes(3, pb_varint(1, 1))
with open(os.path.join(work, "model.index"), "wb") as f:
    f.write(table_bytes([(b"", header)] + sorted(entries)))
# .pt: torch.save of the same tensors, when python3-torch is installed
try:
    import torch
except ImportError:
    sys.exit(0)
sd = {f"layer{i:03d}.weight": torch.frombuffer(bytearray(chunks[i % 2]), dtype=torch.float32)
      for i in range(n)}
torch.save(sd, os.path.join(work, "model.pt"))
PY

st=$work/model.safetensors
tf=$work/model
echo "== ckptd inspect --verify, ${size_mib} MiB, page-cached ($(nproc) cores, $(uname -m))"
kinds="safetensors tf-bundle"
[ -f "$work/model.pt" ] && kinds="$kinds pt"
for kind in $kinds; do
    ref=crc_file; refname=read+crc32c
    if [ "$kind" = safetensors ]; then files=("$st"); target=$st
    elif [ "$kind" = pt ]; then files=("$work/model.pt"); target=$work/model.pt
        ref=crc32_file; refname=read+crc32
    else
        files=("$tf.index" "$tf.data-00000-of-00001"); target=$tf; fi
    cat "${files[@]}" > /dev/null  # page cache
    "$ckptd" inspect --verify "$target" > /dev/null  # checks it reads at all
    cat_t=$(best cat_file "${files[@]}")
    crc_t=$(best $ref "${files[@]}")
    ck_t=$(best "$ckptd" inspect --verify "$target")
    rss=$(maxrss_kib "$ckptd" inspect --verify "$target")
    printf '%-11s cat %7.3f s (%5s MB/s)  %s %7.3f s (%5s MB/s)  ckptd %7.3f s (%5s MB/s)\n' \
        "$kind" "$cat_t" "$(mbps "$size_mib" "$cat_t")" "$refname" "$crc_t" "$(mbps "$size_mib" "$crc_t")" \
        "$ck_t" "$(mbps "$size_mib" "$ck_t")"
    printf '%-11s ckptd / cat: %sx   ckptd / (%s): %sx   max RSS: %s KiB\n' \
        "$kind" "$(ratio "$ck_t" "$cat_t")" "$refname" "$(ratio "$ck_t" "$crc_t")" "$rss"
done
