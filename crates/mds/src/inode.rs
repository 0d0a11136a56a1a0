//! Reading and writing inode and dirent records; name and time helpers.

use crate::{Namespace, OpResult};
use lode_base::hash::name_hash;
use lode_base::limits::NAME_MAX;
use lode_base::{Errno, Fid};
use lode_store::records::{dirent_key, DirentRec, InodeRec};
use lode_store::{Batch, Cf};
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in ns since the epoch: the time of the change under way on this thread, if
/// one is (see [`clock`]).
pub(crate) fn now_ns() -> i64 {
    clock::now()
}

fn wall_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// The time of the change under way on this thread. Its first reading of the clock is
/// its time and every later one reads the same (one change, one time, as Lustre's
/// reint records carry one); a replay reads the time its first run was given
/// (`Header::op_time`), so that a change replayed after a restart stamps the ctime,
/// mtime and birth time it stamped before.
pub(crate) mod clock {
    use std::cell::Cell;

    thread_local! {
        /// `Some(0)`: a change is under way and has not read the clock yet.
        static AT: Cell<Option<i64>> = const { Cell::new(None) };
    }

    /// A change starts on this thread; `replayed`: the time its first run was given
    /// (0: none). A time from the future is not believed.
    pub(crate) fn begin(replayed: i64) {
        let t = if replayed > 0 {
            replayed.min(super::wall_ns())
        } else {
            0
        };
        AT.set(Some(t));
    }

    /// The change is over: the time it was given (0 if it read no clock).
    pub(crate) fn end() -> i64 {
        AT.replace(None).unwrap_or(0)
    }

    /// The change's time, or the wall clock outside a change.
    pub(crate) fn now() -> i64 {
        match AT.get() {
            Some(t) if t != 0 => t,
            Some(_) => {
                let t = super::wall_ns();
                AT.set(Some(t));
                t
            }
            None => super::wall_ns(),
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn a_change_reads_one_time_and_its_replay_reads_it_again() {
            super::begin(0);
            let first = super::now();
            std::thread::sleep(std::time::Duration::from_millis(2));
            assert_eq!(super::now(), first, "one change, one time");
            assert_eq!(super::end(), first);
            // Outside a change: the wall clock.
            assert!(super::now() > first);
            // The replay of that change reads the time it was given.
            super::begin(first);
            assert_eq!(super::now(), first);
            assert_eq!(super::end(), first);
            // A time from the future is not believed.
            super::begin(i64::MAX);
            assert!(super::now() < i64::MAX);
            super::end();
            // A change that reads no clock has no time.
            super::begin(0);
            assert_eq!(super::end(), 0);
        }
    }
}

/// Checks the name of an entry to make: `.` and `..` always exist (Linux answers
/// EEXIST), and an entry by either name would be unreachable and make its directory
/// impossible to remove.
pub(crate) fn check_new_name(name: &[u8]) -> Result<(), Errno> {
    if name == b"." || name == b".." {
        return Err(Errno::EEXIST);
    }
    check_name(name)
}

/// Access times that reads gave files and that are not yet in their inodes: one store
/// write per file read would cost the MDT more than the read did, so they are
/// written together, at most [`lode_base::limits::ATIMES_FLUSH_MS`] later or once
/// [`lode_base::limits::ATIMES_PENDING_MAX`] wait (`Namespace::flush_atimes`). Every
/// read of an inode takes its pending time in, so no reader, and no change written
/// from what it read, sees an older one.
#[derive(Default)]
pub(crate) struct PendingAtimes {
    map: parking_lot::Mutex<std::collections::HashMap<Fid, i64>>,
    /// The map's length, read without its lock: most inode reads find it empty.
    len: std::sync::atomic::AtomicUsize,
}

impl PendingAtimes {
    /// Notes that a read gave `fid` the access time `atime` (the later one wins).
    /// Returns how many files wait.
    pub(crate) fn note(&self, fid: Fid, atime: i64) -> usize {
        let mut m = self.map.lock();
        let t = m.entry(fid).or_insert(atime);
        *t = (*t).max(atime);
        self.len.store(m.len(), Ordering::Release);
        m.len()
    }

    /// Gives `rec`, just read from the store, the access time waiting for it, if
    /// later; one the record already has (a change wrote it) waits no more.
    pub(crate) fn take_in(&self, fid: Fid, rec: &mut InodeRec) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut m = self.map.lock();
        match m.get(&fid) {
            Some(&t) if t > rec.atime => rec.atime = t,
            Some(_) => {
                m.remove(&fid);
                self.len.store(m.len(), Ordering::Release);
            }
            None => {}
        }
    }

    /// Drops the time waiting for `fid`: its access time was just set explicitly
    /// (utimes), and the reads before that are past.
    pub(crate) fn forget(&self, fid: Fid) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut m = self.map.lock();
        m.remove(&fid);
        self.len.store(m.len(), Ordering::Release);
    }

    /// Whether any time waits.
    pub(crate) fn is_waiting(&self) -> bool {
        self.len.load(Ordering::Acquire) != 0
    }

    /// What waits now, for writing.
    pub(crate) fn snapshot(&self) -> Vec<(Fid, i64)> {
        if !self.is_waiting() {
            return Vec::new();
        }
        self.map.lock().iter().map(|(f, t)| (*f, *t)).collect()
    }

    /// `written` are in their inodes now: each waits no more unless a later read
    /// gave it a later time meanwhile.
    pub(crate) fn settled(&self, written: &[(Fid, i64)]) {
        let mut m = self.map.lock();
        for (fid, t) in written {
            if m.get(fid).is_some_and(|p| p <= t) {
                m.remove(fid);
            }
        }
        self.len.store(m.len(), Ordering::Release);
    }
}

/// Checks a name for a new or looked-up entry: 1..=255 bytes, no `/` or NUL.
pub(crate) fn check_name(name: &[u8]) -> Result<(), Errno> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

impl Namespace {
    /// The inode record of `fid`, or ENOENT. A change under way notes what it found
    /// (see [`vbr`]).
    pub(crate) fn inode(&self, fid: Fid) -> OpResult<InodeRec> {
        self.found(fid, self.store.inode(&fid.to_bytes())?.as_deref())
    }

    /// [`Namespace::inode`] of many FIDs, read from the store together.
    pub(crate) fn inodes(&self, fids: &[Fid]) -> OpResult<Vec<OpResult<InodeRec>>> {
        let keys: Vec<_> = fids.iter().map(Fid::to_bytes).collect();
        let got = self.store.inodes(&keys)?;
        Ok(fids
            .iter()
            .zip(got)
            .map(|(f, b)| self.found(*f, b.as_deref()))
            .collect())
    }

    /// The record `fid`'s bytes hold (`None`: there is no such inode), noted as found,
    /// with the access time waiting for it (see [`PendingAtimes`]).
    fn found(&self, fid: Fid, bytes: Option<&[u8]>) -> OpResult<InodeRec> {
        match bytes {
            Some(b) => {
                let mut rec: InodeRec = InodeRec::decode(b)?;
                vbr::found(fid, if is_dir(rec.mode) { 0 } else { rec.version });
                self.atimes.take_in(fid, &mut rec);
                Ok(rec)
            }
            None => {
                vbr::found(fid, u64::MAX);
                Err(Errno::ENOENT.into())
            }
        }
    }

    /// The inode record of a directory, or ENOENT/ENOTDIR.
    pub(crate) fn dir_inode(&self, fid: Fid) -> OpResult<InodeRec> {
        let d = self.inode(fid)?;
        if d.mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(Errno::ENOTDIR.into());
        }
        Ok(d)
    }

    /// The entry `name` of `parent`, if present.
    pub(crate) fn dirent(&self, parent: Fid, name: &[u8]) -> OpResult<Option<DirentRec>> {
        let k = dirent_key(parent, name_hash(name), name);
        match self.store.dirent(&k)? {
            Some(b) => Ok(Some(decode_dirent(&b)?)),
            None => Ok(None),
        }
    }

    /// True if directory `fid` has no entries.
    pub(crate) fn dir_is_empty(&self, fid: Fid) -> OpResult<bool> {
        let mut empty = true;
        self.store
            .engine()
            .scan(Cf::Dirent, &fid.to_bytes(), b"", &mut |_, _| {
                empty = false;
                false
            })?;
        Ok(empty)
    }
}

/// Dirent values are fixed: 16 bytes of FID and a `d_type` byte.
pub(crate) fn encode_dirent(d: &DirentRec) -> Vec<u8> {
    let mut v = d.fid.to_bytes().to_vec();
    v.push(d.dtype);
    v
}

/// Decodes a dirent value.
pub(crate) fn decode_dirent(b: &[u8]) -> Result<DirentRec, lode_store::StoreError> {
    match (Fid::from_bytes(b), b.get(16)) {
        (Some(fid), Some(&dtype)) if b.len() == 17 => Ok(DirentRec { fid, dtype }),
        _ => Err(lode_store::StoreError::Corrupt(
            "dirent",
            format!("{} bytes", b.len()),
        )),
    }
}

/// Every byte of the file is on this MDT (a Data-on-MDT component, no OST object
/// yet), so its size here is exact whenever no writer has it open.
pub(crate) fn all_here(rec: &InodeRec) -> bool {
    rec.layout
        .as_ref()
        .is_some_and(|l| l.dom_end() > 0 && !l.has_objects())
}

/// Adds an inode put to a batch, one version on from the record it was read as.
pub(crate) fn put_inode(b: &mut Batch, fid: Fid, rec: &InodeRec) {
    let rec = InodeRec {
        version: rec.version.wrapping_add(1),
        ..rec.clone()
    };
    put_inode_unversioned(b, fid, &rec);
}

/// Adds an inode put to a batch at the version it was read as: only for a change no
/// replay depends on and no reader's copy of the bytes can see (see `close_inner`).
pub(crate) fn put_inode_unversioned(b: &mut Batch, fid: Fid, rec: &InodeRec) {
    b.put(Cf::Inode, fid.to_bytes().to_vec(), rec.encode());
}

/// The directories a change under way on this thread changed, as it found them under
/// their inode locks: their ctime just before it, and the version it left them at.
/// A client that gave up its listing of a directory to make the change keeps the
/// listing, patched, only if nothing else changed the directory between its copy
/// and its change (the ctime before, read here under the lock, not earlier: another
/// client's change could commit in between) nor between its change and the lock
/// handed back with the reply (the version, checked once that lock is granted).
pub(crate) mod dirs {
    use lode_base::Fid;
    use lode_store::records::InodeRec;
    use std::cell::RefCell;

    /// A directory as a change found it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) struct Found {
        /// The directory.
        pub fid: Fid,
        /// Its ctime before the change.
        pub pre_ctime: i64,
        /// Its version once the change is in: one on from the version found if the
        /// change writes it.
        pub version: u64,
    }

    thread_local! {
        /// `Some`: a change is under way on this thread.
        static FOUND: RefCell<Option<Vec<Found>>> = const { RefCell::new(None) };
    }

    /// A change starts on this thread.
    pub(crate) fn begin() {
        FOUND.with_borrow_mut(|f| *f = Some(Vec::new()));
    }

    /// The change is over: the directories it noted, in order.
    pub(crate) fn end() -> Vec<Found> {
        FOUND.with_borrow_mut(|f| f.take().unwrap_or_default())
    }

    /// The change found directory `fid` as `rec` and will write it (`writes`) or
    /// not. The first note of a directory counts.
    pub(crate) fn note(fid: Fid, rec: &InodeRec, writes: bool) {
        FOUND.with_borrow_mut(|f| {
            if let Some(f) = f.as_mut().filter(|f| f.iter().all(|d| d.fid != fid)) {
                f.push(Found {
                    fid,
                    pre_ctime: rec.ctime,
                    version: rec.version.wrapping_add(u64::from(writes)),
                });
            }
        });
    }
}

/// Version-based recovery (Lustre's VBR), per service thread. Every inode a change
/// reads is folded, with its version, into a digest; the digest at the change's commit
/// goes to the client with the reply and comes back with the change's replay. A
/// replay that runs after recovery went past a lost change (a gap) commits only if it
/// finds the same objects at the same versions, that is, if nothing it depends on was
/// lost; otherwise it fails (`EOVERFLOW`, as Lustre's version mismatch) and changes
/// nothing. A version counts the changes to its inode, so replaying the same changes in
/// transno order gives the same versions. Directories count by FID alone: their
/// entries are checked by the replay itself (a name that must be absent or present),
/// and a check of their versions would fail every replay into a directory that the
/// lost change had touched.
pub(crate) mod vbr {
    use lode_base::Fid;
    use std::cell::Cell;

    thread_local! {
        /// The digest so far of the change under way on this thread, if any.
        static DIGEST: Cell<Option<u64>> = const { Cell::new(None) };
        /// Its digest at commit.
        static AT_COMMIT: Cell<u64> = const { Cell::new(0) };
        /// The digest its replay must find (after a gap).
        static EXPECTED: Cell<Option<u64>> = const { Cell::new(None) };
    }

    fn mix(d: u64, v: u64) -> u64 {
        (d.rotate_left(23) ^ v).wrapping_mul(0x0000_0100_0000_01b3)
    }

    /// A change starts on this thread; a replay past a gap must find `expected`.
    pub(crate) fn begin(expected: Option<u64>) {
        DIGEST.set(Some(0xcbf2_9ce4_8422_2325));
        AT_COMMIT.set(0);
        EXPECTED.set(expected);
    }

    /// The change is over: its digest at commit (0 if it committed nothing).
    pub(crate) fn end() -> u64 {
        DIGEST.set(None);
        EXPECTED.set(None);
        AT_COMMIT.replace(0)
    }

    /// The change found `fid` at `version` (`u64::MAX`: absent).
    pub(crate) fn found(fid: Fid, version: u64) {
        if let Some(d) = DIGEST.get() {
            let d = [fid.seq, u64::from(fid.oid), u64::from(fid.ver), version]
                .into_iter()
                .fold(d, mix);
            DIGEST.set(Some(d));
        }
    }

    /// At commit: records the digest, and says whether the change may commit (a replay
    /// past a gap that finds other versions may not).
    pub(crate) fn commit() -> bool {
        let Some(d) = DIGEST.get() else { return true };
        let d = d.max(1);
        AT_COMMIT.set(d);
        EXPECTED.get().is_none_or(|e| e == d)
    }
}

/// Adds a dirent put to a batch.
pub(crate) fn put_dirent(b: &mut Batch, parent: Fid, name: &[u8], child: Fid, dtype: u8) {
    b.put(
        Cf::Dirent,
        dirent_key(parent, name_hash(name), name),
        encode_dirent(&DirentRec { fid: child, dtype }),
    );
}

/// Adds a dirent delete to a batch.
pub(crate) fn del_dirent(b: &mut Batch, parent: Fid, name: &[u8]) {
    b.delete(Cf::Dirent, dirent_key(parent, name_hash(name), name));
}

/// `d_type` of a mode.
pub(crate) fn dtype_of(mode: u32) -> u8 {
    lode_base::FileType::from_mode(mode).map_or(libc::DT_UNKNOWN, |t| t.dtype())
}

/// True for directory modes.
pub(crate) fn is_dir(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFDIR
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_like_linux() {
        assert!(check_name(b"a").is_ok());
        assert_eq!(check_name(&[b'a'; 256]), Err(Errno::ENAMETOOLONG));
        assert!(check_name(&[b'a'; 255]).is_ok());
        assert_eq!(check_name(b"a/b"), Err(Errno::EINVAL));
        assert_eq!(check_name(b""), Err(Errno::EINVAL));
        assert_eq!(check_name(b"a\0"), Err(Errno::EINVAL));
        assert_eq!(check_new_name(b"."), Err(Errno::EEXIST));
        assert_eq!(check_new_name(b".."), Err(Errno::EEXIST));
        assert!(check_new_name(b"...").is_ok());
    }

    fn rec(atime: i64) -> InodeRec {
        InodeRec {
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            nlink: 1,
            size: 0,
            blocks: 0,
            atime,
            mtime: 0,
            ctime: 0,
            rdev: 0,
            flags: 0,
            version: 1,
            parent: Fid::ROOT,
            layout: None,
            symlink: Vec::new(),
            links: Vec::new(),
            btime: 0,
        }
    }

    #[test]
    fn a_change_notes_each_directory_once_and_nothing_outside_a_change() {
        use super::dirs::{begin, end, note, Found};
        let at = |ctime, version| InodeRec {
            ctime,
            version,
            ..rec(0)
        };
        let (a, b) = (Fid::new(1, 1, 0), Fid::new(1, 2, 0));
        note(a, &at(5, 5), true);
        begin();
        note(a, &at(10, 3), true);
        note(a, &at(11, 4), true);
        note(b, &at(20, 7), false);
        let found = end();
        let want = [
            Found {
                fid: a,
                pre_ctime: 10,
                version: 4,
            },
            Found {
                fid: b,
                pre_ctime: 20,
                version: 7,
            },
        ];
        assert_eq!(found, want);
        assert!(end().is_empty(), "over: nothing noted");
    }

    #[test]
    fn a_pending_access_time_is_seen_until_written_and_never_moves_back() {
        let p = PendingAtimes::default();
        let (a, b) = (Fid::new(0x200000400, 1, 0), Fid::new(0x200000400, 2, 0));
        assert_eq!(p.note(a, 10), 1);
        assert_eq!(p.note(a, 5), 1, "an earlier read does not move it back");
        assert_eq!(p.note(b, 7), 2);
        let mut r = rec(3);
        p.take_in(a, &mut r);
        assert_eq!(r.atime, 10, "a reader sees the time waiting");
        // A change wrote the time (it read it through take_in): it waits no more.
        let mut r = rec(10);
        p.take_in(a, &mut r);
        assert_eq!(r.atime, 10);
        assert_eq!(p.snapshot(), vec![(b, 7)]);
        // Written at 7, then read again at 9 before the write settled: 9 stays.
        p.note(b, 9);
        p.settled(&[(b, 7)]);
        assert_eq!(p.snapshot(), vec![(b, 9)]);
        p.settled(&[(b, 9)]);
        assert!(p.snapshot().is_empty());
        // A utimes forgets what reads before it gave.
        p.note(a, 20);
        p.forget(a);
        let mut r = rec(1);
        p.take_in(a, &mut r);
        assert_eq!(r.atime, 1);
    }
}
