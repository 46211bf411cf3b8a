"""ckptd inspect, end to end: the real binary on checkpoints written by numpy,
by the test writers in tests/lib/ckpt_formats.py (written from the format
descriptions), and by the public projects in ../shared/data. Expected values
come from numpy, from python3-crc32c and from facts about the real files
(half_plus_two: y = a*x + b with a = 0.5, b = 2), never from ckptd."""
import json
import os
import struct
import sys
import unittest
import zipfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckpt_formats import (TfTensor, crc32c, safetensors_bytes,  # noqa: E402
                          safetensors_from_numpy, snappy, write_tf_bundle)
from ckptd_test import TmpDirCase, run, shared  # noqa: E402


def inspect_json(path, *extra, check=0):
    p = run("inspect", "--json", path, *extra, check=check)
    return json.loads(p.stdout) if check == 0 else p


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def by_name(doc):
    return {t["name"]: t for t in doc["tensors"]}


def crc_hex(b):
    return "%08x" % crc32c(b)


class Base(TmpDirCase):
    def path(self, name):
        return os.path.join(self.dir, name)

    def write(self, name, data):
        p = self.path(name)
        with open(p, "wb") as f:
            f.write(data)
        return p

    def assert_fails(self, path, *words, extra=(), code=1):
        """Exit code, one line naming the file, no sanitizer report."""
        p = run("inspect", path, *extra)
        self.assertEqual(p.returncode, code, f"stdout: {p.stdout}\nstderr: {p.stderr}")
        self.assertTrue(p.stderr.startswith("ckptd inspect: "), p.stderr)
        self.assertNotIn("Sanitizer", p.stderr)
        self.assertNotIn("runtime error", p.stderr)
        if code == 1:
            self.assertIn(os.path.basename(path), p.stderr)
        for w in words:
            self.assertIn(w, p.stderr)
        return p.stderr


class Safetensors(Base):
    def test_numpy_dtypes_values_and_crc(self):
        rng = np.random.default_rng(1)
        arrays = {
            "f32": rng.standard_normal((2, 3)).astype(np.float32),
            "f64": rng.standard_normal(4),
            "f16": np.array([1.5, -2.0, 65504.0], dtype=np.float16),
            "i8": np.array([-128, 127], dtype=np.int8),
            "u16": np.array([65535, 1], dtype=np.uint16),
            "i64": np.array([-(2 ** 40), 2 ** 40], dtype=np.int64),
            "u64": np.array([2 ** 52], dtype=np.uint64),
            "b": np.array([True, False, True]),
            "scalar": np.array(3.25, dtype=np.float32),
            "empty": np.zeros((0, 5), dtype=np.float32),
        }
        p = self.write("x.safetensors", safetensors_from_numpy(arrays, {"epoch": "3"}))
        doc = inspect_json(p, "--values", "100")
        self.assertEqual(doc["format"], "safetensors")
        self.assertEqual(doc["metadata"], {"epoch": "3"})
        t = by_name(doc)
        self.assertEqual(set(t), set(arrays))
        for name, a in arrays.items():
            self.assertEqual(t[name]["shape"], list(a.shape), name)
            self.assertEqual(t[name]["bytes"], a.nbytes, name)
            self.assertEqual(t[name]["elements"], a.size, name)
            self.assertEqual(t[name]["crc32c"], crc_hex(a.tobytes()), name)
            want = a.astype(np.float64).ravel().tolist()
            self.assertEqual(t[name]["values"], want, name)
        self.assertEqual(t["f16"]["dtype"], "float16")
        self.assertEqual(t["b"]["dtype"], "bool")
        self.assertIsNone(t["f32"]["stored_crc32c"])

    def test_bf16_and_float8(self):
        # bfloat16 is the top half of a float32; float8 values from the OCP tables.
        f = np.array([1.0, -3.140625, 0.5], dtype=np.float32)
        bf = (f.view(np.uint32) >> 16).astype("<u2").tobytes()
        e4 = bytes([0x38, 0x7E, 0xC0])  # 1.0, 448, -2.0
        e5 = bytes([0x3C, 0x7B, 0xFC])  # 1.0, 57344, -inf
        p = self.write("f8.safetensors", safetensors_bytes([
            ("bf", "BF16", [3], bf), ("e4", "F8_E4M3", [3], e4), ("e5", "F8_E5M2", [3], e5)]))
        t = by_name(inspect_json(p, "--values", "10"))
        self.assertEqual(t["bf"]["values"], [1.0, -3.140625, 0.5])
        self.assertEqual(t["e4"]["values"], [1.0, 448.0, -2.0])
        self.assertEqual(t["e5"]["values"], [1.0, 57344.0, "-inf"])
        self.assertEqual(t["bf"]["dtype"], "bfloat16")

    def test_values_limit(self):
        p = self.write("v.safetensors", safetensors_from_numpy(
            {"small": np.arange(3, dtype=np.int32), "big": np.arange(10, dtype=np.int32)}))
        t = by_name(inspect_json(p, "--values", "3"))
        self.assertEqual(t["small"]["values"], [0, 1, 2])
        self.assertNotIn("values", t["big"])
        t = by_name(inspect_json(p))
        self.assertNotIn("values", t["small"])

    def test_real_files(self):
        d = shared("safetensors")
        doc = inspect_json(os.path.join(d, "forced_alignment_attn0_f32_1x1x2x3.safetensors"),
                           "--values", "6")
        t = by_name(doc)["attn0"]
        self.assertEqual((t["dtype"], t["shape"]), ("float32", [1, 1, 2, 3]))
        self.assertEqual(t["values"], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
        doc = inspect_json(os.path.join(d, "serialization_attn.0_f32_1x2x3.safetensors"))
        self.assertEqual(by_name(doc)["attn.0"]["shape"], [1, 2, 3])
        doc = inspect_json(os.path.join(d, "empty.safetensors"))
        self.assertEqual((doc["tensors"], doc["metadata"]), ([], {}))
        doc = inspect_json(os.path.join(d, "empty_with_metadata_framework_pt.safetensors"))
        self.assertEqual(doc["metadata"], {"framework": "pt"})

    def test_hostile(self):
        ok = safetensors_bytes([("a", "F32", [2], b"\0" * 8), ("b", "F32", [1], b"\0" * 4)])

        def hdr(obj, data=b""):
            h = json.dumps(obj).encode()
            return struct.pack("<Q", len(h)) + h + data

        cases = {
            "short": (b"\x08\0\0", "shorter than"),
            "truncated": (ok[:-3], "past the end"),
            "huge_header": (struct.pack("<Q", 2 ** 63) + b"{}", "over the limit"),
            "header_past_end": (struct.pack("<Q", 1000) + b"{}", "past the end"),
            "not_object": (struct.pack("<Q", 2) + b"[]", "start with"),
            "bad_json": (struct.pack("<Q", 4) + b"{,} ", "json"),
            "dup_key": (struct.pack("<Q", 14) + b'{"a":1,"a":2} ', "duplicate"),
            "hole": (hdr({"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}},
                         b"xx"), "hole"),
            "overlap": (hdr({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                             "b": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}},
                            b"xx"), "overlaps"),
            "trailing": (hdr({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}},
                             b"xy"), "after the last tensor"),
            "size_mismatch": (hdr({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},
                                  b"xxxx"), "elements"),
            "absurd_shape": (hdr({"a": {"dtype": "F32", "shape": [2 ** 62, 4],
                                        "data_offsets": [0, 4]}}, b"xxxx"), "overflows"),
            "overflowing_offsets": (hdr({"a": {"dtype": "U8", "shape": [1],
                                               "data_offsets": [2 ** 64 - 1, 2 ** 64]}}), "a"),
            "unknown_dtype": (hdr({"a": {"dtype": "F4", "shape": [1], "data_offsets": [0, 1]}},
                                  b"x"), "unknown dtype"),
            "bad_metadata": (hdr({"__metadata__": {"k": 1}}), "not a string"),
            "unknown_key": (hdr({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1],
                                       "x": 1}}, b"x"), "unknown key"),
            "negative_dim": (hdr({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}},
                                 b"x"), "dimension"),
            "deep": (struct.pack("<Q", 200) + b"{" + b'"a":[' * 65 + b"]" * 65 + b"}"
                     + b" " * (200 - 2 - 5 * 65 - 65), "json"),
        }
        for name, (data, word) in cases.items():
            with self.subTest(name):
                self.assert_fails(self.write(name + ".safetensors", data), word,
                                  extra=("--format", "safetensors"))


def npy_bytes(a, version):
    import io
    b = io.BytesIO()
    np.lib.format.write_array(b, a, version=version)
    return b.getvalue()


class Npy(Base):
    def test_versions_orders_and_byte_orders(self):
        base = np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 7
        variants = {
            "v1_le": (base, (1, 0)),
            "v2_be": (base.astype(">f8"), (2, 0)),
            "v3_fortran": (np.asfortranarray(base.astype("<f4")), (3, 0)),
            "be_fortran_i2": (np.asfortranarray(np.arange(6, dtype=">i2").reshape(2, 3)), (1, 0)),
            "u64": (np.array([2 ** 53, 7], dtype="<u8"), (1, 0)),
            "c64": (np.array([1 + 2j, -3j], dtype=np.complex64), (1, 0)),
            "bool0d": (np.array(True), (1, 0)),
            "f16": (np.array([0.5, -1.0], dtype="<f2"), (2, 0)),
        }
        for name, (a, ver) in variants.items():
            with self.subTest(name):
                p = self.write(name + ".npy", npy_bytes(a, ver))
                doc = inspect_json(p, "--values", "100")
                self.assertEqual(doc["format"], "npy")
                t = doc["tensors"][0]
                self.assertEqual(t["name"], name)
                self.assertEqual(t["shape"], list(a.shape))
                self.assertEqual(t["bytes"], a.nbytes)
                raw = a.tobytes(order="F" if a.flags.f_contiguous and a.ndim > 1 else "C")
                self.assertEqual(t["crc32c"], crc_hex(raw))
                want = a.real if a.dtype.kind == "c" else a
                self.assertEqual(t["values"], want.astype(np.float64).ravel(order="C").tolist())
                self.assertEqual(t.get("big_endian", False), a.dtype.byteorder == ">")

    def test_npz_stored_and_deflated(self):
        arrays = {"w": np.arange(1000, dtype=np.float32), "b": np.array([1, 2], dtype=np.int8),
                  "nested/name": np.eye(3)}
        for fn, save in (("s.npz", np.savez), ("c.npz", np.savez_compressed)):
            with self.subTest(fn):
                p = self.path(fn)
                save(p, **arrays)
                doc = inspect_json(p, "--values", "9")
                self.assertEqual(doc["format"], "npz")
                t = by_name(doc)
                self.assertEqual(set(t), set(arrays))
                for k, a in arrays.items():
                    self.assertEqual(t[k]["crc32c"], crc_hex(a.tobytes()), k)
                doc = inspect_json(p, "--verify")
                self.assertTrue(doc["verified"])
                if save is np.savez:  # stored: the member's CRC-32, from zipfile
                    with zipfile.ZipFile(p) as z:
                        self.assertEqual(by_name(doc)["w"]["stored_crc32"],
                                         "%08x" % z.getinfo("w.npy").CRC)
                self.assertEqual(t["nested/name"]["values"], np.eye(3).ravel().tolist())

    def test_hostile_npy(self):
        good = npy_bytes(np.arange(4, dtype="<i4"), (1, 0))

        def with_header(h, data=b"", ver=1):
            h = h.encode() + b"\n"
            ln = struct.pack("<H", len(h)) if ver == 1 else struct.pack("<I", len(h))
            return b"\x93NUMPY" + bytes([ver, 0]) + ln + h + data

        cases = {
            "truncated_data": (good[:-1], "bytes"),
            "truncated_header": (good[:20], "past the end"),
            "magic_only": (good[:8], "bad magic"),
            "version9": (b"\x93NUMPY\x09\x00" + good[8:], "version"),
            "absurd_shape": (with_header("{'descr': '<f4', 'fortran_order': False, "
                                         "'shape': (4611686018427387904, 8), }"), "overflow"),
            "huge_v2_header": (b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFF0) + b"{",
                               "over the limit"),
            "object": (with_header("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }",
                                   b"\0" * 8), "object"),
            "extra_key": (with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), "
                                      "'x': 1}", b"\0" * 4), "key"),
            "missing_key": (with_header("{'descr': '<f4', 'shape': (1,), }", b"\0" * 4),
                            "missing"),
            "record": (with_header("{'descr': [('a', '<f4')], 'fortran_order': False, "
                                   "'shape': (1,), }", b"\0" * 4), "record"),
            "bad_tuple": (with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1), }",
                                      b"\0" * 4), "comma"),
            "pickle_code": (with_header("{'descr': '<f4', 'fortran_order': __import__('os'), "
                                        "'shape': (1,), }", b"\0" * 4), "fortran_order"),
        }
        for name, (data, word) in cases.items():
            with self.subTest(name):
                self.assert_fails(self.write(name + ".npy", data), word,
                                  extra=("--format", "npy"))

    def test_hostile_npz(self):
        p = self.path("slip.npz")
        with zipfile.ZipFile(p, "w") as z:
            z.writestr("../x.npy", npy_bytes(np.arange(2), (1, 0)))
        self.assert_fails(p, "unsafe", extra=("--format", "npz"))
        p = self.path("notnpy.npz")
        with zipfile.ZipFile(p, "w") as z:
            z.writestr("a.txt", b"hello")
        self.assert_fails(p, "not an .npy", extra=("--format", "npz"))
        # A member whose central directory claims 2^32-1 bytes from a tiny
        # deflate stream: refused before anything that size is allocated.
        p = self.path("bomb.npz")
        with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("a.npy", npy_bytes(np.zeros(100), (1, 0)))
        data = bytearray(read_bytes(p))
        cd = data.rfind(b"PK\x01\x02")
        struct.pack_into("<I", data, cd + 24, 0xFFFFFFF0)  # uncompressed size
        lh = data.find(b"PK\x03\x04")
        struct.pack_into("<I", data, lh + 22, 0xFFFFFFF0)
        self.write("bomb.npz", bytes(data))
        self.assert_fails(p, "a.npy", extra=("--format", "npz"))
        # A corrupt stored member is used in place; --verify checks its zip CRC-32.
        p = self.path("crc.npz")
        a = np.arange(100, dtype=np.int64)
        np.savez(p, a=a)
        data = bytearray(read_bytes(p))
        at = data.find(a.tobytes()) + 8 * 50
        data[at] ^= 0xFF
        self.write("crc.npz", bytes(data))
        self.assertEqual(by_name(inspect_json(p, "--values", "100"))["a"]["values"][50],
                         50 ^ 0xFF)
        self.assert_fails(p, "tensor 'a'", "CRC-32", extra=("--verify",))
        # A corrupt deflated member fails its CRC-32 when libzip inflates it.
        p = self.path("crcz.npz")
        np.savez_compressed(p, a=a)
        data = bytearray(read_bytes(p))
        lh = data.find(b"PK\x03\x04")
        struct.pack_into("<I", data, lh + 14, 0x12345678)  # local header CRC-32
        cd = data.rfind(b"PK\x01\x02")
        struct.pack_into("<I", data, cd + 16, 0x12345678)  # central directory CRC-32
        self.write("crcz.npz", bytes(data))
        self.assert_fails(p, "a.npy", extra=("--format", "npz"))
        # Central directory offsets that point nowhere.
        p = self.path("badoff.npz")
        np.savez(p, a=a)
        data = bytearray(read_bytes(p))
        cd = data.rfind(b"PK\x01\x02")
        struct.pack_into("<I", data, cd + 42, 0x7FFFFFF0)
        self.write("badoff.npz", bytes(data))
        self.assert_fails(p, extra=("--format", "npz"))


class TfBundle(Base):
    def test_half_plus_two_variants(self):
        for d in ("half_plus_two_v124", "half_plus_two_cpu", "half_plus_two_mkl",
                  "half_plus_two_tf2_cpu"):
            with self.subTest(d):
                prefix = os.path.join(shared("tfckpt", d), "variables")
                doc = inspect_json(prefix, "--verify", "--values", "1")
                self.assertTrue(doc["verified"])
                self.assertEqual(doc["format"], "tf-bundle")
                t = by_name(doc)
                sfx = "/.ATTRIBUTES/VARIABLE_VALUE" if "tf2" in d else ""
                self.assertEqual(t["a" + sfx]["values"], [0.5])
                self.assertEqual(t["b" + sfx]["values"], [2.0])
                self.assertEqual(t["a" + sfx]["dtype"], "float32")
                # The stored CRC is the CRC-32C of the 4 bytes of 0.5f.
                self.assertEqual(t["a" + sfx]["stored_crc32c"],
                                 crc_hex(struct.pack("<f", 0.5)))

    def test_every_way_to_name_it(self):
        d = shared("tfckpt", "half_plus_three")
        for p in (os.path.join(d, "variables"), os.path.join(d, "variables.index"),
                  os.path.join(d, "variables.data-00000-of-00001"), d):
            with self.subTest(p):
                t = by_name(inspect_json(p, "--values", "1"))
                self.assertEqual(t["a"]["values"], [0.5])
                self.assertEqual(t["b"]["values"], [3.0])

    def test_savedmodel_folder(self):
        d = os.path.join(self.dir, "saved")
        os.makedirs(os.path.join(d, "variables"))
        write_tf_bundle(os.path.join(d, "variables", "variables"),
                        [TfTensor.from_numpy("w", np.array([4.5], dtype=np.float32))])
        doc = inspect_json(d, "--values", "1")
        self.assertEqual(doc["path"], os.path.join(d, "variables", "variables"))
        self.assertEqual(by_name(doc)["w"]["values"], [4.5])

    def test_big_endian_bundle(self):
        prefix = self.path("be")
        a = np.array([1.5, -2.25, 1e10], dtype=">f8")
        i = np.array([-3, 70000], dtype=">i4")
        write_tf_bundle(prefix, [TfTensor("a", "float64", [3], raw=a.tobytes()),
                                 TfTensor("i", "int32", [2], raw=i.tobytes())],
                        big_endian_header=True)
        doc = inspect_json(prefix, "--verify", "--values", "3")
        self.assertEqual(doc["metadata"]["endianness"], "big")
        t = by_name(doc)
        self.assertEqual(t["a"]["values"], [1.5, -2.25, 1e10])
        self.assertEqual(t["i"]["values"], [-3, 70000])
        self.assertTrue(t["a"]["big_endian"])

    def test_string_tensors_real(self):
        for d in ("half_plus_two_tf2_cpu", "tf_text_regression"):
            with self.subTest(d):
                prefix = os.path.join(shared("tfckpt", d), "variables")
                doc = inspect_json(prefix, "--verify", "--values", "1")
                t = by_name(doc)["_CHECKPOINTABLE_OBJECT_GRAPH"]
                self.assertEqual((t["dtype"], t["shape"]), ("string", []))
                self.assertEqual(len(t["values"]), 1)
                # the object graph is a protobuf naming the variables
                if d == "half_plus_two_tf2_cpu":
                    self.assertIn("VARIABLE_VALUE", t["values"][0])

    def test_index_without_data_lists_tensors(self):
        for name in ("minigo.index", "style.index", "transformer.index"):
            with self.subTest(name):
                p = shared("tfckpt", name)
                doc = inspect_json(p)
                self.assertGreater(len(doc["tensors"]), 10)
                self.assertTrue(all(not t["has_data"] for t in doc["tensors"]))
                self.assertTrue(all(t["stored_crc32c"] for t in doc["tensors"]))
                self.assertEqual(doc["metadata"]["tensors_without_data"],
                                 str(len(doc["tensors"])))
                r = run("inspect", "--verify", p)
                self.assertEqual(r.returncode, 1)
                self.assertIn("data shard is missing", r.stderr)

    def generated(self, **kw):
        rng = np.random.default_rng(7)
        ts = [TfTensor.from_numpy(f"layer{i:03d}/kernel", rng.standard_normal((i % 5 + 1, 3))
                                  .astype(np.float32)) for i in range(120)]
        ts += [TfTensor.from_numpy("step", np.array(1234, dtype=np.int64)),
               TfTensor.from_numpy("f16", np.array([1.5, -2], dtype=np.float16)),
               TfTensor.from_numpy("f64", np.array([1e300, -0.25])),
               TfTensor.from_numpy("u8", np.array([255, 0], dtype=np.uint8)),
               TfTensor.from_numpy("i16", np.array([-3], dtype=np.int16)),
               TfTensor.from_numpy("u64", np.array([2 ** 40], dtype=np.uint64)),
               TfTensor.from_numpy("flags", np.array([True, False])),
               TfTensor.from_numpy("c128", np.array([2 - 1j])),
               TfTensor("bf16", "bfloat16", [2], raw=bytes([0x80, 0x3F, 0x00, 0xC0])),
               TfTensor("empty", "float32", [0, 4], raw=b""),
               TfTensor("vocab", "string", [2, 2], strings=[b"", b"a", b"\xff\x00z", b"x" * 300]),
               TfTensor("none", "string", [0], strings=[])]
        prefix = self.path("ckpt/model")
        os.makedirs(os.path.dirname(prefix))
        return prefix, ts, write_tf_bundle(prefix, ts, **kw)

    def check_generated(self, prefix, ts, where):
        doc = inspect_json(prefix, "--verify", "--values", "4")
        t = by_name(doc)
        self.assertEqual(len(t), len(ts))
        for x in ts:
            self.assertEqual(t[x.name]["shape"], x.shape, x.name)
            self.assertEqual(t[x.name]["stored_crc32c"], "%08x" % where[x.name][3], x.name)
            if x.raw is not None:
                self.assertEqual(t[x.name]["crc32c"], crc_hex(x.raw), x.name)
        self.assertEqual(t["step"]["values"], [1234])
        self.assertEqual(t["f16"]["values"], [1.5, -2.0])
        self.assertEqual(t["f64"]["values"], [1e300, -0.25])
        self.assertEqual(t["bf16"]["values"], [1.0, -2.0])
        self.assertEqual(t["c128"]["values"], [2.0])
        self.assertEqual(t["flags"]["values"], [1, 0])
        self.assertEqual(t["u64"]["values"], [2 ** 40])
        self.assertEqual(t["vocab"]["bytes"], 0 + 1 + 3 + 300)
        self.assertEqual(t["vocab"]["values"][:2], ["", "a"])
        self.assertEqual(t["none"]["elements"], 0)
        return doc

    def test_generated_multi_shard_multi_block(self):
        prefix, ts, where = self.generated(num_shards=3, block_size=512)
        doc = self.check_generated(prefix, ts, where)
        self.assertEqual(doc["metadata"]["num_shards"], "3")

    def test_generated_snappy(self):
        if snappy is None:
            raise unittest.SkipTest("python3-snappy is not installed")
        prefix, ts, where = self.generated(compress=True, block_size=1024)
        idx = read_bytes(prefix + ".index")
        self.check_generated(prefix, ts, where)
        # the writer really compressed: Snappy-typed trailers are there
        self.assertLess(len(idx), 120 * 40)

    def test_corrupt_data_names_the_tensor(self):
        prefix, ts, where = self.generated(num_shards=2)
        sh, off, size, _ = where["layer007/kernel"]
        shard = f"{prefix}.data-{sh:05d}-of-00002"
        data = bytearray(read_bytes(shard))
        data[off + size // 2] ^= 0x01
        write_bytes(shard, bytes(data))
        p = run("inspect", "--verify", prefix)
        self.assertEqual(p.returncode, 1)
        self.assertIn(f"ckptd inspect: '{prefix}': tensor 'layer007/kernel': ", p.stderr)
        self.assertIn("CRC-32C", p.stderr)
        # without --verify the listing still works
        run("inspect", prefix, check=0)

    def test_corrupt_string_lengths(self):
        prefix, ts, where = self.generated()
        sh, off, size, _ = where["vocab"]
        shard = f"{prefix}.data-00000-of-00001"
        data = bytearray(read_bytes(shard))
        data[off + size - 1] ^= 0x20  # the last string byte
        write_bytes(shard, bytes(data))
        self.assert_fails(prefix, "tensor 'vocab'", extra=("--verify",))

    def test_hostile_index(self):
        prefix, ts, where = self.generated(block_size=256)
        good = read_bytes(prefix + ".index")
        n = len(good)

        def variant(name, data):
            d = os.path.join(self.dir, name)
            os.makedirs(d)
            p = os.path.join(d, "model")
            write_bytes(p + ".index", data)
            for f in os.listdir(os.path.dirname(prefix)):
                if ".data-" in f:
                    os.link(os.path.join(os.path.dirname(prefix), f),
                            os.path.join(d, f.replace("model", "model")))
            return p

        flipped = bytearray(good)
        flipped[10] ^= 0x40
        footer = bytearray(good)
        footer[n - 48:n - 8] = b"\xff" * 10 + b"\x01" + b"\0" * 29  # handle offset overflows
        huge = bytearray(good)
        huge[n - 48:n - 8] = b"\x80" * 9 + b"\x01" + b"\x04" + b"\0" * 29  # offset 2^63
        cases = {
            "truncated": (good[:-5], "footer"),
            "tiny": (good[-20:], "footer"),
            "block_crc": (bytes(flipped), "CRC-32C"),
            "footer_handles": (bytes(footer), "handle"),
            "huge_block": (bytes(huge), "past the end"),
        }
        for name, (data, word) in cases.items():
            with self.subTest(name):
                self.assert_fails(variant(name, data), word, extra=("--format", "tf-bundle"))

    def test_hostile_entries(self):
        """Entries that lie: offsets past the shard, sizes that overflow,
        absurd shapes, shards that do not exist, string counts past the data."""
        from ckpt_formats import mask, pb_bytes, pb_fixed32, pb_varint, table_bytes

        def bundle(name, entry, shard=b"\0" * 16, num_shards=1):
            d = os.path.join(self.dir, name)
            os.makedirs(d)
            p = os.path.join(d, "m")
            header = pb_varint(1, num_shards) + pb_bytes(3, pb_varint(1, 1))
            write_bytes(p + ".index", table_bytes([(b"", header), (b"t", entry)]))
            for i in range(num_shards):
                write_bytes(f"{p}.data-{i:05d}-of-{num_shards:05d}", shard)
            return p

        def shape(*dims):
            return pb_bytes(2, b"".join(pb_bytes(2, pb_varint(1, x)) for x in dims))

        crc = pb_fixed32(6, mask(0))
        cases = {
            "offset_past": (pb_varint(1, 1) + shape(2) + pb_varint(4, 12) + pb_varint(5, 8) + crc,
                            "past the end"),
            "offset_overflow": (pb_varint(1, 1) + shape(2) + pb_varint(4, 2 ** 64 - 4)
                                + pb_varint(5, 8) + crc, "past the end"),
            "size_2_63": (pb_varint(1, 4) + shape(2 ** 63 - 1) + pb_varint(5, 2 ** 63 - 1) + crc,
                          "past the end"),
            "absurd_shape": (pb_varint(1, 1) + shape(2 ** 62, 2 ** 62) + pb_varint(5, 8) + crc,
                             "overflows"),
            "size_mismatch": (pb_varint(1, 1) + shape(3) + pb_varint(5, 8) + crc, "elements"),
            "no_such_shard": (pb_varint(1, 1) + shape(2) + pb_varint(3, 5) + pb_varint(5, 8)
                              + crc, "shard"),
            "strings_past": (pb_varint(1, 7) + shape(2 ** 40) + pb_varint(5, 16) + crc,
                             "strings"),
            "string_len_lies": (pb_varint(1, 7) + shape(1) + pb_varint(5, 16) + crc, "string 0"),
            "negative_dim": (pb_varint(1, 1) + shape(2 ** 64 - 1) + crc, "dimension"),
            "bad_proto": (b"\x0a\xff\xff\xff\x0f", "tensor 't'"),
        }
        for name, (entry, word) in cases.items():
            with self.subTest(name):
                self.assert_fails(bundle(name, entry, shard=b"\x50" + b"\0" * 15), word,
                                  extra=("--format", "tf-bundle"))
        # An index naming the same data block twice (unbounded work if allowed).
        from ckpt_formats import TABLE_MAGIC, _Block, _put_block, varint
        out = bytearray()
        blk = _Block(16)
        blk.add(b"", pb_varint(1, 1) + pb_bytes(3, pb_varint(1, 1)))
        blk.add(b"t", pb_varint(1, 4) + shape(1) + pb_varint(5, 1) + crc)
        h = _put_block(out, blk.finish(), False)
        index = _Block(1)
        index.add(b"t", varint(h[0]) + varint(h[1]))
        index.add(b"u", varint(h[0]) + varint(h[1]))
        meta = _put_block(out, _Block(16).finish(), False)
        idx = _put_block(out, index.finish(), False)
        footer = varint(meta[0]) + varint(meta[1]) + varint(idx[0]) + varint(idx[1])
        out += footer + b"\0" * (40 - len(footer)) + struct.pack("<Q", TABLE_MAGIC)
        d = os.path.join(self.dir, "twice")
        os.makedirs(d)
        write_bytes(os.path.join(d, "m.index"), bytes(out))
        write_bytes(os.path.join(d, "m.data-00000-of-00001"), b"\0")
        self.assert_fails(os.path.join(d, "m"), "overlaps", extra=("--format", "tf-bundle"))
        # Prefix compression abused: 3-byte entries standing for 60 KB keys.
        out = bytearray()
        hdr = pb_varint(1, 1) + pb_bytes(3, pb_varint(1, 1))
        blk = bytearray(varint(0) + varint(0) + varint(len(hdr)) + hdr)
        key0 = b"k" * 60000 + b"\x01\x01"
        blk += varint(0) + varint(len(key0)) + varint(0) + key0
        for i in range(1, 40000):  # shared 60000, 2 new bytes, no value: sorted keys
            blk += varint(60000) + varint(2) + varint(0) + bytes([i // 255 + 1, i % 255 + 1])
        blk += struct.pack("<II", 0, 1)  # one restart point at 0
        h = _put_block(out, bytes(blk), False)
        index = _Block(1)
        index.add(b"l", varint(h[0]) + varint(h[1]))
        meta = _put_block(out, _Block(16).finish(), False)
        idx = _put_block(out, index.finish(), False)
        footer = varint(meta[0]) + varint(meta[1]) + varint(idx[0]) + varint(idx[1])
        out += footer + b"\0" * (40 - len(footer)) + struct.pack("<Q", TABLE_MAGIC)
        d = os.path.join(self.dir, "longkeys")
        os.makedirs(d)
        write_bytes(os.path.join(d, "m.index"), bytes(out))
        self.assert_fails(os.path.join(d, "m"), "keys of", extra=("--format", "tf-bundle"))
        bad = bundle("bad_crc", pb_varint(1, 1) + shape(2) + pb_varint(5, 8)
                     + pb_fixed32(6, mask(1234)))
        self.assert_fails(bad, "tensor 't'", "CRC-32C", extra=("--verify",))


class Graph(Base):
    def test_graph_from_nnp(self):
        """The LeNet network as FORMAT-FACTS 4.4 describes it."""
        p = shared("nnabla", "lenet_010000.nnp")
        doc = inspect_json(p)
        g = doc["graph"]
        self.assertIsNotNone(g)
        self.assertEqual(g["name"], "runtime")
        self.assertEqual((g["inputs"], g["outputs"]), (["x"], ["y"]))
        self.assertEqual([n["op"] for n in g["nodes"]],
                         ["MulScalar", "Convolution", "MaxPooling", "ReLU", "Convolution",
                          "MaxPooling", "ReLU", "Affine", "ReLU", "Affine"])
        conv = g["nodes"][1]
        self.assertIn("conv1/conv/W", conv["inputs"])
        t = by_name(doc)
        self.assertEqual(t["conv1/conv/W"]["shape"], [16, 1, 5, 5])
        self.assertEqual(t["fc3/affine/W"]["shape"], [256, 50])
        self.assertTrue(t["conv1/conv/W"]["has_data"])
        out = run("inspect", p, check=0).stdout
        self.assertIn("graph runtime: 10 nodes", out)
        self.assertIn("node Convolution: Convolution(", out)


class Cli(Base):
    def test_usage_errors(self):
        for args in ((), ("a", "b"), ("--values", "x", "f"), ("--format", "nope", "f"),
                     ("--bogus", "f")):
            with self.subTest(args):
                p = run("inspect", *args)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn("ckptd inspect: ", p.stderr)

    def test_help_and_unknown_files(self):
        p = run("inspect", "--help", check=0)
        self.assertIn("--verify", p.stdout)
        self.assert_fails(self.write("junk.bin", b"nothing to see here" * 10),
                          "not a checkpoint format")
        self.assert_fails(self.path("missing"), "missing")

    def test_text_output(self):
        a = np.arange(3, dtype=np.float32)
        p = self.write("t.safetensors", safetensors_from_numpy({"w": a}, {"k": "v"}))
        out = run("inspect", p, "--values", "5", check=0).stdout
        self.assertIn("safetensors, 1 tensors, 12 bytes", out)
        self.assertIn("meta k = v", out)
        self.assertIn(f"w  float32 [3]  12 bytes  crc32c {crc_hex(a.tobytes())}", out)
        self.assertIn("values [0, 1, 2]", out)

    def test_format_override(self):
        p = self.write("weights.bin", safetensors_from_numpy({"w": np.ones(2)}))
        doc = inspect_json(p, "--format", "safetensors")
        self.assertEqual(doc["format"], "safetensors")
        self.assertEqual(inspect_json(p)["format"], "safetensors")  # by content
        self.assert_fails(p, extra=("--format", "npy"))


class Verdicts(Base):
    """What 'inspect --verify' claims: "checksums verified" only where the
    file stores checksums and every one matched, over every member of a zip
    (every tag of a SameDiff archive, not only the one read)."""

    def samediff_run(self):
        import sdfb
        sdfb.sd()  # skips without flatc
        rng = np.random.default_rng(3)
        out = self.path("run.zip")
        for tag in ("e1", "e2"):
            w = {"W1": rng.standard_normal((4, 3)).astype("f4"), "b1": np.zeros(3, "f4"),
                 "W2": rng.standard_normal((3, 2)).astype("f4"), "b2": np.zeros(2, "f4")}
            src = self.path(tag + ".fb")
            sdfb.mlp(src, w)
            run("pack", "--format", "samediff", src, "-o", out, "-q", check=0)
        return out

    def test_a_flip_in_any_member_of_any_tag_is_found(self):
        out = self.samediff_run()
        with open(out, "rb") as f:
            whole = f.read()
        with zipfile.ZipFile(out) as z:
            members = [(i.filename, i.header_offset, i.compress_size) for i in z.infolist()]
        self.assertTrue(any(n.startswith("e1/") for n, _, _ in members))
        for name, off, size in members:
            if not size:
                continue
            namelen, extralen = struct.unpack_from("<HH", whole, off + 26)
            data = off + 30 + namelen + extralen
            for at in sorted({data, data + size // 2, data + size - 1}):
                with self.subTest(member=name, at=at - data):
                    bad = bytearray(whole)
                    bad[at] ^= 0x10
                    p = self.path("bad.zip")
                    with open(p, "wb") as f:
                        f.write(bad)
                    r = run("inspect", "--verify", p)
                    self.assertEqual(r.returncode, 1, r.stdout)
                    self.assertIn(f"member '{name}'", r.stderr)
                    self.assertNotIn("checksums verified", r.stdout)
        r = run("inspect", "--verify", out, check=0)
        self.assertIn("checksums verified", r.stdout)

    def test_no_checksums_is_not_called_verified(self):
        import sdfb
        sdfb.sd()
        fb = self.path("one.fb")
        sdfb.mlp(fb, {"W1": np.ones((4, 3), "f4"), "b1": np.zeros(3, "f4"),
                      "W2": np.ones((3, 2), "f4"), "b2": np.zeros(2, "f4")})
        npy = self.path("a.npy")
        np.save(npy, np.arange(3, dtype=np.float32))
        st = self.path("a.safetensors")
        with open(st, "wb") as f:
            f.write(safetensors_bytes([("a", "F32", [2], struct.pack("<2f", 1, 2))]))
        for p, fmt in ((fb, "samediff"), (npy, "npy"), (st, "safetensors")):
            with self.subTest(fmt=fmt):
                r = run("inspect", "--verify", p, check=0)
                self.assertNotIn("checksums verified", r.stdout)
                self.assertIn(f"no checksums to verify: this {fmt} file stores none", r.stdout)
                doc = json.loads(run("inspect", "--verify", "--json", p, check=0).stdout)
                self.assertFalse(doc["verified"])


if __name__ == "__main__":
    unittest.main()
