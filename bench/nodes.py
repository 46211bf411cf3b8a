#!/usr/bin/env python3
"""Issue 34's figures: what the multi-node commit costs as the node count
grows, against a production S3 server (Ceph's RADOS Gateway on loopback,
started here by tests/lib/rgw.sh, or the one CK_RGW_DIR names).

    nodes.py CKPTD [NODES,... [STEPS [BYTES]]]     (default 2,4,8,16 3 65536)

For each node count N: N node folders (DeepSpeed-like zero_pp_rank_R shards,
two of BYTES per node and step, STEPS steps), one shared store prefix;
`ckptd scan` runs on node 0, 1, ... N-1 in turn (SLURM_NODEID/SLURM_NNODES),
so the last one completes every step's set and commits it. Reported:
  - the store requests of the whole run (RGW's access log, this bucket only:
    its objects' requests and its listings),
    per step and per node and step: the goal is O(N) per step, so the last
    column stays flat as N grows (O(N^2) would double it with N);
  - the requests of the last node's scan alone (it lists the parts, checks
    every manifest and writes the commit: O(N) of its own), per step;
  - the wall time of the last node's scan (its own part's upload, then the
    commit of every step) and the same node's scan when it commits nothing
    (every step already committed): the commit's share is their difference;
  - the time from the last node's part manifest to the step's commit (its
    log's nodes.part_written and nodes.committed of the step), the longest
    over the steps: what a reader of the store waits once the last part is in.
Each run's store tree is checked: every step listed once, with every node's
shards. Numbers are counts (exact) and wall seconds (one run, loopback; the
machine may be shared).
"""
import datetime
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(HERE, "..", "tests", "lib")
sys.path.insert(0, LIB)
from servers import RgwServer  # noqa: E402

LAUNCHER_VARS = ("SLURM_NODEID", "SLURM_NNODES", "PET_NODE_RANK", "PET_NNODES", "GROUP_RANK",
                 "NNODES", "JOB_COMPLETION_INDEX", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS")


def write_old(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    old = time.time() - 120  # settled: older than any min_age
    os.utime(path, (old, old))


def make_nodes(work, n, steps, size):
    dirs = []
    for r in range(n):
        d = os.path.join(work, f"node{r}")
        for s in steps:
            for kind in ("optim_states", "model_states"):
                write_old(os.path.join(d, f"global_step{s}",
                                       f"zero_pp_rank_{r}_mp_rank_00_{kind}.pt"),
                          os.urandom(size))
        write_old(os.path.join(d, "latest"), f"global_step{max(steps)}".encode())
        dirs.append(d)
    return dirs


def scan(ckptd, d, rank, n, env):
    e = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    e.update(env, SLURM_NODEID=str(rank), SLURM_NNODES=str(n))
    t0 = time.monotonic()
    p = subprocess.run([ckptd, "scan", d], env=e, capture_output=True, text=True, timeout=600)
    secs = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"ckptd scan on node {rank} of {n}: exit {p.returncode}\n{p.stderr[-3000:]}")
    return secs, p.stderr


def check_store(rgw, work, prefix, n, steps):
    dest = os.path.join(work, "fetched")
    shutil.rmtree(dest, ignore_errors=True)
    rgw.aws("s3", "cp", "--recursive", "--no-progress", f"s3://{rgw.bucket}/{prefix}/", dest)
    with open(os.path.join(dest, "metadata.yaml")) as f:
        ckpts = yaml.safe_load(f)["model"]["training"]["checkpoints"]
    want = sorted(f"global_step{s}" for s in steps)
    if sorted(ckpts) != want:
        raise SystemExit(f"{n} nodes: the store lists {sorted(ckpts)}, not {want}")
    for s in steps:
        with open(os.path.join(dest, ckpts[f"global_step{s}"]["path"]), "rb") as f:
            sums = f.read().decode()
        ranks = {line.split("zero_pp_rank_")[1].split("_")[0] for line in sums.splitlines()}
        if len(ranks) != n:
            raise SystemExit(f"{n} nodes: step {s}'s .md5sums covers ranks {sorted(ranks)}")
        with open(os.path.join(dest, ckpts[f"global_step{s}"]["path"]), "rb") as f:
            if hashlib.md5(f.read()).hexdigest() != ckpts[f"global_step{s}"]["hash"]:
                raise SystemExit(f"{n} nodes: step {s}'s .md5sums does not match its hash")


def part_to_commit(log):
    """The longest time over the steps from this node's nodes.part_written to
    the step's nodes.committed, from the log's own timestamps."""
    def at(event):
        out = {}
        for m in re.finditer(rf"^(\S+Z) \w+\s+{event}: .*?checkpoint='([^']+)'", log, re.M):
            t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ")
            out[m.group(2)] = t.timestamp()
        return out
    written, committed = at("nodes.part_written"), at("nodes.committed")
    return max(committed[c] - written[c] for c in committed)


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    ckptd = os.path.abspath(sys.argv[1])
    counts = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "2,4,8,16").split(",")]
    nsteps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    size = int(sys.argv[4]) if len(sys.argv) > 4 else 65536
    steps = [100 * (i + 1) for i in range(nsteps)]
    if not shutil.which("radosgw"):
        raise SystemExit("nodes.py needs Ceph's RADOS Gateway (apt-get install radosgw ceph-mon "
                         "ceph-osd ceph-mgr ceph-common uuid-runtime)")
    top = tempfile.mkdtemp(prefix="ckptd-bench-nodes.")
    rgw_dir, started = os.environ.get("CK_RGW_DIR"), False
    if not rgw_dir or not os.path.exists(os.path.join(rgw_dir, "endpoint")):
        rgw_dir, started = os.path.join(top, "rgw"), True
        subprocess.run([os.path.join(LIB, "rgw.sh"), "start", rgw_dir], check=True,
                       stdout=subprocess.DEVNULL)
        os.environ["CK_RGW_DIR"] = rgw_dir
    try:
        print(f"RGW on loopback; {nsteps} steps, 2 shards of {size} bytes per node and step; "
              "ckptd scan on each node in turn, the last one commits")
        print(f"{'nodes':>5} {'requests':>8} {'per step':>8} {'per node-step':>13} "
              f"{'last scan req/step':>18} {'last scan s':>11} {'nothing to commit s':>19} "
              f"{'part to commit s':>16}")
        for n in counts:
            work = os.path.join(top, f"n{n}")
            os.makedirs(work)
            rgw = RgwServer(work)  # a bucket of its own
            env = rgw.env()
            dirs = make_nodes(work, n, steps, size)
            for d in dirs:
                with open(os.path.join(d, "ckptd.yaml"), "w") as f:
                    f.write(f"upload:\n  stores:\n    - url: s3://{rgw.bucket}/run\n"
                            f"      endpoint: {rgw.endpoint}\n")
            for r in range(n - 1):
                scan(ckptd, dirs[r], r, n, env)
            before = len(rgw.requests())
            last, err = scan(ckptd, dirs[n - 1], n - 1, n, env)
            total = len(rgw.requests())
            if err.count("nodes.committed") != nsteps:
                raise SystemExit(f"{n} nodes: the last scan committed "
                                 f"{err.count('nodes.committed')} of {nsteps} steps\n{err[-3000:]}")
            again, _ = scan(ckptd, dirs[n - 1], n - 1, n, env)
            check_store(rgw, work, "run", n, steps)
            print(f"{n:>5} {total:>8} {total / nsteps:>8.1f} {total / nsteps / n:>13.2f} "
                  f"{(total - before) / nsteps:>18.1f} {last:>11.2f} {again:>19.2f} "
                  f"{part_to_commit(err):>16.3f}")
            rgw.stop()
    finally:
        if started:
            subprocess.run([os.path.join(LIB, "rgw.sh"), "stop", rgw_dir])
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
