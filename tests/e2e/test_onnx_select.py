"""Masks and selection through the real binary (issues 30 and 35): Where,
the comparisons, Not/And/Or/Xor, Expand, Tile, Range, Trilu and CumSum,
written with onnx.helper, verified from ONNX and after `ckptd pack --format
mldef` (which `mldef -i` also calls valid) against numpy's own results;
and the refusals: a computed Range, integers float32 cannot hold, hostile
sizes, SameDiff for an op DL4J has no equivalent of."""
import os
import subprocess
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import torch_gen as tg  # noqa: E402
from ckptd_test import CKPTD, TmpDirCase, run  # noqa: E402

MLDEF = os.path.join(os.path.dirname(CKPTD), "mldef")


class Graphs(TmpDirCase):
    """Helpers: graphs written with onnx.helper, verified or refused."""

    def setUp(self):
        super().setUp()
        self.onnx = tg.need_onnx()
        from onnx import helper, numpy_helper, TensorProto
        self.h, self.nh, self.TP = helper, numpy_helper, TensorProto

    def model(self, name, nodes, inputs, outputs, inits=()):
        """inputs/outputs: [(name, np array)]; all float32. The model's path."""
        h, TP = self.h, self.TP
        g = h.make_graph(nodes, name,
                         [h.make_tensor_value_info(n, TP.FLOAT, list(a.shape)) for n, a in inputs],
                         [h.make_tensor_value_info(n, TP.FLOAT, list(a.shape)) for n, a in outputs],
                         initializer=[self.nh.from_array(a, n) for n, a in inits])
        p = os.path.join(self.dir, name + ".onnx")
        self.onnx.save_model(self.h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), p)
        return p

    def const(self, name, a):
        return self.h.make_node("Constant", [], [name], value=self.nh.from_array(np.asarray(a), name))

    def verify(self, path, inputs, outputs, forms=("onnx", "mldef")):
        """ckptd verify from ONNX and as an .mldef against numpy's outputs."""
        ins, exp = [], []
        for i, (_, a) in enumerate(inputs):
            ins.append(os.path.join(self.dir, f"in{i}.npy"))
            np.save(ins[-1], a.astype(np.float32))
        for i, (_, a) in enumerate(outputs):
            exp.append(os.path.join(self.dir, f"out{i}.npy"))
            np.save(exp[-1], a.astype(np.float32))
        for form in forms:
            target = path
            if form == "mldef":
                target = path[:-5] + ".mldef"
                run("pack", "--format", "mldef", path, "-o", target, check=0, timeout=120)
                q = subprocess.run([MLDEF, "-i", target], capture_output=True, text=True,
                                   timeout=120)
                self.assertEqual(q.returncode, 0, q.stdout + q.stderr)
            p = run("verify", target, "--inputs", *ins, "--expected", *exp, "--atol", "1e-5",
                    timeout=120)
            self.assertEqual(p.returncode, 0, f"{form}: {p.stdout}{p.stderr}")

    def refused(self, path, *want, inputs=()):
        ins = []
        for i, a in enumerate(inputs):
            ins.append(os.path.join(self.dir, f"r{i}.npy"))
            np.save(ins[-1], a)
        p = run("verify", path, *(["--inputs", *ins] if ins else []), timeout=120)
        self.assertEqual(p.returncode, 4, p.stdout + p.stderr)
        for w in want:
            self.assertIn(w, p.stderr)
        self.assertNotIn("Sanitizer", p.stderr)
        return p.stderr



class Select(Graphs):
    def test_masks_and_where_match_numpy(self):
        h, f = self.h, np.float32
        rng = np.random.default_rng(3)
        # small whole numbers, so that equality is common; b broadcasts
        a = rng.integers(-2, 3, (2, 3, 4)).astype(f)
        b = rng.integers(-2, 3, (3, 1)).astype(f)
        nodes = [h.make_node(op, ["a", "b"], [op]) for op in
                 ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")]
        nodes += [h.make_node("Not", ["Greater"], ["ng"]),
                  h.make_node("And", ["Less", "GreaterOrEqual"], ["and"]),
                  h.make_node("Or", ["Equal", "Greater"], ["or"]),
                  h.make_node("Xor", ["LessOrEqual", "GreaterOrEqual"], ["xor"]),
                  # a mask cast to bool stays a mask (torch exports this)
                  h.make_node("Cast", ["xor"], ["xorb"], to=self.TP.BOOL)]
        masks = ("Equal", "Less", "LessOrEqual", "GreaterOrEqual", "ng", "or")
        nodes += [h.make_node("Cast", [m], ["y_" + m], to=self.TP.FLOAT) for m in masks]
        nodes += [self.const("big", np.array(-1e9, f)),
                  h.make_node("Where", ["Greater", "a", "b"], ["y_where"]),
                  h.make_node("Where", ["and", "big", "a"], ["y_fill"]),  # masked fill
                  h.make_node("Where", ["xorb", "a", "big"], ["y_xor"])]

        def ref(a):
            with np.errstate(invalid="ignore"):
                eq, lt, gt, le, ge = a == b, a < b, a > b, a <= b, a >= b
            return [(k, v.astype(f)) for k, v in (
                ("y_Equal", eq), ("y_Less", lt), ("y_LessOrEqual", le),
                ("y_GreaterOrEqual", ge), ("y_ng", ~gt), ("y_or", eq | gt),
                ("y_where", np.where(gt, a, b)), ("y_fill", np.where(lt & ge, f(-1e9), a)),
                ("y_xor", np.where(le ^ ge, a, f(-1e9))))]
        path = self.model("masks", nodes, [("a", a), ("b", b)], ref(a))
        self.verify(path, [("a", a), ("b", b)], ref(a))
        # NaN compares false everywhere (so Not of a comparison with it is
        # true): the mask outputs only, a NaN selected by Where would not
        # compare equal to itself
        a[0, 0, :2] = np.nan
        outs = ref(a)[:len(masks)]
        path = self.model("masks_nan", nodes[:-4], [("a", a), ("b", b)], outs)
        self.verify(path, [("a", a), ("b", b)], outs)

    def test_expand_tile_trilu_cumsum_match_numpy(self):
        h = self.h
        rng = np.random.default_rng(4)
        x = rng.standard_normal((2, 1, 3)).astype(np.float32)
        m = rng.standard_normal((2, 4, 5)).astype(np.float32)
        nodes = [self.const("shape", np.array([3, 2, 4, 3], np.int64)),
                 h.make_node("Expand", ["x", "shape"], ["y_expand"]),
                 self.const("reps", np.array([2, 3, 1], np.int64)),
                 h.make_node("Tile", ["x", "reps"], ["y_tile"])]
        ref = [("y_expand", np.broadcast_to(x, (3, 2, 4, 3))), ("y_tile", np.tile(x, (2, 3, 1)))]
        for k in (-2, 0, 1, 7):
            nodes.append(self.const(f"k{k + 2}", np.array(k, np.int64)))
            nodes.append(h.make_node("Trilu", ["m", f"k{k + 2}"], [f"y_triu{k + 2}"], upper=1))
            nodes.append(h.make_node("Trilu", ["m", f"k{k + 2}"], [f"y_tril{k + 2}"], upper=0))
            ref += [(f"y_triu{k + 2}", np.triu(m, k)), (f"y_tril{k + 2}", np.tril(m, k))]
        nodes.append(h.make_node("Trilu", ["m"], ["y_triu_default"]))  # upper, k = 0
        ref.append(("y_triu_default", np.triu(m)))
        for ax, ex, rv in ((0, 0, 0), (-1, 1, 0), (1, 0, 1), (-2, 1, 1)):
            name = f"y_cumsum_{ax + 2}{ex}{rv}"
            nodes += [self.const(name + "_axis", np.array(ax, np.int32)),
                      h.make_node("CumSum", ["m", name + "_axis"], [name], exclusive=ex,
                                  reverse=rv)]
            v = np.flip(m, ax) if rv else m
            c = np.cumsum(v.astype(np.float64), axis=ax)
            if ex:  # shifted by one along the axis, 0 first
                c = c - v
            ref.append((name, (np.flip(c, ax) if rv else c).astype(np.float32)))
        path = self.model("select", nodes, [("x", x), ("m", m)], ref)
        self.verify(path, [("x", x), ("m", m)], ref)

    def test_folded_range_and_causal_mask(self):
        """GPT's causal mask as torch builds it: Range, Unsqueeze, Greater,
        Where, all of constants; and a Range of floats used as data."""
        h = self.h
        rng = np.random.default_rng(5)
        s = rng.standard_normal((2, 6, 6)).astype(np.float32)
        nodes = [self.const("z", np.array(0, np.int64)), self.const("t", np.array(6, np.int64)),
                 h.make_node("Constant", [], ["one"], value_int=1),
                 h.make_node("Range", ["z", "t", "one"], ["i"]),
                 h.make_node("Unsqueeze", ["i", "ax0"], ["row"]),
                 h.make_node("Unsqueeze", ["i", "ax1"], ["col"]),
                 h.make_node("Greater", ["row", "col"], ["mask"]),
                 self.const("ninf", np.array(-np.inf, np.float32)),
                 h.make_node("Where", ["mask", "ninf", "s"], ["masked"]),
                 h.make_node("Softmax", ["masked"], ["y"], axis=-1),
                 self.const("fs", np.array(0.5, np.float32)),
                 self.const("fl", np.array(-1.0, np.float32)),
                 # value_float / value_int constants (ONNX's function bodies)
                 h.make_node("Constant", [], ["fd"], value_float=-0.25),
                 h.make_node("Range", ["fs", "fl", "fd"], ["fr"]),
                 h.make_node("Add", ["s", "fr"], ["y2"])]
        inits = [("ax0", np.array([0], np.int64))]
        nodes.insert(0, h.make_node("Constant", [], ["ax1"], value_ints=[1]))
        i = np.arange(6)
        w = np.where(i[None, :] > i[:, None], -np.inf, s)
        e = np.exp(w - w.max(-1, keepdims=True))
        y = e / e.sum(-1, keepdims=True)
        fr = np.arange(0.5, -1.0, -0.25, dtype=np.float64)  # 6 values
        path = self.model("causal", nodes, [("s", s)], [("y", y), ("y2", s + fr)], inits)
        self.verify(path, [("s", s)], [("y", y), ("y2", (s + fr).astype(np.float32))])

    def test_refusals_name_the_blocker(self):
        h = self.h
        x = np.ones((2, 3), np.float32)
        # a Range of a tensor's values: its length would depend on data, not shapes
        nodes = [h.make_node("ReduceSum", ["x"], ["n"], keepdims=0),
                 self.const("z", np.array(0, np.float32)), self.const("o", np.array(1, np.float32)),
                 h.make_node("Range", ["z", "n", "o"], ["y"])]
        p = self.model("range_dyn", nodes, [("x", x)], [("y", np.zeros(6, np.float32))])
        self.refused(p, "Range", "depends on tensor values, not only on shapes", inputs=[x])
        # integers past 2^24 a node would take as float32 data
        nodes = [self.const("z", np.array(2 ** 24, np.int64)),
                 self.const("l", np.array(2 ** 24 + 3, np.int64)),
                 self.const("o", np.array(1, np.int64)),
                 h.make_node("Range", ["z", "l", "o"], ["r"]),
                 h.make_node("Unsqueeze", ["r", "ax"], ["ru"]),
                 h.make_node("Where", ["m", "ru", "x"], ["y"])]
        p = self.model("range_big", nodes, [("x", np.ones((2, 3), np.float32))],
                       [("y", x)], [("ax", np.array([0], np.int64)),
                                    ("m", np.array([True, False, True]))])
        self.refused(p, "16777217", "float32", inputs=[x])
        # a Range too long to fold
        nodes = [self.const("z", np.array(0, np.int64)), self.const("l", np.array(10 ** 9, np.int64)),
                 self.const("o", np.array(1, np.int64)), h.make_node("Range", ["z", "l", "o"], ["r"]),
                 h.make_node("Cast", ["r"], ["rf"], to=self.TP.FLOAT),
                 h.make_node("ReduceSum", ["rf"], ["s"], keepdims=1),
                 h.make_node("Add", ["x", "s"], ["y"])]
        p = self.model("range_long", nodes, [("x", x)], [("y", x)])
        self.refused(p, "Range", "too many", inputs=[x])
        # hostile sizes: a Tile and an Expand past any memory, refused by
        # the shape rules, not run
        for op, arg in (("Tile", np.array([1 << 40, 1 << 30], np.int64)),
                        ("Expand", np.array([1 << 40, 1 << 30, 3], np.int64))):
            nodes = [self.const("a", arg), h.make_node(op, ["x", "a"], ["y"])]
            p = self.model("huge_" + op, nodes, [("x", x)], [("y", x)])
            q = run("verify", p, timeout=120)
            self.assertNotEqual(q.returncode, 0, q.stdout + q.stderr)
            self.assertIn(op.lower(), q.stderr.lower())
            self.assertNotIn("Sanitizer", q.stderr)
        # a computed mask cast to int64 and compared with integers: exact
        # (integers are whole float32 numbers under 2^24: issue 35's dtypes),
        # while arithmetic the engine has no integer kernel for is refused
        nodes = [h.make_node("Greater", ["x", "x"], ["g"]),
                 h.make_node("Cast", ["g"], ["gi"], to=self.TP.INT64),
                 h.make_node("ReduceMean", ["gi"], ["y"], name="pw")]
        p = self.model("cast_int", nodes, [("x", x)], [("y", x)])
        self.refused(p, "node 'pw' (ReduceMean): input 'gi' is an integer tensor", inputs=[x])
        g = h.make_graph([h.make_node("Greater", ["a", "b"], ["g"]),
                          h.make_node("Neg", ["x"], ["nx"]),
                          h.make_node("Where", ["g", "x", "nx"], ["y"])], "ints",
                         [h.make_tensor_value_info("x", self.TP.FLOAT, [3]),
                          h.make_tensor_value_info("a", self.TP.INT64, [3])],
                         [h.make_tensor_value_info("y", self.TP.FLOAT, [3])],
                         initializer=[self.nh.from_array(np.array([1, 2, 3], np.int64), "b")])
        p = os.path.join(self.dir, "int_cmp.onnx")
        self.onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), p)
        ins = [os.path.join(self.dir, n) for n in ("ic_x.npy", "ic_a.npy", "ic_y.npy")]
        np.save(ins[0], np.array([1.5, -2, 3], np.float32))
        np.save(ins[1], np.array([2, 2, 2], np.int64))  # > [1, 2, 3]: T F F
        np.save(ins[2], np.array([1.5, 2, -3], np.float32))
        run("verify", p, "--inputs", ins[0], ins[1], "--expected", ins[2], check=0, timeout=120)

    def test_argmax_argmin_gather_elements_match_numpy(self):
        """Indices exact (as float32 whole numbers), ties and NaN as numpy:
        the first (or with select_last_index the last) extreme, a NaN beats
        any number; GatherElements with negative indices; refusals past
        2^24 and for an index out of range."""
        h, f = self.h, np.float32
        rng = np.random.default_rng(6)
        x = rng.integers(-3, 4, (3, 4, 5)).astype(f)  # many ties
        x[1, 2, 3] = np.nan
        x[2, 0, 1] = np.nan
        x[2, 3, 1] = np.nan
        nodes, ref = [], []

        def argext(v, axis, mx, last, keep):
            if last:  # numpy has no select_last: the first of the reversed axis
                r = np.flip(v, axis)
                i = v.shape[axis] - 1 - (np.argmax(r, axis) if mx else np.argmin(r, axis))
            else:
                i = np.argmax(v, axis) if mx else np.argmin(v, axis)
            return np.expand_dims(i, axis) if keep else i
        for op in ("ArgMax", "ArgMin"):
            for axis, keep, last in ((0, 1, 0), (1, 0, 1), (-1, 1, 1), (2, 0, 0)):
                name = f"y_{op}_{axis + 1}{keep}{last}"
                nodes.append(h.make_node(op, ["x"], [name], axis=axis, keepdims=keep,
                                         select_last_index=last))
                ref.append((name, argext(x, axis, op == "ArgMax", last, keep).astype(f)))
        nodes.append(h.make_node("ArgMax", ["x"], ["y_default"]))  # axis 0, keepdims
        ref.append(("y_default", np.argmax(x, 0)[None].astype(f)))
        d = rng.standard_normal((3, 4, 5)).astype(f)
        ix = rng.integers(-4, 4, (3, 2, 5)).astype(np.int64)
        nodes.append(h.make_node("GatherElements", ["d", "ix"], ["y_ge"], axis=1))
        ref.append(("y_ge", np.take_along_axis(d, np.where(ix < 0, ix + 4, ix), 1)))
        g = h.make_graph(nodes, "argext",
                         [h.make_tensor_value_info("x", self.TP.FLOAT, [3, 4, 5]),
                          h.make_tensor_value_info("d", self.TP.FLOAT, [3, 4, 5]),
                          h.make_tensor_value_info("ix", self.TP.INT64, [3, 2, 5])],
                         [h.make_tensor_value_info(k, self.TP.FLOAT, list(v.shape))
                          for k, v in ref])
        p = os.path.join(self.dir, "argext.onnx")
        self.onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), p)
        self.verify(p, [("x", x), ("d", d), ("ix", ix)], ref)
        # an index out of range: an error naming the node, nothing wrong
        bad = ix.copy()
        bad[0, 0, 0] = 4
        ins = []
        for i, a in enumerate((x, d, bad)):
            ins.append(os.path.join(self.dir, f"b{i}.npy"))
            np.save(ins[-1], a)
        q = run("verify", p, "--inputs", *ins, timeout=120)
        self.assertNotEqual(q.returncode, 0, q.stdout + q.stderr)
        self.assertIn("gather_elements", q.stdout + q.stderr)
        self.assertIn("not a whole number in [-4, 4)", q.stdout + q.stderr)
        # an axis past 2^24: its indices would not be exact in float32
        n = (1 << 24) + 1
        nodes = [h.make_node("ArgMax", ["x"], ["y"], axis=1)]
        p = self.model("argmax_big", nodes, [("x", np.zeros((1, n), f))],
                       [("y", np.zeros((1, 1), f))])
        q = run("verify", p, timeout=300)
        self.assertNotEqual(q.returncode, 0, q.stdout + q.stderr)
        self.assertIn("2^24", q.stdout + q.stderr)

    def test_topk_matches_torch_and_onnx_ties(self):
        """TopK with a constant k: torch.topk exported by torch (distinct
        values: torch's own outputs are the reference), then ties and NaN
        against ONNX's rule written out here (the lower index first among
        equal values; a NaN larger than any number), every axis, largest
        and smallest; the refusals: k past the axis, k a graph input."""
        import torch
        h, f = self.h, np.float32
        torch.manual_seed(0)

        class M(torch.nn.Module):
            def forward(self, x):
                v, i = torch.topk(x, 3, dim=1)
                s, j = torch.topk(x, 2, dim=-1, largest=False)
                return v, i.float() * 1.0, s, j.float() * 1.0

        x = torch.randn(2, 5, 4)
        p = os.path.join(self.dir, "topk_torch.onnx")
        torch.onnx.export(M(), x, p, opset_version=13, input_names=["x"],
                          output_names=["v", "i", "s", "j"])
        with torch.no_grad():
            ref = [t.numpy() for t in M()(x)]
        self.verify(p, [("x", x.numpy())], list(zip("visj", ref)), forms=("onnx",))

        def topk(v, k, axis, largest):
            """ONNX's TopK, element by element: a stable sort by value."""
            m = np.moveaxis(v, axis, -1)
            vals = np.empty(m.shape[:-1] + (k,), f)
            idx = np.empty(m.shape[:-1] + (k,), f)
            for pos in np.ndindex(*m.shape[:-1]):
                row = list(m[pos])
                key = (lambda i: (not np.isnan(row[i]), -row[i] if not np.isnan(row[i]) else 0)) \
                    if largest else (lambda i: (np.isnan(row[i]), row[i] if not np.isnan(row[i]) else 0))
                order = sorted(range(len(row)), key=key)[:k]  # sorted() is stable
                vals[pos] = [row[i] for i in order]
                idx[pos] = order
            return np.moveaxis(vals, -1, axis), np.moveaxis(idx, -1, axis)
        rng = np.random.default_rng(9)
        x = rng.integers(-2, 3, (3, 6, 4)).astype(f)  # many ties
        x[0, 1, 2] = np.nan
        x[2, 4, 0] = np.nan
        nodes, ref, inits = [], [], []
        for n, (k, axis, largest) in enumerate(((3, 1, 1), (6, 1, 0), (2, -1, 1), (1, 0, 0),
                                               (0, 2, 1), (4, -2, 1))):
            inits.append((f"k{n}", np.array([k], np.int64)))
            nodes.append(h.make_node("TopK", ["x", f"k{n}"], [f"v{n}", f"i{n}"], axis=axis,
                                     largest=largest))
            v, i = topk(x, k, axis, largest)
            ref += [(f"v{n}", v), (f"i{n}", i)]
        # the values hold the input's NaN: the output checks refuse any NaN,
        # so the NaN cases are compared through their indices only
        outs = [(nm, a) for nm, a in ref if not np.isnan(a).any()]
        self.assertTrue(any(nm.startswith("i") and np.isnan(x).any() for nm, _ in outs))
        tp = self.TP
        g = h.make_graph(nodes, "topk", [h.make_tensor_value_info("x", tp.FLOAT, list(x.shape))],
                         [h.make_tensor_value_info(nm, tp.INT64 if nm[0] == "i" else tp.FLOAT,
                                                   list(a.shape)) for nm, a in outs],
                         initializer=[self.nh.from_array(a, nm) for nm, a in inits])
        p = os.path.join(self.dir, "topk_ties.onnx")
        self.onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), p)
        self.verify(p, [("x", x)], outs)
        # k past the axis: refused naming the node (ONNX's own rule)
        g = h.make_graph([h.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, name="top")],
                         "topk_big", [h.make_tensor_value_info("x", tp.FLOAT, [3, 6, 4])],
                         [h.make_tensor_value_info("v", tp.FLOAT, None),
                          h.make_tensor_value_info("i", tp.INT64, None)],
                         initializer=[self.nh.from_array(np.array([7], np.int64), "k")])
        p = os.path.join(self.dir, "topk_big.onnx")
        self.onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), p)
        q = run("verify", p, timeout=120)
        self.assertEqual(q.returncode, 1, q.stdout + q.stderr)
        self.assertIn("node 'top' (TopK): k 7 is larger than the axis (6 elements)", q.stderr)
        self.assertNotIn("Sanitizer", q.stderr)
        # k given as a graph input: its length would depend on a value
        g = h.make_graph([h.make_node("TopK", ["x", "k"], ["v", "i"], name="top")], "topk_in",
                         [h.make_tensor_value_info("x", tp.FLOAT, [3, 6]),
                          h.make_tensor_value_info("k", tp.INT64, [1])],
                         [h.make_tensor_value_info("v", tp.FLOAT, None),
                          h.make_tensor_value_info("i", tp.INT64, None)])
        p = os.path.join(self.dir, "topk_in.onnx")
        self.onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), p)
        self.refused(p, "node 'top' (TopK): input 'k' is not a constant",
                     inputs=[np.ones((3, 6), f), np.array([2], np.int64)])

    def test_resize_matches_onnx_reference(self):
        """Resize with constant scales or sizes: nearest (every nearest
        mode), linear and cubic (A, exclude_outside), up and down, every
        coordinate mode ckptd takes, against the interpolation ONNX's own
        test cases are generated with (onnx.backend.test.case.node.resize)."""
        import onnx_conformance  # noqa: F401 (numpy's aliases for onnx 1.12's modules)
        from onnx.backend.test.case.node import resize as ref
        h, f = self.h, np.float32
        x = np.random.default_rng(8).standard_normal((1, 2, 4, 5)).astype(f)
        coords = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
        cases = []  # (attrs, scales or None, sizes or None, get_coeffs)
        for cm in coords:
            for nm in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
                for sc in ([1, 1, 2, 1.5], [1, 1, 0.6, 0.8]):
                    cases.append((dict(mode="nearest", coordinate_transformation_mode=cm,
                                       nearest_mode=nm), sc, None,
                                  lambda r, nm=nm: ref.nearest_coeffs(r, mode=nm)))
            for sc, sz in (([1, 1, 1.5, 2], None), (None, [1, 2, 3, 2]), (None, [1, 2, 1, 3])):
                cases.append((dict(mode="linear", coordinate_transformation_mode=cm), sc, sz,
                              ref.linear_coeffs))
            for a, ex in ((-0.75, 0), (-0.5, 1)):
                for sc, sz in (([1, 1, 1.7, 1.3], None), ([1, 1, 0.6, 0.8], None),
                               (None, [1, 2, 7, 3]), (None, [1, 2, 1, 3])):
                    cases.append((dict(mode="cubic", coordinate_transformation_mode=cm,
                                       cubic_coeff_a=a, exclude_outside=ex), sc, sz,
                                  lambda r, a=a: ref.cubic_coeffs(r, A=a)))
        nodes, outs = [], []
        for i, (attrs, sc, sz, coeffs) in enumerate(cases):
            if sc is not None:
                nodes += [self.const(f"s{i}", np.array(sc, f)),
                          h.make_node("Resize", ["x", "", f"s{i}"], [f"y{i}"], **attrs)]
                want = ref.interpolate_nd(x, coeffs, scale_factors=np.array(sc, f),
                                          coordinate_transformation_mode=attrs[
                                              "coordinate_transformation_mode"],
                                          exclude_outside=attrs.get("exclude_outside", 0))
            else:
                nodes += [self.const(f"z{i}", np.array(sz, np.int64)),
                          h.make_node("Resize", ["x", "", "", f"z{i}"], [f"y{i}"], **attrs)]
                want = ref.interpolate_nd(x, coeffs, output_size=sz,
                                          coordinate_transformation_mode=attrs[
                                              "coordinate_transformation_mode"],
                                          exclude_outside=attrs.get("exclude_outside", 0))
            outs.append((f"y{i}", want.astype(f)))
        path = self.model("resize", nodes, [("x", x)], outs)
        self.verify(path, [("x", x)], outs)
        # every axis of a rank-5 input changed, some shrinking and some
        # growing (one pass per axis: infer/kernels_select.c), and a rank-8
        # cubic resize: 4^8 taps per output summed whole took minutes, the
        # passes take 4 per axis (a 307-byte model from fuzz_onnx did this)
        x5 = np.random.default_rng(9).standard_normal((3, 4, 2, 5, 3)).astype(f)
        for mode, coeffs, sc in (("cubic", ref.cubic_coeffs, [0.7, 1.5, 2, 0.4, 1.7]),
                                 ("linear", ref.linear_coeffs, [2, 0.5, 1.5, 0.6, 1])):
            want = ref.interpolate_nd(x5, coeffs, scale_factors=np.array(sc, f),
                                      coordinate_transformation_mode="half_pixel")
            p = self.model("resize5" + mode, [self.const("s", np.array(sc, f)),
                                              h.make_node("Resize", ["x", "", "s"], ["y"],
                                                          mode=mode)],
                           [("x", x5)], [("y", want.astype(f))])
            self.verify(p, [("x", x5)], [("y", want.astype(f))], forms=("onnx",))
        x8 = np.random.default_rng(10).standard_normal((2,) * 8).astype(f)
        p = self.model("resize8", [self.const("s", np.full(8, 2, f)),
                                   h.make_node("Resize", ["x", "", "s"], ["y"], mode="cubic")],
                       [("x", x8)], [("y", np.zeros((4,) * 8, f))])
        q = run("verify", p, "--timeout", "60s", timeout=120)  # as the config writes it
        self.assertEqual(q.returncode, 0, q.stdout + q.stderr)
        # what ckptd does not compute is refused by name
        for attrs, want in ((dict(coordinate_transformation_mode="tf_crop_and_resize"),
                             "tf_crop_and_resize"), (dict(mode="area"), "'area'")):
            p = self.model("resize_no", [self.const("s", np.array([1, 1, 2, 2], f)),
                                         h.make_node("Resize", ["x", "", "s"], ["y"], **attrs)],
                           [("x", x)], [("y", np.zeros((1, 2, 8, 10), f))])
            self.refused(p, "Resize", want, inputs=[x])
        # hostile scales: past any memory, refused by the shape rules
        p = self.model("resize_huge", [self.const("s", np.array([1, 1, 1e6, 1e6], f)),
                                       h.make_node("Resize", ["x", "", "s"], ["y"])],
                       [("x", x)], [("y", np.zeros((1, 2, 8, 10), f))])
        q = run("verify", p, timeout=120)
        self.assertNotEqual(q.returncode, 0, q.stdout + q.stderr)
        self.assertIn("resize", q.stderr.lower())
        self.assertNotIn("Sanitizer", q.stderr)
        # scales as a graph input: read by the plan from the bound input (issue 35)
        g = h.make_graph([h.make_node("Resize", ["x", "", "s"], ["y"])], "dyn",
                         [h.make_tensor_value_info("x", self.TP.FLOAT, [1, 2, 4, 5]),
                          h.make_tensor_value_info("s", self.TP.FLOAT, [4])],
                         [h.make_tensor_value_info("y", self.TP.FLOAT, [1, 2, 8, 10])])
        p = os.path.join(self.dir, "resize_dyn.onnx")
        self.onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), p)
        sc = np.array([1, 1, 2, 2], f)
        want = ref.interpolate_nd(x, lambda r: ref.nearest_coeffs(r), scale_factors=sc,
                                  coordinate_transformation_mode="half_pixel")
        self.verify(p, [("x", x), ("s", sc)], [("y", want.astype(f))], forms=("onnx",))

    def test_einsum_matches_numpy(self):
        """The contractions exporters write (attention's bhqd,bhkd->bhqk,
        batched and plain matmul, transposes, sums, a full contraction),
        lowered to transpose, reduce_sum, reshape and matmul, against
        numpy.einsum; an ellipsis, a diagonal and three operands refused by
        name."""
        h, f = self.h, np.float32
        rng = np.random.default_rng(9)
        dims = dict(b=2, h=3, q=4, k=5, d=6, i=3, j=4, l=2, m=5)
        cases = ["ij->ji", "ij->i", "ij", "i,i", "bij,bjk->bik", "ij,jk", "bhqd,bhkd->bhqk",
                 "bhqk,bhkd->bhqd", "ijk,kl->ijl", "ij,kj->ik", "ij,jk->k", "ik,jk->",
                 "bi,bj->bij", "ij,ij->ij", "mi,jm->ji"]
        dims.update(dict(i=3, j=4))
        nodes, ins, outs, n = [], [], [], 0
        for eq in cases:
            terms = eq.split("->")[0].split(",")
            names = []
            for t in terms:
                shape = [dims.get(ch, 3) for ch in t]
                name = f"x{n}"
                n += 1
                ins.append((name, rng.standard_normal(shape).astype(f)))
                names.append(name)
            y = f"y{len(outs)}"
            nodes.append(h.make_node("Einsum", names, [y], equation=eq.replace(",", ", ")))
            want = np.einsum(eq, *[a.astype(np.float64) for nm, a in ins if nm in names])
            outs.append((y, np.asarray(want, f)))
        path = self.model("einsum", nodes, ins, outs)
        self.verify(path, ins, outs)
        for eq, why in (("...ii->...i", "ellipsis"), ("ii->i", "diagonal"),
                        ("ij,jk,kl->il", "more than two")):
            terms = eq.split("->")[0].split(",")
            xs = [(f"e{i}", np.ones((3, 3) if "." not in t else (2, 3, 3), f))
                  for i, t in enumerate(terms)]
            p = self.model("einsum_no", [h.make_node("Einsum", [a for a, _ in xs], ["y"],
                                                     equation=eq)],
                           xs, [("y", np.ones((3,), f))])
            self.refused(p, "Einsum", why, inputs=[a for _, a in xs])

    def test_samediff_refuses_comparison_by_name(self):
        """A mask computed at run time: the canonical comparison gives a
        float32 0/1 mask, DL4J's comparisons bool arrays, so the SameDiff
        writer names the comparison instead of writing what DL4J would not
        run (the where after it is lowered, docs/samediff.md)."""
        h = self.h
        x = np.ones((2, 3), np.float32)
        nodes = [h.make_node("Greater", ["x", "z"], ["g"]),
                 h.make_node("Where", ["g", "x", "z"], ["y"])]
        p = self.model("where_sd", nodes, [("x", x)], [("y", x)],
                       [("z", np.zeros((1, 3), np.float32))])
        q = run("pack", "--format", "samediff", p, "-o", os.path.join(self.dir, "w.zip"),
                "--tag", "t", timeout=120)
        self.assertNotEqual(q.returncode, 0, q.stdout + q.stderr)
        self.assertIn("'greater' has no DL4J equivalent", q.stderr)


class DynamicShapes(Graphs):
    """Shape values (docs/model.md): graphs with a dynamic batch whose shape
    arithmetic (Shape, Gather, Unsqueeze, Concat, Div, Range, ConstantOfShape,
    a computed Reshape, Expand and Slice) the engine evaluates per run,
    verified at two batch sizes from ONNX and as an .mldef against numpy; and
    hostile computed shapes refused naming the node."""

    def dyn_model(self, name, nodes, outputs, inits=()):
        """One input x ["N", 6] (the batch unknown); outputs [(name, rank)]."""
        h, TP = self.h, self.TP
        g = h.make_graph(nodes, name, [h.make_tensor_value_info("x", TP.FLOAT, ["N", 6])],
                         [h.make_tensor_value_info(n, TP.FLOAT, ["N"] + [None] * (r - 1))
                          for n, r in outputs],
                         initializer=[self.nh.from_array(a, n) for n, a in inits])
        p = os.path.join(self.dir, name + ".onnx")
        self.onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), p)
        return p

    def batch_of(self):
        """Nodes computing n (a scalar) and nv ([n]) from x's shape."""
        h = self.h
        return [h.make_node("Shape", ["x"], ["s"]), self.const("i0", np.array(0, np.int64)),
                h.make_node("Gather", ["s", "i0"], ["n"], axis=0),
                self.const("ax0", np.array([0], np.int64)),
                h.make_node("Unsqueeze", ["n", "ax0"], ["nv"])]

    def test_shape_arithmetic_follows_the_input(self):
        h = self.h
        nodes = self.batch_of() + [
            # y = x.reshape(N, 3, 2) + arange(N)[:, None, None] * (N // 2)
            self.const("c32", np.array([3, 2], np.int64)),
            h.make_node("Concat", ["nv", "c32"], ["shape"], axis=0),
            h.make_node("Reshape", ["x", "shape"], ["xr"]),
            self.const("zero", np.array(0, np.int64)), self.const("one", np.array(1, np.int64)),
            self.const("two", np.array(2, np.int64)),
            h.make_node("Range", ["zero", "n", "one"], ["pos"]),
            h.make_node("Div", ["n", "two"], ["half"]),
            h.make_node("Mul", ["pos", "half"], ["posh"]),
            h.make_node("Cast", ["posh"], ["posf"], to=self.TP.FLOAT),
            self.const("ax12", np.array([1, 2], np.int64)),
            h.make_node("Unsqueeze", ["posf", "ax12"], ["pos3"]),
            h.make_node("Add", ["xr", "pos3"], ["y"]),
            # z = x[:, 0:N] (a computed end), w = full((N, 2), 0.5) expanded to [N, 3, 2]
            self.const("st", np.array([0], np.int64)), self.const("ax1", np.array([1], np.int64)),
            h.make_node("Slice", ["x", "st", "nv", "ax1"], ["z"]),
            self.const("c2", np.array([2], np.int64)),
            h.make_node("Concat", ["nv", "c2"], ["s2"], axis=0),
            h.make_node("ConstantOfShape", ["s2"], ["half2"],
                        value=self.nh.from_array(np.array([0.5], np.float32), "v")),
            h.make_node("Unsqueeze", ["half2", "ax1"], ["half3"]),
            h.make_node("Expand", ["half3", "shape"], ["w"])]
        p = self.dyn_model("dyn", nodes, [("y", 3), ("z", 2), ("w", 3)])
        for b in (1, 4):
            x = np.random.default_rng(b).standard_normal((b, 6)).astype(np.float32)
            y = x.reshape(b, 3, 2) + (np.arange(b) * (b // 2))[:, None, None]
            z = x[:, 0:b]
            w = np.full((b, 3, 2), 0.5, np.float32)
            with self.subTest(batch=b):
                self.verify(p, [("x", x)], [("y", y), ("z", z), ("w", w)])
        # the archive keeps the batch symbolic ([-1, 6]) and its reader checks the rest
        self.failed(p[:-5] + ".mldef", 2, "input 'x': shape [2, 5] does not match the model's",
                    width=5)

    def test_parameters_given_as_inputs(self):
        """A Reshape's shape, a Trilu's k, a Resize's sizes and scales as
        graph inputs (ONNX's conformance cases write them so): bound by the
        run, read by the plan; from ONNX and as an .mldef against numpy."""
        h, TP = self.h, self.TP
        nodes = [h.make_node("Reshape", ["x", "shape"], ["r"]),
                 h.make_node("Trilu", ["r", "k"], ["t"], upper=1),
                 h.make_node("Resize", ["t", "", "", "sizes"], ["y"], mode="nearest",
                             coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
                 h.make_node("Resize", ["t", "", "scales"], ["z"], mode="nearest",
                             coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
        g = h.make_graph(nodes, "params", [
            h.make_tensor_value_info("x", TP.FLOAT, [2, 6]),
            h.make_tensor_value_info("shape", TP.INT64, [3]),
            h.make_tensor_value_info("k", TP.INT64, []),
            h.make_tensor_value_info("sizes", TP.INT64, [3]),
            h.make_tensor_value_info("scales", TP.FLOAT, [3])],
            [h.make_tensor_value_info("y", TP.FLOAT, None),
             h.make_tensor_value_info("z", TP.FLOAT, None)])
        p = os.path.join(self.dir, "params.onnx")
        self.onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), p)
        x = np.arange(12, dtype=np.float32).reshape(2, 6) - 5
        for shape, k in (([2, 3, 2], 0), ([1, 3, 4], -1)):
            t = np.triu(x.reshape(shape), k)
            sizes = np.array([shape[0], shape[1] * 2, shape[2]], np.int64)
            y = t.repeat(2, axis=1)  # nearest, floor, asymmetric: each row twice
            z = t[:, :, [0] * 3 + [1] * 3] if shape[2] == 2 else t.repeat(1, axis=2)
            scales = np.array([1, 1, 3 if shape[2] == 2 else 1], np.float32)
            ins = [("x", x), ("shape", np.array(shape, np.int64)), ("k", np.array(k, np.int64)),
                   ("sizes", sizes), ("scales", scales)]
            files = []
            for i, (_, a) in enumerate(ins):
                files.append(os.path.join(self.dir, f"p{i}.npy"))
                np.save(files[-1], a)
            exp = []
            for i, a in enumerate((y, z)):
                exp.append(os.path.join(self.dir, f"e{i}.npy"))
                np.save(exp[-1], a.astype(np.float32))
            for target in (p, p[:-5] + ".mldef"):
                if target.endswith(".mldef"):
                    run("pack", "--format", "mldef", p, "-o", target, check=0, timeout=120)
                q = run("verify", target, "--inputs", *files, "--expected", *exp, timeout=120)
                with self.subTest(shape=shape, target=target):
                    self.assertEqual(q.returncode, 0, q.stdout + q.stderr)

    def failed(self, path, b, *want, width=6):
        x = np.ones((b, width), np.float32)
        xi = os.path.join(self.dir, "x.npy")
        np.save(xi, x)
        p = run("verify", path, "--inputs", xi, timeout=120)
        self.assertNotEqual(p.returncode, 0, p.stdout + p.stderr)
        for w in want:
            self.assertIn(w, p.stderr)
        self.assertNotIn("Sanitizer", p.stderr)
        return p

    def reshape_to(self, name, tail, op="Reshape"):
        h = self.h
        nodes = self.batch_of() + [self.const("tail", np.array(tail, np.int64)),
                                   h.make_node("Concat", ["nv", "tail"], ["shape"], axis=0),
                                   h.make_node(op, ["x", "shape"], ["y"], name="computed")]
        return self.dyn_model(name, nodes, [("y", 1 + len(tail))])

    def test_hostile_computed_shapes_name_the_node(self):
        h = self.h
        # a negative computed dim; a product that does not match; a huge dim
        # (2^41: refused by the shape rules, nothing allocated)
        self.failed(self.reshape_to("neg", [-5]), 2, "node 'computed' (reshape)", "-5")
        self.failed(self.reshape_to("mismatch", [4]), 2, "node 'computed' (reshape)",
                    "has 12 elements")
        for op, name, ins in (("Reshape", "reshape", ["x", "shape"]),
                              ("ConstantOfShape", "constant_of_shape", ["shape"])):
            nodes = self.batch_of() + [
                self.const("big", np.array([1 << 41], np.int64)),
                h.make_node("Mul", ["nv", "big"], ["huge"]),  # known only at run time
                h.make_node("Concat", ["nv", "huge"], ["shape"], axis=0),
                h.make_node(op, ins, ["y"], name="computed")]
            self.failed(self.dyn_model("huge" + name, nodes, [("y", 2)]), 2,
                        f"node 'computed' ({name})", "too large")
        # a shape computed from the tensor's values, not its shape
        nodes = [h.make_node("ArgMax", ["x"], ["am"], axis=1, keepdims=0),
                 h.make_node("Reshape", ["x", "am"], ["y"], name="computed")]
        self.failed(self.dyn_model("data", nodes, [("y", 2)]), 2, "node 'computed' (Reshape)",
                    "depends on tensor values")
        # a Range of a shape divided by zero, an index out of the shape's range
        nodes = self.batch_of() + [self.const("zero", np.array(0, np.int64)),
                                   h.make_node("Div", ["n", "zero"], ["q"], name="div0"),
                                   self.const("one", np.array(1, np.int64)),
                                   h.make_node("Range", ["zero", "q", "one"], ["r"]),
                                   h.make_node("Cast", ["r"], ["y"], to=self.TP.FLOAT)]
        self.failed(self.dyn_model("div0", nodes, [("y", 1)]), 2, "node 'div0' (div)",
                    "division by zero")
        nodes = [h.make_node("Shape", ["x"], ["s"]), self.const("i7", np.array(7, np.int64)),
                 h.make_node("Gather", ["s", "i7"], ["g"], name="g7"),
                 h.make_node("Cast", ["g"], ["y"], to=self.TP.FLOAT)]
        self.failed(self.dyn_model("gather7", nodes, [("y", 1)]), 2, "node 'g7' (Gather)",
                    "out of range")


if __name__ == "__main__":
    unittest.main()
