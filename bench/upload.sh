#!/usr/bin/env bash
# Issue 5's figures, against the tools a user would use instead, in the same
# run, on a release build, servers on loopback (tests/lib/servers.py):
#  1. a 1 GiB page-cached file to s3rver: ckptd upload vs `aws s3 cp`;
#  2. the same file to nginx (PUT): ckptd upload vs `curl -T`;
#  3. ckptd's peak resident memory (VmHWM) uploading a 4 GiB file to s3rver
#     (multipart) and to nginx.
# Each timing is the best of 2 runs, tools alternating. Usage:
#   bench/upload.sh [BUILD_DIR] [SIZE_MIB] [RSS_SIZE_MIB]
# (extra cmake arguments, e.g. -DCKPTD_WERROR=OFF, in $CKPTD_BENCH_CMAKE_ARGS)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build-bench}
size_mib=${2:-1024}
rss_mib=${3:-4096}
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPTD_SANITIZE=OFF \
    ${CKPTD_BENCH_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"$(nproc)" --target ckptd >/dev/null
work=$(mktemp -d "${TMPDIR:-/tmp}/ckptd-bench-upload.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CKPTD_BENCH_BIN=$build/agent/ckptd CKPTD_BENCH_WORK=$work \
    CKPTD_BENCH_SIZE=$size_mib CKPTD_BENCH_RSS=$rss_mib CKPTD_BENCH_LIB=$here/tests/lib
/usr/bin/python3 - <<'EOF'  # not exec: the EXIT trap must run to remove $work (GBs)
import os, subprocess, sys, time
sys.path.insert(0, os.environ["CKPTD_BENCH_LIB"])
from servers import Nginx, S3Server

ckptd = os.environ["CKPTD_BENCH_BIN"]
work = os.environ["CKPTD_BENCH_WORK"]
size = int(os.environ["CKPTD_BENCH_SIZE"]) << 20
rss_size = int(os.environ["CKPTD_BENCH_RSS"]) << 20
MB = 1e6
runs = [0]


def make(path, n):
    block = os.urandom(8 << 20)  # incompressible, like float weights
    with open(path, "wb") as f:
        for off in range(0, n, len(block)):
            f.write(block[: min(len(block), n - off)])
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)  # page cache


def timed(cmd, env):
    """wall seconds and peak RSS (KiB) of cmd; fails loudly on a non-zero exit"""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    t = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench: {' '.join(cmd[:3])}... failed:\n{err[-2000:]}")
    return t, ru.ru_maxrss


def ckptd_upload(src, dest, env, extra=()):
    runs[0] += 1
    state = os.path.join(work, f"state{runs[0]}")  # a fresh queue: nothing is skipped as sent
    return timed([ckptd, "upload", "-q", "--no-progress", "--state", state, *extra, src,
                  dest + f"/r{runs[0]}"], env)


def best(fns):
    """best of 2 rounds for each tool, alternating; returns [(secs, rss)]"""
    out = [None] * len(fns)
    for _ in range(2):
        for i, fn in enumerate(fns):
            r = fn()
            out[i] = r if out[i] is None or r[0] < out[i][0] else (out[i][0], max(out[i][1], r[1]))
    return out


src = os.path.join(work, "epoch_1.bin")
make(src, size)
mb = size / MB
print(f"file: {size >> 20} MiB, page-cached; best of 2 runs each, alternating")

with S3Server(work) as s3:
    env = dict(os.environ, **s3.env())
    n = [0]

    def aws():
        n[0] += 1
        return timed(["aws", "--endpoint-url", s3.endpoint, "s3", "cp", "--no-progress",
                      "--only-show-errors", src, f"s3://ckpt/aws{n[0]}/epoch_1.bin"], env)

    (c, _), (a, _) = best([lambda: ckptd_upload(src, "s3://ckpt/c", env,
                                                ("--endpoint", s3.endpoint)), aws])
    print(f"s3rver   ckptd upload {c:7.2f} s {mb / c:7.0f} MB/s | aws s3 cp {a:7.2f} s "
          f"{mb / a:7.0f} MB/s | ratio {a / c:.2f}x")

with Nginx(work) as web:
    env = dict(os.environ)
    n = [0]

    def curl():
        n[0] += 1
        return timed(["curl", "-sSf", "-T", src, f"{web.url}/curl{n[0]}/epoch_1.bin"], env)

    (c, _), (u, _) = best([lambda: ckptd_upload(src, web.url + "/c", env), curl])
    print(f"nginx    ckptd upload {c:7.2f} s {mb / c:7.0f} MB/s | curl -T   {u:7.2f} s "
          f"{mb / u:7.0f} MB/s | ratio {u / c:.2f}x")

os.remove(src)
big = os.path.join(work, "big.bin")
make(big, rss_size)
with S3Server(work) as s3:
    t, rss = ckptd_upload(big, "s3://ckpt/big", dict(os.environ, **s3.env()),
                          ("--endpoint", s3.endpoint))
    print(f"RSS      {rss_size >> 20} MiB to s3rver (multipart, 8 parts in flight): "
          f"peak {rss / 1024:.1f} MiB ({rss_size / MB / t:.0f} MB/s)")
with Nginx(work) as web:
    t, rss = ckptd_upload(big, web.url + "/big", dict(os.environ))
    print(f"RSS      {rss_size >> 20} MiB to nginx (one PUT): peak {rss / 1024:.1f} MiB "
          f"({rss_size / MB / t:.0f} MB/s)")
EOF
