#!/usr/bin/env bash
# Checks a ckptd .deb the way a Debian user meets it (root; CI's machine is
# disposable): lintian accepts it (no E: line), it installs without a warning
# from its maintainer scripts, the binaries are on their installed paths, the
# man pages open with `man`, the systemd unit is verified by systemd-analyze,
# the user, /etc/ckptd, /var/log/ckptd and /var/lib/ckptd exist as the unit
# and the cron example need them, the cron example's line runs as the user
# ckptd on a training directory set up as docs/deployment.md says, and a
# remove and a purge take away what they should. Removes the package at the
# end. Usage: scripts/check-installed.sh DEB
set -euo pipefail
deb=$(readlink -f "$1")
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
fail() { echo "check-installed: $*" >&2; exit 1; }

# lintian: errors fail, warnings are shown
if command -v lintian >/dev/null; then
    lint=$(lintian --tag-display-limit 0 "$deb" 2>&1 | grep -v 'root privileges is not recommended' || true)
    [ -z "$lint" ] || echo "$lint" | sed 's/^/lintian: /'
    if echo "$lint" | grep -q '^E:'; then fail "lintian reports errors (E: lines above)"; fi
else
    fail "lintian is not installed (.ci/packages.txt lists it)"
fi

tmp=$(mktemp -d)
cleanup() { $sudo dpkg --purge ckptd >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
out=$(DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$deb" 2>&1) ||
    fail "apt-get install: $out"
# adduser's warnings (a home it cannot reach, ...) and the scripts' own noise
if echo "$out" | grep -i -E 'warn|adduser' | grep -v -E '^W: (Download|Repository)'; then
    fail "installing printed the warnings above"
fi
[ "$(command -v ckptd)" = /usr/bin/ckptd ] || fail "ckptd is not /usr/bin/ckptd on PATH"
want=$(dpkg-deb -f "$deb" Version)
got=$(/usr/bin/ckptd --version)
[ "$got" = "ckptd $want" ] || fail "'ckptd --version' says '$got', the package is $want"
[ "$(command -v mldef)" = /usr/bin/mldef ] || fail "mldef is not /usr/bin/mldef on PATH"
/usr/bin/mldef --help >/dev/null || fail "'mldef --help' failed"

# the man pages: found by man, rendered, and saying what the binary says
for page in "1 ckptd" "1 mldef" "5 ckptd.yaml"; do
    set -- $page
    [ "$(man -w "$1" "$2" 2>&1)" = "/usr/share/man/man$1/$2.$1.gz" ] ||
        fail "man $1 $2: not installed ($(man -w "$1" "$2" 2>&1))"
done
text=$(MANWIDTH=100 MANPAGER=cat man 1 ckptd 2>&1) || fail "man ckptd: $text"
for cmd in $(/usr/bin/ckptd --help | sed -n 's/^  \([a-z]*\) .*/\1/p'); do
    echo "$text" | grep -q -x "   ckptd $cmd" || fail "man ckptd has no section for the command '$cmd'"
done
text=$(MANWIDTH=200 MANPAGER=cat man 5 ckptd.yaml 2>&1) || fail "man ckptd.yaml: $text"
for key in $(/usr/bin/ckptd config --keys | awk '{print $1}'); do
    echo "$text" | grep -q -E "^       ${key//./\\.}( |\$)" || fail "man 5 ckptd.yaml does not list the key '$key'"
done

unit=/usr/lib/systemd/system/ckptd@.service
[ -f "$unit" ] || fail "$unit is missing"
grep -q '^ExecStart=/usr/bin/ckptd watch ' "$unit" || fail "$unit does not run /usr/bin/ckptd"
if grep -q -- '--listen' "$unit"; then fail "$unit fixes a listen port for every instance"; fi
# a training directory that does not exist yet must not fail the start: ckptd waits for it
grep -q '^ReadWritePaths=-%f$' "$unit" || fail "$unit: ReadWritePaths= of DIR is not optional ('-%f')"
grep -q '^ExecReload=/bin/kill -HUP \$MAINPID$' "$unit" || fail "$unit: no ExecReload (systemctl reload)"
# systemd-analyze verify needs a systemd it can load units with; a container
# without one says so on a unit known to be good, and the check is skipped
good=$tmp/ck-probe.service
printf '[Service]\nExecStart=/bin/true\n' > "$good"
if probe=$(systemd-analyze verify "$good" 2>&1) && [ -z "$probe" ]; then
    out=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify: $out"
    [ -z "$out" ] || fail "systemd-analyze verify warns: $out"
    verified="unit verified"
else
    echo "check-installed: systemd-analyze verify skipped: it cannot verify even a trivial unit here: ${probe:-no systemd}"
    verified="unit not verified (no systemd here)"
fi
for doc in $(sed -n 's#^Documentation=##p' "$unit"); do
    case $doc in
        file://*) [ -f "${doc#file://}" ] || fail "the unit's Documentation= '$doc' is not installed" ;;
        man:*) p=${doc#man:}; man -w "${p%(*}" >/dev/null 2>&1 || fail "the unit's Documentation= '$doc' is not installed" ;;
    esac
done

# the user, and what the unit and the cron example need on the machine
getent passwd ckptd >/dev/null || fail "the package did not create the user ckptd"
[ "$(stat -c '%a %U %G' /etc/ckptd/ckptd.env)" = "640 root ckptd" ] ||
    fail "/etc/ckptd/ckptd.env is $(stat -c '%a %U %G' /etc/ckptd/ckptd.env), not 640 root ckptd"
[ -f /etc/ckptd/ckptd.example.yaml ] || fail "/etc/ckptd/ckptd.example.yaml is missing"
[ "$(stat -c '%U' /var/log/ckptd)" = ckptd ] || fail "/var/log/ckptd is not the user ckptd's"
[ "$(stat -c '%U' /var/lib/ckptd/textfile)" = ckptd ] || fail "/var/lib/ckptd/textfile is not the user ckptd's"
[ -f /usr/share/doc/ckptd/copyright ] || fail "/usr/share/doc/ckptd/copyright is missing"
[ -f /usr/share/doc/ckptd/examples/ckptd.example.yaml ] || fail "the example config is missing"

# the example names secrets (env: and one file:) that a real host provides
mkdir -p "$tmp/ex"
head -c 32 /dev/urandom | base64 | sed 's/^/whsec_/' > "$tmp/ex/next" && chmod 600 "$tmp/ex/next"
cp /usr/share/doc/ckptd/examples/slack.json "$tmp/ex/"
# the files its verify keys name, beside it (relative paths: the config's folder)
mkdir -p "$tmp/ex/golden" && : > "$tmp/ex/golden/x.npy"
/usr/bin/ckptd keygen -o "$tmp/ex/deploy.key" >/dev/null || fail "keygen does not write a key"
sed -e "s#/etc/ckptd/webhook-secret.next#$tmp/ex/next#" -e "s#/etc/ckptd/deploy.key#$tmp/ex/deploy.key#" \
    /usr/share/doc/ckptd/examples/ckptd.example.yaml > "$tmp/ex/ckptd.yaml"
CKPTD_WEBHOOK_SECRET="whsec_$(head -c 32 /dev/urandom | base64)" \
CKPTD_SLACK_WEBHOOK_URL=https://hooks.example.com/x \
    /usr/bin/ckptd config -c "$tmp/ex/ckptd.yaml" >/dev/null || fail "the installed example config does not load"

# the cron example's line, as cron runs it: the user ckptd, /bin/sh, its PATH.
# The training directory is set up as docs/deployment.md says (a group the
# trainer and ckptd share, setgid); a secret in the env file reaches ckptd.
cronline=$(grep -E '^\* \* \* \* \*' /usr/share/doc/ckptd/examples/ckptd.cron | head -1)
[ -n "$cronline" ] || fail "the cron example has no job line"
user=$(echo "$cronline" | awk '{print $6}')
[ "$user" = ckptd ] || fail "the cron example runs as '$user', not ckptd"
cmd=$(echo "$cronline" | sed -E 's/^([^ ]+ +){6}//')
run=$tmp/srv/run42
install -d -m 0755 "$tmp/srv" && install -d -g ckptd -m 2775 "$run"
chmod 0755 "$tmp"
head -c 20000 /dev/urandom > "$run/epoch_1.pt" && chmod 0644 "$run/epoch_1.pt"
touch -d '-1 min' "$run/epoch_1.pt"
printf 'hooks:\n  exec:\n    - event: checkpoint.registered\n      command: ["/bin/sh", "-c", "echo \\"$CK_CRON_CHECK\\" > %s/hook.out"]\n      env: [CK_CRON_CHECK]\n' "$run" > "$run/ckptd.yaml"
chmod 0644 "$run/ckptd.yaml"
echo "CK_CRON_CHECK=from-the-env-file" >> /etc/ckptd/ckptd.env
cmd=${cmd//\/srv\/training\/run42/$run}
rc=0
( cd / && runuser -u ckptd -- env -i HOME=/var/lib/ckptd LOGNAME=ckptd \
    PATH=/usr/local/bin:/usr/bin:/bin /bin/sh -c "$cmd" ) || rc=$?
log=/var/log/ckptd/run42.log
[ "$rc" -eq 0 ] || fail "the cron example's line exited $rc: $(cat "$log" 2>/dev/null)"
[ -s "$log" ] || fail "the cron example's line wrote no log to $log"
grep -q 'checkpoint.registered' "$log" || fail "the cron run registered nothing: $(cat "$log")"
grep -q 'epoch_1.pt' "$run/metadata.yaml" || fail "the cron run wrote no metadata.yaml entry"
[ -s /var/lib/ckptd/textfile/ckptd-run42.prom ] || fail "the cron run wrote no metrics textfile"
[ "$(cat "$run/hook.out" 2>/dev/null)" = from-the-env-file ] ||
    fail "a variable of /etc/ckptd/ckptd.env did not reach ckptd (hook.out: $(cat "$run/hook.out" 2>&1))"

# remove keeps the conffiles and the logs; purge takes them
DEBIAN_FRONTEND=noninteractive $sudo apt-get remove -y -qq ckptd >/dev/null 2>&1 || fail "apt-get remove failed"
[ ! -e /usr/bin/ckptd ] || fail "/usr/bin/ckptd is still there after remove"
[ -f /etc/ckptd/ckptd.env ] || fail "remove took the conffile /etc/ckptd/ckptd.env"
$sudo dpkg --purge ckptd >/dev/null 2>&1 || fail "dpkg --purge failed"
[ ! -e /var/log/ckptd ] || fail "/var/log/ckptd is still there after purge"
[ ! -e /etc/ckptd/ckptd.env ] || fail "/etc/ckptd/ckptd.env is still there after purge"
echo "check-installed: $deb: lintian without errors, ckptd $want at /usr/bin/ckptd, man pages, $verified, user ckptd, cron line, remove and purge: ok"
