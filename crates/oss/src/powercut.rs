//! A power cut, modelled on a live disk (a test seam): with `LODE_OST_POWERCUT_MODEL=1`
//! in its environment an OST first journals, for each write, what the write overwrites
//! (the bytes, the object's old size, whether it existed) in an undo file of that
//! object, synced; a sync of the object removes its undo file. When an OST starts, the
//! undo files left are applied, newest record first, whatever the environment says: the
//! objects are then as a machine that lost power would have them, every write since
//! their last sync gone, and `kill -9` of the OSS is a power cut of its disk. It costs
//! an fsync per write and serializes writes with syncs, so it is for tests only.
//!
//! What it does not model: a destroy or a size change by punch is taken as durable at
//! once (punch syncs before its reply anyway), and so are new directories (the OST syncs
//! them at the next commit or fsync, before it says a write in them is durable).

use lode_base::Errno;
use parking_lot::{Mutex, MutexGuard};
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The environment variable that turns the model on.
pub const ENV: &str = "LODE_OST_POWERCUT_MODEL";

/// Undo files of the objects written since their last sync.
pub struct Undo {
    dir: PathBuf,
    /// Held from a write's journal record through the write, and through a sync and
    /// the removal of the undo file it makes stale: no write falls between the two.
    lock: Mutex<()>,
}

fn io(e: &std::io::Error) -> Errno {
    Errno::from_io(e)
}

/// The undo file of the object at `obj`, which lies under `objects`: its path below
/// it, with `/` made `+` (the parts are numbers and `_`, so this is one-to-one).
fn undo_name(objects: &Path, obj: &Path) -> Option<String> {
    let rel = obj.strip_prefix(objects).ok()?;
    Some(rel.to_str()?.replace('/', "+"))
}

impl Undo {
    /// The model for the OST in `ost_dir`, if the environment asks for it.
    pub fn from_env(ost_dir: &Path) -> std::io::Result<Option<Undo>> {
        if std::env::var(ENV).map_or(true, |v| v != "1") {
            return Ok(None);
        }
        let dir = ost_dir.join("undo");
        std::fs::create_dir_all(&dir)?;
        File::open(ost_dir)?.sync_all()?;
        tracing::warn!(
            "{ENV}=1: every write is journaled so that a restart drops what was not synced (a test seam, slow)"
        );
        Ok(Some(Undo {
            dir,
            lock: Mutex::new(()),
        }))
    }

    /// Journals what a write of `len` bytes at `off` to the object at `obj` overwrites;
    /// hold the guard until the write is done.
    pub fn before_write(
        &self,
        objects: &Path,
        obj: &Path,
        off: u64,
        len: usize,
    ) -> Result<MutexGuard<'_, ()>, Errno> {
        let guard = self.lock.lock();
        let name = undo_name(objects, obj).ok_or(Errno::EIO)?;
        let (existed, old_size, old) = match File::open(obj) {
            Ok(f) => {
                let size = f.metadata().map_err(|e| io(&e))?.len();
                let n = size.saturating_sub(off).min(len as u64) as usize;
                let mut b = vec![0u8; n];
                f.read_exact_at(&mut b, off).map_err(|e| io(&e))?;
                (true, size, b)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => (false, 0, Vec::new()),
            Err(e) => return Err(io(&e)),
        };
        let mut rec = Vec::with_capacity(21 + old.len());
        rec.extend_from_slice(&off.to_le_bytes());
        rec.extend_from_slice(&old_size.to_le_bytes());
        rec.push(u8::from(existed));
        rec.extend_from_slice(&(old.len() as u32).to_le_bytes());
        rec.extend_from_slice(&old);
        let path = self.dir.join(name);
        let new = !path.exists();
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io(&e))?;
        f.write_all(&rec).map_err(|e| io(&e))?;
        f.sync_data().map_err(|e| io(&e))?;
        if new {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io(&e))?;
        }
        Ok(guard)
    }

    /// Runs `sync` (an fsync of the object at `obj`, or its removal) and then forgets
    /// the object's journal: what it held is durable now.
    pub fn synced<T>(
        &self,
        objects: &Path,
        obj: &Path,
        sync: impl FnOnce() -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let _g = self.lock.lock();
        let r = sync()?;
        if let Some(name) = undo_name(objects, obj) {
            match std::fs::remove_file(self.dir.join(name)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(io(&e)),
            }
        }
        Ok(r)
    }
}

/// Applies the undo files left under `ost_dir` (a power cut in the model) to the
/// objects under `objects`, newest record first; returns how many objects it rolled
/// back. A torn last record is one whose write never happened (the write follows the
/// record's sync), so it is skipped.
pub fn restore(ost_dir: &Path, objects: &Path) -> std::io::Result<usize> {
    let dir = ost_dir.join("undo");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut n = 0;
    for e in entries {
        let e = e?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let obj = objects.join(name.replace('+', "/"));
        let bytes = std::fs::read(e.path())?;
        let mut recs = Vec::new();
        let mut at = 0usize;
        while let Some(head) = bytes.get(at..at + 21) {
            let off = u64::from_le_bytes(head[0..8].try_into().unwrap_or_default());
            let size = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
            let existed = head[16] != 0;
            let len = u32::from_le_bytes(head[17..21].try_into().unwrap_or_default()) as usize;
            let Some(old) = bytes.get(at + 21..at + 21 + len) else {
                break;
            };
            recs.push((off, size, existed, old));
            at += 21 + len;
        }
        for (off, size, existed, old) in recs.into_iter().rev() {
            if !existed {
                match std::fs::remove_file(&obj) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            // A real power cut may also have taken the object's directory.
            if let Some(d) = obj.parent() {
                lode_base::config::create_dir_durable(d)?;
            }
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&obj)?;
            f.write_all_at(old, off)?;
            f.set_len(size)?;
        }
        if let Ok(f) = File::open(&obj) {
            f.sync_all()?;
        }
        if let Some(d) = obj.parent() {
            if let Ok(d) = File::open(d) {
                d.sync_all()?;
            }
        }
        std::fs::remove_file(e.path())?;
        n += 1;
    }
    File::open(&dir)?.sync_all()?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_undoes_writes_since_the_last_sync() {
        let t = tempfile::tempdir().unwrap();
        let objects = t.path().join("O");
        std::fs::create_dir_all(objects.join("a")).unwrap();
        let u = Undo {
            dir: t.path().join("undo"),
            lock: Mutex::new(()),
        };
        std::fs::create_dir_all(&u.dir).unwrap();
        let synced = objects.join("a/kept");
        let fresh = objects.join("a/new");
        let write = |p: &Path, off: u64, data: &[u8]| {
            let _g = u.before_write(&objects, p, off, data.len()).unwrap();
            let f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(p)
                .unwrap();
            f.write_all_at(data, off).unwrap();
        };
        write(&synced, 0, b"hello world");
        u.synced(&objects, &synced, || Ok(())).unwrap();
        write(&synced, 6, b"there, you");
        write(&synced, 0, b"HELLO");
        write(&fresh, 0, b"gone");
        assert_eq!(restore(t.path(), &objects).unwrap(), 2);
        assert_eq!(std::fs::read(&synced).unwrap(), b"hello world");
        assert!(!fresh.exists());
        assert_eq!(restore(t.path(), &objects).unwrap(), 0);
    }
}
