"""ckptd pack --format samediff: the ADR-0001 tagged archive, end to end.
Independent checks: zipfile reads the archive, Python code that Debian's
flatc generates from tests/lib/samediff.fbs (DL4J's schema, FORMAT-FACTS.md
field ids) decodes every graph.fb and params/N.fb, numpy compares each tensor
with the source it was packed from (source graphs are written here with
python3-flatbuffers as SameDiff.save writes them)."""
import glob
import json
import os
import random
import signal
import subprocess
import sys
import time
import unittest
import zipfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, run, shared  # noqa: E402
import sdfb  # noqa: E402
from ckpt_formats import TfTensor, write_tf_bundle  # noqa: E402


def weights(seed, n_in=4, hidden=8, n_out=3):
    rng = np.random.default_rng(seed)
    return {"W1": rng.standard_normal((n_in, hidden)).astype(np.float32),
            "b1": rng.standard_normal(hidden).astype(np.float32),
            "W2": rng.standard_normal((hidden, n_out)).astype(np.float32),
            "b2": rng.standard_normal(n_out).astype(np.float32)}


def inspect(path, *args, check=0):
    p = run("inspect", path, "--json", "--values", 10 ** 8, *args, check=check)
    return json.loads(p.stdout) if check == 0 else p


def pack(src, out, *args, check=0):
    return run("pack", "--format", "samediff", src, "-o", out, *args, check=check)


def node_args(graph, name):
    """A node's positional (iArgs, tArgs): extraInteger and extraParams."""
    for i in range(graph.NodesLength()):
        n = graph.Nodes(i)
        if n.Name().decode() == name:
            return ([n.ExtraInteger(k) for k in range(n.ExtraIntegerLength())],
                    [n.ExtraParams(k) for k in range(n.ExtraParamsLength())])
    raise AssertionError(f"no node {name}")


def const_input(graph, node, k):
    """(VarType, ndarray or None) of input k of node (a graph_nodes tuple):
    the variable it names and the array held inline in graph.fb."""
    for i in range(graph.VariablesLength()):
        v = graph.Variables(i)
        if (v.Id().First(), v.Id().Second()) == node[3][k]:
            arr = v.Ndarray()
            return v.Variabletype(), None if arr is None else sdfb.array_from_fb(arr)
    raise AssertionError(f"no variable {node[3][k]}")


class Pack(TmpDirCase):
    def src(self, name, w):
        p = os.path.join(self.dir, name)
        sdfb.mlp(p, w)
        return p

    def test_round_trip_tags_share_parameters(self):
        w1 = weights(1)
        w2 = dict(w1, W2=w1["W2"] * 2)          # fine-tuning changed W2 only
        w3 = dict(w2, b1=w2["b1"] + 1)          # then b1
        srcs = {"ep1": w1, "ep2": w2, "ep3": w3}
        out = os.path.join(self.dir, "run.zip")
        sizes = []
        for tag, w in srcs.items():
            before = open(out, "rb").read() if os.path.exists(out) else b""
            pack(self.src(tag + ".fb", w), out)
            after = open(out, "rb").read()
            if before:
                # every earlier member stays byte for byte where it was
                with zipfile.ZipFile(out) as z:
                    for info in z.infolist():
                        if not info.filename.startswith(tag + "/") and info.filename != "tags.txt":
                            end = info.header_offset + 30 + len(info.filename) + info.compress_size
                            self.assertEqual(before[info.header_offset:end],
                                             after[info.header_offset:end], info.filename)
            sizes.append(len(after) - len(before))
        tags, a = sdfb.read_archive(out)
        self.assertEqual(tags, ["ep1", "ep2", "ep3"])
        for tag, w in srcs.items():
            self.assertEqual(sorted(a[tag]["params"]), sorted(w))
            for name, arr in w.items():
                np.testing.assert_array_equal(a[tag]["params"][name].astype(np.float32), arr,
                                              err_msg=f"{tag}/{name}")
        self.assertEqual(a["ep1"]["refs"], {})
        self.assertEqual(sorted(a["ep2"]["refs"]), ["W1", "b1", "b2"])
        self.assertEqual(a["ep3"]["refs"]["W2"], "ep2/0")   # the newest identical copy's tag
        self.assertEqual(sorted(a["ep3"]["refs"]), ["W1", "W2", "b2"])
        with zipfile.ZipFile(out) as z:
            names = z.namelist()
        self.assertEqual(len([n for n in names if "/params/" in n]), 4 + 1 + 1)
        # the project's reader: newest tag by default, any tag on request
        doc = inspect(out)
        self.assertEqual(doc["metadata"]["tag"], "ep3")
        self.assertEqual(doc["metadata"]["tags"], "ep1,ep2,ep3")
        for tag in tags:
            t = {x["name"]: x for x in inspect(out, "--tag", tag)["tensors"]}
            for name, arr in srcs[tag].items():
                np.testing.assert_allclose(t[name]["values"], arr.ravel(), rtol=0, atol=0)
        self.assertEqual(inspect(out + "#EP2")["metadata"]["tag"], "ep2")

    def test_graph_has_dl4j_ops_and_named_arguments(self):
        out = os.path.join(self.dir, "run.zip")
        pack(self.src("ep1.fb", weights(2)), out)
        _, a = sdfb.read_archive(out)
        g = a["ep1"]["graph"]
        nodes = sdfb.graph_nodes(g)
        # the dense layer as libnd4j's matmul (no transposes: the iArgs
        # transX, transY, transZ its blas/matmul.cpp reads) and add, not
        # xw_plus_b, whose iArgs mean other things in other libnd4j versions
        self.assertEqual([n[0] for n in nodes],
                         ["matmul", "add", "relu", "matmul", "add", "softmax"])
        self.assertEqual(nodes[5][2], {"dimension": [-1]})
        self.assertEqual(nodes[3][2], {"transX": [0], "transY": [0], "transZ": [0]})
        self.assertEqual([g.Nodes(3).ExtraInteger(i) for i in range(g.Nodes(3).ExtraIntegerLength())],
                         [0, 0, 0])
        v = sdfb.graph_variables(g)
        self.assertEqual(v["input"].Variabletype(), 3)
        self.assertEqual([v["input"].Shape(i) for i in range(2)], [-1, 4])
        self.assertEqual(v["W1"].Dtype(), 5)
        self.assertEqual([v["W1"].Shape(i) for i in range(2)], [4, 8])
        ph = [g.Placeholders(i).decode() for i in range(g.PlaceholdersLength())]
        self.assertEqual(ph, ["input"])
        ids = {(x.Id().First(), x.Id().Second()): n for n, x in v.items()}
        self.assertEqual([ids[(g.Outputs(i).First(), g.Outputs(i).Second())]
                          for i in range(g.OutputsLength())], ["out"])
        # node inputs point at the right variables
        self.assertEqual([ids[p] for p in nodes[3][3]], ["relu1", "W2"])
        self.assertEqual([ids[p] for p in nodes[4][3]][1:], ["b2"])
        # every params file is a FlatArray as Java writes it: full shape info, BE
        with zipfile.ZipFile(out) as z:
            for n in z.namelist():
                if "/params/" in n:
                    arr = sdfb.sd().FlatArray.FlatArray.GetRootAs(z.read(n), 0)
                    self.assertEqual(arr.ByteOrder(), 1)
                    si = [arr.Shape(i) for i in range(arr.ShapeLength())]
                    self.assertEqual(si[-1], 99)
                    self.assertEqual(si[-3], 8192)
                    self.assertEqual(len(si), 2 * si[0] + 4)
        # and the archive's tag re-packs (reader to_model -> writer) to the same graph
        out2 = os.path.join(self.dir, "again.zip")
        pack(out, out2, "--tag", "copy")
        _, b = sdfb.read_archive(out2)
        self.assertEqual([n[:3] for n in sdfb.graph_nodes(b["copy"]["graph"])],
                         [n[:3] for n in nodes])

    def test_optimizer_state_as_updater_files(self):
        w1 = weights(6)
        rng = np.random.default_rng(60)
        u1 = {"W1": {"M": rng.standard_normal((4, 8)).astype(np.float32),
                     "V": rng.random((4, 8)).astype(np.float32)},
              "b2": {"M": rng.standard_normal(3).astype(np.float32),
                     "V": rng.random(3).astype(np.float32)}}
        u2 = {"W1": {"M": u1["W1"]["M"] + 1, "V": u1["W1"]["V"]}, "b2": u1["b2"]}
        out = os.path.join(self.dir, "run.zip")
        for tag, u in (("ep1", u1), ("ep2", u2)):
            src = os.path.join(self.dir, tag + ".fb")
            sdfb.mlp(src, w1, updater=u)
            pack(src, out)
        tags, a = sdfb.read_archive(out)
        for tag, u in (("ep1", u1), ("ep2", u2)):
            self.assertEqual(a[tag]["config"]["updaterStateKeys"], {"W1": ["M", "V"], "b2": ["M", "V"]})
            for p, kv in u.items():
                for k, arr in kv.items():
                    np.testing.assert_array_equal(a[tag]["updater"][p][k], arr, err_msg=f"{tag} {p} {k}")
        with zipfile.ZipFile(out) as z:
            self.assertEqual(z.read("ep2/updater.txt").decode(), "W1 0 ep1/1\nb2 ep1/2 ep1/3\n")
            self.assertFalse(any(n.startswith("ep2/params/") for n in z.namelist()))
        # the project's reader gives them back as role "updater"
        t = {x["name"]: x for x in inspect(out)["tensors"]}
        self.assertEqual(t["W1/updater/M"]["role"], "updater")
        np.testing.assert_array_equal(t["W1/updater/M"]["values"], u2["W1"]["M"].ravel())
        np.testing.assert_array_equal(t["b2/updater/V"]["values"], u2["b2"]["V"].ravel())

    def test_torch_optimizer_state_as_updater_files(self):
        # A PyTorch training checkpoint {"model", "optimizer", "epoch"}: torch itself
        # says which parameter each optimizer.state.N belongs to (named_parameters)
        try:
            import torch
        except ImportError:
            raise unittest.SkipTest("python3-torch is not installed")
        torch.manual_seed(7)
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                  torch.nn.ReLU(), torch.nn.Linear(8, 3))
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
        names = [n for n, _ in net.named_parameters()]
        graph = os.path.join(self.dir, "g.yaml")
        with open(graph, "w") as f:
            f.write("input: {name: x, shape: [-1, 4]}\nlayers:\n"
                    "  - {op: dense, weight: model.0.weight, bias: model.0.bias}\n"
                    "  - {op: batchnorm, weight: model.1.weight, bias: model.1.bias,"
                    " mean: model.1.running_mean, var: model.1.running_var}\n"
                    "  - {op: relu}\n"
                    "  - {op: dense, weight: model.3.weight, bias: model.3.bias}\n")
        out = os.path.join(self.dir, "run.zip")
        expect = {}
        for ep in (1, 2):
            net(torch.randn(5, 4)).square().sum().backward()
            opt.step()
            osd = opt.state_dict()
            if ep == 2:  # the state of the last layer's bias as in epoch 1: shared
                osd["state"][5] = expect[1]["osd"]["state"][5]
            src = os.path.join(self.dir, f"ep{ep}.pt")
            torch.save({"model": net.state_dict(), "optimizer": osd, "epoch": ep}, src)
            expect[ep] = {"osd": {"state": {k: {kk: vv.clone() for kk, vv in v.items()}
                                            for k, v in osd["state"].items()}}}
            pack(src, out, "--graph", graph, "--tag", f"ep{ep}")
        tags, a = sdfb.read_archive(out)
        for ep in (1, 2):
            tag = f"ep{ep}"
            state = expect[ep]["osd"]["state"]
            self.assertEqual(sorted(a[tag]["updater"]), sorted("model." + n for n in names))
            for i, n in enumerate(names):
                got = a[tag]["updater"]["model." + n]
                self.assertEqual(sorted(got), sorted(state[i]), n)
                self.assertEqual(a[tag]["config"]["updaterStateKeys"]["model." + n],
                                 ["step", "exp_avg", "exp_avg_sq"])
                for key, ref in state[i].items():
                    np.testing.assert_array_equal(got[key], ref.numpy(), err_msg=f"{tag} {n} {key}")
            # optimizer state is not a parameter; buffers are
            self.assertFalse(any(p.startswith("optimizer.") for p in a[tag]["params"]))
            self.assertIn("model.1.running_mean", a[tag]["params"])
        with zipfile.ZipFile(out) as z:
            line = [x for x in z.read("ep2/updater.txt").decode().splitlines()
                    if x.startswith("model.3.bias ")][0]
        self.assertRegex(line, r"^model\.3\.bias ep1/\d+ ep1/\d+ ep1/\d+$")
        t = {x["name"]: x for x in inspect(out)["tensors"]}
        self.assertEqual(t["model.0.weight/updater/exp_avg"]["role"], "updater")
        np.testing.assert_array_equal(t["model.0.weight/updater/exp_avg"]["values"],
                                      expect[2]["osd"]["state"][0]["exp_avg"].numpy().ravel())

    def test_tf_slot_variables_as_updater_files(self):
        # TF v2 object-graph keys and TF v1 slot names, written with the tests'
        # own bundle writer (from the spec); values from numpy
        rng = np.random.default_rng(11)
        k, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
        m, v = rng.standard_normal((4, 3)).astype(np.float32), rng.random((4, 3)).astype(np.float32)
        bm, bv = rng.standard_normal(3).astype(np.float32), rng.random(3).astype(np.float32)
        V, S = "/.ATTRIBUTES/VARIABLE_VALUE", "/.OPTIMIZER_SLOT/optimizer/"
        v2 = {"dense/kernel" + V: k, "dense/bias" + V: b,
              "dense/kernel" + S + "m" + V: m, "dense/kernel" + S + "v" + V: v,
              "dense/bias" + S + "m" + V: bm, "dense/bias" + S + "v" + V: bv}
        v1 = {"dense/kernel": k, "dense/bias": b, "dense/kernel/Adam": m,
              "dense/kernel/Adam_1": v, "dense/bias/Momentum": bm}
        for label, arrays, wname, bname, want in (
                ("v2", v2, "dense/kernel" + V, "dense/bias" + V,
                 {"dense/kernel" + V: {"m": m, "v": v}, "dense/bias" + V: {"m": bm, "v": bv}}),
                ("v1", v1, "dense/kernel", "dense/bias",
                 {"dense/kernel": {"Adam": m, "Adam_1": v}, "dense/bias": {"Momentum": bm}})):
            prefix = os.path.join(self.dir, label, "ckpt")
            os.makedirs(os.path.dirname(prefix))
            write_tf_bundle(prefix, [TfTensor.from_numpy(n, a) for n, a in arrays.items()])
            graph = os.path.join(self.dir, label, "g.yaml")
            with open(graph, "w") as f:
                f.write("input: {name: x, shape: [-1, 4]}\nlayers:\n"
                        f"  - {{op: dense, weight: '{wname}', bias: '{bname}', layout: in_out}}\n")
            out = os.path.join(self.dir, label, "run.zip")
            pack(prefix, out, "--graph", graph, "--tag", "t1")
            _, a = sdfb.read_archive(out)
            self.assertEqual(sorted(a["t1"]["params"]), sorted([wname, bname]), label)
            np.testing.assert_array_equal(a["t1"]["params"][wname], k)
            self.assertEqual(sorted(a["t1"]["updater"]), sorted(want), label)
            for p, kv in want.items():
                self.assertEqual(a["t1"]["config"]["updaterStateKeys"][p], list(kv), label)
                for key, arr in kv.items():
                    np.testing.assert_array_equal(a["t1"]["updater"][p][key], arr,
                                                  err_msg=f"{label} {p} {key}")

    def nnabla_with_states(self, name, states, extra=None, truncate=False):
        """The LeNet .nnp plus a solver-state member in NNabla's layout
        (nnabla/utils/get_file_handle.py, _load_solve_state_from_h5, and
        nnabla/utils/cli/utility.py, save_optimizer_states): the member
        "<optimizer>_<solver>_optimizer.h5.optimizer" holds, per parameter, a
        group "<parameter>" (attribute index, the save order) with one dataset
        per state array and the integer scalar "t", the step count. The state
        names here ("m", "v") stand for the solver's own; the reader takes
        any name."""
        try:
            import h5py
        except ImportError:
            raise unittest.SkipTest("python3-h5py is not installed")
        import io
        lenet = shared("nnabla", "lenet_010000.nnp")
        buf = io.BytesIO()
        with h5py.File(buf, "w") as f:
            for i, (param, st) in enumerate(states.items()):
                g = f.create_group(param)
                g.attrs["index"] = i
                for key, arr in st.items():
                    g.create_dataset(key, data=arr)
            for key, arr in (extra or {}).items():
                f.create_dataset(key, data=arr)
        data = buf.getvalue()
        if truncate:
            data = data[:len(data) // 2]
        nnp = os.path.join(self.dir, name)
        with zipfile.ZipFile(lenet) as src, zipfile.ZipFile(nnp, "w") as z:
            for n in src.namelist():
                z.writestr(n, src.read(n))
            z.writestr("optimizer_Adam_optimizer.h5.optimizer", data)
        return nnp

    def lenet_shapes(self):
        t = {x["name"]: x for x in inspect(shared("nnabla", "lenet_010000.nnp"))["tensors"]}
        return {n: tuple(x["shape"]) for n, x in t.items() if x["role"] == "parameter"}

    def test_nnabla_solver_states_as_updater_files(self):
        shapes = self.lenet_shapes()
        rng = np.random.default_rng(5)
        out = os.path.join(self.dir, "run.zip")
        expect = {}
        for ep in (1, 2):
            st = {}
            for p, shape in shapes.items():
                st[p] = {"m": rng.standard_normal(shape).astype(np.float32),
                         "v": rng.random(shape).astype(np.float32),
                         "t": np.int64(100 * ep)}
            if ep == 2:  # conv1/conv/b's state as in epoch 1: shared, not stored again
                st["conv1/conv/b"] = {k: v for k, v in expect[1]["conv1/conv/b"].items()}
                st["conv1/conv/b"]["t"] = np.int64(100)
            expect[ep] = st
            nnp = self.nnabla_with_states(f"ep{ep}.nnp", st)
            pack(nnp, out, "--tag", f"ep{ep}")
        _, a = sdfb.read_archive(out)
        for ep in (1, 2):
            tag = f"ep{ep}"
            self.assertEqual(sorted(a[tag]["updater"]), sorted(shapes), tag)
            for p in shapes:
                self.assertEqual(a[tag]["config"]["updaterStateKeys"][p], ["m", "t", "v"])
                got = a[tag]["updater"][p]
                for key, ref in expect[ep][p].items():
                    np.testing.assert_array_equal(np.asarray(got[key]).reshape(np.shape(ref)),
                                                  ref, err_msg=f"{tag} {p} {key}")
            self.assertEqual(sorted(a[tag]["params"]), sorted(shapes))
        with zipfile.ZipFile(out) as z:
            line = [x for x in z.read("ep2/updater.txt").decode().splitlines()
                    if x.startswith("conv1/conv/b ")][0]
        self.assertRegex(line, r"^conv1/conv/b ep1/\d+ ep1/\d+ ep1/\d+$")
        # inspect lists them with role "updater"
        t = {x["name"]: x for x in inspect(self.nnabla_with_states("i.nnp", expect[2]))["tensors"]}
        self.assertEqual(t["fc3/affine/W/updater/m"]["role"], "updater")
        self.assertEqual(t["fc3/affine/W/updater/t"]["role"], "updater")
        np.testing.assert_array_equal(t["conv2/conv/W/updater/v"]["values"],
                                      expect[2]["conv2/conv/W"]["v"].ravel())
        self.assertEqual(t["conv2/conv/W/updater/t"]["values"], [200])

    def test_nnabla_solver_states_hostile(self):
        shapes = self.lenet_shapes()
        good = {p: {"m": np.ones(s, np.float32), "t": np.int64(3)} for p, s in shapes.items()}
        out = os.path.join(self.dir, "run.zip")
        # a state whose shape disagrees with its parameter, and one for a
        # parameter the file does not have: left out, with the writer's warning
        bad = dict(good)
        bad["conv1/conv/W"] = {"m": np.ones((3, 3), np.float32), "t": np.int64(3)}
        bad["nowhere/W"] = {"m": np.ones(4, np.float32), "t": np.int64(3)}
        p = pack(self.nnabla_with_states("bad.nnp", bad), out, "--tag", "bad")
        self.assertIn("samediff.updater_unmapped", p.stdout + p.stderr)
        self.assertIn("arrays=3", p.stdout + p.stderr)
        _, a = sdfb.read_archive(out)
        self.assertEqual(sorted(a["bad"]["updater"]), sorted(shapes))
        self.assertEqual(sorted(a["bad"]["updater"]["conv1/conv/W"]), ["t"])  # m left out
        self.assertEqual(sorted(a["bad"]["params"]), sorted(shapes))
        # a truncated member: an error naming the file and the member, no crash
        p = pack(self.nnabla_with_states("cut.nnp", good, truncate=True), out, "--tag", "cut",
                 check=None)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("optimizer_Adam_optimizer.h5.optimizer", p.stderr)
        self.assertNotIn("cut", sdfb.read_archive(out)[0])
        # a state of a type that is neither float32 nor an integer: named error
        p = pack(self.nnabla_with_states("str.nnp", good, extra={"x/W/m": np.ones(2, np.float64)}),
                 out, "--tag", "f64", check=None)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("'x/W/m': not float32 nor an integer", p.stderr)

    def test_loss_variables_in_graph(self):
        def losses(out, tag):
            _, a = sdfb.read_archive(out)
            g = a[tag]["graph"]
            names = [g.LossVariables(i).decode() for i in range(g.LossVariablesLength())]
            self.assertTrue(set(names) <= set(sdfb.graph_variables(g)), names)
            return names
        out = os.path.join(self.dir, "run.zip")
        # a SameDiff source's own lossVariables; one the graph lacks is left out
        src = os.path.join(self.dir, "l.fb")
        sdfb.mlp(src, weights(8), loss=["out", "gone"])
        pack(src, out, "--tag", "sd")
        self.assertEqual(losses(out, "sd"), ["out"])
        pack(self.src("plain.fb", weights(8)), out, "--tag", "plain")
        self.assertEqual(losses(out, "plain"), [])
        # NNabla: the loss variables of the optimizer training the network packed
        lenet = shared("nnabla", "lenet_010000.nnp")
        with zipfile.ZipFile(lenet) as z:
            members = {n: z.read(n) for n in z.namelist()}
        text = members["network.nntxt"].decode()
        net_end = text.index("\n}\nexecutor {")
        text = (text[:net_end] +
                '\n  variable {\n    name: "loss"\n    type: "Buffer"\n    shape {\n    }\n  }'
                '\n  function {\n    name: "Mean"\n    type: "Mean"\n    input: "y"\n'
                '    output: "loss"\n    mean_param {\n      axes: 0\n      axes: 1\n'
                '      keep_dims: false\n    }\n  }' + text[net_end:])
        for net, name in (("runtime", "own"), ("training", "other")):
            opt = ('optimizer {\n  name: "optimizer"\n  network_name: "%s"\n'
                   '  loss_variable {\n    variable_name: "loss"\n  }\n}\n' % net)
            nnp = os.path.join(self.dir, f"lenet_{name}.nnp")
            with zipfile.ZipFile(nnp, "w") as z:
                for n, d in members.items():
                    z.writestr(n, (text + opt).encode() if n == "network.nntxt" else d)
            if net == "training":  # names a network that is not there: not this graph's loss
                p = pack(nnp, out, "--tag", name, check=None)
                if p.returncode == 0:
                    self.assertEqual(losses(out, name), [])
                continue
            pack(nnp, out, "--tag", name)
            self.assertEqual(losses(out, name), ["loss"])

    def test_default_tag_and_explicit_tags(self):
        out = os.path.join(self.dir, "run.zip")
        src = self.src("epoch 7.fb", weights(3))
        p = pack(src, out)
        self.assertIn("tag epoch_7:", p.stdout)
        pack(src, out, "--ref", "step:1200/final")
        pack(src, out, "--tag", "Best")
        tags, _ = sdfb.read_archive(out)
        self.assertEqual(tags, ["epoch_7", "step_1200_final", "Best"])
        before = open(out, "rb").read()
        for bad, why in (("best", "already exists"), ("EPOCH_7", "already exists"),
                         ("a/b", "not a valid"), ("..", "not a valid"), ("tags.txt", "not a valid"),
                         ("x:y", "not a valid"), ("a b", "not a valid")):
            p = pack(src, out, "--tag", bad, check=None)
            self.assertNotEqual(p.returncode, 0, bad)
            self.assertIn(why, p.stderr)
            self.assertIn("run.zip", p.stderr)
        self.assertEqual(open(out, "rb").read(), before)

    def test_dtype_tags_within_tolerance(self):
        out = os.path.join(self.dir, "run.zip")
        w = weights(4, n_in=16, hidden=64, n_out=10)
        src = self.src("ep5.fb", w)
        pack(src, out)
        for d in ("fp16", "bf16", "int8"):
            pack(src, out, "--dtype", d)
        tags, a = sdfb.read_archive(out)
        self.assertEqual(tags, ["ep5", "ep5-fp16", "ep5-bf16", "ep5-int8"])
        g = a["ep5-int8"]["graph"]
        v = sdfb.graph_variables(g)
        for name, ref in w.items():
            fp32 = a["ep5"]["params"][name].astype(np.float64)
            np.testing.assert_array_equal(fp32, ref)
            h = a["ep5-fp16"]["params"][name]
            self.assertEqual(h.dtype, np.dtype(">f2"))
            np.testing.assert_array_equal(h.astype(np.float32), ref.astype(np.float16))
            bf = a["ep5-bf16"]["params"][name].astype(np.float64)
            np.testing.assert_allclose(bf, fp32, rtol=2 ** -8, atol=0)
            self.assertEqual(v[name].Dtype(), 15)           # QINT8
            q = a["ep5-int8"]["params"][name].astype(np.float64)
            sv = v[name + "/scale"]
            scale = sdfb.array_from_fb(sv.Ndarray()).astype(np.float64).item()
            self.assertAlmostEqual(scale, np.abs(ref).max() / 127, places=6)
            np.testing.assert_allclose(q * scale, fp32, rtol=0, atol=scale / 2 + 1e-7)
        # the reader dequantizes int8 for the model; inspect shows the stored int8
        t = {x["name"]: x for x in inspect(out)["tensors"]}
        self.assertEqual(t["W1"]["dtype"], "qint8")

    def test_pack_rejects_unmapped_ops_and_non_zip_targets(self):
        src = shared("samediff", "simplewhile_1.fb")
        out = os.path.join(self.dir, "run.zip")
        p = pack(src, out, check=1)
        self.assertRegex(p.stderr, r"node '.+': DL4J op '.+' has no canonical mapping")
        self.assertFalse(os.path.exists(out))
        notzip = os.path.join(self.dir, "notes.zip")
        with open(notzip, "wb") as f:
            f.write(b"this is not a zip archive at all, just some text\n" * 3)
        before = open(notzip, "rb").read()
        p = pack(self.src("ep1.fb", weights(5)), notzip, check=1)
        self.assertIn("'%s': not a zip archive" % notzip, p.stderr)
        self.assertEqual(open(notzip, "rb").read(), before)
        # a zip that is not a SameDiff archive
        other = os.path.join(self.dir, "other.zip")
        with zipfile.ZipFile(other, "w") as z:
            z.writestr("readme.txt", "hi")
        p = pack(self.src("ep1.fb", weights(5)), other, check=1)
        self.assertIn("without tags.txt", p.stderr)

    def test_dl4j_constant_inputs_and_positional_args(self):
        # As DL4J writes pad (FORMAT-FACTS 3.2, pad_1D.fb): paddings and the value
        # are constant input arrays; conv-style ops carry positional iArgs.
        x = np.arange(6, dtype=np.float32)
        w = {"paddings": np.array([[1, 2]], dtype=np.int32),
             "value": np.array(10.0, dtype=np.float32),
             "bias": x + 1}
        nodes = [("pad", "PadV2", ["input", "paddings", "value"], ["padded"], {}),
                 ("add", "plus", ["padded", "bias9"], ["sum"], {}),
                 ("log_softmax", "lsm", ["sum"], ["out"], {"__extraInteger": [0]})]
        w["bias9"] = np.arange(9, dtype=np.float32)
        src = os.path.join(self.dir, "pad.fb")
        sdfb.write_graph(src, w, {"input": [6]}, nodes, ["out"])
        out = os.path.join(self.dir, "pad.zip")
        pack(src, out, "--tag", "t1")
        _, a = sdfb.read_archive(out)
        got = sdfb.graph_nodes(a["t1"]["graph"])
        self.assertEqual([n[0] for n in got], ["pad", "add", "log_softmax"])
        # written as libnd4j's pad reads it: the paddings a constant input
        # [rank, 2], the mode INT_ARG(0), the value T_ARG(0)
        vt, paddings = const_input(a["t1"]["graph"], got[0], 1)
        self.assertEqual((vt, paddings.dtype.str, paddings.tolist()), (1, ">i8", [[1, 2]]))
        self.assertEqual(node_args(a["t1"]["graph"], "PadV2"), ([0], [10.0]))
        self.assertEqual(got[0][2], {"mode": [0], "padValue": [10.0]})
        self.assertEqual(got[2][2]["dimension"], [0])
        # the constants read into parameters are no weights any more (an
        # unused weight, "bias", stays one)
        self.assertEqual(sorted(a["t1"]["params"]), ["bias", "bias9"])
        np.testing.assert_array_equal(a["t1"]["params"]["bias9"], w["bias9"])
        # both graphs compute what numpy does
        z = np.concatenate([[10.0], x, [10.0, 10.0]]) + w["bias9"]
        want = (z - z.max() - np.log(np.exp(z - z.max()).sum())).astype(np.float32)
        np.save(os.path.join(self.dir, "x.npy"), x)
        np.save(os.path.join(self.dir, "y.npy"), want)
        for model in (src, out):
            p = run("verify", model, "--inputs", os.path.join(self.dir, "x.npy"), "--expected",
                    os.path.join(self.dir, "y.npy"), "--rtol", "1e-6", "--atol", "1e-6")
            self.assertEqual(p.returncode, 0, model + p.stdout + p.stderr)
        # the real DL4J file has no placeholder: the canonical model refuses it by name
        p = pack(shared("samediff", "pad_1D.fb"), out, "--tag", "t2", check=1)
        self.assertIn("no graph input", p.stderr)

    def test_clip_with_one_bound_read(self):
        # clipbyvalue naming only its upper bound: the lower one is the
        # table's default, -inf (fuzz_samediff: it was converted to an
        # integer, undefined behaviour, before being read as a real)
        x = np.array([-3e38, -1, 0.5, 2, 7], dtype=np.float32)
        src = os.path.join(self.dir, "clip.fb")
        sdfb.write_graph(src, {}, {"input": [5]},
                         [("clipbyvalue", "clip", ["input"], ["out"],
                           {"clipValueMax": ("d", [1.0])})], ["out"])
        np.save(os.path.join(self.dir, "x.npy"), x)
        np.save(os.path.join(self.dir, "y.npy"), np.minimum(x, 1))
        p = run("verify", src, "--inputs", os.path.join(self.dir, "x.npy"), "--expected",
                os.path.join(self.dir, "y.npy"), "--atol", "0", "--rtol", "0")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_real_nnabla_lenet_as_tags(self):
        src = shared("nnabla", "lenet_010000.nnp")
        out = os.path.join(self.dir, "lenet.zip")
        pack(src, out)
        pack(src, out, "--dtype", "int8")
        tags, a = sdfb.read_archive(out)
        self.assertEqual(tags, ["lenet_010000", "lenet_010000-int8"])
        ref = {t["name"]: t for t in inspect(src)["tensors"] if t["has_data"]}
        self.assertEqual(sorted(a[tags[0]]["params"]), sorted(ref))
        v = sdfb.graph_variables(a[tags[1]]["graph"])
        for name, t in ref.items():
            got = a[tags[0]]["params"][name]
            self.assertEqual(list(got.shape), t["shape"])
            np.testing.assert_array_equal(got.ravel(), np.array(t["values"], np.float32))
            scale = sdfb.array_from_fb(v[name + "/scale"].Ndarray()).item()
            q = a[tags[1]]["params"][name].astype(np.float64).ravel()
            np.testing.assert_allclose(q * scale, t["values"], atol=scale / 2 + 1e-7)
        ops = [n[0] for n in sdfb.graph_nodes(a[tags[0]]["graph"])]
        self.assertEqual(ops, ["mul_scalar", "conv2d", "maxpool2d", "relu", "conv2d", "maxpool2d",
                               # the first affine flattens the pooled [N, C, H, W]
                               # (reshapes around matmul and add), the second has rows
                               "relu", "reshape", "matmul", "add", "reshape", "relu",
                               "matmul", "add"])

    def test_real_dl4j_files_read(self):
        files = sorted(glob.glob(os.path.join(shared("samediff"), "*.fb")))
        self.assertGreater(len(files), 10)
        for f in files:
            doc = inspect(f)
            self.assertEqual(doc["format"], "samediff", f)
            g = sdfb.sd().FlatGraph.FlatGraph.GetRootAs(open(f, "rb").read(), 0)
            with_arrays = {g.Variables(i).Name().decode() for i in range(g.VariablesLength())
                           if g.Variables(i).Ndarray() is not None}
            names = {t["name"] for t in doc["tensors"]}
            self.assertTrue(with_arrays <= names, f)


class RoundTrip(TmpDirCase):
    """Archives ckptd writes read back through ckptd's own reader and verify
    against torch / numpy; the ops are written as DL4J's own ops read them
    (libnd4j's strided_slice: five masks, then all begins, all ends, all
    strides; the pairwise "Pow" and the scalar "pow" are two ops)."""

    def verify(self, model, x, y):
        np.save(os.path.join(self.dir, "x.npy"), x)
        np.save(os.path.join(self.dir, "y.npy"), y)
        return run("verify", model, "--inputs", os.path.join(self.dir, "x.npy"), "--expected",
                   os.path.join(self.dir, "y.npy"), "--rtol", "1e-5", "--atol", "1e-5",
                   timeout=120)

    def test_transformer_verifies_after_packing(self):
        import torch_gen as tg
        module, x = tg.onnx_models()["transformer"]
        src = os.path.join(self.dir, "enc.onnx")
        y = tg.export_onnx(module, x, src)
        out = os.path.join(self.dir, "enc.zip")
        pack(src, out, check=0)
        _, a = sdfb.read_archive(out)
        nodes = sdfb.graph_nodes(a["enc"]["graph"])
        pows = [n for n in nodes if n[0].lower() == "pow"]
        self.assertTrue(pows)  # LayerNorm's x**2 at opset 13
        for n in pows:
            self.assertEqual(n[0], "pow", n)  # the scalar op, not the pairwise "Pow"
            self.assertEqual(n[2], {"pow": [2.0]}, n)
            self.assertEqual(len(n[3]), 1, n)
        slices = [n for n in nodes if n[0] == "strided_slice"]
        self.assertTrue(slices)
        for n in slices:  # the last axis sliced; the first two whole (end mask bits 0 and 1)
            self.assertEqual(n[2]["endMask"], [3], n)
            self.assertEqual(n[2]["strides"], [1, 1, 1], n)
        p = self.verify(out, x.numpy(), y)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("ok", p.stdout + p.stderr)

    def test_slice_and_pow_forms_as_dl4j_reads_them(self):
        import torch_gen as tg
        onnx = tg.need_onnx()
        from onnx import helper as h, numpy_helper as nh, TensorProto as TP
        big, small = 2 ** 63 - 1, -2 ** 63
        inits = [nh.from_array(np.array(v, np.int64), k) for k, v in (
            ("starts", [-1, 1, 0]), ("ends", [small, big, big]), ("axes", [1, 2, 0]),
            ("steps", [-2, 1, 1]))]
        inits.append(nh.from_array(np.array(3.0, np.float32), "three"))
        nodes = [h.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["s"], name="sl"),
                 h.make_node("Pow", ["s", "three"], ["p"], name="cube"),
                 h.make_node("Pow", ["p", "s"], ["y"], name="pair")]
        g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [2, 7, 5])],
                         [h.make_tensor_value_info("y", TP.FLOAT, None)], initializer=inits)
        src = os.path.join(self.dir, "sl.onnx")
        onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), src)
        out = os.path.join(self.dir, "sl.zip")
        pack(src, out, "--tag", "t", check=0)
        _, a = sdfb.read_archive(out)
        g = a["t"]["graph"]
        nodes = {n[1]: n for n in sdfb.graph_nodes(g)}
        # axis 0 whole: begin 0 end past it (end mask bit 0); axis 1 from -1
        # back to before the start with step -2 (end mask bit 1); axis 2 1:
        sl = nodes["sl"]
        self.assertEqual(sl[0], "strided_slice")
        ints = None
        for i in range(g.NodesLength()):
            if g.Nodes(i).Name().decode() == "sl":
                fn = g.Nodes(i)
                ints = [fn.ExtraInteger(k) for k in range(fn.ExtraIntegerLength())]
        # (the ONNX reader clamps the ends of axes 0 and 2 to their static sizes)
        self.assertEqual(ints, [0, 0, 0b010, 0, 0,  0, -1, 1,  2, 0, 5,  1, -2, 1])
        self.assertEqual(sl[2]["begin"], [0, -1, 1])
        self.assertEqual(sl[2]["strides"], [1, -2, 1])
        self.assertEqual((nodes["cube"][0], nodes["cube"][2]), ("pow", {"pow": [3.0]}))
        self.assertEqual((nodes["pair"][0], len(nodes["pair"][3])), ("Pow", 2))
        x = np.random.default_rng(3).uniform(0.5, 1.5, (2, 7, 5)).astype(np.float32)
        s = x[:, -1::-2, 1:]
        want = (s.astype(np.float64) ** 3) ** s
        for model in (src, out):
            p = self.verify(model, x, want.astype(np.float32))
            self.assertEqual(p.returncode, 0, model + p.stdout + p.stderr)
        # a mask ckptd cannot say is refused by name, not misread
        bad = os.path.join(self.dir, "bad.fb")
        sdfb.write_graph(bad, {}, {"input": [4, 4]},
                         [("strided_slice", "cut", ["input"], ["out"],
                           {"__extraInteger": [0, 0, 0, 0, 1, 0, 0, 1, 1, 1, 1]})], ["out"])
        p = run("verify", bad)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("node 'cut': shrinkAxisMask 1 is not supported", p.stderr)

    def dynamic_export(self, module, x, name, dynamic):
        """torch.onnx.export at opset 17 with these dims of the input
        dynamic (the zoo's dynamic form, tests/lib/zoo_gen.py)."""
        import torch
        src = os.path.join(self.dir, name + ".onnx")
        torch.onnx.export(module, (x,), src, opset_version=17, input_names=["input"],
                          output_names=["output"],
                          dynamic_axes={"input": {d: f"d{d}" for d in dynamic}})
        return src

    def test_dynamic_shapes_written_as_dl4j_shape_ops(self):
        """A dynamic export's shape arithmetic (docs/samediff.md, "Shape
        values"): Shape, Gather, Concat, a Reshape to a computed shape, an
        Expand of a class token (ConstantOfShape, Equal, Where), a Range and
        Greater causal mask filling -inf where the batch and sequence are
        unknown, a Slice to a computed end. Written as libnd4j's shape_of,
        gather, concat, reshape (shape as input 1), broadcast_to, fill (a
        torch.full of a computed shape),
        range, greater, Where, strided_slice (bounds as inputs); the shape
        values declared INT64 and the comparisons BOOL in graph.fb; read
        back by ckptd's reader, it gives torch's outputs at batch and
        sequence sizes the export never saw."""
        import torch

        class Dyn(torch.nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(5)
                self.cls = torch.nn.Parameter(torch.randn(1, 1, 8))
                self.lin = torch.nn.Linear(8, 8)

            def forward(self, x):
                b, t = x.shape[0], x.shape[1]
                h = torch.cat([self.cls.expand(b, -1, -1), self.lin(x)], 1)
                h = h.reshape(b, t + 1, 2, 4).transpose(1, 2) + torch.full((b, 2, t + 1, 4), 0.5)
                i = torch.arange(t + 1)
                s = (h @ h.transpose(-1, -2)).masked_fill(i[None, :] > i[:, None],
                                                         float("-inf"))
                y = s.softmax(-1) @ h
                return y[:, :, : (t + 1) // 2].reshape(b, -1, 4)

        module = Dyn().eval()
        src = self.dynamic_export(module, torch.randn(2, 4, 8), "dyn", (0, 1))
        out = os.path.join(self.dir, "dyn.zip")
        p = pack(src, out, "--tag", "t", check=None)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        _, a = sdfb.read_archive(out)
        g = a["t"]["graph"]
        nodes = sdfb.graph_nodes(g)
        ops = {n[0] for n in nodes}
        for op in ("shape_of", "gather", "concat", "reshape", "broadcast_to", "fill", "range",
                   "greater", "equals", "Where", "strided_slice", "div_scalar", "maximum", "fill"):
            self.assertIn(op, ops, sorted(ops))
        byid = {(v.Id().First(), v.Id().Second()): v for v in
                (g.Variables(i) for i in range(g.VariablesLength()))}
        names = {v.Name().decode(): v for v in byid.values()}
        for n in nodes:
            dt = {names[o].Dtype() for o in n[4]}
            if n[0] in ("shape_of", "range"):
                self.assertEqual(dt, {10}, n)  # INT64
            if n[0] in ("greater", "equals"):
                self.assertEqual(dt, {1}, n)  # BOOL
            if n[0] == "reshape" and len(n[3]) == 2:
                self.assertEqual(byid[n[3][1]].Dtype(), 10, n)  # the shape, computed
            if n[0] == "strided_slice" and len(n[3]) > 1:
                # libnd4j's input form: begin, end, strides; the five masks only
                self.assertEqual(len(n[3]), 4, n)
                self.assertEqual({byid[k].Dtype() for k in n[3][1:]}, {10}, n)
                self.assertEqual(node_args(g, n[1])[0], [0, 0, 0, 0, 0], n)
            if n[0] in ("matmul", "softmax", "add"):
                self.assertEqual(dt, {5}, n)  # FLOAT
        for b, t in ((1, 3), (3, 6)):
            x = torch.randn(b, t, 8)
            with torch.no_grad():
                y = module(x).numpy()
            p = self.verify(out, x.numpy(), y)
            self.assertEqual(p.returncode, 0, f"batch {b}, {t} steps: " + p.stdout + p.stderr)
            # the written graph computed with libnd4j's rules (numpy, not
            # ckptd's engine): int64 indices, shapes and bounds where DL4J
            # reads them, torch's answer
            vals = Lowered.run_dl4j(self, g, a["t"]["params"], {"input": x.numpy()})
            np.testing.assert_allclose(vals["output"], y, rtol=1e-5, atol=1e-5)

    def test_dynamic_trilu_k_refused_by_name(self):
        """A Trilu whose k is computed from a dynamic dim (no libnd4j op
        read here takes k as an input): refused naming the node, exit 1,
        nothing written; the same graph verifies from ONNX."""
        onnx = __import__("torch_gen").need_onnx()
        from onnx import helper as h, numpy_helper as nh, TensorProto as TP
        nodes = [h.make_node("Shape", ["input"], ["s"], name="sh"),
                 h.make_node("Gather", ["s", "zero"], ["n"], name="n", axis=0),
                 h.make_node("Sub", ["n", "two"], ["k"], name="k"),
                 h.make_node("Trilu", ["input", "k"], ["output"], name="tri", upper=1)]
        g = h.make_graph(nodes, "g", [h.make_tensor_value_info("input", TP.FLOAT, ["N", 5])],
                         [h.make_tensor_value_info("output", TP.FLOAT, None)],
                         initializer=[nh.from_array(np.array(0, np.int64), "zero"),
                                      nh.from_array(np.array(2, np.int64), "two")])
        src = os.path.join(self.dir, "tri.onnx")
        onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 14)]), src)
        x = np.arange(20, dtype=np.float32).reshape(4, 5) + 1
        p = self.verify(src, x, np.triu(x, 4 - 2))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        out = os.path.join(self.dir, "tri.zip")
        p = pack(src, out, "--tag", "t", check=1)
        self.assertIn(f"'{out}: tag 't'': node 'tri' (trilu): its k is computed at run time (a "
                      "dynamic export), and ckptd writes no DL4J form of that; pack it as "
                      ".mldef, or export with fixed sizes (docs/samediff.md)", p.stderr)
        self.assertFalse(os.path.exists(out))

    def test_strided_slice_input_form_read(self):
        """libnd4j's strided_slice with begin, end and strides as inputs 1-3
        (tensor/strided_slice.cpp: the five masks the only iArgs), as a DL4J
        graph says it: read as the canonical slice (x, starts, ends); the
        end here computed by shape_of, the begin a constant. Strides other
        than 1s, or a mask with the inputs, are refused by name."""
        def graph(path, strides, masks):
            sdfb.write_graph(
                path, {"begin": np.array([0, 1], np.int64), "four": np.array([4], np.int64),
                       "strides": np.array(strides, np.int64)},
                {"input": [-1, 6]},
                [("shape_of", "dims", ["input"], ["d"], {}),
                 ("strided_slice", "rows", ["d"], ["n"], {"__extraInteger": [0, 0, 0, 0, 0,
                                                                              0, 1, 1]}),
                 ("concat", "end", ["n", "four"], ["e"], {"__extraInteger": [0]}),
                 ("strided_slice", "cut", ["input", "begin", "e", "strides"], ["output"],
                  {"__extraInteger": masks})], ["output"])
        ok = os.path.join(self.dir, "ok.fb")
        graph(ok, [1, 1], [0, 0, 0, 0, 0])
        for n in (1, 3):
            x = np.arange(6 * n, dtype=np.float32).reshape(n, 6)
            p = self.verify(ok, x, x[:, 1:4])
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        for strides, masks in (([1, 2], [0, 0, 0, 0, 0]), ([1, 1], [0, 0, 2, 0, 0])):
            bad = os.path.join(self.dir, "bad.fb")
            graph(bad, strides, masks)
            p = run("verify", bad, "--inputs", os.path.join(self.dir, "x.npy"))
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("node 'cut': strided_slice", p.stderr)

    def test_dynamic_recurrent_refused_by_name(self):
        """The recurrent layers are unrolled over the sequence known at pack
        time: a dynamic export's sequence is not, so pack names the layer
        and the shape (exit 1), before writing anything."""
        import torch
        torch.manual_seed(2)
        rnn = torch.nn.LSTM(3, 4, batch_first=True).eval()
        src = self.dynamic_export(rnn, torch.randn(2, 5, 3), "lstm", (0, 1))
        out = os.path.join(self.dir, "lstm.zip")
        p = pack(src, out, "--tag", "t", check=None)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertRegex(p.stderr, r"node '[^']*LSTM[^']*': op 'lstm' \(unrolled over its steps\) "
                         r"is lowered for DL4J from the shape of '[^']+', and it is \[-1, -1, 3\]")
        self.assertFalse(os.path.exists(out))


def dl4j_pool(x, k, s, p, avg):
    """libnd4j's pooling2d as written in helpers/cpu/convolutions_pooling2d.cpp
    (dilation 1, symmetric padding p): output (H + 2p - k) // s + 1; window
    (i, j) starts at i s - p, clamped to the input; max of the cells inside,
    or their sum over their count (extraParam0 0). Windows wholly in the
    padding give NaN here (DL4J's are -FLT_MAX or 0/0): a lowering must cut
    them away."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * p[0] - k[0]) // s[0] + 1, (w + 2 * p[1] - k[1]) // s[1] + 1
    y = np.full((n, c, oh, ow), np.nan)
    for i in range(oh):
        h0, h1 = max(i * s[0] - p[0], 0), min(i * s[0] - p[0] + k[0], h)
        for j in range(ow):
            w0, w1 = max(j * s[1] - p[1], 0), min(j * s[1] - p[1] + k[1], w)
            if h1 > h0 and w1 > w0:
                win = x[:, :, h0:h1, w0:w1].astype(np.float64)
                y[:, :, i, j] = win.mean((2, 3)) if avg else win.max((2, 3))
    return y


def dl4j_strided_slice(x, args):
    """strided_slice's masks and its begins, ends and strides (the named
    arguments) applied with Python's slicing: a begin mask bit opens the
    start, an end mask bit the end; axes past the lists are whole."""
    cut = []
    for a, (b, e, st) in enumerate(zip(args["begin"], args["end"], args["strides"])):
        cut.append(slice(None if args["beginMask"][0] >> a & 1 else b,
                         None if args["endMask"][0] >> a & 1 else e, st))
    for m in ("ellipsisMask", "newAxisMask", "shrinkAxisMask"):
        assert args[m] == [0], args
    return x[tuple(cut)]


def dl4j_depthwise(x, w, b, s, p):
    """libnd4j's depthwise_conv2d (helpers/cpu/convolutions_depthwiseConv2d.cpp),
    NCHW, wFormat 1: w [mC, iC, kH, kW]; output channel c mC + m is input
    channel c correlated with w[m, c] (the [bS, iC, mC, oH, oW] view)."""
    n, ic, h, wd = x.shape
    mc, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    oh, ow = (h + 2 * p[0] - kh) // s[0] + 1, (wd + 2 * p[1] - kw) // s[1] + 1
    y = np.zeros((n, ic, mc, oh, ow))
    for a in range(kh):
        for e in range(kw):
            patch = xp[:, :, a:a + s[0] * (oh - 1) + 1:s[0], e:e + s[1] * (ow - 1) + 1:s[1]]
            y += patch[:, :, None] * w[:, :, a, e].T[None, :, :, None, None]
    y = y.reshape(n, ic * mc, oh, ow)
    return y + (b.reshape(1, -1, 1, 1) if b is not None else 0)


class Lowered(TmpDirCase):
    """Nodes no single DL4J op computes, packed as the DL4J ops that compute
    them (docs/samediff.md, "Lowered nodes"): each archive read back by
    ckptd's own reader verifies against torch, and the graph it holds,
    computed with libnd4j's own rules re-written in numpy above (not with
    ckptd's engine), gives torch's answer too."""

    def verify(self, model, x, y):
        np.save(os.path.join(self.dir, "x.npy"), x)
        np.save(os.path.join(self.dir, "y.npy"), y)
        return run("verify", model, "--inputs", os.path.join(self.dir, "x.npy"), "--expected",
                   os.path.join(self.dir, "y.npy"), "--rtol", "1e-5", "--atol", "1e-5",
                   timeout=120)

    def packed(self, name, src, x, y):
        """Packs src as tag "t", checks that ckptd verifies it against y;
        (graph nodes, params, {value: ndarray} of the graph's weights)."""
        out = os.path.join(self.dir, name + ".zip")
        pack(src, out, "--tag", "t", check=0)
        p = self.verify(out, x, y)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        _, a = sdfb.read_archive(out)
        return sdfb.graph_nodes(a["t"]["graph"]), a["t"]["params"], a["t"]["graph"]

    def torch_module(self, name, module, x, opset=13):
        import torch
        import torch_gen as tg
        tg.need_onnx()
        src = os.path.join(self.dir, name + ".onnx")
        module.eval()
        with torch.no_grad():  # BatchNorm-free: nothing for TrainingMode to keep
            torch.onnx.export(module, (x,), src, opset_version=opset, input_names=["input"],
                              output_names=["output"], do_constant_folding=False)
            return src, module(x).numpy()

    def ids(self, graph):
        v = sdfb.graph_variables(graph)
        return {(x.Id().First(), x.Id().Second()): n for n, x in v.items()}

    def int_args(self, graph, name):
        for i in range(graph.NodesLength()):
            n = graph.Nodes(i)
            if n.Name().decode() == name:
                return [n.ExtraInteger(k) for k in range(n.ExtraIntegerLength())]
        self.fail(f"no node {name}")

    def test_depthwise_with_multiplier_2(self):
        import torch
        torch.manual_seed(11)
        conv = torch.nn.Conv2d(3, 6, (3, 2), stride=(2, 1), padding=(1, 2), groups=3)
        x = torch.randn(2, 3, 9, 8)
        src, y = self.torch_module("dw", conv, x)
        nodes, params, g = self.packed("dw", src, x.numpy(), y)
        self.assertEqual([n[0] for n in nodes], ["reshape", "permute", "depthwise_conv2d"])
        names = self.ids(g)
        dw = nodes[2]
        # libnd4j's iArgs in its order: kH, kW, sH, sW, pH, pW, dH, dW,
        # isSameMode, dataFormat (0 NCHW), wFormat (1: [mC, iC, kH, kW])
        self.assertEqual(self.int_args(g, dw[1]), [3, 2, 2, 1, 1, 2, 1, 1, 0, 0, 1])
        self.assertEqual(dw[2]["wFormat"], [1])
        self.assertEqual([names[i] for i in dw[3]][0], "input")
        self.assertEqual([names[i] for i in dw[3]][1:], [nodes[1][4][0], "bias"])
        self.assertEqual(nodes[0][2]["shape"], [3, 2, 3, 2])       # [iC, mC, kH, kW]
        self.assertEqual(nodes[1][2]["permuteDims"], [1, 0, 2, 3])  # -> [mC, iC, kH, kW]
        self.assertEqual(names[nodes[0][3][0]], "weight")
        # the graph as libnd4j computes it gives torch's answer
        w = params["weight"].reshape(nodes[0][2]["shape"]).transpose(nodes[1][2]["permuteDims"])
        got = dl4j_depthwise(x.numpy(), w, params["bias"], (2, 1), (1, 2))
        np.testing.assert_allclose(got, y, rtol=1e-5, atol=1e-5)
        # multiplier 1, no bias (MobileNet's form): a reshape alone
        conv1 = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False)
        x1 = torch.randn(2, 4, 6, 6)
        src, y1 = self.torch_module("dw1", conv1, x1)
        nodes, params, g = self.packed("dw1", src, x1.numpy(), y1)
        self.assertEqual([n[0] for n in nodes], ["reshape", "depthwise_conv2d"])
        self.assertEqual(nodes[0][2]["shape"], [1, 4, 3, 3])
        self.assertEqual(len(nodes[1][3]), 2)
        got = dl4j_depthwise(x1.numpy(), params["weight"].reshape(1, 4, 3, 3), None, (1, 1),
                             (1, 1))
        np.testing.assert_allclose(got, y1, rtol=1e-5, atol=1e-5)

    def test_groups_2_as_slices_convs_and_concat(self):
        import torch
        torch.manual_seed(12)
        conv = torch.nn.Conv2d(4, 6, 3, padding=1, groups=2)
        x = torch.randn(2, 4, 7, 5)
        src, y = self.torch_module("g2", conv, x)
        nodes, params, g = self.packed("g2", src, x.numpy(), y)
        self.assertEqual([n[0] for n in nodes], ["strided_slice"] * 3 + ["conv2d"] +
                         ["strided_slice"] * 3 + ["conv2d", "concat"])
        names = self.ids(g)
        parts = []
        for k in range(2):
            xs, ws, bs, cv = nodes[4 * k:4 * k + 4]
            self.assertEqual(names[xs[3][0]], "input")
            self.assertEqual((xs[2]["begin"], xs[2]["end"], xs[2]["endMask"]),
                             ([0, 2 * k], [0, 2 * k + 2], [1]))
            self.assertEqual((ws[2]["begin"], ws[2]["end"]), ([3 * k], [3 * k + 3]))
            self.assertEqual((names[ws[3][0]], names[bs[3][0]]), ("weight", "bias"))
            self.assertEqual(self.int_args(g, cv[1]), [3, 3, 1, 1, 1, 1, 1, 1, 0, 0, 1])
            self.assertEqual([names[i] for i in cv[3]], [xs[4][0], ws[4][0], bs[4][0]])
            parts.append(torch.nn.functional.conv2d(*(torch.tensor(
                dl4j_strided_slice(v, a[2]).astype(np.float32)) for v, a in (
                    (x.numpy(), xs), (params["weight"], ws), (params["bias"], bs))),
                padding=1).numpy())
        self.assertEqual(nodes[8][2], {"concatDimension": [1]})
        np.testing.assert_allclose(np.concatenate(parts, 1), y, rtol=1e-5, atol=1e-5)

    def onnx_pool(self, name, op, shape, **attrs):
        onnx = __import__("torch_gen").need_onnx()
        from onnx import helper as h, TensorProto as TP
        node = h.make_node(op, ["input"], ["output"], name="pool", **attrs)
        g = h.make_graph([node], "g", [h.make_tensor_value_info("input", TP.FLOAT, shape)],
                         [h.make_tensor_value_info("output", TP.FLOAT, None)])
        src = os.path.join(self.dir, name + ".onnx")
        onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), src)
        return src

    def check_pool(self, name, nodes, x, y, avg):
        """The pool then a strided_slice, as libnd4j computes them, give y."""
        self.assertEqual([n[0] for n in nodes], ["avgpool2d" if avg else "maxpool2d",
                                                 "strided_slice"])
        a = nodes[0][2]
        self.assertEqual(a["extraParam0"], [0])  # DL4J's padding never counted
        self.assertEqual((a["isSameMode"], a["isNHWC"]), ([0], [0]))
        z = dl4j_pool(x, (a["kH"][0], a["kW"][0]), (a["sH"][0], a["sW"][0]),
                      (a["pH"][0], a["pW"][0]), avg)
        got = dl4j_strided_slice(z, nodes[1][2])
        self.assertEqual(got.shape, y.shape)
        np.testing.assert_allclose(got, y, rtol=1e-5, atol=1e-6)
        return a

    def test_ceil_mode_max_pool(self):
        import torch
        x = torch.randn(2, 3, 16, 15, generator=torch.Generator().manual_seed(13))
        pool = torch.nn.MaxPool2d(3, 2, ceil_mode=True)
        src, y = self.torch_module("mp", pool, x)
        self.assertEqual(y.shape, (2, 3, 8, 7))  # floor mode would give 7 x 7
        nodes, _, g = self.packed("mp", src, x.numpy(), y)
        a = self.check_pool("mp", nodes, x.numpy(), y, avg=False)
        self.assertEqual(self.int_args(g, nodes[0][1]), [3, 3, 2, 2, 2, 0, 1, 1, 0, 0, 0])
        self.assertEqual((a["pH"], a["pW"]), ([2], [0]))  # one stride more on the rows only

    def test_ceil_mode_avg_pool_padding_not_counted(self):
        import torch
        x = torch.randn(2, 2, 16, 11, generator=torch.Generator().manual_seed(14)).numpy()
        y = torch.nn.functional.avg_pool2d(torch.from_numpy(x), 3, 2, 1, ceil_mode=True,
                                           count_include_pad=False).numpy()
        self.assertEqual(y.shape, (2, 2, 9, 6))
        src = self.onnx_pool("ap0", "AveragePool", [2, 2, 16, 11], kernel_shape=[3, 3],
                             strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=0)
        nodes, _, g = self.packed("ap0", src, x, y)
        self.check_pool("ap0", nodes, x, y, avg=True)
        self.assertEqual(self.int_args(g, nodes[0][1]), [3, 3, 2, 2, 3, 1, 1, 1, 0, 0, 0])

    def test_ceil_mode_avg_pool_padding_counted(self):
        import torch
        x = torch.randn(2, 2, 16, 11, generator=torch.Generator().manual_seed(15)).numpy()
        y = torch.nn.functional.avg_pool2d(torch.from_numpy(x), 3, 2, 1, ceil_mode=True,
                                           count_include_pad=True).numpy()
        src = self.onnx_pool("ap1", "AveragePool", [2, 2, 16, 11], kernel_shape=[3, 3],
                             strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)
        nodes, _, g = self.packed("ap1", src, x, y)
        # the counted padding becomes real zeros, then as without it
        self.assertEqual(nodes[0][0], "pad")
        vt, paddings = const_input(g, nodes[0], 1)
        self.assertEqual((vt, paddings.tolist()), (1, [[0, 0], [0, 0], [1, 1], [1, 1]]))
        self.assertEqual(node_args(g, nodes[0][1]), ([0], [0.0]))
        xp = np.pad(x, paddings, constant_values=0.0)
        self.check_pool("ap1", nodes[1:], xp, y, avg=True)
        self.assertEqual(self.int_args(g, nodes[1][1]), [3, 3, 2, 2, 2, 0, 1, 1, 0, 0, 0])

    def test_hard_sigmoid_and_hard_swish(self):
        import torch

        class Hard(torch.nn.Module):
            def forward(self, x):
                return torch.nn.functional.hardswish(x) + torch.nn.functional.hardsigmoid(x)
        x = torch.linspace(-5, 5, 2 * 3 * 7).reshape(2, 3, 7)
        src, y = self.torch_module("hard", Hard(), x, opset=17)  # HardSwish is opset 14
        nodes, _, _ = self.packed("hard", src, x.numpy(), y)
        ops = [n[0] for n in nodes]
        self.assertEqual(ops, ["div_scalar", "add_scalar", "clipbyvalue", "multiply",
                               "mul_scalar", "add_scalar", "clipbyvalue", "add"])
        self.assertEqual(nodes[0][2], {"scalar": [6.0]})
        self.assertEqual(nodes[1][2], {"scalar": [0.5]})
        self.assertEqual(nodes[2][2], {"clipValueMin": [0.0], "clipValueMax": [1.0]})
        self.assertAlmostEqual(nodes[4][2]["scalar"][0], 1 / 6, places=7)  # torch's alpha
        self.assertEqual(nodes[5][2], {"scalar": [0.5]})

    def verify_arrays(self, model, x, y):
        np.save(os.path.join(self.dir, "x.npy"), x)
        np.save(os.path.join(self.dir, "y.npy"), np.asarray(y, np.float32))
        return run("verify", model, "--inputs", os.path.join(self.dir, "x.npy"), "--expected",
                   os.path.join(self.dir, "y.npy"), "--rtol", "1e-6", "--atol", "1e-6",
                   timeout=120)

    def run_dl4j(self, graph, params, feeds):
        """The written graph computed with libnd4j's rules for the ops it
        holds (numpy, not ckptd's engine): reshape (C order), tile
        (transforms/tile.cpp: the repeats as iArgs, one per axis), Where
        (boolean/where.cpp: x, y and the condition of one shape, else the
        op fails; y's element where the condition is 0, else x's), softmax
        over its dimension, and the ops of an unrolled recurrent layer:
        strided_slice (its masks and lists), permute (permuteDims), matmul
        (blas/matmul.cpp: iArgs transX, transY, transZ, here all 0), the
        broadcastable add and multiply, sigmoid, tanh, concat (its dimension
        an iArg), rsub_scalar (T_ARG(0) - x) and identity, and the shape ops of
        a computed broadcast: shape_of (int64 dims), maximum, broadcast_to
        (each dim of x equal to the target's or 1, else the op fails); any
        other op fails the test. feeds: {placeholder: ndarray}; returns {value name: ndarray}."""
        vals = dict(feeds)
        for name, arr in params.items():
            vals[name] = arr
        for i in range(graph.VariablesLength()):
            v = graph.Variables(i)
            if v.Ndarray() is not None:
                vals[v.Name().decode()] = sdfb.array_from_fb(v.Ndarray())
        names = Lowered.ids(self, graph)
        for op, name, args, ins, outs in sdfb.graph_nodes(graph):
            x = [vals[names[i]] for i in ins]
            iargs, targs = node_args(graph, name)
            if op == "reshape" and len(x) == 1:
                y = x[0].reshape(iargs, order="C")
            elif op == "tile":
                self.assertEqual(len(iargs), x[0].ndim, name)
                y = np.tile(x[0], iargs)
            elif op == "Where":
                self.assertEqual(len(x), 3, name)
                self.assertEqual(x[1].shape, x[2].shape, name)
                self.assertEqual(x[0].shape, x[1].shape, name)
                y = np.where(x[0].astype(bool), x[1], x[2])
            elif op == "softmax":
                d = iargs[0]
                e = np.exp(x[0] - x[0].max(axis=d, keepdims=True))
                y = e / e.sum(axis=d, keepdims=True)
            elif op == "strided_slice" and len(x) == 1:
                y = dl4j_strided_slice(x[0], args)
            elif op == "permute":
                y = x[0].transpose(iargs)
            elif op == "matmul":
                self.assertEqual(iargs, [0, 0, 0], name)
                y = x[0].astype(np.float64) @ x[1]
            elif op in ("add", "multiply"):
                self.assertEqual(len(x), 2, name)
                y = x[0] + x[1] if op == "add" else x[0] * x[1]
            elif op in ("sigmoid", "tanh"):
                y = 1 / (1 + np.exp(-x[0])) if op == "sigmoid" else np.tanh(x[0])
            elif op == "concat":
                y = np.concatenate(x, axis=iargs[0])
            elif op == "rsub_scalar":
                y = targs[0] - x[0]
            elif op == "identity":
                y = x[0]
            elif op == "shape_of":  # shape/shape.cpp: x's dims, int64
                y = np.array(x[0].shape, np.int64)
            elif op == "gather":  # transforms/gather.cpp: the indices input 1, integers
                self.assertEqual(x[1].dtype.kind, "i", name)
                y = np.take(x[0], x[1], axis=iargs[0] if iargs else 0)
            elif op == "expand_dims":  # shape/expand_dims.cpp: one axis
                self.assertEqual(len(iargs), 1, name)
                y = np.expand_dims(x[0], iargs[0])
            elif op == "reshape" and len(x) == 2:  # the shape input 1, integers, -1 inferred
                self.assertEqual(x[1].dtype.kind, "i", name)
                self.assertNotIn(0, list(x[1]), name)
                y = x[0].reshape([int(d) for d in x[1]], order="C")
            elif op == "strided_slice" and len(x) > 1:  # begin, end, strides as inputs
                self.assertEqual((len(x), iargs), (4, [0, 0, 0, 0, 0]), name)
                cut = []
                for a, (b, e, st) in enumerate(zip(x[1], x[2], x[3])):
                    # libnd4j's input form: an end of -1 is "to the end", an end
                    # or begin past the axis refused
                    self.assertTrue(0 <= b <= x[0].shape[a] and 0 <= e <= x[0].shape[a], name)
                    cut.append(slice(int(b), int(e), int(st)))
                y = x[0][tuple(cut)]
            elif op == "range":  # parity_ops/range.cpp: input 0's dtype, a non-empty range
                self.assertNotEqual(x[0], x[1], name)
                y = np.arange(x[0], x[1], x[2], dtype=x[0].dtype)
            elif op in ("greater", "equals", "less"):
                y = {"greater": np.greater, "equals": np.equal, "less": np.less}[op](x[0], x[1])
            elif op == "fill":  # parity_ops/fill.cpp: input 1 assigned
                y = np.full([int(d) for d in x[0]], x[1], dtype=x[1].dtype)
            elif op in ("add_scalar", "mul_scalar", "div_scalar"):
                # legacy scalar ops: the scalar in the array's type (an int64
                # array's division truncates, C++'s /)
                k = targs[0]
                if x[0].dtype.kind == "i":
                    k = int(k)
                    y = {"add_scalar": x[0] + k, "mul_scalar": x[0] * k,
                         "div_scalar": np.trunc(x[0] / k).astype(x[0].dtype)}[op]
                else:
                    y = {"add_scalar": x[0] + np.float32(k), "mul_scalar": x[0] * np.float32(k),
                         "div_scalar": x[0] / np.float32(k)}[op].astype(x[0].dtype)
            elif op == "cast":  # datatypes/cast.cpp: INT_ARG(0) a DataType
                y = x[0].astype({5: np.float32, 10: np.int64, 9: np.int32, 1: bool}[iargs[0]])
            elif op == "maximum":
                y = np.maximum(x[0], x[1])
            elif op == "broadcast_to":  # shape/broadcast_to.cpp: x's dims equal or 1
                t = [int(d) for d in x[1]]
                for d, want in zip(x[0].shape[::-1], t[::-1]):
                    self.assertIn(d, (1, want), name)
                y = np.broadcast_to(x[0], t)
            else:
                self.fail(f"node {name}: op {op} not computed here")
            vals[outs[0]] = y
        return vals

    def test_where_broadcast_with_tile(self):
        """GPT's causal mask: where(mask [T, T], -inf, scores [N, H, T, T])
        as torch's masked_fill exports it, and a where whose chosen value is
        a weight [H, 1, T]: libnd4j's Where takes operands of one shape, so
        each other operand is reshaped to the output's rank and tiled to its
        shape (exact copies: the -inf fill is never multiplied)."""
        import torch

        class Masked(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fill = torch.nn.Parameter(torch.randn(2, 1, 5))

            def forward(self, s):
                i = torch.arange(s.shape[-1])
                mask = i.unsqueeze(0) > i.unsqueeze(1)  # key after query
                a = s.masked_fill(mask, float("-inf")).softmax(-1)
                return torch.where(mask, self.fill, a)

        torch.manual_seed(17)
        x = torch.randn(3, 2, 5, 5)
        src, y = self.torch_module("where", Masked(), x)
        nodes, params, g = self.packed("where", src, x.numpy(), y)
        names = self.ids(g)
        wheres = [n for n in nodes if n[0] == "Where"]
        self.assertEqual(len(wheres), 2)
        made = {n[4][0]: n for n in nodes}  # value -> the node that makes it
        # the mask and the -inf fill broadcast; the scores are the output's shape
        mask_in, fill_in = (made[names[i]] for i in wheres[0][3][:2])
        self.assertEqual(names[wheres[0][3][2]], "input")
        for tiled, shape, reps in ((mask_in, [1, 1, 5, 5], [3, 2, 1, 1]),
                                   (fill_in, [1, 1, 1, 1], [3, 2, 5, 5])):
            self.assertEqual((tiled[0], tiled[2]), ("tile", {"jaxis": reps}))
            self.assertEqual(node_args(g, tiled[1])[0], reps)
            rs = made[names[tiled[3][0]]]
            self.assertEqual((rs[0], rs[2]), ("reshape", {"shape": shape}))
        # the weight [2, 1, 5] as [1, 2, 1, 5] tiled by [3, 1, 5, 1]; the
        # softmax already [3, 2, 5, 5]
        mask_in, fill, soft = (made.get(names[i]) for i in wheres[1][3])
        self.assertEqual(mask_in[0], "tile")
        self.assertEqual((fill[0], fill[2]), ("tile", {"jaxis": [3, 1, 5, 1]}))
        self.assertEqual(made[names[fill[3][0]]][2], {"shape": [1, 2, 1, 5]})
        self.assertEqual(names[made[names[fill[3][0]]][3][0]], "fill")
        self.assertEqual(soft[0], "softmax")
        vals = self.run_dl4j(g, params, {"input": x.numpy()})
        np.testing.assert_allclose(vals[wheres[1][4][0]], y, rtol=1e-6, atol=1e-6)
        self.assertTrue(np.isneginf(vals[wheres[0][4][0]]).any())  # the fill kept exactly
        # a batch not known at pack time: the broadcast computed in the graph
        # (shape_of, led by 1s, maximum, broadcast_to; docs/samediff.md),
        # computed with libnd4j's rules at batches the graph never saw
        onnx = __import__("torch_gen").need_onnx()
        from onnx import helper as h, numpy_helper as nh, TensorProto as TP
        gr = h.make_graph([h.make_node("Where", ["m", "input", "z"], ["output"], name="w")], "g",
                          [h.make_tensor_value_info("input", TP.FLOAT, ["N", 4])],
                          [h.make_tensor_value_info("output", TP.FLOAT, None)],
                          initializer=[nh.from_array(np.array([True, False, True, False]), "m"),
                                       nh.from_array(np.zeros(1, np.float32), "z")])
        dyn = os.path.join(self.dir, "dyn.onnx")
        onnx.save_model(h.make_model(gr, opset_imports=[h.make_opsetid("", 13)]), dyn)
        pack(dyn, os.path.join(self.dir, "dyn.zip"), "--tag", "t", check=0)
        _, a = sdfb.read_archive(os.path.join(self.dir, "dyn.zip"))
        g, params = a["t"]["graph"], a["t"]["params"]
        ops = [n[0] for n in sdfb.graph_nodes(g)]
        self.assertEqual(ops.count("broadcast_to"), 3, ops)
        self.assertNotIn("tile", ops)
        m = np.array([True, False, True, False])
        for batch in (1, 3):
            x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
            vals = self.run_dl4j(g, params, {"input": x})
            np.testing.assert_array_equal(vals["output"], np.where(m, x, np.float32(0)))
            p = self.verify_arrays(os.path.join(self.dir, "dyn.zip"), x, np.where(m, x, 0))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_expand_of_computed_shape_as_broadcast_to(self):
        """ONNX Expand where a dim is not known at pack time: x [N, 1, 3] by
        the shape of a second input y [M, 3] (computed, shorter than x's
        rank) and by a constant [4, 3]. Written as shape_of x, the shape led
        by 1s (concat with a constant; the constant one padded whole),
        maximum, broadcast_to (docs/samediff.md); computed with libnd4j's
        rules (broadcast_to refuses a dim of x that is neither the target's
        nor 1) and through ckptd's reader, numpy's broadcast at sizes the
        graph never saw."""
        onnx = __import__("torch_gen").need_onnx()
        from onnx import helper as h, numpy_helper as nh, TensorProto as TP
        four = np.arange(12, dtype=np.float32).reshape(4, 3)
        cases = {
            "computed": ([h.make_node("Shape", ["y"], ["s"], name="sh"),
                          h.make_node("Expand", ["x", "s"], ["e"], name="ex"),
                          h.make_node("Add", ["e", "y"], ["output"], name="add")],
                         [("x", ["N", 1, 3]), ("y", ["M", 3])], []),
            "constant": ([h.make_node("Shape", ["z"], ["s"], name="sh"),
                          h.make_node("Expand", ["x", "s"], ["e"], name="ex"),
                          h.make_node("Add", ["e", "z"], ["output"], name="add")],
                         [("x", ["N", 1, 3])], [nh.from_array(four, "z")]),
        }
        for case, (nodes, ins, inits) in cases.items():
            with self.subTest(case=case):
                g = h.make_graph(nodes, "g", [h.make_tensor_value_info(k, TP.FLOAT, d)
                                              for k, d in ins],
                                 [h.make_tensor_value_info("output", TP.FLOAT, None)],
                                 initializer=inits)
                src = os.path.join(self.dir, case + ".onnx")
                onnx.save_model(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), src)
                out = os.path.join(self.dir, case + ".zip")
                pack(src, out, "--tag", "t", check=0)
                _, a = sdfb.read_archive(out)
                gr, params = a["t"]["graph"], a["t"]["params"]
                made = {n[1]: n for n in sdfb.graph_nodes(gr)}
                self.assertEqual(made["ex"][0], "broadcast_to")
                ops = [n[0] for n in made.values()]
                self.assertIn("maximum", ops)
                self.assertNotIn("tile", ops)
                for n, m in ((1, 4), (3, 4), (2, 6)):
                    if case == "constant" and m != 4:
                        continue
                    rng = np.random.default_rng(n + m)
                    feeds = {"x": rng.standard_normal((n, 1, 3)).astype(np.float32)}
                    if case == "computed":
                        feeds["y"] = rng.standard_normal((m, 3)).astype(np.float32)
                    want = feeds["x"] + feeds.get("y", four)
                    vals = self.run_dl4j(gr, params, feeds)
                    np.testing.assert_allclose(vals["output"], want, rtol=0, atol=0)
                    args = []
                    for k in feeds:
                        np.save(os.path.join(self.dir, k + ".npy"), feeds[k])
                        args += ["--inputs", os.path.join(self.dir, k + ".npy")]
                    np.save(os.path.join(self.dir, "want.npy"), want)
                    p = run("verify", out, *args, "--expected", os.path.join(self.dir, "want.npy"),
                            "--rtol", "0", "--atol", "0", timeout=120)
                    self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_pad_paddings_as_input_array(self):
        """ONNX Pad as libnd4j's pad reads it (transforms/pad.cpp): the
        paddings a constant int64 input [rank, 2], the mode INT_ARG(0) 0, the
        value T_ARG(0); the form ckptd wrote before (the paddings as iArgs
        after the mode) still reads back."""
        onnx = __import__("torch_gen").need_onnx()
        from onnx import helper as h, numpy_helper as nh, TensorProto as TP
        pads = np.array([0, 1, 2, 0, 1, 0, 3, 2], np.int64)  # ONNX: all begins, all ends
        inits = [nh.from_array(pads, "pads"), nh.from_array(np.array(1.5, np.float32), "v")]
        node = h.make_node("Pad", ["input", "pads", "v"], ["output"], name="pad", mode="constant")
        gr = h.make_graph([node], "g", [h.make_tensor_value_info("input", TP.FLOAT, [2, 3, 4, 2])],
                          [h.make_tensor_value_info("output", TP.FLOAT, None)], initializer=inits)
        src = os.path.join(self.dir, "pad.onnx")
        onnx.save_model(h.make_model(gr, opset_imports=[h.make_opsetid("", 13)]), src)
        x = np.random.default_rng(18).standard_normal((2, 3, 4, 2)).astype(np.float32)
        want = np.pad(x, list(zip(pads[:4], pads[4:])), constant_values=1.5)
        nodes, params, g = self.packed("pad", src, x, want)
        self.assertEqual([n[0] for n in nodes], ["pad"])
        self.assertEqual(nodes[0][2], {"mode": [0], "padValue": [1.5]})
        self.assertEqual(node_args(g, "pad"), ([0], [1.5]))
        vt, paddings = const_input(g, nodes[0], 1)
        self.assertEqual((vt, paddings.dtype.str), (1, ">i8"))
        self.assertEqual(paddings.tolist(), [[0, 1], [1, 0], [2, 3], [0, 2]])
        self.assertEqual(const_input(g, nodes[0], 0)[0], 3)  # the placeholder, then the array
        # libnd4j's constant mode: each axis grown by paddings[axis] filled with the value
        np.testing.assert_array_equal(np.pad(x, paddings, constant_values=1.5), want)
        # the form written before: paddings as iArgs and a named list
        for args in ({"__extraInteger": [0, 0, 1, 1, 0, 2, 3, 0, 2]},
                     {"mode": ("l", [0]), "padValue": ("d", [1.5]),
                      "paddings": ("l", [0, 1, 1, 0, 2, 3, 0, 2])}):
            old = os.path.join(self.dir, "old.fb")
            if "__extraInteger" in args:
                args = dict(args, padValue=("d", [1.5]))
            sdfb.write_graph(old, {}, {"input": [2, 3, 4, 2]},
                             [("pad", "pad", ["input"], ["out"], args)], ["out"])
            p = self.verify(old, x, want)
            self.assertEqual(p.returncode, 0, f"{args}: {p.stdout}{p.stderr}")

    def onnx_recurrent(self, name, op, x, inits, attrs, outputs=("Y", "Y_h", "Y_c")):
        """An ONNX graph of one RNN/GRU/LSTM node on input X (a static
        [T, batch, I]) with inits {input name: array} (absent ones ""):
        its path."""
        onnx = __import__("torch_gen").need_onnx()
        from onnx import helper as h, numpy_helper as nh, TensorProto as TP
        order = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
        order = order[:8 if op == "LSTM" else 6]
        ins = [k if k == "X" or k in inits else "" for k in order]
        while ins[-1] == "":
            ins.pop()
        node = h.make_node(op, ins, list(outputs), name="rec", **attrs)
        gr = h.make_graph([node], "g", [h.make_tensor_value_info("X", TP.FLOAT, list(x.shape))],
                          [h.make_tensor_value_info(o, TP.FLOAT, None) for o in outputs],
                          initializer=[nh.from_array(v, k) for k, v in inits.items()])
        src = os.path.join(self.dir, name + ".onnx")
        onnx.save_model(h.make_model(gr, opset_imports=[h.make_opsetid("", 14)]), src)
        return src

    def test_recurrent_unrolled_as_dl4j_ops(self):
        """ONNX's LSTM, GRU (linear_before_reset, torch's) and RNN, one
        direction or both, with and without biases and initial states,
        written as the DL4J ops of one step unrolled over the sequence
        (strided_slice, permute, matmul, add, sigmoid, tanh, multiply,
        rsub_scalar, reshape, concat): read back by ckptd and computed by
        libnd4j's rules in numpy, Y, Y_h and Y_c are ONNX's (the formulas of
        its operator spec, in numpy here)."""
        rng = np.random.default_rng(31)
        T, N, I, H = 4, 3, 5, 2

        def sig(v):
            return 1 / (1 + np.exp(-v))

        def onnx_ref(op, x, inits, direction, lbr=0):
            """ONNX's RNN/GRU/LSTM (default activations) in float64."""
            G = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
            D = 2 if direction == "bidirectional" else 1
            W, R = inits["W"], inits["R"]
            B = inits.get("B", np.zeros((D, 2 * G * H), np.float32))
            h0 = inits.get("initial_h", np.zeros((D, N, H), np.float32))
            c0 = inits.get("initial_c", np.zeros((D, N, H), np.float32))
            Y = np.zeros((T, D, N, H))
            Yh, Yc = np.zeros((D, N, H)), np.zeros((D, N, H))
            for d in range(D):
                h, c = h0[d].astype(np.float64), c0[d].astype(np.float64)
                Wb, Rb = B[d, :G * H], B[d, G * H:]
                rev = direction == "reverse" or d == 1
                for t in (reversed(range(T)) if rev else range(T)):
                    xw = x[t] @ W[d].T.astype(np.float64) + Wb
                    if op == "RNN":
                        h = np.tanh(xw + h @ R[d].T + Rb)
                    elif op == "LSTM":
                        g = xw + h @ R[d].T + Rb
                        i, o, f, cc = (g[:, k * H:(k + 1) * H] for k in range(4))
                        c = sig(f) * c + sig(i) * np.tanh(cc)
                        h = sig(o) * np.tanh(c)
                    else:
                        hr = h @ R[d].T
                        z = sig(xw[:, :H] + hr[:, :H] + Rb[:H])
                        r = sig(xw[:, H:2 * H] + hr[:, H:2 * H] + Rb[H:2 * H])
                        if lbr:
                            n = np.tanh(xw[:, 2 * H:] + r * (hr[:, 2 * H:] + Rb[2 * H:]))
                        else:
                            n = np.tanh(xw[:, 2 * H:] + (r * h) @ R[d, 2 * H:].T + Rb[2 * H:])
                        h = (1 - z) * n + z * h
                    Y[t, d] = h
                Yh[d], Yc[d] = h, c
            return {"Y": Y, "Y_h": Yh, "Y_c": Yc}

        def weights(op, D, bias=True, init_h=False, init_c=False):
            G = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
            w = {"W": rng.standard_normal((D, G * H, I)), "R": rng.standard_normal((D, G * H, H))}
            if bias:
                w["B"] = rng.standard_normal((D, 2 * G * H))
            if init_h:
                w["initial_h"] = rng.standard_normal((D, N, H))
            if init_c:
                w["initial_c"] = rng.standard_normal((D, N, H))
            return {k: (0.7 * v).astype(np.float32) for k, v in w.items()}

        cases = [("lstm_both", "LSTM", "bidirectional", weights("LSTM", 2, True, True, True), {}),
                 ("lstm_rev_bare", "LSTM", "reverse", weights("LSTM", 1, False), {}),
                 ("gru_both", "GRU", "bidirectional", weights("GRU", 2, True, True),
                  {"linear_before_reset": 1}),
                 ("gru_fwd", "GRU", "forward", weights("GRU", 1, True), {"linear_before_reset": 1}),
                 ("rnn_rev", "RNN", "reverse", weights("RNN", 1, True, True), {}),
                 ("rnn_both_bare", "RNN", "bidirectional", weights("RNN", 2, False), {})]
        x = rng.standard_normal((T, N, I)).astype(np.float32)
        allowed = {"strided_slice", "reshape", "permute", "matmul", "add", "multiply", "sigmoid",
                   "tanh", "rsub_scalar", "concat", "identity"}
        for name, op, direction, inits, extra in cases:
            with self.subTest(name):
                outs = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
                src = self.onnx_recurrent(name, op, x, inits,
                                          dict(hidden_size=H, direction=direction, **extra), outs)
                want = onnx_ref(op, x.astype(np.float64), inits, direction,
                                extra.get("linear_before_reset", 0))
                out = os.path.join(self.dir, name + ".zip")
                pack(src, out, "--tag", "t", check=0)
                saved = os.path.join(self.dir, name + ".out")
                os.makedirs(saved, exist_ok=True)
                np.save(os.path.join(self.dir, "x.npy"), x)
                p = run("verify", out, "--inputs", os.path.join(self.dir, "x.npy"),
                        "--save-outputs", saved, timeout=120)
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
                _, a = sdfb.read_archive(out)
                g, params = a["t"]["graph"], a["t"]["params"]
                ops = {n[0] for n in sdfb.graph_nodes(g)}
                self.assertLessEqual(ops, allowed, name)
                vals = self.run_dl4j(g, params, {"X": x})
                for o in outs:
                    got = np.load(os.path.join(saved, o + ".npy"))
                    np.testing.assert_allclose(got, want[o], rtol=1e-5, atol=1e-5,
                                               err_msg=f"{name} {o}: ckptd's reader")
                    np.testing.assert_allclose(vals[o], want[o], rtol=1e-5, atol=1e-5,
                                               err_msg=f"{name} {o}: libnd4j's rules")

    def test_recurrent_refusals_name_the_node(self):
        """What the unrolled form does not say is refused naming the node and
        the op before anything is written (exit 4): LSTM peepholes, GRU
        without linear_before_reset, layout 1; a sequence whose length is not
        known at pack time names the node and the value (exit 1, as the other
        lowerings' unknown shapes)."""
        rng = np.random.default_rng(32)
        T, N, I, H = 3, 2, 4, 2
        x = rng.standard_normal((T, N, I)).astype(np.float32)

        def w(*shape):
            return rng.standard_normal(shape).astype(np.float32)

        cases = [("peep", "LSTM", {"W": w(1, 8, I), "R": w(1, 8, H), "P": w(1, 6)}, {},
                  "op 'lstm' with peepholes"),
                 ("lbr0", "GRU", {"W": w(1, 6, I), "R": w(1, 6, H)}, {},
                  "op 'gru' without linear_before_reset"),
                 ("layout1", "RNN", {"W": w(1, 2, I), "R": w(1, 2, H)}, {"layout": 1},
                  "op 'rnn' with layout 1")]
        for name, op, inits, extra, needle in cases:
            with self.subTest(name):
                src = self.onnx_recurrent(name, op, x if not extra else x.transpose(1, 0, 2),
                                          inits, dict(hidden_size=H, **extra), ("Y",))
                out = os.path.join(self.dir, name + ".zip")
                p = pack(src, out, "--tag", "t", check=4)
                self.assertIn(f"node 'rec': {needle}", p.stderr)
                self.assertFalse(os.path.exists(out), name)
        onnx = __import__("torch_gen").need_onnx()
        from onnx import helper as h, numpy_helper as nh, TensorProto as TP
        gr = h.make_graph([h.make_node("RNN", ["X", "W", "R"], ["Y"], name="rec", hidden_size=H)],
                          "g", [h.make_tensor_value_info("X", TP.FLOAT, ["T", N, I])],
                          [h.make_tensor_value_info("Y", TP.FLOAT, None)],
                          initializer=[nh.from_array(w(1, H, I), "W"),
                                       nh.from_array(w(1, H, H), "R")])
        dyn = os.path.join(self.dir, "dyn.onnx")
        onnx.save_model(h.make_model(gr, opset_imports=[h.make_opsetid("", 14)]), dyn)
        p = pack(dyn, os.path.join(self.dir, "dyn.zip"), "--tag", "t", check=1)
        self.assertIn("node 'rec': op 'rnn' (unrolled over its steps)", p.stderr)
        self.assertIn("[-1, 2, 4]", p.stderr)

    def test_expand_of_constant_shape_as_reshape_and_tile(self):
        """ONNX Expand to a constant shape of a value that does not fold
        (torch's zero initial states of an RNN are a Slice of a constant):
        libnd4j has no numpy broadcast_to of an iArg shape, so the operand
        is reshaped to the output's rank and tiled to its shape, then an
        identity gives the node's output."""
        onnx = __import__("torch_gen").need_onnx()
        from onnx import helper as h, numpy_helper as nh, TensorProto as TP
        node = h.make_node("Expand", ["input", "shape"], ["output"], name="ex")
        gr = h.make_graph([node], "g", [h.make_tensor_value_info("input", TP.FLOAT, [3, 1])],
                          [h.make_tensor_value_info("output", TP.FLOAT, None)],
                          initializer=[nh.from_array(np.array([2, 3, 4], np.int64), "shape")])
        src = os.path.join(self.dir, "expand.onnx")
        onnx.save_model(h.make_model(gr, opset_imports=[h.make_opsetid("", 13)]), src)
        x = np.random.default_rng(33).standard_normal((3, 1)).astype(np.float32)
        want = np.broadcast_to(x, (2, 3, 4))
        nodes, params, g = self.packed("expand", src, x, want)
        self.assertEqual([n[0] for n in nodes], ["reshape", "tile", "identity"])
        self.assertEqual(nodes[0][2], {"shape": [1, 3, 1]})
        self.assertEqual(nodes[1][2], {"jaxis": [2, 1, 4]})
        vals = self.run_dl4j(g, params, {"input": x})
        np.testing.assert_array_equal(vals["output"], want)

    def test_dl4j_depthwise_weight_formats_read(self):
        """depthwise_conv2d as DL4J itself may write it: weights stored in
        wFormat 0 [kH, kW, iC, mC] (libnd4j's default) or 2 [mC, kH, kW, iC],
        read back as the same convolution; forms ckptd cannot say are
        refused by name."""
        rng = np.random.default_rng(16)
        x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
        w1 = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)  # [mC, iC, kH, kW]
        b = rng.standard_normal(6).astype(np.float32)
        want = dl4j_depthwise(x, w1, b, (1, 2), (1, 1)).astype(np.float32)
        for wf, w in ((0, w1.transpose(2, 3, 1, 0)), (1, w1), (2, w1.transpose(0, 2, 3, 1))):
            src = os.path.join(self.dir, f"wf{wf}.fb")
            iargs = [3, 3, 1, 2, 1, 1, 1, 1, 0, 0] + ([wf] if wf else [])
            sdfb.write_graph(src, {"w": np.ascontiguousarray(w), "b": b}, {"input": [2, 3, 6, 5]},
                             [("depthwise_conv2d", "dw", ["input", "w", "b"], ["out"],
                               {"__extraInteger": iargs})], ["out"])
            p = self.verify(src, x, want)
            self.assertEqual(p.returncode, 0, f"wFormat {wf}: {p.stdout}{p.stderr}")
        for iargs, needle in (([3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 1], "isSameMode 1"),
                              ([3, 3, 1, 1, 1, 1, 1, 1, 0, 1, 1], "dataFormat 1"),
                              ([2, 3, 1, 1, 1, 1, 1, 1, 0, 0, 1], "kernel 2x3 does not match")):
            src = os.path.join(self.dir, "bad.fb")
            sdfb.write_graph(src, {"w": w1}, {"input": [2, 3, 6, 5]},
                             [("depthwise_conv2d", "dw", ["input", "w"], ["out"],
                               {"__extraInteger": iargs})], ["out"])
            p = run("verify", src)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("node 'dw'", p.stderr)
            self.assertIn(needle, p.stderr)
        # weights whose shape the reader cannot know (a graph input)
        src = os.path.join(self.dir, "bad.fb")
        sdfb.write_graph(src, {}, {"input": [2, 3, 6, 5], "w": [2, 3, 3, 3]},
                         [("depthwise_conv2d", "dw", ["input", "w"], ["out"],
                           {"__extraInteger": [3, 3, 1, 1, 1, 1, 1, 1, 0, 0, 1]})], ["out"])
        p = run("verify", src)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("depthwise_conv2d weights 'w' are not a stored rank-4 array", p.stderr)


class Bad(TmpDirCase):
    def archive(self, members):
        p = os.path.join(self.dir, "bad.zip")
        with zipfile.ZipFile(p, "w") as z:
            for n, d in members.items():
                z.writestr(n, d)
        return p

    def good_members(self):
        src = os.path.join(self.dir, "src.fb")
        sdfb.mlp(src, weights(9))
        out = os.path.join(self.dir, "good.zip")
        pack(src, out, "--tag", "a")
        pack(src, out, "--tag", "b")
        with zipfile.ZipFile(out) as z:
            return {n: z.read(n) for n in z.namelist()}

    def expect(self, members, *needles, tag=None):
        p = inspect(self.archive(members) + ("#" + tag if tag else ""), check=1)
        for n in needles:
            self.assertIn(n, p.stderr)
        self.assertIn("bad.zip", p.stderr)

    def test_every_bad_archive_is_named(self):
        m = self.good_members()
        self.assertEqual(m["b/params.txt"], b"W1 a/0\nb1 a/1\nW2 a/2\nb2 a/3\n")
        self.expect(dict(m, **{"c/graph.fb": m["a/graph.fb"]}), "'c/graph.fb'", "tags.txt")
        x = dict(m)
        del x["a/graph.fb"]
        self.expect(x, "'a/graph.fb' is missing")
        self.expect(dict(m, **{"tags.txt": b"a\nb\nA\n"}), "appears twice")
        self.expect(dict(m, **{"b/params.txt": b"W1 a/9\n"}), "a/params/9.fb", "no member")
        self.expect(dict(m, **{"b/params.txt": b"W1 zz/0\n"}), "unknown tag 'zz'")
        self.expect(dict(m, **{"tags.txt": b"b\na\n"}), "circular or forward", tag="b")
        self.expect(dict(m, **{"b/params.txt": b"W1 b/0\n"}), "circular or forward")
        self.expect(dict(m, **{"b/graph.fb": m["b/graph.fb"][:40]}), "b/graph.fb")
        self.expect(dict(m, **{"a/params/0.fb": b"\x01\x02"}), "a/params/0.fb")  # via b's reference
        self.expect(dict(m, **{"../evil": b"x"}), "../evil")
        self.expect(dict(m, **{"tags.txt": b"a/x\n"}), "not a valid tag")
        p = inspect(self.archive(m) + "#zzz", check=1)
        self.assertIn("no tag 'zzz'", p.stderr)
        # a truncated archive and a file that is not a zip
        good = os.path.join(self.dir, "good.zip")
        data = open(good, "rb").read()
        trunc = os.path.join(self.dir, "trunc.zip")
        with open(trunc, "wb") as f:
            f.write(data[: len(data) // 2])
        self.assertNotEqual(inspect(trunc, check=None).returncode, 0)
        p = pack(os.path.join(self.dir, "src.fb"), trunc, check=1)
        self.assertIn("trunc.zip", p.stderr)


class Crash(TmpDirCase):
    """kill -9 at random instants of an append: the archive always opens with
    every tag committed before, each still byte-identical to its source."""

    ROUNDS = 50

    def test_kill_9_during_appends(self):
        rng = np.random.default_rng(12)
        srcs = []
        for i in range(4):
            # ~6 MiB per checkpoint so an append takes long enough to be hit
            w = {"W1": rng.standard_normal((256, 2048)).astype(np.float32),
                 "b1": rng.standard_normal(2048).astype(np.float32),
                 "W2": rng.standard_normal((2048, 512)).astype(np.float32),
                 "b2": rng.standard_normal(512).astype(np.float32)}
            p = os.path.join(self.dir, f"c{i}.fb")
            sdfb.mlp(p, w)
            srcs.append((p, w))
        out = os.path.join(self.dir, "run.zip")
        t0 = time.monotonic()
        pack(srcs[0][0], out, "--tag", "t0")
        span = time.monotonic() - t0
        committed = {"t0": 0}
        rnd = random.Random(7)
        kills = 0
        for r in range(1, self.ROUNDS + 1):
            k = r % len(srcs)
            tag = f"t{r}"
            proc = subprocess.Popen([CKPTD, "pack", "--format", "samediff", srcs[k][0], "-o", out,
                                     "--tag", tag], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
            time.sleep(rnd.uniform(0, span * 1.3))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.communicate()
            if proc.returncode == 0:
                committed[tag] = k
            doc = json.loads(run("inspect", out, "--json", check=0).stdout)  # rolls back, reads
            tags = doc["metadata"]["tags"].split(",")
            for t in committed:
                self.assertIn(t, tags, f"round {r}")
            if tag in tags:
                committed[tag] = k
        self.assertGreater(kills, self.ROUNDS // 4)
        self.assertFalse(os.path.exists(out + ".journal"))
        tags, a = sdfb.read_archive(out)
        self.assertEqual(sorted(tags), sorted(committed))
        for t, k in committed.items():
            for name, arr in srcs[k][1].items():
                np.testing.assert_array_equal(a[t]["params"][name], arr, err_msg=f"{t}/{name}")
        # one more append after all that works and shares everything: the
        # source of t0, the one tag sure to be committed (a random run of kills
        # may take every round of another source)
        p = pack(srcs[0][0], out, "--tag", "final")
        self.assertIn("0 parameters written, 4 shared", p.stdout)


if __name__ == "__main__":
    unittest.main()
