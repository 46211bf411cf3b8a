"""Files made by the real frameworks for the tests: PyTorch checkpoints with
torch.save (Debian's python3-torch) and ONNX models with torch.onnx.export
(python3-onnx), plus hostile pickles inside torch's zip layout. Import only
under /usr/bin/python3; callers skip when torch or onnx is missing.

Everything a test compares against comes from torch.load / onnx.load /
numpy here, never from ckptd."""
import os
import struct
import unittest
import zipfile



def need_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        raise unittest.SkipTest("python3-torch is not installed")
    import torch
    torch.manual_seed(0)
    return torch


def need_onnx():
    need_torch()
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise unittest.SkipTest("python3-onnx is not installed")
    import onnx
    return onnx


def as_numpy(t):
    """A tensor's values as numpy (bfloat16 through float32, which holds it exactly)."""
    import torch
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    return t.contiguous().numpy()


# ---- .pt files ----

def every_dtype_state_dict():
    """One tensor of each dtype torch 1.13 saves (values exact in a double)."""
    import torch
    base = torch.arange(-6, 6, dtype=torch.float64).reshape(3, 4) * 0.75
    sd = {}
    for name, dt in [("f32", torch.float32), ("f64", torch.float64), ("f16", torch.float16),
                     ("bf16", torch.bfloat16), ("i8", torch.int8), ("i16", torch.int16),
                     ("i32", torch.int32), ("i64", torch.int64)]:
        sd[name] = base.to(dt) if dt.is_floating_point else (base * 4).to(dt)
    sd["u8"] = torch.arange(0, 240, 20, dtype=torch.uint8).reshape(3, 4)
    sd["bool"] = torch.tensor([[True, False, True, True], [False] * 4, [True] * 4])
    sd["scalar"] = torch.tensor(2.5)
    sd["empty"] = torch.zeros(0, 3)
    sd["big_i64"] = torch.tensor([-(2 ** 40), 2 ** 40 + 3])
    return sd


def mlp():
    import torch
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def training_checkpoint():
    """{"model": state_dict, "optimizer": Adam state, "epoch": 3, ...} after one step."""
    import torch
    m = mlp()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    m(torch.ones(2, 8)).sum().backward()
    opt.step()
    return {"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
            "loss": 0.125, "tag": "run-7", "best": None}


def tied_and_views():
    """Tied weights (two names, one storage), a transposed and a sliced view of
    one storage, an expanded (stride 0) tensor and a channels-last tensor."""
    import torch

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(5, 3)
            self.head = torch.nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight

    sd = dict(Tied().state_dict())
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd["base"] = base
    sd["transposed"] = base.t()
    sd["cols"] = base[:, 1:5:2]
    sd["row2"] = base[2]
    sd["expanded"] = torch.tensor([1.5, -2.0, 3.0]).expand(4, 3)
    sd["nhwc"] = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(
        2, 3, 2, 2).contiguous(memory_format=torch.channels_last)
    return sd


def save(obj, path, **kw):
    import torch
    torch.save(obj, path, **kw)
    return path


def load(path):
    import torch
    return torch.load(path)


def flatten(obj, prefix=""):
    """(tensors, scalars) of a loaded checkpoint, named by path as ckptd names them."""
    import torch
    tensors, scalars = {}, {}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    for k, v in items:
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, torch.Tensor):
            tensors[name] = v
        elif isinstance(v, (dict, list, tuple)) and any(
                isinstance(x, (torch.Tensor, dict, list, tuple))
                for x in (v.values() if isinstance(v, dict) else v)):
            t, s = flatten(v, name)
            tensors.update(t)
            scalars.update(s)
        else:
            scalars[name] = v
    return tensors, scalars


# ---- hostile pickles in torch's zip layout ----

def torch_zip(path, pkl, storages=(), prefix="archive"):
    """A zip laid out as torch.save lays it out, with the given data.pkl."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", pkl)
        for key, data in storages:
            z.writestr(f"{prefix}/data/{key}", data)
        z.writestr(f"{prefix}/version", "3\n")
    return path


class Evil:
    """Pickles as a call to os.system (posix.system on Linux)."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def global_call_pickle(module, name, arg):
    """PROTO 2, GLOBAL module name, a string argument, TUPLE1, REDUCE, STOP."""
    a = arg.encode()
    return (b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n" +
            b"X" + struct.pack("<I", len(a)) + a + b"\x85R.")


def tensor_pickle(numel=4, offset=0, size=(4,), stride=(1,), key="0", storage="FloatStorage"):
    """A hand-written state dict {'w': tensor} as torch 1.13 pickles it."""
    def s(x):
        b = x.encode()
        return b"X" + struct.pack("<I", len(b)) + b

    def ints(v):
        return b"(" + b"".join(b"J" + struct.pack("<i", i) for i in v) + b"t"

    return (b"\x80\x02}(" + s("w") + b"ctorch._utils\n_rebuild_tensor_v2\n(" +
            b"(" + s("storage") + b"ctorch\n" + storage.encode() + b"\n" + s(key) + s("cpu") +
            b"J" + struct.pack("<i", numel) + b"tQ" + b"J" + struct.pack("<i", offset) +
            ints(size) + ints(stride) + b"\x89ccollections\nOrderedDict\n)RtRu.")


# ---- ONNX exports ----

def onnx_models():
    """name -> (module in eval mode, example input) for the four test models."""
    import torch
    nn = torch.nn

    class Cnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.pool = nn.MaxPool2d(2)
            self.conv2 = nn.Conv2d(8, 4, 3, stride=2, padding=1)
            self.avg = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            x = self.pool(torch.relu(self.bn(self.conv(x))))
            x = self.avg(torch.sigmoid(self.conv2(x)))
            return torch.softmax(self.fc(torch.flatten(x, 1)), dim=1)

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
            self.b1 = nn.BatchNorm2d(4)
            self.c2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
            self.b2 = nn.BatchNorm2d(4)

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(y)) + x)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16,
                                                    dropout=0.1, batch_first=True)

        def forward(self, x):
            return self.layer(x)

    models = {
        "mlp": (mlp(), torch.randn(2, 8)),
        "cnn": (Cnn(), torch.randn(2, 3, 8, 8)),
        "residual": (Residual(), torch.randn(1, 4, 6, 6)),
        "transformer": (Encoder(), torch.randn(2, 5, 8)),
    }
    for m, _ in models.values():
        for mod in m.modules():  # non-trivial running statistics
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 1.5)
        m.eval()
    return models


def export_onnx(module, example, path, **kw):
    """torch.onnx.export at opset 13 keeping parameter names as initializer names:
    no constant folding, and TrainingMode.PRESERVE (of a model in eval mode)
    so that batch norms are not folded into the convolutions before them.
    Gradients stay enabled: under no_grad, TransformerEncoderLayer takes its
    fused fast path, which has no ONNX export. Returns torch's output."""
    import torch
    kw.setdefault("do_constant_folding", False)
    kw.setdefault("training", torch.onnx.TrainingMode.PRESERVE)
    torch.onnx.export(module, (example,), path, opset_version=13, input_names=["input"],
                      output_names=["output"], **kw)
    with torch.no_grad():
        return module(example).numpy()
