#!/usr/bin/env python3
"""The body of bench/rpo.sh (see there): the recovery point of one large
checkpoint beside `ckptd watch --settle 0`, per store kind, against the
upload alone in the same run.

    rpo_bench.py CKPTD LIBDIR MIB ROUNDS KIND...    KIND: file webdav s3 s3mp

For each kind and round, alternating:
  upload   `ckptd upload` of the file (the same binary, a fresh queue): its wall time
  peer     cp (file), curl -T (webdav), aws s3 cp (s3, s3mp)
  rpo      a watcher (`ckptd watch DIR --settle 0`, the store in DIR/ckptd.yaml) is
           started and ready; the file is written into DIR and closed; the time from
           the close until the object is whole in the store (its final name there:
           a rename for file, a MOVE for WebDAV, s3rver's metadata file written after
           the bytes), and until the store's metadata.yaml names it.
The ratio is rpo / upload, of the medians (the goal of issue 36: at most 1.05).
"""
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ckptd, lib, mib, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
kinds = sys.argv[5:] or ["file", "webdav", "s3", "s3mp"]
sys.path.insert(0, lib)
from servers import Nginx, S3Server  # noqa: E402

SIZE = mib << 20
NAME = "epoch_1.bin"
KEY = "data/checkpoints/" + NAME  # where a registered single-file checkpoint goes


def make(path, n):
    block = os.urandom(8 << 20)  # incompressible, like float weights
    with open(path, "wb") as f:
        for off in range(0, n, len(block)):
            f.write(block[: min(len(block), n - off)])


def timed(cmd, env):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"rpo bench: {' '.join(cmd[:4])}... exited {p.returncode}:\n"
                 f"{p.stderr.decode(errors='replace')[-2000:]}")
    return t


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return time.monotonic()
        time.sleep(0.002)
    raise SystemExit(f"rpo bench: {what} not there within {timeout} s")


class Kind:
    """One store kind: where its objects land on this machine's disk, and
    the config and commands that reach it."""

    def __init__(self, kind, work):
        self.kind, self.work, self.server = kind, work, None
        self.env = dict(os.environ)
        self.extra = []  # ckptd upload options
        self.yaml = ""   # the store's row in ckptd.yaml's upload.stores (after "- url: ...")
        self.upyaml = ""  # upload keys
        if kind == "file":
            self.root = os.path.join(work, "store")
            os.makedirs(self.root)
            self.url = "file://" + self.root
        elif kind == "webdav":
            self.server = Nginx(work)
            self.root, self.url = self.server.root, self.server.url
        else:
            self.server = S3Server(work)
            self.env.update(self.server.env())
            self.root = os.path.join(self.server.dir, "ckpt")
            self.url = "s3://ckpt"
            self.extra = ["--endpoint", self.server.endpoint]
            self.yaml = f"      endpoint: {self.server.endpoint}\n"
            if kind == "s3":  # one PUT: above the default threshold of 64 MiB
                self.extra += ["--multipart-threshold", "8GiB"]
                self.upyaml = "  multipart_threshold: 8GiB\n"

    def stored(self, prefix, key):
        """The path of prefix/key as the store keeps it once whole, on this disk."""
        if self.kind in ("s3", "s3mp"):
            d, b = os.path.split(key)
            return os.path.join(self.root, prefix, d, b + "._S3rver_metadata.json")
        return os.path.join(self.root, prefix, key)

    def peer(self, src, tag):
        dest = os.path.join(self.root, tag)
        if self.kind == "file":
            os.makedirs(dest)
            return "cp", timed(["cp", src, dest + "/x.bin"], self.env)
        if self.kind == "webdav":
            return "curl -T", timed(["curl", "-sSf", "-T", src, f"{self.url}/{tag}/x.bin"],
                                    self.env)
        if self.kind == "s3":
            # aws-cli has no "one PUT whatever the size" flag; its s3api put-object is one
            return "aws s3api put-object", timed(
                ["aws", "--endpoint-url", self.server.endpoint, "s3api", "put-object",
                 "--bucket", "ckpt", "--key", f"{tag}/x.bin", "--body", src], self.env)
        return "aws s3 cp", timed(["aws", "--endpoint-url", self.server.endpoint, "s3", "cp",
                                   "--no-progress", "--only-show-errors", src,
                                   f"s3://ckpt/{tag}/x.bin"], self.env)

    def upload(self, src, tag):
        state = os.path.join(self.work, "state-" + tag)
        t = timed([ckptd, "upload", "-q", "--no-progress", "--state", state, *self.extra, src,
                   f"{self.url}/{tag}/"], self.env)
        shutil.rmtree(state, ignore_errors=True)
        return t

    def rpo(self, src, tag):
        """close -> object whole in the store, close -> the store's metadata.yaml names it."""
        d = os.path.join(self.work, "train-" + tag)
        os.makedirs(d)
        with open(os.path.join(d, "ckptd.yaml"), "w") as f:
            f.write(f"upload:\n{self.upyaml}  stores:\n    - url: {self.url}/{tag}\n{self.yaml}")
        log = os.path.join(self.work, f"watch-{tag}.log")
        with open(log, "w") as lf:
            p = subprocess.Popen([ckptd, "watch", d, "--settle", "0"], stderr=lf,
                                 stdout=lf, env=self.env)
        try:
            wait_for(lambda: "watch.started" in open(log).read() or p.poll() is not None, 30,
                     "watch.started")
            if p.poll() is not None:
                sys.exit(f"rpo bench: watch exited {p.returncode}:\n{open(log).read()}")
            # the first pass writes metadata.yaml and sends it: wait until that is done
            meta = self.stored(tag, "metadata.yaml")
            wait_for(lambda: os.path.exists(meta), 60, "the first metadata.yaml")
            time.sleep(0.3)
            m0 = os.stat(meta).st_mtime_ns
            obj = self.stored(tag, KEY)
            with open(src, "rb") as fi, open(os.path.join(d, NAME), "wb") as fo:
                shutil.copyfileobj(fi, fo, 8 << 20)
                fo.flush()
            t_close = time.monotonic()
            t_obj = wait_for(lambda: os.path.exists(obj), 600, obj) - t_close

            def meta_names():
                try:
                    if os.stat(meta).st_mtime_ns == m0:
                        return False
                    if self.kind in ("s3", "s3mp"):
                        return True  # the metadata file of s3rver's object, rewritten
                    with open(meta) as f:
                        return NAME in f.read()
                except OSError:
                    return False
            t_meta = wait_for(meta_names, 600, "metadata.yaml naming " + NAME) - t_close
        finally:
            p.terminate()
            p.wait(60)
        if os.path.getsize(obj if self.kind not in ("s3", "s3mp") else
                           obj.replace("._S3rver_metadata.json", "._S3rver_object")) != SIZE:
            sys.exit(f"rpo bench: the stored {KEY} does not have {SIZE} bytes\n{open(log).read()}")
        shutil.rmtree(d, ignore_errors=True)
        return t_obj, t_meta

    def clean(self, tag):
        shutil.rmtree(os.path.join(self.root, tag), ignore_errors=True)

    def close(self):
        if self.server:
            self.server.stop()


def med(v):
    return statistics.median(v)


def main():
    # a SIGTERM runs the finally clauses too: the servers stop, the GBs go
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    work = tempfile.mkdtemp(prefix="ckptd-bench-rpo-", dir=os.environ.get("CKPTD_BENCH_TMP"))
    try:
        src = os.path.join(work, "src.bin")
        make(src, SIZE)
        print(f"ckptd {ckptd}; {os.cpu_count()} CPUs; one file of {mib} MiB, page-cached; "
              f"{rounds} rounds per kind, runs alternating; work in {work}")
        for kind in kinds:
            k = Kind(kind, os.path.join(work, kind))
            try:
                up, peer, obj, meta, pname = [], [], [], [], ""
                for r in range(rounds):
                    up.append(k.upload(src, f"u{r}"))
                    k.clean(f"u{r}")
                    pname, t = k.peer(src, f"p{r}")
                    peer.append(t)
                    k.clean(f"p{r}")
                    o, m = k.rpo(src, f"w{r}")
                    obj.append(o)
                    meta.append(m)
                    k.clean(f"w{r}")
                u = med(up)
                print(f"{kind:7} upload alone (ckptd upload) median {u:6.2f} s "
                      f"[{', '.join(f'{x:.2f}' for x in up)}]; {pname} {med(peer):6.2f} s")
                print(f"{kind:7} close -> object whole in the store    median {med(obj):6.2f} s "
                      f"[{', '.join(f'{x:.2f}' for x in obj)}]  ratio to the upload alone "
                      f"{med(obj) / u:.2f}x")
                print(f"{kind:7} close -> store's metadata.yaml names it median {med(meta):6.2f} s "
                      f"[{', '.join(f'{x:.2f}' for x in meta)}]  ratio {med(meta) / u:.2f}x")
                sys.stdout.flush()
            finally:
                k.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


main()
