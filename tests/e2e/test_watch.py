"""ckptd watch and ckptd status, end to end: the real binary beside a
simulated trainer (tests/sim_trainer.py). Every case of WatchInotify runs
again in WatchPoll with --poll. Metadata is checked by the independent
validator (tests/lib/pmf_validate.py) and md5s computed here with hashlib.
Nothing here depends on speed: each wait polls for the expected state with a
generous timeout."""
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import yaml  # noqa: E402
from ckptd_test import CKPTD, TmpDirCase, md5_file, run  # noqa: E402
from webhook_receiver import Receiver  # noqa: E402
from pmf_validate import validate_tree  # noqa: E402

SIM = os.path.join(HERE, "..", "sim_trainer.py")
TIMEOUT = 30


def meta(d):
    p = os.path.join(d, "metadata.yaml")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return yaml.safe_load(f)


def checkpoints(d):
    m = meta(d)
    return m["model"]["training"]["checkpoints"] if m else {}


def wait_for(pred, what, timeout=TIMEOUT):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def sim(out, *args):
    """The simulated trainer's command line."""
    return [sys.executable, SIM, out, *map(str, args)]


def md5sums(path):
    """Parses an md5sum manifest into {name: md5}."""
    out = {}
    with open(path) as f:
        for line in f:
            h, name = line.rstrip("\n").split("  ", 1)
            out[name] = h
    return out


class Watcher:
    """A running `ckptd watch`, its log in a file."""

    def __init__(self, d, flags, *extra, command=None, config=None):
        # in DIR/.ckptd: removed with the scratch folder, and never taken for a checkpoint
        os.makedirs(os.path.join(d, ".ckptd"), exist_ok=True)
        self.log_path = os.path.join(d, ".ckptd", "test-watch.log")
        self.log = open(self.log_path, "ab")
        args = [CKPTD, "watch", "-v", d, *flags, *extra]
        if config:
            args += ["--config", config]
        if command:
            args += ["--", *command]
        self.p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log)
        wait_for(lambda: "watch.started" in self.text() or self.p.poll() is not None,
                 "the watcher to start")
        if self.p.poll() is not None:
            raise AssertionError(f"watch exited {self.p.returncode}:\n{self.text()}")

    def text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def signal(self, sig):
        self.p.send_signal(sig)

    def wait(self, timeout=TIMEOUT):
        try:
            return self.p.wait(timeout)
        finally:
            self.log.close()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        return self.wait()

    def child_pid(self):
        m = wait_for(lambda: re.search(r"command\.started: pid=(\d+)", self.text()),
                     "the command to start")
        return int(m.group(1))


def write_by_another_hand(path, text, how):
    """Rewrites path as a user or another tool would: "replaced" (a new
    file renamed over it: a new inode) or "in place" (same inode)."""
    if how == "replaced":
        with open(path + ".new", "w") as f:
            f.write(text)
        os.rename(path + ".new", path)
    else:
        with open(path, "r+") as f:
            f.write(text)
            f.truncate()


class WatchCase(TmpDirCase):
    FLAGS = []

    def setUp(self):
        super().setUp()
        self.w = None

    def tearDown(self):
        if self.w and self.w.p.poll() is None:
            self.w.p.kill()
            self.w.wait()
        super().tearDown()

    def watch(self, *extra, **kw):
        self.w = Watcher(self.dir, self.FLAGS, *extra, **kw)
        return self.w

    def trainer(self, *args):
        subprocess.run(sim(self.dir, *args), check=True, stdout=subprocess.DEVNULL, timeout=120)

    def wait_refs(self, refs, timeout=TIMEOUT):
        refs = set(refs)
        return wait_for(lambda: refs <= set(checkpoints(self.dir)) and checkpoints(self.dir),
                        f"{sorted(refs)} registered (have {sorted(checkpoints(self.dir))})",
                        timeout)

    def sync_point(self, n):
        """Writes a checkpoint and waits for it: whatever was written before it
        has been looked at by then (events come in order; a poll sees both)."""
        ref = f"sync_epoch_{n}.pt"
        with open(os.path.join(self.dir, ref), "wb") as f:
            f.write(os.urandom(1000))
        self.wait_refs([ref])
        return ref

    def assert_files(self, names):
        """Each named checkpoint is registered once with the md5 of its source."""
        t = validate_tree(self.dir)["model"]["training"]
        self.assertEqual(sorted(t["checkpoints"]), sorted(names))
        for n in names:
            c = t["checkpoints"][n]
            self.assertEqual(c["hash"], md5_file(os.path.join(self.dir, n)), n)
            self.assertEqual(c["path"], f"data/checkpoints/{n}")
        return t

    def assert_set(self, ref, sources):
        """A set or folder: its manifest lists the md5 of every source file."""
        t = validate_tree(self.dir)["model"]["training"]
        c = t["checkpoints"][ref]
        manifest = os.path.join(self.dir, c["path"])
        self.assertEqual(c["hash"], md5_file(manifest))
        got = md5sums(manifest)
        self.assertEqual(sorted(got.values()), sorted(md5_file(s) for s in sources))
        self.assertEqual(len(got), len(sources))

    # ---- the ways frameworks write ----

    def test_direct_write(self):
        self.watch()
        self.trainer("--epochs", 3, "--mode", "direct", "--interval", 0.1, "--size", 300000)
        names = [f"epoch_{e}.safetensors" for e in (1, 2, 3)]
        self.wait_refs(names)
        t = self.assert_files(names)
        self.assertEqual(t["status"], "running")
        self.assertEqual([t["checkpoints"][n]["epoch"] for n in names], [1, 2, 3])
        self.assertEqual(t["latest"], "epoch_3.safetensors")

    def test_temp_then_rename(self):
        self.watch()
        self.trainer("--epochs", 3, "--mode", "rename", "--interval", 0.1)
        names = [f"epoch_{e}.safetensors" for e in (1, 2, 3)]
        self.wait_refs(names)
        self.assert_files(names)
        self.assertNotIn("tmp", " ".join(checkpoints(self.dir)))

    def test_tf_bundle_shard_by_shard(self):
        self.watch()
        prefix = os.path.join(self.dir, "model.ckpt-7")
        with open(prefix + ".data-00000-of-00002", "wb") as f:
            f.write(os.urandom(5000))
        with open(prefix + ".index", "wb") as f:
            f.write(os.urandom(100))
        self.sync_point(1)
        self.assertNotIn("model.ckpt-7", checkpoints(self.dir))  # a shard is missing
        with open(prefix + ".data-00001-of-00002", "wb") as f:
            f.write(os.urandom(5000))
        self.wait_refs(["model.ckpt-7"])
        self.trainer("--epochs", 2, "--mode", "tfbundle", "--interval", 0.1)
        self.wait_refs(["model.ckpt-1", "model.ckpt-2"])
        for e in (7, 1, 2):
            p = os.path.join(self.dir, f"model.ckpt-{e}")
            self.assert_set(f"model.ckpt-{e}", [p + ".index", p + ".data-00000-of-00002",
                                                 p + ".data-00001-of-00002"])
        self.assertEqual(checkpoints(self.dir)["model.ckpt-2"]["epoch"], 2)

    def test_folder_with_marker_last(self):
        self.watch()
        d = os.path.join(self.dir, "out", "checkpoint-300")
        os.makedirs(d)
        for n in ("model.safetensors", "optimizer.pt"):
            with open(os.path.join(d, n), "wb") as f:
                f.write(os.urandom(4000))
        self.sync_point(1)
        self.assertNotIn("checkpoint-300", checkpoints(self.dir))  # no marker yet
        with open(os.path.join(d, "trainer_state.json"), "w") as f:
            f.write('{"global_step": 300}')
        self.wait_refs(["checkpoint-300"])
        self.assert_set("checkpoint-300", [os.path.join(d, n) for n in
                                           ("model.safetensors", "optimizer.pt",
                                            "trainer_state.json")])
        self.trainer("--epochs", 2, "--mode", "folder", "--interval", 0.1)
        self.wait_refs(["checkpoint-1", "checkpoint-2"])
        self.assertEqual(len(checkpoints(self.dir)), 4)

    def test_partial_file_left_by_a_crash(self):
        w = self.watch(command=sim(self.dir, "--epochs", 3, "--mode", "crash-partial",
                                   "--interval", 0.1))
        self.assertEqual(w.wait(), 3)  # the trainer's own exit code
        t = self.assert_files(["epoch_1.safetensors", "epoch_2.safetensors"])
        self.assertEqual(t["status"], "failed")
        self.assertTrue(os.path.exists(os.path.join(self.dir, "epoch_3.safetensors.tmp")))

    def test_burst_of_many_at_once(self):
        self.watch()
        self.trainer("--epochs", 200, "--mode", "burst", "--size", 2000)
        names = [f"epoch_{e}.safetensors" for e in range(1, 201)]
        self.wait_refs(names, timeout=90)
        self.assert_files(names)
        # none twice: the log registered each exactly once
        regs = re.findall(r"checkpoint\.registered: checkpoint='([^']+)'", self.w.text())
        self.assertEqual(sorted(regs), sorted(names))

    def test_file_still_open_for_writing_waits(self):
        self.watch("--settle", "50ms")
        p = subprocess.Popen(sim(self.dir, "--epochs", 1, "--mode", "direct", "--pause", 3,
                                 "--size", 200000), stdout=subprocess.PIPE)
        path = os.path.join(self.dir, "epoch_1.safetensors")
        wait_for(lambda: os.path.exists(path) and os.path.getsize(path) > 0, "a half-written file")
        # a pass looks at it while it is held open, half written, unchanged
        self.sync_point(1)
        self.assertNotIn("epoch_1.safetensors", checkpoints(self.dir))
        self.assertEqual(p.wait(60), 0)
        self.wait_refs(["epoch_1.safetensors"])
        self.assertEqual(checkpoints(self.dir)["epoch_1.safetensors"]["hash"], md5_file(path))

    def test_file_gone_before_settling_is_forgotten(self):
        self.watch("--settle", "1s")
        path = os.path.join(self.dir, "epoch_4.pt")
        with open(path, "wb") as f:
            f.write(os.urandom(1000))
        os.unlink(path)
        self.sync_point(1)
        self.assertEqual(list(checkpoints(self.dir)), ["sync_epoch_1.pt"])
        self.assertNotIn("checkpoint.problem", self.w.text())

    # ---- the wrapped command ----

    def test_command_success(self):
        w = self.watch(command=sim(self.dir, "--epochs", 2, "--mode", "rename",
                                   "--interval", 0.05))
        self.assertEqual(w.wait(), 0)
        t = self.assert_files(["epoch_1.safetensors", "epoch_2.safetensors"])
        self.assertEqual(t["status"], "finished")
        self.assertEqual(t["end_epoch"], 2)

    def test_uploads_the_tree_metadata_last(self):
        remote = os.path.join(self.dir, ".ckptd", "remote")  # outside the tree's own files
        events = os.path.join(self.dir, ".ckptd", "events")  # one file per event: hooks run in parallel
        os.makedirs(events)
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write(f"upload:\n  stores:\n    - url: file://{remote}\n"
                    f"hooks:\n  exec:\n    - event: upload.*\n"
                    f"      command: \"cat > {events}/$$.json\"\n")
        w = self.watch(command=sim(self.dir, "--epochs", 3, "--mode", "rename",
                                   "--interval", 0.05))
        self.assertEqual(w.wait(), 0, w.text())
        t = self.assert_files(["epoch_1.safetensors", "epoch_2.safetensors",
                               "epoch_3.safetensors"])
        self.assertEqual(t["status"], "finished")
        # every file of the tree landed, byte for byte; metadata.yaml is the final one
        for rel in ["metadata.yaml", "config.yaml", "data/build_parameters.yaml"] + \
                [f"data/checkpoints/epoch_{e}.safetensors" for e in (1, 2, 3)]:
            with open(os.path.join(self.dir, rel), "rb") as a, \
                    open(os.path.join(remote, rel), "rb") as b:
                self.assertEqual(a.read(), b.read(), f"{rel}\n{w.text()}")
        done = re.findall(r'upload\.done: job=\d+ store="[^"]*" key="([^"]+)"', w.text())
        self.assertTrue(done and done[-1].endswith("metadata.yaml"), done)
        last_meta = len(done) - 1
        for e in (1, 2, 3):
            key = next(i for i, k in enumerate(done) if k.endswith(f"epoch_{e}.safetensors"))
            self.assertLess(key, last_meta)
        # each object's upload.completed event reached the exec hook
        got = []
        for name in os.listdir(events):
            with open(os.path.join(events, name)) as f:
                got.append(json.load(f))
        completed = [e for e in got if e["type"] == "upload.completed"]
        self.assertEqual(len(completed), len(done))
        self.assertTrue(all(e["data"]["upload"]["bytes"] > 0 for e in completed))

    def test_command_failure(self):
        w = self.watch(command=sim(self.dir, "--epochs", 5, "--mode", "rename",
                                   "--interval", 0.05, "--fail-at", 3))
        self.assertEqual(w.wait(), 1)
        t = self.assert_files(["epoch_1.safetensors", "epoch_2.safetensors"])
        self.assertEqual(t["status"], "failed")

    def test_command_killed(self):
        w = self.watch(command=sim(self.dir, "--epochs", 1000, "--mode", "rename",
                                   "--interval", 0.2))
        pid = w.child_pid()
        self.wait_refs(["epoch_1.safetensors"])
        os.kill(pid, signal.SIGKILL)
        self.assertEqual(w.wait(), 128 + signal.SIGKILL)
        t = validate_tree(self.dir)["model"]["training"]
        self.assertEqual(t["status"], "failed")
        on_disk = sorted(n for n in os.listdir(self.dir) if n.endswith(".safetensors"))
        self.assertEqual(sorted(t["checkpoints"]), on_disk)

    def test_command_not_found(self):
        p = run("watch", self.dir, *self.FLAGS, "--", os.path.join(self.dir, "no-such-trainer"))
        self.assertEqual(p.returncode, 127, p.stderr)
        self.assertIn("no-such-trainer", p.stderr)

    def test_sigterm_is_forwarded(self):
        w = self.watch(command=sim(self.dir, "--epochs", 1000, "--mode", "rename",
                                   "--interval", 0.2))
        w.child_pid()
        self.wait_refs(["epoch_2.safetensors"])
        t0 = time.monotonic()
        w.signal(signal.SIGTERM)
        self.assertEqual(w.wait(), 128 + signal.SIGTERM)
        self.assertLess(time.monotonic() - t0, 20)
        t = validate_tree(self.dir)["model"]["training"]
        self.assertEqual(t["status"], "failed")
        on_disk = sorted(n for n in os.listdir(self.dir) if n.endswith(".safetensors"))
        self.assertEqual(sorted(t["checkpoints"]), on_disk)

    def test_grace_period_then_sigkill(self):
        w = self.watch("--grace-period", "1s",
                       command=sim(self.dir, "--epochs", 1000, "--mode", "rename",
                                   "--interval", 0.2, "--ignore-term"))
        w.child_pid()
        self.wait_refs(["epoch_1.safetensors"])
        t0 = time.monotonic()
        w.signal(signal.SIGTERM)
        self.assertEqual(w.wait(), 128 + signal.SIGKILL)
        self.assertGreaterEqual(time.monotonic() - t0, 0.9)
        self.assertIn("command.killed", w.text())
        self.assertEqual(validate_tree(self.dir)["model"]["training"]["status"], "failed")

    # ---- lifecycle ----

    def test_sigterm_then_restart_mid_run(self):
        self.watch()
        trainer = subprocess.Popen(sim(self.dir, "--epochs", 12, "--mode", "rename",
                                       "--interval", 0.15), stdout=subprocess.DEVNULL)
        self.wait_refs(["epoch_2.safetensors"])
        t0 = time.monotonic()
        self.w.signal(signal.SIGTERM)
        self.assertEqual(self.w.wait(), 0)
        self.assertLess(time.monotonic() - t0, 20)
        validate_tree(self.dir)
        # checkpoints keep coming while no watcher runs
        wait_for(lambda: len([n for n in os.listdir(self.dir) if n.endswith(".safetensors")])
                 >= len(checkpoints(self.dir)) + 2, "checkpoints written while down")
        self.watch()
        self.assertEqual(trainer.wait(60), 0)
        names = [f"epoch_{e}.safetensors" for e in range(1, 13)]
        self.wait_refs(names)
        t = self.assert_files(names)
        self.assertEqual(t["status"], "running")
        regs = re.findall(r"checkpoint\.registered: checkpoint='([^']+)'", self.w.text())
        self.assertEqual(sorted(regs), sorted(names))  # both runs: each exactly once

    def test_sighup_reload_good_and_bad(self):
        cfg = os.path.join(self.dir, "ckptd.yaml")
        with open(cfg, "w") as f:
            f.write("checkpoints:\n  patterns: ['epoch_{epoch}.pt']\n")
        self.watch()
        with open(os.path.join(self.dir, "model_step40.weights"), "wb") as f:
            f.write(os.urandom(3000))
        with open(os.path.join(self.dir, "epoch_1.pt"), "wb") as f:
            f.write(os.urandom(3000))
        self.wait_refs(["epoch_1.pt"])
        self.assertNotIn("model_step40.weights", checkpoints(self.dir))
        with open(cfg, "w") as f:
            f.write("checkpoints:\n  patterns: ['epoch_{epoch}.pt', 'model_step{step}.weights']\n")
        self.w.signal(signal.SIGHUP)
        self.wait_refs(["model_step40.weights"])
        self.assertEqual(checkpoints(self.dir)["model_step40.weights"]["epoch"], 40)
        # a bad config: said why, the running one kept
        with open(cfg, "w") as f:
            f.write("checkpoints:\n  colour: blue\n")
        self.w.signal(signal.SIGHUP)
        wait_for(lambda: "config.reload_failed" in self.w.text(), "the reload to fail")
        self.assertIn("checkpoints.colour", self.w.text())
        with open(os.path.join(self.dir, "model_step80.weights"), "wb") as f:
            f.write(os.urandom(3000))
        self.wait_refs(["model_step80.weights"])
        self.assertIsNone(self.w.p.poll())

    def test_status_ends_training_through_the_watcher(self):
        self.watch()
        self.trainer("--epochs", 2, "--mode", "rename", "--interval", 0.05)
        p = run("status", self.dir, "--finished", check=0)
        self.assertIn("finished", p.stdout)
        self.assertEqual(self.w.wait(), 0)  # the training ended: the watcher with it
        t = self.assert_files(["epoch_1.safetensors", "epoch_2.safetensors"])
        self.assertEqual(t["status"], "finished")
        self.assertIn("request.received", self.w.text())

    def test_status_wait_returns_after_the_uploads(self):
        # --wait: back only when the watcher has exited, its uploads done
        remote = os.path.join(self.dir, ".ckptd", "remote")
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write(f"upload:\n  stores:\n    - url: file://{remote}\n")
        self.watch()
        self.trainer("--epochs", 2, "--mode", "rename", "--interval", 0.05,
                     "--size", 8 << 20)
        p = run("status", self.dir, "--finished", "--wait", check=0)
        self.assertIn("finished", p.stdout)
        self.assertIn("none", p.stdout)  # the watcher line: gone
        # the contract: everything is uploaded the moment --wait returns.
        # The watcher's process may still be tearing down (under ASan, its
        # leak check runs after the lock is released), so its exit is
        # awaited only after the checks.
        with open(os.path.join(self.dir, "metadata.yaml"), "rb") as a, \
                open(os.path.join(remote, "metadata.yaml"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        for e in (1, 2):
            rel = f"data/checkpoints/epoch_{e}.safetensors"
            self.assertEqual(md5_file(os.path.join(remote, rel)),
                             md5_file(os.path.join(self.dir, rel)))
        self.assertEqual(self.w.wait(), 0)

    def test_status_refused_by_the_watcher(self):
        self.watch()
        p = run("status", self.dir, "--finished", check=1)  # pending -> finished: PMF forbids it
        self.assertIn("pending -> finished", p.stderr)
        self.assertIsNone(self.w.p.poll())
        self.assertEqual(meta(self.dir)["model"]["training"]["status"], "pending")

    def test_marker_file_ends_training(self):
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write("training:\n  failed_marker: FAILED\n")
        self.watch()
        self.trainer("--epochs", 1, "--mode", "rename")
        self.wait_refs(["epoch_1.safetensors"])
        open(os.path.join(self.dir, "FAILED"), "w").close()
        self.assertEqual(self.w.wait(), 0)
        self.assertEqual(validate_tree(self.dir)["model"]["training"]["status"], "failed")

    def test_reconciliation_catches_what_gave_no_event(self):
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write("watch:\n  reconcile_interval: 1s\n")
        self.watch()
        outside = os.path.join(os.path.dirname(self.dir), os.path.basename(self.dir) + ".src")
        with open(outside, "wb") as f:
            f.write(os.urandom(3000))
        self.addCleanup(os.unlink, outside)
        t = time.time() - 60
        os.utime(outside, (t, t))
        # a hard link: IN_CREATE only, no close after writing, no rename
        os.link(outside, os.path.join(self.dir, "epoch_12.pt"))
        self.wait_refs(["epoch_12.pt"])
        self.assert_files(["epoch_12.pt"])

    def test_metadata_written_by_another_hand_is_read_again(self):
        # the watcher keeps metadata.yaml's parse between passes (a large one
        # costs a parse per event); a change by anyone else must be seen
        self.watch()
        self.sync_point(1)
        path = os.path.join(self.dir, "metadata.yaml")
        for how, name in (("replaced", "renamed-by-a-rename"), ("in place", "renamed-in-place")):
            with open(path) as f:
                text = f.read()
            old_name = yaml.safe_load(text)["model"]["name"]
            text = text.replace(f"name: {old_name}\n", f"name: {name}\n", 1)
            write_by_another_hand(path, text, how)
            self.assertEqual(meta(self.dir)["model"]["name"], name)
            self.sync_point(2 if how == "replaced" else 3)
            m = validate_tree(self.dir)
            self.assertEqual(m["model"]["name"], name, how)
        self.assertEqual(sorted(m["model"]["training"]["checkpoints"]),
                         ["sync_epoch_1.pt", "sync_epoch_2.pt", "sync_epoch_3.pt"])

    def test_build_parameters_written_by_another_hand_are_kept(self):
        # the watcher keeps data/build_parameters.yaml's text between passes
        # too; keys another hand adds must survive its next pass, and what it
        # writes must be what a pass from scratch (scan, no memory) writes
        path = os.path.join(self.dir, "data", "build_parameters.yaml")

        def check(refs, note):
            with open(path) as f:
                bp = yaml.safe_load(f)
            self.assertEqual(list(bp)[-1], "ckptd", note)  # ckptd's section stays last
            self.assertEqual(sorted(bp["ckptd"]["checkpoints"]), sorted(refs), note)
            for ref, rec in bp["ckptd"]["checkpoints"].items():
                with open(os.path.join(self.dir, ref), "rb") as f:
                    data = f.read()
                self.assertEqual(rec, {"sha256": hashlib.sha256(data).hexdigest(),
                                       "size": len(data), "files": 1, "source": ref}, ref)
            return bp

        self.watch()
        refs = [self.sync_point(1)]
        for n, (how, key) in enumerate((("replaced", "dataset"), ("in place", "notes")), 2):
            with open(path) as f:
                text = f.read()
            write_by_another_hand(path, f"{key}:\n  by: hand {how}\n" + text, how)
            refs.append(self.sync_point(n))  # a pass that reads the file again
            bp = check(refs, how)
            self.assertEqual(bp[key], {"by": f"hand {how}"}, how)
            refs.append(self.sync_point(n + 2))  # a pass from what it kept
            bp = check(refs, how)
            self.assertEqual(bp[key], {"by": f"hand {how}"}, how)
        self.assertEqual(bp["dataset"], {"by": "hand replaced"})
        # a name outside letters, digits and . _ / - : ckptd's section is then
        # emitted by libyaml, not written directly (agent/layout.c emit_tail_direct)
        odd = "v=2_epoch_4.pt"
        with open(os.path.join(self.dir, odd), "wb") as f:
            f.write(os.urandom(1000))
        self.wait_refs([odd])
        refs += [odd, self.sync_point(9)]
        check(refs, odd)
        self.w.stop()
        before = os.stat(path)
        with open(path, "rb") as f:
            text = f.read()
        run("scan", "--min-age", "0", self.dir, check=0)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), text)
        self.assertEqual(os.stat(path).st_ino, before.st_ino)  # not rewritten

    def test_restart_on_an_existing_tree(self):
        self.trainer("--epochs", 2, "--mode", "rename", "--interval", 0)
        run("scan", "--min-age", "0", self.dir, check=0)
        self.trainer("--epochs", 2, "--start", 3, "--mode", "rename", "--interval", 0)
        self.watch()
        names = [f"epoch_{e}.safetensors" for e in range(1, 5)]
        self.wait_refs(names)
        self.assert_files(names)
        self.assertEqual(re.findall(r"checkpoint\.registered: checkpoint='([^']+)'", self.w.text()),
                         ["epoch_3.safetensors", "epoch_4.safetensors"])


class WatchInotify(WatchCase):
    FLAGS = []

    def test_folder_renamed_into_place(self):
        self.watch()
        self.trainer("--epochs", 2, "--mode", "folder-rename", "--interval", 0.1)
        self.wait_refs(["checkpoint-1", "checkpoint-2"])
        d = os.path.join(self.dir, "checkpoint-2")
        self.assert_set("checkpoint-2", [os.path.join(d, n) for n in
                                         ("model.safetensors", "optimizer.pt")])
        self.assertEqual(len(checkpoints(self.dir)), 2)  # never the .tmp folder

    def test_new_folder_is_listed_after_its_watch(self):
        self.watch()
        # a folder made and filled at once: files written before its watch existed
        d = os.path.join(self.dir, "a", "b", "c")
        os.makedirs(d)
        for e in (1, 2, 3):
            with open(os.path.join(d, f"epoch_{e}.pt"), "wb") as f:
                f.write(os.urandom(2000))
        self.wait_refs([f"epoch_{e}.pt" for e in (1, 2, 3)])

    def test_watch_exhaustion_falls_back_to_polling(self):
        if os.getuid() != 0:
            raise unittest.SkipTest("needs root to lower fs.inotify.max_user_watches")
        path = "/proc/sys/fs/inotify/max_user_watches"
        try:
            with open(path) as f:
                old = f.read().strip()
            with open(path, "w") as f:
                f.write("1\n")  # per user: the root folder may not even get one
        except OSError as e:
            raise unittest.SkipTest(f"cannot change {path}: {e}")
        try:
            for i in range(5):
                os.makedirs(os.path.join(self.dir, f"sub{i}"))
            self.watch("--poll-interval", "100ms")
        finally:
            with open(path, "w") as f:
                f.write(old + "\n")
        self.assertIn("watch.exhausted", self.w.text())
        self.assertIn("max_user_watches", self.w.text())
        with open(os.path.join(self.dir, "sub3", "epoch_9.pt"), "wb") as f:
            f.write(os.urandom(2000))
        self.wait_refs(["epoch_9.pt"])


    def test_queue_overflow_triggers_a_full_pass(self):
        if os.getuid() != 0:
            raise unittest.SkipTest("needs root to lower fs.inotify.max_queued_events")
        path = "/proc/sys/fs/inotify/max_queued_events"
        try:
            with open(path) as f:
                old = f.read().strip()
            with open(path, "w") as f:
                f.write("8\n")  # read when an inotify instance is made: the watcher's
        except OSError as e:
            raise unittest.SkipTest(f"cannot change {path}: {e}")
        try:
            self.watch("--settle", "500ms")
        finally:
            with open(path, "w") as f:
                f.write(old + "\n")
        self.trainer("--epochs", 100, "--mode", "burst", "--size", 1000)
        names = [f"epoch_{e}.safetensors" for e in range(1, 101)]
        self.wait_refs(names, timeout=90)
        self.assert_files(names)
        self.assertIn("watch.overflow", self.w.text())


class WatchPoll(WatchCase):
    FLAGS = ["--poll", "--poll-interval", "100ms"]


def children(pid):
    """The pids of a process's children."""
    out = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.update(int(c) for c in f.read().split())
        except FileNotFoundError:
            pass
    return out


class WatchCli(TmpDirCase):
    def test_check_config(self):
        p = run("watch", "-n", self.dir, check=0)
        self.assertIn("ok", p.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "metadata.yaml")))
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write("watch:\n  settle: 50ms\n  poll_interval: soon\n")
        p = run("watch", "-n", self.dir, check=2)
        self.assertIn("line 3", p.stderr)
        self.assertIn("watch.poll_interval", p.stderr)
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write("watch:\n  poll_interval: 1ms\n")
        p = run("watch", "-n", self.dir, check=2)
        self.assertIn("at least 10ms", p.stderr)

    def test_usage(self):
        self.assertEqual(run("watch").returncode, 2)
        self.assertEqual(run("watch", self.dir, "extra").returncode, 2)
        self.assertEqual(run("watch", self.dir, "--").returncode, 2)
        self.assertEqual(run("watch", "--settle", "soon", self.dir).returncode, 2)
        # a missing DIR is waited for (StartBeforeTheTrainer in test_production.py);
        # checking it is a usage error, and so is a file in its place
        self.assertEqual(run("watch", "-n", os.path.join(self.dir, "nope")).returncode, 2)
        with open(os.path.join(self.dir, "afile"), "w"):
            pass
        self.assertEqual(run("watch", os.path.join(self.dir, "afile")).returncode, 2)
        self.assertEqual(run("watch", "--help").returncode, 0)
        self.assertEqual(run("status", "--finished", "--failed", self.dir).returncode, 2)

    def test_locked(self):
        w = Watcher(self.dir, [])
        try:
            p = run("watch", self.dir, check=3)
            self.assertIn(f"pid {w.p.pid}", p.stderr)
        finally:
            w.stop()

    def test_status_show_and_json(self):
        with open(os.path.join(self.dir, "epoch_1.pt"), "wb") as f:
            f.write(os.urandom(1000))
        run("scan", "--min-age", "0", self.dir, check=0)
        p = run("status", "--json", self.dir, check=0)
        j = json.loads(p.stdout)
        m = meta(self.dir)["model"]["training"]
        self.assertEqual(j["status"], m["status"])
        self.assertEqual(j["checkpoints"], len(m["checkpoints"]))
        self.assertEqual(j["latest"], m["latest"])
        self.assertEqual(j["latest_epoch"], m["latest_epoch"])
        self.assertIsNone(j["watcher_pid"])
        w = Watcher(self.dir, [])
        try:
            j = json.loads(run("status", "--json", self.dir, check=0).stdout)
            self.assertEqual(j["watcher_pid"], w.p.pid)
            self.assertIn(f"running (pid {w.p.pid})", run("status", self.dir, check=0).stdout)
        finally:
            self.assertEqual(w.stop(), 0)

    def test_status_ends_training_under_the_lock(self):
        with open(os.path.join(self.dir, "epoch_1.pt"), "wb") as f:
            f.write(os.urandom(1000))
        p = run("status", self.dir, "--failed", check=0)  # no watcher: does it itself
        self.assertIn("failed", p.stdout)
        t = validate_tree(self.dir)["model"]["training"]
        self.assertEqual(t["status"], "failed")
        self.assertEqual(list(t["checkpoints"]), ["epoch_1.pt"])

    def test_training_already_ended(self):
        with open(os.path.join(self.dir, "epoch_1.pt"), "wb") as f:
            f.write(os.urandom(1000))
        run("scan", "--min-age", "0", "--finished", self.dir, check=0)
        p = run("watch", self.dir, check=0)  # nothing to watch: says so and exits
        self.assertIn("already ended", p.stderr)
        p = run("watch", self.dir, "--", sys.executable, "-c", "pass", check=1)
        self.assertIn("already ended as finished", p.stderr)

    def test_ops_endpoint(self):
        import urllib.request
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write("listen: 127.0.0.1:0\n")
        w = Watcher(self.dir, [])
        try:
            m = wait_for(lambda: re.search(r"ops\.listening: .*port=(\d+)", w.text()),
                         "the ops endpoint")
            base = f"http://127.0.0.1:{m.group(1)}"
            with urllib.request.urlopen(base + "/healthz", timeout=10) as r:
                self.assertEqual(r.status, 200)
            wait_for(lambda: urllib.request.urlopen(base + "/readyz", timeout=10).status == 200,
                     "ready")
            with open(os.path.join(self.dir, "epoch_1.pt"), "wb") as f:
                f.write(os.urandom(1000))
            wait_for(lambda: "epoch_1.pt" in checkpoints(self.dir), "epoch_1.pt registered")
            with urllib.request.urlopen(base + "/status", timeout=10) as r:
                st = json.loads(r.read())
            self.assertEqual(st["training"], "running")
            self.assertIn(st["backend"], ("inotify", "poll", "inotify+poll"))
            with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
                text = r.read().decode()
            self.assertRegex(text, r"(?m)^ckptd_checkpoints_registered_total 1$")
        finally:
            self.assertEqual(w.stop(), 0)

    def test_heavy_libraries_load_only_when_used(self):
        # What keeps an idle watcher small (issue 3): the libraries behind
        # uploads, bundles and tensor reading are not mapped until a feature
        # that needs them runs. A watcher that registers checkpoints and
        # copies them to a file:// store needs none of them.
        heavy = ("libcurl", "libarchive", "libzip", "libhdf5", "libsnappy", "libstdc++",
                 "libcrypto", "libssl")

        # what the binary loads at start (a sanitizer build's runtime brings
        # libstdc++): never one of the five, and not counted below
        ldd = subprocess.run(["ldd", CKPTD], capture_output=True, text=True, check=True).stdout
        at_start = {os.path.basename(os.path.realpath(m))
                    for m in re.findall(r"=> (/\S+)", ldd)}
        lazy = ("libcurl", "libarchive", "libzip", "libhdf5", "libsnappy")
        self.assertEqual(sorted(n for n in at_start if n.startswith(lazy)), [])

        def mapped(pid):
            with open(f"/proc/{pid}/maps") as f:
                names = {os.path.basename(l.split()[-1]) for l in f if len(l.split()) >= 6}
            return sorted(n for n in names - at_start if n.startswith(heavy))

        remote = os.path.join(self.dir, ".ckptd", "remote")
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write(f"upload:\n  stores:\n    - url: file://{remote}\n")
        w = Watcher(self.dir, [])
        try:
            with open(os.path.join(self.dir, "epoch_1.pt"), "wb") as f:
                f.write(os.urandom(1000))
            wait_for(lambda: os.path.exists(os.path.join(remote, "metadata.yaml")),
                     "epoch_1.pt registered and uploaded")
            self.assertEqual(mapped(w.p.pid), [])
        finally:
            self.assertEqual(w.stop(), 0)
        # webhooks (and uploads over the network) need libcurl: they run in
        # helper processes, so the watcher itself never maps it, and no
        # helper stays behind once the work is done (another folder: the
        # Watcher helper waits for "watch.started" in a log of its own)
        other = os.path.join(self.dir, "other")
        os.makedirs(other)
        with Receiver(self.dir) as rx:
            with open(os.path.join(other, "ckptd.yaml"), "w") as f:
                f.write(f"hooks:\n  webhooks:\n    - url: {rx.url}\n"
                        f"      events: [checkpoint.registered]\n")
            w = Watcher(other, [])
            try:
                with open(os.path.join(other, "epoch_1.pt"), "wb") as f:
                    f.write(os.urandom(1000))
                got = rx.wait_requests(1)
                self.assertEqual([json.loads(r["body"])["type"] for r in got],
                                 ["checkpoint.registered"])
                wait_for(lambda: not children(w.p.pid), "the webhook helper to exit")
                self.assertIn("webhook.helper_ended", w.text())
                self.assertEqual(mapped(w.p.pid), [])
            finally:
                self.assertEqual(w.stop(), 0)

    def test_a_helper_that_dies_costs_nothing(self):
        # a delivery helper killed in the middle of its work: the watcher
        # goes on, says so, and a later helper delivers the same event
        with Receiver(self.dir, slow=60) as rx:  # the first request hangs
            with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
                f.write(f"hooks:\n  webhooks:\n    - url: {rx.url}\n      timeout: 3s\n"
                        f"      events: [checkpoint.registered]\n")
            w = Watcher(self.dir, [])
            try:
                with open(os.path.join(self.dir, "epoch_1.pt"), "wb") as f:
                    f.write(os.urandom(1000))
                first = rx.wait_requests(1)
                self.assertEqual(len(first), 1)
                pids = [int(m) for m in
                        re.findall(r"webhook\.helper_started: pid=(\d+)", w.text())]
                busy = [p for p in pids if p in children(w.p.pid)]
                self.assertEqual(len(busy), 1, w.text())
                os.kill(busy[0], signal.SIGKILL)
                got = rx.wait_requests(2, timeout=60)
                self.assertEqual(len(got), 2, w.text())
                # the same event, sent again (receivers dedupe on webhook-id)
                self.assertEqual(got[0]["headers"]["webhook-id"], got[1]["headers"]["webhook-id"])
                self.assertRegex(w.text(), rf"webhook\.helper_failed: pid={busy[0]} killed by "
                                           r"signal 9")
                self.assertIsNone(w.p.poll())
            finally:
                self.assertEqual(w.stop(), 0)

    def test_json_logs(self):
        p = run("watch", "--log-format", "json", self.dir, "--", sys.executable, "-c", "pass",
                check=0)
        lines = [json.loads(l) for l in p.stderr.splitlines() if l.strip()]
        events = [l["event"] for l in lines]
        self.assertIn("watch.started", events)
        self.assertIn("command.exited", events)


if __name__ == "__main__":
    unittest.main()
