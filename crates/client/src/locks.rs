//! The client's side of metadata locks: the callback channel (a second connection the
//! client opens to its MDT, on which the MDT sends blocking callbacks, so the client
//! needs no listening port), the locks it holds, and their cancels.
//!
//! A client caches what a lock covers only while the channel is up: a client that
//! cannot be called back must not trust its cache. Losing the channel, or an eviction
//! (an empty callback), drops every lock.

use crate::Client;
use foldhash::{HashMap, HashSet};
use lode_base::perm::{may_access, MAY_EXEC};
use lode_base::{Cred, Errno, Fid};
use lode_proto::frame::{FLAG_CALLBACK, FLAG_REPLY};
use lode_proto::{
    DirEntry, Empty, Frame, Header, LdlmCancelReq, LdlmEnqueueReq, MdtBody, Opcode, Reply, Request,
};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tracing::{debug, warn};

/// How often the channel shows the MDT it is alive (its idle timeout is far longer).
const CHANNEL_PING: Duration = Duration::from_secs(60);
/// How long to wait before opening the channel again after losing it.
const CHANNEL_RETRY: Duration = Duration::from_secs(1);
/// Most handles remembered as called back before their grant arrived.
const REVOKED_MAX: usize = 4096;

/// How long a callback waits for the layer above to forget what a lock covered
/// before the cancel goes anyway. The kernel may need a directory's lock to forget a
/// name, and the holder of that lock may be waiting for this very cancel; past this,
/// coherence yields to progress (the forgetting still happens, a moment later).
const INVAL_WAIT: Duration = Duration::from_millis(50);

/// Something a cache above the client (the kernel's, through FUSE) must forget
/// because the lock that kept it true is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inval {
    /// An object's attributes (and a directory's listing).
    Attr {
        /// The object.
        fid: Fid,
        /// It is a directory.
        dir: bool,
    },
    /// A name's binding in a directory.
    Name(Fid, Vec<u8>),
    /// A regular file's cached pages: its attributes lock was called back, which
    /// every open for writing by another client and every truncate do, so its bytes
    /// may be about to change under a reader that holds it open.
    Data(Fid),
    /// Bytes of a regular file the layer above just read and may have cached: no lock
    /// vouched for them (see [`Client::pages_vouched`]), so they are dropped again
    /// once given, and the next read asks again.
    Pages {
        /// The file.
        fid: Fid,
        /// Where the bytes start.
        offset: u64,
        /// How many.
        len: u64,
    },
}

/// Called with what to forget and a `done` to call once it is forgotten.
pub type Invalidator = Arc<dyn Fn(Vec<Inval>, Box<dyn FnOnce() + Send>) + Send + Sync>;

/// Lustre's PR lock mode (wire value).
const MODE_PR: u32 = 4;
/// Lustre's EX lock mode (wire value).
pub(crate) const MODE_EX: u32 = 1;
/// The UPDATE inode bit.
pub(crate) const BIT_UPDATE: u8 = 0x02;
/// The LAYOUT inode bit.
const BIT_LAYOUT: u8 = 0x08;

/// What one held lock covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldLock {
    /// The object, or the directory of a name.
    pub fid: Fid,
    /// 0, or the name's hash.
    pub hash: u64,
    /// Lustre's mode value.
    pub mode: u32,
    /// Inode bits.
    pub bits: u8,
}

/// Most locks the cache keeps by default; past it, some are given back (Lustre's
/// `lru_size`). A readdir+ entry holds two (its name and its attributes), so this
/// keeps a 100,000-entry directory whole, at about 800 bytes of client memory a lock.
const CACHE_LOCKS_DEFAULT: usize = 1 << 18;

/// What one cache lock covers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// An object's attributes.
    Attr(Fid),
    /// A name's binding in a directory.
    Name(Fid, Vec<u8>),
    /// That a caller may search a directory.
    Search(Fid, Cred),
}

impl Key {
    /// The lock that covers this entry, as the MDT granted it.
    fn held(&self) -> HeldLock {
        let (fid, hash, bits) = match self {
            Key::Attr(f) => (*f, 0, 0x02 | 0x10),
            Key::Name(d, n) => (*d, lode_base::hash::name_hash(n).max(1), 0x01),
            Key::Search(d, _) => (*d, 0, 0x10),
        };
        HeldLock {
            fid,
            hash,
            mode: MODE_PR,
            bits,
        }
    }

    /// What the layers above must forget with this entry (`dir`: an attribute entry
    /// is a directory's).
    fn inval(&self, dir: bool) -> Inval {
        match self {
            Key::Attr(fid) => Inval::Attr { fid: *fid, dir },
            Key::Name(d, n) => Inval::Name(*d, n.clone()),
            // A directory's permission bits: the kernel checks them from its copy of
            // the attributes.
            Key::Search(d, _) => Inval::Attr { fid: *d, dir: true },
        }
    }
}

/// What the client knows under locks: attributes and names, each with the lock that
/// keeps it true.
#[derive(Default)]
struct Cache {
    attrs: HashMap<Fid, (MdtBody, u64)>,
    names: NameMap,
    search: HashMap<(Fid, Cred), u64>,
    /// Each lock: what it covers, and when it was last kept (a count of keeps).
    by_lock: HashMap<u64, (Key, u64)>,
    /// Handles with the keep count they were kept at, oldest first: the LRU gives
    /// back the oldest (a walk's statahead keeps the entries it has not reached yet).
    /// An entry whose handle was forgotten, or kept again since (it is further back
    /// too), is skipped when it comes to the front, or dropped by a compaction.
    order: VecDeque<(u64, u64)>,
    keeps: u64,
    /// Every name of a directory whose attributes are cached, for directories this
    /// client made or has followed every change of since: "no such name" is answered
    /// here. Goes with the directory's attributes (their lock covers its contents).
    listings: HashMap<Fid, Listing>,
    /// Listings whose directory's lock went early for this client's own change in it:
    /// with the ctime they were current at, until the change's reply says whether
    /// anything else happened in between (see [`Client::remember_parent`]).
    stash: HashMap<Fid, (i64, Listing)>,
    /// Names in `listings` and `stash` together, at most [`LISTED_NAMES_MAX`].
    listed: usize,
}

/// Names under locks: `(directory, name)` → (the child, the lock). Looked up by
/// [`NameRef`], without copying the name (a cold `ls -l` asks once per entry).
type NameMap = hashbrown::HashMap<(Fid, Vec<u8>), (Fid, u64), foldhash::fast::RandomState>;

/// A key of [`NameMap`] by reference; hashes as the owned key does (the fields in
/// order, the name as a byte slice).
#[derive(Hash)]
struct NameRef<'a>(Fid, &'a [u8]);

impl hashbrown::Equivalent<(Fid, Vec<u8>)> for NameRef<'_> {
    fn equivalent(&self, k: &(Fid, Vec<u8>)) -> bool {
        self.0 == k.0 && self.1 == &k.1[..]
    }
}

/// Most locks the LRU gives back under one taking of the cache's lock, beyond those
/// over its bound; with a page's chunk over it, still within `INVAL_LOG_MAX / 4`.
const LRU_SLICE: usize = 512;
const _: () = assert!(LRU_SLICE + 2 * KEEP_CHUNK + 8 <= INVAL_LOG_MAX / 4);

/// Entries of a readdir+ page kept under one taking of the cache's locks.
const KEEP_CHUNK: usize = 64;

/// The cache entries a reply's `body` brings (with `name`: the name it was found by,
/// in that directory, by that caller), each with its lock.
fn push_keys<'a>(
    out: &mut Vec<(u64, Key, Option<&'a MdtBody>)>,
    body: &'a MdtBody,
    name: Option<(Fid, &[u8], &Cred)>,
) {
    if body.lock != 0 {
        out.push((body.lock, Key::Attr(body.attr.fid), Some(body)));
    }
    if let Some((d, n, cred)) = name {
        if body.name_lock != 0 {
            out.push((body.name_lock, Key::Name(d, n.to_vec()), Some(body)));
        }
        if body.dir_lock != 0 {
            out.push((body.dir_lock, Key::Search(d, cred.clone()), Some(body)));
        }
    }
}

/// Names a listing follows at most; a larger directory is not listed (its lookups of
/// missing names go to the MDT). A million: mdtest makes hundreds of thousands of
/// files in one directory, and a listing costs 10 to 21 bytes a name.
const LISTING_MAX: usize = 1 << 20;

/// Names all of a client's listings follow together at most (about 40 to 90 MB):
/// past it, a listing that grows is dropped, and its directory's lookups of missing
/// names go to the MDT.
const LISTED_NAMES_MAX: usize = 1 << 22;

/// The names of a listed directory, kept as a multiset of their hashes rather than
/// the names themselves: a hash not there is a name not there; a hash there may be
/// another name's (a collision only sends that lookup to the MDT, it never answers
/// "no such name" wrongly). A set of hashes (10 to 21 bytes a name, against 80 or so
/// for the names), and the counts of the rare hashes that several names share.
#[derive(Default)]
struct Listing {
    hashes: HashSet<u64>,
    /// Hashes of two names or more, with how many.
    shared: HashMap<u64, u32>,
    names: usize,
}

impl Listing {
    /// Whether `name` may be in the directory.
    fn may_have(&self, name: &[u8]) -> bool {
        self.hashes.contains(&lode_base::hash::name_hash(name))
    }

    fn add(&mut self, name: &[u8]) {
        let h = lode_base::hash::name_hash(name);
        if !self.hashes.insert(h) {
            *self.shared.entry(h).or_insert(1) += 1;
        }
        self.names += 1;
    }

    /// Takes `name` out; false if the listing did not have it (it no longer follows
    /// the directory).
    #[must_use]
    fn remove(&mut self, name: &[u8]) -> bool {
        let h = lode_base::hash::name_hash(name);
        match self.shared.get_mut(&h) {
            Some(n) if *n > 2 => *n -= 1,
            Some(_) => {
                self.shared.remove(&h);
            }
            None if self.hashes.remove(&h) => {}
            None => return false,
        }
        self.names -= 1;
        true
    }
}

/// A change this client made in a directory, as its listing follows it.
pub(crate) enum DirChange<'a> {
    /// A name was created.
    Add(&'a [u8]),
    /// A name was removed.
    Remove(&'a [u8]),
    /// A name was renamed to another in the same directory, with `renameat2` flags;
    /// for a rename between two directories, each directory's own name as both, with
    /// the flags that say what the directory is left with.
    Rename(&'a [u8], &'a [u8], u32),
}

impl Cache {
    /// Keeps `key` under `handle`, as the newest in the LRU's order; drops stale
    /// entries from the order once they outnumber the live ones.
    fn kept(&mut self, handle: u64, key: Key) {
        self.by_lock.insert(handle, (key, 0));
        self.touch(handle);
    }

    /// Marks the entry `handle` keeps as used now, so the LRU gives back entries in
    /// the order they were last used rather than kept (Lustre moves a lock it
    /// matches to the LRU's tail too).
    fn touch(&mut self, handle: u64) {
        self.keeps += 1;
        let k = self.keeps;
        if let Some((_, at)) = self.by_lock.get_mut(&handle) {
            *at = k;
            self.order.push_back((handle, k));
            self.compact_order();
        }
    }

    /// Keeps `l` as `dir`'s listing, unless that would take the names listed past
    /// [`LISTED_NAMES_MAX`].
    fn put_listing(&mut self, dir: Fid, l: Listing) {
        self.drop_listing(dir);
        if self.listed + l.names <= LISTED_NAMES_MAX {
            self.listed += l.names;
            self.listings.insert(dir, l);
        }
    }

    /// Forgets `dir`'s listing.
    fn drop_listing(&mut self, dir: Fid) {
        if let Some(l) = self.listings.remove(&dir) {
            self.listed -= l.names;
        }
    }

    /// Sets `dir`'s listing aside for a change of this client's in it (its names still
    /// count as listed), with the directory's `ctime`.
    fn stash_listing(&mut self, dir: Fid, ctime: i64) {
        if let Some(l) = self.listings.remove(&dir) {
            if let Some((_, old)) = self.stash.insert(dir, (ctime, l)) {
                self.listed -= old.names;
            }
        }
    }

    /// Takes `dir`'s listing set aside by [`Cache::stash_listing`] out of the count.
    fn unstash_listing(&mut self, dir: Fid) -> Option<(i64, Listing)> {
        let (ctime, l) = self.stash.remove(&dir)?;
        self.listed -= l.names;
        Some((ctime, l))
    }

    /// Drops stale entries from the order once they outnumber the live ones.
    fn compact_order(&mut self) {
        if self.order.len() > 2 * self.by_lock.len() + 1024 {
            let live = &self.by_lock;
            self.order
                .retain(|(h, k)| live.get(h).is_some_and(|(_, at)| at == k));
        }
    }

    /// The `n` oldest handles kept, taken out of the order.
    fn oldest(&mut self, n: usize) -> Vec<u64> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let Some((h, k)) = self.order.pop_front() else {
                break;
            };
            if self.by_lock.get(&h).is_some_and(|(_, at)| *at == k) {
                out.push(h);
            }
        }
        out
    }

    /// Forgets what `handle` covered, saying what the layers above must forget too;
    /// `None` if it covered nothing.
    fn forget_lock(&mut self, handle: u64) -> Option<Inval> {
        // The key is ours now: its parts become the lookup keys and the Inval
        // without copies (an LRU pass forgets tens of thousands at once).
        Some(match self.by_lock.remove(&handle)?.0 {
            // Taken out and put back if another lock keeps it now (rare: a lock
            // replaced leaves `by_lock` then), one probe of the map, not two.
            Key::Attr(fid) => {
                let mut dir = false;
                match self.attrs.remove(&fid) {
                    Some((b, h)) if h == handle => {
                        dir = b.attr.is_dir();
                        self.drop_listing(fid);
                    }
                    Some(other) => {
                        self.attrs.insert(fid, other);
                    }
                    None => {}
                }
                Inval::Attr { fid, dir }
            }
            Key::Name(d, n) => {
                let k = (d, n);
                match self.names.remove_entry(&k) {
                    Some((_, (_, h))) if h == handle => {}
                    Some((key, other)) => {
                        self.names.insert(key, other);
                    }
                    None => {}
                }
                Inval::Name(k.0, k.1)
            }
            Key::Search(d, c) => {
                let k = (d, c);
                if self.search.get(&k) == Some(&handle) {
                    self.search.remove(&k);
                }
                Inval::Attr { fid: d, dir: true }
            }
        })
    }

    /// What the layers above must forget when the whole cache goes: with each file's
    /// attributes, its pages (see [`with_pages`]).
    fn invals(&self) -> Vec<Inval> {
        let mut v: Vec<Inval> = self
            .attrs
            .iter()
            .map(|(f, (b, _))| {
                with_pages(Inval::Attr {
                    fid: *f,
                    dir: b.attr.is_dir(),
                })
            })
            .collect();
        v.extend(self.names.keys().map(|(d, n)| Inval::Name(*d, n.clone())));
        v.extend(
            self.search
                .keys()
                .map(|(d, _)| Inval::Attr { fid: *d, dir: true }),
        );
        v
    }

    /// Forgets an entry; returns its lock.
    fn forget(&mut self, key: &Key) -> Option<u64> {
        let h = match key {
            Key::Attr(f) => {
                self.drop_listing(*f);
                self.attrs.remove(f)?.1
            }
            Key::Name(d, n) => self.names.remove(&NameRef(*d, n))?.1,
            Key::Search(d, c) => self.search.remove(&(*d, c.clone()))?,
        };
        self.by_lock.remove(&h);
        Some(h)
    }
}

/// The layout locks of open handles. A handle names its lock by a token of this
/// client's, never reused: the MDT's lock handles start again after it restarts, and
/// a handle from before must not take a new lock for its own.
#[derive(Default)]
pub(crate) struct LayoutLocks {
    /// Token → the MDT's lock handle.
    by_token: HashMap<u64, u64>,
    /// The MDT's lock handle → token.
    by_lock: HashMap<u64, u64>,
    next: u64,
}

impl LayoutLocks {
    /// Forgets the lock called back (or dropped) as `h`; true if it was one.
    fn called_back(&mut self, h: u64) -> bool {
        match self.by_lock.remove(&h) {
            Some(t) => {
                self.by_token.remove(&t);
                true
            }
            None => false,
        }
    }

    fn clear(&mut self) {
        self.by_token.clear();
        self.by_lock.clear();
    }
}

/// Most keys [`InvalLog`] keeps; an invalidation of more is logged as "everything".
const INVAL_LOG_MAX: usize = 4096;
/// The key that stands for everything.
const INVAL_ALL: u64 = u64::MAX;

/// The keys forgotten at each recent `inval_seq`, oldest first, hashed: a collision
/// only makes an answer look stale, which costs a needless invalidation.
#[derive(Default)]
struct InvalLog {
    entries: VecDeque<(u64, u64)>,
    /// What was logged up to this seq has been dropped from the front: unknown.
    dropped: u64,
}

impl InvalLog {
    fn record(&mut self, seq: u64, what: &[Inval]) {
        if what.is_empty() || what.len() > INVAL_LOG_MAX / 4 {
            self.entries.push_back((seq, INVAL_ALL));
        } else {
            self.entries
                .extend(what.iter().map(|w| (seq, inval_key(w))));
        }
        while self.entries.len() > INVAL_LOG_MAX {
            if let Some((s, _)) = self.entries.pop_front() {
                self.dropped = self.dropped.max(s);
            }
        }
    }

    /// Whether anything logged after `seq` was one of `keys` (or everything).
    fn touched_since(&self, seq: u64, keys: &[u64]) -> bool {
        if seq < self.dropped {
            return true;
        }
        self.entries
            .iter()
            .rev()
            .take_while(|(s, _)| *s > seq)
            .any(|(_, k)| *k == INVAL_ALL || keys.contains(k))
    }
}

/// A file's attributes forgotten with the lock that kept them, unasked (the LRU, a
/// lost callback channel, `lru_size=clear`): its pages go too, as on a callback.
/// That lock vouched for them, and with it gone nobody tells this client of another
/// client's write; a reader holding the file open would go on reading the kernel's
/// pages of before it.
fn with_pages(i: Inval) -> Inval {
    match i {
        Inval::Attr { fid, dir: false } => Inval::Data(fid),
        other => other,
    }
}

/// The log's hash of what an invalidation forgets.
fn inval_key(w: &Inval) -> u64 {
    match w {
        Inval::Attr { fid, .. } | Inval::Data(fid) | Inval::Pages { fid, .. } => attr_key(*fid),
        Inval::Name(d, n) => name_key(*d, n),
    }
}

/// [`inval_key`] of an object's attributes.
fn attr_key(fid: Fid) -> u64 {
    log_key((0u8, fid, &[][..]))
}

/// [`inval_key`] of a name, without owning it.
fn name_key(dir: Fid, name: &[u8]) -> u64 {
    log_key((1u8, dir, name))
}

fn log_key(k: (u8, Fid, &[u8])) -> u64 {
    use std::hash::BuildHasher;
    let k = foldhash::quality::FixedState::with_seed(0x10de).hash_one(k);
    // INVAL_ALL is reserved.
    k.min(INVAL_ALL - 1)
}

/// The locks of one client on its MDT.
#[derive(Default)]
pub(crate) struct Locks {
    cache: Mutex<Cache>,
    /// Locks the cache let go of, to cancel with the next request.
    unused: Mutex<Vec<u64>>,
    /// `lru_size` (0: the default).
    cache_max: std::sync::atomic::AtomicUsize,
    /// Locks held outside the cache (the cache's own are in its `by_lock`, and a
    /// readdir+ page brings two per entry: kept once, not twice).
    held: Mutex<HashMap<u64, HeldLock>>,
    /// Layout locks of open handles (PR LAYOUT): while one is here its handle's
    /// layout is current. Taken after `revoked`, `held` and `cache`.
    pub(crate) layout: Mutex<LayoutLocks>,
    /// Called back before the reply that granted them arrived: not to be recorded.
    /// Whoever takes more than one of `revoked`, `held` and `cache` takes them in
    /// that order.
    revoked: Mutex<HashSet<u64>>,
    /// Blocking callbacks received.
    callbacks: AtomicU64,
    /// The callback channel is registered with the MDT.
    up: AtomicBool,
    /// The channel's task, aborted when the client goes.
    pub(crate) channel_task: Mutex<Option<tokio::task::AbortHandle>>,
    /// The layer above that caches what the locks cover, told what to forget.
    invalidator: Mutex<Option<Invalidator>>,
    /// Bumped whenever cached entries are forgotten for a reason other than this
    /// client's own change (see [`Client::inval_seq`]); moved only under
    /// `inval_log`, so a reader that sees it move finds what moved it in the log.
    inval_seq: AtomicU64,
    /// What each recent move of `inval_seq` forgot (see [`Client::forgotten_since`]).
    inval_log: Mutex<InvalLog>,
    /// Eviction notices received from the MDT.
    evictions: AtomicU64,
    /// File lock waits, by (file, owner): told when the MDT grants or ends them.
    pub(crate) flock_waits: Mutex<HashMap<(Fid, u64), tokio::sync::oneshot::Sender<bool>>>,
    /// The file locks this client holds, by (file, owner), as the MDT holds them:
    /// taken again in recovery if the MDT restarts.
    pub(crate) flock_held: Mutex<crate::flock::HeldFlocks>,
}

impl Locks {
    fn drop_all(&self) {
        self.held.lock().clear();
        self.layout.lock().clear();
        // No grant can reach a wait now: its caller gets EIO.
        self.flock_waits.lock().clear();
        let gone = std::mem::take(&mut *self.cache.lock());
        // Grants still on their way were kept under locks that no longer exist: any
        // answer in flight may be stale.
        self.invalidate_logged(gone.invals(), true, None);
    }

    /// Tells the layer above what to forget (moving `inval_seq`); `done` runs once it
    /// has (at once if there is no such layer).
    fn invalidate(&self, what: Vec<Inval>, done: Option<Box<dyn FnOnce() + Send>>) {
        self.invalidate_logged(what, false, done)
    }

    /// Records `what` (empty: everything) as forgotten for answers in flight
    /// (`Client::forgotten_since`) without telling the layer above.
    fn log_only(&self, what: &[Inval]) {
        let mut log = self.inval_log.lock();
        let seq = self.inval_seq.fetch_add(1, Ordering::AcqRel) + 1;
        log.record(seq, what);
    }

    /// [`Locks::invalidate`]; with `all`, any answer in flight is taken back, whatever
    /// it was about (for losses that cover more than `what` names).
    fn invalidate_logged(
        &self,
        what: Vec<Inval>,
        all: bool,
        done: Option<Box<dyn FnOnce() + Send>>,
    ) {
        self.log_only(if all { &[] } else { &what });
        let f = self.invalidator.lock().clone();
        match f {
            Some(f) if !what.is_empty() => f(what, done.unwrap_or_else(|| Box::new(|| {}))),
            _ => {
                if let Some(d) = done {
                    d()
                }
            }
        }
    }
}

impl Client {
    /// Asks the MDT for a lock on `fid` (or one name of it, `hash` ≠ 0) in Lustre's
    /// `mode` with inode `bits`. `None`: not granted now (something conflicts, or the
    /// callback channel is down), so nothing it would cover may be cached.
    pub async fn lock_enqueue(
        &self,
        fid: Fid,
        hash: u64,
        mode: u32,
        bits: u8,
    ) -> Result<Option<u64>, Errno> {
        let Some(h) = self.enqueue(fid, hash, mode, bits).await? else {
            return Ok(None);
        };
        if self.locks.revoked.lock().remove(&h) {
            // Called back already (the callback overtook this reply); it is cancelled.
            return Ok(None);
        }
        self.locks.held.lock().insert(
            h,
            HeldLock {
                fid,
                hash,
                mode,
                bits,
            },
        );
        Ok(Some(h))
    }

    /// The MDT's answer to LDLM_ENQUEUE: the lock granted, if any (`None` too while
    /// the callback channel is down: a lock nobody can call back is worthless).
    async fn enqueue(
        &self,
        fid: Fid,
        hash: u64,
        mode: u32,
        bits: u8,
    ) -> Result<Option<u64>, Errno> {
        if !self.locks.up.load(Ordering::Acquire) {
            return Ok(None);
        }
        let req = LdlmEnqueueReq {
            fid,
            hash,
            mode,
            bits,
        };
        match self.mdc.call(Request::LdlmEnqueue(req)).await?.reply {
            Reply::LdlmEnqueue(r) => Ok(r.handle),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Records the write-back lock `h` a create was granted (see
    /// [`crate::writeback`]); false if there is none, or it was called back before
    /// this (its cancel went then).
    pub(crate) fn keep_dom_lock(&self, h: u64) -> bool {
        if h == 0 {
            return false;
        }
        let mut revoked = self.locks.revoked.lock();
        if revoked.remove(&h) {
            return false;
        }
        self.wb.hold(h);
        true
    }

    /// Records the layout lock `h` an open was granted; its token for the handle (see
    /// `FileHandle::layout_lock`), 0 if it was called back before this.
    pub(crate) fn keep_layout_lock(&self, h: u64) -> u64 {
        if h == 0 {
            return 0;
        }
        let mut revoked = self.locks.revoked.lock();
        if revoked.remove(&h) {
            return 0;
        }
        let mut l = self.locks.layout.lock();
        l.next += 1;
        let t = l.next;
        l.by_token.insert(t, h);
        l.by_lock.insert(h, t);
        t
    }

    /// Keeps open handle `fh` under the OPEN lock `lock` its open was granted (see
    /// [`crate::opencache`]), unless that lock was called back before this (its
    /// cancel went then) or the file has a kept handle already (the lock goes back).
    pub(crate) fn keep_open(
        &self,
        cred: &Cred,
        fh: &crate::io::FileHandle,
        lock: u64,
        attr_lock: u64,
        data_epoch: u64,
    ) {
        let mut revoked = self.locks.revoked.lock();
        if revoked.remove(&lock) {
            return;
        }
        // Under `revoked`, as a callback looks for it: one that comes after this finds
        // the handle kept.
        let kept = self.opencache.keep(fh, lock, cred, attr_lock, data_epoch);
        drop(revoked);
        if !kept {
            let Some(me) = self.me.upgrade() else { return };
            self.rt.spawn(async move {
                let _ = me.lock_cancel(vec![lock]).await;
            });
        }
    }

    /// True while the layout lock of token `t` is held (not called back).
    pub(crate) fn layout_lock_held(&self, t: u64) -> bool {
        t != 0 && self.locks.layout.lock().by_token.contains_key(&t)
    }

    /// Whether open handle `fh` holds a layout lock now: a swap of the file's layout
    /// (a migration) then calls this client back before it.
    pub fn holds_layout_lock(&self, fh: &crate::io::FileHandle) -> bool {
        self.layout_lock_held(fh.layout_lock.load(Ordering::Acquire))
    }

    /// Forgets the layout lock of token `t` (its handle closed); the MDT's handle of
    /// it if it was still held.
    pub(crate) fn forget_layout_lock(&self, t: u64) -> Option<u64> {
        let mut l = self.locks.layout.lock();
        let h = l.by_token.remove(&t)?;
        l.by_lock.remove(&h);
        Some(h)
    }

    /// Asks the MDT for a layout lock on `fid` (a handle whose lock was called back):
    /// its token, `None` if it cannot be had now.
    pub(crate) async fn enqueue_layout_lock(&self, fid: Fid) -> Option<u64> {
        let h = self.enqueue(fid, 0, MODE_PR, BIT_LAYOUT).await.ok()??;
        let t = self.keep_layout_lock(h);
        (t != 0).then_some(t)
    }

    /// Gives locks back.
    pub async fn lock_cancel(&self, handles: Vec<u64>) -> Result<(), Errno> {
        self.unhold(&handles);
        for chunk in handles.chunks(lode_base::limits::LOCKS_PER_RPC_MAX) {
            self.mdc
                .call(Request::LdlmCancel(LdlmCancelReq {
                    handles: chunk.to_vec(),
                }))
                .await?;
        }
        Ok(())
    }

    /// The locks this client holds now.
    pub fn locks_held(&self) -> std::collections::HashMap<u64, HeldLock> {
        let held = self.locks.held.lock();
        let cache = self.locks.cache.lock();
        held.iter()
            .map(|(&h, l)| (h, *l))
            .chain(cache.by_lock.iter().map(|(&h, (k, _))| (h, k.held())))
            .collect()
    }

    /// Eviction notices received from the MDT so far (open handles from before one
    /// are stale).
    pub fn evictions(&self) -> u64 {
        self.locks.evictions.load(Ordering::Acquire)
    }

    /// Blocking callbacks received so far.
    pub fn lock_callbacks(&self) -> u64 {
        self.locks.callbacks.load(Ordering::Relaxed)
    }

    /// Whether the MDT can call this client back now.
    pub fn callback_channel_up(&self) -> bool {
        self.locks.up.load(Ordering::Acquire)
    }

    /// Waits up to `within` for the callback channel (see
    /// [`Client::callback_channel_up`]); false if it is not up by then.
    pub async fn wait_callback_channel(&self, within: Duration) -> bool {
        let until = tokio::time::Instant::now() + within;
        while !self.callback_channel_up() {
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }

    /// Installs the layer above that caches what locks cover (the FUSE mount): it is
    /// told what to forget whenever a lock is called back, given back or lost.
    pub fn set_invalidator(&self, f: Invalidator) {
        *self.locks.invalidator.lock() = Some(f);
    }

    /// A counter that moves whenever cached entries are forgotten for a reason other
    /// than this client's own change. A layer above that hands out what the cache
    /// holds reads it before asking and after answering: if it moved, what it handed
    /// out may already be stale and must be forgotten again.
    pub fn inval_seq(&self) -> u64 {
        self.locks.inval_seq.load(Ordering::Acquire)
    }

    /// Whether, since [`Client::inval_seq`] read `seq`, the layer above was told to
    /// forget `fid`'s attributes or the name `at` (or everything): only then may an
    /// answer about them made meanwhile be stale. Other objects' invalidations leave
    /// it alone, so a busy client's answers are not all taken back.
    pub fn forgotten_since(&self, seq: u64, at: Option<(Fid, &[u8])>, fid: Fid) -> bool {
        if self.inval_seq() == seq {
            return false;
        }
        let attr = attr_key(fid);
        let keys = match at {
            Some((d, n)) => [attr, name_key(d, n)],
            // No name: the attributes' key twice.
            None => [attr, attr],
        };
        self.locks.inval_log.lock().touched_since(seq, &keys)
    }

    /// Whether a name (`Some`) and an object's attributes are known under locks now:
    /// only then may a layer above keep them beyond its short timeouts. Attributes
    /// whose size comes from the OSTs (a glimpse) are never covered.
    pub fn covered(&self, name: Option<(Fid, &[u8])>, fid: Fid) -> (bool, bool) {
        if !self.locks.up.load(Ordering::Acquire) {
            return (false, false);
        }
        let c = self.locks.cache.lock();
        let name_ok =
            name.is_some_and(|(d, n)| c.names.get(&NameRef(d, n)).is_some_and(|(f, _)| *f == fid));
        let attr_ok = c.attrs.get(&fid).is_some_and(|(b, _)| !b.glimpse);
        (name_ok, attr_ok)
    }

    /// Whether this client holds a lock on `fid`'s attributes now (its mode, owner and
    /// ACLs with them), whatever its size needs: what the kernel keeps about its
    /// permissions with no timeout (its ACLs) is current only while this holds.
    pub fn perm_covered(&self, fid: Fid) -> bool {
        self.held_attrs(fid, |_| true)
    }

    /// Whether a file's cached pages are vouched for now: this client holds its
    /// attributes lock, granted while nobody held the file open for writing (every
    /// open for writing calls such a lock back first). Bytes read without that may
    /// change under a reader that holds the file open, with nothing to tell it (there
    /// are no extent locks), so the layer above keeps them only as long as one read
    /// takes. Checked before a read, with [`Client::forgotten_since`] after it.
    pub fn pages_vouched(&self, fid: Fid) -> bool {
        self.held_attrs(fid, |b| !b.written)
    }

    /// [`Client::covered`]'s attributes half and [`Client::pages_vouched`] at once: the
    /// attributes lock held on `fid` keeps the kernel's size current (no glimpse
    /// needed) and vouches for its pages (granted while no other client had the file
    /// open for writing: else a reader holding it open would keep reading them after
    /// that client's next write, which nothing tells it of).
    pub fn keeps_pages(&self, fid: Fid) -> bool {
        self.exact_size(fid).is_some()
    }

    /// `fid`'s size, where [`Client::keeps_pages`] holds: the MDT's size kept under a
    /// lock that any writer's open calls back first, with no write by this client
    /// since (its first write makes the copy glimpse). A read that an object ended
    /// early learns the file's end from it without asking the OSTs.
    pub(crate) fn exact_size(&self, fid: Fid) -> Option<u64> {
        self.held_attrs_with(fid, |b| (!b.glimpse && !b.written).then_some(b.attr.size))
    }

    /// Whether attributes of `fid` are kept under a lock (the callback channel up)
    /// and the copy kept passes `ok`.
    fn held_attrs(&self, fid: Fid, ok: impl FnOnce(&MdtBody) -> bool) -> bool {
        self.held_attrs_with(fid, |b| ok(b).then_some(())).is_some()
    }

    /// What `f` takes from the attributes of `fid` kept under a lock (the callback
    /// channel up), if any are.
    fn held_attrs_with<T>(&self, fid: Fid, f: impl FnOnce(&MdtBody) -> Option<T>) -> Option<T> {
        if !self.locks.up.load(Ordering::Acquire) {
            return None;
        }
        let c = self.locks.cache.lock();
        c.attrs.get(&fid).and_then(|(b, _)| f(b))
    }

    /// The MDT's size of `fid` is exact again (a close took back its "data on OSTs"
    /// mark): cached attributes need no glimpse. Safe without a lock change: a copy
    /// that still glimpses only asks the OSTs for what the MDT has.
    /// Applies only to the copy kept under lock `handle` (taken before the close was
    /// sent): a copy fetched meanwhile may already know of a newer writer.
    /// `attr`: the attributes as the MDT had them at the close, replacing the copy's
    /// (which may predate this client's own writes).
    pub(crate) fn size_exact_with(&self, fid: Fid, handle: u64, attr: Option<lode_base::Attr>) {
        if let Some((b, h)) = self.locks.cache.lock().attrs.get_mut(&fid) {
            if *h == handle {
                b.glimpse = false;
                // The close that made the size exact was the last writer's: the next
                // open for writing calls this lock back.
                b.written = false;
                if let Some(a) = attr.filter(|a| a.fid == fid) {
                    // A read here since the close left moved the access time in this
                    // copy (`cache_atime`) ahead of the MDT's, which only has it once
                    // that time rides ahead of a later request.
                    let atime = b.attr.atime.max(a.atime);
                    b.attr = a;
                    b.attr.atime = atime;
                }
            }
        }
    }

    /// The handle that made `fid` closes ahead as its only writer (see
    /// `Client::close_ahead`): `a` (what the answers to its writes left: its
    /// DOM_WRITEs' for a file all on the MDT, `on_osts` false; its OST writes' for a
    /// file all on OSTs) is the file's size, blocks and mtime now, for the copy kept
    /// under `lock`, the attributes lock its create was granted (while nobody else
    /// could write the file). Any change by another client since (an open for
    /// writing, a setattr, a layout change) would have called that lock back; this
    /// client's own other writers, setattrs and fallocates ended what `a` came from.
    /// The copy needs no glimpse from now on (the MDT keeps the same as lazy size,
    /// or, if a crash loses that, glimpses the same). False, changing nothing,
    /// without such a copy.
    pub(crate) fn maker_closed_exact(
        &self,
        fid: Fid,
        lock: u64,
        a: &lode_proto::CloseAttrs,
        on_osts: bool,
    ) -> bool {
        if !self.locks.up.load(Ordering::Acquire) {
            return false;
        }
        let mut c = self.locks.cache.lock();
        match c.attrs.get_mut(&fid) {
            Some((b, h))
                if *h == lock
                    && !b.written
                    && b.attr.fid == fid
                    && b.layout
                        .as_ref()
                        .is_some_and(|l| l.has_objects() == on_osts) =>
            {
                b.glimpse = false;
                b.attr.size = a.size;
                b.attr.blocks = a.blocks;
                b.attr.mtime = a.mtime;
                b.attr.ctime = b.attr.ctime.max(a.mtime);
                true
            }
            _ => false,
        }
    }

    /// This client wrote `fid`'s data: a cached copy that took its size as exact (the
    /// creator's) glimpses from now on.
    pub(crate) fn data_written(&self, fid: Fid) {
        let was_exact = match self.locks.cache.lock().attrs.get_mut(&fid) {
            Some((b, _)) if !b.glimpse && b.layout.is_some() => {
                b.glimpse = true;
                true
            }
            _ => false,
        };
        if was_exact {
            // The layer above may keep the size as exact too (the kernel, for as long
            // as the lock is held): from now on it must ask, or another client's
            // writes would go unseen (an O_APPEND here would write at a stale end).
            // It is not told: the write is its own, and its write path marks the
            // size and times stale itself (FUSE's `fuse_write_update_attr`, and a
            // getattr answered before the write is dropped by the kernel's attribute
            // version). Logged, for an answer in flight that took the copy as exact
            // (`Client::forgotten_since`). Telling it cost a notification, a thread
            // wake-up and 12 µs of the mount's CPU per file written.
            self.locks.log_only(&[Inval::Attr { fid, dir: false }]);
        }
    }

    /// The object `name` in `parent` is, if a lock keeps the name cached.
    pub(crate) fn cached_child(&self, parent: Fid, name: &[u8]) -> Option<Fid> {
        self.locks
            .cache
            .lock()
            .names
            .get(&NameRef(parent, name))
            .map(|(f, _)| *f)
    }

    /// Gives `lock` back with the next request (early lock cancel).
    pub(crate) fn give_back(&self, lock: u64) {
        if lock != 0 {
            self.locks.unused.lock().push(lock);
        }
    }

    /// The lock the cached attributes of `fid` are kept under (0: none). An MDT life
    /// grants a handle once: the same handle later, with nothing of `fid` forgotten
    /// in between (`forgotten_since`), means it was held throughout.
    pub fn attr_lock(&self, fid: Fid) -> u64 {
        self.locks
            .cache
            .lock()
            .attrs
            .get(&fid)
            .map_or(0, |(_, h)| *h)
    }

    /// What `f` reads of the attributes of `fid` held under a lock, if they are.
    pub(crate) fn cached<T>(&self, fid: Fid, f: impl FnOnce(&MdtBody) -> T) -> Option<T> {
        if !self.locks.up.load(Ordering::Acquire) {
            return None;
        }
        self.locks.cache.lock().attrs.get(&fid).map(|(b, _)| f(b))
    }

    /// The inode flags (`chattr`) of `fid` as held under a lock, if they are.
    pub(crate) fn cached_iflags(&self, fid: Fid) -> Option<u32> {
        self.cached(fid, |b| b.attr.flags)
    }

    /// The mode of `fid` as held under a lock, if it is.
    pub fn cached_mode(&self, fid: Fid) -> Option<u32> {
        self.cached(fid, |b| b.attr.mode)
    }

    /// A directory's mtime and ctime as held under a lock, if they are: a listing read
    /// when they were these is still the directory's (every change of its entries
    /// moves them, and one by another client first takes the lock back).
    pub fn cached_dir_times(&self, fid: Fid) -> Option<(i64, i64)> {
        self.cached(fid, |b| (b.attr.mtime, b.attr.ctime))
    }

    /// The access, modification and change times of `fid` held under a lock, if they
    /// are.
    pub(crate) fn cached_times(&self, fid: Fid) -> Option<(i64, i64, i64)> {
        self.cached(fid, |b| (b.attr.atime, b.attr.mtime, b.attr.ctime))
    }

    /// A read through this client moved the access time of `fid` to `t`: so its
    /// attributes held under a lock say (the lock covers this client's own changes).
    pub(crate) fn cache_atime(&self, fid: Fid, t: i64) {
        if !self.locks.up.load(Ordering::Acquire) {
            return;
        }
        if let Some((b, _)) = self.locks.cache.lock().attrs.get_mut(&fid) {
            b.attr.atime = b.attr.atime.max(t);
        }
    }

    /// Attributes known under a lock, if any (no RPC).
    pub(crate) fn cached_attrs(&self, fid: Fid) -> Option<MdtBody> {
        self.cached(fid, MdtBody::clone)
    }

    /// A lookup answered from the cache: the name's binding, the child's attributes and
    /// the directory's permission bits all under locks, and the caller may search the
    /// directory. `None`: ask the MDT.
    pub(crate) fn cached_lookup(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
    ) -> Option<Result<MdtBody, Errno>> {
        // `.` and `..` are in no listing nor name cache (a directory's own and its
        // parent's entries): the MDT answers them.
        if !self.locks.up.load(Ordering::Acquire) || name == b"." || name == b".." {
            return None;
        }
        let mut c = self.locks.cache.lock();
        let (may_search, dir_lock) = match c.attrs.get(&parent) {
            // Who an ACL lets search is the MDT's to say, where the ACL decides: what
            // it said under the directory's lock.
            Some((dir, h)) if dir.acl && lode_base::acl::consulted(&dir.attr, cred) => {
                (c.search.contains_key(&(parent, cred.clone())), Some(*h))
            }
            Some((dir, h)) => (may_access(&dir.attr, cred, MAY_EXEC), Some(*h)),
            None => (c.search.contains_key(&(parent, cred.clone())), None),
        };
        // A directory looked in stays, and its listing with it: a walk of more
        // entries than the LRU holds would otherwise push it out, and every create
        // in it after would cost a LOOKUP.
        if let Some(h) = dir_lock {
            c.touch(h);
        }
        if !may_search {
            return None;
        }
        match c.names.get(&NameRef(parent, name)) {
            Some((child, _)) => c.attrs.get(child).map(|(b, _)| Ok(b.clone())),
            // Known absent: the directory is listed here, under its lock.
            None if c.listings.get(&parent).is_some_and(|l| !l.may_have(name)) => {
                Some(Err(Errno::ENOENT))
            }
            None => None,
        }
    }

    /// After this client's mkdir: the new directory is empty, and if its attributes are
    /// cached (under its lock), lookups in it need not leave the client until someone
    /// else changes it.
    /// `lock`: the lock the mkdir's reply kept its attributes under; a listing is
    /// kept only while that very lock holds them (one granted later, after another
    /// client may have made names in it, would not vouch for the directory empty).
    pub(crate) fn remember_new_dir(&self, dir: Fid, lock: u64) {
        let mut c = self.locks.cache.lock();
        if lock != 0 && c.attrs.get(&dir).is_some_and(|(_, h)| *h == lock) {
            c.put_listing(dir, Listing::default());
        }
    }

    /// A directory's attributes handed back after this client's `change` in it, with
    /// the lock that keeps them. Its listing, if the client had one, follows the change
    /// when nothing else happened to the directory in between (its ctime before the
    /// change is the one the listing was current at); otherwise it is dropped.
    pub(crate) fn remember_parent(
        &self,
        p: Option<&lode_proto::ParentAttrs>,
        dir: Fid,
        cred: &Cred,
        change: DirChange<'_>,
    ) {
        let prior = self.locks.cache.lock().unstash_listing(dir);
        let Some(p) = p else { return };
        if p.body.lock == 0 {
            if p.body.dir_lock != 0 {
                // Only the directory's permissions (others are busy in it).
                self.remember_search(dir, cred, p.body.dir_lock);
            }
            return;
        }
        self.remember(&p.body, None);
        let Some((ctime, mut listing)) = prior else {
            return;
        };
        if ctime != p.pre_ctime {
            return;
        }
        match change {
            DirChange::Add(n) => listing.add(n),
            DirChange::Remove(n) => {
                if !listing.remove(n) {
                    return;
                }
            }
            // Both names stay.
            DirChange::Rename(_, _, flags) if flags & libc::RENAME_EXCHANGE != 0 => {}
            // A whiteout takes the old name's place: not a listing kept here.
            DirChange::Rename(_, _, flags) if flags & libc::RENAME_WHITEOUT != 0 => return,
            DirChange::Rename(from, to, _) => {
                if !listing.remove(from) {
                    return;
                }
                listing.add(to);
            }
        }
        let mut c = self.locks.cache.lock();
        // Only if the lock just handed back is still the one kept (not already called
        // back) and the listing stays small enough.
        if c.attrs.get(&dir).is_some_and(|(_, h)| *h == p.body.lock) && listing.names <= LISTING_MAX
        {
            c.put_listing(dir, listing);
        }
    }

    /// After a rename of ours: the kernel keeps the entry it moved under the new name,
    /// with the old name's timeout. A lock on the new name the reply brought (`moved`)
    /// vouches for it; without one, or if it was called back already, the kernel
    /// must forget the name.
    pub(crate) fn remember_moved(
        &self,
        moved: Option<&MdtBody>,
        dir: Fid,
        name: &[u8],
        cred: &Cred,
    ) {
        if let Some(b) = moved {
            self.remember(b, Some((dir, name, cred)));
        }
        let held = moved.is_some_and(|b| {
            b.name_lock != 0
                && self
                    .locks
                    .cache
                    .lock()
                    .names
                    .get(&NameRef(dir, name))
                    .is_some_and(|(_, h)| *h == b.name_lock)
        });
        if !held {
            self.locks
                .invalidate(vec![Inval::Name(dir, name.to_vec())], None);
        }
    }

    /// Keeps a lock on a directory's permissions: `cred` may search it while held.
    fn remember_search(&self, dir: Fid, cred: &Cred, h: u64) {
        self.keep(vec![(h, Key::Search(dir, cred.clone()), None)]);
    }

    /// Keeps what a reply granted locks for: the attributes (`body.lock`) and, for a
    /// lookup, the name (`body.name_lock`).
    pub(crate) fn remember(&self, body: &MdtBody, name: Option<(Fid, &[u8], &Cred)>) {
        let mut entries = Vec::with_capacity(3);
        push_keys(&mut entries, body, name);
        self.keep(entries);
    }

    /// [`Client::remember`] of each entry of a readdir+ page of directory `dir` that
    /// came with locks. The cache's locks are taken once per [`KEEP_CHUNK`] entries: a
    /// lookup answered from the cache meanwhile waits for one chunk at most.
    pub(crate) fn remember_page(&self, dir: Fid, cred: &Cred, page: &[DirEntry]) {
        for chunk in page.chunks(KEEP_CHUNK) {
            let mut entries = Vec::with_capacity(2 * chunk.len());
            for e in chunk {
                if let Some(b) = e.body.as_ref().filter(|b| b.lock != 0 || b.name_lock != 0) {
                    push_keys(&mut entries, b, Some((dir, &e.name, cred)));
                }
            }
            self.keep(entries);
        }
    }

    /// Keeps cache entries, each under the lock granted for it (0: none): attributes
    /// and a name take their body (the attributes, or the named child's).
    fn keep(&self, entries: Vec<(u64, Key, Option<&MdtBody>)>) {
        let mut stale = Vec::new();
        let mut invals = Vec::new();
        {
            let mut revoked = self.locks.revoked.lock();
            let mut c = self.locks.cache.lock();
            for (h, key, body) in entries {
                if h == 0 || revoked.remove(&h) {
                    continue;
                }
                let old = match (&key, body) {
                    (Key::Attr(f), Some(b)) => c.attrs.insert(*f, (b.clone(), h)).map(|(_, o)| o),
                    (Key::Name(d, n), Some(b)) => c
                        .names
                        .insert((*d, n.clone()), (b.attr.fid, h))
                        .map(|(_, o)| o),
                    (Key::Search(d, cr), _) => c.search.insert((*d, cr.clone()), h),
                    (Key::Attr(_) | Key::Name(..), None) => continue,
                };
                c.kept(h, key);
                // One lock per entry: the one it replaces goes back.
                if let Some(o) = old.filter(|o| *o != h) {
                    c.by_lock.remove(&o);
                    stale.push(o);
                }
            }
            let max = self.lock_cache_max();
            if c.by_lock.len() > max {
                // Down to a slice below the bound, not an eighth: a walk past the
                // bound gives back a slice every few pages, and the lookups waiting
                // on the cache meanwhile wait for a slice, not for 32,768 forgets.
                // A slice is small enough for the invalidation log to name each key
                // (not "everything", which would take back every answer in flight).
                let n = c.by_lock.len() - max + (max / 8).clamp(1, LRU_SLICE);
                for h in c.oldest(n) {
                    invals.extend(c.forget_lock(h).map(with_pages));
                    stale.push(h);
                }
            }
        }
        if !invals.is_empty() {
            // Given back unasked: nobody will call them back, so the layers above must
            // forget them now.
            self.locks.invalidate(invals, None);
        }
        // Given back with the next request (no extra round trip).
        self.locks.unused.lock().extend(stale);
    }

    /// Early lock cancel: the locks of cached entries a change of ours will make false,
    /// forgotten now and returned to be cancelled just before the change (so the MDT
    /// does not call us back for our own change).
    pub(crate) fn release_for_change(&self, req: &Request) -> (Vec<u64>, Vec<Inval>) {
        let dir = |d: Fid| Key::Attr(d);
        let name = |d: Fid, n: &[u8]| Key::Name(d, n.to_vec());
        let mut keys = match req {
            Request::Create(r) => vec![dir(r.parent), name(r.parent, &r.name)],
            Request::Unlink(r) => vec![dir(r.parent), name(r.parent, &r.name)],
            Request::Rename(r) => vec![
                dir(r.src_parent),
                name(r.src_parent, &r.src_name),
                dir(r.dst_parent),
                name(r.dst_parent, &r.dst_name),
            ],
            Request::Link(r) => vec![dir(r.parent), name(r.parent, &r.name), Key::Attr(r.fid)],
            Request::Setattr(r) => vec![Key::Attr(r.fid)],
            Request::Setxattr(r) => vec![Key::Attr(r.fid)],
            Request::LayoutIntent(r) => vec![Key::Attr(r.fid)],
            Request::Open(r) => {
                if !lode_base::perm::wants_write(r.flags as i32) {
                    return (
                        self.unused_cancels(lode_base::limits::LOCKS_PER_RPC_MAX),
                        Vec::new(),
                    );
                }
                vec![Key::Attr(r.fid)]
            }
            _ => {
                return (
                    self.unused_cancels(lode_base::limits::LOCKS_PER_RPC_MAX),
                    Vec::new(),
                )
            }
        };
        let mut c = self.locks.cache.lock();
        // A create, unlink, link or rename of ours hands the directories back: their
        // listings wait for the reply (see remember_parent).
        let handed_back = match req {
            Request::Create(r) => [Some(r.parent), None],
            Request::Unlink(r) => [Some(r.parent), None],
            Request::Link(r) => [Some(r.parent), None],
            Request::Rename(r) if r.src_parent == r.dst_parent => [Some(r.src_parent), None],
            Request::Rename(r) => [Some(r.src_parent), Some(r.dst_parent)],
            _ => [None, None],
        };
        for parent in handed_back.iter().flatten() {
            let ctime = c.attrs.get(parent).map(|(b, _)| b.attr.ctime);
            if let Some(ctime) = ctime {
                c.stash_listing(*parent, ctime);
            }
        }
        // A change of an object's permissions (chmod, chown, an ACL) ends what its
        // PERM locks allowed.
        if let Request::Setattr(lode_proto::SetattrReq { fid, .. })
        | Request::Setxattr(lode_proto::SetxattrReq { fid, .. }) = req
        {
            let perms: Vec<Key> = c
                .search
                .keys()
                .filter(|(d, _)| d == fid)
                .map(|(d, cr)| Key::Search(*d, cr.clone()))
                .collect();
            keys.extend(perms);
        }
        // The children whose names change: their nlink and ctime move too.
        let children: Vec<Key> = keys
            .iter()
            .filter_map(|k| match k {
                Key::Name(d, n) => c.names.get(&NameRef(*d, n)).map(|(f, _)| Key::Attr(*f)),
                Key::Attr(_) | Key::Search(..) => None,
            })
            .collect();
        keys.extend(children);
        let mut invals = Vec::new();
        let mut handles = Vec::new();
        for k in &keys {
            let dir =
                matches!(k, Key::Attr(f) if c.attrs.get(f).is_some_and(|(b, _)| b.attr.is_dir()));
            if let Some(h) = c.forget(k) {
                handles.push(h);
                invals.push(k.inval(dir));
            }
        }
        drop(c);
        // Locks let go of earlier ride along, as many as fit; the rest wait their turn.
        handles.extend(
            self.unused_cancels(lode_base::limits::LOCKS_PER_RPC_MAX.saturating_sub(handles.len())),
        );
        (handles, invals)
    }

    /// After a change of this client's: the layer above updates itself for a change
    /// that succeeded, but not for one that failed, so what the change's early cancel
    /// forgot (`invals`) is forgotten there too; and a rename leaves the moved entry
    /// under its new name, which no lock of this client covers.
    /// An open is never such an update: the attributes the kernel keeps from before
    /// it must go with their lock, or another client's later change (a truncate)
    /// would go unseen for as long as the kernel liked. Nor is a rename, for the
    /// objects it moves or replaces: the kernel refreshes only their ctime after it
    /// (its permission checks would keep using modes no lock covers any more), and
    /// after an exchange it keeps both names.
    pub(crate) fn after_change(&self, req: &Request, ok: bool, mut invals: Vec<Inval>) {
        // A rename's new name is seen to by `Client::rename`, once it knows whether
        // the reply brought a lock on it; its directories by `remember_parent`.
        match req {
            Request::Open(_) => {}
            _ if !ok => {}
            Request::Rename(r) => invals.retain(|i| match i {
                Inval::Attr { fid, .. } => *fid != r.src_parent && *fid != r.dst_parent,
                Inval::Name(..) => r.flags & libc::RENAME_EXCHANGE != 0,
                Inval::Data(_) | Inval::Pages { .. } => false,
            }),
            _ => invals.clear(),
        }
        if !invals.is_empty() {
            self.locks.invalidate(invals, None);
        }
    }

    /// Forgets that this client holds `handles`.
    fn unhold(&self, handles: &[u64]) {
        let mut held = self.locks.held.lock();
        for h in handles {
            held.remove(h);
        }
    }

    /// The most locks the cache keeps (`lru_size`).
    pub fn lock_cache_max(&self) -> usize {
        match self.locks.cache_max.load(Ordering::Relaxed) {
            0 => CACHE_LOCKS_DEFAULT,
            n => n,
        }
    }

    /// Sets `lru_size`.
    pub fn set_lock_cache_max(&self, n: usize) {
        self.locks.cache_max.store(n, Ordering::Relaxed);
    }

    /// Forgets everything cached and gives its locks back with the next request
    /// (`lru_size=clear`: a cold cache).
    pub fn lock_cache_clear(&self) {
        let gone = std::mem::take(&mut *self.locks.cache.lock());
        self.locks
            .unused
            .lock()
            .extend(gone.by_lock.keys().copied());
        self.locks.invalidate(gone.invals(), None);
    }

    /// Up to `room` of the locks the cache let go of, to cancel with the next request.
    fn unused_cancels(&self, room: usize) -> Vec<u64> {
        let mut unused = self.locks.unused.lock();
        if unused.is_empty() {
            return Vec::new();
        }
        let n = unused.len().min(room);
        unused.drain(..n).collect()
    }

    /// A blocking callback: drop the locks (and what they cover), then cancel them.
    fn on_callback(self: &Arc<Self>, handles: Vec<u64>) {
        self.locks.callbacks.fetch_add(1, Ordering::Relaxed);
        self.mdc.stats().record(Opcode::LdlmBlCallback, 0);
        if handles.is_empty() {
            warn!("evicted by the MDT: every lock and open file of this client is gone");
            self.locks.evictions.fetch_add(1, Ordering::AcqRel);
            self.locks.drop_all();
            self.wb.drop_locks();
            self.open_locks_lost();
            return;
        }
        let mut invals = Vec::new();
        // A lock whose grant is still on its way covers what no cache holds yet: the
        // answer it is for may be in flight, about anything.
        let mut in_flight = false;
        // Kept open handles whose OPEN lock this is, idle: closed before the cancel,
        // so that the unlink waiting for it finds the file closed.
        let mut to_close = Vec::new();
        // Writes kept back under write-back locks called back: on the MDT before the
        // cancel, so the reader waiting for it reads them.
        let mut kept = Vec::new();
        {
            // The lock order: revoked, held, cache.
            let mut revoked = self.locks.revoked.lock();
            let mut held = self.locks.held.lock();
            let mut cache = self.locks.cache.lock();
            let mut layout = self.locks.layout.lock();
            for h in &handles {
                if let Some(w) = self.wb.called_back(*h) {
                    kept.extend(w);
                    continue;
                }
                if let Some(idle) = self.opencache.called_back(*h) {
                    to_close.extend(idle);
                    continue;
                }
                let cached = match cache.forget_lock(*h) {
                    Some(i) => {
                        // The attributes (and ACLs) first: forgetting them never waits,
                        // where dropping pages may wait for a read in flight, and the
                        // cancel may go before that ends.
                        let data = match i {
                            Inval::Attr { fid, dir: false } => Some(Inval::Data(fid)),
                            _ => None,
                        };
                        invals.push(i);
                        invals.extend(data);
                        true
                    }
                    None => false,
                };
                if layout.called_back(*h) {
                    // An open handle's layout changes: nothing above caches it.
                    continue;
                }
                if held.remove(h).is_none() && !cached {
                    in_flight = true;
                    if revoked.len() >= REVOKED_MAX {
                        revoked.clear();
                    }
                    revoked.insert(*h);
                }
            }
        }
        // The layers above forget first, so that the change the MDT is holding back
        // cannot be seen to happen while a stale copy still answers here.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        self.locks.invalidate_logged(
            invals,
            in_flight,
            Some(Box::new(move || {
                let _ = tx.send(());
            })),
        );
        let me = self.clone();
        self.rt.spawn(async move {
            if !to_close.is_empty() {
                let closer = me.clone();
                let closing = me.rt.spawn(async move {
                    for fh in to_close {
                        if let Err(e) = closer.close_on_mdt(&fh).await {
                            debug!(fid = %fh.fid, "closing a kept open handle after a callback: {e}");
                        }
                    }
                });
                // Closed before the cancel, so that the change waiting for it finds the
                // file closed; but not waited for long: the close may need an RPC slot
                // that changes held back by this very cancel occupy (it goes on, and the
                // file is then an orphan for a moment).
                let _ = tokio::time::timeout(INVAL_WAIT, closing).await;
            }
            let _ = tokio::time::timeout(INVAL_WAIT, rx).await;
            for mut w in kept {
                let _ = w.wait_for(|done| *done).await;
            }
            if let Err(e) = me.lock_cancel(handles).await {
                debug!("lock cancel after a callback failed: {e}");
            }
        });
    }
}

/// Keeps the callback channel open for as long as the client lives.
pub(crate) async fn callback_channel(client: Weak<Client>) {
    loop {
        let Some(c) = client.upgrade() else { return };
        let target = c.mdc.target().to_string();
        let (addr, handle) = (c.mdc.addr(), c.mdc.granted().map(|g| g.handle));
        let who = Who {
            key: c.cfg.key.clone(),
            uuid: c.mdc.client_uuid().to_string(),
            target: target.clone(),
        };
        drop(c);
        if let Some(handle) = handle {
            match run_channel(&client, &addr, handle, &who).await {
                Ok(()) => return,
                Err(e) => debug!(%target, "callback channel: {e}"),
            }
        }
        let Some(c) = client.upgrade() else { return };
        if c.locks.up.swap(false, Ordering::AcqRel) {
            warn!(%target, "callback channel lost: every lock dropped");
        }
        c.locks.drop_all();
        c.wb.drop_locks();
        c.open_locks_lost();
        drop(c);
        tokio::time::sleep(CHANNEL_RETRY).await;
    }
}

/// Who the callback channel is for: the key's handshake names the client and target.
struct Who {
    key: Vec<u8>,
    uuid: String,
    target: String,
}

fn frame(opcode: Opcode, handle: u64, xid: u64, auth: Vec<u8>) -> Vec<u8> {
    let header = Header {
        opcode: opcode as u16,
        handle,
        xid,
        ..Default::default()
    };
    let body = match opcode {
        Opcode::Ping => Request::Ping(Empty {}),
        _ => Request::LdlmCallbackChannel(lode_proto::CallbackChannelReq { auth }),
    };
    Frame::encode(&header, &body.encode())
}

/// Registers one connection as the channel and serves it; `Ok` when the client is
/// gone. On a keyed file system the connection does the key's handshake first and is
/// sealed from the registration's reply on, both ways.
async fn run_channel(
    client: &Weak<Client>,
    addr: &str,
    handle: u64,
    who: &Who,
) -> Result<(), String> {
    let mut sock = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let _ = sock.set_nodelay(true);
    let hs = lode_rpc::client_handshake(&mut sock, &who.key, &who.uuid, &who.target, 1)
        .await
        .map_err(|e| format!("handshake failed ({e:?})"))?;
    let (auth, session) = match hs {
        Some((proof, sealer, opener)) => (proof, Some((sealer, opener))),
        None => (Vec::new(), None),
    };
    let (mut sealer, mut opener) = match session {
        Some((s, o)) => (Some(s), Some(o)),
        None => (None, None),
    };
    let (mut rd, mut wr) = sock.into_split();
    wr.write_all(&frame(Opcode::LdlmCallbackChannel, handle, 2, auth))
        .await
        .map_err(|e| e.to_string())?;
    let rest = lode_rpc::read_raw(&mut rd)
        .await
        .map_err(|e| e.to_string())?;
    let rep = lode_rpc::handshake_reply(rest, opener.as_mut())?;
    if rep.header.flags & FLAG_REPLY == 0 || rep.header.status != 0 {
        return Err(format!("refused (status {})", rep.header.status));
    }
    {
        let Some(c) = client.upgrade() else {
            return Ok(());
        };
        c.locks.up.store(true, Ordering::Release);
    }
    // Pings go from their own task: a read is never interrupted half way.
    let pinger = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut xid = 2;
            loop {
                tokio::time::sleep(CHANNEL_PING).await;
                xid += 1;
                let mut f = frame(Opcode::Ping, handle, xid, Vec::new());
                if let Some(s) = sealer.as_mut() {
                    f = s.seal(&f);
                }
                if client.strong_count() == 0 || wr.write_all(&f).await.is_err() {
                    return;
                }
            }
        })
    };
    // The pinger holds the write half: it goes with this future, however that ends.
    let _pinger = AbortOnDrop(pinger);
    serve_channel(client, &mut rd, opener.as_mut()).await
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn serve_channel(
    client: &Weak<Client>,
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    mut opener: Option<&mut lode_rpc::auth::Opener>,
) -> Result<(), String> {
    loop {
        let f = lode_rpc::read_sealed(rd, opener.as_deref_mut())
            .await
            .map_err(|e| e.to_string())?;
        let Some(c) = client.upgrade() else {
            return Ok(());
        };
        if f.header.flags & FLAG_CALLBACK == 0 {
            // A ping's reply.
            continue;
        }
        match Request::decode(f.header.opcode, &f.body) {
            Ok(Request::LdlmBlCallback(r))
                if r.handles.len() <= lode_base::limits::LOCKS_PER_RPC_MAX =>
            {
                c.on_callback(r.handles);
            }
            Ok(Request::FlockGranted(r)) => c.on_flock_granted(r),
            _ => return Err(format!("unexpected callback opcode {}", f.header.opcode)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_and_stashed_listings_count_toward_one_bound() {
        let (a, b) = (Fid::new(0x200000400, 1, 0), Fid::new(0x200000400, 2, 0));
        let mut c = Cache::default();
        let mut l = Listing::default();
        l.add(b"x");
        l.add(b"y");
        c.put_listing(a, l);
        assert_eq!(c.listed, 2);
        c.stash_listing(a, 7);
        assert!(c.listings.is_empty());
        assert_eq!(c.listed, 2, "a stashed listing still counts");
        let (ctime, mut l) = c.unstash_listing(a).expect("stashed");
        assert_eq!((ctime, c.listed), (7, 0));
        l.add(b"z");
        c.put_listing(a, l);
        assert_eq!(c.listed, 3);
        // Past the bound, a listing is not kept; the others stay.
        let big = Listing {
            names: LISTED_NAMES_MAX - 2,
            ..Listing::default()
        };
        c.put_listing(b, big);
        assert!(!c.listings.contains_key(&b));
        assert_eq!(c.listed, 3);
        c.drop_listing(a);
        assert_eq!(c.listed, 0);
    }

    #[test]
    fn a_listing_answers_absent_only_for_names_it_does_not_hold() {
        let mut l = Listing::default();
        assert!(!l.may_have(b"f.0"));
        l.add(b"f.0");
        l.add(b"f.1");
        assert!(l.may_have(b"f.0") && l.may_have(b"f.1") && !l.may_have(b"f.2"));
        // Two names with one hash (the same name stands in for a collision): one
        // removed, the other is still "maybe there".
        l.add(b"f.0");
        l.add(b"f.0");
        for _ in 0..2 {
            assert!(l.remove(b"f.0"));
            assert!(l.may_have(b"f.0"));
        }
        assert!(l.remove(b"f.0"));
        assert!(!l.may_have(b"f.0"));
        assert!(l.shared.is_empty());
        // A name it never had: the listing no longer follows the directory.
        assert!(!l.remove(b"f.9"));
        assert_eq!(l.names, 1);
    }

    #[test]
    fn a_name_is_found_by_reference_as_by_its_owned_key() {
        let mut m = NameMap::default();
        let d = Fid::new(0x200000401, 7, 0);
        m.insert((d, b"file.0001".to_vec()), (Fid::new(0x200000401, 8, 0), 5));
        assert_eq!(m.get(&NameRef(d, b"file.0001")).map(|v| v.1), Some(5));
        assert!(m.get(&NameRef(d, b"file.0002")).is_none());
        assert!(m
            .get(&NameRef(Fid::new(0x200000401, 9, 0), b"file.0001"))
            .is_none());
        assert_eq!(m.remove(&NameRef(d, b"file.0001")).map(|v| v.1), Some(5));
        assert!(m.is_empty());
    }

    fn fid(n: u64) -> Fid {
        Fid::new(0x2_0000_0400, n as u32, 0)
    }

    fn attr(n: u64) -> Inval {
        Inval::Attr {
            fid: fid(n),
            dir: false,
        }
    }

    #[test]
    fn the_log_answers_for_the_keys_forgotten_after_a_seq_only() {
        let mut log = InvalLog::default();
        log.record(1, &[attr(1)]);
        log.record(2, &[attr(2), Inval::Name(fid(9), b"x".to_vec())]);
        let k = |w: &Inval| inval_key(w);
        assert!(log.touched_since(0, &[k(&attr(1))]));
        assert!(!log.touched_since(1, &[k(&attr(1))]));
        assert!(log.touched_since(1, &[k(&attr(2))]));
        assert!(log.touched_since(1, &[k(&Inval::Name(fid(9), b"x".to_vec()))]));
        assert!(!log.touched_since(1, &[k(&Inval::Name(fid(9), b"y".to_vec()))]));
        assert!(!log.touched_since(2, &[k(&attr(2))]));
        // Everything, then nothing known before what was dropped.
        log.record(3, &[]);
        assert!(log.touched_since(2, &[k(&attr(7))]));
        for s in 4..(4 + INVAL_LOG_MAX as u64) {
            log.record(s, &[attr(s)]);
        }
        // Seqs up to 3 fell off the front.
        assert!(log.touched_since(2, &[k(&attr(1))]));
        assert!(!log.touched_since(3, &[k(&attr(1))]));
        assert!(log.touched_since(3, &[k(&attr(7))]));
    }
}
