#!/usr/bin/env bash
# moosefs.sh - bring a private, single-node MooseFS 3.0.x instance up or down
# for comparison benchmarks against lode.
#
#   moosefs.sh up   DIR MOUNTPOINT   start master + chunkserver (state in DIR), mount, verify
#   moosefs.sh down DIR MOUNTPOINT   unmount, stop chunkserver + master, check nothing is left
#
# Everything (configs, metadata, chunk storage) lives under DIR so the instance
# never touches /etc/mfs or /var/lib/mfs and can coexist with a system install.
# Both subcommands are idempotent: `up` on a running instance re-verifies it,
# `down` on a stopped one is a no-op.
#
# Environment knobs:
#   MFS_PORT_BASE  first of four consecutive TCP ports (default 9419):
#                  +0 master<-metalogger, +1 master<-chunkserver,
#                  +2 master<-client,     +3 chunkserver<-client
#   MFS_NICE       nice level for mfsmaster/mfschunkserver/mfsmount (default 0).
#                  MooseFS's stock default is -19; we use 0 so the peer does not
#                  get a scheduling advantage over lode (which runs at 0) on a
#                  small box. Set MFS_NICE=-19 for stock behaviour.
#   MFS_TIMEOUT    seconds to wait for the file system to become usable (default 60)
#   MFS_HOST_IP    non-loopback IPv4 address of this machine for the chunkserver
#                  (default: first global-scope IPv4 address, e.g. eth0's)
#
# Why a non-loopback address at all: mfschunkserver 3.0 refuses a master in
# 127.0.0.0/8 ("localhost can't be used for connecting with master (use ip
# address of network controller)") because the master hands the chunkserver's
# address to clients. Traffic to the machine's own address still goes through
# the kernel's loopback path, so performance is the same as 127.0.0.1.
# Clients (mfsmount, and the export rule) still use 127.0.0.1; only the
# master<->chunkserver and client<->chunkserver sockets use MFS_HOST_IP, and a
# random per-instance AUTH_CODE keeps foreign chunkservers out.
#
# Bash 4+, util-linux, coreutils. Run as root (FUSE mount + daemons as root).

set -euo pipefail

PROG=${0##*/}
USAGE="usage: $PROG up|down DIR MOUNTPOINT"

die() { echo "$PROG: error: $*" >&2; exit 1; }
note() { echo "$PROG: $*" >&2; }
# Catch-all so that an unexpected failure under `set -e` is never silent.
trap 'rc=$?; echo "$PROG: error: command failed (exit $rc) at line $LINENO: $BASH_COMMAND" >&2; exit $rc' ERR

[[ $# -eq 3 && ( $1 == up || $1 == down ) ]] || { echo "$USAGE" >&2; exit 2; }
CMD=$1
# Absolute, symlink-free paths: /proc/mounts and the daemons' argv use them.
DIR=$(realpath -m -- "$2")
MNT=$(realpath -m -- "$3")
[[ $DIR != / && $MNT != / ]] || die "refusing to use / as DIR or MOUNTPOINT"
case $MNT/ in "$DIR"/*) die "MOUNTPOINT must not be inside DIR (DIR holds the chunk store)";; esac

PORT_BASE=${MFS_PORT_BASE:-9419}
NICE=${MFS_NICE:-0}
TIMEOUT=${MFS_TIMEOUT:-60}
[[ $PORT_BASE =~ ^[0-9]+$ && $NICE =~ ^-?[0-9]+$ && $TIMEOUT =~ ^[0-9]+$ ]] \
    || die "MFS_PORT_BASE, MFS_NICE and MFS_TIMEOUT must be integers"
ML_PORT=$PORT_BASE CS_PORT=$((PORT_BASE + 1)) CL_PORT=$((PORT_BASE + 2)) CSSERV_PORT=$((PORT_BASE + 3))

# Pick the address the chunkserver uses (see the header for why not 127.0.0.1).
host_ip() {
    local ip=${MFS_HOST_IP:-}
    if [[ -z $ip ]] && command -v ip >/dev/null 2>&1; then
        ip=$(ip -4 -o addr show scope global 2>/dev/null | awk '{ sub(/\/.*/, "", $4); print $4; exit }')
    fi
    if [[ -z $ip ]]; then
        ip=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+(\.[0-9]+){3}$' | grep -v '^127\.' | head -n 1 || true)
    fi
    [[ -n $ip ]] || die "no non-loopback IPv4 address found (mfschunkserver refuses 127.x); set MFS_HOST_IP, e.g. after 'ip addr add 192.0.2.1/32 dev lo'"
    [[ $ip != 127.* ]] || die "MFS_HOST_IP=$ip is loopback; mfschunkserver refuses 127.x masters"
    echo "$ip"
}

MASTER_CFG=$DIR/mfsmaster.cfg
CHUNK_CFG=$DIR/mfschunkserver.cfg

# ---------------------------------------------------------------- helpers

# /proc/mounts escapes space, tab, newline and backslash as octal.
mnt_escape() {
    local s=$1
    s=${s//\\/\\134}; s=${s// /\\040}; s=${s//$'\t'/\\011}; s=${s//$'\n'/\\012}
    printf '%s' "$s"
}

# Print the fstype of the topmost mount at path $1, or nothing if not a mount point.
# (Reads /proc/mounts instead of stat'ing the path: a dead FUSE mount makes
# stat fail with ENOTCONN, and we still need to see and clean it up.)
mount_type() {
    M=$(mnt_escape "$1") awk '$2 == ENVIRON["M"] { t = $3 } END { if (t != "") print t }' /proc/mounts
}

# PIDs of processes named $1 whose argv contains exactly $2 (e.g. our -c CFG or
# our mount point). Lets us find *our* daemons without touching other instances.
pids_with_arg() {
    local pid
    for pid in $(pgrep -x -- "$1" || true); do
        if tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$2"; then
            echo "$pid"
        fi
    done
}

# True if any of the PIDs is still running. Zombies count as gone: daemons are
# reparented to PID 1, which may reap them late, and kill -0 succeeds on them.
any_alive() {
    local pid st
    for pid; do
        st=$(awk '{ sub(/.*\) /, ""); print $1 }' "/proc/$pid/stat" 2>/dev/null) || continue
        [[ -n $st && $st != Z && $st != X ]] && return 0
    done
    return 1
}

# Wait up to $1 seconds for the given PIDs to exit; then TERM, then KILL.
reap() {
    local secs=$1 what=$2; shift 2
    local pids=("$@") i
    ((${#pids[@]})) || return 0
    for ((i = 0; i < secs * 10; i++)); do
        any_alive "${pids[@]}" || return 0
        sleep 0.1
    done
    note "warning: $what (pid ${pids[*]}) did not exit, sending SIGTERM"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        any_alive "${pids[@]}" || return 0
        sleep 0.1
    done
    note "warning: $what (pid ${pids[*]}) ignored SIGTERM, sending SIGKILL"
    kill -KILL "${pids[@]}" 2>/dev/null || true
    sleep 0.2
}

# Unmount $MNT if mounted. Tolerates dead FUSE mounts ("transport endpoint is
# not connected") and, as a last resort, busy mounts (lazy unmount).
unmount_mnt() {
    [[ -n $(mount_type "$MNT") ]] || return 0
    if ! fusermount3 -u -- "$MNT" 2>/dev/null && ! fusermount -u -- "$MNT" 2>/dev/null \
        && ! umount -- "$MNT" 2>/dev/null; then
        note "warning: $MNT is busy; detaching it lazily (umount -l)"
        umount -l -- "$MNT" || die "cannot unmount $MNT"
    fi
    [[ -z $(mount_type "$MNT") ]] || die "$MNT is still listed in /proc/mounts after unmount"
}

# Stop one daemon (mfsmaster|mfschunkserver) that was started with -c $2.
stop_daemon() {
    local bin=$1 cfg=$2 secs=$3
    local pids
    pids=$(pids_with_arg "$bin" "$cfg")
    [[ -n $pids ]] || return 0
    # `stop` sends SIGTERM and waits for the lock to be released; the master
    # writes metadata.mfs on the way out, so give it time before escalating.
    "$bin" -c "$cfg" stop >>"$DIR/$bin.log" 2>&1 \
        || note "warning: '$bin -c $cfg stop' failed (see $DIR/$bin.log)"
    # shellcheck disable=SC2086  # word splitting of the pid list is intended
    reap "$secs" "$bin" $pids
}

ensure_packages() {
    local missing=() b
    for b in mfsmaster mfschunkserver mfsmount mfssetgoal; do
        command -v "$b" >/dev/null 2>&1 || missing+=("$b")
    done
    ((${#missing[@]})) || return 0
    note "missing ${missing[*]}; installing moosefs-master moosefs-chunkserver moosefs-client"
    DEBIAN_FRONTEND=noninteractive apt-get install -y moosefs-master moosefs-chunkserver moosefs-client >&2 \
        || die "apt-get install of the moosefs packages failed"
}

# Run "$@" (start command for a daemon), logging to $DIR/<name>.log, with a
# one-line error (plus the log tail) on failure.
start_logged() {
    local name=$1; shift
    if ! "$@" >>"$DIR/$name.log" 2>&1; then
        tail -n 5 "$DIR/$name.log" | sed "s/^/$PROG: $name: /" >&2
        die "$name failed to start (full log: $DIR/$name.log); clean up with: $PROG down $DIR $MNT"
    fi
}

# ---------------------------------------------------------------- config

write_configs() {
    local user group ip=$HOST_IP auth
    # Random secret, generated once per DIR and then reused, so a daemon
    # restarted by a later 'up' still matches the one that kept running.
    if [[ ! -s $DIR/.authcode ]]; then
        od -An -N12 -tx1 /dev/urandom | tr -d ' \n' >"$DIR/.authcode"
    fi
    auth=$(<"$DIR/.authcode")
    # Run the daemons as whoever calls us (root here) instead of the packaged
    # 'mfs' user, so all state under DIR stays owned by the caller.
    user=$(id -un) group=$(id -gn)
    mkdir -p "$DIR/master" "$DIR/chunk" "$DIR/hdd"

    cat >"$MASTER_CFG" <<EOF
# Generated by $PROG; rewritten on every 'up'.
WORKING_USER = $user
WORKING_GROUP = $group
NICE_LEVEL = $NICE
DATA_PATH = $DIR/master
EXPORTS_FILENAME = $DIR/mfsexports.cfg
TOPOLOGY_FILENAME = $DIR/mfstopology.cfg
# Loopback only: nothing else on this machine should reach the benchmark FS.
MATOML_LISTEN_HOST = 127.0.0.1
MATOML_LISTEN_PORT = $ML_PORT
MATOCS_LISTEN_HOST = $ip
MATOCS_LISTEN_PORT = $CS_PORT
AUTH_CODE = $auth
MATOCL_LISTEN_HOST = 127.0.0.1
MATOCL_LISTEN_PORT = $CL_PORT
EOF

    cat >"$DIR/mfsexports.cfg" <<'EOF'
# Generated by moosefs.sh. Local clients get full access, root stays root
# (benchmarks run as root), 'admin' allows mfssetgoal/mfssettrashtime.
127.0.0.1	/	rw,alldirs,admin,maproot=0:0
EOF

    : >"$DIR/mfstopology.cfg"  # single node: no topology

    cat >"$CHUNK_CFG" <<EOF
# Generated by $PROG; rewritten on every 'up'.
WORKING_USER = $user
WORKING_GROUP = $group
NICE_LEVEL = $NICE
DATA_PATH = $DIR/chunk
HDD_CONF_FILENAME = $DIR/mfshdd.cfg
# Default reserve is fine on a large disk, but keep it explicit and small so
# a nearly-full test disk does not make MooseFS refuse writes.
HDD_LEAVE_SPACE_DEFAULT = 256MiB
MASTER_HOST = $ip
MASTER_PORT = $CS_PORT
AUTH_CODE = $auth
# Register quickly if the master is not accepting yet (default is 5 s).
MASTER_RECONNECTION_DELAY = 1
BIND_HOST = $ip
CSSERV_LISTEN_HOST = $ip
CSSERV_LISTEN_PORT = $CSSERV_PORT
EOF

    # A dedicated subdirectory (not DIR itself), as README.Debian recommends.
    printf '%s\n' "$DIR/hdd" >"$DIR/mfshdd.cfg"

    # A brand-new master needs a metadata file to start from; 3.0.x ships an
    # empty one ("MFSM NEW"). Only seed it when there is no metadata at all,
    # so an existing file system under DIR is reused, not wiped.
    if [[ ! -e $DIR/master/metadata.mfs && ! -e $DIR/master/metadata.mfs.back ]]; then
        if [[ -r /var/lib/mfs/metadata.mfs.empty ]]; then
            cp /var/lib/mfs/metadata.mfs.empty "$DIR/master/metadata.mfs"
        else
            printf 'MFSM NEW' >"$DIR/master/metadata.mfs"
        fi
    fi
}

# ---------------------------------------------------------------- up

# Write 1 MiB, read it back, check the chunk landed on the chunkserver, remove it.
verify() {
    local src=$DIR/.verify.src dst=$MNT/.lode-peer-verify.$$ info
    head -c 1048576 /dev/urandom >"$src"
    # close() on MooseFS fsyncs, so a cp that returns 0 means the chunkserver
    # acknowledged the data. timeout: mfsmount retries writes for a long time
    # when no chunkserver can take them; fail instead of hanging.
    if ! timeout "$TIMEOUT" cp -- "$src" "$dst"; then
        rm -f -- "$src"; timeout 10 rm -f -- "$dst" || true
        die "writing a 1 MiB test file to $MNT failed or timed out after ${TIMEOUT}s"
    fi
    if ! timeout 30 cmp -s -- "$src" "$dst"; then
        rm -f -- "$src"; timeout 10 rm -f -- "$dst" || true
        die "1 MiB test file read back from $MNT differs from what was written"
    fi
    info=$(timeout 10 mfsfileinfo "$dst" 2>&1 || true)
    rm -f -- "$src"
    timeout 30 rm -f -- "$dst" || die "cannot remove test file $dst"
    grep -qF "copy 1: $HOST_IP:$CSSERV_PORT" <<<"$info" \
        || die "test file has no chunk copy on the chunkserver (mfsfileinfo: $(tr '\n' ' ' <<<"$info"))"
}

do_up() {
    ensure_packages
    mkdir -p "$DIR" "$MNT"
    exec 9>"$DIR/.lock"
    flock -w 120 9 || die "another $PROG is working on $DIR"

    HOST_IP=$(host_ip)
    write_configs

    # Master first: the chunkserver and the mount both connect to it.
    # -a: if the previous run crashed, rebuild metadata from the changelogs
    # instead of refusing to start.
    if [[ -z $(pids_with_arg mfsmaster "$MASTER_CFG") ]]; then
        start_logged mfsmaster mfsmaster -a -c "$MASTER_CFG" start
    fi
    if [[ -z $(pids_with_arg mfschunkserver "$CHUNK_CFG") ]]; then
        start_logged mfschunkserver mfschunkserver -c "$CHUNK_CFG" start
    fi

    local t
    t=$(mount_type "$MNT")
    if [[ -n $t ]]; then
        if [[ $t == fuse.mfs* || $t == fuse ]] && [[ -n $(pids_with_arg mfsmount "$MNT") ]] \
            && timeout 5 stat -f -- "$MNT" >/dev/null 2>&1; then
            : # already mounted by a live mfsmount: reuse it
        elif [[ $t == fuse* ]]; then
            note "found a dead FUSE mount on $MNT; removing it"
            unmount_mnt
        else
            die "$MNT is already a $t mount point; refusing to mount MooseFS over it"
        fi
    fi
    if [[ -z $(mount_type "$MNT") ]]; then
        start_logged mfsmount mfsmount "$MNT" -H 127.0.0.1 -P "$CL_PORT" -o "mfsnice=$NICE"
    fi

    # Wait until the mount is listed and the master reports chunkserver space.
    # statfs total blocks stay 0 until a chunkserver has registered its disks;
    # writes before that would just block inside mfsmount's retry loop.
    local deadline=$((SECONDS + TIMEOUT)) blocks=0
    while :; do
        if [[ -n $(mount_type "$MNT") ]]; then
            blocks=$(timeout 5 stat -f -c %b -- "$MNT" 2>/dev/null || echo 0)
            ((blocks > 0)) && break
        fi
        ((SECONDS < deadline)) || die "$MNT not mounted with chunkserver space after ${TIMEOUT}s (logs in $DIR/*.log); clean up with: $PROG down $DIR $MNT"
        sleep 0.5
    done

    # One chunkserver: default goal 2 would leave every chunk "undergoal".
    # Trash time 0: deleted files free their chunks immediately instead of
    # sitting in the trash for a day (benchmarks create/remove a lot).
    timeout 30 mfssetgoal -r 1 "$MNT" >/dev/null || die "mfssetgoal -r 1 $MNT failed"
    timeout 30 mfssettrashtime -r 0 "$MNT" >/dev/null || die "mfssettrashtime -r 0 $MNT failed"

    verify
    echo "$PROG: MooseFS up: $MNT (state in $DIR, master 127.0.0.1:$CL_PORT)"
}

# ---------------------------------------------------------------- down

do_down() {
    if [[ -d $DIR ]]; then
        exec 9>"$DIR/.lock"
        flock -w 120 9 || die "another $PROG is working on $DIR"
    fi

    # Client first, so nothing is writing when the servers go away.
    local mpids
    mpids=$(pids_with_arg mfsmount "$MNT")
    unmount_mnt
    # mfsmount exits by itself once the kernel drops the FUSE connection.
    # shellcheck disable=SC2086
    reap 10 mfsmount $mpids

    stop_daemon mfschunkserver "$CHUNK_CFG" 30
    stop_daemon mfsmaster "$MASTER_CFG" 60

    local left
    left=$( { pids_with_arg mfsmount "$MNT"; pids_with_arg mfschunkserver "$CHUNK_CFG"; pids_with_arg mfsmaster "$MASTER_CFG"; } | tr '\n' ' ')
    [[ -z ${left// /} ]] || die "MooseFS processes still running after down: $left"
    [[ -z $(mount_type "$MNT") ]] || die "$MNT still mounted after down"
    echo "$PROG: MooseFS down: $MNT (state kept in $DIR)"
}

"do_$CMD"
