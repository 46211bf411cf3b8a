#!/usr/bin/env bash
# Installs a ckptd .deb on this machine (root; CI's machine is disposable) and
# checks what a user gets: the binary on its installed path, the systemd unit
# verified by systemd-analyze, the user it runs as, the documentation the unit
# names. Removes the package again at the end. Usage: scripts/check-installed.sh DEB
set -euo pipefail
deb=$1
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
fail() { echo "check-installed: $*" >&2; exit 1; }
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$(readlink -f "$deb")" >/dev/null
trap '$sudo dpkg --purge ckptd >/dev/null 2>&1 || true' EXIT
[ "$(command -v ckptd)" = /usr/bin/ckptd ] || fail "ckptd is not /usr/bin/ckptd on PATH"
want=$(dpkg-deb -f "$deb" Version)
got=$(/usr/bin/ckptd --version)
[ "$got" = "ckptd $want" ] || fail "'ckptd --version' says '$got', the package is $want"
[ "$(command -v mldef)" = /usr/bin/mldef ] || fail "mldef is not /usr/bin/mldef on PATH"
/usr/bin/mldef --help >/dev/null || fail "'mldef --help' failed"
unit=/usr/lib/systemd/system/ckptd@.service
[ -f "$unit" ] || fail "$unit is missing"
grep -q '^ExecStart=/usr/bin/ckptd watch ' "$unit" || fail "$unit does not run /usr/bin/ckptd"
if grep -q -- '--listen' "$unit"; then fail "$unit fixes a listen port for every instance"; fi
out=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify warns: $out"
doc=$(sed -n 's#^Documentation=file://##p' "$unit")
[ -f "$doc" ] || fail "the unit's Documentation= '$doc' is not installed"
getent passwd ckptd >/dev/null || fail "the package did not create the user ckptd"
[ -f /usr/share/doc/ckptd/examples/ckptd.example.yaml ] || fail "the example config is missing"
# the example names secrets (env: and one file:) that a real host provides
tmp=$(mktemp -d)
trap '$sudo dpkg --purge ckptd >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
head -c 32 /dev/urandom | base64 | sed 's/^/whsec_/' > "$tmp/next" && chmod 600 "$tmp/next"
cp /usr/share/doc/ckptd/examples/slack.json "$tmp/"
# the files its verify keys name, beside it (relative paths: the config's folder)
mkdir -p "$tmp/golden" && : > "$tmp/golden/x.npy"
/usr/bin/ckptd keygen -o "$tmp/deploy.key" >/dev/null || fail "keygen does not write a key"
sed -e "s#/etc/ckptd/webhook-secret.next#$tmp/next#" -e "s#/etc/ckptd/deploy.key#$tmp/deploy.key#" \
    /usr/share/doc/ckptd/examples/ckptd.example.yaml > "$tmp/ckptd.yaml"
CKPTD_WEBHOOK_SECRET="whsec_$(head -c 32 /dev/urandom | base64)" \
CKPTD_SLACK_WEBHOOK_URL=https://hooks.example.com/x \
    /usr/bin/ckptd config -c "$tmp/ckptd.yaml" >/dev/null || fail "the installed example config does not load"
echo "check-installed: $deb: ckptd $want at /usr/bin/ckptd, unit verified, user ckptd, docs: ok"
