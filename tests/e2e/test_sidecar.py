"""The sidecar's deployment stages end to end (agent/deploy.h): every newly
registered checkpoint packed into .mldef and a SameDiff tag, each archive
run by the CPU engine, recorded in data/build_parameters.yaml and uploaded
to the S3 test server. What arrived is listed and fetched with awscli and
opened with zipfile/json/numpy; expected outputs come from numpy."""
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import unittest
import zipfile

import numpy as np
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, run, shared  # noqa: E402
from ckpt_formats import safetensors_from_numpy  # noqa: E402
from pmf_validate import validate_tree  # noqa: E402
from servers import S3Server, need  # noqa: E402

GRAPH = """  graph:
    input: {name: x, shape: [-1, 12]}
    layers:
      - {op: dense, weight: fc1.weight, bias: fc1.bias}
      - {op: relu}
      - {op: dense, weight: fc2.weight, bias: fc2.bias}
"""

# The trainer the watcher wraps: one MLP checkpoint per epoch (renamed into
# place as frameworks do); epoch BAD gets a NaN weight.
TRAINER = r"""
import json, os, struct, sys, time
import numpy as np
out, epochs, bad = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(out, exist_ok=True)
for e in range(1, epochs + 1):
    a = weights(e)
    if e == bad:
        a["fc2.weight"][1, 2] = np.nan
    tmp = os.path.join(out, f"epoch_{e}.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(safetensors(a))
        f.flush(); os.fsync(f.fileno())
    os.rename(tmp, os.path.join(out, f"epoch_{e}.safetensors"))
    time.sleep(0.5)
"""


def weights(epoch):
    rng = np.random.default_rng(epoch)
    return {"fc1.weight": rng.standard_normal((8, 12)).astype(np.float32),
            "fc1.bias": rng.standard_normal(8).astype(np.float32),
            "fc2.weight": rng.standard_normal((4, 8)).astype(np.float32),
            "fc2.bias": rng.standard_normal(4).astype(np.float32)}


def numpy_forward(a, x):
    h = np.maximum(x @ a["fc1.weight"].T + a["fc1.bias"], 0)
    return h @ a["fc2.weight"].T + a["fc2.bias"]


def write_ckpt(path, arrays, age=60):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(safetensors_from_numpy(arrays))
    t = time.time() - age
    os.utime(path, (t, t))


def archives(train):
    with open(os.path.join(train, "data", "build_parameters.yaml")) as f:
        doc = yaml.safe_load(f)
    assert isinstance(doc, dict)
    return doc.get("archives", {})


def events(train):
    """The events the exec hooks got on stdin, one file each (they run concurrently)."""
    d = os.path.join(os.path.dirname(train), "events")
    out = []
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        with open(os.path.join(d, name)) as f:
            out.append(json.loads(f.read()))
    return out


def edit_config(train, *pairs):
    """Rewrites train/ckptd.yaml, each (old, new) replaced in turn; every old must be there."""
    path = os.path.join(train, "ckptd.yaml")
    with open(path) as f:
        text = f.read()
    for old, new in pairs:
        assert old in text, f"{old!r} is not in {path}"
        text = text.replace(old, new)
    with open(path, "w") as f:
        f.write(text)

class Sidecar(TmpDirCase):
    def config(self, train, s3, extra=""):
        log = os.path.join(self.dir, "events")
        os.makedirs(log, exist_ok=True)
        with open(os.path.join(train, "ckptd.yaml"), "w") as f:
            f.write("pack:\n  formats: [mldef, samediff]\n" + GRAPH)
            f.write("verify:\n  inputs: [%s]\n  atol: 1e-5\n  on_failure: hold\n"
                    % os.path.join(self.dir, "x.npy"))
            f.write("hooks:\n  exec:\n")
            for ev in ("archive.*", "verification.*"):
                f.write(f"    - event: \"{ev}\"\n      command: [/bin/sh, -c, 'cat > {log}/$$.json']\n")
            f.write("upload:\n  retries: 1\n  retry_base: 100ms\n  stores:\n"
                    f"    - url: s3://ckpt/runs/r1\n      endpoint: {s3.endpoint}\n")
            f.write(extra)

    def check_uploaded(self, train, s3, good, bad, one_pass=True):
        keys = s3.keys()
        for e in good + bad:
            # every checkpoint is registered and uploaded, damaged or not
            self.assertIn(f"runs/r1/data/checkpoints/epoch_{e}.safetensors", keys)
        for e in good:
            key = f"runs/r1/data/deploy/epoch_{e}.safetensors.mldef"
            self.assertIn(key, keys)
            got = os.path.join(self.dir, f"got_{e}.mldef")
            s3.get(key, got)
            with zipfile.ZipFile(got) as z:
                self.assertIsNone(z.testzip())
                manifest = json.loads(z.read("manifest.json"))
                self.assertTrue(manifest)
            rec = archives(train)[f"epoch_{e}.safetensors.mldef"]
            self.assertEqual(rec["verification"], "passed")
            self.assertEqual(rec["size"], os.path.getsize(got))
            with open(got, "rb") as f:
                self.assertEqual(rec["sha256"], hashlib.sha256(f.read()).hexdigest())
        for e in bad:
            self.assertNotIn(f"runs/r1/data/deploy/epoch_{e}.safetensors.mldef", keys)
            rec = archives(train)[f"epoch_{e}.safetensors.mldef"]
            self.assertEqual(rec["verification"], "failed")
            self.assertIn("not finite", rec["verification_error"])
            self.assertEqual(rec["uploaded"], "held")
        # the archives after the checkpoint data, metadata.yaml last; the
        # tree valid for the PMF validator
        with open(os.path.join(s3.tmp, "s3rver.log"), errors="replace") as f:
            order = re.findall(r'Stored object "([^"]+)" in bucket', f.read())
        self.assertEqual(order[-1], "runs/r1/metadata.yaml", order)
        if one_pass:
            first_archive = min(i for i, k in enumerate(order) if "/data/deploy/" in k)
            last_ckpt = max(i for i, k in enumerate(order) if "/data/checkpoints/" in k)
            self.assertLess(last_ckpt, first_archive, order)
        validate_tree(train)

    def test_scan_packs_verifies_and_uploads(self):
        need("aws", "checking S3 uploads needs awscli")
        train = os.path.join(self.dir, "train")
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 12)
        np.save(os.path.join(self.dir, "x.npy"), x)
        for e in (1, 2):
            write_ckpt(os.path.join(train, "ckpts", f"epoch_{e}.safetensors"), weights(e))
        damaged = weights(3)
        damaged["fc2.weight"][1, 2] = np.nan
        write_ckpt(os.path.join(train, "ckpts", "epoch_3.safetensors"), damaged)
        with S3Server(self.dir) as s3:
            self.config(train, s3)
            p = run("scan", train, env=s3.env(), check=1, timeout=300)
            self.check_uploaded(train, s3, good=[1, 2], bad=[3])
            ev = events(train)
            types = [e["type"] for e in ev]
            self.assertEqual(types.count("archive.packed"), 6, p.stderr)  # 3 checkpoints x 2
            failed = [e for e in ev if e["type"] == "verification.failed"]
            self.assertTrue(any("epoch_3" in json.dumps(e) for e in failed), failed)
            self.assertIn("verification.passed", types)
            # the SameDiff archive got a tag per checkpoint; the damaged one was
            # taken back out (hold), so what was uploaded holds only tags that passed
            rec = archives(train)["train.zip"]
            self.assertEqual(rec["format"], "samediff")
            self.assertEqual(rec["verification"], "passed")
            self.assertIn("not finite", rec["failed.epoch_3.safetensors"])
            self.assertIn("taken back", rec["failed.epoch_3.safetensors"])
            got = os.path.join(self.dir, "got.zip")
            s3.get("runs/r1/data/deploy/train.zip", got)
            self.check_samediff(got, rec, ["epoch_1.safetensors", "epoch_2.safetensors"])
            # a second scan with nothing new packs nothing
            p = run("scan", train, env=s3.env(), check=0, timeout=300)
            self.assertNotIn("archive.packed", p.stderr)

    def check_samediff(self, got, rec, tags):
        """The archive at the store: its tags, each one's outputs as numpy computes them."""
        with zipfile.ZipFile(got) as z:
            self.assertIsNone(z.testzip())
            self.assertEqual(z.read("tags.txt").decode().split(), tags)
            self.assertFalse([n for n in z.namelist() if n.split("/")[0] not in tags + ["tags.txt"]])
        with open(got, "rb") as f:
            self.assertEqual(rec["sha256"], hashlib.sha256(f.read()).hexdigest())
        self.assertEqual(rec["tag"], tags[-1])
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 12)
        for t in tags:  # each tag's outputs are numpy's on that epoch's weights
            want = os.path.join(self.dir, f"y_{t}.npy")
            np.save(want, numpy_forward(weights(int(t.split("_")[1].split(".")[0])), x).astype(np.float32))
            run("verify", f"{got}#{t}", "--inputs", os.path.join(self.dir, "x.npy"),
                "--expected", want, "--atol", "1e-5", check=0)

    def test_samediff_failed_tag_never_uploaded(self):
        # hold: a damaged checkpoint between good ones, in one pass and across passes
        need("aws", "checking S3 uploads needs awscli")
        train = os.path.join(self.dir, "train")
        np.save(os.path.join(self.dir, "x.npy"),
                np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 12))
        damaged = weights(2)
        damaged["fc2.weight"][0, 0] = np.nan
        write_ckpt(os.path.join(train, "ckpts", "epoch_1.safetensors"), weights(1))
        write_ckpt(os.path.join(train, "ckpts", "epoch_2.safetensors"), damaged)
        write_ckpt(os.path.join(train, "ckpts", "epoch_3.safetensors"), weights(3))
        with S3Server(self.dir) as s3:
            self.config(train, s3)
            edit_config(train, ("formats: [mldef, samediff]", "formats: [samediff]"))
            p = run("scan", train, env=s3.env(), check=1, timeout=300)
            rec = archives(train)["train.zip"]
            self.assertIn("taken back", rec["failed.epoch_2.safetensors"], p.stderr)
            got = os.path.join(self.dir, "got.zip")
            s3.get("runs/r1/data/deploy/train.zip", got)
            self.check_samediff(got, rec, ["epoch_1.safetensors", "epoch_3.safetensors"])
            self.assertEqual(rec["verification"], "passed")
            # next pass: a damaged one alone is taken back; nothing new is uploaded
            damaged4 = weights(4)
            damaged4["fc1.bias"][0] = np.inf
            write_ckpt(os.path.join(train, "ckpts", "epoch_4.safetensors"), damaged4)
            before = open(os.path.join(train, "data", "deploy", "train.zip"), "rb").read()
            p = run("scan", train, env=s3.env(), check=1, timeout=300)
            self.assertEqual(open(os.path.join(train, "data", "deploy", "train.zip"), "rb").read(),
                             before)
            rec = archives(train)["train.zip"]
            self.assertIn("failed.epoch_4.safetensors", rec)
            self.assertEqual((rec["tag"], rec["verification"]), ("epoch_3.safetensors", "passed"))
            # and the next good one goes up without it
            write_ckpt(os.path.join(train, "ckpts", "epoch_5.safetensors"), weights(5))
            p = run("scan", train, env=s3.env(), check=0, timeout=300)
            rec = archives(train)["train.zip"]
            s3.get("runs/r1/data/deploy/train.zip", got)
            self.check_samediff(got, rec, ["epoch_1.safetensors", "epoch_3.safetensors", "epoch_5.safetensors"])
            # upload_marked: a failed tag stays in the archive and is marked
            edit_config(train, ("on_failure: hold", "on_failure: upload_marked"))
            damaged6 = weights(6)
            damaged6["fc2.bias"][1] = np.nan
            write_ckpt(os.path.join(train, "ckpts", "epoch_6.safetensors"), damaged6)
            p = run("scan", train, env=s3.env(), check=1, timeout=300)
            rec = archives(train)["train.zip"]
            self.assertIn("kept in the archive, marked failed", rec["failed.epoch_6.safetensors"], p.stderr)
            self.assertEqual((rec["verification"], rec["uploaded"]), ("failed", "yes"))
            s3.get("runs/r1/data/deploy/train.zip", got)
            with zipfile.ZipFile(got) as z:
                self.assertEqual(z.read("tags.txt").decode().split(),
                                 ["epoch_1.safetensors", "epoch_3.safetensors", "epoch_5.safetensors",
                                  "epoch_6.safetensors"])

    def test_recorded_sets_survive_a_later_tags_roll_back(self):
        # verify.record with hold: epoch_1 passes (its inputs and outputs are
        # recorded under its tag), epoch_2 fails and is taken back: the roll-back
        # must not take epoch_1's recorded set with it
        need("aws", "checking S3 uploads needs awscli")
        train = os.path.join(self.dir, "train")
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 12)
        np.save(os.path.join(self.dir, "x.npy"), x)
        damaged = weights(2)
        damaged["fc2.weight"][0, 0] = np.nan
        write_ckpt(os.path.join(train, "ckpts", "epoch_1.safetensors"), weights(1))
        write_ckpt(os.path.join(train, "ckpts", "epoch_2.safetensors"), damaged)
        with S3Server(self.dir) as s3:
            self.config(train, s3)
            edit_config(train, ("formats: [mldef, samediff]", "formats: [samediff]"),
                        ("  on_failure: hold\n", "  on_failure: hold\n  record: true\n"))
            p = run("scan", train, env=s3.env(), check=1, timeout=300)
            rec = archives(train)["train.zip"]
            self.assertIn("taken back", rec["failed.epoch_2.safetensors"], p.stderr)
            got = os.path.join(self.dir, "got.zip")
            s3.get("runs/r1/data/deploy/train.zip", got)
            with zipfile.ZipFile(got) as z:
                self.assertIsNone(z.testzip())
                names = z.namelist()
                self.assertEqual(z.read("tags.txt").decode().split(), ["epoch_1.safetensors"])
                self.assertIn("epoch_1.safetensors/tests/rec0/set.txt", names, p.stderr)
                self.assertFalse([n for n in names if n.startswith("epoch_2")], names)
            self.assertEqual(rec["size"], os.path.getsize(got))
            # the recorded set is what a target device re-runs
            v = run("verify", got + "#epoch_1.safetensors", check=0)
            self.assertEqual(v.returncode, 0, v.stdout + v.stderr)
            self.assertIn("rec0", v.stdout + v.stderr)

    def test_expected_outputs_and_unsupported_graph(self):
        need("aws", "checking S3 uploads needs awscli")
        train = os.path.join(self.dir, "train")
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 12)
        np.save(os.path.join(self.dir, "x.npy"), x)
        np.save(os.path.join(self.dir, "y.npy"), numpy_forward(weights(1), x).astype(np.float32))
        write_ckpt(os.path.join(train, "ckpts", "epoch_1.safetensors"), weights(1))
        write_ckpt(os.path.join(train, "ckpts", "epoch_2.safetensors"), weights(2))
        # a checkpoint whose weights do not fit the layer list: packing fails
        odd = weights(4)
        odd["fc2.weight"] = np.zeros((4, 5), np.float32)
        write_ckpt(os.path.join(train, "ckpts", "epoch_4.safetensors"), odd)
        with S3Server(self.dir) as s3:
            self.config(train, s3, extra="")
            edit_config(train, ("  atol: 1e-5\n", "  atol: 1e-5\n  expected: [%s]\n"
                                 % os.path.join(self.dir, "y.npy")),
                        ("formats: [mldef, samediff]", "formats: [mldef]"))
            p = run("scan", train, env=s3.env(), check=1, timeout=300)
            keys = s3.keys()
            self.assertIn("runs/r1/data/deploy/epoch_1.safetensors.mldef", keys, p.stderr)
            # epoch 2 has other weights: its outputs deviate from y.npy
            self.assertNotIn("runs/r1/data/deploy/epoch_2.safetensors.mldef", keys)
            rec = archives(train)["epoch_2.safetensors.mldef"]
            self.assertIn("largest deviation", rec["verification_error"])
            self.assertIn("output", rec["verification_error"])
            # epoch 4 could not be packed: archive.failed once, still registered/uploaded
            ev = events(train)
            af = [e for e in ev if e["type"] == "archive.failed"]
            self.assertEqual(len(af), 1, af)
            self.assertIn("epoch_4", json.dumps(af[0]))
            self.assertIn("runs/r1/data/checkpoints/epoch_4.safetensors", keys)
            self.assertNotIn("epoch_4.safetensors.mldef", archives(train))

    def test_upload_marked(self):
        need("aws", "checking S3 uploads needs awscli")
        train = os.path.join(self.dir, "train")
        np.save(os.path.join(self.dir, "x.npy"), np.ones((1, 12), np.float32))
        damaged = weights(1)
        damaged["fc1.bias"][0] = np.inf
        write_ckpt(os.path.join(train, "ckpts", "epoch_1.safetensors"), damaged)
        with S3Server(self.dir) as s3:
            self.config(train, s3)
            edit_config(train, ("on_failure: hold", "on_failure: upload_marked"),
                        ("formats: [mldef, samediff]", "formats: [mldef]"))
            p = run("scan", train, env=s3.env(), check=1, timeout=300)
            self.assertIn("runs/r1/data/deploy/epoch_1.safetensors.mldef", s3.keys(), p.stderr)
            rec = archives(train)["epoch_1.safetensors.mldef"]
            self.assertEqual((rec["verification"], rec["uploaded"]), ("failed", "yes"))
            # the uploaded build_parameters.yaml says so too
            got = os.path.join(self.dir, "bp.yaml")
            s3.get("runs/r1/data/build_parameters.yaml", got)
            with open(got) as f:
                up = yaml.safe_load(f)["archives"]["epoch_1.safetensors.mldef"]
            self.assertEqual(up["verification"], "failed")

    def test_watch_wraps_a_trainer(self):
        need("aws", "checking S3 uploads needs awscli")
        train = os.path.join(self.dir, "train")
        os.makedirs(train)
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 12)
        np.save(os.path.join(self.dir, "x.npy"), x)
        script = os.path.join(self.dir, "trainer.py")
        with open(script, "w") as f:
            f.write("import numpy as np, sys\nsys.path.insert(0, %r)\n" % os.path.join(HERE, "..", "lib"))
            f.write("from ckpt_formats import safetensors_from_numpy as safetensors\n")
            f.write("def weights(epoch):\n    rng = np.random.default_rng(epoch)\n"
                    "    return {'fc1.weight': rng.standard_normal((8, 12)).astype(np.float32),\n"
                    "            'fc1.bias': rng.standard_normal(8).astype(np.float32),\n"
                    "            'fc2.weight': rng.standard_normal((4, 8)).astype(np.float32),\n"
                    "            'fc2.bias': rng.standard_normal(4).astype(np.float32)}\n")
            f.write(TRAINER)
        with S3Server(self.dir) as s3:
            self.config(train, s3, extra="checkpoints:\n  min_age: 0s\n")
            env = dict(os.environ, **s3.env())
            p = subprocess.run([CKPTD, "watch", train, "--", "/usr/bin/python3", script,
                                os.path.join(train, "ckpts"), "3", "2"],
                               capture_output=True, text=True, env=env, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            deadline = time.time() + 60
            want = "runs/r1/data/deploy/epoch_3.safetensors.mldef"
            while want not in s3.keys() and time.time() < deadline:
                time.sleep(1)
            self.check_uploaded(train, s3, good=[1, 3], bad=[2], one_pass=False)


class Config(TmpDirCase):
    def test_config_errors_name_key_and_line(self):
        cases = [("pack:\n  formats: [mldef, tar]\n", "'pack.formats' names an unknown format"),
                 ("pack:\n  formats: mldef\n", "'pack.formats' must be a list"),
                 ("pack:\n  graph: /x.yaml\n", "'pack.graph' must be a layer list or file:/path"),
                 ("verify:\n  on_failure: drop\n", "'verify.on_failure' must be hold or upload_marked"),
                 ("verify:\n  atol: -1\n", "'verify.atol' must be a number >= 0"),
                 ("verify:\n  max_memory: lots\n", "'verify.max_memory' must be a size"),
                 ("verify:\n  threads: 0\n", "'verify.threads' must be a whole number from 1 to 64"),
                 ("verify:\n  threads: 65\n", "'verify.threads' must be a whole number from 1"),
                 ("verify:\n  threads: two\n", "'verify.threads' must be a whole number from 1")]
        for text, msg in cases:
            path = os.path.join(self.dir, "c.yaml")
            with open(path, "w") as f:
                f.write(text)
            p = run("config", "-c", path, check=2)
            self.assertIn("line 2: " + msg, p.stderr)
        keys = run("config", "--keys", check=0).stdout
        for k in ("pack.formats", "pack.graph", "pack.dir", "pack.sign_key", "verify.inputs",
                  "verify.expected", "verify.atol", "verify.rtol", "verify.timeout",
                  "verify.max_memory", "verify.on_failure", "verify.threads"):
            self.assertIn(k, keys)


class RecordedSets(TmpDirCase):
    """verify.inputs: recorded / verify.record: the gate runs the archive's
    recorded test sets and records what it ran (no stores: ckptd scan)."""

    def setUp(self):
        super().setUp()
        self.train = os.path.join(self.dir, "train")
        self.x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 12)

    def config(self, formats, verify):
        with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
            f.write("pack:\n  formats: [%s]\n" % formats + GRAPH + "verify:\n" + verify)

    def scan(self, check=0):
        return run("scan", self.train, check=check, timeout=300)

    def test_threads_reach_the_engine(self):
        """verify.threads: the gate's engine runs with that many threads (its
        debug line in the sandboxed child) and passes; the default is one
        (no pool, no line)."""
        xcsv = os.path.join(self.dir, "x.csv")
        np.savetxt(xcsv, self.x, delimiter=",", fmt="%.9g")
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_1.safetensors"), weights(1))
        self.config("mldef", "  inputs: [%s]\n" % xcsv)
        p = self.scan()
        self.assertEqual(archives(self.train)["epoch_1.safetensors.mldef"]["verification"],
                         "passed", p.stderr)
        self.assertNotIn("infer.threads", p.stderr)
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_2.safetensors"), weights(2))
        self.config("mldef", "  inputs: [%s]\n  threads: 3\nlog:\n  level: debug\n" % xcsv)
        p = self.scan()
        self.assertEqual(archives(self.train)["epoch_2.safetensors.mldef"]["verification"],
                         "passed", p.stderr)
        self.assertRegex(p.stderr, r"infer\.threads.*count=3")

    def test_samediff_tags_run_and_carry_recorded_sets(self):
        import sdfb
        sdfb.sd()  # skips without flatc
        xcsv = os.path.join(self.dir, "x.csv")
        np.savetxt(xcsv, self.x, delimiter=",", fmt="%.9g")
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_1.safetensors"), weights(1))
        self.config("samediff", "  inputs: [%s]\n  record: true\n" % xcsv)
        p = self.scan()
        zp = os.path.join(self.train, "data", "deploy", "train.zip")
        self.assertEqual(archives(self.train)["train.zip"]["verification"], "passed", p.stderr)
        with zipfile.ZipFile(zp) as z:
            (t1,) = z.read("tags.txt").decode().split()
            x = sdfb.read_array_file(z.read(f"{t1}/tests/rec0/inputs/0.fb"))
            y = sdfb.read_array_file(z.read(f"{t1}/tests/rec0/outputs/0.fb"))
        np.testing.assert_array_equal(x, self.x)
        np.testing.assert_allclose(y, numpy_forward(weights(1), self.x), rtol=1e-5, atol=1e-5)
        # the next tag runs the inputs recorded before it, against its
        # checkpoint's own network, and gets them recorded too
        self.config("samediff", "  inputs: recorded\n  record: true\n")
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_2.safetensors"), weights(2))
        p = self.scan()
        self.assertEqual(archives(self.train)["train.zip"]["verification"], "passed", p.stderr)
        self.assertIn("verification.recorded", p.stderr)
        with zipfile.ZipFile(zp) as z:
            t1, t2 = z.read("tags.txt").decode().split()
            x = sdfb.read_array_file(z.read(f"{t2}/tests/rec0/inputs/0.fb"))
            y = sdfb.read_array_file(z.read(f"{t2}/tests/rec0/outputs/0.fb"))
        np.testing.assert_array_equal(x, self.x)
        np.testing.assert_allclose(y, numpy_forward(weights(2), self.x), rtol=1e-5, atol=1e-5)
        with open(zp, "rb") as f:  # the entry follows the recording
            self.assertEqual(archives(self.train)["train.zip"]["sha256"],
                             hashlib.sha256(f.read()).hexdigest())
        # what a device runs on the archive it received
        self.assertIn("1 test set ok", run("verify", zp + "#" + t2, check=0).stdout)
        # a damaged checkpoint fails on the recorded inputs, naming the set
        bad = weights(3)
        bad["fc2.weight"][1, 2] = np.nan
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_3.safetensors"), bad)
        p = self.scan(check=1)  # a failed verification: exit 1 (issue 27)
        rec = archives(self.train)["train.zip"]
        # held (the default): the tag is taken back, the archive is as before
        why = rec["failed.epoch_3.safetensors"]
        self.assertIn("recorded test 'rec0': output 'output'", why, p.stderr)
        self.assertIn("not finite", why)
        self.assertIn("taken back", why)
        self.assertEqual((rec["tag"], rec["verification"]), (t2, "passed"))
        with zipfile.ZipFile(zp) as z:
            self.assertEqual(z.read("tags.txt").decode().split(), [t1, t2])

    def test_recorded_without_sets_fails_and_mldef_records_signed(self):
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_1.safetensors"), weights(1))
        self.config("mldef", "  inputs: recorded\n")
        p = self.scan(check=1)
        rec = archives(self.train)["epoch_1.safetensors.mldef"]
        self.assertEqual(rec["verification"], "failed", p.stderr)
        self.assertIn("no recorded test sets", rec["verification_error"])
        # without verify.inputs: fixed inputs, recorded into the .mldef, signed again
        key = os.path.join(self.dir, "k")
        run("keygen", "-o", key, check=0)
        with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
            f.write("pack:\n  formats: [mldef]\n  sign_key: file:%s\n" % key + GRAPH
                    + "verify:\n  record: true\n")
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_2.safetensors"), weights(2))
        p = self.scan()
        rec = archives(self.train)["epoch_2.safetensors.mldef"]
        self.assertEqual(rec["verification"], "passed", p.stderr)
        path = os.path.join(self.train, rec["path"])
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(rec["sha256"], hashlib.sha256(data).hexdigest())
        self.assertEqual(rec["size"], len(data))
        with zipfile.ZipFile(path) as z:
            t, = json.loads(z.read("manifest.json"))["Tests"]
            x = np.frombuffer(z.read(t["Inputs"][0]["Path"]), "<f4").reshape(-1, 12)
            y = np.frombuffer(z.read(t["Outputs"][0]["Path"]), "<f4").reshape(-1, 4)
        # the fixed inputs (README): sin(0.5 i), batch 1
        np.testing.assert_allclose(x, np.sin(0.5 * np.arange(12)).reshape(1, 12), atol=1e-7)
        np.testing.assert_allclose(y, numpy_forward(weights(2), x), rtol=1e-5, atol=1e-5)
        mldef = os.path.join(os.path.dirname(CKPTD), "mldef")
        q = subprocess.run([mldef, "-s", "--pubkey", key + ".pub", path], capture_output=True,
                           text=True)
        self.assertEqual(q.returncode, 0, q.stdout + q.stderr)
        self.assertIn("1 test set ok", run("verify", path, check=0).stdout)

    def test_config(self):
        os.makedirs(self.train)
        for verify, msg in (("  inputs: everything\n", "line 10: 'verify.inputs' must be a list "
                             "of files or 'recorded'"),
                            ("  inputs: recorded\n  expected: [y.npy]\n",
                             "verify.expected: not with verify.inputs: recorded")):
            self.config("mldef", verify)
            p = run("config", self.train, check=2)
            self.assertIn(msg, p.stderr)
        self.assertIn("verify.record", run("config", "--keys", check=0).stdout)


class RealLenet(TmpDirCase):
    def test_lenet_nnp_per_epoch(self):
        """The real NNabla LeNet copied as two epochs: both formats packed from
        the .nnp's own network (no layer list), verified and recorded."""
        nnp = shared("nnabla", "lenet_010000.nnp")
        train = os.path.join(self.dir, "train")
        for e in (1, 2):
            dst = os.path.join(train, f"lenet_epoch_{e}.nnp")
            os.makedirs(train, exist_ok=True)
            with open(nnp, "rb") as f, open(dst, "wb") as g:
                g.write(f.read())
            t = time.time() - 60
            os.utime(dst, (t, t))
        with open(os.path.join(train, "ckptd.yaml"), "w") as f:
            f.write("pack:\n  formats: [mldef, samediff]\n")
        p = run("scan", train, check=0, timeout=300)
        rec = archives(train)
        for e in (1, 2):
            r = rec[f"lenet_epoch_{e}.nnp.mldef"]
            self.assertEqual(r["verification"], "passed", p.stderr)
            path = os.path.join(train, r["path"])
            with zipfile.ZipFile(path) as z:
                self.assertIsNone(z.testzip())
        self.assertEqual(rec["train.zip"]["verification"], "passed", p.stderr)
        with zipfile.ZipFile(os.path.join(train, "data", "deploy", "train.zip")) as z:
            self.assertEqual(len(z.read("tags.txt").decode().split()), 2)


if __name__ == "__main__":
    unittest.main()
