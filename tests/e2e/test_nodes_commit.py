"""Multi-node training (issue 34, docs/multinode.md): `ckptd scan` on each of
4 nodes of one machine (one folder each, DeepSpeed-like zero_pp_rank_R
shards of the same steps), one shared store. A step enters the store's
metadata.yaml only once every node's part is in; its .md5sums then covers
every node's shards; the store's tree is valid PMF (tests/lib/pmf_validate.py,
written from the reference validator's rules, not ckptd's parser).

Expected values come from the test's own files (hashlib) and PyYAML, never
from ckptd's output."""
import hashlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
import unittest
import urllib.request

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, terminate, write_old  # noqa: E402
from pmf_validate import Invalid, validate_tree  # noqa: E402
from servers import RgwServer, S3Server  # noqa: E402

LAUNCHER_VARS = ("SLURM_NODEID", "SLURM_NNODES", "PET_NODE_RANK", "PET_NNODES", "GROUP_RANK",
                 "NNODES", "JOB_COMPLETION_INDEX", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS")
NODES = 4
STEPS = (100, 200, 300)


def md5(data):
    return hashlib.md5(data).hexdigest()


class Nodes:
    """Four node folders and a shared store, as a mixin over a store kind:
    the subclass sets store_config(prefix) and fetch_tree(prefix, dest)."""

    count = NODES  # the watchers' cases run with 16 too

    def make_nodes(self, steps_of=None, extra=None):
        """Node r's folder holds its shards of each step in steps_of(r)
        (default: every step) and DeepSpeed's 'latest' (node-local storage:
        each node's local rank 0 writes it). Returns {step: {path: bytes}}
        of every file written, paths relative to data/checkpoints."""
        self.nodes = []
        files = {}
        for r in range(self.count):
            d = os.path.join(self.dir, f"node{r}")
            os.makedirs(d)
            self.nodes.append(d)
            steps = steps_of(r) if steps_of else STEPS
            for s in steps:
                for kind in ("optim_states", "model_states"):
                    rel = f"global_step{s}/zero_pp_rank_{r}_mp_rank_00_{kind}.pt"
                    data = os.urandom(1000 + 97 * r + s) + f"{r}/{s}/{kind}".encode()
                    write_old(os.path.join(d, rel), data)
                    files.setdefault(s, {})[rel] = data
            for rel, data in (extra(r) if extra else {}).items():
                write_old(os.path.join(d, rel), data)
            write_old(os.path.join(d, "latest"), f"global_step{max(steps)}".encode())
        return files

    def configure(self, prefix, hooks=""):
        for d in self.nodes:
            with open(os.path.join(d, "ckptd.yaml"), "w") as f:
                f.write(self.store_config(prefix) + hooks)

    def scan(self, rank, wait=True, flags=()):
        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
        env.update(self.store_env())
        env.update(SLURM_NODEID=str(rank), SLURM_NNODES=str(self.count))
        p = subprocess.Popen([CKPTD, "scan", *flags, self.nodes[rank]], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if not wait:
            return p
        out, err = p.communicate(timeout=120)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def tree(self, prefix):
        dest = os.path.join(self.dir, "fetched-" + prefix.replace("/", "-"))
        shutil.rmtree(dest, ignore_errors=True)
        self.fetch_tree(prefix, dest)
        return dest

    def listed(self, prefix):
        """The steps the store's metadata.yaml lists ({} when it has none)."""
        text = self.fetch_meta(prefix)
        if text is None:
            return {}
        return yaml.safe_load(text)["model"]["training"]["checkpoints"]

    def check_committed(self, prefix, files, steps):
        """The store's tree lists exactly steps, each once, with every node's
        shards in its .md5sums, and passes the PMF validator."""
        t = self.readable_tree(prefix)
        try:
            meta = validate_tree(t)
        except Invalid as e:
            self.fail(f"the store's tree is not valid PMF: {e}")
        ckpts = meta["model"]["training"]["checkpoints"]
        self.assertEqual(sorted(ckpts), sorted(f"global_step{s}" for s in steps))
        for s in steps:
            c = ckpts[f"global_step{s}"]
            self.assertEqual(c["path"], f"data/checkpoints/global_step{s}.md5sums")
            with open(os.path.join(t, c["path"]), "rb") as f:
                sums = f.read()
            self.assertEqual(md5(sums), c["hash"])
            want = "".join(f"{md5(files[s][p])}  {p}\n" for p in sorted(files[s]))
            self.assertEqual(sums.decode(), want)
            ranks = {re.search(r"zero_pp_rank_(\d+)_", p).group(1) for p in files[s]}
            self.assertEqual(len(ranks), self.count)  # every node's shards are in it
            for p, data in files[s].items():  # and the objects are those bytes
                with open(os.path.join(t, "data", "checkpoints", p), "rb") as f:
                    self.assertEqual(f.read(), data)
        return t

    def records(self, prefix):
        """{step: the commit record's bytes} as the store holds them."""
        t = self.tree(prefix)
        out = {}
        for s in STEPS:
            path = os.path.join(t, ".ckptd", "commits", f"global_step{s}.yaml")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    out[s] = f.read()
        return out

    # ---- the cases ----

    def test_a_step_is_listed_only_once_every_node_is_in_whatever_the_order(self):
        files = self.make_nodes()
        for n, order in enumerate(((0, 1, 2, 3), (3, 2, 1, 0), (2, 0, 3, 1))):
            with self.subTest(order=order):
                prefix = f"order{n}"
                self.configure(prefix)
                for i, r in enumerate(order):
                    p = self.scan(r)
                    self.assertEqual(p.returncode, 0, p.stderr)
                    self.assertIn(f"nodes.part_written", p.stderr)
                    if i < NODES - 1:
                        self.assertEqual(self.listed(prefix), {}, f"after nodes {order[:i + 1]}")
                        self.assertNotIn("nodes.committed", p.stderr)
                        self.assertIn("nodes.waiting", p.stderr)
                    else:
                        self.assertEqual(p.stderr.count("nodes.committed"), len(STEPS), p.stderr)
                t = self.check_committed(prefix, files, STEPS)
                # a later scan of any node changes nothing in the store
                before = self.objects(prefix)
                p = self.scan(order[0])
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertNotIn("nodes.committed", p.stderr)
                self.assertNotIn("nodes.metadata_written", p.stderr)
                self.assertEqual(before, self.objects(prefix))
        # the records are the same bytes whichever node committed (3, 0, then 1)
        recs = self.records("order0")
        self.assertEqual(sorted(recs), list(STEPS))
        self.assertEqual(recs, self.records("order1"))
        self.assertEqual(recs, self.records("order2"))
        rec = yaml.safe_load(recs[100])
        self.assertEqual([(f["path"], f["size"], f["md5"]) for f in rec["files"]],
                         [(p, len(files[100][p]), md5(files[100][p]))
                          for p in sorted(files[100])])
        t = self.tree("order0")
        for part in rec["parts"]:
            with open(os.path.join(t, ".ckptd", "parts", "global_step100",
                                   f"node-{part['rank']}-of-{NODES}.yaml"), "rb") as f:
                self.assertEqual(md5(f.read()), part["md5"])

    def test_a_step_missing_a_part_is_never_listed(self):
        # node 3 never writes step 300: 100 and 200 are committed, 300 never
        files = self.make_nodes(steps_of=lambda r: STEPS if r != 3 else STEPS[:2])
        self.configure("partial")
        for r in (3, 1, 0, 2):
            p = self.scan(r)
            self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("checkpoint='global_step300' missing_ranks=3", p.stderr)
        files[300] = {}
        self.check_committed("partial", files, STEPS[:2])
        for r in range(NODES):
            self.assertEqual(self.scan(r).returncode, 0)
        self.assertNotIn("global_step300", self.listed("partial"))

    def test_two_nodes_committing_at_once_both_succeed_with_the_same_record(self):
        files = self.make_nodes()
        self.configure("alone")
        for r in (0, 1, 2, 3):  # the reference: node 3 commits alone
            self.assertEqual(self.scan(r).returncode, 0)
        self.configure("race")
        for r in (0, 1):
            self.assertEqual(self.scan(r).returncode, 0)
        racers = [self.scan(r, wait=False) for r in (2, 3)]
        outs = [p.communicate(timeout=120) for p in racers]
        for p, (out, err) in zip(racers, outs):
            self.assertEqual(p.returncode, 0, err)
        self.check_committed("race", files, STEPS)
        alone = self.records("alone")
        self.assertEqual(sorted(alone), list(STEPS))
        self.assertEqual(self.records("race"), alone)
        # every step was committed by at least one of them; a step both
        # committed says which one found the record there
        logs = "".join(err for _, err in outs)
        for s in STEPS:
            self.assertIn(f"checkpoint='global_step{s}' nodes=4", logs)

    def test_every_node_at_once_commits_every_step(self):
        # the four scans start together on an empty store: each lists the
        # parts again after writing its own manifest, so the one whose
        # listing starts last sees all four and commits; every scan that
        # exits 0 read the store's metadata.yaml back with its steps
        files = self.make_nodes()
        self.configure("together")
        racers = [self.scan(r, wait=False) for r in range(NODES)]
        outs = [p.communicate(timeout=120) for p in racers]
        for p, (out, err) in zip(racers, outs):
            self.assertEqual(p.returncode, 0, err)
        self.check_committed("together", files, STEPS)
        logs = "".join(err for _, err in outs)
        for s in STEPS:
            self.assertIn(f"checkpoint='global_step{s}' nodes=4", logs)

    def test_a_node_part_needs_no_marker_the_step_waits_for_rank_0s(self):
        # torch DCP: every rank writes __R_0.distcp, rank 0 alone .metadata
        # once the save is over: nodes 1-3 have no marker of their own
        self.nodes, files = [], {}
        for r in range(NODES):
            d = os.path.join(self.dir, f"dcp{r}")
            self.nodes.append(d)
            for s in (100, 200):
                rel = f"step_{s}/__{r}_0.distcp"
                data = os.urandom(800 + r) + f"{r}/{s}".encode()
                write_old(os.path.join(d, rel), data)
                files.setdefault(s, {})[rel] = data
        self.configure("dcp")
        for r in (1, 2, 3):
            p = self.scan(r)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("checkpoint='step_100' missing_ranks=0", p.stderr)
        p = self.scan(0)  # no .metadata yet: rank 0's part is not complete
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("nodes.part_written", p.stderr)
        self.assertEqual(self.listed("dcp"), {})
        for s in (100, 200):
            rel = f"step_{s}/.metadata"
            data = f"dcp metadata of step {s}".encode()
            write_old(os.path.join(self.nodes[0], rel), data)
            files[s][rel] = data
        p = self.scan(0)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr.count("nodes.committed"), 2, p.stderr)
        t = self.tree("dcp")
        meta = validate_tree(t)
        self.assertEqual(sorted(meta["model"]["training"]["checkpoints"]), ["step_100", "step_200"])
        for s in (100, 200):
            with open(os.path.join(t, "data", "checkpoints", f"step_{s}.md5sums")) as f:
                self.assertEqual(f.read(), "".join(f"{md5(files[s][p])}  {p}\n"
                                                   for p in sorted(files[s])))

    def test_a_node_restarted_with_an_empty_disk_resumes_from_the_store(self):
        files = self.make_nodes()
        self.configure("wiped")
        for r in range(NODES):
            self.assertEqual(self.scan(r).returncode, 0)
        before = yaml.safe_load(self.fetch_meta("wiped"))["model"]
        # nodes 0 and 2 lose their disks: state, tree and shards; the job
        # resumes and every node writes step 400
        for r in (0, 2):
            shutil.rmtree(self.nodes[r])
            os.makedirs(self.nodes[r])
        self.configure("wiped")
        for r in range(NODES):
            for kind in ("optim_states", "model_states"):
                rel = f"global_step400/zero_pp_rank_{r}_mp_rank_00_{kind}.pt"
                data = os.urandom(1500 + r) + f"{r}/400/{kind}".encode()
                write_old(os.path.join(self.nodes[r], rel), data)
                files.setdefault(400, {})[rel] = data
            write_old(os.path.join(self.nodes[r], "latest"), b"global_step400")
        for r in (3, 2, 1):
            p = self.scan(r)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertNotIn("nodes.part_conflict", p.stderr)
        p = self.scan(0)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(f"nodes.identity_adopted: store=", p.stderr)
        self.assertIn(f"model_id={before['id']}", p.stderr)
        self.assertIn("checkpoint='global_step400' nodes=4", p.stderr)
        # the store's tree: the same model, every step, old and new
        t = self.check_committed("wiped", files, STEPS + (400,))
        with open(os.path.join(t, "metadata.yaml")) as f:
            after = yaml.safe_load(f)["model"]
        self.assertEqual((after["id"], after["name"]), (before["id"], before["name"]))
        self.assertEqual(after["training"]["start_epoch"], before["training"]["start_epoch"])
        # and node 0's own tree names it too; its next scan adopts nothing
        with open(os.path.join(self.nodes[0], "metadata.yaml")) as f:
            self.assertEqual(yaml.safe_load(f)["model"]["id"], before["id"])
        p = self.scan(0)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("nodes.identity_adopted", p.stderr)
        self.assertNotIn("nodes.committed", p.stderr)
        # a model record rank 0 cannot read: its own is held back (exit 1),
        # and the store's identity is not replaced
        self.put_object("wiped", ".ckptd/model.yaml", b"model: [not pmf\n")
        shutil.rmtree(self.nodes[0])
        os.makedirs(self.nodes[0])
        self.configure("wiped")
        write_old(os.path.join(self.nodes[0], "global_step400",
                               "zero_pp_rank_0_mp_rank_00_model_states.pt"), b"again")
        write_old(os.path.join(self.nodes[0], "latest"), b"global_step400")
        p = self.scan(0)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("nodes.identity_unknown", p.stderr)
        self.assertIn(".ckptd/model.yaml", p.stderr)
        self.assertNotIn("nodes.part_written", p.stderr)
        self.assertEqual(yaml.safe_load(self.fetch_meta("wiped"))["model"]["id"], before["id"])
        self.assertEqual(self.fetch_object("wiped", ".ckptd/model.yaml"), b"model: [not pmf\n")

    def store_status(self, prefix):
        text = self.fetch_meta(prefix)
        return yaml.safe_load(text)["model"]["training"]["status"] if text else None

    def test_training_status_across_nodes(self):
        files = self.make_nodes()
        # a node other than rank 0 finished: the store's training is not
        self.configure("other")
        for r in (1, 2, 3):
            self.assertEqual(self.scan(r, flags=["--finished"] if r == 2 else []).returncode, 0)
        self.assertEqual(self.scan(0).returncode, 0)
        self.assertEqual(self.store_status("other"), "running")
        # finished: rank 0's training finished, and every step of its is committed
        self.configure("finish")
        for r in (1, 2):
            self.assertEqual(self.scan(r).returncode, 0)
        p = self.scan(0, flags=["--finished"])  # before node 3: nothing is committed
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("nodes.status_written", p.stderr)
        p = self.scan(3)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.store_status("finish"), "running")  # rank 0 has not said so here
        p = self.scan(0)  # its steps are committed now: its finished status goes
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("nodes.status_written", p.stderr)
        self.assertEqual(self.store_status("finish"), "finished")
        self.check_committed("finish", files, STEPS)  # valid PMF: finished, with its end
        # failed: any node's training failed, whoever writes metadata.yaml next
        self.configure("fail")
        for r in (0, 1, 2, 3):
            self.assertEqual(self.scan(r).returncode, 0)
        self.assertEqual(self.store_status("fail"), "running")  # node 0 came before the commit
        self.assertEqual(self.scan(0).returncode, 0)
        self.assertEqual(self.store_status("fail"), "finished")  # and says so on its next scan
        shutil.rmtree(os.path.join(self.nodes[1], ".ckptd"))  # node 1 starts again
        os.remove(os.path.join(self.nodes[1], "metadata.yaml"))
        p = self.scan(1, flags=["--failed"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.store_status("fail"), "failed")
        t = self.check_committed("fail", files, STEPS)
        with open(os.path.join(t, "metadata.yaml")) as f:
            training = yaml.safe_load(f)["model"]["training"]
        self.assertEqual(training["end_epoch"], training["latest_epoch"])
        # a status record that is not one is left out, said, and changes nothing
        self.put_object("fail", ".ckptd/nodes/node-3-of-4.yaml", b"training: failed\nrm -rf /\n")
        p = self.scan(3)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("nodes.status_unreadable", p.stderr)
        self.assertEqual(self.store_status("fail"), "failed")

    def test_a_conflicting_part_is_not_committed_and_said_so(self):
        # nodes 1 and 2 both hold step 200's mp_rank_00_model_states.pt, with other bytes
        shared = "global_step200/mp_rank_00_model_states.pt"
        files = self.make_nodes(extra=lambda r: {shared: f"node {r}".encode()} if r in (1, 2)
                                else {})
        self.configure("conflict")
        for r in (0, 1, 2):
            self.assertEqual(self.scan(r).returncode, 0)
        p = self.scan(3)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("nodes.part_conflict", p.stderr)
        self.assertIn(f"'{shared}' is listed by node 1", p.stderr)
        self.assertIn("and by node 2", p.stderr)
        self.assertIn("step(s) not committed across nodes", p.stderr)
        # the other steps are committed; 200 is not listed and has no record
        self.check_committed("conflict", files, (100, 300))
        self.assertEqual(sorted(self.records("conflict")), [100, 300])


class Watcher:
    """`ckptd watch --listen` of one node folder, its log in a file."""

    def __init__(self, case, rank):
        with socket.socket() as so:
            so.bind(("127.0.0.1", 0))
            self.port = so.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
        env.update(case.store_env())
        env.update(SLURM_NODEID=str(rank), SLURM_NNODES=str(case.count))
        self.log_path = os.path.join(case.dir, f"watch-{rank}.log")
        self.log = open(self.log_path, "a+")  # a restarted node's log goes on
        self.p = subprocess.Popen([CKPTD, "watch", "--listen", f"127.0.0.1:{self.port}",
                                   case.nodes[rank]], env=env, stdout=self.log,
                                  stderr=subprocess.STDOUT)
        case.addCleanup(self.stop)

    def gauge(self, name):
        """The sample's value on /metrics, None when it cannot be read."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        return float(m.group(1)) if m else None

    def text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        """SIGTERM; the exit code."""
        terminate(self.p)
        if not self.log.closed:
            self.log.close()
        return self.p.returncode


class Watchers:
    """`ckptd watch` on each node instead of `ckptd scan`: each uploads its
    part as its folder gets it, the node that completes a step commits it,
    the others find the commit when they look again (1 s to 60 s apart)."""

    WAIT = 120

    def until(self, what, check, watchers):
        end = time.monotonic() + self.WAIT
        while time.monotonic() < end:
            got = check()
            if got:
                return got
            for w in watchers:
                self.assertIsNone(w.p.poll(), f"a watcher exited while waiting for {what}:\n"
                                  + w.text()[-4000:])
            time.sleep(0.25)
        self.fail(f"never {what}:\n" + "\n----\n".join(w.text()[-3000:] for w in watchers))

    def status(self, rank):
        p = subprocess.run([CKPTD, "status", "--json", self.nodes[rank]], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        return json.loads(p.stdout)

    def committed_lines(self):
        path = os.path.join(self.dir, "committed.txt")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return f.read().split()

    def test_watchers_commit_each_step_once_the_last_node_is_in(self):
        self.watchers_commit()

    def test_sixteen_watchers_commit_each_step_once_the_last_node_is_in(self):
        self.count = 16
        self.watchers_commit()

    def watchers_commit(self):
        files = self.make_nodes()
        prefix = "watch"
        self.configure(prefix, hooks=(
            "hooks:\n  exec:\n    - event: checkpoint.committed\n"
            f"      command: \"echo $CKPTD_CHECKPOINT >> {self.dir}/committed.txt\"\n"))
        ws = [Watcher(self, r) for r in range(self.count - 1)]
        # every node but the last uploads its parts and waits for the last one's
        def parts_in():
            keys = {k[len(prefix) + 1:] if k.startswith(prefix + "/") else k
                    for k in self.objects(prefix)}  # S3's keys carry the prefix
            return all(f".ckptd/parts/global_step{s}/node-{r}-of-{self.count}.yaml" in keys
                       for s in STEPS for r in range(self.count - 1))
        self.until("the parts of every node but the last stored", parts_in, ws)
        self.until("node 0 showing what it waits for", lambda: sorted(
            (x["checkpoint"], x["missing_ranks"]) for x in self.status(0)["nodes_waiting"]) ==
            [(f"global_step{s}", [self.count - 1]) for s in STEPS], ws)
        self.until("ckptd_nodes_parts_missing at 3 (a part of each step) on node 1",
                   lambda: ws[1].gauge("ckptd_nodes_parts_missing") == 3, ws)
        self.assertEqual(self.listed(prefix), {})
        self.assertEqual(self.committed_lines(), [])
        for w in ws:
            self.assertNotIn("nodes.committed", w.text())
        # the last node comes: the step set is complete, listed once, every shard in
        ws.append(Watcher(self, self.count - 1))
        self.until("every step listed", lambda: sorted(self.listed(prefix)) ==
                   sorted(f"global_step{s}" for s in STEPS), ws)
        self.check_committed(prefix, files, STEPS)
        # checkpoint.committed once per step, by its committer (a store that
        # ignores If-None-Match may let two nodes both create a record)
        self.until("a checkpoint.committed per step", lambda: sorted(set(
            self.committed_lines())) == sorted(f"global_step{s}" for s in STEPS), ws)
        if self.honours_if_none_match:
            time.sleep(2)  # a second event would come from another node's look
            self.assertEqual(sorted(self.committed_lines()),
                             sorted(f"global_step{s}" for s in STEPS))
        # the records created, counted where they were created
        created = [w.gauge("ckptd_nodes_steps_committed_total") for w in ws]
        if self.honours_if_none_match:
            self.assertEqual(sum(created), len(STEPS), created)
        else:
            self.assertGreaterEqual(sum(created), len(STEPS), created)
        # the nodes that waited look again, find the commits, stop waiting
        for r in range(self.count - 1):
            self.until(f"node {r} waiting for nothing", lambda: self.status(r)["nodes_waiting"]
                       == [] and ws[r].gauge("ckptd_nodes_parts_missing") == 0, ws)
        # a new step while they run: committed by whichever node completes it
        for r in range(self.count):
            rel = f"global_step400/zero_pp_rank_{r}_mp_rank_00_model_states.pt"
            data = os.urandom(3000 + r)
            write_old(os.path.join(self.nodes[r], rel), data, age=0)
            files.setdefault(400, {})[rel] = data
            write_old(os.path.join(self.nodes[r], "latest"), b"global_step400", age=0)
        self.until("step 400 listed", lambda: "global_step400" in self.listed(prefix), ws)
        self.check_committed(prefix, files, STEPS + (400,))
        for w in ws:
            self.assertEqual(w.stop(), 0)


class Faults(Watchers):
    """kill -9 of the nodes' watchers at random instants while steps keep
    coming: after every kill the store's tree is valid PMF, lists no step
    without every node's shards, and still lists every step it listed before;
    once the kills stop, every step is committed."""

    def consistent(self, prefix, seen):
        """Checks the store's tree now; returns the steps it lists."""
        text = self.fetch_meta(prefix)
        if text is None:
            self.assertEqual(seen, set(), "metadata.yaml went away")
            return set()
        t = self.readable_tree(prefix)
        try:
            meta = validate_tree(t)
        except Invalid as e:
            self.fail(f"the store's tree is not valid PMF: {e}")
        listed = set(meta["model"]["training"]["checkpoints"])
        self.assertEqual(seen - listed, set(), "committed steps no longer listed")
        for ref in listed - seen:  # each newly listed step: every node's shards, whole
            with open(os.path.join(t, "data", "checkpoints", f"{ref}.md5sums")) as f:
                lines = [ln.split("  ", 1) for ln in f.read().splitlines()]
            ranks = set()
            for digest, rel in lines:
                path = os.path.join(t, "data", "checkpoints", rel)
                self.assertTrue(os.path.isfile(path), f"{ref} listed, {rel} not stored")
                with open(path, "rb") as f:
                    self.assertEqual(md5(f.read()), digest, f"{ref}: {rel}")
                ranks.add(re.search(r"zero_pp_rank_(\d+)_", rel).group(1))
            self.assertEqual(len(ranks), NODES, f"{ref} listed without every node: {lines}")
        return listed

    def test_kill_9_rounds_never_list_an_incomplete_step_nor_lose_one(self):
        rng = random.Random(34)
        self.make_nodes()
        prefix = "faults"
        self.configure(prefix)
        ws = [Watcher(self, r) for r in range(NODES)]
        seen, step, kills, checks, locked = set(), max(STEPS), 0, 0, 0
        written = [f"global_step{s}" for s in STEPS]

        def write_step():
            nonlocal step
            step += 1
            for r in rng.sample(range(NODES), NODES):  # the nodes in any order
                rel = f"global_step{step}/zero_pp_rank_{r}_mp_rank_00_model_states.pt"
                data = os.urandom(500 + rng.randrange(3000))
                write_old(os.path.join(self.nodes[r], rel), data, age=0)
                write_old(os.path.join(self.nodes[r], "latest"),
                          f"global_step{step}".encode(), age=0)
            written.append(f"global_step{step}")

        while kills < self.KILLS:
            if rng.random() < 0.3:
                write_step()
            r = rng.randrange(NODES)
            time.sleep(rng.uniform(0.02, 0.4))  # any instant of its work
            w = ws[r]
            if w.p.poll() is None:
                w.p.kill()
                w.p.wait()
                kills += 1
            elif w.p.returncode == 3:  # 3: the killed one's helper still held the lock
                locked += 1
            else:
                self.fail(f"node {r}'s watcher exited {w.p.returncode}:\n{w.text()[-4000:]}")
            w.log.close()
            ws[r] = Watcher(self, r)
            if kills % self.CHECK_EVERY == 0:
                seen |= self.consistent(prefix, seen)
                checks += 1
        # the kills stop: every node's watcher runs (a restart may meet the
        # lock of the killed one's helper, as a supervisor's would)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            dead = [r for r in range(NODES) if ws[r].p.poll() is not None]
            if not dead:
                break
            for r in dead:
                self.assertEqual(ws[r].p.returncode, 3, ws[r].text()[-4000:])
                ws[r].log.close()
                ws[r] = Watcher(self, r)
            time.sleep(1)
        self.until("every step written listed", lambda: set(self.listed(prefix)) >=
                   set(written), ws)
        seen = self.consistent(prefix, seen)
        self.assertEqual(seen, set(written))
        # and the check would have seen a step listed without a node's shard
        broken = self.broken_copy(prefix, "broken")
        if broken:
            with self.assertRaisesRegex(AssertionError, "listed, .*zero_pp_rank_2_.* not stored"):
                self.consistent(broken, set())
        print(f"{kills} kills, {len(written)} steps, {checks} checks of the store's tree, "
              f"{locked} restarts that met the lock", file=sys.stderr)
        self.assertGreaterEqual(checks, self.KILLS // self.CHECK_EVERY)
        for w in ws:
            self.assertEqual(w.stop(), 0, w.text()[-4000:])


class FileStore(Nodes, Faults, TmpDirCase):
    honours_if_none_match = True
    KILLS, CHECK_EVERY = 200, 1

    def store_config(self, prefix):
        return f"upload:\n  stores:\n    - url: file://{self.dir}/store/{prefix}\n"

    def store_env(self):
        return {}

    def fetch_tree(self, prefix, dest):
        src = os.path.join(self.dir, "store", prefix)
        if os.path.isdir(src):
            shutil.copytree(src, dest)
        else:
            os.makedirs(dest)

    def fetch_meta(self, prefix):
        try:
            with open(os.path.join(self.dir, "store", prefix, "metadata.yaml")) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def readable_tree(self, prefix):
        """The store's tree, read where it is (the nodes keep writing)."""
        return os.path.join(self.dir, "store", prefix)

    def broken_copy(self, prefix, name):
        """A copy of the store's tree as name, with one listed step's shard
        missing (for checking the checks); None where not made."""
        top = os.path.join(self.dir, "store")
        shutil.copytree(os.path.join(top, prefix), os.path.join(top, name),
                        ignore=shutil.ignore_patterns(".*.part"))
        with open(os.path.join(top, name, "metadata.yaml")) as f:
            c = next(iter(yaml.safe_load(f)["model"]["training"]["checkpoints"].values()))
        with open(os.path.join(top, name, c["path"])) as f:
            shard = next(ln.split("  ", 1)[1] for ln in f.read().splitlines()
                         if "zero_pp_rank_2_" in ln)
        os.remove(os.path.join(top, name, "data", "checkpoints", shard))
        return name

    def fetch_object(self, prefix, key):
        with open(os.path.join(self.dir, "store", prefix, key), "rb") as f:
            return f.read()

    def put_object(self, prefix, key, data):
        path = os.path.join(self.dir, "store", prefix, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    def objects(self, prefix):
        """{key: (size, mtime)} of every stored object (the store's own
        temporaries left out: a running node renames them away)."""
        top = os.path.join(self.dir, "store", prefix)
        out = {}
        for dp, _, fs in os.walk(top):
            for f in fs:
                if f.startswith(".") and f.endswith(".part"):
                    continue
                st = os.stat(os.path.join(dp, f))
                out[os.path.relpath(os.path.join(dp, f), top)] = (st.st_size, st.st_mtime_ns)
        return out


class S3(Nodes):

    def store_config(self, prefix):
        return (f"upload:\n  stores:\n    - url: s3://{self.s3.bucket}/{prefix}\n"
                f"      endpoint: {self.s3.endpoint}\n")

    def store_env(self):
        return self.s3.env()

    def fetch_tree(self, prefix, dest):
        os.makedirs(dest)
        self.s3.aws("s3", "cp", "--recursive", "--no-progress",
                    f"s3://{self.s3.bucket}/{prefix}/", dest)

    def fetch_meta(self, prefix):
        dest = os.path.join(self.dir, "meta.yaml")
        p = self.s3.aws("s3", "cp", "--no-progress", f"s3://{self.s3.bucket}/{prefix}/metadata.yaml",
                        dest, check=False)
        if p.returncode != 0:
            self.assertIn("404", p.stderr)
            return None
        with open(dest) as f:
            return f.read()

    def readable_tree(self, prefix):
        return self.tree(prefix)

    def broken_copy(self, prefix, name):
        return None  # the checks are the file store's

    def fetch_object(self, prefix, key):
        dest = os.path.join(self.dir, "fetched-object")
        self.s3.aws("s3", "cp", "--no-progress", f"s3://{self.s3.bucket}/{prefix}/{key}", dest)
        with open(dest, "rb") as f:
            return f.read()

    def put_object(self, prefix, key, data):
        path = os.path.join(self.dir, "object")
        with open(path, "wb") as f:
            f.write(data)
        self.s3.aws("s3", "cp", "--no-progress", path, f"s3://{self.s3.bucket}/{prefix}/{key}")

    def objects(self, prefix):
        """{key: (size, ETag, LastModified)} of every stored object."""
        import json
        p = self.s3.aws("s3api", "list-objects-v2", "--bucket", self.s3.bucket, "--prefix",
                        prefix + "/", "--output", "json")
        return {o["Key"]: (o["Size"], o["ETag"], o["LastModified"])
                for o in json.loads(p.stdout or "{}").get("Contents", [])}


class S3rverStore(S3, Faults, TmpDirCase):
    honours_if_none_match = False
    KILLS, CHECK_EVERY = 60, 10

    def setUp(self):
        super().setUp()
        self.s3 = S3Server(self.dir)
        self.addCleanup(self.s3.stop)


class RgwStore(S3, Faults, TmpDirCase):
    honours_if_none_match = True
    KILLS, CHECK_EVERY = 60, 10

    def setUp(self):
        super().setUp()
        self.s3 = RgwServer(self.dir)
        self.addCleanup(self.s3.stop)

    def test_a_round_reads_each_commit_record_once(self):
        # RGW's access log counts the requests: a scan after the commits
        # reads no record and looks for no .md5sums again (each node keeps
        # what it read); metadata.yaml is still computed and compared
        self.make_nodes()
        self.configure("once")
        for r in range(NODES):  # node 3 commits
            self.assertEqual(self.scan(r).returncode, 0)
        for r in range(NODES - 1):  # the others read the records once
            self.assertEqual(self.scan(r).returncode, 0)
        def reads():
            return [(m, p) for m, p, _ in self.s3.requests()
                    if (m == "GET" and "/.ckptd/commits/" in p) or
                    (m == "HEAD" and p.endswith(".md5sums"))]
        before = reads()
        self.assertTrue(before)  # the first reads happened
        for r in range(NODES):
            self.assertEqual(self.scan(r).returncode, 0)
        self.assertEqual(reads()[len(before):], [])
        # a record whose copy a node lost is read again, and the tree is the same
        cache = os.path.join(self.nodes[1], ".ckptd", "nodes")
        shutil.rmtree(cache)
        p = self.scan(1)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("nodes.metadata_written", p.stderr)
        self.assertEqual(len([m for m, q in reads()[len(before):] if m == "GET"]), len(STEPS))


if __name__ == "__main__":
    unittest.main()
