"""Stand-ins for the AWS credential services, on loopback, for the credential
chain tests (issue 17): STS AssumeRoleWithWebIdentity, the container
credentials endpoint (ECS / EKS Pod Identity) and EC2 instance metadata
(IMDSv2), and /process, which a test's credential_process helper fetches
and prints (the AWS CLI's process format: Version 1, AccessKeyId,
SecretAccessKey, SessionToken, Expiration). They follow the documented wire
formats:

- STS: POST / with a form body (Action, RoleArn, RoleSessionName,
  WebIdentityToken, Version), XML answer with Credentials/AccessKeyId,
  SecretAccessKey, SessionToken, Expiration. AssumeRole (RoleArn,
  RoleSessionName, DurationSeconds, ExternalId) must carry an AWS Signature
  Version 4, checked here from the request as received (canonical request,
  string to sign, HMAC chain) with the secret of its key id.
- container: GET the URI with an Authorization header, JSON answer with
  AccessKeyId, SecretAccessKey, Token, Expiration.
- IAM Identity Center's portal (GetRoleCredentials): GET
  /federation/credentials?account_id=...&role_name=... with the access token
  in x-amz-sso_bearer_token (401 UnauthorizedException for a token it did
  not hand out), JSON answer {"roleCredentials": {accessKeyId,
  secretAccessKey, sessionToken, expiration (milliseconds since the epoch)}}.
- IAM Identity Center's OIDC service (CreateToken): POST /token with JSON
  (clientId, clientSecret, grantType refresh_token, refreshToken), JSON
  answer with accessToken, expiresIn (seconds) and a new refreshToken.
- IMDSv2: PUT /latest/api/token (X-aws-ec2-metadata-token-ttl-seconds) gives a
  session token; GETs under /latest/meta-data/iam/security-credentials/ need
  it in X-aws-ec2-metadata-token (401 without), the listing gives the role
  name, the role's document the keys (JSON with Code: Success).

Every source hands out the S3 test server's own key pair (so s3rver accepts
the signature) with a fresh session token. A TokenGate in front of s3rver
(servers.FlakyProxy with a gate) enforces those tokens as AWS does: an
expired one is answered 400 ExpiredToken, an unknown one 403 InvalidToken.
"""
import datetime
import hashlib
import hmac
import http.server
import json
import re
import secrets
import threading
import time
import urllib.parse


def iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Issuer:
    """Mints session tokens for the S3 key pair and remembers their expiry."""

    def __init__(self, key_id, secret):
        self.key_id, self.secret = key_id, secret
        self.lock = threading.Lock()
        self.tokens = {}       # token -> expiry (epoch seconds)
        self.uses = {}         # token -> requests seen by the gate
        self.dead_after = {}   # token -> requests after which the gate calls it expired
        self.refused = []      # (code, path) the gate answered
        self.next_dead_after = None

    def issue(self, lifetime):
        tok = "FQoGZXIvYXdzE" + secrets.token_urlsafe(180)
        exp = int(time.time() + lifetime)
        with self.lock:
            self.tokens[tok] = exp
            if self.next_dead_after is not None:
                self.dead_after[tok] = self.next_dead_after
                self.next_dead_after = None
        return self.key_id, self.secret, tok, exp

    def gate(self, method, path, headers):
        tok = headers.get("x-amz-security-token")
        with self.lock:
            if tok is None:
                return None
            if tok not in self.tokens:
                self.refused.append(("InvalidToken", path))
                return 403, b"<Error><Code>InvalidToken</Code></Error>"
            self.uses[tok] = self.uses.get(tok, 0) + 1
            dead = tok in self.dead_after and self.uses[tok] > self.dead_after[tok]
            if dead or time.time() >= self.tokens[tok]:
                self.refused.append(("ExpiredToken", path))
                return 400, (b"<Error><Code>ExpiredToken</Code><Message>The provided token has "
                             b"expired.</Message></Error>")
        return None


class CredServer:
    """STS, container credentials and IMDSv2 on one loopback port. calls lists
    (kind, details) of every answered request; lifetime is the seconds the
    issued keys live."""

    ROLE = "ckptd-node-role"

    def __init__(self, issuer, lifetime=3600):
        self.issuer = issuer
        self.lifetime = lifetime
        self.web_tokens = set()        # WebIdentityToken values STS accepts
        self.role_arn = "arn:aws:iam::123456789012:role/ckptd"
        self.container_auth = None     # the Authorization value the container endpoint wants
        self.imds_tokens = set()
        self.roles = set()             # RoleArn values AssumeRole grants
        self.signers = {}              # key id -> secret of keys that may sign AssumeRole
        self.sso_tokens = set()        # access tokens the Identity Center portal accepts
        self.sso_roles = set()         # (account id, role name) pairs it grants
        self.oidc_client = ("cid", "csecret")  # the client registration CreateToken knows
        self.refresh_tokens = set()    # refresh tokens CreateToken takes (each once)
        self.calls = []
        self.lock = threading.Lock()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def reply(self, status, body, ctype="application/json"):
                data = body.encode() if isinstance(body, str) else body
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                if self.path == "/token":
                    return self.create_token(raw)
                form = urllib.parse.parse_qs(raw.decode(), keep_blank_values=True)
                one = {k: v[0] for k, v in form.items()}
                if one.get("Action") == "AssumeRole":
                    return self.assume_role(raw, one)
                with outer.lock:
                    outer.calls.append(("sts", one))
                if one.get("Action") != "AssumeRoleWithWebIdentity" or one.get("Version") != "2011-06-15":
                    return self.reply(400, "<ErrorResponse><Error><Code>InvalidAction</Code></Error></ErrorResponse>", "text/xml")
                if one.get("RoleArn") != outer.role_arn or one.get("WebIdentityToken") not in outer.web_tokens:
                    return self.reply(400, "<ErrorResponse><Error><Code>InvalidIdentityToken</Code></Error></ErrorResponse>", "text/xml")
                kid, sec, tok, exp = outer.issuer.issue(outer.lifetime)
                self.reply(200, f"""<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>system:serviceaccount:ml:trainer</SubjectFromWebIdentityToken>
    <AssumedRoleUser><Arn>{outer.role_arn}/{one.get('RoleSessionName')}</Arn><AssumedRoleId>AROA:x</AssumedRoleId></AssumedRoleUser>
    <Credentials>
      <SessionToken>{tok}</SessionToken>
      <SecretAccessKey>{sec}</SecretAccessKey>
      <Expiration>{iso(exp)}</Expiration>
      <AccessKeyId>{kid}</AccessKeyId>
    </Credentials>
  </AssumeRoleWithWebIdentityResult>
</AssumeRoleWithWebIdentityResponse>""", "text/xml")

            def assume_role(self, raw, one):
                """STS AssumeRole: SigV4-signed by keys the stand-in knows
                (outer.signers, or keys it issued with their session token)."""
                kid = self.sigv4_signer(raw)
                tok = self.headers.get("x-amz-security-token")
                with outer.lock:
                    outer.calls.append(("assume", dict(one, signer=kid, token=tok is not None)))
                if kid is None or (tok is not None and tok not in outer.issuer.tokens):
                    return self.reply(403, "<ErrorResponse><Error><Code>SignatureDoesNotMatch</Code></Error></ErrorResponse>", "text/xml")
                if one.get("Version") != "2011-06-15" or one.get("RoleArn") not in outer.roles:
                    return self.reply(403, "<ErrorResponse><Error><Code>AccessDenied</Code></Error></ErrorResponse>", "text/xml")
                kid, sec, tok, exp = outer.issuer.issue(outer.lifetime)
                self.reply(200, f"""<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult>
    <AssumedRoleUser><Arn>{one['RoleArn']}/{one.get('RoleSessionName')}</Arn><AssumedRoleId>AROA:y</AssumedRoleId></AssumedRoleUser>
    <Credentials>
      <AccessKeyId>{kid}</AccessKeyId>
      <SecretAccessKey>{sec}</SecretAccessKey>
      <SessionToken>{tok}</SessionToken>
      <Expiration>{iso(exp)}</Expiration>
    </Credentials>
  </AssumeRoleResult>
</AssumeRoleResponse>""", "text/xml")

            def sigv4_signer(self, body):
                """The access key id whose AWS Signature Version 4 over this
                request verifies (service sts), or None."""
                m = re.fullmatch(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/(sts)/aws4_request, ?"
                                 r"SignedHeaders=([a-z0-9;-]+), ?Signature=([0-9a-f]{64})",
                                 self.headers.get("Authorization", ""))
                secrets_by_id = dict(outer.signers, **{outer.issuer.key_id: outer.issuer.secret})
                if not m or m[1] not in secrets_by_id or "x-amz-date" not in m[5].split(";"):
                    return None
                kid, date, region, service, signed, sig = m.groups()
                path, _, query = self.path.partition("?")
                headers = "".join(f"{h}:{' '.join((self.headers.get(h) or '').split())}\n"
                                  for h in signed.split(";"))
                creq = "\n".join(["POST", path, "&".join(sorted(query.split("&"))) if query else "",
                                  headers, signed, hashlib.sha256(body).hexdigest()])
                scope = f"{date}/{region}/{service}/aws4_request"
                to_sign = "\n".join(["AWS4-HMAC-SHA256", self.headers["x-amz-date"], scope,
                                     hashlib.sha256(creq.encode()).hexdigest()])
                k = ("AWS4" + secrets_by_id[kid]).encode()
                for part in (date, region, service, "aws4_request"):
                    k = hmac.new(k, part.encode(), hashlib.sha256).digest()
                want = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
                return kid if hmac.compare_digest(want, sig) else None

            def keys_json(self, with_code):
                kid, sec, tok, exp = outer.issuer.issue(outer.lifetime)
                d = {"AccessKeyId": kid, "SecretAccessKey": sec, "Token": tok,
                     "Expiration": iso(exp)}
                if with_code:
                    d = dict({"Code": "Success", "LastUpdated": iso(time.time()), "Type": "AWS-HMAC"}, **d)
                return json.dumps(d, indent=2)

            def do_PUT(self):
                if self.path != "/latest/api/token":
                    return self.reply(404, "")
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                with outer.lock:
                    outer.calls.append(("imds-token", ttl))
                if not ttl or not ttl.isdigit():
                    return self.reply(400, "")
                t = secrets.token_urlsafe(40)
                outer.imds_tokens.add(t)
                self.reply(200, t, "text/plain")

            def do_GET(self):
                p = self.path
                if p.startswith("/latest/"):
                    tok = self.headers.get("X-aws-ec2-metadata-token")
                    with outer.lock:
                        outer.calls.append(("imds", p))
                    if tok not in outer.imds_tokens:
                        return self.reply(401, "")
                    base = "/latest/meta-data/iam/security-credentials/"
                    if p == base:
                        return self.reply(200, outer.ROLE, "text/plain")
                    if p == base + outer.ROLE:
                        return self.reply(200, self.keys_json(True))
                    return self.reply(404, "")
                if p.startswith("/federation/credentials?"):
                    return self.sso_role_credentials(p)
                if p.startswith("/process"):
                    # what a credential_process helper fetches (the test's
                    # helper script prints it as the AWS CLI's process format)
                    with outer.lock:
                        outer.calls.append(("process", p))
                    kid, sec, tok, exp = outer.issuer.issue(outer.lifetime)
                    return self.reply(200, json.dumps({"Version": 1, "AccessKeyId": kid,
                                                       "SecretAccessKey": sec, "SessionToken": tok,
                                                       "Expiration": iso(exp)}))
                with outer.lock:
                    outer.calls.append(("container", p, self.headers.get("Authorization")))
                if outer.container_auth is not None and self.headers.get("Authorization") != outer.container_auth:
                    return self.reply(401, '{"message":"bad token"}')
                if p not in ("/v2/credentials/pod", "/creds"):
                    return self.reply(404, "")
                self.reply(200, self.keys_json(False))

            def create_token(self, raw):
                """IAM Identity Center's OIDC CreateToken with a refresh token:
                JSON in, a new access token (the portal takes it) and a new
                refresh token out; 400 invalid_grant for a refresh token it
                did not hand out."""
                req = json.loads(raw or b"{}")
                with outer.lock:
                    outer.calls.append(("oidc", req.get("grantType"), req.get("refreshToken")))
                if (req.get("grantType") != "refresh_token" or
                        (req.get("clientId"), req.get("clientSecret")) != outer.oidc_client or
                        req.get("refreshToken") not in outer.refresh_tokens):
                    return self.reply(400, '{"error":"invalid_grant"}')
                tok = "aoa" + secrets.token_urlsafe(300)
                new_refresh = "rt-" + secrets.token_urlsafe(40)
                with outer.lock:
                    outer.sso_tokens.add(tok)
                    outer.refresh_tokens.discard(req["refreshToken"])
                    outer.refresh_tokens.add(new_refresh)
                self.reply(200, json.dumps({"accessToken": tok, "expiresIn": 3600,
                                            "refreshToken": new_refresh, "tokenType": "Bearer"}))

            def sso_role_credentials(self, p):
                q = {k: v[0] for k, v in urllib.parse.parse_qs(p.partition("?")[2]).items()}
                tok = self.headers.get("x-amz-sso_bearer_token")
                pair = (q.get("account_id"), q.get("role_name"))
                with outer.lock:
                    outer.calls.append(("sso", pair, tok))
                if tok not in outer.sso_tokens:
                    return self.reply(401, '{"message":"Session token not found or invalid"}')
                if pair not in outer.sso_roles:
                    return self.reply(403, '{"message":"No access"}')
                kid, sec, stok, exp = outer.issuer.issue(outer.lifetime)
                self.reply(200, json.dumps({"roleCredentials": {
                    "accessKeyId": kid, "secretAccessKey": sec, "sessionToken": stok,
                    "expiration": exp * 1000}}))

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def kinds(self):
        with self.lock:
            return [c[0] for c in self.calls]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
