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


class BatchNormFold(Base):
    def bn(self, c):
        """A batch norm whose statistics and affine parameters are far from
        the identity, so a fold that drops or misplaces one shows."""
        g = self.torch.Generator().manual_seed(c)
        b = self.torch.nn.BatchNorm2d(c, eps=1e-3)
        b.running_mean.copy_(self.torch.rand(c, generator=g) * 4 - 2)
        b.running_var.copy_(self.torch.rand(c, generator=g) * 3 + 0.1)
        b.weight.data.copy_(self.torch.rand(c, generator=g) * 2 - 1)
        b.bias.data.copy_(self.torch.rand(c, generator=g) - 0.5)
        return b

    def test_folded_into_the_convolution(self):
        """conv + bn folded (with and without the conv's bias, grouped,
        depthwise, strided), within 1e-5 of torch."""
        nn = self.torch.nn
        cases = {
            "plain": nn.Conv2d(3, 8, 3, padding=1),
            "no_bias": nn.Conv2d(3, 8, 3, padding=1, bias=False),
            "grouped": nn.Conv2d(4, 8, 3, stride=2, groups=2),
            "depthwise": nn.Conv2d(6, 6, 5, padding=2, groups=6, bias=False),
            "pointwise": nn.Conv2d(5, 7, 1),
        }
        for name, conv in cases.items():
            with self.subTest(name):
                self.torch.manual_seed(len(name))
                net = nn.Sequential(conv, self.bn(conv.out_channels), nn.Conv2d(
                    conv.out_channels, 2, 1))
                ci = conv.in_channels
                self.check(name, net, self.torch.randn(2, ci, 11, 13))

    def test_not_folded_when_the_conv_output_has_another_reader(self):
        """The convolution's output feeds the batch norm and an addition
        after it: folding would hand the addition the normalised values."""
        nn = self.torch.nn
        bn = self.bn(4)

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), bn

            def forward(self, x):
                c = self.conv(x)
                return self.bn(c) + c

        self.torch.manual_seed(3)
        self.check("shared", Net(), self.torch.randn(2, 3, 9, 9))


if __name__ == "__main__":
    unittest.main()
