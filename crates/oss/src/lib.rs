//! The object service: one OST. Objects are named by (file FID, component, stripe),
//! created on first write, and stored as plain files under the OST directory.

use lode_base::limits::BULK_MAX;
use lode_base::Errno;
use lode_proto::{
    ConnectRep, DataRep, Empty, ObjAttr, ObjAttrsRep, ObjId, OstRequest, Reply, StatfsRep,
    CONNECT_SUPPORTED,
};
use lode_rpc::server::Offload;
use lode_rpc::{Incoming, OpStats, Outgoing, Service};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tracing::{info, warn};

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
    /// Connection handle → the TCP connection it was granted on.
    handles: RwLock<HashMap<u64, u64>>,
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
}

/// What the OST's commit thread makes durable: every object written since the last
/// commit, fsynced with the directory that names it (never `syncfs`, whose cost grows
/// with everything else written to the disk).
pub struct Commit {
    dirty: Mutex<std::collections::HashSet<ObjId>>,
    /// Held through a commit: a sync that finds the list empty still waits for the
    /// commit that took it.
    running: Mutex<()>,
    /// `commit_interval_ms`.
    interval_ms: AtomicU64,
    /// Commits that synced something, and objects synced by them.
    commits: AtomicU64,
    synced: AtomicU64,
}

/// `commit_interval_ms` unless set (the MDT's too).
pub const COMMIT_INTERVAL_MS_DEFAULT: u64 = 100;

impl Commit {
    /// Starts the commit thread over the objects under `root`; it ends with the OST.
    fn start(root: PathBuf) -> std::io::Result<Arc<Commit>> {
        let c = Arc::new(Commit {
            dirty: Mutex::default(),
            running: Mutex::default(),
            interval_ms: AtomicU64::new(COMMIT_INTERVAL_MS_DEFAULT),
            commits: AtomicU64::default(),
            synced: AtomicU64::default(),
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

    /// Notes an object written (its data and, if new, its name are not durable yet).
    fn wrote(&self, o: ObjId) {
        self.dirty.lock().insert(o);
    }

    /// Makes every object written so far durable, with the directories naming them.
    /// Several at once, so the file system commits their journal entries together.
    fn run(&self, root: &std::path::Path) -> Result<(), Errno> {
        let _one = self.running.lock();
        let objs: Vec<ObjId> = std::mem::take(&mut *self.dirty.lock())
            .into_iter()
            .collect();
        if objs.is_empty() {
            return Ok(());
        }
        let n = objs.len() as u64;
        let per = objs.len().div_ceil(COMMIT_THREADS);
        let r = std::thread::scope(|s| {
            let hs: Vec<_> = objs
                .chunks(per)
                .map(|chunk| s.spawn(move || sync_objects_unbounded(root, chunk)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(Err(Errno::EIO)))
                .collect::<Result<Vec<()>, Errno>>()
        });
        if let Err(e) = r {
            // Not durable: tried again at the next commit.
            self.dirty.lock().extend(objs);
            return Err(e);
        }
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.synced.fetch_add(n, Ordering::Relaxed);
        Ok(())
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
    /// Opens the OST over its directory.
    pub fn open(cfg: OstConfig) -> std::io::Result<Ost> {
        let objects = cfg.dir.join("O");
        if !objects.exists() {
            std::fs::create_dir_all(&objects)?;
            File::open(&cfg.dir)?.sync_all()?;
        }
        let commit = Commit::start(objects.clone())?;
        Ok(Ost {
            cfg,
            objects,
            handles: RwLock::new(HashMap::new()),
            stats: OpStats::default(),
            syncs: Offload::new("ost-sync", 2)?,
            readcache_max: READCACHE_MAX_FILESIZE_DEFAULT.into(),
            readcache_dropped: 0.into(),
            commit,
        })
    }

    /// The file of an object. Every part is a number, so no input can name a path
    /// outside the OST directory.
    pub fn object_path(&self, o: &ObjId) -> PathBuf {
        object_path_in(&self.objects, o)
    }

    fn open_obj(&self, o: &ObjId, create: bool) -> Result<Option<File>, Errno> {
        open_object(&self.objects, o, create).map(|f| f.map(|(f, _)| f))
    }

    fn read(&self, o: &ObjId, off: u64, len: u32) -> Result<Vec<u8>, Errno> {
        if len as usize > BULK_MAX {
            return Err(Errno::EINVAL);
        }
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

    fn write(&self, o: &ObjId, off: u64, data: &[u8]) -> Result<(), Errno> {
        if data.len() > BULK_MAX {
            return Err(Errno::EINVAL);
        }
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > lode_base::limits::FILE_SIZE_MAX)
        {
            return Err(Errno::EFBIG);
        }
        let f = self.open_obj(o, true)?.ok_or(Errno::EIO)?;
        let written = f.write_all_at(data, off);
        // After the write (a commit taking the list meanwhile must not miss it), and
        // even after a failed one (part of it may be there, and a new object is).
        self.commit.wrote(*o);
        if let Err(e) = written {
            let errno = io_errno(&e);
            if errno == Errno::ENOSPC {
                warn!(target = %self.cfg.target_name(), "out of space writing {:?}", o);
            }
            return Err(errno);
        }
        Ok(())
    }

    fn getattr(&self, objs: &[ObjId]) -> Result<ObjAttrsRep, Errno> {
        let mut attrs = Vec::with_capacity(objs.len());
        for o in objs {
            attrs.push(match std::fs::metadata(self.object_path(o)) {
                Ok(m) => ObjAttr {
                    size: m.len(),
                    blocks: m.blocks(),
                    mtime: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                },
                Err(e) if e.kind() == ErrorKind::NotFound => ObjAttr::default(),
                Err(e) => return Err(io_errno(&e)),
            });
        }
        Ok(ObjAttrsRep { attrs })
    }

    fn set_mtime(&self, objs: &[ObjId], mtime: i64) -> Result<(), Errno> {
        let t = if mtime >= 0 {
            std::time::UNIX_EPOCH + std::time::Duration::from_nanos(mtime as u64)
        } else {
            std::time::UNIX_EPOCH - std::time::Duration::from_nanos(mtime.unsigned_abs())
        };
        for o in objs {
            if let Some(f) = self.open_obj(o, false)? {
                f.set_modified(t).map_err(|e| io_errno(&e))?;
            }
        }
        Ok(())
    }

    fn destroy(&self, objs: &[ObjId]) -> Result<(), Errno> {
        for o in objs {
            match std::fs::remove_file(self.object_path(o)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(io_errno(&e)),
            }
        }
        Ok(())
    }

    fn statfs(&self) -> Result<StatfsRep, Errno> {
        lode_base::sys::statvfs(&self.cfg.dir)
            .map(StatfsRep::from)
            .map_err(|e| io_errno(&e))
    }

    /// ENOTCONN unless the request's handle was granted by a CONNECT on this very
    /// connection.
    fn check_export(&self, inc: &Incoming) -> Result<(), Errno> {
        if self.handles.read().get(&inc.header.handle) != Some(&inc.conn_id) {
            return Err(Errno::ENOTCONN);
        }
        Ok(())
    }

    fn dispatch(&self, inc: &Incoming, req: OstRequest) -> Result<Reply, Errno> {
        if let OstRequest::Connect(c) = &req {
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
            let handle = rand::random::<u64>() | 1;
            let mut handles = self.handles.write();
            // One export per connection: a second CONNECT on it replaces the first.
            handles.retain(|_, conn| *conn != inc.conn_id);
            handles.insert(handle, inc.conn_id);
            drop(handles);
            info!(client = %c.client_uuid, peer = %inc.peer, "client connected");
            return Ok(Reply::Connect(ConnectRep {
                handle,
                flags: c.flags & CONNECT_SUPPORTED,
                max_mod_rpcs: 1,
                target_uuid: self.cfg.uuid.clone(),
                index: self.cfg.index,
                // Nothing to replay here: only the MDT runs recovery.
                instance: 0,
                recovering: false,
            }));
        }
        self.check_export(inc)?;
        Ok(match req {
            OstRequest::Ping(_) => Reply::Ping(Empty {}),
            OstRequest::Disconnect(_) => {
                self.handles.write().remove(&inc.header.handle);
                Reply::Disconnect(Empty {})
            }
            OstRequest::Statfs(_) => Reply::Statfs(self.statfs()?),
            OstRequest::OstRead(r) => Reply::OstRead(DataRep {
                data: self.read(&r.obj, r.offset, r.len)?,
            }),
            OstRequest::OstWrite(r) => {
                self.write(&r.obj, r.offset, &r.data)?;
                Reply::OstWrite(Empty {})
            }
            OstRequest::OstGetattr(r) => Reply::OstGetattr(self.getattr(bounded(&r.objs)?)?),
            // Parked on the offload threads in `handle` before dispatch.
            OstRequest::OstSync(_) | OstRequest::Punch(_) => return Err(Errno::EPROTO),
            OstRequest::OstSetattr(r) => {
                self.set_mtime(bounded(&r.objs)?, r.mtime)?;
                Reply::OstSetattr(Empty {})
            }
            OstRequest::Destroy(r) => {
                self.destroy(bounded(&r.objs)?)?;
                Reply::Destroy(Empty {})
            }
            OstRequest::Connect(_) => return Err(Errno::EALREADY),
        })
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
/// creating it and its directories if `create`; says whether it was created. A new
/// directory is synced into its parent at once (there are at most 256 per sequence),
/// so a later fsync of an object needs to sync only the object and its own directory.
fn open_object(
    root: &std::path::Path,
    o: &ObjId,
    create: bool,
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
    match open(true) {
        Ok(f) => Ok(Some((f, true))),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let bucket = p.parent().ok_or(Errno::EIO)?;
            let seq = bucket.parent().ok_or(Errno::EIO)?;
            let new_seq = !seq.exists();
            std::fs::create_dir_all(bucket).map_err(|e| io_errno(&e))?;
            sync_dir(seq)?;
            if new_seq {
                sync_dir(root)?;
            }
            open(true)
                .map(|f| Some((f, true)))
                .map_err(|e| io_errno(&e))
        }
        Err(e) => Err(io_errno(&e)),
    }
}

/// fsyncs a directory, so the entries made in it survive a power cut.
fn sync_dir(dir: &std::path::Path) -> Result<(), Errno> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_errno(&e))
}

/// Sets an object's size and makes the change durable before the reply: a shrink the
/// client was told of must not come back after a power cut (the MDT has the new size
/// already, and a glimpse takes the larger of the two). Runs on an offload thread.
fn punch_object(root: &std::path::Path, o: &ObjId, size: u64) -> Result<(), Errno> {
    if size > lode_base::limits::FILE_SIZE_MAX {
        return Err(Errno::EFBIG);
    }
    let Some((f, created)) = open_object(root, o, size > 0)? else {
        return Ok(());
    };
    f.set_len(size).map_err(|e| io_errno(&e))?;
    f.sync_data().map_err(|e| io_errno(&e))?;
    if created {
        if let Some(d) = object_path_in(root, o).parent() {
            sync_dir(d)?;
        }
    }
    Ok(())
}

/// fsyncs objects and the directories that name them; runs on an offload thread.
fn sync_objects(root: &std::path::Path, objs: &[ObjId]) -> Result<(), Errno> {
    sync_objects_unbounded(root, bounded(objs)?)
}

/// [`sync_objects`] of any number of objects (the commit's own list).
fn sync_objects_unbounded(root: &std::path::Path, objs: &[ObjId]) -> Result<(), Errno> {
    let mut dirs = std::collections::BTreeSet::new();
    for o in objs {
        let p = object_path_in(root, o);
        match File::open(&p) {
            Ok(f) => f.sync_all().map_err(|e| io_errno(&e))?,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(io_errno(&e)),
        }
        if let Some(d) = p.parent() {
            dirs.insert(d.to_path_buf());
        }
    }
    // A new object's name is in its directory, which its own fsync does not cover.
    for d in dirs {
        sync_dir(&d)?;
    }
    Ok(())
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
        if let OstRequest::OstSync(r) = req {
            if let Err(e) = self.check_export(inc) {
                return Outgoing::error(e);
            }
            let root = self.objects.clone();
            let commit = self.commit.clone();
            return self.syncs.run(inc, move || {
                // Everything: what was written since the last commit (the rest is
                // durable already).
                let r = if r.objs.is_empty() {
                    commit.run(&root)
                } else {
                    sync_objects(&root, &r.objs)
                };
                Outgoing::answer(r.map(|_| Reply::OstSync(Empty {})))
            });
        }
        if let OstRequest::Punch(r) = req {
            if let Err(e) = self.check_export(inc) {
                return Outgoing::error(e);
            }
            let root = self.objects.clone();
            return self.syncs.run(inc, move || {
                Outgoing::answer(
                    punch_object(&root, &r.obj, r.size).map(|_| Reply::Punch(Empty {})),
                )
            });
        }
        Outgoing::answer(self.dispatch(inc, req))
    }

    fn disconnected(&self, conn_id: u64) {
        self.handles.write().retain(|_, conn| *conn != conn_id);
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
static OBDFILTER: [lode_rpc::admin::Param<Ost>; 11] = {
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
            help: "commits that synced written objects, and the objects they synced",
            get: |o| {
                format!(
                    "commits: {}\nobjects: {}\n",
                    o.commit.commits.load(Ordering::Relaxed),
                    o.commit.synced.load(Ordering::Relaxed)
                )
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
