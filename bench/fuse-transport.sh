#!/usr/bin/env bash
# The mount's two FUSE transports (and, optionally, another build's mount) side by side:
# md easy through the mount (2 client processes), small Data-on-MDT files written and
# read, and a stat walk with the kernel's caches dropped, each with the mount process's
# CPU time and context switches per operation (from /proc, all threads).
# Usage (as root): bench/fuse-transport.sh LODE_BINARY PORT_BASE ROUNDS [OLD_BINARY]
# Prints one line per (round, mount, workload): phases in ops/s, then cpu_us/op and
# ctxsw/op of the mount process. OLD_BINARY runs on its own `lode up` with its default
# mount; the new binary's `lode up` gets a second mount with -o noio_uring.
set -u
B=$1; PB=$2; ROUNDS=$3; OLD=${4:-}
echo Y > /sys/module/fuse/parameters/enable_uring 2>/dev/null
TCK=$(getconf CLK_TCK)
snap() { local p=$1; awk '{print $14+$15}' /proc/$p/stat; cat /proc/$p/task/*/status | awk '/ctxt_switches/ {s+=$2} END {print s}'; }
mountpid() { # the lode mount process serving mount point $1
  for p in $(pgrep -f " mount "); do tr '\0' '\n' < /proc/$p/cmdline | grep -qx "$1" && { echo $p; return; }; done; }
# "Phase=mean" for each phase of a bench output.
phases() { awk -F: '/ops\/s|entries\/s/ {n=$1; gsub(/^ +| +$/, "", n); gsub(/ /, "_", n); split($2, a, " "); printf "%s=%d ", n, a[3]}' "$1"; }
run() { # NAME MNT BIN
  local name=$1 mnt=$2 bin=$3 out=/tmp/ft-$1.txt
  local p; p=$(mountpid "$mnt")
  local ops
  # md easy, 2 clients, 5000 items each: eight phases of 10,000 operations
  read -r c0 x0 < <(snap $p | tr '\n' ' ')
  $bin bench md --path $mnt --clients 2 --items 5000 --unique-dir > $out.md 2>&1
  read -r c1 x1 < <(snap $p | tr '\n' ' ')
  ops=80000
  echo "$name md-easy: $(phases $out.md) | mount cpu_us/op $(( (c1-c0)*1000000/TCK/ops )) ctxsw/op $(echo "scale=2; ($x1-$x0)/$ops" | bc)"
  # small DoM files: create+write 4 KiB, stat, read 4 KiB, remove
  mkdir -p $mnt/dom && $bin setstripe -E 64k -L mdt -E -1 -c 1 $mnt/dom >/dev/null
  read -r c0 x0 < <(snap $p | tr '\n' ' ')
  $bin bench md --path $mnt/dom --clients 1 --items 3000 --write-bytes 4096 --read-bytes 4096 > $out.dom 2>&1
  read -r c1 x1 < <(snap $p | tr '\n' ' ')
  ops=24000
  echo "$name dom-4k: $(phases $out.dom) | mount cpu_us/op $(( (c1-c0)*1000000/TCK/ops )) ctxsw/op $(echo "scale=2; ($x1-$x0)/$ops" | bc)"
  # stat walk over 4 x 10,000 files, the kernel's caches dropped before each phase
  $bin bench walk --path $mnt --dirs 4 --files 10000 --walkers 4 --cold > $out.walk 2>&1
  echo "$name walk-cold: $(phases $out.walk)"
}
for r in $(seq 1 $ROUNDS); do
  if [ -n "$OLD" ]; then
    D=/tmp/ft-old; rm -rf $D; mkdir -p $D
    $OLD up --dir $D --port-base $((PB+200)) >/dev/null || exit 1
    run "r$r-old" $D/mnt $OLD
    $OLD down --dir $D >/dev/null
  fi
  D=/tmp/ft-new; rm -rf $D; mkdir -p $D $D/mnt2
  $B up --dir $D --port-base $PB >/dev/null || exit 1
  $B mount -o allow_other,noio_uring,key_file=$D/key 127.0.0.1:$PB:/lode $D/mnt2 || exit 1
  if [ $((r % 2)) = 1 ]; then
    run "r$r-uring" $D/mnt $B; run "r$r-dev" $D/mnt2 $B
  else
    run "r$r-dev" $D/mnt2 $B; run "r$r-uring" $D/mnt $B
  fi
  $B umount $D/mnt2 >/dev/null 2>&1
  $B down --dir $D >/dev/null
done
