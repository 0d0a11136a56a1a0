#!/usr/bin/env bash
# moosefs.sh - bring a private, single-node MooseFS 3.0.x instance up or down
# for comparison benchmarks against lode.
#
#   moosefs.sh up   DIR MOUNTPOINT   create the network namespace, start master +
#                                    chunkserver in it (state in DIR), mount, verify
#   moosefs.sh down DIR MOUNTPOINT   unmount, stop chunkserver + master, delete the
#                                    namespace, check nothing is left
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
#   MFS_NETNS      name of the network namespace the servers run in (default
#                  lodemfs; at most 13 characters, it also names the veth pair
#                  NETNS-h / NETNS-n)
#   MFS_SUBNET     /30 network of the veth pair (default 10.251.0.0): .1 is the
#                  host end (mfsmount's source address), .2 the namespace end
#                  (master and chunkserver). Must not be used elsewhere on this
#                  machine. Two instances running at the same time need
#                  different MFS_NETNS, MFS_SUBNET and MFS_PORT_BASE.
#
# Why a network namespace: mfschunkserver 3.0 refuses a master in 127.0.0.0/8
# ("localhost can't be used for connecting with master (use ip address of
# network controller)") because the master hands the chunkserver's address to
# clients, so master and chunkserver need a non-loopback address. We must not
# use this machine's real (eth0) address, so `up` creates a private namespace
# MFS_NETNS joined to the host by a veth pair, and runs mfsmaster and
# mfschunkserver inside it (`ip netns exec`), listening on the namespace end
# (NS_IP). Master<->chunkserver traffic stays inside the namespace (its own
# loopback path); mfsmount runs on the host and reaches master and chunkserver
# over the veth pair, which is given a loopback-like MTU. Nothing else is
# routed to or from the namespace, a random per-instance AUTH_CODE keeps
# foreign chunkservers out, and the export rule admits only the host end.
# `down` deletes the veth pair and the namespace again.
#
# Bash 4+, util-linux, coreutils. Run as root (FUSE mount + daemons as root).

# -E: let the ERR trap below fire inside functions too.
set -Eeuo pipefail

PROG=${0##*/}
USAGE="usage: $PROG up|down DIR MOUNTPOINT"

die() { echo "$PROG: error: $*" >&2; exit 1; }
note() { echo "$PROG: $*" >&2; }
# Catch-all so that an unexpected failure under `set -e` is never silent.
on_err() { local rc=$?; echo "$PROG: error: command failed (exit $rc) at line $1: $BASH_COMMAND" >&2; exit "$rc"; }
trap 'on_err $LINENO' ERR

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

NS=${MFS_NETNS:-lodemfs}
SUBNET=${MFS_SUBNET:-10.251.0.0}
# Interface names are limited to 15 characters; NS also names the veth ends.
[[ $NS =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,12}$ ]] \
    || die "MFS_NETNS='$NS' must be 1-13 characters of A-Z a-z 0-9 _ . -"
# No leading zeros: ip(8) and inet_aton would read them as octal.
[[ $SUBNET =~ ^(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})$ ]] \
    && ((10#${BASH_REMATCH[1]} <= 255 && 10#${BASH_REMATCH[2]} <= 255 && 10#${BASH_REMATCH[3]} <= 255 \
        && 10#${BASH_REMATCH[4]} % 4 == 0 && 10#${BASH_REMATCH[4]} <= 252)) \
    && [[ $SUBNET != 127.* && $SUBNET != 0.* ]] \
    || die "MFS_SUBNET='$SUBNET' must be the network address of a non-loopback IPv4 /30, e.g. 10.251.0.0"
SUBNET_PFX=${SUBNET%.*} SUBNET_LAST=$((10#${SUBNET##*.}))
HOST_IP=$SUBNET_PFX.$((SUBNET_LAST + 1))  # host end of the veth pair: mfsmount
NS_IP=$SUBNET_PFX.$((SUBNET_LAST + 2))    # namespace end: mfsmaster, mfschunkserver
VETH_HOST=$NS-h VETH_NS=$NS-n

MASTER_CFG=$DIR/mfsmaster.cfg
CHUNK_CFG=$DIR/mfschunkserver.cfg

# ---------------------------------------------------------------- helpers

# /proc/mounts escapes space, tab, newline and backslash as octal.
mnt_escape() {
    local s=$1
    s=${s//\\/\\134}; s=${s// /\\040}; s=${s//$'\t'/\\011}; s=${s//$'\n'/\\012}
    printf '%s' "$s"
}

# Print "SOURCE FSTYPE" of the topmost mount at path $1, or nothing if it is
# not a mount point. (Reads /proc/mounts instead of stat'ing the path: a dead
# FUSE mount makes stat fail with ENOTCONN, and we still need to see and clean
# it up.) SOURCE is as escaped by the kernel: MooseFS shows "mfs\043HOST:PORT".
mount_info() {
    M=$(mnt_escape "$1") awk '$2 == ENVIRON["M"] { t = $1 " " $3 } END { if (t != "") print t }' /proc/mounts
}

# PIDs of processes named $1 with an argv element equal to one of $2...
# (e.g. our -c CFG). Lets us find *our* daemons without touching other
# instances. Zombies have an empty cmdline and so never match.
pids_with_arg() {
    local comm=$1 pid p pat=(); shift
    for p; do pat+=(-e "$p"); done
    for pid in $(pgrep -x -- "$comm" || true); do
        if tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF "${pat[@]}"; then
            echo "$pid"
        fi
    done
}

# Our mfsmount: once daemonized it rewrites its argv to the single string
# "mfsmount (mounted on: MNT)"; before that MNT is a plain argument.
mount_pids() { pids_with_arg mfsmount "$MNT" "mfsmount (mounted on: $MNT)"; }

# A daemon started with -c $2 plus its children (mfsmaster forks a
# "mfsmaster (data writer)" helper that does not carry the -c argument).
daemon_pids() {
    local pid
    for pid in $(pids_with_arg "$1" "$2"); do
        echo "$pid"
        pgrep -P "$pid" || true
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

# Give PID 1 up to 5 s to reap exited daemons, so that a `pgrep mfs` right
# after `down` does not show <defunct> entries (harmless if it takes longer).
await_reaped() {
    local pid i
    for ((i = 0; i < 50; i++)); do
        for pid; do [[ -e /proc/$pid ]] && break; done
        [[ -e /proc/$pid ]] || return 0
        sleep 0.1
    done
}

# Wait up to $1 seconds for the given PIDs to exit; then TERM, then KILL.
reap() {
    local secs=$1 what=$2; shift 2
    local pids=("$@") i
    ((${#pids[@]})) || return 0
    for ((i = 0; i < secs * 10; i++)); do
        any_alive "${pids[@]}" || { await_reaped "${pids[@]}"; return 0; }
        sleep 0.1
    done
    note "warning: $what (pid ${pids[*]}) did not exit, sending SIGTERM"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        any_alive "${pids[@]}" || { await_reaped "${pids[@]}"; return 0; }
        sleep 0.1
    done
    note "warning: $what (pid ${pids[*]}) ignored SIGTERM, sending SIGKILL"
    kill -KILL "${pids[@]}" 2>/dev/null || true
    sleep 0.2
}

# Unmount $MNT if mounted. Tolerates dead FUSE mounts ("transport endpoint is
# not connected") and, as a last resort, busy mounts (lazy unmount).
unmount_mnt() {
    [[ -n $(mount_info "$MNT") ]] || return 0
    if ! fusermount3 -u -- "$MNT" 2>/dev/null && ! fusermount -u -- "$MNT" 2>/dev/null \
        && ! umount -- "$MNT" 2>/dev/null; then
        note "warning: $MNT is busy; detaching it lazily (umount -l)"
        umount -l -- "$MNT" || die "cannot unmount $MNT"
    fi
    [[ -z $(mount_info "$MNT") ]] || die "$MNT is still listed in /proc/mounts after unmount"
}

# Stop one daemon (mfsmaster|mfschunkserver) that was started with -c $2.
stop_daemon() {
    local bin=$1 cfg=$2 secs=$3
    local pids
    pids=$(daemon_pids "$bin" "$cfg")
    [[ -n $pids ]] || return 0
    # `stop` sends SIGTERM and waits for the lock to be released; the master
    # writes metadata.mfs on the way out, so give it time before escalating.
    "$bin" -c "$cfg" stop >>"$DIR/$bin.log" 2>&1 \
        || note "warning: '$bin -c $cfg stop' failed (see $DIR/$bin.log)"
    # shellcheck disable=SC2086  # word splitting of the pid list is intended
    reap "$secs" "$bin" $pids
}

# ---------------------------------------------------------------- network namespace

# (awk reads all input: with pipefail, an early-exiting grep -q could turn a
# match into a SIGPIPE failure.)
netns_exists() { ip netns list 2>/dev/null | awk -v n="$NS" '$1 == n { f = 1 } END { exit !f }'; }

# Die unless each PID runs in network namespace NS. A daemon found running
# elsewhere (left over from an older version of this script that ran it on the
# host, or NS was deleted and recreated under it) would not be reachable at
# NS_IP, so `up` must not silently reuse it.
check_in_netns() {
    local what=$1 ino pid; shift
    ino=$(stat -L -c %i -- "/run/netns/$NS" 2>/dev/null || true)
    for pid; do
        [[ -n $ino && $(readlink "/proc/$pid/ns/net" 2>/dev/null) == "net:[$ino]" ]] && continue
        [[ -e /proc/$pid ]] || continue  # exited meanwhile
        die "$what (pid $pid) is running outside network namespace $NS; restart it with: $PROG down $DIR $MNT && $PROG up $DIR $MNT"
    done
}

# Create (or repair) namespace NS and the veth pair VETH_HOST (HOST_IP, on the
# host) <-> VETH_NS (NS_IP, inside NS). Idempotent.
setup_netns() {
    local other peer_ns
    # An address already used elsewhere on the host would make mfsmount talk
    # to something that is not ours.
    other=$(ip -4 -o addr show 2>/dev/null | awk -v a="$HOST_IP" -v b="$NS_IP" -v me="$VETH_HOST" \
        '{ split($4, x, "/") } (x[1] == a || x[1] == b) && $2 != me && !o { o = $2 " " $4 } END { print o }' || true)
    [[ -z $other ]] || die "$HOST_IP or $NS_IP is already in use on this machine ($other); pick another MFS_SUBNET"

    if ! netns_exists; then
        ip netns add "$NS" || die "cannot create network namespace $NS"
    fi
    # Reuse the pair only if both ends exist and the host end's peer lives in
    # NS (it does not if NS was deleted and recreated); otherwise start over.
    peer_ns=$(ip -o link show dev "$VETH_HOST" 2>/dev/null \
        | awk '{ for (i = 1; i < NF; i++) if ($i == "link-netns") print $(i + 1) }' || true)
    if [[ $peer_ns != "$NS" ]] || ! ip -n "$NS" link show dev "$VETH_NS" >/dev/null 2>&1; then
        ip link del "$VETH_HOST" 2>/dev/null || true
        ip -n "$NS" link del "$VETH_NS" 2>/dev/null || true
        # MTU 65535 (the veth maximum): close to lo's 65536, so host<->namespace
        # traffic costs about what the old loopback path did.
        ip link add "$VETH_HOST" mtu 65535 type veth peer name "$VETH_NS" mtu 65535 netns "$NS" \
            || die "cannot create veth pair $VETH_HOST/$VETH_NS"
    fi
    # lo inside NS: the master's metalogger port listens on 127.0.0.1 there.
    { ip addr replace "$HOST_IP/30" dev "$VETH_HOST" && ip link set "$VETH_HOST" up \
        && ip -n "$NS" addr replace "$NS_IP/30" dev "$VETH_NS" && ip -n "$NS" link set "$VETH_NS" up \
        && ip -n "$NS" link set lo up; } \
        || die "cannot configure veth pair $VETH_HOST ($HOST_IP) <-> $VETH_NS ($NS_IP in $NS)"
    # Another route for the subnet (e.g. a VPN) could win over ours.
    ip -4 route get "$NS_IP" 2>/dev/null | grep -E " dev $VETH_HOST( |\$)" >/dev/null \
        || die "$NS_IP is not routed via $VETH_HOST ($(ip -4 route get "$NS_IP" 2>&1 | head -n 1)); pick another MFS_SUBNET"
}

# Delete the veth pair and namespace NS; a no-op if they are already gone.
# Refuses while any process still runs inside NS (not ours: our daemons have
# been stopped by now), since `ip netns del` would merely hide the namespace.
teardown_netns() {
    local pids
    if netns_exists; then
        pids=$(ip netns pids "$NS" 2>/dev/null | tr '\n' ' ' || true)
        [[ -z ${pids// /} ]] \
            || die "network namespace $NS still has processes in it (pid ${pids% }); not deleting it or $VETH_HOST"
    fi
    # Deleting one end of a veth pair deletes both.
    if ip link show dev "$VETH_HOST" >/dev/null 2>&1; then
        ip link del "$VETH_HOST" || die "cannot delete veth pair $VETH_HOST"
    fi
    if netns_exists; then
        ip netns del "$NS" || die "cannot delete network namespace $NS"
    fi
    if netns_exists || ip link show dev "$VETH_HOST" >/dev/null 2>&1; then
        die "network namespace $NS or $VETH_HOST still exists after down"
    fi
}

ensure_packages() {
    local missing=() b
    command -v ip >/dev/null 2>&1 || die "'ip' (package iproute2) is required for the network namespace"
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
    # 9>&-: do not let the daemon inherit our flock on DIR/.lock.
    if ! "$@" >>"$DIR/$name.log" 2>&1 9>&-; then
        tail -n 5 "$DIR/$name.log" | grep -v '^$' | sed "s/^/$PROG: $name: /" >&2 || true
        # After a hard kill (SIGKILL, OOM, power loss) the background changelog
        # writer may leave a hole that -a cannot bridge.
        if [[ $name == mfsmaster ]] && tail -n 5 "$DIR/$name.log" | grep -q 'changelog'; then
            note "hint: metadata under $DIR/master is inconsistent after a crash; for a disposable benchmark FS remove $DIR, or force it with: ip netns exec $NS mfsmaster -a -i -c $MASTER_CFG start"
        fi
        die "$name failed to start (full log: $DIR/$name.log); clean up with: $PROG down $DIR $MNT"
    fi
}

# ---------------------------------------------------------------- config

write_configs() {
    local user group auth
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
# Runs inside network namespace $NS. Metaloggers on the namespace's loopback
# only; chunkservers (which refuse 127.x) and clients (mfsmount on the host,
# via the veth pair) on the namespace end $NS_IP. AUTH_CODE guards the
# chunkserver port, mfsexports.cfg the client port.
MATOML_LISTEN_HOST = 127.0.0.1
MATOML_LISTEN_PORT = $ML_PORT
MATOCS_LISTEN_HOST = $NS_IP
MATOCS_LISTEN_PORT = $CS_PORT
AUTH_CODE = $auth
MATOCL_LISTEN_HOST = $NS_IP
MATOCL_LISTEN_PORT = $CL_PORT
EOF

    cat >"$DIR/mfsexports.cfg" <<EOF
# Generated by $PROG. The only client is mfsmount on this machine, which
# reaches the master from the host end of the veth pair ($HOST_IP). It gets
# full access, root stays root (benchmarks run as root), 'admin' allows
# mfssetgoal/mfssettrashtime.
$HOST_IP	/	rw,alldirs,admin,maproot=0:0
EOF

    : >"$DIR/mfstopology.cfg"  # single node: no topology

    cat >"$CHUNK_CFG" <<EOF
# Generated by $PROG; rewritten on every 'up'.
# Runs inside network namespace $NS next to the master; clients (mfsmount on
# the host) reach CSSERV over the veth pair.
WORKING_USER = $user
WORKING_GROUP = $group
NICE_LEVEL = $NICE
DATA_PATH = $DIR/chunk
HDD_CONF_FILENAME = $DIR/mfshdd.cfg
# Default reserve is fine on a large disk, but keep it explicit and small so
# a nearly-full test disk does not make MooseFS refuse writes.
HDD_LEAVE_SPACE_DEFAULT = 256MiB
MASTER_HOST = $NS_IP
MASTER_PORT = $CS_PORT
AUTH_CODE = $auth
# Register quickly if the master is not accepting yet (default is 5 s).
MASTER_RECONNECTION_DELAY = 1
BIND_HOST = $NS_IP
CSSERV_LISTEN_HOST = $NS_IP
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
    grep -qF "copy 1: $NS_IP:$CSSERV_PORT" <<<"$info" \
        || die "test file has no chunk copy on the chunkserver (mfsfileinfo: $(tr '\n' ' ' <<<"$info"))"
}

do_up() {
    ensure_packages
    mkdir -p "$DIR"
    exec 9>"$DIR/.lock"
    flock -w 120 9 || die "another $PROG is working on $DIR"

    setup_netns
    # Something already mounted on MNT? Reuse a live mount of this instance,
    # clear away a dead MooseFS mount (mfsmount crashed or was killed), and
    # never touch anyone else's file system.
    local info src mpids
    info=$(mount_info "$MNT")
    if [[ -n $info ]]; then
        src=${info% *}
        if [[ $src != mfs* ]]; then
            die "$MNT is already a mount point ($info); refusing to mount MooseFS over it"
        elif timeout 5 stat -f -- "$MNT" >/dev/null 2>&1; then
            # /proc/mounts shows the source as mfs\043HOST:PORT ('#' escaped).
            [[ $src == "mfs\\043$NS_IP:$CL_PORT" || $src == "mfs#$NS_IP:$CL_PORT" ]] \
                || die "$MNT already has a different MooseFS mounted ($src); run '$PROG down' for that one first"
            # already mounted and answering: reused below
        else
            note "found a dead or hung MooseFS mount on $MNT; removing it"
            mpids=$(mount_pids)
            unmount_mnt
            # shellcheck disable=SC2086
            reap 5 mfsmount $mpids
        fi
    fi
    # Only now: mkdir on a dead FUSE mount fails with ENOTCONN.
    mkdir -p "$MNT"

    write_configs

    # Master first: the chunkserver and the mount both connect to it.
    # -a: if the previous run crashed, rebuild metadata from the changelogs
    # instead of refusing to start.
    # Both run inside NS (see the header); they stay in it after daemonizing.
    local pids
    pids=$(pids_with_arg mfsmaster "$MASTER_CFG")
    if [[ -z $pids ]]; then
        start_logged mfsmaster ip netns exec "$NS" mfsmaster -a -c "$MASTER_CFG" start
    else
        # shellcheck disable=SC2086
        check_in_netns mfsmaster $pids
    fi
    pids=$(pids_with_arg mfschunkserver "$CHUNK_CFG")
    if [[ -z $pids ]]; then
        start_logged mfschunkserver ip netns exec "$NS" mfschunkserver -c "$CHUNK_CFG" start
    else
        # shellcheck disable=SC2086
        check_in_netns mfschunkserver $pids
    fi

    # The client runs on the host and reaches the master over the veth pair.
    if [[ -z $(mount_info "$MNT") ]]; then
        start_logged mfsmount mfsmount "$MNT" -H "$NS_IP" -P "$CL_PORT" -o "mfsnice=$NICE"
    fi

    # Wait until the mount is listed and the master reports chunkserver space.
    # statfs total blocks stay 0 until a chunkserver has registered its disks;
    # writes before that would just block inside mfsmount's retry loop.
    local deadline=$((SECONDS + TIMEOUT)) blocks=0
    while :; do
        if [[ -n $(mount_info "$MNT") ]]; then
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
    echo "$PROG: MooseFS up: $MNT (state in $DIR, master $NS_IP:$CL_PORT in network namespace $NS)"
}

# ---------------------------------------------------------------- down

do_down() {
    if [[ -d $DIR ]]; then
        exec 9>"$DIR/.lock"
        flock -w 120 9 || die "another $PROG is working on $DIR"
    fi

    # Client first, so nothing is writing when the servers go away.
    # Only ever unmount a MooseFS mount: a wrong MOUNTPOINT argument must not
    # take down someone else's file system.
    local mpids info foreign=
    info=$(mount_info "$MNT")
    if [[ -n $info && ${info% *} != mfs* ]]; then
        note "warning: $MNT is not a MooseFS mount ($info); leaving it mounted"
        foreign=1
    fi
    mpids=$(mount_pids)
    [[ -n $foreign ]] || unmount_mnt
    # mfsmount exits by itself once the kernel drops the FUSE connection.
    # shellcheck disable=SC2086
    reap 10 mfsmount $mpids

    stop_daemon mfschunkserver "$CHUNK_CFG" 30
    stop_daemon mfsmaster "$MASTER_CFG" 60

    local left
    left=$( { mount_pids; daemon_pids mfschunkserver "$CHUNK_CFG"; daemon_pids mfsmaster "$MASTER_CFG"; } | tr '\n' ' ')
    [[ -z ${left// /} ]] || die "MooseFS processes still running after down: $left"
    [[ -n $foreign || -z $(mount_info "$MNT") ]] || die "$MNT still mounted after down"

    # Only now: the namespace must outlive the daemons inside it.
    teardown_netns
    echo "$PROG: MooseFS down: $MNT (state kept in $DIR; network namespace $NS removed)"
}

"do_$CMD"
