"""mldef -r (and ckptd verify --record when present), end to end: an .mldef
packed by the real binary from a torch-built MLP (safetensors + layer list,
tests/lib/make_torch_models.py) must compute torch's outputs; inputs are
written and outputs read back independently with numpy."""
import os
import subprocess
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
from ckptd_test import CKPTD, TmpDirCase, run  # noqa: E402
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


if __name__ == "__main__":
    unittest.main()
