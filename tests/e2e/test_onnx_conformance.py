"""ONNX's own node conformance suite through the real binary (issue 35).

The cases, their inputs and their expected outputs are ONNX's: the onnx
package's generator writes them (tests/lib/onnx_conformance.py runs
`ckptd verify` on each and checks what ckptd saved against ONNX's reference
itself). A wrong answer fails the test: ckptd saying ok where ONNX's
reference disagrees, or running a model and reporting a mismatch where it
should have refused it. The float pass rate must stay at or above FLOOR."""
import os
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import CKPTD, TMP, TmpDirCase, run  # noqa: E402
import onnx_conformance as conf  # noqa: E402 (restores numpy's aliases before onnx)
import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

# The float pass rate this branch reached (passed / float cases, percent):
# raise it with every op that lands, never lower it.
FLOOR = 93.5


class Suite(unittest.TestCase):
    def test_node_suite(self):
        os.makedirs(TMP, exist_ok=True)
        t0 = time.time()
        with tempfile.TemporaryDirectory(prefix="onnx_conformance.", dir=TMP) as d:
            cases = conf.run_all(CKPTD, d)
            text = conf.summary(cases)
        print("\n" + text + "\ntime: %.1f s" % (time.time() - t0), file=sys.stderr)
        self.assertGreater(len(cases), 800, "the generator wrote too few cases")
        wrong = [c for c in cases if c.result == "wrong"]
        self.assertEqual(wrong, [], "wrong answers:\n" + "\n".join(
            "%s (%s): %s" % (c.name, c.op, c.reason) for c in wrong))
        fl = [c for c in cases if c.float and c.result != "not_tensor"]
        rate = 100.0 * sum(c.result == "passed" for c in fl) / len(fl)
        self.assertGreaterEqual(rate, FLOOR, "float pass rate %.1f%% below %.1f%%" % (rate, FLOOR))


def save_model(path, node, inputs, outputs, opset=17):
    g = helper.make_graph([node], "g", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(m, path)


class ExitCodes(TmpDirCase):
    """Exit 4: refused, nothing run; exit 1 with MISMATCH: ran, outputs differ."""

    def _files(self, x, y):
        xi, yo = os.path.join(self.dir, "x.npy"), os.path.join(self.dir, "y.npy")
        np.save(xi, x)
        np.save(yo, y)
        return xi, yo

    def test_refusal_and_mismatch_differ(self):
        x = np.array([[1.5, -2.0], [0.25, 3.0]], np.float32)
        vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
        vo = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])
        # an op ckptd does not compute: refused naming it, exit 4
        unsup = os.path.join(self.dir, "unsup.onnx")
        save_model(unsup, helper.make_node("NonZero", ["x"], ["y"]), [vi], [vo])
        xi, yo = self._files(x, np.abs(x))
        p = run("verify", unsup, "--inputs", xi, "--expected", yo)
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assertIn("'NonZero'", p.stderr)
        self.assertNotIn("MISMATCH", p.stdout)
        # a model it computes, with outputs that differ: exit 1, MISMATCH
        ok = os.path.join(self.dir, "abs.onnx")
        save_model(ok, helper.make_node("Abs", ["x"], ["y"]), [vi], [vo])
        xi, yo = self._files(x, np.abs(x) + 1)
        p = run("verify", ok, "--inputs", xi, "--expected", yo)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("MISMATCH", p.stdout)
        # and the same model with numpy's outputs: exit 0
        xi, yo = self._files(x, np.abs(x))
        run("verify", ok, "--inputs", xi, "--expected", yo, check=0)

    def test_integer_arithmetic_refused(self):
        vi = [helper.make_tensor_value_info(n, TensorProto.UINT8, [3]) for n in "ab"]
        vo = helper.make_tensor_value_info("y", TensorProto.UINT8, [3])
        path = os.path.join(self.dir, "div.onnx")
        save_model(path, helper.make_node("Div", ["a", "b"], ["y"]), vi, [vo])
        a, b = np.array([7, 9, 5], np.uint8), np.array([2, 4, 5], np.uint8)
        np.save(os.path.join(self.dir, "a.npy"), a)
        np.save(os.path.join(self.dir, "b.npy"), b)
        np.save(os.path.join(self.dir, "y.npy"), a // b)
        p = run("verify", path, "--inputs", os.path.join(self.dir, "a.npy"),
                os.path.join(self.dir, "b.npy"), "--expected", os.path.join(self.dir, "y.npy"))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)  # integer kernels: 7 / 2 is 3
        # integer arithmetic without an integer kernel: refused, exit 4
        save_model(path, helper.make_node("MatMul", ["a", "b"], ["y"]), vi,
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, [])])
        p = run("verify", path, "--inputs", os.path.join(self.dir, "a.npy"),
                os.path.join(self.dir, "b.npy"))
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assertIn("integer", p.stderr)


class TorchRecurrent(TmpDirCase):
    """torch's own LSTM, GRU and RNN (2 layers, both directions) exported to
    ONNX (opset 13 and 17: ONNX's LSTM/GRU/RNN ops, the zero initial states
    built with Shape/ConstantOfShape/Expand) verify against torch's outputs."""

    def test_lstm_gru_rnn_from_torch(self):
        import torch
        torch.manual_seed(0)

        class M(torch.nn.Module):
            def __init__(self, cell):
                super().__init__()
                self.rnn = cell(input_size=5, hidden_size=4, num_layers=2, bidirectional=True)
                self.fc = torch.nn.Linear(8, 3)

            def forward(self, x):
                return self.fc(self.rnn(x)[0])

        for name, cell in (("lstm", torch.nn.LSTM), ("gru", torch.nn.GRU), ("rnn", torch.nn.RNN)):
            m = M(cell).eval()
            x = torch.randn(6, 2, 5)
            xi, yo = os.path.join(self.dir, name + "_x.npy"), os.path.join(self.dir, name + "_y.npy")
            np.save(xi, x.numpy())
            with torch.no_grad():
                np.save(yo, m(x).numpy())
            for opset in (13, 17):
                with self.subTest(op=name, opset=opset):
                    path = os.path.join(self.dir, "%s%d.onnx" % (name, opset))
                    torch.onnx.export(m, x, path, opset_version=opset, input_names=["x"],
                                      output_names=["y"])
                    p = run("verify", path, "--inputs", xi, "--expected", yo, "--atol", "1e-5",
                            timeout=120)
                    self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
                    self.assertIn("ok against=expected", p.stdout)


if __name__ == "__main__":
    unittest.main()
