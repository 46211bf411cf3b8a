"""ckptd inspect on NNabla (.nnp, parameter.h5) and SameDiff (.fb, tagged zip)
files, end to end. Expected values come from decoders written here from the
format facts: protobuf wire format decoded by hand, FlatBuffers through
python3-flatbuffers' low-level Table API, HDF5 through h5py."""
import json
import os
import struct
import sys
import zipfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import TmpDirCase, run, shared  # noqa: E402

BIG = 10 ** 8  # --values limit: print every value


def inspect(path, check=0):
    p = run("inspect", path, "--json", "--values", BIG, check=check)
    return json.loads(p.stdout) if check == 0 else p


# ---- protobuf wire format, by hand ----

def varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def fields(b):
    i = 0
    while i < len(b):
        tag, i = varint(b, i)
        num, wire = tag >> 3, tag & 7
        if wire == 0:
            v, i = varint(b, i)
        elif wire == 1:
            v, i = b[i:i + 8], i + 8
        elif wire == 5:
            v, i = b[i:i + 4], i + 4
        elif wire == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise ValueError("wire type %d" % wire)
        yield num, wire, v


def nnabla_params(pb):
    """[(name, dims, floats, need_grad)] from NNablaProtoBuf bytes (parameter=200)."""
    out = []
    for num, wire, v in fields(pb):
        if num != 200:
            continue
        name, dims, data, ng = None, [], [], None
        for n2, w2, v2 in fields(v):
            if n2 == 1:
                name = v2.decode()
            elif n2 == 20:
                for n3, w3, v3 in fields(v2):
                    if n3 == 1 and w3 == 2:
                        j = 0
                        while j < len(v3):
                            d, j = varint(v3, j)
                            dims.append(d)
                    elif n3 == 1:
                        dims.append(v3)
            elif n2 == 100:
                data.extend(struct.unpack("<%df" % (len(v2) // 4), v2))
            elif n2 == 101:
                ng = bool(v2)
        out.append((name, dims, data, ng))
    return out


# ---- FlatBuffers, through the low-level Table API ----

def fb_modules():
    try:
        from flatbuffers import encode, number_types as N
        from flatbuffers.table import Table
    except ImportError:
        raise unittest.SkipTest("python3-flatbuffers is not installed")
    return encode, N, Table


class FB:
    def __init__(self):
        self.encode, self.N, self.Table = fb_modules()

    def root(self, buf):
        return self.Table(buf, self.encode.Get(self.N.UOffsetTFlags.packer_type, buf, 0))

    def sub(self, t, slot):
        o = t.Offset(4 + 2 * slot)
        return self.Table(t.Bytes, t.Indirect(o + t.Pos)) if o else None

    def tables(self, t, slot):
        o = t.Offset(4 + 2 * slot)
        if not o:
            return []
        s = t.Vector(o)
        return [self.Table(t.Bytes, t.Indirect(s + 4 * i)) for i in range(t.VectorLen(o))]

    def nums(self, t, slot, flags):
        o = t.Offset(4 + 2 * slot)
        if not o:
            return None
        s = t.Vector(o)
        return [t.Get(flags, s + flags.bytewidth * i) for i in range(t.VectorLen(o))]

    def string(self, t, slot):
        o = t.Offset(4 + 2 * slot)
        return t.String(o + t.Pos).decode() if o else None

    def strings(self, t, slot):
        o = t.Offset(4 + 2 * slot)
        if not o:
            return []
        s = t.Vector(o)
        return [t.String(s + 4 * i).decode() for i in range(t.VectorLen(o))]

    def scalar(self, t, slot, flags, default=0):
        o = t.Offset(4 + 2 * slot)
        return t.Get(flags, o + t.Pos) if o else default


SD_DTYPES = {1: ("bool", "?"), 3: ("float16", "e"), 5: ("float32", "f"), 6: ("float64", "d"),
             7: ("int8", "b"), 8: ("int16", "h"), 9: ("int32", "i"), 10: ("int64", "q"),
             11: ("uint8", "B"), 12: ("uint16", "H"), 13: ("uint32", "I"),
             14: ("uint64", "Q"), 50: ("string", None)}
ROLES = ["variable", "constant", "array", "placeholder", "sequence"]


def samediff_decode(path):
    """The variables with arrays (or declared shapes), the nodes and the
    placeholders of a FlatGraph file."""
    fb = FB()
    N = fb.N
    with open(path, "rb") as f:
        buf = bytearray(f.read())
    g = fb.root(buf)
    ids, tensors = {}, {}
    for v in fb.tables(g, 1):
        name = fb.string(v, 1)
        idp = fb.sub(v, 0)
        ids[(fb.scalar(idp, 0, N.Int32Flags), fb.scalar(idp, 1, N.Int32Flags))] = name
        vt = fb.scalar(v, 6, N.Int8Flags)
        arr = fb.sub(v, 4)
        if arr is None:
            shape = fb.nums(v, 3, N.Int64Flags)
            if shape is not None or vt == 3:
                tensors[name] = {"role": ROLES[vt], "shape": shape or [], "values": None,
                                 "dtype": SD_DTYPES[fb.scalar(v, 2, N.Int8Flags)][0]}
            continue
        si = fb.nums(arr, 0, N.Int64Flags)
        rank = si[0]
        dims = si[1:1 + rank]
        raw = fb.nums(arr, 1, N.Uint8Flags)
        dt = fb.scalar(arr, 2, N.Int8Flags)
        name_dt, code = SD_DTYPES[dt]
        if raw is None:  # an empty array
            dims = dims if rank else [0]
            values = []
        elif code is None:
            values = "string"
        else:
            order = ">" if fb.scalar(arr, 3, N.Int8Flags) == 1 else "<"
            n = len(raw) // struct.calcsize(code)
            values = list(struct.unpack(order + code * n, bytes(raw)))
        tensors[name] = {"role": ROLES[vt], "shape": dims, "values": values, "dtype": name_dt,
                         "raw": bytes(raw or b"")}
    nodes = []
    for n in fb.tables(g, 2):
        ins = [ids[(fb.scalar(p, 0, N.Int32Flags), fb.scalar(p, 1, N.Int32Flags))]
               for p in fb.tables(n, 6)]
        nodes.append({"name": fb.string(n, 1), "op": fb.string(n, 16), "inputs": ins,
                      "outputs": fb.strings(n, 15),
                      "opNum": str(fb.scalar(n, 3, N.Int64Flags))})
    return tensors, nodes, fb.strings(g, 5)


class ReadersGraph(TmpDirCase):
    def assert_params(self, doc, params):
        got = {t["name"]: t for t in doc["tensors"]}
        for name, dims, data, ng in params:
            t = got[name]
            self.assertEqual(t["dtype"], "float32")
            self.assertEqual(t["shape"], dims)
            self.assertEqual(t["role"], "parameter")
            self.assertEqual(len(t["values"]), len(data))
            for a, b in zip(t["values"], data):
                self.assertEqual(a, b, name)
            self.assertEqual(doc["metadata"]["need_grad:" + name], "true" if ng else "false")

    def test_nnp_lenet(self):
        path = shared("nnabla", "lenet_010000.nnp")
        with zipfile.ZipFile(path) as z:
            params = nnabla_params(z.read("parameter.protobuf"))
        self.assertEqual(len(params), 8)
        doc = inspect(path)
        self.assertEqual(doc["format"], "nnp")
        self.assert_params(doc, params)
        self.assertEqual([t["name"] for t in doc["tensors"][:8]], [p[0] for p in params])
        g = doc["graph"]
        self.assertEqual(g["name"], "runtime")
        self.assertEqual(g["inputs"], ["x"])
        self.assertEqual(g["outputs"], ["y"])
        self.assertEqual(g["attrs"]["batch_size"], "128")
        self.assertEqual([n["op"] for n in g["nodes"]],
                         ["MulScalar", "Convolution", "MaxPooling", "ReLU", "Convolution",
                          "MaxPooling", "ReLU", "Affine", "ReLU", "Affine"])
        conv = g["nodes"][1]
        self.assertEqual(conv["inputs"], ["MulScalar_Output", "conv1/conv/W", "conv1/conv/b"])
        self.assertEqual(conv["attrs"]["pad"], "[0,0]")
        self.assertEqual(conv["attrs"]["dilation"], "[1,1]")
        self.assertEqual(g["nodes"][9]["outputs"], ["y"])
        x = next(t for t in doc["tensors"] if t["name"] == "x")
        self.assertEqual(x["shape"], [-1, 1, 28, 28])
        self.assertEqual(x["role"], "buffer")
        self.assertFalse(x["has_data"])
        self.assertIsNone(x["elements"])

    def test_nnp_h5_variant(self):
        try:
            import h5py
            import numpy as np
        except ImportError:
            raise unittest.SkipTest("python3-h5py is not installed")
        src = shared("nnabla", "lenet_010000.nnp")
        with zipfile.ZipFile(src) as z:
            params = nnabla_params(z.read("parameter.protobuf"))
            network = z.read("network.nntxt")
        h5 = os.path.join(self.dir, "parameter.h5")
        # As nnabla's _h5_parameter_file_saver writes it (FORMAT-FACTS 4.3),
        # but created in reverse so that only 'index' gives the order.
        with h5py.File(h5, "w") as f:
            for i in reversed(range(len(params))):
                name, dims, data, ng = params[i]
                ds = f.create_dataset(name, data=np.array(data, dtype="<f4").reshape(dims))
                ds.attrs["need_grad"] = ng
                ds.attrs["index"] = np.int64(i)
        doc = inspect(h5)
        self.assertEqual(doc["format"], "nnp")
        self.assertEqual([t["name"] for t in doc["tensors"]], [p[0] for p in params])
        self.assert_params(doc, params)
        nnp = os.path.join(self.dir, "lenet_h5.nnp")
        with zipfile.ZipFile(nnp, "w") as z:
            z.writestr("nnp_version.txt", "0.1\n")
            z.writestr("network.nntxt", network)
            z.write(h5, "parameter.h5")
        doc = inspect(nnp)
        self.assert_params(doc, params)
        self.assertEqual(doc["metadata"]["parameter_file"], "parameter.h5")
        self.assertEqual(len(doc["graph"]["nodes"]), 10)

    def test_samediff_files(self):
        folder = shared("samediff")
        files = sorted(f for f in os.listdir(folder) if f.endswith(".fb"))
        self.assertEqual(len(files), 20)
        for f in files:
            path = os.path.join(folder, f)
            tensors, nodes, placeholders = samediff_decode(path)
            doc = inspect(path)
            self.assertEqual(doc["format"], "samediff", f)
            got = {t["name"]: t for t in doc["tensors"]}
            self.assertEqual(set(got), set(tensors), f)
            for name, want in tensors.items():
                t = got[name]
                self.assertEqual(t["role"], want["role"], (f, name))
                self.assertEqual(t["dtype"], want["dtype"], (f, name))
                self.assertEqual(t["shape"], want["shape"], (f, name))
                self.assertEqual(t["has_data"], want["values"] is not None, (f, name))
                if want["values"] is None:
                    self.assertFalse(t.get("values"), (f, name))
                elif want["values"] == "string":
                    # The string's bytes end the buffer, after its header.
                    for s in t["values"]:
                        self.assertTrue(want["raw"].endswith(s.encode()), (f, name))
                else:
                    self.assertEqual(len(t["values"]), len(want["values"]), (f, name))
                    for a, b in zip(t["values"], want["values"]):
                        self.assertEqual(a, b, (f, name))
            g = doc["graph"]
            self.assertEqual(g["inputs"], placeholders, f)
            self.assertEqual(len(g["nodes"]), len(nodes), f)
            for a, b in zip(g["nodes"], nodes):
                self.assertEqual(a["name"], b["name"], f)
                self.assertEqual(a["op"], b["op"], f)
                self.assertEqual(a["inputs"], b["inputs"], (f, a["name"]))
                self.assertEqual(a["outputs"], b["outputs"], (f, a["name"]))
                self.assertEqual(a["attrs"]["opNum"], b["opNum"], f)

    def test_samediff_pad_1d_facts(self):
        doc = inspect(shared("samediff", "pad_1D.fb"))
        t = {x["name"]: x for x in doc["tensors"]}
        # FORMAT-FACTS 3.2, decoded by others.
        for a, b in zip(t["in_0"]["values"],
                        [0.7787856, 0.8011978, 0.7243747, 0.2308943, 0.7271413]):
            self.assertAlmostEqual(a, b, places=6)
        self.assertEqual(t["in_2"]["values"], [10.0])
        self.assertEqual(t["in_2"]["shape"], [])
        self.assertEqual(t["in_1"]["dtype"], "int32")
        self.assertTrue(t["in_1"]["big_endian"])
        self.assertEqual(doc["graph"]["nodes"][0]["attrs"]["opNum"], "3562692701058070261")

    def test_samediff_zip_newest_tag(self):
        import flatbuffers
        src = shared("samediff", "pad_1D.fb")
        with open(src, "rb") as f:
            graph = f.read()
        # params/0.fb: a FlatArray root (0 shape, 1 buffer, 2 dtype, 3 byteOrder) holding
        # in_0 = [1, 2, 3, 4, 5] as big-endian float32, built with flatbuffers.Builder.
        b = flatbuffers.Builder(256)
        data = struct.pack(">5f", 1, 2, 3, 4, 5)
        buf = b.CreateByteVector(data)
        shape_info = [1, 5, 1, 8192, 1, 99]
        b.StartVector(8, len(shape_info), 8)
        for v in reversed(shape_info):
            b.PrependInt64(v)
        shape = b.EndVector()
        b.StartObject(4)
        b.PrependUOffsetTRelativeSlot(0, shape, 0)
        b.PrependUOffsetTRelativeSlot(1, buf, 0)
        b.PrependInt8Slot(2, 5, 0)
        b.PrependInt8Slot(3, 1, 0)
        b.Finish(b.EndObject())
        path = os.path.join(self.dir, "model.zip")
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("tags.txt", "epoch1\nepoch2\n")
            z.writestr("epoch1/graph.fb", graph)
            z.writestr("epoch2/graph.fb", graph)
            z.writestr("epoch2/params.txt", "in_0 0\n")
            z.writestr("epoch2/params/0.fb", bytes(b.Output()))
        doc = inspect(path)
        self.assertEqual(doc["format"], "samediff")
        self.assertEqual(doc["metadata"]["tag"], "epoch2")
        self.assertEqual(doc["metadata"]["tags"], "epoch1,epoch2")
        t = {x["name"]: x for x in doc["tensors"]}
        self.assertEqual(t["in_0"]["values"], [1.0, 2.0, 3.0, 4.0, 5.0])
        self.assertEqual(t["in_2"]["values"], [10.0])

    def test_hostile_files_fail_cleanly(self):
        cases = []
        p = os.path.join(self.dir, "escape.nnp")
        with zipfile.ZipFile(p, "w") as z:
            z.writestr("network.nntxt", "network { name: \"n\" }\n")
            z.writestr("../x", "boo")
        cases.append((p, "unsafe name"))
        p = os.path.join(self.dir, "bomb.nnp")
        with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("network.nntxt", "a { " * 100000)
        cases.append((p, "nested deeper"))
        p = os.path.join(self.dir, "count.nnp")
        body = b"\x0a\x01w" + b"\xa2\x01\x04\x0a\x02\x02\x03" + b"\xa2\x06\x08" + b"\0" * 8
        with zipfile.ZipFile(p, "w") as z:
            z.writestr("parameter.protobuf", b"\xc2\x0c" + bytes([len(body)]) + body)
        cases.append((p, "tensor 'w': 2 values for shape [2,3] of 6 elements"))
        p = os.path.join(self.dir, "short.fb")
        with open(shared("samediff", "pad_1D.fb"), "rb") as f:
            data = f.read()
        with open(p, "wb") as f:
            f.write(data[:700])
        cases.append((p, "past the end"))
        p = os.path.join(self.dir, "vec.fb")
        # The root table's vtable offset pointed far outside the file.
        root = struct.unpack_from("<I", data, 0)[0]
        bad = bytearray(data)
        struct.pack_into("<i", bad, root, -0x7000000)
        with open(p, "wb") as f:
            f.write(bad)
        cases.append((p, "vtable"))
        for path, want in cases:
            r = inspect(path, check=1)
            self.assertIn(path, r.stderr)
            self.assertIn(want, r.stderr)
            self.assertNotIn("Sanitizer", r.stderr)


if __name__ == "__main__":
    unittest.main()
