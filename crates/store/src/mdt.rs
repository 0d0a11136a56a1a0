//! Transactions and commits: every change is one batch that also holds its reply
//! record; transnos are assigned inside the batch-apply critical section so WAL order
//! is transno order; a commit thread syncs the WAL and only then publishes
//! `last_committed`. A change that writes nothing and may run again after a restart
//! (a read-only open, a close that changes nothing) still gets a transno, so its
//! client replays it in order after a restart (Lustre's "empty transno"), but its reply
//! record stays in memory: only a resend to this same run of the target reads it.

use crate::engine::{Batch, Cf, Engine, Op, StoreError};
use crate::records::{self, reply_key};
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing::error;

const LAST_TRANSNO: &[u8] = b"last_transno";

/// The highest transno the engine holds: `LAST_TRANSNO`, or a reply record's if higher.
/// A change with a reply record writes its transno there only (one key less per
/// change); `LAST_TRANSNO` is written by changes without one, by writes that rewrite or
/// delete reply records outside a transno, and by the commit before a sync that covers
/// changes that wrote nothing. Reply records are few (clients × tags), so the scan is
/// short.
pub fn last_transno_on_disk(engine: &dyn Engine) -> Result<u64, StoreError> {
    let mut last = match engine.get(Cf::Server, LAST_TRANSNO)? {
        Some(b) => match <[u8; 8]>::try_from(b.as_slice()) {
            Ok(a) => u64::from_le_bytes(a),
            Err(_) => return Err(StoreError::Corrupt("server", "last_transno".into())),
        },
        None => 0,
    };
    let mut bad = None;
    engine.scan(Cf::Reply, b"", b"", &mut |_, v| {
        match records::decode::<ReplyRecord>("reply", v) {
            Ok(r) => last = last.max(r.transno),
            Err(e) => {
                bad = Some(e);
                return false;
            }
        }
        true
    })?;
    match bad {
        Some(e) => Err(e),
        None => Ok(last),
    }
}

/// What a resent request gets back: the stored outcome of its first execution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyRecord {
    /// xid of the request.
    pub xid: u64,
    /// Its transno.
    pub transno: u64,
    /// Its status.
    pub status: i32,
    /// Its reply body.
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// Where a reply record goes: the client's slot and the request's tag.
#[derive(Clone, Copy, Debug)]
pub struct ReplySlot {
    /// Client slot.
    pub slot: u32,
    /// Modify tag.
    pub tag: u16,
    /// Request xid.
    pub xid: u64,
    /// A replay's original transno, which it keeps (0: a new change, given the next).
    pub replay_transno: u64,
    /// 0 for a whole request; k + 1 for sub-request k of a batch, which has a record
    /// of its own so a resent batch runs each of its changes exactly once.
    pub sub: u16,
}

/// Called once when the store stops after a failure.
pub type StopHook = Box<dyn Fn(&StoreError) + Send>;

/// Called once with the committed transno (or the failure) when a commit covers what
/// the waiter asked for.
pub type CommitWaiter = Box<dyn FnOnce(Result<u64, StoreError>) + Send>;

/// Inode records read recently, kept equal to the engine: every batch that writes an
/// inode updates the ones held here after it is written, and a record read from the
/// engine is kept only if no inode was written meanwhile (`gen`), so a read racing a
/// write can never leave an old record behind. The hot ones (directories being filled
/// or emptied, a directory being walked and warmed) are then read without a search of
/// the memtable or the block cache.
struct InodeCache {
    /// At most `mdt.*.inode_cache_max` records.
    // foldhash (seeded per process), not SipHash: FIDs come from sequences the MDT
    // grants, and SipHash was the largest cost of cache warming.
    gens: Generations<InodeKey, InodeBytes>,
    hits: u64,
    misses: u64,
    /// Per FID sequence, an oid bound: every inode record of sequence `s` in the
    /// engine has an oid below `bounds[s]`. A create's check that its new FID is
    /// unused (a search that always misses) is answered from it: clients take FIDs
    /// in order from sequences of their own. Learned from the engine once per
    /// sequence ([`MdtStore::inode_exists`]) and raised before any write of a record
    /// above it, both under the store's apply lock, so it is never below the truth.
    bounds: foldhash::HashMap<u64, u64>,
    /// Existence checks a bound answered.
    bounded: u64,
}

impl Default for InodeCache {
    fn default() -> InodeCache {
        InodeCache {
            gens: Generations::new(INODE_CACHE_MAX),
            hits: 0,
            misses: 0,
            bounds: Default::default(),
            bounded: 0,
        }
    }
}

/// Sequences whose oid bound the inode cache keeps at most; past it, it forgets them
/// all and learns again (a client making FIDs in many sequences costs searches, not
/// memory).
const OID_BOUNDS_MAX: usize = 1 << 16;

/// An inode key's sequence, and the oid bound its record needs (see
/// `InodeCache::bounds`); `None` for a key too short to hold a FID's.
fn oid_bound(key: &[u8]) -> Option<(u64, u64)> {
    let seq = u64::from_be_bytes(key.get(..8)?.try_into().ok()?);
    let oid = u32::from_be_bytes(key.get(8..12)?.try_into().ok()?);
    Some((seq, u64::from(oid) + 1))
}

/// A cache of two generations, kept equal to the engine by its owner (`gen`): entries
/// go into `map`; when it is full, it becomes `old` (and the previous `old` goes), and
/// an entry found in `old` moves back into `map`. Two generations approximate LRU at
/// the cost of a hash lookup.
struct Generations<K, V> {
    /// Entries kept at most: half in each generation.
    max: usize,
    map: foldhash::HashMap<K, V>,
    old: foldhash::HashMap<K, V>,
    /// The generation `insert` pushed out, for whoever holds the lock to drop after
    /// releasing it: freeing ~131k records takes milliseconds, and the warming thread
    /// (idle-class, preempted at once) must not hold the lock meanwhile.
    retired: Option<foldhash::HashMap<K, V>>,
    /// Bumped by every batch that writes to the cached keyspace: a reader keeps what
    /// it read from the engine only if this has not moved since it looked.
    gen: u64,
}

impl<K: std::hash::Hash + Eq, V: Clone> Generations<K, V> {
    fn new(max: usize) -> Generations<K, V> {
        Generations {
            max,
            map: Default::default(),
            old: Default::default(),
            retired: None,
            gen: 0,
        }
    }

    fn get<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        if let Some(v) = self.map.get(key) {
            return Some(v.clone());
        }
        let (k, v) = self.old.remove_entry(key)?;
        self.insert(k, v.clone());
        Some(v)
    }

    fn contains(&self, key: &K) -> bool {
        self.map.contains_key(key) || self.old.contains_key(key)
    }

    fn insert(&mut self, key: K, v: V) {
        if self.map.len() >= self.max / 2 {
            let full = std::mem::take(&mut self.map);
            self.retired = Some(std::mem::replace(&mut self.old, full));
        }
        self.map.insert(key, v);
    }
}

/// An inode record as stored, shared between the cache and its readers: one
/// allocation per record, so a lookup in a cache of millions (its key inline in the
/// map's slot) reads no key or vector header elsewhere in memory.
pub type InodeBytes = Arc<[u8]>;

/// An inode record's key: its FID's bytes (`Fid::to_bytes`). Keys of any other length
/// are read from the engine but never cached.
pub type InodeKey = [u8; 16];

/// Records kept at most unless set otherwise (`mdt.*.inode_cache_max`): about 180
/// bytes each with the key and the map's slot (1 M records of empty files took 178 MB
/// of the MDS's memory), so about 360 MB when full. A
/// tree walk reads each inode two or three times (du, then a stat walk), and a cache
/// that holds a million files' inodes answers the later reads without RocksDB: with
/// a quarter of that, the MDT spent 1.5× the CPU on a walk of 1 M files.
pub const INODE_CACHE_MAX: usize = 1 << 21;
/// The smallest `mdt.*.inode_cache_max`.
pub const INODE_CACHE_MIN: usize = 1024;

/// What [`MdtStore::inode_cache_stats`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InodeCacheStats {
    /// Records held.
    pub entries: usize,
    /// Reads answered from the cache.
    pub hits: u64,
    /// Reads that went to the engine.
    pub misses: u64,
    /// New FIDs' checks answered by their sequence's oid bound, with no read.
    pub unused_by_bound: u64,
}

/// Directory entries read or written recently, kept equal to the engine as the inode
/// cache is (`gen`, updated by every batch that writes an entry), absent names
/// included: a modification looks its name up two or three times (to choose its locks,
/// to check them once held, then to run), and a create looks up a name that does not
/// exist yet, a search of the memtable and of every file's filter.
type DirentCache = Generations<Box<[u8]>, Option<Box<[u8]>>>;

/// Entries the dirent cache keeps at most: half in each generation, about 100 bytes
/// each with a short name (26 MB when full). Lookups by name are the changes' own
/// (a walk reads pages, not names), so a few hundred thousand recent names serve them.
pub const DIRENT_CACHE_MAX: usize = 1 << 18;

struct CommitState {
    requested: bool,
    /// Parked waiters: (what they wait for, callback), answered by the commit thread.
    waiters: Vec<(Wanted, CommitWaiter)>,
}

/// What a sync waits for: the transno applied last, and the count of untracked
/// writes made, when it was asked for.
type Wanted = (u64, u64);

/// The MDT's transactional store.
pub struct MdtStore {
    engine: Arc<dyn Engine>,
    apply_lock: Mutex<()>,
    last_transno: AtomicU64,
    /// Highest transno in `LAST_TRANSNO` on disk (or in the WAL): below
    /// `last_transno` after changes that wrote nothing, until the next commit.
    last_written: AtomicU64,
    last_committed: AtomicU64,
    /// Writes made outside any transno ([`MdtStore::apply_untracked`]: access times,
    /// failed changes' reply records, …), and how many of them the last sync covered:
    /// a SYNC waits for those too, or a power cut after it could still lose them.
    untracked: AtomicU64,
    untracked_synced: AtomicU64,
    /// Reply records of changes that wrote nothing, by `reply_key`: a later record
    /// on disk under the same key replaces one here.
    volatile: Mutex<HashMap<Vec<u8>, ReplyRecord>>,
    stopped: AtomicBool,
    interval_ms: AtomicU64,
    commit: Mutex<CommitState>,
    commit_cv: Condvar,
    committed_cv: Condvar,
    on_stop: Mutex<Option<StopHook>>,
    inodes: Mutex<InodeCache>,
    dirents: Mutex<DirentCache>,
}

impl MdtStore {
    /// Opens the store over `engine`. What the engine holds after a restart is what
    /// was committed (or written and not lost), so it all counts as committed.
    pub fn open(engine: Arc<dyn Engine>) -> Result<Arc<MdtStore>, StoreError> {
        let last = last_transno_on_disk(&*engine)?;
        engine.sync()?;
        Ok(Arc::new(MdtStore {
            engine,
            apply_lock: Mutex::new(()),
            last_transno: AtomicU64::new(last),
            last_written: AtomicU64::new(last),
            last_committed: AtomicU64::new(last),
            untracked: AtomicU64::new(0),
            untracked_synced: AtomicU64::new(0),
            volatile: Mutex::new(HashMap::new()),
            stopped: AtomicBool::new(false),
            interval_ms: AtomicU64::new(100),
            commit: Mutex::new(CommitState {
                requested: false,
                waiters: Vec::new(),
            }),
            commit_cv: Condvar::new(),
            committed_cv: Condvar::new(),
            on_stop: Mutex::new(None),
            inodes: Mutex::new(InodeCache::default()),
            dirents: Mutex::new(DirentCache::new(DIRENT_CACHE_MAX)),
        }))
    }

    /// The engine, for reads.
    pub fn engine(&self) -> &dyn Engine {
        &*self.engine
    }

    /// Called once if the store stops after a failed write or sync.
    pub fn set_on_stop(&self, f: StopHook) {
        *self.on_stop.lock() = Some(f);
    }

    /// Sets `commit_interval_ms`.
    pub fn set_commit_interval_ms(&self, ms: u64) {
        self.interval_ms.store(ms.max(1), Ordering::Relaxed);
    }

    /// `commit_interval_ms`.
    pub fn commit_interval_ms(&self) -> u64 {
        self.interval_ms.load(Ordering::Relaxed)
    }

    /// Highest transno assigned.
    pub fn last_transno(&self) -> u64 {
        self.last_transno.load(Ordering::Acquire)
    }

    /// Highest transno known durable.
    pub fn last_committed(&self) -> u64 {
        self.last_committed.load(Ordering::Acquire)
    }

    /// True once a write or sync has failed.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    fn stop(&self, e: &StoreError) {
        if !self.stopped.swap(true, Ordering::AcqRel) {
            error!("store failure, stopping target: {e}");
            if let Some(f) = self.on_stop.lock().as_ref() {
                f(e);
            }
        }
        let waiters = std::mem::take(&mut self.commit.lock().waiters);
        for (_, w) in waiters {
            w(Err(StoreError::Stopped));
        }
        self.committed_cv.notify_all();
    }

    /// Hands every batch written so far to the OS in one system call (the WAL is
    /// buffered in memory until then). Servers call it once per round of requests,
    /// before the round's replies leave, so a reply never describes a change that a
    /// crash of the process alone could lose. A failure stops the target.
    pub fn flush(&self) -> Result<(), StoreError> {
        if self.is_stopped() {
            return Err(StoreError::Stopped);
        }
        self.engine.flush_wal().inspect_err(|e| self.stop(e))
    }

    /// Calls `f` once everything applied before this call is committed: at once if it
    /// is, else from the commit thread (which is asked to commit now). The caller does
    /// not wait: a parked SYNC holds no service thread.
    pub fn when_committed(&self, f: CommitWaiter) {
        let want = self.wanted();
        if self.is_stopped() {
            f(Err(StoreError::Stopped));
            return;
        }
        if self.covers(want) {
            f(Ok(self.last_committed()));
            return;
        }
        let mut st = self.commit.lock();
        st.waiters.push((want, f));
        st.requested = true;
        self.commit_cv.notify_one();
    }

    /// Applies `batch` atomically with a reply record for `reply` (if any), assigning
    /// the next transno. Returns the transno. Nothing is synced here.
    pub fn apply(
        &self,
        batch: Batch,
        reply: Option<(ReplySlot, i32, Vec<u8>)>,
    ) -> Result<u64, StoreError> {
        self.apply_inner(batch, reply, false)
    }

    /// Assigns the next transno to a change that wrote nothing, keeping its reply
    /// record in memory only (see the module's note). Only for changes whose running
    /// again after a restart is harmless (a read-only open, a close that changed
    /// nothing): a resend that finds no record after a restart runs again.
    pub fn apply_volatile(&self, reply: (ReplySlot, i32, Vec<u8>)) -> Result<u64, StoreError> {
        self.apply_inner(Batch::new(), Some(reply), true)
    }

    fn apply_inner(
        &self,
        mut batch: Batch,
        reply: Option<(ReplySlot, i32, Vec<u8>)>,
        volatile: bool,
    ) -> Result<u64, StoreError> {
        let _g = self.apply_lock.lock();
        if self.is_stopped() {
            return Err(StoreError::Stopped);
        }
        let next = self.last_transno.load(Ordering::Relaxed) + 1;
        // A replay keeps the transno its client was told, so the client's list and the
        // order of changes stay what they were before the restart; gaps (changes no
        // client replayed) stay gaps.
        let transno = match &reply {
            Some((s, _, _)) if s.replay_transno >= next => s.replay_transno,
            _ => next,
        };
        let has_reply = reply.is_some();
        if let Some((slot, status, body)) = reply {
            let rec = ReplyRecord {
                xid: slot.xid,
                transno,
                status,
                body,
            };
            let key = reply_key(slot.slot, slot.tag, slot.sub);
            let mut in_memory = self.volatile.lock();
            if volatile {
                in_memory.insert(key, rec);
            } else {
                in_memory.remove(&key);
                batch.put(Cf::Reply, key, records::encode(&rec));
            }
        }
        // A volatile change (only a reply record, see `apply_volatile`) writes nothing.
        // A reply record on disk carries its transno, so `LAST_TRANSNO` is put only in
        // a batch without one (`last_transno_on_disk`): one memtable insert less per
        // change.
        if !volatile {
            if !has_reply {
                batch.put(Cf::Server, LAST_TRANSNO, transno.to_le_bytes().to_vec());
            }
            self.raise_bounds(&batch);
            if let Err(e) = self.engine.write(&batch) {
                self.stop(&e);
                return Err(e);
            }
            self.written(&batch);
            self.last_written.store(transno, Ordering::Release);
        }
        assert!(
            transno > self.last_transno.load(Ordering::Relaxed),
            "transno never goes backwards"
        );
        self.last_transno.store(transno, Ordering::Release);
        Ok(transno)
    }

    /// Writes `LAST_TRANSNO` if changes that wrote nothing took transnos since the
    /// last write, so that a commit makes them as durable as any other: after a
    /// restart they are at or below the store's last transno.
    fn write_last_transno(&self) -> Result<(), StoreError> {
        let _g = self.apply_lock.lock();
        let t = self.last_transno.load(Ordering::Relaxed);
        if t <= self.last_written.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut b = Batch::new();
        b.put(Cf::Server, LAST_TRANSNO, t.to_le_bytes().to_vec());
        self.engine.write(&b)?;
        self.last_written.store(t, Ordering::Release);
        Ok(())
    }

    /// Adds to `b` the deletion of every reply record of client `slot` on disk, and
    /// forgets those kept in memory: the slot is being freed for another client.
    pub fn delete_replies(&self, b: &mut Batch, slot: u32) -> Result<(), StoreError> {
        let prefix = slot.to_be_bytes();
        self.engine.scan(Cf::Reply, &prefix, &prefix, &mut |k, _| {
            b.delete(Cf::Reply, k.to_vec());
            true
        })?;
        self.volatile.lock().retain(|k, _| !k.starts_with(&prefix));
        Ok(())
    }

    /// The value of dirent `key` (in `Cf::Dirent`), from the cache when it is there; a
    /// value read from the engine is kept only if no entry was written meanwhile, so a
    /// read racing a write never leaves the old value behind.
    pub fn dirent(&self, key: &[u8]) -> Result<Option<Box<[u8]>>, StoreError> {
        let gen = {
            let mut c = self.dirents.lock();
            if let Some(v) = c.get(key) {
                let retired = c.retired.take();
                drop(c);
                drop(retired);
                return Ok(v);
            }
            c.gen
        };
        let v = self.engine.get(Cf::Dirent, key)?.map(Vec::into_boxed_slice);
        let retired = {
            let mut c = self.dirents.lock();
            if c.gen == gen {
                c.insert(key.into(), v.clone());
            }
            c.retired.take()
        };
        drop(retired);
        Ok(v)
    }

    /// The inode record under `key` (in `Cf::Inode`), from the cache when it is there.
    pub fn inode(&self, key: &[u8]) -> Result<Option<InodeBytes>, StoreError> {
        let (found, gen, retired) = {
            let mut c = self.inodes.lock();
            let found = InodeKey::try_from(key).ok().and_then(|k| c.gens.get(&k));
            if found.is_some() {
                c.hits += 1;
            } else {
                c.misses += 1;
            }
            (found, c.gens.gen, c.gens.retired.take())
        };
        drop(retired);
        match found {
            Some(v) => Ok(Some(v)),
            None => self.load_inode(key, gen),
        }
    }

    /// Whether an inode record exists under `key`: a new FID's check. A FID at or
    /// above its sequence's oid bound is known unused without a search of the engine
    /// (see `InodeCache::bounds`); the bound of a sequence not seen since the start
    /// is learned first, with one backward seek.
    pub fn inode_exists(&self, key: &InodeKey) -> Result<bool, StoreError> {
        let Some((seq, need)) = oid_bound(key) else {
            return Ok(self.inode(key)?.is_some());
        };
        let known = {
            let mut c = self.inodes.lock();
            if c.gens.contains(key) {
                c.hits += 1;
                return Ok(true);
            }
            match c.bounds.get(&seq) {
                Some(&b) if need > b => {
                    c.bounded += 1;
                    return Ok(false);
                }
                known => known.is_some(),
            }
        };
        if !known && need > self.learn_bound(seq)? {
            self.inodes.lock().bounded += 1;
            return Ok(false);
        }
        Ok(self.inode(key)?.is_some())
    }

    /// The oid bound of sequence `seq`, from the engine's last record of it if the
    /// cache has none. Under the apply lock: no record can be written between the
    /// search and the bound's keeping.
    fn learn_bound(&self, seq: u64) -> Result<u64, StoreError> {
        let _g = self.apply_lock.lock();
        if let Some(&b) = self.inodes.lock().bounds.get(&seq) {
            return Ok(b);
        }
        let bound = match self.engine.last_key(Cf::Inode, &seq.to_be_bytes())? {
            None => 0,
            // A key too short to hold an oid: no bound known.
            Some(k) => oid_bound(&k).map_or(u64::MAX, |(_, b)| b),
        };
        let mut c = self.inodes.lock();
        if c.bounds.len() >= OID_BOUNDS_MAX {
            c.bounds.clear();
        }
        c.bounds.insert(seq, bound);
        Ok(bound)
    }

    /// Raises the oid bounds for the inode records `batch` puts, before it is written
    /// (under the apply lock).
    fn raise_bounds(&self, batch: &Batch) {
        let mut c = None;
        for op in &batch.ops {
            let Op::Put(Cf::Inode, k, _) = op else {
                continue;
            };
            let Some((seq, need)) = oid_bound(k) else {
                continue;
            };
            let c = c.get_or_insert_with(|| self.inodes.lock());
            if let Some(b) = c.bounds.get_mut(&seq) {
                *b = (*b).max(need);
            }
        }
    }

    /// Reads `key` from the engine and keeps it in the cache if no inode was written
    /// since generation `gen` (the reader's look at the cache).
    fn load_inode(&self, key: &[u8], gen: u64) -> Result<Option<InodeBytes>, StoreError> {
        let Some(v) = self.engine.get(Cf::Inode, key)? else {
            return Ok(None);
        };
        let v = InodeBytes::from(v);
        let retired = {
            let mut c = self.inodes.lock();
            if let (true, Ok(k)) = (c.gens.gen == gen, InodeKey::try_from(key)) {
                c.gens.insert(k, v.clone());
            }
            c.gens.retired.take()
        };
        drop(retired);
        Ok(Some(v))
    }

    /// [`MdtStore::inode`] of many keys (a readdir+ page's children): those the cache
    /// lacks are read from the engine together, in key order (RocksDB's MultiGet
    /// finds each block once for all its keys) and cached unless an inode was written
    /// meanwhile (as `load_inode`: then none of them is). Each key counts a hit or a
    /// miss.
    pub fn inodes(&self, keys: &[InodeKey]) -> Result<Vec<Option<InodeBytes>>, StoreError> {
        let (mut out, gen, retired) = {
            let mut c = self.inodes.lock();
            let out: Vec<Option<InodeBytes>> = keys.iter().map(|k| c.gens.get(k)).collect();
            let hits = out.iter().filter(|v| v.is_some()).count() as u64;
            c.hits += hits;
            c.misses += keys.len() as u64 - hits;
            (out, c.gens.gen, c.gens.retired.take())
        };
        drop(retired);
        let mut missing: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_none()).collect();
        if missing.is_empty() {
            return Ok(out);
        }
        missing.sort_unstable_by_key(|&i| keys[i]);
        let sorted: Vec<InodeKey> = missing.iter().map(|&i| keys[i]).collect();
        let (got, _) = self.read_in(&sorted, gen)?;
        for (i, v) in missing.into_iter().zip(got) {
            out[i] = v;
        }
        Ok(out)
    }

    /// Reads the inode records under `keys` that the cache lacks into it, together
    /// (as [`MdtStore::inodes`] does), without counting hits or misses (cache
    /// warming). Returns how many it read.
    pub fn warm_inodes(&self, keys: &[InodeKey]) -> Result<usize, StoreError> {
        let (mut missing, gen): (Vec<InodeKey>, u64) = {
            let c = self.inodes.lock();
            let m = keys
                .iter()
                .filter(|k| !c.gens.contains(k))
                .copied()
                .collect();
            (m, c.gens.gen)
        };
        if missing.is_empty() {
            return Ok(0);
        }
        missing.sort_unstable();
        let (got, kept) = self.read_in(&missing, gen)?;
        Ok(if kept {
            got.iter().flatten().count()
        } else {
            0
        })
    }

    /// Reads `sorted` keys from the engine together and keeps the records found in
    /// the cache unless an inode was written since generation `gen` (the reader's
    /// look at the cache); returns them, and whether they were kept.
    fn read_in(
        &self,
        sorted: &[InodeKey],
        gen: u64,
    ) -> Result<(Vec<Option<InodeBytes>>, bool), StoreError> {
        let refs: Vec<&[u8]> = sorted.iter().map(|k| k.as_slice()).collect();
        let got: Vec<Option<InodeBytes>> = self
            .engine
            .get_many(Cf::Inode, &refs)?
            .into_iter()
            .map(|v| v.map(InodeBytes::from))
            .collect();
        let (kept, retired) = {
            let mut c = self.inodes.lock();
            let kept = c.gens.gen == gen;
            if kept {
                for (k, v) in sorted.iter().zip(&got) {
                    if let Some(v) = v {
                        c.gens.insert(*k, v.clone());
                    }
                }
            }
            (kept, c.gens.retired.take())
        };
        drop(retired);
        Ok((got, kept))
    }

    /// Records the inode cache keeps at most.
    pub fn inode_cache_max(&self) -> usize {
        self.inodes.lock().gens.max
    }

    /// Sets how many records the inode cache keeps at most (at least
    /// [`INODE_CACHE_MIN`]); a cache with a generation over half of it is emptied.
    pub fn set_inode_cache_max(&self, max: usize) {
        let dropped = {
            let mut c = self.inodes.lock();
            c.gens.max = max.max(INODE_CACHE_MIN);
            // Each generation holds half at most.
            if c.gens.map.len() > c.gens.max / 2 || c.gens.old.len() > c.gens.max / 2 {
                Some((
                    std::mem::take(&mut c.gens.map),
                    std::mem::take(&mut c.gens.old),
                ))
            } else {
                None
            }
        };
        // Freed unlocked, as `retired` is.
        drop(dropped);
    }

    /// The inode cache's size and counters.
    pub fn inode_cache_stats(&self) -> InodeCacheStats {
        let c = self.inodes.lock();
        InodeCacheStats {
            entries: c.gens.map.len() + c.gens.old.len(),
            hits: c.hits,
            misses: c.misses,
            unused_by_bound: c.bounded,
        }
    }

    /// Clears the inode cache's counters.
    pub fn clear_inode_cache_stats(&self) {
        let mut c = self.inodes.lock();
        (c.hits, c.misses, c.bounded) = (0, 0, 0);
    }

    /// Brings the caches up to date with a written batch: every inode it put is kept
    /// (new ones too), and its entries hold the values it left.
    fn written(&self, batch: &Batch) {
        self.dirents_written(batch);
        let mut c = None;
        for op in &batch.ops {
            let (k, v) = match op {
                Op::Put(Cf::Inode, k, v) => (k, Some(v)),
                Op::Delete(Cf::Inode, k) => (k, None),
                _ => continue,
            };
            let c = c.get_or_insert_with(|| {
                let mut g = self.inodes.lock();
                g.gens.gen += 1;
                g
            });
            let Ok(k) = InodeKey::try_from(k.as_slice()) else {
                // Never cached.
                continue;
            };
            // Every inode written is kept, new ones too: a file just made or changed
            // is the one most likely to be read next (mdtest's stat, setattr and
            // unlink after its creates; a job's open after its mkdir).
            c.gens.old.remove(&k);
            match v {
                Some(v) => c.gens.insert(k, InodeBytes::from(v.as_slice())),
                None => {
                    c.gens.map.remove(&k);
                }
            }
        }
        // A generation pushed out is freed after the lock is let go.
        let retired = c.and_then(|mut c| c.gens.retired.take());
        drop(retired);
    }

    /// Brings the cached entries a written batch touched up to date: each holds the
    /// value the batch left (the batch's last word on its key).
    fn dirents_written(&self, batch: &Batch) {
        let mut c = None;
        for op in &batch.ops {
            let (k, v) = match op {
                Op::Put(Cf::Dirent, k, v) => (k, Some(v)),
                Op::Delete(Cf::Dirent, k) => (k, None),
                _ => continue,
            };
            let c = c.get_or_insert_with(|| {
                let mut g = self.dirents.lock();
                g.gen += 1;
                g
            });
            c.old.remove(k.as_slice());
            c.insert(k.as_slice().into(), v.map(|v| v.as_slice().into()));
        }
        let retired = c.and_then(|mut c| c.retired.take());
        drop(retired);
    }

    /// Applies a batch that needs no transno (bookkeeping such as destroy records
    /// being cleared); still stops the target on failure. Returns its number among
    /// the untracked writes, which [`MdtStore::untracked_synced`] reaches once a
    /// sync covers it.
    pub fn apply_untracked(&self, batch: &Batch) -> Result<u64, StoreError> {
        let _g = self.apply_lock.lock();
        if self.is_stopped() {
            return Err(StoreError::Stopped);
        }
        // A reply record rewritten or deleted here may have been the one that carried
        // the highest transno on disk: `LAST_TRANSNO` keeps it, in the same write.
        let touches_replies = batch.ops.iter().any(|op| match op {
            Op::Put(cf, _, _) | Op::Delete(cf, _) => *cf == Cf::Reply,
        });
        self.raise_bounds(batch);
        if touches_replies {
            let mut b = batch.clone();
            let t = self.last_written.load(Ordering::Relaxed);
            b.put(Cf::Server, LAST_TRANSNO, t.to_le_bytes().to_vec());
            self.engine.write(&b).inspect_err(|e| self.stop(e))?;
        } else {
            self.engine.write(batch).inspect_err(|e| self.stop(e))?;
        }
        let n = self.untracked.fetch_add(1, Ordering::AcqRel) + 1;
        self.written(batch);
        Ok(n)
    }

    /// How many untracked writes the syncs so far cover.
    pub fn untracked_synced(&self) -> u64 {
        self.untracked_synced.load(Ordering::Acquire)
    }

    /// Records the outcome of a modification that failed (no transno: nothing
    /// changed), so that its resend gets the same answer.
    pub fn record_reply(&self, slot: ReplySlot, status: i32) -> Result<(), StoreError> {
        let rec = ReplyRecord {
            xid: slot.xid,
            transno: 0,
            status,
            body: Vec::new(),
        };
        let key = reply_key(slot.slot, slot.tag, slot.sub);
        let mut b = Batch::new();
        b.put(Cf::Reply, key.clone(), records::encode(&rec));
        self.apply_untracked(&b)?;
        self.volatile.lock().remove(&key);
        Ok(())
    }

    /// The reply record stored for `(slot, tag)`, or for sub-request `sub - 1` of the
    /// batch sent on it.
    pub fn reply_record(
        &self,
        slot: u32,
        tag: u16,
        sub: u16,
    ) -> Result<Option<ReplyRecord>, StoreError> {
        let key = reply_key(slot, tag, sub);
        if let Some(rec) = self.volatile.lock().get(&key) {
            return Ok(Some(rec.clone()));
        }
        match self.engine.get(Cf::Reply, &key)? {
            Some(b) => Ok(Some(records::decode("reply", &b)?)),
            None => Ok(None),
        }
    }

    /// Commits now and waits until everything applied before the call is durable.
    pub fn sync(&self) -> Result<u64, StoreError> {
        let want = self.wanted();
        let mut st = self.commit.lock();
        loop {
            if self.is_stopped() {
                return Err(StoreError::Stopped);
            }
            if self.covers(want) {
                return Ok(self.last_committed());
            }
            st.requested = true;
            self.commit_cv.notify_one();
            self.committed_cv
                .wait_for(&mut st, Duration::from_millis(100));
        }
    }

    /// What a sync asked for now waits for.
    fn wanted(&self) -> Wanted {
        (self.last_transno(), self.untracked.load(Ordering::Acquire))
    }

    /// Whether the syncs so far cover `want`.
    fn covers(&self, (transno, untracked): Wanted) -> bool {
        self.last_committed() >= transno
            && self.untracked_synced.load(Ordering::Acquire) >= untracked
    }

    /// Runs the commit loop on a new thread until the store stops.
    pub fn start_commit_thread(self: &Arc<Self>) -> std::io::Result<()> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("commit".into())
            .spawn(move || me.commit_loop())?;
        Ok(())
    }

    fn commit_loop(&self) {
        loop {
            {
                let mut st = self.commit.lock();
                if !st.requested {
                    let ms = self.interval_ms.load(Ordering::Relaxed);
                    self.commit_cv.wait_for(&mut st, Duration::from_millis(ms));
                }
                st.requested = false;
            }
            if self.is_stopped() {
                return;
            }
            // Everything written before the sync starts is covered by it.
            let (target, untracked) = self.wanted();
            let new = target > self.last_committed();
            if new || untracked > self.untracked_synced.load(Ordering::Acquire) {
                let r = if new {
                    self.write_last_transno().and_then(|()| self.engine.sync())
                } else {
                    self.engine.sync()
                };
                if let Err(e) = r {
                    self.stop(&e);
                    return;
                }
                if new {
                    self.last_committed.store(target, Ordering::Release);
                }
                self.untracked_synced.store(untracked, Ordering::Release);
            }
            let committed = self.last_committed();
            let ready = {
                let mut st = self.commit.lock();
                self.committed_cv.notify_all();
                let (ready, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut st.waiters)
                    .into_iter()
                    .partition(|(want, _)| self.covers(*want));
                st.waiters = wait;
                if !st.waiters.is_empty() {
                    st.requested = true;
                }
                ready
            };
            for (_, w) in ready {
                w(Ok(committed));
            }
        }
    }
}

#[cfg(test)]
mod tests {

    /// The key of test inode `i`.
    fn key(i: u8) -> InodeKey {
        [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, i, 0, 0, 0, 0]
    }

    /// A FID's bytes, as inode keys are.
    const I: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0, 0];

    /// A store on a real engine under `dir` holding inodes 1, 3 and 7 (record `[i; 4]`),
    /// none of them cached, its counters at zero.
    fn store_with_inodes_1_3_7(dir: &std::path::Path) -> Arc<MdtStore> {
        // Written to the engine before the store opens: on disk, not cached.
        let engine = crate::rocks::RocksEngine::open(dir, 8).expect("open");
        let mut batch = Batch::new();
        for i in [3u8, 1, 7] {
            batch.put(Cf::Inode, key(i).to_vec(), vec![i; 4]);
        }
        engine.write(&batch).expect("write");
        MdtStore::open(Arc::new(engine)).expect("store")
    }

    /// The key of FID `[seq:oid:0]`.
    fn fid_key(seq: u64, oid: u32) -> InodeKey {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&seq.to_be_bytes());
        k[8..12].copy_from_slice(&oid.to_be_bytes());
        k
    }

    #[test]
    fn a_new_fid_above_its_sequences_records_is_known_unused_without_a_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Inodes 1, 3 and 7 of sequence 1 on disk, none cached.
        let store = store_with_inodes_1_3_7(dir.path());
        // The bound is learned from the last record (7): above it, no read.
        assert!(!store.inode_exists(&key(8)).expect("exists"));
        assert!(!store.inode_exists(&key(200)).expect("exists"));
        // At or below it, the engine answers, both ways.
        assert!(store.inode_exists(&key(7)).expect("exists"));
        assert!(store.inode_exists(&key(1)).expect("exists"));
        assert!(!store.inode_exists(&key(5)).expect("exists"));
        let s = store.inode_cache_stats();
        assert_eq!(s.unused_by_bound, 2);
        assert_eq!(s.misses, 3, "the engine read for 7, 1 and 5 only");
        // A sequence with no record: every FID of it unused.
        assert!(!store.inode_exists(&fid_key(9, 1)).expect("exists"));
        // A record written above the bound raises it before it is written: pushed out
        // of the cache, it is still found (by a read, not the bound).
        let mut batch = Batch::new();
        batch.put(Cf::Inode, key(100).to_vec(), vec![100; 4]);
        store.apply(batch, None).expect("write");
        store.inodes.lock().gens = Generations::new(INODE_CACHE_MAX);
        assert!(store.inode_exists(&key(100)).expect("exists"));
        assert!(!store.inode_exists(&key(101)).expect("exists"));
        assert_eq!(store.inodes.lock().bounds.get(&1), Some(&101));
        // Written through the untracked path too.
        let mut batch = Batch::new();
        batch.put(Cf::Inode, fid_key(9, 40).to_vec(), vec![40; 4]);
        store.apply_untracked(&batch).expect("write");
        store.inodes.lock().gens = Generations::new(INODE_CACHE_MAX);
        assert!(store.inode_exists(&fid_key(9, 40)).expect("exists"));
        // After a restart the bounds are learned again from what is on disk.
        drop(store);
        let engine = crate::rocks::RocksEngine::open(dir.path(), 8).expect("open");
        let store = MdtStore::open(Arc::new(engine)).expect("store");
        assert!(store.inode_exists(&key(100)).expect("exists"));
        assert!(store.inode_exists(&fid_key(9, 40)).expect("exists"));
        assert!(!store.inode_exists(&fid_key(9, 41)).expect("exists"));
        assert_eq!(store.inode_cache_stats().unused_by_bound, 1);
    }

    #[test]
    fn an_inode_written_is_cached_and_one_removed_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store_with_inodes_1_3_7(dir.path());
        let mut batch = Batch::new();
        batch.put(Cf::Inode, key(9).to_vec(), vec![9; 4]);
        batch.put(Cf::Inode, key(3).to_vec(), vec![33; 4]);
        store.apply_untracked(&batch).expect("write");
        assert_eq!(
            store.inode(&key(9)).expect("inode").as_deref(),
            Some(&[9u8; 4][..])
        );
        assert_eq!(
            store.inode(&key(3)).expect("inode").as_deref(),
            Some(&[33u8; 4][..])
        );
        let s = store.inode_cache_stats();
        assert_eq!((s.hits, s.misses), (2, 0), "both from the cache");
        let mut batch = Batch::new();
        batch.delete(Cf::Inode, key(9).to_vec());
        store.apply_untracked(&batch).expect("write");
        assert_eq!(store.inode(&key(9)).expect("inode"), None);
        assert_eq!(store.inode_cache_stats().misses, 1, "gone from the cache");
    }

    #[test]
    fn cached_entries_follow_every_write_absent_names_included() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store_with_inodes_1_3_7(dir.path());
        let (a, b) = (b"dir-a".as_slice(), b"dir-b".as_slice());
        let engine = |k: &[u8]| store.engine.get(Cf::Dirent, k).expect("get");
        // Read absent, then created, renamed over, removed: each read (the second
        // from the cache) says what the engine says.
        for step in 0..4 {
            for k in [a, b] {
                let want = engine(k).map(Vec::into_boxed_slice);
                assert_eq!(store.dirent(k).expect("dirent"), want, "step {step}");
                assert_eq!(store.dirent(k).expect("dirent"), want, "step {step}, again");
            }
            let mut batch = Batch::new();
            match step {
                0 => batch.put(Cf::Dirent, a.to_vec(), vec![1; 17]),
                1 => {
                    batch.delete(Cf::Dirent, a.to_vec());
                    batch.put(Cf::Dirent, b.to_vec(), vec![1; 17]);
                }
                2 => {
                    // The batch's last word on a key counts.
                    batch.put(Cf::Dirent, b.to_vec(), vec![2; 17]);
                    batch.delete(Cf::Dirent, b.to_vec());
                }
                _ => break,
            }
            store.apply_untracked(&batch).expect("write");
        }
        assert_eq!(store.dirent(a).expect("dirent"), None);
        assert_eq!(store.dirent(b).expect("dirent"), None);
    }

    #[test]
    fn warming_reads_only_what_is_not_cached_and_counts_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store_with_inodes_1_3_7(dir.path());
        store.inodes(&[key(3)]).expect("inodes");
        store.clear_inode_cache_stats();
        assert_eq!(
            store
                .warm_inodes(&[key(7), key(2), key(1), key(3)])
                .expect("warm"),
            2
        );
        let s = store.inode_cache_stats();
        assert_eq!((s.entries, s.hits, s.misses), (3, 0, 0));
        assert_eq!(
            store.warm_inodes(&[key(1), key(7)]).expect("warm"),
            0,
            "cached"
        );
        store.inodes(&[key(1), key(7)]).expect("inodes");
        assert_eq!(store.inode_cache_stats().hits, 2);
    }

    #[test]
    fn inodes_read_together_answer_as_one_by_one_and_are_cached() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store_with_inodes_1_3_7(dir.path());
        // Unsorted, with a duplicate and a key that is not there.
        let keys = [key(7), key(2), key(1), key(7), key(3)];
        let got = store.inodes(&keys).expect("inodes");
        let want: Vec<Option<Vec<u8>>> = keys
            .iter()
            .map(|k| store.engine.get(Cf::Inode, k).expect("get"))
            .collect();
        let got: Vec<Option<Vec<u8>>> = got.into_iter().map(|v| v.map(|v| v.to_vec())).collect();
        assert_eq!(got, want);
        assert_eq!(got[0], Some(vec![7; 4]));
        assert_eq!(got[1], None);
        // Each key asked for counts (a key asked for twice in one call, twice).
        let s = store.inode_cache_stats();
        assert_eq!((s.hits, s.misses), (0, 5));
        // What was read is cached now.
        store.inodes(&[key(1), key(3)]).expect("inodes");
        assert_eq!(store.inode_cache_stats().hits, 2);
        assert_eq!(
            store.inode(&key(7)).expect("inode").as_deref(),
            Some(&[7u8; 4][..])
        );
        assert_eq!(store.inode_cache_stats().hits, 3, "a hit");
    }

    #[test]
    fn the_inode_cache_keeps_what_was_read_recently_and_stays_bounded() {
        let mut c = Generations::new(INODE_CACHE_MIN);
        let max = c.max;
        let key = |i: usize| {
            let mut k = [0u8; 16];
            k[8..].copy_from_slice(&i.to_be_bytes());
            k
        };
        for i in 0..max / 2 {
            c.insert(key(i), InodeBytes::from(vec![1]));
        }
        // Full: the next record starts a new generation; the old one is still read.
        c.insert(key(usize::MAX), InodeBytes::from(vec![2]));
        assert_eq!(c.map.len(), 1);
        assert!(c.get(&key(0)).is_some(), "found in the old generation");
        assert!(
            c.map.contains_key(&key(0)),
            "and moved back into the new one"
        );
        // Another full generation drops what was not read meanwhile.
        for i in max..max + max / 2 {
            c.insert(key(i), InodeBytes::from(vec![3]));
        }
        assert!(c.get(&key(0)).is_some(), "read recently: kept");
        assert!(
            c.get(&key(1)).is_none(),
            "not read for two generations: gone"
        );
        assert!(c.map.len() + c.old.len() <= max);
        // The generation pushed out waits for the lock holder to free it unlocked.
        assert!(c.retired.take().is_some_and(|r| r.contains_key(&key(1))));
    }

    use super::*;
    use crate::fault::{FailNth, FaultPoint, Faulty};
    use crate::rocks::RocksEngine;

    #[test]
    fn cached_inodes_follow_every_write() {
        let dir = tempfile::tempdir().unwrap();
        let eng = Arc::new(RocksEngine::open(dir.path(), 8).unwrap());
        let s = MdtStore::open(eng.clone()).unwrap();
        let put = |v: &[u8]| {
            let mut b = Batch::new();
            b.put(Cf::Inode, I.to_vec(), v.to_vec());
            b
        };
        assert_eq!(s.inode(I).unwrap(), None);
        s.apply(put(b"one"), None).unwrap();
        assert_eq!(s.inode(I).unwrap().as_deref(), Some(&b"one"[..]));
        assert_eq!(s.inode_cache_stats().entries, 1, "cached");
        // Now cached: a transactional write and an untracked one both show.
        s.apply(put(b"two"), None).unwrap();
        assert_eq!(s.inode(I).unwrap().as_deref(), Some(&b"two"[..]));
        s.apply_untracked(&put(b"three")).unwrap();
        assert_eq!(s.inode(I).unwrap().as_deref(), Some(&b"three"[..]));
        let mut del = Batch::new();
        del.delete(Cf::Inode, I.to_vec());
        s.apply(del, None).unwrap();
        assert_eq!(s.inode(I).unwrap(), None);
        assert_eq!(eng.get(Cf::Inode, I).unwrap(), None);
    }

    #[test]
    fn an_inode_read_that_races_a_write_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let eng = Arc::new(RocksEngine::open(dir.path(), 8).unwrap());
        let s = MdtStore::open(eng.clone()).unwrap();
        let mut b = Batch::new();
        b.put(Cf::Inode, I.to_vec(), b"old".to_vec());
        s.apply(b, None).unwrap();
        // A reader that looked at the cache before a write lands...
        let gen = s.inodes.lock().gens.gen;
        let mut b = Batch::new();
        b.put(Cf::Inode, I.to_vec(), b"new".to_vec());
        s.apply(b, None).unwrap();
        // ...and would now insert what it read: the generation moved, so it may not.
        assert_ne!(s.inodes.lock().gens.gen, gen);
        assert_eq!(s.inode(I).unwrap().as_deref(), Some(&b"new"[..]));
    }

    #[test]
    fn transno_and_reply_record_are_written_together() {
        let dir = tempfile::tempdir().unwrap();
        let eng = Arc::new(RocksEngine::open(dir.path(), 8).unwrap());
        let s = MdtStore::open(eng).unwrap();
        s.start_commit_thread().unwrap();
        let mut b = Batch::new();
        b.put(Cf::Inode, b"k".to_vec(), b"v".to_vec());
        let t = s
            .apply(
                b,
                Some((
                    ReplySlot {
                        slot: 3,
                        tag: 1,
                        xid: 42,
                        replay_transno: 0,
                        sub: 0,
                    },
                    0,
                    vec![9],
                )),
            )
            .unwrap();
        assert_eq!(t, 1);
        let r = s.reply_record(3, 1, 0).unwrap().unwrap();
        assert_eq!((r.xid, r.transno, r.body), (42, 1, vec![9]));
        assert_eq!(s.sync().unwrap(), 1);
        assert_eq!(s.last_committed(), 1);
    }

    /// Fails nothing; counts the syncs it sees.
    #[derive(Default)]
    struct CountSyncs(std::sync::atomic::AtomicUsize);

    impl crate::fault::Injector for CountSyncs {
        fn fail(&self, point: FaultPoint) -> bool {
            if point == FaultPoint::Sync {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
            false
        }
    }

    #[test]
    fn a_sync_covers_untracked_writes_made_since_the_last_commit() {
        let dir = tempfile::tempdir().unwrap();
        let count = Arc::new(CountSyncs::default());
        let eng = Faulty::new(RocksEngine::open(dir.path(), 8).unwrap(), count.clone());
        let s = MdtStore::open(Arc::new(eng)).unwrap();
        s.start_commit_thread().unwrap();
        let syncs = || count.0.load(Ordering::SeqCst);
        let mut b = Batch::new();
        b.put(Cf::Inode, b"k".to_vec(), b"v".to_vec());
        s.apply(b, None).unwrap();
        s.sync().unwrap();
        // Nothing written since: answered without a sync.
        let before = syncs();
        s.sync().unwrap();
        assert_eq!(syncs(), before);
        // An untracked write (no transno) after the commit: the next sync syncs it,
        // a parked one too.
        let mut b = Batch::new();
        b.put(Cf::Inode, b"k".to_vec(), b"atime".to_vec());
        s.apply_untracked(&b).unwrap();
        s.sync().unwrap();
        assert_eq!(syncs(), before + 1, "a sync after an untracked write syncs");
        s.apply_untracked(&b).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        s.when_committed(Box::new(move |r| tx.send(r.is_ok()).unwrap()));
        assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
        assert_eq!(syncs(), before + 2, "so does a parked one");
        let at = syncs();
        s.sync().unwrap();
        assert_eq!(syncs(), at, "and then nothing is left");
    }

    fn reply(slot: u32, tag: u16, xid: u64) -> (ReplySlot, i32, Vec<u8>) {
        let at = ReplySlot {
            slot,
            tag,
            xid,
            replay_transno: 0,
            sub: 0,
        };
        (at, 0, vec![xid as u8])
    }

    #[test]
    fn a_change_that_writes_nothing_gets_a_transno_and_a_record_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let s = MdtStore::open(Arc::new(RocksEngine::open(dir.path(), 8).unwrap())).unwrap();
        s.start_commit_thread().unwrap();
        assert_eq!(s.apply_volatile(reply(3, 1, 7)).unwrap(), 1);
        assert_eq!(s.reply_record(3, 1, 0).unwrap().map(|r| r.xid), Some(7));
        assert_eq!(
            s.engine().get(Cf::Reply, &reply_key(3, 1, 0)).unwrap(),
            None
        );
        // A record on disk under the same tag replaces the one in memory.
        let mut b = Batch::new();
        b.put(Cf::Inode, b"k".to_vec(), b"v".to_vec());
        assert_eq!(s.apply(b, Some(reply(3, 1, 8))).unwrap(), 2);
        assert_eq!(s.reply_record(3, 1, 0).unwrap().map(|r| r.xid), Some(8));
        // The last change wrote nothing: a commit still makes its transno durable.
        assert_eq!(s.apply_volatile(reply(3, 2, 9)).unwrap(), 3);
        assert_eq!(s.sync().unwrap(), 3);
        let last = s.engine().get(Cf::Server, LAST_TRANSNO).unwrap();
        assert_eq!(last, Some(3u64.to_le_bytes().to_vec()));
        // Freeing the slot forgets both kinds.
        let mut b = Batch::new();
        s.delete_replies(&mut b, 3).unwrap();
        s.apply(b, None).unwrap();
        assert_eq!(s.reply_record(3, 2, 0).unwrap(), None);
        assert_eq!(s.reply_record(3, 1, 0).unwrap(), None);
    }

    #[test]
    fn an_uncommitted_change_that_wrote_nothing_is_gone_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = MdtStore::open(Arc::new(RocksEngine::open(dir.path(), 8).unwrap())).unwrap();
            s.apply(Batch::new(), None).unwrap();
            assert_eq!(s.apply_volatile(reply(1, 1, 5)).unwrap(), 2);
        }
        let s = MdtStore::open(Arc::new(RocksEngine::open(dir.path(), 8).unwrap())).unwrap();
        // Its client still holds it for replay, which keeps transno 2.
        assert_eq!(s.last_transno(), 1);
        assert_eq!(s.reply_record(1, 1, 0).unwrap(), None);
    }

    #[test]
    fn the_last_transno_survives_a_restart_from_the_reply_records_alone() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = MdtStore::open(Arc::new(RocksEngine::open(dir.path(), 8).unwrap())).unwrap();
            s.apply(Batch::new(), None).unwrap();
            let mut b = Batch::new();
            b.put(Cf::Inode, b"a".to_vec(), b"1".to_vec());
            assert_eq!(s.apply(b, Some(reply(1, 1, 5))).unwrap(), 2);
            let mut b = Batch::new();
            b.put(Cf::Inode, b"b".to_vec(), b"2".to_vec());
            assert_eq!(s.apply(b, Some(reply(2, 1, 6))).unwrap(), 3);
            // Only the change without a reply record wrote the key.
            let last = s.engine().get(Cf::Server, LAST_TRANSNO).unwrap();
            assert_eq!(last, Some(1u64.to_le_bytes().to_vec()));
        }
        let s = MdtStore::open(Arc::new(RocksEngine::open(dir.path(), 8).unwrap())).unwrap();
        assert_eq!(s.last_transno(), 3);
        assert_eq!(s.last_committed(), 3);
        // A failed change's record (transno 0) replaces the record that held the
        // highest transno: the key keeps it.
        s.record_reply(
            ReplySlot {
                slot: 2,
                tag: 1,
                xid: 7,
                replay_transno: 0,
                sub: 0,
            },
            -2,
        )
        .unwrap();
        drop(s);
        let s = MdtStore::open(Arc::new(RocksEngine::open(dir.path(), 8).unwrap())).unwrap();
        assert_eq!(s.last_transno(), 3);
        let mut b = Batch::new();
        b.put(Cf::Inode, b"c".to_vec(), b"3".to_vec());
        assert_eq!(s.apply(b, Some(reply(1, 2, 8))).unwrap(), 4);
    }

    #[test]
    fn failed_sync_stops_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let eng = RocksEngine::open(dir.path(), 8).unwrap();
        // Sync #1 is the one in open(); fail the first commit.
        let eng = Arc::new(Faulty::new(
            eng,
            Arc::new(FailNth::new(FaultPoint::Sync, 2)),
        ));
        let s = MdtStore::open(eng).unwrap();
        s.start_commit_thread().unwrap();
        s.apply(Batch::new(), None).unwrap();
        assert!(s.sync().is_err());
        assert!(s.is_stopped());
        assert!(matches!(
            s.apply(Batch::new(), None),
            Err(StoreError::Stopped)
        ));
        assert_eq!(s.last_committed(), 0);
    }

    #[test]
    fn failed_write_stops_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let eng = RocksEngine::open(dir.path(), 8).unwrap();
        let eng = Arc::new(Faulty::new(
            eng,
            Arc::new(FailNth::new(FaultPoint::Write, 2)),
        ));
        let s = MdtStore::open(eng).unwrap();
        s.apply(Batch::new(), None).unwrap();
        assert!(s.apply(Batch::new(), None).is_err());
        assert!(matches!(
            s.apply(Batch::new(), None),
            Err(StoreError::Stopped)
        ));
        assert_eq!(s.last_transno(), 1);
    }

    #[test]
    fn restart_keeps_last_transno() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = MdtStore::open(Arc::new(RocksEngine::open(dir.path(), 8).unwrap())).unwrap();
            for _ in 0..5 {
                s.apply(Batch::new(), None).unwrap();
            }
        }
        let s = MdtStore::open(Arc::new(RocksEngine::open(dir.path(), 8).unwrap())).unwrap();
        assert_eq!(s.last_transno(), 5);
        assert_eq!(s.apply(Batch::new(), None).unwrap(), 6);
    }
}
