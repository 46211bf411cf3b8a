"""Say only what is true (issue 27, first half): every verification names
what it compared with, relative paths in a config follow the config file
whatever the working directory, and a one-shot pass that could not do
everything exits 1. The reference outputs come from torch (Debian's
python3-torch) and numpy in the test, never from ckptd."""
import json
import os
import subprocess
import sys
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

    def test_concat_over_the_engines_limit(self):
        src = os.path.join(self.dir, "epoch_1.safetensors")
        write_ckpt(src, weights(1))
        cfg = os.path.join(self.dir, "c.yaml")
        with open(cfg, "w") as f:
            f.write(self.graph(16))
        ok = os.path.join(self.dir, "ok.mldef")
        run("pack", "-c", cfg, src, "-o", ok, check=0)
        v = run("verify", ok, check=0)  # the engine runs 16: [1, 16 * 8]
        self.assertIn("[1, 128]", v.stdout)
        with open(cfg, "w") as f:
            f.write(self.graph(17))
        bad = os.path.join(self.dir, "bad.mldef")
        p = run("pack", "-c", cfg, src, "-o", bad, check=1)
        self.assertIn("17 inputs", p.stderr)
        self.assertIn("at most 16", p.stderr)
        self.assertFalse(os.path.exists(bad))
        # an archive that has one (the 16-input one with a 17th added to its manifest):
        # mldef -i does not call it valid, and verify refuses it alike
        import zipfile
        with zipfile.ZipFile(ok) as z:
            items = [(i.filename, z.read(i.filename)) for i in z.infolist()]
        man = json.loads(dict(items)["manifest.json"])
        cat = next(lay for lay in man["Layers"] if lay.get("Type", lay.get("Op", "")).lower()
                   .startswith("concat"))
        key = "Inputs" if "Inputs" in cat else "From"
        cat[key] = cat[key] + [cat[key][0]]
        with zipfile.ZipFile(bad, "w") as z:
            for name, data in items:
                z.writestr(name, json.dumps(man) if name == "manifest.json" else data)
        mldef = os.path.join(os.path.dirname(CKPTD), "mldef")
        q = subprocess.run([mldef, "-i", bad], capture_output=True, text=True)
        self.assertEqual(q.returncode, 1, q.stdout + q.stderr)
        self.assertIn("[engine.runs]", q.stderr)
        self.assertNotIn("valid mldef", q.stdout)
        run("verify", bad, check=1)


if __name__ == "__main__":
    unittest.main()
