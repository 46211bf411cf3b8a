"""Metrics that count (issue 27): every counter and gauge docs/metrics.md documents
is moved by a real event and read back, from the textfile of `ckptd scan
--metrics-file` and from /metrics of `ckptd watch --listen`. The expected
values come from what the test did (files written, checkpoints damaged,
objects the S3 server stored, events the exec hook saw), not from ckptd's
log. The last case walks docs/metrics.md's table: a documented metric that no
case here drives fails it."""
import inspect
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
from ckptd_test import CKPTD, TmpDirCase, run, terminate, write_old  # noqa: E402
from servers import Nginx, S3Server, need  # noqa: E402
from webhook_receiver import Receiver  # noqa: E402
from test_sidecar import GRAPH, weights, write_ckpt  # noqa: E402

import numpy as np  # noqa: E402

METRICS_DOC = os.path.join(HERE, "..", "..", "docs", "metrics.md")
WAIT = 120  # seconds for the watcher's /metrics to reach what a scan reaches at once


def samples(text):
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def s3_stored(s3):
    """Every object s3rver stored, in order, from its own log (one line per PUT)."""
    with open(os.path.join(s3.tmp, "s3rver.log"), errors="replace") as f:
        return re.findall(r'Stored object "([^"]+)" in bucket', f.read())


class Watch:
    """ckptd watch --listen on a free port; read() scrapes /metrics."""

    def __init__(self, case, tree, env):
        self.port = free_port()
        self.log = open(os.path.join(case.dir, "watch-%d.log" % self.port), "w+")
        self.p = subprocess.Popen([CKPTD, "watch", "--listen", f"127.0.0.1:{self.port}", tree],
                                  stdout=self.log, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, **env))
        case.addCleanup(self.stop)

    def read(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                return samples(r.read().decode())
        except OSError:
            return None

    def until(self, case, what, check):
        """Scrapes until check(samples) holds; its last failure otherwise."""
        end = time.monotonic() + WAIT
        last = None
        while time.monotonic() < end:
            m = self.read()
            if m is not None:
                try:
                    check(m)
                    return m
                except AssertionError as e:
                    last = e
            if self.p.poll() is not None:
                break
            time.sleep(0.2)
        self.log.seek(0)
        case.fail(f"/metrics never showed {what}: {last}\n{self.log.read()[-6000:]}")

    def stop(self):
        terminate(self.p)
        self.log.close()


class Metrics(TmpDirCase):
    # ---- the pipeline: pack, verify, upload, exec hooks, webhooks ----

    def pipeline_tree(self, name, s3, ok):
        """Four checkpoints: two good, one with a NaN weight (fails
        verification, held back), one without fc2.bias (cannot be packed)."""
        tree = os.path.join(self.dir, name)
        events = os.path.join(self.dir, name + "-events")
        os.makedirs(events)
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 12)
        np.save(os.path.join(self.dir, "x.npy"), x)
        sizes = 0
        for e in (1, 2, 3, 4):
            a = weights(e)
            if e == 3:
                a["fc2.weight"][1, 2] = np.nan
            if e == 4:
                del a["fc2.bias"]
            path = os.path.join(tree, "ckpts", f"epoch_{e}.safetensors")
            write_ckpt(path, a)
            sizes += os.path.getsize(path)
        with open(os.path.join(tree, "ckptd.yaml"), "w") as f:
            f.write("pack:\n  formats: [mldef]\n" + GRAPH)
            f.write("verify:\n  inputs: [%s]\n  atol: 1e-5\n  on_failure: hold\n"
                    % os.path.join(self.dir, "x.npy"))
            f.write("upload:\n  retries: 1\n  retry_base: 100ms\n  stores:\n"
                    f"    - url: s3://ckpt/{name}\n      endpoint: {s3.endpoint}\n")
            f.write("hooks:\n  exec:\n"
                    f"    - event: \"*\"\n      command: \"cat > {events}/$$.json\"\n"
                    "    - event: training.started\n      command: \"exit 3\"\n"
                    "    - event: training.started\n      command: \"sleep 30\"\n"
                    "      timeout: 1s\n"
                    "  webhooks:\n"
                    f"    - url: {ok.url}\n      secret: env:CK_WH\n"
                    "      events: [checkpoint.registered]\n")
        return tree, events, sizes

    def pipeline_checks(self, m, tree, events, sizes, s3, prefix, t0):
        n_events = len(os.listdir(events))
        stored = [k for k in s3_stored(s3) if k.startswith(prefix + "/")]
        eq = self.assertEqual
        eq(m["ckptd_checkpoints_registered_total"], 4)
        eq(m["ckptd_checkpoints"], 4)
        # the four checkpoint files, and the tree's few small files beside them
        self.assertGreaterEqual(m["ckptd_hashed_bytes_total"], sizes)
        self.assertLess(m["ckptd_hashed_bytes_total"], sizes + 64 * 1024)
        eq(m["ckptd_archives_packed_total"], 3)
        eq(m['ckptd_failures_total{stage="pack"}'], 1)
        eq(m['ckptd_verifications_total{result="passed"}'], 2)
        eq(m['ckptd_verifications_total{result="failed"}'], 1)
        eq(m['ckptd_failures_total{stage="verify"}'], 1)
        # every object the server stored is one completed upload, and its time observed
        self.assertTrue(any(k.endswith("/metadata.yaml") for k in stored), stored)
        eq(m['ckptd_uploads_total{result="completed"}'], len(stored))
        eq(m["ckptd_upload_duration_seconds_count"], len(stored))
        eq(m['ckptd_uploads_total{result="failed"}'], 0)
        eq(m['ckptd_failures_total{stage="upload"}'], 0)
        eq(m["ckptd_upload_queue_depth"], 0)
        # the bytes: at least what the store holds now (the watcher sends some files twice)
        held = sum(os.path.getsize(os.path.join(s3.dir, "ckpt", f))
                   for f in self.s3_files(s3, prefix))
        self.assertGreaterEqual(m["ckptd_uploaded_bytes_total"], held)
        remote = m["ckptd_newest_remote_checkpoint_timestamp_seconds"]
        self.assertGreater(remote, t0 - 600)
        self.assertLessEqual(remote, time.time() + 1)
        if prefix == "scanned":
            # the textfile: read long after it is written, so no age frozen in it;
            # PromQL computes it from the timestamp
            self.assertNotIn("ckptd_newest_remote_checkpoint_age_seconds", m)
        else:
            # the endpoint: the age computed when scraped
            self.assertLessEqual(abs(m["ckptd_newest_remote_checkpoint_age_seconds"]
                                     - (time.time() - remote)), 10)
        newest = m["ckptd_newest_checkpoint_timestamp_seconds"]
        self.assertTrue(t0 - 600 < newest <= time.time() + 1, newest)
        # every event reached the "*" exec hook once; the two others ran on training.started
        eq(m["ckptd_events_total"], n_events)
        eq(m['ckptd_exec_hooks_total{result="ok"}'], n_events)
        eq(m['ckptd_exec_hooks_total{result="failed"}'], 1)
        eq(m['ckptd_exec_hooks_total{result="timeout"}'], 1)
        # four registrations delivered
        eq(m['ckptd_webhook_deliveries_total{result="delivered"}'], 4)
        eq(m['ckptd_webhook_deliveries_total{result="attempt_failed"}'], 0)
        eq(m["ckptd_webhooks_failing"], 0)
        eq(m["ckptd_hook_outbox_depth"], 0)
        eq(m['ckptd_failures_total{stage="hook"}'], 1 + 1)
        for stage in ("scan", "hash", "metadata"):
            eq(m['ckptd_failures_total{stage="%s"}' % stage], 0)
        self.assertTrue(t0 - 5 <= m["ckptd_start_time_seconds"] <= time.time())
        eq(len([k for k in m if k.startswith("ckptd_build_info{")]), 1)

    def s3_files(self, s3, prefix):
        root = os.path.join(s3.dir, "ckpt")
        out = []
        for d, _, files in os.walk(os.path.join(root, prefix)):
            for f in files:
                if f.endswith("._S3rver_object"):
                    out.append(os.path.relpath(os.path.join(d, f), root))
        return out

    def test_pipeline_counters_in_the_textfile_and_on_the_endpoint(self):
        need("node", "S3 tests need node")
        env = {"CK_WH": "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk="}
        ok = Receiver(self.dir)
        self.addCleanup(ok.stop)
        with S3Server(os.path.join(self.dir)) as s3:
            env.update(s3.env())
            # cron: one scan, the textfile
            t0 = time.time()
            tree, events, sizes = self.pipeline_tree("scanned", s3, ok)
            prom = os.path.join(self.dir, "ckptd.prom")
            p = run("scan", "--metrics-file", prom, tree, env=env, timeout=300)
            with open(prom) as f:
                m = samples(f.read())
            try:
                self.pipeline_checks(m, tree, events, sizes, s3, "scanned", t0)
            except AssertionError as e:
                raise AssertionError(f"{e}\n{p.stderr[-6000:]}")
            # the sidecar: the same tree, /metrics
            ok2 = Receiver(self.dir)
            self.addCleanup(ok2.stop)
            t0 = time.time()
            tree, events, sizes = self.pipeline_tree("watched", s3, ok2)
            w = Watch(self, tree, env)
            w.until(self, "the pipeline's counts",
                    lambda m: self.pipeline_checks(m, tree, events, sizes, s3, "watched", t0))

    # ---- removals, and the failures of scan, hash, metadata, upload ----

    def test_failures_and_removals_in_the_textfile_and_on_the_endpoint(self):
        need("node", "S3 tests need node")
        env = {"CK_WH": "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk="}
        with S3Server(self.dir) as s3:
            env.update(s3.env())
            rx = Receiver(self.dir, statuses=[500] * 1000)
            self.addCleanup(rx.stop)
            for mode in ("scan", "watch"):
                with self.subTest(mode=mode):
                    self.failures_case(mode, s3, rx, env)

    def failures_case(self, mode, s3, rx, env):
        tree = os.path.join(self.dir, mode)
        os.makedirs(tree)
        with open(os.path.join(tree, "ckptd.yaml"), "w") as f:
            f.write("checkpoints:\n  mirror_deletes: true\n"
                    "watch:\n  reconcile_interval: 1s\n  settle: 100ms\n"
                    "upload:\n  retries: 0\n  stores:\n"
                    f"    - url: s3://no-such-bucket/{mode}\n      endpoint: {s3.endpoint}\n"
                    "hooks:\n  retry_schedule: [0s]\n  failing_after: 2\n  webhooks:\n"
                    f"    - url: {rx.url}\n      secret: env:CK_WH\n"
                    "      events: [training.started]\n")
        prom = os.path.join(self.dir, mode + ".prom")
        w = Watch(self, tree, env) if mode == "watch" else None

        def step(what, check):
            if w:
                return w.until(self, what, check)
            p = run("scan", "--metrics-file", prom, tree, env=env, timeout=120)
            with open(prom) as f:
                m = samples(f.read())
            try:
                check(m)
            except AssertionError as e:
                raise AssertionError(f"{what}: {e}\n{p.stderr[-4000:]}")
            return m

        eq = self.assertEqual
        for e in (1, 2):
            write_old(os.path.join(tree, f"epoch_{e}.pt"), os.urandom(10000 * e))

        def registered(m):
            eq(m["ckptd_checkpoints_registered_total"], 2)
            jobs = [json.loads(x) for x in run("queue", "--json", tree).stdout.splitlines() if x]
            failed = [j for j in jobs if j["state"] == "failed"]
            # the bucket does not exist: each data job failed once, for good
            self.assertTrue(failed)
            eq(m['ckptd_uploads_total{result="failed"}'], len(failed))
            eq(m['ckptd_failures_total{stage="upload"}'], len(failed))
        step("two registrations, failed uploads", registered)
        os.unlink(os.path.join(tree, "epoch_2.pt"))

        def removed(m):
            eq(m["ckptd_checkpoints_unregistered_total"], 1)
            eq(m["ckptd_checkpoints"], 1)
            # the receiver answers 500: training.started tried twice (a scan tries
            # once per run), given up, the receiver marked failing; a given-up
            # delivery is a hook failure
            eq(m['ckptd_webhook_deliveries_total{result="attempt_failed"}'], 2)
            eq(m['ckptd_webhook_deliveries_total{result="gave_up"}'], 1)
            eq(m["ckptd_webhooks_failing"], 1)
            eq(m["ckptd_hook_outbox_depth"], 0)
            eq(m['ckptd_failures_total{stage="hook"}'], 1)
            self.assertEqual(len(rx.requests()), 2 * (1 + (mode == "watch")))
        step("a removal, a delivery given up", removed)
        # two sources of one name: a problem of the scan
        write_old(os.path.join(tree, "a", "epoch_7.pt"), b"a" * 100)
        write_old(os.path.join(tree, "b", "epoch_7.pt"), b"b" * 100)
        step("a scan failure", lambda m: self.assertGreaterEqual(
            m['ckptd_failures_total{stage="scan"}'], 1))
        shutil.rmtree(os.path.join(tree, "b"))
        # the tree's copy of epoch_1 replaced by a symlink: it cannot be hashed
        link = os.path.join(tree, "data", "checkpoints", "epoch_1.pt")
        other = os.path.join(self.dir, mode + "-other.pt")
        write_old(other, os.urandom(5000))
        os.unlink(link)
        os.symlink(other, link)
        step("a hash failure", lambda m: self.assertGreaterEqual(
            m['ckptd_failures_total{stage="hash"}'], 1))
        # metadata.yaml that is not YAML: left alone, counted
        with open(os.path.join(tree, "metadata.yaml"), "w") as f:
            f.write("model: [unclosed\n")
        os.utime(os.path.join(tree, "epoch_1.pt"))
        step("a metadata failure", lambda m: self.assertGreaterEqual(
            m['ckptd_failures_total{stage="metadata"}'], 1))
        if w:
            w.stop()

    # ---- ckptd_upload_queue_depth while an upload runs ----

    def test_queue_depth_while_an_upload_runs(self):
        """ckptd_upload_queue_depth while a transfer runs and after; ckptd_hook_outbox_depth
        with a delivery waiting for its retry."""
        # a receiver nobody answers at, tried again in an hour: a delivery per registration waits
        dead_hook = (f"hooks:\n  retry_schedule: [1h]\n  webhooks:\n"
                     f"    - url: http://127.0.0.1:{free_port()}/h\n      secret: env:CK_WH\n"
                     "      events: [checkpoint.registered]\n")
        env = {"CK_WH": "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk="}
        with Nginx(self.dir) as web:
            tree = os.path.join(self.dir, "run")
            os.makedirs(tree)
            with open(os.path.join(tree, "ckptd.yaml"), "w") as f:
                # one transfer: what is queued behind the one being sent waits for it
                f.write(f"upload:\n  max_rate: 200KiB\n  transfers: 1\n"
                        f"  stores:\n    - url: {web.url}/r\n" + dead_hook)
            w = Watch(self, tree, env)
            meta = os.path.join(web.root, "r", "metadata.yaml")

            def names(ref):
                if not os.path.exists(meta):
                    return False
                with open(meta) as f:
                    return ref in f.read()
            # a small first checkpoint: the tree's files go, the queue empties
            write_old(os.path.join(tree, "epoch_1.pt"), os.urandom(1000))
            w.until(self, "an empty queue after the first checkpoint", lambda m: (
                self.assertEqual(m["ckptd_upload_queue_depth"], 0), self.assertTrue(names("epoch_1"))))
            # the second takes seconds at this cap, and no other job of its round
            # ends before it: meanwhile it and metadata.yaml naming it (queued
            # when it is registered, while it is sent) are the queue
            write_old(os.path.join(tree, "epoch_2.pt"), os.urandom(2500000))
            seen = {}

            def at_least_two(m):
                self.assertGreaterEqual(m["ckptd_upload_queue_depth"], 2)
                seen["depth"] = m["ckptd_upload_queue_depth"]
            w.until(self, "upload jobs while the checkpoint is sent", at_least_two)
            self.assertFalse(names("epoch_2"))
            # a third checkpoint queued behind the transfer: the gauge shows it
            # while the second is still being sent, not when that transfer ends
            write_old(os.path.join(tree, "epoch_3.pt"), os.urandom(1000))
            w.until(self, "the third checkpoint's job while the second is sent",
                    lambda m: self.assertGreater(m["ckptd_upload_queue_depth"], seen["depth"]))
            self.assertFalse(names("epoch_2"), "the second checkpoint landed before the "
                             "gauge showed the third: the transfer was too short to tell")
            w.until(self, "an empty queue once they landed", lambda m: (
                self.assertEqual(m["ckptd_upload_queue_depth"], 0),
                self.assertEqual(m["ckptd_hook_outbox_depth"], 3),
                self.assertTrue(names("epoch_3"))))
        # the textfile: what is left when the scan ends (a store nobody answers at)
        tree2 = os.path.join(self.dir, "cron")
        write_old(os.path.join(tree2, "epoch_1.pt"), os.urandom(1000))
        with open(os.path.join(tree2, "ckptd.yaml"), "w") as f:
            f.write(f"upload:\n  stores:\n    - url: http://127.0.0.1:{free_port()}/r\n"
                    + dead_hook)
        prom = os.path.join(self.dir, "cron.prom")
        run("scan", "--metrics-file", prom, tree2, timeout=120, check=1, env=env)
        jobs = [json.loads(x) for x in run("queue", "--json", tree2).stdout.splitlines() if x]
        with open(prom) as f:
            m = samples(f.read())
        self.assertEqual(m["ckptd_upload_queue_depth"],
                         len([j for j in jobs if j["state"] == "pending"]))
        self.assertGreater(m["ckptd_upload_queue_depth"], 0)
        self.assertEqual(m["ckptd_hook_outbox_depth"], 1)

    # ---- docs/metrics.md's list ----

    # Which case drives each documented series. Cases elsewhere are named
    # "file.Class.test_name"; the walker checks the case exists and names the series.
    DRIVEN = {
        "ckptd_checkpoints_registered_total": ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        "ckptd_checkpoints_unregistered_total": ["test_failures_and_removals_in_the_textfile_and_on_the_endpoint"],
        "ckptd_checkpoints_deleted_total": ["test_retention.Retention.test_min_free_tmpfs"],
        "ckptd_disk_free_bytes": ["test_retention.Retention.test_min_free_tmpfs"],
        "ckptd_nodes_parts_missing": ["test_nodes_commit.Watchers.watchers_commit"],
        "ckptd_nodes_steps_committed_total": ["test_nodes_commit.Watchers.watchers_commit"],
        "ckptd_checkpoints": ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        "ckptd_newest_checkpoint_timestamp_seconds": ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        "ckptd_hashed_bytes_total": ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        "ckptd_archives_packed_total": ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        'ckptd_verifications_total{result="passed"}': ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        'ckptd_verifications_total{result="failed"}': ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        'ckptd_uploads_total{result="completed"}': ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        'ckptd_uploads_total{result="failed"}': ["test_failures_and_removals_in_the_textfile_and_on_the_endpoint"],
        "ckptd_uploaded_bytes_total": ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        "ckptd_upload_duration_seconds": ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        "ckptd_upload_queue_depth": ["test_queue_depth_while_an_upload_runs"],
        "ckptd_newest_remote_checkpoint_timestamp_seconds": ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        "ckptd_newest_remote_checkpoint_age_seconds": ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        "ckptd_events_total": ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        'ckptd_webhook_deliveries_total{result="delivered"}': ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        'ckptd_webhook_deliveries_total{result="attempt_failed"}': ["test_failures_and_removals_in_the_textfile_and_on_the_endpoint"],
        'ckptd_webhook_deliveries_total{result="gave_up"}': ["test_failures_and_removals_in_the_textfile_and_on_the_endpoint"],
        "ckptd_hook_outbox_depth": ["test_queue_depth_while_an_upload_runs"],
        "ckptd_webhooks_failing": ["test_failures_and_removals_in_the_textfile_and_on_the_endpoint"],
        'ckptd_exec_hooks_total{result="ok"}': ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        'ckptd_exec_hooks_total{result="failed"}': ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        'ckptd_exec_hooks_total{result="timeout"}': ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        'ckptd_failures_total{stage="scan"}': ["test_failures_and_removals_in_the_textfile_and_on_the_endpoint"],
        'ckptd_failures_total{stage="hash"}': ["test_failures_and_removals_in_the_textfile_and_on_the_endpoint"],
        'ckptd_failures_total{stage="metadata"}': ["test_failures_and_removals_in_the_textfile_and_on_the_endpoint"],
        'ckptd_failures_total{stage="pack"}': ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        'ckptd_failures_total{stage="verify"}': ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        'ckptd_failures_total{stage="upload"}': ["test_failures_and_removals_in_the_textfile_and_on_the_endpoint"],
        'ckptd_failures_total{stage="hook"}': ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint",
                                               "test_failures_and_removals_in_the_textfile_and_on_the_endpoint"],
        "ckptd_start_time_seconds": ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
        # the watcher's (endpoint) and the cron run's (textfile, across runs and after a failure)
        "ckptd_last_success_timestamp_seconds": ["test_production.CronMetrics.test_endpoint_passes_promtool",
                                                 "test_production.CronMetrics.test_textfile_counters_are_cumulative_across_runs"],
        "ckptd_build_info": ["test_pipeline_counters_in_the_textfile_and_on_the_endpoint"],
    }

    def documented(self):
        """docs/metrics.md's metric table, label alternatives expanded."""
        with open(METRICS_DOC) as f:
            text = f.read()
        out = []
        for m in re.finditer(r"^\| `(ckptd_[a-z_]+)(\{([a-z_]+)=([^}]*)\})?` \|", text, re.M):
            name, label, alts = m.group(1), m.group(3), m.group(4)
            if not label or alts == '"..."':
                out.append(name)
                continue
            for v in re.findall(r'"([a-z_]+)"', alts):
                out.append(f'{name}{{{label}="{v}"}}')
        return out

    def endpoint_only(self):
        """The series the table says only /metrics has (an age computed when scraped)."""
        with open(METRICS_DOC) as f:
            return set(re.findall(r"^\| `(ckptd_[a-z_]+)` \| [a-z]+ \| `/metrics` only", f.read(),
                                  re.M))

    def test_every_documented_metric_is_driven(self):
        documented = self.documented()
        self.assertGreater(len(documented), 30, documented)
        missing = [s for s in documented if s not in self.DRIVEN]
        self.assertEqual(missing, [], "documented metrics that no test drives")
        self.assertEqual([s for s in self.DRIVEN if s not in documented], [],
                         "driven here but not in docs/metrics.md's table")
        for series, cases in self.DRIVEN.items():
            base = series.split("{")[0]
            for case in cases:
                if "." in case:
                    mod, cls, meth = case.split(".")
                    src = inspect.getsource(getattr(getattr(__import__(mod), cls), meth))
                else:
                    src = inspect.getsource(getattr(Metrics, case))
                    # and the checks it calls
                    src += inspect.getsource(Metrics.pipeline_checks)
                    src += inspect.getsource(Metrics.failures_case)
                # the case reads the series: its name (label value included) is in it
                label = re.search(r'="([a-z_]+)"', series)
                self.assertTrue(base in src or base.replace("ckptd_", "") in src,
                                f"{case} does not read {series}")
                if label:
                    self.assertIn(label.group(1), src, f"{case} does not read {series}")
        # and the binary exposes exactly the documented series (plus a histogram's parts)
        tree = os.path.join(self.dir, "t")
        os.makedirs(tree)
        prom = os.path.join(self.dir, "t.prom")
        run("scan", "--metrics-file", prom, tree, check=0)
        with open(prom) as f:
            exposed = set()
            for k in samples(f.read()):
                k = re.sub(r"_(bucket|sum|count)(\{le=\"[^\"]*\"\})?$", "", k)
                exposed.add(re.sub(r'\{version="[^"]*"\}', "", k))
        self.assertEqual(exposed, set(documented) - self.endpoint_only())


if __name__ == "__main__":
    unittest.main()
