//! The metadata service: one MDT. Connects clients (exports with reply slots),
//! executes namespace operations with POSIX rules under PDO locks, writes each change
//! and its reply record in one store batch, and answers resends from reply records.

mod background;
mod dom;
pub mod flock;
mod inode;
mod layout;
pub mod ldlm;
mod migrate;
mod ns;
pub mod params;
pub mod pdo;
mod reint;
pub mod squash;
mod target;
mod warm;
mod xattr;

use lode_base::{Errno, Fid};
use lode_proto::{Reply, SeqAllocRep, StatfsRep};
use lode_store::mdt::ReplySlot;
use lode_store::{Batch, Cf, MdtStore, StoreError};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

pub use layout::OstState;
pub use target::{Export, Mdt};

/// Static identity and settings of an MDT.
#[derive(Clone, Debug)]
pub struct MdtConfig {
    /// File system name.
    pub fsname: String,
    /// MDT index.
    pub index: u32,
    /// Target UUID from mkfs.
    pub uuid: String,
    /// Target directory (for statfs).
    pub dir: PathBuf,
    /// Shared key (empty: none).
    pub key: Vec<u8>,
}

impl MdtConfig {
    /// `FSNAME-MDTxxxx`.
    pub fn target_name(&self) -> String {
        format!("{}-MDT{:04x}", self.fsname, self.index)
    }
}

/// Runtime tunables (`lode get-param/set-param mdt.*.…`).
pub struct Tunables {
    /// `mdt.*.max_mod_rpcs_in_flight`: modify slots granted per client.
    pub max_mod_rpcs: AtomicU32,
    /// `lod.*.stripecount` default (root's default layout).
    pub default_stripe_count: AtomicU32,
    /// `lod.*.stripesize` default.
    pub default_stripe_size: AtomicU64,
    /// `mdt.*.max_open_files_per_client`: open handles one client may hold; one more
    /// open (or open-create) gets ENFILE.
    pub max_open_per_client: AtomicU64,
    /// `lod.*.dom_stripesize`: the largest Data-on-MDT component a new layout may
    /// have (0: Data-on-MDT disabled for new files).
    pub dom_stripesize: AtomicU64,
    /// `mdt.*.dom_read_on_open`: bytes of a DoM file sent with an open for reading
    /// (0: none).
    pub dom_read_on_open: AtomicU64,
}

pub(crate) struct OpenHandle {
    fid: Fid,
    /// The owning client's slot: handles outlive a reconnect of the same client.
    slot: u32,
    /// Opened for writing (or truncation): may write Data-on-MDT bytes and
    /// instantiate layout components.
    write: bool,
    /// A writer that found no other writer at its open, and the file's write events
    /// then (see `Opens::writers`): at close, it alone wrote since if they still match.
    alone: bool,
    events: u64,
    /// The PR LAYOUT lock granted with the open (0: none), released at close.
    layout_lock: u64,
    /// Data-on-MDT bytes were written through it: closed ahead (no size with the
    /// close), it takes the data mark back only while every byte is on this MDT.
    dom_wrote: bool,
}

impl OpenHandle {
    /// Open for writing (or truncation) on `fid` by the client in `slot`: what a
    /// request naming this handle must find to act as that file's writer.
    fn writes(&self, fid: Fid, slot: u32) -> bool {
        self.fid == fid && self.slot == slot && self.write
    }
}

#[derive(Default)]
pub(crate) struct Opens {
    handles: HashMap<u64, OpenHandle>,
    counts: HashMap<Fid, u32>,
    /// Files marked as holding OST data by one open, with no other writer or size
    /// change since: that handle, closing without having written, takes the mark
    /// back. Memory only: after a restart the mark stays (the safe way).
    clean: HashMap<Fid, u64>,
    /// Handles per client slot.
    per_slot: HashMap<u32, u64>,
    /// Per file with writers: how many write handles are open, and a count of write
    /// opens and truncates (memory only; gone with the last writer).
    writers: HashMap<Fid, (u32, u64)>,
    /// Write handles per file and client slot: whether a writer is the only one.
    write_slots: HashMap<(Fid, u32), u32>,
    /// Layout migrations under way, by file (see `migrate`).
    migrations: HashMap<Fid, migrate::Migration>,
    /// Per client slot, how many times its handles were all closed (it left or was
    /// evicted): an open its client made before that registers no handle.
    departures: HashMap<u32, u64>,
    next: u64,
}

impl Opens {
    /// How many times the handles of the client in `slot` were all closed.
    fn departures_of(&self, slot: u32) -> u64 {
        self.departures.get(&slot).copied().unwrap_or(0)
    }

    /// Something other than a write changed `fid`: its open writers can no longer say
    /// they alone changed it (see `writers`).
    fn not_alone(&mut self, fid: Fid) {
        if let Some(w) = self.writers.get_mut(&fid) {
            w.1 += 1;
        }
    }

    /// The file's data may change other than by the migration copying it: the copy
    /// is stale, and the migration will not commit.
    fn break_migration(&mut self, fid: Fid) {
        if let Some(m) = self.migrations.get_mut(&fid) {
            m.broken = true;
        }
    }
}

/// The namespace layer of one MDT (Lustre's mdd over lod and osd): POSIX rules under PDO
/// locks, layouts, open handles, and each change written with its reply record in one
/// store batch. It knows nothing of connections: the target layer (`target.rs`) gives
/// it a request's reply slot, so it can be driven in-process without sockets.
pub struct Namespace {
    pub(crate) cfg: MdtConfig,
    pub(crate) store: Arc<MdtStore>,
    pub(crate) pdo: pdo::Pdo,
    pub(crate) opens: Mutex<Opens>,
    seq_lock: Mutex<()>,
    pub(crate) osts: layout::Osts,
    pub(crate) space: background::SpaceCheck,
    pub(crate) links: std::sync::OnceLock<Arc<background::Links>>,
    /// Where the next round of OST object destroys starts (see `destroy_round`).
    pub(crate) destroy_cursor: Mutex<Vec<u8>>,
    /// Objects destroyed on the OSTs since the start (`destroys` parameter).
    pub(crate) destroyed: std::sync::atomic::AtomicU64,
    /// This start's part of every data token (see `Namespace::data_token`), random so
    /// that a token from before a restart, when changes may have been lost and their
    /// inode versions used again, never names data after it.
    data_salt: u64,
    /// Files whose inode versions `lo..hi` were reached by changes of attributes alone
    /// (chmod, chown, utimes): a data token of any version in that run still names the
    /// bytes at `hi`. Memory only (tokens do not outlive a start), and emptied when it
    /// reaches [`ATTR_STEPS_MAX`] files: a token it forgets is only a cache miss.
    pub(crate) attr_steps: Mutex<HashMap<Fid, (u64, u64)>>,
    /// Access times reads gave files, not yet written to their inodes (see
    /// `Namespace::access_ahead`): every inode read takes them in.
    pub(crate) atimes: inode::PendingAtimes,
    /// Files whose data mark a close ahead took back, by the number of that untracked
    /// write (see `MdtStore::apply_untracked`), until a sync covers it: a writer's
    /// open that sets the mark again syncs first (see `Namespace::mark_again`).
    pub(crate) unmarked: Mutex<HashMap<Fid, u64>>,
    /// The name and value bytes of inodes' stored xattrs, as the last change of each
    /// left them, so that checking a change's room does not read every xattr of the
    /// inode again (see `Namespace::stored_xattr_sizes`). Memory only, emptied when it
    /// reaches [`XATTR_SIZES_MAX`] inodes: what it forgets is read again.
    pub(crate) xattr_sizes: Mutex<HashMap<Fid, xattr::XattrSizes>>,
    /// Tunables.
    pub tun: Tunables,
}

const SEQ_NEXT: &[u8] = b"seq_next";

/// Files `Namespace::attr_steps` remembers at most (about 40 bytes each).
pub(crate) const ATTR_STEPS_MAX: usize = 1 << 16;

/// Inodes `Namespace::xattr_sizes` remembers at most (about 40 bytes each).
pub(crate) const XATTR_SIZES_MAX: usize = 1 << 16;

/// Errors inside an operation: a POSIX errno for the caller, or a store failure.
#[derive(Debug)]
pub(crate) enum OpError {
    Errno(Errno),
    Store(StoreError),
}

impl From<Errno> for OpError {
    fn from(e: Errno) -> Self {
        OpError::Errno(e)
    }
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        OpError::Store(e)
    }
}

impl From<OpError> for StoreError {
    fn from(e: OpError) -> Self {
        match e {
            OpError::Store(e) => e,
            OpError::Errno(e) => StoreError::Engine(format!("unexpected {e}")),
        }
    }
}

pub(crate) type OpResult<T> = Result<T, OpError>;

/// What one request needs besides its body: the reply slot (for modifications).
#[derive(Default)]
pub struct Ctx {
    /// Where the reply record goes (none for requests that modify nothing).
    pub slot: Option<ReplySlot>,
    /// A replayed open: the handle its client holds, under which it is registered
    /// again (instead of a new one).
    pub open_handle: Option<u64>,
    /// A replay in recovery: its open handle may not be registered again yet (opens
    /// are replayed by their clients too), so it is not asked for.
    pub replay: bool,
    /// The client's [`Namespace::open_epoch`] when it connected: an open finishing
    /// after the client left or was evicted (a change parked for locks the eviction
    /// freed) registers no handle, which nobody would ever close. None: no check.
    pub open_epoch: Option<u64>,
}

impl Namespace {
    /// Opens the namespace over `store`: formats the root on first start. Orphans of a
    /// previous life are destroyed by [`Namespace::clean_orphans`] once recovery has
    /// replayed the opens that keep some of them.
    pub fn open(cfg: MdtConfig, store: Arc<MdtStore>) -> Result<Arc<Namespace>, StoreError> {
        let ns = Arc::new(Namespace {
            cfg,
            store,
            pdo: pdo::Pdo::default(),
            opens: Mutex::new(Opens {
                // A random epoch in the high half: a close sent before a restart can
                // never name a handle given after it.
                next: u64::from(rand::random::<u32>()) << 32,
                ..Default::default()
            }),
            seq_lock: Mutex::new(()),
            osts: layout::Osts::default(),
            space: background::SpaceCheck::default(),
            destroy_cursor: Mutex::new(Vec::new()),
            destroyed: std::sync::atomic::AtomicU64::new(0),
            data_salt: rand::random(),
            attr_steps: Mutex::new(HashMap::new()),
            xattr_sizes: Mutex::new(HashMap::new()),
            atimes: inode::PendingAtimes::default(),
            unmarked: Mutex::default(),
            links: std::sync::OnceLock::new(),
            tun: Tunables {
                max_mod_rpcs: AtomicU32::new(u32::from(lode_base::limits::MAX_MOD_RPCS_PER_CLIENT)),
                default_stripe_count: AtomicU32::new(1),
                default_stripe_size: AtomicU64::new(1 << 20),
                dom_stripesize: AtomicU64::new(lode_base::limits::DOM_SIZE_DEFAULT),
                dom_read_on_open: AtomicU64::new(lode_base::limits::DOM_READ_ON_OPEN_DEFAULT),
                max_open_per_client: AtomicU64::new(
                    lode_base::limits::OPEN_HANDLES_PER_CLIENT_MAX as u64,
                ),
            },
        });
        ns.format_root()?;
        Ok(ns)
    }

    /// The store.
    pub fn store(&self) -> &Arc<MdtStore> {
        &self.store
    }

    /// The config.
    pub fn config(&self) -> &MdtConfig {
        &self.cfg
    }

    /// Number of open handles.
    pub fn open_count(&self) -> usize {
        self.opens.lock().handles.len()
    }

    /// Every open handle: `(slot, handle, fid, opened for writing)`, by slot, then
    /// handle.
    pub fn open_handles(&self) -> Vec<(u32, u64, Fid, bool)> {
        let mut v: Vec<_> = self
            .opens
            .lock()
            .handles
            .iter()
            .map(|(&h, o)| (o.slot, h, o.fid, o.write))
            .collect();
        v.sort_unstable_by_key(|&(slot, h, _, _)| (slot, h));
        v
    }

    /// Updates the OST table from the MGS config.
    pub fn set_osts(&self, osts: Vec<OstState>) {
        self.osts.set(osts);
    }

    /// OSTs as the MDS sees them.
    pub fn osts(&self) -> Vec<OstState> {
        self.osts.get()
    }

    pub(crate) fn seq_alloc(&self) -> OpResult<SeqAllocRep> {
        let _g = self.seq_lock.lock();
        let next = match self.store.engine().get(Cf::Server, SEQ_NEXT)? {
            Some(b) if b.len() == 8 => u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])),
            _ => lode_base::fid::FIRST_NORMAL_SEQ,
        };
        let mut b = Batch::new();
        b.put(
            Cf::Server,
            SEQ_NEXT.to_vec(),
            (next + 1).to_le_bytes().to_vec(),
        );
        self.store.apply(b, None)?;
        // Durable before it is handed out: a sequence granted and then lost in a crash
        // would be granted again, and two clients would make the same FIDs. A client
        // asks once per 131,072 FIDs, so the wait for a commit costs nothing.
        self.store.sync()?;
        Ok(SeqAllocRep {
            seq: next,
            width: lode_base::fid::SEQ_WIDTH,
        })
    }

    pub(crate) fn statfs(&self) -> OpResult<StatfsRep> {
        let mut st = StatfsRep::from(
            lode_base::sys::statvfs(&self.cfg.dir).map_err(|e| Errno::from_io(&e))?,
        );
        let used = self.store.engine().estimate_keys(Cf::Inode);
        // Inodes are not preallocated: report a large budget that shrinks with use.
        st.files = used + st.bavail.saturating_mul(u64::from(st.bsize)) / 512;
        st.ffree = st.files - used;
        Ok(st)
    }

    /// Commits a modification: the batch plus its reply record, returning the transno.
    /// An open or close that changes nothing takes an empty transno (its record stays
    /// in memory, see `MdtStore::apply_volatile`): run again after a restart, it does
    /// what it did. Any other change keeps its record on disk, even with nothing else
    /// to write (a rename between two links of one inode, run again after others
    /// changed those names, would not be a no-op).
    pub(crate) fn commit(&self, ctx: &Ctx, batch: Batch, reply: &Reply) -> OpResult<u64> {
        if !inode::vbr::commit() {
            return Err(Errno::EOVERFLOW.into());
        }
        let rec = ctx.slot.map(|s| (s, 0, reply.encode()));
        let volatile = matches!(reply, Reply::Open(_) | Reply::Close(_));
        Ok(match rec {
            Some(rec) if volatile && batch.is_empty() => self.store.apply_volatile(rec)?,
            rec => self.store.apply(batch, rec)?,
        })
    }

    /// Fails with ENOSPC when the MDT's disk is nearly full, before anything is written.
    pub(crate) fn check_space(&self) -> OpResult<()> {
        if self.space.low(&self.cfg.dir) {
            return Err(Errno::ENOSPC.into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The namespace layer driven in-process: no sockets, no service threads.
    use super::*;
    use lode_base::fid::FIRST_NORMAL_SEQ;
    use lode_base::Cred;
    use lode_proto::CreateReq;
    use lode_store::RocksEngine;

    fn namespace(dir: &std::path::Path) -> Arc<Namespace> {
        let engine = Arc::new(RocksEngine::open(&dir.join("db"), 8).expect("engine"));
        let store = MdtStore::open(engine).expect("store");
        store.start_commit_thread().expect("commit thread");
        let cfg = MdtConfig {
            fsname: "t".into(),
            index: 0,
            uuid: "u".into(),
            dir: dir.to_path_buf(),
            key: Vec::new(),
        };
        Namespace::open(cfg, store).expect("namespace")
    }

    /// A namespace over `dir` holding a directory `/d`.
    fn with_dir(dir: &std::path::Path) -> (Arc<Namespace>, Fid) {
        let ns = namespace(dir);
        let d = ns
            .create(&Ctx::default(), 0, create_req(b"d", 1))
            .expect("mkdir")
            .0
            .body
            .attr
            .fid;
        (ns, d)
    }

    fn create_req(name: &[u8], oid: u32) -> CreateReq {
        CreateReq {
            dom_writeback: false,
            cred: Cred::root(),
            parent: Fid::ROOT,
            name: name.to_vec(),
            fid: Fid::new(FIRST_NORMAL_SEQ, oid, 0),
            mode: libc::S_IFDIR | 0o755,
            umask: 0,
            rdev: 0,
            target: Vec::new(),
            layout: None,
            open_flags: None,
        }
    }

    #[test]
    fn create_lookup_unlink_in_process_with_reply_records() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ns = namespace(dir.path());
        let ctx = Ctx {
            open_handle: None,
            replay: false,
            open_epoch: None,
            slot: Some(ReplySlot {
                slot: 0,
                tag: 1,
                xid: 7,
                replay_transno: 0,
                sub: 0,
            }),
        };
        let (rep, transno) = ns.create(&ctx, 0, create_req(b"d", 1)).expect("create");
        assert!(transno > 0);
        assert_eq!(rep.body.attr.fid, Fid::new(FIRST_NORMAL_SEQ, 1, 0));
        // The change and its reply record went in one batch.
        let rec = ns
            .store
            .reply_record(0, 1, 0)
            .expect("read")
            .expect("record");
        assert_eq!((rec.xid, rec.transno), (7, transno));
        let found = ns.lookup(&Cred::root(), Fid::ROOT, b"d").expect("lookup");
        assert_eq!(found.attr.fid, rep.body.attr.fid);
        assert_eq!(ns.getattr(Fid::ROOT).expect("root").attr.nlink, 3);
        assert!(matches!(
            ns.create(&Ctx::default(), 0, create_req(b"d", 2)),
            Err(OpError::Errno(Errno::EEXIST))
        ));
        ns.unlink(&Ctx::default(), &Cred::root(), Fid::ROOT, b"d", true)
            .expect("rmdir");
        assert!(matches!(
            ns.lookup(&Cred::root(), Fid::ROOT, b"d"),
            Err(OpError::Errno(Errno::ENOENT))
        ));
        assert_eq!(ns.getattr(Fid::ROOT).expect("root").attr.nlink, 2);
    }

    #[test]
    fn a_fid_in_use_is_refused_above_and_below_its_sequences_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ns = namespace(dir.path());
        let ctx = Ctx::default();
        ns.create(&ctx, 0, create_req(b"a", 5)).expect("create a");
        // The FID of `a` under another name: found in use.
        assert!(matches!(
            ns.create(&ctx, 0, create_req(b"b", 5)),
            Err(OpError::Errno(Errno::EEXIST))
        ));
        // FIDs taken out of order: below the highest one made, one not in use is
        // accepted, one in use is not.
        ns.create(&ctx, 0, create_req(b"c", 9)).expect("create c");
        ns.create(&ctx, 0, create_req(b"d", 7)).expect("create d");
        assert!(matches!(
            ns.create(&ctx, 0, create_req(b"e", 7)),
            Err(OpError::Errno(Errno::EEXIST))
        ));
        assert!(matches!(
            ns.create(&ctx, 0, create_req(b"e", 9)),
            Err(OpError::Errno(Errno::EEXIST))
        ));
        assert!(ns.lookup(&Cred::root(), Fid::ROOT, b"e").is_err());
    }

    /// Runs `f` as one change under version-based recovery: its digest at commit.
    fn change<T>(expected: Option<u64>, f: impl FnOnce() -> OpResult<T>) -> (OpResult<T>, u64) {
        inode::vbr::begin(expected);
        let r = f();
        (r, inode::vbr::end())
    }

    #[test]
    fn a_replay_finds_the_versions_it_found_first_unless_a_change_before_it_is_lost() {
        fn chmod(ns: &Namespace, fid: Fid, mode: u32) -> impl FnOnce() -> OpResult<()> + '_ {
            let sa = lode_base::SetAttr {
                mode: Some(mode),
                ..Default::default()
            };
            move || {
                ns.setattr(&Ctx::default(), &Cred::root(), fid, &sa, false, None)
                    .map(|_| ())
            }
        }
        // A FIFO: a regular file would need OSTs for its objects.
        let file = |oid| CreateReq {
            dom_writeback: false,
            mode: libc::S_IFIFO | 0o644,
            umask: 0,
            ..create_req(b"f", oid)
        };
        // The first life: a file, then a's change to it, then b's.
        let first = tempfile::tempdir().expect("tempdir");
        let ns = namespace(first.path());
        let f = ns
            .create(&Ctx::default(), 0, file(1))
            .expect("create")
            .0
            .body
            .attr
            .fid;
        let (r, a) = change(None, chmod(&ns, f, 0o600));
        r.expect("a's chmod");
        let (r, b) = change(None, chmod(&ns, f, 0o640));
        r.expect("b's chmod");
        assert!(a != 0 && b != 0 && a != b);

        // Recovery past a's lost change: b's replay finds another version and changes
        // nothing; replayed after a's, it finds what it found the first time.
        let second = tempfile::tempdir().expect("tempdir");
        let ns = namespace(second.path());
        ns.create(&Ctx::default(), 0, file(1)).expect("create");
        let (r, _) = change(Some(b), chmod(&ns, f, 0o640));
        assert!(
            matches!(r, Err(OpError::Errno(Errno::EOVERFLOW))),
            "{:?}",
            r.err()
        );
        assert_eq!(ns.getattr(f).expect("getattr").attr.mode & 0o7777, 0o644);
        change(Some(a), chmod(&ns, f, 0o600)).0.expect("a's replay");
        change(Some(b), chmod(&ns, f, 0o640)).0.expect("b's replay");
        assert_eq!(ns.getattr(f).expect("getattr").attr.mode & 0o7777, 0o640);
    }

    #[test]
    fn a_hash_group_larger_than_a_page_is_listed_whole_and_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ns, d) = with_dir(dir.path());
        // 1,500 names with hashes of their own, and 200 more that share the hash of the
        // 1,024th, where the first page fills up (names whose hashes collide, as a
        // test build's hash would make them).
        let hash = |i: u64| 10 + 10 * i;
        let mut b = Batch::new();
        let mut want = std::collections::BTreeSet::new();
        let mut put = |h: u64, name: String| {
            let rec = lode_store::records::DirentRec {
                fid: Fid::new(FIRST_NORMAL_SEQ, 1000, 0),
                dtype: libc::DT_REG,
            };
            b.put(
                Cf::Dirent,
                lode_store::records::dirent_key(d, h, name.as_bytes()),
                inode::encode_dirent(&rec),
            );
            want.insert(name);
        };
        for i in 0..1500 {
            put(hash(i), format!("n{i}"));
        }
        for i in 0..200 {
            put(hash(1023), format!("group{i}"));
        }
        ns.store.apply(b, None).expect("apply");
        let mut got = Vec::new();
        let mut cookie = 0;
        let mut pages = 0;
        while cookie != lode_base::hash::END_COOKIE {
            let page = ns
                .readdir(&Cred::root(), d, cookie, false, 0)
                .expect("readdir");
            got.extend(
                page.entries
                    .into_iter()
                    .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                    .filter(|n| n != "." && n != ".."),
            );
            cookie = page.next;
            pages += 1;
        }
        assert!(pages > 1, "the listing takes more than one page");
        assert_eq!(got.len(), want.len(), "every name once");
        assert_eq!(
            got.into_iter().collect::<std::collections::BTreeSet<_>>(),
            want
        );
    }

    #[test]
    fn pages_of_one_or_two_entries_list_everything_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ns, d) = with_dir(dir.path());
        let mut b = Batch::new();
        let mut want = std::collections::BTreeSet::new();
        for i in 0..5u64 {
            let rec = lode_store::records::DirentRec {
                fid: Fid::new(FIRST_NORMAL_SEQ, 1000 + i as u32, 0),
                dtype: libc::DT_REG,
            };
            let name = format!("n{i}");
            b.put(
                Cf::Dirent,
                lode_store::records::dirent_key(d, 10 + i, name.as_bytes()),
                inode::encode_dirent(&rec),
            );
            want.insert(name);
        }
        ns.store.apply(b, None).expect("apply");
        for count in [1, 2] {
            let (mut got, mut cookie, mut pages) = (Vec::new(), 0, 0);
            while cookie != lode_base::hash::END_COOKIE {
                let page = ns
                    .readdir(&Cred::root(), d, cookie, false, count)
                    .expect("readdir");
                assert!(page.next > cookie, "count {count}: the cookie moves on");
                got.extend(page.entries.into_iter().map(|e| e.name));
                cookie = page.next;
                pages += 1;
                assert!(pages < 20, "count {count}: the listing ends");
            }
            let names: std::collections::BTreeSet<String> = got
                .iter()
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .filter(|n| n != "." && n != "..")
                .collect();
            assert_eq!(names, want, "count {count}");
            assert_eq!(got.len(), want.len() + 2, "count {count}: each entry once");
        }
    }

    #[test]
    fn a_rename_over_an_empty_directory_never_loses_a_create_racing_into_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ns = namespace(dir.path());
        let mut oid = 10;
        let mut next = || {
            oid += 1;
            oid
        };
        let (mut renamed, mut created) = (0, 0);
        for round in 0..1000 {
            let src = format!("s{round}");
            let victim = format!("v{round}");
            ns.create(&Ctx::default(), 0, create_req(src.as_bytes(), next()))
                .expect("mkdir src");
            let v = ns
                .create(&Ctx::default(), 0, create_req(victim.as_bytes(), next()))
                .expect("mkdir victim")
                .0
                .body
                .attr
                .fid;
            let inside = CreateReq {
                dom_writeback: false,
                parent: v,
                mode: libc::S_IFIFO | 0o644,
                umask: 0,
                ..create_req(b"x", next())
            };
            let rename = lode_proto::RenameReq {
                cred: Cred::root(),
                src_parent: Fid::ROOT,
                src_name: src.into_bytes(),
                dst_parent: Fid::ROOT,
                dst_name: victim.into_bytes(),
                flags: 0,
            };
            let (r, c) = std::thread::scope(|sc| {
                let r = sc.spawn(|| ns.rename(&Ctx::default(), &rename));
                let c = sc.spawn(|| ns.create(&Ctx::default(), 0, inside));
                (r.join().expect("rename"), c.join().expect("create"))
            });
            // One of them wins: a create into the directory makes the rename find it
            // not empty, or the rename removes the directory first.
            match (&r, &c) {
                (Ok(_), Err(OpError::Errno(Errno::ENOENT))) => renamed += 1,
                (Err(OpError::Errno(Errno::ENOTEMPTY)), Ok(_)) => created += 1,
                _ => panic!(
                    "round {round}: rename {:?}, create inside {:?}",
                    r.as_ref().err(),
                    c.as_ref().err()
                ),
            }
        }
        assert_eq!(renamed + created, 1000);
    }

    #[test]
    fn an_unlinked_inodes_xattrs_go_with_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ns = namespace(dir.path());
        let xattrs = |f: Fid| {
            let mut n = 0;
            ns.store
                .engine()
                .scan(Cf::Xattr, &f.to_bytes(), b"", &mut |_, _| {
                    n += 1;
                    true
                })
                .expect("scan");
            n
        };
        for (i, stored) in [(1u32, 0), (2, 2), (3, 1)] {
            let name = format!("d{i}");
            let f = ns
                .create(&Ctx::default(), 0, create_req(name.as_bytes(), i))
                .expect("mkdir")
                .0
                .body
                .attr
                .fid;
            for x in 0..stored {
                let x = format!("user.x{x}");
                ns.setxattr(
                    &Ctx::default(),
                    &Cred::root(),
                    f,
                    x.as_bytes(),
                    Some(vec![1]),
                    0,
                )
                .expect("setxattr");
            }
            if i == 3 {
                // Removed again: the inode has no xattr left, and is not known to
                // have never had one.
                ns.setxattr(&Ctx::default(), &Cred::root(), f, b"user.x0", None, 0)
                    .expect("removexattr");
                ns.setxattr(
                    &Ctx::default(),
                    &Cred::root(),
                    f,
                    b"user.y",
                    Some(vec![1]),
                    0,
                )
                .expect("setxattr");
            }
            assert_eq!(xattrs(f), stored, "{name}");
            ns.unlink(
                &Ctx::default(),
                &Cred::root(),
                Fid::ROOT,
                name.as_bytes(),
                true,
            )
            .expect("rmdir");
            assert_eq!(xattrs(f), 0, "{name}: its xattrs went with it");
        }
    }

    #[test]
    fn the_xattr_sizes_remembered_are_those_stored() {
        use lode_base::acl::{Acl, Entry, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
        let dir = tempfile::tempdir().expect("tempdir");
        let (ns, d) = with_dir(dir.path());
        let stored = || ns.read_xattr_sizes(d).expect("read the stored sizes");
        let e = |tag, perm, id| Entry { tag, perm, id };
        let acl = Acl::from_entries(vec![
            e(USER_OBJ, 7, 0),
            e(USER, 7, 1001),
            e(GROUP_OBJ, 5, 0),
            e(MASK, 7, 0),
            e(OTHER, 5, 0),
        ])
        .expect("acl")
        .to_xattr();
        // Sets, replacements, creations, removals (some refused) and ACLs, in a
        // fixed pseudo-random order.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for step in 0..600 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let name = format!("user.n{}", x % 13);
            let (name, value, flags) = match (x >> 8) % 6 {
                0 | 1 => (
                    name.into_bytes(),
                    Some(vec![1; (x >> 16) as usize % 300]),
                    0,
                ),
                2 => (name.into_bytes(), Some(vec![2; 5]), 1),
                3 => (name.into_bytes(), Some(vec![3; 9]), 2),
                4 => (name.into_bytes(), None, 0),
                _ if x & 1 == 0 => (lode_base::acl::ACCESS.to_vec(), Some(acl.clone()), 0),
                _ => (lode_base::acl::DEFAULT.to_vec(), None, 0),
            };
            let _ = ns.setxattr(&Ctx::default(), &Cred::root(), d, &name, value, flags);
            if let Some(known) = ns.xattr_sizes.lock().get(&d) {
                assert_eq!(*known, stored(), "step {step}");
            }
        }
        assert!(ns.xattr_sizes.lock().contains_key(&d));
    }

    #[test]
    fn an_inodes_xattrs_are_bounded_so_they_can_always_be_listed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ns, d) = with_dir(dir.path());
        let set = |name: &[u8], len: usize| {
            ns.setxattr(
                &Ctx::default(),
                &Cred::root(),
                d,
                name,
                Some(vec![7; len]),
                0,
            )
        };
        // Values: 1 MiB in all.
        for i in 0..16 {
            set(format!("user.v{i}").as_bytes(), 65536).expect("within the bound");
        }
        assert!(matches!(
            set(b"user.more", 1),
            Err(OpError::Errno(Errno::ENOSPC))
        ));
        // A replacement that does not grow is still allowed; a removal makes room.
        set(b"user.v3", 65536).expect("replace");
        ns.setxattr(&Ctx::default(), &Cred::root(), d, b"user.v3", None, 0)
            .expect("remove");
        set(b"user.more", 1).expect("room again");
        // Names: as many as one listing holds.
        let mut made = 17;
        let err = loop {
            let name = format!("user.{made:0>240}");
            match set(name.as_bytes(), 0) {
                Ok(_) => made += 1,
                Err(e) => break e,
            }
        };
        assert!(matches!(err, OpError::Errno(Errno::ENOSPC)), "{err:?}");
        assert!(made < 300);
        ns.listxattr(&Cred::root(), d, 1 << 20)
            .expect("still listed");
    }
}
