"""Log fields that mean the same thing are spelled the same in every event:
a signal is named as signal.h names it (SIGTERM, SIGSEGV), whether ckptd
received it, forwarded it, or it ended the wrapped command; every field of
every log call is in docs/logging.md's table with its type, and the JSON
records of a real run carry the types the table gives."""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, run, write_old  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TYPES = {"string", "integer", "decimal"}


def field_table():
    """docs/logging.md's field table: {name: type}."""
    with open(os.path.join(ROOT, "docs", "logging.md")) as f:
        text = f.read()
    section = text[text.index("## Field names"):]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([a-z_0-9]+)`", cells[0])
        types = [t.strip() for t in cells[1].split(",")]
        if len(types) == 1:
            types = types * len(names)
        assert len(types) == len(names) and set(types) <= TYPES, line
        for n, t in zip(names, types):
            assert n not in table, f"{n} is in the table twice"
            table[n] = t
    return table


# A log call: ck_debug/ck_info/ck_warn/ck_err("event", "format" "format"...)
# or ck_log(LEVEL, "event", ...); a field is key=value in its format.
LOG_CALL = re.compile(r'\bck_(?:debug|info|warn|err|log\s*\([^;"]*?,)\s*\(?\s*"([a-z_][\w.]*)"\s*,'
                      r'((?:\s*(?:"(?:[^"\\]|\\.)*"|PRI\w+))+)')
FIELD = re.compile(r'(?:^|[\s(,;])([a-z_][a-z0-9_]*)=(\\"|\'|)'
                   r'(%[-+ #0]*\d*(?:\.\d+)?(?:ll|l|z|j|hh|h)?[a-zA-Z]|%"|[A-Za-z0-9_.]+)')


def source_fields():
    """{field: {type: [(file, event)]}} from every log call of the sources."""
    found = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "*", "**", "*.c"), recursive=True)):
        rel = os.path.relpath(path, ROOT)
        if rel.split(os.sep)[0] in ("tests", "bench", "build") or rel.startswith("b-"):
            continue
        with open(path, errors="replace") as f:
            src = f.read()
        for m in LOG_CALL.finditer(src):
            fmt = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"|(PRI\w+)', m.group(2))
                          and [a or ("%" + b[3:]) for a, b in
                               re.findall(r'"((?:[^"\\]|\\.)*)"|(PRI\w+)', m.group(2))])
            for key, quote, conv in FIELD.findall(fmt):
                if quote:
                    t = "string"
                elif conv.startswith("%") and conv[-1] in "diu":
                    t = "integer"
                elif conv.startswith("%") and conv[-1] in "fgeG":
                    t = "decimal"
                elif conv.startswith("%"):
                    t = "string"
                elif conv.isdigit():
                    t = "integer"
                else:
                    t = "string"
                found.setdefault(key, {}).setdefault(t, []).append((rel, m.group(1)))
    return found


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



class Vocabulary(TmpDirCase):
    def test_every_field_is_in_the_table(self):
        table = field_table()
        found = source_fields()
        # the scan itself sees the fields it must (a broken scan passes nothing)
        for k in ("checkpoint", "bytes", "seconds", "job", "signal", "code"):
            self.assertIn(k, found)
        problems = []
        for key, types in sorted(found.items()):
            where = "; ".join(f"{e} ({f})" for t in types for f, e in types[t][:3])
            if key not in table:
                problems.append(f"{key} is not in docs/logging.md's field table: {where}")
                continue
            want = table[key]
            for t, uses in types.items():
                # an integer printed where the table says decimal is still a number
                if t != want and not (want == "decimal" and t == "integer"):
                    problems.append(f"{key} is {want} in the table but {t} in "
                                    + "; ".join(f"{e} ({f})" for f, e in uses[:3]))
        unused = sorted(set(table) - set(found))
        if unused:
            problems.append("in the table but in no log call: " + ", ".join(unused))
        self.assertEqual(problems, [], "\n".join(problems))

    def test_json_records_have_the_table_types(self):
        table = field_table()
        train = os.path.join(self.dir, "train")
        store = os.path.join(self.dir, "store")
        for e in (1, 2):
            write_old(os.path.join(train, f"epoch_{e}.pt"), os.urandom(3000 + e))
        with open(os.path.join(train, "ckptd.yaml"), "w") as f:
            f.write(f"upload:\n  stores:\n    - url: file://{store}\n"
                    "hooks:\n  exec:\n    - event: checkpoint.registered\n"
                    "      command: [/bin/sh, -c, 'cat >/dev/null; exit 3']\n"
                    "    - event: upload.completed\n"
                    "      command: [/bin/sh, -c, 'cat >/dev/null; kill -TERM $$']\n")
        p = run("scan", "-v", "--log-format", "json", train, timeout=120)
        self.assertEqual(p.returncode, 1, p.stderr)  # the hooks failed: the scan says so
        recs = records(p.stderr)
        events = {r["event"] for r in recs}
        for ev in ("checkpoint.registered", "upload.done", "upload.start", "hook.exec.failed",
                   "metadata.written", "scan.done"):
            self.assertIn(ev, events)
        pyt = {"string": (str,), "integer": (int,), "decimal": (int, float)}
        bad = []
        for r in recs:
            for k, v in r.items():
                if k in ("time", "level", "event", "msg"):
                    continue
                if k not in table:
                    bad.append(f"{r['event']}: {k} is not in the table")
                elif isinstance(v, bool) or not isinstance(v, pyt[table[k]]):
                    bad.append(f"{r['event']}: {k}={v!r} is not a {table[k]}")
        self.assertEqual(bad, [], "\n".join(bad))
        failed = [r for r in recs if r["event"] == "hook.exec.failed"]
        self.assertIn(3, [r.get("code") for r in failed], failed)
        self.assertIn("SIGTERM", [r.get("signal") for r in failed], failed)
        done = [r for r in recs if r["event"] == "upload.done"]
        self.assertTrue(all(r["bytes"] > 0 and "bytes_per_second" in r for r in done), done)
        # a checkpoint's uploads name it as its registration does: one grep finds both
        ck = {r["key"]: r.get("checkpoint") for r in done}
        self.assertEqual(ck["data/checkpoints/epoch_1.pt"], "epoch_1.pt", done)
        self.assertEqual(ck["data/checkpoints/epoch_2.pt"], "epoch_2.pt", done)
        self.assertIsNone(ck["metadata.yaml"], done)
        regs = {r["checkpoint"] for r in recs if r["event"] == "checkpoint.registered"}
        self.assertEqual(regs, {"epoch_1.pt", "epoch_2.pt"})


if __name__ == "__main__":
    unittest.main()
