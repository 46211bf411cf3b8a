"""Log fields that mean the same thing are spelled the same in every event:
a signal is named as signal.h names it (SIGTERM, SIGSEGV), whether ckptd
received it, forwarded it, or it ended the wrapped command."""
import json
import os
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, run  # noqa: E402


def records(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


class SignalNames(TmpDirCase):
    def test_signals_are_named_as_in_signal_h(self):
        # the command dies of SIGSEGV (strsignal: "Segmentation fault", with a space)
        p = run("watch", "--log-format", "json", "--settle", "0", self.dir, "--",
                "/bin/sh", "-c", "kill -SEGV $$", timeout=60)
        self.assertEqual(p.returncode, 128 + signal.SIGSEGV, p.stderr)
        ex = [r for r in records(p.stderr) if r["event"] == "command.exited"]
        self.assertEqual(len(ex), 1, p.stderr)
        self.assertEqual(ex[0]["signal"], "SIGSEGV", ex[0])
        self.assertEqual(ex[0]["code"], 128 + signal.SIGSEGV, ex[0])

        # ckptd receives SIGTERM and forwards it: the same name in the three events
        d = os.path.join(self.dir, "term")
        os.makedirs(d)
        log = open(os.path.join(self.dir, "term.log"), "w+")
        self.addCleanup(log.close)
        w = subprocess.Popen([CKPTD, "watch", "--log-format", "json", d, "--",
                              "/bin/sh", "-c", "sleep 60 & wait"], stderr=log,
                             stdout=subprocess.DEVNULL)
        self.addCleanup(lambda: w.poll() is None and (w.kill(), w.wait()))

        def text():
            log.seek(0)
            return log.read()
        deadline = time.time() + 30
        while '"command.started"' not in text():
            self.assertLess(time.time(), deadline, text())
            time.sleep(0.05)
        w.send_signal(signal.SIGTERM)
        w.wait(timeout=60)
        got = {r["event"]: r.get("signal") for r in records(text())
               if r["event"] in ("signal.received", "command.signalled", "command.exited")}
        self.assertEqual(got, {"signal.received": "SIGTERM", "command.signalled": "SIGTERM",
                               "command.exited": "SIGTERM"}, text())


if __name__ == "__main__":
    unittest.main()
