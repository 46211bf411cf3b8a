"""ckptd scan, end to end: the real binary on real folders, its PMF trees
checked by an independent validator (tests/lib/pmf_validate.py)."""
import fcntl
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import yaml  # noqa: E402
from ckptd_test import CKPTD, TmpDirCase, md5_file, run, shared, write_old  # noqa: E402
from pmf_validate import validate_metadata, validate_tree  # noqa: E402


def meta(d):
    with open(os.path.join(d, "metadata.yaml")) as f:
        return yaml.safe_load(f)


def tree_bytes(d):
    """Every file of the PMF tree (not ckptd's state) with its bytes and mtime."""
    out = {}
    for root, dirs, files in os.walk(d):
        dirs[:] = [x for x in dirs if x != ".ckptd"]
        for f in files:
            p = os.path.join(root, f)
            st = os.stat(p)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = (fh.read(), st.st_mtime_ns)
    return out


class Scan(TmpDirCase):
    def ckpt(self, rel, size=50000, age=60):
        data = os.urandom(size)
        write_old(os.path.join(self.dir, rel), data, age)
        return data

    def test_empty_dir_is_pending(self):
        run("scan", self.dir, check=0)
        m = validate_tree(self.dir)
        t = m["model"]["training"]
        self.assertEqual(t["status"], "pending")
        self.assertEqual(t["checkpoints"], {})
        self.assertIsNone(t["latest"])
        self.assertEqual(m["format"]["producer"]["name"], "ckptd")
        self.assertRegex(m["model"]["id"], r"^[0-9a-f]{32}$")
        self.assertEqual(m["model"]["name"], os.path.basename(self.dir))

    def test_registers_epochs(self):
        for e in (1, 2, 10):
            self.ckpt(f"ckpts/epoch_{e}.pt")
        with open(os.path.join(self.dir, "hparams.yaml"), "w") as f:
            f.write("lr: 0.01\n")
        run("scan", self.dir, check=0)
        m = validate_tree(self.dir)
        t = m["model"]["training"]
        self.assertEqual(t["status"], "running")
        self.assertEqual(list(t["checkpoints"]), ["epoch_1.pt", "epoch_2.pt", "epoch_10.pt"])
        self.assertEqual(t["latest"], "epoch_10.pt")
        self.assertEqual(t["latest_epoch"], 10)
        for e in (1, 2, 10):
            c = t["checkpoints"][f"epoch_{e}.pt"]
            self.assertEqual(c["epoch"], e)
            self.assertEqual(c["path"], f"data/checkpoints/epoch_{e}.pt")
            self.assertEqual(c["hash"], md5_file(os.path.join(self.dir, f"ckpts/epoch_{e}.pt")))
            # placed without copying: the same inode
            self.assertEqual(os.stat(os.path.join(self.dir, c["path"])).st_ino,
                             os.stat(os.path.join(self.dir, f"ckpts/epoch_{e}.pt")).st_ino)
        self.assertEqual(m["model"]["configuration"],
                         {"path": "hparams.yaml", "hash": md5_file(os.path.join(self.dir, "hparams.yaml"))})

    def test_second_scan_changes_nothing(self):
        for e in (1, 2):
            self.ckpt(f"epoch_{e}.pt", size=200000)
        run("scan", self.dir, check=0)
        before = tree_bytes(self.dir)
        p = run("scan", "-v", self.dir, check=0)
        self.assertEqual(tree_bytes(self.dir), before)
        # the hash cache: nothing was read again
        self.assertNotIn("file.hashed", p.stderr)
        self.assertNotIn("metadata.written", p.stderr)

    def test_a_full_pass_reads_only_what_changed(self):
        # 100,000 files in a run: a pass with nothing new must not look at
        # each file's copy and hash cache again, yet must see any change
        for s in (1, 2):
            for j in range(3):
                self.ckpt(f"step_{s}/shard_{j}.distcp", 3000)
            self.ckpt(f"step_{s}/.metadata", 10)
        self.ckpt("epoch_3.pt", 3000)
        run("scan", self.dir, check=0)
        rechecked = lambda p: sorted(re.findall(r"checkpoint\.rechecked: checkpoint='([^']+)'", p.stderr))
        p = run("scan", "-v", self.dir, check=0)
        self.assertEqual(rechecked(p), [])
        self.assertNotIn("metadata.written", p.stderr)
        # rewritten in place: same size, same inode, a new mtime
        shard = os.path.join(self.dir, "step_1/shard_0.distcp")
        ino = os.stat(shard).st_ino
        with open(shard, "r+b") as f:
            f.write(os.urandom(3000))
        os.utime(shard, (time.time() - 30, time.time() - 30))
        self.assertEqual(os.stat(shard).st_ino, ino)
        self.ckpt("step_2/extra.distcp", 100)  # a file added to a registered folder
        p = run("scan", "-v", self.dir, check=0)
        self.assertEqual(rechecked(p), ["step_1", "step_2"])
        self.assertEqual(p.stderr.count("checkpoint.changed"), 2, p.stderr)
        t = validate_tree(self.dir)["model"]["training"]["checkpoints"]
        ck = os.path.join(self.dir, "data", "checkpoints")
        for s in ("step_1", "step_2"):
            self.assertEqual(t[s]["hash"], md5_file(os.path.join(ck, f"{s}.md5sums")))
            r = subprocess.run(["md5sum", "-c", f"{s}.md5sums"], cwd=ck, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("extra.distcp", open(os.path.join(ck, "step_2.md5sums")).read())
        # seen once: the next pass is quiet again
        p = run("scan", "-v", self.dir, check=0)
        self.assertEqual(rechecked(p), [])
        # our copy differing from its source (not the same file any more) is looked at
        os.unlink(os.path.join(ck, "step_2/shard_1.distcp"))
        shutil.copy(os.path.join(self.dir, "step_2/shard_1.distcp"), os.path.join(ck, "step_2/shard_1.distcp"))
        p = run("scan", "-v", self.dir, check=0)
        self.assertEqual(rechecked(p), ["step_2"])

    def test_latest_is_last_registered_and_new_ones_append(self):
        self.ckpt("epoch_5.pt")
        run("scan", self.dir, check=0)
        self.ckpt("epoch_3.pt")  # an older epoch that shows up later
        run("scan", self.dir, check=0)
        t = validate_tree(self.dir)["model"]["training"]
        self.assertEqual(list(t["checkpoints"]), ["epoch_5.pt", "epoch_3.pt"])
        self.assertEqual(t["latest"], "epoch_3.pt")
        self.assertEqual(t["latest_epoch"], 5)

    def test_step_patterns_and_steps_per_epoch(self):
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write("checkpoints:\n  patterns: ['model_step{step}.bin']\n  steps_per_epoch: 100\n")
        self.ckpt("model_step250.bin")
        self.ckpt("epoch_1.pt")  # not a pattern any more
        run("scan", self.dir, check=0)
        t = validate_tree(self.dir)["model"]["training"]
        self.assertEqual(list(t["checkpoints"]), ["model_step250.bin"])
        self.assertEqual(t["checkpoints"]["model_step250.bin"]["epoch"], 2)

    def test_tf_bundle_waits_for_every_shard(self):
        self.ckpt("train/model.ckpt-100.index", 300)
        self.ckpt("train/model.ckpt-100.data-00000-of-00002", 4000)
        run("scan", self.dir, check=0)
        self.assertEqual(meta(self.dir)["model"]["training"]["checkpoints"], {})
        self.ckpt("train/model.ckpt-100.data-00001-of-00002", 4000)
        run("scan", self.dir, check=0)
        t = validate_tree(self.dir)["model"]["training"]
        c = t["checkpoints"]["model.ckpt-100"]
        self.assertEqual(c["epoch"], 100)
        self.assertEqual(c["path"], "data/checkpoints/model.ckpt-100.md5sums")
        # the manifest is md5sum's format and checks out with md5sum itself
        ck = os.path.join(self.dir, "data", "checkpoints")
        r = subprocess.run(["md5sum", "-c", "model.ckpt-100.md5sums"], cwd=ck,
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.count(": OK"), 3)

    def test_folder_checkpoint_needs_its_marker(self):
        self.ckpt("out/checkpoint-500/model.safetensors", 3000)
        self.ckpt("out/checkpoint-500/optimizer.pt", 3000)
        run("scan", self.dir, check=0)
        self.assertEqual(meta(self.dir)["model"]["training"]["checkpoints"], {})
        self.ckpt("out/checkpoint-500/trainer_state.json", 100)
        run("scan", self.dir, check=0)
        t = validate_tree(self.dir)["model"]["training"]
        self.assertEqual(list(t["checkpoints"]), ["checkpoint-500"])
        ck = os.path.join(self.dir, "data", "checkpoints")
        r = subprocess.run(["md5sum", "-c", "checkpoint-500.md5sums"], cwd=ck,
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.count(": OK"), 3)

    def test_temporary_and_young_files_wait(self):
        self.ckpt("epoch_1.pt.tmp")
        self.ckpt("epoch_2.pt", age=0)  # just written: may still be growing
        run("scan", self.dir, check=0)
        self.assertEqual(meta(self.dir)["model"]["training"]["checkpoints"], {})
        run("scan", "--min-age", "0", self.dir, check=0)
        self.assertEqual(list(meta(self.dir)["model"]["training"]["checkpoints"]), ["epoch_2.pt"])

    def test_finished_and_failed(self):
        self.ckpt("epoch_1.pt")
        run("scan", self.dir, check=0)
        run("scan", "--finished", self.dir, check=0)
        t = validate_tree(self.dir)["model"]["training"]
        self.assertEqual(t["status"], "finished")
        self.assertEqual(t["end_epoch"], 1)
        self.assertIsNotNone(t["end_time"])
        before = tree_bytes(self.dir)
        p = run("scan", "--failed", self.dir, check=1)
        self.assertIn("already ended as finished", p.stderr)
        self.assertEqual(tree_bytes(self.dir), before)

    def test_pending_cannot_finish(self):
        p = run("scan", "--finished", self.dir, check=1)
        self.assertIn("pending -> finished", p.stderr)
        self.assertEqual(validate_tree(self.dir)["model"]["training"]["status"], "pending")
        run("scan", "--failed", self.dir, check=0)  # allowed by PMF
        self.assertEqual(validate_tree(self.dir)["model"]["training"]["status"], "failed")

    def test_marker_file_ends_training(self):
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write("training:\n  finished_marker: DONE\n")
        self.ckpt("epoch_1.pt")
        run("scan", self.dir, check=0)
        self.assertEqual(meta(self.dir)["model"]["training"]["status"], "running")
        open(os.path.join(self.dir, "DONE"), "w").close()
        run("scan", self.dir, check=0)
        self.assertEqual(validate_tree(self.dir)["model"]["training"]["status"], "finished")

    def test_config_placed_and_initialisation(self):
        os.makedirs(os.path.join(self.dir, "conf"))
        with open(os.path.join(self.dir, "conf", "train.yaml"), "w") as f:
            f.write("epochs: 3\n")
        write_old(os.path.join(self.dir, "pretrained.h5"), b"weights" * 100)
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write("model:\n  name: resnet\n  configuration: conf/train.yaml\n"
                    "  initialisation: {file: pretrained.h5, name: imagenet}\n"
                    "  build_parameters: {n_classes: 10}\n")
        self.ckpt("epoch_1.pt")
        run("scan", self.dir, check=0)
        m = validate_tree(self.dir)
        self.assertEqual(m["model"]["name"], "resnet")
        self.assertEqual(m["model"]["configuration"]["path"], "train.yaml")
        self.assertEqual(m["model"]["initialisation"]["file"]["name"], "imagenet")
        self.assertEqual(m["model"]["initialisation"]["file"]["path"], "data/initialisation/pretrained.h5")
        with open(os.path.join(self.dir, "data", "build_parameters.yaml")) as f:
            bp = yaml.safe_load(f)
        self.assertEqual(bp["n_classes"], 10)
        self.assertEqual(bp["ckptd"]["checkpoints"]["epoch_1.pt"]["size"], 50000)

    def test_pmf_initialisation_from_golden_tree(self):
        golden = shared("pmf", "plums_golden")
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write(f"model:\n  initialisation: {{pmf: {golden}, checkpoint: '2'}}\n")
        self.ckpt("epoch_1.pt")
        run("scan", self.dir, check=0)
        m = validate_tree(self.dir)
        init = m["model"]["initialisation"]["pmf"]
        self.assertEqual(init["id"], "abc123")
        self.assertEqual(init["checkpoint"], 2)  # an int there, so an int here
        self.assertFalse(os.path.exists(os.path.join(self.dir, "data", "initialisation", "data", "checkpoints")))

    def test_extends_a_tree_the_reference_wrote(self):
        golden = shared("pmf", "plums_golden")
        d = os.path.join(self.dir, "m")
        shutil.copytree(golden, d)
        # the reference's run had finished; reopen a copy that is still running
        with open(os.path.join(d, "metadata.yaml")) as f:
            m = yaml.safe_load(f)
        t = m["model"]["training"]
        t["status"], t["end_time"], t["end_epoch"] = "running", None, None
        with open(os.path.join(d, "metadata.yaml"), "w") as f:
            yaml.safe_dump(m, f)
        write_old(os.path.join(d, "epoch_3.bin"), b"x" * 1000)
        run("scan", d, check=0)
        m2 = validate_tree(d)
        c = m2["model"]["training"]["checkpoints"]
        self.assertEqual(list(c), ["epoch_1", 2, "epoch_3.bin"])
        self.assertEqual(c[2]["hash"], "437b25ad27df2f61eb14c6400ae98309")
        self.assertEqual(m2["format"]["producer"]["name"], "my_producer")
        self.assertEqual(m2["model"]["id"], "abc123")
        self.assertEqual(m2["model"]["training"]["latest"], "epoch_3.bin")

    def test_reference_that_looks_like_a_number_stays_a_string(self):
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write("checkpoints:\n  patterns: ['{epoch}']\n")
        self.ckpt("12")
        run("scan", self.dir, check=0)
        t = validate_tree(self.dir)["model"]["training"]
        self.assertEqual(list(t["checkpoints"]), ["12"])
        self.assertEqual(t["latest"], "12")

    def test_uploads_and_their_events(self):
        remote = os.path.join(self.dir, ".ckptd", "remote")
        events = os.path.join(self.dir, ".ckptd", "events")  # one file per event
        os.makedirs(events)
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write(f"upload:\n  stores:\n    - url: file://{remote}\n"
                    f"hooks:\n  exec:\n    - event: upload.*\n"
                    f"      command: \"cat > {events}/$$.json\"\n")
        self.ckpt("epoch_1.pt")
        self.ckpt("epoch_2.pt")
        run("scan", self.dir, check=0)
        with open(os.path.join(self.dir, "metadata.yaml"), "rb") as a, \
                open(os.path.join(remote, "metadata.yaml"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        for e in (1, 2):
            self.assertEqual(md5_file(os.path.join(remote, "data", "checkpoints", f"epoch_{e}.pt")),
                             md5_file(os.path.join(self.dir, "epoch_" + str(e) + ".pt")))
        got = []
        for name in os.listdir(events):
            with open(os.path.join(events, name)) as f:
                got.append(json.load(f))
        keys = sorted(e["data"]["upload"]["url"] for e in got if e["type"] == "upload.completed")
        self.assertTrue(any(k.endswith("metadata.yaml") for k in keys), keys)
        self.assertTrue(any(k.endswith("data/checkpoints/epoch_2.pt") for k in keys), keys)
        # each event says which check of the stored copy ran (a file store reads it back)
        checks = {e["data"]["upload"]["check"] for e in got if e["type"] == "upload.completed"}
        self.assertEqual(checks, {"read-back-sha256"})

    def test_status_finished_without_a_watcher_hands_on_like_a_pass(self):
        # `status --finished` with no watcher runs the pass's pipeline: the
        # training.finished event fires and the tree is uploaded, no scan needed
        remote = os.path.join(self.dir, ".ckptd", "remote")
        events = os.path.join(self.dir, ".ckptd", "events")  # one file per event
        os.makedirs(events)
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write(f"upload:\n  stores:\n    - url: file://{remote}\n"
                    f"hooks:\n  exec:\n    - event: \"*\"\n"
                    f"      command: \"cat > {events}/$$.json\"\n")
        self.ckpt("epoch_1.pt")
        run("status", self.dir, "--finished", check=0)
        got = []
        for name in os.listdir(events):
            with open(os.path.join(events, name)) as f:
                got.append(json.load(f))
        types = sorted(e["type"] for e in got)
        self.assertIn("training.finished", types)
        self.assertIn("checkpoint.registered", types)
        self.assertIn("upload.completed", types)
        finished = next(e for e in got if e["type"] == "training.finished")
        self.assertEqual(finished["data"]["model"]["name"], os.path.basename(self.dir))
        self.assertEqual(meta(self.dir)["model"]["training"]["status"], "finished")
        with open(os.path.join(self.dir, "metadata.yaml"), "rb") as a, \
                open(os.path.join(remote, "metadata.yaml"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        self.assertEqual(md5_file(os.path.join(remote, "data", "checkpoints", "epoch_1.pt")),
                         md5_file(os.path.join(self.dir, "epoch_1.pt")))

    def test_mirror_deletes(self):
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write("checkpoints:\n  mirror_deletes: true\n")
        self.ckpt("ck/epoch_1.pt")
        self.ckpt("ck/epoch_2.pt")
        run("scan", self.dir, check=0)
        os.unlink(os.path.join(self.dir, "ck", "epoch_2.pt"))
        run("scan", self.dir, check=0)
        t = validate_tree(self.dir)["model"]["training"]
        self.assertEqual(list(t["checkpoints"]), ["epoch_1.pt"])
        self.assertEqual(t["latest"], "epoch_1.pt")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "data", "checkpoints", "epoch_2.pt")))


class BadInput(TmpDirCase):
    def ckpt(self, rel, size=1000):
        write_old(os.path.join(self.dir, rel), os.urandom(size))

    def test_metadata_not_yaml_is_untouched(self):
        path = os.path.join(self.dir, "metadata.yaml")
        text = b"format:\n  version: '1.0.0'\nmodel: [unclosed\n  name: x\n"
        with open(path, "wb") as f:
            f.write(text)
        self.ckpt("epoch_1.pt")
        p = run("scan", self.dir, check=1)
        self.assertIn("metadata.yaml' line", p.stderr)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), text)

    def test_metadata_not_pmf_is_untouched(self):
        run("scan", self.dir, check=0)
        path = os.path.join(self.dir, "metadata.yaml")
        with open(path) as f:
            lines = f.read().splitlines(True)
        # an extra key inside model: the reference validator rejects it
        i = next(i for i, l in enumerate(lines) if l.startswith("  id:"))
        lines.insert(i + 1, "  sha256: abc\n")
        with open(path, "w") as f:
            f.writelines(lines)
        before = open(path, "rb").read()
        self.ckpt("epoch_1.pt")
        p = run("scan", self.dir, check=1)
        self.assertIn(f"line {i + 2}", p.stderr)
        self.assertIn("sha256", p.stderr)
        self.assertEqual(open(path, "rb").read(), before)

    def test_checkpoints_null_and_uppercase_md5_are_refused(self):
        run("scan", self.dir, check=0)
        path = os.path.join(self.dir, "metadata.yaml")
        good = open(path).read()
        bad = good.replace("checkpoints: {}", "checkpoints: null")
        open(path, "w").write(bad)
        p = run("scan", self.dir, check=1)
        self.assertIn("not null", p.stderr)
        h = yaml.safe_load(good)["model"]["configuration"]["hash"]
        open(path, "w").write(good.replace(h, h.upper()))
        p = run("scan", self.dir, check=1)
        self.assertIn("lower-case hex MD5", p.stderr)

    def test_symlink_out_of_tree(self):
        self.ckpt("epoch_1.pt")
        os.symlink("/etc/passwd", os.path.join(self.dir, "epoch_2.pt"))
        p = run("scan", self.dir, check=1)
        self.assertIn("epoch_2.pt", p.stderr)
        self.assertIn("outside", p.stderr)
        t = validate_tree(self.dir)["model"]["training"]
        self.assertEqual(list(t["checkpoints"]), ["epoch_1.pt"])

    def test_name_not_utf8(self):
        self.ckpt("epoch_1.pt")
        bad = os.path.join(os.fsencode(self.dir), b"run\xff_epoch_2.pt")
        with open(bad, "wb") as f:
            f.write(b"x")
        os.utime(bad, (time.time() - 60, time.time() - 60))
        p = run("scan", self.dir, check=1)
        self.assertIn("run\\xff_epoch_2.pt", p.stderr)
        self.assertIn("UTF-8", p.stderr)
        self.assertEqual(list(validate_tree(self.dir)["model"]["training"]["checkpoints"]), ["epoch_1.pt"])

    def test_folder_with_a_name_not_utf8(self):
        self.ckpt("out/checkpoint-10/model.safetensors")
        self.ckpt("out/checkpoint-10/trainer_state.json")
        bad = os.path.join(os.fsencode(self.dir), b"out/checkpoint-10/rng\xfe.pth")
        with open(bad, "wb") as f:
            f.write(b"x")
        os.utime(bad, (time.time() - 60, time.time() - 60))
        self.ckpt("out/checkpoint-20/model.safetensors")
        self.ckpt("out/checkpoint-20/trainer_state.json")
        p = run("scan", self.dir, check=1)
        self.assertIn("rng\\xfe.pth", p.stderr)
        self.assertEqual(list(validate_tree(self.dir)["model"]["training"]["checkpoints"]),
                         ["checkpoint-20"])

    def test_unreadable_checkpoint(self):
        # root reads everything: run ckptd as nobody over a folder nobody owns
        if os.getuid() != 0 or not shutil.which("setpriv"):
            raise unittest.SkipTest("needs root and setpriv to drop privileges")
        self.ckpt("epoch_1.pt")
        self.ckpt("epoch_2.pt")
        os.chmod(self.dir, 0o755)
        for root, dirs, files in os.walk(self.dir):
            for x in dirs + files:
                os.chown(os.path.join(root, x), 65534, 65534)
        os.chown(self.dir, 65534, 65534)
        os.chown(os.path.join(self.dir, "epoch_2.pt"), 0, 0)
        os.chmod(os.path.join(self.dir, "epoch_2.pt"), 0o600)
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            CKPTD, "scan", self.dir], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("epoch_2.pt", p.stderr)
        self.assertIn("Permission denied", p.stderr)
        self.assertEqual(list(validate_tree(self.dir)["model"]["training"]["checkpoints"]), ["epoch_1.pt"])

    def test_checkpoint_changing_while_hashed(self):
        path = os.path.join(self.dir, "epoch_1.pt")
        stop = threading.Event()

        def grow():
            with open(path, "ab") as f:
                while not stop.is_set():
                    f.write(os.urandom(1 << 20))
                    f.flush()
                    time.sleep(0.002)
        with open(path, "wb") as f:
            f.write(os.urandom(64 << 20))
        t = threading.Thread(target=grow)
        t.start()
        try:
            p = run("scan", "--min-age", "0", self.dir)
        finally:
            stop.set()
            t.join()
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("changed while it was hashed", p.stderr)
        self.assertEqual(validate_tree(self.dir)["model"]["training"]["checkpoints"], {})
        run("scan", "--min-age", "0", self.dir, check=0)
        c = validate_tree(self.dir)["model"]["training"]["checkpoints"]
        self.assertEqual(c["epoch_1.pt"]["hash"], md5_file(path))

    def test_full_disk_keeps_old_metadata(self):
        if os.getuid() != 0:
            raise unittest.SkipTest("needs root to mount a small tmpfs")
        mnt = os.path.join(self.dir, "small")
        os.mkdir(mnt)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", mnt]).returncode != 0:
            raise unittest.SkipTest("cannot mount a tmpfs here")
        try:
            write_old(os.path.join(mnt, "epoch_1.pt"), b"a" * 1000)
            run("scan", mnt, check=0)
            before = open(os.path.join(mnt, "metadata.yaml"), "rb").read()
            # fill the disk, then a new checkpoint needs a bigger metadata.yaml
            try:
                with open(os.path.join(mnt, "filler"), "wb") as f:
                    while True:
                        f.write(b"\0" * 4096)
                        f.flush()
            except OSError:
                pass
            write_old(os.path.join(mnt, "epoch_2.pt"), b"")  # an empty file still fits
            p = run("scan", mnt, check=1)
            self.assertIn("No space left on device", p.stderr)
            self.assertEqual(open(os.path.join(mnt, "metadata.yaml"), "rb").read(), before)
            validate_tree(mnt)
            leftovers = [n for n in os.listdir(mnt) if n.endswith(".tmp")]
            self.assertEqual(leftovers, [])
            os.unlink(os.path.join(mnt, "filler"))
            run("scan", mnt, check=0)
            self.assertEqual(list(validate_tree(mnt)["model"]["training"]["checkpoints"]),
                             ["epoch_1.pt", "epoch_2.pt"])
        finally:
            subprocess.run(["umount", "-l", mnt])

    def test_other_filesystem_is_copied(self):
        # a checkpoint folder on another filesystem: no hard link across devices
        if os.getuid() != 0:
            raise unittest.SkipTest("needs root to mount a tmpfs")
        mnt = os.path.join(self.dir, "ckpts")
        os.mkdir(mnt)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", mnt]).returncode != 0:
            raise unittest.SkipTest("cannot mount a tmpfs here")
        try:
            data = os.urandom(300000)
            write_old(os.path.join(mnt, "epoch_1.pt"), data)
            run("scan", self.dir, check=0)
            c = validate_tree(self.dir)["model"]["training"]["checkpoints"]["epoch_1.pt"]
            placed = os.path.join(self.dir, c["path"])
            self.assertNotEqual(os.stat(placed).st_dev, os.stat(mnt + "/epoch_1.pt").st_dev)
            with open(placed, "rb") as f:
                self.assertEqual(f.read(), data)
        finally:
            subprocess.run(["umount", "-l", mnt])

    def test_kill_9_never_tears_metadata(self):
        rng = random.Random(1234)
        for i in range(25):
            write_old(os.path.join(self.dir, f"epoch_{i}.pt"), os.urandom(rng.randint(1, 3 << 20)))
            p = subprocess.Popen([CKPTD, "scan", self.dir], stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0, 0.03))
            p.send_signal(signal.SIGKILL)
            p.wait()
            path = os.path.join(self.dir, "metadata.yaml")
            if os.path.exists(path):
                with open(path) as f:
                    validate_metadata(yaml.safe_load(f))
        run("scan", self.dir, check=0)
        t = validate_tree(self.dir)["model"]["training"]
        self.assertEqual(len(t["checkpoints"]), 25)

    def test_lock_held(self):
        os.makedirs(os.path.join(self.dir, ".ckptd"))
        with open(os.path.join(self.dir, ".ckptd", "lock"), "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write("4242\n")
            f.flush()
            p = run("scan", self.dir, check=3)
        self.assertIn("another ckptd (pid 4242)", p.stderr)

    def test_config_errors_name_key_and_line(self):
        cfg = os.path.join(self.dir, "ckptd.yaml")
        open(cfg, "w").write("model:\n  name: x\n  colour: blue\n")
        p = run("scan", self.dir, check=2)
        self.assertIn("line 3", p.stderr)
        self.assertIn("model.colour", p.stderr)
        open(cfg, "w").write("checkpoints:\n  steps_per_epoch: many\n")
        p = run("scan", self.dir, check=2)
        self.assertIn("line 2", p.stderr)
        self.assertIn("whole number", p.stderr)
        open(cfg, "w").write("checkpoints:\n  patterns: ['best.pt']\n")
        p = run("scan", self.dir, check=2)
        self.assertIn("neither {epoch} nor {step}", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "metadata.yaml")))

    def test_usage_errors(self):
        self.assertEqual(run("scan").returncode, 2)
        self.assertEqual(run("scan", "--finished", "--failed", self.dir).returncode, 2)
        self.assertEqual(run("scan", os.path.join(self.dir, "nope")).returncode, 2)
        self.assertEqual(run("frobnicate").returncode, 2)
        self.assertEqual(run("scan", "--help").returncode, 0)
        self.assertIn("ckptd", run("--version").stdout)

    def test_options_go_before_or_after_the_operands(self):
        """Every command takes its options on either side of its operands,
        as getopt's users expect (config and scan took them only before)."""
        model = os.path.join(self.dir, "m.npy")
        import numpy as np
        np.save(model, np.zeros(2, np.float32))
        cases = [("config", [self.dir], ["-v"]), ("scan", [self.dir], ["-q"]),
                 ("status", [self.dir], ["--json"]), ("inspect", [model], ["--json"]),
                 ("queue", [self.dir], ["--json"])]
        for cmd, operands, opts in cases:
            for args in (opts + operands, operands + opts):
                with self.subTest(cmd=cmd, args=args):
                    p = run(cmd, *args)
                    self.assertEqual(p.returncode, 0, p.stderr)


if __name__ == "__main__":
    unittest.main()
