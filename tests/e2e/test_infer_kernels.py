"""The engine's fast paths (issue 31) against torch, through the real
binary: the direct depthwise convolution, BatchNormalization folded into
the convolution before it, and activations in a producer's epilogue. Each
model is exported by torch.onnx.export and checked by `ckptd verify
--expected` against torch's own output for the same input."""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import torch_gen as tg  # noqa: E402
from ckptd_test import TmpDirCase, run  # noqa: E402


class Base(TmpDirCase):
    def setUp(self):
        super().setUp()
        self.torch = tg.need_torch()
        tg.need_onnx()

    def check(self, name, module, x, rtol="1e-5", atol="1e-5"):
        """Exports module (eval mode), verifies it on x against torch."""
        p = os.path.join(self.dir, name + ".onnx")
        module.eval()
        # TrainingMode.PRESERVE (export_onnx's): in EVAL torch's exporter folds
        # the batch norms itself
        y = tg.export_onnx(module, x, p)
        xi, yi = os.path.join(self.dir, name + "_x.npy"), os.path.join(self.dir, name + "_y.npy")
        np.save(xi, x.numpy())
        np.save(yi, y)
        r = run("verify", p, "--inputs", xi, "--expected", yi, "--rtol", rtol, "--atol", atol,
                timeout=120)
        self.assertEqual(r.returncode, 0, f"{name}:\n{r.stdout}{r.stderr}")
        return r


class Depthwise(Base):
    def test_strides_dilations_padding_multiplier(self):
        """groups == input channels, against torch: the borders (padding on
        both sides, odd sizes), the 8-column inner loop at stride 1 and 2,
        the scalar one at stride 3, dilation, a channel multiplier of 2, no
        bias, and a row narrower than 8 columns."""
        nn = self.torch.nn
        cases = {
            # name: (in channels, out channels, kernel, stride, padding, dilation, bias, H, W)
            "k3s1": (4, 4, 3, 1, 1, 1, True, 29, 37),
            "k3s2_mult2": (4, 8, 3, 2, 1, 1, True, 29, 37),
            "k5s2_dil2": (3, 3, 5, 2, 4, 2, True, 33, 41),
            "k7s1_pad3": (6, 6, 7, 1, 3, 1, True, 24, 24),
            "k3s3_mult2_nobias": (2, 4, 3, 3, 2, 1, False, 20, 26),
            "k3x5_unpadded": (3, 6, (3, 5), 1, 0, 1, True, 9, 30),
            "narrow": (5, 5, 3, 2, 1, 1, True, 7, 5),
            "wide_kernel_past_the_image": (2, 2, 5, 1, 6, 3, True, 4, 4),
        }
        for name, (ci, co, k, s, pad, dil, bias, h, w) in cases.items():
            with self.subTest(name):
                self.torch.manual_seed(len(name))
                conv = nn.Conv2d(ci, co, k, stride=s, padding=pad, dilation=dil, groups=ci,
                                 bias=bias)
                self.check(name, conv, self.torch.randn(2, ci, h, w))


if __name__ == "__main__":
    unittest.main()
