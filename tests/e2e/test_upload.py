"""ckptd upload / queue / bundle against real servers on loopback (issue 5).

What landed is read back with independent clients (Debian's aws CLI, curl,
the sftp client, plain files) and compared byte for byte with hashlib.
s3rver logs every request it serves: that log tells which parts were sent.
"""
import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, run, write_old  # noqa: E402
from servers import RgwServer, AwsChecksums, FlakyProxy, Nginx, S3Server, Sshd, free_port, need  # noqa: E402

MiB = 1 << 20


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(MiB), b""):
            h.update(b)
    return h.hexdigest()


def make(path, size, seed=0):
    """A file of size pseudo-random bytes (different per seed)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    h = hashlib.sha256(str(seed).encode()).digest()
    block = (h * (MiB // len(h) + 1))[:MiB]
    with open(path, "wb") as f:
        left, i = size, 0
        while left:
            chunk = hashlib.sha256(block[:64] + i.to_bytes(8, "little")).digest() * 2048
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n
            i += 1
    return path


def queue(state, *extra, env=None):
    p = run("queue", "--json", "--state", state, *extra, env=env, check=0)
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


class S3(TmpDirCase):
    # s3rver stores the first bytes of a PUT whose client died: metadata.yaml
    # goes to it as a multipart upload, which appears only at Complete
    commit = ("--commit", "multipart")

    def setUp(self):
        super().setUp()
        need("aws", "checking S3 uploads needs awscli")
        self.s3 = S3Server(self.dir)
        self.addCleanup(self.s3.stop)
        self.env = self.s3.env()
        self.state = os.path.join(self.dir, "state")

    def upload(self, *args, check=0, env=None, timeout=120):
        e = dict(self.env, **(env or {}))
        return run("upload", "--state", self.state, "--endpoint", self.s3.endpoint, *args,
                   env=e, check=check, timeout=timeout)

    def test_single_and_multipart_byte_for_byte(self):
        small = make(os.path.join(self.dir, "src", "step=100 a.bin"), 3 * MiB + 17, 1)
        big = make(os.path.join(self.dir, "src", "big.safetensors"), 23 * MiB + 5, 2)
        self.upload(small, f"s3://{self.s3.bucket}/run 1/")
        p = self.upload("--multipart-threshold", "8MiB", "--part-size", "5MiB", big,
                        f"s3://{self.s3.bucket}/run 1/")
        self.assertIn("parts_sent=5", p.stderr)
        self.assertEqual(self.s3.keys(), ["run 1/big.safetensors", "run 1/step=100 a.bin"])
        for src, key in ((small, "run 1/step=100 a.bin"), (big, "run 1/big.safetensors")):
            got = os.path.join(self.dir, "got")
            self.s3.get(key, got)
            self.assertEqual(sha256(got), sha256(src), key)
        # the key went out percent-encoded (RFC 3986), each part exactly once
        self.assertEqual(sorted(self.s3.parts_put()),
                         [1, 2, 3, 4, 5])
        jobs = queue(self.state)
        self.assertEqual([j["state"] for j in jobs], ["done", "done"])
        self.assertEqual(jobs[0]["sha256"], sha256(small))
        # s3rver keeps no checksum: the ETag was compared with the MD5 sent,
        # and the record and the event say so
        self.assertEqual([j["check"] for j in jobs], ["md5", "md5"])
        self.assertIn("check=md5", p.stderr)
        # the listing names the objects as the store has them (no "//")
        listing = run("queue", "--state", self.state, check=0).stdout
        self.assertIn(f"s3://{self.s3.bucket}/run 1/big.safetensors", listing)
        self.assertNotIn("//big", listing)
        # the same file again: nothing is sent twice
        n_before = len(self.s3.stored_order())
        p = self.upload(small, f"s3://{self.s3.bucket}/run 1/")
        self.assertIn("already queued or sent", p.stderr)
        self.assertEqual(len(self.s3.stored_order()), n_before)

    def test_dest_names_the_object_as_aws_cli_does(self):
        """aws s3 cp FILE s3://b/key writes exactly key; a trailing '/' (or a
        bucket alone) makes DEST a prefix; a folder always goes under DEST."""
        src = make(os.path.join(self.dir, "w.bin"), 1000, 60)
        self.upload(src, f"s3://{self.s3.bucket}/x/hi.txt")
        self.upload(src, f"s3://{self.s3.bucket}/x/")
        self.upload(src, f"s3://{self.s3.bucket}")
        tree = os.path.join(self.dir, "tree")
        make(os.path.join(tree, "a.bin"), 10, 61)
        self.upload(tree, f"s3://{self.s3.bucket}/folder")
        self.assertEqual(self.s3.keys(), ["folder/a.bin", "w.bin", "x/hi.txt", "x/w.bin"])
        # the same as aws-cli itself writes
        self.s3.aws("s3", "cp", "--no-progress", src, f"s3://{self.s3.bucket}/cli/hi.txt")
        self.assertIn("cli/hi.txt", self.s3.keys())
        got = os.path.join(self.dir, "got")
        self.s3.get("x/hi.txt", got)
        self.assertEqual(sha256(got), sha256(src))
        # the queue names the objects as the store has them
        listing = run("queue", "--state", self.state, check=0).stdout
        self.assertIn(f"s3://{self.s3.bucket}/x/hi.txt", listing)

    def test_tree_metadata_last(self):
        tree = os.path.join(self.dir, "model")
        for i in range(3):
            make(os.path.join(tree, "data", "checkpoints", f"epoch_{i}.bin"), MiB + i, 10 + i)
        make(os.path.join(tree, "data", "build_parameters.yaml"), 100, 20)
        # the trainer's own files beside the tree stay home (issue 17)
        make(os.path.join(tree, "checkpoint-40", "model.bin"), 1000, 21)
        with open(os.path.join(tree, "metadata.yaml"), "w") as f:
            f.write("checkpoints: {}\n")
        self.upload(tree, f"s3://{self.s3.bucket}/models/m1")
        order = self.s3.stored_order()
        objs = [o for o in order if o.startswith("models/m1/")]
        self.assertEqual(objs[-1], "models/m1/metadata.yaml", order)
        self.assertEqual(len(objs), 5, objs)
        self.assertNotIn("models/m1/checkpoint-40/model.bin", objs)
        for rel in ("data/checkpoints/epoch_0.bin", "data/checkpoints/epoch_2.bin", "metadata.yaml"):
            got = os.path.join(self.dir, "got")
            self.s3.get("models/m1/" + rel, got)
            self.assertEqual(sha256(got), sha256(os.path.join(tree, rel)))

    def test_wrong_credentials(self):
        src = make(os.path.join(self.dir, "a.bin"), 1000, 3)
        p = self.upload(src, f"s3://{self.s3.bucket}/x/", env={"AWS_SECRET_ACCESS_KEY": "not-the-secret"},
                        check=1)
        self.assertIn("SignatureDoesNotMatch", p.stderr)
        self.assertIn("refused the credentials", p.stderr)
        self.assertNotIn("not-the-secret", p.stderr + p.stdout)
        self.assertNotIn(self.s3.secret, p.stderr + p.stdout)
        jobs = queue(self.state)
        self.assertEqual(jobs[0]["state"], "failed")  # not retried: an auth error
        self.assertEqual(jobs[0]["attempts"], 1)
        self.assertEqual(self.s3.keys(), [])
        # a credentials file must be 0600; with the right mode and secret it works
        cred = self.s3.credentials_file(os.path.join(self.dir, "aws-creds"))
        os.chmod(cred, 0o644)
        env = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
        p = self.upload("--credentials", "file:" + cred, src, f"s3://{self.s3.bucket}/x/", env=env, check=1)
        self.assertIn("0600", p.stderr)
        os.chmod(cred, 0o600)
        run("queue", "retry", "--all", "--state", self.state, check=0)
        self.upload("--credentials", "file:" + cred, src, f"s3://{self.s3.bucket}/x/", env=env)
        self.assertEqual(self.s3.keys(), ["x/a.bin"])

    def test_500_then_200_and_slowdown(self):
        src = make(os.path.join(self.dir, "a.bin"), 2 * MiB, 4)
        with FlakyProxy(self.s3.port, [500, 503], retry_after=1, fail_methods={"PUT"}) as px:
            e = dict(self.env)
            p = run("upload", "--state", self.state, "--endpoint", px.url, src, f"s3://{self.s3.bucket}/f/",
                    env=e, check=0, timeout=60)
            statuses = [s for m, path, s in px.requests if m == "PUT"]
        self.assertEqual(statuses[:3], [500, 503, 200])
        self.assertEqual(p.stderr.count("upload.retry"), 2)
        self.assertIn("SlowDown", p.stderr)
        got = os.path.join(self.dir, "got")
        self.s3.get("f/a.bin", got)
        self.assertEqual(sha256(got), sha256(src))

    def test_a_part_stored_damaged_is_found(self):
        """s3rver checks no checksum and answers a multipart object's HEAD
        with the whole body's MD5: a part damaged on its way (one byte of
        part 2 flipped by the proxy) is stored, its ETag is not the MD5 sent,
        so ckptd checks the object against the file's MD5 and refuses it."""
        big = make(os.path.join(self.dir, "big.bin"), 12 * MiB + 7, 9)

        def flip(method, path, body):
            if method == "PUT" and "partNumber=2&" in path and body:
                return body[:100] + bytes([body[100] ^ 1]) + body[101:]
            return body
        with FlakyProxy(self.s3.port, [], rewrite=flip) as px:
            p = run("upload", "--state", self.state, "--endpoint", px.url, "--retries", "0",
                    "--multipart-threshold", "5MiB", "--part-size", "5MiB", big, f"s3://{self.s3.bucket}/d/",
                    env=self.env, check=1, timeout=60)
        self.assertRegex(p.stderr, r"big\.bin': the stored object's ETag \S+ is not \S+: the "
                                   r"data differ")
        # undamaged, the same upload passes the same check
        self.upload("--multipart-threshold", "5MiB", "--part-size", "5MiB", big, f"s3://{self.s3.bucket}/e/")
        got = os.path.join(self.dir, "got")
        self.s3.get("e/big.bin", got)
        self.assertEqual(sha256(got), sha256(big))

    def test_a_service_that_keeps_checksums_gives_no_md5_etags(self):
        """AWS with an SSE-KMS bucket (servers.AwsChecksums in front of
        s3rver): ETags are not MD5s, and S3 checks and keeps the checksum sent
        with each body. Single PUTs and a multipart object are checked
        against S3's checksum; once the service has shown that it keeps
        them, the files after it go without an MD5 (no Content-MD5)."""
        src = os.path.join(self.dir, "shards")
        files = [make(os.path.join(src, f"s{i}.bin"), 2 * MiB + i, 20 + i) for i in range(4)]
        files.append(make(os.path.join(src, "z-big.bin"), 12 * MiB + 3, 30))
        aws = AwsChecksums()
        with FlakyProxy(self.s3.port, [], respond=aws) as px:
            p = run("upload", "--state", self.state, "--endpoint", px.url, "--transfers", "1",
                    "--multipart-threshold", "8MiB", "--part-size", "5MiB", src, f"s3://{self.s3.bucket}/k/",
                    env=self.env, check=0, timeout=120)
        self.assertNotIn("ETag", p.stderr)
        for f in files:
            got = os.path.join(self.dir, "got")
            self.s3.get("k/" + os.path.basename(f), got)
            self.assertEqual(sha256(got), sha256(f))
        self.assertEqual(aws.heads_with_checksum, 5)
        # in the order they arrived: the first with an MD5 (nothing known yet);
        # with one body at a time, the third and later after a checked HEAD
        md5s = [m for _, m in aws.puts]
        self.assertEqual(len(md5s), 4)
        self.assertEqual((md5s[0], md5s[2:]), (True, [False, False]))
        # the single PUTs record the SHA-256 sent (S3 checked it)
        jobs = sorted(queue(self.state), key=lambda j: j["key"])
        self.assertEqual([j["sha256"] for j in jobs][:4], [sha256(f) for f in files[:4]])
        # the service's own SHA-256 of each object was compared
        self.assertEqual({j["check"] for j in jobs}, {"sha256"})

    def test_a_checksum_that_differs_is_found(self):
        """The service keeps a checksum other than the one sent (the stored
        bytes differ): a single PUT and a multipart object are refused."""
        small = make(os.path.join(self.dir, "small.bin"), 3 * MiB, 40)
        big = make(os.path.join(self.dir, "big.bin"), 11 * MiB, 41)
        for f, extra in ((small, []), (big, ["--multipart-threshold", "5MiB", "--part-size", "5MiB"])):
            with self.subTest(f=os.path.basename(f)), \
                    FlakyProxy(self.s3.port, [], respond=AwsChecksums(damage=True)) as px:
                p = run("upload", "--state", self.state, "--endpoint", px.url, "--retries", "0",
                        *extra, f, f"s3://{self.s3.bucket}/d/", env=self.env, check=1, timeout=60)
                self.assertRegex(p.stderr, os.path.basename(f) + r"': the stored object's checksum "
                                 r"\S+ is not \S+: the data differ")

    def test_kill_9_during_multipart_resumes_missing_parts(self):
        big = make(os.path.join(self.dir, "big.bin"), 40 * MiB, 5)
        args = ["upload", "--state", self.state, "--endpoint", self.s3.endpoint,
                "--multipart-threshold", "5MiB", "--part-size", "5MiB", "--concurrency", "2",
                "--max-rate", "8MiB", big, f"s3://{self.s3.bucket}/crash/"]
        proc = subprocess.Popen([CKPTD, *args], env=dict(os.environ, **self.env),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        accepted = []
        deadline = time.time() + 60
        while time.time() < deadline:
            accepted = self.s3.parts_put()
            if len(accepted) >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.assertGreaterEqual(len(accepted), 3)
        self.assertEqual(self.s3.keys(), [])  # nothing visible: no half object
        jobs = queue(self.state)
        self.assertEqual(jobs[0]["state"], "running")  # as the killed process left it
        self.assertTrue(jobs[0]["upload_id"])
        first = self.s3.parts_put()
        p = self.upload(big, f"s3://{self.s3.bucket}/crash/", "--multipart-threshold", "5MiB",
                        "--part-size", "5MiB")
        m = re.search(r"parts_sent=(\d+) parts_resumed=(\d+)", p.stderr)
        self.assertIsNotNone(m, p.stderr)
        total = self.s3.parts_put()
        second = total[len(first):]
        # parts recorded as accepted before the kill were not sent again
        resumed = int(m.group(2))
        self.assertGreaterEqual(resumed, 1)
        self.assertEqual(len(second), 8 - resumed)
        self.assertEqual(sorted(set(first) | set(second)), list(range(1, 9)))
        got = os.path.join(self.dir, "got")
        self.s3.get("crash/big.bin", got)
        self.assertEqual(sha256(got), sha256(big))
        self.assertEqual(queue(self.state)[0]["state"], "done")

    def test_kill_9_during_metadata_step(self):
        tree = os.path.join(self.dir, "model")
        make(os.path.join(tree, "checkpoints", "epoch_1.bin"), 2 * MiB, 30)
        make(os.path.join(tree, "checkpoints", "epoch_2.bin"), 2 * MiB, 31)
        make(os.path.join(tree, "metadata.yaml"), 4 * MiB, 32)  # big enough to catch in flight
        args = ["upload", "--state", self.state, "--endpoint", self.s3.endpoint,
                "--max-rate", "2MiB", *self.commit, tree, f"s3://{self.s3.bucket}/m"]
        proc = subprocess.Popen([CKPTD, *args], env=dict(os.environ, **self.env),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        state = None
        while time.time() < deadline:
            jobs = {j["key"]: j["state"] for j in queue(self.state)}
            state = jobs.get("metadata.yaml")
            if state == "running":
                # metadata never starts before the data is done
                self.assertEqual({v for k, v in jobs.items() if k != "metadata.yaml"}, {"done"})
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.assertEqual(state, "running")
        keys = self.s3.keys()
        self.assertIn("m/checkpoints/epoch_1.bin", keys)
        self.assertIn("m/checkpoints/epoch_2.bin", keys)
        self.assertNotIn("m/metadata.yaml", keys)  # neither whole nor cut short
        self.upload(*self.commit, tree, f"s3://{self.s3.bucket}/m")
        self.assertEqual(self.s3.keys(), ["m/checkpoints/epoch_1.bin", "m/checkpoints/epoch_2.bin",
                                          "m/metadata.yaml"])
        for rel in ("metadata.yaml", "checkpoints/epoch_2.bin"):
            got = os.path.join(self.dir, "got")
            self.s3.get("m/" + rel, got)
            self.assertEqual(sha256(got), sha256(os.path.join(tree, rel)))
        # the data objects were not sent again after the restart
        order = self.s3.stored_order()
        self.assertEqual(order.count("m/checkpoints/epoch_1.bin"), 1)

    def test_sigterm_keeps_the_rest_queued(self):
        tree = os.path.join(self.dir, "model")
        for i in range(4):
            make(os.path.join(tree, f"c{i}.bin"), 2 * MiB, 40 + i)
        with open(os.path.join(tree, "metadata.yaml"), "w") as f:
            f.write("checkpoints: {}\n")
        cfg = os.path.join(self.dir, "ckptd.yaml")
        with open(cfg, "w") as f:
            # one file at a time: when the first is done, three are left for the signal
            f.write("upload:\n  grace: 500ms\n  max_rate: 2MiB\n  transfers: 1\n")
        proc = subprocess.Popen([CKPTD, "upload", "-c", cfg, "--state", self.state, "--endpoint",
                                 self.s3.endpoint, tree, f"s3://{self.s3.bucket}/t"],
                                env=dict(os.environ, **self.env), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 30
        while time.time() < deadline and not any(j["state"] == "done" for j in queue(self.state)):
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn("kept in the queue", err)
        states = [j["state"] for j in queue(self.state)]
        self.assertNotIn("running", states)
        self.assertIn("pending", states)
        self.assertNotIn("t/metadata.yaml", self.s3.keys())
        self.upload(tree, f"s3://{self.s3.bucket}/t")
        self.assertEqual(len(self.s3.keys()), 5)
        self.assertEqual({j["state"] for j in queue(self.state)}, {"done"})

    def test_compress_zstd_records_original_hash(self):
        zstd = need("zstd", "checking compressed uploads needs the zstd tool")
        src = make(os.path.join(self.dir, "w.bin"), 3 * MiB, 50)
        self.upload("--compress", "zstd", src, f"s3://{self.s3.bucket}/z/")
        self.assertEqual(self.s3.keys(), ["z/w.bin.zst"])
        got = os.path.join(self.dir, "got.zst")
        self.s3.get("z/w.bin.zst", got)
        subprocess.run([zstd, "-q", "-d", "-f", got, "-o", got + ".out"], check=True)
        self.assertEqual(sha256(got + ".out"), sha256(src))
        job = queue(self.state)[0]
        self.assertEqual(job["original_sha256"], sha256(src))
        head = self.s3.aws("s3api", "head-object", "--bucket", self.s3.bucket, "--key", "z/w.bin.zst")
        self.assertEqual(json.loads(head.stdout)["Metadata"].get("ckptd-original-sha256"),
                         sha256(src))

    def test_bundle_upload(self):
        tree = os.path.join(self.dir, "mymodel")
        make(os.path.join(tree, "checkpoints", "a.bin"), MiB, 60)
        with open(os.path.join(tree, "metadata.yaml"), "w") as f:
            f.write("checkpoints: {}\n")
        self.upload("--bundle", tree, f"s3://{self.s3.bucket}/b")
        self.assertEqual(self.s3.keys(), ["b/mymodel.tar.zst"])
        got = os.path.join(self.dir, "got.tar.zst")
        self.s3.get("b/mymodel.tar.zst", got)
        out = os.path.join(self.dir, "x")
        os.makedirs(out)
        subprocess.run(["tar", "--zstd", "-xf", got, "-C", out], check=True)
        self.assertEqual(sha256(os.path.join(out, "checkpoints", "a.bin")),
                         sha256(os.path.join(tree, "checkpoints", "a.bin")))


class Rgw(S3):
    """Against Ceph's RADOS Gateway, a production S3 implementation: the S3
    tests that do not rely on s3rver's own ways (its files on disk, a proxy
    playing AWS in front of it) run here too (CMakeLists.txt lists which),
    and the tests of what s3rver lacks (it answers ListParts with 405, so
    resuming from the server's list of parts is tested here)."""

    commit = ()  # RGW refuses a body cut short: metadata.yaml goes as one PUT

    def setUp(self):
        TmpDirCase.setUp(self)
        need("aws", "checking S3 uploads needs awscli")
        self.s3 = RgwServer(self.dir)
        self.addCleanup(self.s3.stop)
        self.env = self.s3.env()
        self.state = os.path.join(self.dir, "state")

    def test_single_and_multipart_say_the_md5_check(self):
        """RGW keeps no SHA-256 checksum (HEAD with checksum mode returns
        none): the ETag is compared with the MD5 sent, and that is what the
        record says; the bytes read back with aws-cli are the file's."""
        small = make(os.path.join(self.dir, "a.bin"), MiB + 3, 8)
        big = make(os.path.join(self.dir, "b.bin"), 11 * MiB + 1, 9)
        self.upload(small, f"s3://{self.s3.bucket}/r/")
        self.upload("--multipart-threshold", "5MiB", "--part-size", "5MiB", big,
                    f"s3://{self.s3.bucket}/r/")
        self.assertEqual(sorted(self.s3.parts_put("r/b.bin")), [1, 2, 3])
        for src, key in ((small, "r/a.bin"), (big, "r/b.bin")):
            got = os.path.join(self.dir, "got")
            self.s3.get(key, got)
            self.assertEqual(sha256(got), sha256(src), key)
        self.assertEqual([j["check"] for j in queue(self.state)], ["md5", "md5"])

    def test_metadata_goes_as_one_put_unless_told(self):
        """The commit object (metadata.yaml, sent last) is one PUT by
        default, a multipart upload with --commit multipart; the same bytes
        land either way."""
        tree = os.path.join(self.dir, "model")
        make(os.path.join(tree, "data", "checkpoints", "epoch_1.bin"), MiB, 70)
        make(os.path.join(tree, "metadata.yaml"), 300 * 1024, 71)
        for prefix, extra in (("one", ()), ("multi", ("--commit", "multipart"))):
            self.upload(*extra, tree, f"s3://{self.s3.bucket}/{prefix}")
            key = f"{prefix}/metadata.yaml"
            self.assertEqual(self.s3.stored_order()[-1], key)
            self.assertEqual(self.s3.parts_put(key), [] if prefix == "one" else [1])
            got = os.path.join(self.dir, "got")
            self.s3.get(key, got)
            self.assertEqual(sha256(got), sha256(os.path.join(tree, "metadata.yaml")))
        p = self.upload("--commit", "sometimes", tree, f"s3://{self.s3.bucket}/x", check=2)
        self.assertIn("'commit' must be put or multipart", p.stderr)

    def kill_with_parts_unrecorded(self, big, prefix, parts, concurrency, rate):
        """Starts a multipart upload of big to prefix, kill -9 once the
        server holds `parts` parts, then removes the record's part rows: what
        a kill between the server accepting a part and the queue recording it
        leaves. Returns the part numbers the server holds."""
        key = prefix + os.path.basename(big)
        args = ["upload", "--state", self.state, "--endpoint", self.s3.endpoint,
                "--multipart-threshold", "5MiB", "--part-size", "5MiB", "--concurrency",
                str(concurrency), "--max-rate", rate, big, f"s3://{self.s3.bucket}/{prefix}"]
        proc = subprocess.Popen([CKPTD, *args], env=dict(os.environ, **self.env),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while time.time() < deadline and len(self.s3.parts_put(key)) < parts:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        on_server = set(self.s3.parts_put(key))
        self.assertGreaterEqual(len(on_server), parts)
        db = sqlite3.connect(os.path.join(self.state, "state.db"))
        with db:
            db.execute("DELETE FROM upload_parts")
        db.close()
        return on_server

    def test_record_behind_the_server_resumes_from_the_servers_parts(self):
        """kill -9 between the server accepting a part and the queue recording
        it leaves parts on the server only: resume asks the server (ListParts)
        and sends only what it lacks. The record is set behind on purpose
        (its part rows removed) after a kill, which is what that instant leaves."""
        KEY = "lag/big.bin"
        big = make(os.path.join(self.dir, "big.bin"), 40 * MiB, 6)
        # the record forgets every accepted part: only the server knows them
        on_server = self.kill_with_parts_unrecorded(big, "lag/", 3, 2, "8MiB")
        p = self.upload(big, f"s3://{self.s3.bucket}/lag/", "--multipart-threshold", "5MiB",
                        "--part-size", "5MiB")
        second = self.s3.parts_put(KEY)[len(on_server):]
        # what the server held was not sent again; the rest was, once each
        self.assertEqual(sorted(second), sorted(set(range(1, 9)) - on_server), p.stderr)
        self.assertIn(f"parts_resumed={len(on_server)}", p.stderr)
        self.assertIn(f"parts_unrecorded_taken={len(on_server)}", p.stderr)
        got = os.path.join(self.dir, "got")
        self.s3.get("lag/big.bin", got)
        self.assertEqual(sha256(got), sha256(big))

    def kill_during_multipart(self, big, prefix, parts):
        """Starts `ckptd upload` of big (5 MiB parts, slowly), kill -9 once
        RGW holds `parts` of its parts: an upload begun, not completed."""
        key = prefix + os.path.basename(big)
        proc = subprocess.Popen(
            [CKPTD, "upload", "--state", self.state, "--endpoint", self.s3.endpoint,
             "--multipart-threshold", "5MiB", "--part-size", "5MiB", "--concurrency", "1",
             "--max-rate", "6MiB", big, f"s3://{self.s3.bucket}/{prefix}"],
            env=dict(os.environ, **self.env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while time.time() < deadline and len(self.s3.parts_put(key)) < parts:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        begun = self.s3.uploads_in_progress()
        self.assertEqual([k for k, _ in begun], [key])
        return begun[0][1]

    def test_an_upload_given_up_is_aborted_in_the_store(self):
        """A multipart upload that will never be completed is aborted, not
        left for RGW to keep (and a service to bill): its file changed after a
        kill -9 (the queue starts it over), or went before it was sent again."""
        big = make(os.path.join(self.dir, "big.bin"), 20 * MiB, 11)
        old_id = self.kill_during_multipart(big, "changed/", 1)
        with open(big, "ab") as f:
            f.write(b"more bytes")
        p = self.upload(big, f"s3://{self.s3.bucket}/changed/", "--multipart-threshold", "5MiB",
                        "--part-size", "5MiB")
        self.assertIn(f'upload.multipart_aborted: store="s3://{self.s3.bucket}/changed/" '
                      f'key="big.bin" upload_id="{old_id}"', p.stderr)
        self.assertEqual(self.s3.uploads_in_progress(), [], p.stderr)
        got = os.path.join(self.dir, "got")
        self.s3.get("changed/big.bin", got)
        self.assertEqual(sha256(got), sha256(big))
        # the file removed before the queue sends it again: gone, and aborted
        gone = make(os.path.join(self.dir, "gone.bin"), 20 * MiB, 12)
        self.kill_during_multipart(gone, "gone/", 1)
        os.unlink(gone)
        p = run("queue", "run", "--state", self.state, env=self.env, check=None, timeout=120)
        self.assertEqual(self.s3.uploads_in_progress(), [], p.stderr)
        self.assertIn("upload.multipart_aborted", p.stderr)
        self.assertEqual(queue(self.state)[-1]["state"], "gone")

    def test_a_server_part_with_other_bytes_is_sent_again(self):
        """A part the server holds whose bytes are not the file's (the file
        was rewritten after the kill): listed, compared, and sent again."""
        KEY = "other/big.bin"
        big = make(os.path.join(self.dir, "big.bin"), 20 * MiB, 7)
        on_server = self.kill_with_parts_unrecorded(big, "other/", 2, 1, "6MiB")
        # part 1's bytes change, same size and mtime kept (the queue's identity)
        st = os.stat(big)
        with open(big, "r+b") as f:
            f.write(b"\xff" * 4096)
        os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns))
        p = self.upload(big, f"s3://{self.s3.bucket}/other/", "--multipart-threshold", "5MiB",
                        "--part-size", "5MiB")
        second = self.s3.parts_put(KEY)[len(on_server):]
        self.assertIn(1, second, p.stderr)
        self.assertEqual(sorted(second), sorted((set(range(1, 5)) - on_server) | {1}), p.stderr)
        got = os.path.join(self.dir, "got")
        self.s3.get("other/big.bin", got)
        self.assertEqual(sha256(got), sha256(big))


class Http(TmpDirCase):
    def test_put_and_move_byte_for_byte(self):
        with Nginx(self.dir) as web:
            src = make(os.path.join(self.dir, "src", "epoch=3.bin"), 5 * MiB + 3, 70)
            state = os.path.join(self.dir, "state")
            run("upload", "--state", state, src, web.url + "/models/run1/", check=0)
            got = os.path.join(self.dir, "got")
            subprocess.run(["curl", "-sSf", "-o", got, web.url + "/models/run1/epoch%3D3.bin"],
                           check=True)
            self.assertEqual(sha256(got), sha256(src))
            # the temporary was moved away: only the final name is there
            self.assertEqual(os.listdir(os.path.join(web.root, "models", "run1")), ["epoch=3.bin"])
            with open(os.path.join(web.dir, "access.log")) as f:
                log = f.read()
            self.assertRegex(log, r'"PUT /models/run1/\.epoch%3D3\.bin\.ckptd-1\.part HTTP/1\.1" 201')
            self.assertRegex(log, r'"MOVE /models/run1/\.epoch%3D3\.bin\.ckptd-1\.part HTTP/1\.1" 20[14]')
            # a file the agent never hashed: no SHA-256 is computed (as curl
            # and rclone: the server cannot check one) unless asked for
            self.assertEqual(queue(state)[0]["sha256"], "")
            # what was checked: the stored size (WebDAV gives no checksum)
            self.assertEqual(queue(state)[0]["check"], "size")
            # DEST without a trailing '/' names the object itself (as aws s3 cp)
            run("upload", "--state", state, src, web.url + "/models/named.bin", check=0)
            self.assertEqual(sha256(os.path.join(web.root, "models", "named.bin")), sha256(src))
            other = make(os.path.join(self.dir, "src", "epoch=4.bin"), 3 * MiB + 1, 72)
            run("upload", "--state", state, "--sha256", other, web.url + "/models/run1/",
                check=0)
            jobs = {os.path.basename(j["src"]): j for j in queue(state)}
            self.assertEqual(jobs["epoch=4.bin"]["sha256"], sha256(other))

    def test_basic_auth_and_wrong_password(self):
        with Nginx(self.dir, users={"uploader": "s3cr3t-pw"}) as web:
            src = make(os.path.join(self.dir, "a.bin"), 4096, 71)
            state = os.path.join(self.dir, "state")
            cred = os.path.join(self.dir, "cred")
            fd = os.open(cred, os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, b"uploader:wrong-pw\n")
            os.close(fd)
            p = run("upload", "--state", state, "--credentials", "file:" + cred, src,
                    web.url + "/x/", check=1)
            self.assertIn("HTTP 401", p.stderr)
            self.assertNotIn("wrong-pw", p.stderr)
            with open(cred, "w") as f:
                f.write("uploader:s3cr3t-pw\n")
            run("queue", "retry", "--all", "--state", state, check=0)
            run("upload", "--state", state, "--credentials", "file:" + cred, src,
                web.url + "/x/", check=0)
            with open(os.path.join(web.root, "x", "a.bin"), "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), sha256(src))

    def test_server_disappears_then_returns(self):
        port = free_port()
        src = make(os.path.join(self.dir, "a.bin"), MiB, 72)
        state = os.path.join(self.dir, "state")
        cfg = os.path.join(self.dir, "ckptd.yaml")
        with open(cfg, "w") as f:
            f.write("upload:\n  retries: 2\n  retry_base: 100ms\n")
        web = Nginx(self.dir, port=port)
        web.kill()  # gone before the upload starts
        p = run("upload", "-c", cfg, "--state", state, src, f"http://127.0.0.1:{port}/d/",
                check=1, timeout=90)
        self.assertRegex(p.stderr, r"(Couldn't connect|Failed to connect|Connection refused)")
        # nobody answered: the store is given up for this run, the job stays
        # queued with no attempt counted (issue 27), for the next run
        self.assertEqual(queue(state)[0]["state"], "pending")
        self.assertEqual(queue(state)[0]["attempts"], 0)
        self.assertIn("upload.store_unreachable", p.stderr)
        self.assertTrue(os.path.exists(src))
        with Nginx(self.dir, port=port) as web:
            run("queue", "run", "--state", state, check=0)
            with open(os.path.join(web.root, "d", "a.bin"), "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), sha256(src))
        self.assertEqual(queue(state)[0]["state"], "done")

    def test_presigned_url_and_no_move(self):
        with Nginx(self.dir) as web:
            src = make(os.path.join(self.dir, "a.bin"), 70000, 74)
            state = os.path.join(self.dir, "state")
            # a URL with a query names the object itself: one PUT there, no MOVE
            p = run("upload", "--state", state, src,
                    web.url + "/signed/object.bin?X-Amz-Signature=abc123", check=0)
            self.assertNotIn("abc123", p.stderr)  # a signature is a credential: never logged
            with open(os.path.join(web.dir, "access.log")) as f:
                log = f.read()
            self.assertIn('"PUT /signed/object.bin?X-Amz-Signature=abc123 HTTP/1.1" 201', log)
            self.assertNotIn("MOVE", log)
            self.assertEqual(sha256(os.path.join(web.root, "signed", "object.bin")), sha256(src))
            # move: false puts straight to the final name
            run("upload", "--state", state, "--no-move", src, web.url + "/direct/", check=0)
            with open(os.path.join(web.dir, "access.log")) as f:
                log = f.read()
            self.assertIn('"PUT /direct/a.bin HTTP/1.1" 201', log)
            self.assertEqual(sha256(os.path.join(web.root, "direct", "a.bin")), sha256(src))
            # a presigned URL cannot be asked about the object: nothing checked, and said
            self.assertEqual([j["check"] for j in queue(state)], ["none", "size"])

    def test_bearer_token_from_env(self):
        with Nginx(self.dir) as web, FlakyProxy(web.port, []) as px:
            src = make(os.path.join(self.dir, "a.bin"), 1000, 75)
            state = os.path.join(self.dir, "state")
            token = "tok-" + os.urandom(8).hex()
            p = run("upload", "--state", state, "--auth", "bearer", "--credentials",
                    "env:CK_TEST_TOKEN", src, px.url + "/b/", env={"CK_TEST_TOKEN": token}, check=0)
            self.assertNotIn(token, p.stderr)
            auth = {h.get("Authorization") for m, path, h in px.headers if m == "PUT"}
            self.assertEqual(auth, {"Bearer " + token})
            self.assertEqual(sha256(os.path.join(web.root, "b", "a.bin")), sha256(src))

    def test_one_connection_for_a_folder(self):
        # the run's handles share their connections: the jobs after the
        # first reuse them (no new TCP/TLS handshake per file); one transfer
        # is a body and, beside it, the previous file's tail: two at most
        with Nginx(self.dir) as web:
            srcs = [make(os.path.join(self.dir, "src", f"shard-{i}.bin"), 200000 + i, 90 + i)
                    for i in range(6)]
            state = os.path.join(self.dir, "state")
            run("upload", "--state", state, "--transfers", "1", os.path.join(self.dir, "src"),
                web.url + "/f", check=0, timeout=60)
            for src in srcs:
                self.assertEqual(sha256(os.path.join(web.root, "f", os.path.basename(src))),
                                 sha256(src))
            with open(os.path.join(web.dir, "access.log")) as f:
                lines = f.read().splitlines()
            methods = [re.search(r'"([A-Z]+) ', ln).group(1) for ln in lines]
            self.assertEqual(methods.count("PUT"), 6)
            conns = {re.search(r"conn=(\d+)$", ln).group(1) for ln in lines}
            self.assertLessEqual(len(conns), 2, lines)

    def test_500_then_200(self):
        with Nginx(self.dir) as web, FlakyProxy(web.port, [500, 500], fail_methods={"PUT"}) as px:
            src = make(os.path.join(self.dir, "a.bin"), 300000, 73)
            state = os.path.join(self.dir, "state")
            p = run("upload", "--state", state, src, px.url + "/r/", check=0, timeout=60)
            self.assertEqual(p.stderr.count("upload.retry"), 2)
            with open(os.path.join(web.root, "r", "a.bin"), "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), sha256(src))


class Sftp(TmpDirCase):
    def test_upload_and_rename_with_pinned_host_key(self):
        with Sshd(self.dir) as ssh:
            src = make(os.path.join(self.dir, "src", "w 1.bin"), 3 * MiB + 1, 80)
            state = os.path.join(self.dir, "state")
            dest_dir = os.path.join(self.dir, "remote")
            run("upload", "--state", state, "--key", ssh.key, "--host-key", ssh.host_key_sha256,
                src, ssh.url(dest_dir + "/sub/"), check=0, timeout=60)
            # read back with OpenSSH's sftp client
            got = os.path.join(self.dir, "got")
            batch = os.path.join(self.dir, "batch")
            with open(batch, "w") as f:
                f.write(f'get "{dest_dir}/sub/w 1.bin" "{got}"\n')
            subprocess.run(["sftp", "-q", "-b", batch, "-i", ssh.key, "-P", str(ssh.port),
                            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                            "root@127.0.0.1"], check=True, capture_output=True, timeout=30)
            self.assertEqual(sha256(got), sha256(src))
            self.assertEqual(os.listdir(os.path.join(dest_dir, "sub")), ["w 1.bin"])
            self.assertEqual(queue(state)[0]["check"], "size")  # the listed size
            # DEST without a trailing '/' names the file itself
            run("upload", "--state", state, "--key", ssh.key, "--host-key", ssh.host_key_sha256,
                src, ssh.url(dest_dir + "/sub/named.bin"), check=0, timeout=60)
            self.assertEqual(sha256(os.path.join(dest_dir, "sub", "named.bin")), sha256(src))

    def test_one_login_for_a_folder(self):
        with Sshd(self.dir) as ssh:
            srcs = [make(os.path.join(self.dir, "src", f"s{i}.bin"), 100000 + i, 84 + i)
                    for i in range(4)]
            state = os.path.join(self.dir, "state")
            dest = os.path.join(self.dir, "remote")
            run("upload", "--state", state, "--transfers", "1", "--key", ssh.key, "--host-key",
                ssh.host_key_sha256, os.path.join(self.dir, "src"), ssh.url(dest), check=0,
                timeout=60)
            for src in srcs:
                self.assertEqual(sha256(os.path.join(dest, os.path.basename(src))), sha256(src))
            # one transfer: a body and the previous file's tail, two sessions at most
            with open(os.path.join(ssh.dir, "sshd.log"), errors="replace") as f:
                self.assertLessEqual(f.read().count("Accepted publickey"), 2)

    def test_wrong_host_key_is_refused(self):
        with Sshd(self.dir) as ssh:
            src = make(os.path.join(self.dir, "a.bin"), 1000, 81)
            state = os.path.join(self.dir, "state")
            bad = "SHA256:" + "A" * 43
            p = run("upload", "--state", state, "--key", ssh.key, "--host-key", bad, src,
                    ssh.url(os.path.join(self.dir, "remote")), check=1, timeout=60)
            self.assertIn("host key", p.stderr)
            self.assertFalse(os.path.exists(os.path.join(self.dir, "remote", "a.bin")))


class Local(TmpDirCase):
    def test_commands_started_together_on_a_fresh_state(self):
        # Both create the state database and switch it to WAL at the same
        # moment; SQLite answers the loser "database is locked" at once (this
        # failed in about half of the rounds before ckptd retried it).
        for round_ in range(20):
            state = os.path.join(self.dir, f"state{round_}")
            procs = [subprocess.Popen([CKPTD, "queue", "--json", "--state", state],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                     for _ in range(4)]
            for p in procs:
                _, err = p.communicate(timeout=60)
                self.assertEqual(p.returncode, 0, f"round {round_}: {err}")

    def test_file_store_and_full_queue_disk(self):
        src = make(os.path.join(self.dir, "a.bin"), 2 * MiB, 90)
        state = os.path.join(self.dir, "state")
        dest = os.path.join(self.dir, "nfs")
        p = run("upload", "--state", state, src, "file://" + dest + "/", check=0)
        self.assertEqual(sha256(os.path.join(dest, "a.bin")), sha256(src))
        self.assertEqual(queue(state)[0]["check"], "read-back-sha256")
        self.assertEqual(os.listdir(dest), ["a.bin"])  # only the file: no temporary left
        # file://: a path that is not a folder names the file, a folder keeps
        # the name (cp's rule), a trailing '/' is a folder
        run("upload", "--state", state, src, "file://" + dest + "/renamed.bin", check=0)
        run("upload", "--state", state, src, "file://" + dest + "/in", check=0)
        os.makedirs(os.path.join(dest, "dir"))
        run("upload", "--state", state, src, "file://" + dest + "/dir", check=0)
        self.assertEqual(sorted(os.listdir(dest)), ["a.bin", "dir", "in", "renamed.bin"])
        self.assertEqual(os.listdir(os.path.join(dest, "dir")), ["a.bin"])
        self.assertTrue(os.path.isfile(os.path.join(dest, "in")))
        self.assertIn("check=read-back-sha256", p.stderr)
        # a state folder on a full disk: a clear error, the source untouched
        if os.geteuid() != 0:
            raise unittest.SkipTest("mounting a small tmpfs needs root")
        mnt = os.path.join(self.dir, "tiny")
        os.makedirs(mnt)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mnt],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise unittest.SkipTest(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        self.addCleanup(subprocess.run, ["umount", "-l", mnt])
        tstate = os.path.join(mnt, "state")
        run("upload", "--state", tstate, "--queue-only", src, "file://" + dest + "2/", check=0)
        fd = os.open(os.path.join(mnt, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        many = [make(os.path.join(self.dir, "many", f"f{i}.bin"), 10, 100 + i) for i in range(1)]
        p = run("upload", "--state", tstate, os.path.join(self.dir, "many"),
                "file://" + dest + "3", check=None)
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr, r"(full|No space left)")
        self.assertTrue(os.path.exists(many[0]))
        os.remove(os.path.join(mnt, "filler"))
        # the job queued before the disk filled is still there and runs
        run("queue", "run", "--state", tstate, check=0)
        self.assertEqual(sha256(os.path.join(dest + "2", "a.bin")), sha256(src))

    def test_queue_cli(self):
        state = os.path.join(self.dir, "state")
        p = run("queue", "--state", state, check=0)
        self.assertIn("0 pending, 0 running, 0 done, 0 failed", p.stdout)
        run("queue", "retry", "--state", state, check=2)
        p = run("queue", "retry", "7", "--state", state, check=1)
        self.assertIn("no failed job 7", p.stderr)
        run("upload", "--state", state, "/nonexistent", "file:///tmp/x", check=2)
        run("upload", "--state", state, __file__, "ftp://host/x", check=2)
        p = run("upload", "--state", state, __file__, "s3://ckpt/x", "--credentials",
                "AKIA:literal", check=2)
        self.assertNotIn("literal", p.stderr)

    def test_config_upload_keys(self):
        cfg = os.path.join(self.dir, "ckptd.yaml")
        with open(cfg, "w") as f:
            f.write("upload:\n  concurrency: 2\n  max_rate: 50MiB\n  stores:\n"
                    "    - url: s3://bucket/prefix\n      endpoint: http://127.0.0.1:9000\n"
                    "      compress: zstd\n    - url: file:///mnt/nfs\n")
        run("config", "-c", cfg, check=0)
        with open(cfg, "w") as f:
            f.write("upload:\n  stores:\n    - url: s3://bucket/p\n    - url: ftp://x/y\n")
        p = run("config", "-c", cfg, check=2)
        self.assertIn("line 4", p.stderr)
        self.assertIn("upload.stores", p.stderr)
        with open(cfg, "w") as f:
            f.write("upload:\n  stores:\n    - url: s3://bucket/p\n      credentials: AKIA-literal\n")
        p = run("config", "-c", cfg, check=2)
        self.assertNotIn("AKIA-literal", p.stderr)
        with open(cfg, "w") as f:
            f.write("upload:\n  part_size: 1MiB\n")
        p = run("config", "-c", cfg, check=2)
        self.assertIn("upload.part_size", p.stderr)

    def test_bundle_command(self):
        tree = os.path.join(self.dir, "m")
        make(os.path.join(tree, "checkpoints", "b.bin"), 3 * MiB, 91)
        make(os.path.join(tree, "checkpoints", "a.bin"), 1000, 92)
        with open(os.path.join(tree, "metadata.yaml"), "w") as f:
            f.write("checkpoints: {}\n")
        os.makedirs(os.path.join(tree, ".ckptd"))
        with open(os.path.join(tree, ".ckptd", "state.db"), "w") as f:
            f.write("x")
        out = os.path.join(self.dir, "m.tar.zst")
        run("bundle", tree, "-o", out, check=0)
        with open(out, "rb") as f:
            self.assertEqual(f.read(4), b"\x28\xb5\x2f\xfd")  # zstd frame magic
        plain = os.path.join(self.dir, "m.tar")
        subprocess.run(["zstd", "-q", "-d", "-f", out, "-o", plain], check=True)
        with tarfile.open(plain) as t:
            names = [m.name for m in t.getmembers() if m.isfile()]
            self.assertEqual(names, ["checkpoints/a.bin", "checkpoints/b.bin", "metadata.yaml"])
            data = t.extractfile("checkpoints/b.bin").read()
        self.assertEqual(hashlib.sha256(data).hexdigest(),
                         sha256(os.path.join(tree, "checkpoints", "b.bin")))
        run("bundle", tree, check=2)


class Scan(TmpDirCase):
    """ckptd scan with upload.stores: the PMF tree goes out after metadata.yaml
    is written, metadata.yaml last; the scan's exit status reflects uploads."""

    def write_config(self, stores, extra=""):
        with open(os.path.join(self.dir, "train", "ckptd.yaml"), "w") as f:
            f.write("upload:\n  retries: 1\n  retry_base: 100ms\n" + extra + "  stores:\n")
            for st in stores:
                f.write("    - " + "\n      ".join(f"{k}: {v}" for k, v in st.items()) + "\n")

    def test_scan_uploads_the_tree_metadata_last(self):
        need("aws", "checking S3 uploads needs awscli")
        train = os.path.join(self.dir, "train")
        for e in (1, 2):
            write_old(os.path.join(train, "ckpts", f"epoch_{e}.pt"), os.urandom(300000 + e))
        write_old(os.path.join(train, "hparams.yaml"), b"lr: 0.01\n")
        write_old(os.path.join(train, "notes.txt"), b"not part of the tree\n")
        nfs = os.path.join(self.dir, "nfs")
        with S3Server(self.dir) as s3:
            self.write_config([{"url": "s3://ckpt/runs/r1", "endpoint": s3.endpoint},
                               {"url": "file://" + nfs}])
            p = run("scan", train, env=s3.env(), check=0)
            want = ["runs/r1/data/build_parameters.yaml", "runs/r1/data/checkpoints/epoch_1.pt",
                    "runs/r1/data/checkpoints/epoch_2.pt", "runs/r1/data/initialisation/README.md",
                    "runs/r1/hparams.yaml", "runs/r1/metadata.yaml"]
            self.assertEqual(s3.keys(), want, p.stderr)
            order = s3.stored_order()
            self.assertEqual(order[-1], "runs/r1/metadata.yaml")
            got = os.path.join(self.dir, "got")
            s3.get("runs/r1/metadata.yaml", got)
            self.assertEqual(sha256(got), sha256(os.path.join(train, "metadata.yaml")))
            s3.get("runs/r1/data/checkpoints/epoch_2.pt", got)
            self.assertEqual(sha256(got), sha256(os.path.join(train, "ckpts", "epoch_2.pt")))
            for rel in ("metadata.yaml", "hparams.yaml", "data/checkpoints/epoch_1.pt"):
                self.assertEqual(sha256(os.path.join(nfs, rel)), sha256(os.path.join(train, rel)))
            self.assertFalse(os.path.exists(os.path.join(nfs, "notes.txt")))
            # a second scan with nothing new sends nothing
            n = len(s3.stored_order())
            run("scan", train, env=s3.env(), check=0)
            self.assertEqual(len(s3.stored_order()), n)
            # a new checkpoint: it and the new metadata.yaml go, in that order
            write_old(os.path.join(train, "ckpts", "epoch_3.pt"), os.urandom(1000))
            run("scan", train, env=s3.env(), check=0)
            new = s3.stored_order()[n:]
            self.assertIn("runs/r1/data/checkpoints/epoch_3.pt", new)
            self.assertEqual(new[-1], "runs/r1/metadata.yaml")
            for unchanged in ("data/checkpoints/epoch_1.pt", "data/checkpoints/epoch_2.pt",
                              "hparams.yaml"):
                self.assertNotIn("runs/r1/" + unchanged, new)
            jobs = queue(os.path.join(train, ".ckptd"))
            self.assertEqual({j["state"] for j in jobs}, {"done"})

    def test_scan_to_webdav_records_the_sha256_registration_took(self):
        """The sidecar hashed every checkpoint when it registered it: the
        WebDAV upload records that SHA-256 without hashing the file again."""
        train = os.path.join(self.dir, "train")
        for e in (1, 2):
            write_old(os.path.join(train, "ckpts", f"epoch_{e}.pt"), os.urandom(300000 + e))
        with Nginx(self.dir) as web:
            self.write_config([{"url": web.url + "/runs/r1"}])
            p = run("scan", train, check=0)
            jobs = {j["key"]: j for j in queue(os.path.join(train, ".ckptd"))}
            for e in (1, 2):
                key = f"data/checkpoints/epoch_{e}.pt"
                self.assertEqual(jobs[key]["state"], "done", p.stderr)
                self.assertEqual(jobs[key]["sha256"],
                                 sha256(os.path.join(train, "ckpts", f"epoch_{e}.pt")))
                self.assertEqual(sha256(os.path.join(web.root, "runs", "r1", key)),
                                 sha256(os.path.join(train, "ckpts", f"epoch_{e}.pt")))

    def test_scan_to_s3_multipart_records_the_sha256_registration_took(self):
        """A multipart upload hashes its parts, never the whole file: the
        queue records the SHA-256 the sidecar took when it registered the
        checkpoint, as WebDAV does."""
        need("aws", "checking S3 uploads needs awscli")
        train = os.path.join(self.dir, "train")
        write_old(os.path.join(train, "ckpts", "epoch_1.pt"), os.urandom(11 * MiB + 5))
        with S3Server(self.dir) as s3:
            self.write_config([{"url": "s3://ckpt/r", "endpoint": s3.endpoint}],
                              "  multipart_threshold: 5MiB\n  part_size: 5MiB\n")
            p = run("scan", train, env=s3.env(), check=0)
            self.assertIn("parts_sent=3", p.stderr)
            jobs = {j["key"]: j for j in queue(os.path.join(train, ".ckptd"))}
            job = jobs["data/checkpoints/epoch_1.pt"]
            self.assertEqual((job["state"], job["sha256"]),
                             ("done", sha256(os.path.join(train, "ckpts", "epoch_1.pt"))))

    def test_scan_exit_status_reflects_failed_uploads(self):
        train = os.path.join(self.dir, "train")
        write_old(os.path.join(train, "epoch_1.pt"), os.urandom(1000))
        port = free_port()  # nothing listens there
        self.write_config([{"url": f"http://127.0.0.1:{port}/up"}])
        p = run("scan", train, check=1, timeout=90)
        self.assertIn("upload(s) failed", p.stderr)
        # the PMF tree itself was written; the uploads wait in the queue
        self.assertTrue(os.path.exists(os.path.join(train, "metadata.yaml")))
        p = run("queue", train, check=0)
        self.assertIn("failed", p.stdout)
        with Nginx(self.dir, port=port) as web:
            run("queue", "retry", "--all", train, check=0)
            run("queue", "run", train, check=0)
            self.assertEqual(sha256(os.path.join(web.root, "up", "metadata.yaml")),
                             sha256(os.path.join(train, "metadata.yaml")))
            self.assertTrue(os.path.exists(os.path.join(web.root, "up", "data", "checkpoints",
                                                        "epoch_1.pt")))

    def test_scan_bundle_store_packs_only_the_tree(self):
        train = os.path.join(self.dir, "train")
        write_old(os.path.join(train, "epoch_1.pt"), os.urandom(5000))
        write_old(os.path.join(train, "big_unrelated.bin"), os.urandom(5000))
        nfs = os.path.join(self.dir, "nfs")
        self.write_config([{"url": "file://" + nfs, "bundle": "true"}])
        run("scan", train, check=0)
        plain = os.path.join(self.dir, "b.tar")
        subprocess.run(["zstd", "-q", "-d", "-f", os.path.join(nfs, "train.tar.zst"), "-o", plain],
                       check=True)
        with tarfile.open(plain) as t:
            names = [m.name for m in t.getmembers() if m.isfile()]
        self.assertEqual(names[-1], "metadata.yaml")
        self.assertIn("data/checkpoints/epoch_1.pt", names)
        self.assertNotIn("big_unrelated.bin", names)
        self.assertNotIn("epoch_1.pt", names)


if __name__ == "__main__":
    unittest.main()
