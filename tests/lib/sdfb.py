"""SameDiff FlatBuffers for the tests, through code Debian's flatc generates
from tests/lib/samediff.fbs (DL4J's schema written from FORMAT-FACTS.md's
field ids) and Debian's python3-flatbuffers: an independent reader of what
ckptd writes, and a writer of source graphs shaped as SameDiff.save writes
them (variables with inline big-endian arrays)."""
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
_gen = None

# DL4J DType -> numpy big-endian dtype
NP = {1: "?", 3: ">f2", 5: ">f4", 6: ">f8", 7: "i1", 8: ">i2", 9: ">i4", 10: ">i8",
      11: "u1", 12: ">u2", 13: ">u4", 14: ">u8", 15: "i1", 16: ">i2"}
FLAGS = {1: 524288, 3: 4096, 5: 8192, 6: 16384, 7: 32768, 9: 131072, 10: 262144, 17: 2048}


def sd():
    """The generated package sd.graph (flatc runs once per process)."""
    global _gen
    if _gen is None:
        flatc = shutil.which("flatc")
        if not flatc:
            raise unittest.SkipTest("flatc (Debian flatbuffers-compiler) is not installed")
        out = tempfile.mkdtemp(prefix="ck-flatc-")
        subprocess.run([flatc, "--python", "--no-warnings", "-o", out,
                        os.path.join(HERE, "samediff.fbs")], check=True)
        sys.path.insert(0, out)
        _gen = importlib.import_module("sd.graph")
        for m in ("FlatGraph", "FlatArray", "FlatVariable", "FlatNode", "IntPair",
                  "FlatProperties"):
            setattr(_gen, m, importlib.import_module("sd.graph." + m))
    return _gen


def array_from_fb(arr):
    """A FlatArray table as a numpy array, checking DL4J's shape-info layout."""
    si = [arr.Shape(i) for i in range(arr.ShapeLength())]
    rank = si[0]
    assert len(si) == 2 * rank + 4, si
    dims = si[1:1 + rank]
    order = {99: "C", 102: "F"}[si[-1]]
    dt = arr.Dtype()
    if dt == 17:  # bfloat16: widen to float32
        raw = arr.BufferAsNumpy().tobytes() if arr.BufferLength() else b""
        u = np.frombuffer(raw, ">u2").astype(np.uint32) << 16
        return u.astype("<u4").view("<f4").reshape(dims, order=order)
    if not arr.BufferLength():
        return np.zeros(dims, NP[dt])
    assert arr.ByteOrder() == 1, "byteOrder must be BE"
    raw = arr.BufferAsNumpy().tobytes()
    return np.frombuffer(raw, NP[dt]).reshape(dims, order=order)


def read_array_file(data):
    g = sd()
    return array_from_fb(g.FlatArray.FlatArray.GetRootAs(data, 0))


def read_archive(path):
    """{tag: {"graph": FlatGraph, "params": {name: ndarray}, "refs": {name: "t/N"}}}
    following params.txt references with zipfile only; plus the tag order."""
    g = sd()
    out = {}
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        tags = z.read("tags.txt").decode("utf-8").splitlines()
        for tag in tags:
            graph = g.FlatGraph.FlatGraph.GetRootAs(z.read(f"{tag}/graph.fb"), 0)
            params, refs = {}, {}
            for line in z.read(f"{tag}/params.txt").decode("utf-8").splitlines():
                name, ref = line.rsplit(" ", 1)
                if "/" in ref:
                    other, num = ref.split("/")
                    assert tags.index(other) < tags.index(tag), line
                    refs[name] = ref
                else:
                    other, num = tag, ref
                params[name] = read_array_file(z.read(f"{other}/params/{num}.fb"))
            tc = g.FlatGraph.FlatGraph.GetRootAs(z.read(f"{tag}/trainingConfig.fb"), 0)
            config = json.loads(tc.TrainingConfig().decode() or "{}")
            updater = {}
            if f"{tag}/updater.txt" in z.namelist():
                keys = config["updaterStateKeys"]
                for line in z.read(f"{tag}/updater.txt").decode("utf-8").splitlines():
                    words = line.split(" ")
                    name, files = " ".join(words[:-len(keys[words[0]])]), words[-len(keys[words[0]]):]
                    updater[name] = {}
                    for key, ref in zip(keys[name], files):
                        other, num = ref.split("/") if "/" in ref else (tag, ref)
                        if other != tag:
                            assert tags.index(other) < tags.index(tag), line
                        updater[name][key] = read_array_file(z.read(f"{other}/updater/{num}.fb"))
            out[tag] = {"graph": graph, "params": params, "refs": refs, "config": config,
                        "updater": updater}
    return tags, out


def graph_variables(graph):
    """{name: FlatVariable}"""
    return {graph.Variables(i).Name().decode(): graph.Variables(i)
            for i in range(graph.VariablesLength())}


def graph_nodes(graph):
    """[(opName, name, {arg: values}, [input (first, second)], [output names])]"""
    res = []
    for i in range(graph.NodesLength()):
        n = graph.Nodes(i)
        args = {}
        for k in range(n.PropertiesLength()):
            p = n.Properties(k)
            if p.LLength():
                v = [p.L(j) for j in range(p.LLength())]
            elif p.DLength():
                v = [p.D(j) for j in range(p.DLength())]
            else:
                v = [bool(p.B(j)) for j in range(p.BLength())]
            args[p.Name().decode()] = v
        ins = [(n.InputPaired(k).First(), n.InputPaired(k).Second())
               for k in range(n.InputPairedLength())]
        outs = [n.OutputNames(k).decode() for k in range(n.OutputNamesLength())]
        res.append((n.OpName().decode(), n.Name().decode(), args, ins, outs))
    return res


# ---- writing source graphs (what SameDiff.save writes: one FlatGraph) ----

def _array(b, a, dtype=5):
    import flatbuffers  # noqa: F401
    a = np.ascontiguousarray(a)
    rank = a.ndim
    strides, st = [0] * rank, 1
    for i in reversed(range(rank)):
        strides[i] = st
        st *= a.shape[i]
    si = [rank, *a.shape, *strides, FLAGS[dtype], 1, 99]
    buf = b.CreateByteVector(a.astype(NP[dtype]).tobytes())
    b.StartVector(8, len(si), 8)
    for v in reversed(si):
        b.PrependInt64(int(v))
    shape = b.EndVector()
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(0, shape, 0)
    b.PrependUOffsetTRelativeSlot(1, buf, 0)
    b.PrependInt8Slot(2, dtype, 0)
    b.PrependInt8Slot(3, 1, 0)
    return b.EndObject()


def _pair(b, x, y):
    b.StartObject(2)
    b.PrependInt32Slot(0, x, 0)
    b.PrependInt32Slot(1, y, 0)
    return b.EndObject()


def _strings(b, items):
    offs = [b.CreateString(s) for s in items]
    b.StartVector(4, len(offs), 4)
    for o in reversed(offs):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def _offsets(b, offs):
    b.StartVector(4, len(offs), 4)
    for o in reversed(offs):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def write_graph(path, weights, inputs, nodes, outputs, updater=None, loss=None):
    """weights: {name: ndarray float32, int32 or int64}; inputs: {name: shape with -1};
    nodes: [(opName, name, [input names], [output names], {arg: ("l"|"d"|"b", [values])})]
    (the key "__extraInteger" gives positional iArgs instead: [values]);
    outputs: [names]; updater: {param: {key: ndarray}} (FlatGraph.updaterState, as
    SameDiff.save(file, true) writes it); loss: [names] (FlatGraph.lossVariables). Ids: nodes 1..N produce (k, j); weights
    and inputs (N+1+i, 0)."""
    import flatbuffers
    b = flatbuffers.Builder(1 << 16)
    ids = {}
    nn = len(nodes)
    for i, name in enumerate([*weights, *inputs]):
        ids[name] = (nn + 1 + i, 0)
    for k, (_, _, _, outs, _) in enumerate(nodes):
        for j, o in enumerate(outs):
            ids[o] = (k + 1, j)
    variables = []
    codes = {np.dtype(np.float32): 5, np.dtype(np.int32): 9, np.dtype(np.int64): 10}
    for name, a in weights.items():
        code = codes[a.dtype]
        arr = _array(b, a, code)
        nm = b.CreateString(name)
        shp = b.CreateNumpyVector(np.array(a.shape, dtype=np.int64))
        idp = _pair(b, *ids[name])
        b.StartObject(10)
        b.PrependUOffsetTRelativeSlot(0, idp, 0)
        b.PrependUOffsetTRelativeSlot(1, nm, 0)
        b.PrependInt8Slot(2, code, 0)
        b.PrependUOffsetTRelativeSlot(3, shp, 0)
        b.PrependUOffsetTRelativeSlot(4, arr, 0)
        b.PrependInt8Slot(6, 0, 0)
        variables.append(b.EndObject())
    for name, shape in inputs.items():
        nm = b.CreateString(name)
        shp = b.CreateNumpyVector(np.array(shape, dtype=np.int64))
        idp = _pair(b, *ids[name])
        b.StartObject(10)
        b.PrependUOffsetTRelativeSlot(0, idp, 0)
        b.PrependUOffsetTRelativeSlot(1, nm, 0)
        b.PrependInt8Slot(2, 5, 0)
        b.PrependUOffsetTRelativeSlot(3, shp, 0)
        b.PrependInt8Slot(6, 3, 0)
        variables.append(b.EndObject())
    for k, (_, _, _, outs, _) in enumerate(nodes):
        for o in outs:
            nm = b.CreateString(o)
            idp = _pair(b, *ids[o])
            b.StartObject(10)
            b.PrependUOffsetTRelativeSlot(0, idp, 0)
            b.PrependUOffsetTRelativeSlot(1, nm, 0)
            b.PrependInt8Slot(2, 5, 0)
            b.PrependInt8Slot(6, 2, 0)
            variables.append(b.EndObject())
    flat_nodes = []
    for k, (op, name, ins, outs, args) in enumerate(nodes):
        props = []
        positional = args.get("__extraInteger")
        args = {k: v for k, v in args.items() if k != "__extraInteger"}
        for an, (kind, vals) in args.items():
            pn = b.CreateString(an)
            if kind == "l":
                vec = b.CreateNumpyVector(np.array(vals, dtype=np.int64))
                slot = 2
            elif kind == "d":
                vec = b.CreateNumpyVector(np.array(vals, dtype=np.float64))
                slot = 3
            else:
                vec = b.CreateNumpyVector(np.array(vals, dtype=np.bool_))
                slot = 5
            b.StartObject(8)
            b.PrependUOffsetTRelativeSlot(0, pn, 0)
            b.PrependUOffsetTRelativeSlot(slot, vec, 0)
            props.append(b.EndObject())
        pv = _offsets(b, props)
        xi = b.CreateNumpyVector(np.array(positional, dtype=np.int64)) if positional else None
        iv = _offsets(b, [_pair(b, *ids[i]) for i in ins])
        ov = _strings(b, outs)
        nm = b.CreateString(name)
        opn = b.CreateString(op)
        b.StartObject(23)
        b.PrependInt32Slot(0, k + 1, 0)
        b.PrependUOffsetTRelativeSlot(1, nm, 0)
        b.PrependInt8Slot(2, 21, 0)
        b.PrependUOffsetTRelativeSlot(4, pv, 0)
        b.PrependUOffsetTRelativeSlot(6, iv, 0)
        if xi is not None:
            b.PrependUOffsetTRelativeSlot(9, xi, 0)
        b.PrependUOffsetTRelativeSlot(15, ov, 0)
        b.PrependUOffsetTRelativeSlot(16, opn, 0)
        flat_nodes.append(b.EndObject())
    vv = _offsets(b, variables)
    nv = _offsets(b, flat_nodes)
    outv = _offsets(b, [_pair(b, *ids[o]) for o in outputs])
    phv = _strings(b, list(inputs))
    states = []
    for param, kv in (updater or {}).items():
        pn = b.CreateString(param)
        kvec = _strings(b, list(kv))
        vvec = _offsets(b, [_array(b, a) for a in kv.values()])
        b.StartObject(3)
        b.PrependUOffsetTRelativeSlot(0, pn, 0)
        b.PrependUOffsetTRelativeSlot(1, kvec, 0)
        b.PrependUOffsetTRelativeSlot(2, vvec, 0)
        states.append(b.EndObject())
    uv = _offsets(b, states) if states else None
    lv = _strings(b, list(loss)) if loss else None
    b.StartObject(9)
    if lv is not None:
        b.PrependUOffsetTRelativeSlot(6, lv, 0)
    if uv is not None:
        b.PrependUOffsetTRelativeSlot(8, uv, 0)
    b.PrependInt64Slot(0, 0, 0)
    b.PrependUOffsetTRelativeSlot(1, vv, 0)
    b.PrependUOffsetTRelativeSlot(2, nv, 0)
    b.PrependUOffsetTRelativeSlot(3, outv, 0)
    b.PrependUOffsetTRelativeSlot(5, phv, 0)
    b.Finish(b.EndObject())
    with open(path, "wb") as f:
        f.write(bytes(b.Output()))


def mlp(path, weights, updater=None, loss=None):
    """A two-layer perceptron source graph over weights W1 b1 W2 b2 (+ extra ones)."""
    nodes = [
        ("matmul", "mm1", ["input", "W1"], ["mm1"], {}),
        ("add", "add1", ["mm1", "b1"], ["add1"], {}),
        ("relu", "relu1", ["add1"], ["relu1"], {"cutoff": ("d", [0.0])}),
        ("xw_plus_b", "dense2", ["relu1", "W2", "b2"], ["dense2"], {}),
        ("softmax", "out", ["dense2"], ["out"], {"dimension": ("l", [-1])}),
    ]
    write_graph(path, weights, {"input": [-1, weights["W1"].shape[0]]}, nodes, ["out"], updater,
                loss)


def chain(path, layers, n_in):
    """A stack of dense layers (xw_plus_b + relu) over weights [(W, b), ...]."""
    weights, nodes, x = {}, [], "input"
    for i, (w, bias) in enumerate(layers):
        weights[f"W{i}"], weights[f"b{i}"] = w, bias
        nodes.append(("xw_plus_b", f"dense{i}", [x, f"W{i}", f"b{i}"], [f"dense{i}"], {}))
        nodes.append(("relu", f"relu{i}", [f"dense{i}"], [f"relu{i}"], {"cutoff": ("d", [0.0])}))
        x = f"relu{i}"
    write_graph(path, weights, {"input": [-1, n_in]}, nodes, [x])


def buffer_offsets(path):
    """{variable: file offset of its FlatArray buffer's first byte} of a source graph."""
    data = open(path, "rb").read()
    g = sd().FlatGraph.FlatGraph.GetRootAs(data, 0)
    out = {}
    for i in range(g.VariablesLength()):
        v = g.Variables(i)
        arr = v.Ndarray()
        if arr is not None and arr.BufferLength():
            out[v.Name().decode()] = arr._tab.Vector(arr._tab.Offset(6))
    return out
