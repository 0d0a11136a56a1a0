#!/usr/bin/env bash
# Formats (once) and starts a local file system: MGS, MDT0, OST0, OST1 on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
LODE="${LODE:-${CARGO_TARGET_DIR:-target}/release/lode}"
D="${1:-./lode-data}"
mkdir -p "$D"
export LODE_RUN_DIR="${LODE_RUN_DIR:-$D/run}"
fmt() { [ -f "$D/$2/CONFIG" ] || "$LODE" mkfs "$1" --fsname lode --index "$3" --mgsnode 127.0.0.1:9880 "$D/$2" >/dev/null; }
fmt --mgs mgs 0
fmt --mdt mdt0 0
fmt --ost ost0 0
fmt --ost ost1 1
start() {
    if [ -f "$D/$2.pid" ] && kill -0 "$(cat "$D/$2.pid")" 2>/dev/null; then
        echo "$2 already running"
        return
    fi
    nohup "$LODE" "$1" "$D/$2" >>"$D/$2.log" 2>&1 &
    echo $! >"$D/$2.pid"
}
start mgs mgs
start mds mdt0
start oss ost0
start oss ost1
sleep 1
for t in mgs mdt0 ost0 ost1; do
    kill -0 "$(cat "$D/$t.pid")" 2>/dev/null || { echo "lode: $t failed to start, see $D/$t.log" >&2; exit 1; }
done
echo "lode is running: MGS 127.0.0.1:9880, MDT0 :9900, OST0 :9950, OST1 :9951 (data in $D)"
echo "stop it with: ./scripts/stop-local.sh $D"
