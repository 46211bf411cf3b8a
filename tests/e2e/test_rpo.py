"""The recovery point of a checkpoint (issue 36): how often its bytes are
read between its close and its copy in a store, and what happens to a file
rewritten while it is sent.

- An S3 single PUT signs the body's SHA-256 and sends its Content-MD5 before
  the body: it needs both digests before it reads the file to send it. The
  sidecar's registration took both from one read of that very file (device,
  inode, size, mtime): the PUT sends those, and the service's ETag (the MD5 of
  what it stored) is compared with them.
- A checkpoint rewritten in place while its upload reads it (the store's copy
  would hold mixed bytes): the upload is refused or taken again, and in the
  end the store's copy, the local metadata.yaml and the store's metadata.yaml
  all say the final bytes; never a record whose MD5 is not the stored bytes'.

Digests are recomputed here with hashlib; the stored objects are read from
the servers' own files (s3rver's object file, nginx's root).
"""
import hashlib
import os
import re
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, md5_file, run, write_old  # noqa: E402
from servers import Nginx, S3Server  # noqa: E402

MiB = 1 << 20


def registered_md5(meta_path, ref):
    """The md5 metadata.yaml at meta_path records for ref, or None."""
    import yaml
    try:
        with open(meta_path) as f:
            meta = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None
    cps = (((meta or {}).get("model") or {}).get("training") or {}).get("checkpoints") or {}
    return (cps.get(ref) or {}).get("hash")


def s3_object(s3, key):
    """s3rver's file of the object key (its bytes as stored)."""
    d, b = os.path.split(key)
    return os.path.join(s3.dir, s3.bucket, d, b + "._S3rver_object")


class Rpo(TmpDirCase):
    def write_config(self, train, store, extra=""):
        os.makedirs(train, exist_ok=True)
        with open(os.path.join(train, "ckptd.yaml"), "w") as f:
            f.write("upload:\n  retries: 2\n  retry_base: 100ms\n" + extra + "  stores:\n    - " +
                    "\n      ".join(f"{k}: {v}" for k, v in store.items()) + "\n")

    def test_s3_single_put_sends_the_digests_registration_took(self):
        """Registered checkpoints go as single PUTs with the digests their
        registration took (no read of the file for them); a file the
        registration did not hash (data/build_parameters.yaml, which ckptd
        writes) is hashed by the PUT."""
        train = os.path.join(self.dir, "train")
        data = {e: os.urandom(3 * MiB + e) for e in (1, 2)}
        for e, b in data.items():
            write_old(os.path.join(train, f"epoch_{e}.pt"), b)
        with S3Server(self.dir) as s3:
            self.write_config(train, {"url": "s3://ckpt/r", "endpoint": s3.endpoint})
            p = run("scan", "-v", train, env=s3.env(), check=0)
            for e, b in data.items():
                key = f"data/checkpoints/epoch_{e}.pt"
                self.assertIn(f'upload.digests_known: key="{key}"', p.stderr)
                # the service's bytes and its ETag are those of the file
                with open(s3_object(s3, "r/" + key), "rb") as f:
                    self.assertEqual(f.read(), b)
                self.assertEqual(registered_md5(os.path.join(train, "metadata.yaml"),
                                                f"epoch_{e}.pt"), hashlib.md5(b).hexdigest())
            self.assertRegex(p.stderr, r'upload\.done: [^\n]*key="data/build_parameters\.yaml"')
            self.assertNotIn('upload.digests_known: key="data/build_parameters.yaml"', p.stderr)
            self.assertNotIn('upload.digests_known: key="metadata.yaml"', p.stderr)

    def rewritten_while_sent(self, store, stored, env=None, extra="", atomic=True):
        """A watcher sends a 6 MiB checkpoint at 2 MiB/s; a second into the
        transfer the trainer rewrites it in place with other bytes of the
        same size. In the end the stored copy and both metadata.yaml files
        name the final bytes; with atomic (a store whose final name only
        ever holds a whole upload), the stored copy was never a mix."""
        train = os.path.join(self.dir, "train")
        self.write_config(train, store, "  max_rate: 2MiB\n" + extra)
        first, final = os.urandom(6 * MiB), os.urandom(6 * MiB)
        log_path = os.path.join(self.dir, "watch.log")
        e = dict(os.environ, **(env or {}))
        with open(log_path, "w") as lf:
            w = subprocess.Popen([CKPTD, "watch", train, "--settle", "0"], stdout=lf,
                                 stderr=subprocess.STDOUT, env=e)
        try:
            def log():
                with open(log_path) as f:
                    return f.read()

            def wait(pred, what, timeout=60):
                end = time.monotonic() + timeout
                while time.monotonic() < end:
                    if pred():
                        return
                    if w.poll() is not None:
                        self.fail(f"watch exited {w.returncode}:\n{log()}")
                    time.sleep(0.05)
                self.fail(f"{what} within {timeout} s:\n{log()}")

            wait(lambda: "watch.started" in log(), "watch.started")
            ckpt = os.path.join(train, "epoch_1.pt")
            with open(ckpt, "wb") as f:
                f.write(first)
            key = "data/checkpoints/epoch_1.pt"
            wait(lambda: re.search(r'upload\.start: [^\n]*key="' + re.escape(key), log()),
                 "the checkpoint's upload")
            time.sleep(1.0)  # 2 of its 6 MiB sent
            with open(ckpt, "r+b") as f:  # in place: the tree's hard link is this file
                f.write(final)
            want = hashlib.md5(final).hexdigest()
            local_meta = os.path.join(train, "metadata.yaml")

            whole = (hashlib.md5(first).hexdigest(), want)
            seen = set()  # the stored copy's MD5 each time it was looked at

            def settled():
                obj = stored(key)
                try:
                    got = md5_file(obj)
                except OSError:
                    return False
                seen.add(got)
                return (got == want and registered_md5(local_meta, "epoch_1.pt") == want and
                        registered_md5(stored("metadata.yaml"), "epoch_1.pt") == want)
            wait(settled, "the final bytes stored and recorded in both metadata.yaml", 90)
            # the stored copy was never a mix of the two: the file store and
            # WebDAV put an upload in place only once it is whole and checked
            if atomic:
                self.assertLessEqual(seen, set(whole), log())
            text = log()
            # the first send was refused or taken again, never recorded as it was
            self.assertRegex(text, r"changed while it was uploaded|changed since it was queued|"
                                   r"the data differ|checkpoint\.changed")
        finally:
            w.terminate()
            w.wait(60)
        # every md5 the local metadata.yaml ever recorded for it was of whole bytes
        for m in re.findall(r"checkpoint\.(?:registered|changed)[^\n]*?md5[= ](?:\w+ -> )?(\w{32})",
                            text):
            self.assertIn(m, whole, text)

    def sent_beside_hashing(self, store, stored, env=None, verbose=False):
        """A watcher and a 16 MiB checkpoint (epoch_2) at 4 MiB/s, after a
        small one (epoch_1) whose pass also queued the rest of the tree (so
        epoch_2's upload has nothing ahead of it in the queue): returns the
        log from epoch_2's close (text) once the store's metadata.yaml names
        its MD5, the stored copy and metadata.yaml checked."""
        train = os.path.join(self.dir, "train")
        self.write_config(train, store, "  max_rate: 4MiB\n")
        first = os.urandom(MiB)
        data = os.urandom(16 * MiB)
        want = hashlib.md5(data).hexdigest()
        log_path = os.path.join(self.dir, "watch.log")
        with open(log_path, "w") as lf:
            w = subprocess.Popen([CKPTD, "watch", *(["-v"] if verbose else []), train, "--settle",
                                  "0"], stdout=lf, stderr=subprocess.STDOUT,
                                 env=dict(os.environ, **(env or {})))
        try:
            def log():
                with open(log_path) as f:
                    return f.read()
            end = time.monotonic() + 30
            while "watch.started" not in log() and time.monotonic() < end:
                time.sleep(0.05)

            def stored_md5(name, md5):
                end = time.monotonic() + 60
                while registered_md5(stored("metadata.yaml"), name) != md5:
                    self.assertLess(time.monotonic(), end, log())
                    self.assertIsNone(w.poll(), log())
                    time.sleep(0.05)
            with open(os.path.join(train, "epoch_1.pt"), "wb") as f:
                f.write(first)
            stored_md5("epoch_1.pt", hashlib.md5(first).hexdigest())
            time.sleep(0.5)  # the queue drained
            since = len(log())
            with open(os.path.join(train, "epoch_2.pt"), "wb") as f:
                f.write(data)
            stored_md5("epoch_2.pt", want)
        finally:
            w.terminate()
            w.wait(60)
        text = log()[since:]
        self.assertEqual(registered_md5(os.path.join(train, "metadata.yaml"), "epoch_2.pt"), want)
        self.assertEqual(md5_file(stored("data/checkpoints/epoch_2.pt")), want)
        done = re.findall(r'upload\.done: [^\n]*key="([^"]+)"', text)
        # metadata.yaml naming it went after the checkpoint's bytes
        self.assertLess(done.index("data/checkpoints/epoch_2.pt"),
                        len(done) - 1 - done[::-1].index("metadata.yaml"), text)
        return text

    @staticmethod
    def at(text, pattern):
        m = re.search(pattern, text)
        return m.start() if m else None

    def test_a_checkpoint_goes_to_webdav_while_it_is_hashed(self):
        """The upload of a new checkpoint is queued before its registration:
        the watcher hashes it from the page cache while the helper sends it,
        then registers it; metadata.yaml still goes after the bytes."""
        with Nginx(self.dir) as web:
            text = self.sent_beside_hashing({"url": web.url + "/r"},
                                            lambda key: os.path.join(web.root, "r", key))
        # queued for the store before it was registered (hashed): when the
        # helper process starts sending is the machine's scheduling
        queued = self.at(text, r'upload\.queued: [^\n]*key="data/checkpoints/epoch_2\.pt"')
        reg = self.at(text, r"checkpoint\.registered: checkpoint='epoch_2\.pt'")
        self.assertIsNotNone(queued, text)
        self.assertIsNotNone(reg, text)
        self.assertLess(queued, reg, text)

    def test_a_checkpoint_for_an_s3_single_put_is_registered_first(self):
        """A single PUT needs both digests before its body: the checkpoint
        is registered (hashed) first and the PUT takes those digests."""
        with S3Server(self.dir) as s3:
            text = self.sent_beside_hashing({"url": "s3://ckpt/r", "endpoint": s3.endpoint},
                                            lambda key: s3_object(s3, "r/" + key), env=s3.env(),
                                            verbose=True)
        start = self.at(text, r'upload\.start: [^\n]*key="data/checkpoints/epoch_2\.pt"')
        reg = self.at(text, r"checkpoint\.registered: checkpoint='epoch_2\.pt'")
        self.assertIsNotNone(start, text)
        self.assertLess(reg, start, text)
        self.assertIn('upload.digests_known: key="data/checkpoints/epoch_2.pt"', text)

    def test_a_checkpoint_rewritten_while_sent_to_s3_is_never_recorded_mixed(self):
        with S3Server(self.dir) as s3:
            # s3rver writes a PUT's body into the object's file as it comes
            # and checks no signed SHA-256 (S3 refuses such a body): a mix
            # can be seen there until the upload that found it is sent again
            self.rewritten_while_sent(
                {"url": "s3://ckpt/r", "endpoint": s3.endpoint},
                lambda key: s3_object(s3, "r/" + key), env=s3.env(), atomic=False)

    def test_a_checkpoint_rewritten_while_sent_to_a_file_store_is_never_recorded_mixed(self):
        store = os.path.join(self.dir, "nfs")
        self.rewritten_while_sent({"url": "file://" + store},
                                  lambda key: os.path.join(store, key))

    def test_a_checkpoint_rewritten_while_sent_to_webdav_is_never_recorded_mixed(self):
        with Nginx(self.dir) as web:
            self.rewritten_while_sent({"url": web.url + "/r"},
                                      lambda key: os.path.join(web.root, "r", key))


if __name__ == "__main__":
    unittest.main()
