"""Checkpoints as the popular trainers really write them (issue 29), made with
Debian's python3-torch in each trainer's own layout (tests/lib/trainer_layouts.py):
registered with the epoch and step the trainer meant (metadata.yaml checked by
the independent validator), packed with layer lists that use the module's own
names, and verified against the outputs torch computes here."""
import json
import os
import subprocess
import sys
import textwrap
import unittest
import zipfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import torch_gen as tg  # noqa: E402
import trainer_layouts as tl  # noqa: E402
from ckptd_test import CKPTD, TmpDirCase, run  # noqa: E402
from pmf_validate import validate_tree  # noqa: E402

PY = "/usr/bin/python3"


def age(root, seconds=60):
    """Every file under root made seconds old: scan takes only settled files."""
    import time
    t = time.time() - seconds
    for d, _, files in os.walk(root):
        for f in files:
            os.utime(os.path.join(d, f), (t, t), follow_symlinks=False)


def epochs(meta):
    return {ref: c["epoch"] for ref, c in meta["model"]["training"]["checkpoints"].items()}


def registered_line(stderr, ref):
    for line in stderr.splitlines():
        if "checkpoint.registered" in line and f"checkpoint='{ref}'" in line:
            return line
    raise AssertionError(f"no checkpoint.registered line for {ref!r} in:\n{stderr}")


class Base(TmpDirCase):
    def setUp(self):
        super().setUp()
        self.torch = tg.need_torch()
        self.Net = tl.net_class()

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def scan(self, root, expect=0, *extra):
        age(root)
        p = run("scan", root, *extra)
        self.assertEqual(p.returncode, expect, p.stderr)
        self.assertNotIn("Sanitizer", p.stderr)
        return p

    def trained(self, seed=0):
        """A Net, its Adam optimizer and StepLR scheduler after a few steps."""
        torch = self.torch
        torch.manual_seed(seed)
        net = self.Net()
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        for i in range(3):
            tl.train_step(net, opt, seed * 10 + i)
        return net, opt, sched


class Names(Base):
    def test_lightning_layout_registers_epoch_and_step(self):
        net, opt, sched = self.trained()
        lit = tl.lightning_module(net)
        ckdir = self.path("lightning_logs", "version_0", "checkpoints")
        for epoch in range(3):
            tl.train_step(net, opt, 100 + epoch)
            ck = tl.lightning_dict(lit, opt, sched, epoch, 50 * (epoch + 1))
            tl.lightning_save(ck, os.path.join(ckdir, f"epoch={epoch}-step={50 * (epoch + 1)}.ckpt"))
        tl.lightning_save(ck, os.path.join(ckdir, "last.ckpt"))  # save_last: the newest state
        # filename='{epoch}-{val_loss:.2f}' in a second run: the metric after the epoch
        ck = tl.lightning_dict(lit, opt, sched, 3, 200, monitor="val_loss", best=0.12)
        tl.lightning_save(ck, self.path("lightning_logs", "version_1", "checkpoints",
                                        "epoch=3-val_loss=0.12.ckpt"))
        p = self.scan(self.dir)
        meta = validate_tree(self.dir)
        self.assertEqual(epochs(meta), {"epoch=0-step=50.ckpt": 0, "epoch=1-step=100.ckpt": 1,
                                        "epoch=2-step=150.ckpt": 2, "last.ckpt": 2,
                                        "epoch=3-val_loss=0.12.ckpt": 3})
        self.assertEqual(meta["model"]["training"]["latest_epoch"], 3)
        # the step is recorded beside the epoch, with where both came from
        line = registered_line(p.stderr, "epoch=2-step=150.ckpt")
        self.assertIn(" epoch=2 ", line)
        self.assertIn(" step=150 from=lightning name_epoch=2 name_step=150", line)
        self.assertIn(" step=200 from=lightning", registered_line(p.stderr, "epoch=3-val_loss=0.12.ckpt"))
        self.assertIn(" step=150 from=lightning", registered_line(p.stderr, "last.ckpt"))
        self.assertNotIn("name_ambiguous", p.stderr)
        # Lightning rewrites last.ckpt every epoch: it follows the epoch its file records
        tl.train_step(net, opt, 200)
        tl.lightning_save(tl.lightning_dict(lit, opt, sched, 4, 250),
                          os.path.join(ckdir, "last.ckpt"))
        p = self.scan(self.dir)
        self.assertIn("checkpoint.epoch_changed: checkpoint='last.ckpt': epoch 2 -> 4", p.stderr)
        meta = validate_tree(self.dir)
        self.assertEqual(epochs(meta)["last.ckpt"], 4)
        self.assertEqual(meta["model"]["training"]["latest_epoch"], 4)

    def test_file_records_win_over_the_name(self):
        net, opt, sched = self.trained()
        lit = tl.lightning_module(net)
        # renamed by hand: the dict inside says epoch 4, global_step 250
        tl.lightning_save(tl.lightning_dict(lit, opt, sched, 4, 250),
                          self.path("epoch=7-step=999.ckpt"))
        # a .ckpt that is no Lightning checkpoint: its name is all there is
        tl.lightning_save({"state_dict": net.state_dict(), "epoch": 11},
                          self.path("epoch=5-step=10.ckpt"))
        p = self.scan(self.dir)
        self.assertEqual(epochs(validate_tree(self.dir)),
                         {"epoch=7-step=999.ckpt": 4, "epoch=5-step=10.ckpt": 5})
        line = registered_line(p.stderr, "epoch=7-step=999.ckpt")
        self.assertIn(" epoch=4 ", line)
        self.assertIn(" step=250 from=lightning name_epoch=7 name_step=999", line)
        self.assertIn("checkpoint.name_differs: checkpoint='epoch=7-step=999.ckpt'", p.stderr)
        self.assertIn(" step=10 from=name", registered_line(p.stderr, "epoch=5-step=10.ckpt"))
        # last.ckpt that records no epoch: not registered, said by name, exit 1
        other = self.path("other")
        tl.lightning_save({"state_dict": net.state_dict()}, os.path.join(other, "last.ckpt"))
        p = self.scan(other, 1)
        self.assertIn("path='last.ckpt'", p.stderr)
        self.assertIn("has no {epoch} or {step} and the file records neither", p.stderr)
        self.assertEqual(epochs(validate_tree(other, require_checkpoints=False)), {})
        # a pattern of one's own without captures: a plain .ckpt name (ModelCheckpoint's
        # filename='best'); its epoch comes from the file. Other plain names are refused.
        mine = self.path("mine")
        os.makedirs(mine)
        with open(os.path.join(mine, "ckptd.yaml"), "w") as f:
            f.write("checkpoints:\n  patterns: ['best.ckpt', 'epoch_{epoch}.pt']\n")
        tl.lightning_save(tl.lightning_dict(lit, opt, sched, 6, 420), os.path.join(mine, "best.ckpt"))
        p = self.scan(mine)
        self.assertEqual(epochs(validate_tree(mine)), {"best.ckpt": 6})
        with open(os.path.join(mine, "ckptd.yaml"), "w") as f:
            f.write("checkpoints:\n  patterns: ['best.pt']\n")
        p = run("config", mine, check=2)
        self.assertIn("'best.pt' captures neither {epoch} nor {step}", p.stderr)

    def test_hugging_face_trainer_folders(self):
        net, opt, sched = self.trained()
        out = self.path("output")
        for step, epoch in ((500, 1.0), (750, 1.5), (1000, 2.0)):
            tl.train_step(net, opt, step)
            tl.hf_checkpoint(os.path.join(out, f"checkpoint-{step}"), net, opt, sched, epoch,
                             step, 1500)
        # a save still in progress: no trainer_state.json yet
        tl.hf_checkpoint(os.path.join(out, "checkpoint-1250"), net, opt, sched, 2.5, 1250, 1500,
                         write_state=False)
        p = self.scan(self.dir)
        meta = validate_tree(self.dir)
        # trainer_state.json's epoch (epochs done, a float) rounded down, not the step
        self.assertEqual(epochs(meta), {"checkpoint-500": 1, "checkpoint-750": 1,
                                        "checkpoint-1000": 2})
        self.assertIn(" step=750 from=trainer_state.json name_step=750",
                      registered_line(p.stderr, "checkpoint-750"))
        self.assertIn("waiting=1", p.stderr)
        # the folder's own weights pack with the module's names (a plain state dict)
        graph = self.path("g.yaml")
        with open(graph, "w") as f:
            f.write(tl.LAYERS)
        src = os.path.join(out, "checkpoint-1000", "pytorch_model.bin")
        run("pack", src, "-o", self.path("hf.mldef"), "--graph", graph, check=0)
        x, y = self.io(net)
        run("verify", self.path("hf.mldef"), "--inputs", x, "--expected", y, check=0)

    def io(self, net, seed=5):
        torch = self.torch
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(4, 6, generator=g)
        with torch.no_grad():
            y = net(x)
        xp, yp = self.path(f"x{seed}.npy"), self.path(f"y{seed}-{id(net)}.npy")
        np.save(xp, x.numpy())
        np.save(yp, y.numpy())
        return xp, yp

    def test_keras_deepspeed_megatron_dcp_and_plain_names(self):
        import h5py
        net, opt, _ = self.trained()
        roots = {k: self.path(k) for k in ("keras", "deepspeed", "megatron", "dcp", "plain")}
        # Keras ModelCheckpoint('weights.{epoch:02d}-{val_loss:.2f}.h5')
        for epoch, loss in ((3, 0.12), (4, 0.1)):
            name = os.path.join(roots["keras"], f"weights.{epoch:02d}-{loss:.2f}.h5")
            os.makedirs(roots["keras"], exist_ok=True)
            with h5py.File(name, "w") as f:
                f.create_dataset("dense/kernel:0", data=np.ones((6, 3), np.float32))
        # DeepSpeed: two saves, 'latest' names the second
        for step in (100, 200):
            tl.deepspeed_checkpoint(roots["deepspeed"], net, opt, step)
        # Megatron-LM: iterations 500 and 1000 saved, 1500 still being written
        tl.megatron_checkpoint(roots["megatron"], net, 500)
        tl.megatron_checkpoint(roots["megatron"], net, 1000)
        tl.megatron_checkpoint(roots["megatron"], net, 1500, write_tracker=False)
        # torch DCP step folders
        tl.dcp_checkpoint(os.path.join(roots["dcp"], "step_100"), net)
        tl.dcp_checkpoint(os.path.join(roots["dcp"], "step-200"), net)
        # plain names
        os.makedirs(roots["plain"])
        self.torch.save(net.state_dict(), os.path.join(roots["plain"], "epoch_3.pt"))
        self.torch.save(net.state_dict(), os.path.join(roots["plain"], "model_1200.pt"))
        for k in ("deepspeed", "megatron"):
            with open(os.path.join(roots[k], "ckptd.yaml"), "w") as f:
                f.write("checkpoints:\n  steps_per_epoch: 50\n")
        want = {
            "keras": {"weights.03-0.12.h5": 3, "weights.04-0.10.h5": 4},
            "deepspeed": {"global_step100": 2, "global_step200": 4},
            "megatron": {"iter_0000500": 10, "iter_0001000": 20},
            "dcp": {"step_100": 100, "step-200": 200},
            "plain": {"epoch_3.pt": 3, "model_1200.pt": 1200},
        }
        for k, root in roots.items():
            with self.subTest(trainer=k):
                p = self.scan(root)
                self.assertEqual(epochs(validate_tree(root)), want[k], p.stderr)
        self.assertIn("waiting=1", self.scan(roots["megatron"]).stderr)
        # DeepSpeed's model states pack with the module's names (container 'module')
        graph = self.path("g.yaml")
        with open(graph, "w") as f:
            f.write(tl.LAYERS)
        src = os.path.join(roots["deepspeed"], "global_step200", "mp_rank_00_model_states.pt")
        p = run("pack", src, "-o", self.path("ds.mldef"), "--graph", graph, check=0)
        self.assertIn("container='module' prefix='module.'", p.stderr)
        x, y = self.io(net)
        run("verify", self.path("ds.mldef"), "--inputs", x, "--expected", y, check=0)
        src = os.path.join(roots["megatron"], "iter_0001000", "mp_rank_00", "model_optim_rng.pt")
        run("pack", src, "-o", self.path("mg.mldef"), "--graph", graph, check=0)
        run("verify", self.path("mg.mldef"), "--inputs", x, "--expected", y, check=0)

    def test_ambiguous_name_is_logged_once_with_the_reading_chosen(self):
        self.torch.save({"w": self.torch.ones(2)}, self.path("ep3-7.pt"))
        with open(self.path("ckptd.yaml"), "w") as f:
            f.write('checkpoints:\n  patterns: ["ep{epoch}-*.pt", "*-{epoch}.pt"]\n')
        p = self.scan(self.dir)
        self.assertEqual(epochs(validate_tree(self.dir)), {"ep3-7.pt": 3})
        lines = [x for x in p.stderr.splitlines() if "checkpoint.name_ambiguous" in x]
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertIn("checkpoint='ep3-7.pt': read as epoch 3 (pattern 'ep{epoch}-*.pt'), "
                      "not as epoch 7 (pattern '*-{epoch}.pt')", lines[0])
        p = self.scan(self.dir)
        self.assertNotIn("name_ambiguous", p.stderr)

    def test_wrapped_command_gets_dir_and_config(self):
        script = self.path("train.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(f"""\
                import json, os, sys
                sys.path.insert(0, {os.path.dirname(tl.__file__)!r})
                import torch, trainer_layouts as tl
                out = os.environ["CKPTD_DIR"]
                with open(os.path.join(out, ".ckptd", "env.json"), "w") as f:
                    json.dump({{k: v for k, v in os.environ.items() if k.startswith("CKPTD_")}}, f)
                torch.manual_seed(0)
                net = tl.net_class()()
                opt = torch.optim.Adam(net.parameters())
                sched = torch.optim.lr_scheduler.StepLR(opt, 1)
                lit = tl.lightning_module(net)
                ckdir = os.path.join(out, "lightning_logs", "version_0", "checkpoints")
                for epoch in range(2):
                    tl.train_step(net, opt, epoch)
                    tl.lightning_save(tl.lightning_dict(lit, opt, sched, epoch, 20 * (epoch + 1)),
                                      os.path.join(ckdir, f"epoch={{epoch}}-step={{20 * (epoch + 1)}}.ckpt"))
                """))
        run_dir = self.path("run")
        os.makedirs(os.path.join(run_dir, ".ckptd"))
        conf = self.path("conf.yaml")
        with open(conf, "w") as f:
            f.write("model:\n  name: lit\n")

        def watch(*flags, env=None):
            e = dict(os.environ, **(env or {}))
            p = subprocess.run([CKPTD, "watch", "run", *flags, "--", PY, script], cwd=self.dir,
                               capture_output=True, text=True, timeout=120, env=e)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(run_dir, ".ckptd", "env.json")) as f:
                return json.load(f)

        got = watch("--config", "conf.yaml")
        self.assertEqual(got["CKPTD_DIR"], run_dir)  # absolute, though 'run' was given
        self.assertEqual(got["CKPTD_CONFIG"], conf)
        meta = validate_tree(run_dir)
        self.assertEqual(epochs(meta), {"epoch=0-step=20.ckpt": 0, "epoch=1-step=40.ckpt": 1})
        self.assertEqual(meta["model"]["training"]["status"], "finished")
        self.assertEqual(meta["model"]["name"], "lit")
        # no config file: CKPTD_CONFIG is not passed on, even when ckptd's own
        # environment had one (it would name a file this run does not read)
        import shutil
        shutil.rmtree(run_dir)
        os.makedirs(os.path.join(run_dir, ".ckptd"))
        got = watch(env={"CKPTD_CONFIG": "/elsewhere.yaml", "CKPTD_DIR": "/elsewhere"})
        self.assertEqual(got["CKPTD_DIR"], run_dir)
        self.assertNotIn("CKPTD_CONFIG", got)
        # DIR/ckptd.yaml is the config in use
        shutil.rmtree(run_dir)
        os.makedirs(os.path.join(run_dir, ".ckptd"))
        with open(os.path.join(run_dir, "ckptd.yaml"), "w") as f:
            f.write("model:\n  name: lit2\n")
        got = watch()
        self.assertEqual(got["CKPTD_CONFIG"], os.path.join(run_dir, "ckptd.yaml"))


class Weights(Base):
    def setUp(self):
        super().setUp()
        self.graph = self.path("g.yaml")
        with open(self.graph, "w") as f:
            f.write(tl.LAYERS)

    def io(self, net, seed=5):
        return Names.io(self, net, seed)

    def pack_and_verify(self, src, net, *extra):
        out = self.path(os.path.basename(src) + ".mldef")
        p = run("pack", src, "-o", out, "--graph", self.graph, *extra, check=0)
        x, y = self.io(net)
        run("verify", out, "--inputs", x, "--expected", y, check=0)
        # the checkpoint itself with the layer list gives the same
        run("verify", src, "--graph", self.graph, *extra, "--inputs", x, "--expected", y, check=0)
        return p, out

    def test_lightning_checkpoint_packed_with_module_names_and_verified(self):
        net, opt, sched = self.trained()
        src = self.path("epoch=2-step=150.ckpt")
        tl.lightning_save(tl.lightning_dict(tl.lightning_module(net), opt, sched, 2, 150), src)
        p, out = self.pack_and_verify(src, net)
        self.assertIn(f"weights.chosen: file='{src}' container='state_dict' "
                      "prefix='state_dict.model.' tensors=4", p.stderr)
        # the optimizer state (and the callback's tensor) in one line, not one per tensor
        nstate = sum(len(v) for v in opt.state_dict()["state"].values())
        skips = [x for x in p.stderr.splitlines() if "pack.skip" in x]
        self.assertEqual(len(skips), 1, p.stderr)
        self.assertIn(f"tensors={nstate + 1} ", skips[0])
        self.assertIn(f"optimizer_state={nstate} other=1 ('callbacks.ModelCheckpoint", skips[0])
        # inspect --model: the module's own tensors, by its own names, the rest counted
        p = run("inspect", "--model", "--json", "--values", "1000", src, check=0)
        doc = json.loads(p.stdout)
        self.assertEqual(doc["model"], {"container": "state_dict", "prefix": "state_dict.model.",
                                        "tensors": 4, "optimizer_state": nstate, "other": 1})
        sd = net.state_dict()
        self.assertEqual([t["name"] for t in doc["tensors"]], list(sd))
        for t in doc["tensors"]:
            np.testing.assert_array_equal(np.array(t["values"], np.float32),
                                          sd[t["name"]].numpy().ravel(), t["name"])
        p = run("inspect", "--model", src, check=0)
        self.assertIn("model: 4 tensors under 'state_dict.model.' (container 'state_dict')",
                      p.stdout)
        self.assertNotIn("optimizer_states.0.state.", p.stdout)  # its tensors; param_groups are metadata
        # SameDiff keeps the optimizer state as updater state, tied to the model's
        # parameters as torch names them (not to the callback's tensor outside state_dict)
        zout = self.path("run.zip")
        run("pack", src, "-o", zout, "--format", "samediff", "--graph", self.graph, "--tag", "e2",
            check=0)
        import sdfb
        _, a = sdfb.read_archive(zout)
        names = [n for n, _ in net.named_parameters()]
        self.assertEqual(sorted(a["e2"]["updater"]), sorted("state_dict.model." + n for n in names))
        state = opt.state_dict()["state"]
        for i, n in enumerate(names):
            for key, ref in state[i].items():
                np.testing.assert_array_equal(a["e2"]["updater"]["state_dict.model." + n][key],
                                              ref.numpy(), err_msg=f"{n} {key}")
        with zipfile.ZipFile(out) as z:
            manifest = json.loads(z.read("manifest.json"))
        self.assertIn("state_dict.model.fc1.weight", json.dumps(manifest))
        # verify compares: other outputs fail
        x, y = self.io(net)
        bad = self.path("bad.npy")
        np.save(bad, np.load(y) + 0.1)
        p = run("verify", out, "--inputs", x, "--expected", bad)
        self.assertEqual(p.returncode, 1, p.stderr)

    def test_training_dicts_ddp_and_compile_prefixes(self):
        torch = self.torch
        net, opt, _ = self.trained()

        class Compiled(torch.nn.Module):
            """torch.compile's OptimizedModule keeps the module as _orig_mod
            (torch 2.x; torch 1.13 has no compile, so the wrapper is built as it is)."""

            def __init__(self, m):
                super().__init__()
                self._orig_mod = m

        ddp = torch.nn.DataParallel(net)  # the same 'module.' prefix as DistributedDataParallel
        cases = {
            "ddp.pt": ({"model": ddp.state_dict(), "optimizer": opt.state_dict(), "epoch": 3},
                       "container='model' prefix='model.module.'"),
            "compiled.pt": ({"model_state_dict": Compiled(net).state_dict(),
                             "optimizer_state_dict": opt.state_dict(), "epoch": 3},
                            "container='model_state_dict' prefix='model_state_dict._orig_mod.'"),
            "ddp_compiled.pt": (torch.nn.DataParallel(Compiled(net)).state_dict(),
                                "container='module' prefix='module._orig_mod.'"),
        }
        for name, (obj, chosen) in cases.items():
            with self.subTest(name=name):
                src = self.path(name)
                torch.save(obj, src)
                p, _ = self.pack_and_verify(src, net)
                self.assertIn(chosen, p.stderr)
        # a plain state dict needs no choice
        torch.save(net.state_dict(), self.path("plain.pt"))
        p, _ = self.pack_and_verify(self.path("plain.pt"), net)
        self.assertNotIn("weights.chosen", p.stderr)

    def test_two_candidates_is_an_error_naming_the_key(self):
        torch = self.torch
        net, opt, _ = self.trained(seed=1)
        ema, _, _ = self.trained(seed=2)
        src = self.path("ema.pt")
        torch.save({"model": net.state_dict(), "ema": ema.state_dict(),
                    "optimizer": opt.state_dict(), "epoch": 9}, src)
        out = self.path("ema.mldef")
        p = run("pack", src, "-o", out, "--graph", self.graph, check=1)
        self.assertIn("the model's weights could be under 'model' (4 tensors) or 'ema' "
                      "(4 tensors)", p.stderr)
        self.assertIn("pack.weights", p.stderr)
        self.assertFalse(os.path.exists(out))
        p = run("inspect", "--model", src, check=1)
        self.assertIn("could be under 'model' (4 tensors) or 'ema'", p.stderr)
        doc = json.loads(run("inspect", "--model", "--weights", "ema", "--json", "--values", "100",
                             src, check=0).stdout)
        self.assertEqual(doc["model"]["prefix"], "ema.")
        self.assertEqual({t["name"]: t["values"] for t in doc["tensors"]},
                         {k: v.numpy().ravel().tolist() for k, v in ema.state_dict().items()})
        p, out = self.pack_and_verify(src, ema, "--weights", "ema")
        self.assertIn("container='ema' prefix='ema.' tensors=4 (chosen)", p.stderr)
        x, y = self.io(net)  # the other candidate's outputs are not these
        self.assertEqual(run("verify", out, "--inputs", x, "--expected", y).returncode, 1)
        self.pack_and_verify(src, net, "--weights", "model")
        p = run("pack", src, "-o", out, "--graph", self.graph, "--weights", "swa", check=1)
        self.assertIn("--weights 'swa' holds no tensor of the file", p.stderr)
        # --weights picks among a layer list's tensors: alone it is a usage error
        for cmd in (["pack", src, "-o", out], ["verify", src], ["inspect", src]):
            p = run(*cmd, "--weights", "ema", check=2)
            self.assertIn("--weights goes with", p.stderr)

    def test_messages_show_the_way(self):
        torch = self.torch
        net, opt, sched = self.trained()
        src = self.path("epoch=1-step=9.ckpt")
        tl.lightning_save(tl.lightning_dict(tl.lightning_module(net), opt, sched, 1, 9), src)
        typo = self.path("typo.yaml")
        with open(typo, "w") as f:
            f.write(tl.LAYERS.replace("fc2.weight", "fc_2.weight"))
        p = run("pack", src, "-o", self.path("t.mldef"), "--graph", typo, check=1)
        self.assertIn("weight 'fc_2.weight' is not a tensor of", p.stderr)
        self.assertIn("(closest: 'fc2.weight', ", p.stderr)
        # the whole module pickled: refused with its class and the way out
        torch.save(net, self.path("whole.pt"))
        p = run("pack", self.path("whole.pt"), "-o", self.path("w.mldef"), "--graph", self.graph,
                check=1)
        self.assertRegex(p.stderr, r"an object of class '[\w.]*Net'")
        self.assertIn("save model.state_dict() instead", p.stderr)

    def test_sidecar_packs_training_checkpoints_with_pack_weights(self):
        torch = self.torch
        net, opt, sched = self.trained(seed=1)
        ema, _, _ = self.trained(seed=2)
        with open(self.path("ckptd.yaml"), "w") as f:
            f.write(f"pack:\n  formats: [mldef]\n  graph: file:{self.graph}\n"
                    "  weights: ema\n")
        bad = self.path("bad.yaml")
        with open(bad, "w") as f:
            f.write("pack:\n  weights: 'state dict'\n")
        p = run("config", "--config", bad, self.dir)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("pack.weights", p.stderr)
        run("config", self.dir, check=0)
        torch.save({"model": net.state_dict(), "ema": ema.state_dict(), "epoch": 2},
                   self.path("epoch_2.pt"))
        p = self.scan(self.dir)
        self.assertIn("container='ema' prefix='ema.' tensors=4 (chosen)", p.stderr)
        self.assertIn("verification.passed: checkpoint='epoch_2.pt'", p.stderr)
        self.assertEqual(epochs(validate_tree(self.dir)), {"epoch_2.pt": 2})
        archives = [f for f in os.listdir(self.path("data", "deploy")) if f.endswith(".mldef")]
        self.assertEqual(len(archives), 1, p.stderr)
        x, y = self.io(ema)
        run("verify", self.path("data", "deploy", archives[0]), "--inputs", x, "--expected", y,
            check=0)


if __name__ == "__main__":
    unittest.main()
