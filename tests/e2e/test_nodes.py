"""Multi-node training (issue 34, docs/multinode.md): the node identity
(nodes.rank, nodes.count) from the config and the launchers' variables, as
`ckptd config` shows it and every start checks it."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, write_old  # noqa: E402
import subprocess  # noqa: E402

# Every variable ckptd reads for the node identity (docs/multinode.md): the
# tests start from an environment without any of them.
LAUNCHER_VARS = ("SLURM_NODEID", "SLURM_NNODES", "PET_NODE_RANK", "PET_NNODES", "GROUP_RANK",
                 "NNODES", "JOB_COMPLETION_INDEX", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS")


def ckptd(*args, env=None, timeout=60):
    e = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    e.update(env or {})
    return subprocess.run([CKPTD, *args], capture_output=True, text=True, env=e, timeout=timeout)


def node_lines(stdout):
    """`ckptd config`'s node lines as {key: (value, origin)} and the unused note."""
    out, unused = {}, ""
    for line in stdout.splitlines():
        if line.startswith("nodes.rank: ") or line.startswith("nodes.count: "):
            key, rest = line.split(": ", 1)
            value, _, origin = rest.partition(" (")
            out[key] = (int(value), origin[:-1])
        elif line.startswith("nodes: not used: "):
            unused = line[len("nodes: not used: "):]
    return out, unused


class Identity(TmpDirCase):

    def setUp(self):
        super().setUp()
        self.train = os.path.join(self.dir, "train")
        os.makedirs(self.train)

    def config(self, text):
        with open(os.path.join(self.train, "ckptd.yaml"), "w") as f:
            f.write(text)

    def shows(self, env, rank, count, unused=None):
        p = ckptd("config", self.train, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        got, note = node_lines(p.stdout)
        self.assertEqual(got, {"nodes.rank": rank, "nodes.count": count}, p.stdout)
        for word in unused or ():
            self.assertIn(word, note)
        if unused is None:
            self.assertEqual(note, "")

    def test_config_shows_each_value_and_where_it_came_from(self):
        self.shows({}, (0, "default"), (1, "default: a single node"))
        launchers = [
            ({"SLURM_NODEID": "2", "SLURM_NNODES": "4", "SLURM_JOB_ID": "991"},
             (2, "SLURM_NODEID=2"), (4, "SLURM_NNODES=4")),
            # Kubeflow's PyTorchJob: torchrun's arguments as PET_ variables
            ({"PET_NODE_RANK": "1", "PET_NNODES": "3"}, (1, "PET_NODE_RANK=1"),
             (3, "PET_NNODES=3")),
            ({"GROUP_RANK": "7", "NNODES": "8"}, (7, "GROUP_RANK=7"), (8, "NNODES=8")),
            ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
              "OMPI_COMM_WORLD_LOCAL_SIZE": "1"},
             (1, "OMPI_COMM_WORLD_RANK=1"), (2, "OMPI_COMM_WORLD_SIZE=2")),
            ({"PMI_RANK": "0", "PMI_SIZE": "5"}, (0, "PMI_RANK=0"), (5, "PMI_SIZE=5")),
        ]
        for env, rank, count in launchers:
            with self.subTest(env=env):
                self.shows(env, rank, count)
        # an Indexed Job's index alone: a single node (a sweep of single-node
        # trainings has indexes too), and `config` says it was not used
        self.shows({"JOB_COMPLETION_INDEX": "3"}, (0, "default"), (1, "default: a single node"),
                   unused=["JOB_COMPLETION_INDEX=3", "no node count is set"])
        # with nodes.count in the config, the index is the rank
        self.config("nodes:\n  count: 4\n")
        cfg = os.path.join(self.train, "ckptd.yaml")
        self.shows({"JOB_COMPLETION_INDEX": "3", "SLURM_NNODES": "2"}, (3, "JOB_COMPLETION_INDEX=3"),
                   (4, f"'{cfg}' line 2"), unused=["SLURM_NNODES=2 (nodes.count is set)"])
        self.config("nodes:\n  rank: 1\n  count: 2\n")
        self.shows({"SLURM_NODEID": "0", "SLURM_NNODES": "2"}, (1, f"'{cfg}' line 2"),
                   (2, f"'{cfg}' line 3"),
                   unused=["SLURM_NNODES=2 (nodes.count is set)", "SLURM_NODEID=0"])

    def test_count_one_is_a_single_node_on_any_node_of_a_job(self):
        # one sidecar that sees every file (a shared filesystem) in a 4-node job
        self.config("nodes:\n  count: 1\n")
        self.shows({"SLURM_NODEID": "3", "SLURM_NNODES": "4"}, (0, "default"),
                   (1, f"'{os.path.join(self.train, 'ckptd.yaml')}' line 2"),
                   unused=["SLURM_NNODES=4", "SLURM_NODEID=3"])
        os.remove(os.path.join(self.train, "ckptd.yaml"))
        self.shows({"SLURM_NODEID": "0", "SLURM_NNODES": "1"}, (0, "default"),
                   (1, "SLURM_NNODES=1"), unused=["SLURM_NODEID=0 (a single node)"])

    def test_bad_values_stop_every_start_naming_the_key_and_variable(self):
        cases = [
            ({"SLURM_NODEID": "x", "SLURM_NNODES": "4"}, ["nodes.rank", "SLURM_NODEID='x'"]),
            ({"SLURM_NODEID": "4", "SLURM_NNODES": "4"},
             ["nodes.rank", "SLURM_NODEID=4", "not below", "SLURM_NNODES=4"]),
            ({"SLURM_NODEID": "0", "SLURM_NNODES": "2", "PET_NNODES": "4"},
             ["nodes.count", "disagree", "SLURM_NNODES=2", "PET_NNODES=4"]),
            ({"PET_NODE_RANK": "0", "PET_NNODES": "1:4"}, ["nodes.count", "PET_NNODES='1:4'",
                                                          "elastic"]),
            ({"SLURM_NNODES": "3"}, ["nodes.rank", "SLURM_NNODES=3", "set nodes.rank"]),
            ({"OMPI_COMM_WORLD_RANK": "9", "OMPI_COMM_WORLD_SIZE": "16",
              "OMPI_COMM_WORLD_LOCAL_SIZE": "8"},
             ["nodes.", "OMPI_COMM_WORLD_LOCAL_SIZE=8", "one ckptd per node"]),
        ]
        write_old(os.path.join(self.train, "epoch_1.pt"), b"weights")
        for env, words in cases:
            for args in (("config", self.train), ("watch", "-n", self.train),
                         ("scan", "-n", self.train), ("scan", self.train)):
                with self.subTest(env=env, args=args):
                    p = ckptd(*args, env=env)
                    self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
                    for w in words:
                        self.assertIn(w, p.stderr)
        # nothing was written: the scan stopped before its pass
        self.assertFalse(os.path.exists(os.path.join(self.train, "metadata.yaml")))
        cfg = os.path.join(self.train, "ckptd.yaml")
        for text, words in (("nodes:\n  rank: -1\n", ["line 2", "nodes.rank", "whole number"]),
                            ("nodes:\n  count: 0\n", ["line 2", "nodes.count", "whole number"]),
                            ("nodes:\n  count: four\n", ["line 2", "nodes.count"]),
                            ("nodes:\n  rank: 2\n  count: 2\n", ["nodes.rank", "line 2",
                                                                 "not below", "line 3"]),
                            ("nodes:\n  count: 2\n", ["nodes.rank", "line 2", "set nodes.rank"])):
            with self.subTest(config=text):
                self.config(text)
                p = ckptd("config", self.train)
                self.assertEqual(p.returncode, 2, p.stdout)
                self.assertIn(cfg, p.stderr)
                for w in words:
                    self.assertIn(w, p.stderr)

    def test_count_one_scans_as_before_and_several_upload_only_their_part(self):
        store = os.path.join(self.dir, "store")
        write_old(os.path.join(self.train, "epoch_1.pt"), b"weights one")
        write_old(os.path.join(self.train, "epoch_2.pt"), b"weights two")
        self.config(f"upload:\n  stores:\n    - url: file://{store}\n")
        p = ckptd("scan", self.train, env={"SLURM_NODEID": "0", "SLURM_NNODES": "1"})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("nodes.", p.stderr)
        stored = sorted(os.path.relpath(os.path.join(d, f), store)
                        for d, _, fs in os.walk(store) for f in fs)
        self.assertIn("data/checkpoints/epoch_2.pt", stored)
        self.assertEqual(stored[-1], "metadata.yaml")
        with open(os.path.join(store, "metadata.yaml"), "rb") as f:
            meta = f.read()
        # a node of several: its part and its manifest, never its own
        # metadata.yaml over the store's (tests/e2e/test_nodes_commit.py
        # commits across nodes)
        write_old(os.path.join(self.train, "epoch_3.pt"), b"weights three")
        p = ckptd("scan", self.train, env={"SLURM_NODEID": "1", "SLURM_NNODES": "2"})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('nodes.start: rank=1 count=2 rank_from="SLURM_NODEID=1"', p.stderr)
        self.assertIn("checkpoint='epoch_3.pt' missing_ranks=0", p.stderr)
        with open(os.path.join(store, "data/checkpoints/epoch_3.pt"), "rb") as f:
            self.assertEqual(f.read(), b"weights three")
        self.assertTrue(os.path.exists(os.path.join(store, ".ckptd/parts/epoch_3.pt/node-1-of-2.yaml")))
        with open(os.path.join(store, "metadata.yaml"), "rb") as f:
            self.assertEqual(f.read(), meta)
        # the watcher says which node it is at its start, as scan does
        # (tests/e2e/test_nodes_commit.py's Watchers commit across nodes)
        e = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
        e.update(SLURM_NODEID="1", SLURM_NNODES="2")
        w = subprocess.Popen([CKPTD, "watch", self.train], env=e, text=True,
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
        try:
            line = w.stderr.readline()
            while line and "nodes." not in line:
                line = w.stderr.readline()
        finally:
            w.terminate()
            w.communicate(timeout=60)
        self.assertIn('nodes.start: rank=1 count=2 rank_from="SLURM_NODEID=1"', line)

    def test_a_node_of_several_needs_a_store_that_lists_and_writes_if_absent(self):
        for text, words in (("", ["needs upload.stores"]),
                            ("upload:\n  stores:\n    - url: https://example.com/x\n",
                             ["upload.stores[0] cannot list", "supported: s3, file"]),
                            ("upload:\n  stores:\n    - url: file:///tmp/x\n      compress: zstd\n",
                             ["upload.stores[0] sends compressed files"])):
            with self.subTest(config=text):
                self.config(text)
                for args in (("scan", self.train), ("scan", "-n", self.train),
                             ("watch", self.train), ("watch", "-n", self.train)):
                    p = ckptd(*args, env={"SLURM_NODEID": "1", "SLURM_NNODES": "2"})
                    self.assertEqual(p.returncode, 2, p.stderr)
                    self.assertIn("nodes.count 2 (SLURM_NNODES=2)", p.stderr)
                    for w in words:
                        self.assertIn(w, p.stderr)

if __name__ == "__main__":
    unittest.main()
