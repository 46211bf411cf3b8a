"""ONNX's node conformance suite through `ckptd verify` (issue 35).

The onnx package ships the generator of its backend test cases: one
single-node model per case, with inputs and numpy reference outputs as
TensorProto .pb files, written by ONNX's authors. This module generates
them, converts each case's tensors to .npy, runs `ckptd verify` on each
(several at a time) and classifies the result:

- passed: ckptd said ok, and the outputs it saved agree with ONNX's
  reference in dtype and under the same tolerance (checked here too, not
  taken on trust; integers exactly);
- refused: ckptd declined to run the model, naming why (exit 4, "unsupported"),
  or could not read an input file (a dtype .npy it does not take, a shape the
  model does not declare), or ONNX expects a NaN or an infinity (ckptd fails
  every non-finite output by design);
- wrong: ckptd said ok but its outputs differ from ONNX's, or it ran the
  model and reported a mismatch (a refusal was due), or it failed in any other
  way (a crash, a format error on ONNX's own file);
- not_tensor: the case's inputs or outputs are sequences, optionals or
  strings, which `--inputs`/`--expected` (.npy) cannot express (counted, not run).

A case is a float case when every input and output is float32."""
import collections
import concurrent.futures
import glob
import os
import re
import subprocess
import sys

# onnx 1.12 uses the aliases numpy 1.24 removed; they were the builtins
import numpy as np  # noqa: E402
for _name, _type in (("float", float), ("int", int), ("bool", bool), ("object", object)):
    if _name not in np.__dict__:
        setattr(np, _name, _type)
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

EXIT_UNSUPPORTED = 4
ATOL, RTOL = 1e-4, 1e-5  # ckptd verify's defaults

GEN = r"""
import sys
import numpy as np
for _n, _t in (("float", float), ("int", int), ("bool", bool), ("object", object)):
    if _n not in np.__dict__:
        setattr(np, _n, _t)
from onnx.backend.test.cmd_tools import main
sys.argv = ["cmd_tools", "generate-data", "-o", sys.argv[1]]
main()
"""


def generate(out_dir):
    """Writes ONNX's backend test data under out_dir; returns the node cases' folders."""
    subprocess.run([sys.executable, "-W", "ignore", "-c", GEN, out_dir], check=True,
                   capture_output=True, timeout=300)
    return sorted(glob.glob(os.path.join(out_dir, "node", "test_*")))


class Case:
    def __init__(self, folder):
        self.folder = folder
        self.name = os.path.basename(folder)
        self.model = os.path.join(folder, "model.onnx")
        self.inputs, self.expected = [], []
        self.op = "?"
        self.float = False
        self.not_tensor = None  # why the case cannot be given as .npy files
        self.result = None      # passed, refused, wrong, not_tensor
        self.reason = ""


def _load_tensor(path, elem_type):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    a = numpy_helper.to_array(t)
    if onnx.TensorProto.BFLOAT16 in (t.data_type, elem_type) and a.dtype == np.uint16:
        # bfloat16 data comes as its bits (the test data even stores it as a uint16
        # tensor): the values are the top half of a float32
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a


def prepare(folder):
    """Reads a case's model and data set 0, writes its tensors as .npy."""
    c = Case(folder)
    m = onnx.load(c.model)
    c.op = m.graph.node[0].op_type if m.graph.node else "?"
    data = os.path.join(folder, "test_data_set_0")
    kinds = [v.type.WhichOneof("value") for v in m.graph.input] + \
            [v.type.WhichOneof("value") for v in m.graph.output]
    if any(k != "tensor_type" for k in kinds):
        c.not_tensor = "inputs or outputs that are not tensors (%s)" % \
            ", ".join(sorted(set(k for k in kinds if k != "tensor_type")))
        return c
    dtypes = []
    for kind, vis, into in (("input", m.graph.input, c.inputs),
                            ("output", m.graph.output, c.expected)):
        for k, vi in enumerate(vis):
            pb = os.path.join(data, "%s_%d.pb" % (kind, k))
            try:
                a = _load_tensor(pb, vi.type.tensor_type.elem_type)
            except Exception as e:  # a SequenceProto or an unusual tensor
                c.not_tensor = "%s %d: %s" % (kind, k, type(e).__name__)
                return c
            if a.dtype == object:
                c.not_tensor = "%s %d: string tensor (no .npy form)" % (kind, k)
                return c
            dtypes.append(a.dtype)
            npy = os.path.join(data, "%s_%d.npy" % (kind, k))
            np.save(npy, a, allow_pickle=False)
            into.append(npy)
    c.float = all(d == np.float32 for d in dtypes)
    return c


_QUOTED = re.compile(r"'[^']*'")


def _reason(c, stderr):
    """A refusal's reason: the op and what ckptd named, without the case's names."""
    msg = stderr.strip().splitlines()[-1] if stderr.strip() else "(no message)"
    msg = msg.replace(c.model, "MODEL")
    m = re.search(r"ONNX ops? without a mapping in ckptd's operation vocabulary: '([^']+)'", msg)
    if m:
        return "op %s has no mapping" % m.group(1)
    m = re.search(r"\(([A-Za-z]+)\): (.*)$", msg)
    if m:
        return "%s: %s" % (m.group(1), _QUOTED.sub("X", m.group(2)))
    return "%s: %s" % (c.op, _QUOTED.sub("X", msg.split(": ", 1)[-1]))


def run_case(ckptd, c, timeout=120):
    """Runs ckptd verify on one prepared case and sets c.result and c.reason."""
    if c.not_tensor:
        c.result, c.reason = "not_tensor", c.not_tensor
        return c
    out_dir = os.path.join(c.folder, "ckptd_out")
    os.makedirs(out_dir, exist_ok=True)
    args = [ckptd, "verify", c.model]
    if c.inputs:
        args += ["--inputs", *c.inputs]
    args += ["--expected", *c.expected, "--save-outputs", out_dir, "--timeout", "60"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    said_ok = p.returncode == 0 and "ok against=expected" in p.stdout
    if said_ok:
        bad = _check_outputs(c, out_dir)
        c.result, c.reason = ("wrong", "ckptd said ok: " + bad) if bad else ("passed", "")
    elif p.returncode == EXIT_UNSUPPORTED:
        c.result, c.reason = "refused", _reason(c, p.stderr)
    elif p.returncode == 1 and "(not finite)" in p.stdout and "MISMATCH" not in p.stdout \
            and not all(np.isfinite(np.load(e).astype(np.float64)).all() for e in c.expected):
        # ONNX expects a NaN or an infinity, and ckptd fails any non-finite
        # output by design (README, ckptd verify): a refusal, not an answer
        c.result, c.reason = "refused", "expected output not finite (ckptd fails NaN/inf by design)"
    elif p.returncode == 1 and "MISMATCH" in p.stdout:
        c.result = "wrong"
        c.reason = "ran and mismatched: " + " | ".join(
            l for l in p.stdout.splitlines() if "MISMATCH" in l)[:300]
    elif p.returncode == 1 and (re.search(r"does not match the model's", p.stderr) or (
            re.search(r"cannot read|npy|--inputs|--expected", p.stderr)
            and "verification failed" not in p.stderr)):
        c.result, c.reason = "refused", "input file: " + _QUOTED.sub(
            "X", (p.stderr.strip().splitlines() or [""])[-1].split(": ", 1)[-1])
    else:
        c.result = "wrong"
        c.reason = "exit %d: %s" % (p.returncode, (p.stderr.strip() or p.stdout.strip())[-300:])
    return c


def _check_outputs(c, out_dir):
    """'' when every saved output matches ONNX's reference, else what differs."""
    m = onnx.load(c.model)
    for k, v in enumerate(m.graph.output):
        path = os.path.join(out_dir, v.name + ".npy")
        if not os.path.exists(path):
            return "output %s not saved" % v.name
        got, want = np.load(path), np.load(c.expected[k])
        if got.dtype != want.dtype:  # an int64 output is int64, a float16 one float16
            return "output %s dtype %s, expected %s" % (v.name, got.dtype, want.dtype)
        if got.shape != want.shape:
            return "output %s shape %s, expected %s" % (v.name, got.shape, want.shape)
        w = want.astype(np.float64)
        if not np.allclose(got.astype(np.float64), w, rtol=RTOL, atol=ATOL, equal_nan=False):
            return "output %s differs" % v.name
        if want.dtype.kind in "iub" and not np.array_equal(got.astype(np.float64), w):
            return "output %s: integers not exact" % v.name
    return ""


def run_all(ckptd, out_dir, jobs=None):
    """Generates, prepares and runs every node case; returns the cases."""
    folders = generate(out_dir)
    only = os.environ.get("CK_ONNX_CASES")  # a substring, to run a few cases by hand
    if only:
        folders = [f for f in folders if only in os.path.basename(f)]
    cases = [prepare(f) for f in folders]
    jobs = jobs or 2 * (os.cpu_count() or 2)  # each waits on its sandboxed child
    with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
        list(ex.map(lambda c: run_case(ckptd, c), cases))
    return cases


def summary(cases, top=10):
    """Counts as text: float and non-float passed/total, refusals by reason, wrong."""
    lines = []
    tensor = [c for c in cases if c.result != "not_tensor"]
    fl = [c for c in tensor if c.float]
    nf = [c for c in tensor if not c.float]
    npass = lambda cs: sum(c.result == "passed" for c in cs)  # noqa: E731
    lines.append("onnx node cases: %d (%d with sequence, optional or string values, not run)" %
                 (len(cases), len(cases) - len(tensor)))
    lines.append("float cases: %d of %d passed (%.1f%%)" %
                 (npass(fl), len(fl), 100.0 * npass(fl) / max(1, len(fl))))
    lines.append("non-float cases: %d of %d passed" % (npass(nf), len(nf)))
    refused = [c for c in tensor if c.result == "refused"]
    lines.append("refused: %d (float %d)" % (len(refused), sum(c.float for c in refused)))
    by_op = collections.Counter(c.op for c in refused if c.float)
    lines.append("float refusals by op (top %d): %s" % (top, ", ".join(
        "%s %d" % kv for kv in by_op.most_common(top))))
    by_reason = collections.Counter(c.reason for c in refused)
    lines.append("refusals by reason (top %d):" % top)
    for r, n in by_reason.most_common(top):
        lines.append("  %4d  %s" % (n, r))
    wrong = [c for c in tensor if c.result == "wrong"]
    lines.append("wrong: %d" % len(wrong))
    for c in wrong:
        lines.append("  %s (%s): %s" % (c.name, c.op, c.reason))
    return "\n".join(lines)


if __name__ == "__main__":
    import tempfile
    import time
    t0 = time.time()
    out = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="onnx_conf.")
    cs = run_all(sys.argv[1], out)
    print(summary(cs, top=40))
    if "-v" in sys.argv:
        for c in cs:
            print(c.result, c.float, c.name, c.op, c.reason, sep="\t")
    print("time: %.1f s" % (time.time() - t0))
