"""The model layer through the real binary: ckptd inspect says whether a file
carries its own network (NNabla .nnp) or needs a layer list (safetensors,
written here with numpy and the format's own layout)."""
import json
import os
import struct
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import TmpDirCase, run, shared  # noqa: E402


class Deployable(TmpDirCase):
    def test_nnp_has_its_network(self):
        path = shared("nnabla", "lenet_010000.nnp")
        doc = json.loads(run("inspect", "--json", path, check=0).stdout)
        self.assertIs(doc["has_network"], True)
        text = run("inspect", path, check=0).stdout
        self.assertIn("deployable: its own network", text)

    def test_safetensors_needs_a_layer_list(self):
        w = np.arange(6, dtype="<f4").reshape(2, 3)
        header = json.dumps({"w": {"dtype": "F32", "shape": [2, 3],
                                   "data_offsets": [0, w.nbytes]}}).encode()
        path = os.path.join(self.dir, "w.safetensors")
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + w.tobytes())
        doc = json.loads(run("inspect", "--json", path, check=0).stdout)
        self.assertIs(doc["has_network"], False)
        text = run("inspect", path, check=0).stdout
        self.assertIn("weights only, give the graph with --graph FILE", text)


if __name__ == "__main__":
    unittest.main()
