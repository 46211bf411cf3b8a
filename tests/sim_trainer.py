#!/usr/bin/env python3
"""A simulated training job: writes checkpoints the ways real frameworks do,
for the watch tests, the benchmark and scripts/demo.sh.

    sim_trainer.py OUTDIR --epochs N --mode MODE --interval SECONDS --size BYTES

Modes (one checkpoint per epoch, epochs numbered from --start, default 1):
  direct         epoch_N.safetensors written in place, in two halves
  rename         epoch_N.safetensors.tmp written, fsynced, renamed into place
  tfbundle       model.ckpt-N.data-00000-of-00002, -00001-of-00002, then .index
  folder         checkpoint-N/ (model.safetensors, optimizer.pt), trainer_state.json last
  folder-rename  checkpoint-N.tmp/ written, then renamed to checkpoint-N/ (no marker)
  crash-partial  like rename, but the last epoch's .tmp is left half written and
                 the process dies (exit 3) as a crash would
  burst          every epoch at once, as fast as possible (rename, no fsync), no interval
  mlp            like rename, but the file is a real network's weights: a two-layer
                 MLP (fc1 [H, 16], fc2 [4, H], with biases; H from --size), its
                 weights drifting a little each epoch as training would move them

Files are valid safetensors (8-byte little-endian header length, JSON
header, data); TF bundle parts are random bytes with the right names. A
config.yaml is written first. Exit 0, or 1 at --fail-at EPOCH (before
writing it). --pause S holds each direct-mode file open, half written, for S
seconds. --ignore-term ignores SIGTERM (to test the grace period). Every
finished checkpoint is printed as "wrote PATH" on stdout.
"""
import argparse
import json
import os
import signal
import struct
import sys
import time


def safetensors_bytes(epoch, size):
    n = max(1, size // 4)
    header = {
        "__metadata__": {"epoch": str(epoch), "producer": "sim_trainer"},
        "weight": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]},
    }
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + os.urandom(4 * n)


def mlp_safetensors_bytes(epoch, size):
    """fc1.weight [H, 16], fc1.bias [H], fc2.weight [4, H], fc2.bias [4], float32,
    deterministic per epoch (no numpy: the demo needs only Python)."""
    import math
    import random
    hidden = max(4, min(4096, size // (4 * 21)))
    rng = random.Random(1)
    shapes = {"fc1.weight": [hidden, 16], "fc1.bias": [hidden],
              "fc2.weight": [4, hidden], "fc2.bias": [4]}
    header, blobs, off = {"__metadata__": {"epoch": str(epoch), "producer": "sim_trainer"}}, [], 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        scale = 1 / math.sqrt(shape[-1])
        vals = [rng.gauss(0, scale) * (1 + 0.05 * epoch) for _ in range(n)]
        blobs.append(struct.pack(f"<{n}f", *vals))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + 4 * n]}
        off += 4 * n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def fsync_write(path, data, sync=True):
    with open(path, "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())


def announce(path):
    print(f"wrote {path}", flush=True)


def write_direct(out, epoch, size, pause):
    path = os.path.join(out, f"epoch_{epoch}.safetensors")
    data = safetensors_bytes(epoch, size)
    half = len(data) // 2
    with open(path, "wb") as f:
        f.write(data[:half])
        f.flush()
        if pause:
            time.sleep(pause)
        f.write(data[half:])
    announce(path)


def write_rename(out, epoch, size, partial=False, sync=True, mlp=False):
    path = os.path.join(out, f"epoch_{epoch}.safetensors")
    tmp = path + ".tmp"
    data = mlp_safetensors_bytes(epoch, size) if mlp else safetensors_bytes(epoch, size)
    if partial:
        with open(tmp, "wb") as f:
            f.write(data[: len(data) // 2])
        os._exit(3)  # a crash: no cleanup, no rename
    fsync_write(tmp, data, sync)
    os.rename(tmp, path)
    announce(path)


def write_tfbundle(out, epoch, size, interval):
    prefix = os.path.join(out, f"model.ckpt-{epoch}")
    for shard in range(2):
        fsync_write(f"{prefix}.data-{shard:05d}-of-00002", os.urandom(max(1, size // 2)))
        time.sleep(interval / 4)
    fsync_write(prefix + ".index", os.urandom(256))
    announce(prefix)


def write_folder(out, epoch, size, interval, rename):
    final = os.path.join(out, f"checkpoint-{epoch}")
    d = final + ".tmp" if rename else final
    os.makedirs(d, exist_ok=True)
    fsync_write(os.path.join(d, "model.safetensors"), safetensors_bytes(epoch, size))
    time.sleep(interval / 4)
    fsync_write(os.path.join(d, "optimizer.pt"), os.urandom(max(1, size // 2)))
    time.sleep(interval / 4)
    if rename:
        os.rename(d, final)
    else:
        fsync_write(os.path.join(d, "trainer_state.json"),
                    json.dumps({"global_step": epoch, "epoch": epoch}).encode())
    announce(final)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--start", type=int, default=1)
    ap.add_argument("--mode", default="direct",
                    choices=["direct", "rename", "tfbundle", "folder", "folder-rename",
                             "crash-partial", "burst", "mlp"])
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between epochs")
    ap.add_argument("--size", type=int, default=64 * 1024, help="bytes of tensor data")
    ap.add_argument("--fail-at", type=int, default=None, help="exit 1 when this epoch comes")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="direct: hold each file open, half written, this long")
    ap.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM")
    a = ap.parse_args()
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.makedirs(a.outdir, exist_ok=True)
    cfg = os.path.join(a.outdir, "config.yaml")
    if not os.path.exists(cfg):
        fsync_write(cfg, f"epochs: {a.epochs}\nmode: {a.mode}\nsize: {a.size}\n".encode())
    last = a.start + a.epochs - 1
    for epoch in range(a.start, last + 1):
        if a.fail_at is not None and epoch == a.fail_at:
            print(f"failing at epoch {epoch}", file=sys.stderr, flush=True)
            return 1
        if a.mode == "direct":
            write_direct(a.outdir, epoch, a.size, a.pause)
        elif a.mode in ("rename", "burst", "mlp"):
            write_rename(a.outdir, epoch, a.size, sync=a.mode != "burst", mlp=a.mode == "mlp")
        elif a.mode == "crash-partial":
            write_rename(a.outdir, epoch, a.size, partial=epoch == last)
        elif a.mode == "tfbundle":
            write_tfbundle(a.outdir, epoch, a.size, a.interval)
        else:
            write_folder(a.outdir, epoch, a.size, a.interval, a.mode == "folder-rename")
        if a.mode != "burst" and epoch != last:
            time.sleep(a.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
