#!/usr/bin/python3
"""Reference models for `ckptd verify`, built and run by PyTorch (Debian's
python3-torch, one thread): an MLP, a CNN with batch norm and pooling, and a
small residual block. For each model NAME it writes into OUTDIR:

  NAME.safetensors   the weights (written here with json + struct + numpy, as
                     the safetensors format says: 8-byte little-endian header
                     length, JSON header, raw little-endian data)
  NAME.yaml          its layer list (docs/model.md)
  NAME.in1.npy, NAME.out1.npy, NAME.in64.npy, NAME.out64.npy
                     inputs and torch's outputs for batch 1 and 64

and damaged copies of the MLP for the negative tests:
  mlp_transposed.safetensors   fc2.weight (square) stored transposed
  mlp_nobias.safetensors + mlp_nobias.yaml   fc1.bias lost by the exporter
  mlp_truncated.safetensors    the file cut short in its last tensor

Usage: make_torch_models.py OUTDIR
"""
import json
import os
import struct
import sys

import numpy as np
import torch
from torch import nn

torch.set_num_threads(1)


def mlp():
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 10), nn.Softmax(dim=1))


MLP_NAMES = ["fc1", None, "fc2", None, "fc3", None]
MLP_LAYERS = """input: {name: x, shape: [-1, 20]}
output: y
layers:
  - {op: dense, weight: fc1.weight, bias: fc1.bias}
  - {op: relu}
  - {op: dense, weight: fc2.weight, bias: fc2.bias}
  - {op: tanh}
  - {op: dense, weight: fc3.weight, bias: fc3.bias}
  - {op: softmax, axis: 1}
"""


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(8, 16, 3, stride=1, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AvgPool2d(2, 2), nn.Flatten(), nn.Linear(16 * 7 * 7, 10))


CNN_NAMES = ["c1", "bn1", None, None, "c2", "bn2", None, None, None, "fc"]
CNN_LAYERS = """input: {name: x, shape: [-1, 1, 28, 28]}
output: y
layers:
  - {op: conv2d, weight: c1.weight, bias: c1.bias, padding: 1}
  - {op: batchnorm, weight: bn1.weight, bias: bn1.bias, mean: bn1.running_mean, var: bn1.running_var}
  - {op: relu}
  - {op: maxpool, kernel: 2, stride: 2}
  - {op: conv2d, weight: c2.weight, bias: c2.bias, stride: 1, padding: 1}
  - {op: batchnorm, weight: bn2.weight, bias: bn2.bias, mean: bn2.running_mean, var: bn2.running_var}
  - {op: relu}
  - {op: avgpool, kernel: 2, stride: 2}
  - {op: flatten}
  - {op: dense, weight: fc.weight, bias: fc.bias}
"""


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.c1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        s = torch.relu(self.stem(x))
        h = torch.relu(self.bn1(self.c1(s)))
        h = self.bn2(self.c2(h))
        h = torch.relu(h + s)
        h = torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1)
        return self.fc(h)


RES_LAYERS = """input: {name: x, shape: [-1, 3, 16, 16]}
output: y
layers:
  - {op: conv2d, weight: stem.weight, bias: stem.bias, padding: 1}
  - {op: relu, name: stem_out}
  - {op: conv2d, weight: c1.weight, padding: 1}
  - {op: batchnorm, weight: bn1.weight, bias: bn1.bias, mean: bn1.running_mean, var: bn1.running_var}
  - {op: relu}
  - {op: conv2d, weight: c2.weight, padding: 1}
  - {op: batchnorm, weight: bn2.weight, bias: bn2.bias, mean: bn2.running_mean, var: bn2.running_var}
  - {op: add, from: [-1, stem_out]}
  - {op: relu}
  - {op: global_avgpool}
  - {op: flatten}
  - {op: dense, weight: fc.weight, bias: fc.bias}
"""


def randomize_bn(model):
    """Non-trivial running statistics, so batch norm is really exercised."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)


def named_tensors(model, names):
    """The state dict with Sequential's numeric prefixes replaced by names."""
    out = {}
    for key, value in model.state_dict().items():
        if key.endswith("num_batches_tracked"):
            continue
        first, rest = key.split(".", 1)
        if names is not None:
            first = names[int(first)]
        out[first + "." + rest] = value.detach().numpy().astype("<f4")
    return out


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def models():
    """(name, torch module in eval mode, tensors by name, layer list, input shape)."""
    torch.manual_seed(0)
    out = []
    m = mlp().eval()
    out.append(("mlp", m, named_tensors(m, MLP_NAMES), MLP_LAYERS, (20,)))
    m = cnn()
    randomize_bn(m)
    m.eval()
    out.append(("cnn", m, named_tensors(m, CNN_NAMES), CNN_LAYERS, (1, 28, 28)))
    m = Residual()
    randomize_bn(m)
    m.eval()
    out.append(("residual", m, named_tensors(m, None), RES_LAYERS, (3, 16, 16)))
    return out


def inputs(shape, batch, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((batch,) + shape, generator=g)


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    for name, model, tensors, layers, shape in models():
        write_safetensors(os.path.join(outdir, name + ".safetensors"), tensors)
        with open(os.path.join(outdir, name + ".yaml"), "w") as f:
            f.write(layers)
        for batch in (1, 64):
            x = inputs(shape, batch, batch)
            with torch.no_grad():
                y = model(x)
            np.save(os.path.join(outdir, "%s.in%d.npy" % (name, batch)), x.numpy())
            np.save(os.path.join(outdir, "%s.out%d.npy" % (name, batch)), y.numpy())
        if name != "mlp":
            continue
        bad = dict(tensors)
        bad["fc2.weight"] = np.ascontiguousarray(bad["fc2.weight"].T)
        write_safetensors(os.path.join(outdir, "mlp_transposed.safetensors"), bad)
        bad = dict(tensors)
        del bad["fc1.bias"]
        write_safetensors(os.path.join(outdir, "mlp_nobias.safetensors"), bad)
        with open(os.path.join(outdir, "mlp_nobias.yaml"), "w") as f:
            f.write(layers.replace(", bias: fc1.bias", ""))
        path = os.path.join(outdir, "mlp_truncated.safetensors")
        write_safetensors(path, tensors)
        os.truncate(path, os.path.getsize(path) - 16)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
