#!/usr/bin/python3
"""The zoo side of bench/infer.sh: torchvision's architectures at their real
sizes (224x224 images, 1000 classes, full width) and the zoo's ConvNeXt-style
block and BERT-shaped model (tests/lib/zoo_gen.py's modules; BERT at d 64,
128 tokens), randomly initialised with fixed seeds, BatchNorm statistics
perturbed as the zoo does.

  infer_zoo.py export DIR NAME...   NAME.b{1,4}.onnx (opset 14, batch 1 and 4),
                                    NAME.in{1,4}.npy, NAME.out{1,4}.npy and
                                    NAME.gflop{1,4} (2 x the multiply-adds of
                                    the convolutions and products torch runs)
  infer_zoo.py torch DIR NAME BATCH REPEAT [THREADS]
                                    torch's median CPU ms, wall ms and peak
                                    RSS MiB (as infer_torch.py), one thread
                                    or torch.set_num_threads(THREADS) (CPU
                                    time then of the whole process)
  infer_zoo.py sgemm REPEAT         OpenBLAS sgemm's GFLOP/s, one thread, on
                                    a 512 x 3136 x 576 product (a 3x3
                                    convolution's at 56x56)"""
import ctypes
import os
import resource
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))

NAMES = ("resnet18", "mobilenet_v2", "efficientnet_b0", "regnet_y_400mf", "convnext_block",
         "bert_d64")


def make(name):
    """(module in eval mode, input of batch b as a function of b)"""
    import torch
    import torchvision.models as tv
    import zoo_gen
    torch.manual_seed(NAMES.index(name) + 1)
    if name == "bert_d64":
        bert, _ = zoo_gen._transformers(torch)
        m = bert(vocab=1000, d=64, t=128, layers=2).eval()
        g = torch.Generator().manual_seed(5)
        return m, lambda b: torch.randint(0, 1000, (b, 128), generator=g)
    if name == "convnext_block":
        m = zoo_gen._convnext_block(torch)()
    else:
        m = getattr(tv, name)()
    m = zoo_gen._perturb(m, torch).eval()
    g = torch.Generator().manual_seed(5)
    return m, lambda b: torch.randn(b, 3, 224, 224, generator=g)


def gflop(module, x):
    """GFLOP of one forward: 2 x the multiply-adds of every convolution,
    linear layer and matrix product torch runs (TorchFunctionMode sees the
    functional calls too: attention's q @ k)."""
    import torch
    from torch.overrides import TorchFunctionMode
    F = torch.nn.functional
    macs = [0]

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func is F.conv2d:
                w = args[1] if len(args) > 1 else kwargs["weight"]
                macs[0] += out.numel() * w[0].numel()
            elif func is F.linear:
                macs[0] += out.numel() * args[0].shape[-1]
            elif func in (torch.matmul, torch.Tensor.__matmul__, torch.bmm):
                macs[0] += out.numel() * args[0].shape[-1]
            return out

    with torch.no_grad(), Count():
        module(x)
    return 2 * macs[0] / 1e9


def export(outdir, names):
    import torch
    for name in names:
        module, inp = make(name)
        for b, x in ((1, inp(1)), (4, inp(4))):
            # a static batch: the BERT-shaped model takes its length from
            # the input's shape, which ckptd folds only when it is static
            torch.onnx.export(module, (x,), os.path.join(outdir, "%s.b%d.onnx" % (name, b)),
                              opset_version=14, input_names=["input"], output_names=["output"],
                              do_constant_folding=False, training=torch.onnx.TrainingMode.EVAL)
            with torch.no_grad():
                y = module(x)
            np.save(os.path.join(outdir, "%s.in%d.npy" % (name, b)), x.numpy().astype(np.float32))
            np.save(os.path.join(outdir, "%s.out%d.npy" % (name, b)), y.numpy())
            with open(os.path.join(outdir, "%s.gflop%d" % (name, b)), "w") as f:
                f.write("%.6f\n" % gflop(module, x))


def time_torch(outdir, name, batch, repeat, threads=1):
    import torch
    torch.set_num_threads(threads)
    clock = time.thread_time if threads == 1 else time.process_time
    module, _ = make(name)
    x = torch.from_numpy(np.load(os.path.join(outdir, "%s.in%d.npy" % (name, batch))))
    if name == "bert_d64":
        x = x.long()
    want = np.load(os.path.join(outdir, "%s.out%d.npy" % (name, batch)))
    times, cpu = [], []
    with torch.inference_mode():
        for _ in range(3):
            y = module(x)
        for _ in range(repeat):
            t0, c0 = time.perf_counter(), clock()
            y = module(x)
            cpu.append(clock() - c0)
            times.append(time.perf_counter() - t0)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-4)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("%.4f %.4f %.1f" % (statistics.median(cpu) * 1e3, statistics.median(times) * 1e3, rss))


def sgemm(repeat):
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    blas = ctypes.CDLL("libopenblas.so.0")
    blas.openblas_set_num_threads(1)
    m, n, k = 512, 3136, 576
    a = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    f = blas.cblas_sgemm
    f.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                                       ctypes.c_void_p, ctypes.c_int, ctypes.c_float,
                                       ctypes.c_void_p, ctypes.c_int]
    cpu = []
    for i in range(repeat + 2):
        c0 = time.thread_time()
        f(101, 111, 111, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n, 0.0, c.ctypes.data, n)
        if i >= 2:
            cpu.append(time.thread_time() - c0)
    np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-2)
    print("%.1f" % (2.0 * m * n * k / statistics.median(cpu) / 1e9))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "export":
        export(sys.argv[2], sys.argv[3:] or NAMES)
    elif len(sys.argv) in (6, 7) and sys.argv[1] == "torch":
        time_torch(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                   int(sys.argv[6]) if len(sys.argv) == 7 else 1)
    elif len(sys.argv) == 3 and sys.argv[1] == "sgemm":
        sgemm(int(sys.argv[2]))
    else:
        sys.exit(__doc__)
