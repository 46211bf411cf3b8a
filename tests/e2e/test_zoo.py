"""The models users train, through the real binary: each from ONNX, after
`ckptd pack --format mldef` (and `mldef -i`) and after `--format samediff`
(read back by ckptd's own SameDiff reader), verified against an independent
reference: torch's own outputs for torch models, numpy for graphs written
with onnx.helper."""
import os
import subprocess
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import torch_gen as tg  # noqa: E402
from ckptd_test import CKPTD, TmpDirCase, run  # noqa: E402

MLDEF = os.path.join(os.path.dirname(CKPTD), "mldef")
ATOL = "1e-4"


class Checker(TmpDirCase):
    def path(self, name):
        return os.path.join(self.dir, name)

    def verify(self, model, x, y):
        """ckptd verify MODEL against y for input x; the CompletedProcess."""
        base = os.path.splitext(os.path.basename(model))[0]
        xi, yi = self.path(base + "_x.npy"), self.path(base + "_y.npy")
        np.save(xi, x)
        np.save(yi, y)
        return run("verify", model, "--inputs", xi, "--expected", yi, "--rtol", "1e-4",
                   "--atol", ATOL, timeout=300)

    def three_ways(self, onnx_path, x, y, forms=("onnx", "mldef", "samediff")):
        """Verifies the model from ONNX, as an .mldef (which `mldef -i` also
        calls valid) and as a SameDiff tag; fails naming the form."""
        base = os.path.splitext(onnx_path)[0]
        for form in forms:
            if form == "onnx":
                model = onnx_path
            elif form == "mldef":
                model = base + ".mldef"
                run("pack", "--format", "mldef", onnx_path, "-o", model, check=0, timeout=300)
                p = subprocess.run([MLDEF, "-i", model], capture_output=True, text=True,
                                   timeout=300)
                self.assertEqual(p.returncode, 0, f"mldef -i {model}: {p.stdout}{p.stderr}")
            else:
                model = base + ".sd.zip"
                run("pack", "--format", "samediff", onnx_path, "-o", model, "--tag", "t",
                    check=0, timeout=300)
            p = self.verify(model, x, y)
            self.assertEqual(p.returncode, 0, f"{form}: {model}\n{p.stdout}{p.stderr}")


class Limits(Checker):
    """No fixed bound on a node's inputs or outputs: a concat of 40 values
    and a split into 40 (DenseNet-121's concats take up to 25)."""

    def test_forty_way_split_and_concat(self):
        onnx = tg.need_onnx()
        from onnx import helper as h, TensorProto as TP
        n = 40
        parts = [f"p{i}" for i in range(n)]
        nodes = [h.make_node("Split", ["x"], parts, name="split", axis=1)]
        nodes += [h.make_node("Relu", [p], [p + "r"], name=f"relu{i}") for i, p in enumerate(parts)]
        # every part twice, in reverse: 80 inputs
        cat_in = [p + "r" for p in reversed(parts)] + parts
        nodes.append(h.make_node("Concat", cat_in, ["y"], name="cat", axis=1))
        g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [2, n, 3])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [2, 2 * n, 3])])
        src = self.path("wide.onnx")
        onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), src)
        x = np.random.default_rng(7).standard_normal((2, n, 3)).astype(np.float32)
        pieces = np.split(x, n, axis=1)
        y = np.concatenate([np.maximum(p, 0) for p in reversed(pieces)] + pieces, axis=1)
        self.three_ways(src, x, y)


if __name__ == "__main__":
    unittest.main()
