"""What fuzzing found, kept as regression tests that run the real binary: each
file is one the fuzzers (or a reading of their findings) produced, rebuilt
here with the onnx package or tests/lib/sdfb.py, and every command that opens
it must refuse it by name with exit 1: no signal, no sanitizer report (the
test build halts on both), and the sidecar must go on registering what comes
after it."""
import base64
import os
import signal
import subprocess
import sys
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import torch_gen as tg  # noqa: E402
from ckptd_test import CKPTD, TmpDirCase, run  # noqa: E402

# fuzz_onnx, about 80 s in: a Gemm node with no inputs (and an op name the
# mutation garbled) made verify and pack die with SIGSEGV.
GEMM_224 = (
    "CAg61wEKM/0BaAoBdxIBaBoCZmMiBEdlbW0qDwoFYWxwaGEVAAAAP6ABASoNCgZ0cmFuc0IYAaABAgoOCgFoEgJocyIF"
    "U2hhcGUKEgoBaAoBcxIBciIHUm1zaGFwZQolCgFyEgF5IgdTb2Z0bWF4KhQKBGF4aXMY//////////7/AaABAhIBZyob"
    "CAIIAhABIhAAAIA/AAAAQAAAQEAAPRVUQgF3KgsIAhAHOgIBBEIBc1oTCgF4Eg4KDAgBEggKAggCCgIIAmIDCgF5Eg4K"
    "DAgBEggKAggBCgIIBEICEBE="
)


class Base(TmpDirCase):
    def path(self, name):
        return os.path.join(self.dir, name)

    def refused(self, cmd, path, words, code=1):
        """cmd on path exits code (1: a bad file, 4: a valid model ckptd does not
        compute) with words in its error and nothing undefined."""
        args = (cmd, path) if cmd != "pack" else (cmd, path, "-o", self.path("out.mldef"))
        r = run(*args, timeout=120)
        self.assertEqual(r.returncode, code, f"{cmd}: {r.stderr}")
        self.assertNotIn("runtime error", r.stderr)
        self.assertNotIn("Sanitizer", r.stderr)
        self.assertIn(path, r.stderr)
        self.assertIn(words, r.stderr)
        self.assertFalse(os.path.exists(self.path("out.mldef")))


class Onnx(Base):
    def setUp(self):
        super().setUp()
        self.onnx = tg.need_onnx()
        from onnx import TensorProto, helper
        self.h, self.TP = helper, TensorProto

    def model(self, nodes, inits, ins, outs, name="m.onnx"):
        h = self.h
        g = h.make_graph(nodes, "g", ins, outs, initializer=inits)
        m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
        p = self.path(name)
        self.onnx.save(m, p)
        return p

    def vi(self, name, shape):
        return self.h.make_tensor_value_info(name, self.TP.FLOAT, shape)

    def test_the_224_byte_file_is_refused(self):
        p = self.path("fuzz.onnx")
        with open(p, "wb") as f:
            f.write(base64.b64decode(GEMM_224))
        self.assertEqual(os.path.getsize(p), 224)
        for cmd in ("verify", "pack"):
            self.refused(cmd, p, "without a mapping in ckptd's operation vocabulary: 'Rmshape'",
                         code=4)
        self.assertEqual(run("inspect", p).returncode, 0)  # its tensors are readable

    def test_node_without_its_inputs_is_refused_before_mapping(self):
        h = self.h
        w = h.make_tensor("w", self.TP.FLOAT, [2, 2], np.ones(4, np.float32))
        cases = {
            "Gemm": (h.make_node("Gemm", [], ["y"], name="g"), "0 inputs, the op takes 2 to 3"),
            "MatMul": (h.make_node("MatMul", ["x"], ["y"], name="g"), "1 inputs, the op takes 2"),
            "Conv": (h.make_node("Conv", ["x", "", "w"], ["y"], name="g"),
                     "required input 1 is missing"),
            "Relu": (h.make_node("Relu", ["x"], [], name="g"), "0 outputs, the op gives 1"),
            "Shape": (h.make_node("Shape", [], ["y"], name="g"), "0 inputs, the op takes 1"),
        }
        for op, (node, words) in cases.items():
            with self.subTest(op=op):
                p = self.model([node], [w], [self.vi("x", [2, 2])], [self.vi("y", [2, 2])],
                               name=op + ".onnx")
                for cmd in ("verify", "pack"):
                    self.refused(cmd, p, f"node 'g' ({op}): {words}")

    def test_shape_arithmetic_near_int64_max_is_refused(self):
        """UBSan found signed overflows in Reshape's folding (dims near 2^62)."""
        h = self.h
        big = 1 << 62
        shape = h.make_tensor("s", self.TP.INT64, [2], [big, -1])
        reshape = h.make_node("Reshape", ["x", "s"], ["y"], name="r")
        p = self.model([reshape], [shape], [self.vi("x", [big, big])], [self.vi("y", None)],
                       name="reshape.onnx")
        for cmd in ("verify", "pack"):
            self.refused(cmd, p, "")
        # a flatten of a tensor with no element but huge dims
        w = h.make_tensor("w", self.TP.FLOAT, [0, big, big], [])
        flat = h.make_node("Flatten", ["w"], ["y"], name="f", axis=2)
        p = self.model([flat], [w], [], [self.vi("y", None)], name="flatten.onnx")
        for cmd in ("verify", "pack"):
            self.refused(cmd, p, "")
        # a convolution whose pads overflow the output extent
        k = h.make_tensor("k", self.TP.FLOAT, [1, 1, 1, 1], [1.0])
        conv = h.make_node("Conv", ["x", "k"], ["y"], name="c",
                           pads=[big, big, big, big], dilations=[big, big])
        p = self.model([conv], [k], [self.vi("x", [1, 1, 4, 4])], [self.vi("y", None)],
                       name="conv.onnx")
        self.refused("verify", p, "")

    def test_slice_with_a_step_near_int64_max(self):
        """fuzz_graph: the engine's slice multiplied a file's step by a
        stride (216735916767641857 * 75 overflowed); a step past the axis
        takes one element, as numpy and ONNX say."""
        h = self.h
        consts = [h.make_tensor(n, self.TP.INT64, [1], [v]) for n, v in
                  (("st", 1), ("en", 1 << 62), ("ax", 1), ("sp", 216735916767641857))]
        sl = h.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"], name="s")
        p = self.model([sl], consts, [self.vi("x", [2, 75])], [self.vi("y", [2, 1])])
        x = np.arange(150, dtype=np.float32).reshape(2, 75)
        np.save(self.path("x.npy"), x)
        np.save(self.path("y.npy"), x[:, 1::216735916767641857])
        r = run("verify", p, "--inputs", self.path("x.npy"), "--expected", self.path("y.npy"),
                timeout=120)
        self.assertNotIn("runtime error", r.stderr)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_pad_near_int64_max_is_refused(self):
        """fuzz_graph (a CI run): the shape rule of pad added a file's two
        paddings before bounding them (48 + INT64_MAX overflowed); each
        padding and the padded axis are bounded first. A padding of 2^40
        less than the limit but an axis past it is refused the same way."""
        h = self.h
        for pads in ([0, 9223372036854775807, 0, 0], [0, 1 << 40, 0, 1]):
            with self.subTest(pads=pads):
                c = h.make_tensor("pads", self.TP.INT64, [4], pads)
                pad = h.make_node("Pad", ["x", "pads"], ["y"], name="p")
                p = self.model([pad], [c], [self.vi("x", [2, 48])], [self.vi("y", None)])
                self.refused("verify", p, "padding on axis 1 makes it too large")

    def test_a_recurrent_node_with_no_outputs(self):
        """fuzz_onnx (600 s after the merges): an RNN with no outputs (ONNX
        makes all three optional) had its output shape written through a
        null pointer. A node with no outputs gets no shape; it computes
        nothing anyone reads, and the graph's own output is right."""
        h = self.h
        w = h.make_tensor("W", self.TP.FLOAT, [1, 4, 3], np.ones(12, np.float32))
        r = h.make_tensor("R", self.TP.FLOAT, [1, 4, 4], np.ones(16, np.float32))
        rnn = h.make_node("RNN", ["x", "W", "R"], [], name="rnn", hidden_size=4)
        relu = h.make_node("Relu", ["x"], ["y"], name="relu")
        p = self.model([rnn, relu], [w, r], [self.vi("x", [2, 1, 3])], [self.vi("y", [2, 1, 3])])
        x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 1, 3)
        np.save(self.path("x.npy"), x)
        np.save(self.path("y.npy"), np.maximum(x, 0))
        v = run("verify", p, "--inputs", self.path("x.npy"), "--expected", self.path("y.npy"),
                timeout=120)
        self.assertEqual(v.returncode, 0, v.stderr)
        self.assertNotIn("runtime error", v.stderr)

    def test_conv_with_a_padding_near_2_to_the_62(self):
        """fuzz_graph: the engine's conv2d pointed a row pointer a padding's
        width before the row (2^61 floats: undefined even unread); every
        value read is inside the image, the rest is padding. A stride of 2^62
        keeps the output at 2 columns: both are padding, so all zeros."""
        h = self.h
        w = h.make_tensor("w", self.TP.FLOAT, [1, 1, 1, 1], [1.0])
        conv = h.make_node("Conv", ["x", "w"], ["y"], name="c", kernel_shape=[1, 1],
                           pads=[0, 1 << 61, 0, 1 << 61], strides=[1, 1 << 62])
        p = self.model([conv], [w], [self.vi("x", [1, 1, 4, 4])], [self.vi("y", [1, 1, 4, 2])])
        x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4) + 1
        np.save(self.path("x.npy"), x)
        np.save(self.path("y.npy"), np.zeros((1, 1, 4, 2), np.float32))
        r = run("verify", p, "--inputs", self.path("x.npy"), "--expected", self.path("y.npy"),
                timeout=120)
        self.assertNotIn("runtime error", r.stderr)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_average_pool_with_kernels_near_2_to_the_61(self):
        """fuzz_graph: the average pool's divisor, the padded window's area,
        multiplied two kernel extents near 2^61 (signed overflow). A 2^61
        square kernel padded by 2^61 - 2 on each side and a stride of 2^62
        has one output: the 2x2 corner of the input, divided by the area of
        the window inside the input (4) or, with count_include_pad, by the
        padded window's (2^61 + 2)^2."""
        h = self.h
        K, P = 1 << 61, (1 << 61) - 2
        x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4) + 1
        corner = float(x[0, 0, :2, :2].sum())
        np.save(self.path("x.npy"), x)
        for include, want in ((0, corner / 4), (1, corner / float(K + 2) ** 2)):
            with self.subTest(count_include_pad=include):
                pool = h.make_node("AveragePool", ["x"], ["y"], name="a", kernel_shape=[K, K],
                                   pads=[P, P, P, P], strides=[1 << 62, 1 << 62],
                                   count_include_pad=include)
                p = self.model([pool], [], [self.vi("x", [1, 1, 4, 4])],
                               [self.vi("y", [1, 1, 1, 1])])
                np.save(self.path("y.npy"), np.full((1, 1, 1, 1), want, np.float32))
                r = run("verify", p, "--inputs", self.path("x.npy"), "--expected",
                        self.path("y.npy"), timeout=120)
                self.assertNotIn("runtime error", r.stderr)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_global_pool_of_a_5d_input(self):
        """fuzz_graph: a global pool of an NCDHW input wrote N*C*D values
        into an output of N*C (a heap overflow): every axis from 2 on is
        pooled, as ONNX says."""
        h = self.h
        p = self.model([h.make_node("GlobalAveragePool", ["x"], ["y"], name="g")], [],
                       [self.vi("x", [1, 2, 3, 4, 5])], [self.vi("y", [1, 2, 1, 1, 1])])
        x = np.random.default_rng(5).standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
        np.save(self.path("x.npy"), x)
        np.save(self.path("y.npy"), x.mean(axis=(2, 3, 4), keepdims=True))
        r = run("verify", p, "--inputs", self.path("x.npy"), "--expected", self.path("y.npy"),
                timeout=120)
        self.assertNotIn("Sanitizer", r.stderr)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_matmul_broadcasting_an_empty_batch(self):
        """fuzz_graph: a batch dim of 0 against 1 broadcast to 1 in the
        matmul kernel (to 0 in the shape rule, as numpy): one product written
        into an empty output, a heap overflow."""
        h = self.h
        w = h.make_tensor("w", self.TP.FLOAT, [1, 3, 4], np.ones(12, np.float32))
        p = self.model([h.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [w],
                       [self.vi("x", [0, 2, 3])], [self.vi("y", [0, 2, 4])])
        np.save(self.path("x.npy"), np.zeros((0, 2, 3), np.float32))
        np.save(self.path("y.npy"), np.zeros((0, 2, 4), np.float32))
        r = run("verify", p, "--inputs", self.path("x.npy"), "--expected", self.path("y.npy"),
                timeout=120)
        self.assertNotIn("Sanitizer", r.stderr)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_constant_of_shape_of_a_value_past_int64(self):
        """fuzz_graph: a float ConstantOfShape of -1.6e35 over a computed
        shape: the engine's plan (infer/shapeval.c) and the SameDiff writer's
        fill (writers/sdlower.c) each converted the value to an int64 (past
        its range: undefined; clang's UBSan shows it, the fuzz build has it).
        Both forms give the value, as float32, at two batch sizes."""
        h = self.h
        v = h.make_tensor("v", self.TP.FLOAT, [1], np.array([-1.6e35], np.float32))
        p = self.model([h.make_node("Shape", ["x"], ["s"], name="sh"),
                        h.make_node("ConstantOfShape", ["s"], ["c"], name="fill", value=v),
                        h.make_node("Add", ["x", "c"], ["y"], name="add")], [],
                       [self.vi("x", ["N", 3])], [self.vi("y", ["N", 3])])
        sd = self.path("m.zip")
        r = run("pack", "--format", "samediff", p, "-o", sd, "--tag", "t", timeout=120)
        self.assertNotIn("runtime error", r.stderr)
        self.assertEqual(r.returncode, 0, r.stderr)
        for n in (1, 4):
            x = np.ones((n, 3), np.float32)
            np.save(self.path("x.npy"), x)
            np.save(self.path("y.npy"), x + np.float32(-1.6e35))
            for model in (p, sd):
                r = run("verify", model, "--inputs", self.path("x.npy"), "--expected",
                        self.path("y.npy"), timeout=120)
                self.assertNotIn("runtime error", r.stderr)
                self.assertEqual(r.returncode, 0, model + r.stderr)

    def test_dropout_in_training_mode_is_refused_not_answered(self):
        """ONNX's test_training_dropout: identity there would be a wrong answer."""
        h = self.h
        t = h.make_tensor("t", self.TP.BOOL, [], [True])
        r = h.make_tensor("r", self.TP.FLOAT, [], [0.5])
        d = h.make_node("Dropout", ["x", "r", "t"], ["y"], name="d")
        p = self.model([d], [r, t], [self.vi("x", [2, 2])], [self.vi("y", [2, 2])])
        self.refused("verify", p, "node 'd' (Dropout): training_mode is true", code=4)

    def test_integer_arithmetic_is_refused_not_computed_in_float(self):
        """ONNX's test_div_uint8: 7/2 is 3 in uint8; computed in float32 it
        was 3.5, a wrong answer where a refusal was due. Now the integer
        kernels compute it (3); an integer op they do not take (MatMul) is
        still refused. A Cast to float first is computed as before."""
        h = self.h
        ins = [h.make_tensor_value_info(n, self.TP.UINT8, [3]) for n in ("a", "b")]
        div = h.make_node("Div", ["a", "b"], ["y"], name="d")
        p = self.model([div], [], ins, [h.make_tensor_value_info("y", self.TP.UINT8, [3])])
        np.save(self.path("a.npy"), np.array([7, 9, 200], np.uint8))
        np.save(self.path("b.npy"), np.array([2, 4, 3], np.uint8))
        np.save(self.path("y.npy"), np.array([3, 2, 66], np.uint8))
        r = run("verify", p, "--inputs", self.path("a.npy"), self.path("b.npy"),
                "--expected", self.path("y.npy"), timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)  # 7 / 2 is 3
        self.assertIn("ok against=expected", r.stdout)
        pw = h.make_node("MatMul", ["a", "b"], ["y"], name="d")
        p = self.model([pw], [], ins, [h.make_tensor_value_info("y", self.TP.UINT8, [])],
                       name="matmul.onnx")
        r = run("verify", p, "--inputs", self.path("a.npy"), self.path("b.npy"), timeout=120)
        self.assertEqual(r.returncode, 4, r.stdout)  # refused: unsupported, nothing run
        self.assertIn("node 'd' (MatMul): input 'a' is an integer tensor", r.stderr)
        self.assertIn("integer arithmetic is not supported", r.stderr)
        # cast to float first: float division, computed
        casts = [h.make_node("Cast", [n], [n + "f"], name="c" + n, to=self.TP.FLOAT)
                 for n in ("a", "b")]
        div = h.make_node("Div", ["af", "bf"], ["y"], name="d")
        p = self.model(casts + [div], [], ins, [self.vi("y", [3])], name="cast.onnx")
        np.save(self.path("yf.npy"), np.array([3.5, 2.25, 200 / 3], np.float32))
        r = run("verify", p, "--inputs", self.path("a.npy"), self.path("b.npy"),
                "--expected", self.path("yf.npy"), timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)


class Zip(Base):
    def test_a_member_name_with_a_control_byte_is_refused(self):
        """fuzz_zip: a member named '    \x01,st.json' was listed but could not
        be found again by its name; names with control bytes (a terminal's
        escapes, in every message that names them) are refused."""
        import zipfile
        p = self.path("ctl.npz")
        with zipfile.ZipFile(p, "w") as z:
            buf = self.path("a.npy")
            np.save(buf, np.zeros(2, np.float32))
            z.write(buf, "a.npy")
            z.writestr("b\x1b[2J.npy", open(buf, "rb").read())
        self.refused("inspect", p, "has an unsafe name")

    def test_two_members_of_one_name_are_refused(self):
        """fuzz_zip: a listed member that its name does not lead back to. Two
        members of one name mean two things (a reader takes one, Python's
        zipfile the other): refused (libzip's own check names it first; a
        name cut at a NUL byte is ckptd's)."""
        import warnings
        import zipfile
        p = self.path("twice.npz")
        buf = self.path("a.npy")
        with zipfile.ZipFile(p, "w") as z, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zipfile warns of the duplicate, and writes it
            for v in (0, 1):
                np.save(buf, np.full(2, v, np.float32))
                z.write(buf, "a.npy")
        self.refused("inspect", p, "not a readable zip archive: File already exists")


class Config(Base):
    def test_a_size_past_2_to_the_64_is_refused(self):
        """fuzz_yaml: a size whose bytes do not fit 64 bits was cast from a
        double (undefined); it is a config error naming the value."""
        d = self.path("run")
        os.makedirs(d)
        with open(os.path.join(d, "ckptd.yaml"), "w") as f:
            f.write("verify: {max_memory: 1e40GiB}\n")
        r = run("config", d)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("line 1: 'verify.max_memory' must be a size", r.stderr)
        self.assertNotIn("runtime error", r.stderr)


class SameDiff(Base):
    def setUp(self):
        super().setUp()
        import sdfb
        sdfb.sd()  # skips without flatc
        self.sdfb = sdfb

    def test_integer_argument_that_is_nan_is_refused(self):
        """fuzz_samediff: '-nan is outside the range of representable values of
        type long' (integer arguments were parsed through a double)."""
        w = {"W": np.ones((3, 2), np.float32)}
        nodes = [("matmul", "mm", ["input", "W"], ["mm"], {}),
                 ("softmax", "out", ["mm"], ["out"], {"dimension": ("d", [float("nan")])})]
        p = self.path("nan.fb")
        self.sdfb.write_graph(p, w, {"input": [-1, 3]}, nodes, ["out"])
        for cmd in ("verify", "pack"):
            self.refused(cmd, p, "node 'out': argument 'dimension' is not an integer")


class Watcher(Onnx):
    def test_a_hostile_checkpoint_does_not_stop_registration(self):
        """The 224-byte file as a checkpoint in a packing sidecar's folder: it
        fails its pack, the next checkpoint is still registered and packed."""
        d = self.path("run")
        os.makedirs(d)
        with open(os.path.join(d, "ckptd.yaml"), "w") as f:
            f.write("checkpoints: {patterns: ['epoch_{epoch}.onnx']}\npack: {formats: [mldef]}\n")
        with open(os.path.join(d, "epoch_1.onnx"), "wb") as f:
            f.write(base64.b64decode(GEMM_224))
        h = self.h
        w = h.make_tensor("w", self.TP.FLOAT, [2, 2], np.eye(2, dtype=np.float32).ravel())
        good = self.model([h.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [w],
                          [self.vi("x", [1, 2])], [self.vi("y", [1, 2])], name="good.onnx")
        os.replace(good, os.path.join(d, "epoch_2.onnx"))
        for name in ("epoch_1.onnx", "epoch_2.onnx"):  # complete: older than checkpoints.min_age
            os.utime(os.path.join(d, name), (os.path.getmtime(d) - 60,) * 2)
        r = run("scan", d, timeout=120)
        self.assertNotIn("runtime error", r.stderr)
        self.assertNotIn("Sanitizer", r.stderr)
        self.assertIn("epoch_1.onnx", r.stderr)
        meta = open(os.path.join(d, "metadata.yaml")).read()
        self.assertIn("epoch_2.onnx", meta)
        self.assertIn("epoch_1.onnx", meta)  # registered: its bytes are a checkpoint
        packed = os.listdir(os.path.join(d, "data", "deploy")) if os.path.isdir(
            os.path.join(d, "data", "deploy")) else []
        self.assertTrue(any("epoch_2" in p for p in packed), packed)

    def test_a_reader_that_crashes_costs_the_child_not_the_watcher(self):
        """A reader killed by a signal while packing (forced in the test build
        by CKPTD_TEST_FAULT: SIGILL, as a trap gives): the watcher logs
        archive.failed naming the signal, keeps the checkpoint registered, and
        registers the next one."""
        d = self.path("run")
        os.makedirs(os.path.join(d, ".ckptd"))
        with open(os.path.join(d, "ckptd.yaml"), "w") as f:
            f.write("checkpoints: {patterns: ['epoch_{epoch}.onnx']}\npack: {formats: [mldef]}\n"
                    "watch: {settle: 0.2s}\n")
        h = self.h
        w = h.make_tensor("w", self.TP.FLOAT, [2, 2], np.eye(2, dtype=np.float32).ravel())
        good = self.model([h.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [w],
                          [self.vi("x", [1, 2])], [self.vi("y", [1, 2])], name="good.onnx")
        log_path = os.path.join(d, ".ckptd", "watch.log")
        env = dict(os.environ, CKPTD_TEST_FAULT="reader-crash")
        with open(log_path, "wb") as log:
            p = subprocess.Popen([CKPTD, "watch", "-v", d], stdout=subprocess.DEVNULL,
                                 stderr=log, env=env)
        try:
            def log_has(words, n=1, timeout=60):
                end = time.monotonic() + timeout
                while time.monotonic() < end:
                    with open(log_path, errors="replace") as f:
                        text = f.read()
                    if text.count(words) >= n:
                        return
                    self.assertIsNone(p.poll(), text)
                    time.sleep(0.05)
                self.fail(f"no {words!r} x{n} in:\n" + text)
            log_has("watch.started")
            for epoch in (1, 2):
                tmp = os.path.join(d, f".epoch_{epoch}.tmp")
                with open(good, "rb") as src, open(tmp, "wb") as dst:
                    dst.write(src.read())
                os.rename(tmp, os.path.join(d, f"epoch_{epoch}.onnx"))
                log_has(f"archive.failed: checkpoint='epoch_{epoch}.onnx'")
            with open(log_path, errors="replace") as f:
                text = f.read()
            self.assertRegex(text, r"archive\.failed: checkpoint='epoch_2\.onnx' format=mldef: "
                             r"'[^']*epoch_2\.onnx': crashed: the checkpoint's reader was "
                             r"killed by signal 4 \(SIGILL, Illegal instruction\)")
            with open(os.path.join(d, "metadata.yaml")) as f:
                self.assertIn("epoch_2.onnx", f.read())
            self.assertIsNone(p.poll())  # the watcher lives on
        finally:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            p.wait(60)


if __name__ == "__main__":
    unittest.main()
