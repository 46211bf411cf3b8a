"""The documentation cannot drift from the code: the man pages the build
wrote list every config key of agent/config.c's table and every command of
agent/cmd/commands.c's (read from the sources, not from the binary the pages
were made from); docs/configuration.md and docs/commands.md equal what the
build generated; every canonical op has a row in docs/model.md's and
docs/mldef.md's op tables; every relative link in README.md and docs/*.md
resolves."""
import glob
import os
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import CKPTD  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GEN = os.path.normpath(os.path.join(os.path.dirname(CKPTD), "..", "gendocs"))


def source_keys():
    """The names in the key table of agent/config.c (`static const struct key keys[]`)."""
    with open(os.path.join(ROOT, "agent", "config.c")) as f:
        src = f.read()
    start = src.index("static const struct key keys[] = {")
    table = src[start:src.index("\n};", start)]
    return re.findall(r'^\s*\{"([a-z_.]+)",\s*T_', table, re.M)


def source_commands():
    with open(os.path.join(ROOT, "agent", "cmd", "commands.c")) as f:
        return re.findall(r'^\s*\{"([a-z]+)",\s*ck_cmd_', f.read(), re.M)


def render(page):
    """A man page as `man` shows it (plain text, wide lines)."""
    if not shutil.which("man"):
        raise unittest.SkipTest("man (man-db) is not installed")
    p = subprocess.run(["man", "-l", page], capture_output=True, text=True,
                       env=dict(os.environ, MANWIDTH="200", MANPAGER="cat", LC_ALL="C"))
    if p.returncode != 0:
        raise AssertionError(f"man -l {page}: {p.stderr}")
    return p.stdout


class Docs(unittest.TestCase):
    def generated(self, name):
        path = os.path.join(GEN, name)
        self.assertTrue(os.path.exists(path), f"{path}: the build did not write it")
        return path

    def test_man_pages_list_every_key_and_command(self):
        keys = source_keys()
        self.assertGreater(len(keys), 50, keys)
        text = render(self.generated("ckptd.yaml.5"))
        missing = [k for k in keys
                   if not re.search(r"^       " + re.escape(k) + r"( |$)", text, re.M)]
        self.assertEqual(missing, [], "keys of agent/config.c that ckptd.yaml(5) does not list")
        cmds = source_commands()
        self.assertGreater(len(cmds), 10, cmds)
        text = render(self.generated("ckptd.1"))
        for c in cmds:
            # in the command list and as a section with its --help
            self.assertRegex(text, r"(?m)^       " + c + r"( |$)", f"ckptd(1) does not list {c}")
            self.assertRegex(text, r"(?m)^   ckptd " + c + r"$", f"ckptd(1) has no section for {c}")
            self.assertRegex(text, r"(?m)^       usage: ckptd " + c + r"\b",
                             f"ckptd(1): {c}'s section has no usage line")
        text = render(self.generated("mldef.1"))
        self.assertIn("usage: mldef", text)
        for opt in ("--create", "--inspect", "--run", "--signature"):
            self.assertIn(opt, text)

    def test_references_in_docs_equal_the_generated(self):
        for name in ("configuration.md", "commands.md"):
            with open(self.generated(name)) as f:
                want = f.read()
            path = os.path.join(ROOT, "docs", name)
            self.assertTrue(os.path.exists(path), f"docs/{name} is missing")
            with open(path) as f:
                got = f.read()
            self.assertTrue(got == want,
                            f"docs/{name} differs from what the build generated from the "
                            f"tables: cp {os.path.join(GEN, name)} docs/{name}")
        with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
            text = f.read()
        missing = [k for k in source_keys() if f"| `{k}` |" not in text]
        self.assertEqual(missing, [], "keys of agent/config.c missing from docs/configuration.md")

    def test_every_op_in_the_op_tables(self):
        """Every canonical op of model/model.c's name table has a row in
        docs/model.md's op table and in docs/mldef.md's (2.6), named in the
        row's first cell."""
        with open(os.path.join(ROOT, "model", "model.c")) as f:
            ops = [o for o in re.findall(r'\[CK_OP_[A-Z0-9_]+\] = "([a-z0-9_]+)"', f.read())
                   if o != "invalid"]
        self.assertGreater(len(ops), 100, ops)
        for doc in ("model.md", "mldef.md"):
            with open(os.path.join(ROOT, "docs", doc)) as f:
                firsts = [ln.split("|")[1] for ln in f.read().splitlines()
                          if ln.startswith("|") and ln.count("|") > 2]
            missing = [o for o in ops if not any(f"`{o}`" in c for c in firsts)]
            self.assertEqual(missing, [], f"ops with no row in docs/{doc}'s op table")

    def test_relative_links_resolve(self):
        files = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
        bad = []
        for path in files:
            with open(path) as f:
                text = f.read()
            # links outside code blocks and code spans
            text = re.sub(r"```.*?```", "", text, flags=re.S)
            text = re.sub(r"`[^`\n]*`", "", text)
            for target in re.findall(r"\]\(([^)\s]+)\)", text):
                if re.match(r"^[a-z]+:", target):
                    continue  # https:, mailto:
                file, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
                if not os.path.exists(dest):
                    bad.append(f"{os.path.relpath(path, ROOT)}: {target}: no such file")
                    continue
                if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    bad.append(f"{os.path.relpath(path, ROOT)}: {target}: no such heading")
        self.assertEqual(bad, [])


def anchors(path):
    """GitHub's heading anchors of a Markdown file."""
    with open(path) as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    out = set()
    for h in re.findall(r"^#+ (.+)$", text, re.M):
        a = h.strip().lower()
        a = re.sub(r"[^\w\- ]", "", a)
        out.add(a.replace(" ", "-"))
    return out


if __name__ == "__main__":
    unittest.main()
