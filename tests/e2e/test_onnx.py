"""ONNX models through ckptd inspect and ckptd verify: torch.onnx.export
(python3-torch, opset 13) of an MLP, a CNN with batch norm, a residual block
and a transformer encoder layer; models built with onnx.helper for typed
fields, external data and hostile cases. Expected values come from onnx.load
/ numpy_helper and from torch's own outputs."""
import json
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import torch_gen as tg  # noqa: E402
from ckptd_test import TmpDirCase, run  # noqa: E402

MODELS = ("mlp", "cnn", "residual", "transformer")


def inspect(path, *extra):
    p = run("inspect", "--json", "--values", "1000000", path, *extra)
    if p.returncode != 0:
        raise AssertionError(f"inspect {path}: exit {p.returncode}\n{p.stderr}")
    return json.loads(p.stdout)


class Base(TmpDirCase):
    def setUp(self):
        super().setUp()
        self.onnx = tg.need_onnx()
        from onnx import helper, numpy_helper, TensorProto
        self.helper, self.nh, self.TP = helper, numpy_helper, TensorProto

    def path(self, name):
        return os.path.join(self.dir, name)

    def export(self, name):
        """name.onnx, name.pt (its state dict), name_in.npy, name_out.npy (torch's output)."""
        module, x = tg.onnx_models()[name]
        p = self.path(name + ".onnx")
        y = tg.export_onnx(module, x, p)
        np.save(self.path(name + "_in.npy"), x.numpy())
        np.save(self.path(name + "_out.npy"), y)
        tg.save(module.state_dict(), self.path(name + ".pt"))
        return p

    def verify(self, model, name, *extra):
        return run("verify", model, *extra, "--inputs", self.path(name + "_in.npy"),
                   "--expected", self.path(name + "_out.npy"), "--rtol", "1e-5", "--atol", "1e-6",
                   timeout=120)

    def assert_initializers(self, path):
        m = self.onnx.load(path)
        doc = inspect(path)
        inits = [t for t in doc["tensors"] if t["role"] == "initializer"]
        self.assertEqual([t["name"] for t in inits], [i.name for i in m.graph.initializer])
        for t, i in zip(inits, m.graph.initializer):
            want = self.nh.to_array(i)
            self.assertEqual(t["shape"], list(want.shape), i.name)
            np.testing.assert_array_equal(np.array(t["values"], dtype=np.float64),
                                          want.astype(np.float64).ravel(), i.name)
        g = doc["graph"]
        self.assertEqual([n["op"] for n in g["nodes"]], [n.op_type for n in m.graph.node])
        return doc

    def model(self, nodes, inits, inputs, outputs, name="m.onnx", **kw):
        g = self.helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
        m = self.helper.make_model(g, opset_imports=[self.helper.make_opsetid("", 13)])
        p = self.path(name)
        self.onnx.save_model(m, p, **kw)
        return p

    def vi(self, name, shape):
        return self.helper.make_tensor_value_info(name, self.TP.FLOAT, shape)


class Onnx(Base):
    def test_exports_list_the_initializers_onnx_load_sees(self):
        for name in MODELS:
            with self.subTest(model=name):
                doc = self.assert_initializers(self.export(name))
                self.assertEqual(doc["format"], "onnx")
                self.assertEqual(doc["metadata"]["opset.ai.onnx"], "13")

    def test_verify_matches_torch(self):
        for name in MODELS:
            with self.subTest(model=name):
                p = self.verify(self.export(name), name)
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
                self.assertIn("ok", p.stderr + p.stdout)

    def test_pt_weights_with_onnx_graph(self):
        for name in MODELS:
            with self.subTest(model=name):
                onnx_path = self.export(name)
                p = self.verify(self.path(name + ".pt"), name, "--graph", onnx_path)
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        # a training checkpoint holding the state dict: matched by the name's end
        sd = tg.load(self.path("mlp.pt"))
        ck = tg.save({"model": sd, "epoch": 3}, self.path("ck.pt"))
        p = self.verify(ck, "mlp", "--graph", self.path("mlp.onnx"))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        # weights of another model: the missing initializer is named
        other = tg.save({"w": tg.need_torch().ones(2)}, self.path("other.pt"))
        p = run("verify", other, "--graph", self.path("mlp.onnx"))
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("initializer '0.weight' of", p.stderr)

    def test_typed_fields_and_constants(self):
        h, TP = self.helper, self.TP
        vals = {
            "f32": (TP.FLOAT, np.array([[1.5, -2.25], [3, 0.125]], np.float32)),
            "f64": (TP.DOUBLE, np.array([1e-300, -7.5], np.float64)),
            "i64": (TP.INT64, np.array([-(2 ** 40), 5, 0], np.int64)),
            "i32": (TP.INT32, np.array([-7, 2 ** 30], np.int32)),
            "i8": (TP.INT8, np.array([-128, 127, 0], np.int8)),
            "u8": (TP.UINT8, np.array([0, 255], np.uint8)),
            "f16": (TP.FLOAT16, np.array([0.5, -65504], np.float16)),
            "b": (TP.BOOL, np.array([True, False, True])),
            "u64": (TP.UINT64, np.array([2 ** 40], np.uint64)),
        }
        inits = []
        for n, (t, a) in vals.items():
            if t == TP.FLOAT16:
                inits.append(h.make_tensor(n, t, a.shape, a.view(np.uint16).tolist()))
            else:
                inits.append(h.make_tensor(n, t, a.shape, a.ravel().tolist()))
            inits.append(h.make_tensor(n + "_raw", t, a.shape, a.tobytes(), raw=True))
        const = h.make_node("Constant", [], ["c"], value=h.make_tensor(
            "v", TP.FLOAT, [2], [4.0, 5.0]))
        add = h.make_node("Add", ["x", "c"], ["y"], name="add")
        p = self.model([const, add], inits, [self.vi("x", [2])], [self.vi("y", [2])])
        doc = self.assert_initializers(p)
        got = {t["name"]: t for t in doc["tensors"]}
        self.assertEqual(got["c"]["role"], "constant")
        self.assertEqual(got["c"]["values"], [4.0, 5.0])
        self.assertEqual(got["f16"]["dtype"], "float16")
        self.assertEqual(got["b"]["dtype"], "bool")
        np.save(self.path("x.npy"), np.array([1, 2], np.float32))
        np.save(self.path("y.npy"), np.array([5, 7], np.float32))
        r = run("verify", p, "--inputs", self.path("x.npy"), "--expected", self.path("y.npy"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_external_data_stays_in_the_folder(self):
        h = self.helper
        w = np.arange(12, dtype=np.float32).reshape(3, 4)
        b = np.array([1, -1, 0.5], np.float32)
        gemm = h.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=1)
        os.makedirs(self.path("ext"))
        p = self.model([gemm], [self.nh.from_array(w, "w"), self.nh.from_array(b, "b")],
                       [self.vi("x", [1, 4])], [self.vi("y", [1, 3])], name="ext/m.onnx",
                       save_as_external_data=True, location="weights.bin", size_threshold=0)
        self.assertTrue(os.path.exists(self.path("ext/weights.bin")))
        self.assert_initializers(p)
        m = self.onnx.load(p, load_external_data=False)

        def with_location(loc, name, offset=None):
            for t in m.graph.initializer:
                for e in t.external_data:
                    if e.key == "location":
                        e.value = loc
                    if e.key == "offset" and offset is not None:
                        e.value = str(offset)
            q = self.path("ext/" + name)
            self.onnx.save_model(m, q)
            return q

        with open(self.path("secret.bin"), "wb") as f:
            f.write(os.urandom(4096))
        os.symlink(self.path("secret.bin"), self.path("ext/link.bin"))
        for loc, words in (("../secret.bin", "not a relative path inside"),
                           (self.path("secret.bin"), "not a relative path inside"),
                           ("link.bin", "resolves outside the model's folder"),
                           ("missing.bin", "missing.bin")):
            with self.subTest(location=loc):
                q = with_location(loc, "bad.onnx")
                r = run("inspect", q)
                self.assertEqual(r.returncode, 1, r.stdout)
                self.assertIn("bad.onnx", r.stderr)
                self.assertIn(words, r.stderr)
        q = with_location("weights.bin", "past.onnx", offset=1 << 20)
        r = run("inspect", q)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("does not fit", r.stderr)

    def test_unmapped_op_is_named(self):
        h = self.helper
        n = h.make_node("NonZero", ["x"], ["y"], name="mix")  # Einsum is mapped now
        p = self.model([n], [], [self.vi("x", [3])], [self.vi("y", [3])])
        run("inspect", p, check=0)  # inspect lists any op
        r = run("verify", p)
        self.assertEqual(r.returncode, 4, r.stdout)  # refused: unsupported, nothing run
        self.assertIn("1 ONNX op without a mapping in ckptd's operation vocabulary: "
                      "'NonZero' (node 'mix')", r.stderr)

    def test_hostile_files_fail_cleanly(self):
        p = self.export("mlp")
        with open(p, "rb") as f:
            whole = f.read()
        for cut in list(range(1, 200, 13)) + [len(whole) // 2, len(whole) - 3]:
            q = self.path(f"cut{cut}.onnx")
            with open(q, "wb") as f:
                f.write(whole[:cut])
            for cmd in (("inspect", q), ("verify", q)):
                r = run(*cmd)
                self.assertIn(r.returncode, (1, 2), r.stderr)
                self.assertNotIn("Sanitizer", r.stderr)
                self.assertNotIn("runtime error", r.stderr)
        # raw_data whose length does not match the dims
        h = self.helper
        bad = h.make_tensor("w", self.TP.FLOAT, [3], np.zeros(3, np.float32).tobytes(), raw=True)
        bad.dims[:] = [4]
        q = self.model([h.make_node("Identity", ["w"], ["y"])], [bad], [], [self.vi("y", [4])],
                       name="raw.onnx")
        r = run("inspect", q)
        self.assertEqual(r.returncode, 1)
        self.assertIn("tensor 'w': raw_data of 12 bytes, expected 16", r.stderr)
        # typed values far fewer than the dims claim (2 GiB of floats): refused
        # before anything of the claimed size is allocated (fuzz_onnx)
        bad = h.make_tensor("w", self.TP.FLOAT, [3], [1.0, 2.0, 3.0])
        bad.dims[:] = [1 << 29]
        q = self.model([h.make_node("Identity", ["w"], ["y"])], [bad], [],
                       [self.vi("y", [1 << 29])], name="typed.onnx")
        r = run("inspect", q)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("tensor 'w': 3 values for 536870912 elements", r.stderr)


if __name__ == "__main__":
    unittest.main()
