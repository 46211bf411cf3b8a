"""contrib/ as a user runs it: the Kubernetes trainer container's command as
its PID 1 (in a PID namespace of its own, as a container has), with a stand-in
`python` on PATH that records the signals it receives."""
import os
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import TmpDirCase  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SIDECAR = os.path.join(ROOT, "contrib", "kubernetes", "sidecar.yaml")

# The stand-in for `python train.py`: writes "started", then per FAKE_MODE
# exits with a status or waits; a SIGTERM is written down and ends it with 143.
FAKE_PYTHON = """#!/usr/bin/python3
import os, signal, sys, time
out = os.environ["FAKE_OUT"]
def term(signum, frame):
    with open(os.path.join(out, "sigterm"), "w") as f:
        f.write("pid %d\\n" % os.getpid())
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
with open(os.path.join(out, "started"), "w") as f:
    f.write(" ".join(sys.argv[1:]))
mode = os.environ["FAKE_MODE"]
if mode == "wait":
    time.sleep(120)
    sys.exit(0)
sys.exit(int(mode))
"""


def unshare_pid():
    """The command prefix that gives a process a PID namespace of its own,
    or SkipTest saying why this machine cannot."""
    for prefix in (["unshare", "--pid", "--fork"],
                   ["unshare", "--user", "--map-root-user", "--pid", "--fork"]):
        try:
            p = subprocess.run(prefix + ["/bin/sh", "-c", "echo $$"], capture_output=True,
                               text=True, timeout=20)
        except FileNotFoundError:
            raise unittest.SkipTest("unshare (util-linux) is not installed")
        if p.returncode == 0 and p.stdout.strip() == "1":
            return prefix
        last = p.stderr.strip()
    raise unittest.SkipTest(f"this machine does not allow a PID namespace: unshare: {last}")


class KubernetesTrainer(TmpDirCase):
    def trainer(self, name):
        """The trainer container's command and args from sidecar.yaml, with
        /checkpoints pointing at a scratch folder self.dir/name."""
        import yaml
        with open(SIDECAR) as f:
            docs = list(yaml.safe_load_all(f))
        job = [d for d in docs if d["kind"] == "Job"][0]["spec"]["template"]["spec"]
        c = [c for c in job["containers"] if c["name"] == "trainer"][0]
        mount = [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "checkpoints"][0]
        base = os.path.join(self.dir, name)
        ckpt = os.path.join(base, "checkpoints")
        os.makedirs(ckpt)
        argv = [a.replace(mount, ckpt) for a in c["command"] + c["args"]]
        bindir = os.path.join(base, "bin")
        os.makedirs(bindir)
        with open(os.path.join(bindir, "python"), "w") as f:
            f.write(FAKE_PYTHON)
        os.chmod(os.path.join(bindir, "python"), 0o755)
        self.out = os.path.join(base, "out")
        os.makedirs(self.out)
        return argv, ckpt, bindir

    def start(self, mode, prefix=()):
        argv, ckpt, bindir = self.trainer("run-" + mode)
        env = dict(os.environ, PATH=bindir + ":" + os.environ["PATH"], FAKE_OUT=self.out,
                   FAKE_MODE=mode)
        p = subprocess.Popen(list(prefix) + argv, env=env, cwd=self.dir,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        return p, ckpt

    def test_exit_status_writes_the_marker(self):
        """The trainer's status decides the marker ckptd waits for, and is
        the container's exit status."""
        for mode, marker in (("0", "DONE"), ("3", "FAILED")):
            p, ckpt = self.start(mode)
            out, _ = p.communicate(timeout=30)
            self.assertEqual(p.returncode, int(mode), out)
            with open(os.path.join(self.out, "started")) as f:
                self.assertIn("--checkpoint-dir " + ckpt, f.read())
            self.assertEqual(sorted(os.listdir(ckpt)), [marker], mode)
            os.remove(os.path.join(ckpt, marker))

    def test_pid_1_forwards_sigterm_to_the_trainer(self):
        """In a PID namespace the shell is PID 1, which the kernel shields
        from signals it has no handler for: a SIGTERM (what the kubelet sends
        on a Job delete or a node drain) must still reach python, and the
        container end without a marker (ckptd's SIGTERM hand-over follows)."""
        prefix = unshare_pid()
        p, ckpt = self.start("wait", prefix)
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(self.out, "started")):
            self.assertLess(time.time(), deadline, "the trainer did not start")
            if p.poll() is not None:
                self.fail(f"the container ended before the trainer started: {p.stdout.read()}")
            time.sleep(0.05)
        # unshare --fork's child is the namespace's PID 1: the container's command
        with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
            kids = f.read().split()
        self.assertEqual(len(kids), 1, kids)
        pid1 = int(kids[0])
        with open(f"/proc/{pid1}/status") as f:
            nspid = [line.split()[1:] for line in f if line.startswith("NSpid:")][0]
        self.assertEqual(nspid[-1], "1", "the shell is not PID 1 of its namespace")
        os.kill(pid1, signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.fail("SIGTERM to the container's PID 1 did not end it within 20 s "
                      "(the shell ignores it: the trainer would be SIGKILLed at the "
                      "end of the grace period)")
        self.assertTrue(os.path.exists(os.path.join(self.out, "sigterm")),
                        "the trainer never received SIGTERM")
        self.assertEqual(p.returncode, 143, out)
        self.assertEqual(os.listdir(ckpt), [], "no marker on SIGTERM: ckptd's own hand-over")


if __name__ == "__main__":
    unittest.main()
