#!/usr/bin/env bash
# bindfs.sh - bring a bindfs-over-tmpfs mount up or down for comparison
# benchmarks against lode.
#
#   bindfs.sh up   SRC MOUNTPOINT   ensure SRC is RAM-backed (tmpfs), bindfs it onto MOUNTPOINT, verify
#   bindfs.sh down SRC MOUNTPOINT   unmount MOUNTPOINT, and the tmpfs on SRC if this script mounted it
#
# Why: bindfs is a minimal pass-through FUSE file system, so bindfs over tmpfs
# measures the cost of the FUSE round trip itself with no storage or network
# behind it - a floor for any user-space file system, lode included.
#
# Both subcommands are idempotent: `up` on a live mount re-verifies it, `down`
# with nothing mounted is a no-op.
#
# Environment knobs:
#   BINDFS_TMPFS_SIZE  size= option for the tmpfs mounted on SRC (default 50%,
#                      i.e. half of RAM, the kernel's own default)
#
# Run as root (mounting tmpfs, FUSE with allow_other). Bash 4+, util-linux.

# -E: let the ERR trap below fire inside functions too.
set -Eeuo pipefail

PROG=${0##*/}
USAGE="usage: $PROG up|down SRC MOUNTPOINT"
# The tmpfs we mount on SRC carries this as its source name, so that `down`
# can tell it apart from a tmpfs someone else mounted (which it must keep).
TMPFS_TAG=lode-bench-bindfs

die() { echo "$PROG: error: $*" >&2; exit 1; }
note() { echo "$PROG: $*" >&2; }
# Catch-all so that an unexpected failure under `set -e` is never silent.
on_err() { local rc=$?; echo "$PROG: error: command failed (exit $rc) at line $1: $BASH_COMMAND" >&2; exit "$rc"; }
trap 'on_err $LINENO' ERR

[[ $# -eq 3 && ( $1 == up || $1 == down ) ]] || { echo "$USAGE" >&2; exit 2; }
CMD=$1
# Absolute, symlink-free paths: /proc/mounts and bindfs's argv use them.
SRC=$(realpath -m -- "$2")
MNT=$(realpath -m -- "$3")
[[ $SRC != / && $MNT != / ]] || die "refusing to use / as SRC or MOUNTPOINT"
[[ $SRC != "$MNT" ]] || die "SRC and MOUNTPOINT must differ"
case $MNT/ in "$SRC"/*) die "MOUNTPOINT must not be inside SRC (bindfs would see itself)";; esac
SIZE=${BINDFS_TMPFS_SIZE:-50%}

# ---------------------------------------------------------------- helpers

# /proc/mounts escapes space, tab, newline and backslash as octal.
mnt_escape() {
    local s=$1
    s=${s//\\/\\134}; s=${s// /\\040}; s=${s//$'\t'/\\011}; s=${s//$'\n'/\\012}
    printf '%s' "$s"
}

# Print "SOURCE FSTYPE" of the topmost mount at path $1 (source as escaped by
# the kernel), or nothing if it is not a mount point. Reads /proc/mounts
# rather than stat'ing: a dead FUSE mount fails stat with ENOTCONN.
mount_info() {
    M=$(mnt_escape "$1") awk '$2 == ENVIRON["M"] { t = $1 " " $3 } END { if (t != "") print t }' /proc/mounts
}

# What a bindfs mount of SRC looks like in /proc/mounts.
BINDFS_INFO="$(mnt_escape "$SRC") fuse"

# PIDs of the bindfs serving MNT (found by its argv, which bindfs keeps).
bindfs_pids() {
    local pid
    for pid in $(pgrep -x bindfs || true); do
        if tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$MNT"; then
            echo "$pid"
        fi
    done
}

# True if any PID is still running; zombies (not yet reaped by PID 1) count as gone.
any_alive() {
    local pid st
    for pid; do
        st=$(awk '{ sub(/.*\) /, ""); print $1 }' "/proc/$pid/stat" 2>/dev/null || true)
        [[ -n $st && $st != Z && $st != X ]] && return 0
    done
    return 1
}

# Wait up to 10 s for bindfs to exit after unmount (it does so by itself),
# then TERM/KILL; finally give PID 1 a moment to reap it, so `pgrep bindfs`
# right after `down` is clean.
reap() {
    local pids=("$@") i pid
    ((${#pids[@]})) || return 0
    for ((i = 0; i < 100; i++)); do
        any_alive "${pids[@]}" || break
        sleep 0.1
    done
    if any_alive "${pids[@]}"; then
        note "warning: bindfs (pid ${pids[*]}) did not exit after unmount, killing it"
        kill -TERM "${pids[@]}" 2>/dev/null || true
        sleep 1
        kill -KILL "${pids[@]}" 2>/dev/null || true
    fi
    for ((i = 0; i < 50; i++)); do
        for pid in "${pids[@]}"; do [[ -e /proc/$pid ]] && break; done
        [[ -e /proc/$pid ]] || return 0
        sleep 0.1
    done
}

# Unmount MNT; copes with dead FUSE mounts and, as a last resort, busy ones.
unmount_mnt() {
    [[ -n $(mount_info "$MNT") ]] || return 0
    if ! fusermount -u -- "$MNT" 2>/dev/null && ! fusermount3 -u -- "$MNT" 2>/dev/null \
        && ! umount -- "$MNT" 2>/dev/null; then
        note "warning: $MNT is busy; detaching it lazily (umount -l)"
        umount -l -- "$MNT" || die "cannot unmount $MNT"
    fi
    [[ -z $(mount_info "$MNT") ]] || die "$MNT is still listed in /proc/mounts after unmount"
}

# Write 1 MiB through the mount, read it back through the mount and from SRC
# (proves MNT really passes through to SRC), remove it.
verify() {
    local name=.lode-peer-verify.$$ tmp
    tmp=$(mktemp)
    head -c 1048576 /dev/urandom >"$tmp"
    local ok=1
    timeout 30 cp -- "$tmp" "$MNT/$name" || ok=0
    ((ok)) && { timeout 30 cmp -s -- "$tmp" "$MNT/$name" || ok=0; }
    ((ok)) && { cmp -s -- "$tmp" "$SRC/$name" || ok=0; }
    rm -f -- "$tmp"
    timeout 30 rm -f -- "$MNT/$name" || ok=0
    ((ok)) || { rm -f -- "$SRC/$name"; die "1 MiB write/read/remove check through $MNT failed"; }
    [[ ! -e $SRC/$name ]] || die "file removed through $MNT still exists in $SRC"
}

# ---------------------------------------------------------------- up

do_up() {
    if ! command -v bindfs >/dev/null 2>&1; then
        note "bindfs not found; installing it"
        DEBIAN_FRONTEND=noninteractive apt-get install -y bindfs >&2 || die "apt-get install bindfs failed"
    fi

    # Existing mount on MNT: reuse a live bindfs of SRC, clear a dead one,
    # refuse anything else.
    local info pids
    info=$(mount_info "$MNT")
    if [[ -n $info ]]; then
        if [[ $info != "$BINDFS_INFO" ]]; then
            die "$MNT is already a mount point ($info); refusing to mount bindfs over it"
        elif ! timeout 5 stat -f -- "$MNT" >/dev/null 2>&1; then
            note "found a dead or hung bindfs mount on $MNT; removing it"
            pids=$(bindfs_pids)
            unmount_mnt
            # shellcheck disable=SC2086  # word splitting of the pid list is intended
            reap $pids
        fi
    fi

    # RAM-backed source so the measurement is FUSE overhead, not disk I/O.
    # Anything already on tmpfs (a tmpfs mount point or a directory inside
    # one, e.g. /dev/shm/x) is used as is.
    mkdir -p -- "$SRC"
    if [[ $(stat -f -c %T -- "$SRC") != tmpfs ]]; then
        if [[ -n $(ls -A -- "$SRC") ]]; then
            note "warning: $SRC is not empty; its contents are hidden under the tmpfs until 'down'"
        fi
        mount -t tmpfs -o "size=$SIZE,mode=0755" "$TMPFS_TAG" "$SRC" \
            || die "cannot mount a tmpfs on $SRC"
    fi

    if [[ -z $(mount_info "$MNT") ]]; then
        mkdir -p -- "$MNT"
        local out
        # --multithreaded: bindfs is single-threaded by default, which would
        # serialise every request and make the comparison unfair.
        # No "--" before the paths: bindfs then mis-parses its own options;
        # the paths are absolute, so they cannot look like options anyway.
        out=$(bindfs --multithreaded "$SRC" "$MNT" 2>&1) \
            || die "bindfs --multithreaded $SRC $MNT failed: $(tr '\n' ' ' <<<"$out")"
    fi
    [[ $(mount_info "$MNT") == "$BINDFS_INFO" ]] || die "bindfs of $SRC is not listed on $MNT in /proc/mounts"

    verify
    echo "$PROG: bindfs up: $MNT -> $SRC"
}

# ---------------------------------------------------------------- down

do_down() {
    local info pids
    info=$(mount_info "$MNT")
    if [[ -n $info && $info != "$BINDFS_INFO" ]]; then
        # Wrong MOUNTPOINT argument: never unmount someone else's file system.
        note "warning: $MNT is not a bindfs mount of $SRC ($info); leaving it mounted"
    else
        pids=$(bindfs_pids)
        unmount_mnt
        # shellcheck disable=SC2086
        reap $pids
    fi

    # Unmount the tmpfs only if we mounted it (tagged); a tmpfs that was
    # there before `up` stays. Its contents are discarded.
    if [[ $(mount_info "$SRC") == "$TMPFS_TAG tmpfs" ]]; then
        umount -- "$SRC" || die "cannot unmount the tmpfs on $SRC (busy? see: fuser -vm $SRC)"
    fi

    [[ -z $(bindfs_pids) ]] || die "bindfs for $MNT still running after down"
    echo "$PROG: bindfs down: $MNT"
}

"do_$CMD"
