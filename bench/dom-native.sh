#!/usr/bin/env bash
# Issue 18's `bench md` natively: 4 KiB files created and written, stat'ed, read and
# removed, with the root's layout one OST stripe (`-c 1`) then Data-on-MDT
# (`-E 1M -L mdt`), on a fresh `lode up` per binary and round, with the OST RPCs
# (`obdfilter.*.stats`) each run made. Before the DoM run it waits until the OST run's
# objects are destroyed (the MDT destroys them in the background once the unlinks
# commit), so the count is the DoM run's own.
# Usage (as root): bench/dom-native.sh PORT_BASE ROUNDS ITEMS BINARY...
set -u
PB=$1; ROUNDS=$2; N=$3; shift 3
D=$(mktemp -d /tmp/lode-dom-native.XXXXXX)
ost_rpcs() { "$1" get-param 'obdfilter.*.stats' | awk '$1 ~ /^ost_/ && $3 == "samples" {s += $2} END {print s + 0}'; }
for i in $(seq "$ROUNDS"); do
  for B in "$@"; do
    "$B" down --dir "$D/fs" >/dev/null 2>&1; rm -rf "$D/fs"
    "$B" up --dir "$D/fs" --port-base "$PB" >/dev/null || exit 1
    export LODE_KEY_FILE=$D/fs/key LODE_RUN_DIR=$D/fs/run
    echo -n "$(basename "$B") round $i: "
    for L in ost dom; do
      if [ $L = ost ]; then "$B" setstripe -c 1 "$D/fs/mnt"; else "$B" setstripe -E 1M -L mdt "$D/fs/mnt"; fi
      for _ in $(seq 60); do
        [ $L = ost ] && break
        d=$("$B" get-param 'mdt.*.destroys' | awk '/destroyed:/ {print $2}')
        [ "${d:-0}" -ge "$N" ] && break
        sleep 1
      done
      o0=$(ost_rpcs "$B")
      "$B" bench md --native "127.0.0.1:$PB:/lode" --items "$N" --write-bytes 4096 --read-bytes 4096 2>&1 |
        awk -v l=$L '/^ *File (creation|read) *:.*ops\/s/ {printf "%s_%s=%d ", l, $2, $4}'
      echo -n "${L}_ost_rpcs=$(( $(ost_rpcs "$B") - o0 )) "
    done
    echo
    "$B" down --dir "$D/fs" >/dev/null 2>&1
    sleep 20 # this disk reuses freed inodes slowly (see BENCHMARKS.md)
  done
done
rm -rf "$D"
