#!/usr/bin/env bash
# lode's mount against MooseFS, md easy (2 clients × ITEMS, own directories) and md
# hard (2 clients × ITEMS/2 in one directory, 3,901 bytes written and read),
# alternating the two ROUNDS times on fresh file systems, so that this noisy machine's
# drift falls on both. Results: JSON and text per run in OUT, then one line per run.
# Needs root (mounts) and a release build. LODE_LAYOUT, if set, is given to
# `lode setstripe` on lode's root first (e.g. "-E 64K -L mdt -E -1 -c 1": every file
# Data-on-MDT up to 64 KiB). Usage: bench/vs-moosefs.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
L="${LODE:-${CARGO_TARGET_DIR:-target}/release/lode}"
OUT="${1:-docs/bench-results/vs-moosefs}"
W="${BENCH_WORK:-/tmp/lode-vs-moosefs}"
ITEMS="${ITEMS:-10000}"
ROUNDS="${ROUNDS:-2}"
mkdir -p "$OUT" "$W"

cleanup() {
    "$L" down --dir "$W/lode" >/dev/null 2>&1 || true
    bench/peers/moosefs.sh down "$W/mfs" "$W/mfsmnt" >/dev/null 2>&1 || true
}
trap cleanup EXIT

md() {
    local name=$1 path=$2
    "$L" bench md --path "$path" --items "$ITEMS" --clients 2 --unique-dir \
        --json "$OUT/easy-$name.json" >"$OUT/easy-$name.txt"
    "$L" bench md --path "$path" --items "$((ITEMS / 2))" --clients 2 \
        --write-bytes 3901 --read-bytes 3901 \
        --json "$OUT/hard-$name.json" >"$OUT/hard-$name.txt"
}

for r in $(seq 1 "$ROUNDS"); do
    rm -rf "$W/lode"
    "$L" up --dir "$W/lode" --port-base 19880 >/dev/null
    if [ -n "${LODE_LAYOUT:-}" ]; then
        # shellcheck disable=SC2086 # the layout's options, split on purpose
        "$L" setstripe $LODE_LAYOUT "$W/lode/mnt"
    fi
    md "lode-$r" "$W/lode/mnt"
    "$L" down --dir "$W/lode" >/dev/null
    bench/peers/moosefs.sh up "$W/mfs" "$W/mfsmnt" >/dev/null
    md "moosefs-$r" "$W/mfsmnt"
    bench/peers/moosefs.sh down "$W/mfs" "$W/mfsmnt" >/dev/null
done
for f in "$OUT"/*.txt; do
    printf '%s ' "$(basename "$f" .txt)"
    awk -F: '/ops\/s/ && !/Tree/ {n=$1; gsub(/^ +| +$/, "", n); split($2, a, " "); printf "%s=%d; ", n, a[3]}' "$f"
    echo
done
