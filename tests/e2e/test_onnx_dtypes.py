"""Dtypes through the real binary (issue 35): Cast and CastLike between
float32, float16, float64, bool and the integer types, and integer
arithmetic (Add, Sub, Mul, Div, Mod, Neg, Abs, Max, Min, ReduceSum,
ReduceProd, comparisons) on int8/uint8/int32/int64, each against numpy's
own result: the outputs `ckptd verify --save-outputs` writes are compared
here in dtype and exactly. And what must be refused or fail naming the
node: a cast to bfloat16, float64 to float16, NaN or an out-of-range value
cast to an integer, division by zero, integers past 2^24."""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import onnx_conformance  # noqa: E402,F401 (numpy's aliases for onnx 1.12)
from ckptd_test import TmpDirCase, run  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto as TP, helper as h, numpy_helper as nh  # noqa: E402

NP_OF = {TP.FLOAT: np.float32, TP.FLOAT16: np.float16, TP.DOUBLE: np.float64,
         TP.INT8: np.int8, TP.UINT8: np.uint8, TP.INT16: np.int16, TP.INT32: np.int32,
         TP.INT64: np.int64, TP.UINT32: np.uint32, TP.BOOL: np.bool_}
TP_OF = {np.dtype(v): k for k, v in NP_OF.items()}


class Dtypes(TmpDirCase):
    def model(self, name, nodes, inputs, outputs, inits=()):
        """inputs, outputs: [(name, array)] with their numpy dtypes as ONNX's."""
        g = h.make_graph(nodes, name,
                         [h.make_tensor_value_info(n, TP_OF[a.dtype], list(a.shape))
                          for n, a in inputs],
                         [h.make_tensor_value_info(n, TP_OF[a.dtype], list(a.shape))
                          for n, a in outputs],
                         initializer=[nh.from_array(a, n) for n, a in inits])
        p = os.path.join(self.dir, name + ".onnx")
        onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), p)
        return p

    def files(self, tag, arrays):
        paths = []
        for i, (_, a) in enumerate(arrays):
            paths.append(os.path.join(self.dir, "%s%d.npy" % (tag, i)))
            np.save(paths[-1], a)
        return paths

    def verify(self, path, inputs, outputs):
        """ckptd verify says ok, and what it saved is numpy's, dtype and values."""
        out = os.path.join(self.dir, "saved_" + os.path.basename(path))
        os.makedirs(out, exist_ok=True)
        p = run("verify", path, "--inputs", *self.files("in", inputs), "--expected",
                *self.files("want", outputs), "--save-outputs", out, timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("ok against=expected", p.stdout)
        for name, want in outputs:
            got = np.load(os.path.join(out, name + ".npy"))
            self.assertEqual(got.dtype, want.dtype, name)
            self.assertEqual(got.shape, want.shape, name)
            np.testing.assert_array_equal(got, want, err_msg=name)

    def fails(self, path, inputs, code, *want):
        p = run("verify", path, "--inputs", *self.files("bad", inputs), timeout=120)
        self.assertEqual(p.returncode, code, p.stdout + p.stderr)
        for w in want:
            self.assertIn(w, p.stdout + p.stderr)
        self.assertNotIn("Sanitizer", p.stderr)
        self.assertNotIn("ok against", p.stdout)

    def test_casts_match_numpy(self):
        """float32 to float16 rounds to nearest even (halfway cases both
        ways, the subnormals, the largest half), float16 and float64 in and
        out, float to an integer truncates toward zero, integers wrap to a
        narrower type as numpy's astype, anything to bool is != 0."""
        f = np.float32
        # halfway between float16 neighbours: 1 + 2^-11 (to even: 1), 1 + 3 * 2^-11
        # (to even: 1 + 2^-9), a subnormal half's halfway, 65504 and just below 65520
        x = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, -2.5e-8 * 1.5, 3 * 2 ** -25, 65504,
                      65519.99, -0.0, 1e-9, 0.1, -7.75, 1234.5678], f)
        xh = np.random.default_rng(1).standard_normal(12).astype(np.float16)
        xd = np.random.default_rng(2).standard_normal(12) * 100
        xi = np.array([-300, -129, -1, 0, 1, 127, 128, 255, 256, 300, 60001, -60003], np.int64)
        xr = np.array([-3.99, -3.5, -0.5, 0.0, 0.5, 2.5, 3.99, 127.9, -128.9, 1e6], f)
        nodes = [h.make_node("Cast", ["x"], ["x_f16"], to=TP.FLOAT16),
                 h.make_node("Cast", ["x"], ["x_f64"], to=TP.DOUBLE),
                 h.make_node("Cast", ["xh"], ["xh_f32"], to=TP.FLOAT),
                 h.make_node("Cast", ["xh"], ["xh_f64"], to=TP.DOUBLE),
                 h.make_node("Cast", ["xd"], ["xd_f32"], to=TP.FLOAT),
                 h.make_node("Cast", ["xi"], ["xi_u8"], to=TP.UINT8),
                 h.make_node("Cast", ["xi"], ["xi_i8"], to=TP.INT8),
                 h.make_node("Cast", ["xi"], ["xi_i32"], to=TP.INT32),
                 h.make_node("Cast", ["xi"], ["xi_f16"], to=TP.FLOAT16),
                 h.make_node("Cast", ["xi"], ["xi_b"], to=TP.BOOL),
                 h.make_node("Cast", ["xr"], ["xr_i32"], to=TP.INT32),
                 h.make_node("Cast", ["xr"], ["xr_b"], to=TP.BOOL),
                 h.make_node("CastLike", ["x", "like"], ["x_like16"])]
        like = np.zeros(1, np.float16)
        ins = [("x", x), ("xh", xh), ("xd", xd), ("xi", xi), ("xr", xr)]
        with np.errstate(over="ignore"):
            outs = [("x_f16", x.astype(np.float16)), ("x_f64", x.astype(np.float64)),
                    ("xh_f32", xh.astype(f)), ("xh_f64", xh.astype(np.float64)),
                    ("xd_f32", xd.astype(f)), ("xi_u8", xi.astype(np.uint8)),
                    ("xi_i8", xi.astype(np.int8)), ("xi_i32", xi.astype(np.int32)),
                    ("xi_f16", xi.astype(np.float16)), ("xi_b", xi.astype(bool)),
                    ("xr_i32", xr.astype(np.int32)), ("xr_b", xr.astype(bool)),
                    ("x_like16", x.astype(np.float16))]
        # the reference really has the halfway cases both ways
        self.assertEqual(outs[0][1][0], 1.0)
        self.assertEqual(outs[0][1][1], np.float16(1 + 2 ** -9))
        self.assertEqual(outs[0][1][5], np.float16(65504))
        p = self.model("casts", nodes, ins, outs, inits=[("like", like)])
        self.verify(p, ins, outs)

    def test_integer_arithmetic_matches_numpy(self):
        """ONNX's integer arithmetic: Div truncates toward zero, Mod fmod=0
        takes the divisor's sign and fmod=1 the dividend's, uint8 and int8
        wrap, broadcasting; the comparisons of integers give bools."""
        rng = np.random.default_rng(5)
        a32 = rng.integers(-1000, 1000, (3, 4)).astype(np.int32)
        b32 = rng.integers(1, 30, (4,)).astype(np.int32) * rng.choice([-1, 1], 4).astype(np.int32)
        a64 = rng.integers(-4000, 4000, (2, 3, 4)).astype(np.int64)
        b64 = rng.integers(-50, 50, (3, 1)).astype(np.int64)
        b64[b64 == 0] = 7
        u8a = rng.integers(0, 256, (10,)).astype(np.uint8)
        u8b = rng.integers(1, 256, (10,)).astype(np.uint8)
        i8a = np.array([-128, -100, 100, 127, 5, -5], np.int8)
        i8b = np.array([-1, 100, 100, 1, -3, 3], np.int8)
        pb = np.array([-3, -2, 0, 1, 2, 3, 5, 7, 11, 13], np.int64)
        pe = np.array([3, 5, 4, 9, 10, 7, 6, 5, 4, 3], np.int64)
        pf = np.array([1.5, 0.5, 2.5, 3.3, 0.7, 2.2, 1.25, 0.3, 1.9, 2.01], np.float32)
        pbf = np.array([0.5, -1.5, 2.0, 3.0, -2.0, 0.25, -0.5, 1.5, 0.125, 4.0], np.float32)
        pbp = np.abs(pb)  # float powers of a negative base have no real value
        img = rng.integers(0, 256, (1, 1, 4, 6)).astype(np.uint8)
        tbl = (rng.integers(-8, 8, (5, 3)) / 4).astype(np.float32)
        ids = np.array([[4, 0], [2, 2]], np.int64)

        def trunc_div(a, b):
            q = np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64))
            return (np.sign(a.astype(np.int64)) * np.sign(b.astype(np.int64)) * q).astype(a.dtype)
        with np.errstate(over="ignore"):
            refs = [
                ("add32", "Add", ["a32", "b32"], {}, a32 + b32),
                ("sub32", "Sub", ["a32", "b32"], {}, a32 - b32),
                ("mul32", "Mul", ["a32", "b32"], {}, a32 * b32),
                ("div32", "Div", ["a32", "b32"], {}, trunc_div(a32, np.broadcast_to(b32, a32.shape))),
                ("mod32", "Mod", ["a32", "b32"], {}, np.mod(a32, b32)),
                ("fmod32", "Mod", ["a32", "b32"], {"fmod": 1}, np.fmod(a32, b32)),
                ("div64", "Div", ["a64", "b64"], {},
                 trunc_div(a64, np.broadcast_to(b64, a64.shape))),
                ("mod64", "Mod", ["a64", "b64"], {}, np.mod(a64, b64)),
                ("max64", "Max", ["a64", "b64"], {}, np.maximum(a64, b64)),
                ("min64", "Min", ["a64", "b64"], {}, np.minimum(a64, b64)),
                ("neg64", "Neg", ["a64"], {}, -a64),
                ("abs32", "Abs", ["a32"], {}, np.abs(a32)),
                ("addu8", "Add", ["u8a", "u8b"], {}, u8a + u8b),
                ("subu8", "Sub", ["u8a", "u8b"], {}, u8a - u8b),
                ("mulu8", "Mul", ["u8a", "u8b"], {}, u8a * u8b),
                ("divu8", "Div", ["u8a", "u8b"], {}, u8a // u8b),
                ("negi8", "Neg", ["i8a"], {}, -i8a),
                ("absi8", "Abs", ["i8a"], {}, np.abs(i8a)),
                ("muli8", "Mul", ["i8a", "i8b"], {}, i8a * i8b),
                ("sum64", "ReduceSum", ["a64", "ax"], {"keepdims": 0}, a64.sum(axis=1)),
                ("prod32", "ReduceProd", ["b32"], {}, np.prod(b32, keepdims=True)),
                ("eq64", "Equal", ["a64", "b64"], {}, a64 == b64),
                ("lt32", "Less", ["a32", "b32"], {}, a32 < b32),
                # Pow: an integer base to integer powers (exact), to float powers
                # (toward zero, as ONNX's reference casts), a float to integer powers
                ("powii", "Pow", ["pb", "pe"], {}, pb ** pe),
                ("powif", "Pow", ["pbp", "pf"], {}, np.power(pbp, pf).astype(np.int64)),
                ("powfi", "Pow", ["pbf", "pe"], {}, np.power(pbf, pe).astype(np.float32)),
                # a float table gathered by integer ids (a graph input) is float, and
                # so is what is computed from it (BERT's and GPT's embeddings)
                ("gath", "Gather", ["tbl", "ids"], {}, tbl[ids]),
                ("gsub", "Sub", ["gath", "gmean"], {},
                 tbl[ids] - tbl[ids].max(axis=-1, keepdims=True)),
                # max pooling of whole numbers is exact as it is (2 x 2, stride 2)
                ("poolu8", "MaxPool", ["img"], {"kernel_shape": [2, 2], "strides": [2, 2]},
                 img.reshape(1, 1, 2, 2, 3, 2).max(axis=(3, 5))),
            ]
        ins = [("a32", a32), ("b32", b32), ("a64", a64), ("b64", b64), ("u8a", u8a),
               ("u8b", u8b), ("i8a", i8a), ("i8b", i8b), ("pb", pb), ("pe", pe), ("pf", pf),
               ("pbf", pbf), ("pbp", pbp), ("img", img), ("ids", ids)]
        nodes = [h.make_node(op, i, [name], **at) for name, op, i, at, _ in refs]
        nodes.insert(0, h.make_node("ReduceMax", ["gath"], ["gmean"], axes=[-1]))
        nodes.insert(0, nodes.pop([n.output[0] for n in nodes].index("gath")))
        outs = [(name, np.asarray(ref)) for name, _, _, _, ref in refs]
        p = self.model("ints", nodes, ins, outs, inits=[("ax", np.array([1], np.int64)),
                                                        ("tbl", tbl)])
        self.verify(p, ins, outs)

    def test_refusals_and_errors_name_the_node(self):
        f = np.float32
        x = np.array([1.5, -2.0], f)
        # a cast to bfloat16: refused by name before anything runs (exit 4)
        p = self.model("bf16", [h.make_node("Cast", ["x"], ["y"], to=TP.BFLOAT16, name="tobf")],
                       [("x", x)], [("y", x)])
        self.fails(p, [("x", x)], 4, "node 'tobf' (Cast): a cast to bfloat16 is not supported")
        # float64 to float16 would round twice in the engine
        xd = np.array([0.1, 0.2])
        p = self.model("d2h", [h.make_node("Cast", ["x"], ["y"], to=TP.FLOAT16, name="d2h")],
                       [("x", xd)], [("y", xd.astype(np.float16))])
        self.fails(p, [("x", xd)], 4, "node 'd2h' (Cast): a cast of float64 to float16")
        # NaN, an infinity or a value outside the type, cast to an integer
        for bad, want in ((np.nan, "nan has no value in int32"), (np.inf, "inf has no value"),
                          (3e9, "3e+09 is outside int32")):
            xs = np.array([1.0, bad], f)
            p = self.model("toint", [h.make_node("Cast", ["x"], ["y"], to=TP.INT32, name="ci")],
                           [("x", xs)], [("y", np.zeros(2, np.int32))])
            self.fails(p, [("x", xs)], 1, "node 'ci' (cast): " + want)
        # integer division by zero
        a, b = np.array([4, 5], np.int32), np.array([2, 0], np.int32)
        p = self.model("div0", [h.make_node("Div", ["a", "b"], ["y"], name="dz")],
                       [("a", a), ("b", b)], [("y", a)])
        self.fails(p, [("a", a), ("b", b)], 1, "node 'dz' (div): integer division by zero")
        # a result float32 would round: past 2^24
        a = np.array([4096, 5000], np.int64)
        p = self.model("big", [h.make_node("Mul", ["a", "a"], ["y"], name="sq")],
                       [("a", a)], [("y", a)])
        self.fails(p, [("a", a)], 1, "node 'sq' (mul): the integer 16777216 is not under 2^24")
        # an integer input past 2^24: refused naming the file
        a = np.array([1, 1 << 30], np.int64)
        p = self.model("bigin", [h.make_node("Neg", ["a"], ["y"])], [("a", a)], [("y", a)])
        self.fails(p, [("a", a)], 1, "is the integer 1073741824, past 2^24")
        # an archive holds float32 values without their dtypes: a model that
        # needs them (integer kernels, a float16 rounding) is not packed
        a, b = np.array([7, 9], np.int32), np.array([2, 4], np.int32)
        x16 = np.array([0.1, 0.2], np.float16)
        for name, node, ins, why in (
                ("pdiv", h.make_node("Div", ["a", "b"], ["y"], name="dv"), [("a", a), ("b", b)],
                 "node 'dv' (div) computes on integers (int32)"),
                ("p16", h.make_node("Relu", ["a"], ["y"], name="r16"), [("a", x16)],
                 "node 'r16' (relu) rounds to a 16-bit float (float16)")):
            p = self.model(name, [node], ins, [("y", ins[0][1])])
            for fmt in ("mldef", "samediff"):
                q = run("pack", "--format", fmt, p, "-o", os.path.join(self.dir, name + "." + fmt),
                        timeout=120)
                self.assertNotEqual(q.returncode, 0, q.stdout + q.stderr)
                self.assertIn(why, q.stderr)
                self.assertIn("hold float32 values without their dtypes", q.stderr)
                self.assertFalse(os.path.exists(os.path.join(self.dir, name + "." + fmt)))
        # integer ops the engine does not compute exactly: refused by name
        a = np.array([1, 2], np.int32)
        p = self.model("mean", [h.make_node("ReduceMean", ["a"], ["y"], name="rm")],
                       [("a", a)], [("y", a)])
        self.fails(p, [("a", a)], 4, "node 'rm' (ReduceMean): input 'a' is an integer tensor")


if __name__ == "__main__":
    unittest.main()
