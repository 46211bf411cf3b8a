"""The model zoo of tests/e2e/test_zoo.py, made in one python process:
torchvision's classification families and small transformers, randomly
initialised with fixed seeds (pretrained weights cannot be downloaded),
BatchNorm running statistics perturbed so that a wrong mapping shows, small
inputs (32x32 images, 8 tokens) and the smallest width variants so the whole
zoo runs in a few minutes under ASan.

`python3 zoo_gen.py OUTDIR NAME...` writes for every model NAME its exports
(exports_of): NAME-opsetN-static.onnx and NAME-opsetN-dynamic.onnx (batch,
and for the transformers the sequence length, as dynamic_axes), NAME-in.npy (batch 2)
and NAME-out.npy (torch's own output for that input). Both exports are
traced with that batch of 2; the dynamic ones are checked with sizes the
exporter never saw: NAME-in-b1.npy / NAME-out-b1.npy (batch 1) and
NAME-in-b4.npy / NAME-out-b4.npy (batch 4; a transformer's or a recurrent
network's sequence of 5 steps instead of 8)."""
import math
import os
import sys

import numpy as np


def _perturb(model, torch):
    g = torch.Generator().manual_seed(11)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) - 0.5)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
            if m.weight is not None:
                m.weight.data.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.data.copy_(torch.rand(m.bias.shape, generator=g) - 0.5)
    return model


def _transformers(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, d, heads, causal):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.act = nn.GELU(approximate="tanh") if causal else nn.GELU()
            self.heads, self.causal = heads, causal

        def forward(self, x):
            b, t, d = x.shape
            h = self.heads
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q = q.reshape(b, t, h, d // h).transpose(1, 2)
            k = k.reshape(b, t, h, d // h).transpose(1, 2)
            v = v.reshape(b, t, h, d // h).transpose(1, 2)
            a = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
            if self.causal:  # the mask built inside forward, from the input's length
                i = torch.arange(t)
                mask = i.unsqueeze(0) > i.unsqueeze(1)  # key after query
                a = a.masked_fill(mask, float("-inf"))
            y = (a.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(y)
            return x + self.fc2(self.act(self.fc1(self.ln2(x))))

    class Bert(nn.Module):
        """BERT-shaped: token + position embeddings, post-LN-free encoder
        blocks with erf GELU, a pooled first token."""
        def __init__(self, vocab=50, d=32, t=8, layers=2):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(1, t, d) * 0.1)
            self.blocks = nn.ModuleList([Block(d, 2, False) for _ in range(layers)])
            self.ln = nn.LayerNorm(d)
            self.pool = nn.Linear(d, d)

        def forward(self, ids):
            x = self.tok(ids) + self.pos[:, : ids.shape[1]]
            for b in self.blocks:
                x = b(x)
            return torch.tanh(self.pool(self.ln(x)[:, 0]))

    class Gpt(nn.Module):
        """GPT-shaped: causal mask, tanh GELU, the output projection tied to
        the token embedding."""
        def __init__(self, vocab=50, d=32, t=8, layers=2):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(t, d)
            self.blocks = nn.ModuleList([Block(d, 2, True) for _ in range(layers)])
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight

        def forward(self, ids):
            pos = torch.arange(ids.shape[1]).unsqueeze(0)
            x = self.tok(ids) + self.pos(pos)
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln(x))

    return Bert, Gpt


def _convnext_block(torch):
    nn = torch.nn

    class LayerNorm2d(nn.LayerNorm):
        def forward(self, x):  # ConvNeXt's LayerNorm over channels: permute, norm, permute
            return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
            self.ln = nn.LayerNorm(c)
            self.pw1, self.pw2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
            self.gamma = nn.Parameter(torch.rand(c) + 0.5)

        def forward(self, x):
            y = self.dw(x).permute(0, 2, 3, 1)
            y = self.pw2(nn.functional.gelu(self.pw1(self.ln(y))))
            return x + (self.gamma * y).permute(0, 3, 1, 2)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 4, stride=4)
            self.norm = LayerNorm2d(16)
            self.blocks = nn.Sequential(Block(16), Block(16))
            self.head = nn.Linear(16, 10)

        def forward(self, x):
            x = self.blocks(self.norm(self.stem(x)))
            return self.head(x.mean((2, 3)))

    return Net


def _recurrent(torch, cell):
    """torch's LSTM, GRU or RNN as users build them: 2 layers, both
    directions, batch first; the output sequence of the last layer (both
    directions' h at every step, so every step of both layers shows)."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = cell(input_size=6, hidden_size=8, num_layers=2, bidirectional=True,
                            batch_first=True)

        def forward(self, x):
            return self.rnn(x)[0]

    return Net()


# kinds of input: images [N, 3, 32, 32], token ids [N, 8], sequences [N, 8, 6]
IMAGE, TOKENS, SEQUENCE = "image", "tokens", "sequence"


def models():
    """{name: (module in eval mode, example input batch of 2, kind of input)}"""
    import torch
    import torchvision.models as tv
    nn = torch.nn
    out = {}

    def image(name, make):
        torch.manual_seed(len(out) + 1)
        out[name] = (_perturb(make(), torch).eval(), torch.randn(2, 3, 32, 32), IMAGE)

    def vgg():
        m = tv.vgg11(num_classes=10)
        # a 32x32 image leaves 1x1 after the features (torch exports no 7x7
        # adaptive pool of it), and the 4096-wide classifier would be 470 MiB
        # of weights: the same layers, pooled to 1x1 and narrower
        m.avgpool = nn.AdaptiveAvgPool2d(1)
        m.classifier = nn.Sequential(nn.Linear(512, 64), nn.ReLU(True), nn.Dropout(),
                                     nn.Linear(64, 64), nn.ReLU(True), nn.Dropout(),
                                     nn.Linear(64, 10))
        return m

    image("resnet18", lambda: tv.resnet18(num_classes=10))
    image("vgg11", vgg)
    image("densenet121", lambda: tv.densenet121(num_classes=10))
    image("mobilenet_v2", lambda: tv.mobilenet_v2(num_classes=10, width_mult=0.5))
    image("mobilenet_v3_small", lambda: tv.mobilenet_v3_small(num_classes=10))
    image("efficientnet_b0", lambda: tv.efficientnet_b0(num_classes=10))
    image("regnet_x_400mf", lambda: tv.regnet_x_400mf(num_classes=10))
    image("shufflenet_v2_x0_5", lambda: tv.shufflenet_v2_x0_5(num_classes=10))
    image("squeezenet1_0", lambda: tv.squeezenet1_0(num_classes=10))
    image("convnext_block", lambda: _convnext_block(torch)())
    def vit():
        m = tv.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                 hidden_dim=32, mlp_dim=64, num_classes=10)
        # torchvision zeroes the head: every output would be 0 whatever the
        # layers before it compute, and a wrong engine would still match
        nn.init.normal_(m.heads.head.weight, std=0.2)
        nn.init.normal_(m.heads.head.bias, std=0.2)
        return m

    image("vit_tiny", vit)
    Bert, Gpt = _transformers(torch)
    for name, cls in (("bert_small", Bert), ("gpt_small", Gpt)):
        torch.manual_seed(len(out) + 1)
        out[name] = (cls().eval(), torch.randint(0, 50, (2, 8)), TOKENS)
    for name, cell in (("lstm", nn.LSTM), ("gru", nn.GRU), ("rnn", nn.RNN)):
        torch.manual_seed(len(out) + 1)
        out[name] = (_recurrent(torch, cell).eval(), torch.randn(2, 8, 6), SEQUENCE)
    return out


# Which exports each model gets: every one for the transformers (opset 17
# exports LayerNormalization where 13 spells it out); the image models, whose
# export takes most of the zoo's time, opset 13 static and opset 17 dynamic;
# the recurrent networks (small and quick) every one, as the transformers.
# The image models whose dynamic export computes shapes (the class token's
# expand, the channel shuffle's reshape) get the dynamic export at both opsets.
ALL_EXPORTS = ((13, "static"), (13, "dynamic"), (17, "static"), (17, "dynamic"))
IMAGE_EXPORTS = ((13, "static"), (17, "dynamic"))
SHAPE_EXPORTS = ((13, "static"), (13, "dynamic"), (17, "dynamic"))


def exports_of(name):
    if name in ("bert_small", "gpt_small", "lstm", "gru", "rnn"):
        return ALL_EXPORTS
    return SHAPE_EXPORTS if name in ("vit_tiny", "shufflenet_v2_x0_5") else IMAGE_EXPORTS


def export(outdir, names):
    import torch
    zoo = models()
    for name in names:
        module, x, kind = zoo[name]
        g = torch.Generator().manual_seed(3)
        b4 = {TOKENS: lambda: torch.randint(0, 50, (4, 5), generator=g),
              SEQUENCE: lambda: torch.randn((4, 5) + tuple(x.shape[2:]), generator=g),
              IMAGE: lambda: torch.randn((4,) + tuple(x.shape[1:]), generator=g)}[kind]()
        other = {"": x, "-b1": x[:1], "-b4": b4}
        for suffix, xi in other.items():
            with torch.no_grad():
                yi = module(xi)
            np.save(os.path.join(outdir, name + "-in" + suffix + ".npy"),
                    xi.numpy().astype(np.float32))  # token ids as whole floats (docs/model.md gather)
            np.save(os.path.join(outdir, name + "-out" + suffix + ".npy"), yi.numpy())
        axes = {0: "batch"} if kind == IMAGE else {0: "batch", 1: "seq"}
        out_axes = {0: "batch", 1: "seq"} if kind == SEQUENCE else {0: "batch"}
        for opset, form in exports_of(name):
            if True:
                p = os.path.join(outdir, f"{name}-opset{opset}-{form}.onnx")
                kw = {}
                if form == "dynamic":
                    kw["dynamic_axes"] = {"input": axes, "output": out_axes}
                torch.onnx.export(module, (x,), p, opset_version=opset,
                                  input_names=["input"], output_names=["output"],
                                  do_constant_folding=False,
                                  training=torch.onnx.TrainingMode.EVAL, **kw)


if __name__ == "__main__":
    export(sys.argv[1], sys.argv[2:])
