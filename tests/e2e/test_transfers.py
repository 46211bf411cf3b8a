"""Several files in flight (upload.transfers, issue 17), against s3rver behind
a recording proxy (servers.FlakyProxy): how many requests the server saw at
once and when each began and ended come from the proxy, what landed from the
aws CLI and hashlib. metadata.yaml still goes last; kill -9 and SIGTERM with
several jobs running keep the queue's guarantees.
"""
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, run  # noqa: E402
from servers import FlakyProxy, S3Server, need  # noqa: E402

MiB = 1 << 20


def make(path, size, seed):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    block = hashlib.sha256(str(seed).encode()).digest() * (MiB // 32)
    with open(path, "wb") as f:
        for i in range(size // MiB):
            f.write(hashlib.sha256(b"%d-%d" % (seed, i)).digest() + block[32:])
        f.write(block[: size % MiB])
    return path


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class Transfers(TmpDirCase):
    def setUp(self):
        super().setUp()
        need("aws", "checking S3 uploads needs awscli")
        self.s3 = S3Server(self.dir)
        self.addCleanup(self.s3.stop)
        self.proxy = FlakyProxy(self.s3.port, [])
        self.addCleanup(self.proxy.stop)
        self.env = self.s3.env()
        self.state = os.path.join(self.dir, "state")

    def args(self, *extra):
        return ["upload", "--no-progress", "--state", self.state, "--endpoint", self.proxy.url,
                *extra]

    def upload(self, *extra, check=None):
        return run(*self.args(*extra), env=self.env, check=check, timeout=170)

    def queue(self):
        p = run("queue", "--json", "--state", self.state, check=0)
        return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]

    def tree(self, n, size, seed=0):
        """A PMF-shaped tree: n data files, build parameters, metadata.yaml."""
        t = os.path.join(self.dir, "model")
        for i in range(n):
            make(os.path.join(t, "data", "checkpoints", f"shard-{i:02d}.bin"), size, seed + i)
        make(os.path.join(t, "data", "build_parameters.yaml"), 100, seed + 99)
        with open(os.path.join(t, "metadata.yaml"), "w") as f:
            f.write("checkpoints: {}\n")
        return t

    def assert_tree_landed(self, tree, prefix):
        got = os.path.join(self.dir, "got")
        self.s3.aws("s3", "cp", "--recursive", "--no-progress", f"s3://ckpt/{prefix}", got)
        for d, _, names in os.walk(tree):
            for n in names:
                rel = os.path.relpath(os.path.join(d, n), tree)
                self.assertEqual(sha256(os.path.join(got, rel)), sha256(os.path.join(d, n)), rel)

    def puts(self):
        return [t for t in self.proxy.timeline if t[0] == "PUT"]

    def test_files_in_flight_follow_transfers(self):
        src = os.path.join(self.dir, "hf")
        for i in range(8):
            make(os.path.join(src, f"model-{i:05d}-of-00008.safetensors"), MiB + i, i)
        # a cap keeps every PUT on the wire long enough to overlap
        # transfers counts bodies (PUTs) in flight; each file's tail (its HEAD)
        # may run beside the next body, so at most twice as many requests
        p = self.upload("--transfers", "1", "--max-rate", "8MiB", src, "s3://ckpt/one")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.proxy.max_puts, 1)
        self.assertLessEqual(self.proxy.max_inflight, 2)
        self.proxy.max_inflight = self.proxy.max_puts = 0
        p = self.upload("--transfers", "4", "--max-rate", "8MiB", src, "s3://ckpt/four")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.proxy.max_puts, 4)
        self.assertLessEqual(self.proxy.max_inflight, 8)
        got = os.path.join(self.dir, "got")
        self.s3.aws("s3", "cp", "--recursive", "--no-progress", "s3://ckpt/four", got)
        for n in os.listdir(src):
            self.assertEqual(sha256(os.path.join(got, n)), sha256(os.path.join(src, n)))

    def test_a_files_tail_runs_beside_the_next_body(self):
        # the server takes 0.4 s to answer each HEAD (the size and ETag check
        # after a PUT): with one transfer, the next file's PUT goes meanwhile
        def slow_head(method, path, headers):
            if method == "HEAD":
                time.sleep(0.4)
            return None
        self.proxy.gate = slow_head
        src = os.path.join(self.dir, "hf")
        for i in range(4):
            make(os.path.join(src, f"f{i}.bin"), MiB + i, 40 + i)
        p = self.upload("--transfers", "1", src, "s3://ckpt/h")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.proxy.max_puts, 1)
        heads = [(s, e) for m, _, s, e in self.proxy.timeline if m == "HEAD"]
        self.assertEqual(len(heads), 4)
        beside = [(path, s, e) for m, path, s, e in self.puts()
                  if any(s < he and e > hs for hs, he in heads)]
        self.assertTrue(beside, self.proxy.timeline)
        got = os.path.join(self.dir, "got")
        self.s3.aws("s3", "cp", "--recursive", "--no-progress", "s3://ckpt/h", got)
        for n in os.listdir(src):
            self.assertEqual(sha256(os.path.join(got, n)), sha256(os.path.join(src, n)))

    def test_default_is_four_and_config_key(self):
        src = os.path.join(self.dir, "hf")
        for i in range(6):
            make(os.path.join(src, f"f{i}.bin"), MiB, i)
        # slow enough (each of the 4 bodies takes about a second) that the 4th
        # starts before the 1st ends even on a loaded machine
        p = self.upload("--max-rate", "4MiB", src, "s3://ckpt/d")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.proxy.max_puts, 4)
        cfg = os.path.join(self.dir, "ckptd.yaml")
        with open(cfg, "w") as f:
            f.write("upload:\n  transfers: 2\n  max_rate: 4MiB\n")
        self.proxy.max_puts = 0
        p = self.upload("-c", cfg, src, "s3://ckpt/c")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.proxy.max_puts, 2)
        with open(cfg, "w") as f:
            f.write("upload:\n  transfers: 0\n")
        p = self.upload("-c", cfg, src, "s3://ckpt/c")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("upload.transfers", p.stderr)

    def test_metadata_last_with_parallel_transfers(self):
        tree = self.tree(7, 2 * MiB + 5)
        p = self.upload("--transfers", "4", "--max-rate", "16MiB", tree, "s3://ckpt/m")
        self.assertEqual(p.returncode, 0, p.stderr)
        data_ends = [e for m, path, s, e in self.proxy.timeline
                     if m == "PUT" and "/m/data/" in path]
        meta_starts = [s for m, path, s, e in self.proxy.timeline if "/m/metadata.yaml" in path]
        self.assertEqual(len(data_ends), 8)
        self.assertTrue(meta_starts)
        self.assertGreater(min(meta_starts), max(data_ends))
        self.assertGreater(self.proxy.max_inflight, 1)
        self.assert_tree_landed(tree, "m")

    def test_connections_are_reused_across_parts_and_files(self):
        # 2 files of 9 parts, 2 in flight with 4 parts each, and a tail
        # request each beside them: at most 10 requests at once, so 10
        # connections serve every request (libcurl's default pool of 5 closed
        # most after one part each)
        tree = os.path.join(self.dir, "shards")
        for i in range(2):
            make(os.path.join(tree, f"s{i}.bin"), 40 * MiB + 7, 30 + i)
        p = self.upload("--transfers", "2", "--concurrency", "4", "--part-size", "5MiB",
                        "--multipart-threshold", "5MiB", tree, "s3://ckpt/c")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assert_tree_landed(tree, "c")
        self.assertGreaterEqual(len(self.proxy.requests), 2 * (1 + 9 + 1))
        self.assertLessEqual(len(self.proxy.clients), 2 * (4 + 1), self.proxy.requests)

    def test_kill_9_with_several_jobs_running_resumes(self):
        tree = self.tree(4, 12 * MiB + 7, seed=10)
        args = self.args("--transfers", "4", "--concurrency", "2", "--part-size", "5MiB",
                         "--multipart-threshold", "5MiB", "--max-rate", "6MiB", tree, "s3://ckpt/k")
        proc = subprocess.Popen([CKPTD, *args], env=dict(os.environ, **self.env),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        running = 0
        while time.time() < deadline:
            jobs = self.queue()
            running = sum(j["state"] == "running" for j in jobs)
            parts = len(re.findall(r"Stored part \d+", open(os.path.join(self.dir, "s3rver.log")).read()))
            if running >= 2 and parts >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.assertGreaterEqual(running, 2)
        before = len(re.findall(r"Stored part \d+", open(os.path.join(self.dir, "s3rver.log")).read()))
        p = self.upload("--transfers", "4", "--concurrency", "2", "--part-size", "5MiB",
                        "--multipart-threshold", "5MiB", tree, "s3://ckpt/k")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual({j["state"] for j in self.queue()}, {"done"})
        self.assert_tree_landed(tree, "k")
        # parts accepted before the kill were not sent again: 4 files of 3 parts,
        # plus at most the parts in flight at the kill (4 transfers x 2)
        after = len(re.findall(r"Stored part \d+", open(os.path.join(self.dir, "s3rver.log")).read()))
        self.assertLessEqual(after, 4 * 3 + 1 + 4 * 2)  # +1: metadata.yaml's one part
        self.assertGreater(before, 0)
        self.assertIn("upload.resume", p.stderr)

    def test_sigterm_with_several_jobs_running_keeps_the_rest_queued(self):
        tree = self.tree(8, 2 * MiB, seed=20)
        cfg = os.path.join(self.dir, "ckptd.yaml")
        with open(cfg, "w") as f:
            f.write("upload:\n  grace: 300ms\n  max_rate: 2MiB\n  transfers: 3\n")
        proc = subprocess.Popen([CKPTD, *self.args("-c", cfg, tree, "s3://ckpt/t")],
                                env=dict(os.environ, **self.env), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 30
        while time.time() < deadline and sum(j["state"] == "running" for j in self.queue()) < 2:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn("kept in the queue", err)
        states = [j["state"] for j in self.queue()]
        self.assertNotIn("running", states)
        self.assertIn("pending", states)
        keys = self.s3.keys()
        self.assertNotIn("t/metadata.yaml", keys)
        p = self.upload(tree, "s3://ckpt/t")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual({j["state"] for j in self.queue()}, {"done"})
        self.assert_tree_landed(tree, "t")


if __name__ == "__main__":
    unittest.main()
