//! Object files kept for reuse. A destroyed object's file is truncated and moved into
//! the pool's directory (`pool/RUN/` in the OST directory, see Placement below) rather
//! than removed, and a new object takes one from
//! there rather than creating a file. Creating files costs an inode allocation, and on
//! ext4 without a journal (this project's machines) that allocator skips, one by one,
//! every inode freed in the last minutes (`recently_deleted`, up to six minutes while
//! their inode table is dirty): after many files were deleted, each new object cost
//! the OSS about 300 µs of CPU, most of the cost of a small file's first write.
//!
//! Durability: a file enters the pool truncated, and becomes usable only once a commit
//! synced it (its size 0 durable), so an object made from it never shows a former
//! object's bytes after a power cut. Taking one is a `rename` with `RENAME_NOREPLACE`
//! into the object's name, made durable as a new object's name is, by the commit that
//! syncs the object and its directory; the commit syncs the pool's directory too. A
//! clean stop empties the pool and removes its directory. Leftover files found at
//! start (the OSS was killed, or the machine lost power) are never removed: a rename
//! that a power cut kept half of leaves the file named by an object too, with one link
//! counted, and removing the pool's name would free the object's inode. The whole of
//! `pool/` is set aside as `pool.stale.N`, for an admin to remove once `fsck` has run
//! (empty directories left there are only removed). If the pool cannot be opened (a
//! full disk), the OST runs without one.
//!
//! Precreation (Lustre's OST precreates objects for the MDS to hand out): a thread
//! keeps [`PRECREATE_LOW`] to [`PRECREATE_HIGH`] files ready, making new empty ones
//! while the pool runs low, so a small file's first write renames one instead of
//! allocating an inode in the client's path. Measured here, ext4's allocator scanning
//! the inodes a previous run deleted took 37% of an OSS's CPU during a run of small
//! files, nearly all of it in the writes' `open`. A new file never held bytes, so it is
//! usable at once (no commit first); taken, it is made durable as any pool file is.
//!
//! Placement: the files live in a directory made anew at each start, with a random
//! name, under `pool/`, which carries ext4's "top directory" flag (`chattr +T`). ext4
//! then places that directory, and so the inodes of the files made in it, in a block
//! group of its own choosing among the emptiest, rather than beside the OST's other
//! directories: the groups a previous run's objects were deleted from are where the
//! allocator's scan is slow. Measured here after `rm -rf` of 10,000 objects: 183 µs
//! per new file in the old place, 21-27 µs in a new top-level one.

use crate::io_errno as io;
use lode_base::Errno;
use parking_lot::{Condvar, Mutex};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The pool's directory, beside `O/` (never inside it: `O/` holds only objects). The
/// files are in one directory below it, made at each start.
pub const POOL_DIR: &str = "pool";

/// ext4's "top directory" inode flag (`FS_TOPDIR_FL`, not in the `libc` crate):
/// directories made below one are spread over block groups as top-level ones are.
const FS_TOPDIR_FL: libc::c_int = 0x0002_0000;

/// Most files the pool keeps; a destroy past it removes the file.
const POOL_MAX: usize = 16384;

/// Ready files below which the precreator makes more.
pub const PRECREATE_LOW: usize = 768;
/// Ready files the precreator fills the pool to.
pub const PRECREATE_HIGH: usize = 1024;
/// How long the precreator waits after failing to make a file (a full disk, no
/// inodes left) before it tries again.
const PRECREATE_BACKOFF: Duration = Duration::from_secs(5);

/// Object locks, striped: see `Commit::objs`.
pub struct ObjLocks([Mutex<()>; 64]);

impl Default for ObjLocks {
    fn default() -> Self {
        ObjLocks(std::array::from_fn(|_| Mutex::new(())))
    }
}

impl ObjLocks {
    /// Holds `o`'s stripe until the guard goes.
    pub fn lock(&self, o: &lode_proto::ObjId) -> parking_lot::MutexGuard<'_, ()> {
        use std::hash::BuildHasher;
        let h = foldhash::quality::FixedState::with_seed(0x0b5).hash_one(o);
        self.0[(h % self.0.len() as u64) as usize].lock()
    }
}

/// The files of the pool, by number.
#[derive(Default)]
struct Files {
    /// Truncated, not yet synced: usable after the next commit. Each with the
    /// directory its object's name left, which that commit syncs too.
    pending: Vec<(u64, PathBuf)>,
    /// Synced empty: usable.
    ready: Vec<u64>,
    next: u64,
    /// Entries left the directory since the last commit (it needs a sync).
    taken: bool,
    /// Objects made from pool files.
    reused: u64,
    /// Files the precreator made.
    precreated: u64,
    /// The pool is being emptied or dropped: the precreator stops.
    closing: bool,
}

/// What a commit syncs before files that entered the pool may be used.
pub struct ToSync {
    /// The files: each synced empty.
    pub files: Vec<PathBuf>,
    /// The directories their objects' names left: a pool file reused while the name it
    /// had as an object could come back in a power cut would be one inode under two
    /// names, and a destroy sent again after the restart would empty the new object.
    pub origins: Vec<PathBuf>,
    /// Whether the pool's directory needs a sync (files entered or left it).
    pub dir: bool,
    entries: Vec<(u64, PathBuf)>,
}

/// Empty object files for reuse (see the module's documentation).
pub struct Pool {
    inner: Arc<Inner>,
    /// The precreator, if started; joined by [`Pool::drain`].
    precreator: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// What the pool and its precreator share.
struct Inner {
    /// `pool/`.
    top: PathBuf,
    /// This run's directory in `pool/`, holding the files.
    dir: PathBuf,
    files: Mutex<Files>,
    /// Wakes the precreator: the pool ran low, or is closing.
    wake: Condvar,
}

impl Inner {
    fn path(&self, n: u64) -> PathBuf {
        self.dir.join(format!("{n:x}"))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.inner.files.lock().closing = true;
        self.inner.wake.notify_all();
    }
}

impl Pool {
    /// The pool of the OST directory `ost_dir`, empty: what a run that did not stop
    /// cleanly left is set aside (see the module's documentation).
    pub fn open(ost_dir: &Path) -> std::io::Result<Pool> {
        let top = ost_dir.join(POOL_DIR);
        let left = match std::fs::read_dir(&top) {
            // An empty directory holds nothing to keep (a run killed before its
            // precreator made a file): it goes; anything else is a leftover.
            Ok(rd) => rd.into_iter().any(|e| match e {
                Ok(e) => std::fs::remove_dir(e.path()).is_err(),
                Err(_) => true,
            }),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                std::fs::create_dir(&top)?;
                false
            }
            Err(e) => return Err(e),
        };
        if left {
            let aside = (0u32..)
                .map(|n| ost_dir.join(format!("{POOL_DIR}.stale.{n}")))
                .find(|p| !p.exists())
                .ok_or_else(|| std::io::Error::other("no name for the stale pool"))?;
            std::fs::rename(&top, &aside)?;
            std::fs::create_dir(&top)?;
            tracing::warn!(
                "object pool: files left by an unclean stop set aside in {} (remove them once fsck has run)",
                aside.display()
            );
        }
        let t = std::fs::File::open(&top)?;
        if let Err(e) = set_topdir(&t) {
            // Another file system, or one without the flag: only placement is lost.
            tracing::debug!(
                "object pool: no top-directory flag on {} ({e})",
                top.display()
            );
        }
        let dir = top.join(format!("{:016x}", rand::random::<u64>()));
        let dir = match std::fs::create_dir(&dir) {
            Ok(()) => dir,
            Err(e) => {
                // A full disk, say: the OST still starts, its pool in `pool/` itself.
                tracing::warn!(
                    "object pool: cannot make {} ({e}); its files go in {}",
                    dir.display(),
                    top.display()
                );
                top.clone()
            }
        };
        t.sync_all()?;
        std::fs::File::open(ost_dir)?.sync_all()?;
        Ok(Pool {
            inner: Arc::new(Inner {
                top,
                dir,
                files: Mutex::default(),
                wake: Condvar::new(),
            }),
            precreator: Mutex::new(None),
        })
    }

    fn path(&self, n: u64) -> PathBuf {
        self.inner.path(n)
    }

    /// Starts the thread that keeps [`PRECREATE_LOW`] to [`PRECREATE_HIGH`] new empty
    /// files ready (see the module's documentation).
    pub fn start_precreating(&self) -> std::io::Result<()> {
        let inner = self.inner.clone();
        let h = std::thread::Builder::new()
            .name("ost-precreate".into())
            .spawn(move || precreate(&inner))?;
        *self.precreator.lock() = Some(h);
        Ok(())
    }

    /// Destroys the object file `p`: into the pool if there is room, else removed.
    /// Ok if there was no such file.
    pub fn destroy(&self, p: &Path) -> Result<(), Errno> {
        let n = {
            let mut f = self.inner.files.lock();
            if f.pending.len() + f.ready.len() >= POOL_MAX {
                None
            } else {
                f.next += 1;
                Some(f.next)
            }
        };
        let Some(n) = n else {
            return remove(p);
        };
        let file = match std::fs::OpenOptions::new().write(true).open(p) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io(&e)),
        };
        file.set_len(0).map_err(|e| io(&e))?;
        drop(file);
        match std::fs::rename(p, self.path(n)) {
            Ok(()) => {
                let from = p.parent().unwrap_or(Path::new("")).to_path_buf();
                self.inner.files.lock().pending.push((n, from));
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(_) => remove(p),
        }
    }

    /// Makes a pool file the object file `p` (whose directory exists). `Ok(false)`: the
    /// pool had none ready, or `p` exists already; the caller creates or opens it.
    pub fn take(&self, p: &Path) -> Result<bool, Errno> {
        let n = {
            let mut f = self.inner.files.lock();
            let n = f.ready.pop();
            if f.ready.len() < PRECREATE_LOW {
                self.inner.wake.notify_one();
            }
            n
        };
        let Some(n) = n else {
            return Ok(false);
        };
        let from = self.path(n);
        let r = nix::fcntl::renameat2(
            None,
            &from,
            None,
            p,
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        );
        match r {
            Ok(()) => {
                let mut f = self.inner.files.lock();
                f.taken = true;
                f.reused += 1;
                Ok(true)
            }
            Err(nix::errno::Errno::EEXIST) => {
                self.inner.files.lock().ready.push(n);
                Ok(false)
            }
            Err(nix::errno::Errno::ENOENT) if !from.exists() => Ok(false),
            Err(nix::errno::Errno::ENOENT) => {
                self.inner.files.lock().ready.push(n);
                Err(Errno::ENOENT)
            }
            Err(e) => {
                self.inner.files.lock().ready.push(n);
                Err(io(&std::io::Error::from_raw_os_error(e as i32)))
            }
        }
    }

    /// For a commit: what to sync before the files that became pool files since the
    /// last one may be used. The commit hands it back to [`Pool::synced`].
    pub fn to_sync(&self) -> ToSync {
        let mut f = self.inner.files.lock();
        let entries = std::mem::take(&mut f.pending);
        let dir = !entries.is_empty() || std::mem::take(&mut f.taken);
        let mut origins: Vec<PathBuf> = entries.iter().map(|(_, d)| d.clone()).collect();
        origins.sort_unstable();
        origins.dedup();
        ToSync {
            files: entries.iter().map(|(n, _)| self.path(*n)).collect(),
            origins,
            dir,
            entries,
        }
    }

    /// The pool's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Syncs a file entering the pool, making sure it is empty (nothing can write to
    /// a destroyed object's file under the object locks; this only makes sure).
    pub fn sync_empty(&self, p: &Path) -> std::io::Result<()> {
        let f = std::fs::OpenOptions::new().write(true).open(p)?;
        let m = f.metadata()?;
        if m.len() != 0 || std::os::unix::fs::MetadataExt::blocks(&m) != 0 {
            tracing::warn!(
                "object pool: {} was written after its destroy; emptied",
                p.display()
            );
            f.set_len(0)?;
        }
        f.sync_all()
    }

    /// Empties the pool at a clean stop (the names are all the files have then).
    pub fn drain(&self) -> Result<(), Errno> {
        self.inner.files.lock().closing = true;
        self.inner.wake.notify_all();
        if let Some(h) = self.precreator.lock().take() {
            let _ = h.join();
        }
        let names = {
            let mut f = self.inner.files.lock();
            let mut names = std::mem::take(&mut f.ready);
            names.extend(f.pending.drain(..).map(|(n, _)| n));
            names
        };
        for n in names {
            remove(&self.path(n))?;
        }
        if self.inner.dir != self.inner.top {
            // The removals durable before the directory goes: else a power cut could
            // keep the files without the directory naming them.
            std::fs::File::open(&self.inner.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io(&e))?;
            match std::fs::remove_dir(&self.inner.dir) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(io(&e)),
            }
        }
        std::fs::File::open(&self.inner.top)
            .and_then(|d| d.sync_all())
            .map_err(|e| io(&e))
    }

    /// After a commit synced all of `t` (`ok`): its files are usable. If the commit
    /// failed, they wait for the next one.
    pub fn synced(&self, t: ToSync, ok: bool) {
        let mut f = self.inner.files.lock();
        if ok {
            f.ready.extend(t.entries.into_iter().map(|(n, _)| n));
        } else {
            f.pending.extend(t.entries);
            f.taken |= t.dir;
        }
    }

    /// `obdfilter.*.object_pool`: files ready, files waiting for a commit, objects
    /// made from pool files so far, and files the precreator made.
    pub fn render(&self) -> String {
        let f = self.inner.files.lock();
        format!(
            "ready: {}\npending: {}\nreused: {}\nprecreated: {}\n",
            f.ready.len(),
            f.pending.len(),
            f.reused,
            f.precreated
        )
    }
}

/// The precreator's loop: while the pool is open, fills it to [`PRECREATE_HIGH`]
/// (counting files waiting for a commit) whenever fewer than [`PRECREATE_LOW`] are
/// ready (checked at each take, and every second).
fn precreate(inner: &Inner) {
    let runs_low = |f: &Files| {
        f.ready.len() < PRECREATE_LOW && f.ready.len() + f.pending.len() < PRECREATE_HIGH
    };
    let mut warned = false;
    loop {
        {
            let mut f = inner.files.lock();
            while !f.closing && !runs_low(&f) {
                inner.wake.wait_for(&mut f, Duration::from_secs(1));
            }
            if f.closing {
                return;
            }
        }
        loop {
            let n = {
                let mut f = inner.files.lock();
                if f.closing || f.ready.len() + f.pending.len() >= PRECREATE_HIGH {
                    break;
                }
                f.next += 1;
                f.next
            };
            let p = inner.path(n);
            let made = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&p);
            match made {
                Ok(_) => {
                    let mut f = inner.files.lock();
                    if f.closing {
                        // Stopping: the drain removes only what is listed.
                        drop(f);
                        let _ = remove(&p);
                        return;
                    }
                    f.ready.push(n);
                    f.precreated += 1;
                }
                Err(e) => {
                    if !std::mem::replace(&mut warned, true) {
                        tracing::warn!(
                            "object pool: cannot precreate {} ({e}); new objects are made as they are written (not logged again)",
                            p.display()
                        );
                    }
                    // The takes' wake-ups do not cut the pause short.
                    let until = std::time::Instant::now() + PRECREATE_BACKOFF;
                    let mut f = inner.files.lock();
                    while !f.closing && std::time::Instant::now() < until {
                        inner.wake.wait_until(&mut f, until);
                    }
                    break;
                }
            }
        }
    }
}

/// Sets ext4's top-directory flag on the directory `d` (see the module's documentation).
fn set_topdir(d: &std::fs::File) -> std::io::Result<()> {
    let flags = inode_flags(d)?;
    if flags & FS_TOPDIR_FL != 0 {
        return Ok(());
    }
    set_inode_flags(d, flags | FS_TOPDIR_FL)
}

/// The inode flags of `f`, as `lsattr` reads them (`FS_IOC_GETFLAGS`).
fn inode_flags(f: &std::fs::File) -> std::io::Result<libc::c_int> {
    use std::os::fd::AsRawFd;
    // The kernel reads and writes an `int`, whatever the ioctl's number says.
    let mut flags: libc::c_int = 0;
    // SAFETY: a valid open descriptor, and the flags' address for the call to fill.
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(flags)
}

/// Sets the inode flags of `f`, as `chattr` does (`FS_IOC_SETFLAGS`).
fn set_inode_flags(f: &std::fs::File, flags: libc::c_int) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the call only reads the flags.
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Removes an object's file; Ok if there was none.
pub(crate) fn remove(p: &Path) -> Result<(), Errno> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An OST directory with its `O/`.
    fn ost_dir() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let objs = t.path().join("O");
        std::fs::create_dir(&objs).unwrap();
        (t, objs)
    }

    #[test]
    fn a_destroyed_file_is_reused_empty_only_after_a_commit_synced_it() {
        let (t, objs) = ost_dir();
        // A leftover of a run that did not stop cleanly is set aside, not removed.
        std::fs::create_dir(t.path().join(POOL_DIR)).unwrap();
        std::fs::write(t.path().join(POOL_DIR).join("7"), b"old").unwrap();
        let pool = Pool::open(t.path()).unwrap();
        // The files are in a directory of this run's below `pool/`, which ext4 spreads,
        // and `pool/` holds nothing else.
        assert_eq!(pool.dir().parent(), Some(t.path().join(POOL_DIR).as_path()));
        let in_top: Vec<_> = std::fs::read_dir(t.path().join(POOL_DIR))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(in_top, vec![pool.dir().to_path_buf()]);
        let top = std::fs::File::open(t.path().join(POOL_DIR)).unwrap();
        if nix::sys::statfs::fstatfs(&top).unwrap().filesystem_type()
            == nix::sys::statfs::EXT4_SUPER_MAGIC
        {
            let flags = inode_flags(&top).unwrap();
            assert_ne!(flags & FS_TOPDIR_FL, 0, "pool/ is a top directory");
        }
        let aside = t.path().join(format!("{POOL_DIR}.stale.0")).join("7");
        assert_eq!(std::fs::read(aside).unwrap(), b"old");

        let a = objs.join("a");
        std::fs::write(&a, b"some bytes").unwrap();
        pool.destroy(&a).unwrap();
        assert!(!a.exists());
        // Not synced yet: not to be used.
        let b = objs.join("b");
        assert!(!pool.take(&b).unwrap());
        let s = pool.to_sync();
        assert_eq!((s.files.len(), s.dir), (1, true));
        assert_eq!(
            s.origins,
            vec![objs.clone()],
            "the directory it left is synced"
        );
        // A failed commit: still not to be used.
        pool.synced(s, false);
        assert!(!pool.take(&b).unwrap());
        let s = pool.to_sync();
        assert_eq!((s.files.len(), s.dir), (1, true));
        pool.synced(s, true);
        // An existing object is never replaced.
        std::fs::write(&b, b"keep").unwrap();
        assert!(!pool.take(&b).unwrap());
        assert_eq!(std::fs::read(&b).unwrap(), b"keep");
        let c = objs.join("c");
        assert!(pool.take(&c).unwrap());
        assert_eq!(std::fs::metadata(&c).unwrap().len(), 0);
        assert!(pool.render().contains("reused: 1"));
        // The take left the pool's directory: the next commit syncs it.
        assert!(pool.to_sync().dir);
        // Destroying what is not there is fine.
        pool.destroy(&objs.join("never")).unwrap();
        // A clean stop empties the pool, and the next start finds nothing to set aside.
        let d = objs.join("d");
        std::fs::write(&d, b"x").unwrap();
        pool.destroy(&d).unwrap();
        pool.drain().unwrap();
        assert_eq!(
            std::fs::read_dir(t.path().join(POOL_DIR)).unwrap().count(),
            0
        );
        drop(pool);
        Pool::open(t.path()).unwrap();
        assert!(!t.path().join(format!("{POOL_DIR}.stale.1")).exists());
    }

    #[test]
    fn a_killed_runs_files_are_set_aside_and_its_empty_directories_removed() {
        let (t, objs) = ost_dir();
        // A run killed with a destroyed file in its pool (no drain).
        let pool = Pool::open(t.path()).unwrap();
        let a = objs.join("a");
        std::fs::write(&a, b"bytes").unwrap();
        pool.destroy(&a).unwrap();
        let run = pool.dir().to_path_buf();
        drop(pool);
        // The next start sets the whole of `pool/` aside, the file in it.
        let pool = Pool::open(t.path()).unwrap();
        let aside = t.path().join(format!("{POOL_DIR}.stale.0"));
        let kept = aside.join(run.file_name().unwrap());
        assert_eq!(std::fs::read_dir(&kept).unwrap().count(), 1);
        assert_ne!(pool.dir(), run.as_path());
        // A run killed before any file entered its pool: nothing to set aside, and its
        // empty directory goes.
        let empty = pool.dir().to_path_buf();
        drop(pool);
        let pool = Pool::open(t.path()).unwrap();
        assert!(!empty.exists());
        assert!(!t.path().join(format!("{POOL_DIR}.stale.1")).exists());
        assert_eq!(
            std::fs::read_dir(t.path().join(POOL_DIR)).unwrap().count(),
            1,
            "this run's directory only"
        );
        pool.drain().unwrap();
    }

    /// Sets or clears `flag` on `d` (ext4 inode flags), as `chattr` does.
    fn chattr(d: &Path, flag: libc::c_int, on: bool) -> std::io::Result<()> {
        let f = std::fs::File::open(d)?;
        let flags = inode_flags(&f)?;
        set_inode_flags(&f, if on { flags | flag } else { flags & !flag })
    }

    #[test]
    fn a_pool_whose_run_directory_cannot_be_made_still_opens() {
        let (t, objs) = ost_dir();
        let top = t.path().join(POOL_DIR);
        std::fs::create_dir(&top).unwrap();
        // An immutable `pool/` refuses the run's directory even to root (where
        // `chattr +i` is allowed: ext4, CAP_LINUX_IMMUTABLE).
        const FS_IMMUTABLE_FL: libc::c_int = 0x10;
        if chattr(&top, FS_IMMUTABLE_FL, true).is_err() {
            eprintln!("skipped: cannot make {} immutable here", top.display());
            return;
        }
        let pool = Pool::open(t.path());
        let ok = pool.as_ref().map(|p| p.dir() == top.as_path());
        // What the pool cannot keep, a destroy removes.
        let a = objs.join("a");
        std::fs::write(&a, b"x").unwrap();
        let destroyed = pool.as_ref().map(|p| p.destroy(&a));
        let drained = pool.as_ref().map(|p| p.drain());
        chattr(&top, FS_IMMUTABLE_FL, false).unwrap();
        assert!(ok.unwrap(), "the files go in pool/ itself");
        assert!(matches!(destroyed, Ok(Ok(()))), "{destroyed:?}");
        assert!(!a.exists());
        assert!(matches!(drained, Ok(Ok(()))), "{drained:?}");
    }

    #[test]
    fn the_precreator_keeps_new_empty_files_ready_and_a_drain_removes_them() {
        let (t, objs) = ost_dir();
        let pool = Pool::open(t.path()).unwrap();
        pool.start_precreating().unwrap();
        let ready = |pool: &Pool| pool.inner.files.lock().ready.len();
        let wait_for = |pool: &Pool, n: usize| {
            let t0 = std::time::Instant::now();
            while ready(pool) < n {
                assert!(t0.elapsed() < Duration::from_secs(30), "precreator stuck");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        wait_for(&pool, PRECREATE_HIGH);
        // Usable at once, with no commit: they never held bytes.
        let a = objs.join("a");
        assert!(pool.take(&a).unwrap());
        assert_eq!(std::fs::metadata(&a).unwrap().len(), 0);
        // Taken below the low mark: filled again.
        for i in 0..=(PRECREATE_HIGH - PRECREATE_LOW) {
            assert!(pool.take(&objs.join(format!("b{i}"))).unwrap());
        }
        wait_for(&pool, PRECREATE_HIGH);
        let taken = 1 + (PRECREATE_HIGH - PRECREATE_LOW + 1);
        assert!(pool
            .render()
            .contains(&format!("precreated: {}", PRECREATE_HIGH + taken)));
        // Never more than the high mark.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(ready(&pool), PRECREATE_HIGH);
        // A clean stop stops the precreator and empties the pool.
        pool.drain().unwrap();
        assert_eq!(
            std::fs::read_dir(t.path().join(POOL_DIR)).unwrap().count(),
            0
        );
        drop(pool);
        Pool::open(t.path()).unwrap();
        assert!(!t.path().join(format!("{POOL_DIR}.stale.0")).exists());
    }
}
