"""The sidecar in production (issue 16), end to end with the real binary:
no event lost under load, structured logs a log shipper can use."""
import base64
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, run, write_old  # noqa: E402
from webhook_receiver import Receiver  # noqa: E402

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


if __name__ == "__main__":
    unittest.main()
