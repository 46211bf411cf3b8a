"""Hostile and damaged archives (issue 28): every validator of ckptd decides
"valid" by the same zip checks (readers/zipin.h ck_zipin_check_members), so
`mldef -i` and `ckptd inspect --verify` give the same verdict on every file
made here. The hostile files are written byte by byte by raw_zip() below, from
the zip specification (PKWARE APPNOTE), never by ckptd; Python's zipfile and
zlib are the independent references for what a member holds."""
import os
import random
import resource
import struct
import subprocess
import sys
import zipfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
from ckptd_test import CKPTD, TmpDirCase, run  # noqa: E402
from test_mldef import mldef, write_example  # noqa: E402
import warnings  # noqa: E402
warnings.simplefilter("ignore")  # zipfile warns of the duplicate names made on purpose


def raw_zip(entries, cd_order=None):
    """A zip from entries, each a dict: name, data (uncompressed), method (0/8),
    and lies: local_name (the local header's name), cd_usize / cd_csize (the
    central directory's sizes), local_of (index of an earlier entry whose local
    header this directory record points at), zip64_usize (a zip64 extra with
    this uncompressed size, in both headers). cd_order: the directory's order."""
    out = bytearray()
    locs = []
    for e in entries:
        data = e["data"]
        comp = data if e.get("method", 0) == 0 else zlib.compress(data, 9)[2:-4]
        crc = zlib.crc32(data)
        e["_crc"], e["_csize"], e["_comp"] = crc, len(comp), comp
        if "local_of" in e:
            locs.append(locs[e["local_of"]])
            continue
        lname = e.get("local_name", e["name"]).encode()
        usize, extra = len(data), b""
        if "zip64_usize" in e:
            usize = 0xFFFFFFFF
            extra = struct.pack("<HHQQ", 1, 16, e["zip64_usize"], len(comp))
        csize = 0xFFFFFFFF if extra else len(comp)
        locs.append(len(out))
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45 if extra else 20, 0,
                           e.get("method", 0), 0, 0x21, crc, csize, usize, len(lname),
                           len(extra))
        out += lname + extra + comp
    cd = bytearray()
    for i in cd_order or range(len(entries)):
        e = entries[i]
        name = e["name"].encode()
        usize = e.get("cd_usize", len(e["data"]))
        csize = e.get("cd_csize", e["_csize"])
        extra = b""
        if "zip64_usize" in e:
            extra = struct.pack("<HHQQ", 1, 16, e["zip64_usize"], csize)
            usize = csize = 0xFFFFFFFF
        cd += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45 if extra else 20,
                          45 if extra else 20, 0, e.get("method", 0), 0, 0x21, e["_crc"],
                          csize, usize, len(name), len(extra), 0, 0, 0, 0, locs[i])
        cd += name + extra
    cdoff = len(out)
    out += cd
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(cd),
                       cdoff, 0)
    return bytes(out)


def members_of(path):
    """(name, data offset, compressed size, method, content) of each member, by
    zipfile and the local headers."""
    with open(path, "rb") as f:
        whole = f.read()
    out = []
    with zipfile.ZipFile(path) as z:
        for i in z.infolist():
            nl, xl = struct.unpack_from("<HH", whole, i.header_offset + 26)
            out.append((i.filename, i.header_offset + 30 + nl + xl, i.compress_size,
                        i.compress_type, z.read(i.filename)))
    return whole, out


def flip_changes_content(comp_flipped, method, content):
    """Whether a member's flipped bytes mean other content (zlib decides for a
    deflated member: a stream that fails to inflate changes it too)."""
    if method == zipfile.ZIP_STORED:
        return comp_flipped != content
    try:
        d = zlib.decompressobj(-15)
        got = d.decompress(comp_flipped) + d.flush()
        return got != content or not d.eof or d.unused_data != b""
    except zlib.error:
        return True


def deflate_bomb(size):
    """A raw deflate stream of size zero bytes (a multiple of 16 MiB), made of
    one fully flushed 16 MiB block repeated: about 1 KiB per MiB."""
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = z.compress(bytes(16 << 20)) + z.flush(zlib.Z_FULL_FLUSH)
    return block * (size // (16 << 20)) + z.flush()


def child_maxrss_mb():
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


class Layout(TmpDirCase):
    def example(self, level=None, key=None):
        write_example(self.dir)
        out = os.path.join(self.dir, f"a{level or ''}.mldef")
        args = ["-c", "-f", out] + ([f"-{level}"] if level else [])
        if key:
            args += ["-s", "--key", key]
        mldef(*args, os.path.join(self.dir, "manifest.json"), check=0)
        return out

    def refused_by_every_validator(self, path, *needles):
        """mldef -i and inspect --verify both refuse path, naming it and each needle."""
        p = mldef("-i", path)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertNotIn("valid mldef", p.stdout)
        self.assertIn(os.path.basename(path), p.stderr)
        for n in needles:
            self.assertIn(n, p.stderr)
        r = run("inspect", "--verify", path)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertNotIn("checksums verified", r.stdout)
        for n in needles:
            self.assertIn(n, r.stderr)
        return p.stderr

    def write(self, name, data):
        p = os.path.join(self.dir, name)
        with open(p, "wb") as f:
            f.write(data)
        return p

    def test_every_flip_in_every_member_is_refused(self):
        k = os.path.join(self.dir, "k")
        run("keygen", "-o", k, check=0)
        rng = random.Random(28)
        for level in (None, 6):  # stored members and deflated ones
            a = self.example(level, key=k)
            mldef("-i", a, check=0)
            whole, members = members_of(a)
            self.assertGreaterEqual(len(members), 5)
            flips = 0
            for name, data, csize, method, content in members:
                if not csize:
                    continue
                spots = {data, data + csize - 1} | {data + rng.randrange(csize) for _ in range(2)}
                for at in sorted(spots):
                    bit = 1 << rng.randrange(8)
                    comp = bytearray(whole[data:data + csize])
                    comp[at - data] ^= bit
                    if not flip_changes_content(bytes(comp), method, content):
                        continue
                    with self.subTest(level=level, member=name, at=at - data, bit=bit):
                        bad = bytearray(whole)
                        bad[at] ^= bit
                        self.refused_by_every_validator(self.write("bad.mldef", bad),
                                                        f"'{name}'")
                        flips += 1
            self.assertGreaterEqual(flips, 3 * len(members) - 2)

    def test_local_header_name_slip(self):
        """A signed archive whose data entry's local header is named
        '../../../../tmp/x': zipfile refuses it, and so does every validator,
        signature or not."""
        k = os.path.join(self.dir, "k")
        run("keygen", "-o", k, check=0)
        a = self.example(key=k)
        with zipfile.ZipFile(a) as z:
            entries = [{"name": i.filename, "data": z.read(i.filename)} for i in z.infolist()]
        for e in entries:
            if e["name"] == "data/w000.float32":
                e["local_name"] = "../../../../tmp/x"
        bad = self.write("slip.mldef", raw_zip(entries))
        with zipfile.ZipFile(bad) as z, self.assertRaises(zipfile.BadZipFile):
            z.read("data/w000.float32")
        err = self.refused_by_every_validator(bad, "'data/w000.float32'", "'../../../../tmp/x'")
        self.assertNotIn("signature good", err)
        p = mldef("-s", "--pubkey", k + ".pub", bad)
        self.assertEqual(p.returncode, 1)
        self.assertNotIn("signature good", p.stdout)
        # the same archive written honestly is valid: the test breaks only the name
        good = self.write("good.mldef", raw_zip([dict(e, local_name=e["name"]) for e in entries]))
        self.assertIn("signature good", mldef("-s", "--pubkey", k + ".pub", good, check=0).stdout)

    def test_central_directory_lying_about_sizes(self):
        a = self.example()
        with zipfile.ZipFile(a) as z:
            entries = [{"name": i.filename, "data": z.read(i.filename)} for i in z.infolist()]
        w = next(e for e in entries if e["name"] == "data/w000.float32")
        n = len(w["data"])
        for lie in ({"cd_usize": n // 2, "cd_csize": n // 2}, {"cd_usize": n + 4, "cd_csize": n + 4},
                    {"cd_usize": n * 2}):
            with self.subTest(lie=lie):
                bad = self.write("lie.mldef", raw_zip([dict(e, **lie) if e is w else e
                                                       for e in entries]))
                self.refused_by_every_validator(bad, "'data/w000.float32'")

    def test_a_header_claiming_10_gib(self):
        """A 64 KiB deflated stream whose headers say 10 GiB: refused from the
        headers, before anything is inflated or allocated."""
        a = self.example()
        with zipfile.ZipFile(a) as z:
            entries = [{"name": i.filename, "data": z.read(i.filename)} for i in z.infolist()]
        entries.append({"name": "tests/big.float32", "data": bytes(64 << 10), "method": 8,
                        "zip64_usize": 10 << 30})
        bad = self.write("big.mldef", raw_zip(entries))
        before = child_maxrss_mb()
        err = self.refused_by_every_validator(bad, "'tests/big.float32'")
        self.assertIn(f"claims {10 << 30} bytes from", err)
        self.assertLess(child_maxrss_mb(), max(before, 400))

    def test_overlapping_and_out_of_order_entries(self):
        """90 directory entries over one 1 MiB stream, and a directory listing
        members in another order than the file: refused at the directory."""
        blob = os.urandom(1 << 20)
        entries = [{"name": "manifest.json", "data": blob}]
        entries += [{"name": f"m{i:02d}", "data": blob, "local_of": 0} for i in range(89)]
        bad = self.write("overlap.mldef", raw_zip(entries))
        self.refused_by_every_validator(bad, "overlaps")
        entries = [{"name": "manifest.json", "data": b"{}"}, {"name": "x.csv", "data": b"1"}]
        bad = self.write("order.mldef", raw_zip(entries, cd_order=[1, 0]))
        with zipfile.ZipFile(bad) as z:  # zipfile reads it: only the order is wrong
            self.assertEqual(z.read("x.csv"), b"1")
        self.refused_by_every_validator(bad, "comes before")

    def test_deflate_bomb_inflates_no_further_than_declared(self):
        """10 MB of deflate that expands to 10 GB, its headers claiming 1 MiB:
        refused after 1 MiB, not after 10 GB."""
        bomb = self.bomb_zip(deflate_bomb(10 << 30), 1 << 20, zlib.crc32(bytes(1 << 20)))
        self.assertLess(len(bomb), 12 << 20)
        bad = self.write("bomb.mldef", bomb)
        before = child_maxrss_mb()
        err = self.refused_by_every_validator(bad, "inflates past its declared 1048576 bytes")
        self.assertIn("'data/w.float32'", err)
        self.assertLess(child_maxrss_mb(), max(before, 400))

    @staticmethod
    def bomb_zip(comp, usize, crc):
        out = bytearray()
        man = b"{}"
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0x21, zlib.crc32(man),
                           len(man), len(man), 13, 0) + b"manifest.json" + man
        loc = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0x21, crc, len(comp),
                           usize, 14, 0) + b"data/w.float32" + comp
        cd = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0x21,
                         zlib.crc32(man), len(man), len(man), 13, 0, 0, 0, 0, 0, 0)
        cd += b"manifest.json"
        cd += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0x21, crc,
                          len(comp), usize, 14, 0, 0, 0, 0, 0, loc) + b"data/w.float32"
        cdoff = len(out)
        out += cd + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 2, 2, len(cd), cdoff, 0)
        return bytes(out)


def timed_run(case, limit, *args, binary=None):
    """ckptd (or binary) with args; a run past limit seconds fails the test. The
    limits are 10x or more what the linear code takes under ASan on a loaded CI
    machine, and a tenth or less of what the quadratic code took (issue 28)."""
    try:
        return subprocess.run([binary or CKPTD, *map(str, args)], capture_output=True,
                              text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        case.fail(f"{' '.join(map(str, args))}: still running after {limit} s")


class Bounded(TmpDirCase):
    """Costs that the input decides grow linearly: each bomb of the issue, at a
    size where a quadratic cost would show."""

    def test_tags_txt_of_100k_lines(self):
        import numpy as np
        sys.path.insert(0, HERE)
        import sdfb
        sdfb.sd()  # skips without flatc
        fb = os.path.join(self.dir, "one.fb")
        sdfb.mlp(fb, {"W1": np.ones((4, 3), "f4"), "b1": np.zeros(3, "f4"),
                      "W2": np.ones((3, 2), "f4"), "b2": np.zeros(2, "f4")})
        src = os.path.join(self.dir, "one.zip")
        run("pack", "--format", "samediff", fb, "-o", src, "-q", check=0)
        with zipfile.ZipFile(src) as z:
            items = [(i.filename, z.read(i.filename)) for i in z.infolist()]
        bad = os.path.join(self.dir, "tags.zip")
        for dup in (False, True):
            lines = [f"t{i}" for i in range(100000)] + ["one"] + (["T5"] if dup else [])
            with zipfile.ZipFile(bad, "w") as z:
                for n, d in items:
                    z.writestr(n, "\n".join(lines) + "\n" if n == "tags.txt" else d)
            p = timed_run(self, 60, "inspect", bad)
            self.assertEqual(p.returncode, 1, p.stderr)
            if dup:  # the second spelling, on its line
                self.assertIn("tags.txt line 100002: tag 'T5' appears twice", p.stderr)
            else:
                self.assertIn("tags.txt lists 't0' but 't0/graph.fb' is missing", p.stderr)
            p = timed_run(self, 60, "pack", "--format", "samediff", fb, "-o", bad, "--tag", "x")
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("tags.zip'", p.stderr)

    def test_nested_yaml_is_refused_at_its_depth_limit(self):
        deep = os.path.join(self.dir, "deep.yaml")
        with open(deep, "w") as f:
            f.write("a: " + "[" * 100000 + "]" * 100000 + "\n")
        p = timed_run(self, 60, "config", "-c", deep)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("deep.yaml' line 1 column 67: nested more than 64 deep", p.stderr)
        tree = os.path.join(self.dir, "tree")
        os.makedirs(tree)
        with open(os.path.join(tree, "metadata.yaml"), "w") as f:
            f.write("a:\n" + "".join("  " * i + "- \n" for i in range(1, 70)))
        p = timed_run(self, 60, "scan", tree)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("metadata.yaml' line 65 ", p.stderr)  # line k opens level k
        self.assertIn("nested more than 64 deep", p.stderr)
        # 64 levels are fine: the limit is no lower than it says
        ok = os.path.join(self.dir, "ok.yaml")
        with open(ok, "w") as f:
            f.write("a: " + "[" * 63 + "]" * 63 + "\n")
        p = timed_run(self, 60, "config", "-c", ok)
        self.assertNotIn("nested more than", p.stderr)

    def test_yaml_aliases_are_counted_expanded(self):
        """Nine lines of nested aliases ("billion laughs", 10^9 nodes once
        expanded) in a config and in a metadata.yaml: refused at once, naming
        the file and the line; anchors used as a config would use them pass."""
        lines = ["a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
        laughs = "\n".join(lines) + "\n"
        cfg = os.path.join(self.dir, "laughs.yaml")
        with open(cfg, "w") as f:
            f.write(laughs)
        p = timed_run(self, 60, "config", "-c", cfg)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("laughs.yaml' line 7 column", p.stderr)  # a6 alone: 11,111,111 nodes
        self.assertIn("its aliases expand past 4000000 nodes", p.stderr)
        tree = os.path.join(self.dir, "tree")
        os.makedirs(tree)
        with open(os.path.join(tree, "metadata.yaml"), "w") as f:
            f.write(laughs)
        p = timed_run(self, 60, "scan", tree)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("metadata.yaml' line 7 column", p.stderr)
        # a store's settings shared by an anchor and a merge key are read
        ok = os.path.join(self.dir, "ok.yaml")
        with open(ok, "w") as f:
            f.write(f"watch: {{dir: {self.dir}}}\n"
                    "stores:\n  - &s {name: a, url: 'file:///tmp/ck-a'}\n"
                    "  - {<<: *s, name: b}\n")
        p = timed_run(self, 60, "config", "-c", ok)
        self.assertNotIn("aliases expand", p.stderr)

    def test_layer_list_of_30k_layers(self):
        import numpy as np
        from ckpt_formats import safetensors_from_numpy
        w = os.path.join(self.dir, "w.safetensors")
        with open(w, "wb") as f:
            f.write(safetensors_from_numpy({"w": np.eye(4, dtype=np.float32),
                                            "b": np.ones(4, np.float32)}))
        g = os.path.join(self.dir, "layers.yaml")
        n = 30000
        with open(g, "w") as f:
            f.write("input: {name: x, shape: [-1, 4]}\nlayers:\n"
                    "  - {op: dense, weight: w, bias: b, name: l0}\n")
            f.writelines(f"  - {{op: relu, name: l{i}}}\n" for i in range(1, n - 1))
            f.write(f"  - {{op: add, from: [l1, l{n // 2}]}}\n")
        out = os.path.join(self.dir, "l.mldef")
        timed_run(self, 90, "pack", w, "--graph", g, "-o", out, "-q")
        p = timed_run(self, 90, "-i", out, binary=os.path.join(os.path.dirname(CKPTD), "mldef"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(f"{n + 1} layers", p.stdout)  # the input is a layer too
        with zipfile.ZipFile(out) as z:
            import json
            man = json.loads(z.read("manifest.json"))
        names = [x["Name"] for x in man["Layers"]]
        self.assertEqual(len(names), len(set(names)))
        self.assertEqual(man["Layers"][-1]["Inputs"][:2], ["l1", f"l{n // 2}"])

    def test_zip_of_70k_entries(self):
        bad = os.path.join(self.dir, "many.mldef")
        with zipfile.ZipFile(bad, "w") as z:
            z.writestr("manifest.json", "{}")
            for i in range(70000):
                z.writestr(f"d/{i}.csv", "1")
            z.writestr("d/5.csv", "2")  # a duplicate, last: found all the same
        p = timed_run(self, 120, "-i", bad, binary=os.path.join(os.path.dirname(CKPTD), "mldef"))
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("70002 files (at most 100) [files.count]", p.stderr)
        self.assertIn("d/5.csv: two entries with this name [files.duplicate]", p.stderr)
        p = timed_run(self, 120, "inspect", bad)
        self.assertEqual(p.returncode, 1, p.stderr)


    def test_verify_memory_limit_covers_the_default_inputs(self):
        """A model declaring a 3.6 GB input, verified under --max-memory 256M
        with the default inputs: refused before the parent allocates them
        (they were made unsandboxed: the parent reached 2.9 GB)."""
        import numpy as np
        from ckpt_formats import safetensors_from_numpy
        w = os.path.join(self.dir, "w.safetensors")
        with open(w, "wb") as f:
            f.write(safetensors_from_numpy({"s": np.ones(1, np.float32)}))
        g = os.path.join(self.dir, "big.yaml")
        with open(g, "w") as f:
            f.write("input: {name: x, shape: [1, 30000, 30000]}\nlayers:\n"
                    "  - {op: relu}\n")
        probe = ("import resource, subprocess, sys\n"
                 "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
                 "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
                 "sys.stderr.write(p.stderr)\n")
        p = subprocess.run([sys.executable, "-c", probe, CKPTD, "verify", w, "--graph", g,
                            "--max-memory", "256M"], capture_output=True, text=True, timeout=120)
        rc, rss_kib = map(int, p.stdout.split())
        self.assertEqual(rc, 1, p.stderr)
        self.assertIn("w.safetensors': the default input", p.stderr)  # the model is named
        self.assertIn("input 'x': more than 67108864 values", p.stderr)
        self.assertIn("--max-memory 268435456 bytes", p.stderr)
        self.assertLess(rss_kib, 200 << 10)
        # an input of exactly the limit is made: the limit is no lower than it says
        with open(g, "w") as f:
            f.write("input: {name: x, shape: [1, 4096, 4096]}\nlayers:\n  - {op: relu}\n")
        p = run("verify", w, "--graph", g, "--max-memory", "64M")
        self.assertNotIn("the default input", p.stderr)


class Outputs(TmpDirCase):
    """A failed or killed pack leaves the previous OUT as it was; what a killed
    pack leaves behind is removed by the next pack to that output, and nothing
    else is."""

    def big_source(self):
        import numpy as np
        from test_mldef import layer, save
        man, _ = write_example(self.dir)
        n = (8 << 20) // 10 * 10
        np.random.default_rng(1).standard_normal(n).astype("<f4").tofile(
            os.path.join(self.dir, "data", "big.float32"))
        man["DataFiles"].append({"Name": "big", "Path": "data/big.float32", "StorageBytes": 4,
                                 "StorageFormat": "float"})
        layer(man, "fc4")["Outputs"] = ["h"]
        man["Layers"].append({"Name": "fc5", "Op": "dense", "Prior": "h", "Outputs": ["y"],
                              "DataSource": "big", "StartIndex": 0, "Count": n,
                              "Params": {"TransW": True},
                              "Weights": [{"Name": "fc5.w", "Shape": [n // 10, 10]}]})
        save(self.dir, man)
        src = os.path.join(self.dir, "src.mldef")
        mldef("-c", "-f", src, os.path.join(self.dir, "manifest.json"), check=0)
        out = os.path.join(self.dir, "out.mldef")
        import shutil
        shutil.copy(src, out)
        with open(out, "rb") as f:
            return src, out, f.read()

    def leftovers(self):
        return sorted(f for f in os.listdir(self.dir) if f.startswith(".out.mldef."))

    def test_kill_9_during_pack_then_a_pack_that_sweeps(self):
        import signal
        import time
        src, out, before = self.big_source()
        # not ours to remove: another output's temporary, a trainer's dot file
        others = [".other.mldef.ckptd-a1B2c3.tmp", ".out.mldef.partial", "out.mldef.ckptd-x.tmp"]
        for o in others:
            self.write(o, b"keep")
        for delay in (0.0, 0.3, 1.0):
            p = subprocess.Popen([CKPTD, "pack", src, "-o", out, "-9"], stderr=subprocess.DEVNULL)
            # killed while it writes: once its temporary exists (however slow the machine)
            seen = set(self.leftovers())
            deadline = time.monotonic() + 120
            while p.poll() is None and set(self.leftovers()) <= seen \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(delay)
            p.send_signal(signal.SIGKILL)
            p.wait()
            with open(out, "rb") as f:
                self.assertEqual(f.read(), before)
            mldef("-i", out, check=0)
        left = [f for f in self.leftovers() if f not in others]
        self.assertTrue(left, "no kill landed while the pack was writing")
        p = run("pack", src, "-o", out, "-1", timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(f"temporaries={len(left)}", p.stderr)
        self.assertIn("sweep.removed", p.stderr)
        self.assertEqual([f for f in self.leftovers() if f not in others], [])
        for o in others:
            with open(os.path.join(self.dir, o), "rb") as f:
                self.assertEqual(f.read(), b"keep", o)
        mldef("-i", out, check=0)

    def write(self, name, data):
        with open(os.path.join(self.dir, name), "wb") as f:
            f.write(data)

    def test_a_failed_pack_leaves_out_byte_identical(self):
        import signal
        src, out, before = self.big_source()

        def small_files():  # the archive cannot grow past 1 MiB: the write fails
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

        p = subprocess.run([CKPTD, "pack", src, "-o", out], capture_output=True, text=True,
                           preexec_fn=small_files, timeout=300)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("out.mldef", p.stderr)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertEqual(self.leftovers(), [])


if __name__ == "__main__":
    import unittest
    unittest.main()
