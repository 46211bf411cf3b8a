"""A store that is down or wrong (issue 27): a scan gives up a store nobody
answers at after its retries, with one warning for the store (not one per
file and attempt), leaves its jobs queued for the next run and exits 1; a
4xx answer (but 408 and 429) is final at once. The real binary against
s3rver on loopback, or a port nothing listens on, or a host that does not
exist. Times are loose bounds measured here; line counts come from the log."""
import json
import os
import re
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptd_test import TmpDirCase, md5_file, run, write_old  # noqa: E402
from servers import S3Server, free_port  # noqa: E402

# a scan against a dead store must be over within this (the bound)
DEAD_STORE_SECONDS = 30
MAX_WARNINGS = 12
WARNING = re.compile(r"^\S+ (warn|error) ")

# keys for a store that never answers (nothing checks them)
NO_SERVER_ENV = {"AWS_ACCESS_KEY_ID": "CKPTDTESTKEY", "AWS_SECRET_ACCESS_KEY": "not-a-secret-x",
                 "AWS_EC2_METADATA_DISABLED": "true",
                 "AWS_CONFIG_FILE": "/nonexistent/ckptd-test", "AWS_SHARED_CREDENTIALS_FILE":
                 "/nonexistent/ckptd-test"}


def queue_states(tree):
    p = run("queue", "--json", tree, check=0)
    return [json.loads(line)["state"] for line in p.stdout.splitlines() if line.strip()]


class DeadStore(TmpDirCase):
    def tree(self, endpoint, bucket="ckpt"):
        tree = os.path.join(self.dir, "run")
        os.makedirs(tree)
        write_old(os.path.join(tree, "epoch_1.pt"), os.urandom(20000))
        with open(os.path.join(tree, "ckptd.yaml"), "w") as f:
            f.write(f"upload:\n  stores:\n    - url: s3://{bucket}/runs/r1\n"
                    f"      endpoint: {endpoint}\n")
        return tree

    def scan_dead(self, tree, quiet):
        t0 = time.monotonic()
        p = run("scan", *(["-q"] if quiet else []), tree, env=NO_SERVER_ENV,
                timeout=3 * DEAD_STORE_SECONDS)
        return p, time.monotonic() - t0

    def check_given_up(self, tree, why):
        # loud: every line that is not a warning or an error is fine, those are counted
        p, secs = self.scan_dead(tree, quiet=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertLess(secs, DEAD_STORE_SECONDS, p.stderr)
        warnings = [ln for ln in p.stderr.splitlines() if WARNING.match(ln)]
        self.assertLessEqual(len(warnings), MAX_WARNINGS, "\n".join(warnings))
        # one warning for the store, naming why, not one per file or attempt
        gone = [ln for ln in warnings if "upload.store_unreachable" in ln]
        self.assertEqual(len(gone), 1, p.stderr)
        self.assertIn(why, gone[0])
        # the checkpoint is registered; every upload stays queued, none counted failed
        self.assertTrue(os.path.exists(os.path.join(tree, "metadata.yaml")))
        states = queue_states(tree)
        self.assertTrue(states, "no jobs in the queue")
        self.assertEqual(set(states), {"pending"}, states)
        # -q: a cron line sees the one warning and the summary, nothing per attempt
        p, secs = self.scan_dead(tree, quiet=True)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertLess(secs, DEAD_STORE_SECONDS, p.stderr)
        lines = p.stderr.splitlines()
        self.assertLessEqual(len(lines), MAX_WARNINGS, p.stderr)
        self.assertEqual(sum("upload.store_unreachable" in ln for ln in lines), 1, p.stderr)
        self.assertNotIn("upload.retry", p.stderr)
        self.assertEqual(set(queue_states(tree)), {"pending"})

    def test_connection_refused_gives_up_the_store_and_keeps_the_jobs(self):
        port = free_port()  # nothing listens there
        tree = self.tree(f"http://127.0.0.1:{port}")
        self.check_given_up(tree, "Couldn't connect")
        # the store comes back: the next run sends everything that stayed queued
        with S3Server(self.dir, port=port) as s3:
            p = run("scan", tree, env=s3.env(), timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(set(queue_states(tree)), {"done"})
            got = os.path.join(self.dir, "got.pt")
            s3.get("runs/r1/data/checkpoints/epoch_1.pt", got)
            self.assertEqual(md5_file(got), md5_file(os.path.join(tree, "epoch_1.pt")))
            self.assertIn("runs/r1/metadata.yaml", s3.keys())

    def test_checkpoint_removed_while_queued_neither_fails_nor_holds_metadata(self):
        # a trainer's rotation removes a checkpoint whose upload waits for a
        # dead store (mirror_deletes drops its tree copy): that job is gone,
        # not failed, and metadata.yaml (which no longer lists it) is still sent
        port = free_port()
        tree = self.tree(f"http://127.0.0.1:{port}")
        write_old(os.path.join(tree, "epoch_2.pt"), os.urandom(20000))
        with open(os.path.join(tree, "ckptd.yaml"), "a") as f:
            f.write("checkpoints:\n  mirror_deletes: true\n")
        p, _ = self.scan_dead(tree, quiet=True)
        self.assertEqual(p.returncode, 1, p.stderr)
        os.unlink(os.path.join(tree, "epoch_2.pt"))
        p, _ = self.scan_dead(tree, quiet=False)
        self.assertEqual(p.returncode, 1, p.stderr)  # the store is still down
        self.assertNotIn("upload.failed", p.stderr)
        self.assertIn("upload.source_gone", p.stderr)
        jobs = {j["key"]: j["state"] for j in map(json.loads, filter(
            str.strip, run("queue", "--json", tree).stdout.splitlines()))}
        self.assertEqual(jobs["data/checkpoints/epoch_2.pt"], "gone", jobs)
        self.assertIn("1 gone", run("queue", tree).stdout)
        with S3Server(self.dir, port=port) as s3:
            p = run("scan", tree, env=s3.env(), timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(set(queue_states(tree)), {"done", "gone"})
            keys = s3.keys()
            self.assertIn("runs/r1/data/checkpoints/epoch_1.pt", keys)
            self.assertNotIn("runs/r1/data/checkpoints/epoch_2.pt", keys)
            got = os.path.join(self.dir, "metadata.yaml")
            s3.get("runs/r1/metadata.yaml", got)
            with open(got, "rb") as a, open(os.path.join(tree, "metadata.yaml"), "rb") as b:
                remote = a.read()
                self.assertEqual(remote, b.read())
            self.assertIn(b"epoch_1.pt", remote)
            self.assertNotIn(b"epoch_2.pt", remote)
        # the file comes back (restored by hand): queued and sent again
        write_old(os.path.join(tree, "epoch_2.pt"), os.urandom(20000))
        with S3Server(self.dir, port=port) as s3:
            p = run("scan", tree, env=s3.env(), timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("runs/r1/data/checkpoints/epoch_2.pt", s3.keys())

    def test_unknown_host_gives_up_the_store(self):
        tree = self.tree("http://ckptd-no-such-host.invalid:9000")
        self.check_given_up(tree, "resolve host")

    def test_no_such_bucket_is_final_at_once(self):
        with S3Server(self.dir) as s3:
            tree = self.tree(s3.endpoint, bucket="no-such-bucket")
            t0 = time.monotonic()
            p = run("scan", tree, env=s3.env(), timeout=120)
            secs = time.monotonic() - t0
            self.assertEqual(p.returncode, 1, p.stderr)
            # never retried: not by the request, not by a later round of this run
            self.assertNotIn("upload.retry", p.stderr)
            self.assertNotIn("will retry", p.stderr)
            failed = [ln for ln in p.stderr.splitlines() if "upload.failed" in ln]
            self.assertTrue(failed, p.stderr)
            self.assertTrue(all("NoSuchBucket" in ln for ln in failed), failed)
            self.assertLess(secs, DEAD_STORE_SECONDS, p.stderr)
            # the data jobs failed for good with their first attempt; metadata.yaml
            # waits behind them (never sent before its data)
            jobs = [json.loads(line) for line in run("queue", "--json", tree).stdout.splitlines()
                    if line.strip()]
            failed = [j for j in jobs if j["state"] == "failed"]
            self.assertEqual(len(failed), len(jobs) - 1, jobs)
            self.assertEqual({j["attempts"] for j in failed}, {1}, jobs)
            self.assertEqual([j["key"] for j in jobs if j["state"] != "failed"], ["metadata.yaml"])


if __name__ == "__main__":
    unittest.main()
