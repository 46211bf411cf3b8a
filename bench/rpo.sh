#!/bin/sh
# The recovery point of one large checkpoint (issue 36), on a release build:
# a file written beside 'ckptd watch DIR --settle 0' (the store in
# DIR/ckptd.yaml), from its close until the object is whole in the store, and
# until the store's metadata.yaml names it, against the upload alone of the
# same file in the same run ('ckptd upload', same binary, a fresh queue) and a
# peer (cp, curl -T, aws). Store kinds: file, webdav (nginx), s3 (s3rver, one
# PUT) and s3mp (s3rver, multipart); servers on loopback (tests/lib/servers.py).
#   nice -n 10 scripts/setup.sh $PWD/build-rel
#   bench/rpo.sh [path/to/ckptd] [MIB (512)] [ROUNDS (3)] [KIND...]
# Its files (the source, the training folder, the stores: about 4x MIB) go to
# /dev/shm when it is a tmpfs with room, else $TMPDIR (CKPTD_BENCH_TMP=DIR
# chooses): on a disk, the writeback of the file just written competes with
# the file store's fsync and the servers' writes, which is the trainer's disk
# and not what ckptd adds, and moves the figures by 2x from run to run.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ckptd=${1:-$here/../build-rel/agent/ckptd}
[ -x "$ckptd" ] || { echo "no ckptd at $ckptd (build-rel first)" >&2; exit 2; }
mib=${2:-512}
rounds=${3:-3}
[ $# -ge 3 ] && shift 3 || shift $#
if [ -z "${CKPTD_BENCH_TMP:-}" ] && [ -d /dev/shm ] &&
    [ "$(df -Pm /dev/shm | awk 'NR == 2 { print $4 }')" -gt $((mib * 5)) ]; then
    export CKPTD_BENCH_TMP=/dev/shm
fi
exec /usr/bin/python3 "$here/rpo_bench.py" "$ckptd" "$here/../tests/lib" "$mib" "$rounds" "$@"
