"""The .mldef archives end to end: `mldef`, `ckptd pack`, `ckptd inspect`,
`ckptd keygen` on manifests and archives made here with numpy, json and
zipfile. Expected values come from numpy arrays and from Python's zipfile
and json reading what ckptd wrote, never from ckptd itself. The validator
is run on a catalogue of broken manifests, one per rule of docs/mldef.md."""
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import unittest
import zipfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckpt_formats import TfTensor, crc32c, safetensors_from_numpy, write_tf_bundle  # noqa: E402
from ckptd_test import CKPTD, TmpDirCase, run, shared  # noqa: E402

MLDEF = os.path.join(os.path.dirname(CKPTD), "mldef")
DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "mldef.md")


def mldef(*args, check=None, input=None, binary=False):
    p = subprocess.run([MLDEF, *map(str, args)], capture_output=True, text=not binary,
                       timeout=120, input=input)
    if check is not None and p.returncode != check:
        raise AssertionError(f"mldef {' '.join(map(str, args))}: exit {p.returncode}, expected "
                             f"{check}\nstdout: {p.stdout}\nstderr: {p.stderr}")
    return p


def doc_example():
    """The complete example manifest of docs/mldef.md section 8."""
    with open(DOC) as f:
        text = f.read()
    m = re.search(r"## 8\. A complete example.*?```json\n(.*?)```", text, re.S)
    return json.loads(m.group(1))


def write_example(d, seed=0):
    """The doc's example with its data files; returns (manifest, weights by name)."""
    man = doc_example()
    os.makedirs(os.path.join(d, "data"), exist_ok=True)
    os.makedirs(os.path.join(d, "tests"), exist_ok=True)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(20192).astype("<f4")
    w.tofile(os.path.join(d, "data", "w000.float32"))
    rng.standard_normal(3 * 784).astype("<f4").tofile(os.path.join(d, "tests", "case0x.float32"))
    rng.standard_normal(3 * 10).astype("<f4").tofile(os.path.join(d, "tests", "case0y.float32"))
    with open(os.path.join(d, "license.txt"), "w") as f:
        f.write("MIT\n")
    save(d, man)
    weights = {}
    for layer in man["Layers"]:
        off = layer.get("StartIndex", 0)
        for wt in layer.get("Weights", []):
            n = int(np.prod(wt["Shape"]))
            weights[wt["Name"]] = w[off:off + n].reshape(wt["Shape"])
            off += n
    return man, weights


def save(d, man, name="manifest.json"):
    with open(os.path.join(d, name), "w") as f:
        json.dump(man, f, indent=1)


def layer(man, name):
    return next(x for x in man["Layers"] if x["Name"] == name)


def archive_weights(path):
    """Every weight of an .mldef, read with zipfile, json and numpy only."""
    with zipfile.ZipFile(path) as z:
        man = json.loads(z.read("manifest.json").decode("utf-8"))
        files = {}
        for df in man["DataFiles"]:
            raw = z.read(df["Path"])
            dt = {".float32": "<f4", ".float64": "<f8"}[os.path.splitext(df["Path"])[1]]
            files[df["Name"]] = np.frombuffer(raw, dtype=dt)
        out = {}
        for lay in man["Layers"]:
            off = lay.get("StartIndex", 0)
            for wt in lay.get("Weights", []):
                n = int(np.prod(wt["Shape"]))
                out[wt["Name"]] = files[lay["DataSource"]][off:off + n].reshape(wt["Shape"])
                off += n
        return man, out, z


def rezip(src, dst, edit=None, order=None, extra=()):
    """Copies src to dst, entries optionally edited (name, data) -> (name, data) or
    None to drop, reordered, or with extra (name, data) entries appended."""
    with zipfile.ZipFile(src) as z:
        items = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    if order:
        items = order(items)
    with zipfile.ZipFile(dst, "w") as z:
        for name, data in items:
            r = edit(name, data) if edit else (name, data)
            if r is not None:
                z.writestr(r[0], r[1])
        for name, data in extra:
            z.writestr(name, data)


def data_offset(path, info):
    """Where a member's bytes start: after its local header (which zipfile
    does not expose), name and extra field."""
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        h = f.read(30)
    assert h[:4] == b"PK\x03\x04", info.filename
    nl, xl = int.from_bytes(h[26:28], "little"), int.from_bytes(h[28:30], "little")
    return info.header_offset + 30 + nl + xl


def assert_mappable(case, path):
    """Every stored member starts on a page and maps to its own bytes: what
    docs/mldef.md promises a loader."""
    with zipfile.ZipFile(path) as z:
        for i in z.infolist():
            if i.compress_type != zipfile.ZIP_STORED or not i.file_size:
                continue
            off = data_offset(path, i)
            case.assertEqual(off % 4096, 0, i.filename)
            m = np.memmap(path, np.uint8, "r", offset=off, shape=(i.file_size,))
            case.assertEqual(m.tobytes(), z.read(i.filename), i.filename)
            del m


class Cli(TmpDirCase):
    def test_valid_example_checks_and_creates(self):
        man, weights = write_example(self.dir)
        p = mldef("-i", os.path.join(self.dir, "manifest.json"), check=0)
        self.assertIn("valid mldef", p.stdout)
        out = os.path.join(self.dir, "out.mldef")
        mldef("-c", "-f", out, os.path.join(self.dir, "manifest.json"), check=0)
        got_man, got, z = archive_weights(out)
        self.assertEqual(got_man, man)  # the manifest is copied as is
        for name, arr in weights.items():
            np.testing.assert_array_equal(got[name], arr)
        with zipfile.ZipFile(out) as z:
            self.assertEqual(z.namelist()[0], "manifest.json")
            for i in z.infolist():
                self.assertEqual(i.compress_type, zipfile.ZIP_STORED, i.filename)
            self.assertEqual(z.read("tests/case0x.float32"),
                             open(os.path.join(self.dir, "tests", "case0x.float32"), "rb").read())
        assert_mappable(self, out)
        mldef("-i", out, check=0)
        run("inspect", out, check=0)

    def test_create_to_stdout_and_levels(self):
        write_example(self.dir)
        mf = os.path.join(self.dir, "manifest.json")
        p = mldef("-c", mf, binary=True, check=0)
        path = os.path.join(self.dir, "stdout.mldef")
        with open(path, "wb") as f:
            f.write(p.stdout)
        with zipfile.ZipFile(path) as z:
            self.assertIsNone(z.testzip())
        out9 = os.path.join(self.dir, "nine.mldef")
        mldef("-c", "-9", "-f", out9, mf, check=0)
        with zipfile.ZipFile(out9) as z:
            self.assertTrue(all(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist()))
            self.assertIsNone(z.testzip())
        mldef("-i", out9, check=0)

    def test_usage_errors_exit_2(self):
        write_example(self.dir)
        mf = os.path.join(self.dir, "manifest.json")
        for args in (["-x", mf], [mf], ["-i"], ["-i", "-c", mf, mf], ["-f", "o", "-i", mf],
                     ["-3", "-i", mf], ["-i", "-o", "xml", mf], ["-c", "-s", mf],
                     ["-r", os.path.join(self.dir, "nope"), mf]):
            p = mldef(*args)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertIn("mldef", p.stderr)
        p = mldef("-h", check=0)
        self.assertIn("--input-format", p.stdout)
        self.assertIn("-i means --inspect", p.stdout)

    def test_run_shapes_and_usage(self):
        """-r runs the doc's example (3 samples of 784 values, 10 outputs each);
        torch-checked values are in test_record.py."""
        write_example(self.dir)
        out = os.path.join(self.dir, "a.mldef")
        mldef("-c", "-f", out, os.path.join(self.dir, "manifest.json"), check=0)
        x = os.path.join(self.dir, "tests", "case0x.float32")
        p = mldef("-r", x, "-o", "csv", "--input-format", "binary", out, check=0)
        rows = [r.split(",") for r in p.stdout.splitlines()]
        self.assertEqual([len(r) for r in rows], [10, 10, 10])
        self.assertTrue(all(np.isfinite(float(v)) for r in rows for v in r))
        p = mldef("-r", x, "-o", "binary", out, binary=True, check=0)
        self.assertEqual(len(p.stdout), 3 * 10 * 4)
        np.testing.assert_allclose(np.frombuffer(p.stdout, "<f4").reshape(3, 10),
                                   np.array(rows, dtype=np.float64), rtol=1e-6)
        self.assertEqual(mldef("-r", x + ".none", out).returncode, 2)
        self.assertEqual(mldef("-r", x, "-o", "npy", out).returncode, 2)
        short = os.path.join(self.dir, "short.float32")
        with open(short, "wb") as f:
            f.write(b"\0" * 100)
        p = mldef("-r", short, out, check=1)
        self.assertIn("short.float32", p.stderr)
        self.assertIn("whole number of samples", p.stderr)

    def test_argv0_alias(self):
        link = os.path.join(self.dir, "mldef")
        os.symlink(CKPTD, link)
        p = subprocess.run([link, "--help"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0)
        self.assertIn("--inspect", p.stdout)


# One broken manifest per rule: (rule, where, edit(manifest, dir)).
def _path(d, rel):
    return os.path.join(d, rel)


def _append(d, rel, data):
    with open(_path(d, rel), "ab") as f:
        f.write(data)


def _truncate(d, rel, size):
    with open(_path(d, rel), "r+b") as f:
        f.truncate(size)


def _move_data(m, d, new):
    os.makedirs(os.path.dirname(_path(d, new)) or d, exist_ok=True)
    os.rename(_path(d, m["DataFiles"][0]["Path"]), _path(d, new))
    m["DataFiles"][0]["Path"] = new


def _many_files(m, d):
    for i in range(100):
        p = f"data/x{i}.float32"
        np.zeros(1, "<f4").tofile(_path(d, p))
        m["DataFiles"].append({"Name": f"x{i}", "Path": p, "StorageBytes": 4,
                               "StorageFormat": "float"})


def _csv(m, d):
    with open(_path(d, "data/c.csv"), "w") as f:
        f.write("1,2\n3,abc\n")
    m["DataFiles"].append({"Name": "c", "Path": "data/c.csv", "StorageBytes": 8})


def _reorder(m, d):
    order = ["Format", "FormatVersion", "Model", "Layers", "NodeRanges", "DataFiles", "Tests"]
    m2 = {k: m[k] for k in order}
    m.clear()
    m.update(m2)


CATALOGUE = [
    ("name.charset", "DataFiles[0]", lambda m, d: _move_data(m, d, "data/W000.float32")),
    ("name.length", "DataFiles[0]", lambda m, d: _move_data(m, d, "data/averyverylongname.float32")),
    ("path.depth", "DataFiles[0]", lambda m, d: _move_data(m, d, "data/a/b/w.float32")),
    ("path.escape", "DataFiles[0]", lambda m, d: m["DataFiles"][0].update(Path="../w.float32")),
    ("files.count", "manifest.json", _many_files),
    ("files.duplicate", "DataFiles[1]", lambda m, d: m["DataFiles"].append(
        dict(m["DataFiles"][0], Name="dup"))),
    ("manifest.format", "Format", lambda m, d: m.update(Format="onnx")),
    ("manifest.key", "Layers[1] 'conv1'", lambda m, d: m["Layers"][1].update(StartIndex=-1)),
    ("model.section", "Model", lambda m, d: m.pop("Model")),
    ("datafile.declared", "Layers[1] 'conv1'", lambda m, d: layer(m, "conv1").update(
        DataSource="nope")),
    ("datafile.declared", "DataFiles", _reorder),
    ("datafile.missing", "DataFiles[0]", lambda m, d: os.unlink(_path(d, "data/w000.float32"))),
    ("datafile.extension", "DataFiles[0]", lambda m, d: _move_data(m, d, "data/w000.bin")),
    ("datafile.storage", "DataFiles[0]", lambda m, d: m["DataFiles"][0].update(StorageBytes=8)),
    ("datafile.size", "data/w000.float32", lambda m, d: _append(d, "data/w000.float32", b"\0\0")),
    ("datafile.csv", "data/c.csv", _csv),
    ("datafile.name", "DataFiles[1]", lambda m, d: m["DataFiles"].append(
        dict(m["DataFiles"][0], Path="data/other.float32")) or np.zeros(1, "<f4").tofile(
        _path(d, "data/other.float32"))),
    ("layer.range", "Layers[10] 'fc4'", lambda m, d: layer(m, "fc4").update(StartIndex=19683)),
    ("layer.range", "Layers[7] 'fc3'", lambda m, d: _truncate(d, "data/w000.float32", 4 * 10000)),
    ("layer.weights", "Layers[1] 'conv1'", lambda m, d: layer(m, "conv1").update(Count=417)),
    ("layer.op", "Layers[2] 'pool1'", lambda m, d: layer(m, "pool1").update(Op="frobnicate")),
    ("layer.inputs", "Layers[3] 'relu1'", lambda m, d: layer(m, "relu1").update(Prior="nothere")),
    ("layer.inputs", "Layers[9] 'skip'", lambda m, d: layer(m, "skip").update(Inputs=["relu3"])),
    ("layer.outputs", "Layers[3] 'relu1'", lambda m, d: layer(m, "relu1").update(
        Outputs=["conv1"])),
    ("layer.name", "Layers[3] 'pool1'", lambda m, d: layer(m, "relu1").update(Name="pool1")),
    ("layer.params", "Layers[2] 'pool1'", lambda m, d: layer(m, "pool1")["Params"].update(
        Wobble=1)),
    ("layer.params", "Layers[2] 'pool1'", lambda m, d: layer(m, "pool1")["Params"].update(
        Kernel=[2])),
    ("layer.input", "Layers[0] 'x'", lambda m, d: m["Layers"][0].update(DataSource="w000")),
    ("noderange.input", "NodeRanges[0]", lambda m, d: m["NodeRanges"][0].update(
        Count=100, Shape=[-1, 100])),
    ("noderange.output", "NodeRanges[1]", lambda m, d: m["NodeRanges"][1].update(Name="zzz")),
    ("noderange.output", "NodeRanges", lambda m, d: m["Layers"].append(
        {"Name": "extra", "Op": "relu", "Prior": "y"})),
    ("noderange.type", "NodeRanges[1]", lambda m, d: m["NodeRanges"][1].update(Type="sideways")),
    ("noderange.count", "NodeRanges[1]", lambda m, d: m["NodeRanges"][1].update(Count=11)),
    ("test.size", "Tests[0].Outputs[0]", lambda m, d: _append(d, "tests/case0y.float32", b"\0" * 4)),
    ("test.path", "Tests[0].Inputs[0]", lambda m, d: (
        shutil.move(_path(d, "tests/case0x.float32"), _path(d, "data/case0x.float32")),
        m["Tests"][0]["Inputs"][0].update(Path="data/case0x.float32"))),
    ("test.inputs", "Tests[0]", lambda m, d: m["Tests"][0].update(Inputs=[])),
]


class Validator(TmpDirCase):
    def check_rule(self, i, rule, where, edit):
        d = os.path.join(self.dir, f"{i}.{rule}")
        os.makedirs(d)
        man, _ = write_example(d)
        edit(man, d)
        save(d, man)
        mf = os.path.join(d, "manifest.json")
        p = mldef("-i", mf)
        self.assertEqual(p.returncode, 1, (rule, p.stdout, p.stderr))
        lines = [ln for ln in p.stderr.splitlines() if ln.endswith(f"[{rule}]")]
        self.assertTrue(any(f": {where}:" in ln for ln in lines),
                        f"{rule} at {where} not in:\n{p.stderr}")
        # creating from it writes nothing
        out = os.path.join(d, "out.mldef")
        p = mldef("-c", "-f", out, mf)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(f"[{rule}]", p.stderr)
        self.assertFalse(os.path.exists(out))
        self.assertEqual([f for f in os.listdir(d) if f.startswith(".")], [])

    def test_catalogue_one_per_rule(self):
        for i, (rule, where, edit) in enumerate(CATALOGUE):
            with self.subTest(rule=rule, where=where):
                self.check_rule(i, rule, where, edit)

    def test_every_violation_is_listed(self):
        man, _ = write_example(self.dir)
        layer(man, "pool1")["Op"] = "frobnicate"
        layer(man, "fc4")["StartIndex"] = 20000
        man["NodeRanges"][1]["Type"] = "sideways"
        man["DataFiles"][0]["StorageBytes"] = 2
        save(self.dir, man)
        p = mldef("-i", os.path.join(self.dir, "manifest.json"), "--json")
        self.assertEqual(p.returncode, 1)
        rep = json.loads(p.stderr)
        rules = {v["rule"] for v in rep["violations"]}
        self.assertLessEqual({"layer.op", "layer.range", "noderange.type", "datafile.storage"},
                             rules)
        self.assertFalse(rep["valid"])

    def test_manifest_not_json_names_the_offset(self):
        write_example(self.dir)
        with open(os.path.join(self.dir, "manifest.json"), "w") as f:
            f.write('{"Format": "mldef",}')
        p = mldef("-i", os.path.join(self.dir, "manifest.json"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("[manifest.json]", p.stderr)

    def test_csv_data_file_round_trips_as_float64(self):
        man, weights = write_example(self.dir)
        w = np.fromfile(os.path.join(self.dir, "data", "w000.float32"), "<f4").astype(np.float64)
        with open(os.path.join(self.dir, "data", "w000.csv"), "w") as f:
            for i in range(0, len(w), 7):
                f.write(", ".join(repr(float(x)) for x in w[i:i + 7]) + "\r\n")
        os.unlink(os.path.join(self.dir, "data", "w000.float32"))
        man["DataFiles"][0].update(Path="data/w000.csv", StorageBytes=8)
        save(self.dir, man)
        mf = os.path.join(self.dir, "manifest.json")
        mldef("-i", mf, check=0)
        a = os.path.join(self.dir, "csv.mldef")
        mldef("-c", "-f", a, mf, check=0)
        packed = os.path.join(self.dir, "packed.mldef")
        run("pack", a, "-o", packed, check=0)
        got_man, got, _ = archive_weights(packed)
        self.assertTrue(got_man["DataFiles"][0]["Path"].endswith(".float64"))
        for name, arr in weights.items():
            np.testing.assert_array_equal(got[name], arr.astype(np.float64))


class Archive(TmpDirCase):
    def make(self, name="a.mldef", key=None):
        if not os.path.exists(os.path.join(self.dir, "manifest.json")):
            write_example(self.dir)
        out = os.path.join(self.dir, name)
        args = ["-c", "-f", out]
        if key:
            args += ["-s", "--key", key]
        mldef(*args, os.path.join(self.dir, "manifest.json"), check=0)
        return out

    def assert_invalid(self, path, rule, where, *extra):
        p = mldef("-i", path, *extra)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertTrue(any(f": {where}:" in ln and ln.endswith(f"[{rule}]")
                            for ln in p.stderr.splitlines()), p.stderr)
        p = run("inspect", path)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(f"[{rule}]", p.stderr)

    def test_entry_escaping_its_folder(self):
        a = self.make()
        bad = os.path.join(self.dir, "bad.mldef")
        rezip(a, bad, extra=[("../evil.csv", b"1")])
        self.assert_invalid(bad, "path.escape", "../evil.csv")
        rezip(a, bad, extra=[("/etc/evil.csv", b"1")])
        self.assert_invalid(bad, "path.escape", "/etc/evil.csv")

    def test_duplicate_names(self):
        a = self.make()
        bad = os.path.join(self.dir, "dup.mldef")
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rezip(a, bad, extra=[("license.txt", b"other")])
        self.assert_invalid(bad, "files.duplicate", "license.txt")

    def test_short_data_file(self):
        a = self.make()
        bad = os.path.join(self.dir, "short.mldef")
        rezip(a, bad, edit=lambda n, d: (n, d[:4 * 19000] if n == "data/w000.float32" else d))
        self.assert_invalid(bad, "layer.range", "Layers[10] 'fc4'")

    def test_truncated_and_not_a_zip(self):
        a = self.make()
        data = open(a, "rb").read()
        bad = os.path.join(self.dir, "trunc.mldef")
        with open(bad, "wb") as f:
            f.write(data[:len(data) // 2])
        p = mldef("-i", bad)
        self.assertEqual(p.returncode, 1)
        self.assertIn("[zip.open]", p.stderr)
        self.assertIn("trunc.mldef", p.stderr)

    def test_no_manifest(self):
        a = self.make()
        bad = os.path.join(self.dir, "noman.mldef")
        rezip(a, bad, edit=lambda n, d: None if n == "manifest.json" else (n, d))
        self.assert_invalid(bad, "manifest.missing", bad)

    def test_reordered_entries_stay_valid(self):
        k = os.path.join(self.dir, "k")
        run("keygen", "-o", k, check=0)
        a = self.make(key=k)
        b = os.path.join(self.dir, "rev.mldef")
        rezip(a, b, order=lambda items: list(reversed(items)))
        with zipfile.ZipFile(b) as z:
            self.assertEqual(z.namelist()[0], "SIGNATURE")
        p = mldef("-s", "--pubkey", k + ".pub", b, check=0)
        self.assertIn("signature good", p.stdout)

    def test_existing_out_that_is_not_an_mldef_is_kept(self):
        write_example(self.dir)
        out = os.path.join(self.dir, "precious.txt")
        with open(out, "w") as f:
            f.write("keep me\n")
        p = mldef("-c", "-f", out, os.path.join(self.dir, "manifest.json"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("not an .mldef", p.stderr)
        self.assertEqual(open(out).read(), "keep me\n")
        a = self.make()
        p = run("pack", a, "-o", out)
        self.assertEqual(p.returncode, 1)
        self.assertIn("precious.txt", p.stderr)
        self.assertEqual(open(out).read(), "keep me\n")
        self.assertEqual([f for f in os.listdir(self.dir) if f.startswith(".")], [])
        # an older .mldef is replaced
        b = self.make("b.mldef")
        run("pack", a, "-o", b, check=0)


class Signatures(TmpDirCase):
    def setUp(self):
        super().setUp()
        self.key = os.path.join(self.dir, "k")
        run("keygen", "-o", self.key, check=0)
        write_example(self.dir)
        self.signed = os.path.join(self.dir, "signed.mldef")
        mldef("-c", "-s", "--key", self.key, "-f", self.signed,
              os.path.join(self.dir, "manifest.json"), check=0)

    def verify(self, path, rule, name, pub=None):
        p = mldef("-s", "--pubkey", pub or self.key + ".pub", path)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertTrue(any(f": {name}:" in ln and ln.endswith(f"[{rule}]")
                            for ln in p.stderr.splitlines()), p.stderr)

    def test_keygen_files(self):
        st = os.stat(self.key)
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)
        pub = open(self.key + ".pub").read()
        self.assertRegex(pub, r"^ed25519-public [0-9a-f]{64}\n$")
        self.assertNotIn(open(self.key).read().split()[1], pub)
        p = run("keygen", "-o", self.key)
        self.assertEqual(p.returncode, 1)
        self.assertIn("exists", p.stderr)
        os.chmod(self.key, 0o644)
        p = mldef("-c", "-s", "--key", self.key, "-f", os.path.join(self.dir, "x.mldef"),
                  os.path.join(self.dir, "manifest.json"))
        self.assertEqual(p.returncode, 2)
        self.assertIn("readable by others", p.stderr)

    def test_signature_lines_checked_independently(self):
        with zipfile.ZipFile(self.signed) as z:
            names = sorted(n for n in z.namelist() if n != "SIGNATURE")
            lines = z.read("SIGNATURE").decode().splitlines()
            self.assertEqual(lines[0], "mldef-signature 1")
            self.assertEqual(len(lines), len(names) + 2)
            for ln, n in zip(lines[1:-1], names):
                self.assertEqual(ln, f"sha256 {hashlib.sha256(z.read(n)).hexdigest()} {n}")
            pub = open(self.key + ".pub").read().split()[1]
            self.assertTrue(lines[-1].startswith(f"ed25519 {pub} "))
        p = mldef("-s", "--pubkey", self.key + ".pub", self.signed, check=0)
        self.assertIn(pub, p.stdout)

    def test_changed_file(self):
        bad = os.path.join(self.dir, "changed.mldef")

        def edit(n, d):
            if n == "data/w000.float32":
                d = bytearray(d)
                d[100] ^= 1
            return n, bytes(d)
        rezip(self.signed, bad, edit=edit)
        self.verify(bad, "signature.changed", "data/w000.float32")

    def test_added_removed_renamed(self):
        bad = os.path.join(self.dir, "added.mldef")
        rezip(self.signed, bad, extra=[("notes.txt", b"hi")])
        self.verify(bad, "signature.added", "notes.txt")
        rezip(self.signed, bad, edit=lambda n, d: None if n == "license.txt" else (n, d))
        self.verify(bad, "signature.removed", "license.txt")
        rezip(self.signed, bad, edit=lambda n, d: ("licence.txt" if n == "license.txt" else n, d))
        self.verify(bad, "signature.removed", "license.txt")
        self.verify(bad, "signature.added", "licence.txt")

    def test_other_key_and_other_content(self):
        k2 = os.path.join(self.dir, "k2")
        run("keygen", "-o", k2, check=0)
        other = os.path.join(self.dir, "other.mldef")
        mldef("-c", "-s", "--key", k2, "-f", other, os.path.join(self.dir, "manifest.json"),
              check=0)
        mldef("-s", other, check=0)  # self-consistent without a trusted key
        self.verify(other, "signature.key", "SIGNATURE")
        # SIGNATURE moved onto other content
        man = doc_example()
        man["Model"]["Name"] = "changed"
        save(self.dir, man)
        plain = os.path.join(self.dir, "plain.mldef")
        mldef("-c", "-f", plain, os.path.join(self.dir, "manifest.json"), check=0)
        with zipfile.ZipFile(self.signed) as z:
            sig = z.read("SIGNATURE")
        bad = os.path.join(self.dir, "moved.mldef")
        rezip(plain, bad, extra=[("SIGNATURE", sig)])
        self.verify(bad, "signature.changed", "manifest.json")
        # a forged line: the digest fixed but the Ed25519 signature not
        with zipfile.ZipFile(plain) as z:
            h = hashlib.sha256(z.read("manifest.json")).hexdigest()
        text = sig.decode()
        text = re.sub(r"sha256 [0-9a-f]{64} manifest.json", f"sha256 {h} manifest.json", text)
        rezip(plain, bad, extra=[("SIGNATURE", text.encode())])
        self.verify(bad, "signature.invalid", "SIGNATURE")

    def test_unsigned_archive_fails_signature_check(self):
        plain = os.path.join(self.dir, "plain.mldef")
        mldef("-c", "-f", plain, os.path.join(self.dir, "manifest.json"), check=0)
        self.verify(plain, "signature.missing", "SIGNATURE")


class Pack(TmpDirCase):
    def test_pack_round_trip_and_layout(self):
        man, weights = write_example(self.dir)
        src = os.path.join(self.dir, "src.mldef")
        mldef("-c", "-f", src, os.path.join(self.dir, "manifest.json"), check=0)
        out = os.path.join(self.dir, "out.mldef")
        p = run("pack", src, "-o", out, "--format", "mldef", check=0)
        self.assertIn("archive.packed", p.stderr)
        got_man, got, _ = archive_weights(out)
        self.assertEqual(set(got), set(weights))
        for name, arr in weights.items():
            np.testing.assert_array_equal(got[name], arr)
        # the graph survives: ops, inputs, params
        def key(lay):
            ins = lay.get("Inputs") or [lay["Prior"]] + [w["Name"] for w in lay.get("Weights", [])]
            return (lay.get("Op"), tuple(ins), tuple(lay.get("Outputs", [lay["Name"]])),
                    json.dumps(lay.get("Params", {}), sort_keys=True))
        self.assertEqual([key(x) for x in man["Layers"][1:]],
                         [key(x) for x in got_man["Layers"][1:]])
        self.assertEqual(got_man["NodeRanges"][0]["Shape"], [-1, 1, 28, 28])
        with zipfile.ZipFile(out) as z:
            for n in z.namelist():
                self.assertRegex(n, r"^([0-9a-z.]{1,15}/){0,2}[0-9a-z.]{1,15}$")
                self.assertEqual(z.getinfo(n).compress_type, zipfile.ZIP_STORED)
        assert_mappable(self, out)
        run("inspect", out, check=0)

    def test_lrn_and_hardmax_params_as_documented(self):
        """ONNX LRN (a bias other than ONNX's default) and Hardmax packed as
        .mldef: their Params are the keys docs/mldef.md's op table names
        (`Alpha`, `Beta`, `Scalar` the bias, `Ints` [size]; `Axis`), and the
        archive, read back, computes torch's LRN and numpy's one-hot of the
        first largest value (the bias was not written once: the .mldef
        computed another LRN)."""
        import torch
        onnx = __import__("torch_gen").need_onnx()
        from onnx import helper as h, TensorProto as TP
        nodes = [h.make_node("LRN", ["x"], ["n"], name="lrn", alpha=0.3, beta=0.6, bias=2.5,
                             size=3),
                 h.make_node("Hardmax", ["n"], ["y"], name="hardmax", axis=1)]
        g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [2, 5, 3, 2])],
                         [h.make_tensor_value_info("n", TP.FLOAT, None),
                          h.make_tensor_value_info("y", TP.FLOAT, None)])
        src = os.path.join(self.dir, "lrn.onnx")
        onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), src)
        out = os.path.join(self.dir, "lrn.mldef")
        run("pack", "--format", "mldef", src, "-o", out, check=0)
        with zipfile.ZipFile(out) as z:
            layers = {x["Name"]: x for x in json.loads(z.read("manifest.json"))["Layers"]}
        self.assertEqual(layers["lrn"]["Op"], "lrn")
        self.assertEqual({k: round(v, 6) if isinstance(v, float) else v
                          for k, v in layers["lrn"]["Params"].items()},
                         {"Alpha": 0.3, "Beta": 0.6, "Scalar": 2.5, "Ints": [3]})
        self.assertEqual((layers["hardmax"]["Op"], layers["hardmax"]["Params"]),
                         ("hardmax", {"Axis": 1}))
        x = np.random.default_rng(19).standard_normal((2, 5, 3, 2)).astype(np.float32)
        x[0, 1, 0, 0] = x[0, 3, 0, 0] = 9  # a tie: the first one wins
        n = torch.nn.functional.local_response_norm(torch.from_numpy(x), 3, alpha=0.3, beta=0.6,
                                                    k=2.5).numpy()
        y = (np.arange(5)[None, :, None, None] == n.argmax(1)[:, None]).astype(np.float32)
        self.assertEqual(y[0, :, 0, 0].tolist(), [0, 1, 0, 0, 0])
        xi, ni, yi = (os.path.join(self.dir, f) for f in ("x.npy", "n.npy", "y.npy"))
        np.save(xi, x)
        for model in (src, out):
            d = os.path.join(self.dir, os.path.basename(model) + ".out")
            os.makedirs(d, exist_ok=True)
            p = run("verify", model, "--inputs", xi, "--save-outputs", d)
            self.assertEqual(p.returncode, 0, model + p.stdout + p.stderr)
            np.testing.assert_allclose(np.load(os.path.join(d, "n.npy")), n, rtol=1e-5,
                                       atol=1e-6, err_msg=model)
            np.testing.assert_array_equal(np.load(os.path.join(d, "y.npy")), y, err_msg=model)

    def test_weight_only_checkpoint_needs_a_graph(self):
        path = os.path.join(self.dir, "w.npy")
        np.save(path, np.zeros(3, np.float32))
        out = os.path.join(self.dir, "w.mldef")
        p = run("pack", path, "-o", out)
        self.assertEqual(p.returncode, 2)  # a usage error: --graph is missing
        self.assertIn("--graph", p.stderr)
        self.assertFalse(os.path.exists(out))

    def test_usage(self):
        self.assertEqual(run("pack", "x").returncode, 2)
        self.assertEqual(run("pack", "x", "-o", "y", "--format", "tarball").returncode, 2)
        self.assertIn("mldef", run("pack", "--help", check=0).stdout)

    def test_kill_9_leaves_the_old_archive(self):
        man, _ = write_example(self.dir)
        big = np.random.default_rng(1).standard_normal(24 << 20).astype("<f4")
        # one more big layer so the pack takes a while at -9
        big.tofile(os.path.join(self.dir, "data", "big.float32"))
        man["DataFiles"].append({"Name": "big", "Path": "data/big.float32", "StorageBytes": 4,
                                 "StorageFormat": "float"})
        fc4 = layer(man, "fc4")
        fc4["Outputs"] = ["h"]
        man["Layers"].append({"Name": "fc5", "Op": "dense", "Prior": "h", "Outputs": ["y"],
                              "DataSource": "big", "StartIndex": 0, "Count": ((24 << 20) // 10) * 10,
                              "Params": {"TransW": True},
                              "Weights": [{"Name": "fc5.w", "Shape": [(24 << 20) // 10, 10]}]})
        save(self.dir, man)
        src = os.path.join(self.dir, "src.mldef")
        mldef("-c", "-f", src, os.path.join(self.dir, "manifest.json"), check=0)
        out = os.path.join(self.dir, "out.mldef")
        shutil.copy(src, out)
        before = open(out, "rb").read()
        for delay in (0.3, 0.8):
            p = subprocess.Popen([CKPTD, "pack", src, "-o", out, "-9"], stderr=subprocess.DEVNULL)
            time.sleep(delay)
            p.send_signal(signal.SIGKILL)
            p.wait()
            self.assertEqual(open(out, "rb").read(), before)
            mldef("-i", out, check=0)


MLP_GRAPH = """input: {name: x, shape: [-1, 12]}
output: probs
layers:
  - {op: dense, weight: fc1.weight, bias: fc1.bias}
  - {op: relu, name: h}
  - {op: dense, weight: fc2.weight, bias: fc2.bias, layout: in_out}
  - {op: add, from: [-1, skip.w]}
  - {op: softmax}
"""


def mlp_arrays():
    rng = np.random.default_rng(7)
    return {"fc1.weight": rng.standard_normal((8, 12)).astype(np.float32),
            "fc1.bias": rng.standard_normal(8).astype(np.float16),
            "fc2.weight": rng.standard_normal((8, 4)).astype(np.float64),
            "fc2.bias": rng.standard_normal(4).astype(np.float64),
            "skip.w": np.arange(4, dtype=np.int32),
            "unused": np.zeros(3, np.float32)}


class LayerLists(TmpDirCase):
    """Weight-only checkpoints with a layer list (docs/model.md), packed and
    read back with zipfile/json/numpy, compared with the numpy source."""

    def pack_and_compare(self, src, arrays, *extra):
        graph = os.path.join(self.dir, "g.yaml")
        with open(graph, "w") as f:
            f.write(MLP_GRAPH)
        out = os.path.join(self.dir, os.path.basename(src) + ".mldef")
        p = run("pack", src, "--graph", graph, "-o", out, *extra, check=0)
        man, got, _ = archive_weights(out)
        used = {k: v for k, v in arrays.items() if k != "unused"}
        self.assertEqual(set(got), set(used))
        for name, a in used.items():
            # a layer whose weights are all float64 keeps them; the rest become float32
            want = a.astype(np.float64 if name.startswith("fc2.") else np.float32)
            self.assertEqual(got[name].dtype, want.dtype, name)
            np.testing.assert_array_equal(got[name], want.reshape(got[name].shape), name)
            self.assertEqual(list(got[name].shape), list(a.shape))
        ops = [x.get("Op") for x in man["Layers"]]
        self.assertEqual(ops, [None, "dense", "relu", "dense", "add", "softmax"])
        self.assertEqual(man["Layers"][0]["Shape"], [-1, 12])
        add = man["Layers"][4]
        self.assertIn("skip.w", add["Inputs"])
        self.assertIn("pack.convert", p.stderr)  # float16, int32 were converted
        self.assertIn("fc1.bias", p.stderr)
        mldef("-i", out, check=0)
        return man

    def test_safetensors(self):
        arrays = mlp_arrays()
        src = os.path.join(self.dir, "m.safetensors")
        with open(src, "wb") as f:
            f.write(safetensors_from_numpy(arrays))
        man = self.pack_and_compare(src, arrays)
        # float64 weights keep their precision in a .float64 file
        paths = [d["Path"] for d in man["DataFiles"]]
        self.assertTrue(any(p.endswith(".float64") for p in paths), paths)

    def test_npz(self):
        arrays = mlp_arrays()
        src = os.path.join(self.dir, "m.npz")
        np.savez(src, **arrays)
        self.pack_and_compare(src, arrays, "-9")

    def test_tf_bundle(self):
        arrays = mlp_arrays()
        prefix = os.path.join(self.dir, "ckpt")
        write_tf_bundle(prefix, [TfTensor.from_numpy(k, v) for k, v in arrays.items()])
        self.pack_and_compare(prefix, arrays)

    def test_bad_graphs_name_layer_and_tensor(self):
        arrays = mlp_arrays()
        src = os.path.join(self.dir, "m.safetensors")
        with open(src, "wb") as f:
            f.write(safetensors_from_numpy(arrays))
        out = os.path.join(self.dir, "bad.mldef")
        graph = os.path.join(self.dir, "bad.yaml")
        cases = [
            (MLP_GRAPH.replace("fc2.bias", "fc9.bias"), "fc9.bias"),           # tensor missing
            (MLP_GRAPH.replace("layout: in_out", "layout: out_in"), "fc2.weight"),  # no chain
        ]
        for text, needle in cases:
            with open(graph, "w") as f:
                f.write(text)
            p = run("pack", src, "--graph", graph, "-o", out)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(needle, p.stderr)
            self.assertIn("bad.yaml", p.stderr)
            self.assertFalse(os.path.exists(out))
            self.assertEqual([f for f in os.listdir(self.dir) if f.startswith(".")], [])


class RealFiles(TmpDirCase):
    def test_lenet_nnp(self):
        nnp = shared("nnabla", "lenet_010000.nnp") if os.path.exists(
            os.path.join(os.environ.get("CK_SHARED_DATA", ""), "nnabla", "lenet_010000.nnp")) \
            else None
        if nnp is None:
            cands = []
            d = shared("nnabla")
            for root, _, files in os.walk(d):
                cands += [os.path.join(root, f) for f in files if f.endswith(".nnp")]
            if not cands:
                raise unittest.SkipTest("no .nnp in shared data")
            nnp = sorted(cands)[0]
        out = os.path.join(self.dir, "lenet.mldef")
        p = run("pack", nnp, "-o", out)
        if p.returncode != 0 and "holds weights only" in p.stderr:
            raise unittest.SkipTest("the NNabla to_model mapping is not in this build")
        self.assertEqual(p.returncode, 0, p.stderr)
        ins = json.loads(run("inspect", "--json", nnp, check=0).stdout)
        src = {t["name"]: t for t in ins["tensors"]}
        man, got, _ = archive_weights(out)
        self.assertTrue(got)
        for name, arr in got.items():
            self.assertIn(name, src)
            self.assertEqual(list(arr.shape), src[name]["shape"])
            # the .nnp stores float32: the archive's bytes are the same bytes
            self.assertEqual(f"{crc32c(arr.astype('<f4').tobytes()):08x}", src[name]["crc32c"])
        self.assertEqual(man["Model"]["Source"], "nnp")
        ops = [x["Op"] for x in man["Layers"][1:]]
        self.assertIn("conv2d", ops)
        self.assertIn("maxpool", ops)
        self.assertIn("dense", ops)
        mldef("-i", out, check=0)


if __name__ == "__main__":
    unittest.main()
