#!/usr/bin/env bash
# CPU and context switches per metadata operation of the MDS and the mount process,
# read from /proc before and after a native run (one client, 8 threads) and a mount run
# (2 client processes). Run it for two builds back to back to compare them.
# Usage (as root): bench/cpu-per-op.sh NAME LODE_BINARY PORT_BASE [ITEMS]
set -u
NAME=$1; B=$2; PB=$3; ITEMS=${4:-10000}
D=/tmp/ab-$NAME; rm -rf $D; mkdir -p $D
$B up --dir $D --port-base $PB >/dev/null || exit 1
MDS=$(cat $D/mdt0.pid); MNT=$(cat $D/mount.pid)
TCK=$(getconf CLK_TCK)
# cpu ticks (all threads) and context switches (sum over live threads)
snap() { local p=$1; local t; t=$(awk '{print $14+$15}' /proc/$p/stat); local c; c=$(cat /proc/$p/task/*/status | awk '/ctxt_switches/ {s+=$2} END {print s}'); echo "$t $c"; }
echo "$NAME mds=$MDS mount=$MNT"
a=$(snap $MDS)
LODE_KEY_FILE=$D/key $B bench md --native 127.0.0.1:$PB:/lode --threads 8 --items $ITEMS --unique-dir > $D/native8.txt 2>&1
b=$(snap $MDS)
echo "native8 MDS cpu_ticks,ctxsw before: $a after: $b"
a=$(snap $MDS); m=$(snap $MNT)
$B bench md --path $D/mnt --clients 2 --items $ITEMS --unique-dir > $D/mount2.txt 2>&1
b=$(snap $MDS); n=$(snap $MNT)
echo "mount2 MDS before: $a after: $b ; MOUNT before: $m after: $n"
$B down --dir $D >/dev/null
echo "--- native 8 threads"; grep -E "^   (Directory|File) (creation|stat|removal)" $D/native8.txt | head -6
echo "--- mount 2 clients"; grep -E "^   (Directory|File) (creation|stat|removal)" $D/mount2.txt | head -6
