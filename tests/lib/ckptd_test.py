"""Shared helpers for the end-to-end tests: run the real binary, make
scratch folders, write checkpoint files the way a training job does."""
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CKPTD = os.environ.get("CKPTD") or os.path.join(HERE, "..", "..", "build", "agent", "ckptd")
SHARED = os.environ.get("CK_SHARED_DATA") or os.path.join(HERE, "..", "..", "..", "shared", "data")
TMP = os.environ.get("CK_TEST_TMP") or tempfile.gettempdir()


def run(*args, env=None, timeout=60, input=None, check=None):
    """Runs ckptd with args; returns the CompletedProcess (text mode)."""
    e = dict(os.environ)
    if env:
        e.update(env)
    p = subprocess.run([CKPTD, *map(str, args)], capture_output=True, text=True, env=e,
                       timeout=timeout, input=input)
    if check is not None and p.returncode != check:
        raise AssertionError(f"ckptd {' '.join(map(str, args))}: exit {p.returncode}, "
                             f"expected {check}\nstdout: {p.stdout}\nstderr: {p.stderr}")
    return p


def md5_file(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def terminate(p, timeout=60):
    """SIGTERM to a running process, SIGKILL when it has not ended within
    timeout seconds; its exit code."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return p.returncode


def write_old(path, data, age=60):
    """Writes a finished file whose mtime is age seconds in the past."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    t = time.time() - age
    os.utime(path, (t, t))


def shared(*parts):
    """A path under ../shared/data, or SkipTest when that folder is absent."""
    p = os.path.join(SHARED, *parts)
    if not os.path.exists(p):
        raise unittest.SkipTest(f"shared data not available: {p}")
    return p


class TmpDirCase(unittest.TestCase):
    """A test with a fresh scratch folder self.dir, removed afterwards on success."""

    def setUp(self):
        os.makedirs(TMP, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix=self.id().split(".")[-1] + ".", dir=TMP)

    def tearDown(self):
        ok = all(err is None for _, err in getattr(self._outcome, "errors", []))
        if ok:
            shutil.rmtree(self.dir, ignore_errors=True)
