#!/usr/bin/python3
"""The PyTorch side of bench/infer.sh: the same model (tests/lib/
make_torch_models.py builds it with the same seed), the same input .npy, one
thread, no autograd. Prints "median_cpu_ms median_wall_ms peak_rss_mib" for
REPEAT runs after 3 warm-up runs (CPU: time.thread_time of the one computing
thread); peak RSS is this process's (Python + torch + model).

Usage: infer_torch.py MODELS_DIR NAME BATCH REPEAT"""
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
import make_torch_models as mk  # noqa: E402

torch.set_num_threads(1)


def main(models_dir, name, batch, repeat):
    model = {n: m for n, m, *_ in mk.models()}[name]
    x = torch.from_numpy(np.load(os.path.join(models_dir, "%s.in%d.npy" % (name, batch))))
    want = np.load(os.path.join(models_dir, "%s.out%d.npy" % (name, batch)))
    times, cpu = [], []
    with torch.inference_mode():
        for _ in range(3):
            y = model(x)
        for _ in range(repeat):
            t0, c0 = time.perf_counter(), time.thread_time()
            y = model(x)
            cpu.append(time.thread_time() - c0)
            times.append(time.perf_counter() - t0)
    # the same weights as the files ckptd reads: the outputs must agree
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-4)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("%.4f %.4f %.1f" % (statistics.median(cpu) * 1e3, statistics.median(times) * 1e3, rss))


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
