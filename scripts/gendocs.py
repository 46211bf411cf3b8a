#!/usr/bin/python3
"""Writes the man pages ckptd(1), mldef(1), ckptd.yaml(5) and the Markdown
references docs/configuration.md and docs/commands.md from what the built
binary prints: `ckptd --help` and `ckptd CMD --help` (the command and option
tables of agent/cmd/), `ckptd config --keys` (the key table of
agent/config.c) and `mldef --help`. The build runs it after linking, so the
pages cannot drift from the tables; tests/e2e/test_docs.py checks that the
Markdown files in docs/ equal what it writes.

usage: gendocs.py CKPTD MLDEF OUTDIR"""
import os
import re
import subprocess
import sys

SECTION_TITLES = {
    "model": "model: what metadata.yaml says about the model",
    "checkpoints": "checkpoints: which files are checkpoints",
    "training": "training: how the training ends",
    "watch": "watch: the sidecar's watching",
    "log": "log: the log lines",
    "hooks": "hooks: webhooks and exec hooks",
    "metrics_file": "metrics and the HTTP endpoint",
    "upload": "upload: stores and transfers",
    "pack": "pack: deployment archives of every new checkpoint",
    "verify": "verify: the CPU verification of every archive",
    "retention": "retention: local deletions once stores hold a checked copy",
    "nodes": "nodes: one sidecar per node of a multi-node training",
}

# What every key shares: said once in ckptd.yaml(5) and docs/configuration.md.
CONFIG_INTRO = [
    "The config is read from the file `--config FILE` names, else `DIR/ckptd.yaml` "
    "when it exists, else the defaults apply; a command-line flag overrides the key "
    "it stands for. `ckptd config DIR` checks a config the way a start does and "
    "exits 0 when it is valid, 2 naming the key and its line when not; "
    "`ckptd config --keys` lists the keys below.",
    "Keys are written nested (`watch:` then `settle: 200ms` under it); a dotted "
    "name below is the path to the key. An unknown key or a value of the wrong "
    "type is an error naming the key and its line.",
    "Durations are a number and a unit: `200ms`, `2s`, `5m`, `1h`. Sizes are "
    "bytes or a number and a unit: `8MiB`, `20GiB`. Booleans are `true` or `false`.",
    "Secrets are never values in the config: a secret is `env:NAME` (an "
    "environment variable) or `file:/path` (a file of mode 0600 or stricter).",
    "Every relative path written in a config file is relative to the folder of "
    "that file (for `DIR/ckptd.yaml`: DIR), whatever the working directory. Names "
    "of things inside DIR (`checkpoints.patterns`, the `training.*_marker` files) "
    "are relative to DIR.",
]

CKPTD_DESCRIPTION = [
    "ckptd runs beside a training job (a Kubernetes sidecar, a systemd service or "
    "a cron job). For every checkpoint the job writes, the moment it is complete, "
    "it records it in a PMF model tree (`metadata.yaml` with epoch, path, md5 and "
    "the training status), and it can pack deployment archives, verify them on the "
    "CPU, upload everything to remote stores (S3, HTTP/WebDAV, SFTP, a path) and "
    "notify people and systems (webhooks, exec hooks).",
    "Every command takes `--help`, `-c/--config FILE`, `--log-format text|json`, "
    "`-v` and `-q`. `ckptd --version` prints the version.",
]


def out_of(argv):
    p = subprocess.run(argv, capture_output=True, text=True,
                       env=dict(os.environ, LC_ALL="C", ASAN_OPTIONS="detect_leaks=0"))
    if p.returncode != 0:
        sys.exit(f"gendocs: {' '.join(argv)}: exit {p.returncode}: {p.stderr}")
    return p.stdout


def commands(ckptd):
    """[(name, summary)] from `ckptd --help`, and its closing lines."""
    text = out_of([ckptd, "--help"])
    rows = re.findall(r"^  ([a-z]+) +(.+)$", text, re.M)
    if not rows:
        sys.exit("gendocs: 'ckptd --help' lists no command")
    return rows


def keys(ckptd):
    """[(key, meaning)] from `ckptd config --keys`, in the table's order."""
    rows = []
    for line in out_of([ckptd, "config", "--keys"]).splitlines():
        if not line.strip():
            continue
        m = re.match(r"^(\S+)\s+(.*)$", line)
        if not m:
            sys.exit(f"gendocs: 'ckptd config --keys': cannot read '{line}'")
        rows.append((m.group(1), m.group(2)))
    if not rows:
        sys.exit("gendocs: 'ckptd config --keys' lists no key")
    return rows


def sections(rows):
    """The keys grouped by their first name part, in the table's order."""
    out = []
    for key, meaning in rows:
        top = key.split(".")[0]
        if top == "listen":
            top = "metrics_file"  # the endpoint and the textfile are one subject
        for s in out:
            if s[0] == top:
                s[1].append((key, meaning))
                break
        else:
            out.append((top, [(key, meaning)]))
    return out


# ---- roff ----

def roff_text(s):
    """A line of running text: backslashes, leading dots and quotes, hyphens;
    `code` becomes bold."""
    s = s.replace("\\", "\\e").replace("-", "\\-")
    s = re.sub(r"`([^`]+)`", r"\\fB\1\\fR", s)
    if s.startswith((".", "'")):
        s = "\\&" + s
    return s


def roff_verbatim(text):
    out = [".nf"]
    for line in text.rstrip("\n").splitlines():
        line = line.replace("\\", "\\e").replace("-", "\\-")
        if line.startswith((".", "'")):
            line = "\\&" + line
        out.append(line if line else "")
    out.append(".fi")
    return out


def th(name, sec, version, title):
    return [f'.TH {name.upper()} {sec} "" "ckptd {version}" "{title}"']


def man_ckptd(ckptd, version, cmds):
    L = th("ckptd", 1, version, "User Commands")
    L += [".SH NAME", "ckptd \\- checkpoint agent beside training jobs",
          ".SH SYNOPSIS", ".B ckptd", ".I command", "[\\fIoptions\\fR] [\\fIargs\\fR]",
          ".SH DESCRIPTION"]
    for p in CKPTD_DESCRIPTION:
        L += [roff_text(p), ".PP"]
    L.pop()
    L += [".SH COMMANDS"]
    for name, summary in cmds:
        L += [".TP", f".B {name}", roff_text(summary)]
    for name, summary in cmds:
        L += [f'.SS "ckptd {name}"'] + roff_verbatim(out_of([ckptd, name, "--help"]))
    L += [".SH EXIT STATUS", ".TP", ".B 0", "success", ".TP", ".B 1",
          "the work failed (the log says what and where); nothing already written was lost",
          ".TP", ".B 2", "usage or configuration error",
          ".TP", ".B 3", "another ckptd holds the lock on this directory",
          ".TP", ".B 4", roff_text("`ckptd verify` and `ckptd pack`: the model uses an op, "
                                  "attribute, mode or dtype ckptd does not compute"),
          ".SH FILES", ".TP", ".I DIR/ckptd.yaml", "the config (see \\fBckptd.yaml\\fR(5))",
          ".TP", ".I DIR/.ckptd/", "the state: hash cache, upload queue, webhook outbox",
          ".TP", ".I /etc/ckptd/ckptd.env",
          "secrets for the systemd unit and the cron example, as NAME=value lines",
          ".TP", ".I /usr/share/doc/ckptd/", "the reference (docs/) and examples",
          ".SH SEE ALSO", "\\fBmldef\\fR(1), \\fBckptd.yaml\\fR(5)"]
    return "\n".join(L) + "\n"


def man_mldef(mldef, version):
    L = th("mldef", 1, version, "User Commands")
    L += [".SH NAME", "mldef \\- create, check, sign and run .mldef deployment archives",
          ".SH SYNOPSIS", ".B mldef", "[\\fIoptions\\fR] \\fImanifest.json\\fR|\\fIfile.mldef\\fR",
          ".SH DESCRIPTION",
          roff_text("mldef is the archive tool installed beside ckptd: it creates an .mldef "
                    "from a manifest.json and the files beside it, checks every rule of the "
                    "format and lists each violation, signs and verifies signatures (Ed25519, "
                    "keys from `ckptd keygen`), and runs the archived model on test data on "
                    "the CPU."),
          ".SH OPTIONS"] + roff_verbatim(out_of([mldef, "--help"]))
    L += [".SH FILES", ".TP", ".I /usr/share/doc/ckptd/mldef.md", "the format and its rules",
          ".SH SEE ALSO", "\\fBckptd\\fR(1), \\fBckptd.yaml\\fR(5)"]
    return "\n".join(L) + "\n"


def man_config(version, rows):
    L = th("ckptd.yaml", 5, version, "File Formats")
    L += [".SH NAME", "ckptd.yaml \\- ckptd configuration", ".SH DESCRIPTION"]
    for p in CONFIG_INTRO:
        L += [roff_text(p), ".PP"]
    L.pop()
    L += [".SH KEYS"]
    for top, ks in sections(rows):
        L += [f'.SS "{roff_text(SECTION_TITLES.get(top, top))}"']
        for key, meaning in ks:
            L += [".TP", f".B {roff_text(key)}", roff_text(meaning)]
    L += [".SH EXAMPLE"] + roff_verbatim(
        "model:\n  name: resnet50\nwatch:\n  settle: 200ms\nupload:\n  stores:\n"
        "    - url: s3://models/resnet50\n      profile: ml-uploads\n"
        "hooks:\n  webhooks:\n    - url: https://hooks.example.com/ckptd\n"
        "      secret: env:CKPTD_WEBHOOK_SECRET\n")
    L += [".SH FILES", ".TP", ".I /usr/share/doc/ckptd/examples/ckptd.example.yaml",
          "every key, commented",
          ".SH SEE ALSO", "\\fBckptd\\fR(1), \\fBmldef\\fR(1)"]
    return "\n".join(L) + "\n"


# ---- Markdown ----

GENERATED = ("<!-- Generated by scripts/gendocs.py from the binary's tables at build time; "
             "a test checks this file equals what it writes. Edit the tables, not this file. -->")


def md_cell(s):
    return s.replace("|", "\\|")


def md_config(rows):
    L = ["# Configuration reference", "", GENERATED, ""]
    for p in CONFIG_INTRO:
        L += [p, ""]
    L += ["An example with every key, commented: "
          "[contrib/ckptd.example.yaml](../contrib/ckptd.example.yaml). "
          "The same list as a man page: `man 5 ckptd.yaml`.", ""]
    for top, ks in sections(rows):
        L += [f"## {SECTION_TITLES.get(top, top)}", "", "| key | meaning |", "|---|---|"]
        L += [f"| `{k}` | {md_cell(m)} |" for k, m in ks]
        L.append("")
    return "\n".join(L)


def md_commands(ckptd, mldef, cmds):
    L = ["# Commands", "", GENERATED, "",
         "Each command's `--help`, as the binary prints it (`man ckptd` has the same). "
         "Every command takes `--help`, `-c/--config FILE`, `--log-format text|json`, "
         "`-v` and `-q`.", "",
         "| command | what it does |", "|---|---|"]
    L += [f"| [`ckptd {n}`](#ckptd-{n}) | {md_cell(s)} |" for n, s in cmds]
    L += ["| [`mldef`](#mldef) | create, check, sign and run .mldef deployment archives |", ""]
    for n, _ in cmds:
        L += [f"## ckptd {n}", "", "```text", out_of([ckptd, n, "--help"]).rstrip("\n"), "```", ""]
    L += ["## mldef", "", "```text", out_of([mldef, "--help"]).rstrip("\n"), "```", ""]
    return "\n".join(L)


def write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[-1])
    ckptd, mldef, outdir = sys.argv[1:]
    version = out_of([ckptd, "--version"]).split()[-1]
    cmds = commands(ckptd)
    rows = keys(ckptd)
    os.makedirs(outdir, exist_ok=True)
    write(os.path.join(outdir, "ckptd.1"), man_ckptd(ckptd, version, cmds))
    write(os.path.join(outdir, "mldef.1"), man_mldef(mldef, version))
    write(os.path.join(outdir, "ckptd.yaml.5"), man_config(version, rows))
    write(os.path.join(outdir, "configuration.md"), md_config(rows))
    write(os.path.join(outdir, "commands.md"), md_commands(ckptd, mldef, cmds))


if __name__ == "__main__":
    main()
