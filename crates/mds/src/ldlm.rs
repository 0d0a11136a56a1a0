//! The MDT's lock manager: Lustre's LDLM with inode bits, kept in memory.
//!
//! A resource is a FID, or a `(directory FID, name hash)` pair for one name. A lock has
//! a mode (EX, PW, PR, CW, CR, NL, with Lustre's compatibility matrix) and a set of
//! inode bits; two locks on one resource conflict when their modes do and their bits
//! intersect.
//!
//! Two kinds of holder, two rules:
//! - **Clients** get locks with the reply that needs them (an intent), and only when
//!   one can be granted at once: a request never waits for a client lock, it is
//!   answered without one and the client does not cache. A client lock is also refused
//!   while an MDT operation waits on the resource, so a stream of readers cannot starve
//!   a writer.
//! - **The MDT** takes locks for a modifying operation, all of an operation's
//!   resources at once or none ([`Ldlm::acquire`]), so no operation holds some while
//!   waiting for others and no two wait on each other. If any conflicts, the operation
//!   waits in arrival order; the client locks in its way are returned once, to be
//!   called back (a blocking callback), and the operation is woken when their cancels
//!   (or their holders' eviction, [`Ldlm::overdue`] after `ldlm_timeout`) free it.

use foldhash::HashMap;
use lode_base::{Errno, Fid};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Inode bits (Lustre's `MDS_INODELOCK_*`).
pub mod bits {
    /// The name → FID binding, and the right to look up under a directory.
    pub const LOOKUP: u8 = 0x01;
    /// Size, nlink, timestamps; for a directory, its entries.
    pub const UPDATE: u8 = 0x02;
    /// An open handle (open lock caching).
    pub const OPEN: u8 = 0x04;
    /// The file's layout.
    pub const LAYOUT: u8 = 0x08;
    /// Mode, owner, ACL.
    pub const PERM: u8 = 0x10;
    /// Other extended attributes.
    pub const XATTR: u8 = 0x20;
    /// Data-on-MDT data.
    pub const DOM: u8 = 0x40;
    /// Every bit.
    pub const ALL: u8 = 0x7f;
}

/// A lock mode, with Lustre's wire values.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum LockMode {
    /// Exclusive.
    Ex = 1,
    /// Protected write.
    Pw = 2,
    /// Protected read.
    Pr = 4,
    /// Concurrent write.
    Cw = 8,
    /// Concurrent read.
    Cr = 16,
    /// Null: compatible with everything.
    Nl = 32,
}

impl LockMode {
    /// Lustre's `lck_compat_array`.
    pub fn compatible(self, other: LockMode) -> bool {
        use LockMode::*;
        let ok: &[LockMode] = match self {
            Ex => &[Nl],
            Pw => &[Nl, Cr],
            Pr => &[Nl, Cr, Pr],
            Cw => &[Nl, Cr, Cw],
            Cr => &[Nl, Cr, Cw, Pr, Pw],
            Nl => return true,
        };
        ok.contains(&other)
    }

    /// The mode with this wire value.
    pub fn from_wire(v: u32) -> Option<LockMode> {
        use LockMode::*;
        [Ex, Pw, Pr, Cw, Cr, Nl]
            .into_iter()
            .find(|m| *m as u32 == v)
    }
}

/// What a lock covers: an object, or one name in a directory (`hash` ≠ 0).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ResId {
    /// The object, or the directory of the name.
    pub fid: Fid,
    /// 0 for the object itself; else the name's hash (never 0).
    pub hash: u64,
}

impl ResId {
    /// The object's own resource.
    pub fn object(fid: Fid) -> ResId {
        ResId { fid, hash: 0 }
    }

    /// One name's resource in directory `dir` (Lustre's 4th resource word; hash 0 is
    /// replaced by 1, so it never names the directory itself).
    pub fn name(dir: Fid, name: &[u8]) -> ResId {
        let h = lode_base::hash::name_hash(name);
        ResId {
            fid: dir,
            hash: if h == 0 { 1 } else { h },
        }
    }
}

/// A lock's handle (Lustre's cookie), never 0: its place in the lock table (low 32
/// bits) and that place's generation (high 32 bits), so a handle whose lock is gone
/// finds nothing even once the place holds another lock.
pub type Handle = u64;

/// A client lock in the way of an MDT operation: call its holder back.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Callback {
    /// The holder's reply slot.
    pub slot: u32,
    /// The lock.
    pub handle: Handle,
    /// What it covers.
    pub res: ResId,
    /// Its bits.
    pub bits: u8,
}

/// What an MDT operation wants: one resource, a mode, bits.
pub type Want = (ResId, LockMode, u8);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Owner {
    Client(u32),
    Mdt,
}

struct Lock {
    handle: Handle,
    owner: Owner,
    mode: LockMode,
    bits: u8,
}

impl Lock {
    fn conflicts(&self, mode: LockMode, bits: u8) -> bool {
        self.bits & bits != 0 && !self.mode.compatible(mode)
    }

    /// A client's write-back lock: PW or EX on the DOM bit (see [`Ldlm::dom_written`]).
    fn writes_back(&self) -> bool {
        matches!(self.owner, Owner::Client(_))
            && self.bits & bits::DOM != 0
            && matches!(self.mode, LockMode::Pw | LockMode::Ex)
    }
}

#[derive(Default)]
struct Resource {
    /// Most resources hold one lock: kept inline, so a grant's conflict check reads
    /// no second cache line.
    granted: smallvec::SmallVec<[Lock; 1]>,
    /// Ids of the MDT operations waiting on it.
    waiting: Vec<u64>,
}

impl Resource {
    /// Whether a lock of `mode` on `bits` of this resource (`r`) can be granted now:
    /// no granted lock conflicts, nor any waiter older than `before`.
    fn grantable(
        &self,
        waiters: &BTreeMap<u64, Waiter>,
        r: ResId,
        mode: LockMode,
        bits: u8,
        before: u64,
    ) -> bool {
        !self.granted.iter().any(|l| l.conflicts(mode, bits))
            && !self.waiting.iter().any(|id| {
                *id < before
                    && waiters.get(id).is_some_and(|w| {
                        w.want
                            .iter()
                            .any(|(wr, wm, wb)| *wr == r && wb & bits != 0 && !wm.compatible(mode))
                    })
            })
    }
}

type Wake = Box<dyn FnOnce(MdtLocks) + Send>;

/// How long a resource counts as contended after a callback on it, or after the last
/// change to it since (each change while it is contended starts the window again): a
/// stream of changes by several clients keeps it contended, and reads that follow
/// the stream get locks again soon after it ends (a stat phase after a create phase).
/// A wrong guess costs one callback per window, or a window of reads not cached.
pub const CONTENTION_WINDOW: Duration = Duration::from_millis(20);
/// Contended resources remembered before old ones are dropped.
const CONTENDED_MAX: usize = 4096;

struct Waiter {
    want: Vec<Want>,
    wake: Wake,
}

/// A place in the lock table: the lock there, if any, and the generation its handle
/// carries.
struct Place {
    gen: u32,
    lock: Option<(ResId, Owner)>,
    /// For a client's lock, where it is in the client's list.
    pos: u32,
}

/// Every lock, by handle: its resource and owner. A table rather than a hash map,
/// because a tree walk grants and cancels two locks per entry, and a map's inserts and
/// removes (cache misses in a map of a million locks) were much of the MDT's time.
#[derive(Default)]
struct Table {
    places: Vec<Place>,
    /// Free places.
    free: Vec<u32>,
    /// Locks held.
    live: usize,
    /// Each client's locks (their places), so an eviction finds them without a scan.
    clients: HashMap<u32, Vec<u32>>,
}

/// The handle of the lock in place `i` at generation `gen`.
fn handle(gen: u32, i: u32) -> Handle {
    (u64::from(gen) << 32) | u64::from(i)
}

impl Table {
    /// Puts a lock in a free place; returns its handle.
    fn put(&mut self, r: ResId, owner: Owner) -> Handle {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.places.push(Place {
                    gen: 1,
                    lock: None,
                    pos: 0,
                });
                (self.places.len() - 1) as u32
            }
        };
        let place = &mut self.places[i as usize];
        place.lock = Some((r, owner));
        if let Owner::Client(slot) = owner {
            let list = self.clients.entry(slot).or_default();
            place.pos = list.len() as u32;
            list.push(i);
        }
        self.live += 1;
        handle(place.gen, i)
    }

    /// Locks `slot` holds.
    fn held(&self, slot: u32) -> usize {
        self.clients.get(&slot).map_or(0, Vec::len)
    }

    /// The lock `handle` names, if it is held.
    fn get(&self, handle: Handle) -> Option<(ResId, Owner)> {
        let place = self.places.get(handle as u32 as usize)?;
        if u64::from(place.gen) != handle >> 32 {
            return None;
        }
        place.lock
    }

    /// Takes the lock `handle` names out; its place gets a new generation.
    fn take(&mut self, handle: Handle) -> Option<(ResId, Owner)> {
        let lock = self.get(handle)?;
        let i = handle as u32;
        let place = &mut self.places[i as usize];
        place.lock = None;
        let pos = place.pos as usize;
        // A place whose generation would wrap is never used again, so no handle is
        // ever given twice.
        if let Some(gen) = place.gen.checked_add(1) {
            place.gen = gen;
            self.free.push(i);
        }
        self.live -= 1;
        if let (_, Owner::Client(slot)) = lock {
            if let std::collections::hash_map::Entry::Occupied(mut e) = self.clients.entry(slot) {
                let list = e.get_mut();
                list.swap_remove(pos);
                if let Some(&moved) = list.get(pos) {
                    self.places[moved as usize].pos = pos as u32;
                }
                if list.is_empty() {
                    e.remove();
                }
            }
        }
        Some(lock)
    }

    /// The handles of `slot`'s locks.
    fn of_client(&self, slot: u32) -> Vec<Handle> {
        self.clients.get(&slot).map_or_else(Vec::new, |list| {
            list.iter()
                .map(|&i| handle(self.places[i as usize].gen, i))
                .collect()
        })
    }
}

#[derive(Default)]
struct State {
    res: HashMap<ResId, Resource>,
    /// Every lock, by handle.
    table: Table,
    /// Waiting MDT operations, oldest first.
    waiters: BTreeMap<u64, Waiter>,
    /// Client locks whose holders were called back: holder and when. Kept apart so the
    /// eviction timer looks at these only, not at every lock.
    called: HashMap<Handle, (u32, Instant)>,
    /// Resources whose client locks were called back lately, and when.
    contended: HashMap<ResId, Instant>,
    /// The last waiter id given.
    next: u64,
    /// Client write-back locks granted (see [`Lock::writes_back`]), shared with
    /// [`Ldlm`], which reads it without the mutex: while 0 no read needs to look
    /// for one.
    writers: Arc<AtomicUsize>,
}

impl State {
    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// Whether `want` can be granted now: no granted lock conflicts, nor any waiter
    /// older than `before` on the same resources.
    fn grantable(&self, want: &[Want], before: u64) -> bool {
        want.iter().all(|&(r, mode, bits)| {
            self.res
                .get(&r)
                .is_none_or(|res| res.grantable(&self.waiters, r, mode, bits, before))
        })
    }

    fn grant(&mut self, r: ResId, owner: Owner, mode: LockMode, bits: u8) -> Handle {
        let handle = self.table.put(r, owner);
        self.res.entry(r).or_default().granted.push(Lock {
            handle,
            owner,
            mode,
            bits,
        });
        handle
    }

    /// A client lock if it can be granted now: `Ok(None)` if something conflicts,
    /// `ENOLCK` if the client holds `cap` locks already.
    fn grant_client(&mut self, slot: u32, cap: usize, w: Want) -> Result<Option<Handle>, Errno> {
        if self.table.held(slot) >= cap {
            return Err(Errno::ENOLCK);
        }
        let (r, mode, bits) = w;
        // One lookup of the resource for both the check and the grant: a tree walk
        // grants two locks per entry. A resource made here is granted on at once.
        let res = match self.res.entry(r) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let res = e.into_mut();
                if !res.grantable(&self.waiters, r, mode, bits, u64::MAX) {
                    return Ok(None);
                }
                res
            }
            std::collections::hash_map::Entry::Vacant(e) => e.insert(Resource::default()),
        };
        let owner = Owner::Client(slot);
        let handle = self.table.put(r, owner);
        let lock = Lock {
            handle,
            owner,
            mode,
            bits,
        };
        if lock.writes_back() {
            self.writers.fetch_add(1, Ordering::AcqRel);
        }
        res.granted.push(lock);
        Ok(Some(handle))
    }

    /// Removes a granted lock; returns its owner.
    fn remove(&mut self, handle: Handle) -> Option<Owner> {
        self.remove_keeping(handle, false)
    }

    /// Removes a granted lock; keeps its resource even if now empty when `keep` (a
    /// lock about to be granted on it reuses it; [`State::prune`] drops it if not).
    fn remove_keeping(&mut self, handle: Handle, keep: bool) -> Option<Owner> {
        let (r, owner) = self.table.take(handle)?;
        if !self.called.is_empty() {
            self.called.remove(&handle);
        }
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.res.entry(r) {
            let res = e.get_mut();
            if let Some(i) = res.granted.iter().position(|l| l.handle == handle) {
                let lock = res.granted.swap_remove(i);
                if lock.writes_back() {
                    self.writers.fetch_sub(1, Ordering::AcqRel);
                }
            }
            if !keep && res.granted.is_empty() && res.waiting.is_empty() {
                e.remove();
            }
        }
        Some(owner)
    }

    /// The granted lock `handle` names, if any.
    fn lock(&self, handle: Handle) -> Option<&Lock> {
        let (r, _) = self.table.get(handle)?;
        self.res
            .get(&r)?
            .granted
            .iter()
            .find(|l| l.handle == handle)
    }

    /// Drops the resources of `rs` that hold nothing.
    fn prune(&mut self, rs: impl Iterator<Item = ResId>) {
        for r in rs {
            if self
                .res
                .get(&r)
                .is_some_and(|x| x.granted.is_empty() && x.waiting.is_empty())
            {
                self.res.remove(&r);
            }
        }
    }

    /// Grants every waiter that can now be granted, oldest first; returns them with
    /// their locks, to be woken outside the state's mutex.
    fn reprocess(&mut self) -> Vec<(Wake, Vec<Handle>)> {
        let mut woken = Vec::new();
        let ids: Vec<u64> = self.waiters.keys().copied().collect();
        for id in ids {
            let grantable = self
                .waiters
                .get(&id)
                .is_some_and(|w| self.grantable(&w.want, id));
            if !grantable {
                continue;
            }
            let Some(w) = self.waiters.remove(&id) else {
                continue;
            };
            for (r, _, _) in &w.want {
                if let Some(res) = self.res.get_mut(r) {
                    res.waiting.retain(|x| *x != id);
                }
            }
            let handles = w
                .want
                .iter()
                .map(|(r, mode, bits)| self.grant(*r, Owner::Mdt, *mode, *bits))
                .collect();
            woken.push((w.wake, handles));
        }
        woken
    }
}

thread_local! {
    /// Operations woken on this thread and not yet run (`None`: no wake under way).
    static WAKING: std::cell::RefCell<Option<std::collections::VecDeque<(Wake, MdtLocks)>>> =
        const { std::cell::RefCell::new(None) };
}

/// The lock manager of one MDT.
pub struct Ldlm {
    st: Mutex<State>,
    /// Most locks one client may hold (`ldlm.namespaces.*.max_locks_per_client`).
    max_per_client: AtomicUsize,
    /// [`CONTENTION_WINDOW`] in µs, unless a test sets another.
    window_us: AtomicU64,
    /// `State::writers`.
    writers: Arc<AtomicUsize>,
}

/// Locks an MDT operation holds; released when dropped (waking whoever waited).
pub struct MdtLocks {
    ldlm: Arc<Ldlm>,
    handles: Vec<Handle>,
}

impl Drop for MdtLocks {
    fn drop(&mut self) {
        let woken = {
            let mut st = self.ldlm.st.lock();
            for h in self.handles.drain(..) {
                st.remove(h);
            }
            st.reprocess()
        };
        self.ldlm.wake(woken);
    }
}

/// The outcome of [`Ldlm::acquire`].
pub enum Acquired {
    /// Every lock, now.
    Granted(MdtLocks),
    /// The operation waits; `wake` runs with its locks once granted. Call back these
    /// client locks (each is returned once, to the first operation they block).
    Waiting(Vec<Callback>),
}

impl Ldlm {
    /// A lock manager allowing `max_per_client` locks per client.
    pub fn new(max_per_client: usize) -> Arc<Ldlm> {
        let st = State::default();
        let writers = st.writers.clone();
        Arc::new(Ldlm {
            st: Mutex::new(st),
            max_per_client: AtomicUsize::new(max_per_client),
            window_us: AtomicU64::new(CONTENTION_WINDOW.as_micros() as u64),
            writers,
        })
    }

    /// Sets how long a resource stays contended (tests use a long one).
    #[cfg(test)]
    fn set_contention_window(&self, d: Duration) {
        self.window_us
            .store(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn window(&self) -> Duration {
        Duration::from_micros(self.window_us.load(Ordering::Relaxed))
    }

    /// The per-client cap.
    pub fn max_per_client(&self) -> usize {
        self.max_per_client.load(Ordering::Relaxed)
    }

    /// Sets the per-client cap (for new grants).
    pub fn set_max_per_client(&self, n: usize) {
        self.max_per_client.store(n, Ordering::Relaxed);
    }

    /// Grants a client lock if it can be granted at once; `Ok(None)` if something
    /// conflicts (answer without a lock), `ENOLCK` if the client holds its cap.
    pub fn grant(
        &self,
        slot: u32,
        r: ResId,
        mode: LockMode,
        bits: u8,
    ) -> Result<Option<Handle>, Errno> {
        self.grant_unless(slot, (r, mode, bits), false)
    }

    /// [`Ldlm::grant`], unless `r` is contended (see [`Ldlm::contended`]): then nothing
    /// (`Ok(None)`), as for a conflict. For what a client would cache as a side effect
    /// of reading it (a getattr's or lookup's attributes): two clients busy in one
    /// directory otherwise take turns calling each other back, one callback per change.
    pub fn grant_uncontended(
        &self,
        slot: u32,
        r: ResId,
        mode: LockMode,
        bits: u8,
    ) -> Result<Option<Handle>, Errno> {
        self.grant_unless(slot, (r, mode, bits), true)
    }

    fn grant_unless(
        &self,
        slot: u32,
        want: Want,
        contended: bool,
    ) -> Result<Option<Handle>, Errno> {
        let cap = self.max_per_client.load(Ordering::Relaxed);
        let window = self.window();
        let mut st = self.st.lock();
        if contended
            && st
                .contended
                .get(&want.0)
                .is_some_and(|t| t.elapsed() < window)
        {
            return Ok(None);
        }
        st.grant_client(slot, cap, want)
    }

    /// Takes every lock an MDT operation wants if it can at once (nothing queued).
    pub fn try_acquire(self: &Arc<Self>, want: &[Want]) -> Option<MdtLocks> {
        self.grant_all(&mut self.st.lock(), want)
    }

    /// Grants every lock of `want` to the MDT if all can be granted now.
    fn grant_all(self: &Arc<Self>, st: &mut State, want: &[Want]) -> Option<MdtLocks> {
        if !st.grantable(want, u64::MAX) {
            return None;
        }
        if !st.contended.is_empty() {
            let window = self.window();
            let now = Instant::now();
            for (r, mode, _) in want {
                if *mode == LockMode::Pr {
                    continue;
                }
                if let Some(t) = st.contended.get_mut(r) {
                    if now.duration_since(*t) < window {
                        *t = now;
                    }
                }
            }
        }
        let handles = want
            .iter()
            .map(|(r, mode, bits)| st.grant(*r, Owner::Mdt, *mode, *bits))
            .collect();
        Some(MdtLocks {
            ldlm: self.clone(),
            handles,
        })
    }

    /// Takes every lock an MDT operation wants, at once, or queues the operation (see
    /// [`Acquired`]). `wake` runs on the thread whose cancel or release frees it.
    /// `slot`: the client whose change it is, if any; a callback of that client's own
    /// lock (granted to it after the change's early cancels were chosen) does not make
    /// the resource contended, since no other client is busy on it.
    pub fn acquire(
        self: &Arc<Self>,
        slot: Option<u32>,
        want: &[Want],
        wake: impl FnOnce(MdtLocks) + Send + 'static,
    ) -> Acquired {
        let mut guard = self.st.lock();
        if let Some(locks) = self.grant_all(&mut guard, want) {
            return Acquired::Granted(locks);
        }
        let st = &mut *guard;
        let id = st.id();
        let now = Instant::now();
        let mut callbacks = Vec::new();
        for (r, mode, bits) in want {
            let res = st.res.entry(*r).or_default();
            res.waiting.push(id);
            for l in res.granted.iter() {
                if let Owner::Client(slot) = l.owner {
                    if l.conflicts(*mode, *bits) && !st.called.contains_key(&l.handle) {
                        st.called.insert(l.handle, (slot, now));
                        callbacks.push(Callback {
                            slot,
                            handle: l.handle,
                            res: *r,
                            bits: l.bits,
                        });
                    }
                }
            }
        }
        if callbacks.iter().any(|c| Some(c.slot) != slot) {
            let window = self.window();
            if st.contended.len() >= CONTENDED_MAX {
                st.contended.retain(|_, t| now.duration_since(*t) < window);
            }
            for c in callbacks.iter().filter(|c| Some(c.slot) != slot) {
                st.contended.insert(c.res, now);
            }
        }
        st.waiters.insert(
            id,
            Waiter {
                want: want.to_vec(),
                wake: Box::new(wake),
            },
        );
        Acquired::Waiting(callbacks)
    }

    /// Whether client locks on `r` were called back, and changes to it followed each
    /// other since, each within [`CONTENTION_WINDOW`] of the last: then several clients are busy on it, and handing out
    /// locks another client's next change must call back only costs callbacks.
    pub fn contended(&self, r: ResId) -> bool {
        let window = self.window();
        self.st
            .lock()
            .contended
            .get(&r)
            .is_some_and(|t| t.elapsed() < window)
    }

    /// Hands an MDT operation's locks over to its client: in one step, so nothing can
    /// change in between, the operation's locks go and the client gets those of `want`
    /// that can be granted (0 for one that cannot, or past the client's cap). What the
    /// operation read under its locks is then what the client's locks cover.
    pub fn release_and_grant(
        self: &Arc<Self>,
        mut locks: MdtLocks,
        slot: u32,
        want: &[Want],
    ) -> Vec<Handle> {
        let (got, woken) = {
            let mut st = self.st.lock();
            // The resources stay while the client's locks take the operation's place.
            let mut freed = Vec::with_capacity(locks.handles.len());
            for h in locks.handles.drain(..) {
                if let Some((r, _)) = st.table.get(h) {
                    freed.push(r);
                }
                st.remove_keeping(h, true);
            }
            let cap = self.max_per_client.load(Ordering::Relaxed);
            let got = want
                .iter()
                .map(|w| st.grant_client(slot, cap, *w).ok().flatten().unwrap_or(0))
                .collect();
            st.prune(freed.into_iter());
            (got, st.reprocess())
        };
        self.wake(woken);
        got
    }

    /// A client cancels one of its locks; false if it holds no such lock (ignored).
    pub fn cancel(self: &Arc<Self>, slot: u32, handle: Handle) -> bool {
        self.cancel_many(slot, &[handle]) == 1
    }

    /// A client cancels some of its locks (one pass); returns how many it held.
    pub fn cancel_many(self: &Arc<Self>, slot: u32, handles: &[Handle]) -> usize {
        let (n, woken) = {
            let mut st = self.st.lock();
            let mut n = 0;
            for h in handles {
                if st
                    .table
                    .get(*h)
                    .is_some_and(|(_, o)| o == Owner::Client(slot))
                {
                    st.remove(*h);
                    n += 1;
                }
            }
            if n == 0 || st.waiters.is_empty() {
                return n;
            }
            (n, st.reprocess())
        };
        self.wake(woken);
        n
    }

    /// Drops every lock of a client that can no longer be called back but is not
    /// evicted (its callback channel closed) but its write-back locks: its writes
    /// kept back may still come, on its other connection, and a reader must not go
    /// ahead of them (calling such a lock back evicts the client). Returns how many.
    pub fn drop_cached(self: &Arc<Self>, slot: u32) -> usize {
        let (n, woken) = {
            let mut st = self.st.lock();
            let handles: Vec<Handle> = st
                .table
                .of_client(slot)
                .into_iter()
                .filter(|h| st.lock(*h).is_some_and(|l| !l.writes_back()))
                .collect();
            for h in &handles {
                st.remove(*h);
            }
            (handles.len(), st.reprocess())
        };
        self.wake(woken);
        n
    }

    /// Drops every lock of a client (evicted or gone); returns how many.
    pub fn evict(self: &Arc<Self>, slot: u32) -> usize {
        let (n, woken) = {
            let mut st = self.st.lock();
            let handles = st.table.of_client(slot);
            for h in &handles {
                st.remove(*h);
            }
            (handles.len(), st.reprocess())
        };
        self.wake(woken);
        n
    }

    /// Clients called back more than `timeout` ago that still hold the lock: to be
    /// evicted.
    pub fn overdue(&self, timeout: Duration) -> Vec<u32> {
        let st = self.st.lock();
        let mut slots: Vec<u32> = st
            .called
            .values()
            .filter(|(_, t)| t.elapsed() >= timeout)
            .map(|(slot, _)| *slot)
            .collect();
        slots.sort_unstable();
        slots.dedup();
        slots
    }

    /// Whether any client holds a write-back lock (PW or EX on the DOM bit: a first
    /// write kept back past `write(2)`, see `CreateReq::dom_writeback`).
    pub fn any_written_back(&self) -> bool {
        self.writers.load(Ordering::Acquire) > 0
    }

    /// Those of `fids` a client other than `slot`'s holds a write-back lock on:
    /// their data and size on the MDT may be behind that client's, so a request of
    /// `slot`'s about them first takes the DOM bit itself ([`Ldlm::acquire`]),
    /// calling the lock back. A client's own requests are not held back by its own
    /// locks: it sends them after its kept-back writes itself.
    pub fn dom_written(&self, fids: &[Fid], slot: u32) -> Vec<Fid> {
        if fids.is_empty() || !self.any_written_back() {
            return Vec::new();
        }
        let st = self.st.lock();
        fids.iter()
            .copied()
            .filter(|f| {
                st.res.get(&ResId::object(*f)).is_some_and(|r| {
                    r.granted
                        .iter()
                        .any(|l| l.writes_back() && l.owner != Owner::Client(slot))
                })
            })
            .collect()
    }

    /// Gives back `handle` if it is a write-back lock of `slot`'s on `fid` (the
    /// write kept back under it is here); false, changing nothing, if not.
    pub fn cancel_write_back(self: &Arc<Self>, slot: u32, handle: Handle, fid: Fid) -> bool {
        let ok = {
            let st = self.st.lock();
            st.table.get(handle) == Some((ResId::object(fid), Owner::Client(slot)))
                && st.lock(handle).is_some_and(Lock::writes_back)
        };
        ok && self.cancel(slot, handle)
    }

    /// Locks granted now (clients' and the MDT's).
    pub fn lock_count(&self) -> usize {
        self.st.lock().table.live
    }

    /// Resources with a lock or a waiter.
    pub fn resource_count(&self) -> usize {
        self.st.lock().res.len()
    }

    /// Locks one client holds.
    pub fn client_locks(&self, slot: u32) -> usize {
        self.st.lock().table.held(slot)
    }

    /// Runs the woken operations. An operation woken while this thread already runs
    /// one (its locks' release woke the next) waits its turn in the thread's queue
    /// instead of running nested, so a long queue on one resource never grows the stack.
    fn wake(self: &Arc<Self>, woken: Vec<(Wake, Vec<Handle>)>) {
        let mut items: Vec<(Wake, MdtLocks)> = woken
            .into_iter()
            .map(|(w, handles)| {
                (
                    w,
                    MdtLocks {
                        ldlm: self.clone(),
                        handles,
                    },
                )
            })
            .collect();
        let outer = WAKING.with(|q| {
            let mut q = q.borrow_mut();
            match q.as_mut() {
                Some(queued) => {
                    queued.extend(items.drain(..));
                    false
                }
                None => {
                    *q = Some(std::collections::VecDeque::from(items));
                    true
                }
            }
        });
        if !outer {
            return;
        }
        // Resets the queue however the loop ends (a panicking operation included).
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                WAKING.with(|q| q.borrow_mut().take());
            }
        }
        let _reset = Reset;
        while let Some((w, locks)) =
            WAKING.with(|q| q.borrow_mut().as_mut().and_then(|v| v.pop_front()))
        {
            w(locks);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use LockMode::*;

    fn fid(oid: u32) -> Fid {
        Fid::new(lode_base::fid::FIRST_NORMAL_SEQ, oid, 0)
    }

    #[test]
    fn compatibility_is_lustres_matrix_and_symmetric() {
        let all = [Ex, Pw, Pr, Cw, Cr, Nl];
        let want = [
            (Ex, vec![Nl]),
            (Pw, vec![Nl, Cr]),
            (Pr, vec![Nl, Cr, Pr]),
            (Cw, vec![Nl, Cr, Cw]),
            (Cr, vec![Nl, Cr, Cw, Pr, Pw]),
            (Nl, all.to_vec()),
        ];
        for (m, ok) in want {
            for o in all {
                assert_eq!(m.compatible(o), ok.contains(&o), "{m:?} vs {o:?}");
                assert_eq!(m.compatible(o), o.compatible(m), "symmetric {m:?} {o:?}");
            }
        }
        assert_eq!(LockMode::from_wire(4), Some(Pr));
        assert_eq!(LockMode::from_wire(3), None);
    }

    #[test]
    fn locks_conflict_only_when_modes_do_and_bits_meet() {
        let l = Ldlm::new(100);
        let d = ResId::object(fid(1));
        assert!(l.grant(1, d, Pr, bits::LOOKUP).unwrap().is_some());
        assert!(l
            .grant(2, d, Pr, bits::LOOKUP | bits::UPDATE)
            .unwrap()
            .is_some());
        // EX on other bits does not meet them.
        assert!(l.grant(3, d, Ex, bits::LAYOUT).unwrap().is_some());
        // EX on UPDATE meets client 2's lock: not granted, answered without a lock.
        assert_eq!(l.grant(3, d, Ex, bits::UPDATE).unwrap(), None);
        // A name resource is another resource.
        assert!(l
            .grant(3, ResId::name(fid(1), b"x"), Ex, bits::UPDATE)
            .unwrap()
            .is_some());
        assert_eq!(l.lock_count(), 4);
        assert_eq!(l.resource_count(), 2);
        assert_ne!(ResId::name(fid(1), b"x").hash, 0);
    }

    #[test]
    fn an_mdt_operation_waits_for_cancels_and_is_woken_with_its_locks() {
        let l = Ldlm::new(100);
        let d = ResId::object(fid(1));
        let h1 = l.grant(1, d, Pr, bits::UPDATE).unwrap().unwrap();
        let h2 = l
            .grant(2, d, Pr, bits::LOOKUP | bits::UPDATE)
            .unwrap()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let Acquired::Waiting(cbs) = l.acquire(None, &[(d, Cw, bits::UPDATE)], move |locks| {
            tx.send(locks).unwrap();
        }) else {
            panic!("two readers are in the way");
        };
        let mut called: Vec<(u32, Handle)> = cbs.iter().map(|c| (c.slot, c.handle)).collect();
        called.sort_unstable();
        assert_eq!(called, [(1, h1), (2, h2)]);
        // While it waits, no new conflicting client lock is granted (no starvation).
        assert_eq!(l.grant(3, d, Pr, bits::UPDATE).unwrap(), None);
        // A client may not cancel what it does not hold.
        assert!(!l.cancel(2, h1));
        assert!(l.cancel(1, h1));
        assert!(rx.try_recv().is_err(), "one holder left");
        assert!(l.cancel(2, h2));
        let locks = rx.try_recv().expect("woken once both cancelled");
        assert_eq!(l.lock_count(), 1);
        drop(locks);
        assert_eq!((l.lock_count(), l.resource_count()), (0, 0));
    }

    #[test]
    fn a_resource_called_back_lately_is_not_granted_for_caching() {
        let l = Ldlm::new(100);
        // Long enough that a busy machine's sleeps do not outlast it.
        let window = Duration::from_millis(800);
        l.set_contention_window(window);
        let (d, e) = (ResId::object(fid(1)), ResId::object(fid(2)));
        let h = l
            .grant_uncontended(1, d, Pr, bits::UPDATE)
            .unwrap()
            .unwrap();
        let Acquired::Waiting(cbs) = l.acquire(None, &[(d, Cw, bits::UPDATE)], |_| {}) else {
            panic!("a reader is in the way");
        };
        assert_eq!(cbs.len(), 1);
        assert!(l.cancel(1, h));
        assert!(l.contended(d));
        // A change's callback of its own client's lock is no contention.
        let own = ResId::object(fid(3));
        let h = l.grant(5, own, Pr, bits::UPDATE).unwrap().unwrap();
        let Acquired::Waiting(cbs) = l.acquire(Some(5), &[(own, Cw, bits::UPDATE)], |_| {}) else {
            panic!("its own reader is in the way");
        };
        assert_eq!(cbs.len(), 1);
        assert!(l.cancel(5, h));
        assert!(!l.contended(own));
        // Another client's read of it gets no lock for the window; other resources do,
        // and a plain grant still does.
        assert_eq!(l.grant_uncontended(2, d, Pr, bits::UPDATE).unwrap(), None);
        assert!(l
            .grant_uncontended(2, e, Pr, bits::UPDATE)
            .unwrap()
            .is_some());
        assert!(!l.contended(e));
        // Changes keep it contended past the window; once they stop, it ends.
        for _ in 0..3 {
            std::thread::sleep(window / 4);
            let Acquired::Granted(locks) = l.acquire(None, &[(d, Cw, bits::UPDATE)], |_| {}) else {
                panic!("nothing in the way");
            };
            drop(locks);
            assert!(l.contended(d));
        }
        std::thread::sleep(window + window / 4);
        assert!(!l.contended(d));
        assert!(l
            .grant_uncontended(2, d, Pr, bits::UPDATE)
            .unwrap()
            .is_some());
    }

    #[test]
    fn mdt_operations_take_all_their_locks_or_none_and_queue_in_order() {
        let l = Ldlm::new(100);
        let (a, b) = (ResId::object(fid(1)), ResId::object(fid(2)));
        let Acquired::Granted(first) = l.acquire(None, &[(a, Ex, bits::UPDATE)], |_| {}) else {
            panic!("free");
        };
        let (tx, rx) = mpsc::channel();
        let tx2 = tx.clone();
        // Wants a (held) and b (free): takes neither, so b stays free for others.
        let Acquired::Waiting(cbs) = l.acquire(
            None,
            &[(a, Ex, bits::UPDATE), (b, Ex, bits::UPDATE)],
            move |k| {
                tx.send(("second", k)).unwrap();
            },
        ) else {
            panic!("a is held");
        };
        assert!(cbs.is_empty(), "MDT locks are waited for, not called back");
        let Acquired::Granted(on_b) = l.acquire(None, &[(b, Pr, bits::LOOKUP)], |_| {}) else {
            panic!("other bits of b are free");
        };
        // A later waiter on a queues behind the earlier one.
        let Acquired::Waiting(_) = l.acquire(None, &[(a, Cw, bits::UPDATE)], move |k| {
            tx2.send(("third", k)).unwrap();
        }) else {
            panic!("a is held");
        };
        drop(first);
        let (who, second) = rx.try_recv().expect("woken");
        assert_eq!(who, "second");
        assert!(rx.try_recv().is_err(), "the third waits for the second");
        drop(second);
        let (who, third) = rx.try_recv().expect("then the third");
        assert_eq!(who, "third");
        drop((third, on_b));
        assert_eq!(l.lock_count(), 0);
    }

    #[test]
    fn a_long_queue_on_one_resource_is_woken_one_after_another_not_nested() {
        use std::sync::atomic::AtomicUsize;
        let l = Ldlm::new(100);
        let r = ResId::object(fid(1));
        let Acquired::Granted(first) = l.acquire(None, &[(r, Ex, bits::UPDATE)], |_| {}) else {
            panic!("free");
        };
        let active = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        for i in 0..1000 {
            let (active, tx) = (active.clone(), tx.clone());
            let Acquired::Waiting(_) = l.acquire(None, &[(r, Ex, bits::UPDATE)], move |locks| {
                assert_eq!(active.fetch_add(1, Ordering::SeqCst), 0, "nested wake");
                // Releasing wakes the next, which must wait until this one returns.
                drop(locks);
                active.fetch_sub(1, Ordering::SeqCst);
                tx.send(i).unwrap();
            }) else {
                panic!("queued");
            };
        }
        drop(first);
        let order: Vec<i32> = rx.try_iter().collect();
        assert_eq!(order, (0..1000).collect::<Vec<_>>(), "every one, in order");
        assert_eq!(l.lock_count(), 0);
    }

    #[test]
    fn an_operations_locks_are_handed_over_in_one_step() {
        let l = Ldlm::new(100);
        let (d, n, o) = (
            ResId::object(fid(1)),
            ResId::name(fid(1), b"x"),
            ResId::object(fid(2)),
        );
        let Acquired::Granted(op) = l.acquire(
            None,
            &[
                (d, Cw, bits::UPDATE),
                (n, Pw, bits::LOOKUP),
                (o, Pw, bits::UPDATE),
            ],
            |_| {},
        ) else {
            panic!("free");
        };
        // Another client reads the new object meanwhile: refused while the op holds it.
        assert_eq!(l.grant(9, o, Pr, bits::UPDATE).unwrap(), None);
        let got = l.release_and_grant(op, 1, &[(d, Pr, bits::PERM), (n, Pr, bits::LOOKUP)]);
        assert!(got.iter().all(|h| *h != 0), "{got:?}");
        // The object's resource held only the op's lock: gone with it.
        assert_eq!((l.lock_count(), l.resource_count()), (2, 2));
        assert_eq!(l.client_locks(1), 2);
        // A want in conflict with another client's lock is not granted (0).
        l.grant(9, o, Pw, bits::UPDATE).unwrap().unwrap();
        let Acquired::Granted(op) = l.acquire(None, &[(d, Cw, bits::UPDATE)], |_| {}) else {
            panic!("CW UPDATE does not meet the client's PR PERM");
        };
        assert_eq!(l.release_and_grant(op, 1, &[(o, Pr, bits::UPDATE)]), [0]);
    }

    #[test]
    fn eviction_frees_a_clients_locks_and_overdue_names_it() {
        let l = Ldlm::new(100);
        let d = ResId::object(fid(1));
        l.grant(7, d, Pr, bits::UPDATE).unwrap().unwrap();
        l.grant(7, ResId::object(fid(2)), Pr, bits::UPDATE)
            .unwrap()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let Acquired::Waiting(cbs) = l.acquire(None, &[(d, Pw, bits::UPDATE)], move |k| {
            tx.send(k).unwrap();
        }) else {
            panic!("client 7 is in the way");
        };
        assert_eq!(cbs.len(), 1);
        assert_eq!(l.overdue(Duration::from_secs(60)), Vec::<u32>::new());
        assert_eq!(l.overdue(Duration::ZERO), [7]);
        assert_eq!(l.evict(7), 2);
        assert_eq!(l.client_locks(7), 0);
        drop(rx.try_recv().expect("woken by the eviction"));
        assert_eq!(l.lock_count(), 0);
    }

    #[test]
    fn a_cancelled_handle_finds_nothing_once_its_place_holds_another_lock() {
        let l = Ldlm::new(100);
        let (a, b) = (ResId::object(fid(1)), ResId::object(fid(2)));
        let old = l.grant(1, a, Pr, bits::UPDATE).unwrap().unwrap();
        assert_ne!(old, 0);
        assert!(l.cancel(1, old));
        // The same place, another generation.
        let new = l.grant(1, b, Pr, bits::UPDATE).unwrap().unwrap();
        assert_eq!(new as u32, old as u32);
        assert_ne!(new, old);
        assert!(!l.cancel(1, old), "a stale handle cancels nothing");
        for forged in [0, u64::MAX, 1 << 32 | 999, new + (1 << 32)] {
            assert!(!l.cancel(1, forged), "{forged:#x} names no lock");
        }
        // Nor may another client cancel it.
        assert!(!l.cancel(2, new));
        l.grant(2, a, Pr, bits::UPDATE).unwrap().unwrap();
        assert_eq!(
            (l.lock_count(), l.client_locks(1), l.client_locks(2)),
            (2, 1, 1)
        );
        // An eviction takes the client's locks, and only those.
        assert_eq!(l.evict(1), 1);
        assert_eq!((l.lock_count(), l.resource_count()), (1, 1));
        assert!(!l.cancel(1, new) && l.client_locks(2) == 1);
    }

    #[test]
    fn a_clients_list_of_locks_follows_cancels_in_any_order() {
        let l = Ldlm::new(100);
        let r = |i| ResId::object(fid(i));
        let h: Vec<Handle> = (1..=5)
            .map(|i| l.grant(1, r(i), Pr, bits::UPDATE).unwrap().unwrap())
            .collect();
        l.grant(2, r(9), Pr, bits::UPDATE).unwrap().unwrap();
        // From the middle, the front and the back: each moves another in the list.
        for i in [1, 0, 4] {
            assert!(l.cancel(1, h[i]));
        }
        assert_eq!(l.client_locks(1), 2);
        // Those left are still the client's to cancel, and an eviction finds them.
        assert!(l.cancel(1, h[3]));
        assert_eq!(l.evict(1), 1);
        assert!(!l.cancel(1, h[2]), "evicted");
        assert_eq!(
            (l.client_locks(1), l.client_locks(2), l.lock_count()),
            (0, 1, 1)
        );
    }

    #[test]
    fn a_client_at_its_cap_gets_enolck_and_the_server_holds_no_more() {
        let l = Ldlm::new(3);
        for i in 0..3 {
            l.grant(1, ResId::object(fid(i + 1)), Pr, bits::LOOKUP)
                .unwrap()
                .unwrap();
        }
        assert_eq!(
            l.grant(1, ResId::object(fid(9)), Pr, bits::LOOKUP),
            Err(Errno::ENOLCK)
        );
        assert!(l.grant(2, ResId::object(fid(9)), Pr, bits::LOOKUP).is_ok());
        assert_eq!(l.lock_count(), 4);
    }
}
