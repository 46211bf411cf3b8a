"""The remote copy of a PMF tree is a valid PMF tree, and only the tree
(issue 17): `ckptd upload RUN DEST` of a registered training folder, for
every store kind, then the copy is downloaded with an independent client
(aws s3 cp --recursive, a WebDAV PROPFIND walk with http.client, OpenSSH's
sftp, cp -r) and checked with the PMF validator written from the spec
(tests/lib/pmf_validate.py, strict: MD5s included). The trainer's own files
beside the tree and .ckptd/ must not be there; data/initialisation/ must be.
"""
import hashlib
import http.client
import os
import subprocess
import sys
import unittest
import urllib.parse
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptd_test import TmpDirCase, run, write_old  # noqa: E402
from servers import Nginx, RgwServer, S3Server, Sshd, need  # noqa: E402

VALIDATOR = os.path.join(HERE, "..", "lib", "pmf_validate.py")


def files_under(root):
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def propfind_download(base_url, path, dest):
    """Walks a WebDAV collection with PROPFIND (Depth: 1) and GETs every file."""
    u = urllib.parse.urlsplit(base_url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    todo = [path.rstrip("/") + "/"]
    while todo:
        col = todo.pop()
        c.request("PROPFIND", urllib.parse.quote(col), headers={"Depth": "1"})
        r = c.getresponse()
        body = r.read()
        if r.status != 207:
            raise AssertionError(f"PROPFIND {col}: {r.status}")
        for resp in ET.fromstring(body).findall("{DAV:}response"):
            href = urllib.parse.unquote(urllib.parse.urlsplit(resp.find("{DAV:}href").text).path)
            if href.rstrip("/") == col.rstrip("/"):
                continue
            is_col = resp.find(".//{DAV:}resourcetype/{DAV:}collection") is not None
            rel = href[len(path.rstrip("/")) + 1:]
            if is_col:
                os.makedirs(os.path.join(dest, rel), exist_ok=True)
                todo.append(href if href.endswith("/") else href + "/")
            else:
                c.request("GET", urllib.parse.quote(href))
                g = c.getresponse()
                data = g.read()
                if g.status != 200:
                    raise AssertionError(f"GET {href}: {g.status}")
                os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                with open(os.path.join(dest, rel), "wb") as f:
                    f.write(data)
    c.close()


class RemoteTree(TmpDirCase):
    def setUp(self):
        super().setUp()
        self.train = os.path.join(self.dir, "train")
        for e in (1, 2):
            write_old(os.path.join(self.train, "ckpts", f"epoch_{e}.pt"), os.urandom(200000 + e))
        write_old(os.path.join(self.train, "hparams.yaml"), b"lr: 0.01\n")
        # the trainer's own copy of a checkpoint (the same bytes as data/checkpoints/)
        write_old(os.path.join(self.train, "checkpoint-40", "model.bin"), os.urandom(1000))
        run("scan", self.train, check=0)
        # a deployment archive, as the packers leave them
        write_old(os.path.join(self.train, "data", "deploy", "model.mldef.tar"), os.urandom(5000))
        self.assertTrue(os.path.isdir(os.path.join(self.train, ".ckptd")))
        self.validate(self.train)
        self.state = os.path.join(self.dir, "state")

    def validate(self, tree):
        p = subprocess.run(["/usr/bin/python3", VALIDATOR, tree], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 0, f"{tree}: {p.stdout}{p.stderr}")

    def expected(self):
        """The PMF tree's files: everything but the trainer's files and .ckptd/."""
        return {k: v for k, v in files_under(self.train).items()
                if not k.startswith((".ckptd/", "ckpts/", "checkpoint-40/"))}

    def check(self, got):
        self.validate(got)
        want = self.expected()
        self.assertEqual(files_under(got), want)
        self.assertIn("data/initialisation/README.md", want)
        self.assertIn("data/deploy/model.mldef.tar", want)
        # the local tree got the same README and is still valid
        self.validate(self.train)

    def upload(self, *args, env=None):
        p = run("upload", "--state", self.state, "--no-progress", *args, env=env, check=0,
                timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_s3(self):
        need("aws", "checking S3 uploads needs awscli")
        with S3Server(self.dir) as s3:
            self.upload("--endpoint", s3.endpoint, self.train, "s3://ckpt/runs/r1", env=s3.env())
            got = os.path.join(self.dir, "got")
            s3.aws("s3", "cp", "--recursive", "--no-progress", "s3://ckpt/runs/r1", got)
            self.check(got)

    def test_s3_rgw(self):
        """The same tree to Ceph's RGW (a production S3), read back with aws-cli."""
        need("aws", "checking S3 uploads needs awscli")
        rgw = RgwServer(self.dir)
        self.addCleanup(rgw.stop)
        url = f"s3://{rgw.bucket}/runs/r1"
        self.upload("--endpoint", rgw.endpoint, self.train, url, env=rgw.env())
        got = os.path.join(self.dir, "got")
        rgw.aws("s3", "cp", "--recursive", "--no-progress", url, got)
        self.check(got)
        # metadata.yaml was the last object stored
        order = rgw.stored_order()
        self.assertEqual(order[-1], "runs/r1/metadata.yaml", order)

    def test_webdav(self):
        with Nginx(self.dir) as web:
            self.upload(self.train, web.url + "/models/r1")
            got = os.path.join(self.dir, "got")
            os.makedirs(got)
            propfind_download(web.url, "/models/r1", got)
            self.check(got)

    def test_sftp(self):
        need("sftp", "SFTP tests need the OpenSSH client")
        with Sshd(self.dir) as ssh:
            remote = os.path.join(self.dir, "remote")
            self.upload("--key", ssh.key, "--host-key", ssh.host_key_sha256, self.train,
                        ssh.url(remote))
            got = os.path.join(self.dir, "got")
            batch = os.path.join(self.dir, "batch")
            with open(batch, "w") as f:
                f.write(f'get -r "{remote}" "{got}"\n')
            subprocess.run(["sftp", "-q", "-b", batch, "-i", ssh.key, "-P", str(ssh.port),
                            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                            "root@127.0.0.1"], check=True, capture_output=True, timeout=60)
            self.check(got)

    def test_path(self):
        nfs = os.path.join(self.dir, "nfs")
        self.upload(self.train, "file://" + nfs)
        got = os.path.join(self.dir, "got")
        subprocess.run(["cp", "-r", nfs, got], check=True)
        self.check(got)


if __name__ == "__main__":
    unittest.main()
