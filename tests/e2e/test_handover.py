"""SIGTERM with a wrapped trainer (issue 27): `ckptd watch DIR -- COMMAND`
gets SIGTERM while an upload is in flight. The trainer gets the signal and
its grace; then the final pass, the status from the trainer's exit code and
metadata.yaml uploaded last, as without a command. The real binary, a
trainer in sh that signals its parent (ckptd) itself, nginx WebDAV on
loopback as the store (its files are read back directly), an upload cap so
that a transfer is running when the signal comes."""
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, run  # noqa: E402
from servers import Nginx  # noqa: E402
from pmf_validate import validate_tree  # noqa: E402

import yaml  # noqa: E402

# Writes N checkpoints of SIZE bytes (temporary name, then renamed into
# place, as frameworks do), waits until ckptd's LOG shows an upload started,
# then (with "late") one more checkpoint that only the final pass can
# register, then DELAY, then sends SIGTERM to ckptd; killed by the forwarded signal, or exiting 0 on it.
TRAINER = r"""
n=$1 size=$2 delay=$3 mode=$4 log=$5 late=$6
if [ "$mode" = clean ]; then trap 'exit 0' TERM; fi
i=1
while [ $i -le $n ]; do
  head -c $size /dev/urandom > epoch_$i.pt.tmp
  mv epoch_$i.pt.tmp epoch_$i.pt
  i=$((i + 1))
  [ $i -le $n ] && sleep 1
done
# the signal must find a transfer running: wait for ckptd to start one (a
# loaded machine may take seconds), then DELAY
t=0
while ! grep -q 'upload\.start' "$log" && [ $t -lt 600 ]; do sleep 0.1; t=$((t + 1)); done
if [ "$late" = late ]; then
  head -c 1000 /dev/urandom > epoch_$i.pt.tmp
  mv epoch_$i.pt.tmp epoch_$i.pt
fi
sleep $delay
kill -TERM $PPID
sleep 5 & wait
exit 3
"""

EXIT_BOUND = 90  # seconds a round may take, signal to exit: grace 20 s + upload.grace 20 s, and slack


def md5(path):
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


class WrappedHandover(TmpDirCase):
    def round(self, web, name, delay, mode, upload="", watch="", size=600000, n=2, late=False):
        tree = os.path.join(self.dir, name)
        os.makedirs(tree)
        with open(os.path.join(tree, "ckptd.yaml"), "w") as f:
            # about 2 s per checkpoint at this cap: a transfer runs when the signal comes
            f.write(f"upload:\n  max_rate: 300KiB\n{upload}  stores:\n    - url: {web.url}/{name}\n"
                    f"watch:\n  settle: 100ms\n{watch}")
        script = os.path.join(self.dir, "trainer.sh")
        with open(script, "w") as f:
            f.write(TRAINER)
        log = open(os.path.join(self.dir, name + ".log"), "w+")
        t0 = time.monotonic()
        p = subprocess.Popen([CKPTD, "watch", tree, "--", "/bin/sh", script, str(n), str(size),
                              str(delay), mode, log.name, "late" if late else "-"], stdout=log, stderr=subprocess.STDOUT, cwd=tree)
        try:
            code = p.wait(timeout=EXIT_BOUND)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            log.seek(0)
            self.fail(f"{name}: ckptd watch still running after {EXIT_BOUND} s:\n{log.read()}")
        secs = time.monotonic() - t0
        log.seek(0)
        text = log.read()
        log.close()
        return tree, code, text, secs

    def check_handed_over(self, web, name, tree, code, text, mode):
        want_code, want_status = (0, "finished") if mode == "clean" else (128 + 15, "failed")
        self.assertEqual(code, want_code, f"{name}:\n{text}")
        # the signal went to the trainer, and an upload was running when it came
        self.assertIn("signal.received: signal=SIGTERM", text)
        sig = text.index("signal.received: signal=SIGTERM")
        self.assertIn("upload.start", text[:sig], f"{name}: no upload before the signal\n{text}")
        with open(os.path.join(tree, "metadata.yaml"), "rb") as f:
            local = f.read()
        meta = validate_tree(tree)["model"]["training"]
        self.assertEqual(meta["status"], want_status, name)
        # every checkpoint the trainer finished is registered (its writer is gone)
        on_disk = sorted(x for x in os.listdir(tree) if re.fullmatch(r"epoch_\d+\.pt", x))
        self.assertEqual(sorted(meta["checkpoints"]), on_disk, f"{name}:\n{text}")
        remote = os.path.join(web.root, name)
        # the store's metadata.yaml is the final local one, byte for byte ...
        with open(os.path.join(remote, "metadata.yaml"), "rb") as f:
            self.assertEqual(f.read(), local, f"{name}: the store's metadata.yaml\n{text}")
        # ... and names nothing the store lacks
        for ref in meta["checkpoints"]:
            path = meta["checkpoints"][ref]["path"]
            self.assertEqual(md5(os.path.join(remote, path)), md5(os.path.join(tree, path)),
                             f"{name}: {path}")
        # metadata.yaml went last, and nothing was left behind
        done = re.findall(r'upload\.done: job=\d+ store="[^"]*" key="([^"]+)"', text)
        self.assertTrue(done and done[-1] == "metadata.yaml", f"{done}\n{text}")
        self.assertIn("watch.handed_over", text, name)
        self.assertNotIn("watch.handover_incomplete", text, name)

    def test_sigterm_with_an_upload_in_flight_hands_everything_over(self):
        """Several rounds, SIGTERM at different delays after the last checkpoint
        closed, the trainer killed by it or exiting 0 on it."""
        with Nginx(self.dir) as web:
            for i, (delay, mode) in enumerate([(0, "killed"), (0.1, "clean"), (0.25, "killed"),
                                               (0.5, "clean"), (0.05, "killed")]):
                name = f"r{i}"
                tree, code, text, secs = self.round(web, name, delay, mode)
                self.check_handed_over(web, name, tree, code, text, mode)

    def test_what_cannot_be_finished_is_counted(self):
        """A hand-over too short for what is queued: the rest stays queued,
        watch.handover_incomplete says how much, and the next start sends it.
        A checkpoint closed just before the signal is registered by the final
        pass and queued with it, though the hand-over ends first."""
        with Nginx(self.dir) as web:
            tree, code, text, secs = self.round(
                web, "short", 0, "killed", upload="  grace: 1s\n", watch="  grace_period: 1s\n",
                size=3000000, n=1, late=True)
            self.assertEqual(code, 128 + 15, text)
            m = re.search(r"watch\.handover_incomplete: uploads_left=(\d+) deliveries_left=(\d+)",
                          text)
            self.assertIsNotNone(m, text)
            jobs = [json.loads(x) for x in run("queue", "--json", tree).stdout.splitlines() if x]
            left = [j for j in jobs if j["state"] in ("pending", "running")]
            self.assertEqual(int(m.group(1)), len(left), f"{jobs}\n{text}")
            self.assertIn("metadata.yaml", [j["key"] for j in left], f"{jobs}\n{text}")
            # what the final pass registered is queued or sent, never only on disk
            meta = validate_tree(tree)["model"]["training"]
            self.assertIn("epoch_2.pt", meta["checkpoints"], text)
            for ref, c in meta["checkpoints"].items():
                sent = os.path.exists(os.path.join(web.root, "short", c["path"]))
                self.assertTrue(sent or c["path"] in [j["key"] for j in left],
                                f"{ref}: neither sent nor queued\n{jobs}\n{text}")
            # the store never saw a metadata.yaml naming what it lacks: the
            # one it holds (the first, of no checkpoint, when the watcher's
            # first round sent it) names only what it has, byte for byte
            remote = os.path.join(web.root, "short")
            if os.path.exists(os.path.join(remote, "metadata.yaml")):
                named = validate_tree(remote)["model"]["training"]["checkpoints"]
                self.assertNotIn("epoch_1.pt", named, text)  # its upload never ended
                for ref, c in named.items():
                    self.assertEqual(md5(os.path.join(remote, c["path"])), c["hash"], ref)
            # the next run sends what stayed queued: the store ends as the tree is
            with open(os.path.join(tree, "ckptd.yaml"), "w") as f:
                f.write(f"upload:\n  stores:\n    - url: {web.url}/short\n")
            p = run("scan", tree, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(tree, "metadata.yaml"), "rb") as a, \
                    open(os.path.join(web.root, "short", "metadata.yaml"), "rb") as b:
                self.assertEqual(a.read(), b.read())


if __name__ == "__main__":
    unittest.main()
