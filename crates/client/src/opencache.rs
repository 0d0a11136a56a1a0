//! Lustre's open cache: a file opened read-only again and again gets its open handle
//! kept under an OPEN lock, so the next opens and closes need no RPC.
//!
//! A read-only open of a regular file asks the MDT for a PR OPEN lock once the file
//! was opened `opencache_threshold_count` times, each within `opencache_threshold_ms`
//! of the one before (Lustre's defaults, 5 and 100 ms, are lode's). While the lock is
//! held, the last close keeps the handle, and a read-only open by the same
//! credentials takes it again. An unlink or a rename over the file calls the lock
//! back: an idle handle is closed first, then the lock given back, so the file goes
//! with the unlink; a handle in use is closed at its last close. A handle idle for
//! `opencache_max_ms`, or past the `OPEN_CACHE_MAX` idle ones, is closed too.
//!
//! What the MDT said about the file's bytes at the open that made the handle (its
//! data token) holds for a later open while this client keeps the attributes lock it
//! held then, and wrote nothing: a change of the file by anyone else calls that lock
//! back.

use crate::io::FileHandle;
use lode_base::{Cred, Fid};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `opencache_threshold_count` unless set (Lustre's; 0 turns the cache off).
pub const THRESHOLD_COUNT_DEFAULT: u32 = 5;
/// `opencache_threshold_ms` unless set (Lustre's).
pub const THRESHOLD_MS_DEFAULT: u64 = 100;
/// `opencache_max_ms` unless set (Lustre's).
pub const MAX_MS_DEFAULT: u64 = 60_000;
/// Most idle handles kept; past it, the longest idle is closed.
pub const OPEN_CACHE_MAX: usize = 4096;
/// Most files whose recent opens are counted; past it, the counts start again.
const COUNTED_MAX: usize = 65_536;

/// One kept handle.
struct Entry {
    fh: FileHandle,
    /// The OPEN lock (0 once called back: the handle closes at its last close).
    lock: u64,
    cred: Cred,
    users: u32,
    idle_since: Instant,
    /// The open's data token, the attributes lock held across it (0: none) and the
    /// client's data epoch before it.
    token: u64,
    attr_lock: u64,
    data_epoch: u64,
}

#[derive(Default)]
struct Inner {
    by_fid: HashMap<Fid, Entry>,
    by_lock: HashMap<u64, Fid>,
    /// Recent read-only opens of files not kept: how many in a row, and the last.
    counted: HashMap<Fid, (u32, Instant)>,
    last_sweep: Option<Instant>,
}

impl Inner {
    /// The files whose kept handle nobody uses now.
    fn idle(&self) -> Vec<Fid> {
        self.by_fid
            .iter()
            .filter(|(_, e)| e.users == 0)
            .map(|(f, _)| *f)
            .collect()
    }
}

/// The open cache of a client.
pub(crate) struct OpenCache {
    inner: Mutex<Inner>,
    threshold_count: AtomicU32,
    threshold_ms: AtomicU64,
    max_ms: AtomicU64,
    hits: AtomicU64,
    kept: AtomicU64,
    closed: AtomicU64,
}

impl Default for OpenCache {
    fn default() -> OpenCache {
        OpenCache {
            inner: Mutex::default(),
            threshold_count: AtomicU32::new(THRESHOLD_COUNT_DEFAULT),
            threshold_ms: AtomicU64::new(THRESHOLD_MS_DEFAULT),
            max_ms: AtomicU64::new(MAX_MS_DEFAULT),
            hits: AtomicU64::default(),
            kept: AtomicU64::default(),
            closed: AtomicU64::default(),
        }
    }
}

/// What a reused handle is opened with, apart from the kept one.
pub(crate) struct Reuse {
    /// The caller's `O_*` flags.
    pub flags: i32,
    /// The caller's data token (0: none).
    pub cached: u64,
    /// The attributes lock held now, and the client's data epoch now.
    pub attr_lock: u64,
    pub data_epoch: u64,
    /// The client's open epoch now (see `Client::open_epoch`): a handle from another
    /// is gone on the MDT.
    pub open_epoch: (u64, u64),
}

impl OpenCache {
    /// A kept handle of `fid` for a read-only open by `cred`, if there is one.
    pub(crate) fn reuse(&self, cred: &Cred, fid: Fid, r: Reuse) -> Option<FileHandle> {
        let mut inner = self.inner.lock();
        let e = inner.by_fid.get_mut(&fid)?;
        if e.lock == 0 || e.cred != *cred || e.fh.epoch != r.open_epoch {
            return None;
        }
        e.users += 1;
        self.hits.fetch_add(1, Ordering::Relaxed);
        let mut fh = e.fh.clone();
        fh.flags = r.flags;
        fh.prefetch = None;
        fh.data_token = e.token;
        fh.cache_current = r.cached != 0
            && r.cached == e.token
            && e.attr_lock != 0
            && r.attr_lock == e.attr_lock
            && r.data_epoch == e.data_epoch;
        Some(fh)
    }

    /// Counts a read-only open of `fid` about to go to the MDT: true if it should ask
    /// for an OPEN lock.
    pub(crate) fn wants_lock(&self, fid: Fid) -> bool {
        let n = self.threshold_count.load(Ordering::Relaxed);
        if n == 0 {
            return false;
        }
        let within = Duration::from_millis(self.threshold_ms.load(Ordering::Relaxed));
        let now = Instant::now();
        let mut inner = self.inner.lock();
        if inner.counted.len() >= COUNTED_MAX && !inner.counted.contains_key(&fid) {
            inner.counted.clear();
        }
        let c = inner.counted.entry(fid).or_insert((0, now));
        if now.duration_since(c.1) > within {
            c.0 = 0;
        }
        c.0 += 1;
        c.1 = now;
        c.0 >= n
    }

    /// Keeps `fh`, opened under OPEN lock `lock` by `cred` (its first user). False if
    /// the file already has a kept handle (this one is then closed as any other).
    pub(crate) fn keep(
        &self,
        fh: &FileHandle,
        lock: u64,
        cred: &Cred,
        attr_lock: u64,
        data_epoch: u64,
    ) -> bool {
        let mut inner = self.inner.lock();
        if inner.by_fid.contains_key(&fh.fid) {
            return false;
        }
        inner.counted.remove(&fh.fid);
        inner.by_lock.insert(lock, fh.fid);
        inner.by_fid.insert(
            fh.fid,
            Entry {
                fh: fh.clone(),
                lock,
                cred: cred.clone(),
                users: 1,
                idle_since: Instant::now(),
                token: fh.data_token,
                attr_lock,
                data_epoch,
            },
        );
        self.kept.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The close of `fh`: true if the handle stays kept (nothing to send); false if
    /// it is to be closed on the MDT (never kept, or its last user gone after its
    /// lock was).
    pub(crate) fn release(&self, fh: &FileHandle) -> bool {
        let mut inner = self.inner.lock();
        let Some(e) = inner.by_fid.get_mut(&fh.fid) else {
            return false;
        };
        if e.fh.handle != fh.handle {
            return false;
        }
        e.users = e.users.saturating_sub(1);
        if e.users > 0 {
            return true;
        }
        e.idle_since = Instant::now();
        if e.lock != 0 {
            return true;
        }
        self.take(&mut inner, fh.fid);
        false
    }

    /// Takes `fid`'s kept handle, with its lock (0: called back), out of the cache,
    /// to be closed.
    fn take(&self, inner: &mut Inner, fid: Fid) -> Option<(FileHandle, u64)> {
        let e = inner.by_fid.remove(&fid)?;
        if e.lock != 0 {
            inner.by_lock.remove(&e.lock);
        }
        self.closed.fetch_add(1, Ordering::Relaxed);
        Some((e.fh, e.lock))
    }

    /// A callback of `lock`: `None` if it is not the OPEN lock of a kept handle; else
    /// the handle to close before the lock is given back, if it is idle (one in use
    /// closes at its last close).
    pub(crate) fn called_back(&self, lock: u64) -> Option<Option<FileHandle>> {
        let mut inner = self.inner.lock();
        let fid = inner.by_lock.remove(&lock)?;
        let Some(e) = inner.by_fid.get_mut(&fid) else {
            return Some(None);
        };
        e.lock = 0;
        if e.users > 0 {
            return Some(None);
        }
        Some(self.take(&mut inner, fid).map(|(fh, _)| fh))
    }

    /// The idle kept handle of `fid` and its lock, taken out of the cache (this client
    /// is about to unlink or replace the file).
    pub(crate) fn take_idle_of(&self, fid: Fid) -> Option<(FileHandle, u64)> {
        let mut inner = self.inner.lock();
        if inner.by_fid.get(&fid)?.users > 0 {
            return None;
        }
        self.take(&mut inner, fid)
    }

    /// Whether no handle is kept.
    pub(crate) fn is_empty(&self) -> bool {
        self.inner.lock().by_fid.is_empty()
    }

    /// Every lock lost (the callback channel, or an eviction): the idle handles to
    /// close; those in use close at their last close.
    pub(crate) fn drop_all(&self) -> Vec<FileHandle> {
        let mut inner = self.inner.lock();
        inner.by_lock.clear();
        for e in inner.by_fid.values_mut() {
            e.lock = 0;
        }
        let idle = inner.idle();
        idle.into_iter()
            .filter_map(|f| self.take(&mut inner, f).map(|(fh, _)| fh))
            .collect()
    }

    /// Idle handles to close now, with their locks: idle past `opencache_max_ms`, or
    /// the longest idle past [`OPEN_CACHE_MAX`]. Looks at most once a second unless
    /// over the bound.
    pub(crate) fn expired(&self) -> Vec<(FileHandle, u64)> {
        let max = Duration::from_millis(self.max_ms.load(Ordering::Relaxed));
        let now = Instant::now();
        let mut inner = self.inner.lock();
        let over = inner.by_fid.len() > OPEN_CACHE_MAX;
        if !over
            && inner
                .last_sweep
                .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            return Vec::new();
        }
        inner.last_sweep = Some(now);
        let mut idle: Vec<(Instant, Fid)> = inner
            .idle()
            .into_iter()
            .map(|f| (inner.by_fid[&f].idle_since, f))
            .collect();
        idle.sort_unstable();
        let excess = inner.by_fid.len().saturating_sub(OPEN_CACHE_MAX);
        let mut out = Vec::new();
        for (i, (since, f)) in idle.into_iter().enumerate() {
            if i >= excess && now.duration_since(since) < max {
                break;
            }
            out.extend(self.take(&mut inner, f));
        }
        out
    }

    /// Every idle handle, with its lock (`opencache_max_ms` set to 0, or a clean
    /// stop).
    pub(crate) fn take_idle(&self) -> Vec<(FileHandle, u64)> {
        let mut inner = self.inner.lock();
        let idle = inner.idle();
        idle.into_iter()
            .filter_map(|f| self.take(&mut inner, f))
            .collect()
    }

    /// `opencache_threshold_count` (0: off).
    pub(crate) fn threshold_count(&self) -> u32 {
        self.threshold_count.load(Ordering::Relaxed)
    }

    pub(crate) fn set_threshold_count(&self, n: u32) {
        self.threshold_count.store(n, Ordering::Relaxed);
    }

    /// `opencache_threshold_ms`.
    pub(crate) fn threshold_ms(&self) -> u64 {
        self.threshold_ms.load(Ordering::Relaxed)
    }

    pub(crate) fn set_threshold_ms(&self, ms: u64) {
        self.threshold_ms.store(ms, Ordering::Relaxed);
    }

    /// `opencache_max_ms`.
    pub(crate) fn max_ms(&self) -> u64 {
        self.max_ms.load(Ordering::Relaxed)
    }

    pub(crate) fn set_max_ms(&self, ms: u64) {
        self.max_ms.store(ms, Ordering::Relaxed);
    }

    /// `opencache_stats`.
    pub(crate) fn stats(&self) -> String {
        let (open, idle) = {
            let inner = self.inner.lock();
            let idle = inner.by_fid.values().filter(|e| e.users == 0).count();
            (inner.by_fid.len(), idle)
        };
        format!(
            "handles: {open}\nidle: {idle}\nhits: {}\nkept: {}\nclosed: {}\n",
            self.hits.load(Ordering::Relaxed),
            self.kept.load(Ordering::Relaxed),
            self.closed.load(Ordering::Relaxed),
        )
    }
}

impl crate::Client {
    /// A kept handle serving a read-only open of `fid`, if there is one.
    pub(crate) fn reuse_open(
        &self,
        cred: &Cred,
        fid: Fid,
        flags: i32,
        cached: u64,
    ) -> Option<FileHandle> {
        let r = Reuse {
            flags,
            cached,
            attr_lock: self.attr_lock(fid),
            data_epoch: self.data_epoch.load(Ordering::Acquire),
            open_epoch: self.open_epoch(),
        };
        self.opencache.reuse(cred, fid, r)
    }

    /// Closes the idle handles kept too long, in the background.
    pub(crate) fn close_expired(&self) {
        let gone = self.opencache.expired();
        self.close_kept(gone);
    }

    /// Closes every idle kept handle now; false if there was none.
    pub(crate) async fn close_idle_kept(&self) -> bool {
        let idle = self.opencache.take_idle();
        if idle.is_empty() {
            return false;
        }
        self.close_kept_now(idle).await;
        true
    }

    /// Before this client unlinks `name` in `parent` or renames over it: an idle kept
    /// handle of the file (known from the name cache) is closed now, and its lock goes
    /// back with the change, so the MDT need not call this client back for it.
    pub(crate) async fn close_kept_victim(&self, parent: Fid, name: &[u8]) {
        if self.opencache.is_empty() {
            return;
        }
        let Some(fid) = self.cached_child(parent, name) else {
            return;
        };
        let Some((fh, lock)) = self.opencache.take_idle_of(fid) else {
            return;
        };
        if let Err(e) = self.close_on_mdt(&fh).await {
            tracing::debug!(%fid, "closing a kept open handle before an unlink: {e}");
        }
        self.give_back(lock);
    }

    /// Every lock lost: the idle kept handles are closed, in the background.
    pub(crate) fn open_locks_lost(&self) {
        let gone = self.opencache.drop_all();
        self.close_kept(gone.into_iter().map(|fh| (fh, 0)).collect());
    }

    /// [`Client::close_kept_now`] in the background.
    fn close_kept(&self, gone: Vec<(FileHandle, u64)>) {
        if gone.is_empty() {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        self.rt.spawn(async move { me.close_kept_now(gone).await });
    }

    /// Closes kept handles on the MDT, then gives back their OPEN locks (0: none).
    async fn close_kept_now(&self, gone: Vec<(FileHandle, u64)>) {
        let mut locks = Vec::new();
        for (fh, lock) in gone {
            if let Err(e) = self.close_on_mdt(&fh).await {
                tracing::debug!(fid = %fh.fid, "closing a kept open handle: {e}");
            }
            if lock != 0 {
                locks.push(lock);
            }
        }
        if !locks.is_empty() {
            if let Err(e) = self.lock_cancel(locks).await {
                tracing::debug!("giving back OPEN locks: {e}");
            }
        }
    }

    /// `llite.*.opencache_*`.
    pub fn opencache_threshold_count(&self) -> u32 {
        self.opencache.threshold_count()
    }

    /// Sets `opencache_threshold_count` (0: no handle is kept from now on).
    pub fn set_opencache_threshold_count(&self, n: u32) {
        self.opencache.set_threshold_count(n);
    }

    /// `opencache_threshold_ms`.
    pub fn opencache_threshold_ms(&self) -> u64 {
        self.opencache.threshold_ms()
    }

    /// Sets `opencache_threshold_ms`.
    pub fn set_opencache_threshold_ms(&self, ms: u64) {
        self.opencache.set_threshold_ms(ms);
    }

    /// `opencache_max_ms`.
    pub fn opencache_max_ms(&self) -> u64 {
        self.opencache.max_ms()
    }

    /// Sets `opencache_max_ms`; 0 closes every idle kept handle now.
    pub fn set_opencache_max_ms(&self, ms: u64) {
        self.opencache.set_max_ms(ms);
        if ms == 0 {
            let idle = self.opencache.take_idle();
            self.close_kept(idle);
        }
    }

    /// `opencache_stats`: handles kept (and idle), opens served from them, handles
    /// kept and closed so far.
    pub fn opencache_stats(&self) -> String {
        self.opencache.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_is_asked_for_at_the_thresholds_open_in_a_row() {
        let c = OpenCache::default();
        let f = Fid {
            seq: 0x2_0000_0400,
            oid: 1,
            ver: 0,
        };
        // Lustre's default: the fifth open in a row asks.
        let asks: Vec<bool> = (0..6).map(|_| c.wants_lock(f)).collect();
        assert_eq!(asks, [false, false, false, false, true, true]);
        c.set_threshold_count(0);
        assert!(!c.wants_lock(f), "0: off");
        c.set_threshold_count(1);
        assert!(c.wants_lock(Fid { oid: 2, ..f }));
        // Opens further apart than the window start the count again.
        c.set_threshold_count(2);
        c.set_threshold_ms(0);
        let g = Fid { oid: 3, ..f };
        assert!(!c.wants_lock(g));
        std::thread::sleep(Duration::from_millis(2));
        assert!(!c.wants_lock(g));
    }
}
