"""The AWS credential and config chain of the s3 store (issue 17), against
s3rver behind a gate that enforces session tokens, with loopback stand-ins
for STS, IAM Identity Center's portal, the container credentials endpoint and
IMDSv2 (tests/lib/awsmock.py).

What is checked comes from outside ckptd: which service was asked (the
stand-ins' own records), what s3rver stored (read back with the aws CLI and
compared with hashlib), and that a source lower in the chain holds keys
s3rver refuses, so a wrong pick fails the upload.
"""
import datetime
import hashlib
import json
import os
import re
import secrets
import shlex
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from awsmock import CredServer, Issuer  # noqa: E402
from ckptd_test import TmpDirCase, run  # noqa: E402
from servers import FlakyProxy, RgwServer, S3Server, free_port, need  # noqa: E402

MiB = 1 << 20
AWS_VARS = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
            "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
            "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
            "AWS_ENDPOINT_URL_STS", "AWS_ENDPOINT_URL_SSO", "AWS_ENDPOINT_URL_SSO_OIDC",
            "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
            "AWS_ROLE_SESSION_NAME", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_EC2_METADATA_DISABLED",
            "AWS_EC2_METADATA_SERVICE_ENDPOINT", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
            "CKPTD_TEST_ECS_HOST"]
BOGUS_ID, BOGUS_SECRET = "AKIAIOSFODNN7BOGUS00", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYBOGUSKEY00"


def write(path, text, mode=0o600):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def make(path, size, seed):
    block = hashlib.sha256(str(seed).encode()).digest() * (MiB // 32)
    with open(path, "wb") as f:
        for i in range(size // MiB):
            f.write(hashlib.sha256(i.to_bytes(8, "little")).digest() + block[32:])
        f.write(block[: size % MiB])
    return path


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class AwsCred(TmpDirCase):
    def server(self):
        """The S3 server behind the gate: s3rver here, Ceph RGW in AwsCredRgw."""
        return S3Server(self.dir)

    def setUp(self):
        super().setUp()
        need("aws", "checking S3 uploads needs awscli")
        self.s3 = self.server()
        self.addCleanup(self.s3.stop)
        self.issuer = Issuer(self.s3.key_id, self.s3.secret)
        self.gate = FlakyProxy(self.s3.port, [], gate=self.issuer.gate)
        self.addCleanup(self.gate.stop)
        self.creds = CredServer(self.issuer)
        self.addCleanup(self.creds.stop)
        self.home = os.path.join(self.dir, "home")
        os.makedirs(os.path.join(self.home, ".aws"))
        # nothing of the machine's own AWS setup leaks in
        self.base = {v: "" for v in AWS_VARS}
        self.base.update(HOME=self.home, AWS_EC2_METADATA_DISABLED="true")
        self.src = make(os.path.join(self.dir, "weights.bin"), 3 * MiB + 17, 1)
        self.n = 0

    def upload(self, env, *extra, path=None, endpoint=True, check=None, timeout=120):
        """Uploads path (default self.src) to a fresh key; returns (process, key)."""
        self.n += 1
        e = dict(self.base, **env)
        args = ["upload", "-v", "--no-progress", "--state", os.path.join(self.dir, f"st{self.n}")]
        if endpoint:
            args += ["--endpoint", self.gate.url]
        key = f"run{self.n}"
        p = run(*args, *extra, path or self.src, f"s3://{self.s3.bucket}/{key}/", env=e, check=check,
                timeout=timeout)
        for secret in [self.s3.secret, BOGUS_SECRET, *self.issuer.tokens, *self.creds.sso_tokens]:
            self.assertNotIn(secret, p.stdout + p.stderr, "a secret in ckptd's output")
        return p, f"{key}/{os.path.basename(path or self.src)}"

    def assert_landed(self, p, key, path=None):
        self.assertEqual(p.returncode, 0, p.stderr)
        got = os.path.join(self.dir, "got")
        self.s3.get(key, got)
        self.assertEqual(sha256(got), sha256(path or self.src))

    def source(self, p):
        m = re.findall(r"s3\.credentials\b.*?source=([\w-]+)", p.stderr)
        return m[0] if m else None

    # -- each source --

    def test_environment_keys(self):
        p, key = self.upload({"AWS_ACCESS_KEY_ID": self.s3.key_id,
                              "AWS_SECRET_ACCESS_KEY": self.s3.secret})
        self.assert_landed(p, key)
        self.assertEqual(self.source(p), "environment")
        self.assertEqual(self.creds.calls, [])

    def test_shared_credentials_file_in_home(self):
        write(os.path.join(self.home, ".aws", "credentials"),
              f"[other]\naws_access_key_id = {BOGUS_ID}\naws_secret_access_key = {BOGUS_SECRET}\n"
              f"[default]\naws_access_key_id = {self.s3.key_id}\n"
              f"aws_secret_access_key={self.s3.secret}\n")
        p, key = self.upload({})
        self.assert_landed(p, key)
        self.assertEqual(self.source(p), "shared-files")

    def test_profile_from_both_files_with_region_and_endpoint(self):
        cfg = write(os.path.join(self.dir, "cfg"),
                    "[default]\nregion = us-west-1\n"
                    "[profile dev]\nregion = eu-west-3\n"
                    f"s3 =\n    endpoint_url = {self.gate.url}\n"
                    f"aws_access_key_id = {self.s3.key_id}\n"
                    f"aws_secret_access_key = {self.s3.secret}\n")
        creds = write(os.path.join(self.dir, "creds"),
                      f"[default]\naws_access_key_id = {BOGUS_ID}\n"
                      f"aws_secret_access_key = {BOGUS_SECRET}\n")
        env = {"AWS_PROFILE": "dev", "AWS_CONFIG_FILE": cfg, "AWS_SHARED_CREDENTIALS_FILE": creds}
        p, key = self.upload(env, endpoint=False)
        self.assert_landed(p, key)
        self.assertEqual(self.source(p), "shared-files")
        self.assertIn("region=eu-west-3", p.stderr)
        # the credentials file's [dev] comes before the config file's [profile dev]
        write(creds, f"[dev]\naws_access_key_id = {BOGUS_ID}\naws_secret_access_key = {BOGUS_SECRET}\n")
        p, _ = self.upload(env, endpoint=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("refused the credentials", p.stderr)
        # a profile that neither file has is an error, as in the AWS CLI
        p, _ = self.upload(dict(env, AWS_PROFILE="nope"), endpoint=False)
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertIn("'nope'", p.stderr)

    def test_region_and_endpoint_precedence(self):
        dead = f"http://127.0.0.1:{free_port()}"
        cfg = write(os.path.join(self.dir, "cfg"),
                    f"[default]\nregion = ap-south-1\nendpoint_url = {dead}\n")
        env = {"AWS_ACCESS_KEY_ID": self.s3.key_id, "AWS_SECRET_ACCESS_KEY": self.s3.secret,
               "AWS_CONFIG_FILE": cfg}
        cases = [  # (extra env, flags, region expected, endpoint reachable)
            ({}, [], "ap-south-1", False),
            ({"AWS_ENDPOINT_URL": self.gate.url}, [], "ap-south-1", True),
            ({"AWS_ENDPOINT_URL": dead, "AWS_ENDPOINT_URL_S3": self.gate.url,
              "AWS_DEFAULT_REGION": "eu-north-1"}, [], "eu-north-1", True),
            ({"AWS_ENDPOINT_URL_S3": dead, "AWS_REGION": "ca-central-1",
              "AWS_DEFAULT_REGION": "eu-north-1"}, ["--endpoint", self.gate.url], "ca-central-1", True),
            ({"AWS_REGION": "ca-central-1", "AWS_ENDPOINT_URL": self.gate.url},
             ["--region", "sa-east-1"], "sa-east-1", True),
        ]
        for extra, flags, region, ok in cases:
            with self.subTest(extra=extra, flags=flags):
                p, key = self.upload(dict(env, **extra), "--retries", "0", *flags, endpoint=False)
                self.assertIn(f"region={region}", p.stderr)
                if ok:
                    self.assert_landed(p, key)
                else:
                    self.assertNotEqual(p.returncode, 0)

    def web_identity_env(self, token="eyJhbGciOiJSUzI1NiJ9.first.sig", accepted=True):
        tf = write(os.path.join(self.dir, "token"), token + "\n", 0o644)
        if accepted:
            self.creds.web_tokens.add(token)
        return {"AWS_WEB_IDENTITY_TOKEN_FILE": tf, "AWS_ROLE_ARN": self.creds.role_arn,
                "AWS_ROLE_SESSION_NAME": "trainer-7", "AWS_ENDPOINT_URL_STS": self.creds.url}

    def test_web_identity(self):
        p, key = self.upload(self.web_identity_env())
        self.assert_landed(p, key)
        self.assertEqual(self.source(p), "web-identity")
        sts = [c[1] for c in self.creds.calls if c[0] == "sts"]
        self.assertEqual(len(sts), 1)
        self.assertEqual(sts[0]["RoleSessionName"], "trainer-7")
        self.assertEqual(sts[0]["RoleArn"], self.creds.role_arn)
        # a token STS refuses is an error naming the role, not the token
        p, _ = self.upload(self.web_identity_env("eyJ.refused.sig", accepted=False))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("InvalidIdentityToken", p.stderr)
        self.assertNotIn("eyJ.refused.sig", p.stderr)

    def test_container_full_uri_with_token_file(self):
        self.creds.container_auth = "Bearer pod-identity-token-123"
        tf = write(os.path.join(self.dir, "eks-pod-identity-token"), "Bearer pod-identity-token-123\n")
        env = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": self.creds.url + "/v2/credentials/pod",
               "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": tf,
               "AWS_CONTAINER_AUTHORIZATION_TOKEN": "ignored-when-the-file-is-set"}
        p, key = self.upload(env)
        self.assert_landed(p, key)
        self.assertEqual(self.source(p), "container")
        self.assertEqual([c for c in self.creds.calls if c[0] == "container"],
                         [("container", "/v2/credentials/pod", "Bearer pod-identity-token-123")])
        self.assertNotIn("pod-identity-token-123", p.stderr)
        # a full URI to another host over plain http is refused (the SDKs' rule)
        p, _ = self.upload({"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://192.0.2.1/creds"})
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertIn("neither https nor a loopback", p.stderr)

    def test_container_relative_uri_ecs(self):
        self.creds.container_auth = "ecs-secret-auth"
        env = {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/creds",
               "AWS_CONTAINER_AUTHORIZATION_TOKEN": "ecs-secret-auth",
               "CKPTD_TEST_ECS_HOST": self.creds.url}
        p, key = self.upload(env)
        self.assert_landed(p, key)
        self.assertEqual(self.source(p), "container")
        self.assertNotIn("ecs-secret-auth", p.stderr)

    def test_instance_metadata_v2(self):
        env = {"AWS_EC2_METADATA_DISABLED": "", "AWS_EC2_METADATA_SERVICE_ENDPOINT": self.creds.url}
        p, key = self.upload(env)
        self.assert_landed(p, key)
        self.assertEqual(self.source(p), "instance-metadata")
        kinds = self.creds.kinds()
        self.assertEqual(kinds[0], "imds-token")  # the session token comes first (IMDSv2)
        self.assertEqual(kinds.count("imds"), 2)
        self.assertEqual([c[1] for c in self.creds.calls if c[0] == "imds-token"], ["21600"])
        # disabled: nothing is asked, and the error lists what was tried
        self.creds.calls.clear()
        p, _ = self.upload(dict(env, AWS_EC2_METADATA_DISABLED="true"))
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertIn("no AWS credentials found", p.stderr)
        self.assertEqual(self.creds.calls, [])

    # -- credential_process --

    HELPER = """import json, sys, urllib.request
mode, url, log = sys.argv[1:4]
with open(log, "a") as f:
    f.write(json.dumps(sys.argv[4:]) + "\\n")
if mode == "fail":
    sys.stderr.write("helper: no session, log in first\\n")
    sys.exit(3)
d = json.loads(urllib.request.urlopen(url + "/process").read())
if mode == "v2":
    d["Version"] = 2
print(json.dumps(d, indent=2))
"""

    def process_profile(self, mode="ok", config_keys=False):
        """A profile dev whose credential_process runs the helper with quoted
        arguments; returns (env, command line, argv log)."""
        helper = write(os.path.join(self.dir, "helper.py"), self.HELPER)
        log = os.path.join(self.dir, "argv.log")
        cmd = (f"/usr/bin/python3 {helper} {mode} {self.creds.url} {log} 'two words' "
               f'"q\\"x" it\\ s --token s3cr3t-in-args')
        keys = (f"aws_access_key_id = {BOGUS_ID}\naws_secret_access_key = {BOGUS_SECRET}\n"
                if config_keys else "")
        cfg = write(os.path.join(self.dir, "cfg"),
                    f"[profile dev]\nregion = us-east-1\ncredential_process = {cmd}\n{keys}")
        env = {"AWS_PROFILE": "dev", "AWS_CONFIG_FILE": cfg,
               "AWS_SHARED_CREDENTIALS_FILE": os.path.join(self.dir, "no-creds")}
        return env, cmd, log

    def test_credential_process(self):
        env, cmd, log = self.process_profile(config_keys=True)
        p, key = self.upload(env)
        self.assert_landed(p, key)
        self.assertEqual(self.source(p), "process")
        self.assertEqual(self.creds.kinds(), ["process"])
        # split as the AWS CLI splits it (shlex), run without a shell
        with open(log) as f:
            self.assertEqual([json.loads(line) for line in f], [shlex.split(cmd)[5:]])
        self.assertNotIn("s3cr3t-in-args", p.stdout + p.stderr)
        # the credentials file's keys for the profile come before the process
        write(env["AWS_SHARED_CREDENTIALS_FILE"],
              f"[dev]\naws_access_key_id = {BOGUS_ID}\naws_secret_access_key = {BOGUS_SECRET}\n")
        self.creds.calls.clear()
        p, _ = self.upload(env, "--retries", "0")
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(self.source(p), "shared-files")
        self.assertEqual(self.creds.kinds(), [])

    def test_credential_process_failures(self):
        env, _, _ = self.process_profile("fail")
        p, _ = self.upload(env)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("credential_process of profile 'dev': '/usr/bin/python3' exited with status 3",
                      p.stderr)
        self.assertIn("helper: no session, log in first", p.stderr)  # its stderr is ours
        self.assertNotIn("s3cr3t-in-args", p.stdout + p.stderr)
        env, _, _ = self.process_profile("v2")
        p, _ = self.upload(env)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn('is not {"Version": 1, ...} JSON', p.stderr)
        self.assertNotIn(self.s3.secret, p.stderr)

    def test_credential_process_renewed_before_expiry(self):
        """Keys that live 8 s over an upload of about 16 s: the process runs
        again before they expire (the gate never answers ExpiredToken)."""
        self.creds.lifetime = 8
        env, _, _ = self.process_profile()
        big = make(os.path.join(self.dir, "shard.bin"), 40 * MiB + 5, 4)
        p, key = self.upload(env, "--part-size", "5MiB", "--multipart-threshold", "5MiB",
                             "--max-rate", "2.5MiB", "--concurrency", "2", path=big, timeout=170)
        self.assert_landed(p, key, big)
        self.assertGreaterEqual(self.creds.kinds().count("process"), 2)
        self.assertEqual(self.issuer.refused, [])
        self.assertIn("source=process reason=expiring", p.stderr)

    # -- role_arn with source_profile or credential_source (STS AssumeRole) --

    SOURCE_ID, SOURCE_SECRET = "AKIASOURCEPROFILE001", "source/Secret/Key/For/AssumeRole/000001"
    ROLE = "arn:aws:iam::210987654321:role/checkpoint-writer"

    def role_files(self, config, creds=""):
        cfg = write(os.path.join(self.dir, "cfg"), config)
        cr = write(os.path.join(self.dir, "creds"), creds)
        self.creds.signers[self.SOURCE_ID] = self.SOURCE_SECRET
        return {"AWS_CONFIG_FILE": cfg, "AWS_SHARED_CREDENTIALS_FILE": cr,
                "AWS_ENDPOINT_URL_STS": self.creds.url}

    def assumed(self):
        return [c[1] for c in self.creds.calls if c[0] == "assume"]

    def test_assume_role_with_source_profile(self):
        """The source keys sign AssumeRole (the stand-in checks the SigV4
        signature); s3rver refuses them, so only the role's keys can land."""
        self.creds.roles.add(self.ROLE)
        env = self.role_files(
            f"[profile dev]\nrole_arn = {self.ROLE}\nsource_profile = base\n"
            "role_session_name = trainer-9\nexternal_id = ext-42\nduration_seconds = 1800\n"
            "region = eu-west-1\n",
            f"[base]\naws_access_key_id = {self.SOURCE_ID}\n"
            f"aws_secret_access_key = {self.SOURCE_SECRET}\n")
        env["AWS_PROFILE"] = "dev"
        p, key = self.upload(env)
        self.assert_landed(p, key)
        self.assertEqual(self.source(p), "assume-role")
        self.assertEqual(self.assumed(), [{
            "Action": "AssumeRole", "DurationSeconds": "1800", "ExternalId": "ext-42",
            "RoleArn": self.ROLE, "RoleSessionName": "trainer-9", "Version": "2011-06-15",
            "signer": self.SOURCE_ID, "token": False}])
        self.assertNotIn(self.SOURCE_SECRET, p.stdout + p.stderr)
        # a role STS does not grant, and source keys whose signature fails
        self.creds.roles.clear()
        p, _ = self.upload(env)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(f"STS refused role '{self.ROLE}' for profile 'dev'", p.stderr)
        self.assertIn("AccessDenied", p.stderr)
        self.creds.roles.add(self.ROLE)
        self.creds.signers[self.SOURCE_ID] = "another/secret"
        p, _ = self.upload(env)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("SignatureDoesNotMatch", p.stderr)
        self.assertNotIn(self.SOURCE_SECRET, p.stdout + p.stderr)

    def test_assume_role_chained_and_credential_source(self):
        role_b = self.ROLE + "-b"
        self.creds.roles.update({self.ROLE, role_b})
        _, cmd, _ = self.process_profile()
        env = self.role_files(
            f"[profile a]\nrole_arn = {self.ROLE}\nsource_profile = b\n"
            f"[profile b]\nrole_arn = {role_b}\nsource_profile = c\n"
            f"[profile c]\ncredential_process = {cmd}\n"
            f"[profile ecs]\nrole_arn = {self.ROLE}\ncredential_source = EcsContainer\n"
            f"[profile loop1]\nrole_arn = {self.ROLE}\nsource_profile = loop2\n"
            f"[profile loop2]\nrole_arn = {role_b}\nsource_profile = loop1\n"
            f"[profile nosource]\nrole_arn = {self.ROLE}\n"
            "[profile sso]\nsso_session = corp\nsso_account_id = 210987654321\n"
            "sso_role_name = writer\n")
        # a -> b -> c: the process's keys (with their session token) sign b's
        # AssumeRole, b's keys sign a's
        p, key = self.upload(dict(env, AWS_PROFILE="a"))
        self.assert_landed(p, key)
        self.assertEqual(self.source(p), "assume-role")
        self.assertEqual([(c["RoleArn"], c["signer"], c["token"]) for c in self.assumed()],
                         [(role_b, self.s3.key_id, True), (self.ROLE, self.s3.key_id, True)])
        self.assertEqual(self.creds.kinds().count("process"), 1)
        # credential_source EcsContainer: the container's keys sign
        self.creds.calls.clear()
        p, key = self.upload(dict(env, AWS_PROFILE="ecs",
                                  AWS_CONTAINER_CREDENTIALS_FULL_URI=self.creds.url + "/creds"))
        self.assert_landed(p, key)
        self.assertEqual(self.creds.kinds(), ["container", "assume"])
        # configurations the AWS CLI refuses too, each named
        for profile, says in [("loop1", "more than 5 roles chained"),
                              ("nosource", "role_arn without source_profile"),
                              ("sso", "has no [sso-session corp] in")]:
            with self.subTest(profile=profile):
                self.creds.calls.clear()
                p, _ = self.upload(dict(env, AWS_PROFILE=profile,
                                        AWS_CONTAINER_CREDENTIALS_FULL_URI=self.creds.url + "/creds"))
                self.assertNotEqual(p.returncode, 0)
                self.assertIn(says, p.stderr)
                self.assertEqual(self.creds.kinds(), [], "no other source stood in")

    def test_explicit_profile_and_credential_source_environment(self):
        """--profile (profile: in the config) is aws --profile: the profile's
        role is assumed with the environment's keys (credential_source
        Environment), which are not used as they are. With AWS_PROFILE
        instead, the environment's keys come first, as in the AWS CLI."""
        self.creds.roles.add(self.ROLE)
        env = self.role_files(
            f"[profile envrole]\nrole_arn = {self.ROLE}\ncredential_source = Environment\n")
        env.update(AWS_ACCESS_KEY_ID=self.SOURCE_ID, AWS_SECRET_ACCESS_KEY=self.SOURCE_SECRET)
        p, key = self.upload(env, "--profile", "envrole")
        self.assert_landed(p, key)
        self.assertEqual(self.source(p), "assume-role")
        self.assertEqual([c["signer"] for c in self.assumed()], [self.SOURCE_ID])
        self.creds.calls.clear()
        p, _ = self.upload(dict(env, AWS_PROFILE="envrole"), "--retries", "0")
        self.assertNotEqual(p.returncode, 0)  # s3rver refuses the source keys
        self.assertEqual(self.source(p), "environment")
        self.assertEqual(self.assumed(), [])
        # a profile given that neither file has is an error naming it
        p, _ = self.upload(env, "--profile", "nope")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("'nope'", p.stderr)
        self.assertNotIn(self.SOURCE_SECRET, p.stdout + p.stderr)

    def test_assume_role_renewed_before_expiry(self):
        self.creds.lifetime = 8
        self.creds.roles.add(self.ROLE)
        env = self.role_files(
            f"[profile dev]\nrole_arn = {self.ROLE}\nsource_profile = base\n",
            f"[base]\naws_access_key_id = {self.SOURCE_ID}\n"
            f"aws_secret_access_key = {self.SOURCE_SECRET}\n")
        big = make(os.path.join(self.dir, "shard.bin"), 40 * MiB + 9, 5)
        p, key = self.upload(dict(env, AWS_PROFILE="dev"), "--part-size", "5MiB",
                             "--multipart-threshold", "5MiB", "--max-rate", "2.5MiB",
                             "--concurrency", "2", path=big, timeout=170)
        self.assert_landed(p, key, big)
        self.assertGreaterEqual(len(self.assumed()), 2)
        self.assertEqual(self.issuer.refused, [])
        self.assertIn("source=assume-role reason=expiring", p.stderr)

    # -- the order --

    def test_precedence_between_sources(self):
        """Every source configured; the one expected has keys s3rver accepts,
        every source after it keys s3rver refuses. Then the winner is removed."""
        cfg = write(os.path.join(self.dir, "cfg"), "[default]\nregion = us-east-1\n")
        creds = os.path.join(self.dir, "creds")
        order = ["explicit", "environment", "web-identity", "sso", "shared-files", "container",
                 "instance-metadata"]
        self.creds.sso_roles.add((self.ACCOUNT, self.SSO_ROLE))
        for i, winner in enumerate(order):
            with self.subTest(winner=winner):
                good = lambda name: name == winner  # noqa: E731
                env = {"AWS_CONFIG_FILE": cfg, "AWS_SHARED_CREDENTIALS_FILE": creds,
                       "AWS_ENDPOINT_URL_SSO": self.creds.url, "AWS_ENDPOINT_URL_SSO_OIDC": self.creds.url}
                extra = []
                if i <= 0:
                    f = write(os.path.join(self.dir, "explicit"),
                              f"[default]\naws_access_key_id = {self.s3.key_id}\n"
                              f"aws_secret_access_key = {self.s3.secret}\n")
                    extra = ["--credentials", "file:" + f]
                if i <= 1:
                    env.update(AWS_ACCESS_KEY_ID=self.s3.key_id if good("environment") else BOGUS_ID,
                               AWS_SECRET_ACCESS_KEY=self.s3.secret if good("environment") else BOGUS_SECRET)
                if i <= 2:
                    env.update(self.web_identity_env() if good("web-identity") else
                               self.web_identity_env("eyJ.not-accepted.sig", accepted=False))
                if i <= 3:
                    write(cfg, "[default]\nregion = us-east-1\n" + self.SSO_DEV.replace("profile dev", "default"))
                    tok = self.sso_login("corp")
                    if not good("sso"):
                        self.creds.sso_tokens.discard(tok)
                else:
                    write(cfg, "[default]\nregion = us-east-1\n")
                if i <= 4:
                    k, s = (self.s3.key_id, self.s3.secret) if good("shared-files") else (BOGUS_ID, BOGUS_SECRET)
                    write(creds, f"[default]\naws_access_key_id = {k}\naws_secret_access_key = {s}\n")
                elif os.path.exists(creds):
                    os.unlink(creds)
                if i <= 5:
                    env.update(AWS_CONTAINER_CREDENTIALS_FULL_URI=self.creds.url + "/creds")
                    self.creds.container_auth = None if good("container") else "not-sent"
                env.update(AWS_EC2_METADATA_DISABLED="", AWS_EC2_METADATA_SERVICE_ENDPOINT=self.creds.url)
                self.creds.calls.clear()
                p, key = self.upload(env, *extra)
                self.assert_landed(p, key)
                self.assertEqual(self.source(p), "config" if winner == "explicit" else winner)
                asked = set(self.creds.kinds())
                self.assertEqual("sts" in asked, winner == "web-identity")
                self.assertEqual("sso" in asked, winner == "sso")
                self.assertEqual("container" in asked, winner == "container")
                self.assertEqual("imds-token" in asked, winner == "instance-metadata")

    # -- IAM Identity Center: the token `aws sso login` cached --

    ACCOUNT, SSO_ROLE = "210987654321", "checkpoint-writer"
    SSO_DEV = ("[profile dev]\nsso_session = corp\n"
               f"sso_account_id = {ACCOUNT}\nsso_role_name = {SSO_ROLE}\n"
               "[sso-session corp]\nsso_start_url = https://corp.awsapps.com/start\n"
               "sso_region = eu-west-1\nsso_registration_scopes = sso:account:access\n")

    def sso_files(self, config, creds=""):
        """role_files for the IAM Identity Center cases: the stand-in portal
        grants (ACCOUNT, SSO_ROLE) and answers for the portal and OIDC."""
        self.creds.sso_roles.add((self.ACCOUNT, self.SSO_ROLE))
        return dict(self.role_files(config, creds), AWS_ENDPOINT_URL_SSO=self.creds.url,
                    AWS_ENDPOINT_URL_SSO_OIDC=self.creds.url)

    def sso_cache(self, key):
        return os.path.join(self.home, ".aws", "sso", "cache",
                            hashlib.sha1(key.encode()).hexdigest() + ".json")

    def sso_login(self, key, lifetime=3600, fmt="%Y-%m-%dT%H:%M:%SZ", refresh="rt-unknown"):
        """What `aws sso login` leaves: ~/.aws/sso/cache/<SHA-1 hex of the
        session name, or of the start URL>.json; the portal takes its token,
        the OIDC stand-in its refresh token when it is registered there."""
        tok = "aoa" + secrets.token_urlsafe(300)
        self.creds.sso_tokens.add(tok)
        os.makedirs(os.path.dirname(self.sso_cache(key)), exist_ok=True)
        exp = datetime.datetime.fromtimestamp(time.time() + lifetime, datetime.timezone.utc)
        write(self.sso_cache(key),
              json.dumps({"startUrl": "https://corp.awsapps.com/start", "region": "eu-west-1",
                          "accessToken": tok, "expiresAt": exp.strftime(fmt),
                          "clientId": "cid", "clientSecret": "csecret",
                          "registrationExpiresAt": "2099-01-01T00:00:00Z", "refreshToken": refresh}))
        return tok

    def sso_asked(self):
        return [c[1:] for c in self.creds.calls if c[0] == "sso"]

    def test_iam_identity_center(self):
        """A profile with sso_session (and the older form, the start URL in
        the profile): the cached token is traded at the portal for the
        role's keys, before the credentials file's keys (the AWS CLI's
        order); such a profile also signs another's AssumeRole."""
        self.creds.roles.add(self.ROLE)
        env = self.sso_files(
            self.SSO_DEV +
            "[profile legacy]\nsso_start_url = https://old.awsapps.com/start\n"
            f"sso_region = us-east-1\nsso_account_id = {self.ACCOUNT}\n"
            f"sso_role_name = {self.SSO_ROLE}\n"
            f"[profile writer]\nrole_arn = {self.ROLE}\nsource_profile = dev\n",
            f"[dev]\naws_access_key_id = {BOGUS_ID}\naws_secret_access_key = {BOGUS_SECRET}\n")
        tok = self.sso_login("corp")
        p, key = self.upload(dict(env, AWS_PROFILE="dev"))
        self.assert_landed(p, key)
        self.assertEqual(self.source(p), "sso")
        self.assertEqual(self.sso_asked(), [((self.ACCOUNT, self.SSO_ROLE), tok)])
        # the older form; the AWS CLI v1 wrote expiresAt with "UTC"
        self.creds.calls.clear()
        old = self.sso_login("https://old.awsapps.com/start", fmt="%Y-%m-%dT%H:%M:%SUTC")
        p, key = self.upload(dict(env, AWS_PROFILE="legacy"))
        self.assert_landed(p, key)
        self.assertEqual(self.sso_asked(), [((self.ACCOUNT, self.SSO_ROLE), old)])
        # the source of a role
        self.creds.calls.clear()
        p, key = self.upload(dict(env, AWS_PROFILE="writer"))
        self.assert_landed(p, key)
        self.assertEqual(self.source(p), "assume-role")
        self.assertEqual(self.creds.kinds(), ["sso", "assume"])
        self.assertEqual([(c["RoleArn"], c["token"]) for c in self.assumed()], [(self.ROLE, True)])

    def test_iam_identity_center_failures(self):
        """Each says what is wrong and what to run; none falls through to
        other keys (the credentials file's here would be another identity)."""
        env = self.sso_files(
            self.SSO_DEV +
            "[profile half]\nsso_session = corp\nsso_account_id = 1\n"
            "[profile nosession]\nsso_session = gone\nsso_account_id = 1\nsso_role_name = r\n"
            "[profile mixed]\nsso_session = corp\nsso_region = us-west-2\n"
            "sso_account_id = 1\nsso_role_name = r\n"
            "[profile signin]\nsso_session = corp\n"
            "[profile other]\nsso_session = corp\nsso_account_id = 999999999999\n"
            f"sso_role_name = {self.SSO_ROLE}\n",
            f"[dev]\naws_access_key_id = {self.s3.key_id}\naws_secret_access_key = {self.s3.secret}\n")

        def fails(profile, says, asked, oidc=0):
            with self.subTest(profile=profile, says=says):
                self.creds.calls.clear()
                p, _ = self.upload(dict(env, AWS_PROFILE=profile))
                self.assertNotEqual(p.returncode, 0)
                self.assertIn(says, p.stderr)
                self.assertEqual(self.creds.kinds(), ["oidc"] * oidc + ["sso"] * asked)
                self.assertNotIn("source=shared-files", p.stderr)
        fails("dev", "no cached token", 0)
        fails("dev", "run 'aws sso login --profile dev'", 0)
        tok = self.sso_login("corp", lifetime=-60)
        fails("dev", "the cached token expired at", 0, oidc=1)  # its refresh token refused
        tok = self.sso_login("corp")
        self.creds.sso_tokens.discard(tok)  # signed out elsewhere
        fails("dev", "the portal refused the cached token (HTTP 401)", 1)
        self.sso_login("corp")
        fails("other", "the portal refused the cached token (HTTP 403)", 1)
        fails("half", "misses sso_role_name", 0)
        fails("nosession", "its sso_session 'gone' has no [sso-session gone]", 0)
        fails("mixed", "sso_region differs between the profile and [sso-session corp]", 0)
        fails("signin", "uses IAM Identity Center but has no sso_account_id and sso_role_name", 0)
        cache = os.path.join(self.home, ".aws", "sso", "cache",
                             hashlib.sha1(b"corp").hexdigest() + ".json")
        write(cache, '{"accessToken": "x"}')
        fails("dev", "has no accessToken and expiresAt", 0)

    def test_iam_identity_center_token_refreshed_as_the_aws_cli_does(self):
        """Within 15 minutes of its expiry the sso-session form's token is
        refreshed at the OIDC service with the cache's refresh token, and the
        cache rewritten (mode 0600) with the new one; a refused refresh keeps
        a token that is still valid; the older form does not refresh."""
        env = self.sso_files(
            self.SSO_DEV + "[profile legacy]\nsso_start_url = https://old.awsapps.com/start\n"
            f"sso_region = us-east-1\nsso_account_id = {self.ACCOUNT}\n"
            f"sso_role_name = {self.SSO_ROLE}\n")
        self.creds.refresh_tokens.add("rt-1")
        old = self.sso_login("corp", lifetime=300, refresh="rt-1")
        t0 = time.time()
        p, key = self.upload(dict(env, AWS_PROFILE="dev"))
        self.assert_landed(p, key)
        with open(self.sso_cache("corp")) as f:
            cache = json.load(f)
        self.assertEqual(os.stat(self.sso_cache("corp")).st_mode & 0o777, 0o600)
        new = cache["accessToken"]
        self.assertNotEqual(new, old)
        self.assertEqual(self.creds.calls[0], ("oidc", "refresh_token", "rt-1"))
        self.assertEqual(self.sso_asked(), [((self.ACCOUNT, self.SSO_ROLE), new)])
        self.assertIn(cache["refreshToken"], self.creds.refresh_tokens)
        exp = datetime.datetime.strptime(cache["expiresAt"], "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
        self.assertLess(abs(exp - (t0 + 3600)), 60)
        self.assertEqual({k: cache[k] for k in ("startUrl", "region", "clientId", "clientSecret",
                                                 "registrationExpiresAt")},
                         {"startUrl": "https://corp.awsapps.com/start", "region": "eu-west-1",
                          "clientId": "cid", "clientSecret": "csecret",
                          "registrationExpiresAt": "2099-01-01T00:00:00Z"})
        self.assertIn("sso_token_refreshed", p.stderr)
        for secret in (cache["refreshToken"], "rt-1", "csecret"):
            self.assertNotIn(secret, p.stdout + p.stderr)
        # refused (signed out elsewhere) while the token has 5 minutes left: it is used
        self.creds.calls.clear()
        kept = self.sso_login("corp", lifetime=300, refresh="rt-revoked")
        p, key = self.upload(dict(env, AWS_PROFILE="dev"))
        self.assert_landed(p, key)
        self.assertIn("sso_refresh_failed", p.stderr)
        self.assertIn("invalid_grant", p.stderr)
        self.assertEqual(self.sso_asked(), [((self.ACCOUNT, self.SSO_ROLE), kept)])
        # the older form has no refresh
        self.creds.calls.clear()
        self.creds.refresh_tokens.add("rt-2")
        legacy = self.sso_login("https://old.awsapps.com/start", lifetime=300, refresh="rt-2")
        p, key = self.upload(dict(env, AWS_PROFILE="legacy"))
        self.assert_landed(p, key)
        self.assertEqual(self.creds.kinds(), ["sso"])
        self.assertEqual(self.sso_asked(), [((self.ACCOUNT, self.SSO_ROLE), legacy)])

    def test_iam_identity_center_renewed_with_a_new_login(self):
        """The role's keys live 6 s over an upload of about 10 s: they are
        fetched again before they expire, with the token of the login made
        meanwhile (the cache file is read again; the first token is gone)."""
        self.creds.lifetime = 6
        env = self.sso_files(self.SSO_DEV)
        env["AWS_PROFILE"] = "dev"
        first = self.sso_login("corp")
        big = make(os.path.join(self.dir, "shard.bin"), 25 * MiB + 1, 5)
        relogged = []

        def login_again():
            while not self.sso_asked():
                time.sleep(0.05)
            self.creds.sso_tokens.discard(first)
            relogged.append(self.sso_login("corp"))
        t = threading.Thread(target=login_again)
        t.start()
        try:
            p, key = self.upload(env, "--part-size", "5MiB", "--multipart-threshold", "5MiB",
                                 "--max-rate", "2.5MiB", "--concurrency", "2", path=big, timeout=120)
        finally:
            t.join(timeout=60)
        self.assert_landed(p, key, big)
        toks = [tok for _, tok in self.sso_asked()]
        self.assertGreaterEqual(len(toks), 2)
        self.assertEqual(toks[0], first)
        self.assertEqual(set(toks[1:]), set(relogged))
        self.assertEqual(self.issuer.refused, [])
        self.assertIn("source=sso reason=expiring", p.stderr)

    # -- temporary keys over a long upload --

    def test_refresh_before_expiry_during_multipart_with_rotating_token(self):
        """Keys that live 8 s over an upload of about 16 s: ckptd renews them
        before they expire (the gate never answers ExpiredToken), and reads the
        token file again each time (it rotates; STS takes only the newest)."""
        self.creds.lifetime = 8
        env = self.web_identity_env("eyJ.rotation-0.sig")
        big = make(os.path.join(self.dir, "shard.bin"), 40 * MiB + 123, 2)
        stop = threading.Event()

        def rotate():
            n = 0
            while not stop.wait(2.0):
                n += 1
                tok = f"eyJ.rotation-{n}.sig"
                self.creds.web_tokens.clear()
                self.creds.web_tokens.add(tok)
                write(env["AWS_WEB_IDENTITY_TOKEN_FILE"] + ".tmp", tok + "\n", 0o644)
                os.replace(env["AWS_WEB_IDENTITY_TOKEN_FILE"] + ".tmp", env["AWS_WEB_IDENTITY_TOKEN_FILE"])
        t = threading.Thread(target=rotate)
        t.start()
        try:
            t0 = time.monotonic()
            p, key = self.upload(env, "--part-size", "5MiB", "--multipart-threshold", "5MiB",
                                 "--max-rate", "2.5MiB", "--concurrency", "2", path=big, timeout=170)
            took = time.monotonic() - t0
        finally:
            stop.set()
            t.join()
        self.assert_landed(p, key, big)
        self.assertGreater(took, 10)  # the upload outlived the first keys
        sts = [c[1] for c in self.creds.calls if c[0] == "sts"]
        self.assertGreaterEqual(len(sts), 2)
        self.assertEqual(len({c["WebIdentityToken"] for c in sts}), len(sts),
                         "each renewal read the rotated token file")
        self.assertEqual(self.issuer.refused, [])
        self.assertIn("reason=expiring", p.stderr)

    def test_expired_token_answer_renews_and_resends_the_part(self):
        """The gate calls the first keys expired after 1 request (clock skew,
        an early revocation), so the two parts in flight are both refused with
        ExpiredToken: they are sent again with new keys, after one renewal.
        The stand-in STS keeps the key id across renewals (as IMDS does), so
        only the session token tells the refused keys from the new ones."""
        self.issuer.next_dead_after = 1
        big = make(os.path.join(self.dir, "shard.bin"), 24 * MiB, 3)
        p, key = self.upload(self.web_identity_env(), "--part-size", "5MiB",
                             "--multipart-threshold", "5MiB", "--concurrency", "2", path=big)
        self.assert_landed(p, key, big)
        self.assertGreaterEqual(len(self.issuer.refused), 1)
        self.assertTrue(all(code == "ExpiredToken" for code, _ in self.issuer.refused))
        self.assertTrue(any("partNumber=" in path for _, path in self.issuer.refused))
        self.assertEqual(self.creds.kinds().count("sts"), 2)
        self.assertIn("reason=rejected", p.stderr)


class AwsCredRgw(AwsCred):
    """The sources that hand out long-lived keys (environment, the shared
    files, profiles, credential_process), each signing real requests to Ceph's
    RADOS Gateway (CMakeLists.txt lists them). The sources of session tokens
    stay on s3rver: the gate in front of it checks their tokens, RGW has no
    STS of its own here."""

    def server(self):
        return RgwServer(self.dir)


if __name__ == "__main__":
    unittest.main()
