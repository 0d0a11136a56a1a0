#!/usr/bin/env bash
# Issue 18's speed section in one `lode up` (one MGS, one MDT, two OSTs, one mount):
#  1. `bench md` with 4 KiB written and read per file, through the mount (2 clients in
#     own directories) and natively, the root's layout one OST stripe (`-c 1`) then
#     Data-on-MDT (`-E 1M -L mdt`), ROUNDS times, with the OST RPCs
#     (`obdfilter.*.stats`) each DoM run made; before a DoM run it waits until the
#     OST run's objects are destroyed (the MDT destroys them once the unlinks commit),
#     so the count is the DoM run's own;
#  2. `bench io` 4 KiB and 32 KiB random, `-c 1` against `-E 64M -L mdt`;
#  3. `cat` of 10,000 DoM files of 4 KiB with the page cache dropped, and the MDT RPCs
#     it cost (`mdt.*.stats`).
# Usage (as root): bench/dom-all.sh BINARY PORT_BASE [ROUNDS] [ITEMS]
set -u
B=$1; PB=$2; ROUNDS=${3:-3}; N=${4:-5000}
D=$(mktemp -d /tmp/lode-dom-all.XXXXXX)
M=$D/mnt
"$B" up --dir "$D" --port-base "$PB" >/dev/null || exit 1
export LODE_KEY_FILE=$D/key LODE_RUN_DIR=$D/run
trap '"$B" down --dir "$D" >/dev/null 2>&1; rm -rf "$D"' EXIT
ost_rpcs() { "$B" get-param 'obdfilter.*.stats' | awk '$1 ~ /^ost_/ && $3 == "samples" {s += $2} END {print s + 0}'; }
phases() { awk -v t="$1" '/^ *File (creation|read) *:.*ops\/s/ {printf "%s_%s=%d ", t, $2, $4}'; }
made=0
for i in $(seq "$ROUNDS"); do
  echo -n "round $i: "
  for L in ost dom; do
    if [ $L = ost ]; then
      "$B" setstripe -c 1 "$M"
    else
      "$B" setstripe -E 1M -L mdt "$M"
      for _ in $(seq 120); do
        d=$("$B" get-param 'mdt.*.destroys' | awk '/destroyed:/ {print $2}')
        [ "${d:-0}" -ge "$made" ] && break
        sleep 1
      done
    fi
    o0=$(ost_rpcs)
    mkdir "$M/md-$i-$L"
    "$B" bench md --path "$M/md-$i-$L" --clients 2 --unique-dir --items "$N" \
      --write-bytes 4096 --read-bytes 4096 2>&1 | phases "mount_$L"
    "$B" bench md --native "127.0.0.1:$PB:/lode" --items "$N" \
      --write-bytes 4096 --read-bytes 4096 2>&1 | phases "native_$L"
    [ $L = ost ] && made=$((made + 3 * N))
    [ $L = dom ] && echo -n "dom_ost_rpcs=$(( $(ost_rpcs) - o0 )) "
  done
  echo
done

"$B" set-param 'lod.*.dom_stripesize=67108864' >/dev/null
mkdir "$M/io-ost" "$M/io-dom"
"$B" setstripe -c 1 "$M/io-ost"
"$B" setstripe -E 64M -L mdt "$M/io-dom"
for T in 4k 32k; do
  for L in ost dom; do
    echo "bench io $T $L:"
    "$B" bench io --path "$M/io-$L" --block 8M --transfer "$T" --random --iterations 3 2>&1 |
      grep -Ei 'write|read' | grep -i 'MB/s\|MiB/s'
  done
done

mkdir "$M/cat"
"$B" setstripe -E 1M -L mdt "$M/cat"
head -c 4096 /dev/urandom > "$D/4k"
for f in $(seq 10000); do cp "$D/4k" "$M/cat/$f"; done
sync
echo 3 > /proc/sys/vm/drop_caches
sleep 1
"$B" set-param 'mdt.*.stats=clear' >/dev/null
o0=$(ost_rpcs)
t0=$(date +%s.%N)
(cd "$M/cat" && ls | xargs cat > /dev/null)
t1=$(date +%s.%N)
echo "cat of 10,000 DoM files: $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') s, OST RPCs $(( $(ost_rpcs) - o0 )), MDT:"
"$B" get-param 'mdt.*.stats' | awk '$3 == "samples" && $2 > 0 {print "  " $1, $2}'
