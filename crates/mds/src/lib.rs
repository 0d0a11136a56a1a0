//! The metadata service: one MDT. Connects clients (exports with reply slots),
//! executes namespace operations with POSIX rules under PDO locks, writes each change
//! and its reply record in one store batch, and answers resends from reply records.

mod background;
mod inode;
mod layout;
mod ns;
pub mod params;
pub mod pdo;
mod reint;
mod xattr;

use lode_base::{Cred, Errno, Fid};
use lode_proto::{
    ConnectRep, ConnectReq, Empty, MdtRequest, Opcode, Reply, SeqAllocRep, StatfsRep, SyncRep,
    CONNECT_SUPPORTED,
};
use lode_rpc::{Incoming, OpStats, Outgoing, Service};
use lode_store::mdt::ReplySlot;
use lode_store::records::{self, ClientRec};
use lode_store::{Batch, Cf, MdtStore, StoreError};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use tracing::{info, warn};

pub use layout::OstState;

/// Static identity and settings of an MDT.
#[derive(Clone, Debug)]
pub struct MdtConfig {
    /// File system name.
    pub fsname: String,
    /// MDT index.
    pub index: u32,
    /// Target UUID from mkfs.
    pub uuid: String,
    /// Target directory (for statfs).
    pub dir: PathBuf,
    /// Shared key (empty: none).
    pub key: Vec<u8>,
}

impl MdtConfig {
    /// `FSNAME-MDTxxxx`.
    pub fn target_name(&self) -> String {
        format!("{}-MDT{:04x}", self.fsname, self.index)
    }
}

/// Runtime tunables (`lode get-param/set-param mdt.*.…`).
pub struct Tunables {
    /// `mdt.*.max_mod_rpcs_in_flight`: modify slots granted per client.
    pub max_mod_rpcs: AtomicU32,
    /// `lod.*.stripecount` default (root's default layout).
    pub default_stripe_count: AtomicU32,
    /// `lod.*.stripesize` default.
    pub default_stripe_size: AtomicU64,
}

/// A connected client.
pub struct Export {
    /// The client's UUID.
    pub uuid: String,
    /// Its reply slot.
    pub slot: u32,
    /// Its TCP connection.
    pub conn_id: u64,
}

struct OpenHandle {
    fid: Fid,
    /// The owning client's slot: handles outlive a reconnect of the same client.
    slot: u32,
}

#[derive(Default)]
struct Opens {
    handles: HashMap<u64, OpenHandle>,
    counts: HashMap<Fid, u32>,
    next: u64,
}

/// One metadata target.
pub struct Mdt {
    cfg: MdtConfig,
    store: Arc<MdtStore>,
    pdo: pdo::Pdo,
    exports: RwLock<HashMap<u64, Arc<Export>>>,
    clients: Mutex<ClientTable>,
    opens: Mutex<Opens>,
    seq_lock: Mutex<()>,
    /// Modifications executing now, by (slot, tag): a resend of one of them is dropped
    /// (its original's reply is on the way) instead of being executed twice.
    inflight: Mutex<HashMap<(u32, u16), u64>>,
    osts: layout::Osts,
    space: background::SpaceCheck,
    links: std::sync::OnceLock<Arc<background::Links>>,
    /// Tunables.
    pub tun: Tunables,
    stats: OpStats,
}

struct ClientTable {
    by_uuid: HashMap<String, u32>,
    next_slot: u32,
}

const SEQ_NEXT: &[u8] = b"seq_next";

/// Errors inside an operation: a POSIX errno for the caller, or a store failure.
#[derive(Debug)]
pub(crate) enum OpError {
    Errno(Errno),
    Store(StoreError),
}

impl From<Errno> for OpError {
    fn from(e: Errno) -> Self {
        OpError::Errno(e)
    }
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        OpError::Store(e)
    }
}

impl From<OpError> for StoreError {
    fn from(e: OpError) -> Self {
        match e {
            OpError::Store(e) => e,
            OpError::Errno(e) => StoreError::Engine(format!("unexpected {e}")),
        }
    }
}

pub(crate) type OpResult<T> = Result<T, OpError>;

/// What one request needs besides its body: the reply slot (for modifications).
pub(crate) struct Ctx {
    pub slot: Option<ReplySlot>,
}

impl Mdt {
    /// Opens the MDT over `store`: loads known clients, cleans orphans left by a crash
    /// (open handles are not replayed yet), formats the root on first start.
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
        let mdt = Arc::new(Mdt {
            cfg,
            store,
            pdo: pdo::Pdo::default(),
            exports: RwLock::new(HashMap::new()),
            clients: Mutex::new(ClientTable { by_uuid, next_slot }),
            opens: Mutex::new(Opens {
                next: 1,
                ..Default::default()
            }),
            seq_lock: Mutex::new(()),
            inflight: Mutex::new(HashMap::new()),
            osts: layout::Osts::default(),
            space: background::SpaceCheck::default(),
            links: std::sync::OnceLock::new(),
            tun: Tunables {
                max_mod_rpcs: AtomicU32::new(u32::from(lode_base::limits::MAX_MOD_RPCS_PER_CLIENT)),
                default_stripe_count: AtomicU32::new(1),
                default_stripe_size: AtomicU64::new(1 << 20),
            },
            stats: OpStats::default(),
        });
        mdt.format_root()?;
        mdt.clean_orphans()?;
        Ok(mdt)
    }

    /// The store.
    pub fn store(&self) -> &Arc<MdtStore> {
        &self.store
    }

    /// The config.
    pub fn config(&self) -> &MdtConfig {
        &self.cfg
    }

    /// Number of connected clients.
    pub fn export_count(&self) -> usize {
        self.exports.read().len()
    }

    /// Number of open handles.
    pub fn open_count(&self) -> usize {
        self.opens.lock().handles.len()
    }

    /// Updates the OST table from the MGS config.
    pub fn set_osts(&self, osts: Vec<OstState>) {
        self.osts.set(osts);
    }

    /// OSTs as the MDS sees them.
    pub fn osts(&self) -> Vec<OstState> {
        self.osts.get()
    }

    fn connect(&self, inc: &Incoming, req: ConnectReq) -> Result<ConnectRep, OpError> {
        if req.fsname != self.cfg.fsname {
            warn!(peer = %inc.peer, "refusing connect for file system {:?}", req.fsname);
            return Err(Errno::EINVAL.into());
        }
        if req.target != self.cfg.target_name() {
            warn!(peer = %inc.peer, "refusing connect for target {:?}", req.target);
            return Err(Errno::ENODEV.into());
        }
        if !lode_rpc::auth::verify(&self.cfg.key, &req.client_uuid, &req.target, &req.auth) {
            warn!(peer = %inc.peer, client = %req.client_uuid, "refusing connect: bad key");
            return Err(Errno::EACCES.into());
        }
        if req.client_uuid.is_empty() || req.client_uuid.len() > 64 {
            return Err(Errno::EINVAL.into());
        }
        let slot = {
            let mut ct = self.clients.lock();
            match ct.by_uuid.get(&req.client_uuid) {
                Some(s) => *s,
                None => {
                    if ct.next_slot >= lode_base::limits::CLIENTS_MAX {
                        return Err(Errno::ENOSPC.into());
                    }
                    let slot = ct.next_slot;
                    let mut b = Batch::new();
                    b.put(
                        Cf::Clients,
                        req.client_uuid.as_bytes().to_vec(),
                        records::encode(&ClientRec { slot }),
                    );
                    self.store.apply_untracked(&b)?;
                    ct.next_slot += 1;
                    ct.by_uuid.insert(req.client_uuid.clone(), slot);
                    slot
                }
            }
        };
        let handle = loop {
            let h: u64 = rand::random();
            if h != 0 && !self.exports.read().contains_key(&h) {
                break h;
            }
        };
        let max_mod = (self.tun.max_mod_rpcs.load(Ordering::Relaxed) as u16)
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
            }),
        );
        info!(client = %req.client_uuid, slot, peer = %inc.peer, "client connected");
        Ok(ConnectRep {
            handle,
            flags: req.flags & CONNECT_SUPPORTED,
            max_mod_rpcs: max_mod,
            target_uuid: self.cfg.uuid.clone(),
            index: self.cfg.index,
        })
    }

    fn seq_alloc(&self) -> OpResult<SeqAllocRep> {
        let _g = self.seq_lock.lock();
        let next = match self.store.engine().get(Cf::Server, SEQ_NEXT)? {
            Some(b) if b.len() == 8 => u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])),
            _ => lode_base::fid::FIRST_NORMAL_SEQ,
        };
        let mut b = Batch::new();
        b.put(
            Cf::Server,
            SEQ_NEXT.to_vec(),
            (next + 1).to_le_bytes().to_vec(),
        );
        self.store.apply(b, None)?;
        Ok(SeqAllocRep {
            seq: next,
            width: lode_base::fid::SEQ_WIDTH,
        })
    }

    fn statfs(&self) -> OpResult<StatfsRep> {
        let mut st = StatfsRep::from(
            lode_base::sys::statvfs(&self.cfg.dir).map_err(|e| Errno::from_io(&e))?,
        );
        let used = self.store.engine().estimate_keys(Cf::Inode);
        // Inodes are not preallocated: report a large budget that shrinks with use.
        st.files = used + st.bavail.saturating_mul(u64::from(st.bsize)) / 512;
        st.ffree = st.files - used;
        Ok(st)
    }

    /// SYNC: answered once everything applied so far is committed. Parked, so the
    /// service thread goes on with other requests while the commit runs.
    fn sync(&self, inc: &Incoming) -> Outgoing {
        let Some(d) = inc.defer() else {
            return match self.store.sync() {
                Ok(c) => sync_out(c),
                Err(e) => self.error_out(OpError::Store(e)),
            };
        };
        self.store.when_committed(Box::new(move |r| {
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

    fn dispatch(&self, inc: &Incoming, exp: &Export, req: MdtRequest) -> OpResult<(Reply, u64)> {
        let slot = (inc.header.tag != 0).then_some(ReplySlot {
            slot: exp.slot,
            tag: inc.header.tag,
            xid: inc.header.xid,
        });
        let ctx = Ctx { slot };
        Ok(match req {
            MdtRequest::Ping(_) => (Reply::Ping(Empty {}), 0),
            MdtRequest::Disconnect(_) => {
                self.exports.write().remove(&inc.header.handle);
                self.close_all_of(exp.slot);
                (Reply::Disconnect(Empty {}), 0)
            }
            MdtRequest::Statfs(_) => (Reply::Statfs(self.statfs()?), 0),
            MdtRequest::SeqAlloc(_) => (Reply::SeqAlloc(self.seq_alloc()?), 0),
            // Parked in `handle` before dispatch.
            MdtRequest::Sync(_) => return Err(Errno::EPROTO.into()),
            MdtRequest::Getattr(r) => {
                check_cred(&r.cred)?;
                (Reply::Getattr(self.getattr(r.fid)?), 0)
            }
            MdtRequest::Lookup(r) => {
                check_cred(&r.cred)?;
                (Reply::Lookup(self.lookup(&r.cred, r.parent, &r.name)?), 0)
            }
            MdtRequest::Readdir(r) => {
                check_cred(&r.cred)?;
                (
                    Reply::Readdir(self.readdir(&r.cred, r.fid, r.cookie, r.plus)?),
                    0,
                )
            }
            MdtRequest::BatchGetattr(r) => {
                check_cred(&r.cred)?;
                (Reply::BatchGetattr(self.batch_getattr(&r.fids)?), 0)
            }
            MdtRequest::Create(r) => {
                check_cred(&r.cred)?;
                let (rep, t) = self.create(&ctx, exp.slot, r)?;
                (Reply::Create(rep), t)
            }
            MdtRequest::Open(r) => {
                check_cred(&r.cred)?;
                let (rep, t) = self.open_fid(&ctx, exp.slot, &r.cred, r.fid, r.flags)?;
                (Reply::Open(rep), t)
            }
            MdtRequest::Close(r) => (
                Reply::Close(Empty {}),
                self.close(&ctx, exp.slot, r.handle)?,
            ),
            MdtRequest::Unlink(r) => {
                check_cred(&r.cred)?;
                (
                    Reply::Unlink(Empty {}),
                    self.unlink(&ctx, &r.cred, r.parent, &r.name, r.rmdir)?,
                )
            }
            MdtRequest::Rename(r) => {
                check_cred(&r.cred)?;
                (Reply::Rename(Empty {}), self.rename(&ctx, &r)?)
            }
            MdtRequest::Link(r) => {
                check_cred(&r.cred)?;
                let (b, t) = self.link(&ctx, &r.cred, r.fid, r.parent, &r.name)?;
                (Reply::Link(b), t)
            }
            MdtRequest::Setattr(r) => {
                check_cred(&r.cred)?;
                let (b, t) = self.setattr(&ctx, &r.cred, r.fid, &r.attr, r.opened_for_write)?;
                (Reply::Setattr(b), t)
            }
            MdtRequest::Getxattr(r) => {
                check_cred(&r.cred)?;
                (
                    Reply::Getxattr(self.getxattr(&r.cred, r.fid, &r.name, r.size)?),
                    0,
                )
            }
            MdtRequest::Listxattr(r) => {
                check_cred(&r.cred)?;
                (Reply::Listxattr(self.listxattr(&r.cred, r.fid, r.size)?), 0)
            }
            MdtRequest::Setxattr(r) => {
                check_cred(&r.cred)?;
                let value = r.value.map(|v| v.into_vec());
                (
                    Reply::Setxattr(Empty {}),
                    self.setxattr(&ctx, &r.cred, r.fid, &r.name, value, r.flags)?,
                )
            }
            // Data-on-MDT arrives with its own issue; say so rather than pretend.
            MdtRequest::DomRead(_) | MdtRequest::DomWrite(_) => {
                return Err(Errno::EOPNOTSUPP.into())
            }
            MdtRequest::Connect(_) => return Err(Errno::EALREADY.into()),
        })
    }

    /// Commits a modification: the batch plus its reply record, returning the transno.
    pub(crate) fn commit(&self, ctx: &Ctx, batch: Batch, reply: &Reply) -> OpResult<u64> {
        let rec = ctx.slot.map(|s| (s, 0, reply.encode()));
        Ok(self.store.apply(batch, rec)?)
    }

    /// Fails with ENOSPC when the MDT's disk is nearly full, before anything is written.
    pub(crate) fn check_space(&self) -> OpResult<()> {
        if self.space.low(&self.cfg.dir) {
            return Err(Errno::ENOSPC.into());
        }
        Ok(())
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
        let last_committed = self.store.last_committed();
        if self.store.is_stopped() {
            return Outgoing {
                status: Errno::ESHUTDOWN.status(),
                last_committed,
                ..Default::default()
            };
        }
        let req = match MdtRequest::decode(inc.header.opcode, &inc.body) {
            Ok(r) => r,
            Err(lode_proto::DecodeError::Service(_)) => {
                return Outgoing::error(Errno::EOPNOTSUPP);
            }
            Err(e) => {
                warn!(peer = %inc.peer, "bad request: {e}");
                return Outgoing {
                    status: Errno::EPROTO.status(),
                    last_committed,
                    ..Default::default()
                };
            }
        };
        if let MdtRequest::Connect(c) = req {
            return match self.connect(inc, c) {
                Ok(rep) => Outgoing {
                    body: Reply::Connect(rep).encode(),
                    last_committed,
                    ..Default::default()
                },
                Err(e) => self.error_out(e),
            };
        }
        let Some(exp) = self.exports.read().get(&inc.header.handle).cloned() else {
            return Outgoing {
                status: Errno::ENOTCONN.status(),
                last_committed,
                ..Default::default()
            };
        };
        if let MdtRequest::Sync(_) = req {
            return self.sync(inc);
        }
        if inc.header.tag != 0 {
            if inc.header.tag > lode_base::limits::MAX_MOD_RPCS_LIMIT
                || Opcode::from_u16(inc.header.opcode).is_none()
            {
                return Outgoing {
                    status: Errno::EPROTO.status(),
                    last_committed,
                    ..Default::default()
                };
            }
            // A resend of an executed request is answered from its reply record.
            match self.store.reply_record(exp.slot, inc.header.tag) {
                Ok(Some(rec)) if rec.xid == inc.header.xid => {
                    return Outgoing {
                        status: rec.status,
                        transno: rec.transno,
                        last_committed: self.store.last_committed(),
                        body: rec.body,
                        ..Default::default()
                    };
                }
                Ok(_) => {}
                Err(e) => return self.error_out(OpError::Store(e)),
            }
            let key = (exp.slot, inc.header.tag);
            {
                let mut inflight = self.inflight.lock();
                if inflight.get(&key) == Some(&inc.header.xid) {
                    return Outgoing {
                        drop: true,
                        ..Default::default()
                    };
                }
                inflight.insert(key, inc.header.xid);
            }
            let out = self.run(inc, &exp, req);
            let mut inflight = self.inflight.lock();
            if inflight.get(&key) == Some(&inc.header.xid) {
                inflight.remove(&key);
            }
            return out;
        }
        self.run(inc, &exp, req)
    }

    fn flush(&self) -> bool {
        self.store.flush().is_ok()
    }

    fn disconnected(&self, conn_id: u64) {
        // The export goes; its open handles stay, keyed by the client's slot, so a client
        // that reconnects keeps them (eviction of vanished clients is a recovery matter).
        self.exports.write().retain(|_, e| e.conn_id != conn_id);
    }

    fn stats(&self) -> Option<&OpStats> {
        Some(&self.stats)
    }
}

impl Mdt {
    fn run(&self, inc: &Incoming, exp: &Export, req: MdtRequest) -> Outgoing {
        match self.dispatch(inc, exp, req) {
            Ok((rep, transno)) => Outgoing {
                status: 0,
                transno,
                last_committed: self.store.last_committed(),
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
            last_committed: self.store.last_committed(),
            ..Default::default()
        }
    }

    /// Per-opcode statistics.
    pub fn op_stats(&self) -> &OpStats {
        &self.stats
    }
}
