//! Object files kept for reuse. A destroyed object's file is truncated and moved into
//! `pool/` in the OST directory rather than removed, and a new object takes one from
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
//! syncs the object and its directory; the commit syncs `pool/` too. A clean stop
//! empties the pool. Leftovers found at start (the OSS was killed, or the machine
//! lost power) are never removed: a rename that a power cut kept half of leaves the
//! file named by an object too, with one link counted, and removing the pool's name
//! would free the object's inode. The whole directory is set aside as
//! `pool.stale.N`, for an admin to remove once `fsck` has run.

use crate::io_errno as io;
use lode_base::Errno;
use parking_lot::Mutex;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// The pool's directory, beside `O/` (never inside it: `O/` holds only objects).
pub const POOL_DIR: &str = "pool";

/// Most files the pool keeps; a destroy past it removes the file.
const POOL_MAX: usize = 16384;

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
    dir: PathBuf,
    files: Mutex<Files>,
}

impl Pool {
    /// The pool of the OST directory `ost_dir`, empty: what a run that did not stop
    /// cleanly left is set aside (see the module's documentation).
    pub fn open(ost_dir: &Path) -> std::io::Result<Pool> {
        let dir = ost_dir.join(POOL_DIR);
        let left = match std::fs::read_dir(&dir) {
            Ok(mut rd) => rd.next().is_some(),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                std::fs::create_dir(&dir)?;
                false
            }
            Err(e) => return Err(e),
        };
        if left {
            let aside = (0u32..)
                .map(|n| ost_dir.join(format!("{POOL_DIR}.stale.{n}")))
                .find(|p| !p.exists())
                .ok_or_else(|| std::io::Error::other("no name for the stale pool"))?;
            std::fs::rename(&dir, &aside)?;
            std::fs::create_dir(&dir)?;
            tracing::warn!(
                "object pool: files left by an unclean stop set aside in {} (remove them once fsck has run)",
                aside.display()
            );
        }
        std::fs::File::open(&dir)?.sync_all()?;
        std::fs::File::open(ost_dir)?.sync_all()?;
        Ok(Pool {
            dir,
            files: Mutex::default(),
        })
    }

    fn path(&self, n: u64) -> PathBuf {
        self.dir.join(format!("{n:x}"))
    }

    /// Destroys the object file `p`: into the pool if there is room, else removed.
    /// Ok if there was no such file.
    pub fn destroy(&self, p: &Path) -> Result<(), Errno> {
        let n = {
            let mut f = self.files.lock();
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
                self.files.lock().pending.push((n, from));
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(_) => remove(p),
        }
    }

    /// Makes a pool file the object file `p` (whose directory exists). `Ok(false)`: the
    /// pool had none ready, or `p` exists already; the caller creates or opens it.
    pub fn take(&self, p: &Path) -> Result<bool, Errno> {
        let Some(n) = self.files.lock().ready.pop() else {
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
                let mut f = self.files.lock();
                f.taken = true;
                f.reused += 1;
                Ok(true)
            }
            Err(nix::errno::Errno::EEXIST) => {
                self.files.lock().ready.push(n);
                Ok(false)
            }
            Err(nix::errno::Errno::ENOENT) if !from.exists() => Ok(false),
            Err(nix::errno::Errno::ENOENT) => {
                self.files.lock().ready.push(n);
                Err(Errno::ENOENT)
            }
            Err(e) => {
                self.files.lock().ready.push(n);
                Err(io(&std::io::Error::from_raw_os_error(e as i32)))
            }
        }
    }

    /// For a commit: what to sync before the files that became pool files since the
    /// last one may be used. The commit hands it back to [`Pool::synced`].
    pub fn to_sync(&self) -> ToSync {
        let mut f = self.files.lock();
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
        &self.dir
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
        let names = {
            let mut f = self.files.lock();
            let mut names = std::mem::take(&mut f.ready);
            names.extend(f.pending.drain(..).map(|(n, _)| n));
            names
        };
        for n in names {
            remove(&self.path(n))?;
        }
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io(&e))
    }

    /// After a commit synced all of `t` (`ok`): its files are usable. If the commit
    /// failed, they wait for the next one.
    pub fn synced(&self, t: ToSync, ok: bool) {
        let mut f = self.files.lock();
        if ok {
            f.ready.extend(t.entries.into_iter().map(|(n, _)| n));
        } else {
            f.pending.extend(t.entries);
            f.taken |= t.dir;
        }
    }

    /// `obdfilter.*.object_pool`: files ready, files waiting for a commit, and objects
    /// made from pool files so far.
    pub fn render(&self) -> String {
        let f = self.files.lock();
        format!(
            "ready: {}\npending: {}\nreused: {}\n",
            f.ready.len(),
            f.pending.len(),
            f.reused
        )
    }
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

    #[test]
    fn a_destroyed_file_is_reused_empty_only_after_a_commit_synced_it() {
        let t = tempfile::tempdir().unwrap();
        let objs = t.path().join("O");
        std::fs::create_dir(&objs).unwrap();
        // A leftover of a run that did not stop cleanly is set aside, not removed.
        std::fs::create_dir(t.path().join(POOL_DIR)).unwrap();
        std::fs::write(t.path().join(POOL_DIR).join("7"), b"old").unwrap();
        let pool = Pool::open(t.path()).unwrap();
        assert_eq!(std::fs::read_dir(pool.dir()).unwrap().count(), 0);
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
        assert_eq!(std::fs::read_dir(pool.dir()).unwrap().count(), 0);
        drop(pool);
        Pool::open(t.path()).unwrap();
        assert!(!t.path().join(format!("{POOL_DIR}.stale.1")).exists());
    }
}
