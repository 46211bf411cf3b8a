"""Every timed run of the benches starts from the same machine state
(bench/pack.sh, bench/upload_bench.py):
- the disk settled: synced, and the discards ext4 issues for the blocks of
  files the previous run left removed done (a `discard` mount, as on this
  VM: removing a fsynced 1 GiB file discarded 2 M sectors within a second
  after the sync, and whichever run came next ran beside them); the
  device's in-flight and discard counters are polled until they stay still;
- the data read into the page cache again (this VM's kernel evicts idle
  pages within seconds, DAMON's kdamond);
- a page-cached copy of the data written and removed, so that every run
  finds as much memory just freed as the data's size. Without it a run
  inherited what the one before it left: cp after pack (which keeps only
  64 MiB of its archive in the page cache) took 2.4 s, all of it system time
  in the same kernel paths, cp after cp 0.3 s. (Our reading, not checked on
  the host: memory freed a while ago has been handed back to the VM's host,
  and its first touch costs about 8 us a page.)

Usage: same_start.py WORKDIR PATH... (PATH: files, or folders whose files
count); WORKDIR is on the disk the run writes to and holds the scratch copy.
"""
import glob
import os
import subprocess
import sys
import time


def files_of(path):
    return sorted(glob.glob(path + "/*")) if os.path.isdir(path) else [path]


def stat_path(work):
    """The block device stat file of the disk under work, or None."""
    dev = subprocess.run(["findmnt", "-no", "SOURCE", "-T", work], capture_output=True,
                         text=True).stdout.strip()
    p = f"/sys/class/block/{os.path.basename(dev)}/stat" if dev else ""
    return p if p and os.access(p, os.R_OK) else None


def counters(path):
    """in flight, discards completed, sectors discarded"""
    with open(path) as f:
        v = f.read().split()
    return (v[8], v[11], v[13])


def settle(work):
    subprocess.run(["sync"], check=True)
    path = stat_path(work)
    if path is None:
        time.sleep(2)
        return
    time.sleep(0.5)
    prev, same = None, 0
    for _ in range(40):
        cur = counters(path)
        same = same + 1 if cur == prev else 0
        if same >= 3:
            return
        prev = cur
        time.sleep(0.25)


def same_start(work, paths):
    settle(work)
    files = [f for p in paths for f in files_of(p)]
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    scratch = os.path.join(work, "same-start.scratch")
    with open(scratch, "wb") as out:
        subprocess.run(["cat", *files], stdout=out, check=True)
    os.remove(scratch)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: same_start.py WORKDIR PATH...")
    same_start(sys.argv[1], sys.argv[2:])
