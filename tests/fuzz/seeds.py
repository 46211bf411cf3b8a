"""Writes seed inputs for the fuzz targets into OUT/<target>/: small valid
files of every format made by numpy and the test writers, and the real
files under $CK_SHARED_DATA when it is there. Usage: seeds.py OUT"""
import io
import json
import os
import struct
import sys
import zipfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckpt_formats import TfTensor, safetensors_bytes, safetensors_from_numpy  # noqa: E402
from ckpt_formats import snappy, write_tf_bundle  # noqa: E402


def put(out, target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def npy(a, version=(1, 0)):
    b = io.BytesIO()
    np.lib.format.write_array(b, a, version=version)
    return b.getvalue()


def tf_seed(tmp, name, tensors, **kw):
    prefix = os.path.join(tmp, name)
    write_tf_bundle(prefix, tensors, **kw)
    with open(prefix + ".index", "rb") as f:
        index = f.read()
    with open(prefix + ".data-00000-of-00001", "rb") as f:
        data = f.read()
    return struct.pack("<I", len(index)) + index + data


def nnp_seeds(out, shared):
    """NNabla text, and an .nnp with a hand-encoded parameter.protobuf."""
    text = (b'network { name: "n" batch_size: 2\n'
            b'  variable { name: "x" type: "Buffer" shape { dim: -1 dim: 2 } }\n'
            b'  variable { name: "w" type: "Parameter" shape { dim: 2 dim: 1 } }\n'
            b'  variable { name: "y" type: "Buffer" shape { dim: -1 dim: 1 } }\n'
            b'  function { name: "A" type: "Affine" input: "x" input: "w" output: "y"\n'
            b'    affine_param { base_axis: 1 } } }\n'
            b'executor { name: "e" network_name: "n" data_variable { variable_name: "x" }\n'
            b'  output_variable { variable_name: "y" } parameter_variable { variable_name: "w" } }\n')
    put(out, "nntxt", "small", text)
    body = (b"\x0a\x01w" + b"\xa2\x01\x04\x0a\x02\x02\x01" + b"\xa2\x06\x08" +
            struct.pack("<2f", 0.5, -1) + b"\xa8\x06\x01")
    pb = b"\xc2\x0c" + bytes([len(body)]) + body
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        z.writestr("nnp_version.txt", "0.1\n")
        z.writestr("network.nntxt", text)
        z.writestr("parameter.protobuf", pb)
    put(out, "nnp", "small", b.getvalue())
    try:
        import h5py
    except ImportError:
        h5py = None
    if h5py is not None:  # the parameter.h5 variant, as nnabla writes it
        h5 = io.BytesIO()
        with h5py.File(h5, "w") as f:
            d = f.create_dataset("w", data=np.array([[0.5], [-1]], dtype="<f4"))
            d.attrs["need_grad"] = True
            d.attrs["index"] = np.int64(0)
        b = io.BytesIO()
        with zipfile.ZipFile(b, "w") as z:
            z.writestr("network.nntxt", text)
            z.writestr("parameter.h5", h5.getvalue())
        put(out, "nnp", "small_h5", b.getvalue())
    lenet = os.path.join(shared or "", "nnabla", "lenet_010000.nnp")
    if shared and os.path.exists(lenet):
        with zipfile.ZipFile(lenet) as z:
            put(out, "nntxt", "lenet", z.read("network.nntxt"))


def pt_seeds(out):
    """The pickles (data.pkl) fuzz_pt wraps in a torch.save zip: written by
    torch when it is installed (storages of at most 64 bytes, keys 0 to 2),
    and by hand in torch 1.13's layout."""
    from torch_gen import tensor_pickle
    put(out, "pt", "hand", tensor_pickle(numel=16, size=(4, 4), stride=(1, 4)))
    try:
        import torch
    except ImportError:
        return
    base = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    objs = {
        "views": {"a": base, "t": base.t(), "row": base[1], "i": torch.tensor([1, -2])},
        "nested": {"model": {"w": base}, "optimizer": {"state": {0: {"step": 3}},
                   "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0]}]},
                   "epoch": 3, "name": "x", "none": None},
        "dtypes": {"h": torch.ones(4, dtype=torch.float16), "b": torch.ones(4, dtype=torch.bool),
                   "bf": torch.ones(2, dtype=torch.bfloat16)},
    }
    for name, obj in objs.items():
        b = io.BytesIO()
        torch.save(obj, b)
        with zipfile.ZipFile(b) as z:
            pkl = next(n for n in z.namelist() if n.endswith("/data.pkl"))
            put(out, "pt", name, z.read(pkl))


def onnx_seeds(out):
    """Small ONNX models: torch exports when torch is installed, else helpers."""
    try:
        import onnx
        from onnx import helper, TensorProto
    except ImportError:
        return
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1, 2, 3, 4])
    shape = helper.make_tensor("s", TensorProto.INT64, [2], [1, 4])
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"], name="fc", transB=1, alpha=0.5),
             helper.make_node("Shape", ["h"], ["hs"]),
             helper.make_node("Reshape", ["h", "s"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                          initializer=[w, shape])
    put(out, "onnx", "helper", helper.make_model(g).SerializeToString())
    # the ops and lowerings added for ONNX's conformance suite (issue 35)
    fv = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    extra = {
        "lstm": ([helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh", "yc"], hidden_size=2,
                                   direction="bidirectional")],
                 [fv("x", [3, 1, 2]), fv("W", [2, 8, 2]), fv("R", [2, 8, 2]), fv("B", [2, 16])],
                 [fv("y", [3, 2, 1, 2])]),
        "gru": ([helper.make_node("GRU", ["x", "W", "R"], ["", "yh"], hidden_size=2, layout=1,
                                  linear_before_reset=1)],
                [fv("x", [1, 3, 2]), fv("W", [1, 6, 2]), fv("R", [1, 6, 2])], [fv("yh", [1, 1, 2])]),
        "convt": ([helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[3, 2],
                                    output_shape=[10, 8], group=1)],
                  [fv("x", [1, 1, 3, 3]), fv("w", [1, 2, 3, 3])], [fv("y", [1, 2, 10, 8])]),
        "grid": ([helper.make_node("GridSample", ["x", "g"], ["y"], mode="bicubic",
                                   padding_mode="reflection")],
                 [fv("x", [1, 1, 3, 3]), fv("g", [1, 2, 2, 2])], [fv("y", [1, 1, 2, 2])]),
        "clip_max_mean": ([helper.make_node("Clip", ["x", "lo", ""], ["c"]),
                           helper.make_node("Max", ["c", "x", "lo"], ["m"]),
                           helper.make_node("Mean", ["m", "x"], ["y"])],
                          [fv("x", [2, 3]), fv("lo", [])], [fv("y", [2, 3])]),
        "layernorm3": ([helper.make_node("LayerNormalization", ["x", "s"], ["y", "mu", "inv"],
                                         axis=-2)],
                       [fv("x", [2, 3, 4]), fv("s", [3, 4])], [fv("y", [2, 3, 4])]),
        "d2s_pool": ([helper.make_node("DepthToSpace", ["x"], ["d"], blocksize=2, mode="CRD"),
                      helper.make_node("MaxPool", ["d"], ["y"], kernel_shape=[3, 3],
                                       auto_pad="SAME_LOWER", strides=[2, 2])],
                     [fv("x", [1, 8, 2, 3])], [fv("y", [1, 2, 2, 3])]),
        "pool1d_reduce": ([helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[2],
                                            pads=[1, 0]),
                           helper.make_node("ReduceLogSumExp", ["p"], ["y"], axes=[-1],
                                            keepdims=0)],
                          [fv("x", [1, 2, 5])], [fv("y", [1, 2])]),
        # masks and selection (issues 30 and 35): GPT's causal mask, ViT's
        # class-token Expand, and the ops on data
        "causal_mask": ([helper.make_node("Range", ["z", "t", "o"], ["i"]),
                         helper.make_node("Unsqueeze", ["i", "a0"], ["r"]),
                         helper.make_node("Unsqueeze", ["i", "a1"], ["c"]),
                         helper.make_node("Greater", ["r", "c"], ["m"]),
                         helper.make_node("Cast", ["m"], ["mb"], to=TensorProto.BOOL),
                         helper.make_node("Where", ["mb", "ninf", "x"], ["y"])],
                        [fv("x", [1, 4, 4])], [fv("y", [1, 4, 4])]),
        "select": ([helper.make_node("Expand", ["x", "es"], ["e"]),
                    helper.make_node("Tile", ["e", "tr"], ["t"]),
                    helper.make_node("Trilu", ["t", "k"], ["u"], upper=0),
                    helper.make_node("CumSum", ["u", "ax"], ["s"], exclusive=1, reverse=1),
                    helper.make_node("LessOrEqual", ["s", "x"], ["le"]),
                    helper.make_node("Not", ["le"], ["n"]),
                    helper.make_node("Xor", ["n", "le"], ["xo"]),
                    helper.make_node("Where", ["xo", "s", "x"], ["y"])],
                   [fv("x", [2, 1, 3])], [fv("y", [2, 2, 3])]),
        "resize_argmax": ([helper.make_node("Resize", ["x", "", "sc"], ["r"], mode="cubic",
                                            coordinate_transformation_mode="align_corners",
                                            exclude_outside=1),
                           helper.make_node("ArgMax", ["r"], ["y"], axis=-1, keepdims=0)],
                          [fv("x", [1, 1, 3, 4])], [fv("y", [1, 1, 6])]),
        # dtypes: casts between float, float16 and integers, integer arithmetic
        "ints_casts": ([helper.make_node("Mul", ["x", "ten"], ["xs"]),
                        helper.make_node("Cast", ["xs"], ["xi"], to=TensorProto.INT32),
                        helper.make_node("Div", ["xi", "three"], ["q"]),
                        helper.make_node("Mod", ["xi", "three"], ["r"]),
                        helper.make_node("Pow", ["q", "two"], ["p2"]),
                        helper.make_node("ReduceSum", ["p2"], ["s"], keepdims=1),
                        helper.make_node("Sub", ["r", "s"], ["d"]),
                        helper.make_node("Cast", ["d"], ["dh"], to=TensorProto.FLOAT16),
                        helper.make_node("Cast", ["dh"], ["y"], to=TensorProto.FLOAT)],
                       [fv("x", [2, 3])], [fv("y", [2, 3])]),
        "topk": ([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=0),
                  helper.make_node("TopK", ["v", "k"], ["y", "j"], axis=-1)],
                 [fv("x", [2, 4, 3])], [fv("y", [2, 2, 2])]),
        "einsum": ([helper.make_node("Einsum", ["q", "k"], ["s"], equation="bhqd,bhkd->bhqk"),
                    helper.make_node("Einsum", ["s"], ["y"], equation="bhqk->bkq")],
                   [fv("q", [1, 2, 3, 4]), fv("k", [1, 2, 5, 4])], [fv("y", [1, 5, 3])]),
    }
    extra["resize_argmax"][0].insert(0, helper.make_node(
        "Constant", [], ["sc"], value=helper.make_tensor("sc", TensorProto.FLOAT, [4],
                                                         [1, 1, 2, 1.5])))
    consts = {"causal_mask": [("z", 0), ("t", 4), ("o", 1), ("a0", [0]), ("a1", [1])],
              "topk": [("k", [2])],
              "select": [("es", [2, 1, 3]), ("tr", [1, 2, 1]), ("k", 1), ("ax", -1)]}
    for name, cs in consts.items():
        nodes = extra[name][0]
        for k, v in reversed(cs):
            nodes.insert(0, helper.make_node("Constant", [], [k], value=helper.make_tensor(
                k, TensorProto.INT64, [len(v)] if isinstance(v, list) else [],
                v if isinstance(v, list) else [v])))
    for k, v, t in (("ten", 10.0, TensorProto.FLOAT), ("three", 3, TensorProto.INT32),
                    ("two", 2, TensorProto.INT32)):
        extra["ints_casts"][0].insert(0, helper.make_node("Constant", [], [k], value=helper.make_tensor(
            k, t, [], [v])))
    extra["causal_mask"][0].insert(0, helper.make_node("Constant", [], ["ninf"],
                                                       value=helper.make_tensor(
                                                           "ninf", TensorProto.FLOAT, [],
                                                           [float("-inf")])))
    for name, (nodes, ins, outs) in extra.items():
        g = helper.make_graph(nodes, name, ins, outs)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        put(out, "onnx", "issue35_" + name, m.SerializeToString())
    # shape values (issue 30): a dynamic batch's Shape -> Gather -> Unsqueeze ->
    # Concat -> Reshape, Div, Range of positions, ConstantOfShape, a computed
    # Slice end and Expand, as torch's dynamic exports write them
    i64 = lambda k, v: helper.make_node("Constant", [], [k], value=helper.make_tensor(  # noqa: E731
        k, TensorProto.INT64, [len(v)] if isinstance(v, list) else [],
        v if isinstance(v, list) else [v]))
    dyn = [helper.make_node("Shape", ["x"], ["s"]), i64("i0", 0),
           helper.make_node("Gather", ["s", "i0"], ["n"], axis=0), i64("a0", [0]),
           helper.make_node("Unsqueeze", ["n", "a0"], ["nv"]), i64("c32", [3, 2]),
           helper.make_node("Concat", ["nv", "c32"], ["shape"], axis=0),
           helper.make_node("Reshape", ["x", "shape"], ["xr"]), i64("z", 0), i64("o", 1),
           i64("two", 2), helper.make_node("Range", ["z", "n", "o"], ["pos"]),
           helper.make_node("Div", ["n", "two"], ["half"]),
           helper.make_node("Mul", ["pos", "half"], ["ph"]),
           helper.make_node("Cast", ["ph"], ["pf"], to=TensorProto.FLOAT), i64("a12", [1, 2]),
           helper.make_node("Unsqueeze", ["pf", "a12"], ["p3"]),
           helper.make_node("Add", ["xr", "p3"], ["y"]), i64("st", [0]), i64("a1", [1]),
           helper.make_node("Slice", ["x", "st", "nv", "a1"], ["zz"]),
           helper.make_node("ConstantOfShape", ["shape"], ["w"],
                            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])),
           helper.make_node("Expand", ["w", "shape"], ["we"])]
    dv = lambda n, r: helper.make_tensor_value_info(n, TensorProto.FLOAT,  # noqa: E731
                                                    ["N"] + [None] * (r - 1))
    g = helper.make_graph(dyn, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     ["N", 6])],
                          [dv("y", 3), dv("zz", 2), dv("we", 3)])
    put(out, "onnx", "issue30_dynamic", helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    try:
        import torch_gen
        models = torch_gen.onnx_models()
    except Exception:
        return
    for name, (m, x) in models.items():
        b = io.BytesIO()
        torch_gen.export_onnx(m, x, b)
        put(out, "onnx", name, b.getvalue())


def mldef_seeds(out):
    """fuzz_mldef: manifests over the fixed files the target writes beside
    them (data/w000.float32 of 256 points, data/w001.float64 of 64, a csv,
    tests/case0x.float32 of 16 points, tests/case0y.float32 of 8)."""
    def dense(i, prior, w, b, start, count, shape, out_name, caps="feed-forward,dense"):
        layer = {"Name": "layer %d" % i, "Op": "dense", "Capabilities": caps, "Prior": prior,
                 "Inputs": [prior, w] + ([b[0]] if b else []), "Outputs": [out_name],
                 "DataSource": "w000", "StartIndex": start, "Count": count,
                 "Weights": [{"Name": w, "Shape": shape}] + ([{"Name": b[0], "Shape": b[1]}] if b else []),
                 "Params": {"TransW": True}}
        return layer
    mlp = {"Format": "mldef", "FormatVersion": 1,
           "Model": {"Name": "model", "Description": "fuzz", "Source": "layers"},
           "DataFiles": [{"Name": "w000", "Path": "data/w000.float32", "StorageBytes": 4,
                          "StorageFormat": "float"}],
           "NodeRanges": [{"Name": "x", "Type": "input", "Count": 4, "Shape": [-1, 4]},
                          {"Name": "output", "Type": "output", "Count": 2, "Shape": [-1, 2]}],
           "Layers": [{"Name": "x", "Capabilities": "input", "Count": 4, "Shape": [-1, 4]},
                      dense(0, "x", "fc1.weight", ("fc1.bias", [3]), 0, 15, [3, 4], "layer0"),
                      {"Name": "layer 1", "Op": "relu", "Capabilities": "feed-forward,activation",
                       "Prior": "layer0", "Inputs": ["layer0"], "Outputs": ["layer1"]},
                      dense(2, "layer1", "fc2.weight", None, 15, 6, [2, 3], "layer2"),
                      {"Name": "layer 3", "Op": "softmax",
                       "Capabilities": "feed-forward,activation,output", "Prior": "layer2",
                       "Inputs": ["layer2"], "Outputs": ["output"]}]}
    put(out, "mldef", "mlp", json.dumps(mlp).encode())
    full = json.loads(json.dumps(mlp))
    full["Model"]["LicenseFile"] = "license.txt"
    full["DataFiles"] += [{"Name": "w001", "Path": "data/w001.float64", "StorageBytes": 8,
                           "StorageFormat": "float"},
                          {"Name": "w003", "Path": "data/w003.csv", "StorageBytes": 8,
                           "StorageFormat": "float"}]
    full["Tests"] = [{"Name": "case0",
                      "Inputs": [{"NodeRange": "x", "Path": "tests/case0x.float32"}],
                      "Outputs": [{"NodeRange": "output", "Path": "tests/case0y.float32"}],
                      "Tolerance": 1e-5}]
    put(out, "mldef", "tests", json.dumps(full, indent=1).encode())
    # after a NUL: the SIGNATURE (a well-formed one whose digests do not match)
    put(out, "mldef", "signed", json.dumps(mlp).encode() + b"\0mldef-signature 1\n" +
        b"".join(b"sha256 %s %s\n" % (b"0" * 64, n) for n in
                 (b"data/w000.float32", b"manifest.json")) +
        b"ed25519 " + b"1" * 64 + b" " + b"2" * 128 + b"\n")


def zip_seeds(out):
    """fuzz_zip: archives as the zip-based formats write them: stored and
    deflated members, a folder, a data descriptor (a streamed member), zip64
    extra fields, an empty archive."""
    def make(name, members, **kw):
        b = io.BytesIO()
        with zipfile.ZipFile(b, "w", **kw) as z:
            for n, data, method in members:
                z.writestr(zipfile.ZipInfo(n, (2024, 1, 1, 0, 0, 0)), data, method)
        put(out, "zip", name, b.getvalue())
    st, dfl = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED
    make("stored", [("manifest.json", b'{"a": 1}', st), ("data/w.float32", bytes(64), st)])
    make("deflated", [("graph.fb", bytes(range(256)) * 4, dfl), ("tags.txt", b"e1\ne2\n", dfl)])
    make("folder", [("e1/", b"", st), ("e1/params.txt", b"w e1/0\n", st)])
    make("empty", [])
    b = io.BytesIO()  # a member written as a stream: sizes in a data descriptor
    with zipfile.ZipFile(b, "w") as z:
        with z.open("stream.bin", "w", force_zip64=True) as f:
            f.write(bytes(100))
    put(out, "zip", "descriptor-zip64", b.getvalue())
    # hostile layouts (issue 28): a local header naming another path than the
    # directory, two directory entries over one member, a directory out of order
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        z.writestr(zipfile.ZipInfo("manifest.json", (2024, 1, 1, 0, 0, 0)), b'{"a": 1}')
        z.writestr(zipfile.ZipInfo("data/w.float32", (2024, 1, 1, 0, 0, 0)), bytes(64))
    good = b.getvalue()
    put(out, "zip", "local-name-slip", good.replace(b"manifest.json", b"../../tmp/x.j", 1))
    cd = good.rindex(b"PK\x01\x02")  # the second directory record: its offset to 0
    put(out, "zip", "overlap", good[:cd + 42] + bytes(4) + good[cd + 46:])
    first = good.index(b"PK\x01\x02")
    eocd = good.rindex(b"PK\x05\x06")
    put(out, "zip", "out-of-order", good[:first] + good[cd:eocd] + good[first:cd] + good[eocd:])


def graph_i64(v):
    """fuzz_graph's i64: a byte under 0xf0 is an int8, else 8 bytes follow."""
    if -128 <= v < 0x70 and (v & 0xff) < 0xf0:
        return bytes([v & 0xff])
    return bytes([0xf0]) + (v & (1 << 64) - 1).to_bytes(8, "big")


def graph_bytes(inputs, nodes):
    """fuzz_graph's decoder in reverse: no weights; inputs as dims lists;
    nodes as (op, [value indices], ints, scalar or None)."""
    b = bytes([0, len(inputs) - 1])
    for dims in inputs:
        b += bytes([len(dims)]) + b"".join(graph_i64(d) for d in dims)
    b += bytes([len(nodes) - 1])
    for op, ins, ints, scalar in nodes:
        b += bytes([op - 1, len(ins)]) + bytes(ins)
        b += graph_i64(0) * 6 + graph_i64(0) * 4  # kernel, stride, dilation; pads
        b += bytes([128 if scalar is not None else 0, 0])
        b += bytes([int(scalar or 0) * 16 & 0xff]) + bytes(4)  # scalar, alpha, eps, min, max
        b += bytes([len(ints)]) + b"".join(graph_i64(v) for v in ints)
    return b


def graph_seeds(out):
    """fuzz_graph: byte strings its decoder reads as small valid graphs
    (weights, inputs, a chain of ops with their parameters)."""
    # shape values (docs/model.md; the op numbers of model/model.h's enum):
    # x [2, 6] reshaped to shape(x)[0:1] * 6; a range of its size; a
    # constant_of_shape of its shape, cast; a slice with computed bounds
    SHAPE, SIZE, COS, RANGE, CAST, SLICE, RESHAPE, MUL = 109, 110, 111, 112, 108, 28, 22, 17
    F32 = 1  # cast's parameter: ONNX's TensorProto code (ck_op_cast_dtype)
    put(out, "graph", "shape_reshape", graph_bytes([[-1, 6]], [
        (SHAPE, [0], [], None), (SLICE, [1], [0, 1, 1], None), (MUL, [2], [], 6),
        (RESHAPE, [0, 3], [], None)]))
    put(out, "graph", "shape_range", graph_bytes([[2, 6]], [
        (SIZE, [0], [], None), (SHAPE, [0], [1, 2], None), (RANGE, [1, 1, 1], [], None),
        (CAST, [3], [F32], None)]))
    put(out, "graph", "shape_cos_slice", graph_bytes([[-1, 6]], [
        (SHAPE, [0], [], None), (COS, [1], [1], None), (CAST, [2], [F32], None),
        (SLICE, [0, 1, 1], [], None)]))
    for op in range(1, 113):  # every op up to range (model/model.h's enum)
        # 1 weight [3, 4]; 1 input [1, 4]; 2 nodes: op over (input, weight), then relu
        body = bytes([1, 2, 3, 4, 0, 2, 1, 4, 2, op, 2, 1, 0]) + bytes([1] * 12) + \
            bytes([0] * 4) + bytes([2, 0, 0, 0, 0, 0, 0, 0]) + bytes([9, 2, 1, 1, 0, 0])
        put(out, "graph", "op%02d" % op, body)


def yaml_seeds(out):
    """fuzz_yaml: configs as the README writes them, and metadata.yaml as
    the reference PMF implementation writes it."""
    put(out, "yaml", "config", b"""model: {name: mnist}
checkpoints:
  patterns: ['epoch_{epoch}.pt', 'checkpoint-{step}/']
  steps_per_epoch: 100
watch: {settle: 2s}
pack:
  formats: [mldef, samediff]
  graph:
    input: {name: x, shape: [-1, 12]}
    layers:
      - {op: dense, weight: fc1.weight, bias: fc1.bias}
      - {op: relu}
verify: {atol: 1e-4, timeout: 300s, max_memory: 8GiB}
upload:
  stores:
    - {url: 's3://bucket/runs/', region: eu-west-1, compress: zstd}
    - {url: 'https://dav.example/runs/', credentials: 'env:DAV_TOKEN', auth: bearer}
  multipart_threshold: 64MiB
hooks:
  webhooks: [{url: 'http://127.0.0.1:9/h', secret: 'env:SECRET', events: ['checkpoint.*']}]
  exec: [{event: training.finished, command: ['/bin/true', '{checkpoint}'], timeout: 30s}]
listen: 127.0.0.1:9464
nodes: {rank: 1, count: 4}
""")
    put(out, "yaml", "metadata", b"""id: 6c1f1e5e-9f9b-4d6e-8b1e-0f7c2a3b4d5e
status: running
start_time: 2026-11-27T10:00:00.000000Z
latest_time: 2026-11-27T11:00:00.000000Z
start_epoch: 1
latest_epoch: 2
latest: {name: epoch_2.pt, type: checkpoint}
checkpoints:
  - {epoch: 1, path: data/checkpoints/epoch_1.pt, md5: d41d8cd98f00b204e9800998ecf8427e,
     ref: {name: epoch_1.pt, type: checkpoint}}
  - {epoch: 2, path: data/checkpoints/epoch_2.pt, md5: 0cc175b9c0f1b6a831c399e269772661,
     ref: {name: epoch_2.pt, type: checkpoint}}
""")
    # a multi-node part manifest and commit record as ckptd writes them (agent/nodeparts.h)
    put(out, "yaml", "node-part", b"""format: ckptd-part/1
checkpoint: global_step100
step: 100
epoch: 100
node:
  rank: 0
  count: 2
training: running
settled: 1795889742.013000
files:
- path: global_step100/zero_pp_rank_0_mp_rank_00_optim_states.pt
  size: 1000
  md5: c0101aa154f8e0f51fc985ad22dc7910
  sha256: d11c2302fe815058b848db8468bd9f3eb056e7944c679ceb47f7280b31b0876e
""")
    put(out, "yaml", "node-commit", b"""format: ckptd-commit/1
checkpoint: global_step100
step: 100
epoch: 100
nodes: 2
settled: 1795889742.013000
parts:
- rank: 0
  md5: 9066010d5264ae8395b6b1392d2c7208
- rank: 1
  md5: 9b3f00f7ebb2bf189870840e438e3a1e
files:
- path: global_step100/zero_pp_rank_0_mp_rank_00_optim_states.pt
  size: 1000
  md5: c0101aa154f8e0f51fc985ad22dc7910
- path: global_step100/zero_pp_rank_1_mp_rank_00_optim_states.pt
  size: 1000
  md5: cab7b2c9bf7e5166bc123d75fe4e5060
""")


def requests_seeds(out):
    """fuzz_requests: ops endpoint requests (first byte < 0x80) and control
    request files (first byte >= 0x80, the rest is the file)."""
    for i, target in enumerate([b"/healthz", b"/readyz", b"/metrics", b"/status?x=1", b"/nope"]):
        put(out, "requests", "http%d" % i,
            bytes([7]) + b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    put(out, "requests", "head", b"\x03HEAD /metrics HTTP/1.0\n\n")
    for word in (b"finished", b"failed\n", b"running"):
        put(out, "requests", "control-" + word.strip().decode(), b"\x80" + word)


def samediff_seeds(out):
    """SameDiff graphs in the forms the reader maps: strided_slice's five
    masks then begins, ends, strides; the scalar "pow" beside the pairwise
    "Pow"; split_v with its axis named and its sizes empty."""
    try:
        import sdfb
        import flatbuffers  # noqa: F401
    except ImportError:
        return
    tmp = os.path.join(out, "tmp")
    os.makedirs(tmp, exist_ok=True)
    p = os.path.join(tmp, "slice.fb")
    nodes = [("strided_slice", "sl", ["input"], ["s"],
              {"__extraInteger": [0, 0, 2, 0, 0, 0, -1, 1, 2, 0, 5, 1, -2, 1]}),
             ("pow", "sq", ["s"], ["q"], {"pow": ("d", [2.0])}),
             ("Pow", "pp", ["q", "s"], ["r"], {}),
             ("split_v", "sp", ["r"], ["a", "b"], {"dimensions": ("l", [2])}),
             ("concat", "cat", ["b", "a"], ["out"], {"concatDimension": ("l", [2])})]
    sdfb.write_graph(p, {}, {"input": [2, 7, 5]}, nodes, ["out"])
    with open(p, "rb") as f:
        put(out, "samediff", "slice_pow_split", f.read())
    # depthwise_conv2d as ckptd writes it (weights reshaped and permuted in
    # the graph to wFormat 1) and as DL4J may (wFormat 0 and 2 stored), a
    # grouped conv as slices + conv2d + concat, a ceil-mode pool as the pool
    # with grown padding and a slice, hard_swish as scalar ops and a clip
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    conv = [3, 3, 1, 1, 1, 1, 1, 1, 0, 0]
    nodes = [("reshape", "r", ["w"], ["wr"], {"shape": ("l", [3, 2, 3, 3])}),
             ("permute", "t", ["wr"], ["wp"], {"permuteDims": ("l", [1, 0, 2, 3])}),
             ("depthwise_conv2d", "dw", ["input", "wp", "b"], ["d"],
              {"__extraInteger": conv + [1]}),
             ("maxpool2d", "mp", ["d"], ["m"],
              {"__extraInteger": [3, 3, 2, 2, 2, 0, 1, 1, 0, 0, 0]}),
             ("strided_slice", "cut", ["m"], ["c"],
              {"__extraInteger": [0, 0, 3, 0, 0, 0, 0, 1, 1, 0, 0, 5, 4, 1, 1, 1, 1]}),
             ("div_scalar", "hs1", ["c"], ["h1"], {"scalar": ("d", [6.0])}),
             ("add_scalar", "hs2", ["h1"], ["h2"], {"scalar": ("d", [0.5])}),
             ("clipbyvalue", "hs3", ["h2"], ["h3"],
              {"clipValueMin": ("d", [0.0]), "clipValueMax": ("d", [1.0])}),
             ("multiply", "hs", ["c", "h3"], ["out"], {})]
    p = os.path.join(tmp, "dw.fb")
    sdfb.write_graph(p, {"w": w, "b": b}, {"input": [1, 3, 8, 7]}, nodes, ["out"])
    with open(p, "rb") as f:
        put(out, "samediff", "depthwise_ceil_hardswish", f.read())
    w1 = w.reshape(3, 2, 3, 3).transpose(1, 0, 2, 3)  # [mC, iC, kH, kW]
    for wf, arr in ((0, w1.transpose(2, 3, 1, 0)), (2, w1.transpose(0, 2, 3, 1))):
        p = os.path.join(tmp, f"dw{wf}.fb")
        sdfb.write_graph(p, {"w": np.ascontiguousarray(arr), "b": b}, {"input": [1, 3, 5, 4]},
                         [("depthwise_conv2d", "dw", ["input", "w", "b"], ["out"],
                           {"__extraInteger": conv + [wf]})], ["out"])
        with open(p, "rb") as f:
            put(out, "samediff", f"depthwise_wformat{wf}", f.read())
    wg = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    nodes = []
    for k in range(2):
        nodes += [("strided_slice", f"x{k}", ["input"], [f"xs{k}"],
                   {"__extraInteger": [0, 0, 1, 0, 0, 0, 2 * k, 0, 2 * k + 2, 1, 1]}),
                  ("strided_slice", f"w{k}", ["w"], [f"ws{k}"],
                   {"__extraInteger": [0, 0, 0, 0, 0, 2 * k, 2 * k + 2, 1]}),
                  ("conv2d", f"c{k}", [f"xs{k}", f"ws{k}"], [f"y{k}"],
                   {"__extraInteger": conv + [1]})]
    nodes.append(("concat", "cat", ["y0", "y1"], ["out"], {"concatDimension": ("l", [1])}))
    p = os.path.join(tmp, "groups.fb")
    sdfb.write_graph(p, {"w": wg}, {"input": [1, 4, 5, 5]}, nodes, ["out"])
    with open(p, "rb") as f:
        put(out, "samediff", "groups_as_slices", f.read())
    # pad with its paddings a constant input [rank, 2] (libnd4j's form, what
    # ckptd writes), a where's operands broadcast by reshape + tile (repeats
    # as iArgs, and as a constant input) into libnd4j's Where
    consts = {"pads": np.array([[0, 0], [0, 0], [0, 1], [1, 1]], np.int64),
              "mask": np.triu(np.ones((4, 4), np.float32), 1),
              "fill": np.full((1, 1, 1, 1), -np.inf, np.float32),
              "reps": np.array([2, 1, 4, 4], np.int64)}
    nodes = [("pad", "pad", ["input", "pads"], ["p"],
              {"__extraInteger": [0], "padValue": ("d", [1.5])}),
             ("reshape", "mr", ["mask"], ["m4"], {"shape": ("l", [1, 1, 4, 4])}),
             ("tile", "mt", ["m4"], ["mb"], {"jaxis": ("l", [2, 1, 1, 1])}),
             ("tile", "ft", ["fill", "reps"], ["fb"], {}),
             ("Where", "w", ["mb", "fb", "p"], ["out"], {})]
    p = os.path.join(tmp, "where.fb")
    sdfb.write_graph(p, consts, {"input": [2, 1, 3, 2]}, nodes, ["out"])
    with open(p, "rb") as f:
        put(out, "samediff", "pad_tile_where", f.read())


def metrics_seeds(out):
    """fuzz_metrics: first byte (metric, step, by step or epoch), then the file."""
    put(out, "metrics", "jsonl", b"\x84" + b'{"step": 100, "epoch": 1, "val_loss": 0.5}\n'
        b'{"step": 200, "val_loss": 0.25}\n{"step": 300, "val_lo')
    put(out, "metrics", "csv", b"\x06" + b"epoch,loss,acc\n1,0.3,0.5\n2,0.2,0.9\n\"3\",,x\n")
    put(out, "metrics", "trainer_state", b"\x87" + b'{"global_step": 200, "log_history": '
        b'[{"step": 100, "eval_accuracy": 0.5}, {"step": 200, "eval_accuracy": 0.75}]}')
    put(out, "metrics", "name", b"\x00epoch=3-val_loss=0.12.ckpt\n")


def main(out):
    shared = os.environ.get("CK_SHARED_DATA", "")
    zip_seeds(out)
    graph_seeds(out)
    yaml_seeds(out)
    requests_seeds(out)
    metrics_seeds(out)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    put(out, "safetensors", "small", safetensors_from_numpy(
        {"a": a, "b": np.array([1, 2], dtype=np.int64), "c": np.array(True)}, {"k": "v"}))
    put(out, "safetensors", "f8", safetensors_bytes([("x", "F8_E4M3", [2], b"\x38\x7e"),
                                                     ("y", "BF16", [1], b"\x80\x3f")]))
    put(out, "npy", "v1", npy(a))
    put(out, "npy", "v2be", npy(a.astype(">f8"), (2, 0)))
    put(out, "npy", "v3f", npy(np.asfortranarray(a), (3, 0)))
    for compression, name in ((zipfile.ZIP_STORED, "stored"), (zipfile.ZIP_DEFLATED, "deflated")):
        b = io.BytesIO()
        with zipfile.ZipFile(b, "w", compression=compression) as z:
            z.writestr("a.npy", npy(a))
            z.writestr("b.npy", npy(np.array([1, 2], dtype=np.int8)))
        put(out, "npz", name, b.getvalue())
    tmp = os.path.join(out, "tmp")
    os.makedirs(tmp, exist_ok=True)
    ts = [TfTensor.from_numpy("w", a), TfTensor.from_numpy("step", np.array(3, dtype=np.int64)),
          TfTensor("s", "string", [2], strings=[b"ab", b""])]
    put(out, "tfbundle", "plain", tf_seed(tmp, "p", ts, block_size=64))
    if snappy is not None:
        put(out, "tfbundle", "snappy", tf_seed(tmp, "s", ts, compress=True))
    nnp_seeds(out, shared)
    put(out, "layers", "mlp", b"- {op: dense, weight: fc1.weight, bias: fc1.bias}\n"
        b"- {op: relu, name: h}\n- {op: linear, weight: fc2.weight}\n"
        b"- {op: add, from: [-1, -1]}\n- {op: softmax, axis: -1}\n")
    put(out, "layers", "cnn", b"input: {name: x, shape: [-1, 2, 9, 9]}\noutput: y\nlayers:\n"
        b"  - {op: conv2d, weight: c.weight, bias: c.bias, stride: [2, 1], padding: [1, 0, 1, 2]}\n"
        b"  - {op: batchnorm, weight: bn, bias: bn, mean: bn, var: bn, eps: 1e-3}\n"
        b"  - {op: maxpool, kernel: 2, ceil_mode: true}\n  - {op: flatten, axis: 1}\n"
        b"  - {op: reshape, shape: [0, -1, 2]}\n  - {op: transpose, perm: [0, 2, 1]}\n"
        b"  - {op: slice, slices: [[0, 9], [0, 1, 1]]}\n"
        b"  - {op: split, axis: 2, outputs: 2}\n  - {op: concat, from: [-1, -1], axis: 1}\n")
    pt_seeds(out)
    onnx_seeds(out)
    samediff_seeds(out)
    # fuzz_sdtests: set.txt, 0xff 0xfe, then the members the target fills
    put(out, "sdtests", "one_set", b"ckptd-test 1\ntolerance 0.001\ninput 0 x\noutput 0 y\n"
        b"\xff\xfe" b"t0/tests/rec0/inputs/0.fb\nt0/tests/rec0/outputs/0.fb\n")
    put(out, "sdtests", "two_sets", b"ckptd-test 1\ninput 0 x\ninput 1 m\noutput 0 y\n"
        b"\xff\xfe" b"t0/tests/rec0/inputs/0.fb\nt0/tests/rec0/inputs/1.fb\n"
        b"t0/tests/rec0/outputs/0.fb\nt0/tests/rec1/set.txt\nt1/tests/rec0/inputs/0.fb\n")
    # fuzz_awsresp: what a credentials service, STS or S3 answers, and the
    # AWS CLI's files
    put(out, "awsresp", "container", b'{"Code": "Success", "AccessKeyId": "ASIA\\u0041",\n'
        b' "SecretAccessKey": "s\\/k", "Token": "t\\"x", "Expiration": "2026-11-24T08:00:00Z"}')
    put(out, "awsresp", "sts", b"<AssumeRoleWithWebIdentityResponse><Credentials>"
        b"<AccessKeyId>ASIA</AccessKeyId><SecretAccessKey>a&amp;b&lt;</SecretAccessKey>"
        b"<SessionToken>t</SessionToken><Expiration>2026-11-24T09:00:00+01:00</Expiration>"
        b"</Credentials></AssumeRoleWithWebIdentityResponse>")
    put(out, "awsresp", "sso-cache", b'{"startUrl": "https://corp.awsapps.com/start", "region": '
        b'"eu-west-1", "accessToken": "aoa\\u0041b", "expiresAt": "2026-11-25T12:00:00UTC"}')
    put(out, "awsresp", "sso-portal", b'{"roleCredentials": {"accessKeyId": "ASIA", "secretAccessKey": '
        b'"s", "sessionToken": "t", "expiration": 1795507200000}}')
    put(out, "awsresp", "error", b"<Error><Code>ExpiredToken</Code><UploadId>u</UploadId></Error>")
    put(out, "awsresp", "list-parts", b"<ListPartsResult><UploadId>2~x</UploadId>"
        b"<NextPartNumberMarker>2</NextPartNumberMarker><IsTruncated>true</IsTruncated>"
        b"<Part><PartNumber>1</PartNumber><ETag>&quot;9e107d9d372bb6826bd81d3542a419d6&quot;</ETag>"
        b"<Size>5242880</Size></Part><Part><PartNumber>2</PartNumber><ETag>\"e4d9\"</ETag>"
        b"<Size>5242880</Size><ChecksumSHA256>47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=</ChecksumSHA256>"
        b"</Part></ListPartsResult>")
    put(out, "awsresp", "list-objects", b"<ListBucketResult><IsTruncated>true</IsTruncated>"
        b"<NextContinuationToken>1ue/x+y==</NextContinuationToken><Contents>"
        b"<Key>runs/r1/parts/s100/node-0-of-4.yaml</Key><ETag>&quot;0cc175b9c0f1b6a831c399e2697726"
        b"61&quot;</ETag><Size>412</Size></Contents><Contents><Key>runs/r1/a&amp;b</Key>"
        b"<Size>3</Size></Contents></ListBucketResult>")
    put(out, "awsresp", "ini", b"[default]\nregion = eu-west-1\naws_access_key_id=AKIA\n"
        b"[profile dev]\nendpoint_url = http://127.0.0.1:9000\ns3 =\n  max_concurrent_requests = 4\n"
        b"# comment\n; other\n")
    mldef_seeds(out)
    if shared and os.path.isdir(shared):
        for root, _, files in os.walk(shared):
            for f in files:
                p = os.path.join(root, f)
                with open(p, "rb") as fh:
                    data = fh.read()
                if f.endswith(".safetensors"):
                    put(out, "safetensors", f, data)
                elif f.endswith(".index"):
                    shard = p[:-len(".index")] + ".data-00000-of-00001"
                    rest = b""
                    if os.path.exists(shard):
                        with open(shard, "rb") as fh:
                            rest = fh.read()
                    put(out, "tfbundle", os.path.basename(root) + "_" + f,
                        struct.pack("<I", len(data)) + data + rest)


if __name__ == "__main__":
    main(sys.argv[1])
