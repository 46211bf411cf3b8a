"""A webhook receiver for the tests: a few lines of http.server that append
each request (method, path, headers, body) to a JSON-lines file and answer
with a scripted sequence of statuses, then 200.

Run as a process (so that a test can kill ckptd, or the receiver, at will):
    webhook_receiver.py PORT LOGFILE [--statuses 500,503,200] [--slow S] [--huge BYTES]

--slow S      the first request waits S seconds before its answer (logged on arrival)
--huge BYTES  answers with a body of that many bytes (streamed, never held)

verify() checks a Standard Webhooks signature with Python's hmac, written
from the spec (https://www.standardwebhooks.com/), independently of ckptd.
"""
import base64
import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def signatures(secret, msg_id, timestamp, body):
    """The v1 signature of body under a whsec_ secret."""
    key = base64.b64decode(secret[len("whsec_"):]) if secret.startswith("whsec_") else secret
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify(secret, headers, body, tolerance=300):
    """True when one of the space-separated webhook-signature entries is the
    v1 signature of body under secret and the timestamp is recent."""
    h = {k.lower(): v for k, v in headers.items()}
    msg_id, ts, sig = h.get("webhook-id"), h.get("webhook-timestamp"), h.get("webhook-signature")
    if not (msg_id and ts and sig) or abs(time.time() - int(ts)) > tolerance:
        return False
    want = signatures(secret, msg_id, ts, body)
    return any(hmac.compare_digest(s, want) for s in sig.split(" "))


def serve(port, log_path, statuses, slow, huge):
    lock = threading.Lock()
    state = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                n = state["n"]
                state["n"] += 1
                status = statuses[n] if n < len(statuses) else 200
                with open(log_path, "a") as f:
                    f.write(json.dumps({"method": self.command, "path": self.path,
                                        "headers": dict(self.headers.items()),
                                        "body": body.decode("utf-8", "replace"),
                                        "status": status, "time": time.time()}) + "\n")
                    f.flush()
            if slow and n == 0:
                time.sleep(slow)
            try:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                if huge:
                    self.send_header("Content-Length", str(huge))
                    self.end_headers()
                    chunk, left = b"x" * 65536, huge
                    while left > 0:
                        self.wfile.write(chunk[:left])
                        left -= len(chunk)
                else:
                    msg = f"status {status}\n".encode()
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client hung up: exactly what a bounded client does

    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    srv.serve_forever()


class Receiver:
    """The receiver as a child process; stopped by its own PID."""

    def __init__(self, tmp, statuses=(), slow=0, huge=0, port=None):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = port or s.getsockname()[1]
        self.log_path = os.path.join(tmp, f"receiver-{self.port}.jsonl")
        open(self.log_path, "w").close()
        args = [sys.executable, os.path.abspath(__file__), str(self.port), self.log_path,
                "--statuses", ",".join(map(str, statuses)) or "200", "--slow", str(slow),
                "--huge", str(huge)]
        self.proc = subprocess.Popen(args)
        end = time.time() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if time.time() > end or self.proc.poll() is not None:
                    raise RuntimeError("webhook receiver did not start")
                time.sleep(0.05)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/hook"

    def requests(self):
        with open(self.log_path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def wait_requests(self, n, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            r = self.requests()
            if len(r) >= n:
                return r
            time.sleep(0.05)
        return self.requests()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("log")
    ap.add_argument("--statuses", default="200")
    ap.add_argument("--slow", type=float, default=0)
    ap.add_argument("--huge", type=int, default=0)
    a = ap.parse_args()
    serve(a.port, a.log, [int(s) for s in a.statuses.split(",") if s], a.slow, a.huge)
