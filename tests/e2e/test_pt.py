"""PyTorch .pt checkpoints through ckptd inspect: files written by torch.save
(Debian's python3-torch) in the test, values compared with what torch.load
returns; hostile pickles refused by name, with a planted command that must
not run."""
import json
import os
import sys
import unittest
import zipfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ckpt_formats as cf  # noqa: E402
import torch_gen as tg  # noqa: E402
from ckptd_test import TmpDirCase, run  # noqa: E402

DTYPES = {"torch.float32": "float32", "torch.float64": "float64", "torch.float16": "float16",
          "torch.bfloat16": "bfloat16", "torch.int8": "int8", "torch.int16": "int16",
          "torch.int32": "int32", "torch.int64": "int64", "torch.uint8": "uint8",
          "torch.bool": "bool"}


def inspect(path, *extra):
    p = run("inspect", "--json", "--values", "100000", path, *extra)
    if p.returncode != 0:
        raise AssertionError(f"inspect {path}: exit {p.returncode}\n{p.stderr}")
    return json.loads(p.stdout)


class Base(TmpDirCase):
    def setUp(self):
        super().setUp()
        self.torch = tg.need_torch()
        self.marker = os.path.join(self.dir, "MARKER")

    def path(self, name):
        return os.path.join(self.dir, name)

    def assert_same_tensors(self, doc, tensors):
        got = {t["name"]: t for t in doc["tensors"]}
        self.assertEqual(sorted(got), sorted(tensors))
        for name, t in tensors.items():
            g = got[name]
            self.assertEqual(g["dtype"], DTYPES[str(t.dtype)], name)
            self.assertEqual(g["shape"], list(t.shape), name)
            want = tg.as_numpy(t).astype(np.float64).ravel()
            np.testing.assert_array_equal(np.array(g["values"], dtype=np.float64), want, name)

    def assert_refused(self, path, *words):
        p = run("inspect", path)
        self.assertEqual(p.returncode, 1, f"stdout: {p.stdout}\nstderr: {p.stderr}")
        self.assertIn(os.path.basename(path), p.stderr)
        self.assertNotIn("Sanitizer", p.stderr)
        self.assertNotIn("runtime error", p.stderr)
        for w in words:
            self.assertIn(w, p.stderr)
        self.assertFalse(os.path.exists(self.marker), "the planted command ran")
        return p.stderr


class Pt(Base):
    def test_every_dtype_matches_torch_load(self):
        p = tg.save(tg.every_dtype_state_dict(), self.path("dtypes.pt"))
        doc = inspect(p, "--verify")
        self.assertEqual(doc["format"], "pt")
        self.assertTrue(doc["verified"])
        self.assert_same_tensors(doc, dict(tg.load(p)))
        # .pth, and a name that says nothing: detection is by content
        os.rename(p, self.path("weights.bin"))
        self.assertEqual(inspect(self.path("weights.bin"))["format"], "pt")

    def test_nested_training_checkpoint(self):
        p = tg.save(tg.training_checkpoint(), self.path("epoch_3.pth"))
        doc = inspect(p)
        tensors, scalars = tg.flatten(tg.load(p))
        self.assertIn("model.0.weight", tensors)
        self.assertIn("optimizer.state.0.exp_avg", tensors)
        self.assert_same_tensors(doc, tensors)
        meta = doc["metadata"]
        self.assertEqual(meta["epoch"], "3")
        self.assertEqual(meta["loss"], "0.125")
        self.assertEqual(meta["tag"], "run-7")
        self.assertEqual(meta["best"], "None")
        group = tg.load(p)["optimizer"]["param_groups"][0]
        self.assertEqual(meta["optimizer.param_groups.0.betas"], repr(group["betas"]))
        self.assertEqual(meta["optimizer.param_groups.0.params"], repr(group["params"]))
        self.assertEqual(meta["optimizer.param_groups.0.lr"], repr(group["lr"]))
        text = run("inspect", p, check=0).stdout
        self.assertIn("meta epoch = 3", text)

    def test_tied_weights_and_strided_views(self):
        p = tg.save(tg.tied_and_views(), self.path("views.pt"))
        loaded = tg.load(p)
        doc = inspect(p, "--verify")
        self.assert_same_tensors(doc, dict(loaded))
        roles = {t["name"]: t["role"] for t in doc["tensors"]}
        # the sharing torch.load sees is the sharing ckptd reports
        ptr = {n: t.storage().data_ptr() for n, t in loaded.items()}
        for n in loaded:
            shared = sum(1 for m in loaded if ptr[m] == ptr[n]) > 1
            self.assertEqual(roles[n] == "shared", shared, n)
        self.assertEqual(roles["head.weight"], "shared")
        lists = [v for k, v in doc["metadata"].items() if k.startswith("shared_storage.")]
        self.assertIn("embed.weight, head.weight", lists)
        self.assertIn("base, transposed, cols, row2", lists)

    def test_verify_checks_every_member_crc(self):
        p = tg.save({"w": self.torch.arange(1000, dtype=self.torch.float32)}, self.path("w.pt"))
        run("inspect", "--verify", p, check=0)
        with zipfile.ZipFile(p) as z:
            info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
        with open(p, "r+b") as f:  # one byte in the storage's data
            f.seek(info.header_offset + 30 + len(info.filename) + len(info.extra) + 40)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xFF]))
        run("inspect", p, check=0)  # reading does not check the CRC
        e = run("inspect", "--verify", p, check=1).stderr
        self.assertIn("w.pt", e)
        self.assertIn("data/0", e)
        self.assertIn("CRC-32", e)

    def test_verify_shows_each_tensors_crc32c_from_the_same_pass(self):
        """--verify takes the CRC-32C it shows while checking the storages'
        CRC-32: overlapping views at offsets, across the pass's pieces (256 KiB)
        and page-drop steps (8 MiB), must show the sum of their own bytes."""
        torch = self.torch
        base = torch.arange((9 << 20) // 4 + 123, dtype=torch.float32)
        tensors = {"base": base, "mid": base[100_003:2_000_000], "tail": base[-70_000:],
                   "row": torch.arange(600, dtype=torch.int16).reshape(20, 30)[7],
                   "cols": torch.arange(600, dtype=torch.float64).reshape(20, 30)[:, 3],
                   "empty": base[5:5]}
        p = tg.save(tensors, self.path("views.pt"))
        loaded = tg.load(p)
        want = {n: "%08x" % cf.crc32c(t.contiguous().numpy().tobytes()) for n, t in loaded.items()}
        for args in ((), ("--verify",)):
            doc = inspect(p, *args)
            got = {t["name"]: t["crc32c"] for t in doc["tensors"]}
            self.assertEqual(got, want, args)
            self.assertEqual(doc["verified"], bool(args))

    def test_legacy_format_is_refused(self):
        p = tg.save({"w": self.torch.ones(3)}, self.path("old.pt"),
                    _use_new_zipfile_serialization=False)
        self.assert_refused(p, "legacy", "torch before 1.6")

    def test_whole_module_is_refused_by_class_name(self):
        p = tg.save(tg.mlp(), self.path("model.pt"))
        self.assert_refused(p, "an object of class 'torch.nn.modules.container.Sequential'",
                            "save model.state_dict() instead")


class Hostile(Base):
    def test_reduce_calling_os_system_does_not_run(self):
        cmd = f"touch {self.marker}"
        p = tg.save({"w": self.torch.ones(2), "x": tg.Evil(cmd)}, self.path("evil.pt"))
        self.assert_refused(p, "global 'posix.system' is not allowed")
        p2 = tg.torch_zip(self.path("os.pt"), tg.global_call_pickle("os", "system", cmd))
        self.assert_refused(p2, "global 'os.system' is not allowed")

    def test_builtins_eval_is_refused(self):
        src = f"__import__('os').system('touch {self.marker}')"
        for mod in ("builtins", "__builtin__"):
            p = tg.torch_zip(self.path(f"{mod}.pt"), tg.global_call_pickle(mod, "eval", src))
            self.assert_refused(p, f"global '{mod}.eval' is not allowed")
        p = tg.torch_zip(self.path("stack.pt"), b"\x80\x04\x8c\x08builtins\x94\x8c\x04exec\x94"
                         b"\x93\x94.")
        self.assert_refused(p, "global 'builtins.exec' is not allowed")

    def test_deep_nesting_and_memo_indices(self):
        cases = [
            (b"\x80\x02" + b"(" * 100000, "nested deeper than 256"),
            (b"\x80\x02" + b"]" * 1000 + b"a" * 999 + b".", "nested deeper than 64"),
            (b"\x80\x02}r\xf0\xff\xff\xff.", "memo index 4294967280 out of range"),
            (b"\x80\x02j\x00\x00\x01\x00.", "memo index 65536 was never stored"),
            (b"\x80\x02" + b"]" * 1100000, "more than 1048576 values on the stack"),
            (b"\x80\x02}\x81.", "opcode 0x81 is not allowed"),
            (b"\x80\x02\x8b\x00\x00\x00\x40.", "an integer over 64 bits"),
            (b"\x80\x02X\xff\xff\xff\x7fabc", "truncated"),
            (b"\x80\x020.", "pop from an empty stack"),
        ]
        for i, (pkl, words) in enumerate(cases):
            with self.subTest(words=words):
                self.assert_refused(tg.torch_zip(self.path(f"h{i}.pt"), pkl), words)

    def test_truncated_streams_and_files(self):
        good = tg.tensor_pickle()
        storage = [("0", np.arange(4, dtype=np.float32).tobytes())]
        p = tg.torch_zip(self.path("ok.pt"), good, storage)
        self.assertEqual(inspect(p)["tensors"][0]["values"], [0, 1, 2, 3])
        for cut in range(0, len(good) - 1, 7):
            q = tg.torch_zip(self.path(f"t{cut}.pt"), good[:cut], storage)
            self.assert_refused(q)
        with open(p, "rb") as f:
            whole = f.read()
        for cut in (10, 60, len(whole) // 2, len(whole) - 10):
            q = self.path(f"cut{cut}.pt")
            with open(q, "wb") as f:
                f.write(whole[:cut])
            p2 = run("inspect", q)
            self.assertIn(p2.returncode, (1,), p2.stderr)
            self.assertNotIn("Sanitizer", p2.stderr)

    def test_storages_and_views_are_bounded(self):
        data = [("0", np.arange(4, dtype=np.float32).tobytes())]
        cases = [
            (tg.tensor_pickle(numel=100), data, "claims 100 elements"),
            (tg.tensor_pickle(size=(5,)), data, "past the end of storage '0'"),
            (tg.tensor_pickle(offset=3, size=(2,)), data, "past the end of storage '0'"),
            (tg.tensor_pickle(size=(2, 2), stride=(1, 3)), data, "past the end of storage '0'"),
            (tg.tensor_pickle(key="7"), data, "has no member 'archive/data/7'"),
            (tg.tensor_pickle(key="../0"), data, "not a plain name"),
            (tg.tensor_pickle(storage="Storage"), data, "global 'torch.Storage' is not allowed"),
            (tg.tensor_pickle(size=(2 ** 31 - 1, 2 ** 31 - 1), stride=(0, 0)), data,
             "copy more bytes than the file holds"),
            (tg.tensor_pickle(offset=-1, size=(2,)), data,
             "_rebuild_tensor_v2: the storage offset is not an integer of at least 0"),
            (tg.tensor_pickle(size=(2,), stride=(1, 1)), data,
             "_rebuild_tensor_v2: the size and the stride differ in rank"),
        ]
        for i, (pkl, st, words) in enumerate(cases):
            with self.subTest(words=words):
                self.assert_refused(tg.torch_zip(self.path(f"b{i}.pt"), pkl, st), words)
        # the transposed view within bounds reads as torch would
        ok = tg.torch_zip(self.path("t.pt"), tg.tensor_pickle(size=(2, 2), stride=(1, 2)), data)
        self.assertEqual(inspect(ok)["tensors"][0]["values"], [0, 2, 1, 3])


if __name__ == "__main__":
    unittest.main()
