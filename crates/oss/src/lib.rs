//! The object service: one OST. Objects are named by (file FID, component, stripe),
//! created on first write, and stored as plain files under the OST directory.

use lode_base::limits::BULK_MAX;
use lode_base::Errno;
use lode_proto::frame::FLAG_REPLAY;
use lode_proto::{
    ConnectRep, DataRep, Empty, ObjAttr, ObjAttrsRep, ObjId, OstRequest, OstWriteRep, Reply,
    SeekRep, StatfsRep, CONNECT_SUPPORTED,
};
use lode_rpc::server::Offload;
use lode_rpc::{Incoming, OpStats, Outgoing, Service};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tracing::{info, warn};

mod marks;
mod pool;
pub mod powercut;
mod recovery;

/// The file in the OST directory that keeps `last_committed` across restarts.
const LAST_COMMITTED_FILE: &str = "last_committed";

/// Identity of an OST.
#[derive(Clone, Debug)]
pub struct OstConfig {
    /// File system.
    pub fsname: String,
    /// OST index.
    pub index: u32,
    /// Target UUID.
    pub uuid: String,
    /// Target directory.
    pub dir: PathBuf,
    /// Shared key.
    pub key: Vec<u8>,
}

impl OstConfig {
    /// `FSNAME-OSTxxxx`.
    pub fn target_name(&self) -> String {
        format!("{}-OST{:04x}", self.fsname, self.index)
    }
}

/// One object storage target.
pub struct Ost {
    cfg: OstConfig,
    objects: PathBuf,
    /// Connection handle → its export (the client, and the TCP connection the handle
    /// was granted on).
    handles: RwLock<HashMap<u64, Arc<Export>>>,
    stats: OpStats,
    /// fsyncs run here, parked, so a slow disk does not hold a service thread.
    syncs: Offload,
    /// Objects larger than this are not kept in the page cache after a read (Lustre's
    /// `readcache_max_filesize`), so streaming big files cannot push out the small
    /// ones and the MDT's metadata sharing the machine.
    readcache_max: std::sync::atomic::AtomicU64,
    /// Reads whose pages were dropped for it.
    readcache_dropped: std::sync::atomic::AtomicU64,
    /// Objects written since the last commit, and the commit's interval and counters.
    commit: Arc<Commit>,
    /// Clients that may have changes to replay, durably (see [`recovery::Clients`]).
    clients: Arc<recovery::Clients>,
    /// Replay recovery after a restart (see [`recovery`]).
    recovery: Mutex<recovery::Recovery>,
    in_recovery: std::sync::atomic::AtomicBool,
    /// This start of the OST: a client that sees it change knows the OST restarted.
    instance: u64,
    /// `recovery_time_soft` and `recovery_time_hard`, seconds.
    recovery_soft_s: AtomicU64,
    recovery_hard_s: AtomicU64,
    /// Where recent appends went, by client and xid: an append is not idempotent, so a
    /// resend of one already done (its reply lost with the connection) is answered
    /// from here instead of appending again.
    appends: Mutex<Appends>,
    /// Marking an append on its object failed once (see [`marks`]; logged once).
    marks_failed: std::sync::atomic::AtomicBool,
}

/// Recent appends: their mark's key (see [`marks::key`]: the client's UUID hashed,
/// and the xid) → (offset, transno), the oldest forgotten past [`APPENDS_KEPT`].
#[derive(Default)]
struct Appends {
    done: HashMap<(u64, u64), (u64, u64)>,
    order: std::collections::VecDeque<(u64, u64)>,
}

/// Appends remembered for resends: more than the writes a client has in flight.
const APPENDS_KEPT: usize = 8192;

impl Appends {
    fn record(&mut self, key: (u64, u64), offset: u64, transno: u64) {
        if self.order.len() >= APPENDS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.done.remove(&old);
            }
        }
        self.order.push_back(key);
        self.done.insert(key, (offset, transno));
    }
}

/// A client's connection to the OST.
struct Export {
    conn_id: u64,
    uuid: String,
    /// On the list of clients recovery waits for: done before its first change is
    /// answered.
    listed: std::sync::atomic::AtomicBool,
}

/// What the OST's commit thread makes durable: every object written since the last
/// commit, fsynced with the directory that names it (never `syncfs`, whose cost grows
/// with everything else written to the disk). Every change (write, punch, destroy,
/// setattr) gets a transno; a commit covers every transno given before it took the
/// list, and records the highest in `last_committed` once it is durable: clients keep
/// what is above it, and replay it if the OST restarts.
pub struct Commit {
    dirty: Mutex<Dirty>,
    /// Held by whoever has an object's file open (read, write, punch, setattr) and by
    /// its destroy: a destroyed object's file goes to the pool and becomes another
    /// object, so nothing may still be reading or writing it as the old one.
    objs: pool::ObjLocks,
    /// Held through a commit: a sync that finds the list empty still waits for the
    /// commit that took it.
    running: Mutex<()>,
    /// Highest transno durable, and the file that keeps it across restarts.
    committed: AtomicU64,
    record: File,
    /// `commit_interval_ms`.
    interval_ms: AtomicU64,
    /// Commits that synced something, and objects synced by them.
    commits: AtomicU64,
    synced: AtomicU64,
    /// The power-cut model, if on (see [`powercut`]).
    undo: Option<Arc<powercut::Undo>>,
    /// Destroyed objects' files kept for new ones (see [`pool`]); none with the
    /// power-cut model, which journals creates and removals, not renames.
    pool: Option<pool::Pool>,
    /// Directories whose new subdirectories are not durable yet.
    new_dirs: NewDirs,
    /// Told of each commit: clients whose connection went leave the list recovery
    /// waits for once a commit covers their changes.
    clients: Arc<recovery::Clients>,
}

/// Changes since the last commit.
#[derive(Default)]
struct Dirty {
    objs: std::collections::HashSet<ObjId>,
    /// Highest transno given.
    last: u64,
}

/// `commit_interval_ms` unless set (the MDT's too).
pub const COMMIT_INTERVAL_MS_DEFAULT: u64 = 100;

impl Commit {
    /// Starts the commit thread over the objects under `root`, its transnos from what
    /// `record` (`last_committed`) says; it ends with the OST.
    fn start(
        root: PathBuf,
        record: File,
        undo: Option<Arc<powercut::Undo>>,
        pool: Option<pool::Pool>,
        clients: Arc<recovery::Clients>,
    ) -> std::io::Result<Arc<Commit>> {
        let mut b = [0u8; 8];
        let committed = match record.read_exact_at(&mut b, 0) {
            Ok(()) => u64::from_le_bytes(b),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => 0,
            Err(e) => return Err(e),
        };
        let c = Arc::new(Commit {
            dirty: Mutex::new(Dirty {
                objs: Default::default(),
                last: committed,
            }),
            objs: pool::ObjLocks::default(),
            running: Mutex::default(),
            committed: committed.into(),
            record,
            interval_ms: AtomicU64::new(COMMIT_INTERVAL_MS_DEFAULT),
            commits: AtomicU64::default(),
            synced: AtomicU64::default(),
            undo,
            pool,
            new_dirs: NewDirs::default(),
            clients,
        });
        let weak = Arc::downgrade(&c);
        std::thread::Builder::new()
            .name("ost-commit".into())
            .spawn(move || loop {
                let Some(c) = weak.upgrade() else { return };
                let ms = c.interval_ms.load(Ordering::Relaxed);
                drop(c);
                std::thread::sleep(std::time::Duration::from_millis(ms));
                let Some(c) = weak.upgrade() else { return };
                if let Err(e) = c.run(&root) {
                    tracing::error!("OST commit failed: {e}");
                }
            })?;
        Ok(c)
    }

    /// Notes a change to an object (its data and, if new, its name are not durable
    /// yet) and gives it a transno: `at` for a replay (its original one), else the
    /// next. Called after the change is made, so a commit that takes the list
    /// meanwhile does not miss it.
    fn wrote(&self, o: ObjId, at: Option<u64>) -> u64 {
        let mut d = self.dirty.lock();
        d.objs.insert(o);
        match at {
            Some(t) => {
                d.last = d.last.max(t);
                t
            }
            None => {
                d.last += 1;
                d.last
            }
        }
    }

    /// Highest transno durable.
    fn last_committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// Makes every change so far durable, with the directories naming the objects,
    /// then records the highest transno it covered. Several objects at once, so the
    /// file system commits their journal entries together. Returns `last_committed`.
    fn run(&self, root: &std::path::Path) -> Result<u64, Errno> {
        let _one = self.running.lock();
        let (objs, last) = {
            let mut d = self.dirty.lock();
            (
                std::mem::take(&mut d.objs).into_iter().collect::<Vec<_>>(),
                d.last,
            )
        };
        let pooled = self.pool.as_ref().map(|p| (p, p.to_sync()));
        if last <= self.last_committed() && objs.is_empty() {
            if let Some((pool, t)) = pooled {
                self.pool_synced(pool, t, &BTreeSet::new());
            }
            return Ok(last);
        }
        let n = objs.len() as u64;
        if !objs.is_empty() {
            let per = objs.len().div_ceil(COMMIT_THREADS);
            let undo = self.undo.as_deref();
            let r = std::thread::scope(|s| {
                let hs: Vec<_> = objs
                    .chunks(per)
                    .map(|chunk| s.spawn(move || sync_objects_unbounded(root, chunk, undo)))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or(Err(Errno::EIO)))
                    .collect::<Result<Vec<()>, Errno>>()
            });
            if let Err(e) = r {
                // Not durable: tried again at the next commit.
                self.dirty.lock().objs.extend(objs);
                if let Some((pool, t)) = pooled {
                    pool.synced(t, false);
                }
                return Err(e);
            }
        }
        if let Some((pool, t)) = pooled {
            // The directories the objects' syncs covered need no second sync.
            let done: BTreeSet<PathBuf> = objs
                .iter()
                .filter_map(|o| object_path_in(root, o).parent().map(Path::to_path_buf))
                .collect();
            self.pool_synced(pool, t, &done);
        }
        // After the objects' list was taken: every object in it was made in a
        // directory already listed here (or synced by an earlier call).
        self.new_dirs.sync()?;
        self.record
            .write_all_at(&last.to_le_bytes(), 0)
            .map_err(|e| io_errno(&e))?;
        self.record
            .sync_data()
            .map_err(|e| sync_failed(io_errno(&e)))?;
        self.committed.fetch_max(last, Ordering::AcqRel);
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.synced.fetch_add(n, Ordering::Relaxed);
        self.clients.committed(last);
        Ok(last)
    }

    /// The pool's part of a commit: files that entered the pool become usable once
    /// empty durably and once the names they had as objects are gone durably (the
    /// directories in `done` were synced by this commit already); a taken one's name
    /// leaves the pool's directory durably.
    fn pool_synced(&self, pool: &pool::Pool, t: pool::ToSync, done: &BTreeSet<PathBuf>) {
        let r = t
            .origins
            .iter()
            .filter(|d| !done.contains(*d))
            .try_for_each(|d| sync_dir_if_there(d))
            .and_then(|()| {
                t.files
                    .iter()
                    .try_for_each(|f| pool.sync_empty(f).map_err(|e| io_errno(&e)))
            })
            .and_then(|()| match t.dir {
                true => sync_dir(pool.dir()),
                false => Ok(()),
            });
        if let Err(e) = &r {
            tracing::error!("OST commit: syncing the object pool failed: {e}");
        }
        pool.synced(t, r.is_ok());
    }
}

/// Threads a commit syncs objects on.
const COMMIT_THREADS: usize = 4;

/// How far behind a read of a big object its pages are dropped too (over the largest
/// page cache folio, 2 MiB on x86-64).
const READCACHE_DROP_BEHIND: u64 = 8 << 20;

/// `readcache_max_filesize` unless set.
pub const READCACHE_MAX_FILESIZE_DEFAULT: u64 = 32 << 20;

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_io(e)
}

impl Ost {
    /// Opens the OST over its directory. What a power cut (in the test model) would
    /// have lost is rolled back first; then, if clients were connected when it
    /// stopped, recovery waits for them to replay what it had not committed.
    pub fn open(cfg: OstConfig) -> std::io::Result<Arc<Ost>> {
        let objects = cfg.dir.join("O");
        if !objects.exists() {
            std::fs::create_dir_all(&objects)?;
            File::open(&cfg.dir)?.sync_all()?;
        }
        let rolled = powercut::restore(&cfg.dir, &objects)?;
        if rolled > 0 {
            warn!(
                target = %cfg.target_name(),
                objects = rolled,
                "power-cut model: writes not synced before the stop are dropped"
            );
        }
        let undo = powercut::Undo::from_env(&cfg.dir)?.map(Arc::new);
        let pool = match undo {
            None => match pool::Pool::open(&cfg.dir) {
                Ok(p) => {
                    p.start_precreating()?;
                    Some(p)
                }
                Err(e) => {
                    // A full disk, say: objects are then made and removed one by one.
                    warn!(target = %cfg.target_name(), "object pool: cannot open it ({e}); running without one");
                    None
                }
            },
            Some(_) => None,
        };
        let (clients, expected) = recovery::Clients::load(&cfg.dir)?;
        let clients = Arc::new(clients);
        let record = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(cfg.dir.join(LAST_COMMITTED_FILE))?;
        // Made on the first start: its name must outlive a power cut, or the next start
        // would count transnos from 0 again below what clients were told is committed.
        lode_base::config::sync_dir(&cfg.dir)?;
        let commit = Commit::start(objects.clone(), record, undo, pool, clients.clone())?;
        let st = lode_rpc::recovery::RecState::new(
            expected,
            commit.last_committed(),
            std::time::Instant::now(),
        );
        let recovering = st.active;
        if recovering {
            info!(
                target = %cfg.target_name(),
                clients = st.expected.len(),
                last_committed = commit.last_committed(),
                "recovery: waiting for the clients connected when the target stopped"
            );
        }
        let ost = Arc::new(Ost {
            cfg,
            objects,
            handles: RwLock::new(HashMap::new()),
            stats: OpStats::default(),
            syncs: Offload::new("ost-sync", 2)?,
            readcache_max: READCACHE_MAX_FILESIZE_DEFAULT.into(),
            readcache_dropped: 0.into(),
            commit,
            clients,
            recovery: Mutex::new(recovery::Recovery::new(st)),
            in_recovery: recovering.into(),
            instance: rand::random::<u64>() | 1,
            recovery_soft_s: lode_base::limits::RECOVERY_TIME_SOFT_DEFAULT_S.into(),
            recovery_hard_s: lode_base::limits::RECOVERY_TIME_HARD_DEFAULT_S.into(),
            appends: Mutex::default(),
            marks_failed: Default::default(),
        });
        if recovering {
            recovery::start_timer(&ost)?;
        }
        Ok(ost)
    }

    /// A clean stop: everything written is committed, and the object pool emptied (so
    /// the next start has nothing to set aside).
    pub fn stop_cleanly(&self) -> Result<(), Errno> {
        self.commit.run(&self.objects)?;
        if let Some(p) = &self.commit.pool {
            // No periodic commit meanwhile: one that took files before the drain would
            // make them usable after it, left for the next start to set aside.
            let _one = self.commit.running.lock();
            p.drain()?;
        }
        Ok(())
    }

    /// The file of an object. Every part is a number, so no input can name a path
    /// outside the OST directory.
    pub fn object_path(&self, o: &ObjId) -> PathBuf {
        object_path_in(&self.objects, o)
    }

    fn open_obj(&self, o: &ObjId, create: bool) -> Result<Option<File>, Errno> {
        open_object(
            &self.objects,
            o,
            create,
            Some((self.commit.pool.as_ref(), &self.commit.new_dirs)),
        )
        .map(|f| f.map(|(f, _)| f))
    }

    fn read(&self, o: &ObjId, off: u64, len: u32) -> Result<Vec<u8>, Errno> {
        if len as usize > BULK_MAX {
            return Err(Errno::EINVAL);
        }
        let _obj = self.commit.objs.lock(o);
        let Some(f) = self.open_obj(o, false)? else {
            return Ok(Vec::new());
        };
        let size = f.metadata().map_err(|e| io_errno(&e))?.len();
        let n = size.saturating_sub(off).min(u64::from(len)) as usize;
        let mut buf = vec![0u8; n];
        f.read_exact_at(&mut buf, off).map_err(|e| io_errno(&e))?;
        if size > self.readcache_max.load(Ordering::Relaxed) && n > 0 {
            // Everything read so far, from a little behind this read: page cache folios
            // may be larger than one read, and advice over part of one is ignored, so
            // the range reaches back past the largest folio. Advice only: if the kernel
            // ignores it, the read was still right.
            let start = off.saturating_sub(READCACHE_DROP_BEHIND);
            let _ = nix::fcntl::posix_fadvise(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                start as i64,
                (off + n as u64 - start) as i64,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            );
            self.readcache_dropped.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf)
    }

    /// Where the next data or hole of an object at or after `off` starts, as its
    /// file says (`lseek(2)` `SEEK_DATA`/`SEEK_HOLE`). A missing object is all hole;
    /// past its end there is no data, and a hole starts at once.
    fn seek(&self, o: &ObjId, off: u64, hole: bool) -> Result<SeekRep, Errno> {
        use nix::unistd::{lseek, Whence};
        let answer = |found| {
            Ok(SeekRep {
                found,
                scanned_to: u64::MAX,
            })
        };
        let pos = i64::try_from(off).map_err(|_| Errno::EINVAL)?;
        let _obj = self.commit.objs.lock(o);
        let Some(f) = self.open_obj(o, false)? else {
            return answer(hole.then_some(off));
        };
        let whence = if hole {
            Whence::SeekHole
        } else {
            Whence::SeekData
        };
        match lseek(std::os::fd::AsRawFd::as_raw_fd(&f), pos, whence) {
            Ok(at) => answer(Some(at as u64)),
            Err(nix::errno::Errno::ENXIO) => answer(hole.then_some(off)),
            Err(e) => Err(Errno(e as i32)),
        }
    }

    /// Writes `data` at `off` of object `o` (at its end, found under its lock, if
    /// `append`), creating it; returns the change's transno (`at` for a replay), the
    /// object as the write left it (if its metadata could be read), and where the
    /// bytes went. An append with a `mark` (its key, see [`marks`]) is marked on the
    /// object before its bytes are written.
    fn write(
        &self,
        o: &ObjId,
        off: u64,
        data: &[u8],
        at: Option<u64>,
        append: bool,
        mark: Option<(u64, u64)>,
    ) -> Result<(u64, Option<ObjAttr>, u64), Errno> {
        if data.len() > BULK_MAX {
            return Err(Errno::EINVAL);
        }
        // The object's lock first, then (power-cut model) the journal's: the order
        // of a punch, fallocate or destroy, which journal under the object's lock.
        let _obj = self.commit.objs.lock(o);
        let off = if append {
            match std::fs::metadata(self.object_path(o)) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == ErrorKind::NotFound => 0,
                Err(e) => return Err(io_errno(&e)),
            }
        } else {
            off
        };
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > lode_base::limits::FILE_SIZE_MAX)
        {
            return Err(Errno::EFBIG);
        }
        let _journaled = match &self.commit.undo {
            Some(u) => {
                Some(u.before_write(&self.objects, &self.object_path(o), off, data.len())?)
            }
            None => None,
        };
        let f = self.open_obj(o, true)?.ok_or(Errno::EIO)?;
        if let Some(k) = mark {
            if let Err(e) = marks::record(&f, k, off) {
                // Without it a resend after a restart of this OSS appends again.
                if !self.marks_failed.swap(true, Ordering::Relaxed) {
                    warn!(target = %self.cfg.target_name(), "cannot mark appends on objects ({e}): an append resent after a restart of this OSS may land twice; not logged again");
                }
            }
        }
        let written = f.write_all_at(data, off);
        // Even after a failed write: part of it may be there, and a new object is.
        let transno = self.commit.wrote(*o, at);
        if let Err(e) = written {
            let errno = io_errno(&e);
            if errno == Errno::ENOSPC {
                warn!(target = %self.cfg.target_name(), "out of space writing {:?}", o);
            }
            return Err(errno);
        }
        let attr = f.metadata().ok().map(|m| obj_attr(&m));
        Ok((transno, attr, off))
    }

    /// Where an append `mark` of `data` to `o` went, if the object's marks say so and
    /// it holds those bytes there (see [`marks`]).
    fn appended(&self, o: &ObjId, mark: (u64, u64), data: &[u8]) -> Option<u64> {
        let _obj = self.commit.objs.lock(o);
        let f = self.open_obj(o, false).ok()??;
        match marks::find(&f, mark, data) {
            Ok(found) => found,
            Err(e) => {
                warn!(target = %self.cfg.target_name(), "reading the append marks of {o:?}: {e}");
                None
            }
        }
    }

    fn getattr(&self, objs: &[ObjId]) -> Result<ObjAttrsRep, Errno> {
        let mut attrs = Vec::with_capacity(objs.len());
        for o in objs {
            attrs.push(match std::fs::metadata(self.object_path(o)) {
                Ok(m) => obj_attr(&m),
                Err(e) if e.kind() == ErrorKind::NotFound => ObjAttr::default(),
                Err(e) => return Err(io_errno(&e)),
            });
        }
        Ok(ObjAttrsRep { attrs })
    }

    /// Sets the objects' mtime; returns the change's transno (`at` for a replay).
    fn set_mtime(&self, objs: &[ObjId], mtime: i64, at: Option<u64>) -> Result<u64, Errno> {
        let t = if mtime >= 0 {
            std::time::UNIX_EPOCH + std::time::Duration::from_nanos(mtime as u64)
        } else {
            std::time::UNIX_EPOCH - std::time::Duration::from_nanos(mtime.unsigned_abs())
        };
        let mut transno = at.unwrap_or(0);
        for o in objs {
            let _obj = self.commit.objs.lock(o);
            if let Some(f) = self.open_obj(o, false)? {
                f.set_modified(t).map_err(|e| io_errno(&e))?;
                transno = self.commit.wrote(*o, at);
            }
        }
        Ok(transno)
    }

    /// Removes objects; returns the change's transno (`at` for a replay). The removal
    /// is durable with the next commit, which syncs the directories.
    fn destroy(&self, objs: &[ObjId], at: Option<u64>) -> Result<u64, Errno> {
        let mut transno = at.unwrap_or(0);
        for o in objs {
            let p = self.object_path(o);
            let remove = || pool::remove(&p);
            let _obj = self.commit.objs.lock(o);
            match (&self.commit.undo, &self.commit.pool) {
                (Some(u), _) => u.synced(&self.objects, &p, remove)?,
                (None, Some(pool)) => pool.destroy(&p)?,
                (None, None) => remove()?,
            }
            transno = self.commit.wrote(*o, at);
        }
        Ok(transno)
    }

    fn statfs(&self) -> Result<StatfsRep, Errno> {
        lode_base::sys::statvfs(&self.cfg.dir)
            .map(StatfsRep::from)
            .map_err(|e| io_errno(&e))
    }

    /// The export of the request's handle: ENOTCONN unless a CONNECT on this very
    /// connection granted it.
    fn export(&self, inc: &Incoming) -> Result<Arc<Export>, Errno> {
        match self.handles.read().get(&inc.header.handle) {
            Some(e) if e.conn_id == inc.conn_id => Ok(e.clone()),
            _ => Err(Errno::ENOTCONN),
        }
    }

    /// Puts the client on the list recovery waits for, durably, before its first
    /// change is answered.
    fn list(&self, exp: &Export) -> Result<(), Errno> {
        if !exp.listed.load(Ordering::Acquire) {
            self.clients.list(&exp.uuid)?;
            exp.listed.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Exports `gone` lost their connection (or said goodbye): once a commit covers
    /// what they changed, their clients need not be waited for after a restart.
    fn forget(&self, gone: Vec<Arc<Export>>) {
        let now = self.commit.dirty.lock().last;
        for e in gone {
            self.clients.gone(&e.uuid, now);
        }
    }

    fn connect(&self, inc: &Incoming, c: &lode_proto::ConnectReq) -> Result<Reply, Errno> {
        if c.fsname != self.cfg.fsname {
            warn!(peer = %inc.peer, "refusing connect for file system {:?}", c.fsname);
            return Err(Errno::EINVAL);
        }
        if c.target != self.cfg.target_name() {
            return Err(Errno::ENODEV);
        }
        if !inc.verify_handshake(&self.cfg.key, &c.client_uuid, &c.target, &c.auth) {
            return Err(Errno::EACCES);
        }
        if !recovery::valid_uuid(&c.client_uuid) {
            warn!(peer = %inc.peer, "refusing connect: bad client UUID");
            return Err(Errno::EINVAL);
        }
        let recovering = self.in_recovery.load(Ordering::Acquire) && {
            let slot = self.clients.slot(&c.client_uuid);
            let mut rec = self.recovery.lock();
            if rec.st.active && !rec.st.expects(slot) {
                // Recovery waits for the clients it had; others come after it.
                return Err(Errno::EAGAIN);
            }
            if rec.st.active {
                rec.st.connected.insert(slot);
            }
            rec.st.active
        };
        let handle = rand::random::<u64>() | 1;
        self.clients.connected(&c.client_uuid);
        let exp = Arc::new(Export {
            conn_id: inc.conn_id,
            uuid: c.client_uuid.clone(),
            listed: self.clients.is_listed(&c.client_uuid).into(),
        });
        let mut handles = self.handles.write();
        // One export per connection: a second CONNECT on it replaces the first.
        let replaced: Vec<Arc<Export>> = handles
            .values()
            .filter(|e| e.conn_id == inc.conn_id)
            .cloned()
            .collect();
        handles.retain(|_, e| e.conn_id != inc.conn_id);
        handles.insert(handle, exp);
        drop(handles);
        self.forget(replaced);
        info!(client = %c.client_uuid, peer = %inc.peer, recovering, "client connected");
        Ok(Reply::Connect(ConnectRep {
            handle,
            flags: c.flags & CONNECT_SUPPORTED,
            max_mod_rpcs: 1,
            target_uuid: self.cfg.uuid.clone(),
            index: self.cfg.index,
            instance: self.instance,
            recovering,
        }))
    }

    /// An answer, with `last_committed` (clients drop what they keep for replay up to
    /// it).
    fn out(&self, r: Result<Reply, Errno>) -> Outgoing {
        let mut out = Outgoing::answer(r);
        out.last_committed = self.commit.last_committed();
        out
    }

    /// The answer to a change: its transno, and `last_committed`.
    fn changed(&self, r: Result<u64, Errno>, rep: Reply) -> Outgoing {
        match r {
            Ok(transno) => Outgoing {
                transno,
                ..self.out(Ok(rep))
            },
            Err(e) => self.out(Err(e)),
        }
    }

    /// A change of object `obj` made durable before its answer (a punch, a fallocate),
    /// run by `change` on an offload thread under the object's lock; the answer
    /// carries its transno.
    fn synced_change(
        &self,
        inc: &Incoming,
        obj: ObjId,
        rep: Reply,
        change: impl FnOnce(&std::path::Path, Option<&powercut::Undo>) -> Result<(), Errno>
            + Send
            + 'static,
    ) -> Outgoing {
        let root = self.objects.clone();
        let commit = self.commit.clone();
        self.syncs.run(inc, move || {
            let _obj = commit.objs.lock(&obj);
            match change(&root, commit.undo.as_deref()).map(|()| commit.wrote(obj, None)) {
                Ok(transno) => Outgoing {
                    transno,
                    last_committed: commit.last_committed(),
                    ..Outgoing::answer(Ok(rep))
                },
                Err(e) => Outgoing::error(e),
            }
        })
    }

    /// Serves a request of a connected client (recovery is over, or never was).
    fn serve(&self, inc: &Incoming, exp: &Arc<Export>, req: OstRequest) -> Outgoing {
        // A destroy does not list its client: it frees space, so it must work on a full
        // disk, where the list cannot be written; one lost to a crash leaves only an
        // orphan object behind.
        let change = matches!(
            req,
            OstRequest::OstWrite(_)
                | OstRequest::Punch(_)
                | OstRequest::OstFallocate(_)
                | OstRequest::OstSetattr(_)
        );
        if change {
            if let Err(e) = self.list(exp) {
                return self.out(Err(e));
            }
        }
        match req {
            OstRequest::OstSync(r) => {
                let root = self.objects.clone();
                let commit = self.commit.clone();
                self.syncs.run(inc, move || {
                    // Everything: what was written since the last commit (the rest is
                    // durable already).
                    let r = if r.objs.is_empty() {
                        commit.run(&root).map(|_| ())
                    } else {
                        sync_objects(&root, &r.objs, commit.undo.as_deref())
                            .and_then(|()| commit.new_dirs.sync())
                    };
                    let mut out = Outgoing::answer(r.map(|_| Reply::OstSync(Empty {})));
                    out.last_committed = commit.last_committed();
                    out
                })
            }
            OstRequest::Punch(r) => self.synced_change(inc, r.obj, Reply::Punch(Empty {}), {
                move |root, undo| punch_object(root, &r.obj, r.size, undo)
            }),
            OstRequest::OstFallocate(r) => {
                self.synced_change(inc, r.obj, Reply::OstFallocate(Empty {}), {
                    move |root, undo| fallocate_object(root, &r, undo)
                })
            }
            OstRequest::OstWrite(r) => {
                // Only an append is looked up and recorded, in memory and on its
                // object, by one key (no cost to other writes).
                let key = r.append.then(|| marks::key(&exp.uuid, inc.header.xid));
                if let Some(key) =
                    key.filter(|_| inc.header.flags & lode_proto::frame::FLAG_RESENT != 0)
                {
                    let done = self.appends.lock().done.get(&key).copied();
                    if let Some((offset, transno)) = done {
                        let reply = OstWriteRep { attr: None, offset };
                        return self.changed(Ok(transno), Reply::OstWrite(reply));
                    }
                    // Not in memory (this OSS restarted since?): the object's marks.
                    if let Some(offset) = self.appended(&r.obj, key, &r.data) {
                        let transno = self.commit.wrote(r.obj, None);
                        self.appends.lock().record(key, offset, transno);
                        let reply = OstWriteRep { attr: None, offset };
                        return self.changed(Ok(transno), Reply::OstWrite(reply));
                    }
                }
                match self.write(&r.obj, r.offset, &r.data, None, r.append, key) {
                    Ok((transno, attr, offset)) => {
                        if let Some(key) = key {
                            self.appends.lock().record(key, offset, transno);
                        }
                        let reply = OstWriteRep { attr, offset };
                        self.changed(Ok(transno), Reply::OstWrite(reply))
                    }
                    Err(e) => self.out(Err(e)),
                }
            }
            OstRequest::OstSetattr(r) => self.changed(
                bounded(&r.objs).and_then(|objs| self.set_mtime(objs, r.mtime, None)),
                Reply::OstSetattr(Empty {}),
            ),
            OstRequest::Destroy(r) => self.changed(
                bounded(&r.objs).and_then(|objs| self.destroy(objs, None)),
                Reply::Destroy(Empty {}),
            ),
            OstRequest::Ping(_) => self.out(Ok(Reply::Ping(Empty {}))),
            OstRequest::Disconnect(_) => {
                let gone = self.handles.write().remove(&inc.header.handle);
                self.forget(gone.into_iter().collect());
                self.out(Ok(Reply::Disconnect(Empty {})))
            }
            OstRequest::Statfs(_) => self.out(self.statfs().map(Reply::Statfs)),
            OstRequest::OstRead(r) => self.out(
                self.read(&r.obj, r.offset, r.len)
                    .map(|data| Reply::OstRead(DataRep { data })),
            ),
            OstRequest::OstSeek(r) => {
                self.out(self.seek(&r.obj, r.offset, r.hole).map(Reply::OstSeek))
            }
            OstRequest::OstGetattr(r) => self.out(
                bounded(&r.objs)
                    .and_then(|objs| self.getattr(objs))
                    .map(Reply::OstGetattr),
            ),
            OstRequest::Connect(_) => self.out(Err(Errno::EALREADY)),
        }
    }
}

/// An object's size, blocks and mtime from its file's metadata.
fn obj_attr(m: &std::fs::Metadata) -> ObjAttr {
    ObjAttr {
        size: m.len(),
        blocks: m.blocks(),
        mtime: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
    }
}

/// The file of an object under `root`. Every part is a number, so no input can name a
/// path outside the OST directory.
fn object_path_in(root: &std::path::Path, o: &ObjId) -> PathBuf {
    root.join(format!("{:x}", o.fid.seq))
        .join(format!("{:02x}", o.fid.oid & 0xff))
        .join(format!(
            "{:x}_{:x}_{}_{}",
            o.fid.oid, o.fid.ver, o.comp, o.stripe
        ))
}

/// Opens an object read-write (punch needs write access even when it only shrinks),
/// creating it and its directories if `create`; says whether it was created. With
/// `deferred` (a write), the file comes from the pool's if it has one, and a new
/// directory's parent is left to the next commit or fsync ([`NewDirs`]); without
/// (a punch, durable before its reply), the parent is synced at once. Either way a
/// later fsync of an object syncs the object and its own directory.
fn open_object(
    root: &std::path::Path,
    o: &ObjId,
    create: bool,
    deferred: Option<(Option<&pool::Pool>, &NewDirs)>,
) -> Result<Option<(File, bool)>, Errno> {
    let p = object_path_in(root, o);
    let open = |create: bool| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(&p)
    };
    match open(false) {
        Ok(f) => return Ok(Some((f, false))),
        Err(e) if e.kind() == ErrorKind::NotFound && create => {}
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_errno(&e)),
    }
    let make_dirs = || {
        let bucket = p.parent().ok_or(Errno::EIO)?;
        let seq = bucket.parent().ok_or(Errno::EIO)?;
        let new_seq = !seq.exists();
        if let Some((_, dirs)) = deferred {
            return dirs.made(
                || std::fs::create_dir_all(bucket),
                seq,
                new_seq.then_some(root),
            );
        }
        std::fs::create_dir_all(bucket).map_err(|e| io_errno(&e))?;
        sync_dir(seq)?;
        if new_seq {
            sync_dir(root)?;
        }
        Ok::<(), Errno>(())
    };
    if let Some(pool) = deferred.and_then(|(p, _)| p) {
        let taken = match pool.take(&p) {
            Err(Errno::ENOENT) => {
                make_dirs()?;
                pool.take(&p)?
            }
            r => r?,
        };
        if taken {
            return open(false)
                .map(|f| Some((f, true)))
                .map_err(|e| io_errno(&e));
        }
    }
    match open(true) {
        Ok(f) => Ok(Some((f, true))),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            make_dirs()?;
            open(true)
                .map(|f| Some((f, true)))
                .map_err(|e| io_errno(&e))
        }
        Err(e) => Err(io_errno(&e)),
    }
}

/// fsyncs a directory, so the entries made in it survive a power cut.
fn sync_dir(dir: &std::path::Path) -> Result<(), Errno> {
    let d = File::open(dir).map_err(|e| io_errno(&e))?;
    d.sync_all().map_err(|e| sync_failed(io_errno(&e)))
}

/// What a server process does when an fsync of an object, or of a directory naming
/// objects, fails (see [`set_on_sync_failure`]).
static ON_SYNC_FAILURE: std::sync::OnceLock<Box<dyn Fn(Errno) + Send + Sync>> =
    std::sync::OnceLock::new();

/// Has `f` run when an fsync of an object or of a directory naming objects fails; a
/// server process stops there. After a failed writeback Linux may mark the pages
/// clean, so the next fsync could succeed with the data never written: trying again
/// would report lost writes as committed, and clients would drop their copies. A
/// restarted OST is told them again by the clients' replay instead. Without it (a
/// library, a test) the error only goes to the caller. Set once; later calls are
/// ignored.
pub fn set_on_sync_failure(f: Box<dyn Fn(Errno) + Send + Sync>) {
    let _ = ON_SYNC_FAILURE.set(f);
}

/// A failed fsync: the hook runs (and a server does not come back from it).
fn sync_failed(e: Errno) -> Errno {
    if let Some(f) = ON_SYNC_FAILURE.get() {
        f(e);
    }
    e
}

/// [`sync_dir`] of a directory that may be gone (nothing left to make durable then).
fn sync_dir_if_there(dir: &std::path::Path) -> Result<(), Errno> {
    match sync_dir(dir) {
        Err(Errno::ENOENT) => Ok(()),
        r => r,
    }
}

/// Directories given a new subdirectory (a FID sequence's, or one of its 256 buckets,
/// made for a new object) and not synced since. Syncing each on the write that made
/// it cost that write a cache flush (about 3 ms on these VMs, so a new sequence's
/// first 256 writes ran at a fifth of the rate); the commit, and an fsync of objects,
/// sync them instead, before saying anything below them is durable.
#[derive(Default)]
struct NewDirs {
    /// Held while a directory is made and listed here, so that whoever takes the
    /// list finds every directory that exists under one it lists.
    pending: Mutex<std::collections::BTreeSet<PathBuf>>,
    /// Held through a sync: one that finds the list empty still waits for the sync
    /// that took it.
    syncing: Mutex<()>,
}

impl NewDirs {
    /// Makes a directory with `make`, listing `parent` (and `grandparent`, if the
    /// parent is new too) as needing a sync.
    fn made(
        &self,
        make: impl FnOnce() -> std::io::Result<()>,
        parent: &std::path::Path,
        grandparent: Option<&std::path::Path>,
    ) -> Result<(), Errno> {
        let mut pending = self.pending.lock();
        make().map_err(|e| io_errno(&e))?;
        pending.insert(parent.to_path_buf());
        if let Some(g) = grandparent {
            pending.insert(g.to_path_buf());
        }
        Ok(())
    }

    /// Syncs every directory listed so far; one that fails stays listed (one that
    /// is gone has nothing left to make durable).
    fn sync(&self) -> Result<(), Errno> {
        let _one = self.syncing.lock();
        let dirs = std::mem::take(&mut *self.pending.lock());
        for (i, d) in dirs.iter().enumerate() {
            if let Err(e) = sync_dir_if_there(d) {
                self.pending.lock().extend(dirs.iter().skip(i).cloned());
                return Err(e);
            }
        }
        Ok(())
    }

    #[cfg(test)]
    fn listed(&self) -> Vec<PathBuf> {
        self.pending.lock().iter().cloned().collect()
    }
}

/// Sets an object's size and makes the change durable before the reply: a shrink the
/// client was told of must not come back after a power cut (the MDT has the new size
/// already, and a glimpse takes the larger of the two). Runs on an offload thread.
fn punch_object(
    root: &std::path::Path,
    o: &ObjId,
    size: u64,
    undo: Option<&powercut::Undo>,
) -> Result<(), Errno> {
    if size > lode_base::limits::FILE_SIZE_MAX {
        return Err(Errno::EFBIG);
    }
    change_durably(root, o, size > 0, undo, |f| f.set_len(size))
}

/// Applies `change` to object `o` (opened read-write; made first if `create`, else an
/// object that does not exist is left so) and makes it durable, its name too if it is
/// new, before returning (a punch, a fallocate: durable before their reply).
fn change_durably(
    root: &std::path::Path,
    o: &ObjId,
    create: bool,
    undo: Option<&powercut::Undo>,
    change: impl FnOnce(&File) -> std::io::Result<()>,
) -> Result<(), Errno> {
    let Some((f, created)) = open_object(root, o, create, None)? else {
        return Ok(());
    };
    let apply = || {
        change(&f).map_err(|e| io_errno(&e))?;
        f.sync_data().map_err(|e| sync_failed(io_errno(&e)))
    };
    match undo {
        Some(u) => u.synced(root, &object_path_in(root, o), apply)?,
        None => apply()?,
    }
    if created {
        if let Some(d) = object_path_in(root, o).parent() {
            sync_dir(d)?;
        }
    }
    Ok(())
}

/// Preallocates or zeroes (creating the object) or punches a range of an object with
/// fallocate(2), which extends it without `KEEP_SIZE` and never shrinks it, and makes
/// it durable before the reply as a punch is: bytes a client was told are gone must
/// not come back after a power cut. Runs on an offload thread.
pub(crate) fn fallocate_object(
    root: &std::path::Path,
    r: &lode_proto::FallocateReq,
    undo: Option<&powercut::Undo>,
) -> Result<(), Errno> {
    use nix::fcntl::FallocateFlags as F;
    let keep = F::FALLOC_FL_KEEP_SIZE;
    let (hole, zero) = (F::FALLOC_FL_PUNCH_HOLE, F::FALLOC_FL_ZERO_RANGE);
    let mode = F::from_bits(r.mode as i32)
        .filter(|m| [F::empty(), keep, keep | hole, zero, keep | zero].contains(m))
        .ok_or(Errno::EOPNOTSUPP)?;
    if r.len == 0 {
        return Err(Errno::EINVAL);
    }
    if r.offset
        .checked_add(r.len)
        .is_none_or(|e| e > lode_base::limits::FILE_SIZE_MAX)
    {
        return Err(Errno::EFBIG);
    }
    // Punching or zeroing within a size kept what was never written changes nothing.
    let create = !mode.contains(hole) && mode != keep | zero;
    change_durably(root, &r.obj, create, undo, |f| {
        use std::os::fd::AsRawFd;
        // Both ends are at most FILE_SIZE_MAX, far below i64::MAX.
        nix::fcntl::fallocate(f.as_raw_fd(), mode, r.offset as i64, r.len as i64)
            .map_err(std::io::Error::from)
    })
}

/// fsyncs objects and the directories that name them; runs on an offload thread.
fn sync_objects(
    root: &std::path::Path,
    objs: &[ObjId],
    undo: Option<&powercut::Undo>,
) -> Result<(), Errno> {
    sync_objects_unbounded(root, bounded(objs)?, undo)
}

/// [`sync_objects`] of any number of objects (the commit's own list). An object that
/// is gone (destroyed) has its directory synced, so the removal is durable too.
///
/// Objects go in windows of [`SYNC_WINDOW`]: every object's writeback is started
/// before the first fsync waits, so the disk takes their data as one batch and each
/// fsync is left to wait and write the inode. Measured here (4 KiB files on ext4):
/// half the CPU and time of fsyncing them one by one.
fn sync_objects_unbounded(
    root: &std::path::Path,
    objs: &[ObjId],
    undo: Option<&powercut::Undo>,
) -> Result<(), Errno> {
    let mut dirs = std::collections::BTreeSet::new();
    for window in objs.chunks(SYNC_WINDOW) {
        let mut files = Vec::with_capacity(window.len());
        for o in window {
            let p = object_path_in(root, o);
            let f = match File::open(&p) {
                Ok(f) => Some(f),
                Err(e) if e.kind() == ErrorKind::NotFound => None,
                Err(e) => return Err(io_errno(&e)),
            };
            if let Some(f) = &f {
                start_writeback(f);
            }
            if let Some(d) = p.parent() {
                dirs.insert(d.to_path_buf());
            }
            files.push((p, f));
        }
        for (p, f) in files {
            let sync = || {
                if lode_rpc::fail::check(lode_rpc::fail::OST_SYNC_FAIL) {
                    return Err(sync_failed(Errno::EIO));
                }
                f.map_or(Ok(()), |f| {
                    f.sync_all().map_err(|e| sync_failed(io_errno(&e)))
                })
            };
            match undo {
                Some(u) => u.synced(root, &p, sync)?,
                None => sync()?,
            }
        }
    }
    // A new object's name is in its directory, which its own fsync does not cover.
    // A directory never made: the object was destroyed before its first write.
    dirs.iter().try_for_each(|d| sync_dir_if_there(d))
}

/// Objects whose writeback one sync starts before it waits on any (open files held).
const SYNC_WINDOW: usize = 256;

/// Starts writing `f`'s dirty pages without waiting: a hint, so a failure is left to
/// the fsync that follows, which reports it.
fn start_writeback(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the call reads and writes no memory of ours.
    unsafe {
        libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

fn bounded(objs: &[ObjId]) -> Result<&[ObjId], Errno> {
    if objs.len() > 4096 {
        return Err(Errno::E2BIG);
    }
    Ok(objs)
}

impl Service for Ost {
    fn handle(&self, inc: &Incoming) -> Outgoing {
        let req = match inc.decode(OstRequest::decode) {
            Ok(r) => r,
            Err(e) => return Outgoing::error(e),
        };
        if let OstRequest::Connect(c) = &req {
            return self.out(self.connect(inc, c));
        }
        let exp = match self.export(inc) {
            Ok(e) => e,
            Err(e) => return self.out(Err(e)),
        };
        let req = if self.in_recovery.load(Ordering::Acquire) {
            match self.during_recovery(inc, &exp, req) {
                Ok(out) => return out,
                Err(req) => *req,
            }
        } else {
            req
        };
        if inc.header.flags & FLAG_REPLAY != 0 {
            // Its client came back after recovery ended without it (evicted): the
            // change is lost, and the client is told.
            warn!(peer = %inc.peer, client = %exp.uuid, xid = inc.header.xid, transno = inc.header.transno, "replay after recovery ended: refused");
            return self.out(Err(Errno::ESTALE));
        }
        self.serve(inc, &exp, req)
    }

    fn disconnected(&self, conn_id: u64) {
        let mut gone = Vec::new();
        self.handles.write().retain(|_, e| {
            if e.conn_id == conn_id {
                gone.push(e.clone());
                false
            } else {
                true
            }
        });
        self.forget(gone);
    }

    fn key(&self) -> &[u8] {
        &self.cfg.key
    }

    fn stats(&self) -> Option<&OpStats> {
        Some(&self.stats)
    }
}

/// Parameters of one OSS process (`obdfilter.FSNAME-OSTxxxx.*`, `fail_loc`).
pub struct OstParams(pub std::sync::Arc<Ost>);

/// `obdfilter.FS-OSTxxxx.*`.
static OBDFILTER: [lode_rpc::admin::Param<Ost>; 16] = {
    use lode_rpc::admin::{Param, Set};
    let [fail_loc, fail_val, fail_opc, rpc_delay_us] = lode_rpc::fail::params::<Ost>();
    [
        Param {
            name: "stats",
            help: "requests served per opcode, with service times in usecs",
            get: |o| o.stats.render(),
            set: Set::Clear(|o| o.stats.clear()),
        },
        Param {
            name: "uuid",
            help: "the target's UUID",
            get: |o| o.cfg.uuid.clone(),
            set: Set::No,
        },
        Param {
            name: "num_exports",
            help: "clients connected",
            get: |o| o.handles.read().len().to_string(),
            set: Set::No,
        },
        Param {
            name: "commit_interval_ms",
            help: "longest written data waits before the commit thread fsyncs it (and the directory naming a new object)",
            get: |o| o.commit.interval_ms.load(Ordering::Relaxed).to_string(),
            set: Set::Num {
                min: 1,
                max: 60_000,
                f: |o, v| {
                    o.commit.interval_ms.store(v, Ordering::Relaxed);
                    Ok(())
                },
            },
        },
        Param {
            name: "commits",
            help: "commits that synced written objects, the objects they synced, and the highest transno durable",
            get: |o| {
                format!(
                    "commits: {}\nobjects: {}\nlast_committed: {}\n",
                    o.commit.commits.load(Ordering::Relaxed),
                    o.commit.synced.load(Ordering::Relaxed),
                    o.commit.last_committed()
                )
            },
            set: Set::No,
        },
        Param {
            name: "object_pool",
            help: "empty files kept for new objects, destroyed objects' and precreated ones (inode allocation is slow on ext4 after many deletions): ready, waiting for a commit, reused so far, precreated so far",
            get: |o| {
                o.commit
                    .pool
                    .as_ref()
                    .map_or_else(|| "off (power-cut model)\n".to_string(), |p| p.render())
            },
            set: Set::No,
        },
        Param {
            name: "readcache_max_filesize",
            help: "objects larger than this (bytes) leave no pages in the cache after a read",
            get: |o| o.readcache_max.load(Ordering::Relaxed).to_string(),
            set: Set::Num {
                min: 0,
                max: u64::MAX,
                f: |o, v| {
                    o.readcache_max.store(v, Ordering::Relaxed);
                    Ok(())
                },
            },
        },
        Param {
            name: "readcache_dropped",
            help: "reads whose pages were dropped from the cache for readcache_max_filesize",
            get: |o| o.readcache_dropped.load(Ordering::Relaxed).to_string(),
            set: Set::Clear(|o| o.readcache_dropped.store(0, Ordering::Relaxed)),
        },
        Param {
            name: "recovery_status",
            help: "replay recovery after the last start: clients, replays, duration",
            get: |o| o.recovery_status(),
            set: Set::No,
        },
        Param {
            name: "recovery_time_soft",
            help: "seconds recovery waits for a client that was connected to come back",
            get: |o| o.recovery_soft_s.load(Ordering::Relaxed).to_string(),
            set: Set::Num {
                min: 1,
                max: 86_400,
                f: |o, v| {
                    o.recovery_soft_s.store(v, Ordering::Relaxed);
                    Ok(())
                },
            },
        },
        Param {
            name: "recovery_time_hard",
            help: "seconds after which recovery ends whatever is missing",
            get: |o| o.recovery_hard_s.load(Ordering::Relaxed).to_string(),
            set: Set::Num {
                min: 1,
                max: 86_400,
                f: |o, v| {
                    o.recovery_hard_s.store(v, Ordering::Relaxed);
                    Ok(())
                },
            },
        },
        Param {
            name: "evict_client",
            help: "write a client UUID to evict it now (recovery stops waiting for it)",
            get: |_| String::new(),
            set: Set::Text(|o, v| o.evict_client(v.trim())),
        },
        fail_loc,
        fail_val,
        fail_opc,
        rpc_delay_us,
    ]
};

impl lode_rpc::admin::Registry for OstParams {
    type Ctx = Ost;

    fn devices(&self) -> Vec<lode_rpc::admin::Device<Ost>> {
        vec![lode_rpc::admin::Device {
            obj: format!("obdfilter.{}", self.0.cfg.target_name()),
            ctx: self.0.clone(),
            params: &OBDFILTER,
        }]
    }

    fn prometheus(&self) -> String {
        let mut s = String::new();
        self.0
            .stats
            .prometheus("lode_ost", &self.0.cfg.target_name(), &mut s);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ost_whose_pool_cannot_be_opened_runs_without_one() {
        let t = tempfile::tempdir().unwrap();
        // `pool` taken by a file: the pool's directory cannot be read or made.
        std::fs::write(t.path().join(pool::POOL_DIR), b"").unwrap();
        let ost = Ost::open(OstConfig {
            fsname: "lode".into(),
            index: 0,
            uuid: "lode-OST0000_UUID".into(),
            dir: t.path().to_path_buf(),
            key: vec![7; 32],
        })
        .expect("the OST starts");
        assert!(ost.commit.pool.is_none());
        // Objects are then made and removed one by one.
        let o = ObjId {
            fid: lode_base::Fid {
                seq: 0x2_0000_0401,
                oid: 9,
                ver: 0,
            },
            comp: 0,
            stripe: 0,
        };
        ost.write(&o, 0, b"bytes", None, false, None).unwrap();
        assert_eq!(std::fs::read(ost.object_path(&o)).unwrap(), b"bytes");
        ost.destroy(&[o], None).unwrap();
        assert!(!ost.object_path(&o).exists());
    }

    #[test]
    fn a_new_objects_directories_are_listed_for_the_next_sync_and_not_synced_by_the_write() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("O");
        std::fs::create_dir(&root).unwrap();
        let dirs = NewDirs::default();
        let a = ObjId {
            fid: lode_base::Fid {
                seq: 0x2_0000_0401,
                oid: 1,
                ver: 0,
            },
            comp: 0,
            stripe: 0,
        };
        let (_, created) = open_object(&root, &a, true, Some((None, &dirs)))
            .unwrap()
            .unwrap();
        assert!(created);
        let p = object_path_in(&root, &a);
        let bucket = p.parent().unwrap();
        let seq = bucket.parent().unwrap();
        // The sequence is new, so the root's entry for it waits too.
        assert_eq!(dirs.listed(), vec![root.clone(), seq.to_path_buf()]);
        // A second object in the same bucket makes no directory.
        let b = ObjId { stripe: 1, ..a };
        open_object(&root, &b, true, Some((None, &dirs)))
            .unwrap()
            .unwrap();
        assert_eq!(dirs.listed().len(), 2);
        dirs.sync().unwrap();
        assert!(dirs.listed().is_empty());
        // A directory gone meanwhile has nothing left to sync: the commit goes on.
        let c = ObjId {
            fid: lode_base::Fid {
                seq: 0x2_0000_0402,
                oid: 1,
                ver: 0,
            },
            ..a
        };
        open_object(&root, &c, true, Some((None, &dirs)))
            .unwrap()
            .unwrap();
        std::fs::remove_dir_all(
            object_path_in(&root, &c)
                .parent()
                .unwrap()
                .parent()
                .unwrap(),
        )
        .unwrap();
        dirs.sync().unwrap();
        assert!(dirs.listed().is_empty());
    }

    #[test]
    fn fallocate_punches_and_zeroes_an_object_keeps_its_size_and_makes_none_to_punch() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("O");
        std::fs::create_dir(&root).unwrap();
        let obj = ObjId {
            fid: lode_base::Fid {
                seq: 0x2_0000_0401,
                oid: 7,
                ver: 0,
            },
            comp: 0,
            stripe: 0,
        };
        let req = |mode: i32, offset, len| lode_proto::FallocateReq {
            obj,
            mode: mode as u32,
            offset,
            len,
        };
        use nix::fcntl::FallocateFlags as F;
        let keep = F::FALLOC_FL_KEEP_SIZE.bits();
        let (hole, zero) = (
            F::FALLOC_FL_PUNCH_HOLE.bits(),
            F::FALLOC_FL_ZERO_RANGE.bits(),
        );
        let (collapse, insert) = (
            F::FALLOC_FL_COLLAPSE_RANGE.bits(),
            F::FALLOC_FL_INSERT_RANGE.bits(),
        );
        // Punching what was never written makes nothing; preallocating makes the object.
        fallocate_object(&root, &req(keep | hole, 0, 4096), None).unwrap();
        assert!(!object_path_in(&root, &obj).exists());
        fallocate_object(&root, &req(keep, 0, 65536), None).unwrap();
        let p = object_path_in(&root, &obj);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0, "size kept");
        std::fs::write(&p, [9u8; 20_000]).unwrap();
        fallocate_object(&root, &req(keep | hole, 4096, 4096), None).unwrap();
        fallocate_object(&root, &req(keep | zero, 15_000, 10_000), None).unwrap();
        let data = std::fs::read(&p).unwrap();
        assert_eq!(data.len(), 20_000);
        for (i, b) in data.iter().enumerate() {
            let zero = (4096..8192).contains(&i) || i >= 15_000;
            assert_eq!(*b, if zero { 0 } else { 9 }, "byte {i}");
        }
        // Without KEEP_SIZE the object grows to the range's end, and never shrinks.
        fallocate_object(&root, &req(0, 0, 10_000), None).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 20_000);
        fallocate_object(&root, &req(zero, 30_000, 5_000), None).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 35_000);
        // Not what lode offers, or a punch without KEEP_SIZE: refused; a bad range too.
        for mode in [hole, collapse, insert, keep | collapse] {
            assert_eq!(
                fallocate_object(&root, &req(mode, 0, 4096), None),
                Err(Errno::EOPNOTSUPP),
                "{mode:#x}"
            );
        }
        assert_eq!(
            fallocate_object(&root, &req(keep, 0, 0), None),
            Err(Errno::EINVAL)
        );
        assert_eq!(
            fallocate_object(&root, &req(keep, u64::MAX, 1), None),
            Err(Errno::EFBIG)
        );
    }
}
