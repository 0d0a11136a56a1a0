#!/usr/bin/env bash
# Recovery time of the MDT after a power cut (kill -9 with its WAL unsynced), with OPS
# uncommitted operations from two mounts: commits are held back, each mount creates
# files (an open-create and a close each), the MDS is killed and started again, and the
# time from its start to the end of recovery is measured.
# Usage (as root): bench/recovery-time.sh LODE_BINARY OPS [PORT_BASE]
set -eu
B=$1; OPS=$2; PB=${3:-9600}
D=/tmp/lode-recovery-time; rm -rf $D
$B up --dir $D --port-base $PB >/dev/null
export LODE_RUN_DIR=$D/run
mkdir -p $D/mnt2
$B mount 127.0.0.1:$PB:/lode $D/mnt2
mkdir $D/mnt/a $D/mnt2/b
$B set-param mdt.*.commit_interval_ms=60000 >/dev/null
sleep 0.3
per=$((OPS / 4))   # files per mount; each is two operations (create, close)
mk() { python3 -c "
import sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    open(f'{d}/f{i}', 'w').close()
" "$1" "$2"; }
mk $D/mnt/a $per & mk $D/mnt2/b $per & wait
last=$($B get-param -n mdt.*.last_transno); committed=$($B get-param -n mdt.*.last_committed)
echo "uncommitted operations: $((last - committed))"
MDS=$(cat $D/mdt0.pid)
kill -9 $MDS
while kill -0 $MDS 2>/dev/null; do sleep 0.05; done
t0=$(date +%s.%N)
setsid $B mds --listen 127.0.0.1:$((PB + 20)) $D/mdt0 >>$D/mdt0.log 2>&1 < /dev/null &
echo $! > $D/mdt0.pid
until $B get-param -n mdt.*.recovery_status 2>/dev/null | grep -q "status: COMPLETE"; do sleep 0.02; done
t1=$(date +%s.%N)
$B get-param -n mdt.*.recovery_status | grep -E "completed_clients|replayed_requests"
echo "restart to end of recovery: $(echo "$t1 - $t0" | bc) s"
grep "recovery over" $D/mdt0.log | tail -1
echo "files after recovery: $(ls $D/mnt/a | wc -l) + $(ls $D/mnt2/b | wc -l) (expected $per + $per)"
fusermount3 -u $D/mnt2
$B down --dir $D >/dev/null
