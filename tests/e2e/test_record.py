"""mldef -r (and ckptd verify --record when present), end to end: an .mldef
packed by the real binary from a torch-built MLP (safetensors + layer list,
tests/lib/make_torch_models.py) must compute torch's outputs; inputs are
written and outputs read back independently with numpy."""
import json
import os
import subprocess
import sys
import unittest
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
from ckptd_test import CKPTD, TmpDirCase, run  # noqa: E402
import sdfb  # noqa: E402
import test_verify  # noqa: E402  (the shared, cached torch models)

MLDEF = os.path.join(os.path.dirname(CKPTD), "mldef")
m = test_verify.m


def setUpModule():
    test_verify.setUpModule()


def mldef(*args, check=None, input=None):
    p = subprocess.run([MLDEF, *map(str, args)], capture_output=True, timeout=120, input=input)
    if check is not None and p.returncode != check:
        raise AssertionError(f"mldef {' '.join(map(str, args))}: exit {p.returncode}, expected "
                             f"{check}\nstderr: {p.stderr.decode(errors='replace')}")
    return p


class MldefRun(TmpDirCase):
    def setUp(self):
        super().setUp()
        self.archive = os.path.join(self.dir, "mlp.mldef")
        run("pack", m("mlp.safetensors"), "--graph", m("mlp.yaml"), "-o", self.archive, check=0)
        self.x = np.load(m("mlp.in64.npy")).astype("<f4")
        self.want = np.load(m("mlp.out64.npy"))
        self.bin = os.path.join(self.dir, "x.bin")
        self.x.tofile(self.bin)
        self.csv = os.path.join(self.dir, "x.csv")
        np.savetxt(self.csv, self.x.reshape(len(self.x), -1), delimiter=",", fmt="%.9g")

    def check_csv(self, text):
        got = np.loadtxt(text.decode().splitlines(), delimiter=",", ndmin=2)
        self.assertEqual(got.shape, self.want.shape)
        np.testing.assert_allclose(got, self.want, rtol=1e-5, atol=1e-4)

    def test_csv_input_matches_torch(self):
        self.check_csv(mldef("-r", self.csv, self.archive, check=0).stdout)
        # the format given explicitly, on a name without the .csv ending
        other = os.path.join(self.dir, "x.txt")
        os.rename(self.csv, other)
        self.check_csv(mldef("-r", other, "--input-format", "csv", self.archive, check=0).stdout)

    def test_binary_input_and_output_match_torch(self):
        out = os.path.join(self.dir, "y.float32")
        p = mldef("-r", self.bin, "--input-format", "binary", "-o", "binary", "-f", out,
                  self.archive, check=0)
        self.assertEqual(p.stdout, b"")
        got = np.fromfile(out, "<f4").reshape(self.want.shape)
        np.testing.assert_allclose(got, self.want, rtol=1e-5, atol=1e-4)
        self.assertEqual([f for f in os.listdir(self.dir) if f.startswith(".")], [])

    def test_stdin(self):
        with open(self.bin, "rb") as f:
            data = f.read()
        self.check_csv(mldef("-r", "-", self.archive, input=data, check=0).stdout)
        with open(self.csv, "rb") as f:
            data = f.read()
        self.check_csv(mldef("-r", "-", "--input-format", "csv", self.archive, input=data,
                             check=0).stdout)

    def test_verbose_timing(self):
        p = mldef("-r", self.bin, "-v", self.archive, check=0)
        err = p.stderr.decode()
        layers = [ln for ln in err.splitlines() if ln.startswith("layer ")]
        self.assertEqual(len(layers), 6, err)  # the MLP's layer list: 3 dense + 3 activations
        for ln in layers:
            self.assertRegex(ln, r"(dense|relu|tanh|softmax)\s+[0-9.]+ ms$")
        self.assertRegex(err, r"total: 64 samples, 6 layers [0-9.]+ ms, run [0-9.]+ ms")
        self.check_csv(p.stdout)

    def test_bad_test_data_is_named(self):
        bad = os.path.join(self.dir, "bad.csv")
        with open(bad, "w") as f:
            f.write(",".join(["1"] * 20) + "\n" + ",".join(["1"] * 19) + "\n")
        p = mldef("-r", bad, self.archive, check=1)
        self.assertIn("bad.csv' line 2: 19 values", p.stderr.decode())
        with open(bad, "w") as f:
            f.write("1,x\n")
        p = mldef("-r", bad, self.archive, check=1)
        self.assertIn("not a number", p.stderr.decode())
        self.assertEqual(mldef("-r", bad, "--input-format", "npy", self.archive).returncode, 2)


class Record(TmpDirCase):
    """ckptd verify --record into an .mldef, and verify with no inputs."""

    def pack(self, *extra):
        a = os.path.join(self.dir, "mlp.mldef")
        run("pack", m("mlp.safetensors"), "--graph", m("mlp.yaml"), "-o", a, *extra, check=0)
        return a

    def record(self, a, *extra, check=0):
        return run("verify", a, "--inputs", m("mlp.in64.npy"), "--record", *extra, check=check)

    def test_recorded_files_match_numpy_and_torch(self):
        a = self.pack()
        with zipfile.ZipFile(a) as z:
            before = {n: z.read(n) for n in z.namelist()}
        p = self.record(a)
        self.assertIn("recorded test 'rec0'", p.stdout)
        with zipfile.ZipFile(a) as z:
            names = z.namelist()
            man = json.loads(z.read("manifest.json"))
            after = {n: z.read(n) for n in names}
        # every other entry is byte-identical; the manifest only gains Tests
        for n, data in before.items():
            if n != "manifest.json":
                self.assertEqual(after[n], data, n)
        old = json.loads(before["manifest.json"])
        self.assertEqual({k: v for k, v in man.items() if k != "Tests"}, old)
        t, = man["Tests"]
        self.assertEqual(t["Name"], "rec0")
        ins, outs = t["Inputs"], t["Outputs"]
        self.assertEqual([e["NodeRange"] for e in ins], ["x"])
        self.assertEqual([e["NodeRange"] for e in outs], ["y"])
        for e in ins + outs:
            self.assertTrue(e["Path"].startswith("tests/"))
            self.assertRegex(e["Path"].split("/")[1], r"^[0-9a-z.]{1,15}$")
        x = np.frombuffer(after[ins[0]["Path"]], "<f4")
        np.testing.assert_array_equal(x, np.load(m("mlp.in64.npy")).astype("f4").ravel())
        y = np.frombuffer(after[outs[0]["Path"]], "<f4").reshape(64, 10)
        np.testing.assert_allclose(y, np.load(m("mlp.out64.npy")), rtol=1e-5, atol=1e-4)
        # the validator accepts it; re-verification passes
        p = subprocess.run([MLDEF, "-i", a], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        p = run("verify", a, check=0)
        self.assertIn("test 'rec0': output 'y' [64, 10]: ok", p.stdout)
        # a second recording is a second set
        p = run("verify", a, "--inputs", m("mlp.in1.npy"), "--record", check=0)
        self.assertIn("recorded test 'rec1'", p.stdout)
        p = run("verify", a, check=0)
        self.assertIn("2 test sets ok", p.stdout)
        self.assertIn("test 'rec1': output 'y' [1, 10]: ok", p.stdout)

    def test_tampered_output_fails_naming_set_and_output(self):
        a = self.pack()
        self.record(a)
        tampered = os.path.join(self.dir, "t.mldef")
        with zipfile.ZipFile(a) as z, zipfile.ZipFile(tampered, "w") as w:
            for n in z.namelist():
                data = z.read(n)
                if n == "tests/rec0o0.float32":
                    y = np.frombuffer(data, "<f4").copy()
                    y[13] += 0.5
                    data = y.tobytes()
                w.writestr(n, data)
        p = run("verify", tampered, check=1)
        self.assertRegex(p.stdout, r"test 'rec0': output 'y' \[64, 10\]: MISMATCH: 1 of 640 "
                         r"values.* at \[1, 3\]: got [0-9.e-]+, expected [0-9.e-]+")
        self.assertIn("FAILED", p.stdout)

    def test_csv_test_files_are_run(self):
        """A set whose files are in the csv form (docs/mldef.md 4) is run too."""
        a = self.pack()
        self.record(a)
        csvs = os.path.join(self.dir, "csv.mldef")
        with zipfile.ZipFile(a) as z, zipfile.ZipFile(csvs, "w") as w:
            man = json.loads(z.read("manifest.json"))
            for n in z.namelist():
                data = z.read(n)
                if n.startswith("tests/"):
                    v = np.frombuffer(data, "<f4").reshape(64, -1)
                    n = n.replace(".float32", ".csv")
                    data = "".join(",".join("%.9g" % x for x in row) + "\r\n"
                                   for row in v).encode()
                elif n == "manifest.json":
                    for e in man["Tests"][0]["Inputs"] + man["Tests"][0]["Outputs"]:
                        e["Path"] = e["Path"].replace(".float32", ".csv")
                    data = json.dumps(man).encode()
                w.writestr(n, data)
        p = run("verify", csvs, check=0)
        self.assertIn("test 'rec0': output 'y' [64, 10]: ok", p.stdout)

    def test_resigned_archive_verifies(self):
        key = os.path.join(self.dir, "k")
        run("keygen", "-o", key, check=0)
        a = self.pack("--sign-key", "file:" + key)
        p = self.record(a, "--sign-key", "file:" + key)
        self.assertIn("signed again", p.stdout)
        p = subprocess.run([MLDEF, "-s", "--pubkey", key + ".pub", a], capture_output=True,
                           text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        with zipfile.ZipFile(a) as z:
            sig = z.read("SIGNATURE").decode()
        self.assertIn(" tests/rec0o0.float32\n", sig)
        run("verify", a, check=0)

    def test_signed_archive_without_key_is_refused_and_untouched(self):
        key = os.path.join(self.dir, "k")
        run("keygen", "-o", key, check=0)
        a = self.pack("--sign-key", "file:" + key)
        with open(a, "rb") as f:
            before = f.read()
        p = self.record(a, check=1)
        self.assertIn("is signed", p.stderr)
        self.assertIn("--sign-key", p.stderr)
        with open(a, "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertEqual(sorted(os.listdir(self.dir)), ["k", "k.pub", "mlp.mldef"])

    def test_usage(self):
        a = self.pack()
        p = run("verify", a, "--record", check=2)
        self.assertIn("--inputs", p.stderr)
        p = run("verify", m("mlp.safetensors"), "--graph", m("mlp.yaml"), "--inputs",
                m("mlp.in1.npy"), "--record", check=2)
        self.assertIn("archive (.mldef, SameDiff)", p.stderr)
        p = run("verify", a, "--sign-key", "x", check=2)
        p = run("verify", "--help", check=0)
        self.assertIn("--record", p.stdout)
        self.assertIn("--record          MODEL is an archive", p.stdout)


def fb_array(a):
    """A FlatArray .fb as DL4J writes one (tests/lib/sdfb.py, flatbuffers' Python builder)."""
    import flatbuffers
    b = flatbuffers.Builder(0)
    b.Finish(sdfb._array(b, np.asarray(a, "f4")))
    return bytes(b.Output())


def rewrite(src, dst, change):
    """A copy of zip src with change(name, data) -> (name, data) or None (left out)."""
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w") as w:
        for n in z.namelist():
            got = change(n, z.read(n))
            if got:
                w.writestr(got[0], got[1])
    return dst


class SameDiffRecord(TmpDirCase):
    """ckptd verify --record under a SameDiff tag, re-verification, hostile entries."""

    def setUp(self):
        super().setUp()
        sdfb.sd()  # skips without flatc
        self.a = os.path.join(self.dir, "run.zip")
        for tag in ("e1", "e2"):
            run("pack", "--format", "samediff", m("mlp.safetensors"), "--graph", m("mlp.yaml"),
                "-o", self.a, "--tag", tag, check=0)

    def record(self, spec, inputs="mlp.in64.npy", *extra, check=0):
        return run("verify", spec, "--inputs", m(inputs), "--record", *extra, check=check)

    def test_recorded_arrays_decode_and_match_torch(self):
        with open(self.a, "rb") as f:
            old = f.read()
        with zipfile.ZipFile(self.a) as z:
            before = {i.filename: (i.header_offset, z.read(i)) for i in z.infolist()}
            cd_start = min(i.header_offset for i in z.infolist()) + sum(
                len(i.FileHeader()) + i.compress_size for i in z.infolist())
        p = self.record(self.a + "#e1")
        self.assertIn("recorded test 'e1/rec0' (1 input, 1 output)", p.stdout)
        with open(self.a, "rb") as f:
            new = f.read()
        # appended in place: every byte before the old central directory is unchanged
        self.assertEqual(new[:cd_start], old[:cd_start])
        with zipfile.ZipFile(self.a) as z:
            self.assertIsNone(z.testzip())
            after = {i.filename: (i.header_offset, z.read(i)) for i in z.infolist()}
            for n, v in before.items():
                self.assertEqual(after[n], v, n)  # same offset, same bytes
            added = sorted(set(after) - set(before))
            self.assertEqual(added, ["e1/tests/rec0/inputs/0.fb", "e1/tests/rec0/outputs/0.fb",
                                     "e1/tests/rec0/set.txt"])
            x = sdfb.read_array_file(z.read("e1/tests/rec0/inputs/0.fb"))
            y = sdfb.read_array_file(z.read("e1/tests/rec0/outputs/0.fb"))
            settxt = z.read("e1/tests/rec0/set.txt").decode()
        np.testing.assert_array_equal(x, np.load(m("mlp.in64.npy")).astype("f4"))
        self.assertEqual(y.shape, (64, 10))
        np.testing.assert_allclose(y, np.load(m("mlp.out64.npy")), rtol=1e-5, atol=1e-4)
        self.assertEqual(settxt, "ckptd-test 1\ntolerance 0.0001\ninput 0 x\noutput 0 y\n")
        # the archive still reads at every tag, and takes a new tag after the sets
        for spec in (self.a, self.a + "#e1"):
            run("inspect", spec, check=0)
        run("pack", "--format", "samediff", m("mlp.safetensors"), "--graph", m("mlp.yaml"),
            "-o", self.a, "--tag", "e3", check=0)
        tags, _ = sdfb.read_archive(self.a)
        self.assertEqual(tags, ["e1", "e2", "e3"])

    def test_reverification_runs_every_set_of_the_tag(self):
        self.record(self.a + "#e1")
        p = run("verify", self.a, "--tag", "E1", "--inputs", m("mlp.in1.npy"), "--record",
                check=0)
        self.assertIn("recorded test 'e1/rec1'", p.stdout)
        p = run("verify", self.a + "#e1", check=0)
        self.assertIn("test 'rec0': output 'y' [64, 10]: ok", p.stdout)
        self.assertIn("test 'rec1': output 'y' [1, 10]: ok", p.stdout)
        self.assertIn("2 test sets ok", p.stdout)
        # the newest tag (e2) has no sets: the default inputs run, as before
        p = run("verify", self.a, check=0)
        self.assertNotIn("test '", p.stdout)
        self.assertIn("output 'y' [1, 10]:", p.stdout)
        # the newest tag by default when recording
        p = self.record(self.a, "mlp.in1.npy")
        self.assertIn("recorded test 'e2/rec0'", p.stdout)
        self.assertIn("1 test set ok", run("verify", self.a, check=0).stdout)

    def test_tampered_output_fails_naming_set_and_output(self):
        self.record(self.a + "#e1")
        y = np.load(m("mlp.out64.npy")).astype("f4")
        y[17, 3] += 0.5

        def change(n, data):
            return (n, fb_array(y) if n == "e1/tests/rec0/outputs/0.fb" else data)
        t = rewrite(self.a, os.path.join(self.dir, "t.zip"), change)
        p = run("verify", t + "#e1", check=1)
        self.assertRegex(p.stdout, r"test 'rec0': output 'y' \[64, 10\]: MISMATCH: 1 of 640 "
                         r"values.* at \[17, 3\]: got [0-9.e-]+, expected [0-9.e-]+")
        self.assertIn("FAILED", p.stdout)

    def test_hostile_entries_are_named(self):
        self.record(self.a + "#e1")
        out = "e1/tests/rec0/outputs/0.fb"
        cases = [
            ("stray member", lambda n, d: (n, d) if n != out else ("e1/tests/rec0/junk", d),
             "'e1/tests/rec0/junk' is not part of a recorded test set"),
            ("file missing", lambda n, d: None if n == out else (n, d),
             "'e1/tests/rec0/outputs/0.fb' is missing"),
            ("truncated array", lambda n, d: (n, d[:len(d) // 2] if n == out else d),
             "e1/tests/rec0/outputs/0.fb"),
            ("bad header", lambda n, d: (n, b"ckptd-test 9\n" if n.endswith("set.txt") else d),
             "does not start with 'ckptd-test 1'"),
            ("huge index", lambda n, d: (n, d.replace(b"output 0 y", b"output 99999 y")
                                         if n.endswith("set.txt") else d),
             "line 4: expected"),
            ("unlisted output", lambda n, d: (n.replace("outputs/0", "outputs/1"), d),
             "set.txt lists no output 1"),
            ("wrong value name", lambda n, d: (n, d.replace(b"input 0 x", b"input 0 z")
                                               if n.endswith("set.txt") else d),
             "is for 'z', the model's is 'x'"),
            ("bad set name", lambda n, d: (n.replace("rec0", ".rec0"), d),
             "not a valid test set name"),
        ]
        for what, change, message in cases:
            with self.subTest(what):
                t = rewrite(self.a, os.path.join(self.dir, what.replace(" ", "_") + ".zip"),
                            change)
                p = run("verify", t + "#e1", check=1)
                self.assertIn(message, p.stderr)
                self.assertIn(os.path.basename(t), p.stderr)
                # the model reader never reads them: the tag still opens and runs
                run("inspect", t + "#e1", check=0)
                run("verify", t + "#e1", "--inputs", m("mlp.in1.npy"), check=0)

    def test_usage(self):
        p = self.record(self.a, "mlp.in1.npy", "--sign-key", "x", check=2)
        self.assertIn("--sign-key signs .mldef archives", p.stderr)
        p = self.record(self.a + "#nope", check=1)
        self.assertIn("no tag 'nope'", p.stderr)
        p = run("verify", m("mlp.safetensors"), "--graph", m("mlp.yaml"), "--tag", "e1", check=2)
        self.assertIn("--tag", p.stderr)
        with open(self.a, "rb") as f:
            before = f.read()
        p = run("verify", self.a, "--inputs", m("mlp.in1.npy"), "--expected",
                m("mlp.out64.npy"), "--record", check=1)  # a mismatch records nothing
        with open(self.a, "rb") as f:
            self.assertEqual(f.read(), before)
        p = run("verify", "--help", check=0)
        self.assertIn("TAG/tests/recN/", p.stdout)


if __name__ == "__main__":
    unittest.main()
