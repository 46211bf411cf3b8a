#!/usr/bin/python3
"""Issue 28's bombs: each hostile input made here, then the command it targets
run under /usr/bin/time (wall seconds, max RSS) with a time limit, for the
table in docs/hostile-inputs.md.

Usage: bench/hostile.py BUILD_DIR [BUILD_DIR...]  (each holding agent/ckptd and
agent/mldef; a release build, e.g. RelWithDebInfo). Needs python3-numpy and,
for the SameDiff bomb, flatc (tests/e2e/sdfb.py)."""
import os
import struct
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
LIMIT = int(os.environ.get("LIMIT", "300"))  # seconds: a run past it is "> LIMIT s"


def deflate_bomb(size):
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = z.compress(bytes(16 << 20)) + z.flush(zlib.Z_FULL_FLUSH)
    return block * (size // (16 << 20)) + z.flush()


def zeros_crc(size):
    crc, chunk = 0, bytes(16 << 20)
    for _ in range(size // len(chunk)):
        crc = zlib.crc32(chunk, crc)
    return crc


def local(name, comp, crc, usize, method):
    n = name.encode()
    return struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, len(comp),
                       usize, len(n), 0) + n + comp


def central(name, csize, crc, usize, method, off):
    n = name.encode()
    return struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc,
                       csize, usize, len(n), 0, 0, 0, 0, 0, off) + n


def end(count, cd, cdoff):
    return struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(cd), cdoff, 0)


def shared_stream(path):
    """A signed-looking .mldef of about 1 MB: 90 directory entries over one
    deflated stream of 1 GiB (each would be inflated and hashed)."""
    man = b'{"Format": "mldef", "FormatVersion": 1}'
    comp = deflate_bomb(1 << 30)
    crc = zeros_crc(1 << 30)
    out = bytearray(local("manifest.json", man, zlib.crc32(man), len(man), 0))
    at = len(out)
    out += local("data/w00.float32", comp, crc, 1 << 30, 8)
    names = [f"data/w{i:02d}.float32" for i in range(90)]
    sig = b"mldef-signature 1\n" + b"".join(b"sha256 %s %s\n" % (b"0" * 64, n.encode())
                                            for n in names + ["manifest.json"])
    sig += b"ed25519 " + b"1" * 64 + b" " + b"2" * 128 + b"\n"
    sat = len(out)
    out += local("SIGNATURE", sig, zlib.crc32(sig), len(sig), 0)
    cd = central("manifest.json", len(man), zlib.crc32(man), len(man), 0, 0)
    for n in names:
        cd += central(n, len(comp), crc, 1 << 30, 8, at)
    cd += central("SIGNATURE", len(sig), zlib.crc32(sig), len(sig), 0, sat)
    cdoff = len(out)
    out += cd + end(92, cd, cdoff)
    with open(path, "wb") as f:
        f.write(out)


def inflate_bomb(path):
    """A 10 MB .mldef whose one data member inflates to 10 GiB, its headers
    claiming 1 GiB (within deflate's ratio): refused once it passes 1 GiB."""
    man = b'{"Format": "mldef", "FormatVersion": 1}'
    comp = deflate_bomb(10 << 30)
    crc = zeros_crc(1 << 30)
    out = bytearray(local("manifest.json", man, zlib.crc32(man), len(man), 0))
    at = len(out)
    out += local("data/w.float32", comp, crc, 1 << 30, 8)
    cd = central("manifest.json", len(man), zlib.crc32(man), len(man), 0, 0)
    cd += central("data/w.float32", len(comp), crc, 1 << 30, 8, at)
    cdoff = len(out)
    out += cd + end(2, cd, cdoff)
    with open(path, "wb") as f:
        f.write(out)


def tags_archive(work, ckptd, path):
    """A SameDiff archive of one real tag whose tags.txt lists 100k more."""
    import zipfile
    import numpy as np
    import sdfb
    sdfb.sd()
    fb = os.path.join(work, "one.fb")
    sdfb.mlp(fb, {"W1": np.ones((4, 3), "f4"), "b1": np.zeros(3, "f4"),
                  "W2": np.ones((3, 2), "f4"), "b2": np.zeros(2, "f4")})
    src = os.path.join(work, "one.zip")
    subprocess.run([ckptd, "pack", "--format", "samediff", fb, "-o", src, "-q"], check=True,
                   capture_output=True)
    with zipfile.ZipFile(src) as z:
        items = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    lines = "".join(f"t{i}\n" for i in range(100000)) + "one\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in items:
            z.writestr(n, lines if n == "tags.txt" else d)
    return fb


def layers(work):
    import numpy as np
    from ckpt_formats import safetensors_from_numpy
    w = os.path.join(work, "w.safetensors")
    with open(w, "wb") as f:
        f.write(safetensors_from_numpy({"w": np.ones((4, 4), np.float32),
                                        "b": np.zeros(4, np.float32)}))
    g = os.path.join(work, "layers.yaml")
    with open(g, "w") as f:
        f.write("input: {name: x, shape: [-1, 4]}\nlayers:\n"
                "  - {op: dense, weight: w, bias: b, name: l0}\n")
        f.writelines(f"  - {{op: relu, name: l{i}}}\n" for i in range(1, 100000))
    return w, g


def big_input(work):
    """A layer list whose input is [1, 30000, 30000] (3.6 GB of float32)."""
    import numpy as np
    from ckpt_formats import safetensors_from_numpy
    with open(os.path.join(work, "w1.safetensors"), "wb") as f:
        f.write(safetensors_from_numpy({"s": np.ones(1, np.float32)}))
    with open(os.path.join(work, "big.yaml"), "w") as f:
        f.write("input: {name: x, shape: [1, 30000, 30000]}\nlayers:\n  - {op: relu}\n")


def entries(path, n):
    import zipfile
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("manifest.json", "{}")
        for i in range(n):
            z.writestr(f"d/{i}.csv", "1")


def measure(cmd):
    t = subprocess.run(["/usr/bin/time", "-f", "@@ %e %M", "timeout", str(LIMIT), *cmd],
                       capture_output=True, text=True)
    last = [ln for ln in t.stderr.splitlines() if ln.startswith("@@ ")][-1].split()
    secs, rss = float(last[1]), int(last[2]) / 1024
    rc = t.returncode
    if rc == 124:
        return f"> {LIMIT} s", f"{rss:.0f} MB", "killed"
    msg = [ln for ln in t.stderr.splitlines()
           if not ln.startswith("@@ ") and not ln.startswith("Command exited")]
    return f"{secs:.2f} s", f"{rss:.0f} MB", f"exit {rc}" + (f": {msg[-1][:90]}" if rc else "")


def main():
    builds = sys.argv[1:]
    work = tempfile.mkdtemp(prefix="ckptd-hostile.")
    first = os.path.join(builds[0], "agent", "ckptd")
    shared_stream(os.path.join(work, "shared.mldef"))
    inflate_bomb(os.path.join(work, "bomb.mldef"))
    fb = tags_archive(work, first, os.path.join(work, "tags.zip"))
    w, g = layers(work)
    entries(os.path.join(work, "e70k.mldef"), 70000)
    with open(os.path.join(work, "nest.yaml"), "w") as f:
        f.write("a: " + "[" * 100000 + "]" * 100000 + "\n")
    os.makedirs(os.path.join(work, "tree"), exist_ok=True)
    with open(os.path.join(work, "tree", "metadata.yaml"), "w") as f:
        f.write("a: " + "[" * 100000 + "]" * 100000 + "\n")
    laughs = ["a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
    laughs += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    with open(os.path.join(work, "laughs.yaml"), "w") as f:
        f.write("\n".join(laughs) + "\n")
    os.makedirs(os.path.join(work, "laughs"), exist_ok=True)
    with open(os.path.join(work, "laughs", "metadata.yaml"), "w") as f:
        f.write("\n".join(laughs) + "\n")
    big_input(work)
    cases = [
        ("10 MB deflate bomb (10 GiB, claims 1 GiB)", "ckptd inspect --verify bomb.mldef",
         lambda c, m: [c, "inspect", "--verify", "bomb.mldef"]),
        ("90 entries over one 1 GiB stream, 1 MB", "mldef -i shared.mldef",
         lambda c, m: [m, "-i", "shared.mldef"]),
        ("tags.txt of 100k lines", "ckptd inspect tags.zip",
         lambda c, m: [c, "inspect", "tags.zip"]),
        ("tags.txt of 100k lines", "ckptd pack --format samediff one.fb -o tags.zip --tag x",
         lambda c, m: [c, "pack", "--format", "samediff", fb, "-o", "tags.zip", "--tag", "x",
                       "-q"]),
        ("200 KB nested YAML (100k levels)", "ckptd config -c nest.yaml",
         lambda c, m: [c, "config", "-c", "nest.yaml"]),
        ("200 KB nested YAML as metadata.yaml", "ckptd scan tree",
         lambda c, m: [c, "scan", "tree"]),
        ("layer list of 100k layers", "ckptd pack w.safetensors --graph layers.yaml -o l.mldef",
         lambda c, m: [c, "pack", w, "--graph", g, "-o", "l.mldef", "-q"]),
        ("9 lines of nested YAML aliases (10^9 nodes expanded)", "ckptd config -c laughs.yaml",
         lambda c, m: [c, "config", "-c", "laughs.yaml"]),
        ("the same as metadata.yaml", "ckptd scan laughs",
         lambda c, m: [c, "scan", "laughs"]),
        ("a model declaring a 3.6 GB input", "ckptd verify w1.safetensors --graph big.yaml "
         "--max-memory 256M", lambda c, m: [c, "verify", "w1.safetensors", "--graph", "big.yaml",
                                            "--max-memory", "256M"]),
        ("zip of 70k entries", "mldef -i e70k.mldef", lambda c, m: [m, "-i", "e70k.mldef"]),
        ("zip of 70k entries", "ckptd inspect e70k.mldef",
         lambda c, m: [c, "inspect", "e70k.mldef"]),
    ]
    os.chdir(work)
    print("| input | command | " + " | ".join(f"{os.path.basename(b)}: time, max RSS, result"
                                           for b in builds) + " |")
    print("|---|---|" + "---|" * len(builds))
    for what, shown, cmd in cases:
        cells = []
        for b in builds:
            c, m = os.path.join(b, "agent", "ckptd"), os.path.join(b, "agent", "mldef")
            if os.path.exists("tags.zip.orig"):
                subprocess.run(["cp", "tags.zip.orig", "tags.zip"], check=True)
            else:
                subprocess.run(["cp", "tags.zip", "tags.zip.orig"], check=True)
            cells.append(", ".join(measure(cmd(c, m))))
        print(f"| {what} | `{shown}` | " + " | ".join(cells) + " |", flush=True)
    subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
