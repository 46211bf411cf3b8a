#!/usr/bin/env python3
"""Issue 36's large-run figures: a run of many folder checkpoints, measured
against the floors a user's own tools set, in the same run.

    scale.py CKPTD [NCKPTS [FILES_PER_CKPT [BYTES_PER_FILE]]]

Builds NCKPTS folder checkpoints (DCP-like `step_N/` with a `.metadata`
marker) of FILES_PER_CKPT files each, then reports:
  1. the floors: a stat walk of the whole tree (`find -printf '%s %T@ %p'`,
     one stat per file, what noticing a change cannot do without) and an
     md5sum of every checkpoint file (what a first registration cannot do
     without);
  2. `ckptd scan` registering every checkpoint (first run), against md5sum;
  3. `ckptd scan` with nothing new, against the stat walk (of the tree as it
     is then, our links in data/ included: find walks them too);
  4. a watcher over the registered tree: the cost of one new checkpoint at
     10, 1,000 and NCKPTS registered (close -> metadata.yaml replaced, and
     the bytes the watcher wrote for it, from /proc/PID/io), and its idle RSS.
Times are wall seconds and CPU seconds (user + system of the processes),
best of 3; the machine may be shared, so the ratios are the figures.
"""
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from procstat import cpu_seconds  # noqa: E402


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd, shell=False, env=None):
    """(wall, cpu) of one run of cmd; fails loudly if it fails."""
    c0, t0 = children_cpu(), time.monotonic()
    subprocess.run(cmd, shell=shell, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.monotonic() - t0, children_cpu() - c0


def best(cmd, n=3, shell=False, before=None):
    res = []
    for _ in range(n):
        if before:
            before()
        res.append(timed(cmd, shell=shell))
    return min(r[0] for r in res), min(r[1] for r in res)


def make_tree(d, nckpts, nfiles, size, first=1):
    old = time.time() - 120  # settled: older than any min_age
    for i in range(first, first + nckpts):
        make_ckpt(d, i, nfiles, size, old)


def make_ckpt(d, i, nfiles, size, mtime=None):
    sub = os.path.join(d, f"step_{i}")
    os.makedirs(sub, exist_ok=True)
    for j in range(nfiles - 1):
        p = os.path.join(sub, f"shard_{j:02d}.distcp")
        with open(p, "wb") as f:
            f.write(os.urandom(size))
        if mtime:
            os.utime(p, (mtime, mtime))
    p = os.path.join(sub, ".metadata")  # the marker, written last
    with open(p, "wb") as f:
        f.write(b"m")
    if mtime:
        os.utime(p, (mtime, mtime))


def line(what, wall, cpu, floor=None, floor_cpu=None, note=""):
    r = ""
    if floor:
        r = f"  {wall / floor:5.2f}x wall, {cpu / floor_cpu:5.2f}x CPU {note}"
    print(f"{what:<38} {wall:8.3f} s wall {cpu:8.3f} s CPU{r}", flush=True)


def io_written(pid):
    with open(f"/proc/{pid}/io") as f:
        kv = dict(ln.split(": ") for ln in f.read().split("\n") if ln)
    return int(kv["wchar"])


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    return 0


def meta_ino(d):
    try:
        return os.stat(os.path.join(d, "metadata.yaml")).st_ino
    except FileNotFoundError:
        return None


def watcher_cost(ckptd, d, nfiles, size, at, samples=5):
    """Adds `samples` checkpoints one by one to a watched run of `at`
    registered ones: median close -> metadata.yaml replaced, and the bytes
    the watcher wrote per checkpoint."""
    log = open(os.path.join(os.path.dirname(d), f"watch-{at}.log"), "w")
    p = subprocess.Popen([ckptd, "watch", "--settle", "0", d], stderr=log)
    try:
        end = time.monotonic() + 600
        while "watch.started" not in open(log.name).read():
            if p.poll() is not None or time.monotonic() > end:
                raise SystemExit(f"watch did not start (exit {p.returncode}); see {log.name}")
            time.sleep(0.05)
        time.sleep(1.0)  # its first reconcile pass done
        lat, wrote, cpu = [], [], []
        for k in range(samples):
            i = at + 1 + k
            ino = meta_ino(d)
            w0, c0 = io_written(p.pid), cpu_seconds(p.pid)
            make_ckpt(d, i, nfiles, size)
            t0 = time.monotonic()
            while meta_ino(d) == ino:
                if time.monotonic() - t0 > 120:
                    raise SystemExit(f"checkpoint {i} not registered in 120 s; see {log.name}")
                time.sleep(0.002)
            lat.append(time.monotonic() - t0)
            time.sleep(0.3)  # its state written
            wrote.append(io_written(p.pid) - w0)
            cpu.append(cpu_seconds(p.pid) - c0)
        time.sleep(2)
        rss = rss_kib(p.pid)
        return sorted(lat)[len(lat) // 2], sorted(wrote)[len(wrote) // 2], \
            sorted(cpu)[len(cpu) // 2], rss
    finally:
        p.terminate()
        p.wait()
        log.close()


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    ckptd = os.path.abspath(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 10000
    nfiles = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    size = int(sys.argv[4]) if len(sys.argv) > 4 else 4096
    work = tempfile.mkdtemp(prefix="ckptd-scale-", dir=os.environ.get("TMPDIR", "/tmp"))
    try:
        d = os.path.join(work, "run")
        os.makedirs(d)
        t0 = time.monotonic()
        make_tree(d, n, nfiles, size)
        print(f"ckptd {subprocess.check_output([ckptd, '--version'], text=True).strip()}; "
              f"{os.cpu_count()} CPUs; {n} checkpoints x {nfiles} files of {size} bytes "
              f"({n * nfiles} files, made in {time.monotonic() - t0:.0f} s)", flush=True)
        subprocess.run(["sync"], check=True)
        md5 = best(f"find '{d}' -type f -print0 | xargs -0 md5sum", shell=True)
        line("md5sum of every file (floor)", *md5)

        # once, on the tree as the trainer left it: a tree registered and then
        # deleted again leaves ext4 searching past recently freed inodes
        first = timed([ckptd, "scan", "-q", d])
        line("ckptd scan, first registration", *first, md5[0], md5[1], "of md5sum (goal 1.5x)")
        with open(os.path.join(d, "metadata.yaml")) as f:
            got = sum(1 for ln in f if ln.startswith("        epoch: "))
        if got != n:
            raise SystemExit(f"the first scan registered {got} of {n}")
        walk = best(f"find '{d}' -printf '%s %T@ %p\\n' >/dev/null", shell=True)
        line("stat walk of the tree (floor)", *walk)
        noop = best([ckptd, "scan", "-q", d])
        line("ckptd scan, nothing new", *noop, walk[0], walk[1], "of the stat walk (goal 2x)")
        for at in sorted({10, 1000, n}):
            if at > n:
                continue
            sub = os.path.join(work, f"w{at}")
            if at == n:
                sub = d
            else:
                make_tree(sub, at, nfiles, size)
                subprocess.run([ckptd, "scan", "-q", sub], check=True)
            lat, wrote, cpu, rss = watcher_cost(ckptd, sub, nfiles, size, at)
            print(f"watch, 1 new checkpoint at {at:>6} registered: {lat * 1000:7.1f} ms "
                  f"close->metadata, {cpu * 1000:6.1f} ms CPU, {wrote / 1024:8.1f} KiB written; "
                  f"idle RSS {rss / 1024:.1f} MiB", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
