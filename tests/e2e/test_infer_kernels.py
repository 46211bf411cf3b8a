"""The engine's fast paths (issue 31) against torch, through the real
binary: the direct depthwise convolution, BatchNormalization folded into
the convolution before it, activations in a producer's epilogue, the
broadcast arithmetic's loops, and the kernels cut among threads (`--threads
N`: the same bytes as one thread). Each model is exported by
torch.onnx.export and checked by `ckptd verify --expected` against torch's
own output for the same input."""
import os
import sys
import tempfile
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


class PackedProducts(Base):
    def test_convolutions_around_the_blocks(self):
        """The convolutions whose weights are packed at load (infer/pgemm.c,
        on CPUs with AVX-512F; OpenBLAS elsewhere) against torch: output
        channels off the 8-row panel, outputs off the 16- and 32-column
        tiles and past the 128-column block, k past the 256 k block (3x3
        over 40 channels, 1x1 over 300), 1x1 unpadded (no im2col), 1x1 at
        stride 2 and padded, stride 2, dilation, groups of 3 channels,
        no bias, an activation in the epilogue, products with fewer
        columns than rows, and a batch of small images gathered into one
        product."""
        nn = self.torch.nn
        cases = {
            # name: (in, out, kernel, stride, padding, dilation, groups, bias, N, H, W)
            "k3_odd": (5, 13, 3, 1, 1, 1, 1, True, 1, 17, 19),
            "k3_k_past_256": (40, 9, 3, 1, 1, 1, 1, True, 2, 11, 13),
            "pointwise_k300": (300, 17, 1, 1, 0, 1, 1, True, 1, 7, 5),
            "pointwise_wide": (6, 70, 1, 1, 0, 1, 1, False, 1, 33, 35),
            "1x1_stride2": (7, 11, 1, 2, 0, 1, 1, True, 1, 15, 9),
            "1x1_padded": (4, 5, 1, 1, 1, 1, 1, True, 1, 6, 6),
            "k3_stride2": (8, 70, 3, 2, 1, 1, 1, True, 1, 29, 31),
            "k3_dilation2": (6, 17, 3, 1, 2, 2, 1, True, 1, 20, 21),
            "k5_pad_past": (3, 8, 5, 1, 3, 1, 1, False, 1, 4, 6),
            "groups3": (9, 15, 3, 1, 1, 1, 3, True, 1, 12, 10),
            "groups_pointwise": (12, 20, 1, 1, 0, 1, 4, True, 1, 9, 9),
            "more_rows_than_cols": (64, 100, 3, 1, 1, 1, 1, True, 1, 3, 3),
            "batch_of_small": (10, 19, 3, 1, 1, 1, 1, True, 5, 4, 5),
        }
        for name, (ci, co, k, s, pad, dil, g, bias, nb, h, w) in cases.items():
            with self.subTest(name):
                self.torch.manual_seed(len(name) + co)
                conv = nn.Conv2d(ci, co, k, stride=s, padding=pad, dilation=dil, groups=g,
                                 bias=bias)
                self.check(name, conv, self.torch.randn(nb, ci, h, w))
        with self.subTest("relu_and_silu_epilogues"):
            self.torch.manual_seed(4)
            net = nn.Sequential(nn.Conv2d(5, 21, 3, padding=1), nn.ReLU(),
                                nn.Conv2d(21, 35, 1), nn.SiLU(),
                                nn.Conv2d(35, 9, 3, stride=2), nn.Sigmoid())
            self.check("epilogues", net, self.torch.randn(2, 5, 19, 23))


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


class Epilogue(Base):
    def test_activations_after_conv_and_dense(self):
        """Each activation the epilogue runs, after a convolution (plain,
        depthwise, 1x1, with a folded batch norm) and after a dense layer,
        within 1e-5 of torch."""
        nn = self.torch.nn
        acts = {"relu": nn.ReLU(), "relu6": nn.ReLU6(), "sigmoid": nn.Sigmoid(),
                "silu": nn.SiLU(), "gelu": nn.GELU(), "hardtanh": nn.Hardtanh(-0.5, 0.5)}
        for aname, act in acts.items():
            layers = {  # name: (the layer, its output channels)
                "conv": (lambda: nn.Conv2d(3, 6, 3, padding=1), 6),
                "depthwise": (lambda: nn.Conv2d(3, 6, 3, stride=2, groups=3), 6),
                "pointwise": (lambda: nn.Conv2d(3, 5, 1, bias=False), 5),
                "conv_bn": (lambda: nn.Sequential(nn.Conv2d(3, 6, 3), BatchNormFold.bn(self, 6)),
                            6),
            }
            for lname, (make, oc) in layers.items():
                with self.subTest(f"{lname}_{aname}"):
                    self.torch.manual_seed(7)
                    net = nn.Sequential(make(), act, nn.Conv2d(oc, 2, 1))
                    self.check(f"{lname}_{aname}", net, self.torch.randn(2, 3, 10, 12) * 3)
            with self.subTest(f"dense_{aname}"):
                self.torch.manual_seed(8)
                net = nn.Sequential(nn.Linear(7, 9), act, nn.Linear(9, 3))
                self.check(f"dense_{aname}", net, self.torch.randn(4, 7) * 3)

    def test_not_folded_when_read_elsewhere(self):
        """The convolution's output, or the sigmoid of a silu, read by a
        later node too: the activation must stay a node of its own."""
        nn = self.torch.nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)

            def forward(self, x):
                c = self.a(x)
                r = self.torch.relu(c) + c  # relu and the add read c
                d = self.b(r)
                s = self.torch.sigmoid(d)
                return d * s + s  # silu's sigmoid read by the add too

        net = Net()
        net.torch = self.torch
        self.torch.manual_seed(9)
        self.check("shared", net, self.torch.randn(2, 3, 8, 8) * 3)


class Broadcast(Base):
    def test_patterns_against_torch(self):
        """The binary ops' loops for each broadcast pattern: same shape, a
        per-channel operand on either side ([1, C, 1, 1], [N, C, 1, 1]), a
        row operand ([W]), a scalar constant on either side, a [N, 1, H, 1]
        operand (one value per row of W after the axes merge), odd sizes
        (channels 7, 1x1 images, batch 3), for add, sub, mul, div, max, min
        and pow."""
        torch = self.torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                g = torch.Generator().manual_seed(11)
                self.ch = torch.nn.Parameter(torch.rand(1, 7, 1, 1, generator=g) + 0.5)
                self.row = torch.nn.Parameter(torch.rand(5, generator=g) + 0.5)

            def forward(self, x):
                n = x.shape[0]
                a = x * self.ch + self.row             # per channel, then a row
                b = self.ch / (x.abs() + 1) - 2.5      # per channel first; a scalar
                c = torch.maximum(a, b) * torch.minimum(a, x)  # same shapes
                s = x.mean((2, 3), keepdim=True)       # [N, C, 1, 1], per sample and channel
                d = (c - s) / (s.abs() + 1) + 3.0 / (b.abs() + 1)
                e = x[:, :1, :, :1].reshape(n, 1, x.shape[2], 1)  # [N, 1, H, 1]
                f = torch.pow(x.abs() + 0.5, 1.5) + d * e
                return torch.cat([c, d, f], 1)

        for name, shape in {"odd": (3, 7, 6, 5), "one_pixel": (3, 7, 1, 5),
                            "large": (2, 7, 40, 5)}.items():
            with self.subTest(name):
                torch.manual_seed(len(name))
                self.check("bcast_" + name, Net(), torch.randn(*shape) * 2, rtol="1e-5",
                           atol="1e-5")


class Threads(Base):
    """`--threads N`: the outputs of 1 and N threads byte for byte, and
    against torch, on kernels cut among the threads at odd shapes and on the
    zoo's models (tests/lib/zoo_gen.py, opset 13, batch 2)."""

    def same_bits(self, path, x, want, counts=(1, 4), atol="1e-4", rtol="1e-4"):
        xi = os.path.join(self.dir, "x.npy")
        yi = os.path.join(self.dir, "y.npy")
        np.save(xi, x)
        np.save(yi, want)
        got = {}
        for n in counts:
            out = tempfile.mkdtemp(dir=self.dir)
            r = run("verify", path, "--inputs", xi, "--expected", yi, "--atol", atol, "--rtol",
                    rtol, "--threads", str(n), "--save-outputs", out, "--repeat", "2",
                    timeout=300)
            self.assertEqual(r.returncode, 0, f"{path} --threads {n}:\n{r.stdout}{r.stderr}")
            with open(os.path.join(out, "output.npy"), "rb") as f:
                got[n] = f.read()
        for n in counts[1:]:
            a = np.frombuffer(got[counts[0]][128:], np.float32)
            b = np.frombuffer(got[n][128:], np.float32)
            self.assertEqual(got[n], got[counts[0]],
                             f"{path}: {n} threads differ from {counts[0]} in "
                             f"{int(np.sum(a != b))} values")

    def test_kernels_cut_among_threads(self):
        """Each kernel the threads share, at sizes that cut it into parts
        (convolution columns past 64 per block, channels, dense rows past
        16, batched products, element-wise ops past 16K values) and at
        shapes that leave partial parts (7 channels, 1x1 images, batch 3)."""
        torch, nn = self.torch, self.torch.nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(5, 50, 3, padding=1)              # im2col, 24+24+2 rows
                self.point = nn.Conv2d(50, 30, 1)                       # pointwise
                self.group = nn.Conv2d(30, 60, 3, padding=1, groups=2)  # grouped, 30 per group
                self.dw = nn.Conv2d(60, 120, 3, stride=2, padding=1, groups=60)  # depthwise x2
                self.one = nn.Conv2d(120, 29, 3, padding=1)             # on a 1x1 image
                self.tok = nn.Linear(120, 16)                           # a row per pixel
                self.fc = nn.Linear(29, 11)

            def forward(self, x):
                y = torch.relu(self.conv(x))
                y = torch.sigmoid(self.point(y)) * y.sum(1, keepdim=True)
                y = torch.tanh(self.group(y)) + 0.5
                y = self.dw(y)
                p = torch.nn.functional.adaptive_avg_pool2d(y, 1)
                z = self.one(p).flatten(1)                          # [N, 29]
                t = torch.nn.functional.gelu(self.tok(y.flatten(2).transpose(1, 2)))  # [N, HW, 16]
                att = torch.softmax(t @ t.transpose(1, 2) / 4, -1)  # batched products
                u = (att @ t).mean(1)                               # [N, 16]
                return torch.cat([self.fc(z), u, y.flatten(1)[:, :40]], 1)

        for name, shape in {"batch3": (3, 5, 37, 23), "small": (1, 5, 3, 2)}.items():
            with self.subTest(name):
                torch.manual_seed(3)
                net = Net().eval()
                x = torch.randn(*shape)
                p = os.path.join(self.dir, name + ".onnx")
                want = tg.export_onnx(net, x, p)
                self.same_bits(p, x.numpy(), want, counts=(1, 3, 4), atol="1e-5", rtol="1e-5")

    def test_zoo_models_same_bytes_at_1_and_4_threads(self):
        try:
            import torchvision  # noqa: F401
        except ImportError:
            raise unittest.SkipTest("python3-torchvision is not installed")
        import zoo_gen
        zoo = zoo_gen.models()
        for name in ("resnet18", "mobilenet_v2", "efficientnet_b0", "regnet_x_400mf",
                     "convnext_block", "vit_tiny", "bert_small"):
            with self.subTest(name):
                module, x, _ = zoo[name]
                p = os.path.join(self.dir, name + ".onnx")
                self.torch.onnx.export(module, (x,), p, opset_version=13, input_names=["input"],
                                       output_names=["output"], do_constant_folding=False,
                                       training=self.torch.onnx.TrainingMode.EVAL)
                with self.torch.no_grad():
                    want = module(x).numpy()
                self.same_bits(p, x.numpy().astype(np.float32), want)

    def test_threads_usage(self):
        """--threads outside 1..64 is a usage error naming the option."""
        for bad in ("0", "65", "two", "1.5", "-1"):
            with self.subTest(bad):
                r = run("verify", "x.onnx", "--threads", bad)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn("--threads takes a count from 1 to 64", r.stderr)


if __name__ == "__main__":
    unittest.main()
