//! The target layer of an MDT (Lustre's mdt): CONNECT and exports, client slots, reply
//! reconstruction for resends, in-flight tracking, parked SYNCs, and the exhaustive
//! dispatch of `MdtRequest` to the namespace layer.

use crate::inode::dirs::Found;
use crate::ldlm::{self, Acquired, Ldlm, LockMode, MdtLocks, ResId, Want};
use crate::{Ctx, MdtConfig, Namespace, OpError, OpResult, OstState, Tunables};
use lode_base::{Cred, Errno, Fid};
use lode_proto::frame::{FLAG_REPLAY, FLAG_REPLAY_DONE};
use lode_proto::{
    ConnectRep, ConnectReq, Empty, LdlmCancelReq, LdlmEnqueueRep, MdtBody, MdtRequest, Opcode,
    ParentAttrs, ReaddirRep, Reply, Request, SyncRep, UnlinkRep, CONNECT_SUPPORTED,
};
use lode_rpc::recovery::{Next, RecState};
use lode_rpc::server::Deferred;
use lode_rpc::{CallbackChannel, Incoming, OpStats, Outgoing, Service};
use lode_store::mdt::ReplySlot;
use lode_store::records::{self, ClientRec};
use lode_store::{Batch, Cf, MdtStore, StoreError};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

mod batch;

/// A connected client.
pub struct Export {
    /// The client's UUID.
    pub uuid: String,
    /// Its reply slot.
    pub slot: u32,
    /// Its TCP connection.
    pub conn_id: u64,
    /// Modify RPCs in flight granted at CONNECT (tags 1..=this, and one more for close).
    pub max_mod: u16,
    /// The namespace's `open_epoch` of its slot at CONNECT: moved on since, the client
    /// left or was evicted, and what it asked for before is not done.
    pub open_epoch: u64,
}

/// What the target knows of one client's tags (Lustre's per-export reply state).
#[derive(Default)]
struct ClientTags {
    /// Tag → xid of the modification executing on it now.
    executing: HashMap<u16, u64>,
    /// Highest `last_xid` the client sent: it has seen the reply of every xid at or
    /// below it, so a request with such an xid is a late duplicate.
    last_xid: u64,
}

/// One metadata target, its target layer (Lustre's mdt): exports and client slots,
/// reply reconstruction, in-flight tracking and dispatch, over the namespace layer.
pub struct Mdt {
    ns: Arc<Namespace>,
    exports: RwLock<HashMap<u64, Arc<Export>>>,
    clients: Mutex<ClientTable>,
    /// Per client slot: modifications executing now and the client's `last_xid`. The
    /// reply-record check of a resend and the in-flight check happen under this one
    /// lock, and a modification leaves `executing` only after its record is written, so
    /// a resend either finds its original executing (dropped: the original's reply is
    /// on the way) or finds its record (answered from it), never neither.
    tags: Mutex<HashMap<u32, ClientTags>>,
    stats: OpStats,
    /// The lock manager.
    ldlm: Arc<Ldlm>,
    /// Root squash (`root_squash`, `nosquash_nids`), applied to every request's
    /// credentials as it arrives.
    pub(crate) squash: RwLock<crate::squash::Squash>,
    /// `squash.on()`, read by every request without taking the lock.
    squash_on: AtomicBool,
    /// File locks (fcntl, flock).
    flocks: crate::flock::Flocks,
    /// Each client's callback channel, by slot: only a client with one gets locks.
    channels: Mutex<HashMap<u32, CallbackChannel>>,
    /// Seconds a called-back client may keep a lock before it is evicted.
    ldlm_timeout_s: AtomicU64,
    /// Itself, for parked operations that finish on another thread.
    me: Weak<Mdt>,
    /// Replay recovery after a restart, and the requests held until it ends.
    recovery: Mutex<Recovery>,
    /// Mirrors `recovery.st.active`, read on every request without the lock.
    in_recovery: AtomicBool,
    /// This start of the target (random): a client that sees it change knows the
    /// target restarted.
    instance: u64,
    /// `recovery_time_soft`, seconds.
    recovery_soft_s: AtomicU64,
    /// `recovery_time_hard`, seconds.
    recovery_hard_s: AtomicU64,
    /// `wal_flush_per_round`: hand the WAL to the OS before each round's replies, so
    /// that a crash of the MDS process alone loses nothing. Off by default: the WAL
    /// stays in the process until the commit thread syncs it, so a `kill -9` loses
    /// what a power cut loses, and clients replay it.
    wal_flush_per_round: AtomicBool,
    /// Set by a clean stop: no reply leaves any more (see [`Mdt::stop_cleanly`]).
    stopping: AtomicBool,
    /// Clients whose last connection closed, and since when: evicted (their open
    /// files closed, their file locks dropped) unless they come back within
    /// `evict_timeout`.
    vanished: Mutex<HashMap<u32, Instant>>,
    /// `evict_timeout`, seconds.
    evict_timeout_s: AtomicU64,
    /// Reads the inodes of directories being walked into the cache ahead.
    warmer: Arc<crate::warm::Warmer>,
}

/// A replay waiting for its turn in recovery.
struct Replay {
    inc: Incoming,
    exp: Arc<Export>,
    req: MdtRequest,
    d: Deferred,
}

type Recovery = lode_rpc::recovery::Recovery<Replay>;

/// `Cf::Server` keys `connected/<slot>` → UUID: clients connected now. Written (and
/// synced) before a client's first change is accepted, deleted once it has gone; the
/// ones found at start are the clients recovery waits for. A deletion reaches the disk
/// after every change the client made before it (one WAL), so a client found absent
/// has nothing uncommitted to replay.
const CONNECTED: &[u8] = b"connected/";

fn connected_key(slot: u32) -> Vec<u8> {
    let mut k = CONNECTED.to_vec();
    k.extend_from_slice(&slot.to_be_bytes());
    k
}

/// The clients the store says are connected: slot → UUID.
fn connected_clients(store: &MdtStore) -> Result<HashMap<u32, String>, StoreError> {
    let mut clients = HashMap::new();
    store
        .engine()
        .scan(Cf::Server, CONNECTED, CONNECTED, &mut |k, v| {
            if let Some(slot) = k
                .get(CONNECTED.len()..)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
            {
                clients.insert(
                    u32::from_be_bytes(slot),
                    String::from_utf8_lossy(v).into_owned(),
                );
            }
            true
        })?;
    Ok(clients)
}

struct ClientTable {
    by_uuid: HashMap<String, u32>,
    next_slot: u32,
    /// Slots below `next_slot` released by clients that disconnected: given again, so
    /// short-lived clients never use the table up.
    free: std::collections::BTreeSet<u32>,
}

impl Mdt {
    /// Opens the MDT over `store`: loads the known clients (their reply slots) and opens
    /// the namespace.
    pub fn open(cfg: MdtConfig, store: Arc<MdtStore>) -> Result<Arc<Mdt>, StoreError> {
        let mut by_uuid = HashMap::new();
        let mut next_slot = 0;
        let mut bad = None;
        store.engine().scan(Cf::Clients, b"", b"", &mut |k, v| {
            match records::decode::<ClientRec>("clients", v) {
                Ok(c) => {
                    next_slot = next_slot.max(c.slot + 1);
                    by_uuid.insert(String::from_utf8_lossy(k).into_owned(), c.slot);
                }
                Err(e) => bad = Some(e),
            }
            true
        })?;
        if let Some(e) = bad {
            return Err(e);
        }
        let expected = connected_clients(&store)?;
        let durable = store.last_transno();
        let st = RecState::new(expected, durable, Instant::now());
        let recovering = st.active;
        if recovering {
            info!(
                clients = st.expected.len(),
                last_transno = durable,
                "recovery: waiting for the clients connected when the target stopped"
            );
        }
        let ns = Namespace::open(cfg, store)?;
        let warmer = crate::warm::Warmer::start(&ns)
            .map_err(|e| StoreError::Engine(format!("cannot start cache warming: {e}")))?;
        let mdt = Arc::new_cyclic(|me| Mdt {
            ns,
            warmer,
            exports: RwLock::new(HashMap::new()),
            clients: Mutex::new(ClientTable {
                free: {
                    let used: std::collections::HashSet<u32> = by_uuid.values().copied().collect();
                    (0..next_slot).filter(|s| !used.contains(s)).collect()
                },
                by_uuid,
                next_slot,
            }),
            tags: Mutex::new(HashMap::new()),
            stats: OpStats::default(),
            ldlm: Ldlm::new(lode_base::limits::LOCKS_PER_CLIENT_MAX),
            squash: RwLock::new(crate::squash::Squash::default()),
            squash_on: AtomicBool::new(false),
            flocks: crate::flock::Flocks::default(),
            channels: Mutex::new(HashMap::new()),
            ldlm_timeout_s: AtomicU64::new(lode_base::limits::LDLM_TIMEOUT_DEFAULT_S),
            me: me.clone(),
            recovery: Mutex::new(Recovery::new(st)),
            in_recovery: AtomicBool::new(recovering),
            instance: rand::random::<u64>() | 1,
            recovery_soft_s: AtomicU64::new(lode_base::limits::RECOVERY_TIME_SOFT_DEFAULT_S),
            recovery_hard_s: AtomicU64::new(lode_base::limits::RECOVERY_TIME_HARD_DEFAULT_S),
            wal_flush_per_round: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            vanished: Mutex::new(HashMap::new()),
            evict_timeout_s: AtomicU64::new(lode_base::limits::EVICT_TIMEOUT_DEFAULT_S),
        });
        if !recovering {
            mdt.ns.clean_orphans().map_err(|e| match e {
                OpError::Store(e) => e,
                OpError::Errno(e) => StoreError::Engine(format!("cleaning orphans: {e}")),
            })?;
        } else {
            let weak = Arc::downgrade(&mdt);
            std::thread::Builder::new()
                .name("recovery".into())
                .spawn(move || recovery_timer(weak))
                .map_err(|e| StoreError::Engine(format!("cannot start recovery: {e}")))?;
        }
        let weak = Arc::downgrade(&mdt);
        std::thread::Builder::new()
            .name("ldlm-timer".into())
            .spawn(move || ldlm_timer(weak))
            .map_err(|e| StoreError::Engine(format!("cannot start the lock timer: {e}")))?;
        Ok(mdt)
    }

    /// The lock manager.
    pub fn ldlm(&self) -> &Arc<Ldlm> {
        &self.ldlm
    }

    /// `ldlm_timeout` in seconds.
    pub fn ldlm_timeout_s(&self) -> u64 {
        self.ldlm_timeout_s.load(Ordering::Relaxed)
    }

    /// Sets `ldlm_timeout` (seconds, ≥ 1).
    pub fn set_ldlm_timeout_s(&self, s: u64) {
        self.ldlm_timeout_s.store(s.max(1), Ordering::Relaxed);
    }

    /// Evicts the client in `slot`: its locks, callback channel, exports and open
    /// handles go; its next request is refused (ENOTCONN) and it reconnects afresh.
    fn evict(&self, slot: u32, why: &str) {
        let uuid = self.uuid_of(slot);
        warn!(client = %uuid, slot, "evicting client: {why}");
        // An empty callback: every lock of yours is gone, drop what they covered.
        if let Some(ch) = self.channels.lock().remove(&slot) {
            ch.send(&Request::LdlmBlCallback(LdlmCancelReq {
                handles: Vec::new(),
            }));
        }
        self.exports.write().retain(|_, e| e.slot != slot);
        self.ns.close_all_of(slot);
        self.ldlm.evict(slot);
        self.send_grants(self.flocks.drop_client(slot));
    }

    /// The UUID of the client in `slot` (empty if none).
    fn uuid_of(&self, slot: u32) -> String {
        self.clients
            .lock()
            .by_uuid
            .iter()
            .find(|(_, s)| **s == slot)
            .map(|(u, _)| u.clone())
            .unwrap_or_default()
    }

    /// Evicts the clients that vanished (connection closed, no DISCONNECT) longer
    /// than `evict_timeout` ago: what they held open is closed, their file locks go.
    fn evict_vanished(&self) {
        let timeout = Duration::from_secs(self.evict_timeout_s.load(Ordering::Relaxed));
        let gone: Vec<u32> = {
            let mut v = self.vanished.lock();
            let gone: Vec<u32> = v
                .iter()
                .filter(|(_, t)| t.elapsed() >= timeout)
                .map(|(s, _)| *s)
                .collect();
            for s in &gone {
                v.remove(s);
            }
            gone
        };
        for slot in gone {
            self.evict(
                slot,
                &format!("gone without a goodbye for {}s", timeout.as_secs()),
            );
        }
    }

    /// `mdt.*.evict_client=UUID`: evicts that client now (its connection is dropped,
    /// its open files closed, its locks gone; it reconnects as if new).
    pub fn evict_client(&self, uuid: &str) -> Result<(), String> {
        let slot = self
            .clients
            .lock()
            .by_uuid
            .get(uuid)
            .copied()
            .ok_or_else(|| format!("No such file or directory: no client {uuid}"))?;
        self.vanished.lock().remove(&slot);
        self.evict(slot, "by the administrator");
        // Recovery does not wait for it either.
        let recovering = {
            let mut r = self.recovery.lock();
            r.st.give_up_on(slot);
            r.st.active
        };
        if recovering {
            self.recover();
        }
        Ok(())
    }

    /// `evict_timeout` (seconds).
    pub fn evict_timeout_s(&self) -> u64 {
        self.evict_timeout_s.load(Ordering::Relaxed)
    }

    /// Sets `evict_timeout`.
    pub fn set_evict_timeout_s(&self, s: u64) {
        self.evict_timeout_s.store(s, Ordering::Relaxed);
    }

    /// Tells waiting clients their file locks are granted (or their waits over); a
    /// client that cannot be told is evicted (its grant would be held by nobody).
    fn send_grants(&self, grants: Vec<crate::flock::Grant>) {
        for g in grants {
            let ch = self.channels.lock().get(&g.slot).cloned();
            let req = Request::FlockGranted(lode_proto::FlockGrantedReq {
                fid: g.fid,
                owner: g.owner,
                granted: g.granted,
            });
            if ch.is_some_and(|ch| ch.send(&req)) {
                self.stats.record(Opcode::FlockGranted, 0);
            } else if g.granted {
                self.evict(
                    g.slot,
                    "a file lock it waited for could not be handed to it",
                );
            }
        }
    }

    /// Whether a request asks for locks with its reply and its client can be called
    /// back (only then may it cache).
    fn intent(&self, inc: &Incoming, exp: &Export) -> bool {
        inc.header.flags & lode_proto::frame::FLAG_INTENT != 0 && self.reachable(exp.slot)
    }

    /// Whether the client in `slot` can be called back: only such a client gets locks
    /// (a client that cannot be called back must not cache).
    fn reachable(&self, slot: u32) -> bool {
        self.channels.lock().get(&slot).is_some_and(|c| !c.broken())
    }

    /// A PR lock with `bits` on `res` for a client, if it can be granted at once; 0 if
    /// not (the client then does not cache what it would cover).
    fn grant_pr(&self, exp: &Export, res: ResId, bits: u8) -> u64 {
        self.ldlm
            .grant(exp.slot, res, LockMode::Pr, bits)
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// A PR UPDATE|PERM lock on an object's attributes for a client (see `grant_pr`),
    /// unless the object is contended ([`ldlm::Ldlm::grant_uncontended`]): then the
    /// client reads its attributes again next time rather than being called back at
    /// the next change by another client.
    fn grant_attrs(&self, exp: &Export, fid: lode_base::Fid) -> u64 {
        self.ldlm
            .grant_uncontended(
                exp.slot,
                ResId::object(fid),
                LockMode::Pr,
                ldlm::bits::UPDATE | ldlm::bits::PERM,
            )
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// The PR LAYOUT lock an open holds for its handle's life (see
    /// `CreateRep::layout_lock`): a regular file's only.
    fn grant_layout(&self, exp: &Export, rep: &mut lode_proto::CreateRep) {
        let Some(handle) = rep.handle else { return };
        if rep.body.layout.is_none() || !self.reachable(exp.slot) {
            return;
        }
        let fid = rep.body.attr.fid;
        let lock = self.grant_pr(exp, ResId::object(fid), ldlm::bits::LAYOUT);
        if lock == 0 {
            return;
        }
        // The layout as of the grant: a swap between the open's read and the grant
        // did not call this lock back.
        match self.ns.inode(fid) {
            Ok(rec) => rep.body.layout = rec.layout,
            Err(_) => {
                self.ungrant(exp, lock);
                return;
            }
        }
        self.ns.set_open_lock(handle, lock);
        rep.layout_lock = lock;
    }

    /// The PR OPEN lock a read-only open of a regular file asked for (see
    /// `CreateRep::open_lock`). Never for a file already unlinked: the client would
    /// keep its handle, and so the file, until it gave the lock back; an unlink after
    /// the grant calls the lock back.
    fn grant_open(&self, exp: &Export, flags: u32, rep: &mut lode_proto::CreateRep) {
        if rep.handle.is_none()
            || !lode_base::perm::plain_read(flags as i32)
            || rep.body.attr.ftype() != lode_base::FileType::Regular
            || !self.reachable(exp.slot)
        {
            return;
        }
        let fid = rep.body.attr.fid;
        let lock = self.grant_pr(exp, ResId::object(fid), ldlm::bits::OPEN);
        if lock != 0 && !self.ns.inode(fid).is_ok_and(|i| i.nlink > 0) {
            self.ungrant(exp, lock);
            return;
        }
        rep.open_lock = lock;
    }

    /// A readdir page (a READDIR's, or the first one an opendir asks for), with locks
    /// if it is a readdir+ with an intent.
    fn readdir_reply(
        &self,
        inc: &Incoming,
        exp: &Export,
        r: &lode_proto::ReaddirReq,
    ) -> OpResult<ReaddirRep> {
        if r.cookie == lode_base::hash::DOT_COOKIE {
            // Read from its start: about to be walked.
            self.warmer.request(r.fid);
        }
        if r.plus && self.intent(inc, exp) {
            self.readdir_locked(exp, r)
        } else {
            self.ns
                .readdir(&r.cred, r.fid, r.cookie, r.plus, r.count as usize)
        }
    }

    /// A readdir+ page with locks: each entry's name (PR LOOKUP) and attributes (PR
    /// UPDATE|PERM), so the client may keep what `ls -l` reads. The names are read
    /// while the MDT holds the directory in PR (no change of its entries can be under
    /// way), and each entry's attributes after its lock is granted (a change after
    /// that calls the client back). With a change of the directory under way, the page
    /// comes without locks.
    fn readdir_locked(&self, exp: &Export, r: &lode_proto::ReaddirReq) -> OpResult<ReaddirRep> {
        use ldlm::bits::{LOOKUP, UPDATE};
        let frozen = [(ResId::object(r.fid), LockMode::Pr, UPDATE)];
        let Some(held) = self.ldlm.try_acquire(&frozen) else {
            return self
                .ns
                .readdir(&r.cred, r.fid, r.cookie, true, r.count as usize);
        };
        let mut page = self
            .ns
            .readdir(&r.cred, r.fid, r.cookie, false, r.count as usize)?;
        // Every entry's locks first, then the attributes they cover, read together.
        let locks: Vec<(u64, u64)> = page
            .entries
            .iter()
            .map(|e| {
                if e.name == b"." || e.name == b".." {
                    (0, 0)
                } else {
                    (
                        self.grant_pr(exp, ResId::name(r.fid, &e.name), LOOKUP),
                        self.grant_attrs(exp, e.fid),
                    )
                }
            })
            .collect();
        let fids: Vec<Fid> = page.entries.iter().map(|e| e.fid).collect();
        let bodies = self.ns.getattr_many(&fids);
        for ((e, body), (name_lock, lock)) in page.entries.iter_mut().zip(bodies).zip(locks) {
            e.body = match body {
                Ok(mut b) => {
                    (b.name_lock, b.lock) = (name_lock, lock);
                    self.own_writes(exp, &mut b);
                    Some(Box::new(b))
                }
                Err(_) => {
                    self.ungrant(exp, name_lock);
                    self.ungrant(exp, lock);
                    None
                }
            };
        }
        drop(held);
        Ok(page)
    }

    /// Takes back a lock granted for a reply that fails.
    fn ungrant(&self, exp: &Export, handle: u64) {
        if handle != 0 {
            self.ldlm.cancel(exp.slot, handle);
        }
    }

    /// Sends blocking callbacks, one per client; a client that cannot be reached is
    /// evicted at once.
    fn call_back(&self, cbs: &[ldlm::Callback]) {
        let mut by_slot: HashMap<u32, Vec<u64>> = HashMap::new();
        for c in cbs {
            by_slot.entry(c.slot).or_default().push(c.handle);
        }
        for (slot, handles) in by_slot {
            let ch = self.channels.lock().get(&slot).cloned();
            let sent = ch.is_some_and(|ch| {
                handles
                    .chunks(lode_base::limits::LOCKS_PER_RPC_MAX)
                    .all(|h| {
                        ch.send(&Request::LdlmBlCallback(LdlmCancelReq {
                            handles: h.to_vec(),
                        }))
                    })
            });
            if sent {
                self.stats.record(Opcode::LdlmBlCallback, 0);
            } else {
                self.evict(slot, "its callback channel is gone");
            }
        }
    }

    /// File locks (fcntl) held now.
    pub fn flock_count(&self) -> usize {
        self.flocks.held()
    }

    /// The namespace layer.
    pub fn ns(&self) -> &Arc<Namespace> {
        &self.ns
    }

    /// The store.
    pub fn store(&self) -> &Arc<MdtStore> {
        &self.ns.store
    }

    /// The config.
    pub fn config(&self) -> &MdtConfig {
        &self.ns.cfg
    }

    /// Tunables.
    pub fn tun(&self) -> &Tunables {
        &self.ns.tun
    }

    /// Client slots held: one per client UUID the target keeps records for (connected
    /// or expected back), freed when a client disconnects cleanly or is evicted.
    pub fn client_slots(&self) -> usize {
        self.clients.lock().by_uuid.len()
    }

    /// Number of connected clients.
    pub fn export_count(&self) -> usize {
        self.exports.read().len()
    }

    /// Number of open handles.
    pub fn open_count(&self) -> usize {
        self.ns.open_count()
    }

    /// `open_handles`: a line per open handle, its client's UUID (empty once the
    /// client is forgotten), slot, FID, handle and access (Lustre's
    /// `mdt.*.exports.*.open_files`, in one list).
    pub fn open_handles_text(&self) -> String {
        let uuids: HashMap<u32, String> = self
            .clients
            .lock()
            .by_uuid
            .iter()
            .map(|(u, &s)| (s, u.clone()))
            .collect();
        let mut out = String::new();
        for (slot, h, fid, write) in self.ns.open_handles() {
            let uuid = uuids.get(&slot).map_or("", String::as_str);
            let mode = if write { "w" } else { "r" };
            out.push_str(&format!(
                "client={uuid} slot={slot} fid={fid} handle={h:#x} mode={mode}\n"
            ));
        }
        out
    }

    /// Updates the OST table from the MGS config.
    pub fn set_osts(&self, osts: Vec<OstState>) {
        self.ns.set_osts(osts);
    }

    /// OSTs as the MDS sees them.
    pub fn osts(&self) -> Vec<OstState> {
        self.ns.osts()
    }

    /// Starts the background work: OST table refresh, OST statfs, object destroy.
    pub fn start_background(&self, rt: tokio::runtime::Handle, mgs: Arc<lode_rpc::Import>) {
        self.ns.start_background(rt, mgs);
    }

    fn connect(&self, inc: &Incoming, req: ConnectReq) -> Result<ConnectRep, OpError> {
        if req.fsname != self.ns.cfg.fsname {
            warn!(peer = %inc.peer, "refusing connect for file system {:?}", req.fsname);
            return Err(Errno::EINVAL.into());
        }
        if req.target != self.ns.cfg.target_name() {
            warn!(peer = %inc.peer, "refusing connect for target {:?}", req.target);
            return Err(Errno::ENODEV.into());
        }
        if !inc.verify_handshake(&self.ns.cfg.key, &req.client_uuid, &req.target, &req.auth) {
            return Err(Errno::EACCES.into());
        }
        if req.client_uuid.is_empty() || req.client_uuid.len() > 64 {
            return Err(Errno::EINVAL.into());
        }
        // Held to the end: a connect and the disconnect of the same client's old
        // connection must not interleave their `connected/` writes.
        let mut ct = self.clients.lock();
        let slot = {
            let known = ct.by_uuid.get(&req.client_uuid).copied();
            {
                let mut rec = self.recovery.lock();
                if rec.st.active {
                    match known {
                        Some(s) if rec.st.expects(s) => {
                            rec.st.connected.insert(s);
                            // It replays (again, after a reconnect) and says when done.
                            rec.st.done.remove(&s);
                        }
                        _ => {
                            debug!(peer = %inc.peer, client = %req.client_uuid, "connect refused during recovery: try again");
                            return Err(Errno::EAGAIN.into());
                        }
                    }
                }
            }
            match known {
                Some(s) => s,
                None => {
                    let reuse = ct.free.first().copied();
                    if reuse.is_none() && ct.next_slot >= lode_base::limits::CLIENTS_MAX {
                        return Err(Errno::ENOSPC.into());
                    }
                    let slot = reuse.unwrap_or(ct.next_slot);
                    let mut b = Batch::new();
                    b.put(
                        Cf::Clients,
                        req.client_uuid.as_bytes().to_vec(),
                        records::encode(&ClientRec { slot }),
                    );
                    self.ns.store.apply_untracked(&b)?;
                    if reuse.is_some() {
                        ct.free.remove(&slot);
                    } else {
                        ct.next_slot += 1;
                    }
                    ct.by_uuid.insert(req.client_uuid.clone(), slot);
                    slot
                }
            }
        };
        self.mark_connected(slot, &req.client_uuid)?;
        self.vanished.lock().remove(&slot);
        let handle = loop {
            let h: u64 = rand::random();
            if h != 0 && !self.exports.read().contains_key(&h) {
                break h;
            }
        };
        let max_mod = (self.ns.tun.max_mod_rpcs.load(Ordering::Relaxed) as u16)
            .min(req.max_mod_rpcs)
            .max(1);
        let mut exports = self.exports.write();
        // One export per connection: a second CONNECT on it replaces the first.
        let before = exports.len();
        exports.retain(|_, e| e.conn_id != inc.conn_id);
        if exports.len() != before {
            warn!(peer = %inc.peer, client = %req.client_uuid, "CONNECT again on one connection: the earlier export is replaced");
        }
        exports.insert(
            handle,
            Arc::new(Export {
                uuid: req.client_uuid.clone(),
                slot,
                conn_id: inc.conn_id,
                max_mod,
                open_epoch: self.ns.open_epoch(slot),
            }),
        );
        drop(exports);
        drop(ct);
        let recovering = self.in_recovery.load(Ordering::Acquire);
        info!(client = %req.client_uuid, slot, peer = %inc.peer, recovering, "client connected");
        Ok(ConnectRep {
            handle,
            flags: req.flags & CONNECT_SUPPORTED,
            max_mod_rpcs: max_mod,
            target_uuid: self.ns.cfg.uuid.clone(),
            index: self.ns.cfg.index,
            instance: self.instance,
            recovering,
        })
    }

    /// Records (durably, before any of its changes) that `slot` is connected.
    fn mark_connected(&self, slot: u32, uuid: &str) -> Result<(), StoreError> {
        let key = connected_key(slot);
        if self.ns.store.engine().get(Cf::Server, &key)?.is_some() {
            return Ok(());
        }
        let mut b = Batch::new();
        b.put(Cf::Server, key, uuid.as_bytes().to_vec());
        self.ns.store.apply_untracked(&b)?;
        self.ns.store.engine().sync()
    }

    /// The client in `slot` has no connection left (unless another is still up): a
    /// restart need not wait for it. Everything it changed was written before this,
    /// so it reaches the disk first. `goodbye` (its UUID, on DISCONNECT): it will
    /// resend nothing, so its slot, client record and reply records go too, and the
    /// slot is free for a new client; else it has vanished, and is evicted if it does
    /// not come back within `evict_timeout`.
    fn forget_connection(&self, slot: u32, goodbye: Option<&str>) -> Result<(), StoreError> {
        let mut ct = self.clients.lock();
        if self.exports.read().values().any(|e| e.slot == slot) {
            return Ok(());
        }
        let mut b = Batch::new();
        b.delete(Cf::Server, connected_key(slot));
        if let Some(uuid) = goodbye {
            b.delete(Cf::Clients, uuid.as_bytes().to_vec());
            self.ns.store.delete_replies(&mut b, slot)?;
        }
        // With a transno, so a commit covers it even if nothing else changes.
        self.ns.store.apply(b, None)?;
        match goodbye {
            Some(uuid) => {
                if ct.by_uuid.remove(uuid).is_some() {
                    ct.free.insert(slot);
                }
                self.vanished.lock().remove(&slot);
                self.tags.lock().remove(&slot);
            }
            None => {
                self.vanished.lock().insert(slot, Instant::now());
            }
        }
        Ok(())
    }

    /// `slot` has no connection left: [`Mdt::forget_connection`], committed now rather
    /// than at the next interval (a restart meanwhile would wait for it in vain).
    fn mark_gone(&self, slot: u32) {
        if let Err(e) = self.forget_connection(slot, None) {
            warn!(slot, "cannot record a client's departure: {e}");
            return;
        }
        self.ns.store.when_committed(Box::new(|_| {}));
    }

    /// SYNC: answered once everything applied so far is committed. Parked, so the
    /// service thread goes on with other requests while the commit runs.
    fn sync(&self, inc: &Incoming) -> Outgoing {
        // Access times too: a sync leaves nothing the MDT holds only in memory.
        self.ns.flush_atimes();
        let Some(d) = inc.defer() else {
            return match self.ns.store.sync() {
                Ok(c) => sync_out(c),
                Err(e) => self.error_out(OpError::Store(e)),
            };
        };
        self.ns.store.when_committed(Box::new(move |r| {
            d.send(match r {
                Ok(c) => sync_out(c),
                Err(e) => {
                    warn!("sync failed: {e}");
                    Outgoing::error(Errno::EIO)
                }
            })
        }));
        Outgoing::parked()
    }

    /// Runs one request; `sub` is 0, or k + 1 for sub-request k of a batch (whose
    /// reply record is its own).
    fn dispatch(
        &self,
        inc: &Incoming,
        exp: &Export,
        req: MdtRequest,
        sub: u16,
    ) -> OpResult<(Reply, u64)> {
        let replay = inc.header.flags & FLAG_REPLAY != 0;
        let slot = (inc.header.tag != 0).then_some(ReplySlot {
            slot: exp.slot,
            tag: inc.header.tag,
            xid: inc.header.xid,
            replay_transno: if replay { inc.header.transno } else { 0 },
            sub,
        });
        let ctx = Ctx {
            slot,
            open_handle: (replay && inc.header.last_xid != 0).then_some(inc.header.last_xid),
            replay,
            open_epoch: Some(exp.open_epoch),
        };
        Ok(match req {
            MdtRequest::Ping(_) => (Reply::Ping(Empty {}), 0),
            MdtRequest::Disconnect(_) => {
                self.exports.write().remove(&inc.header.handle);
                self.ns.close_all_of(exp.slot);
                self.channels.lock().remove(&exp.slot);
                self.ldlm.evict(exp.slot);
                self.send_grants(self.flocks.drop_client(exp.slot));
                self.forget_connection(exp.slot, Some(&exp.uuid))?;
                // On disk before the answer (as Lustre's client slot release): a
                // client that said goodbye is never waited for after a crash.
                self.ns.store.sync()?;
                (Reply::Disconnect(Empty {}), 0)
            }
            MdtRequest::Statfs(_) => (Reply::Statfs(self.ns.statfs()?), 0),
            MdtRequest::SeqAlloc(_) => (Reply::SeqAlloc(self.ns.seq_alloc()?), 0),
            // Parked in `handle` before dispatch.
            MdtRequest::Sync(_) => return Err(Errno::EPROTO.into()),
            MdtRequest::Getattr(r) => {
                check_cred(&r.cred)?;
                if !self.intent(inc, exp) {
                    return Ok((Reply::Getattr(self.ns.getattr(r.fid)?), 0));
                }
                // The lock first, then the read: what the reply says is what the lock
                // covers (a change after the grant has to call it back).
                let lock = self.grant_attrs(exp, r.fid);
                let mut b = self
                    .ns
                    .getattr(r.fid)
                    .inspect_err(|_| self.ungrant(exp, lock))?;
                b.lock = lock;
                self.own_writes(exp, &mut b);
                (Reply::Getattr(b), 0)
            }
            MdtRequest::Lookup(r) => {
                check_cred(&r.cred)?;
                if !self.intent(inc, exp) || matches!(&r.name[..], b"." | b"..") {
                    return Ok((
                        Reply::Lookup(self.ns.lookup(&r.cred, r.parent, &r.name)?),
                        0,
                    ));
                }
                // The directory's permissions (the search check) and the name, locked
                // before they are read.
                let dir_lock = self.grant_pr(exp, ResId::object(r.parent), ldlm::bits::PERM);
                let name_lock =
                    self.grant_pr(exp, ResId::name(r.parent, &r.name), ldlm::bits::LOOKUP);
                // The name's lock before resolving it, the object's before reading it.
                let child = self
                    .ns
                    .lookup_fid(&r.cred, r.parent, &r.name)
                    .inspect_err(|_| {
                        self.ungrant(exp, name_lock);
                        self.ungrant(exp, dir_lock);
                    })?;
                let lock = self.grant_attrs(exp, child);
                let mut b = self.ns.getattr(child).inspect_err(|_| {
                    for h in [lock, name_lock, dir_lock] {
                        self.ungrant(exp, h);
                    }
                })?;
                (b.lock, b.name_lock, b.dir_lock) = (lock, name_lock, dir_lock);
                self.own_writes(exp, &mut b);
                (Reply::Lookup(b), 0)
            }
            MdtRequest::Readdir(r) => {
                check_cred(&r.cred)?;
                (Reply::Readdir(self.readdir_reply(inc, exp, &r)?), 0)
            }
            MdtRequest::Batch(r) => (Reply::Batch(self.batch_reads(inc, exp, r)?), 0),
            // Admitted and run by `modify`.
            MdtRequest::BatchModify(_) => return Err(Errno::EPROTO.into()),
            MdtRequest::Create(r) => {
                check_cred(&r.cred)?;
                let (mut rep, t) = self.ns.create(&ctx, exp.slot, r)?;
                self.grant_layout(exp, &mut rep);
                (Reply::Create(rep), t)
            }
            MdtRequest::Open(r) => {
                check_cred(&r.cred)?;
                // A read-only open with an intent: the attributes lock first, then the
                // open's read of the inode and of its read-on-open bytes, which the
                // lock then covers (the next open for writing calls it back).
                // Contention does not stop it while nobody writes the file: the lock
                // then vouches for the pages its reader caches (see
                // `MdtBody::written`), and only an open for writing calls it back.
                let lock = if !self.intent(inc, exp) || lode_base::perm::wants_write(r.flags as i32)
                {
                    0
                } else if self.ns.being_written(r.fid) {
                    self.grant_attrs(exp, r.fid)
                } else {
                    self.grant_pr(
                        exp,
                        ResId::object(r.fid),
                        ldlm::bits::UPDATE | ldlm::bits::PERM,
                    )
                };
                let (mut rep, t) = self
                    .ns
                    .open_fid(&ctx, exp.slot, &r.cred, r.fid, r.flags, r.cached)
                    .inspect_err(|_| self.ungrant(exp, lock))?;
                // Only a file's: a directory's, held by every client that lists it,
                // would be called back by each create in it.
                if lock != 0 && rep.body.attr.ftype() != lode_base::FileType::Regular {
                    self.ungrant(exp, lock);
                } else {
                    rep.body.lock = lock;
                    self.own_writes(exp, &mut rep.body);
                }
                self.grant_layout(exp, &mut rep);
                if r.open_lock {
                    self.grant_open(exp, r.flags, &mut rep);
                }
                // After the reply record was written (the page is not kept in it).
                if let Some(p) = r.first_page.filter(|_| rep.body.attr.is_dir()) {
                    let rr = lode_proto::ReaddirReq {
                        cred: r.cred.clone(),
                        fid: r.fid,
                        cookie: lode_base::hash::DOT_COOKIE,
                        plus: p.plus,
                        count: p.count,
                    };
                    rep.dir_page = self.readdir_reply(inc, exp, &rr).ok();
                }
                (Reply::Open(rep), t)
            }
            MdtRequest::Close(r) => {
                let lock = self.ns.open_lock(r.handle);
                let closed = self.ns.close(&ctx, exp.slot, &r);
                self.ungrant(exp, lock);
                let (rep, t) = closed?;
                (Reply::Close(rep), t)
            }
            MdtRequest::Migrate(r) => {
                check_cred(&r.cred)?;
                let (rep, t) = self.ns.migrate(&ctx, exp.slot, &r)?;
                (Reply::Migrate(rep), t)
            }
            MdtRequest::Unlink(r) => {
                check_cred(&r.cred)?;
                (
                    Reply::Unlink(UnlinkRep::default()),
                    self.ns.unlink(&ctx, &r.cred, r.parent, &r.name, r.rmdir)?,
                )
            }
            MdtRequest::Rename(r) => {
                check_cred(&r.cred)?;
                (
                    Reply::Rename(lode_proto::RenameRep::default()),
                    self.ns.rename(&ctx, &r)?,
                )
            }
            MdtRequest::Link(r) => {
                check_cred(&r.cred)?;
                let (body, t) = self.ns.link(&ctx, &r.cred, r.fid, r.parent, &r.name)?;
                (Reply::Link(lode_proto::LinkRep { body, parent: None }), t)
            }
            MdtRequest::Setattr(r) => {
                check_cred(&r.cred)?;
                let through = (r.handle != 0).then_some((exp.slot, r.handle));
                let (b, t) =
                    self.ns
                        .setattr(&ctx, &r.cred, r.fid, &r.attr, r.opened_for_write, through)?;
                (Reply::Setattr(b), t)
            }
            MdtRequest::Getxattr(r) => {
                check_cred(&r.cred)?;
                (
                    Reply::Getxattr(self.ns.getxattr(&r.cred, r.fid, &r.name, r.size)?),
                    0,
                )
            }
            MdtRequest::Listxattr(r) => {
                check_cred(&r.cred)?;
                (
                    Reply::Listxattr(self.ns.listxattr(&r.cred, r.fid, r.size)?),
                    0,
                )
            }
            MdtRequest::Setxattr(r) => {
                check_cred(&r.cred)?;
                let value = r.value.map(|v| v.into_vec());
                (
                    Reply::Setxattr(Empty {}),
                    self.ns
                        .setxattr(&ctx, &r.cred, r.fid, &r.name, value, r.flags)?,
                )
            }
            MdtRequest::DomRead(r) => (
                Reply::DomRead(lode_proto::DataRep {
                    data: self.ns.dom_read(r.fid, r.offset, r.len)?,
                }),
                0,
            ),
            MdtRequest::DomSeek(r) => (
                Reply::DomSeek(self.ns.dom_seek(r.fid, r.offset, r.hole)?),
                0,
            ),
            MdtRequest::DomWrite(r) => {
                // A write kept back under a write-back lock lets it go once it is
                // recorded (`Mdt::execute_modify`).
                let (rep, t) = self.ns.dom_write(&ctx, exp.slot, &r)?;
                (Reply::DomWrite(rep), t)
            }
            MdtRequest::LayoutIntent(r) => {
                let (b, t) = self.ns.layout_intent(&ctx, exp.slot, &r)?;
                (Reply::LayoutIntent(b), t)
            }
            MdtRequest::LdlmCallbackChannel(r) => {
                // On a keyed file system only the export's own client may take its
                // callbacks (they say what it must forget).
                let target = self.ns.cfg.target_name();
                if !inc.verify_handshake(&self.ns.cfg.key, &exp.uuid, &target, &r.auth) {
                    return Err(Errno::EACCES.into());
                }
                let ch = inc.callback_channel().ok_or(Errno::EINVAL)?;
                self.channels.lock().insert(exp.slot, ch);
                (Reply::LdlmCallbackChannel(Empty {}), 0)
            }
            MdtRequest::LdlmEnqueue(r) => {
                let mode = LockMode::from_wire(r.mode).ok_or(Errno::EINVAL)?;
                if r.bits & !ldlm::bits::ALL != 0 || r.bits == 0 {
                    return Err(Errno::EINVAL.into());
                }
                let res = ResId {
                    fid: r.fid,
                    hash: r.hash,
                };
                let handle = if self.reachable(exp.slot) {
                    self.ldlm.grant(exp.slot, res, mode, r.bits)?
                } else {
                    None
                };
                (Reply::LdlmEnqueue(LdlmEnqueueRep { handle }), 0)
            }
            MdtRequest::Flock(r) => {
                let (rep, grants) = self
                    .flocks
                    .request(exp.slot, &r, self.reachable(exp.slot))?;
                self.send_grants(grants);
                (Reply::Flock(rep), 0)
            }
            MdtRequest::LdlmCancel(r) => {
                if r.handles.len() > lode_base::limits::LOCKS_PER_RPC_MAX {
                    return Err(Errno::EPROTO.into());
                }
                self.cancel(exp, &r.handles);
                (Reply::LdlmCancel(Empty {}), 0)
            }
            MdtRequest::CloseAhead(r) => {
                if r.handles.len() + r.written.len() > lode_base::limits::CLOSES_AHEAD_MAX {
                    return Err(Errno::EPROTO.into());
                }
                let (locks, skipped) = self.ns.close_ahead(exp.slot, &r.handles, &r.written);
                for lock in locks {
                    self.ungrant(exp, lock);
                }
                if skipped > 0 {
                    debug!(client = %exp.uuid, skipped, "close ahead of handles it has not open: ignored");
                }
                (Reply::CloseAhead(Empty {}), 0)
            }
            MdtRequest::AccessAhead(r) => {
                if r.items.len() > lode_base::limits::ACCESS_AHEAD_MAX {
                    return Err(Errno::EPROTO.into());
                }
                let skipped = self.ns.access_ahead(exp.slot, &r.items);
                if skipped > 0 {
                    debug!(client = %exp.uuid, skipped, "access times of handles it has not open: ignored");
                }
                (Reply::AccessAhead(Empty {}), 0)
            }
            MdtRequest::Connect(_) => return Err(Errno::EALREADY.into()),
        })
    }
}

/// What a create with an intent hands its client locks on (see
/// `Mdt::grant_created`).
struct Created {
    parent: Fid,
    name: Vec<u8>,
    /// The FID asked for, if the creator asked for a write-back lock on it.
    writeback: Option<Fid>,
}

/// The MDT's own PW DOM locks on `fids`, which wait for (and call back) every
/// client's write-back lock on them.
fn dom_wants(fids: &[Fid]) -> Vec<Want> {
    fids.iter()
        .map(|f| (ResId::object(*f), LockMode::Pw, ldlm::bits::DOM))
        .collect()
}

/// Whether a create makes a file with no name (`O_TMPFILE`).
fn is_tmpfile(r: &lode_proto::CreateReq) -> bool {
    r.open_flags
        .is_some_and(|f| lode_base::perm::is_tmpfile(f as i32))
}

/// Whether a modification's locks depend on what a name points to now (so they must
/// be checked again once held).
fn looks_up(req: &MdtRequest) -> bool {
    match req {
        MdtRequest::Unlink(_) | MdtRequest::Rename(_) | MdtRequest::Close(_) => true,
        MdtRequest::Create(r) => r.open_flags.is_some(),
        _ => false,
    }
}

/// How often a modification re-chooses its locks when the names they depend on change
/// while it waits.
const LOCK_RETRIES: usize = 4;

impl Mdt {
    /// A request while recovery runs: a replay is queued for its turn, anything else
    /// waits for the end (a client's final PING, flagged `FLAG_REPLAY_DONE`, among
    /// them). `Err` gives the request back if recovery ended meanwhile.
    fn during_recovery(
        &self,
        inc: &Incoming,
        exp: &Arc<Export>,
        req: MdtRequest,
    ) -> Result<Outgoing, Box<MdtRequest>> {
        let replay = inc.header.flags & FLAG_REPLAY != 0
            && Opcode::from_u16(inc.header.opcode).is_some_and(|o| o.is_modify());
        if let MdtRequest::Flock(r) = &req {
            if inc.header.flags & FLAG_REPLAY != 0 && self.recovery.lock().st.active {
                return Ok(self.replay_flock(exp, r));
            }
        }
        let Some(d) = inc.defer() else {
            return Ok(self.error_out(Errno::EAGAIN.into()));
        };
        {
            let mut rec = self.recovery.lock();
            if !rec.st.active {
                return Err(Box::new(req));
            }
            let again = d.request(inc.body.clone(), inc.peer, inc.conn_id);
            if replay {
                let (xid, transno) = (inc.header.xid, inc.header.transno);
                let r = Replay {
                    inc: again,
                    exp: exp.clone(),
                    req,
                    d,
                };
                // A replay sent twice (its client reconnected): the newer one waits.
                drop(rec.st.queue(exp.slot, xid, transno, r));
            } else {
                if matches!(req, MdtRequest::Ping(_))
                    && inc.header.flags & FLAG_REPLAY_DONE != 0
                    && rec.st.expects(exp.slot)
                {
                    rec.st.done.insert(exp.slot);
                }
                rec.held.push((again, d));
            }
        }
        self.recover();
        Ok(Outgoing::parked())
    }

    /// A file lock a recovering client held before the restart: held again at once
    /// (nothing else can take locks until recovery ends, and a lock depends on no
    /// replay: it names a FID, which needs not exist yet).
    fn replay_flock(&self, exp: &Export, r: &lode_proto::FlockReq) -> Outgoing {
        match self.flocks.replay(exp.slot, r) {
            Ok(conflict) => {
                if conflict {
                    warn!(client = %exp.uuid, fid = %r.fid, "replayed file lock conflicts with another client's: both held");
                }
                self.recovery.lock().st.locks_replayed += 1;
                Outgoing {
                    body: Reply::Flock(lode_proto::FlockRep {
                        granted: true,
                        queued: false,
                        conflict: None,
                    })
                    .encode(),
                    last_committed: self.ns.store.last_committed(),
                    ..Default::default()
                }
            }
            Err(e) => {
                warn!(client = %exp.uuid, fid = %r.fid, "replayed file lock refused: {e}");
                self.error_out(e.into())
            }
        }
    }

    /// Moves recovery on as far as it can now: runs the replays whose turn it is,
    /// evicts clients past the windows, and at the end serves what was held.
    pub(crate) fn recover(&self) {
        loop {
            let soft = Duration::from_secs(self.recovery_soft_s.load(Ordering::Relaxed));
            let hard = Duration::from_secs(self.recovery_hard_s.load(Ordering::Relaxed));
            let next = self.recovery.lock().st.next(Instant::now(), soft, hard);
            match next {
                Next::Wait => return,
                Next::Done(r) => {
                    let t = r.inc.header.transno;
                    self.recovery.lock().st.ran(r.exp.slot, r.inc.header.xid, t);
                    // A committed open its client still holds: registered again.
                    let handle = r.inc.header.last_xid;
                    let status = match &r.req {
                        MdtRequest::Open(o) if handle != 0 => {
                            match self.ns.reopen(r.exp.slot, o.fid, o.flags, handle) {
                                Ok(()) => 0,
                                Err(e) => {
                                    let out = self.error_out(e);
                                    warn!(client = %r.exp.uuid, fid = %o.fid, "reopen in recovery failed: {}", Errno::from_status(out.status));
                                    out.status
                                }
                            }
                        }
                        _ => 0,
                    };
                    r.d.send(Outgoing {
                        status,
                        transno: if status == 0 { t } else { 0 },
                        last_committed: self.ns.store.last_committed(),
                        ..Default::default()
                    });
                }
                Next::Run(r) => {
                    let Replay { inc, exp, req, d } = r;
                    if lode_rpc::fail::check(lode_rpc::fail::MDS_ABORT_IN_RECOVERY) {
                        abort("in recovery, before a replay");
                    }
                    let out = self.execute_modify(&inc, &exp, req, None);
                    {
                        let mut rec = self.recovery.lock();
                        rec.st.running = false;
                        if out.status == 0 {
                            rec.st.replayed += 1;
                        } else if out.status == Errno::EOVERFLOW.status() {
                            rec.st.version_mismatches += 1;
                        }
                        let t = out.transno.max(inc.header.transno);
                        rec.st.ran(exp.slot, inc.header.xid, t);
                    }
                    if out.status == Errno::EOVERFLOW.status() {
                        warn!(client = %exp.uuid, xid = inc.header.xid, transno = inc.header.transno, "replay refused: version mismatch (a change it depends on was lost with an evicted client)");
                    } else if out.status < 0 {
                        warn!(client = %exp.uuid, xid = inc.header.xid, transno = inc.header.transno, "replay failed: {}", Errno::from_status(out.status));
                    }
                    if Service::flush(self) {
                        d.send(out);
                    }
                }
                Next::Evict(gone) => self.evict_unrecovered(&gone),
                Next::End(gone) => {
                    self.evict_unrecovered(&gone);
                    let ended = {
                        let mut rec = self.recovery.lock();
                        self.in_recovery.store(false, Ordering::Release);
                        rec.end()
                    };
                    for r in ended.left {
                        r.d.send(self.error_out(Errno::ESTALE.into()));
                    }
                    // Open-unlinked files nobody opened again go now.
                    if let Err(e) = self.ns.clean_orphans() {
                        warn!("cleaning orphans after recovery: {e:?}");
                    }
                    info!(duration = ?ended.duration, replayed = ended.replayed, gaps = ended.gaps, evicted = ended.evicted, "recovery over");
                    for (inc, d) in ended.held {
                        let out = Service::handle(self, &inc);
                        if Service::flush(self) {
                            d.send(out);
                        }
                    }
                    return;
                }
            }
        }
    }

    /// Clients recovery stopped waiting for: not expected again.
    fn evict_unrecovered(&self, gone: &[(u32, String)]) {
        for (slot, uuid) in gone {
            warn!(client = %uuid, "recovery: client did not come back in time: evicted, its uncommitted changes are lost");
            self.mark_gone(*slot);
        }
    }

    /// `mdt.*.recovery_status`, in Lustre's format.
    pub fn recovery_status(&self) -> String {
        self.recovery.lock().st.status(
            self.recovery_soft_s.load(Ordering::Relaxed),
            self.recovery_hard_s.load(Ordering::Relaxed),
        )
    }

    /// Changes the squash policy with `f`.
    pub(crate) fn set_squash(
        &self,
        f: impl FnOnce(&mut crate::squash::Squash) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut s = self.squash.write();
        let r = f(&mut s);
        self.squash_on.store(s.on(), Ordering::Relaxed);
        r
    }

    /// A clean stop (SIGTERM): from now on no reply leaves (a request that runs on is
    /// resent after the restart and answered from its reply record if it committed),
    /// and everything is committed. The clients still connected stay known, as
    /// Lustre's last_rcvd keeps them over an unmount: at the next start they have no
    /// change to replay but come back for their open files and file locks, and the
    /// MDT waits for them.
    pub fn stop_cleanly(&self) -> Result<(), StoreError> {
        self.stopping.store(true, Ordering::Release);
        self.ns.flush_atimes();
        self.ns.store.sync().map(|_| ())
    }

    /// `wal_flush_per_round`.
    pub fn wal_flush_per_round(&self) -> bool {
        self.wal_flush_per_round.load(Ordering::Relaxed)
    }

    /// Sets `wal_flush_per_round`.
    pub fn set_wal_flush_per_round(&self, on: bool) {
        self.wal_flush_per_round.store(on, Ordering::Relaxed);
    }

    /// `recovery_time_soft` / `recovery_time_hard` (seconds).
    pub fn recovery_windows(&self) -> (u64, u64) {
        (
            self.recovery_soft_s.load(Ordering::Relaxed),
            self.recovery_hard_s.load(Ordering::Relaxed),
        )
    }

    /// Sets `recovery_time_soft` (`hard` false) or `recovery_time_hard`; a running
    /// recovery counts from its start with the new value.
    pub fn set_recovery_window(&self, hard: bool, secs: u64) {
        let a = if hard {
            &self.recovery_hard_s
        } else {
            &self.recovery_soft_s
        };
        a.store(secs, Ordering::Relaxed);
    }
}

/// A `fail_loc` crash: the process ends at once, as with `kill -9` (nothing is
/// flushed or synced on the way out).
fn abort(when: &str) -> ! {
    tracing::error!("fail_loc: the MDS dies here, {when}");
    std::process::abort()
}

/// Moves recovery on when nothing arrives: the windows pass, and clients are evicted.
fn recovery_timer(mdt: Weak<Mdt>) {
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let Some(m) = mdt.upgrade() else { return };
        if !m.in_recovery.load(Ordering::Acquire) {
            return;
        }
        m.recover();
    }
}

/// What became of a modification: answered now (with the parked request's promise, if
/// it had one), or parked.
enum Ran {
    Now(Outgoing, Option<Deferred>),
    Parked,
}

/// Evicts clients that keep a called-back lock longer than `ldlm_timeout`.
fn ldlm_timer(mdt: Weak<Mdt>) {
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let Some(m) = mdt.upgrade() else { return };
        let timeout = Duration::from_secs(m.ldlm_timeout_s());
        for slot in m.ldlm.overdue(timeout) {
            m.evict(
                slot,
                &format!("lock callback timer expired after {}s", timeout.as_secs()),
            );
        }
        if !m.in_recovery.load(Ordering::Acquire) {
            m.evict_vanished();
        }
    }
}

fn sync_out(committed: u64) -> Outgoing {
    Outgoing {
        body: Reply::Sync(SyncRep { committed }).encode(),
        last_committed: committed,
        ..Default::default()
    }
}

fn check_cred(c: &Cred) -> Result<(), Errno> {
    if c.groups.len() > lode_base::limits::GROUPS_MAX {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

impl Service for Mdt {
    fn handle(&self, inc: &Incoming) -> Outgoing {
        let last_committed = self.ns.store.last_committed();
        if self.ns.store.is_stopped() {
            return Outgoing {
                status: Errno::ESHUTDOWN.status(),
                last_committed,
                ..Default::default()
            };
        }
        let mut req = match inc.decode(MdtRequest::decode) {
            Ok(r) => r,
            Err(e) => {
                return Outgoing {
                    status: e.status(),
                    last_committed,
                    ..Default::default()
                };
            }
        };
        self.squash_cred(inc, &mut req);
        if let MdtRequest::Connect(c) = req {
            if lode_rpc::fail::check(lode_rpc::fail::MDS_DROP_CONNECT) {
                warn!(peer = %inc.peer, "fail_loc: CONNECT dropped");
                return Outgoing {
                    drop: true,
                    ..Default::default()
                };
            }
            return match self.connect(inc, c) {
                Ok(rep) => Outgoing {
                    body: Reply::Connect(rep).encode(),
                    last_committed,
                    ..Default::default()
                },
                Err(e) => self.error_out(e),
            };
        }
        // A handle is good only on the connection that connected it; the callback
        // channel (a connection of its own, which pings to stay open) names it too.
        let exp = self
            .exports
            .read()
            .get(&inc.header.handle)
            .filter(|e| {
                e.conn_id == inc.conn_id
                    || matches!(
                        req,
                        MdtRequest::LdlmCallbackChannel(_) | MdtRequest::Ping(_)
                    )
            })
            .cloned();
        let Some(exp) = exp else {
            return Outgoing {
                status: Errno::ENOTCONN.status(),
                last_committed,
                ..Default::default()
            };
        };
        // The locks the request's client let go of with it (early lock cancels), so
        // that the request finds them gone. Stale ones (a resend's, or from before a
        // restart) are not held and change nothing.
        if !inc.cancels.is_empty() {
            self.cancel(&exp, &inc.cancels);
        }
        let req = if self.in_recovery.load(Ordering::Acquire) {
            match self.during_recovery(inc, &exp, req) {
                Ok(out) => return out,
                Err(req) => *req,
            }
        } else {
            req
        };
        if inc.header.flags & FLAG_REPLAY != 0 {
            // Its client came back after recovery ended (it was evicted): the change
            // is lost, and the client is told.
            warn!(peer = %inc.peer, client = %exp.uuid, xid = inc.header.xid, transno = inc.header.transno, "replay after recovery ended: refused");
            return self.error_out(Errno::ESTALE.into());
        }
        if let MdtRequest::Sync(_) = req {
            return self.sync(inc);
        }
        let modify = Opcode::from_u16(inc.header.opcode).is_some_and(|o| o.is_modify());
        if modify {
            return self.modify(inc, &exp, req);
        }
        if inc.header.tag != 0 {
            warn!(peer = %inc.peer, client = %exp.uuid, opcode = inc.header.opcode, "tag on a request that modifies nothing: refused");
            return self.error_out(Errno::EPROTO.into());
        }
        let ahead = matches!(
            req,
            MdtRequest::LdlmCancel(_) | MdtRequest::CloseAhead(_) | MdtRequest::AccessAhead(_)
        ) && inc.header.xid == 0;
        let out = self.read(inc, &exp, req);
        if ahead {
            // An early cancel or a close riding ahead of a request: nobody waits for
            // its reply.
            return Outgoing {
                drop: true,
                ..Default::default()
            };
        }
        out
    }

    fn flush(&self) -> bool {
        if self.stopping.load(Ordering::Acquire) {
            return false;
        }
        if self.wal_flush_per_round.load(Ordering::Relaxed) {
            self.ns.store.flush().is_ok()
        } else {
            !self.ns.store.is_stopped()
        }
    }

    fn disconnected(&self, conn_id: u64) {
        // The export goes; its open handles stay, keyed by the client's slot, so a client
        // that reconnects keeps them (one that does not is evicted after evict_timeout).
        let mut slots = Vec::new();
        self.exports.write().retain(|_, e| {
            if e.conn_id == conn_id {
                slots.push(e.slot);
            }
            e.conn_id != conn_id
        });
        for s in slots {
            self.mark_gone(s);
        }
        // A client whose callback channel closed can no longer be called back: its
        // locks go (it drops its cache when it loses the channel).
        let gone: Vec<u32> = {
            let mut ch = self.channels.lock();
            let gone = ch
                .iter()
                .filter(|(_, c)| c.conn_id == conn_id)
                .map(|(s, _)| *s)
                .collect::<Vec<_>>();
            for s in &gone {
                ch.remove(s);
            }
            gone
        };
        for slot in gone {
            self.ldlm.drop_cached(slot);
            self.flocks.drop_waits(slot);
        }
    }

    fn key(&self) -> &[u8] {
        &self.ns.cfg.key
    }

    fn stats(&self) -> Option<&OpStats> {
        Some(&self.stats)
    }
}

impl Mdt {
    /// A modifying request: exactly once. Its tag must be one the client was granted;
    /// a late duplicate is dropped; a resend of one executing is dropped; a resend of
    /// one executed is answered from its reply record; anything else runs, and its
    /// outcome (success or error) is recorded before its tag is free again.
    fn modify(&self, inc: &Incoming, exp: &Arc<Export>, req: MdtRequest) -> Outgoing {
        let h = &inc.header;
        let (tag, xid) = (h.tag, h.xid);
        // Close may use one tag beyond the grant, so closes never wait behind opens.
        if tag == 0 || tag > exp.max_mod.saturating_add(1) {
            warn!(peer = %inc.peer, client = %exp.uuid, tag, granted = exp.max_mod, "modify request with a tag outside the grant: refused");
            return self.error_out(Errno::EPROTO.into());
        }
        {
            let mut tags = self.tags.lock();
            let ct = tags.entry(exp.slot).or_default();
            if xid <= ct.last_xid {
                debug!(client = %exp.uuid, xid, last_xid = ct.last_xid, "late duplicate dropped");
                return Outgoing {
                    drop: true,
                    ..Default::default()
                };
            }
            ct.last_xid = ct.last_xid.max(h.last_xid);
            match ct.executing.get(&tag) {
                Some(&x) if x == xid => {
                    // The original is executing; its reply is on the way.
                    return Outgoing {
                        drop: true,
                        ..Default::default()
                    };
                }
                Some(&x) => {
                    warn!(peer = %inc.peer, client = %exp.uuid, tag, xid, executing = x, "tag reused while an earlier request on it executes: refused");
                    return self.error_out(Errno::EPROTO.into());
                }
                None => {}
            }
            if h.flags & lode_proto::frame::FLAG_RESENT != 0 {
                // A first send has a new xid that no record can hold: only a resend reads.
                match self.ns.store.reply_record(exp.slot, tag, 0) {
                    Ok(Some(rec)) if rec.xid == xid => {
                        return Outgoing {
                            status: rec.status,
                            transno: rec.transno,
                            last_committed: self.ns.store.last_committed(),
                            body: rec.body,
                            ..Default::default()
                        };
                    }
                    Ok(_) => {}
                    Err(e) => return self.error_out(OpError::Store(e)),
                }
            }
            ct.executing.insert(tag, xid);
        }
        if let MdtRequest::BatchModify(b) = req {
            return self.batch_modify(inc, exp, b);
        }
        // The locks the change needs: granted now, or the request is parked until the
        // clients holding conflicting ones give them back (or are evicted).
        match self.lock_and_run(inc, exp, req, None) {
            Ran::Now(out, _) => out,
            Ran::Parked => Outgoing::parked(),
        }
    }

    /// Takes the locks an admitted modification needs and runs it, or parks it until
    /// they are free (calling back the clients in the way). The locks are chosen from
    /// the namespace as it is (the child an unlink removes); if that changed by the time
    /// they are held, they are chosen again.
    fn lock_and_run(
        &self,
        inc: &Incoming,
        exp: &Arc<Export>,
        req: MdtRequest,
        d: Option<Deferred>,
    ) -> Ran {
        for _ in 0..LOCK_RETRIES {
            let want = self.lock_wants(exp, &req);
            if want.is_empty() {
                break;
            }
            let Some(locks) = self.ldlm.try_acquire(&want) else {
                return self.park_modify(inc, exp, req, want, d);
            };
            if self.wants_hold(exp, &req, &want) {
                return Ran::Now(self.execute_modify(inc, exp, req, Some(locks)), d);
            }
        }
        // No locks needed, or the names keep changing under us: the PDO locks still
        // make the change atomic.
        Ran::Now(self.execute_modify(inc, exp, req, None), d)
    }

    /// Whether the locks chosen for `req` are still the ones it needs (only a change
    /// that looks names up can find them moved).
    fn wants_hold(&self, exp: &Export, req: &MdtRequest, want: &[Want]) -> bool {
        !looks_up(req) || self.lock_wants(exp, req) == want
    }

    /// Runs a parked modification now that its locks are held, or chooses them again if
    /// the names they were chosen from moved meanwhile.
    fn run_held(
        &self,
        inc: &Incoming,
        exp: &Arc<Export>,
        req: MdtRequest,
        want: &[Want],
        locks: MdtLocks,
        d: Deferred,
    ) -> Ran {
        if self.wants_hold(exp, &req, want) {
            Ran::Now(self.execute_modify(inc, exp, req, Some(locks)), Some(d))
        } else {
            drop(locks);
            self.lock_and_run(inc, exp, req, Some(d))
        }
    }

    /// Queues an admitted modification for its locks, calls back the clients in its way,
    /// and parks the request; whoever frees the locks runs it and sends its reply.
    fn park_modify(
        &self,
        inc: &Incoming,
        exp: &Arc<Export>,
        req: MdtRequest,
        want: Vec<Want>,
        d: Option<Deferred>,
    ) -> Ran {
        let Some(d) = d.or_else(|| inc.defer()) else {
            // Built in-process, with no connection to answer on later.
            self.untag(exp.slot, inc.header.tag, inc.header.xid);
            return Ran::Now(self.error_out(Errno::EAGAIN.into()), None);
        };
        let parked = Arc::new(Mutex::new(Some((req, d))));
        let (me, exp2, parked2) = (self.me.clone(), exp.clone(), parked.clone());
        let (header, body, peer, conn_id) = (inc.header, inc.body.clone(), inc.peer, inc.conn_id);
        let want2 = want.clone();
        let acquired = self.ldlm.acquire(Some(exp.slot), &want, move |locks| {
            let Some(mdt) = me.upgrade() else { return };
            let Some((req, d)) = parked2.lock().take() else {
                return;
            };
            let inc = Incoming::local(header, body, peer, conn_id);
            if mdt.ns.open_epoch(exp2.slot) != exp2.open_epoch {
                // Its client was evicted (the eviction may be what freed the locks):
                // Lustre aborts an evicted client's queued requests.
                drop(locks);
                mdt.untag(exp2.slot, header.tag, header.xid);
                d.send(mdt.error_out(Errno::ENOTCONN.into()));
                return;
            }
            if let Ran::Now(out, Some(d)) = mdt.run_held(&inc, &exp2, req, &want2, locks, d) {
                if Service::flush(&*mdt) {
                    d.send(out);
                }
            }
        });
        match acquired {
            Acquired::Granted(locks) => {
                // Freed meanwhile: run it here after all.
                let Some((req, d)) = parked.lock().take() else {
                    return Ran::Parked;
                };
                self.run_held(inc, exp, req, &want, locks, d)
            }
            Acquired::Waiting(cbs) => {
                debug!(client = %exp.uuid, callbacks = cbs.len(), "modification waits for lock cancels");
                self.call_back(&cbs);
                Ran::Parked
            }
        }
    }

    /// The locks a modification takes (Lustre's inode bits): everything it changes, so
    /// every client caching any of it is called back first. A directory whose entries
    /// change: CW UPDATE (concurrent changes of other names go on; a client's cached
    /// listing or "no such name" is revoked). A name: PW LOOKUP on `(dir, name hash)`.
    /// An object whose attributes change: PW on the bits they belong to.
    fn lock_wants(&self, exp: &Export, req: &MdtRequest) -> Vec<Want> {
        use ldlm::bits::{LOOKUP, OPEN, PERM, UPDATE, XATTR};
        let dir = |d| (ResId::object(d), LockMode::Cw, UPDATE);
        let name = |d, n: &[u8]| (ResId::name(d, n), LockMode::Pw, LOOKUP);
        let obj = |f, bits| (ResId::object(f), LockMode::Pw, bits);
        let child = |d, n: &[u8]| self.ns.dirent(d, n).ok().flatten().map(|e| e.fid);
        let mut w = match req {
            // A file with no name changes only itself.
            MdtRequest::Create(r) if is_tmpfile(r) => vec![obj(r.fid, UPDATE | PERM)],
            MdtRequest::Create(r) => {
                // The new object too (its FID is the client's): nobody changes it
                // before its creator's locks on it are granted.
                let mut w = vec![
                    dir(r.parent),
                    name(r.parent, &r.name),
                    obj(r.fid, UPDATE | PERM),
                ];
                // An open-create of an existing file may truncate it, or mark it as
                // holding data (which changes how its size is read).
                if r.open_flags.is_some() {
                    w.extend(child(r.parent, &r.name).map(|c| obj(c, UPDATE)));
                }
                w
            }
            MdtRequest::Unlink(r) => {
                let mut w = vec![dir(r.parent), name(r.parent, &r.name)];
                // Its nlink and ctime change (or it goes, once no handle has it open:
                // a client keeping idle handles under OPEN locks closes them).
                w.extend(child(r.parent, &r.name).map(|c| obj(c, UPDATE | OPEN)));
                w
            }
            MdtRequest::Rename(r) => {
                let mut w = vec![
                    dir(r.src_parent),
                    name(r.src_parent, &r.src_name),
                    dir(r.dst_parent),
                    name(r.dst_parent, &r.dst_name),
                ];
                w.extend(child(r.src_parent, &r.src_name).map(|c| obj(c, UPDATE)));
                // The file replaced, if any, as an unlink's.
                w.extend(child(r.dst_parent, &r.dst_name).map(|c| obj(c, UPDATE | OPEN)));
                w
            }
            MdtRequest::Link(r) => vec![dir(r.parent), name(r.parent, &r.name), obj(r.fid, UPDATE)],
            // A change of who may open the file (or how: `chattr +i`, `+a`) ends the
            // handles kept under OPEN locks (an open that takes one checks nothing on
            // the MDT).
            MdtRequest::Setattr(r) => {
                let who = r.attr.mode.is_some()
                    || r.attr.uid.is_some()
                    || r.attr.gid.is_some()
                    || r.attr.flags.is_some();
                vec![obj(r.fid, UPDATE | PERM | if who { OPEN } else { 0 })]
            }
            // Everyone's cached layout (kept with the attributes) goes. Instantiating
            // only adds to a layout: open handles' layout locks stay.
            MdtRequest::LayoutIntent(r) => vec![obj(r.fid, UPDATE)],
            // A swap replaces the layout: every open handle's layout lock is called
            // back (its reads in flight are done again) before the old one can go.
            MdtRequest::Migrate(r) if matches!(r.step, lode_proto::MigrateStep::Commit { .. }) => {
                vec![obj(r.fid, UPDATE | ldlm::bits::LAYOUT)]
            }
            // An ACL is a permission; every xattr change moves ctime.
            MdtRequest::Setxattr(r) => {
                let acl = r.name.starts_with(b"system.posix_acl");
                vec![obj(
                    r.fid,
                    UPDATE | PERM | XATTR | if acl { OPEN } else { 0 },
                )]
            }
            // A truncating open changes the size; the first open for write marks the
            // file as holding data (its size then comes from the OSTs); another writer
            // of a file just created for writing ends its creator's knowing it empty.
            // And every open for writing ends what other clients' attributes locks
            // vouch for: the pages they cached (see `MdtBody::written`).
            // (`wants_write` counts O_TRUNC.)
            MdtRequest::Open(r) if lode_base::perm::wants_write(r.flags as i32) => {
                vec![obj(r.fid, UPDATE)]
            }
            // The last close of an unlinked file destroys it.
            MdtRequest::Close(r) => self
                .ns
                .handle_fid(r.handle)
                .filter(|f| self.ns.inode(*f).is_ok_and(|i| i.nlink == 0))
                .map(|f| vec![obj(f, UPDATE)])
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        // Data another client's write-back lock holds back (see `Mdt::dom_gated`).
        w.extend(dom_wants(&self.dom_gated(exp, req)));
        // One entry per resource: the strongest mode asked and every bit (a rename within
        // one directory names it twice).
        w.sort_by_key(|(r, _, _)| *r);
        w.dedup_by(|b, a| {
            if a.0 == b.0 {
                a.2 |= b.2;
                if a.1 == LockMode::Cw && b.1 == LockMode::Pw {
                    a.1 = LockMode::Pw;
                }
                true
            } else {
                false
            }
        });
        w
    }

    /// Applies root squash to a request's credentials (a batch's sub-requests too).
    fn squash_cred(&self, inc: &Incoming, req: &mut MdtRequest) {
        if self.squash_on.load(Ordering::Relaxed) {
            if let Some(cred) = req.cred_mut() {
                self.squash.read().apply(inc.peer.ip(), cred);
            }
        }
    }

    /// Records the outcome of a modification that failed (`sub` as in
    /// [`ReplySlot`]): a resent failing request fails the same way even if it could
    /// succeed now. If the record cannot be written, the caller gets the store error.
    fn record_failure(&self, exp: &Export, tag: u16, xid: u64, sub: u16, out: &mut Outgoing) {
        if out.status >= 0 || self.ns.store.is_stopped() {
            return;
        }
        let slot = ReplySlot {
            slot: exp.slot,
            tag,
            xid,
            replay_transno: 0,
            sub,
        };
        if let Err(e) = self.ns.store.record_reply(slot, out.status) {
            *out = self.error_out(OpError::Store(e));
        }
    }

    fn untag(&self, slot: u32, tag: u16, xid: u64) {
        let mut tags = self.tags.lock();
        if let Some(ct) = tags.get_mut(&slot) {
            if ct.executing.get(&tag) == Some(&xid) {
                ct.executing.remove(&tag);
            }
        }
    }

    /// Runs an admitted modification (its locks held), records an error outcome, and
    /// frees its tag.
    fn execute_modify(
        &self,
        inc: &Incoming,
        exp: &Export,
        req: MdtRequest,
        locks: Option<MdtLocks>,
    ) -> Outgoing {
        let h = &inc.header;
        let (tag, xid) = (h.tag, h.xid);
        let intent = self.intent(inc, exp);
        let create_intent = match &req {
            MdtRequest::Create(r) if intent && !is_tmpfile(r) => Some(Created {
                parent: r.parent,
                name: r.name.clone(),
                writeback: (r.dom_writeback
                    && r.open_flags
                        .is_some_and(|f| lode_base::perm::wants_write(f as i32)))
                .then_some(r.fid),
            }),
            _ => None,
        };
        let setattr_intent = match &req {
            MdtRequest::Setattr(r) if intent => Some(r.fid),
            _ => None,
        };
        // The write-back lock a write kept back under it gives back once done.
        let written_back = match &req {
            MdtRequest::DomWrite(r) if r.dom_lock != 0 => Some((r.dom_lock, r.fid)),
            _ => None,
        };
        let write_open_intent = match &req {
            MdtRequest::Open(r) if intent && lode_base::perm::wants_write(r.flags as i32) => {
                Some(r.fid)
            }
            _ => None,
        };
        // The directories a create, unlink, link or rename changes, handed back after
        // with their ctimes before (as the change found them under its locks: see
        // `inode::dirs`), so the client knows whether its copies were current.
        let dir_attrs = intent && h.flags & lode_proto::frame::FLAG_NO_DIR_ATTRS == 0;
        let parent_intent: Vec<Fid> = match &req {
            MdtRequest::Create(r) if dir_attrs && !is_tmpfile(r) => vec![r.parent],
            MdtRequest::Unlink(r) if dir_attrs => vec![r.parent],
            MdtRequest::Link(r) if dir_attrs => vec![r.parent],
            MdtRequest::Rename(r) if dir_attrs && r.src_parent == r.dst_parent => {
                vec![r.src_parent]
            }
            MdtRequest::Rename(r) if dir_attrs => vec![r.src_parent, r.dst_parent],
            _ => Vec::new(),
        };
        // The name a link or a plain rename leaves, whose lock the reply brings.
        let named = match &req {
            MdtRequest::Link(r) if intent => Some((r.parent, r.name.clone())),
            MdtRequest::Rename(r) if intent && r.flags & crate::reint::RENAME_EXCHANGE == 0 => {
                Some((r.dst_parent, r.dst_name.clone()))
            }
            _ => None,
        };
        // A replay past a gap must find what the change found the first time (one
        // from a reply record, or a committed open sent again, has no digest).
        let replay = h.flags & FLAG_REPLAY != 0;
        let digest = replay && h.pre_version != 0;
        let expected = (digest && self.recovery.lock().st.gaps > 0).then_some(h.pre_version);
        crate::inode::vbr::begin(expected);
        // A replay stamps the time its first run was given.
        crate::inode::clock::begin(if replay { h.op_time } else { 0 });
        crate::inode::dirs::begin();
        if lode_rpc::fail::check_op(lode_rpc::fail::DELAY_EXEC, h.opcode) {
            std::thread::sleep(std::time::Duration::from_millis(u64::from(
                lode_rpc::fail::val(),
            )));
        }
        // The reply stays typed until the grants below have put their locks in it:
        // encoded once, not encoded, decoded and encoded again.
        let done = self.dispatch(inc, exp, req, 0);
        let found = crate::inode::dirs::end();
        let op_time = crate::inode::clock::end();
        let pre_version = crate::inode::vbr::end();
        let (mut rep, mut out) = match done {
            Ok((rep, transno)) => (
                Some(rep),
                Outgoing {
                    transno,
                    last_committed: self.ns.store.last_committed(),
                    ..Default::default()
                },
            ),
            Err(e) => (None, self.error_out(e)),
        };
        out.op_time = op_time;
        out.pre_version = pre_version;
        if out.status == 0 {
            use lode_rpc::fail::{check_op, MDS_ABORT_AFTER_COMMIT, MDS_ABORT_BEFORE_COMMIT};
            if check_op(MDS_ABORT_BEFORE_COMMIT, h.opcode) {
                abort("before the change is committed or answered");
            }
            if check_op(MDS_ABORT_AFTER_COMMIT, h.opcode) {
                let _ = self.ns.store.sync();
                abort("after the change is committed, before it is answered");
            }
        }
        self.record_failure(exp, tag, xid, 0, &mut out);
        // All of them or none: a directory gone meanwhile, or one the change did not
        // find under its locks (a rename between two links of one file changes
        // nothing, as POSIX says, and the client must not move the name in its
        // listings).
        let parents: Vec<Found> = if out.status == 0 {
            parent_intent
                .iter()
                .map(|&p| found.iter().find(|f| f.fid == p).copied())
                .collect::<Option<_>>()
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if let Some(rep) = rep.as_mut() {
            match (create_intent, locks) {
                (Some(c), Some(l)) => {
                    self.grant_created(exp, c, l, parents.into_iter().next(), rep)
                }
                (None, Some(l)) if !parents.is_empty() || named.is_some() => {
                    self.grant_parent(exp, l, parents, named, rep)
                }
                (None, Some(l)) => {
                    if let Some(fid) = setattr_intent {
                        self.grant_changed(exp, fid, l, rep);
                    } else if let Some(fid) = write_open_intent {
                        self.grant_opened(exp, fid, l, rep);
                    }
                }
                _ => {}
            }
        }
        if let Some(rep) = rep {
            out.body = rep.encode();
        }
        self.untag(exp.slot, tag, xid);
        // Last, outside the change's clock and version scope: the readers waiting for
        // the write run now, on this thread.
        if let Some((lock, fid)) = written_back {
            self.ldlm.cancel_write_back(exp.slot, lock, fid);
        }
        out
    }

    /// The directories a change found (`found`) as handed back to its client with
    /// the locks just granted on them (`got`, one each, as `wants` asked: on their
    /// attributes with UPDATE, else on their permissions), read now, under those locks. Another
    /// client's change that took and gave back its own lock between this change and
    /// the grant (nothing this client held stopped it) left a directory at another
    /// version than this change did: its `pre_ctime` then matches no copy, so the
    /// client drops its listing. All or none: if one is gone, every lock goes back.
    fn parents_after(
        &self,
        exp: &Export,
        found: &[Found],
        got: &[u64],
        wants: &[Want],
    ) -> Vec<ParentAttrs> {
        let mut out = Vec::with_capacity(found.len());
        for ((f, &h), want) in found.iter().zip(got).zip(wants) {
            let Ok(rec) = self.ns.inode(f.fid) else {
                self.ldlm.cancel_many(exp.slot, &got[..found.len()]);
                return Vec::new();
            };
            let mut body = self.ns.body(f.fid, &rec);
            if want.2 & ldlm::bits::UPDATE != 0 {
                body.lock = h;
            } else {
                body.dir_lock = h;
            }
            out.push(ParentAttrs {
                body,
                pre_ctime: if rec.version == f.version {
                    f.pre_ctime
                } else {
                    lode_proto::NO_COPY_CTIME
                },
            });
        }
        out
    }

    /// Gives back the locks `handles` of `exp`'s client (a cancel, or the early cancels
    /// leading a request); those it does not hold are ignored.
    fn cancel(&self, exp: &Export, handles: &[u64]) {
        let held = self.ldlm.cancel_many(exp.slot, handles);
        if held < handles.len() {
            debug!(client = %exp.uuid, ignored = handles.len() - held, "cancel of locks it does not hold: ignored");
        }
    }

    /// The lock the client of a change in `parent` gets back on it: its attributes
    /// (PR UPDATE|PERM) while no other client is busy in it, else its permissions only
    /// (PR PERM: a create or unlink by another client does not revoke it, so two
    /// clients working in one directory do not call each other back at every step).
    fn parent_want(&self, parent: Fid) -> ldlm::Want {
        use ldlm::bits::{PERM, UPDATE};
        let r = ResId::object(parent);
        let bits = if self.ldlm.contended(r) {
            PERM
        } else {
            UPDATE | PERM
        };
        (r, LockMode::Pr, bits)
    }

    /// An unlink, link or rename with an intent: the change's locks go, and its client
    /// gets each directory's (see [`Mdt::parent_want`]) with the directory's new
    /// attributes (`parents`: the one directory, or a rename's source and destination),
    /// and, for the name a link or rename leaves (`named`), a lock on that name and on
    /// the attributes of what it names, as a create's client gets.
    fn grant_parent(
        &self,
        exp: &Export,
        locks: MdtLocks,
        found: Vec<Found>,
        named: Option<(Fid, Vec<u8>)>,
        rep: &mut Reply,
    ) {
        use ldlm::bits::{LOOKUP, PERM, UPDATE};
        let mut wants: Vec<ldlm::Want> = found.iter().map(|f| self.parent_want(f.fid)).collect();
        // What the name now names: a link's reply has it; a rename's is read back.
        let mut body = match (rep as &Reply, &named) {
            (Reply::Link(r), Some(_)) => Some(r.body.clone()),
            (Reply::Rename(_), Some((d, n))) => {
                let fid = self.ns.dirent(*d, n).ok().flatten().map(|e| e.fid);
                fid.and_then(|f| self.ns.getattr(f).ok())
            }
            _ => None,
        };
        if let (Some(b), Some((d, n))) = (&body, &named) {
            wants.push((ResId::name(*d, n), LockMode::Pr, LOOKUP));
            wants.push((ResId::object(b.attr.fid), LockMode::Pr, UPDATE | PERM));
        }
        let got = self.ldlm.release_and_grant(locks, exp.slot, &wants);
        let n = found.len();
        let parents = self.parents_after(exp, &found, &got, &wants[..n]);
        if let Some(b) = body.as_mut() {
            (b.name_lock, b.lock) = (got[n], got[n + 1]);
            self.own_writes(exp, b);
        }
        let mut parents = parents.into_iter();
        match rep {
            Reply::Rename(r) => {
                r.parent = parents.next();
                r.dst_parent = parents.next();
                r.moved = body;
            }
            Reply::Link(r) => {
                r.parent = parents.next();
                if let Some(b) = body {
                    r.body = b;
                }
            }
            _ => {
                *rep = Reply::Unlink(UnlinkRep {
                    parent: parents.next(),
                })
            }
        }
    }

    /// A setattr with an intent: the change's lock on the object is handed over to its
    /// client as the PR UPDATE|PERM lock a getattr would get, with the attributes the
    /// reply carries already, so a `chmod` is not followed by a getattr to cache them.
    fn grant_changed(&self, exp: &Export, fid: Fid, locks: MdtLocks, rep: &mut Reply) {
        let Reply::Setattr(body) = rep else {
            return;
        };
        use ldlm::bits::{PERM, UPDATE};
        let want = (ResId::object(fid), LockMode::Pr, UPDATE | PERM);
        body.lock = self.ldlm.release_and_grant(locks, exp.slot, &[want])[0];
        self.own_writes(exp, body);
    }

    /// Sets `MdtBody::written` of a body granted with a lock to the client of `exp`:
    /// its own write handles do not keep that lock from vouching for its pages
    /// (another client's open for writing calls it back first), only other
    /// clients' do. Every grant of a file's attributes lock passes here.
    fn own_writes(&self, exp: &Export, body: &mut MdtBody) {
        if body.lock != 0 {
            body.written = self.ns.written_by_others(body.attr.fid, exp.slot);
        }
    }

    /// An open for writing with an intent: the open's lock on the object is handed
    /// over to its client as the PR UPDATE|PERM lock a getattr would get. While no
    /// other client writes the file it vouches for the writer's pages (the next open
    /// for writing by anyone calls it back), so a writer reading back what it wrote
    /// reads its pages.
    fn grant_opened(&self, exp: &Export, fid: Fid, locks: MdtLocks, rep: &mut Reply) {
        let Reply::Open(rep) = rep else {
            return;
        };
        use ldlm::bits::{PERM, UPDATE};
        let want = (ResId::object(fid), LockMode::Pr, UPDATE | PERM);
        rep.body.lock = self.ldlm.release_and_grant(locks, exp.slot, &[want])[0];
        self.own_writes(exp, &mut rep.body);
    }

    /// A create with an intent: the change's own locks are handed over to the creator as
    /// those a lookup of the new name would get (the directory's PERM, the name, the new
    /// object's attributes), so the reply needs no second read.
    fn grant_created(
        &self,
        exp: &Export,
        c: Created,
        locks: MdtLocks,
        parent_found: Option<Found>,
        rep: &mut Reply,
    ) {
        let Reply::Create(rep) = rep else {
            return;
        };
        use ldlm::bits::{DOM, LOOKUP, PERM, UPDATE};
        let parent = c.parent;
        let dir_want = match parent_found {
            Some(_) => self.parent_want(parent),
            None => (ResId::object(parent), LockMode::Pr, PERM),
        };
        let fid = rep.body.attr.fid;
        let mut want = vec![
            dir_want,
            (ResId::name(parent, &c.name), LockMode::Pr, LOOKUP),
            (ResId::object(fid), LockMode::Pr, UPDATE | PERM),
        ];
        // A file made by this create (not one the name had), open for writing, its
        // every byte on the MDT: its creator may keep its first write back (see
        // `CreateReq::dom_writeback`).
        let writeback = c.writeback == Some(fid)
            && rep.handle.is_some()
            && rep.body.attr.ftype() == lode_base::FileType::Regular
            && rep
                .body
                .layout
                .as_ref()
                .is_some_and(|l| l.dom_end() > 0 && !l.has_objects());
        if writeback {
            want.push((ResId::object(fid), LockMode::Pw, DOM));
        }
        let got = self.ldlm.release_and_grant(locks, exp.slot, &want);
        (rep.body.name_lock, rep.body.lock) = (got[1], got[2]);
        rep.dom_lock = got.get(3).copied().unwrap_or(0);
        // The creator's own open for writing does not stop its lock vouching for its
        // pages; another client's does (see `Mdt::own_writes`).
        self.own_writes(exp, &mut rep.body);
        // The directory's lock: on its attributes, sent along, or on its permissions.
        match parent_found {
            Some(f) if dir_want.2 & UPDATE != 0 => {
                rep.parent = self.parents_after(exp, &[f], &got[..1], &[dir_want]).pop();
            }
            _ => rep.body.dir_lock = got[0],
        }
    }

    fn run(&self, inc: &Incoming, exp: &Export, req: MdtRequest) -> Outgoing {
        self.run_sub(inc, exp, req, 0)
    }

    /// The files whose data or size a request reads (or, for a change, depends on)
    /// that another client holds a write-back lock on (see
    /// [`ldlm::Ldlm::dom_written`]): the request takes their DOM bit first, calling
    /// that lock back, so it sees the bytes that client's `write(2)` already
    /// returned for. The holder's own requests come after its kept-back writes (the
    /// client sees to it), so they never call back their own client.
    fn dom_gated(&self, exp: &Export, req: &MdtRequest) -> Vec<Fid> {
        if !self.ldlm.any_written_back() {
            return Vec::new();
        }
        let child = |d, n: &[u8]| self.ns.dirent(d, n).ok().flatten().map(|e| e.fid);
        let fids: Vec<Fid> = match req {
            MdtRequest::Getattr(r) => vec![r.fid],
            MdtRequest::Lookup(r) => child(r.parent, &r.name).into_iter().collect(),
            MdtRequest::DomRead(r) => vec![r.fid],
            MdtRequest::DomSeek(r) => vec![r.fid],
            MdtRequest::Readdir(r) if r.plus => self
                .ns
                .readdir(&r.cred, r.fid, r.cookie, false, r.count as usize)
                .map(|p| p.entries.iter().map(|e| e.fid).collect())
                .unwrap_or_default(),
            MdtRequest::Batch(b) => b
                .subs
                .iter()
                .take(lode_base::limits::BATCH_SUBS_MAX)
                .filter_map(|s| match MdtRequest::decode(s.opcode, &s.body).ok()? {
                    MdtRequest::Getattr(r) => Some(r.fid),
                    MdtRequest::Lookup(r) => child(r.parent, &r.name),
                    _ => None,
                })
                .collect(),
            MdtRequest::Open(r) => vec![r.fid],
            MdtRequest::Create(r) if r.open_flags.is_some() => {
                child(r.parent, &r.name).into_iter().collect()
            }
            MdtRequest::Setattr(r) => vec![r.fid],
            MdtRequest::DomWrite(r) => vec![r.fid],
            MdtRequest::Link(r) => vec![r.fid],
            // The reply hands the moved file's attributes over under a lock.
            MdtRequest::Rename(r) => child(r.src_parent, &r.src_name).into_iter().collect(),
            MdtRequest::LayoutIntent(r) => vec![r.fid],
            MdtRequest::Migrate(r) => vec![r.fid],
            _ => Vec::new(),
        };
        self.ldlm.dom_written(&fids, exp.slot)
    }

    /// A read that must wait for write-back locks on `fids` (see [`Mdt::dom_gated`]):
    /// parked while their holders are called back, and run once they let go.
    fn park_read(
        &self,
        inc: &Incoming,
        exp: &Arc<Export>,
        req: MdtRequest,
        fids: &[Fid],
    ) -> Outgoing {
        let Some(d) = inc.defer() else {
            return self.error_out(Errno::EAGAIN.into());
        };
        let want = dom_wants(fids);
        let parked = Arc::new(Mutex::new(Some((req, d))));
        let (me, exp2, parked2) = (self.me.clone(), exp.clone(), parked.clone());
        let (header, body, peer, conn_id) = (inc.header, inc.body.clone(), inc.peer, inc.conn_id);
        // Run with the DOM bits held: no write-back lock on them can be granted
        // meanwhile (one is only ever granted with a create, before anyone reads).
        let acquired = self.ldlm.acquire(Some(exp.slot), &want, move |locks| {
            let Some(mdt) = me.upgrade() else { return };
            let Some((req, d)) = parked2.lock().take() else {
                return;
            };
            let inc = Incoming::local(header, body, peer, conn_id);
            let out = mdt.run(&inc, &exp2, req);
            drop(locks);
            if Service::flush(&*mdt) {
                d.send(out);
            }
        });
        match acquired {
            Acquired::Granted(locks) => match parked.lock().take() {
                Some((req, _d)) => {
                    let out = self.run(inc, exp, req);
                    drop(locks);
                    out
                }
                None => Outgoing::parked(),
            },
            Acquired::Waiting(cbs) => {
                debug!(client = %exp.uuid, callbacks = cbs.len(), "read waits for write-back locks");
                self.call_back(&cbs);
                Outgoing::parked()
            }
        }
    }

    /// A request that changes nothing: run, unless it must wait for write-back
    /// locks first ([`Mdt::park_read`]).
    fn read(&self, inc: &Incoming, exp: &Arc<Export>, req: MdtRequest) -> Outgoing {
        let gated = self.dom_gated(exp, &req);
        if gated.is_empty() {
            self.run(inc, exp, req)
        } else {
            self.park_read(inc, exp, req, &gated)
        }
    }

    /// [`Mdt::run`] for sub-request `sub - 1` of a batch (0: a whole request).
    fn run_sub(&self, inc: &Incoming, exp: &Export, req: MdtRequest, sub: u16) -> Outgoing {
        match self.dispatch(inc, exp, req, sub) {
            Ok((rep, transno)) => Outgoing {
                status: 0,
                transno,
                last_committed: self.ns.store.last_committed(),
                body: rep.encode(),
                ..Default::default()
            },
            Err(e) => self.error_out(e),
        }
    }

    fn error_out(&self, e: OpError) -> Outgoing {
        let errno = match e {
            OpError::Errno(e) => e,
            OpError::Store(e) => {
                warn!("store error: {e}");
                Errno::EIO
            }
        };
        Outgoing {
            status: errno.status(),
            last_committed: self.ns.store.last_committed(),
            ..Default::default()
        }
    }

    /// `cache_stats`: the inode cache, what warming read into it, and the store's
    /// block cache.
    pub fn cache_stats(&self) -> String {
        let i = self.ns.store.inode_cache_stats();
        let w = &self.warmer;
        let mut out = format!(
            "inode_cache_entries: {}\ninode_cache_max: {}\ninode_cache_hits: {}\ninode_cache_misses: {}\ninode_unused_by_bound: {}\nwarm_dirs: {}\nwarm_inodes: {}\nwarm_dropped: {}\n",
            i.entries,
            self.store().inode_cache_max(),
            i.hits,
            i.misses,
            i.unused_by_bound,
            w.dirs.load(Ordering::Relaxed),
            w.inodes.load(Ordering::Relaxed),
            w.dropped.load(Ordering::Relaxed),
        );
        for (k, v) in self.ns.store.engine().cache_report() {
            out.push_str(&format!("{k}: {v}\n"));
        }
        out
    }

    /// Clears `cache_stats`' counters.
    pub fn clear_cache_stats(&self) {
        self.ns.store.clear_inode_cache_stats();
        for c in [&self.warmer.dirs, &self.warmer.inodes, &self.warmer.dropped] {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// `cache_warm`: whether directories read from their start are warmed.
    pub fn cache_warm(&self) -> bool {
        self.warmer.on.load(Ordering::Relaxed)
    }

    /// Sets `cache_warm`.
    pub fn set_cache_warm(&self, on: bool) {
        self.warmer.on.store(on, Ordering::Relaxed);
    }

    /// Per-opcode statistics.
    pub fn op_stats(&self) -> &OpStats {
        &self.stats
    }
}
