"""The sidecar in production (issue 16), end to end with the real binary:
no event lost under load, structured logs a log shipper can use."""
import base64
import json
import os
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, run, write_old  # noqa: E402
from webhook_receiver import Receiver  # noqa: E402
from pmf_validate import validate_tree  # noqa: E402

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()
ENV = {"CK_WH": SECRET}


class NoLostEvents(TmpDirCase):
    RUNS = int(os.environ.get("CK_STRESS_RUNS", "100"))

    def test_every_wrapped_run_delivers_one_finished_per_receiver(self):
        """Many short wrapped runs, each ending while the delivery helper writes
        to the same database, with a CPU hog beside them: every run delivers
        training.finished exactly once to each receiver and exits with the
        trainer's status."""
        receivers = [Receiver(self.dir), Receiver(self.dir)]
        for r in receivers:
            self.addCleanup(r.stop)
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        self.addCleanup(hog.kill)
        hooks = "".join(f"    - url: {r.url}\n      secret: env:CK_WH\n" for r in receivers)
        runs = []
        for i in range(self.RUNS):
            d = os.path.join(self.dir, f"run{i}")
            os.makedirs(d)
            with open(os.path.join(d, "ckptd.yaml"), "w") as f:
                f.write("hooks:\n  webhooks:\n" + hooks)
            # the trainer writes a checkpoint and exits at once: the final pass,
            # its events and training.finished race the helper's deliveries
            trainer = f"head -c 20000 /dev/urandom > {d}/epoch_1.pt; exit 0"
            p = run("watch", "--settle", "0", d, "--", "sh", "-c", trainer, env=ENV, timeout=120)
            self.assertEqual(p.returncode, 0, f"run {i}: {p.stderr[-2000:]}")
            self.assertNotIn("database is locked", p.stderr, f"run {i}")
            with open(os.path.join(d, ".ckptd", "state.db"), "rb"):
                pass
            runs.append(d)
        # every run hands its model id to each receiver exactly once
        import yaml
        ids = []
        for d in runs:
            with open(os.path.join(d, "metadata.yaml")) as f:
                ids.append(yaml.safe_load(f)["model"]["id"])
        for r in receivers:
            finished = {}
            for q in r.requests():
                b = json.loads(q["body"])
                if b["type"] == "training.finished":
                    mid = b["data"]["model"]["id"]
                    finished[mid] = finished.get(mid, 0) + 1
            missing = [i for i, mid in enumerate(ids) if finished.get(mid, 0) == 0]
            twice = [i for i, mid in enumerate(ids) if finished.get(mid, 0) > 1]
            self.assertEqual(missing, [], "runs whose training.finished never arrived")
            self.assertEqual(twice, [], "runs whose training.finished arrived twice")


class Shutdown(TmpDirCase):
    """Kubernetes stops a native sidecar with SIGTERM after the trainer has
    exited: what is complete on disk is registered and handed over."""

    def start(self, extra=""):
        import signal  # noqa: F401
        self.tree = os.path.join(self.dir, "run")
        self.remote = os.path.join(self.dir, "remote")
        os.makedirs(self.tree)
        self.rx = Receiver(self.dir)
        self.addCleanup(self.rx.stop)
        with open(os.path.join(self.tree, "ckptd.yaml"), "w") as f:
            f.write(f"upload:\n  stores:\n    - url: file://{self.remote}\n"
                    f"hooks:\n  webhooks:\n    - url: {self.rx.url}\n      secret: env:CK_WH\n"
                    + extra)
        self.log = open(os.path.join(self.dir, "watch.log"), "w+")
        self.addCleanup(self.log.close)
        env = dict(os.environ, **ENV)
        self.p = subprocess.Popen([CKPTD, "watch", self.tree], stdout=self.log,
                                  stderr=subprocess.STDOUT, env=env)
        self.addCleanup(lambda: self.p.poll() is None and (self.p.kill(), self.p.wait()))
        deadline = time.time() + 30
        while "watch.started" not in self.text() or "agent.started" not in self.text():
            self.assertLess(time.time(), deadline, self.text())
            self.assertIsNone(self.p.poll(), self.text())
            time.sleep(0.02)
        time.sleep(0.1)  # the first pass is done

    def text(self):
        self.log.seek(0)
        return self.log.read()

    def exit_status(self, timeout):
        """The watcher's exit status; a failure showing its log when it does
        not exit in time (within ctest's limit, so the log is seen)."""
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"ckptd watch still running after {timeout} s:\n{self.text()}")

    def test_checkpoint_written_just_before_sigterm_is_handed_over(self):
        import signal
        import yaml
        self.start()
        data = os.urandom(300000)
        with open(os.path.join(self.tree, "epoch_1.pt"), "wb") as f:
            f.write(data)
        time.sleep(0.05)
        self.p.send_signal(signal.SIGTERM)
        self.assertEqual(self.exit_status(45), 0, self.text())
        with open(os.path.join(self.tree, "metadata.yaml")) as f:
            meta = yaml.safe_load(f)
        self.assertIn("epoch_1.pt", meta["model"]["training"]["checkpoints"], self.text())
        # uploaded: the checkpoint, then the metadata that names it
        with open(os.path.join(self.remote, "data", "checkpoints", "epoch_1.pt"), "rb") as f:
            self.assertEqual(f.read(), data)
        with open(os.path.join(self.remote, "metadata.yaml")) as f:
            self.assertIn("epoch_1.pt", yaml.safe_load(f)["model"]["training"]["checkpoints"])
        # and announced before the watcher went
        types = [json.loads(q["body"])["type"] for q in self.rx.requests()]
        self.assertIn("checkpoint.registered", types)
        self.assertEqual(types[-1], "agent.stopping")
        self.assertIn("watch.handed_over", self.text())

    def test_a_file_still_being_written_is_left_for_the_next_start(self):
        import signal
        self.start("watch:\n  grace_period: 2s\n")
        f = open(os.path.join(self.tree, "epoch_2.pt"), "wb")  # open for writing, by us
        f.write(os.urandom(1000))
        f.flush()
        try:
            self.p.send_signal(signal.SIGTERM)
            self.assertEqual(self.exit_status(45), 0, self.text())
        finally:
            f.close()
        with open(os.path.join(self.tree, "metadata.yaml")) as m:
            self.assertNotIn("epoch_2.pt", m.read(), self.text())
        self.assertIn("too_fresh=1", self.text())


    def test_kubernetes_marker_then_prestop_wait(self):
        """contrib/kubernetes/sidecar.yaml's way to end a Job: the trainer
        writes its last checkpoint and FAILED (its exit status was not 0); the
        preStop hook's `ckptd status --wait` returns once everything is
        handed over."""
        import yaml
        sidecar = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                               "contrib", "kubernetes", "sidecar.yaml")
        with open(sidecar) as f:
            docs = list(yaml.safe_load_all(f))
        kind = {d["kind"]: d for d in docs}
        conf = yaml.safe_load(kind["ConfigMap"]["data"]["ckptd.yaml"])
        markers = conf["training"]
        self.start(f"training:\n  finished_marker: {markers['finished_marker']}\n"
                   f"  failed_marker: {markers['failed_marker']}\n")
        data = os.urandom(200000)
        with open(os.path.join(self.tree, "epoch_4.pt"), "wb") as f:
            f.write(data)
        with open(os.path.join(self.tree, markers["failed_marker"]), "w"):
            pass
        job = kind["Job"]["spec"]["template"]["spec"]
        prestop = job["initContainers"][0]["lifecycle"]["preStop"]["exec"]["command"]
        self.assertEqual(prestop[:3], ["ckptd", "status", "--wait"])
        p = run(*prestop[1:-1], self.tree, timeout=50)
        self.assertEqual(p.returncode, 0, p.stderr + self.text())
        self.assertEqual(self.exit_status(30), 0, self.text())
        with open(os.path.join(self.remote, "metadata.yaml")) as f:
            meta = yaml.safe_load(f)
        self.assertEqual(meta["model"]["training"]["status"], "failed")
        self.assertIn("epoch_4.pt", meta["model"]["training"]["checkpoints"])
        with open(os.path.join(self.remote, "data", "checkpoints", "epoch_4.pt"), "rb") as f:
            self.assertEqual(f.read(), data)
        types = [json.loads(q["body"])["type"] for q in self.rx.requests()]
        self.assertIn("training.failed", types)


class EventStoreFails(TmpDirCase):
    def test_an_event_that_cannot_be_stored_stops_the_watcher_with_1(self):
        """The outbox refuses writes (a trigger stands in for a full disk): the
        watcher stops with exit 1 naming the problem; once the store works
        again, a restart announces the checkpoint exactly once."""
        import signal
        import sqlite3
        rx = Receiver(self.dir)
        self.addCleanup(rx.stop)
        tree = os.path.join(self.dir, "run")
        os.makedirs(tree)
        with open(os.path.join(tree, "ckptd.yaml"), "w") as f:
            f.write(f"hooks:\n  webhooks:\n    - url: {rx.url}\n      secret: env:CK_WH\n"
                    "      events: [checkpoint.registered]\n")
        env = dict(os.environ, **ENV)
        log = open(os.path.join(self.dir, "watch.log"), "w+")
        self.addCleanup(log.close)
        p = subprocess.Popen([CKPTD, "watch", "--settle", "0", tree], stdout=log,
                             stderr=subprocess.STDOUT, env=env)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))

        def text():
            log.seek(0)
            return log.read()
        deadline = time.time() + 30
        while "metadata.written" not in text():  # the first pass is done
            self.assertLess(time.time(), deadline, text())
            time.sleep(0.02)
        time.sleep(0.2)
        db = sqlite3.connect(os.path.join(tree, ".ckptd", "state.db"), timeout=30)
        db.execute("CREATE TRIGGER full BEFORE INSERT ON hook_events "
                   "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
        db.commit()
        with open(os.path.join(tree, "epoch_1.pt"), "wb") as f:
            f.write(os.urandom(2000))
        self.assertEqual(p.wait(timeout=60), 1, text())
        self.assertIn("watch.event_lost", text())
        self.assertIn("disk is full", text())
        db.execute("DROP TRIGGER full")
        db.commit()
        db.close()
        p2 = subprocess.Popen([CKPTD, "watch", tree], stdout=log, stderr=subprocess.STDOUT, env=env)
        self.addCleanup(lambda: p2.poll() is None and (p2.kill(), p2.wait()))
        got = rx.wait_requests(1)
        time.sleep(0.5)
        p2.send_signal(signal.SIGTERM)
        self.assertEqual(p2.wait(timeout=60), 0, text())
        bodies = [json.loads(q["body"]) for q in rx.requests()]
        regs = [b for b in bodies if b["type"] == "checkpoint.registered"]
        self.assertEqual(len(regs), 1, bodies)
        self.assertEqual(regs[0]["data"]["checkpoint"]["epoch"], 1)
        self.assertTrue(got)


class DurableExecHooks(TmpDirCase):
    def test_an_exec_hook_killed_with_its_agent_runs_again_once(self):
        """kill -9 of ckptd (and of the hook it was running): the next run
        starts the hook again, with the same event; the run after that does
        not (the first re-run ended)."""
        import signal
        tree = os.path.join(self.dir, "run")
        os.makedirs(tree)
        started = os.path.join(self.dir, "started")
        out = os.path.join(self.dir, "out")
        marker = f"ckptd-durable-{os.getpid()}"
        with open(os.path.join(tree, "ckptd.yaml"), "w") as f:
            f.write("hooks:\n  exec:\n    - event: checkpoint.registered\n"
                    f"      command: 'echo \"$CKPTD_ID\" >> {started}; sleep 2; : {marker};"
                    f" echo \"$CKPTD_ID $CKPTD_EVENT\" >> {out}'\n")
        write_old(os.path.join(tree, "epoch_1.pt"), os.urandom(1000))
        p = subprocess.Popen([CKPTD, "scan", tree], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while not os.path.exists(started):
            self.assertLess(time.time(), deadline, "the hook never started")
            self.assertIsNone(p.poll())
            time.sleep(0.02)
        p.send_signal(signal.SIGKILL)
        p.wait()
        subprocess.run(["pkill", "-KILL", "-f", marker])
        time.sleep(0.2)
        self.assertFalse(os.path.exists(out), "the hook ran to its end: nothing was interrupted")
        with open(started) as f:
            event_id = f.read().split()[0]
        r = run("scan", tree, check=0, timeout=60)
        self.assertIn("hook.exec.recovered", r.stderr)
        with open(out) as f:
            self.assertEqual(f.read().split(), [event_id, "checkpoint.registered"])
        r = run("scan", tree, check=0, timeout=60)
        self.assertNotIn("hook.exec.recovered", r.stderr)
        with open(out) as f:
            self.assertEqual(len(f.read().splitlines()), 1)


class StructuredLogs(TmpDirCase):
    def test_json_log_fields_have_their_types(self):
        """`ckptd scan --log-format json` lines parse as JSON, each field a typed
        member a log shipper (or jq) can filter on; the message is prose."""
        write_old(os.path.join(self.dir, "epoch_7.pt"), os.urandom(4096))
        p = run("scan", "--log-format", "json", self.dir, check=0)
        lines = [json.loads(l) for l in p.stderr.splitlines() if l.strip()]
        self.assertTrue(lines)
        for l in lines:
            self.assertEqual(set(l) & {"time", "level", "event", "msg"},
                             {"time", "level", "event", "msg"}, l)
            self.assertNotIn("=", l["msg"].split("'")[0], l)  # no key=value left in prose
        reg = [l for l in lines if l["event"] == "checkpoint.registered"]
        self.assertEqual(len(reg), 1, lines)
        self.assertEqual(reg[0]["epoch"], 7)
        self.assertIsInstance(reg[0]["epoch"], int)
        self.assertEqual(reg[0]["bytes"], 4096)
        self.assertEqual(reg[0]["msg"], "checkpoint registered")
        jq = subprocess.run(["jq", "-c", "select(.event == \"checkpoint.registered\") | .epoch"],
                            input=p.stderr, capture_output=True, text=True)
        if jq.returncode == 0:
            self.assertEqual(jq.stdout.strip(), "7")


def promtool_check(test, text, what):
    promtool = shutil.which("promtool")
    if not promtool:  # .ci/packages.txt installs prometheus, which ships it
        test.fail("promtool is not installed (Debian package prometheus)")
    p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    test.assertEqual(p.returncode, 0, f"promtool on {what}: {p.stdout}{p.stderr}")


def samples(text):
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


class WrappedOutput(TmpDirCase):
    TRAINER = ("printf 'epoch 1 loss=0.5\\n'; printf 'it said \"quote\" and \\047x\\047\\n' >&2; "
               "head -c 40000 /dev/zero | tr '\\0' a; echo; printf 'no newline at the end'")

    def test_json_mode_makes_the_commands_output_records(self):
        p = run("watch", "--log-format", "json", self.dir, "--", "sh", "-c", self.TRAINER, check=0)
        self.assertEqual(p.stdout, "")  # nothing of the command outside the records
        recs = [json.loads(l) for l in p.stderr.splitlines()]  # every line is JSON
        out = [(r["stream"], r["line"]) for r in recs if r["event"] == "command.output"]
        self.assertEqual(out[0], ("stdout", "epoch 1 loss=0.5"))
        self.assertIn(("stderr", "it said \"quote\" and 'x'"), out)
        long = [l for s, l in out if l and set(l) == {"a"}]
        self.assertEqual(sum(len(l) for l in long), 40000)  # in pieces, nothing lost
        self.assertTrue(all(len(l) <= 16384 for l in long))
        # each stream in its order (the two streams interleave as they are read)
        self.assertEqual([l for s, l in out if s == "stdout"][-1], "no newline at the end")
        # the records come before the command's exit is logged
        events = [r["event"] for r in recs]
        self.assertLess(max(i for i, e in enumerate(events) if e == "command.output"),
                        events.index("command.exited"))

    def test_the_command_starts_with_no_signal_ignored_or_blocked(self):
        """What ckptd's own parent ignored or blocked (nohup, a shell's
        background job, a supervisor) and what ckptd sets for itself stays
        with ckptd: the training command starts with every signal at its
        default, like a service started by systemd."""
        import signal

        def inherited():
            for sig in (signal.SIGQUIT, signal.SIGUSR1, signal.SIGTTOU, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2, signal.SIGTERM})
        p = subprocess.run([CKPTD, "watch", self.dir, "--", "grep", "-E", "^Sig(Ign|Blk):",
                            "/proc/self/status"], preexec_fn=inherited, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = {k: int(v, 16) for k, v in (line.split(":\t") for line in p.stdout.splitlines())}
        # glibc's posix_spawn leaves its own two internal signals (32 and 33,
        # outside sigfillset) ignored in every child; its threads code takes
        # them back when it needs them
        glibc_internal = (1 << 31) | (1 << 32)
        self.assertEqual((got["SigBlk"], got["SigIgn"] & ~glibc_internal), (0, 0),
                         "signals blocked, ignored: " + p.stdout)

    def test_text_mode_leaves_the_output_alone(self):
        p = run("watch", self.dir, "--", "sh", "-c", "echo hello from the trainer; echo err >&2",
                check=0)
        self.assertEqual(p.stdout, "hello from the trainer\n")
        self.assertIn("err\n", p.stderr)
        self.assertNotIn("command.output", p.stderr)


class StartBeforeTheTrainer(TmpDirCase):
    def watch(self, *args):
        log = open(os.path.join(self.dir, "watch.log"), "w+")
        self.addCleanup(log.close)
        p = subprocess.Popen([CKPTD, "watch", *args], stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))

        def text():
            log.seek(0)
            return log.read()
        return p, text

    def wait_log(self, text, what, p):
        deadline = time.time() + 30
        while what not in text():
            self.assertLess(time.time(), deadline, text())
            self.assertIsNone(p.poll(), text())
            time.sleep(0.02)

    def test_a_missing_folder_is_waited_for(self):
        import signal
        import yaml
        tree = os.path.join(self.dir, "jobs", "run7")  # neither exists yet
        p, text = self.watch("--settle", "0", tree)
        self.wait_log(text, "watch.waiting", p)
        time.sleep(0.2)
        self.assertIsNone(p.poll(), text())
        os.makedirs(os.path.join(self.dir, "jobs"))  # the parent first, as a trainer would
        time.sleep(0.1)
        os.makedirs(tree)
        self.wait_log(text, "watch.started", p)
        with open(os.path.join(tree, "epoch_1.pt"), "wb") as f:
            f.write(os.urandom(1000))
        deadline = time.time() + 30
        while True:
            try:
                with open(os.path.join(tree, "metadata.yaml")) as f:
                    if "epoch_1.pt" in yaml.safe_load(f)["model"]["training"]["checkpoints"]:
                        break
            except FileNotFoundError:
                pass
            self.assertLess(time.time(), deadline, text())
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=60), 0, text())

    def test_sigterm_while_waiting_exits_cleanly(self):
        import signal
        p, text = self.watch(os.path.join(self.dir, "never"))
        self.wait_log(text, "watch.waiting", p)
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=30), 0, text())
        self.assertFalse(os.path.exists(os.path.join(self.dir, "never")))

    def test_create_makes_the_folder(self):
        import signal
        tree = os.path.join(self.dir, "made", "here")
        p, text = self.watch("--create", tree)
        self.wait_log(text, "watch.started", p)
        self.assertTrue(os.path.isdir(tree))
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=60), 0, text())

    def test_a_command_that_makes_the_folder_is_started(self):
        """`ckptd watch runs/exp1 -- python train.py` where train.py makes
        runs/exp1: the folder is made (waiting for the command to make it
        would never end: the command starts once DIR exists) and the
        command's checkpoint is registered."""
        tree = os.path.join(self.dir, "runs", "exp1")
        p = run("watch", "--settle", "0", tree, "--", "/bin/sh", "-c",
                f"mkdir -p {tree} && head -c 1000 /dev/urandom > {tree}/epoch_1.pt",
                timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("watch.dir_created", p.stderr)
        meta = validate_tree(tree)["model"]["training"]
        self.assertEqual(meta["status"], "finished")
        self.assertEqual(list(meta["checkpoints"]), ["epoch_1.pt"])

    def test_a_file_in_its_place_is_an_error(self):
        path = os.path.join(self.dir, "afile")
        with open(path, "w"):
            pass
        p = run("watch", path)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("not a folder", p.stderr)


class CronMetrics(TmpDirCase):
    def test_textfile_counters_are_cumulative_across_runs(self):
        prom = os.path.join(self.dir, "ckptd.prom")
        tree = os.path.join(self.dir, "run")
        os.makedirs(tree)
        write_old(os.path.join(tree, "epoch_1.pt"), os.urandom(5000))
        before = time.time()
        run("scan", "--metrics-file", prom, tree, check=0)
        with open(prom) as f:
            first = f.read()
        promtool_check(self, first, "the textfile")
        m = samples(first)
        self.assertEqual(m["ckptd_checkpoints_registered_total"], 1)
        self.assertGreaterEqual(m["ckptd_last_success_timestamp_seconds"], int(before))
        self.assertEqual(m['ckptd_build_info{version="%s"}' % version()], 1)
        write_old(os.path.join(tree, "epoch_2.pt"), os.urandom(7000))
        run("scan", "--metrics-file", prom, tree, check=0)
        run("scan", "--metrics-file", prom, tree, check=0)  # nothing new: nothing lost either
        with open(prom) as f:
            m = samples(f.read())
        self.assertEqual(m["ckptd_checkpoints_registered_total"], 2)
        # the second run hashed the new 7000 bytes on top of the first run's
        self.assertGreaterEqual(m["ckptd_hashed_bytes_total"],
                                samples(first)["ckptd_hashed_bytes_total"] + 7000)
        # a failing run counts its failure and keeps the last success
        last_ok = m["ckptd_last_success_timestamp_seconds"]
        with open(os.path.join(tree, "ckptd.yaml"), "w") as f:
            f.write("upload:\n  stores:\n    - url: file:///proc/no/such/place\n")
        write_old(os.path.join(tree, "epoch_3.pt"), os.urandom(100))
        p = run("scan", "--metrics-file", prom, tree)
        self.assertNotEqual(p.returncode, 0)
        with open(prom) as f:
            text = f.read()
        promtool_check(self, text, "the textfile after a failure")
        m = samples(text)
        self.assertEqual(m["ckptd_checkpoints_registered_total"], 3)
        self.assertEqual(m["ckptd_last_success_timestamp_seconds"], last_ok)
        self.assertGreaterEqual(m['ckptd_uploads_total{result="failed"}'], 1)

    def test_endpoint_passes_promtool(self):
        import socket
        import urllib.request
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            port = sk.getsockname()[1]
        p = subprocess.Popen([CKPTD, "watch", "--listen", f"127.0.0.1:{port}", self.dir],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        text = None
        for _ in range(200):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
                break
            except OSError:
                time.sleep(0.05)
        self.assertIsNotNone(text, "no /metrics")
        promtool_check(self, text, "/metrics")
        # the first pass succeeded: the watcher's last success is now
        self.assertGreater(samples(text)["ckptd_last_success_timestamp_seconds"], time.time() - 600)
        self.assertIn('ckptd_build_info{version="%s"} 1' % version(), text)


class ConfigChecks(TmpDirCase):
    """`ckptd config` and `ckptd watch -n` exit 2 exactly when a start would."""

    def cases(self):
        loose = os.path.join(self.dir, "loose-secret")
        with open(loose, "w") as f:
            f.write(SECRET)
        os.chmod(loose, 0o644)
        tight = os.path.join(self.dir, "tight-secret")
        with open(tight, "w") as f:
            f.write("user:" + "p" * 20)
        os.chmod(tight, 0o600)
        return {
            "unset env secret": "hooks:\n  webhooks:\n    - url: http://127.0.0.1:9/h\n"
                                "      secret: env:CK_SURELY_UNSET_VAR\n",
            "secret file readable by others": "hooks:\n  webhooks:\n    - url: http://127.0.0.1:9/h\n"
                                              f"      secret: file:{loose}\n",
            "missing store credentials file": "upload:\n  stores:\n    - url: http://127.0.0.1:9/up\n"
                                              f"      credentials: file:{self.dir}/none\n",
            "unset store credentials": "upload:\n  stores:\n    - url: http://127.0.0.1:9/up\n"
                                       "      credentials: env:CK_SURELY_UNSET_VAR\n",
            "missing sftp key": "upload:\n  stores:\n    - url: sftp://u@127.0.0.1:1/x\n"
                                f"      key_file: {self.dir}/no-key\n"
                                "      host_key: SHA256:" + "A" * 43 + "\n",
        }, ("upload:\n  stores:\n    - url: http://127.0.0.1:9/up\n"
            f"      credentials: file:{tight}\n")

    def test_config_and_watch_n_agree_with_the_start(self):
        bad, good = self.cases()
        for name, text in bad.items():
            with self.subTest(name):
                d = os.path.join(self.dir, name.replace(" ", "_"))
                os.makedirs(d)
                with open(os.path.join(d, "ckptd.yaml"), "w") as f:
                    f.write(text)
                start = run("watch", d, timeout=30)
                self.assertEqual(start.returncode, 2, f"{name}: the start: {start.stderr}")
                for args in (("config", d), ("watch", "-n", d), ("scan", "--check", d)):
                    p = run(*args, env=ENV)
                    self.assertEqual(p.returncode, 2, f"{name}: ckptd {args[0]}: {p.stderr}")
                    self.assertNotIn(SECRET, p.stdout + p.stderr)
                    self.assertNotIn("p" * 20, p.stdout + p.stderr)
        d = os.path.join(self.dir, "good")
        os.makedirs(d)
        with open(os.path.join(d, "ckptd.yaml"), "w") as f:
            f.write(good)
        run("config", d, check=0)
        run("watch", "-n", d, check=0)


class Sweep(TmpDirCase):
    def test_a_start_removes_what_killed_runs_left(self):
        """Scans killed with kill -9 while writing leave temporaries; the next
        start removes them (and only them: the trainer's files stay)."""
        import signal
        tree = os.path.join(self.dir, "run")
        os.makedirs(tree)
        for e in range(1, 40):
            write_old(os.path.join(tree, f"epoch_{e}.pt"), os.urandom(20000))
        # the trainer's own files that look like temporaries stay untouched
        theirs = [".epoch_1.pt.abc123.tmp", "x.ckptd-abcdef.tmp", ".notes.tmp",
                  ".metadata.yaml.1234567.tmp"]
        for n in theirs:
            write_old(os.path.join(tree, n), b"trainer")
        # kill -9 each scan the moment one of its temporaries exists (a tight
        # look at the folders it writes; metadata.yaml's is fsynced before
        # its rename, so it stays a while): a killed run's real leftovers
        killed_with_leftovers = 0
        for i in range(60):
            # a new checkpoint each time, so that each scan has writing to do
            write_old(os.path.join(tree, f"epoch_{100 + i}.pt"), os.urandom(5000))
            p = subprocess.Popen([CKPTD, "scan", tree], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            while p.poll() is None:
                if leftovers(tree):
                    p.send_signal(signal.SIGKILL)
                    break
            p.wait()
            if p.returncode == -signal.SIGKILL and leftovers(tree):
                killed_with_leftovers += 1
                if killed_with_leftovers >= 3:
                    break
        left = leftovers(tree)
        p = run("scan", tree, check=0)
        self.assertEqual(leftovers(tree), [], p.stderr)
        if left:
            self.assertIn(f"temporaries={len(left)}", p.stderr)
        for n in theirs:
            self.assertTrue(os.path.exists(os.path.join(tree, n)), n)
        # the runs were really killed mid-write, so the sweep met real leftovers
        self.assertGreater(killed_with_leftovers, 0,
                           "no kill left a temporary: the test proves nothing")


def leftovers(tree):
    out = []
    for root, dirs, files in os.walk(tree):
        for n in files:
            if ".ckptd-" in n and n.endswith(".tmp") and n.startswith("."):
                out.append(os.path.join(root, n))
    return out


def version():
    out = run("--version", check=0).stdout.strip()
    return out.split()[-1]


if __name__ == "__main__":
    unittest.main()
