"""Real servers on loopback for the end-to-end tests: S3 (@20minutes/s3rver
under node), nginx with WebDAV, sshd for SFTP, and a small scripted HTTP
proxy (fails the first requests, then forwards). Each picks a free port at
run time, is stopped by its PID, and raises unittest.SkipTest with the reason
when its program is missing. Secrets go through environment variables and
0600 files, never through command lines.

    with S3Server(tmp) as s3: ...   s3.endpoint, s3.bucket, s3.key_id, s3.secret
    RgwServer(tmp): Ceph's RADOS Gateway (the rgw.start ctest fixture), a bucket per test
    with Nginx(tmp, users={"u": "p"}) as web: ...   web.url, web.root
    with Sshd(tmp) as ssh: ...      ssh.url(path), ssh.key, ssh.host_key_sha256
    with FlakyProxy(upstream, [500, 503]) as p: ...  p.url, p.requests
"""
import base64
import hashlib
import http.client
import http.server
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import unittest
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout=20, what="server"):
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout}s")


def need(path_or_name, why):
    found = shutil.which(path_or_name) if "/" not in path_or_name else (
        path_or_name if os.path.exists(path_or_name) else None)
    if not found:
        raise unittest.SkipTest(f"{why}: '{path_or_name}' is not installed")
    return found


class _Process:
    """A child process stopped by its own PID (SIGTERM, then SIGKILL)."""
    proc = None
    log = None

    # Servers start in their own session (start_new_session=True), so their
    # process group id is their PID: signalling the group reaches the workers
    # (nginx's, sshd's children) too.

    def _signal(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(timeout=5)
        if self.proc:
            self._signal(signal.SIGKILL)  # stray children of the group
        if self.log:
            self.log.close()
            self.log = None

    def kill(self):
        """Makes the server disappear at once (a crash), workers included."""
        if self.proc and self.proc.poll() is None:
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


_S3RVER_JS = r"""
const S3rver = require('@20minutes/s3rver');
const { DUMMY_ACCOUNT } = require('@20minutes/s3rver/lib/models/account');
DUMMY_ACCOUNT.revokeAccessKey('S3RVER');
DUMMY_ACCOUNT.createKeyPair(process.env.S3_KEY_ID, process.env.S3_SECRET);
new S3rver({
  address: '127.0.0.1', port: Number(process.env.S3_PORT), silent: false,
  directory: process.env.S3_DIR, configureBuckets: [{ name: process.env.S3_BUCKET }],
}).run().then(() => console.log('listening'), (e) => { console.error(e); process.exit(1); });
"""


class S3Server(_Process):
    """@20minutes/s3rver with its own key pair; it rejects a wrong secret
    (403 SignatureDoesNotMatch). Path-style addressing only."""

    def __init__(self, tmp, bucket="ckpt", port=None):
        node = need("node", "S3 tests need node")
        mod = os.path.join(HERE, "node_modules", "@20minutes", "s3rver")
        if not os.path.isdir(mod):
            raise unittest.SkipTest("S3 tests need @20minutes/s3rver: run 'npm ci' in tests/lib")
        self.dir = os.path.join(tmp, "s3data")
        os.makedirs(self.dir, exist_ok=True)
        self.bucket = bucket
        self.key_id = "CKPTDTEST" + secrets.token_hex(4).upper()
        self.secret = secrets.token_urlsafe(30)
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        script = os.path.join(tmp, "s3rver.js")
        with open(script, "w") as f:
            f.write(_S3RVER_JS)
        env = dict(os.environ, NODE_PATH=os.path.join(HERE, "node_modules"),
                   S3_KEY_ID=self.key_id, S3_SECRET=self.secret, S3_PORT=str(self.port),
                   S3_DIR=self.dir, S3_BUCKET=bucket)
        self.log = open(os.path.join(tmp, "s3rver.log"), "ab")
        self.proc = subprocess.Popen([node, script], env=env, stdout=self.log, stderr=self.log,
                                     cwd=HERE, start_new_session=True)
        try:
            wait_port(self.port, self.proc, what="s3rver")
        except Exception:
            self.stop()
            raise
        self.tmp = tmp

    def env(self):
        """Environment for ckptd (AWS_* variables) and the aws CLI."""
        cfg = os.path.join(self.tmp, "aws-config")
        with open(cfg, "w") as f:
            f.write("[default]\nregion = us-east-1\ns3 =\n    addressing_style = path\n")
        return {"AWS_ACCESS_KEY_ID": self.key_id, "AWS_SECRET_ACCESS_KEY": self.secret,
                "AWS_CONFIG_FILE": cfg, "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_SHARED_CREDENTIALS_FILE": os.path.join(self.tmp, "no-credentials")}

    def credentials_file(self, path, secret=None):
        """An AWS credentials file, mode 0600."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"[default]\naws_access_key_id = {self.key_id}\n"
                    f"aws_secret_access_key = {secret or self.secret}\n")
        return path

    def aws(self, *args, check=True):
        """Runs Debian's aws CLI against this server (credentials in the environment)."""
        aws = need("aws", "checking S3 uploads needs awscli")
        e = dict(os.environ, **self.env())
        p = subprocess.run([aws, "--endpoint-url", self.endpoint, *args], env=e,
                           capture_output=True, text=True, timeout=120)
        if check and p.returncode != 0:
            raise AssertionError(f"aws {' '.join(args)}: {p.returncode}\n{p.stderr}")
        return p

    def get(self, key, dest):
        """Downloads s3://bucket/key with the aws CLI into dest."""
        self.aws("s3", "cp", "--no-progress", f"s3://{self.bucket}/{key}", dest)
        with open(dest, "rb") as f:
            return f.read()

    def keys(self):
        p = self.aws("s3api", "list-objects-v2", "--bucket", self.bucket, "--output", "json")
        import json
        out = json.loads(p.stdout or "{}")
        return sorted(o["Key"] for o in out.get("Contents", []))

    def _log(self):
        with open(os.path.join(self.tmp, "s3rver.log"), "rb") as f:
            return f.read().decode("utf-8", "replace")

    def parts_put(self, key=None):
        """Part numbers s3rver stored (UploadPart accepted), in order. Its log
        does not name the object of a part: every part of the test's
        multipart uploads (the tests make one at a time), whatever key."""
        import re
        return [int(n) for n in re.findall(r"Stored part (\d+) of \w+ in bucket", self._log())]

    def requests(self):
        """Every request RGW logged on this test's bucket, its objects'
        (/bucket/key) and the bucket's own (/bucket?list-type=2...: the
        listings): (method, path, status)."""
        b = urllib.parse.quote(f"/{self.bucket}")
        return self._logged(b + "/", b + "?")

    def stored_order(self):
        """Keys of the objects stored (PUT or CompleteMultipartUpload), in order."""
        import re
        return re.findall(r'Stored object "([^"]+)" in bucket', self._log())


class RgwServer:
    """Ceph's RADOS Gateway, a production S3 implementation, started once
    per test run by tests/lib/rgw.sh (the ctest fixture rgw.start: its
    folder is CK_RGW_DIR). Each test gets a bucket of its own. Without the
    fixture: SkipTest, except under CI (CI=true), where a missing RGW fails."""

    def __init__(self, tmp):
        d = os.environ.get("CK_RGW_DIR", "")
        if not d or not os.path.exists(os.path.join(d, "endpoint")):
            msg = "RGW tests need the rgw.start fixture (ceph-mon, ceph-osd, ceph-mgr, radosgw)"
            if os.environ.get("CI"):
                raise AssertionError(msg + ": RGW is not running under CI")
            raise unittest.SkipTest(msg)
        self.dir = d
        with open(os.path.join(d, "endpoint")) as f:
            self.endpoint = f.read().strip()
        with open(os.path.join(d, "keys")) as f:
            self.key_id, self.secret = f.read().split()
        self.tmp = tmp
        self.bucket = "ckpt-" + secrets.token_hex(6)
        self.aws("s3api", "create-bucket", "--bucket", self.bucket)

    def env(self):
        # in the run's RGW folder: the bucket's removal outlives the test's folder
        cfg = os.path.join(self.dir, "aws-config")
        if not os.path.exists(cfg):
            with open(cfg + f".{os.getpid()}", "w") as f:
                f.write("[default]\nregion = us-east-1\ns3 =\n    addressing_style = path\n")
            os.replace(cfg + f".{os.getpid()}", cfg)
        return {"AWS_ACCESS_KEY_ID": self.key_id, "AWS_SECRET_ACCESS_KEY": self.secret,
                "AWS_CONFIG_FILE": cfg, "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_SHARED_CREDENTIALS_FILE": os.path.join(self.dir, "no-credentials")}

    aws = S3Server.aws
    get = S3Server.get
    keys = S3Server.keys
    credentials_file = S3Server.credentials_file

    @property
    def port(self):
        return int(self.endpoint.rsplit(":", 1)[1])

    def _logged(self, *prefixes):
        """RGW's access log lines whose path starts with one of prefixes:
        (method, path, status)."""
        import re
        with open(os.path.join(self.dir, "log", "client.rgw.a.log"), errors="replace") as f:
            text = f.read()
        return [(m.group(1), m.group(2), int(m.group(3))) for m in re.finditer(
            r'"(PUT|POST|GET|HEAD|DELETE) ([^ "]+) HTTP/1\.1" (\d+) ', text)
            if m.group(2).startswith(prefixes)]

    def _access_log(self):
        """This test's bucket's objects' lines of RGW's access log."""
        return self._logged(urllib.parse.quote(f"/{self.bucket}/"))

    def requests(self):
        """Every request RGW logged on this test's bucket, its objects'
        (/bucket/key) and the bucket's own (/bucket?list-type=2...: the
        listings): (method, path, status)."""
        b = urllib.parse.quote(f"/{self.bucket}")
        return self._logged(b + "/", b + "?")

    def stored_order(self):
        """Keys of the objects stored (a PUT without a query, or a
        CompleteMultipartUpload, answered 200), in the order RGW logged their
        ends."""
        prefix = len(urllib.parse.quote(f"/{self.bucket}/"))
        out = []
        for method, path, status in self._access_log():
            key, _, query = path.partition("?")
            done = (method == "PUT" and not query) or (
                method == "POST" and query.startswith("uploadId="))
            if done and status == 200:
                out.append(urllib.parse.unquote(key[prefix:]))
        return out

    def parts_put(self, key=None):
        """Part numbers RGW accepted (UploadPart answered 200) for bucket/key
        (any key of the test's bucket when None), in the order of its log."""
        import re
        want = urllib.parse.quote(f"/{self.bucket}/{key}") if key is not None else None
        out = []
        for method, path, status in self._access_log():
            obj, _, query = path.partition("?")
            m = re.match(r"partNumber=(\d+)&uploadId=", query)
            if method == "PUT" and m and status == 200 and (want is None or obj == want):
                out.append(int(m.group(1)))
        return out

    def uploads_in_progress(self):
        """(key, upload id) of every multipart upload RGW holds unfinished
        in the test's bucket (ListMultipartUploads, through aws-cli)."""
        p = self.aws("s3api", "list-multipart-uploads", "--bucket", self.bucket,
                     "--output", "json")
        doc = json.loads(p.stdout) if p.stdout.strip() else {}
        return sorted((u["Key"], u["UploadId"]) for u in doc.get("Uploads") or [])

    def stop(self):
        self.aws("s3", "rb", "--force", f"s3://{self.bucket}", check=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


_NGINX_CONF = """
user root;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
load_module /usr/lib/nginx/modules/ngx_http_dav_ext_module.so;
events {{ worker_connections 256; }}
http {{
    # combined, and the connection's serial number (tests count connections)
    log_format ck '$remote_addr - $remote_user [$time_local] "$request" $status '
                  '$body_bytes_sent "$http_referer" "$http_user_agent" conn=$connection';
    access_log {dir}/access.log ck;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    client_max_body_size 0;
    sendfile on;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{
            dav_methods PUT DELETE MKCOL COPY MOVE;
            dav_ext_methods PROPFIND OPTIONS;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
            {auth}
        }}
    }}
}}
"""


class Nginx(_Process):
    """nginx with PUT/DELETE/MKCOL/COPY/MOVE (and PROPFIND) on root; basic
    auth when users is given (a {PLAIN} password file, mode 0600)."""

    def __init__(self, tmp, users=None, port=None):
        nginx = need("/usr/sbin/nginx", "HTTP PUT tests need nginx")
        self.dir = os.path.join(tmp, "nginx")
        self.root = os.path.join(tmp, "www")
        os.makedirs(self.dir, exist_ok=True)
        os.makedirs(self.root, exist_ok=True)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        auth = ""
        if users:
            pw = os.path.join(self.dir, "htpasswd")
            fd = os.open(pw, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                for u, p in users.items():
                    f.write(f"{u}:{{PLAIN}}{p}\n")
            auth = f'auth_basic "ckptd"; auth_basic_user_file {pw};'
        modfile = "/usr/lib/nginx/modules/ngx_http_dav_ext_module.so"
        conf = _NGINX_CONF.format(dir=self.dir, port=self.port, root=self.root, auth=auth)
        if not os.path.exists(modfile):
            conf = conf.replace(f"load_module {modfile};", "").replace(
                "dav_ext_methods PROPFIND OPTIONS;", "")
        with open(os.path.join(self.dir, "nginx.conf"), "w") as f:
            f.write(conf)
        self.log = open(os.path.join(self.dir, "stderr.log"), "ab")
        self.proc = subprocess.Popen([nginx, "-p", self.dir, "-c", os.path.join(self.dir, "nginx.conf"),
                                      "-e", "stderr", "-g", "daemon off;"],
                                     stdout=self.log, stderr=self.log, start_new_session=True)
        try:
            wait_port(self.port, self.proc, what="nginx")
        except Exception:
            self.stop()
            raise

    def stop(self):
        # nginx's master stops its workers on SIGTERM (QUIT would wait for clients)
        super().stop()


class Sshd(_Process):
    """sshd on loopback with ed25519 host and client keys (libssh2 1.10 in
    libcurl cannot sign with RSA SHA-2), key authentication only."""

    def __init__(self, tmp, port=None):
        sshd = need("/usr/sbin/sshd", "SFTP tests need openssh-server")
        keygen = need("ssh-keygen", "SFTP tests need ssh-keygen")
        self.dir = os.path.join(tmp, "sshd")
        os.makedirs(self.dir, exist_ok=True)
        os.makedirs("/run/sshd", exist_ok=True)
        self.port = port or free_port()
        hk = os.path.join(self.dir, "host_ed25519")
        self.key = os.path.join(self.dir, "client_ed25519")
        for k in (hk, self.key):
            if not os.path.exists(k):
                subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", k], check=True)
        shutil.copy(self.key + ".pub", os.path.join(self.dir, "authorized_keys"))
        fp = subprocess.run([keygen, "-l", "-E", "sha256", "-f", hk + ".pub"], check=True,
                            capture_output=True, text=True).stdout.split()[1]
        self.host_key_sha256 = fp  # "SHA256:..."
        conf = os.path.join(self.dir, "sshd_config")
        sftp_server = "/usr/lib/openssh/sftp-server"
        with open(conf, "w") as f:
            f.write(f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {hk}\n"
                    f"PidFile {self.dir}/sshd.pid\nAuthorizedKeysFile {self.dir}/authorized_keys\n"
                    "StrictModes no\nUsePAM no\nPasswordAuthentication no\n"
                    "KbdInteractiveAuthentication no\nPermitRootLogin yes\n"
                    f"Subsystem sftp {sftp_server}\n")
        self.log = open(os.path.join(self.dir, "sshd.log"), "ab")
        self.proc = subprocess.Popen([sshd, "-D", "-e", "-f", conf], stdout=self.log,
                                     stderr=self.log, start_new_session=True)
        try:
            wait_port(self.port, self.proc, what="sshd")
        except Exception:
            self.stop()
            raise

    def url(self, path):
        user = os.environ.get("USER") or "root"
        return f"sftp://{user}@127.0.0.1:{self.port}{path}"


class AwsChecksums:
    """A FlakyProxy respond hook that makes s3rver answer as AWS does for a
    bucket with SSE-KMS encryption: ETags that are not the MD5 of the body
    (PutObject and HEAD), and the x-amz-checksum-sha256 a body came with,
    checked against the body and kept: on the PutObject and UploadPart
    answers, and on a HEAD with x-amz-checksum-mode: ENABLED (a single PUT's
    own, a multipart object's composite "base64(sha256(part sha256s))-N").
    damage=True answers HEADs with the checksum of other bytes (the stored
    object differs). puts lists (key, had Content-MD5) of every PutObject."""

    def __init__(self, damage=False):
        self.damage = damage
        self.lock = threading.Lock()
        self.objects = {}  # key -> base64 checksum
        self.parts = {}    # upload id -> {part number: raw sha256}
        self.puts = []
        self.heads_with_checksum = 0

    def __call__(self, method, path, headers, body, status, answer):
        target, _, query = path.partition("?")
        key = urllib.parse.unquote(target.split("/", 2)[2]) if target.count("/") >= 2 else ""
        q = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        sent = headers.get("x-amz-checksum-sha256")
        raw = hashlib.sha256(body).digest()
        out = [(k, v) for k, v in answer if k.lower() != "etag"]
        etag = next((v for k, v in answer if k.lower() == "etag"), None)
        with self.lock:
            if method == "PUT" and status == 200 and "uploadId" not in q:
                self.puts.append((key, "Content-MD5" in headers))
                if sent:
                    if base64.b64decode(sent) != raw:
                        raise AssertionError(f"{key}: a checksum that is not its body's")
                    self.objects[key] = sent
                    out.append(("x-amz-checksum-sha256", sent))
            elif method == "PUT" and status == 200 and sent:
                self.parts.setdefault(q["uploadId"], {})[int(q["partNumber"])] = raw
                out.append(("x-amz-checksum-sha256", sent))
            elif method == "POST" and status == 200 and "uploadId" in q:
                ps = self.parts.pop(q["uploadId"], {})
                comp = hashlib.sha256(b"".join(ps[n] for n in sorted(ps))).digest()
                self.objects[key] = base64.b64encode(comp).decode() + f"-{len(ps)}"
            elif method == "HEAD" and status == 200 and key in self.objects and \
                    headers.get("x-amz-checksum-mode") == "ENABLED":
                self.heads_with_checksum += 1
                got = self.objects[key]
                if self.damage:
                    got = base64.b64encode(hashlib.sha256(got.encode()).digest()).decode()
                out.append(("x-amz-checksum-sha256", got))
        if etag is not None:
            # an SSE-KMS ETag: not the MD5 of the data (the parts' ETags are left
            # alone: s3rver checks them at CompleteMultipartUpload)
            if method in ("HEAD", "POST") or "uploadId" not in q:
                etag = '"' + hashlib.md5(b"kms:" + etag.encode()).hexdigest() + '"'
            out.append(("ETag", etag))
        return out


class FlakyProxy:
    """An HTTP proxy on loopback that answers the first requests with the
    scripted statuses (optionally with Retry-After) and forwards the rest to
    upstream (host, port) unchanged, Host header included (so SigV4
    signatures stay valid). requests lists (method, path, status) seen."""

    def __init__(self, upstream_port, statuses, retry_after=None, fail_methods=None, gate=None,
                 rewrite=None, respond=None):
        # gate(method, path, headers) -> None to go on, or (status, body) to answer instead
        self.gate = gate
        # rewrite(method, path, body) -> the body forwarded (a damaging network or server)
        self.rewrite = rewrite
        # respond(method, path, request headers, body, status, [(name, value)]) -> the
        # answer's headers (a service that answers differently, e.g. AwsChecksums)
        self.respond = respond
        self.statuses = list(statuses)
        self.retry_after = retry_after
        self.fail_methods = fail_methods
        self.requests = []
        self.headers = []  # (method, path, request headers) of forwarded requests
        self.timeline = []  # (method, path, start, end) of forwarded requests, monotonic seconds
        self.inflight = self.max_inflight = 0  # forwarded requests being served at once
        self.puts = self.max_puts = 0  # of which PUTs (bodies: objects, parts)
        self.clients = set()  # (host, port) of every client connection a request came on
        self.lock = threading.Lock()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _handle(self):
                # counted from the request's arrival, its body included
                self.t0 = time.monotonic()
                put = self.command == "PUT"
                with outer.lock:
                    outer.clients.add(self.client_address)
                    outer.inflight += 1
                    outer.max_inflight = max(outer.max_inflight, outer.inflight)
                    outer.puts += put
                    outer.max_puts = max(outer.max_puts, outer.puts)
                try:
                    self._serve()
                finally:
                    with outer.lock:
                        outer.inflight -= 1
                        outer.puts -= put

            def _serve(self):
                # the gate decides on the headers, as S3 does before the body arrives
                refused = outer.gate(self.command, self.path, self.headers) if outer.gate else None
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                if refused:
                    with outer.lock:
                        outer.requests.append((self.command, self.path, refused[0]))
                    self.send_response(refused[0])
                    self.send_header("Content-Length", str(len(refused[1])))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(refused[1])
                    return
                with outer.lock:
                    scripted = None
                    if outer.statuses and (not outer.fail_methods or
                                           self.command in outer.fail_methods):
                        scripted = outer.statuses.pop(0)
                if scripted:
                    with outer.lock:
                        outer.requests.append((self.command, self.path, scripted))
                    msg = b"<Error><Code>SlowDown</Code></Error>" if scripted == 503 else b"scripted"
                    self.send_response(scripted)
                    if outer.retry_after is not None:
                        self.send_header("Retry-After", str(outer.retry_after))
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                if outer.rewrite:
                    body = outer.rewrite(self.command, self.path, body)
                c = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("connection", "content-length", "expect")}
                if n or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                c.request(self.command, self.path, body=body if (n or self.command in ("PUT", "POST")) else None,
                          headers=headers, encode_chunked=False)
                r = c.getresponse()
                data = r.read()
                with outer.lock:
                    outer.requests.append((self.command, self.path, r.status))
                    outer.headers.append((self.command, self.path, dict(self.headers.items())))
                self.send_response(r.status)
                answer = r.getheaders()
                if outer.respond:
                    answer = outer.respond(self.command, self.path, self.headers, body, r.status,
                                           answer)
                for k, v in answer:
                    if k.lower() not in ("connection", "transfer-encoding", "content-length",
                                         "keep-alive", "date", "server"):
                        self.send_header(k, v)
                # a HEAD answer keeps the upstream's Content-Length (the stored size)
                length = r.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                c.close()
                with outer.lock:
                    outer.timeline.append((self.command, self.path, self.t0, time.monotonic()))

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_MOVE = do_MKCOL = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
