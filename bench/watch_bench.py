#!/usr/bin/env python3
"""The measurements behind bench/watch.sh (see there). Prints one line per
figure; reads only /proc and the files ckptd writes.

    watch_bench.py CKPTD latency N SETTLE     close -> metadata.yaml replaced, watch vs 1 s scan loop
    watch_bench.py CKPTD burst N              N checkpoints in one second: all registered, none twice
    watch_bench.py CKPTD idle NFILES SECONDS  CPU and RSS of an idle watcher over NFILES files
"""
import hashlib
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from procstat import cpu_seconds

HERE = os.path.dirname(os.path.abspath(__file__))
SIM = os.path.join(HERE, "..", "tests", "sim_trainer.py")
MIB = 1 << 20


def meta_inode(d):
    try:
        return os.stat(os.path.join(d, "metadata.yaml")).st_ino
    except FileNotFoundError:
        return None


def registered(d):
    try:
        with open(os.path.join(d, "metadata.yaml")) as f:
            text = f.read()
    except FileNotFoundError:
        return set()
    # refs are the keys under checkpoints: (4 spaces) ... '      name:' lines
    return set(re.findall(r"^      ([^ :][^:]*):$", text, re.M))


def wait_ready(log_path, proc):
    while True:
        with open(log_path) as f:
            if "watch.started" in f.read():
                return
        if proc.poll() is not None:
            raise SystemExit(f"watch exited {proc.returncode}")
        time.sleep(0.01)


def write_ckpt(path, data):
    """Writes and closes a checkpoint; returns the monotonic time of the close."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, data)
    os.close(fd)
    return time.monotonic()


class MetaWatch:
    """Blocks on inotify (through libc) until metadata.yaml is renamed into d:
    the measuring side sleeps instead of spinning, so it does not compete with
    ckptd for a CPU and sees the rename the moment the kernel reports it."""
    IN_MOVED_TO = 0x80

    def __init__(self, d):
        import ctypes
        self.libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.fd = self.libc.inotify_init1(0)
        if self.fd < 0 or self.libc.inotify_add_watch(self.fd, d.encode(), self.IN_MOVED_TO) < 0:
            raise SystemExit("inotify is not available")
        self.d = d

    def wait(self, name, timeout=30):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            r, _, _ = select.select([self.fd], [], [], max(0, end - time.monotonic()))
            if not r:
                break
            t = time.monotonic()
            buf = os.read(self.fd, 65536)
            if b"metadata.yaml" in buf and name in registered(self.d):
                return t
        raise SystemExit(f"{name} not registered within {timeout}s")

    def close(self):
        os.close(self.fd)


def wait_registered(d, name, timeout=30):
    """Polls (for the 1 s scan loop, whose latency is in hundreds of ms)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if name in registered(d):
            return time.monotonic()
        time.sleep(0.002)
    raise SystemExit(f"{name} not registered within {timeout}s")


def hash_time(data, rounds=20):
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        hashlib.md5(data).hexdigest()
        hashlib.sha256(data).hexdigest()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def latency(ckptd, n, settle):
    work = tempfile.mkdtemp(prefix="ckptd-bench-")
    try:
        data = os.urandom(MIB)
        # ckptd watch
        d = os.path.join(work, "watch")
        os.makedirs(d)
        log = os.path.join(work, "watch.log")
        with open(log, "w") as lf:
            p = subprocess.Popen([ckptd, "watch", d, "--settle", settle], stderr=lf)
        wait_ready(log, p)
        wait_registered_any = time.monotonic() + 10
        while meta_inode(d) is None and time.monotonic() < wait_registered_any:
            time.sleep(0.01)
        lat = []
        mw = MetaWatch(d)
        for i in range(1, n + 1):
            name = f"epoch_{i}.pt"
            t_close = write_ckpt(os.path.join(d, name), data)
            lat.append(mw.wait(name) - t_close)
            time.sleep(0.02)
        mw.close()
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        # a polling peer: ckptd scan every second (min-age 0, to be generous to it)
        d2 = os.path.join(work, "poll")
        os.makedirs(d2)
        stop = os.path.join(work, "stop")
        loop = subprocess.Popen(["sh", "-c", f"while [ ! -e '{stop}' ]; do '{ckptd}' scan -q "
                                 f"--min-age 0 '{d2}'; sleep 1; done"])
        plat = []
        for i in range(1, min(n, 10) + 1):
            name = f"epoch_{i}.pt"
            t_close = write_ckpt(os.path.join(d2, name), data)
            plat.append(wait_registered(d2, name) - t_close)
            time.sleep(0.137 * i % 1)  # land at different points of the loop's second
        open(stop, "w").close()
        loop.wait(30)
        h = hash_time(data)
        med = statistics.median(lat)
        print(f"latency (1 MiB, close -> metadata.yaml replaced), ckptd watch --settle {settle}, "
              f"n={n}: median {med * 1e3:.2f} ms, p90 {sorted(lat)[int(0.9 * n) - 1] * 1e3:.2f} ms, "
              f"max {max(lat) * 1e3:.2f} ms")
        print(f"hash time (md5+sha256 of 1 MiB, Python hashlib/OpenSSL): {h * 1e3:.2f} ms; "
              f"watch median beyond hash and settle: "
              f"{(med - h - parse_duration(settle)) * 1e3:.2f} ms")
        print(f"latency, 'ckptd scan --min-age 0' every 1 s, n={len(plat)}: median "
              f"{statistics.median(plat) * 1e3:.0f} ms, max {max(plat) * 1e3:.0f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def parse_duration(s):
    if s.endswith("ms"):
        return float(s[:-2]) / 1000
    return float(s.rstrip("s"))


def burst(ckptd, n):
    work = tempfile.mkdtemp(prefix="ckptd-bench-")
    try:
        d = os.path.join(work, "run")
        os.makedirs(d)
        log = os.path.join(work, "watch.log")
        with open(log, "w") as lf:
            p = subprocess.Popen([ckptd, "watch", d], stderr=lf)
        wait_ready(log, p)
        t0 = time.monotonic()
        subprocess.run([sys.executable, SIM, d, "--epochs", str(n), "--mode", "burst",
                        "--size", "4096"], check=True, stdout=subprocess.DEVNULL)
        t_written = time.monotonic() - t0
        names = {f"epoch_{i}.safetensors" for i in range(1, n + 1)}
        end = time.monotonic() + 300
        while not names <= registered(d):
            if time.monotonic() > end:
                raise SystemExit(f"burst: {len(names - registered(d))} never registered")
            time.sleep(0.01)
        t_all = time.monotonic() - t0
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        with open(log) as f:
            regs = re.findall(r"checkpoint\.registered: checkpoint='([^']+)'", f.read())
        twice = len(regs) - len(set(regs))
        print(f"burst: {n} checkpoints written in {t_written:.2f} s; all {len(names & registered(d))} "
              f"registered {t_all:.2f} s after the first; registered twice: {twice}; "
              f"registrations logged: {len(regs)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def proc_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def idle(ckptd, nfiles, seconds):
    work = tempfile.mkdtemp(prefix="ckptd-bench-")
    try:
        d = os.path.join(work, "run")
        # 100 folders of files; one in ten a checkpoint, the rest logs and data
        per = 100
        for i in range(nfiles):
            sub = os.path.join(d, f"part{i // per:03d}")
            os.makedirs(sub, exist_ok=True)
            name = f"epoch_{i}.pt" if i % 10 == 0 else f"events_{i}.log"
            with open(os.path.join(sub, name), "wb") as f:
                f.write(b"x" * 64)
        log = os.path.join(work, "watch.log")
        with open(log, "w") as lf:
            p = subprocess.Popen([ckptd, "watch", d], stderr=lf)
        wait_ready(log, p)
        want = nfiles // 10
        end = time.monotonic() + 300
        while len(registered(d)) < want:
            if time.monotonic() > end:
                raise SystemExit("idle: the tree was never registered")
            time.sleep(0.05)
        # the pass that registered them may still be busy after metadata.yaml (events,
        # hooks' bookkeeping): idle is when the CPU time stops moving for 3 s
        last, still = cpu_seconds(p.pid), 0
        while still < 3:
            time.sleep(1)
            cur = cpu_seconds(p.pid)
            still = still + 1 if cur == last else 0
            last = cur
        c0, rss0 = cpu_seconds(p.pid), proc_rss_kib(p.pid)
        time.sleep(seconds)
        c1, rss1 = cpu_seconds(p.pid), proc_rss_kib(p.pid)
        with open(f"/proc/{p.pid}/status") as f:
            hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
        anon = file_backed = 0
        with open(f"/proc/{p.pid}/smaps_rollup") as f:
            for line in f:
                k, v = line.split(":", 1)[0], line.split()[1:2]
                if k == "Anonymous":
                    anon = int(v[0])
                elif k in ("Shared_Clean", "Private_Clean"):
                    file_backed += int(v[0])
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        print(f"idle over {nfiles} files ({want} registered checkpoints, "
              f"{nfiles // per} folders): CPU {c1 - c0:.3f} s in {seconds} s; "
              f"RSS {rss1 / 1024:.1f} MiB ({rss0 / 1024:.1f} at the start of the idle time), of which anonymous {anon / 1024:.1f} MiB and clean "
              f"file-backed (shared libraries) {file_backed / 1024:.1f} MiB; peak while "
              f"registering {hwm / 1024:.1f} MiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ckptd, what = sys.argv[1], sys.argv[2]
    if what == "latency":
        latency(ckptd, int(sys.argv[3]), sys.argv[4])
    elif what == "burst":
        burst(ckptd, int(sys.argv[3]))
    elif what == "idle":
        idle(ckptd, int(sys.argv[3]), float(sys.argv[4]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
