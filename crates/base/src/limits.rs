//! Every bound in lode, named, with the reason for its value.

/// Longest name of a directory entry, in bytes (Linux NAME_MAX).
pub const NAME_MAX: usize = 255;
/// Longest path the client resolves, in bytes (Linux PATH_MAX).
pub const PATH_MAX: usize = 4096;
/// Most hard links to one file (ldiskfs: 65000). A directory's subdirectories are not
/// bounded by it: past it, the directory's link count is shown as 1, "not counted",
/// as ext4's and Lustre's ldiskfs MDTs do with `dir_nlink` (see [`shown_nlink`]).
pub const LINK_MAX: u32 = 65000;

/// The link count `stat` shows for an inode of `mode` whose exact count is `nlink`: a
/// directory at or past [`LINK_MAX`] (64,998 subdirectories or more) shows 1, which tools
/// (`find`, `du`) read as "subdirectories not counted", as on ext4 with `dir_nlink`.
/// The MDT keeps the exact count, so the directory shows it again once enough of its
/// subdirectories are gone (ext4 keeps 1 for good).
pub fn shown_nlink(mode: u32, nlink: u32) -> u32 {
    if mode & libc::S_IFMT == libc::S_IFDIR && nlink >= LINK_MAX {
        1
    } else {
        nlink
    }
}
/// Longest symlink target (Linux: a page).
pub const SYMLINK_MAX: usize = 4096;
/// Longest xattr name (Linux XATTR_NAME_MAX).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest xattr value (Linux XATTR_SIZE_MAX).
pub const XATTR_SIZE_MAX: usize = 65536;
/// Most xattrs listed in one LISTXATTR reply (Linux XATTR_LIST_MAX is 64 KiB of names).
/// Also the most name bytes (each with its NUL) one inode's xattrs may have, so that
/// they can always be listed.
pub const XATTR_LIST_MAX: usize = 65536;
/// Most value bytes one inode's xattrs may hold together.
pub const XATTR_INODE_VALUES_MAX: usize = 1 << 20;
/// Largest bulk payload of one READ/WRITE RPC (Lustre's 4 MiB brw).
pub const BULK_MAX: usize = 4 << 20;
/// Largest frame accepted, checked before allocating: a bulk plus headroom for the body.
pub const RPC_SIZE_MAX: usize = BULK_MAX + (64 << 10);
/// Bytes of entries in one readdir page reply before the page is cut at a hash group.
pub const READDIR_PAGE_BYTES: usize = 64 << 10;
/// Entries in one readdir page, a second bound next to the byte count.
pub const READDIR_PAGE_ENTRIES: usize = 1024;
/// Hash ranges of one directory a client reads side by side (`readdir_all`).
pub const READDIR_RANGES_MAX: u64 = 4;
/// Bytes a readdir page may grow to so as not to split a hash group (names whose
/// 63-bit hashes collide): far beyond any group a real directory has, below a frame.
pub const READDIR_GROUP_BYTES_MAX: usize = 2 << 20;
/// Supplementary groups carried per request (Linux NGROUPS_MAX is 65536; NFS carries 16).
pub const GROUPS_MAX: usize = 64;
/// Default modify RPC slots per client (client side), Lustre's default.
pub const MAX_MOD_RPCS_DEFAULT: u16 = 7;
/// Server limit on modify slots per client (`mdt.*.max_mod_rpcs_in_flight`).
pub const MAX_MOD_RPCS_PER_CLIENT: u16 = 8;
/// Upper bound for any max_mod_rpcs setting (Lustre: 512).
pub const MAX_MOD_RPCS_LIMIT: u16 = 512;
/// Default RPCs in flight per import (Lustre `OBD_MAX_RIF_DEFAULT`).
pub const MAX_RPCS_IN_FLIGHT_DEFAULT: usize = 8;
/// Upper bound for max_rpcs_in_flight.
pub const MAX_RPCS_IN_FLIGHT_LIMIT: usize = 512;
/// Stripe sizes are multiples of this (Lustre LOV_MIN_STRIPE_SIZE).
pub const STRIPE_SIZE_UNIT: u64 = 64 << 10;
/// Largest stripe size (Lustre: 4 GiB - 64 KiB).
pub const STRIPE_SIZE_MAX: u64 = (4 << 30) - (64 << 10);
/// Most stripes in one component (Lustre LOV_MAX_STRIPE_COUNT).
pub const STRIPE_COUNT_MAX: u32 = 2000;
/// Most components in one composite layout.
pub const COMPONENTS_MAX: usize = 64;
/// Largest Data-on-MDT component, and the largest `lod.*.dom_stripesize` (Lustre: 1 GiB).
pub const DOM_SIZE_MAX: u64 = 1 << 30;
/// Smallest non-zero `lod.*.dom_stripesize` (Lustre: 64 KiB, its unit too).
pub const DOM_SIZE_MIN: u64 = 64 << 10;
/// Default `lod.*.dom_stripesize` (Lustre: 1 MiB).
pub const DOM_SIZE_DEFAULT: u64 = 1 << 20;
/// Default `mdt.*.dom_read_on_open`: bytes of a DoM file sent with an open for
/// reading (a small file is then read with no RPC of its own).
pub const DOM_READ_ON_OPEN_DEFAULT: u64 = 64 << 10;
/// Largest `mdt.*.dom_read_on_open` (an open reply stays small).
pub const DOM_READ_ON_OPEN_MAX: u64 = 1 << 20;
/// Bytes per record of Data-on-MDT data in the MDT store: a write rewrites at most
/// this much per chunk it touches, a read reads whole chunks.
pub const DOM_CHUNK: u64 = 4 << 10;
/// Data-on-MDT chunks one `SEEK_HOLE` search reads before it answers where it stopped
/// (the client asks again from there): 16 MiB, so a search through a large DoM file
/// does not hold its service thread for long.
pub const DOM_SEEK_CHUNKS: usize = 4096;
/// Largest file offset (2^63 - 1, the Linux off_t limit).
pub const FILE_SIZE_MAX: u64 = i64::MAX as u64;
/// Open handles one client may hold on one MDT.
pub const OPEN_HANDLES_PER_CLIENT_MAX: usize = 1 << 20;
/// Clients one MDT keeps slots for.
pub const CLIENTS_MAX: u32 = 1 << 17;
/// Targets (MDTs plus OSTs) the MGS accepts.
pub const TARGETS_MAX: usize = 4096;
/// Free bytes an MDT keeps in reserve: below this new modifications get ENOSPC instead
/// of risking a failed WAL write (which would stop the target).
pub const MDT_RESERVED_BYTES: u64 = 64 << 20;
/// Longest file system name (Lustre: 8).
pub const FSNAME_MAX: usize = 8;
/// Connections one server accepts at once; more are closed at accept with a logged
/// line (each costs a socket, buffers and an export).
pub const CONNECTIONS_MAX: usize = 4096;
/// Requests one connection may have read and not yet answered (executing or parked);
/// beyond it the server stops reading that connection, so TCP throttles the client.
pub const INFLIGHT_PER_CONN_MAX: usize = 256;
/// A frame must arrive whole within this many milliseconds of its first byte; a peer
/// that stops mid-frame is disconnected.
pub const CONN_READ_TIMEOUT_MS: u64 = 30_000;
/// A connection with nothing in flight and no bytes for this many milliseconds is
/// closed (clients reconnect on their next request).
pub const CONN_IDLE_TIMEOUT_MS: u64 = 900_000;
/// Replies must leave within this many milliseconds once the socket stops accepting
/// them; a client that does not read its replies is disconnected.
pub const CONN_WRITE_TIMEOUT_MS: u64 = 30_000;
/// Microseconds a reader waiting for its peer (a service thread between requests, a
/// client waiting for its reply) checks the socket before it sleeps (`LODE_SPIN_US`
/// overrides it). On a VM, waking a sleeping CPU costs an inter-processor interrupt
/// and exits to the hypervisor, more than a metadata RPC's own work; a reader that is
/// still looking sees the bytes at once (see `rpc::spin` for what it gains); 0 never
/// spins.
pub const SPIN_US: u64 = 100;
/// Spins in a row that may find nothing before a reader stops spinning for a while
/// ([`SPIN_REST`] waits), so an idle peer costs almost no CPU.
pub const SPIN_MISSES: u32 = 4;
/// Waits a reader sleeps through without spinning after [`SPIN_MISSES`] misses.
pub const SPIN_REST: u32 = 64;
/// Bytes read from one connection before its requests are executed, so a flooding
/// client is served in bounded rounds and its buffer stays small.
pub const READ_ROUND_BYTES: usize = 256 << 10;
/// Reply bytes of one round sent before the round's other requests run: a client
/// that asked for several pages or reads at once gets each as it is made (a page of
/// 1,024 short names is about 30 KB).
pub const REPLY_EARLY_BYTES: usize = 16 << 10;

/// Most sub-requests in one batch (Lustre batches statahead in groups of 64 to 1024).
pub const BATCH_SUBS_MAX: usize = 1024;
/// Largest body of one sub-request (a create with the longest symlink target and every
/// group fits well within it).
pub const BATCH_SUB_BYTES_MAX: usize = 16 << 10;

/// Most lock handles in one cancel or blocking callback.
pub const LOCKS_PER_RPC_MAX: usize = 4096;

/// Most handles (read-only, or written nothing through) a client keeps closed but not
/// yet told to the MDT: their CLOSE rides ahead of its next MDT request
/// (`CloseAhead`); one more is closed by an RPC of its own. Also the most one
/// `CloseAhead` frame may name.
pub const CLOSES_AHEAD_MAX: usize = 64;
/// Most files an MDT remembers as having had their data mark taken back by a close
/// ahead in a write not yet synced; past it, one sync settles them all.
pub const UNMARKED_MAX: usize = 65_536;
/// How long a close ahead may wait for a request to ride ahead of, before a PING
/// carries it (an idle client's handles are closed on the MDT within about this).
pub const CLOSE_AHEAD_WAIT_MS: u64 = 10;

/// Most access times one `AccessAhead` frame may carry; a client with more waiting
/// sends them without waiting for a request to ride ahead of.
pub const ACCESS_AHEAD_MAX: usize = 256;

/// Most files whose access times an MDT holds in memory before writing them: past
/// it, the request that brings one more writes them all at once.
pub const ATIMES_PENDING_MAX: usize = 4096;

/// How often an MDT writes the access times it holds in memory (ms): what a
/// `kill -9` of it can lose, as a crash before the commit loses Lustre's lazy ones.
pub const ATIMES_FLUSH_MS: u64 = 1000;

/// Most locks one client may hold on one MDT (`ldlm.namespaces.*.max_locks_per_client`).
pub const LOCKS_PER_CLIENT_MAX: usize = 1 << 20;

/// How long a client may take to give a lock back once called back, before it is
/// evicted (`ldlm_timeout`, seconds; Lustre's default is 20).
pub const LDLM_TIMEOUT_DEFAULT_S: u64 = 20;
/// `evict_timeout` default (seconds): a client whose connection closed without a
/// DISCONNECT and that does not come back within this long is evicted (its open files
/// closed, its file locks released). Lustre's ping evictor takes 150 s.
pub const EVICT_TIMEOUT_DEFAULT_S: u64 = 150;
/// Changes a client keeps for replay (answered, not yet committed) before it asks the
/// MDT to commit and waits, rather than keep more (Lustre bounds it in bytes).
pub const REPLAY_LIST_MAX: usize = 65_536;
/// `max_unstable_mb` default: data a client keeps per target for replay (written,
/// answered, not yet committed) before it asks for a commit and waits. At the default
/// 100 ms commit interval it covers 640 MB/s of writes to one OST without a wait.
pub const MAX_UNSTABLE_MB_DEFAULT: u64 = 64;
/// Largest `max_unstable_mb`.
pub const MAX_UNSTABLE_MB_MAX: u64 = 16 << 10;
/// `recovery_time_soft` default (seconds): how long a restarted MDT waits for the
/// clients that were connected when it stopped before it evicts the missing ones.
/// Lustre's is 300 s; a lode client comes back within a second or two of a restart.
pub const RECOVERY_TIME_SOFT_DEFAULT_S: u64 = 30;
/// `recovery_time_hard` default (seconds): recovery ends by then whatever is missing.
pub const RECOVERY_TIME_HARD_DEFAULT_S: u64 = 90;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_past_link_max_shows_one_link_and_a_file_its_count() {
        let dir = libc::S_IFDIR | 0o755;
        assert_eq!(shown_nlink(dir, 2), 2);
        assert_eq!(shown_nlink(dir, LINK_MAX - 1), LINK_MAX - 1);
        assert_eq!(shown_nlink(dir, LINK_MAX), 1);
        assert_eq!(shown_nlink(dir, u32::MAX), 1);
        assert_eq!(shown_nlink(libc::S_IFREG | 0o644, LINK_MAX), LINK_MAX);
    }
}
