"""ckptd verify, end to end: the real binary runs models that PyTorch built
and ran (tests/lib/make_torch_models.py, Debian's python3-torch, one thread);
ckptd's outputs must match torch's within 1e-5 relative (1e-4 absolute near
zero), checked here again with numpy on the outputs ckptd saves. Damaged
weights must fail naming the output; the real LeNet .nnp must read a 5."""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptd_test import TMP, TmpDirCase, run, shared  # noqa: E402

GENERATOR = os.path.join(HERE, "..", "lib", "make_torch_models.py")
with open(GENERATOR, "rb") as _f:
    MODELS = os.path.join(TMP, "torch_models." + hashlib.sha256(_f.read()).hexdigest()[:12])


def setUpModule():
    """Runs the generator once for every case that runs in parallel: into a
    scratch folder renamed into place, so no case reads a half-written file."""
    os.makedirs(TMP, exist_ok=True)
    if os.path.isdir(MODELS):
        return
    tmp = tempfile.mkdtemp(prefix="torch_models.", dir=TMP)
    subprocess.run(["/usr/bin/python3", GENERATOR, tmp], check=True, timeout=300)
    try:
        os.rename(tmp, MODELS)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another case got there first


def m(name):
    return os.path.join(MODELS, name)


class Torch(TmpDirCase):
    def check_model(self, name):
        for batch in (1, 64):
            out = os.path.join(self.dir, "b%d" % batch)
            os.makedirs(out)
            p = run("verify", m(name + ".safetensors"), "--graph", m(name + ".yaml"),
                    "--inputs", m("%s.in%d.npy" % (name, batch)),
                    "--expected", m("%s.out%d.npy" % (name, batch)),
                    "--save-outputs", out, check=0)
            self.assertIn("output 'y'", p.stdout)
            self.assertIn(": ok", p.stdout)
            got = np.load(os.path.join(out, "y.npy"))
            want = np.load(m("%s.out%d.npy" % (name, batch)))
            self.assertEqual(got.shape, want.shape)
            self.assertEqual(got.shape[0], batch)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)

    def test_mlp(self):
        self.check_model("mlp")

    def test_cnn(self):
        self.check_model("cnn")

    def test_residual(self):
        self.check_model("residual")

    def test_naive_gemm_agrees(self):
        out = self.dir
        run("verify", m("cnn.safetensors"), "--graph", m("cnn.yaml"), "--naive-gemm",
            "--inputs", m("cnn.in64.npy"), "--expected", m("cnn.out64.npy"),
            "--save-outputs", out, check=0)
        np.testing.assert_allclose(np.load(os.path.join(out, "y.npy")),
                                   np.load(m("cnn.out64.npy")), rtol=1e-5, atol=1e-4)

    def test_default_inputs_are_documented(self):
        """Without --inputs, input k is sin(0.5 i + k): torch on the same values agrees."""
        import torch
        sys.path.insert(0, os.path.join(HERE, "..", "lib"))
        import make_torch_models as mk
        torch.set_num_threads(1)
        name, model = [(n, mod) for n, mod, *_ in mk.models()][0]
        self.assertEqual(name, "mlp")
        x = np.sin(0.5 * np.arange(20) + 0).astype("f4").reshape(1, 20)
        with torch.no_grad():
            want = model(torch.from_numpy(x)).numpy()
        p = run("verify", m("mlp.safetensors"), "--graph", m("mlp.yaml"), "--save-outputs",
                self.dir, check=0)
        self.assertIn("output 'y' [1, 10]:", p.stdout)
        got = np.load(os.path.join(self.dir, "y.npy"))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        line = [x for x in p.stdout.splitlines() if x.startswith("output 'y'")][0]
        printed = [float(v) for v in line.split(":", 1)[1].split()[:10]]
        np.testing.assert_allclose(printed, want[0], rtol=1e-5, atol=1e-4)


class Damaged(TmpDirCase):
    def verify(self, st, yaml="mlp.yaml", check=1):
        return run("verify", m(st), "--graph", m(yaml), "--inputs", m("mlp.in64.npy"),
                   "--expected", m("mlp.out64.npy"), check=check)

    def test_transposed_matrix(self):
        p = self.verify("mlp_transposed.safetensors")
        self.assertIn("output 'y' [64, 10]: MISMATCH", p.stdout)
        self.assertIn("largest deviation", p.stdout)
        self.assertIn("FAILED", p.stdout)

    def test_bias_dropped(self):
        p = self.verify("mlp_nobias.safetensors", "mlp_nobias.yaml")
        self.assertIn("output 'y' [64, 10]: MISMATCH", p.stdout)

    def test_bias_missing_from_the_file(self):
        """The layer list names fc1.bias, the file lost it: named before anything runs."""
        p = self.verify("mlp_nobias.safetensors")
        self.assertIn("fc1.bias", p.stderr)

    def test_data_truncated(self):
        p = self.verify("mlp_truncated.safetensors")
        self.assertIn("mlp_truncated.safetensors", p.stderr)

    def test_report_names_index_and_values(self):
        """The reported index and both values are those numpy finds."""
        out = self.dir
        run("verify", m("mlp_transposed.safetensors"), "--graph", m("mlp.yaml"), "--inputs",
            m("mlp.in64.npy"), "--save-outputs", out, check=0)
        got = np.load(os.path.join(out, "y.npy"))
        want = np.load(m("mlp.out64.npy"))
        excess = np.abs(got - want) - (1e-4 + 1e-5 * np.abs(want))
        i = np.unravel_index(np.argmax(excess), got.shape)
        p = self.verify("mlp_transposed.safetensors")
        self.assertIn("at [%d, %d]: got %.9g, expected %.9g" % (i[0], i[1], got[i], want[i]),
                      p.stdout)
        self.assertIn("%d of 640 values" % int((excess > 0).sum()), p.stdout)


class BadInput(TmpDirCase):
    def test_non_finite_weight_is_named(self):
        """A NaN in fc3.bias: a warning naming the tensor, and the output fails."""
        import make_torch_models as mk
        tensors = [t for n, _, t, *_ in mk.models() if n == "mlp"][0]
        tensors = dict(tensors)
        tensors["fc3.bias"] = tensors["fc3.bias"].copy()
        tensors["fc3.bias"][2] = np.nan
        st = os.path.join(self.dir, "nan.safetensors")
        mk.write_safetensors(st, tensors)
        p = run("verify", st, "--graph", m("mlp.yaml"), "--inputs", m("mlp.in1.npy"),
                "--expected", m("mlp.out1.npy"), check=1)
        self.assertIn("infer.weight_not_finite", p.stderr)
        self.assertIn("fc3.bias", p.stderr)
        self.assertIn("output 'y' [1, 10]: FAILED", p.stdout)
        self.assertIn("not finite", p.stdout)

    def test_input_of_the_wrong_shape(self):
        x = os.path.join(self.dir, "x.npy")
        np.save(x, np.zeros((2, 21), "f4"))
        p = run("verify", m("mlp.safetensors"), "--graph", m("mlp.yaml"), "--inputs", x, check=1)
        self.assertIn("input 'x': shape [2, 21] does not match the model's [-1, 20]", p.stderr)

    def test_npy_that_is_not_numbers(self):
        x = os.path.join(self.dir, "x.npy")
        np.save(x, np.array([[1 + 2j] * 20], "c8"))
        p = run("verify", m("mlp.safetensors"), "--graph", m("mlp.yaml"), "--inputs", x, check=1)
        self.assertIn("x.npy", p.stderr)
        self.assertIn("not an array of real numbers", p.stderr)

    def test_integer_inputs_convert(self):
        x = os.path.join(self.dir, "x.npy")
        np.save(x, np.arange(20, dtype="<i8").reshape(1, 20))
        run("verify", m("mlp.safetensors"), "--graph", m("mlp.yaml"), "--inputs", x,
            "--save-outputs", self.dir, check=0)

    def test_non_finite_output_fails(self):
        x = os.path.join(self.dir, "x.npy")
        np.save(x, np.full((1, 20), np.nan, "f4"))
        p = run("verify", m("mlp.safetensors"), "--graph", m("mlp.yaml"), "--inputs", x, check=1)
        self.assertIn("not finite", p.stdout)

    def test_memory_limit_is_reported_by_name(self):
        p = run("verify", m("cnn.safetensors"), "--graph", m("cnn.yaml"), "--inputs",
                m("cnn.in64.npy"), "--max-memory", "64K", check=1)
        self.assertIn("(memory)", p.stderr)

    def test_timeout_is_reported_by_name(self):
        """A run far longer than its CPU limit is stopped and named; ckptd carries on."""
        p = run("verify", m("cnn.safetensors"), "--graph", m("cnn.yaml"), "--inputs",
                m("cnn.in64.npy"), "--repeat", "100000", "--timeout", "1", check=1)
        self.assertIn("(timeout)", p.stderr)

    def test_usage(self):
        run("verify", check=2)
        run("verify", m("mlp.safetensors"), "--atol", "x", check=2)
        run("verify", m("mlp.safetensors"), "--max-memory", "1T", check=2)
        p = run("verify", m("mlp.safetensors"), "--graph", m("mlp.yaml"), "--inputs",
                m("mlp.in1.npy"), m("mlp.in1.npy"), check=2)
        self.assertIn("takes 1 inputs, 2 --inputs given", p.stderr)
        p = run("verify", m("mlp.safetensors"), check=2)
        self.assertIn("weights only", p.stderr)
        p = run("verify", "--help", check=0)
        self.assertIn("sin(0.5 i + k)", p.stdout)


class DataForms(TmpDirCase):
    """--inputs/--expected in the mldef test data forms (docs/mldef.md 4, 5):
    csv (one sample per line) and raw float32 little-endian, shaped by the
    model's input shape; written here with numpy from torch's values."""

    def write_forms(self, name, arr):
        csv = os.path.join(self.dir, name + ".csv")
        np.savetxt(csv, arr.reshape(len(arr), -1), delimiter=",", fmt="%.9g")
        raw = os.path.join(self.dir, name + ".float32")
        arr.astype("<f4").tofile(raw)
        return csv, raw

    def test_csv_and_binary_match_torch(self):
        for name in ("mlp", "cnn"):  # cnn: input [-1, 1, 28, 28] from flat samples
            x = np.load(m(name + ".in64.npy"))
            y = np.load(m(name + ".out64.npy"))
            xcsv, xraw = self.write_forms(name + "x", x)
            ycsv, yraw = self.write_forms(name + "y", y)
            for inp, exp in ((xcsv, yraw), (xraw, ycsv), (xcsv, m(name + ".out64.npy"))):
                with self.subTest(model=name, inputs=inp, expected=exp):
                    out = tempfile.mkdtemp(dir=self.dir)
                    p = run("verify", m(name + ".safetensors"), "--graph", m(name + ".yaml"),
                            "--inputs", inp, "--expected", exp, "--save-outputs", out, check=0)
                    self.assertIn("output 'y' %s: ok" % list(y.shape), p.stdout)
                    got = np.load(os.path.join(out, "y.npy"))
                    self.assertEqual(got.shape, y.shape)
                    np.testing.assert_allclose(got, y, rtol=1e-5, atol=1e-4)

    def test_mismatch_in_csv_expected_is_located(self):
        y = np.load(m("mlp.out64.npy")).copy()
        y[17, 3] += 0.5
        ycsv, yraw = self.write_forms("y", y)
        for exp in (ycsv, yraw):
            p = run("verify", m("mlp.safetensors"), "--graph", m("mlp.yaml"), "--inputs",
                    m("mlp.in64.npy"), "--expected", exp, check=1)
            self.assertRegex(p.stdout, r"output 'y' \[64, 10\]: MISMATCH: 1 of 640 values.* "
                             r"at \[17, 3\]: got ")

    def test_bad_test_data_is_named(self):
        args = ("verify", m("mlp.safetensors"), "--graph", m("mlp.yaml"), "--inputs")
        bad = os.path.join(self.dir, "bad.csv")
        with open(bad, "w") as f:
            f.write(",".join(["1"] * 20) + "\n" + ",".join(["1"] * 19) + "\n")
        p = run(*args, bad, check=1)
        self.assertIn("bad.csv' line 2: 19 values, a sample holds 20", p.stderr)
        with open(bad, "w") as f:
            f.write("1,x\n")
        p = run(*args, bad, check=1)
        self.assertIn("bad.csv' line 1: value 2 is not a number", p.stderr)
        with open(bad, "w") as f:
            f.write("\n\n")
        p = run(*args, bad, check=1)
        self.assertIn("bad.csv': no values", p.stderr)
        raw = os.path.join(self.dir, "x.bin")
        np.zeros(30, "<f4").tofile(raw)  # one and a half samples of 20
        p = run(*args, raw, check=1)
        self.assertIn("x.bin': 120 bytes is not a whole number of samples (20 float32 values",
                      p.stderr)
        p = run(*args, os.path.join(self.dir, "missing.csv"), check=1)
        self.assertIn("cannot open", p.stderr)
        self.assertIn("missing.csv", p.stderr)
        # a fixed batch in the model's input shape is checked against the samples
        one = os.path.join(self.dir, "one.yaml")
        with open(m("mlp.yaml")) as f:
            text = f.read()
        self.assertIn("[-1, 20]", text)
        with open(one, "w") as f:
            f.write(text.replace("[-1, 20]", "[1, 20]"))
        np.zeros(40, "<f4").tofile(raw)
        p = run("verify", m("mlp.safetensors"), "--graph", one, "--inputs", raw, check=1)
        self.assertIn("x.bin': 2 samples, input 'x' takes a batch of 1", p.stderr)


class Lenet(TmpDirCase):
    def test_reads_a_five(self):
        nnp = shared("nnabla", "lenet_010000.nnp")
        pgm = shared("nnabla", "5.pgm")
        with open(pgm, "rb") as f:
            data = f.read()
        # binary PGM: P5, width, height, maxval, then the pixels
        fields, pos = [], 0
        while len(fields) < 4:
            while data[pos:pos + 1].isspace():
                pos += 1
            if data[pos:pos + 1] == b"#":
                pos = data.index(b"\n", pos)
                continue
            end = pos
            while not data[end:end + 1].isspace():
                end += 1
            fields.append(data[pos:end])
            pos = end
        pos += 1
        w, h = int(fields[1]), int(fields[2])
        self.assertEqual(fields[0], b"P5")
        img = np.frombuffer(data[pos:pos + w * h], np.uint8).reshape(1, 1, h, w)
        x = os.path.join(self.dir, "x.npy")
        np.save(x, img.astype("f4"))
        # the .nnp itself, and the archives ckptd packs from it, as written
        mldef = os.path.join(self.dir, "lenet.mldef")
        run("pack", "--format", "mldef", nnp, "-o", mldef, check=0)
        sd = os.path.join(self.dir, "run.zip")
        run("pack", "--format", "samediff", nnp, "-o", sd, "--tag", "e10000", check=0)
        for model in (nnp, mldef, sd, sd + "#e10000"):
            with self.subTest(model=os.path.basename(model)):
                outdir = os.path.join(self.dir, "out-" + os.path.basename(model).replace("#", "-"))
                os.makedirs(outdir)
                run("verify", model, "--inputs", x, "--save-outputs", outdir, check=0)
                outs = [f for f in os.listdir(outdir) if f.endswith(".npy")]
                self.assertEqual(len(outs), 1, outs)
                y = np.load(os.path.join(outdir, outs[0]))
                self.assertEqual(int(np.argmax(y.reshape(-1))), 5, y)


if __name__ == "__main__":
    unittest.main()
