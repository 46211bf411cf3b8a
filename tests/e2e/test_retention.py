"""Retention (issue 32): `ckptd scan` and `ckptd watch` delete local
checkpoints the retention keys let go, only once every store holds a copy
(and the archives) checked now; retention.store prunes the stores. Real stores
(a file store, S3 on s3rver, WebDAV on nginx); after every case both trees
are checked with the PMF validator written from the spec
(tests/lib/pmf_validate.py, strict: MD5s), the store's copy as an
independent client fetches it (aws s3 cp, plain HTTP GET, the folder)."""
import datetime
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, md5_file, run, write_old  # noqa: E402
from servers import Nginx, RgwServer, S3Server, Sshd, need  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import pmf_validate  # noqa: E402


# The trainer of the watch tests: five checkpoints a little apart. It holds
# epoch_1.pt open for writing (no byte written) once the watcher registered it,
# until epoch_2 and epoch_3 are gone; then closes it and waits for it to go
# too; then for the test's go-ahead (it reads /metrics meanwhile).
WATCH_TRAINER = """
import os, sys, time
d, go, out, src = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
ck = os.path.join(d, "ckpts")
os.makedirs(ck, exist_ok=True)
def wait(cond, what, t=120):
    end = time.monotonic() + t
    while not cond():
        if time.monotonic() > end:
            sys.exit("trainer: timed out waiting for " + what)
        time.sleep(0.05)
def registered(ref):
    try:
        with open(os.path.join(d, "metadata.yaml")) as f:
            return ref in f.read()
    except OSError:
        return False
held = None
for e in range(1, 6):
    path = os.path.join(ck, "epoch_%d.pt" % e)
    with open(path + ".tmp", "wb") as f:
        f.write(open(os.path.join(src, "epoch_%d.pt" % e), "rb").read())
    os.rename(path + ".tmp", path)
    wait(lambda: registered("epoch_%d.pt" % e), "epoch_%d registered" % e)
    if e == 1:
        held = open(path, "ab")  # the writer check: never deleted while open
    time.sleep(0.3)
gone = lambda *n: all(not os.path.exists(os.path.join(ck, "epoch_%d.pt" % i)) for i in n)
wait(lambda: gone(2, 3), "epoch_2 and epoch_3 deleted")
time.sleep(2.5)  # retention.interval 1s: rounds ran meanwhile, epoch_1 held
with open(out, "w") as f:
    f.write("held_kept=%d\\n" % os.path.exists(os.path.join(ck, "epoch_1.pt")))
held.close()
wait(lambda: gone(1), "epoch_1 deleted once closed")
wait(lambda: os.path.exists(go), "the test's go-ahead")
"""

KILL_ROUNDS = int(os.environ.get("CK_RETENTION_KILL_ROUNDS", "30"))


class Retention(TmpDirCase):
    def s3_server(self):
        """The S3 server of the S3 cases: s3rver here, Ceph RGW in RetentionRgw."""
        return S3Server(self.dir)

    def setUp(self):
        super().setUp()
        self.train = os.path.join(self.dir, "train")
        self.sums = {}

    def write_ckpts(self, n=5, size=60000):
        for e in range(1, n + 1):
            data = os.urandom(size + e)
            write_old(os.path.join(self.train, "ckpts", f"epoch_{e}.pt"), data)
            self.sums[f"epoch_{e}.pt"] = hashlib.md5(data).hexdigest()

    def config(self, stores, retention):
        lines = ["upload:", "  stores:"]
        for s in stores:
            lines.append(f"    - url: {s['url']}")
            for k, v in s.items():
                if k != "url":
                    lines.append(f"      {k}: {v}")
        if not stores:
            lines = []
        lines.append("retention:")
        for k, v in retention.items():
            if isinstance(v, dict):
                lines.append(f"  {k}:")
                lines += [f"    {kk}: {vv}" for kk, vv in v.items()]
            else:
                lines.append(f"  {k}: {v}")
        os.makedirs(self.train, exist_ok=True)
        with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def scan(self, env=None, rc=0):
        p = run("scan", self.train, env=env, timeout=180)
        if rc is not None:
            self.assertEqual(p.returncode, rc, p.stderr)
        return p

    def local_tree(self):
        """The local tree: valid, and what it lists is what is on the disk."""
        meta = pmf_validate.validate_tree(self.train)
        return set(meta["model"]["training"]["checkpoints"])

    def remote_tree(self, root):
        """A downloaded copy of the store: valid with every checkpoint, MD5s included."""
        meta = pmf_validate.validate_tree(root)
        refs = meta["model"]["training"]["checkpoints"]
        for ref, want in self.sums.items():
            self.assertIn(ref, refs)
            self.assertEqual(md5_file(os.path.join(root, "data", "checkpoints", ref)), want)
        return set(refs)

    def on_disk(self):
        src = set(os.listdir(os.path.join(self.train, "ckpts")))
        tree = set(os.listdir(os.path.join(self.train, "data", "checkpoints")))
        return src, tree

    def check_keep_last(self, fetch_store, stores, env=None):
        self.write_ckpts()
        self.config(stores, {"keep_last": 2})
        p = self.scan(env=env)
        self.assertEqual(p.stderr.count("checkpoint.deleted:"), 3, p.stderr)
        src, tree = self.on_disk()
        self.assertEqual(src, {"epoch_4.pt", "epoch_5.pt"})
        self.assertEqual(tree, {"epoch_4.pt", "epoch_5.pt"})
        self.assertEqual(self.local_tree(), {"epoch_4.pt", "epoch_5.pt"})
        # the next pass sends the stores' metadata.yaml, which keeps all five
        self.scan(env=env)
        got = fetch_store()
        self.assertEqual(self.remote_tree(got), set(self.sums))
        # status says where each one is; fetch brings one back, MD5-checked
        st = json.loads(run("status", "--json", self.train, check=0).stdout)
        where = {w["checkpoint"]: w for w in st["where"]}
        self.assertEqual({k: w["location"] for k, w in where.items()},
                         {"epoch_1.pt": "stores", "epoch_2.pt": "stores", "epoch_3.pt": "stores",
                          "epoch_4.pt": "local", "epoch_5.pt": "local"})
        self.assertEqual(len(where["epoch_2.pt"]["stores"]), 1)
        text = run("status", self.train, check=0).stdout
        self.assertRegex(text, r"epoch_2\.pt +stores only: ")
        dest = os.path.join(self.dir, "fetched")
        os.makedirs(dest, exist_ok=True)
        run("fetch", self.train, "epoch_2.pt", "-o", dest, env=env, check=0)
        self.assertEqual(os.listdir(dest), ["epoch_2.pt"])
        self.assertEqual(md5_file(os.path.join(dest, "epoch_2.pt")), self.sums["epoch_2.pt"])
        # nothing more to do, nothing re-registered
        p = self.scan(env=env)
        self.assertNotIn("checkpoint.registered", p.stderr)
        self.assertEqual(self.local_tree(), {"epoch_4.pt", "epoch_5.pt"})
        # a new checkpoint: registered, sent, the oldest local one goes; the
        # stores' metadata.yaml follows the local one and keeps the deleted
        data = os.urandom(70000)
        write_old(os.path.join(self.train, "ckpts", "epoch_6.pt"), data)
        self.sums["epoch_6.pt"] = hashlib.md5(data).hexdigest()
        p = self.scan(env=env)
        self.assertIn("checkpoint.deleted: checkpoint='epoch_4.pt'", p.stderr)
        self.assertEqual(self.local_tree(), {"epoch_5.pt", "epoch_6.pt"})
        # what this pass sent before its deletions: all six, epoch_6 included
        self.assertEqual(self.remote_tree(fetch_store()), set(self.sums))
        self.scan(env=env)
        self.assertEqual(self.remote_tree(fetch_store()), set(self.sums))
        return p

    def test_keep_last_file_store(self):
        store = os.path.join(self.dir, "store")
        self.check_keep_last(lambda: store, [{"url": "file://" + store}])

    def test_keep_last_s3(self):
        need("aws", "checking S3 needs awscli")
        with self.s3_server() as s3:
            got = os.path.join(self.dir, "got")

            def fetch():
                shutil.rmtree(got, ignore_errors=True)
                s3.aws("s3", "cp", "--recursive", "--no-progress", f"s3://{s3.bucket}/r1", got)
                return got

            self.check_keep_last(fetch, [{"url": f"s3://{s3.bucket}/r1", "endpoint": s3.endpoint,
                                          "credentials": "env"}], env=s3.env())

    def test_keep_last_webdav(self):
        with Nginx(self.dir) as web:
            self.check_keep_last(lambda: os.path.join(web.root, "m"),
                                 [{"url": web.url + "/m"}])
            # and over HTTP as a reader sees it
            with urllib.request.urlopen(web.url + "/m/data/checkpoints/epoch_1.pt") as r:
                self.assertEqual(hashlib.md5(r.read()).hexdigest(), self.sums["epoch_1.pt"])

    def test_keep_last_sftp(self):
        need("sftp", "SFTP tests need the OpenSSH client")
        with Sshd(self.dir) as ssh:
            remote = os.path.join(self.dir, "remote")
            self.check_keep_last(lambda: remote, [{"url": ssh.url(remote), "key": ssh.key,
                                                   "host_key": ssh.host_key_sha256}])

    def test_store_refuses(self):
        """A store that refuses (or is down): nothing deleted, a warning says why."""
        with Nginx(self.dir) as web:
            self.write_ckpts()
            self.config([{"url": web.url + "/m"}], {"keep_last": 1})
            # first the uploads, without retention's deletions: no key yet
            with open(os.path.join(self.train, "ckptd.yaml")) as f:
                text = f.read()
            with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
                f.write(text.split("retention:")[0])
            self.scan()
            with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
                f.write(text)
            web.stop()  # the store is gone now
            p = self.scan(rc=None)
            self.assertNotIn("checkpoint.deleted", p.stderr)
            self.assertIn("retention.store_failing", p.stderr)
            self.assertIn("retention.held_all", p.stderr)
            src, tree = self.on_disk()
            self.assertEqual(len(src), 5)
            self.assertEqual(len(tree), 5)
            self.assertEqual(self.local_tree(), set(self.sums))

    def test_store_forbids(self):
        """A store answering 403 to the check: held, nothing deleted."""
        with Nginx(self.dir, users={"u": "right"}) as web:
            secret = os.path.join(self.dir, "cred")
            with open(secret, "w") as f:
                f.write("u:right")
            os.chmod(secret, 0o600)
            self.write_ckpts()
            self.config([{"url": web.url + "/m", "credentials": "file:" + secret}],
                        {"keep_last": 1})
            with open(os.path.join(self.train, "ckptd.yaml")) as f:
                text = f.read()
            with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
                f.write(text.split("retention:")[0])
            self.scan()
            with open(secret, "w") as f:
                f.write("u:wrong")
            with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
                f.write(text)
            p = self.scan(rc=None)
            self.assertNotIn("checkpoint.deleted", p.stderr)
            self.assertIn("retention.store_failing", p.stderr)
            self.assertEqual(len(self.on_disk()[0]), 5)
            self.assertEqual(self.local_tree(), set(self.sums))

    def test_lost_object_is_sent_again(self):
        """A store that lost an object after its upload: the check finds it,
        the checkpoint stays and is sent again; the pass after deletes it."""
        need("aws", "checking S3 needs awscli")
        with self.s3_server() as s3:
            self.write_ckpts(3)
            stores = [{"url": f"s3://{s3.bucket}/r1", "endpoint": s3.endpoint, "credentials": "env"}]
            self.config(stores, {})
            with open(os.path.join(self.train, "ckptd.yaml")) as f:
                noret = f.read().split("retention:")[0]
            with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
                f.write(noret)
            self.scan(env=s3.env())
            s3.aws("s3", "rm", f"s3://{s3.bucket}/r1/data/checkpoints/epoch_1.pt")
            # a damaged one too: same size, other bytes (no MD5 check would see it by size)
            damaged = os.path.join(self.dir, "damaged")
            with open(damaged, "wb") as f:
                f.write(os.urandom(60002))
            s3.aws("s3", "cp", "--no-progress", damaged, f"s3://{s3.bucket}/r1/data/checkpoints/epoch_2.pt")
            self.config(stores, {"keep_last": 1})
            p = self.scan(env=s3.env())
            self.assertNotIn("checkpoint.deleted", p.stderr)
            self.assertEqual(p.stderr.count("retention.copy_missing"), 2, p.stderr)
            self.assertIn("queued to be sent again", p.stderr)
            self.assertEqual(len(self.on_disk()[0]), 3)
            # the next pass sends them again, checks them and deletes
            p = self.scan(env=s3.env())
            self.assertEqual(p.stderr.count("checkpoint.deleted:"), 2, p.stderr)
            self.scan(env=s3.env())
            got = os.path.join(self.dir, "got")
            s3.aws("s3", "cp", "--recursive", "--no-progress", f"s3://{s3.bucket}/r1", got)
            self.assertEqual(self.remote_tree(got), set(self.sums))
            self.assertEqual(self.local_tree(), {"epoch_3.pt"})

    def test_deleted_event(self):
        """checkpoint.deleted reaches the hooks, saying where the copies are."""
        store = os.path.join(self.dir, "store")
        out = os.path.join(self.dir, "events")
        self.write_ckpts(3)
        self.config([{"url": "file://" + store}], {"keep_last": 1})
        with open(os.path.join(self.train, "ckptd.yaml"), "a") as f:
            f.write("hooks:\n  exec:\n    - event: checkpoint.deleted\n"
                    f"      command: 'echo \"$CKPTD_CHECKPOINT|$CKPTD_EPOCH|$CKPTD_STORE\" >> {out}'\n")
        self.scan()
        with open(out) as f:
            got = sorted(f.read().splitlines())
        self.assertEqual(got, [f"epoch_{e}.pt|{e}|file://{store}" for e in (1, 2)])

    def test_fetch_refuses_a_damaged_copy(self):
        store = os.path.join(self.dir, "store")
        self.write_ckpts(3)
        self.config([{"url": "file://" + store}], {"keep_last": 1})
        self.scan()
        obj = os.path.join(store, "data", "checkpoints", "epoch_1.pt")
        size = os.path.getsize(obj)
        with open(obj, "wb") as f:
            f.write(os.urandom(size))
        dest = os.path.join(self.dir, "fetched")
        os.makedirs(dest)
        p = run("fetch", self.train, "epoch_1.pt", "-o", dest)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(self.sums["epoch_1.pt"], p.stderr)  # what metadata.yaml recorded
        self.assertEqual(os.listdir(dest), [])
        # the undamaged one comes back
        run("fetch", self.train, "epoch_2.pt", "-o", dest, check=0)
        self.assertEqual(md5_file(os.path.join(dest, "epoch_2.pt")), self.sums["epoch_2.pt"])
        p = run("fetch", self.train, "epoch_3.pt", "-o", dest)
        self.assertEqual(p.returncode, 1)
        self.assertIn("data/checkpoints", p.stderr)

    def test_without_store(self):
        self.write_ckpts(3)
        self.config([], {"keep_last": 1})
        p = run("scan", self.train)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("without_store", p.stderr)
        self.assertEqual(len(os.listdir(os.path.join(self.train, "ckpts"))), 3)
        self.config([], {"keep_last": 1, "without_store": "true"})
        p = self.scan()
        self.assertEqual(p.stderr.count("checkpoint.deleted:"), 2, p.stderr)
        self.assertIn('copies="none"', p.stderr)
        self.assertEqual(self.local_tree(), {"epoch_3.pt"})

    def test_archives_checked(self):
        """pack.formats on: a checkpoint goes only when its archives (its
        .mldef, the run's SameDiff archive) are in the store too, checked.
        One removed from the store holds its checkpoint and is sent again."""
        import numpy as np
        import yaml
        from ckpt_formats import safetensors_from_numpy
        store = os.path.join(self.dir, "store")
        for e in (1, 2, 3):
            rng = np.random.default_rng(e)
            arrays = {"fc1.weight": rng.standard_normal((8, 12)).astype(np.float32),
                      "fc1.bias": rng.standard_normal(8).astype(np.float32),
                      "fc2.weight": rng.standard_normal((4, 8)).astype(np.float32),
                      "fc2.bias": rng.standard_normal(4).astype(np.float32)}
            data = safetensors_from_numpy(arrays)
            write_old(os.path.join(self.train, "ckpts", f"epoch_{e}.safetensors"), data)
            self.sums[f"epoch_{e}.safetensors"] = hashlib.md5(data).hexdigest()
        pack = ("pack:\n  formats: [mldef, samediff]\n  graph:\n"
                "    input: {name: x, shape: [-1, 12]}\n    layers:\n"
                "      - {op: dense, weight: fc1.weight, bias: fc1.bias}\n      - {op: relu}\n"
                "      - {op: dense, weight: fc2.weight, bias: fc2.bias}\n")
        conf = os.path.join(self.train, "ckptd.yaml")

        def configure(retention):
            self.config([{"url": "file://" + store}], retention)
            with open(conf) as f:
                text = f.read()
            if not retention:
                text = text.split("retention:")[0]
            with open(conf, "w") as f:
                f.write(text + pack)

        configure({})
        self.scan()
        with open(os.path.join(self.train, "data", "build_parameters.yaml")) as f:
            arch = yaml.safe_load(f)["archives"]
        mldef1 = next(a["path"] for a in arch.values()
                      if a["format"] == "mldef" and a["checkpoint"] == "epoch_1.safetensors")
        sd = next(a["path"] for a in arch.values() if a["format"] == "samediff")
        self.assertTrue(os.path.exists(os.path.join(store, mldef1)))
        os.unlink(os.path.join(store, mldef1))
        configure({"keep_last": 1})
        p = self.scan()
        # epoch_2's archives are all there: it goes; epoch_1's .mldef is not: it stays
        self.assertEqual(p.stderr.count("checkpoint.deleted:"), 1, p.stderr)
        self.assertIn("checkpoint.deleted: checkpoint='epoch_2.safetensors'", p.stderr)
        self.assertRegex(p.stderr, r"retention\.copy_missing: checkpoint='epoch_1\.safetensors' .*key=\"%s\""
                         % mldef1)
        self.assertEqual(self.on_disk()[0], {"epoch_1.safetensors", "epoch_3.safetensors"})
        self.assertEqual(self.local_tree(), {"epoch_1.safetensors", "epoch_3.safetensors"})
        # the next pass sends it again, checks it, deletes epoch_1
        p = self.scan()
        self.assertIn("checkpoint.deleted: checkpoint='epoch_1.safetensors'", p.stderr)
        for key in (mldef1, sd):
            self.assertEqual(md5_file(os.path.join(store, key)),
                             md5_file(os.path.join(self.train, key)))
        # a damaged SameDiff archive in the store (same size) holds the next one
        write_old(os.path.join(self.train, "ckpts", "epoch_4.safetensors"),
                  open(os.path.join(self.train, "data", "checkpoints", "epoch_3.safetensors"),
                       "rb").read()[:-4] + b"    ")
        configure({})
        self.scan(rc=None)
        configure({"keep_last": 1})
        with open(os.path.join(store, sd), "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0xFF]))
        p = self.scan(rc=None)
        self.assertNotIn("checkpoint.deleted", p.stderr)
        self.assertRegex(p.stderr, r"retention\.copy_missing: checkpoint='epoch_3\.safetensors' .*key=\"%s\""
                         % sd)
        self.assertIn("epoch_3.safetensors", self.on_disk()[0])
        self.scan(rc=None)
        self.assertEqual(md5_file(os.path.join(store, sd)), md5_file(os.path.join(self.train, sd)))
        self.assertNotIn("epoch_3.safetensors", self.on_disk()[0])
        pmf_validate.validate_tree(self.train)
        pmf_validate.validate_tree(store)

    # ---- remote retention: retention.store prunes the stores ----

    def check_store_keep_last(self, stores, fetch_store, stored, env=None, watch_store=None):
        """Six checkpoints; the local disk keeps 1, the stores 3. The stores'
        metadata.yaml drops the pruned ones before their files go: the store
        tree validates at every instant (a watchdog for the file store) and
        after, with exactly the newest three."""
        import threading
        self.write_ckpts(6)
        self.config(stores, {"keep_last": 1, "store": {"keep_last": 3}})
        bad, stop = [], threading.Event()

        def watchdog():
            meta = os.path.join(watch_store, "metadata.yaml")
            while not stop.is_set():
                try:
                    before = os.stat(meta)
                    pmf_validate.validate_tree(watch_store)
                except (OSError, pmf_validate.Invalid, KeyError, TypeError) as e:
                    try:
                        after = os.stat(meta)
                        same = (before.st_ino, before.st_mtime_ns) == (after.st_ino,
                                                                       after.st_mtime_ns)
                    except (OSError, UnboundLocalError):
                        same = False
                    if same and isinstance(e, pmf_validate.Invalid):
                        bad.append(str(e))  # the same metadata.yaml names a missing file
                time.sleep(0.005)

        t = threading.Thread(target=watchdog) if watch_store else None
        if t:
            t.start()
        try:
            p = self.scan(env=env)
        finally:
            stop.set()
            if t:
                t.join()
        self.assertEqual(bad, [], p.stderr)
        self.assertEqual(p.stderr.count("checkpoint.deleted:"), 5, p.stderr)
        self.assertEqual(p.stderr.count("checkpoint.pruned:"), 3, p.stderr)
        for e in (1, 2, 3):
            self.assertIn(f"checkpoint.pruned: checkpoint='epoch_{e}.pt'", p.stderr)
            self.assertFalse(stored(f"data/checkpoints/epoch_{e}.pt"), e)
        for e in (4, 5, 6):
            self.assertTrue(stored(f"data/checkpoints/epoch_{e}.pt"), e)
        self.assertEqual(self.local_tree(), {"epoch_6.pt"})
        got = fetch_store()
        meta = pmf_validate.validate_tree(got)
        self.assertEqual(set(meta["model"]["training"]["checkpoints"]),
                         {"epoch_4.pt", "epoch_5.pt", "epoch_6.pt"})
        for e in (4, 5, 6):
            self.assertEqual(md5_file(os.path.join(got, "data", "checkpoints", f"epoch_{e}.pt")),
                             self.sums[f"epoch_{e}.pt"])
        st = json.loads(run("status", "--json", self.train, check=0).stdout)
        where = {w["checkpoint"]: w["location"] for w in st["where"]}
        self.assertEqual(where, {"epoch_1.pt": "gone", "epoch_2.pt": "gone", "epoch_3.pt": "gone",
                                 "epoch_4.pt": "stores", "epoch_5.pt": "stores",
                                 "epoch_6.pt": "local"})
        dest = os.path.join(self.dir, "fetched")
        os.makedirs(dest)
        f = run("fetch", self.train, "epoch_2.pt", "-o", dest, env=env)
        self.assertNotEqual(f.returncode, 0)
        self.assertIn("pruned", f.stderr)
        # a new one: epoch_4 leaves the stores, the rest stays valid
        data = os.urandom(70000)
        write_old(os.path.join(self.train, "ckpts", "epoch_7.pt"), data)
        self.sums["epoch_7.pt"] = hashlib.md5(data).hexdigest()
        p = self.scan(env=env)
        self.assertIn("checkpoint.pruned: checkpoint='epoch_4.pt'", p.stderr)
        self.assertIn("checkpoint.deleted: checkpoint='epoch_6.pt'", p.stderr)
        got = fetch_store()
        meta = pmf_validate.validate_tree(got)
        self.assertEqual(set(meta["model"]["training"]["checkpoints"]),
                         {"epoch_5.pt", "epoch_6.pt", "epoch_7.pt"})
        self.assertFalse(stored("data/checkpoints/epoch_4.pt"))
        # nothing more to do: a scan changes nothing
        p = self.scan(env=env)
        self.assertNotIn("checkpoint.pruned", p.stderr)
        self.assertNotIn("checkpoint.deleted", p.stderr)

    def test_store_keep_last_file_store(self):
        store = os.path.join(self.dir, "store")
        self.check_store_keep_last([{"url": "file://" + store}], lambda: store,
                                   lambda key: os.path.exists(os.path.join(store, key)),
                                   watch_store=store)

    def test_store_keep_last_s3(self):
        need("aws", "checking S3 needs awscli")
        with self.s3_server() as s3:
            got = os.path.join(self.dir, "got")

            def fetch():
                shutil.rmtree(got, ignore_errors=True)
                s3.aws("s3", "cp", "--recursive", "--no-progress", f"s3://{s3.bucket}/r1", got)
                return got

            def stored(key):
                return s3.aws("s3api", "head-object", "--bucket", s3.bucket, "--key", "r1/" + key,
                              check=False).returncode == 0

            self.check_store_keep_last([{"url": f"s3://{s3.bucket}/r1", "endpoint": s3.endpoint,
                                         "credentials": "env"}], fetch, stored, env=s3.env())

    def test_store_keep_last_webdav(self):
        with Nginx(self.dir) as web:
            root = os.path.join(web.root, "m")
            self.check_store_keep_last([{"url": web.url + "/m"}], lambda: root,
                                       lambda key: os.path.exists(os.path.join(root, key)),
                                       watch_store=root)

    def test_store_keep_best_and_every(self):
        """retention.store.keep_best (Lightning names) and keep_every: the
        store keeps the two lowest val_loss, the even epochs and the newest;
        the local disk keeps only the latest."""
        store = os.path.join(self.dir, "store")
        losses = {1: 0.50, 2: 0.41, 3: 0.35, 4: 0.52, 5: 0.12, 6: 0.60, 7: 0.30}
        for e, loss in losses.items():
            data = os.urandom(30000 + e)
            name = f"epoch={e}-val_loss={loss:.2f}.ckpt"
            write_old(os.path.join(self.train, "ckpts", name), data)
            self.sums[name] = hashlib.md5(data).hexdigest()
        self.config([{"url": "file://" + store}], {"keep_last": 1})
        self.scan()
        self.config([{"url": "file://" + store}],
                    {"keep_last": 1, "store": {"keep_last": 1, "keep_every": 3,
                                               "keep_best": {"metric": "val_loss", "count": 2}}})
        # --dry-run says what would leave the stores, and nothing does
        before = sorted(os.listdir(os.path.join(store, "data", "checkpoints")))
        d = run("scan", "--dry-run", self.train, check=0)
        self.assertIn("prune 3 from the stores", d.stdout)
        self.assertEqual(d.stderr.count("retention.would_prune"), 3, d.stderr)
        self.assertEqual(sorted(os.listdir(os.path.join(store, "data", "checkpoints"))), before)
        p = self.scan()
        name = {e: f"epoch={e}-val_loss={loss:.2f}.ckpt" for e, loss in losses.items()}
        # best two: 5 (0.12), 7 (0.30); every 3rd: 3, 6; newest: 7
        want = {name[e] for e in (3, 5, 6, 7)}
        self.assertEqual(p.stderr.count("checkpoint.pruned:"), 3, p.stderr)
        meta = pmf_validate.validate_tree(store)
        self.assertEqual(set(meta["model"]["training"]["checkpoints"]), want)
        self.assertEqual(set(os.listdir(os.path.join(store, "data", "checkpoints"))), want)
        self.assertEqual(self.local_tree(), {name[7]})

    def test_store_retention_config(self):
        self.write_ckpts(1)
        for stores, ret, what in (
                ([], {"store": {"keep_last": 2}}, "no store is configured"),
                ([{"url": "file://" + self.dir + "/s"}], {"store": {"keep_last": -1}}, "negative"),
                ([{"url": "file://" + self.dir + "/s"}],
                 {"store": {"keep_best": {"mode": "max"}}}, "needs 'metric'")):
            self.config(stores, ret)
            p = run("config", "--config", os.path.join(self.train, "ckptd.yaml"))
            self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
            self.assertIn(what, p.stderr)
        self.config([{"url": "sftp://root@127.0.0.1:1/x", "key": "/nonexistent"}],
                    {"store": {"keep_last": 2}})
        p = run("config", "--config", os.path.join(self.train, "ckptd.yaml"))
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        p = run("config", "--keys")
        for k in ("retention.store.keep_last", "retention.store.keep_every",
                  "retention.store.keep_best.metric"):
            self.assertIn(k, p.stdout)

    def test_kill_during_pruning(self):
        """kill -9 at instants spread over scans that prune the store: the
        store's tree is valid after every kill (what its metadata.yaml lists
        is there, MD5s included), and the next scans finish the job."""
        store = os.path.join(self.dir, "store")
        rounds = max(1, KILL_ROUNDS // 3)

        def setup():
            shutil.rmtree(self.train, ignore_errors=True)
            shutil.rmtree(store, ignore_errors=True)
            self.sums = {}
            self.write_ckpts(5, size=150000)
            self.config([{"url": "file://" + store}], {"keep_last": 1})
            self.scan()  # deleted locally: 1-4, all five in the store
            self.config([{"url": "file://" + store}], {"keep_last": 1, "store": {"keep_last": 2}})

        setup()
        t0 = time.monotonic()
        p = self.scan()
        whole = time.monotonic() - t0
        self.assertEqual(p.stderr.count("checkpoint.pruned:"), 3, p.stderr)
        state_db = os.path.join(self.train, ".ckptd", "state.db")
        mid = 0
        for rnd in range(rounds):
            setup()
            proc = subprocess.Popen([CKPTD, "scan", self.train], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(whole * ((rnd * 7919) % rounds + 0.5) / rounds)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            pmf_validate.validate_tree(store)  # strict: every listed file, its MD5
            con = sqlite3.connect(state_db)
            states = dict(con.execute("SELECT ref, state FROM retention").fetchall())
            con.close()
            mid += "pruning" in states.values()
            listed = set(pmf_validate.load_metadata(store)["model"]["training"]["checkpoints"])
            for ref in self.sums:
                if not os.path.exists(os.path.join(store, "data", "checkpoints", ref)):
                    # gone from the store: recorded, and no longer listed there
                    self.assertIn(states.get(ref), ("pruning", "pruned"), f"round {rnd}: {ref}")
                    self.assertNotIn(ref, listed, f"round {rnd}")
            self.scan()
            self.scan()
            meta = pmf_validate.validate_tree(store)
            self.assertEqual(set(meta["model"]["training"]["checkpoints"]),
                             {"epoch_4.pt", "epoch_5.pt"}, f"round {rnd}")
            self.assertEqual(sorted(os.listdir(os.path.join(store, "data", "checkpoints"))),
                             ["epoch_4.pt", "epoch_5.pt"], f"round {rnd}")
            self.assertEqual(self.local_tree(), {"epoch_5.pt"})
        print(f"prune kill rounds: {rounds}, killed mid-pruning: {mid}", file=sys.stderr)

    def run_watch(self, trainer, *args, env=None, timeout=180):
        """ckptd watch wrapping /usr/bin/python3 -c trainer ARGS; its exit code and log."""
        script = os.path.join(self.dir, "trainer2.py")
        with open(script, "w") as f:
            f.write(trainer)
        p = subprocess.run([CKPTD, "watch", "--settle", "0.2", self.train, "--",
                            "/usr/bin/python3", script, self.train, *args],
                           capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, **(env or {})))
        return p.returncode, p.stdout + p.stderr

    TRAINER_HEAD = """
import os, sys, time
d = sys.argv[1]
ck = os.path.join(d, "ckpts")
os.makedirs(ck, exist_ok=True)
def wait(cond, what, t=90):
    end = time.monotonic() + t
    while not cond():
        if time.monotonic() > end:
            sys.exit("trainer: timed out waiting for " + what)
        time.sleep(0.05)
def registered(ref):
    try:
        with open(os.path.join(d, "metadata.yaml")) as f:
            return ref in f.read()
    except OSError:
        return False
def write(e, size):
    path = os.path.join(ck, "epoch_%d.pt" % e)
    with open(path + ".tmp", "wb") as f:
        f.write(os.urandom(size))
    os.rename(path + ".tmp", path)
    wait(lambda: registered("epoch_%d.pt" % e), "epoch_%d registered" % e)
"""

    def watch_with_a_store_watchdog(self, trainer, store, env=None):
        """run_watch while a watchdog validates the store's tree all along:
        (exit code, log, what it saw invalid: a listed checkpoint missing or
        with other bytes in a metadata.yaml that did not change while it was
        checked; the tree before the first checkpoint has no
        data/checkpoints/ yet, which is not counted)."""
        import threading
        bad, stop = [], threading.Event()

        def watchdog():
            meta = os.path.join(store, "metadata.yaml")
            while not stop.is_set():
                try:
                    before = os.stat(meta)
                    pmf_validate.validate_tree(store)
                except pmf_validate.Invalid as e:
                    after = os.stat(meta)
                    if ((before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
                            and "checkpoint" in str(e) and "Missing key" not in str(e)):
                        bad.append(str(e))
                except (OSError, KeyError, TypeError):
                    pass  # not uploaded yet
                time.sleep(0.005)

        t = threading.Thread(target=watchdog)
        t.start()
        try:
            rc, log = self.run_watch(trainer, store, env=env)
        finally:
            stop.set()
            t.join()
        return rc, log, bad

    def test_watch_prunes_the_store(self):
        """retention.store in the sidecar: the store keeps the newest two,
        its tree valid at every instant (a watchdog), the older ones pruned."""
        store = os.path.join(self.dir, "store")
        self.config([{"url": "file://" + store}],
                    {"keep_last": 1, "interval": "1s", "store": {"keep_last": 2}})
        trainer = self.TRAINER_HEAD + """
store = sys.argv[2]
for e in range(1, 5):
    write(e, 80000 + e)
    time.sleep(0.3)
def pruned():
    try:
        names = sorted(os.listdir(os.path.join(store, "data", "checkpoints")))
        return names == ["epoch_3.pt", "epoch_4.pt"]
    except OSError:
        return False
wait(pruned, "the store pruned to epoch_3 and epoch_4")
"""
        rc, log, bad = self.watch_with_a_store_watchdog(trainer, store)
        self.assertEqual(rc, 0, log[-5000:])
        self.assertEqual(bad, [], log[-3000:])
        self.assertIn("checkpoint.pruned: checkpoint='epoch_1.pt'", log)
        self.assertIn("checkpoint.pruned: checkpoint='epoch_2.pt'", log)
        meta = pmf_validate.validate_tree(store)
        self.assertEqual(set(meta["model"]["training"]["checkpoints"]), {"epoch_3.pt", "epoch_4.pt"})
        self.assertEqual(self.local_tree(), {"epoch_4.pt"})

    def test_watch_metadata_never_ahead_of_its_data(self):
        """Uploads beside a trainer, with the round's listing of data/ made
        slow (CKPTD_TEST_FAULT, debug builds) so that passes write a newer
        metadata.yaml meanwhile: the store's metadata.yaml never names a
        checkpoint the store does not hold (a watchdog validates the store's
        tree all along)."""
        store = os.path.join(self.dir, "store")
        os.makedirs(self.train, exist_ok=True)
        with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
            f.write(f"upload:\n  stores:\n    - url: file://{store}\n")
        trainer = self.TRAINER_HEAD + """
store = sys.argv[2]
for e in range(1, 6):
    path = os.path.join(ck, "epoch_%d.pt" % e)
    with open(path + ".tmp", "wb") as f:
        f.write(os.urandom(50000 + e))
    os.rename(path + ".tmp", path)
    time.sleep(0.25)
def sent():
    try:
        return len(os.listdir(os.path.join(store, "data", "checkpoints"))) == 5
    except OSError:
        return False
wait(sent, "every checkpoint in the store")
"""
        rc, log, bad = self.watch_with_a_store_watchdog(
            trainer, store, env={"CKPTD_TEST_FAULT": "slow-listing"})
        self.assertEqual(rc, 0, log[-5000:])
        self.assertEqual(bad, [], log[-3000:])
        meta = pmf_validate.validate_tree(store)
        self.assertEqual(len(meta["model"]["training"]["checkpoints"]), 5)

    def test_watch_min_free_tmpfs(self):
        """min_free in the sidecar: with no upload to start a round, the
        retention.interval timer sees the disk below min_free (a log file the
        trainer writes) and deletes the oldest checkpoints, never the latest."""
        mnt = os.path.join(self.dir, "mnt")
        os.makedirs(mnt)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt],
                          capture_output=True).returncode != 0:
            raise unittest.SkipTest("cannot mount a tmpfs here")
        self.addCleanup(subprocess.run, ["umount", mnt], capture_output=True)
        self.train = os.path.join(mnt, "train")
        store = os.path.join(self.dir, "store")
        self.config([{"url": "file://" + store}], {"min_free": "2000KiB", "interval": "1s"})
        trainer = self.TRAINER_HEAD + """
out = sys.argv[2]
def free():
    st = os.statvfs(d)
    return st.f_bavail * st.f_frsize
for e in range(1, 6):
    write(e, 300000)
time.sleep(3)  # every upload done, their rounds ran: nothing deleted with room left
before = sorted(os.listdir(ck))
with open(os.path.join(d, "train.log"), "wb") as f:
    f.write(os.urandom(max(0, free() - 1600 * 1024)))  # below min_free now
t0 = time.monotonic()
wait(lambda: free() >= 2000 * 1024, "min_free met again", t=60)
with open(out, "w") as f:
    f.write("%s\\n%s\\n%.1f\\n" % (",".join(before), ",".join(sorted(os.listdir(ck))),
                                   time.monotonic() - t0))
"""
        out = os.path.join(self.dir, "out")
        rc, log = self.run_watch(trainer, out)
        self.assertEqual(rc, 0, log[-5000:])
        with open(out) as f:
            before, after, secs = f.read().splitlines()
        self.assertEqual(before, ",".join(f"epoch_{e}.pt" for e in range(1, 6)), log[-3000:])
        left = after.split(",")
        n = 5 - len(left)
        self.assertGreater(n, 0)
        # oldest first, the latest stays
        self.assertEqual(left, [f"epoch_{e}.pt" for e in range(n + 1, 6)])
        self.assertIn("retention.low_space", log)
        self.assertEqual(log.count("checkpoint.deleted:"), n)
        self.assertEqual(self.local_tree(), set(left))
        self.sums = {}
        meta = pmf_validate.validate_tree(store)
        self.assertEqual(len(meta["model"]["training"]["checkpoints"]), 5)

    def test_watch_lost_object_is_sent_again(self):
        """The sidecar finds a copy the store lost after its upload: the
        checkpoint stays, the copy is queued again and the upload helper
        kicked; once it is back, checked, the checkpoint goes."""
        store = os.path.join(self.dir, "store")
        self.write_ckpts(3)
        self.config([{"url": "file://" + store}], {})
        conf = os.path.join(self.train, "ckptd.yaml")
        with open(conf) as f:
            noret = f.read().split("retention:")[0]
        with open(conf, "w") as f:
            f.write(noret)
        self.scan()
        os.unlink(os.path.join(store, "data", "checkpoints", "epoch_1.pt"))
        # keep_last 2: epoch_1 is the only one to go, nothing else starts an upload
        self.config([{"url": "file://" + store}], {"keep_last": 2, "interval": "1s"})
        trainer = self.TRAINER_HEAD + """
wait(lambda: not os.path.exists(os.path.join(ck, "epoch_1.pt")), "epoch_1 deleted", t=30)
"""
        rc, log = self.run_watch(trainer)
        self.assertEqual(rc, 0, log[-5000:])
        i_missing = log.index("retention.copy_missing: checkpoint='epoch_1.pt'")
        self.assertIn("queued to be sent again", log[i_missing:i_missing + 400])
        i_sent = log.index('key="data/checkpoints/epoch_1.pt"', i_missing)
        i_deleted = log.index("checkpoint.deleted: checkpoint='epoch_1.pt'")
        self.assertLess(i_sent, i_deleted)
        self.assertEqual(self.local_tree(), {"epoch_2.pt", "epoch_3.pt"})
        self.assertEqual(self.remote_tree(store), set(self.sums))

    def test_config_checked(self):
        self.write_ckpts(1)
        for bad, what in (({"keep_best": {"mode": "max"}}, "needs 'metric'"),
                          ({"keep_best": {"metric": "loss", "mode": "up"}}, "not min or max"),
                          ({"min_free": "lots"}, "size"),
                          ({"keep_last": -1}, "negative"),
                          ({"keep_last": 1, "interval": "500ms"}, "retention.interval")):
            self.config([{"url": "file://" + self.dir + "/s"}], bad)
            p = run("config", "--config", os.path.join(self.train, "ckptd.yaml"))
            self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
            self.assertIn(what, p.stderr)
        p = run("config", "--keys")
        for k in ("retention.keep_last", "retention.keep_every", "retention.keep_best.metric",
                  "retention.min_free", "retention.without_store", "retention.metrics_file",
                  "retention.interval"):
            self.assertIn(k, p.stdout)

    def test_dry_run(self):
        store = os.path.join(self.dir, "store")
        self.write_ckpts(4)
        self.config([{"url": "file://" + store}], {})
        with open(os.path.join(self.train, "ckptd.yaml")) as f:
            noret = f.read().split("retention:")[0]
        with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
            f.write(noret)
        self.scan()
        self.config([{"url": "file://" + store}], {"keep_last": 1})
        p = run("scan", "--dry-run", self.train, check=0)
        self.assertIn("would delete 3 checkpoint(s)", p.stdout)
        for e in (1, 2, 3):
            self.assertIn(f"retention.would_delete: checkpoint='epoch_{e}.pt'", p.stderr)
        self.assertEqual(len(self.on_disk()[0]), 4)
        self.assertEqual(self.local_tree(), set(self.sums))

    def test_tf_bundle_sets_and_a_folder_the_trainer_deleted(self):
        """A TensorFlow bundle (an .index and its shards) goes whole, trainer's
        files and tree links; a Hugging Face folder the trainer already
        rotated away (save_total_limit) leaves only ckptd's copy: that goes."""
        store = os.path.join(self.dir, "store")
        for st in (100, 200, 300):
            for part in (".index", ".data-00000-of-00001"):
                write_old(os.path.join(self.train, "tf", f"model.ckpt-{st}{part}"),
                          os.urandom(5000 + st))
        d = os.path.join(self.train, "hf", "checkpoint-50")
        write_old(os.path.join(d, "model.safetensors"), os.urandom(3000))
        write_old(os.path.join(d, "trainer_state.json"),
                  json.dumps({"global_step": 50, "epoch": 0.5}).encode())
        self.config([{"url": "file://" + store}], {})
        with open(os.path.join(self.train, "ckptd.yaml")) as f:
            noret = f.read().split("retention:")[0]
        with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
            f.write(noret)
        self.scan()
        shutil.rmtree(d)  # the trainer's rotation
        self.config([{"url": "file://" + store}], {"keep_last": 1})
        p = self.scan()
        self.assertEqual(p.stderr.count("checkpoint.deleted:"), 3, p.stderr)
        self.assertEqual(sorted(os.listdir(os.path.join(self.train, "tf"))),
                         ["model.ckpt-300.data-00000-of-00001", "model.ckpt-300.index"])
        tree = sorted(os.listdir(os.path.join(self.train, "data", "checkpoints")))
        self.assertEqual(tree, ["model.ckpt-300.data-00000-of-00001", "model.ckpt-300.index",
                                "model.ckpt-300.md5sums"])
        self.assertEqual(self.local_tree(), {"model.ckpt-300"})
        self.scan()
        meta = pmf_validate.validate_tree(store)
        self.assertEqual(set(meta["model"]["training"]["checkpoints"]),
                         {"checkpoint-50", "model.ckpt-100", "model.ckpt-200", "model.ckpt-300"})
        for ref in ("checkpoint-50", "model.ckpt-100", "model.ckpt-200"):
            r = subprocess.run(["md5sum", "-c", f"{ref}.md5sums"], capture_output=True,
                               text=True, cwd=os.path.join(store, "data", "checkpoints"))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_keep_every(self):
        store = os.path.join(self.dir, "store")
        self.write_ckpts(7, size=20000)
        self.config([{"url": "file://" + store}], {"keep_last": 1, "keep_every": 3})
        self.scan()
        want = {"epoch_3.pt", "epoch_6.pt", "epoch_7.pt"}
        self.assertEqual(self.on_disk(), (want, want))
        self.assertEqual(self.local_tree(), want)
        self.scan()
        self.assertEqual(self.remote_tree(store), set(self.sums))

    def test_keep_best_metrics_file(self):
        """retention.metrics_file: a metrics.jsonl by step, then a CSV by epoch."""
        store = os.path.join(self.dir, "store")
        loss = {100: 0.9, 200: 0.3, 300: 0.5, 400: 0.2, 500: 0.7, 600: 0.8}
        for st in loss:
            data = os.urandom(10000 + st)
            write_old(os.path.join(self.train, "ckpts", f"model_{st}.pt"), data)
            self.sums[f"model_{st}.pt"] = hashlib.md5(data).hexdigest()
        with open(os.path.join(self.train, "metrics.jsonl"), "w") as f:
            for st, v in loss.items():
                f.write(json.dumps({"step": st, "train_loss": 1.0, "val_loss": v}) + "\n")
                f.write(json.dumps({"step": st + 1, "val_loss": 0.0}) + "\n")  # no checkpoint
            f.write('{"step": 700, "val_lo')  # the line the trainer is writing
        self.config([{"url": "file://" + store}],
                    {"keep_best": {"metric": "val_loss", "count": 2},
                     "metrics_file": "metrics.jsonl"})
        self.scan()
        want = {"model_200.pt", "model_400.pt", "model_600.pt"}  # two best, the latest
        self.assertEqual(self.on_disk()[0], want)
        self.assertEqual(self.local_tree(), want)
        self.scan()
        self.assertEqual(self.remote_tree(store), set(self.sums))

        # a CSV with a header, by epoch, mode max
        self.train = os.path.join(self.dir, "train2")
        store = os.path.join(self.dir, "store2")
        self.sums = {}
        acc = {1: 0.5, 2: 0.9, 3: 0.7, 4: 0.6}
        for e in acc:
            data = os.urandom(10000 + e)
            write_old(os.path.join(self.train, "ckpts", f"epoch_{e}.pt"), data)
            self.sums[f"epoch_{e}.pt"] = hashlib.md5(data).hexdigest()
        with open(os.path.join(self.train, "metrics.csv"), "w") as f:
            f.write("epoch,loss,acc\n")
            for e, v in acc.items():
                f.write(f"{e},0.1,{v}\n")
        self.config([{"url": "file://" + store}],
                    {"keep_best": {"metric": "acc", "mode": "max", "count": 1},
                     "metrics_file": "metrics.csv"})
        self.scan()
        want = {"epoch_2.pt", "epoch_4.pt"}
        self.assertEqual(self.on_disk()[0], want)
        self.assertEqual(self.local_tree(), want)

    def test_keep_best_lightning_names(self):
        store = os.path.join(self.dir, "store")
        losses = {1: 0.50, 2: 0.21, 3: 0.35, 4: 0.12, 5: 0.40, 6: 0.30}
        for e, loss in losses.items():
            data = os.urandom(30000 + e)
            name = f"epoch={e}-val_loss={loss:.2f}.ckpt"
            write_old(os.path.join(self.train, "ckpts", name), data)
            self.sums[name] = hashlib.md5(data).hexdigest()
        self.config([{"url": "file://" + store}],
                    {"keep_best": {"metric": "val_loss", "mode": "min", "count": 2}})
        self.scan()
        # the two lowest losses and the latest stay
        want = {"epoch=4-val_loss=0.12.ckpt", "epoch=2-val_loss=0.21.ckpt",
                "epoch=6-val_loss=0.30.ckpt"}
        self.assertEqual(self.on_disk()[0], want)
        self.assertEqual(self.local_tree(), want)
        self.scan()
        self.assertEqual(self.remote_tree(store), set(self.sums))

    def test_keep_best_hf_trainer_state(self):
        store = os.path.join(self.dir, "store")
        accs = {100: 0.70, 200: 0.91, 300: 0.85, 400: 0.60}
        history = []
        for step, acc in accs.items():
            history.append({"step": step, "epoch": step / 100, "eval_accuracy": acc})
            d = os.path.join(self.train, "out", f"checkpoint-{step}")
            write_old(os.path.join(d, "model.safetensors"), os.urandom(20000 + step))
            state = {"global_step": step, "epoch": step / 100.0, "best_metric": max(
                h["eval_accuracy"] for h in history), "log_history": list(history)}
            write_old(os.path.join(d, "trainer_state.json"), json.dumps(state).encode())
        self.config([{"url": "file://" + store}],
                    {"keep_best": {"metric": "accuracy", "mode": "max", "count": 1}})
        p = self.scan()
        self.assertEqual(p.stderr.count("checkpoint.deleted:"), 2, p.stderr)
        # the best (step 200) and the latest (400) stay, folders whole
        self.assertEqual(set(os.listdir(os.path.join(self.train, "out"))),
                         {"checkpoint-200", "checkpoint-400"})
        tree = set(os.listdir(os.path.join(self.train, "data", "checkpoints")))
        self.assertEqual(tree, {"checkpoint-200", "checkpoint-200.md5sums", "checkpoint-400",
                                "checkpoint-400.md5sums"})
        self.assertEqual(self.local_tree(), {"checkpoint-200", "checkpoint-400"})
        self.scan()
        meta = pmf_validate.validate_tree(store)
        self.assertEqual(set(meta["model"]["training"]["checkpoints"]),
                         {f"checkpoint-{s}" for s in accs})
        # the deleted folders are whole in the store: md5sum -c of their manifest
        for s in (100, 300):
            r = subprocess.run(["md5sum", "-c", f"checkpoint-{s}.md5sums"], capture_output=True,
                               text=True, cwd=os.path.join(store, "data", "checkpoints"))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # and come back whole with fetch
        dest = os.path.join(self.dir, "fetched")
        os.makedirs(dest)
        run("fetch", self.train, "checkpoint-100", "-o", dest, check=0)
        r = subprocess.run(["md5sum", "-c", "checkpoint-100.md5sums"], capture_output=True,
                           text=True, cwd=dest)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(sorted(os.listdir(os.path.join(dest, "checkpoint-100"))),
                         ["model.safetensors", "trainer_state.json"])

    def test_min_free_tmpfs(self):
        mnt = os.path.join(self.dir, "mnt")
        os.makedirs(mnt)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt],
                          capture_output=True).returncode != 0:
            raise unittest.SkipTest("cannot mount a tmpfs here")
        try:
            self.train = os.path.join(mnt, "train")
            store = os.path.join(self.dir, "store")
            # 6 checkpoints of 400 KB on 4 MiB: ~2.4 MB used; min_free 2.5 MiB
            self.write_ckpts(6, size=400000)
            self.config([{"url": "file://" + store}], {"min_free": "2500KiB"})
            prom = os.path.join(self.dir, "m.prom")
            p = run("scan", "--metrics-file", prom, self.train, check=0, timeout=180)
            st = os.statvfs(mnt)
            free = st.f_bavail * st.f_frsize
            self.assertGreaterEqual(free, 2500 * 1024, p.stderr)
            deleted = p.stderr.count("checkpoint.deleted:")
            self.assertGreater(deleted, 0)
            left = sorted(self.on_disk()[0])
            # oldest first, the latest stays
            self.assertEqual(left, [f"epoch_{e}.pt" for e in range(deleted + 1, 7)])
            self.assertEqual(self.local_tree(), set(left))
            self.scan()
            self.assertEqual(self.remote_tree(store), set(self.sums))
            with open(prom) as f:
                m = {line.split(" ")[0]: float(line.split(" ")[1]) for line in f
                     if line.startswith("ckptd_")}
            self.assertEqual(m["ckptd_checkpoints_deleted_total"], deleted)
            # as the pass saw it at its end: the state database on the same
            # tmpfs changed after (its WAL goes at close), by less than 1 MiB
            self.assertLess(abs(m["ckptd_disk_free_bytes"] - free), 1024 * 1024)
            self.assertGreaterEqual(m["ckptd_disk_free_bytes"], 2500 * 1024)
        finally:
            subprocess.run(["umount", mnt], capture_output=True)

    # ---- the sidecar: ckptd watch runs retention as checkpoints are uploaded ----

    def check_watch_keep_last(self, stores, in_store, fetch_store, env=None, freeze=None):
        """A real watcher wrapping a trainer that writes five checkpoints;
        keep_last 2. While it runs, a checkpoint missing locally is always in
        the store with its bytes; the one the trainer holds open for writing
        stays until closed; the events and /metrics say what went."""
        import socket
        import threading
        src = os.path.join(self.dir, "src")
        os.makedirs(src)
        for e in range(1, 6):
            data = os.urandom(80000 + e)
            with open(os.path.join(src, f"epoch_{e}.pt"), "wb") as f:
                f.write(data)
            self.sums[f"epoch_{e}.pt"] = hashlib.md5(data).hexdigest()
        self.config(stores, {"keep_last": 2, "interval": "1s"})
        conf = os.path.join(self.train, "ckptd.yaml")
        with open(conf) as f:
            text = f.read()
        # uploads slower than the trainer: a deletion before the store holds
        # the copy would be seen by the watchdog below
        with open(conf, "w") as f:
            f.write(text.replace("upload:\n", "upload:\n  max_rate: 150KiB\n", 1))
        events = os.path.join(self.dir, "events")
        with open(conf, "a") as f:
            f.write("hooks:\n  exec:\n    - event: checkpoint.deleted\n"
                    f"      command: 'echo \"$CKPTD_CHECKPOINT|$CKPTD_STORE\" >> {events}'\n")
        script = os.path.join(self.dir, "trainer.py")
        with open(script, "w") as f:
            f.write(WATCH_TRAINER)
        go, out = os.path.join(self.dir, "go"), os.path.join(self.dir, "trainer.out")
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            port = sk.getsockname()[1]
        log = open(os.path.join(self.dir, "watch.log"), "w+")
        self.addCleanup(log.close)
        if freeze:
            freeze(True)
        proc = subprocess.Popen([CKPTD, "watch", "--settle", "0.2", "--listen", f"127.0.0.1:{port}",
                                 self.train, "--", "/usr/bin/python3", script, self.train, go, out, src],
                                stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, **(env or {})))
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        # the watchdog: whatever instant, a checkpoint the local disk lost is in the store
        bad, stop = [], threading.Event()

        def watchdog():
            while not stop.is_set():
                for ref, want in self.sums.items():
                    if os.path.exists(os.path.join(self.train, "ckpts", ref)):
                        continue
                    if not os.path.exists(os.path.join(src, ref)):
                        continue
                    if not registered_once(ref):
                        continue  # not written by the trainer yet
                    if in_store(ref) != want:
                        bad.append(f"{ref} gone locally, store has {in_store(ref)}")
                time.sleep(0.05)

        seen = set()

        def registered_once(ref):
            if ref in seen:
                return True
            try:
                with open(os.path.join(self.train, "metadata.yaml")) as f:
                    if ref in f.read():
                        seen.add(ref)
            except OSError:
                pass
            return ref in seen

        t = threading.Thread(target=watchdog)
        t.start()
        try:
            if freeze:
                # the store answers nothing until all five are registered:
                # nothing may go before their copies are in it
                wait_until = time.monotonic() + 120
                while len([r for r in self.sums if registered_once(r)]) < 5:
                    self.assertLess(time.monotonic(), wait_until, "the five never registered")
                    self.assertIsNone(proc.poll())
                    time.sleep(0.05)
                time.sleep(1)
                self.assertEqual(self.on_disk()[0], set(self.sums))
                freeze(False)
            # /metrics while the watcher runs: three deleted, the free space
            end, m = time.monotonic() + 150, {}
            while time.monotonic() < end and proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                        m = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1])
                             for ln in r.read().decode().splitlines()
                             if ln and not ln.startswith("#")}
                except OSError:
                    m = {}
                if m.get("ckptd_checkpoints_deleted_total") == 3:
                    break
                time.sleep(0.2)
            st = os.statvfs(self.train)
            log.seek(0)
            self.assertEqual(m.get("ckptd_checkpoints_deleted_total"), 3, log.read()[-5000:])
            self.assertLess(abs(m["ckptd_disk_free_bytes"] - st.f_bavail * st.f_frsize),
                            64 << 20)
            with open(go, "w"):
                pass
            rc = proc.wait(timeout=120)
        finally:
            stop.set()
            t.join()
        log.seek(0)
        text = log.read()
        self.assertEqual(rc, 0, text[-5000:])
        self.assertEqual(bad, [], text[-5000:])
        self.assertNotIn("watch.retention_not_run", text)
        with open(out) as f:
            self.assertEqual(f.read(), "held_kept=1\n", text[-5000:])
        self.assertRegex(text, r"retention\.held.*checkpoint='epoch_1\.pt': a process has it open")
        self.assertEqual(text.count("checkpoint.deleted:"), 3, text[-5000:])
        src_left, tree = self.on_disk()
        self.assertEqual(src_left, {"epoch_4.pt", "epoch_5.pt"})
        self.assertEqual(tree, {"epoch_4.pt", "epoch_5.pt"})
        self.assertEqual(self.local_tree(), {"epoch_4.pt", "epoch_5.pt"})
        self.assertEqual(self.remote_tree(fetch_store()), set(self.sums))
        with open(events) as f:
            got = sorted(f.read().splitlines())
        url = stores[0]["url"]
        self.assertEqual(got, [f"epoch_{e}.pt|{url}" for e in (1, 2, 3)])
        # and the cron way agrees: nothing more to delete, nothing registered again
        p = self.scan(env=env)
        self.assertNotIn("checkpoint.registered", p.stderr)
        self.assertNotIn("checkpoint.deleted", p.stderr)

    def test_watch_keep_last_file_store(self):
        store = os.path.join(self.dir, "store")

        def in_store(ref):
            path = os.path.join(store, "data", "checkpoints", ref)
            return md5_file(path) if os.path.exists(path) else None

        self.check_watch_keep_last([{"url": "file://" + store}], in_store, lambda: store)

    def test_watch_keep_last_s3(self):
        need("aws", "checking S3 needs awscli")
        with S3Server(self.dir) as s3:
            got = os.path.join(self.dir, "got")

            def in_store(ref):
                # s3rver's own files: the object's bytes as stored
                path = os.path.join(s3.dir, "ckpt", "r1", "data", "checkpoints",
                                    ref + "._S3rver_object")
                return md5_file(path) if os.path.exists(path) else None

            def fetch():
                shutil.rmtree(got, ignore_errors=True)
                s3.aws("s3", "cp", "--recursive", "--no-progress", "s3://ckpt/r1", got)
                return got

            def freeze(on):
                s3._signal(signal.SIGSTOP if on else signal.SIGCONT)

            self.check_watch_keep_last([{"url": "s3://ckpt/r1", "endpoint": s3.endpoint,
                                         "credentials": "env"}], in_store, fetch, env=s3.env(),
                                       freeze=freeze)

    def kill_setup(self, store):
        shutil.rmtree(self.train, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
        self.sums = {}
        self.write_ckpts(4, size=200000)
        # a folder checkpoint too: deleted whole or recorded as deleting
        d = os.path.join(self.train, "ckpts", "epoch_0")
        for i in range(6):
            write_old(os.path.join(d, f"shard{i}.bin"), os.urandom(50000))
        write_old(os.path.join(d, ".metadata"), b"x")
        self.config([{"url": "file://" + store}], {})
        with open(os.path.join(self.train, "ckptd.yaml")) as f:
            noret = f.read().split("retention:")[0]
        with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
            f.write(noret)
        self.scan()
        self.config([{"url": "file://" + store}], {"keep_last": 1})

    def check_after_kill(self, store, state_db, rnd):
        """The invariants after a kill -9; whether a deletion was left recorded unfinished."""
        # after the kill: every checkpoint whose bytes are not all local is recorded
        con = sqlite3.connect(state_db)
        try:
            rows = dict(con.execute("SELECT ref, state FROM retention").fetchall())
        except sqlite3.OperationalError:
            rows = {}  # killed before the state database was migrated
        con.close()
        meta = pmf_validate.load_metadata(self.train)
        listed = set(meta["model"]["training"]["checkpoints"])
        for ref in ["epoch_1.pt", "epoch_2.pt", "epoch_3.pt", "epoch_4.pt"]:
            here = os.path.exists(os.path.join(self.train, "ckpts", ref))
            linked = os.path.exists(os.path.join(self.train, "data", "checkpoints", ref))
            in_store = (os.path.exists(os.path.join(store, "data", "checkpoints", ref)) and
                        md5_file(os.path.join(store, "data", "checkpoints", ref)) ==
                        self.sums[ref])
            self.assertTrue(here or linked or in_store, f"round {rnd}: {ref} lost")
            if not (here and linked):
                self.assertIn(ref, rows, f"round {rnd}: {ref} half-deleted unrecorded")
                self.assertTrue(in_store, f"round {rnd}: {ref} deleted with no copy")
            if ref in listed:
                self.assertTrue(linked, f"round {rnd}: {ref} listed but not linked")
        folder = os.path.join(self.train, "ckpts", "epoch_0")
        if not os.path.isdir(folder) or len(os.listdir(folder)) < 7:
            self.assertIn("epoch_0", rows, f"round {rnd}: folder half-deleted unrecorded")
        # the local tree is valid at every instant
        pmf_validate.validate_tree(self.train)
        return "deleting" in rows.values()

    def test_kill_during_retention(self):
        """kill -9 at instants spread over passes that delete: no checkpoint
        is lost from both places, none is half-deleted without its record
        saying so, and the pass after finishes the job."""
        store = os.path.join(self.dir, "store")
        state_db = os.path.join(self.train, ".ckptd", "state.db")
        # how long a deleting pass takes here, to spread the kills over it
        self.kill_setup(store)
        t0 = time.monotonic()
        p = self.scan()
        whole = time.monotonic() - t0
        stamps = [(line.split(" ")[0], line) for line in p.stderr.splitlines() if line[:2] == "20"]

        def at(text):
            ts = next(t for t, line in stamps if text in line)
            return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()

        last = datetime.datetime.fromisoformat(stamps[-1][0].replace("Z", "+00:00")).timestamp()
        # the retention stage runs from the round's summary to the last deletion
        ret_start = whole - (last - at("upload.summary"))
        ret_len = at("checkpoint.deleted: checkpoint='epoch_3.pt'") - at("upload.summary") + 0.02
        mid = 0  # rounds killed with a deletion recorded but not finished
        for rnd in range(KILL_ROUNDS):
            self.kill_setup(store)
            proc = subprocess.Popen([CKPTD, "scan", self.train], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            # most kills inside the retention stage, a few anywhere in the pass
            frac = ((rnd * 7919) % KILL_ROUNDS) / KILL_ROUNDS
            time.sleep(whole * frac if rnd % 5 == 4 else max(0, ret_start + ret_len * frac))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            mid += self.check_after_kill(store, state_db, rnd)
            # the next pass finishes, registering nothing again; then both
            # trees hold what they should
            p = self.scan()
            self.assertNotIn("checkpoint.registered", p.stderr, f"round {rnd}")
            self.scan()
            con = sqlite3.connect(state_db)
            states = set(s for (s,) in con.execute("SELECT state FROM retention"))
            con.close()
            self.assertLessEqual(states, {"deleted"}, f"round {rnd}")
            self.assertEqual(self.local_tree(), {"epoch_4.pt"}, f"round {rnd}")
            self.assertEqual(self.on_disk(), ({"epoch_4.pt"}, {"epoch_4.pt"}), f"round {rnd}")
            self.assertEqual(self.remote_tree(store), set(self.sums) | {"epoch_0"})
            # the folder went whole, its dot file too (DCP's .metadata)
            r = subprocess.run(["md5sum", "-c", "epoch_0.md5sums"], capture_output=True,
                               text=True, cwd=os.path.join(store, "data", "checkpoints"))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("epoch_0/.metadata: OK", r.stdout)
        print(f"kill rounds: {KILL_ROUNDS}, killed mid-deletion: {mid}", file=sys.stderr)

    def test_kill_watcher_during_retention(self):
        """kill -9 of a watcher while its retention round deletes (fewer
        rounds than scan's: a watcher start costs more): the same invariants,
        and the next start finishes the job."""
        store = os.path.join(self.dir, "store")
        state_db = os.path.join(self.train, ".ckptd", "state.db")
        rounds = max(1, KILL_ROUNDS // 6)
        # when its deletions happen after its start, from its own log
        self.kill_setup(store)
        logp = os.path.join(self.dir, "calibrate.log")
        with open(logp, "w") as log:
            t0 = time.time()
            proc = subprocess.Popen([CKPTD, "watch", self.train], stdout=log, stderr=log)
            while len(os.listdir(os.path.join(self.train, "ckpts"))) > 1:
                self.assertLess(time.time() - t0, 60, "the watcher deleted nothing")
                time.sleep(0.01)
            time.sleep(0.2)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        with open(logp) as f:
            text = f.read()
        stamps = [datetime.datetime.fromisoformat(ln.split(" ")[0].replace("Z", "+00:00"))
                  .timestamp() - t0 for ln in text.splitlines() if " checkpoint.deleted: " in ln]
        self.assertEqual(len(stamps), 4, text[-3000:])
        first, last = stamps[0] - 0.02, stamps[-1] + 0.01
        mid = 0
        for rnd in range(rounds):
            self.kill_setup(store)
            proc = subprocess.Popen([CKPTD, "watch", self.train], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(first + (last - first) * ((rnd * 7919) % rounds) / rounds)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            mid += self.check_after_kill(store, state_db, rnd)
            pmf_validate.validate_tree(self.train)
            p = self.scan()
            self.assertNotIn("checkpoint.registered", p.stderr, f"round {rnd}")
            self.scan()
            self.assertEqual(self.local_tree(), {"epoch_4.pt"}, f"round {rnd}")
            self.assertEqual(self.on_disk(), ({"epoch_4.pt"}, {"epoch_4.pt"}), f"round {rnd}")
            self.assertEqual(self.remote_tree(store), set(self.sums) | {"epoch_0"})
        print(f"watcher kill rounds: {rounds}, killed mid-deletion: {mid}", file=sys.stderr)

class RetentionRgw(Retention):
    """The S3 cases that do not read s3rver's own files, against Ceph's RADOS
    Gateway (CMakeLists.txt lists them): the verified-copy check before a
    deletion (HEAD, ETag/MD5), a lost or damaged object sent again, and the
    store's own retention deleting objects."""

    def s3_server(self):
        return RgwServer(self.dir)


if __name__ == "__main__":
    unittest.main()
