#!/usr/bin/env bash
# Measures lode (mount and native) beside tmpfs, the local disk, a FUSE passthrough
# (bindfs over tmpfs) and MooseFS, in one sitting on this machine, for
# docs/BENCHMARKS.md. Results: JSON and text tables in OUT (default docs/bench-results).
# Needs root (mounts) and a release build. Usage: bench/run-all.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
L="${LODE:-${CARGO_TARGET_DIR:-target}/release/lode}"
OUT="${1:-docs/bench-results}"
W="${BENCH_WORK:-/tmp/lode-bench-sitting}"
ITEMS="${ITEMS:-10000}"
WALK_FILES="${WALK_FILES:-100000}"
mkdir -p "$OUT" "$W/disk" "$W/tmpfs"

cleanup() {
    "$L" down --dir "$W/lode" >/dev/null 2>&1 || true
    bench/peers/bindfs.sh down "$W/bindsrc" "$W/bindfs" >/dev/null 2>&1 || true
    bench/peers/moosefs.sh down "$W/mfs" "$W/mfsmnt" >/dev/null 2>&1 || true
    umount "$W/tmpfs" 2>/dev/null || true
}
trap cleanup EXIT

"$L" up --dir "$W/lode" --port-base 19880 >/dev/null
# `lode up` makes a keyed file system: native clients need its key.
export LODE_KEY_FILE="$W/lode/key"
mountpoint -q "$W/tmpfs" || mount -t tmpfs -o size=6g lode-bench-tmpfs "$W/tmpfs"
bench/peers/bindfs.sh up "$W/bindsrc" "$W/bindfs" >/dev/null
bench/peers/moosefs.sh up "$W/mfs" "$W/mfsmnt" >/dev/null

targets=(
    "lode:--path $W/lode/mnt"
    "lode-native:--native 127.0.0.1:19880:/lode"
    "tmpfs:--path $W/tmpfs"
    "disk:--path $W/disk"
    "bindfs:--path $W/bindfs"
    "moosefs:--path $W/mfsmnt"
)

run() {
    local name=$1
    shift
    echo "== $name: lode bench $*" >&2
    # shellcheck disable=SC2068
    "$L" bench $@ --json "$OUT/$name.json" >"$OUT/$name.txt"
}

for t in "${targets[@]}"; do
    n=${t%%:*}
    args=${t#*:}
    run "md-easy1-$n" md $args --items "$ITEMS" --clients 1 --unique-dir
    run "md-easy2-$n" md $args --items "$ITEMS" --clients 2 --unique-dir
    run "md-hard2-$n" md $args --items "$((ITEMS / 2))" --clients 2 --write-bytes 3901 --read-bytes 3901
    run "walk-$n" walk $args --dirs 1 --files "$WALK_FILES" --walkers 2
    run "io-$n" io $args --clients 2 --block 256M --transfer 1M
done
# One client, eight threads sharing it (many RPCs in flight on one connection).
run "md-native8-lode-native" md --native 127.0.0.1:19880:/lode --threads 8 --items "$ITEMS" --unique-dir
echo "results in $OUT" >&2
