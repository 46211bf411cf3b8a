"""Say only what is true (issue 27, first half): every verification names
what it compared with, relative paths in a config follow the config file
whatever the working directory, and a one-shot pass that could not do
everything exits 1. The reference outputs come from torch (Debian's
python3-torch) and numpy in the test, never from ckptd."""
import json
import os
import re
import signal
import subprocess
import zipfile
import sys
import time
import unittest

import numpy as np
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, run  # noqa: E402
from ckpt_formats import safetensors_from_numpy  # noqa: E402
from webhook_receiver import Receiver  # noqa: E402
from servers import S3Server, need  # noqa: E402
import torch_gen as tg  # noqa: E402

# The layer list of the MLP below as written, and the same with its ReLU left out.
GRAPH = """pack:
  formats: [mldef]
  graph:
    input: {name: x, shape: [-1, 12]}
    layers:
      - {op: dense, weight: 0.weight, bias: 0.bias}
      - {op: relu}
      - {op: dense, weight: 2.weight, bias: 2.bias}
"""
NO_RELU = GRAPH.replace("      - {op: relu}\n", "")


def archives(train):
    with open(os.path.join(train, "data", "build_parameters.yaml")) as f:
        return (yaml.safe_load(f) or {}).get("archives", {})


def log_lines(stderr, event):
    return [line for line in stderr.splitlines() if f" {event}: " in line]


def run_in(cwd, *args, env=None, timeout=300):
    """ckptd with args, started in the folder cwd (as systemd starts services in /)."""
    e = dict(os.environ, **(env or {}))
    return subprocess.run([CKPTD, *map(str, args)], capture_output=True, text=True, env=e,
                          cwd=cwd, timeout=timeout)


class Against(TmpDirCase):
    """A PyTorch MLP packed from a layer list: with the trainer's outputs
    (verify.expected with {stem}) a layer list without its ReLU is refused;
    against the source checkpoint it cannot be, and the result says so."""

    def setUp(self):
        super().setUp()
        self.torch = tg.need_torch()
        need("aws", "checking S3 uploads needs awscli")
        self.train = os.path.join(self.dir, "train")
        self.elsewhere = os.path.join(self.dir, "elsewhere")
        os.makedirs(os.path.join(self.train, "ckpts"))
        os.makedirs(os.path.join(self.train, "golden"))
        os.makedirs(self.elsewhere)
        torch = self.torch
        x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(2, 12)
        np.save(os.path.join(self.train, "golden", "x.npy"), x)
        for epoch in (1, 2):
            torch.manual_seed(epoch)
            net = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.ReLU(),
                                      torch.nn.Linear(8, 4))
            torch.save(net.state_dict(), os.path.join(self.train, "ckpts", f"epoch_{epoch}.pt"))
            with torch.no_grad():  # the trainer's own outputs on the verify inputs
                y = net(torch.from_numpy(x)).numpy()
            np.save(os.path.join(self.train, "golden", f"epoch_{epoch}.out.npy"), y)
            # the left-out ReLU matters on these inputs: the test would prove nothing otherwise
            with torch.no_grad():
                wrong = net[2](net[0](torch.from_numpy(x))).numpy()
            self.assertGreater(np.abs(wrong - y).max(), 1e-3)
        for name in os.listdir(os.path.join(self.train, "ckpts")):
            p = os.path.join(self.train, "ckpts", name)
            os.utime(p, (os.path.getmtime(p) - 60,) * 2)

    def config(self, s3, graph, expected=True):
        with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
            f.write(graph)
            # relative paths: the config's folder, not the working directory
            f.write("verify:\n  inputs: [golden/x.npy]\n  atol: 1e-5\n")
            if expected:
                f.write('  expected: ["golden/{stem}.out.npy"]\n')
            log = os.path.join(self.dir, "events")
            os.makedirs(log, exist_ok=True)
            f.write("hooks:\n  exec:\n    - event: \"verification.*\"\n"
                    f"      command: [/bin/sh, -c, 'cat > {log}/$$.json']\n")
            f.write("upload:\n  retries: 1\n  retry_base: 100ms\n  stores:\n"
                    f"    - url: s3://ckpt/runs/r1\n      endpoint: {s3.endpoint}\n")

    def events(self):
        d = os.path.join(self.dir, "events")
        out = []
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name)) as f:
                out.append(json.loads(f.read()))
        return out

    def test_wrong_layer_list_refused_against_trainer_outputs(self):
        with S3Server(self.dir) as s3:
            self.config(s3, NO_RELU)
            p = run_in(self.elsewhere, "scan", self.train, env=s3.env())
            self.assertEqual(p.returncode, 1, p.stderr)
            keys = s3.keys()
            # registered and uploaded as checkpoints; no archive went up
            self.assertIn("runs/r1/data/checkpoints/epoch_1.pt", keys, p.stderr)
            self.assertFalse([k for k in keys if "/data/deploy/" in k], keys)
            for e in (1, 2):
                rec = archives(self.train)[f"epoch_{e}.pt.mldef"]
                self.assertEqual(rec["verification"], "failed", rec)
                self.assertEqual(rec["uploaded"], "held")
                self.assertEqual(rec["against"], "expected")
                self.assertIn(f"golden/epoch_{e}.out.npy", rec["verification_error"])
                self.assertIn("largest deviation", rec["verification_error"])
            failed = log_lines(p.stderr, "verification.failed")
            self.assertEqual(len(failed), 2, p.stderr)
            self.assertTrue(all("against=expected" in line for line in failed), failed)
            ev = self.events()
            self.assertEqual([e["type"] for e in ev], ["verification.failed"] * 2, ev)
            self.assertEqual({e["data"]["verification"]["against"] for e in ev}, {"expected"})

    def test_right_layer_list_passes_and_a_missing_expected_file_holds(self):
        os.remove(os.path.join(self.train, "golden", "epoch_2.out.npy"))
        with S3Server(self.dir) as s3:
            self.config(s3, GRAPH)
            p = run_in(self.elsewhere, "scan", self.train, env=s3.env())
            # epoch 2 has no expected outputs: held back like any failure, exit 1
            self.assertEqual(p.returncode, 1, p.stderr)
            keys = s3.keys()
            self.assertIn("runs/r1/data/deploy/epoch_1.pt.mldef", keys, p.stderr)
            self.assertNotIn("runs/r1/data/deploy/epoch_2.pt.mldef", keys)
            rec = archives(self.train)
            self.assertEqual((rec["epoch_1.pt.mldef"]["verification"],
                              rec["epoch_1.pt.mldef"]["against"]), ("passed", "expected"))
            r2 = rec["epoch_2.pt.mldef"]
            self.assertEqual((r2["verification"], r2["uploaded"]), ("failed", "held"))
            self.assertIn("epoch_2.out.npy", r2["verification_error"])
            passed = log_lines(p.stderr, "verification.passed")
            self.assertEqual(len(passed), 1, p.stderr)
            self.assertIn("against=expected", passed[0])
            # the archive that went up, run by `ckptd verify` against torch's outputs
            got = os.path.join(self.dir, "got.mldef")
            s3.get("runs/r1/data/deploy/epoch_1.pt.mldef", got)
            v = run("verify", got, "--inputs", os.path.join(self.train, "golden", "x.npy"),
                    "--expected", os.path.join(self.train, "golden", "epoch_1.out.npy"),
                    "--atol", "1e-5", check=0)
            self.assertIn("ok against=expected", v.stdout)

    def test_without_trainer_outputs_the_result_says_source(self):
        # the same wrong layer list passes against the source checkpoint (both
        # sides run it): what every record says is that it was compared with that
        with S3Server(self.dir) as s3:
            self.config(s3, NO_RELU, expected=False)
            p = run_in(self.elsewhere, "scan", self.train, env=s3.env())
            self.assertEqual(p.returncode, 0, p.stderr)
            for e in (1, 2):
                rec = archives(self.train)[f"epoch_{e}.pt.mldef"]
                self.assertEqual((rec["verification"], rec["against"]), ("passed", "source"))
            passed = log_lines(p.stderr, "verification.passed")
            self.assertEqual(len(passed), 2, p.stderr)
            self.assertTrue(all("against=source" in line for line in passed), passed)
            self.assertEqual({e["data"]["verification"]["against"] for e in self.events()},
                             {"source"})
            # and `ckptd verify` of the archive with torch's outputs finds the mistake
            got = os.path.join(self.dir, "got.mldef")
            s3.get("runs/r1/data/deploy/epoch_1.pt.mldef", got)
            v = run("verify", got, "--inputs", os.path.join(self.train, "golden", "x.npy"),
                    "--expected", os.path.join(self.train, "golden", "epoch_1.out.npy"),
                    "--atol", "1e-5", check=1)
            self.assertIn("FAILED against=expected", v.stdout)
            n = run("verify", got, "--inputs", os.path.join(self.train, "golden", "x.npy"),
                    check=0)
            self.assertIn("against=none", n.stdout)


# A weight-only MLP for the tests that need no torch: numpy weights in a safetensors file.
SAFE_GRAPH = """pack:
  formats: [mldef]
  graph:
    input: {name: x, shape: [-1, 12]}
    layers:
      - {op: dense, weight: fc1.weight, bias: fc1.bias}
      - {op: relu}
      - {op: dense, weight: fc2.weight, bias: fc2.bias}
"""


def weights(epoch):
    rng = np.random.default_rng(epoch)
    return {"fc1.weight": rng.standard_normal((8, 12)).astype(np.float32),
            "fc1.bias": rng.standard_normal(8).astype(np.float32),
            "fc2.weight": rng.standard_normal((4, 8)).astype(np.float32),
            "fc2.bias": rng.standard_normal(4).astype(np.float32)}


def write_ckpt(path, arrays, age=60):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(safetensors_from_numpy(arrays))
    t = os.path.getmtime(path) - age
    os.utime(path, (t, t))


class ScanExit(TmpDirCase):
    """`ckptd scan` and `ckptd status --finished` (no watcher) exit 1 when a
    stage after the pass failed, after doing everything else; 0 when all
    went. (An upload that fails: upload_scan.scan_exit_status_reflects_failed_uploads.)"""

    def setUp(self):
        super().setUp()
        self.train = os.path.join(self.dir, "train")
        self.nfs = os.path.join(self.dir, "nfs")
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_1.safetensors"), weights(1))

    def config(self, extra=""):
        with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
            f.write(SAFE_GRAPH + "upload:\n  stores: [file://%s]\n" % self.nfs + extra)

    def test_all_stages_done_exits_0(self):
        self.config()
        p = run("scan", self.train, check=0)
        self.assertIn("against=source", p.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.nfs, "data", "deploy",
                                                    "epoch_1.safetensors.mldef")))

    def test_pack_failure_exits_1(self):
        odd = weights(2)
        odd["fc2.weight"] = np.zeros((4, 5), np.float32)  # does not fit the layer list
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_2.safetensors"), odd)
        self.config()
        p = run("scan", self.train, check=1)
        self.assertIn("1 checkpoint(s) could not be packed", p.stderr)
        # everything else was done: both registered and uploaded, the good one packed
        for k in ("metadata.yaml", "data/checkpoints/epoch_2.safetensors",
                  "data/deploy/epoch_1.safetensors.mldef"):
            self.assertTrue(os.path.exists(os.path.join(self.nfs, k)), k)
        # nothing new: the next scan has nothing that fails
        run("scan", self.train, check=0)

    def test_verify_failure_exits_1_held_or_marked(self):
        bad = weights(2)
        bad["fc1.bias"][0] = np.nan
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_2.safetensors"), bad)
        self.config()
        p = run("scan", self.train, check=1)
        self.assertIn("1 archive(s) failed verification", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.nfs, "data", "deploy",
                                                     "epoch_2.safetensors.mldef")))
        self.assertTrue(os.path.exists(os.path.join(self.nfs, "metadata.yaml")))
        # upload_marked: it goes up marked failed, and the exit code still says so
        bad3 = weights(3)
        bad3["fc2.bias"][1] = np.inf
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_3.safetensors"), bad3)
        self.config("verify:\n  on_failure: upload_marked\n")
        p = run("scan", self.train, check=1)
        self.assertIn("1 archive(s) failed verification", p.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.nfs, "data", "deploy",
                                                    "epoch_3.safetensors.mldef")))
        self.assertEqual(archives(self.train)["epoch_3.safetensors.mldef"]["verification"],
                         "failed")

    def test_hook_given_up_exits_1(self):
        self.config("hooks:\n  exec:\n    - event: checkpoint.registered\n"
                    "      command: [/bin/sh, -c, 'exit 3']\n")
        p = run("scan", self.train, check=1)
        self.assertIn("1 hook delivery(ies) given up", p.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.nfs, "metadata.yaml")))
        # a webhook whose receiver answers 500, with no retry left
        r = Receiver(self.dir, statuses=[500] * 10)
        self.addCleanup(r.stop)
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_2.safetensors"), weights(2))
        self.config("hooks:\n  retry_schedule: []\n  webhooks:\n"
                    f"    - url: {r.url}\n      secret: env:CK_WH\n"
                    "      events: [checkpoint.registered]\n")
        p = run("scan", self.train, env={"CK_WH": "whsec_" + "QUJD" * 8}, check=1)
        self.assertEqual(len(r.requests()), 1, p.stderr)  # no retries: given up at once
        self.assertIn("webhook.gave_up", p.stderr)
        self.assertIn("1 hook delivery(ies) given up", p.stderr)

    def test_status_finished_without_a_watcher(self):
        bad = weights(1)
        bad["fc2.weight"][0, 0] = np.nan
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_1.safetensors"), bad)
        self.config()
        p = run("status", "--finished", self.train, check=1)
        self.assertIn("1 archive(s) failed verification", p.stderr)
        # the status was set and uploaded all the same
        with open(os.path.join(self.nfs, "metadata.yaml")) as f:
            self.assertEqual(yaml.safe_load(f)["model"]["training"]["status"], "finished")
        self.assertIn("finished", p.stdout)


class PathRule(TmpDirCase):
    """Relative paths in a config are the config file's folder's, whatever
    the working directory: DIR/ckptd.yaml and -c FILE elsewhere, run from /."""

    def setUp(self):
        super().setUp()
        self.train = os.path.join(self.dir, "train")
        self.nfs = os.path.join(self.dir, "nfs")
        write_ckpt(os.path.join(self.train, "ckpts", "epoch_1.safetensors"), weights(1))

    def write_setup(self, folder):
        """In folder: the layer list, a signing key, verify inputs and numpy's expected outputs."""
        os.makedirs(os.path.join(folder, "golden"), exist_ok=True)
        with open(os.path.join(folder, "layers.yaml"), "w") as f:
            f.write(SAFE_GRAPH.split("  graph:\n")[1].replace("\n    ", "\n").lstrip())
        os.makedirs(os.path.join(folder, "keys"), exist_ok=True)
        run("keygen", "-o", os.path.join(folder, "keys", "deploy.key"), check=0)
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 12)
        np.save(os.path.join(folder, "golden", "x.npy"), x)
        a = weights(1)
        y = np.maximum(x @ a["fc1.weight"].T + a["fc1.bias"], 0) @ a["fc2.weight"].T + a["fc2.bias"]
        np.save(os.path.join(folder, "golden", "epoch_1.y.npy"), y.astype(np.float32))
        return ("pack:\n  formats: [mldef]\n  graph: file:layers.yaml\n"
                "  sign_key: file:keys/deploy.key\n"
                "verify:\n  inputs: [golden/x.npy]\n  expected: ['golden/{stem}.y.npy']\n"
                "  atol: 1e-5\n"
                f"upload:\n  stores: [file://{self.nfs}]\n")

    def check(self, p, key):
        self.assertEqual(p.returncode, 0, p.stderr)
        rec = archives(self.train)["epoch_1.safetensors.mldef"]
        self.assertEqual((rec["verification"], rec["against"]), ("passed", "expected"))
        got = os.path.join(self.nfs, "data", "deploy", "epoch_1.safetensors.mldef")
        import zipfile
        with zipfile.ZipFile(got) as z:  # signed with the key the config names
            lines = z.read("SIGNATURE").decode().splitlines()
        pub = open(key + ".pub").read().split()[1]
        self.assertTrue(lines[-1].startswith(f"ed25519 {pub} "), lines[-1])

    def test_dir_config_from_root(self):
        with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
            f.write(self.write_setup(self.train))
        self.check(run_in("/", "scan", self.train), os.path.join(self.train, "keys", "deploy.key"))

    def test_explicit_config_elsewhere(self):
        conf = os.path.join(self.dir, "etc")
        os.makedirs(conf)
        with open(os.path.join(conf, "c.yaml"), "w") as f:
            f.write(self.write_setup(conf))
        # given as a relative path from one folder, run with another working directory
        p = run_in(self.dir, "scan", "-c", "etc/c.yaml", "train")
        self.check(p, os.path.join(conf, "keys", "deploy.key"))


def numpy_forward(a, x):
    h = np.maximum(x @ a["fc1.weight"].T + a["fc1.bias"], 0)
    return h @ a["fc2.weight"].T + a["fc2.bias"]


def signer(path):
    """The Ed25519 public key on an .mldef's SIGNATURE line, or None when unsigned."""
    import zipfile
    with zipfile.ZipFile(path) as z:
        if "SIGNATURE" not in z.namelist():
            return None
        return z.read("SIGNATURE").decode().splitlines()[-1].split()[1]


class PackConfig(TmpDirCase):
    """`ckptd pack -c FILE` honours the pack.* keys as the sidecar does; a flag
    overrides its key."""

    def setUp(self):
        super().setUp()
        self.src = os.path.join(self.dir, "epoch_1.safetensors")
        write_ckpt(self.src, weights(1))
        self.conf = os.path.join(self.dir, "conf")
        os.makedirs(os.path.join(self.conf, "keys"))
        self.key = os.path.join(self.conf, "keys", "deploy.key")
        run("keygen", "-o", self.key, check=0)
        self.pub = open(self.key + ".pub").read().split()[1]
        self.cfg = os.path.join(self.conf, "ckptd.yaml")

    def write(self, text):
        with open(self.cfg, "w") as f:
            f.write(text)

    def check_outputs(self, archive):
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 12)
        np.save(os.path.join(self.dir, "x.npy"), x)
        np.save(os.path.join(self.dir, "y.npy"), numpy_forward(weights(1), x).astype(np.float32))
        run("verify", archive, "--inputs", os.path.join(self.dir, "x.npy"), "--expected",
            os.path.join(self.dir, "y.npy"), "--atol", "1e-5", check=0)

    def test_sign_key_from_the_config(self):
        # the graph by flag, the key only in the config (relative: the config's folder)
        self.write("pack:\n  sign_key: file:keys/deploy.key\n")
        graph = os.path.join(self.dir, "layers.yaml")
        with open(graph, "w") as f:
            f.write(SAFE_GRAPH.split("  graph:\n")[1].replace("\n    ", "\n").lstrip())
        out = os.path.join(self.dir, "a.mldef")
        run_in(self.dir, "pack", "-c", self.cfg, self.src, "--graph", "layers.yaml", "-o", out)
        self.assertEqual(signer(out), self.pub)
        mldef = os.path.join(os.path.dirname(CKPTD), "mldef")
        q = subprocess.run([mldef, "-s", "--pubkey", self.key + ".pub", out],
                           capture_output=True, text=True)
        self.assertEqual(q.returncode, 0, q.stdout + q.stderr)
        self.assertIn("signature good", q.stdout)

    def test_graph_dir_and_formats_from_the_config(self):
        self.write(SAFE_GRAPH + "  dir: out\n  sign_key: file:keys/deploy.key\n")
        p = run_in("/", "pack", "-c", self.cfg, self.src)  # no -o: pack.dir, named as the sidecar
        self.assertEqual(p.returncode, 0, p.stderr)
        out = os.path.join(self.conf, "out", "epoch_1.mldef")
        self.assertEqual(signer(out), self.pub)
        self.check_outputs(out)
        # pack.formats: [samediff] names the format; --format overrides it
        self.write(SAFE_GRAPH.replace("[mldef]", "[samediff]") + "  dir: out\n")
        p = run_in("/", "pack", "-c", self.cfg, self.src)
        self.assertEqual(p.returncode, 0, p.stderr)
        import zipfile
        with zipfile.ZipFile(os.path.join(self.conf, "out", "epoch_1.zip")) as z:
            self.assertEqual(z.read("tags.txt").decode().split(), ["epoch_1"])
        flag = os.path.join(self.dir, "flag.mldef")
        p = run_in("/", "pack", "-c", self.cfg, self.src, "--format", "mldef", "-o", flag)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIsNone(signer(flag))  # this config has no key
        self.check_outputs(flag)


class Runnable(TmpDirCase):
    """Valid means runnable: what the engine refuses (a concat of 17 inputs)
    is neither packed nor called valid."""

    def graph(self, n):
        layers = "".join(f"      - {{op: relu, name: r{i}, from: [x]}}\n" for i in range(n))
        refs = ", ".join(f"r{i}" for i in range(n))
        return ("pack:\n  formats: [mldef]\n  graph:\n    input: {name: x, shape: [-1, 12]}\n"
                "    layers:\n      - {op: dense, weight: fc1.weight, bias: fc1.bias, name: h}\n"
                + layers.replace("from: [x]", "from: [h]")
                + f"      - {{op: concat, axis: 1, from: [{refs}]}}\n")

    def packed(self, n):
        """An .mldef of the graph of n branches, packed from a checkpoint."""
        src = os.path.join(self.dir, "epoch_1.safetensors")
        write_ckpt(src, weights(1))
        cfg = os.path.join(self.dir, "c.yaml")
        with open(cfg, "w") as f:
            f.write(self.graph(n))
        ok = os.path.join(self.dir, "ok.mldef")
        run("pack", "-c", cfg, src, "-o", ok, check=0)
        return ok

    def test_concat_of_many_inputs_packs_and_runs(self):
        """No fixed bound on a node's inputs (it was 16): a 17-input concat
        packs, mldef -i calls it valid and verify runs it."""
        ok = self.packed(17)
        v = run("verify", ok, check=0)
        self.assertIn("[1, 136]", v.stdout)  # 17 * 8
        mldef = os.path.join(os.path.dirname(CKPTD), "mldef")
        q = subprocess.run([mldef, "-i", ok], capture_output=True, text=True)
        self.assertEqual(q.returncode, 0, q.stdout + q.stderr)

    def test_concat_axis_out_of_range_is_not_valid(self):
        """An archive whose shapes do not chain (its concat's Axis 5 on
        [1, 8] values, rewritten in the manifest by zipfile) is refused by
        mldef -i naming the rule and the node, as verify refuses to run it:
        valid means runnable (it was "valid mldef")."""
        ok = self.packed(3)
        bad = os.path.join(self.dir, "bad.mldef")
        with zipfile.ZipFile(ok) as z, zipfile.ZipFile(bad, "w") as out:
            for name in z.namelist():
                data = z.read(name)
                if name == "manifest.json":
                    man = json.loads(data)
                    cat = [x for x in man["Layers"] if x.get("Op") == "concat"]
                    self.assertEqual(len(cat), 1)
                    cat[0]["Params"]["Axis"] = 5
                    data = json.dumps(man).encode()
                out.writestr(name, data)
        mldef = os.path.join(os.path.dirname(CKPTD), "mldef")
        q = subprocess.run([mldef, "-i", ok], capture_output=True, text=True)
        self.assertEqual(q.returncode, 0, q.stdout + q.stderr)
        q = subprocess.run([mldef, "-i", bad], capture_output=True, text=True)
        self.assertEqual(q.returncode, 1, q.stdout + q.stderr)
        self.assertIn("[engine.runs]", q.stdout + q.stderr)
        self.assertIn("(concat)", q.stdout + q.stderr)
        self.assertNotIn("valid mldef", q.stdout)
        v = run("verify", bad, check=1)
        self.assertIn("(concat)", v.stderr)



class OptionOrder(TmpDirCase):
    """Every command takes its options before and after its operands, as
    getopt_long's permutation does for the GNU tools: the same invocation in
    both orders exits the same and prints the same."""

    def same(self, before, after, strip=None):
        a = run(*before)
        b = run(*after)
        self.assertEqual(a.returncode, b.returncode, f"{before}: {a.stderr}\n{after}: {b.stderr}")
        out_a, out_b = a.stdout, b.stdout
        if strip:  # lines that hold times
            out_a = "".join(x for x in out_a.splitlines(True) if not re.search(strip, x))
            out_b = "".join(x for x in out_b.splitlines(True) if not re.search(strip, x))
        self.assertEqual(out_a, out_b, f"{before} / {after}")
        return a

    def test_every_command_takes_options_after_its_operands(self):
        src = os.path.join(self.dir, "run", "epoch_1.safetensors")
        write_ckpt(src, weights(1))
        cfg = os.path.join(self.dir, "c.yaml")
        with open(cfg, "w") as f:
            f.write(Runnable.graph(None, 2))
        out = os.path.join(self.dir, "a.mldef")
        self.same(["pack", "-q", "-c", cfg, "-o", out, src], ["pack", src, "-o", out, "-c", cfg, "-q"])
        p = self.same(["inspect", "--json", out], ["inspect", out, "--json"])
        self.assertEqual(p.returncode, 0, p.stderr)
        p = self.same(["verify", "--repeat", "2", out], ["verify", out, "--repeat", "2"],
                      strip=r"^engine: ")
        self.assertIn("ok", p.stdout)
        run_dir = os.path.dirname(src)
        self.same(["scan", "-q", run_dir], ["scan", run_dir, "-q"])
        p = self.same(["status", "--json", run_dir], ["status", run_dir, "--json"])
        self.assertEqual(json.loads(p.stdout)["checkpoints"], 1)
        self.same(["config", "-v", run_dir], ["config", run_dir, "-v"])
        bundle = os.path.join(self.dir, "t.tar.zst")
        self.same(["bundle", "-o", bundle, run_dir], ["bundle", run_dir, "-o", bundle])
        state = os.path.join(self.dir, "st")
        dest = "file://" + os.path.join(self.dir, "store") + "/"
        self.same(["upload", "-q", "--state", state, src, dest],
                  ["upload", src, dest, "--state", state, "-q"])
        self.same(["queue", "--json", "--state", state], ["queue", "list", "--state", state, "--json"])
        # the usage errors are the same too: an unknown option after the operand
        p = self.same(["verify", "--no-such-option", out], ["verify", out, "--no-such-option"])
        self.assertEqual(p.returncode, 2)


class ConfigCheck(TmpDirCase):
    """`ckptd config DIR` and `watch -n` fail (exit 2) on what the first
    checkpoint would fail on, naming the file and the line as written."""

    def setUp(self):
        super().setUp()
        self.train = os.path.join(self.dir, "train")
        os.makedirs(self.train)
        self.cfg = os.path.join(self.train, "ckptd.yaml")

    def write(self, text):
        with open(self.cfg, "w") as f:
            f.write(text)
        return text

    def refused(self, *words, env=None):
        outs = []
        for args in (("config", self.train), ("watch", "-n", self.train),
                     ("scan", "-n", self.train)):
            p = run(*args, env=env)
            self.assertEqual(p.returncode, 2, f"{args}: {p.stdout}{p.stderr}")
            for w in words:
                self.assertIn(w, p.stderr, args)
            outs.append(p.stderr)
        return outs

    def line_of(self, text, needle):
        return next(i + 1 for i, ln in enumerate(text.splitlines()) if needle in ln)

    def test_layer_list_unknown_key_with_its_line(self):
        text = self.write("# the run\nmodel:\n  name: mlp\n\n" + SAFE_GRAPH.replace(
            "bias: fc2.bias", "bais: fc2.bias") + "verify:\n  atol: 1e-5\n")
        n = self.line_of(text, "bais")
        self.refused(f"'{self.cfg}' line {n}: layer 2 (dense): unknown key 'bais'")
        # the same list in flow style on one line: that line
        text = self.write("pack:\n  formats: [mldef]\n\n\n  graph: {layers: [{op: dense, "
                          "weight: w}, {op: relu, bais: 1}]}\n")
        self.refused(f"'{self.cfg}' line {self.line_of(text, 'bais')}: layer 1 (relu): "
                     "unknown key 'bais'")
        # and a valid one passes
        self.write(SAFE_GRAPH)
        run("config", self.train, check=0)
        run("watch", "-n", self.train, check=0)

    def test_graph_file_missing_and_impossible_shapes(self):
        self.write("pack:\n  formats: [mldef]\n  graph: file:layers.yaml\n")
        self.refused("pack.graph", os.path.join(self.train, "layers.yaml"))
        with open(os.path.join(self.train, "layers.yaml"), "w") as f:
            f.write("input: {name: x, shape: [-1, 0]}\nlayers:\n  - {op: relu}\n")
        self.refused(os.path.join(self.train, "layers.yaml"), "dimension 0")


    def test_verify_files_and_sign_key(self):
        self.write("verify:\n  inputs: [golden/x.npy]\n")
        self.refused("verify.inputs", os.path.join(self.train, "golden", "x.npy"))
        os.makedirs(os.path.join(self.train, "golden"))
        np.save(os.path.join(self.train, "golden", "x.npy"), np.zeros((1, 12), np.float32))
        # per-checkpoint expected files are looked for at each checkpoint
        self.write("verify:\n  inputs: [golden/x.npy]\n  expected: ['golden/{stem}.y.npy']\n")
        run("config", self.train, check=0)
        self.write("pack:\n  formats: [mldef]\n  sign_key: file:keys/none.key\n")
        self.refused("pack.sign_key")

    def test_aws_profile_that_exists_nowhere(self):
        aws = os.path.join(self.dir, "aws")
        os.makedirs(aws)
        with open(os.path.join(aws, "config"), "w") as f:
            f.write("[profile train]\nregion = eu-west-1\n")
        with open(os.path.join(aws, "credentials"), "w") as f:
            f.write("[train]\naws_access_key_id = AKIAEXAMPLE\naws_secret_access_key = x\n")
        os.chmod(os.path.join(aws, "credentials"), 0o600)
        env = {"AWS_CONFIG_FILE": os.path.join(aws, "config"),
               "AWS_SHARED_CREDENTIALS_FILE": os.path.join(aws, "credentials")}
        self.write("upload:\n  stores:\n    - url: s3://b/p\n      endpoint: http://127.0.0.1:9\n"
                   "      profile: trian\n")
        self.refused("upload.stores[0]", "profile", "trian", env=env)
        self.write("upload:\n  stores:\n    - url: s3://b/p\n      endpoint: http://127.0.0.1:9\n"
                   "      profile: train\n")
        run("config", self.train, env=env, check=0)

    def test_dir_not_writable_by_the_user(self):
        need("setpriv", "running as another user needs setpriv (util-linux)")
        if os.getuid() != 0:
            raise unittest.SkipTest("needs root to run as nobody")
        # a copy of the binary nobody can reach, and a DIR nobody can write
        pub = os.path.join("/tmp", os.path.basename(self.dir) + ".pub")
        os.makedirs(pub)
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", pub]))
        os.chmod(pub, 0o755)
        binary = os.path.join(pub, "ckptd")
        subprocess.run(["cp", CKPTD, binary], check=True)
        d = os.path.join(pub, "train")
        os.makedirs(os.path.join(d, ".ckptd"))
        os.chmod(d, 0o755)
        with open(os.path.join(d, "ckptd.yaml"), "w") as f:
            f.write("checkpoints:\n  min_age: 1s\n")
        os.chmod(os.path.join(d, "ckptd.yaml"), 0o644)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", binary]
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
        for args in (["config", d], ["watch", "-n", d], ["scan", "-n", d]):
            p = subprocess.run(nobody + args, capture_output=True, text=True, env=env, cwd="/")
            self.assertEqual(p.returncode, 2, f"{args}: {p.stdout}{p.stderr}")
            self.assertIn(f"'{d}': the model folder is not writable by this user", p.stderr)
        # DIR writable, its .ckptd not (made by another user)
        os.chmod(d, 0o777)
        os.chmod(os.path.join(d, ".ckptd"), 0o755)
        p = subprocess.run(nobody + ["config", d], capture_output=True, text=True, env=env)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("the state folder is not writable", p.stderr)
        os.chmod(os.path.join(d, ".ckptd"), 0o777)
        p = subprocess.run(nobody + ["config", d], capture_output=True, text=True, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)


MiB = 1 << 20


class KeyTable(TmpDirCase):
    """Flags and config are one table: every command's `--help` says which
    config keys its flags stand for ([config: KEY]); each such key, given
    in a config file (-c) and no flag, must do what the flag does. The walk
    fails on a claim with no probe below, so a new one cannot go unchecked."""

    def claims(self):
        keys = {ln.split()[0] for ln in run("config", "--keys", check=0).stdout.splitlines()}
        top = run("--help", check=0).stdout
        cmds = re.findall(r"^  ([a-z]+) {2,}", top, re.M)
        self.assertIn("pack", cmds)
        out = []
        for c in cmds:
            text = run(c, "--help", check=0).stdout
            for k in re.findall(r"\[config: ([a-z0-9_.]+)\]", text):
                self.assertIn(k, keys, f"ckptd {c} --help claims an unknown key {k}")
                out.append((c, k))
        return out

    def test_every_claimed_key_is_honoured_from_the_config(self):
        claims = self.claims()
        missing = [(c, k) for c, k in claims if not hasattr(self, "probe_%s__%s" % (
            c, k.replace(".", "_")))]
        self.assertEqual(missing, [], "claims without a probe")
        self.assertGreaterEqual(len(claims), 18, claims)
        for c, k in claims:
            with self.subTest(command=c, key=k):
                d = os.path.join(self.dir, f"{c}-{k}")
                os.makedirs(d)
                getattr(self, "probe_%s__%s" % (c, k.replace(".", "_")))(d)

    def conf(self, d, text):
        path = os.path.join(d, "conf", "c.yaml")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    # ---- scan ----
    def probe_scan__checkpoints_min_age(self, d):
        train = os.path.join(d, "train")
        write_ckpt(os.path.join(train, "epoch_1.safetensors"), weights(1), age=5)
        p = run("scan", "-c", self.conf(d, "checkpoints:\n  min_age: 1m\n"), train, check=0)
        self.assertIn("registered=0", p.stderr)
        self.assertIn("waiting=1", p.stderr)
        p = run("scan", "-c", self.conf(d, "checkpoints:\n  min_age: 1s\n"), train, check=0)
        self.assertIn("registered=1", p.stderr)

    def probe_scan__metrics_file(self, d):
        train = os.path.join(d, "train")
        write_ckpt(os.path.join(train, "epoch_1.safetensors"), weights(1))
        run_in("/", "scan", "-c", self.conf(d, "metrics_file: m.prom\n"), train)
        with open(os.path.join(d, "conf", "m.prom")) as f:  # the config's folder
            self.assertIn("ckptd_", f.read())

    # ---- pack ----
    def pack(self, d, text, *extra):
        src = os.path.join(d, "epoch_1.safetensors")
        write_ckpt(src, weights(1))
        p = run_in("/", "pack", "-c", self.conf(d, text), src, *extra)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p

    def probe_pack__pack_graph(self, d):
        out = os.path.join(d, "a.mldef")
        self.pack(d, SAFE_GRAPH, "-o", out)  # no --graph: a weight-only file needs the key
        import zipfile
        with zipfile.ZipFile(out) as z:
            self.assertEqual(len(json.loads(z.read("manifest.json"))["Layers"]), 3 + 1)

    def probe_pack__pack_dir(self, d):
        self.pack(d, SAFE_GRAPH + "  dir: /%s/out\n" % d.strip("/"))
        self.assertTrue(os.path.exists(os.path.join(d, "out", "epoch_1.mldef")))

    def probe_pack__pack_formats(self, d):
        out = os.path.join(d, "a.zip")
        self.pack(d, SAFE_GRAPH.replace("[mldef]", "[samediff]"), "-o", out)
        import zipfile
        with zipfile.ZipFile(out) as z:
            self.assertIn("tags.txt", z.namelist())

    def probe_pack__pack_weights(self, d):
        # a training dict with two containers of the model: pack.weights picks one
        src = os.path.join(d, "train.safetensors")
        w = weights(1)
        write_ckpt(src, {**{"model." + k: v for k, v in w.items()},
                         **{"ema." + k: v * 2 for k, v in w.items()}})
        p = run_in("/", "pack", "-c", self.conf(d, SAFE_GRAPH), src, "-o",
                   os.path.join(d, "a.mldef"))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("pack.weights", p.stderr)
        out = os.path.join(d, "b.mldef")
        p = run_in("/", "pack", "-c", self.conf(d, SAFE_GRAPH + "  weights: ema\n"), src, "-o",
                   out)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("container='ema'", p.stderr)

    def probe_pack__pack_sign_key(self, d):
        key = os.path.join(d, "conf", "k")
        os.makedirs(os.path.dirname(key))
        run("keygen", "-o", key, check=0)
        out = os.path.join(d, "a.mldef")
        self.pack(d, SAFE_GRAPH + "  sign_key: file:k\n", "-o", out)
        self.assertEqual(signer(out), open(key + ".pub").read().split()[1])

    # ---- watch ----
    def watch(self, d, text, check, *cmd, stop=True):
        train = os.path.join(d, "train")
        os.makedirs(train, exist_ok=True)
        log = open(os.path.join(d, "watch.log"), "w+")
        args = [CKPTD, "watch", "-c", self.conf(d, text), train]
        if cmd:
            args += ["--", *cmd]
        w = subprocess.Popen(args, stderr=log, stdout=subprocess.DEVNULL)
        self.addCleanup(lambda: w.poll() is None and w.kill())
        end = time.time() + 60
        while "watch.started" not in open(log.name).read() and time.time() < end:
            time.sleep(0.1)
        try:
            check(open(log.name).read(), w)
        finally:
            if stop and w.poll() is None:
                w.send_signal(signal.SIGTERM)
                w.wait(timeout=60)

    def probe_watch__watch_poll(self, d):
        self.watch(d, "watch:\n  poll: true\n",
                   lambda log, w: self.assertIn("backend=poll", log))

    def probe_watch__watch_poll_interval(self, d):
        self.watch(d, "watch:\n  poll_interval: 3s\n",
                   lambda log, w: self.assertIn("poll_interval_seconds=3 ", log))

    def probe_watch__watch_settle(self, d):
        self.watch(d, "watch:\n  settle: 1.5s\n",
                   lambda log, w: self.assertIn("settle_seconds=1.5 ", log))

    def probe_watch__listen(self, d):
        import socket
        import urllib.request
        with socket.socket() as so:
            so.bind(("127.0.0.1", 0))
            port = so.getsockname()[1]

        def check(log, w):
            end, body = time.time() + 30, None
            while body is None and time.time() < end:
                try:
                    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz",
                                                  timeout=5).read()
                except OSError:
                    time.sleep(0.2)
            self.assertIsNotNone(body, log)
        self.watch(d, f"listen: 127.0.0.1:{port}\n", check)

    def probe_watch__watch_grace_period(self, d):
        # a trainer that ignores SIGTERM is killed after the grace period, not the default 20s
        def check(log, w):
            t0 = time.time()
            w.send_signal(signal.SIGTERM)
            w.wait(timeout=60)
            self.assertLess(time.time() - t0, 12)
        self.watch(d, "watch:\n  grace_period: 1s\n", check, "/bin/sh", "-c",
                   "trap '' TERM; sleep 100 & wait; sleep 100")

    # ---- upload ----
    def s3_upload(self, d, text, files, statuses=()):
        from servers import FlakyProxy
        need("aws", "checking S3 uploads needs awscli")
        s3 = S3Server(d)
        self.addCleanup(s3.stop)
        proxy = FlakyProxy(s3.port, list(statuses))
        self.addCleanup(proxy.stop)
        src = os.path.join(d, "src")
        os.makedirs(src, exist_ok=True)
        for name, size in files:
            with open(os.path.join(src, name), "wb") as f:
                f.write(os.urandom(size))
        p = run("upload", "--no-progress", "--state", os.path.join(d, "state"), "--endpoint",
                proxy.url, "-c", self.conf(d, text), src if len(files) > 1 else
                os.path.join(src, files[0][0]), "s3://ckpt/p", env=s3.env(), timeout=170)
        return p, proxy

    def parts(self, proxy):
        return [r for r in proxy.requests if r[0] == "PUT" and "partNumber" in r[1]]

    def probe_upload__upload_part_size(self, d):
        p, proxy = self.s3_upload(d, "upload:\n  part_size: 5MiB\n  multipart_threshold: 5MiB\n",
                                  [("a.bin", 12 * MiB)])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(self.parts(proxy)), 3)

    def probe_upload__upload_multipart_threshold(self, d):
        p, proxy = self.s3_upload(d, "upload:\n  multipart_threshold: 100MiB\n",
                                  [("a.bin", 70 * MiB)])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.parts(proxy), [])  # under the threshold: one PUT

    def probe_upload__upload_concurrency(self, d):
        p, proxy = self.s3_upload(d, "upload:\n  concurrency: 1\n  part_size: 5MiB\n"
                                  "  multipart_threshold: 5MiB\n  max_rate: 12MiB\n",
                                  [("a.bin", 20 * MiB)])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(self.parts(proxy)), 4)
        self.assertEqual(proxy.max_puts, 1)

    def probe_upload__upload_transfers(self, d):
        p, proxy = self.s3_upload(d, "upload:\n  transfers: 1\n  max_rate: 4MiB\n",
                                  [("a.bin", MiB), ("b.bin", MiB), ("c.bin", MiB)])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(proxy.max_puts, 1)

    def probe_upload__upload_max_rate(self, d):
        t0 = time.time()
        p, proxy = self.s3_upload(d, "upload:\n  max_rate: 1MiB\n", [("a.bin", 3 * MiB)])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertGreater(time.time() - t0, 1.5)

    def probe_upload__upload_retries(self, d):
        # a store that answers 500: each round makes 1 + retries attempts
        n = {}
        for retries in (0, 2):
            sub = os.path.join(d, f"r{retries}")
            os.makedirs(sub)
            p, proxy = self.s3_upload(sub, f"upload:\n  retries: {retries}\n",
                                      [("a.bin", 1000)], statuses=[500] * 100)
            self.assertEqual(p.returncode, 1, p.stderr)
            n[retries] = len([r for r in proxy.requests if r[0] == "PUT"])
        self.assertGreater(n[0], 0)
        self.assertEqual(n[2], 3 * n[0], n)

    def probe_upload__upload_sha256(self, d):
        from servers import Nginx
        src = os.path.join(d, "a.bin")
        data = os.urandom(5000)
        with open(src, "wb") as f:
            f.write(data)
        with Nginx(d) as web:
            p = run("upload", "--no-progress", "--state", os.path.join(d, "state"), "-c",
                    self.conf(d, "upload:\n  sha256: always\n"), src, web.url + "/up", check=0)
        import hashlib
        done = [ln for ln in p.stderr.splitlines() if " upload.done:" in ln]
        self.assertTrue(done, p.stderr)
        self.assertIn("sha256=" + hashlib.sha256(data).hexdigest(), done[0])


if __name__ == "__main__":
    unittest.main()
