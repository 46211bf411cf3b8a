#!/bin/bash
# A throwaway single-node Ceph cluster with the RADOS Gateway (Debian 12's
# ceph 16.2) on loopback, for the S3 tests that need a production S3 server:
#   rgw.sh start DIR   starts mon, mgr, one memstore OSD and radosgw, with
#                      ports free on this machine (DIR/endpoint says where),
#                      and a user whose keys are in DIR/keys
#   rgw.sh stop DIR    stops exactly the processes start recorded in DIR/pids
# CK_RGW_MEMSTORE_BYTES sizes the OSD's RAM store (default 1 GiB: the tests'
# objects are small; bench/upload.sh's GiB-sized runs ask for more)
# Facts it relies on (../shared/TESTGROUND.md): `auth none` needs
# `ms mon client mode = crc secure`; memstore keeps objects in RAM (tests keep
# them small); buckets fail until every placement group is active.
set -euo pipefail
cmd=${1:?usage: rgw.sh start|stop DIR}
R=$(mkdir -p "${2:?usage: rgw.sh start|stop DIR}" && cd "$2" && pwd)

stop() {
  [ -f "$R/pids" ] || return 0
  tac "$R/pids" | while read -r name pid; do kill "$pid" 2>/dev/null || true; done
  for _ in $(seq 20); do
    alive=0
    while read -r name pid; do kill -0 "$pid" 2>/dev/null && alive=1; done < "$R/pids"
    [ $alive = 0 ] && break
    sleep 0.5
  done
  while read -r name pid; do kill -9 "$pid" 2>/dev/null || true; done < "$R/pids"
  rm -f "$R/pids"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
for tool in ceph-mon ceph-osd ceph-mgr radosgw radosgw-admin monmaptool ceph-authtool uuidgen; do
  command -v $tool >/dev/null || { echo "rgw.sh: $tool is not installed (apt-get install ceph-mon ceph-osd ceph-mgr radosgw ceph-common uuid-runtime)" >&2; exit 3; }
done
stop
rm -rf "$R"/{mon,osd,mgr,run,log,crash,monmap,endpoint,keys}
mkdir -p "$R"/{mon/a,osd/0,mgr/x,run,log,crash}
MON2=$(free_port) MON1=$(free_port) RGW=$(free_port)
FSID=$(uuidgen)
C=$R/ceph.conf
cat > "$C" <<CONF
[global]
fsid = $FSID
mon initial members = a
mon host = [v2:127.0.0.1:$MON2,v1:127.0.0.1:$MON1]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
ms mon client mode = crc secure
osd objectstore = memstore
memstore device bytes = ${CK_RGW_MEMSTORE_BYTES:-1073741824}
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon max pg per osd = 1000
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
run dir = $R/run
crash dir = $R/crash
log file = $R/log/\$name.log
admin socket = $R/run/\$name.asok
keyring = $R/keyring
[mon.a]
mon data = $R/mon/a
[mgr.x]
mgr data = $R/mgr/x
[osd.0]
osd data = $R/osd/0
osd journal = $R/osd/0/journal
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$RGW
rgw data = $R/rgw
CONF
: > "$R/keyring"
: > "$R/pids"
mkdir -p "$R/rgw"
exec 3>"$R/log/start.log"
monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$MON2,v1:127.0.0.1:$MON1]" "$R/monmap" >&3
ceph-authtool --create-keyring "$R/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >&3
ceph-mon -c "$C" -i a --mkfs --monmap "$R/monmap" --keyring "$R/mon.keyring" >&3 2>&1
setsid ceph-mon -c "$C" -i a -f >"$R/log/mon.out" 2>&1 < /dev/null & echo "mon.a $!" >> "$R/pids"
for _ in $(seq 120); do ceph -c "$C" -s >/dev/null 2>&1 && break; sleep 0.5; done
ceph -c "$C" mon enable-msgr2 >&3 2>&1 || true
setsid ceph-mgr -c "$C" -i x -f >"$R/log/mgr.out" 2>&1 < /dev/null & echo "mgr.x $!" >> "$R/pids"
OSD_UUID=$(uuidgen)
ID=$(ceph -c "$C" osd new "$OSD_UUID")
ceph-osd -c "$C" -i "$ID" --mkfs --osd-uuid "$OSD_UUID" >&3 2>&1
setsid ceph-osd -c "$C" -i "$ID" -f >"$R/log/osd.out" 2>&1 < /dev/null & echo "osd.$ID $!" >> "$R/pids"
for _ in $(seq 180); do ceph -c "$C" osd stat 2>/dev/null | grep -q '1 up' && break; sleep 0.5; done
setsid radosgw -c "$C" -n client.rgw.a -f >"$R/log/rgw.out" 2>&1 < /dev/null & echo "rgw.a $!" >> "$R/pids"
for _ in $(seq 240); do curl -s -o /dev/null "http://127.0.0.1:$RGW/" && break; sleep 0.5; done
curl -s -o /dev/null "http://127.0.0.1:$RGW/" || { echo "rgw.sh: radosgw did not answer; see $R/log" >&2; stop; exit 1; }
KEY=CKPTRGW$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F)
SECRET=$(head -c 30 /dev/urandom | base64 | tr -d '/+=\n')
radosgw-admin -c "$C" user create --uid=ckpt --display-name="ckptd test" \
  --access-key="$KEY" --secret-key="$SECRET" >&3 2>&1
for _ in $(seq 240); do
  ceph -c "$C" pg stat 2>/dev/null | grep -qE 'unknown|creating|peering|activating' || break; sleep 0.5
done
( umask 077; printf '%s %s\n' "$KEY" "$SECRET" > "$R/keys" )
echo "http://127.0.0.1:$RGW" > "$R/endpoint"
echo "rgw.sh: radosgw at http://127.0.0.1:$RGW ($R)"
