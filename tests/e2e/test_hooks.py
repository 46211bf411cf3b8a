"""Webhooks and exec hooks, end to end: the real binary against a real
receiver on loopback (tests/lib/webhook_receiver.py), its signatures checked
by an independent implementation (Python's hmac, written from the spec)."""
import base64
import json
import os
import resource
import signal
import subprocess
import sys
import time
import unittest

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from ckptd_test import CKPTD, TmpDirCase, run, write_old  # noqa: E402
from webhook_receiver import Receiver, verify  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SECRET_A = "whsec_" + base64.b64encode(os.urandom(32)).decode()
SECRET_B = "whsec_" + base64.b64encode(os.urandom(24)).decode()
ENV = {"CK_WH_A": SECRET_A, "CK_WH_B": SECRET_B}


def no_secret_in(test, *texts):
    for t in texts:
        for s in (SECRET_A, SECRET_B, SECRET_A[6:], SECRET_B[6:]):
            test.assertNotIn(s, t)


def gone(pid):
    """The process has exited (absent, or a zombie waiting for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return ") Z " in f.read()
    except FileNotFoundError:
        return True


class HookCase(TmpDirCase):
    def config(self, text):
        with open(os.path.join(self.dir, "ckptd.yaml"), "w") as f:
            f.write(text)

    def receiver(self, **kw):
        r = Receiver(self.dir, **kw)
        self.addCleanup(r.stop)
        return r

    def emit(self, type_, *sets, check=0, env=ENV, timeout=60):
        args = ["hooks", "emit", type_, self.dir]
        for s in sets:
            args += ["--set", s]
        p = run(*args, env=env, check=check, timeout=timeout)
        no_secret_in(self, p.stdout, p.stderr)
        return p


class Webhooks(HookCase):
    def test_signature_checked_independently(self):
        r = self.receiver()
        self.config(f"""
model: {{name: resnet-18}}
hooks:
  webhooks:
    - url: {r.url}
      secret: env:CK_WH_A
""")
        p = self.emit("checkpoint.registered", "checkpoint=e3", "epoch=3",
                      "path=data/checkpoints/epoch_3.pt", "md5=" + "a" * 32, "size=1234")
        event_id = p.stdout.strip()
        reqs = r.wait_requests(1)
        self.assertEqual(len(reqs), 1)
        q = reqs[0]
        h = {k.lower(): v for k, v in q["headers"].items()}
        self.assertEqual(q["method"], "POST")
        self.assertEqual(q["path"], "/hook")
        self.assertEqual(h["content-type"], "application/json")
        self.assertEqual(h["webhook-id"], event_id)
        self.assertRegex(event_id, r"^evt_[a-z2-7]{26}$")
        self.assertLess(abs(int(h["webhook-timestamp"]) - time.time()), 120)
        self.assertTrue(verify(SECRET_A, q["headers"], q["body"].encode()))
        self.assertFalse(verify(SECRET_B, q["headers"], q["body"].encode()))
        # a body changed by one byte does not verify
        self.assertFalse(verify(SECRET_A, q["headers"], q["body"].encode() + b" "))
        body = json.loads(q["body"])
        self.assertEqual(body["type"], "checkpoint.registered")
        self.assertEqual(body["id"], event_id)
        self.assertRegex(body["timestamp"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        d = body["data"]
        self.assertEqual(d["model"]["name"], "resnet-18")
        self.assertEqual(d["checkpoint"], {"reference": "e3", "epoch": 3,
                                           "path": "data/checkpoints/epoch_3.pt",
                                           "md5": "a" * 32, "size": 1234})
        self.assertEqual(os.path.realpath(d["dir"]), os.path.realpath(self.dir))
        no_secret_in(self, q["body"])

    def test_key_rotation_gives_one_signature_per_key(self):
        r = self.receiver()
        self.config(f"""
hooks:
  webhooks:
    - url: {r.url}
      secrets: [env:CK_WH_A, env:CK_WH_B]
""")
        self.emit("training.finished", "status=finished")
        q = r.wait_requests(1)[0]
        sigs = q["headers"]["webhook-signature"].split(" ")
        self.assertEqual(len(sigs), 2)
        body = q["body"].encode()
        for secret in (SECRET_A, SECRET_B):
            self.assertTrue(verify(secret, q["headers"], body))
            # each key's signature alone verifies: the receiver may know only one key
            one = dict(q["headers"])
            one["webhook-signature"] = sigs[0] if secret == SECRET_A else sigs[1]
            self.assertTrue(verify(secret, one, body))

    def test_retries_on_500_and_503_keep_the_id(self):
        r = self.receiver(statuses=[500, 503, 200])
        self.config(f"""
hooks:
  webhooks:
    - url: {r.url}
      secret: env:CK_WH_A
  retry_schedule: [0s, 0s, 0s]
""")
        p = self.emit("upload.completed", "store=s3", "remote_url=s3://b/m/e1.pt", "bytes=99")
        self.assertIn("webhook.attempt_failed", p.stderr)
        self.assertEqual(len(r.requests()), 1)  # one attempt per receiver per round
        p = run("hooks", "deliver", self.dir, "--wait", "30s", env=ENV, check=0)
        self.assertIn("pending 0", p.stdout)
        reqs = r.wait_requests(3)
        self.assertEqual([q["status"] for q in reqs], [500, 503, 200])
        ids = {q["headers"]["webhook-id"] for q in reqs}
        self.assertEqual(len(ids), 1)
        for q in reqs:
            self.assertTrue(verify(SECRET_A, q["headers"], q["body"].encode()))
        self.assertEqual(len({q["body"] for q in reqs}), 1)
        # delivered: another pass sends nothing
        run("hooks", "deliver", self.dir, env=ENV, check=0)
        self.assertEqual(len(r.requests()), 3)

    def test_dedup_by_id_and_replay(self):
        r = self.receiver()
        self.config(f"""
hooks:
  webhooks:
    - url: {r.url}
      secret: env:CK_WH_A
""")
        ids = [self.emit("checkpoint.registered", f"checkpoint=e{i}").stdout.strip()
               for i in range(2)]
        p = run("hooks", "replay", ids[0], self.dir, env=ENV, check=0)
        self.assertIn("1 accepted", p.stdout)
        reqs = r.wait_requests(3)
        self.assertEqual([q["headers"]["webhook-id"] for q in reqs], [ids[0], ids[1], ids[0]])
        # a receiver that keeps the ids it has seen processes each event once
        seen, processed = set(), []
        for q in reqs:
            self.assertTrue(verify(SECRET_A, q["headers"], q["body"].encode()))
            if q["headers"]["webhook-id"] not in seen:
                seen.add(q["headers"]["webhook-id"])
                processed.append(json.loads(q["body"])["data"]["checkpoint"]["reference"])
        self.assertEqual(processed, ["e0", "e1"])
        p = run("hooks", "replay", "evt_doesnotexist", self.dir, env=ENV)
        self.assertEqual(p.returncode, 1)
        self.assertIn("evt_doesnotexist", p.stderr)

    def test_delivery_after_kill_9_and_restart(self):
        r = self.receiver()
        marker = os.path.join(self.dir, "hook-running")
        # the exec hook keeps `emit` busy after the event was stored and
        # before any delivery: the moment to kill the agent
        self.config(f"""
hooks:
  webhooks:
    - url: {r.url}
      secret: env:CK_WH_A
  exec:
    - event: checkpoint.registered
      command: ["/bin/sh", "-c", "echo $$ > {marker}; exec sleep 300"]
      timeout: 5m
""")
        env = dict(os.environ, **ENV)
        p = subprocess.Popen([CKPTD, "hooks", "emit", "checkpoint.registered", self.dir,
                              "--set", "checkpoint=e7"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        end = time.time() + 30
        while not os.path.exists(marker) and time.time() < end:
            time.sleep(0.05)
        self.assertTrue(os.path.exists(marker))
        time.sleep(0.2)
        p.kill()
        out, _ = p.communicate(timeout=10)
        with open(marker) as f:
            os.kill(int(f.read().strip()), signal.SIGKILL)  # the orphaned hook
        self.assertEqual(r.requests(), [])
        event_id = out.strip()
        # restart: the stored event goes out, with its id
        q = run("hooks", "deliver", self.dir, "--wait", "30s", env=ENV, check=0)
        self.assertIn("delivered 1", q.stdout)
        reqs = r.wait_requests(1)
        self.assertEqual(len(reqs), 1)
        self.assertEqual(reqs[0]["headers"]["webhook-id"], event_id)
        self.assertTrue(verify(SECRET_A, reqs[0]["headers"], reqs[0]["body"].encode()))
        self.assertEqual(json.loads(reqs[0]["body"])["data"]["checkpoint"]["reference"], "e7")

    def test_failing_receiver_is_marked_and_given_up(self):
        r = self.receiver(statuses=[500] * 100)
        self.config(f"""
hooks:
  webhooks:
    - url: {r.url}
      secret: env:CK_WH_A
      events: ["training.*"]
  retry_schedule: [0s, 0s]
  failing_after: 2
""")
        logs = ""
        for type_ in ("training.started", "training.finished", "checkpoint.registered"):
            logs += self.emit(type_).stderr  # checkpoint.* is filtered out: never sent
        p = run("hooks", "deliver", self.dir, "--wait", "30s", env=ENV)
        # nothing left to try, and yet nothing arrived: not a success
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("delivered 0, pending 0, given up 2", p.stdout)
        logs += p.stderr
        reqs = r.requests()
        # 3 attempts per event (1 + 2 retries), then given up: bounded, not forever
        self.assertEqual(len(reqs), 6)
        self.assertEqual({json.loads(q["body"])["type"] for q in reqs},
                         {"training.started", "training.finished"})
        self.assertEqual(logs.count("webhook.gave_up"), 2)
        self.assertEqual(logs.count("webhook.failing"), 1)  # reported once, not per attempt
        st = json.loads(run("hooks", "status", self.dir, env=ENV, check=0).stdout)
        self.assertTrue(st["webhooks"][0]["failing"])
        self.assertEqual(st["webhooks"][0]["pending"], 0)
        self.assertIn("HTTP 500", st["webhooks"][0]["last_error"])
        # the receiver is fixed: a replay gets through and clears the mark
        r.stop()
        r2 = self.receiver(port=r.port)
        event_id = json.loads(reqs[0]["body"])["id"]
        p = run("hooks", "replay", event_id, self.dir, env=ENV, check=0)
        self.assertIn("webhook.recovered", p.stderr)
        self.assertEqual(r2.wait_requests(1)[0]["headers"]["webhook-id"], event_id)
        st = json.loads(run("hooks", "status", self.dir, env=ENV, check=0).stdout)
        self.assertFalse(st["webhooks"][0]["failing"])

    def test_slow_receiver_costs_only_the_timeout(self):
        r = self.receiver(slow=60)
        self.config(f"""
hooks:
  webhooks:
    - url: {r.url}
      secret: env:CK_WH_A
      timeout: 1s
""")
        # the subprocess timeout (30 s) is below the receiver's delay (60 s):
        # ckptd must give up on its own
        p = self.emit("agent.started", timeout=30)
        self.assertIn("webhook.attempt_failed", p.stderr)
        self.assertIn("imed out", p.stderr)
        st = json.loads(run("hooks", "status", self.dir, env=ENV, check=0).stdout)
        self.assertEqual(st["webhooks"][0]["pending"], 1)

    def test_huge_answer_is_not_held_in_memory(self):
        r = self.receiver(huge=400 << 20)
        self.config(f"""
hooks:
  webhooks:
    - url: {r.url}
      secret: env:CK_WH_A
""")
        self.emit("agent.stopping")
        rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        # a 2xx whose body ckptd stops reading after 1 MiB is a delivery
        st = json.loads(run("hooks", "status", self.dir, env=ENV, check=0).stdout)
        self.assertEqual(st["webhooks"][0]["pending"], 0)
        self.assertEqual(len(r.requests()), 1)
        self.assertLess(rss_kib, 300 << 10, "ckptd held the answer in memory")

    def test_template_for_chat_webhooks(self):
        r = self.receiver()
        with open(os.path.join(self.dir, "slack.json"), "w") as f:
            f.write('{"text": "{{model_name}}: {{type}} {{checkpoint}} (epoch {{epoch}})"}\n')
        self.config("""
model: {name: 'net "v2" \\ test'}
hooks:
  webhooks:
    - url: env:CK_CHAT_URL
      template: slack.json
""")
        env = dict(ENV, CK_CHAT_URL=r.url + "/T000/B000/sekrit-token")
        p = self.emit("checkpoint.registered", "checkpoint=e4", "epoch=4", env=env)
        q = r.wait_requests(1)[0]
        self.assertEqual(json.loads(q["body"]),
                         {"text": 'net "v2" \\ test: checkpoint.registered e4 (epoch 4)'})
        self.assertEqual(q["path"], "/hook/T000/B000/sekrit-token")
        # the URL is a secret: logs show its host only
        self.assertNotIn("sekrit-token", p.stderr + p.stdout)
        st = run("hooks", "status", self.dir, env=env, check=0).stdout
        self.assertNotIn("sekrit-token", st)

    def test_hooks_test_command(self):
        r = self.receiver(statuses=[200, 500])
        p = run("hooks", "test", r.url, "--secret", "env:CK_WH_A", env=ENV, check=0)
        self.assertIn("delivered: HTTP 200", p.stdout)
        q = r.wait_requests(1)[0]
        self.assertTrue(verify(SECRET_A, q["headers"], q["body"].encode()))
        self.assertEqual(json.loads(q["body"])["type"], "hook.test")
        p = run("hooks", "test", r.url, "--secret", "env:CK_WH_A", env=ENV)
        self.assertEqual(p.returncode, 1)
        self.assertIn("HTTP 500", p.stdout)
        # nobody listening
        p = run("hooks", "test", "http://127.0.0.1:1/x", env=ENV)
        self.assertEqual(p.returncode, 1)
        # a literal secret on the command line is refused: it would be in the process list
        p = run("hooks", "test", r.url, "--secret", SECRET_A, env=ENV)
        self.assertEqual(p.returncode, 2)
        no_secret_in(self, p.stdout, p.stderr)


class ExecHooks(HookCase):
    def test_env_stdin_failing_and_hanging(self):
        out = os.path.join(self.dir, "out")
        pidf = os.path.join(self.dir, "hang.pid")
        self.config(f"""
hooks:
  exec:
    - event: checkpoint.registered
      command: ["/bin/sh", "-c", "env | grep ^CKPTD_ | sort > {out}.env; cat > {out}.json"]
    - event: "checkpoint.*"
      command: "echo about to fail; exit 3"
    - event: checkpoint.registered
      command: ["/bin/sh", "-c", "echo $$ > {pidf}; trap '' TERM; while :; do sleep 1; done"]
      timeout: 1s
    - event: training.finished
      command: ["/bin/sh", "-c", "touch {out}.never"]
""")
        p = run("hooks", "emit", "checkpoint.registered", self.dir, "--set", "checkpoint=e2",
                "--set", "epoch=2", "--set", "md5=" + "b" * 32, env={"CK_WH_A": SECRET_A},
                check=0, timeout=60)
        with open(out + ".env") as f:
            env = dict(line.rstrip("\n").split("=", 1) for line in f)
        self.assertEqual(env["CKPTD_EVENT"], "checkpoint.registered")
        self.assertEqual(env["CKPTD_CHECKPOINT"], "e2")
        self.assertEqual(env["CKPTD_EPOCH"], "2")
        self.assertEqual(env["CKPTD_MD5"], "b" * 32)
        self.assertEqual(env["CKPTD_MODEL_NAME"], os.path.basename(self.dir))
        self.assertEqual(env["CKPTD_ID"], p.stdout.strip())
        self.assertNotIn("CKPTD_SHA256", env)
        with open(out + ".json") as f:
            body = json.load(f)
        self.assertEqual(body["id"], p.stdout.strip())
        self.assertEqual(body["data"]["checkpoint"]["epoch"], 2)
        self.assertFalse(os.path.exists(out + ".never"))  # another event's hook
        self.assertRegex(p.stderr, r"hook\.exec\.output: hook='exec\[1\] [^']*' \| about to fail")
        self.assertRegex(p.stderr, r"hook\.exec\.failed: hook='exec\[1\] [^']*' code=3")
        self.assertIn("hook.exec.timeout", p.stderr)
        with open(pidf) as f:
            pid = int(f.read())
        # the hanging hook was killed (it ignored SIGTERM)
        end = time.time() + 10
        while not gone(pid) and time.time() < end:
            time.sleep(0.05)
        self.assertTrue(gone(pid))

    def test_secrets_are_not_passed_to_commands(self):
        out = os.path.join(self.dir, "env")
        r = self.receiver()
        self.config(f"""
hooks:
  webhooks:
    - url: {r.url}
      secret: env:CK_WH_A
  exec:
    - event: agent.started
      command: ["/bin/sh", "-c", "env > {out}"]
""")
        self.emit("agent.started", env={"CK_WH_A": SECRET_A, "CK_OTHER": "kept"})
        with open(out) as f:
            text = f.read()
        self.assertIn("CK_OTHER=kept", text)
        self.assertNotIn("CK_WH_A", text)
        no_secret_in(self, text)

    def test_no_secret_of_the_config_reaches_a_command(self):
        """Every env:NAME anywhere in the config (a store's credentials here,
        not only the hooks' own keys) is kept from exec hooks, and a hook's
        env: list passes only the variables it names (a secret still not)."""
        full, clean = os.path.join(self.dir, "env-full"), os.path.join(self.dir, "env-clean")
        self.config(f"""
upload:
  stores:
    - {{url: 'http://127.0.0.1:9/dav/', credentials: 'env:CK_DAV_CRED', auth: basic}}
hooks:
  exec:
    - event: agent.started
      command: ["/bin/sh", "-c", "env > {full}"]
    - event: agent.started
      command: ["/bin/sh", "-c", "env > {clean}"]
      env: [PATH, CK_OTHER, CK_DAV_CRED]
""")
        self.emit("agent.started", env=dict(CK_DAV_CRED="user:" + SECRET_A,
                                            CK_OTHER="kept", CK_UNLISTED="there"))
        with open(full) as f:
            text = f.read()
        self.assertIn("CK_OTHER=kept", text)
        self.assertIn("CK_UNLISTED=there", text)
        self.assertNotIn("CK_DAV_CRED", text)
        no_secret_in(self, text)
        with open(clean) as f:
            names = sorted(line.split("=", 1)[0] for line in f.read().splitlines() if "=" in line)
        self.assertIn("PATH", names)
        self.assertIn("CK_OTHER", names)
        self.assertNotIn("CK_UNLISTED", names)
        self.assertNotIn("CK_DAV_CRED", names)
        self.assertIn("CKPTD_EVENT", names)  # the event's own variables always come
        # nothing else of the agent's environment: only the list and CKPTD_*
        self.assertEqual([n for n in names if not n.startswith("CKPTD_")
                          and n not in ("PATH", "CK_OTHER", "PWD", "SHLVL", "_")], [])


class BadConfig(HookCase):
    def check_config(self, text, *want, cmd=("config",), env=ENV):
        self.config(text)
        p = run(*cmd, self.dir, env=env)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        for w in want:
            self.assertIn(w, p.stderr)
        no_secret_in(self, p.stdout, p.stderr)
        return p

    def test_malformed_url_and_secret_reference(self):
        self.check_config("hooks:\n  webhooks:\n    - url: hooks.example.com/x\n",
                          "line 3", "hooks.webhooks[0].url")
        self.check_config("hooks:\n  webhooks:\n    - url: ftp://x/y\n", "http")
        self.check_config("\nhooks:\n  webhooks:\n    - url: https://x/\n"
                          f"      secret: {SECRET_A}\n", "line 4", "hooks.webhooks[0].secret",
                          "env:NAME")
        self.check_config("hooks:\n  webhooks:\n    - secret: env:CK_WH_A\n", "url", "missing")
        self.check_config("hooks:\n  webhooks:\n    - url: https://x/\n      events: [upload.*, "
                          "uploads.done]\n", "uploads.done", "matches no event")
        self.check_config("hooks:\n  webhooks:\n    - url: https://x/\n      colour: red\n",
                          "hooks.webhooks[0].colour")
        self.check_config("hooks:\n  exec:\n    - event: checkpoint.registered\n", "command")
        self.check_config("listen: example.com:80\n", "'listen'", "line 1")
        self.check_config("hooks:\n  retry_schedule: [5s, soon]\n", "hooks.retry_schedule")

    def test_bad_secret_value_names_the_key_not_the_value(self):
        cfg = "hooks:\n  webhooks:\n    - url: http://127.0.0.1:1/\n      secret: env:CK_BAD\n"
        p = self.check_config(cfg, "line 3", "hooks.webhooks[0].secret", "whsec_",
                              cmd=("hooks", "deliver"), env={"CK_BAD": "hunter2-not-whsec"})
        self.assertNotIn("hunter2", p.stderr)
        p = self.check_config(cfg, "CK_BAD", "not set", cmd=("hooks", "deliver"), env={})
        # a secret file readable by others is refused
        path = os.path.join(self.dir, "wh.key")
        with open(path, "w") as f:
            f.write(SECRET_A + "\n")
        os.chmod(path, 0o644)
        cfg = f"hooks:\n  webhooks:\n    - url: http://127.0.0.1:1/\n      secret: file:{path}\n"
        self.check_config(cfg, "0600", cmd=("hooks", "deliver"))
        os.chmod(path, 0o600)
        self.config(cfg)
        run("hooks", "deliver", self.dir, check=0)

    def test_usage_errors(self):
        for args in (["hooks"], ["hooks", "frobnicate"], ["hooks", "emit", "no.such.event"],
                     ["hooks", "test"], ["hooks", "emit", "agent.started", self.dir, "--set",
                                         "colour=red"],
                     ["hooks", "emit", "agent.started", self.dir, "--set", "epoch=soon"]):
            p = run(*args)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn("ckptd hooks", p.stderr)


class ScanHooks(HookCase):
    """ckptd scan emits the events of its pass and writes its metrics."""

    def metrics(self, path):
        out = {}
        with open(path) as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def test_scan_emits_registered_and_status_events(self):
        import hashlib
        import yaml
        r = self.receiver()
        files = {}
        for e, size in ((1, 40000), (2, 60000)):
            data = os.urandom(size)
            write_old(os.path.join(self.dir, "ckpts", f"epoch_{e}.pt"), data)
            files[e] = data
        self.config(f"""
hooks:
  webhooks:
    - url: {r.url}
      secret: env:CK_WH_A
""")
        prom = os.path.join(self.dir, "ckptd.prom")
        p = run("scan", "--metrics-file", prom, self.dir, env=ENV, check=0)
        no_secret_in(self, p.stdout, p.stderr)
        reqs = r.wait_requests(3)
        self.assertEqual(len(reqs), 3)
        for q in reqs:
            self.assertTrue(verify(SECRET_A, q["headers"], q["body"].encode()))
        bodies = [json.loads(q["body"]) for q in reqs]
        self.assertEqual([b["type"] for b in bodies],
                         ["checkpoint.registered", "checkpoint.registered", "training.started"])
        with open(os.path.join(self.dir, "metadata.yaml")) as f:
            meta = yaml.safe_load(f)
        for b in bodies:
            self.assertEqual(b["data"]["model"]["id"], meta["model"]["id"])
            self.assertEqual(b["data"]["model"]["name"], meta["model"]["name"])
        for b, e in zip(bodies[:2], (1, 2)):
            c = b["data"]["checkpoint"]
            self.assertEqual(c["epoch"], e)
            self.assertEqual(c["md5"], hashlib.md5(files[e]).hexdigest())
            self.assertEqual(c["sha256"], hashlib.sha256(files[e]).hexdigest())
            self.assertEqual(c["size"], len(files[e]))
            self.assertEqual(c["source"], f"ckpts/epoch_{e}.pt")
            self.assertTrue(os.path.isfile(os.path.join(self.dir, c["path"])))
        m = self.metrics(prom)
        self.assertEqual(m["ckptd_checkpoints_registered_total"], 2)
        self.assertEqual(m["ckptd_checkpoints"], 2)
        self.assertEqual(m["ckptd_events_total"], 3)
        self.assertEqual(m['ckptd_webhook_deliveries_total{result="delivered"}'], 3)
        self.assertEqual(m["ckptd_hook_outbox_depth"], 0)
        self.assertGreaterEqual(m["ckptd_hashed_bytes_total"], 100000)
        self.assertEqual(os.stat(prom).st_mode & 0o777, 0o644)
        # nothing new: no event
        run("scan", self.dir, env=ENV, check=0)
        self.assertEqual(len(r.requests()), 3)
        run("scan", "--finished", self.dir, env=ENV, check=0)
        last = r.wait_requests(4)[-1]
        self.assertEqual(json.loads(last["body"])["type"], "training.finished")
        self.assertEqual(json.loads(last["body"])["data"]["training"]["status"], "finished")

    def test_scan_retries_what_a_previous_run_could_not_deliver(self):
        r = self.receiver(statuses=[503])
        write_old(os.path.join(self.dir, "epoch_1.pt"), os.urandom(1000))
        self.config(f"""
hooks:
  webhooks:
    - url: {r.url}
      secret: env:CK_WH_A
      events: [checkpoint.registered]
  retry_schedule: [0s]
""")
        run("scan", self.dir, env=ENV, check=0)
        self.assertEqual([q["status"] for q in r.requests()], [503])
        run("scan", self.dir, env=ENV, check=0)  # the next cron run delivers it
        reqs = r.wait_requests(2)
        self.assertEqual([q["status"] for q in reqs], [503, 200])
        self.assertEqual(reqs[0]["headers"]["webhook-id"], reqs[1]["headers"]["webhook-id"])

    def test_a_pass_announces_what_a_crash_left_unannounced(self):
        import sqlite3
        r = self.receiver()
        self.config(f"""
hooks:
  webhooks:
    - url: {r.url}
      secret: env:CK_WH_A
""")
        for e in (1, 2):
            write_old(os.path.join(self.dir, f"epoch_{e}.pt"), os.urandom(1000 * e))
        run("scan", self.dir, env=ENV, check=0)
        types = lambda: [(json.loads(q["body"])["type"],
                          json.loads(q["body"])["data"].get("checkpoint", {}).get("reference"))
                         for q in r.requests()]
        self.assertEqual(sorted(types()), [("checkpoint.registered", "epoch_1.pt"),
                                           ("checkpoint.registered", "epoch_2.pt"),
                                           ("training.started", None)])
        # as if the process died after metadata.yaml took epoch_2.pt and before
        # its event reached the outbox
        db = sqlite3.connect(os.path.join(self.dir, ".ckptd", "state.db"))
        with db:
            db.execute("DELETE FROM hook_announced WHERE ref = 'epoch_2.pt'")
        db.close()
        run("scan", self.dir, env=ENV, check=0)
        self.assertEqual(types()[3:], [("checkpoint.registered", "epoch_2.pt")])
        run("scan", self.dir, env=ENV, check=0)
        self.assertEqual(len(r.requests()), 4)

    def test_turning_hooks_on_does_not_replay_the_history(self):
        import sqlite3
        write_old(os.path.join(self.dir, "epoch_1.pt"), os.urandom(1000))
        run("scan", self.dir, check=0)
        # a tree registered by a ckptd without this bookkeeping
        db = sqlite3.connect(os.path.join(self.dir, ".ckptd", "state.db"))
        with db:
            db.execute("DROP TABLE IF EXISTS hook_announced")
            db.execute("DROP TABLE IF EXISTS hook_announced_status")
        db.close()
        r = self.receiver()
        self.config(f"""
hooks:
  webhooks:
    - url: {r.url}
      secret: env:CK_WH_A
""")
        write_old(os.path.join(self.dir, "epoch_2.pt"), os.urandom(1000))
        run("scan", self.dir, env=ENV, check=0)
        bodies = [json.loads(q["body"]) for q in r.requests()]
        self.assertEqual([(b["type"], b["data"]["checkpoint"]["reference"]) for b in bodies],
                         [("checkpoint.registered", "epoch_2.pt")])

    def test_scan_with_a_bad_secret_does_nothing(self):
        write_old(os.path.join(self.dir, "epoch_1.pt"), os.urandom(1000))
        self.config("hooks:\n  webhooks:\n    - url: http://127.0.0.1:1/\n      secret: env:CK_UNSET\n")
        p = run("scan", self.dir)
        self.assertEqual(p.returncode, 2)
        self.assertIn("hooks.webhooks[0].secret", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "metadata.yaml")))


def curl(*args):
    """Runs the curl binary; returns (status code, body)."""
    p = subprocess.run(["curl", "-s", "--max-time", "10", "-w", "\n%{http_code}", *args],
                       capture_output=True, text=True, timeout=30)
    body, _, code = p.stdout.rpartition("\n")
    return int(code or 0), body


def wait_until(fn, what, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Operations(HookCase):
    """ckptd watch with listen: the endpoints scraped with curl."""

    def start_watch(self, config, flag=False):
        """Starts ckptd watch listening on a free port, given by listen: in the
        config or, with flag, by --listen."""
        import socket
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            port = sk.getsockname()[1]
        args = [CKPTD, "watch", self.dir]
        if flag:
            self.config("listen: 127.0.0.1:1\n" + config)  # the flag wins
            args += ["--listen", f"127.0.0.1:{port}"]
        else:
            self.config(f"listen: 127.0.0.1:{port}\n" + config)
        os.makedirs(os.path.join(self.dir, ".ckptd"), exist_ok=True)
        self.log_path = os.path.join(self.dir, ".ckptd", "test-watch.log")
        with open(self.log_path, "ab") as log:
            p = subprocess.Popen(args, env=dict(os.environ, **ENV), stdout=subprocess.DEVNULL,
                                 stderr=log)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: curl(base + "/healthz")[0] == 200 or p.poll() is not None, "/healthz")
        self.assertIsNone(p.poll(), "the watcher exited")
        return p, base

    def scrape(self, base):
        import re
        code, text = curl(base + "/metrics")
        self.assertEqual(code, 200)
        fams, types, samples = set(), {}, {}
        for line in text.splitlines():
            if line.startswith("# HELP "):
                fams.add(line.split()[2])
            elif line.startswith("# TYPE "):
                types[line.split()[2]] = line.split()[3]
            elif line:
                m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)", line)
                self.assertTrue(m, line)
                samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        self.assertEqual(fams, set(types))
        self.assertTrue(all(k.startswith("ckptd_") for k in samples))
        return samples, types

    def test_watch_endpoints_scraped_with_curl(self):
        p, base = self.start_watch("")
        self.assertEqual(curl(base + "/healthz"), (200, "ok\n"))
        wait_until(lambda: curl(base + "/readyz")[0] == 200, "/readyz")
        self.assertEqual(curl(base + "/readyz"), (200, "ready\n"))
        m, types = self.scrape(base)
        self.assertEqual(m["ckptd_checkpoints_registered_total"], 0)
        self.assertEqual(types["ckptd_upload_duration_seconds"], "histogram")
        self.assertEqual(m["ckptd_newest_remote_checkpoint_age_seconds"], -1)
        with open(os.path.join(self.dir, "epoch_1.pt"), "wb") as f:
            f.write(os.urandom(30000))
        m = wait_until(lambda: (lambda s: s if s["ckptd_checkpoints_registered_total"] == 1
                                else None)(self.scrape(base)[0]), "a registration in /metrics")
        self.assertGreaterEqual(m["ckptd_hashed_bytes_total"], 30000)
        self.assertLessEqual(abs(m["ckptd_start_time_seconds"] - time.time()), 600)
        code, body = curl(base + "/status")
        self.assertEqual(code, 200)
        st = json.loads(body)
        self.assertEqual(st["pid"], p.pid)
        self.assertIn("version", st)
        self.assertGreaterEqual(st["uptime_seconds"], 0)
        self.assertEqual(curl("-X", "POST", "-d", "x", base + "/metrics")[0], 405)
        self.assertEqual(curl(base + "/nope")[0], 404)
        self.assertEqual(run("watch", self.dir, "--listen", "example.com:80").returncode, 2)
        code, _ = curl("-I", base + "/metrics")
        self.assertEqual(code, 200)
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=60), 0)

    def test_watch_sends_events(self):
        r = self.receiver()
        p, base = self.start_watch(f"""
hooks:
  webhooks:
    - url: {r.url}
      secret: env:CK_WH_A
""", flag=True)
        with open(os.path.join(self.dir, "epoch_1.pt"), "wb") as f:
            f.write(os.urandom(30000))
        reqs = wait_until(lambda: [q for q in r.requests()
                                   if json.loads(q["body"])["type"] == "checkpoint.registered"],
                          "checkpoint.registered at the receiver")
        self.assertTrue(verify(SECRET_A, reqs[0]["headers"], reqs[0]["body"].encode()))
        self.assertEqual(json.loads(reqs[0]["body"])["data"]["checkpoint"]["epoch"], 1)
        wait_until(lambda: self.scrape(base)[0]['ckptd_webhook_deliveries_total{result="delivered"}']
                   >= 1, "the delivery in /metrics")
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=60), 0)
        with open(self.log_path) as f:
            no_secret_in(self, f.read())
        # the agent's own lifecycle: started before the checkpoint, stopping at SIGTERM,
        # both carrying the model id the tree has
        types = [json.loads(q["body"])["type"] for q in r.requests()]
        self.assertIn("agent.started", types)
        self.assertIn("agent.stopping", types)
        self.assertLess(types.index("agent.started"), types.index("checkpoint.registered"))
        self.assertEqual(types[-1], "agent.stopping")
        with open(os.path.join(self.dir, "metadata.yaml")) as f:
            model_id = yaml.safe_load(f)["model"]["id"]
        stopping = [json.loads(q["body"]) for q in r.requests()][-1]
        self.assertEqual(stopping["data"]["model"]["id"], model_id)

class Contrib(unittest.TestCase):
    def test_example_config_loads_with_every_key(self):
        path = os.path.join(ROOT, "contrib", "ckptd.example.yaml")
        # `ckptd config` resolves the secrets the example names, as a start
        # would: without them it refuses (exit 2); with them it is ok
        p = run("config", "-c", path, env={"CKPTD_WEBHOOK_SECRET": ""})
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("CKPTD_WEBHOOK_SECRET", p.stderr)
        import shutil
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            nxt = os.path.join(tmp, "webhook-secret.next")
            with open(nxt, "w") as f:
                f.write(SECRET_B)
            os.chmod(nxt, 0o600)
            # the files the check reads: verify inputs beside the config, the signing key
            os.makedirs(os.path.join(tmp, "golden"))
            open(os.path.join(tmp, "golden", "x.npy"), "wb").close()
            key = os.path.join(tmp, "deploy.key")
            run("keygen", "-o", key, check=0)
            with open(path) as f:
                text = f.read().replace("/etc/ckptd/webhook-secret.next", nxt).replace(
                    "/etc/ckptd/deploy.key", key)
            copy = os.path.join(tmp, "ckptd.yaml")
            with open(copy, "w") as f:
                f.write(text)
            shutil.copy(os.path.join(ROOT, "contrib", "slack.json"), tmp)
            run("config", "-c", copy, check=0,
                env={"CKPTD_WEBHOOK_SECRET": SECRET_A,
                     "CKPTD_SLACK_WEBHOOK_URL": "https://hooks.example.com/services/T0/B0/x"})
        keys = [line.split()[0] for line in run("config", "--keys", check=0).stdout.splitlines()]
        with open(path) as f:
            text = f.read()
        # every key appears in the example, under its section (a leaf name at least)
        for k in keys:
            self.assertIn(k.split(".")[-1] + ":", text, k)


if __name__ == "__main__":
    unittest.main()
